/* infer.c: forward-only transformer with a KV cache (infer.h), the same math as core/model/model.c
 * and core/model/moe.c on one sequence. Shapes: n new tokens (n <= chunk), C = d_model, H/Hkv heads
 * of D, F = d_ff, Fe = d_ff_expert, E experts, k = top_k, V real vocabulary, Vp padded, S =
 * max_seq_len.
 */
#include "infer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "moe.h"

/* One layer's weights (device) and its cache. A dense MLP is held as one moe_expert (gate, up,
 * up_b, down, down_b), so dense MLPs and experts share one forward. */
typedef struct {
    float *ln1_w, *ln1_b, *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo, *ln2_w, *ln2_b;
    float *qn_w, *kn_w; /* model.qk_norm: the per-head q and k norms (D each) */
    float *pn_w[2];     /* model.sandwich_norm: the norms after attention and after the MLP */
    /* model.mla (model_mla.h): q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa,
     * kv_a_layernorm, kv_b_proj; kc then caches the normed latent c_kv (S, Rkv) and vc the
     * shared rope key after RoPE (S, R): the latent, not the per-head K/V */
    struct {
        float *wqa, *qa_norm, *wqb, *wkva, *kva_norm, *wkvb;
    } mla;
    moe_expert mlp;  /* dense layers */
    moe_weights moe; /* MoE layers: router [E, C], experts[E], shared */
    int is_moe;
    int window;   /* model.sliding_window (0: full attention) */
    int wslot;    /* its index among the model's window sizes (cfg_window_slot) */
    act *kc, *vc; /* (cap, Hkv, D) each: position t's keys (after RoPE) and values at row t, or
                   * in a windowed layer's ring (cap < S) at row t % cap */
    int cap;
    int32_t *kpos, *kpos_h; /* the ring's rows' positions (device, host); NULL: no ring */
} infer_layer;

/* The model's dimensions (from the config; chunk: tokens per forward call, S: the cache's). */
typedef struct {
    int llama, L, C, H, Hkv, D, F, V, Vp, S, chunk;
    int max_n; /* tokens per infer_forward (the caller's chunk; runs in pieces of chunk) */
    int qk_norm;
    int qk_whole, post_norm; /* model.qk_norm_whole, model.post_norm (OLMo 2) */
    int sandwich, geglu;     /* model.sandwich_norm, model.hidden_act gelu_tanh (Gemma 3) */
    float embed_scale;       /* model.embed_scale: sqrt(C) (0: none) */
    int local_rope;          /* model.rope_local_theta: windowed layers rotate by rope_local */
    ust_rope rope_local;
    float attn_softcap, final_softcap; /* model.attn_softcap, model.final_softcap (0: none) */
    int E, k, Fe, shared;
    int Fs;              /* the shared expert's width */
    ops_moe_route route; /* the router's options (moe.h) */
    float eps;
    ust_rope rope;
} infer_shape;

/* The weights on the device: the whole model, read once per forward. */
typedef struct {
    float *wte, *wpe, *lnf_w, *lnf_b, *lm; /* lm == wte when tied */
    infer_layer *lw;
    float **owned; /* every device tensor, for destroy */
    int nowned;
} infer_weights;

/* Activations for `chunk` tokens. */
typedef struct {
    act *x, *ln, *q, *att, *tmp, *tmp2; /* (n,C) (n,C) (n,H*D) (n,H*D) (n,C) (n,C) */
    act *knew, *vnew;                   /* (n,Hkv*D) each: a ring's new keys and values */
    act *h1, *h2, *h;                   /* (n, max(F, Fe)) each: gate, up, activation */
    act *logits;                        /* (V) */
    float *mean, *rstd, *lse;           /* (n) (n) (H, n) */
    int32_t *tok, *pos;                 /* device (chunk), (S): pos[t] = t */
    int32_t *wstart[CFG_MAX_WINDOWS];   /* (chunk) device: each new token's first key, for */
    int32_t *wstart_h;                  /* each window size (cfg_windows); host scratch */
    /* model.mla: the cache re-expanded (S, H*W) -> k, v (S, H*D); the q latent (n, Rq); q's
     * rope parts (n*H, R); the attention output without v's padding (n, H*Dv) */
    act *kvb, *k, *v, *qa, *qr, *attv;
} infer_acts;

/* MoE routing: router logits, probabilities, choices, gates; expert-ordered rows. */
typedef struct {
    act *rlogits, *xe, *eout;                        /* (n,E) (n*k,C) (n*k,C) */
    float *probs, *gate;                             /* (n,E) (n,k) */
    int32_t *topk, *rowpos, *assign;                 /* device (n*k) each */
    int32_t *topk_h, *rowpos_h, *assign_h, *count_h; /* host (n*k) x3, (E) */
} infer_route;

struct infer_model {
    const ust_config *cfg;
    const ust_ops *ops;
    int len; /* positions in the cache */
    int64_t nparams, bytes_per_token;
    infer_shape shape;
    infer_weights w;
    infer_acts a;
    infer_route r;
};

/* ------------------------------------------------------------------ the tensor list */

/* Called for each tensor in checkpoint order; dst is where its device pointer goes (NULL when
 * only listing), expert its global expert index (-1: not an expert's). */
typedef void (*tensor_fn)(void *ctx, const ckpt_tensor *t, float **dst, int expert);

static ckpt_tensor tensor_of(const char *name, int64_t rows, int64_t cols, int decay) {
    ckpt_tensor t = {0};
    snprintf(t.name, sizeof t.name, "%s", name);
    /* as params.c's add_param: matrices 2-D, vectors (norms, biases) 1-D */
    t.ndim = rows > 1 || decay ? 2 : 1;
    t.shape[0] = t.ndim == 2 ? rows : rows * cols;
    t.shape[1] = t.ndim == 2 ? cols : 0;
    return t;
}

typedef struct {
    tensor_fn fn;
    void *ctx;
} moe_sink;

static void moe_tensor(void *ctx, const moe_param *q) {
    const moe_sink *s = ctx;
    ckpt_tensor t = tensor_of(q->name, q->rows, q->cols, q->decay);
    s->fn(s->ctx, &t, q->p, q->expert);
}

/* One tensor at the layer's prefix; dst NULL when listing. */
static void emit(tensor_fn fn, void *ctx, int l, const char *suffix, int64_t rows, int64_t cols,
                 int decay, float **dst) {
    char n[CKPT_NAME_MAX];
    snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);
    ckpt_tensor t = tensor_of(n, rows, cols, decay);
    fn(ctx, &t, dst, -1);
}

/* model.mla's attention tensors in params.c's order (add_mla_params). */
static void enum_mla(const ust_config *cfg, int l, infer_layer *w, tensor_fn fn, void *ctx) {
    const __typeof__(cfg->model.mla) *a = &cfg->model.mla;
    int64_t C = cfg->model.d_model, H = cfg->model.n_head, QK = H * cfg_head_dim(cfg);
#define E_(suffix, rows, cols, decay, field)                                                       \
    emit(fn, ctx, l, suffix, rows, cols, decay, w ? &w->field : NULL)
    if (a->q_lora_rank) {
        E_("self_attn.q_a_proj.weight", a->q_lora_rank, C, 1, mla.wqa);
        E_("self_attn.q_a_layernorm.weight", 1, a->q_lora_rank, 0, mla.qa_norm);
        E_("self_attn.q_b_proj.weight", QK, a->q_lora_rank, 1, mla.wqb);
    } else {
        E_("self_attn.q_proj.weight", QK, C, 1, wq);
    }
    E_("self_attn.kv_a_proj_with_mqa.weight", a->kv_lora_rank + a->qk_rope_head_dim, C, 1,
       mla.wkva);
    E_("self_attn.kv_a_layernorm.weight", 1, a->kv_lora_rank, 0, mla.kva_norm);
    E_("self_attn.kv_b_proj.weight", H * (a->qk_nope_head_dim + a->v_head_dim), a->kv_lora_rank, 1,
       mla.wkvb);
    E_("self_attn.o_proj.weight", C, H * a->v_head_dim, 1, wo);
#undef E_
}

/* Layer l's tensors in params.c's order (add_layer_params). w NULL: listing only. */
static void enum_layer(const ust_config *cfg, int l, infer_layer *w, tensor_fn fn, void *ctx) {
    int64_t C = cfg->model.d_model, D = cfg_head_dim(cfg), HD = cfg->model.n_head * D,
            KV = cfg->model.n_kv_head * D, F = cfg->model.d_ff;
    int gpt2 = cfg->model.arch == ARCH_GPT2, qkvb = gpt2 || cfg->model.qkv_bias;
#define E_(suffix, rows, cols, decay, field)                                                       \
    emit(fn, ctx, l, suffix, rows, cols, decay, w ? &w->field : NULL)
    int post = !gpt2 && cfg->model.post_norm, whole = cfg->model.qk_norm_whole;
    int sw = !gpt2 && cfg->model.gemma.sandwich_norm; /* Gemma 3: pre and post norms */
    E_(post ? "post_attention_layernorm.weight" : "input_layernorm.weight", 1, C, 0, ln1_w);
    if (gpt2) E_("input_layernorm.bias", 1, C, 0, ln1_b);
    if (cfg->model.mla.enabled) {
        enum_mla(cfg, l, w, fn, ctx);
        goto mlp;
    }
    E_("self_attn.q_proj.weight", HD, C, 1, wq);
    if (qkvb) E_("self_attn.q_proj.bias", 1, HD, 0, bq);
    E_("self_attn.k_proj.weight", KV, C, 1, wk);
    if (qkvb) E_("self_attn.k_proj.bias", 1, KV, 0, bk);
    E_("self_attn.v_proj.weight", KV, C, 1, wv);
    if (qkvb) E_("self_attn.v_proj.bias", 1, KV, 0, bv);
    E_("self_attn.o_proj.weight", C, HD, 1, wo);
    if (gpt2) E_("self_attn.o_proj.bias", 1, C, 0, bo);
    if (!gpt2 && cfg->model.qk_norm) E_("self_attn.q_norm.weight", 1, whole ? HD : D, 0, qn_w);
    if (!gpt2 && cfg->model.qk_norm) E_("self_attn.k_norm.weight", 1, whole ? KV : D, 0, kn_w);
    if (sw) E_("post_attention_layernorm.weight", 1, C, 0, pn_w[0]);
mlp:
    E_(post ? "post_feedforward_layernorm.weight"
       : sw ? "pre_feedforward_layernorm.weight"
            : "post_attention_layernorm.weight",
       1, C, 0, ln2_w);
    if (sw) E_("post_feedforward_layernorm.weight", 1, C, 0, pn_w[1]);
    if (gpt2) E_("post_attention_layernorm.bias", 1, C, 0, ln2_b);
    if (moe_layer_is_moe(cfg, l)) {
        moe_sink s = {fn, ctx};
        moe_enum_params(cfg, l, 1, 0, w ? &w->moe : NULL, NULL, moe_tensor, &s);
        return;
    }
    if (!gpt2) E_("mlp.gate_proj.weight", F, C, 1, mlp.gate);
    E_("mlp.up_proj.weight", F, C, 1, mlp.up);
    if (gpt2) E_("mlp.up_proj.bias", 1, F, 0, mlp.up_b);
    E_("mlp.down_proj.weight", C, F, 1, mlp.down);
    if (gpt2) E_("mlp.down_proj.bias", 1, C, 0, mlp.down_b);
#undef E_
}

/* The whole model in checkpoint order (params.c's build_param_table of one chunk). m NULL:
 * listing only. */
static void enum_tensors(const ust_config *cfg, infer_model *m, tensor_fn fn, void *ctx) {
    int64_t C = cfg->model.d_model, Vp = cfg_vocab_padded(cfg);
    ckpt_tensor t = tensor_of("model.embed_tokens.weight", Vp, C, 1);
    fn(ctx, &t, m ? &m->w.wte : NULL, -1);
    if (cfg->model.arch == ARCH_GPT2) {
        t = tensor_of("model.embed_positions.weight", cfg->model.max_seq_len, C, 1);
        fn(ctx, &t, m ? &m->w.wpe : NULL, -1);
    }
    for (int l = 0; l < cfg->model.n_layer; l++)
        enum_layer(cfg, l, m ? &m->w.lw[l] : NULL, fn, ctx);
    t = tensor_of("model.norm.weight", 1, C, 0);
    fn(ctx, &t, m ? &m->w.lnf_w : NULL, -1);
    if (cfg->model.arch == ARCH_GPT2) {
        t = tensor_of("model.norm.bias", 1, C, 0);
        fn(ctx, &t, m ? &m->w.lnf_b : NULL, -1);
    }
    if (!cfg_tied(cfg)) {
        t = tensor_of("lm_head.weight", Vp, C, 1);
        fn(ctx, &t, m ? &m->w.lm : NULL, -1);
    }
}

typedef struct {
    ckpt_tensor *t;
    int n, cap;
} tensor_list;

static void list_tensor(void *ctx, const ckpt_tensor *t, float **dst, int expert) {
    tensor_list *l = ctx;
    (void)dst, (void)expert;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->t = realloc(l->t, (size_t)l->cap * sizeof *l->t);
        UST_ASSERT(l->t, "out of host memory (%d tensors)", l->cap);
    }
    l->t[l->n++] = *t;
}

ckpt_tensor *infer_tensors(const ust_config *cfg, int *n) {
    tensor_list l = {0};
    enum_tensors(cfg, NULL, list_tensor, &l);
    *n = l.n;
    return l.t;
}

/* ------------------------------------------------------------------ loading */

static int64_t numel(const ckpt_tensor *t) {
    return t->ndim == 2 ? t->shape[0] * t->shape[1] : t->shape[0];
}

typedef struct {
    infer_model *m;
    infer_read_fn read;
    void *read_ctx;
    float *host;
    int64_t host_cap;
    int failed;
    ust_err *e;
} loader;

/* Bytes of t a decoding step reads: one row of the lookup tables (all V real rows of a tied
 * table, which is the head too), V real rows of the head, top_k of E experts. */
static double token_bytes(const infer_model *m, const ckpt_tensor *t, int expert) {
    double b = 4.0 * (double)numel(t);
    if (!strcmp(t->name, "model.embed_tokens.weight"))
        return 4.0 * m->shape.C * (cfg_tied(m->cfg) ? m->shape.V + 1 : 1);
    if (!strcmp(t->name, "model.embed_positions.weight")) return 4.0 * m->shape.C;
    if (!strcmp(t->name, "lm_head.weight")) return 4.0 * m->shape.C * m->shape.V;
    return expert >= 0 ? b * m->shape.k / m->shape.E : b;
}

static void load_tensor(void *ctx, const ckpt_tensor *t, float **dst, int expert) {
    loader *ld = ctx;
    infer_model *m = ld->m;
    if (ld->failed) return;
    int64_t n = numel(t);
    if (n > ld->host_cap) {
        free(ld->host);
        ld->host_cap = n;
        ld->host = malloc((size_t)n * sizeof(float));
        UST_ASSERT(ld->host, "out of host memory (%lld floats for %s)", (long long)n, t->name);
    }
    if (ld->read(ld->read_ctx, t, ld->host, ld->e)) {
        ld->failed = 1;
        return;
    }
    /* model.norm_offset (Gemma): every norm's weight held as 1 + w, in fp32 as transformers'
     * 1.0 + weight.float(), so the norms below are plain RMSNorms */
    if (m->cfg->model.gemma.norm_offset && strstr(t->name, "norm.weight"))
        for (int64_t i = 0; i < n; i++) ld->host[i] = 1.0f + ld->host[i];
    const ust_ops *o = m->ops;
    *dst = o->alloc(o, (size_t)n * sizeof(float));
    o->to_device(o, *dst, ld->host, (size_t)n * sizeof(float));
    m->w.owned[m->w.nowned++] = *dst;
    m->nparams += n;
    m->bytes_per_token += (int64_t)token_bytes(m, t, expert);
}

/* ------------------------------------------------------------------ setup */

static void dims(infer_model *m, const ust_config *cfg) {
    m->shape.llama = cfg->model.arch == ARCH_LLAMA;
    m->shape.L = cfg->model.n_layer, m->shape.C = cfg->model.d_model,
    m->shape.D = cfg_head_dim(cfg);
    m->shape.H = cfg->model.n_head, m->shape.Hkv = cfg->model.n_kv_head,
    m->shape.F = cfg->model.d_ff;
    m->shape.V = cfg->model.vocab_size, m->shape.Vp = cfg_vocab_padded(cfg),
    m->shape.S = cfg->model.max_seq_len;
    m->shape.eps =
        m->shape.llama ? (float)cfg->model.norm_eps : 1e-5f; /* as model.c's norm_forward */
    m->shape.rope = ops_rope(cfg);
    m->shape.qk_norm = m->shape.llama && cfg->model.qk_norm;
    m->shape.qk_whole = m->shape.qk_norm && cfg->model.qk_norm_whole;
    m->shape.post_norm = m->shape.llama && cfg->model.post_norm;
    const __typeof__(cfg->model.gemma) *gm = &cfg->model.gemma; /* as params.c's params_dims */
    m->shape.sandwich = m->shape.llama && gm->sandwich_norm;
    m->shape.geglu = m->shape.llama && gm->hidden_act == HACT_GELU_TANH;
    m->shape.embed_scale = gm->embed_scale ? (float)sqrt((double)m->shape.C) : 0;
    m->shape.local_rope = m->shape.llama && gm->rope_local_theta > 0;
    m->shape.rope_local = ops_rope_local(cfg);
    m->shape.attn_softcap = (float)gm->attn_softcap,
    m->shape.final_softcap = (float)gm->final_softcap;
    m->shape.E = cfg->model.moe.num_experts, m->shape.k = cfg->model.moe.top_k;
    m->shape.Fe = cfg->model.moe.d_ff_expert, m->shape.shared = cfg->model.moe.shared_expert;
    const __typeof__(cfg->model.moe) *mc = &cfg->model.moe;
    m->shape.Fs = mc->shared_d_ff > 0 ? mc->shared_d_ff : mc->d_ff_expert;
    m->shape.route = moe_route_of(cfg);
}

static void alloc_acts(infer_model *m) {
    const ust_ops *o = m->ops;
    int64_t n = m->shape.chunk, C = m->shape.C, HD = (int64_t)m->shape.H * m->shape.D;
    int64_t F = m->shape.E > 0 && m->shape.Fe > m->shape.F ? m->shape.Fe : m->shape.F;
    if (m->shape.E > 0 && m->shape.shared && m->shape.Fs > F) F = m->shape.Fs;
#define A_(count) o->alloc(o, act_bytes(o, (count)))
#define I_(count) o->alloc(o, (size_t)(count) * sizeof(int32_t))
    m->a.x = A_(n * C), m->a.ln = A_(n * C), m->a.tmp = A_(n * C), m->a.tmp2 = A_(n * C);
    m->a.q = A_(n * HD), m->a.att = A_(n * HD);
    m->a.h1 = A_(n * F), m->a.h2 = A_(n * F), m->a.h = A_(n * F);
    m->a.logits = A_(m->shape.V);
    m->a.mean = o->alloc(o, n * sizeof(float)), m->a.rstd = o->alloc(o, n * sizeof(float));
    m->a.lse = o->alloc(o, n * m->shape.H * sizeof(float));
    m->a.tok = I_(n), m->a.pos = I_(m->shape.S);
    int W[CFG_MAX_WINDOWS], nw = cfg_windows(m->cfg, W);
    for (int k = 0; k < nw; k++) m->a.wstart[k] = I_(n);
    m->a.wstart_h = malloc((size_t)n * sizeof(int32_t));
    int32_t *pos = malloc((size_t)m->shape.S * sizeof(int32_t));
    UST_ASSERT(pos, "out of host memory");
    for (int t = 0; t < m->shape.S; t++) pos[t] = t;
    o->to_device(o, m->a.pos, pos, (size_t)m->shape.S * sizeof(int32_t));
    free(pos);
    int64_t KV = (int64_t)m->shape.Hkv * m->shape.D;
    const __typeof__(m->cfg->model.mla) *mla = &m->cfg->model.mla;
    if (mla->enabled) { /* the latent cache (no ring: windows refused), the scratch to expand it */
        int64_t S = m->shape.S, H = m->shape.H;
        for (int l = 0; l < m->shape.L; l++)
            m->w.lw[l].cap = (int)S, m->w.lw[l].kc = A_(S * mla->kv_lora_rank),
            m->w.lw[l].vc = A_(S * mla->qk_rope_head_dim);
        m->a.kvb = A_(S * H * (mla->qk_nope_head_dim + mla->v_head_dim));
        m->a.k = A_(S * KV), m->a.v = A_(S * KV);
        m->a.qa = A_(n * (mla->q_lora_rank ? mla->q_lora_rank : 1));
        m->a.qr = A_(n * H * mla->qk_rope_head_dim), m->a.attv = A_(n * H * mla->v_head_dim);
    } else {
        m->a.knew = A_(n * KV), m->a.vnew = A_(n * KV);
    }
    for (int l = 0; !mla->enabled && l < m->shape.L;
         l++) { /* a window W: W - 1 keys before a piece */
        infer_layer *w = &m->w.lw[l];
        int ring = w->window ? w->window + (int)n - 1 : m->shape.S;
        w->cap = ring < m->shape.S ? ring : m->shape.S;
        w->kc = A_(w->cap * KV), w->vc = A_(w->cap * KV);
        if (w->cap == m->shape.S) continue;
        w->kpos = I_(w->cap), w->kpos_h = calloc((size_t)w->cap, sizeof(int32_t));
        UST_ASSERT(w->kpos_h, "out of host memory");
    }
    if (m->shape.E > 0) {
        int64_t A = n * m->shape.k;
        m->r.rlogits = A_(n * m->shape.E), m->r.xe = A_(A * C), m->r.eout = A_(A * C);
        m->r.probs = o->alloc(o, n * m->shape.E * sizeof(float));
        m->r.gate = o->alloc(o, A * sizeof(float));
        m->r.topk = I_(A), m->r.rowpos = I_(A), m->r.assign = I_(A);
        m->r.topk_h = calloc(A, 4), m->r.rowpos_h = calloc(A, 4), m->r.assign_h = calloc(A, 4);
        m->r.count_h = calloc(m->shape.E, 4);
        UST_ASSERT(m->r.topk_h && m->r.rowpos_h && m->r.assign_h && m->r.count_h,
                   "out of host memory");
    }
#undef A_
#undef I_
}

int infer_create(infer_model **out, const ust_config *cfg, const ust_ops *ops, int chunk,
                 infer_read_fn read, void *read_ctx, ust_err *e) {
    UST_ASSERT(ops->act_size == 4, "generation runs fp32 activations (act_size %d)", ops->act_size);
    UST_ASSERT(chunk >= 1, "chunk %d", chunk);
    infer_model *m = calloc(1, sizeof *m);
    UST_ASSERT(m, "out of host memory");
    m->cfg = cfg, m->ops = ops;
    dims(m, cfg);
    m->shape.chunk = m->shape.max_n = chunk < m->shape.S ? chunk : m->shape.S;
    m->w.lw = calloc(m->shape.L, sizeof *m->w.lw);
    UST_ASSERT(m->w.lw, "out of host memory");
    for (int l = 0; l < m->shape.L; l++) { /* pieces of at most a window: rings of 2W - 1 */
        int W = m->w.lw[l].window = cfg_layer_window(cfg, l);
        m->w.lw[l].wslot = cfg_window_slot(cfg, l);
        if (W && W < m->shape.chunk) m->shape.chunk = W;
    }
    for (int l = 0; l < m->shape.L; l++)
        if (moe_layer_is_moe(cfg, l)) {
            infer_layer *w = &m->w.lw[l];
            w->is_moe = 1;
            w->moe.nexperts = m->shape.E, w->moe.first_expert = 0;
            w->moe.experts = calloc(m->shape.E, sizeof *w->moe.experts);
            UST_ASSERT(w->moe.experts, "out of host memory");
        }
    int nt;
    free(infer_tensors(cfg, &nt));
    m->w.owned = calloc(nt, sizeof *m->w.owned);
    UST_ASSERT(m->w.owned, "out of host memory");
    loader ld = {.m = m, .read = read, .read_ctx = read_ctx, .e = e};
    enum_tensors(cfg, m, load_tensor, &ld);
    free(ld.host);
    if (ld.failed) {
        infer_destroy(m);
        return -1;
    }
    if (cfg_tied(cfg)) m->w.lm = m->w.wte;
    alloc_acts(m);
    *out = m;
    return 0;
}

void infer_destroy(infer_model *m) {
    if (!m) return;
    const ust_ops *o = m->ops;
    for (int i = 0; i < m->w.nowned; i++) o->free(o, m->w.owned[i]);
    void *dev[] = {m->a.x,     m->a.ln,   m->a.tmp,  m->a.tmp2,    m->a.q,      m->a.att,
                   m->a.h1,    m->a.h2,   m->a.h,    m->a.logits,  m->a.mean,   m->a.rstd,
                   m->a.lse,   m->a.tok,  m->a.pos,  m->r.rlogits, m->r.xe,     m->r.eout,
                   m->r.probs, m->r.gate, m->r.topk, m->r.rowpos,  m->r.assign, m->a.wstart[0],
                   m->a.knew,  m->a.vnew, m->a.kvb,  m->a.k,       m->a.v,      m->a.qa,
                   m->a.qr,    m->a.attv};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) o->free(o, dev[i]);
    for (int l = 0; l < m->shape.L; l++) {
        if (m->w.lw[l].kc) o->free(o, m->w.lw[l].kc), o->free(o, m->w.lw[l].vc);
        if (m->w.lw[l].kpos) o->free(o, m->w.lw[l].kpos);
        free(m->w.lw[l].kpos_h);
        free(m->w.lw[l].moe.experts);
    }
    free(m->r.topk_h), free(m->r.rowpos_h), free(m->r.assign_h), free(m->r.count_h);
    free(m->a.wstart_h);
    for (int k = 1; k < CFG_MAX_WINDOWS; k++)
        if (m->a.wstart[k]) o->free(o, m->a.wstart[k]);
    free(m->w.lw), free(m->w.owned);
    free(m);
}

int infer_len(const infer_model *m) { return m->len; }
void infer_reset(infer_model *m) { m->len = 0; }
int64_t infer_weight_bytes_per_token(const infer_model *m) { return m->bytes_per_token; }
int64_t infer_cache_bytes(const infer_model *m) {
    int64_t rows = 0;
    for (int l = 0; l < m->shape.L; l++) rows += m->w.lw[l].cap;
    const __typeof__(m->cfg->model.mla) *a = &m->cfg->model.mla; /* the latent, or K and V */
    int64_t row =
        a->enabled ? a->kv_lora_rank + a->qk_rope_head_dim : 2 * (int64_t)m->shape.Hkv * m->shape.D;
    return rows * row * (int64_t)m->ops->act_size;
}
int64_t infer_param_count(const infer_model *m) { return m->nparams; }

int64_t infer_cache_bytes_per_token(const infer_model *m) {
    const __typeof__(m->cfg->model.mla) *a = &m->cfg->model.mla;
    int64_t per_layer =
        a->enabled ? a->kv_lora_rank + a->qk_rope_head_dim : 2 * (int64_t)m->shape.Hkv * m->shape.D;
    return per_layer * m->shape.L * m->ops->act_size;
}

/* ------------------------------------------------------------------ forward */

/* out(n,C) = norm(inp(n,C)): LayerNorm (gpt2) or RMSNorm (llama) */
static void norm(infer_model *m, act *out, const act *inp, const float *w, const float *b, int n) {
    const ust_ops *o = m->ops;
    if (m->shape.llama)
        o->rmsnorm_fwd(o, out, m->a.rstd, inp, w, n, m->shape.C, m->shape.eps);
    else
        o->layernorm_fwd(o, out, m->a.mean, m->a.rstd, inp, w, b, n, m->shape.C, m->shape.eps);
}

/* out(M,C) = MLP(x(M,C)) of width F: down(swiglu(gate x, up x)) for llama, down(gelu(up x + b))
 * + b for gpt2 (a dense layer's MLP or one expert). */
static void mlp(infer_model *m, const moe_expert *w, act *out, const act *x, int M, int F) {
    const ust_ops *o = m->ops;
    int C = m->shape.C;
    if (M == 0) return;
    if (m->shape.llama) { /* (model.hidden_act gelu_tanh: GeGLU) */
        o->linear_fwd(o, m->a.h1, x, w->gate, NULL, M, C, F);
        o->linear_fwd(o, m->a.h2, x, w->up, w->up_b, M, C, F);
        (m->shape.geglu ? o->geglu_fwd : o->swiglu_fwd)(o, m->a.h, m->a.h1, m->a.h2,
                                                        (int64_t)M * F);
    } else {
        o->linear_gelu_fwd(o, m->a.h2, m->a.h, x, w->up, w->up_b, M, C, F);
    }
    o->linear_fwd(o, out, m->a.h, w->down, w->down_b, M, F, C);
}

/* Host: the choices of n tokens grouped by expert, as moe.c's route() without capacity:
 * assignment a = token*k + j goes to row rowpos[a]; rows of expert e are [off[e], off[e]+cnt). */
static void route(infer_model *m, int n, int *off) {
    const ust_ops *o = m->ops;
    int A = n * m->shape.k;
    o->to_host(o, m->r.topk_h, m->r.topk, (size_t)A * sizeof(int32_t));
    memset(m->r.count_h, 0, (size_t)m->shape.E * sizeof(int32_t));
    for (int a = 0; a < A; a++) {
        UST_ASSERT(m->r.topk_h[a] >= 0 && m->r.topk_h[a] < m->shape.E,
                   "router chose expert %d of %d", m->r.topk_h[a], m->shape.E);
        m->r.rowpos_h[a] = m->r.count_h[m->r.topk_h[a]]++;
    }
    off[0] = 0;
    for (int e = 0; e < m->shape.E; e++) off[e + 1] = off[e] + m->r.count_h[e];
    for (int a = 0; a < A; a++) {
        m->r.rowpos_h[a] += off[m->r.topk_h[a]];
        m->r.assign_h[m->r.rowpos_h[a]] = a;
    }
    o->to_device(o, m->r.rowpos, m->r.rowpos_h, (size_t)A * sizeof(int32_t));
    o->to_device(o, m->r.assign, m->r.assign_h, (size_t)A * sizeof(int32_t));
}

/* tmp(n,C) = sum_j gate_j expert_{e_j}(ln) [+ shared(ln)]: only the chosen experts run, each on
 * its rows, so a decoding step reads k of the E experts' weights. */
static void moe_mlp(infer_model *m, const infer_layer *w, int n) {
    const ust_ops *o = m->ops;
    int C = m->shape.C, E = m->shape.E, k = m->shape.k, off[E + 1];
    o->linear_fwd(o, m->r.rlogits, m->a.ln, w->moe.router, NULL, n, C, E);
    o->moe_router_fwd(o, m->r.probs, NULL, m->r.topk, m->r.gate, NULL, m->r.rlogits, w->moe.bias, n,
                      E, k, &m->shape.route);
    route(m, n, off);
    o->moe_gather(o, m->r.xe, m->a.ln, m->r.assign, NULL, n * k, C, k);
    for (int e = 0; e < E; e++)
        mlp(m, &w->moe.experts[e], act_at(o, m->r.eout, (int64_t)off[e] * C),
            act_at(o, m->r.xe, (int64_t)off[e] * C), off[e + 1] - off[e], m->shape.Fe);
    o->moe_combine(o, m->a.tmp, m->r.eout, m->r.rowpos, m->r.gate, n, k, C, 0);
    if (m->shape.shared) {
        mlp(m, &w->moe.shared, m->a.tmp2, m->a.ln, n, m->shape.Fs);
        o->add(o, m->a.tmp, m->a.tmp, m->a.tmp2, (int64_t)n * C);
    }
}

/* A ring's n new keys and values (knew, vnew) into rows (len + i) % cap, and their positions. */
static void ring_store(infer_model *m, infer_layer *w, int n) {
    const ust_ops *o = m->ops;
    int64_t KV = (int64_t)m->shape.Hkv * m->shape.D;
    for (int i = 0; i < n;) { /* n <= chunk <= cap - W + 1: at most two runs */
        int p = m->len + i, row = p % w->cap, run = n - i < w->cap - row ? n - i : w->cap - row;
        o->copy(o, act_at(o, w->kc, row * KV), act_at(o, m->a.knew, i * KV),
                act_bytes(o, run * KV));
        o->copy(o, act_at(o, w->vc, row * KV), act_at(o, m->a.vnew, i * KV),
                act_bytes(o, run * KV));
        for (int j = 0; j < run; j++) w->kpos_h[row + j] = p + j;
        i += run;
    }
    o->to_device(o, w->kpos, w->kpos_h, (size_t)w->cap * sizeof(int32_t));
}

/* x(n,C) += attn(norm1(x)) (model.post_norm: += norm1(attn(x))): q from the new tokens, their
 * k/v appended to the cache at rows [len, len+n), attention over all len+n cached positions
 * (causal by position). */
static void attention(infer_model *m, infer_layer *w, int n) {
    const ust_ops *o = m->ops;
    int C = m->shape.C, HD = m->shape.H * m->shape.D, KV = m->shape.Hkv * m->shape.D;
    const int32_t *pos = m->a.pos + m->len;
    act *k = m->a.knew, *v = m->a.vnew; /* a windowed layer's ring: stored after RoPE */
    if (!w->kpos)
        k = act_at(o, w->kc, (int64_t)m->len * KV), v = act_at(o, w->vc, (int64_t)m->len * KV);
    const act *in = m->a.x;
    if (!m->shape.post_norm) norm(m, m->a.ln, m->a.x, w->ln1_w, w->ln1_b, n), in = m->a.ln;
    o->linear_fwd(o, m->a.q, in, w->wq, w->bq, n, C, HD);
    o->linear_fwd(o, k, in, w->wk, w->bk, n, C, KV);
    o->linear_fwd(o, v, in, w->wv, w->bv, n, C, KV);
    if (m->shape.qk_norm) { /* each head's q and k (model.qk_norm_whole: each token's), in place;
                             * lse (H, n) is free until attention */
        int wh = m->shape.qk_whole, hq = wh ? 1 : m->shape.H, hk = wh ? 1 : m->shape.Hkv;
        o->rmsnorm_fwd(o, m->a.q, m->a.lse, m->a.q, w->qn_w, n * hq, HD / hq, m->shape.eps);
        o->rmsnorm_fwd(o, k, m->a.lse, k, w->kn_w, n * hk, KV / hk, m->shape.eps);
    }
    if (m->shape.llama) { /* model.rope_local_theta: a windowed layer's own base */
        const ust_rope *r =
            m->shape.local_rope && w->window ? &m->shape.rope_local : &m->shape.rope;
        o->rope_fwd(o, m->a.q, m->a.q, pos, 1, n, m->shape.H, m->shape.D, r);
        o->rope_fwd(o, k, k, pos, 1, n, m->shape.Hkv, m->shape.D, r);
    }
    /* a windowed layer (model.sliding_window): keys from position - W + 1 on (infer_forward),
     * of the ring's filled rows at their positions */
    int Tk = m->len + n;
    if (w->kpos) ring_store(m, w, n), Tk = Tk < w->cap ? Tk : w->cap;
    o->attention_fwd(o, m->a.att, m->a.lse, m->a.q, w->kc, w->vc, 1, n, Tk, m->shape.H,
                     m->shape.Hkv, m->shape.D, pos, w->kpos ? w->kpos : m->a.pos, 1,
                     w->window ? m->a.wstart[w->wslot] : NULL, m->shape.attn_softcap);
    o->linear_fwd(o, m->a.tmp, m->a.att, w->wo, w->bo, n, HD, C);
    if (m->shape.post_norm) norm(m, m->a.tmp, m->a.tmp, w->ln1_w, w->ln1_b, n);
    if (m->shape.sandwich) norm(m, m->a.tmp, m->a.tmp, w->pn_w[0], NULL, n);
    o->add(o, m->a.x, m->a.x, m->a.tmp, (int64_t)n * C);
}

/* Columns [s0, s0 + w) of `rows` rows of src (pitch sp elements) to [d0, d0 + w) of dst (dp). */
static void cols(infer_model *m, act *dst, int64_t dp, int64_t d0, const act *src, int64_t sp,
                 int64_t s0, int64_t w, int64_t rows) {
    const ust_ops *o = m->ops;
    size_t as = (size_t)o->act_size;
    o->copy2d(o, act_at(o, dst, d0), (size_t)dp * as, act_at(o, src, s0), (size_t)sp * as,
              (size_t)w * as, (size_t)rows);
}

/* model.mla (model_mla.c's math on one sequence): the new tokens' latent c_kv (normed) and rope
 * key (after RoPE) appended to the cache; every cached position's k and v re-expanded from it
 * (kv_b_proj), the shared key copied into each head; v zero-padded to the q/k width. */
static void mla_attention(infer_model *m, const infer_layer *w, int n) {
    const ust_ops *o = m->ops;
    const __typeof__(m->cfg->model.mla) *a = &m->cfg->model.mla;
    int C = m->shape.C, H = m->shape.H, D = m->shape.D, R = a->qk_rope_head_dim,
        Rkv = a->kv_lora_rank, nope = a->qk_nope_head_dim, Dv = a->v_head_dim, W = nope + Dv;
    int len = m->len, S = len + n;
    const int32_t *pos = m->a.pos + len;
    act *ckv = act_at(o, w->kc, (int64_t)len * Rkv), *kr = act_at(o, w->vc, (int64_t)len * R);
    norm(m, m->a.ln, m->a.x, w->ln1_w, w->ln1_b, n);
    if (a->q_lora_rank) {
        o->linear_fwd(o, m->a.qa, m->a.ln, w->mla.wqa, NULL, n, C, a->q_lora_rank);
        o->rmsnorm_fwd(o, m->a.qa, m->a.rstd, m->a.qa, w->mla.qa_norm, n, a->q_lora_rank, 1e-6f);
        o->linear_fwd(o, m->a.q, m->a.qa, w->mla.wqb, NULL, n, a->q_lora_rank, H * D);
    } else {
        o->linear_fwd(o, m->a.q, m->a.ln, w->wq, NULL, n, C, H * D);
    }
    o->linear_fwd(o, ckv, m->a.ln, w->mla.wkva, NULL, n, C, Rkv);
    o->linear_fwd(o, kr, m->a.ln, w->mla.wkva + (int64_t)Rkv * C, NULL, n, C, R);
    o->rmsnorm_fwd(o, ckv, m->a.rstd, ckv, w->mla.kva_norm, n, Rkv, 1e-6f);
    o->rope_fwd(o, kr, kr, pos, 1, n, 1, R, &m->shape.rope);
    cols(m, m->a.qr, R, 0, m->a.q, D, nope, R, (int64_t)n * H);
    o->rope_fwd(o, m->a.qr, m->a.qr, pos, 1, n, H, R, &m->shape.rope);
    cols(m, m->a.q, D, nope, m->a.qr, R, 0, R, (int64_t)n * H);
    double ms = a->mscale_all_dim ? 0.1 * a->mscale_all_dim * log(m->shape.rope.factor) + 1 : 1;
    if (ms != 1) o->scale(o, (float *)m->a.q, (float)(ms * ms), (int64_t)n * H * D); /* YaRN */
    o->linear_fwd(o, m->a.kvb, w->kc, w->mla.wkvb, NULL, S, Rkv, H * W);
    cols(m, m->a.k, D, 0, m->a.kvb, W, 0, nope, (int64_t)S * H);
    for (int h = 0; h < H; h++)
        cols(m, m->a.k, (int64_t)H * D, (int64_t)h * D + nope, w->vc, R, 0, R, S);
    if (Dv < D) o->zero(o, m->a.v, act_bytes(o, (int64_t)S * H * D));
    cols(m, m->a.v, D, 0, m->a.kvb, W, nope, Dv, (int64_t)S * H);
    o->attention_fwd(o, m->a.att, m->a.lse, m->a.q, m->a.k, m->a.v, 1, n, S, H, H, D, pos, m->a.pos,
                     1, w->window ? m->a.wstart[w->wslot] : NULL, m->shape.attn_softcap);
    cols(m, m->a.attv, Dv, 0, m->a.att, D, 0, Dv, (int64_t)n * H);
    o->linear_fwd(o, m->a.tmp, m->a.attv, w->wo, NULL, n, H * Dv, C);
    o->add(o, m->a.x, m->a.x, m->a.tmp, (int64_t)n * C);
}

/* x(n,C) += mlp(norm2(x)) (model.post_norm, a dense llama: += norm2(mlp(x))) */
static void feed_forward(infer_model *m, const infer_layer *w, int n) {
    if (m->shape.post_norm) {
        mlp(m, &w->mlp, m->a.tmp, m->a.x, n, m->shape.F);
        norm(m, m->a.tmp, m->a.tmp, w->ln2_w, w->ln2_b, n);
        m->ops->add(m->ops, m->a.x, m->a.x, m->a.tmp, (int64_t)n * m->shape.C);
        return;
    }
    norm(m, m->a.ln, m->a.x, w->ln2_w, w->ln2_b, n);
    if (w->is_moe)
        moe_mlp(m, w, n);
    else
        mlp(m, &w->mlp, m->a.tmp, m->a.ln, n, m->shape.F);
    if (m->shape.sandwich) norm(m, m->a.tmp, m->a.tmp, w->pn_w[1], NULL, n);
    m->ops->add(m->ops, m->a.x, m->a.x, m->a.tmp, (int64_t)n * m->shape.C);
}

/* The training model's math: gpt2 (LayerNorm eps 1e-5, learned positions, GELU tanh, biases) or
 * llama (RMSNorm, RoPE rotate-half with ust_rope incl. llama3 scaling, GQA, SwiGLU, optional
 * q/k/v biases); MoE layers as moe.c (softmax router, top-k, gates renormalized, shared expert). */
static void forward_piece(infer_model *m, const int32_t *tok, int n, float *logits) {
    const ust_ops *o = m->ops;
    o->to_device(o, m->a.tok, tok, (size_t)n * sizeof(int32_t));
    o->embedding_fwd(o, m->a.x, m->a.tok, m->shape.llama ? NULL : m->a.pos + m->len, m->w.wte,
                     m->w.wpe, 1, n, m->shape.C, 0, m->shape.Vp);
    if (m->shape.embed_scale) /* model.embed_scale: Gemma's embeddings x sqrt(C) */
        o->scale_act(o, m->a.x, m->shape.embed_scale, (int64_t)n * m->shape.C);
    int W[CFG_MAX_WINDOWS], nw = cfg_windows(m->cfg, W);
    for (int k = 0; k < nw; k++) { /* each window size's starts (cfg_windows) */
        for (int i = 0; i < n; i++)
            m->a.wstart_h[i] = m->len + i - W[k] + 1 > 0 ? m->len + i - W[k] + 1 : 0;
        o->to_device(o, m->a.wstart[k], m->a.wstart_h, (size_t)n * sizeof(int32_t));
    }
    for (int l = 0; l < m->shape.L; l++) {
        if (m->cfg->model.mla.enabled)
            mla_attention(m, &m->w.lw[l], n);
        else
            attention(m, &m->w.lw[l], n);
        feed_forward(m, &m->w.lw[l], n);
    }
    if (!logits) return;
    /* only the last token's logits are wanted: norm and head on that row, real vocabulary */
    act *last = act_at(o, m->a.x, (int64_t)(n - 1) * m->shape.C);
    norm(m, m->a.ln, last, m->w.lnf_w, m->w.lnf_b, 1);
    o->linear_fwd(o, m->a.logits, m->a.ln, m->w.lm, NULL, 1, m->shape.C, m->shape.V);
    o->to_host(o, logits, m->a.logits, (size_t)m->shape.V * sizeof(float));
    float c = m->shape.final_softcap; /* model.final_softcap: what sampling sees, as the loss */
    for (int i = 0; c > 0 && i < m->shape.V; i++) logits[i] = c * tanhf(logits[i] / c);
}

void infer_forward(infer_model *m, const int32_t *tok, int n, float *logits) {
    UST_ASSERT(n >= 1 && n <= m->shape.max_n && m->len + n <= m->shape.S,
               "forward of %d tokens at %d (chunk %d, S %d)", n, m->len, m->shape.max_n,
               m->shape.S);
    for (int i = 0; i < n; i += m->shape.chunk) { /* a windowed model's pieces (infer_create) */
        int k = n - i < m->shape.chunk ? n - i : m->shape.chunk;
        forward_piece(m, tok + i, k, i + k == n ? logits : NULL);
        m->len += k;
    }
}
