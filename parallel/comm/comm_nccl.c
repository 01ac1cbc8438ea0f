/* comm_nccl: the NCCL backend for GPU ranks. One ncclComm_t per group, made non-blocking so no
 * call can hang past the deadline: the group's first member draws the ncclUniqueId and publishes
 * it through the bootstrap KV store, the others read it after the fence. Each communicator has
 * its own stream; an operation first waits (device-side, by event) for the work already queued
 * on the compute stream, runs on the communicator's stream, and records a completion event;
 * comm_wait makes the compute stream wait on that event (no host round trip before the GPU goes
 * on) and a watchdog thread per communicator holds its deadline: past it, it aborts the
 * communicator (so a dead peer cannot leave a kernel or the stream waiting) and exits naming the
 * group and its members. Barriers are still waited for on the host.
 * Compiled only with -DUST_NCCL (Makefile: nccl.h found). */
#ifdef UST_NCCL

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_impl.h"
#include "log.h"
#include "nccl_api.h" /* cuda* and nccl* calls go through the dlopen'ed table */

typedef struct {
    cudaEvent_t ev;
    double deadline; /* log_now_s() */
    comm_kind kind;
} nccl_pend;

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
    /* completions the compute stream waits on (cudaStreamWaitEvent) that the host has not seen
     * yet, oldest first; the watchdog thread enforces their deadline (nccl_watchdog) */
    nccl_pend *pend;
    int npend, cappend;
    pthread_mutex_t mu; /* pend, npend and free_ev, shared with the watchdog */
    pthread_cond_t cv;
    pthread_t dog;
    int dog_started, dog_stop, device;
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
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int ngpu = 1;
    if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 1) ngpu = 1;
    s->device = c->ctx->boot->local_rank % ngpu; /* as nccl_ctx_init chose */
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
    pthread_mutex_lock(&s->mu);
    cudaEvent_t ev = s->nfree ? s->free_ev[--s->nfree] : NULL;
    pthread_mutex_unlock(&s->mu);
    if (ev) return ev;
    nccl_check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "event");
    return ev;
}

/* With s->mu held. */
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

/* Polls ev from the host until it completes: a failed operation, an NCCL error or the deadline
 * is fatal, naming the group. For barriers (what they mean happens on the host) and at free. */
static void host_wait(ust_comm *c, cudaEvent_t ev, comm_kind k, double deadline) {
    nccl_comm *s = c->impl;
    long nap = 5;
    for (;;) {
        cudaError_t r = cudaEventQuery(ev);
        if (r == cudaSuccess) return;
        if (r != cudaErrorNotReady)
            ust_fatal(UST_EXIT_RUNTIME, "comm/nccl: %s on group '%s': %s", comm_kind_name(k),
                      c->name, cudaGetErrorString(r));
        ncclResult_t ar = ncclSuccess;
        ncclCommGetAsyncError(s->comm, &ar);
        if (ar != ncclSuccess && ar != ncclInProgress) {
            ncclCommAbort(s->comm);
            ust_fatal(UST_EXIT_RUNTIME, "comm/nccl: %s on group '%s' (member %d of %d): %s",
                      comm_kind_name(k), c->name, c->rank, c->size, ncclGetErrorString(ar));
        }
        if (log_now_s() > deadline) {
            ncclCommAbort(s->comm);
            int w[1024], n = comm_other_members(c, w, 1024);
            comm_fail_timeout(c, k, w, n);
        }
        sleep_us(nap);
        nap = nap < 500 ? nap * 2 : nap;
        flight_poll(c->ctx->fl); /* a SIGUSR2 asks for the flight recorder's file */
    }
}

/* Drops the pending completions the host now sees done (their events back to the free list); a
 * failed operation or an NCCL error is fatal. With s->mu held. */
static void sweep_locked(ust_comm *c) {
    nccl_comm *s = c->impl;
    int k = 0;
    for (int i = 0; i < s->npend; i++) {
        cudaError_t r = cudaEventQuery(s->pend[i].ev);
        if (r == cudaSuccess) {
            give_event(s, s->pend[i].ev);
            continue;
        }
        if (r != cudaErrorNotReady)
            ust_fatal(UST_EXIT_RUNTIME, "comm/nccl: %s on group '%s': %s",
                      comm_kind_name(s->pend[i].kind), c->name, cudaGetErrorString(r));
        s->pend[k++] = s->pend[i];
    }
    comm_kind last = s->npend ? s->pend[s->npend - 1].kind : COMM_BARRIER;
    s->npend = k;
    /* also when every one is done: an operation that failed (a dead peer) completes its event */
    ncclResult_t ar = ncclSuccess;
    if (s->comm) ncclCommGetAsyncError(s->comm, &ar);
    if (ar != ncclSuccess && ar != ncclInProgress) {
        ncclCommAbort(s->comm);
        ust_fatal(UST_EXIT_RUNTIME, "comm/nccl: %s on group '%s' (member %d of %d): %s",
                  comm_kind_name(k ? s->pend[0].kind : last), c->name, c->rank, c->size,
                  ncclGetErrorString(ar));
    }
}

static void *nccl_abort_thread(void *comm) {
    ncclCommAbort((ncclComm_t)comm);
    return NULL;
}

/* The deadline of the completions the host no longer polls: sleeps until the oldest one's
 * deadline, and when it is still not done then, aborts the communicator (so a dead peer cannot
 * leave the compute stream waiting forever, nor the host in a later stream sync) and exits
 * naming the group, as a polling wait would have. */
static void *nccl_watchdog(void *arg) {
    ust_comm *c = arg;
    nccl_comm *s = c->impl;
    cudaSetDevice(s->device); /* the thread's own current device */
    pthread_mutex_lock(&s->mu);
    while (!s->dog_stop) {
        if (s->npend == 0) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        double left = s->pend[0].deadline - log_now_s();
        if (left > 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + left;
            ts.tv_sec = (time_t)t;
            ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
            continue;
        }
        sweep_locked(c);
        if (s->npend == 0 || s->pend[0].deadline > log_now_s()) continue;
        /* The abort ends the kernels and so the host's stream wait, after which the main thread
         * would go on: it runs beside the report, which exits first. */
        pthread_t ab;
        if (pthread_create(&ab, NULL, nccl_abort_thread, s->comm) == 0) pthread_detach(ab);
        int w[1024], n = comm_other_members(c, w, 1024);
        comm_fail_timeout(c, s->pend[0].kind, w, n);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* The compute stream waits for the operations up to seq on the GPU (cudaStreamWaitEvent), so it
 * resumes the moment they complete and the host goes on queueing work; the host keeps only
 * their deadline (nccl_watchdog). A barrier is still waited for on the host. */
static void nccl_wait_until(ust_comm *c, uint64_t seq) {
    nccl_comm *s = c->impl;
    double deadline = log_now_s() + c->ctx->opts.timeout_s;
    for (uint64_t q = c->done + 1; q <= seq; q++) {
        cudaEvent_t ev = s->ev_of[q % (uint64_t)s->evcap];
        comm_kind k = c->queue[q % (uint64_t)c->qcap].kind;
        if (k == COMM_BARRIER) {
            host_wait(c, ev, k, deadline);
            pthread_mutex_lock(&s->mu);
            give_event(s, ev);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        nccl_check_cuda(cudaStreamWaitEvent(compute_stream(c), ev, 0), "stream wait");
        if (!s->dog_started) {
            if (pthread_create(&s->dog, NULL, nccl_watchdog, c) != 0)
                ust_fatal(UST_EXIT_RUNTIME, "comm/nccl: cannot start the deadline thread");
            s->dog_started = 1;
        }
        pthread_mutex_lock(&s->mu);
        if (s->npend == s->cappend) {
            s->cappend = s->cappend ? 2 * s->cappend : 16;
            s->pend = realloc(s->pend, sizeof *s->pend * (size_t)s->cappend);
            UST_ASSERT(s->pend, "out of memory");
        }
        s->pend[s->npend++] = (nccl_pend){ev, deadline, k};
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_lock(&s->mu);
    sweep_locked(c); /* also the host's first look at each: EMU_STATS counts the overlap there */
    pthread_mutex_unlock(&s->mu);
}

/* Every pending completion seen by the host (polling to its deadline), then the watchdog ends. */
static void drain(ust_comm *c) {
    nccl_comm *s = c->impl;
    if (!s->dog_started) return;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        sweep_locked(c);
        nccl_pend p = s->npend ? s->pend[0] : (nccl_pend){0};
        int n = s->npend;
        pthread_mutex_unlock(&s->mu);
        if (!n) break;
        host_wait(c, p.ev, p.kind, p.deadline);
    }
    pthread_mutex_lock(&s->mu);
    s->dog_stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->dog, NULL);
}

static void nccl_free(ust_comm *c) {
    nccl_comm *s = c->impl;
    drain(c);
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
    free(s->pend);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
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
