/* model_mtp: DeepSeek-V3's multi-token prediction (model.mtp.depth D; core/model/model_mtp.c):
 * D sequential modules on the head chunk after the main model, each predicting one token further
 * ahead through the main model's embedding and lm_head; units u0 + k, before the head's.
 * The forward adds nothing to the returned loss: each module's cross-entropy is summed for
 * model_take_mtp_losses, and its gradient enters the backward scaled by loss_weight / D. */
#ifndef UST_MODEL_MTP_H
#define UST_MODEL_MTP_H

#include "model_state.h"

/* The modules' activations of a slot (the head chunk's; shared: selective recompute's MLP
 * activation) and their backward's scratch. */
void mtp_alloc_slot(model *m, ust_arena *a, act_slot *s, act *shared);
void mtp_alloc_scratch(model *m, ust_arena *a);
/* After the main head: module k from h_{k-1} (x_last, (Nl,C), for the first) and the embedding
 * of its shifted tokens (s->mtp[k].emb, vocab_embed_forward's), against b->mtp_targets. */
void mtp_forward(model *m, act_slot *s, const ust_batch *b, const act *x_last, float dscale,
                 int u0);
/* Modules D-1..0, each between its unit's hooks: their weights' gradients, each one's embedding
 * gradient (s->mtp[k].demb, for vocab_embed_grads) and d x_last, which mtp_add_input_grad adds
 * into the main head's input gradient. */
void mtp_backward(model *m, act_slot *s, const act *x_last, int u0);
void mtp_add_input_grad(model *m, act *dx);
/* A chunk without the head passes the modules' embeddings on from its input to its output (its
 * backward leaves their gradient in place in dy); nl: its layers. */
void mtp_pass_on(model *m, act_slot *s, int nl);
/* The whole lm_head's weight gradient of every module, inside the head unit's pair (one pair per
 * micro-batch: a data-parallel reduction runs at its end). */
void mtp_head_wgrad(model *m, act_slot *s);

#endif
