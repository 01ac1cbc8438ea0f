/* tp: Megatron-style tensor parallelism inside a layer, over the tp group of n ranks.
 * Column-parallel weights (q, k, v, gate, up; the embedding and lm_head over the vocabulary) are
 * split by output rows, row-parallel ones (o, down) by input columns. The linears own their
 * collectives: a column-parallel group gathers its input's rows (sp) and sums its input gradient
 * once on leaving (all-reduce, or reduce-scatter under sp); a row-parallel linear sums its output
 * and gathers its output gradient. Row-parallel biases are added once (tp rank 0). The
 * cross-entropy is vocab-parallel: each rank only holds logits of its own vocabulary slice.
 * Sequence parallelism (sp) splits the token rows outside the halves; their norms' weight
 * gradients are summed by tp_sp_sum_norm_grads. With n == 1 every call is the single-rank op. */
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
 * gradients are summed over the group. Same traffic as the all-reduces it replaces. */
int tp_size(const ust_tp *tp);
/* The [start, start + len) part of a dimension of size `whole` this rank holds (whole % n == 0). */
int tp_part(const ust_tp *tp, int whole, int *start);
/* This rank's vocabulary rows of a padded vocabulary of Vp. */
void tp_vocab_range(const ust_tp *tp, int Vp, int *v_start, int *v_end);
/* 1 when this rank adds the biases of row-parallel layers and writes tp-replicated tensors. */
int tp_is_first(const ust_tp *tp);

/* A norm's weight (and bias) gradient under sp: part holds this rank's C (+ C bias) partial
 * sums; their sum over the group is added into dw (and db, when not NULL). */
void tp_sp_sum_norm_grads(ust_tp *tp, float *dw, float *db, float *part, int C);

/* The two halves of a block (Megatron's ColumnParallelLinear and RowParallelLinear). A half
 * opens with a group of column-parallel linears sharing its input and closes with one
 * row-parallel linear whose output is summed over the group:
 *   attention: q, k, v column-parallel (heads split), o row-parallel;
 *   MLP:       gate and up column-parallel (hidden units split), down row-parallel;
 *   head:      lm_head column-parallel over the vocabulary (tp_xent finishes the loss).
 * A column linear holds this rank's OC = OC_whole/n output rows of w (b their bias). */
typedef struct {
    act *out;  /* forward: (N, OC) = x @ w^T + b; backward: its gradient */
    act *gelu; /* forward only, gpt2's fused GELU: gelu(out) (NULL: none) */
    const float *w, *b;
    float *dw, *db; /* backward: accumulated (NULL: none, or deferred by zero-bubble's B) */
    int OC;
} tp_col;
/* x_mine: this rank's rows of the group's input (all N rows without sp), gathered once. */
void tp_column_fwd(ust_tp *tp, const act *x_mine, const tp_col *cols, int ncols, int N, int C);
/* Gathers x_mine again (sp), dx(N, C) = sum over cols of dout @ w (this rank's part), dw, db
 * as each col says; returns this rank's rows of d x summed over the group (dx, or scratch). */
act *tp_column_bwd(ust_tp *tp, act *dx, const act *x_mine, const tp_col *cols, int ncols, int N,
                   int C);
/* The same group one linear at a time, where the caller works between them (the vocabulary
 * chunks' hooks, zero-bubble's deferred W): open returns the group's whole input (scratch,
 * valid until the next open), the linears take it, close_bwd sums the input gradient as
 * tp_column_bwd does. dx NULL: weights only; accumulate: dx += rather than =. */
const act *tp_column_open(ust_tp *tp, const act *x_mine);
void tp_column_linear_fwd(ust_tp *tp, act *out, const act *x, const float *w, const float *b, int N,
                          int C, int OC);
void tp_column_linear_bwd(ust_tp *tp, act *dx, float *dw, float *db, const act *dout, const act *x,
                          const float *w, int N, int C, int OC, int accumulate);
act *tp_column_close_bwd(ust_tp *tp, act *dx);
/* Row: out = inp(N,C_local) @ w(OC,C_local)^T summed over the group, + bias once; out holds
 * this rank's rows (all N without sp; OC must be the model width under sp). */
void tp_row_linear_fwd(ust_tp *tp, act *out, const act *inp, const float *w, const float *bias,
                       int N, int C_local, int OC);
/* Row backward from dout_mine, this rank's rows of the output gradient (gathered here under
 * sp): dx(N, C_local) this rank's input columns, dw its weight columns; db the whole bias's
 * gradient, the same on every member. Returns the whole output gradient it used (scratch, valid
 * until the next row backward), for a deferred dw. The _gelu form writes d(pre-activation). */
const act *tp_row_linear_bwd(ust_tp *tp, act *dx, float *dw, float *db, const act *dout_mine,
                             const act *inp, const float *w, int N, int C_local, int OC);
const act *tp_row_linear_gelu_bwd(ust_tp *tp, act *dpre, float *dw, float *db, const act *dout_mine,
                                  const act *act_in, const act *pre, const float *w, int N,
                                  int C_local, int OC);
/* Zero-bubble's W for either kind: dw (+ db) += dout^T @ x from the whole output gradient and
 * the linear's whole input (a column group's as tp_column_open returned it). */
void tp_linear_wgrad(ust_tp *tp, float *dw, float *db, const act *dout, const act *x, int N, int C,
                     int OC);

/* out = wte[tok] (this rank's vocabulary rows, summed over the group) + wpe[pos], for this
 * rank's token rows; backward takes the gradient of those rows (gathered here under sp), for
 * rows [r0, r1) of this rank's vocabulary slice (dwte holds those rows; NULL: none). */
void tp_embedding_fwd(ust_tp *tp, act *out, const int32_t *tok, const int32_t *pos,
                      const float *wte, const float *wpe, int B, int T, int C, int Vp);
void tp_embedding_bwd(ust_tp *tp, float *dwte, float *dwpe, const act *dout, const int32_t *tok,
                      const int32_t *pos, int r0, int r1, int B, int T, int C, int Vp);

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
 * every rank) and, when dscale > 0, dlogits in place of the logits; softcap (model.final_softcap,
 * 0: none) as ops.h's xent_fwd_bwd: over c tanh(logits / c), dlogits of the raw logits. */
void tp_xent(ust_tp *tp, float *losses, act *logits, const int32_t *targets, int N, int Vp,
             int v_real, float dscale, float softcap);
/* The same over this rank's slice held as nblk column blocks: block k holds columns
 * [r0[k], r0[k+1]) of the slice as a dense (N, r0[k+1] - r0[k]) array at logits + N * r0[k].
 * Each block's log-sum-exp is merged in block order, then over the group in rank order (an
 * online softmax: exact up to the merge's rounding). scratch: 4N floats; m1, m2: N activations
 * each (the merge's unused outputs). */
void tp_xent_blocks(ust_tp *tp, float *losses, act *logits, const int *r0, int nblk,
                    const int32_t *targets, int N, int Vp, int v_real, float dscale, float softcap,
                    float *scratch, act *m1, act *m2);

/* This rank's place in the group (tp may be NULL: a group of one). */
int tp_rank(const ust_tp *tp);
/* Every member's n elements gathered into all (n * size, member order), where the MoE layer
 * shares its token split's routing choices (fp32) and rows (activations). mine must be this
 * rank's part of all (at n == 1 it is all: nothing moves). */
void tp_allgather(ust_tp *tp, const float *mine, float *all, int64_t n);
void tp_allgather_act(ust_tp *tp, const act *mine, act *all, int64_t n);
/* x(n) fp32 summed over the group in place, where the MoE layer's members saw different tokens:
 * its replicated weights' gradients and its routing statistics. */
void tp_allreduce(ust_tp *tp, float *x, int64_t n);

#endif
