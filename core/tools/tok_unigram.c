/* tok_unigram: the Unigram model (tok_unigram.h).
 * `tokenizers`' Unigram::encode_optimized: best[i] is the best path over the first i bytes; from
 * each character start, every piece that is a prefix of the rest extends it (score added; a
 * strictly better total replaces, so ties keep the earliest start); when no piece is exactly the
 * next character, that character as unk (score: the lowest piece score - 10) does. Walking back
 * from the end gives the pieces; consecutive unks are fused into one string. Then each string
 * that is a piece is its id, else (unk) its <0xXX> pieces when byte_fallback has them all, else
 * unk_id. The prefix search is a hash set of every piece's byte prefixes (a trie's common-prefix
 * search: the scan stops at the first prefix no piece has). */
#include "tok_unigram.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint32_t off, len;
    int32_t id; /* -2: a prefix only; INT32_MIN: an empty slot */
} uslot;

struct tok_unigram {
    uslot *slot;
    uint64_t mask;
    char *pool;
    size_t pool_n;
    double *score, unk_score;
    char **piece; /* by id (a repeated piece's every id decodes to it) */
    int n, unk_id;
    bool byte_fallback;
    int32_t fallback[256];
};

struct tok_unigram_work {
    double *best;
    int32_t *start, *id; /* the best path ending at each byte: its last piece */
    int32_t *seg;        /* the path's segments, from the end: start, end, id */
    size_t cap;
};

static uint64_t hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uslot *find(const tok_unigram *u, const char *s, size_t n) {
    for (uint64_t i = hash(s, n) & u->mask;; i = (i + 1) & u->mask) {
        uslot *x = &u->slot[i];
        if (x->id == INT32_MIN || (x->len == n && !memcmp(u->pool + x->off, s, n))) return x;
    }
}

/* Inserts s (a piece with its id, or a prefix with -2; a piece's id wins over a prefix). */
static void put(tok_unigram *u, const char *s, size_t n, int32_t id) {
    uslot *x = find(u, s, n);
    if (x->id == INT32_MIN) {
        *x = (uslot){.off = (uint32_t)u->pool_n, .len = (uint32_t)n, .id = id};
        memcpy(u->pool + u->pool_n, s, n);
        u->pool_n += n;
    } else if (id >= 0) { /* a repeated piece maps to its last id, as token_to_ids does */
        x->id = id;
    }
}

static int32_t piece_id(const tok_unigram *u, const char *s, size_t n) {
    const uslot *x = find(u, s, n);
    return x->id >= 0 ? x->id : -1;
}

/* The score as `tokenizers` reads it. serde_json (without its float_roundtrip feature) parses a
 * number as its decimal digits in a u64, converted to double and then multiplied or divided by
 * the double 10^|exponent|: two roundings, so 283 of the 1424 scores of the test's tokenizer
 * come out one ulp away from the correctly rounded value cJSON gives, which changes Viterbi's
 * ties. The file's digits are the shortest that round-trip (what serde_json and Python write),
 * recovered here from the double, then converted as serde_json does. */
static double serde_f64(double v) {
    if (v == 0 || v != v) return v;
    char buf[40];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, v);
        if (strtod(buf, NULL) == v) break;
    }
    snprintf(buf, sizeof buf, "%.*e", p - 1, v);
    uint64_t sig = 0;
    const char *c = buf + (buf[0] == '-');
    for (; *c && *c != 'e'; c++)
        if (*c >= '0' && *c <= '9') sig = sig * 10 + (uint64_t)(*c - '0');
    int exp = atoi(c + 1) - (p - 1);
    double f = (double)sig;
    while (exp < -308 && f != 0) f /= 1e308, exp += 308;
    snprintf(buf, sizeof buf, "1e%d", exp < 0 ? -exp : exp);
    double pow10 = strtod(buf, NULL); /* as Rust's literal: correctly rounded */
    f = exp >= 0 ? f * pow10 : f / pow10;
    return v < 0 ? -f : f;
}

static int index_pieces(tok_unigram *u, const cJSON *list, cJSON *vocab, const char *file,
                        ust_err *e) {
    size_t bytes = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, list) {
        const cJSON *p = cJSON_GetArrayItem(x, 0), *sc = cJSON_GetArrayItem(x, 1);
        if (cJSON_GetArraySize(x) != 2 || !cJSON_IsString(p) || !cJSON_IsNumber(sc))
            return ust_errf(e, "%s: model.vocab[%d] is not [\"piece\", score]", file, u->n);
        size_t len = strlen(p->valuestring);
        bytes += len * (len + 1) / 2 + 1;
        u->piece[u->n] = strdup(p->valuestring);
        UST_ASSERT(u->piece[u->n], "out of memory");
        u->score[u->n++] = serde_f64(sc->valuedouble);
    }
    uint64_t cap = 16;
    while (cap < 2 * bytes + 16) cap <<= 1;
    u->slot = malloc(cap * sizeof *u->slot);
    u->pool = malloc(bytes + 1);
    UST_ASSERT(u->slot && u->pool, "out of memory (%zu piece bytes)", bytes);
    for (uint64_t i = 0; i < cap; i++) u->slot[i].id = INT32_MIN;
    u->mask = cap - 1;
    int id = 0;
    cJSON_ArrayForEach(x, list) {
        const char *p = cJSON_GetArrayItem(x, 0)->valuestring;
        size_t len = strlen(p);
        for (size_t k = 1; k < len; k++) put(u, p, k, -2);
        if (len) put(u, p, len, id);
        cJSON_DeleteItemFromObjectCaseSensitive(vocab, p);
        cJSON_AddNumberToObject(vocab, p, id);
        id++;
    }
    return 0;
}

int tok_unigram_load(tok_unigram **out, const cJSON *model, cJSON **vocab, const char *file,
                     ust_err *e) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0)
        return ust_errf(e, "%s: model.vocab of a Unigram is not a list of [piece, score]", file);
    tok_unigram *u = calloc(1, sizeof *u);
    UST_ASSERT(u, "out of memory");
    u->score = malloc((size_t)cJSON_GetArraySize(list) * sizeof *u->score);
    u->piece = calloc((size_t)cJSON_GetArraySize(list), sizeof *u->piece);
    UST_ASSERT(u->score && u->piece, "out of memory");
    *vocab = cJSON_CreateObject();
    if (index_pieces(u, list, *vocab, file, e)) {
        tok_unigram_free(u);
        cJSON_Delete(*vocab);
        *vocab = NULL;
        return -1;
    }
    double min = u->score[0];
    for (int i = 1; i < u->n; i++) min = u->score[i] < min ? u->score[i] : min;
    u->unk_score = min - 10.0; /* K_UNK_PENALTY */
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_id");
    u->unk_id = cJSON_IsNumber(unk) ? unk->valueint : -1;
    if (cJSON_IsNumber(unk) && (unk->valuedouble < 0 || unk->valuedouble >= u->n)) {
        int n = u->n;
        tok_unigram_free(u);
        cJSON_Delete(*vocab);
        *vocab = NULL;
        return ust_errf(e, "%s: model.unk_id %g is not a piece (0..%d)", file, unk->valuedouble,
                        n - 1);
    }
    u->byte_fallback = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        u->fallback[b] = u->byte_fallback ? piece_id(u, name, 6) : -1;
    }
    *out = u;
    return 0;
}

void tok_unigram_free(tok_unigram *u) {
    if (!u) return;
    free(u->slot);
    free(u->pool);
    free(u->score);
    for (int i = 0; u->piece && i < u->n; i++) free(u->piece[i]);
    free(u->piece);
    free(u);
}

int tok_unigram_size(const tok_unigram *u) { return u->n; }
const char *tok_unigram_piece(const tok_unigram *u, int id) { return u->piece[id]; }

void tok_unigram_work_free(tok_unigram_work *w) {
    if (!w) return;
    free(w->best);
    free(w->start);
    free(w->id);
    free(w->seg);
    free(w);
}

static size_t char_len(const unsigned char *s, size_t n, size_t i) {
    unsigned c = s[i];
    size_t k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return i + k <= n ? k : 1;
}

/* best/start/id over s[0, n): the Viterbi pass. */
static void viterbi(const tok_unigram *u, tok_unigram_work *w, const unsigned char *s, size_t n) {
    for (size_t i = 0; i <= n; i++) w->start[i] = -1, w->best[i] = 0;
    for (size_t at = 0; at < n;) {
        size_t mb = char_len(s, n, at);
        bool single = false;
        for (size_t end = at + 1; end <= n; end++) {
            const uslot *x = find(u, (const char *)s + at, end - at);
            if (x->id == INT32_MIN) break; /* no piece starts so */
            if (x->id < 0) continue;
            double cand = w->best[at] + u->score[x->id];
            if (w->start[end] < 0 || cand > w->best[end])
                w->best[end] = cand, w->start[end] = (int32_t)at, w->id[end] = x->id;
            single |= end - at == mb;
        }
        if (!single) {
            double cand = w->best[at] + u->unk_score;
            if (w->start[at + mb] < 0 || cand > w->best[at + mb])
                w->best[at + mb] = cand, w->start[at + mb] = (int32_t)at,
                             w->id[at + mb] = u->unk_id;
        }
        at += mb;
    }
}

/* One segment [a, b): its piece id, or (unk) its fallback bytes, or unk_id. */
static void emit(const tok_unigram *u, const unsigned char *s, size_t a, size_t b, int32_t id,
                 tok_ids *out) {
    if (id != u->unk_id || u->unk_id < 0) {
        tok_ids_push(out, id);
        return;
    }
    int32_t real = piece_id(u, (const char *)s + a, b - a); /* a fused run may be a piece */
    if (real >= 0) {
        tok_ids_push(out, real);
        return;
    }
    bool fb = u->byte_fallback;
    for (size_t i = a; i < b && fb; i++) fb = u->fallback[s[i]] >= 0;
    if (!fb) {
        tok_ids_push(out, u->unk_id);
        return;
    }
    for (size_t i = a; i < b; i++) tok_ids_push(out, u->fallback[s[i]]);
}

void tok_unigram_encode(const tok_unigram *u, tok_unigram_work **wp, const unsigned char *s,
                        size_t n, tok_ids *out) {
    if (!*wp) {
        *wp = calloc(1, sizeof **wp);
        UST_ASSERT(*wp, "out of memory");
    }
    tok_unigram_work *w = *wp;
    if (w->cap < n + 1) {
        w->cap = 2 * (n + 1);
        w->best = realloc(w->best, w->cap * sizeof *w->best);
        w->start = realloc(w->start, w->cap * sizeof *w->start);
        w->id = realloc(w->id, w->cap * sizeof *w->id);
        w->seg = realloc(w->seg, 3 * w->cap * sizeof *w->seg);
        UST_ASSERT(w->best && w->start && w->id && w->seg, "out of memory (%zu positions)", w->cap);
    }
    viterbi(u, w, s, n);
    /* walk back, fusing runs of unk into one segment; then emit from the start */
    size_t nseg = 0, end = n;
    while (end > 0) {
        size_t st = (size_t)w->start[end];
        bool unk = u->unk_id >= 0 && w->id[end] == u->unk_id;
        int32_t *prev = nseg ? &w->seg[3 * (nseg - 1)] : NULL;
        if (unk && prev && prev[2] == u->unk_id) {
            prev[0] = (int32_t)st;
        } else {
            int32_t *g = &w->seg[3 * nseg++];
            g[0] = (int32_t)st, g[1] = (int32_t)end, g[2] = w->id[end];
        }
        end = st;
    }
    for (size_t k = nseg; k-- > 0;) {
        const int32_t *g = &w->seg[3 * k];
        emit(u, s, (size_t)g[0], (size_t)g[1], g[2], out);
    }
}
