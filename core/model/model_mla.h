/* model_mla: DeepSeek-V3's multi-head latent attention (model.mla), one layer's attention half
 * in place of q/k/v: q from x (or through the q latent and its RMSNorm), the joint latent
 * [c_kv, k_rope] = W_kva x, k_nope and v per head from RMSNorm(c_kv), one RoPE key k_rope shared
 * by every head; then the model's attention (v zero-padded to q's head width) and o_proj.
 * Under tp the heads split (q_b/kv_b column-, o row-parallel) and the down-projections and
 * latent norms are replicated, their gradients summed over the group (tp.c). */
#ifndef UST_MODEL_MLA_H
#define UST_MODEL_MLA_H

#include "model_block.h"

/* res2 (Nl,C) = o_proj(attention(q, k, v)) of ln1 (Nl,C), both this rank's rows. */
void mla_forward(model *m, int l, layer_acts *a, const cp_docs *docs);
/* From d res2 (dx, this rank's rows) to d ln1; returns this rank's rows of it (summed over tp).
 * Under zero-bubble's B (df->list) the weight gradients are left as W's jobs (WG_LATNORM, and
 * under tp WG_REP_BEGIN/END around those of the replicated tensors: mla_wgrad_rep). */
act *mla_backward(model *m, int l, const act *dx, layer_acts *a, const cp_docs *docs,
                  const deferral *df);
void mla_wgrad_rep(model *m, int l);
void mla_alloc_wsave(model *m, ust_arena *a, layer_wsave *w);
/* The layer's activations and the shared scratch (acts.c's A / F32 through the arena). */
void mla_alloc_layer(model *m, ust_arena *a, layer_acts *x);
void mla_alloc_scratch(model *m, ust_arena *a);

#endif
