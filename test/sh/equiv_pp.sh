#!/usr/bin/env bash
# Pipeline parallelism in the equivalence harness: pp 2 and 4 under every schedule (afab, 1f1b,
# interleaved depth- and breadth-first, zb), with dp/ZeRO, tp/sp and cp, gpt2 with tied
# embeddings synced between the first and last stage, llama with grouped-query attention;
# checkpoints resumed across pipeline layouts; a skipped tied-embedding sync is caught; layouts
# the schedules cannot run are refused with exit 2.
. "$(dirname "$0")/../lib.sh"

equiv_configs equiv-pp 4 2
sed -i 's/n_layer: 2/n_layer: 4/' $TMP/llama.yaml $TMP/gpt2.yaml
EQ="python3 test/tools/equiv.py --steps 6"

$EQ --name _pp_llama --config $TMP/llama.yaml \
    --layout "pp=2 sched=afab" --layout "pp=2 sched=1f1b" --layout "pp=2 sched=zb" \
    --layout "pp=4 sched=afab" --layout "pp=4 sched=1f1b" --layout "pp=4 sched=zb" \
    --layout "pp=2 vpp=2 sched=interleaved" \
    --layout "pp=2 vpp=2 sched=interleaved parallel.pp_breadth_first=true" \
    --layout "pp=2 dp=2 zero=1" --layout "pp=2 tp=2" --layout "pp=2 cp=2 sched=zb" \
    --layout "pp=2 dp=2 zero=3" --layout "pp=2 sched=zb train.recompute=selective" \
    --layout "pp=2 parallel.pp_layers=3,1" --layout "pp=2 sched=zb parallel.pp_layers=[1,3]"
$EQ --name _pp_gpt2 --config $TMP/gpt2.yaml \
    --layout "pp=2" --layout "pp=4 sched=zb" --layout "pp=2 vpp=2 sched=interleaved" \
    --layout "pp=2 dp=2 zero=2 sched=zb" --layout "pp=2 tp=2 sp=true dp=2 zero=1" \
    --layout "pp=2 train.recompute=full"
$EQ --name _pp --config $TMP/llama.yaml --save-layout "pp=4" --resume-at 3 --layout "pp=2" \
    --layout "pp=1" --layout "pp=2 vpp=2 sched=interleaved"
$EQ --name _pp --config $TMP/gpt2.yaml --save-layout "pp=2 dp=2 zero=3" --resume-at 3 \
    --layout "pp=4 sched=zb" --layout "tp=2"
# the harness sees a pipeline bug: the last stage's copy of the tied embedding left unsynced
$EQ --name _pp_fault --config $TMP/gpt2.yaml --expect-fail --env UST_FAULT_PP_SKIP_TIED_SYNC=1 \
    --layout "pp=2"

# validation runs through the pipeline too (forward only, every chunk in order): same val loss
val_losses_equal pp_validation_loss_equals_one_process $TMP/llama.yaml 4 --set parallel.pp=2 --set parallel.vpp=2 --set parallel.pp_schedule=interleaved --set parallel.dp=2

# the bytes rank 0 sends to its pipeline neighbours per step, against the count: each transfer is
# one micro-batch's boundary tensor (32 tokens x 64 floats, halved over tp under sp); stage 0
# sends m activations, under interleaving its second chunk (stage 2 of 4) m more and m gradients
ppbytes() { # ppbytes NAME WORLD WANT SETS...
    local name=$1 w=$2 want=$3; shift 3
    rm -rf $TMP/pb
    scripts/ustrun --nproc-per-node $w $UST train $TMP/llama.yaml --set checkpoint.resume=none --set train.steps=1 \
        --set checkpoint.every=0 --set "logging.metrics_file=$TMP/pb/m.jsonl" "$@" >/dev/null 2>&1
    local got=$(grep -o '"comm_bytes_pp":[0-9]*' $TMP/pb/m.jsonl | cut -d: -f2)
    [ "$got" = "$want" ] && pass $name || fail $name "rank 0 sent $got bytes, expected $want"
}
ppbytes pp_bytes_1f1b 2 $((4 * 32 * 64 * 4)) --set parallel.pp=2
ppbytes pp_bytes_interleaved 2 $((3 * 4 * 32 * 64 * 4)) --set parallel.pp=2 --set parallel.vpp=2 \
    --set parallel.pp_schedule=interleaved
ppbytes pp_bytes_tp2_sp 4 $((4 * 16 * 64 * 4)) --set parallel.pp=2 --set parallel.tp=2 --set parallel.sp=true

expect_exit pp_interleaved_needs_divisible_microbatches 2 "multiple of parallel.pp \(2\)" -- \
    $UST validate $TMP/llama.yaml --set parallel.pp=2 --set parallel.vpp=2 \
    --set parallel.pp_schedule=interleaved --set train.global_batch_size=3
expect_exit pp_vpp_needs_pp 2 "parallel.vpp \(2\) > 1 needs parallel.pp > 1" -- \
    $UST validate $TMP/llama.yaml --set parallel.vpp=2 --set parallel.pp_schedule=interleaved
expect_exit pp_zb_refuses_full_recompute 2 "zb defers weight gradients" -- \
    $UST validate $TMP/llama.yaml --set parallel.pp=2 --set parallel.pp_schedule=zb \
    --set train.recompute=full --world 2
expect_exit pp_layers_wrong_count 2 "parallel.pp_layers has 3 entries; it needs one per stage: parallel.pp \* parallel.vpp = 2" -- \
    $UST validate $TMP/llama.yaml --set parallel.pp=2 --set parallel.pp_layers=2,1,1 --world 2
expect_exit pp_layers_wrong_sum 2 "parallel.pp_layers adds up to 5 layers; model.n_layer is 4" -- \
    $UST validate $TMP/llama.yaml --set parallel.pp=2 --set "parallel.pp_layers=[3, 2]" --world 2
expect_exit pp_layers_not_numbers 2 "expected a list of positive integers, got '3,x'" -- \
    $UST validate $TMP/llama.yaml --set parallel.pp=2 --set parallel.pp_layers=3,x --world 2
expect_exit pp_layers_not_divisible 2 "n_layer \(4\) must be divisible" -- \
    $UST validate $TMP/llama.yaml --set parallel.pp=3 --world 3
exit 0
