#!/usr/bin/env bash
# Runs every test program ($BUILD/test/test_*, build/ by default) and test script (test/sh/*.sh),
# counts the PASS/FAIL lines they print and closes with "N passed, N failed" and the suite's wall
# time ("wall time: MmSs"). Exit 1 when anything failed or a test program died without reporting.
cd "$(dirname "$0")/.." || exit 1
# BUILD: the build directory whose test programs run; UST: the binary the scripts use.
BUILD=${BUILD:-build}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE UST=${UST:-./ustrain} PYTHONNOUSERSITE=1
# the Python environment of the tests (scripts/venv.sh; test/lib.sh puts it first as well)
[ -x .venv/bin/python3 ] && PATH="$PWD/.venv/bin:$PATH"
export TB=${TB:-$BUILD/test/test_bootstrap} TC=${TC:-$BUILD/test/test_cp}
log=$(mktemp /tmp/ustrain-testlog.XXXXXX)
crashed=0
suite_start=$SECONDS
run_one() {
    local what=$1; shift
    local start=$SECONDS
    echo "== $what"
    local out=$(mktemp /tmp/ustrain-testout.XXXXXX)
    "$@" </dev/null >"$out" 2>&1
    local rc=$?
    cat "$out" >>"$log"
    grep -E '^(FAIL|SKIP)' "$out"
    [ -n "${VERBOSE:-}" ] && cat "$out"
    echo "   ($what: exit $rc, $((SECONDS - start))s)"
    if [ "$rc" -ne 0 ] && ! grep -q '^FAIL' "$out"; then
        echo "FAIL $what: exited with status $rc without reporting a failure" | tee -a "$log"
        tail -5 "$out"
        crashed=1
    fi
    rm -f "$out"
}
for t in "$BUILD"/test/test_*; do
    [ -x "$t" ] || continue
    run_one "$t" "$t"
done
for s in test/sh/*.sh; do
    [ -f "$s" ] || continue
    run_one "$s" bash "$s"
done
np=$(grep -c '^PASS' "$log")
nf=$(grep -c '^FAIL' "$log")
echo
grep '^FAIL' "$log" | sed 's/^/  /'
echo "$np passed, $nf failed"
t=$((SECONDS - suite_start))
echo "wall time: $((t / 60))m$((t % 60))s"
rm -f "$log"
[ "$nf" -eq 0 ] && [ "$crashed" -eq 0 ]
