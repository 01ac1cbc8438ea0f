/* comm_shm: the shared-memory backend for CPU ranks on one node.
 *
 * Each communicator maps one POSIX shm segment (mode 0600), created by its first member under a
 * name derived from the job id and published through the bootstrap KV store; the others map it
 * after the fence, and once every member has attached the name is unlinked (so a crash later
 * leaves nothing behind in /dev/shm). A crash before that can leave a segment: its name,
 * /ust-<job>-<group>-p<creator pid>-<nonce>, lets scripts/ustrun remove its job's segments when
 * the ranks have ended, and lets the next job on the node remove those whose creator is dead.
 *
 * Segment: a header of futex words, per-member lines, n*n point-to-point rings, and two staging
 * areas of n slots each. Collectives run in rounds over a bounded slice of the buffer: members
 * copy their part into their slot, meet at a barrier, then read what they need from the other
 * slots. Rounds alternate between the two areas, so a round's writes never race with the
 * previous round's reads (a barrier always lies between them) and one barrier per round is
 * enough, two for all-reduce.
 *
 * Waiting: a bounded spin (only when every local rank has a core), then futex sleep with the
 * deadline in slices; in each slice the peers not yet arrived are checked for liveness, so a
 * killed rank is reported within about a second instead of after the whole timeout. Liveness is
 * the state in /proc/<pid>/stat, not whether the pid exists: a killed rank whose launcher does not
 * reap it stays a zombie (kill(pid, 0) still succeeds), and a pid can be reused by another process
 * (told apart by the start time each member records when it attaches). */
#include "comm_impl.h"
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SHM_MAGIC 0x55534853u /* "USHS" */
#define CL 64
#define SHM_MAX_WAITING 1024 /* members named in a timeout message */
#ifndef SHM_SPIN_MIN_S
#define SHM_SPIN_MIN_S 2e-6 /* bounds of the adaptive spin before a futex sleep */
#define SHM_SPIN_MAX_S 50e-6
#endif
#define SHM_SMALL_BYTES (16u << 10) /* all-reduce below this: one barrier, see run_allreduce */

typedef struct {
    _Alignas(CL) _Atomic uint32_t arrived; /* last barrier this member reached */
    _Atomic uint32_t doorbell;             /* bumped when a p2p ring of this member moves */
    _Atomic uint32_t sleepers;             /* this member sleeps on doorbell */
    int32_t pid;
    uint64_t start; /* its start time (/proc/<pid>/stat field 22), 0 when unknown */
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
    uint32_t nwaits;   /* waits so far (every 64th probes with the full budget) */
    char shm_name[128];
    int unlinked;
} shm_comm;

/* Names of segments this process created and has not unlinked yet. The one piece of module
 * state: an atexit handler (reached from ust_fatal's exit) has no other way to find them. */
#define SHM_MAX_PENDING 256
static char g_pending[SHM_MAX_PENDING][128];
static int g_atexit_registered;

static void shm_unlink_pending(void) {
    for (int i = 0; i < SHM_MAX_PENDING; i++)
        if (g_pending[i][0]) {
            shm_unlink(g_pending[i]);
            g_pending[i][0] = 0;
        }
}

static void pending_set(const char *name, int add) {
    for (int i = 0; i < SHM_MAX_PENDING; i++) {
        if (add && !g_pending[i][0]) {
            snprintf(g_pending[i], sizeof g_pending[i], "%s", name);
            return;
        }
        if (!add && !strcmp(g_pending[i], name)) {
            g_pending[i][0] = 0;
            return;
        }
    }
}

static size_t seg_bytes(int n, size_t slot, size_t chan) {
    size_t nn = (size_t)n * (size_t)n;
    return sizeof(shm_hdr) + (size_t)n * sizeof(shm_member) + nn * sizeof(shm_chan) + nn * chan +
           2 * (size_t)n * slot;
}

static void shm_layout(shm_comm *s, int n, size_t chan) {
    uint8_t *p = s->base;
    s->hdr = (shm_hdr *)p;
    p += sizeof(shm_hdr);
    s->mem = (shm_member *)p;
    p += (size_t)n * sizeof(shm_member);
    s->chan = (shm_chan *)p;
    p += (size_t)n * (size_t)n * sizeof(shm_chan);
    s->ring = p;
    p += (size_t)n * (size_t)n * chan;
    s->stage = p;
}

static inline uint8_t *slot(const ust_comm *c, int area, int j) {
    const shm_comm *s = c->impl;
    return s->stage + ((size_t)area * (size_t)c->size + (size_t)j) * c->ctx->opts.shm_slot_bytes;
}

/* ---------------------------------------------------------------- liveness */

/* State letter and start time (clock ticks after boot) of a process, from /proc/<pid>/stat.
 * Returns 1 when read, 0 when no such process exists, -1 when it cannot be told (no /proc). */
static int proc_stat(long pid, char *state, uint64_t *start) {
    char p[64], buf[1024];
    snprintf(p, sizeof p, "/proc/%ld/stat", pid);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT || errno == ESRCH ? 0 : -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return n < 0 && errno == ESRCH ? 0 : -1;
    buf[n] = 0;
    /* "pid (comm) S f4 ... f22 ...": comm may hold spaces and ')', so parse after the last ')' */
    const char *q = strrchr(buf, ')');
    if (!q || q[1] != ' ' || !q[2]) return -1;
    *state = q[2];
    q += 3;
    for (int field = 4; field < 22 && q; field++) q = strchr(q + 1, ' ');
    *start = q ? strtoull(q, NULL, 10) : 0;
    return 1;
}

uint64_t shm_proc_start(long pid) {
    char st;
    uint64_t start = 0;
    return proc_stat(pid, &st, &start) == 1 ? start : 0;
}

const char *shm_proc_gone(long pid, uint64_t start) {
    char st = '?';
    uint64_t now_start = 0;
    int r = proc_stat(pid, &st, &now_start);
    if (r < 0) return kill((pid_t)pid, 0) != 0 && errno == ESRCH ? "has exited" : NULL;
    if (r == 0) return "has exited";
    if (st == 'Z' || st == 'X') return "was killed or exited and is not reaped yet (a zombie)";
    if (start && now_start && now_start != start)
        return "has exited; its pid now belongs to another process";
    return NULL;
}

/* ---------------------------------------------------------------- waiting */

static long futex(_Atomic uint32_t *w, int op, uint32_t val, const struct timespec *ts) {
    return syscall(SYS_futex, (uint32_t *)w, op, val, ts, NULL, 0);
}

static void wake(_Atomic uint32_t *w, _Atomic uint32_t *sleepers) {
    if (atomic_load(sleepers)) futex(w, FUTEX_WAKE, INT_MAX, NULL);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

typedef int (*wait_pred)(const ust_comm *c, const void *arg);
/* Fills waiting[] with the members this wait still needs; returns how many. */
typedef int (*wait_who)(const ust_comm *c, const void *arg, int *waiting);

/* Waits until pred holds, sleeping on futex word w (whose waker bumps it and then wakes
 * *sleepers). On the deadline, or when a member it waits on has died, exits naming them. */
static void shm_wait(ust_comm *c, comm_kind k, _Atomic uint32_t *w, _Atomic uint32_t *sleepers,
                     wait_pred pred, wait_who who, const void *arg) {
    if (pred(c, arg)) return;
    /* Spin briefly first: a running peer arrives within microseconds. The budget adapts: it
     * halves each time the spin fails (a descheduled peer, e.g. another job on the core, needs
     * this core more than we need the poll) and doubles each time it succeeds. Failures feed
     * themselves (a rank that slept arrives late at the next barrier, so its peer's short spin
     * fails too), so every 64th wait spins the full budget: once both ranks are running, one
     * success puts them back in step. */
    shm_comm *s = c->impl;
    if (c->ctx->spin) {
        double until = log_now_s() + ((++s->nwaits & 63) ? s->spin_s : SHM_SPIN_MAX_S);
        for (int i = 1;; i++) {
            cpu_relax();
            if (pred(c, arg)) {
                s->spin_s = s->spin_s * 2 < SHM_SPIN_MAX_S ? s->spin_s * 2 : SHM_SPIN_MAX_S;
                return;
            }
            if (!(i & 31) && log_now_s() > until) break;
        }
        s->spin_s = s->spin_s / 2 > SHM_SPIN_MIN_S ? s->spin_s / 2 : SHM_SPIN_MIN_S;
    }
    double deadline = log_now_s() + c->ctx->opts.timeout_s;
    int waiting[SHM_MAX_WAITING];
    for (;;) {
        uint32_t v = atomic_load(w);
        int slept_out = 1;
        atomic_fetch_add(sleepers, 1);
        if (!pred(c, arg)) {
            double left = deadline - log_now_s();
            double slice = left < 0.5 ? left : 0.5;
            if (slice > 0) {
                struct timespec ts = {(time_t)slice, (long)((slice - (double)(time_t)slice) * 1e9)};
                slept_out = futex(w, FUTEX_WAIT, v, &ts) != 0 && errno == ETIMEDOUT;
            }
        }
        atomic_fetch_sub(sleepers, 1);
        if (pred(c, arg)) return;
        /* Only a whole quiet slice makes us look at the peers (one /proc read per member). */
        if (!slept_out && log_now_s() < deadline) continue;
        int nw = who(c, arg, waiting);
        for (int i = 0; i < nw; i++) {
            const shm_member *m = &s->mem[waiting[i]];
            const char *how = m->pid > 0 ? shm_proc_gone(m->pid, m->start) : NULL;
            if (how) {
                char why[160];
                snprintf(why, sizeof why, "a member process has died (pid %d %s)", (int)m->pid,
                         how);
                comm_fail_wait(c, k, waiting + i, 1, why);
            }
        }
        if (log_now_s() >= deadline) comm_fail_timeout(c, k, waiting, nw);
    }
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
        wake(&s->hdr->gen, &s->hdr->sleepers);
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
    wake(&s->mem[j].doorbell, &s->mem[j].sleepers);
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
static void shm_wait_until(ust_comm *c, uint64_t seq) {
    while (c->done < seq) {
        shm_run(c, &c->queue[(c->done + 1) % (uint64_t)c->qcap]);
        c->done++;
    }
}

/* ---------------------------------------------------------------- set-up */

/* The creator pid in a segment name made by shm_create_begin ("...-p<pid>-<hex>"), or 0. */
static long segment_pid(const char *name) {
    const char *dash = strrchr(name, '-');
    if (!dash || !dash[1] || dash == name) return 0;
    const char *p = dash - 1;
    while (p > name && *p >= '0' && *p <= '9') p--;
    if (p == dash - 1 || *p != 'p' || p == name || p[-1] != '-') return 0;
    return strtol(p + 1, NULL, 10);
}

/* Removes this user's /dev/shm/ust-* segments whose creator no longer exists: what ranks killed
 * while setting up a communicator left behind (their launcher may be dead too). A live creator's
 * segment is kept, whoever it belongs to. */
static void sweep_stale_segments(void) {
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, "ust-", 4) != 0) continue;
        long pid = segment_pid(de->d_name);
        struct stat st;
        if (pid <= 0 || fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            st.st_uid != geteuid() || !shm_proc_gone(pid, 0))
            continue;
        char name[300];
        snprintf(name, sizeof name, "/%s", de->d_name);
        if (shm_unlink(name) == 0)
            fprintf(stderr,
                    "ustrain: removed stale shared memory /dev/shm%s (its creator, pid %ld, is "
                    "gone)\n",
                    name, pid);
    }
    closedir(d);
}

static int shm_ctx_init(comm_ctx *ctx, ust_err *e) {
    if (ctx->boot->nnodes > 1)
        return ust_errf(e,
                        "comm: the shared-memory backend works on one node, but the job spans "
                        "%d nodes (use run.device: cuda with NCCL, or launch on one node)",
                        ctx->boot->nnodes);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    ctx->spin = ctx->boot->local_world <= cores;
    if (ctx->boot->local_rank == 0) sweep_stale_segments();
    if (!g_atexit_registered) {
        atexit(shm_unlink_pending);
        g_atexit_registered = 1;
    }
    return 0;
}

static void shm_ctx_free(comm_ctx *ctx) { (void)ctx; }

static int map_segment(ust_comm *c, int fd, ust_err *e) {
    shm_comm *s = c->impl;
    s->base = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s->base == MAP_FAILED) {
        s->base = NULL;
        return ust_errf(e, "comm: mapping %s (%zu bytes): %s", s->shm_name, s->len,
                        strerror(errno));
    }
    shm_layout(s, c->size, c->ctx->opts.shm_chan_bytes);
    return 0;
}

static int shm_create_begin(ust_comm *c, const char *key, ust_err *e) {
    comm_ctx *ctx = c->ctx;
    shm_comm *s = calloc(1, sizeof *s);
    UST_ASSERT(s, "out of memory");
    c->impl = s;
    s->spin_s = SHM_SPIN_MAX_S / 4;
    s->len = seg_bytes(c->size, ctx->opts.shm_slot_bytes, ctx->opts.shm_chan_bytes);
    if (c->size == 1 || c->rank != 0) return 0;
    /* The job id comes from the launcher; keep only characters a shm name may hold. */
    char job[64];
    size_t i = 0;
    for (; ctx->boot->job_id[i] && i < sizeof job - 1; i++) {
        char ch = ctx->boot->job_id[i];
        job[i] = ch == '/' || ch == ' ' ? '_' : ch;
    }
    job[i] = 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(s->shm_name, sizeof s->shm_name, "/ust-%.40s-%.50s-p%d-%lx", job, key + 5,
             (int)getpid(), (long)ts.tv_nsec);
    int fd = shm_open(s->shm_name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
        return ust_errf(e, "comm: creating shared memory %s for group '%s': %s", s->shm_name,
                        c->name, strerror(errno));
    pending_set(s->shm_name, 1);
    /* Reserve the pages now: on a full /dev/shm (Docker's default is 64 MiB) this fails here
     * with a message, instead of a SIGBUS in the middle of a collective later. */
    int err = posix_fallocate(fd, 0, (off_t)s->len);
    /* Test-only fault switch: the reservation fails with this errno (for every group, or only
     * for UST_FAULT_SHM_RESERVE_GROUP), as on a /dev/shm that is full. */
    const char *ferr = getenv("UST_FAULT_SHM_RESERVE_ERRNO"), *fgroup;
    if (ferr && atoi(ferr) > 0 &&
        (!(fgroup = getenv("UST_FAULT_SHM_RESERVE_GROUP")) || !strcmp(fgroup, c->name)))
        err = atoi(ferr);
    if (err) {
        close(fd);
        return ust_errf(e,
                        "comm: reserving %zu bytes of shared memory for group '%s' (%d "
                        "members): %s; /dev/shm is too small (e.g. docker --shm-size=4g)",
                        s->len, c->name, c->size, strerror(err));
    }
    if (map_segment(c, fd, e)) return -1;
    s->hdr->magic = SHM_MAGIC;
    s->hdr->n = (uint32_t)c->size;
    s->hdr->slot_bytes = ctx->opts.shm_slot_bytes;
    s->hdr->chan_bytes = ctx->opts.shm_chan_bytes;
    return boot_put(ctx->boot, key, s->shm_name, strlen(s->shm_name) + 1, e);
}

static int attach_done(const ust_comm *c, const void *arg) {
    const shm_comm *s = c->impl;
    (void)arg;
    return atomic_load(&s->hdr->attached) >= (uint32_t)c->size || atomic_load(&s->hdr->abandoned);
}

static int attach_who(const ust_comm *c, const void *arg, int *waiting) {
    const shm_comm *s = c->impl;
    int n = 0;
    (void)arg;
    for (int j = 0; j < c->size; j++)
        if (!s->mem[j].pid && n < SHM_MAX_WAITING) waiting[n++] = j;
    return n;
}

static int shm_create_end(ust_comm *c, const char *key, ust_err *e) {
    shm_comm *s = c->impl;
    comm_ctx *ctx = c->ctx;
    if (c->size == 1) return 0;
    if (c->rank != 0) {
        ust_err ge;
        int got = boot_get(ctx->boot, c->granks[0], key, s->shm_name, sizeof s->shm_name, &ge);
        if (got < 0)
            return ust_errf(e,
                            "comm: group '%s': no shared-memory segment from rank %d (its "
                            "creator, which may have failed: see its message): %s",
                            c->name, c->granks[0], ge.msg);
        /* Test-only fault switch: hold the window in which the segment exists under its name
         * (test/sh/security.sh kills the job there to check the clean-up of what it leaves). */
        const char *hold = getenv("UST_FAULT_SHM_ATTACH_SLEEP_MS");
        if (hold && atoi(hold) > 0) usleep((useconds_t)atoi(hold) * 1000u);
        s->shm_name[sizeof s->shm_name - 1] = 0;
        int fd = shm_open(s->shm_name, O_RDWR, 0600);
        /* The name was published, so it is gone only when its creator removed it on its way out
         * (it failed: its own message says why), or when we are on another node. */
        if (fd < 0)
            return ust_errf(e,
                            "comm: opening shared memory %s of group '%s' (made by rank %d): "
                            "%s (the segment's creator, rank %d, may have failed: see its "
                            "message; otherwise the job must run on one node)",
                            s->shm_name, c->name, c->granks[0], strerror(errno), c->granks[0]);
        struct stat sb;
        if (fstat(fd, &sb) != 0 || (size_t)sb.st_size != s->len) {
            close(fd);
            return ust_errf(e,
                            "comm: shared memory %s of group '%s' has %lld bytes, expected %zu "
                            "(ranks disagree on the comm settings)",
                            s->shm_name, c->name, (long long)sb.st_size, s->len);
        }
        if (map_segment(c, fd, e)) return -1;
        if (s->hdr->magic != SHM_MAGIC || s->hdr->n != (uint32_t)c->size)
            return ust_errf(e, "comm: shared memory %s of group '%s' is not ours", s->shm_name,
                            c->name);
    }
    s->mem[c->rank].start = shm_proc_start(getpid());
    atomic_thread_fence(memory_order_release); /* the start is there before the pid names us */
    s->mem[c->rank].pid = (int32_t)getpid();
    atomic_fetch_add(&s->hdr->attached, 1);
    wake(&s->hdr->attached, &s->hdr->sleepers);
    /* Everyone must have mapped the segment before its name goes away. */
    shm_wait(c, COMM_BARRIER, &s->hdr->attached, &s->hdr->sleepers, attach_done, attach_who, NULL);
    if (atomic_load(&s->hdr->abandoned))
        return ust_errf(e,
                        "comm: creating group '%s': a member gave up on its shared memory before "
                        "every member attached (it failed: see its message)",
                        c->name);
    if (c->rank == 0) {
        shm_unlink(s->shm_name);
        pending_set(s->shm_name, 0);
    }
    s->unlinked = 1;
    return 0;
}

static void shm_free(ust_comm *c) {
    shm_comm *s = c->impl;
    /* Freed before every member attached: this member failed in comm_create_many. Members
     * waiting for it to attach would otherwise wait until dist.timeout_s, while it waits for
     * them to leave the bootstrap store before it can report why. */
    if (s->base && !s->unlinked && s->hdr->magic == SHM_MAGIC) {
        atomic_store(&s->hdr->abandoned, 1);
        wake(&s->hdr->attached, &s->hdr->sleepers);
    }
    if (s->base) munmap(s->base, s->len);
    if (!s->unlinked && c->rank == 0 && s->shm_name[0]) {
        shm_unlink(s->shm_name);
        pending_set(s->shm_name, 0);
    }
    free(s);
    c->impl = NULL;
}

#define shm_launch NULL /* nothing moves at post time: shm_wait_until runs the queue */
#define FILL(op) .op = shm_##op,
const comm_backend_ops comm_shm_backend = {COMM_BACKEND_LIST(FILL)};
#undef FILL
