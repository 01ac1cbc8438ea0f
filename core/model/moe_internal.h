/* moe_internal: what the three files that implement moe.h share: moe.c (parameters, setup,
 * forward/backward), moe_route.c (capacity, routing, statistics, balancing) and moe_experts.c
 * (the experts' compute). Nothing else includes it. */
#ifndef UST_MOE_INTERNAL_H
#define UST_MOE_INTERNAL_H

#include "moe.h"

/* moe.c */
void *moe_host_alloc(size_t bytes); /* zeroed; asserts on failure */
/* ceil(factor * assignments / E): an expert's capacity over that many assignments. */
int64_t moe_capacity(double factor, int64_t assignments, int64_t E);
int64_t moe_stats_floats(int64_t E, int64_t B); /* floats of the statistics vector */

/* moe_route.c */
/* The cp group's token order for capacity (moe_groups.cp with more than one member). */
void moe_capacity_order_init(moe_ctx *m, const moe_groups *g, ust_arena *arena);
void moe_route(moe_ctx *m, moe_acts *a);                     /* a->topk -> rows and counts */
void moe_statistics(moe_ctx *m, moe_acts *a, moe_stats *st); /* losses and load statistics */

/* moe_experts.c */
void moe_expert_fwd(const moe_ctx *m, const moe_expert *w, act *out, const act *x, act *h1, act *h2,
                    act *y, int M, int F);
void moe_expert_bwd(const moe_ctx *m, const moe_expert *w, moe_expert *g, act *dx, const act *dout,
                    const act *x, const act *h1, const act *h2, const act *y, int M, int F,
                    int acc);
/* The shared expert's width: model.moe.shared_d_ff, or d_ff_expert when 0. */
int moe_shared_width(const ust_config *cfg);
void moe_local_experts_fwd(const moe_ctx *m, moe_acts *a, const moe_weights *w, act *out);
void moe_local_experts_bwd(const moe_ctx *m, moe_acts *a, const moe_weights *w, moe_weights *g,
                           act *dx, const act *dout);

#endif
