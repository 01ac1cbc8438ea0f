#!/usr/bin/env bash
# model.sliding_window with windows of different sizes in one model ([4, 8, 64, 8]: layer 0 a
# window of 4, layers 1 and 3 of 8, layer 2 full; docs/huggingface.md): each size gets its own set of window
# starts (core/model/model.c:take_windows). The step-0 validation loss equals a torch reference
# with one mask per layer (test/tools/window_ref.py) within 1e-5 relative; greedy generate's
# logits (its caches: rings of 7 and 11 rows, pieces of 4) equal the reference's at every new
# token; tp (with and without sp), cp (ring, all-gather, Ulysses, with document masks), pp and
# ZeRO-3 train one process's losses. Five sizes exit 2 naming the layer; the export exits 2.
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
    --layout "cp=2 parallel.cp_comm=a2a"
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
