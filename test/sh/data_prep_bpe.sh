#!/usr/bin/env bash
# `ustrain data prep --tokenizer tokenizer.json` against the Hugging Face `tokenizers` library
# (installed from PyPI when missing; no tokenizers is a FAIL, not a skip): three small byte-level
# BPE tokenizers are trained with it on generated text (unicode scripts, digits, whitespace runs,
# contractions, emojis, special-token text): GPT-2 style (ByteLevel regex), Llama-3 style (Split
# on the Llama-3 regex + ByteLevel, ignore_merges) and ByteLevel with add_prefix_space plus
# lstrip/rstrip/single_word added tokens and bytes missing from the vocabulary. Every token of
# the shards (plain text, JSON lines and a long cut-up document, end of text after each) must
# equal tokenizers' encode. The output must not depend on the thread count or on where long
# documents are cut; shards must train; bad input exits 2 naming the problem.
. "$(dirname "$0")/../lib.sh"

REF="python3 test/tools/bpe_reference.py"
need_py data_prep_bpe_needs_tokenizers tokenizers || exit 0

C=$TMP/corpus
$REF corpus $C || { fail data_prep_bpe_corpus "generating the corpus failed"; exit 0; }
FILES="$C/plain.txt $C/docs.jsonl $C/long.txt"
eot_of() { python3 -c "import json,sys; print([a['id'] for a in json.load(open(sys.argv[1]))['added_tokens'] if a['content'] in ('<|endoftext|>', '<|end_of_text|>')][0])" "$1"; }

# --- every token equals tokenizers' encode, for each pre-tokenization style
for k in gpt2 llama3 prefix; do
    if ! $REF train $k $C $TMP/$k.json; then fail data_prep_${k}_tokenizer_trains "tokenizers training failed"; continue; fi
    eot=$(eot_of $TMP/$k.json)
    out=$($UST data prep --tokenizer $TMP/$k.json --out $TMP/$k --threads 2 $FILES 2>&1) &&
        out=$($REF check $TMP/$k.json $eot $TMP/$k $FILES 2>&1) &&
        pass data_prep_${k}_matches_tokenizers_token_for_token ||
        fail data_prep_${k}_matches_tokenizers_token_for_token "$(echo "$out" | tail -4)"
done

# --- 1 and 3 threads, documents cut every ~1000 bytes, several shards: the same bytes
for k in gpt2 llama3; do
    ok=1
    for th in 1 3; do
        $UST data prep --tokenizer $TMP/$k.json --out $TMP/$k-t$th --threads $th --chunk-bytes 1000 \
            --shard-tokens 20000 $FILES >/dev/null 2>&1 || ok=0
    done
    n=$(ls $TMP/$k-t1/*.bin 2>/dev/null | wc -l)
    for f in $TMP/$k-t1/*.bin; do cmp -s $f $TMP/$k-t3/$(basename $f) || ok=0; done
    out=$($REF check $TMP/$k.json $(eot_of $TMP/$k.json) $TMP/$k-t3 $FILES 2>&1) || ok=0
    [ $ok = 1 ] && [ "$n" -ge 4 ] && pass data_prep_${k}_same_output_for_1_and_3_threads_and_cut_documents ||
        fail data_prep_${k}_same_output_for_1_and_3_threads_and_cut_documents "$n shards; $(echo "$out" | tail -3)"
done

# --- a second run into the same directory with fewer shards removes the earlier run's extra ones
$UST data prep --tokenizer $TMP/gpt2.json --out $TMP/gpt2-t1 --shard-tokens 40000 $FILES >/dev/null 2>&1
n=$(ls $TMP/gpt2-t1/train_*.bin | wc -l)
[ "$n" = 2 ] && pass data_prep_rerun_removes_stale_shards || fail data_prep_rerun_removes_stale_shards "$n train shards, expected 2"

# --- merges written as "a b" strings (older tokenizer.json files) give the same tokens
$REF legacy $TMP/gpt2.json $TMP/gpt2-legacy.json
$UST data prep --tokenizer $TMP/gpt2-legacy.json --out $TMP/legacy $FILES >/dev/null 2>&1 &&
    cmp -s $TMP/legacy/train_000.bin $TMP/gpt2/train_000.bin && cmp -s $TMP/legacy/val_000.bin $TMP/gpt2/val_000.bin &&
    pass data_prep_legacy_merge_strings_same_tokens || fail data_prep_legacy_merge_strings_same_tokens "shards differ"

# --- the BPE shards train (vocab 1200)
cat >$TMP/tiny.yaml <<EOT
run:   {name: prep-bpe, seed: 7}
model: {arch: llama, n_layer: 1, d_model: 32, n_head: 2, n_kv_head: 2, d_ff: 64, vocab_size: 1200, max_seq_len: 32}
train: {steps: 2, seq_len: 32, micro_batch_size: 1, global_batch_size: 2}
optimizer: {lr: 3.0e-3, warmup_steps: 1}
data:  {train: "$TMP/llama3/train_*.bin", val: "$TMP/llama3/val_*.bin"}
checkpoint: {dir: $TMP/run/ckpt, every: 0}
logging: {metrics_file: $TMP/run/metrics.jsonl}
EOT
out=$($UST train $TMP/tiny.yaml 2>&1) && pass data_prep_bpe_shards_train || fail data_prep_bpe_shards_train "$(echo "$out" | tail -2)"

# --- bytes: an end-of-text id past 65535 makes uint32 shards; --jsonl-field picks the field
printf '{"body": "h\\u00e9"}\n{"body": "ok"}\n' >$TMP/b.jsonl
$UST data prep --out $TMP/u32 --eot 70000 --jsonl-field body --val-fraction -1 $TMP/b.jsonl >/dev/null 2>&1
got=$(python3 -c "
import struct, sys
b = open(sys.argv[1], 'rb').read()
m, v, n = struct.unpack('<3i', b[:12])
print(m, n, list(struct.unpack('<%dI' % n, b[1024:])))" $TMP/u32/train_000.bin 2>&1)
[ "$got" = "20240801 7 [104, 195, 169, 70000, 111, 107, 70000]" ] && pass data_prep_bytes_uint32_when_eot_needs_it ||
    fail data_prep_bytes_uint32_when_eot_needs_it "$got"

# --- a progress bar on stderr when it is a terminal, none otherwise
script -qec "$UST data prep --tokenizer $TMP/gpt2.json --out $TMP/pb $FILES" /dev/null >$TMP/pb.out 2>&1
$UST data prep --tokenizer $TMP/gpt2.json --out $TMP/pb2 $FILES 2>$TMP/pb2.err >/dev/null
grep -q 'data prep \[##############################\] 100%' $TMP/pb.out && ! [ -s $TMP/pb2.err ] &&
    pass data_prep_progress_bar_only_on_a_tty || fail data_prep_progress_bar_only_on_a_tty "$(tail -c 300 $TMP/pb.out)"

# --- many added tokens, one of them listed twice: the repeat keeps the first's id (as tokenizers
# loads it) and 20000 of them load at once (a scan over the earlier ones per token was quadratic)
python3 - $TMP/gpt2.json $TMP/many.json $TMP/many.txt <<'PYEOF2'
import json, sys
j = json.load(open(sys.argv[1]))
n = len(j["model"]["vocab"]) + len(j["added_tokens"])
for i in range(20000):
    j["added_tokens"].append({"id": n + i, "content": f"<|t{i}|>", "special": True, "single_word": False,
                              "lstrip": False, "rstrip": False, "normalized": False})
j["added_tokens"].append(dict(j["added_tokens"][-7], id=n + 20000))  # <|t19993|> again
json.dump(j, open(sys.argv[2], "w"))
open(sys.argv[3], "w").write("a <|t0|> b <|t19993|>c<|t19999|> <|t7|><|t7|>\n")
PYEOF2
eot=$(eot_of $TMP/gpt2.json)
out=$($UST data prep --tokenizer $TMP/many.json --out $TMP/many $TMP/many.txt 2>&1) &&
    out=$($REF check $TMP/many.json $eot $TMP/many $TMP/many.txt 2>&1) &&
    pass data_prep_many_added_tokens_and_a_repeat_match_tokenizers ||
    fail data_prep_many_added_tokens_and_a_repeat_match_tokenizers "$(echo "$out" | tail -3)"

# --- bad input exits 2 with the reason
python3 -c "
import json, sys
j = json.load(open(sys.argv[1])); j['pre_tokenizer'] = {'type': 'Whitespace'}
json.dump(j, open(sys.argv[2], 'w'))
j = json.load(open(sys.argv[1])); j['added_tokens'] = [a for a in j['added_tokens'] if a['id'] != 0]
json.dump(j, open(sys.argv[3], 'w'))" $TMP/gpt2.json $TMP/meta.json $TMP/noeot.json
expect_exit data_prep_unsupported_pretokenizer_exits_2 2 "pre_tokenizer.type 'Whitespace' is not supported" -- \
    $UST data prep --tokenizer $TMP/meta.json --out $TMP/x $C/plain.txt
expect_exit data_prep_tokenizer_without_eot_exits_2 2 "no <\|endoftext\|>.*--eot" -- \
    $UST data prep --tokenizer $TMP/noeot.json --out $TMP/x $C/plain.txt
expect_exit data_prep_tokenizer_not_json_exits_2 2 "plain.txt: not valid JSON" -- \
    $UST data prep --tokenizer $C/plain.txt --out $TMP/x $C/plain.txt
printf '{"text": "a"}\n{"txt": "b"}\n' >$TMP/bad.jsonl
expect_exit data_prep_jsonl_without_field_exits_2 2 "bad.jsonl:2: no string field \"text\"" -- \
    $UST data prep --out $TMP/x $TMP/bad.jsonl
expect_exit data_prep_bad_threads_exits_2 2 "--threads 0: expected 1..256" -- \
    $UST data prep --out $TMP/x --threads 0 $C/plain.txt
