#!/usr/bin/env bash
# A complete export: data prep's meta.json (the tokenizer's absolute path and SHA-256, or
# "bytes"), the checkpoint's record of it in state.json, and what `ustrain export` makes of it:
# tokenizer.json (copied and checked, or synthesized for byte tokens, which ustrain's own data
# prep must then encode exactly as its bytes), tokenizer_config.json, generation_config.json and
# the ids in config.json; --dtype bf16/fp16 (round to nearest even; fp16 overflow refused) and
# --max-shard-size (transformers' shard names and index). test/tools/hf_export_complete.py checks
# the files with numpy, and AutoTokenizer must encode the corpus to
# the training data's exact tokens. A BPE tokenizer.json is written by hand
# here (GPT-2's byte alphabet, a few merges), so nothing is downloaded.
. "$(dirname "$0")/../lib.sh"

CHECK="python3 test/tools/hf_export_complete.py"
need_py export_complete_python_deps numpy || exit 0
# jget FILE EXPR: a value of a JSON file (j is the parsed file), printed as JSON
jget() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(json.dumps($2))" "$1"; }

# --- the corpus and a hand-made byte-level BPE tokenizer.json (GPT-2's bytes_to_unicode, written
# independently of ustrain's)
python3 - "$TMP" <<'EOF'
import json, random, sys
d = sys.argv[1]
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
u = {b: chr(c) for b, c in zip(bs, cs)}
vocab = {u[b]: b for b in range(256)}
merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("Ġ", "s"),
          ("o", "n"), ("Ġa", "n"), ("in", "g")]
for a, b in merges:
    vocab[a + b] = len(vocab)
eot = len(vocab)
tok = {"version": "1.0", "truncation": None, "padding": None,
       "added_tokens": [{"id": eot, "content": "<|endoftext|>", "single_word": False,
                         "lstrip": False, "rstrip": False, "normalized": False, "special": True}],
       "normalizer": None,
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                         "use_regex": True},
       "post_processor": None,
       "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                   "use_regex": True},
       "model": {"type": "BPE", "dropout": None, "unk_token": None,
                 "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
                 "byte_fallback": False, "vocab": vocab, "merges": [a + " " + b for a, b in merges]}}
import os
os.makedirs(f"{d}/bpe", exist_ok=True)
json.dump(tok, open(f"{d}/bpe/tokenizer.json", "w"), ensure_ascii=False)
rng = random.Random(5)
words = ["the", "a", "sang", "ring", "another", "thing", "über", "naïve", "日本語", "😀", "42",
         "3.14", "don't", "  ", "\t", "Hé", "in", "on", "at"]
lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 14))) for _ in range(900)]
open(f"{d}/corpus.txt", "w", encoding="utf-8", newline="").write("\n".join(lines) + "\n")

EOF
BPE_EOT=266
BPE_V=267

# --- data prep and data demo write meta.json
$UST data demo $TMP/demo >/dev/null
[ "$(jget $TMP/demo/meta.json j)" = '{"tokenizer": "bytes", "eot_id": 256, "vocab_size": 257, "token_bytes": 2, "format": "llmc"}' ] &&
    pass data_demo_meta_json_says_byte_tokens || fail data_demo_meta_json_says_byte_tokens "$(cat $TMP/demo/meta.json)"
$UST data prep --tokenizer $TMP/bpe/tokenizer.json --out $TMP/bpe-data --val-fraction 0.1 --threads 1 \
    $TMP/corpus.txt >$TMP/prep.log 2>&1 || fail data_prep_bpe_runs "$(tail -2 $TMP/prep.log)"
want=$(python3 -c "import hashlib,json,os,sys; p=os.path.realpath(sys.argv[1]); print(json.dumps({'tokenizer': p, 'tokenizer_sha256': hashlib.sha256(open(p,'rb').read()).hexdigest(), 'eot_id': $BPE_EOT, 'vocab_size': $BPE_V, 'token_bytes': 2, 'format': 'llmc'}))" $TMP/bpe/tokenizer.json)
NOCOUNT='{k: v for k, v in j.items() if k not in ("train_tokens", "val_tokens", "documents")}'
[ "$(jget $TMP/bpe-data/meta.json "$NOCOUNT")" = "$want" ] &&
    pass data_prep_meta_json_names_the_tokenizer_and_its_sha256 ||
    fail data_prep_meta_json_names_the_tokenizer_and_its_sha256 "$(jget $TMP/bpe-data/meta.json "$NOCOUNT") != $want"
# its token counts are the shards' (llm.c header word 2), and the documents the corpus's
python3 - $TMP/bpe-data <<'EOT'
import glob, json, struct, sys
d = sys.argv[1]
m = json.load(open(f"{d}/meta.json"))
count = lambda pat: sum(struct.unpack("<3i", open(p, "rb").read(12))[2] for p in glob.glob(f"{d}/{pat}"))
ok = m["train_tokens"] == count("train_*.bin") and m["val_tokens"] == count("val_*.bin") and m["documents"] == 1
print("PASS data_prep_meta_json_counts_the_tokens" if ok else f"FAIL data_prep_meta_json_counts_the_tokens: {m}")
EOT
U=$(realpath $UST)
(cd $TMP/bpe && $U data prep --tokenizer tokenizer.json --out ../bpe-rel --threads 1 ../corpus.txt >/dev/null 2>&1)
[ "$(jget $TMP/bpe-rel/meta.json 'j["tokenizer"]')" = "\"$(realpath $TMP/bpe/tokenizer.json)\"" ] &&
    pass data_prep_meta_json_path_is_absolute || fail data_prep_meta_json_path_is_absolute "$(cat $TMP/bpe-rel/meta.json)"
$UST data prep --out $TMP/byte-data --val-fraction 0.1 --threads 1 $TMP/corpus.txt >/dev/null 2>&1
[ "$(jget $TMP/byte-data/meta.json "$NOCOUNT")" = '{"tokenizer": "bytes", "eot_id": 256, "vocab_size": 257, "token_bytes": 2, "format": "llmc"}' ] &&
    pass data_prep_meta_json_bytes_has_no_sha256 || fail data_prep_meta_json_bytes_has_no_sha256 "$(cat $TMP/byte-data/meta.json)"
$UST data prep --out $TMP/noeot --eot none --threads 1 $TMP/corpus.txt >/dev/null 2>&1
[ "$(jget $TMP/noeot/meta.json 'j["eot_id"]')" = null ] && [ -z "$(ls -A $TMP/noeot | grep tmp)" ] &&
    pass data_prep_meta_json_eot_none_is_null || fail data_prep_meta_json_eot_none_is_null "$(ls -A $TMP/noeot; cat $TMP/noeot/meta.json)"

# --- training records the tokenizer in state.json
# train TAG DATA_DIR VOCAB [ARCH]: 4 steps of a tiny model on DATA_DIR's shards
train() {
    cat >$TMP/$1.yaml <<EOT
run:   {name: $1, seed: 3, out_dir: $TMP/$1}
model: {arch: ${4:-llama}, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 2, d_ff: 96, vocab_size: $3, max_seq_len: 64, tie_embeddings: true}
train: {steps: 4, seq_len: 32, micro_batch_size: 2, global_batch_size: 4}
data:  {train: "$2/train_*.bin", val: null}
checkpoint: {dir: $TMP/$1/ckpt, every: 4}
logging: {metrics_file: $TMP/$1/metrics.jsonl}
EOT
    $UST train $TMP/$1.yaml >$TMP/$1.log 2>&1 || fail ${1}_trains "$(tail -2 $TMP/$1.log)"
}
train bpe $TMP/bpe-data $BPE_V
train bytes $TMP/byte-data 300 gpt2
mkdir -p $TMP/nometa && cp $TMP/byte-data/*.bin $TMP/nometa/
train nometa $TMP/nometa 300
want=$(python3 -c "import hashlib,json,os,sys; p=os.path.realpath(sys.argv[1]); print(json.dumps({'path': p, 'sha256': hashlib.sha256(open(p,'rb').read()).hexdigest(), 'eot_id': $BPE_EOT}))" $TMP/bpe/tokenizer.json)
[ "$(jget $TMP/bpe/ckpt/step_4/state.json 'j.get("tokenizer")')" = "$want" ] &&
    pass train_state_json_records_the_tokenizer || fail train_state_json_records_the_tokenizer "$(jget $TMP/bpe/ckpt/step_4/state.json 'j.get("tokenizer")')"
[ "$(jget $TMP/bytes/ckpt/step_4/state.json 'j.get("tokenizer")')" = '{"path": "bytes", "eot_id": 256}' ] &&
    pass train_state_json_records_byte_tokens || fail train_state_json_records_byte_tokens "$(jget $TMP/bytes/ckpt/step_4/state.json 'j.get("tokenizer")')"
[ "$(jget $TMP/nometa/ckpt/step_4/state.json '"tokenizer" in j')" = false ] &&
    pass train_state_json_without_meta_has_no_tokenizer || fail train_state_json_without_meta_has_no_tokenizer "a tokenizer was recorded"

# --- export carries it
expect_exit export_with_bpe_tokenizer_exits_0 0 "tokenizer.json, tokenizer_config.json.*generation_config.json" -- \
    $UST export $TMP/bpe/ckpt --to hf $TMP/bpe-hf
cmp -s $TMP/bpe/tokenizer.json $TMP/bpe-hf/tokenizer.json &&
    pass export_copies_tokenizer_json || fail export_copies_tokenizer_json "tokenizer.json differs from the recorded file"
[ "$(jget $TMP/bpe-hf/tokenizer_config.json '[j.get(k) for k in ("tokenizer_class","bos_token","eos_token","model_max_length")]')" = '["PreTrainedTokenizerFast", "<|endoftext|>", "<|endoftext|>", 64]' ] &&
    pass export_tokenizer_config_json || fail export_tokenizer_config_json "$(cat $TMP/bpe-hf/tokenizer_config.json)"
[ "$(jget $TMP/bpe-hf/config.json '[j["bos_token_id"], j["eos_token_id"], j["vocab_size"]]')" = "[$BPE_EOT, $BPE_EOT, $BPE_V]" ] &&
    [ "$(jget $TMP/bpe-hf/generation_config.json '[j["bos_token_id"], j["eos_token_id"]]')" = "[$BPE_EOT, $BPE_EOT]" ] &&
    pass export_config_and_generation_config_carry_the_eot_id ||
    fail export_config_and_generation_config_carry_the_eot_id "$(cat $TMP/bpe-hf/config.json $TMP/bpe-hf/generation_config.json | grep token_id)"
$UST export $TMP/bytes/ckpt --to hf $TMP/bytes-hf >/dev/null 2>&1
# the synthesized byte tokenizer, read by ustrain's own tokenizer, encodes as its byte tokens do
$UST data prep --tokenizer $TMP/bytes-hf/tokenizer.json --out $TMP/bytes-again --val-fraction 0.1 --threads 1 \
    $TMP/corpus.txt >$TMP/again.log 2>&1
cmp -s $TMP/byte-data/train_000.bin $TMP/bytes-again/train_000.bin && cmp -s $TMP/byte-data/val_000.bin $TMP/bytes-again/val_000.bin &&
    pass export_bytes_tokenizer_json_encodes_as_byte_tokens || fail export_bytes_tokenizer_json_encodes_as_byte_tokens "$(tail -2 $TMP/again.log)"
[ "$(jget $TMP/bytes-hf/config.json '[j["bos_token_id"], j["eos_token_id"], j["vocab_size"]]')" = "[256, 256, 300]" ] &&
    pass export_bytes_config_ids_and_unpadded_vocab || fail export_bytes_config_ids_and_unpadded_vocab "$(grep -E 'token_id|vocab' $TMP/bytes-hf/config.json)"
$UST export $TMP/nometa/ckpt --to hf $TMP/nometa-hf >/dev/null 2>&1
[ "$(ls $TMP/nometa-hf | tr '\n' ' ')" = "config.json model.safetensors " ] &&
    [ "$(jget $TMP/nometa-hf/config.json '[j["bos_token_id"], j["eos_token_id"]]')" = "[null, null]" ] &&
    pass export_without_recorded_tokenizer_writes_weights_and_config ||
    fail export_without_recorded_tokenizer_writes_weights_and_config "$(ls $TMP/nometa-hf)"

# a recorded tokenizer that changed or went missing: exit 2 naming it, OUT untouched
sum_before=$(md5sum $TMP/bpe-hf/* | md5sum)
cp $TMP/bpe/tokenizer.json $TMP/tok.saved
echo " " >>$TMP/bpe/tokenizer.json
expect_exit export_changed_tokenizer_exits_2 2 "tokenizer $TMP/bpe/tokenizer.json has changed since .*SHA-256" -- \
    $UST export $TMP/bpe/ckpt --to hf $TMP/bpe-hf
expect_exit export_no_tokenizer_skips_it 0 "exported" -- $UST export $TMP/bpe/ckpt --to hf $TMP/bpe-notok --no-tokenizer
[ ! -e $TMP/bpe-notok/tokenizer.json ] && [ "$(jget $TMP/bpe-notok/config.json 'j["eos_token_id"]')" = $BPE_EOT ] &&
    pass export_no_tokenizer_keeps_the_ids || fail export_no_tokenizer_keeps_the_ids "$(ls $TMP/bpe-notok)"
rm $TMP/bpe/tokenizer.json
expect_exit export_missing_tokenizer_exits_2 2 "tokenizer $TMP/bpe/tokenizer.json that .*state.json records is missing.*--no-tokenizer" -- \
    $UST export $TMP/bpe/ckpt --to hf $TMP/bpe-hf
mv $TMP/tok.saved $TMP/bpe/tokenizer.json
[ "$(md5sum $TMP/bpe-hf/* | md5sum)" = "$sum_before" ] && [ ! -e $TMP/bad-out ] &&
    pass export_tokenizer_failure_leaves_output_untouched || fail export_tokenizer_failure_leaves_output_untouched "OUT changed"

# --- --dtype
$UST export $TMP/bytes/ckpt --to hf $TMP/bf16-hf --dtype bf16 >/dev/null 2>&1 &&
    $CHECK dtype export_bf16 $TMP/bytes-hf $TMP/bf16-hf bf16 || fail export_bf16_runs "export failed"
$UST export $TMP/bytes/ckpt --to hf $TMP/fp16-hf --dtype fp16 >/dev/null 2>&1 &&
    $CHECK dtype export_fp16 $TMP/bytes-hf $TMP/fp16-hf fp16 || fail export_fp16_runs "export failed"
# a value fp16 cannot hold: refused with the tensor named (bf16 holds it)
rm -rf $TMP/big && mkdir -p $TMP/big && cp -r $TMP/bytes/ckpt/step_4 $TMP/big/step_4
python3 - $TMP/big/step_4/model.safetensors <<'EOF'
import json, struct, sys
p = sys.argv[1]
raw = bytearray(open(p, "rb").read())
(n,) = struct.unpack("<Q", raw[:8])
b = json.loads(raw[8:8 + n])["model.norm.weight"]["data_offsets"][0] + 8 + n + 4 * 3
raw[b:b + 4] = struct.pack("<f", 70000.0)
open(p, "wb").write(raw)
EOF
python3 test/tools/reseal.py $TMP/big/step_4
# a recorded end of text outside the vocabulary would become config.json's eos_token_id
rm -rf $TMP/eot/step_4 && mkdir -p $TMP/eot && cp -r $TMP/bytes/ckpt/step_4 $TMP/eot/step_4 &&
    python3 -c "import json,sys; s=json.load(open(sys.argv[1])); s['tokenizer']['eot_id']=2**40; json.dump(s, open(sys.argv[1],'w'))" $TMP/eot/step_4/state.json &&
    python3 test/tools/reseal.py $TMP/eot/step_4
expect_exit export_eot_id_outside_the_vocabulary_exits_2 2 "the tokenizer's eot_id 1.09951e\+12 is not a token of the model's vocabulary" -- \
    $UST export $TMP/eot/step_4 --to hf $TMP/bad-out
expect_exit export_fp16_overflow_exits_2_naming_the_tensor 2 "tensor 'transformer.ln_f.weight' holds 70000 \(element 3\), beyond float16's range" -- \
    $UST export $TMP/big/step_4 --to hf $TMP/bad-out --dtype fp16
expect_exit export_bf16_holds_large_values 0 "bf16" -- $UST export $TMP/big/step_4 --to hf $TMP/big-hf --dtype bf16
expect_exit export_bad_dtype_exits_2 2 "--dtype fp8: expected fp32, bf16 or fp16" -- \
    $UST export $TMP/bytes/ckpt --to hf $TMP/bad-out --dtype fp8

# --- --max-shard-size (the tied llama: its 20 KB shards hold several tensors each)
expect_exit export_sharded_exits_0 0 "shards \+ index" -- \
    $UST export $TMP/bpe/ckpt --to hf $TMP/shard-hf --max-shard-size 20KB
$CHECK shards export $TMP/bpe-hf $TMP/shard-hf 20000
# re-exported whole into the same OUT: the earlier shards and index go, transformers reads one file
$UST export $TMP/bpe/ckpt --to hf $TMP/shard-hf >/dev/null 2>&1
[ "$(ls $TMP/shard-hf | grep model | tr '\n' ' ')" = "model.safetensors " ] &&
    cmp -s $TMP/shard-hf/model.safetensors $TMP/bpe-hf/model.safetensors &&
    pass export_whole_after_sharded_removes_the_shards || fail export_whole_after_sharded_removes_the_shards "$(ls $TMP/shard-hf)"
expect_exit export_default_shard_size_is_one_file 0 "model.safetensors, fp32" -- \
    $UST export $TMP/bytes/ckpt --to hf $TMP/one-hf --max-shard-size 5GB
expect_exit export_bad_shard_size_exits_2 2 "--max-shard-size 5XB: expected a size" -- \
    $UST export $TMP/bytes/ckpt --to hf $TMP/bad-out --max-shard-size 5XB
expect_exit export_zero_shard_size_exits_2 2 "--max-shard-size 0: expected a size" -- \
    $UST export $TMP/bytes/ckpt --to hf $TMP/bad-out --max-shard-size 0
[ ! -e $TMP/bad-out ] && pass export_bad_options_create_no_output || fail export_bad_options_create_no_output "$(ls -A $TMP/bad-out)"

# --- transformers itself: the tokenizer encodes the corpus to the training tokens
if need_py export_complete_transformers transformers; then
    export TRANSFORMERS_VERBOSITY=error
    $CHECK transformers export_bpe $TMP/bpe-hf $TMP/corpus.txt $BPE_EOT $TMP/bpe-data/train_*.bin $TMP/bpe-data/val_*.bin
    $CHECK transformers export_bytes $TMP/bytes-hf $TMP/corpus.txt 256 $TMP/byte-data/train_*.bin $TMP/byte-data/val_*.bin
    if need_py export_sharded_bf16_loads_in_transformers torch; then
        $UST export $TMP/bytes/ckpt --to hf $TMP/shard-bf16-hf --dtype bf16 --max-shard-size 20KB >/dev/null 2>&1
        out=$(python3 -c "
import sys, torch, transformers
m, info = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], output_loading_info=True)
print('loaded', m.dtype, {k: v for k, v in info.items() if v})" $TMP/shard-bf16-hf 2>&1 | tail -1)
        [ "$out" = "loaded torch.bfloat16 {}" ] && pass export_sharded_bf16_loads_in_transformers ||
            fail export_sharded_bf16_loads_in_transformers "$out"
    fi
fi
