/* pp_schedule: build and print pipeline schedules (see pp_schedule.h; pp_schedule_check.c checks
 * and simulates them). Each builder below writes one rank's compute order; with_comm then adds
 * the transfers around it. */
#include "pp_schedule.h"

#include <stdlib.h>
#include <string.h>

static int imin(int a, int b) { return a < b ? a : b; }

static int is_comm(pps_op op) { return op >= PPS_SEND_ACT && op <= PPS_RECV_GRAD; }

enum { STEP_JOIN = -2 }; /* marks a compute that shares the previous one's comm step */

static void push(pps_action *a, int *n, pps_op op, int mb, int chunk) {
    a[(*n)++] = (pps_action){.op = op, .mb = mb, .chunk = chunk, .stage = -1, .peer = -1};
}

static void push_split(pps_action *a, int *n, pps_op op, int mb, int chunk, int split) {
    push(a, n, op, mb, chunk);
    a[*n - 1].split = split;
}

static void push_join(pps_action *a, int *n, pps_op op, int mb, int chunk) {
    push(a, n, op, mb, chunk);
    a[*n - 1].peer = STEP_JOIN;
}

/* ---- compute orders ------------------------------------------------------------------------ */

/* GPipe: all forwards, then all backwards in the same order (picotron's afab). Every rank holds
 * all m activations before the first backward. */
static void order_afab(pps_action *a, int *n, int m) {
    for (int i = 0; i < m; i++) push(a, n, PPS_F, i, 0);
    for (int i = 0; i < m; i++) push(a, n, PPS_B, i, 0);
}

/* 1F1B: rank r runs w = p-r-1 warm-up forwards (the micro-batches in flight downstream of it),
 * then alternates F(w+i), B(i), then drains the w backwards left. It holds at most w+1 = p-r
 * activations, against m for afab; the bubble is the same. */
static void order_1f1b(pps_action *a, int *n, int p, int m, int r) {
    int w = imin(p - r - 1, m);
    for (int i = 0; i < w; i++) push(a, n, PPS_F, i, 0);
    for (int i = 0; i < m - w; i++) {
        push(a, n, PPS_F, w + i, 0);
        push(a, n, PPS_B, i, 0);
    }
    for (int i = m - w; i < m; i++) push(a, n, PPS_B, i, 0);
}

/* ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", sec. 2.1): 1F1B with the backward split
 * into B (input gradient, on the critical path to the previous stage) and W (weight gradient,
 * needed only by the optimizer). Rank r delays its W's by r micro-batches, so every rank holds up
 * to p micro-batches (rank 0's 1F1B peak, which it keeps), upstream B's start earlier, and the
 * delayed W's fill the cool-down, where the ranks would otherwise wait for the last B's. */
static void order_zb(pps_action *a, int *n, int p, int m, int r) {
    int w = imin(p - r - 1, m), next_w = 0;
    for (int i = 0; i < w; i++) push(a, n, PPS_F, i, 0);
    for (int i = 0; i < m - w; i++) {
        push(a, n, PPS_F, w + i, 0);
        push_split(a, n, PPS_B, i, 0, 1);
        if (i >= r) push(a, n, PPS_W, next_w++, 0);
    }
    for (int i = m - w; i < m; i++) {
        push_split(a, n, PPS_B, i, 0, 1);
        if (next_w <= i) push(a, n, PPS_W, next_w++, 0);
    }
    while (next_w < m) push(a, n, PPS_W, next_w++, 0);
}

/* The k-th of the m*v (mb, chunk) forwards (fwd) or backwards of a rank, interleaved.
 * Depth-first (Megatron): groups of p micro-batches go through chunk 0, 1, .., v-1 before the
 * next group starts, so micro-batches leave the model early. Breadth-first: all m micro-batches
 * through chunk 0, then all through chunk 1, ..: the pipeline is filled first. Backwards visit
 * the chunks in reverse. */
static void interleaved_at(int k, int p, int v, int m, int breadth, int fwd, int *mb, int *chunk) {
    int c;
    if (breadth) {
        c = k / m;
        *mb = k % m;
    } else {
        int in = k % (p * v);
        c = in / p;
        *mb = k / (p * v) * p + in % p;
    }
    *chunk = fwd ? c : v - 1 - c;
}

/* Interleaved 1F1B (v > 1; with v == 1 it is plain 1F1B, as in Megatron): the 1F1B skeleton
 * over m*v virtual micro-batches. Depth-first warm-up (Megatron): the (v-1)*p forwards before
 * the last chunk of micro-batch 0 plus 2(p-r-1) to cover the round trip through the ranks
 * downstream; with m == p everything is warm-up. Each chunk is 1/v of a stage, so the fill and
 * drain cost (p-1)/v stage-times and the bubble is (p-1)/(v*m).
 * Breadth-first is everything as warm-up: all forwards chunk by chunk, then all backwards (the
 * looping GPipe of Lamy-Poirier's "Breadth-First Pipeline Parallelism"): the same bubble for
 * m >= p, m*v activations held like afab, and each chunk's weight gradients are complete early,
 * so a data-parallel reduction can overlap the remaining backwards. */
static void order_interleaved(pps_action *a, int *n, int p, int v, int m, int r, int breadth) {
    if (v == 1 && !breadth) {
        order_1f1b(a, n, p, m, r);
        return;
    }
    int total = m * v;
    int warm = (v - 1) * p + 2 * (p - r - 1);
    if (m == p || breadth) warm = total;
    warm = imin(warm, total);
    int mb, c;
    for (int k = 0; k < warm; k++) {
        interleaved_at(k, p, v, m, breadth, 1, &mb, &c);
        push(a, n, PPS_F, mb, c);
    }
    for (int k = 0; k < total - warm; k++) {
        interleaved_at(warm + k, p, v, m, breadth, 1, &mb, &c);
        push(a, n, PPS_F, mb, c);
        interleaved_at(k, p, v, m, breadth, 0, &mb, &c);
        push_join(a, n, PPS_B, mb, c);
    }
    for (int k = total - warm; k < total; k++) {
        interleaved_at(k, p, v, m, breadth, 0, &mb, &c);
        push(a, n, PPS_B, mb, c);
    }
}

/* DualPipeV (DeepSeek's "cut-in-half" DualPipe, Sea AI Lab's writeup): p ranks hold 2p stages in
 * a V, chunk 0 = stage r on the way down, chunk 1 = stage 2p-1-r on the way up, one copy of the
 * parameters. Every chunk runs its F's, and its B's, in micro-batch order; a split B leaves its W
 * to a queue the W's drain first in, first out. Rank r's eight phases (m >= 2p):
 *   1. 2(p-r-1) x F0             fill the way down
 *   2. r+1 x (F0 F1)             the first micro-batches turn at rank p-1 and come up
 *   3. p-r-1 x (B1' W F1)        the first backwards start; B1' split, its W right after
 *   4. m-2p+r+1 x (F0&B1 F1&B0)  steady state: a forward and a whole backward of different
 *                                micro-batches and chunks paired in one step, so their transfers
 *                                go out together and overlap the next pair's compute
 *   5. p-r-1 x (B1 F1&B0)        the last forwards
 *   6. r+1 x (B1 B0)             drain; the second half of them split (zero bubble)
 *   7. p-r-1 x (W B0')           the queued W's fill the wait for the last B0's
 *   8. r+1 x W
 * The bubble is DeepSeek's (PP/2-1)(F&B+B-3W) for PP = 2p stages (pps_analytic_bubble); with
 * PPS_NO_SPLIT every B is whole and the W's go. */
typedef struct {
    pps_action *a;
    int *n, next_f[2], next_b[2], *wq, wq_lo, wq_hi, split_ok;
} vbuild;

static void v_f(vbuild *b, int c, int join) {
    (join ? push_join : push)(b->a, b->n, PPS_F, b->next_f[c]++, c);
}

static void v_b(vbuild *b, int c, int split, int join) {
    split &= b->split_ok;
    int mb = b->next_b[c]++;
    push_split(b->a, b->n, PPS_B, mb, c, split);
    if (join) b->a[*b->n - 1].peer = STEP_JOIN;
    if (split) b->wq[b->wq_hi++] = mb * 2 + c;
}

static void v_w(vbuild *b) {
    if (b->wq_lo == b->wq_hi) return; /* nothing queued (PPS_NO_SPLIT) */
    int k = b->wq[b->wq_lo++];
    push(b->a, b->n, PPS_W, k / 2, k % 2);
}

/* The eight phases for p ranks, m micro-batches per chunk, rank r; chunk c's micro-batches are
 * mb0[c], mb0[c]+1, .. */
static int order_v(pps_action *a, int *n, int p, int m, int r, int split_ok, const int mb0[2]) {
    vbuild b = {.a = a, .n = n, .split_ok = split_ok};
    b.wq = malloc(sizeof *b.wq * 2 * m);
    if (!b.wq) return -1;
    for (int c = 0; c < 2; c++) b.next_f[c] = b.next_b[c] = mb0[c];
    int down = p - r - 1, up = r + 1;
    for (int i = 0; i < 2 * down; i++) v_f(&b, 0, 0);
    for (int i = 0; i < up; i++) v_f(&b, 0, 0), v_f(&b, 1, 0);
    for (int i = 0; i < down; i++) v_b(&b, 1, 1, 0), v_w(&b), v_f(&b, 1, 0);
    for (int i = 0; i < m - 2 * p + r + 1; i++) {
        v_f(&b, 0, 0), v_b(&b, 1, 0, 1);
        v_f(&b, 1, 0), v_b(&b, 0, 0, 1);
    }
    for (int i = 0; i < down; i++) v_b(&b, 1, 0, 0), v_f(&b, 1, 0), v_b(&b, 0, 0, 1);
    /* drain: from the middle on the B's are split, half of the 2(r+1) (the W's of phases 7
     * and 8 are theirs) */
    int split = 0;
    for (int i = 0; i < up; i++) {
        if (i == up / 2 && r % 2 == 1) split = 1;
        v_b(&b, 1, split, 0);
        if (i == up / 2 && r % 2 == 0) split = 1;
        v_b(&b, 0, split, 0);
    }
    for (int i = 0; i < down; i++) v_w(&b), v_b(&b, 0, 1, 0);
    while (b.wq_lo < b.wq_hi) v_w(&b);
    free(b.wq);
    return 0;
}

/* DualPipe (DeepSeek-V3, sec. 3.2.1): p ranks (even), p stages, every rank holds two of them:
 * stage r for the m/2 micro-batches entering at rank 0 (direction 0: 0 .. m/2-1) and stage
 * p-1-r for the m/2 entering at rank p-1 (direction 1: m/2 .. m-1), so the parameters exist
 * twice and the mirror ranks r and p-1-r hold the same two stages. Chunk 0 is the rank's stage
 * nearer the input, h = min(r, p-1-r), chunk 1 the other (p-1-h): on the first half chunk 0 runs
 * direction 0, on the second half direction 1. Rank r's list is DeepSeek's with half_rank h:
 * the eight phases above for p/2 ranks and m/2 micro-batches per direction at rank h, each rank
 * and its mirror running the same list in opposite directions. The bubble is DeepSeek's
 * (PP/2-1)(F&B+B-3W) with PP = p (pps_analytic_bubble): none at p = 2. */
static int order_dualpipe(pps_action *a, int *n, int p, int m, int r, int split_ok) {
    int second = r >= p / 2, h = second ? p - 1 - r : r;
    int mb0[2] = {second ? m / 2 : 0, second ? 0 : m / 2};
    return order_v(a, n, p / 2, m / 2, h, split_ok, mb0);
}

static int order_dualpipev(pps_action *a, int *n, int p, int m, int r, int split_ok) {
    static const int from_zero[2] = {0, 0};
    return order_v(a, n, p, m, r, split_ok, from_zero);
}

static int two_way(ust_pp_schedule kind) { return kind == PP_DUALPIPEV || kind == PP_DUALPIPE; }

/* The compute order of either kind whose receives are placed by simulation. */
static int order_two_way(ust_pp_schedule kind, pps_action *a, int *n, int p, int m, int r,
                         int split_ok) {
    return kind == PP_DUALPIPE ? order_dualpipe(a, n, p, m, r, split_ok)
                               : order_dualpipev(a, n, p, m, r, split_ok);
}

/* ---- transfers ----------------------------------------------------------------------------- */

int pps_stage(ust_pp_schedule kind, int p, int c, int r) {
    if (kind == PP_DUALPIPEV) return c == 0 ? r : 2 * p - 1 - r;
    if (kind == PP_DUALPIPE) return (c == 0) == (r < p / 2) ? r : 2 * p - 1 - r;
    return c * p + r;
}

int pps_stage_rank(ust_pp_schedule kind, int p, int stage) {
    if (two_way(kind)) return stage < p ? stage : 2 * p - 1 - stage;
    return stage % p;
}

int pps_model_stage(ust_pp_schedule kind, int p, int stage) {
    return kind == PP_DUALPIPE ? stage % p : stage;
}

int pps_stage_first(ust_pp_schedule kind, int p, int stage) {
    return kind == PP_DUALPIPE ? stage / p * p : 0;
}

int pps_stage_last(ust_pp_schedule kind, int p, int v, int stage) {
    return kind == PP_DUALPIPE ? stage / p * p + p - 1 : p * v - 1;
}

int pps_chunk_runs(ust_pp_schedule kind, int p, int m, int mb, int c, int r) {
    if (kind != PP_DUALPIPE) return 1;
    return (mb >= m / 2) == (pps_stage(kind, p, c, r) >= p);
}

int pps_chunk_last_mb(ust_pp_schedule kind, int p, int m, int c, int r) {
    return pps_chunk_runs(kind, p, m, m - 1, c, r) ? m - 1 : m / 2 - 1;
}

static int stage_chunk(ust_pp_schedule kind, int p, int stage) {
    if (kind == PP_DUALPIPEV) return stage < p ? 0 : 1;
    if (kind == PP_DUALPIPE) return stage % p < p / 2 ? 0 : 1;
    return stage / p;
}

/* One transfer of compute x (stage already set), or nothing: RECV_* before x, SEND_* after, to
 * the rank of the neighbouring stage when that is another rank. */
static int comm_of(pps_action x, int before, ust_pp_schedule kind, int p, int v, int r,
                   pps_action *out) {
    int first = pps_stage_first(kind, p, x.stage), last = pps_stage_last(kind, p, v, x.stage);
    int prev = x.stage > first ? pps_stage_rank(kind, p, x.stage - 1) : r;
    int next = x.stage < last ? pps_stage_rank(kind, p, x.stage + 1) : r;
    pps_action c = x;
    c.split = 0;
    if (p == 1 || x.op == PPS_W) return 0;
    if (x.op == PPS_F && before && prev != r)
        c.op = PPS_RECV_ACT, c.peer = prev;
    else if (x.op == PPS_F && !before && next != r)
        c.op = PPS_SEND_ACT, c.peer = next;
    else if (x.op == PPS_B && before && next != r)
        c.op = PPS_RECV_GRAD, c.peer = next;
    else if (x.op == PPS_B && !before && prev != r)
        c.op = PPS_SEND_GRAD, c.peer = prev;
    else
        return 0;
    *out = c;
    return 1;
}

/* The local hand-over right after compute x when its neighbouring stage is on this rank too
 * (dualpipev's turn at rank p-1): the copy belongs to the consumer (its mb, chunk and stage). */
static int local_of(pps_action x, ust_pp_schedule kind, int p, int v, int r, pps_action *out) {
    int first = pps_stage_first(kind, p, x.stage), last = pps_stage_last(kind, p, v, x.stage), to;
    if (p == 1) return 0; /* one stage: the chunks are not pipelined (pps_check's p == 1 rules) */
    if (x.op == PPS_F && x.stage < last && pps_stage_rank(kind, p, x.stage + 1) == r)
        to = x.stage + 1;
    else if (x.op == PPS_B && x.stage > first && pps_stage_rank(kind, p, x.stage - 1) == r)
        to = x.stage - 1;
    else
        return 0;
    *out = (pps_action){.op = x.op == PPS_F ? PPS_LOCAL_ACT : PPS_LOCAL_GRAD,
                        .mb = x.mb,
                        .chunk = stage_chunk(kind, p, to),
                        .stage = to,
                        .peer = -1};
    return 1;
}

/* dualpipev: the ranks on either side of r both send it activations and gradients, and a
 * neighbour's sends to r come in an order r does not consume them in (rank 0 sends the
 * activation of a forward before the gradient of a backward that rank 1 needs first). Transfers
 * on a rank pair match in posting order, so r posts its receives from each peer in that peer's
 * send order: the k-th one in the batch before the first compute that needs any of the k-th,
 * (k+1)-th, .. received tensor (a suffix minimum over the consumers); key gets each compute's
 * place in its sender's order (so a batch lists them in that order) and post_at the compute
 * whose batch posts its receive. The simulator shows this runs without a deadlock. */
static int v_post_order(ust_pp_schedule kind, const pps_action *comp, int nc, int p, int m, int r,
                        int *post_at, int *key) {
    int cap = 3 * m * 2, rc = 0;
    pps_action *theirs = malloc(sizeof *theirs * cap);
    int *idx = malloc(sizeof *idx * (nc + 1));
    if (!theirs || !idx) rc = -1;
    for (int side = -1; side <= 1 && !rc; side += 2) {
        int a = r + side, na = 0, k = 0, nq = 0;
        if (a < 0 || a >= p) continue;
        if (order_two_way(kind, theirs, &na, p, m, a, 1)) {
            rc = -1;
            break;
        }
        /* the tensors a sends to r, in order; each is matched to the compute of r consuming it */
        for (int x = 0; x < na; x++) {
            pps_action t = theirs[x], c;
            t.stage = pps_stage(kind, p, t.chunk, a);
            if (!comm_of(t, 0, kind, p, 2, a, &c) || c.peer != r) continue;
            int want_op = c.op == PPS_SEND_ACT ? PPS_F : PPS_B;
            int want_stage = c.stage + (c.op == PPS_SEND_ACT ? 1 : -1);
            for (int q = 0; q < nc; q++)
                if ((int)comp[q].op == want_op && comp[q].mb == c.mb &&
                    comp[q].stage == want_stage) {
                    key[q] = k++;
                    idx[nq++] = q;
                }
        }
        for (int t = nq - 1, lo = nc; t >= 0; t--) { /* suffix minimum of the consumers */
            if (idx[t] < lo) lo = idx[t];
            post_at[idx[t]] = lo;
        }
    }
    free(theirs), free(idx);
    return rc;
}

/* The computes are cut into steps (a compute pushed with STEP_JOIN belongs to the previous
 * one's step). A step's receives go right before it and its sends right after it, so between two
 * steps the sends of the first and the receives of the second form one batch: two neighbours
 * that both send to each other (one a forward result, the other a backward one) meet in one
 * batch instead of each waiting for the other's receive. 1F1B uses one compute per step
 * (Megatron's send_forward_recv_backward); interleaved runs its steady F and B as one step
 * (Megatron's send_forward_backward_recv_forward_backward), because with p = 2 both ranks send
 * to each other in both directions. */
static int emit(const pps_action *comp, int nc, ust_pp_schedule kind, int p, int v, int r,
                const int *post_at, const int *key, int early, int *batch, int *gap_at,
                pps_action *out);

static int v_build_all(pps_schedule *all, ust_pp_schedule kind, int p, int m, int flags,
                       ust_err *e);

static int with_comm(pps_action *comp, int nc, ust_pp_schedule kind, int p, int v, int m, int r,
                     int breadth, pps_action *out) {
    /* Breadth-first: the first chunk of micro-batch k comes back round the ring (rank p-1 ->
     * rank 0) while rank 0 still has m-p forwards of the earlier chunk to run (in backward,
     * rank 0 -> rank p-1 alike). A receive posted only right before its consumer would leave
     * rank p-1 blocked in its send; post it m-p computes earlier instead, in the batch rank 0
     * runs while rank p-1 sends it. Everywhere else early = 0. */
    int early = breadth && m > p ? m - p : 0;
    int *post_at = malloc(sizeof *post_at * (nc + 1)), *key = malloc(sizeof *key * (nc + 1));
    int *batch = malloc(sizeof *batch * (nc + 1));
    if (!post_at || !key || !batch) {
        free(post_at), free(key), free(batch);
        return -1;
    }
    for (int i = 0; i < nc; i++) {
        comp[i].stage = pps_stage(kind, p, comp[i].chunk, r);
        int wrap = (r == 0 && comp[i].op == PPS_F && comp[i].chunk > 0) ||
                   (r == p - 1 && comp[i].op == PPS_B && comp[i].chunk < v - 1);
        post_at[i] = wrap ? i - early : i;
        key[i] = i;
    }
    int n = emit(comp, nc, kind, p, v, r, post_at, key, early, batch, NULL, out);
    free(post_at), free(key), free(batch);
    return n;
}

/* Writes the actions of rank r's computes: each step's receives (those whose post_at lies in
 * the step, looking up to early computes ahead, in key order), its computes with their local
 * copies, its sends. batch: scratch of nc; gap_at (may be NULL) gets for each compute the index
 * where the batch before its step starts (the previous step's sends). */
static int emit(const pps_action *comp, int nc, ust_pp_schedule kind, int p, int v, int r,
                const int *post_at, const int *key, int early, int *batch, int *gap_at,
                pps_action *out) {
    int n = 0;
    for (int i = 0, j; i < nc; i = j) {
        for (j = i + 1; j < nc && comp[j].peer == STEP_JOIN; j++) {
        }
        int nb = 0; /* this step's receives in posting order: by key (compute order but for
                       dualpipev, where it is the order the peer sends them in) */
        for (int q = i; q < nc && q < j + early; q++)
            if (post_at[q] >= i && post_at[q] < j) {
                int t = nb++;
                for (; t > 0 && key[batch[t - 1]] > key[q]; t--) batch[t] = batch[t - 1];
                batch[t] = q;
            }
        for (int t = 0; t < nb; t++) n += comm_of(comp[batch[t]], 1, kind, p, v, r, &out[n]);
        for (int k = i; k < j; k++) {
            out[n] = comp[k], out[n++].peer = -1;
            n += local_of(comp[k], kind, p, v, r, &out[n]);
        }
        for (int k = j; gap_at && k < nc && (k == j || comp[k].peer == STEP_JOIN); k++)
            gap_at[k] = n;
        for (int k = i; k < j; k++) n += comm_of(comp[k], 0, kind, p, v, r, &out[n]);
    }
    return n;
}

/* One round of v_build_all's placement for rank r: each of its receives moves to the first
 * batch that starts once its sender (rank r-1 or r+1) has posted the send, into next. */
static void v_place_rank(const pps_schedule *all, pps_action **comp, const int *nc, int **key,
                         int **gap, double **reach, ust_pp_schedule kind, int p, int r, int *next,
                         int *scratch) {
    for (int side = -1; side <= 1; side += 2) {
        int a = r + side, nq = 0;
        if (a < 0 || a >= p) continue;
        /* the k-th send of a to r, its post time, and r's compute receiving it */
        for (int i = 0, k = 0; i < all[a].n; i++) {
            const pps_action *x = &all[a].a[i];
            if ((x->op != PPS_SEND_ACT && x->op != PPS_SEND_GRAD) || x->peer != r) continue;
            for (int q = 0; q < nc[r]; q++) {
                pps_action c;
                if (key[r][q] != k || !comm_of(comp[r][q], 1, kind, p, 2, r, &c) || c.peer != a)
                    continue;
                int d = q;
                for (int st = 0; st <= q; st++)
                    if (comp[r][st].peer != STEP_JOIN &&
                        reach[r][gap[r][st]] >= reach[a][i] - 1e-9) {
                        d = st;
                        break;
                    }
                next[q] = d;
                scratch[nq++] = q;
            }
            k++;
        }
        for (int t = nq - 1, lo = 1 << 30; t >= 0; t--) { /* keep the sender's order */
            if (next[scratch[t]] < lo) lo = next[scratch[t]];
            next[scratch[t]] = lo;
        }
    }
}

/* dualpipev's receives, placed by simulation. v_post_order's placement (each receive as late as
 * the sender's order allows) makes a sender wait in its batch until the receiver gets round to
 * posting: under the executor's rule (a batch completes as a whole) that costs the V most of
 * its advantage. So, with unit costs F = B = W = 1 and every rank's schedule built: simulate,
 * and move each receive to the first batch of its rank that starts once its sender has posted
 * the send (no later than its consumer; then the suffix minimum keeps the sender's order);
 * repeat while the makespan shrinks (at most 16 rounds; a placement that deadlocks or is no
 * shorter is not taken). Deterministic: every rank computes the same placement. */
static int v_build_all(pps_schedule *all, ust_pp_schedule kind, int p, int m, int flags,
                       ust_err *e) {
    const pps_costs unit = {1, 1, 1};
    int cap = 3 * m * 2, rc = 0;
    pps_action *comp[PPS_MAX_P] = {0};
    int nc[PPS_MAX_P] = {0}, *post[PPS_MAX_P] = {0}, *next[PPS_MAX_P] = {0};
    int *key[PPS_MAX_P] = {0}, *gap[PPS_MAX_P] = {0}, *scratch = malloc(sizeof(int) * (cap + 1));
    double *reach[PPS_MAX_P] = {0};
    pps_schedule cand[PPS_MAX_P];
    memset(cand, 0, sizeof cand);
    if (p > PPS_MAX_P || !scratch) rc = -1;
    for (int r = 0; r < p && !rc; r++) {
        comp[r] = malloc(sizeof **comp * cap);
        post[r] = malloc(sizeof(int) * (cap + 1)), next[r] = malloc(sizeof(int) * (cap + 1));
        key[r] = malloc(sizeof(int) * (cap + 1)), gap[r] = calloc(cap + 1, sizeof(int));
        reach[r] = malloc(sizeof(double) * 4 * cap);
        all[r] = (pps_schedule){.kind = kind,
                                .p = p,
                                .v = 2,
                                .m = m,
                                .rank = r,
                                .flags = flags,
                                .a = malloc(sizeof(pps_action) * 4 * cap)};
        cand[r] = all[r];
        cand[r].a = malloc(sizeof(pps_action) * 4 * cap);
        if (!comp[r] || !post[r] || !next[r] || !key[r] || !gap[r] || !reach[r] || !all[r].a ||
            !cand[r].a || order_two_way(kind, comp[r], &nc[r], p, m, r, !(flags & PPS_NO_SPLIT))) {
            rc = -1;
            break;
        }
        for (int i = 0; i < nc[r]; i++) {
            comp[r][i].stage = pps_stage(kind, p, comp[r][i].chunk, r);
            post[r][i] = key[r][i] = i;
        }
        if (v_post_order(kind, comp[r], nc[r], p, m, r, post[r], key[r])) rc = -1;
        if (!rc)
            all[r].n = emit(comp[r], nc[r], kind, p, 2, r, post[r], key[r], nc[r], scratch, gap[r],
                            all[r].a);
    }
    pps_sim sim;
    ust_err ignore;
    if (!rc && pps_simulate_reach(all, p, unit, &sim, reach, &ignore)) rc = -1;
    double best = sim.makespan;
    for (int round = 0; round < 16 && !rc; round++) {
        for (int r = 0; r < p; r++) {
            memcpy(next[r], post[r], sizeof(int) * nc[r]);
            v_place_rank(all, comp, nc, key, gap, reach, kind, p, r, next[r], scratch);
        }
        for (int r = 0; r < p; r++)
            cand[r].n = emit(comp[r], nc[r], kind, p, 2, r, next[r], key[r], nc[r], scratch, NULL,
                             cand[r].a);
        pps_sim cs;
        if (pps_simulate(cand, p, unit, &cs, &ignore) || cs.makespan >= best - 1e-9) break;
        best = cs.makespan;
        for (int r = 0; r < p; r++) {
            memcpy(post[r], next[r], sizeof(int) * nc[r]);
            all[r].n = emit(comp[r], nc[r], kind, p, 2, r, post[r], key[r], nc[r], scratch, gap[r],
                            all[r].a);
        }
        if (pps_simulate_reach(all, p, unit, &sim, reach, &ignore)) rc = -1;
    }
    for (int r = 0; r < p; r++) {
        free(comp[r]), free(post[r]), free(next[r]), free(key[r]), free(gap[r]), free(reach[r]);
        free(cand[r].a);
    }
    free(scratch);
    if (rc) pps_free_all(all, p);
    return rc ? ust_errf(e, "pp schedule %s: out of memory or no runnable placement",
                         pps_kind_name(kind))
              : 0;
}

const char *pps_op_name(pps_op op) {
    static const char *names[] = {"F",         "B",         "W",         "SEND_ACT",  "RECV_ACT",
                                  "SEND_GRAD", "RECV_GRAD", "LOCAL_ACT", "LOCAL_GRAD"};
    return (unsigned)op < sizeof names / sizeof *names ? names[op] : "?";
}

const char *pps_kind_name(ust_pp_schedule kind) {
    switch (kind) {
    case PP_AFAB:
        return "afab";
    case PP_1F1B:
        return "1f1b";
    case PP_INTERLEAVED:
        return "interleaved";
    case PP_ZB:
        return "zb";
    case PP_DUALPIPEV:
        return "dualpipev";
    case PP_DUALPIPE:
        return "dualpipe";
    }
    return "?";
}

int pps_splits(const pps_schedule *s) {
    for (int i = 0; i < s->n; i++)
        if (s->a[i].op == PPS_W) return 1;
    return 0;
}

double pps_analytic_bubble(ust_pp_schedule kind, int p, int v, int m, pps_costs c,
                           const char **formula) {
    const char *f;
    double x;
    switch (kind) {
    case PP_ZB:
        f = "ZB-H1 (p-1)(F+B-2W)/(m(F+B))";
        x = (p - 1) * (c.f + c.b - c.w) / (m * (c.f + c.b + c.w));
        break;
    case PP_DUALPIPEV:
        f = "DualPipeV (PP/2-1)(F&B+B-3W)/(2m(F+B)), PP = 2p";
        x = (p - 1) * (c.f + 2 * c.b - c.w) / (2.0 * m * (c.f + c.b + c.w));
        break;
    case PP_DUALPIPE:
        f = "DualPipe (PP/2-1)(F&B+B-3W)/(m(F+B)), PP = p";
        x = (p / 2 - 1) * (c.f + 2 * c.b - c.w) / ((double)m * (c.f + c.b + c.w));
        break;
    default:
        f = "(p-1)/(v*m)";
        x = (double)(p - 1) / ((double)v * m);
        break;
    }
    if (formula) *formula = f;
    return x;
}

/* pps_build's argument errors. */
static int check_args(ust_pp_schedule kind, int p, int v, int m, int rank, int flags, ust_err *e) {
    const char *name = pps_kind_name(kind);
    if (kind < PP_AFAB || kind > PP_DUALPIPE)
        return ust_errf(e, "pp schedule: unknown kind %d", kind);
    if (p < 1 || v < 1 || m < 1)
        return ust_errf(e, "pp schedule %s: pp (%d), vpp (%d) and micro-batches (%d) must be >= 1",
                        name, p, v, m);
    if (rank < 0 || rank >= p)
        return ust_errf(e, "pp schedule %s: rank %d outside 0..%d", name, rank, p - 1);
    cfg_pp_rule rule = cfg_pp_shape(kind, p, v, m); /* the config's rules, the one copy */
    if (rule != CFG_PP_OK)
        return ust_errf(e, "pp schedule %s: %s (pp %d, vpp %d, %d micro-batches)", name,
                        cfg_pp_rule_text(rule), p, v, m);
    if (two_way(kind) && p > PPS_MAX_P) /* its builder simulates every rank */
        return ust_errf(e, "pp schedule %s: pp = %d beyond %d", name, p, PPS_MAX_P);
    if ((flags & PPS_NO_SPLIT) && !two_way(kind))
        return ust_errf(
            e, "pp schedule %s: the no-split flag applies to dualpipev and dualpipe only", name);
    if ((flags & PPS_BREADTH_FIRST) && kind != PP_INTERLEAVED)
        return ust_errf(e, "pp schedule %s: breadth-first applies to interleaved only", name);
    return 0;
}

int pps_build(pps_schedule *s, ust_pp_schedule kind, int p, int v, int m, int rank, int flags,
              ust_err *e) {
    memset(s, 0, sizeof *s);
    if (check_args(kind, p, v, m, rank, flags, e)) return -1;
    if (two_way(kind)) { /* its receives are placed with every rank's schedule at hand */
        pps_schedule *every = calloc(p, sizeof *every);
        if (!every || v_build_all(every, kind, p, m, flags, e)) {
            free(every);
            return -1;
        }
        *s = every[rank];
        every[rank].a = NULL;
        pps_free_all(every, p);
        free(every);
        return 0;
    }

    int nc = 0, cap = 3 * m * v; /* F, B and W of every (mb, chunk) at most */
    pps_action *comp = malloc(sizeof *comp * cap);
    pps_action *all = malloc(sizeof *all * 4 * cap); /* + 2 transfers or a copy for F and B */
    if (!comp || !all) {
        free(comp), free(all);
        return ust_errf(e, "pp schedule: out of memory for %d actions", 3 * cap);
    }
    switch (kind) {
    case PP_AFAB:
        order_afab(comp, &nc, m);
        break;
    case PP_1F1B:
        order_1f1b(comp, &nc, p, m, rank);
        break;
    case PP_ZB:
        order_zb(comp, &nc, p, m, rank);
        break;
    case PP_INTERLEAVED:
        order_interleaved(comp, &nc, p, v, m, rank, flags & PPS_BREADTH_FIRST);
        break;
    default: /* dualpipev, dualpipe: built above */
        break;
    }
    *s = (pps_schedule){.kind = kind, .p = p, .v = v, .m = m, .rank = rank, .flags = flags};
    s->n = nc < 0 ? -1 : with_comm(comp, nc, kind, p, v, m, rank, flags & PPS_BREADTH_FIRST, all);
    s->a = all;
    free(comp);
    if (s->n < 0) {
        pps_free(s);
        return ust_errf(e, "pp schedule: out of memory");
    }
    return 0;
}

int pps_build_forward(pps_schedule *s, ust_pp_schedule kind, int p, int v, int m, int rank,
                      ust_err *e) {
    memset(s, 0, sizeof *s);
    if (check_args(kind, p, v, 2 * p, rank, 0, e)) return -1; /* any m >= 1 runs one at a time */
    if (m < 1) return ust_errf(e, "pp forward-only schedule: %d micro-batches", m);
    s->a = malloc(sizeof *s->a * 4 * (size_t)m * v); /* F, a receive, a send or a copy */
    if (!s->a) return ust_errf(e, "pp schedule: out of memory");
    *s = (pps_schedule){
        .kind = kind, .p = p, .v = v, .m = m, .rank = rank, .flags = PPS_FORWARD_ONLY, .a = s->a};
    for (int mb = 0; mb < m; mb++)
        for (int c = 0; c < v; c++) {
            pps_action f = {PPS_F, mb, c, pps_stage(kind, p, c, rank), -1, 0};
            if (pps_stage_first(kind, p, f.stage) != 0) continue; /* dualpipe's direction 1 */
            s->n += comm_of(f, 1, kind, p, v, rank, &s->a[s->n]);
            s->a[s->n++] = f;
            s->n += local_of(f, kind, p, v, rank, &s->a[s->n]);
            s->n += comm_of(f, 0, kind, p, v, rank, &s->a[s->n]);
        }
    return 0;
}

int pps_build_all(pps_schedule *all, ust_pp_schedule kind, int p, int v, int m, int flags,
                  ust_err *e) {
    if (two_way(kind)) { /* one placement for every rank at once */
        for (int r = 0; r < p; r++) memset(&all[r], 0, sizeof all[r]);
        return check_args(kind, p, v, m, 0, flags, e) || v_build_all(all, kind, p, m, flags, e) ? -1
                                                                                                : 0;
    }
    for (int r = 0; r < p; r++)
        if (pps_build(&all[r], kind, p, v, m, r, flags, e)) {
            pps_free_all(all, r);
            return -1;
        }
    return 0;
}

void pps_free(pps_schedule *s) {
    free(s->a);
    s->a = NULL;
    s->n = 0;
}

void pps_free_all(pps_schedule *all, int p) {
    for (int r = 0; r < p; r++) pps_free(&all[r]);
}

void pps_print(FILE *f, const pps_schedule *s) {
    fprintf(f, "# pp schedule %s%s%s%s: pp=%d vpp=%d micro-batches=%d rank=%d, %d actions\n",
            pps_kind_name(s->kind), s->flags & PPS_BREADTH_FIRST ? " (breadth-first)" : "",
            s->flags & PPS_NO_SPLIT ? " (no W split)" : "",
            s->flags & PPS_FORWARD_ONLY ? " (forward only)" : "", s->p, s->v, s->m, s->rank, s->n);
    for (int i = 0; i < s->n; i++) {
        const pps_action *a = &s->a[i];
        if (!is_comm(a->op))
            fprintf(f, "%4d %s mb=%d chunk=%d stage=%d%s\n", i, pps_op_name(a->op), a->mb, a->chunk,
                    a->stage, a->op == PPS_B && a->split && s->kind != PP_ZB ? " split" : "");
        else
            fprintf(f, "%4d %s mb=%d stage=%d %s=%d\n", i, pps_op_name(a->op), a->mb, a->stage,
                    a->op == PPS_SEND_ACT || a->op == PPS_SEND_GRAD ? "to" : "from", a->peer);
    }
}

/* ------------------------------------------------------------------ activation sets */

static int frees_slot(const pps_schedule *s, const pps_action *a) {
    if (s->flags & PPS_FORWARD_ONLY) return a->op == PPS_F; /* nothing is kept for a backward */
    return a->op == PPS_W || (a->op == PPS_B && !a->split);
}

void pps_slots(const pps_schedule *s, int *slot_of, int *slots) {
    int *held = malloc((size_t)s->m * s->v * sizeof *held); /* (mb, chunk) -> set or -1 */
    unsigned char *busy = calloc((size_t)s->v * (s->m + 1), 1);
    for (int i = 0; i < s->m * s->v; i++) held[i] = -1;
    for (int c = 0; c < s->v; c++) slots[c] = 0;
    for (int i = 0; i < s->n; i++) {
        const pps_action *a = &s->a[i];
        int key = a->mb * s->v + a->chunk;
        unsigned char *cb = busy + (size_t)a->chunk * (s->m + 1);
        if (held[key] < 0) {
            int k = 0;
            while (cb[k]) k++;
            cb[k] = 1;
            held[key] = k;
            if (k + 1 > slots[a->chunk]) slots[a->chunk] = k + 1;
        }
        if (slot_of) slot_of[i] = held[key];
        if (frees_slot(s, a)) cb[held[key]] = 0; /* the pair is done; its key is never seen again */
    }
    free(held);
    free(busy);
}
