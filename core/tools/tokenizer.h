/* tokenizer: text -> token ids, either raw bytes (id = byte) or the byte-level BPE of a Hugging
 * Face tokenizer.json (model.type BPE; pre_tokenizer ByteLevel with the GPT-2 regex, or a Split on
 * the Llama-3 / Qwen2 regex followed by ByteLevel; added tokens such as <|endoftext|> are matched
 * in the text first). encode() is token-for-token what `tokenizers` encode(text,
 * add_special_tokens=False) returns on valid UTF-8; bytes that are not UTF-8 (which `tokenizers`
 * cannot take) are treated as punctuation. A loaded tokenizer is read-only: threads share it and
 * each passes its own tok_work scratch. Unsupported files are refused, naming what and why. */
#ifndef UST_TOKENIZER_H
#define UST_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

typedef struct tok_tokenizer tok_tokenizer;
typedef struct tok_work tok_work;

/* A growable id list; encode appends to it. */
typedef struct {
    int32_t *ids;
    int64_t n, cap;
} tok_ids;

int tok_load(tok_tokenizer **out, const char *json_path, ust_err *e);
tok_tokenizer *tok_bytes(void); /* ids 0..255, end of text 256 */
void tok_free(tok_tokenizer *t);

int tok_vocab_size(const tok_tokenizer *t); /* largest id + 1 (added tokens included) */
/* The end-of-text id: the added token <|endoftext|> or <|end_of_text|>, 256 for bytes, -1 none. */
int tok_eot(const tok_tokenizer *t);
const char *tok_describe(const tok_tokenizer *t); /* e.g. "byte-level BPE (llama3 split)" */

tok_work *tok_work_new(const tok_tokenizer *t);
void tok_work_free(tok_work *w);
void tok_ids_push(tok_ids *v, int32_t id);
void tok_encode(const tok_tokenizer *t, tok_work *w, const char *text, size_t len, tok_ids *out);

/* The bytes of token id (*s, *len; valid while t lives), as `tokenizers` decodes one id with
 * skip_special_tokens=False: added tokens are their content, other entries go through ByteLevel's
 * unicode -> byte mapping; for raw bytes id b < 256 is byte b and end of text is empty. A token's
 * bytes may be part of a UTF-8 character (the rest comes with the next tokens). -1 when the
 * tokenizer has no token id. */
int tok_decode(const tok_tokenizer *t, int32_t id, const char **s, size_t *len);

/* The largest p in (0, len) at which encode(text[0,p)) followed by encode(text[p,len)) equals
 * encode(text) whatever follows len; 0 when there is none (or the tokenizer cannot be cut, e.g.
 * with add_prefix_space). Lets one long document be tokenized by several threads. */
size_t tok_safe_cut(const tok_tokenizer *t, const char *text, size_t len);

/* Pre-tokenization regexes, as hand-written scanners (exposed for tests). */
typedef enum { TOK_SPLIT_NONE, TOK_SPLIT_GPT2, TOK_SPLIT_LLAMA3, TOK_SPLIT_QWEN2 } tok_split;
/* End of the piece that starts at i < len: what the regex's next match would be. */
size_t tok_pretok_next(tok_split kind, const char *s, size_t len, size_t i);
/* 1 letter (\p{L}), 2 number (\p{N}), 3 whitespace (\s), 0 other; Unicode 16 (tok_unicode.c). */
int tok_unicode_class(unsigned int cp);

#endif
