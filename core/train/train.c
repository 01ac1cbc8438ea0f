/* train.c: the step loop of one rank (docs/design.md section 4 fixes what a step consumes). */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "optim.h"
#include "train_internal.h"

static void pp_before_grads(void *ctx, int mb, int last) {
    (void)mb;
    dp_begin_microbatch(((trainer *)ctx)->eng.dp, last);
}

/* Tied embeddings over a pipeline: the first stage's table and the last stage's copy get the
 * sum of both gradients (each already reduced over its data-parallel group, piece by piece:
 * the two units are laid out alike, so the pieces match). */
static void sync_tied_grads(trainer *t) {
    if (t->eng.tied_param < 0) return;
    /* ZeRO-3's vocabulary chunks: one parameter per chunk, in the same order on both ends */
    for (int i = t->eng.tied_param; i < model_num_params(t->eng.m); i++) {
        if (strcmp(model_param_at(t->eng.m, i)->name, "model.embed_tokens.weight") != 0) continue;
        int64_t n;
        float *g = dp_grad_piece(t->eng.dp, i, &n);
        pp_sync_tied(t->eng.pp, g, n);
    }
}

/* model.mtp: each module's summed cross-entropy since the last take, over the pipeline and the
 * dp x cp group, as a mean over the main model's count of target tokens (into mean[k]); returns
 * what the modules add to the loss, loss_weight / D x their sum. */
static double mtp_losses(trainer *t, double *mean, double count) {
    double sum[CFG_MAX_MTP], total = 0;
    int D = model_take_mtp_losses(t->eng.m, sum);
    for (int k = 0; k < D; k++) {
        mean[k] = dp_sum(t->eng.dp, pp_sum(t->eng.pp, sum[k])) / count;
        total += mean[k];
    }
    t->met.mtp.n = D;
    return D ? t->cfg->model.mtp.loss_weight / D * total : 0;
}

/* Forward and backward over this rank's micro-batches of the step, through the pipeline
 * executor (the only path; one stage is gradient accumulation); returns the global-batch mean
 * loss: the mean over the target tokens of the whole global batch (every token without a mask),
 * so any layout and micro-batch split weighs every target alike. A step without a target has
 * loss 0 and no gradient. This rank's block of the global batch starts at sample_index + dp_rank
 * * G/dp. */
static double forward_backward(trainer *t) {
    int64_t N = t->feed.step_targets > 0 ? t->feed.step_targets : 1;
    pp_callbacks cb = {t, train_feed_train, pp_before_grads, NULL};
    dp_begin_step(t->eng.dp);
    double loss_sum = pp_train_step(t->eng.pp, &cb, 1.0f / (float)N);
    dp_finish_grads(t->eng.dp);
    sync_tied_grads(t);
    double moe = model_take_moe_loss(t->eng.m);
    if (t->eng.has_moe) moe = dp_sum(t->eng.dp, pp_sum(t->eng.pp, moe));
    t->met.ce_loss = dp_sum(t->eng.dp, pp_sum(t->eng.pp, loss_sum)) / (double)N;
    for (int k = 0; k < LOG_MAX_MTP; k++) t->met.mtp.val[k] = NAN;
    return t->met.ce_loss + moe + mtp_losses(t, t->met.mtp.loss, (double)N);
}

/* Only the last stage counts; the pipeline sum brings it to every stage. Every dp rank
 * evaluates the same windows, each cp rank its own tokens of them: summing both over the group
 * counts every token the same number of times. */
static double validation_loss(trainer *t) {
    pp_callbacks cb = {t, train_feed_val, pp_before_grads, NULL};
    int64_t count = 0;
    double sum = pp_sum(t->eng.pp, pp_forward_only(t->eng.pp, &cb, &count));
    count = (int64_t)pp_sum(t->eng.pp, (double)count);
    double all = dp_sum(t->eng.dp, (double)count);
    mtp_losses(t, t->met.mtp.val, all); /* the modules' on the same windows */
    return dp_sum(t->eng.dp, sum) / all;
}

/* train.on_spike: is this step's loss or gradient norm a spike against the recent steps? Both are
 * global, so every rank decides the same. A step that is not one joins the windows. */
static int is_spike(trainer *t, double loss, double norm) {
    const ust_config *c = t->cfg;
    if (c->train.on_spike == SPIKE_NONE) return 0;
    double zl = spike_z(&t->loss_w, loss), zn = spike_z(&t->norm_w, norm);
    if (zl > c->train.spike_zscore || zn > c->train.spike_zscore) {
        if (t->rank0)
            printf("spike at step %lld: loss %.4f (z %.1f), grad norm %.3f (z %.1f) over the last "
                   "%d steps, samples [%lld, %lld)\n",
                   (long long)t->step + 1, loss, zl, norm, zn, c->train.spike_window,
                   (long long)t->sample_index, (long long)(t->sample_index + t->batch_size));
        return 1;
    }
    spike_push(&t->loss_w, loss);
    spike_push(&t->norm_w, norm);
    return 0;
}

/* Test fault UST_FAULT_HANG_STEP=N (with UST_FAULT_HANG_RANK=R, default 1): global rank R loops
 * in compute at step N, forever, as a rank stuck in a kernel would; its peers must name it. */
static void fault_hang(const trainer *t) {
    const char *step = getenv("UST_FAULT_HANG_STEP"), *rank = getenv("UST_FAULT_HANG_RANK");
    if (!step || atoll(step) != t->step + 1 || t->rt->rank != (rank ? atoi(rank) : 1)) return;
    for (volatile uint64_t spin = 0;; spin++) {
    }
}

/* Test fault UST_FAULT_DIE_STEP=N (UST_FAULT_DIE_RANK=R, default 1): global rank R dies
 * (SIGKILL) at step N, on a job's first start only (UST_RESTART_COUNT unset or 0). */
static void fault_die(const trainer *t) {
    const char *step = getenv("UST_FAULT_DIE_STEP"), *rank = getenv("UST_FAULT_DIE_RANK");
    if (step && atoll(step) == t->step + 1 && t->rt->rank == (rank ? atoi(rank) : 1) &&
        t->restarts == 0)
        raise(SIGKILL);
}

/* One step: forward and backward, the norm, the update (unless skipped or stopped). Returns 0,
 * or UST_EXIT_RUNTIME for a non-finite loss under on_nan: stop. *spiked: train.on_spike found a
 * spike, whose update was not made. */
static int train_step(trainer *t, double *loss, double *norm, double *lr, int *finite,
                      int *spiked) {
    const ust_config *c = t->cfg;
    fault_hang(t);
    fault_die(t);
    train_stats_begin(t); /* before train_qk_begin: a stats step tracks the logits */
    train_qk_begin(t);
    *loss = forward_backward(t);
    *norm = dp_grad_norm(t->eng.dp);
    double mult = 1; /* train.batch_ramp.sqrt_lr: the ramp's smaller batches take smaller steps */
    if (c->train.batch_ramp.sqrt_lr)
        mult = sqrt((double)t->batch_size / c->train.global_batch_size);
    *lr = optim_lr(c, t->step) * mult;
    *finite = isfinite(*loss) && isfinite(*norm);
    *spiked = *finite && is_spike(t, *loss, *norm);
    if (!*finite && c->train.on_nan == ONNAN_STOP) {
        if (t->rank0)
            fprintf(stderr,
                    "ustrain: error: non-finite %s at step %lld (loss %g, grad norm %g); stopping "
                    "(train.on_nan: stop)\n",
                    isfinite(*loss) ? "gradient norm" : "loss", (long long)t->step + 1, *loss,
                    *norm);
        return UST_EXIT_RUNTIME;
    }
    double t0 = log_now_s();
    train_stats_before(t);
    if (*finite && !*spiked)
        dp_optimizer_step(t->eng.dp, *lr, mult, optim_clip_scale(c, *norm), t->step);
    train_stats_after(t);
    train_qk_end(t, *finite && !*spiked);
    train_trace_span(t, TRACE_COMPUTE, "optimizer", t0);
    if (t->eng.has_moe) /* dualpipe: the mirror's copies of these layers routed the other half */
        model_moe_end_step(t->eng.m, dp_sum_replicas, *finite && !*spiked, dp_add_to_param,
                           t->eng.dp);
    return 0;
}

/* train.steps: 0 on a fresh start measures the starting weights (an import, or the init) on the
 * validation set and writes them as checkpoint step 0 (unless checkpoint.every is 0): an import
 * converted, ready to export. */
static int step_zero(trainer *t) {
    const ust_config *c = t->cfg;
    if (t->feed.val) {
        double vl = validation_loss(t);
        if (t->rank0) printf("step 0: val_loss %.7f (the starting weights)\n", vl);
        for (int k = 0; t->rank0 && k < t->met.mtp.n; k++)
            printf("step 0: val_mtp_loss_%d %.7f\n", k + 1, t->met.mtp.val[k]);
    }
    ust_err e;
    if (c->checkpoint.dir[0] && c->checkpoint.every > 0 && train_ckpt_save(t, &e)) {
        fprintf(stderr, "ustrain: error: checkpoint at step 0 failed: %s\n", e.msg);
        return -1;
    }
    return 0;
}

/* One pass of the loop: the step, its report, validation, the logged line, a rewind after a
 * spike, the async save's completion, and the checkpoint or stop after it. 0: go on; 1: stop;
 * -1: failed. */
static int run_step(trainer *t, const train_opts *opts) {
    const ust_config *c = t->cfg;
    train_metrics_profile(t, opts);
    train_trace_step_begin(t);
    step_mark mark = train_metrics_mark(t);
    double loss, norm, lr;
    int finite, spiked;
    ust_err re;
    if (train_feed_ramp(t, &re)) {
        fprintf(stderr, "ustrain: error: train.batch_ramp: %s\n", re.msg);
        return -1;
    }
    train_feed_assign(t);
    if (train_step(t, &loss, &norm, &lr, &finite, &spiked)) return -1;
    log_step s = train_metrics_report(t, &mark, loss, norm, lr, finite, spiked);
    train_stats_report(t, &s);
    t->step++;
    t->sample_index += t->batch_size;
    t->last_loss = loss;
    train_metrics_count(t, &s);
    int last = t->step == c->train.steps;
    if (t->feed.val && (t->step % c->data.val_every == 0 || last)) {
        s.val_loss = validation_loss(t);
        memcpy(s.mtp.val, t->met.mtp.val, sizeof s.mtp.val);
    }
    train_tasks_step(t, opts, &s);
    if (t->rank0 && !opts->quiet &&
        (t->step % c->logging.every == 0 || last || !isnan(s.val_loss) || s.layers.n ||
         s.tasks.n)) {
        log_step_line(&s);
        log_step_json(&t->met.log, &s);
    }
    train_trace_step_end(t, &s);
    /* logging.strict: rank 0's failed write stops every rank here, together */
    if (c->logging.strict && train_any_rank(t, t->met.log.failed)) {
        if (!t->rank0)
            fprintf(stderr, "ustrain: error: stopping: rank 0 could not write its logs\n");
        return -1;
    }
    ust_err e;
    if (spiked && c->train.on_spike == SPIKE_REWIND && train_ckpt_rewind(t, &e)) {
        fprintf(stderr, "ustrain: error: spike: cannot rewind: %s\n", e.msg);
        return -1;
    }
    double t0 = log_now_s();
    int polled = train_ckpt_poll(t, 0, &e);
    train_trace_span(t, TRACE_IO, "checkpoint poll", t0);
    if (polled) {
        fprintf(stderr, "ustrain: error: checkpoint at step %lld failed: %s\n",
                (long long)t->ck.pending_step, e.msg);
        return -1;
    }
    t0 = log_now_s();
    int after = train_ckpt_after_step(t);
    train_trace_span(t, TRACE_IO, "checkpoint", t0);
    return after;
}

static int loop(trainer *t, const train_opts *opts, train_result *res) {
    const ust_config *c = t->cfg;
    train_metrics_begin(t, opts, res);
    /* a stop asked for during start-up: nothing was trained, so nothing needs saving */
    if (t->step < c->train.steps && train_any_rank(t, train_stop_asked())) {
        if (t->rank0)
            printf("received signal before the first step: stopped, nothing to checkpoint\n");
        return UST_EXIT_OK;
    }
    if (c->train.steps == 0 && t->fresh && step_zero(t)) return UST_EXIT_RUNTIME;
    while (t->step < c->train.steps) {
        int after = run_step(t, opts);
        if (after < 0) return UST_EXIT_RUNTIME;
        if (after) break;
    }
    if (train_ckpt_finish(t, opts->quiet)) return UST_EXIT_RUNTIME;
    train_metrics_end(t, res);
    return UST_EXIT_OK;
}

static int run_with(const ust_config *cfg, ust_runtime *rt, const train_opts *opts,
                    train_result *res) {
    trainer t;
    ust_err e;
    /* Setup failures are usage errors found before training; ranks exit on their own (a rank
     * whose peers failed waits at most dist.timeout_s in its next collective). */
    if (train_setup(&t, cfg, rt, opts->profile ? TRAIN_SETUP_PROFILE : 0, &e) ||
        train_ckpt_check_seq_len(&t, &e)) {
        fprintf(stderr, "ustrain: error: %s\n", e.msg);
        train_teardown(&t);
        return UST_EXIT_USAGE;
    }
    if (train_metrics_open(&t, opts) || train_trace_open(&t) || train_stats_open(&t)) {
        train_teardown(&t);
        return UST_EXIT_USAGE;
    }
    ckpt_lock_claim(&t.ck.lock); /* sure to start: only now is .lock rewritten */
    if (t.rank0 && opts->write_config) train_write_config(cfg);
    train_metrics_header(&t, opts);
    train_install_stop_handlers(); /* `ustrain train` did already, before the bootstrap */
    int rc = loop(&t, opts, res);
    train_stats_close(&t);
    train_trace_close(&t, rc == UST_EXIT_OK);
    train_stop_handlers_reset();
    train_metrics_result(&t, rc, opts, res);
    log_close(&t.met.log); /* its last flush too is checked: a failure under strict is exit 1 */
    if (rc == UST_EXIT_OK && t.met.log.failed) rc = UST_EXIT_RUNTIME;
    train_teardown(&t);
    return rc;
}

int train_run(const ust_config *cfg, ust_runtime *rt, const train_opts *opts, train_result *res) {
    train_result dummy;
    if (!res) res = &dummy;
    memset(res, 0, sizeof *res);
    if (rt) return run_with(cfg, rt, opts, res);
    ust_runtime own;
    ust_err e;
    if (train_runtime_init(&own, cfg, &e)) {
        fprintf(stderr, "ustrain: error: %s\n", e.msg);
        return UST_EXIT_USAGE;
    }
    int rc = run_with(cfg, &own, opts, res);
    train_runtime_finalize(&own);
    return rc;
}

/* Evaluation: the run set up as for training (the checkpoint resumed, or model.init_from), then
 * one validation pass over data.val, nothing trained or written. */
int train_eval(const ust_config *cfg, ust_runtime *rt, double *loss) {
    trainer t;
    ust_err e;
    int rc = train_setup(&t, cfg, rt, TRAIN_SETUP_EVAL, &e);
    if (rc == 0 && !t.feed.val) rc = ust_errf(&e, "eval: no data.val to evaluate (val_steps 0?)");
    if (rc) fprintf(stderr, "ustrain: error: %s\n", e.msg);
    if (rc == 0) *loss = validation_loss(&t);
    train_teardown(&t);
    return rc ? UST_EXIT_USAGE : 0;
}
