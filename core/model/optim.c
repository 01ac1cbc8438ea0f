#include "optim.h"

#include <math.h>
#include <string.h>

/* Linear warmup to lr over warm steps, then the schedule to min_lr at the run's last step. */
static double shape(int schedule, double lr, double min_lr, int64_t warm, const ust_config *cfg,
                    int64_t step) {
    int64_t total = cfg->train.steps;
    if (step < warm) return lr * (double)(step + 1) / (double)warm;
    if (total <= warm + 1) return lr;
    double progress = (double)(step - warm) / (double)(total - 1 - warm); /* 0 .. 1 */
    if (progress > 1) progress = 1;
    switch (schedule) {
    case SCHED_CONSTANT:
        return lr;
    case SCHED_LINEAR:
        return lr + (min_lr - lr) * progress;
    case SCHED_WSD: {
        /* warmup, stable at lr, then a linear decay over the last decay_frac of all steps */
        int64_t decay_steps = (int64_t)ceil(cfg->optimizer.decay_frac * (double)total);
        int64_t decay_start = total - decay_steps;
        if (step < decay_start || decay_steps <= 1) return lr;
        double f = (double)(step - decay_start) / (double)(decay_steps - 1);
        return lr + (min_lr - lr) * (f > 1 ? 1 : f);
    }
    case SCHED_COSINE:
    default:
        return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(M_PI * progress));
    }
}

double optim_lr(const ust_config *cfg, int64_t step) {
    const __typeof__(cfg->optimizer) *o = &cfg->optimizer;
    return shape(o->schedule, o->lr, o->min_lr, o->warmup_steps, cfg, step);
}

double optim_group_lr(const ust_config *cfg, int group, int64_t step) {
    const __typeof__(cfg->optimizer) *o = &cfg->optimizer;
    const cfg_lr_group *g = group == OPTIM_GROUP_EMBED  ? &o->embed
                            : group == OPTIM_GROUP_NORM ? &o->norm
                                                        : NULL;
    double own = group == OPTIM_GROUP_EMBED  ? o->embed_lr
                 : group == OPTIM_GROUP_NORM ? o->norm_lr
                                             : 0;
    double peak = own > 0 ? own : !strcmp(o->name, "muon") && o->adamw_lr > 0 ? o->adamw_lr : o->lr;
    if (!g || (g->schedule == CFG_SCHED_SAME && g->warmup_steps < 0 && g->min_lr < 0)) {
        /* the optimizer's shape scaled to the peak: the rate of a run without group shapes */
        double base = optim_lr(cfg, step);
        return peak == o->lr ? base : base * peak / o->lr;
    }
    int schedule = g->schedule == CFG_SCHED_SAME ? (int)o->schedule : g->schedule;
    int64_t warm = g->warmup_steps >= 0 ? g->warmup_steps : o->warmup_steps;
    double min_lr = g->min_lr >= 0 ? g->min_lr : o->min_lr * peak / o->lr;
    return shape(schedule, peak, min_lr, warm, cfg, step);
}

double optim_group_wd(const ust_config *cfg, int group) {
    const __typeof__(cfg->optimizer) *o = &cfg->optimizer;
    if (group == OPTIM_GROUP_NORM)
        return o->norm.weight_decay >= 0 ? o->norm.weight_decay : o->weight_decay;
    if (group == OPTIM_GROUP_EMBED && o->embed.weight_decay >= 0) return o->embed.weight_decay;
    return o->weight_decay;
}

float optim_clip_scale(const ust_config *cfg, double norm) {
    double clip = cfg->train.grad_clip;
    if (clip <= 0 || !(norm > clip)) return 1.0f;
    return (float)(clip / (norm + 1e-6));
}
