#!/usr/bin/env bash
# Mixed dense/MoE layers and the routing options in the equivalence harness: DeepSeek-V3's
# routing (sigmoid scores, a balancing bias for the choice only, group-limited top-k, a routed
# scale, a shared expert of its own width, the sequence-wise balance loss) on a model whose first
# two layers are dense (model.moe.first_dense, a dense MLP of its own width), and Qwen3-MoE's
# (softmax top-k without renormalization, the MoE layers listed per layer) under ep, dp with
# ZeRO-3, tp with and without sp, pp with the stage boundary between the dense and the MoE layers
# (1f1b and interleaved), and cp: every layout trains the one-process losses. A lost tp gradient
# sum is caught. The bad inputs exit 2 naming the key.
. "$(dirname "$0")/../lib.sh"

equiv_configs equiv-moe-route 4 2
sed -i -e 's/n_layer: 2/n_layer: 4/' -e 's/d_ff: 128/d_ff: 96/' \
    -e 's/max_seq_len: 64}/max_seq_len: 64, moe: {num_experts: 8, top_k: 2, d_ff_expert: 32, first_dense: 2, score: sigmoid, n_group: 4, topk_group: 2, routed_scale: 2.5, shared_expert: true, shared_d_ff: 48, aux_loss_coef: 0, seq_aux_loss_coef: 0.01, bias_update_rate: 0.01}}/' \
    $TMP/llama.yaml
# as equiv_moe.sh: AdamW's eps 1e-6 keeps reduction-order noise from flipping near-tied choices
sed -i 's/^optimizer: {/optimizer: {eps: 1.0e-6, /' $TMP/llama.yaml
# Qwen3-MoE: per-head q/k norms, layers 1 and 3 MoE (mlp_only_layers [0, 2])
sed -e 's/first_dense: 2, score: sigmoid, n_group: 4, topk_group: 2, routed_scale: 2.5, shared_expert: true, shared_d_ff: 48, aux_loss_coef: 0, seq_aux_loss_coef: 0.01, bias_update_rate: 0.01/layers: [0, 1, 0, 1], norm_topk: false, aux_loss_coef: 0.01/' \
    -e 's/max_seq_len: 64,/max_seq_len: 64, qk_norm: true,/' $TMP/llama.yaml >$TMP/qwen3moe.yaml
EQ="python3 test/tools/equiv.py --steps 5"

$EQ --name _moe_deepseek --config $TMP/llama.yaml \
    --layout "dp=2 ep=2" --layout "dp=2 ep=2 zero=3" --layout "tp=2 sp=true" --layout "pp=2" \
    --layout "pp=2 vpp=2 sched=interleaved" --layout "cp=2" --layout "dp=2 ep=2 tp=2 pp=2 zero=1"
$EQ --name _moe_qwen3 --config $TMP/qwen3moe.yaml \
    --layout "dp=2 ep=2 zero=3" --layout "tp=2" --layout "pp=2" --layout "dp=2 ep=2 pp=2"
# node-limited routing (model.moe.max_nodes_per_token): 12 experts on 3 nodes (n_group), a
# token's top-6 from at most 2 nodes ranked by their top-3 sums
sed -e 's/num_experts: 8, top_k: 2, d_ff_expert: 32, first_dense: 2, score: sigmoid, n_group: 4, topk_group: 2,/num_experts: 12, top_k: 6, d_ff_expert: 32, first_dense: 2, score: sigmoid, n_group: 3, max_nodes_per_token: 2,/' \
    $TMP/llama.yaml >$TMP/nodes.yaml
$EQ --name _moe_nodes --config $TMP/nodes.yaml --layout "dp=2 ep=2" --layout "tp=2 sp=true"
expect_exit moe_max_nodes_with_one_node_exits_2 2 "model.moe.max_nodes_per_token \(2\) limits the nodes a token's experts live on, but with model.moe.n_group 1 the experts are a single node" -- \
    $UST validate $TMP/nodes.yaml --set model.moe.n_group=1
expect_exit moe_max_nodes_share_not_integer_exits_2 2 "model.moe.top_k \(5\) must be max_nodes_per_token \(2\) x a share" -- \
    $UST validate $TMP/nodes.yaml --set model.moe.top_k=5
expect_exit moe_max_nodes_and_topk_group_exits_2 2 "model.moe.max_nodes_per_token \(2\) and model.moe.topk_group \(3\) both choose" -- \
    $UST validate $TMP/nodes.yaml --set model.moe.topk_group=3
$EQ --name _moe_deepseek_tp_fault --config $TMP/llama.yaml --expect-fail \
    --env UST_FAULT_MOE_SKIP_TP_GRAD_SUM=1 --layout "tp=2 sp=true"

# validate says which layers are MoE
expect_exit moe_validate_counts_mixed_layers 0 "moe: 8 experts, top-2 of sigmoid scores in 2 of 4 groups, gates renormalized x 2.5; experts d_ff 32, shared expert d_ff 48; MoE layers 2 3 of 4 \(2 dense, d_ff 96\)" -- $UST validate $TMP/llama.yaml

# bad input: exit 2 naming the key (and its YAML position for a value out of range)
cp $TMP/llama.yaml $TMP/bad.yaml
sed -i 's/first_dense: 2,/first_dense: 2, layers: [0, 1, 2, 1],/' $TMP/bad.yaml
expect_exit moe_layers_entry_out_of_range_exits_2 2 "bad.yaml:[0-9]+:[0-9]+: model.moe.layers: item 2 is out of range \(must be in 0..1\)" -- \
    $UST validate $TMP/bad.yaml
expect_exit moe_layers_wrong_length_exits_2 2 "model.moe.layers \[0,1,1\] has 3 entries; it takes one per layer \(model.n_layer = 4\)" -- \
    $UST validate $TMP/llama.yaml --set model.moe.layers=0,1,1
expect_exit moe_layers_and_every_exits_2 2 "model.moe.layers and model.moe.every \(2\) both choose" -- \
    $UST validate $TMP/llama.yaml --set model.moe.layers=0,1,1,1 --set model.moe.every=2
expect_exit moe_first_dense_all_layers_exits_2 2 "model.moe.num_experts is 8 but no layer is MoE \(model.moe.first_dense 4" -- \
    $UST validate $TMP/llama.yaml --set model.moe.first_dense=4
expect_exit moe_topk_group_over_n_group_exits_2 2 "model.moe.topk_group \(5\) must be <= model.moe.n_group \(4\)" -- \
    $UST validate $TMP/llama.yaml --set model.moe.topk_group=5
expect_exit moe_experts_not_divisible_by_groups_exits_2 2 "model.moe.num_experts \(8\) must be divisible by model.moe.n_group \(3\)" -- \
    $UST validate $TMP/llama.yaml --set model.moe.n_group=3 --set model.moe.topk_group=1
expect_exit moe_top_k_over_group_experts_exits_2 2 "model.moe.top_k \(3\) must be <= model.moe.topk_group \(or max_nodes_per_token\) x experts per group \(1 x 2\)" -- \
    $UST validate $TMP/llama.yaml --set model.moe.top_k=3 --set model.moe.topk_group=1
expect_exit moe_sigmoid_z_loss_exits_2 2 "model.moe.z_loss_coef \(0.001\) needs softmax scores" -- \
    $UST validate $TMP/llama.yaml --set model.moe.z_loss_coef=0.001
expect_exit moe_score_unknown_exits_2 2 "model.moe.score.*softmax.*sigmoid" -- \
    $UST validate $TMP/llama.yaml --set model.moe.score=tanh
exit 0
