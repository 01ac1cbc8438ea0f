/* comm_shm internals: the shared-memory backend for CPU ranks on one node, in two files.
 * comm_shm_segment.c owns a communicator's segment (creating, reserving, mapping, unlinking it,
 * sweeping what dead jobs left) and waiting (futex sleep with peer liveness checks);
 * comm_shm.c runs the collectives and point-to-point messages on a mapped segment.
 * Needs: comm_impl.h's communicator and the bootstrap store. Guarantees: what one file lays
 * out here the other reads the same way. Only these two files include this header. */
#ifndef UST_COMM_SHM_H
#define UST_COMM_SHM_H

#include "comm_impl.h"

#include <stdatomic.h>

#define SHM_MAGIC 0x55534853u /* "USHS" */
#define CL 64
#define SHM_MAX_WAITING 1024 /* members named in a timeout message */
#ifndef SHM_SPIN_MIN_S
#define SHM_SPIN_MIN_S 2e-6 /* bounds of the adaptive spin before a futex sleep */
#define SHM_SPIN_MAX_S 50e-6
#endif
#ifndef SHM_YIELD_MAX_S
#define SHM_YIELD_MAX_S 200e-6 /* bound of the sched_yield poll of oversubscribed ranks */
#endif

/* Segment: a header of futex words, per-member lines, n*n point-to-point rings, and two staging
 * areas of n slots each (comm_shm.c says how collectives use them). */
typedef struct {
    _Alignas(CL) _Atomic uint32_t arrived; /* last barrier this member reached */
    _Atomic uint32_t doorbell;             /* bumped when a p2p ring of this member moves */
    _Atomic uint32_t sleepers;             /* this member sleeps on doorbell */
    int32_t pid;
    uint64_t start; /* its start time (/proc/<pid>/stat field 22), 0 when unknown */
    /* where this member is, for a timeout to name who is behind: the operation it runs (its
     * sequence number on the communicator and kind) and the last one it completed; at == done
     * means it is between operations (computing, or stopped) */
    _Atomic uint64_t at_seq, done_seq;
    _Atomic uint32_t at_kind;
} shm_member;

typedef struct {
    _Alignas(CL) _Atomic uint64_t head; /* bytes written by the sender, ever */
    _Alignas(CL) _Atomic uint64_t tail; /* bytes consumed by the receiver, ever */
} shm_chan;

typedef struct {
    _Alignas(CL) uint32_t magic, n;
    uint64_t slot_bytes, chan_bytes;
    _Alignas(CL) _Atomic uint32_t attached;
    _Atomic uint32_t abandoned; /* a member gave up before everyone attached (it failed) */
    _Alignas(CL) _Atomic uint32_t arrive; /* barrier arrivals, ever (mod 2^32) */
    _Alignas(CL) _Atomic uint32_t gen;    /* barriers completed (futex word) */
    _Atomic uint32_t sleepers;
} shm_hdr;

/* A communicator's c->impl: the mapped segment carved into its parts, and this member's state. */
typedef struct {
    uint8_t *base;
    size_t len;
    shm_hdr *hdr;
    shm_member *mem;   /* n */
    shm_chan *chan;    /* n*n, index src*n + dst */
    uint8_t *ring;     /* n*n rings of chan_bytes */
    uint8_t *stage;    /* 2 areas of n slots of slot_bytes */
    uint32_t barriers; /* barriers this member has passed */
    int area;          /* staging area of the next round */
    double spin_s;     /* current spin budget (see shm_wait) */
    double yield_s;    /* current yield-poll budget of oversubscribed ranks (shm_wait) */
    uint32_t nwaits;   /* waits so far (every 64th probes with the full budget) */
    char shm_name[128];
    int unlinked;
} shm_comm;

typedef int (*wait_pred)(const ust_comm *c, const void *arg);
/* Fills waiting[] with the members this wait still needs; returns how many. */
typedef int (*wait_who)(const ust_comm *c, const void *arg, int *waiting);

/* Waits until pred holds, sleeping on futex word w (whose waker bumps it and then wakes
 * *sleepers). On the deadline, or when a member it waits on has died, exits naming them. */
void shm_wait(ust_comm *c, comm_kind k, _Atomic uint32_t *w, _Atomic uint32_t *sleepers,
              wait_pred pred, wait_who who, const void *arg);
/* Wakes the sleepers on futex word w (after the caller bumped it), if there are any. */
void shm_wake(_Atomic uint32_t *w, _Atomic uint32_t *sleepers);

/* The backend's wait_until (comm_shm.c): runs the queued operations up to seq. */
void shm_wait_until(ust_comm *c, uint64_t seq);

#endif
