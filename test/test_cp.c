/* Context parallelism at the attention level.
 * Run alone: the token layouts (zigzag chunks r and 2n-1-r, contiguous chunk r) and their causal
 * load balance. Run under a launcher with `--ring-check LAYOUT MODE` (test/sh/cp_attention.sh
 * does, for 2 and 4 ranks): every rank computes ring (or all-gather) attention forward and
 * backward for its tokens and compares them with single-rank attention over the whole sequence;
 * the (query, key) pairs each rank's attention counted must be equal within 1% under zigzag and
 * unequal under contiguous. MODE a2a (Ulysses) and a2a+ring (Ulysses over pairs, the ring across)
 * also check their all-to-all bytes against the formula. Options after MODE: `docs` masks
 * documents (Ulysses gathers their starts), `window=W` a sliding window of W keys (the ring routes
 * blocks by it), `bytes=N` the bytes the ring's groups must send in all (the script's hand count).
 */
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "comm.h"
#include "cp.h"
#include "mem.h"
#include "ops.h"
#include "rng.h"
#include "test.h"
#include "test_world.h"

static void test_zigzag_gives_rank_r_chunks_r_and_2n_minus_1_minus_r(void) {
    int32_t p[16];
    cp_layout_positions(CP_ZIGZAG, 32, 4, 1, p); /* chunks of 4: 1 and 6 */
    for (int j = 0; j < 4; j++) CHECK(p[j] == 4 + j && p[4 + j] == 24 + j, "p[%d] = %d", j, p[j]);
    cp_layout_positions(CP_CONTIGUOUS, 32, 4, 3, p);
    for (int j = 0; j < 8; j++) CHECK(p[j] == 24 + j, "contiguous p[%d] = %d", j, p[j]);
}

static void test_every_position_is_held_exactly_once(void) {
    for (int lay = 0; lay < 2; lay++) {
        int seen[64] = {0}, p[64];
        for (int r = 0; r < 4; r++) {
            cp_layout_positions(lay ? CP_CONTIGUOUS : CP_ZIGZAG, 64, 4, r, p);
            for (int j = 0; j < 16; j++) seen[p[j]]++;
        }
        for (int i = 0; i < 64; i++) CHECK(seen[i] == 1, "position %d held %d times", i, seen[i]);
    }
}

/* ---------------------------------------------------------------- multi-rank check */

enum { B = 2, T = 32, H = 4, HKV = 2, D = 8 };

static float val(uint64_t stream, int64_t i) { return rng_normal(17, stream, (uint64_t)i); }

/* Row of token at position t (batch b, head h) of a (B,T,heads,D) tensor. */
static int64_t at(int b, int t, int h, int heads, int Tn) {
    return (((int64_t)b * Tn + t) * heads + h) * D;
}

/* Where each position's document begins under --docs: documents of 5 tokens, then 3, 7, ...
 * (boundaries that cut every rank's chunks). */
static int32_t doc_start_of(int b, int t) {
    int start = 0, len = 5 + b;
    while (start + len <= t) start += len, len = len == 5 + b ? 3 : len == 3 ? 7 : 5 + b;
    return start;
}

static ust_cp_comm mode_of(const char *name) {
    static const char *const names[] = {"ring", "allgather", "a2a", "a2a+ring"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, names[i])) return (ust_cp_comm)i;
    fprintf(stderr, "test_cp: mode %s?\n", name);
    exit(2);
}

/* A ring check's options: document masking, a sliding window of `window` keys (0: none) and
 * the bytes the ring's group must send in all (summed over its ranks; -1: not checked). */
typedef struct {
    int docs, window;
    double bytes;
} check_opts;

/* Sums x over the group (fp32: exact for the byte counts of these sizes, < 2^24). */
static double group_sum(ust_comm *comm, ust_ops *o, double x) {
    int n = comm_size(comm);
    float *all = o->alloc(o, n * sizeof(float)), mine = (float)x;
    comm_req req = comm_allgather(comm, &mine, all, 1, COMM_FP32);
    comm_wait(&req);
    double s = 0;
    for (int i = 0; i < n; i++) s += all[i];
    o->free(o, all);
    return s;
}

static int ring_check(const char *layout_name, const char *mode_name, check_opts opt) {
    int docs = opt.docs, W = opt.window;
    test_world w;
    if (test_world_join(&w, "cp")) return 1;
    ust_comm *comm = w.comm, *sub[2] = {NULL, NULL};
    ust_cp_layout layout = strcmp(layout_name, "zigzag") ? CP_CONTIGUOUS : CP_ZIGZAG;
    ust_cp_comm mode = mode_of(mode_name);
    int world = comm_size(comm), me = comm_rank(comm), ua = mode == CP_A2A_RING ? 2 : 1;
    if (mode == CP_A2A_RING) { /* Ulysses over pairs of ranks, the ring across the pairs */
        int a2a[2] = {me - me % 2, me - me % 2 + 1}, ring[8], nr = 0;
        for (int i = me % 2; i < world; i += 2) ring[nr++] = i;
        comm_group_spec g[2] = {{"cp_a2a", a2a, 2}, {"cp_ring", ring, nr}};
        ust_err e;
        if (comm_create_many(w.ctx, 2, g, sub, &e))
            return printf("FAIL sub-groups: %s\n", e.msg), 1;
    }
    ust_ops *o = ops_cpu_create(1, 1);
    ust_arena arena;
    mem_init(&arena, o);
    ust_cp cp;
    cp_init(&cp, o, comm, sub[0], sub[1], &arena, T, B, H, HKV, D, 0, layout, mode, ua);
    int n = cp.n, Tl = cp.Tl, r = cp.rank;
    const int32_t *mine = cp_positions_of(&cp, r);
    /* the whole sequence's q, k, v, dout: the reference, and this rank's rows of them */
    int64_t nq = (int64_t)B * T * H * D, nk = (int64_t)B * T * HKV * D;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    for (int64_t i = 0; i < nq; i++) q[i] = val(1, i), dout[i] = val(4, i);
    for (int64_t i = 0; i < nk; i++) k[i] = val(2, i), v[i] = val(3, i);
    float *out = calloc(nq, 4), *lse = calloc(B * H * T, 4), *dq = calloc(nq, 4),
          *dk = calloc(nk, 4), *dv = calloc(nk, 4);
    int32_t pos[T], start[B * T], start_l[B * T];
    for (int t = 0; t < T; t++) pos[t] = t;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) { /* a window raises the start to t - W + 1 */
            start[b * T + t] = docs ? doc_start_of(b, t) : 0;
            if (W && t - W + 1 > start[b * T + t]) start[b * T + t] = t - W + 1;
        }
    for (int b = 0; b < B; b++)
        for (int j = 0; j < Tl; j++) start_l[b * Tl + j] = start[b * T + mine[j]];
    const int32_t *qs = docs || W ? start : NULL;
    o->attention_fwd(o, out, lse, q, k, v, B, T, T, H, HKV, D, pos, pos, 1, qs, 0.0f);
    o->attention_bwd(o, dq, dk, dv, dout, out, lse, q, k, v, B, T, T, H, HKV, D, pos, pos, 1, qs,
                     0.0f);
    /* the documents as the model gives them: local, gathered under Ulysses */
    int32_t *ustart = malloc(sizeof(int32_t) * B * T), min_l = start_l[0];
    for (int i = 1; i < B * Tl; i++) min_l = start_l[i] < min_l ? start_l[i] : min_l;
    cp_docs dl = {start_l, min_l, W};
    if ((docs || W) && cp_ulysses(&cp) > 1)
        dl = (cp_docs){ustart, cp_gather_docs(&cp, ustart, start_l), W};
    int64_t lq = (int64_t)B * Tl * H * D, lk = (int64_t)B * Tl * HKV * D;
    float *q_l = malloc(lq * 4), *k_l = malloc(lk * 4), *v_l = malloc(lk * 4),
          *dout_l = malloc(lq * 4);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < Tl; j++) {
            memcpy(q_l + at(b, j, 0, H, Tl), q + at(b, mine[j], 0, H, T), H * D * 4);
            memcpy(dout_l + at(b, j, 0, H, Tl), dout + at(b, mine[j], 0, H, T), H * D * 4);
            memcpy(k_l + at(b, j, 0, HKV, Tl), k + at(b, mine[j], 0, HKV, T), HKV * D * 4);
            memcpy(v_l + at(b, j, 0, HKV, Tl), v + at(b, mine[j], 0, HKV, T), HKV * D * 4);
        }
    float *out_l = calloc(lq, 4), *lse_l = calloc(B * H * Tl, 4), *dq_l = calloc(lq, 4),
          *dk_l = calloc(lk, 4), *dv_l = calloc(lk, 4);
    ust_comm *a2a = mode == CP_A2A ? comm : sub[0], *ring = mode == CP_A2A_RING ? sub[1] : comm;
    if (a2a) comm_reset_counters(a2a);
    if (mode != CP_A2A) comm_reset_counters(ring);
    cp_attention_fwd(&cp, out_l, lse_l, q_l, k_l, v_l, H, docs || W ? &dl : NULL, 0.0f);
    cp_attention_bwd(&cp, dq_l, dk_l, dv_l, dout_l, out_l, lse_l, q_l, k_l, v_l, H,
                     docs || W ? &dl : NULL, 0.0f);
    double ring_sent = 0;
    for (int kd = 0; mode != CP_A2A && kd < COMM_NKINDS; kd++)
        ring_sent += (double)comm_get_counters(ring)->bytes[kd];
    /* fp32, sums over up to 32 keys regrouped by blocks: agreement to ~1e-6 */
    double worst[4] = {0};
    for (int b = 0; b < B; b++)
        for (int j = 0; j < Tl; j++) {
            for (int i = 0; i < H * D; i++) {
                int64_t a = at(b, j, 0, H, Tl) + i, g = at(b, mine[j], 0, H, T) + i;
                worst[0] = fmax(worst[0], fabs(out_l[a] - out[g]));
                worst[1] = fmax(worst[1], fabs(dq_l[a] - dq[g]));
            }
            for (int i = 0; i < HKV * D; i++) {
                int64_t a = at(b, j, 0, HKV, Tl) + i, g = at(b, mine[j], 0, HKV, T) + i;
                worst[2] = fmax(worst[2], fabs(dk_l[a] - dk[g]));
                worst[3] = fmax(worst[3], fabs(dv_l[a] - dv[g]));
            }
        }
    char dn[32];
    snprintf(dn, sizeof dn, "%s%s%.0d", docs ? "_docs" : "", W ? "_window" : "", W);
    const char *what[4] = {"out", "dq", "dk", "dv"};
    int bad = 0;
    for (int i = 0; i < 4; i++)
        if (!(worst[i] <= 2e-5)) {
            printf("FAIL cp%d_%s_%s%s_%s_matches_full_attention: max |diff| %.3g (rank %d)\n", n,
                   layout_name, mode_name, dn, what[i], worst[i], r);
            bad = 1;
        }
    if (!bad && r == 0)
        printf("PASS cp%d_%s_%s%s_forward_and_backward_match_full_attention\n", n, layout_name,
               mode_name, dn);
    if (a2a) {
        /* Ulysses traffic, per rank: a members, Hq = H/a query heads, Hk = HKV/a key/value heads
         * (1, replicated, when HKV < a); (a-1) parts of B*Tl*D floats per head sent:
         * forward q, k, v there and out back (2 Hq + 2 Hk), backward q, k, v, out, d out there
         * and dq, dk, dv back (4 Hq + 4 Hk) */
        int a = comm_size(a2a), Hq = H / a, Hk = HKV % a == 0 ? HKV / a : 1;
        double want = (double)(a - 1) * B * Tl * D * 4 * (6 * Hq + 6 * Hk);
        double got = (double)comm_get_counters(a2a)->bytes[COMM_ALLTOALL];
        int ok = got == want;
        if (r == 0 || !ok)
            printf("%s cp%d_%s_%s%s_alltoall_bytes_equal_formula: %.0f counted, %.0f formula\n",
                   ok ? "PASS" : "FAIL", n, layout_name, mode_name, dn, got, want);
        bad |= !ok;
    }
    if (opt.bytes >= 0) { /* the ring group's bytes, every rank's summed (the launcher's world) */
        double got = group_sum(comm, o, ring_sent);
        int ok = got == opt.bytes;
        if (r == 0)
            printf("%s cp%d_%s_%s%s_ring_bytes_equal_hand_count: %.0f sent, %.0f by hand\n",
                   ok ? "PASS" : "FAIL", n, layout_name, mode_name, dn, got, opt.bytes);
        bad |= !ok;
    }
    /* load balance: every rank's counted (query, key) pairs, gathered */
    float *pairs = o->alloc(o, n * sizeof(float)), mine_pairs = (float)cp.pairs;
    comm_req req = comm_allgather(comm, &mine_pairs, pairs, 1, COMM_FP32);
    comm_wait(&req);
    float lo = pairs[0], hi = pairs[0];
    for (int i = 1; i < n; i++) lo = fminf(lo, pairs[i]), hi = fmaxf(hi, pairs[i]);
    int balanced = hi <= lo * 1.01f;
    if (r == 0 && !docs && !W) { /* (blocks no query can see are skipped, not counted) */
        /* Ulysses alone: every rank attends all the tokens of its heads, balanced in any layout */
        int want = layout == CP_ZIGZAG || mode == CP_A2A;
        printf("%s cp%d_%s_attention_pairs_%s: per rank min %.0f max %.0f\n",
               balanced == want ? "PASS" : "FAIL", n, layout_name,
               want ? "equal_within_1pct" : "unequal", lo, hi);
        bad |= balanced != want;
    }
    free(ustart);
    test_world_leave(&w);
    return bad;
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "--ring-check")) { /* [docs] [window=W] [bytes=N] */
        check_opts opt = {0, 0, -1};
        for (int i = 4; i < argc; i++)
            if (!strcmp(argv[i], "docs"))
                opt.docs = 1;
            else if (!strncmp(argv[i], "window=", 7))
                opt.window = atoi(argv[i] + 7);
            else if (!strncmp(argv[i], "bytes=", 6))
                opt.bytes = atof(argv[i] + 6);
            else
                return fprintf(stderr, "test_cp: option %s?\n", argv[i]), 2;
        return ring_check(argv[2], argv[3], opt);
    }
    RUN_TEST(test_zigzag_gives_rank_r_chunks_r_and_2n_minus_1_minus_r);
    RUN_TEST(test_every_position_is_held_exactly_once);
    return TEST_SUMMARY();
}
