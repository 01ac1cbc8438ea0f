/* config_validate: the rules across keys (model shape, batch, sizes, threads, world), parallel.dp:
 * auto, cfg_validate itself and the derived values every module agrees on. The parallel
 * layout's rules are config_parallel.c's. */
#include "config_internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <unistd.h>

int cfg_vfail(const ust_config *c, ust_err *e, const char *fmt, ...) {
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ust_errf(e, "%s%s%s", c->source, c->source[0] ? ": " : "", msg);
}

int cfg_layer_window(const ust_config *c, int l) {
    const char *s = c->model.sliding_window;
    long w = 0;
    for (int i = 0; *s && i <= l; i++) { /* one entry: every layer's */
        w = strtol(s, (char **)&s, 10);
        if (*s == ',') s++;
    }
    return w >= c->model.max_seq_len ? 0 : (int)w;
}

bool cfg_layer_is_moe(const ust_config *c, int l) {
    const __typeof__(c->model.moe) *m = &c->model.moe;
    if (m->num_experts <= 0 || l < m->first_dense) return false;
    if (l >= c->model.n_layer) return true; /* model.mtp's blocks: MoE, as DeepSeek-V3's */
    if (!m->layers[0]) return l % (m->every > 0 ? m->every : 1) == 0;
    const char *s = m->layers;
    long v = 0;
    for (int i = 0; *s && i <= l; i++) {
        v = strtol(s, (char **)&s, 10);
        if (*s == ',') s++;
    }
    return v == 1;
}

bool cfg_moe_has_bias(const ust_config *c) {
    const __typeof__(c->model.moe) *m = &c->model.moe;
    return m->num_experts > 0 && (m->bias_update_rate > 0 || m->score == MOE_SIGMOID);
}

/* model.moe.max_nodes_per_token M: node-limited routing over the n_group nodes (groups), each
 * node ranked by its top_k / M best scores (an integer, at most 16 and the node's experts). */
static int cfg_check_moe_nodes(const ust_config *c, ust_err *e) {
    const __typeof__(c->model.moe) *r = &c->model.moe;
    int M = r->max_nodes_per_token, G = r->n_group;
    if (!M || !r->num_experts) return 0;
    REQUIRE(G > 1,
            "model.moe.max_nodes_per_token (%d) limits the nodes a token's experts live on, but "
            "with model.moe.n_group 1 the experts are a single node: set n_group to the nodes "
            "expert parallelism spreads them over (DeepSeek-V3: 8)",
            M);
    REQUIRE(M <= G, "model.moe.max_nodes_per_token (%d) must be <= model.moe.n_group (%d nodes)", M,
            G);
    REQUIRE(r->topk_group == 1 || r->topk_group == M,
            "model.moe.max_nodes_per_token (%d) and model.moe.topk_group (%d) both choose how many "
            "groups a token reaches: give one",
            M, r->topk_group);
    REQUIRE(r->top_k % M == 0 && r->top_k / M <= 16 && r->top_k / M <= r->num_experts / G,
            "model.moe.top_k (%d) must be max_nodes_per_token (%d) x a share of at most 16 and "
            "at most the %d experts of a node: each node is ranked by its top_k / "
            "max_nodes_per_token best scores",
            r->top_k, M, r->num_experts / G);
    return 0;
}

/* model.moe.layers (one 0/1 per layer) against every and first_dense: some layer is MoE. */
static int cfg_check_moe_layers(const ust_config *c, ust_err *e) {
    const __typeof__(c->model) *m = &c->model;
    int n = 0, moe = 0;
    for (const char *s = m->moe.layers; *s; s++) n += *s == ',';
    n += m->moe.layers[0] != 0;
    REQUIRE(!n || n == m->n_layer,
            "model.moe.layers [%s] has %d entries; it takes one per layer (model.n_layer = %d), "
            "1 for a MoE layer and 0 for a dense one",
            m->moe.layers, n, m->n_layer);
    REQUIRE(!n || m->moe.every == 1,
            "model.moe.layers and model.moe.every (%d) both choose the MoE layers: give one",
            m->moe.every);
    const __typeof__(m->moe) *r = &m->moe;
    int G = r->n_group;
    REQUIRE(r->topk_group <= G,
            "model.moe.topk_group (%d) must be <= model.moe.n_group (%d): the groups a token's "
            "experts are chosen from",
            r->topk_group, G);
    REQUIRE(r->num_experts == 0 || r->num_experts % G == 0,
            "model.moe.num_experts (%d) must be divisible by model.moe.n_group (%d)",
            r->num_experts, G);
    REQUIRE(G == 1 || (G <= 64 && r->num_experts / G >= 2),
            "model.moe.n_group (%d): group-limited routing takes 2..64 groups of at least 2 "
            "experts each (model.moe.num_experts %d)",
            G, r->num_experts);
    int T = r->max_nodes_per_token ? r->max_nodes_per_token : r->topk_group; /* groups reached */
    REQUIRE(G == 1 || r->top_k <= T * (r->num_experts / G),
            "model.moe.top_k (%d) must be <= model.moe.topk_group (or max_nodes_per_token) x "
            "experts per group (%d x %d)",
            r->top_k, T, r->num_experts / G);
    REQUIRE(r->score != MOE_SIGMOID || r->z_loss_coef == 0,
            "model.moe.z_loss_coef (%g) needs softmax scores: sigmoid routing (model.moe.score) "
            "has no log-sum-exp; set it to 0",
            r->z_loss_coef);
    for (int l = 0; l < m->n_layer; l++) moe += cfg_layer_is_moe(c, l);
    REQUIRE(m->moe.num_experts == 0 || moe > 0,
            "model.moe.num_experts is %d but no layer is MoE (model.moe.first_dense %d, "
            "model.moe.layers [%s], model.n_layer %d): set num_experts: 0 for a dense model",
            m->moe.num_experts, m->moe.first_dense, m->moe.layers, m->n_layer);
    return 0;
}

/* model.sliding_window: one window, or one per layer; the windows below max_seq_len are one
 * size (the micro-batch carries one set of window starts). */

int cfg_window_slot(const ust_config *c, int l) {
    int w[CFG_MAX_WINDOWS], n = cfg_windows(c, w), W = cfg_layer_window(c, l);
    for (int k = 0; W && k < n; k++)
        if (w[k] == W) return k;
    return -1;
}

int cfg_windows(const ust_config *c, int *w) {
    int n = 0;
    if (!c->model.sliding_window[0]) return 0; /* the memory plan asks per layer and layout */
    for (int l = 0; l < c->model.n_layer; l++) {
        int W = cfg_layer_window(c, l), k = 0;
        while (k < n && w[k] != W) k++;
        if (W && k == n && n < CFG_MAX_WINDOWS) w[n++] = W;
    }
    return n;
}

/* model.sliding_window: one window, or one per layer; at most CFG_MAX_WINDOWS sizes below
 * max_seq_len (the micro-batch carries one set of window starts for each). */
static int cfg_check_window(const ust_config *c, ust_err *e) {
    const __typeof__(c->model) *m = &c->model;
    int n = 0;
    for (const char *s = m->sliding_window; *s; s++) n += *s == ',';
    n += m->sliding_window[0] != 0;
    REQUIRE(n <= 1 || n == m->n_layer,
            "model.sliding_window [%s] has %d entries; it takes one window for every layer or "
            "one per layer (model.n_layer = %d)",
            m->sliding_window, n, m->n_layer);
    REQUIRE(!n || m->arch == ARCH_LLAMA, "model.sliding_window applies to llama, not gpt2");
    int w[CFG_MAX_WINDOWS], k = cfg_windows(c, w);
    for (int l = 0; n && l < m->n_layer; l++) {
        int W = cfg_layer_window(c, l), known = !W;
        for (int i = 0; i < k; i++) known |= w[i] == W;
        REQUIRE(known,
                "model.sliding_window [%s]: layer %d's window %d is one size too many: ustrain "
                "computes at most %d window sizes below model.max_seq_len = %d per model",
                m->sliding_window, l, W, CFG_MAX_WINDOWS, m->max_seq_len);
    }
    return 0;
}

/* model.mla (DeepSeek-V3's latent attention): its dimensions, and what it does not combine with.
 * The widths below bound every per-token row the layer holds (H x head dims) well inside the
 * 32-bit element counts the ops take. */
static int cfg_validate_mla(const ust_config *c, ust_err *e) {
    const __typeof__(c->model) *m = &c->model;
    const __typeof__(m->mla) *a = &m->mla;
    if (!a->enabled) return 0;
    REQUIRE(m->arch == ARCH_LLAMA, "model.mla.enabled: true applies to llama (RMSNorm, RoPE), not "
                                   "gpt2 (set model.arch: llama)");
    REQUIRE(a->kv_lora_rank > 0,
            "model.mla.kv_lora_rank is 0, but latent attention needs the latent's width: 1 to "
            "1048576 (DeepSeek-V3: 512)");
    REQUIRE(a->qk_rope_head_dim % 2 == 0,
            "model.mla.qk_rope_head_dim (%d) must be even: RoPE rotates pairs (DeepSeek-V3: 64)",
            a->qk_rope_head_dim);
    REQUIRE(a->v_head_dim <= a->qk_nope_head_dim + a->qk_rope_head_dim,
            "model.mla.v_head_dim (%d) must be <= qk_nope_head_dim + qk_rope_head_dim (%d + %d): "
            "the attention op takes one head width, and v is zero-padded to q's and k's",
            a->v_head_dim, a->qk_nope_head_dim, a->qk_rope_head_dim);
    REQUIRE(m->n_kv_head == m->n_head,
            "model.mla: each of the model.n_head heads expands its own k and v from the latent; "
            "set model.n_kv_head (%d) = model.n_head (%d)",
            m->n_kv_head, m->n_head);
    REQUIRE(!m->qk_norm && !m->qkv_bias,
            "model.mla takes neither model.qk_norm nor model.qkv_bias (its q and latent have "
            "their own RMSNorms, its projections no biases): set both to false");
    REQUIRE(!m->post_norm && m->partial_rotary_factor >= 1 && !m->sliding_window[0],
            "model.mla takes neither model.post_norm, model.partial_rotary_factor < 1 nor "
            "model.sliding_window (DeepSeek-V3's blocks are pre-norm, its rope key is its own "
            "qk_rope_head_dim, its attention full)");
    REQUIRE(c->optimizer.qk_clip_threshold == 0,
            "optimizer.qk_clip_threshold (%g) with model.mla: QK-clip rescales q_proj/k_proj rows "
            "per head; latent attention's heads share kv_b_proj and the rope key (set it to 0)",
            c->optimizer.qk_clip_threshold);
    REQUIRE(!a->mscale_all_dim || m->rope_scaling.type != ROPE_NONE,
            "model.mla.mscale_all_dim (%g) scales the softmax by YaRN's factor: it needs "
            "model.rope_scaling (type yarn), or 0",
            a->mscale_all_dim);
    REQUIRE(!a->mscale_all_dim || cfg_act_size(c) == 4,
            "model.mla.mscale_all_dim under train.precision: bf16 on cuda is not supported yet "
            "(the softmax scale is applied to fp32 activations): use fp32, or 0");
    double H = m->n_head, qk = (double)a->qk_nope_head_dim + a->qk_rope_head_dim,
           kv = (double)a->qk_nope_head_dim + a->v_head_dim;
    REQUIRE(H * qk <= (1 << 24) && H * kv <= (1 << 24),
            "model.mla: model.n_head x (qk_nope_head_dim + qk_rope_head_dim) = %.0f and x "
            "(qk_nope_head_dim + v_head_dim) = %.0f features per token; at most 2^24 each",
            H * qk, H * kv);
    double C = m->d_model, q = a->q_lora_rank, r = a->kv_lora_rank,
           layer = (q > 0 ? C * q + q * H * qk : C * H * qk) + C * (r + a->qk_rope_head_dim) +
                   r * H * kv + H * a->v_head_dim * C;
    REQUIRE(layer * m->n_layer <= (double)CFG_MAX_PARAMS,
            "model.mla: the attention alone would have about %.3g parameters (model.n_layer %d); "
            "at most 2^42",
            layer * m->n_layer, m->n_layer);
    return 0;
}

/* model.mtp (DeepSeek-V3's multi-token prediction, model_mtp.h): D modules after the main model
 * on its last stage, each a pre-norm llama block; what they do not combine with yet. */
static int cfg_validate_mtp(const ust_config *c, ust_err *e) {
    const __typeof__(c->model) *m = &c->model;
    int D = m->mtp.depth;
    if (!D) return 0;
    REQUIRE(m->arch == ARCH_LLAMA,
            "model.mtp.depth %d applies to llama (RMSNorm, RoPE), not gpt2 "
            "(set model.arch: llama or model.mtp.depth: 0)",
            D);
    REQUIRE(D < c->train.seq_len,
            "model.mtp.depth %d reaches beyond the sequence: module k predicts the token k + 1 "
            "ahead, so it must be < train.seq_len (%d)",
            D, c->train.seq_len);
    REQUIRE(!m->post_norm && !m->sliding_window[0] && c->optimizer.qk_clip_threshold == 0,
            "model.mtp.depth %d takes neither model.post_norm, model.sliding_window nor "
            "optimizer.qk_clip_threshold (the modules' blocks are DeepSeek-V3's pre-norm, "
            "full-attention blocks): set them off or model.mtp.depth: 0",
            D);
    REQUIRE(!m->gemma.embed_scale && !m->gemma.sandwich_norm && m->gemma.hidden_act == HACT_SILU &&
                !m->gemma.norm_offset,
            "model.mtp.depth %d with Gemma 3's block options (model.embed_scale, sandwich_norm, "
            "hidden_act, norm_offset) is not supported (the modules are DeepSeek-V3's blocks): "
            "set model.mtp.depth: 0",
            D);
    return 0;
}

/* model.head_dim and Gemma 3's block options (model.gemma in config.h): llama only, and a dense
 * MLP for GeGLU and the sandwich norms. Both backends run them (fp32, and bf16 on CUDA). */
static int cfg_validate_gemma(const ust_config *c, ust_err *e) {
    const __typeof__(c->model) *m = &c->model;
    const __typeof__(m->gemma) *g = &m->gemma;
    int llama = m->arch == ARCH_LLAMA, mla = m->mla.enabled;
    REQUIRE(!m->head_dim || (llama && !mla),
            "model.head_dim %d applies to llama's attention (model.mla sets its own head widths)",
            m->head_dim);
    REQUIRE(g->hidden_act == HACT_SILU || (llama && m->moe.num_experts == 0),
            "model.hidden_act: gelu_tanh (GeGLU) applies to a dense llama MLP, not %s",
            llama ? "a mixture of experts" : "gpt2 (its MLP is GELU already)");
    REQUIRE(!g->norm_offset || (llama && !mla && !m->qk_norm_whole),
            "model.norm_offset: true applies to llama's RMSNorms (not gpt2's LayerNorm, "
            "model.mla's latent norms or model.qk_norm_whole)");
    REQUIRE(!g->sandwich_norm || (llama && !mla && !m->post_norm && m->moe.num_experts == 0),
            "model.sandwich_norm: true applies to a dense llama without model.post_norm or "
            "model.mla (Gemma 3's norms before and after attention and the MLP)");
    REQUIRE(!g->embed_scale || llama, "model.embed_scale: true applies to llama, not gpt2");
    REQUIRE(g->query_pre_attn_scalar == 0 || (llama && !mla && m->partial_rotary_factor >= 1),
            "model.query_pre_attn_scalar %g applies to llama's attention with whole-head RoPE",
            g->query_pre_attn_scalar);
    REQUIRE(
        g->rope_local_theta == 0 || (llama && !mla && m->sliding_window[0]),
        "model.rope_local_theta %g is the RoPE base of windowed layers, but model.sliding_window "
        "is empty (or the model is not a llama)",
        g->rope_local_theta);
    return 0;
}

static int cfg_validate_model(const ust_config *c, ust_err *e) {
    const __typeof__(c->model) *m = &c->model;
    REQUIRE(m->arch != ARCH_AUTO,
            "model.arch: auto takes the architecture from a Hugging Face model directory in "
            "model.init_from (a directory holding config.json), but model.init_from is %s%s%s",
            m->init_from[0] ? "'" : "", m->init_from[0] ? m->init_from : "null",
            m->init_from[0] ? "'" : "");
    REQUIRE(m->head_dim > 0 || m->d_model % m->n_head == 0,
            "model.d_model (%d) must be divisible by model.n_head (%d) (or set model.head_dim)",
            m->d_model, m->n_head);
    REQUIRE(m->n_head % m->n_kv_head == 0,
            "model.n_head (%d) must be divisible by model.n_kv_head (%d)", m->n_head, m->n_kv_head);
    REQUIRE(m->arch != ARCH_LLAMA || m->mla.enabled || cfg_head_dim(c) % 2 == 0,
            "llama's RoPE needs an even head dim, but model.d_model / model.n_head = %d / %d = %d",
            m->d_model, m->n_head, cfg_head_dim(c));
    REQUIRE(c->train.seq_len <= m->max_seq_len,
            "train.seq_len (%d) must be <= model.max_seq_len (%d)", c->train.seq_len,
            m->max_seq_len);
    REQUIRE(m->rope_scaling.type == ROPE_NONE || m->arch == ARCH_LLAMA,
            "model.rope_scaling applies to llama's RoPE; gpt2 has learned positions");
    if (cfg_check_window(c, e)) return -1;
    REQUIRE(!m->qk_norm || m->arch == ARCH_LLAMA,
            "model.qk_norm: true applies to llama (Qwen3's per-head q/k RMSNorm), not gpt2");
    REQUIRE(!m->qk_norm || c->optimizer.qk_clip_threshold == 0,
            "optimizer.qk_clip_threshold (%g) needs q/k weights that scale the logits, but "
            "model.qk_norm: true normalizes them away (set one of them off)",
            c->optimizer.qk_clip_threshold);

    REQUIRE(!m->qk_norm_whole || m->qk_norm,
            "model.qk_norm_whole: true says how model.qk_norm norms q and k, but model.qk_norm "
            "is false");
    if (m->partial_rotary_factor < 1) {
        int rot = (int)(cfg_head_dim(c) * m->partial_rotary_factor);
        REQUIRE(m->arch == ARCH_LLAMA && m->rope_scaling.type == ROPE_NONE,
                "model.partial_rotary_factor %g applies to llama's RoPE without rope_scaling",
                m->partial_rotary_factor);
        REQUIRE(rot >= 2 && rot % 2 == 0,
                "model.partial_rotary_factor %g rotates %d of a head's %d features; it must be an "
                "even number of at least 2",
                m->partial_rotary_factor, rot, cfg_head_dim(c));
        REQUIRE(c->run.device != DEV_CUDA,
                "model.partial_rotary_factor %g: the CUDA RoPE kernel rotates whole heads; train "
                "it with run.device: cpu",
                m->partial_rotary_factor);
    }
    REQUIRE(!m->post_norm || (m->arch == ARCH_LLAMA && m->moe.num_experts == 0),
            "model.post_norm: true applies to a dense llama (OLMo 2's norms after attention and "
            "the MLP), not %s",
            m->arch == ARCH_LLAMA ? "a mixture of experts" : "gpt2");
    REQUIRE(m->rope_scaling.type != ROPE_LLAMA3 ||
                m->rope_scaling.high_freq_factor > m->rope_scaling.low_freq_factor,
            "model.rope_scaling.high_freq_factor (%g) must be > low_freq_factor (%g)",
            m->rope_scaling.high_freq_factor, m->rope_scaling.low_freq_factor);
    const __typeof__(m->moe) *moe = &m->moe;
    REQUIRE(moe->num_experts == 0 || moe->top_k <= moe->num_experts,
            "model.moe.top_k (%d) must be <= model.moe.num_experts (%d)", moe->top_k,
            moe->num_experts);
    REQUIRE(moe->num_experts == 0 || moe->num_experts % c->parallel.ep == 0,
            "model.moe.num_experts (%d) must be divisible by parallel.ep (%d)", moe->num_experts,
            c->parallel.ep);
    REQUIRE(moe->num_experts > 0 || c->parallel.ep == 1,
            "parallel.ep (%d) needs experts, but model.moe.num_experts is 0", c->parallel.ep);
    if (cfg_check_moe_layers(c, e) || cfg_check_moe_nodes(c, e) || cfg_validate_mtp(c, e))
        return -1;
    if (cfg_validate_gemma(c, e)) return -1;
    return cfg_validate_mla(c, e);
}

/* Validation sized in windows or tokens: whole micro-batches of whole windows, so every
 * micro-batch size that divides it evaluates the same windows. */
static int cfg_validate_val(const ust_config *c, ust_err *e) {
    int64_t S = c->data.val_samples, K = c->data.val_tokens, T = c->train.seq_len,
            B = c->train.micro_batch_size;
    REQUIRE(!(S > 0 && K > 0), "data.val_samples (%lld) and data.val_tokens (%lld): give one",
            (long long)S, (long long)K);
    REQUIRE(K % T == 0,
            "data.val_tokens (%lld) must be whole windows of train.seq_len (%lld), e.g. %lld",
            (long long)K, (long long)T, (long long)((K / T + 1) * T));
    if (K > 0) S = K / T;
    REQUIRE(S % B == 0,
            "data.val_%s (%lld windows) must be whole micro-batches of "
            "train.micro_batch_size (%lld), e.g. %lld windows",
            K > 0 ? "tokens" : "samples", (long long)S, (long long)B, (long long)((S / B + 1) * B));
    REQUIRE(S / B <= (1 << 24), "data.val_%s: %lld micro-batches of validation; at most 2^24",
            K > 0 ? "tokens" : "samples", (long long)(S / B));
    return 0;
}

/* train.batch_ramp: every step's batch whole micro-batches of every dp rank, below the target. */
static int cfg_validate_ramp(const ust_config *c, ust_err *e) {
    const __typeof__(c->train.batch_ramp) *r = &c->train.batch_ramp;
    long long per = (long long)c->train.micro_batch_size * c->parallel.dp;
    if (r->start == 0) return 0;
    REQUIRE(r->start < c->train.global_batch_size,
            "train.batch_ramp.start (%d) must be below train.global_batch_size (%d), the target",
            r->start, c->train.global_batch_size);
    REQUIRE(r->start % per == 0 && r->increment % per == 0 && r->increment > 0,
            "train.batch_ramp.start (%d) and increment (%d) must be positive multiples of "
            "train.micro_batch_size * parallel.dp (%lld): every step is whole micro-batches",
            r->start, r->increment, per);
    REQUIRE((c->train.global_batch_size - r->start) % r->increment == 0,
            "train.batch_ramp: train.global_batch_size - start (%d - %d) must be whole "
            "increments of %d",
            c->train.global_batch_size, r->start, r->increment);
    REQUIRE(r->tokens > 0, "train.batch_ramp.tokens must be > 0 (the ramp's length) when start "
                           "is set");
    REQUIRE(c->model.moe.num_experts == 0,
            "train.batch_ramp with model.moe.num_experts > 0 is not supported yet (the MoE loss "
            "is averaged over a fixed count of micro-batches)");
    return 0;
}

/* optimizer.embed / norm: -1 (the optimizer's) or a value; the floor not above the group's peak. */
static int cfg_validate_group(const ust_config *c, const cfg_lr_group *g, const char *name,
                              double own, ust_err *e) {
    const __typeof__(c->optimizer) *o = &c->optimizer;
    double peak = own > 0 ? own : !strcmp(o->name, "muon") && o->adamw_lr > 0 ? o->adamw_lr : o->lr;
    REQUIRE(g->min_lr == -1 || g->min_lr >= 0,
            "optimizer.%s.min_lr (%g) must be -1 (optimizer.min_lr scaled to the group's peak) "
            "or >= 0",
            name, g->min_lr);
    REQUIRE(g->weight_decay == -1 || g->weight_decay >= 0,
            "optimizer.%s.weight_decay (%g) must be -1 (optimizer.weight_decay) or >= 0", name,
            g->weight_decay);
    REQUIRE(g->min_lr <= peak, "optimizer.%s.min_lr (%g) must be <= the group's peak lr (%g)", name,
            g->min_lr, peak);
    return 0;
}

/* train.seq_len_warmup: every step's length start x 2^n, so the pieces tile each window. */
static int cfg_validate_seq_warmup(const ust_config *c, ust_err *e) {
    long long S = c->train.seq_len_warmup.start, T = c->train.seq_len;
    if (S == 0) return 0;
    REQUIRE(S < T,
            "train.seq_len_warmup.start (%lld) must be below train.seq_len (%lld), the target", S,
            T);
    long long ratio = T % S == 0 ? T / S : 0;
    REQUIRE(ratio > 0 && (ratio & (ratio - 1)) == 0,
            "train.seq_len_warmup.start (%lld) must be train.seq_len (%lld) / 2^k, e.g. %lld: "
            "every length start x 2^n then cuts the windows into whole sequences",
            S, T, T / 2);
    REQUIRE(c->train.seq_len_warmup.tokens > 0,
            "train.seq_len_warmup.tokens must be > 0 (the warmup's length) when start is set");
    REQUIRE(c->model.mtp.depth == 0,
            "train.seq_len_warmup with model.mtp.depth %d is not supported (the prediction "
            "modules' targets run past a short sequence's end): set one of them off",
            c->model.mtp.depth);
    return 0;
}

static int cfg_validate_train(const ust_config *c, ust_err *e) {
    long long per_step = (long long)c->train.micro_batch_size * c->parallel.dp;
    REQUIRE(c->train.global_batch_size % per_step == 0,
            "train.global_batch_size (%d) must be divisible by train.micro_batch_size * "
            "parallel.dp (%d * %d = %lld)",
            c->train.global_batch_size, c->train.micro_batch_size, c->parallel.dp, per_step);
    REQUIRE(c->optimizer.min_lr <= c->optimizer.lr,
            "optimizer.min_lr (%g) must be <= optimizer.lr (%g)", c->optimizer.min_lr,
            c->optimizer.lr);
    REQUIRE(c->data.train[0], "data.train is empty: it must name the training shards (a glob)");
    REQUIRE(c->data.eot_id < c->model.vocab_size,
            "data.eot_id (%d) must be a token of the vocabulary, below model.vocab_size (%d)",
            c->data.eot_id, c->model.vocab_size);
    if (cfg_validate_val(c, e) || cfg_validate_ramp(c, e) || cfg_validate_seq_warmup(c, e) ||
        cfg_validate_group(c, &c->optimizer.embed, "embed", c->optimizer.embed_lr, e) ||
        cfg_validate_group(c, &c->optimizer.norm, "norm", c->optimizer.norm_lr, e))
        return -1;
    REQUIRE(c->checkpoint.dir[0], "checkpoint.dir is empty%s",
            c->checkpoint.async ? " (checkpoint.async writes checkpoints there)" : "");
    return 0;
}

/* Sizes derived from several keys, computed in double so the products cannot wrap: the memory
 * plan, the parameter table and the step loop compute them in 64 bits (token counts in 32), and
 * these bounds keep every such product exact. The estimates are generous upper bounds (no
 * parallel split, more saved rows per token than any layer keeps), so a layout the plan counts
 * exactly is never refused here for want of precision. */
static int cfg_validate_sizes(const ust_config *c, ust_err *e) {
    const __typeof__(c->model) *m = &c->model;
    const __typeof__(c->parallel) *p = &c->parallel;
    double tokens = (double)c->train.micro_batch_size * c->train.seq_len;
    REQUIRE(tokens <= CFG_MAX_TOKENS,
            "train.micro_batch_size x train.seq_len = %d x %d = %.0f tokens per micro-batch; at "
            "most %d",
            c->train.micro_batch_size, c->train.seq_len, tokens, CFG_MAX_TOKENS);
    double ranks = (double)p->dp * p->tp * p->pp * p->cp;
    REQUIRE(ranks <= CFG_MAX_WORLD,
            "parallel.dp x tp x pp x cp = %d x %d x %d x %d = %.0f ranks; at most %d", p->dp, p->tp,
            p->pp, p->cp, ranks, CFG_MAX_WORLD);
    double C = m->d_model, F = m->d_ff, V = cfg_vocab_padded(c), L = m->n_layer;
    double E = m->moe.num_experts, Fe = m->moe.d_ff_expert, k = m->moe.top_k;
    /* a layer: attention (at most 4 C x C, kv heads being at most the heads) and the MLP (3 C x
     * F); with experts, each of them and a shared one (3 C x Fe) and the router */
    double layer = 4 * C * C + 3 * C * F + (E > 0 ? (E + 1) * 3 * C * Fe + E * C : 0);
    double params = L * layer + 2 * V * C + (double)m->max_seq_len * C;
    REQUIRE(params <= (double)CFG_MAX_PARAMS,
            "the model would have about %.3g parameters (model.n_layer %d, d_model %d, d_ff %d, "
            "vocab_size %d, moe.num_experts %d x d_ff_expert %d); at most 2^42 = %.3g",
            params, m->n_layer, m->d_model, m->d_ff, m->vocab_size, m->moe.num_experts,
            m->moe.d_ff_expert, (double)CFG_MAX_PARAMS);
    /* fp32 bytes per token of one micro-batch: every layer's saved rows of width C, F and k x
     * (C + Fe), the logits; a pipeline holds up to every micro-batch of the step at once */
    double per_token =
        4 * (L * (32 * C + 16 * F + (E > 0 ? 16 * k * (C + Fe) + 4 * E : 0)) + 16 * V);
    double in_flight =
        p->pp > 1 ? (double)c->train.global_batch_size / c->train.micro_batch_size : 1;
    double acts = tokens * per_token * in_flight;
    REQUIRE(acts <= (double)CFG_MAX_ACT_BYTES,
            "activations would take about %.3g bytes (%.0f tokens per micro-batch = "
            "train.micro_batch_size x seq_len, x %.0f micro-batches in flight, through "
            "model.n_layer %d layers of d_model %d, d_ff %d, and vocab %.0f); at most 2^56 = "
            "%.3g",
            acts, tokens, in_flight, m->n_layer, m->d_model, m->d_ff, V, (double)CFG_MAX_ACT_BYTES);
    return 0;
}

/* More compute threads than cores only time-slice, and far more (train.threads: 100000) hang
 * inside OpenBLAS's thread setup: on the CPU backend (the only one that reads train.threads), at
 * most 4 per online CPU of this machine (hyperthreads and a busy machine aside, more never
 * helps); the table's range caps it at CFG_MAX_THREADS on any machine. */
static int cfg_validate_threads(const ust_config *c, ust_err *e) {
    if (c->run.device != DEV_CPU) return 0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long limit = cpus > 0 && 4 * cpus < CFG_MAX_THREADS ? 4 * cpus : CFG_MAX_THREADS;
    REQUIRE(c->train.threads <= limit,
            "train.threads (%d) must be at most %ld (4 x the %ld online CPUs, at most %d; 0 = one "
            "per core)",
            c->train.threads, limit, cpus, CFG_MAX_THREADS);
    return 0;
}

static int cfg_validate_world(const ust_config *c, int world, ust_err *e) {
    const __typeof__(c->parallel) *p = &c->parallel;
    long long product = (long long)p->dp * p->tp * p->pp * p->cp;
    REQUIRE(world <= 0 || world == product,
            "world size (%d) must equal parallel.dp * tp * pp * cp (%d * %d * %d * %d = %lld)",
            world, p->dp, p->tp, p->pp, p->cp, product);
    return 0;
}

int cfg_resolve_auto(ust_config *c, int world, ust_err *e) {
    if (c->parallel.dp != 0 || world <= 0) return 0;
    int64_t rest = (int64_t)c->parallel.tp * c->parallel.pp * c->parallel.cp;
    if (world % rest)
        return cfg_vfail(c, e,
                         "parallel.dp: auto: the world of %d ranks is not a multiple of tp x pp "
                         "x cp = %lld",
                         world, (long long)rest);
    int dp = (int)(world / rest), mb = c->train.micro_batch_size;
    int64_t G = c->train.global_batch_size;
    if (G % ((int64_t)mb * dp))
        return cfg_vfail(c, e,
                         "parallel.dp: auto gives dp = %d on %d ranks, which does not divide "
                         "the %lld micro-batches of %d in train.global_batch_size = %lld (the "
                         "global batch stays fixed across restarts: use a world where it does)",
                         dp, world, (long long)(G / mb), mb, (long long)G);
    c->parallel.dp = dp;
    return 0;
}

int cfg_validate(const ust_config *c, int world, ust_err *e) {
    if (c->parallel.dp == 0)
        return cfg_vfail(c, e,
                         "parallel.dp: auto needs the world size (the launcher's when training; "
                         "--world N for validate and plan)");
    for (size_t i = 0; i < cfg_n_keys; i++) {
        char why[1024];
        if (cfg_check_value(c, &cfg_keys[i], why, sizeof why))
            return cfg_vfail(c, e, "%s: %s", cfg_keys[i].path, why);
    }
    if (cfg_validate_model(c, e) || cfg_validate_sizes(c, e) || cfg_validate_parallel(c, e) ||
        cfg_validate_train(c, e) || cfg_validate_threads(c, e) || cfg_validate_world(c, world, e))
        return -1;
    return 0;
}

/* ---------------------------------------------------------------- derived values */

int cfg_vocab_padded(const ust_config *c) {
    int64_t v = c->model.vocab_size, pad = c->model.vocab_pad; /* in range: < 2^24 + 2^16 */
    return (int)(pad > 0 ? (v + pad - 1) / pad * pad : v);
}

int cfg_grad_accum(const ust_config *c) {
    long long per_step = (long long)c->train.micro_batch_size * c->parallel.dp;
    return per_step > 0 ? (int)(c->train.global_batch_size / per_step) : 0;
}

int cfg_batch_at(const ust_config *c, int64_t tokens) {
    const __typeof__(c->train.batch_ramp) *r = &c->train.batch_ramp;
    int G = c->train.global_batch_size;
    if (r->start <= 0 || r->start >= G) return G;
    int64_t n = (G - r->start) / r->increment; /* increments to the target */
    /* in 128 bits: tokens x n may pass 2^63 for long runs */
    int64_t k = (int64_t)((__int128)tokens * n / r->tokens);
    return k >= n ? G : r->start + (int)k * r->increment;
}

int cfg_seq_len_at(const ust_config *c, int64_t tokens) {
    int64_t S = c->train.seq_len_warmup.start, T = c->train.seq_len,
            N = c->train.seq_len_warmup.tokens;
    if (S <= 0 || S >= T || N <= 0 || tokens >= N) return (int)T;
    /* floor of the linear length; 2L <= it exactly when 2L <= the real one (2L is whole) */
    int64_t lin = S + (int64_t)((__int128)(T - S) * tokens / N), L = S;
    while (2 * L <= lin && 2 * L <= T) L *= 2;
    return (int)L;
}

int cfg_val_micro_batches(const ust_config *c) {
    int64_t B = c->train.micro_batch_size, T = c->train.seq_len, S = c->data.val_samples;
    if (c->data.val_tokens > 0 && T > 0) S = c->data.val_tokens / T;
    return S > 0 && B > 0 ? (int)(S / B) : c->data.val_steps;
}

int cfg_head_dim(const ust_config *c) {
    /* latent attention's q and k heads; its v heads (v_head_dim) are padded to this width */
    if (c->model.mla.enabled) return c->model.mla.qk_nope_head_dim + c->model.mla.qk_rope_head_dim;
    if (c->model.head_dim > 0) return c->model.head_dim;
    return c->model.n_head > 0 ? c->model.d_model / c->model.n_head : 0;
}

bool cfg_tied(const ust_config *c) { return c->model.arch == ARCH_GPT2 || c->model.tie_embeddings; }

int cfg_act_size(const ust_config *c) {
    return c->run.device == DEV_CUDA && c->train.precision == PREC_BF16 ? 2 : 4;
}
