/* hf_config: config.json <-> ustrain's model section (hf_config.h).
 * Keys absent from config.json take transformers' defaults for the architecture (rope_theta
 * 10000, or Mixtral's 1e6; rms_norm_eps 1e-6, Mixtral's 1e-5; num_key_value_heads = heads; ...);
 * the shape keys must be there. Both transformers 4's rope_theta + rope_scaling and transformers
 * 5's rope_parameters are read. */
#include "hf_config.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *path; /* dir/config.json, for messages */
    const cJSON *j;
    ust_err *e;
} jctx;

static const cJSON *jget(const jctx *x, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(x->j, key);
    return cJSON_IsNull(v) ? NULL : v;
}

/* An integer key in [lo, INT_MAX]; absent or null: def, or an error when def < 0. */
static int jint(const jctx *x, const char *key, int def, int lo, int *out) {
    const cJSON *v = jget(x, key);
    if (!v && def >= 0) {
        *out = def;
        return 0;
    }
    if (!v) return ust_errf(x->e, "%s: '%s' is missing", x->path, key);
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d >= lo && d <= INT_MAX) || d != floor(d)) {
        char *s = cJSON_PrintUnformatted(v);
        ust_errf(x->e, "%s: '%s' = %.60s is not an integer in [%d, %d]", x->path, key, s ? s : "?",
                 lo, INT_MAX);
        free(s);
        return -1;
    }
    *out = (int)d;
    return 0;
}

static int jdbl(const jctx *x, const char *key, double def, double *out) {
    const cJSON *v = jget(x, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return ust_errf(x->e, "%s: '%s' is not a finite number", x->path, key);
    *out = v->valuedouble;
    return 0;
}

static int jbool(const jctx *x, const char *key, bool def, bool *out) {
    const cJSON *v = jget(x, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v)) return ust_errf(x->e, "%s: '%s' is not true or false", x->path, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* A string key; absent or null: def. */
static int jstr(const jctx *x, const char *key, const char *def, const char **out) {
    const cJSON *v = jget(x, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsString(v)) return ust_errf(x->e, "%s: '%s' is not a string", x->path, key);
    *out = v->valuestring;
    return 0;
}

/* What ustrain cannot compute exactly as transformers does is refused, not approximated. */
static int refuse_true(const jctx *x, const char *key, const char *why) {
    bool b = false;
    if (jbool(x, key, false, &b)) return -1;
    if (b) return ust_errf(x->e, "%s: '%s': true is not supported (%s)", x->path, key, why);
    return 0;
}

/* YaRN (transformers' _compute_yarn_parameters): factor (null: max_position_embeddings /
 * original), original_max_position_embeddings (default: max_position_embeddings), beta_fast,
 * beta_slow, truncate, and attention_factor or, absent, mscale / mscale_all_dim (both set:
 * mscale(factor, mscale) / mscale(factor, mscale_all_dim); else 0.1 ln(factor) + 1). */
static double yarn_mscale(double factor, double m) {
    return factor <= 1 ? 1.0 : 0.1 * m * log(factor) + 1.0;
}

static int parse_yarn(const jctx *x, const jctx *y, ust_config *c) {
    __typeof__(c->model.rope_scaling) *s = &c->model.rope_scaling;
    int maxpos = 0;
    double ms = 0, msa = 0;
    s->type = ROPE_YARN;
    if (jint(x, "max_position_embeddings", -1, 1, &maxpos) ||
        jint(y, "original_max_position_embeddings", maxpos, 1,
             &s->original_max_position_embeddings) ||
        jdbl(y, "factor", (double)maxpos / s->original_max_position_embeddings, &s->factor) ||
        jdbl(y, "beta_fast", 32, &s->beta_fast) || jdbl(y, "beta_slow", 1, &s->beta_slow) ||
        jbool(y, "truncate", true, &s->truncate) || jdbl(y, "mscale", 0, &ms) ||
        jdbl(y, "mscale_all_dim", 0, &msa) || jdbl(y, "attention_factor", 0, &s->attention_factor))
        return -1;
    if (!(s->factor >= 1))
        return ust_errf(x->e, "%s: rope yarn factor = %g: expected at least 1", x->path, s->factor);
    if (!jget(y, "attention_factor") && ms && msa)
        s->attention_factor = yarn_mscale(s->factor, ms) / yarn_mscale(s->factor, msa);
    if (jget(y, "partial_rotary_factor") || jget(x, "partial_rotary_factor"))
        return ust_errf(x->e,
                        "%s: 'partial_rotary_factor' is not supported (ustrain rotates the "
                        "whole head)",
                        x->path);
    return 0;
}

/* RoPE: transformers 4 writes rope_theta and rope_scaling (null, or {rope_type/type, ...});
 * transformers 5 one rope_parameters {rope_type, rope_theta, ...}. ustrain computes no scaling
 * ("default") or Llama 3.1's "llama3". */
static int parse_rope(const jctx *x, ust_config *c, double theta) {
    const cJSON *r = jget(x, "rope_parameters");
    const char *key = r ? "rope_parameters" : "rope_scaling";
    if (!r) r = jget(x, "rope_scaling");
    if (r && !cJSON_IsObject(r)) return ust_errf(x->e, "%s: '%s' is not an object", x->path, key);
    jctx y = {x->path, r, x->e};
    const char *type = "default";
    if (r && jstr(&y, "rope_type", NULL, &type)) return -1;
    if (r && !type && jstr(&y, "type", "default", &type)) return -1;
    if (jdbl(x, "rope_theta", theta, &theta) || (r && jdbl(&y, "rope_theta", theta, &theta)))
        return -1;
    c->model.rope_theta = theta;
    if (!strcmp(type, "default")) return 0;
    if (!strcmp(type, "yarn")) return parse_yarn(x, &y, c);
    if (!strcmp(type, "linear")) { /* every frequency / factor */
        c->model.rope_scaling.type = ROPE_LINEAR;
        return jdbl(&y, "factor", 1, &c->model.rope_scaling.factor);
    }
    if (strcmp(type, "llama3"))
        return ust_errf(x->e,
                        "%s: %s rope_type '%.60s' is not supported (ustrain's RoPE has no "
                        "scaling ('default'), Llama 3.1's 'llama3', 'yarn' or 'linear')",
                        x->path, key, type);
    __typeof__(c->model.rope_scaling) *s = &c->model.rope_scaling;
    s->type = ROPE_LLAMA3;
    return jdbl(&y, "factor", 8, &s->factor) ||
                   jdbl(&y, "low_freq_factor", 1, &s->low_freq_factor) ||
                   jdbl(&y, "high_freq_factor", 4, &s->high_freq_factor) ||
                   jint(&y, "original_max_position_embeddings", 8192, 1,
                        &s->original_max_position_embeddings)
               ? -1
               : 0;
}

/* The keys LlamaForCausalLM, Qwen2ForCausalLM and MixtralForCausalLM share. */
static int parse_llama_common(const jctx *x, ust_config *c, double theta, double eps) {
    __typeof__(c->model) *m = &c->model;
    m->arch = ARCH_LLAMA;
    int head_dim = 0;
    const char *act = "";
    if (jint(x, "hidden_size", -1, 1, &m->d_model) ||
        jint(x, "intermediate_size", -1, 1, &m->d_ff) ||
        jint(x, "num_hidden_layers", -1, 1, &m->n_layer) ||
        jint(x, "num_attention_heads", -1, 1, &m->n_head) ||
        jint(x, "num_key_value_heads", m->n_head, 1, &m->n_kv_head) ||
        jint(x, "vocab_size", -1, 1, &m->vocab_size) ||
        jint(x, "max_position_embeddings", -1, 1, &m->max_seq_len) ||
        jdbl(x, "rms_norm_eps", eps, &m->norm_eps) ||
        jbool(x, "tie_word_embeddings", false, &m->tie_embeddings) ||
        jstr(x, "hidden_act", "silu", &act) || parse_rope(x, c, theta))
        return -1;
    if (strcmp(act, "silu"))
        return ust_errf(x->e, "%s: hidden_act '%.60s' is not supported (ustrain's llama uses silu)",
                        x->path, act);
    int want = m->d_model / m->n_head;
    if (jint(x, "head_dim", want, 1, &head_dim)) return -1;
    if (head_dim != want || m->d_model % m->n_head)
        return ust_errf(x->e,
                        "%s: head_dim %d is not hidden_size / num_attention_heads = %d / %d "
                        "(ustrain needs head_dim * heads = hidden_size)",
                        x->path, head_dim, m->d_model, m->n_head);
    return 0;
}

static int parse_llama(const jctx *x, ust_config *c) {
    if (parse_llama_common(x, c, 10000, 1e-6)) return -1;
    return refuse_true(x, "attention_bias", "LlamaForCausalLM with attention biases on q/k/v/o") ||
                   refuse_true(x, "mlp_bias", "LlamaForCausalLM with MLP biases")
               ? -1
               : 0;
}

/* model.sliding_window from the layers that attend through a window of W keys (windowed[l]):
 * "W" when every layer does, else one entry per layer, max_seq_len standing for full attention. */
static int set_windows(const jctx *x, ust_config *c, int W, const bool *windowed) {
    __typeof__(c->model) *m = &c->model;
    int all = 1, any = 0;
    for (int l = 0; l < m->n_layer; l++) all &= windowed[l], any |= windowed[l];
    m->sliding_window[0] = 0;
    if (!any) return 0;
    if (W < 1)
        return ust_errf(x->e, "%s: 'sliding_window' = %d: a window is at least 1 key", x->path, W);
    size_t n = 0, cap = sizeof m->sliding_window;
    for (int l = 0; l < (all ? 1 : m->n_layer) && n < cap; l++)
        n += (size_t)snprintf(m->sliding_window + n, cap - n, "%s%d", l ? "," : "",
                              windowed[l] ? W : m->max_seq_len);
    if (n >= cap)
        return ust_errf(x->e, "%s: the windows of %d layers do not fit model.sliding_window",
                        x->path, m->n_layer);
    return 0;
}

/* Which layers slide a window (transformers 5's layer_types, else the architecture's rule in
 * windowed[]) and how wide (sliding_window). */
static int parse_windows(const jctx *x, ust_config *c, bool *windowed) {
    int n = c->model.n_layer, W = 0, any = 0, i = 0;
    const cJSON *types = jget(x, "layer_types"), *t;
    if (types && (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != n))
        return ust_errf(x->e, "%s: 'layer_types' is not a list of num_hidden_layers = %d entries",
                        x->path, n);
    cJSON_ArrayForEach(t, types) {
        const char *v = cJSON_IsString(t) ? t->valuestring : "not a string";
        if (strcmp(v, "full_attention") && strcmp(v, "sliding_attention"))
            return ust_errf(x->e,
                            "%s: layer_types[%d] is %.60s; ustrain computes 'full_attention' and "
                            "'sliding_attention'",
                            x->path, i, v);
        windowed[i++] = !strcmp(v, "sliding_attention");
    }
    for (i = 0; i < n; i++) any |= windowed[i];
    if (any && jint(x, "sliding_window", -1, INT_MIN + 1, &W)) return -1;
    return set_windows(x, c, W, windowed);
}

/* Qwen2, Qwen3: with use_sliding_window the layers from max_window_layers on slide a window;
 * Mistral, Mixtral (every = 1): a sliding_window that is not null is every layer's. */
static int windows_of(const jctx *x, ust_config *c, int every) {
    bool use = false;
    int mwl = 0, n = c->model.n_layer;
    if (!every &&
        (jbool(x, "use_sliding_window", false, &use) || jint(x, "max_window_layers", n, 0, &mwl)))
        return -1;
    bool *w = calloc((size_t)n, sizeof *w);
    if (!w) return ust_errf(x->e, "out of memory");
    for (int l = 0; l < n; l++) w[l] = every ? jget(x, "sliding_window") != NULL : use && l >= mwl;
    int rc = parse_windows(x, c, w);
    free(w);
    return rc;
}

static int parse_qwen2(const jctx *x, ust_config *c) {
    if (parse_llama_common(x, c, 10000, 1e-6)) return -1;
    c->model.qkv_bias = true;
    return windows_of(x, c, 0);
}

/* Mistral: a llama whose layers may slide a window (sliding_window; null: full attention). */
static int parse_mistral(const jctx *x, ust_config *c) {
    if (parse_llama_common(x, c, 10000, 1e-6)) return -1;
    return refuse_true(x, "attention_bias", "MistralForCausalLM with attention biases") ||
                   windows_of(x, c, 1)
               ? -1
               : 0;
}

/* Qwen3: a llama with RMSNorm over each head's q and k before RoPE (q_norm, k_norm), no biases
 * (attention_bias would put them on o_proj too, which ustrain's llama has not). */
static int parse_qwen3(const jctx *x, ust_config *c) {
    if (parse_llama_common(x, c, 10000, 1e-6)) return -1;
    c->model.qk_norm = true;
    return refuse_true(x, "attention_bias", "Qwen3ForCausalLM with q/k/v/o biases") ||
                   windows_of(x, c, 0)
               ? -1
               : 0;
}

/* DeepSeek-V3's MoE layers (transformers' DeepseekV3MoE): layers from first_k_dense_replace on
 * (model.moe.first_dense), n_routed_experts of moe_intermediate_size, sigmoid scores
 * (model.moe.score) whose correction bias picks the top-k only, group-limited (n_group /
 * topk_group), the gates renormalized (norm_topk_prob) and scaled (routed_scaling_factor), one
 * shared MLP of n_shared_experts x moe_intermediate_size (model.moe.shared_d_ff). transformers
 * computes no auxiliary loss for it, so aux_loss_coef is 0. The remote-code keys that would route
 * otherwise (scoring_func, topk_method, moe_layer_freq) are refused unless they say the same. */
static int parse_deepseek_moe(const jctx *x, ust_config *c, int dense) {
    __typeof__(c->model.moe) *moe = &c->model.moe;
    int shared = 1, freq = 1;
    const char *fn = "sigmoid", *method = "noaux_tc";
    if (jint(x, "n_routed_experts", 256, 1, &moe->num_experts) ||
        jint(x, "num_experts_per_tok", 8, 1, &moe->top_k) ||
        jint(x, "moe_intermediate_size", 2048, 1, &moe->d_ff_expert) ||
        jint(x, "n_shared_experts", 1, 0, &shared) || jint(x, "n_group", 1, 1, &moe->n_group) ||
        jint(x, "topk_group", 1, 1, &moe->topk_group) ||
        jdbl(x, "routed_scaling_factor", 2.5, &moe->routed_scale) ||
        jbool(x, "norm_topk_prob", true, &moe->norm_topk) || jstr(x, "scoring_func", fn, &fn) ||
        jstr(x, "topk_method", method, &method) || jint(x, "moe_layer_freq", 1, 1, &freq))
        return -1;
    if (strcmp(fn, "sigmoid") || strcmp(method, "noaux_tc") || freq != 1)
        return ust_errf(x->e,
                        "%s: scoring_func '%.40s', topk_method '%.40s', moe_layer_freq %d: "
                        "DeepseekV3ForCausalLM routes by sigmoid scores with the correction bias "
                        "('sigmoid', 'noaux_tc') in every layer from first_k_dense_replace on (1)",
                        x->path, fn, method, freq);
    if (!shared || (int64_t)shared * moe->d_ff_expert > (1 << 22))
        return ust_errf(x->e,
                        "%s: 'n_shared_experts' = %d: ustrain's DeepSeek MoE layer has one shared "
                        "MLP of n_shared_experts x moe_intermediate_size (%d), 1 to %d wide",
                        x->path, shared, moe->d_ff_expert, 1 << 22);
    if (!(moe->routed_scale > 0))
        return ust_errf(x->e, "%s: 'routed_scaling_factor' = %g: expected a value > 0", x->path,
                        moe->routed_scale);
    moe->first_dense = dense;
    moe->every = 1;
    moe->score = MOE_SIGMOID;
    moe->shared_expert = true;
    moe->shared_d_ff = shared * moe->d_ff_expert;
    moe->aux_loss_coef = 0;
    return 0;
}

/* DeepSeek-V3 (and V2's layout): a llama whose attention is multi-head latent attention
 * (model.mla), its layers from first_k_dense_replace on DeepSeek MoE layers (parse_deepseek_moe).
 * head_dim there is qk_rope_head_dim, not a q/k head, so parse_llama_common reads a copy without
 * it. */
static int parse_deepseek_v3(const jctx *x, ust_config *c) {
    __typeof__(c->model) *m = &c->model;
    __typeof__(m->mla) *a = &m->mla;
    cJSON *copy = cJSON_Duplicate(x->j, 1);
    if (!copy) return ust_errf(x->e, "%s: out of memory", x->path);
    cJSON_DeleteItemFromObjectCaseSensitive(copy, "head_dim");
    jctx y = {x->path, copy, x->e};
    int rc = parse_llama_common(&y, c, 10000, 1e-6);
    cJSON_Delete(copy);
    if (rc) return -1;
    a->enabled = true;
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(x->j, "q_lora_rank");
    if (!q) return ust_errf(x->e, "%s: 'q_lora_rank' is missing (null: no q compression)", x->path);
    int dense = 0;
    if ((!cJSON_IsNull(q) && jint(x, "q_lora_rank", -1, 1, &a->q_lora_rank)) ||
        jint(x, "kv_lora_rank", -1, 1, &a->kv_lora_rank) ||
        jint(x, "qk_nope_head_dim", -1, 1, &a->qk_nope_head_dim) ||
        jint(x, "qk_rope_head_dim", -1, 1, &a->qk_rope_head_dim) ||
        jint(x, "v_head_dim", -1, 1, &a->v_head_dim) ||
        jbool(x, "rope_interleave", true, &a->rope_interleave) ||
        jint(x, "first_k_dense_replace", 3, 0, &dense) ||
        jint(x, "num_nextn_predict_layers", 0, 0, &m->mtp.depth) ||
        refuse_true(x, "attention_bias", "DeepseekV3ForCausalLM with q/kv/o biases"))
        return -1;
    /* the MTP layers (model.mtp): their blocks are MoE layers in a model with MoE layers (past
     * first_k_dense_replace, as DeepSeek's), else dense, as cfg_layer_is_moe makes them */
    if (m->mtp.depth > 4)
        return ust_errf(x->e,
                        "%s: 'num_nextn_predict_layers' = %d: ustrain imports up to 4 multi-token "
                        "prediction layers",
                        x->path, m->mtp.depth);
    const cJSON *r =
        jget(x, "rope_parameters") ? jget(x, "rope_parameters") : jget(x, "rope_scaling");
    jctx rs = {x->path, r, x->e}; /* yarn_apply_mscale: any scaling but 'default' */
    if (r && m->rope_scaling.type != ROPE_NONE &&
        jdbl(&rs, "mscale_all_dim", 0, &a->mscale_all_dim))
        return -1;
    return dense < m->n_layer ? parse_deepseek_moe(x, c, dense) : 0;
}

/* OLMo 2: a llama whose q_norm/k_norm span the whole q and k projections and whose norms follow
 * attention and the MLP (post_attention_layernorm, post_feedforward_layernorm), no input norm. */
static int parse_olmo2(const jctx *x, ust_config *c) {
    if (parse_llama_common(x, c, 10000, 1e-5)) return -1;
    c->model.qk_norm = c->model.qk_norm_whole = c->model.post_norm = true;
    return refuse_true(x, "attention_bias", "Olmo2ForCausalLM with q/k/v/o biases") ? -1 : 0;
}

/* Gemma 3's RoPE, one per layer kind. transformers 5: rope_parameters {full_attention: {rope_type,
 * rope_theta, factor}, sliding_attention: {...}}; 4: rope_theta, rope_local_base_freq and
 * rope_scaling (the global layers'). The global layers may scale linearly; the local do not. */
static int gemma3_rope_kind(const jctx *x, const cJSON *r, const char *kind, double theta,
                            double *out, ust_config *c) {
    jctx y = {x->path, r, x->e};
    const char *type = "default";
    if (r && !cJSON_IsObject(r))
        return ust_errf(x->e, "%s: rope_parameters.%s is not an object", x->path, kind);
    if (r && (jstr(&y, "rope_type", NULL, &type) || (!type && jstr(&y, "type", "default", &type)) ||
              jdbl(&y, "rope_theta", theta, &theta)))
        return -1;
    *out = theta;
    int global = !strcmp(kind, "full_attention");
    if (!strcmp(type, "default")) return 0;
    if (strcmp(type, "linear") || !global)
        return ust_errf(x->e,
                        "%s: %s rope_type '%.60s' is not supported (ustrain imports Gemma 3 with "
                        "'default' RoPE, and 'linear' scaling on its full-attention layers)",
                        x->path, kind, type);
    c->model.rope_scaling.type = ROPE_LINEAR;
    return jdbl(&y, "factor", 1, &c->model.rope_scaling.factor);
}

static int gemma3_rope(const jctx *x, ust_config *c) {
    __typeof__(c->model) *m = &c->model;
    const cJSON *p = jget(x, "rope_parameters");
    double g = 1e6, l = 1e4; /* Gemma3TextConfig.default_theta */
    if (jdbl(x, "rope_theta", g, &g) || jdbl(x, "rope_local_base_freq", l, &l)) return -1;
    if (p && cJSON_IsObject(p) && !cJSON_GetObjectItemCaseSensitive(p, "full_attention"))
        return ust_errf(x->e, "%s: rope_parameters without full_attention / sliding_attention",
                        x->path);
    const cJSON *full =
        p ? cJSON_GetObjectItemCaseSensitive(p, "full_attention") : jget(x, "rope_scaling");
    const cJSON *local = p ? cJSON_GetObjectItemCaseSensitive(p, "sliding_attention") : NULL;
    if (gemma3_rope_kind(x, full, "full_attention", g, &m->rope_theta, c) ||
        gemma3_rope_kind(x, local, "sliding_attention", l, &m->gemma.rope_local_theta, c))
        return -1;
    if (!m->sliding_window[0]) m->gemma.rope_local_theta = 0; /* no local layer */
    return 0;
}

/* A float key that must be null or absent (Gemma 2's soft-capping, which ustrain omits). */
static int refuse_set(const jctx *x, const char *key, const char *why) {
    const cJSON *v = jget(x, key);
    if (!v) return 0;
    char *t = cJSON_PrintUnformatted(v);
    ust_errf(x->e, "%s: '%s' = %.40s is not supported (%s; null is)", x->path, key, t ? t : "?",
             why);
    free(t);
    return -1;
}

/* A Gemma 2 soft-cap: absent, def (Gemma2Config's 50 and 30; Gemma 3's none); null, none; or
 * c > 0 for x -> c tanh(x / c): 0 and negative values divide by zero or flip the sign there. */
static int jcap(const jctx *x, const char *key, double def, double *out) {
    if (jdbl(x, key, 0, out)) return -1;
    if (!cJSON_GetObjectItemCaseSensitive(x->j, key)) *out = def;
    if (jget(x, key) && !(*out > 0))
        return ust_errf(x->e, "%s: '%s' = %g: expected a positive number, or null (no cap)",
                        x->path, key, *out);
    return 0;
}

/* What Gemma 2 and Gemma 3 share: parse_llama_common on a copy without head_dim and hidden_act
 * (Gemma's MLP reads hidden_activation), and for Gemma 3 without the RoPE keys (gemma3_rope reads
 * them); head_dim of its own, tied embeddings, logits scaled by query_pre_attn_scalar^-1/2, GeGLU,
 * RMSNorms by (1 + w) before and after attention and the MLP, embeddings x sqrt(hidden_size). */
static int parse_gemma_common(const jctx *x, ust_config *c, const char *arch, int gemma3) {
    __typeof__(c->model) *m = &c->model;
    cJSON *copy = cJSON_Duplicate(x->j, 1);
    if (!copy) return ust_errf(x->e, "%s: out of memory", x->path);
    const char *drop[] = {"head_dim", "hidden_act", "rope_parameters", "rope_scaling",
                          "rope_theta"};
    for (size_t i = 0; i < (gemma3 ? sizeof drop / sizeof drop[0] : 2); i++)
        cJSON_DeleteItemFromObjectCaseSensitive(copy, drop[i]);
    jctx y = {x->path, copy, x->e};
    int rc = parse_llama_common(&y, c, gemma3 ? 1e6 : 1e4, 1e-6);
    cJSON_Delete(copy);
    const char *act = "";
    char bias[64];
    snprintf(bias, sizeof bias, "%s with q/k/v/o biases", arch);
    if (rc || jint(x, "head_dim", 256, 1, &m->head_dim) ||
        jbool(x, "tie_word_embeddings", true, &m->tie_embeddings) ||
        jdbl(x, "query_pre_attn_scalar", 256, &m->gemma.query_pre_attn_scalar) ||
        jstr(x, "hidden_activation", "gelu_pytorch_tanh", &act) ||
        refuse_true(x, "attention_bias", bias) ||
        refuse_true(x, "use_bidirectional_attention", "ustrain's attention is causal"))
        return -1;
    if (strcmp(act, "gelu_pytorch_tanh") && strcmp(act, "gelu_tanh"))
        return ust_errf(x->e,
                        "%s: hidden_activation '%.60s' is not supported (ustrain's GeGLU is "
                        "gelu_pytorch_tanh)",
                        x->path, act);
    if (!(m->gemma.query_pre_attn_scalar > 0))
        return ust_errf(x->e, "%s: query_pre_attn_scalar = %g: expected > 0", x->path,
                        m->gemma.query_pre_attn_scalar);
    m->qk_norm = gemma3;
    m->gemma.norm_offset = m->gemma.sandwich_norm = m->gemma.embed_scale = true;
    m->gemma.hidden_act = HACT_GELU_TANH;
    return 0;
}

/* The local layers (windowed[l]) and their window; ustrain tells a local layer by its window, so
 * it must be below max_position_embeddings. */
static int gemma_windows(const jctx *x, ust_config *c, bool *windowed) {
    __typeof__(c->model) *m = &c->model;
    if (parse_windows(x, c, windowed)) return -1;
    int W = 0;
    for (int l = 0; l < m->n_layer; l++) W |= cfg_layer_window(c, l);
    if (m->sliding_window[0] && !W)
        return ust_errf(x->e,
                        "%s: 'sliding_window' is not below max_position_embeddings = %d: the "
                        "local layers would attend fully, which ustrain cannot tell from global "
                        "ones",
                        x->path, m->max_seq_len);
    return 0;
}

/* Gemma 3 (text): Gemma's block (parse_gemma_common) with q/k head norms, local (sliding) and
 * global layers from layer_types or sliding_window_pattern, with two RoPE bases (gemma3_rope);
 * attn_logit_softcapping is refused (transformers' Gemma 3 keeps it but never applies it). */
static int parse_gemma3(const jctx *x, ust_config *c) {
    __typeof__(c->model) *m = &c->model;
    int pattern = 6;
    if (parse_gemma_common(x, c, "Gemma3ForCausalLM", 1) ||
        jint(x, "sliding_window_pattern", 6, 1, &pattern) ||
        refuse_set(x, "attn_logit_softcapping",
                   "transformers' Gemma3ForCausalLM keeps it in its config but its attention "
                   "never applies it, so ustrain's model.attn_softcap would differ from it") ||
        jcap(x, "final_logit_softcapping", 0, &m->gemma.final_softcap))
        return -1;
    bool *w = calloc((size_t)m->n_layer, sizeof *w); /* (l + 1) % pattern: local, else global */
    if (!w) return ust_errf(x->e, "out of memory");
    for (int l = 0; l < m->n_layer; l++) w[l] = (l + 1) % pattern != 0;
    int rc = gemma_windows(x, c, w);
    free(w);
    return rc ? -1 : gemma3_rope(x, c);
}

/* Gemma 2: Gemma's block (parse_gemma_common) without q/k norms, one RoPE (rope_theta, or
 * rope_parameters; no scaling but linear), the local layers from layer_types or else the even
 * ones (transformers 4's Gemma2 slides a window where layer_idx % 2 == 0, 5's default layer_types
 * the same), and both soft-caps (absent: Gemma2Config's 50 and 30; null: none). */
static int parse_gemma2(const jctx *x, ust_config *c) {
    __typeof__(c->model) *m = &c->model;
    if (parse_gemma_common(x, c, "Gemma2ForCausalLM", 0) ||
        jcap(x, "attn_logit_softcapping", 50, &m->gemma.attn_softcap) ||
        jcap(x, "final_logit_softcapping", 30, &m->gemma.final_softcap))
        return -1;
    int rt = m->rope_scaling.type;
    if (rt != ROPE_NONE && rt != ROPE_LINEAR)
        return ust_errf(x->e,
                        "%s: rope_type '%s' is not supported for Gemma2ForCausalLM (ustrain "
                        "imports it with 'default' RoPE or 'linear' scaling)",
                        x->path, rt == ROPE_YARN ? "yarn" : "llama3");
    bool *w = calloc((size_t)m->n_layer, sizeof *w);
    if (!w) return ust_errf(x->e, "out of memory");
    for (int l = 0; l < m->n_layer; l++) w[l] = l % 2 == 0;
    int rc = gemma_windows(x, c, w);
    free(w);
    return rc;
}

/* Gemma3ForConditionalGeneration: the vision tower is refused; its text model imports as
 * Gemma3ForCausalLM once saved alone. */
static int parse_gemma3_vision(const jctx *x, ust_config *c) {
    (void)c;
    return ust_errf(x->e,
                    "%s: 'vision_config' (Gemma3ForConditionalGeneration's vision tower) is not "
                    "supported: ustrain imports Gemma 3's text model, Gemma3ForCausalLM",
                    x->path);
}

static int parse_mixtral(const jctx *x, ust_config *c) {
    __typeof__(c->model.moe) *moe = &c->model.moe;
    if (parse_llama_common(x, c, 1e6, 1e-5)) return -1;
    if (windows_of(x, c, 1)) return -1;
    moe->d_ff_expert = c->model.d_ff;
    moe->every = 1; /* every Mixtral layer is a mixture of experts, none shared */
    moe->shared_expert = false;
    /* the coefficient ustrain implements (MixtralConfig's default 0.001; Mixtral has no z-loss);
     * how ustrain's aux term relates to transformers' load_balancing_loss_func: docs/huggingface.md
     */
    if (jdbl(x, "router_aux_loss_coef", 0.001, &moe->aux_loss_coef)) return -1;
    if (!(moe->aux_loss_coef >= 0 && isfinite(moe->aux_loss_coef)))
        return ust_errf(x->e, "%s: router_aux_loss_coef = %g: expected a finite value >= 0",
                        x->path, moe->aux_loss_coef);
    return jint(x, "num_local_experts", -1, 1, &moe->num_experts) ||
                   jint(x, "num_experts_per_tok", -1, 1, &moe->top_k)
               ? -1
               : 0;
}

/* Qwen3-MoE: Qwen3's attention; layer l is sparse unless listed in mlp_only_layers, and only
 * when (l + 1) % decoder_sparse_step == 0 (model.moe.layers, one 0/1 per layer); the dense
 * layers' MLP is intermediate_size wide, the experts moe_intermediate_size; softmax top-k,
 * renormalized under norm_topk_prob; no shared expert. */
static int parse_qwen3_moe(const jctx *x, ust_config *c) {
    __typeof__(c->model.moe) *moe = &c->model.moe;
    int step = 1, n = 0, i = 0;
    if (parse_llama_common(x, c, 10000, 1e-6)) return -1;
    c->model.qk_norm = true;
    if (refuse_true(x, "attention_bias", "Qwen3MoeForCausalLM with q/k/v/o biases") ||
        refuse_true(x, "use_sliding_window", "ustrain imports Qwen3-MoE with full attention") ||
        jint(x, "moe_intermediate_size", -1, 1, &moe->d_ff_expert) ||
        jint(x, "num_experts_per_tok", -1, 1, &moe->top_k) ||
        jint(x, "decoder_sparse_step", 1, 1, &step) ||
        jbool(x, "norm_topk_prob", false, &moe->norm_topk) ||
        jdbl(x, "router_aux_loss_coef", 0.001, &moe->aux_loss_coef))
        return -1;
    const char *ne = jget(x, "num_experts") ? "num_experts" : "num_local_experts";
    if (jint(x, ne, -1, 1, &moe->num_experts)) return -1;
    if (!(moe->aux_loss_coef >= 0 && isfinite(moe->aux_loss_coef)))
        return ust_errf(x->e, "%s: router_aux_loss_coef = %g: expected a finite value >= 0",
                        x->path, moe->aux_loss_coef);
    moe->every = 1;
    moe->shared_expert = false;
    int L = c->model.n_layer;
    char *sparse = calloc((size_t)L, 1);
    if (!sparse) return ust_errf(x->e, "out of memory");
    for (int l = 0; l < L; l++) sparse[l] = (l + 1) % step == 0;
    const cJSON *only = jget(x, "mlp_only_layers"), *t;
    if (only && !cJSON_IsArray(only)) {
        free(sparse);
        return ust_errf(x->e, "%s: 'mlp_only_layers' is not a list of layer indices", x->path);
    }
    cJSON_ArrayForEach(t, only) {
        if (!cJSON_IsNumber(t) || t->valuedouble != (int)t->valuedouble || t->valueint < 0 ||
            t->valueint >= L) {
            free(sparse);
            return ust_errf(x->e, "%s: mlp_only_layers[%d] is not a layer index in 0..%d", x->path,
                            i, L - 1);
        }
        sparse[t->valueint] = 0, i++;
    }
    size_t cap = sizeof moe->layers, off = 0;
    moe->layers[0] = 0;
    for (int l = 0; l < L; l++) n += sparse[l];
    for (int l = 0; n < L && (size_t)L * 2 <= cap && l < L; l++) /* all sparse: "" */
        off += (size_t)snprintf(moe->layers + off, cap - off, "%s%d", l ? "," : "", sparse[l]);
    free(sparse);
    if (n < L && (size_t)L * 2 > cap)
        return ust_errf(x->e, "%s: the sparse layers of %d layers do not fit model.moe.layers",
                        x->path, L);
    return 0;
}

static int parse_gpt2(const jctx *x, ust_config *c) {
    __typeof__(c->model) *m = &c->model;
    m->arch = ARCH_GPT2;
    const char *act = "";
    bool scaled = true, tied = true;
    if (jint(x, "n_embd", -1, 1, &m->d_model) || jint(x, "n_layer", -1, 1, &m->n_layer) ||
        jint(x, "n_head", -1, 1, &m->n_head) || jint(x, "vocab_size", -1, 1, &m->vocab_size) ||
        jint(x, "n_positions", -1, 1, &m->max_seq_len) ||
        jdbl(x, "layer_norm_epsilon", 1e-5, &m->norm_eps) ||
        jstr(x, "activation_function", "gelu_new", &act) ||
        jbool(x, "scale_attn_weights", true, &scaled) ||
        jbool(x, "tie_word_embeddings", true, &tied) ||
        refuse_true(x, "scale_attn_by_inverse_layer_idx", "ustrain scales by 1/sqrt(head_dim)"))
        return -1;
    if (m->d_model > INT_MAX / 4) return ust_errf(x->e, "%s: n_embd is too large", x->path);
    if (jint(x, "n_inner", 4 * m->d_model, 1, &m->d_ff)) return -1;
    m->n_kv_head = m->n_head; /* GPT-2 has no grouped-query attention */
    m->tie_embeddings = true;
    if (strcmp(act, "gelu_new"))
        return ust_errf(x->e,
                        "%s: activation_function '%.60s' is not supported (ustrain's gpt2 computes "
                        "gelu_new, the tanh approximation)",
                        x->path, act);
    if (!scaled || !tied)
        return ust_errf(x->e, "%s: %s: false is not supported (GPT-2 as ustrain computes it)",
                        x->path, !scaled ? "scale_attn_weights" : "tie_word_embeddings");
    return 0;
}

static const struct {
    const char *arch, *model_type;
    int (*parse)(const jctx *x, ust_config *c);
} ARCHS[] = {
    // clang-format off
    {"LlamaForCausalLM", "llama", parse_llama},
    {"Qwen2ForCausalLM", "qwen2", parse_qwen2},
    {"Qwen3ForCausalLM", "qwen3", parse_qwen3},
    {"MistralForCausalLM", "mistral", parse_mistral},
    {"MixtralForCausalLM", "mixtral", parse_mixtral},
    {"Qwen3MoeForCausalLM", "qwen3_moe", parse_qwen3_moe},
    {"Olmo2ForCausalLM", "olmo2", parse_olmo2},
    {"GPT2LMHeadModel", "gpt2", parse_gpt2},
    {"DeepseekV3ForCausalLM", "deepseek_v3", parse_deepseek_v3},
    {"Gemma3ForCausalLM", "gemma3_text", parse_gemma3},
    {"Gemma3ForConditionalGeneration", "gemma3", parse_gemma3_vision},
    {"Gemma2ForCausalLM", "gemma2", parse_gemma2},
    // clang-format on
};

/* The architecture is architectures[0], or else model_type; the result is checked by cfg_validate
 * as a run's config would be (ranges, heads by kv heads, ...). */
int hf_config_parse(const cJSON *j, const char *path, ust_config *c, char *arch, size_t cap,
                    ust_err *e) {
    jctx x = {path, j, e};
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const char *name = cJSON_IsArray(a) && cJSON_IsString(cJSON_GetArrayItem(a, 0))
                           ? cJSON_GetArrayItem(a, 0)->valuestring
                           : NULL;
    const char *type = NULL;
    if (!name && jstr(&x, "model_type", NULL, &type)) return -1;
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++)
        if ((name && !strcmp(name, ARCHS[i].arch)) ||
            (type && !strcmp(type, ARCHS[i].model_type))) {
            snprintf(arch, cap, "%s", ARCHS[i].arch);
            cfg_defaults(c);
            if (ARCHS[i].parse(&x, c)) return -1;
            c->train.seq_len = 1 + c->model.mtp.depth; /* the model's own checks only */
            snprintf(c->source, sizeof c->source, "%.*s", (int)sizeof c->source - 1, path);
            return cfg_validate(c, 0, e);
        }
    return ust_errf(e,
                    "%s: architecture '%.80s' is not supported (ustrain imports LlamaForCausalLM, "
                    "Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, MixtralForCausalLM, "
                    "Qwen3MoeForCausalLM, Olmo2ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, "
                    "GPT2LMHeadModel "
                    "and DeepseekV3ForCausalLM)",
                    path,
                    name   ? name
                    : type ? type
                           : "(no architectures or model_type)");
}

/* ------------------------------------------------------------------ NUL in JSON strings */

/* The string starting after the quote at s[i]: returns the index of its closing quote (or n);
 * *nul gets the index of its first \u0000 escape (or n). */
static size_t json_string_end(const char *s, size_t n, size_t i, size_t *nul) {
    *nul = n;
    for (; i < n && s[i] != '"'; i++) {
        if (s[i] != '\\' || i + 1 >= n) continue;
        if (*nul == n && s[i + 1] == 'u' && i + 5 < n && !memcmp(s + i + 2, "0000", 4)) *nul = i;
        i++; /* the escaped character (a quote or backslash among them) */
    }
    return i;
}

int hf_json_refuse_nul(const char *s, size_t n, const char *file, ust_err *e) {
    size_t key = 0, klen = 0; /* the last object key seen: s[key .. key + klen) */
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '"') continue;
        size_t start = i + 1, nul, end = json_string_end(s, n, start, &nul), j = end + 1;
        while (j < n && (s[j] == ' ' || s[j] == '\t' || s[j] == '\r' || s[j] == '\n')) j++;
        if (j < n && s[j] == ':') key = start, klen = end - start;
        if (nul < n) {
            int line = 1, col = 1;
            for (size_t k = 0; k < nul; k++) s[k] == '\n' ? (line++, col = 1) : col++;
            return ust_errf(e,
                            "%s:%d:%d: '%.*s' holds an escaped NUL (\\u0000) in \"%.*s\": names "
                            "and identifiers cannot contain NUL (it would cut the value short)",
                            file, line, col, klen ? (int)(klen > 80 ? 80 : klen) : 9,
                            klen ? s + key : "(the top)",
                            (int)(end - start > 80 ? 80 : end - start), s + start);
        }
        i = end;
    }
    return 0;
}

/* ------------------------------------------------------------------ the run's config */

typedef enum { V_INT, V_DBL, V_BOOL, V_ARCH, V_ROPE, V_TEXT } hf_vkind;

typedef struct {
    const char *key; /* ustrain's */
    const char *hf;  /* what config.json calls it, for messages */
    hf_vkind kind;
    size_t off;
} hf_key;

#define K(key, hf, kind, field)                                                                    \
    { key, hf, kind, offsetof(ust_config, field) }
static const hf_key SHAPE_KEYS[] = {
    K("model.arch", "architectures", V_ARCH, model.arch),
    K("model.n_layer", "num_hidden_layers / n_layer", V_INT, model.n_layer),
    K("model.d_model", "hidden_size / n_embd", V_INT, model.d_model),
    K("model.n_head", "num_attention_heads / n_head", V_INT, model.n_head),
    K("model.n_kv_head", "num_key_value_heads", V_INT, model.n_kv_head),
    K("model.vocab_size", "vocab_size", V_INT, model.vocab_size),
    K("model.max_seq_len", "max_position_embeddings / n_positions", V_INT, model.max_seq_len),
    K("model.rope_theta", "rope_theta", V_DBL, model.rope_theta),
    K("model.norm_eps", "rms_norm_eps / layer_norm_epsilon", V_DBL, model.norm_eps),
    K("model.tie_embeddings", "tie_word_embeddings", V_BOOL, model.tie_embeddings),
    K("model.qkv_bias", "architectures (Qwen2: q/k/v biases)", V_BOOL, model.qkv_bias),
    K("model.qk_norm", "architectures (Qwen3: q/k head norms)", V_BOOL, model.qk_norm),
    K("model.qk_norm_whole", "architectures (OLMo 2: q/k norms over all heads)", V_BOOL,
      model.qk_norm_whole),
    K("model.post_norm", "architectures (OLMo 2: norms after attention and the MLP)", V_BOOL,
      model.post_norm),
    K("model.sliding_window", "sliding_window / layer_types", V_TEXT, model.sliding_window),
    K("model.head_dim", "head_dim", V_INT, model.head_dim),
    K("model.hidden_act", "hidden_activation", V_INT, model.gemma.hidden_act),
    K("model.norm_offset", "architectures (Gemma 3: norms by 1 + w)", V_BOOL,
      model.gemma.norm_offset),
    K("model.sandwich_norm", "architectures (Gemma 3: pre and post norms)", V_BOOL,
      model.gemma.sandwich_norm),
    K("model.embed_scale", "architectures (Gemma 3: embeddings x sqrt(hidden_size))", V_BOOL,
      model.gemma.embed_scale),
    K("model.query_pre_attn_scalar", "query_pre_attn_scalar", V_DBL,
      model.gemma.query_pre_attn_scalar),
    K("model.rope_local_theta", "rope_local_base_freq / rope_parameters", V_DBL,
      model.gemma.rope_local_theta),
    K("model.attn_softcap", "attn_logit_softcapping", V_DBL, model.gemma.attn_softcap),
    K("model.final_softcap", "final_logit_softcapping", V_DBL, model.gemma.final_softcap),
    K("model.rope_scaling.type", "rope_scaling.rope_type", V_ROPE, model.rope_scaling.type),
    K("model.moe.num_experts", "num_local_experts / n_routed_experts", V_INT,
      model.moe.num_experts),
};
static const hf_key DENSE_KEYS[] = {
    K("model.d_ff", "intermediate_size / n_inner", V_INT, model.d_ff),
};
static const hf_key MOE_KEYS[] = {
    K("model.moe.top_k", "num_experts_per_tok", V_INT, model.moe.top_k),
    K("model.moe.d_ff_expert", "intermediate_size / moe_intermediate_size", V_INT,
      model.moe.d_ff_expert),
    K("model.moe.every", "(every Mixtral layer)", V_INT, model.moe.every),
    K("model.moe.shared_expert", "(Mixtral has none)", V_BOOL, model.moe.shared_expert),
    K("model.moe.layers", "decoder_sparse_step / mlp_only_layers", V_TEXT, model.moe.layers),
    K("model.moe.first_dense", "first_k_dense_replace (else 0)", V_INT, model.moe.first_dense),
    K("model.moe.norm_topk", "norm_topk_prob", V_BOOL, model.moe.norm_topk),
    K("model.moe.score", "scoring_func (Mixtral, Qwen3-MoE: softmax)", V_INT, model.moe.score),
    K("model.moe.n_group", "n_group (Mixtral, Qwen3-MoE: none)", V_INT, model.moe.n_group),
    K("model.moe.routed_scale", "routed_scaling_factor (1)", V_DBL, model.moe.routed_scale),
    K("model.moe.topk_group", "topk_group (1)", V_INT, model.moe.topk_group),
    K("model.moe.shared_d_ff", "n_shared_experts x moe_intermediate_size (0)", V_INT,
      model.moe.shared_d_ff),
};
/* a mixed model's dense layers */
static const hf_key MIXED_KEYS[] = {
    K("model.d_ff", "intermediate_size", V_INT, model.d_ff),
};
static const hf_key ROPE_KEYS[] = {
    K("model.rope_scaling.factor", "rope_scaling.factor", V_DBL, model.rope_scaling.factor),
    K("model.rope_scaling.original_max_position_embeddings",
      "rope_scaling.original_max_position_embeddings", V_INT,
      model.rope_scaling.original_max_position_embeddings),
};
static const hf_key LLAMA3_KEYS[] = {
    K("model.rope_scaling.low_freq_factor", "rope_scaling.low_freq_factor", V_DBL,
      model.rope_scaling.low_freq_factor),
    K("model.rope_scaling.high_freq_factor", "rope_scaling.high_freq_factor", V_DBL,
      model.rope_scaling.high_freq_factor),
};
static const hf_key YARN_KEYS[] = {
    K("model.rope_scaling.beta_fast", "rope_scaling.beta_fast", V_DBL,
      model.rope_scaling.beta_fast),
    K("model.rope_scaling.beta_slow", "rope_scaling.beta_slow", V_DBL,
      model.rope_scaling.beta_slow),
    K("model.rope_scaling.attention_factor", "rope_scaling.attention_factor", V_DBL,
      model.rope_scaling.attention_factor),
    K("model.rope_scaling.truncate", "rope_scaling.truncate", V_BOOL, model.rope_scaling.truncate),
};
static const hf_key MLA_KEYS[] = {
    K("model.mla.enabled", "architectures (DeepseekV3: latent attention)", V_BOOL,
      model.mla.enabled),
    K("model.mla.q_lora_rank", "q_lora_rank", V_INT, model.mla.q_lora_rank),
    K("model.mla.kv_lora_rank", "kv_lora_rank", V_INT, model.mla.kv_lora_rank),
    K("model.mla.qk_nope_head_dim", "qk_nope_head_dim", V_INT, model.mla.qk_nope_head_dim),
    K("model.mla.qk_rope_head_dim", "qk_rope_head_dim", V_INT, model.mla.qk_rope_head_dim),
    K("model.mla.v_head_dim", "v_head_dim", V_INT, model.mla.v_head_dim),
    K("model.mla.rope_interleave", "rope_interleave", V_BOOL, model.mla.rope_interleave),
    K("model.mla.mscale_all_dim", "rope_scaling.mscale_all_dim", V_DBL, model.mla.mscale_all_dim),
};
#undef K

static size_t vsize(hf_vkind k) {
    return k == V_DBL    ? sizeof(double)
           : k == V_BOOL ? sizeof(bool)
           : k == V_TEXT ? sizeof(((ust_config *)0)->model.sliding_window)
                         : sizeof(int);
}
_Static_assert(sizeof(((ust_config *)0)->model.sliding_window) ==
                   sizeof(((ust_config *)0)->model.moe.layers),
               "V_TEXT keys are one size");

static void vtext(const hf_key *k, const void *p, char *out, size_t n) {
    int i;
    double d;
    bool b;
    switch (k->kind) {
    case V_DBL:
        memcpy(&d, p, sizeof d), snprintf(out, n, "%.17g", d);
        break;
    case V_BOOL:
        memcpy(&b, p, sizeof b), snprintf(out, n, "%s", b ? "true" : "false");
        break;
    case V_TEXT:
        snprintf(out, n, "[%.60s]", (const char *)p);
        break;
    default:
        memcpy(&i, p, sizeof i);
        if (k->kind == V_ARCH)
            snprintf(out, n, "%s", i == ARCH_GPT2 ? "gpt2" : i == ARCH_LLAMA ? "llama" : "auto");
        else if (k->kind == V_ROPE)
            snprintf(out, n, "%s",
                     i == ROPE_LLAMA3   ? "llama3"
                     : i == ROPE_YARN   ? "yarn"
                     : i == ROPE_LINEAR ? "linear"
                                        : "none");
        else
            snprintf(out, n, "%d", i);
    }
}

static int apply_keys(const ust_config *hf, const char *dir, const hf_key *keys, size_t n,
                      ust_config *c, ust_err *e) {
    for (size_t i = 0; i < n; i++) {
        const hf_key *k = &keys[i];
        const char *from = (const char *)hf + k->off;
        char *to = (char *)c + k->off;
        int auto_arch = k->kind == V_ARCH && c->model.arch == ARCH_AUTO;
        int differ = k->kind == V_TEXT ? strcmp(from, to) != 0 : memcmp(from, to, vsize(k->kind));
        if (cfg_was_set(c, k->key) && !auto_arch && differ) {
            char have[64], want[64];
            vtext(k, to, have, sizeof have);
            vtext(k, from, want, sizeof want);
            return ust_errf(e, "%s: the config sets %s but %s/config.json (%s) says %s", k->key,
                            have, dir, k->hf, want);
        }
        memcpy(to, from, vsize(k->kind));
    }
    return 0;
}

int hf_config_apply(const ust_config *hf, const char *dir, ust_config *c, ust_err *e) {
    ust_config tmp = *c; /* a failure leaves c as it was */
    const __typeof__(hf->model) *m = &hf->model;
#define APPLY(keys) apply_keys(hf, dir, keys, sizeof keys / sizeof keys[0], &tmp, e)
    int mixed = 0;
    for (int l = 0; m->moe.num_experts > 0 && l < m->n_layer; l++)
        mixed |= !cfg_layer_is_moe(hf, l);
    if (APPLY(SHAPE_KEYS) || (m->moe.num_experts > 0 ? APPLY(MOE_KEYS) : APPLY(DENSE_KEYS)) ||
        (mixed && APPLY(MIXED_KEYS)) || (m->rope_scaling.type != ROPE_NONE && APPLY(ROPE_KEYS)) ||
        (m->rope_scaling.type == ROPE_LLAMA3 && APPLY(LLAMA3_KEYS)) ||
        (m->rope_scaling.type == ROPE_YARN && APPLY(YARN_KEYS)) || APPLY(MLA_KEYS))
        return -1;
#undef APPLY
    /* DeepSeek's MTP layers: all of them, or the first model.mtp.depth the config sets */
    int D = c->model.mtp.depth;
    if (cfg_was_set(c, "model.mtp.depth") && D > m->mtp.depth)
        return ust_errf(e,
                        "model.mtp.depth: the config sets %d but %s/config.json "
                        "(num_nextn_predict_layers) has %d multi-token prediction layers; "
                        "at most that many import",
                        D, dir, m->mtp.depth);
    tmp.model.mtp.depth = cfg_was_set(c, "model.mtp.depth") ? D : m->mtp.depth;
    /* a training coefficient, not the shape: config.json's unless the config sets its own */
    if (m->moe.num_experts > 0 && !cfg_was_set(c, "model.moe.aux_loss_coef"))
        tmp.model.moe.aux_loss_coef = m->moe.aux_loss_coef;
    *c = tmp;
    return 0;
}
