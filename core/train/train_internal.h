/* train_internal: what the trainer's files share (inside core/train only; train.h is its face).
 * The trainer is a few parts, each filled and read by one file: train_setup.c the engine (the
 * backend, arena, model, optimizer and pipeline) and the runtime helpers, train_data.c the feed
 * (datasets, batch assignment, micro-batch inputs), train_ckpt.c the checkpoints (cadence, async
 * saves, resume, rewind) and stop requests, train_metrics.c the step figures and the printed
 * summaries. train.c, the step loop, owns the run's position kept in the trainer itself. */
#ifndef UST_TRAIN_INTERNAL_H
#define UST_TRAIN_INTERNAL_H

#include "ckpt.h"
#include "cp.h"
#include "data.h"
#include "dp.h"
#include "ep.h"
#include "log.h"
#include "mem.h"
#include "model.h"
#include "ops.h"
#include "pp.h"
#include "spike.h"
#include "tp.h"
#include "train.h"

/* train_setup.c: what everything computes with. */
typedef struct {
    ust_ops *ops;     /* what everything computes with: the backend, or the op profiler on it */
    ust_ops *backend; /* the CPU or CUDA backend itself (its own calls need it) */
    ust_arena arena;
    ust_tp tp;
    ust_cp cp;
    ust_ep ep; /* with MoE layers */
    model *m;
    dp_state *dp;
    pp_state *pp;   /* pipeline executor (NULL without pipeline parallelism) */
    int has_moe;    /* the model has mixture-of-experts layers */
    int tied_param; /* pipeline with tied embeddings: this rank's table or copy (-1: none) */
    float *flag;    /* one device float for train_any_rank */
    float *qk_buf;  /* QK-clip, or stats: L x H max logits of this rank, then of every rank
                       (train_qk; device) */
    float *qk_host; /* ... every rank's tables on the host, max-reduced into the first (malloc) */
    float *sums;    /* logging.stats_every: 8 device floats for comm_sum_doubles */
} train_engine;

/* train_build.c: a rank's runtime in the one order the run and the memory plan share, into g
 * (its ops and arena set): the tp, cp and ep contexts, the model with its activation sets, dp's
 * optimizer state, the pipeline executor and the stop flag. */
typedef struct {
    const ust_topology *topo; /* the run's groups; NULL: the memory plan's rank 0 of every group
                                 (shape-only contexts, no executor, a counting arena) */
    int pp_rank;
    const int *slots; /* the plan's: pp_activation_sets' activation sets and zb for pp_rank */
    int zb, whole;    /* ... and whether to list the whole model's tensors (model_all_tensors) */
} train_build_at;
int train_build_rank(train_engine *g, const ust_config *cfg, const train_build_at *at, ust_err *e);

/* train_data.c: the data a step consumes. */
typedef struct {
    data_blend *train, *val;     /* a lone glob is a blend of one */
    data_blend_pos pos;          /* where the training blend stands (at the step's start) */
    int32_t *docs, *doc_scratch; /* data.doc_mask: B x Tl document starts, T of one window */
    int32_t *tokens, *targets;   /* host: B x Tl, the micro-batch's inputs and targets */
    int32_t *rows;               /* host: B x Tl, their positions */
    int32_t *mtp;                /* model.mtp.depth D: host, D x B x Tl tokens then targets */
    ust_batch batch;             /* the micro-batch loaded last: the arrays above */
    int eot;                     /* the end-of-text id documents end with */
    int *which, *val_which;      /* the step's global batch (the validation samples): dataset */
    int64_t *index, *val_index;  /* ... and its sample */
    int32_t *samples;            /* host: B x (T+1), one micro-batch's windows */
    uint8_t *flags;              /* host: B x (T+1), their target flags (shards with a mask) */
    bool masked, val_masked;     /* the training (validation) data carries a target mask */
    int64_t step_targets;        /* the step's global batch: its target tokens */
    int64_t step_pad;            /* ... and its padding inputs (data.packing: first_fit) */
    int32_t *layout;             /* host: the Tl positions of this rank's part of a sequence */
    int Tl;                      /* tokens of each sequence on this rank (T / cp) */
    int seq_len;                 /* the step's sequence length (train.seq_len_warmup) */
    int64_t fault_spike_step;    /* UST_FAULT_SPIKE_STEP (tests): the step poisoned, or 0 */
    bool fault_spike_on;         /* ... "N+": every step's data from step N's on */
} train_feed;

/* train_ckpt.c: the checkpoints and the stop requests. */
typedef struct {
    ckpt_lock lock;                        /* rank 0: the job's lock on checkpoint.dir */
    ckpt_stage *stage;                     /* checkpoint.async: the host buffer of the slices */
    void *stage_buf;                       /* its memory when the backend gave it (page-locked) */
    ckpt_writer *pending;                  /* checkpoint.async: the save still being written */
    int64_t pending_step, pending_started; /* its step, and the step it was started after */
    double pending_s[2];   /* its writer's start and end (ckpt_set_times), for logging.trace */
    double save_s, wait_s; /* the step loop's time in saves, and waiting for async ones */
    int saves;
    double started_s;   /* when this process began training (train.exit_after_min counts from it) */
    int64_t rewound_to; /* on_spike: rewind: the step last rewound to, and how many times */
    int rewinds;
} train_ckpt;

/* train_metrics.c: the step figures and what the loop adds up of them. */
typedef struct {
    ust_log log;
    double fpt, peak;         /* model FLOPs per token; one rank's peak FLOP/s (may be raised) */
    double t_start;           /* when the loop began (the ETA and elapsed time count from it) */
    int64_t first;            /* the step the loop began at */
    int untimed, all_timed;   /* steps left out of the mean; whether none are (a short run) */
    double sum_ms;            /* over the timed steps */
    int64_t timed;            /* their count */
    int64_t allocs_after_one; /* device allocations after the first step (-1: not yet) */
    double ce_loss;           /* the step's cross-entropy: its loss less the MoE aux/z terms */
    float *ranks_dev, *ranks_host; /* stragglers: every rank's compute, wait, step (3 x world) */
    double max_logit; /* QK-clip: the step's largest attention logit (NaN: not tracked) */
    int qk_clipped;   /* ... and the (layer, query head) pairs above the threshold (-1: no clip) */
    log_mtp mtp;      /* model.mtp: each module's cross-entropy (the step's; validation's) */
} train_metrics;

typedef struct {
    const ust_config *cfg;
    ust_runtime *rt;
    int rank0;                  /* this rank prints, logs and writes state.json */
    int fresh;                  /* started from an import or the init, not a checkpoint */
    int64_t step, sample_index; /* the run's position: steps done, samples consumed */
    int64_t batch_since_step, batch_since_sample; /* where the current global batch size began */
    int batch_size; /* the step's global batch (train.batch_ramp), batch_since's; 0: not yet set */
    int resumed_seq_len; /* the resumed checkpoint's train.seq_len (0: none, or not known) */
    double last_loss;
    spike_window loss_w, norm_w; /* train.on_spike: the recent steps' losses and norms */
    int restarts;                /* UST_RESTART_COUNT (scripts/ustrun --max-restarts) */
    int eval; /* train_eval: the checkpoint is only read (no training notes are printed) */
    struct train_stats *stats; /* logging.stats_every (train_stats.c); NULL: off */
    train_engine eng;
    train_feed feed;
    train_ckpt ck;
    train_metrics met;
} trainer;

/* train_stats.c: logging.stats_every. open after the engine is built; begin before the step's
 * forwards, before and after the update on every step (each rank: collective on stats steps);
 * logits takes train_qk's world table (L x n_head); report fills the step's layers. */
typedef struct train_stats train_stats;
int train_stats_open(trainer *t);
void train_stats_close(trainer *t);
void train_stats_begin(trainer *t);
int train_stats_on(const trainer *t); /* this step is a stats step */
void train_stats_logits(trainer *t, const float *table);
void train_stats_before(trainer *t);
void train_stats_after(trainer *t);
void train_stats_report(trainer *t, log_step *s);

/* train_data.c: the global batch of the step about to run (cfg_batch_at of the tokens consumed;
 * the pipeline's micro-batch count follows it; a new size starts a new batch_since) and its
 * sequence length (cfg_seq_len_at). */
int train_feed_ramp(trainer *t, ust_err *e);

/* train_qkclip.c: QK-clip around a step (optimizer.qk_clip_threshold > 0, or a stats step;
 * else only the metrics' max_logit is reset to NaN): begin tracks the training forwards'
 * logits, end takes the world's maxima into t->met and the stats and, under QK-clip, when the
 * step's update was applied, rescales the heads. */
void train_qk_begin(trainer *t);
void train_qk_end(trainer *t, int applied);

/* train_memmap.c: the arena's limit (run.memory_limit_mb, or the device's free memory) and the
 * owner map printed and written (run.out_dir/memory_map_rank_R.json) when it would be passed. */
void train_memmap_arm(trainer *t);

/* train_setup.c */
#define TRAIN_SETUP_PROFILE 1 /* train_setup flags: time every op */
#define TRAIN_SETUP_EVAL 2    /* ... evaluation only: trainer.eval */
int train_setup(trainer *t, const ust_config *cfg, ust_runtime *rt, int flags, ust_err *e);
void train_teardown(trainer *t);
void train_write_config(const ust_config *cfg); /* run.out_dir/config.yaml (warns on failure) */
/* The sum of v over group k (exact below 2^24: counts); 1 when flag is set on any rank. */
double train_group_sum(trainer *t, int k, double v);
int train_any_rank(trainer *t, int flag);

/* train_trace.c: logging.trace. check: the steps (exit 2 before work); open: the directory
 * and the clock offsets (-1 after a message: every rank stops); the step's hooks; close after
 * the loop (ok: the ranks are together, what was traced is written). */
int train_trace_check(const ust_config *cfg, ust_err *e);
int train_trace_open(trainer *t);
void train_trace_step_begin(trainer *t);
void train_trace_span(trainer *t, int tid, const char *name, double t0);
void train_trace_ckpt_write(trainer *t); /* checkpoint.async: the completed save's writer */
void train_trace_step_end(trainer *t, const log_step *s);
void train_trace_close(trainer *t, int ok);

/* train_data.c */
int train_feed_open(trainer *t, ust_err *e);
void train_feed_layout(trainer *t); /* this rank's token positions, the micro-batch's buffers */
void train_feed_close(trainer *t);
void train_feed_assign(trainer *t); /* the step's global batch */
/* This rank's micro-batch mb of the step (of the validation set): pp_callbacks. */
const ust_batch *train_feed_train(void *ctx, int mb);
const ust_batch *train_feed_val(void *ctx, int mb);

/* This rank's record of the micro-batch now in samples and flags (train_task.c fills them). */
const ust_batch *train_feed_windows(trainer *t);

/* train_task.c: every example's log-likelihood (on every rank; 0), and eval.tasks' scores of
 * the step into s (those due). */
int train_task_logliks(trainer *t, const task_set *s, double *ll);
void train_tasks_step(trainer *t, const train_opts *opts, log_step *s);

/* train_ckpt.c */
int train_ckpt_initialize(trainer *t, ust_err *e); /* resume, import or init */
int train_ckpt_check_seq_len(const trainer *t, ust_err *e);
int train_ckpt_open_stage(trainer *t, ust_err *e);
void train_ckpt_close(trainer *t);
int train_ckpt_save(trainer *t, ust_err *e);
int train_ckpt_poll(trainer *t, int block, ust_err *e);
int train_ckpt_after_step(trainer *t); /* 1: stop now; -1: the checkpoint failed */
int train_ckpt_rewind(trainer *t, ust_err *e);
int train_ckpt_finish(trainer *t, int quiet); /* after the loop; -1 after printing the error */
int train_stop_asked(void);                   /* a stop signal has arrived */
void train_stop_handlers_reset(void);

/* train_metrics.c: where every group's counters stood when a step began. */
typedef struct {
    double t0;
    double wait_s[TOPO_NKINDS];
    uint64_t bytes[TOPO_NKINDS];
    uint64_t ep_internode; /* the ep context's bytes_internode */
} step_mark;

int train_metrics_open(trainer *t, const train_opts *opts); /* the log; -1 after the error */
void train_metrics_header(trainer *t, const train_opts *opts);
void train_metrics_begin(trainer *t, const train_opts *opts, train_result *res);
step_mark train_metrics_mark(trainer *t);
log_step train_metrics_report(trainer *t, const step_mark *mark, double loss, double norm,
                              double lr, int finite, int spiked);
void train_metrics_count(trainer *t, log_step *s);              /* after the position moved on */
void train_metrics_profile(trainer *t, const train_opts *opts); /* --profile: the timed steps */
void train_metrics_end(trainer *t, train_result *res);
void train_metrics_result(trainer *t, int rc, const train_opts *opts, train_result *res);

#endif
