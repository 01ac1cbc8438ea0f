/* optim: the optimizer's pure functions: the learning-rate schedule (a function of the step
 * alone) and the global-norm clipping scale. The AdamW update itself is the ops.h `adamw` op,
 * applied by parallel/dp to the parameters (or shard) this rank holds. */
#ifndef UST_OPTIM_H
#define UST_OPTIM_H

#include <stdint.h>

#include "config.h"

/* Learning rate of step s (0-based): linear warmup to lr, then cosine / linear / constant / wsd
 * to min_lr at the last step. */
double optim_lr(const ust_config *cfg, int64_t step);
/* Scale that brings a gradient of global norm `norm` down to grad_clip (1 when below or off). */
float optim_clip_scale(const ust_config *cfg, double norm);
#endif
