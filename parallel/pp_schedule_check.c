/* pp_schedule_check: check and simulate pipeline schedules (see pp_schedule.h; pp_schedule.c
 * builds them). pps_check holds one rank's list to the rules the executor relies on,
 * pps_check_pairs matches the transfers across ranks, and pps_simulate runs the lists under the
 * header's communication rule, reporting the makespan, bubble and any deadlock. */
#include "pp_schedule.h"

#include <stdlib.h>
#include <string.h>

static double dmax(double a, double b) { return a > b ? a : b; }

static int is_comm(pps_op op) { return op >= PPS_SEND_ACT && op <= PPS_RECV_GRAD; }

static int is_local(pps_op op) { return op == PPS_LOCAL_ACT || op == PPS_LOCAL_GRAD; }

/* ---- checks -------------------------------------------------------------------------------- */

static int act_err(ust_err *e, const pps_schedule *s, int i, const char *what) {
    const pps_action *a = &s->a[i];
    return ust_errf(e, "pp schedule %s rank %d action %d (%s mb=%d chunk=%d stage=%d peer=%d): %s",
                    pps_kind_name(s->kind), s->rank, i, pps_op_name(a->op), a->mb, a->chunk,
                    a->stage, a->peer, what);
}

/* pps_check's record: at[op*nmc + mb*v + chunk] is the index of F, B, W (-1 until seen), then
 * (op 3..6) the counts of RECV_ACT, SEND_ACT, RECV_GRAD, SEND_GRAD that refer to (mb, chunk)
 * (a local copy counts as the receive of its consumer), then (7) whether its B is split. */

/* What every action must satisfy: a known op, (mb, chunk) in range, the stage of its chunk. */
static int check_fields(const pps_schedule *s, int i, ust_err *e) {
    const pps_action *a = &s->a[i];
    if ((unsigned)a->op > PPS_LOCAL_GRAD) return act_err(e, s, i, "unknown op");
    if (a->mb < 0 || a->mb >= s->m || a->chunk < 0 || a->chunk >= s->v)
        return act_err(e, s, i, "micro-batch or chunk out of range");
    if (a->stage != pps_stage(s->kind, s->p, a->chunk, s->rank))
        return act_err(e, s, i, "stage is not the one this rank holds as that chunk");
    if (!pps_chunk_runs(s->kind, s->p, s->m, a->mb, a->chunk, s->rank))
        return act_err(e, s, i, "the micro-batch runs in the other direction (dualpipe)");
    if (a->split && a->op != PPS_B) return act_err(e, s, i, "only a B is split");
    return 0;
}

/* A compute action runs once, after its inputs. Every failed input check is reported (the
 * message of the last one stays), as the checks do not stop one another. */
static int check_compute(const pps_schedule *s, int i, int *at, int nmc, ust_err *e) {
    const pps_action *a = &s->a[i];
    int p = s->p, v = s->v, k = a->mb * v + a->chunk, rc = 0;
    int may_split = s->kind == PP_ZB || s->kind == PP_DUALPIPEV || s->kind == PP_DUALPIPE;
    if (a->op == PPS_B && (s->kind == PP_ZB ? !a->split : a->split && !may_split))
        return act_err(e, s, i,
                       a->split ? "split B outside zb and the dualpipes" : "zb B not split");
    if (a->op == PPS_W && !may_split) return act_err(e, s, i, "W outside zb and the dualpipes");
    if (at[a->op * nmc + k] >= 0) return act_err(e, s, i, "runs twice");
    at[a->op * nmc + k] = i;
    if (a->op == PPS_B) at[7 * nmc + k] = a->split;
    /* inputs: B needs its F (and the gradient of stage+1), W its split B, F the previous stage */
    if (a->op == PPS_B && at[PPS_F * nmc + k] < 0) rc = act_err(e, s, i, "B before its F");
    if (a->op == PPS_W && at[PPS_B * nmc + k] < 0) rc = act_err(e, s, i, "W before its B");
    if (a->op == PPS_W && at[PPS_B * nmc + k] >= 0 && !at[7 * nmc + k])
        rc = act_err(e, s, i, "W of a B that was the whole backward");
    if (p == 1 && a->op == PPS_F && a->chunk > 0 && at[PPS_F * nmc + k - 1] < 0)
        rc = act_err(e, s, i, "F before the F of the previous chunk");
    if (p == 1 && a->op == PPS_B && a->chunk < v - 1 && at[PPS_B * nmc + k + 1] < 0)
        rc = act_err(e, s, i, "B before the B of the next chunk");
    return rc;
}

/* A transfer goes to the neighbouring stage's rank, after (send) or before (receive) the compute
 * it belongs to, once. */
static int check_transfer(const pps_schedule *s, int i, int *at, int nmc, ust_err *e) {
    const pps_action *a = &s->a[i];
    int p = s->p, r = s->rank, k = a->mb * s->v + a->chunk, rc = 0;
    if (p == 1) return act_err(e, s, i, "transfer with a single pipeline rank");
    int send = a->op == PPS_SEND_ACT || a->op == PPS_SEND_GRAD;
    int act = a->op == PPS_SEND_ACT || a->op == PPS_RECV_ACT;
    /* activations flow to stage+1, gradients to stage-1 */
    int to_next = act == send;
    if (to_next ? a->stage == pps_stage_last(s->kind, p, s->v, a->stage)
                : a->stage == pps_stage_first(s->kind, p, a->stage))
        return act_err(e, s, i, "no neighbouring stage in that direction");
    int peer = pps_stage_rank(s->kind, p, a->stage + (to_next ? 1 : -1));
    if (peer == r) return act_err(e, s, i, "transfer to a stage this rank holds itself");
    if (a->peer != peer) return act_err(e, s, i, "peer is not the neighbouring stage's rank");
    int producer = at[(act ? PPS_F : PPS_B) * nmc + k];
    if (send && producer < 0) rc = act_err(e, s, i, "send before the compute producing it");
    if (!send && producer >= 0) rc = act_err(e, s, i, "receive after the compute using it");
    int slot = (act ? 0 : 2) + send;
    if (++at[(3 + slot) * nmc + k] > 1) rc = act_err(e, s, i, "duplicate transfer");
    return rc;
}

/* A local copy (dualpipev's turn) hands (mb, its chunk) the output of the previous stage
 * (LOCAL_ACT) or the input gradient of the next one (LOCAL_GRAD), both on this rank: after the
 * producer, before the consumer, once. */
static int check_local(const pps_schedule *s, int i, int *at, int nmc, ust_err *e) {
    const pps_action *a = &s->a[i];
    int p = s->p, v = s->v, r = s->rank, act = a->op == PPS_LOCAL_ACT;
    int from = a->stage + (act ? -1 : 1);
    if (p == 1 || from < pps_stage_first(s->kind, p, a->stage) ||
        from > pps_stage_last(s->kind, p, v, a->stage) || pps_stage_rank(s->kind, p, from) != r)
        return act_err(e, s, i, "local copy from a stage this rank does not hold");
    int pc = -1; /* the producing chunk */
    for (int c = 0; c < v; c++)
        if (pps_stage(s->kind, p, c, r) == from) pc = c;
    int k = a->mb * v + a->chunk, kp = a->mb * v + pc;
    if (at[(act ? PPS_F : PPS_B) * nmc + kp] < 0)
        return act_err(e, s, i, "local copy before the compute producing it");
    if (at[(act ? PPS_F : PPS_B) * nmc + k] >= 0)
        return act_err(e, s, i, "local copy after the compute using it");
    if (++at[(act ? 3 : 5) * nmc + k] > 1) return act_err(e, s, i, "duplicate transfer");
    return 0;
}

/* Every (mb, chunk) got its F, B (and W when split) and exactly the transfers its stage needs:
 * a receive (or a local copy) of each input, a send of each output to another rank. */
static int check_complete(const pps_schedule *s, const int *at, int nmc, ust_err *e) {
    int p = s->p, v = s->v, r = s->rank;
    for (int k = 0; k < nmc; k++) {
        int mb = k / v, c = k % v, st = pps_stage(s->kind, p, c, r);
        int first = pps_stage_first(s->kind, p, st), last = pps_stage_last(s->kind, p, v, st);
        int split = at[7 * nmc + k];
        if (!pps_chunk_runs(s->kind, p, s->m, mb, c, r)) continue; /* the other direction's */
        const char *miss = at[PPS_F * nmc + k] < 0               ? "F"
                           : at[PPS_B * nmc + k] < 0             ? "B"
                           : (at[PPS_W * nmc + k] >= 0) != split ? "W"
                                                                 : NULL;
        int need_prev = p > 1 && st > first, need_next = p > 1 && st < last;
        int send_prev = need_prev && pps_stage_rank(s->kind, p, st - 1) != r;
        int send_next = need_next && pps_stage_rank(s->kind, p, st + 1) != r;
        if (!miss && at[3 * nmc + k] != need_prev) miss = "RECV_ACT";
        if (!miss && at[4 * nmc + k] != send_next) miss = "SEND_ACT";
        if (!miss && at[5 * nmc + k] != need_next) miss = "RECV_GRAD";
        if (!miss && at[6 * nmc + k] != send_prev) miss = "SEND_GRAD";
        if (miss)
            return ust_errf(e, "pp schedule %s rank %d: mb=%d chunk=%d has no %s (or an extra one)",
                            pps_kind_name(s->kind), r, mb, c, miss);
    }
    return 0;
}

int pps_check(const pps_schedule *s, ust_err *e) {
    int nmc = s->m * s->v;
    int *at = malloc(sizeof *at * 8 * nmc);
    if (!at) return ust_errf(e, "pp check: out of memory");
    for (int i = 0; i < 3 * nmc; i++) at[i] = -1;
    memset(at + 3 * nmc, 0, sizeof *at * 5 * nmc);
    int rc = 0;
    for (int i = 0; i < s->n && !rc; i++) {
        if ((rc = check_fields(s, i, e))) break;
        rc = is_comm(s->a[i].op)    ? check_transfer(s, i, at, nmc, e)
             : is_local(s->a[i].op) ? check_local(s, i, at, nmc, e)
                                    : check_compute(s, i, at, nmc, e);
    }
    if (!rc) rc = check_complete(s, at, nmc, e);
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

/* The simulation's state: every rank's program counter and clock, and what the ranks share
 * (finish times of the computes, post times of the transfers, the matching of the transfers). */
typedef struct {
    const pps_schedule *all;
    int p, m, S;
    pps_costs cost;
    pps_sim *out;
    double *fin; /* fin[(op*m + mb)*S + stage]: finish time of that compute, -1 until it ran */
    int *partner[PPS_MAX_P];
    double *posted[PPS_MAX_P]; /* time each comm action was posted, -1 before */
    int pc[PPS_MAX_P], in_batch[PPS_MAX_P], alive[PPS_MAX_P];
    int pend_lo[PPS_MAX_P], pend_hi[PPS_MAX_P]; /* a posted send-only batch not yet waited on */
    double clock[PPS_MAX_P];
    double *const *reach; /* NULL, or reach[r][i]: when rank r got to action i */
} sim;

#define FIN(x, op, mb, st) (x)->fin[((op) * (x)->m + (mb)) * (x)->S + (st)]

static int sim_init(sim *x, const pps_schedule *all, int p, pps_costs cost, pps_sim *out,
                    ust_err *e) {
    *x = (sim){.all = all, .p = p, .m = all[0].m, .S = p * all[0].v, .cost = cost, .out = out};
    x->fin = malloc(sizeof *x->fin * 3 * x->m * x->S);
    for (int r = 0; r < PPS_MAX_P; r++) x->pend_lo[r] = x->pend_hi[r] = -1;
    int rc = x->fin ? 0 : ust_errf(e, "pp simulate: out of memory");
    for (int r = 0; r < p && !rc; r++) {
        x->partner[r] = malloc(sizeof(int) * (all[r].n + 1));
        x->posted[r] = malloc(sizeof(double) * (all[r].n + 1));
        if (!x->partner[r] || !x->posted[r]) rc = ust_errf(e, "pp simulate: out of memory");
        for (int i = 0; !rc && i < all[r].n; i++) x->posted[r][i] = -1;
    }
    if (!rc) {
        for (int i = 0; i < 3 * x->m * x->S; i++) x->fin[i] = -1;
        rc = pair_up(all, p, x->partner, e);
    }
    return rc;
}

static void sim_free(sim *x) {
    free(x->fin);
    for (int r = 0; r < x->p; r++) free(x->partner[r]), free(x->posted[r]);
}

/* Runs rank r's compute action a once its inputs are finished; returns 0 while it waits. */
static int sim_compute(sim *x, int r, const pps_action *a) {
    double dep[2] = {0, 0};
    if (x->reach && x->reach[r][x->pc[r]] < 0) x->reach[r][x->pc[r]] = x->clock[r];
    int st = a->stage, kind = x->all[0].kind, v = x->all[0].v;
    if (a->op == PPS_F)
        dep[0] = st > pps_stage_first(kind, x->p, st) ? FIN(x, PPS_F, a->mb, st - 1) : 0;
    if (a->op == PPS_B) {
        dep[0] = FIN(x, PPS_F, a->mb, st);
        dep[1] = st < pps_stage_last(kind, x->p, v, st) ? FIN(x, PPS_B, a->mb, st + 1) : 0;
    }
    if (a->op == PPS_W) dep[0] = FIN(x, PPS_B, a->mb, st);
    if (dep[0] < 0 || dep[1] < 0) return 0;
    double c = a->op == PPS_F   ? x->cost.f
               : a->op == PPS_W ? x->cost.w
               : a->split       ? x->cost.b
                                : x->cost.b + x->cost.w; /* a whole backward */
    x->clock[r] = dmax(x->clock[r], dmax(dep[0], dep[1])) + c;
    FIN(x, a->op, a->mb, st) = x->clock[r];
    x->out->busy[r] += c;
    if (a->op == PPS_F && ++x->alive[r] > x->out->peak_alive[r])
        x->out->peak_alive[r] = x->alive[r];
    if (a->op == PPS_W || (a->op == PPS_B && !a->split)) x->alive[r]--;
    x->pc[r]++;
    return 1;
}

/* Posts rank r's batch at pc (after the send-only batch still running, which goes first on the
 * comm stream); returns 1 when it was a send-only batch (posted, the rank computes on while it
 * completes), 0 when it was posted and must be waited on, -1 when it cannot be posted yet. */
static int sim_post(sim *x, int r, int end) {
    const pps_schedule *s = &x->all[r];
    double t0;
    if (x->pend_lo[r] >= 0 &&
        !batch_done(x->all, r, x->pend_lo[r], x->pend_hi[r], x->partner, x->posted, &t0))
        return -1;
    double post = x->pend_lo[r] >= 0 ? dmax(x->clock[r], t0) : x->clock[r];
    x->pend_lo[r] = -1;
    for (int i = x->pc[r]; i < end; i++) x->posted[r][i] = post;
    for (int i = x->pc[r]; x->reach && i < end; i++) x->reach[r][i] = post;
    int sends_only = 1;
    for (int i = x->pc[r]; i < end; i++)
        sends_only &= s->a[i].op == PPS_SEND_ACT || s->a[i].op == PPS_SEND_GRAD;
    if (!sends_only) return 0;
    x->pend_lo[r] = x->pc[r], x->pend_hi[r] = end;
    x->pc[r] = end;
    return 1;
}

/* Moves rank r's comm batch at pc as far as it goes: post it, then complete it once every
 * counterpart is posted. Sets *moved on any progress; returns 0 when the rank must wait. */
static int sim_comm(sim *x, int r, int *moved) {
    const pps_schedule *s = &x->all[r];
    int end = x->pc[r];
    while (end < s->n && is_comm(s->a[end].op)) end++;
    if (!x->in_batch[r]) {
        int posted = sim_post(x, r, end);
        if (posted < 0) return 0;
        *moved = 1;
        if (posted) return 1;
        x->in_batch[r] = 1;
    }
    double t;
    if (!batch_done(x->all, r, x->pc[r], end, x->partner, x->posted, &t)) return 0;
    x->clock[r] = dmax(x->clock[r], t); /* transfers are free: done when both sides posted */
    x->pc[r] = end;
    x->in_batch[r] = 0;
    *moved = 1;
    return 1;
}

/* Runs rank r until it waits; returns 1 while it has work left (actions or sends in flight). */
static int sim_rank(sim *x, int r, int *moved) {
    const pps_schedule *s = &x->all[r];
    while (x->pc[r] < s->n) {
        const pps_action *a = &s->a[x->pc[r]];
        if (is_local(a->op)) { /* a copy on the rank: its producer ran, the stage order holds */
            x->pc[r]++;
            *moved = 1;
        } else if (!is_comm(a->op)) {
            if (!sim_compute(x, r, a)) break;
            *moved = 1;
        } else if (!sim_comm(x, r, moved)) {
            break;
        }
    }
    if (x->pc[r] == s->n && x->pend_lo[r] >= 0) { /* the step ends when its sends are done */
        double t;
        if (batch_done(x->all, r, x->pend_lo[r], x->pend_hi[r], x->partner, x->posted, &t)) {
            x->clock[r] = dmax(x->clock[r], t);
            x->pend_lo[r] = -1;
            *moved = 1;
        }
    }
    return x->pc[r] < s->n || x->pend_lo[r] >= 0;
}

/* The deadlock message: where each rank that is not done waits. */
static int sim_deadlock(const sim *x, ust_err *e) {
    const pps_schedule *all = x->all;
    int n = snprintf(e ? e->msg : NULL, e ? sizeof e->msg : 0,
                     "pp schedule %s deadlocks:", pps_kind_name(all[0].kind));
    for (int r = 0; r < x->p && e && n < (int)sizeof e->msg; r++)
        if (x->pc[r] < all[r].n || x->pend_lo[r] >= 0) {
            const pps_action *a = &all[r].a[x->pc[r] < all[r].n ? x->pc[r] : x->pend_lo[r]];
            n += snprintf(e->msg + n, sizeof e->msg - n,
                          " rank %d waits at action %d (%s mb=%d stage=%d);", r,
                          (int)(a - all[r].a), pps_op_name(a->op), a->mb, a->stage);
        }
    return -1;
}

static void sim_report(const sim *x) {
    pps_sim *out = x->out;
    for (int r = 0; r < x->p; r++) out->makespan = dmax(out->makespan, x->clock[r]);
    for (int r = 0; r < x->p; r++) {
        double idle = out->makespan - out->busy[r];
        if (out->busy[r] > 0) out->bubble = dmax(out->bubble, idle / out->busy[r]);
        if (out->makespan > 0) out->idle_frac = dmax(out->idle_frac, idle / out->makespan);
    }
}

int pps_simulate(const pps_schedule *all, int p, pps_costs cost, pps_sim *out, ust_err *e) {
    return pps_simulate_reach(all, p, cost, out, NULL, e);
}

int pps_simulate_reach(const pps_schedule *all, int p, pps_costs cost, pps_sim *out,
                       double *const *reach, ust_err *e) {
    memset(out, 0, sizeof *out);
    if (p < 1 || p > PPS_MAX_P)
        return ust_errf(e, "pp simulate: pp = %d outside 1..%d", p, PPS_MAX_P);
    if (pps_check_pairs(all, p, e)) return -1;
    sim x;
    int rc = sim_init(&x, all, p, cost, out, e);
    x.reach = reach;
    for (int r = 0; reach && r < p; r++)
        for (int i = 0; i < all[r].n; i++) reach[r][i] = -1;
    /* Round-robin until every rank is done; a round where no rank moves is a deadlock. */
    for (int done = 0; !rc && !done;) {
        int moved = 0;
        done = 1;
        for (int r = 0; r < p; r++)
            if (sim_rank(&x, r, &moved)) done = 0;
        if (!done && !moved) rc = sim_deadlock(&x, e);
    }
    if (!rc) sim_report(&x);
    sim_free(&x);
    return rc;
}
#undef FIN

int pps_dataflow(const pps_schedule *all, int p, pps_costs c, double *bubble, ust_err *e) {
    *bubble = 0;
    if (p < 1 || p > PPS_MAX_P)
        return ust_errf(e, "pp dataflow: pp = %d outside 1..%d", p, PPS_MAX_P);
    if (pps_check_pairs(all, p, e)) return -1;
    sim x = {.all = all, .p = p, .m = all[0].m, .S = p * all[0].v, .cost = c};
    pps_sim out = {0};
    x.out = &out;
    x.fin = malloc(sizeof *x.fin * 3 * x.m * x.S);
    if (!x.fin) return ust_errf(e, "pp dataflow: out of memory");
    for (int i = 0; i < 3 * x.m * x.S; i++) x.fin[i] = -1;
    int moved = 1, left = 1;
    while (moved && left) { /* each rank's computes in its order, skipping the transfers */
        moved = 0, left = 0;
        for (int r = 0; r < p; r++) {
            while (x.pc[r] < all[r].n) {
                const pps_action *a = &all[r].a[x.pc[r]];
                if (is_comm(a->op) || is_local(a->op)) {
                    x.pc[r]++;
                    continue;
                }
                if (!sim_compute(&x, r, a)) break;
                moved = 1;
            }
            left |= x.pc[r] < all[r].n;
        }
    }
    int rc = left ? ust_errf(e, "pp schedule %s: compute orders wait on each other in a cycle",
                             pps_kind_name(all[0].kind))
                  : 0;
    if (!rc) {
        sim_report(&x);
        *bubble = out.bubble;
    }
    free(x.fin);
    return rc;
}
