#!/usr/bin/env bash
# The tokenizers of imported model families against the Hugging Face `tokenizers` library, on
# 10 MB of generated multilingual text (tok_reference.py corpus: mixed scripts, accents composed
# and decomposed, fullwidth/compatibility characters, characters newer than Unicode 9.0, digit
# and whitespace runs, emoji, special-token text). Eight small tokenizers are trained with
# `tokenizers` itself in the shapes the families use: qwen2 (NFC + Split + ByteLevel),
# nfkc_digits (NFKC + Digits individual + ByteLevel), runs (NFD + Digits runs + Llama-3 Split),
# llama2 (Prepend/Replace normalizers, byte_fallback, Strip decoder), mistral (Metaspace prepend
# first), gemma (Replace normalizer, missing <0xXX>: fused unk), metasplit (NFKC, Split on a
# string, Metaspace split, Digits), unigram (T5-style Unigram model: NFKC, Metaspace, Viterbi
# with byte fallback and fused unk). For each: `data prep` writes every token as tokenizers'
# encode does (10 MB), and decoding every document (test_tokenizer decode: the whole text, and
# the ids after a prompt as generate prints them) gives tokenizers' decode. Unsupported
# normalizer/pre-tokenizer/model/decoder types exit 2 naming the JSON path and the value.
. "$(dirname "$0")/../lib.sh"

REF="python3 test/tools/tok_reference.py"
TT=${TT:-${BUILD:-build}/test/test_tokenizer}
need_py tok_families_needs_tokenizers tokenizers || exit 0
export RAYON_NUM_THREADS=1
C=$TMP/corpus
$REF corpus $C ${TOK_MB:-10} || { fail tok_families_corpus "generating the corpus failed"; exit 0; }
eot_of() { python3 -c "import json,sys; print([a['id'] for a in json.load(open(sys.argv[1]))['added_tokens'] if a['content'] in ('<|endoftext|>', '</s>')][0])" "$1"; }

for k in ${TOK_KINDS:-qwen2 nfkc_digits runs llama2 mistral gemma metasplit unigram}; do
    if ! $REF train $k $C $TMP/$k.json; then fail tok_${k}_tokenizer_trains "tokenizers training failed"; continue; fi
    out=$($UST data prep --tokenizer $TMP/$k.json --out $TMP/$k --threads 2 $C/docs.jsonl 2>&1) &&
        out=$($REF check $TMP/$k.json $(eot_of $TMP/$k.json) $TMP/$k $TMP/$k.ids $C/docs.jsonl 2>&1) &&
        pass tok_${k}_data_prep_matches_tokenizers_on_10mb ||
        fail tok_${k}_data_prep_matches_tokenizers_on_10mb "$(echo "$out" | tail -4)"
    out=$($TT decode $TMP/$k.json $TMP/$k.ids $TMP/$k.out 2>&1) &&
        out=$($REF decoded $TMP/$k.json $TMP/$k.ids $TMP/$k.out 2>&1) &&
        pass tok_${k}_decode_matches_tokenizers ||
        fail tok_${k}_decode_matches_tokenizers "$(echo "$out" | tail -4)"
done

# --- unsupported types exit 2 naming the JSON path of the key and the value
bad() { # bad NAME PY-EDIT PATTERN: the qwen2 tokenizer edited by PY-EDIT (on j) is refused
    python3 -c "import json,sys; j=json.load(open(sys.argv[1])); $2; json.dump(j, open(sys.argv[2], 'w'))" \
        $TMP/qwen2.json $TMP/$1.json
    expect_exit tok_$1_exits_2 2 "$3" -- $UST data prep --tokenizer $TMP/$1.json --out $TMP/x $C/train.txt
}
bad unknown_normalizer "j['normalizer'] = {'type': 'Sequence', 'normalizers': [{'type': 'NFC'}, {'type': 'BertNormalizer'}]}" \
    "normalizer.normalizers\[1\].type 'BertNormalizer' is not supported"
bad unknown_pretokenizer "j['pre_tokenizer']['pretokenizers'][0] = {'type': 'Whitespace'}" \
    "pre_tokenizer.pretokenizers\[0\].type 'Whitespace' is not supported"
bad unknown_model "j['model']['type'] = 'WordPiece'" "model.type 'WordPiece' is not supported"
bad unknown_decoder "j['decoder'] = {'type': 'Sequence', 'decoders': [{'type': 'CTC'}]}" \
    "decoder.decoders\[0\].type 'CTC' is not supported"
bad regex_replace "j['normalizer'] = {'type': 'Replace', 'pattern': {'Regex': ' +'}, 'content': ' '}" \
    "normalizer.pattern: a Replace normalizer needs"
bad metaspace_scheme "j['pre_tokenizer'] = {'type': 'Metaspace', 'replacement': '_', 'prepend_scheme': 'sometimes', 'split': True}" \
    "pre_tokenizer.prepend_scheme 'sometimes' is not one of always, first, never"
