/* comm_shm_segment: a shared-memory communicator's segment, from creation to unlink, and how its
 * members wait on one another (the collectives on it are comm_shm.c; the layout, comm_shm.h).
 *
 * Each communicator maps one POSIX shm segment (mode 0600), created by its first member under a
 * name derived from the job id and published through the bootstrap KV store; the others map it
 * after the fence, and once every member has attached the name is unlinked (so a crash later
 * leaves nothing behind in /dev/shm). A crash before that can leave a segment: its name,
 * /ust-<job>-<group>-p<creator pid>-<nonce>, lets scripts/ustrun remove its job's segments when
 * the ranks have ended, and lets the next job on the node remove those whose creator is dead.
 *
 * Waiting: a bounded spin (only when every local rank has a core), then futex sleep with the
 * deadline in slices; in each slice the peers not yet arrived are checked for liveness, so a
 * killed rank is reported within about a second instead of after the whole timeout. Liveness is
 * the state in /proc/<pid>/stat, not whether the pid exists: a killed rank whose launcher does not
 * reap it stays a zombie (kill(pid, 0) still succeeds), and a pid can be reused by another process
 * (told apart by the start time each member records when it attaches). */
#include "comm_shm.h"
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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

void shm_wake(_Atomic uint32_t *w, _Atomic uint32_t *sleepers) {
    if (atomic_load(sleepers)) futex(w, FUTEX_WAKE, INT_MAX, NULL);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* The timeout, naming where each member we wait on is: in an earlier operation of the group
 * (its sequence number and kind), or between operations since one (computing, or stopped: a
 * SIGSTOP, a loop in compute). Ours is done + 1. */
_Noreturn static void fail_behind(const ust_comm *c, comm_kind k, const int *waiting, int nw) {
    const shm_comm *s = c->impl;
    char where[1024];
    size_t used = 0;
    where[0] = 0;
    for (int i = 0; i < nw && used + 96 < sizeof where; i++) {
        const shm_member *m = &s->mem[waiting[i]];
        uint64_t at = atomic_load(&m->at_seq), done = atomic_load(&m->done_seq);
        if (at > done)
            used += (size_t)snprintf(where + used, sizeof where - used,
                                     "%sglobal rank %d in op #%llu (%s)", i ? "; " : "",
                                     c->granks[waiting[i]], (unsigned long long)at,
                                     comm_kind_name((comm_kind)atomic_load(&m->at_kind)));
        else
            used +=
                (size_t)snprintf(where + used, sizeof where - used,
                                 "%sglobal rank %d between ops since #%llu (computing, or "
                                 "stopped)",
                                 i ? "; " : "", c->granks[waiting[i]], (unsigned long long)done);
    }
    comm_fail_timeout_at(c, k, waiting, nw, where);
}

void shm_wait(ust_comm *c, comm_kind k, _Atomic uint32_t *w, _Atomic uint32_t *sleepers,
              wait_pred pred, wait_who who, const void *arg) {
    if (pred(c, arg)) return;
    /* Spin briefly first: a running peer arrives within microseconds. The budget adapts: it
     * halves each time the spin fails (a descheduled peer, e.g. another job on the core, needs
     * this core more than we need the poll) and doubles each time it succeeds. Failures feed
     * themselves (a rank that slept arrives late at the next barrier, so its peer's short spin
     * fails too), so every 64th wait spins the full budget: once both ranks are running, one
     * success puts them back in step. */
    shm_comm *s = c->impl;
    int full = !(++s->nwaits & 63);
    if (c->ctx->spin) {
        double until = log_now_s() + (full ? SHM_SPIN_MAX_S : s->spin_s);
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
    {
        /* Then (first, with more local ranks than cores) poll with sched_yield: the peer we
         * wait for may need this very core (our own ranks oversubscribing it, or another job's
         * processes descheduling the peer), and it runs at once if it is runnable here. The
         * budget adapts the same way (success doubles it, failure halves it, down to about a
         * single yield), then we sleep: a rank whose peers are all descheduled or computing
         * never keeps a core busy for more than SHM_SPIN_MAX_S + SHM_YIELD_MAX_S per wait, so
         * 8 ranks on 2 cores keep progressing. */
        double until = log_now_s() + (full ? SHM_YIELD_MAX_S : s->yield_s);
        for (;;) {
            sched_yield();
            if (pred(c, arg)) {
                s->yield_s = s->yield_s * 2 < SHM_YIELD_MAX_S ? s->yield_s * 2 : SHM_YIELD_MAX_S;
                return;
            }
            if (log_now_s() > until) break;
        }
        s->yield_s = s->yield_s / 2 > SHM_SPIN_MIN_S ? s->yield_s / 2 : SHM_SPIN_MIN_S;
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
        flight_poll(c->ctx->fl); /* a SIGUSR2 wakes the futex: the file shows this wait */
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
        if (log_now_s() >= deadline) fail_behind(c, k, waiting, nw);
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

/* A job over several nodes is comm.c's concern: it gives the groups that span nodes to gloo,
 * so every group this backend sees is inside one node. */
static int shm_ctx_init(comm_ctx *ctx, ust_err *e) {
    (void)e;
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
    s->yield_s = SHM_YIELD_MAX_S / 4;
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
    shm_wake(&s->hdr->attached, &s->hdr->sleepers);
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
        shm_wake(&s->hdr->attached, &s->hdr->sleepers);
    }
    if (s->base) munmap(s->base, s->len);
    if (!s->unlinked && c->rank == 0 && s->shm_name[0]) {
        shm_unlink(s->shm_name);
        pending_set(s->shm_name, 0);
    }
    free(s);
    c->impl = NULL;
}

/* Nothing moves at post time: shm_wait_until (comm_shm.c) runs the queue. */
#define shm_launch NULL
#define FILL(op) .op = shm_##op,
const comm_backend_ops comm_shm_backend = {COMM_BACKEND_LIST(FILL)};
#undef FILL
