#!/usr/bin/env bash
# The conversation fine-tuning example of docs/huggingface.md, command for command, in a scratch
# directory: a tiny Qwen2 and a chat tokenizer made by test/tools/chat_reference.py, data prep
# with --chat auto, multiple-choice eval before, 30 packed SFT steps on the assistant tokens,
# export (the tokenizer shipped), eval after and a generated reply.
. "$(dirname "$0")/../lib.sh"

need_py sft_example_needs_torch torch transformers tokenizers || exit 0
ROOT=$PWD
U=$(cd "$(dirname "$UST")" && pwd)/$(basename "$UST")
REF="python3 $ROOT/test/tools/chat_reference.py"
cd $TMP
mkdir -p configs && cp $ROOT/configs/sft-tiny.yaml configs/
run() { # run NAME CMD...: one command of the example
    local name=$1; shift
    if "$@" >$TMP/$name.log 2>&1; then pass sft_example_$name; else fail sft_example_$name "$(tail -3 $TMP/$name.log)"; fi
}
run make_chat_data $REF make runs/sft/src
run make_model $REF model runs/sft/model 640
run copy_tokenizer cp runs/sft/src/chatml/tokenizer.json runs/sft/src/chatml/tokenizer_config.json runs/sft/model/
run make_task $REF mc-items runs/sft/mc.jsonl
run prep $U data prep --tokenizer runs/sft/model/tokenizer.json --chat auto --out runs/sft/data runs/sft/src/convs.jsonl
run eval_before $U eval runs/sft/model --task runs/sft/mc.jsonl
run train $U train configs/sft-tiny.yaml
run export $U export runs/sft/ckpt --to hf runs/sft/export
run eval_after $U eval runs/sft/export --task runs/sft/mc.jsonl
run generate $U generate runs/sft/export --prompt $'<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n' \
    --max-new-tokens 16 --seed 1
grep -q "template: chatml" $TMP/prep.log && grep -q "packed first-fit" $TMP/train.log && grep -q "^step    30/30" $TMP/train.log &&
    grep -q "^eval: task .* acc [0-9.]* acc_norm" $TMP/eval_before.log && grep -q "^eval: task .* acc [0-9.]* acc_norm" $TMP/eval_after.log &&
    [ -f runs/sft/export/tokenizer.json ] && pass sft_example_outputs ||
    fail sft_example_outputs "$(tail -1 $TMP/prep.log $TMP/train.log $TMP/eval_after.log)"
# the loss falls: the last step's below the first's
python3 - runs/sft/metrics.jsonl <<'EOT' && pass sft_example_loss_falls || fail sft_example_loss_falls "$(head -c 300 runs/sft/metrics.jsonl)"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert r[-1]["loss"] < r[0]["loss"] - 0.5, (r[0]["loss"], r[-1]["loss"])
assert all(x["target_tokens"] > 0 and 0 <= x["padding_frac"] < 1 for x in r)
assert [x["step"] for x in r if "tasks" in x] == [10, 20, 30], [x["step"] for x in r if "tasks" in x]
EOT
exit 0
