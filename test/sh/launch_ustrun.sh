# scripts/ustrun: the torchrun-style path end to end. The bootstrap check program (every rank puts,
# fences and reads everyone's values) at 2 and 8 ranks; output prefixes, exit codes, signal
# forwarding, OMP_NUM_THREADS; and `ustrain bench comm` when it is built.
. test/lib.sh
. test/sh/launch_lib.sh

ranks_check_ok "ustrun_2_ranks_bootstrap_check" 2 -- timeout 60 scripts/ustrun --nproc-per-node 2 "$TB" --ranks-check --timeout 20
ranks_check_ok "ustrun_8_ranks_bootstrap_check" 8 -- timeout 60 scripts/ustrun --nproc-per-node 8 "$TB" --ranks-check --timeout 20
# Two "nodes" of 2 on this host: node ids and local ranks come from --node-rank and the launcher.
port=$(free_port)
timeout 60 scripts/ustrun --nnodes 2 --node-rank 1 --nproc-per-node 2 --master-port "$port" "$TB" --ranks-check --timeout 20 >"$TMP/n1.out" 2>&1 &
n1=$!
ranks_check_ok "ustrun_2_nodes_of_2_bootstrap_check" 2 -- timeout 60 scripts/ustrun --nnodes 2 --node-rank 0 --nproc-per-node 2 --master-port "$port" "$TB" --ranks-check --timeout 20
wait $n1; rc=$?
if [ $rc = 0 ] && grep -q "rank 3 of 4: kind env, local 1 of 2, node 1 of 2" "$TMP/n1.out"; then pass ustrun_second_node_sees_node_1_of_2
else fail ustrun_second_node_sees_node_1_of_2 "exit $rc: $(tail -3 "$TMP/n1.out")"; fi

# Plain environment without LOCAL_RANK/LOCAL_WORLD_SIZE (hand-started ranks): local ranks and
# nodes are derived from the hostnames the ranks exchange.
port=$(free_port)
for r in 1 2; do
    timeout 30 env RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$TB" --ranks-check --timeout 20 >"$TMP/h$r" 2>&1 &
done
timeout 30 env RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$TB" --ranks-check --timeout 20 >"$TMP/h0" 2>&1
rc=$?; wait
if [ $rc = 0 ] && grep -q "rank 2 of 3: kind env, local 2 of 3, node 0 of 1" "$TMP/h2" && [ "$(cat "$TMP"/h? | grep -c 'ranks-check ok')" = 3 ]; then
    pass env_without_local_rank_derives_local_ranks_from_hostnames
else fail env_without_local_rank_derives_local_ranks_from_hostnames "exit $rc: $(cat "$TMP"/h? | tail -3)"; fi

# Every line prefixed with its rank, stdout and stderr kept apart.
out=$(timeout 20 scripts/ustrun --nproc-per-node 2 sh -c 'echo "out $RANK/$WORLD_SIZE $LOCAL_RANK/$LOCAL_WORLD_SIZE"; echo "err $RANK" >&2; printf "no newline $RANK"' 2>"$TMP/err")
if echo "$out" | grep -qx '\[rank 1\] out 1/2 1/2' && echo "$out" | grep -qx '\[rank 0\] no newline 0' &&
   grep -qx '\[rank 1\] err 1' "$TMP/err" && ! echo "$out" | grep -q err; then pass ustrun_prefixes_each_line_with_its_rank
else fail ustrun_prefixes_each_line_with_its_rank "stdout: $out / stderr: $(cat "$TMP/err")"; fi

out=$(env -u OMP_NUM_THREADS timeout 20 scripts/ustrun --nproc-per-node 2 sh -c 'echo "omp=$OMP_NUM_THREADS"')
cores=$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')
want=$(( cores / 2 > 1 ? cores / 2 : 1 ))
if [ "$(echo "$out" | grep -c "omp=$want\$")" = 2 ]; then pass ustrun_sets_omp_threads_to_cores_per_rank
else fail ustrun_sets_omp_threads_to_cores_per_rank "want $want: $out"; fi

# A failing rank: the others (sleeping) are ended, ustrun returns that rank's code, quickly.
t0=$(date +%s)
timeout 30 scripts/ustrun --nproc-per-node 3 sh -c 'if [ "$RANK" = 1 ]; then sleep 0.3; exit 3; fi; exec sleep 30' >"$TMP/o" 2>&1
rc=$?; dt=$(( $(date +%s) - t0 ))
if [ $rc = 3 ] && [ $dt -le 5 ] && grep -q "rank 1 failed first (exited with code 3); ending the other 2" "$TMP/o"; then pass ustrun_returns_the_failed_rank_code_and_ends_the_others
else fail ustrun_returns_the_failed_rank_code_and_ends_the_others "exit $rc after ${dt}s: $(tail -2 "$TMP/o")"; fi

# The first failure is often a consequence (rank 1: "No such file") of another rank's (rank 0:
# "/dev/shm is too small", printed a moment later): for --fail-grace seconds the others still run
# and their output is forwarded. Rank 0 here dies of SIGTERM (no handler), so a launcher that
# ends it at once loses its message. Five runs: a race would show up.
lost=""
for i in 1 2 3 4 5; do
    timeout 30 scripts/ustrun --nproc-per-node 3 sh -c 'case $RANK in
        1) sleep 0.2; echo "secondary: No such file" >&2; exit 3;;
        0) sleep 0.7; echo "the real cause" >&2; exit 2;;
        *) exec sleep 30;; esac' >"$TMP/o" 2>&1
    rc=$?
    { [ $rc = 3 ] && grep -qx '\[rank 0\] the real cause' "$TMP/o" && grep -q "rank 1 failed first (exited with code 3)" "$TMP/o" &&
      grep -q "rank 0 exited with code 2 too" "$TMP/o"; } || lost="$lost run $i: exit $rc: $(tr '\n' '|' <"$TMP/o");"
done
[ -z "$lost" ] && pass ustrun_forwards_the_others_output_after_the_first_failure || fail ustrun_forwards_the_others_output_after_the_first_failure "$lost"

# A rank that ignores SIGTERM gets SIGKILL after the grace period.
t0=$(date +%s)
timeout 30 scripts/ustrun --grace 1 --nproc-per-node 2 sh -c 'trap "" TERM; if [ "$RANK" = 1 ]; then exit 4; fi; sleep 30' >"$TMP/o" 2>&1
rc=$?; dt=$(( $(date +%s) - t0 ))
if [ $rc = 4 ] && [ $dt -le 6 ] && grep -q "killing it" "$TMP/o"; then pass ustrun_kills_a_rank_that_ignores_sigterm_after_grace
else fail ustrun_kills_a_rank_that_ignores_sigterm_after_grace "exit $rc after ${dt}s: $(tail -2 "$TMP/o")"; fi

# SIGUSR1 (Slurm's warning) and SIGTERM reach every rank; ranks that stop cleanly make exit 0.
cat >"$TMP/graceful.sh" <<'EOS'
trap 'echo "got USR1"; exit 0' USR1
trap 'echo "got TERM"; exit 0' TERM
echo ready
for _ in $(seq 1200); do sleep 0.1; done  # bounded, should this test go wrong
EOS
for sig in USR1 TERM INT; do
    # No `timeout` wrapper here: it would take the signal itself. A watchdog bounds the wait.
    scripts/ustrun --nproc-per-node 2 bash "$TMP/graceful.sh" >"$TMP/o" 2>&1 &
    pid=$!
    # generous bounds: on a loaded machine the ranks may take seconds to start
    for _ in $(seq 600); do [ "$(grep -c ready "$TMP/o" 2>/dev/null)" = 2 ] && break; sleep 0.1; done
    kill -"$sig" $pid
    for _ in $(seq 600); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
    kill -0 $pid 2>/dev/null && kill -KILL $pid
    wait $pid; rc=$?
    want_line=$sig; [ $sig = INT ] && want_line=""
    if [ $sig = INT ]; then
        # bash without an INT trap dies of SIGINT: ustrun reports 128+2.
        if [ $rc = 130 ]; then pass ustrun_forwards_sigint; else fail ustrun_forwards_sigint "exit $rc: $(cat "$TMP/o")"; fi
    elif [ $rc = 0 ] && [ "$(grep -c "got $want_line" "$TMP/o")" = 2 ]; then pass "ustrun_forwards_sig${sig,,}_to_every_rank"
    else fail "ustrun_forwards_sig${sig,,}_to_every_rank" "exit $rc: $(cat "$TMP/o")"; fi
done

# A stop (SIGTERM/SIGUSR1 to ustrun) that comes while the ranks start, before they have installed
# their handler: it is held for each rank until the rank handles it, so ranks that stop cleanly
# make exit 0 (the old launcher forwarded it at once: the ranks died, exit 143).
# catches PID SIG: PID has a handler for signal number SIG (bit SIG-1 of /proc's SigCgt).
catches() { local m; m=$(awk '/^SigCgt:/ {print $2}' /proc/$1/status 2>/dev/null); [ -n "$m" ] && [ $(( 0x$m >> ($2 - 1) & 1 )) = 1 ]; }
cat >"$TMP/late.py" <<'EOS'
import signal, sys, time
def stop(signum, frame):
    print("stopped cleanly by %d" % signum, flush=True)
    sys.exit(0)
time.sleep(0.5)  # a rank that installs its stop handler only after a while (ustrain: at once)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGUSR1, stop)
for _ in range(600):  # bounded, should this test go wrong
    time.sleep(0.1)
sys.exit(5)
EOS
# early_stop SIG OUT cmd...: starts cmd (a ustrun) with output to OUT, sends it SIG as soon as it
# handles SIG itself (the ranks are being started then), waits for it (bounded); sets rc.
early_stop() {
    local sig=$1 out=$2 num pid; shift 2
    num=$(kill -l $sig)
    "$@" >"$out" 2>&1 &
    pid=$!
    for _ in $(seq 600); do catches $pid $num && break; sleep 0.01; done
    kill -$sig $pid
    for _ in $(seq 1200); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
    kill -0 $pid 2>/dev/null && kill -KILL $pid
    wait $pid; rc=$?
}
for sig in TERM USR1; do
    early_stop $sig "$TMP/o" scripts/ustrun --nproc-per-node 2 python3 "$TMP/late.py"
    if [ $rc = 0 ] && [ "$(grep -c "stopped cleanly by $(kill -l $sig)" "$TMP/o")" = 2 ]; then pass "ustrun_holds_an_early_sig${sig,,}_until_the_ranks_handle_it"
    else fail "ustrun_holds_an_early_sig${sig,,}_until_the_ranks_handle_it" "exit $rc: $(tr '\n' '|' <"$TMP/o")"; fi
done
# ... and a program that never handles it still ends (after --stop-hold), killed by it as usual.
early_stop TERM "$TMP/o" scripts/ustrun --nproc-per-node 2 sleep 30
[ $rc = 143 ] && pass ustrun_early_sigterm_still_ends_a_rank_without_handler || fail ustrun_early_sigterm_still_ends_a_rank_without_handler "exit $rc: $(cat "$TMP/o")"
# The real trainer, stopped before its first step: exit 0, no checkpoint (needs ustrain train to
# install its handler before the bootstrap and to exit 0 on a stop seen before the first step).
$UST data demo "$TMP/data" >/dev/null
sed -e "s#data/tiny/#$TMP/data/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml >"$TMP/c.yaml"
early_stop TERM "$TMP/o" scripts/ustrun --nproc-per-node 2 $UST train "$TMP/c.yaml" --set parallel.dp=2 --set train.steps=100000
if [ $rc = 0 ] && [ ! -e "$TMP/run/ckpt/latest" ]; then pass ustrun_train_stopped_before_its_first_step_exits_0_without_checkpoint
else fail ustrun_train_stopped_before_its_first_step_exits_0_without_checkpoint "exit $rc, latest: $(cat "$TMP/run/ckpt/latest" 2>&1); $(tail -3 "$TMP/o" | tr '\n' '|')"; fi

# Under `timeout` (SIGTERM to ustrun only): the ranks get it too and ustrun ends soon (sleep has no
# handler: it gets the signal once it has run --stop-hold seconds).
t0=$(date +%s)
timeout -k 2 10 timeout 1 scripts/ustrun --nproc-per-node 2 sleep 30 >/dev/null 2>&1
rc=$?; dt=$(( $(date +%s) - t0 ))
if [ $rc = 124 ] && [ $dt -le 4 ]; then pass ustrun_ends_when_terminated_by_timeout
else fail ustrun_ends_when_terminated_by_timeout "exit $rc after ${dt}s"; fi

expect_exit ustrun_missing_program_is_exit_127 127 "cannot start" -- scripts/ustrun --nproc-per-node 2 ./no-such-program
expect_exit ustrun_bad_node_rank_is_a_usage_error 2 "node-rank" -- scripts/ustrun --nnodes 2 --node-rank 2 true
expect_exit ustrun_absurd_rank_count_is_a_usage_error 2 "--nproc-per-node 100000 is not in \[1, 1024\]" -- \
    scripts/ustrun --nproc-per-node 100000 true
# a stop while the ranks are still being started, then a SIGKILL of the launcher: the kill takes
# every rank with it (each runs in a session of its own, so nothing else would end them)
tag="ustrun-orphan-check-$$"
timeout -k 1 0.5 scripts/ustrun --nproc-per-node 1000 bash -c "exec -a $tag sleep 300" >/dev/null 2>&1
sleep 2
left=$(pgrep -c -f "^$tag" || true)
pkill -f "^$tag" 2>/dev/null
[ "$left" = 0 ] && pass ustrun_stopped_while_starting_leaves_no_rank ||
    fail ustrun_stopped_while_starting_leaves_no_rank "$left ranks left running"

bench_comm_check ustrun 2 -- timeout 120 scripts/ustrun --nproc-per-node 2 "$UST" bench comm $BENCH_ARGS
bench_comm_check ustrun 8 -- timeout 180 scripts/ustrun --nproc-per-node 8 "$UST" bench comm $BENCH_ARGS
