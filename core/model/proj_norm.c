/* proj_norm.c: model.qk_norm_whole (OLMo 2's q_norm/k_norm over the whole projection). The mean
 * square runs over every head of the token, but under tensor parallelism a rank holds only its
 * heads' (N, W) columns of the (N, n W) rows. On the CPU the ranks all-reduce each row's sum of
 * squares (N values; and in backward each row's sum of w dy x) and norm their own columns with
 * their slice of the whole weight; the weight's gradient columns are then all-gathered so it is
 * the same on every rank, as a replicated weight's must be. On CUDA (no row kernels yet) the
 * columns are all-gathered into whole rows (N n W values) that every rank norms. One rank: the
 * ops on the rows as they are. */
#include "proj_norm.h"

#include <string.h>

#include "tp.h"

/* The row-sum variant (the CPU backend's row ops, ops.h ops_cpu_rows_*). */
static int by_sums(const model *m) { return m->cfg->run.device != DEV_CUDA; }

/* whole (N, n*W) from each rank's (N, W) columns, rank r's at column r*W; the stage buffer
 * receives the gather. Returns whole, or mine itself on one rank. */
static const act *gather_rows(model *m, act *whole, const act *mine, int N, int W) {
    const ust_ops *o = m->ops;
    int n = tp_size(m->par.tp);
    if (n == 1) return mine;
    tp_allgather_act(m->par.tp, mine, m->acts.pn_stage, (int64_t)N * W);
    size_t w = act_bytes(o, W);
    for (int r = 0; r < n; r++)
        o->copy2d(o, act_at(o, whole, (int64_t)r * W), w * n,
                  act_at(o, m->acts.pn_stage, (int64_t)r * N * W), w, w, (size_t)N);
    return whole;
}

/* mine (N, W) = this rank's columns of whole (N, n*W) */
static void keep_mine(model *m, act *mine, const act *whole, int N, int W) {
    const ust_ops *o = m->ops;
    int n = tp_size(m->par.tp);
    size_t w = act_bytes(o, W);
    o->copy2d(o, mine, w, act_at(o, whole, (int64_t)tp_rank(m->par.tp) * W), w * n, w, (size_t)N);
}

void proj_norm_forward(model *m, act *out, float *rstd, const act *inp, const float *w, int heads) {
    const ust_ops *o = m->ops;
    int N = m->shape.B * m->shape.T, W = heads * m->shape.D, n = tp_size(m->par.tp);
    if (n == 1) {
        o->rmsnorm_fwd(o, out, rstd, inp, w, N, W, m->shape.eps);
        return;
    }
    if (by_sums(m)) { /* the rows' sums of squares over the group, then our columns */
        ops_cpu_rows_sumsq(m->acts.pn_sums, inp, N, W);
        tp_allreduce(m->par.tp, m->acts.pn_sums, N);
        ops_cpu_rmsnorm_rows_fwd(out, rstd, inp, w + (int64_t)tp_rank(m->par.tp) * W,
                                 m->acts.pn_sums, N, W, n * W, m->shape.eps);
        return;
    }
    const act *x = gather_rows(m, m->acts.pn_x, inp, N, W);
    o->rmsnorm_fwd(o, m->acts.pn_y, rstd, x, w, N, W * n, m->shape.eps);
    keep_mine(m, out, m->acts.pn_y, N, W);
}

/* The row-sum variant's backward: d inp needs each row's sum of w dy x over the group; the
 * weight's gradient is our columns' (N sums each), gathered into the whole so every rank adds
 * the same. */
static void backward_by_sums(model *m, act *dinp, float *dw, const act *dout, const act *inp,
                             const float *w, const float *rstd, int heads) {
    int N = m->shape.B * m->shape.T, W = heads * m->shape.D, n = tp_size(m->par.tp);
    const float *wm = w + (int64_t)tp_rank(m->par.tp) * W;
    float *dot = m->acts.pn_sums, *part = dot + N, *all = part + W;
    if (dinp) {
        ops_cpu_rows_wdot(dot, dout, inp, wm, N, W);
        tp_allreduce(m->par.tp, dot, N);
    }
    if (dw) memset(part, 0, (size_t)W * sizeof(float));
    ops_cpu_rmsnorm_rows_bwd(dinp, dw ? part : NULL, dout, inp, wm, rstd, dot, N, W, n * W);
    if (!dw) return;
    tp_allgather(m->par.tp, part, all, W);
    m->ops->axpy(m->ops, dw, 1.0f, all, (int64_t)n * W);
}

/* dinp (this rank's columns; NULL: none) and dw (NULL: none) from dout */
static void backward(model *m, act *dinp, float *dw, const act *dout, const act *inp,
                     const float *w, const float *rstd, int heads) {
    const ust_ops *o = m->ops;
    int N = m->shape.B * m->shape.T, W = heads * m->shape.D, n = tp_size(m->par.tp);
    if (n == 1) { /* datt: scratch of N * max(H*D, F), free once attention's backward has run */
        o->rmsnorm_bwd(o, dinp ? m->acts.datt : NULL, dw, dout, inp, w, rstd, N, W);
        if (dinp) o->copy(o, dinp, m->acts.datt, act_bytes(o, (int64_t)N * W));
        return;
    }
    if (by_sums(m)) {
        backward_by_sums(m, dinp, dw, dout, inp, w, rstd, heads);
        return;
    }
    const act *x = gather_rows(m, m->acts.pn_x, inp, N, W);
    const act *dy = gather_rows(m, m->acts.pn_y, dout, N, W);
    o->rmsnorm_bwd(o, dinp ? m->acts.pn_stage : NULL, dw, dy, x, w, rstd, N, W * n);
    if (dinp) keep_mine(m, dinp, m->acts.pn_stage, N, W);
}
void proj_norm_wgrad(model *m, float *dw, const act *dout, const act *inp, const float *w,
                     const float *rstd, int heads) {
    backward(m, NULL, dw, dout, inp, w, rstd, heads);
}

void proj_norm_backward(model *m, const deferral *df, act *d, const act *inp, float *const *w,
                        float **gw, const float *rstd, int heads, act *keep) {
    int N = m->shape.B * m->shape.T;
    if (df->list)
        block_later(m, df,
                    (wg_job){.kind = WG_PROJNORM,
                             .dw = gw,
                             .dout = d,
                             .x = inp,
                             .w = w,
                             .rstd = rstd,
                             .N = heads},
                    keep, (int64_t)N * heads * m->shape.D);
    backward(m, d, block_now(df, *gw), d, inp, *w, rstd, heads);
}
