#!/usr/bin/env bash
# Muon on the CUDA backend through the CPU emulator of CUDA and NCCL (cuda/emu, `make emu`; see
# test/sh/gpu_emulated.sh): its Newton-Schulz, momentum and update run through the backend's ops
# on device memory, so run.device=cuda in one process, at dp=2 ZeRO-1 (owners and the
# reduce-scatter over emulated NCCL) and tp=2 (a split matrix gathered) trains the CPU run's
# model (the emulator's checks for host reads of device memory and missing waits on), and under
# bf16 activations (bf16 Newton-Schulz products) dp=2 ZeRO-1 trains the one-GPU bf16 run's; bf16
# optimizer states are refused there with exit 2, naming the key.
. "$(dirname "$0")/../lib.sh"

if ! command -v g++ >/dev/null; then
    echo "SKIP muon_emulated: g++ is not installed (scripts/install-deps.sh installs it)"
    exit 0
fi
if ! make -s emu -j2 >$TMP/build.log 2>&1; then
    fail muon_emu_build "make emu failed: $(grep -m3 -E 'error|Error' $TMP/build.log)"
    exit 0
fi
E=build-emu
export EMU_GPUS=8
equiv_configs muon-emu 4 2
sed -i -e 's/n_layer: 2/n_layer: 4/' -e 's/^optimizer: {/optimizer: {name: muon, /' $TMP/llama.yaml
python3 test/tools/equiv.py --ustrain $E/ustrain --steps 3 --config $TMP/llama.yaml --name _emu_muon \
    --layout "run.device=cuda" --layout "dp=2 zero=1 run.device=cuda" --layout "tp=2 run.device=cuda"
# under train.precision bf16 Newton-Schulz's products take bf16 inputs with fp32 accumulation
# (test_cuda_ops bounds one orthogonalisation against the fp32 CPU's: 5%); ZeRO-1's owners
# orthogonalise whole matrices on their GPU, the same bf16 products as one GPU's
B16="run.device=cuda train.precision=bf16"
python3 test/tools/equiv.py --ustrain $E/ustrain --steps 3 --config $TMP/llama.yaml --name _emu_muon_bf16 \
    --ref "$B16" --tolerance bf16 --layout "dp=2 zero=1 $B16"
expect_exit muon_emu_bf16_states_refused_on_cuda 2 "optimizer.state_dtype: bf16" -- \
    env EMU_GPUS=1 $E/ustrain train $TMP/llama.yaml --set run.device=cuda --set optimizer.state_dtype=bf16 \
    --set train.steps=1 --set checkpoint.resume=none --set checkpoint.every=0
exit 0
