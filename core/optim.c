#include "optim.h"

#include <math.h>

void optim_init(ust_optim *o, const ust_config *cfg, const ust_ops *ops, ust_arena *a,
                int64_t numel) {
    o->cfg = cfg;
    o->ops = ops;
    o->numel = numel;
    o->m = mem_alloc(a, MEM_OPTIM, numel * sizeof(float));
    o->v = mem_alloc(a, MEM_OPTIM, numel * sizeof(float));
}

double optim_lr(const ust_config *cfg, int64_t step) {
    double lr = cfg->optimizer.lr, min_lr = cfg->optimizer.min_lr;
    int64_t warm = cfg->optimizer.warmup_steps, total = cfg->train.steps;
    if (step < warm) return lr * (double)(step + 1) / (double)warm;
    if (total <= warm + 1) return lr;
    double progress = (double)(step - warm) / (double)(total - 1 - warm); /* 0 .. 1 */
    if (progress > 1) progress = 1;
    switch (cfg->optimizer.schedule) {
    case SCHED_CONSTANT: return lr;
    case SCHED_LINEAR: return lr + (min_lr - lr) * progress;
    case SCHED_WSD: {
        /* warmup, stable at lr, then a linear decay over the last decay_frac of all steps */
        int64_t decay_steps = (int64_t)ceil(cfg->optimizer.decay_frac * (double)total);
        int64_t decay_start = total - decay_steps;
        if (step < decay_start || decay_steps <= 1) return lr;
        double f = (double)(step - decay_start) / (double)(decay_steps - 1);
        return lr + (min_lr - lr) * (f > 1 ? 1 : f);
    }
    case SCHED_COSINE:
    default: return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(M_PI * progress));
    }
}

float optim_clip_scale(const ust_config *cfg, double norm) {
    double clip = cfg->train.grad_clip;
    if (clip <= 0 || !(norm > clip)) return 1.0f;
    return (float)(clip / (norm + 1e-6));
}

void optim_step(ust_optim *o, model *m, double lr, float grad_scale, int64_t step) {
    const ust_config *c = o->cfg;
    float *p = model_params(m), *g = model_grads(m);
    for (int i = 0; i < model_num_params(m); i++) {
        const model_param *q = model_param_at(m, i);
        float wd = q->decay ? (float)c->optimizer.weight_decay : 0.0f;
        o->ops->adamw(o->ops, p + q->offset, g + q->offset, o->m + q->offset, o->v + q->offset,
                      q->numel, (float)lr, (float)c->optimizer.beta1, (float)c->optimizer.beta2,
                      (float)c->optimizer.eps, wd, grad_scale, step + 1);
    }
}
