/* moe_experts.c: the MoE layer's experts, forward/backward: one expert (the shared one, or a
 * local one on its rows) and the local experts together, per expert or as grouped GEMMs. */
#include "moe_internal.h"

/* ------------------------------------------------------------------ experts */

/* out(M,C) = expert(x(M,C)) of width F; h1, h2, act (M,F) saved. */
void moe_expert_fwd(const moe_ctx *m, const moe_expert *w, act *out, const act *x, act *h1, act *h2,
                    act *y, int M, int F) {
    const ust_ops *o = m->ops;
    int C = m->C;
    if (M == 0) return;
    if (m->llama) {
        o->linear_fwd(o, h1, x, w->gate, NULL, M, C, F);
        o->linear_fwd(o, h2, x, w->up, NULL, M, C, F);
        o->swiglu_fwd(o, y, h1, h2, (int64_t)M * F);
    } else {
        o->linear_fwd(o, h2, x, w->up, w->up_b, M, C, F);
        o->gelu_fwd(o, y, h2, (int64_t)M * F);
    }
    o->linear_fwd(o, out, y, w->down, w->down_b, M, F, C);
}

/* act(n) = the activation of h1, h2 again (selective recompute), into out */
static act *activation_again(const moe_ctx *m, act *out, const act *h1, const act *h2, int64_t n) {
    if (m->llama)
        m->ops->swiglu_fwd(m->ops, out, h1, h2, n);
    else
        m->ops->gelu_fwd(m->ops, out, h2, n);
    return out;
}

/* dx(M,C) (= or += when acc) and g += from dout(M,C); uses the context's backward scratch. y
 * NULL (selective recompute): recomputed into dh1, free until the activation's backward. */
void moe_expert_bwd(const moe_ctx *m, const moe_expert *w, moe_expert *g, act *dx, const act *dout,
                    const act *x, const act *h1, const act *h2, const act *y, int M, int F,
                    int acc) {
    const ust_ops *o = m->ops;
    int C = m->C;
    if (M == 0) return;
    if (!y) y = activation_again(m, m->scratch.dh1, h1, h2, (int64_t)M * F);
    o->linear_bwd(o, m->scratch.dact, g->down, g->down_b, dout, y, w->down, M, F, C, 0);
    if (m->llama) {
        o->swiglu_bwd(o, m->scratch.dh1, m->scratch.dh2, m->scratch.dact, h1, h2, (int64_t)M * F);
        o->linear_bwd(o, dx, g->up, NULL, m->scratch.dh2, x, w->up, M, C, F, acc);
        o->linear_bwd(o, dx, g->gate, NULL, m->scratch.dh1, x, w->gate, M, C, F, 1);
    } else {
        o->gelu_bwd(o, m->scratch.dh2, h2, m->scratch.dact, (int64_t)M * F);
        o->linear_bwd(o, dx, g->up, g->up_b, m->scratch.dh2, x, w->up, M, C, F, acc);
    }
}

/* The local experts one linear each (model.moe.grouped_gemm: false; the comparison path). */
static void per_expert_fwd(const moe_ctx *m, moe_acts *a, const moe_weights *w, act *out) {
    const ust_ops *o = m->ops;
    int64_t off = 0, C = m->C, F = m->Fe;
    for (int i = 0; i < m->El; i++) {
        int M = a->plan.local[i];
        moe_expert_fwd(m, &w->experts[i], act_at(o, out, off * C), act_at(o, a->xe, off * C),
                       a->h1 ? act_at(o, a->h1, off * F) : NULL, act_at(o, a->h2, off * F),
                       act_at(o, a->act ? a->act : m->scratch.dh1, off * F), M, F);
        off += M;
    }
}

static void per_expert_bwd(const moe_ctx *m, moe_acts *a, const moe_weights *w, moe_weights *g,
                           act *dx, const act *dout) {
    const ust_ops *o = m->ops;
    int64_t off = 0, C = m->C, F = m->Fe;
    for (int i = 0; i < m->El; i++) {
        int M = a->plan.local[i];
        moe_expert_bwd(m, &w->experts[i], &g->experts[i], act_at(o, dx, off * C),
                       act_at(o, dout, off * C), act_at(o, a->xe, off * C),
                       a->h1 ? act_at(o, a->h1, off * F) : NULL, act_at(o, a->h2, off * F),
                       a->act ? act_at(o, a->act, off * F) : NULL, M, F, 0);
        off += M;
    }
}

/* The local experts' tensor `field` (and `bias`, when given) as pointer arrays in m->scratch.wp. */
#define EXPERT_PTRS(m, w, field, bias)                                                             \
    do {                                                                                           \
        for (int i_ = 0; i_ < (m)->El; i_++) {                                                     \
            (m)->scratch.wp[i_] = (w)->experts[i_].field;                                          \
            (m)->scratch.wp[(m)->El + i_] = (w)->experts[i_].bias;                                 \
        }                                                                                          \
    } while (0)
#define GRAD_PTRS(m, g, field, bias)                                                               \
    do {                                                                                           \
        for (int i_ = 0; i_ < (m)->El; i_++) {                                                     \
            gp[i_] = (g)->experts[i_].field;                                                       \
            gp[(m)->El + i_] = (g)->experts[i_].bias;                                              \
        }                                                                                          \
    } while (0)

/* The local experts over their contiguous row groups of a: each projection one grouped GEMM over
 * every local expert, each activation one elementwise op over all their rows. */
void moe_local_experts_fwd(const moe_ctx *m, moe_acts *a, const moe_weights *w, act *out) {
    if (!m->grouped) {
        per_expert_fwd(m, a, w, out);
        return;
    }
    const ust_ops *o = m->ops;
    int El = m->El, C = m->C, F = m->Fe;
    const int32_t *M = a->plan.local;
    int64_t rows = a->plan.nrecv, n = rows * F;
    const float *const *wp = m->scratch.wp, *const *bp = m->scratch.wp + El;
    act *y = a->act ? a->act : m->scratch.dh1; /* selective: not kept */
    if (rows == 0) return;
    if (m->llama) {
        EXPERT_PTRS(m, w, gate, up_b);
        o->grouped_linear_fwd(o, a->h1, a->xe, wp, NULL, M, El, C, F);
        EXPERT_PTRS(m, w, up, up_b);
        o->grouped_linear_fwd(o, a->h2, a->xe, wp, NULL, M, El, C, F);
        o->swiglu_fwd(o, y, a->h1, a->h2, n);
        EXPERT_PTRS(m, w, down, down_b);
        o->grouped_linear_fwd(o, out, y, wp, NULL, M, El, F, C);
    } else {
        EXPERT_PTRS(m, w, up, up_b);
        o->grouped_linear_fwd(o, a->h2, a->xe, wp, bp, M, El, C, F);
        o->gelu_fwd(o, y, a->h2, n);
        EXPERT_PTRS(m, w, down, down_b);
        o->grouped_linear_fwd(o, out, y, wp, bp, M, El, F, C);
    }
}

void moe_local_experts_bwd(const moe_ctx *m, moe_acts *a, const moe_weights *w, moe_weights *g,
                           act *dx, const act *dout) {
    if (!m->grouped) {
        per_expert_bwd(m, a, w, g, dx, dout);
        return;
    }
    const ust_ops *o = m->ops;
    int El = m->El, C = m->C, F = m->Fe, llama = m->llama;
    const int32_t *M = a->plan.local;
    int64_t rows = a->plan.nrecv, n = rows * F;
    const float *const *wp = m->scratch.wp;
    float *gp[2 * El];
    if (rows == 0) return;
    const act *y = a->act ? a->act : activation_again(m, m->scratch.dh1, a->h1, a->h2, n);
    EXPERT_PTRS(m, w, down, down_b);
    GRAD_PTRS(m, g, down, down_b);
    o->grouped_linear_bwd(o, m->scratch.dact, gp, llama ? NULL : gp + El, dout, y, wp, M, El, F, C,
                          0);
    if (llama) {
        o->swiglu_bwd(o, m->scratch.dh1, m->scratch.dh2, m->scratch.dact, a->h1, a->h2, n);
        EXPERT_PTRS(m, w, up, up_b);
        GRAD_PTRS(m, g, up, up_b);
        o->grouped_linear_bwd(o, dx, gp, NULL, m->scratch.dh2, a->xe, wp, M, El, C, F, 0);
        EXPERT_PTRS(m, w, gate, up_b);
        GRAD_PTRS(m, g, gate, up_b);
        o->grouped_linear_bwd(o, dx, gp, NULL, m->scratch.dh1, a->xe, wp, M, El, C, F, 1);
    } else {
        o->gelu_bwd(o, m->scratch.dh2, a->h2, m->scratch.dact, n);
        EXPERT_PTRS(m, w, up, up_b);
        GRAD_PTRS(m, g, up, up_b);
        o->grouped_linear_bwd(o, dx, gp, gp + El, m->scratch.dh2, a->xe, wp, M, El, C, F, 0);
    }
}
#undef EXPERT_PTRS
#undef GRAD_PTRS
