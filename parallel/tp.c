/* tp.c: the collectives tensor parallelism adds to a layer (Megatron's f/g operators). */
#include "tp.h"

#include "error.h"

void tp_init(ust_tp *tp, const ust_ops *ops, ust_comm *comm, ust_arena *arena, int max_rows) {
    tp->ops = ops;
    tp->comm = comm;
    tp->n = comm ? comm_size(comm) : 1;
    tp->rank = comm ? comm_rank(comm) : 0;
    tp->max_rows = max_rows;
    tp->lse_all = tp->tlogit = tp->merge_out = tp->merge_out2 = NULL;
    if (tp->n > 1) {
        tp->lse_all = mem_alloc(arena, MEM_COMM, (size_t)tp->n * max_rows * sizeof(float));
        tp->tlogit = mem_alloc(arena, MEM_COMM, (size_t)max_rows * sizeof(float));
        tp->merge_out = mem_alloc(arena, MEM_COMM, (size_t)max_rows * sizeof(float));
        tp->merge_out2 = mem_alloc(arena, MEM_COMM, (size_t)max_rows * sizeof(float));
    }
}

int tp_size(const ust_tp *tp) { return tp ? tp->n : 1; }
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

void tp_allreduce(ust_tp *tp, float *x, int64_t n) {
    if (tp_size(tp) == 1) return;
    comm_req r = comm_allreduce(tp->comm, x, x, (size_t)n, COMM_FP32, COMM_SUM);
    comm_wait(&r);
}

void tp_row_linear_fwd(ust_tp *tp, float *out, const float *inp, const float *w,
                       const float *bias, int N, int C_local, int OC) {
    tp->ops->linear_fwd(tp->ops, out, inp, w, tp_is_first(tp) ? bias : NULL, N, C_local, OC);
    tp_allreduce(tp, out, (int64_t)N * OC);
}

void tp_embedding_fwd(ust_tp *tp, float *out, const int32_t *tok, const int32_t *pos,
                      const float *wte, const float *wpe, int B, int T, int C, int Vp) {
    int v0, v1;
    tp_vocab_range(tp, Vp, &v0, &v1);
    /* rows outside this rank's slice contribute 0; positions are added once */
    tp->ops->embedding_fwd(tp->ops, out, tok, pos, wte, tp_is_first(tp) ? wpe : NULL, B, T, C, v0,
                           v1);
    tp_allreduce(tp, out, (int64_t)B * T * C);
}

void tp_embedding_bwd(ust_tp *tp, float *dwte, float *dwpe, const float *dout, const int32_t *tok,
                      const int32_t *pos, int B, int T, int C, int Vp) {
    int v0, v1;
    tp_vocab_range(tp, Vp, &v0, &v1);
    /* dout is whole on every rank, so the replicated wpe gets the same gradient everywhere */
    tp->ops->embedding_bwd(tp->ops, dwte, dwpe, dout, tok, pos, B, T, C, v0, v1);
}

void tp_xent(ust_tp *tp, float *losses, float *logits, const int32_t *targets, int N, int Vp,
             int v_real, float dscale) {
    const ust_ops *o = tp->ops;
    if (tp_size(tp) == 1) {
        o->xent_fwd_bwd(o, losses, dscale > 0 ? logits : NULL, logits, targets, N, Vp, v_real,
                        dscale);
        return;
    }
    UST_ASSERT(o->xent_vp_local && o->xent_vp_finish,
               "the %s backend has no vocab-parallel cross-entropy", o->name);
    UST_ASSERT(N <= tp->max_rows, "%d rows > %d", N, tp->max_rows);
    int v0, V = tp_part(tp, Vp, &v0);
    float *mine = tp->lse_all + (int64_t)tp->rank * N;
    o->xent_vp_local(o, mine, tp->tlogit, logits, targets, N, V, v0, v_real);
    comm_req r[2] = {comm_allgather(tp->comm, mine, tp->lse_all, N, COMM_FP32),
                     comm_allreduce(tp->comm, tp->tlogit, tp->tlogit, N, COMM_FP32, COMM_SUM)};
    comm_wait_all(r, 2);
    /* log-sum-exp of the shards, merged in rank order so every rank gets the same bits */
    float *lse = tp->lse_all;
    for (int s = 1; s < tp->n; s++)
        o->attention_merge(o, tp->merge_out, lse, tp->merge_out2, tp->lse_all + (int64_t)s * N, 1,
                           N, 1, 1);
    o->xent_vp_finish(o, losses, dscale > 0 ? logits : NULL, logits, targets, lse, tp->tlogit, N,
                      V, v0, v_real, dscale);
}
