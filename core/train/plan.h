/* plan: the per-rank memory plan `ustrain validate` prints and the planner searches with,
 * from the config alone (the Playbook's accounting: parameters, gradients, AdamW state with
 * ZeRO sharding, activations under the chosen recomputation, communication scratch). It is no
 * formula of its own: the run's allocators size a model shaped like the rank's against a
 * counting arena, so a run's measured arena figures equal it byte for byte. */
#ifndef UST_PLAN_H
#define UST_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "model.h"

typedef struct {
    int64_t n_params;     /* whole model, padded vocabulary rows too */
    int64_t n_pad_params; /* of those, the rows padding the vocabulary to model.vocab_pad */
    double params, grads, optim, acts, comm, total; /* bytes per rank */
    double ckpt_staging; /* host bytes, beside the total: checkpoint.async's staging buffer */
} mem_plan;

void plan_memory(const ust_config *c, mem_plan *p); /* pipeline rank 0 (every rank without pp) */
void plan_memory_rank(const ust_config *c, int pp_rank, mem_plan *p);
/* plan_memory_rank, and the counting arena it was counted in: its owners (mem_owner) are the
 * plan of each row of the memory map (train_memmap.c). */
void plan_memory_owners(const ust_config *c, int pp_rank, mem_plan *p, ust_arena *count);
/* The largest total over the pipeline ranks: what must fit a device. */
double plan_memory_peak(const ust_config *c);
/* plan_memory_rank (whole 1: n_params too) or one rank of plan_memory_peak (whole 0) with the
 * activation sets given, MODEL_MAX_CHUNKS of them: pp_activation_sets' result for c and pp_rank.
 * Lets a caller that plans many configs sharing one schedule (the planner: every ZeRO stage and
 * sp of a mesh, schedule and micro-batch) build that schedule once. */
void plan_memory_rank_sets(const ust_config *c, int pp_rank, int whole, const int *slots, int zb,
                           mem_plan *p);
/* Every pipeline rank's activation sets, slots[r] and zb[r] for r < parallel.pp, from one
 * schedule build (pp_activation_sets_all: the two-way schedules simulate all ranks at once); a
 * schedule that does not build gets one set per rank (validation reports why). */
void plan_activation_sets(const ust_config *c, int (*slots)[MODEL_MAX_CHUNKS], int *zb);
/* plan_memory_peak with those sets. */
double plan_memory_peak_sets(const ust_config *c, const int (*slots)[MODEL_MAX_CHUNKS],
                             const int *zb);
void plan_print(const ust_config *c, const mem_plan *p, FILE *f);

/* Refuses (-1, the figure and the limit in e) a layout whose memory cannot exist where it is to
 * run. run.device cpu: every rank of the layout is on this node (the CPU backend is shared
 * memory), so the plans of all dp * tp * pp * cp ranks together must fit its physical RAM.
 * cuda: no device is at hand to ask, so one rank's plan must fit PLAN_MAX_DEVICE_BYTES, more
 * than any accelerator has (the backend reports a real shortfall when it allocates). */
#define PLAN_MAX_DEVICE_BYTES (1024.0 * 1024 * 1024 * 1024) /* 1 TiB */
int plan_check_fits(const ust_config *c, ust_err *e);

#endif
