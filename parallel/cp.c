/* cp.c: ring attention (and its all-gather variant) over the context-parallel group. */
#include "cp.h"
#include "log.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"

void cp_layout_positions(ust_cp_layout layout, int T, int n, int r, int32_t *out) {
    if (layout == CP_CONTIGUOUS || n == 1) {
        int len = T / n;
        for (int j = 0; j < len; j++) out[j] = r * len + j;
        return;
    }
    /* zigzag: chunks r and 2n-1-r of 2n, so an early (cheap) and a late (costly) chunk */
    int c = T / (2 * n);
    for (int j = 0; j < c; j++) {
        out[j] = r * c + j;
        out[c + j] = (2 * n - 1 - r) * c + j;
    }
}

/* (query, key) pairs with key position <= query position, for the pair-count report. Every
 * layout gives a rank increasing positions, so one pass with two pointers counts them. */
static double visible_pairs(const int32_t *qp, const int32_t *kp, int Tl) {
    double n = 0;
    int j = 0;
    for (int i = 0; i < Tl; i++) {
        while (j < Tl && kp[j] <= qp[i]) j++;
        n += j;
    }
    return n;
}

void cp_init(ust_cp *cp, const ust_ops *ops, ust_comm *comm, ust_arena *arena, int T, int B, int H,
             int Hkv, int D, ust_cp_layout layout, ust_cp_comm mode) {
    memset(cp, 0, sizeof *cp);
    cp->ops = ops;
    cp->comm = comm;
    cp->n = comm ? comm_size(comm) : 1;
    cp->rank = comm ? comm_rank(comm) : 0;
    UST_ASSERT(T % (cp->n == 1 ? 1 : 2 * cp->n) == 0, "T %d over cp %d", T, cp->n);
    cp->T = T;
    cp->Tl = T / cp->n;
    cp->B = B;
    cp->Hkv = Hkv;
    cp->D = D;
    cp->layout = layout;
    cp->mode = mode;
    cp->pos_host = malloc((size_t)cp->n * cp->Tl * sizeof(int32_t));
    for (int r = 0; r < cp->n; r++)
        cp_layout_positions(layout, T, cp->n, r, cp->pos_host + (size_t)r * cp->Tl);
    cp->block_pairs = malloc(cp->n * sizeof(double));
    cp->block_max = malloc(cp->n * sizeof(int32_t));
    for (int r = 0; r < cp->n; r++) {
        cp->block_pairs[r] =
            visible_pairs(cp_positions_of(cp, cp->rank), cp_positions_of(cp, r), cp->Tl);
        cp->block_max[r] = cp_positions_of(cp, r)[cp->Tl - 1]; /* positions increase */
    }
    cp_alloc_buffers(cp, arena, H);
    ops->to_device(ops, cp->pos, cp->pos_host, (size_t)cp->n * cp->Tl * sizeof(int32_t));
}

void cp_alloc_buffers(ust_cp *cp, ust_arena *arena, int H) {
    const ust_ops *ops = cp->ops;
    int B = cp->B, Hkv = cp->Hkv, D = cp->D;
    cp->pos = mem_alloc(arena, MEM_ACTS, (size_t)cp->n * cp->Tl * sizeof(int32_t));
    if (cp->n == 1) return;
    size_t blk = act_bytes(ops, (int64_t)B * cp->Tl * Hkv * D);
    cp->acc_dk = mem_alloc(arena, MEM_ACTS, blk);
    cp->acc_dv = mem_alloc(arena, MEM_ACTS, blk);
    if (cp->mode == CP_RING) {
        for (int s = 0; s < 2; s++)
            for (int k = 0; k < 4; k++) cp->kv[s][k] = mem_alloc(arena, MEM_ACTS, blk);
    } else {
        cp->all_k = mem_alloc(arena, MEM_ACTS, blk * cp->n);
        cp->all_v = mem_alloc(arena, MEM_ACTS, blk * cp->n);
        cp->all_dk = mem_alloc(arena, MEM_ACTS, blk * cp->n);
        cp->all_dv = mem_alloc(arena, MEM_ACTS, blk * cp->n);
    }
    cp->part_out = mem_alloc(arena, MEM_ACTS, act_bytes(ops, (int64_t)B * cp->Tl * H * D));
    cp->part_lse = mem_alloc(arena, MEM_ACTS, (size_t)B * H * cp->Tl * sizeof(float));
}

ust_cp cp_shape(const ust_ops *ops, int n, int T, int B, int Hkv, int D, ust_cp_comm mode) {
    ust_cp cp = {.ops = ops, .n = n, .T = T, .Tl = T / n, .B = B, .Hkv = Hkv, .D = D,
                 .mode = mode};
    return cp;
}

int cp_local_len(const ust_cp *cp) { return cp->Tl; }
int cp_is_first(const ust_cp *cp) { return cp->rank == 0; }

void cp_free(ust_cp *cp) {
    free(cp->pos_host);
    free(cp->block_pairs);
    free(cp->block_max);
    cp->pos_host = NULL;
    cp->block_pairs = NULL;
    cp->block_max = NULL;
}
const int32_t *cp_positions_of(const ust_cp *cp, int r) {
    return cp->pos_host + (size_t)r * cp->Tl;
}
const int32_t *cp_positions_device(const ust_cp *cp) { return cp->pos + (size_t)cp->rank * cp->Tl; }

static const int32_t *pos_dev(const ust_cp *cp, int r) { return cp->pos + (size_t)r * cp->Tl; }

static void count(ust_cp *cp, int owner, int H) {
    cp->pairs += (double)cp->B * H * cp->block_pairs[owner];
}

static const int32_t *starts(const cp_docs *docs) { return docs ? docs->start : NULL; }

/* Under document masking, no query here can see the block of `owner` (counted). The local
 * block never is: every query sees itself. */
static int hidden(ust_cp *cp, int owner, const cp_docs *docs) {
    if (!docs || owner == cp->rank || cp->block_max[owner] >= docs->min_start) return 0;
    cp->skipped++;
    return 1;
}

/* Posts (the list lives in cp until the wait): send the `nbuf` buffers of send[] to the next rank,
 * receive as many into recv[] from the previous one (one batch, so two ranks exchanging with each
 * other cannot deadlock). */
static comm_req pass_on(ust_cp *cp, act *const *send, act *const *recv, int nbuf) {
    comm_p2p *ops = cp->p2p; /* must stay valid until the wait */
    size_t count = (size_t)cp->B * cp->Tl * cp->Hkv * cp->D;
    int next = (cp->rank + 1) % cp->n, prev = (cp->rank + cp->n - 1) % cp->n;
    for (int i = 0; i < nbuf; i++) {
        ops[2 * i] = (comm_p2p){.peer = next, .is_send = 1, .buf = send[i], .count = count};
        ops[2 * i + 1] = (comm_p2p){.peer = prev, .is_send = 0, .buf = recv[i], .count = count};
    }
    return comm_sendrecv(cp->comm, ops, 2 * nbuf, comm_act_dtype(cp->ops));
}

static void gather_blocks(ust_cp *cp, const act *k, const act *v) {
    size_t count = (size_t)cp->B * cp->Tl * cp->Hkv * cp->D;
    comm_dtype t = comm_act_dtype(cp->ops);
    comm_req r[2] = {comm_allgather(cp->comm, k, cp->all_k, count, t),
                     comm_allgather(cp->comm, v, cp->all_v, count, t)};
    comm_wait_all(r, 2);
}

static size_t blk(const ust_cp *cp) { return (size_t)cp->B * cp->Tl * cp->Hkv * cp->D; }

/* Block r of an allgather-mode buffer (every rank's block, in rank order). */
static act *block_of(const ust_cp *cp, act *all, int r) {
    return act_at(cp->ops, all, (int64_t)r * blk(cp));
}

void cp_attention_fwd(ust_cp *cp, act *out, float *lse, const act *q, const act *k, const act *v,
                      int H, const cp_docs *docs) {
    const ust_ops *o = cp->ops;
    int B = cp->B, Tl = cp->Tl, Hkv = cp->Hkv, D = cp->D, n = cp->n;
    const int32_t *qp = pos_dev(cp, cp->rank);
    if (n > 1 && cp->mode == CP_ALLGATHER) gather_blocks(cp, k, v);
    const act *ck = k, *cv = v;
    /* step s works on the block of rank - s; the local block comes first: it holds the diagonal,
     * so every query sees at least one key before any merge */
    for (int s = 0; s < n; s++) {
        int owner = (cp->rank - s + n) % n;
        comm_req r = {0};
        act *nk = NULL, *nv = NULL;
        if (cp->mode == CP_RING && s + 1 < n) {
            /* send the block in hand on before computing with it, so the transfer overlaps */
            act *send[2] = {(act *)ck, (act *)cv};
            act *recv[2] = {cp->kv[(s + 1) % 2][0], cp->kv[(s + 1) % 2][1]};
            r = pass_on(cp, send, recv, 2);
            nk = recv[0], nv = recv[1];
        } else if (cp->mode == CP_ALLGATHER && s > 0) {
            ck = block_of(cp, cp->all_k, owner), cv = block_of(cp, cp->all_v, owner);
        }
        if (s == 0) {
            o->attention_fwd(o, out, lse, q, ck, cv, B, Tl, Tl, H, Hkv, D, qp, qp, 1, starts(docs));
            count(cp, owner, H);
        } else if (!hidden(cp, owner, docs)) {
            o->attention_fwd(o, cp->part_out, cp->part_lse, q, ck, cv, B, Tl, Tl, H, Hkv, D, qp,
                             pos_dev(cp, owner), 1, starts(docs));
            o->attention_merge(o, out, lse, cp->part_out, cp->part_lse, B, Tl, H, D);
            count(cp, owner, H);
        }
        if (nk) {
            comm_wait(&r);
            ck = nk, cv = nv;
        }
    }
}

void cp_attention_bwd(ust_cp *cp, act *dq, act *dk, act *dv, const act *dout, const act *out,
                      const float *lse, const act *q, const act *k, const act *v, int H,
                      const cp_docs *docs) {
    const ust_ops *o = cp->ops;
    int B = cp->B, Tl = cp->Tl, Hkv = cp->Hkv, D = cp->D, n = cp->n;
    const int32_t *qp = pos_dev(cp, cp->rank);
    if (n == 1) {
        o->attention_bwd(o, dq, dk, dv, dout, out, lse, q, k, v, B, Tl, Tl, H, Hkv, D, qp, qp, 1,
                         starts(docs));
        return;
    }
    if (cp->mode == CP_ALLGATHER) {
        /* every block's gradient computed here, then summed at its owner */
        gather_blocks(cp, k, v);
        o->zero(o, cp->all_dk, act_bytes(o, blk(cp) * n));
        o->zero(o, cp->all_dv, act_bytes(o, blk(cp) * n));
        for (int r = 0; r < n; r++)
            if (!hidden(cp, r, docs))
                o->attention_bwd(o, dq, block_of(cp, cp->all_dk, r), block_of(cp, cp->all_dv, r),
                                 dout, out, lse, q, block_of(cp, cp->all_k, r),
                                 block_of(cp, cp->all_v, r), B, Tl, Tl, H, Hkv, D, qp,
                                 pos_dev(cp, r), 1, starts(docs));
        comm_dtype t = comm_act_dtype(o);
        comm_req r[2] = {
            comm_reduce_scatter(cp->comm, cp->all_dk, cp->acc_dk, blk(cp), t, COMM_SUM),
            comm_reduce_scatter(cp->comm, cp->all_dv, cp->acc_dv, blk(cp), t, COMM_SUM)};
        comm_wait_all(r, 2);
        o->add(o, dk, dk, cp->acc_dk, (int64_t)blk(cp));
        o->add(o, dv, dv, cp->acc_dv, (int64_t)blk(cp));
        return;
    }
    /* the ring: the block in hand (k, v and the gradients gathered for it so far) moves on after
     * each step; after n steps every block is back at its owner with its whole gradient */
    o->zero(o, cp->acc_dk, act_bytes(o, blk(cp)));
    o->zero(o, cp->acc_dv, act_bytes(o, blk(cp)));
    const act *ck = k, *cv = v;
    act *cdk = cp->acc_dk, *cdv = cp->acc_dv;
    for (int s = 0; s < n; s++) {
        int owner = (cp->rank - s + n) % n;
        act *const *buf = cp->kv[s % 2];
        /* the block's keys and values move on while we compute; its gradients after */
        comm_req kv = {0};
        if (s + 1 < n) {
            act *send[2] = {(act *)ck, (act *)cv};
            kv = pass_on(cp, send, buf, 2);
        }
        if (!hidden(cp, owner, docs))
            o->attention_bwd(o, dq, cdk, cdv, dout, out, lse, q, ck, cv, B, Tl, Tl, H, Hkv, D, qp,
                             pos_dev(cp, owner), 1, starts(docs));
        if (s + 1 < n) comm_wait(&kv);
        act *send[2] = {cdk, cdv};
        comm_req g = pass_on(cp, send, buf + 2, 2);
        comm_wait(&g);
        ck = buf[0], cv = buf[1], cdk = buf[2], cdv = buf[3];
    }
    o->add(o, dk, dk, cdk, (int64_t)blk(cp));
    o->add(o, dv, dv, cdv, (int64_t)blk(cp));
}
