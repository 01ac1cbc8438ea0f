/* hf_tok: tokenizer.json, tokenizer_config.json and generation_config.json of an export
 * (hf_tok.h).
 *
 * The byte tokenizer. ustrain's byte tokens are id = byte value, with end of text 256. A
 * `tokenizers` byte-level BPE does the same with no merges at all: the ByteLevel pre-tokenizer
 * maps every byte b to the character bytes_to_unicode(b) (GPT-2's table: printable Latin-1
 * characters stand for themselves, the others are moved to U+0100 and up, in byte order), and a
 * vocabulary that gives that character the id b turns every byte into its own token. GPT-2's
 * regex only decides where words split, and without merges a split changes nothing, so the
 * regex is kept (ustrain's own data prep then reads the file too). The ByteLevel decoder maps the
 * characters back to bytes. <|endoftext|> is an added special token, id 256. */
#include "hf_tok.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "fs.h"
#include "hf_config.h"
#include "hf_map.h"
#include "sha256.h"

enum { BYTE_EOT = 256 };

/* ---------------------------------------------------------------------------------------------
 * GPT-2's bytes_to_unicode */

static int printable_latin1(int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* The code point standing for byte b. */
static unsigned byte_char(int b) {
    if (printable_latin1(b)) return (unsigned)b;
    unsigned n = 0;
    for (int i = 0; i < b; i++) n += !printable_latin1(i);
    return 256 + n;
}

/* UTF-8 of a code point below U+0800 (byte_char's are below U+0144). */
static void utf8(unsigned cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
    }
}

static cJSON *byte_level(int prefix, int regex) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "type", "ByteLevel");
    cJSON_AddBoolToObject(j, "add_prefix_space", prefix);
    cJSON_AddBoolToObject(j, "trim_offsets", 1);
    cJSON_AddBoolToObject(j, "use_regex", regex);
    return j;
}

static cJSON *added_token(int id, const char *content) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "id", id);
    cJSON_AddStringToObject(j, "content", content);
    cJSON_AddBoolToObject(j, "single_word", 0);
    cJSON_AddBoolToObject(j, "lstrip", 0);
    cJSON_AddBoolToObject(j, "rstrip", 0);
    cJSON_AddBoolToObject(j, "normalized", 0);
    cJSON_AddBoolToObject(j, "special", 1);
    return j;
}

static cJSON *bytes_model(void) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "type", "BPE");
    cJSON_AddNullToObject(m, "dropout");
    cJSON_AddNullToObject(m, "unk_token");
    cJSON_AddNullToObject(m, "continuing_subword_prefix");
    cJSON_AddNullToObject(m, "end_of_word_suffix");
    cJSON_AddBoolToObject(m, "fuse_unk", 0);
    cJSON_AddBoolToObject(m, "byte_fallback", 0);
    cJSON_AddBoolToObject(m, "ignore_merges", 0);
    cJSON *vocab = cJSON_AddObjectToObject(m, "vocab");
    for (int b = 0; b < 256; b++) {
        char s[4];
        utf8(byte_char(b), s);
        cJSON_AddNumberToObject(vocab, s, b);
    }
    cJSON_AddArrayToObject(m, "merges"); /* none: every byte stays its own token */
    return m;
}

cJSON *hftok_bytes_tokenizer(int vocab_size) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "version", "1.0");
    cJSON_AddNullToObject(j, "truncation");
    cJSON_AddNullToObject(j, "padding");
    cJSON *added = cJSON_AddArrayToObject(j, "added_tokens");
    if (vocab_size > BYTE_EOT) cJSON_AddItemToArray(added, added_token(BYTE_EOT, "<|endoftext|>"));
    cJSON_AddNullToObject(j, "normalizer");
    cJSON_AddItemToObject(j, "pre_tokenizer", byte_level(0, 1));
    cJSON_AddNullToObject(j, "post_processor");
    cJSON_AddItemToObject(j, "decoder", byte_level(1, 1));
    cJSON_AddItemToObject(j, "model", bytes_model());
    return j;
}

/* ---------------------------------------------------------------------------------------------
 * Reading the checkpoint's record */

/* A tokenizer.json: Llama 3's is 9 MB, 256 MiB is far beyond any real one. */
static char *read_file(const char *path, ust_err *e) {
    return fs_read_file(path, 256u << 20, NULL, e);
}

/* The string of token id in a tokenizer.json: an added token's content, else the vocabulary's
 * entry ("" when neither has it). */
static int token_string(const char *path, int id, char *out, size_t n, ust_err *e) {
    char *text = read_file(path, e);
    if (!text) return -1;
    if (hf_json_refuse_nul(text, strlen(text), path, e)) {
        free(text);
        return -1;
    }
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) return ust_errf(e, "%s: not valid JSON (a Hugging Face tokenizer.json)", path);
    out[0] = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(j, "added_tokens")) {
        const cJSON *xid = cJSON_GetObjectItemCaseSensitive(x, "id"),
                    *s = cJSON_GetObjectItemCaseSensitive(x, "content");
        if (cJSON_IsNumber(xid) && xid->valueint == id && cJSON_IsString(s))
            snprintf(out, n, "%s", s->valuestring);
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(model, "vocab")) {
        if (!out[0] && cJSON_IsNumber(x) && x->valueint == id) snprintf(out, n, "%s", x->string);
    }
    cJSON_Delete(j);
    return 0;
}

static int check_file(const hftok_info *t, const char *step, ust_err *e) {
    char hex[SHA256_HEX_LEN + 1];
    ust_err inner;
    if (access(t->path, F_OK) != 0)
        return ust_errf(e,
                        "export: the tokenizer %s that %s/state.json records is missing (%s); "
                        "export with --no-tokenizer to leave it out",
                        t->path, step, strerror(errno));
    if (sha256_file(t->path, hex, &inner)) return ust_errf(e, "export: tokenizer %s", inner.msg);
    if (t->sha256[0] && strcmp(hex, t->sha256) != 0)
        return ust_errf(e,
                        "export: the tokenizer %s has changed since the training data was made "
                        "(SHA-256 %s, %s/state.json records %s); export with --no-tokenizer to "
                        "leave it out",
                        t->path, hex, step, t->sha256);
    return 0;
}

int hftok_from_state(hftok_info *t, const cJSON *state, const char *step, int vocab_size,
                     bool skip_file, ust_err *e) {
    memset(t, 0, sizeof *t);
    t->eot = -1;
    t->vocab_size = vocab_size;
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(state, "tokenizer");
    if (!tok) return 0;
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(tok, "path"),
                *sha = cJSON_GetObjectItemCaseSensitive(tok, "sha256"),
                *eot = cJSON_GetObjectItemCaseSensitive(tok, "eot_id");
    if (!cJSON_IsString(path) || (eot && !cJSON_IsNumber(eot) && !cJSON_IsNull(eot)))
        return ust_errf(e,
                        "export: %s/state.json: \"tokenizer\" is not {\"path\", \"sha256\", "
                        "\"eot_id\"}",
                        step);
    t->present = true;
    t->bytes = strcmp(path->valuestring, "bytes") == 0;
    snprintf(t->path, sizeof t->path, "%s", path->valuestring);
    if (cJSON_IsString(sha)) snprintf(t->sha256, sizeof t->sha256, "%s", sha->valuestring);
    if (cJSON_IsNumber(eot)) {
        double v = eot->valuedouble; /* valueint saturates: 2^40 would read as INT_MAX */
        if (v != floor(v) || v < -1 || v >= vocab_size)
            return ust_errf(e,
                            "export: %s/state.json: the tokenizer's eot_id %g is not a token of "
                            "the model's vocabulary (0..%d)",
                            step, v, vocab_size - 1);
        t->eot = (int)v;
    }
    if (t->bytes) {
        if (t->eot == BYTE_EOT && vocab_size > BYTE_EOT)
            snprintf(t->eot_token, sizeof t->eot_token, "<|endoftext|>");
        else if (t->eot >= 0 && t->eot < BYTE_EOT)
            utf8(byte_char(t->eot), t->eot_token);
        return 0;
    }
    if (skip_file) return 0;
    if (check_file(t, step, e)) return -1;
    return t->eot >= 0 ? token_string(t->path, t->eot, t->eot_token, sizeof t->eot_token, e) : 0;
}

/* ---------------------------------------------------------------------------------------------
 * Writing */

static int write_synced(FILE *f, const char *path, const void *p, size_t n, ust_err *e) {
    int rc = n && fwrite(p, 1, n, f) != n ? -1 : 0;
    if (!rc && (fflush(f) != 0 || fsync(fileno(f)) != 0)) rc = -1;
    if (fclose(f) != 0) rc = -1;
    return rc ? ust_errf(e, "export: cannot write %s: %s", path, strerror(errno)) : 0;
}

int hftok_write_tokenizer(const hftok_info *t, const char *path, ust_err *e) {
    char *text;
    if (t->bytes) {
        cJSON *j = hftok_bytes_tokenizer(t->vocab_size);
        text = cJSON_Print(j);
        cJSON_Delete(j);
        if (!text) return ust_errf(e, "export: out of memory");
    } else if (!(text = read_file(t->path, e))) {
        return -1;
    }
    ust_err inner;
    FILE *f = fs_fopen_regular(path, "wb", &inner);
    int rc =
        f ? write_synced(f, path, text, strlen(text), e) : ust_errf(e, "export: %s", inner.msg);
    free(text);
    return rc;
}

/* transformers 5 (tokenization_auto.py, MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS) ignores the
 * tokenizer_class of these model types and builds its own class, which rebuilds the pipeline
 * from the vocabulary with that family's hard-wired normalizer and pre-tokenizer (a Qwen2 export
 * of a GPT-2-style tokenizer: 101 of 103 documents differ). An "auto_map" makes AutoTokenizer,
 * without trust_remote_code, skip that override and load tokenizer_class, i.e. tokenizer.json
 * as it is (measured with transformers 5.25). */
static const char *const FORCED_CLASS[] = {"qwen2",     "phi3",     "phimoe",
                                           "nemotron",  "jamba",    "internlm2",
                                           "internlm3", "ernie4_5", "ernie4_5_moe"};

static bool forced_class(const ust_config *c) {
    cJSON *mc = hf_config_json(c, -1, -1);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(mc, "model_type");
    bool forced = false;
    for (size_t i = 0; cJSON_IsString(mt) && i < sizeof FORCED_CLASS / sizeof *FORCED_CLASS; i++)
        forced |= strcmp(mt->valuestring, FORCED_CLASS[i]) == 0;
    cJSON_Delete(mc);
    return forced;
}

cJSON *hftok_tokenizer_config(const hftok_info *t, const ust_config *c) {
    cJSON *j = cJSON_CreateObject();
    if (t->eot_token[0]) {
        cJSON_AddStringToObject(j, "bos_token", t->eot_token);
        cJSON_AddStringToObject(j, "eos_token", t->eot_token);
        cJSON_AddStringToObject(j, "pad_token", t->eot_token);
    }
    cJSON_AddBoolToObject(j, "clean_up_tokenization_spaces", 0);
    cJSON_AddNumberToObject(j, "model_max_length", c->model.max_seq_len);
    cJSON_AddStringToObject(j, "tokenizer_class", "PreTrainedTokenizerFast");
    if (forced_class(c)) {
        cJSON *am = cJSON_AddObjectToObject(j, "auto_map");
        cJSON *pair = cJSON_AddArrayToObject(am, "AutoTokenizer");
        cJSON_AddItemToArray(pair, cJSON_CreateNull());
        cJSON_AddItemToArray(pair, cJSON_CreateString("PreTrainedTokenizerFast"));
    }
    return j;
}

cJSON *hftok_generation_config(const hftok_info *t) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddBoolToObject(j, "_from_model_config", 1);
    if (t->eot >= 0) {
        cJSON_AddNumberToObject(j, "bos_token_id", t->eot);
        cJSON_AddNumberToObject(j, "eos_token_id", t->eot);
    }
    cJSON_AddBoolToObject(j, "do_sample", 0);
    return j;
}
