/* model_mla.c: multi-head latent attention (model_mla.h), llm.c style: the forward keeps what
 * the backward needs (mla_acts), the backward mirrors it in reverse. Shapes: N tokens of this
 * rank (all B*T; the tp halves see every row), H this rank's heads, D = qk_nope + qk_rope (the
 * attention op's head width), Rq = q_lora_rank, Rkv = kv_lora_rank, R = qk_rope_head_dim, Dv =
 * v_head_dim, W = qk_nope + Dv (one head's rows of kv_b_proj). As transformers'
 * DeepseekV3Attention, with its rope in rotate-half order (interleaved checkpoints are permuted
 * on import: hf_map.c). */
#include "model_mla.h"

#include <math.h>

#include "cp.h"
#include "error.h"
#include "tp.h"

/* q_a_layernorm and kv_a_layernorm: transformers' DeepseekV3RMSNorm default epsilon (the
 * checkpoints' rms_norm_eps applies to the residual norms only) */
#define MLA_LATENT_EPS 1e-6f

typedef struct {
    int N, H, D, C, Rq, Rkv, R, nope, Dv, W;
} mla_dims;

static mla_dims dims_of(const model *m) {
    const __typeof__(m->cfg->model.mla) *c = &m->cfg->model.mla;
    return (mla_dims){.N = m->shape.B * m->shape.T,
                      .H = m->shape.H,
                      .D = m->shape.D,
                      .C = m->shape.C,
                      .Rq = c->q_lora_rank,
                      .Rkv = c->kv_lora_rank,
                      .R = c->qk_rope_head_dim,
                      .nope = c->qk_nope_head_dim,
                      .Dv = c->v_head_dim,
                      .W = c->qk_nope_head_dim + c->v_head_dim};
}

/* Columns [s0, s0 + w) of `rows` rows of src (pitch sp elements) to columns [d0, d0 + w) of dst
 * (pitch dp): how heads are cut apart and put together without a kernel of their own. */
static void cols(const model *m, act *dst, int64_t dp, int64_t d0, const act *src, int64_t sp,
                 int64_t s0, int w, int64_t rows) {
    const ust_ops *o = m->ops;
    size_t as = (size_t)o->act_size;
    o->copy2d(o, act_at(o, dst, d0), (size_t)dp * as, act_at(o, src, s0), (size_t)sp * as,
              (size_t)w * as, (size_t)rows);
}

/* YaRN's softmax scale (model.mla.mscale_all_dim, transformers' yarn_apply_mscale): the logits
 * of every q/k feature times m^2, applied to q after RoPE (fp32 activations: cfg_validate). */
static float softmax_mscale(const model *m) {
    double a = m->cfg->model.mla.mscale_all_dim, f = m->cfg->model.rope_scaling.factor;
    if (!a || f <= 1) return 1.0f;
    double s = 0.1 * a * log(f) + 1.0;
    return (float)(s * s);
}

static void scale_q(model *m, act *q, const mla_dims *d) {
    float s = softmax_mscale(m);
    if (s != 1.0f) m->ops->scale(m->ops, (float *)q, s, (int64_t)d->N * d->H * d->D);
}

/* RoPE (or, bwd, its transpose) on the last R features of each of q's H heads: gathered into
 * the scratch, rotated as (B,T,H,R), put back. */
static void rope_q(model *m, act *q, const mla_dims *d, int bwd) {
    const ust_ops *o = m->ops;
    act *r = m->acts.mla_rope;
    cols(m, r, d->R, 0, q, d->D, d->nope, d->R, (int64_t)d->N * d->H);
    if (bwd)
        o->rope_bwd(o, r, r, m->batch.rows, m->shape.B, m->shape.T, d->H, d->R, &m->shape.rope);
    else
        o->rope_fwd(o, r, r, m->batch.rows, m->shape.B, m->shape.T, d->H, d->R, &m->shape.rope);
    cols(m, q, d->D, d->nope, r, d->R, 0, d->R, (int64_t)d->N * d->H);
}

/* k (N,H,D) = [k_nope of each head, the one rope key]; v (N,H,D) = [v of each head, zeros]:
 * the latent's expansion kvb (N,H,W) and krope (N,R) laid out as the attention op takes them. */
static void expand_kv(model *m, act *k, act *v, const act *kvb, const act *krope,
                      const mla_dims *d) {
    int64_t NH = (int64_t)d->N * d->H, HD = (int64_t)d->H * d->D;
    cols(m, k, d->D, 0, kvb, d->W, 0, d->nope, NH);
    for (int h = 0; h < d->H; h++) /* shared: every head reads the same key */
        cols(m, k, HD, (int64_t)h * d->D + d->nope, krope, d->R, 0, d->R, d->N);
    if (d->Dv < d->D) m->ops->zero(m->ops, v, act_bytes(m->ops, (int64_t)d->N * HD));
    cols(m, v, d->D, 0, kvb, d->W, d->nope, d->Dv, NH);
}

/* The heads' rope-key gradients summed into dst (N,R) (the key is shared: its gradient is the
 * sum of every head's), dst += them. */
static void head_add(model *m, act *dst, const act *dk, const mla_dims *d) {
    act *tmp = m->acts.mla_rope;
    int64_t HD = (int64_t)d->H * d->D, NR = (int64_t)d->N * d->R;
    for (int h = 0; h < d->H; h++) {
        cols(m, tmp, d->R, 0, dk, HD, (int64_t)h * d->D + d->nope, d->R, d->N);
        m->ops->add(m->ops, dst, dst, tmp, NR);
    }
}

/* The latent ring under context parallelism (cp.h cp_expander; why: parallel/cp.c's latent
 * ring, docs/deepseek.md): a block travels as [RMSNorm(c_kv) (N,Rkv) | rotated k_rope (N,R)],
 * the two parts one after the other, and every rank expands a remote block through its own
 * heads' rows of kv_b_proj, as the owner did its own. */
typedef struct {
    model *m;
    int l;
    mla_dims d;
} mla_ring;

static void ring_expand(void *ctx, act *k, act *v, const act *lat) {
    const mla_ring *r = ctx;
    model *m = r->m;
    const mla_dims *d = &r->d;
    m->ops->linear_fwd(m->ops, m->acts.mla_kvb, lat, m->w.lw[r->l].wkvb, NULL, d->N, d->Rkv,
                       d->H * d->W);
    expand_kv(m, k, v, m->acts.mla_kvb, act_at(m->ops, lat, (int64_t)d->N * d->Rkv), d);
}

/* dlat += the remote block's latent gradient: d c_kv through kv_b_proj's transpose (this
 * rank's heads' share; under tp the owner's latent backward sums the shares as for its own),
 * d k_rope summed over the heads; kv_b_proj's weight gradient takes the block's share here. */
static void ring_contract(void *ctx, act *dlat, const act *dk, const act *dv, const act *lat) {
    const mla_ring *r = ctx;
    model *m = r->m;
    const ust_ops *o = m->ops;
    const mla_dims *d = &r->d;
    int64_t NH = (int64_t)d->N * d->H;
    act *dkvb = m->acts.mla_kvb;
    cols(m, dkvb, d->W, 0, dk, d->D, 0, d->nope, NH);
    cols(m, dkvb, d->W, d->nope, dv, d->D, 0, d->Dv, NH);
    o->linear_bwd(o, dlat, m->w.lg[r->l].wkvb, NULL, dkvb, lat, m->w.lw[r->l].wkvb, d->N, d->Rkv,
                  d->H * d->W, 1);
    head_add(m, act_at(o, dlat, (int64_t)d->N * d->Rkv), dk, d);
}

/* This rank's latent packed where the ring sends it from; the expander over layer l. */
static cp_expander ring_of(model *m, mla_ring *r, int l, const mla_acts *x, const mla_dims *d) {
    const ust_ops *o = m->ops;
    act *mine = cp_latent_mine(m->par.cp);
    *r = (mla_ring){.m = m, .l = l, .d = *d};
    o->copy(o, mine, x->ckvn, act_bytes(o, (int64_t)d->N * d->Rkv));
    o->copy(o, act_at(o, mine, (int64_t)d->N * d->Rkv), x->krope,
            act_bytes(o, (int64_t)d->N * d->R));
    return (cp_expander){.ctx = r, .expand = ring_expand, .contract = ring_contract};
}

void mla_forward(model *m, int l, layer_acts *a, const cp_docs *docs) {
    const ust_ops *o = m->ops;
    const layer_w *w = &m->w.lw[l];
    mla_dims d = dims_of(m);
    mla_acts *x = &a->mla;
    int N = d.N, HD = d.H * d.D;
    /* what reads ln1: the down-projections (whole on every tp rank), or q itself (its heads) */
    tp_col in[3] = {
        {.out = d.Rq ? x->qa : a->q, .w = d.Rq ? w->wqa : w->wq, .OC = d.Rq ? d.Rq : HD},
        {.out = x->ckv, .w = w->wkva, .OC = d.Rkv},
        {.out = x->krope, .w = w->wkva + (int64_t)d.Rkv * d.C, .OC = d.R}};
    tp_column_fwd(m->par.tp, a->ln1, in, 3, N, d.C);
    if (d.Rq) {
        o->rmsnorm_fwd(o, x->qan, x->qa_rstd, x->qa, w->qa_norm, N, d.Rq, MLA_LATENT_EPS);
        o->linear_fwd(o, a->q, x->qan, w->wqb, NULL, N, d.Rq, HD);
    }
    o->rmsnorm_fwd(o, x->ckvn, x->kv_rstd, x->ckv, w->kva_norm, N, d.Rkv, MLA_LATENT_EPS);
    o->linear_fwd(o, m->acts.mla_kvb, x->ckvn, w->wkvb, NULL, N, d.Rkv, d.H * d.W);
    rope_q(m, a->q, &d, 0);
    scale_q(m, a->q, &d);
    o->rope_fwd(o, x->krope, x->krope, m->batch.rows, m->shape.B, m->shape.T, 1, d.R,
                &m->shape.rope);
    expand_kv(m, a->k, a->v, m->acts.mla_kvb, x->krope, &d);
    cp_track_logit_max(m->par.cp, model_qk_row(m, l)); /* the stats' logits, when tracked */
    if (cp_latent(m->par.cp)) {
        mla_ring r;
        cp_expander ex = ring_of(m, &r, l, x, &d);
        cp_latent_fwd(m->par.cp, a->att, a->lse, a->q, a->k, a->v, d.H, docs, &ex,
                      m->shape.fam.attn_softcap);
    } else {
        cp_attention_fwd(m->par.cp, a->att, a->lse, a->q, a->k, a->v, d.H, docs,
                         m->shape.fam.attn_softcap);
    }
    if (d.Dv < d.D) cols(m, x->attv, d.Dv, 0, a->att, d.D, 0, d.Dv, (int64_t)N * d.H);
    tp_row_linear_fwd(m->par.tp, a->res2, x->attv, w->wo, NULL, N, d.H * d.Dv, d.C);
}

/* Where the tp-replicated tensors' gradients go: under tp each rank's heads give a partial
 * sum, gathered in the fp32 scratch (wkva, kva_norm, wqa, qa_norm) and summed over the group
 * at the end; alone, straight into the gradients. */
typedef struct {
    float *wkva, *kva_norm, *wqa, *qa_norm;
    int64_t n;
} mla_rep;

static mla_rep rep_grads(model *m, layer_w *g, const mla_dims *d) {
    if (tp_size(m->par.tp) == 1) return (mla_rep){g->wkva, g->kva_norm, g->wqa, g->qa_norm, 0};
    float *s = m->acts.mla_dw;
    int64_t kv = (int64_t)(d->Rkv + d->R) * d->C, q = (int64_t)d->Rq * d->C;
    mla_rep r = {s, s + kv, s + kv + d->Rkv, s + kv + d->Rkv + q, kv + d->Rkv + q + d->Rq};
    m->ops->zero(m->ops, s, (size_t)r.n * sizeof(float));
    return r;
}

static void rep_sum(model *m, layer_w *g, const mla_rep *r, const mla_dims *d) {
    if (!r->n) return;
    const ust_ops *o = m->ops;
    tp_allreduce(m->par.tp, r->wkva, r->n);
    o->axpy(o, g->wkva, 1.0f, r->wkva, (int64_t)(d->Rkv + d->R) * d->C);
    o->axpy(o, g->kva_norm, 1.0f, r->kva_norm, d->Rkv);
    if (!d->Rq) return;
    o->axpy(o, g->wqa, 1.0f, r->wqa, (int64_t)d->Rq * d->C);
    o->axpy(o, g->qa_norm, 1.0f, r->qa_norm, d->Rq);
}

/* Zero-bubble's W under tp: BEGIN (l < 0) zeroes the scratch its jobs add the tp-replicated
 * tensors' gradients into (m->acts.mla_rep); END sums them over the group into layer l's. */
void mla_wgrad_rep(model *m, int l) {
    mla_dims d = dims_of(m);
    float *s = m->acts.mla_rep[0];
    int64_t kv = (int64_t)(d.Rkv + d.R) * d.C, q = (int64_t)d.Rq * d.C;
    mla_rep r = {s, s + kv, s + kv + d.Rkv, s + kv + d.Rkv + q, kv + d.Rkv + q + d.Rq};
    if (l < 0)
        m->ops->zero(m->ops, s, (size_t)r.n * sizeof(float));
    else
        rep_sum(m, &m->w.lg[l], &r, &d);
}

/* d krope (N,R) = the sum over heads of d k's rope parts (plus the other cp ranks' sums from
 * the latent ring, remote: NULL when none), then RoPE's transpose. */
static void shared_key_backward(model *m, const act *dk, const act *remote, const mla_dims *d) {
    const ust_ops *o = m->ops;
    act *dkr = m->acts.mla_dkr;
    size_t nb = act_bytes(o, (int64_t)d->N * d->R);
    if (remote)
        o->copy(o, dkr, remote, nb);
    else
        o->zero(o, dkr, nb);
    head_add(m, dkr, dk, d);
    o->rope_bwd(o, dkr, dkr, m->batch.rows, m->shape.B, m->shape.T, 1, d->R, &m->shape.rope);
}

/* Under zero-bubble's B (df->list): where W adds a tp-replicated tensor's gradient, the layer's
 * own (tp 1) or the scratch part i that WG_REP_END sums over the group. */
static float **rep_target(model *m, float **own, int i) {
    return tp_size(m->par.tp) == 1 ? own : &m->acts.mla_rep[i];
}

/* Under B: a local linear's W job (dw += dout^T x, dout (N, OC) kept), a latent norm's. */
static void later_linear(model *m, const deferral *df, float **dw, const act *dout, const act *x,
                         int C, int OC, act *keep) {
    int N = m->shape.B * m->shape.T;
    block_later(
        m, df,
        (wg_job){.kind = WG_LINEAR, .dw = dw, .dout = dout, .x = x, .N = N, .C = C, .OC = OC}, keep,
        (int64_t)N * OC);
}

static void later_norm(model *m, const deferral *df, float **dw, const act *dout, const act *x,
                       float *const *w, const float *rstd, int C, act *keep) {
    int N = m->shape.B * m->shape.T;
    block_later(m, df,
                (wg_job){.kind = WG_LATNORM,
                         .dw = dw,
                         .dout = dout,
                         .x = x,
                         .w = w,
                         .rstd = rstd,
                         .N = N,
                         .C = C},
                keep, (int64_t)N * C);
}

/* Under B: the down-projections' W jobs (one column group from ln1, gathered again): q's (or
 * q_a_proj's) linear, and kv_a_proj_with_mqa's as one linear over its Rkv + R rows, the output
 * gradients of the latent and the rope key side by side in keep. */
static void later_down(model *m, const deferral *df, const layer_acts *a, layer_w *g, const act *dq,
                       const act *dckv, const mla_dims *d) {
    const layer_wsave *k = df->keep;
    int N = d->N, OCq = d->Rq ? d->Rq : d->H * d->D;
    block_later(m, df, (wg_job){.kind = WG_GATHER, .x = a->ln1}, NULL, 0);
    block_later(m, df,
                (wg_job){.kind = WG_LINEAR,
                         .gathered = 1,
                         .dw = d->Rq ? rep_target(m, &g->wqa, 2) : &g->wq,
                         .dout = dq,
                         .N = N,
                         .C = d->C,
                         .OC = OCq},
                k->mla_qa, (int64_t)N * OCq);
    cols(m, k->mla_kva, d->Rkv + d->R, 0, dckv, d->Rkv, 0, d->Rkv, N);
    cols(m, k->mla_kva, d->Rkv + d->R, d->Rkv, m->acts.mla_dkr, d->R, 0, d->R, N);
    block_later(m, df,
                (wg_job){.kind = WG_LINEAR,
                         .gathered = 1,
                         .dw = rep_target(m, &g->wkva, 0),
                         .dout = k->mla_kva,
                         .N = N,
                         .C = d->C,
                         .OC = d->Rkv + d->R},
                NULL, 0);
}

/* The latents' backward from d kvb (m->acts.mla_kvb) and d q: kv_b_proj and kv_a_layernorm,
 * then q_b_proj and q_a_layernorm, into the down-projections' output gradients (mla_d2: d c_kv,
 * then d q_a); under B their weight gradients are W's jobs. */
static void latents_backward(model *m, int l, const layer_acts *a, const act *dq, const act *dlat,
                             const mla_rep *rep, const deferral *df, const mla_dims *d) {
    const ust_ops *o = m->ops;
    const layer_w *w = &m->w.lw[l];
    layer_w *g = &m->w.lg[l];
    const layer_wsave *k = df->keep;
    const mla_acts *x = &a->mla;
    int N = d->N, HD = d->H * d->D;
    act *d1 = m->acts.mla_d1, *dckv = m->acts.mla_d2,
        *dqa = act_at(o, m->acts.mla_d2, (int64_t)N * d->Rkv);
    o->linear_bwd(o, d1, block_now(df, g->wkvb), NULL, m->acts.mla_kvb, x->ckvn, w->wkvb, N, d->Rkv,
                  d->H * d->W, 0);
    if (dlat) o->add(o, d1, d1, dlat, (int64_t)N * d->Rkv); /* the other cp ranks' d c_kv */
    later_linear(m, df, &g->wkvb, m->acts.mla_kvb, x->ckvn, d->Rkv, d->H * d->W,
                 k ? k->mla_kvb : NULL);
    o->rmsnorm_bwd(o, dckv, block_now(df, rep->kva_norm), d1, x->ckv, w->kva_norm, x->kv_rstd, N,
                   d->Rkv);
    later_norm(m, df, rep_target(m, &g->kva_norm, 1), d1, x->ckv, &w->kva_norm, x->kv_rstd, d->Rkv,
               k ? k->mla_kvn : NULL);
    if (!d->Rq) return;
    o->linear_bwd(o, d1, block_now(df, g->wqb), NULL, dq, x->qan, w->wqb, N, d->Rq, HD, 0);
    later_linear(m, df, &g->wqb, dq, x->qan, d->Rq, HD, k ? k->mla_qb : NULL);
    o->rmsnorm_bwd(o, dqa, block_now(df, rep->qa_norm), d1, x->qa, w->qa_norm, x->qa_rstd, N,
                   d->Rq);
    later_norm(m, df, rep_target(m, &g->qa_norm, 3), d1, x->qa, &w->qa_norm, x->qa_rstd, d->Rq,
               k ? k->mla_qan : NULL);
}

act *mla_backward(model *m, int l, const act *dx, layer_acts *a, const cp_docs *docs,
                  const deferral *df) {
    const ust_ops *o = m->ops;
    const layer_w *w = &m->w.lw[l];
    layer_w *g = &m->w.lg[l];
    mla_dims d = dims_of(m);
    mla_acts *x = &a->mla;
    int N = d.N, HD = d.H * d.D, tp = tp_size(m->par.tp);
    int64_t NH = (int64_t)N * d.H;
    act *datt = m->acts.datt, *dattv = d.Dv < d.D ? m->acts.mla_dattv : datt;
    const act *gdx = tp_row_linear_bwd(m->par.tp, dattv, block_now(df, g->wo), NULL, dx, x->attv,
                                       w->wo, N, d.H * d.Dv, d.C);
    block_later(m, df,
                (wg_job){.kind = WG_LINEAR,
                         .dw = &g->wo,
                         .dout = gdx,
                         .x = x->attv,
                         .N = N,
                         .C = d.H * d.Dv,
                         .OC = d.C},
                df->keep ? df->keep->gatt : NULL, (int64_t)N * d.C);
    if (d.Dv < d.D) { /* v's padding gets no gradient */
        o->zero(o, datt, act_bytes(o, (int64_t)N * HD));
        cols(m, datt, d.D, 0, dattv, d.Dv, 0, d.Dv, NH);
    }
    act *dq = m->acts.dq, *dk = m->acts.dk, *dv = m->acts.dv, *dkvb = m->acts.mla_kvb;
    o->zero(o, dq, act_bytes(o, (int64_t)N * HD));
    o->zero(o, dk, act_bytes(o, (int64_t)N * HD));
    o->zero(o, dv, act_bytes(o, (int64_t)N * HD));
    const act *dlat = NULL; /* the latent ring: what the other ranks' queries give our latent */
    if (cp_latent(m->par.cp)) {
        UST_ASSERT(!df->list, "the latent ring under a deferred weight gradient (cfg_cp_latent)");
        mla_ring r;
        cp_expander ex = ring_of(m, &r, l, x, &d);
        dlat = cp_latent_bwd(m->par.cp, dq, dk, dv, datt, a->att, a->lse, a->q, a->k, a->v, d.H,
                             docs, &ex, m->shape.fam.attn_softcap);
    } else {
        cp_attention_bwd(m->par.cp, dq, dk, dv, datt, a->att, a->lse, a->q, a->k, a->v, d.H, docs,
                         m->shape.fam.attn_softcap);
    }
    cols(m, dkvb, d.W, 0, dk, d.D, 0, d.nope, NH);
    cols(m, dkvb, d.W, d.nope, dv, d.D, 0, d.Dv, NH);
    shared_key_backward(m, dk, dlat ? act_at(o, dlat, (int64_t)N * d.Rkv) : NULL, &d);
    scale_q(m, dq, &d);
    rope_q(m, dq, &d, 1);
    mla_rep rep = rep_grads(m, g, &d);
    if (df->list && tp > 1) block_later(m, df, (wg_job){.kind = WG_REP_BEGIN}, NULL, 0);
    /* under tp the latents' gradients are this rank's heads' share, summed where they leave
     * (tp_column_bwd) */
    latents_backward(m, l, a, dq, dlat, &rep, df, &d);
    act *dckv = m->acts.mla_d2, *dqa = act_at(o, m->acts.mla_d2, (int64_t)N * d.Rkv);
    tp_col in[3] = {{.out = d.Rq ? dqa : dq,
                     .w = d.Rq ? w->wqa : w->wq,
                     .dw = block_now(df, d.Rq ? rep.wqa : g->wq),
                     .OC = d.Rq ? d.Rq : HD},
                    {.out = dckv, .w = w->wkva, .dw = block_now(df, rep.wkva), .OC = d.Rkv},
                    {.out = m->acts.mla_dkr,
                     .w = w->wkva + (int64_t)d.Rkv * d.C,
                     .dw = df->list ? NULL : rep.wkva + (int64_t)d.Rkv * d.C,
                     .OC = d.R}};
    if (df->list) later_down(m, df, a, g, d.Rq ? dqa : dq, dckv, &d);
    act *dln = tp_column_bwd(m->par.tp, m->acts.dln, a->ln1, in, 3, N, d.C);
    if (df->list && tp > 1)
        block_later(m, df, (wg_job){.kind = WG_REP_END, .unit = l}, NULL, 0);
    else if (!df->list)
        rep_sum(m, g, &rep, &d);
    return dln;
}

#define A(n) ((act *)mem_alloc(a, MEM_ACTS, act_bytes(m->ops, (n))))
#define F32(n) ((float *)mem_alloc(a, MEM_ACTS, (size_t)(n) * sizeof(float)))

void mla_alloc_layer(model *m, ust_arena *a, layer_acts *x) {
    mla_dims d = dims_of(m);
    int64_t N = d.N;
    if (d.Rq) {
        x->mla.qa = A(N * d.Rq);
        x->mla.qan = A(N * d.Rq);
        x->mla.qa_rstd = F32(N);
    }
    x->mla.ckv = A(N * d.Rkv);
    x->mla.ckvn = A(N * d.Rkv);
    x->mla.kv_rstd = F32(N);
    x->mla.krope = A(N * d.R);
    x->mla.attv = d.Dv < d.D ? A(N * d.H * d.Dv) : x->att;
}

void mla_alloc_scratch(model *m, ust_arena *a) {
    mla_dims d = dims_of(m);
    int64_t N = d.N, wide = d.Rq > d.Rkv ? d.Rq : d.Rkv;
    m->acts.mla_kvb = A(N * d.H * d.W);
    m->acts.mla_rope = A(N * d.H * d.R);
    m->acts.mla_dkr = A(N * d.R);
    m->acts.mla_d1 = A(N * wide);
    m->acts.mla_d2 = A(N * (d.Rkv + d.Rq));
    if (d.Dv < d.D) m->acts.mla_dattv = A(N * d.H * d.Dv);
    if (tp_size(m->par.tp) > 1) {
        int64_t kv = (int64_t)(d.Rkv + d.R) * d.C, q = (int64_t)d.Rq * d.C;
        float *s = m->acts.mla_dw = F32(kv + q + d.Rkv + d.Rq);
        m->acts.mla_rep[0] = s, m->acts.mla_rep[1] = s + kv;
        m->acts.mla_rep[2] = s + kv + d.Rkv, m->acts.mla_rep[3] = s + kv + d.Rkv + q;
    }
}

void mla_alloc_wsave(model *m, ust_arena *a, layer_wsave *w) {
    mla_dims d = dims_of(m);
    int64_t N = d.N, HD = (int64_t)d.H * d.D;
    w->mla_kvb = A(N * d.H * d.W);
    w->mla_kvn = A(N * d.Rkv);
    w->mla_kva = A(N * (d.Rkv + d.R));
    w->mla_qa = A(N * (d.Rq ? d.Rq : HD));
    if (!d.Rq) return;
    w->mla_qb = A(N * HD);
    w->mla_qan = A(N * d.Rq);
}
#undef A
#undef F32
