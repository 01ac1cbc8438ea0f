/* tokenizer: the Hugging Face `tokenizers` encode pipeline for BPE, step for step:
 *   1. added tokens that are not "normalized" are cut out of the text, leftmost-longest,
 *      honouring single_word / lstrip / rstrip; the pieces between them are normalized
 *      (tok_norm.c), then the "normalized" added tokens are cut out of those;
 *   2. each remaining piece goes through the pre-tokenizer stages (Split on a regex or a string,
 *      Digits, Metaspace, ByteLevel with its optional prefix space and GPT-2 regex);
 *   3. each pre-token becomes the vocabulary's symbols, one per byte for byte-level BPE, else one
 *      per character (a character missing from the vocabulary becomes its <0xXX> byte tokens with
 *      byte_fallback, else unk_token), merged by BPE in merge rank order (lowest rank first,
 *      leftmost first), as `tokenizers`' BPE::merge_word and Word::merge_all do.
 * A byte-level vocabulary is kept as raw bytes: ByteLevel's byte -> printable-character map is
 * undone at load time, so encoding never builds the mapped strings. The regexes are scanners that
 * follow the alternation order and backtracking of the patterns (see pretok_gpt2/pretok_llama3).
 * Metaspace's "first" prepend scheme holds only for the piece at offset 0 of the input text
 * (`tokenizers` checks offsets_original().0 == 0), which the pipeline carries as at0. */
#include "tokenizer.h"
#include "fs.h"
#include "hf_config.h"
#include "tok_dec.h"
#include "tok_norm.h"
#include "tok_unigram.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

enum { CL_OTHER = 0, CL_L = 1, CL_N = 2, CL_S = 3 };
enum { MAX_STAGES = 8 };

#define GPT2_PATTERN                                                                               \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define LLAMA3_PATTERN                                                                             \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                     \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN2_PATTERN                                                                              \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "                          \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* ---------------------------------------------------------------------------------------------
 * Hash maps: byte string -> id (the vocabulary) and id pair -> (rank, merged id) (the merges). */

typedef struct {
    uint32_t off, len;
    int32_t id; /* -1: empty slot */
} str_slot;

typedef struct {
    str_slot *slot;
    uint64_t mask;
    char *pool;
    size_t pool_n, pool_cap;
} strmap;

typedef struct {
    uint64_t key; /* a << 32 | b; UINT64_MAX: empty */
    int32_t rank, new_id;
} pair_slot;

typedef struct {
    pair_slot *slot;
    uint64_t mask;
} pairmap;

static uint64_t hash_bytes(const unsigned char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    return k ^ (k >> 33);
}

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static void strmap_init(strmap *m, size_t n) {
    uint64_t cap = pow2_at_least(2 * n + 1);
    m->slot = malloc(cap * sizeof *m->slot);
    UST_ASSERT(m->slot, "out of memory (%llu map slots)", (unsigned long long)cap);
    for (uint64_t i = 0; i < cap; i++) m->slot[i].id = -1;
    m->mask = cap - 1;
    /* never NULL: an empty key (a vocabulary entry "") still points into the pool */
    m->pool_cap = 4096;
    m->pool = malloc(m->pool_cap);
    UST_ASSERT(m->pool, "out of memory (vocabulary pool)");
    m->pool_n = 0;
}

static int32_t strmap_get(const strmap *m, const void *s, size_t n) {
    for (uint64_t i = hash_bytes(s, n) & m->mask;; i = (i + 1) & m->mask) {
        const str_slot *x = &m->slot[i];
        if (x->id < 0) return -1;
        if (x->len == n && memcmp(m->pool + x->off, s, n) == 0) return x->id;
    }
}

/* Inserts or overwrites (the map is sized at init for every key it will hold). */
static void strmap_put(strmap *m, const void *s, size_t n, int32_t id) {
    uint64_t i = hash_bytes(s, n) & m->mask;
    for (; m->slot[i].id >= 0; i = (i + 1) & m->mask) {
        str_slot *x = &m->slot[i];
        if (x->len == n && memcmp(m->pool + x->off, s, n) == 0) {
            x->id = id;
            return;
        }
    }
    if (m->pool_n + n > m->pool_cap) {
        m->pool_cap = 2 * (m->pool_n + n) + 4096;
        m->pool = realloc(m->pool, m->pool_cap);
        UST_ASSERT(m->pool, "out of memory (vocabulary pool of %zu bytes)", m->pool_cap);
    }
    memcpy(m->pool + m->pool_n, s, n);
    m->slot[i] = (str_slot){.off = (uint32_t)m->pool_n, .len = (uint32_t)n, .id = id};
    m->pool_n += n;
}

static void pairmap_init(pairmap *m, size_t n) {
    uint64_t cap = pow2_at_least(2 * n + 1);
    m->slot = malloc(cap * sizeof *m->slot);
    UST_ASSERT(m->slot, "out of memory (%llu merge slots)", (unsigned long long)cap);
    for (uint64_t i = 0; i < cap; i++) m->slot[i].key = UINT64_MAX;
    m->mask = cap - 1;
}

static inline uint64_t pair_key(int32_t a, int32_t b) {
    return (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
}

static inline const pair_slot *pairmap_get(const pairmap *m, int32_t a, int32_t b) {
    uint64_t k = pair_key(a, b);
    for (uint64_t i = hash_pair(k) & m->mask;; i = (i + 1) & m->mask) {
        const pair_slot *x = &m->slot[i];
        if (x->key == k) return x;
        if (x->key == UINT64_MAX) return NULL;
    }
}

/* A repeated pair keeps its last rank, as `tokenizers` builds its merge map. */
static void pairmap_put(pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t new_id) {
    uint64_t k = pair_key(a, b), i = hash_pair(k) & m->mask;
    while (m->slot[i].key != UINT64_MAX && m->slot[i].key != k) i = (i + 1) & m->mask;
    m->slot[i] = (pair_slot){.key = k, .rank = rank, .new_id = new_id};
}

/* ---------------------------------------------------------------------------------------------
 * The tokenizer */

typedef struct {
    char *content;
    size_t len;
    int32_t id;
    bool single_word, lstrip, rstrip, normalized;
} added_token;

typedef enum { ST_REGEX, ST_DIGITS, ST_METASPACE, ST_SPLIT } stage_kind;
/* SplitDelimiterBehavior, in `tokenizers`' order */
typedef enum { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS } split_behavior;
typedef enum { PREPEND_NEVER, PREPEND_FIRST, PREPEND_ALWAYS } prepend_scheme;

typedef struct {
    stage_kind kind;
    tok_split split;   /* ST_REGEX: the regex (NONE: no split) */
    bool prefix_space; /* ByteLevel add_prefix_space: " " before every piece not starting so */
    split_behavior behavior; /* ST_SPLIT (Digits: Isolated, or Contiguous for runs) */
    bool invert;             /* ST_SPLIT: the pieces between matches are the delimiters */
    prepend_scheme prepend;  /* ST_METASPACE */
    bool split_on;           /* ST_METASPACE: split before every replacement character */
    char pat[64];            /* ST_SPLIT: the string; ST_METASPACE: the replacement */
    size_t pat_len;
} stage;

struct tok_tokenizer {
    bool bpe;        /* false: raw bytes */
    bool byte_level; /* a ByteLevel pre-tokenizer: symbols are bytes, else characters */
    int vocab_size, eot;
    char describe[160];
    int nstages;
    stage stages[MAX_STAGES];
    tok_norm norm;
    tok_dec *decoder;
    tok_unigram *uni;      /* a Unigram model (else BPE) */
    int32_t byte_id[256];  /* the single-byte symbol of each byte, -1 when the vocab lacks it */
    int32_t fallback[256]; /* byte_fallback: the id of <0xXX>, -1 without (or none) */
    strmap vocab;          /* raw bytes (byte-level) or the string -> id */
    pairmap merges;
    bool ignore_merges, fuse_unk, cuttable, byte_fallback;
    int32_t unk_id;
    added_token *added;
    int nadded;
    /* per pass (0: non-normalized tokens, 1: normalized ones): the tokens starting with each
     * byte, longest first, as [first[b], first[b+1]) in by_first */
    int first[2][257];
    int *by_first[2];
    /* decoding: id -> its bytes (dec NULL for raw bytes, whose id is the byte); dec0: as the
     * first token of a text (NULL when the same) */
    char **dec, **dec0;
    size_t *dec_len, *dec0_len;
    unsigned char byte_tab[256]; /* raw bytes: byte_tab[b] = b */
};

typedef struct {
    int32_t rank, pos, new_id;
} merge_item;

struct tok_work {
    /* BPE symbols (a doubly linked list over an array, as `tokenizers`' Word) */
    int32_t *sym, *prev, *next, *len;
    merge_item *heap;
    size_t cap, heap_cap;
    char *pfx[MAX_STAGES]; /* a piece with its prefix space (or metaspaces), per stage */
    size_t pfx_cap[MAX_STAGES];
    tok_buf norm, norm_tmp; /* a normalized piece */
    tok_unigram_work *uw;
};

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 to U+0100.. */
static void byte_level_map(unsigned int map[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        map[b] = printable ? (unsigned)b : 256u + (unsigned)n++;
    }
}

tok_tokenizer *tok_bytes(void) {
    tok_tokenizer *t = calloc(1, sizeof *t);
    UST_ASSERT(t, "out of memory");
    t->vocab_size = 257;
    t->eot = 256;
    for (int b = 0; b < 256; b++) t->byte_tab[b] = (unsigned char)b;
    t->cuttable = true;
    snprintf(t->describe, sizeof t->describe, "bytes");
    return t;
}

void tok_free(tok_tokenizer *t) {
    if (!t) return;
    free(t->vocab.slot);
    free(t->vocab.pool);
    free(t->merges.slot);
    for (int i = 0; i < t->nadded; i++) free(t->added[i].content);
    free(t->added);
    free(t->by_first[0]);
    free(t->by_first[1]);
    for (int i = 0; t->dec && i < t->vocab_size; i++) free(t->dec[i]);
    for (int i = 0; t->dec0 && i < t->vocab_size; i++) free(t->dec0[i]);
    free(t->dec);
    free(t->dec_len);
    free(t->dec0);
    free(t->dec0_len);
    tok_norm_free(&t->norm);
    tok_dec_free(t->decoder);
    tok_unigram_free(t->uni);
    free(t);
}

int tok_vocab_size(const tok_tokenizer *t) { return t->vocab_size; }

int tok_decode(const tok_tokenizer *t, int32_t id, const char **s, size_t *len) {
    if (id < 0 || id >= t->vocab_size) return -1;
    if (!t->bpe) { /* the byte itself; end of text has no bytes */
        *s = (const char *)&t->byte_tab[id < 256 ? id : 0], *len = id < 256;
        return 0;
    }
    if (!t->dec[id]) return -1;
    *s = t->dec[id], *len = t->dec_len[id];
    return 0;
}

char *tok_decode_text(const tok_tokenizer *t, const int32_t *ids, size_t n, size_t *len) {
    tok_buf b = {0};
    tok_buf_reserve(&b, 16);
    for (size_t i = 0; i < n; i++) {
        const char *s;
        size_t k;
        if (tok_decode(t, ids[i], &s, &k) != 0) {
            free(b.p);
            return NULL;
        }
        if (i == 0 && t->dec0 && t->dec0[ids[0]]) s = t->dec0[ids[0]], k = t->dec0_len[ids[0]];
        tok_buf_put(&b, s, k);
    }
    const char *s = b.p;
    size_t k = b.n;
    if (t->decoder) tok_dec_strip_text(t->decoder, &s, &k);
    memmove(b.p, s, k);
    *len = k;
    return b.p;
}
int tok_eot(const tok_tokenizer *t) { return t->eot; }
const char *tok_describe(const tok_tokenizer *t) { return t->describe; }

/* ---------------------------------------------------------------------------------------------
 * Loading tokenizer.json */

static char *read_file(const char *path, size_t *n, ust_err *e) {
    FILE *f = fs_fopen_regular(path, "rb", e);
    if (!f) return NULL;
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap + 1);
    for (size_t r; buf && (r = fread(buf + len, 1, cap - len, f)) > 0;) {
        len += r;
        if (len == cap) buf = realloc(buf, (cap *= 2) + 1);
    }
    UST_ASSERT(buf, "out of memory reading %s", path);
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        ust_errf(e, "%s: read error", path);
        return NULL;
    }
    buf[len] = 0;
    *n = len;
    return buf;
}

/* Decodes one UTF-8 character at s[i] (n bytes available); invalid bytes decode as themselves
 * with length 1 and code point 0xFFFFFFFF (class "other"). */
static inline uint32_t utf8_at(const unsigned char *s, size_t n, size_t i, int *len) {
    unsigned c = s[i];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    int k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (k == 0 || c > 0xF4 || i + k > n) goto bad;
    uint32_t cp = c & (0x3F >> (k - 1));
    for (int j = 1; j < k; j++) {
        if ((s[i + j] & 0xC0) != 0x80) goto bad;
        cp = cp << 6 | (s[i + j] & 0x3F);
    }
    if ((k == 3 && (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000))) || (k == 4 && cp < 0x10000) ||
        cp > 0x10FFFF)
        goto bad;
    *len = k;
    return cp;
bad:
    *len = 1;
    return 0xFFFFFFFFu;
}

/* A vocabulary string in ByteLevel's alphabet -> its raw bytes; -1 when a character is outside
 * the alphabet (such a token can only come from the added-token pass). */
static int unmap_bytes(const char *s, const int16_t inv[512], unsigned char *out, size_t *n) {
    size_t len = strlen(s), k = 0;
    if (!inv) { /* not byte-level: the string itself */
        memcpy(out, s, len);
        *n = len;
        return 0;
    }
    for (size_t i = 0; i < len;) {
        int l;
        uint32_t cp = utf8_at((const unsigned char *)s, len, i, &l);
        if (cp >= 512 || inv[cp] < 0) return -1;
        out[k++] = (unsigned char)inv[cp];
        i += (size_t)l;
    }
    *n = k;
    return 0;
}

static bool json_bool(const cJSON *o, const char *key, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static const char *json_type(const cJSON *o) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(v) ? v->valuestring : "";
}

static int add_stage(tok_tokenizer *t, stage st, const char *path, const char *where, ust_err *e) {
    if (t->nstages == MAX_STAGES)
        return ust_errf(e, "%s: %s: more than %d pre-tokenizer stages", path, where, MAX_STAGES);
    t->stages[t->nstages++] = st;
    return 0;
}

/* A string field of at most cap-1 bytes (pattern strings, the metaspace replacement). */
static int short_string(const cJSON *o, const char *key, char *out, size_t cap, size_t *n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v) || !v->valuestring[0] || strlen(v->valuestring) >= cap) return -1;
    strcpy(out, v->valuestring);
    *n = strlen(out);
    return 0;
}

static int load_split(tok_tokenizer *t, const cJSON *p, const char *path, const char *where,
                      ust_err *e) {
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
    stage st = {.kind = ST_SPLIT, .invert = json_bool(p, "invert", false)};
    int b = 0;
    while (b < 5 && !(cJSON_IsString(beh) && strcmp(beh->valuestring, names[b]) == 0)) b++;
    if (b == 5)
        return ust_errf(e,
                        "%s: %s.behavior '%s' is not a split behavior (Removed, Isolated, "
                        "MergedWithPrevious, MergedWithNext, Contiguous)",
                        path, where, cJSON_IsString(beh) ? beh->valuestring : "?");
    st.behavior = (split_behavior)b;
    if (!cJSON_IsString(re)) {
        if (short_string(pat, "String", st.pat, sizeof st.pat, &st.pat_len))
            return ust_errf(e,
                            "%s: %s.pattern: a Split needs {\"String\": non-empty, under 64 "
                            "bytes} or {\"Regex\": the GPT-2, Llama-3 or Qwen2 regex}",
                            path, where);
        return add_stage(t, st, path, where, e);
    }
    const char *r = re->valuestring;
    tok_split k = strcmp(r, GPT2_PATTERN) == 0     ? TOK_SPLIT_GPT2
                  : strcmp(r, LLAMA3_PATTERN) == 0 ? TOK_SPLIT_LLAMA3
                  : strcmp(r, QWEN2_PATTERN) == 0  ? TOK_SPLIT_QWEN2
                                                   : TOK_SPLIT_NONE;
    if (k == TOK_SPLIT_NONE)
        return ust_errf(e,
                        "%s: %s.pattern: Split regex '%.200s' is not supported (supported: the "
                        "GPT-2, Llama-3 and Qwen2 pre-tokenization regexes)",
                        path, where, r);
    if (st.behavior != B_ISOLATED || st.invert)
        return ust_errf(e,
                        "%s: %s: a Split on a regex with behavior %s%s is not supported "
                        "(supported: Isolated, not inverted)",
                        path, where, names[b], st.invert ? ", inverted" : "");
    return add_stage(t, (stage){.kind = ST_REGEX, .split = k}, path, where, e);
}

static int load_metaspace(tok_tokenizer *t, const cJSON *p, const char *path, const char *where,
                          ust_err *e) {
    stage st = {.kind = ST_METASPACE, .split_on = json_bool(p, "split", true)};
    if (short_string(p, "replacement", st.pat, 8, &st.pat_len))
        return ust_errf(e, "%s: %s.replacement: not a character", path, where);
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(p, "prepend_scheme");
    if (!ps) { /* files before prepend_scheme: add_prefix_space */
        st.prepend = json_bool(p, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER;
    } else {
        const char *v = cJSON_IsString(ps) ? ps->valuestring : "?";
        if (strcmp(v, "always") && strcmp(v, "first") && strcmp(v, "never"))
            return ust_errf(e, "%s: %s.prepend_scheme '%s' is not one of always, first, never",
                            path, where, v);
        st.prepend = !strcmp(v, "always")  ? PREPEND_ALWAYS
                     : !strcmp(v, "first") ? PREPEND_FIRST
                                           : PREPEND_NEVER;
    }
    return add_stage(t, st, path, where, e);
}

/* One pre-tokenizer object -> stages. Returns 1 when it was a ByteLevel, 0 otherwise, -1 error. */
static int load_pretok(tok_tokenizer *t, const cJSON *p, const char *path, const char *where,
                       ust_err *e) {
    const char *type = json_type(p);
    if (t->byte_level)
        return ust_errf(e, "%s: %s: '%s' after the ByteLevel pre-tokenizer is not supported", path,
                        where, type);
    if (strcmp(type, "ByteLevel") == 0) {
        bool re = json_bool(p, "use_regex", true);
        stage st = {.kind = ST_REGEX,
                    .split = re ? TOK_SPLIT_GPT2 : TOK_SPLIT_NONE,
                    .prefix_space = json_bool(p, "add_prefix_space", true)};
        if (add_stage(t, st, path, where, e)) return -1;
        t->byte_level = true;
        return 1;
    }
    if (strcmp(type, "Split") == 0) return load_split(t, p, path, where, e);
    if (strcmp(type, "Metaspace") == 0) return load_metaspace(t, p, path, where, e);
    if (strcmp(type, "Digits") == 0) {
        bool each = json_bool(p, "individual_digits", false);
        stage st = {.kind = ST_DIGITS, .behavior = each ? B_ISOLATED : B_CONTIGUOUS};
        return add_stage(t, st, path, where, e);
    }
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        const cJSON *x;
        int bl = 0, i = 0;
        cJSON_ArrayForEach(x, list) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.pretokenizers[%d]", where, i++);
            int r = load_pretok(t, x, path, sub, e);
            if (r < 0) return -1;
            bl |= r;
        }
        return bl;
    }
    return ust_errf(e,
                    "%s: %s.type '%s' is not supported (supported pre-tokenizers: ByteLevel, "
                    "Split on the GPT-2/Llama-3/Qwen2 regex or on a string, Digits, Metaspace, "
                    "Sequence of those)",
                    path, where, type);
}

/* Refuses the model options that change what encode returns and are not implemented. */
static int check_model(const cJSON *model, const char *path, ust_err *e) {
    const char *type = json_type(model);
    if (type[0] && strcmp(type, "BPE") != 0 && strcmp(type, "Unigram") != 0)
        return ust_errf(e, "%s: model.type '%s' is not supported (supported models: BPE, Unigram)",
                        path, type);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(d) && d->valuedouble > 0)
        return ust_errf(e, "%s: BPE dropout %g is not supported (must be null or 0)", path,
                        d->valuedouble);
    const char *bad[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, bad[i]);
        if (cJSON_IsString(v) && v->valuestring[0])
            return ust_errf(e, "%s: model.%s '%s' is not supported (must be null or \"\")", path,
                            bad[i], v->valuestring);
    }
    return 0;
}

/* The largest token id accepted: the decoder's tables are indexed by id (largest id + 1
 * entries), so one absurd id must not allocate gigabytes; real vocabularies stay far below. */
#define TOK_MAX_ID (1 << 24)

static int load_vocab(tok_tokenizer *t, const cJSON *vocab, const int16_t inv[512],
                      const char *path, ust_err *e) {
    if (!cJSON_IsObject(vocab)) return ust_errf(e, "%s: model.vocab is not an object", path);
    strmap_init(&t->vocab, (size_t)cJSON_GetArraySize(vocab));
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    unsigned char buf[1024];
    const cJSON *x;
    cJSON_ArrayForEach(x, vocab) {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= TOK_MAX_ID)
            return ust_errf(e, "%s: vocab entry '%.100s' has no valid id (0 .. %d)", path,
                            x->string, TOK_MAX_ID - 1);
        int32_t id = (int32_t)x->valuedouble;
        if (id >= t->vocab_size) t->vocab_size = id + 1;
        size_t n;
        if (strlen(x->string) >= sizeof buf || unmap_bytes(x->string, inv, buf, &n) != 0) continue;
        strmap_put(&t->vocab, buf, n, id);
        if (n == 1) t->byte_id[buf[0]] = id;
    }
    return 0;
}

/* A merge is "a b" (older files) or ["a", "b"]. */
static int merge_parts(const cJSON *m, const char **a, const char **b, char *tmp, size_t cap) {
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2) {
        const cJSON *x = cJSON_GetArrayItem(m, 0), *y = cJSON_GetArrayItem(m, 1);
        if (!cJSON_IsString(x) || !cJSON_IsString(y)) return -1;
        *a = x->valuestring;
        *b = y->valuestring;
        return 0;
    }
    if (!cJSON_IsString(m) || strlen(m->valuestring) >= cap) return -1;
    strcpy(tmp, m->valuestring);
    char *sp = strchr(tmp, ' ');
    if (!sp || strchr(sp + 1, ' ')) return -1;
    *sp = 0;
    *a = tmp;
    *b = sp + 1;
    return 0;
}

static int load_merges(tok_tokenizer *t, const cJSON *merges, const int16_t inv[512],
                       const char *path, ust_err *e) {
    int n = cJSON_GetArraySize(merges);
    pairmap_init(&t->merges, (size_t)n);
    char tmp[1024];
    unsigned char ab[2048];
    int rank = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        const char *a, *b;
        size_t na, nb;
        if (merge_parts(m, &a, &b, tmp, sizeof tmp) != 0)
            return ust_errf(e, "%s: merge %d is not \"a b\" or [\"a\", \"b\"]", path, rank);
        if (strlen(a) >= 1024 || strlen(b) >= 1024 || unmap_bytes(a, inv, ab, &na) ||
            unmap_bytes(b, inv, ab + na, &nb))
            return ust_errf(e, "%s: merge %d ('%.100s' '%.100s') is not in the byte-level alphabet",
                            path, rank, a, b);
        int32_t ia = strmap_get(&t->vocab, ab, na), ib = strmap_get(&t->vocab, ab + na, nb),
                inew = strmap_get(&t->vocab, ab, na + nb);
        if (ia < 0 || ib < 0 || inew < 0)
            return ust_errf(e, "%s: merge %d ('%.100s' '%.100s'): %s is not in the vocabulary",
                            path, rank, a, b,
                            ia < 0   ? "its left part"
                            : ib < 0 ? "its right part"
                                     : "the merged token");
        pairmap_put(&t->merges, ia, ib, rank, inew);
        rank++;
    }
    return 0;
}

static int cmp_added_len(const void *x, const void *y, void *ctx) {
    const added_token *a = ctx;
    return (int)(a[*(const int *)y].len > a[*(const int *)x].len) -
           (int)(a[*(const int *)y].len < a[*(const int *)x].len);
}

/* Indexes the added tokens of each pass by first byte, longest first (leftmost-longest). */
static void index_added(tok_tokenizer *t) {
    for (int p = 0; p < 2; p++) {
        int cnt[257] = {0};
        for (int i = 0; i < t->nadded; i++)
            if (t->added[i].normalized == (p == 1) && t->added[i].len)
                cnt[(unsigned char)t->added[i].content[0] + 1]++;
        for (int b = 0; b < 256; b++) cnt[b + 1] += cnt[b];
        memcpy(t->first[p], cnt, sizeof cnt);
        t->by_first[p] = malloc((size_t)(t->nadded + 1) * sizeof(int));
        UST_ASSERT(t->by_first[p], "out of memory");
        int fill[256];
        for (int b = 0; b < 256; b++) fill[b] = cnt[b];
        for (int i = 0; i < t->nadded; i++)
            if (t->added[i].normalized == (p == 1) && t->added[i].len)
                t->by_first[p][fill[(unsigned char)t->added[i].content[0]]++] = i;
        for (int b = 0; b < 256; b++)
            qsort_r(t->by_first[p] + cnt[b], (size_t)(cnt[b + 1] - cnt[b]), sizeof(int),
                    cmp_added_len, t->added);
    }
}

/* The id `tokenizers` gives an added token when it loads the file (the "id" field is only
 * checked, with a warning): the vocabulary's id for that exact string, else the next free id
 * counting from the number of vocabulary entries. */
static int32_t added_id(const strmap *verbatim, const char *content, int32_t *next_id) {
    int32_t id = strmap_get(verbatim, content, strlen(content));
    return id >= 0 ? id : (*next_id)++;
}

/* Which end-of-text token an added token is: 0 <|endoftext|>, 1 <|end_of_text|>, 2 a special
 * </s>, 3 a special <eos> (SentencePiece families), 4 none; the lowest present wins. */
static int eot_rank(const char *s, bool special) {
    if (strcmp(s, "<|endoftext|>") == 0) return 0;
    if (strcmp(s, "<|end_of_text|>") == 0) return 1;
    if (special && strcmp(s, "</s>") == 0) return 2;
    if (special && strcmp(s, "<eos>") == 0) return 3;
    return 4;
}

static int load_added(tok_tokenizer *t, const cJSON *list, const cJSON *vocab, const char *path,
                      ust_err *e) {
    int n = cJSON_GetArraySize(list);
    t->added = calloc((size_t)n + 1, sizeof *t->added);
    UST_ASSERT(t->added, "out of memory");
    strmap verbatim, seen; /* the vocabulary; the added contents so far, with their ids */
    strmap_init(&verbatim, (size_t)cJSON_GetArraySize(vocab));
    strmap_init(&seen, (size_t)n);
    const cJSON *x;
    cJSON_ArrayForEach(x, vocab)
        strmap_put(&verbatim, x->string, strlen(x->string), (int32_t)x->valuedouble);
    int32_t next_id = cJSON_GetArraySize(vocab);
    int rc = 0, eot_best = 4;
    cJSON_ArrayForEach(x, list) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(x, "content");
        if (!cJSON_IsString(c)) {
            rc = ust_errf(e, "%s: added token %d has no content", path, t->nadded);
            break;
        }
        if (!c->valuestring[0]) continue;
        added_token *a = &t->added[t->nadded++];
        a->content = strdup(c->valuestring);
        a->len = strlen(a->content);
        a->id = added_id(&verbatim, a->content, &next_id);
        int32_t again = strmap_get(&seen, a->content, a->len); /* a repeat keeps the first's id */
        if (again >= 0)
            a->id = again;
        else
            strmap_put(&seen, a->content, a->len, a->id);
        a->single_word = json_bool(x, "single_word", false);
        a->lstrip = json_bool(x, "lstrip", false);
        a->rstrip = json_bool(x, "rstrip", false);
        a->normalized = json_bool(x, "normalized", !json_bool(x, "special", false));
        if (a->normalized && t->norm.n) { /* matched in normalized text: normalized as well */
            tok_buf nb = {0}, tmp = {0};
            tok_norm_apply(&t->norm, a->content, a->len, &nb, &tmp);
            tok_buf_put(&nb, "", 1);
            free(a->content);
            free(tmp.p);
            a->content = nb.p;
            a->len = nb.n - 1;
        }
        if (a->id >= t->vocab_size) t->vocab_size = a->id + 1;
        /* a cut must not split a token nor move the whitespace an lstrip token takes */
        if (a->lstrip || memchr(a->content, '\n', a->len)) t->cuttable = false;
        int rank = eot_rank(a->content, json_bool(x, "special", false));
        if (rank < eot_best) eot_best = rank, t->eot = a->id;
    }
    free(verbatim.slot);
    free(verbatim.pool);
    free(seen.slot);
    free(seen.pool);
    index_added(t);
    return rc;
}

static void set_dec(char **dec, size_t *dec_len, int32_t id, const void *bytes, size_t n) {
    free(dec[id]);
    dec[id] = malloc(n + 1);
    UST_ASSERT(dec[id], "out of memory");
    memcpy(dec[id], bytes, n);
    dec[id][n] = 0;
    dec_len[id] = n;
}

/* One token string through the decoder, as any token and (dec0) as a text's first. */
static void decode_entry(tok_tokenizer *t, int32_t id, const char *s, tok_buf *b, tok_buf *tmp) {
    size_t n = strlen(s);
    tok_dec_token(t->decoder, s, n, false, b, tmp);
    set_dec(t->dec, t->dec_len, id, b->p, b->n);
    if (!t->dec0) return;
    tok_dec_token(t->decoder, s, n, true, b, tmp);
    if (b->n != t->dec_len[id] || memcmp(b->p, t->dec[id], b->n) != 0)
        set_dec(t->dec0, t->dec0_len, id, b->p, b->n);
}

/* id -> bytes, as `tokenizers` decodes (skip_special_tokens=False): every token string, added
 * ones included, goes through the decoder (tok_dec.c). */
static void build_decoder(tok_tokenizer *t, const cJSON *vocab) {
    t->dec = calloc((size_t)t->vocab_size, sizeof *t->dec);
    t->dec_len = calloc((size_t)t->vocab_size, sizeof *t->dec_len);
    UST_ASSERT(t->dec && t->dec_len, "out of memory (%d tokens)", t->vocab_size);
    if (tok_dec_first_differs(t->decoder)) {
        t->dec0 = calloc((size_t)t->vocab_size, sizeof *t->dec0);
        t->dec0_len = calloc((size_t)t->vocab_size, sizeof *t->dec0_len);
        UST_ASSERT(t->dec0 && t->dec0_len, "out of memory (%d tokens)", t->vocab_size);
    }
    tok_buf b = {0}, tmp = {0};
    const cJSON *x;
    if (t->uni) /* every id, a repeated piece's too */
        for (int32_t id = 0; id < tok_unigram_size(t->uni); id++)
            decode_entry(t, id, tok_unigram_piece(t->uni, id), &b, &tmp);
    else
        cJSON_ArrayForEach(x, vocab) decode_entry(t, (int32_t)x->valuedouble, x->string, &b, &tmp);
    for (int i = 0; i < t->nadded; i++)
        decode_entry(t, t->added[i].id, t->added[i].content, &b, &tmp);
    free(b.p);
    free(tmp.p);
}

/* unk_token and, with byte_fallback, the <0xXX> ids (all 256 or none, as a character falls back
 * only when every one of its bytes has a token). */
static int load_special_ids(tok_tokenizer *t, const cJSON *model, const int16_t *inv,
                            const char *path, ust_err *e) {
    t->unk_id = -1;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (cJSON_IsString(unk)) {
        size_t n;
        unsigned char buf[1024];
        if (strlen(unk->valuestring) < sizeof buf &&
            unmap_bytes(unk->valuestring, inv, buf, &n) == 0)
            t->unk_id = strmap_get(&t->vocab, buf, n);
        if (t->unk_id < 0)
            return ust_errf(e, "%s: model.unk_token '%s' is not in the vocabulary", path,
                            unk->valuestring);
    }
    t->byte_fallback = json_bool(model, "byte_fallback", false);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->fallback[b] = t->byte_fallback ? strmap_get(&t->vocab, name, 6) : -1;
    }
    return 0;
}

/* Whether a document may be cut after a newline (tok_safe_cut): a regex stage isolates lines,
 * and nothing adds text at the start of a piece (a prefix space, a metaspace, Prepend). */
static bool cuttable_stages(const tok_tokenizer *t) {
    bool regex = false;
    for (int i = 0; i < t->nstages; i++) {
        const stage *st = &t->stages[i];
        if (st->prefix_space || st->kind == ST_METASPACE) return false;
        if (st->kind == ST_SPLIT && (memchr(st->pat, '\n', st->pat_len) || st->invert))
            return false;
        regex |= st->kind == ST_REGEX && st->split != TOK_SPLIT_NONE;
    }
    return regex && t->norm.local;
}

static int load_bpe(tok_tokenizer *t, const cJSON *model, const char *path, ust_err *e) {
    unsigned int map[256];
    int16_t inv[512];
    byte_level_map(map);
    for (int i = 0; i < 512; i++) inv[i] = -1;
    for (int b = 0; b < 256; b++) inv[map[b]] = (int16_t)b;
    const int16_t *alpha = t->byte_level ? inv : NULL;
    if (load_vocab(t, cJSON_GetObjectItemCaseSensitive(model, "vocab"), alpha, path, e)) return -1;
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsArray(merges)) return ust_errf(e, "%s: model.merges is not a list", path);
    if (load_merges(t, merges, alpha, path, e)) return -1;
    t->ignore_merges = json_bool(model, "ignore_merges", false);
    t->fuse_unk = json_bool(model, "fuse_unk", false);
    return load_special_ids(t, model, alpha, path, e);
}

static int load_unigram(tok_tokenizer *t, const cJSON *model, cJSON **vocab, const char *path,
                        ust_err *e) {
    if (t->byte_level)
        return ust_errf(e,
                        "%s: model.type 'Unigram' with a ByteLevel pre-tokenizer is not "
                        "supported",
                        path);
    if (tok_unigram_load(&t->uni, model, vocab, path, e)) return -1;
    t->vocab_size = tok_unigram_size(t->uni);
    t->unk_id = -1;
    return 0;
}

static int load_json(tok_tokenizer *t, const cJSON *root, const char *path, ust_err *e) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return ust_errf(e, "%s: no \"model\" object", path);
    if (check_model(model, path, e)) return -1;
    if (tok_norm_load(&t->norm, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), path,
                      "normalizer", e))
        return -1;
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (cJSON_IsObject(pre) && load_pretok(t, pre, path, "pre_tokenizer", e) < 0) return -1;
    t->cuttable = cuttable_stages(t);
    cJSON *uvocab = NULL; /* a Unigram's pieces as {piece: id} */
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    int rc = strcmp(json_type(model), "Unigram") == 0 ? load_unigram(t, model, &uvocab, path, e)
                                                      : load_bpe(t, model, path, e);
    if (uvocab) vocab = uvocab;
    if (!rc)
        rc = load_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), vocab, path, e);
    if (!rc)
        rc = tok_dec_load(&t->decoder, cJSON_GetObjectItemCaseSensitive(root, "decoder"),
                          t->byte_level, path, e);
    if (!rc) build_decoder(t, vocab);
    cJSON_Delete(uvocab);
    return rc;
}

/* e.g. "BPE (byte-level, qwen2 regex; NFC; decoder ByteLevel)" */
static void describe(tok_tokenizer *t) {
    static const char *const sp[] = {"", "gpt2 regex", "llama3 regex", "qwen2 regex"};
    static const char *const kinds[] = {"", "digits", "metaspace", "split"};
    char pre[64] = "";
    size_t off = 0;
    for (int i = 0; i < t->nstages && off < sizeof pre; i++) {
        const stage *st = &t->stages[i];
        const char *name = st->kind == ST_REGEX ? sp[st->split] : kinds[st->kind];
        if (name[0])
            off += (size_t)snprintf(pre + off, sizeof pre - off, "%s%s", off ? "+" : "", name);
    }
    snprintf(t->describe, sizeof t->describe, "%s (%s%s%s%s%s; decoder %s)",
             t->uni ? "Unigram" : "BPE", t->byte_level ? "byte-level" : "characters",
             t->byte_fallback ? ", byte fallback" : "", pre[0] ? ", " : "", pre,
             t->norm.n ? ", normalized" : "", tok_dec_describe(t->decoder));
}

int tok_load(tok_tokenizer **out, const char *path, ust_err *e) {
    size_t n;
    char *text = read_file(path, &n, e);
    if (!text) return -1;
    if (hf_json_refuse_nul(text, n, path, e)) { /* no tokenizer has a NUL in any string */
        free(text);
        return -1;
    }
    cJSON *root = cJSON_ParseWithLength(text, n);
    free(text);
    if (!root) return ust_errf(e, "%s: not valid JSON (a Hugging Face tokenizer.json)", path);
    tok_tokenizer *t = calloc(1, sizeof *t);
    UST_ASSERT(t, "out of memory");
    t->bpe = true;
    t->eot = -1;
    int rc = load_json(t, root, path, e);
    cJSON_Delete(root);
    if (rc) {
        tok_free(t);
        return -1;
    }
    describe(t);
    *out = t;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Pre-tokenization scanners. Each returns where the regex's match starting at i ends; the
 * alternatives are tried in the pattern's order, and each comment names the one it implements.
 * Classes come from tok_unicode_class (Unicode 16, as Oniguruma in `tokenizers`). */

typedef struct {
    const unsigned char *s;
    size_t n;
} text;

static inline int class_at(text t, size_t i, int *len, uint32_t *cp) {
    uint32_t c = utf8_at(t.s, t.n, i, len);
    if (cp) *cp = c;
    return c == 0xFFFFFFFFu ? CL_OTHER : tok_unicode_class(c);
}

/* End of the run of characters of class cl starting at i (at most max characters). */
static size_t run_of(text t, size_t i, int cl, int max) {
    int len;
    for (int k = 0; i < t.n && k < max && class_at(t, i, &len, NULL) == cl; k++) i += (size_t)len;
    return i;
}

/* \s+(?!\S)|\s+ at a whitespace character: the run, less its last character when a non-space
 * follows and the run is longer than one (the backtracking of the first alternative). */
static size_t whitespace_tail(text t, size_t i) {
    size_t j = i, last = i;
    int len;
    while (j < t.n && class_at(t, j, &len, NULL) == CL_S) {
        last = j;
        j += (size_t)len;
    }
    if (j == t.n || last == i) return j;
    return last;
}

static inline uint32_t ascii_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c | 0x20 : c; }

/* 's|'t|'re|'ve|'m|'ll|'d, case-sensitive (GPT-2) or not (Llama-3: (?i:...), where the long s
 * U+017F folds to s). Returns the match end or 0. */
static size_t contraction(text t, size_t i, bool icase) {
    if (t.s[i] != '\'' || i + 1 >= t.n) return 0;
    int len;
    uint32_t c;
    class_at(t, i + 1, &len, &c);
    if (icase) c = c == 0x17F ? 's' : ascii_lower(c);
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 1 + (size_t)len;
    if (len != 1 || i + 2 >= t.n) return 0;
    uint32_t c2 = icase ? ascii_lower(t.s[i + 2]) : t.s[i + 2];
    if ((c == 'r' && c2 == 'e') || (c == 'v' && c2 == 'e') || (c == 'l' && c2 == 'l')) return i + 3;
    return 0;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t pretok_gpt2(text t, size_t i) {
    size_t j = contraction(t, i, false);
    if (j) return j;
    int len, cl = class_at(t, i, &len, NULL);
    if (t.s[i] == ' ' && i + 1 < t.n) { /* " ?X+" with the space */
        int l2, c2 = class_at(t, i + 1, &l2, NULL);
        if (c2 != CL_S) return run_of(t, i + 1, c2, 1 << 30);
    }
    if (cl != CL_S) return run_of(t, i, cl, 1 << 30);
    return whitespace_tail(t, i);
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+   (D = 3 for Llama-3, 1 for Qwen2) */
static size_t pretok_llama3(text t, size_t i, int max_digits) {
    size_t j = contraction(t, i, true);
    if (j) return j;
    int len, cl = class_at(t, i, &len, NULL);
    if (cl == CL_L) return run_of(t, i, CL_L, 1 << 30);
    if (cl != CL_N && t.s[i] != '\r' && t.s[i] != '\n' && i + (size_t)len < t.n) {
        int l2; /* [^\r\n\p{L}\p{N}]\p{L}+ */
        if (class_at(t, i + (size_t)len, &l2, NULL) == CL_L)
            return run_of(t, i + (size_t)len, CL_L, 1 << 30);
    }
    if (cl == CL_N) return run_of(t, i, CL_N, max_digits);
    size_t k = i; /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    if (t.s[i] == ' ' && i + 1 < t.n && class_at(t, i + 1, &len, NULL) == CL_OTHER) k = i + 1;
    if (class_at(t, k, &len, NULL) == CL_OTHER) {
        k = run_of(t, k, CL_OTHER, 1 << 30);
        while (k < t.n && (t.s[k] == '\r' || t.s[k] == '\n')) k++;
        return k;
    }
    /* \s*[\r\n]+: the whitespace run up to and including its last \r or \n */
    size_t end = run_of(t, i, CL_S, 1 << 30), last_nl = 0;
    for (size_t p = i; p < end; p++)
        if (t.s[p] == '\r' || t.s[p] == '\n') last_nl = p + 1;
    if (last_nl) return last_nl;
    return whitespace_tail(t, i);
}

size_t tok_pretok_next(tok_split kind, const char *s, size_t len, size_t i) {
    text t = {(const unsigned char *)s, len};
    switch (kind) {
    case TOK_SPLIT_GPT2:
        return pretok_gpt2(t, i);
    case TOK_SPLIT_LLAMA3:
        return pretok_llama3(t, i, 3);
    case TOK_SPLIT_QWEN2:
        return pretok_llama3(t, i, 1);
    default:
        return len;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Encoding */

void tok_ids_push(tok_ids *v, int32_t id) {
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 1024;
        v->ids = realloc(v->ids, (size_t)v->cap * sizeof *v->ids);
        if (!v->ids) /* a document too long for the memory: the run's failure, not a bug */
            ust_fatal(UST_EXIT_RUNTIME, "out of memory for %lld token ids of one document",
                      (long long)v->cap);
    }
    v->ids[v->n++] = id;
}

tok_work *tok_work_new(const tok_tokenizer *t) {
    (void)t;
    tok_work *w = calloc(1, sizeof *w);
    UST_ASSERT(w, "out of memory");
    return w;
}

void tok_work_free(tok_work *w) {
    if (!w) return;
    free(w->sym);
    free(w->prev);
    free(w->next);
    free(w->len);
    free(w->heap);
    for (int i = 0; i < MAX_STAGES; i++) free(w->pfx[i]);
    free(w->norm.p);
    free(w->norm_tmp.p);
    tok_unigram_work_free(w->uw);
    free(w);
}

static void work_reserve(tok_work *w, size_t n) {
    if (n <= w->cap) return;
    w->cap = 2 * n;
    w->sym = realloc(w->sym, w->cap * sizeof(int32_t));
    w->prev = realloc(w->prev, w->cap * sizeof(int32_t));
    w->next = realloc(w->next, w->cap * sizeof(int32_t));
    w->len = realloc(w->len, w->cap * sizeof(int32_t));
    UST_ASSERT(w->sym && w->prev && w->next && w->len, "out of memory (%zu symbols)", w->cap);
}

/* Min-heap on (rank, pos): the lowest-ranked merge first, the leftmost among equals. */
static inline bool merge_before(merge_item a, merge_item b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(tok_work *w, size_t *n, merge_item m) {
    if (*n == w->heap_cap) {
        w->heap_cap = w->heap_cap ? 2 * w->heap_cap : 256;
        w->heap = realloc(w->heap, w->heap_cap * sizeof *w->heap);
        UST_ASSERT(w->heap, "out of memory (merge heap)");
    }
    size_t i = (*n)++;
    while (i > 0 && merge_before(m, w->heap[(i - 1) / 2])) {
        w->heap[i] = w->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->heap[i] = m;
}

static merge_item heap_pop(tok_work *w, size_t *n) {
    merge_item top = w->heap[0], last = w->heap[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && merge_before(w->heap[c + 1], w->heap[c])) c++;
        if (!merge_before(w->heap[c], last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (*n) w->heap[i] = last;
    return top;
}

static void push_pair(const tok_tokenizer *t, tok_work *w, size_t *hn, int32_t pos) {
    const pair_slot *m = pairmap_get(&t->merges, w->sym[pos], w->sym[w->next[pos]]);
    if (m) heap_push(w, hn, (merge_item){m->rank, pos, m->new_id});
}

/* The id of the symbol s[0, l) (one byte, or one character of a character-level BPE). */
static inline int32_t symbol_id(const tok_tokenizer *t, const unsigned char *s, size_t l) {
    return l == 1 ? t->byte_id[s[0]] : strmap_get(&t->vocab, s, l);
}

/* The symbols of one pre-token, as `tokenizers`' BPE::merge_word: one per byte (byte-level) or
 * per character; a missing one becomes its bytes' <0xXX> tokens (byte_fallback, when all
 * exist), else unk_token (consecutive ones fused when fuse_unk; a pending unk is written only
 * before the next symbol found in the vocabulary, as there), else it is dropped. */
static int32_t initial_symbols(const tok_tokenizer *t, tok_work *w, const unsigned char *s,
                               size_t n) {
    int32_t k = 0;
    bool unk = false;
    for (size_t i = 0; i < n;) {
        int l = 1;
        if (!t->byte_level) utf8_at(s, n, i, &l);
        int32_t id = symbol_id(t, s + i, (size_t)l);
        const unsigned char *c = s + i;
        i += (size_t)l;
        if (id >= 0) {
            if (unk) w->sym[k++] = t->unk_id;
            unk = false;
            w->sym[k++] = id;
            continue;
        }
        bool fb = t->byte_fallback;
        for (int j = 0; j < l && fb; j++) fb = t->fallback[c[j]] >= 0;
        if (fb) {
            for (int j = 0; j < l; j++) w->sym[k++] = t->fallback[c[j]];
            continue;
        }
        if (t->unk_id < 0) continue;
        if (unk && !t->fuse_unk) w->sym[k++] = t->unk_id;
        unk = true;
    }
    if (unk) w->sym[k++] = t->unk_id;
    return k;
}

/* `tokenizers`' Word::merge_all: pop the best pair; skip it when its left symbol is gone or its
 * pair now merges to another id; merge; queue the two pairs the new symbol forms. */
static void bpe_piece(const tok_tokenizer *t, tok_work *w, const unsigned char *s, size_t n,
                      tok_ids *out) {
    if (t->uni) {
        tok_unigram_encode(t->uni, &w->uw, s, n, out);
        return;
    }
    if (t->ignore_merges) {
        int32_t id = strmap_get(&t->vocab, s, n);
        if (id >= 0) {
            tok_ids_push(out, id);
            return;
        }
    }
    work_reserve(w, n + 1);
    int32_t k = initial_symbols(t, w, s, n);
    size_t hn = 0;
    for (int32_t i = 0; i < k; i++) {
        w->prev[i] = i - 1;
        w->next[i] = i + 1 < k ? i + 1 : -1;
        w->len[i] = 1;
    }
    for (int32_t i = 0; i + 1 < k; i++) push_pair(t, w, &hn, i);
    while (hn > 0) {
        merge_item m = heap_pop(w, &hn);
        int32_t p = m.pos, q = w->next[p];
        if (w->len[p] == 0 || q < 0) continue;
        const pair_slot *cur = pairmap_get(&t->merges, w->sym[p], w->sym[q]);
        if (!cur || cur->new_id != m.new_id) continue;
        w->sym[p] = m.new_id;
        w->len[p] += w->len[q];
        w->len[q] = 0;
        w->next[p] = w->next[q];
        if (w->next[p] >= 0) w->prev[w->next[p]] = p;
        if (w->prev[p] >= 0) push_pair(t, w, &hn, w->prev[p]);
        if (w->next[p] >= 0) push_pair(t, w, &hn, p);
    }
    for (int32_t i = 0; i >= 0 && k > 0; i = w->next[i]) tok_ids_push(out, w->sym[i]);
}

static void encode_stage(const tok_tokenizer *t, tok_work *w, const char *s, size_t n, int k,
                         bool at0, tok_ids *out);

/* Stage k's scratch for a piece of n bytes grown to at most grow times its size plus extra. */
static char *stage_buf(tok_work *w, int k, size_t need) {
    if (w->pfx_cap[k] < need) {
        w->pfx_cap[k] = 2 * need + 16;
        w->pfx[k] = realloc(w->pfx[k], w->pfx_cap[k]);
        UST_ASSERT(w->pfx[k], "out of memory (%zu bytes)", w->pfx_cap[k]);
    }
    return w->pfx[k];
}

/* Where the next delimiter of a Split / Digits / Metaspace stage starts at or after i, and its
 * end (*end); n when there is none. Digits: one numeric character (\p{N}, as Rust's
 * char::is_numeric); the others: the string pattern. */
static size_t next_match(const stage *st, text s, size_t i, size_t *end) {
    if (st->kind == ST_DIGITS) {
        for (int len; i < s.n; i += (size_t)len)
            if (class_at(s, i, &len, NULL) == CL_N) {
                *end = i + (size_t)len;
                return i;
            }
        return s.n;
    }
    const char *hit =
        st->pat_len <= s.n - i ? memmem(s.s + i, s.n - i, st->pat, st->pat_len) : NULL;
    if (!hit) return s.n;
    *end = (size_t)((const unsigned char *)hit - s.s) + st->pat_len;
    return *end - st->pat_len;
}

/* `tokenizers`' NormalizedString::split: the text is cut into delimiters (matches, or with
 * invert the text between them) and the rest, then the behavior decides the pieces: Removed
 * drops delimiters, Isolated keeps each, Contiguous joins runs of them, MergedWithPrevious /
 * MergedWithNext attach a delimiter to the non-delimiter before / after it. */
static void split_stage(const tok_tokenizer *t, tok_work *w, const stage *st, text s, int k,
                        bool at0, tok_ids *out) {
    size_t i = 0, ps = 0, pe = 0; /* the pending piece [ps, pe) */
    bool pending = false, pend_delim = false;
#define EMIT(a, b)                                                                                 \
    encode_stage(t, w, (const char *)s.s + (a), (b) - (a), k + 1, at0 && (a) == 0, out)
    while (i < s.n) {
        size_t end = s.n, at = next_match(st, s, i, &end);
        size_t seg_end = at > i ? at : end; /* a gap, then the match */
        bool delim = (at == i) != st->invert;
        if (st->behavior == B_REMOVED) {
            if (!delim) EMIT(i, seg_end);
        } else if (st->behavior == B_ISOLATED) {
            EMIT(i, seg_end);
        } else if (st->behavior == B_CONTIGUOUS && pending && delim == pend_delim) {
            pe = seg_end;
        } else if (st->behavior == B_MERGED_PREV && pending && delim && !pend_delim) {
            pe = seg_end, pend_delim = true;
        } else if (st->behavior == B_MERGED_NEXT && pending && !delim && pend_delim) {
            EMIT(ps, seg_end);
            pending = false;
        } else {
            if (pending) EMIT(ps, pe);
            ps = i, pe = seg_end, pending = true, pend_delim = delim;
            if (st->behavior == B_MERGED_PREV && delim) pend_delim = true;
        }
        i = seg_end;
    }
    if (pending) EMIT(ps, pe);
#undef EMIT
}

/* Metaspace: spaces become the replacement, which is put in front of the piece (prepend scheme
 * always, or first for the piece at offset 0) unless it starts with one; with split, each
 * replacement starts a new piece (MergedWithNext). */
static void metaspace_stage(const tok_tokenizer *t, tok_work *w, const stage *st, const char *s,
                            size_t n, int k, bool at0, tok_ids *out) {
    size_t spaces = 0;
    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    char *b = stage_buf(w, k, n + (spaces + 1) * st->pat_len);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != ' ') {
            b[m++] = s[i];
            continue;
        }
        memcpy(b + m, st->pat, st->pat_len);
        m += st->pat_len;
    }
    bool starts = m >= st->pat_len && !memcmp(b, st->pat, st->pat_len);
    if (!starts && (st->prepend == PREPEND_ALWAYS || (st->prepend == PREPEND_FIRST && at0))) {
        memmove(b + st->pat_len, b, m);
        memcpy(b, st->pat, st->pat_len);
        m += st->pat_len;
    }
    if (st->split_on) {
        stage sp = *st;
        sp.behavior = B_MERGED_NEXT;
        split_stage(t, w, &sp, (text){(const unsigned char *)b, m}, k, at0, out);
    } else {
        encode_stage(t, w, b, m, k + 1, at0, out);
    }
}

/* Pre-tokenizer stage k over one piece, then the remaining stages, then BPE. at0: the piece
 * starts at offset 0 of the text (Metaspace's "first"). */
static void encode_stage(const tok_tokenizer *t, tok_work *w, const char *s, size_t n, int k,
                         bool at0, tok_ids *out) {
    if (n == 0) return; /* `tokenizers` drops empty pieces */
    if (k == t->nstages) {
        bpe_piece(t, w, (const unsigned char *)s, n, out);
        return;
    }
    const stage *st = &t->stages[k];
    if (st->kind == ST_METASPACE) {
        metaspace_stage(t, w, st, s, n, k, at0, out);
        return;
    }
    if (st->kind != ST_REGEX) {
        split_stage(t, w, st, (text){(const unsigned char *)s, n}, k, at0, out);
        return;
    }
    if (st->prefix_space && s[0] != ' ') {
        char *b = stage_buf(w, k, n + 1);
        b[0] = ' ';
        memcpy(b + 1, s, n);
        s = b;
        n++;
    }
    if (st->split == TOK_SPLIT_NONE) {
        encode_stage(t, w, s, n, k + 1, at0, out);
        return;
    }
    for (size_t i = 0; i < n;) {
        size_t j = tok_pretok_next(st->split, s, n, i);
        encode_stage(t, w, s + i, j - i, k + 1, at0 && i == 0, out);
        i = j;
    }
}

static bool is_space_at(text t, size_t i, int *len) { return class_at(t, i, len, NULL) == CL_S; }

/* \w as `tokenizers`' single_word check uses it, approximated by letters, numbers and '_'. */
static bool word_char_at(text t, size_t i) {
    int len, cl = class_at(t, i, &len, NULL);
    return cl == CL_L || cl == CL_N || t.s[i] == '_';
}

/* The character that ends at i (i > 0): back over at most three continuation bytes. */
static bool word_char_before(text t, size_t i) {
    size_t j = i - 1;
    while (j > 0 && i - j < 4 && (t.s[j] & 0xC0) == 0x80) j--;
    int len;
    class_at(t, j, &len, NULL);
    return word_char_at(t, j + (size_t)len == i ? j : i - 1);
}

/* Leftmost-longest match of pass p's added tokens at or after i: its index, or -1. */
static int find_added(const tok_tokenizer *t, int p, text s, size_t i, size_t *at) {
    for (; i < s.n; i++) {
        unsigned b = s.s[i];
        for (int k = t->first[p][b]; k < t->first[p][b + 1]; k++) {
            const added_token *a = &t->added[t->by_first[p][k]];
            if (a->len <= s.n - i && memcmp(s.s + i, a->content, a->len) == 0) {
                *at = i;
                return t->by_first[p][k];
            }
        }
    }
    return -1;
}

/* AddedVocabulary::find_matches for pass p, then the next pass on the text between matches;
 * the text between pass 0's matches is normalized before pass 1. */
static void encode_added(const tok_tokenizer *t, tok_work *w, const char *str, size_t n, int p,
                         bool at0, tok_ids *out) {
    if (p == 1 && t->norm.n) {
        tok_norm_apply(&t->norm, str, n, &w->norm, &w->norm_tmp);
        str = w->norm.p, n = w->norm.n;
    }
    if (p == 2) {
        encode_stage(t, w, str, n, 0, at0, out);
        return;
    }
    if (t->first[p][256] == 0) {
        encode_added(t, w, str, n, p + 1, at0, out);
        return;
    }
    text s = {(const unsigned char *)str, n};
    size_t done = 0, i = 0, at;
    int len, k;
    while ((k = find_added(t, p, s, i, &at)) >= 0) {
        const added_token *a = &t->added[k];
        size_t start = at, stop = at + a->len;
        i = stop;
        if (a->single_word &&
            ((start > 0 && word_char_before(s, start)) || (stop < n && word_char_at(s, stop))))
            continue;
        if (a->lstrip) {
            size_t ns = start;
            while (ns > done) {
                size_t c = ns - 1;
                while (c > done && (s.s[c] & 0xC0) == 0x80) c--;
                if (!is_space_at(s, c, &len)) break;
                ns = c;
            }
            start = ns;
        }
        if (a->rstrip)
            while (stop < n && is_space_at(s, stop, &len)) stop += (size_t)len;
        if (done < start) encode_added(t, w, str + done, start - done, p + 1, at0 && !done, out);
        tok_ids_push(out, a->id);
        done = i = stop;
    }
    if (done < n) encode_added(t, w, str + done, n - done, p + 1, at0 && !done, out);
}

void tok_encode(const tok_tokenizer *t, tok_work *w, const char *text, size_t len, tok_ids *out) {
    if (!t->bpe) {
        for (size_t i = 0; i < len; i++) tok_ids_push(out, (unsigned char)text[i]);
        return;
    }
    encode_added(t, w, text, len, 0, true, out);
}

/* Cut between "x\n" and "y" with x, y printable ASCII: no match of the three regexes spans a
 * newline followed by a non-space, and with a non-space before it the newline is its own piece
 * (or ends the punctuation piece before it) whether or not text follows, so both halves
 * pre-tokenize as the whole does. */
size_t tok_safe_cut(const tok_tokenizer *t, const char *text, size_t len) {
    if (!t->bpe) return len > 1 ? len - 1 : 0;
    if (!t->cuttable || len < 3) return 0;
    for (size_t p = len - 1; p >= 2; p--) {
        unsigned a = (unsigned char)text[p - 2], b = (unsigned char)text[p];
        if (text[p - 1] == '\n' && a > ' ' && a < 0x7F && b > ' ' && b < 0x7F) return p;
    }
    return 0;
}
