/* ep.c: token dispatch and combine over the expert-parallel group (all-to-all). */
#include "ep.h"
#include "log.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"

void ep_init(ust_ep *ep, const ust_ops *ops, ust_comm *comm, ust_arena *arena, int E, int C,
             int64_t max_send, int64_t max_recv) {
    memset(ep, 0, sizeof *ep);
    ep->ops = ops;
    ep->comm = comm;
    ep->n = comm ? comm_size(comm) : 1;
    ep->rank = comm ? comm_rank(comm) : 0;
    UST_ASSERT(E % ep->n == 0, "%d experts do not split over %d expert-parallel ranks", E, ep->n);
    ep->E = E;
    ep->El = E / ep->n;
    ep->C = C;
    ep->max_send = max_send;
    ep->max_recv = max_recv > 0 ? max_recv : max_send * ep->n;
    if (ep->n == 1) return;
    int n = ep->n;
    ep->cnt_send = mem_alloc(arena, MEM_COMM, (size_t)E * sizeof(float));
    ep->cnt_recv = mem_alloc(arena, MEM_COMM, (size_t)E * sizeof(float));
    ep->stage = mem_alloc(arena, MEM_COMM, act_bytes(ops, ep->max_recv * C));
    ep->cnt_host = malloc((size_t)E * sizeof(float));
    ep->scounts = malloc(4 * (size_t)n * sizeof(size_t));
    ep->idx_host = malloc(2 * (size_t)ep->max_recv * sizeof(int32_t));
    UST_ASSERT(ep->cnt_host && ep->scounts && ep->idx_host, "out of host memory (ep %d)", n);
    ep->sdispls = ep->scounts + n;
    ep->rcounts = ep->scounts + 2 * n;
    ep->rdispls = ep->scounts + 3 * n;
}

void ep_free(ust_ep *ep) {
    free(ep->cnt_host);
    free(ep->scounts);
    free(ep->idx_host);
    free(ep->node);
    ep->cnt_host = NULL, ep->scounts = NULL, ep->idx_host = NULL, ep->node = NULL;
}

void ep_set_nodes(ust_ep *ep, const int *node) {
    free(ep->node);
    ep->node = malloc((size_t)ep->n * sizeof(int));
    UST_ASSERT(ep->node, "out of host memory (ep nodes)");
    memcpy(ep->node, node, (size_t)ep->n * sizeof(int));
}

int ep_size(const ust_ep *ep) { return ep ? ep->n : 1; }
int ep_rank(const ust_ep *ep) { return ep ? ep->rank : 0; }

int64_t ep_max_recv(const ust_ep *ep) { return ep->max_recv; }

int ep_local_experts(const ust_ep *ep, int *first) {
    *first = ep->rank * ep->El;
    return ep->El;
}

void ep_plan_init(ust_ep *ep, ep_plan *p, ust_arena *arena) {
    memset(p, 0, sizeof *p);
    p->send = calloc(ep->E, sizeof(int32_t));
    p->recv = calloc((size_t)ep->n * ep->El, sizeof(int32_t));
    p->local = calloc(ep->El, sizeof(int32_t));
    UST_ASSERT(p->send && p->recv && p->local, "out of host memory (ep plan)");
    if (ep->n == 1) return;
    p->order = mem_alloc(arena, MEM_ACTS, (size_t)ep->max_recv * sizeof(int32_t));
    p->inv = mem_alloc(arena, MEM_ACTS, (size_t)ep->max_recv * sizeof(int32_t));
}

void ep_plan_free(ep_plan *p) {
    free(p->send);
    free(p->recv);
    free(p->local);
    p->send = p->recv = p->local = NULL;
}

/* Staged rows arrive by source s, and within a source by local expert e. Local rows are by e,
 * then s. order maps local -> staged, inv staged -> local. */
static void regroup_indices(ust_ep *ep, ep_plan *p) {
    int n = ep->n, El = ep->El;
    int32_t *order = ep->idx_host, *inv = ep->idx_host + ep->max_recv;
    int64_t i = 0;
    for (int e = 0; e < El; e++) {
        int64_t staged = 0; /* offset of block (s, e) in the staging order */
        for (int e2 = 0; e2 < e; e2++) staged += p->recv[e2];
        for (int s = 0; s < n; s++) {
            for (int r = 0; r < p->recv[s * El + e]; r++, i++) {
                order[i] = (int32_t)(staged + r);
                inv[staged + r] = (int32_t)i;
            }
            /* to block (s+1, e): the rest of source s, then source s+1's experts before e */
            for (int e2 = e; e2 < El; e2++) staged += p->recv[s * El + e2];
            if (s + 1 < n)
                for (int e2 = 0; e2 < e; e2++) staged += p->recv[(s + 1) * El + e2];
        }
    }
    const ust_ops *o = ep->ops;
    o->to_device(o, p->order, order, (size_t)p->nrecv * sizeof(int32_t));
    o->to_device(o, p->inv, inv, (size_t)p->nrecv * sizeof(int32_t));
}

void ep_plan_make(ust_ep *ep, ep_plan *p, const int32_t *send) {
    int n = ep->n, El = ep->El, E = ep->E;
    p->nsend = 0;
    for (int e = 0; e < E; e++) p->send[e] = send[e], p->nsend += send[e];
    UST_ASSERT(p->nsend <= ep->max_send, "%lld rows > %lld", (long long)p->nsend,
               (long long)ep->max_send);
    if (n == 1) {
        memcpy(p->recv, send, (size_t)E * sizeof(int32_t));
        memcpy(p->local, send, (size_t)E * sizeof(int32_t));
        p->nrecv = p->nsend;
        return;
    }
    /* counts for the experts of rank d are send[d*El .. (d+1)*El): exactly the all-to-all block */
    const ust_ops *o = ep->ops;
    for (int e = 0; e < E; e++) ep->cnt_host[e] = (float)send[e];
    o->to_device(o, ep->cnt_send, ep->cnt_host, (size_t)E * sizeof(float));
    comm_req r = comm_alltoall(ep->comm, ep->cnt_send, ep->cnt_recv, El, COMM_FP32);
    comm_wait(&r);
    o->to_host(o, ep->cnt_host, ep->cnt_recv, (size_t)E * sizeof(float));
    p->nrecv = 0;
    memset(p->local, 0, (size_t)El * sizeof(int32_t));
    for (int i = 0; i < n * El; i++) {
        p->recv[i] = (int32_t)ep->cnt_host[i];
        p->local[i % El] += p->recv[i];
        p->nrecv += p->recv[i];
    }
    UST_ASSERT(p->nrecv <= ep->max_recv, "%lld rows > %lld", (long long)p->nrecv,
               (long long)ep->max_recv);
    regroup_indices(ep, p);
}

/* all-to-allv arguments (elements) for rows going home -> experts (to_experts) or back. */
static void exchange_args(ust_ep *ep, const ep_plan *p, int to_experts) {
    int n = ep->n, El = ep->El;
    size_t *out = to_experts ? ep->scounts : ep->rcounts,
           *in = to_experts ? ep->rcounts : ep->scounts;
    size_t *outd = to_experts ? ep->sdispls : ep->rdispls,
           *ind = to_experts ? ep->rdispls : ep->sdispls;
    size_t so = 0, si = 0;
    for (int d = 0; d < n; d++) {
        size_t mine = 0, theirs = 0;
        for (int e = 0; e < El; e++) mine += p->send[d * El + e], theirs += p->recv[d * El + e];
        out[d] = mine * ep->C, outd[d] = so, so += out[d];
        in[d] = theirs * ep->C, ind[d] = si, si += in[d];
    }
}

/* The rows moved to other ranks; and those this rank sent to another node: its tokens' copies
 * for the experts there (to_experts: dispatch) or the expert outputs it computed for their
 * tokens (the combine). */
static void count_rows(ust_ep *ep, const ep_plan *p, int to_experts) {
    int El = ep->El;
    const int32_t *out = to_experts ? p->send : p->recv;
    for (int d = 0; d < ep->n; d++)
        if (d != ep->rank)
            for (int e = 0; e < El; e++) {
                ep->rows_sent += p->send[d * El + e];
                ep->rows_received += p->recv[d * El + e];
                if (ep->node && ep->node[d] != ep->node[ep->rank])
                    ep->bytes_internode += act_bytes(ep->ops, (int64_t)out[d * El + e] * ep->C);
            }
}

void ep_dispatch(ust_ep *ep, const ep_plan *p, act *local_rows, const act *send_rows) {
    const ust_ops *o = ep->ops;
    if (ep->n == 1) {
        o->copy(o, local_rows, send_rows, act_bytes(o, p->nsend * ep->C));
        return;
    }
    exchange_args(ep, p, 1);
    comm_req r = comm_alltoallv(ep->comm, send_rows, ep->scounts, ep->sdispls, ep->stage,
                                ep->rcounts, ep->rdispls, comm_act_dtype(o));
    comm_wait(&r);
    count_rows(ep, p, 1);
    if (p->nrecv) o->moe_gather(o, local_rows, ep->stage, p->order, NULL, (int)p->nrecv, ep->C, 1);
}

void ep_combine(ust_ep *ep, const ep_plan *p, act *send_rows, const act *local_rows) {
    const ust_ops *o = ep->ops;
    if (ep->n == 1) {
        o->copy(o, send_rows, local_rows, act_bytes(o, p->nsend * ep->C));
        return;
    }
    if (p->nrecv) o->moe_gather(o, ep->stage, local_rows, p->inv, NULL, (int)p->nrecv, ep->C, 1);
    exchange_args(ep, p, 0);
    comm_req r = comm_alltoallv(ep->comm, ep->stage, ep->scounts, ep->sdispls, send_rows,
                                ep->rcounts, ep->rdispls, comm_act_dtype(o));
    comm_wait(&r);
    count_rows(ep, p, 0);
}
