/* infer: the trained transformer run forward for generation, with a KV cache, on the ops.h
 * interface (run.device cuda runs the same code on the GPU). One sequence (B = 1).
 * infer_create reads every tensor of the configured model, whole and under its canonical name
 * (docs/design.md section 7), through a weight source (a checkpoint, a Hugging Face directory,
 * random weights for a benchmark); infer_forward appends n tokens to the cache and returns the
 * last one's logits over the real vocabulary (padded rows are never computed). The math is the
 * training model's (core/model/model_block.c, moe.c), MoE always dropless: capacity_factor is a
 * training device. Every weight is read once per forward, which is what bounds decoding. */
#ifndef UST_INFER_H
#define UST_INFER_H

#include <stdint.h>

#include "ckpt.h"
#include "config.h"
#include "ops.h"

/* Fills host (t's whole shape, row-major fp32) with tensor t; -1 with a message naming it when
 * the source lacks it or holds another shape. */
typedef int (*infer_read_fn)(void *ctx, const ckpt_tensor *t, float *host, ust_err *e);

typedef struct infer_model infer_model;

/* The model of cfg (validated) on ops, with a KV cache of model.max_seq_len positions and
 * activations for up to `chunk` tokens per forward (prefill runs in chunks of that many). */
int infer_create(infer_model **out, const ust_config *cfg, const ust_ops *ops, int chunk,
                 infer_read_fn read, void *read_ctx, ust_err *e);
void infer_destroy(infer_model *m);

/* tok: n host token ids (each < model.vocab_size, checked by the caller), 1 <= n <= chunk and
 * len + n <= max_seq_len. Runs them through every layer, attending over the cache, and writes
 * the last token's logits (vocab_size floats) to host logits. */
void infer_forward(infer_model *m, const int32_t *tok, int n, float *logits);
int infer_len(const infer_model *m); /* positions in the cache */
void infer_reset(infer_model *m);    /* empties the cache */

/* Bytes of weights one decoding step reads (n = 1 token): every tensor but the embedding tables'
 * unused rows, and of each MoE layer the router, the shared expert and top_k experts. */
int64_t infer_weight_bytes_per_token(const infer_model *m);
int64_t infer_param_count(const infer_model *m); /* every element read from the source */
/* Bytes the cache holds per position: 2 x kv heads x head dim per layer, or under model.mla
 * the latent, kv_lora_rank + qk_rope_head_dim per layer (activation bytes each). */
int64_t infer_cache_bytes_per_token(const infer_model *m);
/* Bytes of the KV caches: max_seq_len rows per layer; a layer with a window W keeps a ring of
 * W + P - 1 rows (P = min(chunk, the smallest window): the pieces a forward runs in), when
 * that is fewer. */
int64_t infer_cache_bytes(const infer_model *m);

/* The tensors of cfg's model in checkpoint order (whole shapes), as a weight source must supply
 * them; *n gets the count. The caller frees the array. */
ckpt_tensor *infer_tensors(const ust_config *cfg, int *n);

#endif
