/* train: the step loop. Batches -> forward/backward over this rank's micro-batches of the step
 * (data-parallel reduction and ZeRO through parallel/dp) -> global-norm clipping -> AdamW ->
 * logging (rank 0), validation, checkpoints (every rank writes its slices). Resumes from the newest
 * checkpoint by default and continues the exact same run. SIGTERM/SIGUSR1 finish the current
 * step, write a checkpoint and return 0. Errors in user input (config, data, checkpoint shape)
 * return UST_EXIT_USAGE before training starts; runtime failures return UST_EXIT_RUNTIME. */
#ifndef UST_TRAIN_H
#define UST_TRAIN_H

#include <stdint.h>

#include "bootstrap.h"
#include "comm.h"
#include "config.h"
#include "topology.h"
#include "train_task.h"

/* The process's place in the job: bootstrap, communicators and every group of the 5D grid. */
typedef struct {
    ust_boot boot;
    comm_ctx *comm;
    ust_topology topo;
    int rank, world;
} ust_runtime;

/* Joins the job (PMIx, torchrun-style environment or single process) and builds the topology
 * of cfg's layout; a layout that does not fit the world size is a usage error (-1). */
int train_runtime_init(ust_runtime *rt, const ust_config *cfg, ust_err *e);
void train_runtime_finalize(ust_runtime *rt);
/* SIGTERM/SIGUSR1 ask for a stop after the current step (with a checkpoint when
 * checkpoint.dir is set; before the first step, none is needed and the run exits 0). Call it
 * as early as possible: train_run installs the handlers too, and restores the defaults when it
 * returns. */
void train_install_stop_handlers(void);

/* The checks train_run makes before it locks, reads or allocates anything: the output paths
 * (never a file, never inside a checkpoint's step), bf16 on the CPU backend, the
 * sequence-parallel rows. `ustrain validate` runs them too. 0, or -1 with the reason in e. */
int train_check_runnable(const ust_config *cfg, ust_err *e);

typedef struct {
    int quiet;         /* no per-step lines (benchmark) */
    int write_config;  /* write the effective config under run.out_dir */
    int untimed_steps; /* first steps left out of the mean step time (default 1) */
    int profile;       /* time every op of the timed steps (ops_prof.h); rank 0 prints a table */
    const task_set *tasks; /* eval.tasks loaded, in the config's order (NULL: not scored) */
} train_opts;

typedef struct {
    int64_t steps_done; /* steps run by this call */
    double final_loss;
    int64_t timed_steps; /* the steps after the untimed ones */
    double mean_step_ms; /* over those */
    double tokens_per_s, mfu, peak_flops, flops_per_token;
    double arena_bytes; /* measured arena total */
    double arena_by_cat[6];
    size_t peak_rss;
    /* run.device = cuda: the backend's scratch outside the arena, the device memory in use
     * (cudaMemGetInfo), and the device allocations made after the first step (0 expected) */
    size_t device_backend_bytes, device_used;
    int64_t device_allocs_after_first_step;
} train_result;

/* rt may be NULL: a single-process runtime is made (and finalized) for the call. */
int train_run(const ust_config *cfg, ust_runtime *rt, const train_opts *opts, train_result *res);

/* The mean loss of cfg's model over data.val's first data.val_steps micro-batches, computed as
 * the training loop's validation is (every layout the same numbers), after the same start-up:
 * resume from checkpoint.resume, or model.init_from. Trains and writes nothing (clear
 * checkpoint.dir so that no lock is taken). 0, or UST_EXIT_USAGE after printing the error. */
int train_eval(const ust_config *cfg, ust_runtime *rt, double *loss);
/* The same start-up, then the log-likelihood of every example of s (train_task.h says how),
 * ll[k] for example k on every rank. */
int train_eval_task(const ust_config *cfg, ust_runtime *rt, const task_set *s, double *ll);

#endif
