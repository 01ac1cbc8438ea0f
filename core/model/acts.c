/* acts.c: what the model keeps between a forward and its backward: each layer's saved
 * activations (as train.recompute allows), zero-bubble's saved output gradients, and the
 * activation sets of every chunk (one per micro-batch in flight through it, as many as the
 * pipeline's schedule asked for), plus the backward's scratch. Shapes as in model.c. */
#include "acts.h"
#include "model_mla.h"
#include "model_mtp.h"
#include "model_state.h"

#include <stdlib.h>

/* ------------------------------------------------------------------ activations */

/* activations (the backend's act_size each) and fp32 statistics, under the owner that
 * mem_label last named: the memory map's rows, one per kind of buffer (acts.layer.attn, ...) */
#define OWNER(name) mem_label(a, MEM_ACTS, name)
#define A(n) ((act *)mem_alloc(a, MEM_ACTS, act_bytes(m->ops, n)))
#define F32(n) ((float *)mem_alloc(a, MEM_ACTS, (size_t)(n) * sizeof(float)))

/* mlp: the dense MLP's buffers too (a MoE layer keeps its own in moe_acts) */
void acts_alloc_layer(model *m, ust_arena *a, layer_acts *x, act *shared_act, int mlp) {
    int64_t N = (int64_t)m->shape.B * m->shape.T, C = m->shape.C, HD = m->shape.H * m->shape.D,
            KV = m->shape.Hkv * m->shape.D, F = m->shape.F;
    int64_t Nl = m->shape.Nl;
    const char *caller = OWNER("acts.layer.attn");
    x->ln1 = A(Nl * C);
    x->ln1_mean = F32(Nl);
    x->ln1_rstd = F32(Nl);
    x->q = A(N * HD);
    x->k = A(N * KV);
    x->v = A(N * KV);
    x->att = A(N * HD);
    if (m->shape.qk_norm) {
        x->qr = A(N * HD);
        x->kr = A(N * KV);
        x->q_rstd = F32(N * m->shape.H);
        x->k_rstd = F32(N * m->shape.Hkv);
    }
    if (is_mla(m)) mla_alloc_layer(m, a, x);
    x->lse = F32((int64_t)m->shape.B * m->shape.H * m->shape.T);
    OWNER("acts.layer.mlp");
    x->res2 = A(Nl * C);
    x->ln2 = A(Nl * C);
    x->ln2_mean = F32(Nl);
    x->ln2_rstd = F32(Nl);
    if (m->shape.fam.sandwich) {
        x->att_o = A(Nl * C);
        x->mlp_o = A(Nl * C);
        x->pn1_rstd = F32(Nl);
        x->pn2_rstd = F32(Nl);
    }
    if (mlp) {
        x->gate = m->shape.llama ? A(N * F) : NULL;
        x->up = A(N * F);
        x->act = m->shape.recompute == RECOMPUTE_SELECTIVE ? shared_act : A(N * F);
    }
    OWNER(caller);
}

/* A MoE layer's saved routing and expert activations. A counting arena (the memory plan's
 * model has no MoE context) counts what moe_acts_init carves, sized beside it. */
void acts_alloc_moe(model *m, ust_arena *a, moe_acts *ma) {
    const char *caller = OWNER("acts.layer.moe");
    if (mem_counting(a))
        mem_alloc(a, MEM_ACTS, moe_acts_bytes(m->cfg, m->shape.B * m->shape.T, m->moe.ep_size));
    else
        moe_acts_init(&m->moe.ctx, ma, a);
    OWNER(caller);
}

static void alloc_wsave(model *m, ust_arena *a, layer_wsave *w) {
    int64_t N = (int64_t)m->shape.B * m->shape.T, C = m->shape.C, HD = m->shape.H * m->shape.D,
            KV = m->shape.Hkv * m->shape.D, F = m->shape.F;
    const char *caller = OWNER("acts.layer.zb_grads");
    w->gmlp = A(N * C);
    w->dup = A(N * F);
    w->dgate = m->shape.llama ? A(N * F) : NULL;
    w->dln2 = A((int64_t)m->shape.Nl * C);
    w->gatt = A(N * C);
    w->dq = A(N * HD);
    w->dk = A(N * KV);
    w->dv = A(N * KV);
    w->dln1 = A((int64_t)m->shape.Nl * C);
    if (m->shape.qk_norm) {
        w->dqn = A(N * HD);
        w->dkn = A(N * KV);
    }
    if (m->shape.fam.sandwich) {
        w->dpn1 = A((int64_t)m->shape.Nl * C);
        w->dpn2 = A((int64_t)m->shape.Nl * C);
    }
    if (is_mla(m)) mla_alloc_wsave(m, a, w);
    OWNER(caller);
}

/* model.norm_offset: the ones 1 + w is made from (block_norm_weight), set once here */
static void alloc_norm_offset(model *m, ust_arena *a) {
    int64_t n = m->shape.C > m->shape.D ? m->shape.C : m->shape.D;
    m->acts.noff.ones = F32(n);
    m->acts.noff.wone = F32(n);
    if (!m->acts.noff.ones) return; /* a counting arena */
    float *h = malloc((size_t)n * sizeof(float));
    UST_ASSERT(h, "out of host memory");
    for (int64_t i = 0; i < n; i++) h[i] = 1.0f;
    m->ops->to_device(m->ops, m->acts.noff.ones, h, (size_t)n * sizeof(float));
    free(h);
}

/* none: every layer keeps its activations; selective: the MLP activation output is recomputed
 * in backward, so one shared buffer (a MoE layer's experts: moe_acts_init leaves theirs out);
 * full: only the layer inputs are kept, one scratch set. */
static void alloc_slot(model *m, ust_arena *a, const model_chunk *ch, act_slot *s, act *shared) {
    int64_t N = (int64_t)m->shape.B * m->shape.T, C = m->shape.C, Nl = m->shape.Nl,
            nl = ch->hi - ch->lo;
    s->xs = calloc(nl + 1, sizeof *s->xs);
    OWNER("acts.slot.residual");
    for (int i = 0; i <= nl; i++) /* the boundaries carry model.mtp's embeddings behind */
        s->xs[i] = A(i == 0 || i == nl ? model_boundary_numel(m) : Nl * C);
    if (m->shape.recompute != RECOMPUTE_FULL) {
        s->la = calloc(nl, sizeof *s->la);
        for (int i = 0; i < nl; i++)
            acts_alloc_layer(m, a, &s->la[i], shared, !is_moe(m, ch->lo + i));
    }
    if (m->moe.has_moe &&
        m->shape.recompute != RECOMPUTE_FULL) { /* full: the shared m->acts.moe_scratch */
        s->ma = calloc(nl, sizeof *s->ma);
        for (int i = 0; i < nl; i++)
            if (is_moe(m, ch->lo + i)) acts_alloc_moe(m, a, &s->ma[i]);
    }
    if (m->shape.zb) {
        s->ws = calloc(nl, sizeof *s->ws);
        for (int i = 0; i < nl; i++) alloc_wsave(m, a, &s->ws[i]);
        /* per layer: two unit marks, an activation, two gathers, seven linears, four norms
         * (model.mla: two gathers, eight linears, four norms, two scratch marks;
         * model.sandwich_norm: two more norms); the head: marks, a gather, a linear, a norm; the
         * embeddings: marks and a job */
        s->wg.cap = (22 + 2 * m->shape.fam.sandwich) * nl + 16 +
                    4 * (2 * m->vc.nvc + 1); /* + vocabulary chunks' marks, jobs */
        s->wg.jobs = calloc((size_t)s->wg.cap, sizeof *s->wg.jobs);
    }
    if (ch->head) {
        OWNER("acts.slot.head");
        s->lnf = A(Nl * C);
        s->lnf_mean = F32(Nl);
        s->lnf_rstd = F32(Nl);
        s->logits = A(N * m->shape.Vl);
        if (m->shape.zb) s->dlnf = A(Nl * C);
    }
    OWNER("acts.slot.tokens");
    if (ch->embed) s->tok = mem_alloc(a, MEM_ACTS, N * sizeof(int32_t));
    if (m->shape.doc_mask || m->shape.reset_pos)
        s->doc = mem_alloc(a, MEM_ACTS, N * sizeof(int32_t));
    if (m->shape.doc_mask && cp_ulysses(m->par.cp) > 1) /* the documents of every token attended */
        s->udoc = mem_alloc(a, MEM_ACTS, N * cp_ulysses(m->par.cp) * sizeof(int32_t));
    int W[CFG_MAX_WINDOWS], nw = cfg_windows(m->cfg, W);
    for (int k = 0; k < nw; k++) { /* each query's first visible key (ops.h q_start) */
        s->wdoc[k] = mem_alloc(a, MEM_ACTS, N * sizeof(int32_t));
        if (cp_ulysses(m->par.cp) > 1)
            s->uwdoc[k] = mem_alloc(a, MEM_ACTS, N * cp_ulysses(m->par.cp) * sizeof(int32_t));
    }
    s->pos = mem_alloc(a, MEM_ACTS, N * sizeof(int32_t));
    if (m->mtp.D && ch->embed) s->mtp_tok = mem_alloc(a, MEM_ACTS, m->mtp.D * N * sizeof(int32_t));
    OWNER("acts.slot.grad");
    s->dy = A(model_boundary_numel(m));
    OWNER("acts.slot.mtp");
    if (m->mtp.D && ch->head) mtp_alloc_slot(m, a, s, shared);
    OWNER(NULL);
}

void acts_alloc(model *m, ust_arena *a) {
    int64_t N = (int64_t)m->shape.B * m->shape.T, C = m->shape.C, HD = m->shape.H * m->shape.D,
            KV = m->shape.Hkv * m->shape.D, F = m->shape.F;
    int64_t wide = HD > F ? HD : F;
    const char *caller = OWNER("acts.shared.mlp_act"); /* train.recompute: selective's */
    act *shared = m->shape.recompute == RECOMPUTE_SELECTIVE ? A(N * F) : NULL;
    if (m->shape.recompute == RECOMPUTE_FULL) acts_alloc_layer(m, a, &m->acts.scratch, shared, 1);
    if (m->shape.recompute == RECOMPUTE_FULL && m->moe.has_moe)
        acts_alloc_moe(m, a, &m->acts.moe_scratch);
    for (int c = 0; c < m->nchunks; c++) {
        model_chunk *ch = &m->chunks[c];
        ch->slots = calloc(ch->nslots, sizeof *ch->slots);
        for (int k = 0; k < ch->nslots; k++) alloc_slot(m, a, ch, &ch->slots[k], shared);
    }
    OWNER("acts.scratch"); /* the step's own: the loss, the backward's gradients */
    m->acts.losses = F32(N);
    m->acts.dtmp = A((int64_t)m->shape.Nl * C);
    m->acts.dln = A(N * C);
    int head = 0;
    for (int c = 0; c < m->nchunks; c++) head |= m->chunks[c].head;
    if (m->vc.nvc > 1 && head) { /* the cross-entropy over the head's column blocks */
        m->acts.vc_lse = F32(4 * N);
        m->acts.vc_merge = A(N);
        m->acts.vc_merge2 = A(N);
    }
    if (tp_sp(m->par.tp) || m->shape.zb || m->shape.qk_norm) /* qk_norm: D <= C floats */
        m->acts.dnorm = F32(2 * C);
    if (m->shape.qk_whole && tp_size(m->par.tp) > 1 && m->cfg->run.device != DEV_CUDA) {
        /* the rows' sums (proj_norm.c): N of them, our weight columns and the whole's */
        m->acts.pn_sums = F32(N + 2 * m->shape.Hg * m->shape.D);
    } else if (m->shape.qk_whole && tp_size(m->par.tp) > 1) { /* whole rows (proj_norm.c) */
        int64_t whole = N * m->shape.Hg * m->shape.D;
        m->acts.pn_stage = A(whole);
        m->acts.pn_x = A(whole);
        m->acts.pn_y = A(whole);
    }
    m->acts.dq = A(N * HD);
    m->acts.dk = A(N * KV);
    m->acts.dv = A(N * KV);
    m->acts.datt = A(N * wide);
    m->acts.dgate = m->shape.llama ? A(N * F) : NULL;
    m->acts.dup = A(N * F);
    m->acts.dact =
        m->shape.llama ? A(N * F) : NULL; /* gpt2's GELU backward is fused (linear_gelu_bwd) */
    m->acts.tgt = mem_alloc(a, MEM_ACTS, N * sizeof(int32_t));
    if (is_mla(m)) mla_alloc_scratch(m, a);
    if (m->mtp.D && head) mtp_alloc_scratch(m, a);
    if (m->shape.fam.norm_offset) alloc_norm_offset(m, a);
    OWNER(caller);
}
#undef OWNER
#undef A
#undef F32

void acts_free(model *m) {
    for (int c = 0; c < m->nchunks; c++) {
        for (int k = 0; k < m->chunks[c].nslots; k++) {
            act_slot *s = &m->chunks[c].slots[k];
            for (int i = 0; s->ma && i < m->chunks[c].hi - m->chunks[c].lo; i++)
                if (is_moe(m, m->chunks[c].lo + i)) moe_acts_free(&s->ma[i]);
            for (int k = 0; s->mtp && k < m->mtp.D; k++) /* model.mtp's MoE blocks */
                if (is_moe(m, m->shape.L + k)) moe_acts_free(&s->mtp[k].ma);
            free(s->xs), free(s->la), free(s->ws), free(s->ma), free(s->wg.jobs), free(s->mtp);
        }
        free(m->chunks[c].slots);
    }
    free(m->chunks);
}

layer_acts *acts_of(model *m, act_slot *s, int i) {
    return m->shape.recompute == RECOMPUTE_FULL ? &m->acts.scratch : &s->la[i];
}

moe_acts *moe_acts_of(model *m, act_slot *s, int i) {
    return m->shape.recompute == RECOMPUTE_FULL ? &m->acts.moe_scratch : &s->ma[i];
}

int model_num_chunks(const model *m) { return m->nchunks; }
int model_chunk_slots(const model *m, int c) { return m->chunks[c].nslots; }
/* model.mtp: the residual, then each module's input embedding (made on the first stage, used on
 * the last; in the gradient, its gradient going back) */
int64_t model_boundary_numel(const model *m) {
    return (int64_t)(1 + m->mtp.D) * m->shape.Nl * m->shape.C;
}
act *model_chunk_input(model *m, int c, int slot) { return m->chunks[c].slots[slot].xs[0]; }
act *model_chunk_output(model *m, int c, int slot) {
    const model_chunk *ch = &m->chunks[c];
    return ch->slots[slot].xs[ch->hi - ch->lo];
}
act *model_chunk_grad(model *m, int c, int slot) { return m->chunks[c].slots[slot].dy; }
