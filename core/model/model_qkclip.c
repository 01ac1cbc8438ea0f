/* model_qkclip.c: QK-clip (optimizer.qk_clip_threshold; Kimi K2's MuonClip, arXiv 2507.20534):
 * the training forwards' largest attention logit per layer and query head, and the rescale of
 * that head's q and k weights after the step's update (model.h model_qk_track, model_qk_clip). */
#include <math.h>
#include <stdio.h>

#include "cp.h"
#include "model_state.h"
#include "tp.h"

void model_qk_track(model *m, float *table) { m->qk_max = table; }

/* Row l of the table, at this rank's first query head (tensor parallelism splits the heads). */
float *model_qk_row(const model *m, int l) {
    if (!m->qk_max) return NULL;
    return m->qk_max + (int64_t)l * m->shape.Hg + (int64_t)tp_rank(m->par.tp) * m->shape.H;
}

/* The factor eta = tau / max of one query head's logits (1: at or below tau, or not finite). */
static float eta_of(float mx, double tau) {
    return isfinite(mx) && mx > tau ? (float)(tau / mx) : 1.0f;
}

/* Layer l's factors (tp-local heads): fq per query head sqrt(eta_h); fk per key/value head
 * sqrt(min eta over the query heads sharing it), so every head's logits shrink by at least its
 * eta and, without grouped-query attention, exactly by it (the paper's per-head rule). */
static int layer_factors(const model *m, const float *row, double tau, float *fq, float *fk) {
    int H = m->shape.H, G = m->shape.H / m->shape.Hkv, clipped = 0;
    for (int g = 0; g < m->shape.Hkv; g++) fk[g] = 1.0f;
    for (int h = 0; h < H; h++) {
        float e = eta_of(row[h], tau);
        clipped |= e < 1.0f;
        fq[h] = sqrtf(e);
        fk[h / G] = fq[h] < fk[h / G] ? fq[h] : fk[h / G];
    }
    return clipped;
}

void model_qk_clip(model *m, const float *global, double tau, model_param_scale_fn scale,
                   void *ctx) {
    enum { MAXH = 1024 };
    float fq[MAXH], fk[MAXH];
    UST_ASSERT(m->shape.H <= MAXH, "QK-clip over %d heads (at most %d)", m->shape.H, MAXH);
    for (int i = 0; i < m->tab.nparams; i++) {
        const model_param *p = &m->tab.params[i];
        int l, n;
        char which, kind[16];
        if (sscanf(p->name, "model.layers.%d.self_attn.%c_proj.%15s%n", &l, &which, kind, &n) !=
                3 ||
            (which != 'q' && which != 'k'))
            continue;
        const float *row =
            global + (int64_t)l * m->shape.Hg + (int64_t)tp_rank(m->par.tp) * m->shape.H;
        if (!layer_factors(m, row, tau, fq, fk)) continue;
        /* a head's rows are D consecutive rows of C (the weight) or D elements (the bias) */
        int64_t per = (int64_t)m->shape.D * (kind[0] == 'w' ? m->shape.C : 1);
        scale(ctx, i, which == 'q' ? fq : fk, per);
    }
}
