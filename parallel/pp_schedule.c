/* pp_schedule: build and print pipeline schedules (see pp_schedule.h; pp_schedule_check.c checks
 * and simulates them). Each builder below writes one rank's compute order; with_comm then adds
 * the transfers around it. */
#include "pp_schedule.h"

#include <stdlib.h>
#include <string.h>

static int imin(int a, int b) { return a < b ? a : b; }

static int is_comm(pps_op op) { return op >= PPS_SEND_ACT; }

enum { STEP_JOIN = -2 }; /* marks a compute that shares the previous one's comm step */

static void push(pps_action *a, int *n, pps_op op, int mb, int chunk) {
    a[(*n)++] = (pps_action){.op = op, .mb = mb, .chunk = chunk, .stage = -1, .peer = -1};
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
        push(a, n, PPS_B, i, 0);
        if (i >= r) push(a, n, PPS_W, next_w++, 0);
    }
    for (int i = m - w; i < m; i++) {
        push(a, n, PPS_B, i, 0);
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

/* ---- transfers ----------------------------------------------------------------------------- */

/* One transfer of compute x (stage already set), or nothing: RECV_* before x, SEND_* after. */
static int comm_of(pps_action x, int before, int p, int v, int r, pps_action *out) {
    int last = p * v - 1, prev = (r - 1 + p) % p, next = (r + 1) % p;
    pps_action c = x;
    if (p == 1 || x.op == PPS_W) return 0;
    if (x.op == PPS_F && before && x.stage > 0)
        c.op = PPS_RECV_ACT, c.peer = prev;
    else if (x.op == PPS_F && !before && x.stage < last)
        c.op = PPS_SEND_ACT, c.peer = next;
    else if (x.op == PPS_B && before && x.stage < last)
        c.op = PPS_RECV_GRAD, c.peer = next;
    else if (x.op == PPS_B && !before && x.stage > 0)
        c.op = PPS_SEND_GRAD, c.peer = prev;
    else
        return 0;
    *out = c;
    return 1;
}

/* The computes are cut into steps (a compute pushed with STEP_JOIN belongs to the previous
 * one's step). A step's receives go right before it and its sends right after it, so between two
 * steps the sends of the first and the receives of the second form one batch: two neighbours
 * that both send to each other (one a forward result, the other a backward one) meet in one
 * batch instead of each waiting for the other's receive. 1F1B uses one compute per step
 * (Megatron's send_forward_recv_backward); interleaved runs its steady F and B as one step
 * (Megatron's send_forward_backward_recv_forward_backward), because with p = 2 both ranks send
 * to each other in both directions. */
static int with_comm(pps_action *comp, int nc, int p, int v, int m, int r, int breadth,
                     pps_action *out) {
    /* Breadth-first: the first chunk of micro-batch k comes back round the ring (rank p-1 ->
     * rank 0) while rank 0 still has m-p forwards of the earlier chunk to run (in backward,
     * rank 0 -> rank p-1 alike). A receive posted only right before its consumer would leave
     * rank p-1 blocked in its send; post it m-p computes earlier instead, in the batch rank 0
     * runs while rank p-1 sends it. Everywhere else early = 0. */
    int early = breadth && m > p ? m - p : 0;
    int *post_at = malloc(sizeof *post_at * (nc + 1));
    if (!post_at) return -1;
    for (int i = 0; i < nc; i++) {
        comp[i].stage = comp[i].chunk * p + r;
        int wrap = (r == 0 && comp[i].op == PPS_F && comp[i].chunk > 0) ||
                   (r == p - 1 && comp[i].op == PPS_B && comp[i].chunk < v - 1);
        post_at[i] = wrap ? i - early : i;
    }
    int n = 0;
    for (int i = 0, j; i < nc; i = j) {
        for (j = i + 1; j < nc && comp[j].peer == STEP_JOIN; j++) {
        }
        for (int q = i; q < nc && q < j + early; q++)
            if (post_at[q] >= i && post_at[q] < j) n += comm_of(comp[q], 1, p, v, r, &out[n]);
        for (int k = i; k < j; k++) out[n] = comp[k], out[n++].peer = -1;
        for (int k = i; k < j; k++) n += comm_of(comp[k], 0, p, v, r, &out[n]);
    }
    free(post_at);
    return n;
}

const char *pps_op_name(pps_op op) {
    static const char *names[] = {"F", "B", "W", "SEND_ACT", "RECV_ACT", "SEND_GRAD", "RECV_GRAD"};
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
    }
    return "?";
}

int pps_build(pps_schedule *s, ust_pp_schedule kind, int p, int v, int m, int rank, int flags,
              ust_err *e) {
    memset(s, 0, sizeof *s);
    const char *name = pps_kind_name(kind);
    if (kind < PP_AFAB || kind > PP_ZB) return ust_errf(e, "pp schedule: unknown kind %d", kind);
    if (p < 1 || v < 1 || m < 1)
        return ust_errf(e, "pp schedule %s: pp (%d), vpp (%d) and micro-batches (%d) must be >= 1",
                        name, p, v, m);
    if (rank < 0 || rank >= p)
        return ust_errf(e, "pp schedule %s: rank %d outside 0..%d", name, rank, p - 1);
    if (kind != PP_INTERLEAVED && v != 1)
        return ust_errf(e, "pp schedule %s: vpp = %d needs pp_schedule: interleaved", name, v);
    if (kind == PP_INTERLEAVED && m % p != 0)
        return ust_errf(e,
                        "pp schedule interleaved: micro-batches (%d) must be a multiple of pp "
                        "(%d), e.g. %d",
                        m, p, (m + p - 1) / p * p);
    if ((flags & PPS_BREADTH_FIRST) && kind != PP_INTERLEAVED)
        return ust_errf(e, "pp schedule %s: breadth-first applies to interleaved only", name);

    int nc = 0, cap = 3 * m * v; /* F, B and W of every (mb, chunk) at most */
    pps_action *comp = malloc(sizeof *comp * cap);
    pps_action *all = malloc(sizeof *all * 3 * cap);
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
    }
    *s = (pps_schedule){.kind = kind, .p = p, .v = v, .m = m, .rank = rank, .flags = flags};
    s->n = with_comm(comp, nc, p, v, m, rank, flags & PPS_BREADTH_FIRST, all);
    s->a = all;
    free(comp);
    if (s->n < 0) {
        pps_free(s);
        return ust_errf(e, "pp schedule: out of memory");
    }
    return 0;
}

int pps_build_all(pps_schedule *all, ust_pp_schedule kind, int p, int v, int m, int flags,
                  ust_err *e) {
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
    fprintf(f, "# pp schedule %s%s: pp=%d vpp=%d micro-batches=%d rank=%d, %d actions\n",
            pps_kind_name(s->kind), s->flags & PPS_BREADTH_FIRST ? " (breadth-first)" : "", s->p,
            s->v, s->m, s->rank, s->n);
    for (int i = 0; i < s->n; i++) {
        const pps_action *a = &s->a[i];
        if (!is_comm(a->op))
            fprintf(f, "%4d %s mb=%d chunk=%d stage=%d\n", i, pps_op_name(a->op), a->mb, a->chunk,
                    a->stage);
        else
            fprintf(f, "%4d %s mb=%d stage=%d %s=%d\n", i, pps_op_name(a->op), a->mb, a->stage,
                    a->op == PPS_SEND_ACT || a->op == PPS_SEND_GRAD ? "to" : "from", a->peer);
    }
}

/* ------------------------------------------------------------------ activation sets */

static int frees_slot(const pps_schedule *s, const pps_action *a) {
    return a->op == (s->kind == PP_ZB ? PPS_W : PPS_B);
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
