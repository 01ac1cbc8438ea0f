/* ep: expert parallelism. The E experts of a MoE layer are split over the ep group of n ranks,
 * rank r holding experts [r*E/n, (r+1)*E/n). Each rank routes its own tokens; a dispatch sends
 * every token copy to the rank of its expert and a combine brings the expert outputs back:
 *   plan     per-expert row counts exchanged with one all-to-all (ep_plan_make),
 *   dispatch rows grouped by global expert -> all-to-allv -> regrouped so each local expert's
 *            rows are contiguous (by source rank, then in the sender's order),
 *   combine  the exact inverse: regroup by source -> all-to-allv -> rows back in sender order.
 * Dispatch and combine are each other's adjoints, so a backward pass uses dispatch for the
 * output gradients and combine for the input gradients, with the forward's plan.
 * With n == 1 nothing is communicated (dispatch/combine copy, or do nothing in place). */
#ifndef UST_EP_H
#define UST_EP_H

#include <stdint.h>

#include "comm.h"
#include "mem.h"
#include "ops.h"

typedef struct ust_ep {
    const ust_ops *ops;
    ust_comm *comm;
    int n, rank, E, El, C;      /* El = E/n local experts, C = row width */
    int64_t max_send, max_recv; /* rows; max_recv = n * max_send (dropless bound) */
    float *cnt_send, *cnt_recv; /* device, n*El: counts as floats (exact < 2^24) */
    float *cnt_host;            /* host, n*El */
    act *stage;                 /* device (max_recv, C): rows in source order */
    size_t *scounts, *sdispls, *rcounts, *rdispls; /* host, n each: all-to-allv arguments */
    int32_t *idx_host;                             /* host (2 * max_recv): regrouping indices */
    int64_t rows_sent, rows_received;              /* token rows moved to / from other ranks */
    /* node of each member (n entries; NULL: one node) and the bytes of token rows this rank has
     * sent to members on other nodes, dispatch and combine (the counts' all-to-all left out) */
    int *node;
    uint64_t bytes_internode;
} ust_ep;

/* One dispatch's routing: made in forward, kept with the layer's activations for the combine
 * and the backward. */
typedef struct {
    int32_t *send;        /* host E: rows this rank sends to each global expert */
    int32_t *recv;        /* host n*El: recv[s*El + e] rows from source s for local expert e */
    int32_t *local;       /* host El: rows per local expert (summed over sources) */
    int64_t nsend, nrecv; /* rows sent (= sum send) and held for the local experts */
    int32_t *order;       /* device (max_recv): local row i is staged row order[i] (n > 1) */
    int32_t *inv;         /* device (max_recv): staged row j is local row inv[j] (n > 1) */
} ep_plan;

/* comm may be NULL (all E experts local). E experts, rows of C activations, at most max_send rows
 * sent per dispatch (N*k for N tokens and top-k routing) and max_recv held for the local experts
 * (0: n * max_send, every rank's rows). Buffers come from the arena. */
void ep_init(ust_ep *ep, const ust_ops *ops, ust_comm *comm, ust_arena *arena, int E, int C,
             int64_t max_send, int64_t max_recv);
void ep_free(ust_ep *ep); /* host memory; the arena owns the rest */
int ep_size(const ust_ep *ep);
/* The local experts: returns E/n and sets *first to the global index of the first. */
int ep_local_experts(const ust_ep *ep, int *first);
/* Largest number of rows a rank may hold for its local experts (all tokens of every rank). */
int64_t ep_max_recv(const ust_ep *ep);

/* Records the node of each of the n members (node[i]: member i's; copied) so that the dispatch
 * and combine count the bytes they send across nodes (bytes_internode). */
void ep_set_nodes(ust_ep *ep, const int *node);

/* This rank's place in the group (ep may be NULL: a group of one). */
int ep_rank(const ust_ep *ep);

void ep_plan_init(ust_ep *ep, ep_plan *p, ust_arena *arena); /* host arrays malloc'd */
void ep_plan_free(ep_plan *p);                               /* the host arrays */
/* Collective over the group: send[e] = rows for global expert e (E entries). Fills p. */
void ep_plan_make(ust_ep *ep, ep_plan *p, const int32_t *send);

/* send_rows (p->nsend, C), grouped by global expert in increasing order -> local_rows
 * (p->nrecv, C), grouped by local expert. local_rows may equal send_rows only when n == 1. */
void ep_dispatch(ust_ep *ep, const ep_plan *p, act *local_rows, const act *send_rows);
/* The inverse: local_rows (p->nrecv, C) -> send_rows (p->nsend, C) in the original order. */
void ep_combine(ust_ep *ep, const ep_plan *p, act *send_rows, const act *local_rows);

#endif
