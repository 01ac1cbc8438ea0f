/* train_qkclip.c: QK-clip's step (optimizer.qk_clip_threshold, docs/training.md#qk-clip): the
 * training forwards record each layer's and query head's largest attention logit, the world
 * takes the maximum, and after the update the model rescales the heads above the threshold.
 * logging.stats_every's stats steps record the same table as telemetry. The tables live in
 * device memory (the forwards write them on the backend's stream); the reduction is the host's. */
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
    float *h = t->eng.qk_host;
    for (int64_t i = 0; i < qk_n(t); i++) h[i] = -INFINITY;
    t->eng.ops->to_device(t->eng.ops, t->eng.qk_buf, h, (size_t)qk_n(t) * sizeof(float));
    model_qk_track(t->eng.m, t->eng.qk_buf);
}

/* Every rank's table gathered (the world: dp and cp ranks saw other tokens, tp ranks hold other
 * heads, pipeline ranks other layers, dualpipe's mirror the other half of the micro-batches),
 * brought to the host and max-reduced into qk_host's first n floats; a NaN anywhere stays NaN. */
static void world_max(trainer *t) {
    int64_t n = qk_n(t);
    int w = t->rt->world;
    float *x = t->eng.qk_buf, *all = w == 1 ? x : x + n, *h = t->eng.qk_host;
    if (w > 1) {
        comm_req r = comm_allgather(t->rt->topo.comm[TOPO_WORLD], x, all, (size_t)n, COMM_FP32);
        comm_wait(&r);
    }
    t->eng.ops->to_host(t->eng.ops, h, all, (size_t)(w * n) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        for (int k = 1; k < w; k++) {
            float v = h[(int64_t)k * n + i];
            h[i] = v > h[i] || v != v ? v : h[i];
        }
}

void train_qk_end(trainer *t, int applied) {
    if (!tracking(t)) return;
    model_qk_track(t->eng.m, NULL); /* validation's forwards are not the step's */
    world_max(t);
    const float *table = t->eng.qk_host;
    train_stats_logits(t, table);
    double tau = t->cfg->optimizer.qk_clip_threshold, mx = -INFINITY;
    int clipped = 0;
    for (int64_t i = 0; i < qk_n(t); i++) {
        float v = table[i];
        mx = v > mx || v != v ? v : mx;
        clipped += isfinite(v) && v > tau;
    }
    t->met.max_logit = mx;
    if (tau <= 0) return; /* telemetry only */
    t->met.qk_clipped = clipped;
    if (applied) model_qk_clip(t->eng.m, table, tau, dp_scale_param, t->eng.dp);
}
