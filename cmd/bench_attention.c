/* ustrain bench attention: the attention op (forward + backward) on one long sequence of many
 * short documents, without and with data.doc_mask's q_start, on the CPU backend; with --window W
 * also under a sliding window of W keys (model.sliding_window's q_start). The documents (or the
 * window) hide most key blocks from most query tiles, which the kernels skip; the ratios printed
 * are that saving, measured in one run (best of --iters each). */
#include <float.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "log.h"
#include "ops.h"
#include "rng.h"

static const char *ATT_USAGE =
    "usage: ustrain bench attention [--seq-len T] [--doc-len L] [--heads H] [--head-dim D]\n"
    "                               [--iters N] [--threads N] [--window W]\n"
    "  defaults: T 4096, L 128, H 8 (2 key/value heads), D 64, 3 iterations, every CPU, no "
    "window;\n"
    "  T 64..65536, L 1..T, H 1..64 (a multiple of 2), D 8..256 (even), N 1..100, W 1..T\n";

typedef struct {
    int T, L, H, D, iters, threads, window;
} att_args;

static int parse(int argc, char **argv, att_args *a) {
    const cmd_who who = {"ustrain", ATT_USAGE};
    static const struct {
        const char *opt;
        long long lo, hi;
        size_t off;
    } opts[] = {{"--seq-len", 64, 65536, offsetof(att_args, T)},
                {"--doc-len", 1, 65536, offsetof(att_args, L)},
                {"--heads", 2, 64, offsetof(att_args, H)},
                {"--head-dim", 8, 256, offsetof(att_args, D)},
                {"--iters", 1, 100, offsetof(att_args, iters)},
                {"--threads", 1, 1024, offsetof(att_args, threads)},
                {"--window", 1, 65536, offsetof(att_args, window)}};
    for (int i = 0; i < argc; i += 2) {
        size_t k = 0;
        while (k < sizeof opts / sizeof opts[0] && strcmp(argv[i], opts[k].opt)) k++;
        if (k == sizeof opts / sizeof opts[0])
            return cmd_usage_error("ustrain", ATT_USAGE, "unknown option %s for bench attention%s",
                                   argv[i], "");
        if (i + 1 >= argc)
            return cmd_usage_error("ustrain", ATT_USAGE, "%s needs a value%s", argv[i], "");
        long long v;
        if (cmd_int_opt(&who, argv[i], argv[i + 1], opts[k].lo, opts[k].hi, &v))
            return UST_EXIT_USAGE;
        *(int *)((char *)a + opts[k].off) = (int)v;
    }
    if (a->L > a->T || a->window > a->T || a->H % 2 || a->D % 2)
        return cmd_usage_error("ustrain", ATT_USAGE, "%s%s",
                               "--doc-len and --window must be <= --seq-len, --heads and "
                               "--head-dim even",
                               "");
    return 0;
}

static float *random_floats(int64_t n, uint64_t stream) {
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = rng_normal(11, stream, (uint64_t)i);
    return p;
}

/* Best time of forward + backward over iters runs. */
static double time_attention(const ust_ops *o, const att_args *a, float *const buf[8],
                             const int32_t *q_start) {
    int T = a->T, H = a->H, Hkv = a->H / 2, D = a->D;
    double best = DBL_MAX;
    for (int it = 0; it < a->iters; it++) {
        double t0 = log_now_s();
        o->attention_fwd(o, buf[3], buf[4], buf[0], buf[1], buf[2], 1, T, T, H, Hkv, D, NULL, NULL,
                         1, q_start, 0.0f);
        o->attention_bwd(o, buf[5], buf[6], buf[7], buf[3], buf[3], buf[4], buf[0], buf[1], buf[2],
                         1, T, T, H, Hkv, D, NULL, NULL, 1, q_start, 0.0f);
        double dt = log_now_s() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

int cmd_bench_attention(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) return cmd_print_usage(ATT_USAGE);
    att_args a = {4096, 128, 8, 64, 3, 0, 0};
    int rc = parse(argc, argv, &a);
    if (rc) return rc;
    ust_ops *o = ops_cpu_create(a.threads, 1);
    int64_t nq = (int64_t)a.T * a.H * a.D, nk = nq / 2;
    float *buf[8] = {random_floats(nq, 1), random_floats(nk, 2), random_floats(nk, 3),
                     calloc(nq, 4),        calloc(a.H * a.T, 4), calloc(nq, 4),
                     calloc(nk, 4),        calloc(nk, 4)};
    int32_t *q_start = malloc((size_t)a.T * sizeof(int32_t));
    for (int t = 0; t < a.T; t++) q_start[t] = t - t % a.L;
    double plain = time_attention(o, &a, buf, NULL), docs = time_attention(o, &a, buf, q_start);
    printf("bench attention: T=%d, documents of %d tokens, H=%d (kv %d), D=%d, cpu\n", a.T, a.L,
           a.H, a.H / 2, a.D);
    printf("  causal attention fwd+bwd:            %8.2f ms\n", 1e3 * plain);
    printf("  with document masking (q_start):     %8.2f ms\n", 1e3 * docs);
    printf("  speed-up from skipping hidden blocks: %.2fx\n", plain / docs);
    if (a.window) { /* query t sees keys t - W + 1 .. t */
        for (int t = 0; t < a.T; t++) q_start[t] = t - a.window + 1 > 0 ? t - a.window + 1 : 0;
        double win = time_attention(o, &a, buf, q_start);
        printf("  with a sliding window of %d keys:  %8.2f ms (%.2fx faster than causal)\n",
               a.window, 1e3 * win, plain / win);
    }
    for (int i = 0; i < 8; i++) free(buf[i]);
    free(q_start);
    o->destroy(o);
    return 0;
}
