/* pp.c: runs a pipeline schedule (pp_schedule.h) on the model's chunks. */
#include "pp.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"

enum { NSTAT = 5 }; /* figures each rank shares after a step: busy, idle, mean F, B, W times */
enum { OP_F, OP_B, OP_W, OP_WHOLE_B, NOPS }; /* op_s / op_n: B split, B whole counted apart */

struct pp_state {
    const ust_config *cfg;
    const ust_ops *ops;
    model *m;
    ust_comm *pipe, *emb;
    const pps_schedule *sched; /* this rank's: all[rank] */
    int *slot;                 /* per action: the activation set of its (micro-batch, chunk) */
    pps_schedule fwd;          /* validation's forward-only schedule (cfg_val_micro_batches; n 0: none) */
    int *fwd_slot;             /* ... its actions' sets */
    int *cur;                  /* (mb * v + chunk) -> its set, as a walk goes over the actions */
    int p, v, nmb;
    float *scalar;      /* device: pp_sum's all-reduce, pp_last_step_stats' gather */
    comm_p2p *batch[2]; /* two batches: one in flight, one being built */
    int nbatch[2];
    char label[2][48]; /* each batch's transfers, named for the flight recorder */
    double busy_s, idle_s;
    uint64_t sent_bytes; /* last step: activations and gradients this rank sent */
    double op_s[NOPS];   /* last step: time in F, split B, W, whole B */
    int op_n[NOPS];
    pps_schedule *all;   /* every rank's schedule, for the simulation with measured costs */
    float *stats_host;   /* host: every rank's NSTAT figures (pp_last_step_stats) */
    int fault_skip_tied; /* test fault: UST_FAULT_PP_SKIP_TIED_SYNC=1 leaves the copies apart */
    int fault_skip_turn; /* test fault: UST_FAULT_PP_SKIP_TURN_GRAD=1: dualpipev's turn loses
                            the gradient it hands from chunk 1 to chunk 0 */
    double fault_slow_s; /* test fault: UST_FAULT_SLOW_RANK=R:ms: global rank R's steps take ms
                            longer, in its computation (a straggler) */
    double fault_op_s;   /* test fault: UST_FAULT_PP_OP_MS=ms: each F (W, split B) of a step takes
                            ms longer, a whole B twice that: op times no other process shares */
};

/* ------------------------------------------------------------------ planning */

ust_pp_schedule pp_kind(const ust_config *cfg) {
    return cfg->parallel.pp > 1 ? cfg->parallel.pp_schedule : PP_1F1B;
}

/* pps_build's flags for the config's schedule */
static int plan_flags(const ust_config *cfg) {
    int flags = cfg->parallel.pp_breadth_first ? PPS_BREADTH_FIRST : 0;
    /* dualpipev and dualpipe split B and W only where the model can defer weight gradients (not
     * in MoE layers, not under full recomputation: zb's own limits); otherwise their B's are
     * whole */
    if ((pp_kind(cfg) == PP_DUALPIPEV || pp_kind(cfg) == PP_DUALPIPE) &&
        (cfg->model.moe.num_experts > 0 || cfg->train.recompute == RECOMPUTE_FULL))
        flags |= PPS_NO_SPLIT;
    return flags;
}

int pp_plan(const ust_config *cfg, int pp_rank, pps_schedule *sched, int slots[MODEL_MAX_CHUNKS],
            ust_err *e) {
    /* one stage: plain gradient accumulation, each micro-batch's forward then its whole
     * backward (one activation set), whatever pp_schedule says */
    if (pps_build(sched, pp_kind(cfg), cfg->parallel.pp, cfg->parallel.vpp, cfg_grad_accum(cfg),
                  pp_rank, plan_flags(cfg), e))
        return -1;
    pps_slots(sched, NULL, slots);
    return 0;
}

/* ------------------------------------------------------------------ set-up */

/* Validation's walk (cfg_val_micro_batches): pps_build_forward's list, one activation
 * set per chunk (the model has at least one). */
static void forward_plan(pp_state *s, const ust_config *cfg, model *m) {
    int val = cfg_val_micro_batches(cfg);
    if (val < 1) return;
    ust_err e;
    int slots[MODEL_MAX_CHUNKS];
    UST_ASSERT(pps_build_forward(&s->fwd, s->sched->kind, s->p, s->v, val, s->sched->rank, &e) == 0,
               "%s", e.msg);
    s->fwd_slot = malloc((size_t)(s->fwd.n + 1) * sizeof *s->fwd_slot);
    UST_ASSERT(s->fwd_slot, "out of memory");
    pps_slots(&s->fwd, s->fwd_slot, slots);
    for (int c = 0; c < s->v; c++)
        UST_ASSERT(slots[c] <= model_chunk_slots(m, c),
                   "validation: chunk %d has no activation set", c);
}

pp_state *pp_create(const ust_config *cfg, const ust_ops *ops, ust_arena *arena, model *m,
                    ust_comm *pipe, ust_comm *emb, pps_schedule *sched) {
    pp_state *s = calloc(1, sizeof *s);
    UST_ASSERT(s, "out of memory");
    s->cfg = cfg;
    s->ops = ops;
    s->m = m;
    s->pipe = pipe;
    s->emb = emb && comm_size(emb) > 1 ? emb : NULL;
    /* every rank's schedule (the simulation of pp_last_step_stats needs them); this rank's is
     * the one pp_plan made */
    s->p = sched->p, s->v = sched->v, s->nmb = sched->m;
    s->all = calloc(s->p, sizeof *s->all);
    ust_err e;
    UST_ASSERT(s->all &&
                   pps_build_all(s->all, sched->kind, s->p, s->v, s->nmb, sched->flags, &e) == 0,
               "%s", e.msg);
    s->sched = &s->all[sched->rank];
    pps_free(sched);
    const char *fault = getenv("UST_FAULT_PP_SKIP_TIED_SYNC");
    s->fault_skip_tied = fault && atoi(fault) == 1;
    fault = getenv("UST_FAULT_PP_SKIP_TURN_GRAD");
    s->fault_skip_turn = fault && atoi(fault) == 1;
    fault = getenv("UST_FAULT_SLOW_RANK");
    if (fault && atoi(fault) == comm_global_rank(pipe, comm_rank(pipe)) && strchr(fault, ':'))
        s->fault_slow_s = atof(strchr(fault, ':') + 1) / 1e3;
    fault = getenv("UST_FAULT_PP_OP_MS");
    s->fault_op_s = fault ? atof(fault) / 1e3 : 0;
    int slots[MODEL_MAX_CHUNKS];
    s->slot = malloc((size_t)s->sched->n * sizeof *s->slot);
    int val = cfg_val_micro_batches(cfg);
    s->cur = calloc((size_t)(val > s->nmb ? val : s->nmb) * s->v, sizeof *s->cur);
    pps_slots(s->sched, s->slot, slots);
    for (int c = 0; c < s->v; c++)
        UST_ASSERT(slots[c] <= model_chunk_slots(m, c),
                   "chunk %d needs %d activation sets, the model has %d", c, slots[c],
                   model_chunk_slots(m, c));
    forward_plan(s, cfg, m);
    s->scalar = pp_alloc_scalars(arena, s->p);
    int most = s->sched->n > s->fwd.n ? s->sched->n : s->fwd.n;
    for (int k = 0; k < 2; k++) s->batch[k] = calloc((size_t)most + 1, sizeof(comm_p2p));
    s->stats_host = malloc((size_t)NSTAT * s->p * sizeof(float));
    return s;
}

void pp_stages(const ust_config *cfg, int pp_rank, const int slots[MODEL_MAX_CHUNKS],
               model_storage *st) {
    int p = cfg->parallel.pp, v = cfg->parallel.vpp, S = cfg_pp_stages(cfg);
    ust_pp_schedule kind = pp_kind(cfg);
    st->nchunks = v;
    for (int c = 0; c < v; c++) {
        model_stage *ch = &st->chunks[c];
        ch->stage = pps_model_stage(kind, p, pps_stage(kind, p, c, pp_rank));
        ch->lo = 0, ch->hi = cfg->model.n_layer;
        if (S > 1) cfg_stage_layers(cfg, ch->stage, &ch->lo, &ch->hi);
        ch->embed = ch->stage == 0;
        ch->head = ch->stage == S - 1;
        ch->slots = slots[c];
        /* dualpipe: the first half of the ranks own every stage once (chunk 0 the stage nearer
         * the input, chunk 1 its mirror's); the second half holds the same stages in the same
         * chunks again, summing its gradients with them (pp_sync_copies) */
        ch->copy = kind == PP_DUALPIPE && pp_rank >= p / 2;
    }
}

int pp_activation_sets(const ust_config *cfg, int pp_rank, int slots[MODEL_MAX_CHUNKS], int *zb,
                       ust_err *e) {
    *zb = 0;
    if (cfg->parallel.pp == 1) { /* gradient accumulation: each F is followed by its B */
        slots[0] = 1;
        return 0;
    }
    pps_schedule sched;
    if (pp_plan(cfg, pp_rank, &sched, slots, e)) return -1;
    *zb = pps_splits(&sched);
    pps_free(&sched);
    return 0;
}

int pp_activation_sets_all(const ust_config *cfg, int (*slots)[MODEL_MAX_CHUNKS], int *zb,
                           ust_err *e) {
    int p = cfg->parallel.pp;
    if (p == 1) return pp_activation_sets(cfg, 0, slots[0], zb, e);
    pps_schedule *all = calloc(p, sizeof *all);
    if (!all) return ust_errf(e, "pp schedule: out of memory");
    if (pps_build_all(all, pp_kind(cfg), p, cfg->parallel.vpp, cfg_grad_accum(cfg), plan_flags(cfg),
                      e)) {
        free(all);
        return -1;
    }
    for (int r = 0; r < p; r++) {
        pps_slots(&all[r], NULL, slots[r]);
        zb[r] = pps_splits(&all[r]);
    }
    pps_free_all(all, p);
    free(all);
    return 0;
}

/* Every rank's schedule of nmb micro-batches, and whether each fits the activation sets the
 * model has for the run's schedule (the most any of train.batch_ramp's steps may use). */
static int build_for(const ust_config *cfg, int nmb, pps_schedule *all, ust_err *e) {
    int p = cfg->parallel.pp, full[MODEL_MAX_CHUNKS], slots[MODEL_MAX_CHUNKS], zb;
    if (pps_build_all(all, pp_kind(cfg), p, cfg->parallel.vpp, nmb, plan_flags(cfg), e)) return -1;
    for (int r = 0; r < p; r++) {
        if (pp_activation_sets(cfg, r, full, &zb, e)) return -1;
        pps_slots(&all[r], NULL, slots);
        for (int c = 0; c < cfg->parallel.vpp; c++)
            if (slots[c] > full[c])
                return ust_errf(e,
                                "%d micro-batches need %d activation sets on pipeline rank %d, "
                                "more than the %d of the run's %d",
                                nmb, slots[c], r, full[c], cfg_grad_accum(cfg));
    }
    return 0;
}

int pp_check_micro_batches(const ust_config *cfg, int nmb, ust_err *e) {
    pps_schedule *all = calloc(cfg->parallel.pp, sizeof *all);
    if (!all) return ust_errf(e, "pp schedule: out of memory");
    int rc = build_for(cfg, nmb, all, e);
    pps_free_all(all, cfg->parallel.pp);
    free(all);
    return rc;
}

int pp_set_micro_batches(pp_state *s, int nmb, ust_err *e) {
    if (nmb == s->nmb) return 0;
    pps_schedule *all = calloc(s->p, sizeof *all);
    if (!all) return ust_errf(e, "pp schedule: out of memory");
    int rank = s->sched->rank, slots[MODEL_MAX_CHUNKS];
    if (build_for(s->cfg, nmb, all, e)) {
        pps_free_all(all, s->p);
        free(all);
        return -1;
    }
    int *slot = malloc(((size_t)all[rank].n + 1) * sizeof *slot);
    UST_ASSERT(slot, "out of memory");
    pps_slots(&all[rank], slot, slots);
    pps_free_all(s->all, s->p);
    free(s->all);
    free(s->slot);
    s->all = all, s->sched = &all[rank], s->slot = slot, s->nmb = nmb;
    return 0;
}

float *pp_alloc_scalars(ust_arena *arena, int p) {
    return mem_alloc(arena, MEM_COMM, (size_t)NSTAT * p * sizeof(float));
}

void pp_destroy(pp_state *s) {
    if (!s) return;
    pps_free_all(s->all, s->p);
    free(s->all);
    free(s->slot);
    free(s->cur);
    pps_free(&s->fwd);
    free(s->fwd_slot);
    free(s->batch[0]);
    free(s->batch[1]);
    free(s->stats_host);
    free(s);
}

/* ------------------------------------------------------------------ transfers */

/* The buffer a comm action reads or fills: activations cross at the chunk's input (receive)
 * or output (send), gradients in the slot's gradient buffer both ways. */
static comm_p2p transfer_of(pp_state *s, const pps_action *a, int slot) {
    comm_p2p t = {.peer = a->peer, .count = (size_t)model_boundary_numel(s->m)};
    switch (a->op) {
    case PPS_SEND_ACT:
        t.is_send = 1, t.buf = model_chunk_output(s->m, a->chunk, slot);
        break;
    case PPS_RECV_ACT:
        t.buf = model_chunk_input(s->m, a->chunk, slot);
        break;
    case PPS_SEND_GRAD:
        t.is_send = 1, t.buf = model_chunk_grad(s->m, a->chunk, slot);
        break;
    default: /* PPS_RECV_GRAD */
        t.buf = model_chunk_grad(s->m, a->chunk, slot);
        break;
    }
    return t;
}

typedef struct {
    int cur;      /* the batch being built */
    int inflight; /* a send-only batch is posted and not yet waited on */
    comm_req req; /* ... its request */
    int has_recv; /* the batch being built receives something */
    int sync;     /* a forward-only walk: every batch is waited on (pps_build_forward) */
} batch_state;

/* Posts the batch being built (after finishing the one in flight); waits for it when it
 * receives something, so the next computation finds its inputs. */
static void flush(pp_state *s, batch_state *b) {
    if (b->inflight) comm_wait(&b->req), b->inflight = 0;
    if (s->nbatch[b->cur] == 0) return;
    comm_flight_label(s->pipe, s->label[b->cur]);
    b->req = comm_sendrecv(s->pipe, s->batch[b->cur], s->nbatch[b->cur], comm_act_dtype(s->ops));
    if (b->has_recv || b->sync) {
        comm_wait(&b->req);
    } else { /* sends only: they go now where the backend can without waiting (shm) */
        b->inflight = 1;
        comm_progress(s->pipe);
    }
    b->cur ^= 1;
    s->nbatch[b->cur] = 0;
    s->label[b->cur][0] = 0;
    b->has_recv = 0;
}

/* Adds "recv act chunk 0 mb 5" to the batch's label (what a hang report names). */
static void label_transfer(pp_state *s, int cur, const pps_action *a) {
    static const char *what[] = {"send act", "recv act", "send grad", "recv grad"};
    char *l = s->label[cur];
    size_t n = strlen(l);
    if (n + 8 < sizeof s->label[cur])
        snprintf(l + n, sizeof s->label[cur] - n, "%s%s chunk %d mb %d", n ? ", " : "",
                 what[a->op - PPS_SEND_ACT], a->chunk, a->mb);
}

/* ------------------------------------------------------------------ computations */

/* dualpipev's turn at rank p-1: the neighbouring stage is this rank's other chunk, whose
 * (mb, chunk) set the step recorded (it is held: the copy follows its producer at once). */
static void local_copy(pp_state *s, const pps_action *a, int slot) {
    int from = a->stage + (a->op == PPS_LOCAL_ACT ? -1 : 1), pc = 0;
    for (int c = 0; c < s->v; c++)
        if (pps_stage(s->sched->kind, s->p, c, s->sched->rank) == from) pc = c;
    int ps = s->cur[a->mb * s->v + pc];
    if (a->op == PPS_LOCAL_GRAD && s->fault_skip_turn) return;
    size_t bytes = (size_t)act_bytes(s->ops, model_boundary_numel(s->m));
    if (a->op == PPS_LOCAL_ACT)
        s->ops->copy(s->ops, model_chunk_input(s->m, a->chunk, slot),
                     model_chunk_output(s->m, pc, ps), bytes);
    else
        s->ops->copy(s->ops, model_chunk_grad(s->m, a->chunk, slot), model_chunk_grad(s->m, pc, ps),
                     bytes);
}

/* Runs a computation; a forward adds its counted targets to *ntok. */
static double compute(pp_state *s, const pp_callbacks *cb, const pps_action *a, int slot,
                      float dscale, int64_t *ntok) {
    double loss = 0;
    /* the last micro-batch through this chunk (dualpipe: its direction's) completes its units'
       gradients */
    int last = a->mb == pps_chunk_last_mb(s->sched->kind, s->p, s->nmb, a->chunk, s->sched->rank);
    int64_t n = 0;
    switch (a->op) {
    case PPS_F: { /* the feeder's record of the micro-batch; the chunk takes what it needs */
        double t0 = log_now_s();
        const ust_batch *batch = cb->load(cb->ctx, a->mb);
        ust_trace *tr = comm_trace(s->pipe);
        if (trace_on(tr)) {
            char args[32];
            snprintf(args, sizeof args, "\"mb\": %d", a->mb);
            trace_span(tr, TRACE_IO, "load", t0, log_now_s(), args);
        }
        loss = model_chunk_forward(s->m, a->chunk, slot, batch, dscale, &n);
        *ntok += n;
        if (cb->forwarded) cb->forwarded(cb->ctx, a->mb, a->chunk);
        break;
    }
    case PPS_B: /* a split B leaves the weight gradients (and their hooks) to its W */
        if (!a->split) cb->before_grads(cb->ctx, a->mb, last);
        model_chunk_backward(s->m, a->chunk, slot, a->split);
        break;
    default: /* PPS_W */
        cb->before_grads(cb->ctx, a->mb, last);
        model_chunk_weight_grad(s->m, a->chunk, slot);
        break;
    }
    return loss;
}

/* UST_FAULT_PP_OP_MS: a sleep, so that the planted time is the op's on any number of cores. */
static void fault_op_delay(const pp_state *s, const pps_action *a) {
    double d = s->fault_op_s * (a->op == PPS_B && !a->split ? 2 : 1);
    struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
    nanosleep(&ts, NULL);
}

static int is_compute(pps_op op) { return op == PPS_F || op == PPS_B || op == PPS_W; }

static int is_local(pps_op op) { return op == PPS_LOCAL_ACT || op == PPS_LOCAL_GRAD; }

/* The timeline's span of a computation, named as the schedule names it ("F chunk 1 mb 5"). */
static void trace_action(pp_state *s, const pps_action *a, int step, double t0, double t1) {
    char name[48], args[96];
    snprintf(name, sizeof name, "%s%s chunk %d mb %d", step ? "" : "val ", pps_op_name(a->op),
             a->chunk, a->mb);
    snprintf(args, sizeof args,
             "\"op\": \"%s\", \"chunk\": %d, \"mb\": %d, \"stage\": %d, \"split\": %d",
             pps_op_name(a->op), a->chunk, a->mb, a->stage, a->split);
    trace_span(comm_trace(s->pipe), TRACE_COMPUTE, name, t0, t1, args);
}

/* The step's time in a computation (a forward-only walk is no part of the step's figures). */
static void account(pp_state *s, const pps_action *a, double dt) {
    int k = a->op == PPS_F ? OP_F : a->op == PPS_W ? OP_W : a->split ? OP_B : OP_WHOLE_B;
    s->busy_s += dt;
    s->op_s[k] += dt;
    s->op_n[k]++;
}

/* The one walk of a schedule, the step's or validation's (sc, with its actions' sets slot):
 * computations in order, the transfers between two of them as one batch. Returns the loss sum;
 * *ntok gets the counted targets. */
static double walk(pp_state *s, const pps_schedule *sc, const int *slot, const pp_callbacks *cb,
                   float dscale, int64_t *ntok) {
    int step = !(sc->flags & PPS_FORWARD_ONLY);
    batch_state b = {.sync = !step};
    s->nbatch[0] = s->nbatch[1] = 0;
    s->label[0][0] = s->label[1][0] = 0;
    double loss = 0;
    *ntok = 0;
    for (int i = 0; i < sc->n; i++) {
        const pps_action *a = &sc->a[i];
        s->cur[a->mb * s->v + a->chunk] = slot[i];
        if (is_local(a->op)) { /* on the compute stream, after its producer */
            local_copy(s, a, slot[i]);
            continue;
        }
        if (!is_compute(a->op)) {
            comm_p2p t = transfer_of(s, a, slot[i]);
            s->batch[b.cur][s->nbatch[b.cur]++] = t;
            label_transfer(s, b.cur, a);
            if (t.is_send && step) s->sent_bytes += act_bytes(s->ops, (int64_t)t.count);
            b.has_recv |= a->op == PPS_RECV_ACT || a->op == PPS_RECV_GRAD;
            continue;
        }
        flush(s, &b);
        double t0 = log_now_s();
        loss += compute(s, cb, a, slot[i], dscale, ntok);
        if (s->fault_op_s > 0 && step) fault_op_delay(s, a);
        double t1 = log_now_s();
        if (step) account(s, a, t1 - t0);
        if (trace_on(comm_trace(s->pipe))) trace_action(s, a, step, t0, t1);
    }
    flush(s, &b);
    if (b.inflight) comm_wait(&b.req);
    return loss;
}

double pp_train_step(pp_state *s, const pp_callbacks *cb, float dscale) {
    s->busy_s = s->idle_s = 0;
    s->sent_bytes = 0;
    /* idle: the step's waits on the pipeline group, which only its transfers use until the end */
    double waited = comm_get_counters(s->pipe)->wait_s;
    memset(s->op_s, 0, sizeof s->op_s);
    memset(s->op_n, 0, sizeof s->op_n);
    int64_t ntok;
    if (s->fault_slow_s > 0) {
        struct timespec ts = {(time_t)s->fault_slow_s,
                              (long)((s->fault_slow_s - (double)(time_t)s->fault_slow_s) * 1e9)};
        nanosleep(&ts, NULL);
    }
    double loss = walk(s, s->sched, s->slot, cb, dscale, &ntok);
    s->idle_s = comm_get_counters(s->pipe)->wait_s - waited;
    return loss;
}

double pp_forward_only(pp_state *s, const pp_callbacks *cb, int64_t *ntok) {
    UST_ASSERT(s->fwd.n > 0, "validation without micro-batches");
    return walk(s, &s->fwd, s->fwd_slot, cb, 0, ntok);
}

/* ------------------------------------------------------------------ reductions */

double pp_sum(pp_state *s, double x) {
    comm_sum_doubles(s->pipe, s->ops, s->scalar, &x, 1);
    return x;
}

void pp_sync_tied(pp_state *s, float *g, int64_t n) {
    if (!s->emb || n <= 0 || s->fault_skip_tied) return;
    comm_req r = comm_allreduce(s->emb, g, g, (size_t)n, COMM_FP32, COMM_SUM);
    comm_wait(&r);
}

pp_stats pp_last_step_stats(pp_state *s) {
    pp_stats st = {.busy_s = s->busy_s, .idle_s = s->idle_s, .sent_bytes = s->sent_bytes};
    float mine[NSTAT] = {(float)s->busy_s, (float)s->idle_s}, *all = s->stats_host;
    /* B: the split ones' time when there are any (b of pps_costs; a whole one costs b + w),
     * else the whole ones' */
    int kb = s->op_n[OP_B] ? OP_B : OP_WHOLE_B, ks[3] = {OP_F, kb, OP_W};
    for (int k = 0; k < 3; k++)
        mine[2 + k] = s->op_n[ks[k]] ? (float)(s->op_s[ks[k]] / s->op_n[ks[k]]) : 0;
    float *at = s->scalar + NSTAT * comm_rank(s->pipe); /* in place: member i's part at 5i */
    s->ops->to_device(s->ops, at, mine, sizeof mine);
    comm_req r = comm_allgather(s->pipe, at, s->scalar, NSTAT, COMM_FP32);
    comm_wait(&r);
    s->ops->to_host(s->ops, all, s->scalar, NSTAT * s->p * sizeof(float));
    pps_costs cost = {0, 0, 0};
    for (int k = 0; k < s->p; k++) {
        const float *x = all + NSTAT * k;
        if (x[0] > 0 && x[1] / x[0] > st.bubble) st.bubble = x[1] / x[0];
        cost.f += x[2] / s->p, cost.b += x[3] / s->p, cost.w += x[4] / s->p;
    }
    /* the schedule's own accounting: its timeline with these stage-averaged op times and free
     * transfers (what the bubble would be on dedicated devices) */
    pps_sim sim;
    ust_err e;
    st.simulated = cost.f > 0 && pps_simulate(s->all, s->p, cost, &sim, &e) == 0 ? sim.bubble : -1;
    st.analytic = pps_analytic_bubble(s->sched->kind, s->p, s->v, s->nmb, cost, NULL);
    st.f_ms = 1e3 * cost.f, st.b_ms = 1e3 * cost.b, st.w_ms = 1e3 * cost.w;
    return st;
}
