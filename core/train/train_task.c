/* train_task: multiple-choice examples through the forward-only pipeline walk, B windows per
 * micro-batch, each window's summed per-token losses its example's negative log-likelihood; the
 * scores from those; eval.tasks during training. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "train_internal.h"

/* ------------------------------------------------------------------ scores */

task_scores train_task_score(const task_set *s, const double *loglik, FILE *out) {
    int right = 0, right_norm = 0;
    double sum = 0;
    for (int i = 0; i < s->n; i++) {
        const task_item *it = &s->items[i];
        int best = 0, best_norm = 0;
        double top = -INFINITY, top_norm = -INFINITY;
        for (int c = 0; c < it->nchoices; c++) {
            int64_t k = it->first + c;
            if (loglik[k] > top) top = loglik[k], best = c;
            if (loglik[k] / s->chars[k] > top_norm)
                top_norm = loglik[k] / s->chars[k], best_norm = c;
        }
        right += best == it->label, right_norm += best_norm == it->label;
        sum += loglik[it->first + it->label];
        if (!out) continue;
        fprintf(out, "{\"line\": %d, \"label\": %d, \"loglik\": [", it->line, it->label);
        for (int c = 0; c < it->nchoices; c++)
            fprintf(out, "%s%.9g", c ? ", " : "", loglik[it->first + c]);
        fprintf(out, "], \"pred\": %d, \"pred_norm\": %d}\n", best, best_norm);
    }
    return (task_scores){(double)right / s->n, (double)right_norm / s->n, sum / s->n};
}

/* ------------------------------------------------------------------ log-likelihoods */

/* One forward-only walk's examples: micro-batch mb's window b holds example first + mb B + b. */
typedef struct {
    trainer *t;
    const task_set *s;
    int64_t first;
    double *ll;  /* per example: minus the sum of its target losses on this rank */
    float *host; /* one micro-batch's per-token losses */
} task_pass;

static const ust_batch *pass_load(void *ctx, int mb) {
    task_pass *p = ctx;
    const task_set *s = p->s;
    int B = p->t->cfg->train.micro_batch_size, W = p->t->cfg->train.seq_len + 1;
    for (int b = 0; b < B; b++) {
        int64_t k = p->first + (int64_t)mb * B + b,
                n = k < s->nex ? s->start[k + 1] - s->start[k] : 0;
        int32_t *w = p->t->feed.samples + (int64_t)b * W;
        uint8_t *f = p->t->feed.flags + (int64_t)b * W;
        if (n) memcpy(w, s->tokens + s->start[k], (size_t)n * sizeof *w);
        if (n) memcpy(f, s->flags + s->start[k], (size_t)n);
        for (int64_t i = n; i < W; i++) w[i] = s->eot, f[i] = 2; /* padding: never a target */
    }
    return train_feed_windows(p->t);
}

/* The head's losses of micro-batch mb, window by window (this rank's tokens of each). */
static void pass_forwarded(void *ctx, int mb, int chunk) {
    task_pass *p = ctx;
    trainer *t = p->t;
    const float *dev = model_chunk_losses(t->eng.m, chunk);
    if (!dev) return;
    int B = t->cfg->train.micro_batch_size, Tl = t->feed.Tl;
    t->eng.ops->to_host(t->eng.ops, p->host, dev, (size_t)B * Tl * sizeof(float));
    for (int b = 0; b < B; b++) {
        int64_t k = p->first + (int64_t)mb * B + b;
        double sum = 0;
        for (int j = 0; j < Tl && k < p->s->nex; j++) sum += p->host[b * Tl + j];
        if (k < p->s->nex) p->ll[k] -= sum;
    }
}

/* Every example's log-likelihood into ll on every rank: the forward-only walk of
 * cfg_val_micro_batches micro-batches, as often as the examples need. Only the last stage has
 * losses (the pipeline sum brings them to all); each cp rank has its own tokens of a window
 * and every dp replica the same windows (the dp x cp sum is dp times the window's). */
int train_task_logliks(trainer *t, const task_set *s, double *ll) {
    const ust_config *c = t->cfg;
    int64_t per = (int64_t)cfg_val_micro_batches(c) * c->train.micro_batch_size;
    task_pass p = {t, s, 0, ll, malloc((size_t)c->train.micro_batch_size * t->feed.Tl * 4)};
    UST_ASSERT(p.host, "out of memory");
    pp_callbacks cb = {&p, pass_load, NULL, pass_forwarded};
    memset(ll, 0, (size_t)s->nex * sizeof *ll);
    for (; p.first < s->nex; p.first += per) {
        int64_t count = 0;
        pp_forward_only(t->eng.pp, &cb, &count);
    }
    free(p.host);
    for (int64_t k = 0; k < s->nex; k++)
        ll[k] = dp_sum(t->eng.dp, pp_sum(t->eng.pp, ll[k])) / c->parallel.dp;
    return 0;
}

int train_eval_task(const ust_config *cfg, ust_runtime *rt, const task_set *s, double *ll) {
    trainer t;
    ust_err e;
    int rc = train_setup(&t, cfg, rt, TRAIN_SETUP_EVAL, &e);
    if (rc) fprintf(stderr, "ustrain: error: %s\n", e.msg);
    if (rc == 0) train_task_logliks(&t, s, ll);
    train_teardown(&t);
    return rc ? UST_EXIT_USAGE : 0;
}

/* ------------------------------------------------------------------ during training */

/* eval.tasks: each task due at this step (its every, and the last step) is scored into s->tasks
 * on every rank; rank 0 prints its line. */
void train_tasks_step(trainer *t, const train_opts *opts, log_step *s) {
    const ust_config *c = t->cfg;
    cfg_task tasks[CFG_MAX_TASKS];
    int n = opts->tasks ? cfg_eval_tasks(c, tasks) : 0;
    s->tasks.n = 0;
    for (int i = 0; i < n && s->tasks.n < LOG_MAX_TASKS; i++) {
        if (t->step % tasks[i].every && t->step != c->train.steps) continue;
        const task_set *ts = &opts->tasks[i];
        double *ll = malloc((size_t)ts->nex * sizeof *ll), t0 = log_now_s();
        UST_ASSERT(ll, "out of memory");
        train_task_logliks(t, ts, ll);
        task_scores sc = train_task_score(ts, ll, NULL);
        free(ll);
        int j = s->tasks.n++;
        snprintf(s->tasks.name[j], sizeof s->tasks.name[j], "%s", tasks[i].name);
        s->tasks.items[j] = ts->n;
        s->tasks.acc[j] = sc.acc, s->tasks.acc_norm[j] = sc.acc_norm,
        s->tasks.loglik[j] = sc.loglik;
        if (t->rank0)
            printf("step %lld: task %s: %d items, acc %.4f acc_norm %.4f loglik %.6f (%.1f "
                   "items/s)\n",
                   (long long)t->step, tasks[i].name, ts->n, sc.acc, sc.acc_norm, sc.loglik,
                   ts->n / (log_now_s() - t0 + 1e-9));
    }
}
