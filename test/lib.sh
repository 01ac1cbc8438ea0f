# Helpers for shell tests: pass NAME / fail NAME WHY print the lines test/run.sh counts.
# Every test script runs from the repository root with $UST=./ustrain and a scratch $TMP.
set -u
UST=${UST:-./ustrain}
TMP=$(mktemp -d /tmp/ustrain-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
# expect_exit NAME CODE PATTERN -- cmd...: runs cmd, checks exit code and that stderr+stdout match PATTERN
expect_exit() {
    local name=$1 code=$2 pat=$3; shift 4
    local out rc
    out=$("$@" 2>&1); rc=$?
    if [ "$rc" != "$code" ]; then fail "$name" "exit $rc, expected $code; output: $(echo "$out" | tail -3)"; return 1; fi
    if ! echo "$out" | grep -qE -- "$pat"; then fail "$name" "output does not match /$pat/: $(echo "$out" | tail -3)"; return 1; fi
    pass "$name"
}
