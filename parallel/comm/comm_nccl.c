/* comm_nccl: the NCCL backend for GPU ranks. One ncclComm_t per group, made non-blocking so no
 * call can hang past the deadline: the group's first member draws the ncclUniqueId and publishes
 * it through the bootstrap KV store, the others read it after the fence. Each communicator has
 * its own stream; an operation first waits (device-side, by event) for the work already queued
 * on the compute stream, runs on the communicator's stream, and records a completion event that
 * comm_wait polls with short sleeps until the deadline, when it aborts the communicator (so a
 * dead peer cannot leave a kernel spinning) and exits naming the group and its members.
 * Compiled only with -DUST_NCCL (Makefile: nccl.h found). */
#ifdef UST_NCCL

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_impl.h"
#include "log.h"
#include "nccl_api.h" /* cuda* and nccl* calls go through the dlopen'ed table */

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t ready;    /* recorded on the compute stream before each operation */
    cudaEvent_t *free_ev; /* completion events not in use */
    int nfree, capfree;
    cudaEvent_t *ev_of; /* event of queue slot seq % qcap (parallel to comm.c's queue) */
    int evcap;
    float *scratch; /* one float on the device: barrier */
    ncclUniqueId id;
    int initializing; /* ncclCommInitRankConfig started, not yet settled */
} nccl_comm;

static void nccl_check_cuda(cudaError_t r, const char *what) {
    if (r != cudaSuccess)
        ust_fatal(UST_EXIT_RUNTIME, "comm/nccl: %s: %s", what, cudaGetErrorString(r));
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Waits while the (non-blocking) communicator reports ncclInProgress; fatal on errors or the
 * deadline. */
static void settle(ust_comm *c, comm_kind k, ncclResult_t r, const char *what) {
    nccl_comm *s = c->impl;
    double deadline = log_now_s() + c->ctx->opts.timeout_s;
    long nap = 10;
    while (r == ncclInProgress) {
        if (log_now_s() > deadline) {
            ncclCommAbort(s->comm);
            int w[1024], n = comm_other_members(c, w, 1024);
            comm_fail_wait(c, k, w, n, "NCCL call did not complete before dist.timeout_s");
        }
        sleep_us(nap);
        nap = nap < 1000 ? nap * 2 : nap;
        if (ncclCommGetAsyncError(s->comm, &r) != ncclSuccess) break;
    }
    if (r != ncclSuccess)
        ust_fatal(UST_EXIT_RUNTIME, "comm/nccl: %s on group '%s': %s", what, c->name,
                  ncclGetErrorString(r));
}

static int nccl_ctx_init(comm_ctx *ctx, ust_err *e) {
    if (nccl_api_load(e) != 0) return -1; /* libcudart / libnccl.so.2 missing: named in e */
    int n = 0;
    cudaError_t r = cudaGetDeviceCount(&n);
    if (r != cudaSuccess || n == 0)
        return ust_errf(e, "comm: the NCCL backend needs a GPU, but CUDA reports %s",
                        r != cudaSuccess ? cudaGetErrorString(r) : "no devices");
    r = cudaSetDevice(ctx->boot->local_rank % n);
    if (r != cudaSuccess)
        return ust_errf(e, "comm: selecting GPU %d: %s", ctx->boot->local_rank % n,
                        cudaGetErrorString(r));
    return 0;
}

static void nccl_ctx_free(comm_ctx *ctx) { (void)ctx; }

static int nccl_create_begin(ust_comm *c, const char *key, ust_err *e) {
    nccl_comm *s = calloc(1, sizeof *s);
    UST_ASSERT(s, "out of memory");
    c->impl = s;
    if (c->rank != 0) return 0;
    ncclResult_t r = ncclGetUniqueId(&s->id);
    if (r != ncclSuccess)
        return ust_errf(e, "comm/nccl: ncclGetUniqueId for group '%s': %s", c->name,
                        ncclGetErrorString(r));
    return boot_put(c->ctx->boot, key, &s->id, sizeof s->id, e);
}

static int nccl_create_end(ust_comm *c, const char *key, ust_err *e) {
    nccl_comm *s = c->impl;
    if (c->rank != 0) {
        int got = boot_get(c->ctx->boot, c->granks[0], key, &s->id, sizeof s->id, e);
        if (got < 0) return -1;
        if (got != (int)sizeof s->id)
            return ust_errf(e, "comm/nccl: the unique id of group '%s' has %d bytes, expected %zu",
                            c->name, got, sizeof s->id);
    }
    nccl_check_cuda(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "stream");
    nccl_check_cuda(cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming), "event");
    nccl_check_cuda(cudaMalloc((void **)&s->scratch, sizeof(float)), "cudaMalloc");
    nccl_check_cuda(cudaMemset(s->scratch, 0, sizeof(float)), "cudaMemset");
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&s->comm, c->size, s->id, c->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress)
        return ust_errf(e, "comm/nccl: creating group '%s': %s", c->name, ncclGetErrorString(r));
    /* Not settled here: every group of a comm_create_many call starts its (non-blocking) init
     * before any waits, so groups listed in different orders on different ranks cannot
     * deadlock; the first use settles it. */
    s->initializing = 1;
    return 0;
}

static void ready(ust_comm *c, comm_kind k) {
    nccl_comm *s = c->impl;
    if (!s->initializing) return;
    s->initializing = 0;
    settle(c, k, ncclInProgress, "ncclCommInitRankConfig");
}

static ncclDataType_t dtype(comm_dtype t) { return t == COMM_BF16 ? ncclBfloat16 : ncclFloat32; }

static cudaEvent_t take_event(nccl_comm *s) {
    if (s->nfree) return s->free_ev[--s->nfree];
    cudaEvent_t ev;
    nccl_check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "event");
    return ev;
}

static void give_event(nccl_comm *s, cudaEvent_t ev) {
    if (s->nfree == s->capfree) {
        s->capfree = s->capfree ? 2 * s->capfree : 16;
        s->free_ev = realloc(s->free_ev, sizeof(cudaEvent_t) * (size_t)s->capfree);
        UST_ASSERT(s->free_ev, "out of memory");
    }
    s->free_ev[s->nfree++] = ev;
}

/* The compute stream the operations must follow (comm_ctx_set_stream; NULL: legacy default). */
static cudaStream_t compute_stream(const ust_comm *c) { return (cudaStream_t)c->ctx->stream; }

static void nccl_launch(ust_comm *c, const comm_desc *d) {
    nccl_comm *s = c->impl;
    size_t es = comm_dtype_size(d->t);
    ncclDataType_t dt = dtype(d->t);
    ncclRedOp_t op = d->op == COMM_AVG ? ncclAvg : ncclSum;
    ready(c, d->kind);
    nccl_check_cuda(cudaEventRecord(s->ready, compute_stream(c)), "event record");
    nccl_check_cuda(cudaStreamWaitEvent(s->stream, s->ready, 0), "stream wait");
    ncclResult_t r = ncclSuccess;
    const char *send = d->send;
    char *recv = d->recv;
    switch (d->kind) {
    case COMM_ALLREDUCE:
        r = ncclAllReduce(send, recv, d->count, dt, op, s->comm, s->stream);
        break;
    case COMM_ALLGATHER:
        r = ncclAllGather(send, recv, d->count, dt, s->comm, s->stream);
        break;
    case COMM_REDUCE_SCATTER:
        r = ncclReduceScatter(send, recv, d->count, dt, op, s->comm, s->stream);
        break;
    case COMM_BROADCAST:
        r = ncclBroadcast(recv, recv, d->count, dt, d->root, s->comm, s->stream);
        break;
    case COMM_ALLTOALL:
        ncclGroupStart();
        for (int j = 0; j < c->size; j++) {
            if (desc_scount(d, j))
                ncclSend(send + desc_sdispl(d, j) * es, desc_scount(d, j), dt, j, s->comm,
                         s->stream);
            if (desc_rcount(d, j))
                ncclRecv(recv + desc_rdispl(d, j) * es, desc_rcount(d, j), dt, j, s->comm,
                         s->stream);
        }
        r = ncclGroupEnd();
        break;
    case COMM_SENDRECV:
        /* One group: NCCL matches each pair's messages in order and never deadlocks a batch. */
        ncclGroupStart();
        for (int i = 0; i < d->np2p; i++) {
            const comm_p2p *p = &d->p2p[i];
            if (p->is_send)
                ncclSend(p->buf, p->count, dt, p->peer, s->comm, s->stream);
            else
                ncclRecv(p->buf, p->count, dt, p->peer, s->comm, s->stream);
        }
        r = ncclGroupEnd();
        break;
    case COMM_BARRIER:
        r = ncclAllReduce(s->scratch, s->scratch, 1, ncclFloat32, ncclSum, s->comm, s->stream);
        break;
    default:
        UST_ASSERT(0, "unknown operation %d", (int)d->kind);
    }
    if (r != ncclSuccess && r != ncclInProgress)
        ust_fatal(UST_EXIT_RUNTIME, "comm/nccl: %s on group '%s': %s", comm_kind_name(d->kind),
                  c->name, ncclGetErrorString(r));
    settle(c, d->kind, r, comm_kind_name(d->kind));
    /* Remember the completion event at the operation's queue slot. */
    if (s->evcap != c->qcap) {
        cudaEvent_t *n = calloc((size_t)c->qcap, sizeof *n);
        UST_ASSERT(n, "out of memory");
        for (uint64_t q = c->done + 1; q < d->seq; q++)
            n[q % (uint64_t)c->qcap] = s->ev_of[q % (uint64_t)s->evcap];
        free(s->ev_of);
        s->ev_of = n;
        s->evcap = c->qcap;
    }
    cudaEvent_t ev = take_event(s);
    nccl_check_cuda(cudaEventRecord(ev, s->stream), "event record");
    s->ev_of[d->seq % (uint64_t)s->evcap] = ev;
}

static void nccl_wait_until(ust_comm *c, uint64_t seq) {
    nccl_comm *s = c->impl;
    double deadline = log_now_s() + c->ctx->opts.timeout_s;
    for (uint64_t q = c->done + 1; q <= seq; q++) {
        cudaEvent_t ev = s->ev_of[q % (uint64_t)s->evcap];
        const comm_desc *d = &c->queue[q % (uint64_t)c->qcap];
        long nap = 5;
        for (;;) {
            cudaError_t r = cudaEventQuery(ev);
            if (r == cudaSuccess) break;
            if (r != cudaErrorNotReady)
                ust_fatal(UST_EXIT_RUNTIME, "comm/nccl: %s on group '%s': %s",
                          comm_kind_name(d->kind), c->name, cudaGetErrorString(r));
            ncclResult_t ar = ncclSuccess;
            ncclCommGetAsyncError(s->comm, &ar);
            if (ar != ncclSuccess && ar != ncclInProgress) {
                ncclCommAbort(s->comm);
                ust_fatal(UST_EXIT_RUNTIME, "comm/nccl: %s on group '%s' (member %d of %d): %s",
                          comm_kind_name(d->kind), c->name, c->rank, c->size,
                          ncclGetErrorString(ar));
            }
            if (log_now_s() > deadline) {
                ncclCommAbort(s->comm);
                int w[1024], n = comm_other_members(c, w, 1024);
                comm_fail_timeout(c, d->kind, w, n);
            }
            sleep_us(nap);
            nap = nap < 500 ? nap * 2 : nap;
            flight_poll(c->ctx->fl); /* a SIGUSR2 asks for the flight recorder's file */
        }
        give_event(s, ev);
    }
}

static void nccl_free(ust_comm *c) {
    nccl_comm *s = c->impl;
    if (s->comm) {
        ready(c, COMM_BARRIER);
        ncclResult_t r = ncclCommFinalize(s->comm);
        if (r == ncclInProgress) settle(c, COMM_BARRIER, r, "ncclCommFinalize");
        ncclCommDestroy(s->comm);
    }
    for (int i = 0; i < s->nfree; i++) cudaEventDestroy(s->free_ev[i]);
    if (s->ready) cudaEventDestroy(s->ready);
    if (s->stream) cudaStreamDestroy(s->stream);
    if (s->scratch) cudaFree(s->scratch);
    free(s->free_ev);
    free(s->ev_of);
    free(s);
    c->impl = NULL;
}

#define FILL(op) .op = nccl_##op,
const comm_backend_ops comm_nccl_backend = {COMM_BACKEND_LIST(FILL)};
#undef FILL

#else
/* Without NCCL this file is empty: comm.c finds no NCCL vtable and refuses the backend. */
typedef int comm_nccl_not_built;
#endif
