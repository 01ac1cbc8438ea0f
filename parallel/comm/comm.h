/* comm: collectives and point-to-point transfers on a communicator made from any rank list.
 * A comm_ctx holds the backend (shared memory for CPU ranks on one node, with gloo over TCP for
 * CPU groups across nodes; NCCL for GPUs) and the deadline dist.timeout_s; comm_create_many makes
 * several communicators at once (collective over the whole job), and any number of them can be in
 * use together. Every operation is asynchronous: it returns a comm_req and comm_wait completes it.
 * A wait that passes the deadline prints the operation, group, this rank and the peers it waited
 * on, then exits with UST_EXIT_RUNTIME. Ordering rules: at comm_req; what the traffic counters
 * count: at comm_counters. */
#ifndef UST_COMM_H
#define UST_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "bootstrap.h"
#include "error.h"
#include "ops.h"
#include "trace.h"

typedef enum { COMM_FP32, COMM_BF16 } comm_dtype; /* bf16: uint16 storage, fp32 accumulation */
typedef enum { COMM_SUM, COMM_AVG } comm_redop;   /* AVG = SUM / members */
typedef enum { COMM_BACKEND_SHM, COMM_BACKEND_NCCL } comm_backend;

typedef enum {
    COMM_ALLREDUCE,
    COMM_ALLGATHER,
    COMM_REDUCE_SCATTER,
    COMM_BROADCAST,
    COMM_ALLTOALL, /* all-to-all and all-to-allv */
    COMM_SENDRECV, /* batched point-to-point */
    COMM_BARRIER,
    COMM_NKINDS
} comm_kind;

typedef struct comm_ctx comm_ctx;
typedef struct ust_comm ust_comm;

/* Ordering rules (the same as for blocking MPI/NCCL collectives):
 *  - On one communicator, every member posts the same collectives in the same order; operations
 *    on one communicator complete in the order they were posted.
 *  - Across communicators, ranks must wait in a consistent order. The shared-memory backend
 *    runs the posted operations of a communicator when one of them is waited on (so posting
 *    several and waiting later is fine, and a wait completes everything posted before it on
 *    that communicator); NCCL runs them on its stream as they are posted.
 *  - Buffers, count arrays and p2p lists passed to an operation must stay valid and unchanged
 *    until its wait returns. Buffers are device pointers (host memory for the shm backend).
 *  - A communicator is used by one thread at a time.
 *
 * A posted operation. Plain value, no allocation; wait on it exactly once (waiting on a request
 * that already completed, or on a zero request, returns at once). */
typedef struct {
    ust_comm *comm;
    uint64_t seq;
} comm_req;

/* Counters: per communicator and operation kind, the calls made and the bytes this rank SENT
 * under the bandwidth-optimal algorithm (the nccl-tests "bus" convention), so a higher layer can
 * check its traffic against the analytic formula. For n members and B = bytes of one rank's
 * full buffer:
 *   all-reduce     2(n-1)/n * B         (ring: reduce-scatter + all-gather)
 *   all-gather     (n-1) * sendbytes    (B = n * sendbytes is the output)
 *   reduce-scatter (n-1) * recvbytes    (B = n * recvbytes is the input)
 *   broadcast      B on the root, 0 elsewhere
 *   all-to-all(v)  sum of the bytes sent to the other members (the part kept locally is free)
 *   send/recv      sum of the bytes of the sends (sends to oneself are free)
 *   barrier        0
 * Both backends count the same numbers, whatever algorithm moves the data. A communicator of
 * one member counts calls but no bytes. */
typedef struct {
    uint64_t bytes[COMM_NKINDS]; /* bytes this rank sent, see the table above */
    uint64_t calls[COMM_NKINDS];
    double wait_s; /* wall seconds this rank spent in comm_wait on the group's operations: the
                      one place communication time is counted (per group, for the reports) */
} comm_counters;

typedef struct {
    comm_backend backend;
    double timeout_s;       /* deadline of every wait (dist.timeout_s); <= 0 means 300 */
    size_t shm_slot_bytes;  /* shm: staging bytes per member and round (0: 2 MiB) */
    size_t shm_chan_bytes;  /* shm: ring buffer per ordered pair for send/recv (0: 256 KiB) */
    int flight_entries;     /* flight recorder ring (logging.flight_entries; 0: off) */
    const char *flight_dir; /* where its rank_R.json goes (NULL: kept in memory only) */
} comm_opts;

/* One entry of a batched send/recv: `count` elements to or from comm-local rank `peer`. */
typedef struct {
    int peer;
    int is_send;
    void *buf; /* const for sends */
    size_t count;
} comm_p2p;

/* One group to create: its name (shown in errors and reports, up to 31 chars) and its members as
 * global ranks, in the order that defines the comm-local rank (0..n-1). */
typedef struct {
    const char *name;
    const int *ranks;
    int n;
} comm_group_spec;

/* Sets up the backend for this rank. Shm on a job spanning several nodes: groups inside a node
 * keep shared memory, groups across nodes use gloo over TCP (refused when built without gloo);
 * UST_COMM_GLOO=all in the environment gives gloo every CPU group of several members (tests).
 * NCCL: selects GPU local_rank % devices. Returns -1 with a message on user-fixable problems. */
int comm_ctx_init(comm_ctx **ctx, ust_boot *boot, const comm_opts *opts, ust_err *e);
void comm_ctx_free(comm_ctx *ctx); /* frees every communicator made from it */
/* NCCL: each operation first waits (on the GPU) for the work already enqueued on this compute
 * stream (a cudaStream_t; default NULL, the legacy default stream). Ignored by shm. */
void comm_ctx_set_stream(comm_ctx *ctx, void *stream);
comm_backend comm_ctx_backend(const comm_ctx *ctx);
const char *comm_backend_name(comm_backend b);
int comm_backend_available(comm_backend b); /* NCCL compiled in (does not probe for a GPU) */
int comm_gloo_available(void);              /* gloo compiled in (CPU groups across nodes) */

/* Collective over the WHOLE job: every rank calls it the same number of times, each time with
 * the groups it belongs to (possibly none; the list may differ between ranks, but a group's
 * name and member list are the same on all its members). out[i] receives group i. One bootstrap
 * fence per call; meant for start-up (topology creates every group in one call). */
int comm_create_many(comm_ctx *ctx, int ngroups, const comm_group_spec *groups, ust_comm **out,
                     ust_err *e);
void comm_free(ust_comm *c);

int comm_rank(const ust_comm *c); /* comm-local rank of this process */
int comm_size(const ust_comm *c);
int comm_global_rank(const ust_comm *c, int local); /* member `local` as a global rank */
const char *comm_name(const ust_comm *c);
const char *comm_group_backend(const ust_comm *c); /* "shm", "gloo" or "nccl" */

/* Counts are in elements of dtype. In-place is allowed where noted. */
/* recv = op over members of send (count elements each); send == recv allowed. */
comm_req comm_allreduce(ust_comm *c, const void *send, void *recv, size_t count, comm_dtype t,
                        comm_redop op);
/* recv[i*count ..] = member i's send (count elements); send == recv + rank*count allowed. */
comm_req comm_allgather(ust_comm *c, const void *send, void *recv, size_t count, comm_dtype t);
/* recv (count) = op over members of their send[rank*count ..]; send holds size*count elements;
 * recv == send + rank*count allowed. */
comm_req comm_reduce_scatter(ust_comm *c, const void *send, void *recv, size_t count, comm_dtype t,
                             comm_redop op);
/* buf on every member = buf of comm-local rank root. */
comm_req comm_broadcast(ust_comm *c, void *buf, size_t count, comm_dtype t, int root);
/* Member i sends scounts[j] elements from send + sdispls[j] to member j, which receives them at
 * recv + rdispls[i] (rcounts[i] must equal member i's scounts[j]). Displacements in elements.
 * send and recv must not overlap. */
comm_req comm_alltoallv(ust_comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                        void *recv, const size_t *rcounts, const size_t *rdispls, comm_dtype t);
/* Equal counts: count elements to and from every member, packed in member order. */
comm_req comm_alltoall(ust_comm *c, const void *send, void *recv, size_t count, comm_dtype t);
/* Posts every send and recv of the list together; they complete together and cannot deadlock
 * against each other (two ranks may send to each other in one batch). Messages between a pair
 * match in posting order and must have equal counts. The caller on the other side needs only
 * its own matching batch entries; members not named are not involved. */
comm_req comm_sendrecv(ust_comm *c, const comm_p2p *ops, int nops, comm_dtype t);
comm_req comm_barrier(ust_comm *c);
/* Sums n (<= 4) doubles over c, in place, through dev (2n floats of device memory from ops):
 * each double travels as a float plus its rounding error, so the sum keeps ~48 bits. Blocks. */
void comm_sum_doubles(ust_comm *c, const ust_ops *ops, float *dev, double *x, int n);

/* The timeline every operation is recorded in while it is on (trace.h; NULL: none): each
 * operation as an asynchronous event from its post to the end of the wait that completed it
 * (group, kind, seq, collective number, bytes), and each wait as a span on the comm thread. */
void comm_ctx_set_trace(comm_ctx *ctx, ust_trace *t);
ust_trace *comm_trace(const ust_comm *c); /* its ctx's */
ust_trace *comm_ctx_trace(const comm_ctx *ctx);

/* Names the next operation posted on c in the flight recorder (flight.h), e.g. pp's
 * "recv act chunk 0 mb 5"; up to 47 bytes are kept. */
void comm_flight_label(ust_comm *c, const char *label);

/* Shared memory runs posted operations only when they are waited on: when the one operation
 * outstanding on c is a batch of sends that fit in their rings now, this completes it at once
 * (it waits for no one), so that the data leaves before the caller computes. Else, and on
 * other backends (which start operations as they are posted), nothing. */
void comm_progress(ust_comm *c);

/* Completes r (and, on shm, everything posted before it on the same communicator). */
void comm_wait(comm_req *r);
void comm_wait_all(comm_req *r, int n); /* in array order */

size_t comm_dtype_size(comm_dtype t);
/* The dtype of the backend's activations (ops.h act_size): what tp, cp, pp and ep move. */
static inline comm_dtype comm_act_dtype(const ust_ops *o) {
    return o->act_size == 2 ? COMM_BF16 : COMM_FP32;
}
const char *comm_kind_name(comm_kind k);
const comm_counters *comm_get_counters(const ust_comm *c);
void comm_reset_counters(ust_comm *c);

/* bf16 helpers (round to nearest even), shared by the shm backend and tests. */
float comm_bf16_to_f32(uint16_t h);
uint16_t comm_f32_to_bf16(float f);

#endif
