# Helpers for the launch_*.sh and boot_faults.sh tests (sourced after test/lib.sh). Run on its own,
# as test/run.sh does with every test/sh/*.sh, it does nothing.
[ "${BASH_SOURCE[0]}" = "$0" ] && exit 0

TB=${TB:-build/test/test_bootstrap}
BENCH_ARGS=${BENCH_ARGS:---min-bytes 4K --max-bytes 64K --iters 3 --timeout 30}
if [ ! -x "$TB" ]; then
    fail "$(basename "$0" .sh)" "$TB is not built (run make first)"
    exit 1
fi

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# ranks_check_ok NAME N -- cmd...: the bootstrap check passed on N ranks, all with the same job id.
ranks_check_ok() {
    local name=$1 n=$2; shift 3
    local out rc
    out=$("$@" 2>&1); rc=$?
    local ok jobs
    ok=$(echo "$out" | grep -c 'ranks-check ok')
    jobs=$(echo "$out" | grep 'ranks-check ok' | sed 's/.* job //' | sort -u | wc -l)
    if [ $rc = 0 ] && [ "$ok" = "$n" ] && [ "$jobs" = 1 ]; then pass "$name"
    else fail "$name" "exit $rc, $ok of $n ranks ok, $jobs job ids: $(echo "$out" | grep -v 'ranks-check ok' | tail -4)"; fi
}

# Whether `ustrain bench comm` is built and works on one process; sets BENCH_WHY when not.
bench_available() {
    BENCH_WHY=""
    if [ ! -x "$UST" ]; then BENCH_WHY="$UST is not built"; return 1; fi
    local out
    out=$(timeout 60 "$UST" bench comm --min-bytes 4K --max-bytes 4K --iters 1 --timeout 10 2>&1)
    if ! echo "$out" | grep -q "all results correct"; then
        BENCH_WHY="\`ustrain bench comm\` does not run on one process yet: $(echo "$out" | tail -1)"
        return 1
    fi
}

# The result of a bench run, without timings: the rows' op, bytes and count, and the verdict.
bench_table() { sed 's/^\[rank [0-9]*\] //' | awk '$2 ~ /^[0-9]+$/ && $3 ~ /^[0-9]+$/ {print $1, $2, $3, ($NF == "WRONG" ? "WRONG" : "ok")} /^bench comm: (all results correct|WRONG)/'; }

# bench_comm_check LAUNCHER N -- cmd...: bench comm under the launcher is correct and gives the
# same table as under scripts/ustrun.
bench_comm_check() {
    local launcher=$1 n=$2; shift 3
    local name="bench_comm_${launcher}_${n}_ranks_correct_and_same_as_ustrun"
    if ! bench_available; then echo "SKIP $name: $BENCH_WHY"; return 0; fi
    local out rc
    out=$("$@" 2>&1); rc=$?
    if [ $rc != 0 ] || ! echo "$out" | grep -q "all results correct"; then
        fail "$name" "exit $rc: $(echo "$out" | tail -3)"; return 1
    fi
    if ! echo "$out" | grep -q "$n ranks, .*bootstrap $(case $launcher in ustrun) echo env;; *) echo pmix;; esac)"; then
        fail "$name" "not $n ranks over the expected bootstrap: $(echo "$out" | grep 'bench comm:' | head -1)"; return 1
    fi
    echo "$out" | bench_table >"$TMP/bench.$launcher.$n"
    if [ "$launcher" != ustrun ]; then
        timeout 180 scripts/ustrun --nproc-per-node "$n" "$UST" bench comm $BENCH_ARGS 2>&1 | bench_table >"$TMP/bench.ref.$n"
        if ! cmp -s "$TMP/bench.ref.$n" "$TMP/bench.$launcher.$n" || [ ! -s "$TMP/bench.ref.$n" ]; then
            fail "$name" "results differ from ustrun's: $(diff "$TMP/bench.ref.$n" "$TMP/bench.$launcher.$n" | head -4)"; return 1
        fi
    fi
    pass "$name"
}
