# Bootstrap faults on the torchrun-style path: each ends with a clear message and a non-zero exit
# within the timeout (a few seconds here), on every rank involved.
. test/lib.sh
. test/sh/launch_lib.sh

envrank() { # envrank RANK WORLD PORT cmd...: one rank with the torchrun-style environment
    local r=$1 w=$2 p=$3; shift 3
    env RANK=$r WORLD_SIZE=$w LOCAL_RANK=$r LOCAL_WORLD_SIZE=$w MASTER_ADDR=127.0.0.1 MASTER_PORT=$p "$@"
}
elapsed_ok() { [ $(( $(date +%s) - $1 )) -le $2 ]; } # started-at, at most this many seconds

# A rank that never arrives: rank 0 of 2 alone gives up after its 2 s timeout, naming rank 1.
port=$(free_port); t0=$(date +%s)
expect_exit rank_that_never_arrives_is_named_by_rank_0 2 "waiting for all 2 ranks to join at 127.0.0.1:$port.*rank 1 \(never connected" -- \
    timeout 20 env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$TB" --ranks-check --timeout 2
if elapsed_ok $t0 6; then pass rank_that_never_arrives_fails_within_the_timeout
else fail rank_that_never_arrives_fails_within_the_timeout "took $(( $(date +%s) - t0 )) s with a 2 s timeout"; fi

# Rank 0 never starts: rank 1's connection is refused until the deadline, and the message names
# the address.
port=$(free_port); t0=$(date +%s)
expect_exit refused_connection_names_master_addr_and_port 2 "could not connect .* at 127.0.0.1:$port .*[Rr]efused" -- \
    timeout 20 env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$TB" --ranks-check --timeout 2
elapsed_ok $t0 6 && pass refused_connection_fails_within_the_timeout || fail refused_connection_fails_within_the_timeout "took $(( $(date +%s) - t0 )) s"

# Wrong WORLD_SIZE on one rank: both sides fail at once with the two sizes in the message.
port=$(free_port); t0=$(date +%s)
timeout 20 env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$TB" --ranks-check --timeout 5 >"$TMP/r0" 2>&1 &
p0=$!
timeout 20 env RANK=1 WORLD_SIZE=3 LOCAL_RANK=1 LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$TB" --ranks-check --timeout 5 >"$TMP/r1" 2>&1
rc1=$?
wait $p0; rc0=$?
pat="rank 1 joined with WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2"
if [ $rc0 != 0 ] && [ $rc1 != 0 ] && grep -q "$pat" "$TMP/r0" && grep -q "$pat" "$TMP/r1"; then pass wrong_world_size_fails_both_ranks_with_both_sizes
else fail wrong_world_size_fails_both_ranks_with_both_sizes "rank 0 exit $rc0: $(tail -1 "$TMP/r0") / rank 1 exit $rc1: $(tail -1 "$TMP/r1")"; fi
elapsed_ok $t0 4 && pass wrong_world_size_fails_at_once || fail wrong_world_size_fails_at_once "took $(( $(date +%s) - t0 )) s"

# MASTER_PORT held by another process (a python listener): rank 0 cannot serve and says why;
# a rank that reaches the foreign listener gives up within its timeout.
port=$(free_port)
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(8)
print("held", flush=True); time.sleep(30)' "$port" >"$TMP/holder" 2>&1 &
holder=$!
for _ in $(seq 50); do grep -q held "$TMP/holder" 2>/dev/null && break; sleep 0.1; done
expect_exit master_port_in_use_is_named 2 "MASTER_PORT $port is already in use on 127.0.0.1" -- \
    timeout 20 env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$TB" --ranks-check --timeout 2
t0=$(date +%s)
expect_exit rank_meeting_a_foreign_listener_gives_up 2 "127.0.0.1:$port did not answer" -- \
    timeout 20 env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$TB" --ranks-check --timeout 2
elapsed_ok $t0 6 || fail rank_meeting_a_foreign_listener_within_the_timeout "took $(( $(date +%s) - t0 )) s"
kill $holder 2>/dev/null; wait $holder 2>/dev/null

# A store that closes every connection at once (as a store full of strangers may): the rank
# connects again until its timeout, then says which store did what, during which request, and
# where to look; not a guess like "rank 0 exited?".
port=$(free_port)
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(64); s.settimeout(0.5)
print("closing", flush=True)
end = time.monotonic() + 30
while time.monotonic() < end:
    try:
        s.accept()[0].close()
    except socket.timeout:
        pass' "$port" >"$TMP/closer" 2>&1 &
closer=$!
for _ in $(seq 50); do grep -q closing "$TMP/closer" 2>/dev/null && break; sleep 0.1; done
out=$(timeout 20 env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$TB" --ranks-check --timeout 2 2>&1)
rc=$?
if [ $rc = 2 ] && echo "$out" | grep -q "key-value store at 127.0.0.1:$port (served by rank 0) \(closed\|reset\) the connection during a HELLO request" &&
   ! echo "$out" | grep -q "exited?"; then pass store_that_drops_the_client_is_named_with_what_it_did
else fail store_that_drops_the_client_is_named_with_what_it_did "exit $rc: $(echo "$out" | tail -2)"; fi
kill $closer 2>/dev/null; wait $closer 2>/dev/null

# A rank killed with SIGKILL after joining, under ustrun: the others stop waiting at once (the
# store sees the connection drop), and ustrun returns non-zero. Either ustrun reaps the dead rank
# first, or a survivor reports it first: both name rank 1.
for n in 2 4; do
    t0=$(date +%s)
    timeout 30 scripts/ustrun --nproc-per-node $n "$TB" --ranks-check --timeout 10 --die-rank 1 >"$TMP/o" 2>&1
    rc=$?
    name=sigkilled_rank_ends_the_job_under_ustrun_$n
    if [ $rc != 0 ] && [ $rc != 124 ] && grep -q "rank 1 failed first (was killed by signal 9)\|rank 1 (disconnected" "$TMP/o" && elapsed_ok $t0 5; then pass $name
    else fail $name "exit $rc after $(( $(date +%s) - t0 )) s: $(tail -3 "$TMP/o")"; fi
done
# Without ustrun ending the others, the survivors see the dead rank themselves and name it.
port=$(free_port); t0=$(date +%s)
envrank 1 2 $port timeout 20 "$TB" --ranks-check --timeout 10 --die-rank 1 >"$TMP/r1" 2>&1 &
p1=$!
expect_exit survivor_names_the_dead_rank 1 "rank 1 \(disconnected \(died\?\)\)" -- envrank 0 2 $port timeout 20 "$TB" --ranks-check --timeout 10
wait $p1
elapsed_ok $t0 5 && pass survivor_notices_a_dead_rank_before_the_timeout || fail survivor_notices_a_dead_rank_before_the_timeout "took $(( $(date +%s) - t0 )) s with a 10 s timeout"
