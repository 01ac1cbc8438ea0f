/* train_stats.c: logging.stats_every, the run's stability figures. On every stats step each
 * layer's gradient norm (before clipping) and update-to-weight ratio (the update's norm over the
 * weights' after it), from the optimizer's buffers (dp_stats_before/after: summed over every
 * rank as the global gradient norm is, so the layers' squares add up to it); the RMS of each
 * layer's output over the step's training forwards (model_act_track, summed over the world); and
 * each layer's largest attention logit (train_qkclip.c's table). A layer whose
 * gradient norm is logging.stats_spike times its mean over the earlier stats steps is named on
 * the step line, in the metrics and in a warning: the layer a loss spike starts in. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "train_internal.h"

struct train_stats {
    int G;         /* groups: the layers, then the parameters outside them */
    int *group;    /* per parameter */
    double *sq;    /* 3G: the gradients', weights' and update's sums of squares */
    double *mean;  /* per group: mean gradient norm over the earlier stats steps */
    double *act;   /* 2L: each layer's output's sum of squares and count (model_act_track) */
    double *logit; /* L: each layer's largest attention logit (NaN: not tracked) */
    int seen, on;  /* stats steps so far; this step is one */
    /* test fault UST_FAULT_LAYER_GRAD=STEP:LAYER:FACTOR: that layer's gradients scaled on that
     * step (before the figures), a spike whose layer is known */
    long long fault_step;
    int fault_layer;
    double fault_factor;
};

/* The layer in a parameter's name (its first ".N." part: model.layers.3.mlp..., h.3....), or
 * G - 1 outside the layers (and for layers past LOG_MAX_LAYERS). */
static int layer_of(const char *name, int G) {
    for (const char *p = name; *p; p++)
        if (*p == '.' && isdigit((unsigned char)p[1])) {
            char *end;
            long l = strtol(p + 1, &end, 10);
            if (*end == '.' || !*end) return l < G - 1 ? (int)l : G - 1;
        }
    return G - 1;
}

int train_stats_open(trainer *t) {
    t->stats = NULL;
    if (t->cfg->logging.stats_every <= 0) return 0;
    train_stats *st = calloc(1, sizeof *st);
    int L = t->cfg->model.n_layer, np = model_num_params(t->eng.m);
    st->G = (L < LOG_MAX_LAYERS ? L : LOG_MAX_LAYERS) + 1;
    st->group = calloc(np ? np : 1, sizeof *st->group);
    st->sq = calloc(3 * (size_t)st->G, sizeof *st->sq);
    st->mean = calloc(st->G, sizeof *st->mean);
    st->act = calloc(2 * (size_t)L, sizeof *st->act);
    st->logit = calloc(L, sizeof *st->logit);
    UST_ASSERT(st->group && st->sq && st->mean && st->act && st->logit,
               "out of memory (stats of %d layers)", st->G);
    for (int i = 0; i < np; i++) st->group[i] = layer_of(model_param_at(t->eng.m, i)->name, st->G);
    const char *f = getenv("UST_FAULT_LAYER_GRAD");
    if (!f || sscanf(f, "%lld:%d:%lf", &st->fault_step, &st->fault_layer, &st->fault_factor) != 3)
        st->fault_step = 0;
    t->stats = st;
    return 0;
}

void train_stats_close(trainer *t) {
    if (!t->stats) return;
    free(t->stats->group), free(t->stats->sq), free(t->stats->mean), free(t->stats->act);
    free(t->stats->logit), free(t->stats);
    t->stats = NULL;
}

void train_stats_begin(trainer *t) {
    train_stats *st = t->stats;
    if (!st) return;
    st->on = (t->step + 1) % t->cfg->logging.stats_every == 0;
    if (!st->on) return;
    int L = t->cfg->model.n_layer;
    for (int l = 0; l < L; l++) st->act[2 * l] = st->act[2 * l + 1] = 0, st->logit[l] = NAN;
    model_act_track(t->eng.m, st->act);
}

int train_stats_on(const trainer *t) { return t->stats && t->stats->on; }

void train_stats_logits(trainer *t, const float *table) {
    train_stats *st = t->stats;
    int H = t->cfg->model.n_head;
    for (int l = 0; st && st->on && l < t->cfg->model.n_layer; l++) {
        float mx = -INFINITY;
        for (int h = 0; h < H; h++) {
            float v = table[(int64_t)l * H + h];
            mx = v > mx || v != v ? v : mx;
        }
        st->logit[l] = mx;
    }
}

/* The layers' output sums over the world: every rank's forwards saw other tokens (dp, cp, sp),
 * or held other layers (pp) or micro-batches (dualpipe's mirror). */
static void act_world_sum(trainer *t, double *x, int n) {
    ust_comm *w = t->rt->topo.comm[TOPO_WORLD];
    for (int k = 0; k < n && t->rt->world > 1; k += 4) /* comm_sum_doubles: 4 a call */
        comm_sum_doubles(w, t->eng.ops, t->eng.sums, x + k, n - k < 4 ? n - k : 4);
}

void train_stats_before(trainer *t) {
    train_stats *st = t->stats;
    if (!st || !st->on) return;
    model_act_track(t->eng.m, NULL);
    act_world_sum(t, st->act, 2 * t->cfg->model.n_layer);
    for (int i = 0; st->on && st->fault_step == t->step + 1 && i < model_num_params(t->eng.m);
         i++) {
        int64_t n;
        float *g = st->group[i] == st->fault_layer ? dp_grad_piece(t->eng.dp, i, &n) : NULL;
        if (g) t->eng.ops->scale(t->eng.ops, g, (float)st->fault_factor, n);
    }
    dp_stats_before(t->eng.dp, st->group, st->G, st->sq);
}

void train_stats_after(trainer *t) {
    train_stats *st = t->stats;
    if (st && st->on)
        dp_stats_after(t->eng.dp, st->group, st->G, st->sq + st->G, st->sq + 2 * st->G);
}

/* The group whose gradient norm rose most over its mean, above logging.stats_spike; then each
 * finite norm joins its group's mean. */
static void find_spike(train_stats *st, double spike, log_layers *o) {
    o->spike_layer = -1, o->spike_ratio = 0;
    for (int g = 0; g < st->G; g++) {
        double r = st->seen && st->mean[g] > 0 ? o->grad_norm[g] / st->mean[g] : 0;
        if (isfinite(r) && r > spike && r > o->spike_ratio) o->spike_layer = g, o->spike_ratio = r;
    }
    for (int g = 0; g < st->G; g++)
        if (isfinite(o->grad_norm[g]))
            st->mean[g] = (st->mean[g] * st->seen + o->grad_norm[g]) / (st->seen + 1);
    st->seen++;
}

void train_stats_report(trainer *t, log_step *s) {
    train_stats *st = t->stats;
    s->layers.n = 0;
    if (!st || !st->on) return;
    log_layers *o = &s->layers;
    o->n = st->G;
    for (int g = 0; g < st->G; g++) {
        o->grad_norm[g] = sqrt(st->sq[g]);
        o->update_ratio[g] =
            st->sq[st->G + g] > 0 ? sqrt(st->sq[2 * st->G + g] / st->sq[st->G + g]) : NAN;
    }
    o->has_logit = 0;
    for (int g = 0; g < st->G - 1; g++) {
        double n = st->act[2 * g + 1];
        o->act_rms[g] = n > 0 ? sqrt(st->act[2 * g] / n) : NAN;
        o->max_logit[g] = st->logit[g];
        o->has_logit |= !isnan(st->logit[g]);
    }
    find_spike(st, t->cfg->logging.stats_spike, o);
    st->on = 0;
    if (o->spike_layer < 0 || !t->rank0) return;
    char where[32] = "the embeddings/head";
    if (o->spike_layer < st->G - 1) snprintf(where, sizeof where, "layer %d", o->spike_layer);
    fprintf(stderr,
            "ustrain: warning: step %lld: gradient spike in %s: norm %.4g, %.1f times its mean "
            "over the %d earlier stats steps (logging.stats_spike %g)\n",
            (long long)s->step, where, o->grad_norm[o->spike_layer], o->spike_ratio, st->seen - 1,
            t->cfg->logging.stats_spike);
}
