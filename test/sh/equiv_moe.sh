#!/usr/bin/env bash
# Mixture of experts in the equivalence harness: expert parallelism ep 2 and 4 over dp 2 and 4,
# with every ZeRO stage, tp (with and without sp), pp (1f1b and interleaved), cp and
# recomputation; top-1 and top-2 routing, with and without a shared expert, dropless and with a
# capacity factor; checkpoints resumed across ep layouts; experts reduced over the wrong group
# or a rank's lost gradients are caught; the tp ranks' token split (gradients summed over tp,
# capacity over the whole micro-batch); aux-loss-free balancing from global counts across dp,
# tp, ep, pp, cp, ZeRO-3 and resumed bit for bit; the sequence-wise balance loss across layouts; the per-layer load and per-ep-rank rows land in the
# metrics; bad layouts are refused with exit 2.
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
    --layout "dp=2 ep=2 tp=2 sp=true" --layout "dp=2 ep=2 pp=2" --layout "dp=2 ep=2 cp=2" \
    --layout "dp=2 ep=2 train.recompute=selective"
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
# Under tp the ranks split the MoE layer's tokens (each routes and computes its share, without sp
# a slice of the replicated rows): the tp parts' gradients must be summed, and capacity is decided
# over the whole micro-batch whatever the tp x cp split
$EQ --name _moe_tp --config $TMP/llama.yaml --layout "tp=2" --layout "tp=2 sp=true"
$EQ --name _moe_tp_capacity --config $TMP/llama.yaml --set model.moe.capacity_factor=1.0 \
    --layout "tp=2" --layout "dp=2 ep=2 tp=2"
$EQ --name _moe_tp_fault --config $TMP/llama.yaml --expect-fail \
    --env UST_FAULT_MOE_SKIP_TP_GRAD_SUM=1 --layout "tp=2 sp=true"
# Aux-loss-free balancing: the routing bias moves by the step's global counts, so every layout
# routes the same; balancing on a rank's own counts is caught
$EQ --name _moe_bias --config $TMP/llama.yaml --set model.moe.bias_update_rate=0.01 \
    --set model.moe.aux_loss_coef=0 --layout "dp=2" --layout "tp=2" --layout "dp=2 ep=2" \
    --layout "pp=2" --layout "cp=2" --layout "dp=2 ep=2 tp=2 sp=true zero=2"
# ZeRO-3: each rank adds the same increment to its shard of the bias (no whole copy to move)
$EQ --name _moe_bias_zero3 --config $TMP/llama.yaml --set model.moe.bias_update_rate=0.01 \
    --set model.moe.aux_loss_coef=0 --layout "dp=2 zero=3" --layout "dp=2 ep=2 zero=3" \
    --layout "dp=2 pp=2 zero=3"
$EQ --name _moe_bias_fault --config $TMP/llama.yaml --set model.moe.bias_update_rate=0.01 \
    --set model.moe.aux_loss_coef=0 --expect-fail --env UST_FAULT_MOE_LOCAL_LOADS=1 \
    --layout "dp=2"
# DeepSeek-V3's sequence-wise balance loss: statistics per sequence wherever its tokens are
# (cp shards, tp parts), so every layout has the same loss and gradients (micro-batches of 2)
$EQ --name _moe_seq_aux --config $TMP/llama.yaml --set model.moe.seq_aux_loss_coef=0.05 \
    --set train.micro_batch_size=2 --layout "dp=2" --layout "tp=2" --layout "cp=2 tp=2 sp=true" \
    --layout "dp=2 ep=2 pp=2"
$EQ --name _moe_bias --config $TMP/llama.yaml --set model.moe.bias_update_rate=0.01 \
    --save-layout "dp=2 ep=2" --resume-at 3 --layout "dp=1" --layout "tp=2 pp=2"

# the bias is in the checkpoint and a resume continues bit for bit: 6 steps straight against 3,
# then a resume to 6 (one process)
B="--set model.moe.bias_update_rate=0.01 --set logging.every=1"
$UST train $TMP/llama.yaml $B --set checkpoint.resume=none --set train.steps=6 --set checkpoint.every=0 \
    --set "logging.metrics_file=$TMP/bias_a.jsonl" >$TMP/bias_a.out 2>&1
$UST train $TMP/llama.yaml $B --set checkpoint.resume=none --set train.steps=3 --set checkpoint.every=3 \
    --set "checkpoint.dir=$TMP/bias_ck" --set "logging.metrics_file=$TMP/bias_b.jsonl" >$TMP/bias_b.out 2>&1
$UST train $TMP/llama.yaml $B --set checkpoint.resume=auto --set train.steps=6 --set checkpoint.every=0 \
    --set "checkpoint.dir=$TMP/bias_ck" --set "logging.metrics_file=$TMP/bias_c.jsonl" >$TMP/bias_c.out 2>&1
if python3 - "$TMP" <<'PY'; then
import json, struct, sys
tmp = sys.argv[1]
a = {r["step"]: r["loss"] for r in map(json.loads, open(f"{tmp}/bias_a.jsonl"))}
c = {r["step"]: r["loss"] for r in map(json.loads, open(f"{tmp}/bias_c.jsonl"))}
assert [a[s] for s in (4, 5, 6)] == [c[s] for s in (4, 5, 6)], (a, c)
f = open(f"{tmp}/bias_ck/step_3/model.safetensors", "rb")
n = struct.unpack("<Q", f.read(8))[0]
head = json.loads(f.read(n))
t = head["model.layers.0.mlp.router.expert_bias"]
assert t["shape"] == [4], t
f.seek(8 + n + t["data_offsets"][0])
b = struct.unpack("<4f", f.read(16))
# three steps of +-0.01 (or 0 at an even load): multiples of 0.01 up to 0.03, not all 0
assert any(abs(x) > 0.005 for x in b) and all(abs(x) < 0.0301 for x in b), b
PY
    pass moe_bias_resume_bit_identical
else
    fail moe_bias_resume_bit_identical "$(tail -2 $TMP/bias_c.out)"
fi

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
    # the step's 4 sequences x 32 tokens x top-2, all on the one rank's experts
    assert x["rank_rows"] == [256], x
PY
    pass moe_load_in_metrics
else
    fail moe_load_in_metrics "$(tail -1 $TMP/moe.jsonl)"
fi
# per ep rank: the rows its experts computed in the step (dp=2 ep=2: each expert on one rank)
scripts/ustrun --nproc-per-node 2 $UST train $TMP/llama.yaml --set checkpoint.resume=none \
    --set train.steps=2 --set parallel.dp=2 --set parallel.ep=2 --set checkpoint.every=0 \
    --set "logging.metrics_file=$TMP/moe_ep.jsonl" >$TMP/moe_ep.out 2>&1
if python3 - "$TMP/moe_ep.jsonl" <<'PY'; then
import json, sys
for x in [json.loads(l) for l in open(sys.argv[1])][-1]["moe"]:
    r = x["rank_rows"]
    assert len(r) == 2 and sum(r) == 256 and min(r) > 0, x
PY
    pass moe_rank_rows_in_metrics
else
    fail moe_rank_rows_in_metrics "$(tail -2 $TMP/moe_ep.out)"
fi

expect_exit moe_zb_refused 2 "zb does not split a MoE layer" -- \
    $UST validate $TMP/llama.yaml --set parallel.pp=2 --set parallel.pp_schedule=zb --world 2
expect_exit moe_ep_must_divide_dp 2 "parallel.dp \(2\) must be divisible by parallel.ep \(4\)" -- \
    $UST validate $TMP/llama.yaml --set parallel.dp=2 --set parallel.ep=4 --world 2
expect_exit moe_tokens_split_over_tp 2 "must be divisible by parallel.tp" -- \
    $UST validate $TMP/llama.yaml --set train.seq_len=3 --set parallel.tp=2 --world 2
expect_exit moe_ep_must_divide_experts 2 "num_experts" -- \
    $UST validate $TMP/llama.yaml --set parallel.dp=8 --set parallel.ep=8 --world 8
exit 0
