/* dp_stats.c: logging.stats_every's per-layer figures from the optimizer's buffers: the
 * gradients' and parameters' sums of squares and the update's (the parameters less a copy kept
 * before the step), grouped by the caller's groups and summed over the ranks exactly as the
 * gradient norm is: tensor-split pieces over tp, replicated ones once, experts over ep,
 * partitions over the ZeRO group, stages over the pipeline. */
#include <stdlib.h>

#include "dp.h"
#include "dp_internal.h"
#include "error.h"

/* comm_sum_doubles sums at most 4 values a call. */
static void sum_many(dp_state *d, ust_comm *c, double *x, int n) {
    for (int k = 0; k < n; k += 4)
        comm_sum_doubles(c, d->ops, d->red.scalar, x + k, n - k < 4 ? n - k : 4);
}

/* Sums of squares per group of the buffer at base (laid out as the parameters, or as the
 * gradients when grads) over the pieces this rank holds, then over the ranks. */
static void group_sumsq(dp_state *d, const float *base, int grads, const int *group, int G,
                        double *out) {
    int part = d->stage >= 1, ns = d->buf.nseg_norm;
    ops_segment *seg = malloc((ns ? ns : 1) * sizeof *seg);
    double *split = calloc(3 * (size_t)G + (ns ? ns : 1), sizeof *split);
    UST_ASSERT(seg && split, "out of memory (stats of %d segments)", ns);
    double *repl = split + G, *experts = repl + G, *ss = experts + G;
    for (int s = 0; s < ns; s++) /* sumsq_many reads each segment's g */
        seg[s] = d->buf.seg[s], seg[s].g = grads ? seg[s].g : seg[s].p;
    d->ops->sumsq_many(d->ops, base, seg, ns, ss);
    for (int s = 0; s < ns; s++) {
        int i = d->buf.seg_param[s], g = group[i];
        *(model_unit_is_expert(d->m, model_param_unit(d->m, i)) ? &experts[g]
          : model_param_at(d->m, i)->tp_split                   ? &split[g]
                                                                : &repl[g]) += ss[s];
    }
    if (!part && d->ep) sum_many(d, d->ep, experts, G);
    for (int g = 0; g < G; g++) repl[g] += experts[g]; /* split then repl: 2G in a row */
    if (part) sum_many(d, d->comm, split, 2 * G);
    sum_many(d, d->mp, split, G); /* replicated pieces are the same on every tp rank */
    sum_many(d, d->pipe, split, 2 * G);
    for (int g = 0; g < G; g++) out[g] = split[g] + repl[g];
    free(seg);
    free(split);
}

static int64_t params_len(const dp_state *d) {
    return whole(d, BUF_PARAMS) ? d->lay.numel : d->lay.shard_numel;
}

void dp_stats_before(dp_state *d, const int *group, int ngroups, double *gsq) {
    UST_ASSERT(d->buf.snap, "dp_stats_before without logging.stats_every");
    group_sumsq(d, buf_base(d, BUF_GRADS), 1, group, ngroups, gsq);
    d->ops->copy(d->ops, d->buf.snap, buf_base(d, BUF_PARAMS), params_len(d) * sizeof(float));
}

void dp_stats_after(dp_state *d, const int *group, int ngroups, double *wsq, double *usq) {
    int64_t n = params_len(d);
    float *p = buf_base(d, BUF_PARAMS);
    d->ops->scale(d->ops, d->buf.snap, -1.0f, n);
    d->ops->axpy(d->ops, d->buf.snap, 1.0f, p, n); /* the update: now - before */
    group_sumsq(d, p, 0, group, ngroups, wsq);
    group_sumsq(d, d->buf.snap, 0, group, ngroups, usq);
}
