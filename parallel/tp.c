/* tp.c: the collectives tensor parallelism adds to a layer (Megatron's f/g operators). */
#include "tp.h"
#include "log.h"

#include <time.h>

#include "error.h"

/* Waits for r, charging the time to the group's communication total. */
void tp_init(ust_tp *tp, const ust_ops *ops, ust_comm *comm, ust_arena *arena, int max_rows,
             int width, int sp) {
    tp->ops = ops;
    tp->comm = comm;
    tp->n = comm ? comm_size(comm) : 1;
    tp->rank = comm ? comm_rank(comm) : 0;
    tp->max_rows = max_rows;
    tp->width = width;
    tp->sp = sp && tp->n > 1;
    tp_alloc_scratch(tp, arena);
}

void tp_alloc_scratch(ust_tp *tp, ust_arena *arena) {
    const ust_ops *ops = tp->ops;
    int max_rows = tp->max_rows;
    tp->lse_all = tp->tlogit = NULL;
    tp->merge_out = tp->merge_out2 = NULL;
    tp->gath_a = tp->gath_d = tp->partial = tp->dlocal = NULL;
    if (tp->sp) {
        UST_ASSERT(max_rows % tp->n == 0, "%d rows do not split over %d ranks", max_rows, tp->n);
        size_t full = act_bytes(ops, (int64_t)max_rows * tp->width);
        tp->gath_a = mem_alloc(arena, MEM_ACTS, full);
        tp->gath_d = mem_alloc(arena, MEM_ACTS, full);
        tp->partial = mem_alloc(arena, MEM_ACTS, full);
        tp->dlocal = mem_alloc(arena, MEM_ACTS, full / tp->n);
    }
    if (tp->n > 1) {
        tp->lse_all = mem_alloc(arena, MEM_COMM, (size_t)tp->n * max_rows * sizeof(float));
        tp->tlogit = mem_alloc(arena, MEM_COMM, (size_t)max_rows * sizeof(float));
        tp->merge_out = mem_alloc(arena, MEM_COMM, act_bytes(ops, max_rows));
        tp->merge_out2 = mem_alloc(arena, MEM_COMM, act_bytes(ops, max_rows));
    }
}

ust_tp tp_shape(const ust_ops *ops, int n, int max_rows, int width, int sp) {
    ust_tp tp = {
        .ops = ops, .n = n, .rank = 0, .sp = sp && n > 1, .width = width, .max_rows = max_rows};
    return tp;
}

int tp_size(const ust_tp *tp) { return tp ? tp->n : 1; }
int tp_sp(const ust_tp *tp) { return tp->sp; }
int tp_rows(const ust_tp *tp, int N) { return tp->sp ? N / tp->n : N; }

static const act *gather_rows(ust_tp *tp, const act *mine, act *full) {
    if (!tp->sp) return mine;
    size_t count = (size_t)tp->max_rows / tp->n * tp->width;
    comm_req r = comm_allgather(tp->comm, mine, full, count, comm_act_dtype(tp->ops));
    comm_wait(&r);
    return full;
}

/* full(N, width) summed over the group, this rank's rows into mine */
static void reduce_scatter_rows(ust_tp *tp, const act *full, act *mine) {
    size_t count = (size_t)tp->max_rows / tp->n * tp->width;
    comm_req r =
        comm_reduce_scatter(tp->comm, full, mine, count, comm_act_dtype(tp->ops), COMM_SUM);
    comm_wait(&r);
}

int tp_is_first(const ust_tp *tp) { return !tp || tp->rank == 0; }

int tp_part(const ust_tp *tp, int whole, int *start) {
    int n = tp_size(tp), rank = tp ? tp->rank : 0;
    UST_ASSERT(whole % n == 0, "%d does not split over %d tensor-parallel ranks", whole, n);
    *start = rank * (whole / n);
    return whole / n;
}

void tp_vocab_range(const ust_tp *tp, int Vp, int *v_start, int *v_end) {
    int len = tp_part(tp, Vp, v_start);
    *v_end = *v_start + len;
}

static void allreduce(ust_tp *tp, void *x, int64_t n, comm_dtype t) {
    if (tp_size(tp) == 1) return;
    comm_req r = comm_allreduce(tp->comm, x, x, (size_t)n, t, COMM_SUM);
    comm_wait(&r);
}
static void allreduce_act(ust_tp *tp, act *x, int64_t n) {
    allreduce(tp, x, n, comm_act_dtype(tp->ops));
}

void tp_sp_sum_norm_grads(ust_tp *tp, float *dw, float *db, float *part, int C) {
    const ust_ops *o = tp->ops;
    allreduce(tp, part, db ? 2 * C : C, COMM_FP32);
    o->axpy(o, dw, 1.0f, part, C);
    if (db) o->axpy(o, db, 1.0f, part + C, C);
}

void tp_row_linear_fwd(ust_tp *tp, act *out, const act *inp, const float *w, const float *bias,
                       int N, int C_local, int OC) {
    act *sum = tp->sp ? tp->partial : out;
    UST_ASSERT(!tp->sp || (OC == tp->width && N == tp->max_rows), "sp rows %d x %d", N, OC);
    tp->ops->linear_fwd(tp->ops, sum, inp, w, tp_is_first(tp) ? bias : NULL, N, C_local, OC);
    if (tp->sp)
        reduce_scatter_rows(tp, sum, out);
    else
        allreduce_act(tp, out, (int64_t)N * OC);
}

void tp_embedding_fwd(ust_tp *tp, act *out, const int32_t *tok, const int32_t *pos,
                      const float *wte, const float *wpe, int B, int T, int C, int Vp) {
    int v0, v1;
    tp_vocab_range(tp, Vp, &v0, &v1);
    /* rows outside this rank's slice contribute 0; positions are added once */
    act *sum = tp->sp ? tp->partial : out;
    tp->ops->embedding_fwd(tp->ops, sum, tok, pos, wte, tp_is_first(tp) ? wpe : NULL, B, T, C, v0,
                           v1);
    if (tp->sp)
        reduce_scatter_rows(tp, sum, out);
    else
        allreduce_act(tp, out, (int64_t)B * T * C);
}

void tp_embedding_bwd(ust_tp *tp, float *dwte, float *dwpe, const act *dout, const int32_t *tok,
                      const int32_t *pos, int r0, int r1, int B, int T, int C, int Vp) {
    int v0, v1;
    tp_vocab_range(tp, Vp, &v0, &v1);
    /* the gradient of every row is whole on every rank (gathered under sp), so the replicated
     * wpe gets the same gradient everywhere */
    dout = gather_rows(tp, dout, tp->gath_d);
    tp->ops->embedding_bwd(tp->ops, dwte, dwpe, dout, tok, pos, B, T, C, v0 + r0, v0 + r1);
}

act *tp_embedding_begin(ust_tp *tp, act *out, const int32_t *tok, const int32_t *pos,
                        const float *wpe, int B, int T, int C) {
    act *sum = tp->sp ? tp->partial : out;
    tp->ops->embedding_fwd(tp->ops, sum, tok, pos, NULL, tp_is_first(tp) ? wpe : NULL, B, T, C, 0,
                           0);
    return sum;
}

void tp_embedding_add(ust_tp *tp, act *sum, act *tmp, const int32_t *tok, const float *wte_rows,
                      int r0, int r1, int B, int T, int C, int Vp) {
    int v0, v1;
    tp_vocab_range(tp, Vp, &v0, &v1);
    tp->ops->embedding_fwd(tp->ops, tmp, tok, NULL, wte_rows, NULL, B, T, C, v0 + r0, v0 + r1);
    tp->ops->add(tp->ops, sum, sum, tmp, (int64_t)B * T * C);
}

void tp_embedding_end(ust_tp *tp, act *sum, act *out, int B, int T, int C) {
    if (tp->sp)
        reduce_scatter_rows(tp, sum, out);
    else
        allreduce_act(tp, out, (int64_t)B * T * C);
}

void tp_xent_blocks(ust_tp *tp, float *losses, act *logits, const int *r0, int nblk,
                    const int32_t *targets, int N, int Vp, int v_real, float dscale, float softcap,
                    float *scratch, act *m1, act *m2) {
    const ust_ops *o = tp->ops;
    UST_ASSERT(o->xent_vp_local && o->xent_vp_finish,
               "the %s backend has no vocab-parallel cross-entropy", o->name);
    int v0, n = tp_size(tp);
    tp_part(tp, Vp, &v0);
    float *lse = scratch, *tl = scratch + N, *lse_k = scratch + 2 * N, *tl_k = scratch + 3 * N;
    for (int k = 0; k < nblk; k++) {
        const act *blk = act_at(o, logits, (int64_t)N * r0[k]);
        o->xent_vp_local(o, k ? lse_k : lse, k ? tl_k : tl, blk, targets, N, r0[k + 1] - r0[k],
                         v0 + r0[k], v_real, softcap);
        if (!k) continue;
        o->attention_merge(o, m1, lse, m2, lse_k, 1, N, 1, 1);
        o->axpy(o, tl, 1.0f, tl_k, N); /* at most one block holds a row's target */
    }
    if (n > 1) {
        UST_ASSERT(N <= tp->max_rows, "%d rows > %d", N, tp->max_rows);
        float *mine = tp->lse_all + (int64_t)tp->rank * N;
        o->copy(o, mine, lse, (size_t)N * sizeof(float));
        o->copy(o, tp->tlogit, tl, (size_t)N * sizeof(float));
        comm_req r[2] = {comm_allgather(tp->comm, mine, tp->lse_all, N, COMM_FP32),
                         comm_allreduce(tp->comm, tp->tlogit, tp->tlogit, N, COMM_FP32, COMM_SUM)};
        comm_wait_all(r, 2);
        lse = tp->lse_all;
        for (int s = 1; s < n; s++)
            o->attention_merge(o, tp->merge_out, lse, tp->merge_out2, tp->lse_all + (int64_t)s * N,
                               1, N, 1, 1);
        tl = tp->tlogit;
    }
    for (int k = 0; k < nblk; k++) {
        act *blk = act_at(o, logits, (int64_t)N * r0[k]);
        o->xent_vp_finish(o, losses, dscale > 0 ? blk : NULL, blk, targets, lse, tl, N,
                          r0[k + 1] - r0[k], v0 + r0[k], v_real, dscale, softcap);
    }
}

void tp_xent(ust_tp *tp, float *losses, act *logits, const int32_t *targets, int N, int Vp,
             int v_real, float dscale, float softcap) {
    const ust_ops *o = tp->ops;
    if (tp_size(tp) == 1) {
        o->xent_fwd_bwd(o, losses, dscale > 0 ? logits : NULL, logits, targets, N, Vp, v_real,
                        dscale, softcap);
        return;
    }
    UST_ASSERT(o->xent_vp_local && o->xent_vp_finish,
               "the %s backend has no vocab-parallel cross-entropy", o->name);
    UST_ASSERT(N <= tp->max_rows, "%d rows > %d", N, tp->max_rows);
    int v0, V = tp_part(tp, Vp, &v0);
    float *mine = tp->lse_all + (int64_t)tp->rank * N;
    o->xent_vp_local(o, mine, tp->tlogit, logits, targets, N, V, v0, v_real, softcap);
    comm_req r[2] = {comm_allgather(tp->comm, mine, tp->lse_all, N, COMM_FP32),
                     comm_allreduce(tp->comm, tp->tlogit, tp->tlogit, N, COMM_FP32, COMM_SUM)};
    comm_wait_all(r, 2);
    /* log-sum-exp of the shards, merged in rank order so every rank gets the same bits */
    float *lse = tp->lse_all;
    for (int s = 1; s < tp->n; s++)
        o->attention_merge(o, tp->merge_out, lse, tp->merge_out2, tp->lse_all + (int64_t)s * N, 1,
                           N, 1, 1);
    o->xent_vp_finish(o, losses, dscale > 0 ? logits : NULL, logits, targets, lse, tp->tlogit, N, V,
                      v0, v_real, dscale, softcap);
}

/* ------------------------------------------------------------------ the two halves' linears */

const act *tp_column_open(ust_tp *tp, const act *x_mine) {
    return gather_rows(tp, x_mine, tp->gath_a);
}

void tp_column_linear_fwd(ust_tp *tp, act *out, const act *x, const float *w, const float *b, int N,
                          int C, int OC) {
    tp->ops->linear_fwd(tp->ops, out, x, w, b, N, C, OC);
}

void tp_column_linear_bwd(ust_tp *tp, act *dx, float *dw, float *db, const act *dout, const act *x,
                          const float *w, int N, int C, int OC, int accumulate) {
    tp->ops->linear_bwd(tp->ops, dx, dw, db, dout, x, w, N, C, OC, accumulate);
}

/* The group's input is shared by the group: each rank's part of its gradient is summed once,
 * this rank's rows kept (reduce-scattered under sp) */
act *tp_column_close_bwd(ust_tp *tp, act *dx) {
    if (!tp->sp) {
        allreduce_act(tp, dx, (int64_t)tp->max_rows * tp->width);
        return dx;
    }
    reduce_scatter_rows(tp, dx, tp->dlocal);
    return tp->dlocal;
}

void tp_column_fwd(ust_tp *tp, const act *x_mine, const tp_col *cols, int ncols, int N, int C) {
    const act *x = tp_column_open(tp, x_mine);
    for (int i = 0; i < ncols; i++) {
        const tp_col *c = &cols[i];
        if (c->gelu)
            tp->ops->linear_gelu_fwd(tp->ops, c->out, c->gelu, x, c->w, c->b, N, C, c->OC);
        else
            tp_column_linear_fwd(tp, c->out, x, c->w, c->b, N, C, c->OC);
    }
}

act *tp_column_bwd(ust_tp *tp, act *dx, const act *x_mine, const tp_col *cols, int ncols, int N,
                   int C) {
    const act *x = tp_column_open(tp, x_mine); /* sp: gathered again rather than kept */
    for (int i = 0; i < ncols; i++)
        tp_column_linear_bwd(tp, dx, cols[i].dw, cols[i].db, cols[i].out, x, cols[i].w, N, C,
                             cols[i].OC, i > 0);
    return tp_column_close_bwd(tp, dx);
}

const act *tp_row_linear_bwd(ust_tp *tp, act *dx, float *dw, float *db, const act *dout_mine,
                             const act *inp, const float *w, int N, int C_local, int OC) {
    const act *dout = gather_rows(tp, dout_mine, tp->gath_d);
    tp->ops->linear_bwd(tp->ops, dx, dw, db, dout, inp, w, N, C_local, OC, 0);
    return dout;
}

const act *tp_row_linear_gelu_bwd(ust_tp *tp, act *dpre, float *dw, float *db, const act *dout_mine,
                                  const act *act_in, const act *pre, const float *w, int N,
                                  int C_local, int OC) {
    const act *dout = gather_rows(tp, dout_mine, tp->gath_d);
    tp->ops->linear_gelu_bwd(tp->ops, dpre, dw, db, dout, act_in, pre, w, N, C_local, OC);
    return dout;
}

void tp_linear_wgrad(ust_tp *tp, float *dw, float *db, const act *dout, const act *x, int N, int C,
                     int OC) {
    tp->ops->linear_bwd(tp->ops, NULL, dw, db, dout, x, NULL, N, C, OC, 0);
}

int tp_rank(const ust_tp *tp) { return tp ? tp->rank : 0; }

static void allgather(ust_tp *tp, const void *mine, void *all, int64_t n, comm_dtype t) {
    if (tp_size(tp) == 1) return;
    comm_req r = comm_allgather(tp->comm, mine, all, (size_t)n, t);
    comm_wait(&r);
}
void tp_allgather(ust_tp *tp, const float *mine, float *all, int64_t n) {
    allgather(tp, mine, all, n, COMM_FP32);
}
void tp_allgather_act(ust_tp *tp, const act *mine, act *all, int64_t n) {
    allgather(tp, mine, all, n, comm_act_dtype(tp->ops));
}

void tp_allreduce(ust_tp *tp, float *x, int64_t n) { allreduce(tp, x, n, COMM_FP32); }
