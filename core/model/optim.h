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
/* AdamW's parameter groups: the rest (routers; under AdamW the hidden matrices), the embeddings
 * and the head, the norms and biases. */
enum { OPTIM_GROUP_REST, OPTIM_GROUP_EMBED, OPTIM_GROUP_NORM, OPTIM_GROUPS };
/* Group g's rate at step s: its peak (embed_lr, norm_lr; else adamw_lr under Muon, else lr) on
 * its shape (optimizer.embed/norm: schedule, warmup_steps, min_lr), else on the optimizer's
 * scaled to that peak. Its weight decay: optimizer.embed/norm.weight_decay, else weight_decay. */
double optim_group_lr(const ust_config *cfg, int group, int64_t step);
double optim_group_wd(const ust_config *cfg, int group);
/* Scale that brings a gradient of global norm `norm` down to grad_clip (1 when below or off). */
float optim_clip_scale(const ust_config *cfg, double norm);
#endif
