/* moe_route.c: the MoE layer's routing decisions on the host: the capacity over the tp and cp
 * splits, the assignments' rows, the load statistics and losses, the balancing bias. */
#include "moe.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "moe_internal.h"

/* ------------------------------------------------------------------ capacity */

/* The micro-batch's token order over the cp group: sequence by sequence, by position. */
typedef struct {
    int32_t key, token; /* b*T + position; member*N + local index */
} cap_token;

static int cmp_key(const void *a, const void *b) {
    int32_t x = ((const cap_token *)a)->key, y = ((const cap_token *)b)->key;
    return (x > y) - (x < y);
}

void moe_capacity_order_init(moe_ctx *m, const moe_groups *g, ust_arena *arena) {
    int n = cp_size(g->cp), N = m->Nmb;
    cap_token *t = moe_host_alloc((size_t)n * N * sizeof *t);
    for (int r = 0; r < n; r++)
        for (int i = 0; i < N; i++) {
            int b = i / g->cap_Tl, j = i % g->cap_Tl;
            t[r * N + i] = (cap_token){b * g->cap_T + g->cap_pos[r * g->cap_Tl + j], r * N + i};
        }
    qsort(t, (size_t)n * N, sizeof *t, cmp_key);
    m->routing.cap_order = moe_host_alloc((size_t)n * N * sizeof(int32_t));
    for (int64_t i = 0; i < (int64_t)n * N; i++) m->routing.cap_order[i] = t[i].token;
    free(t);
    m->routing.cap_cp = g->cp;
    m->routing.cap_topk = mem_alloc(arena, MEM_COMM, (size_t)n * N * m->k * sizeof(float));
    m->routing.cap_topk_host = moe_host_alloc((size_t)n * N * m->k * sizeof(float));
}

/* Capacity over the cp group: every member's choices of its micro-batch part (all: Nmb*k),
 * walked in the micro-batch's token order (then choice order) as one rank would; keep[a] for
 * this member's assignments a. */
static void capacity_cp(moe_ctx *m, const int32_t *all, int32_t *keep) {
    const ust_ops *o = m->ops;
    int n = cp_size(m->routing.cap_cp), me = cp_rank(m->routing.cap_cp), k = m->k, N = m->Nmb;
    int64_t A = (int64_t)N * k, cap = moe_capacity(m->routing.capacity_factor, A * n, m->E);
    for (int64_t i = 0; i < A; i++) m->routing.cap_topk_host[me * A + i] = (float)all[i];
    o->to_device(o, m->routing.cap_topk + me * A, m->routing.cap_topk_host + me * A,
                 A * sizeof(float));
    cp_allgather(m->routing.cap_cp, m->routing.cap_topk + me * A, m->routing.cap_topk, A);
    o->to_host(o, m->routing.cap_topk_host, m->routing.cap_topk, (size_t)n * A * sizeof(float));
    memset(m->routing.cap_count, 0, m->E * sizeof(int32_t));
    for (int64_t t = 0; t < (int64_t)n * N; t++) {
        int tok = m->routing.cap_order[t], owner = tok / N, i = tok % N;
        for (int j = 0; j < k; j++) {
            int e = (int)m->routing.cap_topk_host[(int64_t)owner * A + (int64_t)i * k + j];
            int kept = m->routing.cap_count[e]++ < cap;
            if (owner == me) keep[(int64_t)i * k + j] = kept;
        }
    }
}

/* Which of this rank's assignments the capacity keeps (keep, this rank's N*k): decided over the
 * whole micro-batch, its tp parts gathered first and its cp parts in capacity_cp, in the
 * micro-batch's token order whatever the split. */
static void capacity_keep(moe_ctx *m, int32_t *keep) {
    const ust_ops *o = m->ops;
    int k = m->k, E = m->E;
    int64_t A = (int64_t)m->N * k, Amb = (int64_t)m->Nmb * k;
    const int32_t *all = m->routing.topk_host;
    int32_t *keep_all = keep;
    if (m->tp.n > 1) { /* every tp part's choices, in row order */
        float *mine = m->routing.tp_topk + m->tp.r * A, *hm = (float *)m->routing.keep_host;
        for (int64_t i = 0; i < A; i++) hm[i] = (float)m->routing.topk_host[i];
        o->to_device(o, mine, hm, A * sizeof(float));
        tp_allgather(m->tp.tp, mine, m->routing.tp_topk, A);
        o->to_host(o, m->routing.keep_host, m->routing.tp_topk, Amb * sizeof(float));
        hm = (float *)m->routing.keep_host;
        for (int64_t i = 0; i < Amb; i++) m->routing.tp_topk_host[i] = (int32_t)hm[i];
        all = m->routing.tp_topk_host;
        keep_all = m->routing.keep_host;
    }
    if (m->routing.cap_cp) {
        capacity_cp(m, all, keep_all);
    } else {
        int64_t cap = moe_capacity(m->routing.capacity_factor, Amb, E);
        memset(m->routing.cap_count, 0, E * sizeof(int32_t));
        for (int64_t i = 0; i < Amb; i++) keep_all[i] = m->routing.cap_count[all[i]]++ < cap;
    }
    if (m->tp.n > 1) memmove(keep, keep_all + m->tp.r * A, A * sizeof(int32_t)); /* my part */
}

/* ------------------------------------------------------------------ routing */

/* Host: from topk, the assignments each expert keeps (capacity, in token order), their rows
 * grouped by expert (assign: row -> assignment) and each assignment's row (pos, -1 if dropped).
 * cnt_host gets the routed (before drops) and kept counts. */
void moe_route(moe_ctx *m, moe_acts *a) {
    const ust_ops *o = m->ops;
    int E = m->E;
    int64_t A = (int64_t)m->N * m->k;
    int32_t *routed = m->routing.cnt_host, *kept = m->routing.cnt_host + E,
            *pos = m->routing.pos_host;
    o->to_host(o, m->routing.topk_host, a->topk, A * sizeof(int32_t));
    memset(m->routing.cnt_host, 0, 2 * E * sizeof(int32_t));
    for (int64_t i = 0; i < A; i++) {
        int e = m->routing.topk_host[i];
        UST_ASSERT(e >= 0 && e < E, "router chose expert %d of %d", e, E);
        routed[e]++;
    }
    int32_t *keep = m->routing.keep_host;
    if (m->routing.capacity_factor > 0)
        capacity_keep(m, keep);
    else
        for (int64_t i = 0; i < A; i++) keep[i] = 1;
    for (int64_t i = 0; i < A; i++) { /* index within the expert, or -1 when dropped */
        int e = m->routing.topk_host[i];
        pos[i] = keep[i] ? kept[e]++ : -1;
    }
    int64_t off[E + 1];
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + kept[e];
    for (int64_t i = 0; i < A; i++) {
        if (pos[i] < 0) continue;
        pos[i] += (int32_t)off[m->routing.topk_host[i]];
        m->routing.assign_host[pos[i]] = (int32_t)i;
    }
    a->nkept = off[E];
    o->to_device(o, a->pos, pos, A * sizeof(int32_t));
    o->to_device(o, a->assign, m->routing.assign_host, a->nkept * sizeof(int32_t));
}

/* Sums [routed counts E | prob sums E | sum lse^2 | tokens | dropped] over the stats groups and
 * derives the losses, the load statistics and the aux gradient factors. The prob sums are on
 * the device already (router_fwd wrote them into m->loss.stats + E). */
void moe_statistics(moe_ctx *m, moe_acts *a, moe_stats *st) {
    const ust_ops *o = m->ops;
    int E = m->E, k = m->k;
    float *h = m->stats_host;
    for (int e = 0; e < E; e++) h[e] = (float)m->routing.cnt_host[e];
    h[2 * E] = m->route.sigmoid ? 0.0f : (float)o->sumsq(o, a->lse, m->N); /* sigmoid: no z */
    h[2 * E + 1] = (float)m->N;
    h[2 * E + 2] = (float)((int64_t)m->N * k - a->nkept);
    int64_t B = m->loss.seqB, nst = moe_stats_floats(E, B);
    float *hc = h + 2 * E + 3, *ht = hc + B * E, *hp = ht + B; /* per sequence */
    if (B) {
        memset(hc, 0, (size_t)B * (E + 1) * sizeof(float));
        for (int s = 0; s < m->loss.nseg; s++) {
            int64_t r = m->loss.seg[3 * s], n = m->loss.seg[3 * s + 1], b = m->loss.seg[3 * s + 2];
            for (int64_t i = r * k; i < (r + n) * k; i++) hc[b * E + m->routing.topk_host[i]] += 1;
            ht[b] = (float)n;
        }
        o->to_device(o, m->loss.stats + 2 * E + 3, hc, (size_t)B * (E + 1) * sizeof(float));
    }
    o->to_device(o, m->loss.stats, h, E * sizeof(float));
    o->to_device(o, m->loss.stats + 2 * E, h + 2 * E, 3 * sizeof(float));
    if (m->loss.cp) cp_allreduce(m->loss.cp, m->loss.stats, nst);
    tp_allreduce(m->tp.tp, m->loss.stats, nst);
    o->to_host(o, h, m->loss.stats, nst * sizeof(float));
    double T = h[2 * E + 1], aux = 0, mx = 0;
    for (int e = 0; e < E; e++) {
        double f = h[e] / (T * k), P = h[E + e] / T;
        aux += f * P;
        a->aux_dp_host[e] = (float)(m->loss.aux_coef * E * f / T); /* d aux_coef*aux / d p[n][e] */
        mx = h[e] > mx ? h[e] : mx;
    }
    a->zscale = (float)(2.0 * m->loss.z_coef / T);
    st->aux_loss = E * aux;
    st->z_loss = h[2 * E] / T;
    st->seq_aux_loss = 0;
    for (int64_t b = 0; b < B; b++) { /* each sequence's f and P over its own tokens */
        double Tb = ht[b], s = 0;
        for (int e = 0; e < E && Tb > 0; e++) s += hc[b * E + e] / (Tb * k) * (hp[b * E + e] / Tb);
        st->seq_aux_loss += E * s / B;
    }
    float whole[E]; /* the micro-batch's factors, then each segment's: + d seq_coef*seq / d p */
    memcpy(whole, a->aux_dp_host, E * sizeof(float));
    for (int s = 0; s < m->loss.nseg && B; s++) {
        int64_t b = m->loss.seg[3 * s + 2];
        double Tb = ht[b];
        for (int e = 0; e < E; e++)
            a->aux_dp_host[s * E + e] =
                whole[e] + (float)(m->loss.seq_coef * E * (hc[b * E + e] / (Tb * k)) / (B * Tb));
    }
    st->loss = m->loss.aux_coef * st->aux_loss + m->loss.z_coef * st->z_loss +
               m->loss.seq_coef * st->seq_aux_loss;
    st->load_max = mx;
    st->load_mean = T * k / E;
    st->dropped_frac = h[2 * E + 2] / (T * k);
    st->tokens = (int64_t)T;
    st->routed = h;
}

void moe_bias_delta(const moe_ctx *m, const double *load, float *delta) {
    int E = m->E;
    double mean = 0;
    for (int e = 0; e < E; e++) mean += load[e];
    mean /= E;
    for (int e = 0; e < E; e++) {
        double d = mean - load[e];
        delta[e] = (float)(m->bal.bias_rate * ((d > 0) - (d < 0)));
    }
}

void moe_update_bias(moe_ctx *m, float *bias, const double *load) {
    const ust_ops *o = m->ops;
    int E = m->E;
    float *b = m->stats_host, *delta = b + E; /* 2E+3 floats of host scratch, free here */
    moe_bias_delta(m, load, delta);
    o->to_host(o, b, bias, E * sizeof(float));
    for (int e = 0; e < E; e++) b[e] += delta[e];
    o->to_device(o, bias, b, E * sizeof(float));
}
