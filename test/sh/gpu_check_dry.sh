#!/usr/bin/env bash
# scripts/gpu-check.sh end to end without a GPU (GPU_CHECK_DRY=1, on the emulator build): every
# stage runs (small sizes, the CPU stand-in for the op tests) and PASSes; the last lines printed are
# the summary (at most 60, each stage with its figure), also $OUT/summary.txt, and $OUT holds at
# most 8 files. A failure planted in one stage is a FAIL in the summary and is rerun once with
# CUDA_LAUNCH_BLOCKING=1 (reruns.log); a binary whose library is missing stops the check at the
# machine stage, naming the library.
. "$(dirname "$0")/../lib.sh"
if ! command -v g++ >/dev/null; then
    echo "SKIP gpu_check_dry: g++ is not installed (scripts/install-deps.sh installs it)"
    exit 0
fi
make -s emu -j"$(nproc)" >$TMP/build.log 2>&1 || { fail gpu_check_dry_emu_build "$(tail -3 $TMP/build.log)"; exit 0; }
# check DIR [VAR=VALUE...]: the dry run into $TMP/DIR; its output in $TMP/DIR.txt, exit in $TMP/DIR.rc
check() {
    local d=$1; shift
    env "$@" GPU_CHECK_DRY=1 OUT=$TMP/$d bash scripts/gpu-check.sh >$TMP/$d.txt 2>&1
    echo $? >$TMP/$d.rc
    # the summary as printed: from its header to the end
    sed -n '/^==== summary/,$p' $TMP/$d.txt >$TMP/$d.sum
}
stage_is() { grep -qE "^$2 +$3 " $TMP/$1.sum; }

check ok
bad=""
for s in machine ops attention moe training bench roofline; do stage_is ok $s PASS || bad="$bad $s"; done
[ "$(cat $TMP/ok.rc)" = 0 ] && [ -z "$bad" ] && grep -q '^result: ALL PASS' $TMP/ok.sum &&
    pass gpu_check_dry_run_passes_every_stage ||
    fail gpu_check_dry_run_passes_every_stage "exit $(cat $TMP/ok.rc), not PASS:$bad; $(tail -12 $TMP/ok.txt | tr '\n' '|')"
n=$(wc -l <$TMP/ok.sum)
[ "$n" -le 60 ] && [ "$(tail -n "$n" $TMP/ok.txt)" = "$(cat $TMP/ok.sum)" ] && cmp -s $TMP/ok.sum $TMP/ok/summary.txt &&
    grep -qE '^attention +PASS +B=1 T=64 .*largest' $TMP/ok.sum && grep -qE '^bench +PASS +[0-9.]+ tokens/s' $TMP/ok.sum &&
    grep -q '^NCCL multi-rank: not run' $TMP/ok.sum && grep -qE '^roofline +PASS +bench_gpu --model-only: expected [0-9.]+ ms/step, MFU [0-9.]+% at the roofline' $TMP/ok.sum &&
    pass gpu_check_ends_with_a_summary_of_at_most_60_lines_with_figures ||
    fail gpu_check_ends_with_a_summary_of_at_most_60_lines_with_figures "$n lines: $(tr '\n' '|' <$TMP/ok.sum)"
nf=$(ls $TMP/ok | wc -l)
[ "$nf" -le 8 ] && [ -s $TMP/ok/test_cuda_ops.log ] && [ -s $TMP/ok/bench_gpu.log ] && [ -s $TMP/ok/machine.log ] &&
    grep -q 'per-op\|where a step' $TMP/ok/bench_gpu.log &&
    pass gpu_check_logs_at_most_8_files_under_out || fail gpu_check_logs_at_most_8_files_under_out "$nf files: $(ls $TMP/ok | tr '\n' ' ')"

check planted GPU_CHECK_DRY_FAIL=moe
[ "$(cat $TMP/planted.rc)" = 1 ] && stage_is planted moe FAIL && stage_is planted ops PASS && stage_is planted bench PASS &&
    grep -q '^==== rerun of moe with CUDA_LAUNCH_BLOCKING=1' $TMP/planted/reruns.log && grep -q '^result: SOME FAILED' $TMP/planted.sum &&
    pass gpu_check_failed_stage_is_a_fail_and_rerun_with_launch_blocking ||
    fail gpu_check_failed_stage_is_a_fail_and_rerun_with_launch_blocking "exit $(cat $TMP/planted.rc); $(tr '\n' '|' <$TMP/planted.sum)"

# a build folder whose test_moe needs a library that is gone
mkdir -p $TMP/b/test
for f in ustrain bench_gpu test/test_cuda_ops test/test_comm; do ln -s $PWD/build-emu/$f $TMP/b/$f; done
echo 'int gone(void) { return 0; }' >$TMP/gone.c && echo 'int gone(void); int main(void) { return gone(); }' >$TMP/m.c
gcc -shared -fPIC -o $TMP/libgone.so $TMP/gone.c && gcc -o $TMP/b/test/test_moe $TMP/m.c -L$TMP -lgone && rm $TMP/libgone.so
check missing GPU_CHECK_BUILD=$TMP/b
[ "$(cat $TMP/missing.rc)" = 1 ] && grep -q "^FAIL machine: missing: .*test_moe: libgone.so" $TMP/missing.txt &&
    ! grep -q '^==== ops' $TMP/missing.txt && grep -qE '^machine +FAIL' $TMP/missing.sum &&
    pass gpu_check_missing_library_stops_naming_it ||
    fail gpu_check_missing_library_stops_naming_it "exit $(cat $TMP/missing.rc); $(tail -3 $TMP/missing.txt | tr '\n' '|')"
