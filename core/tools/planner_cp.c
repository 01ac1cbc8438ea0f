#include "planner_cp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cp.h"
#include "error.h"

enum { RING_CACHE = 16, MAX_A = 64, KEY = 400 };

/* A run of consecutive positions [lo, hi]. */
typedef struct {
    int lo, hi;
} pos_run;

/* Block g's positions as runs (at most 2 per rank: zigzag's two chunks); pos: scratch of T/n. */
static int block_runs(const ust_config *c, int n, int a, int g, int32_t *pos, pos_run *out) {
    int T = c->train.seq_len, Tl = T / n, k = 0;
    for (int j = 0; j < a; j++) {
        cp_layout_positions(c->parallel.cp_layout, T, n, g * a + j, pos);
        for (int i = 0; i < Tl; i++)
            if (k && out[k - 1].hi + 1 == pos[i])
                out[k - 1].hi = pos[i];
            else
                out[k++] = (pos_run){pos[i], pos[i]};
    }
    return k;
}

/* cp.c's need: some query of q sees some key of k, i.e. a key in (query - W, query] (W 0: any
 * key up to the query). Over runs the queries' visible keys are [Q.lo - W + 1, Q.hi]. */
static int sees(const pos_run *q, int nq, const pos_run *k, int nk, int W) {
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < nk; j++)
            if (k[j].lo <= q[i].hi && (W <= 0 || k[j].hi > q[i].lo - W)) return 1;
    return 0;
}

/* One layer of window W (0: causal): adds times x each rank's block-sends into sends[rn] and
 * returns the group's. Block g goes hops[g] ranks on (its last rank that needs it, counted from
 * g: cp.c make_route): ranks g .. g+hops-1 each pass it on (per pass 3, 4 under full recompute:
 * k and v forward, again backward, dk and dv with them), and its last rank sends the gradients
 * home. */
static double layer_sends(int rn, pos_run (*runs)[2 * MAX_A], const int *nr, int W, int per,
                          int lat, double times, double *sends) {
    double group = 0;
    for (int g = 0; g < rn; g++) {
        int h = rn - 1;
        while (h > 0 && !sees(runs[(g + h) % rn], nr[(g + h) % rn], runs[g], nr[g], W)) h--;
        for (int s = 0; s < h; s++) sends[(g + s) % rn] += times * per;
        if (h > 0) sends[(g + h) % rn] += times;
        /* the latent ring's gradient starts one hop out (its owner's share stays home) */
        if (h > 0 && lat) sends[g] -= times;
        group += times * (per * h + (h > 0) - (h > 0 && lat));
    }
    return group;
}

typedef struct {
    char key[KEY];
    planner_ring r;
} ring_memo;

static ring_memo memo[RING_CACHE];
static int memo_n, memo_next;

void planner_ring_sends(const ust_config *c, int rn, int a, planner_ring *out) {
    int full = c->train.recompute == RECOMPUTE_FULL, L = c->model.n_layer, lat = cfg_cp_latent(c) > 0;
    char key[KEY];
    snprintf(key, sizeof key, "%d %d %d %d %d %d %d %d %d %d %s", lat, c->parallel.cp_layout,
             c->train.seq_len, rn, a, full, L, c->model.mtp.depth, c->model.max_seq_len,
             CFG_MAX_WINDOWS, c->model.sliding_window);
    for (int i = 0; i < memo_n; i++)
        if (strcmp(memo[i].key, key) == 0) {
            *out = memo[i].r;
            return;
        }
    UST_ASSERT(a >= 1 && a <= MAX_A, "a Ulysses degree of %d", a);
    int n = rn * a;
    pos_run(*runs)[2 * MAX_A] = malloc((size_t)rn * sizeof *runs);
    int *nr = malloc((size_t)rn * sizeof *nr);
    int32_t *pos = malloc((size_t)(c->train.seq_len / n) * sizeof *pos);
    double *sends = calloc((size_t)rn, sizeof *sends);
    UST_ASSERT(runs && nr && pos && sends, "out of host memory");
    for (int g = 0; g < rn; g++) nr[g] = block_runs(c, n, a, g, pos, runs[g]);
    /* each window once, times its layers; the full-attention layers (model.mtp's blocks too) */
    int w[CFG_MAX_WINDOWS], nw = cfg_windows(c, w);
    double group = 0, windowed = 0;
    for (int k = 0; k < nw; k++) {
        double layers = 0;
        for (int l = 0; l < L; l++) layers += cfg_layer_window(c, l) == w[k];
        group += layer_sends(rn, runs, nr, w[k], 3 + full, lat, layers, sends);
        windowed += layers;
    }
    group += layer_sends(rn, runs, nr, 0, 3 + full, lat, L - windowed + c->model.mtp.depth, sends);
    *out = (planner_ring){.group = group};
    for (int r = 0; r < rn; r++)
        if (sends[r] > out->busiest) out->busiest = sends[r];
    free(runs), free(nr), free(pos), free(sends);
    memo[memo_next] = (ring_memo){.r = *out};
    snprintf(memo[memo_next].key, sizeof memo[memo_next].key, "%s", key);
    memo_next = (memo_next + 1) % RING_CACHE;
    if (memo_n < RING_CACHE) memo_n++;
}
