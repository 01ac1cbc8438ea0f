#!/usr/bin/env bash
# Stability telemetry (logging.stats_every, core/train/train_stats.c, parallel/dp_stats.c): on
# every stats step each layer's gradient norm and update-to-weight ratio. The layers' gradient
# squares add up to the step's global norm; the update ratio equals the one read off two
# consecutive checkpoints (||w_s - w_s-1|| / ||w_s|| per layer); each layer's output RMS and largest
# attention logit equal a numpy forward of the step's samples on the previous checkpoint
# (test/tools/qkclip_ref.py stats) and reach TensorBoard; data-parallel ZeRO-2, tp2 with sp, cp2,
# 2-stage pipeline, dualpipev and tp2 full-recompute runs give the one-process figures; a planted
# gradient spike (UST_FAULT_LAYER_GRAD) is named with its layer, the one whose norm rose most over
# its mean; a planted output jump (UST_FAULT_LAYER_ACT) and logit jump (UST_FAULT_LAYER_LOGIT)
# are named with theirs by the same rule, on the step line, in the metrics and TensorBoard, the
# same under a 2-stage pipeline; bad settings exit 2.
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
sed -e "s#data/tiny/#$TMP/data/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml >$TMP/c.yaml
S="--set train.steps=6 --set logging.stats_every=2 --set data.val_every=100 --set train.seq_len=64"
$UST train $TMP/c.yaml $S --set checkpoint.every=1 --set checkpoint.keep_last=10 \
    --set logging.tensorboard_dir=$TMP/run/tb >$TMP/one.out 2>&1
rc=$?
python3 - $TMP/run/metrics.jsonl $TMP/run/ckpt >$TMP/check.out 2>&1 <<'EOT'
import json, math, re, sys
from safetensors.numpy import load_file
rows = {r["step"]: r for r in map(json.loads, open(sys.argv[1]))}
stats = [s for s, r in rows.items() if "layer_grad_norm" in r]
assert stats == [2, 4, 6], stats
for s in stats:
    r = rows[s]
    g = r["layer_grad_norm"]
    assert len(g) == 5 and len(r["layer_update_ratio"]) == 5, r
    tot = math.sqrt(sum(x * x for x in g))
    assert abs(tot - r["grad_norm"]) <= 1e-5 * r["grad_norm"], (s, tot, r["grad_norm"])
print("ok layer_norms_add_up_to_the_global_norm")
def group(name):
    m = re.search(r"\.(\d+)\.", name)
    return int(m.group(1)) if m else 4
def by_layer(step):
    w = load_file("%s/step_%d/model.safetensors" % (sys.argv[2], step))
    return {k: v.astype("float64") for k, v in w.items()}
worst = 0
for s in (4, 6):
    a, b = by_layer(s - 1), by_layer(s)
    for l in range(5):
        du = sum(((b[k] - a[k]) ** 2).sum() for k in b if group(k) == l)
        ww = sum((b[k] ** 2).sum() for k in b if group(k) == l)
        want, got = math.sqrt(du / ww), rows[s]["layer_update_ratio"][l]
        worst = max(worst, abs(got - want) / want)
assert worst < 1e-3, worst
print("ok update_ratio_equals_the_checkpoints", worst)
EOT
cat $TMP/check.out | sed 's/^/  /'
for t in layer_norms_add_up_to_the_global_norm update_ratio_equals_the_checkpoints; do
    [ $rc = 0 ] && grep -q "^ok $t" $TMP/check.out && pass stats_$t || fail stats_$t "rc=$rc $(tail -2 $TMP/check.out) $(tail -1 $TMP/one.out)"
done
# activation RMS and max logit against a numpy forward: step s trains samples 8(s-1)..8s-1 (global
# batch 8) with step s-1's weights
SHARD=$(ls $TMP/data/train_*.bin | head -1)
for s in 2 4 6; do
    python3 test/tools/qkclip_ref.py stats $TMP/run/ckpt/step_$((s - 1)) $SHARD $((8 * (s - 1))) 8 \
        $TMP/run/metrics.jsonl $s >$TMP/ref$s.out 2>&1
    [ $rc = 0 ] && grep -q "^PASS" $TMP/ref$s.out && pass "stats_act_rms_and_max_logit_match_numpy_step$s $(cut -c6- $TMP/ref$s.out)" ||
        fail stats_act_rms_and_max_logit_match_numpy_step$s "rc=$rc $(tail -2 $TMP/ref$s.out)"
done
python3 - $TMP/run/tb $TMP/run/metrics.jsonl >$TMP/tb.check 2>&1 <<'EOT'
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
rows = [r for r in map(json.loads, open(sys.argv[2])) if "layer_act_rms" in r]
n = 0
for l in range(4):
    for key, tag in (("layer_act_rms", "act_rms"), ("layer_max_logit", "max_logit")):
        got = {e.step: e.value for e in acc.Scalars(f"layers/{l}/{tag}")}
        for r in rows:
            # the JSON keeps 6 digits
            assert abs(got[r["step"]] - r[key][l]) <= 1e-5 * abs(r[key][l]), (l, tag, got, r[key])
            n += 1
print("ok", n)
EOT
[ $rc = 0 ] && grep -q "^ok 24" $TMP/tb.check && pass stats_act_rms_and_max_logit_in_tensorboard ||
    fail stats_act_rms_and_max_logit_in_tensorboard "$(tail -2 $TMP/tb.check)"
mv $TMP/run/metrics.jsonl $TMP/one.jsonl

# the same figures from other layouts: dp = 2 under ZeRO-2, tp = 2 with sp, cp = 2, a 2-stage
# pipeline and dualpipev (each holds a part of the tokens or of the layers, or the mirror's
# micro-batches: the sums go over every rank), and tp = 2 with full recompute (replicated rows and
# the backward's rerun of each forward counted once)
L="--set checkpoint.every=0 --set checkpoint.resume=none"
for lay in "dp2_zero2:--set parallel.dp=2 --set optimizer.zero_stage=2" "pp2:--set parallel.pp=2" \
    "tp2_sp:--set parallel.tp=2 --set parallel.sp=true" "cp2:--set parallel.cp=2" \
    "tp2_recompute_full:--set parallel.tp=2 --set train.recompute=full" \
    "dualpipev:--set parallel.pp=2 --set parallel.vpp=2 --set parallel.pp_schedule=dualpipev --set train.micro_batch_size=2"; do
    name=${lay%%:*}
    rm -rf $TMP/run
    scripts/ustrun --nproc-per-node 2 $UST train $TMP/c.yaml $S $L ${lay#*:} >$TMP/$name.out 2>&1
    rc=$?
    python3 - $TMP/one.jsonl $TMP/run/metrics.jsonl >$TMP/$name.check 2>&1 <<'EOT'
import json, sys
a, b = ({r["step"]: r for r in map(json.loads, open(p)) if "layer_grad_norm" in r} for p in sys.argv[1:])
assert sorted(a) == sorted(b) == [2, 4, 6], (sorted(a), sorted(b))
for s in a:
    for k in ("layer_grad_norm", "layer_update_ratio", "layer_act_rms", "layer_max_logit"):
        assert len(a[s][k]) == len(b[s][k]), (s, k, a[s][k], b[s][k])
        for x, y in zip(a[s][k], b[s][k]):
            assert abs(x - y) <= 1e-4 * abs(x), (s, k, a[s][k], b[s][k])
print("ok")
EOT
    [ $rc = 0 ] && grep -q "^ok" $TMP/$name.check && pass stats_${name}_equals_one_process ||
        fail stats_${name}_equals_one_process "rc=$rc $(tail -2 $TMP/$name.check) $(tail -1 $TMP/$name.out)"
done

# a planted spike: layer 2's gradients x30 at step 5 (UST_FAULT_LAYER_GRAD); its stats step
# names layer 2, the layer whose gradient norm rose most over its mean at steps 1..4, with the
# ratio the metrics carry
rm -rf $TMP/run
UST_FAULT_LAYER_GRAD=5:2:30 $UST train $TMP/c.yaml $L --set train.steps=5 --set logging.stats_every=1 \
    --set logging.stats_spike=2 --set data.val_every=100 --set train.seq_len=64 \
    --set logging.tensorboard_dir=$TMP/run/tb >$TMP/spike.out 2>&1
rc=$?
python3 - $TMP/run/metrics.jsonl $TMP/run/tb >$TMP/spike.check 2>&1 <<'EOT'
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[2], size_guidance={"scalars": 0})
acc.Reload()
rows = [json.loads(l) for l in open(sys.argv[1])]
tags = [t for t in acc.Tags()["scalars"] if t.endswith("grad_norm_spike")]
assert tags == ["layers/%d/grad_norm_spike" % rows[4]["layer_spike"]], tags
assert [(e.step, round(e.value, 3)) for e in acc.Scalars(tags[0])] == [(5, round(rows[4]["layer_spike_ratio"], 3))]
assert [r["step"] for r in rows] == [1, 2, 3, 4, 5], [r["step"] for r in rows]
assert all("layer_spike" not in r for r in rows[:4]), rows[:4]
means = [sum(r["layer_grad_norm"][g] for r in rows[:4]) / 4 for g in range(5)]
ratios = [rows[4]["layer_grad_norm"][g] / means[g] for g in range(5)]
best = max(range(5), key=lambda g: ratios[g])
assert best == 2 and ratios[best] > 2 and rows[4]["layer_spike"] == best, (ratios, rows[4].get("layer_spike"))
assert abs(rows[4]["layer_spike_ratio"] - ratios[best]) < 1e-3 * ratios[best], (rows[4]["layer_spike_ratio"], ratios)
print("ok", best, "%.2f" % ratios[best])
EOT
best=$(awk '/^ok/ {print $2}' $TMP/spike.check)
where="layer $best"
[ "$best" = 4 ] && where="the embeddings/head"
[ $rc = 0 ] && grep -q "^ok" $TMP/spike.check && grep -q "warning: step 5: gradient spike in $where: norm" $TMP/spike.out &&
    grep -q "^step     5/5 .*| grad spike in ${where#the } x" $TMP/spike.out &&
    pass stats_planted_spike_names_its_layer || fail stats_planted_spike_names_its_layer "rc=$rc $(tail -2 $TMP/spike.check) $(grep -E 'spike|error' $TMP/spike.out | head -3)"

# the same rule for the outputs' RMS and the largest logits: layer 2's output projections and
# layer 3's query projection x30 before step 5's forward (UST_FAULT_LAYER_ACT, _LOGIT); step 5
# names layer 2, whose RMS rose most over its mean at steps 1..4 (x41; the residual stream
# carries the jump on to layer 3, x31), and layer 3, whose largest logit rose most (x30); no step
# before it (the early steps' RMS grows up to 3x: logging.stats_spike 5); TensorBoard has the rises
# under those layers; a 2-stage pipeline (layers 2 and 3 on rank 1) names the same
F="--set train.steps=5 --set logging.stats_every=1 --set logging.stats_spike=5 --set data.val_every=100 --set train.seq_len=64"
for lay in one "pp2:--set parallel.pp=2"; do
    rm -rf $TMP/run
    if [ "$lay" = one ]; then
        UST_FAULT_LAYER_ACT=5:2:30 UST_FAULT_LAYER_LOGIT=5:3:30 $UST train $TMP/c.yaml $L $F \
            --set logging.tensorboard_dir=$TMP/run/tb >$TMP/act.out 2>&1
    else
        UST_FAULT_LAYER_ACT=5:2:30 UST_FAULT_LAYER_LOGIT=5:3:30 scripts/ustrun --nproc-per-node 2 \
            $UST train $TMP/c.yaml $L $F ${lay#*:} >$TMP/act.out 2>&1
    fi
    rc=$?
    sed -i 's/^\[rank 0\] //' $TMP/act.out
    cp $TMP/run/metrics.jsonl $TMP/act_${lay%%:*}.jsonl
    python3 - $TMP/run/metrics.jsonl $TMP/run/tb $TMP/act_one.jsonl >$TMP/act.check 2>&1 <<'EOT'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == [1, 2, 3, 4, 5], [r["step"] for r in rows]
keys = ("layer_act_spike", "layer_logit_spike")
assert all(k not in r for r in rows[:4] for k in keys), [{k: r.get(k) for k in keys} for r in rows[:4]]
ratio = {}
for key in ("layer_act_rms", "layer_max_logit"):
    means = [sum(r[key][l] for r in rows[:4]) / 4 for l in range(4)]
    ratio[key] = [rows[4][key][l] / means[l] for l in range(4)]
act = max(range(4), key=lambda l: ratio["layer_act_rms"][l])
logit = max(range(4), key=lambda l: ratio["layer_max_logit"][l])
got = {k: (rows[4].get(k), rows[4].get(k + "_ratio")) for k in keys}
assert (act, logit) == (2, 3) and min(ratio["layer_act_rms"][2], ratio["layer_max_logit"][3]) > 5, ratio
for k, l, r in zip(keys, (act, logit), (ratio["layer_act_rms"][act], ratio["layer_max_logit"][logit])):
    assert got[k][0] == l and abs(got[k][1] - r) < 1e-3 * r, (k, got[k], l, r)
if os.path.isdir(sys.argv[2]):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(sys.argv[2], size_guidance={"scalars": 0})
    acc.Reload()
    tags = sorted(t for t in acc.Tags()["scalars"] if t.endswith("_spike"))
    assert tags == ["layers/2/act_rms_spike", "layers/3/max_logit_spike"], tags
    for tag, k in zip(tags, keys):
        pts = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert len(pts) == 1 and pts[0][0] == 5 and abs(pts[0][1] - got[k][1]) < 1e-3 * got[k][1], (tag, pts)
else:  # the pipeline: the one-process figures
    one = json.loads(open(sys.argv[3]).readlines()[4])
    for k in keys:
        assert one[k] == got[k][0] and abs(one[k + "_ratio"] - got[k][1]) < 1e-3 * got[k][1], (k, one[k + "_ratio"], got[k])
print("ok %.1f %.1f" % (got[keys[0]][1], got[keys[1]][1]))
EOT
    name=stats_planted_act_and_logit_spikes_name_their_layers
    [ "$lay" = one ] || name=stats_planted_act_and_logit_spikes_pp2_equal_one_process
    [ $rc = 0 ] && grep -q "^ok" $TMP/act.check &&
        grep -q "warning: step 5: activation spike in layer 2: output RMS .* times its mean over the 4 earlier" $TMP/act.out &&
        grep -q "warning: step 5: attention logit spike in layer 3: max logit .* times its mean over the 4 earlier" $TMP/act.out &&
        grep -q "^step     5/5 .*| act spike in layer 2 x[0-9.]* | logit spike in layer 3 x" $TMP/act.out &&
        pass "$name ($(cut -c4- $TMP/act.check))" || fail $name "rc=$rc $(tail -2 $TMP/act.check) $(grep -E 'spike|error' $TMP/act.out | head -3)"
done
# a normal run flags nothing (the first run: the default logging.stats_spike 10)
! grep -q "spike" $TMP/one.jsonl && ! grep -q "spike" $TMP/one.out && pass stats_no_spike_in_a_normal_run ||
    fail stats_no_spike_in_a_normal_run "$(grep -o '"layer[a-z_]*spike[a-z_]*":[0-9.]*' $TMP/one.jsonl | head -3)"

# bad settings: exit 2 before work, naming the key and where it is
sed 's/^logging:    {every: 1,/logging:    {every: 1, stats_every: -1,/' $TMP/c.yaml >$TMP/bad.yaml
expect_exit stats_every_negative_exit_2 2 "bad.yaml:[0-9]+:[0-9]+: logging.stats_every" -- $UST validate $TMP/bad.yaml
sed 's/^logging:    {every: 1,/logging:    {every: 1, stats_spike: 0.5,/' $TMP/c.yaml >$TMP/bad2.yaml
expect_exit stats_spike_below_1_exit_2 2 "bad2.yaml:[0-9]+:[0-9]+: logging.stats_spike" -- $UST validate $TMP/bad2.yaml
exit 0
