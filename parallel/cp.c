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

/* (query, key) pairs with key position <= query position, for the pair-count report. Positions
 * need not increase (a Ulysses block is its members' positions in member order). */
static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}
static double visible_pairs(const int32_t *qp, const int32_t *kp, int Tq, int Tk) {
    int32_t *sorted = malloc((size_t)Tk * sizeof *sorted);
    UST_ASSERT(sorted, "out of host memory");
    memcpy(sorted, kp, (size_t)Tk * sizeof *sorted);
    qsort(sorted, (size_t)Tk, sizeof *sorted, cmp_i32);
    double n = 0;
    for (int i = 0; i < Tq; i++) {
        int lo = 0, hi = Tk; /* keys <= qp[i]: the first index above it */
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (sorted[mid] <= qp[i])
                lo = mid + 1;
            else
                hi = mid;
        }
        n += lo;
    }
    free(sorted);
    return n;
}

/* The head split of Ulysses over a ranks: query heads H / a each; key/value heads Hkv / a, or
 * (fewer key/value heads than ranks) the one that rank's query heads use. */
static void head_split(ust_cp *cp, int H) {
    int a = cp->uly.a, Hkv = cp->Hkv;
    cp->H = H;
    cp->uly.Hq = H, cp->uly.Hk = Hkv;
    if (a > 1) {
        UST_ASSERT(H % a == 0 && (Hkv % a == 0 || a % Hkv == 0),
                   "Ulysses over %d ranks: %d query and %d key/value heads", a, H, Hkv);
        cp->uly.Hq = H / a;
        cp->uly.Hk = Hkv % a == 0 ? Hkv / a : 1;
    }
    cp->ring.Hkvr = cp->uly.Hk; /* the ring stage moves the head-split blocks */
}

/* Query heads j*Hq.. of member j use key/value heads from (j*Hq) / (H/Hkv) on. */
static int kv_first(const ust_cp *cp, int j) { return j * cp->uly.Hq / (cp->H / cp->Hkv); }

/* The ring stage's geometry and its blocks' positions (host), from the layout's. */
static void ring_blocks(ust_cp *cp) {
    int a = cp->uly.a, rn = cp->n / a, Tl = cp->Tl;
    cp->ring.rn = rn;
    cp->ring.rr = cp->rank / a;
    cp->Tb = a * Tl;
    cp->ring.bpos_host = malloc((size_t)cp->n * Tl * sizeof(int32_t));
    UST_ASSERT(cp->ring.bpos_host, "out of host memory");
    /* block g holds the tokens of cp ranks g*a .. g*a+a-1, in that order: the layout's own
     * order, so the blocks are the positions table itself */
    memcpy(cp->ring.bpos_host, cp->pos_host, (size_t)cp->n * Tl * sizeof(int32_t));
    cp->ring.block_pairs = malloc(rn * sizeof(double));
    cp->ring.block_max = malloc(rn * sizeof(int32_t));
    UST_ASSERT(cp->ring.block_pairs && cp->ring.block_max, "out of host memory");
    const int32_t *mine = cp->ring.bpos_host + (size_t)cp->ring.rr * cp->Tb;
    for (int g = 0; g < rn; g++) {
        const int32_t *kp = cp->ring.bpos_host + (size_t)g * cp->Tb;
        cp->ring.block_pairs[g] = visible_pairs(mine, kp, cp->Tb, cp->Tb);
        cp->ring.block_max[g] = kp[0];
        for (int j = 1; j < cp->Tb; j++)
            cp->ring.block_max[g] = kp[j] > cp->ring.block_max[g] ? kp[j] : cp->ring.block_max[g];
    }
}

void cp_init(ust_cp *cp, const ust_ops *ops, ust_comm *comm, ust_comm *a2a, ust_comm *ring,
             ust_arena *arena, int T, int B, int H, int Hkv, int D, int lat, ust_cp_layout layout,
             ust_cp_comm mode, int cp_a2a) {
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
    cp->lat = cp->n > 1 && (mode == CP_RING || mode == CP_ALLGATHER) ? lat : 0;
    cp->uly.a = 1;
    cp->ring.comm = comm;
    if (cp->n > 1 && mode == CP_A2A) {
        cp->uly.a = cp->n, cp->uly.comm = comm, cp->ring.comm = NULL;
    } else if (cp->n > 1 && mode == CP_A2A_RING) {
        UST_ASSERT(a2a && ring && comm_size(a2a) == cp_a2a &&
                       comm_size(a2a) * comm_size(ring) == cp->n &&
                       comm_rank(a2a) == cp->rank % cp_a2a && comm_rank(ring) == cp->rank / cp_a2a,
                   "a2a+ring: sub-groups of %d and %d ranks for cp %d, Ulysses degree %d",
                   a2a ? comm_size(a2a) : 0, ring ? comm_size(ring) : 0, cp->n, cp_a2a);
        cp->uly.a = cp_a2a, cp->uly.comm = a2a, cp->ring.comm = ring;
    }
    cp->pos_host = malloc((size_t)cp->n * cp->Tl * sizeof(int32_t));
    UST_ASSERT(cp->pos_host, "out of host memory");
    for (int r = 0; r < cp->n; r++)
        cp_layout_positions(layout, T, cp->n, r, cp->pos_host + (size_t)r * cp->Tl);
    ring_blocks(cp);
    cp_alloc_buffers(cp, arena, H);
    ops->to_device(ops, cp->ring.bpos, cp->ring.bpos_host,
                   (size_t)cp->n * cp->Tl * sizeof(int32_t));
}

static void kv_buffers(ust_cp *cp, ust_arena *arena, size_t blk);
static void latent_buffers(ust_cp *cp, ust_arena *arena, size_t blk);

void cp_alloc_buffers(ust_cp *cp, ust_arena *arena, int H) {
    const ust_ops *ops = cp->ops;
    int B = cp->B, D = cp->D;
    head_split(cp, H);
    cp->ring.bpos = mem_alloc(arena, MEM_ACTS, (size_t)cp->n * cp->Tl * sizeof(int32_t));
    if (cp->n == 1) return;
    if (cp->uly.a > 1) {
        size_t qb = act_bytes(ops, (int64_t)B * cp->Tb * cp->uly.Hq * D);
        size_t kb = act_bytes(ops, (int64_t)B * cp->Tb * cp->uly.Hk * D);
        act **q[4] = {&cp->uly.uq, &cp->uly.uo, &cp->uly.udq, &cp->uly.udo},
            **k[4] = {&cp->uly.uk, &cp->uly.uv, &cp->uly.udk, &cp->uly.udv};
        for (int i = 0; i < 4; i++) *q[i] = mem_alloc(arena, MEM_ACTS, qb);
        for (int i = 0; i < 4; i++) *k[i] = mem_alloc(arena, MEM_ACTS, kb);
        size_t stage = qb > kb ? qb : kb;
        cp->uly.sbuf = mem_alloc(arena, MEM_ACTS, stage);
        cp->uly.rbuf = mem_alloc(arena, MEM_ACTS, stage);
    }
    if (cp->ring.rn == 1) return;
    size_t blk = act_bytes(ops, (int64_t)B * cp->Tb * cp->ring.Hkvr * D);
    if (cp->lat) {
        latent_buffers(cp, arena, blk);
    } else {
        kv_buffers(cp, arena, blk);
    }
    cp->ring.part_out =
        mem_alloc(arena, MEM_ACTS, act_bytes(ops, (int64_t)B * cp->Tb * cp->uly.Hq * D));
    cp->ring.part_lse = mem_alloc(arena, MEM_ACTS, (size_t)B * cp->uly.Hq * cp->Tb * sizeof(float));
}

static void kv_buffers(ust_cp *cp, ust_arena *arena, size_t blk) {
    cp->ring.acc_dk = mem_alloc(arena, MEM_ACTS, blk);
    cp->ring.acc_dv = mem_alloc(arena, MEM_ACTS, blk);
    if (cp->mode != CP_ALLGATHER) {
        for (int s = 0; s < 2; s++)
            for (int k = 0; k < 4; k++) cp->ring.kv[s][k] = mem_alloc(arena, MEM_ACTS, blk);
    } else {
        cp->ring.all_k = mem_alloc(arena, MEM_ACTS, blk * cp->ring.rn);
        cp->ring.all_v = mem_alloc(arena, MEM_ACTS, blk * cp->ring.rn);
        cp->ring.all_dk = mem_alloc(arena, MEM_ACTS, blk * cp->ring.rn);
        cp->ring.all_dv = mem_alloc(arena, MEM_ACTS, blk * cp->ring.rn);
    }
}

/* The latent ring's: a remote block's expansion (k, v and their gradients, blk bytes each), and
 * latents (lb bytes a block) where K/V blocks would travel. */
static void latent_buffers(ust_cp *cp, ust_arena *arena, size_t blk) {
    cp_ring_stage *rg = &cp->ring;
    size_t lb = act_bytes(cp->ops, (int64_t)cp->B * cp->Tb * cp->lat);
    for (int i = 0; i < 4; i++) rg->ex[i] = mem_alloc(arena, MEM_ACTS, blk);
    rg->lat_mine = mem_alloc(arena, MEM_ACTS, lb);
    rg->acc_dlat = mem_alloc(arena, MEM_ACTS, lb);
    if (cp->mode != CP_ALLGATHER) {
        for (int s = 0; s < 2; s++)
            for (int k = 0; k < 2; k++) rg->lat[s][k] = mem_alloc(arena, MEM_ACTS, lb);
    } else {
        rg->all_lat = mem_alloc(arena, MEM_ACTS, lb * rg->rn);
        rg->all_dlat = mem_alloc(arena, MEM_ACTS, lb * rg->rn);
    }
}

ust_cp cp_shape(const ust_ops *ops, int n, int a, int T, int B, int Hkv, int D, int lat,
                ust_cp_comm mode) {
    /* clang-format off */
    ust_cp cp = {.ops = ops, .n = n, .T = T, .Tl = T / n, .B = B, .Hkv = Hkv, .D = D,
                 .mode = mode, .uly.a = n > 1 && a > 1 ? a : 1,
                 .lat = n > 1 && (mode == CP_RING || mode == CP_ALLGATHER) ? lat : 0};
    /* clang-format on */
    cp.ring.rn = n / cp.uly.a, cp.Tb = cp.uly.a * cp.Tl;
    cp.ring.Hkvr = cp.uly.a > 1 ? (Hkv % cp.uly.a == 0 ? Hkv / cp.uly.a : 1) : Hkv;
    return cp;
}

int cp_local_len(const ust_cp *cp) { return cp->Tl; }
int cp_is_first(const ust_cp *cp) { return cp->rank == 0; }
int cp_ulysses(const ust_cp *cp) { return cp->uly.a; }

void cp_free(ust_cp *cp) {
    free(cp->pos_host);
    free(cp->ring.bpos_host);
    free(cp->ring.block_pairs);
    free(cp->ring.block_max);
    free(cp->uly.ustart_host);
    for (int i = 0; i < cp->ring.nroute; i++)
        free(cp->ring.route[i].need), free(cp->ring.route[i].hops);
    cp->ring.nroute = 0;
    cp->pos_host = cp->ring.bpos_host = cp->uly.ustart_host = NULL;
    cp->ring.block_pairs = NULL;
    cp->ring.block_max = NULL;
}
const int32_t *cp_positions_of(const ust_cp *cp, int r) {
    return cp->pos_host + (size_t)r * cp->Tl;
}

/* The positions of the ring stage's block g (device). */
static const int32_t *pos_dev(const ust_cp *cp, int g) {
    return cp->ring.bpos + (size_t)g * cp->Tb;
}

static void count(ust_cp *cp, int owner, int H) {
    cp->pairs += (double)cp->B * H * cp->ring.block_pairs[owner];
}

double cp_a2a_layer_bytes(int a, int B, int Tl, int H, int Hkv, int D, int es, int backward) {
    if (a <= 1) return 0;
    double Hq = H / a, Hk = Hkv % a == 0 ? Hkv / a : 1, row = (double)(a - 1) * B * Tl * D * es;
    /* forward: q, k, v there, out back; backward: q, k, v, out, d out there, dq, dk, dv back */
    return backward ? row * (4 * Hq + 4 * Hk) : row * (2 * Hq + 2 * Hk);
}

static const int32_t *starts(const cp_docs *docs) { return docs ? docs->start : NULL; }

/* Under document masking, no query here can see the block of `owner` (counted). The local
 * block never is: every query sees itself. */
static int hidden(ust_cp *cp, int owner, const cp_docs *docs) {
    if (!docs || owner == cp->ring.rr || cp->ring.block_max[owner] >= docs->min_start) return 0;
    cp->skipped++;
    return 1;
}

static void gather_blocks(ust_cp *cp, const act *k, const act *v) {
    size_t count = (size_t)cp->B * cp->Tb * cp->ring.Hkvr * cp->D;
    comm_dtype t = comm_act_dtype(cp->ops);
    comm_req r[2] = {comm_allgather(cp->ring.comm, k, cp->ring.all_k, count, t),
                     comm_allgather(cp->ring.comm, v, cp->ring.all_v, count, t)};
    comm_wait_all(r, 2);
}

static size_t blk(const ust_cp *cp) { return (size_t)cp->B * cp->Tb * cp->ring.Hkvr * cp->D; }

/* Block r of an allgather-mode buffer (every rank's block, in rank order). */
static act *block_of(const ust_cp *cp, act *all, int r) {
    return act_at(cp->ops, all, (int64_t)r * blk(cp));
}

void cp_track_logit_max(ust_cp *cp, float *mx) { cp->logit_max = mx; }

/* QK-clip's scores of the block in hand: where attention_fwd just ran (the query heads this rank
 * scores start at its Ulysses share: member j holds heads [j Hq, (j+1) Hq)). */
static void logit_max(ust_cp *cp, const act *q, const act *k, int H, const int32_t *kp,
                      const cp_docs *docs) {
    if (!cp->logit_max) return;
    int first = cp->uly.a > 1 ? comm_rank(cp->uly.comm) * cp->uly.Hq : 0;
    cp->ops->attention_logit_max(cp->ops, cp->logit_max + first, q, k, cp->B, cp->Tb, cp->Tb, H,
                                 cp->ring.Hkvr, cp->D, pos_dev(cp, cp->ring.rr), kp, 1,
                                 starts(docs));
}

/* ---------------------------------------------------------------- routes */

/* 1 when a key of kp (sorted, Tk) lies in some query's visible range (q - W, q] (W 0: [0, q]). */
static int sees_any(const int32_t *qp, const int32_t *sorted, int Tq, int Tk, int W) {
    for (int i = 0; i < Tq; i++) {
        int32_t lo_pos = W ? qp[i] - W + 1 : 0;
        int lo = 0, hi = Tk; /* the first key >= lo_pos */
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (sorted[mid] < lo_pos)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < Tk && sorted[lo] <= qp[i]) return 1;
    }
    return 0;
}

static void make_route(const ust_cp *cp, cp_route *rt, int W) {
    int n = cp->ring.rn, Tb = cp->Tb;
    rt->window = W;
    rt->need = malloc((size_t)n * n);
    rt->hops = malloc((size_t)n * sizeof(int));
    int32_t *sorted = malloc((size_t)Tb * sizeof(int32_t));
    UST_ASSERT(rt->need && rt->hops && sorted, "out of host memory");
    for (int g = 0; g < n; g++) {
        memcpy(sorted, cp->ring.bpos_host + (size_t)g * Tb, (size_t)Tb * sizeof(int32_t));
        qsort(sorted, (size_t)Tb, sizeof *sorted, cmp_i32);
        for (int r = 0; r < n; r++)
            rt->need[r * n + g] =
                (uint8_t)sees_any(cp->ring.bpos_host + (size_t)r * Tb, sorted, Tb, Tb, W);
        rt->hops[g] = 0;
        for (int h = 1; h < n; h++)
            if (rt->need[((g + h) % n) * n + g]) rt->hops[g] = h;
    }
    free(sorted);
}

/* The route of a mask: made once, at the mask's first attention (host tables, a few per run). */
static const cp_route *route_of(ust_cp *cp, const cp_docs *docs) {
    int W = docs ? docs->window : 0;
    cp_ring_stage *rg = &cp->ring;
    for (int i = 0; i < rg->nroute; i++)
        if (rg->route[i].window == W) return &rg->route[i];
    UST_ASSERT(rg->nroute < CP_MAX_ROUTES, "more than %d attention masks", CP_MAX_ROUTES);
    make_route(cp, &rg->route[rg->nroute], W);
    return &rg->route[rg->nroute++];
}

/* The ring steps' traffic: at step s this rank holds block (rr - s) when it has come this far
 * (s <= its hops; every rank that needs it does), and passes it on while a later rank needs it. */
static int owner_at(const ust_cp *cp, int r, int s) {
    return ((r - s) % cp->ring.rn + cp->ring.rn) % cp->ring.rn;
}
static int sends_on(const ust_cp *cp, const cp_route *rt, int s) {
    return s < rt->hops[owner_at(cp, cp->ring.rr, s)];
}
/* what the previous rank passes on at step s: the block this rank holds at step s + 1 */
static int receives(const ust_cp *cp, const cp_route *rt, int s) {
    return s < rt->hops[owner_at(cp, cp->ring.rr, s + 1)];
}
static int needs(const ust_cp *cp, const cp_route *rt, int owner) {
    return rt->need[cp->ring.rr * cp->ring.rn + owner];
}

/* Posts (the list lives in cp until the wait): send the `ns` buffers of send[] to the next rank
 * and receive `nr` into recv[] from the previous one; a block's gradients going home from its
 * last rank (hs[2] to comm-local rank hs_to, -1: none) and ours coming home (into hr[2] from
 * hr_from); one batch, so two ranks exchanging with each other cannot deadlock. An empty list
 * posts nothing. */
typedef struct {
    act *const *send, *const *recv;
    int ns, nr;
    act *const *hs, *const *hr;
    int hs_to, hr_from;
    int nh;       /* buffers going home (0: 2, a block's dk and dv) */
    size_t count; /* elements of each buffer (0: a K/V block's) */
} ring_msgs;

static comm_req pass_on(ust_cp *cp, ring_msgs m) {
    comm_p2p *ops = cp->ring.p2p; /* must stay valid until the wait */
    size_t count = m.count ? m.count : blk(cp);
    int nh = m.nh ? m.nh : 2;
    int next = (cp->ring.rr + 1) % cp->ring.rn,
        prev = (cp->ring.rr + cp->ring.rn - 1) % cp->ring.rn, k = 0;
    for (int i = 0; i < m.ns; i++)
        ops[k++] = (comm_p2p){.peer = next, .is_send = 1, .buf = m.send[i], .count = count};
    for (int i = 0; i < m.nr; i++)
        ops[k++] = (comm_p2p){.peer = prev, .is_send = 0, .buf = m.recv[i], .count = count};
    for (int i = 0; m.hs_to >= 0 && i < nh; i++)
        ops[k++] = (comm_p2p){.peer = m.hs_to, .is_send = 1, .buf = m.hs[i], .count = count};
    for (int i = 0; m.hr_from >= 0 && i < nh; i++)
        ops[k++] = (comm_p2p){.peer = m.hr_from, .is_send = 0, .buf = m.hr[i], .count = count};
    if (!k) return (comm_req){0};
    return comm_sendrecv(cp->ring.comm, ops, k, comm_act_dtype(cp->ops));
}

/* The ring stage: attention of this block's queries (Tb tokens, H heads) over every block. */
static void ring_fwd(ust_cp *cp, act *out, float *lse, const act *q, const act *k, const act *v,
                     int H, const cp_docs *docs, float cap) {
    const ust_ops *o = cp->ops;
    cp_ring_stage *rg = &cp->ring;
    int B = cp->B, Tl = cp->Tb, Hkv = rg->Hkvr, D = cp->D, n = rg->rn;
    const int32_t *qp = pos_dev(cp, rg->rr);
    const cp_route *rt = n > 1 ? route_of(cp, docs) : NULL;
    if (n > 1 && cp->mode == CP_ALLGATHER) gather_blocks(cp, k, v);
    const act *ck = k, *cv = v;
    /* step s works on the block of rank - s; the local block comes first: it holds the diagonal,
     * so every query sees at least one key before any merge */
    for (int s = 0; s < n; s++) {
        int owner = (rg->rr - s + n) % n;
        comm_req r = {0};
        act *nk = NULL, *nv = NULL;
        if (cp->mode != CP_ALLGATHER && s + 1 < n) {
            /* send the block in hand on before computing with it, so the transfer overlaps */
            act *send[2] = {(act *)ck, (act *)cv};
            act *recv[2] = {rg->kv[(s + 1) % 2][0], rg->kv[(s + 1) % 2][1]};
            int ns = sends_on(cp, rt, s) ? 2 : 0, nr = receives(cp, rt, s) ? 2 : 0;
            r = pass_on(cp, (ring_msgs){send, recv, ns, nr, NULL, NULL, -1, -1, 0, 0});
            nk = recv[0], nv = recv[1];
        } else if (cp->mode == CP_ALLGATHER && s > 0) {
            ck = block_of(cp, rg->all_k, owner), cv = block_of(cp, rg->all_v, owner);
        }
        if (s == 0) {
            o->attention_fwd(o, out, lse, q, ck, cv, B, Tl, Tl, H, Hkv, D, qp, qp, 1, starts(docs),
                             cap);
            logit_max(cp, q, ck, H, qp, docs);
            count(cp, owner, H);
        } else if (needs(cp, rt, owner) && !hidden(cp, owner, docs)) {
            o->attention_fwd(o, rg->part_out, rg->part_lse, q, ck, cv, B, Tl, Tl, H, Hkv, D, qp,
                             pos_dev(cp, owner), 1, starts(docs), cap);
            o->attention_merge(o, out, lse, rg->part_out, rg->part_lse, B, Tl, H, D);
            logit_max(cp, q, ck, H, pos_dev(cp, owner), docs);
            count(cp, owner, H);
        }
        if (nk) {
            comm_wait(&r);
            ck = nk, cv = nv;
        }
    }
}

static void allgather_bwd(ust_cp *cp, act *dq, act *dk, act *dv, const act *dout, const act *out,
                          const float *lse, const act *q, const act *k, const act *v, int H,
                          const cp_docs *docs, float cap) {
    const ust_ops *o = cp->ops;
    cp_ring_stage *rg = &cp->ring;
    int B = cp->B, Tl = cp->Tb, Hkv = rg->Hkvr, D = cp->D, n = rg->rn;
    const int32_t *qp = pos_dev(cp, rg->rr);
    const cp_route *rt = route_of(cp, docs);
    /* every block's gradient computed here, then summed at its owner */
    gather_blocks(cp, k, v);
    o->zero(o, rg->all_dk, act_bytes(o, blk(cp) * n));
    o->zero(o, rg->all_dv, act_bytes(o, blk(cp) * n));
    for (int r = 0; r < n; r++)
        if (needs(cp, rt, r) && !hidden(cp, r, docs))
            o->attention_bwd(o, dq, block_of(cp, rg->all_dk, r), block_of(cp, rg->all_dv, r), dout,
                             out, lse, q, block_of(cp, rg->all_k, r), block_of(cp, rg->all_v, r), B,
                             Tl, Tl, H, Hkv, D, qp, pos_dev(cp, r), 1, starts(docs), cap);
    comm_dtype t = comm_act_dtype(o);
    comm_req r[2] = {comm_reduce_scatter(rg->comm, rg->all_dk, rg->acc_dk, blk(cp), t, COMM_SUM),
                     comm_reduce_scatter(rg->comm, rg->all_dv, rg->acc_dv, blk(cp), t, COMM_SUM)};
    comm_wait_all(r, 2);
    o->add(o, dk, dk, rg->acc_dk, (int64_t)blk(cp));
    o->add(o, dv, dv, rg->acc_dv, (int64_t)blk(cp));
}

static void ring_bwd(ust_cp *cp, act *dq, act *dk, act *dv, const act *dout, const act *out,
                     const float *lse, const act *q, const act *k, const act *v, int H,
                     const cp_docs *docs, float cap) {
    const ust_ops *o = cp->ops;
    cp_ring_stage *rg = &cp->ring;
    int B = cp->B, Tl = cp->Tb, Hkv = rg->Hkvr, D = cp->D, n = rg->rn;
    const int32_t *qp = pos_dev(cp, rg->rr);
    if (n == 1) {
        o->attention_bwd(o, dq, dk, dv, dout, out, lse, q, k, v, B, Tl, Tl, H, Hkv, D, qp, qp, 1,
                         starts(docs), cap);
        return;
    }
    if (cp->mode == CP_ALLGATHER) {
        allgather_bwd(cp, dq, dk, dv, dout, out, lse, q, k, v, H, docs, cap);
        return;
    }
    /* the ring: the block in hand (k, v and the gradients gathered for it so far) moves on after
     * each step while a later rank needs it; from the last such rank its gradients go straight
     * home (with every rank needing every block that last rank is the previous one, the ring's
     * own last hop). This rank's block's gradients accumulate in acc from step 0 on and come
     * back there. */
    const cp_route *rt = route_of(cp, docs);
    o->zero(o, rg->acc_dk, act_bytes(o, blk(cp)));
    o->zero(o, rg->acc_dv, act_bytes(o, blk(cp)));
    const act *ck = k, *cv = v;
    act *cdk = rg->acc_dk, *cdv = rg->acc_dv, *acc[2] = {rg->acc_dk, rg->acc_dv};
    for (int s = 0; s < n; s++) {
        int owner = (rg->rr - s + n) % n, on = sends_on(cp, rt, s);
        act *const *buf = rg->kv[s % 2];
        /* the block's keys and values move on while we compute; its gradients after */
        comm_req kv = {0};
        if (s + 1 < n) {
            act *send[2] = {(act *)ck, (act *)cv};
            int nr = receives(cp, rt, s) ? 2 : 0;
            kv = pass_on(cp, (ring_msgs){send, buf, on ? 2 : 0, nr, NULL, NULL, -1, -1, 0, 0});
        }
        if (needs(cp, rt, owner) && !hidden(cp, owner, docs))
            o->attention_bwd(o, dq, cdk, cdv, dout, out, lse, q, ck, cv, B, Tl, Tl, H, Hkv, D, qp,
                             pos_dev(cp, owner), 1, starts(docs), cap);
        comm_wait(&kv);
        /* gradients: on with the block, or home from its last rank; ours home at step hops */
        act *send[2] = {cdk, cdv};
        int last = s > 0 && s == rt->hops[owner], home = s > 0 && s == rt->hops[rg->rr];
        ring_msgs m = {send, buf + 2, on ? 2 : 0,        s + 1 < n && receives(cp, rt, s) ? 2 : 0,
                       send, acc,     last ? owner : -1, home ? (rg->rr + s) % n : -1,
                       0,    0};
        comm_req g = pass_on(cp, m);
        comm_wait(&g);
        ck = buf[0], cv = buf[1], cdk = buf[2], cdv = buf[3];
    }
    o->add(o, dk, dk, rg->acc_dk, (int64_t)blk(cp));
    o->add(o, dv, dv, rg->acc_dv, (int64_t)blk(cp));
}

/* ---------------------------------------------------------------- the latent ring */

/* Why a latent travels and every rank re-expands it (docs/deepseek.md, "Context parallelism"):
 * multi-head latent attention's k and v are one GEMM (kv_b_proj) of a per-token latent of
 * kv_lora_rank values plus one rope key shared by the heads, lat values a token against 2 Hkv D
 * for the expanded block (DeepSeek-V3: 576 against 2 x 128 x 192, 1/85). So the block's bytes
 * shrink by that factor for one extra GEMM per remote block a rank attends to (and again in
 * backward, instead of keeping the expansion). The gradient goes back in the latent's shape
 * too: each rank contracts its dk, dv of a remote block through kv_b_proj's transpose (the rope
 * key's summed over the heads) before it travels, since contraction is linear and the sum of
 * the contractions is the contraction of the sum; kv_b_proj's weight gradient of that block is
 * added where it was computed (dense gradients are summed over dp x cp after the step anyway).
 * The owner's own block never travels expanded: its queries use its k, v as they are and its
 * gradients stay in dk, dv, so the first hop carries no gradient. */

static size_t lblk(const ust_cp *cp) { return (size_t)cp->B * cp->Tb * cp->lat; }

int cp_latent(const ust_cp *cp) { return cp->lat; }
act *cp_latent_mine(ust_cp *cp) { return cp->ring.lat_mine; }

static act *lat_of(const ust_cp *cp, act *all, int r) {
    return act_at(cp->ops, all, (int64_t)r * lblk(cp));
}

static void gather_latents(ust_cp *cp) {
    comm_req r = comm_allgather(cp->ring.comm, cp->ring.lat_mine, cp->ring.all_lat, lblk(cp),
                                comm_act_dtype(cp->ops));
    comm_wait(&r);
}

/* What a latent block's attention reads and writes besides the block: the local queries, their
 * output and its statistics, and (backward) the gradients of the output and the queries. */
typedef struct {
    act *out, *dq;
    float *lse;
    const act *q, *dout;
    const float *clse;
    int H;
    const cp_docs *docs;
    const cp_expander *ex;
    float softcap; /* model.attn_softcap (0: none) */
} latent_io;

/* A remote block's forward: expanded into ex[0], ex[1], its partial result merged. */
static void latent_block_fwd(ust_cp *cp, const latent_io *io, const act *lat, int owner) {
    const ust_ops *o = cp->ops;
    cp_ring_stage *rg = &cp->ring;
    int B = cp->B, Tb = cp->Tb, H = io->H;
    io->ex->expand(io->ex->ctx, rg->ex[0], rg->ex[1], lat);
    o->attention_fwd(o, rg->part_out, rg->part_lse, io->q, rg->ex[0], rg->ex[1], B, Tb, Tb, H,
                     rg->Hkvr, cp->D, pos_dev(cp, rg->rr), pos_dev(cp, owner), 1, starts(io->docs),
                     io->softcap);
    o->attention_merge(o, io->out, io->lse, rg->part_out, rg->part_lse, B, Tb, H, cp->D);
    logit_max(cp, io->q, rg->ex[0], H, pos_dev(cp, owner), io->docs);
    count(cp, owner, H);
}

/* A remote block's backward: expanded again, its dk, dv (ex[2], ex[3]) from the queries here,
 * contracted into dlat. */
static void latent_block_bwd(ust_cp *cp, const latent_io *io, act *dlat, const act *lat,
                             int owner) {
    const ust_ops *o = cp->ops;
    cp_ring_stage *rg = &cp->ring;
    size_t kb = act_bytes(o, (int64_t)blk(cp));
    io->ex->expand(io->ex->ctx, rg->ex[0], rg->ex[1], lat);
    o->zero(o, rg->ex[2], kb);
    o->zero(o, rg->ex[3], kb);
    o->attention_bwd(o, io->dq, rg->ex[2], rg->ex[3], io->dout, io->out, io->clse, io->q, rg->ex[0],
                     rg->ex[1], cp->B, cp->Tb, cp->Tb, io->H, rg->Hkvr, cp->D, pos_dev(cp, rg->rr),
                     pos_dev(cp, owner), 1, starts(io->docs), io->softcap);
    io->ex->contract(io->ex->ctx, dlat, rg->ex[2], rg->ex[3], lat);
}

void cp_latent_fwd(ust_cp *cp, act *out, float *lse, const act *q, const act *k, const act *v,
                   int H, const cp_docs *docs, const cp_expander *ex, float softcap) {
    const ust_ops *o = cp->ops;
    cp_ring_stage *rg = &cp->ring;
    int n = rg->rn;
    UST_ASSERT(cp->lat && n > 1 && cp->uly.a == 1, "the latent ring without a latent");
    latent_io io = {
        .out = out, .lse = lse, .q = q, .H = H, .docs = docs, .ex = ex, .softcap = softcap};
    const int32_t *qp = pos_dev(cp, rg->rr);
    const cp_route *rt = route_of(cp, docs);
    if (cp->mode == CP_ALLGATHER) gather_latents(cp);
    const act *cl = rg->lat_mine;
    for (int s = 0; s < n; s++) { /* as ring_fwd: the local block first, the next in flight */
        int owner = (rg->rr - s + n) % n;
        comm_req r = {0};
        act *nl = NULL;
        if (cp->mode != CP_ALLGATHER && s + 1 < n) {
            act *send[1] = {(act *)cl}, *recv[1] = {rg->lat[(s + 1) % 2][0]};
            int ns = sends_on(cp, rt, s), nr = receives(cp, rt, s);
            r = pass_on(cp, (ring_msgs){send, recv, ns, nr, NULL, NULL, -1, -1, 0, lblk(cp)});
            nl = recv[0];
        } else if (cp->mode == CP_ALLGATHER && s > 0) {
            cl = lat_of(cp, rg->all_lat, owner);
        }
        if (s == 0) {
            o->attention_fwd(o, out, lse, q, k, v, cp->B, cp->Tb, cp->Tb, H, rg->Hkvr, cp->D, qp,
                             qp, 1, starts(docs), softcap);
            logit_max(cp, q, k, H, qp, docs);
            count(cp, owner, H);
        } else if (needs(cp, rt, owner) && !hidden(cp, owner, docs)) {
            latent_block_fwd(cp, &io, cl, owner);
        }
        if (nl) {
            comm_wait(&r);
            cl = nl;
        }
    }
}

/* The ring's backward with latents: as ring_bwd, the latent moving on while a later rank needs
 * it and its gradient (from step 1 on) with it, home from the last such rank into acc_dlat. */
static void latent_ring_bwd(ust_cp *cp, const latent_io *io, act *dk, act *dv, const act *k,
                            const act *v) {
    const ust_ops *o = cp->ops;
    cp_ring_stage *rg = &cp->ring;
    int n = rg->rn;
    size_t lc = lblk(cp);
    const cp_route *rt = route_of(cp, io->docs);
    const act *cl = rg->lat_mine;
    act *cdl = NULL, *acc[1] = {rg->acc_dlat};
    for (int s = 0; s < n; s++) {
        int owner = (rg->rr - s + n) % n, on = sends_on(cp, rt, s);
        act *const *buf = rg->lat[s % 2];
        comm_req lr = {0};
        if (s + 1 < n) {
            act *send[1] = {(act *)cl};
            int nr = receives(cp, rt, s);
            lr = pass_on(cp, (ring_msgs){send, buf, on, nr, NULL, NULL, -1, -1, 0, lc});
        }
        if (s == 0)
            o->attention_bwd(o, io->dq, dk, dv, io->dout, io->out, io->clse, io->q, k, v, cp->B,
                             cp->Tb, cp->Tb, io->H, rg->Hkvr, cp->D, pos_dev(cp, rg->rr),
                             pos_dev(cp, rg->rr), 1, starts(io->docs), io->softcap);
        else if (needs(cp, rt, owner) && !hidden(cp, owner, io->docs))
            latent_block_bwd(cp, io, cdl, cl, owner);
        comm_wait(&lr);
        act *send[1] = {cdl};
        int last = s > 0 && s == rt->hops[owner], home = s > 0 && s == rt->hops[rg->rr];
        int fw = s > 0 && on, rv = s > 0 && s + 1 < n && receives(cp, rt, s);
        ring_msgs m = {
            send, buf + 1, fw, rv, send, acc, last ? owner : -1, home ? (rg->rr + s) % n : -1,
            1,    lc};
        comm_req g = pass_on(cp, m);
        comm_wait(&g);
        cl = buf[0], cdl = buf[1];
        if (s == 0) o->zero(o, cdl, act_bytes(o, (int64_t)lc)); /* no gradient on the first hop */
    }
}

/* Allgather mode: every latent gathered again, every block's gradient contracted here, the
 * latents' gradients summed at their owners. */
static void latent_allgather_bwd(ust_cp *cp, const latent_io *io, act *dk, act *dv, const act *k,
                                 const act *v) {
    const ust_ops *o = cp->ops;
    cp_ring_stage *rg = &cp->ring;
    int n = rg->rn;
    const cp_route *rt = route_of(cp, io->docs);
    const int32_t *qp = pos_dev(cp, rg->rr);
    gather_latents(cp);
    o->zero(o, rg->all_dlat, act_bytes(o, (int64_t)lblk(cp) * n));
    o->attention_bwd(o, io->dq, dk, dv, io->dout, io->out, io->clse, io->q, k, v, cp->B, cp->Tb,
                     cp->Tb, io->H, rg->Hkvr, cp->D, qp, qp, 1, starts(io->docs), io->softcap);
    for (int r = 0; r < n; r++)
        if (r != rg->rr && needs(cp, rt, r) && !hidden(cp, r, io->docs))
            latent_block_bwd(cp, io, lat_of(cp, rg->all_dlat, r), lat_of(cp, rg->all_lat, r), r);
    comm_req r = comm_reduce_scatter(rg->comm, rg->all_dlat, rg->acc_dlat, lblk(cp),
                                     comm_act_dtype(o), COMM_SUM);
    comm_wait(&r);
}

const act *cp_latent_bwd(ust_cp *cp, act *dq, act *dk, act *dv, const act *dout, const act *out,
                         const float *lse, const act *q, const act *k, const act *v, int H,
                         const cp_docs *docs, const cp_expander *ex, float softcap) {
    cp_ring_stage *rg = &cp->ring;
    UST_ASSERT(cp->lat && rg->rn > 1 && cp->uly.a == 1, "the latent ring without a latent");
    latent_io io = {.out = (act *)out,
                    .dq = dq,
                    .q = q,
                    .dout = dout,
                    .clse = lse,
                    .H = H,
                    .docs = docs,
                    .ex = ex,
                    .softcap = softcap};
    cp->ops->zero(cp->ops, rg->acc_dlat, act_bytes(cp->ops, (int64_t)lblk(cp)));
    if (cp->mode == CP_ALLGATHER)
        latent_allgather_bwd(cp, &io, dk, dv, k, v);
    else
        latent_ring_bwd(cp, &io, dk, dv, k, v);
    return rg->acc_dlat;
}

/* ---------------------------------------------------------------- Ulysses */

/* Bytes of `count` activations; the element offset of an act pointer. */
static size_t ab(const ust_cp *cp, int64_t count) { return act_bytes(cp->ops, count); }

static void a2a_run(ust_cp *cp, size_t count) {
    comm_req r =
        comm_alltoall(cp->uly.comm, cp->uly.sbuf, cp->uly.rbuf, count, comm_act_dtype(cp->ops));
    comm_wait(&r);
    cp->a2a_bytes += (double)(cp->uly.a - 1) * ab(cp, (int64_t)count);
}

/* Sequence split to head split: x(B, Tl, heads, D) of this rank's tokens to u(B, Tb, h, D), every
 * member's tokens (member j's at j*Tl) of the h heads from first(j) on that this rank takes;
 * member j is sent its heads [first(j), first(j)+h). */
static void to_heads(ust_cp *cp, act *u, const act *x, int heads, int h, int kv) {
    const ust_ops *o = cp->ops;
    int a = cp->uly.a, B = cp->B, Tl = cp->Tl, D = cp->D;
    int64_t part = (int64_t)B * Tl * h * D; /* what one member gets */
    for (int j = 0; j < a; j++)
        o->copy2d(o, act_at(o, cp->uly.sbuf, j * part), ab(cp, (int64_t)h * D),
                  act_at(o, x, (int64_t)(kv ? kv_first(cp, j) : j * h) * D),
                  ab(cp, (int64_t)heads * D), ab(cp, (int64_t)h * D), (size_t)B * Tl);
    a2a_run(cp, (size_t)part);
    /* rbuf holds member j's (B, Tl, h, D) at j*part: to (B, Tb, h, D) */
    for (int j = 0; j < a; j++)
        o->copy2d(o, act_at(o, u, (int64_t)j * Tl * h * D), ab(cp, (int64_t)cp->Tb * h * D),
                  act_at(o, cp->uly.rbuf, j * part), ab(cp, (int64_t)Tl * h * D),
                  ab(cp, (int64_t)Tl * h * D), (size_t)B);
}

/* Head split back to sequence split: u(B, Tb, h, D) to x(B, Tl, heads, D); acc: x += (key/value
 * gradients: the replicas of a key/value head are summed), else x is overwritten. */
static void from_heads(ust_cp *cp, act *x, const act *u, int heads, int h, int kv, int acc) {
    const ust_ops *o = cp->ops;
    int a = cp->uly.a, B = cp->B, Tl = cp->Tl, D = cp->D;
    int64_t part = (int64_t)B * Tl * h * D;
    for (int j = 0; j < a; j++) /* member j gets its tokens */
        o->copy2d(o, act_at(o, cp->uly.sbuf, j * part), ab(cp, (int64_t)Tl * h * D),
                  act_at(o, u, (int64_t)j * Tl * h * D), ab(cp, (int64_t)cp->Tb * h * D),
                  ab(cp, (int64_t)Tl * h * D), (size_t)B);
    a2a_run(cp, (size_t)part);
    /* rbuf: member j's heads of our tokens. Members whose heads are distinct land in one pass;
     * replicated key/value heads (rep members share one) take rep passes, each summed in. */
    int rep = kv && cp->Hkv < a ? a / cp->Hkv : 1;
    int64_t total = (int64_t)B * Tl * heads * D;
    for (int c = 0; c < rep; c++) {
        act *dst = acc ? cp->uly.sbuf : x; /* sbuf is free once the all-to-all is done */
        for (int j = c; j < a; j += rep)
            o->copy2d(o, act_at(o, dst, (int64_t)(kv ? kv_first(cp, j) : j * h) * D),
                      ab(cp, (int64_t)heads * D), act_at(o, cp->uly.rbuf, j * part),
                      ab(cp, (int64_t)h * D), ab(cp, (int64_t)h * D), (size_t)B * Tl);
        if (acc) o->add(o, x, x, cp->uly.sbuf, total);
    }
}

void cp_attention_fwd(ust_cp *cp, act *out, float *lse, const act *q, const act *k, const act *v,
                      int H, const cp_docs *docs, float softcap) {
    if (cp->uly.a == 1) {
        ring_fwd(cp, out, lse, q, k, v, H, docs, softcap);
        return;
    }
    UST_ASSERT(H == cp->H, "attention with %d heads, cp sized for %d", H, cp->H);
    to_heads(cp, cp->uly.uq, q, H, cp->uly.Hq, 0);
    to_heads(cp, cp->uly.uk, k, cp->Hkv, cp->uly.Hk, 1);
    to_heads(cp, cp->uly.uv, v, cp->Hkv, cp->uly.Hk, 1);
    /* lse(B, Hq, Tb) fills the caller's (B, H, Tl): the same count, kept for backward */
    ring_fwd(cp, cp->uly.uo, lse, cp->uly.uq, cp->uly.uk, cp->uly.uv, cp->uly.Hq, docs, softcap);
    from_heads(cp, out, cp->uly.uo, H, cp->uly.Hq, 0, 0);
}

void cp_attention_bwd(ust_cp *cp, act *dq, act *dk, act *dv, const act *dout, const act *out,
                      const float *lse, const act *q, const act *k, const act *v, int H,
                      const cp_docs *docs, float softcap) {
    if (cp->uly.a == 1) {
        ring_bwd(cp, dq, dk, dv, dout, out, lse, q, k, v, H, docs, softcap);
        return;
    }
    const ust_ops *o = cp->ops;
    UST_ASSERT(H == cp->H, "attention with %d heads, cp sized for %d", H, cp->H);
    to_heads(cp, cp->uly.uq, q, H, cp->uly.Hq, 0);
    to_heads(cp, cp->uly.uk, k, cp->Hkv, cp->uly.Hk, 1);
    to_heads(cp, cp->uly.uv, v, cp->Hkv, cp->uly.Hk, 1);
    to_heads(cp, cp->uly.uo, out, H, cp->uly.Hq, 0);
    to_heads(cp, cp->uly.udo, dout, H, cp->uly.Hq, 0);
    int64_t nq = (int64_t)cp->B * cp->Tb * cp->uly.Hq * cp->D,
            nk = (int64_t)cp->B * cp->Tb * cp->uly.Hk * cp->D;
    o->zero(o, cp->uly.udq, ab(cp, nq));
    o->zero(o, cp->uly.udk, ab(cp, nk));
    o->zero(o, cp->uly.udv, ab(cp, nk));
    ring_bwd(cp, cp->uly.udq, cp->uly.udk, cp->uly.udv, cp->uly.udo, cp->uly.uo, lse, cp->uly.uq,
             cp->uly.uk, cp->uly.uv, cp->uly.Hq, docs, softcap);
    from_heads(cp, dq, cp->uly.udq, H, cp->uly.Hq, 0, 1);
    from_heads(cp, dk, cp->uly.udk, cp->Hkv, cp->uly.Hk, 1, 1);
    from_heads(cp, dv, cp->uly.udv, cp->Hkv, cp->uly.Hk, 1, 1);
}

int32_t cp_gather_docs(ust_cp *cp, int32_t *full, const int32_t *local) {
    const ust_ops *o = cp->ops;
    int a = cp->uly.a, B = cp->B, Tl = cp->Tl;
    size_t part = (size_t)B * Tl;
    /* int32 as fp32 bits: an all-gather only copies */
    int32_t *g = (int32_t *)cp->uly.rbuf;
    comm_req r = comm_allgather(cp->uly.comm, local, g, part, COMM_FP32);
    comm_wait(&r);
    for (int j = 0; j < a; j++)
        o->copy2d(o, full + (size_t)j * Tl, (size_t)cp->Tb * sizeof(int32_t), g + j * part,
                  (size_t)Tl * sizeof(int32_t), (size_t)Tl * sizeof(int32_t), (size_t)B);
    size_t N = (size_t)B * cp->Tb;
    if (!cp->uly.ustart_host) cp->uly.ustart_host = malloc(N * sizeof(int32_t));
    UST_ASSERT(cp->uly.ustart_host, "out of host memory");
    o->to_host(o, cp->uly.ustart_host, full, N * sizeof(int32_t));
    int32_t mn = cp->uly.ustart_host[0];
    for (size_t i = 1; i < N; i++) mn = cp->uly.ustart_host[i] < mn ? cp->uly.ustart_host[i] : mn;
    return mn;
}

int cp_size(const ust_cp *cp) { return cp->n; }
int cp_rank(const ust_cp *cp) { return cp->rank; }

void cp_allreduce(ust_cp *cp, float *x, int64_t n) {
    if (cp->n == 1) return;
    comm_req r = comm_allreduce(cp->comm, x, x, (size_t)n, COMM_FP32, COMM_SUM);
    comm_wait(&r);
}

void cp_allgather(ust_cp *cp, const float *mine, float *all, int64_t n) {
    if (cp->n == 1) return;
    comm_req r = comm_allgather(cp->comm, mine, all, (size_t)n, COMM_FP32);
    comm_wait(&r);
}
