/* tok_dec: the decoders of a Hugging Face tokenizer.json (ByteLevel, ByteFallback, Fuse, Strip,
 * Replace with a string pattern, Metaspace, Sequence), as `tokenizers` chains them: the steps
 * before the first Fuse or ByteLevel act on each token, Strip after it on the whole text. Each
 * token's bytes are computed once (tokenizer.c keeps them per id); the text-level strip and
 * Metaspace's first-token rule are applied by tok_decode_text. */
#ifndef UST_TOK_DEC_H
#define UST_TOK_DEC_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "error.h"
#include "tok_norm.h"

typedef struct tok_dec tok_dec;

/* j: the "decoder" value (NULL or null: ByteLevel when byte_level, else tokens as written). */
int tok_dec_load(tok_dec **d, const cJSON *j, bool byte_level, const char *file, ust_err *e);
void tok_dec_free(tok_dec *d);
/* out = the bytes of token string s[0, n), as the first token of a text or not. */
void tok_dec_token(const tok_dec *d, const char *s, size_t n, bool first, tok_buf *out,
                   tok_buf *tmp);
bool tok_dec_first_differs(const tok_dec *d); /* whether first changes tok_dec_token */
/* The whole text's strip (Strip after a Fuse): cuts s[0, *n) in place (*s moves). */
void tok_dec_strip_text(const tok_dec *d, const char **s, size_t *n);
const char *tok_dec_describe(const tok_dec *d);

#endif
