/* comm_nccl: the NCCL backend for GPU ranks. One ncclComm_t per group, made non-blocking so no
 * call can hang past the deadline: the group's first member draws the ncclUniqueId and publishes
 * it through the bootstrap KV store, the others read it after the fence. Each communicator has
 * its own stream; an operation first waits (device-side, by event) for the work already queued
 * on the compute stream, runs on the communicator's stream, and records a completion event that
 * comm_wait makes the compute stream wait on (no host round trip before the GPU goes on); a
 * deadline thread per communicator holds dist.timeout_s: past it, it reports, aborts the
 * communicator and ends the process naming the group and its members (order: nccl_end_doc).
 * Barriers are still waited for on the host. Compiled only with -DUST_NCCL (nccl.h found). */
#ifdef UST_NCCL

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm_impl.h"
#include "flight_impl.h"
#include "log.h"
#include "nccl_api.h" /* cuda* and nccl* calls go through the dlopen'ed table */

/* A completion the compute stream waits on that the host has not seen done yet. */
typedef struct {
    cudaEvent_t ev;
    double deadline; /* log_now_s() */
    uint64_t seq;    /* the operation's number in its group */
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
    nccl_pend *pend;  /* oldest first; their deadline is the deadline thread's (nccl_dog) */
    int npend, cappend;
    /* Every NCCL call on comm (the main thread's and the deadline thread's), pend, free_ev and
     * the flags below: shared with the deadline thread. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t dog;
    int dog_started, dog_stop, device;
    int fired; /* the deadline thread ends the process: no NCCL call on comm from then on */
} nccl_comm;

/* nccl_end_doc: who ends the process, and why no thread touches an aborted or freed
 * communicator. g_end is claimed once, by compare-and-swap, by the first thread that will end
 * the process: the main thread (a fatal error of this file, nccl_claim; or any exit(), caught by
 * nccl_atexit, which runs before the static destructors made before it) or a deadline thread.
 * - A deadline thread checks g_end under g_live_mu before each CUDA or NCCL call it makes, and
 *   the main thread, having claimed, takes g_live_mu once before it aborts or exits: so a
 *   deadline thread that lost (or finds it taken) stands down with no further call, and exit()'s
 *   handlers and destructors never run beside one.
 * - A deadline thread that wins sets s->fired under s->mu. Every NCCL call of the main thread
 *   happens under s->mu after nccl_enter saw neither s->fired nor a deadline thread's g_end, so
 *   none is in flight when it aborts and none starts after: the main thread parks (nccl_park)
 *   at its next entry point or exit(). It writes the whole report (hang line, flight recorder,
 *   error) while the main thread, blocked on the GPU behind the late operation, cannot go on,
 *   and aborts only then: the abort releases the main thread, which meets a park before it can
 *   act on the aborted operation's result beyond local work. Then _exit: no atexit handler or
 *   destructor runs beside the main thread.
 * - nccl_free is an entry point too; it drains the pending completions on the host and joins
 *   the deadline thread before the communicator is destroyed and s freed. */
enum { END_NONE, END_MAIN, END_DOG };
static atomic_int g_end;
static pthread_mutex_t g_live_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_atexit_set; /* main thread only */

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Waits for a deadline thread that owns the end of the process to end it. Bounded, should that
 * thread itself be stuck (its report's I/O): then this thread ends it. */
static _Noreturn void nccl_park(void) {
    for (int i = 0; i < 1200; i++) sleep_us(100000);
    fprintf(stderr, "comm/nccl: the deadline thread did not end the process in 120 s\n");
    _exit(UST_EXIT_RUNTIME);
}

/* The main thread will end the process (a fatal error follows): parks when a deadline thread
 * already does. */
static void nccl_claim(void) {
    int none = END_NONE;
    if (!atomic_compare_exchange_strong(&g_end, &none, END_MAIN) && none == END_DOG) nccl_park();
    pthread_mutex_lock(&g_live_mu); /* no deadline thread is inside a call past this point */
    pthread_mutex_unlock(&g_live_mu);
}

static void nccl_atexit(void) { nccl_claim(); }

/* Locks s->mu for an NCCL call of the main thread; refuses (no call, a message, parks) once the
 * deadline thread ends the process. */
static void nccl_enter(ust_comm *c, comm_kind k) {
    nccl_comm *s = c->impl;
    pthread_mutex_lock(&s->mu);
    if (!s->fired && atomic_load(&g_end) != END_DOG) return;
    pthread_mutex_unlock(&s->mu);
    fprintf(stderr,
            "comm/nccl: %s on group '%s' refused: a deadline thread found an operation past "
            "dist.timeout_s and ends the process\n",
            comm_kind_name(k), c->name);
    nccl_park();
}

static void nccl_leave(ust_comm *c) { pthread_mutex_unlock(&((nccl_comm *)c->impl)->mu); }

static void nccl_check_cuda(cudaError_t r, const char *what) {
    if (r != cudaSuccess)
        ust_fatal(UST_EXIT_RUNTIME, "comm/nccl: %s: %s", what, cudaGetErrorString(r));
}

/* Waits while the (non-blocking) communicator reports ncclInProgress; fatal on errors or the
 * deadline. */
static void settle(ust_comm *c, comm_kind k, ncclResult_t r, const char *what) {
    nccl_comm *s = c->impl;
    double deadline = log_now_s() + c->ctx->opts.timeout_s;
    long nap = 10;
    while (r == ncclInProgress) {
        if (log_now_s() > deadline) {
            nccl_claim();
            ncclCommAbort(s->comm);
            int w[1024], n = comm_other_members(c, w, 1024);
            comm_fail_wait(c, k, w, n, "NCCL call did not complete before dist.timeout_s");
        }
        sleep_us(nap);
        nap = nap < 1000 ? nap * 2 : nap;
        nccl_enter(c, k);
        ncclResult_t q = ncclCommGetAsyncError(s->comm, &r);
        nccl_leave(c);
        if (q != ncclSuccess) break;
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
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* log_now_s's clock */
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
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
    nccl_enter(c, d->kind);
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
    nccl_leave(c);
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

/* The main thread's timeout of operation seq: it ends the process (nccl_end_doc). */
static _Noreturn void main_timeout(ust_comm *c, comm_kind k, uint64_t seq) {
    nccl_comm *s = c->impl;
    nccl_claim();
    ncclCommAbort(s->comm);
    char msg[3072];
    int w[1024], n = comm_other_members(c, w, 1024);
    comm_timeout_report(c, k, seq, w, n, NULL, msg, sizeof msg);
    ust_fatal(UST_EXIT_RUNTIME, "%s", msg);
}

/* The NCCL error of the communicator, ncclSuccess when none; with s->mu held. */
static ncclResult_t async_error(nccl_comm *s) {
    ncclResult_t ar = ncclSuccess;
    if (s->comm) ncclCommGetAsyncError(s->comm, &ar);
    return ar == ncclInProgress ? ncclSuccess : ar;
}

/* The main thread's fatal NCCL error (entered: s->mu held). */
static _Noreturn void main_error(ust_comm *c, comm_kind k, ncclResult_t ar) {
    nccl_comm *s = c->impl;
    nccl_claim();
    ncclCommAbort(s->comm);
    ust_fatal(UST_EXIT_RUNTIME, "comm/nccl: %s on group '%s' (member %d of %d): %s",
              comm_kind_name(k), c->name, c->rank, c->size, ncclGetErrorString(ar));
}

/* Polls ev from the host until it completes: a failed operation, an NCCL error or the deadline
 * is fatal, naming the group. For barriers (what they mean happens on the host) and at free. */
static void host_wait(ust_comm *c, cudaEvent_t ev, comm_kind k, uint64_t seq, double deadline) {
    long nap = 5;
    for (;;) {
        nccl_enter(c, k);
        cudaError_t r = cudaEventQuery(ev);
        if (r == cudaSuccess) break;
        if (r != cudaErrorNotReady)
            ust_fatal(UST_EXIT_RUNTIME, "comm/nccl: %s on group '%s': %s", comm_kind_name(k),
                      c->name, cudaGetErrorString(r));
        ncclResult_t ar = async_error(c->impl);
        if (ar != ncclSuccess) main_error(c, k, ar);
        nccl_leave(c);
        if (log_now_s() > deadline) main_timeout(c, k, seq);
        sleep_us(nap);
        nap = nap < 500 ? nap * 2 : nap;
        flight_poll(c->ctx->fl); /* a SIGUSR2 asks for the flight recorder's file */
    }
    nccl_leave(c);
}

/* Drops the pending completions now done (their events back to the free list). Returns the
 * index of the first failed one, -1 when none: its cudaError_t in *err. With s->mu held. */
static int sweep_locked(nccl_comm *s, cudaError_t *err) {
    int k = 0, bad = -1;
    for (int i = 0; i < s->npend; i++) {
        cudaError_t r = cudaEventQuery(s->pend[i].ev);
        if (r == cudaSuccess) {
            give_event(s, s->pend[i].ev);
            continue;
        }
        if (r != cudaErrorNotReady && bad < 0) bad = k, *err = r;
        s->pend[k++] = s->pend[i];
    }
    s->npend = k;
    return bad;
}

/* The deadline thread ends the process (nccl_end_doc), with s->mu and g_live_mu held: claims
 * the end (or stands down: returns), writes the report (why: NULL for the deadline), then aborts
 * the communicator and leaves with _exit. */
static void dog_fire(ust_comm *c, nccl_pend p, const char *why) {
    nccl_comm *s = c->impl;
    int none = END_NONE;
    if (!atomic_compare_exchange_strong(&g_end, &none, END_DOG)) return;
    s->fired = 1;
    pthread_mutex_unlock(&g_live_mu);
    pthread_mutex_unlock(&s->mu);
    /* the test's hook holds open the windows after the report and after the abort */
    const char *pause = getenv("UST_FAULT_NCCL_DOG_PAUSE_MS");
    long pause_us = pause ? 1000 * atol(pause) : 0;
    char msg[3072];
    if (why) {
        snprintf(msg, sizeof msg, "comm/nccl: %s on group '%s' (member %d of %d): %s",
                 comm_kind_name(p.kind), c->name, c->rank, c->size, why);
        flight_write(c->ctx->fl, "fatal"); /* what ust_fatal's hook writes */
    } else {
        int w[1024], n = comm_other_members(c, w, 1024);
        comm_timeout_report(c, p.kind, p.seq, w, n, NULL, msg, sizeof msg);
    }
    int rank = ust_error_rank();
    if (rank >= 0) fprintf(stderr, "ustrain[rank %d]: error: %s\n", rank, msg);
    if (rank < 0) fprintf(stderr, "ustrain: error: %s\n", msg);
    fflush(stdout);
    fflush(stderr);
    sleep_us(pause_us);
    ncclCommAbort(s->comm); /* releases the compute stream, so the main thread */
    sleep_us(pause_us);
    fflush(stderr);
    _exit(UST_EXIT_RUNTIME);
}

/* One look of the deadline thread, s->mu held, completions pending: an NCCL error (a dead peer)
 * ends the process, as the host's poll did; at the oldest one's deadline the done ones are
 * dropped, and a failed one or one still running ends it. The events are not queried before:
 * the emulator runs queued work when it is polled. 0: it stands down (the main thread ends the
 * process). */
static int dog_check(ust_comm *c) {
    nccl_comm *s = c->impl;
    pthread_mutex_lock(&g_live_mu);
    if (atomic_load(&g_end) != END_NONE) {
        pthread_mutex_unlock(&g_live_mu);
        return 0;
    }
    ncclResult_t ar = async_error(s);
    if (ar != ncclSuccess) dog_fire(c, s->pend[0], ncclGetErrorString(ar));
    if (atomic_load(&g_end) == END_NONE && s->pend[0].deadline <= log_now_s()) {
        cudaError_t err = cudaSuccess;
        int bad = sweep_locked(s, &err);
        if (bad >= 0) dog_fire(c, s->pend[bad], cudaGetErrorString(err));
        if (s->npend && s->pend[0].deadline <= log_now_s()) dog_fire(c, s->pend[0], NULL);
    }
    int ours = atomic_load(&g_end) == END_NONE;
    pthread_mutex_unlock(&g_live_mu);
    return ours;
}

/* The deadline thread of a communicator: while completions are pending, looks every
 * NCCL_DOG_TICK_S (an NCCL error ends the process as the host's poll did) and at the oldest
 * one's deadline. Ends at nccl_free (dog_stop), or when the main thread ends the process. */
enum { NCCL_DOG_TICK_MS = 500 };
static void *nccl_dog(void *arg) {
    ust_comm *c = arg;
    nccl_comm *s = c->impl;
    cudaSetDevice(s->device); /* the thread's own current device */
    pthread_mutex_lock(&s->mu);
    while (!s->dog_stop) {
        if (s->npend == 0) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        if (!dog_check(c)) break;
        if (s->npend == 0) continue;
        double now = log_now_s(), left = s->pend[0].deadline - now;
        if (left > NCCL_DOG_TICK_MS / 1e3) left = NCCL_DOG_TICK_MS / 1e3;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + (left > 0 ? left : 0);
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void dog_start(ust_comm *c) {
    nccl_comm *s = c->impl;
    if (s->dog_started) return;
    if (!g_atexit_set) atexit(nccl_atexit); /* after the runtime's statics: runs before them */
    g_atexit_set = 1;
    if (pthread_create(&s->dog, NULL, nccl_dog, c) != 0)
        ust_fatal(UST_EXIT_RUNTIME, "comm/nccl: cannot start the deadline thread");
    s->dog_started = 1;
}

/* The compute stream waits for the operations up to seq on the GPU (cudaStreamWaitEvent), so it
 * resumes the moment they complete and the host goes on queueing work; the host keeps only
 * their deadline (nccl_dog). A barrier is still waited for on the host. */
static void nccl_wait_until(ust_comm *c, uint64_t seq) {
    nccl_comm *s = c->impl;
    double deadline = log_now_s() + c->ctx->opts.timeout_s;
    for (uint64_t q = c->done + 1; q <= seq; q++) {
        cudaEvent_t ev = s->ev_of[q % (uint64_t)s->evcap];
        comm_kind k = c->queue[q % (uint64_t)c->qcap].kind;
        if (k == COMM_BARRIER) {
            host_wait(c, ev, k, q, deadline);
            pthread_mutex_lock(&s->mu);
            give_event(s, ev);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        dog_start(c);
        nccl_enter(c, k);
        nccl_check_cuda(cudaStreamWaitEvent(compute_stream(c), ev, 0), "stream wait");
        if (s->npend == s->cappend) {
            s->cappend = s->cappend ? 2 * s->cappend : 16;
            s->pend = realloc(s->pend, sizeof *s->pend * (size_t)s->cappend);
            UST_ASSERT(s->pend, "out of memory");
        }
        s->pend[s->npend++] = (nccl_pend){ev, deadline, q, k};
        if (s->npend == 1) pthread_cond_signal(&s->cv); /* later ones: a later deadline */
        nccl_leave(c);
    }
    /* the done ones back to the free list; a failure the host sees is reported now */
    nccl_enter(c, c->queue[seq % (uint64_t)c->qcap].kind);
    cudaError_t err = cudaSuccess;
    int bad = sweep_locked(s, &err);
    if (bad >= 0)
        ust_fatal(UST_EXIT_RUNTIME, "comm/nccl: %s on group '%s': %s",
                  comm_kind_name(s->pend[bad].kind), c->name, cudaGetErrorString(err));
    ncclResult_t ar = async_error(s);
    if (ar != ncclSuccess) main_error(c, s->npend ? s->pend[0].kind : COMM_BARRIER, ar);
    nccl_leave(c);
}

/* Every pending completion seen by the host (polling to its deadline), then the deadline thread
 * ends (joined: it no longer touches c or s). */
static void drain(ust_comm *c) {
    nccl_comm *s = c->impl;
    if (!s->dog_started) return;
    for (;;) {
        nccl_enter(c, COMM_BARRIER);
        cudaError_t err = cudaSuccess;
        int bad = sweep_locked(s, &err);
        nccl_pend p = s->npend ? s->pend[bad >= 0 ? bad : 0] : (nccl_pend){0};
        int n = s->npend;
        nccl_leave(c);
        if (bad >= 0)
            ust_fatal(UST_EXIT_RUNTIME, "comm/nccl: %s on group '%s': %s", comm_kind_name(p.kind),
                      c->name, cudaGetErrorString(err));
        if (!n) break;
        host_wait(c, p.ev, p.kind, p.seq, p.deadline);
    }
    nccl_enter(c, COMM_BARRIER);
    s->dog_stop = 1;
    pthread_cond_signal(&s->cv);
    nccl_leave(c);
    pthread_join(s->dog, NULL);
    s->dog_started = 0;
}

static void nccl_free(ust_comm *c) {
    nccl_comm *s = c->impl;
    drain(c);
    if (s->comm) {
        ready(c, COMM_BARRIER);
        nccl_enter(c, COMM_BARRIER);
        ncclResult_t r = ncclCommFinalize(s->comm);
        nccl_leave(c);
        if (r == ncclInProgress) settle(c, COMM_BARRIER, r, "ncclCommFinalize");
        nccl_enter(c, COMM_BARRIER);
        ncclCommDestroy(s->comm);
        nccl_leave(c);
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
