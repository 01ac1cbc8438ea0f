#!/usr/bin/env bash
# gpu-check: the prepared check for a few minutes on a bare GPU machine (driver + toolkit, nothing
# installed, nothing compiled there): one call of at most 540 s (GPU_CHECK_BUDGET), leaving room
# for a rerun within 15 minutes of device time. It runs what scripts/gpu-bundle.sh prepared
# (.gpubundle/: binaries, the backend plugin, the non-system libraries; carried along), else
# build/ and ./ustrain. Stages, in order:
#   machine   versions (nvidia-smi, driver/runtime, nvcc) and `ldd` on every binary: a missing
#             library stops the script, naming it; a driver older than CUDA 13 gets the
#             toolkit's compat/ libraries on the library path (the loader also tries them),
#   ops       test_cuda_ops: every op of ops.h on the GPU against the CPU,
#   attention the tensor-core attention against the GEMM attention at B=8, T=1024 (bf16),
#   moe       test_moe: the MoE layer on the GPU against the CPU,
#   training  test/sh/gpu_cuda.sh (tiny, 10 steps fp32 vs the CPU, bf16 vs fp32) and the NCCL
#             world-1 cases of test_comm; multi-rank NCCL needs a GPU per rank: said so,
#   bench     bench_gpu bf16 on GPT-2 124M (B=8, T=1024) with the per-op table, and the
#             roofline estimate (bench_gpu --model-only) when present.
# UST_REQUIRE_GPU=1: a GPU that CUDA cannot open is a FAIL, not a SKIP. A failed program is run
# once more with CUDA_LAUNCH_BLOCKING=1 and, where the toolkit has it, under compute-sanitizer.
# Everything goes to $OUT (default ./gpu-check-out; 8 files: summary.txt, machine.log,
# test_cuda_ops.log, attention_full.log, test_moe.log, training.log, bench_gpu.log, reruns.log),
# and the last lines printed (at most 60) are the summary: each stage PASS/FAIL with its figure.
# GPU_CHECK_DRY=1 runs it end to end on this CPU machine against the emulator build (build-emu,
# `make emu`; GPU_CHECK_BUILD to change): small sizes, the CPU stand-in for the op tests, and
# GPU_CHECK_DRY_FAIL=STAGE plants a failure in that stage (test/sh/gpu_check_dry.sh).
#
# scripts/gpu-check.sh --emulate is for machines WITHOUT a GPU: `make emu` builds the project
# against the CPU emulator in cuda/emu (coroutine GPU threads, barriers, shuffles, reference
# cuBLAS/cuBLASLt, streams and events, guarded device memory, NCCL over shared memory); it runs
# test_cuda_ops with three thread orders and the cuBLASLt fallback, then test/sh/gpu_emulated.sh
# (run.device=cuda training and the multi-rank layouts over emulated NCCL), then the real-GPU
# script test/sh/gpu_cuda.sh on one emulated GPU. It checks logic, not
# performance or hardware behaviour. Needs g++ and python3; builds under build-emu/.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$SECONDS
fail=0
stage() { echo; echo "==== $* (t=$((SECONDS - T0))s)"; }

if [ "${1:-}" = "--emulate" ]; then
    E=build-emu
    stage "the emulator build (make emu: cuda/*.cu as C++ against cuda/emu)"
    make -s emu -j"$(nproc)" || exit 1
    for mode in forward reverse random lt-fallback; do
        stage "test_cuda_ops on the emulator ($mode)"
        case $mode in
        lt-fallback) EMU_LT_FAIL=1 EMU_REPORT=1 timeout 600 $E/test/test_cuda_ops ;;
        forward) timeout 600 $E/test/test_cuda_ops ;;
        *) EMU_ORDER=$mode timeout 600 $E/test/test_cuda_ops ;;
        esac
        rc=$?
        [ $rc -eq 0 ] || { echo "FAIL emulated test_cuda_ops ($mode): exit $rc"; fail=1; }
    done
    stage "training, NCCL and the layouts on the emulator (test/sh/gpu_emulated.sh)"
    bash test/sh/gpu_emulated.sh | tee /tmp/gpu-check-emu.log | grep -E '^(FAIL|SKIP)'
    grep -q '^FAIL' /tmp/gpu-check-emu.log && fail=1
    echo "$(grep -c '^PASS' /tmp/gpu-check-emu.log) passed, $(grep -c '^FAIL' /tmp/gpu-check-emu.log) failed"
    # the real-GPU test script's GPU branch, on one emulated GPU (nvidia-smi faked to list it)
    stage "test/sh/gpu_cuda.sh on one emulated GPU"
    fake=$(mktemp -d)
    printf '#!/bin/sh\necho "GPU 0: emulated"\n' >$fake/nvidia-smi && chmod +x $fake/nvidia-smi
    PATH=$fake:$PATH EMU_GPUS=1 UST=$E/ustrain bash test/sh/gpu_cuda.sh | tee /tmp/gpu-check-cuda.log
    rm -rf $fake
    grep -q '^FAIL' /tmp/gpu-check-cuda.log && fail=1
    [ "$(grep -c '^PASS gpu_tiny_10_steps' /tmp/gpu-check-cuda.log)" = 2 ] ||
        { echo "FAIL gpu_cuda.sh: its two one-GPU checks did not both pass"; fail=1; }
    stage "done (emulated): $([ $fail -eq 0 ] && echo ALL OK || echo SOME FAILED) in $((SECONDS - T0))s"
    exit $fail
fi

# ---- the check on a GPU machine (or its dry run) ----------------------------------------------
DRY=${GPU_CHECK_DRY:-0}
BUDGET=${GPU_CHECK_BUDGET:-540}
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT" || exit 1
rm -f "$OUT"/{summary.txt,machine.log,test_cuda_ops.log,attention_full.log,test_moe.log,training.log,bench_gpu.log,reruns.log}
export UST_REQUIRE_GPU=1
RESULTS=()

# binaries: the emulator build (dry run), the bundle, or build/
if [ "$DRY" = 1 ]; then
    BUILD=${GPU_CHECK_BUILD:-build-emu} UST=${GPU_CHECK_BUILD:-build-emu}/ustrain
elif [ -x .gpubundle/ustrain ]; then
    BUILD=.gpubundle/build UST=.gpubundle/ustrain
    mkdir -p /tmp/gpubundle && tar -C /tmp/gpubundle -xzf .gpubundle/lib.tar.gz || exit 1
    export LD_LIBRARY_PATH="/tmp/gpubundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # NCCL, when the bundle carries it, is found by the loader there too
    export UST_CUDA_LIB_DIR="/tmp/gpubundle/lib${UST_CUDA_LIB_DIR:+:$UST_CUDA_LIB_DIR}"
else
    BUILD=build UST=./ustrain
fi
export UST BUILD
PROGS="$UST $BUILD/bench_gpu $BUILD/test/test_cuda_ops $BUILD/test/test_moe $BUILD/test/test_comm"
[ -f $BUILD/libustrain_cuda.so ] && PROGS="$PROGS $BUILD/libustrain_cuda.so"

left() { echo $((BUDGET - (SECONDS - T0))); }
# the smaller of a stage's own limit and what the budget has left (20 s kept for the summary)
limit() { local l=$(($(left) - 20)); [ "$1" -lt "$l" ] && l=$1; [ $l -lt 1 ] && l=1; echo $l; }

# run_stage NAME LOG LIMIT FIGURE_CMD -- CMD...: runs CMD (tee to $OUT/LOG); FAIL on a non-zero
# exit or a FAIL line; a failure is rerun once (rerun below); FIGURE_CMD reads the log for the
# summary's figure.
run_stage() {
    local name=$1 log=$OUT/$2 lim=$3 fig=$4
    shift 5
    local from=$(($(cat $log 2>/dev/null | wc -l) + 1)) own=$OUT/.stage
    stage "$name: $*" | tee -a $log
    if [ "$DRY" = 1 ] && [ "${GPU_CHECK_DRY_FAIL:-}" = "$name" ]; then
        set -- sh -c 'echo "FAIL planted failure in this stage (GPU_CHECK_DRY_FAIL)"; exit 1'
    fi
    timeout -k 5 $(limit $lim) "$@" 2>&1 | tee -a $log
    local rc=${PIPESTATUS[0]} st=PASS
    [ $rc -ge 124 ] && [ $rc -le 137 ] && echo "FAIL $name: stopped at its time limit (exit $rc)" | tee -a $log
    tail -n +$from $log >$own # this stage's lines only (two stages may share a log)
    { [ $rc -ne 0 ] || grep -q '^FAIL' $own; } && st=FAIL
    local figure
    figure=$(L=$own; eval "$fig" 2>/dev/null | tail -1 | cut -c1-150)
    [ $st = FAIL ] && figure="exit $rc; $(grep -m1 '^FAIL' $own | cut -c1-110)" && rerun "$name" "$lim" "$@"
    rm -f $own
    RESULTS+=("$(printf '%-10s %s  %s' "$name" $st "$figure")")
    [ $st = PASS ] || fail=1
}

# rerun NAME LIMIT CMD...: once with CUDA_LAUNCH_BLOCKING=1 (an asynchronous error then names the
# launch that failed), then a program under compute-sanitizer memcheck, into reruns.log
rerun() {
    local name=$1 lim=$2 r=$OUT/reruns.log
    shift 2
    [ $(left) -gt 60 ] || { echo "== $name: no rerun, $(left) s of the budget left" >>$r; return; }
    echo "==== rerun of $name with CUDA_LAUNCH_BLOCKING=1: $*" >>$r
    CUDA_LAUNCH_BLOCKING=1 timeout -k 5 $(limit $lim) "$@" >>$r 2>&1
    echo "   (exit $?)" >>$r
    local cs
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
    if [ -n "$cs" ] && [ "$DRY" != 1 ] && [ "$1" != bash ] && [ "$1" != sh ] && [ $(left) -gt 90 ]; then
        echo "==== rerun of $name under compute-sanitizer" >>$r
        timeout -k 5 $(limit 120) "$cs" --tool memcheck --print-limit 20 "$@" >>$r 2>&1
        echo "   (exit $?)" >>$r
    fi
    grep -E '^(FAIL|=========)|error' $r | tail -5 | sed "s/^/  rerun: /"
}

# ---- machine: versions, libraries (a missing one stops here)
M=$OUT/machine.log
{
    stage "machine"
    echo "binaries: $BUILD ($UST); dry run: $DRY; budget ${BUDGET}s"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -4
    nvidia-smi 2>/dev/null | grep -m1 'CUDA Version'
    (/usr/local/cuda/bin/nvcc --version 2>/dev/null || echo "nvcc: none") | tail -1
    echo "cores: $(nproc)"
} 2>&1 | tee -a $M
# the toolkit's libraries for the loader (and for ldd of the plugin): the first folder holding each
for so in libcudart.so.13 libcublasLt.so.13 libnccl.so.2; do
    d=$(find /usr/local/cuda/lib64/ /usr/local/cuda/targets /usr/lib /usr/local /opt -name $so 2>/dev/null |
        head -1 | xargs -r dirname)
    [ -n "$d" ] && case ":${UST_CUDA_LIB_DIR:-}:" in *":$d:"*) ;; *) UST_CUDA_LIB_DIR="${UST_CUDA_LIB_DIR:+$UST_CUDA_LIB_DIR:}$d" ;; esac
done
export UST_CUDA_LIB_DIR=${UST_CUDA_LIB_DIR:-}
echo "UST_CUDA_LIB_DIR=$UST_CUDA_LIB_DIR" | tee -a $M
drv=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: \([0-9]*\)\..*/\1/p' | head -1)
if [ -n "$drv" ] && [ "$drv" -lt 13 ] && [ -e /usr/local/cuda/compat/libcuda.so.1 ]; then
    export LD_LIBRARY_PATH="/usr/local/cuda/compat${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "driver supports CUDA $drv < 13: /usr/local/cuda/compat first on LD_LIBRARY_PATH" | tee -a $M
fi
missing=""
for p in $PROGS; do
    [ -e "$p" ] || { missing="$missing $p(absent)"; continue; }
    m=$(LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$UST_CUDA_LIB_DIR" ldd "$p" 2>&1 | awk '/not found/ {print $1}' | tr '\n' ' ')
    [ -n "$m" ] && missing="$missing $p: $m"
done
if [ -n "$missing" ]; then
    echo "FAIL machine: missing:$missing" | tee -a $M
    echo
    { echo "==== summary"; echo "machine    FAIL  missing:$missing"; } | tee $OUT/summary.txt
    exit 1
fi
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
RESULTS+=("$(printf '%-10s %s  %s' machine PASS "GPU: ${gpu:-none (no nvidia-smi)}; every library found")")

# ---- the GPU stages (the dry run: small sizes, the CPU stand-in for the op tests)
TRAIN_UST=$UST
if [ "$DRY" = 1 ]; then
    export UST_TEST_CUDA_FAKE=cpu
    ATT=1,64 BENCH="1 8 1 bf16 llama-tiny 989" BENCH_LIMIT=300 # the emulator is slow in wall time
    # gpu_cuda.sh's no-GPU branch with the CUDA build (the emulator's would train on "the GPU")
    [ -x ./ustrain ] && TRAIN_UST=./ustrain
else
    ATT=8,1024 BENCH="8 1024 10 bf16 gpt2-124m 989" BENCH_LIMIT=120
fi
run_stage ops test_cuda_ops.log 120 "grep -E '^# [0-9]+ passed' \$L" -- $BUILD/test/test_cuda_ops
run_stage attention attention_full.log 60 \
    "grep -o 'B=.*largest.*' \$L" -- env -u UST_TEST_CUDA_FAKE UST_TEST_ATT_FULL=$ATT $BUILD/test/test_cuda_ops
run_stage moe test_moe.log 45 "grep -E '^# [0-9]+ passed' \$L" -- $BUILD/test/test_moe
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
run_stage training training.log 150 \
    "echo \$(grep -c '^PASS' \$L) passed, \$(grep -c '^FAIL' \$L) failed, \$(grep -c '^SKIP' \$L) skipped" -- \
    env UST=$TRAIN_UST bash test/sh/gpu_cuda.sh
[ "${ngpu:-0}" -lt 2 ] &&
    echo "NCCL: $ngpu GPU(s): multi-rank NCCL needs a GPU per rank, so only its world-1 cases run" | tee -a $OUT/training.log
UST_TEST_ONLY_NCCL=1 timeout -k 5 $(limit 30) $BUILD/test/test_comm 2>&1 | grep -E '^(PASS|FAIL|SKIP|#|nccl)' >>$OUT/training.log
run_stage bench bench_gpu.log $BENCH_LIMIT "grep -oE '[0-9.]+ tokens/s.*MFU [0-9.]+%' \$L" -- $BUILD/bench_gpu $BENCH
if $BUILD/bench_gpu --model-only >/dev/null 2>&1; then
    run_stage roofline bench_gpu.log 20 "grep -E '^bench_gpu --model-only: expected' \$L" -- $BUILD/bench_gpu --model-only
fi

# ---- the summary: the last lines printed
echo
{
    echo "==== summary (gpu-check, $([ "$DRY" = 1 ] && echo 'DRY RUN on the emulator build' || echo "$BUILD"), $((SECONDS - T0)) s of ${BUDGET} s)"
    printf '%s\n' "${RESULTS[@]}"
    grep -h -m1 '^# CUDA driver' $OUT/test_cuda_ops.log $OUT/attention_full.log 2>/dev/null | head -1
    echo "NCCL multi-rank: $([ "${ngpu:-0}" -ge 2 ] && echo "ran in training (gpu_cuda.sh, $ngpu GPUs)" || echo "not run: ${ngpu:-0} GPU(s), NCCL needs a GPU per rank")"
    [ -s $OUT/reruns.log ] && echo "reruns (CUDA_LAUNCH_BLOCKING=1, compute-sanitizer): $OUT/reruns.log"
    echo "logs: $OUT ($(ls $OUT | wc -l) files)"
    echo "result: $([ $fail -eq 0 ] && echo 'ALL PASS' || echo 'SOME FAILED')"
} | tee $OUT/summary.txt
exit $fail
