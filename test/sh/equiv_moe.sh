#!/usr/bin/env bash
# Mixture of experts in the equivalence harness: expert parallelism ep 2 and 4 over dp 2 and 4,
# with every ZeRO stage, tp (with and without sp), pp (1f1b and interleaved), cp and
# recomputation; top-1 and top-2 routing, with and without a shared expert, dropless and with a
# capacity factor; checkpoints resumed across ep layouts; experts reduced over the wrong group
# or a rank's lost gradients are caught; the per-layer load lands in the metrics; bad layouts
# are refused with exit 2.
. "$(dirname "$0")/../lib.sh"

equiv_configs equiv-moe 4 2
sed -i -e 's/n_layer: 2/n_layer: 4/' \
    -e 's/max_seq_len: 64}/max_seq_len: 64, moe: {num_experts: 4, top_k: 2, d_ff_expert: 64, every: 2, aux_loss_coef: 0.01, z_loss_coef: 0.001}}/' \
    $TMP/llama.yaml
# Routing is discontinuous: a token whose two best experts nearly tie can flip when the weights
# differ by fp32 reduction-order noise. AdamW's default eps 1e-8 turns that noise in near-zero
# gradients (e.g. gpt2's k_proj bias) into full-size updates, which made ~10% of seeds flip a
# choice within 6 steps; eps 1e-6 damps it (0 flips in 40 seed x layout runs), while a lost
# gradient or a wrong reduction group still moves the step-2 loss by 1e-3 to 1e-2.
sed -i 's/^optimizer: {/optimizer: {eps: 1.0e-6, /' $TMP/llama.yaml
# gpt2: every layer MoE, top-1 with a shared expert
sed -e 's/arch: llama/arch: gpt2/' -e 's/n_kv_head: 2/n_kv_head: 4/' \
    -e 's/top_k: 2/top_k: 1, shared_expert: true/' -e 's/every: 2/every: 1/' $TMP/llama.yaml >$TMP/gpt2.yaml
EQ="python3 test/tools/equiv.py --steps 6"

$EQ --name _moe_llama --config $TMP/llama.yaml \
    --layout "dp=2" --layout "dp=2 ep=2" --layout "dp=4 ep=4" --layout "dp=4 ep=2 zero=1" \
    --layout "dp=2 ep=2 zero=2" --layout "dp=2 ep=2 zero=3" --layout "dp=2 ep=2 tp=2" \
    --layout "dp=2 ep=2 tp=2 sp=true" --layout "dp=2 ep=2 pp=2" --layout "dp=2 ep=2 cp=2"
# capacity drops are decided per micro-batch per dp rank, before dispatch, in the micro-batch's
# token order whatever the cp split: neither ep nor cp moves them
$EQ --name _moe_capacity --config $TMP/llama.yaml --set model.moe.capacity_factor=1.0 \
    --layout "dp=2 ep=2" --layout "dp=4 ep=4 zero=1" --layout "cp=2" \
    --layout "dp=2 ep=2 cp=2 parallel.cp_layout=contiguous" --layout "cp=2 tp=2 sp=true"
$EQ --name _moe_gpt2 --config $TMP/gpt2.yaml \
    --layout "dp=2 ep=2" --layout "dp=4 ep=4 zero=3" \
    --layout "dp=2 ep=2 pp=2 vpp=2 sched=interleaved" --layout "dp=2 ep=2 train.recompute=full" \
    --layout "dp=2 ep=2 train.recompute=selective zero=2"
$EQ --name _moe --config $TMP/llama.yaml --save-layout "dp=4 ep=4" --resume-at 3 \
    --layout "dp=2 ep=2" --layout "dp=1" --layout "dp=2 ep=2 pp=2 zero=1"
$EQ --name _moe_fault --config $TMP/llama.yaml --expect-fail --env UST_FAULT_DP_DROP_GRADS_RANK=1 \
    --layout "dp=2 ep=2"

# the metrics carry each MoE layer's load: 32 tokens x top-2 over 4 experts = 16 on average
$UST train $TMP/llama.yaml --set checkpoint.resume=none --set train.steps=2 --set model.moe.capacity_factor=1.0 \
    --set "logging.metrics_file=$TMP/moe.jsonl" --set checkpoint.every=0 >$TMP/moe.out 2>&1
if python3 - "$TMP/moe.jsonl" <<'PY'; then
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
m = r["moe"]
assert [x["layer"] for x in m] == [0, 2], m
for x in m:
    assert x["load_mean"] == 16 and 16 <= x["load_max"] <= 32 and 0 <= x["dropped"] < 1, x
    assert (x["dropped"] > 0) == (x["load_max"] > 16), x  # capacity 16 per expert drops the excess
PY
    pass moe_load_in_metrics
else
    fail moe_load_in_metrics "$(tail -1 $TMP/moe.jsonl)"
fi

expect_exit moe_zb_refused 2 "zb does not split a MoE layer" -- \
    $UST validate $TMP/llama.yaml --set parallel.pp=2 --set parallel.pp_schedule=zb --world 2
expect_exit moe_ep_must_divide_dp 2 "parallel.dp \(2\) must be divisible by parallel.ep \(4\)" -- \
    $UST validate $TMP/llama.yaml --set parallel.dp=2 --set parallel.ep=4 --world 2
expect_exit moe_ep_must_divide_experts 2 "num_experts" -- \
    $UST validate $TMP/llama.yaml --set parallel.dp=8 --set parallel.ep=8 --world 8
exit 0
