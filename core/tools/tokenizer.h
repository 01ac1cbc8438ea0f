/* tokenizer: text -> token ids, either raw bytes (id = byte) or the BPE model of a Hugging Face
 * tokenizer.json: added tokens matched first, then the normalizers (tok_norm.h), the
 * pre-tokenizers (ByteLevel, Split on the GPT-2/Llama-3/Qwen2 regex or on a string, Digits,
 * Metaspace, Sequence), then BPE over bytes (byte-level) or characters with byte_fallback / unk,
 * or a Unigram model (tok_unigram.h).
 * encode() is token-for-token what `tokenizers` encode(text, add_special_tokens=False) returns on
 * valid UTF-8; decode follows the file's decoder. A loaded tokenizer is read-only: threads share
 * it and each passes its own tok_work scratch. Unsupported files are refused, naming the JSON
 * path of the key and its value. */
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
/* The end-of-text id: the added token <|endoftext|>, <|end_of_text|>, or a special </s> or <eos>
 * (in that order), 256 for bytes, -1 none. */
int tok_eot(const tok_tokenizer *t);
const char *tok_describe(const tok_tokenizer *t); /* e.g. "byte-level BPE (llama3 split)" */

tok_work *tok_work_new(const tok_tokenizer *t);
void tok_work_free(tok_work *w);
void tok_ids_push(tok_ids *v, int32_t id);
void tok_encode(const tok_tokenizer *t, tok_work *w, const char *text, size_t len, tok_ids *out);

/* The bytes of token id (*s, *len; valid while t lives) as they read after other tokens, which
 * is what generate prints for each new token: the file's decoder applied to the token (ByteLevel
 * maps back to bytes, <0xXX> byte-fallback tokens are their byte, Replace / Metaspace turn the
 * metaspace into a space); for raw bytes id b < 256 is byte b and end of text is empty. A token's
 * bytes may be part of a UTF-8 character (the rest comes with the next tokens). -1 when the
 * tokenizer has no token id. */
int tok_decode(const tok_tokenizer *t, int32_t id, const char **s, size_t *len);
/* The whole text of ids (malloc'd, *len bytes; NULL for an id with no token): what `tokenizers`
 * decode(ids, skip_special_tokens=False) returns when the bytes are valid UTF-8. It differs from
 * the tok_decode concatenation only at the ends (Strip after Fuse, Metaspace's first token). */
char *tok_decode_text(const tok_tokenizer *t, const int32_t *ids, size_t n, size_t *len);

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
