/* pp: the pipeline executor. It walks this rank's action list from pp_schedule (forward,
 * backward and weight-gradient computations of (micro-batch, chunk), and the point-to-point
 * transfers around them) and runs it on the model's chunks (its activation slots, batched
 * transfers and busy/idle accounting are described at pp_plan); validation walks a
 * forward-only list (pps_build_forward) the same way.
 * The model keeps its gradient hooks (data parallelism); the caller says, through
 * before_grads, which micro-batch's gradients a backward pass is about to add. */
#ifndef UST_PP_H
#define UST_PP_H

#include <stdint.h>

#include "comm.h"
#include "config.h"
#include "model.h"
#include "ops.h"
#include "pp_schedule.h"

typedef struct {
    void *ctx;
    /* the feeder's record of micro-batch mb of the step (valid until the next load) */
    const ust_batch *(*load)(void *ctx, int mb);
    /* called before a pass that adds parameter gradients of micro-batch mb (last: mb is the
     * step's last micro-batch) */
    void (*before_grads)(void *ctx, int mb, int last);
    /* optional: after each forward of micro-batch mb through chunk (its losses, when it holds
     * the head, are model_chunk_losses until the next forward) */
    void (*forwarded)(void *ctx, int mb, int chunk);
} pp_callbacks;

/* How the executor runs the list (pp.c):
 *   - activation slots: each (micro-batch, chunk) gets one of the chunk's activation sets from
 *     its first action (a receive or its forward) to the end of its backward (of W for zb);
 *     pp_slot_plan computes the assignment before the model exists, so the model allocates
 *     exactly as many sets as the schedule keeps in flight;
 *   - transfers: the comm actions between two computations go out as one batched send/recv;
 *     a batch with a receive is waited on before the next computation, a batch of sends only
 *     stays in flight until the next batch is posted (pp_schedule.h states why this cannot
 *     deadlock);
 *   - accounting: time in computations (busy) and waiting for transfers (idle) per step.
 *
 * This rank's schedule for cfg (pipeline coordinate pp_rank, parallel.pp_schedule over
 * cfg_grad_accum micro-batches) and the activation sets each of its chunks needs. */
int pp_plan(const ust_config *cfg, int pp_rank, pps_schedule *sched, int slots[MODEL_MAX_CHUNKS],
            ust_err *e);
/* The schedule a rank runs: parallel.pp_schedule, or with one stage 1f1b (plain gradient
 * accumulation). */
ust_pp_schedule pp_kind(const ust_config *cfg);

/* This rank's chunks into st (model_storage.chunks): stage c*p + pp_rank for c < vpp (dualpipev:
 * pp_rank and 2p-1-pp_rank, pps_stage), each
 * n_layer/(p*vpp) layers or as parallel.pp_layers says, the embeddings with the first stage and
 * the head with the last, slots[c] activation sets (pp_plan's or pp_activation_sets'). */
void pp_stages(const ust_config *cfg, int pp_rank, const int slots[MODEL_MAX_CHUNKS],
               model_storage *st);

/* pp_plan's activation sets per chunk without keeping the schedule (one stage: one set, the
 * schedule is not built), and whether it splits B and W (zb, dualpipev: the chunks keep W's
 * gradients). */
int pp_activation_sets(const ust_config *cfg, int pp_rank, int slots[MODEL_MAX_CHUNKS], int *zb,
                       ust_err *e);
/* pp_activation_sets of every pipeline rank at once, slots[r] and zb[r] (r < parallel.pp): the
 * two-way schedules place all ranks' receives in one simulation, which per rank is repeated. */
int pp_activation_sets_all(const ust_config *cfg, int (*slots)[MODEL_MAX_CHUNKS], int *zb,
                           ust_err *e);
typedef struct pp_state pp_state;
/* The figures every rank of a pipeline of p shares after a step (MEM_COMM): pp_create's own
 * allocation, which the memory plan runs against a counting arena. */
float *pp_alloc_scalars(ust_arena *arena, int p);

/* Consumes sched (pp_plan's; freed here: the executor keeps every rank's schedule). pipe: the
 * pipeline group (member i = stage rank i); emb: the tied embedding group (first and last stage;
 * NULL or size 1 when there is nothing to sync). */
pp_state *pp_create(const ust_config *cfg, const ust_ops *ops, ust_arena *arena, model *m,
                    ust_comm *pipe, ust_comm *emb, pps_schedule *sched);
void pp_destroy(pp_state *s);
/* train.batch_ramp: the steps from now on run nmb micro-batches (every rank's schedule rebuilt
 * for them; nothing happens when the count is the current one). pp_check_micro_batches says,
 * before anything is built, whether the schedule runs nmb micro-batches within the activation
 * sets of the run's own count (the model's). */
int pp_set_micro_batches(pp_state *s, int nmb, ust_err *e);
int pp_check_micro_batches(const ust_config *cfg, int nmb, ust_err *e);

/* Runs one step's schedule; returns this rank's sum of per-token losses (non-zero on the last
 * stage only). dscale as in model_forward. */
double pp_train_step(pp_state *s, const pp_callbacks *cb, float dscale);
/* Forward only (validation): data.val_steps micro-batches through the pipeline, walking the
 * forward-only schedule; returns the loss sum and counted targets of this rank (the last
 * stage's). */
double pp_forward_only(pp_state *s, const pp_callbacks *cb, int64_t *ntok);
/* All-reduce of one number over the pipeline group. */
double pp_sum(pp_state *s, double x);
/* Tied embeddings: sums the copies' gradient pieces (n floats at g) over the embedding group. */
void pp_sync_tied(pp_state *s, float *g, int64_t n);

typedef struct {
    double busy_s, idle_s;   /* this rank, last step: computing; waiting for transfers */
    uint64_t sent_bytes;     /* this rank, last step: activations and gradients sent */
    double bubble;           /* max over the pipeline of idle / busy */
    double analytic;         /* the published bubble for these F, B, W (pps_analytic_bubble) */
    double simulated;        /* the schedule's timeline with the measured mean F, B, W times */
    double f_ms, b_ms, w_ms; /* those times (averaged over the stages) */
} pp_stats;
/* Collective over the pipeline group (every stage calls it after a step). */
pp_stats pp_last_step_stats(pp_state *s);

#endif
