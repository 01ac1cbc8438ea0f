/* model.c: the transformer's math, one explicit forward/backward pair per block, llm.c style,
 * and the activations they keep (the parameter table is params.c's).
 * Shapes: B = micro-batch, T = sequence, N = B*T tokens, C = d_model, H/Hkv = query/key-value
 * heads of size D, F = d_ff, Vp = padded vocabulary (V real). */
#include "model.h"
#include "model_internal.h"
#include "acts.h"
#include "params.h"

#include <math.h>
#include <stdio.h>
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

/* The MoE layers' shared context and weight tables. The tensor-parallel ranks split the
 * micro-batch's tokens (each routes and computes its 1/tp: its own rows under sp, a slice of the
 * replicated rows without), so no expert work is repeated over tp; the aux-loss statistics are
 * summed over the cp shards and the tp parts. */
static void init_moe(model *m, ust_arena *arena, const model_storage *st) {
    m->moe.has_moe = 1;
    m->moe.ep_size = ep_size(st->ep);
    m->moe.ep_rank = ep_rank(st->ep);
    moe_groups g = {.tp_comm = tp_size(m->par.tp) > 1 ? m->par.tp->comm : NULL,
                    .ep = st->ep,
                    .stats_comm = {m->par.cp->comm, tp_size(m->par.tp) > 1 ? m->par.tp->comm : NULL},
                    .cap_comm = m->par.cp->comm,
                    .cap_pos = cp_positions_of(m->par.cp, 0),
                    .cap_T = m->cfg->train.seq_len,
                    .cap_Tl = m->shape.T};
    moe_init(&m->moe.ctx, m->cfg, m->ops, arena, m->shape.B * m->shape.T, &g);
    m->moe.mw = calloc(m->shape.L, sizeof *m->moe.mw);
    m->moe.mg = calloc(m->shape.L, sizeof *m->moe.mg);
    m->moe.mstats = calloc(m->shape.L, sizeof *m->moe.mstats);
    m->moe.moe_load = calloc((size_t)m->shape.L * m->moe.ctx.E, sizeof *m->moe.moe_load);
    m->moe.moe_gload = calloc((size_t)m->shape.L * m->moe.ctx.E, sizeof *m->moe.moe_gload);
    UST_ASSERT(m->moe.mw && m->moe.mg && m->moe.mstats && m->moe.moe_load && m->moe.moe_gload,
               "out of host memory (MoE tables)");
    for (int l = 0; l < m->shape.L; l++)
        if (is_moe(m, l))
            moe_weights_init(&m->moe.mw[l], &m->moe.ctx), moe_weights_init(&m->moe.mg[l], &m->moe.ctx);
    /* the step's loss adds each micro-batch's MoE loss averaged over the step's micro-batches
     * (docs/design.md section 4); the cp shards of a micro-batch share its statistics, so one of
     * them counts the value (all of them its gradient, through their own tokens) */
    m->moe.moe_scale = 1.0f / (float)(cfg_grad_accum(m->cfg) * m->cfg->parallel.dp);
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
        cp_init(&m->par.own_cp, ops, NULL, NULL, NULL, arena, m->shape.T, m->shape.B, m->shape.H, m->shape.Hkv, m->shape.D,
                cfg->parallel.cp_layout, cfg->parallel.cp_comm, 1);
        m->par.cp = &m->par.own_cp;
    }
    params_local_rows(m);
    m->tab.unit_pad = st->unit_pad;
    params_chunks(m, st->chunks, st->nchunks);
    params_vocab_chunks(m, st->vocab_chunk_rows);
    if (cfg->model.moe.num_experts > 0) init_moe(m, arena, st);
    m->w.lw = calloc(m->shape.L, sizeof *m->w.lw);
    m->w.lg = calloc(m->shape.L, sizeof *m->w.lg);
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
    free(m->tab.all);
    acts_free(m);
    if (m->moe.has_moe) {
        for (int l = 0; l < m->shape.L; l++)
            if (is_moe(m, l)) moe_weights_free(&m->moe.mw[l]), moe_weights_free(&m->moe.mg[l]);
        if (m->shape.recompute == RECOMPUTE_FULL) moe_acts_free(&m->acts.moe_scratch);
        moe_free(&m->moe.ctx);
    }
    free(m->moe.mw), free(m->moe.mg), free(m->moe.mstats), free(m->tab.unit_expert);
    free(m->moe.moe_load), free(m->moe.moe_gload);
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



static void hook(model *m, int unit, model_phase phase) {
    if (m->hooks.unit) m->hooks.unit(m->hooks.ctx, unit, phase);
}



/* ------------------------------------------------------------------ forward */

/* Norms run on this rank's rows (all of them without sequence parallelism). */
static void norm_forward(model *m, act *out, float *mean, float *rstd, const act *inp,
                         const float *w, const float *b) {
    int N = m->shape.Nl;
    if (m->shape.llama)
        m->ops->rmsnorm_fwd(m->ops, out, rstd, inp, w, N, m->shape.C, m->shape.eps);
    else
        m->ops->layernorm_fwd(m->ops, out, mean, rstd, inp, w, b, N, m->shape.C, 1e-5f);
}

static void norm_backward_rows(model *m, act *dinp, float *dw, float *db, const act *dout,
                               const act *inp, const float *w, const float *mean,
                               const float *rstd) {
    int N = m->shape.Nl;
    if (m->shape.llama)
        m->ops->rmsnorm_bwd(m->ops, dinp, dw, dout, inp, w, rstd, N, m->shape.C);
    else
        m->ops->layernorm_bwd(m->ops, dinp, dw, db, dout, inp, w, mean, rstd, N, m->shape.C);
}

/* Under sequence parallelism each rank saw only its rows, so the norm's weight (and bias)
 * gradient of this micro-batch is summed over the group before it is accumulated. */
static void norm_backward(model *m, act *dinp, float *dw, float *db, const act *dout,
                          const act *inp, const float *w, const float *mean, const float *rstd) {
    if (!tp_sp(m->par.tp)) {
        norm_backward_rows(m, dinp, dw, db, dout, inp, w, mean, rstd);
        return;
    }
    const ust_ops *o = m->ops;
    int C = m->shape.C;
    o->zero(o, m->acts.dnorm, 2 * (size_t)C * sizeof(float));
    norm_backward_rows(m, dinp, m->acts.dnorm, db ? m->acts.dnorm + C : NULL, dout, inp, w, mean, rstd);
    tp_allreduce(m->par.tp, m->acts.dnorm, db ? 2 * C : C);
    o->axpy(o, dw, 1.0f, m->acts.dnorm, C);
    if (db) o->axpy(o, db, 1.0f, m->acts.dnorm + C, C);
}

/* act(N,F) = swiglu(gate, up) for llama, gelu(up) for gpt2 */
static void mlp_activation(model *m, layer_acts *a) {
    int64_t n = (int64_t)m->shape.B * m->shape.T * m->shape.F;
    if (m->shape.llama)
        m->ops->swiglu_fwd(m->ops, a->act, a->gate, a->up, n);
    else
        m->ops->gelu_fwd(m->ops, a->act, a->up, n);
}

/* Where this tensor-parallel rank's MoE tokens start in a (B*T, C) tensor every tp rank holds
 * whole (without sp; under sp the rank's own rows are its tokens: 0). */
static int64_t moe_tp_offset(const model *m) {
    if (tp_sp(m->par.tp) || tp_size(m->par.tp) == 1) return 0;
    return (int64_t)m->par.tp->rank * (m->shape.B * m->shape.T / tp_size(m->par.tp)) * m->shape.C;
}

/* The MoE MLP on this tensor-parallel rank's share of the tokens (its rows under sp); without
 * sp the shares are all-gathered so every rank's residual gets the whole y. */
static void moe_mlp_forward(model *m, int l, act *x_out, const layer_acts *a, moe_acts *ma,
                            moe_stats *st) {
    const ust_ops *o = m->ops;
    int64_t off = moe_tp_offset(m);
    /* dln: scratch, free in forward */
    moe_forward(&m->moe.ctx, ma, &m->moe.mw[l], act_at(o, m->acts.dln, off), act_at(o, a->ln2, off), st);
    if (!tp_sp(m->par.tp)) moe_tp_gather_rows(&m->moe.ctx, m->acts.dln);
    o->add(o, x_out, m->acts.dln, a->res2, (int64_t)m->shape.Nl * m->shape.C);
}

/* x_in, x_out: (B,T,C). Pre-norm block: res2 = x + attn(norm1(x)); out = res2 + mlp(norm2(res2)) */
static void layer_forward(model *m, int l, const act *x_in, act *x_out, layer_acts *a, moe_acts *ma,
                          moe_stats *st) {
    const ust_ops *o = m->ops;
    const layer_w *w = &m->w.lw[l];
    int N = m->shape.B * m->shape.T, C = m->shape.C, HD = m->shape.H * m->shape.D, KV = m->shape.Hkv * m->shape.D;
    norm_forward(m, a->ln1, a->ln1_mean, a->ln1_rstd, x_in, w->ln1_w, w->ln1_b);
    const act *ln1 = tp_gather(m->par.tp, a->ln1); /* (N, C): every token enters attention */
    tp_column_linear_fwd(m->par.tp, a->q, ln1, w->wq, w->bq, N, C, HD); /* this rank's heads */
    tp_column_linear_fwd(m->par.tp, a->k, ln1, w->wk, w->bk, N, C, KV);
    tp_column_linear_fwd(m->par.tp, a->v, ln1, w->wv, w->bv, N, C, KV);
    if (m->shape.llama) {
        o->rope_fwd(o, a->q, a->q, m->batch.rows, m->shape.B, m->shape.T, m->shape.H, m->shape.D, &m->shape.rope);
        o->rope_fwd(o, a->k, a->k, m->batch.rows, m->shape.B, m->shape.T, m->shape.Hkv, m->shape.D, &m->shape.rope);
    }
    cp_attention_fwd(m->par.cp, a->att, a->lse, a->q, a->k, a->v, m->shape.H, m->shape.doc_mask ? &m->batch.docs : NULL);
    tp_row_linear_fwd(m->par.tp, a->res2, a->att, w->wo, w->bo, N, HD, C);
    o->add(o, a->res2, a->res2, x_in, (int64_t)m->shape.Nl * C);
    norm_forward(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2_w, w->ln2_b);
    if (is_moe(m, l)) {
        moe_mlp_forward(m, l, x_out, a, ma, st);
        return;
    }
    const act *ln2 = tp_gather(m->par.tp, a->ln2);
    if (m->shape.llama) {
        tp_column_linear_fwd(m->par.tp, a->gate, ln2, w->wg, NULL, N, C, m->shape.F);
        tp_column_linear_fwd(m->par.tp, a->up, ln2, w->wu, w->bu, N, C, m->shape.F);
        mlp_activation(m, a);
    } else {
        tp_column_linear_gelu_fwd(m->par.tp, a->up, a->act, ln2, w->wu, w->bu, N, C, m->shape.F);
    }
    tp_row_linear_fwd(m->par.tp, x_out, a->act, w->wd, w->bd, N, m->shape.F, C);
    o->add(o, x_out, x_out, a->res2, (int64_t)m->shape.Nl * C);
}

void model_set_docs(model *m, const int32_t *doc_start) { m->batch.doc_next = doc_start; }

/* The micro-batch of slot s is the one computed now. */
static void use_docs(model *m, const act_slot *s) {
    m->batch.docs = s->udoc ? (cp_docs){s->udoc, s->udoc_min} : (cp_docs){s->doc, s->doc_min};
    m->batch.rows = m->shape.reset_pos ? s->rpos : m->acts.pos_rows;
}

/* The slot keeps its micro-batch's documents (and, data.reset_positions, the positions inside
 * them) for the backward and a recompute. */
static void take_docs(model *m, act_slot *s) {
    if (!m->shape.doc_mask && !m->shape.reset_pos) return;
    int N = m->shape.B * m->shape.T;
    UST_ASSERT(m->batch.doc_next, "data.doc_mask: no documents given for the micro-batch");
    m->ops->to_device(m->ops, s->doc, m->batch.doc_next, N * sizeof(int32_t));
    s->doc_min = m->batch.doc_next[0];
    for (int i = 1; i < N; i++)
        s->doc_min = m->batch.doc_next[i] < s->doc_min ? m->batch.doc_next[i] : s->doc_min;
    if (m->shape.reset_pos) {
        int32_t *host = malloc((size_t)N * sizeof(int32_t));
        const int32_t *mine = cp_positions_of(m->par.cp, m->par.cp->rank);
        for (int i = 0; i < N; i++) host[i] = mine[i % m->shape.T] - m->batch.doc_next[i];
        m->ops->to_device(m->ops, s->rpos, host, (size_t)N * sizeof(int32_t));
        free(host);
    }
    if (s->udoc) s->udoc_min = cp_gather_docs(m->par.cp, s->udoc, s->doc);
    m->batch.doc_next = NULL;
    use_docs(m, s);
}

/* ------------------------------------------------------------------ vocabulary chunks */

/* Rows [*r0, return) of this rank's vocabulary slice make chunk k. */
static int vc_range(const model *m, int k, int *r0) {
    *r0 = k * m->vc.vc_rows;
    return *r0 + m->vc.vc_rows < m->shape.Vl ? *r0 + m->vc.vc_rows : m->shape.Vl;
}

/* Column block k of the logits (N, chunk k's rows), dense at N * r0. */
static act *vc_block(const model *m, act *logits, int k) {
    int r0;
    vc_range(m, k, &r0);
    return act_at(m->ops, logits, (int64_t)m->shape.B * m->shape.T * r0);
}

/* The embedding over its units u (positions, gpt2) and the table's chunks; returns the unit
 * after them. Each chunk adds the tokens in its rows (m->acts.dln, free in forward, is the lookup's
 * scratch); every token is in exactly one chunk. */
static int embedding_forward_chunks(model *m, act_slot *s, int u) {
    int wpe = !m->shape.llama;
    if (wpe) hook(m, u, MODEL_FWD_BEGIN);
    act *sum = tp_embedding_begin(m->par.tp, s->xs[0], s->tok, wpe ? m->batch.rows : NULL,
                                  wpe ? m->w.wpe : NULL, m->shape.B, m->shape.T, m->shape.C);
    if (wpe) hook(m, u++, MODEL_FWD_END);
    for (int k = 0; k < m->vc.nvc; k++, u++) {
        int r0, r1 = vc_range(m, k, &r0);
        hook(m, u, MODEL_FWD_BEGIN);
        tp_embedding_add(m->par.tp, sum, m->acts.dln, s->tok, m->vc.wte_c[k], r0, r1, m->shape.B, m->shape.T, m->shape.C, m->shape.Vp);
        hook(m, u, MODEL_FWD_END);
    }
    tp_embedding_end(m->par.tp, sum, s->xs[0], m->shape.B, m->shape.T, m->shape.C);
    return u;
}

/* The head's logits block by block, each chunk's unit around its own (the tied table's units
 * when the embedding is here too), then the loss over the blocks: the logits stay whole (one
 * (N, Vl) buffer, block-major), only the weights are chunked, and the softmax's log-sum-exp is
 * merged over the blocks (tp_xent_blocks). One chunk is the unchunked head exactly. */
static void head_forward_chunks(model *m, act_slot *s, float dscale) {
    int N = m->shape.B * m->shape.T, r0s[MODEL_MAX_VOCAB_CHUNKS + 1];
    UST_ASSERT(m->vc.nvc <= MODEL_MAX_VOCAB_CHUNKS, "%d vocabulary chunks", m->vc.nvc);
    const act *x = tp_gather(m->par.tp, s->lnf);
    for (int k = 0; k < m->vc.nvc; k++) {
        int r1 = vc_range(m, k, &r0s[k]);
        r0s[k + 1] = r1;
        hook(m, m->vc.lm_u0 + k, MODEL_FWD_BEGIN);
        tp_column_linear_fwd(m->par.tp, vc_block(m, s->logits, k), x, m->vc.lm_c[k], NULL, N, m->shape.C,
                             r1 - r0s[k]);
        hook(m, m->vc.lm_u0 + k, MODEL_FWD_END);
    }
    if (m->vc.nvc == 1)
        tp_xent(m->par.tp, m->acts.losses, s->logits, m->acts.tgt, N, m->shape.Vp, m->shape.V, dscale);
    else
        tp_xent_blocks(m->par.tp, m->acts.losses, s->logits, r0s, m->vc.nvc, m->acts.tgt, N, m->shape.Vp, m->shape.V, dscale,
                       m->acts.vc_lse, m->acts.vc_merge, m->acts.vc_merge2);
}

double model_chunk_forward(model *m, int c, int slot, const int32_t *inputs, const int32_t *targets,
                           float dscale, int64_t *ntok) {
    const ust_ops *o = m->ops;
    model_chunk *ch = &m->chunks[c];
    act_slot *s = &ch->slots[slot];
    int N = m->shape.B * m->shape.T, u = ch->unit0;
    if (ntok) *ntok = 0;
    take_docs(m, s);
    if (ch->embed) {
        o->to_device(o, s->tok, inputs, N * sizeof(int32_t));
        if (m->vc.nvc)
            u = embedding_forward_chunks(m, s, u);
        else {
            hook(m, u, MODEL_FWD_BEGIN);
            tp_embedding_fwd(m->par.tp, s->xs[0], s->tok, m->shape.llama ? NULL : m->batch.rows, m->w.wte, m->w.wpe,
                             m->shape.B, m->shape.T, m->shape.C, m->shape.Vp);
            hook(m, u++, MODEL_FWD_END);
        }
    }
    for (int l = ch->lo; l < ch->hi; l++) {
        int i = l - ch->lo, moe = is_moe(m, l); /* a MoE layer: units u and u+1 (experts) */
        moe_stats st;
        hook(m, u, MODEL_FWD_BEGIN);
        if (moe) hook(m, u + 1, MODEL_FWD_BEGIN);
        layer_forward(m, l, s->xs[i], s->xs[i + 1], acts_of(m, s, i),
                      moe ? moe_acts_of(m, s, i) : NULL, &st);
        if (moe) {
            hook(m, u + 1, MODEL_FWD_END);
            m->moe.mstats[l] = st;
            if (dscale > 0 && cp_is_first(m->par.cp)) m->moe.moe_loss += st.loss * m->moe.moe_scale;
            /* the micro-batch's counts (summed over cp and tp): one of its cp ranks counts them
             * for the dp x cp sum (each tp rank is in its own such group) */
            if (dscale > 0 && cp_is_first(m->par.cp))
                for (int e = 0; e < m->moe.ctx.E; e++)
                    m->moe.moe_load[(int64_t)l * m->moe.ctx.E + e] += st.routed[e];
        }
        hook(m, u, MODEL_FWD_END);
        u += 1 + moe;
    }
    if (!ch->head) return 0;
    o->to_device(o, m->acts.tgt, targets, N * sizeof(int32_t));
    int64_t counted = 0;
    for (int i = 0; i < N; i++) counted += targets[i] >= 0;
    if (ntok) *ntok = counted;
    hook(m, u, MODEL_FWD_BEGIN);
    norm_forward(m, s->lnf, s->lnf_mean, s->lnf_rstd, s->xs[ch->hi - ch->lo], m->w.lnf_w, m->w.lnf_b);
    if (m->vc.nvc) {
        hook(m, u, MODEL_FWD_END);
        head_forward_chunks(m, s, dscale);
        return o->sum(o, m->acts.losses, N);
    }
    tp_column_linear_fwd(m->par.tp, s->logits, tp_gather(m->par.tp, s->lnf), m->w.lm, NULL, N, m->shape.C, m->shape.Vl);
    /* per-token losses, and dlogits (in place over logits) when training */
    tp_xent(m->par.tp, m->acts.losses, s->logits, m->acts.tgt, N, m->shape.Vp, m->shape.V, dscale);
    hook(m, u, MODEL_FWD_END);
    return o->sum(o, m->acts.losses, N);
}

double model_forward(model *m, const int32_t *inputs, const int32_t *targets, float dscale,
                     int64_t *ntok) {
    UST_ASSERT(m->nchunks == 1 && m->chunks[0].embed && m->chunks[0].head,
               "model_forward runs the whole model; a pipeline stage runs model_chunk_forward");
    return model_chunk_forward(m, 0, 0, inputs, targets, dscale, ntok);
}

/* ------------------------------------------------------------------ backward */

/* A norm's input gradient only (B of a zero-bubble schedule): the weight gradient goes to the
 * scratch and is dropped; W computes it again from the saved output gradient. */
static void norm_backward_input(model *m, act *dinp, const act *dout, const act *inp,
                                const float *w, const float *mean, const float *rstd) {
    float *dw = m->acts.dnorm, *db = m->shape.llama ? NULL : m->acts.dnorm + m->shape.C;
    m->ops->zero(m->ops, m->acts.dnorm, 2 * (size_t)m->shape.C * sizeof(float));
    norm_backward_rows(m, dinp, dw, db, dout, inp, w, mean, rstd);
}

static void save(model *m, act *dst, const act *src, int64_t n) {
    m->ops->copy(m->ops, dst, src, act_bytes(m->ops, n));
}

/* The backward passes below take df: a whole backward computes every weight gradient as it
 * goes (df.list NULL); zero-bubble's B computes input gradients only and leaves each weight
 * gradient as a job on df.list, saving the output gradient it needs in df.keep (the layer's
 * layer_wsave), for W to run later. */
typedef struct {
    wg_list *list;
    layer_wsave *keep;
} deferral;

/* The gradient buffer to pass to a fused backward call: none when it is deferred. */
static float *now(const deferral *df, float *g) { return df->list ? NULL : g; }

/* Under B: appends job j, first saving its output gradient (n activations) into keep. */
static void later(model *m, const deferral *df, wg_job j, act *keep, int64_t n) {
    if (!df->list) return;
    if (keep) {
        save(m, keep, j.dout, n);
        j.dout = keep;
    }
    wg_list *l = df->list;
    UST_ASSERT(l->n < l->cap, "more than %d deferred weight gradients", l->cap);
    l->jobs[l->n++] = j;
}

static void later_unit(model *m, const deferral *df, wg_kind k, int unit) {
    later(m, df, (wg_job){.kind = k, .unit = unit}, NULL, 0);
}

/* Dense MLP, out = res2 + act(ln2 @ wu^T [, ln2 @ wg^T]) @ wd^T + bd: from d out (dx, this
 * rank's rows) to d ln2; returns this rank's rows of it. */
static act *mlp_backward(model *m, int l, const act *dx, layer_acts *a, const deferral *df) {
    const ust_ops *o = m->ops;
    const layer_w *w = &m->w.lw[l];
    layer_w *g = &m->w.lg[l];
    int N = m->shape.B * m->shape.T, C = m->shape.C, F = m->shape.F;
    int64_t NF = (int64_t)N * F;
    if (m->shape.recompute == RECOMPUTE_SELECTIVE) { /* the down projection's input, for its dw */
        if (df->list)
            later(m, df, (wg_job){.kind = WG_ACT, .acts = a}, NULL, 0);
        else
            mlp_activation(m, a);
    }
    const act *gdx = tp_gather_grad(m->par.tp, dx);
    if (m->shape.llama)
        tp_row_linear_bwd(m->par.tp, m->acts.dact, now(df, g->wd), now(df, g->bd), gdx, a->act, w->wd, N,
                          F, C);
    else /* gelu's backward fused in: straight to d up */
        tp_row_linear_gelu_bwd(m->par.tp, m->acts.dup, now(df, g->wd), now(df, g->bd), gdx, a->act, a->up,
                               w->wd, N, F, C);
    later(m, df,
          (wg_job){.kind = WG_LINEAR, .dw = &g->wd, .db = &g->bd, .dout = gdx, .x = a->act,
                   .w = &w->wd, .N = N, .C = F, .OC = C},
          df->keep ? df->keep->gmlp : NULL, (int64_t)N * C);
    const act *ln2 = tp_gather(m->par.tp, a->ln2); /* sp: gathered again rather than kept */
    later(m, df, (wg_job){.kind = WG_GATHER, .x = a->ln2}, NULL, 0);
    if (m->shape.llama) o->swiglu_bwd(o, m->acts.dgate, m->acts.dup, m->acts.dact, a->gate, a->up, NF);
    tp_column_linear_bwd(m->par.tp, m->acts.dln, now(df, g->wu), now(df, g->bu), m->acts.dup, ln2, w->wu, N, C,
                         F, 0);
    later(m, df,
          (wg_job){.kind = WG_LINEAR, .gathered = 1, .dw = &g->wu, .db = &g->bu, .dout = m->acts.dup,
                   .w = &w->wu, .N = N, .C = C, .OC = F},
          df->keep ? df->keep->dup : NULL, NF);
    if (m->shape.llama) {
        tp_column_linear_bwd(m->par.tp, m->acts.dln, now(df, g->wg), NULL, m->acts.dgate, ln2, w->wg, N, C, F,
                             1);
        later(m, df,
              (wg_job){.kind = WG_LINEAR, .gathered = 1, .dw = &g->wg, .dout = m->acts.dgate,
                       .w = &w->wg, .N = N, .C = C, .OC = F},
              df->keep ? df->keep->dgate : NULL, NF);
    }
    return tp_reduce_grad(m->par.tp, m->acts.dln); /* the MLP's input is shared by the group: summed */
}

/* MoE MLP: each tensor-parallel rank backs up its own tokens (its rows under sp); without sp
 * the input gradient's shares are all-gathered, whole and the same on every rank. */
static act *moe_mlp_backward(model *m, int l, const act *dx, layer_acts *a, moe_acts *ma) {
    const ust_ops *o = m->ops;
    int64_t off = moe_tp_offset(m);
    moe_backward(&m->moe.ctx, ma, &m->moe.mw[l], &m->moe.mg[l], act_at(o, m->acts.dln, off), act_at(o, dx, off),
                 act_at(o, a->ln2, off), m->moe.moe_scale, 0);
    if (!tp_sp(m->par.tp)) moe_tp_gather_rows(&m->moe.ctx, m->acts.dln);
    return m->acts.dln;
}

/* dx += d loss / d (a norm's input), given its output gradient dout (this rank's rows); the
 * weight (and bias) gradient now, or under B a job reading dout saved in keep. */
static void norm_step_backward(model *m, const deferral *df, act *dx, act *dout, const act *inp,
                               float *const *w, float **gw, float **gb, const float *mean,
                               const float *rstd, act *keep) {
    if (df->list)
        norm_backward_input(m, m->acts.dtmp, dout, inp, *w, mean, rstd);
    else
        norm_backward(m, m->acts.dtmp, *gw, *gb, dout, inp, *w, mean, rstd);
    later(m, df,
          (wg_job){.kind = WG_NORM, .dw = gw, .db = gb, .dout = dout, .x = inp, .w = w,
                   .mean = mean, .rstd = rstd},
          keep, (int64_t)m->shape.Nl * m->shape.C);
    m->ops->add(m->ops, dx, dx, m->acts.dtmp, (int64_t)m->shape.Nl * m->shape.C);
}

/* Attention, res2 = x_in + attn(ln1) @ wo^T + bo: from d res2 (dx) to d ln1; returns this
 * rank's rows of it. */
static act *attention_backward(model *m, int l, const act *dx, layer_acts *a, const deferral *df) {
    const ust_ops *o = m->ops;
    const layer_w *w = &m->w.lw[l];
    layer_w *g = &m->w.lg[l];
    const layer_wsave *k = df->keep;
    int N = m->shape.B * m->shape.T, C = m->shape.C, HD = m->shape.H * m->shape.D, KV = m->shape.Hkv * m->shape.D;
    const act *gdx = tp_gather_grad(m->par.tp, dx);
    tp_row_linear_bwd(m->par.tp, m->acts.datt, now(df, g->wo), now(df, g->bo), gdx, a->att, w->wo, N, HD,
                      C);
    later(m, df,
          (wg_job){.kind = WG_LINEAR, .dw = &g->wo, .db = &g->bo, .dout = gdx, .x = a->att,
                   .w = &w->wo, .N = N, .C = HD, .OC = C},
          k ? k->gatt : NULL, (int64_t)N * C);
    o->zero(o, m->acts.dq, act_bytes(o, (int64_t)N * HD));
    o->zero(o, m->acts.dk, act_bytes(o, (int64_t)N * KV));
    o->zero(o, m->acts.dv, act_bytes(o, (int64_t)N * KV));
    cp_attention_bwd(m->par.cp, m->acts.dq, m->acts.dk, m->acts.dv, m->acts.datt, a->att, a->lse, a->q, a->k, a->v, m->shape.H,
                     m->shape.doc_mask ? &m->batch.docs : NULL);
    if (m->shape.llama) {
        o->rope_bwd(o, m->acts.dq, m->acts.dq, m->batch.rows, m->shape.B, m->shape.T, m->shape.H, m->shape.D, &m->shape.rope);
        o->rope_bwd(o, m->acts.dk, m->acts.dk, m->batch.rows, m->shape.B, m->shape.T, m->shape.Hkv, m->shape.D, &m->shape.rope);
    }
    const act *ln1 = tp_gather(m->par.tp, a->ln1);
    later(m, df, (wg_job){.kind = WG_GATHER, .x = a->ln1}, NULL, 0);
    const struct {
        float **dw, **db;
        act *dout, *keep;
        float *const *w;
        int OC;
    } qkv[3] = {{&g->wq, &g->bq, m->acts.dq, k ? k->dq : NULL, &w->wq, HD},
                {&g->wk, &g->bk, m->acts.dk, k ? k->dk : NULL, &w->wk, KV},
                {&g->wv, &g->bv, m->acts.dv, k ? k->dv : NULL, &w->wv, KV}};
    for (int i = 0; i < 3; i++) {
        tp_column_linear_bwd(m->par.tp, m->acts.dln, now(df, *qkv[i].dw), now(df, *qkv[i].db),
                             qkv[i].dout, ln1, *qkv[i].w, N, C, qkv[i].OC, i > 0);
        later(m, df,
              (wg_job){.kind = WG_LINEAR, .gathered = 1, .dw = qkv[i].dw, .db = qkv[i].db,
                       .dout = qkv[i].dout, .w = qkv[i].w, .N = N, .C = C, .OC = qkv[i].OC},
              qkv[i].keep, (int64_t)N * qkv[i].OC);
    }
    return tp_reduce_grad(m->par.tp, m->acts.dln); /* so is attention's */
}

/* dx: (B,T,C) holds d loss / d x_out on entry and d loss / d x_in on exit. */
static void layer_backward(model *m, int l, const act *x_in, act *dx, layer_acts *a, moe_acts *ma,
                           const deferral *df) {
    const layer_w *w = &m->w.lw[l];
    layer_w *g = &m->w.lg[l];
    const layer_wsave *k = df->keep;
    UST_ASSERT(!df->list || !is_moe(m, l), "zero-bubble B/W split of a MoE layer");
    act *dln = is_moe(m, l) ? moe_mlp_backward(m, l, dx, a, ma) : mlp_backward(m, l, dx, a, df);
    norm_step_backward(m, df, dx, dln, a->res2, &w->ln2_w, &g->ln2_w, &g->ln2_b, a->ln2_mean,
                       a->ln2_rstd, k ? k->dln2 : NULL); /* dx = d res2 */
    dln = attention_backward(m, l, dx, a, df);
    norm_step_backward(m, df, dx, dln, x_in, &w->ln1_w, &g->ln1_w, &g->ln1_b, a->ln1_mean,
                       a->ln1_rstd, k ? k->dln1 : NULL); /* dx = d x_in */
}

/* The head's backward: logits hold d loss / d logits (written by the fused cross-entropy);
 * leaves d loss / d (final norm input) in dx. Under B the logits stay until W reads them. */
static void head_norm_backward(model *m, act_slot *s, const act *x_last, act *dx,
                               const deferral *df);

static void head_backward(model *m, act_slot *s, const act *x_last, act *dx, const deferral *df) {
    int N = m->shape.B * m->shape.T;
    tp_column_linear_bwd(m->par.tp, m->acts.dln, now(df, m->w.g_lm), NULL, s->logits,
                         tp_gather(m->par.tp, s->lnf), m->w.lm, N, m->shape.C, m->shape.Vl, 0);
    later(m, df, (wg_job){.kind = WG_GATHER, .x = s->lnf}, NULL, 0);
    later(m, df,
          (wg_job){.kind = WG_LINEAR, .gathered = 1, .dw = &m->w.g_lm, .dout = s->logits,
                   .w = &m->w.lm, .N = N, .C = m->shape.C, .OC = m->shape.Vl},
          NULL, 0);
    head_norm_backward(m, s, x_last, dx, df);
}

/* The head's chunks, last first, each between its unit's hooks (and marks for W): d lnf
 * (m->acts.dln, summed over the blocks) and each chunk's weight gradient. */
static void head_backward_chunks(model *m, act_slot *s, const deferral *df, model_phase begin,
                                 model_phase end) {
    int N = m->shape.B * m->shape.T;
    const act *x = tp_gather(m->par.tp, s->lnf);
    later(m, df, (wg_job){.kind = WG_GATHER, .x = s->lnf}, NULL, 0);
    for (int k = m->vc.nvc - 1; k >= 0; k--) {
        int r0, r1 = vc_range(m, k, &r0), u = m->vc.lm_u0 + k;
        act *blk = vc_block(m, s->logits, k);
        hook(m, u, begin);
        later_unit(m, df, WG_UNIT_BEGIN, u);
        tp_column_linear_bwd(m->par.tp, m->acts.dln, now(df, m->vc.g_lm_c[k]), NULL, blk, x, m->vc.lm_c[k], N,
                             m->shape.C, r1 - r0, k < m->vc.nvc - 1);
        later(m, df,
              (wg_job){.kind = WG_LINEAR, .gathered = 1, .dw = &m->vc.g_lm_c[k], .dout = blk,
                       .w = &m->vc.lm_c[k], .N = N, .C = m->shape.C, .OC = r1 - r0},
              NULL, 0);
        later_unit(m, df, WG_UNIT_END, u);
        hook(m, u, end);
    }
}

/* The final norm's backward: from d lnf (m->acts.dln) to d x_last in dx. */
static void head_norm_backward(model *m, act_slot *s, const act *x_last, act *dx,
                               const deferral *df) {
    act *dln = tp_reduce_grad(m->par.tp, m->acts.dln);
    if (df->list)
        norm_backward_input(m, dx, dln, x_last, m->w.lnf_w, s->lnf_mean, s->lnf_rstd);
    else
        norm_backward(m, dx, m->w.g_lnf_w, m->w.g_lnf_b, dln, x_last, m->w.lnf_w, s->lnf_mean,
                      s->lnf_rstd);
    later(m, df,
          (wg_job){.kind = WG_NORM, .dw = &m->w.g_lnf_w, .db = &m->w.g_lnf_b, .dout = dln, .x = x_last,
                   .w = &m->w.lnf_w, .mean = s->lnf_mean, .rstd = s->lnf_rstd},
          s->dlnf, (int64_t)m->shape.Nl * m->shape.C);
}

/* vc: the vocabulary chunk whose rows get their gradient (-1: the learned positions); ignored
 * without chunks (all of them). Per chunk, each row's sum runs over the same tokens in the same
 * order as the whole table's: the same bits. */
static void embedding_backward(model *m, const int32_t *tok, const act *dx, int vc) {
    if (!m->vc.nvc) {
        tp_embedding_bwd(m->par.tp, m->w.g_wte, m->shape.llama ? NULL : m->w.g_wpe, dx, tok,
                         m->shape.llama ? NULL : m->batch.rows, m->shape.B, m->shape.T, m->shape.C, m->shape.Vp);
        return;
    }
    const act *dout = tp_gather_grad(m->par.tp, dx);
    int v0, v1, r0 = 0, r1 = 0;
    tp_vocab_range(m->par.tp, m->shape.Vp, &v0, &v1);
    if (vc >= 0) r1 = vc_range(m, vc, &r0);
    m->ops->embedding_bwd(m->ops, vc >= 0 ? m->vc.g_wte_c[vc] : NULL, vc < 0 ? m->w.g_wpe : NULL, dout,
                          tok, vc < 0 ? m->batch.rows : NULL, m->shape.B, m->shape.T, m->shape.C, v0 + r0, v0 + r1);
}

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
    if (m->shape.doc_mask || m->shape.reset_pos) use_docs(m, s);
    if (ch->head && m->vc.nvc) { /* chunks, then the final norm's unit */
        head_backward_chunks(m, s, &df, begin, end);
        if (!m->shape.tied_local) u -= m->vc.nvc;
        hook(m, u, begin);
        later_unit(m, &df, WG_UNIT_BEGIN, u);
        head_norm_backward(m, s, s->xs[nl], dx, &df);
        later_unit(m, &df, WG_UNIT_END, u);
        hook(m, u--, end);
    } else if (ch->head) {
        hook(m, u, begin);
        later_unit(m, &df, WG_UNIT_BEGIN, u);
        head_backward(m, s, s->xs[nl], dx, &df);
        later_unit(m, &df, WG_UNIT_END, u);
        hook(m, u--, end);
    }
    for (int l = ch->hi - 1; l >= ch->lo; l--) {
        int i = l - ch->lo, moe = is_moe(m, l), ua = u - moe; /* MoE: ua dense, u experts */
        moe_acts *ma = moe ? moe_acts_of(m, s, i) : NULL;
        hook(m, ua, begin);
        if (moe) hook(m, u, begin);
        /* full recompute: rebuild this layer's activations from its saved input */
        if (m->shape.recompute == RECOMPUTE_FULL) {
            moe_stats again;
            layer_forward(m, l, s->xs[i], s->xs[i + 1], &m->acts.scratch, ma, &again);
        }
        df.keep = input_only ? &s->ws[i] : NULL;
        later_unit(m, &df, WG_UNIT_BEGIN, ua);
        layer_backward(m, l, s->xs[i], dx, acts_of(m, s, i), ma, &df);
        later_unit(m, &df, WG_UNIT_END, ua);
        if (moe) hook(m, u, end);
        hook(m, ua, end);
        u = ua - 1;
    }
    /* the embedding: its one unit, or the table's chunks last first and then the positions */
    for (int vc = m->vc.nvc ? m->vc.nvc - 1 : 0; ch->embed && vc >= (m->vc.nvc && !m->shape.llama ? -1 : 0);
         vc--, u--) {
        hook(m, u, begin);
        if (!input_only) embedding_backward(m, s->tok, dx, vc);
        later_unit(m, &df, WG_UNIT_BEGIN, u);
        later(m, &df, (wg_job){.kind = WG_EMBED, .dout = dx, .vc = vc}, NULL, 0);
        later_unit(m, &df, WG_UNIT_END, u);
        hook(m, u, end);
    }
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
        case WG_UNIT_BEGIN: hook(m, j->unit, MODEL_BWD_BEGIN); break;
        case WG_UNIT_END: hook(m, j->unit, MODEL_BWD_END); break;
        case WG_ACT: mlp_activation(m, j->acts); break;
        case WG_GATHER: gathered = tp_gather(m->par.tp, j->x); break;
        case WG_LINEAR:
            tp_column_linear_bwd(m->par.tp, NULL, *j->dw, j->db ? *j->db : NULL, j->dout,
                                 j->gathered ? gathered : j->x, *j->w, j->N, j->C, j->OC, 0);
            break;
        case WG_NORM:
            norm_backward(m, m->acts.dtmp, *j->dw, j->db ? *j->db : NULL, j->dout, j->x, *j->w, j->mean,
                          j->rstd);
            break;
        case WG_EMBED: embedding_backward(m, s->tok, j->dout, j->vc); break;
        }
    }
}

void model_backward(model *m) { model_chunk_backward(m, 0, 0, 0); }

/* The parameter-table index of layer l's routing bias (-1: none). */
static int bias_param(model *m, int l) {
    char n[CKPT_NAME_MAX];
    snprintf(n, sizeof n, "model.layers.%d.mlp.router.expert_bias", l);
    for (int i = 0; i < model_num_params(m); i++)
        if (!strcmp(model_param_at(m, i)->name, n)) return i;
    return -1;
}

/* Layer l's bias moved by its step loads: in place in whole storage, else through add. */
static void move_bias(model *m, int l, const double *load, model_param_add_fn add, void *ctx) {
    if (m->tab.p) {
        moe_update_bias(&m->moe.ctx, m->moe.mw[l].bias, load);
        return;
    }
    int i = bias_param(m, l);
    UST_ASSERT(i >= 0 && add, "layer %d: a routing bias without whole storage or a sharding layer",
               l);
    float *delta = m->moe.ctx.stats_host; /* E floats of host scratch, free between forwards */
    moe_bias_delta(&m->moe.ctx, load, delta);
    add(ctx, i, delta);
}

void model_moe_end_step(model *m, struct ust_comm *group, struct ust_comm *mirror, int update_bias,
                        model_param_add_fn add, void *ctx) {
    if (!m->moe.has_moe) return;
    int E = m->moe.ctx.E;
    int has_bias = m->cfg->model.moe.bias_update_rate > 0;
    moe_step_loads(&m->moe.ctx, group, m->moe.moe_load);
    if (mirror) moe_step_loads(&m->moe.ctx, mirror, m->moe.moe_load);
    for (int c = 0; c < m->nchunks; c++)
        for (int l = m->chunks[c].lo; l < m->chunks[c].hi; l++)
            if (is_moe(m, l) && update_bias && has_bias)
                move_bias(m, l, m->moe.moe_load + (int64_t)l * E, add, ctx);
    memcpy(m->moe.moe_gload, m->moe.moe_load, (size_t)m->shape.L * E * sizeof *m->moe.moe_load);
    memset(m->moe.moe_load, 0, (size_t)m->shape.L * E * sizeof *m->moe.moe_load);
}

int model_moe_rank_rows(const model *m, int i, double *rows, int max) {
    int n = 0, E = m->moe.ctx.E, ep = m->moe.ep_size, El = E / ep;
    const __typeof__(m->cfg->parallel) *p = &m->cfg->parallel;
    double holders = (double)p->dp / ep * p->cp * p->tp;
    for (int c = 0; c < m->nchunks; c++)
        for (int l = m->chunks[c].lo; l < m->chunks[c].hi; l++)
            if (is_moe(m, l) && n++ == i) {
                for (int r = 0; r < ep && r < max; r++) {
                    double s = 0;
                    for (int e = r * El; e < (r + 1) * El; e++)
                        s += m->moe.moe_gload[(int64_t)l * E + e];
                    rows[r] = s / holders;
                }
                return ep < max ? ep : max;
            }
    return 0;
}

double model_take_moe_loss(model *m) {
    double x = m->moe.moe_loss;
    m->moe.moe_loss = 0;
    return x;
}

int model_moe_stats(const model *m, int *layers, double *load_max, double *load_mean,
                    double *dropped, int max) {
    int n = 0;
    for (int c = 0; c < m->nchunks; c++)
        for (int l = m->chunks[c].lo; l < m->chunks[c].hi && n < max; l++)
            if (is_moe(m, l)) {
                layers[n] = l;
                load_max[n] = m->moe.mstats[l].load_max;
                load_mean[n] = m->moe.mstats[l].load_mean;
                dropped[n++] = m->moe.mstats[l].dropped_frac;
            }
    return n;
}



void model_zero_grads(model *m) {
    UST_ASSERT(m->tab.g, "model_zero_grads needs the whole gradient buffer");
    m->ops->zero(m->ops, m->tab.g, m->tab.numel * sizeof(float));
}
