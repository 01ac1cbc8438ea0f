/* tok_norm: normalizers (tok_norm.h).
 * `tokenizers` normalizes each piece of text between added tokens that are not "normalized"
 * (tokenizer.c cuts those out first); the steps of a Sequence run in order on the whole piece.
 * NFC/NFD/NFKC/NFKD: libutf8proc's utf8proc_map on each run of valid UTF-8 that holds no code
 * point unassigned in Unicode 9.0; those code points and invalid bytes are copied as they are.
 * Both are starters that nothing composes with, so normalizing the runs separately equals
 * normalizing the whole with Unicode 9.0's tables. Replace (a string pattern) replaces every
 * non-overlapping occurrence, left to right; Prepend adds its string before a non-empty piece. */
#include "tok_norm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

typedef enum { N_NFC, N_NFD, N_NFKC, N_NFKD, N_REPLACE, N_PREPEND } norm_kind;

struct tok_norm_step {
    norm_kind kind;
    char *a, *b; /* Replace: pattern, content; Prepend: a = the string */
    size_t na, nb;
};

void tok_buf_reserve(tok_buf *b, size_t n) {
    if (n <= b->cap) return;
    b->cap = 2 * n + 64;
    b->p = realloc(b->p, b->cap);
    UST_ASSERT(b->p, "out of memory (%zu bytes)", b->cap);
}

void tok_buf_put(tok_buf *b, const void *s, size_t n) {
    tok_buf_reserve(b, b->n + n);
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}

void tok_norm_free(tok_norm *nm) {
    for (int i = 0; i < nm->n; i++) {
        free(nm->steps[i].a);
        free(nm->steps[i].b);
    }
    free(nm->steps);
    memset(nm, 0, sizeof *nm);
}

static const char *type_of(const cJSON *o) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* A JSON string with its length (an escaped NUL was refused when the file was read). */
static int string_at(const cJSON *o, const char *key, char **s, size_t *n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v)) return -1;
    *s = strdup(v->valuestring);
    UST_ASSERT(*s, "out of memory");
    *n = strlen(*s);
    return 0;
}

static int add_step(tok_norm *nm, const cJSON *j, const char *file, const char *where, ust_err *e) {
    static const char *const forms[] = {"NFC", "NFD", "NFKC", "NFKD"};
    const char *type = type_of(j);
    tok_norm_step st = {0};
    int k = 0;
    while (k < 4 && strcmp(type, forms[k]) != 0) k++;
    if (k < 4) {
        st.kind = (norm_kind)k;
    } else if (strcmp(type, "Replace") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        st.kind = N_REPLACE;
        if (string_at(pat, "String", &st.a, &st.na) || !st.na ||
            string_at(j, "content", &st.b, &st.nb)) {
            free(st.a);
            return ust_errf(e,
                            "%s: %s.pattern: a Replace normalizer needs {\"String\": non-empty} "
                            "and a \"content\" string (Regex patterns are not supported)",
                            file, where);
        }
        nm->local &= memchr(st.a, '\n', st.na) == NULL && memchr(st.b, '\n', st.nb) == NULL;
    } else if (strcmp(type, "Prepend") == 0) {
        st.kind = N_PREPEND;
        if (string_at(j, "prepend", &st.a, &st.na))
            return ust_errf(e, "%s: %s.prepend: not a string", file, where);
        nm->local = false; /* a piece starting after a cut would get it too */
    } else {
        return ust_errf(e,
                        "%s: %s.type '%s' is not supported (supported normalizers: NFC, NFD, "
                        "NFKC, NFKD, Replace with a String pattern, Prepend, Sequence)",
                        file, where, type);
    }
    nm->steps = realloc(nm->steps, (size_t)(nm->n + 1) * sizeof *nm->steps);
    UST_ASSERT(nm->steps, "out of memory");
    nm->steps[nm->n++] = st;
    return 0;
}

static int load_into(tok_norm *nm, const cJSON *j, const char *file, const char *where,
                     ust_err *e) {
    if (strcmp(type_of(j), "Sequence") != 0) return add_step(nm, j, file, where, e);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "normalizers");
    if (!cJSON_IsArray(list))
        return ust_errf(e, "%s: %s.normalizers: a Sequence needs a list", file, where);
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, list) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s.normalizers[%d]", where, i++);
        if (load_into(nm, x, file, sub, e)) return -1;
    }
    return 0;
}

int tok_norm_load(tok_norm *nm, const cJSON *j, const char *file, const char *where, ust_err *e) {
    memset(nm, 0, sizeof *nm);
    nm->local = true;
    if (!j || cJSON_IsNull(j)) return 0;
    if (load_into(nm, j, file, where, e)) {
        tok_norm_free(nm);
        return -1;
    }
    return 0;
}

/* Length of the run at s[0, n) that utf8proc may normalize: valid UTF-8 of code points assigned
 * in Unicode 9.0 (*ascii: the run is all ASCII, which every form leaves as it is). 0 when s[0]
 * starts no such character. */
static size_t norm_run(const unsigned char *s, size_t n, bool *ascii) {
    size_t i = 0;
    *ascii = true;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0 || tok_unassigned_in_unicode9((unsigned)cp)) break;
        *ascii = false;
        i += (size_t)k;
    }
    return i;
}

static void unicode_form(norm_kind kind, const char *s, size_t n, tok_buf *out) {
    static const int opts[] = {UTF8PROC_COMPOSE, UTF8PROC_DECOMPOSE,
                               UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
                               UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        bool ascii;
        size_t r = norm_run(u + i, n - i, &ascii);
        if (r == 0) { /* an invalid byte or a character unassigned in 9.0: as it is */
            utf8proc_int32_t cp;
            utf8proc_ssize_t k = utf8proc_iterate(u + i, (utf8proc_ssize_t)(n - i), &cp);
            r = k > 0 ? (size_t)k : 1;
            tok_buf_put(out, s + i, r);
        } else if (ascii) {
            tok_buf_put(out, s + i, r);
        } else {
            utf8proc_uint8_t *d = NULL;
            utf8proc_ssize_t m = utf8proc_map(u + i, (utf8proc_ssize_t)r, &d,
                                              (utf8proc_option_t)(UTF8PROC_STABLE | opts[kind]));
            UST_ASSERT(m >= 0, "utf8proc: %s", utf8proc_errmsg(m));
            tok_buf_put(out, d, (size_t)m);
            free(d);
        }
        i += r;
    }
}

static void replace(const tok_norm_step *st, const char *s, size_t n, tok_buf *out) {
    size_t i = 0;
    while (i < n) {
        const char *hit = st->na <= n - i ? memmem(s + i, n - i, st->a, st->na) : NULL;
        if (!hit) break;
        tok_buf_put(out, s + i, (size_t)(hit - (s + i)));
        tok_buf_put(out, st->b, st->nb);
        i = (size_t)(hit - s) + st->na;
    }
    tok_buf_put(out, s + i, n - i);
}

void tok_norm_apply(const tok_norm *nm, const char *s, size_t n, tok_buf *out, tok_buf *tmp) {
    out->n = 0;
    tok_buf_put(out, s, n);
    for (int k = 0; k < nm->n; k++) {
        const tok_norm_step *st = &nm->steps[k];
        tmp->n = 0;
        if (st->kind == N_REPLACE)
            replace(st, out->p, out->n, tmp);
        else if (st->kind == N_PREPEND) {
            if (out->n) tok_buf_put(tmp, st->a, st->na);
            tok_buf_put(tmp, out->p, out->n);
        } else
            unicode_form(st->kind, out->p, out->n, tmp);
        tok_buf t = *out;
        *out = *tmp;
        *tmp = t;
    }
}
