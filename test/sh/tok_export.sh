#!/usr/bin/env bash
# tokenizer_config.json of an export: transformers' AutoTokenizer.from_pretrained(export) must
# encode the training data's text to its exact tokens for every family ustrain exports (GPT-2,
# Llama, Qwen2, Mixtral) whatever the tokenizer: tokenizers of other families' shapes (trained
# with `tokenizers` by tok_reference.py: NFKC + Digits, Llama 2's SentencePiece-style BPE,
# Mistral's Metaspace, Qwen2's own, Gemma's) and ustrain's byte tokens. transformers 5 builds
# its own Qwen2Tokenizer for model_type qwen2 whatever tokenizer_class says (a hard-wired NFC +
# Qwen2 regex): the export's auto_map makes it load tokenizer.json as it is.
. "$(dirname "$0")/../lib.sh"

REF="python3 test/tools/tok_reference.py"
need_py tok_export_needs_transformers tokenizers transformers || exit 0
export RAYON_NUM_THREADS=1
C=$TMP/corpus
$REF corpus $C 0.15 || { fail tok_export_corpus "generating the corpus failed"; exit 0; }
# byte tokens spell out "<|endoftext|>" where the synthesized tokenizer.json matches it (docs/huggingface.md)
sed 's/<|endoftext|>/<|end-of-text|>/g' $C/docs.jsonl >$C/plain.jsonl
cases=""
# one TAG ARCH-YAML TOKENIZER: data prep, 2 steps of a tiny model, export
one() {
    local tag=$1 model=$2 tk=$3 prep=() docs=$C/docs.jsonl
    if [ "$tk" != bytes ]; then
        $REF train $tk $C $TMP/$tk.json 2>/dev/null || [ -f $TMP/$tk.json ] ||
            { fail tok_export_${tag}_trains "tokenizers training failed"; return; }
        prep=(--tokenizer $TMP/$tk.json)
    else
        docs=$C/plain.jsonl
    fi
    $UST data prep "${prep[@]}" --out $TMP/$tag-data --threads 1 $docs >$TMP/$tag.log 2>&1 ||
        { fail tok_export_${tag}_data_prep "$(tail -2 $TMP/$tag.log)"; return; }
    local v=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" $TMP/$tag-data/meta.json)
    cat >$TMP/$tag.yaml <<EOT
run:   {name: $tag, seed: 3, out_dir: $TMP/$tag}
model: {n_layer: 1, d_model: 32, n_head: 2, n_kv_head: 2, d_ff: 48, vocab_size: $v, max_seq_len: 32, $model}
train: {steps: 2, seq_len: 32, micro_batch_size: 1, global_batch_size: 2}
data:  {train: "$TMP/$tag-data/train_*.bin", val: null}
checkpoint: {dir: $TMP/$tag/ckpt, every: 2}
logging: {metrics_file: $TMP/$tag/metrics.jsonl}
EOT
    $UST train $TMP/$tag.yaml >>$TMP/$tag.log 2>&1 && $UST export $TMP/$tag/ckpt --to hf $TMP/$tag-hf >>$TMP/$tag.log 2>&1 ||
        { fail tok_export_${tag}_trains_and_exports "$(tail -2 $TMP/$tag.log)"; return; }
    cases="$cases $TMP/$tag-hf $TMP/$tag-data $docs"
}
one qwen2_nfkc_digits "arch: llama, qkv_bias: true" nfkc_digits
one qwen2_llama2 "arch: llama, qkv_bias: true" llama2
one qwen2_bytes "arch: llama, qkv_bias: true" bytes
one qwen2_qwen2 "arch: llama, qkv_bias: true" qwen2
one llama_llama2 "arch: llama" llama2
one mixtral_mistral "arch: llama, moe: {num_experts: 2, top_k: 1, d_ff_expert: 32}" mistral
one gpt2_gemma "arch: gpt2" gemma
one gpt2_bytes "arch: gpt2" bytes
python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('model_type'))" $TMP/qwen2_bytes-hf/config.json | grep -qx qwen2 &&
    pass tok_export_qwen2_config_is_model_type_qwen2 || fail tok_export_qwen2_config_is_model_type_qwen2 "$(head -c 300 $TMP/qwen2_bytes-hf/config.json)"
$REF autotokenizer $cases 2>$TMP/at.err || fail tok_export_autotokenizer_runs "$(tail -3 $TMP/at.err)"
