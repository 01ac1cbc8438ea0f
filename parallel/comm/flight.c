/* flight: the recording half (flight.h): the ring, the file each rank writes, SIGUSR2 and the
 * timeout's gathering of every reachable rank's file. flight_diag.c reads the files. */
#include "flight_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm_shm.h"
#include "fs.h"
#include "log.h"

/* Set by SIGUSR2, read at the next post or wait poll: the only state the handler touches. */
static volatile sig_atomic_t g_flight_asked;

static void on_usr2(int sig) {
    (void)sig;
    g_flight_asked = 1;
}

struct flight {
    comm_ctx *ctx;
    flight_entry *ring;
    int cap;
    uint64_t n; /* entries ever recorded; the newest is ring[(n - 1) % cap] */
    char dir[4096];
    double last_write; /* log_now_s of the last file (SIGUSR2 writes at most every 0.2 s) */
    int warned;        /* the one warning of a file that could not be written */
    int timed_out;     /* the timeout's file is written: a fatal error after it keeps it */
};

static void on_fatal(void *arg) {
    flight *f = arg;
    if (!f->timed_out) flight_write(f, "fatal");
}

flight *flight_create(comm_ctx *ctx, int entries, const char *dir) {
    if (entries <= 0) return NULL;
    flight *f = calloc(1, sizeof *f);
    UST_ASSERT(f, "out of memory");
    f->ctx = ctx;
    f->cap = entries;
    f->ring = calloc((size_t)entries, sizeof *f->ring);
    UST_ASSERT(f->ring, "out of memory");
    snprintf(f->dir, sizeof f->dir, "%s", dir ? dir : "");
    f->last_write = -1;
    if (f->dir[0]) {
        /* SA_RESTART: a SIGUSR2 storm must not fail a read or write of the run with EINTR */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_usr2;
        sa.sa_flags = SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGUSR2, &sa, NULL);
        ust_on_fatal(on_fatal, f);
    }
    return f;
}

void flight_free(flight *f) {
    if (!f) return;
    if (f->dir[0]) {
        ust_on_fatal(NULL, NULL);
        signal(SIGUSR2, SIG_IGN); /* a late request must not kill a finishing run */
    }
    free(f->ring);
    free(f);
}

/* ------------------------------------------------------------------ recording */

void flight_label(ust_comm *c, const char *label) {
    snprintf(c->flabel, sizeof c->flabel, "%s", label ? label : "");
}

int flight_post(flight *f, ust_comm *c, const comm_desc *d, uint64_t bytes) {
    int idx = (int)(f->n++ % (uint64_t)f->cap);
    flight_entry *x = &f->ring[idx];
    memset(x, 0, sizeof *x);
    x->group = c->fid;
    x->kind = d->kind;
    x->seq = d->seq;
    x->bytes = bytes;
    x->t_post = log_now_s();
    if (d->kind == COMM_SENDRECV) {
        for (int i = 0; i < d->np2p; i++) {
            const comm_p2p *p = &d->p2p[i];
            uint64_t k = p->is_send ? ++c->fsent[p->peer] : ++c->frecvd[p->peer];
            if (x->np2p < FLIGHT_P2P) x->p2p[x->np2p++] = (flight_p2p){p->peer, p->is_send, k};
        }
    } else {
        x->coll = d->coll;
    }
    memcpy(x->label, c->flabel, sizeof x->label);
    c->flabel[0] = 0;
    return idx;
}

/* The ring entry of c's operation seq (its queue slot remembers the index), or NULL when the
 * ring has moved past it. */
static flight_entry *entry_of(flight *f, const ust_comm *c, uint64_t seq) {
    const comm_desc *d = &c->queue[seq % (uint64_t)c->qcap];
    flight_entry *x = &f->ring[d->fidx];
    return d->seq == seq && x->group == c->fid && x->seq == seq ? x : NULL;
}

void flight_wait_begin(flight *f, ust_comm *c, uint64_t seq) {
    double now = log_now_s();
    for (uint64_t s = c->done + 1; s <= seq; s++) {
        flight_entry *x = entry_of(f, c, s);
        if (x && x->state == FLIGHT_POSTED) x->state = FLIGHT_WAITING, x->t_wait = now;
    }
}

void flight_wait_end(flight *f, ust_comm *c, uint64_t from, uint64_t seq) {
    double now = log_now_s();
    for (uint64_t s = from + 1; s <= seq; s++) {
        flight_entry *x = entry_of(f, c, s);
        if (x) x->state = FLIGHT_DONE, x->t_done = now;
    }
}

/* ------------------------------------------------------------------ the file */

static const char *state_name(int s) {
    return s == FLIGHT_DONE ? "done" : s == FLIGHT_WAITING ? "waiting" : "posted";
}

static void write_u64s(FILE *o, const uint64_t *v, int n) {
    for (int j = 0; j < n; j++) fprintf(o, "%s%llu", j ? "," : "", (unsigned long long)v[j]);
}

/* One line per group this rank is in: its members, where this rank is in it (ops posted and
 * completed, collectives posted, p2p messages sent to and received from each member). */
static void write_groups(FILE *o, const comm_ctx *ctx) {
    fprintf(o, "\"groups\": [\n");
    for (int i = 0; i < ctx->nall; i++) {
        const ust_comm *c = ctx->all[i];
        fprintf(o, "{\"id\": %d, \"name\": \"%s\", \"members\": [", c->fid, c->name);
        for (int j = 0; j < c->size; j++) fprintf(o, "%s%d", j ? "," : "", c->granks[j]);
        fprintf(o, "], \"me\": %d, \"posted\": %llu, \"done\": %llu, \"colls\": %llu, \"sent\": [",
                c->rank, (unsigned long long)c->posted, (unsigned long long)c->done,
                (unsigned long long)c->fcolls);
        write_u64s(o, c->fsent, c->size);
        fprintf(o, "], \"recvd\": [");
        write_u64s(o, c->frecvd, c->size);
        fprintf(o, "]}%s\n", i + 1 < ctx->nall ? "," : "");
    }
    fprintf(o, "],\n");
}

static const ust_comm *comm_of(const comm_ctx *ctx, int fid) {
    for (int i = 0; i < ctx->nall; i++)
        if (ctx->all[i]->fid == fid) return ctx->all[i];
    return NULL;
}

/* The ring, oldest first; times as wall-clock seconds (comparable across the ranks of a node,
 * and across nodes as far as their clocks agree); p2p peers as global ranks. */
static void write_entries(FILE *o, const flight *f, double wall, double mono) {
    fprintf(o, "\"entries\": [\n");
    uint64_t first = f->n > (uint64_t)f->cap ? f->n - (uint64_t)f->cap : 0;
    int any = 0;
    for (uint64_t k = first; k < f->n; k++) {
        const flight_entry *x = &f->ring[k % (uint64_t)f->cap];
        const ust_comm *c = comm_of(f->ctx, x->group);
        if (!c) continue; /* its communicator is gone */
#define WALL(t) ((t) > 0 ? wall - (mono - (t)) : 0.0)
        fprintf(o,
                "%s{\"g\": %d, \"kind\": \"%s\", \"seq\": %llu, \"coll\": %llu, \"bytes\": %llu, "
                "\"state\": \"%s\", \"t_post\": %.6f, \"t_wait\": %.6f, \"t_done\": %.6f, "
                "\"label\": \"%s\", \"p2p\": [",
                any ? ",\n" : "", x->group, comm_kind_name((comm_kind)x->kind),
                (unsigned long long)x->seq, (unsigned long long)x->coll,
                (unsigned long long)x->bytes, state_name(x->state), WALL(x->t_post),
                WALL(x->t_wait), WALL(x->t_done), x->label);
#undef WALL
        for (int i = 0; i < x->np2p; i++)
            fprintf(o, "%s[%d, \"%s\", %llu]", i ? ", " : "", c->granks[x->p2p[i].peer],
                    x->p2p[i].send ? "send" : "recv", (unsigned long long)x->p2p[i].msg);
        fprintf(o, "]}");
        any = 1;
    }
    fprintf(o, "%s]\n", any ? "\n" : "");
}

static double wall_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Writes DIR/rank_R.json (through a temporary file and a rename, so a reader never sees half of
 * one). A failure warns once and the run goes on. */
int flight_write(flight *f, const char *why) {
    if (!f || !f->dir[0]) return -1;
    const ust_boot *b = f->ctx->boot;
    char path[4200], tmp[4300];
    ust_err e;
    snprintf(path, sizeof path, "%s/rank_%d.json", f->dir, b->rank);
    snprintf(tmp, sizeof tmp, "%s/.rank_%d.json.tmp", f->dir, b->rank);
    FILE *o = NULL;
    int ok = 0;
    if (fs_mkdir_p(f->dir, &e) == 0 && !(o = fopen(tmp, "w")))
        snprintf(e.msg, sizeof e.msg, "%s: %s", tmp, strerror(errno));
    if (o) {
        double wall = wall_now(), mono = log_now_s();
        fprintf(o,
                "{\"flight\": 1, \"job\": \"%s\", \"rank\": %d, \"world\": %d, \"pid\": %d, "
                "\"why\": \"%s\", \"written\": %.6f, \"timeout_s\": %g, \"recorded\": %llu,\n",
                b->job_id, b->rank, b->world, (int)getpid(), why, wall, f->ctx->opts.timeout_s,
                (unsigned long long)f->n);
        write_groups(o, f->ctx);
        write_entries(o, f, wall, mono);
        fprintf(o, "}\n");
        int bad = ferror(o), closed = fclose(o) == 0;
        if (bad || !closed || rename(tmp, path) != 0) {
            snprintf(e.msg, sizeof e.msg, "%s: %s", path, strerror(errno ? errno : EIO));
            unlink(tmp);
        } else {
            ok = 1;
        }
    }
    f->last_write = log_now_s();
    if (ok) return 0;
    if (!f->warned++)
        fprintf(stderr,
                "ustrain[rank %d]: warning: flight recorder: cannot write %s; training goes on, "
                "the ring stays in memory\n",
                b->rank, e.msg);
    return -1;
}

void flight_poll(flight *f) {
    if (!g_flight_asked || !f || !f->dir[0]) return;
    if (f->last_write >= 0 && log_now_s() - f->last_write < 0.2) return; /* a storm: later */
    g_flight_asked = 0;
    flight_write(f, "signal");
}

/* ------------------------------------------------------------------ a timeout */

/* SIGUSR2 to every other member of this rank's shared-memory groups (the ranks of this node it
 * talks to) that still is the process that joined: they write their files at their next poll. */
static void ask_peers(const flight *f) {
    for (int i = 0; i < f->ctx->nall; i++) {
        const ust_comm *c = f->ctx->all[i];
        if (c->be != &comm_shm_backend || !c->impl) continue;
        const shm_comm *s = c->impl;
        for (int j = 0; j < c->size; j++) {
            const shm_member *m = &s->mem[j];
            if (j != c->rank && m->pid > 0 && !shm_proc_gone(m->pid, m->start))
                kill((pid_t)m->pid, SIGUSR2);
        }
    }
}

/* The first rank of the job to call this creates DIR/.diagnosed-<job> and prints. */
static int first_to_diagnose(const flight *f) {
    char path[4300];
    snprintf(path, sizeof path, "%s/.diagnosed-%s", f->dir, f->ctx->boot->job_id);
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) return 0;
    close(fd);
    return 1;
}

void flight_on_timeout(flight *f) {
    if (!f || !f->dir[0] || f->timed_out) return;
    double t0 = log_now_s(), wall0 = wall_now();
    int wrote = flight_write(f, "timeout") == 0;
    f->timed_out = 1;
    if (!wrote || !first_to_diagnose(f)) return;
    ask_peers(f);
    /* the members answer within a futex slice (0.5 s) of their wait, or at their next post; a
     * stopped or dead one never does */
    double limit = f->ctx->opts.timeout_s < 2 ? f->ctx->opts.timeout_s : 2;
    int world = f->ctx->boot->world;
    while (log_now_s() - t0 < limit &&
           flight_fresh_files(f->dir, f->ctx->boot->job_id, wall0, world) < world) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ust_err e;
    if (flight_diagnose_job(f->dir, f->ctx->boot->job_id, wall0, stderr, &e))
        fprintf(stderr, "ustrain[rank %d]: flight: no diagnosis: %s\n", f->ctx->boot->rank, e.msg);
    fprintf(stderr, "ustrain[rank %d]: flight: each reachable rank's ring is in %s/rank_R.json\n",
            f->ctx->boot->rank, f->dir);
}
