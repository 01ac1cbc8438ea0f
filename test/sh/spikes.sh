#!/usr/bin/env bash
# Loss and gradient spikes (train.on_spike with llm.c's z-score detector): a poisoned micro-batch
# (test fault UST_FAULT_SPIKE_STEP) is found; `skip` leaves that step's weights and moments
# untouched (the checkpoints before and after it are byte-identical, which fails without the
# mechanism), `rewind` goes back to the last checkpoint and continues with the data after the
# spike; a normal run finds none; a z-score <= 0 exits 2.
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
cat >$TMP/c.yaml <<EOT
run:   {name: spikes, seed: 7}
model: {arch: llama, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 2, d_ff: 96, vocab_size: 300, max_seq_len: 64}
train: {steps: 20, seq_len: 32, micro_batch_size: 2, global_batch_size: 4}
optimizer: {lr: 3.0e-3, warmup_steps: 2, min_lr: 3.0e-3}
data:  {train: "$TMP/data/train_*.bin", val: null}
checkpoint: {dir: $TMP/base/ckpt, every: 20}
logging: {metrics_file: $TMP/base/m.jsonl}
EOT
# a model that predicts something (a poisoned batch's loss stands out), then slow steady steps
$UST train $TMP/c.yaml >$TMP/base.log 2>&1 || fail spikes_base_training "$(tail -2 $TMP/base.log)"
S="--set train.steps=32 --set optimizer.lr=1e-5 --set optimizer.min_lr=1e-5 --set train.spike_window=6 --set train.spike_zscore=6"
run() { # run TAG SETS...: resumes the base run under TAG
    rm -rf $TMP/$1
    cp -r $TMP/base $TMP/$1
    local tag=$1; shift
    $UST train $TMP/c.yaml --set checkpoint.dir=$TMP/$tag/ckpt --set logging.metrics_file=$TMP/$tag/m.jsonl $S "$@" >$TMP/$tag.log 2>&1
}
# same_tensors A B: two checkpoint files hold the same tensors, byte for byte (the headers' own
# __metadata__ names each file's step, so files of two steps never compare equal whole)
same_tensors() {
    python3 - "$1" "$2" <<'PYEOF2'
import json, struct, sys
def body(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return h, b[8 + n:]
sys.exit(0 if body(sys.argv[1]) == body(sys.argv[2]) else 1)
PYEOF2
}
run calm --set train.on_spike=skip --set checkpoint.every=1
! grep -q "spike at step" $TMP/calm.log && pass spike_none_in_a_normal_run || fail spike_none_in_a_normal_run "$(grep spike $TMP/calm.log)"
UST_FAULT_SPIKE_STEP=29 run skip --set train.on_spike=skip --set checkpoint.every=1 --set checkpoint.keep_last=0
grep -q "spike at step 29: .* samples \[112, 116)" $TMP/skip.log && pass spike_found_with_its_sample_range ||
    fail spike_found_with_its_sample_range "$(grep -i spike $TMP/skip.log | head -2)"
same_tensors $TMP/skip/ckpt/step_28/model.safetensors $TMP/skip/ckpt/step_29/model.safetensors &&
    same_tensors $TMP/skip/ckpt/step_28/optimizer.safetensors $TMP/skip/ckpt/step_29/optimizer.safetensors &&
    ! same_tensors $TMP/skip/ckpt/step_29/model.safetensors $TMP/skip/ckpt/step_30/model.safetensors &&
    pass spike_skip_leaves_the_step_without_an_update || fail spike_skip_leaves_the_step_without_an_update "checkpoints 28/29/30"
grep -q '"step":29,.*"spike":"skipped"' $TMP/skip/m.jsonl && pass spike_marked_in_metrics || fail spike_marked_in_metrics "$(grep '"step":29' $TMP/skip/m.jsonl | cut -c1-80)"
UST_FAULT_SPIKE_STEP=29 run nomech --set train.on_spike=none --set checkpoint.every=1 --set checkpoint.keep_last=0
! same_tensors $TMP/nomech/ckpt/step_28/model.safetensors $TMP/nomech/ckpt/step_29/model.safetensors &&
    pass spike_without_the_mechanism_updates || fail spike_without_the_mechanism_updates "step 29 made no update"
# rewind: back to the last checkpoint (step 28), on with the data after the spike's window
UST_FAULT_SPIKE_STEP=29 run rewind --set train.on_spike=rewind --set checkpoint.every=4
grep -q "spike: rewound to .*step_28 (step 28); the data goes on from sample 116" $TMP/rewind.log &&
    pass spike_rewind_reloads_the_last_checkpoint || fail spike_rewind_reloads_the_last_checkpoint "$(grep -i spike $TMP/rewind.log)"
python3 - $TMP/rewind/ckpt/step_32/state.json <<'EOT'
import json, sys
s = json.load(open(sys.argv[1]))
# steps 29..32 after the rewind read samples 116..132: one global batch (4) past step x 4
ok = s["step"] == 32 and s["sample_index"] == 132 and s["batch_since"]["step"] == 28 and s["batch_since"]["sample_index"] == 116
print("PASS spike_rewind_skips_the_spike_data" if ok else f"FAIL spike_rewind_skips_the_spike_data: {s['step']} {s['sample_index']} {s['batch_since']}")
EOT
# every step from 29 on spikes (UST_FAULT_SPIKE_STEP=29+ poisons all data from step 29's on):
# each rewind to step_28 goes on with new data (never the spike's samples again) and spikes again;
# the fourth rewind in a row is more than train.max_rewinds (3): exit 1 naming the step, never a
# loop that rewinds forever
UST_FAULT_SPIKE_STEP=29+ timeout -k 5 120 bash -c "$(declare -f run); TMP=$TMP UST=$UST S='$S' run endless --set train.on_spike=rewind --set checkpoint.every=4"
rc=$?
n=$(grep -c "spike: rewound to .*step_28 (step 28)" $TMP/endless.log)
if [ $rc = 1 ] && [ "$n" = 3 ] && grep -q "error: .*spike at step 29: rewind 4 to .*step_28 (step 28) in a row is more than train.max_rewinds = 3" $TMP/endless.log &&
    [ "$(grep -o 'samples \[[0-9]*' $TMP/endless.log | sort | uniq -d)" = "" ]; then
    pass spike_rewinds_are_bounded_and_skip_the_data
else fail spike_rewinds_are_bounded_and_skip_the_data "exit $rc, $n rewinds: $(grep -i 'spike\|error' $TMP/endless.log | tail -2)"; fi
UST_FAULT_SPIKE_STEP=29+ timeout -k 5 120 bash -c "$(declare -f run); TMP=$TMP UST=$UST S='$S' run endless0 --set train.on_spike=rewind --set checkpoint.every=4 --set train.max_rewinds=0"
rc=$?
[ $rc = 1 ] && grep -q "rewind 1 to .* more than train.max_rewinds = 0" $TMP/endless0.log && pass spike_max_rewinds_zero_stops_at_the_first ||
    fail spike_max_rewinds_zero_stops_at_the_first "exit $rc: $(tail -1 $TMP/endless0.log)"
# the same decision on every rank: a dp=2 run skips the same step
rm -rf $TMP/dp2 && cp -r $TMP/base $TMP/dp2
UST_FAULT_SPIKE_STEP=29 scripts/ustrun --nproc-per-node 2 $UST train $TMP/c.yaml --set parallel.dp=2 \
    --set checkpoint.dir=$TMP/dp2/ckpt --set logging.metrics_file=$TMP/dp2/m.jsonl $S --set train.on_spike=skip >$TMP/dp2.log 2>&1
grep -q "spike at step 29" $TMP/dp2.log && grep -q '"step":29,.*"spike":"skipped"' $TMP/dp2/m.jsonl &&
    pass spike_decision_is_global || fail spike_decision_is_global "$(tail -3 $TMP/dp2.log)"
expect_exit spike_zscore_zero_exits_2 2 "train.spike_zscore" -- $UST validate $TMP/c.yaml --set train.spike_zscore=0
expect_exit spike_window_one_exits_2 2 "train.spike_window" -- $UST validate $TMP/c.yaml --set train.spike_window=1
exit 0
