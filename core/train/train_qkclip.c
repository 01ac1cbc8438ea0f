/* train_qkclip.c: QK-clip's step (optimizer.qk_clip_threshold, docs/training.md#qk-clip): the
 * training forwards record each layer's and query head's largest attention logit, the world
 * takes the maximum, and after the update the model rescales the heads above the threshold.
 * logging.stats_every's stats steps record the same table (on the CPU) as telemetry. */
#include <math.h>

#include "train_internal.h"

/* L x H: the table's size (every layer and query head of the whole model). */
static int64_t qk_n(const trainer *t) {
    return (int64_t)t->cfg->model.n_layer * t->cfg->model.n_head;
}

/* This step's forwards record the table: every step under QK-clip, else a stats step's. */
static int tracking(const trainer *t) {
    return t->eng.qk_buf && (t->cfg->optimizer.qk_clip_threshold > 0 || train_stats_on(t));
}

void train_qk_begin(trainer *t) {
    t->met.max_logit = NAN, t->met.qk_clipped = -1;
    if (!tracking(t)) return;
    /* host memory: QK-clip runs on the CPU backend only (train_check_runnable) */
    for (int64_t i = 0; i < qk_n(t); i++) t->eng.qk_buf[i] = -INFINITY;
    model_qk_track(t->eng.m, t->eng.qk_buf);
}

/* Every rank's table gathered (the world: dp and cp ranks saw other tokens, tp ranks hold other
 * heads, pipeline ranks other layers, dualpipe's mirror the other half of the micro-batches)
 * and max-reduced into the first n floats; a NaN anywhere stays NaN. */
static void world_max(trainer *t) {
    int64_t n = qk_n(t);
    int w = t->rt->world;
    float *x = t->eng.qk_buf, *all = x + n;
    if (w == 1) return;
    comm_req r = comm_allgather(t->rt->topo.comm[TOPO_WORLD], x, all, (size_t)n, COMM_FP32);
    comm_wait(&r);
    for (int64_t i = 0; i < n; i++) {
        x[i] = all[i];
        for (int k = 1; k < w; k++) {
            float v = all[(int64_t)k * n + i];
            x[i] = v > x[i] || v != v ? v : x[i];
        }
    }
}

void train_qk_end(trainer *t, int applied) {
    if (!tracking(t)) return;
    model_qk_track(t->eng.m, NULL); /* validation's forwards are not the step's */
    world_max(t);
    train_stats_logits(t, t->eng.qk_buf);
    double tau = t->cfg->optimizer.qk_clip_threshold, mx = -INFINITY;
    int clipped = 0;
    for (int64_t i = 0; i < qk_n(t); i++) {
        float v = t->eng.qk_buf[i];
        mx = v > mx || v != v ? v : mx;
        clipped += isfinite(v) && v > tau;
    }
    t->met.max_logit = mx;
    if (tau <= 0) return; /* telemetry only */
    t->met.qk_clipped = clipped;
    if (applied) model_qk_clip(t->eng.m, t->eng.qk_buf, tau, dp_scale_param, t->eng.dp);
}
