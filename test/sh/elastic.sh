#!/usr/bin/env bash
# Elastic restarts that continue the same run: parallel.dp: auto takes dp from the world, the
# global batch stays fixed (gradient accumulation makes up the difference), so a 4-rank job that
# loses a rank at step 5 and continues on 2 ranks trains the uninterrupted run's losses;
# scripts/ustrun --max-restarts restarts a failed job by itself (the restart count in the log and
# the metrics); 3 ranks, whose dp cannot divide the batch, are refused with the reason.
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
cat >$TMP/c.yaml <<EOT
run:   {name: elastic, seed: 7}
model: {arch: llama, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 2, d_ff: 96, vocab_size: 300, max_seq_len: 64}
parallel: {dp: auto}
train: {steps: 8, seq_len: 32, micro_batch_size: 1, global_batch_size: 8}
optimizer: {lr: 3.0e-3, warmup_steps: 2}
data:  {train: "$TMP/data/train_*.bin", val: null}
checkpoint: {dir: $TMP/RUN/ckpt, every: 2}
logging: {metrics_file: $TMP/RUN/m.jsonl}
EOT
for r in ref cut auto; do sed "s#RUN#$r#g" $TMP/c.yaml >$TMP/$r.yaml; done
$UST train $TMP/ref.yaml >$TMP/ref.log 2>&1 || fail elastic_reference "$(tail -2 $TMP/ref.log)"
grep -q "dp=1" $TMP/ref/ckpt/step_8/state.json 2>/dev/null || python3 -c "
import json; s = json.load(open('$TMP/ref/ckpt/step_8/state.json'))
assert s['layout']['dp'] == 1, s['layout']" && pass dp_auto_is_one_on_one_rank || fail dp_auto_is_one_on_one_rank "layout"
# 4 ranks (dp 4); rank 2 dies at step 5; the job continues on 2 ranks (dp 2) from step 4
UST_FAULT_DIE_STEP=5 UST_FAULT_DIE_RANK=2 scripts/ustrun --nproc-per-node 4 $UST train $TMP/cut.yaml >$TMP/cut1.log 2>&1
[ $? != 0 ] && [ "$(cat $TMP/cut/ckpt/latest)" = step_4 ] && pass elastic_job_lost_a_rank_after_step_4 ||
    fail elastic_job_lost_a_rank_after_step_4 "latest $(cat $TMP/cut/ckpt/latest): $(tail -2 $TMP/cut1.log)"
scripts/ustrun --nproc-per-node 2 $UST train $TMP/cut.yaml >$TMP/cut2.log 2>&1 || fail elastic_continue_on_2 "$(tail -3 $TMP/cut2.log)"
# every step's last logged loss against the uninterrupted run (fp32 reduction order: 5e-6)
cmp_losses() { # cmp_losses NAME RUN
    python3 - $TMP/ref/m.jsonl $TMP/$2/m.jsonl $1 <<'EOT'
import json, sys
def losses(p):
    out = {}
    for l in open(p):
        r = json.loads(l)
        out[r["step"]] = r["loss"]
    return out
a, b, name = losses(sys.argv[1]), losses(sys.argv[2]), sys.argv[3]
bad = [(s, a[s], b.get(s)) for s in a if b.get(s) is None or abs(a[s] - b[s]) > 5e-6 + 5e-6 * abs(a[s])]
print(f"PASS {name}" if not bad and len(a) == 8 else f"FAIL {name}: {bad}")
EOT
}
cmp_losses elastic_4_to_2_ranks_trains_the_uninterrupted_losses cut
python3 -c "
import json; s = json.load(open('$TMP/cut/ckpt/step_8/state.json'))
print('PASS elastic_resumed_with_dp_2' if s['layout']['dp'] == 2 else f'FAIL elastic_resumed_with_dp_2: {s[\"layout\"]}')"
# the launcher restarts by itself
UST_FAULT_DIE_STEP=5 UST_FAULT_DIE_RANK=1 scripts/ustrun --nproc-per-node 2 --max-restarts 2 --restart-backoff 0.2 \
    $UST train $TMP/auto.yaml >$TMP/auto.log 2>&1
rc=$?
[ $rc = 0 ] && grep -q "ustrun: restart 1 of 2 in 0.2 s" $TMP/auto.log && grep -q "restart 1 of this job" $TMP/auto.log &&
    grep -q '"restarts":1' $TMP/auto/m.jsonl && pass ustrun_max_restarts_restarts_the_job ||
    fail ustrun_max_restarts_restarts_the_job "rc=$rc: $(grep -E 'restart|failed' $TMP/auto.log | head -4)"
cmp_losses ustrun_restart_trains_the_uninterrupted_losses auto
sed "s#RUN#three#g" $TMP/c.yaml >$TMP/three.yaml
expect_exit dp_auto_that_cannot_divide_the_batch_exits_2 2 "parallel.dp: auto gives dp = 3 on 3 ranks, which does not divide the 8 micro-batches" -- \
    scripts/ustrun --nproc-per-node 3 $UST train $TMP/three.yaml
expect_exit dp_auto_validate_needs_a_world 2 "parallel.dp: auto needs the world size" -- $UST validate $TMP/ref.yaml
expect_exit dp_auto_validate_with_world 0 "layout: dp=4 " -- $UST validate $TMP/ref.yaml --world 4
expect_exit max_restarts_negative 2 "max-restarts" -- scripts/ustrun --max-restarts -1 true
exit 0
