#!/usr/bin/env bash
# Who can get into a job (issue 10, item 7): the bootstrap store listens only on MASTER_ADDR and
# hears only clients with the job's secret; shared-memory segments are private (0600) and do not
# outlive the job, even when every rank is killed; checkpoints follow the user's umask and are
# never world-writable.
. test/lib.sh
. test/sh/launch_lib.sh

envrank() { # envrank RANK WORLD PORT cmd...: one rank with the torchrun-style environment
    local r=$1 w=$2 p=$3; shift 3
    env RANK=$r WORLD_SIZE=$w LOCAL_RANK=$r LOCAL_WORLD_SIZE=$w MASTER_ADDR=127.0.0.1 MASTER_PORT=$p "$@"
}
# listening PORT: the local addresses (hex, as /proc/net/tcp{,6} writes them) listening on PORT
listening() {
    local hexport
    hexport=$(printf '%04X' "$1")
    awk -v p="$hexport" '$4 == "0A" { split($2, a, ":"); if (a[2] == p) print a[1] }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
wait_listening() { for _ in $(seq 100); do [ -n "$(listening "$1")" ] && return 0; sleep 0.1; done; return 1; }
# client PORT SECRET RANK WORLD: a hand-made store client says HELLO; prints what came back
client() {
    python3 - "$@" <<'PY'
import socket, struct, sys
port, secret, rank, world = int(sys.argv[1]), sys.argv[2].encode(), int(sys.argv[3]), int(sys.argv[4])
s = socket.create_connection(("127.0.0.1", port), timeout=10)
body = struct.pack("<IBBHIII", 0x31545355, 1, 0, 0, rank, world, len(secret)) + secret
s.sendall(struct.pack("<I", len(body)) + body)
got = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    got += b
op = got[8] if len(got) > 8 else -1
print("reply op %d: %s; then closed" % (op, got[24:].decode(errors="replace")))
PY
}

# --- the store: bound to MASTER_ADDR only; strangers are dropped and logged, the job goes on.
port=$(free_port)
envrank 0 2 $port UST_JOB_SECRET=s3cret-of-the-job timeout 40 "$TB" --ranks-check --timeout 30 >"$TMP/r0" 2>&1 &
p0=$!
if wait_listening $port; then
    addrs=$(listening $port | sort -u | tr '\n' ' ')
    [ "$addrs" = "0100007F " ] && pass store_listens_on_master_addr_only ||
        fail store_listens_on_master_addr_only "listening on $port at: $addrs (want only 0100007F = 127.0.0.1)"
else
    fail store_listens_on_master_addr_only "nothing listens on port $port"
fi
# A connection that never says HELLO must not hold its slot for ever.
python3 -c "
import socket, time
s = socket.create_connection(('127.0.0.1', $port)); time.sleep(12)
try: print('silent client: got %r' % s.recv(10))
except OSError as e: print('silent client:', e)" >"$TMP/silent" 2>&1 &
silent=$!
out=$(client $port "" 1 3)
echo "$out" | grep -q "reply op 19: the job secret (UST_JOB_SECRET) is missing.*closed" &&
    pass client_without_secret_is_refused || fail client_without_secret_is_refused "$out"
out=$(client $port "s3cret-of-the-jo" 1 2)
echo "$out" | grep -q "reply op 19: the job secret (UST_JOB_SECRET) .*closed" &&
    pass client_with_a_wrong_secret_is_refused || fail client_with_a_wrong_secret_is_refused "$out"
# The intruder claimed rank 1 with another WORLD_SIZE: without the secret check that poisons the
# job; here the real rank 1 still joins and both ranks pass.
wait $silent
out=$(envrank 1 2 $port UST_JOB_SECRET=s3cret-of-the-job timeout 30 "$TB" --ranks-check --timeout 20 2>&1)
wait $p0; rc0=$?
if [ $rc0 = 0 ] && echo "$out" | grep -q "ranks-check ok rank 1 of 2" && grep -q "ranks-check ok rank 0 of 2" "$TMP/r0"; then
    pass job_with_the_secret_runs_after_intruders
else fail job_with_the_secret_runs_after_intruders "rank 0 exit $rc0: $(tail -2 "$TMP/r0") / rank 1: $(echo "$out" | tail -2)"; fi
n_no=$(grep -c "dropping a client from 127.0.0.1:[0-9]* (says rank 1): no job secret" "$TMP/r0")
n_wrong=$(grep -c "dropping a client from 127.0.0.1:[0-9]* (says rank 1): wrong job secret" "$TMP/r0")
n_silent=$(grep -c "dropping a client from 127.0.0.1:[0-9]*: no HELLO within" "$TMP/r0")
[ "$n_no" = 1 ] && [ "$n_wrong" = 1 ] && [ "$n_silent" = 1 ] && pass refused_clients_are_logged_by_rank_0 ||
    fail refused_clients_are_logged_by_rank_0 "no secret $n_no, wrong $n_wrong, silent $n_silent log lines: $(grep dropping "$TMP/r0" | head -3)"
grep -q "silent client: got b''" "$TMP/silent" && pass silent_client_is_disconnected ||
    fail silent_client_is_disconnected "$(cat "$TMP/silent")"

# A flood of strangers while the job starts (issue 18, item 18): 200 connections kept open (each
# one dropped is opened again), every 10th sending garbage and every 10th a HELLO with a wrong
# secret, from before rank 0 listens until the job has ended. Rank 3 joins 2 s late, in the
# middle of it. Idle and anonymous connections must not crowd the ranks out: the job passes.
cat >"$TMP/flood.py" <<'PY'
import os, select, socket, struct, sys, time
port, stop = int(sys.argv[1]), sys.argv[2]
end = time.monotonic() + 90  # bounded, should the job hang
hello = struct.pack("<IBBHIII", 0x31545355, 1, 0, 0, 3, 4, 5) + b"wrong"
conns, opened, dropped, peak = [], 0, 0, 0
while time.monotonic() < end and not os.path.exists(stop):
    for _ in range(200 - len(conns)):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
        except OSError:
            break  # not listening yet, or the backlog is full: next round
        if opened % 10 == 0:
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        elif opened % 10 == 1:
            s.sendall(struct.pack("<I", len(hello)) + hello)
        conns.append(s)
        opened += 1
    peak = max(peak, len(conns))
    readable = select.select(conns, [], [], 0.05)[0] if conns else []
    for s in readable:
        try:
            gone = s.recv(4096) == b""
        except OSError:
            gone = True
        if gone:
            s.close(); conns.remove(s); dropped += 1
    if not conns:
        time.sleep(0.05)
print("flood: opened %d, dropped by the store %d, at most %d open at once" % (opened, dropped, peak))
PY
port=$(free_port)
python3 "$TMP/flood.py" $port "$TMP/flood.stop" >"$TMP/flood" 2>&1 &
flood=$!
timeout 120 scripts/ustrun --nproc-per-node 4 --master-port $port sh -c '[ "$RANK" = 3 ] && sleep 2; exec "$0" "$@"' \
    "$TB" --ranks-check --timeout 60 >"$TMP/o" 2>&1
rc=$?
touch "$TMP/flood.stop"; wait $flood
if [ $rc = 0 ] && [ "$(grep -c 'ranks-check ok' "$TMP/o")" = 4 ] && grep -q "at most 200 open" "$TMP/flood"; then
    pass job_completes_under_a_flood_of_idle_and_bad_connections
else fail job_completes_under_a_flood_of_idle_and_bad_connections "exit $rc; $(cat "$TMP/flood"); $(grep -v 'dropping a client' "$TMP/o" | tail -3 | tr '\n' '|')"; fi
n_logged=$(grep -c "dropping a client" "$TMP/o")
[ "$n_logged" -le 10 ] && grep -q "bootstrap store 127.0.0.1:$port: dropped [0-9]* clients in all" "$TMP/o" &&
    pass store_logs_a_flood_in_a_few_lines || fail store_logs_a_flood_in_a_few_lines "$n_logged drop lines: $(grep 'dropped\|dropping' "$TMP/o" | tail -2)"

# A real rank with the wrong secret is told what to fix.
port=$(free_port)
envrank 0 2 $port UST_JOB_SECRET=right timeout 20 "$TB" --ranks-check --timeout 3 >"$TMP/r0" 2>&1 &
p0=$!
expect_exit rank_with_a_wrong_secret_is_told_why 2 "could not join the job.*UST_JOB_SECRET" -- \
    envrank 1 2 $port UST_JOB_SECRET=wrong timeout 20 "$TB" --ranks-check --timeout 3
wait $p0

# No secret at all (a plain torchrun environment): the job runs, rank 0 warns once.
port=$(free_port)
envrank 0 2 $port timeout 20 "$TB" --ranks-check --timeout 10 >"$TMP/r0" 2>&1 &
p0=$!
envrank 1 2 $port timeout 20 "$TB" --ranks-check --timeout 10 >"$TMP/r1" 2>&1
wait $p0; rc0=$?
nwarn=$(cat "$TMP/r0" "$TMP/r1" | grep -c "UST_JOB_SECRET is not set")
[ $rc0 = 0 ] && grep -q "ranks-check ok" "$TMP/r1" && [ "$nwarn" = 1 ] && pass no_secret_runs_and_warns_once ||
    fail no_secret_runs_and_warns_once "rank 0 exit $rc0, $nwarn warnings: $(tail -2 "$TMP/r0")"

# ustrun makes a fresh secret per job and gives every rank the same one.
s1=$(scripts/ustrun --nproc-per-node 2 --no-prefix sh -c 'echo "$UST_JOB_SECRET"' | sort -u)
s2=$(scripts/ustrun --nproc-per-node 1 --no-prefix sh -c 'echo "$UST_JOB_SECRET"')
[ "$(echo "$s1" | wc -l)" = 1 ] && [ ${#s1} -ge 32 ] && [ -n "$s2" ] && [ "$s1" != "$s2" ] &&
    pass ustrun_gives_each_job_its_own_secret || fail ustrun_gives_each_job_its_own_secret "'$s1' / '$s2'"

# --- shared memory: 0600, nothing left after a job, also when every rank is SIGKILLed.
# UST_FAULT_SHM_ATTACH_SLEEP_MS (test-only) holds rank 1 before it maps rank 0's segment, so the
# segment is there under its name long enough to look at it and to kill the job in that window.
J=sec$$
BENCH="$UST bench comm --min-bytes 4K --max-bytes 4K --iters 1 --timeout 30"
segs() { ls /dev/shm 2>/dev/null | grep "^ust-$1-"; }
ranks_of() { pgrep -P "$(pgrep -P "$1")"; } # the ranks under `timeout ... ustrun` started as $1
wait_seg() { for _ in $(seq 150); do [ -n "$(segs "$1")" ] && return 0; sleep 0.1; done; return 1; }
UST_JOB_ID=${J}a timeout 60 scripts/ustrun --nproc-per-node 2 $BENCH >"$TMP/o" 2>&1; rc=$?
[ $rc = 0 ] && [ -z "$(segs ${J}a)" ] && pass shm_nothing_left_after_a_job ||
    fail shm_nothing_left_after_a_job "exit $rc, left: $(segs ${J}a) $(tail -2 "$TMP/o")"

UST_JOB_ID=${J}b UST_FAULT_SHM_ATTACH_SLEEP_MS=20000 timeout 60 scripts/ustrun --nproc-per-node 2 $BENCH >"$TMP/o" 2>&1 &
launcher=$!
if wait_seg ${J}b; then
    mode=$(stat -c %a "/dev/shm/$(segs ${J}b | head -1)")
    [ "$mode" = 600 ] && pass shm_segment_is_mode_0600 || fail shm_segment_is_mode_0600 "mode $mode"
    kill -9 $(ranks_of $launcher)
    wait $launcher
    [ -z "$(segs ${J}b)" ] && grep -q "ustrun: removed 1 shared-memory segment" "$TMP/o" &&
        pass ustrun_removes_segments_of_sigkilled_ranks ||
        fail ustrun_removes_segments_of_sigkilled_ranks "left: $(segs ${J}b); $(tail -2 "$TMP/o")"
else
    fail shm_segment_is_mode_0600 "no segment of job ${J}b appeared: $(tail -2 "$TMP/o")"
    kill $launcher; wait $launcher
fi

# The launcher dies with its ranks: the segment stays until the next job on the node starts and
# removes it (its creator is dead). A segment whose creator lives (this shell) is kept.
UST_JOB_ID=${J}c UST_FAULT_SHM_ATTACH_SLEEP_MS=20000 timeout 60 scripts/ustrun --nproc-per-node 2 $BENCH >"$TMP/o" 2>&1 &
launcher=$!
if wait_seg ${J}c; then
    stale=$(segs ${J}c | head -1)
    kill -9 $(pgrep -P $launcher) $(ranks_of $launcher)
    wait $launcher 2>/dev/null
    live=/dev/shm/ust-${J}live-test-p$$-1
    touch $live
    if [ -e "/dev/shm/$stale" ]; then
        timeout 60 scripts/ustrun --nproc-per-node 2 $BENCH >"$TMP/o" 2>&1; rc=$?
        [ $rc = 0 ] && [ ! -e "/dev/shm/$stale" ] && grep -q "removed stale shared memory /dev/shm/$stale" "$TMP/o" &&
            pass next_job_removes_segments_of_a_killed_job ||
            fail next_job_removes_segments_of_a_killed_job "exit $rc, $(ls /dev/shm/$stale 2>&1); $(tail -2 "$TMP/o")"
        [ -e $live ] && pass segment_of_a_live_creator_is_kept || fail segment_of_a_live_creator_is_kept "removed"
    else
        fail next_job_removes_segments_of_a_killed_job "precondition: the killed job left nothing to clean"
    fi
    rm -f $live
else
    fail next_job_removes_segments_of_a_killed_job "no segment of job ${J}c appeared: $(tail -2 "$TMP/o")"
    kill $launcher; wait $launcher
fi

# --- checkpoints follow the umask and are never world-writable.
$UST data demo $TMP/data >/dev/null
sed -e "s#data/tiny/#$TMP/data/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml >$TMP/c.yaml
# modes DIR: "path mode" for the step directories, their files and `latest`
modes() { (cd "$1" && find latest step_* -printf '%p %m\n' | sort); }
for um in 022 077 000; do
    rm -rf $TMP/run
    (umask $um && $UST train $TMP/c.yaml --set train.steps=2 --set checkpoint.every=2 >$TMP/o 2>&1)
    m=$(modes $TMP/run/ckpt 2>&1)
    case $um in
    022) want_f=644 want_d=755 ;;
    077) want_f=600 want_d=700 ;;
    000) want_f=644 want_d=755 ;; # the code's own modes: never writable by others
    esac
    bad=$(echo "$m" | awk -v f=$want_f -v d=$want_d '{ base = $1; sub(/.*\//, "", base) }
        ($1 ~ /^step_[0-9]+$/ && $2 != d) || ($1 !~ /^step_[0-9]+$/ && $2 != f)')
    if [ -n "$m" ] && echo "$m" | grep -q "model.safetensors" && [ -z "$bad" ]; then pass checkpoint_modes_under_umask_$um
    else fail checkpoint_modes_under_umask_$um "want files $want_f, dirs $want_d: ${bad:-$m}"; fi
done
