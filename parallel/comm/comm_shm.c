/* comm_shm: the shared-memory backend's operations on a mapped segment (comm_shm_segment.c makes,
 * maps and frees the segment, and waits; comm_shm.h lays it out).
 *
 * Collectives run in rounds over a bounded slice of the buffer: members copy their part into
 * their slot, meet at a barrier, then read what they need from the other slots. Rounds alternate
 * between the two staging areas, so a round's writes never race with the previous round's reads
 * (a barrier always lies between them) and one barrier per round is enough, two for all-reduce.
 * Point-to-point messages stream through the n*n rings, one per ordered pair of members. */
#include "comm_shm.h"

#include <stdlib.h>
#include <string.h>

#define SHM_SMALL_BYTES (16u << 10) /* all-reduce below this: one barrier, see run_allreduce */

static inline uint8_t *slot(const ust_comm *c, int area, int j) {
    const shm_comm *s = c->impl;
    return s->stage + ((size_t)area * (size_t)c->size + (size_t)j) * c->ctx->opts.shm_slot_bytes;
}

/* ---------------------------------------------------------------- barrier */

static int barrier_done(const ust_comm *c, const void *arg) {
    const shm_comm *s = c->impl;
    return (int32_t)(atomic_load(&s->hdr->gen) - *(const uint32_t *)arg) >= 0;
}

static int barrier_who(const ust_comm *c, const void *arg, int *waiting) {
    const shm_comm *s = c->impl;
    uint32_t target = *(const uint32_t *)arg;
    int n = 0;
    for (int j = 0; j < c->size; j++)
        if ((int32_t)(atomic_load(&s->mem[j].arrived) - target) < 0 && n < SHM_MAX_WAITING)
            waiting[n++] = j;
    return n;
}

/* Counter barrier: the last member to arrive publishes the new generation and wakes the rest. */
static void barrier(ust_comm *c, comm_kind k) {
    shm_comm *s = c->impl;
    uint32_t target = ++s->barriers;
    atomic_store(&s->mem[c->rank].arrived, target);
    uint32_t old = atomic_fetch_add(&s->hdr->arrive, 1);
    if (old + 1 == target * (uint32_t)c->size) {
        atomic_store(&s->hdr->gen, target);
        shm_wake(&s->hdr->gen, &s->hdr->sleepers);
        return;
    }
    shm_wait(c, k, &s->hdr->gen, &s->hdr->sleepers, barrier_done, barrier_who, &target);
}

/* ---------------------------------------------------------------- reductions */

/* out[0..len) = op over members j of slot(area, j) + off, in member order (every element is
 * reduced by exactly one rank, so all ranks end with bitwise-equal results). This member's own
 * term comes from `own` when given (its part never went through the slot: one copy less).
 * Also stores the result into this member's slot when `publish` is set. Blocked so the partial
 * sums stay in L1; a block is read whole before it is written, so out may alias own. */
static void reduce_slots(const ust_comm *c, int area, size_t off, size_t len, comm_dtype t,
                         comm_redop op, const void *own, void *out, int publish) {
    enum { BLK = 2048 };
    float acc[BLK];
    float scale = op == COMM_AVG ? 1.0f / (float)c->size : 1.0f;
    for (size_t b = 0; b < len; b += BLK) {
        size_t m = len - b < BLK ? len - b : BLK;
        for (int j = 0; j < c->size; j++) {
            const uint8_t *src = j == c->rank && own ? own : slot(c, area, j) + off;
            if (t == COMM_FP32) {
                const float *x = (const float *)src + b;
                if (j == 0)
                    for (size_t i = 0; i < m; i++) acc[i] = x[i];
                else
                    for (size_t i = 0; i < m; i++) acc[i] += x[i];
            } else {
                const uint16_t *x = (const uint16_t *)src + b;
                if (j == 0)
                    for (size_t i = 0; i < m; i++) acc[i] = comm_bf16_to_f32(x[i]);
                else
                    for (size_t i = 0; i < m; i++) acc[i] += comm_bf16_to_f32(x[i]);
            }
        }
        if (scale != 1.0f)
            for (size_t i = 0; i < m; i++) acc[i] *= scale;
        uint8_t *mine = slot(c, area, c->rank) + off;
        if (t == COMM_FP32) {
            memcpy((float *)out + b, acc, m * 4);
            if (publish) memcpy((float *)mine + b, acc, m * 4);
        } else {
            uint16_t *o = (uint16_t *)out + b, *p = (uint16_t *)mine + b;
            for (size_t i = 0; i < m; i++) o[i] = comm_f32_to_bf16(acc[i]);
            if (publish) memcpy(p, o, m * 2);
        }
    }
}

/* ---------------------------------------------------------------- collectives */

/* Element range [lo, hi) of part `j` when len elements are split over n parts. */
static void part(size_t len, int n, int j, size_t *lo, size_t *hi) {
    *lo = len * (size_t)j / (size_t)n;
    *hi = len * (size_t)(j + 1) / (size_t)n;
}

static void run_allreduce(ust_comm *c, const comm_desc *d) {
    shm_comm *s = c->impl;
    size_t es = comm_dtype_size(d->t), per = c->ctx->opts.shm_slot_bytes / es;
    const uint8_t *send = d->send;
    uint8_t *recv = d->recv;
    /* Small buffers are latency-bound: every member reduces the whole buffer after a single
     * barrier (n times the reads of the split reduction, half the barriers). The member order
     * of the sum is the same everywhere, so results stay bitwise equal across ranks. */
    if (d->count * es <= SHM_SMALL_BYTES && d->count <= per) {
        int a = s->area;
        s->area ^= 1;
        memcpy(slot(c, a, c->rank), send, d->count * es);
        barrier(c, COMM_ALLREDUCE);
        reduce_slots(c, a, 0, d->count, d->t, d->op, NULL, recv, 0);
        return;
    }
    for (size_t off = 0; off < d->count; off += per) {
        size_t len = d->count - off < per ? d->count - off : per, lo, hi;
        int a = s->area;
        s->area ^= 1;
        /* The others read every part of my slot except mine, which I reduce from send. */
        part(len, c->size, c->rank, &lo, &hi);
        memcpy(slot(c, a, c->rank), send + off * es, lo * es);
        memcpy(slot(c, a, c->rank) + hi * es, send + (off + hi) * es, (len - hi) * es);
        barrier(c, COMM_ALLREDUCE);
        reduce_slots(c, a, lo * es, hi - lo, d->t, d->op, send + (off + lo) * es,
                     recv + (off + lo) * es, 1);
        barrier(c, COMM_ALLREDUCE);
        for (int j = 0; j < c->size; j++) {
            if (j == c->rank) continue;
            part(len, c->size, j, &lo, &hi);
            memcpy(recv + (off + lo) * es, slot(c, a, j) + lo * es, (hi - lo) * es);
        }
    }
}

static void run_allgather(ust_comm *c, const comm_desc *d) {
    shm_comm *s = c->impl;
    size_t es = comm_dtype_size(d->t), per = c->ctx->opts.shm_slot_bytes / es;
    const uint8_t *send = d->send;
    uint8_t *recv = d->recv, *own = recv + (size_t)c->rank * d->count * es;
    if (send != own) memmove(own, send, d->count * es);
    for (size_t off = 0; off < d->count; off += per) {
        size_t len = d->count - off < per ? d->count - off : per;
        int a = s->area;
        s->area ^= 1;
        memcpy(slot(c, a, c->rank), own + off * es, len * es);
        barrier(c, COMM_ALLGATHER);
        for (int j = 0; j < c->size; j++)
            if (j != c->rank)
                memcpy(recv + ((size_t)j * d->count + off) * es, slot(c, a, j), len * es);
    }
}

static void run_reduce_scatter(ust_comm *c, const comm_desc *d) {
    shm_comm *s = c->impl;
    size_t es = comm_dtype_size(d->t), n = (size_t)c->size;
    size_t per = c->ctx->opts.shm_slot_bytes / (n * es);
    per = per ? per : 1;
    UST_ASSERT(per * n * es <= c->ctx->opts.shm_slot_bytes,
               "slot of %zu bytes too small for %zu "
               "members",
               c->ctx->opts.shm_slot_bytes, n);
    const uint8_t *send = d->send;
    uint8_t *recv = d->recv;
    for (size_t off = 0; off < d->count; off += per) {
        size_t len = d->count - off < per ? d->count - off : per;
        int a = s->area;
        s->area ^= 1;
        for (size_t k = 0; k < n; k++) /* my own part is reduced straight from send */
            if (k != (size_t)c->rank)
                memcpy(slot(c, a, c->rank) + k * len * es, send + (k * d->count + off) * es,
                       len * es);
        barrier(c, COMM_REDUCE_SCATTER);
        reduce_slots(c, a, (size_t)c->rank * len * es, len, d->t, d->op,
                     send + ((size_t)c->rank * d->count + off) * es, recv + off * es, 0);
    }
}

static void run_broadcast(ust_comm *c, const comm_desc *d) {
    shm_comm *s = c->impl;
    /* The root may use the whole area: the slots of one area are contiguous. */
    size_t es = comm_dtype_size(d->t), per = c->ctx->opts.shm_slot_bytes * (size_t)c->size / es;
    uint8_t *buf = d->recv;
    for (size_t off = 0; off < d->count; off += per) {
        size_t len = d->count - off < per ? d->count - off : per;
        int a = s->area;
        s->area ^= 1;
        if (c->rank == d->root) memcpy(slot(c, a, 0), buf + off * es, len * es);
        barrier(c, COMM_BROADCAST);
        if (c->rank != d->root) memcpy(buf + off * es, slot(c, a, 0), len * es);
    }
}

/* Each slot is cut into n sub-slots of q bytes, sub-slot j holding what goes to member j; the
 * members first agree on the number of rounds (the largest single transfer decides it). */
static void run_alltoall(ust_comm *c, const comm_desc *d) {
    shm_comm *s = c->impl;
    size_t es = comm_dtype_size(d->t), n = (size_t)c->size, me = (size_t)c->rank;
    size_t q = c->ctx->opts.shm_slot_bytes / n / 8 * 8;
    UST_ASSERT(q >= 8, "slot of %zu bytes too small for %zu members", c->ctx->opts.shm_slot_bytes,
               n);
    const uint8_t *send = d->send;
    uint8_t *recv = d->recv;
    memcpy(recv + desc_rdispl(d, c->rank) * es, send + desc_sdispl(d, c->rank) * es,
           desc_scount(d, c->rank) * es);
    UST_ASSERT(desc_scount(d, c->rank) == desc_rcount(d, c->rank),
               "all-to-all on '%s': sends %zu to itself but expects %zu", c->name,
               desc_scount(d, c->rank), desc_rcount(d, c->rank));
    uint64_t most = 0;
    if (d->scounts) {
        int a = s->area;
        s->area ^= 1;
        uint64_t mine = 0;
        for (size_t j = 0; j < n; j++) {
            if (j == me) continue;
            uint64_t sb = desc_scount(d, (int)j) * es, rb = desc_rcount(d, (int)j) * es;
            mine = sb > mine ? sb : mine;
            mine = rb > mine ? rb : mine;
        }
        memcpy(slot(c, a, c->rank), &mine, 8);
        barrier(c, COMM_ALLTOALL);
        for (size_t j = 0; j < n; j++) {
            uint64_t v;
            memcpy(&v, slot(c, a, (int)j), 8);
            most = v > most ? v : most;
        }
    } else {
        most = n > 1 ? d->count * es : 0;
    }
    for (uint64_t lo = 0; lo < most; lo += q) {
        int a = s->area;
        s->area ^= 1;
        for (size_t j = 0; j < n; j++) {
            uint64_t sb = desc_scount(d, (int)j) * es;
            if (j == me || lo >= sb) continue;
            memcpy(slot(c, a, c->rank) + j * q, send + desc_sdispl(d, (int)j) * es + lo,
                   sb - lo < q ? sb - lo : q);
        }
        barrier(c, COMM_ALLTOALL);
        for (size_t i = 0; i < n; i++) {
            uint64_t rb = desc_rcount(d, (int)i) * es;
            if (i == me || lo >= rb) continue;
            memcpy(recv + desc_rdispl(d, (int)i) * es + lo, slot(c, a, (int)i) + me * q,
                   rb - lo < q ? rb - lo : q);
        }
    }
}

/* ---------------------------------------------------------------- point to point */

/* Stream framing on a ring: an 8-byte length, then the payload padded to 8 bytes, so every
 * header starts 8-aligned and is never split by the wrap. */
typedef struct {
    size_t done;  /* stream bytes moved: 8 header + padded payload */
    size_t total; /* 8 + round_up(bytes, 8) */
    size_t bytes; /* payload */
} p2p_state;

typedef struct {
    const comm_desc *d;
    p2p_state *st;
} p2p_arg;

static inline shm_chan *chan(const ust_comm *c, int src, int dst) {
    const shm_comm *s = c->impl;
    return &s->chan[(size_t)src * (size_t)c->size + (size_t)dst];
}

static inline uint8_t *ring(const ust_comm *c, int src, int dst) {
    const shm_comm *s = c->impl;
    return s->ring + ((size_t)src * (size_t)c->size + (size_t)dst) * c->ctx->opts.shm_chan_bytes;
}

static void ring_bell(const ust_comm *c, int j) {
    shm_comm *s = c->impl;
    atomic_fetch_add(&s->mem[j].doorbell, 1);
    shm_wake(&s->mem[j].doorbell, &s->mem[j].sleepers);
}

/* Moves what it can of entry i without waiting; returns bytes moved. */
static size_t p2p_step(ust_comm *c, const comm_p2p *o, p2p_state *st) {
    size_t cap = c->ctx->opts.shm_chan_bytes, moved = 0;
    int src = o->is_send ? c->rank : o->peer, dst = o->is_send ? o->peer : c->rank;
    shm_chan *ch = chan(c, src, dst);
    uint8_t *r = ring(c, src, dst);
    while (st->done < st->total) {
        uint64_t head = atomic_load_explicit(&ch->head, memory_order_acquire);
        uint64_t tail = atomic_load_explicit(&ch->tail, memory_order_acquire);
        uint64_t pos = o->is_send ? head : tail;
        size_t avail = o->is_send ? cap - (size_t)(head - tail) : (size_t)(head - tail);
        size_t at = (size_t)(pos % cap), n;
        if (st->done == 0) { /* header */
            if (avail < 8) break;
            if (o->is_send) {
                uint64_t len = st->bytes;
                memcpy(r + at, &len, 8);
            } else {
                uint64_t len;
                memcpy(&len, r + at, 8);
                if (len != st->bytes)
                    ust_fatal(UST_EXIT_RUNTIME,
                              "comm: send_recv on group '%s': global rank %d sent %llu bytes "
                              "but global rank %d posted a receive of %zu bytes",
                              c->name, c->granks[o->peer], (unsigned long long)len,
                              c->granks[c->rank], st->bytes);
            }
            n = 8;
        } else {
            size_t want = st->total - st->done, contig = cap - at;
            n = want < avail ? want : avail;
            n = n < contig ? n : contig;
            if (n == 0) break;
            size_t poff = st->done - 8; /* payload offset of this piece */
            size_t real = poff >= st->bytes ? 0 : (st->bytes - poff < n ? st->bytes - poff : n);
            if (o->is_send)
                memcpy(r + at, (const uint8_t *)o->buf + poff, real);
            else
                memcpy((uint8_t *)o->buf + poff, r + at, real);
        }
        if (o->is_send)
            atomic_store_explicit(&ch->head, head + n, memory_order_release);
        else
            atomic_store_explicit(&ch->tail, tail + n, memory_order_release);
        st->done += n;
        moved += n;
    }
    if (moved) ring_bell(c, o->peer);
    return moved;
}

/* Entry i may move when every earlier entry with the same peer and direction is complete
 * (messages between a pair match in posting order). */
static int p2p_ready(const comm_desc *d, const p2p_state *st, int i) {
    for (int k = 0; k < i; k++)
        if (d->p2p[k].peer == d->p2p[i].peer && d->p2p[k].is_send == d->p2p[i].is_send &&
            st[k].done < st[k].total)
            return 0;
    return 1;
}

static int p2p_all_done(const ust_comm *c, const void *arg) {
    const p2p_arg *pa = arg;
    (void)c;
    for (int i = 0; i < pa->d->np2p; i++)
        if (pa->st[i].done < pa->st[i].total) return 0;
    return 1;
}

/* Progress happens in p2p_progress; the predicate used while sleeping only asks whether some
 * entry could move now, so the sleeper wakes to make progress. */
static int p2p_can_move(const ust_comm *c, const void *arg) {
    const p2p_arg *pa = arg;
    size_t cap = c->ctx->opts.shm_chan_bytes;
    for (int i = 0; i < pa->d->np2p; i++) {
        const comm_p2p *o = &pa->d->p2p[i];
        if (pa->st[i].done >= pa->st[i].total || !p2p_ready(pa->d, pa->st, i)) continue;
        int src = o->is_send ? c->rank : o->peer, dst = o->is_send ? o->peer : c->rank;
        shm_chan *ch = chan(c, src, dst);
        uint64_t used = atomic_load(&ch->head) - atomic_load(&ch->tail);
        size_t need = pa->st[i].done == 0 ? 8 : 1; /* a header moves whole */
        if (o->is_send ? cap - used >= need : used >= need) return 1;
    }
    return 0;
}

static int p2p_who(const ust_comm *c, const void *arg, int *waiting) {
    const p2p_arg *pa = arg;
    int n = 0;
    for (int i = 0; i < pa->d->np2p; i++) {
        if (pa->st[i].done >= pa->st[i].total) continue;
        int dup = 0;
        for (int k = 0; k < n; k++) dup |= waiting[k] == pa->d->p2p[i].peer;
        if (!dup && n < SHM_MAX_WAITING) waiting[n++] = pa->d->p2p[i].peer;
    }
    (void)c;
    return n;
}

int shm_sends_fit(const ust_comm *c, const comm_desc *d) {
    if (d->kind != COMM_SENDRECV) return 0;
    if (c->size == 1) return 1;
    size_t cap = c->ctx->opts.shm_chan_bytes, es = comm_dtype_size(d->t);
    for (int i = 0; i < d->np2p; i++) {
        const comm_p2p *o = &d->p2p[i];
        if (!o->is_send) return 0;
        if (o->peer == c->rank) return 0; /* a send to itself needs its receive */
        size_t need = 0; /* every send of the batch to this peer, headers included */
        for (int k = 0; k < d->np2p; k++)
            if (d->p2p[k].peer == o->peer) need += 8 + (d->p2p[k].count * es + 7) / 8 * 8;
        const shm_chan *ch = chan(c, c->rank, o->peer);
        if (need > cap - (size_t)(atomic_load(&ch->head) - atomic_load(&ch->tail))) return 0;
    }
    return 1;
}

static void run_sendrecv(ust_comm *c, const comm_desc *d) {
    shm_comm *s = c->impl;
    size_t es = comm_dtype_size(d->t);
    enum { SMALL = 64 };
    p2p_state small[SMALL], *st = d->np2p <= SMALL ? small : calloc((size_t)d->np2p, sizeof *st);
    UST_ASSERT(st, "out of memory");
    int nself_send = 0, nself_recv = 0;
    for (int i = 0; i < d->np2p; i++) {
        st[i].bytes = d->p2p[i].count * es;
        st[i].total = 8 + (st[i].bytes + 7) / 8 * 8;
        st[i].done = 0;
        if (d->p2p[i].peer == c->rank) {
            st[i].done = st[i].total;
            *(d->p2p[i].is_send ? &nself_send : &nself_recv) += 1;
        }
    }
    /* Messages to oneself: the k-th send pairs with the k-th receive of the batch. */
    UST_ASSERT(nself_send == nself_recv, "send_recv on '%s': %d sends to itself, %d receives",
               c->name, nself_send, nself_recv);
    for (int i = 0, r = 0; i < d->np2p; i++) {
        if (d->p2p[i].peer != c->rank || !d->p2p[i].is_send) continue;
        while (d->p2p[r].peer != c->rank || d->p2p[r].is_send) r++;
        UST_ASSERT(d->p2p[r].count == d->p2p[i].count, "send_recv on '%s': self send %zu, recv %zu",
                   c->name, d->p2p[i].count, d->p2p[r].count);
        memcpy(d->p2p[r].buf, d->p2p[i].buf, st[i].bytes);
        r++;
    }
    p2p_arg pa = {d, st};
    shm_member *me = &s->mem[c->rank];
    while (!p2p_all_done(c, &pa)) {
        size_t moved = 0;
        for (int i = 0; i < d->np2p; i++)
            if (st[i].done < st[i].total && p2p_ready(d, st, i))
                moved += p2p_step(c, &d->p2p[i], &st[i]);
        if (!moved && !p2p_all_done(c, &pa))
            shm_wait(c, COMM_SENDRECV, &me->doorbell, &me->sleepers, p2p_can_move, p2p_who, &pa);
    }
    if (st != small) free(st);
}

static void shm_run(ust_comm *c, const comm_desc *d) {
    size_t es = comm_dtype_size(d->t);
    if (c->size == 1) { /* nothing to exchange: the result is the input */
        size_t n = d->kind == COMM_ALLTOALL ? desc_scount(d, 0) : d->count;
        const uint8_t *src =
            (const uint8_t *)d->send + (d->kind == COMM_ALLTOALL ? desc_sdispl(d, 0) * es : 0);
        uint8_t *dst = (uint8_t *)d->recv + (d->kind == COMM_ALLTOALL ? desc_rdispl(d, 0) * es : 0);
        if (d->kind == COMM_SENDRECV) {
            run_sendrecv(c, d);
        } else if (d->kind != COMM_BARRIER && d->kind != COMM_BROADCAST && src != dst && n) {
            memmove(dst, src, n * es);
        }
        return;
    }
    switch (d->kind) {
    case COMM_ALLREDUCE:
        run_allreduce(c, d);
        break;
    case COMM_ALLGATHER:
        run_allgather(c, d);
        break;
    case COMM_REDUCE_SCATTER:
        run_reduce_scatter(c, d);
        break;
    case COMM_BROADCAST:
        run_broadcast(c, d);
        break;
    case COMM_ALLTOALL:
        run_alltoall(c, d);
        break;
    case COMM_SENDRECV:
        run_sendrecv(c, d);
        break;
    case COMM_BARRIER:
        barrier(c, COMM_BARRIER);
        break;
    default:
        UST_ASSERT(0, "unknown operation %d", (int)d->kind);
    }
}

/* Runs the queued operations up to seq in posting order: shm moves data only while a member
 * waits, which is what lets a rank post several operations and wait later. */
void shm_wait_until(ust_comm *c, uint64_t seq) {
    const shm_comm *s = c->impl; /* a group of one has no segment */
    shm_member *me = s && s->mem ? &s->mem[c->rank] : NULL;
    while (c->done < seq) {
        const comm_desc *d = &c->queue[(c->done + 1) % (uint64_t)c->qcap];
        if (me) {
            atomic_store_explicit(&me->at_kind, (uint32_t)d->kind, memory_order_relaxed);
            atomic_store_explicit(&me->at_seq, c->done + 1, memory_order_release);
        }
        shm_run(c, d);
        c->done++;
        if (me) atomic_store_explicit(&me->done_seq, c->done, memory_order_release);
    }
}
