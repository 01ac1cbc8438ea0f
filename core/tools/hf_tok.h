/* hf_tok: the tokenizer files of a Hugging Face export.
 * A checkpoint's state.json names the tokenizer its training data was made with (data prep's
 * meta.json, recorded by train: {"path", "sha256", "eot_id"}). hftok_from_state reads that and
 * checks, before anything is written, that the file is still there with the recorded digest;
 * hftok_write_tokenizer then puts tokenizer.json into the export: a copy of the file, or for byte
 * tokens ("path": "bytes") a synthesized byte-level BPE that encodes exactly as ustrain's byte
 * tokenizer does (id = byte, <|endoftext|> = 256). The JSON builders make tokenizer_config.json
 * (so that AutoTokenizer encodes with tokenizer.json as it is) and generation_config.json. */
#ifndef UST_HF_TOK_H
#define UST_HF_TOK_H

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdbool.h>

#include "config.h"
#include "error.h"

typedef struct {
    bool present;        /* state.json names a tokenizer */
    bool bytes;          /* ustrain's byte tokens: tokenizer.json is synthesized */
    char path[PATH_MAX]; /* the tokenizer.json (not bytes) */
    char sha256[65];     /* its recorded digest ("" when none was recorded) */
    int eot;             /* the end-of-text id, -1 when the data had none */
    char eot_token[256]; /* its string ("" when the tokenizer has no such id) */
    int vocab_size;      /* the model's, for the byte tokenizer's end-of-text token */
} hftok_info;

/* t from state.json's "tokenizer" (state: the parsed state.json; step names it in messages).
 * With a tokenizer file (and !skip_file): it must exist and have the recorded SHA-256, else -1
 * naming the file (skip_file: --no-tokenizer, only the ids are used). No "tokenizer": !present. */
int hftok_from_state(hftok_info *t, const cJSON *state, const char *step, int vocab_size,
                     bool skip_file, ust_err *e);

/* Writes tokenizer.json to path: the recorded file copied, or the byte-level one built. */
int hftok_write_tokenizer(const hftok_info *t, const char *path, ust_err *e);

/* tokenizer_config.json for the model c: PreTrainedTokenizerFast (transformers 5's
 * TokenizersBackend, tokenizer.json as it is), bos/eos/pad = the end-of-text token,
 * model_max_length = max_seq_len; see hf_tok.c for the model types that also need an auto_map. */
cJSON *hftok_tokenizer_config(const hftok_info *t, const ust_config *c);
/* generation_config.json: bos/eos ids as transformers' GenerationConfig writes them. */
cJSON *hftok_generation_config(const hftok_info *t);

/* The byte-level tokenizer.json for ustrain's byte tokens: ids 0..255 the bytes, and
 * <|endoftext|> = 256 when the model's vocabulary has room for it (vocab_size > 256). */
cJSON *hftok_bytes_tokenizer(int vocab_size);

#endif
