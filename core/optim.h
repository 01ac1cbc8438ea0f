/* optim: AdamW on fp32 master weights, global-norm gradient clipping and the learning-rate
 * schedule (a pure function of the step). The optimizer owns the first and second moments,
 * laid out like the flat parameter buffer, and steps every parameter tensor with weight decay
 * on matrices only. */
#ifndef UST_OPTIM_H
#define UST_OPTIM_H

#include <stdint.h>

#include "config.h"
#include "mem.h"
#include "model.h"

typedef struct {
    const ust_config *cfg;
    const ust_ops *ops;
    float *m, *v; /* moments, same layout as the model's flat parameters */
    int64_t numel;
} ust_optim;

void optim_init(ust_optim *o, const ust_config *cfg, const ust_ops *ops, ust_arena *a,
                int64_t numel);
/* Learning rate of step s (0-based): linear warmup to lr, then cosine / linear / constant / wsd
 * to min_lr at the last step. */
double optim_lr(const ust_config *cfg, int64_t step);
/* Scale that brings a gradient of global norm `norm` down to grad_clip (1 when below or off). */
float optim_clip_scale(const ust_config *cfg, double norm);
/* One AdamW step (t = step + 1) over every parameter of m, gradients scaled by grad_scale. */
void optim_step(ust_optim *o, model *m, double lr, float grad_scale, int64_t step);

#endif
