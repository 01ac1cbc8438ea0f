#!/usr/bin/env bash
# The worked example of docs/huggingface.md, command for command, in a scratch directory: a tiny HF Llama made by
# test/tools/hf_make_model.py, 20 steps of configs/hf-tiny.yaml from its weights, the export (with
# the byte-level tokenizer the demo data records), generate and eval on the exported directory.
. "$(dirname "$0")/../lib.sh"

ROOT=$PWD
U=$(cd "$(dirname "$UST")" && pwd)/$(basename "$UST")
cd $TMP
mkdir -p configs && cp $ROOT/configs/hf-tiny.yaml configs/
run() { # run NAME CMD...: one command of the example
    local name=$1; shift
    if "$@" >$TMP/$name.log 2>&1; then pass readme_example_$name; else fail readme_example_$name "$(tail -3 $TMP/$name.log)"; fi
}
run demo_data $U data demo data/tiny
run make_hf_model python3 $ROOT/test/tools/hf_make_model.py make llama runs/hf-tiny/model
run train $U train configs/hf-tiny.yaml
run export $U export runs/hf-tiny/ckpt --to hf runs/hf-tiny/export
run generate $U generate runs/hf-tiny/export --prompt "Once upon a time" --temperature 0.8 --seed 1
run eval $U eval runs/hf-tiny/export --data "data/tiny/val_*.bin" --seq-len 64
grep -q "imported runs/hf-tiny/model: read" $TMP/train.log && grep -q "^step    20/20" $TMP/train.log &&
    pass readme_example_trains_from_the_hf_weights || fail readme_example_trains_from_the_hf_weights "$(tail -3 $TMP/train.log)"
[ -f runs/hf-tiny/export/tokenizer.json ] && grep -q "generate: 16 prompt tokens" $TMP/generate.log &&
    grep -q "^eval: loss [0-9.]* ppl" $TMP/eval.log && pass readme_example_outputs ||
    fail readme_example_outputs "$(ls runs/hf-tiny/export; tail -1 $TMP/generate.log $TMP/eval.log)"
exit 0
