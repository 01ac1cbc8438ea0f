/* model_moe: the model's MoE state (core/model/model_moe.c): the MoE layers' context and weight
 * tables, each training forward's statistics, losses and routed counts, and (model.h) the
 * step's loads and balancing-bias update. */
#ifndef UST_MODEL_MOE_H
#define UST_MODEL_MOE_H

#include "model_state.h"

void model_moe_init(model *m, ust_arena *arena, const model_storage *st);
void model_moe_free(model *m);
/* Layer l's forward gave st: kept for model_moe_stats; a training forward (dscale > 0) adds its
 * loss and routed counts to the step's. */
void model_moe_record(model *m, int l, const moe_stats *st, float dscale);

#endif
