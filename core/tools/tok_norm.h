/* tok_norm: the normalizers of a Hugging Face tokenizer.json (NFC, NFD, NFKC, NFKD, Replace with
 * a string pattern, Prepend, Sequence of those), applied as `tokenizers` applies them. The Unicode
 * forms come from libutf8proc, restricted to Unicode 9.0 (the tables of the `tokenizers` wheels):
 * code points unassigned there pass unchanged. Bytes that are not UTF-8 pass unchanged too.
 * A loaded chain is read-only; apply writes into caller-owned buffers. */
#ifndef UST_TOK_NORM_H
#define UST_TOK_NORM_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "error.h"

typedef struct {
    char *p;
    size_t n, cap;
} tok_buf;

typedef struct tok_norm_step tok_norm_step;
typedef struct {
    tok_norm_step *steps;
    int n;
    bool local; /* every step is local to a line: a text may be cut after a newline */
} tok_norm;

/* Reads the "normalizer" value j (NULL or null: no steps); where names it in messages
 * ("normalizer"). Refuses other types naming the key's JSON path and the value. */
int tok_norm_load(tok_norm *nm, const cJSON *j, const char *file, const char *where, ust_err *e);
void tok_norm_free(tok_norm *nm);
/* out = the normalized s[0, n) (tmp: scratch). */
void tok_norm_apply(const tok_norm *nm, const char *s, size_t n, tok_buf *out, tok_buf *tmp);
void tok_buf_reserve(tok_buf *b, size_t n);
void tok_buf_put(tok_buf *b, const void *s, size_t n);

/* 1 when cp is not assigned in Unicode 9.0 (tok_unicode9.c, generated). */
int tok_unassigned_in_unicode9(unsigned int cp);

#endif
