/* train_metrics.c: the trainer's figures: each step's report (time, throughput, MFU against the
 * peak, memory, communication, pipeline, MoE, data), the loop's totals, and the printed
 * summaries of a run (its header, the done line, device memory, the op profile). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops_prof.h"
#include "plan.h"
#include "train_internal.h"

static uint64_t bytes_sent(ust_comm *c) {
    const comm_counters *k = comm_get_counters(c);
    uint64_t total = 0;
    for (int i = 0; i < COMM_NKINDS; i++) total += k->bytes[i];
    return total;
}

/* Dense bf16 peak of the GPUs ustrain is tuned for (H100/H200 SXM); set logging.peak_flops for
 * others. On CPU the backend's own measured sgemm rate is the honest denominator. */
#define GPU_PEAK_FLOPS 989e12

static double peak_flops(trainer *t) {
    if (t->cfg->logging.peak_flops > 0) return t->cfg->logging.peak_flops;
    if (t->cfg->run.device == DEV_CUDA) return GPU_PEAK_FLOPS;
    double measured =
        ops_measure_sgemm_flops(t->eng.ops, 1024, 8); /* ~80 ms; smaller under-report */
    /* Test fault: UST_FAULT_PEAK_SCALE=F scales the measurement, as a busy machine would. */
    const char *scale = getenv("UST_FAULT_PEAK_SCALE");
    return scale ? measured * atof(scale) : measured;
}

/* A CPU peak measured while the machine was busy can be below what a step then achieves. The
 * rate a step reached is a rate this rank can reach, so it becomes the denominator from then
 * on: MFU never exceeds 100%. A configured peak (logging.peak_flops) and the GPU table stay. */
static double raise_measured_peak(trainer *t, double peak, double fpt, const log_step *s) {
    double achieved = fpt * s->tokens_per_s / t->rt->world; /* one rank's share */
    if (t->cfg->logging.peak_flops > 0 || t->cfg->run.device == DEV_CUDA || achieved <= peak)
        return peak;
    if (t->rank0)
        printf("mfu: step %lld ran at %.3g FLOP/s per rank, above the sgemm peak measured at "
               "start-up (%.3g, on a busy machine): that rate is the peak from now on\n",
               (long long)s->step, achieved, peak);
    return achieved;
}

step_mark train_metrics_mark(trainer *t) {
    step_mark m = {.t0 = log_now_s()};
    for (int k = 0; k < TOPO_NKINDS; k++) {
        const ust_comm *c = t->rt->topo.comm[k];
        m.wait_s[k] = c ? comm_get_counters(c)->wait_s : 0;
        m.bytes[k] = c ? bytes_sent(t->rt->topo.comm[k]) : 0;
    }
    m.ep_internode = t->eng.has_moe ? t->eng.ep.bytes_internode : 0;
    return m;
}

/* The figures of the step just done (s already holds step, loss, lr, norm and time). */
static void measure_step(trainer *t, const step_mark *m, double fpt, double peak, log_step *s) {
    double tokens = (double)t->batch_size * t->cfg->train.seq_len;
    s->tokens_per_s = tokens / (s->ms / 1e3);
    s->mfu = fpt * s->tokens_per_s / (peak * t->rt->world); /* peak is one rank's */
    s->mem.peak = t->eng.arena.peak;
    step_mark now = train_metrics_mark(t);
    s->comm.bytes_tp = now.bytes[TOPO_TP] - m->bytes[TOPO_TP];
    s->comm.tp_ms = 1e3 * (now.wait_s[TOPO_TP] - m->wait_s[TOPO_TP]);
    /* the context-parallel group and, under a2a+ring, its Ulysses and ring sub-groups */
    static const topo_kind cp_groups[] = {TOPO_CP, TOPO_CPA, TOPO_CPR};
    s->comm.cp_wait_ms = 0;
    s->comm.bytes_cp = 0;
    for (int i = 0; i < 3; i++) {
        s->comm.cp_wait_ms += 1e3 * (now.wait_s[cp_groups[i]] - m->wait_s[cp_groups[i]]);
        s->comm.bytes_cp += now.bytes[cp_groups[i]] - m->bytes[cp_groups[i]];
    }
    s->comm.ep_ms = 1e3 * (now.wait_s[TOPO_EP] - m->wait_s[TOPO_EP]);
    s->comm.ep_logged = t->eng.has_moe && t->cfg->parallel.ep > 1;
    s->comm.bytes_ep = now.bytes[TOPO_EP] - m->bytes[TOPO_EP];
    s->comm.bytes_ep_internode = now.ep_internode - m->ep_internode;
    s->comm.bytes_mirror = now.bytes[TOPO_MIRROR] - m->bytes[TOPO_MIRROR];
    s->mem.params = t->eng.arena.bytes[MEM_PARAMS];
    s->mem.grads = t->eng.arena.bytes[MEM_GRADS];
    s->mem.optim = t->eng.arena.bytes[MEM_OPTIM];
    s->mem.acts = t->eng.arena.bytes[MEM_ACTS];
}

/* Device allocations the CUDA backend has made so far (0 on the CPU). The step loop should make
 * none after its first step, which sizes the backend's scratch. */
static int64_t device_allocations(const trainer *t) {
    if (t->cfg->run.device != DEV_CUDA) return 0;
    ops_mem m;
    t->eng.backend->memory(t->eng.backend, &m);
    return m.allocations;
}

/* The report of the step just done (before t->step moves on). */
static log_step report_step(trainer *t, const step_mark *mark, double loss, double norm, double lr,
                            int finite, double fpt, double peak) {
    const ust_config *c = t->cfg;
    log_step s = {.step = t->step + 1,
                  .steps = c->train.steps,
                  .loss = loss,
                  .ce_loss = t->met.ce_loss,
                  .lr = lr,
                  .grad_norm = norm,
                  .ms = 1e3 * (log_now_s() - mark->t0),
                  .val_loss = NAN,
                  .max_logit = t->met.max_logit,
                  .qk_clipped = t->met.qk_clipped,
                  .mtp = t->met.mtp,
                  .pp.bubble = NAN,
                  .skipped = !finite,
                  .comm.bytes_dp = dp_bytes_sent(t->eng.dp)}; /* before validation's gathers */
    measure_step(t, mark, fpt, peak, &s);
    /* the cp group's bytes: two fp32 sums, the high and low 20 bits (exact for up to 16 ranks) */
    if (c->parallel.cp > 1) {
        uint64_t b = s.comm.bytes_cp;
        double hi = train_group_sum(t, TOPO_CP, (double)(b >> 20)),
               lo = train_group_sum(t, TOPO_CP, (double)(b & 0xFFFFF));
        s.comm.bytes_cp_all = (uint64_t)hi * 1048576u + (uint64_t)lo;
    }
    s.data.cp_docs = c->parallel.cp > 1 &&
                     (c->data.doc_mask || c->data.packing || c->train.seq_len_warmup.start > 0);
    if (s.data.cp_docs) /* the context-parallel group's, since the run began */
        s.data.cp_blocks_skipped = (int64_t)train_group_sum(t, TOPO_CP, (double)t->eng.cp.skipped);
    s.moe.n = model_moe_stats(t->eng.m, s.moe.layer, s.moe.load_max, s.moe.load_mean, s.moe.dropped,
                              LOG_MAX_MOE);
    for (int i = 0; i < s.moe.n; i++) {
        s.moe.ep = model_moe_rank_rows(t->eng.m, i, s.moe.rank_rows[i], LOG_MAX_EP);
        s.moe.E = model_moe_expert_load(t->eng.m, i, s.moe.experts[i], LOG_MAX_EXPERTS);
        s.moe.bias_range[i] = model_moe_bias_range(t->eng.m, i, dp_param_whole, t->eng.dp);
    }
    if (c->parallel.pp > 1) {
        pp_stats ps = pp_last_step_stats(t->eng.pp);
        s.pp.bubble = ps.bubble;
        s.pp.analytic = ps.analytic;
        s.comm.bytes_pp = ps.sent_bytes;
        s.pp.sim = ps.simulated;
        s.pp.op_ms[0] = ps.f_ms, s.pp.op_ms[1] = ps.b_ms, s.pp.op_ms[2] = ps.w_ms;
    }
    return s;
}

/* The loop's start: the peak MFU is measured against, and the steps the mean time leaves out. */
enum { RANK_FIGS = 3 }; /* the stragglers' figures of each rank: compute, wait, step */

void train_metrics_begin(trainer *t, const train_opts *opts, train_result *res) {
    train_metrics *m = &t->met;
    m->fpt = model_flops_per_token(t->eng.m);
    m->peak = peak_flops(t);
    m->sum_ms = 0;
    m->t_start = log_now_s();
    m->first = t->step;
    m->timed = 0;
    m->allocs_after_one = -1;
    res->peak_flops = m->peak;
    res->flops_per_token = m->fpt;
    m->untimed = opts->untimed_steps > 0 ? opts->untimed_steps : 1;
    m->all_timed = t->cfg->train.steps - m->first <= m->untimed;
    if (t->rt->world > 1) { /* the stragglers' exchange (gather_ranks) */
        size_t bytes = RANK_FIGS * (size_t)t->rt->world * sizeof(float);
        m->ranks_dev = t->eng.ops->alloc(t->eng.ops, bytes);
        m->ranks_host = malloc(bytes);
        UST_ASSERT(m->ranks_host, "out of memory");
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Stragglers: every rank's compute (the step less its waits on every group), wait and step time,
 * summed into a zeroed vector where each rank fills its own three (one all-reduce over the world);
 * the rank computing longest is the slowest, its compute over the median its slowdown. Every
 * logging.every steps and the last, on every rank (the condition is the step's alone). */
static void gather_ranks(trainer *t, const step_mark *mark, log_step *s) {
    int world = t->rt->world, every = t->cfg->logging.every;
    train_metrics *m = &t->met;
    if (!m->ranks_dev || (s->step % every != 0 && s->step != t->cfg->train.steps)) return;
    step_mark now = train_metrics_mark(t);
    double wait = 0;
    for (int k = 0; k < TOPO_NKINDS; k++) wait += now.wait_s[k] - mark->wait_s[k];
    float *h = m->ranks_host; /* rank i: compute, wait, step at RANK_FIGS * i */
    for (int i = 0; i < RANK_FIGS * world; i++) h[i] = 0;
    h[RANK_FIGS * t->rt->rank] = (float)(s->ms - 1e3 * wait);
    h[RANK_FIGS * t->rt->rank + 1] = (float)(1e3 * wait);
    h[RANK_FIGS * t->rt->rank + 2] = (float)s->ms;
    const ust_ops *o = t->eng.ops;
    size_t bytes = RANK_FIGS * (size_t)world * sizeof(float);
    o->to_device(o, m->ranks_dev, m->ranks_host, bytes);
    comm_req r = comm_allreduce(t->rt->topo.comm[TOPO_WORLD], m->ranks_dev, m->ranks_dev,
                                RANK_FIGS * (size_t)world, COMM_FP32, COMM_SUM);
    comm_wait(&r);
    o->to_host(o, m->ranks_host, m->ranks_dev, bytes);
    double *sorted = malloc(sizeof(double) * (size_t)world);
    UST_ASSERT(sorted, "out of memory");
    s->ranks.slowest = 0;
    for (int i = 0; i < world; i++) {
        const float *r = &h[RANK_FIGS * i];
        sorted[i] = r[0];
        if (r[0] > h[RANK_FIGS * s->ranks.slowest]) s->ranks.slowest = i;
        if (i < LOG_MAX_RANKS)
            s->ranks.compute_ms[i] = r[0], s->ranks.wait_ms[i] = r[1], s->ranks.step_ms[i] = r[2];
    }
    qsort(sorted, (size_t)world, sizeof *sorted, cmp_double);
    double median = world % 2 ? sorted[world / 2] : (sorted[world / 2 - 1] + sorted[world / 2]) / 2;
    free(sorted);
    s->ranks.n = world < LOG_MAX_RANKS ? world : LOG_MAX_RANKS;
    s->ranks.slowdown = median > 0 ? h[RANK_FIGS * s->ranks.slowest] / median : 1;
    s->ranks.flagged = s->ranks.slowdown > t->cfg->logging.straggler_ratio;
}

/* The op profiler (--profile) counts the timed steps only: it starts with the first of them. */
void train_metrics_profile(trainer *t, const train_opts *opts) {
    const train_metrics *m = &t->met;
    if (opts->profile &&
        (t->step == m->first + m->untimed || (m->all_timed && t->step == m->first)))
        ops_prof_enable(t->eng.ops, 1);
}

/* The report of the step just done, with its spike and the job's restarts; MFU against the
 * peak, raised when the step ran above it. */
log_step train_metrics_report(trainer *t, const step_mark *mark, double loss, double norm,
                              double lr, int finite, int spiked) {
    train_metrics *m = &t->met;
    log_step s = report_step(t, mark, loss, norm, lr, finite, m->fpt, m->peak);
    gather_ranks(t, mark, &s);
    s.spike = spiked ? (int)t->cfg->train.on_spike : 0;
    s.restarts = t->restarts;
    double raised = raise_measured_peak(t, m->peak, m->fpt, &s);
    if (raised > m->peak) s.mfu *= m->peak / raised, m->peak = raised;
    return s;
}

/* After the run's position moved past the step: the totals, the ETA and what the data gave. */
void train_metrics_count(trainer *t, log_step *s) {
    const ust_config *c = t->cfg;
    train_metrics *m = &t->met;
    if (t->step == m->first + 1) m->allocs_after_one = device_allocations(t);
    if (t->step > m->first + m->untimed || m->all_timed) m->sum_ms += s->ms, m->timed++;
    s->eta_s = (log_now_s() - m->t_start) / (t->step - m->first) * (c->train.steps - t->step);
    s->elapsed_s = log_now_s() - m->t_start;
    s->data.n = data_blend_count(t->feed.train) > 1 ? data_blend_count(t->feed.train) : 0;
    for (int d = 0; d < s->data.n; d++) s->data.samples[d] = t->feed.pos.consumed[d];
    s->data.samples_seen = t->sample_index;
    s->data.tokens_seen = t->sample_index * c->train.seq_len;
    s->data.target_tokens = t->feed.step_targets;
    s->data.pad_frac = c->data.packing
                           ? (double)t->feed.step_pad / (double)(t->batch_size * c->train.seq_len)
                           : NAN;
}

/* The loop's totals into res: steps, the mean of the timed steps, throughput and MFU. */
void train_metrics_end(trainer *t, train_result *res) {
    const train_metrics *m = &t->met;
    double tokens = (double)t->cfg->train.global_batch_size * t->cfg->train.seq_len;
    res->steps_done = t->step - m->first;
    res->final_loss = t->last_loss;
    if (m->allocs_after_one >= 0)
        res->device_allocs_after_first_step = device_allocations(t) - m->allocs_after_one;
    res->timed_steps = m->timed;
    res->mean_step_ms = m->timed ? m->sum_ms / m->timed : 0;
    res->tokens_per_s = m->timed ? tokens / (res->mean_step_ms / 1e3) : 0;
    res->peak_flops = m->peak;
    res->mfu = res->tokens_per_s * m->fpt / (m->peak * t->rt->world);
}

/* Rank 0's metrics file and TensorBoard events (none with --quiet); -1 after the error. */
int train_metrics_open(trainer *t, const train_opts *opts) {
    const ust_config *cfg = t->cfg;
    char err[1024];
    t->met.log.strict = cfg->logging.strict;
    if (t->rank0 && !opts->quiet &&
        log_open(&t->met.log, cfg->logging.metrics_file, cfg->logging.tensorboard_dir, t->step, err,
                 sizeof err)) {
        fprintf(stderr, "ustrain: error: %s\n", err);
        return -1;
    }
    return 0;
}

/* Rank 0's first line: the model, the steps and the memory measured against the plan. */
void train_metrics_header(trainer *t, const train_opts *opts) {
    const ust_config *cfg = t->cfg;
    mem_plan plan;
    plan_memory(cfg, &plan);
    if (!t->rank0 || opts->quiet) return;
    char b1[32], b2[32];
    printf("ustrain: %s %s, %lld parameters (%lld with vocabulary padding), %lld steps of %d x %d "
           "tokens (grad accum %d); memory %s (plan %s)\n",
           cfg->run.name, cfg->model.arch == ARCH_GPT2 ? "gpt2" : "llama",
           (long long)(plan.n_params - plan.n_pad_params), (long long)plan.n_params,
           (long long)cfg->train.steps, cfg->train.global_batch_size, cfg->train.seq_len,
           cfg_grad_accum(cfg), log_bytes(b1, 32, t->eng.arena.total),
           log_bytes(b2, 32, plan.total));
    if (t->ck.stage)
        printf("checkpoint.async: staging buffer %lld bytes of host memory (plan %.0f)\n",
               (long long)ckpt_stage_bytes(t->ck.stage), plan.ckpt_staging);
}

/* The run's done line and, on CUDA, where the device memory went. */
static void print_done(trainer *t, const train_result *res) {
    char b[32];
    printf("done: %lld steps, final loss %.4f, %.1f ms/step, %.0f tok/s, mfu %.1f%%, "
           "peak RSS %s\n",
           (long long)res->steps_done, res->final_loss, res->mean_step_ms, res->tokens_per_s,
           100 * res->mfu, log_bytes(b, 32, (double)res->peak_rss));
    if (t->cfg->run.device != DEV_CUDA) return;
    char b1[32], b3[32];
    printf("device memory: arena %s + backend scratch %s; %s in use on the device; %lld "
           "device allocations after the first step\n",
           log_bytes(b1, 32, (double)t->eng.arena.total),
           log_bytes(b3, 32, (double)res->device_backend_bytes),
           log_bytes(b, 32, (double)res->device_used),
           (long long)res->device_allocs_after_first_step);
}

/* After the loop (rc its exit code): the memory figures into res, and rank 0's summaries. */
void train_metrics_result(trainer *t, int rc, const train_opts *opts, train_result *res) {
    const ust_config *cfg = t->cfg;
    if (t->met.ranks_dev) t->eng.ops->free(t->eng.ops, t->met.ranks_dev);
    free(t->met.ranks_host);
    t->met.ranks_dev = NULL, t->met.ranks_host = NULL;
    res->arena_bytes = (double)t->eng.arena.total;
    for (int i = 0; i < MEM_NCAT && i < 6; i++)
        res->arena_by_cat[i] = (double)t->eng.arena.bytes[i];
    res->peak_rss = mem_peak_rss_bytes();
    if (cfg->run.device == DEV_CUDA) {
        ops_mem m;
        t->eng.backend->memory(t->eng.backend, &m);
        res->device_backend_bytes = m.backend_bytes;
        res->device_used = m.device_used;
    }
    if (rc == 0 && t->rank0 && !opts->quiet && res->steps_done > 0) print_done(t, res);
    if (rc == 0 && t->rank0 && !opts->quiet && res->steps_done == 0 && t->step >= cfg->train.steps)
        printf("run complete: step %lld of %lld (train.steps); nothing to train: raise "
               "train.steps to continue this run\n",
               (long long)t->step, (long long)cfg->train.steps);
    if (rc == 0 && t->rank0 && opts->profile && res->timed_steps > 0) {
        printf("per-op time on rank 0, mean of the %lld timed steps (each op between two syncs "
               "of the backend%s):\n",
               (long long)res->timed_steps,
               cfg->run.device == DEV_CUDA ? ", which the step times above include" : "");
        ops_prof_print(t->eng.ops, stdout, (int)res->timed_steps);
    }
}
