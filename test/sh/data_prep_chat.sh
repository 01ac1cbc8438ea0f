#!/usr/bin/env bash
# `ustrain data prep --chat`: conversations rendered by the built-in templates (ChatML, Llama 3,
# Mistral, Gemma 3; auto from tokenizer_config.json's chat_template) give token for token what
# transformers' apply_chat_template(..., tokenize=True) gives with each family's Jinja template,
# and the target mask flags exactly the trained turns' content and end token (checked against
# the offsets of the rendered text) under --train-on assistant, completion and all; malformed
# lines are named (file:line) and counted, or stop prep with --strict; a template whose special
# tokens the tokenizer lacks, or an unrecognised chat_template, is refused; the shards train.
. "$(dirname "$0")/../lib.sh"

REF="python3 test/tools/chat_reference.py"
need_py data_prep_chat_needs_transformers tokenizers transformers || exit 0
$REF make $TMP/t >$TMP/make.log 2>&1 || { fail data_prep_chat_reference "$(tail -2 $TMP/make.log)"; exit 0; }
C=$TMP/t/convs.jsonl

check() { # check NAME KIND TRAIN_ON PREP_ARGS...
    local name=$1 kind=$2 on=$3; shift 3
    local out
    out=$($UST data prep --tokenizer $TMP/t/$kind/tokenizer.json --out $TMP/o_$name "$@" $C 2>&1) &&
        out=$($REF check $TMP/t/$kind $TMP/o_$name $C --train-on $on 2>&1) &&
        pass data_prep_chat_$name || fail data_prep_chat_$name "$(echo "$out" | tail -3)"
}
for k in chatml llama3 mistral gemma3; do check ${k}_auto_equals_apply_chat_template $k assistant --chat auto; done
check gemma3_named_completion_only gemma3 completion --chat gemma3 --train-on completion
check chatml_train_on_all chatml all --chat chatml --train-on all
check mistral_completion_only mistral completion --chat auto --train-on completion --threads 3

# "tools" are ignored with a warning; the summary counts the targets
out=$($UST data prep --tokenizer $TMP/t/chatml/tokenizer.json --out $TMP/o_w --chat chatml $C 2>&1)
echo "$out" | grep -q 'convs.jsonl:5: "tools" are ignored' && echo "$out" | grep -q "template: chatml; [0-9]* target tokens" &&
    pass data_prep_chat_tools_warned_and_targets_counted || fail data_prep_chat_tools_warned_and_targets_counted "$(echo "$out" | tail -3)"

# malformed lines: named and counted, or --strict stops at the first
cat >$TMP/bad.jsonl <<'EOT'
{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
{"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]}
{"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "y"}]}
{"messages": []}
{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "only a question"}]}
{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]}
{"text": "no conversation"}
EOT
T=(--tokenizer $TMP/t/gemma3/tokenizer.json --chat gemma3)
out=$($UST data prep "${T[@]}" --out $TMP/o_bad --val-fraction 0 $TMP/bad.jsonl 2>&1); rc=$?
[ $rc = 0 ] && echo "$out" | grep -q "6 malformed lines skipped" &&
    echo "$out" | grep -q 'bad.jsonl:2: message 1: role "tool" is not system, user or assistant' &&
    echo "$out" | grep -q 'bad.jsonl:3: message 1 (user): content is not a string' &&
    echo "$out" | grep -q 'bad.jsonl:4: an empty conversation' &&
    echo "$out" | grep -q 'bad.jsonl:5: no assistant turn to train on' &&
    echo "$out" | grep -q 'bad.jsonl:6: message 2 is user where the template needs assistant' &&
    echo "$out" | grep -q 'bad.jsonl:7: no "messages" array' &&
    pass data_prep_chat_malformed_lines_named_and_counted || fail data_prep_chat_malformed_lines_named_and_counted "exit $rc: $out"
expect_exit data_prep_chat_strict_stops_at_the_first 2 "bad.jsonl:2: message 1: role \"tool\" is not system, user or assistant \(--strict\)" -- \
    $UST data prep "${T[@]}" --out $TMP/o_bad2 --strict $TMP/bad.jsonl
# templates the tokenizer does not fit
python3 - $TMP/t/chatml $TMP/nospecial <<'EOT'
import json, os, shutil, sys
os.makedirs(sys.argv[2], exist_ok=True)
j = json.load(open(sys.argv[1] + "/tokenizer.json"))
j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] != "<|eot_id|>"]
json.dump(j, open(sys.argv[2] + "/tokenizer.json", "w"))
c = json.load(open(sys.argv[1] + "/tokenizer_config.json"))
c["chat_template"] = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
json.dump(c, open(sys.argv[2] + "/tokenizer_config.json", "w"))
EOT
expect_exit data_prep_chat_template_tokens_must_be_the_tokenizers 2 "--chat llama3 needs <\|eot_id\|> as one token of the tokenizer" -- \
    $UST data prep --tokenizer $TMP/nospecial/tokenizer.json --chat llama3 --out $TMP/o_x $C
expect_exit data_prep_chat_auto_refuses_an_unknown_template 2 "tokenizer_config.json: its chat_template is none of the built-in templates \(chatml, llama3, mistral, gemma3" -- \
    $UST data prep --tokenizer $TMP/nospecial/tokenizer.json --chat auto --out $TMP/o_x $C
expect_exit data_prep_chat_unknown_name 2 "--chat vicuna: not a template" -- \
    $UST data prep --tokenizer $TMP/t/chatml/tokenizer.json --chat vicuna --out $TMP/o_x $C
expect_exit data_prep_chat_reads_json_lines_only 2 "read JSON lines" -- \
    $UST data prep --tokenizer $TMP/t/chatml/tokenizer.json --chat chatml --out $TMP/o_x test/sh/data_prep_chat.sh

# prompt/completion without a template: one text, the completion (and not the prompt) trained
printf '%s\n' '{"prompt": "abc", "completion": "de"}' '{"prompt": "x", "completion": "yz"}' >$TMP/pc.jsonl
$UST data prep --out $TMP/o_pc --train-on completion --val-fraction 0 $TMP/pc.jsonl >/dev/null 2>&1 &&
    python3 - $TMP/o_pc/train_000.bin <<'EOT' && pass data_prep_prompt_completion_masks_the_prompt || fail data_prep_prompt_completion_masks_the_prompt "flags differ"
import struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<3i", b[:12])[2]
ids = struct.unpack("<%dH" % n, b[1024:1024 + 2 * n])
bits = b[1024 + 2 * n:]
flags = [(bits[i >> 3] >> (i & 7)) & 1 for i in range(n)]
assert bytes(i for i in ids if i < 256) == b"abcdexyz" and ids[5] == 256, ids
assert flags == [0, 0, 0, 1, 1, 0, 0, 1, 1, 0], flags
EOT

# the shards train (the loss over the assistant tokens only)
cat >$TMP/tiny.yaml <<EOT
run:   {name: prep-chat, seed: 7}
model: {arch: llama, n_layer: 1, d_model: 32, n_head: 2, n_kv_head: 2, d_ff: 64, vocab_size: 640, max_seq_len: 32}
train: {steps: 2, seq_len: 32, micro_batch_size: 1, global_batch_size: 2}
data:  {train: "$TMP/o_chatml_auto_equals_apply_chat_template/train_*.bin", val: null}
checkpoint: {dir: "$TMP/ck"}
logging: {metrics_file: "$TMP/m.jsonl"}
EOT
$UST train $TMP/tiny.yaml >$TMP/train.log 2>&1 && grep -q '"target_tokens":' $TMP/m.jsonl &&
    pass data_prep_chat_shards_train || fail data_prep_chat_shards_train "$(tail -2 $TMP/train.log)"
exit 0
