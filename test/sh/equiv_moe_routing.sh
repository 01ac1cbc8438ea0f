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
# Node-limited routing's nodes, faked on this host: NODES launchers of PER ranks each (ranks
# numbered node after node; groups across "nodes" use gloo over loopback). 8 experts in 2 groups,
# each token's top-2 from 1 node, dp4 x ep4 so group g is ep ranks 2g, 2g+1.
fake_nodes() { # fake_nodes NODES PER OUT SETS...: exit status of the job, output in $TMP/OUT.*
    local nn=$1 per=$2 out=$3 port=$((20000 + RANDOM % 20000)) i rc=0; shift 3
    for i in $(seq 0 $((nn - 1))); do
        UST_JOB_SECRET=nodes-$port timeout 120 scripts/ustrun --nnodes $nn --node-rank $i \
            --master-addr 127.0.0.1 --master-port $port --nproc-per-node $per $UST train \
            $TMP/nodes.yaml $NODES --set logging.metrics_file=$TMP/$out.jsonl \
            --set checkpoint.dir=$TMP/$out/ckpt "$@" >$TMP/$out.$i 2>&1 &
    done
    for i in $(seq 1 $nn); do wait -n || rc=$?; done
    return $rc
}
NODES="--set model.moe.num_experts=8 --set model.moe.n_group=2 --set model.moe.top_k=2
       --set model.moe.max_nodes_per_token=1 --set parallel.dp=4 --set parallel.ep=4
       --set train.steps=2 --set checkpoint.every=0 --set checkpoint.resume=none"
ep_bytes() { grep -o "\"comm_bytes_ep${2:-}\":[0-9]*" $TMP/$1.jsonl | cut -d: -f2 | tr '\n' ' '; }
fake_nodes 2 2 two; rc=$?
scripts/ustrun --nproc-per-node 4 $UST train $TMP/nodes.yaml $NODES --set logging.metrics_file=$TMP/one.jsonl \
    --set checkpoint.dir=$TMP/one/ckpt >$TMP/one.out 2>&1; rc1=$?
read -r a1 a2 <<<"$(ep_bytes two)"; read -r i1 i2 <<<"$(ep_bytes two _internode)"
read -r b1 b2 <<<"$(ep_bytes one)"; read -r j1 j2 <<<"$(ep_bytes one _internode)"
# step 1 routes the same tokens with the same weights on one node and on two: the same ep bytes,
# none of them across nodes on one, part of them on two
[ $rc = 0 ] && [ $rc1 = 0 ] && [ -n "$a1" ] && [ "$a1" = "$b1" ] && [ "$j1" = 0 ] && [ "$j2" = 0 ] &&
    [ "$i1" -gt 0 ] && [ "$i1" -lt "$a1" ] && [ "$i2" -gt 0 ] && [ "$i2" -lt "$a2" ] &&
    pass moe_nodes_internode_bytes_counted_on_2_faked_nodes_none_on_one ||
    fail moe_nodes_internode_bytes_counted_on_2_faked_nodes_none_on_one \
        "rc $rc/$rc1; two nodes: ep $a1 $a2, internode $i1 $i2; one node: ep $b1, internode $j1 $j2: $(tail -2 $TMP/two.0)"
# 4 nodes of 1 rank: group 0 (experts 0..3, ep ranks 0 and 1) would span nodes 0 and 1
fake_nodes 4 1 four; rc=$?
[ $rc = 2 ] && grep -q "model.moe.max_nodes_per_token (1) takes the model.moe.n_group (2) expert groups for nodes, but group 0's experts (0..3) are on node 0 (global rank 0) and node 1 (global rank 1).*(parallel.tp x parallel.cp x parallel.ep / model.moe.n_group = 1 x 1 x 2 = 2) dividing the 1 ranks per node" $TMP/four.0 &&
    ! grep -q "step " $TMP/four.0 && pass moe_nodes_group_across_nodes_exits_2_before_work ||
    fail moe_nodes_group_across_nodes_exits_2_before_work "exit $rc: $(grep -m1 error $TMP/four.0)"
expect_exit moe_nodes_validate_checks_ranks_per_node 2 "group 0's experts \(0..3\) are on node 0 \(global rank 0\) and node 1 \(global rank 1\)" -- \
    env LOCAL_WORLD_SIZE=1 $UST validate $TMP/nodes.yaml $NODES
expect_exit moe_nodes_validate_placement_ok 0 "each of the 2 expert groups is held by the ranks of one node \(2 ranks per node, LOCAL_WORLD_SIZE\): a token's experts span at most 1 nodes" -- \
    env LOCAL_WORLD_SIZE=2 $UST validate $TMP/nodes.yaml $NODES
expect_exit moe_nodes_validate_says_what_is_assumed 0 "assumed each is held by the ranks of one node \(ranks numbered node after node, tp x cp x ep / n_group = 2 dividing the ranks per node\); the ranks per node are not known here, so one node is assumed" -- \
    env -u LOCAL_WORLD_SIZE $UST validate $TMP/nodes.yaml $NODES
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
