/* pp_schedule: build, check, print and simulate pipeline schedules (see pp_schedule.h). Each
 * builder below writes one rank's compute order; with_comm then adds the transfers around it. */
#include "pp_schedule.h"

#include <stdlib.h>
#include <string.h>

static int imin(int a, int b) { return a < b ? a : b; }
static double dmax(double a, double b) { return a > b ? a : b; }

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

/* ---- checks -------------------------------------------------------------------------------- */

static int act_err(ust_err *e, const pps_schedule *s, int i, const char *what) {
    const pps_action *a = &s->a[i];
    return ust_errf(e, "pp schedule %s rank %d action %d (%s mb=%d chunk=%d stage=%d peer=%d): %s",
                    pps_kind_name(s->kind), s->rank, i, pps_op_name(a->op), a->mb, a->chunk,
                    a->stage, a->peer, what);
}

int pps_check(const pps_schedule *s, ust_err *e) {
    int p = s->p, v = s->v, m = s->m, r = s->rank, nmc = m * v, last = p * v - 1;
    int zb = s->kind == PP_ZB;
    /* at[op][mb*v + chunk]: index of F, B, W; then counts of RECV_ACT, SEND_ACT, RECV_GRAD,
     * SEND_GRAD that refer to (mb, chunk). */
    int *at = malloc(sizeof *at * 7 * nmc);
    if (!at) return ust_errf(e, "pp check: out of memory");
    for (int i = 0; i < 3 * nmc; i++) at[i] = -1;
    memset(at + 3 * nmc, 0, sizeof *at * 4 * nmc);
    int rc = 0;
    for (int i = 0; i < s->n && !rc; i++) {
        const pps_action *a = &s->a[i];
        if ((unsigned)a->op > PPS_RECV_GRAD) {
            rc = act_err(e, s, i, "unknown op");
            break;
        }
        if (a->mb < 0 || a->mb >= m || a->chunk < 0 || a->chunk >= v) {
            rc = act_err(e, s, i, "micro-batch or chunk out of range");
            break;
        }
        if (a->stage != a->chunk * p + r) {
            rc = act_err(e, s, i, "stage != chunk*p + rank");
            break;
        }
        int k = a->mb * v + a->chunk;
        if (!is_comm(a->op)) {
            if (a->op == PPS_W && !zb) {
                rc = act_err(e, s, i, "W outside a zb schedule");
                break;
            }
            if (at[a->op * nmc + k] >= 0) {
                rc = act_err(e, s, i, "runs twice");
                break;
            }
            at[a->op * nmc + k] = i;
            /* inputs: B needs its F (and the gradient of stage+1), W its B, F the previous stage */
            if (a->op == PPS_B && at[PPS_F * nmc + k] < 0) rc = act_err(e, s, i, "B before its F");
            if (a->op == PPS_W && at[PPS_B * nmc + k] < 0) rc = act_err(e, s, i, "W before its B");
            if (p == 1 && a->op == PPS_F && a->chunk > 0 && at[PPS_F * nmc + k - 1] < 0)
                rc = act_err(e, s, i, "F before the F of the previous chunk");
            if (p == 1 && a->op == PPS_B && a->chunk < v - 1 && at[PPS_B * nmc + k + 1] < 0)
                rc = act_err(e, s, i, "B before the B of the next chunk");
            continue;
        }
        if (p == 1) {
            rc = act_err(e, s, i, "transfer with a single pipeline rank");
            break;
        }
        int send = a->op == PPS_SEND_ACT || a->op == PPS_SEND_GRAD;
        int act = a->op == PPS_SEND_ACT || a->op == PPS_RECV_ACT;
        /* activations flow to stage+1, gradients to stage-1 */
        int to_next = act == send;
        if (a->peer != (to_next ? (r + 1) % p : (r - 1 + p) % p)) {
            rc = act_err(e, s, i, "peer is not the neighbouring stage's rank");
            break;
        }
        if (to_next ? a->stage == last : a->stage == 0) {
            rc = act_err(e, s, i, "no neighbouring stage in that direction");
            break;
        }
        int producer = at[(act ? PPS_F : PPS_B) * nmc + k];
        if (send && producer < 0) rc = act_err(e, s, i, "send before the compute producing it");
        if (!send && producer >= 0) rc = act_err(e, s, i, "receive after the compute using it");
        int slot = (act ? 0 : 2) + send;
        if (++at[(3 + slot) * nmc + k] > 1) rc = act_err(e, s, i, "duplicate transfer");
    }
    for (int k = 0; k < nmc && !rc; k++) {
        int mb = k / v, c = k % v, st = c * p + r;
        const char *miss = at[PPS_F * nmc + k] < 0         ? "F"
                           : at[PPS_B * nmc + k] < 0       ? "B"
                           : zb && at[PPS_W * nmc + k] < 0 ? "W"
                                                           : NULL;
        int need_prev = p > 1 && st > 0, need_next = p > 1 && st < last;
        if (!miss && at[3 * nmc + k] != need_prev) miss = "RECV_ACT";
        if (!miss && at[4 * nmc + k] != need_next) miss = "SEND_ACT";
        if (!miss && at[5 * nmc + k] != need_next) miss = "RECV_GRAD";
        if (!miss && at[6 * nmc + k] != need_prev) miss = "SEND_GRAD";
        if (miss)
            rc = ust_errf(e, "pp schedule %s rank %d: mb=%d chunk=%d has no %s (or an extra one)",
                          pps_kind_name(s->kind), r, mb, c, miss);
    }
    free(at);
    return rc;
}

/* Matches the k-th send from a to b with the k-th receive on b from a, for every ordered pair;
 * partner[r][i] (when partner != NULL) gets the index of action i's counterpart on its peer. */
static int pair_up(const pps_schedule *all, int p, int **partner, ust_err *e) {
    for (int a = 0; a < p; a++)
        for (int b = 0; b < p; b++) {
            if (a == b) continue;
            const pps_schedule *sa = &all[a], *sb = &all[b];
            int i = 0, j = 0;
            for (;;) {
                while (i < sa->n &&
                       !((sa->a[i].op == PPS_SEND_ACT || sa->a[i].op == PPS_SEND_GRAD) &&
                         sa->a[i].peer == b))
                    i++;
                while (j < sb->n &&
                       !((sb->a[j].op == PPS_RECV_ACT || sb->a[j].op == PPS_RECV_GRAD) &&
                         sb->a[j].peer == a))
                    j++;
                if (i == sa->n && j == sb->n) break;
                if (i == sa->n || j == sb->n)
                    return i < sa->n ? act_err(e, sa, i, "send never received")
                                     : act_err(e, sb, j, "receive never sent");
                const pps_action *x = &sa->a[i], *y = &sb->a[j];
                int ok =
                    x->mb == y->mb &&
                    ((x->op == PPS_SEND_ACT && y->op == PPS_RECV_ACT && y->stage == x->stage + 1) ||
                     (x->op == PPS_SEND_GRAD && y->op == PPS_RECV_GRAD &&
                      y->stage == x->stage - 1));
                if (!ok) {
                    char why[160];
                    snprintf(why, sizeof why,
                             "matched in posting order with rank %d action %d (%s mb=%d stage=%d)",
                             b, j, pps_op_name(y->op), y->mb, y->stage);
                    return act_err(e, sa, i, why);
                }
                if (partner) partner[a][i] = j, partner[b][j] = i;
                i++, j++;
            }
        }
    return 0;
}

int pps_check_pairs(const pps_schedule *all, int p, ust_err *e) {
    for (int r = 0; r < p; r++) {
        const pps_schedule *s = &all[r];
        if (s->p != p || s->rank != r || s->v != all[0].v || s->m != all[0].m ||
            s->kind != all[0].kind)
            return ust_errf(e,
                            "pp schedules: entry %d is rank %d of pp=%d vpp=%d m=%d %s, "
                            "expected rank %d of pp=%d like entry 0",
                            r, s->rank, s->p, s->v, s->m, pps_kind_name(s->kind), r, p);
        if (pps_check(s, e)) return -1;
    }
    return pair_up(all, p, NULL, e);
}

/* ---- simulation ---------------------------------------------------------------------------- */

/* True when every transfer of all[r].a[lo..hi) has its counterpart posted; *t: the latest post. */
static int batch_done(const pps_schedule *all, int r, int lo, int hi, int *const *partner,
                      double *const *posted, double *t) {
    *t = 0;
    for (int i = lo; i < hi; i++) {
        double pt = posted[all[r].a[i].peer][partner[r][i]];
        if (pt < 0) return 0;
        *t = dmax(*t, pt);
        *t = dmax(*t, posted[r][i]);
    }
    return 1;
}

int pps_simulate(const pps_schedule *all, int p, pps_costs cost, pps_sim *out, ust_err *e) {
    memset(out, 0, sizeof *out);
    if (p < 1 || p > PPS_MAX_P)
        return ust_errf(e, "pp simulate: pp = %d outside 1..%d", p, PPS_MAX_P);
    if (pps_check_pairs(all, p, e)) return -1;
    int v = all[0].v, m = all[0].m, S = p * v, zb = all[0].kind == PP_ZB;
    /* fin[(op*m + mb)*S + stage]: finish time of that compute, -1 until it ran */
    double *fin = malloc(sizeof *fin * 3 * m * S);
    int *partner[PPS_MAX_P] = {0};
    double *posted[PPS_MAX_P] = {0}; /* time each comm action was posted, -1 before */
    int pc[PPS_MAX_P] = {0}, in_batch[PPS_MAX_P] = {0}, alive[PPS_MAX_P] = {0};
    int pend_lo[PPS_MAX_P], pend_hi[PPS_MAX_P]; /* a posted send-only batch not yet waited on */
    for (int r = 0; r < PPS_MAX_P; r++) pend_lo[r] = pend_hi[r] = -1;
    double clock[PPS_MAX_P] = {0};
    int rc = fin ? 0 : ust_errf(e, "pp simulate: out of memory");
    for (int r = 0; r < p && !rc; r++) {
        partner[r] = malloc(sizeof(int) * (all[r].n + 1));
        posted[r] = malloc(sizeof(double) * (all[r].n + 1));
        if (!partner[r] || !posted[r]) rc = ust_errf(e, "pp simulate: out of memory");
        for (int i = 0; !rc && i < all[r].n; i++) posted[r][i] = -1;
    }
    if (!rc) {
        for (int i = 0; i < 3 * m * S; i++) fin[i] = -1;
        rc = pair_up(all, p, partner, e);
    }
#define FIN(op, mb, st) fin[((op)*m + (mb)) * S + (st)]
    /* Round-robin until every rank is done; a round where no rank moves is a deadlock. */
    for (int done = 0; !rc && !done;) {
        int moved = 0;
        done = 1;
        for (int r = 0; r < p; r++) {
            const pps_schedule *s = &all[r];
            while (pc[r] < s->n) {
                const pps_action *a = &s->a[pc[r]];
                if (!is_comm(a->op)) {
                    double dep[2] = {0, 0};
                    int st = a->stage;
                    if (a->op == PPS_F) dep[0] = st > 0 ? FIN(PPS_F, a->mb, st - 1) : 0;
                    if (a->op == PPS_B) {
                        dep[0] = FIN(PPS_F, a->mb, st);
                        dep[1] = st < S - 1 ? FIN(PPS_B, a->mb, st + 1) : 0;
                    }
                    if (a->op == PPS_W) dep[0] = FIN(PPS_B, a->mb, st);
                    if (dep[0] < 0 || dep[1] < 0) break;
                    double c = a->op == PPS_F ? cost.f : a->op == PPS_B ? cost.b : cost.w;
                    clock[r] = dmax(clock[r], dmax(dep[0], dep[1])) + c;
                    FIN(a->op, a->mb, st) = clock[r];
                    out->busy[r] += c;
                    if (a->op == PPS_F && ++alive[r] > out->peak_alive[r])
                        out->peak_alive[r] = alive[r];
                    if (a->op == (zb ? PPS_W : PPS_B)) alive[r]--;
                    pc[r]++;
                    moved = 1;
                    continue;
                }
                int end = pc[r];
                while (end < s->n && is_comm(s->a[end].op)) end++;
                if (!in_batch[r]) {
                    /* a send-only batch still running goes first on the comm stream */
                    double t0;
                    if (pend_lo[r] >= 0 &&
                        !batch_done(all, r, pend_lo[r], pend_hi[r], partner, posted, &t0))
                        break;
                    double post = pend_lo[r] >= 0 ? dmax(clock[r], t0) : clock[r];
                    pend_lo[r] = -1;
                    for (int i = pc[r]; i < end; i++) posted[r][i] = post;
                    moved = 1;
                    int sends_only = 1;
                    for (int i = pc[r]; i < end; i++)
                        sends_only &= s->a[i].op == PPS_SEND_ACT || s->a[i].op == PPS_SEND_GRAD;
                    if (sends_only) { /* posted; the rank computes on while it completes */
                        pend_lo[r] = pc[r], pend_hi[r] = end;
                        pc[r] = end;
                        continue;
                    }
                    in_batch[r] = 1;
                }
                double t;
                if (!batch_done(all, r, pc[r], end, partner, posted, &t)) break;
                clock[r] = dmax(clock[r], t); /* transfers are free: done when both sides posted */
                pc[r] = end;
                in_batch[r] = 0;
                moved = 1;
            }
            if (pc[r] == s->n && pend_lo[r] >= 0) { /* the step ends when its sends are done */
                double t;
                if (batch_done(all, r, pend_lo[r], pend_hi[r], partner, posted, &t)) {
                    clock[r] = dmax(clock[r], t);
                    pend_lo[r] = -1;
                    moved = 1;
                }
            }
            if (pc[r] < s->n || pend_lo[r] >= 0) done = 0;
        }
        if (!done && !moved) {
            int n = snprintf(e ? e->msg : NULL, e ? sizeof e->msg : 0,
                             "pp schedule %s deadlocks:", pps_kind_name(all[0].kind));
            for (int r = 0; r < p && e && n < (int)sizeof e->msg; r++)
                if (pc[r] < all[r].n || pend_lo[r] >= 0) {
                    const pps_action *a = &all[r].a[pc[r] < all[r].n ? pc[r] : pend_lo[r]];
                    n += snprintf(e->msg + n, sizeof e->msg - n,
                                  " rank %d waits at action %d (%s mb=%d stage=%d);", r,
                                  (int)(a - all[r].a), pps_op_name(a->op), a->mb, a->stage);
                }
            rc = -1;
        }
    }
#undef FIN
    if (!rc) {
        for (int r = 0; r < p; r++) out->makespan = dmax(out->makespan, clock[r]);
        for (int r = 0; r < p; r++) {
            double idle = out->makespan - out->busy[r];
            if (out->busy[r] > 0) out->bubble = dmax(out->bubble, idle / out->busy[r]);
            if (out->makespan > 0) out->idle_frac = dmax(out->idle_frac, idle / out->makespan);
        }
    }
    free(fin);
    for (int r = 0; r < p; r++) free(partner[r]), free(posted[r]);
    return rc;
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
