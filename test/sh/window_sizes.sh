#!/usr/bin/env bash
# model.sliding_window with windows of different sizes in one model ([4, 8, 64, 8]: layer 0 a
# window of 4, layers 1 and 3 of 8, layer 2 full; docs/huggingface.md): each size gets its own set of window
# starts (core/model/model.c:take_windows). The step-0 validation loss equals a torch reference
# with one mask per layer (test/tools/window_ref.py) within 1e-5 relative; greedy generate's
# logits (its caches: rings of 7 and 11 rows, pieces of 4) equal the reference's at every new
# token; tp (with and without sp), cp (ring, all-gather, Ulysses, with document masks; at cp 4
# contiguous the ring stops each block at the last rank whose windows reach it), pp and
# ZeRO-3 train one process's losses; the ring's bytes per step equal the hand count, and `ustrain
# plan`'s cp group bytes equal the runs' (zigzag, contiguous; windows, full). Five sizes exit 2
# naming the layer; the export exits 2.
. "$(dirname "$0")/../lib.sh"
equiv_configs winsizes 4 2
sed -i 's/n_layer: 2/n_layer: 4/; s/max_seq_len: 64}/max_seq_len: 64, sliding_window: [4, 8, 64, 8]}/' $TMP/llama.yaml
expect_exit window_sizes_validate_prints_them 0 "attention: sliding windows \[4,8,64,8\] \(3 layers windowed of 4\)" -- \
    $UST validate $TMP/llama.yaml
EQ="python3 test/tools/equiv.py --steps 4 --config $TMP/llama.yaml"
$EQ --name _window_sizes --layout "tp=2" --layout "tp=2 sp=true dp=2 zero=1" --layout "cp=2" \
    --layout "cp=2 parallel.cp_comm=allgather" --layout "cp=2 parallel.cp_comm=a2a" \
    --layout "pp=2 sched=zb" --layout "dp=2 zero=3"
$EQ --name _window_sizes_docs --set data.doc_mask=true --layout "cp=2" \
    --layout "cp=2 parallel.cp_comm=a2a" --layout "cp=4 parallel.cp_layout=contiguous" \
    --layout "cp=4 parallel.cp_comm=a2a+ring parallel.cp_a2a=2 parallel.cp_layout=contiguous"
# the ring's traffic by hand, cp 4 contiguous (Tl 8): a block's k (or v, dk, dv) is
# 1*8*2*16*4 = 1024 bytes, k and v together 2048. Windows 4 and 8 reach only the block before:
# hops 1,1,1,0, so rank 0 sends its block once forward, once backward, its gradients once
# onwards and receives them home: 3 block-sends a layer; the full layer (64 = max_seq_len)
# causally hops 3,2,1,0: rank 0 again 3 (the blocks before it hold nothing it needs). 4 layers
# x 3 x 2048 x 4 micro-batches = 98304 bytes a step on rank 0 (every block round the ring, as
# before: 3 + 3 + 4 = 10 block-sends a layer, 327680); over the group (comm_bytes_cp_group) each
# windowed layer takes 3*3 + 3 = 12 block-sends and the full one 3*6 + 3 = 21: (3*12 + 21) x 2048
# x 4 = 466944 (before: 40 a layer, 1310720)
scripts/ustrun --nproc-per-node 4 $UST train $TMP/llama.yaml --set parallel.cp=4 \
    --set parallel.cp_layout=contiguous --set train.steps=2 --set checkpoint.resume=none \
    --set checkpoint.every=0 --set logging.metrics_file=$TMP/traffic.jsonl >$TMP/traffic.out 2>&1 ||
    fail window_cp4_traffic_run "$(tail -2 $TMP/traffic.out)"
got=$(grep -o '"comm_bytes_cp":[0-9]*' $TMP/traffic.jsonl | cut -d: -f2 | tr '\n' ' ')
[ "$got" = "98304 98304 " ] && pass window_cp4_rank0_ring_bytes_equal_hand_count ||
    fail window_cp4_rank0_ring_bytes_equal_hand_count "comm_bytes_cp per step: $got, by hand 98304"
got=$(grep -o '"comm_bytes_cp_group":[0-9]*' $TMP/traffic.jsonl | cut -d: -f2 | tr '\n' ' ')
[ "$got" = "466944 466944 " ] && pass window_cp4_group_ring_bytes_equal_hand_count ||
    fail window_cp4_group_ring_bytes_equal_hand_count "comm_bytes_cp_group per step: $got, by hand 466944"
# the plan's figure for the cp group (`ustrain plan`, the config's own layout) equals what a run
# measures, for both layouts with these windows and with full (causal) attention
cp_plan_vs_run() { # NAME LAYOUT WINDOW [metrics of a run done]
    local name=$1 S="--set parallel.cp=4 --set parallel.cp_layout=$2 --set model.sliding_window=$3"
    local m=${4:-$TMP/$name.jsonl} plan got
    [ $# -ge 4 ] || set -- "$@" ""
    [ -n "$4" ] || scripts/ustrun --nproc-per-node 4 $UST train $TMP/llama.yaml $S --set train.steps=1 \
        --set checkpoint.resume=none --set checkpoint.every=0 --set logging.metrics_file=$m \
        >$TMP/$name.out 2>&1 || { fail $name "run: $(tail -2 $TMP/$name.out)"; return; }
    got=$(grep -o '"comm_bytes_cp_group":[0-9]*' $m | head -1 | cut -d: -f2)
    plan=$($UST plan $TMP/llama.yaml --world 4 $S | sed -n '/own layout/,$s/.* \([0-9]*\) bytes by the group.*/\1/p')
    [ -n "$got" ] && [ "$plan" = "$got" ] && pass $name || fail $name "plan $plan bytes, the run $got"
}
cp_plan_vs_run window_cp4_plan_equals_run_contiguous contiguous "[4,8,64,8]" $TMP/traffic.jsonl
cp_plan_vs_run window_cp4_plan_equals_run_zigzag zigzag "[4,8,64,8]"
cp_plan_vs_run window_cp4_plan_equals_run_contiguous_full contiguous "''"
cp_plan_vs_run window_cp4_plan_equals_run_zigzag_full zigzag "''"
if need_py window_sizes_reference torch safetensors; then
    $UST train $TMP/llama.yaml --set train.steps=0 --set "data.val=$TMP/data/val_*.bin" \
        --set data.val_steps=4 --set checkpoint.dir=$TMP/ck >$TMP/t.log 2>&1
    vl=$(sed -n 's/^step 0: val_loss \([0-9.]*\).*/\1/p' $TMP/t.log)
    [ -z "$vl" ] && fail window_sizes_val_loss "no val_loss: $(tail -2 $TMP/t.log)"
    python3 test/tools/window_ref.py loss window_sizes_loss_matches_reference $TMP/ck/step_0 4,2,500 \
        4,8,0,8 $TMP/data/val_000.bin 4 32 "$vl"
    printf 'window sizes' >$TMP/prompt.txt
    ids=$(python3 -c 'print(",".join(str(b) for b in open("'$TMP'/prompt.txt","rb").read()))')
    $UST generate $TMP/ck/step_0 --prompt-file $TMP/prompt.txt --tokenizer bytes --temperature 0 \
        --max-new-tokens 40 --dump-logits $TMP/gen.logits >/dev/null 2>$TMP/gen.log ||
        fail window_sizes_generate "$(tail -2 $TMP/gen.log)"
    python3 test/tools/window_ref.py logits window_sizes_generate_matches_reference $TMP/ck/step_0 \
        4,2,500 4,8,0,8 "$ids" $TMP/gen.logits
fi
# bad input
expect_exit window_sizes_five_exits_2 2 "model.sliding_window \[2,3,4,5,6\]: layer 4's window 6 is one size too many" -- \
    $UST validate $TMP/llama.yaml --set model.n_layer=5 --set 'model.sliding_window=[2,3,4,5,6]'
expect_exit window_sizes_export_exits_2 2 "windows of 4 and 8 keys in one model; a Hugging Face layout has one window size" -- \
    $UST export $TMP/ck/step_0 --to hf $TMP/out
exit 0
