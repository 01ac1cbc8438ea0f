/* model_mtp.c: DeepSeek-V3's multi-token prediction (model_mtp.h), llm.c style. Module k (k =
 * 0..D-1, the paper's k + 1) at position i: x_i = eh_proj [enorm(Emb(t_{i+k+1})), hnorm(h^{k-1}_i)]
 * (the halves in that order, as DeepSeek's checkpoints and their readers lay eh_proj out), h^k =
 * its block (layer n_layer + k, a pre-norm block like the main model's, MoE in a model with MoE
 * layers), and the logits of shared_head.norm(h^k) through the main model's lm_head predict
 * t_{i+k+2}. h^{-1} is the main model's last hidden state before its final norm. Each module's cross-entropy is summed over its
 * targets and weighted like the main loss's (by the main model's token count: the paper's 1/T)
 * times loss_weight / D. Shapes as in model.c; rows are this rank's (Nl, a share under sp). */
#include "model_mtp.h"

#include <stdlib.h>

#include "acts.h"
#include "error.h"
#include "model_block.h"
#include "model_moe.h"
#include "model_vocab.h"
#include "tp.h"

/* Columns [s0, s0 + w) of `rows` rows of src (pitch sp) to columns [d0, d0 + w) of dst (pitch
 * dp): the concatenation [en, hn] and its split. */
static void cols(const model *m, act *dst, int64_t dp, int64_t d0, const act *src, int64_t sp,
                 int64_t s0, int w, int64_t rows) {
    const ust_ops *o = m->ops;
    size_t as = (size_t)o->act_size;
    o->copy2d(o, act_at(o, dst, d0), (size_t)dp * as, act_at(o, src, s0), (size_t)sp * as,
              (size_t)w * as, (size_t)rows);
}

/* h^k of module k from h_prev = h^{k-1}, and its head's input lnf; a MoE block's statistics in
 * st. */
static void module_forward(model *m, mtp_acts *x, const act *emb, const act *h_prev, int k,
                           moe_stats *st) {
    const mtp_w *w = &m->mtp.w[k];
    int Nl = m->shape.Nl, C = m->shape.C;
    block_norm_forward(m, x->en, NULL, x->en_rstd, emb, w->enorm, NULL);
    block_norm_forward(m, x->hn, NULL, x->hn_rstd, h_prev, w->hnorm, NULL);
    cols(m, x->cat, 2 * C, 0, x->en, C, 0, C, Nl);
    cols(m, x->cat, 2 * C, C, x->hn, C, 0, C, Nl);
    m->ops->linear_fwd(m->ops, x->x, x->cat, w->eh, NULL, Nl, 2 * C, C);
    int l = m->shape.L + k;
    block_forward(m, l, x->x, x->h, &x->la, is_moe(m, l) ? &x->ma : NULL, st);
    block_norm_forward(m, x->lnf, NULL, x->lnf_rstd, x->h, w->norm, NULL);
}

void mtp_forward(model *m, act_slot *s, const ust_batch *b, const act *x_last, float dscale,
                 int u0) {
    const ust_ops *o = m->ops;
    int N = m->shape.B * m->shape.T, D = m->mtp.D, nu = mtp_units(m), moe = nu > 1;
    /* d loss / d logits of each module: its weight in the loss times the main model's scale */
    float scale = dscale * (float)(m->cfg->model.mtp.loss_weight / D);
    for (int k = 0; k < D; k++) {
        mtp_acts *x = &s->mtp[k];
        int u = u0 + k * nu; /* a MoE block's experts: unit u + 1 */
        moe_stats st;
        model_hook(m, u, MODEL_FWD_BEGIN);
        if (moe) model_hook(m, u + 1, MODEL_FWD_BEGIN);
        module_forward(m, x, mtp_emb(m, s->xs[0], k), k ? s->mtp[k - 1].h : x_last, k, &st);
        if (moe) {
            model_hook(m, u + 1, MODEL_FWD_END);
            model_moe_record(m, m->shape.L + k, &st, dscale);
        }
        model_hook(m, u, MODEL_FWD_END);
        o->to_device(o, m->mtp.tgt, b->mtp_targets + (int64_t)k * N, N * sizeof(int32_t));
        vocab_logits_forward(m, x->lnf, x->logits, m->mtp.losses, m->mtp.tgt, scale, u0 + D * nu);
        m->mtp.loss[k] += o->sum(o, m->mtp.losses, N);
    }
}

/* eh_proj's backward: d cat from d x (m->mtp.dx); its weight is whole on every tp rank and
 * computed from this rank's rows, so under sp the ranks' partial gradients are summed over the
 * group (as the norms' are); without sp every rank computed the same whole gradient. */
static void eh_backward(model *m, const mtp_acts *x, const mtp_w *w, mtp_w *g) {
    const ust_ops *o = m->ops;
    int Nl = m->shape.Nl, C = m->shape.C, sp = tp_sp(m->par.tp);
    int64_t n = 2 * (int64_t)C * C;
    float *dw = sp ? m->mtp.dw : g->eh;
    if (sp) o->zero(o, dw, (size_t)n * sizeof(float));
    o->linear_bwd(o, m->mtp.dcat, dw, NULL, m->mtp.dx, x->cat, w->eh, Nl, 2 * C, C, 0);
    if (!sp) return;
    tp_allreduce(m->par.tp, dw, n);
    o->axpy(o, g->eh, 1.0f, dw, n);
}

/* Module k's backward from d lnf (this rank's rows) and, but for the last module, m->mtp.dh
 * (d h^k from module k + 1): its weights' gradients, d Emb behind the residual's gradient in dy
 * and d h^{k-1} into m->mtp.dh. */
static void module_backward(model *m, mtp_acts *x, act_slot *s, const act *h_prev, const act *dlnf,
                            int k) {
    const ust_ops *o = m->ops;
    const mtp_w *w = &m->mtp.w[k];
    mtp_w *g = &m->mtp.g[k];
    int Nl = m->shape.Nl, C = m->shape.C;
    act *dx = m->mtp.dx;
    block_norm_backward(m, dx, g->norm, NULL, dlnf, x->h, w->norm, NULL, x->lnf_rstd);
    if (k < m->mtp.D - 1) o->add(o, dx, dx, m->mtp.dh, (int64_t)Nl * C);
    const deferral now = {NULL, NULL};
    int l = m->shape.L + k;
    block_backward(m, l, x->x, dx, &x->la, is_moe(m, l) ? &x->ma : NULL, &now); /* dx: d x */
    eh_backward(m, x, w, g);
    cols(m, dx, C, 0, m->mtp.dcat, 2 * C, 0, C, Nl); /* d en */
    block_norm_backward(m, mtp_emb(m, s->dy, k), g->enorm, NULL, dx, mtp_emb(m, s->xs[0], k),
                        w->enorm, NULL, x->en_rstd);
    cols(m, dx, C, 0, m->mtp.dcat, 2 * C, C, C, Nl); /* d hn */
    block_norm_backward(m, m->mtp.dh, g->hnorm, NULL, dx, h_prev, w->hnorm, NULL, x->hn_rstd);
}

void mtp_backward(model *m, act_slot *s, const act *x_last, int u0) {
    int nu = mtp_units(m), moe = nu > 1;
    for (int k = m->mtp.D - 1; k >= 0; k--) {
        mtp_acts *x = &s->mtp[k];
        /* the head: its input gradient (and, in vocabulary chunks, each chunk's weight
         * gradient between that chunk's hooks) */
        act *dlnf = vocab_logits_backward(m, x->lnf, x->logits);
        int u = u0 + k * nu; /* a MoE block's experts: unit u + 1 */
        model_hook(m, u, MODEL_BWD_BEGIN);
        if (moe) model_hook(m, u + 1, MODEL_BWD_BEGIN);
        module_backward(m, x, s, k ? s->mtp[k - 1].h : x_last, dlnf, k);
        if (moe) model_hook(m, u + 1, MODEL_BWD_END);
        model_hook(m, u, MODEL_BWD_END);
    }
}

void mtp_add_input_grad(model *m, act *dx) {
    m->ops->add(m->ops, dx, dx, m->mtp.dh, (int64_t)m->shape.Nl * m->shape.C);
}

void mtp_pass_on(model *m, act_slot *s, int nl) {
    if (!s->mtp_live || s->xs[0] == s->xs[nl]) return;
    int64_t n = (int64_t)m->mtp.D * m->shape.Nl * m->shape.C;
    m->ops->copy(m->ops, mtp_emb(m, s->xs[nl], 0), mtp_emb(m, s->xs[0], 0), act_bytes(m->ops, n));
}

void mtp_head_wgrad(model *m, act_slot *s) {
    for (int k = 0; k < m->mtp.D; k++) vocab_logits_wgrad(m, s->mtp[k].lnf, s->mtp[k].logits);
}

int model_take_mtp_losses(model *m, double *loss) {
    for (int k = 0; k < m->mtp.D; k++) {
        loss[k] = m->mtp.loss[k];
        m->mtp.loss[k] = 0;
    }
    return m->mtp.D;
}

#define A(n) ((act *)mem_alloc(a, MEM_ACTS, act_bytes(m->ops, (n))))
#define F32(n) ((float *)mem_alloc(a, MEM_ACTS, (size_t)(n) * sizeof(float)))

void mtp_alloc_slot(model *m, ust_arena *a, act_slot *s, act *shared) {
    int64_t N = (int64_t)m->shape.B * m->shape.T, Nl = m->shape.Nl, C = m->shape.C;
    s->mtp = calloc(m->mtp.D, sizeof *s->mtp);
    UST_ASSERT(s->mtp, "out of host memory");
    for (int k = 0; k < m->mtp.D; k++) {
        mtp_acts *x = &s->mtp[k];
        x->en = A(Nl * C), x->hn = A(Nl * C);
        x->en_rstd = F32(Nl), x->hn_rstd = F32(Nl), x->lnf_rstd = F32(Nl);
        x->cat = A(Nl * 2 * C);
        x->x = A(Nl * C), x->h = A(Nl * C), x->lnf = A(Nl * C);
        x->logits = A(N * m->shape.Vl);
        int moe = is_moe(m, m->shape.L + k); /* a MoE block keeps its own, not the dense MLP's */
        acts_alloc_layer(m, a, &x->la, shared, !moe);
        if (moe) acts_alloc_moe(m, a, &x->ma);
    }
}

void mtp_alloc_scratch(model *m, ust_arena *a) {
    int64_t N = (int64_t)m->shape.B * m->shape.T, Nl = m->shape.Nl, C = m->shape.C;
    m->mtp.dh = A(Nl * C);
    m->mtp.dx = A(Nl * C);
    m->mtp.dcat = A(Nl * 2 * C);
    if (tp_sp(m->par.tp)) m->mtp.dw = F32(2 * C * C);
    m->mtp.tgt = mem_alloc(a, MEM_ACTS, N * sizeof(int32_t));
    m->mtp.losses = F32(N);
}
#undef A
#undef F32
