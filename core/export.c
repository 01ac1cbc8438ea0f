/* export: checkpoint -> Hugging Face transformers layout.
 *
 * The work is a table: one row per tensor of the exported file, saying which checkpoint tensors
 * it is made of (with the shapes the config implies) and how (copy, cut the padded vocabulary,
 * transpose, fuse q/k/v). The table is built from the config, every source is checked against
 * the checkpoint, and only then is anything written.
 *
 * llama: ustrain already stores tensors under LlamaForCausalLM's names, [out, in] like
 * nn.Linear. RoPE needs no re-ordering of q_proj/k_proj rows: ustrain rotates the pairs
 * (x_i, x_{i+D/2}) of each head (core/ops_cpu.c rope_apply), which is transformers' rotate_half
 * convention; the permutation of Meta->HF conversions is only for weights trained with
 * interleaved pairs (x_{2i}, x_{2i+1}). Grouped-query heads map the same way too: query head h
 * reads key/value head h / (n_head / n_kv_head) in both (repeat_kv).
 *
 * llama with MoE layers in every layer (no shared expert) -> MixtralForCausalLM: the router is
 * block_sparse_moe.gate, expert e's gate_proj / down_proj / up_proj are its w1 / w2 / w3 (the
 * Hub's per-expert names, which transformers and vLLM read). Mixtral routes as ustrain does:
 * softmax over all experts, top-k, the k weights renormalized to sum to one.
 *
 * gpt2: GPT2LMHeadModel keeps GPT-2's Conv1D weights, [in, out] (the transpose of ours), and one
 * fused c_attn whose output features are q | k | v. GPT-2 has no grouped-query attention, so a
 * ustrain gpt2 with n_kv_head < n_head is exported with each key/value head repeated for the
 * query heads that read it, which computes the same attention. */
#include "export.h"

#include "ckpt.h"
#include "config.h"
#include "fs.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef enum {
    X_COPY, /* the same values */
    X_ROWS, /* the first shape[0] rows: the vocabulary without ustrain's padding rows */
    X_T,    /* transposed: [out, in] -> Conv1D's [in, out] */
    X_QKV,  /* q | k | v stacked along the output features, k and v repeated up to n_head heads;
               transposed when 2-D (c_attn.weight), concatenated when 1-D (c_attn.bias) */
} xform;

typedef struct {
    char name[CKPT_NAME_MAX]; /* the exported name */
    int ndim;
    int64_t shape[2];
    xform op;
    int nsrc;
    ckpt_tensor src[3]; /* checkpoint names and the shapes the config implies */
} xtensor;

typedef struct {
    const ust_config *c;
    xtensor *t;
    int n;
} xtable;

/* ---------------------------------------------------------------------------------------------
 * The tables */

static xtensor *xadd(xtable *l, xform op, const char *name, int ndim, int64_t rows, int64_t cols) {
    xtensor *x = &l->t[l->n++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->op = op;
    x->ndim = ndim;
    x->shape[0] = rows;
    x->shape[1] = ndim == 2 ? cols : 0;
    return x;
}

static void xsrc(xtensor *x, const char *name, int ndim, int64_t rows, int64_t cols) {
    ckpt_tensor *s = &x->src[x->nsrc++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->ndim = ndim;
    s->shape[0] = rows;
    s->shape[1] = ndim == 2 ? cols : 0;
}

/* One checkpoint tensor src of rows x cols -> dst: the same shape, or transposed for X_T. */
static void xsame(xtable *l, xform op, const char *dst, const char *src, int ndim, int64_t rows,
                  int64_t cols) {
    xtensor *x = xadd(l, op, dst, ndim, ndim == 2 && op == X_T ? cols : rows,
                      ndim == 2 && op == X_T ? rows : cols);
    xsrc(x, src, ndim, rows, cols);
}

/* A MoE layer under Mixtral's names. */
static void mixtral_layer(xtable *l, int i) {
    const ust_config *c = l->c;
    int64_t C = c->model.d_model, E = c->model.moe.num_experts, Fe = c->model.moe.d_ff_expert;
    char dst[CKPT_NAME_MAX], src[CKPT_NAME_MAX];
    snprintf(dst, sizeof dst, "model.layers.%d.block_sparse_moe.gate.weight", i);
    snprintf(src, sizeof src, "model.layers.%d.mlp.router.weight", i);
    xsame(l, X_COPY, dst, src, 2, E, C);
    static const struct {
        const char *w, *ours;
        int down;
    } map[] = {{"w1", "gate_proj", 0}, {"w2", "down_proj", 1}, {"w3", "up_proj", 0}};
    for (int64_t e = 0; e < E; e++)
        for (int k = 0; k < 3; k++) {
            snprintf(dst, sizeof dst, "model.layers.%d.block_sparse_moe.experts.%lld.%s.weight", i,
                     (long long)e, map[k].w);
            snprintf(src, sizeof src, "model.layers.%d.mlp.experts.%lld.%s.weight", i, (long long)e,
                     map[k].ours);
            xsame(l, X_COPY, dst, src, 2, map[k].down ? C : Fe, map[k].down ? Fe : C);
        }
}

static void llama_table(xtable *l) {
    const ust_config *c = l->c;
    int64_t C = c->model.d_model, V = c->model.vocab_size, Vp = cfg_vocab_padded(c);
    int64_t F = c->model.d_ff, D = cfg_head_dim(c);
    int64_t HD = c->model.n_head * D, KV = c->model.n_kv_head * D;
    xtensor *x = xadd(l, X_ROWS, "model.embed_tokens.weight", 2, V, C);
    xsrc(x, "model.embed_tokens.weight", 2, Vp, C);
    for (int i = 0; i < c->model.n_layer; i++) {
        char n[CKPT_NAME_MAX];
        /* the same name and shape on both sides */
#define SAME(suffix, ndim, rows, cols)                                                             \
    snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix);                                        \
    xsame(l, X_COPY, n, n, ndim, rows, cols)
        SAME("input_layernorm.weight", 1, C, 0);
        SAME("self_attn.q_proj.weight", 2, HD, C);
        SAME("self_attn.k_proj.weight", 2, KV, C);
        SAME("self_attn.v_proj.weight", 2, KV, C);
        SAME("self_attn.o_proj.weight", 2, C, HD);
        SAME("post_attention_layernorm.weight", 1, C, 0);
        if (c->model.moe.num_experts > 0) {
            mixtral_layer(l, i);
            continue;
        }
        SAME("mlp.gate_proj.weight", 2, F, C);
        SAME("mlp.up_proj.weight", 2, F, C);
        SAME("mlp.down_proj.weight", 2, C, F);
#undef SAME
    }
    xsame(l, X_COPY, "model.norm.weight", "model.norm.weight", 1, C, 0);
    if (!cfg_tied(c)) { /* tied: transformers takes lm_head from embed_tokens */
        x = xadd(l, X_ROWS, "lm_head.weight", 2, V, C);
        xsrc(x, "lm_head.weight", 2, Vp, C);
    }
}

static void gpt2_table(xtable *l) {
    const ust_config *c = l->c;
    int64_t C = c->model.d_model, V = c->model.vocab_size, Vp = cfg_vocab_padded(c);
    int64_t F = c->model.d_ff, D = cfg_head_dim(c), T = c->model.max_seq_len;
    int64_t HD = c->model.n_head * D, KV = c->model.n_kv_head * D;
    xtensor *x = xadd(l, X_ROWS, "transformer.wte.weight", 2, V, C);
    xsrc(x, "model.embed_tokens.weight", 2, Vp, C);
    xsame(l, X_COPY, "transformer.wpe.weight", "model.embed_positions.weight", 2, T, C);
    for (int i = 0; i < c->model.n_layer; i++) {
        char h[64], s[64], dn[CKPT_NAME_MAX], sn[3][CKPT_NAME_MAX];
        snprintf(h, sizeof h, "transformer.h.%d.", i);
        snprintf(s, sizeof s, "model.layers.%d.", i);
#define SAME(op, hf, ours, ndim, r, cl)                                                            \
    snprintf(dn, sizeof dn, "%s%s", h, hf);                                                        \
    snprintf(sn[0], sizeof sn[0], "%s%s", s, ours);                                                \
    xsame(l, op, dn, sn[0], ndim, r, cl)
        SAME(X_COPY, "ln_1.weight", "input_layernorm.weight", 1, C, 0);
        SAME(X_COPY, "ln_1.bias", "input_layernorm.bias", 1, C, 0);
        for (int w = 0; w < 2; w++) { /* c_attn.weight [C, 3 HD], c_attn.bias [3 HD] */
            snprintf(dn, sizeof dn, "%sattn.c_attn.%s", h, w ? "bias" : "weight");
            x = w ? xadd(l, X_QKV, dn, 1, 3 * HD, 0) : xadd(l, X_QKV, dn, 2, C, 3 * HD);
            const char *qkv[] = {"q", "k", "v"};
            for (int j = 0; j < 3; j++) {
                snprintf(sn[j], sizeof sn[j], "%sself_attn.%s_proj.%s", s, qkv[j],
                         w ? "bias" : "weight");
                xsrc(x, sn[j], w ? 1 : 2, j ? KV : HD, w ? 0 : C);
            }
        }
        SAME(X_T, "attn.c_proj.weight", "self_attn.o_proj.weight", 2, C, HD);
        SAME(X_COPY, "attn.c_proj.bias", "self_attn.o_proj.bias", 1, C, 0);
        SAME(X_COPY, "ln_2.weight", "post_attention_layernorm.weight", 1, C, 0);
        SAME(X_COPY, "ln_2.bias", "post_attention_layernorm.bias", 1, C, 0);
        SAME(X_T, "mlp.c_fc.weight", "mlp.up_proj.weight", 2, F, C);
        SAME(X_COPY, "mlp.c_fc.bias", "mlp.up_proj.bias", 1, F, 0);
        SAME(X_T, "mlp.c_proj.weight", "mlp.down_proj.weight", 2, C, F);
        SAME(X_COPY, "mlp.c_proj.bias", "mlp.down_proj.bias", 1, C, 0);
#undef SAME
    }
    xsame(l, X_COPY, "transformer.ln_f.weight", "model.norm.weight", 1, C, 0);
    xsame(l, X_COPY, "transformer.ln_f.bias", "model.norm.bias", 1, C, 0);
    /* no lm_head.weight: GPT2LMHeadModel ties it to transformer.wte, as GPT-2's own files do */
}

static int build_table(xtable *l, const ust_config *c, ust_err *e) {
    const __typeof__(c->model.moe) *moe = &c->model.moe;
    if (moe->num_experts > 0 &&
        (c->model.arch != ARCH_LLAMA || moe->every != 1 || moe->shared_expert))
        return ust_errf(e,
                        "model.moe: the Hugging Face layout for mixture of experts is Mixtral's, "
                        "a llama with experts in every layer and no shared expert (this model: "
                        "arch %s, moe.every = %d, moe.shared_expert = %s)",
                        c->model.arch == ARCH_LLAMA ? "llama" : "gpt2", moe->every,
                        moe->shared_expert ? "true" : "false");
    l->c = c;
    l->n = 0;
    l->t = calloc((size_t)c->model.n_layer * (16 + 3 * moe->num_experts + 1) + 8, sizeof *l->t);
    if (!l->t) return ust_errf(e, "export: out of memory");
    if (c->model.arch == ARCH_LLAMA)
        llama_table(l);
    else
        gpt2_table(l);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Checking the sources and making the tensors */

static int64_t numel(int ndim, const int64_t *shape) {
    return ndim == 2 ? shape[0] * shape[1] : shape[0];
}

static void shape_str(char *out, size_t n, int ndim, const int64_t *shape) {
    if (ndim == 2)
        snprintf(out, n, "[%lld, %lld]", (long long)shape[0], (long long)shape[1]);
    else
        snprintf(out, n, "[%lld]", (long long)shape[0]);
}

/* The checkpoint's fp32 data of s, after checking that it has the shape the config implies. */
static const float *source(const st_file *f, const char *path, const ckpt_tensor *s, ust_err *e) {
    int ndim = 0;
    int64_t shape[4] = {0};
    const float *p = st_tensor(f, s->name, &ndim, shape);
    if (!p) {
        for (int i = 0; i < st_count(f); i++)
            if (!strcmp(st_name(f, i), s->name)) {
                ust_errf(e, "%s: tensor '%s' is not fp32 (F32) data", path, s->name);
                return NULL;
            }
        ust_errf(e, "%s: tensor '%s' is missing (the checkpoint's config says the model has it)",
                 path, s->name);
        return NULL;
    }
    if (ndim != s->ndim || shape[0] != s->shape[0] || (ndim == 2 && shape[1] != s->shape[1])) {
        char have[64], want[64];
        shape_str(have, sizeof have, ndim > 2 ? 2 : ndim, shape);
        shape_str(want, sizeof want, s->ndim, s->shape);
        ust_errf(e, "%s: tensor '%s' has shape %s but the checkpoint's config implies %s", path,
                 s->name, ndim > 2 ? "(more than 2 dims)" : have, want);
        return NULL;
    }
    return p;
}

static int check_sources(const xtable *l, const st_file *f, const char *path, ust_err *e) {
    for (int i = 0; i < l->n; i++)
        for (int j = 0; j < l->t[i].nsrc; j++)
            if (!source(f, path, &l->t[i].src[j], e)) return -1;
    return 0;
}

/* Row r of the stacked q | k | v (each n_head heads of D rows) as a (source, row) pair: k and v
 * heads repeat, query head h reading key/value head h / (n_head / n_kv_head). */
static void qkv_row(const ust_config *c, int64_t r, int *which, int64_t *row) {
    int64_t D = cfg_head_dim(c), HD = c->model.n_head * D;
    int G = c->model.n_head / c->model.n_kv_head;
    *which = (int)(r / HD);
    int64_t rr = r % HD;
    *row = *which == 0 ? rr : (rr / D / G) * D + rr % D;
}

static void make(const ust_config *c, const xtensor *x, const float *src[3], float *out) {
    switch (x->op) {
    case X_COPY:
    case X_ROWS: /* row-major: the first rows are one contiguous prefix */
        memcpy(out, src[0], (size_t)numel(x->ndim, x->shape) * sizeof(float));
        break;
    case X_T: {
        int64_t rows = x->src[0].shape[0], cols = x->src[0].shape[1];
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) out[j * rows + i] = src[0][i * cols + j];
        break;
    }
    case X_QKV: {
        int64_t R = x->ndim == 2 ? x->shape[1] : x->shape[0]; /* 3 * n_head * D */
        int64_t cols = x->ndim == 2 ? x->shape[0] : 1;        /* C, or 1 for the bias */
        for (int64_t r = 0; r < R; r++) {
            int w;
            int64_t sr;
            qkv_row(c, r, &w, &sr);
            for (int64_t j = 0; j < cols; j++) out[j * R + r] = src[w][sr * cols + j];
        }
        break;
    }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Writing */

static char *st_header(const xtable *l, size_t *len) {
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    int64_t off = 0;
    for (int i = 0; i < l->n; i++) {
        const xtensor *x = &l->t[i];
        cJSON *o = cJSON_AddObjectToObject(root, x->name);
        cJSON_AddStringToObject(o, "dtype", "F32");
        cJSON *shape = cJSON_AddArrayToObject(o, "shape"),
              *offs = cJSON_AddArrayToObject(o, "data_offsets");
        for (int d = 0; d < x->ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)x->shape[d]));
        int64_t bytes = 4 * numel(x->ndim, x->shape);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + bytes)));
        off += bytes;
    }
    char *js = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!js) return NULL;
    /* padded with spaces so the data starts 8-byte aligned, as the safetensors writer does */
    size_t n = strlen(js), padded = (n + 7) / 8 * 8;
    char *h = malloc(8 + padded);
    if (h) {
        uint64_t le = padded; /* x86-64 and aarch64 Linux are little-endian */
        memcpy(h, &le, 8);
        memcpy(h + 8, js, n);
        memset(h + 8 + n, ' ', padded - n);
        *len = 8 + padded;
    }
    free(js);
    return h;
}

static int write_all(FILE *f, const void *p, size_t n, const char *path, ust_err *e) {
    if (fwrite(p, 1, n, f) != n)
        return ust_errf(e, "export: cannot write %s: %s", path, strerror(errno));
    return 0;
}

/* Closes f after flushing and fsyncing it, so a rename publishes complete data. */
static int close_synced(FILE *f, const char *path, int rc, ust_err *e) {
    if (!rc && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        rc = ust_errf(e, "export: cannot write %s: %s", path, strerror(errno));
    if (fclose(f) != 0 && !rc)
        rc = ust_errf(e, "export: cannot write %s: %s", path, strerror(errno));
    return rc;
}

static int write_safetensors(const xtable *l, const st_file *src, const char *src_path,
                             const char *path, ust_err *e) {
    size_t hlen = 0, maxn = 1;
    char *hdr = st_header(l, &hlen);
    for (int i = 0; i < l->n; i++) {
        size_t n = (size_t)numel(l->t[i].ndim, l->t[i].shape);
        if (n > maxn) maxn = n;
    }
    float *buf = malloc(maxn * sizeof(float));
    ust_err inner;
    FILE *f = hdr && buf ? fs_fopen_regular(path, "wb", &inner) : NULL;
    int rc = 0;
    if (!hdr || !buf)
        rc = ust_errf(e, "export: out of memory");
    else if (!f)
        rc = ust_errf(e, "export: %s", inner.msg);
    if (!rc) rc = write_all(f, hdr, hlen, path, e);
    for (int i = 0; i < l->n && !rc; i++) {
        const xtensor *x = &l->t[i];
        const float *s[3] = {NULL, NULL, NULL};
        for (int j = 0; j < x->nsrc && !rc; j++)
            if (!(s[j] = source(src, src_path, &x->src[j], e))) rc = -1;
        if (rc) break;
        make(l->c, x, s, buf);
        rc = write_all(f, buf, (size_t)numel(x->ndim, x->shape) * sizeof(float), path, e);
    }
    if (f) rc = close_synced(f, path, rc, e);
    free(hdr);
    free(buf);
    return rc;
}

/* The checkpoint does not know its tokenizer; only GPT-2's vocabulary has a known end-of-text id
 * (50256). Otherwise null, rather than the config classes' defaults, which may not even be
 * inside a small vocabulary. */
static void special_tokens(cJSON *j, int eot) {
    const char *keys[] = {"bos_token_id", "eos_token_id"};
    for (int i = 0; i < 2; i++)
        if (eot >= 0)
            cJSON_AddNumberToObject(j, keys[i], eot);
        else
            cJSON_AddNullToObject(j, keys[i]);
}

static cJSON *llama_config(const ust_config *c) {
    const __typeof__(c->model) *m = &c->model;
    int moe = m->moe.num_experts > 0;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddItemToObject(
        j, "architectures",
        cJSON_CreateStringArray((const char *[]){moe ? "MixtralForCausalLM" : "LlamaForCausalLM"},
                                1));
    cJSON_AddStringToObject(j, "model_type", moe ? "mixtral" : "llama");
    cJSON_AddNumberToObject(j, "vocab_size", m->vocab_size);
    cJSON_AddNumberToObject(j, "hidden_size", m->d_model);
    cJSON_AddNumberToObject(j, "intermediate_size", moe ? m->moe.d_ff_expert : m->d_ff);
    if (moe) {
        cJSON_AddNumberToObject(j, "num_local_experts", m->moe.num_experts);
        cJSON_AddNumberToObject(j, "num_experts_per_tok", m->moe.top_k);
        cJSON_AddNumberToObject(j, "router_aux_loss_coef", m->moe.aux_loss_coef);
        cJSON_AddBoolToObject(j, "output_router_logits", 0);
        cJSON_AddNullToObject(j, "sliding_window");
    }
    cJSON_AddNumberToObject(j, "num_hidden_layers", m->n_layer);
    cJSON_AddNumberToObject(j, "num_attention_heads", m->n_head);
    cJSON_AddNumberToObject(j, "num_key_value_heads", m->n_kv_head);
    cJSON_AddNumberToObject(j, "head_dim", cfg_head_dim(c));
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "max_position_embeddings", m->max_seq_len);
    cJSON_AddNumberToObject(j, "rms_norm_eps", m->norm_eps);
    cJSON_AddNumberToObject(j, "rope_theta", m->rope_theta);
    cJSON_AddNullToObject(j, "rope_scaling");
    cJSON_AddBoolToObject(j, "attention_bias", 0);
    cJSON_AddNumberToObject(j, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(j, "mlp_bias", 0);
    cJSON_AddNumberToObject(j, "pretraining_tp", 1);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", cfg_tied(c));
    special_tokens(j, -1);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddBoolToObject(j, "use_cache", 1);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    return j;
}

static cJSON *gpt2_config(const ust_config *c) {
    const __typeof__(c->model) *m = &c->model;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddItemToObject(j, "architectures",
                          cJSON_CreateStringArray((const char *[]){"GPT2LMHeadModel"}, 1));
    cJSON_AddStringToObject(j, "model_type", "gpt2");
    cJSON_AddNumberToObject(j, "vocab_size", m->vocab_size);
    cJSON_AddNumberToObject(j, "n_positions", m->max_seq_len);
    cJSON_AddNumberToObject(j, "n_ctx", m->max_seq_len);
    cJSON_AddNumberToObject(j, "n_embd", m->d_model);
    cJSON_AddNumberToObject(j, "n_layer", m->n_layer);
    cJSON_AddNumberToObject(j, "n_head", m->n_head);
    cJSON_AddNumberToObject(j, "n_inner", m->d_ff);
    /* GPT-2's tanh approximation, which ustrain's gpt2 computes */
    cJSON_AddStringToObject(j, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(j, "layer_norm_epsilon", m->norm_eps);
    /* ustrain trains without dropout */
    cJSON_AddNumberToObject(j, "resid_pdrop", 0.0);
    cJSON_AddNumberToObject(j, "embd_pdrop", 0.0);
    cJSON_AddNumberToObject(j, "attn_pdrop", 0.0);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddBoolToObject(j, "scale_attn_weights", 1);
    cJSON_AddBoolToObject(j, "scale_attn_by_inverse_layer_idx", 0);
    cJSON_AddBoolToObject(j, "reorder_and_upcast_attn", 0);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", 1);
    special_tokens(j, m->vocab_size >= 50257 ? 50256 : -1);
    cJSON_AddBoolToObject(j, "use_cache", 1);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    return j;
}

static int write_config(const ust_config *c, const char *path, ust_err *e) {
    cJSON *j = c->model.arch == ARCH_LLAMA ? llama_config(c) : gpt2_config(c);
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    if (!s) return ust_errf(e, "export: out of memory");
    ust_err inner;
    FILE *f = fs_fopen_regular(path, "wb", &inner);
    int rc = f ? write_all(f, s, strlen(s), path, e) : ust_errf(e, "export: %s", inner.msg);
    if (!rc) rc = write_all(f, "\n", 1, path, e);
    if (f) rc = close_synced(f, path, rc, e);
    free(s);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * The checkpoint side */

/* A step directory as given, or the newest finished step of a checkpoint directory. */
static int resolve_step(const char *ckpt, char *out, int n, ust_err *e) {
    char p[PATH_MAX];
    struct stat st;
    if (stat(ckpt, &st) != 0)
        return ust_errf(e, "export: checkpoint %s: %s", ckpt, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return ust_errf(e,
                        "export: %s is not a checkpoint directory (expected a step directory "
                        "holding state.json and model.safetensors)",
                        ckpt);
    snprintf(p, sizeof p, "%s/state.json", ckpt);
    if (access(p, F_OK) == 0) {
        snprintf(out, (size_t)n, "%s", ckpt);
        return 0;
    }
    int found = ckpt_find_latest(ckpt, out, n, e);
    if (found < 0) return -1;
    if (!found)
        return ust_errf(e,
                        "export: %s is not a checkpoint: no state.json there, and no finished "
                        "step_N inside it",
                        ckpt);
    return 0;
}

/* The effective config the checkpoint was trained with (state.json's "config", YAML text). */
static int load_config(ust_config *c, const char *step, ust_err *e) {
    ckpt_reader *r = ckpt_open(step, e);
    if (!r) return -1;
    cJSON *j = cJSON_Parse(ckpt_state_json(r));
    ckpt_close(r);
    const cJSON *y = cJSON_GetObjectItemCaseSensitive(j, "config");
    char where[PATH_MAX];
    snprintf(where, sizeof where, "%s/state.json (config)", step);
    int rc = 0;
    if (!cJSON_IsString(y))
        rc = ust_errf(e,
                      "export: %s/state.json is not a ustrain checkpoint state (no \"config\" "
                      "text)",
                      step);
    cfg_defaults(c);
    if (!rc) rc = cfg_load_string(c, y->valuestring, where, e);
    if (!rc) rc = cfg_validate(c, 0, e);
    cJSON_Delete(j);
    return rc;
}

/* Refuses an OUT that exists but is not a directory before anything is written. */
static int prepare_out(const char *out, ust_err *e) {
    struct stat st;
    if (stat(out, &st) == 0 && !S_ISDIR(st.st_mode))
        return ust_errf(e, "export: output %s exists and is not a directory", out);
    return fs_mkdir_p(out, e);
}

int export_hf(const char *ckpt, const char *out_dir, ust_err *e) {
    char step[PATH_MAX], src[PATH_MAX + 32], tmp_st[PATH_MAX + 64], tmp_cfg[PATH_MAX + 64],
        fin_st[PATH_MAX + 64], fin_cfg[PATH_MAX + 64];
    ust_config c;
    if (resolve_step(ckpt, step, sizeof step, e) || load_config(&c, step, e)) return UST_EXIT_USAGE;
    xtable l = {0};
    if (build_table(&l, &c, e)) return UST_EXIT_USAGE;
    snprintf(src, sizeof src, "%s/model.safetensors", step);
    ust_err inner;
    st_file *f = st_open(src, &inner);
    int rc = 0;
    if (!f) rc = ust_errf(e, "export: %s", inner.msg);
    if (!rc) rc = check_sources(&l, f, src, e);
    if (!rc) rc = prepare_out(out_dir, e);
    if (rc) {
        st_close(f);
        free(l.t);
        return UST_EXIT_USAGE;
    }
    /* everything is checked: from here a failure is the output's, and leaves only temporaries,
     * which are removed */
    snprintf(tmp_st, sizeof tmp_st, "%s/.model.safetensors.tmp.%d", out_dir, (int)getpid());
    snprintf(tmp_cfg, sizeof tmp_cfg, "%s/.config.json.tmp.%d", out_dir, (int)getpid());
    snprintf(fin_st, sizeof fin_st, "%s/model.safetensors", out_dir);
    snprintf(fin_cfg, sizeof fin_cfg, "%s/config.json", out_dir);
    rc = write_safetensors(&l, f, src, tmp_st, e);
    if (!rc) rc = write_config(&c, tmp_cfg, e);
    if (!rc && (rename(tmp_st, fin_st) != 0 || rename(tmp_cfg, fin_cfg) != 0))
        rc = ust_errf(e, "export: cannot rename into %s: %s", out_dir, strerror(errno));
    if (rc) {
        unlink(tmp_st);
        unlink(tmp_cfg);
    }
    st_close(f);
    free(l.t);
    return rc ? UST_EXIT_RUNTIME : 0;
}
