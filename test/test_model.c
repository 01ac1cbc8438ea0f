/* Whole-model tests: the transformer against an independent double-precision reference forward,
 * gradients against finite differences, recomputation modes, deterministic init and the llm.c
 * checkpoint import. */
#include <stdint.h>
#include <string.h>

#include "config.h"
#include "mem.h"
#include "model.h"
#include "ops.h"
#include "ops_prof.h"
#include "rng.h"
#include "test.h"

enum { TB = 2, TT = 8 };

/* model.mla in tiny_config: 0 off, 1 with q_lora_rank, 2 without (q = W_q x), 3 as 1 with YaRN
 * and its softmax mscale; v_head_dim 8 <
 * qk head 6 + 4 so v's padding is exercised */
static int tiny_mla;
static int tiny_mtp; /* model.mtp.depth in tiny_config (loss_weight 2) */
static int tiny_moe; /* layer 1 and model.mtp's blocks MoE: DeepSeek's sigmoid routing to all 2
                      * experts (no choice a finite difference could flip), a shared expert */

static void tiny_config(ust_config *c, ust_arch arch) {
    cfg_defaults(c);
    c->model.arch = arch;
    c->model.n_layer = 2;
    c->model.d_model = 32;
    c->model.n_head = 4;
    c->model.n_kv_head = arch == ARCH_LLAMA ? 2 : 4;
    c->model.d_ff = arch == ARCH_LLAMA ? 48 : 128;
    c->model.vocab_size = 50;
    c->model.vocab_pad = 64;
    c->model.max_seq_len = 16;
    c->model.rope_theta = 10000;
    c->train.micro_batch_size = TB;
    c->train.seq_len = TT;
    c->model.mtp.depth = tiny_mtp;
    c->model.mtp.loss_weight = 2; /* each module weighs as much as the main loss */
    if (tiny_moe) {
        c->model.moe.num_experts = 2, c->model.moe.top_k = 2, c->model.moe.d_ff_expert = 16;
        c->model.moe.first_dense = 1, c->model.moe.score = MOE_SIGMOID;
        c->model.moe.routed_scale = 2.5, c->model.moe.shared_expert = true;
        c->model.moe.aux_loss_coef = c->model.moe.z_loss_coef = 0; /* mean_loss has no MoE loss */
    }
    if (!tiny_mla) return;
    c->model.n_kv_head = c->model.n_head;
    c->model.mla.enabled = true;
    c->model.mla.q_lora_rank = tiny_mla == 1 ? 12 : 0;
    c->model.mla.kv_lora_rank = 10;
    c->model.mla.qk_nope_head_dim = 6;
    c->model.mla.qk_rope_head_dim = 4;
    c->model.mla.v_head_dim = 8;
    if (tiny_mla != 3) return; /* YaRN past 8 original positions, its softmax mscale on q */
    c->model.rope_scaling.type = ROPE_YARN;
    c->model.rope_scaling.factor = 4;
    c->model.rope_scaling.original_max_position_embeddings = 8;
    c->model.mla.mscale_all_dim = 1;
}

typedef struct {
    ust_ops *ops;   /* what the model calls */
    ust_ops *inner; /* the CPU backend under the op profiler, or NULL */
    ust_arena arena;
    model *m;
    ust_config cfg;
    int want_docs; /* 1: data.doc_mask; 2: and data.reset_positions */
} fixture;

/* A tiny model on the CPU backend, seen through the op profiler when `profiled`. */
static int fixture_make_on(fixture *f, ust_arch arch, ust_recompute rc, int profiled) {
    ust_err e;
    tiny_config(&f->cfg, arch);
    f->cfg.train.recompute = rc;
    f->cfg.data.doc_mask = f->want_docs > 0;
    f->cfg.data.reset_positions = f->want_docs > 1;
    f->inner = profiled ? ops_cpu_create(1, 1) : NULL;
    f->ops = profiled ? ops_prof_create(f->inner) : ops_cpu_create(1, 1);
    mem_init(&f->arena, f->ops);
    if (model_create(&f->m, &f->cfg, f->ops, &f->arena, &e)) {
        fprintf(stderr, "model_create: %s\n", e.msg);
        return -1;
    }
    model_init_params(f->m, 7);
    /* Make every path matter: with GPT-2's small init the residual stream dominates and a
     * wrong gradient inside a block barely moves the total. Matrices get std ~0.2 and norms and
     * biases non-trivial values, so each block's contribution is of the same order as the skip. */
    for (int i = 0; i < model_num_params(f->m); i++) {
        model_param *q = model_param_at(f->m, i);
        float *p = model_params(f->m) + q->offset;
        for (int64_t j = 0; j < q->numel; j++)
            p[j] = q->init_std > 0 ? p[j] * 10.0f : q->init_value + 0.3f * rng_normal(99, i, j);
    }
    return 0;
}

static int fixture_make(fixture *f, ust_arch arch, ust_recompute rc) {
    f->want_docs = 0;
    return fixture_make_on(f, arch, rc, 0);
}

/* With data.doc_mask (and reset_positions when asked). */
static int fixture_make_docs(fixture *f, ust_arch arch, int reset) {
    f->want_docs = 1 + reset;
    return fixture_make_on(f, arch, RECOMPUTE_NONE, 0);
}

static void fixture_free(fixture *f) {
    model_destroy(f->m);
    mem_release(&f->arena);
    f->ops->destroy(f->ops);
    if (f->inner) f->inner->destroy(f->inner);
}

static void tokens(int32_t *in, int32_t *tgt, int V) {
    for (int i = 0; i < TB * TT; i++) {
        in[i] = (int32_t)(rng_u64(3, 1, i) % V);
        tgt[i] = (int32_t)(rng_u64(3, 2, i) % V);
    }
    tgt[3] = -1; /* an ignored target */
}

/* ------------------------------------------------------------------ the reference model */

static const float *P(fixture *f, const char *fmt, int l) {
    char name[128];
    snprintf(name, sizeof name, fmt, l);
    int i = model_find_param(f->m, name);
    if (i < 0) return NULL;
    return model_params(f->m) + model_param_at(f->m, i)->offset;
}

static void ref_norm(const ust_config *c, double *out, const double *x, const float *w,
                     const float *b, int C) {
    double mean = 0, var = 0;
    if (c->model.arch == ARCH_LLAMA) {
        for (int i = 0; i < C; i++) var += x[i] * x[i];
        double r = 1 / sqrt(var / C + c->model.norm_eps);
        for (int i = 0; i < C; i++) out[i] = x[i] * r * w[i];
        return;
    }
    for (int i = 0; i < C; i++) mean += x[i] / C;
    for (int i = 0; i < C; i++) var += (x[i] - mean) * (x[i] - mean) / C;
    double r = 1 / sqrt(var + 1e-5);
    for (int i = 0; i < C; i++) out[i] = (x[i] - mean) * r * w[i] + b[i];
}

/* y(O) = W(O,I) x(I) + b */
static void ref_linear(double *y, const double *x, const float *W, const float *b, int O, int I) {
    for (int o = 0; o < O; o++) {
        double s = b ? b[o] : 0;
        for (int i = 0; i < I; i++) s += (double)W[(int64_t)o * I + i] * x[i];
        y[o] = s;
    }
}

static void ref_rope(double *x, int t, int H, int D, double theta) {
    for (int h = 0; h < H; h++)
        for (int i = 0; i < D / 2; i++) {
            double a = t * pow(theta, -2.0 * i / D), *p = x + h * D;
            double x1 = p[i], x2 = p[i + D / 2];
            p[i] = x1 * cos(a) - x2 * sin(a);
            p[i + D / 2] = x2 * cos(a) + x1 * sin(a);
        }
}

/* Mean loss of one sequence batch, computed position by position in double; docs (B x T, NULL:
 * one document per sequence) gives where each token's document begins: attention stays inside
 * it and, with data.reset_positions, positions count from its start. */
static double ref_loss_docs(fixture *f, const int32_t *in, const int32_t *tgt,
                            const int32_t *docs) {
    const ust_config *c = &f->cfg;
    int C = c->model.d_model, H = c->model.n_head, Hkv = c->model.n_kv_head, D = C / H;
    int F = c->model.d_ff, L = c->model.n_layer, V = c->model.vocab_size;
    int Vp = cfg_vocab_padded(c), llama = c->model.arch == ARCH_LLAMA;
    double *x = calloc(TT * C, 8), *h = calloc(C, 8), *q = calloc(TT * H * D, 8);
    double *k = calloc(TT * Hkv * D, 8), *v = calloc(TT * Hkv * D, 8), *att = calloc(H * D, 8);
    double *tmp = calloc(C > F ? (C > Vp ? C : Vp) : (F > Vp ? F : Vp), 8), *g = calloc(F, 8),
           *u = calloc(F, 8), *atts = calloc(TT * H * D, 8);
    double total = 0;
    int count = 0;
    for (int b = 0; b < TB; b++) {
        const float *wte = P(f, "model.embed_tokens.weight", 0);
        const float *wpe = P(f, "model.embed_positions.weight", 0);
        int start[TT], pos[TT];
        for (int t = 0; t < TT; t++) {
            start[t] = docs ? docs[b * TT + t] : 0;
            pos[t] = c->data.reset_positions ? t - start[t] : t;
        }
        for (int t = 0; t < TT; t++)
            for (int i = 0; i < C; i++)
                x[t * C + i] = wte[in[b * TT + t] * C + i] + (llama ? 0 : wpe[pos[t] * C + i]);
        for (int l = 0; l < L; l++) {
            for (int t = 0; t < TT; t++) {
                ref_norm(c, h, x + t * C, P(f, "model.layers.%d.input_layernorm.weight", l),
                         P(f, "model.layers.%d.input_layernorm.bias", l), C);
                ref_linear(q + t * H * D, h, P(f, "model.layers.%d.self_attn.q_proj.weight", l),
                           P(f, "model.layers.%d.self_attn.q_proj.bias", l), H * D, C);
                ref_linear(k + t * Hkv * D, h, P(f, "model.layers.%d.self_attn.k_proj.weight", l),
                           P(f, "model.layers.%d.self_attn.k_proj.bias", l), Hkv * D, C);
                ref_linear(v + t * Hkv * D, h, P(f, "model.layers.%d.self_attn.v_proj.weight", l),
                           P(f, "model.layers.%d.self_attn.v_proj.bias", l), Hkv * D, C);
                if (llama) {
                    ref_rope(q + t * H * D, pos[t], H, D, c->model.rope_theta);
                    ref_rope(k + t * Hkv * D, pos[t], Hkv, D, c->model.rope_theta);
                }
            }
            for (int t = 0; t < TT; t++)
                for (int hh = 0; hh < H; hh++) {
                    int kh = hh / (H / Hkv);
                    double s[TT], mx = -1e300, sum = 0;
                    for (int j = 0; j < start[t]; j++) s[j] = -INFINITY; /* another document */
                    for (int j = start[t]; j <= t; j++) {
                        s[j] = 0;
                        for (int d = 0; d < D; d++)
                            s[j] += q[t * H * D + hh * D + d] * k[j * Hkv * D + kh * D + d];
                        s[j] /= sqrt((double)D);
                        if (s[j] > mx) mx = s[j];
                    }
                    for (int j = start[t]; j <= t; j++) sum += exp(s[j] - mx);
                    for (int d = 0; d < D; d++) {
                        double o = 0;
                        for (int j = start[t]; j <= t; j++)
                            o += exp(s[j] - mx) / sum * v[j * Hkv * D + kh * D + d];
                        atts[t * H * D + hh * D + d] = o;
                    }
                }
            for (int t = 0; t < TT; t++) {
                ref_linear(tmp, atts + t * H * D,
                           P(f, "model.layers.%d.self_attn.o_proj.weight", l),
                           P(f, "model.layers.%d.self_attn.o_proj.bias", l), C, H * D);
                for (int i = 0; i < C; i++) x[t * C + i] += tmp[i];
                ref_norm(c, h, x + t * C,
                         P(f, "model.layers.%d.post_attention_layernorm.weight", l),
                         P(f, "model.layers.%d.post_attention_layernorm.bias", l), C);
                ref_linear(u, h, P(f, "model.layers.%d.mlp.up_proj.weight", l),
                           P(f, "model.layers.%d.mlp.up_proj.bias", l), F, C);
                if (llama) {
                    ref_linear(g, h, P(f, "model.layers.%d.mlp.gate_proj.weight", l), NULL, F, C);
                    for (int i = 0; i < F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
                } else {
                    for (int i = 0; i < F; i++)
                        g[i] = 0.5 * u[i] *
                               (1 + tanh(sqrt(2 / M_PI) * (u[i] + 0.044715 * u[i] * u[i] * u[i])));
                }
                ref_linear(tmp, g, P(f, "model.layers.%d.mlp.down_proj.weight", l),
                           P(f, "model.layers.%d.mlp.down_proj.bias", l), C, F);
                for (int i = 0; i < C; i++) x[t * C + i] += tmp[i];
            }
        }
        const float *lm = P(f, "lm_head.weight", 0);
        if (!lm) lm = wte;
        for (int t = 0; t < TT; t++) {
            int y = tgt[b * TT + t];
            if (y < 0) continue;
            ref_norm(c, h, x + t * C, P(f, "model.norm.weight", 0), P(f, "model.norm.bias", 0), C);
            ref_linear(tmp, h, lm, NULL, Vp, C);
            double mx = -1e300, sum = 0;
            for (int i = 0; i < V; i++) mx = tmp[i] > mx ? tmp[i] : mx;
            for (int i = 0; i < V; i++) sum += exp(tmp[i] - mx);
            total += -(tmp[y] - mx - log(sum));
            count++;
        }
    }
    free(x), free(h), free(q), free(k), free(v), free(att), free(tmp), free(g), free(u), free(atts);
    return total / count;
}

static double ref_loss(fixture *f, const int32_t *in, const int32_t *tgt) {
    return ref_loss_docs(f, in, tgt, NULL);
}

/* The micro-batch record of in and tgt (docs: document starts, or NULL): positions 0..TT-1 of
 * each sequence, counted from each document's start under data.reset_positions. */
static const ust_batch *batch_of(const fixture *f, const int32_t *in, const int32_t *tgt,
                                 const int32_t *docs) {
    static int32_t pos[TB * TT], mtp[2 * CFG_MAX_MTP * TB * TT];
    static ust_batch b;
    for (int i = 0; i < TB * TT; i++)
        pos[i] = i % TT - (docs && f->cfg.data.reset_positions ? docs[i] : 0);
    b = (ust_batch){.tokens = in, .targets = tgt, .positions = pos, .doc_starts = docs};
    int D = f->cfg.model.mtp.depth, n = D * TB * TT, V = f->cfg.model.vocab_size;
    for (int i = 0; i < n; i++) { /* model.mtp: its shifted inputs and targets, some ignored */
        mtp[i] = (int32_t)(rng_u64(3, 3, i) % V);
        mtp[n + i] = i % 5 == 4 ? -1 : (int32_t)(rng_u64(3, 4, i) % V);
    }
    if (D) b.mtp_tokens = mtp, b.mtp_targets = mtp + n;
    return &b;
}

/* ------------------------------------------------------------------ tests */

static void check_forward_matches_reference(ust_arch arch) {
    fixture f;
    CHECK(fixture_make(&f, arch, RECOMPUTE_NONE) == 0, "model_create failed");
    int32_t in[TB * TT], tgt[TB * TT];
    tokens(in, tgt, f.cfg.model.vocab_size);
    int64_t n;
    double got = model_forward(f.m, batch_of(&f, in, tgt, NULL), 0, &n) / n,
           want = ref_loss(&f, in, tgt);
    fixture_free(&f);
    CHECK(n == TB * TT - 1, "counted %lld targets", (long long)n);
    /* fp32 model vs fp64 reference over a 2-layer net: agreement to ~1e-6 relative */
    CHECK_CLOSE(got, want, 1e-5, 1e-5, "mean loss vs fp64 reference");
}

static void test_gpt2_forward_matches_fp64_reference(void) {
    check_forward_matches_reference(ARCH_GPT2);
}
static void test_llama_forward_matches_fp64_reference(void) {
    check_forward_matches_reference(ARCH_LLAMA);
}

/* With model.mtp: the main loss plus loss_weight / D x the modules' sums, over the main count. */
static double mean_loss(fixture *f, const int32_t *in, const int32_t *tgt) {
    int64_t n;
    double s = model_forward(f->m, batch_of(f, in, tgt, NULL), 0, &n), mtp[CFG_MAX_MTP];
    int D = model_take_mtp_losses(f->m, mtp);
    for (int k = 0; k < D; k++) s += f->cfg.model.mtp.loss_weight / D * mtp[k];
    return s / n;
}

/* For every tensor: the directional derivative along v = unit(g + noise) from central finite
 * differences equals g . v. The signal is ~|g|/sqrt(2); fp32 loss noise (~1e-7 relative on a
 * loss ~4) over 2*eps = 2e-3 gives ~5e-4 absolute, so tolerance 1e-3 + 1% of the signal. */
static void check_gradients(ust_arch arch) {
    fixture f;
    CHECK(fixture_make(&f, arch, RECOMPUTE_NONE) == 0, "model_create failed");
    int32_t in[TB * TT], tgt[TB * TT];
    tokens(in, tgt, f.cfg.model.vocab_size);
    int64_t n;
    model_zero_grads(f.m);
    model_forward(f.m, batch_of(&f, in, tgt, NULL), 1.0f / (TB * TT - 1), &n);
    model_backward(f.m);
    double taken[CFG_MAX_MTP];
    model_take_mtp_losses(f.m, taken); /* mean_loss's forwards count their own */
    int bad = -1;
    double bad_fd = 0, bad_an = 0;
    for (int i = 0; i < model_num_params(f.m) && bad < 0; i++) {
        model_param *q = model_param_at(f.m, i);
        float *p = model_params(f.m) + q->offset, *g = model_grads(f.m) + q->offset;
        double *v = calloc(q->numel, 8), gn = 0, vn = 0, an = 0;
        for (int64_t j = 0; j < q->numel; j++) gn += (double)g[j] * g[j];
        gn = sqrt(gn);
        for (int64_t j = 0; j < q->numel; j++) {
            v[j] = g[j] / (gn + 1e-30) + rng_normal(5, i, j) / sqrt((double)q->numel);
            vn += v[j] * v[j];
        }
        for (int64_t j = 0; j < q->numel; j++) v[j] /= sqrt(vn), an += v[j] * g[j];
        const double eps = 1e-3;
        float *save = malloc((size_t)q->numel * sizeof(float));
        memcpy(save, p, q->numel * 4);
        for (int64_t j = 0; j < q->numel; j++) p[j] = save[j] + eps * v[j];
        double lp = mean_loss(&f, in, tgt);
        for (int64_t j = 0; j < q->numel; j++) p[j] = save[j] - eps * v[j];
        double lm = mean_loss(&f, in, tgt);
        memcpy(p, save, q->numel * 4);
        double fd = (lp - lm) / (2 * eps);
        if (!(fabs(fd - an) <= 1e-3 + 0.01 * fabs(an))) bad = i, bad_fd = fd, bad_an = an;
        free(save);
        free(v);
    }
    const char *name = bad >= 0 ? model_param_at(f.m, bad)->name : "";
    char copy[128];
    snprintf(copy, sizeof copy, "%s", name);
    fixture_free(&f);
    CHECK(bad < 0, "%s: finite difference %.6g vs analytic %.6g", copy, bad_fd, bad_an);
}

static void test_gpt2_gradients_match_finite_differences(void) { check_gradients(ARCH_GPT2); }
static void test_llama_gradients_match_finite_differences(void) { check_gradients(ARCH_LLAMA); }
/* model.mtp: two modules (embedding and lm_head shared, each module's weights), dense blocks,
 * MLA blocks and MoE blocks. */
static void test_mtp_gradients_match_finite_differences(void) {
    tiny_mtp = 2;
    check_gradients(ARCH_LLAMA);
    tiny_mla = 1;
    check_gradients(ARCH_LLAMA);
    tiny_mla = 0, tiny_moe = 1; /* MoE blocks, as DeepSeek-V3's MTP layer */
    check_gradients(ARCH_LLAMA);
    tiny_moe = tiny_mtp = 0;
}
static void test_mla_gradients_match_finite_differences(void) {
    for (tiny_mla = 1; tiny_mla <= 3; tiny_mla++) check_gradients(ARCH_LLAMA);
    tiny_mla = 0;
}

/* ------------------------------------------------------------------ documents */

/* Sequence 0 packs documents [0,3) and [3,8), sequence 1 [0,5) and [5,8). */
static const int32_t DOCS[TB * TT] = {0, 0, 0, 3, 3, 3, 3, 3, 0, 0, 0, 0, 0, 5, 5, 5};

/* The loss sum and gradients of one forward/backward (targets < 0 ignored). */
static double loss_and_grads(fixture *f, const int32_t *in, const int32_t *tgt, const int32_t *docs,
                             float *grads) {
    model_zero_grads(f->m);
    double s = model_forward(f->m, batch_of(f, in, tgt, docs), 1.0f, NULL);
    model_backward(f->m);
    memcpy(grads, model_grads(f->m), model_numel(f->m) * sizeof(float));
    return s;
}

/* data.doc_mask: the packed batch's loss equals the fp64 reference that keeps attention inside
 * each document, and its loss and gradients equal the sums over each document run alone (at the
 * start of a sequence of its own, the rest of it ignored). llama's RoPE is relative, so its
 * documents agree without resetting positions; gpt2's learned positions need
 * data.reset_positions. Without the mask the packed loss differs (the test can fail). */
static void check_documents(ust_arch arch, int reset) {
    fixture f;
    CHECK(fixture_make_docs(&f, arch, reset) == 0, "model_create failed");
    int32_t in[TB * TT], tgt[TB * TT];
    tokens(in, tgt, f.cfg.model.vocab_size);
    tgt[3] = 7; /* every target counts */
    int64_t n = model_numel(f.m);
    float *packed = malloc(n * 4), *alone = calloc(n, 4), *g = malloc(n * 4);
    double lp = loss_and_grads(&f, in, tgt, DOCS, packed);
    double want = ref_loss_docs(&f, in, tgt, DOCS) * TB * TT;
    CHECK_CLOSE(lp, want, 1e-5, 1e-5, "packed loss vs the fp64 reference with documents");
    double la = 0;
    for (int b = 0; b < TB; b++)
        for (int d0 = 0; d0 < TT;) {
            int d1 = d0;
            while (d1 < TT && DOCS[b * TT + d1] == d0) d1++;
            int32_t in1[TB * TT], tgt1[TB * TT], one[TB * TT] = {0};
            for (int i = 0; i < TB * TT; i++) in1[i] = (int32_t)(i % 5), tgt1[i] = -1;
            for (int t = d0; t < d1; t++)
                in1[t - d0] = in[b * TT + t], tgt1[t - d0] = tgt[b * TT + t];
            la += loss_and_grads(&f, in1, tgt1, one, g);
            for (int64_t i = 0; i < n; i++) alone[i] += g[i];
            d0 = d1;
        }
    CHECK_CLOSE(lp, la, 1e-5, 1e-5, "packed loss vs the documents alone");
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)packed[i] - alone[i]));
        scale = fmax(scale, fabs((double)alone[i]));
    }
    CHECK(worst <= 1e-5 * scale + 1e-6, "gradients: max |packed - sum alone| %g (scale %g)", worst,
          scale);
    int32_t none[TB * TT] = {0};
    double lnone = loss_and_grads(&f, in, tgt, none, g);
    CHECK(fabs(lnone - lp) > 1e-3, "one document per sequence gives the packed loss %g", lp);
    free(packed), free(alone), free(g);
    fixture_free(&f);
}

static void test_llama_packed_documents_equal_each_alone(void) {
    check_documents(ARCH_LLAMA, 0);
    check_documents(ARCH_LLAMA, 1);
}
static void test_gpt2_packed_documents_with_reset_positions_equal_each_alone(void) {
    check_documents(ARCH_GPT2, 1);
}

/* Recomputation reruns the same deterministic ops, so gradients are bit-identical. */
static void check_recompute(ust_arch arch, ust_recompute mode) {
    fixture a, b;
    CHECK(fixture_make(&a, arch, RECOMPUTE_NONE) == 0 && fixture_make(&b, arch, mode) == 0,
          "model_create failed");
    int32_t in[TB * TT], tgt[TB * TT];
    tokens(in, tgt, a.cfg.model.vocab_size);
    double la = 0, lb = 0;
    for (int mb = 0; mb < 2; mb++) { /* two micro-batches: gradients accumulate */
        la += model_forward(a.m, batch_of(&a, in, tgt, NULL), 0.5f, NULL);
        model_backward(a.m);
        lb += model_forward(b.m, batch_of(&b, in, tgt, NULL), 0.5f, NULL);
        model_backward(b.m);
    }
    int same = la == lb && model_numel(a.m) == model_numel(b.m) &&
               memcmp(model_grads(a.m), model_grads(b.m), model_numel(a.m) * 4) == 0;
    size_t acts_a = a.arena.bytes[MEM_ACTS], acts_b = b.arena.bytes[MEM_ACTS];
    fixture_free(&a);
    fixture_free(&b);
    CHECK(same, "gradients differ between recompute none and mode %d", mode);
    CHECK(acts_b < acts_a, "recompute mode %d keeps %zu activation bytes, none keeps %zu", mode,
          acts_b, acts_a);
}

static void test_selective_recompute_gives_identical_gradients(void) {
    check_recompute(ARCH_LLAMA, RECOMPUTE_SELECTIVE);
}
static void test_full_recompute_gives_identical_gradients(void) {
    check_recompute(ARCH_GPT2, RECOMPUTE_FULL);
    check_recompute(ARCH_LLAMA, RECOMPUTE_FULL);
}

static void test_mla_full_recompute_gives_identical_gradients(void) {
    tiny_mla = 1;
    check_recompute(ARCH_LLAMA, RECOMPUTE_FULL);
    tiny_mla = 0;
}

/* ---------------------------------------------------------------- the op profiler */

static int64_t prof_calls(const ust_ops *o, const char *op) {
    ops_prof_entry e[64];
    int n = ops_prof_entries(o, e, 64);
    for (int i = 0; i < n; i++)
        if (strcmp(e[i].op, op) == 0) return e[i].calls;
    return 0;
}

/* The op profiler forwards every call unchanged (bit-identical loss and gradients through it),
 * counts exactly the ops the model makes while enabled (per layer: one attention forward and
 * backward, two norms, plus the final norm; gpt2's MLP up-projection fused with its GELU), and
 * nothing while disabled. */
static void check_profiler(ust_arch arch) {
    fixture a, b;
    CHECK(fixture_make(&a, arch, RECOMPUTE_NONE) == 0 &&
              (b.want_docs = 0, fixture_make_on(&b, arch, RECOMPUTE_NONE, 1)) == 0,
          "model_create failed");
    int32_t in[TB * TT], tgt[TB * TT];
    tokens(in, tgt, a.cfg.model.vocab_size);
    ops_prof_enable(b.ops, 1);
    double la = model_forward(a.m, batch_of(&a, in, tgt, NULL), 1.0f, NULL),
           lb = model_forward(b.m, batch_of(&b, in, tgt, NULL), 1.0f, NULL);
    model_backward(a.m);
    model_backward(b.m);
    int same = la == lb && memcmp(model_grads(a.m), model_grads(b.m), model_numel(a.m) * 4) == 0;
    const int L = a.cfg.model.n_layer;
    const char *norm = arch == ARCH_GPT2 ? "layernorm_fwd" : "rmsnorm_fwd";
    int64_t att = prof_calls(b.ops, "attention_fwd"), attb = prof_calls(b.ops, "attention_bwd");
    int64_t norms = prof_calls(b.ops, norm), fused = prof_calls(b.ops, "linear_gelu_fwd");
    ops_prof_enable(b.ops, 0);
    model_forward(b.m, batch_of(&b, in, tgt, NULL), 1.0f, NULL);
    model_backward(b.m);
    int64_t after = prof_calls(b.ops, "attention_fwd");
    ops_prof_entry e[64];
    int n = ops_prof_entries(b.ops, e, 64), sorted = 1;
    for (int i = 1; i < n; i++) sorted &= e[i].seconds <= e[i - 1].seconds;
    fixture_free(&a);
    fixture_free(&b);
    CHECK(same, "loss or gradients differ through the profiler (%.9g vs %.9g)", la, lb);
    CHECK(att == L && attb == L && norms == 2 * L + 1, "counted %lld/%lld attention, %lld %s",
          (long long)att, (long long)attb, (long long)norms, norm);
    CHECK(fused == (arch == ARCH_GPT2 ? L : 0), "counted %lld linear_gelu_fwd", (long long)fused);
    CHECK(after == att, "disabled, the profiler still counted (%lld)", (long long)after);
    CHECK(n > 5 && sorted, "%d entries, sorted %d", n, sorted);
}

static void test_op_profiler_is_transparent_and_counts_the_model_ops(void) {
    check_profiler(ARCH_GPT2);
    check_profiler(ARCH_LLAMA);
}

static void test_init_is_keyed_by_seed_name_and_index(void) {
    fixture f;
    CHECK(fixture_make(&f, ARCH_LLAMA, RECOMPUTE_NONE) == 0, "model_create failed");
    model_init_params(f.m, 1234);
    int i = model_find_param(f.m, "model.layers.1.self_attn.k_proj.weight");
    model_param *q = model_param_at(f.m, i);
    float got = model_params(f.m)[q->offset + 37];
    float want = 0.02f * rng_normal(1234, rng_hash_str(q->name), 37);
    int ln = model_find_param(f.m, "model.layers.0.input_layernorm.weight");
    float one = model_params(f.m)[model_param_at(f.m, ln)->offset + 5];
    int wo = model_find_param(f.m, "model.layers.0.self_attn.o_proj.weight");
    float o = model_params(f.m)[model_param_at(f.m, wo)->offset];
    float o_want =
        0.02f / sqrtf(4.0f) * rng_normal(1234, rng_hash_str(model_param_at(f.m, wo)->name), 0);
    fixture_free(&f);
    CHECK(i >= 0 && got == want, "k_proj[37] = %g, expected %g", got, want);
    CHECK(one == 1.0f, "norm weight initialized to %g", one);
    CHECK(o == o_want, "o_proj uses the scaled residual init: %g vs %g", o, o_want);
}

static void test_parameter_names_and_shapes_are_canonical(void) {
    fixture f;
    CHECK(fixture_make(&f, ARCH_LLAMA, RECOMPUTE_NONE) == 0, "model_create failed");
    int k = model_find_param(f.m, "model.layers.0.self_attn.k_proj.weight");
    int d = model_find_param(f.m, "model.layers.1.mlp.down_proj.weight");
    int lm = model_find_param(f.m, "lm_head.weight");
    int64_t k0 = model_param_at(f.m, k)->whole.shape[0],
            k1 = model_param_at(f.m, k)->whole.shape[1];
    int64_t d0 = model_param_at(f.m, d)->whole.shape[0],
            d1 = model_param_at(f.m, d)->whole.shape[1];
    int64_t v0 = lm >= 0 ? model_param_at(f.m, lm)->whole.shape[0] : -1;
    int n = model_num_params(f.m);
    fixture_free(&f);
    CHECK(k >= 0 && k0 == 16 && k1 == 32, "k_proj shape [%lld, %lld], expected [16, 32] (GQA)",
          (long long)k0, (long long)k1);
    CHECK(d >= 0 && d0 == 32 && d1 == 48, "down_proj shape [%lld, %lld]", (long long)d0,
          (long long)d1);
    CHECK(v0 == 64, "lm_head rows %lld, expected padded vocab 64", (long long)v0);
    CHECK(n == 1 + 2 * 9 + 1 + 1, "llama has %d tensors", n);
}

/* Writes a random llm.c GPT-2 checkpoint (version 3 layout) for the tiny gpt2 config. */
static int write_llmc(const char *path, const ust_config *c) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int32_t h[256] = {20240326,
                      3,
                      c->model.max_seq_len,
                      c->model.vocab_size,
                      c->model.n_layer,
                      c->model.n_head,
                      c->model.d_model,
                      cfg_vocab_padded(c)};
    fwrite(h, sizeof h, 1, f);
    int64_t C = c->model.d_model, L = c->model.n_layer, Vp = cfg_vocab_padded(c);
    int64_t n =
        Vp * C + c->model.max_seq_len * C +
        L * (2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C) +
        2 * C;
    for (int64_t i = 0; i < n; i++) {
        float x = 0.05f * rng_normal(11, 0, i);
        fwrite(&x, 4, 1, f);
    }
    fclose(f);
    return 0;
}

static void test_llmc_import_gives_the_reference_loss(void) {
    fixture f;
    CHECK(fixture_make(&f, ARCH_GPT2, RECOMPUTE_NONE) == 0, "model_create failed");
    const char *path = "/tmp/ustrain-test-llmc.bin";
    ust_err e;
    CHECK(write_llmc(path, &f.cfg) == 0, "cannot write %s", path);
    int rc = model_load_llmc(f.m, path, NULL, NULL, &e);
    int32_t in[TB * TT], tgt[TB * TT];
    tokens(in, tgt, f.cfg.model.vocab_size);
    double got = rc ? 0 : mean_loss(&f, in, tgt), want = rc ? 0 : ref_loss(&f, in, tgt);
    /* spot check the layout: the first q_proj row comes right after the layer norms */
    int q = model_find_param(f.m, "model.layers.0.self_attn.q_proj.weight");
    int64_t C = 32, Vp = 64, off = Vp * C + 16 * C + 2 * 2 * C; /* wte, wpe, ln1 w+b of 2 layers */
    float expect_q0 = 0.05f * rng_normal(11, 0, off),
          got_q0 = model_params(f.m)[model_param_at(f.m, q)->offset];
    fixture_free(&f);
    remove(path);
    CHECK(rc == 0, "model_load_llmc: %s", e.msg);
    CHECK(got_q0 == expect_q0, "q_proj[0] = %g, expected %g", got_q0, expect_q0);
    CHECK_CLOSE(got, want, 1e-5, 1e-5, "loss after import vs fp64 reference");
}

static void test_llmc_import_rejects_a_mismatched_shape(void) {
    fixture f;
    CHECK(fixture_make(&f, ARCH_GPT2, RECOMPUTE_NONE) == 0, "model_create failed");
    ust_config other = f.cfg;
    other.model.n_layer = 3;
    const char *path = "/tmp/ustrain-test-llmc2.bin";
    write_llmc(path, &other);
    ust_err e;
    int rc = model_load_llmc(f.m, path, NULL, NULL, &e);
    fixture_free(&f);
    remove(path);
    CHECK(rc != 0 && strstr(e.msg, "n_layer = 3"), "expected an n_layer mismatch, got: %s",
          rc ? e.msg : "success");
}

int main(void) {
    RUN_TEST(test_gpt2_forward_matches_fp64_reference);
    RUN_TEST(test_llama_forward_matches_fp64_reference);
    RUN_TEST(test_llama_packed_documents_equal_each_alone);
    RUN_TEST(test_gpt2_packed_documents_with_reset_positions_equal_each_alone);
    RUN_TEST(test_gpt2_gradients_match_finite_differences);
    RUN_TEST(test_llama_gradients_match_finite_differences);
    RUN_TEST(test_selective_recompute_gives_identical_gradients);
    RUN_TEST(test_full_recompute_gives_identical_gradients);
    RUN_TEST(test_mla_gradients_match_finite_differences);
    RUN_TEST(test_mtp_gradients_match_finite_differences);
    RUN_TEST(test_mla_full_recompute_gives_identical_gradients);
    RUN_TEST(test_op_profiler_is_transparent_and_counts_the_model_ops);
    RUN_TEST(test_init_is_keyed_by_seed_name_and_index);
    RUN_TEST(test_parameter_names_and_shapes_are_canonical);
    RUN_TEST(test_llmc_import_gives_the_reference_loss);
    RUN_TEST(test_llmc_import_rejects_a_mismatched_shape);
    return TEST_SUMMARY();
}
