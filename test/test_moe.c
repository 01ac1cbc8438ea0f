/* The mixture-of-experts layer (core/moe) on one rank: forward against an independent fp64
 * reference, every gradient against central finite differences of that reference (llama and gpt2
 * experts, top-1 and top-2, with and without a shared expert, with capacity drops), the aux and
 * z losses, capacity dropping and load statistics against hand-computed tiny cases, the
 * parameter enumeration (names, shapes, local experts under ep) and the activation sizes. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "cuda/ops_cuda.h"
#include "mem.h"
#include "moe.h"
#include "ops.h"
#include "rng.h"
#include "test.h"

/* ---------------------------------------------------------------- fixture */

typedef struct {
    float *p, *g;
    int64_t n;
    char name[128];
} tparam;

typedef struct {
    ust_arena *arena;
    tparam t[256];
    int n;
} plist;

/* moe_enum_params callback: one arena tensor (and gradient) per parameter. */
static void collect(void *ctx, const moe_param *q) {
    plist *l = ctx;
    tparam *t = &l->t[l->n++];
    t->n = q->rows * q->cols;
    t->p = mem_alloc(l->arena, MEM_PARAMS, t->n * sizeof(float));
    t->g = mem_alloc(l->arena, MEM_GRADS, t->n * sizeof(float));
    snprintf(t->name, sizeof t->name, "%s", q->name);
    if (q->p) *q->p = t->p;
    if (q->g) *q->g = t->g;
}

typedef struct {
    ust_config cfg;
    ust_ops *ops;
    ust_arena arena;
    moe_ctx m;
    moe_acts a;
    moe_weights w, g;
    plist pl;
    int N;
    float *x, *y, *dy, *dx;
} fixture;

static void moe_config(ust_config *c, ust_arch arch, int E, int k, int C, int Fe, int shared) {
    cfg_defaults(c);
    c->model.arch = arch;
    c->model.n_layer = 2;
    c->model.d_model = C;
    c->model.moe.num_experts = E;
    c->model.moe.top_k = k;
    c->model.moe.d_ff_expert = Fe;
    c->model.moe.shared_expert = shared;
}

static void fixture_make_on(fixture *f, int N, ust_ops *ops) {
    f->ops = ops;
    mem_init(&f->arena, f->ops);
    f->N = N;
    moe_init(&f->m, &f->cfg, f->ops, &f->arena, N, NULL);
    moe_weights_init(&f->w, &f->m);
    moe_weights_init(&f->g, &f->m);
    f->pl.arena = &f->arena;
    f->pl.n = 0;
    moe_enum_params(&f->cfg, 0, 1, 0, &f->w, &f->g, collect, &f->pl);
    moe_acts_init(&f->m, &f->a, &f->arena);
    int64_t NC = (int64_t)N * f->cfg.model.d_model;
    f->x = mem_alloc(&f->arena, MEM_ACTS, NC * 4);
    f->y = mem_alloc(&f->arena, MEM_ACTS, NC * 4);
    f->dy = mem_alloc(&f->arena, MEM_ACTS, NC * 4);
    f->dx = mem_alloc(&f->arena, MEM_ACTS, NC * 4);
}

static void fixture_make(fixture *f, int N) { fixture_make_on(f, N, ops_cpu_create(1, 1)); }

static void fixture_free(fixture *f) {
    moe_acts_free(&f->a);
    moe_weights_free(&f->w);
    moe_weights_free(&f->g);
    moe_free(&f->m);
    mem_release(&f->arena);
    f->ops->destroy(f->ops);
}

/* Random weights of O(0.5) (router O(1), so routing is far from uniform and ties), biases 0.3. */
static void fill_random(fixture *f, uint64_t seed) {
    for (int i = 0; i < f->pl.n; i++) {
        tparam *t = &f->pl.t[i];
        float s = strstr(t->name, "router") ? 1.0f : strstr(t->name, "bias") ? 0.3f : 0.5f;
        for (int64_t j = 0; j < t->n; j++) t->p[j] = s * rng_normal(seed, i, j);
    }
    int64_t NC = (int64_t)f->N * f->cfg.model.d_model;
    for (int64_t j = 0; j < NC; j++) {
        f->x[j] = rng_normal(seed, 1000, j);
        f->dy[j] = rng_normal(seed, 1001, j);
    }
}

/* ---------------------------------------------------------------- fp64 reference */

typedef struct {
    const ust_config *cfg;
    const moe_weights *w;
    int N;
} ref_ctx;

static double gelu64(double x) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
static double silu64(double x) { return x / (1.0 + exp(-x)); }

/* out(C) += scale * expert(x(C)) in double. */
static void ref_expert(const ref_ctx *r, const moe_expert *e, const double *x, double scale,
                       double *out) {
    int C = r->cfg->model.d_model, F = r->cfg->model.moe.d_ff_expert;
    if (e == &r->w->shared && r->cfg->model.moe.shared_d_ff > 0) F = r->cfg->model.moe.shared_d_ff;
    int llama = r->cfg->model.arch == ARCH_LLAMA;
    double h[256];
    for (int f = 0; f < F; f++) {
        double u = e->up_b ? e->up_b[f] : 0.0, gt = 0.0;
        for (int c = 0; c < C; c++) {
            u += (double)e->up[f * C + c] * x[c];
            if (llama) gt += (double)e->gate[f * C + c] * x[c];
        }
        h[f] = llama ? silu64(gt) * u : gelu64(u);
    }
    for (int c = 0; c < C; c++) {
        double s = e->down_b ? e->down_b[c] : 0.0;
        for (int f = 0; f < F; f++) s += (double)e->down[c * F + f] * h[f];
        out[c] += scale * s;
    }
}

static int desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* A token's k experts (descending scores p + bias, ties to the lower index), group-limited
 * (n_group > 1: only the topk_group groups whose two best p + bias sum highest) or node-limited
 * (max_nodes_per_token M: the M groups whose top_k / M best sum highest), written from
 * DeepSeek-V3's description independently of ops_cpu.c. */
static void ref_select(const __typeof__(((ust_config *)0)->model.moe) *mc, const double *p,
                       const float *bias, int *sel) {
    int E = mc->num_experts, G = mc->n_group, Eg = E / G, ok[64], M = mc->max_nodes_per_token;
    int q = M ? mc->top_k / M : 2, T = M ? M : mc->topk_group;
    double sc[64], gs[64], v[64];
    for (int e = 0; e < E; e++) sc[e] = p[e] + (bias ? bias[e] : 0), ok[e] = G == 1;
    for (int g = 0; g < G; g++) { /* the sum of the group's q highest: sorted */
        memcpy(v, sc + g * Eg, sizeof(double) * (size_t)Eg);
        qsort(v, (size_t)Eg, sizeof(double), desc);
        gs[g] = 0;
        for (int i = 0; i < q; i++) gs[g] += v[i];
    }
    for (int t = 0; t < T && G > 1; t++) {
        int best = -1;
        for (int g = 0; g < G; g++)
            if (!ok[g * Eg] && (best < 0 || gs[g] > gs[best])) best = g;
        for (int e = best * Eg; e < (best + 1) * Eg; e++) ok[e] = 1;
    }
    for (int j = 0; j < mc->top_k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int used = !ok[e];
            for (int m = 0; m < j; m++) used |= sel[m] == e;
            if (!used && (best < 0 || sc[e] > sc[best])) best = e;
        }
        sel[j] = best;
    }
}

/* L = sum(dy * y) + loss_scale * (aux_coef aux + z_coef z), y the layer's output for x. */
static double ref_loss(const ref_ctx *r, const float *x, const float *dy, double loss_scale,
                       double *y_out) {
    const __typeof__(r->cfg->model.moe) *mc = &r->cfg->model.moe;
    int N = r->N, C = r->cfg->model.d_model, E = mc->num_experts, k = mc->top_k;
    double cnt[64] = {0}, psum[64] = {0}, zsum = 0, L = 0;
    double scnt[8][64] = {{0}}, spsum[8][64] = {{0}}; /* per sequence (seq_aux_loss_coef) */
    int B = mc->seq_aux_loss_coef > 0 ? r->cfg->train.micro_batch_size : 1, Tl = N / B;
    const float *bias = r->w->bias;
    int kept[64] = {0};
    int64_t cap = mc->capacity_factor > 0 ? (int64_t)ceil(mc->capacity_factor * N * k / E - 1e-9)
                                          : (int64_t)1 << 40;
    for (int n = 0; n < N; n++) {
        double xn[256], y[256] = {0}, lg[64], p[64], mx = -INFINITY, s = 0;
        for (int c = 0; c < C; c++) xn[c] = x[n * C + c];
        for (int e = 0; e < E; e++) {
            lg[e] = 0;
            for (int c = 0; c < C; c++) lg[e] += (double)r->w->router[e * C + c] * xn[c];
            mx = fmax(mx, lg[e]);
        }
        int sig = mc->score == MOE_SIGMOID;
        for (int e = 0; e < E; e++) p[e] = sig ? 1 / (1 + exp(-lg[e])) : exp(lg[e] - mx);
        for (int e = 0; e < E; e++) s += p[e];
        for (int e = 0; e < E; e++) { /* the aux statistics: softmax, or normalized sigmoid */
            if (!sig) p[e] /= s;
            psum[e] += sig ? p[e] / s : p[e], spsum[n / Tl][e] += sig ? p[e] / s : p[e];
        }
        if (!sig) zsum += pow(mx + log(s), 2);
        int sel[64];
        double S = 0;
        ref_select(mc, p, bias, sel);
        for (int j = 0; j < k; j++) S += p[sel[j]];
        for (int j = 0; j < k; j++) {
            int e = sel[j];
            cnt[e]++, scnt[n / Tl][e]++;
            if (kept[e]++ >= cap) continue; /* dropped: contributes nothing */
            ref_expert(r, &r->w->experts[e], xn,
                       (mc->norm_topk ? p[e] / S : p[e]) * mc->routed_scale, y);
        }
        if (mc->shared_expert) ref_expert(r, &r->w->shared, xn, 1.0, y);
        for (int c = 0; c < C; c++) {
            L += (double)dy[n * C + c] * y[c];
            if (y_out) y_out[n * C + c] = y[c];
        }
    }
    double aux = 0;
    for (int e = 0; e < E; e++) aux += cnt[e] / ((double)N * k) * psum[e] / N;
    aux *= E;
    double seq = 0;
    for (int b = 0; b < B && mc->seq_aux_loss_coef > 0; b++)
        for (int e = 0; e < E; e++) seq += E * scnt[b][e] / ((double)Tl * k) * spsum[b][e] / Tl / B;
    return L + loss_scale * (mc->aux_loss_coef * aux + mc->z_loss_coef * zsum / N +
                             mc->seq_aux_loss_coef * seq);
}

/* ---------------------------------------------------------------- gradient check */

/* Central differences of the fp64 reference in each element of x and of every parameter, against
 * moe_backward. The reference computes in double with h = 1e-4 on O(1) values, so its truncation
 * error is ~1e-8 relative; moe runs in fp32 through sums of <= 2*Fe terms, so 1e-3 relative
 * (plus 2e-4 absolute for near-zero entries) is far above float noise and far below what a wrong
 * term gives. Routing must not change inside +-h: the fixtures keep routing margins >> h. */
static int check_gradients(fixture *f, const char *what, char *why, size_t nwhy) {
    float loss_scale = 1.7f;
    ref_ctx r = {&f->cfg, &f->w, f->N};
    moe_stats st;
    moe_forward(&f->m, &f->a, &f->w, f->y, f->x, &st);
    double yref[4096];
    double Lref = ref_loss(&r, f->x, f->dy, loss_scale, yref);
    int64_t NC = (int64_t)f->N * f->cfg.model.d_model;
    double ysum = 0;
    for (int64_t j = 0; j < NC; j++) {
        ysum += f->dy[j] * f->y[j];
        if (fabs(f->y[j] - yref[j]) > 1e-4 + 1e-4 * fabs(yref[j]))
            return snprintf(why, nwhy, "%s: y[%lld] = %.7g, reference %.7g", what, (long long)j,
                            f->y[j], yref[j]),
                   1;
    }
    if (fabs(ysum + loss_scale * st.loss - Lref) > 1e-4 * (1 + fabs(Lref)))
        return snprintf(why, nwhy, "%s: loss %.7g vs reference %.7g", what,
                        ysum + loss_scale * st.loss, Lref),
               1;
    for (int i = 0; i < f->pl.n; i++) memset(f->pl.t[i].g, 0, f->pl.t[i].n * 4);
    moe_backward(&f->m, &f->a, &f->w, &f->g, f->dx, f->dy, f->x, loss_scale, 0);
    const double h = 1e-4;
    for (int i = -1; i < f->pl.n; i++) { /* -1: the input x */
        float *p = i < 0 ? f->x : f->pl.t[i].p, *g = i < 0 ? f->dx : f->pl.t[i].g;
        int64_t n = i < 0 ? NC : f->pl.t[i].n;
        for (int64_t j = 0; j < n; j++) {
            float keep = p[j];
            p[j] = keep + (float)h;
            double hp = p[j] - keep; /* the step actually taken in float */
            double lp = ref_loss(&r, f->x, f->dy, loss_scale, NULL);
            p[j] = keep - (float)h;
            double hm = keep - p[j];
            double lm = ref_loss(&r, f->x, f->dy, loss_scale, NULL);
            p[j] = keep;
            double fd = (lp - lm) / (hp + hm);
            if (!(fabs(g[j] - fd) <= 2e-4 + 1e-3 * fabs(fd)))
                return snprintf(why, nwhy, "%s: d/d %s[%lld] = %.7g, finite difference %.7g", what,
                                i < 0 ? "x" : f->pl.t[i].name, (long long)j, g[j], fd),
                       1;
        }
    }
    return 0;
}

static void gradient_case(ust_arch arch, int k, int shared, double capacity, const char *what) {
    fixture f;
    moe_config(&f.cfg, arch, 4, k, 8, 6, shared);
    f.cfg.model.moe.aux_loss_coef = 0.3;
    f.cfg.model.moe.z_loss_coef = 0.05;
    f.cfg.model.moe.capacity_factor = capacity;
    fixture_make(&f, 12);
    fill_random(&f, 11 + k + 2 * shared);
    char why[512];
    int bad = check_gradients(&f, what, why, sizeof why);
    fixture_free(&f);
    CHECK(!bad, "%s", why);
}

static void test_moe_llama_top2_gradients_match_finite_differences(void) {
    gradient_case(ARCH_LLAMA, 2, 0, 0, "llama top-2");
}
static void test_moe_llama_top1_shared_gradients_match_finite_differences(void) {
    gradient_case(ARCH_LLAMA, 1, 1, 0, "llama top-1 shared");
}
static void test_moe_llama_top2_shared_gradients_match_finite_differences(void) {
    gradient_case(ARCH_LLAMA, 2, 1, 0, "llama top-2 shared");
}
static void test_moe_gpt2_top1_gradients_match_finite_differences(void) {
    gradient_case(ARCH_GPT2, 1, 0, 0, "gpt2 top-1");
}
static void test_moe_gpt2_top2_shared_gradients_match_finite_differences(void) {
    gradient_case(ARCH_GPT2, 2, 1, 0, "gpt2 top-2 shared");
}
static void test_moe_llama_top3_gradients_match_finite_differences(void) {
    gradient_case(ARCH_LLAMA, 3, 0, 0, "llama top-3");
}
/* train.recompute selective: no layer keeps its experts' or shared expert's activation outputs
 * (backward recomputes them from the saved projections into its scratch), and the gradients stay
 * the reference's, through the grouped GEMMs and one linear per expert */
static void selective_case(ust_arch arch, int grouped, const char *what) {
    fixture f;
    moe_config(&f.cfg, arch, 4, 2, 8, 6, 1);
    f.cfg.model.moe.aux_loss_coef = 0.3;
    f.cfg.model.moe.grouped_gemm = grouped;
    f.cfg.train.recompute = RECOMPUTE_SELECTIVE;
    fixture_make(&f, 12);
    int kept = f.a.act || f.a.s_act;
    fill_random(&f, 17);
    char why[512];
    int bad = check_gradients(&f, what, why, sizeof why);
    fixture_free(&f);
    CHECK(!kept, "%s: the activation outputs are kept", what);
    CHECK(!bad, "%s", why);
}

static void test_moe_selective_recompute_gradients_match_finite_differences(void) {
    selective_case(ARCH_LLAMA, 1, "llama shared, grouped, selective");
    selective_case(ARCH_LLAMA, 0, "llama shared, per expert, selective");
    selective_case(ARCH_GPT2, 1, "gpt2 shared, grouped, selective");
}
static void hand_fixture_cfg(fixture *f, int k, double capacity, double aux_coef, double seq);

/* the sequence-wise balance loss: 12 tokens as 3 sequences of 4 (its statistics per sequence),
 * alone and with the aux loss, and with a balancing bias moving the choices */
static void test_moe_seq_aux_gradients_match_finite_differences(void) {
    for (int v = 0; v < 3 && !t_failed_flag; v++) {
        fixture f;
        moe_config(&f.cfg, v == 1 ? ARCH_GPT2 : ARCH_LLAMA, 4, 2, 8, 6, v == 1);
        f.cfg.train.micro_batch_size = 3;
        f.cfg.model.moe.seq_aux_loss_coef = 0.4;
        f.cfg.model.moe.aux_loss_coef = v == 0 ? 0 : 0.3;
        f.cfg.model.moe.bias_update_rate = v == 2 ? 0.01 : 0;
        fixture_make(&f, 12);
        fill_random(&f, 31 + v);
        char why[512];
        int bad = check_gradients(&f,
                                  v == 0   ? "seq aux"
                                  : v == 1 ? "seq + aux gpt2"
                                           : "seq + bias",
                                  why, sizeof why);
        fixture_free(&f);
        CHECK(!bad, "%s", why);
    }
}

/* Sequence-wise loss on the hand fixture as 2 sequences of 2 tokens (top-1 picks 0, 1 | 0, 0):
 * sequence 0: f = (1/2, 1/2), P = (.5, .5): 2 (1/4 + 1/4) = 1; sequence 1: f = (1, 0),
 * P = ((.8807971 + .5)/2, .) : 2 * .6903985 = 1.3807971; seq = (1 + 1.3807971) / 2. */
static void test_moe_seq_aux_loss_matches_hand_computed_value(void) {
    fixture f;
    f.cfg.train.micro_batch_size = 2;
    hand_fixture_cfg(&f, 1, 0, 0.1, 0.5);
    moe_stats st;
    moe_forward(&f.m, &f.a, &f.w, f.y, f.x, &st);
    fixture_free(&f);
    CHECK_CLOSE(st.seq_aux_loss, (1 + 1.3807971) / 2, 1e-6, 0, "sequence-wise aux loss");
    CHECK_CLOSE(st.loss,
                0.1 * 1.0951992694944706 + 0.01 * 2.113397074470959 + 0.5 * (1 + 1.3807971) / 2,
                1e-6, 0, "loss");
}

/* capacity 0.5: each expert keeps ceil(0.5*12*2/4) = 3 of ~6 assignments, so many drops */
static void test_moe_capacity_drops_gradients_match_finite_differences(void) {
    gradient_case(ARCH_GPT2, 2, 0, 0.5, "gpt2 top-2 capacity 0.5");
    if (t_failed_flag) return;
    gradient_case(ARCH_LLAMA, 2, 1, 0.5, "llama top-2 shared capacity 0.5");
}

/* ---------------------------------------------------------------- hand-computed cases */

/* N = 4 tokens, C = 2, E = 2 gpt2 experts with Fe = 2: router = identity, so logits = x;
 * up = down = identity, up bias 0, down bias (10, 0) for expert 0 and (0, 20) for expert 1, so
 * expert e(x) = gelu(x) + b_e elementwise. x = (1,0), (0,1), (2,0), (0,0). */
static void hand_fixture_cfg(fixture *f, int k, double capacity, double aux_coef, double seq) {
    int B = f->cfg.train.micro_batch_size;
    moe_config(&f->cfg, ARCH_GPT2, 2, k, 2, 2, 0);
    f->cfg.train.micro_batch_size = B;
    f->cfg.model.moe.seq_aux_loss_coef = seq;
    f->cfg.model.moe.aux_loss_coef = aux_coef;
    f->cfg.model.moe.z_loss_coef = 0.01;
    f->cfg.model.moe.capacity_factor = capacity;
    fixture_make(f, 4);
    for (int i = 0; i < f->pl.n; i++) memset(f->pl.t[i].p, 0, f->pl.t[i].n * 4);
    f->w.router[0] = f->w.router[3] = 1;
    for (int e = 0; e < 2; e++) {
        moe_expert *x = &f->w.experts[e];
        x->up[0] = x->up[3] = x->down[0] = x->down[3] = 1;
    }
    f->w.experts[0].down_b[0] = 10;
    f->w.experts[1].down_b[1] = 20;
    float xs[8] = {1, 0, 0, 1, 2, 0, 0, 0};
    memcpy(f->x, xs, sizeof xs);
}

static void hand_fixture(fixture *f, int k, double capacity, double aux_coef) {
    f->cfg.train.micro_batch_size = 4;
    hand_fixture_cfg(f, k, capacity, aux_coef, 0);
}

#define GELU1 0.8411919906082768
#define GELU2 1.954597694087775

/* softmax rows: (.7310586, .2689414), (.2689414, .7310586), (.8807971, .1192029), (.5, .5);
 * top-1 picks experts 0, 1, 0, 0 (the tie goes to expert 0): f = (3/4, 1/4),
 * P = ((.7310586 + .2689414 + .8807971 + .5)/4, 1 - that) = (.5951993, .4048007),
 * aux = 2 (3/4 * .5951993 + 1/4 * .4048007) = 1.0951993;
 * lse = log(1+e), log(1+e), log(1+e^2), log 2: z = mean lse^2 = 2.1133971. */
static void test_moe_aux_and_z_loss_match_hand_computed_values(void) {
    fixture f;
    hand_fixture(&f, 1, 0, 0.1);
    moe_stats st;
    moe_forward(&f.m, &f.a, &f.w, f.y, f.x, &st);
    fixture_free(&f);
    CHECK_CLOSE(st.aux_loss, 1.0951992694944706, 1e-6, 0, "aux loss");
    CHECK_CLOSE(st.z_loss, 2.113397074470959, 1e-5, 0, "z loss");
    CHECK_CLOSE(st.loss, 0.1 * 1.0951992694944706 + 0.01 * 2.113397074470959, 1e-6, 0, "loss");
    CHECK(st.load_max == 3 && st.load_mean == 2 && st.dropped_frac == 0 && st.tokens == 4,
          "load max %g mean %g dropped %g tokens %lld", st.load_max, st.load_mean, st.dropped_frac,
          (long long)st.tokens);
}

/* The same tokens with top-1 and capacity_factor 1: capacity ceil(1 * 4 * 1 / 2) = 2, expert 0
 * gets tokens 0, 2, 3 in that order, so token 3 is dropped (y = 0: only the caller's residual
 * passes) and the others get gelu(x) + b_e with gate 1. */
static void test_moe_capacity_drops_overflow_in_token_order_top1(void) {
    fixture f;
    hand_fixture(&f, 1, 1.0, 0.1);
    moe_stats st;
    moe_forward(&f.m, &f.a, &f.w, f.y, f.x, &st);
    float y[8];
    memcpy(y, f.y, sizeof y);
    fixture_free(&f);
    double want[8] = {GELU1 + 10, 0, 0, GELU1 + 20, GELU2 + 10, 0, 0, 0};
    for (int i = 0; i < 8; i++) CHECK_CLOSE(y[i], want[i], 1e-5, 1e-6, "y");
    CHECK(st.dropped_frac == 0.25 && st.load_max == 3, "dropped %g load max %g", st.dropped_frac,
          st.load_max);
}

/* Top-2 (every token picks both experts) and capacity_factor 0.5: capacity ceil(0.5*4*2/2) = 2,
 * so both experts keep tokens 0 and 1 and drop 2 and 3. Token 0: gates (.7310586, .2689414) for
 * experts (0, 1): y = gelu(x) + .7310586 (10, 0) + .2689414 (0, 20); token 1 the mirror image;
 * the dropped tokens' gates are not renormalized away. */
static void test_moe_capacity_drops_whole_tokens_top2(void) {
    fixture f;
    hand_fixture(&f, 2, 0.5, 0.1);
    moe_stats st;
    moe_forward(&f.m, &f.a, &f.w, f.y, f.x, &st);
    float y[8];
    memcpy(y, f.y, sizeof y);
    fixture_free(&f);
    double p = 0.7310585786300049, q = 1 - p;
    double want[8] = {GELU1 + 10 * p, 20 * q, 10 * q, GELU1 + 20 * p, 0, 0, 0, 0};
    for (int i = 0; i < 8; i++) CHECK_CLOSE(y[i], want[i], 1e-5, 1e-6, "y");
    CHECK(st.dropped_frac == 0.5 && st.load_max == 4 && st.load_mean == 4,
          "dropped %g load max %g mean %g", st.dropped_frac, st.load_max, st.load_mean);
    CHECK_CLOSE(st.aux_loss, 1.0, 1e-6, 0, "aux loss (f = (1/2, 1/2), P_0 + P_1 = 1)");
}

/* The z-loss gradient by hand: d/dx of z_coef * mean(lse^2) with router = identity is
 * z_coef * 2 lse(x_n) softmax(x_n) / N per token (through logits = x); with dy = 0, no aux and
 * experts cut off (zero down weights and biases), dx is exactly that. */
static void test_moe_z_loss_gradient_matches_hand_computed_value(void) {
    fixture f;
    hand_fixture(&f, 1, 0, 0);
    for (int e = 0; e < 2; e++) memset(f.w.experts[e].down_b, 0, 2 * 4);
    memset(f.dy, 0, 8 * 4);
    moe_stats st;
    moe_forward(&f.m, &f.a, &f.w, f.y, f.x, &st);
    moe_backward(&f.m, &f.a, &f.w, &f.g, f.dx, f.dy, f.x, 1.0f, 0);
    float dx[8];
    memcpy(dx, f.dx, sizeof dx);
    fixture_free(&f);
    double lse[4] = {1.3132616875182228, 1.3132616875182228, 2.1269280110429727,
                     0.6931471805599453};
    double p0[4] = {0.7310585786300049, 0.2689414213699951, 0.8807970779778823, 0.5};
    for (int n = 0; n < 4; n++) {
        CHECK_CLOSE(dx[2 * n], 0.01 * 2 * lse[n] * p0[n] / 4, 1e-7, 1e-5, "dx[n][0]");
        CHECK_CLOSE(dx[2 * n + 1], 0.01 * 2 * lse[n] * (1 - p0[n]) / 4, 1e-7, 1e-5, "dx[n][1]");
    }
}

/* ---------------------------------------------------------------- parameters, memory */

typedef struct {
    char names[64][128];
    int64_t rows[64], cols[64];
    int expert[64], decay[64], n;
    float std[64];
} name_list;

static void list_names(void *ctx, const moe_param *q) {
    name_list *l = ctx;
    snprintf(l->names[l->n], 128, "%s", q->name);
    l->rows[l->n] = q->rows, l->cols[l->n] = q->cols, l->expert[l->n] = q->expert;
    l->decay[l->n] = q->decay, l->std[l->n] = q->init_std;
    l->n++;
}

/* llama, 8 experts over ep = 4: rank 2 holds experts 4 and 5, named by their global index; the
 * router and the shared expert are on every rank. */
static void test_moe_params_name_local_experts_by_global_index(void) {
    ust_config c;
    moe_config(&c, ARCH_LLAMA, 8, 2, 16, 24, 1);
    name_list l = {0};
    moe_enum_params(&c, 3, 4, 2, NULL, NULL, list_names, &l);
    const char *want[] = {"model.layers.3.mlp.router.weight",
                          "model.layers.3.mlp.shared_expert.gate_proj.weight",
                          "model.layers.3.mlp.shared_expert.up_proj.weight",
                          "model.layers.3.mlp.shared_expert.down_proj.weight",
                          "model.layers.3.mlp.experts.4.gate_proj.weight",
                          "model.layers.3.mlp.experts.4.up_proj.weight",
                          "model.layers.3.mlp.experts.4.down_proj.weight",
                          "model.layers.3.mlp.experts.5.gate_proj.weight",
                          "model.layers.3.mlp.experts.5.up_proj.weight",
                          "model.layers.3.mlp.experts.5.down_proj.weight"};
    CHECK(l.n == 10, "%d tensors, expected 10", l.n);
    for (int i = 0; i < 10; i++)
        CHECK(!strcmp(l.names[i], want[i]), "%s vs %s", l.names[i], want[i]);
    CHECK(l.rows[0] == 8 && l.cols[0] == 16 && l.expert[0] == -1, "router [%lld, %lld]",
          (long long)l.rows[0], (long long)l.cols[0]);
    CHECK(l.rows[4] == 24 && l.cols[4] == 16 && l.expert[4] == 4, "gate_proj");
    CHECK(l.rows[9] == 16 && l.cols[9] == 24 && l.expert[9] == 5, "down_proj");
    CHECK(l.std[9] == 0.02f / sqrtf(4.0f) && l.std[8] == 0.02f, "init std %g %g", l.std[9],
          l.std[8]);
}

static void test_moe_gpt2_params_have_biases_without_decay(void) {
    ust_config c;
    moe_config(&c, ARCH_GPT2, 2, 1, 16, 24, 0);
    name_list l = {0};
    moe_enum_params(&c, 0, 1, 0, NULL, NULL, list_names, &l);
    CHECK(l.n == 1 + 2 * 4, "%d tensors", l.n);
    CHECK(!strcmp(l.names[2], "model.layers.0.mlp.experts.0.up_proj.bias") && l.rows[2] == 1 &&
              l.cols[2] == 24 && l.decay[2] == 0 && l.std[2] == 0,
          "%s", l.names[2]);
    CHECK(!strcmp(l.names[8], "model.layers.0.mlp.experts.1.down_proj.bias") && l.cols[8] == 16,
          "%s", l.names[8]);
}

static void test_moe_every_selects_layers_from_zero(void) {
    ust_config c;
    moe_config(&c, ARCH_LLAMA, 4, 2, 8, 8, 0);
    c.model.moe.every = 2;
    CHECK(moe_layer_is_moe(&c, 0) && !moe_layer_is_moe(&c, 1) && moe_layer_is_moe(&c, 2),
          "every 2");
    c.model.moe.num_experts = 0;
    CHECK(!moe_layer_is_moe(&c, 0), "no experts");
}

/* DeepSeek's first_k_dense_replace (first_dense) and an explicit per-layer list (Qwen3-MoE's
 * mlp_only_layers / decoder_sparse_step), with first_dense over the list */
static void test_moe_first_dense_and_layer_list_select_layers(void) {
    ust_config c;
    moe_config(&c, ARCH_LLAMA, 4, 2, 8, 8, 0);
    c.model.n_layer = 4;
    c.model.moe.first_dense = 1;
    CHECK(!moe_layer_is_moe(&c, 0) && moe_layer_is_moe(&c, 1) && moe_layer_is_moe(&c, 3),
          "first_dense 1");
    snprintf(c.model.moe.layers, sizeof c.model.moe.layers, "1,1,0,1");
    CHECK(!moe_layer_is_moe(&c, 0) && moe_layer_is_moe(&c, 1) && !moe_layer_is_moe(&c, 2) &&
              moe_layer_is_moe(&c, 3),
          "list 1,1,0,1 after first_dense 1");
    c.model.moe.first_dense = 0;
    CHECK(moe_layer_is_moe(&c, 0) && !moe_layer_is_moe(&c, 2), "list alone");
    /* model.mtp's blocks, layers n_layer + k: MoE in a model with MoE layers, whatever the list's
     * last entry (DeepSeek-V3's MTP layer is a MoE layer) */
    snprintf(c.model.moe.layers, sizeof c.model.moe.layers, "1,1,0,0");
    CHECK(moe_layer_is_moe(&c, 4) && moe_layer_is_moe(&c, 5) && !moe_layer_is_moe(&c, 3),
          "mtp blocks after a list ending dense");
    c.model.moe.num_experts = 0;
    CHECK(!moe_layer_is_moe(&c, 4), "mtp blocks of a dense model");
}

/* The router's options on a hand case (sigmoid scores s, logits = logit(s)), E = 4 in 2 groups
 * of 2, top-2 within the one chosen group, scale 2: group 0 holds s = (.9, .1) (top-2 sum 1.0,
 * max .9), group 1 (.6, .55) (sum 1.15, max .6): the top-2 sums choose group 1, experts 2, 3;
 * gates 2 s = (1.2, 1.1), renormalized 2 s / 1.15. A bias of .2 on expert 0 moves group 0's sum
 * to 1.2 and the choice to experts 0, 1, but not the gates: 2 s = (1.8, .2). */
static void test_moe_router_groups_bias_and_norm_hand_case(void) {
    ust_ops *o = ops_cpu_create(1, 1);
    const float s[4] = {0.9f, 0.1f, 0.6f, 0.55f}, b[4] = {0.2f, 0, 0, 0};
    float lg[4], probs[4], lse[1], gate[2], psum[4];
    int32_t tk[2];
    for (int e = 0; e < 4; e++) lg[e] = logf(s[e] / (1 - s[e]));
    for (int v = 0; v < 4; v++) {
        int norm = v & 1, bias = v >> 1;
        ops_moe_route r = {1, norm, 2, 1, 2.0f, 2};
        o->moe_router_fwd(o, probs, lse, tk, gate, psum, lg, bias ? b : NULL, 1, 4, 2, &r);
        int e0 = bias ? 0 : 2, e1 = bias ? 1 : 3;
        double S = s[e0] + s[e1], g0 = 2 * s[e0] / (norm ? S : 1), g1 = 2 * s[e1] / (norm ? S : 1);
        CHECK(tk[0] == e0 && tk[1] == e1, "norm %d bias %d: experts %d %d, want %d %d", norm, bias,
              tk[0], tk[1], e0, e1);
        CHECK(fabs(gate[0] - g0) < 1e-6 && fabs(gate[1] - g1) < 1e-6,
              "norm %d bias %d: gates %.7g %.7g, want %.7g %.7g", norm, bias, gate[0], gate[1], g0,
              g1);
        CHECK(fabs(lse[0] - 2.15f) < 1e-6 && fabs(psum[1] - 0.1f / 2.15f) < 1e-6,
              "score sum %.7g, normalized affinity %.7g", lse[0], psum[1]);
    }
    o->destroy(o);
}

/* The layer under each routing option against the fp64 reference (forward and every gradient):
 * Qwen3-MoE's (softmax, no renormalization), DeepSeek-V3's (sigmoid, 2 of 4 groups, scale 2.5,
 * a balancing bias, a shared expert of its own width, the aux and sequence-wise losses through
 * the normalized affinities), sigmoid without renormalization, and node-limited routing (top-6
 * from at most 2 of 3 nodes, the nodes ranked by their top-3 sums). */
static void test_moe_routing_options_gradients_match_finite_differences(void) {
    for (int v = 0; v < 4 && !t_failed_flag; v++) {
        fixture f;
        moe_config(&f.cfg, ARCH_LLAMA, v == 3 ? 12 : 8, v == 3 ? 6 : 2, 8, 6, v == 1);
        f.cfg.model.moe.aux_loss_coef = 0.3;
        f.cfg.model.moe.z_loss_coef = v == 0 ? 0.05 : 0;
        f.cfg.model.moe.norm_topk = v == 1;
        f.cfg.model.moe.score = v == 0 ? MOE_SOFTMAX : MOE_SIGMOID;
        f.cfg.model.moe.n_group = v == 1 ? 4 : 1;
        f.cfg.model.moe.topk_group = v == 1 ? 2 : 1;
        f.cfg.model.moe.routed_scale = v == 1 ? 2.5 : 1;
        f.cfg.model.moe.shared_d_ff = v == 1 ? 10 : 0;
        f.cfg.model.moe.bias_update_rate = v == 1 ? 0.01 : 0;
        f.cfg.train.micro_batch_size = 3;
        f.cfg.model.moe.seq_aux_loss_coef = v == 2 ? 0.4 : 0;
        if (v == 3) { /* node-limited: 2 of 3 nodes of 4 experts, ranked by their top-3 sums */
            f.cfg.model.moe.score = MOE_SIGMOID, f.cfg.model.moe.n_group = 3;
            f.cfg.model.moe.max_nodes_per_token = 2, f.cfg.model.moe.routed_scale = 2.5;
        }
        fixture_make(&f, 12);
        fill_random(&f, 41 + v);
        char why[512];
        const char *what[] = {"softmax no norm", "sigmoid groups scale bias shared", "sigmoid",
                              "sigmoid node-limited top-3 sums"};
        int bad = check_gradients(&f, what[v], why, sizeof why);
        fixture_free(&f);
        CHECK(!bad, "%s", why);
    }
}

/* moe_acts_bytes (for the memory plan) is exactly what moe_acts_init takes from the arena. */
static void acts_bytes_case(ust_recompute r) {
    ust_config c;
    moe_config(&c, ARCH_LLAMA, 4, 2, 8, 8, 1);
    c.model.moe.shared_d_ff = 20; /* a shared expert wider than the routed ones */
    c.train.recompute = r;
    ust_ops *o = ops_cpu_create(1, 1);
    ust_arena a;
    mem_init(&a, o);
    moe_ctx m;
    moe_init(&m, &c, o, &a, 32, NULL);
    size_t before = a.bytes[MEM_ACTS];
    moe_acts acts;
    moe_acts_init(&m, &acts, &a);
    int64_t got = (int64_t)(a.bytes[MEM_ACTS] - before), want = moe_acts_bytes(&c, 32, 1);
    moe_acts_free(&acts);
    moe_free(&m);
    mem_release(&a);
    o->destroy(o);
    CHECK(got == want, "recompute %d: arena %lld bytes, moe_acts_bytes %lld", (int)r,
          (long long)got, (long long)want);
}

static void test_moe_acts_bytes_match_the_arena(void) {
    acts_bytes_case(RECOMPUTE_NONE);
    acts_bytes_case(RECOMPUTE_SELECTIVE); /* without the activation outputs */
}

/* ---------------------------------------------------------------- the CUDA backend */

/* The GPU backend, or a second CPU backend under UST_TEST_CUDA_FAKE=cpu (checks this harness on
 * machines without a GPU); NULL (a SKIP line, or with UST_REQUIRE_GPU a failure) when neither. */
static ust_ops *gpu_backend(ust_err *e) {
    const char *fake = getenv("UST_TEST_CUDA_FAKE");
    if (fake && !strcmp(fake, "cpu")) return ops_cpu_create(1, 1);
    ust_ops *g = ops_cuda_create(0, e);
    if (!g && !ops_cuda_gpu_required()) printf("SKIP moe cuda: %s\n", e->msg);
    return g;
}

static double max_rel(const float *a, const float *b, int64_t n) {
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]) / (1.0 + fabs(b[i]));
        w = d > w || d != d ? d : w;
    }
    return w;
}

/* Device tensor -> host copy (freed by the caller). */
static float *host_copy(const ust_ops *o, const void *p, int64_t n) {
    float *h = malloc((size_t)(n > 0 ? n : 1) * 4);
    o->to_host(o, h, p, (size_t)n * 4);
    return h;
}

/* One layer on the GPU and on the CPU backend (v = 1: DeepSeek-V3's routing): the worst relative
 * difference of the losses, output and every gradient, and where (what). */
static double cuda_case(ust_ops *gpu, int v, char *what, size_t nwhat) {
    fixture c, g;
    for (fixture *f = &c; f; f = f == &c ? &g : NULL) {
        moe_config(&f->cfg, ARCH_LLAMA, v == 2 ? 12 : v ? 8 : 6, v == 2 ? 6 : 2, 40, 24, 1);
        f->cfg.model.moe.aux_loss_coef = 0.3;
        f->cfg.model.moe.z_loss_coef = v ? 0 : 0.05;
        f->cfg.model.moe.capacity_factor = 0.8;
        if (v) { /* DeepSeek-V3's routing: sigmoid, 2 of 4 groups, scale, bias, shared width */
            f->cfg.model.moe.score = MOE_SIGMOID, f->cfg.model.moe.n_group = 4;
            f->cfg.model.moe.topk_group = 2, f->cfg.model.moe.routed_scale = 2.5;
            f->cfg.model.moe.shared_d_ff = 32, f->cfg.model.moe.bias_update_rate = 0.01;
            f->cfg.model.moe.seq_aux_loss_coef = 0.2, f->cfg.train.micro_batch_size = 1;
        }
        if (v == 2) /* node-limited: 2 of 3 nodes of 4 experts by their top-3 sums */
            f->cfg.model.moe.n_group = 3, f->cfg.model.moe.topk_group = 1,
            f->cfg.model.moe.max_nodes_per_token = 2;
    }
    const int N = 37;
    fixture_make(&c, N);
    fixture_make_on(&g, N, gpu);
    fill_random(&c, 3);
    for (int i = 0; i < c.pl.n; i++) gpu->to_device(gpu, g.pl.t[i].p, c.pl.t[i].p, c.pl.t[i].n * 4);
    int64_t NC = (int64_t)N * 40;
    gpu->to_device(gpu, g.x, c.x, NC * 4);
    gpu->to_device(gpu, g.dy, c.dy, NC * 4);
    moe_stats sc, sg;
    moe_forward(&c.m, &c.a, &c.w, c.y, c.x, &sc);
    moe_backward(&c.m, &c.a, &c.w, &c.g, c.dx, c.dy, c.x, 0.7f, 0);
    moe_forward(&g.m, &g.a, &g.w, g.y, g.x, &sg);
    moe_backward(&g.m, &g.a, &g.w, &g.g, g.dx, g.dy, g.x, 0.7f, 0);
    double worst = fabs(sc.loss - sg.loss) + fabs(sc.dropped_frac - sg.dropped_frac);
    snprintf(what, nwhat, "losses");
    float *h = host_copy(gpu, g.y, NC);
    if (max_rel(h, c.y, NC) > worst) worst = max_rel(h, c.y, NC), snprintf(what, nwhat, "y");
    free(h);
    h = host_copy(gpu, g.dx, NC);
    if (max_rel(h, c.dx, NC) > worst) worst = max_rel(h, c.dx, NC), snprintf(what, nwhat, "dx");
    free(h);
    for (int i = 0; i < c.pl.n; i++) {
        h = host_copy(gpu, g.pl.t[i].g, c.pl.t[i].n);
        double d = max_rel(h, c.pl.t[i].g, c.pl.t[i].n);
        if (d > worst || d != d) worst = d, snprintf(what, nwhat, "%s", c.pl.t[i].name);
        free(h);
    }
    fixture_free(&c);
    fixture_free(&g);
    return worst;
}

/* The whole layer (forward, backward, every gradient; capacity drops and the shared expert on, so
 * the five MoE ops and the host routing all run) on the GPU against the CPU backend, with softmax
 * routing and with DeepSeek-V3's. Both are fp32; they differ in summation order and expf/logf
 * ulps: 1e-4 relative on O(1) values. */
static void test_moe_layer_on_cuda_matches_cpu(void) {
    for (int v = 0; v < 3; v++) {
        ust_err e;
        ust_ops *gpu = gpu_backend(&e);
        /* UST_REQUIRE_GPU: a GPU that CUDA cannot open fails the test instead of skipping it */
        CHECK(gpu || !ops_cuda_gpu_required(), "no GPU backend: %s", e.msg);
        if (!gpu) return;
        char what[160];
        double worst = cuda_case(gpu, v, what, sizeof what);
        CHECK(worst <= 1e-4, "%s routing, GPU vs CPU: worst relative difference %.3g in %s",
              v == 2 ? "node-limited"
              : v    ? "DeepSeek"
                     : "softmax",
              worst, what);
    }
}

/* ---------------------------------------------------------------- grouped GEMM, balancing */

static double max_abs_diff(const float *a, const float *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = fabs((double)a[i] - b[i]);
        if (x > d || x != x) d = x;
    }
    return d;
}

/* The grouped expert GEMMs (one per projection over all local experts) against one linear per
 * expert, same weights and tokens: outputs, input gradients and every weight gradient, llama and
 * gpt2 (biases), 8 experts over 10 tokens top-1 so some get no row, and with capacity drops. */
static void grouped_case(ust_arch arch, int k, double capacity, const char *what) {
    fixture f[2];
    for (int v = 0; v < 2; v++) {
        moe_config(&f[v].cfg, arch, 8, k, 8, 6, 0);
        f[v].cfg.model.moe.capacity_factor = capacity;
        f[v].cfg.model.moe.grouped_gemm = v == 0;
        fixture_make_on(&f[v], 10, ops_cpu_create(v == 0 ? 2 : 1, 1)); /* 2: the parallel pass */
        fill_random(&f[v], 23);
        moe_stats st;
        for (int i = 0; i < f[v].pl.n; i++) memset(f[v].pl.t[i].g, 0, f[v].pl.t[i].n * 4);
        moe_forward(&f[v].m, &f[v].a, &f[v].w, f[v].y, f[v].x, &st);
        moe_backward(&f[v].m, &f[v].a, &f[v].w, &f[v].g, f[v].dx, f[v].dy, f[v].x, 1.0f, 0);
    }
    int64_t NC = 10 * 8, empty = 0;
    for (int e = 0; e < 8; e++) empty += f[0].a.plan.local[e] == 0;
    double worst = fmax(max_abs_diff(f[0].y, f[1].y, NC), max_abs_diff(f[0].dx, f[1].dx, NC));
    const char *where = "y/dx";
    for (int i = 0; i < f[0].pl.n; i++) {
        double d = max_abs_diff(f[0].pl.t[i].g, f[1].pl.t[i].g, f[0].pl.t[i].n);
        if (d > worst) worst = d, where = f[0].pl.t[i].name;
    }
    char name[128];
    snprintf(name, sizeof name, "%s", where);
    fixture_free(&f[0]);
    fixture_free(&f[1]);
    CHECK(worst <= 1e-5, "%s: grouped vs per-expert differ by %.3g in %s", what, worst, name);
    CHECK(k > 1 || empty > 0, "%s: no expert without rows (the case is meant to have one)", what);
}

static void test_moe_grouped_gemm_matches_per_expert_linears(void) {
    grouped_case(ARCH_LLAMA, 1, 0, "llama top-1");
    grouped_case(ARCH_GPT2, 1, 0, "gpt2 top-1");
    grouped_case(ARCH_LLAMA, 2, 0.5, "llama top-2 capacity 0.5");
    grouped_case(ARCH_GPT2, 2, 0.5, "gpt2 top-2 capacity 0.5");
}

/* Aux-loss-free balancing: the bias moves the choice, never the gate or the aux statistics.
 * Hand fixture (top-1): logits = x, probs as in the aux test; bias (0, 1) makes every token
 * pick expert 1 (token 2: .881 < .119 + 1), with gate 1 (top-1 renormalized), so y = expert
 * 1 = gelu(x) + (0, 20). P_e stays the unbiased mean: aux = 2 (0 * .595 + 1 * .405). Then the
 * update with loads (0, 4), mean 2: bias += 0.5 * sign(2 - load) = (0.5, 0.5). */
static void test_moe_balancing_bias_moves_choices_not_gates(void) {
    fixture f;
    moe_config(&f.cfg, ARCH_GPT2, 2, 1, 2, 2, 0);
    f.cfg.model.moe.bias_update_rate = 0.5;
    f.cfg.model.moe.aux_loss_coef = 0.1;
    fixture_make(&f, 4);
    for (int i = 0; i < f.pl.n; i++) memset(f.pl.t[i].p, 0, f.pl.t[i].n * 4);
    CHECK(f.w.bias != NULL, "no balancing bias tensor with bias_update_rate > 0");
    if (!f.w.bias) return;
    f.w.router[0] = f.w.router[3] = 1;
    for (int e = 0; e < 2; e++) {
        moe_expert *x = &f.w.experts[e];
        x->up[0] = x->up[3] = x->down[0] = x->down[3] = 1;
    }
    f.w.experts[0].down_b[0] = 10;
    f.w.experts[1].down_b[1] = 20;
    float xs[8] = {1, 0, 0, 1, 2, 0, 0, 0};
    memcpy(f.x, xs, sizeof xs);
    f.w.bias[1] = 1.0f;
    moe_stats st;
    moe_forward(&f.m, &f.a, &f.w, f.y, f.x, &st);
    CHECK(st.routed[0] == 0 && st.routed[1] == 4, "routed (%g, %g), want (0, 4)", st.routed[0],
          st.routed[1]);
    double want[8] = {GELU1, 20, 0, GELU1 + 20, GELU2, 20, 0, 20};
    for (int i = 0; i < 8; i++)
        CHECK(fabs(f.y[i] - want[i]) <= 1e-5, "y[%d] = %.7g, want %.7g", i, f.y[i], want[i]);
    CHECK_CLOSE(st.aux_loss, 2 * (1 - 0.5951993), 1e-6, 0, "aux loss from unbiased probs");
    double load[2] = {0, 4};
    moe_update_bias(&f.m, f.w.bias, load);
    CHECK(f.w.bias[0] == 0.5f && f.w.bias[1] == 0.5f, "bias after the update (%g, %g)", f.w.bias[0],
          f.w.bias[1]);
    double even[2] = {2, 2}; /* at the mean: no move */
    moe_update_bias(&f.m, f.w.bias, even);
    CHECK(f.w.bias[0] == 0.5f && f.w.bias[1] == 0.5f, "bias moved at an even load (%g, %g)",
          f.w.bias[0], f.w.bias[1]);
    fixture_free(&f);
}

int main(void) {
    RUN_TEST(test_moe_grouped_gemm_matches_per_expert_linears);
    RUN_TEST(test_moe_selective_recompute_gradients_match_finite_differences);
    RUN_TEST(test_moe_seq_aux_gradients_match_finite_differences);
    RUN_TEST(test_moe_seq_aux_loss_matches_hand_computed_value);
    RUN_TEST(test_moe_balancing_bias_moves_choices_not_gates);
    RUN_TEST(test_moe_llama_top2_gradients_match_finite_differences);
    RUN_TEST(test_moe_llama_top1_shared_gradients_match_finite_differences);
    RUN_TEST(test_moe_llama_top2_shared_gradients_match_finite_differences);
    RUN_TEST(test_moe_gpt2_top1_gradients_match_finite_differences);
    RUN_TEST(test_moe_gpt2_top2_shared_gradients_match_finite_differences);
    RUN_TEST(test_moe_llama_top3_gradients_match_finite_differences);
    RUN_TEST(test_moe_capacity_drops_gradients_match_finite_differences);
    RUN_TEST(test_moe_aux_and_z_loss_match_hand_computed_values);
    RUN_TEST(test_moe_capacity_drops_overflow_in_token_order_top1);
    RUN_TEST(test_moe_capacity_drops_whole_tokens_top2);
    RUN_TEST(test_moe_z_loss_gradient_matches_hand_computed_value);
    RUN_TEST(test_moe_params_name_local_experts_by_global_index);
    RUN_TEST(test_moe_gpt2_params_have_biases_without_decay);
    RUN_TEST(test_moe_every_selects_layers_from_zero);
    RUN_TEST(test_moe_first_dense_and_layer_list_select_layers);
    RUN_TEST(test_moe_router_groups_bias_and_norm_hand_case);
    RUN_TEST(test_moe_routing_options_gradients_match_finite_differences);
    RUN_TEST(test_moe_acts_bytes_match_the_arena);
    RUN_TEST(test_moe_layer_on_cuda_matches_cpu);
    return TEST_SUMMARY();
}
