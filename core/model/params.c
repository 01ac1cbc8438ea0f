/* params.c: the model's parameter table, units, initialization and the llm.c importer (the
 * parameter half of model.h; params.h). Shapes as in model.c. */
#include "params.h"
#include "acts.h"
#include "model_internal.h"

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
    if (m->nparams == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 64;
        m->params = realloc(m->params, m->cap * sizeof *m->params);
        m->targets = realloc(m->targets, m->cap * sizeof *m->targets);
        m->param_unit = realloc(m->param_unit, m->cap * sizeof *m->param_unit);
        UST_ASSERT(m->params && m->targets && m->param_unit, "out of host memory for %d params",
                   m->cap);
    }
    model_param *q = &m->params[m->nparams];
    memset(q, 0, sizeof *q);
    if (!m->sizing) { /* the plan's thousands of layouts need the shapes only */
        snprintf(q->name, sizeof q->name, "%s", name);
        snprintf(q->whole.name, sizeof q->whole.name, "%s", name);
    }
    q->whole.ndim = rows > 1 || decay ? 2 : 1;
    q->whole.shape[0] = q->whole.ndim == 2 ? rows : rows * cols;
    q->whole.shape[1] = q->whole.ndim == 2 ? cols : 0;
    q->slice = ckpt_whole(&q->whole);
    int start;
    if (split == SPLIT_ROWS) {
        q->slice.nrows = tp_part(m->tp, (int)rows, &start);
        q->slice.row0 = start;
    } else if (split == SPLIT_COLS) {
        q->slice.ncols = tp_part(m->tp, (int)cols, &start);
        q->slice.col0 = start;
    }
    if (m->sub_nrows > 0) { /* a vocabulary chunk: rows of this rank's slice */
        q->slice.row0 += m->sub_row0;
        q->slice.nrows = m->sub_nrows;
    }
    q->tp_split = split != SPLIT_NONE;
    q->numel = q->slice.nrows * q->slice.ncols;
    q->slice.flat0 = 0;
    q->slice.flat1 = q->numel;
    q->offset = m->numel;
    q->decay = decay;
    q->replica = m->copy_chunk;
    q->init_std = std;
    q->init_value = value;
    m->targets[m->nparams] = (param_target){p, g};
    m->param_unit[m->nparams] = m->cur_unit;
    m->numel += (q->numel + 15) & ~(int64_t)15; /* 64-byte aligned tensors */
    m->nparams++;
}

static void end_unit(model *m, int64_t min_len);


/* MoE tensors stay whole (never tensor-split); the experts open a unit of their own, which is
 * reduced over expert-dp x cp instead of dp x cp. */
static void add_moe_param(void *ctx, const moe_param *q) {
    model *m = ctx;
    if (q->expert >= 0 && !m->in_experts) {
        end_unit(m, 0);
        m->unit_expert[m->cur_unit] = 1;
        m->in_experts = 1;
    }
    add_param(m, q->name, q->rows, q->cols, SPLIT_NONE, q->decay, q->init_std, q->init_value, q->p,
              q->g);
}

static void add_moe_params(model *m, int l) {
    m->in_experts = 0;
    if (m->listing) /* the whole model's list: every expert */
        moe_enum_params(m->cfg, l, 1, 0, NULL, NULL, add_moe_param, m);
    else
        moe_enum_params(m->cfg, l, m->ep_size, m->ep_rank, m->mw ? &m->mw[l] : NULL,
                        m->mg ? &m->mg[l] : NULL, add_moe_param, m);
    m->in_experts = 0;
}

static void add_layer_params(model *m, int l) {
    char n[CKPT_NAME_MAX] = "";
    layer_w *w = &m->lw[l], *g = &m->lg[l];
    int C = m->C, HD = m->Hg * m->D, KV = m->Hkvg * m->D, F = m->Fg, gpt2 = !m->llama;
    float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * m->L); /* GPT-2's scaled residual init */
    const int N0 = SPLIT_NONE, R = SPLIT_ROWS, CO = SPLIT_COLS;
    /* one line per tensor: the layer's parameter table */
    // clang-format off
#define P(suffix, rows, cols, split, decay, sd, val, field)                                       \
    if (!m->sizing) snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                      \
    add_param(m, n, rows, cols, split, decay, sd, val, &w->field, &g->field)
    P("input_layernorm.weight", 1, C, N0, 0, 0, 1, ln1_w);
    if (gpt2) { P("input_layernorm.bias", 1, C, N0, 0, 0, 0, ln1_b); }
    P("self_attn.q_proj.weight", HD, C, R, 1, std, 0, wq);
    if (m->qkv_bias) { P("self_attn.q_proj.bias", 1, HD, CO, 0, 0, 0, bq); }
    P("self_attn.k_proj.weight", KV, C, R, 1, std, 0, wk);
    if (m->qkv_bias) { P("self_attn.k_proj.bias", 1, KV, CO, 0, 0, 0, bk); }
    P("self_attn.v_proj.weight", KV, C, R, 1, std, 0, wv);
    if (m->qkv_bias) { P("self_attn.v_proj.bias", 1, KV, CO, 0, 0, 0, bv); }
    P("self_attn.o_proj.weight", C, HD, CO, 1, proj_std, 0, wo);
    if (gpt2) { P("self_attn.o_proj.bias", 1, C, N0, 0, 0, 0, bo); }
    P("post_attention_layernorm.weight", 1, C, N0, 0, 0, 1, ln2_w);
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

/* Closes the current unit: pads the flat buffer to a multiple of unit_pad, and to at least
 * min_len floats. */
static void end_unit(model *m, int64_t min_len) {
    int u = m->cur_unit++;
    m->numel = (m->numel + m->unit_pad - 1) / m->unit_pad * m->unit_pad;
    if (m->numel - m->unit_off[u] < min_len) m->numel = m->unit_off[u] + min_len;
    m->unit_len[u] = m->numel - m->unit_off[u];
    if (m->cur_unit < m->nunits) m->unit_off[m->cur_unit] = m->numel;
}

static int64_t align16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* Tied embeddings over a pipeline: the first stage's embedding unit and the last stage's head
 * unit (which starts with the copy) get one common length, so a ZeRO partition of the table
 * covers the same elements on both ends and the copy's gradient syncs shard by shard. */
static int64_t tied_unit_len(const model *m) {
    int64_t table = align16((int64_t)m->Vl * m->C);
    int64_t embed = table + (m->llama ? 0 : align16((int64_t)m->maxT * m->C));
    int64_t head = table + align16(m->C) * (m->llama ? 1 : 2);
    int64_t len = embed > head ? embed : head;
    return (len + m->unit_pad - 1) / m->unit_pad * m->unit_pad;
}

/* The vocabulary chunks of a table (params[..].name `name`): one parameter and one unit each,
 * rows [k * vc_rows, ...) of this rank's slice; w[k], g[k] get their pointers. */
static void add_vocab_chunks(model *m, const char *name, float **w, float **g, int replica) {
    for (int k = 0; k < m->nvc; k++) {
        int r0 = k * m->vc_rows;
        m->sub_row0 = r0;
        m->sub_nrows = m->Vl - r0 < m->vc_rows ? m->Vl - r0 : m->vc_rows;
        add_param(m, name, m->Vp, m->C, SPLIT_ROWS, 1, 0.02f, 0, &w[k], &g[k]);
        m->params[m->nparams - 1].replica |= replica;
        m->sub_row0 = m->sub_nrows = 0;
        end_unit(m, 0);
    }
}

static void add_embed_unit(model *m) {
    int C = m->C;
    if (m->nvc) { /* positions (gpt2), then the table's chunks */
        if (!m->llama) {
            add_param(m, "model.embed_positions.weight", m->maxT, C, SPLIT_NONE, 1, 0.02f, 0,
                      &m->wpe, &m->g_wpe);
            end_unit(m, 0);
        }
        m->wte_u0 = m->cur_unit;
        add_vocab_chunks(m, "model.embed_tokens.weight", m->wte_c, m->g_wte_c, 0);
        return;
    }
    add_param(m, "model.embed_tokens.weight", m->Vp, C, SPLIT_ROWS, 1, 0.02f, 0, &m->wte,
              &m->g_wte);
    if (!m->llama)
        add_param(m, "model.embed_positions.weight", m->maxT, C, SPLIT_NONE, 1, 0.02f, 0, &m->wpe,
                  &m->g_wpe);
    end_unit(m, m->tied && m->cfg->parallel.pp > 1 ? tied_unit_len(m) : 0);
}

static void add_head_unit(model *m) {
    int C = m->C;
    if (m->nvc) { /* the final norm, then the head's chunks (tied here: the table's) */
        add_param(m, "model.norm.weight", 1, C, SPLIT_NONE, 0, 0, 1, &m->lnf_w, &m->g_lnf_w);
        if (!m->llama)
            add_param(m, "model.norm.bias", 1, C, SPLIT_NONE, 0, 0, 0, &m->lnf_b, &m->g_lnf_b);
        end_unit(m, 0);
        if (m->tied_local) {
            m->lm_u0 = m->wte_u0;
            return;
        }
        m->lm_u0 = m->cur_unit;
        add_vocab_chunks(m, m->tied_copy ? "model.embed_tokens.weight" : "lm_head.weight",
                         m->lm_c, m->g_lm_c, m->tied_copy);
        return;
    }
    if (m->tied_copy) { /* the copy, under the embedding's own name: initialized, saved and
                           loaded as that tensor (only the first stage writes it) */
        add_param(m, "model.embed_tokens.weight", m->Vp, C, SPLIT_ROWS, 1, 0.02f, 0, &m->lm,
                  &m->g_lm);
        m->params[m->nparams - 1].replica = 1;
    }
    add_param(m, "model.norm.weight", 1, C, SPLIT_NONE, 0, 0, 1, &m->lnf_w, &m->g_lnf_w);
    if (!m->llama)
        add_param(m, "model.norm.bias", 1, C, SPLIT_NONE, 0, 0, 0, &m->lnf_b, &m->g_lnf_b);
    if (!m->tied)
        add_param(m, "lm_head.weight", m->Vp, C, SPLIT_ROWS, 1, 0.02f, 0, &m->lm, &m->g_lm);
    end_unit(m, m->tied_copy ? tied_unit_len(m) : 0);
}

static void build_param_table(model *m) {
    m->nunits = 0;
    for (int c = 0; c < m->nchunks; c++) {
        model_chunk *ch = &m->chunks[c];
        ch->unit0 = m->nunits;
        ch->nunits = (ch->hi - ch->lo) + (m->nvc ? 0 : ch->embed + ch->head);
        if (m->nvc && ch->embed) ch->nunits += m->nvc + !m->llama; /* positions, chunks */
        if (m->nvc && ch->head) ch->nunits += 1 + (m->tied_local ? 0 : m->nvc);
        for (int l = ch->lo; l < ch->hi; l++) ch->nunits += is_moe(m, l); /* + its experts */
        m->nunits += ch->nunits;
    }
    m->unit_off = calloc(m->nunits, sizeof *m->unit_off);
    m->unit_len = calloc(m->nunits, sizeof *m->unit_len);
    m->unit_expert = calloc(m->nunits, sizeof *m->unit_expert);
    for (int c = 0; c < m->nchunks; c++) {
        const model_chunk *ch = &m->chunks[c];
        m->copy_chunk = ch->copy;
        if (ch->embed) add_embed_unit(m);
        for (int l = ch->lo; l < ch->hi; l++) {
            add_layer_params(m, l);
            end_unit(m, 0);
        }
        if (ch->head) add_head_unit(m);
    }
    m->copy_chunk = 0;
}

/* The whole model's tensors in checkpoint order (every rank lists all of them, whatever it
 * holds): the parameter table of a one-chunk model, of which only the names and shapes count. */
static void list_all_tensors(model *m) {
    model t = *m;
    t.listing = 1;
    t.params = NULL, t.targets = NULL, t.param_unit = NULL;
    t.nparams = t.cap = 0, t.numel = 0, t.cur_unit = 0;
    t.tied_copy = 0;
    t.nvc = 0; /* whole tensors */
    model_chunk whole = {.stage = 0, .lo = 0, .hi = m->L, .embed = 1, .head = 1};
    t.chunks = &whole, t.nchunks = 1;
    t.lw = calloc(m->L, sizeof *t.lw);
    t.lg = calloc(m->L, sizeof *t.lg);
    build_param_table(&t);
    m->nall = t.nparams;
    m->all = calloc(t.nparams, sizeof *m->all);
    for (int i = 0; i < t.nparams; i++) m->all[i] = t.params[i].whole;
    free(t.params), free(t.targets), free(t.param_unit), free(t.unit_off), free(t.unit_len);
    free(t.unit_expert);
    free(t.lw), free(t.lg);
}

void params_build(model *m) {
    build_param_table(m);
    list_all_tensors(m);
}

int model_num_params(const model *m) { return m->nparams; }

int model_num_units(const model *m) { return m->nunits; }

int model_param_unit(const model *m, int i) { return m->param_unit[i]; }

void model_unit_range(const model *m, int unit, int64_t *offset, int64_t *len) {
    *offset = m->unit_off[unit];
    *len = m->unit_len[unit];
}

static void set_unit_pointers(model *m, int unit, float *base, int grads) {
    for (int i = 0; i < m->nparams; i++)
        if (m->param_unit[i] == unit) {
            float **dst = grads ? m->targets[i].g : m->targets[i].p;
            *dst = base + (m->params[i].offset - m->unit_off[unit]);
        }
    if (m->tied_local && unit == 0 && !m->nvc) { /* lm_head is the token embedding */
        if (grads)
            m->g_lm = m->g_wte;
        else
            m->lm = m->wte;
    }
}

void model_set_unit_params(model *m, int unit, float *base) { set_unit_pointers(m, unit, base, 0); }

void model_set_unit_grads(model *m, int unit, float *base) { set_unit_pointers(m, unit, base, 1); }

model_param *model_param_at(model *m, int i) { return &m->params[i]; }

float *model_params(model *m) { return m->p; }

float *model_grads(model *m) { return m->g; }

int64_t model_numel(const model *m) { return m->numel; }

int model_find_param(const model *m, const char *name) {
    for (int i = 0; i < m->nparams; i++)
        if (strcmp(m->params[i].name, name) == 0) return i;
    return -1;
}

double model_flops_per_token(const model *m) {
    double matmul = 0; /* weights used in a matmul: every 2-D tensor but the lookup tables */
    for (int i = 0; i < m->nall; i++) { /* whole tensors: the model's FLOPs, not this rank's */
        const ckpt_tensor *q = &m->all[i];
        if (q->ndim == 2 && strcmp(q->name, "model.embed_positions.weight") != 0 &&
            (strcmp(q->name, "model.embed_tokens.weight") != 0 || m->tied))
            matmul += (double)q->shape[0] * (double)q->shape[1];
    }
    return 6.0 * matmul + 12.0 * m->L * (double)(m->Hg * m->D) * m->cp->T; /* whole sequence */
}

const ckpt_tensor *model_all_tensors(const model *m, int *n) {
    *n = m->nall;
    return m->all;
}

int model_tied_local(const model *m) { return m->tied_local; }

int model_unit_is_expert(const model *m, int unit) {
    return m->unit_expert && m->unit_expert[unit];
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
    const model_param *q = &m->params[i];
    uint64_t stream = rng_hash_str(q->name);
    for (int64_t j = flat0; j < flat1; j++)
        host[j - flat0] = q->init_std > 0
                              ? q->init_std * rng_normal(seed, stream, global_index(q, j))
                              : q->init_value;
}

void model_init_params(model *m, uint64_t seed) {
    UST_ASSERT(m->p, "model_init_params needs the whole parameter buffer");
    float *host = NULL;
    int64_t cap = 0;
    for (int i = 0; i < m->nparams; i++) {
        const model_param *q = &m->params[i];
        if (q->numel > cap) {
            cap = q->numel;
            host = realloc(host, cap * sizeof(float));
            UST_ASSERT(host, "out of host memory (%lld floats)", (long long)cap);
        }
        model_init_range(m, i, 0, q->numel, seed, host);
        m->ops->to_device(m->ops, m->p + q->offset, host, q->numel * sizeof(float));
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
    const model_param *q = &m->params[i];
    int64_t whole = q->whole.ndim == 2 ? q->whole.shape[0] * q->whole.shape[1] : q->whole.shape[0];
    UST_ASSERT(whole == count, "%s: %lld vs %lld", name, (long long)whole, (long long)count);
    if ((int64_t)fread(host, sizeof(float), count, f) != count)
        return ust_errf(e, "%s: truncated llm.c checkpoint while reading %s", path, name);
    /* every parameter of that name (vocabulary chunks: several, in row order) keeps its box of
     * the whole tensor, in place: rows only move towards the front, and a box's rows lie past
     * the rows the boxes before it wrote */
    int64_t cols = q->whole.ndim == 2 ? q->whole.shape[1] : q->whole.shape[0];
    for (; i < m->nparams; i++) {
        q = &m->params[i];
        if (strcmp(q->name, name) != 0) continue;
        for (int64_t r = 0; r < q->slice.nrows; r++)
            memmove(host + r * q->slice.ncols, host + (q->slice.row0 + r) * cols + q->slice.col0,
                    q->slice.ncols * sizeof(float));
        if (sink->store)
            sink->store(sink->ctx, i, host);
        else
            m->ops->to_device(m->ops, m->p + q->offset, host, q->numel * sizeof(float));
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
    if (m->llama)
        return ust_errf(e, "%s: llm.c checkpoints are GPT-2 models; set model.arch: gpt2", path);
    const char *names[] = {"max_seq_len", "vocab_size", "n_layer", "n_head", "d_model"};
    int want[] = {m->maxT, m->V, m->L, m->Hg, m->C};
    for (int i = 0; i < 5; i++)
        if (h[2 + i] != want[i])
            return ust_errf(e, "%s: checkpoint has model.%s = %d but the config says %d", path,
                            names[i], h[2 + i], want[i]);
    if (h[7] != m->Vp)
        return ust_errf(e,
                        "%s: checkpoint pads the vocabulary to %d, the config to %d (set "
                        "model.vocab_pad so they agree)",
                        path, h[7], m->Vp);
    if (m->Hg != m->Hkvg || m->Fg != 4 * m->C)
        return ust_errf(e, "%s: llm.c GPT-2 needs n_kv_head = n_head and d_ff = 4*d_model", path);
    return 0;
}

int model_load_llmc(model *m, const char *path, model_store_fn store, void *store_ctx, ust_err *e) {
    llmc_sink sink = {store, store_ctx};
    UST_ASSERT(store || m->p, "model_load_llmc without a store needs the parameter buffer");
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
    int64_t C = m->C, L = m->L, Vp = m->Vp, biggest = Vp * C > 4 * C * C ? Vp * C : 4 * C * C;
    host = malloc((biggest > m->maxT * C ? biggest : m->maxT * C) * sizeof(float));
    if (read_into(m, f, path, "model.embed_tokens.weight", Vp * C, host, &sink, e) ||
        read_into(m, f, path, "model.embed_positions.weight", m->maxT * C, host, &sink, e))
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
                for (int k = 0; k < m->nall && !w; k++)
                    if (strcmp(m->all[k].name, name) == 0) w = &m->all[k];
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
    m->llama = cfg->model.arch == ARCH_LLAMA;
    m->L = cfg->model.n_layer, m->C = cfg->model.d_model, m->D = cfg_head_dim(cfg);
    m->Hg = cfg->model.n_head, m->Hkvg = cfg->model.n_kv_head, m->Fg = cfg->model.d_ff;
    m->V = cfg->model.vocab_size, m->Vp = cfg_vocab_padded(cfg), m->maxT = cfg->model.max_seq_len;
    m->B = cfg->train.micro_batch_size, m->T = cfg->train.seq_len, m->tied = cfg_tied(cfg);
    m->eps = (float)cfg->model.norm_eps;
    m->rope = (ust_rope){.theta = cfg->model.rope_theta};
    if (cfg->model.rope_scaling.type == ROPE_LLAMA3) {
        const __typeof__(cfg->model.rope_scaling) *rs = &cfg->model.rope_scaling;
        m->rope.factor = rs->factor;
        m->rope.low_freq_factor = rs->low_freq_factor;
        m->rope.high_freq_factor = rs->high_freq_factor;
        m->rope.original_max_pos = rs->original_max_position_embeddings;
    }
    m->qkv_bias = !m->llama || cfg->model.qkv_bias;
    m->doc_mask = cfg->data.doc_mask;
    m->reset_pos = cfg->data.reset_positions;
    m->recompute = cfg->train.recompute;
    int start;
    m->H = tp_part(m->tp, m->Hg, &start); /* this rank's heads and hidden units */
    m->Hkv = tp_part(m->tp, m->Hkvg, &start);
    m->F = tp_part(m->tp, m->Fg, &start);
    m->Vl = tp_part(m->tp, m->Vp, &start);
}

void params_vocab_chunks(model *m, int rows) {
    m->wte_u0 = m->lm_u0 = -1;
    m->vc_rows = rows > 0 ? (rows < m->Vl ? rows : m->Vl) : 0;
    m->nvc = m->vc_rows ? (m->Vl + m->vc_rows - 1) / m->vc_rows : 0;
    if (!m->nvc) return;
    m->wte_c = calloc(2 * (size_t)m->nvc, sizeof *m->wte_c);
    m->lm_c = m->tied_local ? m->wte_c : calloc(2 * (size_t)m->nvc, sizeof *m->lm_c);
    UST_ASSERT(m->wte_c && m->lm_c, "out of host memory");
    m->g_wte_c = m->wte_c + m->nvc;
    m->g_lm_c = m->lm_c + m->nvc;
}

void params_vocab_chunks_free(model *m) {
    if (m->lm_c != m->wte_c) free(m->lm_c);
    free(m->wte_c);
    m->wte_c = m->g_wte_c = m->lm_c = m->g_lm_c = NULL;
}

void params_local_rows(model *m) {
    m->T = cp_local_len(m->cp);
    m->Nl = tp_rows(m->tp, m->B * m->T);
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
        ch->lo = st->lo, ch->hi = st->hi < 0 ? m->L : st->hi;
        ch->embed = st->embed;
        ch->head = st->head;
        ch->copy = st->copy;
        ch->nslots = st->slots > 0 ? st->slots : 1;
        embed |= ch->embed, head |= ch->head;
    }
    m->tied_local = m->tied && embed && head;
    m->tied_copy = m->tied && head && !embed;
}

model *params_shape(const ust_config *cfg, const ust_ops *sizes, const params_layout *ly) {
    model *m = calloc(1, sizeof *m);
    UST_ASSERT(m, "out of host memory");
    m->cfg = cfg, m->ops = sizes, m->sizing = 1;
    /* the shapes model_create_with gives rank 0 of the tensor- and context-parallel groups */
    m->zb = ly->zb;
    int T = cfg->train.seq_len, B = cfg->train.micro_batch_size;
    m->own_tp = tp_shape(sizes, ly->tp, B * (T / ly->cp), cfg->model.d_model, ly->sp);
    m->tp = &m->own_tp;
    params_dims(m, cfg);
    m->own_cp = cp_shape(sizes, ly->cp, ly->cp > 1 ? cfg_cp_a2a(cfg) : 1, T, m->B, m->Hkv, m->D,
                         cfg->parallel.cp_comm);
    m->cp = &m->own_cp;
    params_local_rows(m);
    m->unit_pad = ly->unit_pad;
    params_chunks(m, ly->chunks, ly->nchunks);
    params_vocab_chunks(m, ly->vocab_chunk_rows);
    if (cfg->model.moe.num_experts > 0) m->has_moe = 1, m->ep_size = ly->ep, m->ep_rank = 0;
    m->lw = calloc(m->L, sizeof *m->lw);
    m->lg = calloc(m->L, sizeof *m->lg);
    if (ly->whole)
        params_build(m);
    else
        build_param_table(m);
    return m;
}

void params_shape_free(model *m) {
    if (!m) return;
    if (m->chunks[0].slots)
        acts_free(m);
    else
        free(m->chunks);
    free(m->params), free(m->targets), free(m->param_unit);
    free(m->unit_off), free(m->unit_len), free(m->unit_expert), free(m->all);
    free(m->lw), free(m->lg);
    params_vocab_chunks_free(m);
    free(m);
}

void params_count_buffers(model *m, const model_storage *st, ust_arena *count) {
    if (st->alloc_params) mem_alloc(count, MEM_PARAMS, m->numel * sizeof(float));
    if (st->alloc_grads) mem_alloc(count, MEM_GRADS, m->numel * sizeof(float));
    cp_alloc_buffers(m->cp, count, m->H);
    if (m->has_moe) mem_alloc(count, MEM_ACTS, moe_ctx_bytes(m->cfg, m->B * m->T, m->ep_size));
    tp_alloc_scratch(m->tp, count);
}
