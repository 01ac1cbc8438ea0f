/* tok_dec: decoders (tok_dec.h).
 * `tokenizers` decodes ids by mapping each to its token string and running the decoder's
 * decode_chain over the list. Replace, ByteFallback, Strip and Metaspace change each token on
 * its own (Metaspace drops every replacement character of the list's first token, else makes it
 * a space); Fuse and ByteLevel join the list into one string, so a Strip after them strips the
 * whole text's ends. ByteFallback turns a "<0xXX>" token into that byte (consecutive byte tokens
 * that are not UTF-8 become U+FFFD in `tokenizers`; here they stay bytes, for generate's
 * streaming). ByteLevel maps each character back to its byte (a token with a character outside
 * the byte alphabet stays as written). */
#include "tok_dec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { D_BYTELEVEL, D_BYTEFALLBACK, D_FUSE, D_STRIP, D_REPLACE, D_METASPACE } dec_kind;

typedef struct {
    dec_kind kind;
    char a[64], b[64]; /* Replace: pattern, content; Strip: content; Metaspace: replacement */
    size_t na, nb;
    int start, stop; /* Strip */
    bool first;      /* Metaspace: prepend_scheme is not "never" */
} dec_step;

enum { MAX_DEC = 16 };

struct tok_dec {
    dec_step steps[MAX_DEC]; /* the token-level steps, in order */
    int n;
    int strip_start, strip_stop; /* the text-level Strip (after a Fuse / ByteLevel) */
    char strip_ch[8];
    size_t strip_n;
    bool first_differs;
    char describe[96];
    int16_t inv[512]; /* ByteLevel: character (< 512) -> byte, -1 outside the alphabet */
};

static const char *type_of(const cJSON *o) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(v) ? v->valuestring : "";
}

static int str_field(const cJSON *o, const char *key, char *out, size_t cap, size_t *n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap) return -1;
    strcpy(out, v->valuestring);
    *n = strlen(out);
    return 0;
}

static int int_field(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 1e6 ? v->valueint : 0;
}

/* One step; fused: a Fuse or ByteLevel came before (its steps act on the whole text). */
static int add_step(tok_dec *d, const cJSON *j, bool *fused, const char *file, const char *where,
                    ust_err *e) {
    const char *type = type_of(j);
    dec_step st = {0};
    if (d->n == MAX_DEC) return ust_errf(e, "%s: %s: more than %d decoders", file, where, MAX_DEC);
    if (strcmp(type, "Fuse") == 0) {
        *fused = true;
        return 0;
    }
    if (strcmp(type, "Strip") == 0 && *fused) {
        if (str_field(j, "content", d->strip_ch, sizeof d->strip_ch, &d->strip_n))
            return ust_errf(e, "%s: %s.content: not a character", file, where);
        d->strip_start = int_field(j, "start");
        d->strip_stop = int_field(j, "stop");
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        st.kind = D_BYTELEVEL;
        d->steps[d->n++] = st;
        *fused = true;
        return 0;
    }
    if (*fused && strcmp(type, "Replace") != 0)
        return ust_errf(e,
                        "%s: %s.type '%s' after a Fuse or ByteLevel decoder is not supported (only "
                        "Strip and Replace may follow them)",
                        file, where, type);
    if (strcmp(type, "ByteFallback") == 0) {
        st.kind = D_BYTEFALLBACK;
    } else if (strcmp(type, "Strip") == 0) {
        st.kind = D_STRIP;
        if (str_field(j, "content", st.a, sizeof st.a, &st.na))
            return ust_errf(e, "%s: %s.content: not a character", file, where);
        st.start = int_field(j, "start");
        st.stop = int_field(j, "stop");
    } else if (strcmp(type, "Replace") == 0) {
        st.kind = D_REPLACE;
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        if (str_field(pat, "String", st.a, sizeof st.a, &st.na) || !st.na ||
            str_field(j, "content", st.b, sizeof st.b, &st.nb))
            return ust_errf(e,
                            "%s: %s.pattern: a Replace decoder needs {\"String\": non-empty} and a "
                            "\"content\" string (Regex patterns are not supported)",
                            file, where);
    } else if (strcmp(type, "Metaspace") == 0) {
        st.kind = D_METASPACE;
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
        if (str_field(j, "replacement", st.a, sizeof st.a, &st.na))
            return ust_errf(e, "%s: %s.replacement: not a character", file, where);
        st.first = cJSON_IsString(ps)
                       ? strcmp(ps->valuestring, "never") != 0
                       : cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space"));
        d->first_differs |= st.first;
    } else {
        return ust_errf(e,
                        "%s: %s.type '%s' is not supported (supported decoders: ByteLevel, "
                        "ByteFallback, Fuse, Strip, Replace with a String pattern, Metaspace, "
                        "Sequence)",
                        file, where, type);
    }
    d->steps[d->n++] = st;
    return 0;
}

static int load_into(tok_dec *d, const cJSON *j, bool *fused, const char *file, const char *where,
                     ust_err *e) {
    if (strcmp(type_of(j), "Sequence") != 0) return add_step(d, j, fused, file, where, e);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "decoders"), *x;
    if (!cJSON_IsArray(list))
        return ust_errf(e, "%s: %s.decoders: a Sequence needs a list", file, where);
    int i = 0;
    cJSON_ArrayForEach(x, list) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s.decoders[%d]", where, i++);
        if (load_into(d, x, fused, file, sub, e)) return -1;
    }
    return 0;
}

int tok_dec_load(tok_dec **out, const cJSON *j, bool byte_level, const char *file, ust_err *e) {
    tok_dec *d = calloc(1, sizeof *d);
    UST_ASSERT(d, "out of memory");
    int n = 0;
    for (int i = 0; i < 512; i++) d->inv[i] = -1;
    for (int b = 0; b < 256; b++) { /* GPT-2's bytes_to_unicode */
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        d->inv[printable ? b : 256 + n++] = (int16_t)b;
    }
    bool fused = false;
    int rc = 0;
    if (j && !cJSON_IsNull(j))
        rc = load_into(d, j, &fused, file, "decoder", e);
    else if (byte_level)
        d->steps[d->n++] = (dec_step){.kind = D_BYTELEVEL};
    if (rc) {
        free(d);
        return -1;
    }
    static const char *const names[] = {"ByteLevel", "ByteFallback", "Fuse",
                                        "Strip",     "Replace",      "Metaspace"};
    size_t off = (size_t)snprintf(d->describe, sizeof d->describe, "%s", d->n ? "" : "as written");
    for (int i = 0; i < d->n && off < sizeof d->describe; i++)
        off += (size_t)snprintf(d->describe + off, sizeof d->describe - off, "%s%s", i ? "+" : "",
                                names[d->steps[i].kind]);
    *out = d;
    return 0;
}

void tok_dec_free(tok_dec *d) { free(d); }
bool tok_dec_first_differs(const tok_dec *d) { return d->first_differs; }
const char *tok_dec_describe(const tok_dec *d) { return d->describe; }

static int hexval(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* UTF-8 character at s[i] (lead byte length; 1 for a stray byte). */
static size_t char_len(const unsigned char *s, size_t n, size_t i) {
    unsigned c = s[i];
    size_t k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return i + k <= n ? k : 1;
}

static void byte_level(const tok_dec *d, const char *s, size_t n, tok_buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t start = out->n;
    for (size_t i = 0; i < n;) {
        size_t k = char_len(u, n, i);
        unsigned cp = k == 1 ? u[i] : k == 2 ? (u[i] & 0x1Fu) << 6 | (u[i + 1] & 0x3Fu) : 512;
        if (cp >= 512 || d->inv[cp] < 0) { /* outside the alphabet: the token as written */
            out->n = start;
            tok_buf_put(out, s, n);
            return;
        }
        unsigned char b = (unsigned char)d->inv[cp];
        tok_buf_put(out, &b, 1);
        i += k;
    }
}

static void step_token(const tok_dec *d, const dec_step *st, const char *s, size_t n, bool first,
                       tok_buf *out) {
    size_t i = 0, end = n;
    switch (st->kind) {
    case D_BYTELEVEL:
        byte_level(d, s, n, out);
        return;
    case D_BYTEFALLBACK:
        if (n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && hexval(s[3]) >= 0 &&
            hexval(s[4]) >= 0) {
            unsigned char b = (unsigned char)(hexval(s[3]) << 4 | hexval(s[4]));
            tok_buf_put(out, &b, 1);
            return;
        }
        break;
    case D_STRIP: /* up to start leading and stop trailing copies of the content character */
        for (int k = 0; k < st->start && i + st->na <= end && !memcmp(s + i, st->a, st->na); k++)
            i += st->na;
        for (int k = 0;
             k < st->stop && end >= i + st->na && !memcmp(s + end - st->na, st->a, st->na); k++)
            end -= st->na;
        tok_buf_put(out, s + i, end - i);
        return;
    case D_REPLACE:
    case D_METASPACE:
        while (i < n) {
            const char *hit = memmem(s + i, n - i, st->a, st->na);
            size_t j = hit ? (size_t)(hit - s) : n;
            tok_buf_put(out, s + i, j - i);
            if (!hit) break;
            if (st->kind == D_REPLACE)
                tok_buf_put(out, st->b, st->nb);
            else if (!(first && st->first))
                tok_buf_put(out, " ", 1);
            i = j + st->na;
        }
        return;
    default:
        break;
    }
    tok_buf_put(out, s, n);
}

void tok_dec_token(const tok_dec *d, const char *s, size_t n, bool first, tok_buf *out,
                   tok_buf *tmp) {
    out->n = 0;
    tok_buf_put(out, s, n);
    for (int k = 0; k < d->n; k++) {
        tmp->n = 0;
        step_token(d, &d->steps[k], out->p, out->n, first, tmp);
        tok_buf t = *out;
        *out = *tmp;
        *tmp = t;
    }
}

void tok_dec_strip_text(const tok_dec *d, const char **s, size_t *n) {
    if (!d->strip_n) return;
    for (int k = 0; k < d->strip_start && *n >= d->strip_n && !memcmp(*s, d->strip_ch, d->strip_n);
         k++)
        *s += d->strip_n, *n -= d->strip_n;
    for (int k = 0; k < d->strip_stop && *n >= d->strip_n &&
                    !memcmp(*s + *n - d->strip_n, d->strip_ch, d->strip_n);
         k++)
        *n -= d->strip_n;
}
