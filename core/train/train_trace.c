/* train_trace.c: logging.trace, the run's timeline (core/base/trace.h). At start-up every rank
 * measures its clock against rank 0's through the bootstrap store and hangs its trace on the
 * communicators (comm_ctx_set_trace), so that the collectives, the pipeline's actions and the
 * step loop's parts record themselves during steps first..last; after step last each rank
 * writes DIR/rank_R.json and rank 0 merges them into DIR/trace.json. Tracing never fails the
 * run: a write that fails warns and the run goes on. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fs.h"
#include "train_internal.h"

/* logging.trace.steps as first, last; 0 when tracing is off. */
static int trace_steps(const ust_config *cfg, int64_t *first, int64_t *last) {
    *first = *last = 0;
    if (!cfg->logging.trace_steps[0]) return 0;
    long long a, b;
    char extra;
    if (sscanf(cfg->logging.trace_steps, "%lld,%lld%c", &a, &b, &extra) != 2) return -1;
    *first = a, *last = b;
    return 1;
}

static void trace_dir(const ust_config *cfg, char *out, size_t cap) {
    if (cfg->logging.trace_dir[0])
        snprintf(out, cap, "%s", cfg->logging.trace_dir);
    else
        snprintf(out, cap, "%s/trace", cfg->run.out_dir);
}

int train_trace_check(const ust_config *cfg, ust_err *e) {
    int64_t a, b;
    int on = trace_steps(cfg, &a, &b);
    if (on < 0 || (on && a > b))
        return ust_errf(e,
                        "logging.trace.steps: [%s]: expected two steps [first, last] with "
                        "first <= last, e.g. [3, 5]",
                        cfg->logging.trace_steps);
    if (on && b > cfg->train.steps)
        return ust_errf(e,
                        "logging.trace.steps: [%lld, %lld] ends after the run's last step %lld "
                        "(train.steps); trace steps within 1..%lld",
                        (long long)a, (long long)b, (long long)cfg->train.steps,
                        (long long)cfg->train.steps);
    return 0;
}

/* The trace directory exists and takes a file; else why not, in e. */
static int probe_dir(const char *dir, int rank, ust_err *e) {
    if (fs_mkdir_p(dir, e)) return -1;
    char path[UST_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/.probe-%d", dir, rank);
    FILE *f = fopen(path, "w");
    if (!f) return ust_errf(e, "cannot write in %s: %s", dir, strerror(errno));
    fclose(f);
    unlink(path);
    return 0;
}

/* This rank's clock minus rank 0's, through the store: every rank reads its clock as it leaves
 * the same fence, three times; the estimate is rank 0's reading minus ours in the round whose
 * fence this rank left soonest (the least skew), *err the spread of the rounds. */
static double clock_offset(ust_boot *b, double *err) {
    double best = 0, lo = INFINITY, hi = -INFINITY, best_len = INFINITY;
    ust_err e;
    for (int r = 0; r < 3; r++) {
        double t0 = log_now_s();
        if (boot_fence(b, &e)) break;
        double mine = log_now_s(), zero = mine;
        char key[32];
        snprintf(key, sizeof key, "ust.trace.clock.%d", r);
        if (boot_put(b, key, &mine, sizeof mine, &e) || boot_fence(b, &e) ||
            boot_get(b, 0, key, &zero, sizeof zero, &e) != (int)sizeof zero)
            break;
        double off = zero - mine;
        lo = fmin(lo, off), hi = fmax(hi, off);
        if (mine - t0 < best_len) best_len = mine - t0, best = off;
    }
    *err = hi >= lo ? hi - lo : 0;
    return best;
}

int train_trace_open(trainer *t) {
    int64_t a, b;
    if (trace_steps(t->cfg, &a, &b) <= 0) return 0;
    char dir[UST_PATH_MAX];
    trace_dir(t->cfg, dir, sizeof dir);
    ust_err e;
    int bad = probe_dir(dir, t->rt->rank, &e) != 0;
    if (bad) fprintf(stderr, "ustrain: error: logging.trace.dir %s: %s\n", dir, e.msg);
    if (train_any_rank(t, bad)) return -1;
    double err = 0, off = t->rt->world > 1 ? clock_offset(&t->rt->boot, &err) : 0;
    ust_trace *tr = trace_create(t->rt->rank, a, b);
    trace_set_offset(tr, off);
    comm_ctx_set_trace(t->rt->comm, tr);
    model_set_trace(t->eng.m, tr);
    /* every rank's figures to rank 0, which reports the worst */
    double mine[2] = {off, err}, worst[2] = {fabs(off), err};
    if (t->rt->world > 1 &&
        boot_put(&t->rt->boot, "ust.trace.offset", mine, sizeof mine, &e) == 0 &&
        boot_fence(&t->rt->boot, &e) == 0 && t->rank0)
        for (int r = 1; r < t->rt->world; r++)
            if (boot_get(&t->rt->boot, r, "ust.trace.offset", mine, sizeof mine, &e) ==
                (int)sizeof mine)
                worst[0] = fmax(worst[0], fabs(mine[0])), worst[1] = fmax(worst[1], mine[1]);
    if (t->rank0)
        printf("trace: steps %lld..%lld into %s/trace.json; clocks aligned to rank 0 through the "
               "bootstrap store: largest offset %.3f ms, spread of three measurements %.3f ms\n",
               (long long)a, (long long)b, dir, 1e3 * worst[0], 1e3 * worst[1]);
    return 0;
}

void train_trace_step_begin(trainer *t) {
    ust_trace *tr = comm_ctx_trace(t->rt->comm);
    if (tr) trace_step(tr, t->step + 1);
}

void train_trace_span(trainer *t, int tid, const char *name, double t0) {
    ust_trace *tr = comm_ctx_trace(t->rt->comm);
    if (trace_on(tr)) trace_span(tr, tid, name, t0, log_now_s(), "");
}

/* checkpoint.async's background part, from the writer thread's start to its end, as an
 * asynchronous event (it runs beside the steps, on no thread of the timeline's). */
void train_trace_ckpt_write(trainer *t) {
    ust_trace *tr = comm_ctx_trace(t->rt->comm);
    const double *s = t->ck.pending_s;
    if (!trace_on(tr) || !(s[1] >= s[0] && s[0] > 0)) return;
    char args[64];
    snprintf(args, sizeof args, "\"step\": %lld", (long long)t->ck.pending_step);
    trace_async(tr, "checkpoint", "checkpoint write (async)",
                (1ull << 63) | (uint64_t)t->ck.pending_step, /* apart from comm ids */ s[0], s[1],
                args);
}

/* After step last: each rank's file, then (after a barrier, so that all are there) rank 0's
 * merge. Every rank reaches the barrier whatever its write did. */
static void finish(trainer *t, ust_trace *tr) {
    char dir[UST_PATH_MAX], path[UST_PATH_MAX + 32], meta[256];
    trace_dir(t->cfg, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/rank_%d.json", dir, t->rt->rank);
    ust_err e;
    int bad = trace_write(tr, path, &e) != 0;
    if (bad)
        fprintf(stderr, "ustrain[rank %d]: warning: %s; the run goes on\n", t->rt->rank, e.msg);
    comm_ctx_set_trace(t->rt->comm, NULL);
    model_set_trace(t->eng.m, NULL);
    trace_free(tr);
    if (train_any_rank(t, bad) || !t->rank0) return;
    snprintf(meta, sizeof meta, "\"world\": %d, \"pp\": %d, \"pp_schedule\": \"%s\"", t->rt->world,
             t->cfg->parallel.pp, pps_kind_name(pp_kind(t->cfg)));
    snprintf(path, sizeof path, "%s/trace.json", dir);
    if (trace_merge(dir, t->rt->world, path, meta, &e))
        fprintf(stderr, "ustrain: warning: %s; the run goes on\n", e.msg);
    else
        printf("trace: %s (%d ranks; open it in https://ui.perfetto.dev or chrome://tracing, or "
               "scripts/plot --timeline)\n",
               path, t->rt->world);
}

void train_trace_step_end(trainer *t, const log_step *s) {
    ust_trace *tr = comm_ctx_trace(t->rt->comm);
    if (!tr) return;
    if (trace_on(tr)) {
        char name[32], args[256];
        snprintf(name, sizeof name, "step %lld", (long long)t->step);
        snprintf(args, sizeof args,
                 "\"step\": %lld, \"loss\": %.6f, \"pp_bubble\": %.6f, \"pp_bubble_sim\": %.6f, "
                 "\"pp_bubble_analytic\": %.6f",
                 (long long)t->step, s->loss, isnan(s->pp.bubble) ? -1 : s->pp.bubble,
                 isnan(s->pp.sim) ? -1 : s->pp.sim, isnan(s->pp.analytic) ? -1 : s->pp.analytic);
        trace_span(tr, TRACE_COMPUTE, name, trace_step_start(tr), log_now_s(), args);
    }
    if (t->step >= trace_last(tr)) finish(t, tr);
}

/* The run ended before step last (a stop): what was traced is written; on a failure only freed
 * (the ranks may not all be here). */
void train_trace_close(trainer *t, int ok) {
    ust_trace *tr = comm_ctx_trace(t->rt->comm);
    if (!tr) return;
    if (ok) {
        finish(t, tr);
        return;
    }
    comm_ctx_set_trace(t->rt->comm, NULL);
    model_set_trace(t->eng.m, NULL);
    trace_free(tr);
}
