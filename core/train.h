/* train: the step loop. Batches -> forward/backward over the micro-batches of the step ->
 * global-norm clipping -> AdamW -> logging, validation, checkpoints. Resumes from the newest
 * checkpoint by default and continues the exact same run. SIGTERM/SIGUSR1 finish the current
 * step, write a checkpoint and return 0. Errors in user input (config, data, checkpoint shape)
 * return UST_EXIT_USAGE before training starts; runtime failures return UST_EXIT_RUNTIME. */
#ifndef UST_TRAIN_H
#define UST_TRAIN_H

#include <stdint.h>

#include "config.h"

typedef struct {
    int quiet;             /* no per-step lines (benchmark) */
    int write_config;      /* write the effective config under run.out_dir */
    int untimed_steps;     /* first steps left out of the mean step time (default 1) */
} train_opts;

typedef struct {
    int64_t steps_done;    /* steps run by this call */
    double final_loss;
    double mean_step_ms;   /* over the steps after the untimed ones */
    double tokens_per_s, mfu, peak_flops, flops_per_token;
    double arena_bytes;    /* measured arena total */
    double arena_by_cat[6];
    size_t peak_rss;
} train_result;

int train_run(const ust_config *cfg, const train_opts *opts, train_result *res);

#endif
