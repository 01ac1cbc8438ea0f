#!/usr/bin/env bash
# DualPipeV and DualPipe on the CUDA backend over emulated NCCL (cuda/emu, `make emu`, which
# test/sh/gpu_emulated.sh builds first): the turn's local copies are device-to-device copies on
# the compute stream, rank 0's tied embedding serves both ends; per-step losses and weights equal
# the one-process CPU run.
. "$(dirname "$0")/../lib.sh"

if ! command -v g++ >/dev/null; then
    echo "SKIP gpu_emulated_dualpipev: g++ is not installed (scripts/install-deps.sh installs it)"
    exit 0
fi
if ! make -s emu -j"$(nproc)" >$TMP/build.log 2>&1; then
    fail emu_dpv_build "make emu failed: $(grep -m3 -E 'error|Error' $TMP/build.log)"
    exit 0
fi
export EMU_GPUS=8
export EMU_STRICT=1 # strict mode's race checks (cuda/emu/emu_strict.cpp, test/sh/emu_strict.sh)
equiv_configs emu-dpv 4 2
sed -i 's/n_layer: 2/n_layer: 4/' $TMP/llama.yaml $TMP/gpt2.yaml
EQ="python3 test/tools/equiv.py --ustrain build-emu/ustrain --steps 3"
$EQ --name _emu_dpv_llama --config $TMP/llama.yaml --layout "pp=2 vpp=2 sched=dualpipev run.device=cuda"
$EQ --name _emu_dpv_gpt2 --config $TMP/gpt2.yaml --layout "pp=2 vpp=2 sched=dualpipev run.device=cuda"
# dualpipe: the mirror pair's gradient sum is an NCCL all-reduce of the whole gradient buffer
$EQ --name _emu_dp_llama --config $TMP/llama.yaml --layout "pp=2 vpp=2 sched=dualpipe run.device=cuda"
$EQ --name _emu_dp_gpt2 --config $TMP/gpt2.yaml --layout "pp=2 vpp=2 sched=dualpipe run.device=cuda"
exit 0
