#!/usr/bin/env bash
# Weighted dataset blends (data.train as a list): the realised proportions follow the weights
# within one sample at every step; dp=2 and a resume mid-blend train the one-process model (the
# equivalence harness); a changed blend on resume is refused unless data.allow_reweight, which
# starts the new weights at the resume point; a dataset that runs out starts a new epoch (logged);
# per-entry formats; a blend entry without files exits 2 naming it.
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/a >/dev/null
mkdir -p $TMP/b $TMP/c
python3 - $TMP <<'EOT'
import random, struct, sys
d = sys.argv[1]
random.seed(3)
def llmc(path, toks):
    h = [20240520, 1, len(toks)] + [0] * 253
    open(path, "wb").write(struct.pack("<256i", *h) + struct.pack(f"<{len(toks)}H", *toks))
llmc(f"{d}/b/train_000.bin", [random.randrange(0, 300) for _ in range(20000)])
# nanoGPT raw uint16: a small dataset that runs out (3 windows of 33 tokens per epoch)
open(f"{d}/c/train.bin", "wb").write(struct.pack("<100H", *[random.randrange(200, 300) for _ in range(100)]))
EOT
cat >$TMP/blend.yaml <<EOT
run:   {name: blend, seed: 7}
model: {arch: llama, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 2, d_ff: 96, vocab_size: 300, max_seq_len: 64}
train: {steps: 10, seq_len: 32, micro_batch_size: 2, global_batch_size: 4}
optimizer: {lr: 3.0e-3, warmup_steps: 2}
data:
  train:
    - {path: "$TMP/a/train_*.bin", weight: 0.5}
    - {path: "$TMP/b/train_*.bin", weight: 3}
    - {path: "$TMP/c/train.bin", weight: 2, format: nanogpt}
  val: null
  shuffle: true
checkpoint: {dir: $TMP/run/ckpt, every: 4, keep_last: 0}
logging: {metrics_file: $TMP/run/m.jsonl}
EOT
if ! $UST train $TMP/blend.yaml >$TMP/run.log 2>&1; then
    fail blend_trains "$(tail -3 $TMP/run.log)"
    exit 0
fi
# within one sample of w_d * N after every step (weights 0.5 : 3 : 2 normalized)
python3 - $TMP/run/m.jsonl <<'EOT'
import json, sys
w = [0.5 / 5.5, 3 / 5.5, 2 / 5.5]
bad = []
for l in map(json.loads, open(sys.argv[1])):
    n = l["samples_seen"]
    got = l["data_samples"]
    if sum(got) != n or any(abs(g - wd * n) > 1 for g, wd in zip(got, w)):
        bad.append((l["step"], got, [round(wd * n, 2) for wd in w]))
print("PASS blend_proportions_within_one_sample" if not bad else f"FAIL blend_proportions_within_one_sample: {bad}")
EOT
grep -q "data: dataset 2 (.*c/train.bin) starts epoch 2 at step" $TMP/run.log && pass blend_epoch_of_an_exhausted_dataset_logged ||
    fail blend_epoch_of_an_exhausted_dataset_logged "$(grep epoch $TMP/run.log | head -2)"
python3 -c "
import json; s = json.load(open('$TMP/run/ckpt/step_8/state.json'))['data']
ok = [d['consumed'] for d in s['datasets']] and sum(d['consumed'] for d in s['datasets']) == 32 and s['base_sample'] == 0
print('PASS blend_position_in_state_json' if ok else f'FAIL blend_position_in_state_json: {s}')"

# the equivalence harness: dp=2 (with ZeRO-1), and resumes mid-blend under other layouts
EQ="python3 test/tools/equiv.py --steps 8"
$EQ --name _blend --config $TMP/blend.yaml --layout "dp=2" --layout "dp=2 zero=1 mb=1" --layout "tp=2"
$EQ --name _blend --config $TMP/blend.yaml --save-layout "dp=2" --resume-at 4 --layout "dp=1" --layout "pp=2"

# a changed blend on resume: refused, or (allow_reweight) the new weights from the resume point
sed -e 's/weight: 3}/weight: 1}/' $TMP/blend.yaml >$TMP/reweight.yaml
expect_exit blend_changed_weights_refused 2 "not the blend the checkpoint was trained with \(dataset 1 \(.*\) weight 1, was 3\).*allow_reweight" -- \
    $UST train $TMP/reweight.yaml --set checkpoint.resume=$TMP/run/ckpt/step_4 --set train.steps=12
cp -r $TMP/run $TMP/rw
sed -i "s#$TMP/run/#$TMP/rw/#" $TMP/reweight.yaml
expect_exit blend_reweight_allowed 0 "the new weights start at sample 16" -- \
    $UST train $TMP/reweight.yaml --set checkpoint.resume=$TMP/rw/ckpt/step_4 --set train.steps=12 --set data.allow_reweight=true
python3 - $TMP/rw/m.jsonl <<'EOT'
import json, sys
lines = {l["step"]: l for l in map(json.loads, open(sys.argv[1]))}
base = lines[4]["data_samples"]
w = [0.5 / 3.5, 1 / 3.5, 2 / 3.5]
bad = []
for s in range(5, 13):
    got = [g - b for g, b in zip(lines[s]["data_samples"], base)]
    n = 4 * (s - 4)
    if any(abs(g - wd * n) > 1 for g, wd in zip(got, w)):
        bad.append((s, got))
print("PASS blend_reweight_follows_new_weights_from_resume" if not bad else f"FAIL blend_reweight_follows_new_weights_from_resume: {bad}")
EOT
# data.val takes a list too
expect_exit blend_val_list_gives_val_loss 0 "val [0-9]" -- $UST train $TMP/blend.yaml --set train.steps=2 \
    --set checkpoint.dir=$TMP/v/ckpt --set logging.metrics_file=$TMP/v/m.jsonl --set data.val_every=2 \
    --set "data.val=[{path: \"$TMP/a/val_*.bin\", weight: 1}, {path: \"$TMP/b/train_*.bin\", weight: 1}]"
sed -e "s#$TMP/b/train_\*.bin#$TMP/nothing/*.bin#" $TMP/blend.yaml >$TMP/missing.yaml
expect_exit blend_entry_without_files_exits_2 2 "dataset 1 of the blend \($TMP/nothing/\*.bin\)" -- \
    $UST train $TMP/missing.yaml --set checkpoint.dir=$TMP/m/ckpt
# weights near the largest double: their sum overflows unless normalised by the largest first
# (1e308 : 1e308 : 1e307 is 19 : 19 : 2 of 40 samples); the smallest subnormal is positive
sed -e 's/weight: 0.5}/weight: 1e308}/' -e 's/weight: 3}/weight: 1e308}/' -e 's/weight: 2,/weight: 1e307,/' \
    $TMP/blend.yaml >$TMP/huge.yaml
$UST train $TMP/huge.yaml --set checkpoint.dir=$TMP/h/ckpt --set checkpoint.every=0 \
    --set logging.metrics_file=$TMP/h/m.jsonl >$TMP/h.log 2>&1
got=$(tail -1 $TMP/h/m.jsonl 2>/dev/null | python3 -c "import json, sys; print(json.load(sys.stdin)['data_samples'])" 2>/dev/null)
[ "$got" = "[19, 19, 2]" ] && pass blend_huge_weights_keep_their_proportions ||
    fail blend_huge_weights_keep_their_proportions "data_samples $got after 40 samples, want [19, 19, 2]: $(tail -1 $TMP/h.log)"
expect_exit blend_subnormal_weight_accepted 0 "valid" -- $UST validate $TMP/blend.yaml \
    --set "data.train=[{path: \"$TMP/a/train_*.bin\", weight: 5e-324}, {path: \"$TMP/b/train_*.bin\", weight: 1}]"
expect_exit blend_weight_overflowing_a_double_exits_2 2 "data.train\[0\].weight: expected a positive number, got '1e309'" -- \
    $UST validate $TMP/blend.yaml --set "data.train=[{path: x, weight: 1e309}]"
expect_exit blend_negative_weight_exits_2 2 "data.train\[0\].weight: expected a positive number, got '-1'" -- \
    $UST validate $TMP/blend.yaml --set "data.train=[{path: x, weight: -1}]"
exit 0
