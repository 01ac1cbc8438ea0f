/* log: what a run reports. Rank 0 prints one line per logged step and appends the same figures
 * as one JSON object per line to logging.metrics_file (keys fixed by DESIGN.md section 10). */
#ifndef UST_LOG_H
#define UST_LOG_H

#include <stdint.h>
#include <stdio.h>

#define LOG_MAX_MOE 64

typedef struct {
    int64_t step, steps;
    double loss, lr, grad_norm, tokens_per_s, mfu, ms, eta_s;
    size_t peak_mem_bytes;
    uint64_t comm_bytes_dp; /* bytes this rank sent in its data-parallel group this step */
    uint64_t comm_bytes_tp; /* ... and in its tensor-parallel group */
    uint64_t comm_bytes_pp; /* ... and to its pipeline neighbours (activations, gradients) */
    double tp_comm_ms;      /* time this step spent waiting for tensor-parallel collectives */
    double cp_wait_ms;      /* ... and for context-parallel key/value blocks */
    double ep_comm_ms;      /* ... and in MoE dispatch/combine all-to-alls */
    size_t mem_params, mem_grads, mem_optim, mem_acts; /* this rank's arena by category */
    double val_loss;                                   /* NaN when not computed this step */
    double pp_bubble; /* pipeline: max over stages of idle / busy time this step (NaN: no pp) */
    double pp_bubble_analytic; /* (p - 1) / (v * m) */
    double pp_bubble_sim;      /* the schedule's timeline with this step's mean op times */
    double pp_op_ms[3];        /* those mean F, B, W times (averaged over the stages) */
    /* MoE layers of this rank: tokens routed to the busiest expert, the mean, dropped fraction */
    int moe_n;
    int moe_layer[LOG_MAX_MOE];
    double moe_load_max[LOG_MAX_MOE], moe_load_mean[LOG_MAX_MOE], moe_dropped[LOG_MAX_MOE];
    int skipped; /* step skipped by on_nan: skip */
} log_step;

typedef struct {
    FILE *metrics; /* NULL on ranks other than 0 or without a metrics file */
} ust_log;

/* Opens (appending) the metrics file, creating its directory. Returns -1 on failure. */
int log_open(ust_log *l, const char *metrics_path, char *err, int errlen);
void log_close(ust_log *l);
void log_step_line(const log_step *s); /* the console line */
void log_step_json(ust_log *l, const log_step *s);
/* Seconds on the monotonic clock: every timing and deadline of a run reads this one. */
double log_now_s(void);
/* Human-readable byte count ("12.3 MiB") into buf. */
const char *log_bytes(char *buf, int n, double bytes);

#endif
