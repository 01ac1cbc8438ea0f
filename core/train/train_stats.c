/* train_stats.c: logging.stats_every, the run's stability figures. On every stats step each
 * layer's gradient norm (before clipping) and update-to-weight ratio (the update's norm over the
 * weights' after it), from the optimizer's buffers (dp_stats_before/after: summed over every
 * rank as the global gradient norm is, so the layers' squares add up to it); the RMS of each
 * layer's output over the step's training forwards (model_act_track, summed over the world); and
 * each layer's largest attention logit (train_qkclip.c's table). A layer whose gradient norm,
 * output RMS or largest logit is logging.stats_spike times its mean over the earlier stats steps
 * is named on the step line, in the metrics and in a warning: the layer a loss spike starts in. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_internal.h"

/* Test faults, a spike whose layer is known, each STEP:LAYER:FACTOR: UST_FAULT_LAYER_GRAD that
 * layer's gradients scaled on that step (before the figures); UST_FAULT_LAYER_ACT its output
 * projections (o_proj, down_proj: its output jumps) and UST_FAULT_LAYER_LOGIT its query
 * projection (q_proj: its logits) scaled before that step's forward, for good. */
static const char *const FAULT_ENV[LOG_SPIKES] = {"UST_FAULT_LAYER_GRAD", "UST_FAULT_LAYER_ACT",
                                                  "UST_FAULT_LAYER_LOGIT"};
typedef struct {
    long long step; /* 0: none */
    int layer;
    double factor;
} stats_fault;

struct train_stats {
    int G;         /* groups: the layers, then the parameters outside them */
    int *group;    /* per parameter */
    double *sq;    /* 3G: the gradients', weights' and update's sums of squares */
    double *mean;  /* LOG_SPIKES x G: each figure's sum and count over the earlier stats steps */
    double *act;   /* 2L: each layer's output's sum of squares and count (model_act_track) */
    double *logit; /* L: each layer's largest attention logit (NaN: not tracked) */
    int on;        /* this step is a stats step */
    stats_fault fault[LOG_SPIKES];
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
    st->mean = calloc(2 * LOG_SPIKES * (size_t)st->G, sizeof *st->mean);
    st->act = calloc(2 * (size_t)L, sizeof *st->act);
    st->logit = calloc(L, sizeof *st->logit);
    UST_ASSERT(st->group && st->sq && st->mean && st->act && st->logit,
               "out of memory (stats of %d layers)", st->G);
    for (int i = 0; i < np; i++) st->group[i] = layer_of(model_param_at(t->eng.m, i)->name, st->G);
    for (int k = 0; k < LOG_SPIKES; k++) {
        stats_fault *f = &st->fault[k];
        const char *v = getenv(FAULT_ENV[k]);
        if (!v || sscanf(v, "%lld:%d:%lf", &f->step, &f->layer, &f->factor) != 3) f->step = 0;
    }
    t->stats = st;
    return 0;
}

void train_stats_close(trainer *t) {
    if (!t->stats) return;
    free(t->stats->group), free(t->stats->sq), free(t->stats->mean), free(t->stats->act);
    free(t->stats->logit), free(t->stats);
    t->stats = NULL;
}

/* Does parameter name end in one of the fault's weights? */
static int fault_weight(int kind, const char *name) {
    static const char *const w[] = {"o_proj.weight", "down_proj.weight", "q_proj.weight"};
    size_t n = strlen(name);
    for (int j = kind == LOG_SPIKE_ACT ? 0 : 2; j < (kind == LOG_SPIKE_ACT ? 2 : 3); j++)
        if (n >= strlen(w[j]) && !strcmp(name + n - strlen(w[j]), w[j])) return 1;
    return 0;
}

/* UST_FAULT_LAYER_ACT and _LOGIT: the layer's weights scaled as every rank holds them. */
static void fault_weights(trainer *t) {
    train_stats *st = t->stats;
    for (int k = LOG_SPIKE_ACT; k <= LOG_SPIKE_LOGIT; k++) {
        const stats_fault *f = &st->fault[k];
        float x = (float)f->factor;
        for (int i = 0; f->step == t->step + 1 && i < model_num_params(t->eng.m); i++) {
            const model_param *p = model_param_at(t->eng.m, i);
            if (st->group[i] == f->layer && fault_weight(k, p->name))
                dp_scale_param(t->eng.dp, i, &x, p->numel);
        }
    }
}

void train_stats_begin(trainer *t) {
    train_stats *st = t->stats;
    if (!st) return;
    fault_weights(t);
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
    const stats_fault *f = &st->fault[LOG_SPIKE_GRAD];
    for (int i = 0; f->step == t->step + 1 && i < model_num_params(t->eng.m); i++) {
        int64_t n;
        float *g = st->group[i] == f->layer ? dp_grad_piece(t->eng.dp, i, &n) : NULL;
        if (g) t->eng.ops->scale(t->eng.ops, g, (float)f->factor, n);
    }
    dp_stats_before(t->eng.dp, st->group, st->G, st->sq);
}

void train_stats_after(trainer *t) {
    train_stats *st = t->stats;
    if (st && st->on)
        dp_stats_after(t->eng.dp, st->group, st->G, st->sq + st->G, st->sq + 2 * st->G);
}

/* Figure k's spike over its n entries v: the entry that rose most over its mean at the earlier
 * stats steps, above logging.stats_spike; then each finite value joins its mean (sum and
 * count). */
static void find_spike(train_stats *st, int k, const double *v, int n, double spike,
                       log_layers *o) {
    double *sum = st->mean + 2 * k * st->G, *cnt = sum + st->G;
    o->spike_layer[k] = -1, o->spike_ratio[k] = 0;
    for (int g = 0; g < n; g++) {
        double mean = cnt[g] > 0 ? sum[g] / cnt[g] : 0, r = mean > 0 ? v[g] / mean : 0;
        if (isfinite(r) && r > spike && r > o->spike_ratio[k])
            o->spike_layer[k] = g, o->spike_ratio[k] = r;
    }
    for (int g = 0; g < n; g++)
        if (isfinite(v[g])) sum[g] += v[g], cnt[g] += 1;
}

/* The warning naming figure k's spike (rank 0). */
static void warn_spike(const trainer *t, int k, const log_step *s) {
    static const char *const what[LOG_SPIKES][2] = {{"gradient spike", "norm"},
                                                    {"activation spike", "output RMS"},
                                                    {"attention logit spike", "max logit"}};
    const log_layers *o = &s->layers;
    const double *v[LOG_SPIKES] = {o->grad_norm, o->act_rms, o->max_logit};
    int l = o->spike_layer[k];
    const double *cnt = t->stats->mean + (2 * k + 1) * t->stats->G;
    char where[32] = "the embeddings/head";
    if (l < o->n - 1) snprintf(where, sizeof where, "layer %d", l);
    fprintf(stderr,
            "ustrain: warning: step %lld: %s in %s: %s %.4g, %.1f times its mean over the %d "
            "earlier stats steps (logging.stats_spike %g)\n",
            (long long)s->step, what[k][0], where, what[k][1], v[k][l], o->spike_ratio[k],
            (int)cnt[l] - 1, t->cfg->logging.stats_spike);
}

void train_stats_report(trainer *t, log_step *s) {
    train_stats *st = t->stats;
    s->layers.n = 0;
    for (int k = 0; k < LOG_SPIKES; k++) s->layers.spike_layer[k] = -1;
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
    double spike = t->cfg->logging.stats_spike;
    find_spike(st, LOG_SPIKE_GRAD, o->grad_norm, st->G, spike, o);
    find_spike(st, LOG_SPIKE_ACT, o->act_rms, st->G - 1, spike, o);
    find_spike(st, LOG_SPIKE_LOGIT, o->max_logit, st->G - 1, spike, o);
    st->on = 0;
    for (int k = 0; k < LOG_SPIKES && t->rank0; k++)
        if (o->spike_layer[k] >= 0) warn_spike(t, k, s);
}
