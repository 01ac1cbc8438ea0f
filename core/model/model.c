/* model.c: the model's construction and its chunks' forward and backward over the blocks
 * (model_block.c) and the vocabulary ends (model_vocab.c); the parameter table is params.c's, the
 * activations acts.c's, the MoE state model_moe.c's.
 * Shapes: B = micro-batch, T = sequence, N = B*T tokens, C = d_model, H/Hkv = query/key-value
 * heads of size D, F = d_ff, Vp = padded vocabulary (V real). */
#include "model.h"
#include "model_state.h"
#include "acts.h"
#include "model_block.h"
#include "model_mla.h"
#include "model_moe.h"
#include "model_mtp.h"
#include "model_vocab.h"
#include "params.h"
#include "proj_norm.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "cp.h"
#include "moe.h"
#include "tp.h"

int model_create(model **out, const ust_config *cfg, const ust_ops *ops, ust_arena *arena,
                 ust_err *e) {
    model_storage st = {.unit_pad = 16, .alloc_params = 1, .alloc_grads = 1};
    return model_create_with(out, cfg, ops, arena, &st, e);
}

int model_create_with(model **out, const ust_config *cfg, const ust_ops *ops, ust_arena *arena,
                      const model_storage *st, ust_err *e) {
    UST_ASSERT(st->unit_pad >= 16 && st->unit_pad % 16 == 0, "unit_pad %lld",
               (long long)st->unit_pad);
    model *m = calloc(1, sizeof *m);
    if (!m) return ust_errf(e, "out of memory creating the model");
    m->cfg = cfg;
    m->ops = ops;
    m->par.tp = st->tp;
    if (!m->par.tp) {
        tp_init(&m->par.own_tp, ops, NULL, arena, 0, 0, 0);
        m->par.tp = &m->par.own_tp;
    }
    m->shape.zb = st->zb;
    params_dims(m, cfg);
    m->par.cp = st->cp;
    if (!m->par.cp) {
        cp_init(&m->par.own_cp, ops, NULL, NULL, NULL, arena, m->shape.T, m->shape.B, m->shape.H,
                m->shape.Hkv, m->shape.D, 0, cfg->parallel.cp_layout, cfg->parallel.cp_comm, 1);
        m->par.cp = &m->par.own_cp;
    }
    params_local_rows(m);
    m->tab.unit_pad = st->unit_pad;
    params_chunks(m, st->chunks, st->nchunks);
    params_vocab_chunks(m, st->vocab_chunk_rows);
    if (cfg->model.moe.num_experts > 0) model_moe_init(m, arena, st);
    m->w.lw = calloc(m->shape.L + m->mtp.D, sizeof *m->w.lw); /* + model.mtp's blocks */
    m->w.lg = calloc(m->shape.L + m->mtp.D, sizeof *m->w.lg);
    params_build(m);
    if (st->alloc_params) m->tab.p = mem_alloc(arena, MEM_PARAMS, m->tab.numel * sizeof(float));
    if (st->alloc_grads) m->tab.g = mem_alloc(arena, MEM_GRADS, m->tab.numel * sizeof(float));
    for (int u = 0; u < m->tab.nunits; u++) {
        if (m->tab.p) model_set_unit_params(m, u, m->tab.p + m->tab.unit_off[u]);
        if (m->tab.g) model_set_unit_grads(m, u, m->tab.g + m->tab.unit_off[u]);
    }
    acts_alloc(m, arena);
    *out = m;
    return 0;
}

void model_destroy(model *m) {
    if (!m) return;
    free(m->tab.params);
    free(m->tab.targets);
    free(m->tab.param_unit);
    free(m->tab.unit_off);
    free(m->tab.unit_len);
    free(m->w.lw);
    free(m->w.lg);
    free(m->mtp.w);
    free(m->tab.all);
    model_moe_free(m);
    free(m->batch.whost);
    free(m->tab.unit_expert);
    free(m->tracing.names);
    free(m->act_host);
    params_vocab_chunks_free(m);
    if (m->par.cp == &m->par.own_cp) cp_free(&m->par.own_cp);
    free(m);
}

void model_set_hooks(model *m, const model_hooks *h) {
    if (h)
        m->hooks = *h;
    else
        memset(&m->hooks, 0, sizeof m->hooks);
}

/* The micro-batch of slot s is the one computed now. */
static void use_batch(model *m, const act_slot *s) {
    m->batch.docs = s->udoc ? (cp_docs){s->udoc, s->udoc_min, 0} : (cp_docs){s->doc, s->doc_min, 0};
    int W[CFG_MAX_WINDOWS], nw = cfg_windows(m->cfg, W);
    for (int k = 0; k < nw; k++) /* the window rides along: the cp ring routes blocks by it */
        m->batch.wdocs[k] = s->uwdoc[k] ? (cp_docs){s->uwdoc[k], s->uwdoc_min[k], W[k]}
                                        : (cp_docs){s->wdoc[k], s->wdoc_min[k], W[k]};
    m->batch.rows = s->pos;
}

/* model.sliding_window: key j is visible to query i when j > i - W, so each query's first visible
 * key is the later of its document's start and its own position - W + 1, positions being the
 * token's index in the whole sequence (the context-parallel layout's, as attention masks by). */
static void take_windows(model *m, act_slot *s, const ust_batch *b, int k, int W) {
    int B = m->shape.B, Tl = m->shape.T;
    if (!m->batch.whost) m->batch.whost = malloc((size_t)B * Tl * sizeof(int32_t));
    UST_ASSERT(m->batch.whost, "out of host memory");
    const int32_t *P = cp_positions_of(m->par.cp, cp_rank(m->par.cp));
    int32_t *w = m->batch.whost;
    for (int r = 0; r < B; r++)
        for (int i = 0; i < Tl; i++) {
            int32_t doc = b->doc_starts && m->shape.doc_mask ? b->doc_starts[r * Tl + i] : 0;
            int32_t win = P[i] - W + 1;
            w[r * Tl + i] = win > doc ? win : doc;
        }
    s->wdoc_min[k] = w[0];
    for (int i = 1; i < B * Tl; i++) s->wdoc_min[k] = w[i] < s->wdoc_min[k] ? w[i] : s->wdoc_min[k];
    m->ops->to_device(m->ops, s->wdoc[k], w, (size_t)B * Tl * sizeof(int32_t));
    if (s->uwdoc[k]) s->uwdoc_min[k] = cp_gather_docs(m->par.cp, s->uwdoc[k], s->wdoc[k]);
}

/* The slot keeps its micro-batch's positions and documents for the backward and a recompute. */
static void take_batch(model *m, act_slot *s, const ust_batch *b) {
    int N = m->shape.B * m->shape.T;
    m->ops->to_device(m->ops, s->pos, b->positions, N * sizeof(int32_t));
    if (m->shape.doc_mask || m->shape.reset_pos) {
        UST_ASSERT(b->doc_starts, "data.doc_mask: no documents given for the micro-batch");
        m->ops->to_device(m->ops, s->doc, b->doc_starts, N * sizeof(int32_t));
        s->doc_min = b->doc_starts[0];
        for (int i = 1; i < N; i++)
            s->doc_min = b->doc_starts[i] < s->doc_min ? b->doc_starts[i] : s->doc_min;
        if (s->udoc) s->udoc_min = cp_gather_docs(m->par.cp, s->udoc, s->doc);
    }
    int W[CFG_MAX_WINDOWS], nw = cfg_windows(m->cfg, W);
    for (int k = 0; k < nw; k++) take_windows(m, s, b, k, W[k]);
    use_batch(m, s);
}

/* ------------------------------------------------------------------ forward */

double model_chunk_forward(model *m, int c, int slot, const ust_batch *b, float dscale,
                           int64_t *ntok) {
    const ust_ops *o = m->ops;
    model_chunk *ch = &m->chunks[c];
    act_slot *s = &ch->slots[slot];
    int N = m->shape.B * m->shape.T, u = ch->unit0;
    if (ntok) *ntok = 0;
    take_batch(m, s, b);
    /* model.mtp: the modules run where the batch carries their tokens (training, validation) */
    s->mtp_live = m->mtp.D > 0 && b->mtp_tokens;
    if (ch->embed) {
        o->to_device(o, s->tok, b->tokens, N * sizeof(int32_t));
        if (s->mtp_live)
            o->to_device(o, s->mtp_tok, b->mtp_tokens, (size_t)m->mtp.D * N * sizeof(int32_t));
        u = vocab_embed_forward(m, s, u);
    }
    for (int l = ch->lo; l < ch->hi; l++) {
        int i = l - ch->lo, moe = is_moe(m, l); /* a MoE layer: units u and u+1 (experts) */
        moe_stats st;
        model_hook(m, u, MODEL_FWD_BEGIN);
        if (moe) model_hook(m, u + 1, MODEL_FWD_BEGIN);
        block_forward(m, l, s->xs[i], s->xs[i + 1], acts_of(m, s, i),
                      moe ? moe_acts_of(m, s, i) : NULL, &st);
        if (m->act_sq) model_act_add(m, l, s->xs[i + 1]); /* logging.stats_every's RMS */
        if (moe) {
            model_hook(m, u + 1, MODEL_FWD_END);
            model_moe_record(m, l, &st, dscale);
        }
        model_hook(m, u, MODEL_FWD_END);
        u += 1 + moe;
    }
    if (!ch->head) {
        mtp_pass_on(m, s, ch->hi - ch->lo);
        return 0;
    }
    o->to_device(o, m->acts.tgt, b->targets, N * sizeof(int32_t));
    int64_t counted = 0;
    for (int i = 0; i < N; i++) counted += b->targets[i] >= 0;
    if (ntok) *ntok = counted;
    const act *x_last = s->xs[ch->hi - ch->lo];
    double loss = vocab_head_forward(m, s, x_last, u + m->mtp.D * mtp_units(m), dscale);
    if (s->mtp_live) mtp_forward(m, s, b, x_last, dscale, ch->mtp_u0);
    return loss;
}

const float *model_chunk_losses(const model *m, int c) {
    return m->chunks[c].head ? m->acts.losses : NULL;
}

double model_forward(model *m, const ust_batch *b, float dscale, int64_t *ntok) {
    UST_ASSERT(m->nchunks == 1 && m->chunks[0].embed && m->chunks[0].head,
               "model_forward runs the whole model; a pipeline stage runs model_chunk_forward");
    return model_chunk_forward(m, 0, 0, b, dscale, ntok);
}

/* ------------------------------------------------------------------ backward */

void model_chunk_backward(model *m, int c, int slot, int input_only) {
    model_chunk *ch = &m->chunks[c];
    act_slot *s = &ch->slots[slot];
    UST_ASSERT(!input_only || m->shape.zb, "input-only backward needs a model made with zb");
    model_phase begin = input_only ? MODEL_BIN_BEGIN : MODEL_BWD_BEGIN;
    model_phase end = input_only ? MODEL_BIN_END : MODEL_BWD_END;
    int nl = ch->hi - ch->lo, u = ch->unit0 + ch->nunits - 1;
    act *dx = s->dy; /* the chunk's output gradient, turned into its input gradient */
    deferral df = {input_only ? &s->wg : NULL, NULL};
    if (input_only) s->wg.n = 0;
    use_batch(m, s);
    if (ch->head && s->mtp_live) mtp_backward(m, s, s->xs[nl], ch->mtp_u0); /* before the head */
    if (ch->head) u = vocab_head_backward(m, s, s->xs[nl], dx, &df, begin, end, u);
    if (ch->head && s->mtp_live) mtp_add_input_grad(m, dx);
    if (ch->head) u -= m->mtp.D * mtp_units(m); /* the modules' units */
    for (int l = ch->hi - 1; l >= ch->lo; l--) {
        int i = l - ch->lo, moe = is_moe(m, l), ua = u - moe; /* MoE: ua dense, u experts */
        moe_acts *ma = moe ? moe_acts_of(m, s, i) : NULL;
        model_hook(m, ua, begin);
        if (moe) model_hook(m, u, begin);
        /* full recompute: rebuild this layer's activations from its saved input */
        if (m->shape.recompute == RECOMPUTE_FULL) {
            moe_stats again;
            block_forward(m, l, s->xs[i], s->xs[i + 1], &m->acts.scratch, ma, &again);
        }
        df.keep = input_only ? &s->ws[i] : NULL;
        block_later_unit(m, &df, WG_UNIT_BEGIN, ua);
        block_backward(m, l, s->xs[i], dx, acts_of(m, s, i), ma, &df);
        block_later_unit(m, &df, WG_UNIT_END, ua);
        if (moe) model_hook(m, u, end);
        model_hook(m, ua, end);
        u = ua - 1;
    }
    if (ch->embed) vocab_embed_backward(m, s, dx, &df, input_only, begin, end, u);
}

/* zb's W: the weight gradients B left, in the order it left them, each unit between its hooks
 * (the data-parallel layer reduces a unit's gradients at its end). */
void model_chunk_weight_grad(model *m, int c, int slot) {
    act_slot *s = &m->chunks[c].slots[slot];
    UST_ASSERT(m->shape.zb, "weight-gradient pass needs a model made with zb");
    const act *gathered = NULL;
    for (int k = 0; k < s->wg.n; k++) {
        const wg_job *j = &s->wg.jobs[k];
        switch (j->kind) {
        case WG_UNIT_BEGIN:
            model_hook(m, j->unit, MODEL_BWD_BEGIN);
            break;
        case WG_UNIT_END:
            model_hook(m, j->unit, MODEL_BWD_END);
            break;
        case WG_ACT:
            block_mlp_activation(m, j->acts);
            break;
        case WG_GATHER:
            gathered = tp_column_open(m->par.tp, j->x);
            break;
        case WG_LINEAR:
            tp_linear_wgrad(m->par.tp, *j->dw, j->db ? *j->db : NULL, j->dout,
                            j->gathered ? gathered : j->x, j->N, j->C, j->OC);
            break;
        case WG_NORM:
            block_norm_backward(m, m->acts.dtmp, *j->dw, j->db ? *j->db : NULL, j->dout, j->x,
                                *j->w, j->mean, j->rstd);
            break;
        case WG_HEADNORM:
            block_head_norm_wgrad(m, *j->dw, j->dout, j->x, *j->w, j->rstd, j->N);
            break;
        case WG_PROJNORM:
            proj_norm_wgrad(m, *j->dw, j->dout, j->x, *j->w, j->rstd, j->N);
            break;
        case WG_LATNORM: /* model.mla */
            m->ops->rmsnorm_bwd(m->ops, NULL, *j->dw, j->dout, j->x, *j->w, j->rstd, j->N, j->C);
            break;
        case WG_MTP_HEAD:
            mtp_head_wgrad(m, s);
            break;
        case WG_REP_BEGIN:
        case WG_REP_END:
            mla_wgrad_rep(m, j->kind == WG_REP_END ? j->unit : -1);
            break;
        case WG_EMBED:
            vocab_embed_grads(m, s, j->dout, j->vc);
            break;
        }
    }
}

void model_backward(model *m) { model_chunk_backward(m, 0, 0, 0); }

void model_zero_grads(model *m) {
    UST_ASSERT(m->tab.g, "model_zero_grads needs the whole gradient buffer");
    m->ops->zero(m->ops, m->tab.g, m->tab.numel * sizeof(float));
}
