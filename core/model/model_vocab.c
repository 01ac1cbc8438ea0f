/* model_vocab.c: the vocabulary-parallel ends of the model: the token (and position) embedding
 * and the head (final norm, lm_head, cross-entropy), forward and backward, whole or in
 * vocabulary chunks (model_storage.vocab_chunk_rows). Shapes as in model.c. */
#include "model_vocab.h"

#include "error.h"
#include "model_mtp.h"
#include "tp.h"

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

/* The embedding of tok into out over its units u (positions, gpt2) and the table's chunks;
 * returns the unit after them. Each chunk adds the tokens in its rows (m->acts.dln, free in
 * forward, is the lookup's scratch); every token is in exactly one chunk. */
static int embedding_forward_chunks(model *m, const int32_t *tok, act *out, int u) {
    int wpe = !m->shape.llama;
    if (wpe) model_hook(m, u, MODEL_FWD_BEGIN);
    act *sum = tp_embedding_begin(m->par.tp, out, tok, wpe ? m->batch.rows : NULL,
                                  wpe ? m->w.wpe : NULL, m->shape.B, m->shape.T, m->shape.C);
    if (wpe) model_hook(m, u++, MODEL_FWD_END);
    for (int k = 0; k < m->vc.nvc; k++, u++) {
        int r0, r1 = vc_range(m, k, &r0);
        model_hook(m, u, MODEL_FWD_BEGIN);
        tp_embedding_add(m->par.tp, sum, m->acts.dln, tok, m->vc.wte_c[k], r0, r1, m->shape.B,
                         m->shape.T, m->shape.C, m->shape.Vp);
        model_hook(m, u, MODEL_FWD_END);
    }
    tp_embedding_end(m->par.tp, sum, out, m->shape.B, m->shape.T, m->shape.C);
    return u;
}

/* The head's logits block by block, each chunk's unit around its own (the tied table's units
 * when the embedding is here too), then the loss over the blocks: the logits stay whole (one
 * (N, Vl) buffer, block-major), only the weights are chunked, and the softmax's log-sum-exp is
 * merged over the blocks (tp_xent_blocks). One chunk is the unchunked head exactly. */
static void head_forward_chunks(model *m, const act *lnf, act *logits, float *losses,
                                const int32_t *tgt, float dscale) {
    int N = m->shape.B * m->shape.T, r0s[MODEL_MAX_VOCAB_CHUNKS + 1];
    UST_ASSERT(m->vc.nvc <= MODEL_MAX_VOCAB_CHUNKS, "%d vocabulary chunks", m->vc.nvc);
    const act *x = tp_column_open(m->par.tp, lnf); /* the chunks are one column group */
    for (int k = 0; k < m->vc.nvc; k++) {
        int r1 = vc_range(m, k, &r0s[k]);
        r0s[k + 1] = r1;
        model_hook(m, m->vc.lm_u0 + k, MODEL_FWD_BEGIN);
        tp_column_linear_fwd(m->par.tp, vc_block(m, logits, k), x, m->vc.lm_c[k], NULL, N,
                             m->shape.C, r1 - r0s[k]);
        model_hook(m, m->vc.lm_u0 + k, MODEL_FWD_END);
    }
    if (m->vc.nvc == 1)
        tp_xent(m->par.tp, losses, logits, tgt, N, m->shape.Vp, m->shape.V, dscale,
                m->shape.fam.final_softcap);
    else
        tp_xent_blocks(m->par.tp, losses, logits, r0s, m->vc.nvc, tgt, N, m->shape.Vp, m->shape.V,
                       dscale, m->shape.fam.final_softcap, m->acts.vc_lse, m->acts.vc_merge,
                       m->acts.vc_merge2);
}

/* The head's backward: logits hold d loss / d logits (written by the fused cross-entropy);
 * returns this rank's rows of d lnf. Under B the logits stay until W reads them. */
static act *head_backward(model *m, act_slot *s, const deferral *df) {
    const block_col lm = {&m->w.g_lm, NULL, s->logits, NULL, &m->w.lm, m->shape.Vl};
    return block_column_backward(m, df, s->lnf, &lm, 1);
}

/* The head's chunks, last first, each between its unit's hooks (and marks for W): d lnf
 * (m->acts.dln, summed over the blocks) and each chunk's weight gradient. */
static void head_backward_chunks(model *m, const act *lnf, act *logits, const deferral *df,
                                 model_phase begin, model_phase end) {
    int N = m->shape.B * m->shape.T;
    const act *x = tp_column_open(m->par.tp, lnf);
    block_later(m, df, (wg_job){.kind = WG_GATHER, .x = lnf}, NULL, 0);
    for (int k = m->vc.nvc - 1; k >= 0; k--) {
        int r0, r1 = vc_range(m, k, &r0), u = m->vc.lm_u0 + k;
        act *blk = vc_block(m, logits, k);
        model_hook(m, u, begin);
        block_later_unit(m, df, WG_UNIT_BEGIN, u);
        tp_column_linear_bwd(m->par.tp, m->acts.dln, block_now(df, m->vc.g_lm_c[k]), NULL, blk, x,
                             m->vc.lm_c[k], N, m->shape.C, r1 - r0, k < m->vc.nvc - 1);
        block_later(m, df,
                    (wg_job){.kind = WG_LINEAR,
                             .gathered = 1,
                             .dw = &m->vc.g_lm_c[k],
                             .dout = blk,
                             .N = N,
                             .C = m->shape.C,
                             .OC = r1 - r0},
                    NULL, 0);
        block_later_unit(m, df, WG_UNIT_END, u);
        model_hook(m, u, end);
    }
}

/* The final norm's backward, from this rank's rows of d lnf (dln) to d x_last in dx. */
static void head_norm_backward(model *m, act_slot *s, const act *x_last, act *dx, act *dln,
                               const deferral *df) {
    if (df->list)
        block_norm_backward_input(m, dx, dln, x_last, m->w.lnf_w, s->lnf_mean, s->lnf_rstd);
    else
        block_norm_backward(m, dx, m->w.g_lnf_w, m->w.g_lnf_b, dln, x_last, m->w.lnf_w, s->lnf_mean,
                            s->lnf_rstd);
    block_later(m, df,
                (wg_job){.kind = WG_NORM,
                         .dw = &m->w.g_lnf_w,
                         .db = &m->w.g_lnf_b,
                         .dout = dln,
                         .x = x_last,
                         .w = &m->w.lnf_w,
                         .mean = s->lnf_mean,
                         .rstd = s->lnf_rstd},
                s->dlnf, (int64_t)m->shape.Nl * m->shape.C);
}

/* vc: the vocabulary chunk whose rows get their gradient (-1: the learned positions); ignored
 * without chunks (all of them). Per chunk, each row's sum runs over the same tokens in the same
 * order as the whole table's: the same bits. */
void vocab_embedding_backward(model *m, const int32_t *tok, const act *dx, int vc) {
    if (!m->vc.nvc) {
        tp_embedding_bwd(m->par.tp, m->w.g_wte, m->shape.llama ? NULL : m->w.g_wpe, dx, tok,
                         m->shape.llama ? NULL : m->batch.rows, 0, m->shape.Vl, m->shape.B,
                         m->shape.T, m->shape.C, m->shape.Vp);
        return;
    }
    int r0 = 0, r1 = 0;
    if (vc >= 0) r1 = vc_range(m, vc, &r0);
    tp_embedding_bwd(m->par.tp, vc >= 0 ? m->vc.g_wte_c[vc] : NULL, vc < 0 ? m->w.g_wpe : NULL, dx,
                     tok, vc < 0 ? m->batch.rows : NULL, r0, r1, m->shape.B, m->shape.T, m->shape.C,
                     m->shape.Vp);
}

/* model.embed_scale (Gemma): x (this rank's rows) times sqrt(C) in place, as transformers'
 * embedding output times its scale; the backward scales the gradient the same way. The product
 * is fp32, stored in the activations' type (bf16 on CUDA under train.precision bf16). */
static void embed_scale(model *m, act *x) {
    float sc = m->shape.fam.embed_scale;
    if (sc == 0) return;
    m->ops->scale_act(m->ops, x, sc, (int64_t)m->shape.Nl * m->shape.C);
}

/* model.mtp: each module's shifted tokens are looked up with the main model's (a llama: no
 * positions), so the table is used between its own units' hooks only (config_validate refuses
 * model.mtp with model.embed_scale). */
int vocab_embed_forward(model *m, act_slot *s, int u) {
    int N = m->shape.B * m->shape.T, D = s->mtp_live ? m->mtp.D : 0;
    if (m->vc.nvc) {
        int next = embedding_forward_chunks(m, s->tok, s->xs[0], u);
        for (int k = 0; k < D; k++)
            embedding_forward_chunks(m, s->mtp_tok + (int64_t)k * N, mtp_emb(m, s->xs[0], k),
                                     m->vc.wte_u0);
        embed_scale(m, s->xs[0]);
        return next;
    }
    model_hook(m, u, MODEL_FWD_BEGIN);
    tp_embedding_fwd(m->par.tp, s->xs[0], s->tok, m->shape.llama ? NULL : m->batch.rows, m->w.wte,
                     m->w.wpe, m->shape.B, m->shape.T, m->shape.C, m->shape.Vp);
    for (int k = 0; k < D; k++)
        tp_embedding_fwd(m->par.tp, mtp_emb(m, s->xs[0], k), s->mtp_tok + (int64_t)k * N, NULL,
                         m->w.wte, NULL, m->shape.B, m->shape.T, m->shape.C, m->shape.Vp);
    embed_scale(m, s->xs[0]);
    model_hook(m, u++, MODEL_FWD_END);
    return u;
}

/* The embedding's gradients of vocabulary chunk vc (as vocab_embedding_backward) from the chunk's
 * input gradient dx and, after a forward with model.mtp, each module's embedding gradient. */
void vocab_embed_grads(model *m, act_slot *s, const act *dx, int vc) {
    int N = m->shape.B * m->shape.T;
    vocab_embedding_backward(m, s->tok, dx, vc);
    for (int k = 0; s->mtp_live && (vc >= 0 || !m->vc.nvc) && k < m->mtp.D; k++)
        vocab_embedding_backward(m, s->mtp_tok + (int64_t)k * N, mtp_emb(m, s->dy, k), vc);
}

void vocab_logits_forward(model *m, const act *lnf, act *logits, float *losses, const int32_t *tgt,
                          float dscale, int u) {
    if (m->vc.nvc) {
        head_forward_chunks(m, lnf, logits, losses, tgt, dscale);
        return;
    }
    int N = m->shape.B * m->shape.T;
    model_hook(m, u, MODEL_FWD_BEGIN);
    const tp_col lm = {.out = logits, .w = m->w.lm, .OC = m->shape.Vl};
    tp_column_fwd(m->par.tp, lnf, &lm, 1, N, m->shape.C);
    tp_xent(m->par.tp, losses, logits, tgt, N, m->shape.Vp, m->shape.V, dscale,
            m->shape.fam.final_softcap);
    model_hook(m, u, MODEL_FWD_END);
}

act *vocab_logits_backward(model *m, const act *lnf, act *logits) {
    const deferral now = {NULL, NULL};
    if (m->vc.nvc) {
        head_backward_chunks(m, lnf, logits, &now, MODEL_BWD_BEGIN, MODEL_BWD_END);
        return tp_column_close_bwd(m->par.tp, m->acts.dln);
    }
    const tp_col lm = {.out = logits, .w = m->w.lm, .OC = m->shape.Vl}; /* dw later */
    return tp_column_bwd(m->par.tp, m->acts.dln, lnf, &lm, 1, m->shape.B * m->shape.T, m->shape.C);
}

void vocab_logits_wgrad(model *m, const act *lnf, const act *logits) {
    if (m->vc.nvc) return;
    tp_linear_wgrad(m->par.tp, m->w.g_lm, NULL, logits, tp_column_open(m->par.tp, lnf),
                    m->shape.B * m->shape.T, m->shape.C, m->shape.Vl);
}

double vocab_head_forward(model *m, act_slot *s, const act *x_last, int u, float dscale) {
    const ust_ops *o = m->ops;
    int N = m->shape.B * m->shape.T;
    model_hook(m, u, MODEL_FWD_BEGIN);
    block_norm_forward(m, s->lnf, s->lnf_mean, s->lnf_rstd, x_last, m->w.lnf_w, m->w.lnf_b);
    if (m->vc.nvc) {
        model_hook(m, u, MODEL_FWD_END);
        head_forward_chunks(m, s->lnf, s->logits, m->acts.losses, m->acts.tgt, dscale);
        return o->sum(o, m->acts.losses, N);
    }
    const tp_col lm = {.out = s->logits, .w = m->w.lm, .OC = m->shape.Vl};
    tp_column_fwd(m->par.tp, s->lnf, &lm, 1, N, m->shape.C);
    /* per-token losses, and dlogits (in place over logits) when training */
    tp_xent(m->par.tp, m->acts.losses, s->logits, m->acts.tgt, N, m->shape.Vp, m->shape.V, dscale,
            m->shape.fam.final_softcap);
    model_hook(m, u, MODEL_FWD_END);
    return o->sum(o, m->acts.losses, N);
}

int vocab_head_backward(model *m, act_slot *s, const act *x_last, act *dx, const deferral *df,
                        model_phase begin, model_phase end, int u) {
    if (m->vc.nvc) { /* chunks, then the final norm's unit */
        head_backward_chunks(m, s->lnf, s->logits, df, begin, end);
        if (!m->shape.tied_local) u -= m->vc.nvc;
    }
    model_hook(m, u, begin);
    block_later_unit(m, df, WG_UNIT_BEGIN, u);
    /* the chunks' column group closes here, the whole head's in head_backward */
    act *dln = m->vc.nvc ? tp_column_close_bwd(m->par.tp, m->acts.dln) : head_backward(m, s, df);
    head_norm_backward(m, s, x_last, dx, dln, df);
    /* model.mtp: the whole head's weight gradient in the head unit's one pair (under B, W's) */
    if (s->mtp_live && df->list) block_later(m, df, (wg_job){.kind = WG_MTP_HEAD}, NULL, 0);
    if (s->mtp_live && !df->list) mtp_head_wgrad(m, s);
    block_later_unit(m, df, WG_UNIT_END, u);
    model_hook(m, u--, end);
    return u;
}

void vocab_embed_backward(model *m, act_slot *s, act *dx, const deferral *df, int input_only,
                          model_phase begin, model_phase end, int u) {
    embed_scale(m, dx); /* d of the unscaled embedding (once: W's jobs read this dx) */
    /* its one unit, or the table's chunks last first and then the positions */
    for (int vc = m->vc.nvc ? m->vc.nvc - 1 : 0; vc >= (m->vc.nvc && !m->shape.llama ? -1 : 0);
         vc--, u--) {
        model_hook(m, u, begin);
        if (!input_only) vocab_embed_grads(m, s, dx, vc);
        block_later_unit(m, df, WG_UNIT_BEGIN, u);
        block_later(m, df, (wg_job){.kind = WG_EMBED, .dout = dx, .vc = vc}, NULL, 0);
        block_later_unit(m, df, WG_UNIT_END, u);
        model_hook(m, u, end);
    }
}
