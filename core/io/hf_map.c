/* hf_map: the mapping between ustrain checkpoints and transformers models (hf_map.h).
 *
 * The work is a table: one row per tensor of the exported file, saying which checkpoint tensors
 * it is made of (with the shapes the config implies) and how (copy, cut the padded vocabulary,
 * transpose, fuse q/k/v). The table is built from the config, every source is checked against
 * the checkpoint, and only then is anything written.
 *
 * llama: ustrain already stores tensors under LlamaForCausalLM's names, [out, in] like
 * nn.Linear. RoPE needs no re-ordering of q_proj/k_proj rows: ustrain rotates the pairs
 * (x_i, x_{i+D/2}) of each head (core/base/ops_cpu.c rope_apply), which is transformers'
 * rotate_half convention; the permutation of Meta->HF conversions is only for weights trained with
 * interleaved pairs (x_{2i}, x_{2i+1}). Grouped-query heads map the same way too: query head h
 * reads key/value head h / (n_head / n_kv_head) in both (repeat_kv).
 *
 * llama with MoE layers in every layer (no shared expert) -> MixtralForCausalLM: the router is
 * block_sparse_moe.gate, expert e's gate_proj / down_proj / up_proj are its w1 / w2 / w3 (the
 * Hub's per-expert names, which transformers and vLLM read). Mixtral routes as ustrain does:
 * softmax over all experts, top-k, the k weights renormalized to sum to one.
 *
 * llama with MoE and per-head q/k norms (model.qk_norm) -> Qwen3MoeForCausalLM: any mix of dense
 * and MoE layers (mlp_only_layers lists the dense ones), the router mlp.gate, the experts under
 * ustrain's own names, norm_topk_prob = model.moe.norm_topk.
 *
 * llama with model.mla -> DeepseekV3ForCausalLM: its MoE layers (a dense prefix, then MoE to the
 * end: first_k_dense_replace) hold the router mlp.gate with the routing bias as
 * gate.e_score_correction_bias, the experts under ustrain's names and the shared MLP as
 * mlp.shared_experts (n_shared_experts x moe_intermediate_size wide).
 *
 * gpt2: GPT2LMHeadModel keeps GPT-2's Conv1D weights, [in, out] (the transpose of ours), and one
 * fused c_attn whose output features are q | k | v. GPT-2 has no grouped-query attention, so a
 * ustrain gpt2 with n_kv_head < n_head is exported with each key/value head repeated for the
 * query heads that read it, which computes the same attention. */
#include "hf_map.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t numel(int ndim, const int64_t *shape) {
    return ndim == 2 ? shape[0] * shape[1] : shape[0];
}

/* The first MoE layer (n_layer: none), DeepSeek's first_k_dense_replace. */
static int deepseek_first_moe(const ust_config *c) {
    int l = 0;
    while (l < c->model.n_layer && !cfg_layer_is_moe(c, l)) l++;
    return l;
}

/* The shared expert's width (model.moe.shared_d_ff; 0: d_ff_expert, as moe_shared_width). */
static int64_t shared_width(const ust_config *c) {
    return c->model.moe.shared_d_ff ? c->model.moe.shared_d_ff : c->model.moe.d_ff_expert;
}

/* ---------------------------------------------------------------------------------------------
 * The tables */

static hf_tensor *xadd(hf_table *l, hf_xform op, const char *name, int ndim, int64_t rows,
                       int64_t cols) {
    hf_tensor *x = &l->t[l->n++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->op = op;
    x->ndim = ndim;
    x->shape[0] = rows;
    x->shape[1] = ndim == 2 ? cols : 0;
    return x;
}

static void xsrc(hf_tensor *x, const char *name, int ndim, int64_t rows, int64_t cols) {
    ckpt_tensor *s = &x->src[x->nsrc++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->ndim = ndim;
    s->shape[0] = rows;
    s->shape[1] = ndim == 2 ? cols : 0;
}

/* One checkpoint tensor src of rows x cols -> dst: the same shape, or transposed for HF_T. */
static void xsame(hf_table *l, hf_xform op, const char *dst, const char *src, int ndim,
                  int64_t rows, int64_t cols) {
    hf_tensor *x = xadd(l, op, dst, ndim, ndim == 2 && op == HF_T ? cols : rows,
                        ndim == 2 && op == HF_T ? rows : cols);
    xsrc(x, src, ndim, rows, cols);
}

/* A MoE layer under Mixtral's names. */
static void mixtral_layer(hf_table *l, int i) {
    const ust_config *c = l->c;
    int64_t C = c->model.d_model, E = c->model.moe.num_experts, Fe = c->model.moe.d_ff_expert;
    char dst[CKPT_NAME_MAX], src[CKPT_NAME_MAX];
    snprintf(dst, sizeof dst, "model.layers.%d.block_sparse_moe.gate.weight", i);
    snprintf(src, sizeof src, "model.layers.%d.mlp.router.weight", i);
    xsame(l, HF_COPY, dst, src, 2, E, C);
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
            xsame(l, HF_COPY, dst, src, 2, map[k].down ? C : Fe, map[k].down ? Fe : C);
        }
}

/* model.mla's attention under DeepseekV3Attention's names: ours, row for row, but for the
 * rope rows of q and of the shared key, which DeepSeek's files order as interleaved pairs
 * (x_2i, x_2i+1) where ustrain rotates (x_i, x_i+R/2): HF_ROPE_* permutes them. */
static void mla_layer(hf_table *l, int i) {
    const __typeof__(l->c->model) *m = &l->c->model;
    int64_t C = m->d_model, H = m->n_head, Rq = m->mla.q_lora_rank, Rkv = m->mla.kv_lora_rank;
    int64_t QK = H * cfg_head_dim(l->c), R = m->mla.qk_rope_head_dim;
    hf_xform q = m->mla.rope_interleave ? HF_ROPE_Q : HF_COPY,
             kv = m->mla.rope_interleave ? HF_ROPE_KV : HF_COPY;
    char n[CKPT_NAME_MAX];
#define ONE(op, suffix, ndim, rows, cols)                                                          \
    snprintf(n, sizeof n, "model.layers.%d.self_attn.%s", i, suffix);                              \
    xsame(l, op, n, n, ndim, rows, cols)
    if (Rq) {
        ONE(HF_COPY, "q_a_proj.weight", 2, Rq, C);
        ONE(HF_COPY, "q_a_layernorm.weight", 1, Rq, 0);
        ONE(q, "q_b_proj.weight", 2, QK, Rq);
    } else {
        ONE(q, "q_proj.weight", 2, QK, C);
    }
    ONE(kv, "kv_a_proj_with_mqa.weight", 2, Rkv + R, C);
    ONE(HF_COPY, "kv_a_layernorm.weight", 1, Rkv, 0);
    ONE(HF_COPY, "kv_b_proj.weight", 2, H * (m->mla.qk_nope_head_dim + m->mla.v_head_dim), Rkv);
    ONE(HF_COPY, "o_proj.weight", 2, C, H * m->mla.v_head_dim);
#undef ONE
}

int64_t hf_rope_row(const ust_config *c, hf_xform op, int64_t r) {
    const __typeof__(c->model.mla) *a = &c->model.mla;
    int64_t P = op == HF_ROPE_Q ? cfg_head_dim(c) : a->kv_lora_rank + a->qk_rope_head_dim;
    int64_t off = op == HF_ROPE_Q ? a->qk_nope_head_dim : a->kv_lora_rank,
            half = a->qk_rope_head_dim / 2, j = r % P - off;
    if (j < 0) return r;
    return r - j + (j < half ? 2 * j : 2 * (j - half) + 1);
}

/* A MoE layer under DeepseekV3MoE's names: the router mlp.gate with the routing bias as its
 * e_score_correction_bias, the experts ustrain's names, the shared MLP mlp.shared_experts. */
static void deepseek_moe_layer(hf_table *l, int i) {
    const ust_config *c = l->c;
    int64_t C = c->model.d_model, E = c->model.moe.num_experts, Fe = c->model.moe.d_ff_expert;
    int64_t Fs = shared_width(c);
    char dst[CKPT_NAME_MAX], src[CKPT_NAME_MAX];
    static const char *const proj[] = {"gate_proj", "up_proj", "down_proj"};
    snprintf(dst, sizeof dst, "model.layers.%d.mlp.gate.weight", i);
    snprintf(src, sizeof src, "model.layers.%d.mlp.router.weight", i);
    xsame(l, HF_COPY, dst, src, 2, E, C);
    snprintf(dst, sizeof dst, "model.layers.%d.mlp.gate.e_score_correction_bias", i);
    snprintf(src, sizeof src, "model.layers.%d.mlp.router.expert_bias", i);
    xsame(l, HF_COPY, dst, src, 1, E, 0);
    for (int k = 0; k < 3; k++) {
        snprintf(dst, sizeof dst, "model.layers.%d.mlp.shared_experts.%s.weight", i, proj[k]);
        snprintf(src, sizeof src, "model.layers.%d.mlp.shared_expert.%s.weight", i, proj[k]);
        xsame(l, HF_COPY, dst, src, 2, k == 2 ? C : Fs, k == 2 ? Fs : C);
    }
    for (int64_t e = 0; e < E; e++)
        for (int k = 0; k < 3; k++) {
            snprintf(dst, sizeof dst, "model.layers.%d.mlp.experts.%lld.%s.weight", i, (long long)e,
                     proj[k]);
            xsame(l, HF_COPY, dst, dst, 2, k == 2 ? C : Fe, k == 2 ? Fe : C);
        }
}

/* A MoE layer under Qwen3-MoE's names: the router is mlp.gate, the experts ustrain's names. */
static void qwen3_moe_layer(hf_table *l, int i) {
    const ust_config *c = l->c;
    int64_t C = c->model.d_model, E = c->model.moe.num_experts, Fe = c->model.moe.d_ff_expert;
    char dst[CKPT_NAME_MAX], src[CKPT_NAME_MAX];
    snprintf(dst, sizeof dst, "model.layers.%d.mlp.gate.weight", i);
    snprintf(src, sizeof src, "model.layers.%d.mlp.router.weight", i);
    xsame(l, HF_COPY, dst, src, 2, E, C);
    static const char *const proj[] = {"gate_proj", "up_proj", "down_proj"};
    for (int64_t e = 0; e < E; e++)
        for (int k = 0; k < 3; k++) {
            snprintf(dst, sizeof dst, "model.layers.%d.mlp.experts.%lld.%s.weight", i, (long long)e,
                     proj[k]);
            xsame(l, HF_COPY, dst, dst, 2, k == 2 ? C : Fe, k == 2 ? Fe : C);
        }
}

/* Layer i of a llama-family model (moe: its MLP is a MoE layer). */
static void llama_layer(hf_table *l, int i, int moe) {
    const ust_config *c = l->c;
    int64_t C = c->model.d_model, F = c->model.d_ff, D = cfg_head_dim(c);
    int64_t HD = c->model.n_head * D, KV = c->model.n_kv_head * D;
    char n[CKPT_NAME_MAX];
    /* the same name and shape on both sides */
#define SAME(suffix, ndim, rows, cols)                                                             \
    snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix);                                        \
    xsame(l, HF_COPY, n, n, ndim, rows, cols)
    int post = c->model.post_norm; /* Olmo2ForCausalLM: both norms after their sublayer */
    if (!post) {
        SAME("input_layernorm.weight", 1, C, 0);
    }
    if (c->model.mla.enabled) {
        mla_layer(l, i);
        goto mlp;
    }
    SAME("self_attn.q_proj.weight", 2, HD, C);
    SAME("self_attn.k_proj.weight", 2, KV, C);
    SAME("self_attn.v_proj.weight", 2, KV, C);
    if (c->model.qkv_bias) { /* Qwen2ForCausalLM */
        SAME("self_attn.q_proj.bias", 1, HD, 0);
        SAME("self_attn.k_proj.bias", 1, KV, 0);
        SAME("self_attn.v_proj.bias", 1, KV, 0);
    }
    SAME("self_attn.o_proj.weight", 2, C, HD);
    if (c->model.qk_norm) { /* Qwen3ForCausalLM; Olmo2ForCausalLM: over all heads */
        SAME("self_attn.q_norm.weight", 1, c->model.qk_norm_whole ? HD : D, 0);
        SAME("self_attn.k_norm.weight", 1, c->model.qk_norm_whole ? KV : D, 0);
    }
mlp:
    SAME("post_attention_layernorm.weight", 1, C, 0);
    if (post) {
        SAME("post_feedforward_layernorm.weight", 1, C, 0);
    }
    if (c->model.gemma.sandwich_norm) { /* Gemma2/3ForCausalLM: the MLP's pre, post norms */
        SAME("pre_feedforward_layernorm.weight", 1, C, 0);
        SAME("post_feedforward_layernorm.weight", 1, C, 0);
    }
    if (moe) {
        if (c->model.mla.enabled)
            deepseek_moe_layer(l, i);
        else
            c->model.qk_norm ? qwen3_moe_layer(l, i) : mixtral_layer(l, i);
        return;
    }
    SAME("mlp.gate_proj.weight", 2, F, C);
    SAME("mlp.up_proj.weight", 2, F, C);
    SAME("mlp.down_proj.weight", 2, C, F);
#undef SAME
}

/* The vocabulary table `src` (padded to Vp rows) as file tensor `name` (vocab_size rows); dup:
 * DeepSeek's per-module copy of the shared embedding or head (hf_tensor.dup). */
static void vocab_row(hf_table *l, const char *name, const char *src, int dup) {
    const ust_config *c = l->c;
    hf_tensor *x = xadd(l, HF_ROWS, name, 2, c->model.vocab_size, c->model.d_model);
    xsrc(x, src, 2, cfg_vocab_padded(c), c->model.d_model);
    x->dup = dup;
}

/* model.mtp's module k as DeepSeek-V3's checkpoints hold it, layer n_layer + k: its own norms,
 * eh_proj and block, dense or MoE (params.c:add_mtp_params' names), and copies of the shared
 * embedding and head, which the export writes and the import checks against the main model's. */
static void mtp_layer(hf_table *l, int k) {
    const ust_config *c = l->c;
    int64_t C = c->model.d_model;
    int i = c->model.n_layer + k;
    char n[CKPT_NAME_MAX];
#define ONE(suffix, ndim, rows, cols)                                                              \
    snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix);                                        \
    xsame(l, HF_COPY, n, n, ndim, rows, cols)
    ONE("enorm.weight", 1, C, 0);
    ONE("hnorm.weight", 1, C, 0);
    ONE("eh_proj.weight", 2, C, 2 * C);
    snprintf(n, sizeof n, "model.layers.%d.embed_tokens.weight", i);
    vocab_row(l, n, "model.embed_tokens.weight", 1);
    llama_layer(l, i, cfg_layer_is_moe(c, i)); /* MoE in a model with MoE layers */
    ONE("shared_head.norm.weight", 1, C, 0);
#undef ONE
    snprintf(n, sizeof n, "model.layers.%d.shared_head.head.weight", i);
    vocab_row(l, n, cfg_tied(c) ? "model.embed_tokens.weight" : "lm_head.weight", 1);
}

/* DeepSeek's multi-token prediction layers in a table: model.mla's, with model.mtp. */
static int hf_mtp_depth(const ust_config *c) {
    return c->model.mla.enabled ? c->model.mtp.depth : 0;
}

static void llama_table(hf_table *l) {
    const ust_config *c = l->c;
    vocab_row(l, "model.embed_tokens.weight", "model.embed_tokens.weight", 0);
    for (int i = 0; i < c->model.n_layer; i++) llama_layer(l, i, cfg_layer_is_moe(c, i));
    for (int k = 0; k < hf_mtp_depth(c); k++) mtp_layer(l, k);
    xsame(l, HF_COPY, "model.norm.weight", "model.norm.weight", 1, c->model.d_model, 0);
    if (!cfg_tied(c)) /* tied: transformers takes lm_head from embed_tokens */
        vocab_row(l, "lm_head.weight", "lm_head.weight", 0);
}

static void gpt2_table(hf_table *l) {
    const ust_config *c = l->c;
    int64_t C = c->model.d_model, V = c->model.vocab_size, Vp = cfg_vocab_padded(c);
    int64_t F = c->model.d_ff, D = cfg_head_dim(c), T = c->model.max_seq_len;
    int64_t HD = c->model.n_head * D, KV = c->model.n_kv_head * D;
    hf_tensor *x = xadd(l, HF_ROWS, "transformer.wte.weight", 2, V, C);
    xsrc(x, "model.embed_tokens.weight", 2, Vp, C);
    xsame(l, HF_COPY, "transformer.wpe.weight", "model.embed_positions.weight", 2, T, C);
    for (int i = 0; i < c->model.n_layer; i++) {
        char h[64], s[64], dn[CKPT_NAME_MAX], sn[3][CKPT_NAME_MAX];
        snprintf(h, sizeof h, "transformer.h.%d.", i);
        snprintf(s, sizeof s, "model.layers.%d.", i);
#define SAME(op, hf, ours, ndim, r, cl)                                                            \
    snprintf(dn, sizeof dn, "%s%s", h, hf);                                                        \
    snprintf(sn[0], sizeof sn[0], "%s%s", s, ours);                                                \
    xsame(l, op, dn, sn[0], ndim, r, cl)
        SAME(HF_COPY, "ln_1.weight", "input_layernorm.weight", 1, C, 0);
        SAME(HF_COPY, "ln_1.bias", "input_layernorm.bias", 1, C, 0);
        for (int w = 0; w < 2; w++) { /* c_attn.weight [C, 3 HD], c_attn.bias [3 HD] */
            snprintf(dn, sizeof dn, "%sattn.c_attn.%s", h, w ? "bias" : "weight");
            x = w ? xadd(l, HF_QKV, dn, 1, 3 * HD, 0) : xadd(l, HF_QKV, dn, 2, C, 3 * HD);
            const char *qkv[] = {"q", "k", "v"};
            for (int j = 0; j < 3; j++) {
                snprintf(sn[j], sizeof sn[j], "%sself_attn.%s_proj.%s", s, qkv[j],
                         w ? "bias" : "weight");
                xsrc(x, sn[j], w ? 1 : 2, j ? KV : HD, w ? 0 : C);
            }
        }
        SAME(HF_T, "attn.c_proj.weight", "self_attn.o_proj.weight", 2, C, HD);
        SAME(HF_COPY, "attn.c_proj.bias", "self_attn.o_proj.bias", 1, C, 0);
        SAME(HF_COPY, "ln_2.weight", "post_attention_layernorm.weight", 1, C, 0);
        SAME(HF_COPY, "ln_2.bias", "post_attention_layernorm.bias", 1, C, 0);
        SAME(HF_T, "mlp.c_fc.weight", "mlp.up_proj.weight", 2, F, C);
        SAME(HF_COPY, "mlp.c_fc.bias", "mlp.up_proj.bias", 1, F, 0);
        SAME(HF_T, "mlp.c_proj.weight", "mlp.down_proj.weight", 2, C, F);
        SAME(HF_COPY, "mlp.c_proj.bias", "mlp.down_proj.bias", 1, C, 0);
#undef SAME
    }
    xsame(l, HF_COPY, "transformer.ln_f.weight", "model.norm.weight", 1, C, 0);
    xsame(l, HF_COPY, "transformer.ln_f.bias", "model.norm.bias", 1, C, 0);
    /* no lm_head.weight: GPT2LMHeadModel ties it to transformer.wte, as GPT-2's own files do */
}

/* The mixture of experts' Hugging Face layouts: Mixtral (every layer, renormalized) and
 * Qwen3-MoE (model.qk_norm: any layers), both softmax top-k without a shared expert. */
static int moe_layout_check(const ust_config *c, ust_err *e) {
    const __typeof__(c->model.moe) *moe = &c->model.moe;
    int all = 1, q3 = c->model.qk_norm;
    for (int l = 0; l < c->model.n_layer; l++) all &= cfg_layer_is_moe(c, l);
    if (c->model.arch != ARCH_LLAMA || (!all && !q3) || moe->shared_expert)
        return ust_errf(e,
                        "model.moe: the Hugging Face layouts for mixture of experts are Mixtral's, "
                        "a llama with experts in every layer, and Qwen3-MoE's (model.qk_norm: "
                        "true), neither with a shared expert (this model: arch %s, %s layer "
                        "MoE, moe.shared_expert = %s)",
                        c->model.arch == ARCH_LLAMA ? "llama" : "gpt2", all ? "every" : "not every",
                        moe->shared_expert ? "true" : "false");
    if (moe->score != MOE_SOFTMAX || moe->n_group > 1 || moe->routed_scale != 1)
        return ust_errf(e,
                        "model.moe.score/n_group/routed_scale: Mixtral and Qwen3-MoE route by "
                        "softmax top-k without groups or a scale (this model: %s, %d groups, "
                        "scale %g)",
                        moe->score == MOE_SIGMOID ? "sigmoid" : "softmax", moe->n_group,
                        moe->routed_scale);
    if (!q3 && !moe->norm_topk)
        return ust_errf(e, "model.moe.norm_topk: false: Mixtral renormalizes the top-k weights; "
                           "Qwen3-MoE (model.qk_norm: true) has norm_topk_prob");
    if (moe->bias_update_rate > 0)
        return ust_errf(e, "model.moe.bias_update_rate: Mixtral's and Qwen3-MoE's routers have no "
                           "balancing bias, so a model trained with one (router.expert_bias) has "
                           "no Hugging Face layout that routes as it does");
    if (c->model.qkv_bias)
        return ust_errf(e, "model.qkv_bias: Mixtral's and Qwen3-MoE's attention have no q/k/v "
                           "biases, so a mixture of experts with model.qkv_bias: true has no "
                           "Hugging Face layout");
    if (q3 && c->model.sliding_window[0])
        return ust_errf(e,
                        "model.sliding_window [%s]: ustrain exports Qwen3-MoE with full "
                        "attention only",
                        c->model.sliding_window);
    return 0;
}

/* Gemma's options (model.gemma) export as Gemma3ForCausalLM (with model.qk_norm) or
 * Gemma2ForCausalLM (without, one RoPE base), which have all of them. */
static int gemma_check(const ust_config *c, ust_err *e) {
    const __typeof__(c->model) *m = &c->model;
    const __typeof__(m->gemma) *g = &m->gemma;
    int any = g->sandwich_norm || g->norm_offset || g->embed_scale || g->hidden_act != HACT_SILU ||
              g->query_pre_attn_scalar > 0 || g->rope_local_theta > 0 || g->attn_softcap > 0 ||
              g->final_softcap > 0;
    int all = g->sandwich_norm && g->norm_offset && g->embed_scale &&
              g->hidden_act == HACT_GELU_TANH && !m->qk_norm_whole && !m->qkv_bias &&
              !m->post_norm && m->moe.num_experts == 0 &&
              (m->rope_scaling.type == ROPE_NONE || m->rope_scaling.type == ROPE_LINEAR) &&
              (m->qk_norm || g->rope_local_theta == 0);
    if (all && m->qk_norm && g->attn_softcap > 0) /* its config keeps the key, ignores it */
        return ust_errf(e,
                        "model.attn_softcap %g has no Hugging Face layout with model.qk_norm: "
                        "transformers' Gemma3ForCausalLM does not apply attn_logit_softcapping "
                        "(train with model.attn_softcap: 0 to export; Gemma2ForCausalLM, "
                        "without model.qk_norm, applies it)",
                        g->attn_softcap);
    if (any && !all)
        return ust_errf(e, "model.sandwich_norm / norm_offset / embed_scale / hidden_act / "
                           "query_pre_attn_scalar / rope_local_theta / attn_softcap / "
                           "final_softcap: their Hugging Face layout is Gemma3ForCausalLM (with "
                           "model.qk_norm per head) or Gemma2ForCausalLM (without, and without "
                           "rope_local_theta), a dense llama with the first four (gelu_tanh), no "
                           "q/k/v biases and no rope_scaling but linear");
    return 0;
}

/* DeepseekV3ForCausalLM's MoE layout: dense layers, then MoE layers to the end
 * (first_k_dense_replace), sigmoid scores, a shared MLP n_shared_experts x d_ff_expert wide. */
static int deepseek_moe_check(const ust_config *c, ust_err *e) {
    const __typeof__(c->model.moe) *moe = &c->model.moe;
    int first = deepseek_first_moe(c), suffix = 1;
    for (int l = 0; l < c->model.n_layer; l++) suffix &= cfg_layer_is_moe(c, l) == (l >= first);
    if (!suffix)
        return ust_errf(e,
                        "model.moe.layers / every / first_dense: DeepseekV3ForCausalLM's MoE "
                        "layers are every layer from first_k_dense_replace on; this model's are "
                        "not (first MoE layer %d of %d)",
                        first, c->model.n_layer);
    if (moe->score != MOE_SIGMOID)
        return ust_errf(e, "model.moe.score: softmax: DeepseekV3ForCausalLM routes by sigmoid "
                           "scores (model.moe.score: sigmoid)");
    if (moe->max_nodes_per_token && moe->top_k / moe->max_nodes_per_token != 2)
        return ust_errf(e,
                        "model.moe.max_nodes_per_token %d: DeepseekV3ForCausalLM ranks groups by "
                        "their top-2 scores, and top_k %d / %d is not 2",
                        moe->max_nodes_per_token, moe->top_k, moe->max_nodes_per_token);
    if (!moe->shared_expert || shared_width(c) % moe->d_ff_expert)
        return ust_errf(e,
                        "model.moe.shared_expert / shared_d_ff: DeepseekV3ForCausalLM's MoE layer "
                        "has a shared MLP of n_shared_experts x moe_intermediate_size (%d); this "
                        "model's is %d wide",
                        moe->d_ff_expert, moe->shared_expert ? (int)shared_width(c) : 0);
    return 0;
}

int hf_table_build(hf_table *l, const ust_config *c, ust_err *e) {
    const __typeof__(c->model.moe) *moe = &c->model.moe;
    if (moe->num_experts > 0 &&
        (c->model.mla.enabled ? deepseek_moe_check(c, e) : moe_layout_check(c, e)))
        return -1;
    if (c->model.partial_rotary_factor < 1)
        return ust_errf(e,
                        "model.partial_rotary_factor %g: ustrain imports and exports no family "
                        "with partial RoPE",
                        c->model.partial_rotary_factor);
    int wsizes[CFG_MAX_WINDOWS];
    if (cfg_windows(c, wsizes) > 1)
        return ust_errf(e,
                        "model.sliding_window [%s]: windows of %d and %d keys in one model; a "
                        "Hugging Face layout has one window size",
                        c->model.sliding_window, wsizes[0], wsizes[1]);
    if (gemma_check(c, e)) return -1;
    int gemma = c->model.gemma.sandwich_norm; /* Gemma 2 and 3: any layers local (layer_types) */
    int first = -1, suffix = 1; /* the windowed layers: from `first` on, all of them? */
    for (int l = 0; l < c->model.n_layer; l++) {
        if (cfg_layer_window(c, l) && first < 0) first = l;
        if (!cfg_layer_window(c, l) && first >= 0) suffix = 0;
    }
    if (first >= 0 && !gemma && (!suffix || (first > 0 && !c->model.qkv_bias && !c->model.qk_norm)))
        return ust_errf(e,
                        "model.sliding_window [%s]: a Hugging Face layout slides a window on "
                        "every layer (MistralForCausalLM, MixtralForCausalLM) or on the layers "
                        "from max_window_layers on (Qwen2/Qwen3ForCausalLM, a model with "
                        "model.qkv_bias or model.qk_norm); this model's windowed layers are "
                        "neither",
                        c->model.sliding_window);
    int olmo2 = c->model.qk_norm && c->model.qk_norm_whole && c->model.post_norm;
    if ((c->model.qk_norm_whole || c->model.post_norm) &&
        (!olmo2 || first >= 0 || c->model.qkv_bias || cfg_tied(c)))
        return ust_errf(e, "model.qk_norm_whole / model.post_norm: their Hugging Face layout is "
                           "Olmo2ForCausalLM, a llama with both (and model.qk_norm), no q/k/v "
                           "biases, no sliding window and untied embeddings");
    if (c->model.qk_norm && c->model.qkv_bias)
        return ust_errf(e, "model.qk_norm: its Hugging Face layouts are Qwen3ForCausalLM and "
                           "Qwen3MoeForCausalLM, llamas without q/k/v biases (this model: "
                           "model.qkv_bias: true)");
    l->c = c;
    l->n = 0;
    int64_t n = hf_table_count(c);
    l->t = calloc((size_t)n, sizeof *l->t);
    if (!l->t) return ust_errf(e, "hf_map: out of memory for %lld tensors", (long long)n);
    if (c->model.arch == ARCH_LLAMA)
        llama_table(l);
    else
        gpt2_table(l);
    UST_ASSERT(l->n == n, "hf_map: the table has %d rows, hf_table_count says %lld", l->n,
               (long long)n);
    return 0;
}

int64_t hf_table_count(const ust_config *c) {
    const __typeof__(c->model) *m = &c->model;
    if (m->arch != ARCH_LLAMA) return 4 + 12 * (int64_t)m->n_layer; /* wte, wpe, ln_f.{w,b} */
    int64_t n = 2 + (cfg_tied(c) ? 0 : 1);                          /* embed, norm, lm_head */
    /* per layer: the norms, then q|k|v (+ biases, + q/k norms), or MLA's q (3 tensors through the
     * q latent, else 1), kv_a, its norm, kv_b and o; then the MLP or the router and experts */
    int64_t attn = m->mla.enabled ? 2 + (m->mla.q_lora_rank ? 3 : 1) + 4
                                  : 6 + (m->qkv_bias ? 3 : 0) + (m->qk_norm ? 2 : 0);
    attn += m->gemma.sandwich_norm ? 2 : 0; /* Gemma 3's norms around the MLP */
    /* a DeepSeek MoE layer also has the router's correction bias and the shared MLP */
    int64_t moe = 1 + 3 * (int64_t)m->moe.num_experts + (m->mla.enabled ? 4 : 0);
    for (int l = 0; l < m->n_layer; l++) n += attn + (cfg_layer_is_moe(c, l) ? moe : 3);
    /* each MTP module: its layer (MoE in a model with MoE layers), enorm, hnorm, eh_proj,
     * shared_head.norm and the two copies */
    for (int k = 0; k < hf_mtp_depth(c); k++)
        n += attn + (cfg_layer_is_moe(c, m->n_layer + k) ? moe : 3) + 6;
    return n;
}

/* Row r of the stacked q | k | v (each n_head heads of D rows) as a (source, row) pair: k and v
 * heads repeat, query head h reading key/value head h / (n_head / n_kv_head). */
void hf_qkv_row(const ust_config *c, int64_t r, int *which, int64_t *row) {
    int64_t D = cfg_head_dim(c), HD = c->model.n_head * D;
    int G = c->model.n_head / c->model.n_kv_head;
    *which = (int)(r / HD);
    int64_t rr = r % HD;
    *row = *which == 0 ? rr : (rr / D / G) * D + rr % D;
}

void hf_make(const ust_config *c, const hf_tensor *x, const float *src[3], float *out) {
    switch (x->op) {
    case HF_COPY:
    case HF_ROWS: /* row-major: the first rows are one contiguous prefix */
        memcpy(out, src[0], (size_t)numel(x->ndim, x->shape) * sizeof(float));
        break;
    case HF_T: {
        int64_t rows = x->src[0].shape[0], cols = x->src[0].shape[1];
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) out[j * rows + i] = src[0][i * cols + j];
        break;
    }
    case HF_ROPE_Q:
    case HF_ROPE_KV: {
        int64_t rows = x->shape[0], cols = x->shape[1];
        for (int64_t r = 0; r < rows; r++)
            memcpy(out + hf_rope_row(c, x->op, r) * cols, src[0] + r * cols,
                   (size_t)cols * sizeof(float));
        break;
    }
    case HF_QKV: {
        int64_t R = x->ndim == 2 ? x->shape[1] : x->shape[0]; /* 3 * n_head * D */
        int64_t cols = x->ndim == 2 ? x->shape[0] : 1;        /* C, or 1 for the bias */
        for (int64_t r = 0; r < R; r++) {
            int w;
            int64_t sr;
            hf_qkv_row(c, r, &w, &sr);
            for (int64_t j = 0; j < cols; j++) out[j * R + r] = src[w][sr * cols + j];
        }
        break;
    }
    }
}

static void special_tokens(cJSON *j, int bos, int eos) {
    const char *keys[] = {"bos_token_id", "eos_token_id"};
    int ids[] = {bos, eos};
    for (int i = 0; i < 2; i++)
        if (ids[i] >= 0)
            cJSON_AddNumberToObject(j, keys[i], ids[i]);
        else
            cJSON_AddNullToObject(j, keys[i]);
}

/* Llama 3.1's rope_scaling as transformers writes it, or null. */
static void rope_scaling_json(cJSON *j, const ust_config *c) {
    const __typeof__(c->model.rope_scaling) *r = &c->model.rope_scaling;
    if (r->type == ROPE_NONE) {
        cJSON_AddNullToObject(j, "rope_scaling");
        return;
    }
    cJSON *o = cJSON_AddObjectToObject(j, "rope_scaling");
    if (r->type == ROPE_YARN) { /* attention_factor 0: transformers derives the same default */
        cJSON_AddStringToObject(o, "rope_type", "yarn");
        cJSON_AddNumberToObject(o, "factor", r->factor);
        cJSON_AddNumberToObject(o, "original_max_position_embeddings",
                                r->original_max_position_embeddings);
        cJSON_AddNumberToObject(o, "beta_fast", r->beta_fast);
        cJSON_AddNumberToObject(o, "beta_slow", r->beta_slow);
        cJSON_AddBoolToObject(o, "truncate", r->truncate);
        if (r->attention_factor > 0)
            cJSON_AddNumberToObject(o, "attention_factor", r->attention_factor);
        return;
    }
    if (r->type == ROPE_LINEAR) {
        cJSON_AddStringToObject(o, "rope_type", "linear");
        cJSON_AddNumberToObject(o, "factor", r->factor);
        return;
    }
    cJSON_AddStringToObject(o, "rope_type", "llama3");
    cJSON_AddNumberToObject(o, "factor", r->factor);
    cJSON_AddNumberToObject(o, "low_freq_factor", r->low_freq_factor);
    cJSON_AddNumberToObject(o, "high_freq_factor", r->high_freq_factor);
    cJSON_AddNumberToObject(o, "original_max_position_embeddings",
                            r->original_max_position_embeddings);
}

/* Qwen3MoeConfig's MoE keys: every layer sparse but those in mlp_only_layers. */
static void qwen3_moe_json(cJSON *j, const ust_config *c) {
    const __typeof__(c->model.moe) *moe = &c->model.moe;
    cJSON_AddNumberToObject(j, "moe_intermediate_size", moe->d_ff_expert);
    cJSON_AddNumberToObject(j, "num_experts", moe->num_experts);
    cJSON_AddNumberToObject(j, "num_experts_per_tok", moe->top_k);
    cJSON_AddNumberToObject(j, "decoder_sparse_step", 1);
    cJSON *only = cJSON_AddArrayToObject(j, "mlp_only_layers");
    for (int l = 0; l < c->model.n_layer; l++)
        if (!cfg_layer_is_moe(c, l)) cJSON_AddItemToArray(only, cJSON_CreateNumber(l));
    cJSON_AddBoolToObject(j, "norm_topk_prob", moe->norm_topk);
    cJSON_AddNumberToObject(j, "router_aux_loss_coef", moe->aux_loss_coef);
    cJSON_AddBoolToObject(j, "output_router_logits", 0);
    cJSON_AddBoolToObject(j, "use_sliding_window", 0);
}

/* The keys every llama-family config.json ends with. */
/* A config.json's first keys: {"architectures": [arch], "model_type": type}. */
static cJSON *config_head(const char *arch, const char *type) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddItemToObject(j, "architectures", cJSON_CreateStringArray(&arch, 1));
    cJSON_AddStringToObject(j, "model_type", type);
    return j;
}

/* n integer keys in order */
static void add_ints(cJSON *j, const char *const *keys, const int *vals, size_t n) {
    for (size_t i = 0; i < n; i++) cJSON_AddNumberToObject(j, keys[i], vals[i]);
}

static cJSON *common_tail(cJSON *j, const ust_config *c, int bos, int eos) {
    cJSON_AddBoolToObject(j, "tie_word_embeddings", cfg_tied(c));
    special_tokens(j, bos, eos);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddBoolToObject(j, "use_cache", 1);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    return j;
}

static cJSON *llama_config(const ust_config *c, int bos, int eos) {
    const __typeof__(c->model) *m = &c->model;
    int moe = m->moe.num_experts > 0, qwen2 = !moe && m->qkv_bias, olmo2 = m->post_norm,
        qwen3 = m->qk_norm && !olmo2;
    int q3moe = moe && qwen3;
    if (q3moe) moe = 0, qwen3 = 0; /* its own keys: qwen3_moe_json */
    int W = 0, first = m->n_layer; /* model.sliding_window: the windowed layers are a suffix */
    for (int l = m->n_layer - 1; l >= 0 && cfg_layer_window(c, l); l--)
        W = cfg_layer_window(c, l), first = l;
    int mistral = W && !moe && !qwen2 && !qwen3 && !q3moe && !olmo2;
    const char *arch = olmo2     ? "Olmo2ForCausalLM"
                       : q3moe   ? "Qwen3MoeForCausalLM"
                       : moe     ? "MixtralForCausalLM"
                       : qwen2   ? "Qwen2ForCausalLM"
                       : qwen3   ? "Qwen3ForCausalLM"
                       : mistral ? "MistralForCausalLM"
                                 : "LlamaForCausalLM";
    cJSON *j = config_head(arch, olmo2     ? "olmo2"
                                 : q3moe   ? "qwen3_moe"
                                 : moe     ? "mixtral"
                                 : qwen2   ? "qwen2"
                                 : qwen3   ? "qwen3"
                                 : mistral ? "mistral"
                                           : "llama");
    cJSON_AddNumberToObject(j, "vocab_size", m->vocab_size);
    cJSON_AddNumberToObject(j, "hidden_size", m->d_model);
    cJSON_AddNumberToObject(j, "intermediate_size", moe ? m->moe.d_ff_expert : m->d_ff);
    if (q3moe) qwen3_moe_json(j, c);
    if (moe) {
        cJSON_AddNumberToObject(j, "num_local_experts", m->moe.num_experts);
        cJSON_AddNumberToObject(j, "num_experts_per_tok", m->moe.top_k);
        cJSON_AddNumberToObject(j, "router_aux_loss_coef", m->moe.aux_loss_coef);
        cJSON_AddBoolToObject(j, "output_router_logits", 0);
    }
    if (W)
        cJSON_AddNumberToObject(j, "sliding_window", W);
    else if (moe || qwen2 || qwen3 || mistral || q3moe)
        cJSON_AddNullToObject(j, "sliding_window");
    if (qwen2 || qwen3) { /* Qwen2's q/k/v biases, Qwen3's head norms: by the architecture */
        cJSON_AddBoolToObject(j, "use_sliding_window", W > 0);
        cJSON_AddNumberToObject(j, "max_window_layers", first);
        cJSON *types = cJSON_AddArrayToObject(j, "layer_types"); /* transformers 5 */
        for (int l = 0; l < m->n_layer; l++)
            cJSON_AddItemToArray(
                types, cJSON_CreateString(l >= first ? "sliding_attention" : "full_attention"));
    }
    cJSON_AddNumberToObject(j, "num_hidden_layers", m->n_layer);
    cJSON_AddNumberToObject(j, "num_attention_heads", m->n_head);
    cJSON_AddNumberToObject(j, "num_key_value_heads", m->n_kv_head);
    cJSON_AddNumberToObject(j, "head_dim", cfg_head_dim(c));
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "max_position_embeddings", m->max_seq_len);
    cJSON_AddNumberToObject(j, "rms_norm_eps", m->norm_eps);
    cJSON_AddNumberToObject(j, "rope_theta", m->rope_theta);
    rope_scaling_json(j, c);
    cJSON_AddNumberToObject(j, "attention_dropout", 0.0);
    if (qwen3 || q3moe || olmo2) cJSON_AddBoolToObject(j, "attention_bias", 0);
    if (!qwen2 && !qwen3 && !mistral && !q3moe && !olmo2) {
        cJSON_AddBoolToObject(j, "attention_bias", 0);
        cJSON_AddBoolToObject(j, "mlp_bias", 0);
        cJSON_AddNumberToObject(j, "pretraining_tp", 1);
    }
    return common_tail(j, c, bos, eos);
}

static cJSON *gpt2_config(const ust_config *c, int bos, int eos) {
    const __typeof__(c->model) *m = &c->model;
    cJSON *j = config_head("GPT2LMHeadModel", "gpt2");
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
    special_tokens(j, bos, eos);
    cJSON_AddBoolToObject(j, "use_cache", 1);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    return j;
}

/* A float key written with a decimal point: transformers' strict config classes refuse an int
 * where they declare a float (routed_scaling_factor 1 would not load; 1.0 does). */
static void add_float(cJSON *j, const char *key, double v) {
    char s[40];
    snprintf(s, sizeof s, "%.17g", v);
    if (!strpbrk(s, ".eEn")) strcat(s, ".0"); /* n: nan / inf are not JSON anyway */
    cJSON_AddRawToObject(j, key, s);
}

/* DeepseekV3Config's MoE keys (deepseek_moe_check holds). */
static void deepseek_moe_json(cJSON *j, const ust_config *c) {
    const __typeof__(c->model.moe) *moe = &c->model.moe;
    cJSON_AddNumberToObject(j, "n_routed_experts", moe->num_experts);
    cJSON_AddNumberToObject(j, "num_experts_per_tok", moe->top_k);
    cJSON_AddNumberToObject(j, "moe_intermediate_size", moe->d_ff_expert);
    cJSON_AddNumberToObject(j, "n_shared_experts", shared_width(c) / moe->d_ff_expert);
    cJSON_AddNumberToObject(j, "n_group", moe->n_group);
    /* node-limited routing with top_k / M = 2 is transformers' group-limited choice of M */
    cJSON_AddNumberToObject(j, "topk_group",
                            moe->max_nodes_per_token ? moe->max_nodes_per_token : moe->topk_group);
    add_float(j, "routed_scaling_factor", moe->routed_scale);
    cJSON_AddBoolToObject(j, "norm_topk_prob", moe->norm_topk);
    cJSON_AddStringToObject(j, "scoring_func", "sigmoid");
    cJSON_AddStringToObject(j, "topk_method", "noaux_tc");
}

/* model.mla -> DeepseekV3ForCausalLM: the dense layers, then its MoE layers (every layer dense
 * without model.moe: first_k_dense_replace = layers). */
static cJSON *deepseek_config(const ust_config *c, int bos, int eos) {
    const __typeof__(c->model) *m = &c->model;
    const __typeof__(m->mla) *a = &m->mla;
    cJSON *j = config_head("DeepseekV3ForCausalLM", "deepseek_v3");
    static const char *const ints[] = {"vocab_size",
                                       "hidden_size",
                                       "intermediate_size",
                                       "num_hidden_layers",
                                       "num_attention_heads",
                                       "num_key_value_heads",
                                       "kv_lora_rank",
                                       "qk_nope_head_dim",
                                       "qk_rope_head_dim",
                                       "v_head_dim",
                                       "max_position_embeddings",
                                       "first_k_dense_replace"};
    int vals[] = {m->vocab_size,       m->d_model,    m->d_ff,         m->n_layer,
                  m->n_head,           m->n_kv_head,  a->kv_lora_rank, a->qk_nope_head_dim,
                  a->qk_rope_head_dim, a->v_head_dim, m->max_seq_len,  deepseek_first_moe(c)};
    add_ints(j, ints, vals, sizeof vals / sizeof vals[0]);
    if (a->q_lora_rank)
        cJSON_AddNumberToObject(j, "q_lora_rank", a->q_lora_rank);
    else
        cJSON_AddNullToObject(j, "q_lora_rank");
    if (m->moe.num_experts > 0) deepseek_moe_json(j, c);
    cJSON_AddNumberToObject(j, "num_nextn_predict_layers", m->mtp.depth);
    cJSON_AddBoolToObject(j, "rope_interleave", a->rope_interleave);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "rms_norm_eps", m->norm_eps);
    cJSON_AddNumberToObject(j, "rope_theta", m->rope_theta);
    rope_scaling_json(j, c);
    cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (a->mscale_all_dim && cJSON_IsObject(rs))
        cJSON_AddNumberToObject(rs, "mscale_all_dim", a->mscale_all_dim);
    cJSON_AddBoolToObject(j, "attention_bias", 0);
    cJSON_AddNumberToObject(j, "attention_dropout", 0.0);
    return common_tail(j, c, bos, eos);
}

/* One of Gemma 3's rope_parameters entries (transformers 5's layout). */
static void gemma3_rope_json(cJSON *p, const char *kind, double theta, const ust_config *c) {
    cJSON *o = cJSON_AddObjectToObject(p, kind);
    int linear = !strcmp(kind, "full_attention") && c->model.rope_scaling.type == ROPE_LINEAR;
    cJSON_AddStringToObject(o, "rope_type", linear ? "linear" : "default");
    cJSON_AddNumberToObject(o, "rope_theta", theta);
    if (linear) cJSON_AddNumberToObject(o, "factor", c->model.rope_scaling.factor);
}

/* model.sandwich_norm & co. -> Gemma3ForCausalLM (Gemma3TextConfig; model.qk_norm), each layer
 * kind with its RoPE, or Gemma2ForCausalLM (Gemma2Config), one RoPE as a llama's: the windowed
 * layers are sliding_attention in layer_types, the others full_attention. */
static cJSON *gemma_config(const ust_config *c, int bos, int eos) {
    const __typeof__(c->model) *m = &c->model;
    int g3 = m->qk_norm;
    cJSON *j = g3 ? config_head("Gemma3ForCausalLM", "gemma3_text")
                  : config_head("Gemma2ForCausalLM", "gemma2");
    static const char *const ints[] = {"vocab_size",
                                       "hidden_size",
                                       "intermediate_size",
                                       "num_hidden_layers",
                                       "num_attention_heads",
                                       "num_key_value_heads",
                                       "head_dim",
                                       "max_position_embeddings"};
    int vals[] = {m->vocab_size, m->d_model,   m->d_ff,         m->n_layer,
                  m->n_head,     m->n_kv_head, cfg_head_dim(c), m->max_seq_len};
    add_ints(j, ints, vals, sizeof vals / sizeof vals[0]);
    cJSON_AddStringToObject(j, "hidden_activation", "gelu_pytorch_tanh");
    cJSON_AddNumberToObject(j, "rms_norm_eps", m->norm_eps);
    double qs = m->gemma.query_pre_attn_scalar;
    cJSON_AddNumberToObject(j, "query_pre_attn_scalar", qs > 0 ? qs : cfg_head_dim(c));
    int W = 0;
    cJSON *types = cJSON_CreateArray();
    for (int l = 0; l < m->n_layer; l++) {
        if (cfg_layer_window(c, l)) W = cfg_layer_window(c, l);
        cJSON_AddItemToArray(types, cJSON_CreateString(cfg_layer_window(c, l) ? "sliding_attention"
                                                                              : "full_attention"));
    }
    if (W)
        cJSON_AddNumberToObject(j, "sliding_window", W);
    else
        cJSON_AddNullToObject(j, "sliding_window");
    cJSON_AddItemToObject(j, "layer_types", types);
    if (g3) {
        cJSON *rp = cJSON_AddObjectToObject(j, "rope_parameters");
        gemma3_rope_json(rp, "full_attention", m->rope_theta, c);
        double lt = m->gemma.rope_local_theta;
        gemma3_rope_json(rp, "sliding_attention", lt > 0 ? lt : m->rope_theta, c);
    } else { /* transformers 4 reads these; 5 turns them into its rope_parameters */
        cJSON_AddNumberToObject(j, "rope_theta", m->rope_theta);
        rope_scaling_json(j, c);
    }
    const double caps[2] = {m->gemma.final_softcap, m->gemma.attn_softcap}; /* 0: null */
    const char *const cap_keys[2] = {"final_logit_softcapping", "attn_logit_softcapping"};
    for (int i = 0; i < 2; i++) /* Gemma2Config's and Gemma3TextConfig's caps are floats */
        if (caps[i] > 0)
            add_float(j, cap_keys[i], caps[i]);
        else
            cJSON_AddNullToObject(j, cap_keys[i]);
    cJSON_AddBoolToObject(j, "attention_bias", 0);
    cJSON_AddNumberToObject(j, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(j, "use_bidirectional_attention", 0);
    return common_tail(j, c, bos, eos);
}

cJSON *hf_config_json(const ust_config *c, int bos, int eos) {
    if (c->model.mla.enabled) return deepseek_config(c, bos, eos);
    if (c->model.gemma.sandwich_norm) return gemma_config(c, bos, eos);
    return c->model.arch == ARCH_LLAMA ? llama_config(c, bos, eos) : gpt2_config(c, bos, eos);
}

void hf_table_free(hf_table *l) {
    free(l->t);
    l->t = NULL;
    l->n = 0;
}
