/* tp: Megatron-style tensor parallelism inside a layer, over the tp group of n ranks.
 * Column-parallel weights (q, k, v, gate, up; the embedding and lm_head over the vocabulary) are
 * split by output rows, row-parallel ones (o, down) by input columns. Activations between the two
 * halves of a block stay whole on every rank: a column-parallel input is used as is (its gradient
 * is all-reduced in backward), a row-parallel output is all-reduced in forward (its gradient is
 * used as is). Biases of row-parallel layers are added once (on tp rank 0). The cross-entropy is
 * vocab-parallel: each rank only ever holds logits of its own vocabulary slice. Sequence
 * parallelism (sp) splits the token rows outside the halves (see tp_gather). With n == 1 every
 * call is the plain single-rank op. */
#ifndef UST_TP_H
#define UST_TP_H

#include <stdint.h>

#include "comm.h"
#include "mem.h"
#include "ops.h"

typedef struct ust_tp {
    const ust_ops *ops;
    ust_comm *comm;
    int n, rank, sp, width;
    float *lse_all, *tlogit;                 /* vocab-parallel loss scratch */
    act *merge_out, *merge_out2;             /* (its lse merge's unused outputs) */
    act *gath_a, *gath_d, *partial, *dlocal; /* sequence-parallel scratch */
    int max_rows;
} ust_tp;

/* comm may be NULL (no tensor parallelism). max_rows: tokens per micro-batch; width: the
 * model width C (rows gathered and scattered under sequence parallelism); sp: sequence
 * parallelism on (max_rows must then divide by the group size). */
void tp_init(ust_tp *tp, const ust_ops *ops, ust_comm *comm, ust_arena *arena, int max_rows,
             int width, int sp);
/* The scratch tp_init carves (MEM_ACTS under sp, the loss's MEM_COMM over n > 1), for a group
 * of tp->n: tp_init's own allocation, which the memory plan runs against a counting arena. */
void tp_alloc_scratch(ust_tp *tp, ust_arena *arena);
/* Rank 0 of a group of n without communicator or buffers: what the memory plan shapes a
 * model with (tp_part, tp_rows, tp_sp answer as in the real group) and sizes the scratch of. */
ust_tp tp_shape(const ust_ops *ops, int n, int max_rows, int width, int sp);
/* Rows of a micro-batch of N tokens held here outside the parallel halves (N/n under sp). */
int tp_rows(const ust_tp *tp, int N);
int tp_sp(const ust_tp *tp);

/* Sequence parallelism (sp): outside the two halves the token rows are split over the group
 * (norms, residual adds and their activations on N/n rows); entering a column-parallel half
 * all-gathers the rows, leaving a row-parallel half reduce-scatters them, and norm-weight
 * gradients are summed over the group. Same traffic as the all-reduces it replaces.
 * Entering a column-parallel half: the whole (N, width) input from this rank's rows. Without sp
 * that is `mine` itself; with sp the rows are all-gathered into scratch (valid until the next
 * tp_gather). */
const act *tp_gather(ust_tp *tp, const act *mine);
/* The same for a gradient arriving at a row-parallel half's output (separate scratch). */
const act *tp_gather_grad(ust_tp *tp, const act *dmine);
/* This rank's rows of a whole (N, width) tensor every member holds (the tensor itself without
 * sp): where a replicated result joins the sequence-parallel residual stream. */
act *tp_local_rows(const ust_tp *tp, act *whole);
/* Leaving a column-parallel half backward: dfull(N, width) holds this rank's partial input
 * gradient; returns the summed gradient of this rank's rows (dfull itself without sp). */
act *tp_reduce_grad(ust_tp *tp, act *dfull);
int tp_size(const ust_tp *tp);
/* The [start, start + len) part of a dimension of size `whole` this rank holds (whole % n == 0). */
int tp_part(const ust_tp *tp, int whole, int *start);
/* This rank's vocabulary rows of a padded vocabulary of Vp. */
void tp_vocab_range(const ust_tp *tp, int Vp, int *v_start, int *v_end);
/* 1 when this rank adds the biases of row-parallel layers and writes tp-replicated tensors. */
int tp_is_first(const ust_tp *tp);

/* x(n) summed over the group, in place: fp32 (norm-weight gradients under sp), and
 * activations: the backward of a column-parallel input, the forward of a row-parallel output. */
void tp_allreduce(ust_tp *tp, float *x, int64_t n);
void tp_allreduce_act(ust_tp *tp, act *x, int64_t n);

/* The two halves of a block (Megatron's ColumnParallelLinear and RowParallelLinear). A half
 * opens with column-parallel linears on its whole input x (tp_gather) and closes with one
 * row-parallel linear whose output is summed over the group:
 *   attention: q, k, v column-parallel (heads split), o row-parallel;
 *   MLP:       gate and up column-parallel (hidden units split), down row-parallel;
 *   head:      lm_head column-parallel over the vocabulary (tp_xent finishes the loss).
 * Column: w holds this rank's OCl = OC/n output rows (b their bias); out(N, OCl) = x @ w^T + b,
 * with no communication. Backward: dx(N, C) = [dx +] dout @ w is this rank's part of the input
 * gradient (tp_reduce_grad sums the half's parts once, on leaving it); dw, db accumulate this
 * rank's rows (NULL: zero-bubble's B, input gradient only; dx NULL: its W, weights only).
 * The _gelu forms fuse gpt2's GELU into the linear (act = gelu(out) forward; the row-parallel
 * backward writes d(pre-activation) instead of d act). */
void tp_column_linear_fwd(ust_tp *tp, act *out, const act *x, const float *w, const float *b,
                          int N, int C, int OCl);
void tp_column_linear_gelu_fwd(ust_tp *tp, act *out, act *act_out, const act *x, const float *w,
                               const float *b, int N, int C, int OCl);
void tp_column_linear_bwd(ust_tp *tp, act *dx, float *dw, float *db, const act *dout, const act *x,
                          const float *w, int N, int C, int OCl, int accumulate);
/* Row: out = inp(N,C_local) @ w(OC,C_local)^T summed over the group, + bias once; out holds
 * this rank's rows (all N without sp; OC must be the model width under sp). */
void tp_row_linear_fwd(ust_tp *tp, act *out, const act *inp, const float *w, const float *bias,
                       int N, int C_local, int OC);
/* Row backward: dout(N, OC) whole (tp_gather_grad); dx(N, C_local) this rank's input columns,
 * dw its weight columns; db the whole bias's gradient, the same on every member (the bias was
 * added once, but every member sees the whole output gradient). */
void tp_row_linear_bwd(ust_tp *tp, act *dx, float *dw, float *db, const act *dout, const act *inp,
                       const float *w, int N, int C_local, int OC);
void tp_row_linear_gelu_bwd(ust_tp *tp, act *dpre, float *dw, float *db, const act *dout,
                            const act *act_in, const act *pre, const float *w, int N, int C_local,
                            int OC);

/* out = wte[tok] (this rank's vocabulary rows, summed over the group) + wpe[pos], for this
 * rank's token rows; backward takes the gradient of those rows. */
void tp_embedding_fwd(ust_tp *tp, act *out, const int32_t *tok, const int32_t *pos,
                      const float *wte, const float *wpe, int B, int T, int C, int Vp);
void tp_embedding_bwd(ust_tp *tp, float *dwte, float *dwpe, const act *dout, const int32_t *tok,
                      const int32_t *pos, int B, int T, int C, int Vp);

/* The same lookup over a table held in row chunks (ZeRO-3's vocabulary chunks), in three
 * steps: begin returns the sum (out, or the sequence-parallel partial) holding the positions;
 * add looks up the tokens of rows [r0, r1) of this rank's slice (wte_rows: those rows) through
 * tmp (B*T*C activations) into it; end reduces the sum over the group into out. Every token
 * falls in one chunk, so the result is tp_embedding_fwd's, bit for bit. */
act *tp_embedding_begin(ust_tp *tp, act *out, const int32_t *tok, const int32_t *pos,
                        const float *wpe, int B, int T, int C);
void tp_embedding_add(ust_tp *tp, act *sum, act *tmp, const int32_t *tok, const float *wte_rows,
                      int r0, int r1, int B, int T, int C, int Vp);
void tp_embedding_end(ust_tp *tp, act *sum, act *out, int B, int T, int C);

/* Cross-entropy over logits(N, Vp/n) of this rank's vocabulary slice: losses(N) (the same on
 * every rank) and, when dscale > 0, dlogits in place of the logits. */
void tp_xent(ust_tp *tp, float *losses, act *logits, const int32_t *targets, int N, int Vp,
             int v_real, float dscale);
/* The same over this rank's slice held as nblk column blocks: block k holds columns
 * [r0[k], r0[k+1]) of the slice as a dense (N, r0[k+1] - r0[k]) array at logits + N * r0[k].
 * Each block's log-sum-exp is merged in block order, then over the group in rank order (an
 * online softmax: exact up to the merge's rounding). scratch: 4N floats; m1, m2: N activations
 * each (the merge's unused outputs). */
void tp_xent_blocks(ust_tp *tp, float *losses, act *logits, const int *r0, int nblk,
                    const int32_t *targets, int N, int Vp, int v_real, float dscale,
                    float *scratch, act *m1, act *m2);

/* This rank's place in the group (tp may be NULL: a group of one). */
int tp_rank(const ust_tp *tp);
/* Every member's n elements gathered into all (n * size, member order), where the MoE layer
 * shares its token split's routing choices (fp32) and rows (activations). mine must be this
 * rank's part of all (at n == 1 it is all: nothing moves). */
void tp_allgather(ust_tp *tp, const float *mine, float *all, int64_t n);
void tp_allgather_act(ust_tp *tp, const act *mine, act *all, int64_t n);

#endif
