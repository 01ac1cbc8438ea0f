/* moe.c: the mixture-of-experts layer (router, experts, aux losses, capacity), llm.c style.
 * Shapes: N tokens, C = d_model, E experts (El local), k = top_k, Fe = d_ff_expert, R = rows of
 * the local-expert buffers. Routing decisions go to the host (they size the expert matmuls and
 * the all-to-all anyway); everything per element stays on the device. */
#include "moe.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "moe_internal.h"

/* ------------------------------------------------------------------ parameters */

int moe_layer_is_moe(const ust_config *cfg, int l) { return cfg_layer_is_moe(cfg, l); }

int moe_shared_width(const ust_config *cfg) {
    int Fs = cfg->model.moe.shared_d_ff;
    return Fs > 0 ? Fs : cfg->model.moe.d_ff_expert;
}

static void emit(moe_param_fn fn, void *ctx, const char *name, int64_t rows, int64_t cols,
                 int decay, float std, int expert, float **p, float **g) {
    moe_param q = {name, rows, cols, decay, std, 0.0f, expert, p, g};
    fn(ctx, &q);
}

/* name = the formatted name, or "" for a sizes-only enumeration (unnamed: no formatting) */
#define NAME(...) (void)(prefix ? snprintf(n, sizeof n, __VA_ARGS__) : (n[0] = 0))

/* One expert's tensors under `prefix` (e.g. "model.layers.3.mlp.experts.5"; NULL: unnamed). */
static void emit_expert(const ust_config *cfg, const char *prefix, int expert, int64_t F,
                        moe_expert *w, moe_expert *g, moe_param_fn fn, void *ctx) {
    char n[256];
    int64_t C = cfg->model.d_model;
    int gpt2 = cfg->model.arch == ARCH_GPT2;
    float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * cfg->model.n_layer);
#define T(f) (w ? &w->f : NULL), (g ? &g->f : NULL)
    if (!gpt2) {
        NAME("%s.gate_proj.weight", prefix);
        emit(fn, ctx, n, F, C, 1, std, expert, T(gate));
    }
    NAME("%s.up_proj.weight", prefix);
    emit(fn, ctx, n, F, C, 1, std, expert, T(up));
    if (gpt2) {
        NAME("%s.up_proj.bias", prefix);
        emit(fn, ctx, n, 1, F, 0, 0.0f, expert, T(up_b));
    }
    NAME("%s.down_proj.weight", prefix);
    emit(fn, ctx, n, C, F, 1, proj_std, expert, T(down));
    if (gpt2) {
        NAME("%s.down_proj.bias", prefix);
        emit(fn, ctx, n, 1, C, 0, 0.0f, expert, T(down_b));
    }
#undef T
}

/* moe_enum_params with the first `listed` of the El local experts; named 0: every name "" but
 * the router's ".router." (what optim_matrix_kind reads), no formatting */
static void enum_layer(const ust_config *cfg, int l, int ep_size, int ep_rank, moe_weights *w,
                       moe_weights *g, moe_param_fn fn, void *ctx, int listed, int named) {
    int E = cfg->model.moe.num_experts, El = E / ep_size, e0 = ep_rank * El;
    UST_ASSERT(E % ep_size == 0 && ep_rank >= 0 && ep_rank < ep_size, "E %d ep %d/%d", E, ep_rank,
               ep_size);
    UST_ASSERT(!w || (w->nexperts == El && w->first_expert == e0), "weights for experts %d+%d",
               w->first_expert, w->nexperts);
    UST_ASSERT(!g || (g->nexperts == El && g->first_expert == e0), "grads for experts %d+%d",
               g->first_expert, g->nexperts);
    char n[256];
    const char *prefix = named ? "" : NULL; /* NAME's switch */
    if (named)
        snprintf(n, sizeof n, "model.layers.%d.mlp.router.weight", l);
    else
        strcpy(n, ".router.");
    emit(fn, ctx, n, E, cfg->model.d_model, 1, 0.02f, -1, w ? &w->router : NULL,
         g ? &g->router : NULL);
    if (cfg_moe_has_bias(cfg)) {
        NAME("model.layers.%d.mlp.router.expert_bias", l);
        emit(fn, ctx, n, 1, E, 0, 0.0f, -1, w ? &w->bias : NULL, g ? &g->bias : NULL);
    }
    if (cfg->model.moe.shared_expert) {
        NAME("model.layers.%d.mlp.shared_expert", l);
        emit_expert(cfg, named ? n : NULL, -1, moe_shared_width(cfg), w ? &w->shared : NULL,
                    g ? &g->shared : NULL, fn, ctx);
    }
    for (int i = 0; i < listed && i < El; i++) {
        NAME("model.layers.%d.mlp.experts.%d", l, e0 + i);
        emit_expert(cfg, named ? n : NULL, e0 + i, cfg->model.moe.d_ff_expert,
                    w ? &w->experts[i] : NULL, g ? &g->experts[i] : NULL, fn, ctx);
    }
}

void moe_enum_params(const ust_config *cfg, int l, int ep_size, int ep_rank, moe_weights *w,
                     moe_weights *g, moe_param_fn fn, void *ctx) {
    enum_layer(cfg, l, ep_size, ep_rank, w, g, fn, ctx, INT_MAX, 1);
}

void moe_enum_first_expert(const ust_config *cfg, int l, int ep_size, int ep_rank, moe_param_fn fn,
                           void *ctx) {
    enum_layer(cfg, l, ep_size, ep_rank, NULL, NULL, fn, ctx, 1, 0);
}
#undef NAME

ops_moe_route moe_route_of(const ust_config *cfg) {
    const __typeof__(cfg->model.moe) *c = &cfg->model.moe;
    int M = c->max_nodes_per_token;
    return (ops_moe_route){c->score == MOE_SIGMOID, c->norm_topk,           c->n_group,
                           M ? M : c->topk_group,   (float)c->routed_scale, M ? c->top_k / M : 2};
}

void moe_weights_init(moe_weights *w, const moe_ctx *m) {
    memset(w, 0, sizeof *w);
    w->nexperts = m->El;
    w->first_expert = m->e0;
    w->experts = calloc(m->El, sizeof *w->experts);
    UST_ASSERT(w->experts, "out of host memory (%d experts)", m->El);
}

void moe_weights_free(moe_weights *w) {
    free(w->experts);
    w->experts = NULL;
}

/* ------------------------------------------------------------------ setup */

#define FL(n) ((float *)mem_alloc(arena, MEM_ACTS, (size_t)(n) * sizeof(float)))
#define IN(n) ((int32_t *)mem_alloc(arena, MEM_ACTS, (size_t)(n) * sizeof(int32_t)))
#define AC(n) ((act *)mem_alloc(arena, MEM_ACTS, act_bytes(ops, n)))

void *moe_host_alloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    UST_ASSERT(p, "out of host memory (%zu bytes)", bytes);
    return p;
}

/* Rows of the dispatch buffers: what a rank sends (its kept assignments) and what it may hold
 * for its local experts. Dropless, every token of every ep rank may pick them (N*k from each);
 * with a capacity, each expert keeps at most cap rows of each rank. */
int64_t moe_capacity(double factor, int64_t assignments, int64_t E) {
    return (int64_t)ceil(factor * assignments / E - 1e-9);
}

void moe_dispatch_rows(const ust_config *cfg, int64_t N, int ep, int64_t *send, int64_t *recv) {
    const __typeof__(cfg->model.moe) *c = &cfg->model.moe;
    int64_t A = moe_rank_tokens(cfg, N) * c->top_k, E = c->num_experts, s = A, r = A;
    if (c->capacity_factor > 0) { /* the whole micro-batch's capacity (cp, tp parts together) */
        int64_t cap = moe_capacity(c->capacity_factor, N * c->top_k * cfg->parallel.cp, E);
        s = A < E * cap ? A : E * cap;
        r = A < E / ep * cap ? A : E / ep * cap;
    }
    *send = s;
    *recv = r * ep;
}

static int64_t pad16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* One expert's tensors (or gradients) in moe_enum_params' order: pointers and sizes. */
static int expert_tensors(int llama, int64_t C, int64_t F, moe_expert *w, float ***p, int64_t *n) {
    int c = 0;
    if (llama) p[c] = &w->gate, n[c++] = F * C;
    p[c] = &w->up, n[c++] = F * C;
    if (!llama) p[c] = &w->up_b, n[c++] = F;
    p[c] = &w->down, n[c++] = C * F;
    if (!llama) p[c] = &w->down_b, n[c++] = C;
    return c;
}

/* A layer's tensors on this rank (router, shared expert, local experts); p and n hold
 * 1 + 4*(El+1) entries. */
static int layer_tensors(const moe_ctx *m, moe_weights *w, float ***p, int64_t *n) {
    int c = 0;
    p[c] = &w->router, n[c++] = (int64_t)m->E * m->C;
    if (m->shared) c += expert_tensors(m->llama, m->C, m->Fs, &w->shared, p + c, n + c);
    for (int i = 0; i < m->El; i++)
        c += expert_tensors(m->llama, m->C, m->Fe, &w->experts[i], p + c, n + c);
    return c;
}

/* Floats of one layer's gradient scratch under the tp split (each tensor 64-byte aligned). */
static int64_t grad_scratch_floats(const ust_config *cfg, int ep) {
    const __typeof__(cfg->model.moe) *c = &cfg->model.moe;
    int64_t C = cfg->model.d_model, F = c->d_ff_expert, llama = cfg->model.arch == ARCH_LLAMA;
    int64_t ex = pad16(F * C) * (llama ? 3 : 2) + (llama ? 0 : pad16(F) + pad16(C)), Fs;
    Fs = moe_shared_width(cfg);
    int64_t sh = pad16(Fs * C) * (llama ? 3 : 2) + (llama ? 0 : pad16(Fs) + pad16(C));
    return pad16((int64_t)c->num_experts * C) + (c->shared_expert ? sh : 0) +
           (int64_t)(c->num_experts / ep) * ex;
}

static void init_grad_scratch(moe_ctx *m, ust_arena *arena, int64_t floats) {
    moe_weights_init(&m->tp.gs, m);
    m->tp.gnumel = floats;
    m->tp.gbuf = mem_alloc(arena, MEM_ACTS, (size_t)floats * sizeof(float));
    int cap = 1 + 4 * (m->El + 1);
    float **p[cap];
    int64_t n[cap], off = 0;
    int c = layer_tensors(m, &m->tp.gs, p, n);
    for (int i = 0; i < c; i++) *p[i] = m->tp.gbuf + off, off += pad16(n[i]);
    UST_ASSERT(off == floats, "gradient scratch %lld floats, sized %lld", (long long)off,
               (long long)floats);
}

int64_t moe_rank_tokens(const ust_config *cfg, int64_t N) {
    int tp = cfg->parallel.tp > 0 ? cfg->parallel.tp : 1;
    UST_ASSERT(N % tp == 0, "%lld tokens do not split over tp = %d", (long long)N, tp);
    return N / tp;
}

/* The statistics vector: [routed E | prob sums E | sum lse^2 | tokens | dropped], then per
 * sequence (B of them, with the sequence-wise loss) [counts B*E | tokens B | prob sums B*E]. */
int64_t moe_stats_floats(int64_t E, int64_t B) { return 2 * E + 3 + B * (2 * E + 1); }

/* The sequences this rank's rows meet (rows [tpr*N, (tpr+1)*N) of the B*Tl on its cp rank). */
static void init_segments(moe_ctx *m, int B) {
    UST_ASSERT(B > 0 && m->Nmb % B == 0, "%d rows are not %d sequences", m->Nmb, B);
    m->loss.seqB = B;
    m->loss.seqTl = m->Nmb / B;
    m->loss.seg = moe_host_alloc(3 * (size_t)B * sizeof(int32_t));
    int64_t r0 = (int64_t)m->tp.r * m->N;
    for (int i = 0; i < m->N;) {
        int b = (int)((r0 + i) / m->loss.seqTl), end = (int)((int64_t)(b + 1) * m->loss.seqTl - r0);
        if (end > m->N) end = m->N;
        m->loss.seg[3 * m->loss.nseg] = i, m->loss.seg[3 * m->loss.nseg + 1] = end - i,
                        m->loss.seg[3 * m->loss.nseg + 2] = b;
        m->loss.nseg++;
        i = end;
    }
}

/* The routing and expert scratch of one micro-batch: A = N*k routed rows leave, up to R arrive. */
static void init_scratch(moe_ctx *m, const ust_ops *ops, ust_arena *arena, int64_t A) {
    int64_t N = m->N, C = m->C, E = m->E;
    int ep1 = ep_size(m->ep) == 1;
    m->scratch.logits = AC(N * E);
    m->scratch.dlogits = AC(N * E);
    m->scratch.dgate = FL(A);
    m->scratch.tmp = AC(N * C);
    m->scratch.xd = ep1 ? NULL : AC(A * C);
    m->scratch.eout = ep1 ? NULL : AC(m->R * C);
    m->scratch.d_home = AC(A * C);
    m->scratch.d_local = ep1 ? NULL : AC(m->R * C);
    m->scratch.dxe = AC(m->R * C);
    int64_t F = m->R * m->Fe > (m->shared ? N * m->Fs : 0) ? m->R * m->Fe : N * m->Fs;
    m->scratch.dh1 = AC(F); /* the local experts' rows, or the shared expert's tokens */
    m->scratch.dh2 = AC(F);
    m->scratch.dact = AC(F);
}

void moe_init(moe_ctx *m, const ust_config *cfg, const ust_ops *ops, ust_arena *arena, int N,
              const moe_groups *groups) {
    memset(m, 0, sizeof *m);
    const __typeof__(cfg->model.moe) *c = &cfg->model.moe;
    UST_ASSERT(c->num_experts > 0 && c->top_k >= 1 && c->top_k <= c->num_experts,
               "moe with %d experts, top-%d", c->num_experts, c->top_k);
    UST_ASSERT(ops->moe_router_fwd && ops->moe_gather && ops->moe_combine,
               "the %s backend has no MoE ops", ops->name);
    m->ops = ops;
    m->llama = cfg->model.arch == ARCH_LLAMA;
    m->shared = c->shared_expert;
    m->E = c->num_experts;
    m->k = c->top_k;
    m->C = cfg->model.d_model;
    m->Fe = c->d_ff_expert;
    m->Fs = moe_shared_width(cfg);
    m->route = moe_route_of(cfg);
    m->grouped = c->grouped_gemm;
    m->selective = cfg->train.recompute == RECOMPUTE_SELECTIVE;
    m->Nmb = N;
    m->N = (int)moe_rank_tokens(cfg, N);
    m->tp.n = cfg->parallel.tp > 0 ? cfg->parallel.tp : 1;
    m->tp.tp = groups ? groups->tp : NULL;
    UST_ASSERT(tp_size(m->tp.tp) == m->tp.n, "MoE tokens split over tp = %d, group of %d", m->tp.n,
               tp_size(m->tp.tp));
    m->tp.r = tp_rank(m->tp.tp);
    m->loss.aux_coef = c->aux_loss_coef;
    m->loss.z_coef = c->z_loss_coef;
    m->routing.capacity_factor = c->capacity_factor;
    m->loss.cp = groups ? groups->cp : NULL;
    if (m->loss.cp && cp_size(m->loss.cp) > 1 && c->capacity_factor > 0)
        moe_capacity_order_init(m, groups, arena);
    m->routing.cap_count = moe_host_alloc((size_t)m->E * sizeof(int32_t));
    int64_t A = (int64_t)m->N * m->k, E = m->E;
    if (m->tp.n > 1 && c->capacity_factor > 0) {
        m->routing.tp_topk = mem_alloc(arena, MEM_COMM, (size_t)m->Nmb * m->k * sizeof(float));
        m->routing.tp_topk_host = moe_host_alloc((size_t)m->Nmb * m->k * sizeof(int32_t));
        m->routing.keep_host = moe_host_alloc((size_t)m->Nmb * m->k * sizeof(int32_t));
    } else {
        m->routing.keep_host = moe_host_alloc(A * sizeof(int32_t));
    }
    m->ep = groups ? groups->ep : NULL;
    if (!m->ep) {
        int64_t max_send, max_recv;
        moe_dispatch_rows(cfg, m->Nmb, 1, &max_send, &max_recv);
        ep_init(&m->own_ep, ops, NULL, arena, m->E, m->C, max_send, max_recv);
        m->ep = &m->own_ep;
    }
    m->El = ep_local_experts(m->ep, &m->e0);
    m->R = ep_max_recv(m->ep);
    init_scratch(m, ops, arena, A);
    m->loss.aux_dp = FL(E);
    m->loss.seq_coef = c->seq_aux_loss_coef;
    if (m->loss.seq_coef > 0) init_segments(m, cfg->train.micro_batch_size);
    m->loss.seq_dp = m->loss.seqB ? FL((int64_t)m->loss.seqB * E) : NULL;
    m->loss.stats = FL(moe_stats_floats(E, m->loss.seqB));
    m->stats_host = moe_host_alloc(moe_stats_floats(E, m->loss.seqB) * sizeof(float));
    m->bal.nlayers = cfg->model.n_layer + cfg->model.mtp.depth; /* + model.mtp's MoE blocks */
    m->bal.bias_rate = c->bias_update_rate;
    m->bal.fault_local_loads = getenv("UST_FAULT_MOE_LOCAL_LOADS") != NULL;
    m->tp.fault_skip_sum = getenv("UST_FAULT_MOE_SKIP_TP_GRAD_SUM") != NULL;
    m->bal.loads = FL((int64_t)m->bal.nlayers * E);
    m->bal.loads_host = moe_host_alloc((size_t)m->bal.nlayers * E * sizeof(float));
    m->routing.topk_host = moe_host_alloc(A * sizeof(int32_t));
    m->routing.pos_host = moe_host_alloc(A * sizeof(int32_t));
    m->routing.assign_host = moe_host_alloc(A * sizeof(int32_t));
    m->routing.cnt_host = moe_host_alloc(2 * E * sizeof(int32_t));
    m->scratch.wp = moe_host_alloc(2 * (size_t)m->El * sizeof *m->scratch.wp);
    if (m->tp.n > 1) init_grad_scratch(m, arena, grad_scratch_floats(cfg, ep_size(m->ep)));
}

void moe_free(moe_ctx *m) {
    free(m->routing.cap_order);
    free(m->routing.cap_topk_host);
    free(m->routing.cap_count);
    free(m->stats_host);
    free(m->loss.seg);
    free(m->bal.loads_host);
    free(m->routing.topk_host);
    free(m->routing.pos_host);
    free(m->routing.assign_host);
    free(m->routing.cnt_host);
    free(m->routing.tp_topk_host);
    free(m->routing.keep_host);
    free(m->scratch.wp);
    moe_weights_free(&m->tp.gs);
    if (m->ep == &m->own_ep) ep_free(&m->own_ep);
}

/* Per-layer bytes of what moe_acts_init carves, with activations of `a` bytes (fp32 and int32
 * four); sel: selective recompute (no act, s_act). */
static int64_t acts_bytes(int llama, int shared, int64_t N, int64_t E, int64_t k, int64_t C,
                          int64_t Fe, int64_t Fs, int64_t R, int ep1, int a, int sel) {
    int64_t A = N * k, per = (llama ? 3 : 2) - sel;
    int64_t four = N * E + N + A + 3 * A;        /* probs lse gate topk assign pos */
    int64_t acts = R * C + per * R * Fe + A * C; /* xe h1 h2 act eout */
    if (shared) acts += per * N * Fs;            /* s_h1 s_h2 s_act */
    if (!ep1) four += 2 * R;                     /* plan order, inv */
    return 4 * four + a * acts;
}

int64_t moe_ctx_bytes(const ust_config *cfg, int N, int ep_size) {
    const __typeof__(cfg->model.moe) *c = &cfg->model.moe;
    int64_t Nmb = N, tp = cfg->parallel.tp > 0 ? cfg->parallel.tp : 1;
    N = (int)moe_rank_tokens(cfg, N);
    int64_t A = (int64_t)N * c->top_k, C = cfg->model.d_model, E = c->num_experts;
    int64_t S, R, Fe = c->d_ff_expert, ep1 = ep_size == 1, Fs = moe_shared_width(cfg);
    moe_dispatch_rows(cfg, Nmb, ep_size, &S, &R);
    int64_t F = R * Fe > (c->shared_expert ? N * Fs : 0) ? R * Fe : N * Fs; /* dh1 dh2 dact */
    /* as moe_init carves them: logits dlogits tmp [xd eout d_local] d_home dxe dh1 dh2 dact;
     * dgate aux_dp stats */
    int64_t acts = 2 * N * E + N * C + (ep1 ? 0 : A * C + 2 * R * C) + A * C + R * C + 3 * F;
    int64_t B = c->seq_aux_loss_coef > 0 ? cfg->train.micro_batch_size : 0;
    int64_t four = A + E + moe_stats_floats(E, B) +
                   (int64_t)(cfg->model.n_layer + cfg->model.mtp.depth) * E; /* loads */
    four += B * E;                          /* seq_dp: at most one segment per sequence */
    if (!ep1) four += 2 * E, acts += R * C; /* ep_init's counts and staging rows */
    if (cfg->parallel.cp > 1 && c->capacity_factor > 0) four += cfg->parallel.cp * Nmb * c->top_k;
    if (tp > 1 && c->capacity_factor > 0) four += Nmb * c->top_k; /* the tp parts' choices */
    if (tp > 1) four += grad_scratch_floats(cfg, ep_size);        /* gradients before the tp sum */
    return 4 * four + cfg_act_size(cfg) * acts;
}

void moe_acts_init(moe_ctx *m, moe_acts *a, ust_arena *arena) {
    memset(a, 0, sizeof *a);
    const ust_ops *ops = m->ops;
    int64_t N = m->N, A = N * m->k, C = m->C, Fe = m->Fe, R = m->R;
    a->probs = FL(N * m->E);
    a->lse = FL(N);
    a->gate = FL(A);
    a->topk = IN(A);
    a->assign = IN(A);
    a->pos = IN(A);
    a->xe = AC(R * C);
    a->h1 = m->llama ? AC(R * Fe) : NULL;
    a->h2 = AC(R * Fe);
    a->act = m->selective ? NULL : AC(R * Fe);
    a->eout = AC(A * C);
    if (m->shared) {
        a->s_h1 = m->llama ? AC(N * m->Fs) : NULL;
        a->s_h2 = AC(N * m->Fs);
        a->s_act = m->selective ? NULL : AC(N * m->Fs);
    }
    ep_plan_init(m->ep, &a->plan, arena);
    a->aux_dp_host =
        moe_host_alloc((size_t)m->E * (m->loss.nseg > 1 ? m->loss.nseg : 1) * sizeof(float));
}

void moe_acts_free(moe_acts *a) {
    ep_plan_free(&a->plan);
    free(a->aux_dp_host);
    a->aux_dp_host = NULL;
}

int64_t moe_acts_bytes(const ust_config *cfg, int N, int ep_size) {
    const __typeof__(cfg->model.moe) *c = &cfg->model.moe;
    int64_t S, R;
    moe_dispatch_rows(cfg, N, ep_size, &S, &R);
    N = (int)moe_rank_tokens(cfg, N);
    return acts_bytes(cfg->model.arch == ARCH_LLAMA, c->shared_expert, N, c->num_experts, c->top_k,
                      cfg->model.d_model, c->d_ff_expert, moe_shared_width(cfg), R, ep_size == 1,
                      cfg_act_size(cfg), cfg->train.recompute == RECOMPUTE_SELECTIVE);
}
#undef FL
#undef IN
#undef AC

/* ------------------------------------------------------------------ forward / backward */

void moe_forward(moe_ctx *m, moe_acts *a, const moe_weights *w, act *y, const act *x,
                 moe_stats *stats) {
    const ust_ops *o = m->ops;
    int N = m->N, E = m->E, k = m->k, C = m->C;
    int ep1 = ep_size(m->ep) == 1;
    o->linear_fwd(o, m->scratch.logits, x, w->router, NULL, N, C, E);
    if (!m->loss.seqB) {
        o->moe_router_fwd(o, a->probs, a->lse, a->topk, a->gate, m->loss.stats + E,
                          m->scratch.logits, w->bias, N, E, k, &m->route);
    } else { /* per sequence segment: its prob sums into its slot, then the total */
        float *seq_psum = m->loss.stats + 2 * E + 3 + (int64_t)m->loss.seqB * (E + 1);
        o->zero(o, seq_psum, (size_t)m->loss.seqB * E * sizeof(float));
        o->zero(o, m->loss.stats + E, E * sizeof(float));
        for (int s = 0; s < m->loss.nseg; s++) {
            int64_t r = m->loss.seg[3 * s], n = m->loss.seg[3 * s + 1];
            float *ps = seq_psum + (int64_t)m->loss.seg[3 * s + 2] * E;
            o->moe_router_fwd(o, a->probs + r * E, a->lse + r, a->topk + r * k, a->gate + r * k, ps,
                              act_at(o, m->scratch.logits, r * E), w->bias, (int)n, E, k,
                              &m->route);
            o->axpy(o, m->loss.stats + E, 1.0f, ps, E);
        }
    }
    moe_route(m, a);
    moe_stats local;
    moe_statistics(m, a, stats ? stats : &local);
    ep_plan_make(m->ep, &a->plan, m->routing.cnt_host + E); /* kept counts */
    /* token copies in global expert order, to the experts' ranks; at ep = 1 they stay in xe */
    act *xd = ep1 ? a->xe : m->scratch.xd, *eout = ep1 ? a->eout : m->scratch.eout;
    if (a->nkept) o->moe_gather(o, xd, x, a->assign, NULL, (int)a->nkept, C, k);
    if (!ep1) ep_dispatch(m->ep, &a->plan, a->xe, xd);
    moe_local_experts_fwd(m, a, w, eout);
    if (!ep1) ep_combine(m->ep, &a->plan, a->eout, eout);
    o->moe_combine(o, y, a->eout, a->pos, a->gate, N, k, C, 0);
    if (m->shared) {
        moe_expert_fwd(m, &w->shared, m->scratch.tmp, x, a->s_h1, a->s_h2,
                       a->s_act ? a->s_act : m->scratch.dh1, N, m->Fs);
        o->add(o, y, y, m->scratch.tmp, (int64_t)N * C);
    }
}

/* Under the tp split: the layer's gradients of this micro-batch (in gbuf) summed over tp and
 * accumulated into g. */
static void tp_reduce_grads(moe_ctx *m, moe_weights *g) {
    const ust_ops *o = m->ops;
    int cap = 1 + 4 * (m->El + 1);
    float **ps[cap], **pg[cap];
    int64_t n[cap];
    int c = layer_tensors(m, &m->tp.gs, ps, n);
    UST_ASSERT(layer_tensors(m, g, pg, n) == c, "gradient tensors");
    if (!m->tp.fault_skip_sum) tp_allreduce(m->tp.tp, m->tp.gbuf, m->tp.gnumel);
    for (int i = 0; i < c; i++) o->axpy(o, *pg[i], 1.0f, *ps[i], n[i]);
}

void moe_tp_gather_rows(moe_ctx *m, act *whole) {
    if (m->tp.n == 1) return;
    const ust_ops *o = m->ops;
    int64_t count = (int64_t)m->N * m->C;
    tp_allgather_act(m->tp.tp, act_at(o, whole, m->tp.r * count), whole, count);
}

void moe_backward(moe_ctx *m, moe_acts *a, const moe_weights *w, moe_weights *g_out, act *dx,
                  const act *dy, const act *x, float loss_scale, int acc_dx) {
    const ust_ops *o = m->ops;
    int N = m->N, E = m->E, k = m->k, C = m->C;
    int ep1 = ep_size(m->ep) == 1;
    moe_weights *g = g_out;
    if (m->tp.n > 1) { /* this rank's tokens' part first, then the sum over tp */
        o->zero(o, m->tp.gbuf, (size_t)m->tp.gnumel * sizeof(float));
        g = &m->tp.gs;
    }
    /* y = sum_j gate_j eout_j: the gates' gradient, then each kept row's d eout = gate dy */
    o->moe_gate_grad(o, m->scratch.dgate, dy, a->eout, a->pos, N, k, C);
    act *d_local = ep1 ? m->scratch.d_home : m->scratch.d_local;
    if (a->nkept) o->moe_gather(o, m->scratch.d_home, dy, a->assign, a->gate, (int)a->nkept, C, k);
    if (!ep1) ep_dispatch(m->ep, &a->plan, d_local, m->scratch.d_home);
    moe_local_experts_bwd(m, a, w, g, m->scratch.dxe, d_local);
    /* the rows' input gradients home again, each token summing its copies */
    act *dx_home = ep1 ? m->scratch.dxe : m->scratch.d_home;
    if (!ep1) ep_combine(m->ep, &a->plan, dx_home, m->scratch.dxe);
    o->moe_combine(o, dx, dx_home, a->pos, NULL, N, k, C, acc_dx);
    if (m->shared)
        moe_expert_bwd(m, &w->shared, &g->shared, dx, dy, x, a->s_h1, a->s_h2, a->s_act, N, m->Fs,
                       1);
    /* router: gates, aux loss (through P_e) and z-loss, then logits = x Wr^T */
    float *aux = NULL;
    if (m->loss.seqB) { /* per sequence segment, with its own aux factors */
        int64_t n = (int64_t)m->loss.nseg * E;
        for (int64_t i = 0; i < n; i++) m->stats_host[i] = a->aux_dp_host[i] * loss_scale;
        o->to_device(o, m->loss.seq_dp, m->stats_host, n * sizeof(float));
        for (int s = 0; s < m->loss.nseg; s++) {
            int64_t r = m->loss.seg[3 * s], rows = m->loss.seg[3 * s + 1];
            o->moe_router_bwd(o, act_at(o, m->scratch.dlogits, r * E), m->scratch.dgate + r * k,
                              a->probs + r * E, a->lse + r, a->topk + r * k, a->gate + r * k,
                              m->loss.seq_dp + s * E, a->zscale * loss_scale, (int)rows, E, k,
                              &m->route);
        }
    } else {
        if (m->loss.aux_coef != 0.0) {
            for (int e = 0; e < E; e++) m->stats_host[e] = a->aux_dp_host[e] * loss_scale;
            o->to_device(o, m->loss.aux_dp, m->stats_host, E * sizeof(float));
            aux = m->loss.aux_dp;
        }
        o->moe_router_bwd(o, m->scratch.dlogits, m->scratch.dgate, a->probs, a->lse, a->topk,
                          a->gate, aux, a->zscale * loss_scale, N, E, k, &m->route);
    }
    o->linear_bwd(o, dx, g->router, NULL, m->scratch.dlogits, x, w->router, N, C, E, 1);
    if (m->tp.n > 1) tp_reduce_grads(m, g_out);
}
