/* params.c: the model's parameter table, units, initialization and the llm.c importer (the
 * parameter half of model.h; params.h). Shapes as in model.c. */
#include "params.h"
#include "acts.h"
#include "model_state.h"
#include "optim_muon.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "fs.h"
#include "rng.h"

/* ------------------------------------------------------------------ parameter table */

/* How a tensor is split over the tensor-parallel group: whole, by rows (column-parallel
 * output features, vocabulary rows), or by columns (row-parallel input features; a 1-D bias of
 * a column-parallel layer is a row vector split by columns). */
enum { SPLIT_NONE, SPLIT_ROWS, SPLIT_COLS };

static void add_param(model *m, const char *name, int64_t rows, int64_t cols, int split, int decay,
                      float std, float value, float **p, float **g) {
    if (m->tab.nparams == m->tab.cap) {
        m->tab.cap = m->tab.cap ? 2 * m->tab.cap : 64;
        m->tab.params = realloc(m->tab.params, m->tab.cap * sizeof *m->tab.params);
        m->tab.targets = realloc(m->tab.targets, m->tab.cap * sizeof *m->tab.targets);
        m->tab.param_unit = realloc(m->tab.param_unit, m->tab.cap * sizeof *m->tab.param_unit);
        UST_ASSERT(m->tab.params && m->tab.targets && m->tab.param_unit,
                   "out of host memory for %d params", m->tab.cap);
    }
    model_param *q = &m->tab.params[m->tab.nparams];
    memset(q, 0, sizeof *q);
    if (!m->tab.sizing) { /* the plan's thousands of layouts need the shapes only */
        snprintf(q->name, sizeof q->name, "%s", name);
        snprintf(q->whole.name, sizeof q->whole.name, "%s", name);
    }
    q->whole.ndim = rows > 1 || decay ? 2 : 1;
    q->whole.shape[0] = q->whole.ndim == 2 ? rows : rows * cols;
    q->whole.shape[1] = q->whole.ndim == 2 ? cols : 0;
    q->slice = ckpt_whole(&q->whole);
    int start;
    if (split == SPLIT_ROWS) {
        q->slice.nrows = tp_part(m->par.tp, (int)rows, &start);
        q->slice.row0 = start;
    } else if (split == SPLIT_COLS) {
        q->slice.ncols = tp_part(m->par.tp, (int)cols, &start);
        q->slice.col0 = start;
    }
    if (m->tab.sub_nrows > 0) { /* a vocabulary chunk: rows of this rank's slice */
        q->slice.row0 += m->tab.sub_row0;
        q->slice.nrows = m->tab.sub_nrows;
    }
    q->tp_split = split != SPLIT_NONE;
    q->numel = q->slice.nrows * q->slice.ncols;
    q->slice.flat0 = 0;
    q->slice.flat1 = q->numel;
    q->offset = m->tab.numel;
    q->decay = decay;
    q->matrix = optim_matrix_kind(name, q->whole.ndim, decay);
    q->replica = m->tab.copy_chunk;
    q->init_std = std;
    q->init_value = value;
    m->tab.targets[m->tab.nparams] = (param_target){p, g};
    m->tab.param_unit[m->tab.nparams] = m->tab.cur_unit;
    m->tab.numel += (q->numel + 15) & ~(int64_t)15; /* 64-byte aligned tensors */
    m->tab.nparams++;
}

static void end_unit(model *m, int64_t min_len);

/* MoE tensors stay whole (never tensor-split); the experts open a unit of their own, which is
 * reduced over expert-dp x cp instead of dp x cp. */
static void add_moe_param(void *ctx, const moe_param *q) {
    model *m = ctx;
    if (q->expert >= 0 && !m->tab.in_experts) {
        end_unit(m, 0);
        m->tab.unit_expert[m->tab.cur_unit] = 1;
        m->tab.in_experts = 1;
    }
    add_param(m, q->name, q->rows, q->cols, SPLIT_NONE, q->decay, q->init_std, q->init_value, q->p,
              q->g);
}

/* A sizes-only table (the memory plan's): the first local expert's tensors stand for all El
 * (model_param.repeat), the flat layout advanced as if the others followed, so a model of
 * hundreds of experts a layer costs the plan of thousands of layouts a few entries per layer. */
static void add_moe_sizes(model *m, int l, int ep, int rank) {
    int i0 = m->tab.nparams, El = m->cfg->model.moe.num_experts / ep;
    moe_enum_first_expert(m->cfg, l, ep, rank, add_moe_param, m);
    int64_t stride = 0, whole = 0;
    for (int i = i0; i < m->tab.nparams; i++) {
        model_param *q = &m->tab.params[i];
        if (m->tab.param_unit[i] != m->tab.cur_unit) continue; /* router, shared expert */
        stride += (q->numel + 15) & ~(int64_t)15;              /* add_param's alignment */
        whole += q->numel;                                     /* experts are never split */
    }
    for (int i = i0; i < m->tab.nparams; i++)
        if (m->tab.param_unit[i] == m->tab.cur_unit)
            m->tab.params[i].repeat = El, m->tab.params[i].stride = stride;
    m->tab.numel += (El - 1) * stride;
    m->tab.unlisted += (El - 1) * whole;
}

static void add_moe_params(model *m, int l) {
    m->tab.in_experts = 0;
    int ep = m->tab.listing ? 1 : m->moe.ep_size, rank = m->tab.listing ? 0 : m->moe.ep_rank;
    if (m->tab.sizing) /* one expert stands for the layer's others (the whole list's too) */
        add_moe_sizes(m, l, ep, rank);
    else if (m->tab.listing)
        moe_enum_params(m->cfg, l, 1, 0, NULL, NULL, add_moe_param, m);
    else
        moe_enum_params(m->cfg, l, ep, rank, m->moe.mw ? &m->moe.mw[l] : NULL,
                        m->moe.mg ? &m->moe.mg[l] : NULL, add_moe_param, m);
    m->tab.in_experts = 0;
}

/* model.mla's attention tensors, under transformers' DeepseekV3Attention names: the
 * up-projections split by heads (rows), o_proj by its H*v_head_dim columns, the
 * down-projections and latent norms whole on every tp rank (their gradients summed there). */
static void add_mla_params(model *m, int l) {
    char n[CKPT_NAME_MAX] = "";
    layer_w *w = &m->w.lw[l], *g = &m->w.lg[l];
    const __typeof__(m->cfg->model.mla) *c = &m->cfg->model.mla;
    int64_t C = m->shape.C, H = m->shape.Hg, QK = H * m->shape.D,
            KV = H * (c->qk_nope_head_dim + c->v_head_dim), O = H * c->v_head_dim;
    float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * m->shape.L);
    const int N0 = SPLIT_NONE, R = SPLIT_ROWS, CO = SPLIT_COLS;
    // clang-format off
#define P(suffix, rows, cols, split, decay, sd, val, field)                                       \
    if (!m->tab.sizing) snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                      \
    add_param(m, n, rows, cols, split, decay, sd, val, &w->field, &g->field)
    if (c->q_lora_rank) {
        P("self_attn.q_a_proj.weight", c->q_lora_rank, C, N0, 1, std, 0, wqa);
        P("self_attn.q_a_layernorm.weight", 1, c->q_lora_rank, N0, 0, 0, 1, qa_norm);
        P("self_attn.q_b_proj.weight", QK, c->q_lora_rank, R, 1, std, 0, wqb);
    } else {
        P("self_attn.q_proj.weight", QK, C, R, 1, std, 0, wq);
    }
    P("self_attn.kv_a_proj_with_mqa.weight", c->kv_lora_rank + c->qk_rope_head_dim, C, N0, 1, std, 0, wkva);
    P("self_attn.kv_a_layernorm.weight", 1, c->kv_lora_rank, N0, 0, 0, 1, kva_norm);
    P("self_attn.kv_b_proj.weight", KV, c->kv_lora_rank, R, 1, std, 0, wkvb);
    P("self_attn.o_proj.weight", C, O, CO, 1, proj_std, 0, wo);
#undef P
    // clang-format on
}

static void add_layer_params(model *m, int l) {
    char n[CKPT_NAME_MAX] = "";
    layer_w *w = &m->w.lw[l], *g = &m->w.lg[l];
    int C = m->shape.C, HD = m->shape.Hg * m->shape.D, KV = m->shape.Hkvg * m->shape.D,
        F = m->shape.Fg, gpt2 = !m->shape.llama;
    float std = 0.02f,
          proj_std = 0.02f / sqrtf(2.0f * m->shape.L); /* GPT-2's scaled residual init */
    const int N0 = SPLIT_NONE, R = SPLIT_ROWS, CO = SPLIT_COLS;
    /* one line per tensor: the layer's parameter table */
    // clang-format off
#define P(suffix, rows, cols, split, decay, sd, val, field)                                       \
    if (!m->tab.sizing) snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                      \
    add_param(m, n, rows, cols, split, decay, sd, val, &w->field, &g->field)
    /* model.post_norm (OLMo 2): norm 1 follows attention and norm 2 the MLP, named so */
    int post = m->shape.fam.post_norm, qn = m->shape.qk_whole ? m->shape.Hg : 1;
    /* model.norm_offset: the norms scale by 1 + w, so they start at w = 0 (Gemma's init) */
    int sw = m->shape.fam.sandwich, n1 = !m->shape.fam.norm_offset;
    P(post ? "post_attention_layernorm.weight" : "input_layernorm.weight", 1, C, N0, 0, 0, n1, ln1_w);
    if (gpt2) { P("input_layernorm.bias", 1, C, N0, 0, 0, 0, ln1_b); }
    if (is_mla(m)) { add_mla_params(m, l); goto mlp; }
    P("self_attn.q_proj.weight", HD, C, R, 1, std, 0, wq);
    if (m->shape.qkv_bias) { P("self_attn.q_proj.bias", 1, HD, CO, 0, 0, 0, bq); }
    P("self_attn.k_proj.weight", KV, C, R, 1, std, 0, wk);
    if (m->shape.qkv_bias) { P("self_attn.k_proj.bias", 1, KV, CO, 0, 0, 0, bk); }
    P("self_attn.v_proj.weight", KV, C, R, 1, std, 0, wv);
    if (m->shape.qkv_bias) { P("self_attn.v_proj.bias", 1, KV, CO, 0, 0, 0, bv); }
    P("self_attn.o_proj.weight", C, HD, CO, 1, proj_std, 0, wo);
    if (gpt2) { P("self_attn.o_proj.bias", 1, C, N0, 0, 0, 0, bo); }
    /* whole on every tp rank: each rank's heads use all of it (gradients summed, tp.c) */
    /* model.qk_norm_whole: one weight over all heads (qn of them; k: Hkv), whole on each rank */
    if (m->shape.qk_norm) { P("self_attn.q_norm.weight", 1, qn * m->shape.D, N0, 0, 0, n1, qn_w); }
    if (m->shape.qk_norm) { P("self_attn.k_norm.weight", 1, (qn > 1 ? m->shape.Hkvg : 1) * m->shape.D, N0, 0, 0, n1, kn_w); }
    /* model.sandwich_norm (Gemma 3): ln1 and ln2 before attention and the MLP, pn1 and pn2 after */
    if (sw) { P("post_attention_layernorm.weight", 1, C, N0, 0, 0, n1, pn1_w); }
mlp:
    P(post ? "post_feedforward_layernorm.weight" : sw ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight", 1, C, N0, 0, 0, n1, ln2_w);
    if (sw) { P("post_feedforward_layernorm.weight", 1, C, N0, 0, 0, n1, pn2_w); }
    if (gpt2) { P("post_attention_layernorm.bias", 1, C, N0, 0, 0, 0, ln2_b); }
    if (is_moe(m, l)) { add_moe_params(m, l); return; }
    if (!gpt2) { P("mlp.gate_proj.weight", F, C, R, 1, std, 0, wg); }
    P("mlp.up_proj.weight", F, C, R, 1, std, 0, wu);
    if (gpt2) { P("mlp.up_proj.bias", 1, F, CO, 0, 0, 0, bu); }
    P("mlp.down_proj.weight", C, F, CO, 1, proj_std, 0, wd);
    if (gpt2) { P("mlp.down_proj.bias", 1, C, N0, 0, 0, 0, bd); }
#undef P
    // clang-format on
}

/* model.mtp's module k, a unit of its own before the head's, under DeepSeek-V3's checkpoint
 * names (layer n_layer + k): enorm, hnorm, eh_proj (whole on every tp rank: it runs on this
 * rank's rows, its gradient summed under sp), the block, shared_head.norm. The embedding and the
 * head are the main model's. */
static void add_mtp_params(model *m, int k) {
    char n[CKPT_NAME_MAX] = "";
    int l = m->shape.L + k, C = m->shape.C;
    mtp_w *w = &m->mtp.w[k], *g = &m->mtp.g[k];
#define P(suffix, rows, cols, decay, sd, val, field)                                               \
    if (!m->tab.sizing) snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                    \
    add_param(m, n, rows, cols, SPLIT_NONE, decay, sd, val, &w->field, &g->field)
    P("enorm.weight", 1, C, 0, 0, 1, enorm);
    P("hnorm.weight", 1, C, 0, 0, 1, hnorm);
    P("eh_proj.weight", C, 2 * C, 1, 0.02f, 0, eh);
    /* a MoE block's experts close the module's unit and open their own (add_moe_param) */
    if (is_moe(m, l)) {
        P("shared_head.norm.weight", 1, C, 0, 0, 1, norm);
    }
    add_layer_params(m, l);
    if (!is_moe(m, l)) {
        P("shared_head.norm.weight", 1, C, 0, 0, 1, norm);
    }
#undef P
}

/* Closes the current unit: pads the flat buffer to a multiple of unit_pad, and to at least
 * min_len floats. */
static void end_unit(model *m, int64_t min_len) {
    int u = m->tab.cur_unit++;
    m->tab.numel = (m->tab.numel + m->tab.unit_pad - 1) / m->tab.unit_pad * m->tab.unit_pad;
    if (m->tab.numel - m->tab.unit_off[u] < min_len) m->tab.numel = m->tab.unit_off[u] + min_len;
    m->tab.unit_len[u] = m->tab.numel - m->tab.unit_off[u];
    if (m->tab.cur_unit < m->tab.nunits) m->tab.unit_off[m->tab.cur_unit] = m->tab.numel;
}

static int64_t align16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* Tied embeddings over a pipeline: the first stage's embedding unit and the last stage's head
 * unit (which starts with the copy) get one common length, so a ZeRO partition of the table
 * covers the same elements on both ends and the copy's gradient syncs shard by shard. */
static int64_t tied_unit_len(const model *m) {
    int64_t table = align16((int64_t)m->shape.Vl * m->shape.C);
    int64_t embed = table + (m->shape.llama ? 0 : align16((int64_t)m->shape.maxT * m->shape.C));
    int64_t head = table + align16(m->shape.C) * (m->shape.llama ? 1 : 2);
    int64_t len = embed > head ? embed : head;
    return (len + m->tab.unit_pad - 1) / m->tab.unit_pad * m->tab.unit_pad;
}

/* The vocabulary chunks of a table (params[..].name `name`): one parameter and one unit each,
 * rows [k * vc_rows, ...) of this rank's slice; w[k], g[k] get their pointers. */
static void add_vocab_chunks(model *m, const char *name, float **w, float **g, int replica) {
    for (int k = 0; k < m->vc.nvc; k++) {
        int r0 = k * m->vc.vc_rows;
        m->tab.sub_row0 = r0;
        m->tab.sub_nrows = m->shape.Vl - r0 < m->vc.vc_rows ? m->shape.Vl - r0 : m->vc.vc_rows;
        add_param(m, name, m->shape.Vp, m->shape.C, SPLIT_ROWS, 1, 0.02f, 0, &w[k], &g[k]);
        m->tab.params[m->tab.nparams - 1].replica |= replica;
        m->tab.sub_row0 = m->tab.sub_nrows = 0;
        end_unit(m, 0);
    }
}

static void add_embed_unit(model *m) {
    int C = m->shape.C;
    if (m->vc.nvc) { /* positions (gpt2), then the table's chunks */
        if (!m->shape.llama) {
            add_param(m, "model.embed_positions.weight", m->shape.maxT, C, SPLIT_NONE, 1, 0.02f, 0,
                      &m->w.wpe, &m->w.g_wpe);
            end_unit(m, 0);
        }
        m->vc.wte_u0 = m->tab.cur_unit;
        add_vocab_chunks(m, "model.embed_tokens.weight", m->vc.wte_c, m->vc.g_wte_c, 0);
        return;
    }
    add_param(m, "model.embed_tokens.weight", m->shape.Vp, C, SPLIT_ROWS, 1, 0.02f, 0, &m->w.wte,
              &m->w.g_wte);
    if (!m->shape.llama)
        add_param(m, "model.embed_positions.weight", m->shape.maxT, C, SPLIT_NONE, 1, 0.02f, 0,
                  &m->w.wpe, &m->w.g_wpe);
    end_unit(m, m->shape.tied && m->cfg->parallel.pp > 1 ? tied_unit_len(m) : 0);
}

static void add_head_unit(model *m) {
    int C = m->shape.C;
    if (m->vc.nvc) { /* the final norm, then the head's chunks (tied here: the table's) */
        add_param(m, "model.norm.weight", 1, C, SPLIT_NONE, 0, 0, !m->shape.fam.norm_offset,
                  &m->w.lnf_w, &m->w.g_lnf_w);
        if (!m->shape.llama)
            add_param(m, "model.norm.bias", 1, C, SPLIT_NONE, 0, 0, 0, &m->w.lnf_b, &m->w.g_lnf_b);
        end_unit(m, 0);
        if (m->shape.tied_local) {
            m->vc.lm_u0 = m->vc.wte_u0;
            return;
        }
        m->vc.lm_u0 = m->tab.cur_unit;
        add_vocab_chunks(m, m->shape.tied_copy ? "model.embed_tokens.weight" : "lm_head.weight",
                         m->vc.lm_c, m->vc.g_lm_c, m->shape.tied_copy);
        return;
    }
    if (m->shape.tied_copy) { /* the copy, under the embedding's own name: initialized, saved and
                           loaded as that tensor (only the first stage writes it) */
        add_param(m, "model.embed_tokens.weight", m->shape.Vp, C, SPLIT_ROWS, 1, 0.02f, 0, &m->w.lm,
                  &m->w.g_lm);
        m->tab.params[m->tab.nparams - 1].replica = 1;
    }
    add_param(m, "model.norm.weight", 1, C, SPLIT_NONE, 0, 0, !m->shape.fam.norm_offset,
              &m->w.lnf_w, &m->w.g_lnf_w);
    if (!m->shape.llama)
        add_param(m, "model.norm.bias", 1, C, SPLIT_NONE, 0, 0, 0, &m->w.lnf_b, &m->w.g_lnf_b);
    if (!m->shape.tied)
        add_param(m, "lm_head.weight", m->shape.Vp, C, SPLIT_ROWS, 1, 0.02f, 0, &m->w.lm,
                  &m->w.g_lm);
    end_unit(m, m->shape.tied_copy ? tied_unit_len(m) : 0);
}

static void build_param_table(model *m) {
    m->tab.nunits = 0;
    for (int c = 0; c < m->nchunks; c++) {
        model_chunk *ch = &m->chunks[c];
        ch->unit0 = m->tab.nunits;
        ch->nunits = (ch->hi - ch->lo) + (m->vc.nvc ? 0 : ch->embed + ch->head);
        if (m->vc.nvc && ch->embed)
            ch->nunits += m->vc.nvc + !m->shape.llama; /* positions, chunks */
        if (m->vc.nvc && ch->head) ch->nunits += 1 + (m->shape.tied_local ? 0 : m->vc.nvc);
        if (ch->head) ch->nunits += m->mtp.D * mtp_units(m); /* model.mtp: per module */
        for (int l = ch->lo; l < ch->hi; l++) ch->nunits += is_moe(m, l); /* + its experts */
        m->tab.nunits += ch->nunits;
    }
    m->tab.unit_off = calloc(m->tab.nunits, sizeof *m->tab.unit_off);
    m->tab.unit_len = calloc(m->tab.nunits, sizeof *m->tab.unit_len);
    m->tab.unit_expert = calloc(m->tab.nunits, sizeof *m->tab.unit_expert);
    for (int c = 0; c < m->nchunks; c++) {
        model_chunk *ch = &m->chunks[c];
        m->tab.copy_chunk = ch->copy;
        if (ch->embed) add_embed_unit(m);
        for (int l = ch->lo; l < ch->hi; l++) {
            add_layer_params(m, l);
            end_unit(m, 0);
        }
        ch->mtp_u0 = m->tab.cur_unit;
        for (int k = 0; ch->head && k < m->mtp.D; k++) {
            add_mtp_params(m, k);
            end_unit(m, 0);
        }
        if (ch->head) add_head_unit(m);
    }
    m->tab.copy_chunk = 0;
}

/* The whole model's tensors in checkpoint order (every rank lists all of them, whatever it
 * holds): the parameter table of a one-chunk model, of which only the names and shapes count. */
static void list_all_tensors(model *m) {
    model t = *m;
    t.tab.listing = 1;
    t.tab.params = NULL, t.tab.targets = NULL, t.tab.param_unit = NULL;
    t.tab.nparams = t.tab.cap = 0, t.tab.numel = 0, t.tab.cur_unit = 0;
    t.shape.tied_copy = 0;
    t.vc.nvc = 0; /* whole tensors */
    model_chunk whole = {.stage = 0, .lo = 0, .hi = m->shape.L, .embed = 1, .head = 1};
    t.chunks = &whole, t.nchunks = 1;
    t.w.lw = calloc(m->shape.L + m->mtp.D, sizeof *t.w.lw);
    t.w.lg = calloc(m->shape.L + m->mtp.D, sizeof *t.w.lg);
    t.tab.unlisted = 0;
    build_param_table(&t);
    m->tab.nall = t.tab.nparams;
    m->tab.all = calloc(t.tab.nparams, sizeof *m->tab.all);
    m->tab.all_numel = t.tab.unlisted; /* a sizes-only list's unlisted experts */
    for (int i = 0; i < t.tab.nparams; i++) {
        const ckpt_tensor *w = &t.tab.params[i].whole;
        m->tab.all[i] = *w;
        m->tab.all_numel += w->ndim == 2 ? w->shape[0] * w->shape[1] : w->shape[0];
        if (w->ndim == 2 && t.tab.unit_expert[t.tab.param_unit[i]]) /* an expert's matrix */
            m->tab.all_expert_mm += (double)w->shape[0] * (double)w->shape[1];
    }
    free(t.tab.params), free(t.tab.targets), free(t.tab.param_unit), free(t.tab.unit_off),
        free(t.tab.unit_len);
    free(t.tab.unit_expert);
    free(t.w.lw), free(t.w.lg);
}

void params_build(model *m) {
    build_param_table(m);
    list_all_tensors(m);
}

int model_num_params(const model *m) { return m->tab.nparams; }

int model_num_units(const model *m) { return m->tab.nunits; }

int model_param_unit(const model *m, int i) { return m->tab.param_unit[i]; }

void model_unit_range(const model *m, int unit, int64_t *offset, int64_t *len) {
    *offset = m->tab.unit_off[unit];
    *len = m->tab.unit_len[unit];
}

static void set_unit_pointers(model *m, int unit, float *base, int grads) {
    for (int i = 0; i < m->tab.nparams; i++)
        if (m->tab.param_unit[i] == unit) {
            float **dst = grads ? m->tab.targets[i].g : m->tab.targets[i].p;
            *dst = base + (m->tab.params[i].offset - m->tab.unit_off[unit]);
        }
    if (m->shape.tied_local && unit == 0 && !m->vc.nvc) { /* lm_head is the token embedding */
        if (grads)
            m->w.g_lm = m->w.g_wte;
        else
            m->w.lm = m->w.wte;
    }
}

void model_set_unit_params(model *m, int unit, float *base) { set_unit_pointers(m, unit, base, 0); }

void model_set_unit_grads(model *m, int unit, float *base) { set_unit_pointers(m, unit, base, 1); }

model_param *model_param_at(model *m, int i) { return &m->tab.params[i]; }

float *model_params(model *m) { return m->tab.p; }

float *model_grads(model *m) { return m->tab.g; }

int64_t model_numel(const model *m) { return m->tab.numel; }

int model_find_param(const model *m, const char *name) {
    for (int i = 0; i < m->tab.nparams; i++)
        if (strcmp(m->tab.params[i].name, name) == 0) return i;
    return -1;
}

double model_attention_flops(const ust_config *c, int l, int T) {
    int W = l < c->model.n_layer && c->model.sliding_window[0] ? cfg_layer_window(c, l) : 0;
    double keys = W > 0 && W < T ? W : T;
    double qk = cfg_head_dim(c), v = c->model.mla.enabled ? c->model.mla.v_head_dim : qk;
    return 6.0 * c->model.n_head * (qk + v) * keys;
}

double model_flops_per_token(const model *m) {
    const ust_config *c = m->cfg;
    double matmul = 0; /* weights used in a matmul: every 2-D tensor but the lookup tables */
    for (int i = 0; i < m->tab.nall; i++) { /* whole tensors: the model's FLOPs, not this rank's */
        const ckpt_tensor *q = &m->tab.all[i];
        if (q->ndim == 2 && strcmp(q->name, "model.embed_positions.weight") != 0 &&
            (strcmp(q->name, "model.embed_tokens.weight") != 0 || m->shape.tied))
            matmul += (double)q->shape[0] * (double)q->shape[1];
    }
    /* a token runs through top_k of a MoE layer's experts, not all of them */
    double E = c->model.moe.num_experts;
    if (E > 0) matmul -= (1 - c->model.moe.top_k / E) * m->tab.all_expert_mm;
    /* model.mtp's modules each compute logits again with the shared head (listed once) */
    matmul += (double)m->mtp.D * m->shape.Vp * m->shape.C;
    double attn = 0; /* the whole sequence's keys (a window's), the modules' blocks too */
    for (int l = 0; l < m->shape.L + m->mtp.D; l++)
        attn += model_attention_flops(c, l, m->par.cp->T);
    return 6.0 * matmul + attn;
}

const ckpt_tensor *model_all_tensors(const model *m, int *n) {
    *n = m->tab.nall;
    return m->tab.all;
}

int64_t model_all_numel(const model *m) { return m->tab.all_numel; }

int model_tied_local(const model *m) { return m->shape.tied_local; }

int model_unit_is_expert(const model *m, int unit) {
    return m->tab.unit_expert && m->tab.unit_expert[unit];
}

/* ------------------------------------------------------------------ initialization */

/* Global element index of local element i of a slice (row-major over the whole tensor). */
static int64_t global_index(const model_param *q, int64_t i) {
    const ckpt_slice *s = &q->slice;
    int64_t cols = q->whole.ndim == 2 ? q->whole.shape[1] : q->whole.shape[0];
    int64_t box = s->flat0 + i;
    return (s->row0 + box / s->ncols) * cols + s->col0 + box % s->ncols;
}

void model_init_range(const model *m, int i, int64_t flat0, int64_t flat1, uint64_t seed,
                      float *host) {
    const model_param *q = &m->tab.params[i];
    uint64_t stream = rng_hash_str(q->name);
    for (int64_t j = flat0; j < flat1; j++)
        host[j - flat0] = q->init_std > 0
                              ? q->init_std * rng_normal(seed, stream, global_index(q, j))
                              : q->init_value;
}

void model_init_params(model *m, uint64_t seed) {
    UST_ASSERT(m->tab.p, "model_init_params needs the whole parameter buffer");
    float *host = NULL;
    int64_t cap = 0;
    for (int i = 0; i < m->tab.nparams; i++) {
        const model_param *q = &m->tab.params[i];
        if (q->numel > cap) {
            cap = q->numel;
            host = realloc(host, cap * sizeof(float));
            UST_ASSERT(host, "out of host memory (%lld floats)", (long long)cap);
        }
        model_init_range(m, i, 0, q->numel, seed, host);
        m->ops->to_device(m->ops, m->tab.p + q->offset, host, q->numel * sizeof(float));
    }
    free(host);
}

/* ------------------------------------------------------------------ llm.c import */

/* Reads the next `count` floats of f into the parameter `name`. */
typedef struct {
    model_store_fn store;
    void *ctx;
} llmc_sink;

static int read_into(model *m, FILE *f, const char *path, const char *name, int64_t count,
                     float *host, const llmc_sink *sink, ust_err *e) {
    int i = model_find_param(m, name);
    if (i < 0) { /* another pipeline stage's tensor */
        if (fseeko(f, (off_t)count * (off_t)sizeof(float), SEEK_CUR) != 0)
            return ust_errf(e, "%s: truncated llm.c checkpoint while skipping %s", path, name);
        return 0;
    }
    const model_param *q = &m->tab.params[i];
    int64_t whole = q->whole.ndim == 2 ? q->whole.shape[0] * q->whole.shape[1] : q->whole.shape[0];
    UST_ASSERT(whole == count, "%s: %lld vs %lld", name, (long long)whole, (long long)count);
    if ((int64_t)fread(host, sizeof(float), count, f) != count)
        return ust_errf(e, "%s: truncated llm.c checkpoint while reading %s", path, name);
    /* every parameter of that name (vocabulary chunks: several, in row order) keeps its box of
     * the whole tensor, in place: rows only move towards the front, and a box's rows lie past
     * the rows the boxes before it wrote */
    int64_t cols = q->whole.ndim == 2 ? q->whole.shape[1] : q->whole.shape[0];
    for (; i < m->tab.nparams; i++) {
        q = &m->tab.params[i];
        if (strcmp(q->name, name) != 0) continue;
        for (int64_t r = 0; r < q->slice.nrows; r++)
            memmove(host + r * q->slice.ncols, host + (q->slice.row0 + r) * cols + q->slice.col0,
                    q->slice.ncols * sizeof(float));
        if (sink->store)
            sink->store(sink->ctx, i, host);
        else
            m->ops->to_device(m->ops, m->tab.p + q->offset, host, q->numel * sizeof(float));
    }
    return 0;
}

static int check_llmc_header(const model *m, const int32_t *h, const char *path, ust_err *e) {
    if (h[0] != 20240326)
        return ust_errf(e, "%s: not an llm.c GPT-2 checkpoint (magic %d, expected 20240326)", path,
                        h[0]);
    if (h[1] != 3)
        return ust_errf(e, "%s: llm.c checkpoint version %d (only version 3, fp32, is read)", path,
                        h[1]);
    if (m->shape.llama)
        return ust_errf(e, "%s: llm.c checkpoints are GPT-2 models; set model.arch: gpt2", path);
    const char *names[] = {"max_seq_len", "vocab_size", "n_layer", "n_head", "d_model"};
    int want[] = {m->shape.maxT, m->shape.V, m->shape.L, m->shape.Hg, m->shape.C};
    for (int i = 0; i < 5; i++)
        if (h[2 + i] != want[i])
            return ust_errf(e, "%s: checkpoint has model.%s = %d but the config says %d", path,
                            names[i], h[2 + i], want[i]);
    if (h[7] != m->shape.Vp)
        return ust_errf(e,
                        "%s: checkpoint pads the vocabulary to %d, the config to %d (set "
                        "model.vocab_pad so they agree)",
                        path, h[7], m->shape.Vp);
    if (m->shape.Hg != m->shape.Hkvg || m->shape.Fg != 4 * m->shape.C)
        return ust_errf(e, "%s: llm.c GPT-2 needs n_kv_head = n_head and d_ff = 4*d_model", path);
    return 0;
}

int model_load_llmc(model *m, const char *path, model_store_fn store, void *store_ctx, ust_err *e) {
    llmc_sink sink = {store, store_ctx};
    UST_ASSERT(store || m->tab.p, "model_load_llmc without a store needs the parameter buffer");
    ust_err inner;
    FILE *f = fs_fopen_regular(path, "rb", &inner);
    if (!f) return ust_errf(e, "llm.c checkpoint %s", inner.msg);
    int32_t h[256];
    int rc = -1;
    float *host = NULL;
    if (fread(h, sizeof h, 1, f) != 1) {
        ust_errf(e, "%s: truncated llm.c checkpoint header", path);
        goto done;
    }
    if (check_llmc_header(m, h, path, e)) goto done;
    int64_t C = m->shape.C, L = m->shape.L, Vp = m->shape.Vp,
            biggest = Vp * C > 4 * C * C ? Vp * C : 4 * C * C;
    host = malloc((biggest > m->shape.maxT * C ? biggest : m->shape.maxT * C) * sizeof(float));
    if (read_into(m, f, path, "model.embed_tokens.weight", Vp * C, host, &sink, e) ||
        read_into(m, f, path, "model.embed_positions.weight", m->shape.maxT * C, host, &sink, e))
        goto done;
    /* llm.c stacks each kind of tensor over layers: [L, ...]; qkv rows are q, then k, then v */
    static const struct {
        const char *suffix[3];
        int parts;
    } kinds[] = {
        {{"input_layernorm.weight"}, 1},
        {{"input_layernorm.bias"}, 1},
        {{"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}, 3},
        {{"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}, 3},
        {{"self_attn.o_proj.weight"}, 1},
        {{"self_attn.o_proj.bias"}, 1},
        {{"post_attention_layernorm.weight"}, 1},
        {{"post_attention_layernorm.bias"}, 1},
        {{"mlp.up_proj.weight"}, 1},
        {{"mlp.up_proj.bias"}, 1},
        {{"mlp.down_proj.weight"}, 1},
        {{"mlp.down_proj.bias"}, 1},
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int64_t l = 0; l < L; l++)
            for (int p = 0; p < kinds[k].parts; p++) {
                char name[CKPT_NAME_MAX];
                snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)l,
                         kinds[k].suffix[p]);
                const ckpt_tensor *w = NULL;
                for (int k = 0; k < m->tab.nall && !w; k++)
                    if (strcmp(m->tab.all[k].name, name) == 0) w = &m->tab.all[k];
                UST_ASSERT(w, "no parameter %s", name);
                int64_t n = w->ndim == 2 ? w->shape[0] * w->shape[1] : w->shape[0];
                if (read_into(m, f, path, name, n, host, &sink, e)) goto done;
            }
    if (read_into(m, f, path, "model.norm.weight", C, host, &sink, e) ||
        read_into(m, f, path, "model.norm.bias", C, host, &sink, e))
        goto done;
    rc = 0;
done:
    free(host);
    fclose(f);
    return rc;
}

/* ------------------------------------------------------------------ the plan's model */

void params_dims(model *m, const ust_config *cfg) {
    m->shape.llama = cfg->model.arch == ARCH_LLAMA;
    m->shape.L = cfg->model.n_layer, m->shape.C = cfg->model.d_model,
    m->shape.D = cfg_head_dim(cfg);
    m->shape.Hg = cfg->model.n_head, m->shape.Hkvg = cfg->model.n_kv_head,
    m->shape.Fg = cfg->model.d_ff;
    m->shape.V = cfg->model.vocab_size, m->shape.Vp = cfg_vocab_padded(cfg),
    m->shape.maxT = cfg->model.max_seq_len;
    m->shape.B = cfg->train.micro_batch_size, m->shape.T = cfg->train.seq_len,
    m->shape.tied = cfg_tied(cfg);
    m->shape.eps = (float)cfg->model.norm_eps;
    m->shape.rope = ops_rope(cfg);
    m->shape.qkv_bias = !m->shape.llama || cfg->model.qkv_bias;
    m->shape.qk_norm = m->shape.llama && cfg->model.qk_norm;
    m->shape.qk_whole = m->shape.qk_norm && cfg->model.qk_norm_whole;
    m->shape.fam.post_norm = m->shape.llama && cfg->model.post_norm;
    const __typeof__(cfg->model.gemma) *gm = &cfg->model.gemma;
    m->shape.fam.sandwich = m->shape.llama && gm->sandwich_norm;
    m->shape.fam.norm_offset = m->shape.llama && gm->norm_offset;
    m->shape.fam.geglu = m->shape.llama && gm->hidden_act == HACT_GELU_TANH;
    m->shape.fam.embed_scale = gm->embed_scale ? (float)sqrt((double)m->shape.C) : 0;
    m->shape.fam.local_rope = m->shape.llama && gm->rope_local_theta > 0;
    m->shape.fam.attn_softcap = (float)gm->attn_softcap;
    m->shape.fam.final_softcap = (float)gm->final_softcap;
    m->shape.fam.rope_local = ops_rope_local(cfg);
    /* packed examples (data.packing: first_fit) are documents masked apart, positions reset;
     * train.seq_len_warmup's short sequences are pieces of each window masked apart */
    m->shape.doc_mask =
        cfg->data.doc_mask || cfg->data.packing || cfg->train.seq_len_warmup.start > 0;
    m->shape.reset_pos = cfg->data.reset_positions || cfg->data.packing;
    m->shape.recompute = cfg->train.recompute;
    int start;
    m->shape.H = tp_part(m->par.tp, m->shape.Hg, &start); /* this rank's heads and hidden units */
    m->shape.Hkv = tp_part(m->par.tp, m->shape.Hkvg, &start);
    m->shape.F = tp_part(m->par.tp, m->shape.Fg, &start);
    m->shape.Vl = tp_part(m->par.tp, m->shape.Vp, &start);
    m->mtp.D = cfg->model.mtp.depth; /* its modules' weights: mtp_w[D] then their gradients */
    if (m->mtp.D && !m->mtp.w) {
        m->mtp.w = calloc(2 * (size_t)m->mtp.D, sizeof *m->mtp.w);
        UST_ASSERT(m->mtp.w, "out of host memory");
        m->mtp.g = m->mtp.w + m->mtp.D;
    }
}

void params_vocab_chunks(model *m, int rows) {
    m->vc.wte_u0 = m->vc.lm_u0 = -1;
    m->vc.vc_rows = rows > 0 ? (rows < m->shape.Vl ? rows : m->shape.Vl) : 0;
    m->vc.nvc = m->vc.vc_rows ? (m->shape.Vl + m->vc.vc_rows - 1) / m->vc.vc_rows : 0;
    if (!m->vc.nvc) return;
    m->vc.wte_c = calloc(2 * (size_t)m->vc.nvc, sizeof *m->vc.wte_c);
    m->vc.lm_c =
        m->shape.tied_local ? m->vc.wte_c : calloc(2 * (size_t)m->vc.nvc, sizeof *m->vc.lm_c);
    UST_ASSERT(m->vc.wte_c && m->vc.lm_c, "out of host memory");
    m->vc.g_wte_c = m->vc.wte_c + m->vc.nvc;
    m->vc.g_lm_c = m->vc.lm_c + m->vc.nvc;
}

void params_vocab_chunks_free(model *m) {
    if (m->vc.lm_c != m->vc.wte_c) free(m->vc.lm_c);
    free(m->vc.wte_c);
    m->vc.wte_c = m->vc.g_wte_c = m->vc.lm_c = m->vc.g_lm_c = NULL;
}

void params_local_rows(model *m) {
    m->shape.T = cp_local_len(m->par.cp);
    m->shape.Nl = tp_rows(m->par.tp, m->shape.B * m->shape.T);
}

void params_chunks(model *m, const model_stage *stages, int n) {
    static const model_stage whole = {.stage = 0, .lo = 0, .hi = -1, .embed = 1, .head = 1};
    int v = n > 0 ? n : 1, embed = 0, head = 0;
    m->nchunks = v;
    m->chunks = calloc(v, sizeof *m->chunks);
    UST_ASSERT(m->chunks, "out of host memory for %d chunks", v);
    for (int c = 0; c < v; c++) {
        const model_stage *st = n > 0 ? &stages[c] : &whole;
        model_chunk *ch = &m->chunks[c];
        ch->stage = st->stage;
        ch->lo = st->lo, ch->hi = st->hi < 0 ? m->shape.L : st->hi;
        ch->embed = st->embed;
        ch->head = st->head;
        ch->copy = st->copy;
        ch->nslots = st->slots > 0 ? st->slots : 1;
        embed |= ch->embed, head |= ch->head;
    }
    m->shape.tied_local = m->shape.tied && embed && head;
    m->shape.tied_copy = m->shape.tied && head && !embed;
}

model *params_shape(const ust_config *cfg, const ust_ops *sizes, const model_storage *st, int whole,
                    ust_arena *count) {
    model *m = calloc(1, sizeof *m);
    UST_ASSERT(m, "out of host memory");
    m->cfg = cfg, m->ops = sizes, m->tab.sizing = 1;
    /* model_create_with's steps, on the shape-only contexts of rank 0 of each group */
    m->shape.zb = st->zb;
    m->par.tp = st->tp;
    params_dims(m, cfg);
    m->par.cp = st->cp;
    params_local_rows(m);
    m->tab.unit_pad = st->unit_pad;
    params_chunks(m, st->chunks, st->nchunks);
    params_vocab_chunks(m, st->vocab_chunk_rows);
    if (cfg->model.moe.num_experts > 0) { /* rank 0 of an expert group of parallel.ep */
        m->moe.has_moe = 1, m->moe.ep_size = cfg->parallel.ep, m->moe.ep_rank = 0;
        mem_alloc(count, MEM_ACTS, moe_ctx_bytes(cfg, m->shape.B * m->shape.T, m->moe.ep_size));
    }
    m->w.lw = calloc(m->shape.L + m->mtp.D, sizeof *m->w.lw);
    m->w.lg = calloc(m->shape.L + m->mtp.D, sizeof *m->w.lg);
    if (whole)
        params_build(m);
    else
        build_param_table(m);
    if (st->alloc_params) mem_alloc(count, MEM_PARAMS, m->tab.numel * sizeof(float));
    if (st->alloc_grads) mem_alloc(count, MEM_GRADS, m->tab.numel * sizeof(float));
    acts_alloc(m, count);
    return m;
}

void params_shape_free(model *m) {
    if (!m) return;
    if (m->chunks[0].slots)
        acts_free(m);
    else
        free(m->chunks);
    free(m->tab.params), free(m->tab.targets), free(m->tab.param_unit);
    free(m->tab.unit_off), free(m->tab.unit_len), free(m->tab.unit_expert), free(m->tab.all);
    free(m->w.lw), free(m->w.lg), free(m->mtp.w);
    params_vocab_chunks_free(m);
    free(m);
}
