/* train_setup.c: the trainer's set-up: the runtime (bootstrap, communicators, topology), the
 * checks made before anything runs, the backend and arena, the rank's runtime built on them
 * (train_build_rank), and the teardown; and the helpers that ask every rank at once. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "error.h"
#include "fs.h"
#include "ops_prof.h"
#include "train_internal.h"

int train_runtime_init(ust_runtime *rt, const ust_config *cfg, ust_err *e) {
    memset(rt, 0, sizeof *rt);
    if (boot_init(&rt->boot, cfg->dist.timeout_s, e)) return -1;
    rt->rank = rt->boot.rank;
    rt->world = rt->boot.world;
    if (rt->world > 1) ust_error_set_rank(rt->rank);
    topo_grid g;
    /* GPUs talk through NCCL; a single GPU needs no communicator backend beyond the trivial */
    comm_backend be =
        cfg->run.device == DEV_CUDA && rt->world > 1 ? COMM_BACKEND_NCCL : COMM_BACKEND_SHM;
    char flight[UST_PATH_MAX + 8];
    snprintf(flight, sizeof flight, "%s/flight", cfg->run.out_dir);
    comm_opts co = {.backend = be,
                    .timeout_s = cfg->dist.timeout_s,
                    .flight_entries = cfg->logging.flight_entries,
                    .flight_dir = flight};
    /* node-limited routing's placement, on every rank before any communicator exists */
    if (topo_grid_from_config(&g, cfg, rt->world, e) ||
        topo_check_expert_nodes(&g, cfg, rt->boot.node_of, rt->boot.local_world, e) ||
        comm_ctx_init(&rt->comm, &rt->boot, &co, e) ||
        topo_connect(&rt->topo, &g, rt->comm, rt->rank, e)) {
        if (rt->comm) comm_ctx_free(rt->comm);
        boot_finalize(&rt->boot);
        rt->comm = NULL;
        return -1;
    }
    if (rt->rank == 0 && rt->boot.nnodes > 1 && !cfg->parallel.tp_across_nodes)
        topo_warn_across_nodes(&g, &rt->boot, stderr);
    return 0;
}

void train_runtime_finalize(ust_runtime *rt) {
    if (!rt->comm) return;
    comm_req r = comm_barrier(rt->topo.comm[TOPO_WORLD]); /* nobody leaves while others work */
    comm_wait(&r);
    topo_disconnect(&rt->topo);
    comm_ctx_free(rt->comm);
    boot_finalize(&rt->boot);
    rt->comm = NULL;
}

/* Where the run writes (run.out_dir, the metrics file, TensorBoard's directory) must be its own:
 * never a file, never inside a checkpoint's step (ckpt_refuse_in_step). Checked on every rank
 * before anything is read or written. */
static int check_outputs(const ust_config *cfg, ust_err *e) {
    struct stat st;
    if (stat(cfg->run.out_dir, &st) == 0 && !S_ISDIR(st.st_mode))
        return ust_errf(e, "run.out_dir %s is %s, not a directory", cfg->run.out_dir,
                        fs_kind(st.st_mode));
    if (ckpt_refuse_in_step(cfg->run.out_dir, "run.out_dir", e)) return -1;
    if (cfg->logging.metrics_file[0] &&
        ckpt_refuse_output(cfg->logging.metrics_file, "logging.metrics_file", e))
        return -1;
    if (cfg->logging.tensorboard_dir[0] &&
        ckpt_refuse_in_step(cfg->logging.tensorboard_dir, "logging.tensorboard_dir", e))
        return -1;
    return 0;
}

/* What no single config key can check: the backend's precision and the sequence-parallel rows.
 * Exported (train.h) so that `ustrain validate` runs the same checks. */
int train_check_runnable(const ust_config *cfg, ust_err *e) {
    if (check_outputs(cfg, e) || train_trace_check(cfg, e)) return -1;
    for (int G = cfg->train.batch_ramp.start; G > 0 && G < cfg->train.global_batch_size;
         G += cfg->train.batch_ramp.increment) {
        int nmb = G / (cfg->train.micro_batch_size * cfg->parallel.dp);
        if (pp_check_micro_batches(cfg, nmb, e))
            return ust_errf(e,
                            "train.batch_ramp: a step of %d sequences is %d micro-batches per "
                            "dp rank, which parallel.pp_schedule cannot run: %s",
                            G, nmb, e->msg);
    }
    if (cfg->run.device == DEV_CPU && cfg->train.precision == PREC_BF16)
        return ust_errf(e, "train.precision = bf16: the CPU backend computes in fp32 only; use "
                           "fp32, or run.device: cuda");
    int cp = cfg->parallel.cp;
    if (cfg->parallel.sp &&
        cfg->train.micro_batch_size * (cfg->train.seq_len / cp) % cfg->parallel.tp != 0)
        return ust_errf(e,
                        "parallel.sp: the %d x %d tokens a rank holds of a micro-batch do not "
                        "split over parallel.tp = %d ranks",
                        cfg->train.micro_batch_size, cfg->train.seq_len / cp, cfg->parallel.tp);
    return 0;
}

/* Test fault: UST_FAULT_SETUP_SLEEP_MS holds start-up, for a signal to arrive during it. */
static void fault_setup_hold(void) {
    const char *hold = getenv("UST_FAULT_SETUP_SLEEP_MS");
    if (!hold) return;
    struct timespec ts = {atoi(hold) / 1000, (long)(atoi(hold) % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The compute backend (or the op profiler on it) and the arena everything is carved from. */
static int open_backend(trainer *t, int profile, ust_err *e) {
    const ust_config *cfg = t->cfg;
    ust_runtime *rt = t->rt;
    if (!(t->eng.backend = ops_create(cfg, rt->boot.local_rank, rt->boot.local_world, e)))
        return -1;
    comm_ctx_set_stream(rt->comm, t->eng.backend->stream(t->eng.backend)); /* NULL on the CPU */
    t->eng.ops = profile ? ops_prof_create(t->eng.backend) : t->eng.backend;
    UST_ASSERT(t->eng.ops->act_size == cfg_act_size(cfg),
               "backend activations of %d bytes, plan %d", t->eng.ops->act_size,
               cfg_act_size(cfg)); /* the memory plan counts on it */
    mem_init(&t->eng.arena, t->eng.ops);
    train_memmap_arm(t);
    return 0;
}

/* The node of each member of this rank's ep group, for the bytes its dispatch sends across
 * nodes (comm_bytes_ep_internode; all on node 0 in a job of one node). */
static void set_ep_nodes(trainer *t) {
    const topo_grid *g = &t->rt->topo.grid;
    int *ranks = malloc(sizeof(int) * (size_t)g->world);
    UST_ASSERT(ranks, "out of memory");
    int n = topo_group(g, TOPO_EP, t->rt->rank, ranks, NULL);
    for (int i = 0; i < n; i++) ranks[i] = boot_node_of(&t->rt->boot, ranks[i]);
    ep_set_nodes(&t->eng.ep, ranks);
    free(ranks);
}

/* The rank's runtime (train_build_rank) and what the run adds to it: the tied embeddings'
 * second copy and a warning. */
static int build_model(trainer *t, ust_err *e) {
    const ust_config *cfg = t->cfg;
    train_feed_layout(t);
    train_build_at at = {.topo = &t->rt->topo, .pp_rank = t->rt->topo.me.pp};
    if (train_build_rank(&t->eng, cfg, &at, e)) return -1;
    if (t->eng.has_moe && cfg->parallel.ep > 1) set_ep_nodes(t);
    /* tied embeddings over a pipeline: the first stage's table and the last stage's copy (none
     * where one rank holds both ends, dualpipev's rank 0: one tensor serves both) */
    t->eng.tied_param = cfg->parallel.pp > 1 && cfg_tied(cfg) && !model_tied_local(t->eng.m)
                            ? model_find_param(t->eng.m, "model.embed_tokens.weight")
                            : -1;
    if (cfg->parallel.pp > 1 && cfg->optimizer.zero_stage == 3 && t->rank0)
        fprintf(stderr,
                "ustrain: warning: optimizer.zero_stage = 3 with parallel.pp = %d gathers every "
                "layer's weights again for each micro-batch's forward and backward; ZeRO-1 or 2 "
                "is the usual choice with pipelines\n",
                cfg->parallel.pp);
    return 0;
}

int train_setup(trainer *t, const ust_config *cfg, ust_runtime *rt, int flags, ust_err *e) {
    memset(t, 0, sizeof *t);
    t->eval = (flags & TRAIN_SETUP_EVAL) != 0;
    t->ck.lock.fd = -1;
    t->cfg = cfg;
    t->rt = rt;
    t->rank0 = rt->rank == 0;
    t->last_loss = NAN;
    t->ck.started_s = log_now_s();
    const char *fault = getenv("UST_FAULT_SPIKE_STEP"), *restart = getenv("UST_RESTART_COUNT");
    t->feed.fault_spike_step = fault ? atoll(fault) : 0;
    t->feed.fault_spike_on = fault && strchr(fault, '+');
    t->restarts = restart ? atoi(restart) : 0;
    if (t->restarts > 0 && t->rank0)
        printf("restart %d of this job (scripts/ustrun --max-restarts)\n", t->restarts);
    if (cfg->train.on_spike != SPIKE_NONE) {
        spike_init(&t->loss_w, cfg->train.spike_window);
        spike_init(&t->norm_w, cfg->train.spike_window);
    }
    if (train_check_runnable(cfg, e)) return -1;
    fault_setup_hold();
    /* first, before anything is read: one job at a time may own the checkpoints (nothing is
     * written there until the run is sure to start: ckpt_lock_claim) */
    if (t->rank0 && cfg->checkpoint.dir[0] && ckpt_lock_dir(cfg->checkpoint.dir, &t->ck.lock, e))
        return -1;
    if (train_feed_open(t, e) || open_backend(t, flags & TRAIN_SETUP_PROFILE, e) ||
        build_model(t, e))
        return -1;
    mem_freeze(&t->eng.arena);
    if (cfg->checkpoint.async && train_ckpt_open_stage(t, e)) return -1;
    t->feed.samples =
        malloc((size_t)cfg->train.micro_batch_size * (cfg->train.seq_len + 1) * sizeof(int32_t));
    return train_ckpt_initialize(t, e);
}

void train_teardown(trainer *t) {
    log_close(&t->met.log);
    train_ckpt_close(t);
    train_feed_close(t);
    spike_free(&t->loss_w), spike_free(&t->norm_w);
    pp_destroy(t->eng.pp);
    dp_destroy(t->eng.dp);
    model_destroy(t->eng.m);
    free(t->eng.qk_host);
    cp_free(&t->eng.cp);
    if (t->eng.has_moe) ep_free(&t->eng.ep);
    if (t->eng.backend) {
        mem_release(&t->eng.arena);
        /* the communicators outlive the compute stream (the final barrier): stop ordering
         * their operations after a stream that is about to be destroyed */
        comm_ctx_set_stream(t->rt->comm, NULL);
        if (t->eng.ops != t->eng.backend) t->eng.ops->destroy(t->eng.ops);
        t->eng.backend->destroy(t->eng.backend);
    }
}

void train_write_config(const ust_config *cfg) {
    ust_err e;
    char path[UST_PATH_MAX + 32];
    if (fs_mkdir_p(cfg->run.out_dir, &e)) {
        fprintf(stderr, "ustrain: warning: %s\n", e.msg);
        return;
    }
    snprintf(path, sizeof path, "%s/config.yaml", cfg->run.out_dir);
    FILE *f = fs_fopen_regular(path, "wb", &e);
    if (!f) {
        fprintf(stderr, "ustrain: warning: effective config %s\n", e.msg);
        return;
    }
    cfg_dump(cfg, f);
    fclose(f);
}
