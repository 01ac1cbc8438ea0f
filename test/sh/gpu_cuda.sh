#!/usr/bin/env bash
# The tests of `make test` that need a real GPU (gpu_emulated.sh runs the same code paths on the
# CPU emulator everywhere):
#   - configs/tiny.yaml for 10 steps on the GPU in fp32 against the CPU run: per-step losses
#     within 1e-4 relative (~100x the reassociation noise of 10 fp32 steps, far below what a
#     wrong op gives);
#   - the same in bf16: close to the fp32 losses (2e-2 relative), not equal;
#   - with 2 or more GPUs, the equivalence harness over NCCL: dp/ZeRO, tp+sp, pp and cp on
#     run.device=cuda (and dp x tp ZeRO-3, tp x pp with 4) against one CPU process, and the same
#     layouts in bf16 against the one-GPU bf16 run.
# Without a GPU, or in a build without CUDA, it says so on a SKIP line (and checks that a CUDA
# config is refused there with exit 2). scripts/gpu-check.sh runs it on a GPU machine.
. "$(dirname "$0")/../lib.sh"

ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
$UST data demo $TMP/data >/dev/null
sed -e "s#data/tiny/#$TMP/data/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml >$TMP/t.yaml
if [ "$ngpu" -eq 0 ]; then
    # the same binary trains CPU configs here (every other test); a CUDA config is a clear
    # usage error at start-up, whether the build has CUDA (no device or driver) or not
    expect_exit gpu_cuda_config_without_a_gpu_exits_2 2 \
        'run.device = cuda: (no CUDA device available|this build has no CUDA backend|lib[a-zA-Z]*\.so\.[0-9]+ could not be loaded)' -- \
        $UST train $TMP/t.yaml --set run.device=cuda --set checkpoint.resume=none
    echo "SKIP gpu_cuda: no GPU here (nvidia-smi lists none); the CUDA code ran on the emulator only (gpu_emulated.sh)"
    exit 0
fi
for dev in cpu cuda; do
    $UST train $TMP/t.yaml --set run.device=$dev --set train.precision=fp32 --set train.steps=10 \
        --set checkpoint.resume=none --set checkpoint.every=0 --set run.out_dir=$TMP/$dev \
        --set logging.metrics_file=$TMP/$dev/m.jsonl >$TMP/$dev.log 2>&1
    rc=$?
    if [ $rc -ne 0 ] && grep -q 'this build has no CUDA backend' $TMP/$dev.log; then
        echo "SKIP gpu_cuda: $ngpu GPU(s), but $UST was built without CUDA (nvcc not found)"
        exit 0
    fi
    [ $rc -eq 0 ] || fail gpu_tiny_train_$dev "exit $rc: $(tail -2 $TMP/$dev.log)"
done
paste <(grep -o '"loss":[^,]*' $TMP/cpu/m.jsonl | cut -d: -f2) \
    <(grep -o '"loss":[^,]*' $TMP/cuda/m.jsonl | cut -d: -f2) |
    awk 'BEGIN { bad = 0; n = 0; worst = 0 }
         { n++; d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) worst = r
           if (r > 1e-4) bad = 1 }
         END { if (n == 10 && !bad) printf "PASS gpu_tiny_10_steps_fp32_match_cpu (worst %.2e)\n", worst
               else printf "FAIL gpu_tiny_10_steps_fp32_match_cpu: %d steps, worst relative %.3g\n", n, worst }'
grep -h '^device memory' $TMP/cuda.log
# bf16 (activations and matmuls): close to the fp32 run, not equal
$UST train $TMP/t.yaml --set run.device=cuda --set train.precision=bf16 --set train.steps=10 \
    --set checkpoint.resume=none --set checkpoint.every=0 --set run.out_dir=$TMP/bf16 \
    --set logging.metrics_file=$TMP/bf16/m.jsonl >$TMP/bf16.log 2>&1 ||
    fail gpu_tiny_train_bf16 "$(tail -2 $TMP/bf16.log)"
paste <(grep -o '"loss":[^,]*' $TMP/cuda/m.jsonl | cut -d: -f2) \
    <(grep -o '"loss":[^,]*' $TMP/bf16/m.jsonl | cut -d: -f2) |
    awk '{ n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r }
         END { if (n == 10 && worst > 0 && worst < 2e-2) printf "PASS gpu_tiny_10_steps_bf16_close_to_fp32 (worst %.2e)\n", worst
               else printf "FAIL gpu_tiny_10_steps_bf16_close_to_fp32: %d steps, worst relative %.3g\n", n, worst }'

if [ "$ngpu" -lt 2 ]; then
    echo "SKIP gpu_cuda multi-GPU equivalence: $ngpu GPU (NCCL needs a GPU per rank)"
    exit 0
fi
L=(--layout "dp=2 zero=1 run.device=cuda" --layout "tp=2 sp=true run.device=cuda"
    --layout "pp=2 run.device=cuda" --layout "cp=2 run.device=cuda")
[ "$ngpu" -ge 4 ] && L+=(--layout "dp=2 tp=2 zero=3 run.device=cuda" --layout "tp=2 pp=2 run.device=cuda")
python3 test/tools/equiv.py --name _gpu --steps 6 --config $TMP/t.yaml --set model.n_layer=2 \
    --set train.seq_len=64 --set train.global_batch_size=8 --set train.micro_batch_size=2 \
    --set data.val=null --set train.precision=fp32 "${L[@]}"
# bf16 layouts against the one-GPU bf16 run (equiv.py --tolerance bf16 assumes lr 3e-3, 4 steps)
B16="run.device=cuda train.precision=bf16"
L=(--layout "dp=2 zero=1 $B16" --layout "tp=2 sp=true $B16" --layout "pp=2 $B16" --layout "cp=2 $B16")
[ "$ngpu" -ge 4 ] && L+=(--layout "tp=2 pp=2 $B16")
python3 test/tools/equiv.py --name _gpu_bf16 --steps 4 --config $TMP/t.yaml --set model.n_layer=2 \
    --set train.seq_len=64 --set train.global_batch_size=8 --set train.micro_batch_size=2 \
    --set data.val=null --set optimizer.lr=3.0e-3 --set optimizer.warmup_steps=2 \
    --ref "$B16" --tolerance bf16 "${L[@]}"
exit 0
