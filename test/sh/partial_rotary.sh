#!/usr/bin/env bash
# model.partial_rotary_factor (docs/huggingface.md): RoPE on the first factor * head_dim features
# of each head, as pairs (i, i + rot/2) at theta^(-2i/rot), the rest passed unchanged
# (transformers' partial rotary). A tiny llama with factor 0.5 (8 of 16 features), trained 10
# steps: its validation loss equals a torch reference (test/tools/window_ref.py) within 1e-5 relative,
# greedy generate's logits equal the reference's at every new token, and tp (with and without
# sp), cp (ring, Ulysses), pp and ZeRO-3 train one process's losses. Bad values exit 2.
. "$(dirname "$0")/../lib.sh"
equiv_configs prf 4 2
sed -i 's/max_seq_len: 64}/max_seq_len: 64, partial_rotary_factor: 0.5}/' $TMP/llama.yaml
python3 test/tools/equiv.py --steps 4 --config $TMP/llama.yaml --name _partial_rotary \
    --layout "tp=2" --layout "tp=2 sp=true dp=2 zero=1" --layout "cp=2" \
    --layout "cp=2 parallel.cp_comm=a2a" --layout "pp=2" --layout "dp=2 zero=3"
if need_py partial_rotary_reference torch safetensors; then
    # 10 steps first: trained attention is sharper than at init, so the rotation shows more
    $UST train $TMP/llama.yaml --set train.steps=10 --set "data.val=$TMP/data/val_*.bin" \
        --set data.val_steps=4 --set data.val_every=10 --set checkpoint.dir=$TMP/ck \
        --set logging.metrics_file=$TMP/m.jsonl >$TMP/t.log 2>&1
    vl=$(grep -o '"val_loss":[0-9.]*' $TMP/m.jsonl | tail -1 | cut -d: -f2)
    [ -z "$vl" ] && fail partial_rotary_val_loss "no val_loss: $(tail -2 $TMP/t.log)"
    python3 test/tools/window_ref.py loss partial_rotary_loss_matches_reference $TMP/ck/step_10 \
        4,2,500,8 0,0 $TMP/data/val_000.bin 4 32 "$vl"
    printf 'Once upon a time' >$TMP/prompt.txt
    ids=$(python3 -c 'import sys; print(",".join(str(b) for b in open(sys.argv[1], "rb").read()))' $TMP/prompt.txt)
    $UST generate $TMP/ck/step_10 --prompt-file $TMP/prompt.txt --tokenizer bytes --temperature 0 \
        --max-new-tokens 24 --dump-logits $TMP/gen.logits >/dev/null 2>$TMP/gen.log ||
        fail partial_rotary_generate "$(tail -2 $TMP/gen.log)"
    python3 test/tools/window_ref.py logits partial_rotary_generate_matches_reference \
        $TMP/ck/step_10 4,2,500,8 0,0 "$ids" $TMP/gen.logits
fi
# bad input
expect_exit partial_rotary_odd_exits_2 2 "model.partial_rotary_factor 0.1 rotates 1 of a head's 16 features; it must be an even number" -- \
    $UST validate $TMP/llama.yaml --set model.partial_rotary_factor=0.1
expect_exit partial_rotary_zero_exits_2 2 "model.partial_rotary_factor" -- \
    $UST validate $TMP/llama.yaml --set model.partial_rotary_factor=0
expect_exit partial_rotary_gpt2_exits_2 2 "model.partial_rotary_factor 0.5 applies to llama's RoPE without rope_scaling" -- \
    $UST validate $TMP/gpt2.yaml --set model.partial_rotary_factor=0.5
expect_exit partial_rotary_cuda_exits_2 2 "the CUDA RoPE kernel rotates whole heads" -- \
    $UST validate $TMP/llama.yaml --set run.device=cuda
expect_exit partial_rotary_export_exits_2 2 "model.partial_rotary_factor 0.5: ustrain imports and exports no family with partial RoPE" -- \
    $UST export $TMP/ck/step_10 --to hf $TMP/out
exit 0
