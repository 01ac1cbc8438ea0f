/* ustrain bench comm: like nccl-tests, under any launcher. For all-reduce, all-gather,
 * reduce-scatter and all-to-all on the world communicator, from --min-bytes to --max-bytes
 * (doubling), it checks the result of the first and the last iteration against the serial
 * formula, and prints time, algorithm bandwidth (bytes / time) and bus bandwidth (nccl-tests:
 * all-reduce 2(n-1)/n, the others (n-1)/n times algbw), the latter also as a fraction of this
 * machine's single-thread memcpy bandwidth. Any wrong element: a message and exit 1. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bootstrap.h"
#include "log.h"
#include "cmd.h"
#include "comm.h"
#include "error.h"

#ifdef UST_NCCL
#include "nccl_api.h" /* cudaMalloc & co. from the table the NCCL context loaded */
#endif

typedef struct {
    comm_backend backend;
    void *dsend, *drecv; /* device buffers (NCCL) or the host buffers themselves */
    float *hsend, *hrecv;
} bufs;

/* Single-thread memcpy bandwidth (bytes/s, counting the bytes copied once), best of 5 copies of
 * 64 MiB: the yardstick for the shared-memory backend, which is bound by memory copies. */
static double memcpy_bw(void) {
    size_t n = 64u << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) return 0;
    memset(a, 1, n), memset(b, 2, n);
    double best = 1e30;
    for (int i = 0; i < 5; i++) {
        double t = log_now_s();
        memcpy(b, a, n);
        t = log_now_s() - t;
        best = t < best ? t : best;
        a[i] = b[n - 1 - i]; /* keep the copies observable */
    }
    free(a), free(b);
    return (double)n / best;
}

static float val(int r, size_t i) { return (float)((int)(((size_t)r * 131u + i * 7u) % 17u) - 8); }

static void *dev_alloc(comm_backend be, size_t bytes, float *host) {
#ifdef UST_NCCL
    if (be == COMM_BACKEND_NCCL) {
        void *p = NULL;
        if (cudaMalloc(&p, bytes ? bytes : 4) != cudaSuccess)
            ust_fatal(UST_EXIT_RUNTIME, "bench comm: cudaMalloc of %zu bytes failed", bytes);
        return p;
    }
#endif
    (void)be, (void)bytes;
    return host;
}

static void to_dev(const bufs *b, size_t bytes) {
#ifdef UST_NCCL
    if (b->backend == COMM_BACKEND_NCCL) {
        cudaMemcpy(b->dsend, b->hsend, bytes, cudaMemcpyHostToDevice);
        cudaMemset(b->drecv, 0, bytes);
        return;
    }
#endif
    (void)b, (void)bytes;
}

static void to_host(const bufs *b, size_t bytes) {
#ifdef UST_NCCL
    if (b->backend == COMM_BACKEND_NCCL) {
        cudaMemcpy(b->hrecv, b->drecv, bytes, cudaMemcpyDeviceToHost);
        return;
    }
#endif
    (void)b, (void)bytes;
}

static comm_req post(ust_comm *w, comm_kind k, const bufs *b, size_t count) {
    switch (k) {
    case COMM_ALLREDUCE:
        return comm_allreduce(w, b->dsend, b->drecv, count, COMM_FP32, COMM_SUM);
    case COMM_ALLGATHER:
        return comm_allgather(w, b->dsend, b->drecv, count, COMM_FP32);
    case COMM_REDUCE_SCATTER:
        return comm_reduce_scatter(w, b->dsend, b->drecv, count, COMM_FP32, COMM_SUM);
    default:
        return comm_alltoall(w, b->dsend, b->drecv, count, COMM_FP32);
    }
}

/* Returns the index of the first wrong element, or -1. count: per-rank count of the op. */
static long verify(ust_comm *w, comm_kind k, const float *out, size_t count, float *want_out) {
    int n = comm_size(w), me = comm_rank(w);
    size_t total = k == COMM_ALLREDUCE || k == COMM_REDUCE_SCATTER ? count : (size_t)n * count;
    for (size_t i = 0; i < total; i++) {
        float want = 0;
        if (k == COMM_ALLREDUCE || k == COMM_REDUCE_SCATTER) {
            size_t idx = k == COMM_ALLREDUCE ? i : (size_t)me * count + i;
            for (int j = 0; j < n; j++) want += val(j, idx);
        } else if (k == COMM_ALLGATHER) {
            want = val((int)(i / count), i % count);
        } else { /* all-to-all: block j came from member j, its block `me` */
            want = val((int)(i / count), (size_t)me * count + i % count);
        }
        if (out[i] != want) {
            *want_out = want;
            return (long)i;
        }
    }
    return -1;
}

static const char *COMM_USAGE =
    "usage: ustrain bench comm [--min-bytes B] [--max-bytes B] [--iters N] [--backend shm|nccl]\n"
    "                          [--timeout S]\n"
    "  checks and times all-reduce, all-gather, reduce-scatter and all-to-all on the world of the\n"
    "  launcher (scripts/ustrun, srun, mpirun), from --min-bytes to --max-bytes, doubling.\n"
    "  B: bytes with an optional K/M/G/T (KiB..TiB) or KB..TB suffix, 4 to 64 GiB (defaults 4K\n"
    "  and 64M); --iters 1..1000000 (default: by size); --timeout 0 < S <= 86400 s (default 300)\n";

/* The comm bench's options into its settings; 0, or the usage error's exit code. */
static int parse_args(int argc, char **argv, size_t *minb, size_t *maxb, int *iters,
                      double *timeout, comm_backend *be) {
    const cmd_who who = {"ustrain: bench comm", COMM_USAGE};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d;
        long long n;
        int rc = 0;
        if (strcmp(a, "--min-bytes") && strcmp(a, "--max-bytes") && strcmp(a, "--iters") &&
            strcmp(a, "--timeout") && strcmp(a, "--backend"))
            return cmd_usage_error(who.who, COMM_USAGE, "bad argument '%s'", a);
        if (!v) return cmd_usage_error(who.who, COMM_USAGE, "%s needs a value", a);
        i++;
        if (!strcmp(a, "--min-bytes") || !strcmp(a, "--max-bytes")) {
            if ((rc = cmd_size_opt(&who, a, v, 4, 0x1p36, &d)) == 0)
                *(strcmp(a, "--min-bytes") ? maxb : minb) = (size_t)d;
        } else if (!strcmp(a, "--iters")) {
            if ((rc = cmd_int_opt(&who, a, v, 1, 1000000, &n)) == 0) *iters = (int)n;
        } else if (!strcmp(a, "--timeout")) {
            rc = cmd_num_opt(&who, a, v, 0, 86400, CMD_LO_OPEN, timeout);
        } else if (strcmp(v, "shm") && strcmp(v, "nccl")) {
            return cmd_usage_error(who.who, COMM_USAGE, "--backend %s: expected shm or nccl", v);
        } else {
            *be = strcmp(v, "nccl") ? COMM_BACKEND_SHM : COMM_BACKEND_NCCL;
        }
        if (rc) return rc;
    }
    return 0;
}

/* What every step of the bench needs: the world communicator, its buffers, the settings. */
typedef struct {
    ust_comm *w;
    comm_backend be;
    bufs b;
    size_t cap; /* floats in each host buffer */
    int W, me, iters_opt;
    float mbw; /* rank 0's memcpy bandwidth (0 elsewhere) */
} bench;

/* Bootstrap, the communicator context and the world group; 0, or the exit code (the bootstrap
 * and context errors are the user's: a launcher or setting that does not fit). */
static int open_world(ust_boot *boot, comm_ctx **ctx, bench *bn, double timeout, int **all) {
    ust_err e;
    if (boot_init(boot, timeout, &e)) {
        fprintf(stderr, "ustrain: error: %s\n", e.msg);
        return UST_EXIT_USAGE;
    }
    comm_opts o = {.backend = bn->be, .timeout_s = timeout};
    if (comm_ctx_init(ctx, boot, &o, &e)) {
        fprintf(stderr, "ustrain: error: %s\n", e.msg);
        return UST_EXIT_USAGE;
    }
    bn->W = boot->world, bn->me = boot->rank;
    *all = malloc(sizeof(int) * (size_t)bn->W);
    for (int i = 0; i < bn->W; i++) (*all)[i] = i;
    comm_group_spec spec = {"world", *all, bn->W};
    if (comm_create_many(*ctx, 1, &spec, &bn->w, &e)) ust_fatal(UST_EXIT_RUNTIME, "%s", e.msg);
    return 0;
}

static void alloc_bufs(bench *bn, size_t maxb) {
    bn->cap = maxb / 4 + (size_t)bn->W;
    bn->b = (bufs){.backend = bn->be};
    bn->b.hsend = malloc(bn->cap * 4), bn->b.hrecv = malloc(bn->cap * 4);
    if (!bn->b.hsend || !bn->b.hrecv) ust_fatal(UST_EXIT_RUNTIME, "bench comm: out of memory");
    bn->b.dsend = dev_alloc(bn->be, bn->cap * 4, bn->b.hsend);
    bn->b.drecv = dev_alloc(bn->be, bn->cap * 4, bn->b.hrecv);
}

/* Warm-up outside the measurements: the first touches of the staging memory and the first
 * wake-ups of every rank should not land in the first size's time. */
static void warm_up(bench *bn) {
    for (size_t i = 0; i < bn->cap; i++) bn->b.hsend[i] = 0;
    to_dev(&bn->b, bn->cap * 4);
    /* Many small ones last: after the large ones the ranks take a few hundred operations to
     * fall back into step (their adaptive spins shrank while the large rounds were uneven). */
    for (int i = 0; i < 400; i++) {
        comm_req q = comm_allreduce(bn->w, bn->b.dsend, bn->b.drecv,
                                    i < 2 ? bn->cap - (size_t)bn->W : 1024, COMM_FP32, COMM_SUM);
        comm_wait(&q);
    }
}

/* Mean seconds of one of `reps` back-to-back operations, timed from a barrier. */
static double time_reps(bench *bn, comm_kind k, size_t count, int reps) {
    comm_req bar = comm_barrier(bn->w);
    comm_wait(&bar);
    double t0 = log_now_s();
    for (int it = 0; it < reps; it++) {
        comm_req q = post(bn->w, k, &bn->b, count);
        comm_wait(&q);
    }
    return (log_now_s() - t0) / reps;
}

/* Checks this rank's result (outn floats); on a wrong element prints it and returns 1. */
static int check_result(bench *bn, comm_kind k, size_t bytes, size_t count, size_t outn) {
    to_host(&bn->b, outn * 4);
    float want = 0;
    long bad = verify(bn->w, k, bn->b.hrecv, count, &want);
    if (bad < 0) return 0;
    fprintf(stderr,
            "ustrain[rank %d]: error: bench comm: %s of %zu bytes: "
            "element %ld is %g, expected %g\n",
            bn->me, comm_kind_name(k), bytes, bad, (double)bn->b.hrecv[bad], (double)want);
    return 1;
}

/* The slowest rank's time defines the operation's time; *anywrong: some rank was wrong. */
static double slowest(bench *bn, double dt, int wrong, int *anywrong) {
    int W = bn->W;
    float mine[2] = {(float)dt, (float)wrong}, *every = malloc(sizeof(float) * 2 * W);
    void *dm = dev_alloc(bn->be, 8, mine), *de = dev_alloc(bn->be, 8 * (size_t)W, every);
#ifdef UST_NCCL
    if (bn->be == COMM_BACKEND_NCCL) cudaMemcpy(dm, mine, 8, cudaMemcpyHostToDevice);
#endif
    comm_req g = comm_allgather(bn->w, dm, de, 2, COMM_FP32);
    comm_wait(&g);
#ifdef UST_NCCL
    if (bn->be == COMM_BACKEND_NCCL) {
        cudaMemcpy(every, de, 8 * (size_t)W, cudaMemcpyDeviceToHost);
        cudaFree(dm), cudaFree(de);
    }
#endif
    double tmax = 0;
    *anywrong = 0;
    for (int j = 0; j < W; j++) {
        tmax = every[2 * j] > tmax ? every[2 * j] : tmax;
        *anywrong |= every[2 * j + 1] != 0;
    }
    free(every);
    return tmax;
}

static void print_row(const bench *bn, comm_kind k, size_t count, int iters, double tmax,
                      int anywrong) {
    int W = bn->W;
    double bytes_real = (double)(k == COMM_ALLREDUCE ? count : count * (size_t)W) * 4;
    double alg = bytes_real / tmax;
    double factor = k == COMM_ALLREDUCE ? 2.0 * (W - 1) / W : (double)(W - 1) / W;
    if (bn->me == 0)
        printf("%-15s %12.0f %12zu %6d %10.1f %10.3f %10.3f %9.3f%s\n", comm_kind_name(k),
               bytes_real, count, iters, tmax * 1e6, alg / 1e9, alg * factor / 1e9,
               bn->mbw > 0 ? alg * factor / bn->mbw : 0, anywrong ? "  WRONG" : "");
}

/* One operation at one size: fill, one checked warm-up, then 5 untimed and `iters` timed; the
 * last result is checked too. *wrong: set on any wrong result on this rank, so far (what the
 * rank reports to the others, size after size). */
static void bench_size(bench *bn, comm_kind k, size_t bytes, int *wrong) {
    /* bytes: the larger of the per-rank buffers (nccl-tests' "size"): the all-reduce
     * buffer, all-gather output, reduce-scatter input, all-to-all send buffer. */
    size_t W = (size_t)bn->W, total = bytes / 4, count = k == COMM_ALLREDUCE ? total : total / W;
    if (count == 0) return;
    size_t in = k == COMM_ALLREDUCE || k == COMM_ALLGATHER ? count : W * count;
    size_t outn = k == COMM_ALLREDUCE || k == COMM_REDUCE_SCATTER ? count : W * count;
    for (size_t i = 0; i < in; i++) bn->b.hsend[i] = val(bn->me, i);
    to_dev(&bn->b, (in > outn ? in : outn) * 4);
    int iters = bn->iters_opt ? bn->iters_opt
                              : (int)(bytes >= (32u << 20)  ? 5
                                      : bytes >= (1u << 20) ? 20
                                                            : 100);
    for (int pass = 0; pass < 2; pass++) {
        /* Like nccl-tests' -w: a few untimed iterations before the timed ones. */
        for (int it = 0; pass && it < 5; it++) {
            comm_req q = post(bn->w, k, &bn->b, count);
            comm_wait(&q);
        }
        double dt = time_reps(bn, k, count, pass ? iters : 1);
        if (check_result(bn, k, bytes, count, outn)) *wrong = 1;
        if (!pass) continue;
        int anywrong;
        double tmax = slowest(bn, dt, *wrong, &anywrong);
        print_row(bn, k, count, iters, tmax, anywrong);
        if (anywrong) *wrong = 1;
    }
    fflush(stdout);
}

int cmd_bench_comm(int argc, char **argv) {
    size_t minb = 4096, maxb = 64u << 20;
    double timeout = 300;
    bench bn = {.be = COMM_BACKEND_SHM};
    if (cmd_wants_help(argc, argv)) return cmd_print_usage(COMM_USAGE);
    int rc = parse_args(argc, argv, &minb, &maxb, &bn.iters_opt, &timeout, &bn.be);
    if (rc) return rc;
    if (maxb < minb) {
        fprintf(stderr, "ustrain: error: bench comm: --max-bytes %zu is below --min-bytes %zu\n",
                maxb, minb);
        return UST_EXIT_USAGE;
    }
    ust_boot boot;
    comm_ctx *ctx;
    int *all;
    if ((rc = open_world(&boot, &ctx, &bn, timeout, &all))) return rc;

    /* Rank 0 measures memcpy alone (the others wait at a barrier), then tells everyone. */
    if (bn.me == 0) bn.mbw = (float)memcpy_bw();
    comm_req r = comm_barrier(bn.w);
    comm_wait(&r);

    alloc_bufs(&bn, maxb);
    if (bn.me == 0) {
        printf("bench comm: %d ranks, backend %s, bootstrap %s, %zu..%zu bytes; memcpy "
               "(1 thread) %.2f GB/s\n",
               bn.W, comm_group_backend(bn.w), boot_kind_name(boot.kind), minb, maxb, bn.mbw / 1e9);
        printf("%-15s %12s %12s %6s %10s %10s %10s %9s\n", "op", "bytes", "count", "iters",
               "time_us", "algbw_GB/s", "busbw_GB/s", "bus/mcpy");
    }
    warm_up(&bn);
    static const comm_kind kinds[] = {COMM_ALLREDUCE, COMM_ALLGATHER, COMM_REDUCE_SCATTER,
                                      COMM_ALLTOALL};
    int wrong = 0;
    for (size_t ki = 0; ki < 4; ki++)
        for (size_t bytes = minb; bytes <= maxb; bytes *= 2)
            bench_size(&bn, kinds[ki], bytes, &wrong);
    if (bn.me == 0) {
        if (wrong)
            printf("bench comm: WRONG results (see the errors above)\n");
        else
            printf("bench comm: all results correct\n");
    }
    fflush(stdout);
#ifdef UST_NCCL
    if (bn.be == COMM_BACKEND_NCCL) cudaFree(bn.b.dsend), cudaFree(bn.b.drecv);
#endif
    free(bn.b.hsend), free(bn.b.hrecv), free(all);
    comm_ctx_free(ctx);
    boot_finalize(&boot);
    return wrong ? UST_EXIT_RUNTIME : 0;
}
