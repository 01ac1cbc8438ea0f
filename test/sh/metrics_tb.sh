#!/usr/bin/env bash
# Metrics people watch: logging.tensorboard_dir writes TensorBoard event files natively (read back
# by hand with CRC32C checks and by the tensorboard package, every JSONL figure there at its
# step), the JSONL carries time, elapsed_s, samples_seen and tokens_seen, and a run resumed from
# an earlier checkpoint leaves no step twice in either (the killed run's later lines are dropped,
# TensorBoard is told to drop them with a SessionLog START); MFU never exceeds 100%.
. "$(dirname "$0")/../lib.sh"

need_py tensorboard_python_package tensorboard || exit 0
$UST data demo $TMP/data >/dev/null
cat >$TMP/tb.yaml <<EOT
run:   {name: tb, seed: 7}
model: {arch: llama, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 2, d_ff: 96, vocab_size: 300, max_seq_len: 64}
train: {steps: 5, seq_len: 32, micro_batch_size: 2, global_batch_size: 4}
data:  {train: "$TMP/data/train_*.bin", val: "$TMP/data/val_*.bin", val_every: 2, val_steps: 1}
checkpoint: {dir: $TMP/run/ckpt, every: 3, keep_last: 0}
logging: {metrics_file: $TMP/run/m.jsonl, tensorboard_dir: $TMP/run/tb}
EOT
$UST train $TMP/tb.yaml >$TMP/a.log 2>&1 || fail tb_first_run "$(tail -2 $TMP/a.log)"
# the first run got to step 5; the second resumes from step 3, as after a crash following step 5
$UST train $TMP/tb.yaml --set train.steps=6 --set checkpoint.resume=$TMP/run/ckpt/step_3 >$TMP/b.log 2>&1 ||
    fail tb_resumed_run "$(tail -2 $TMP/b.log)"
grep -q "dropped 2 line(s) of .* after step 3" $TMP/b.log && pass metrics_resume_drops_the_superseded_lines ||
    fail metrics_resume_drops_the_superseded_lines "$(grep -i metrics $TMP/b.log)"
[ "$(grep -o '"step":[0-9]*' $TMP/run/m.jsonl | tr '\n' ' ')" = '"step":1 "step":2 "step":3 "step":4 "step":5 "step":6 ' ] &&
    pass metrics_steps_once_each_after_resume || fail metrics_steps_once_each_after_resume "$(cut -c1-12 $TMP/run/m.jsonl | tr '\n' ' ')"
python3 - $TMP/run/m.jsonl <<'EOT'
import json, sys, time
lines = [json.loads(l) for l in open(sys.argv[1])]
ok = all(l["samples_seen"] == 4 * l["step"] and l["tokens_seen"] == 128 * l["step"] for l in lines)
print("PASS metrics_samples_and_tokens_seen" if ok else f"FAIL metrics_samples_and_tokens_seen: {lines}")
now = time.time()
ok = all(now - 600 < l["time"] <= now and l["elapsed_s"] >= 0 for l in lines)
ok = ok and lines[4]["elapsed_s"] > lines[3]["elapsed_s"] and lines[3]["elapsed_s"] < lines[2]["elapsed_s"] + 600
print("PASS metrics_time_and_elapsed" if ok else f"FAIL metrics_time_and_elapsed: {[(l['time'], l['elapsed_s']) for l in lines]}")
EOT
[ "$(ls $TMP/run/tb | grep -c '^events.out.tfevents\.')" = 2 ] && pass tb_one_event_file_per_run ||
    fail tb_one_event_file_per_run "$(ls $TMP/run/tb)"
python3 test/tools/tb_check.py $TMP/run/tb $TMP/run/m.jsonl
# a MoE run's per-layer load is there too
sed -i 's/max_seq_len: 64}/max_seq_len: 64, moe: {num_experts: 4, top_k: 2, d_ff_expert: 32}}/' $TMP/tb.yaml
$UST train $TMP/tb.yaml --set train.steps=2 --set checkpoint.dir=$TMP/moe/ckpt \
    --set logging.metrics_file=$TMP/moe/m.jsonl --set logging.tensorboard_dir=$TMP/moe/tb >$TMP/c.log 2>&1 ||
    fail tb_moe_run "$(tail -2 $TMP/c.log)"
python3 - $TMP/moe/tb <<'EOT'
import sys
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1]); acc.Reload()
tags = acc.Tags()["scalars"]
ok = "moe/layer0/load_max" in tags and "moe/layer1/dropped" in tags
print("PASS tb_moe_load_per_layer" if ok else f"FAIL tb_moe_load_per_layer: tags {tags}")
EOT
# the cross-entropy apart from the MoE aux/z terms: ce_loss, and loss stays the total
python3 - $TMP/run/m.jsonl $TMP/moe/m.jsonl <<'EOT'
import json, sys
dense = [json.loads(l) for l in open(sys.argv[1])]
moe = [json.loads(l) for l in open(sys.argv[2])]
ok = dense and all("ce_loss" in l and l["ce_loss"] == l["loss"] for l in dense)
ok = ok and moe and all("ce_loss" in l and 0 < l["loss"] - l["ce_loss"] < 1 for l in moe)
print("PASS metrics_ce_loss_apart_from_the_moe_terms" if ok else
      f"FAIL metrics_ce_loss_apart_from_the_moe_terms: {[(l['loss'], l.get('ce_loss')) for l in dense + moe]}")
EOT
# MFU never above 100%: a peak measured low (a busy machine, simulated) is raised to the rate a
# step reached
UST_FAULT_PEAK_SCALE=0.001 $UST train $TMP/tb.yaml --set train.steps=2 --set checkpoint.dir=$TMP/mfu/ckpt \
    --set logging.metrics_file=$TMP/mfu/m.jsonl >$TMP/d.log 2>&1 || fail mfu_run "$(tail -2 $TMP/d.log)"
python3 - $TMP/mfu/m.jsonl $TMP/d.log <<'EOT'
import json, sys
mfu = [json.loads(l)["mfu"] for l in open(sys.argv[1])]
raised = "above the sgemm peak measured at start-up" in open(sys.argv[2]).read()
ok = raised and len(mfu) == 2 and all(0 < m <= 1 for m in mfu)
print("PASS mfu_never_above_100_percent" if ok else f"FAIL mfu_never_above_100_percent: mfu {mfu}, raised {raised}")
EOT
# A full disk under the metrics file and the event file (a 64 KiB tmpfs in a private mount
# namespace): the run goes on and says so once per file naming it and errno; logging.strict: true
# stops it with exit 1 (before: exit 0, lines missing, nothing said).
if unshare -m true 2>/dev/null; then
    full_run() { # full_run LOG EXTRA...: 150 steps logging into a fresh 64 KiB tmpfs at $TMP/full
        local log=$1; shift
        mkdir -p $TMP/full && rm -rf $TMP/fullck
        unshare -m bash -c 'mount -t tmpfs -o size=64k none "$0" && exec "$@"' $TMP/full \
            $UST train $TMP/tb.yaml --set train.steps=150 --set checkpoint.dir=$TMP/fullck --set checkpoint.every=1000 \
            --set logging.metrics_file=$TMP/full/m.jsonl --set logging.tensorboard_dir=$TMP/full/tb "$@" >$log 2>&1
    }
    full_run $TMP/full1.log; rc=$?
    nm=$(grep -c "warning: metrics file $TMP/full/m.jsonl: write failed: No space left on device" $TMP/full1.log)
    nt=$(grep -c "warning: TensorBoard event file $TMP/full/tb/.*: write failed: No space left on device" $TMP/full1.log)
    if [ $rc = 0 ] && [ "$nm" = 1 ] && [ "$nt" = 1 ] && grep -q "step  *150/150" $TMP/full1.log; then
        pass metrics_full_disk_warned_once_per_file
    else fail metrics_full_disk_warned_once_per_file "exit $rc, $nm/$nt warnings: $(grep -i 'warn\|error' $TMP/full1.log | head -2)"; fi
    full_run $TMP/full2.log --set logging.strict=true; rc=$?
    if [ $rc = 1 ] && grep -q "error: .*$TMP/full/.*: write failed: No space left on device (logging.strict: true)" $TMP/full2.log; then
        pass metrics_full_disk_strict_exits_1
    else fail metrics_full_disk_strict_exits_1 "exit $rc: $(tail -1 $TMP/full2.log)"; fi
    # dp=2: rank 0's failed write stops both ranks at that step's end, each saying why (before:
    # rank 0 exited alone and rank 1 waited in its next collective for dist.timeout_s)
    mkdir -p $TMP/full && rm -rf $TMP/fullck
    unshare -m bash -c 'mount -t tmpfs -o size=64k none "$0" && exec "$@"' $TMP/full \
        timeout -k 5 300 scripts/ustrun --nproc-per-node 2 $UST train $TMP/tb.yaml --set parallel.dp=2 \
        --set train.steps=150 --set checkpoint.dir=$TMP/fullck --set checkpoint.every=1000 --set dist.timeout_s=600 \
        --set logging.metrics_file=$TMP/full/m.jsonl --set logging.strict=true >$TMP/full3.log 2>&1; rc=$?
    if [ $rc = 1 ] && grep -q "stopping: rank 0 could not write its logs" $TMP/full3.log &&
        grep -q "write failed: No space left on device (logging.strict: true)" $TMP/full3.log; then
        pass metrics_full_disk_strict_stops_every_rank
    else fail metrics_full_disk_strict_stops_every_rank "exit $rc: $(grep -i 'error' $TMP/full3.log | head -3)"; fi
else
    pass "metrics_full_disk_warned_once_per_file (skipped: no private mount namespace)"
fi
expect_exit tb_dir_is_a_file_exits_2 2 "tensorboard_dir" -- \
    $UST train $TMP/tb.yaml --set checkpoint.dir=$TMP/x/ckpt --set logging.tensorboard_dir=$TMP/tb.yaml
exit 0
