#include "optim.h"

#include <math.h>

double optim_lr(const ust_config *cfg, int64_t step) {
    double lr = cfg->optimizer.lr, min_lr = cfg->optimizer.min_lr;
    int64_t warm = cfg->optimizer.warmup_steps, total = cfg->train.steps;
    if (step < warm) return lr * (double)(step + 1) / (double)warm;
    if (total <= warm + 1) return lr;
    double progress = (double)(step - warm) / (double)(total - 1 - warm); /* 0 .. 1 */
    if (progress > 1) progress = 1;
    switch (cfg->optimizer.schedule) {
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

float optim_clip_scale(const ust_config *cfg, double norm) {
    double clip = cfg->train.grad_clip;
    if (clip <= 0 || !(norm > clip)) return 1.0f;
    return (float)(clip / (norm + 1e-6));
}
