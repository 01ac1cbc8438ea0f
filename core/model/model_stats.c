/* model_stats.c: logging.stats_every's activation RMS at the blocks' outputs (model.h
 * model_act_track): each training forward's residual stream after every layer, as a sum of
 * squares and a count that the trainer sums over the ranks. */
#include <stdlib.h>
#include <string.h>

#include "model_state.h"
#include "tp.h"

void model_act_track(model *m, double *sq) {
    m->act_sq = sq;
    if (!sq || m->ops->act_size == (int)sizeof(float) || m->act_host) return;
    /* bf16 activations have no device sum of squares (ops.h sumsq reads fp32): one residual
     * tensor goes through the host, allocated once, on the first stats step */
    m->act_host = malloc((size_t)m->shape.Nl * m->shape.C * sizeof(uint16_t));
    UST_ASSERT(m->act_host, "out of host memory (activation statistics)");
}

/* The sum of squares of n bf16 values (the high half of their fp32 bits). */
static double bf16_sumsq(const uint16_t *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)x[i] << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        s += (double)f * f;
    }
    return s;
}

void model_act_add(model *m, int l, const act *x) {
    /* without sp every tp rank holds the same rows: tp rank 0 counts them */
    if (!tp_sp(m->par.tp) && tp_rank(m->par.tp) > 0) return;
    const ust_ops *o = m->ops;
    int64_t n = (int64_t)m->shape.Nl * m->shape.C;
    double s;
    if (o->act_size == (int)sizeof(float)) {
        s = o->sumsq(o, x, n);
    } else {
        o->to_host(o, m->act_host, x, act_bytes(o, n));
        s = bf16_sumsq(m->act_host, n);
    }
    m->act_sq[2 * l] += s;
    m->act_sq[2 * l + 1] += (double)n;
}
