#!/usr/bin/env bash
# Hangs named: every collective has a sequence number per group; when one times out the waiting
# rank prints a "hang:" line with the group, its op (#seq, kind) and, on the shared-memory
# backend, where each member it waits on is (in an earlier op, or between ops: computing or
# stopped), and scripts/ustrun gathers those lines into one naming the ranks behind. Cases: a
# SIGSTOPped rank, and a rank looping in compute (test fault UST_FAULT_HANG_STEP/RANK) in a 2x2
# tp x dp job, each named within dist.timeout_s.
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
sed -e "s#data/tiny/#$TMP/data/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml >$TMP/c.yaml
C="--set train.steps=100000 --set checkpoint.every=0 --set dist.timeout_s=3"

# a stopped rank: its data-parallel peer names it
scripts/ustrun --nproc-per-node 2 --fail-grace 1 $UST train $TMP/c.yaml --set parallel.dp=2 $C >$TMP/stop.out 2>&1 &
launcher=$!
for _ in $(seq 300); do [ "$(cat $TMP/run/metrics.jsonl 2>/dev/null | wc -l)" -ge 2 ] && break; sleep 0.1; done
victim=$(pgrep -P $launcher | tail -1)
kill -STOP $victim
wait $launcher
kill -CONT $victim 2>/dev/null
# the stop lands between ops (computing) or inside one (the collective rank 0 now waits in)
WHERE="(between ops since #[0-9]+ \(computing, or stopped\)|in op #[0-9]+ \([a-z_]+\))"
# (rank 0 may be waiting in the data-parallel group's or the world's all-reduce)
grep -qE "hang: group '[a-z_]+' global rank 0 waits in op #[0-9]+ \([a-z_]+\); behind: global rank 1 $WHERE" $TMP/stop.out &&
    pass hang_stopped_rank_named_by_its_peer || fail hang_stopped_rank_named_by_its_peer "$(grep -E 'hang|timed out' $TMP/stop.out | head -3)"
grep -q "timed out after 3 s (dist.timeout_s) in op #[0-9]*, the last completed #[0-9]*" $TMP/stop.out &&
    pass hang_message_has_the_op_and_the_last_completed || fail hang_message_has_the_op_and_the_last_completed "$(grep 'timed out' $TMP/stop.out | head -2)"
WHERE1="(between ops since #[0-9]+|in op #[0-9]+ \([a-z_]+\))"
grep -qE "^ustrun: hang in group '[a-z_]+': behind: global rank 1 $WHERE1; waiting: global rank 0 in op #[0-9]+ \([a-z_]+\)" $TMP/stop.out &&
    pass ustrun_gathers_the_hang_into_one_line || fail ustrun_gathers_the_hang_into_one_line "$(grep '^ustrun' $TMP/stop.out)"

# a rank looping in compute at step 3 of a tp=2 x dp=2 job: its tensor-parallel partner and its
# data-parallel peers name global rank 3 in the groups they share with it
rm -rf $TMP/run
UST_FAULT_HANG_STEP=3 UST_FAULT_HANG_RANK=3 scripts/ustrun --nproc-per-node 4 --fail-grace 1 \
    $UST train $TMP/c.yaml --set parallel.dp=2 --set parallel.tp=2 $C >$TMP/loop.out 2>&1
rc=$?
[ $rc != 0 ] && grep -q "^ustrun: hang in group '[a-z_]*': behind: global rank 3 between ops since #[0-9]*" $TMP/loop.out &&
    ! grep "^ustrun: hang in group" $TMP/loop.out | grep -q "behind: global rank [012] " &&
    pass hang_rank_looping_in_compute_named || fail hang_rank_looping_in_compute_named "rc=$rc: $(grep -E '^ustrun|hang:' $TMP/loop.out | head -5)"
exit 0
