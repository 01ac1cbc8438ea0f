/* model_vocab: the vocabulary-parallel embedding and head (final norm, lm_head, cross-entropy)
 * of a chunk, whole or in vocabulary chunks (core/model/model_vocab.c). u: the unit the part
 * starts at; each returns the next unit (forward: after it, backward: before it). */
#ifndef UST_MODEL_VOCAB_H
#define UST_MODEL_VOCAB_H

#include "model_block.h"

/* s->xs[0] (Nl,C) from the slot's tokens (and the learned positions, gpt2). */
int vocab_embed_forward(model *m, act_slot *s, int u);
/* The final norm of x_last, the logits and the loss; returns the sum of the per-token losses
 * (dscale > 0: the logits then hold d loss / d logits * dscale). */
double vocab_head_forward(model *m, act_slot *s, const act *x_last, int u, float dscale);
/* From the logits' gradient to d loss / d x_last in dx, each part between its unit's hooks. */
int vocab_head_backward(model *m, act_slot *s, const act *x_last, act *dx, const deferral *df,
                        model_phase begin, model_phase end, int u);
/* The embedding's units, last first (the weight gradients now unless input_only). */
void vocab_embed_backward(model *m, act_slot *s, act *dx, const deferral *df, int input_only,
                          model_phase begin, model_phase end, int u);
/* The embedding's gradients of chunk vc from dx and from model.mtp's modules (when they ran). */
void vocab_embed_grads(model *m, act_slot *s, const act *dx, int vc);
/* model.mtp's heads, the main model's lm_head on other rows: the logits of lnf (Nl,C) against tgt
 * (device) into losses, each vocabulary chunk between its unit's hooks (whole: inside unit u's);
 * the backward returns this rank's rows of d lnf (in m->acts.dln) with the chunks' weight
 * gradients, the whole head's are vocab_logits_wgrad's (inside the head unit's one pair). */
void vocab_logits_forward(model *m, const act *lnf, act *logits, float *losses, const int32_t *tgt,
                          float dscale, int u);
act *vocab_logits_backward(model *m, const act *lnf, act *logits);
void vocab_logits_wgrad(model *m, const act *lnf, const act *logits);
/* The embedding's gradients from dx: vocabulary chunk vc's rows (-1: the positions; no chunks:
 * all of them). */
void vocab_embedding_backward(model *m, const int32_t *tok, const act *dx, int vc);

#endif
