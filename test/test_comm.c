/* comm (shared-memory backend) against serial references.
 *
 * Run with no launcher environment, this program is the driver: it runs the world-size-1 cases
 * itself (single-process bootstrap) and, for world sizes 2, 3, 4 and 8, starts that many copies
 * of itself with the torchrun-style variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: the
 * real bootstrap and its TCP store), each writing "ok CASE" / "bad CASE: why" lines to its own
 * file. A case PASSes when every rank reported ok. Inputs are small integers, so sums are exact
 * in fp32 and bf16 and results must match the reference exactly (average: 1 ulp, see check).
 * Staging slots and p2p rings are made tiny (UST_TEST_SLOT / UST_TEST_CHAN) so that every
 * buffer above a few KiB runs through many rounds and wraps the rings many times. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#include "bootstrap.h"
#include "comm.h"
#include "comm_impl.h"
#include "test.h"
#include "topology.h"

#ifdef UST_NCCL
#include "nccl_api.h" /* cudaMalloc & co. from the table the NCCL context loaded */
#endif

/* ---------------------------------------------------------------- values */

/* Element i of global rank r's input for salt s: an integer in [-8, 8]. */
static float val(int s, int r, size_t i) {
    return (float)((int)(((size_t)r * 131u + i * 7u + (size_t)s * 17u) % 17u) - 8);
}

static size_t esz(comm_dtype t) { return comm_dtype_size(t); }

static void put(void *buf, comm_dtype t, size_t i, float v) {
    if (t == COMM_FP32)
        ((float *)buf)[i] = v;
    else
        ((uint16_t *)buf)[i] = comm_f32_to_bf16(v);
}

static float get(const void *buf, comm_dtype t, size_t i) {
    return t == COMM_FP32 ? ((const float *)buf)[i] : comm_bf16_to_f32(((const uint16_t *)buf)[i]);
}

/* Average: the backend sums exactly, then multiplies by 1/n in fp32 and rounds once. */
static float avg_ref(double sum, int n, comm_dtype t) {
    float f = (float)sum * (1.0f / (float)n);
    return t == COMM_FP32 ? f : comm_bf16_to_f32(comm_f32_to_bf16(f));
}

static void *xalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) abort();
    return p;
}

/* ---------------------------------------------------------------- jobs: post, then verify */

typedef struct {
    comm_kind kind;
    ust_comm *c;
    comm_dtype t;
    comm_redop op;
    size_t count;
    int root, inplace, salt;
    void *send, *recv;
    size_t *sc, *sd, *rc, *rd; /* all-to-allv */
    comm_p2p p2p[4];
    void *pbuf[4];
    comm_req req;
    struct {
        void *host, *dev;
        size_t bytes;
    } mir[4]; /* device mirrors (NCCL) */
    int nmir;
} job;

/* NCCL runs: operations get device copies of the job's host buffers (set in child_main and the
 * world-1 NCCL test; the shm runs leave it 0 and use the host buffers directly). */
static int g_dev;

static void *jalloc(job *J, size_t bytes) {
    void *h = xalloc(bytes);
    if (g_dev) {
        void *d = NULL;
#ifdef UST_NCCL
        if (cudaMalloc(&d, bytes ? bytes : 4) != cudaSuccess) abort();
#endif
        J->mir[J->nmir].host = h, J->mir[J->nmir].dev = d, J->mir[J->nmir].bytes = bytes;
        J->nmir++;
    }
    return h;
}

/* Device address of host pointer p (itself without mirrors). */
static void *D(job *J, const void *p) {
    for (int i = 0; i < J->nmir; i++) {
        const char *h = J->mir[i].host;
        if ((const char *)p >= h && (const char *)p <= h + J->mir[i].bytes)
            return (char *)J->mir[i].dev + ((const char *)p - h);
    }
    return (void *)p;
}

static void sync_mirrors(job *J, int to_dev) {
#ifdef UST_NCCL
    for (int i = 0; i < J->nmir; i++)
        if (J->mir[i].bytes &&
            cudaMemcpy(to_dev ? J->mir[i].dev : J->mir[i].host,
                       to_dev ? J->mir[i].host : J->mir[i].dev, J->mir[i].bytes,
                       to_dev ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost) != cudaSuccess)
            abort();
#else
    (void)J, (void)to_dev;
#endif
}

/* All-to-allv count from global-rank-independent member indices i -> j (zeros included). */
static size_t a2a_count(int i, int j, size_t m) {
    return (size_t)((i * 3 + j * 5) % 7) * m + (size_t)((i + j) % 2);
}

static void job_post(job *J) {
    ust_comm *c = J->c;
    int n = comm_size(c), me = comm_rank(c), g = comm_global_rank(c, me);
    size_t cnt = J->count, es = esz(J->t);
    switch (J->kind) {
    case COMM_ALLREDUCE:
        J->send = jalloc(J, cnt * es);
        for (size_t i = 0; i < cnt; i++) put(J->send, J->t, i, val(J->salt, g, i));
        J->recv = J->inplace ? J->send : jalloc(J, cnt * es);
        sync_mirrors(J, 1);
        J->req = comm_allreduce(c, D(J, J->send), D(J, J->recv), cnt, J->t, J->op);
        break;
    case COMM_ALLGATHER:
        J->recv = jalloc(J, (size_t)n * cnt * es);
        J->send = J->inplace ? (char *)J->recv + (size_t)me * cnt * es : jalloc(J, cnt * es);
        for (size_t i = 0; i < cnt; i++) put(J->send, J->t, i, val(J->salt, g, i));
        sync_mirrors(J, 1);
        J->req = comm_allgather(c, D(J, J->send), D(J, J->recv), cnt, J->t);
        break;
    case COMM_REDUCE_SCATTER:
        J->send = jalloc(J, (size_t)n * cnt * es);
        for (size_t i = 0; i < (size_t)n * cnt; i++) put(J->send, J->t, i, val(J->salt, g, i));
        J->recv = J->inplace ? (char *)J->send + (size_t)me * cnt * es : jalloc(J, cnt * es);
        sync_mirrors(J, 1);
        J->req = comm_reduce_scatter(c, D(J, J->send), D(J, J->recv), cnt, J->t, J->op);
        break;
    case COMM_BROADCAST:
        J->send = J->recv = jalloc(J, cnt * es);
        for (size_t i = 0; i < cnt; i++) put(J->recv, J->t, i, val(J->salt, g, i));
        sync_mirrors(J, 1);
        J->req = comm_broadcast(c, D(J, J->recv), cnt, J->t, J->root);
        break;
    case COMM_ALLTOALL: {
        /* count == 0 here means all-to-allv with per-pair counts a2a_count(., ., 37). */
        J->sc = xalloc(sizeof(size_t) * n), J->sd = xalloc(sizeof(size_t) * n);
        J->rc = xalloc(sizeof(size_t) * n), J->rd = xalloc(sizeof(size_t) * n);
        size_t st = 0, rt = 0;
        for (int j = 0; j < n; j++) {
            J->sc[j] = J->inplace ? cnt : a2a_count(me, j, 37 + J->salt);
            J->rc[j] = J->inplace ? cnt : a2a_count(j, me, 37 + J->salt);
            J->sd[j] = st, J->rd[j] = rt;
            st += J->sc[j], rt += J->rc[j];
        }
        J->send = jalloc(J, st * es), J->recv = jalloc(J, rt * es);
        for (int j = 0; j < n; j++) /* element k to member j encodes (sender, j, k) */
            for (size_t k = 0; k < J->sc[j]; k++)
                put(J->send, J->t, J->sd[j] + k, val(J->salt + j, g, k));
        sync_mirrors(J, 1);
        J->req = J->inplace ? comm_alltoall(c, D(J, J->send), D(J, J->recv), cnt, J->t)
                            : comm_alltoallv(c, D(J, J->send), J->sc, J->sd, D(J, J->recv), J->rc,
                                             J->rd, J->t);
        break;
    }
    case COMM_SENDRECV: {
        /* A ring in both directions in one batch: send to next and previous, receive from both. */
        int nx = (me + 1) % n, pv = (me + n - 1) % n;
        int peers[4] = {nx, pv, pv, nx}, sends[4] = {1, 1, 0, 0};
        for (int k = 0; k < 4; k++) {
            J->pbuf[k] = jalloc(J, cnt * es);
            int dir = k == 0 || k == 2 ? 0 : 1; /* 0: to next / from previous */
            if (sends[k])
                for (size_t i = 0; i < cnt; i++) put(J->pbuf[k], J->t, i, val(J->salt + dir, g, i));
            J->p2p[k] = (comm_p2p){peers[k], sends[k], J->pbuf[k], cnt};
        }
        sync_mirrors(J, 1);
        for (int k = 0; k < 4; k++) J->p2p[k].buf = D(J, J->pbuf[k]);
        J->req = comm_sendrecv(c, J->p2p, 4, J->t);
        break;
    }
    case COMM_BARRIER:
        J->req = comm_barrier(c);
        break;
    default:
        break;
    }
}

/* Returns 0, or -1 with the first mismatch in why. */
static int job_verify(job *J, char *why, size_t cap) {
    ust_comm *c = J->c;
    int n = comm_size(c), me = comm_rank(c);
    size_t cnt = J->count;
    sync_mirrors(J, 0);
#define MISMATCH(i, got, want)                                                                     \
    do {                                                                                           \
        snprintf(why, cap, "%s on '%s' (n=%d, count %zu, %s%s): element %zu = %g, expected %g",    \
                 comm_kind_name(J->kind), comm_name(c), n, cnt, J->t ? "bf16" : "fp32",            \
                 J->inplace ? ", in place" : "", (size_t)(i), (double)(got), (double)(want));      \
        return -1;                                                                                 \
    } while (0)
    switch (J->kind) {
    case COMM_ALLREDUCE:
        for (size_t i = 0; i < cnt; i++) {
            double s = 0;
            for (int j = 0; j < n; j++) s += val(J->salt, comm_global_rank(c, j), i);
            float want = J->op == COMM_AVG ? avg_ref(s, n, J->t) : (float)s;
            if (get(J->recv, J->t, i) != want) MISMATCH(i, get(J->recv, J->t, i), want);
        }
        break;
    case COMM_ALLGATHER:
        for (int j = 0; j < n; j++)
            for (size_t i = 0; i < cnt; i++) {
                float want = val(J->salt, comm_global_rank(c, j), i);
                float got = get(J->recv, J->t, (size_t)j * cnt + i);
                if (got != want) MISMATCH((size_t)j * cnt + i, got, want);
            }
        break;
    case COMM_REDUCE_SCATTER:
        for (size_t i = 0; i < cnt; i++) {
            double s = 0;
            for (int j = 0; j < n; j++)
                s += val(J->salt, comm_global_rank(c, j), (size_t)me * cnt + i);
            float want = J->op == COMM_AVG ? avg_ref(s, n, J->t) : (float)s;
            if (get(J->recv, J->t, i) != want) MISMATCH(i, get(J->recv, J->t, i), want);
        }
        break;
    case COMM_BROADCAST:
        for (size_t i = 0; i < cnt; i++) {
            float want = val(J->salt, comm_global_rank(c, J->root), i);
            if (get(J->recv, J->t, i) != want) MISMATCH(i, get(J->recv, J->t, i), want);
        }
        break;
    case COMM_ALLTOALL:
        for (int j = 0; j < n; j++)
            for (size_t k = 0; k < J->rc[j]; k++) {
                float want = val(J->salt + me, comm_global_rank(c, j), k);
                float got = get(J->recv, J->t, J->rd[j] + k);
                if (got != want) MISMATCH(J->rd[j] + k, got, want);
            }
        break;
    case COMM_SENDRECV: {
        int nx = (me + 1) % n, pv = (me + n - 1) % n;
        for (size_t i = 0; i < cnt; i++) {
            float a = val(J->salt, comm_global_rank(c, pv), i); /* from previous, dir 0 */
            float b = val(J->salt + 1, comm_global_rank(c, nx), i);
            if (get(J->pbuf[2], J->t, i) != a) MISMATCH(i, get(J->pbuf[2], J->t, i), a);
            if (get(J->pbuf[3], J->t, i) != b) MISMATCH(i, get(J->pbuf[3], J->t, i), b);
        }
        break;
    }
    default:
        break;
    }
    return 0;
#undef MISMATCH
}

static void job_free(job *J) {
    if (J->kind == COMM_ALLGATHER && J->inplace) J->send = NULL;
    if (J->kind == COMM_REDUCE_SCATTER && J->inplace) J->recv = NULL;
    if (J->recv != J->send) free(J->recv);
    free(J->send);
    free(J->sc), free(J->sd), free(J->rc), free(J->rd);
    for (int k = 0; k < 4; k++) free(J->pbuf[k]);
#ifdef UST_NCCL
    for (int i = 0; i < J->nmir; i++) cudaFree(J->mir[i].dev);
#endif
    memset(J, 0, sizeof *J);
}

/* ---------------------------------------------------------------- cases (every rank) */

typedef struct {
    ust_boot boot;
    comm_ctx *ctx;
    ust_comm *world;
    FILE *out;
    int nbad;
} env;

static void report(env *E, const char *name, int bad, const char *why) {
    if (bad)
        fprintf(E->out, "bad %s: %s\n", name, why), E->nbad++;
    else
        fprintf(E->out, "ok %s\n", name);
    fflush(E->out);
}

static void run_one(env *E, const char *name, job J) {
    char why[512] = "";
    job_post(&J);
    comm_wait(&J.req);
    int bad = job_verify(&J, why, sizeof why);
    job_free(&J);
    report(E, name, bad, why);
}

static void case_world_collectives(env *E) {
    /* 0, 1, odd, a few rounds, and a few MiB (hundreds of rounds with the test's slot size). */
    static const size_t sizes[] = {0, 1, 7, 1001, 4099, (3u << 20) / 4 + 3};
    char name[128];
    int n = comm_size(E->world);
    for (int t = 0; t < 2; t++) {
        comm_dtype dt = t ? COMM_BF16 : COMM_FP32;
        const char *tn = t ? "bf16" : "fp32";
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            size_t cnt = sizes[si];
            int big = cnt > 100000;
            if (big && t) continue; /* bf16 shares the fp32 code path apart from the kernel */
            for (int ip = 0; ip < 2; ip++) {
                for (int op = 0; op < 2; op++) {
                    snprintf(name, sizeof name, "allreduce_%s_%s_%zu%s", tn, op ? "avg" : "sum",
                             cnt, ip ? "_inplace" : "");
                    run_one(E, name,
                            (job){.kind = COMM_ALLREDUCE,
                                  .c = E->world,
                                  .t = dt,
                                  .op = op ? COMM_AVG : COMM_SUM,
                                  .count = cnt,
                                  .inplace = ip,
                                  .salt = (int)si});
                    snprintf(name, sizeof name, "reduce_scatter_%s_%s_%zu%s", tn,
                             op ? "avg" : "sum", cnt / (size_t)(big ? n : 1), ip ? "_inplace" : "");
                    run_one(E, name,
                            (job){.kind = COMM_REDUCE_SCATTER,
                                  .c = E->world,
                                  .t = dt,
                                  .op = op ? COMM_AVG : COMM_SUM,
                                  .count = cnt / (size_t)(big ? n : 1),
                                  .inplace = ip,
                                  .salt = (int)si + 1});
                }
                snprintf(name, sizeof name, "allgather_%s_%zu%s", tn, cnt / (size_t)(big ? n : 1),
                         ip ? "_inplace" : "");
                run_one(E, name,
                        (job){.kind = COMM_ALLGATHER,
                              .c = E->world,
                              .t = dt,
                              .count = cnt / (size_t)(big ? n : 1),
                              .inplace = ip,
                              .salt = (int)si + 2});
            }
            snprintf(name, sizeof name, "broadcast_%s_%zu_root_last", tn, cnt);
            run_one(E, name,
                    (job){.kind = COMM_BROADCAST,
                          .c = E->world,
                          .t = dt,
                          .count = cnt,
                          .root = n - 1,
                          .salt = (int)si});
            snprintf(name, sizeof name, "alltoall_%s_%zu", tn, cnt / (size_t)n);
            run_one(E, name,
                    (job){.kind = COMM_ALLTOALL,
                          .c = E->world,
                          .t = dt,
                          .count = cnt / (size_t)n,
                          .inplace = 1,
                          .salt = (int)si});
            snprintf(name, sizeof name, "sendrecv_ring_both_directions_%s_%zu", tn, cnt);
            run_one(
                E, name,
                (job){
                    .kind = COMM_SENDRECV, .c = E->world, .t = dt, .count = cnt, .salt = (int)si});
        }
        snprintf(name, sizeof name, "alltoallv_uneven_counts_with_zeros_%s", tn);
        run_one(E, name, (job){.kind = COMM_ALLTOALL, .c = E->world, .t = dt, .salt = 3});
        snprintf(name, sizeof name, "alltoallv_uneven_counts_many_rounds_%s", tn);
        run_one(E, name, (job){.kind = COMM_ALLTOALL, .c = E->world, .t = dt, .salt = 500});
    }
    run_one(E, "barrier", (job){.kind = COMM_BARRIER, .c = E->world});
}

/* Every topology group at once: post one operation on each kind (tp and dp interleaved with
 * the others), then wait in posting order, then check every result. */
static void case_topology_groups_interleaved(env *E, const int grid[5]) {
    topo_grid g;
    ust_topology T;
    ust_err e;
    char name[96], why[512] = "";
    snprintf(name, sizeof name, "topology_groups_interleaved_dp%d_tp%d_pp%d_cp%d_ep%d", grid[0],
             grid[1], grid[2], grid[3], grid[4]);
    if (topo_grid_init(&g, grid[0], grid[1], grid[2], grid[3], grid[4], E->boot.world, &e) ||
        topo_connect(&T, &g, E->ctx, E->boot.rank, &e)) {
        report(E, name, 1, e.msg);
        return;
    }
    job J[2 * TOPO_NKINDS];
    int nj = 0;
    for (int round = 0; round < 2; round++)
        for (int k = 0; k < TOPO_NKINDS; k++) {
            static const comm_kind kinds[TOPO_NKINDS] = {
                COMM_ALLREDUCE,      COMM_ALLGATHER, COMM_ALLREDUCE, COMM_SENDRECV,
                COMM_REDUCE_SCATTER, COMM_ALLTOALL,  COMM_ALLREDUCE, COMM_BROADCAST,
                COMM_ALLGATHER,      COMM_ALLTOALL,  COMM_SENDRECV,  COMM_ALLREDUCE};
            comm_kind kk = round ? kinds[(k + 3) % TOPO_NKINDS] : kinds[k];
            J[nj] = (job){.kind = kk,
                          .c = T.comm[k],
                          .t = round ? COMM_BF16 : COMM_FP32,
                          .count = 3000 + (size_t)k * 11,
                          .salt = k + 10 * round,
                          .root = comm_size(T.comm[k]) - 1,
                          .inplace = kk == COMM_ALLTOALL};
            job_post(&J[nj++]);
        }
    int bad = 0;
    for (int i = 0; i < nj; i++) comm_wait(&J[i].req);
    for (int i = 0; i < nj; i++) {
        if (!bad && job_verify(&J[i], why, sizeof why)) bad = 1;
        job_free(&J[i]);
    }
    report(E, name, bad, why);
    topo_disconnect(&T);
}

/* Counters: a known sequence on a fresh communicator, against the formulas of comm.h. */
static void case_byte_counters(env *E) {
    ust_comm *c = E->world;
    int n = comm_size(c), me = comm_rank(c);
    comm_reset_counters(c);
    const size_t N = 1200; /* elements */
    float *a = xalloc(N * 4 * (size_t)n), *b = xalloc(N * 4 * (size_t)n);
    memset(a, 0, N * 4 * (size_t)n);
    comm_req r[6];
    r[0] = comm_allreduce(c, a, b, N, COMM_FP32, COMM_SUM);
    r[1] = comm_allreduce(c, a, b, N, COMM_BF16, COMM_AVG);
    r[2] = comm_allgather(c, a, b, N, COMM_FP32);
    r[3] = comm_reduce_scatter(c, a, b, N, COMM_FP32, COMM_SUM);
    r[4] = comm_broadcast(c, a, N, COMM_FP32, 0);
    r[5] = comm_alltoall(c, a, b, N, COMM_FP32);
    comm_wait_all(r, 6);
    const comm_counters *k = comm_get_counters(c);
    uint64_t B = N * 4, un = (uint64_t)n;
    /* Ring all-reduce sends 2(n-1)/n of the buffer; fp32 + bf16 buffers of N elements. */
    uint64_t want[COMM_NKINDS] = {
        [COMM_ALLREDUCE] = 2 * (un - 1) * B / un + 2 * (un - 1) * (N * 2) / un,
        [COMM_ALLGATHER] = (un - 1) * B,
        [COMM_REDUCE_SCATTER] = (un - 1) * B,
        [COMM_BROADCAST] = me == 0 && n > 1 ? B : 0,
        [COMM_ALLTOALL] = (un - 1) * B,
    };
    char why[256] = "";
    int bad = 0;
    for (int i = 0; i < COMM_NKINDS && !bad; i++)
        if (k->bytes[i] != want[i]) {
            snprintf(why, sizeof why, "%s: %llu bytes counted, analytic %llu",
                     comm_kind_name((comm_kind)i), (unsigned long long)k->bytes[i],
                     (unsigned long long)want[i]);
            bad = 1;
        }
    if (!bad && (k->calls[COMM_ALLREDUCE] != 2 || k->calls[COMM_ALLTOALL] != 1))
        bad = 1, snprintf(why, sizeof why, "call counts wrong");
    free(a), free(b);
    report(E, "byte_counters_equal_analytic_values", bad, why);
}

/* Communication time is counted where the rank waits: ranks that reach a barrier 0.3 s before
 * the last one count at least that long in the group's wait_s (a lower bound: a loaded machine
 * only adds to it), and reset clears it. */
static void case_wait_seconds_counted_per_group(env *E) {
    ust_comm *c = E->world;
    int n = comm_size(c), me = comm_rank(c);
    comm_reset_counters(c);
    double before = comm_get_counters(c)->wait_s;
    if (me == n - 1) {
        struct timespec ts = {0, 300 * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    struct timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    comm_req r = comm_barrier(c);
    comm_wait(&r);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    double waited = comm_get_counters(c)->wait_s - before;
    double cpu = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
    char why[256] = "";
    int bad = before != 0 || (n > 1 && me != n - 1 && waited < 0.25);
    if (bad)
        snprintf(why, sizeof why,
                 "rank %d counted %.3f s (before %.3f) waiting for a 0.3 s late rank", me, waited,
                 before);
    report(E, "wait_seconds_counted_per_group", bad, why);
    /* The spin (enough cores) and the yield poll (more ranks than cores) are bounded: a rank
     * waiting 0.3 s for a late peer sleeps for nearly all of it. A poll that never backed off
     * would use the CPU's share of those 0.3 s (at least ~0.04 s even with 8 ranks and other
     * jobs on 2 cores); the bounded one uses well under a millisecond, plus a few wake-ups. */
    bad = !g_dev && me != n - 1 && cpu > 0.02; /* NCCL waits are the GPU stream's */
    snprintf(why, sizeof why, "rank %d used %.3f s of CPU waiting %.3f s for a late rank", me, cpu,
             waited);
    report(E, "waiting_backs_off_to_sleep", bad, bad ? why : "");
}

/* Several operations posted on one communicator complete in order when only the last is
 * waited on. */
static void case_wait_last_completes_earlier(env *E) {
    ust_comm *c = E->world;
    job J[5];
    for (int i = 0; i < 5; i++) {
        J[i] = (job){.kind = i % 2 ? COMM_ALLGATHER : COMM_ALLREDUCE,
                     .c = c,
                     .t = COMM_FP32,
                     .count = 777 + (size_t)i,
                     .salt = i};
        job_post(&J[i]);
    }
    comm_wait(&J[4].req);
    char why[512] = "";
    int bad = 0;
    for (int i = 0; i < 5; i++) {
        comm_wait(&J[i].req); /* already complete: returns at once */
        if (!bad && job_verify(&J[i], why, sizeof why)) bad = 1;
        job_free(&J[i]);
    }
    report(E, "wait_on_last_completes_all_earlier_on_same_comm", bad, why);
}

static int child_main(void) {
    env E = {.out = stdout};
    ust_err e;
    if (boot_init(&E.boot, 30, &e)) {
        fprintf(stderr, "boot_init: %s\n", e.msg);
        return 2;
    }
    const char *mode = getenv("UST_TEST_MODE");
    double timeout = mode ? 3 : 60;
    comm_opts o = {.backend = COMM_BACKEND_SHM, .timeout_s = timeout};
    if (getenv("UST_TEST_BACKEND") && !strcmp(getenv("UST_TEST_BACKEND"), "nccl"))
        o.backend = COMM_BACKEND_NCCL, g_dev = 1;
    if (getenv("UST_TEST_SLOT")) o.shm_slot_bytes = (size_t)atol(getenv("UST_TEST_SLOT"));
    if (getenv("UST_TEST_CHAN")) o.shm_chan_bytes = (size_t)atol(getenv("UST_TEST_CHAN"));
    if (comm_ctx_init(&E.ctx, &E.boot, &o, &e)) {
        fprintf(stderr, "comm_ctx_init: %s\n", e.msg);
        return 2;
    }
    int *all = xalloc(sizeof(int) * (size_t)E.boot.world);
    for (int i = 0; i < E.boot.world; i++) all[i] = i;
    comm_group_spec ws = {"world", all, E.boot.world};
    if (comm_create_many(E.ctx, 1, &ws, &E.world, &e)) {
        fprintf(stderr, "comm_create_many: %s\n", e.msg);
        return 2;
    }
    if (mode) { /* fault cases: the last rank dies or stalls before an all-reduce */
        float x[4] = {0};
        if (E.boot.rank == E.boot.world - 1) {
            if (!strcmp(mode, "die")) _exit(9);
            sleep(6); /* "never arrives" (within the others' 3 s timeout) */
            _exit(0);
        }
        float *buf = x; /* NCCL needs device memory */
#ifdef UST_NCCL
        if (g_dev && cudaMalloc((void **)&buf, sizeof x) != cudaSuccess) abort();
#endif
        comm_req r = comm_allreduce(E.world, buf, buf, 4, COMM_FP32, COMM_SUM);
        comm_wait(&r);
#ifdef UST_NCCL
        /* NCCL's wait only makes the compute stream wait: the host blocks on the result later,
         * as a trainer's next read of the device does, and the deadline thread ends it there */
        if (g_dev) cudaDeviceSynchronize();
        /* released by the deadline thread's abort: its report is written by now, and the next
         * call is refused (or, with UST_TEST_STALL_EXIT, the exit parks) until it ends the
         * process; the peer's death may also have ended the operation first (an NCCL error) */
        fprintf(stderr, "stall child: the device sync returned\n");
        if (getenv("UST_TEST_STALL_EXIT")) return 0;
        r = comm_allreduce(E.world, buf, buf, 4, COMM_FP32, COMM_SUM);
        comm_wait(&r);
#endif
        return 0; /* not reached: the wait (or the deadline thread) exits */
    }
    case_world_collectives(&E);
    if (!g_dev) case_byte_counters(&E); /* uses host buffers; counting is backend-independent */
    case_wait_last_completes_earlier(&E);
    case_wait_seconds_counted_per_group(&E);
    static const int grids[][5] = {/* dp tp pp cp ep, by world size */
                                   [1] = {1, 1, 1, 1, 1},
                                   [2] = {1, 2, 1, 1, 1},
                                   [3] = {3, 1, 1, 1, 3},
                                   [4] = {2, 2, 1, 1, 2},
                                   [8] = {2, 2, 2, 1, 2}};
    if (E.boot.world < 9 && grids[E.boot.world][0])
        case_topology_groups_interleaved(&E, grids[E.boot.world]);
    if (E.boot.world == 8) case_topology_groups_interleaved(&E, (int[]){2, 1, 2, 2, 2});
    if (E.boot.world == 4) case_topology_groups_interleaved(&E, (int[]){1, 1, 2, 2, 1});
    comm_ctx_free(E.ctx);
    boot_finalize(&E.boot);
    free(all);
    return E.nbad ? 1 : 0;
}

/* ---------------------------------------------------------------- driver */

static int free_port(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) ||
        getsockname(s, (struct sockaddr *)&a, &l))
        return 29500 + (int)(getpid() % 1000);
    close(s);
    return ntohs(a.sin_port);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    int rc[16];
    char dir[64];
    double secs;
} spawn_result;

/* Starts W ranks of this program with the torchrun-style environment plus `extra` variables
 * ("K=V" strings), waits up to limit_s, kills the rest after that. */
static void spawn(int W, const char *const *extra, double limit_s, spawn_result *res) {
    char self[512];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = 0;
    snprintf(res->dir, sizeof res->dir, "/tmp/ust-test-comm.XXXXXX");
    if (!mkdtemp(res->dir)) abort();
    int port = free_port();
    pid_t pids[16];
    double t0 = now();
    for (int r = 0; r < W; r++) {
        pid_t p = fork();
        if (p == 0) {
            char path[128], v[32];
            snprintf(path, sizeof path, "%s/rank%d.out", res->dir, r);
            int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            dup2(fd, 1), dup2(fd, 2), close(fd);
            /* Drop an outer launcher's variables (as scripts/ustrun does), so the ranks meet
             * through the environment below and not through the outer job. */
            static const char *outer[] = {"PMIX_", "PMI_", "OMPI_", "SLURM_", "MPI_LOCAL"};
            for (int again = 1; again;) {
                again = 0;
                for (char **ev = environ; *ev && !again; ev++)
                    for (size_t k = 0; k < sizeof outer / sizeof *outer && !again; k++)
                        if (!strncmp(*ev, outer[k], strlen(outer[k]))) {
                            char name[256];
                            size_t nl = strcspn(*ev, "=");
                            snprintf(name, sizeof name, "%.*s", (int)nl, *ev);
                            unsetenv(name);
                            again = 1;
                        }
            }
            snprintf(v, sizeof v, "%d", r), setenv("RANK", v, 1), setenv("LOCAL_RANK", v, 1);
            snprintf(v, sizeof v, "%d", W), setenv("WORLD_SIZE", v, 1);
            setenv("LOCAL_WORLD_SIZE", v, 1);
            snprintf(v, sizeof v, "%d", port), setenv("MASTER_PORT", v, 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            for (int i = 0; extra && extra[i]; i++) putenv((char *)extra[i]);
            execl(self, self, (char *)NULL);
            _exit(127);
        }
        pids[r] = p;
        res->rc[r] = -1;
    }
    int left = W;
    while (left) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            for (int r = 0; r < W; r++)
                if (pids[r] == p) res->rc[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            left--;
            continue;
        }
        if (now() - t0 > limit_s)
            for (int r = 0; r < W; r++)
                if (res->rc[r] == -1) kill(pids[r], SIGKILL);
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    res->secs = now() - t0;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return calloc(1, 1);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = xalloc((size_t)n + 1);
    s[fread(s, 1, (size_t)n, f)] = 0;
    fclose(f);
    return s;
}

static void cleanup_dir(const spawn_result *res, int W) {
    char path[128];
    for (int r = 0; r < W; r++) {
        snprintf(path, sizeof path, "%s/rank%d.out", res->dir, r);
        unlink(path);
    }
    rmdir(res->dir);
}

/* One PASS/FAIL line per case: rank 0's list of cases, each ok on every rank. */
static void report_world(int W, const char *tag, const spawn_result *res) {
    char path[128], **out = xalloc(sizeof(char *) * (size_t)W);
    for (int r = 0; r < W; r++) {
        snprintf(path, sizeof path, "%s/rank%d.out", res->dir, r);
        out[r] = slurp(path);
    }
    int ncases = 0;
    for (char *line = out[0]; *line;) {
        char *end = strchr(line, '\n');
        if (!end) break;
        *end = 0;
        if (!strncmp(line, "ok ", 3) || !strncmp(line, "bad ", 4)) {
            const char *cname = line + (line[0] == 'o' ? 3 : 4);
            char cn[160];
            snprintf(cn, sizeof cn, "%s", cname);
            char *colon = strchr(cn, ':');
            if (colon) *colon = 0;
            const char *failwhy = NULL;
            int failrank = -1;
            for (int r = 0; r < W && !failwhy; r++) {
                char pat[200];
                snprintf(pat, sizeof pat, "ok %s\n", cn);
                char patb[200];
                snprintf(patb, sizeof patb, "bad %s:", cn);
                char *hit = r ? strstr(out[r], pat) : (line[0] == 'o' ? line : NULL);
                if (!hit) {
                    failrank = r;
                    char *b = r ? strstr(out[r], patb) : line;
                    failwhy = b ? b : "no report (rank died or hung)";
                }
            }
            ncases++;
            if (failwhy)
                printf("FAIL comm_w%d%s_%s: rank %d: %.300s\n", W, tag, cn, failrank, failwhy),
                    t_nfail++;
            else
                printf("PASS comm_w%d%s_%s\n", W, tag, cn), t_npass++;
        }
        line = end + 1;
    }
    int crashed = 0;
    for (int r = 0; r < W; r++) crashed |= res->rc[r] != 0;
    if (crashed || ncases == 0) {
        printf("FAIL comm_w%d%s_ranks_exit_cleanly: exit codes", W, tag);
        for (int r = 0; r < W; r++) printf(" %d", res->rc[r]);
        snprintf(path, sizeof path, "%s/rank0.out", res->dir);
        char *whole = slurp(path); /* out[0] was cut into lines above */
        size_t wl = strlen(whole);
        printf("; rank 0 output tail: %.400s\n", whole + (wl > 400 ? wl - 400 : 0));
        free(whole);
        t_nfail++;
    } else {
        printf("PASS comm_w%d%s_ranks_exit_cleanly (%.1f s)\n", W, tag, res->secs);
        t_npass++;
    }
    fflush(stdout);
    for (int r = 0; r < W; r++) free(out[r]);
    free(out);
}

static void run_world(int W, const char *tag, const char *const *extra) {
    spawn_result res;
    spawn(W, extra, 90, &res);
    report_world(W, tag, &res);
    cleanup_dir(&res, W);
}

/* A rank that dies (or never arrives) mid-collective: the others exit non-zero within the
 * timeout (3 s here) with a message naming the operation, group and the missing rank. */
/* backend: NULL for shm, or an extra environment entry (UST_TEST_BACKEND=nccl, UST_COMM_GLOO=all).
 * NCCL cannot tell which peer is missing, and gloo on one host sees every peer at one address,
 * so rank 0 names every member it waited for. */
static void fault_case(const char *mode, const char *want, const char *backend) {
    const char *extra[] = {mode[0] == 'd' ? "UST_TEST_MODE=die" : "UST_TEST_MODE=stall", backend,
                           NULL};
    spawn_result res;
    spawn(3, extra, 20, &res);
    char path[128];
    snprintf(path, sizeof path, "%s/rank0.out", res.dir);
    char *o = slurp(path);
    char name[80];
    snprintf(name, sizeof name, "comm_w3%s_rank_that_%s_mid_allreduce_ends_the_others",
             !backend                  ? ""
             : strstr(backend, "GLOO") ? "_gloo"
                                       : "_nccl",
             mode);
    if (res.rc[0] != 1 || res.rc[1] != 1 || !strstr(o, want) || !strstr(o, "all_reduce") ||
        !strstr(o, "'world'") || !strstr(o, backend ? "ranks 1, 2" : "rank 2") || res.secs > 15) {
        printf("FAIL %s: exit codes %d %d %d after %.1f s; rank 0 said: %.400s\n", name, res.rc[0],
               res.rc[1], res.rc[2], res.secs, o);
        t_nfail++;
    } else {
        printf("PASS %s (%.1f s)\n", name, res.secs);
        t_npass++;
    }
    fflush(stdout);
    free(o);
    cleanup_dir(&res, 3);
}

/* The deadline thread's end of the process with its windows held open (it pauses 0.5 s before
 * and after the abort that releases the main thread): rank 0's main thread returns from its device
 * sync only after the report ("timed out"), and then its next NCCL call is refused, or (exit_after)
 * its exit() parks, until the deadline thread ends the process with exit code 1; never a signal,
 * never the main thread's own exit code. */
static void nccl_race_case(int exit_after) {
    const char *extra[] = {"UST_TEST_MODE=stall", "UST_TEST_BACKEND=nccl",
                           "UST_FAULT_NCCL_DOG_PAUSE_MS=500",
                           exit_after ? "UST_TEST_STALL_EXIT=1" : NULL, NULL};
    spawn_result res;
    spawn(3, extra, 20, &res);
    char path[128];
    snprintf(path, sizeof path, "%s/rank0.out", res.dir);
    char *o = slurp(path);
    const char *report = strstr(o, "timed out"), *back = strstr(o, "the device sync returned");
    const char *name = exit_after ? "comm_w3_nccl_deadline_thread_ends_the_process_beside_exit"
                                  : "comm_w3_nccl_deadline_thread_refuses_calls_after_its_abort";
    int ok = res.rc[0] == 1 && res.rc[1] == 1 && report && back && report < back &&
             (exit_after || strstr(back, "all_reduce on group 'world' refused"));
    if (!ok) {
        printf("FAIL %s: exit codes %d %d %d; report %s the main thread's return; rank 0 said: "
               "%.600s\n",
               name, res.rc[0], res.rc[1], res.rc[2],
               !report || !back ? "or return missing"
               : report < back  ? "before"
                                : "after",
               o);
        t_nfail++;
    } else {
        printf("PASS %s (%.1f s)\n", name, res.secs);
        t_npass++;
    }
    fflush(stdout);
    free(o);
    cleanup_dir(&res, 3);
}

/* Gloo, on this host: two ranks that the bootstrap places on two nodes (one local rank each), so
 * comm gives their groups to gloo, and four ranks on one node with UST_COMM_GLOO=all; every case
 * of the shm backend, then a rank that dies or stalls. test/sh/multinode*.sh runs gloo across
 * network namespaces. */
static void gloo_cases(void) {
    if (!comm_gloo_available()) {
        printf("SKIP gloo: not compiled in (no gloo/context.h at build time)\n");
        return;
    }
    static const char *two_nodes[] = {"LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", NULL};
    static const char *all[] = {"UST_COMM_GLOO=all", NULL};
    run_world(2, "_gloo_2_nodes", two_nodes);
    run_world(4, "_gloo", all);
    fault_case("dies", "gloo", "UST_COMM_GLOO=all");
    fault_case("stalls", "timed out", "UST_COMM_GLOO=all");
}

/* Two ranks that the bootstrap places on two nodes (one local rank each): without gloo, the shm
 * backend refuses with a message instead of failing later. */
static void multinode_case(void) {
    if (comm_gloo_available()) return; /* gloo_cases runs them */
    static const char *extra[] = {"LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", NULL};
    spawn_result res;
    spawn(2, extra, 20, &res);
    char path[128];
    snprintf(path, sizeof path, "%s/rank0.out", res.dir);
    char *o = slurp(path);
    if (res.rc[0] != 2 || res.rc[1] != 2 || !strstr(o, "one node") || !strstr(o, "2 nodes"))
        printf("FAIL comm_w2_shm_refuses_a_job_on_two_nodes: exit codes %d %d; rank 0 said: "
               "%.400s\n",
               res.rc[0], res.rc[1], o),
            t_nfail++;
    else
        printf("PASS comm_w2_shm_refuses_a_job_on_two_nodes\n"), t_npass++;
    free(o);
    cleanup_dir(&res, 2);
}

static void test_world_size_1_single_process(void) {
    env E = {0};
    char *buf = NULL;
    size_t len = 0;
    E.out = open_memstream(&buf, &len);
    ust_err e;
    CHECK(boot_init(&E.boot, 10, &e) == 0, "boot_init: %.900s", e.msg);
    comm_opts o = {.backend = COMM_BACKEND_SHM, .timeout_s = 10};
    CHECK(comm_ctx_init(&E.ctx, &E.boot, &o, &e) == 0, "%.900s", e.msg);
    int zero = 0;
    comm_group_spec ws = {"world", &zero, 1};
    CHECK(comm_create_many(E.ctx, 1, &ws, &E.world, &e) == 0, "%.900s", e.msg);
    case_world_collectives(&E);
    case_byte_counters(&E);
    case_topology_groups_interleaved(&E, (int[]){1, 1, 1, 1, 1});
    comm_ctx_free(E.ctx);
    boot_finalize(&E.boot);
    fclose(E.out);
    char *bad = strstr(buf, "bad ");
    CHECK(!bad, "%.900s", bad ? bad : "");
    CHECK(strstr(buf, "ok allreduce_fp32_sum_786435"), "cases did not run: %.200s", buf);
    free(buf);
}

/* NCCL: world 1 in this process, and every GPU of the machine (up to 8) as one rank each.
 * Without a GPU (or without NCCL at build time) it says so on a SKIP line, not PASS. */
static void nccl_cases(void) {
    if (!comm_backend_available(COMM_BACKEND_NCCL)) {
        printf("SKIP nccl: not compiled in (no nccl.h at build time)\n");
        return;
    }
    int ngpu = 0;
#ifdef UST_NCCL
    ust_err le;
    if (nccl_api_load(&le) != 0)
        printf("nccl: %s\n", le.msg);
    else if (cudaGetDeviceCount(&ngpu) != cudaSuccess)
        ngpu = 0;
#endif
    if (ngpu == 0) {
        printf("SKIP nccl: no GPU\n");
        return;
    }
    env E = {0};
    char *buf = NULL;
    size_t len = 0;
    ust_err e;
    E.out = open_memstream(&buf, &len);
    g_dev = 1;
    int zero = 0;
    comm_opts o = {.backend = COMM_BACKEND_NCCL, .timeout_s = 60};
    comm_group_spec ws = {"world", &zero, 1};
    if (boot_init(&E.boot, 10, &e) || comm_ctx_init(&E.ctx, &E.boot, &o, &e) ||
        comm_create_many(E.ctx, 1, &ws, &E.world, &e)) {
        printf("FAIL comm_nccl_w1_setup: %.900s\n", e.msg), t_nfail++;
    } else {
        case_world_collectives(&E);
        case_wait_last_completes_earlier(&E);
        case_topology_groups_interleaved(&E, (int[]){1, 1, 1, 1, 1});
        comm_ctx_free(E.ctx);
        boot_finalize(&E.boot);
        fclose(E.out);
        E.out = NULL;
        for (char *line = buf; line && *line;) {
            char *end = strchr(line, '\n');
            if (end) *end = 0;
            if (!strncmp(line, "ok ", 3)) printf("PASS comm_nccl_w1_%s\n", line + 3), t_npass++;
            if (!strncmp(line, "bad ", 4)) printf("FAIL comm_nccl_w1_%s\n", line + 4), t_nfail++;
            line = end ? end + 1 : NULL;
        }
    }
    if (E.out) fclose(E.out);
    free(buf);
    g_dev = 0;
    if (ngpu >= 2) {
        static const char *nccl_env[] = {"UST_TEST_BACKEND=nccl", NULL};
        run_world(ngpu > 8 ? 8 : ngpu, "_nccl", nccl_env);
        /* a stalled peer: the others' NCCL wait reaches the deadline, aborts the communicator
         * and names the group and the members it waited for */
        if (ngpu >= 3) fault_case("stalls", "timed out", "UST_TEST_BACKEND=nccl");
        if (ngpu >= 3) nccl_race_case(0);
        if (ngpu >= 3) nccl_race_case(1);
    } else {
        printf("SKIP nccl: one GPU, so no multi-rank NCCL cases (NCCL needs a GPU per rank)\n");
    }
    fflush(stdout);
}

/* The shm backend's liveness check of a peer: running (with its start time) is alive; a zombie,
 * a reaped process, and a pid whose start time differs (reused by another process) are not. */
static void test_shm_liveness_sees_zombies_exits_and_reused_pids(void) {
    uint64_t me = shm_proc_start(getpid());
    CHECK(me != 0, "no start time for this process from /proc");
    CHECK(!shm_proc_gone(getpid(), me), "this process counted as gone: %s",
          shm_proc_gone(getpid(), me));
    CHECK(!shm_proc_gone(getpid(), 0), "this process (start unknown) counted as gone");
    const char *reused = shm_proc_gone(getpid(), me + 1);
    CHECK(reused && strstr(reused, "another process"), "pid with another start time: %s",
          reused ? reused : "alive");
    pid_t child = fork();
    if (child == 0) _exit(0);
    CHECK(child > 0, "fork: %s", strerror(errno));
    const char *z = NULL;
    for (int i = 0; i < 2000 && !(z = shm_proc_gone(child, 0)); i++) { /* until it has exited */
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    int st;
    const char *after = (waitpid(child, &st, 0), shm_proc_gone(child, 0));
    CHECK(z && strstr(z, "zombie"), "unreaped child: %s", z ? z : "alive after 10 s");
    CHECK(after && strstr(after, "exited"), "reaped child: %s", after ? after : "alive");
}

int main(void) {
    if (getenv("RANK")) return child_main();
    signal(SIGPIPE, SIG_IGN);
    if (getenv("UST_TEST_ONLY_GLOO")) { /* only the gloo backend's cases */
        gloo_cases();
        return TEST_SUMMARY();
    }
    if (getenv("UST_TEST_ONLY_NCCL")) { /* the GPU checks: only the NCCL backend's cases */
        nccl_cases();
        return TEST_SUMMARY();
    }
    RUN_TEST(test_world_size_1_single_process);
    RUN_TEST(test_shm_liveness_sees_zombies_exits_and_reused_pids);
    static const char *small[] = {"UST_TEST_SLOT=4096", "UST_TEST_CHAN=1024", NULL};
    static const char *dflt[] = {NULL};
    run_world(2, "", small);
    run_world(2, "_default_sizes", dflt);
    run_world(3, "", small);
    run_world(4, "", small);
    run_world(8, "", small);
    fault_case("dies", "has died", NULL);
    fault_case("stalls", "timed out", NULL);
    multinode_case();
    gloo_cases();
    nccl_cases();
    return TEST_SUMMARY();
}
