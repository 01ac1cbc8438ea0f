/* tok_unigram: the Unigram model of a Hugging Face tokenizer.json (SentencePiece's unigram, as
 * T5 and others ship it): the pieces with their log-probability scores; a pre-token becomes the
 * segmentation of highest total score (Viterbi, `tokenizers`' encode_optimized, ties to the
 * earliest), characters no piece covers become unk (fused), with byte_fallback their <0xXX>
 * pieces. A loaded model is read-only; each thread passes its own tok_unigram_work. */
#ifndef UST_TOK_UNIGRAM_H
#define UST_TOK_UNIGRAM_H

#include <cjson/cJSON.h>

#include "error.h"
#include "tokenizer.h"

typedef struct tok_unigram tok_unigram;
typedef struct tok_unigram_work tok_unigram_work;

/* model: the "model" object; *vocab gets {piece: id} (for added tokens and the decoder). */
int tok_unigram_load(tok_unigram **out, const cJSON *model, cJSON **vocab, const char *file,
                     ust_err *e);
void tok_unigram_free(tok_unigram *u);
int tok_unigram_size(const tok_unigram *u);
const char *tok_unigram_piece(const tok_unigram *u, int id); /* id < size */
void tok_unigram_work_free(tok_unigram_work *w);
/* Appends the ids of pre-token s[0, n) (*w: the caller's scratch, created on first use). */
void tok_unigram_encode(const tok_unigram *u, tok_unigram_work **w, const unsigned char *s,
                        size_t n, tok_ids *out);

#endif
