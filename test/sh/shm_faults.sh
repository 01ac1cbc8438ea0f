#!/usr/bin/env bash
# Shared-memory faults on one node, end to end with the trainer: a peer that died but is not
# reaped (a zombie) is noticed as dead at once, not at dist.timeout_s; a rank whose segment
# cannot be made (full /dev/shm) is reported by name, and the others say that they follow it.
. test/lib.sh

$UST data demo $TMP/data >/dev/null
sed -e "s#data/tiny/#$TMP/data/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml >$TMP/c.yaml

# --- a SIGKILLed rank whose parent does not reap it. The parent below starts two ranks with the
# torchrun-style environment (as scripts/ustrun does), kills rank 1 after a few steps and never
# waits for it, so it stays a zombie (kill(pid, 0) still succeeds). dist.timeout_s is 600: rank 0
# must see the dead peer by itself. The 120 s bound only keeps a broken build from hanging.
cat >$TMP/noreap.py <<'PY'
import os, signal, socket, subprocess, sys, time
ust, cfg, metrics, out0 = sys.argv[1:5]
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
ranks = []
for r in range(2):
    env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), UST_JOB_SECRET="noreap-secret")
    out = open(out0 if r == 0 else os.devnull, "wb")
    ranks.append(subprocess.Popen([ust, "train", cfg, "--set", "parallel.dp=2", "--set",
                                   "train.steps=100000", "--set", "checkpoint.every=100000",
                                   "--set", "dist.timeout_s=600"], env=env, stdout=out,
                                  stderr=subprocess.STDOUT))
def lines():
    try:
        with open(metrics) as f:
            return sum(1 for _ in f)
    except OSError:
        return 0
end = time.monotonic() + 120
while lines() < 3 and time.monotonic() < end and ranks[0].poll() is None:
    time.sleep(0.1)
os.kill(ranks[1].pid, signal.SIGKILL)  # and no wait() for it: a zombie
time.sleep(0.5)
with open("/proc/%d/stat" % ranks[1].pid) as f:
    print("rank 1 state", f.read().rsplit(")", 1)[1].split()[0])
while ranks[0].poll() is None and time.monotonic() < end:
    time.sleep(0.1)
if ranks[0].poll() is None:
    print("rank 0 still running after 120 s")
    ranks[0].kill()
print("rank 0 exit", ranks[0].wait())
ranks[1].wait()
PY
python3 $TMP/noreap.py $UST $TMP/c.yaml $TMP/run/metrics.jsonl $TMP/r0 >$TMP/noreap 2>&1
if grep -q "rank 1 state Z" $TMP/noreap && grep -q "rank 0 exit [1-9]" $TMP/noreap &&
   grep -q "member process has died (pid [0-9]* .*zombie.*waiting on global rank 1$" $TMP/r0; then
    pass shm_zombie_peer_is_noticed_as_dead
else fail shm_zombie_peer_is_noticed_as_dead "$(tr '\n' '|' <$TMP/noreap) rank 0: $(tail -2 $TMP/r0 | tr '\n' '|')"; fi

# --- rank 0 cannot reserve the 'world' segment (UST_FAULT_SHM_RESERVE_ERRNO=28, ENOSPC, as on a
# full /dev/shm) after it published the 'dp' one. Rank 1 then fails first, on the 'dp' segment
# that rank 0 gave up; rank 0 reports the cause a moment later, once rank 1 left the store. In
# every run, ustrun's output must hold rank 0's cause, and rank 1's message must point to it.
bad=""
for i in 1 2 3 4 5; do
    UST_FAULT_SHM_RESERVE_ERRNO=28 UST_FAULT_SHM_RESERVE_GROUP=world timeout 120 \
        scripts/ustrun --nproc-per-node 2 $UST train $TMP/c.yaml --set parallel.dp=2 >$TMP/o 2>&1
    rc=$?
    { [ $rc = 2 ] && grep -q "^\[rank 0\] .*group 'world' (2 members): No space left on device; /dev/shm is too small" $TMP/o &&
      grep -q "^ustrun: rank [01] failed first (exited with code 2)" $TMP/o &&
      ! grep "^\[rank 1\] .*error" $TMP/o | grep -qv "rank 0, may have failed\|it failed: see its message"; } ||
        bad="$bad run $i: exit $rc: $(grep -v 'rank 0\] ustrain: ' $TMP/o | tr '\n' '|' | cut -c1-600);"
done
[ -z "$bad" ] && pass shm_full_dev_shm_cause_is_reported_by_rank_0_in_every_run || fail shm_full_dev_shm_cause_is_reported_by_rank_0_in_every_run "$bad"
