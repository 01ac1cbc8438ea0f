/* comm: the backend-independent half. Checks arguments, counts traffic, keeps each
 * communicator's queue of posted operations and hands them to the backend, whose vtable
 * (comm_impl.h) comm_ctx_init picks once, and comm_create_many per group where a CPU job spans
 * nodes (shm inside a node, gloo across). The shm and gloo backends run
 * the queue when an operation is waited on; NCCL launches each operation as it is posted and the
 * queue only remembers what is outstanding. */
#include "comm_impl.h"
#include "flight_impl.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char *comm_backend_name(comm_backend b) { return b == COMM_BACKEND_NCCL ? "nccl" : "shm"; }

/* The backend's vtable, or NULL when it is not compiled in. */
static const comm_backend_ops *backend_ops(comm_backend b) {
#ifdef UST_NCCL
    if (b == COMM_BACKEND_NCCL) return &comm_nccl_backend;
#endif
    return b == COMM_BACKEND_SHM ? &comm_shm_backend : NULL;
}

int comm_backend_available(comm_backend b) { return backend_ops(b) != NULL; }

int comm_gloo_available(void) {
#ifdef UST_GLOO
    return 1;
#else
    return 0;
#endif
}

int comm_ctx_init(comm_ctx **out, ust_boot *boot, const comm_opts *opts, ust_err *e) {
    *out = NULL;
    if (!comm_backend_available(opts->backend))
        return ust_errf(e, "comm: backend %s is not compiled in (build with CUDA=1 and NCCL)",
                        comm_backend_name(opts->backend));
    comm_ctx *ctx = calloc(1, sizeof *ctx);
    UST_ASSERT(ctx, "out of memory");
    ctx->backend = opts->backend;
    ctx->be = backend_ops(opts->backend);
    ctx->boot = boot;
    ctx->opts = *opts;
    if (ctx->opts.timeout_s <= 0) ctx->opts.timeout_s = 300;
    if (!ctx->opts.shm_slot_bytes) ctx->opts.shm_slot_bytes = 2u << 20;
    if (!ctx->opts.shm_chan_bytes) ctx->opts.shm_chan_bytes = 256u << 10;
    /* Sizes stay multiples of 64 so every slot and ring starts on its own cache line. */
    ctx->opts.shm_slot_bytes = (ctx->opts.shm_slot_bytes + 63) / 64 * 64;
    ctx->opts.shm_chan_bytes = (ctx->opts.shm_chan_bytes + 63) / 64 * 64;
    ctx->opts.flight_dir = NULL; /* the caller's string need not outlive this call */
    if (ctx->be->ctx_init(ctx, e)) {
        free(ctx);
        return -1;
    }
    /* A CPU job over several nodes: groups inside a node keep shared memory, the others use
     * gloo over TCP (comm_create_many chooses per group). */
    const char *all = getenv("UST_COMM_GLOO");
    int gloo_all = all && !strcmp(all, "all");
    if (ctx->backend == COMM_BACKEND_SHM && (boot->nnodes > 1 || gloo_all)) {
#ifdef UST_GLOO
        if (comm_gloo_backend.ctx_init(ctx, e)) {
            ctx->be->ctx_free(ctx);
            free(ctx);
            return -1;
        }
        ctx->gloo_all = gloo_all;
#else
        ctx->be->ctx_free(ctx);
        free(ctx);
        if (gloo_all)
            return ust_errf(e, "comm: UST_COMM_GLOO=all, but this build has no gloo (install "
                               "libgloo-dev and rebuild)");
        return ust_errf(e,
                        "comm: the shared-memory backend works on one node, but the job spans "
                        "%d nodes and this build has no gloo for the groups across nodes "
                        "(install libgloo-dev and rebuild, use run.device: cuda with NCCL, or "
                        "launch on one node)",
                        boot->nnodes);
#endif
    }
    ctx->fl = flight_create(ctx, opts->flight_entries, opts->flight_dir);
    *out = ctx;
    return 0;
}

/* The backend of a new group: gloo for a CPU group whose members are on several nodes. */
static const comm_backend_ops *group_backend(const comm_ctx *ctx, const comm_group_spec *g) {
#ifdef UST_GLOO
    if (ctx->gloo && g->n > 1) {
        if (ctx->gloo_all) return &comm_gloo_backend;
        for (int j = 1; j < g->n; j++)
            if (boot_node_of(ctx->boot, g->ranks[j]) != boot_node_of(ctx->boot, g->ranks[0]))
                return &comm_gloo_backend;
    }
#else
    (void)g;
#endif
    return ctx->be;
}

const char *comm_group_backend(const ust_comm *c) {
#ifdef UST_GLOO
    if (c->be == &comm_gloo_backend) return "gloo";
#endif
    return comm_backend_name(c->ctx->backend);
}

comm_backend comm_ctx_backend(const comm_ctx *ctx) { return ctx->backend; }
void comm_ctx_set_stream(comm_ctx *ctx, void *stream) { ctx->stream = stream; }

void comm_free(ust_comm *c) {
    if (!c) return;
    comm_ctx *ctx = c->ctx;
    if (c->impl) c->be->free(c);
    for (int i = 0; i < ctx->nall; i++)
        if (ctx->all[i] == c) ctx->all[i] = ctx->all[--ctx->nall];
    free(c->granks);
    free(c->queue);
    free(c->fsent);
    free(c->frecvd);
    free(c);
}

void comm_ctx_free(comm_ctx *ctx) {
    if (!ctx) return;
    while (ctx->nall) comm_free(ctx->all[ctx->nall - 1]);
    free(ctx->all);
#ifdef UST_GLOO
    if (ctx->gloo) comm_gloo_backend.ctx_free(ctx);
#endif
    ctx->be->ctx_free(ctx);
    flight_free(ctx->fl);
    free(ctx);
}

/* FNV-1a over the member list: part of the key, so two different groups with one name differ. */
static uint32_t ranks_hash(const int *r, int n) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) h = (h ^ (uint32_t)((r[i] >> (8 * b)) & 0xff)) * 16777619u;
    return h;
}

static void group_key(const comm_ctx *ctx, const comm_group_spec *g, char *key, size_t cap) {
    char name[32];
    size_t i = 0;
    for (; g->name[i] && i < sizeof name - 1; i++) {
        char ch = g->name[i];
        name[i] = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')
                      ? ch
                      : '_';
    }
    name[i] = 0;
    snprintf(key, cap, "comm.%d.%s.%d.%08x", ctx->ncalls, name, g->ranks[0],
             ranks_hash(g->ranks, g->n));
}

int comm_create_many(comm_ctx *ctx, int ng, const comm_group_spec *gs, ust_comm **out, ust_err *e) {
    ust_boot *b = ctx->boot;
    int rc = 0;
    char key[128];
    for (int i = 0; i < ng; i++) out[i] = NULL;
    for (int i = 0; i < ng && !rc; i++) {
        const comm_group_spec *g = &gs[i];
        int me = -1;
        if (g->n <= 0 || !g->name) {
            rc = ust_errf(e, "comm: group %d has no members", i);
            break;
        }
        for (int j = 0; j < g->n; j++) {
            if (g->ranks[j] < 0 || g->ranks[j] >= b->world)
                rc = ust_errf(e, "comm: group '%s' names rank %d outside the world of %d", g->name,
                              g->ranks[j], b->world);
            for (int k = 0; k < j; k++)
                if (g->ranks[k] == g->ranks[j])
                    rc = ust_errf(e, "comm: group '%s' names rank %d twice", g->name, g->ranks[j]);
            if (g->ranks[j] == b->rank) me = j;
        }
        if (!rc && me < 0)
            rc = ust_errf(e, "comm: rank %d creates group '%s' without being a member", b->rank,
                          g->name);
        if (rc) break;
        ust_comm *c = calloc(1, sizeof *c);
        UST_ASSERT(c, "out of memory");
        c->ctx = ctx;
        c->be = group_backend(ctx, g);
        snprintf(c->name, sizeof c->name, "%s", g->name);
        c->rank = me;
        c->size = g->n;
        c->granks = malloc(sizeof(int) * (size_t)g->n);
        c->qcap = 16;
        c->queue = calloc((size_t)c->qcap, sizeof(comm_desc));
        c->fid = ctx->nfid++;
        c->fsent = calloc((size_t)g->n, sizeof(uint64_t));
        c->frecvd = calloc((size_t)g->n, sizeof(uint64_t));
        UST_ASSERT(c->granks && c->queue && c->fsent && c->frecvd, "out of memory");
        memcpy(c->granks, g->ranks, sizeof(int) * (size_t)g->n);
        if (ctx->nall == ctx->capall) {
            ctx->capall = ctx->capall ? 2 * ctx->capall : 16;
            ctx->all = realloc(ctx->all, sizeof(ust_comm *) * (size_t)ctx->capall);
            UST_ASSERT(ctx->all, "out of memory");
        }
        ctx->all[ctx->nall++] = c;
        out[i] = c;
        group_key(ctx, g, key, sizeof key);
        rc = c->be->create_begin(c, key, e);
    }
    /* Every rank reaches the fence, even after an error, so the others fail on their own
     * terms instead of waiting for this one until the bootstrap timeout. */
    ust_err fe;
    if (boot_fence(b, &fe) && !rc) rc = ust_errf(e, "comm: creating groups: %s", fe.msg);
    for (int i = 0; i < ng && !rc; i++) {
        group_key(ctx, &gs[i], key, sizeof key);
        rc = out[i]->be->create_end(out[i], key, e);
    }
    ctx->ncalls++;
    if (rc)
        for (int i = 0; i < ng; i++) {
            comm_free(out[i]);
            out[i] = NULL;
        }
    return rc;
}

int comm_rank(const ust_comm *c) { return c->rank; }
int comm_size(const ust_comm *c) { return c->size; }
int comm_global_rank(const ust_comm *c, int local) {
    UST_ASSERT(local >= 0 && local < c->size, "member %d of %d", local, c->size);
    return c->granks[local];
}
const char *comm_name(const ust_comm *c) { return c->name; }
const comm_counters *comm_get_counters(const ust_comm *c) { return &c->cnt; }
void comm_reset_counters(ust_comm *c) { memset(&c->cnt, 0, sizeof c->cnt); }

/* Bytes this rank sends under the bandwidth-optimal algorithm (see comm.h). */
static uint64_t bus_bytes(const ust_comm *c, const comm_desc *d) {
    uint64_t n = (uint64_t)c->size, es = comm_dtype_size(d->t), s = 0;
    if (n == 1) return 0;
    switch (d->kind) {
    case COMM_ALLREDUCE:
        return 2 * (n - 1) * d->count * es / n;
    case COMM_ALLGATHER:
    case COMM_REDUCE_SCATTER:
        return (n - 1) * d->count * es;
    case COMM_BROADCAST:
        return c->rank == d->root ? d->count * es : 0;
    case COMM_ALLTOALL:
        for (int j = 0; j < c->size; j++)
            if (j != c->rank) s += desc_scount(d, j) * es;
        return s;
    case COMM_SENDRECV:
        for (int i = 0; i < d->np2p; i++)
            if (d->p2p[i].is_send && d->p2p[i].peer != c->rank) s += d->p2p[i].count * es;
        return s;
    default:
        return 0;
    }
}

static comm_req post(ust_comm *c, comm_desc d) {
    UST_ASSERT(c != NULL, "operation on a NULL communicator");
    UST_ASSERT(d.t == COMM_FP32 || d.t == COMM_BF16, "dtype %d", (int)d.t);
    c->cnt.calls[d.kind]++;
    c->cnt.bytes[d.kind] += bus_bytes(c, &d);
    if (c->posted - c->done == (uint64_t)c->qcap) { /* grow the ring, keeping seq order */
        comm_desc *q = calloc((size_t)c->qcap * 2, sizeof *q);
        UST_ASSERT(q, "out of memory");
        for (uint64_t s = c->done + 1; s <= c->posted; s++)
            q[s % (uint64_t)(2 * c->qcap)] = c->queue[s % (uint64_t)c->qcap];
        free(c->queue);
        c->queue = q;
        c->qcap *= 2;
    }
    d.seq = ++c->posted;
    d.coll = d.kind == COMM_SENDRECV ? 0 : ++c->fcolls;
    if (c->ctx->trace) d.tpost = trace_on(c->ctx->trace) ? log_now_s() : 0;
    if (c->ctx->fl) {
        flight_poll(c->ctx->fl);
        d.fidx = flight_post(c->ctx->fl, c, &d, bus_bytes(c, &d));
    }
    c->queue[d.seq % (uint64_t)c->qcap] = d;
    if (c->be->launch) c->be->launch(c, &c->queue[d.seq % (uint64_t)c->qcap]);
    return (comm_req){c, d.seq};
}

comm_req comm_allreduce(ust_comm *c, const void *send, void *recv, size_t count, comm_dtype t,
                        comm_redop op) {
    return post(
        c,
        (comm_desc){
            .kind = COMM_ALLREDUCE, .send = send, .recv = recv, .count = count, .t = t, .op = op});
}

comm_req comm_allgather(ust_comm *c, const void *send, void *recv, size_t count, comm_dtype t) {
    return post(
        c, (comm_desc){.kind = COMM_ALLGATHER, .send = send, .recv = recv, .count = count, .t = t});
}

comm_req comm_reduce_scatter(ust_comm *c, const void *send, void *recv, size_t count, comm_dtype t,
                             comm_redop op) {
    return post(c, (comm_desc){.kind = COMM_REDUCE_SCATTER,
                               .send = send,
                               .recv = recv,
                               .count = count,
                               .t = t,
                               .op = op});
}

comm_req comm_broadcast(ust_comm *c, void *buf, size_t count, comm_dtype t, int root) {
    UST_ASSERT(root >= 0 && root < c->size, "broadcast root %d of %d members", root, c->size);
    return post(c, (comm_desc){.kind = COMM_BROADCAST,
                               .send = buf,
                               .recv = buf,
                               .count = count,
                               .t = t,
                               .root = root});
}

comm_req comm_alltoallv(ust_comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                        void *recv, const size_t *rcounts, const size_t *rdispls, comm_dtype t) {
    UST_ASSERT(scounts && sdispls && rcounts && rdispls, "all-to-allv needs every count array");
    return post(c, (comm_desc){.kind = COMM_ALLTOALL,
                               .send = send,
                               .recv = recv,
                               .t = t,
                               .scounts = scounts,
                               .sdispls = sdispls,
                               .rcounts = rcounts,
                               .rdispls = rdispls});
}

comm_req comm_alltoall(ust_comm *c, const void *send, void *recv, size_t count, comm_dtype t) {
    return post(
        c, (comm_desc){.kind = COMM_ALLTOALL, .send = send, .recv = recv, .count = count, .t = t});
}

comm_req comm_sendrecv(ust_comm *c, const comm_p2p *ops, int nops, comm_dtype t) {
    for (int i = 0; i < nops; i++)
        UST_ASSERT(ops[i].peer >= 0 && ops[i].peer < c->size, "p2p peer %d of %d members on '%s'",
                   ops[i].peer, c->size, c->name);
    return post(c, (comm_desc){.kind = COMM_SENDRECV, .p2p = ops, .np2p = nops, .t = t});
}

void comm_sum_doubles(ust_comm *c, const ust_ops *ops, float *dev, double *x, int n) {
    UST_ASSERT(n >= 1 && n <= 4, "comm_sum_doubles of %d values", n);
    if (!c || c->size == 1) return;
    float h[8];
    for (int i = 0; i < n; i++)
        h[2 * i] = (float)x[i], h[2 * i + 1] = (float)(x[i] - (double)(float)x[i]);
    ops->to_device(ops, dev, h, 2 * (size_t)n * sizeof(float));
    comm_req r = comm_allreduce(c, dev, dev, 2 * (size_t)n, COMM_FP32, COMM_SUM);
    comm_wait(&r);
    ops->to_host(ops, h, dev, 2 * (size_t)n * sizeof(float));
    for (int i = 0; i < n; i++) x[i] = (double)h[2 * i] + (double)h[2 * i + 1];
}

comm_req comm_barrier(ust_comm *c) { return post(c, (comm_desc){.kind = COMM_BARRIER}); }

/* The timeline of a wait that completed ops from + 1 .. seq: each as issued .. completed, and
 * the wait itself. */
static void trace_wait(const ust_comm *c, uint64_t from, uint64_t seq, double t0) {
    ust_trace *t = c->ctx->trace;
    if (!trace_on(t)) return;
    double now = log_now_s();
    char name[64], args[160];
    for (uint64_t s = from + 1; s <= seq; s++) {
        const comm_desc *d = &c->queue[s % (uint64_t)c->qcap];
        if (d->seq != s || d->tpost <= 0) continue; /* posted before the traced steps */
        snprintf(name, sizeof name, "%s %s", comm_kind_name(d->kind), c->name);
        snprintf(args, sizeof args,
                 "\"group\": \"%s\", \"members\": \"%d..%d/%d\", \"kind\": \"%s\", \"seq\": "
                 "%llu, \"coll\": %llu, \"bytes\": %llu",
                 c->name, c->granks[0], c->granks[c->size - 1], c->size, comm_kind_name(d->kind),
                 (unsigned long long)s, (unsigned long long)d->coll,
                 (unsigned long long)bus_bytes(c, d));
        trace_async(t, "comm", name, ((uint64_t)c->fid << 40) | s, d->tpost, now, args);
    }
    const comm_desc *last = &c->queue[seq % (uint64_t)c->qcap];
    snprintf(name, sizeof name, "wait %s %s", comm_kind_name(last->kind), c->name);
    snprintf(args, sizeof args, "\"group\": \"%s\", \"seq\": %llu", c->name,
             (unsigned long long)seq);
    trace_span(t, TRACE_COMM, name, t0, now, args);
}

void comm_wait(comm_req *r) {
    ust_comm *c = r->comm;
    if (!c || r->seq <= c->done) return;
    UST_ASSERT(r->seq <= c->posted, "waiting on seq %llu of '%s', only %llu posted",
               (unsigned long long)r->seq, c->name, (unsigned long long)c->posted);
    double t0 = log_now_s();
    flight *fl = c->ctx->fl;
    uint64_t from = c->done; /* shm's wait_until advances c->done as it runs the queue */
    if (fl) flight_wait_begin(fl, c, r->seq);
    c->be->wait_until(c, r->seq);
    c->cnt.wait_s += log_now_s() - t0;
    if (fl) flight_wait_end(fl, c, from, r->seq);
    if (c->ctx->trace) trace_wait(c, from, r->seq, t0);
    c->done = r->seq;
    r->comm = NULL;
}

void comm_ctx_set_trace(comm_ctx *ctx, ust_trace *t) { ctx->trace = t; }
ust_trace *comm_trace(const ust_comm *c) { return c ? c->ctx->trace : NULL; }
ust_trace *comm_ctx_trace(const comm_ctx *ctx) { return ctx->trace; }

void comm_flight_label(ust_comm *c, const char *label) {
    if (c && c->ctx->fl) flight_label(c, label);
}

void comm_progress(ust_comm *c) {
    if (!c || c->be != &comm_shm_backend || c->posted != c->done + 1) return;
    if (!shm_sends_fit(c, &c->queue[c->posted % (uint64_t)c->qcap])) return;
    comm_req r = {c, c->posted};
    comm_wait(&r);
}

void comm_wait_all(comm_req *r, int n) {
    for (int i = 0; i < n; i++) comm_wait(&r[i]);
}
