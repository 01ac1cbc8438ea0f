/* model_moe.c: the model's MoE state (struct model's moe part): the layers' shared context and
 * weight tables, each forward's statistics and losses, and the step's loads and bias update. */
#include "model_moe.h"

#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "cp.h"
#include "error.h"
#include "tp.h"

/* The MoE layers' shared context and weight tables. The tensor-parallel ranks split the
 * micro-batch's tokens (each routes and computes its 1/tp: its own rows under sp, a slice of the
 * replicated rows without), so no expert work is repeated over tp; the aux-loss statistics are
 * summed over the cp shards and the tp parts. */
/* The layers with MoE state: the main model's and model.mtp's blocks (layers n_layer + k). */
static int moe_nlayers(const model *m) { return m->shape.L + m->cfg->model.mtp.depth; }

/* This rank's i-th MoE layer (its chunks' in order, a head chunk's model.mtp blocks after its
 * layers), or -1. */
static int moe_layer_at(const model *m, int i) {
    int n = 0, D = m->cfg->model.mtp.depth;
    for (int c = 0; c < m->nchunks; c++) {
        const model_chunk *ch = &m->chunks[c];
        for (int l = ch->lo; l < ch->hi; l++)
            if (is_moe(m, l) && n++ == i) return l;
        for (int k = 0; ch->head && k < D; k++)
            if (is_moe(m, m->shape.L + k) && n++ == i) return m->shape.L + k;
    }
    return -1;
}

void model_moe_init(model *m, ust_arena *arena, const model_storage *st) {
    m->moe.has_moe = 1;
    m->moe.ep_size = ep_size(st->ep);
    m->moe.ep_rank = ep_rank(st->ep);
    moe_groups g = {.tp = m->par.tp,
                    .ep = st->ep,
                    .cp = m->par.cp,
                    .cap_pos = cp_positions_of(m->par.cp, 0),
                    .cap_T = m->cfg->train.seq_len,
                    .cap_Tl = m->shape.T};
    moe_init(&m->moe.ctx, m->cfg, m->ops, arena, m->shape.B * m->shape.T, &g);
    int nl = moe_nlayers(m);
    m->moe.mw = calloc(nl, sizeof *m->moe.mw);
    m->moe.mg = calloc(nl, sizeof *m->moe.mg);
    m->moe.mstats = calloc(nl, sizeof *m->moe.mstats);
    m->moe.moe_load = calloc((size_t)nl * m->moe.ctx.E, sizeof *m->moe.moe_load);
    m->moe.moe_gload = calloc((size_t)nl * m->moe.ctx.E, sizeof *m->moe.moe_gload);
    UST_ASSERT(m->moe.mw && m->moe.mg && m->moe.mstats && m->moe.moe_load && m->moe.moe_gload,
               "out of host memory (MoE tables)");
    for (int l = 0; l < nl; l++)
        if (is_moe(m, l))
            moe_weights_init(&m->moe.mw[l], &m->moe.ctx),
                moe_weights_init(&m->moe.mg[l], &m->moe.ctx);
    /* the step's loss adds each micro-batch's MoE loss averaged over the step's micro-batches
     * (docs/design.md section 4); the cp shards of a micro-batch share its statistics, so one of
     * them counts the value (all of them its gradient, through their own tokens) */
    m->moe.moe_scale = 1.0f / (float)(cfg_grad_accum(m->cfg) * m->cfg->parallel.dp);
}

void model_moe_free(model *m) {
    if (m->moe.has_moe) {
        for (int l = 0; l < moe_nlayers(m); l++)
            if (is_moe(m, l)) moe_weights_free(&m->moe.mw[l]), moe_weights_free(&m->moe.mg[l]);
        if (m->shape.recompute == RECOMPUTE_FULL) moe_acts_free(&m->acts.moe_scratch);
        moe_free(&m->moe.ctx);
    }
    free(m->moe.mw), free(m->moe.mg), free(m->moe.mstats);
    free(m->moe.moe_load), free(m->moe.moe_gload);
}

void model_moe_record(model *m, int l, const moe_stats *st, float dscale) {
    m->moe.mstats[l] = *st;
    if (dscale > 0 && cp_is_first(m->par.cp)) m->moe.moe_loss += st->loss * m->moe.moe_scale;
    /* the micro-batch's counts (summed over cp and tp): one of its cp ranks counts them
     * for the dp x cp sum (each tp rank is in its own such group) */
    if (dscale > 0 && cp_is_first(m->par.cp))
        for (int e = 0; e < m->moe.ctx.E; e++)
            m->moe.moe_load[(int64_t)l * m->moe.ctx.E + e] += st->routed[e];
}

/* The parameter-table index of layer l's routing bias (-1: none). */
static int bias_param(model *m, int l) {
    char n[CKPT_NAME_MAX];
    snprintf(n, sizeof n, "model.layers.%d.mlp.router.expert_bias", l);
    for (int i = 0; i < model_num_params(m); i++)
        if (!strcmp(model_param_at(m, i)->name, n)) return i;
    return -1;
}

/* Layer l's bias moved by its step loads: in place in whole storage, else through add. */
static void move_bias(model *m, int l, const double *load, model_param_add_fn add, void *ctx) {
    if (m->tab.p) {
        moe_update_bias(&m->moe.ctx, m->moe.mw[l].bias, load);
        return;
    }
    int i = bias_param(m, l);
    UST_ASSERT(i >= 0 && add, "layer %d: a routing bias without whole storage or a sharding layer",
               l);
    float *delta = m->moe.ctx.stats_host; /* E floats of host scratch, free between forwards */
    moe_bias_delta(&m->moe.ctx, load, delta);
    add(ctx, i, delta);
}

/* The step's loads summed by sum over the ranks whose micro-batches differ, staged through fp32
 * (exact below 2^24 per expert); the test fault UST_FAULT_MOE_LOCAL_LOADS balances on this
 * rank's counts instead. */
static void step_loads(model *m, model_sum_fn sum, void *ctx) {
    moe_balance *b = &m->moe.ctx.bal;
    int64_t n = (int64_t)b->nlayers * m->moe.ctx.E;
    for (int64_t i = 0; i < n; i++) b->loads_host[i] = (float)m->moe.moe_load[i];
    m->ops->to_device(m->ops, b->loads, b->loads_host, n * sizeof(float));
    if (!b->fault_local_loads) sum(ctx, b->loads, n);
    m->ops->to_host(m->ops, b->loads_host, b->loads, n * sizeof(float));
    for (int64_t i = 0; i < n; i++) m->moe.moe_load[i] = b->loads_host[i];
}

void model_moe_end_step(model *m, model_sum_fn sum, int update_bias, model_param_add_fn add,
                        void *ctx) {
    if (!m->moe.has_moe) return;
    int E = m->moe.ctx.E;
    int has_bias = m->cfg->model.moe.bias_update_rate > 0;
    step_loads(m, sum, ctx);
    for (int i = 0, l; update_bias && has_bias && (l = moe_layer_at(m, i)) >= 0; i++)
        move_bias(m, l, m->moe.moe_load + (int64_t)l * E, add, ctx);
    size_t n = (size_t)moe_nlayers(m) * E * sizeof *m->moe.moe_load;
    memcpy(m->moe.moe_gload, m->moe.moe_load, n);
    memset(m->moe.moe_load, 0, n);
}

int model_moe_expert_load(const model *m, int i, double *counts, int max) {
    int E = m->moe.ctx.E, l = moe_layer_at(m, i);
    if (l < 0) return 0;
    for (int e = 0; e < E && e < max; e++) counts[e] = m->moe.moe_gload[(int64_t)l * E + e];
    return E < max ? E : max;
}

int model_moe_rank_rows(const model *m, int i, double *rows, int max) {
    int E = m->moe.ctx.E, ep = m->moe.ep_size, El = E / ep, l = moe_layer_at(m, i);
    const __typeof__(m->cfg->parallel) *p = &m->cfg->parallel;
    double holders = (double)p->dp / ep * p->cp * p->tp;
    if (l < 0) return 0;
    for (int r = 0; r < ep && r < max; r++) {
        double s = 0;
        for (int e = r * El; e < (r + 1) * El; e++) s += m->moe.moe_gload[(int64_t)l * E + e];
        rows[r] = s / holders;
    }
    return ep < max ? ep : max;
}

double model_moe_bias_range(model *m, int i, model_param_get_fn get, void *ctx) {
    int E = m->moe.ctx.E, l = moe_layer_at(m, i);
    if (m->cfg->model.moe.bias_update_rate <= 0 || (!m->tab.p && !get) || l < 0) return NAN;
    float *h = m->moe.ctx.stats_host; /* >= E floats, free between forwards */
    if (m->tab.p)
        m->ops->to_host(m->ops, h, m->moe.mw[l].bias, (size_t)E * sizeof(float));
    else { /* the sharding layer's pieces, made whole */
        int p = bias_param(m, l);
        UST_ASSERT(p >= 0, "layer %d: a routing bias without its parameter", l);
        get(ctx, p, h);
    }
    float lo = h[0], hi = h[0];
    for (int e = 1; e < E; e++) lo = h[e] < lo ? h[e] : lo, hi = h[e] > hi ? h[e] : hi;
    return (double)hi - lo;
}

double model_take_moe_loss(model *m) {
    double x = m->moe.moe_loss;
    m->moe.moe_loss = 0;
    return x;
}

int model_moe_stats(const model *m, int *layers, double *load_max, double *load_mean,
                    double *dropped, int max) {
    int n = 0;
    for (int l; n < max && (l = moe_layer_at(m, n)) >= 0; n++) {
        layers[n] = l;
        load_max[n] = m->moe.mstats[l].load_max;
        load_mean[n] = m->moe.mstats[l].load_mean;
        dropped[n] = m->moe.mstats[l].dropped_frac;
    }
    return n;
}
