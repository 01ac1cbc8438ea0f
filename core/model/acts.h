/* acts: the model's activations (core/model/acts.c), the part of model.h that carves what each
 * layer keeps between forward and backward and the chunks' activation sets out of the arena, and
 * points a forward or backward at the set of a (chunk, slot). model_block.c reads them. */
#ifndef UST_ACTS_H
#define UST_ACTS_H

#include "model_state.h"

/* Every chunk's activation sets and the backward scratch, from the arena (MEM_ACTS). Against
 * a counting arena (mem_init_counting) it counts them: the memory plan's activations. */
void acts_alloc(model *m, ust_arena *a);
void acts_free(model *m); /* the host arrays; the arena owns the rest */
/* The saved activations of layer i of a set (the shared scratch under full recompute). */
layer_acts *acts_of(model *m, act_slot *s, int i);
/* One layer's saved activations (mlp: a dense MLP's too; shared_act: selective recompute's). */
void acts_alloc_layer(model *m, ust_arena *a, layer_acts *x, act *shared_act, int mlp);
moe_acts *moe_acts_of(model *m, act_slot *s, int i);
/* A MoE layer's saved routing and expert activations (counted only, in a counting arena). */
void acts_alloc_moe(model *m, ust_arena *a, moe_acts *ma);

#endif
