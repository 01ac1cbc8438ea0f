/* tp: Megatron-style tensor parallelism inside a layer, over the tp group of n ranks.
 * Column-parallel weights (q, k, v, gate, up; the embedding and lm_head over the vocabulary) are
 * split by output rows, row-parallel ones (o, down) by input columns. Activations between the two
 * halves of a block stay whole on every rank: a column-parallel input is used as is (its gradient
 * is all-reduced in backward), a row-parallel output is all-reduced in forward (its gradient is
 * used as is). Biases of row-parallel layers are added once (on tp rank 0). The cross-entropy is
 * vocab-parallel: each rank only ever holds logits of its own vocabulary slice.
 * With n == 1 every call is the plain single-rank op. */
#ifndef UST_TP_H
#define UST_TP_H

#include <stdint.h>

#include "comm.h"
#include "mem.h"
#include "ops.h"

typedef struct ust_tp {
    const ust_ops *ops;
    ust_comm *comm;
    int n, rank;
    float *lse_all, *tlogit, *merge_out, *merge_out2; /* vocab-parallel loss scratch */
    int max_rows;
} ust_tp;

/* comm may be NULL (no tensor parallelism). max_rows: tokens per micro-batch. */
void tp_init(ust_tp *tp, const ust_ops *ops, ust_comm *comm, ust_arena *arena, int max_rows);
int tp_size(const ust_tp *tp);
/* The [start, start + len) part of a dimension of size `whole` this rank holds (whole % n == 0). */
int tp_part(const ust_tp *tp, int whole, int *start);
/* This rank's vocabulary rows of a padded vocabulary of Vp. */
void tp_vocab_range(const ust_tp *tp, int Vp, int *v_start, int *v_end);
/* 1 when this rank adds the biases of row-parallel layers and writes tp-replicated tensors. */
int tp_is_first(const ust_tp *tp);

/* x(n) summed over the group, in place: the backward of a column-parallel input, and the
 * forward of a row-parallel output. */
void tp_allreduce(ust_tp *tp, float *x, int64_t n);

/* out(N,OC) = inp(N,C_local) @ w(OC,C_local)^T summed over the group, + bias once. */
void tp_row_linear_fwd(ust_tp *tp, float *out, const float *inp, const float *w,
                       const float *bias, int N, int C_local, int OC);

/* out(B,T,C) = wte[tok] (this rank's vocabulary rows, summed over the group) + wpe[pos]. */
void tp_embedding_fwd(ust_tp *tp, float *out, const int32_t *tok, const int32_t *pos,
                      const float *wte, const float *wpe, int B, int T, int C, int Vp);
void tp_embedding_bwd(ust_tp *tp, float *dwte, float *dwpe, const float *dout, const int32_t *tok,
                      const int32_t *pos, int B, int T, int C, int Vp);

/* Cross-entropy over logits(N, Vp/n) of this rank's vocabulary slice: losses(N) (the same on
 * every rank) and, when dscale > 0, dlogits in place of the logits. */
void tp_xent(ust_tp *tp, float *losses, float *logits, const int32_t *targets, int N, int Vp,
             int v_real, float dscale);

#endif
