#!/usr/bin/env bash
# Muon on the CUDA backend through the CPU emulator of CUDA and NCCL (cuda/emu, `make emu`; see
# test/sh/gpu_emulated.sh): its Newton-Schulz, momentum and update run through the backend's ops
# on device memory, so run.device=cuda in one process, at dp=2 ZeRO-1 (owners and the
# reduce-scatter over emulated NCCL) and tp=2 (a split matrix gathered) trains the CPU run's
# model (the emulator's checks for host reads of device memory and missing waits on), and under
# bf16 activations (bf16 Newton-Schulz products) dp=2 ZeRO-1 trains the one-GPU bf16 run's; and
# with bf16 optimizer states (optimizer.state_dtype: bf16, the ops adamw16_many and momentum16)
# AdamW and Muon on one GPU and at dp=2 ZeRO-1 train the CPU's bf16-state run, a checkpoint saved
# on the GPU holds bf16 numbers and resumes on the CPU and back, and the arena counts the states
# at 2 bytes as the plan and the CPU do.
. "$(dirname "$0")/../lib.sh"

if ! command -v g++ >/dev/null; then
    echo "SKIP muon_emulated: g++ is not installed (scripts/install-deps.sh installs it)"
    exit 0
fi
if ! make -s emu -j2 >$TMP/build.log 2>&1; then
    fail muon_emu_build "make emu failed: $(grep -m3 -E 'error|Error' $TMP/build.log)"
    exit 0
fi
need_py muon_emulated numpy || exit 0
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
# bf16 states: the ops are the CPU's bits on the emulator (test_cuda_ops); the runs differ from
# the CPU's only by the other ops' fp32 rounding (measured <= 1e-7 relative in the losses)
S16="--set optimizer.state_dtype=bf16"
python3 test/tools/equiv.py --ustrain $E/ustrain --steps 3 --config $TMP/llama.yaml $S16 --name _emu_muon_states16 \
    --layout "run.device=cuda" --layout "dp=2 zero=1 run.device=cuda"
python3 test/tools/equiv.py --ustrain $E/ustrain --steps 3 --config $TMP/llama.yaml $S16 --name _emu_adamw_states16 \
    --set optimizer.name=adamw --layout "run.device=cuda"
# save on the GPU at step 2 and resume on the CPU (and the CPU's step-2 checkpoint on the GPU):
# step 3 is the CPU run's; the GPU's saved states are bf16 numbers (low 16 bits zero)
K=$TMP/k16
run16() { # NAME DEVICE SETS...: 3 steps with bf16 states, a checkpoint at step 2
    local n=$1 dev=$2
    shift 2
    env EMU_GPUS=1 $E/ustrain train $TMP/llama.yaml $S16 --set run.device=$dev --set train.steps=3 \
        --set checkpoint.every=2 --set checkpoint.dir=$K/$n --set logging.metrics_file=$K/$n.jsonl \
        "$@" >$K.$n.out 2>&1 || fail muon_emu_states16_$n "run: $(tail -2 $K.$n.out)"
}
mkdir -p $K
run16 cpu cpu --set checkpoint.resume=none
run16 gpu cuda --set checkpoint.resume=none --set train.stop_at_step=2
run16 gpu_to_cpu cpu --set checkpoint.resume=$K/gpu/step_2
run16 cpu_to_gpu cuda --set checkpoint.resume=$K/cpu/step_2
plan=$(env EMU_GPUS=1 $E/ustrain validate $TMP/llama.yaml $S16 --set run.device=cuda | sed -n 's/.*total.*(\([0-9]*\) bytes).*/\1/p')
python3 - $K "$plan" <<'PY' && pass muon_emu_states16_checkpoint_bf16_resumes_across_devices_plan_equals_arena ||
import json, struct, sys
import numpy as np
K, plan = sys.argv[1], int(sys.argv[2] or -1)
f = open(f"{K}/gpu/step_2/optimizer.safetensors", "rb")
f.read(struct.unpack("<Q", f.read(8))[0])
st = np.frombuffer(f.read(), dtype=np.uint32)
rows = {n: [json.loads(l) for l in open(f"{K}/{n}.jsonl")] for n in ("cpu", "gpu", "gpu_to_cpu", "cpu_to_gpu")}
ref = rows["cpu"][-1]["loss"]
ok = st.size > 0 and np.count_nonzero(st & 0xFFFF) == 0 and np.count_nonzero(st) > 0
for n in ("gpu_to_cpu", "cpu_to_gpu"):
    got = rows[n][-1]
    print(f"{n}: step {got['step']} loss {got['loss']:.8f} vs cpu {ref:.8f}")
    ok &= got["step"] == 3 and abs(got["loss"] - ref) <= 5e-6 + 5e-6 * abs(ref)
g, c = rows["gpu"][-1], rows["cpu"][-1]
print(f"gpu arena {g['peak_mem_bytes']} (plan {plan}), mem_optim {g['mem_optim']} (cpu {c['mem_optim']})")
ok &= g["peak_mem_bytes"] == plan and g["mem_optim"] == c["mem_optim"]
sys.exit(0 if ok else 1)
PY
    fail muon_emu_states16_checkpoint_bf16_resumes_across_devices_plan_equals_arena "see above"
exit 0
