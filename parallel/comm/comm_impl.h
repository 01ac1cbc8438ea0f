/* comm internals: shared by comm.c (argument checks, counters, the queue of posted operations,
 * dispatch through the backend's vtable), comm_common.c and the backends comm_shm.c and
 * comm_nccl.c. Only those files and the comm tests include this header. */
#ifndef UST_COMM_IMPL_H
#define UST_COMM_IMPL_H

#include "comm.h"
#include "comm_common.h"
#include "flight.h"

enum { FLIGHT_LABEL = 48, FLIGHT_P2P = 4 }; /* flight recorder: label bytes, p2p kept per entry */

/* One posted operation, as the caller described it (pointers are the caller's). For all-to-all
 * with equal counts the count arrays are NULL and `count` is the per-member count. */
typedef struct {
    comm_kind kind;
    const void *send;
    void *recv; /* broadcast: the buffer */
    size_t count;
    comm_dtype t;
    comm_redop op;
    int root;
    const size_t *scounts, *sdispls, *rcounts, *rdispls;
    const comm_p2p *p2p;
    int np2p;
    uint64_t seq;
    int fidx;      /* its flight recorder entry */
    uint64_t coll; /* its number among the group's collectives (0: p2p) */
    double tpost;  /* tracing: when it was posted (log_now_s; 0 when not traced) */
} comm_desc;

typedef struct comm_backend_ops comm_backend_ops;

struct ust_comm {
    comm_ctx *ctx;
    char name[32];
    int rank, size;
    int *granks; /* global rank of each member */
    comm_counters cnt;
    uint64_t posted;  /* seq of the last posted operation (first is 1) */
    uint64_t done;    /* every seq <= done has completed */
    comm_desc *queue; /* posted, not yet completed: seqs done+1 .. posted, ring of qcap */
    int qcap;
    const comm_backend_ops *be; /* this group's backend: the ctx's, or gloo for a CPU group that
                                   spans nodes (comm_create_many) */
    void *impl;                 /* backend state */
    /* flight recorder (flight.c): this group's number, its collectives posted, p2p messages
     * sent to and received from each member, the label of the next operation */
    int fid;
    uint64_t fcolls, *fsent, *frecvd;
    char flabel[FLIGHT_LABEL];
};

struct comm_ctx {
    comm_backend backend;
    const comm_backend_ops *be; /* chosen once, by comm_ctx_init */
    ust_boot *boot;
    comm_opts opts; /* defaults filled in */
    int ncalls;     /* comm_create_many calls so far (part of every bootstrap key) */
    int spin;       /* shm: may spin briefly before sleeping (enough cores for the local ranks) */
    void *stream;   /* NCCL: the compute stream operations follow (comm_ctx_set_stream) */
    ust_comm **all;
    int nall, capall;
    void *impl;
    void *gloo;       /* gloo's per-process state (comm_gloo.c), when a group may span nodes */
    int gloo_all;     /* UST_COMM_GLOO=all: every CPU group of several members uses gloo */
    flight *fl;       /* the flight recorder (NULL: off) */
    ust_trace *trace; /* the timeline (NULL: off), comm_ctx_set_trace */
    int nfid;         /* groups created so far (each gets the next flight number) */
};

/* Access to a desc's per-member counts and displacements (all-to-all with equal counts). */
static inline size_t desc_scount(const comm_desc *d, int j) {
    return d->scounts ? d->scounts[j] : d->count;
}
static inline size_t desc_sdispl(const comm_desc *d, int j) {
    return d->sdispls ? d->sdispls[j] : (size_t)j * d->count;
}
static inline size_t desc_rcount(const comm_desc *d, int j) {
    return d->rcounts ? d->rcounts[j] : d->count;
}
static inline size_t desc_rdispl(const comm_desc *d, int j) {
    return d->rdispls ? d->rdispls[j] : (size_t)j * d->count;
}

/* A backend: comm.c calls these and nothing else of it. ctx_init checks that the backend can run
 * here; create_begin runs before the bootstrap fence of comm_create_many (the group's first
 * member creates the shared resource and publishes its name under key), create_end after it
 * (the others attach). launch, when not NULL, starts operation d as it is posted (NCCL);
 * wait_until completes every queued operation up to seq (shm runs them there, in order,
 * advancing c->done); free releases a communicator's c->impl. */
struct comm_backend_ops {
    int (*ctx_init)(comm_ctx *ctx, ust_err *e);
    void (*ctx_free)(comm_ctx *ctx);
    int (*create_begin)(ust_comm *c, const char *key, ust_err *e);
    int (*create_end)(ust_comm *c, const char *key, ust_err *e);
    void (*launch)(ust_comm *c, const comm_desc *d);
    void (*wait_until)(ust_comm *c, uint64_t seq);
    void (*free)(ust_comm *c);
};
/* Its members in order, for each backend's fill (`#define FILL(op) .op = shm_##op,`). */
#define COMM_BACKEND_LIST(X)                                                                       \
    X(ctx_init) X(ctx_free) X(create_begin) X(create_end) X(launch) X(wait_until) X(free)

extern const comm_backend_ops comm_shm_backend; /* comm_shm.c */
#ifdef UST_NCCL
extern const comm_backend_ops comm_nccl_backend; /* comm_nccl.c, only with -DUST_NCCL */
#endif
#ifdef UST_GLOO
extern const comm_backend_ops comm_gloo_backend; /* comm_gloo.c, only with -DUST_GLOO */
#endif

/* shm: d is a batch of sends only, all of which fit in their rings now (comm_progress). */
int shm_sends_fit(const ust_comm *c, const comm_desc *d);

/* Liveness of a process on this node (what the shm backend checks of a peer that keeps it
 * waiting): NULL while pid runs and, when start is not 0, is still the process that started at
 * that time (shm_proc_start, clock ticks after boot); otherwise what became of it. */
const char *shm_proc_gone(long pid, uint64_t start);
uint64_t shm_proc_start(long pid);

#endif
