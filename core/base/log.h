/* log: what a run reports. Rank 0 prints one line per logged step and appends the same figures
 * as one JSON object per line to logging.metrics_file (keys fixed by docs/design.md section 10)
 * and, with logging.tensorboard_dir, as scalar summaries to a TensorBoard event file there (the
 * tfevents record format: length, masked CRC32C, an Event protobuf, masked CRC32C). Both get the
 * same figures from one list (log_scalars). A resumed run drops the metrics lines after the
 * step it resumes from, and tells TensorBoard to do the same (a SessionLog START event). */
#ifndef UST_LOG_H
#define UST_LOG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define LOG_MAX_MOE 64
#define LOG_MAX_EP 64
#define LOG_MAX_EXPERTS 64
#define LOG_MAX_DATA 64 /* CFG_MAX_BLEND */

/* What one step sent and waited for (this rank, this step). */
typedef struct {
    uint64_t bytes_dp;           /* bytes sent in its data-parallel group */
    uint64_t bytes_tp;           /* ... in its tensor-parallel group */
    uint64_t bytes_pp;           /* ... to its pipeline neighbours (activations, gradients) */
    uint64_t bytes_cp;           /* ... in its context-parallel group(s) (0: none, not logged) */
    uint64_t bytes_cp_all;       /* bytes_cp summed over the cp group's ranks (0: none) */
    uint64_t bytes_mirror;       /* ... to dualpipe's mirror rank (0: none, not logged) */
    uint64_t bytes_ep;           /* ... in its expert-parallel group (logged with ep_logged) */
    uint64_t bytes_ep_internode; /* ... of which token rows to ranks on other nodes */
    int ep_logged;               /* MoE layers with parallel.ep > 1: the two above are logged */
    double tp_ms;                /* time spent waiting for tensor-parallel collectives */
    double cp_wait_ms;           /* ... for context-parallel key/value blocks */
    double ep_ms;                /* ... in MoE dispatch/combine all-to-alls */
} log_comm;

/* This rank's arena: the peak and the bytes by category. */
typedef struct {
    size_t peak, params, grads, optim, acts;
} log_mem;

/* The pipeline's bubble this step (bubble NaN: no pipeline). */
typedef struct {
    double bubble;   /* max over stages of idle / busy time */
    double analytic; /* (p - 1) / (v * m) */
    double sim;      /* the schedule's timeline with this step's mean op times */
    double op_ms[3]; /* those mean F, B, W times (averaged over the stages) */
} log_pp;

/* MoE layers of this rank: tokens routed to the busiest expert, the mean, dropped fraction; and,
 * per ep rank, the rows its experts computed in the step (global counts per rank holding them:
 * model_moe_rank_rows), ep entries each. */
typedef struct {
    int n;
    int layer[LOG_MAX_MOE];
    double load_max[LOG_MAX_MOE], load_mean[LOG_MAX_MOE], dropped[LOG_MAX_MOE];
    int ep;
    double rank_rows[LOG_MAX_MOE][LOG_MAX_EP];
    int E; /* the tokens routed to each expert in the step (global counts), E entries each */
    double experts[LOG_MAX_MOE][LOG_MAX_EXPERTS];
    double bias_range[LOG_MAX_MOE]; /* the balancing bias's max - min; NaN: none */
} log_moe;

/* Where the run is in its data, after this step. */
typedef struct {
    int64_t samples_seen, tokens_seen; /* by the run */
    int n;                             /* a blend's datasets (0: one dataset) */
    int64_t samples[LOG_MAX_DATA];     /* samples each has given */
    int cp_docs;                       /* context parallelism with document masking: */
    int64_t cp_blocks_skipped;         /* key/value blocks no query could see, not computed */
    int64_t target_tokens;             /* the step's: tokens the loss counts (a mask's targets) */
    double pad_frac;                   /* data.packing: the step's inputs that are padding */
} log_data;

/* Stragglers (every logging.every steps on a job of several ranks): each rank's compute time
 * (the step less its waits on communicators), wait time and step time, the rank computing longest
 * and its compute over the median (n 0: not gathered this step; per-rank figures for the first
 * LOG_MAX_RANKS ranks). */
enum { LOG_MAX_RANKS = 64 };
typedef struct {
    int n, slowest, flagged; /* flagged: slowdown above logging.straggler_ratio */
    double slowdown;
    double compute_ms[LOG_MAX_RANKS], wait_ms[LOG_MAX_RANKS], step_ms[LOG_MAX_RANKS];
} log_ranks;

/* Stability figures (logging.stats_every; n 0: not this step): per layer (the last entry: the
 * parameters outside the layers: embeddings, final norm, head) the gradient's L2 norm and the
 * update's norm over the weights' after it. For the n - 1 layers only: the RMS of each one's
 * output over the step's training forwards, and (has_logit: tracked, on the CPU) its largest
 * pre-softmax attention logit. Per kind (LOG_SPIKE_*: gradient norm, output RMS, logit), the
 * layer whose figure rose most over its mean at the earlier stats steps, above
 * logging.stats_spike (-1: none; n - 1: the parameters outside the layers), and that rise. */
enum { LOG_MAX_LAYERS = 256 };
enum { LOG_SPIKE_GRAD, LOG_SPIKE_ACT, LOG_SPIKE_LOGIT, LOG_SPIKES };
typedef struct {
    int n, has_logit;
    int spike_layer[LOG_SPIKES];
    double spike_ratio[LOG_SPIKES];
    double grad_norm[LOG_MAX_LAYERS + 1], update_ratio[LOG_MAX_LAYERS + 1];
    double act_rms[LOG_MAX_LAYERS], max_logit[LOG_MAX_LAYERS];
} log_layers;

/* eval.tasks scored this step (n 0: none): each task's name and scores (train_task.h). */
enum { LOG_MAX_TASKS = 16 };
typedef struct {
    int n;
    char name[LOG_MAX_TASKS][64];
    int items[LOG_MAX_TASKS];
    double acc[LOG_MAX_TASKS], acc_norm[LOG_MAX_TASKS], loglik[LOG_MAX_TASKS];
} log_tasks;

/* model.mtp.depth n modules: each one's mean cross-entropy over the step's target tokens (the
 * main model's count, the paper's 1/T), and over validation's (NaN: not this step). */
enum { LOG_MAX_MTP = 4 };
typedef struct {
    int n;
    double loss[LOG_MAX_MTP], val[LOG_MAX_MTP];
} log_mtp;

typedef struct {
    int64_t step, steps;
    double loss, lr, grad_norm, tokens_per_s, mfu, ms, eta_s; /* loss: ce_loss + MoE aux/z */
    double ce_loss;   /* the cross-entropy alone (= loss without mixture-of-experts layers) */
    double val_loss;  /* NaN when not computed this step */
    int skipped;      /* step skipped by on_nan: skip */
    int spike;        /* train.on_spike found one: 1 the update skipped, 2 rewound */
    int restarts;     /* scripts/ustrun --max-restarts: starts of the job before this one */
    double elapsed_s; /* since this process began training */
    log_comm comm;
    log_mem mem;
    log_pp pp;
    log_moe moe;
    log_data data;
    log_ranks ranks;
    log_layers layers;
    log_tasks tasks;
    double max_logit; /* QK-clip or a stats step: the largest attention logit (NaN: none) */
    int qk_clipped;   /* QK-clip: its (layer, query head) pairs above the threshold (-1: off) */
    log_mtp mtp;
} log_step;

typedef struct {
    FILE *metrics;           /* NULL on ranks other than 0 or without a metrics file */
    FILE *tb;                /* NULL without logging.tensorboard_dir */
    char metrics_path[4096]; /* for the messages */
    char tb_path[4400];      /* the event file */
    bool strict;             /* logging.strict: a failed write stops the run (else: warned once) */
    bool failed;             /* under strict, a write failed: the run ends with exit 1 */
    bool warned_metrics, warned_tb;
} ust_log;

/* Opens (appending) the metrics file, creating its directory, and, when tb_dir is not empty, a
 * new event file in tb_dir. resume_step > 0: the run continues after that step, so metrics
 * lines of later steps (a run killed after its last checkpoint wrote them) are dropped first.
 * Returns -1 on failure with the reason in err. Every later write, flush and close is checked:
 * a failure (a full disk) is warned once per file naming it and errno, or, with l->strict
 * (set before opening), said once and recorded in l->failed for the caller to stop on. */
int log_open(ust_log *l, const char *metrics_path, const char *tb_dir, int64_t resume_step,
             char *err, int errlen);
void log_close(ust_log *l);
void log_step_line(const log_step *s); /* the console line */
void log_step_json(ust_log *l, const log_step *s);
/* Seconds on the monotonic clock: every timing and deadline of a run reads this one. */
double log_now_s(void);
/* Human-readable byte count ("12.3 MiB") into buf. */
const char *log_bytes(char *buf, int n, double bytes);

#endif
