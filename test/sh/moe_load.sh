#!/usr/bin/env bash
# MoE load per layer (metrics "moe": tokens per expert, the overload factor max/mean; TensorBoard
# moe/layerN/overload) and scripts/plot --moe's heat map. A planted imbalance: a shard of one
# repeated token gives every position the same input to every MoE layer (the attention of
# identical values is that value), so all tokens take the same top-2 of 8 experts: overload
# exactly 8/2 = 4 in every layer, against well under 4 on the demo text.
. "$(dirname "$0")/../lib.sh"

$UST data demo $TMP/data >/dev/null
mkdir -p $TMP/flat
cp $TMP/data/meta.json $TMP/flat/
python3 - $TMP/flat <<'EOT'
import sys
import numpy as np
for name in ("train_000.bin", "val_000.bin"):
    h = np.zeros(256, dtype=np.int32)
    h[:3] = (20240520, 1, 100000)
    with open(f"{sys.argv[1]}/{name}", "wb") as f:
        f.write(h.tobytes())
        f.write(np.full(100000, 65, dtype=np.uint16).tobytes())
EOT
sed -e "s#data/tiny/#$TMP/data/#g" -e "s#runs/tiny#$TMP/run#g" configs/tiny.yaml |
    sed 's/init_from: null}/init_from: null, moe: {num_experts: 8, top_k: 2, d_ff_expert: 32}}/' >$TMP/c.yaml
C="--set train.steps=3 --set checkpoint.every=0 --set train.seq_len=64 --set data.val_every=100"
$UST train $TMP/c.yaml $C --set logging.tensorboard_dir=$TMP/tb >$TMP/text.out 2>&1 || fail moe_text_run "$(tail -2 $TMP/text.out)"
mv $TMP/run $TMP/text
$UST train $TMP/c.yaml $C --set "data.train=$TMP/flat/train_*.bin" --set "data.val=$TMP/flat/val_*.bin" >$TMP/flat.out 2>&1 ||
    fail moe_flat_run "$(tail -2 $TMP/flat.out)"
python3 - $TMP/text/metrics.jsonl $TMP/run/metrics.jsonl >$TMP/check.out 2>&1 <<'EOT'
import json, sys
text = [json.loads(l) for l in open(sys.argv[1])]
flat = [json.loads(l) for l in open(sys.argv[2])]
for rows, planted in ((text, False), (flat, True)):
    for r in rows:
        assert len(r["moe"]) == 4, r["moe"]
        for m in r["moe"]:
            e = m["experts"]
            # every token of the global batch routed twice: 8 x 64 tokens x top-2
            assert len(e) == 8 and sum(e) == 8 * 64 * 2, (r["step"], m)
            over = max(e) / (sum(e) / 8)
            assert abs(m["overload"] - over) < 1e-4, m
            if planted:
                assert m["overload"] == 4 and sorted(e)[-2:] == [512, 512], m
            else:  # an untrained router is uneven too (a layer may even send all to two)
                assert m["overload"] <= 4, m
mean = sum(m["overload"] for r in text for m in r["moe"]) / sum(len(r["moe"]) for r in text)
assert mean < 3.5, mean
print("ok")
EOT
grep -q "^ok" $TMP/check.out && pass moe_planted_imbalance_shows_in_the_overload_factor ||
    fail moe_planted_imbalance_shows_in_the_overload_factor "$(tail -2 $TMP/check.out)"
python3 - $TMP/tb >$TMP/tb.out 2>&1 <<'EOT'
import sys
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1]); acc.Reload()
tags = acc.Tags()["scalars"]
miss = [t for t in ("moe/layer%d/overload" % l for l in range(4)) if t not in tags]
print("missing", miss) if miss else print("ok")
EOT
grep -q "^ok" $TMP/tb.out && pass moe_overload_in_tensorboard || fail moe_overload_in_tensorboard "$(tail -1 $TMP/tb.out)"
out=$(scripts/plot -o $TMP/plots --moe $TMP/run/metrics.jsonl 2>&1)
rc=$?
[ $rc = 0 ] && echo "$out" | grep -q "moe_load.png: 4 MoE layers x 8 experts, 3 steps" &&
    echo "$out" | grep -q "layer 3: overload last 4.000, max 4.000" &&
    python3 -c "import matplotlib.image as m, sys; assert m.imread(sys.argv[1]).shape[1] > 600" $TMP/plots/moe_load.png &&
    pass plot_moe_heat_map || fail plot_moe_heat_map "rc=$rc $out"
# the aux-loss-free bias range: on the planted imbalance each step's update moves the 2 busy
# experts' biases by -rate and the 6 idle ones' by +rate, so after step 1 the range is exactly
# 2 x rate, and after step s at most 2 x s x rate; without a bias it is null
rm -rf $TMP/run
$UST train $TMP/c.yaml $C --set "data.train=$TMP/flat/train_*.bin" --set "data.val=$TMP/flat/val_*.bin" \
    --set model.moe.bias_update_rate=0.01 --set logging.tensorboard_dir=$TMP/tbb --set checkpoint.resume=none >$TMP/bias.out 2>&1
rc=$?
python3 - $TMP/run/metrics.jsonl $TMP/text/metrics.jsonl $TMP/tbb >$TMP/bias_check.out 2>&1 <<'EOT'
import json, sys
from tensorboard.backend.event_processing import event_accumulator as ea
rows = [json.loads(l) for l in open(sys.argv[1]) if '"moe"' in l]
assert [r["step"] for r in rows] == [1, 2, 3], [r["step"] for r in rows]
for r in rows:
    for m in r["moe"]:
        b = m["bias_range"]
        assert b is not None and 0 < b <= 0.02 * r["step"] + 1e-6, (r["step"], m)
        if r["step"] == 1:
            assert abs(b - 0.02) < 1e-6, m
for l in open(sys.argv[2]):
    for m in json.loads(l).get("moe", []):
        assert m["bias_range"] is None, m
acc = ea.EventAccumulator(sys.argv[3]); acc.Reload()
assert "moe/layer3/bias_range" in acc.Tags()["scalars"], acc.Tags()["scalars"]
print("ok")
EOT
[ $rc = 0 ] && grep -q "^ok" $TMP/bias_check.out && pass moe_bias_range_in_metrics_and_tensorboard ||
    fail moe_bias_range_in_metrics_and_tensorboard "rc=$rc $(tail -2 $TMP/bias_check.out) $(tail -1 $TMP/bias.out)"
# under ZeRO-3 each rank holds a shard of the bias: the range is made from the whole tensor (the
# shards summed over the group), the one-process figure at every step (the demo text: ranges
# that differ by layer and step)
B="--set model.moe.bias_update_rate=0.01 --set checkpoint.resume=none"
rm -rf $TMP/run
$UST train $TMP/c.yaml $C $B >$TMP/b1.out 2>&1 && mv $TMP/run/metrics.jsonl $TMP/b1.jsonl
scripts/ustrun --nproc-per-node 2 $UST train $TMP/c.yaml $C $B --set parallel.dp=2 \
    --set optimizer.zero_stage=3 >$TMP/b3.out 2>&1
rc=$?
python3 - $TMP/b1.jsonl $TMP/run/metrics.jsonl >$TMP/b3.check 2>&1 <<'EOT'
import json, sys
a, b = ([[m["bias_range"] for m in json.loads(l)["moe"]] for l in open(p)] for p in sys.argv[1:])
assert len(a) == len(b) == 3 and len(set(x for r in a for x in r)) > 1, (a, b)
assert all(abs(x - y) < 1e-6 for r, s in zip(a, b) for x, y in zip(r, s)), (a, b)
print("ok")
EOT
[ $rc = 0 ] && grep -q "^ok" $TMP/b3.check && pass moe_bias_range_zero3_dp2_equals_one_process ||
    fail moe_bias_range_zero3_dp2_equals_one_process "rc=$rc $(tail -2 $TMP/b3.check) $(tail -1 $TMP/b3.out)"
# the plan counts the buffer the bias is made whole in: plan = arena
plan_matches_arena moe_bias_zero3_plan_equals_arena $TMP/c.yaml 2 $C $B --set parallel.dp=2 \
    --set optimizer.zero_stage=3 --set train.steps=1
echo '{"step": 1, "loss": 2.5}' >$TMP/dense.jsonl
expect_exit plot_moe_without_moe_exit_2 2 "no step with per-expert MoE load" -- scripts/plot -o $TMP/plots --moe $TMP/dense.jsonl
exit 0
