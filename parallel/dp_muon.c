/* dp_muon.c: Muon over the ZeRO shards and tensor-parallel slices (dp_internal.h). Newton-Schulz
 * needs each matrix whole, so per unit holding Muon matrices: the momentum runs on the pieces
 * this rank holds (elementwise); under ZeRO-1..3 the unit's updates are all-gathered over its
 * group, each matrix is orthogonalised by one member (its owner: matrices are dealt to the
 * members balancing Newton-Schulz FLOPs), the others zero it, and a reduce-scatter (a sum with
 * zeros: exact) returns every member its partition of the results. Under ZeRO-0 every rank holds
 * everything and orthogonalises every matrix itself (no traffic). A matrix split over tensor
 * parallelism is all-gathered over the tp group first and each member keeps its slice. */
#include "dp_internal.h"

#include <stdlib.h>
#include <string.h>

#include "optim_muon.h"

/* Newton-Schulz FLOPs of an rows x cols matrix per iteration: two k x k x K products and one
 * k x k x k (k the smaller side). */
static double ns_flops(const model_param *q) {
    double r = (double)q->whole.shape[0], c = (double)q->whole.shape[1];
    double k = r < c ? r : c, K = r < c ? c : r;
    return 4 * k * k * K + 2 * k * k * k;
}

typedef struct {
    double cost;
    int k;
} by_cost;

static int cmp_cost(const void *a, const void *b) {
    const by_cost *x = a, *y = b;
    if (x->cost != y->cost) return x->cost > y->cost ? -1 : 1;
    return x->k - y->k; /* the same order on every member */
}

/* Longest-first greedy: each matrix to the least loaded member of its unit's group (dense and
 * expert groups apart). Every member of a group lists the same matrices, so all agree. */
static void assign_owners(dp_state *d) {
    dp_muon *mu = &d->muon;
    by_cost *order = calloc(mu->n ? mu->n : 1, sizeof *order);
    int nmax = d->n > 1 ? d->n : 1;
    for (int k = 0; k < mu->n; k++) {
        int u = model_param_unit(d->m, mu->param[k]);
        if (d->lay.un[u] > nmax) nmax = d->lay.un[u];
        order[k] = (by_cost){ns_flops(model_param_at(d->m, mu->param[k])), k};
    }
    double *load = calloc(2 * (size_t)nmax, sizeof *load);
    UST_ASSERT(order && load, "out of host memory");
    qsort(order, mu->n, sizeof *order, cmp_cost);
    for (int j = 0; j < mu->n; j++) {
        int k = order[j].k, u = model_param_unit(d->m, mu->param[k]);
        double *l = load + (model_unit_is_expert(d->m, u) ? nmax : 0);
        int best = 0;
        for (int r = 1; r < d->lay.un[u]; r++)
            if (l[r] < l[best]) best = r;
        l[best] += order[j].cost;
        mu->owner[k] = best;
    }
    free(order);
    free(load);
}

void dp_muon_create(dp_state *d, ust_arena *a) {
    dp_muon *mu = &d->muon;
    int np = model_num_params(d->m);
    mu->param = calloc(np ? np : 1, sizeof *mu->param);
    mu->owner = calloc(np ? np : 1, sizeof *mu->owner);
    UST_ASSERT(mu->param && mu->owner, "out of host memory");
    mu->tp = d->cfg->parallel.tp; /* the memory plan has no tp communicator, only its size */
    int64_t work = 0, big = 0;
    for (int i = 0; i < np; i++) {
        const model_param *q = model_param_at(d->m, i);
        if (!optim_muon_takes(d->cfg, q->matrix)) continue;
        mu->param[mu->n++] = i;
        int64_t w = optim_ns_work(q->whole.shape[0], q->whole.shape[1]);
        work = w > work ? w : work;
        if (q->tp_split && q->whole.shape[0] * q->whole.shape[1] > big)
            big = q->whole.shape[0] * q->whole.shape[1];
    }
    if (!mu->n) return;
    mu->work = mem_alloc(a, MEM_OPTIM, (size_t)work * sizeof(float));
    if (mu->tp > 1 && big) {
        mu->whole = mem_alloc(a, MEM_OPTIM, (size_t)big * sizeof(float));
        mu->gath = mem_alloc(a, MEM_OPTIM, (size_t)big * sizeof(float));
    }
    assign_owners(d);
}

void dp_muon_destroy(dp_state *d) {
    free(d->muon.param);
    free(d->muon.owner);
}

/* The buffer a unit's updates are whole in: the gradients themselves under ZeRO-0/1, a working
 * buffer under ZeRO-2/3 (free once the gradients are reduced; ZeRO-2's unit 0 has its own). */
static float *unit_buf(dp_state *d, int u) {
    if (d->stage < 2) return d->buf.g_whole + d->lay.uoff[u];
    return u == 0 && d->stage == 2 ? d->red.work_emb : d->red.work[0];
}

/* Orthogonalises parameter i's update X (this rank's tp slice, whole over dp). A split matrix is
 * gathered over the tp group (rank order is slice order), put in row-major order, and every
 * member runs the same iteration on the same matrix and keeps its slice. */
static void orthogonalise(dp_state *d, int i, float *X) {
    const model_param *q = model_param_at(d->m, i);
    const ust_ops *o = d->ops;
    int steps = d->cfg->optimizer.ns_steps;
    int64_t R = q->whole.shape[0], C = q->whole.shape[1], lc = q->slice.ncols, n = q->numel;
    if (n == R * C) {
        optim_newton_schulz(o, X, (int)R, (int)C, steps, d->muon.work);
        return;
    }
    int tp = d->muon.tp, t = comm_rank(d->mp);
    UST_ASSERT(n * tp == R * C &&
                   (lc == C ? q->slice.row0 == t * (R / tp) : q->slice.col0 == t * lc),
               "%s: slice %lldx%lld of %lldx%lld at tp rank %d", q->name, (long long)q->slice.nrows,
               (long long)lc, (long long)R, (long long)C, t);
    comm_req r = comm_allgather(d->mp, X, d->muon.gath, (size_t)n, COMM_FP32);
    comm_wait(&r);
    size_t f = sizeof(float);
    if (lc == C) { /* split by rows: the slices in rank order are the matrix */
        optim_newton_schulz(o, d->muon.gath, (int)R, (int)C, steps, d->muon.work);
        o->copy(o, X, d->muon.gath + t * n, (size_t)n * f);
        return;
    }
    for (int s = 0; s < tp; s++) /* split by columns: slice s is columns [s lc, (s+1) lc) */
        o->copy2d(o, d->muon.whole + s * lc, C * f, d->muon.gath + s * n, lc * f, lc * f, R);
    optim_newton_schulz(o, d->muon.whole, (int)R, (int)C, steps, d->muon.work);
    o->copy2d(o, X, lc * f, d->muon.whole + t * lc, C * f, lc * f, R);
}

/* The momentum on n elements at unit coordinate x (bf16 states: the fused op widens and rounds
 * them, the fp32 form's arithmetic). */
static void momentum(dp_state *d, int u, int64_t x, int64_t n, float grad_scale) {
    float *g = at(d, BUF_GRADS, u, x);
    if (!d->buf.m16) {
        optim_muon_momentum(d->ops, d->cfg, g, at(d, BUF_M, u, x), n, grad_scale);
        return;
    }
    const ust_config *c = d->cfg;
    d->ops->momentum16(d->ops, g, d->buf.m16 + state_off(d, u, x), n, (float)c->optimizer.momentum,
                       grad_scale, c->optimizer.nesterov);
}

/* Muon matrices [lo, hi) of the list, all in unit u. */
static void unit_step(dp_state *d, int u, int lo, int hi, float lr, float grad_scale) {
    const ust_ops *o = d->ops;
    int part = d->stage >= 1, r = d->lay.urank[u];
    int64_t chunk = d->lay.chunk[u], a, b;
    float *W = unit_buf(d, u);
    for (int k = lo; k < hi; k++) {
        int64_t t0 = piece(d, d->muon.param[k], part, &a, &b);
        if (b > a) momentum(d, u, t0 + a, b - a, grad_scale);
    }
    if (part) {
        const float *src = d->stage == 1 ? W + r * chunk : d->buf.g_shard + d->lay.soff[u];
        comm_req q = comm_allgather(d->lay.ucomm[u], src, W, (size_t)chunk, COMM_FP32);
        comm_wait(&q);
    }
    for (int k = lo; k < hi; k++) {
        const model_param *q = model_param_at(d->m, d->muon.param[k]);
        float *X = W + (q->offset - d->lay.uoff[u]);
        if (!part || d->muon.owner[k] == r)
            orthogonalise(d, d->muon.param[k], X);
        else /* the owner's result arrives through the sum */
            o->zero(o, X, (size_t)q->numel * sizeof(float));
    }
    if (part) {
        comm_req q = comm_reduce_scatter(d->lay.ucomm[u], W, W + r * chunk, (size_t)chunk,
                                         COMM_FP32, COMM_SUM);
        comm_wait(&q);
    }
    for (int k = lo; k < hi; k++) {
        const model_param *q = model_param_at(d->m, d->muon.param[k]);
        int64_t t0 = piece(d, d->muon.param[k], part, &a, &b);
        float wd = q->decay ? (float)d->cfg->optimizer.weight_decay : 0.0f;
        float s = optim_muon_scale(d->cfg, q->whole.shape[0], q->whole.shape[1]);
        if (b > a) optim_muon_apply(o, at(d, BUF_PARAMS, u, t0 + a), W + t0 + a, b - a, lr, wd, s);
    }
}

void dp_muon_step(dp_state *d, double lr, float grad_scale) {
    dp_muon *mu = &d->muon;
    for (int lo = 0, hi; lo < mu->n; lo = hi) {
        int u = model_param_unit(d->m, mu->param[lo]);
        for (hi = lo + 1; hi < mu->n && model_param_unit(d->m, mu->param[hi]) == u; hi++) {
        }
        unit_step(d, u, lo, hi, (float)lr, grad_scale);
    }
}
