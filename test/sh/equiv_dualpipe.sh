#!/usr/bin/env bash
# DualPipe (DeepSeek-V3's bidirectional schedule) in the equivalence harness: pp stages, rank r
# holds stage r for the micro-batches entering at rank 0 and stage pp-1-r for those entering at
# rank pp-1, so every stage is held twice (ranks r and pp-1-r, the mirror pair) and the two
# copies' gradients are summed before the optimizer step; the second half of the ranks saves
# nothing (its tensors are replicas). pp 2 and 4 with dp/ZeRO, tp/sp, cp, ep and MoE against one
# process; checkpoints resumed between dualpipe, dualpipev and 1f1b layouts both ways; a mirror
# that does not sum is caught; layouts dualpipe cannot run are refused with exit 2.
. "$(dirname "$0")/../lib.sh"

equiv_configs equiv-dp 4 2
# pp stages: 4 layers for pp=2 and pp=4; 8 micro-batches (dualpipe needs an even number >= 2p)
sed -i -e 's/n_layer: 2/n_layer: 4/' -e 's/global_batch_size: 4/global_batch_size: 8/' \
    $TMP/llama.yaml $TMP/gpt2.yaml
D="vpp=2 sched=dualpipe"
EQ="python3 test/tools/equiv.py --steps 4"

$EQ --name _dp_llama --config $TMP/llama.yaml \
    --layout "pp=2 $D" --layout "pp=4 $D" --layout "pp=2 $D dp=2 zero=1" --layout "pp=2 $D dp=2 zero=2" \
    --layout "pp=2 $D dp=2 zero=3" --layout "pp=2 $D tp=2 sp=true" --layout "pp=2 $D cp=2" \
    --layout "pp=4 $D cp=2" --layout "pp=2 $D train.recompute=full" --layout "pp=2 $D parallel.pp_layers=3,1"
$EQ --name _dp_gpt2 --config $TMP/gpt2.yaml \
    --layout "pp=2 $D" --layout "pp=4 $D" --layout "pp=2 $D dp=2 zero=1"
$EQ --name _dp_pp4dp --config $TMP/llama.yaml --set train.global_batch_size=16 \
    --layout "pp=4 $D dp=2 zero=1" --layout "pp=4 $D tp=2 sp=true"
# MoE layers: whole backwards (no W), expert-parallel over dp; the aux-loss-free bias counts both
# directions' tokens (the mirror's too)
sed -e 's/max_seq_len: 64}/max_seq_len: 64, moe: {num_experts: 4, top_k: 2, d_ff_expert: 64, every: 2, aux_loss_coef: 0.01, bias_update_rate: 0.01}}/' \
    $TMP/llama.yaml >$TMP/moe.yaml
$EQ --name _dp_moe --config $TMP/moe.yaml --layout "pp=2 $D" --layout "pp=2 $D dp=2 ep=2"
$EQ --name _dp_moe_pp4 --config $TMP/moe.yaml --set train.global_batch_size=16 \
    --layout "pp=4 $D dp=2 ep=2"

# checkpoints are layout independent: dualpipe -> 1f1b / dualpipev / one process, and back
$EQ --name _dp_resume --config $TMP/llama.yaml --save-layout "pp=2 $D" --resume-at 2 \
    --layout "pp=2" --layout "pp=1" --layout "pp=2 vpp=2 sched=dualpipev" --layout "pp=4 $D"
$EQ --name _dp_resume --config $TMP/gpt2.yaml --save-layout "pp=4 $D" --resume-at 2 \
    --layout "pp=1" --layout "pp=2 $D dp=2 zero=1"
$EQ --name _dp_resume --config $TMP/gpt2.yaml --save-layout "pp=2" --resume-at 2 \
    --layout "pp=2 $D" --layout "pp=4 $D"

# the harness sees copies that drift apart: the mirror pair does not sum its gradients
$EQ --name _dp_fault --config $TMP/llama.yaml --expect-fail --env UST_FAULT_DP_SKIP_MIRROR=1 \
    --layout "pp=2 $D"

# validation runs direction 0 only (forward, stage r on rank r): the same val loss as one process
val_losses_equal dp_validation_loss_equals_one_process $TMP/llama.yaml 2 --set parallel.pp=2 --set parallel.vpp=2 --set parallel.pp_schedule=dualpipe

# validate --schedule: every rank's list runs to the end in the simulator, with DeepSeek's bubble
out=$($UST validate $TMP/llama.yaml --set parallel.pp=4 --set parallel.vpp=2 \
    --set parallel.pp_schedule=dualpipe --schedule 2>&1)
# rank 3's first action is the first micro-batch of direction 1 (its chunk 0: stage 4, model
# stage 0); rank 0 runs it last, as chunk 1 (stage 7, model stage 3); no local hand-over anywhere
echo "$out" | grep -q "^   0 F mb=4 chunk=0 stage=4" && echo "$out" | grep -q "^   0 F mb=0 chunk=0 stage=0" &&
    echo "$out" | grep -q "F mb=4 chunk=1 stage=7" &&
    ! echo "$out" | grep -q "LOCAL_" &&
    echo "$out" | grep -q "peak activation sets per rank: 5 5 5 5" &&
    echo "$out" | grep -q "schedule dualpipe: p=4 v=2 m=8; simulated bubble 0.0833 (analytic DualPipe .* = 0.0833" &&
    pass dp_validate_prints_the_schedule || fail dp_validate_prints_the_schedule "$(echo "$out" | tail -3)"

# traffic per step against the formulas: rank 0 sends one boundary tensor (B x T x d_model fp32)
# per micro-batch to rank 1 (direction 0's activations, direction 1's gradients: 1f1b's m), and
# sums its gradients with its mirror's in one all-reduce over 2 ranks (bus bytes = the buffer:
# the whole gradient buffer, mem_grads, under ZeRO-0; its partition of every unit, half, under
# ZeRO-1 at dp=2)
dpbytes() { # dpbytes NAME WORLD HALVES SETS...
    local name=$1 w=$2 halves=$3; shift 3
    rm -rf $TMP/pb
    scripts/ustrun --nproc-per-node $w $UST train $TMP/llama.yaml --set checkpoint.resume=none --set train.steps=2 \
        --set checkpoint.every=0 --set "logging.metrics_file=$TMP/pb/m.jsonl" --set parallel.vpp=2 \
        --set parallel.pp_schedule=dualpipe "$@" >$TMP/pb.out 2>&1
    python3 - $TMP/pb/m.jsonl $halves "$@" <<'PY' && pass $name || fail $name "$(cat $TMP/pb.why 2>/dev/null || tail -2 $TMP/pb.out)"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
halves, sets = int(sys.argv[2]), " ".join(sys.argv[3:])
m = 8 // (2 if "parallel.dp=2" in sets else 1)  # micro-batches per step on a dp rank
want_pp = m * 32 * 64 * 4
bad = [(r.get("comm_bytes_pp"), r.get("comm_bytes_mirror"), r["mem_grads"]) for r in rows
       if r.get("comm_bytes_pp") != want_pp or r.get("comm_bytes_mirror", 0) * halves != r["mem_grads"]]
if bad or len(rows) != 2:
    open(sys.argv[1].rsplit("/", 2)[0] + "/pb.why", "w").write(
        f"(pp bytes, mirror bytes, mem_grads) {bad}, want pp {want_pp}, mirror mem_grads/{halves}")
    sys.exit(1)
PY
}
dpbytes dp_bytes_pp2 2 1 --set parallel.pp=2
dpbytes dp_bytes_pp2_dp2_zero1 4 2 --set parallel.pp=2 --set parallel.dp=2 --set optimizer.zero_stage=1

# the memory plan counts both copies and the activation sets: it equals the arena
plan_matches_arena dp_plan_equals_arena $TMP/llama.yaml 2 --set parallel.pp=2 --set parallel.vpp=2 \
    --set parallel.pp_schedule=dualpipe --set train.steps=1 --set checkpoint.every=0 --set checkpoint.resume=none
plan_matches_arena dp_moe_plan_equals_arena $TMP/moe.yaml 2 --set parallel.pp=2 --set parallel.vpp=2 \
    --set parallel.pp_schedule=dualpipe --set train.steps=1 --set checkpoint.every=0 --set checkpoint.resume=none

L="$TMP/llama.yaml --set parallel.pp_schedule=dualpipe"
expect_exit dp_needs_vpp_2 2 "dualpipe needs parallel.vpp: 2 \(got 1\)" -- \
    $UST validate $L --set parallel.pp=2 --set parallel.vpp=1 --world 2
expect_exit dp_needs_even_pp 2 "dualpipe needs an even parallel.pp >= 2 \(got 3\)" -- \
    $UST validate $L --set parallel.pp=3 --set parallel.vpp=2 --set model.n_layer=3 --set train.global_batch_size=6 --world 3
expect_exit dp_needs_even_microbatches 2 "dualpipe needs an even number of at least 2 \* parallel.pp \(4\) micro-batches" -- \
    $UST validate $L --set parallel.pp=2 --set parallel.vpp=2 --set train.global_batch_size=5 --world 2
expect_exit dp_layers_divide_by_pp 2 "model.n_layer \(6\) must be divisible by parallel.pp \(4\): dualpipe" -- \
    $UST validate $L --set parallel.pp=4 --set parallel.vpp=2 --set model.n_layer=6 --world 4
expect_exit dp_pp_layers_one_per_stage 2 "pp_layers has 4 entries; it needs one per stage: parallel.pp \(dualpipe\) = 2" -- \
    $UST validate $L --set parallel.pp=2 --set parallel.vpp=2 --set parallel.pp_layers=1,1,1,1 --world 2
expect_exit dp_tied_refuses_zero2 2 "dualpipe with tied embeddings needs optimizer.zero_stage <= 1" -- \
    $UST validate $TMP/gpt2.yaml --set parallel.pp_schedule=dualpipe --set parallel.pp=2 \
    --set parallel.vpp=2 --set parallel.dp=2 --set optimizer.zero_stage=2 --set train.global_batch_size=16 --world 4
exit 0
