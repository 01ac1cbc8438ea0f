/* model_block: one transformer block's forward and backward on the ops.h interface, and the
 * norms the head shares (core/model/model_block.c). A backward takes a deferral: NULL list, every
 * weight gradient as it goes; zero-bubble's B computes input gradients only and leaves each
 * weight gradient as a job on the list (its output gradient saved in keep) for W to run later.
 * Shapes as in model.c; dx: (Nl,C) d loss / d x_out on entry, d loss / d x_in on exit. */
#ifndef UST_MODEL_BLOCK_H
#define UST_MODEL_BLOCK_H

#include "model_state.h"

/* list: NULL in a whole backward; keep: the layer's layer_wsave under B (else NULL). */
typedef struct {
    wg_list *list;
    layer_wsave *keep;
} deferral;

/* The gradient buffer to pass to a fused backward call: none when it is deferred. */
float *block_now(const deferral *df, float *g);
/* Under B: appends job j, first saving its output gradient (n activations) into keep. */
void block_later(model *m, const deferral *df, wg_job j, act *keep, int64_t n);
void block_later_unit(model *m, const deferral *df, wg_kind k, int unit);

/* One column-parallel linear of a group, by the model's pointers to its gradients (db NULL:
 * no bias) and weights, with its output gradient dout (N, OC) and, under B, where it is kept. */
#define BLOCK_MAX_COLS 3
typedef struct {
    float **dw, **db;
    act *dout, *keep;
    float *const *w;
    int OC;
} block_col;
/* The group's backward on x_mine (this rank's rows of its input) through tp_column_bwd into
 * m->acts.dln, leaving under B a WG_GATHER and each linear's WG_LINEAR; returns this rank's
 * rows of d x_mine, summed over the group. */
act *block_column_backward(model *m, const deferral *df, const act *x_mine, const block_col *g,
                           int n);

/* Norms run on this rank's rows (all of them without sequence parallelism); the backward
 * accumulates the weight (and bias) gradient, summed over the group under sp. */
void block_norm_forward(model *m, act *out, float *mean, float *rstd, const act *inp,
                        const float *w, const float *b);
void block_norm_backward(model *m, act *dinp, float *dw, float *db, const act *dout, const act *inp,
                         const float *w, const float *mean, const float *rstd);
/* The input gradient only (B): the weight gradient is dropped, W computes it again. */
void block_norm_backward_input(model *m, act *dinp, const act *dout, const act *inp, const float *w,
                               const float *mean, const float *rstd);
/* model.qk_norm: dw += a head norm's weight gradient (rows of D), summed over the tp group. */
void block_head_norm_wgrad(model *m, float *dw, const act *dout, const act *inp, const float *w,
                           const float *rstd, int rows);
/* act(N,F) = swiglu(gate, up) for llama, gelu(up) for gpt2 */
void block_mlp_activation(model *m, layer_acts *a);

/* Layer l: x_out = res2 + mlp(norm2(res2)), res2 = x_in + attn(norm1(x_in)); a MoE layer's MLP
 * keeps its routing in ma and its statistics in st. */
void block_forward(model *m, int l, const act *x_in, act *x_out, layer_acts *a, moe_acts *ma,
                   moe_stats *st);
void block_backward(model *m, int l, const act *x_in, act *dx, layer_acts *a, moe_acts *ma,
                    const deferral *df);

#endif
