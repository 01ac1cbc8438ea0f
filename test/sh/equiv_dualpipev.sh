#!/usr/bin/env bash
# DualPipeV in the equivalence harness: rank r holds stages r and 2p-1-r (the V), rank 0 both
# ends of the model (gpt2's tied embedding is then one tensor, nothing to sync), rank p-1 hands
# its two chunks to each other locally; B and W split as in zb except where the model keeps no
# deferred weight gradients (MoE layers, full recomputation: whole backwards). pp 2 and 4 with
# dp/ZeRO, tp/sp, cp and ep against one process; checkpoints resumed between dualpipev and 1f1b
# layouts both ways; layouts dualpipev cannot run are refused with exit 2.
. "$(dirname "$0")/../lib.sh"

equiv_configs equiv-dpv 4 2
# 2p stages: 4 layers for pp=2, 8 for pp=4; 8 micro-batches (dualpipev needs at least 2p)
sed -i -e 's/n_layer: 2/n_layer: 8/' -e 's/global_batch_size: 4/global_batch_size: 8/' \
    $TMP/llama.yaml $TMP/gpt2.yaml
DPV="vpp=2 sched=dualpipev"
EQ="python3 test/tools/equiv.py --steps 4"

$EQ --name _dpv_llama --config $TMP/llama.yaml \
    --layout "pp=2 $DPV" --layout "pp=4 $DPV" --layout "pp=2 $DPV dp=2 zero=2" --layout "pp=2 $DPV dp=2 zero=3" \
    --layout "pp=2 $DPV tp=2 sp=true" --layout "pp=2 $DPV cp=2" --layout "pp=4 $DPV cp=2" \
    --layout "pp=2 $DPV train.recompute=full" --layout "pp=2 $DPV parallel.pp_layers=3,1,1,3"
$EQ --name _dpv_gpt2 --config $TMP/gpt2.yaml \
    --layout "pp=2 $DPV" --layout "pp=2 $DPV dp=2 zero=1"
$EQ --name _dpv_pp4dp --config $TMP/llama.yaml --set train.global_batch_size=16 \
    --layout "pp=4 $DPV dp=2 zero=1" --layout "pp=4 $DPV tp=2 sp=true"
# MoE layers: their backward is whole (no W), expert-parallel over dp
sed -e 's/max_seq_len: 64}/max_seq_len: 64, moe: {num_experts: 4, top_k: 2, d_ff_expert: 64, every: 2, aux_loss_coef: 0.01}}/' \
    $TMP/llama.yaml >$TMP/moe.yaml
$EQ --name _dpv_moe --config $TMP/moe.yaml --layout "pp=2 $DPV dp=2 ep=2"
$EQ --name _dpv_moe_pp4 --config $TMP/moe.yaml --set train.global_batch_size=16 \
    --layout "pp=4 $DPV dp=2 ep=2"

# checkpoints are layout independent: dualpipev -> 1f1b / one process, and 1f1b -> dualpipev
$EQ --name _dpv_resume --config $TMP/llama.yaml --save-layout "pp=2 $DPV" --resume-at 2 \
    --layout "pp=2" --layout "pp=1"
$EQ --name _dpv_resume --config $TMP/gpt2.yaml --save-layout "pp=2" --resume-at 2 \
    --layout "pp=4 $DPV" --layout "pp=2 $DPV dp=2 zero=1"

# the harness sees a bug at the turn: rank p-1 drops the gradient chunk 1 hands to chunk 0
$EQ --name _dpv_fault --config $TMP/llama.yaml --expect-fail --env UST_FAULT_PP_SKIP_TURN_GRAD=1 \
    --layout "pp=2 $DPV"

# validation runs through the V too (forward only, chunk 0 then chunk 1 on each rank, the turn
# copied locally): the same val loss as one process
val_losses_equal dpv_validation_loss_equals_one_process $TMP/llama.yaml 2 --set parallel.pp=2 --set parallel.vpp=2 --set parallel.pp_schedule=dualpipev

# validate --schedule: the schedule runs to the end in the simulator, 2p+1 activation sets
out=$($UST validate $TMP/llama.yaml --set parallel.pp=4 --set parallel.vpp=2 \
    --set parallel.pp_schedule=dualpipev --schedule 2>&1)
echo "$out" | grep -q "LOCAL_ACT mb=0 chunk=1 stage=4" && echo "$out" | grep -q "B mb=7 chunk=0 stage=0 split" &&
    echo "$out" | grep -q "peak activation sets per rank: 9 9 9 9" &&
    echo "$out" | grep -q "schedule dualpipev: p=4 v=2 m=8; simulated bubble" &&
    pass dpv_validate_prints_the_schedule || fail dpv_validate_prints_the_schedule "$(echo "$out" | tail -3)"

# the memory plan counts dualpipev's activation sets and rank 0's two ends: it equals the arena
plan_matches_arena dpv_plan_equals_arena $TMP/llama.yaml 2 --set parallel.pp=2 --set parallel.vpp=2 \
    --set parallel.pp_schedule=dualpipev --set train.steps=1 --set checkpoint.every=0 --set checkpoint.resume=none
plan_matches_arena dpv_moe_plan_equals_arena $TMP/moe.yaml 2 --set parallel.pp=2 --set parallel.vpp=2 \
    --set parallel.pp_schedule=dualpipev --set train.steps=1 --set checkpoint.every=0 --set checkpoint.resume=none

L="$TMP/llama.yaml --set parallel.pp_schedule=dualpipev"
expect_exit dpv_needs_vpp_2 2 "dualpipev needs parallel.vpp: 2 \(got 1\)" -- \
    $UST validate $L --set parallel.pp=2 --set parallel.vpp=1 --world 2
expect_exit dpv_needs_pp 2 "dualpipev needs parallel.pp > 1" -- $UST validate $L --set parallel.vpp=2
expect_exit dpv_needs_2p_microbatches 2 "dualpipev needs at least 2 \* parallel.pp \(8\) micro-batches" -- \
    $UST validate $L --set parallel.pp=4 --set parallel.vpp=2 --set train.global_batch_size=4 --world 4
expect_exit dpv_tied_refuses_zero2 2 "dualpipev with tied embeddings needs optimizer.zero_stage <= 1" -- \
    $UST validate $TMP/gpt2.yaml --set parallel.pp_schedule=dualpipev --set parallel.pp=2 \
    --set parallel.vpp=2 --set parallel.dp=2 --set optimizer.zero_stage=2 --set train.global_batch_size=16 --world 4
exit 0
