/* model_block.c: one transformer block's forward and backward (norms, attention, the dense or
 * MoE MLP), llm.c style, and the deferral of weight gradients that zero-bubble's B leaves for W.
 * Shapes as in model.c. */
#include "model_block.h"

#include "cp.h"
#include "error.h"
#include "model_mla.h"
#include "moe.h"
#include "proj_norm.h"
#include "tp.h"

/* ------------------------------------------------------------------ forward */

/* The weight an RMSNorm's op takes: w, or under model.norm_offset (Gemma) 1 + w made in the
 * scratch wone (n floats) just before the op, in fp32 as transformers' 1.0 + weight.float(). The
 * op's weight gradient is then d/dw itself (d(1 + w)/dw = 1). The scratch is one for all norms:
 * each op reads it before the next norm refills it (ops are ordered on the backend's stream). */
static const float *block_norm_weight(model *m, const float *w, int n) {
    if (!m->shape.fam.norm_offset) return w;
    const ust_ops *o = m->ops;
    o->copy(o, m->acts.noff.wone, m->acts.noff.ones, (size_t)n * sizeof(float));
    o->axpy(o, m->acts.noff.wone, 1.0f, w, n);
    return m->acts.noff.wone;
}

/* Norms run on this rank's rows (all of them without sequence parallelism). */
void block_norm_forward(model *m, act *out, float *mean, float *rstd, const act *inp,
                        const float *w, const float *b) {
    int N = m->shape.Nl;
    if (m->shape.llama)
        m->ops->rmsnorm_fwd(m->ops, out, rstd, inp, block_norm_weight(m, w, m->shape.C), N,
                            m->shape.C, m->shape.eps);
    else
        m->ops->layernorm_fwd(m->ops, out, mean, rstd, inp, w, b, N, m->shape.C, 1e-5f);
}

static void norm_backward_rows(model *m, act *dinp, float *dw, float *db, const act *dout,
                               const act *inp, const float *w, const float *mean,
                               const float *rstd) {
    int N = m->shape.Nl;
    if (m->shape.llama)
        m->ops->rmsnorm_bwd(m->ops, dinp, dw, dout, inp, block_norm_weight(m, w, m->shape.C), rstd,
                            N, m->shape.C);
    else
        m->ops->layernorm_bwd(m->ops, dinp, dw, db, dout, inp, w, mean, rstd, N, m->shape.C);
}

/* Under sequence parallelism each rank saw only its rows, so the norm's weight (and bias)
 * gradient of this micro-batch is summed over the group before it is accumulated. */
void block_norm_backward(model *m, act *dinp, float *dw, float *db, const act *dout, const act *inp,
                         const float *w, const float *mean, const float *rstd) {
    if (!tp_sp(m->par.tp)) {
        norm_backward_rows(m, dinp, dw, db, dout, inp, w, mean, rstd);
        return;
    }
    const ust_ops *o = m->ops;
    int C = m->shape.C;
    o->zero(o, m->acts.dnorm, 2 * (size_t)C * sizeof(float));
    norm_backward_rows(m, dinp, m->acts.dnorm, db ? m->acts.dnorm + C : NULL, dout, inp, w, mean,
                       rstd);
    tp_sp_sum_norm_grads(m->par.tp, dw, db, m->acts.dnorm, C);
}

/* act(N,F) = swiglu(gate, up) for llama (geglu under model.hidden_act gelu_tanh), gelu(up) for
 * gpt2 */
void block_mlp_activation(model *m, layer_acts *a) {
    int64_t n = (int64_t)m->shape.B * m->shape.T * m->shape.F;
    if (m->shape.fam.geglu)
        m->ops->geglu_fwd(m->ops, a->act, a->gate, a->up, n);
    else if (m->shape.llama)
        m->ops->swiglu_fwd(m->ops, a->act, a->gate, a->up, n);
    else
        m->ops->gelu_fwd(m->ops, a->act, a->up, n);
}

/* model.qk_norm (Qwen3): RMSNorm over each head's D features of q or k, the (N, heads*D) tensor
 * as N*heads rows of D; under tensor parallelism each rank norms its own heads. */
static void head_norm_forward(model *m, act *out, float *rstd, const act *inp, const float *w,
                              int heads) {
    m->ops->rmsnorm_fwd(m->ops, out, rstd, inp, block_norm_weight(m, w, m->shape.D),
                        m->shape.B * m->shape.T * heads, m->shape.D, m->shape.eps);
}

/* dw += the head norm's weight gradient from its output gradient dout: each tensor-parallel rank
 * saw only its heads, so the partial sums are summed over the group (the weight is whole on
 * every rank and must stay equal there). */
void block_head_norm_wgrad(model *m, float *dw, const act *dout, const act *inp, const float *w,
                           const float *rstd, int rows) {
    const ust_ops *o = m->ops;
    o->zero(o, m->acts.dnorm, (size_t)m->shape.D * sizeof(float));
    o->rmsnorm_bwd(o, NULL, m->acts.dnorm, dout, inp, block_norm_weight(m, w, m->shape.D), rstd,
                   rows, m->shape.D);
    tp_sp_sum_norm_grads(m->par.tp, dw, NULL, m->acts.dnorm, m->shape.D);
}

/* d (rows of D, in place): d out -> d inp of a head norm; the weight gradient now, or under B a
 * job reading d out saved in keep. datt (free once attention's backward has run) is scratch. */
static void head_norm_backward(model *m, const deferral *df, act *d, const act *inp,
                               float *const *w, float **gw, const float *rstd, int heads,
                               act *keep) {
    const ust_ops *o = m->ops;
    int rows = m->shape.B * m->shape.T * heads;
    if (df->list)
        block_later(m, df,
                    (wg_job){.kind = WG_HEADNORM,
                             .dw = gw,
                             .dout = d,
                             .x = inp,
                             .w = w,
                             .rstd = rstd,
                             .N = rows},
                    keep, (int64_t)rows * m->shape.D);
    else
        block_head_norm_wgrad(m, *gw, d, inp, *w, rstd, rows);
    o->rmsnorm_bwd(o, m->acts.datt, NULL, d, inp, block_norm_weight(m, *w, m->shape.D), rstd, rows,
                   m->shape.D);
    o->copy(o, d, m->acts.datt, act_bytes(o, (int64_t)rows * m->shape.D));
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
    moe_forward(&m->moe.ctx, ma, &m->moe.mw[l], act_at(o, m->acts.dln, off), act_at(o, a->ln2, off),
                st);
    if (!tp_sp(m->par.tp)) moe_tp_gather_rows(&m->moe.ctx, m->acts.dln);
    o->add(o, x_out, m->acts.dln, a->res2, (int64_t)m->shape.Nl * m->shape.C);
}

/* What layer l's attention masks by: its window (model.sliding_window), its documents, or none. */
static const cp_docs *layer_docs(const model *m, int l) {
    int k = cfg_window_slot(m->cfg, l);
    if (k >= 0) return &m->batch.wdocs[k];
    return m->shape.doc_mask ? &m->batch.docs : NULL;
}

/* Layer l's RoPE: model.rope_local_theta's for a windowed layer (Gemma 3's local layers) */
static const ust_rope *layer_rope(const model *m, int l) {
    if (m->shape.fam.local_rope && cfg_layer_window(m->cfg, l)) return &m->shape.fam.rope_local;
    return &m->shape.rope;
}

/* out (Nl,C) = attention(x) @ wo^T + bo, x: this rank's rows of the attention's input */
static void attention_forward(model *m, int l, const act *x, act *out, layer_acts *a) {
    const ust_ops *o = m->ops;
    const layer_w *w = &m->w.lw[l];
    int N = m->shape.B * m->shape.T, C = m->shape.C, HD = m->shape.H * m->shape.D,
        KV = m->shape.Hkv * m->shape.D;
    /* every token enters attention, for this rank's heads */
    int qkn = m->shape.qk_norm; /* q and k go through their head norms before RoPE */
    tp_col qkv[3] = {{.out = qkn ? a->qr : a->q, .w = w->wq, .b = w->bq, .OC = HD},
                     {.out = qkn ? a->kr : a->k, .w = w->wk, .b = w->bk, .OC = KV},
                     {.out = a->v, .w = w->wv, .b = w->bv, .OC = KV}};
    tp_column_fwd(m->par.tp, x, qkv, 3, N, C);
    if (qkn && m->shape.qk_whole) { /* model.qk_norm_whole: over all heads of the token */
        proj_norm_forward(m, a->q, a->q_rstd, a->qr, w->qn_w, m->shape.H);
        proj_norm_forward(m, a->k, a->k_rstd, a->kr, w->kn_w, m->shape.Hkv);
    } else if (qkn) {
        head_norm_forward(m, a->q, a->q_rstd, a->qr, w->qn_w, m->shape.H);
        head_norm_forward(m, a->k, a->k_rstd, a->kr, w->kn_w, m->shape.Hkv);
    }
    if (m->shape.llama) {
        o->rope_fwd(o, a->q, a->q, m->batch.rows, m->shape.B, m->shape.T, m->shape.H, m->shape.D,
                    layer_rope(m, l));
        o->rope_fwd(o, a->k, a->k, m->batch.rows, m->shape.B, m->shape.T, m->shape.Hkv, m->shape.D,
                    layer_rope(m, l));
    }
    cp_track_logit_max(m->par.cp, model_qk_row(m, l)); /* QK-clip's statistic, when tracked */
    cp_attention_fwd(m->par.cp, a->att, a->lse, a->q, a->k, a->v, m->shape.H, layer_docs(m, l),
                     m->shape.fam.attn_softcap);
    tp_row_linear_fwd(m->par.tp, out, a->att, w->wo, w->bo, N, HD, C);
}

/* out (Nl,C) = the dense MLP of x (this rank's rows) */
static void dense_mlp_forward(model *m, int l, const act *x, act *out, layer_acts *a) {
    const layer_w *w = &m->w.lw[l];
    int N = m->shape.B * m->shape.T, C = m->shape.C;
    /* llama: gate and up, then swiglu; gpt2: up with its GELU fused in */
    tp_col gu[2] = {{.out = a->gate, .w = w->wg, .OC = m->shape.F},
                    {.out = a->up,
                     .gelu = m->shape.llama ? NULL : a->act,
                     .w = w->wu,
                     .b = w->bu,
                     .OC = m->shape.F}};
    tp_column_fwd(m->par.tp, x, m->shape.llama ? gu : gu + 1, m->shape.llama ? 2 : 1, N, C);
    if (m->shape.llama) block_mlp_activation(m, a);
    tp_row_linear_fwd(m->par.tp, out, a->act, w->wd, w->bd, N, m->shape.F, C);
}

/* model.post_norm (OLMo 2): res2 = x + norm1(attn(x)); out = res2 + norm2(mlp(res2)). ln1 and
 * ln2 hold the sublayers' outputs, the norms' inputs. */
static void post_norm_forward(model *m, int l, const act *x_in, act *x_out, layer_acts *a) {
    const ust_ops *o = m->ops;
    const layer_w *w = &m->w.lw[l];
    int64_t n = (int64_t)m->shape.Nl * m->shape.C;
    attention_forward(m, l, x_in, a->ln1, a);
    block_norm_forward(m, a->res2, a->ln1_mean, a->ln1_rstd, a->ln1, w->ln1_w, w->ln1_b);
    o->add(o, a->res2, a->res2, x_in, n);
    dense_mlp_forward(m, l, a->res2, a->ln2, a);
    block_norm_forward(m, x_out, a->ln2_mean, a->ln2_rstd, a->ln2, w->ln2_w, w->ln2_b);
    o->add(o, x_out, x_out, a->res2, n);
}

/* x_in, x_out: (B,T,C). Pre-norm block: res2 = x + attn(norm1(x)); out = res2 + mlp(norm2(res2)) */
void block_forward(model *m, int l, const act *x_in, act *x_out, layer_acts *a, moe_acts *ma,
                   moe_stats *st) {
    const ust_ops *o = m->ops;
    const layer_w *w = &m->w.lw[l];
    int C = m->shape.C;
    if (m->shape.fam.post_norm) {
        post_norm_forward(m, l, x_in, x_out, a);
        return;
    }
    int sw = m->shape.fam.sandwich; /* model.sandwich_norm: the sublayers' outputs normed too */
    block_norm_forward(m, a->ln1, a->ln1_mean, a->ln1_rstd, x_in, w->ln1_w, w->ln1_b);
    if (is_mla(m)) /* reads ln1, writes res2 as attention_forward does */
        mla_forward(m, l, a, layer_docs(m, l));
    else
        attention_forward(m, l, a->ln1, sw ? a->att_o : a->res2, a);
    if (sw) block_norm_forward(m, a->res2, NULL, a->pn1_rstd, a->att_o, w->pn1_w, NULL);
    o->add(o, a->res2, a->res2, x_in, (int64_t)m->shape.Nl * C);
    block_norm_forward(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2_w, w->ln2_b);
    if (is_moe(m, l)) {
        moe_mlp_forward(m, l, x_out, a, ma, st);
        return;
    }
    dense_mlp_forward(m, l, a->ln2, sw ? a->mlp_o : x_out, a);
    if (sw) block_norm_forward(m, x_out, NULL, a->pn2_rstd, a->mlp_o, w->pn2_w, NULL);
    o->add(o, x_out, x_out, a->res2, (int64_t)m->shape.Nl * C);
}

/* ------------------------------------------------------------------ backward */

/* A norm's input gradient only (B of a zero-bubble schedule): the weight gradient goes to the
 * scratch and is dropped; W computes it again from the saved output gradient. */
void block_norm_backward_input(model *m, act *dinp, const act *dout, const act *inp, const float *w,
                               const float *mean, const float *rstd) {
    float *dw = m->acts.dnorm, *db = m->shape.llama ? NULL : m->acts.dnorm + m->shape.C;
    m->ops->zero(m->ops, m->acts.dnorm, 2 * (size_t)m->shape.C * sizeof(float));
    norm_backward_rows(m, dinp, dw, db, dout, inp, w, mean, rstd);
}

static void save(model *m, act *dst, const act *src, int64_t n) {
    m->ops->copy(m->ops, dst, src, act_bytes(m->ops, n));
}

/* The gradient buffer to pass to a fused backward call: none when it is deferred. */
float *block_now(const deferral *df, float *g) { return df->list ? NULL : g; }

/* Under B: appends job j, first saving its output gradient (n activations) into keep. */
void block_later(model *m, const deferral *df, wg_job j, act *keep, int64_t n) {
    if (!df->list) return;
    if (keep) {
        save(m, keep, j.dout, n);
        j.dout = keep;
    }
    wg_list *l = df->list;
    UST_ASSERT(l->n < l->cap, "more than %d deferred weight gradients", l->cap);
    l->jobs[l->n++] = j;
}

void block_later_unit(model *m, const deferral *df, wg_kind k, int unit) {
    block_later(m, df, (wg_job){.kind = k, .unit = unit}, NULL, 0);
}

/* A column-parallel group's backward (tp_column_bwd) from d of its outputs into m->acts.dln,
 * and under B the jobs W runs for it: the group's input gathered again, then each dw (+ db)
 * from its output gradient saved in keep. Returns this rank's rows of d x_mine. */
act *block_column_backward(model *m, const deferral *df, const act *x_mine, const block_col *g,
                           int n) {
    int N = m->shape.B * m->shape.T, C = m->shape.C;
    tp_col cols[BLOCK_MAX_COLS] = {{0}};
    UST_ASSERT(n <= BLOCK_MAX_COLS, "%d column-parallel linears in a group", n);
    for (int i = 0; i < n; i++)
        cols[i] = (tp_col){.out = g[i].dout,
                           .w = *g[i].w,
                           .dw = block_now(df, *g[i].dw),
                           .db = g[i].db ? block_now(df, *g[i].db) : NULL,
                           .OC = g[i].OC};
    act *dx = tp_column_bwd(m->par.tp, m->acts.dln, x_mine, cols, n, N, C);
    block_later(m, df, (wg_job){.kind = WG_GATHER, .x = x_mine}, NULL, 0);
    for (int i = 0; i < n; i++)
        block_later(m, df,
                    (wg_job){.kind = WG_LINEAR,
                             .gathered = 1,
                             .dw = g[i].dw,
                             .db = g[i].db,
                             .dout = g[i].dout,
                             .N = N,
                             .C = C,
                             .OC = g[i].OC},
                    g[i].keep, (int64_t)N * g[i].OC);
    return dx;
}

/* A row-parallel linear's backward from this rank's rows of d out (dx) to dinp (pre: gpt2's
 * GELU pre-activation, fused in: dinp is then d pre); under B its dw (+ db) is left for W, from
 * the whole output gradient saved in keep (N, C). */
static void row_backward(model *m, const deferral *df, act *dinp, const act *dx, const act *inp,
                         const act *pre, float **dw, float **db, const float *w, int Cl,
                         act *keep) {
    ust_tp *tp = m->par.tp;
    int N = m->shape.B * m->shape.T, C = m->shape.C;
    float *gw = block_now(df, *dw), *gb = block_now(df, *db);
    const act *gdx = pre ? tp_row_linear_gelu_bwd(tp, dinp, gw, gb, dx, inp, pre, w, N, Cl, C)
                         : tp_row_linear_bwd(tp, dinp, gw, gb, dx, inp, w, N, Cl, C);
    block_later(
        m, df,
        (wg_job){
            .kind = WG_LINEAR, .dw = dw, .db = db, .dout = gdx, .x = inp, .N = N, .C = Cl, .OC = C},
        keep, (int64_t)N * C);
}

/* Dense MLP, out = res2 + act(ln2 @ wu^T [, ln2 @ wg^T]) @ wd^T + bd: from d out (dx, this
 * rank's rows) to d ln2; returns this rank's rows of it. */
static act *mlp_backward(model *m, int l, const act *dx, layer_acts *a, const deferral *df,
                         const act *x) {
    const ust_ops *o = m->ops;
    const layer_w *w = &m->w.lw[l];
    layer_w *g = &m->w.lg[l];
    const layer_wsave *k = df->keep;
    int llama = m->shape.llama;
    if (m->shape.recompute == RECOMPUTE_SELECTIVE) { /* the down projection's input, for its dw */
        if (df->list)
            block_later(m, df, (wg_job){.kind = WG_ACT, .acts = a}, NULL, 0);
        else
            block_mlp_activation(m, a);
    }
    /* gpt2: gelu's backward fused in, straight to d up */
    row_backward(m, df, llama ? m->acts.dact : m->acts.dup, dx, a->act, llama ? NULL : a->up,
                 &g->wd, &g->bd, w->wd, m->shape.F, k ? k->gmlp : NULL);
    if (llama) /* (model.hidden_act gelu_tanh: GeGLU's) */
        (m->shape.fam.geglu ? o->geglu_bwd
                            : o->swiglu_bwd)(o, m->acts.dgate, m->acts.dup, m->acts.dact, a->gate,
                                             a->up, (int64_t)m->shape.B * m->shape.T * m->shape.F);
    const block_col up_gate[2] = {
        {&g->wu, &g->bu, m->acts.dup, k ? k->dup : NULL, &w->wu, m->shape.F},
        {&g->wg, NULL, m->acts.dgate, k ? k->dgate : NULL, &w->wg, m->shape.F}};
    /* the MLP's input is shared by the group: summed */
    return block_column_backward(m, df, x, up_gate, llama ? 2 : 1);
}

/* MoE MLP: each tensor-parallel rank backs up its own tokens (its rows under sp); without sp
 * the input gradient's shares are all-gathered, whole and the same on every rank. */
static act *moe_mlp_backward(model *m, int l, const act *dx, layer_acts *a, moe_acts *ma) {
    const ust_ops *o = m->ops;
    int64_t off = moe_tp_offset(m);
    moe_backward(&m->moe.ctx, ma, &m->moe.mw[l], &m->moe.mg[l], act_at(o, m->acts.dln, off),
                 act_at(o, dx, off), act_at(o, a->ln2, off), m->moe.moe_scale, 0);
    if (!tp_sp(m->par.tp)) moe_tp_gather_rows(&m->moe.ctx, m->acts.dln);
    return m->acts.dln;
}

/* dtmp = d loss / d (a norm's input), given its output gradient dout (this rank's rows); the
 * weight (and bias) gradient now, or under B a job reading dout saved in keep. */
static void norm_input_grad(model *m, const deferral *df, act *dout, const act *inp,
                            float *const *w, float **gw, float **gb, const float *mean,
                            const float *rstd, act *keep) {
    if (df->list)
        block_norm_backward_input(m, m->acts.dtmp, dout, inp, *w, mean, rstd);
    else
        block_norm_backward(m, m->acts.dtmp, *gw, *gb, dout, inp, *w, mean, rstd);
    block_later(m, df,
                (wg_job){.kind = WG_NORM,
                         .dw = gw,
                         .db = gb,
                         .dout = dout,
                         .x = inp,
                         .w = w,
                         .mean = mean,
                         .rstd = rstd},
                keep, (int64_t)m->shape.Nl * m->shape.C);
}

/* dx += d loss / d (a norm's input), given its output gradient dout (this rank's rows). */
static void norm_step_backward(model *m, const deferral *df, act *dx, act *dout, const act *inp,
                               float *const *w, float **gw, float **gb, const float *mean,
                               const float *rstd, act *keep) {
    norm_input_grad(m, df, dout, inp, w, gw, gb, mean, rstd, keep);
    m->ops->add(m->ops, dx, dx, m->acts.dtmp, (int64_t)m->shape.Nl * m->shape.C);
}
/* Attention, res2 = x_in + attn(ln1) @ wo^T + bo: from d res2 (dx) to d ln1; returns this
 * rank's rows of it. */
static act *attention_backward(model *m, int l, const act *dx, layer_acts *a, const deferral *df,
                               const act *x) {
    const ust_ops *o = m->ops;
    const layer_w *w = &m->w.lw[l];
    layer_w *g = &m->w.lg[l];
    const layer_wsave *k = df->keep;
    int N = m->shape.B * m->shape.T, HD = m->shape.H * m->shape.D, KV = m->shape.Hkv * m->shape.D;
    row_backward(m, df, m->acts.datt, dx, a->att, NULL, &g->wo, &g->bo, w->wo, HD,
                 k ? k->gatt : NULL);
    o->zero(o, m->acts.dq, act_bytes(o, (int64_t)N * HD));
    o->zero(o, m->acts.dk, act_bytes(o, (int64_t)N * KV));
    o->zero(o, m->acts.dv, act_bytes(o, (int64_t)N * KV));
    cp_attention_bwd(m->par.cp, m->acts.dq, m->acts.dk, m->acts.dv, m->acts.datt, a->att, a->lse,
                     a->q, a->k, a->v, m->shape.H, layer_docs(m, l), m->shape.fam.attn_softcap);
    if (m->shape.llama) {
        o->rope_bwd(o, m->acts.dq, m->acts.dq, m->batch.rows, m->shape.B, m->shape.T, m->shape.H,
                    m->shape.D, layer_rope(m, l));
        o->rope_bwd(o, m->acts.dk, m->acts.dk, m->batch.rows, m->shape.B, m->shape.T, m->shape.Hkv,
                    m->shape.D, layer_rope(m, l));
    }
    if (m->shape.qk_whole) {
        proj_norm_backward(m, df, m->acts.dq, a->qr, &w->qn_w, &g->qn_w, a->q_rstd, m->shape.H,
                           k ? k->dqn : NULL);
        proj_norm_backward(m, df, m->acts.dk, a->kr, &w->kn_w, &g->kn_w, a->k_rstd, m->shape.Hkv,
                           k ? k->dkn : NULL);
    } else if (m->shape.qk_norm) {
        head_norm_backward(m, df, m->acts.dq, a->qr, &w->qn_w, &g->qn_w, a->q_rstd, m->shape.H,
                           k ? k->dqn : NULL);
        head_norm_backward(m, df, m->acts.dk, a->kr, &w->kn_w, &g->kn_w, a->k_rstd, m->shape.Hkv,
                           k ? k->dkn : NULL);
    }
    const block_col qkv[3] = {{&g->wq, &g->bq, m->acts.dq, k ? k->dq : NULL, &w->wq, HD},
                              {&g->wk, &g->bk, m->acts.dk, k ? k->dk : NULL, &w->wk, KV},
                              {&g->wv, &g->bv, m->acts.dv, k ? k->dv : NULL, &w->wv, KV}};
    return block_column_backward(m, df, x, qkv, 3); /* so is attention's */
}

/* model.post_norm: the backward of post_norm_forward; dx as block_backward's. */
static void post_norm_backward(model *m, int l, const act *x_in, act *dx, layer_acts *a,
                               const deferral *df) {
    const ust_ops *o = m->ops;
    const layer_w *w = &m->w.lw[l];
    layer_w *g = &m->w.lg[l];
    const layer_wsave *k = df->keep;
    int64_t n = (int64_t)m->shape.Nl * m->shape.C;
    norm_input_grad(m, df, dx, a->ln2, &w->ln2_w, &g->ln2_w, &g->ln2_b, a->ln2_mean, a->ln2_rstd,
                    k ? k->dln2 : NULL);                                    /* dtmp = d mlp out */
    o->add(o, dx, dx, mlp_backward(m, l, m->acts.dtmp, a, df, a->res2), n); /* dx = d res2 */
    norm_input_grad(m, df, dx, a->ln1, &w->ln1_w, &g->ln1_w, &g->ln1_b, a->ln1_mean, a->ln1_rstd,
                    k ? k->dln1 : NULL); /* dtmp = d attention out */
    o->add(o, dx, dx, attention_backward(m, l, m->acts.dtmp, a, df, x_in), n); /* dx = d x_in */
}

/* dx: (B,T,C) holds d loss / d x_out on entry and d loss / d x_in on exit. */
void block_backward(model *m, int l, const act *x_in, act *dx, layer_acts *a, moe_acts *ma,
                    const deferral *df) {
    const layer_w *w = &m->w.lw[l];
    layer_w *g = &m->w.lg[l];
    const layer_wsave *k = df->keep;
    UST_ASSERT(!df->list || !is_moe(m, l), "zero-bubble B/W split of a MoE layer");
    if (m->shape.fam.post_norm) {
        post_norm_backward(m, l, x_in, dx, a, df);
        return;
    }
    /* model.sandwich_norm: through the post norm first, dtmp = d mlp_o (then d att_o); its
     * bias is llama's, none (g->ln1_b, NULL) */
    int sw = m->shape.fam.sandwich;
    if (sw)
        norm_input_grad(m, df, dx, a->mlp_o, &w->pn2_w, &g->pn2_w, &g->ln1_b, NULL, a->pn2_rstd,
                        k ? k->dpn2 : NULL);
    const act *dsub = sw ? m->acts.dtmp : dx; /* d of the sublayer's output */
    act *dln =
        is_moe(m, l) ? moe_mlp_backward(m, l, dx, a, ma) : mlp_backward(m, l, dsub, a, df, a->ln2);
    norm_step_backward(m, df, dx, dln, a->res2, &w->ln2_w, &g->ln2_w, &g->ln2_b, a->ln2_mean,
                       a->ln2_rstd, k ? k->dln2 : NULL); /* dx = d res2 */
    if (sw)
        norm_input_grad(m, df, dx, a->att_o, &w->pn1_w, &g->pn1_w, &g->ln1_b, NULL, a->pn1_rstd,
                        k ? k->dpn1 : NULL);
    dln = is_mla(m) ? mla_backward(m, l, dx, a, layer_docs(m, l), df) /* no sandwich: config */
                    : attention_backward(m, l, dsub, a, df, a->ln1);
    norm_step_backward(m, df, dx, dln, x_in, &w->ln1_w, &g->ln1_w, &g->ln1_b, a->ln1_mean,
                       a->ln1_rstd, k ? k->dln1 : NULL); /* dx = d x_in */
}
