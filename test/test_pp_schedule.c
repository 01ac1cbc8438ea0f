/* Pipeline schedules as data: every schedule over a grid of (p, v, m) is well-formed, pairs its
 * transfers, runs to the end in the unit-cost simulator, and has the memory and bubble the
 * literature gives. Unit costs: F = 1 and B = 2 (a backward is about twice a forward) for afab,
 * 1f1b and interleaved (per chunk); for zb the same backward split as B = 1 (input gradient) +
 * W = 1 (weight gradient), so every schedule does the same 3 units of work per (mb, chunk).
 * Bubble = idle / busy on a rank (the Playbook's bubble time over ideal time); all ranks do the
 * same work, so every rank has the same bubble. Times are small integers: exact comparisons. */
#include "pp_schedule.h"
#include "test.h"

static const pps_costs COST = {.f = 1, .b = 2, .w = 0};
static const pps_costs COST_ZB = {.f = 1, .b = 1, .w = 1};

static pps_costs cost_of(ust_pp_schedule k) { return k == PP_ZB ? COST_ZB : COST; }

static const int PS[] = {1, 2, 4}, MS[] = {1, 2, 4, 8, 16};
#define N(a) (int)(sizeof a / sizeof *a)

/* Builds all ranks, checks them and simulates; fails the test with the message on error. */
#define BUILD_SIM(all, kind, p, v, m, flags, sim)                                                  \
    do {                                                                                           \
        ust_err e_ = {{0}};                                                                        \
        CHECK(pps_build_all(all, kind, p, v, m, flags, &e_) == 0, "%s p=%d v=%d m=%d: %s",         \
              pps_kind_name(kind), p, v, m, e_.msg);                                               \
        int rc_ = pps_check_pairs(all, p, &e_);                                                    \
        if (!rc_) rc_ = pps_simulate(all, p, cost_of(kind), &(sim), &e_);                          \
        pps_free_all(all, p);                                                                      \
        CHECK(rc_ == 0, "%s p=%d v=%d m=%d: %s", pps_kind_name(kind), p, v, m, e_.msg);            \
    } while (0)

static void test_every_schedule_in_the_grid_is_well_formed_and_runs_to_the_end(void) {
    ust_pp_schedule kinds[] = {PP_AFAB, PP_1F1B, PP_INTERLEAVED, PP_ZB};
    pps_schedule all[4];
    int cases = 0;
    for (int ki = 0; ki < N(kinds); ki++)
        for (int pi = 0; pi < N(PS); pi++)
            for (int v = 1; v <= (kinds[ki] == PP_INTERLEAVED ? 2 : 1); v++)
                for (int bf = 0; bf <= (kinds[ki] == PP_INTERLEAVED); bf++)
                    for (int mi = 0; mi < N(MS); mi++) {
                        int p = PS[pi], m = MS[mi];
                        if (kinds[ki] == PP_INTERLEAVED && m % p) continue;
                        pps_sim sim;
                        BUILD_SIM(all, kinds[ki], p, v, m, bf ? PPS_BREADTH_FIRST : 0, sim);
                        /* every rank does all its work: 3 units per (mb, chunk) */
                        for (int r = 0; r < p; r++)
                            CHECK(sim.busy[r] == 3.0 * m * v, "%s p=%d m=%d rank %d busy %g",
                                  pps_kind_name(kinds[ki]), p, m, r, sim.busy[r]);
                        cases++;
                    }
    CHECK(cases > 60, "only %d cases", cases);
}

static void test_afab_holds_all_m_activations_on_every_rank(void) {
    pps_schedule all[4];
    for (int pi = 0; pi < N(PS); pi++)
        for (int mi = 0; mi < N(MS); mi++) {
            int p = PS[pi], m = MS[mi];
            pps_sim sim;
            BUILD_SIM(all, PP_AFAB, p, 1, m, 0, sim);
            for (int r = 0; r < p; r++)
                CHECK(sim.peak_alive[r] == m, "p=%d m=%d rank %d peak %d", p, m, r,
                      sim.peak_alive[r]);
        }
}

/* 1F1B: rank r holds its p-r-1 warm-up micro-batches plus the one in its steady F/B pair. */
static void test_1f1b_holds_min_p_minus_rank_and_m_activations(void) {
    pps_schedule all[4];
    for (int pi = 0; pi < N(PS); pi++)
        for (int mi = 0; mi < N(MS); mi++) {
            int p = PS[pi], m = MS[mi];
            pps_sim sim;
            BUILD_SIM(all, PP_1F1B, p, 1, m, 0, sim);
            for (int r = 0; r < p; r++) {
                int want = p - r < m ? p - r : m;
                CHECK(sim.peak_alive[r] == want, "p=%d m=%d rank %d peak %d, want %d", p, m, r,
                      sim.peak_alive[r], want);
            }
        }
}

/* ZB-H1 keeps 1F1B's peak (rank 0's min(p, m), activations alive until W) on every rank: the
 * later ranks use the room rank 0 needs anyway to delay their W's (the paper's design), so rank r
 * holds min(p, m) rather than 1F1B's min(p - r, m). */
static void test_zb_peak_activations_match_1f1b_peak(void) {
    pps_schedule all[4];
    for (int pi = 0; pi < N(PS); pi++)
        for (int mi = 0; mi < N(MS); mi++) {
            int p = PS[pi], m = MS[mi], want = p < m ? p : m;
            pps_sim sim;
            BUILD_SIM(all, PP_ZB, p, 1, m, 0, sim);
            CHECK(sim.peak_alive[0] == want, "p=%d m=%d rank 0 peak %d, want %d", p, m,
                  sim.peak_alive[0], want);
            for (int r = 0; r < p; r++)
                CHECK(sim.peak_alive[r] <= want, "p=%d m=%d rank %d peak %d > %d", p, m, r,
                      sim.peak_alive[r], want);
        }
}

/* afab and 1f1b: makespan (m + p - 1)(F + B), so bubble = (p-1)/m of the ideal time and
 * (p-1)/(m+p-1) of the makespan. */
static void test_afab_and_1f1b_bubble_is_p_minus_1_over_m(void) {
    ust_pp_schedule kinds[] = {PP_AFAB, PP_1F1B};
    pps_schedule all[4];
    for (int ki = 0; ki < N(kinds); ki++)
        for (int pi = 0; pi < N(PS); pi++)
            for (int mi = 0; mi < N(MS); mi++) {
                int p = PS[pi], m = MS[mi];
                pps_sim sim;
                BUILD_SIM(all, kinds[ki], p, 1, m, 0, sim);
                CHECK(sim.makespan == 3.0 * (m + p - 1), "%s p=%d m=%d makespan %g",
                      pps_kind_name(kinds[ki]), p, m, sim.makespan);
                CHECK_CLOSE(sim.bubble, (p - 1.0) / m, 1e-12, 0, "bubble / ideal");
                CHECK_CLOSE(sim.idle_frac, (p - 1.0) / (m + p - 1), 1e-12, 0, "idle / makespan");
            }
}

/* Depth-first interleaved: a chunk costs 1/v of a stage, the fill and drain cost (p-1) chunk
 * F+B, so makespan = 3(v*m + p - 1) chunk units and bubble = (p-1)/(v*m). */
static void test_interleaved_bubble_is_p_minus_1_over_v_m(void) {
    pps_schedule all[4];
    for (int bf = 0; bf <= 1; bf++)
        for (int pi = 0; pi < N(PS); pi++)
            for (int v = 1; v <= 2; v++)
                for (int mi = 0; mi < N(MS); mi++) {
                    int p = PS[pi], m = MS[mi];
                    if (m % p) continue;
                    pps_sim sim;
                    BUILD_SIM(all, PP_INTERLEAVED, p, v, m, bf ? PPS_BREADTH_FIRST : 0, sim);
                    CHECK(sim.makespan == 3.0 * (v * m + p - 1), "bf=%d p=%d v=%d m=%d makespan %g",
                          bf, p, v, m, sim.makespan);
                    CHECK_CLOSE(sim.bubble, (p - 1.0) / (v * m), 1e-12, 0, "bubble / ideal");
                }
}

/* Interleaving trades memory for the bubble: depth-first rank 0 holds its (v-1)*p + 2(p-1)
 * warm-up chunks plus one (Megatron's count), breadth-first all m*v like afab. */
static void test_interleaved_peak_activations(void) {
    pps_schedule all[4];
    int p = 4, v = 2, m = 16;
    pps_sim df, bf;
    BUILD_SIM(all, PP_INTERLEAVED, p, v, m, 0, df);
    BUILD_SIM(all, PP_INTERLEAVED, p, v, m, PPS_BREADTH_FIRST, bf);
    for (int r = 0; r < p; r++) {
        int want = (v - 1) * p + 2 * (p - r - 1) + 1;
        CHECK(df.peak_alive[r] == want, "depth-first rank %d peak %d, want %d", r, df.peak_alive[r],
              want);
        CHECK(bf.peak_alive[r] == m * v, "breadth-first rank %d peak %d", r, bf.peak_alive[r]);
    }
}

/* ZB-H1 with F = B = W: the paper's bubble is (p-1)(F+B-W) = p-1 units, a third of 1F1B's
 * (p-1)(F+B+W), so makespan = 3m + p - 1 and bubble = (p-1)/(3m) once m >= p; below 1f1b for
 * every m when p > 1. */
static void test_zb_bubble_is_a_third_of_1f1b(void) {
    pps_schedule all[4];
    for (int pi = 0; pi < N(PS); pi++)
        for (int mi = 0; mi < N(MS); mi++) {
            int p = PS[pi], m = MS[mi];
            pps_sim zb, f1b;
            BUILD_SIM(all, PP_ZB, p, 1, m, 0, zb);
            BUILD_SIM(all, PP_1F1B, p, 1, m, 0, f1b);
            if (p == 1) CHECK(zb.bubble == 0, "p=1 m=%d: zb bubble %g", m, zb.bubble);
            if (p > 1)
                CHECK(zb.bubble < f1b.bubble, "p=%d m=%d: zb bubble %g, 1f1b %g", p, m, zb.bubble,
                      f1b.bubble);
            if (m >= p) {
                CHECK(zb.makespan == 3.0 * m + p - 1, "p=%d m=%d: zb makespan %g", p, m,
                      zb.makespan);
                CHECK_CLOSE(zb.bubble, (p - 1.0) / (3 * m), 1e-12, 0, "zb bubble / ideal");
            }
        }
}

/* ---- dualpipev ----------------------------------------------------------------------------- */

static const int DPS[] = {2, 3, 4};
static int find(const pps_schedule *s, pps_op op, int mb);
static void drop(pps_schedule *s, int i);

/* p ranks hold the 2p stages in a V: chunk 0 of rank r is stage r, chunk 1 stage 2p-1-r; every
 * rank runs its m micro-batches through both chunks (6m units: F, B and W of two chunks), rank
 * p-1 hands each micro-batch from one chunk to the other locally (m copies each way) and nobody
 * else copies; the run ends without a deadlock; every rank holds DeepSeek's PP+1 = 2p+1 chunk
 * activation sets at its peak (and allocates at most 2p+2, pps_slots). With PPS_NO_SPLIT (MoE, full
 * recomputation) every B is whole: no W, the same work. */
static void test_dualpipev_runs_the_v_to_the_end_with_2p_plus_1_sets(void) {
    pps_schedule all[4];
    int cases = 0;
    for (int pi = 0; pi < N(DPS); pi++)
        for (int extra = 0; extra <= 9; extra += 3)
            for (int ns = 0; ns <= 1; ns++) {
                int p = DPS[pi], m = 2 * p + extra, flags = ns ? PPS_NO_SPLIT : 0;
                ust_err e = {{0}};
                CHECK(pps_build_all(all, PP_DUALPIPEV, p, 2, m, flags, &e) == 0, "p=%d m=%d: %s", p,
                      m, e.msg);
                pps_sim sim;
                int rc = pps_simulate(all, p, COST_ZB, &sim, &e);
                CHECK(rc == 0, "p=%d m=%d no-split=%d: %s", p, m, ns, e.msg);
                for (int r = 0; r < p && rc == 0; r++) {
                    const pps_schedule *s = &all[r];
                    int local = 0, w = 0, slots[2];
                    for (int i = 0; i < s->n; i++) {
                        local += s->a[i].op == PPS_LOCAL_ACT || s->a[i].op == PPS_LOCAL_GRAD;
                        w += s->a[i].op == PPS_W;
                        if (s->a[i].op == PPS_F)
                            CHECK(s->a[i].stage == (s->a[i].chunk ? 2 * p - 1 - r : r),
                                  "p=%d rank %d: chunk %d is stage %d", p, r, s->a[i].chunk,
                                  s->a[i].stage);
                    }
                    CHECK(local == (r == p - 1 ? 2 * m : 0), "p=%d rank %d: %d local copies", p, r,
                          local);
                    CHECK(ns ? w == 0 : w > 0, "p=%d rank %d no-split=%d: %d W", p, r, ns, w);
                    CHECK(sim.busy[r] == 6.0 * m, "p=%d m=%d rank %d busy %g", p, m, r,
                          sim.busy[r]);
                    CHECK(sim.peak_alive[r] == 2 * p + 1, "p=%d m=%d rank %d peak %d", p, m, r,
                          sim.peak_alive[r]);
                    pps_slots(s, NULL, slots);
                    /* one more set than alive: a placed receive takes its set when posted */
                    int sets = slots[0] + slots[1];
                    CHECK(sets >= 2 * p + 1 && sets <= 2 * p + 2 && slots[0] <= 2 * p,
                          "p=%d rank %d: sets %d + %d", p, r, slots[0], slots[1]);
                }
                pps_free_all(all, p);
                cases++;
            }
    CHECK(cases == 24, "%d cases", cases);
}

/* The schedules' own bubbles (pps_dataflow: comm free and asynchronous) against the published
 * analytic values at F = B = W: 1f1b (p-1)/m and ZB-H1 (p-1)(F+B-2W) / (m(F+B)) = (p-1)/(3m)
 * exactly; dualpipev's V idles (p-1) chunk units of its 6m, (p-1)/(6m): at most DeepSeek's
 * (PP/2-1)(F&B+B-3W) with PP = 2p and F&B = F+B (2(p-1) units), and half of zb's on the same
 * model (a V chunk is half a zb stage). Under the executor's rule (batches complete as a
 * whole) with the receives placed by simulation: the published value at p = 2, within 40% of it
 * at p = 3, 4 (measured: 0.167 against 0.125 at p=4 m=8), below 1f1b's (p-1)/m everywhere. */
static void test_dualpipev_dataflow_bubble_against_the_published_ones(void) {
    pps_schedule all[4];
    for (int pi = 0; pi < N(DPS); pi++)
        for (int m = 2 * DPS[pi]; m <= 16; m *= 2) {
            int p = DPS[pi];
            double dv, zb, f1b;
            ust_err e = {{0}};
            CHECK(pps_build_all(all, PP_DUALPIPEV, p, 2, m, 0, &e) == 0, "%s", e.msg);
            CHECK(pps_dataflow(all, p, COST_ZB, &dv, &e) == 0, "%s", e.msg);
            pps_sim rule; /* under the executor's comm rule, with the receives it places */
            CHECK(pps_simulate(all, p, COST_ZB, &rule, &e) == 0, "%s", e.msg);
            pps_free_all(all, p);
            double published = pps_analytic_bubble(PP_DUALPIPEV, p, 2, m, COST_ZB, NULL);
            CHECK(rule.bubble < (p - 1.0) / m, "p=%d m=%d: rule bubble %g not below 1f1b's", p, m,
                  rule.bubble);
            CHECK(rule.bubble <= 1.4 * published, "p=%d m=%d: rule bubble %g, published %g", p, m,
                  rule.bubble, published);
            if (p == 2) CHECK_CLOSE(rule.bubble, published, 1e-12, 0, "p=2 rule bubble");
            CHECK(pps_build_all(all, PP_ZB, p, 1, m, 0, &e) == 0, "%s", e.msg);
            CHECK(pps_dataflow(all, p, COST_ZB, &zb, &e) == 0, "%s", e.msg);
            pps_free_all(all, p);
            CHECK(pps_build_all(all, PP_1F1B, p, 1, m, 0, &e) == 0, "%s", e.msg);
            CHECK(pps_dataflow(all, p, COST, &f1b, &e) == 0, "%s", e.msg);
            pps_free_all(all, p);
            CHECK_CLOSE(f1b, pps_analytic_bubble(PP_1F1B, p, 1, m, COST, NULL), 1e-12, 0, "1f1b");
            CHECK_CLOSE(zb, pps_analytic_bubble(PP_ZB, p, 1, m, COST_ZB, NULL), 1e-12, 0, "zb");
            CHECK(fabs(dv - (p - 1.0) / (6 * m)) < 1e-12, "dualpipev p=%d m=%d: %g", p, m, dv);
            CHECK(dv <= pps_analytic_bubble(PP_DUALPIPEV, p, 2, m, COST_ZB, NULL) + 1e-12,
                  "p=%d m=%d: %g above the published bound", p, m, dv);
            CHECK(fabs(2 * dv - zb) < 1e-12, "half of zb, p=%d m=%d: %g vs %g", p, m, dv, zb);
        }
}

/* The hand-over at the turn is checked like a transfer: a dropped LOCAL_GRAD leaves stage p-1
 * without its gradient; the receives in consumption order (not the sender's) are caught. */
static void test_dualpipev_checker_catches_a_missing_copy_and_a_misordered_receive(void) {
    pps_schedule all[2];
    ust_err e = {{0}};
    CHECK(pps_build_all(all, PP_DUALPIPEV, 2, 2, 4, 0, &e) == 0, "%s", e.msg);
    int i = find(&all[1], PPS_LOCAL_GRAD, 2);
    CHECK(i >= 0, "layout changed");
    drop(&all[1], i);
    int rc = pps_check(&all[1], &e);
    CHECK(rc == -1 && strstr(e.msg, "mb=2 chunk=0 has no RECV_GRAD"), "rc %d: %s", rc, e.msg);
    pps_free_all(all, 2);
    /* rank 1 gets activations and gradients from rank 0 and posts them in rank 0's send order,
     * which is not the order it consumes them in: swap two adjacent ones of a batch */
    CHECK(pps_build_all(all, PP_DUALPIPEV, 2, 2, 4, 0, &e) == 0, "%s", e.msg);
    int a = -1, g = -1;
    for (int i = 0; i + 1 < all[1].n && a < 0; i++)
        if (all[1].a[i].op == PPS_RECV_ACT && all[1].a[i + 1].op == PPS_RECV_GRAD) a = i, g = i + 1;
    CHECK(a >= 0, "layout changed: no activation and gradient received in one batch");
    pps_action t = all[1].a[a];
    all[1].a[a] = all[1].a[g], all[1].a[g] = t;
    CHECK(pps_check(&all[1], &e) == 0, "still well-formed on its own: %s", e.msg);
    rc = pps_check_pairs(all, 2, &e);
    CHECK(rc == -1 && strstr(e.msg, "posting order"), "rc %d: %s", rc, e.msg);
    pps_free_all(all, 2);
    CHECK(pps_build(&all[0], PP_DUALPIPEV, 2, 2, 3, 0, 0, &e) == -1 &&
              strstr(e.msg, "at least 2 * pp"),
          "m < 2p: %s", e.msg);
    CHECK(pps_build(&all[0], PP_DUALPIPEV, 2, 1, 4, 0, 0, &e) == -1 && strstr(e.msg, "vpp = 2"),
          "v: %s", e.msg);
    CHECK(pps_build(&all[0], PP_1F1B, 2, 1, 4, 0, PPS_NO_SPLIT, &e) == -1, "no-split flag");
}

/* ---- dualpipe ------------------------------------------------------------------------------ */

static const int BPS[] = {2, 4, 6, 8};

/* Two pipelines in opposite directions over the same ranks: every rank runs m/2 micro-batches
 * of each direction (3m units), chunk c's F's all of one direction (stage < p: mb < m/2), no
 * local copies (a micro-batch never turns); rank r's compute list is its mirror p-1-r's with
 * the directions swapped (mb <-> mb + m/2, the same chunk: the stage nearer the input); the run
 * ends without a deadlock and every rank holds DeepSeek's PP+1 = p+1 activation sets at its peak.
 * With PPS_NO_SPLIT every B is whole. */
static void test_dualpipe_runs_both_directions_mirrored_with_p_plus_1_sets(void) {
    pps_schedule all[8];
    int cases = 0;
    for (int pi = 0; pi < N(BPS); pi++)
        for (int extra = 0; extra <= 6; extra += 2)
            for (int ns = 0; ns <= 1; ns++) {
                int p = BPS[pi], m = 2 * p + extra, flags = ns ? PPS_NO_SPLIT : 0;
                ust_err e = {{0}};
                CHECK(pps_build_all(all, PP_DUALPIPE, p, 2, m, flags, &e) == 0, "p=%d m=%d: %s", p,
                      m, e.msg);
                pps_sim sim;
                int rc = pps_simulate(all, p, COST_ZB, &sim, &e);
                CHECK(rc == 0, "p=%d m=%d no-split=%d: %s", p, m, ns, e.msg);
                for (int r = 0; r < p && rc == 0; r++) {
                    const pps_schedule *s = &all[r], *t = &all[p - 1 - r];
                    int local = 0, w = 0, j = 0;
                    for (int i = 0; i < s->n; i++) {
                        const pps_action *a = &s->a[i];
                        local += a->op == PPS_LOCAL_ACT || a->op == PPS_LOCAL_GRAD;
                        w += a->op == PPS_W;
                        if (a->op == PPS_F)
                            CHECK((a->stage < p) == (a->mb < m / 2) &&
                                      a->stage == pps_stage(PP_DUALPIPE, p, a->chunk, r),
                                  "p=%d rank %d: F mb=%d chunk %d stage %d", p, r, a->mb, a->chunk,
                                  a->stage);
                        if (a->op != PPS_F && a->op != PPS_B && a->op != PPS_W) continue;
                        while (j < t->n && t->a[j].op != PPS_F && t->a[j].op != PPS_B &&
                               t->a[j].op != PPS_W)
                            j++;
                        CHECK(j < t->n && t->a[j].op == a->op && t->a[j].chunk == a->chunk &&
                                  t->a[j].mb == (a->mb + m / 2) % m && t->a[j].split == a->split,
                              "p=%d m=%d: rank %d compute %d is not its mirror's", p, m, r, i);
                        j++;
                    }
                    CHECK(local == 0, "p=%d rank %d: %d local copies", p, r, local);
                    CHECK(ns ? w == 0 : w > 0, "p=%d rank %d no-split=%d: %d W", p, r, ns, w);
                    CHECK(sim.busy[r] == 3.0 * m, "p=%d m=%d rank %d busy %g", p, m, r,
                          sim.busy[r]);
                    CHECK(sim.peak_alive[r] == p + 1, "p=%d m=%d rank %d peak %d", p, m, r,
                          sim.peak_alive[r]);
                }
                pps_free_all(all, p);
                cases++;
            }
    CHECK(cases == 32, "%d cases", cases);
}

/* DeepSeek's (PP/2-1)(F&B+B-3W) with PP = p over the m(F+B) a rank computes: none at p = 2. The
 * executor's rule with the receives placed by simulation reaches it at p = 2 and 4, stays within
 * 40% of it at 6 and 8 (measured: 0.167 against 0.125 at p=8 m=16), below 1f1b's (p-1)/m
 * everywhere; the schedule's own dataflow bubble is at most the published one. */
static void test_dualpipe_bubble_against_deepseeks(void) {
    pps_schedule all[8];
    for (int pi = 0; pi < N(BPS); pi++)
        for (int m = 2 * BPS[pi]; m <= 32; m *= 2) {
            int p = BPS[pi];
            double flow;
            ust_err e = {{0}};
            CHECK(pps_build_all(all, PP_DUALPIPE, p, 2, m, 0, &e) == 0, "%s", e.msg);
            CHECK(pps_dataflow(all, p, COST_ZB, &flow, &e) == 0, "%s", e.msg);
            pps_sim rule;
            CHECK(pps_simulate(all, p, COST_ZB, &rule, &e) == 0, "%s", e.msg);
            pps_free_all(all, p);
            double published = pps_analytic_bubble(PP_DUALPIPE, p, 2, m, COST_ZB, NULL);
            CHECK(fabs(published - (p / 2 - 1) * 2.0 / (3.0 * m)) < 1e-12, "formula p=%d: %g", p,
                  published);
            CHECK(rule.bubble < (p - 1.0) / m, "p=%d m=%d: rule bubble %g not below 1f1b's", p, m,
                  rule.bubble);
            if (p <= 4)
                CHECK(fabs(rule.bubble - published) < 1e-12, "p=%d m=%d rule bubble %g vs %g", p, m,
                      rule.bubble, published);
            CHECK(rule.bubble <= 1.4 * published + 1e-12, "p=%d m=%d: rule bubble %g, published %g",
                  p, m, rule.bubble, published);
            CHECK(flow <= published + 1e-12, "p=%d m=%d: dataflow %g above %g", p, m, flow,
                  published);
        }
}

/* A micro-batch run by the chunk of the other direction is caught; the builder refuses what
 * DualPipe cannot run: odd p (no mirror for the middle rank), odd m (two equal halves), m < 2p,
 * v != 2. */
static void test_dualpipe_checker_and_arguments(void) {
    pps_schedule all[2], s;
    ust_err e = {{0}};
    CHECK(pps_build_all(all, PP_DUALPIPE, 2, 2, 4, 0, &e) == 0, "%s", e.msg);
    int i = find(&all[0], PPS_F, 0);
    CHECK(i >= 0 && all[0].a[i].chunk == 0, "layout changed");
    all[0].a[i].mb = 2; /* direction 1's first micro-batch through chunk 0 (direction 0) */
    int rc = pps_check(&all[0], &e);
    CHECK(rc == -1 && strstr(e.msg, "other direction"), "rc %d: %s", rc, e.msg);
    pps_free_all(all, 2);
    CHECK(pps_build(&s, PP_DUALPIPE, 3, 2, 6, 0, 0, &e) == -1 && strstr(e.msg, "even pp"), "p: %s",
          e.msg);
    CHECK(pps_build(&s, PP_DUALPIPE, 2, 2, 5, 0, 0, &e) == -1 && strstr(e.msg, "even number"),
          "odd m: %s", e.msg);
    CHECK(pps_build(&s, PP_DUALPIPE, 4, 2, 6, 0, 0, &e) == -1, "m < 2p: %s", e.msg);
    CHECK(pps_build(&s, PP_DUALPIPE, 2, 1, 4, 0, 0, &e) == -1 && strstr(e.msg, "vpp = 2"), "v: %s",
          e.msg);
    CHECK(pps_build(&s, PP_DUALPIPE, 2, 2, 4, 0, PPS_BREADTH_FIRST, &e) == -1, "flag");
}

/* ---- the checkers can fail ---------------------------------------------------------------- */

static int find(const pps_schedule *s, pps_op op, int mb) {
    for (int i = 0; i < s->n; i++)
        if (s->a[i].op == op && s->a[i].mb == mb) return i;
    return -1;
}

static void drop(pps_schedule *s, int i) {
    memmove(&s->a[i], &s->a[i + 1], sizeof *s->a * (s->n - i - 1));
    s->n--;
}

static void test_a_dropped_backward_is_rejected(void) {
    pps_schedule all[4];
    ust_err e = {{0}};
    CHECK(pps_build_all(all, PP_1F1B, 4, 1, 8, 0, &e) == 0, "%s", e.msg);
    /* B alone: its gradient send now precedes any producer */
    pps_schedule *s = &all[2];
    drop(s, find(s, PPS_B, 5));
    int rc1 = pps_check(s, &e);
    int ok1 = rc1 == -1 && strstr(e.msg, "SEND_GRAD mb=5") && strstr(e.msg, "before the compute");
    /* B with its transfers: nothing refers to it any more, the count catches it */
    drop(s, find(s, PPS_SEND_GRAD, 5));
    drop(s, find(s, PPS_RECV_GRAD, 5));
    int rc2 = pps_check(s, &e);
    pps_free_all(all, 4);
    CHECK(ok1, "B only: rc %d: %s", rc1, e.msg);
    CHECK(rc2 == -1 && strstr(e.msg, "mb=5 chunk=0 has no B"), "rc %d: %s", rc2, e.msg);
}

static void test_a_swapped_send_and_receive_is_rejected(void) {
    /* rank 1 receives mb 3's activation after running its forward */
    pps_schedule all[4];
    ust_err e = {{0}};
    CHECK(pps_build_all(all, PP_1F1B, 4, 1, 8, 0, &e) == 0, "%s", e.msg);
    int i = find(&all[1], PPS_RECV_ACT, 3);
    CHECK(i >= 0 && all[1].a[i + 1].op == PPS_F, "layout changed");
    pps_action t = all[1].a[i];
    all[1].a[i] = all[1].a[i + 1];
    all[1].a[i + 1] = t;
    int rc = pps_check_pairs(all, 4, &e);
    pps_free_all(all, 4);
    CHECK(rc == -1 && strstr(e.msg, "receive after"), "rc %d: %s", rc, e.msg);
}

static void test_transfers_out_of_order_between_ranks_are_rejected(void) {
    /* rank 0 sends mb 1 before mb 0: each rank alone is fine, the pair is not */
    pps_schedule all[2];
    ust_err e = {{0}};
    CHECK(pps_build_all(all, PP_AFAB, 2, 1, 2, 0, &e) == 0, "%s", e.msg);
    int a = find(&all[0], PPS_SEND_ACT, 0), b = find(&all[0], PPS_SEND_ACT, 1);
    int fa = find(&all[0], PPS_F, 0), fb = find(&all[0], PPS_F, 1);
    CHECK(a >= 0 && b >= 0 && fa >= 0 && fb >= 0, "layout changed");
    /* F0 F1 then send 1, send 0 */
    pps_action s0 = all[0].a[a], s1 = all[0].a[b];
    pps_action f1 = all[0].a[fb];
    all[0].a[a] = f1, all[0].a[fb] = s1, all[0].a[b] = s0;
    int single = pps_check(&all[0], &e);
    int rc = pps_check_pairs(all, 2, &e);
    pps_free_all(all, 2);
    CHECK(single == 0, "rank 0 alone should pass");
    CHECK(rc == -1 && strstr(e.msg, "posting order"), "rc %d: %s", rc, e.msg);
}

static void test_a_deadlocking_post_order_is_reported_not_hung(void) {
    /* 1F1B p=2 m=2: rank 0 posts the receive of mb 0's gradient before its forward of mb 0. Each
     * rank is well-formed and the transfers pair up, but the gradient needs the activation rank 0
     * has not sent yet: a cycle, which the simulator must report instead of spinning. */
    pps_schedule all[2];
    ust_err e = {{0}};
    CHECK(pps_build_all(all, PP_1F1B, 2, 1, 2, 0, &e) == 0, "%s", e.msg);
    int f0 = find(&all[0], PPS_F, 0), rg = find(&all[0], PPS_RECV_GRAD, 0);
    CHECK(f0 == 0 && rg > f0, "layout changed");
    pps_action t = all[0].a[rg];
    memmove(&all[0].a[f0 + 1], &all[0].a[f0], sizeof t * (rg - f0));
    all[0].a[f0] = t;
    pps_sim sim;
    int rc = pps_check_pairs(all, 2, &e);
    int rs = rc ? -1 : pps_simulate(all, 2, COST, &sim, &e);
    pps_free_all(all, 2);
    CHECK(rc == 0, "still well-formed: %s", e.msg);
    CHECK(rs == -1 && strstr(e.msg, "deadlock"), "rs %d: %s", rs, e.msg);
}

static void test_invalid_inputs_give_an_error(void) {
    pps_schedule s;
    ust_err e = {{0}};
    CHECK(pps_build(&s, PP_INTERLEAVED, 4, 2, 6, 0, 0, &e) == -1 && strstr(e.msg, "multiple of pp"),
          "m %% p: %s", e.msg);
    CHECK(pps_build(&s, PP_INTERLEAVED, 2, 0, 4, 0, 0, &e) == -1 && strstr(e.msg, ">= 1"), "v: %s",
          e.msg);
    CHECK(pps_build(&s, PP_1F1B, 2, 1, 0, 0, 0, &e) == -1 && strstr(e.msg, ">= 1"), "m: %s", e.msg);
    CHECK(pps_build(&s, PP_1F1B, 2, 1, 4, 2, 0, &e) == -1 && strstr(e.msg, "rank"), "rank: %s",
          e.msg);
    CHECK(pps_build(&s, PP_1F1B, 2, 2, 4, 0, 0, &e) == -1 && strstr(e.msg, "interleaved"), "v: %s",
          e.msg);
    CHECK(pps_build(&s, PP_ZB, 2, 1, 4, 0, PPS_BREADTH_FIRST, &e) == -1, "flag");
    CHECK(s.a == NULL, "nothing allocated on error");
}

/* The builder and the config check share one copy of the pipeline's shape rules (config.h
 * cfg_pp_shape): over a grid of schedules and shapes the builder refuses exactly what the rules
 * refuse, so a rule added on one side only fails here. */
static void test_the_builder_refuses_exactly_what_the_shape_rules_refuse(void) {
    int mismatches = 0, refused = 0;
    for (int kind = PP_AFAB; kind <= PP_DUALPIPE; kind++)
        for (int p = 1; p <= 6; p++)
            for (int v = 1; v <= 3; v++)
                for (int m = 1; m <= 13; m++) {
                    pps_schedule s;
                    ust_err e = {{0}};
                    int rc = pps_build(&s, kind, p, v, m, 0, 0, &e);
                    int rule = cfg_pp_shape(kind, p, v, m) != CFG_PP_OK;
                    if (rc == 0) pps_free(&s);
                    refused += rule;
                    if ((rc != 0) != rule && mismatches++ < 3)
                        printf("  %s p=%d v=%d m=%d: builder %d, rules %d (%s)\n",
                               pps_kind_name(kind), p, v, m, rc, rule, e.msg);
                }
    CHECK(mismatches == 0 && refused > 0, "%d mismatches (%d refused by the rules)", mismatches,
          refused);
}

/* ------------------------------------------------------------------ forward only */

static int is_transfer(pps_op op) { return op >= PPS_SEND_ACT && op <= PPS_RECV_GRAD; }

/* The k of transfer i of s: how many transfers in the same direction to the same peer come
 * before it (the k-th send from a to b meets the k-th receive on b from a). */
static int transfer_k(const pps_schedule *s, int i) {
    int k = 0;
    for (int j = 0; j < i; j++) k += s->a[j].op == s->a[i].op && s->a[j].peer == s->a[i].peer;
    return k;
}

/* Runs forward-only lists as the executor does (each batch of transfers posted, then waited on):
 * a batch completes once every partner has posted its side. 0: every rank got to the end; -1:
 * no rank can move (a deadlock). */
static int forward_runs_to_the_end(const pps_schedule *all, int p) {
    int pos[4] = {0}, posted[4] = {0}, sends[4][4] = {{0}}, recvs[4][4] = {{0}};
    for (int moved = 1; moved;) {
        moved = 0;
        for (int r = 0; r < p; r++) {
            const pps_schedule *s = &all[r];
            int end = pos[r], done = 1;
            while (end < s->n && is_transfer(s->a[end].op)) end++;
            if (end == pos[r]) { /* a computation or a local copy */
                moved |= pos[r] < s->n;
                pos[r] += pos[r] < s->n;
                continue;
            }
            for (int i = pos[r]; i < end && !posted[r]; i++)
                (s->a[i].op == PPS_SEND_ACT ? sends : recvs)[r][s->a[i].peer]++;
            moved |= !posted[r];
            posted[r] = 1;
            for (int i = pos[r]; i < end; i++) {
                int q = s->a[i].peer, k = transfer_k(s, i);
                done &= s->a[i].op == PPS_SEND_ACT ? recvs[q][r] > k : sends[q][r] > k;
            }
            if (done) pos[r] = end, posted[r] = 0, moved = 1;
        }
    }
    for (int r = 0; r < p; r++)
        if (pos[r] < all[r].n) return -1;
    return 0;
}

/* pps_build_forward for every kind: each micro-batch's forward on every stage of its arm
 * (dualpipe: direction 0's p stages) in micro-batch order, its activation sent on to the rank
 * that receives it as the same (micro-batch, next stage), one activation set per chunk, and the
 * ranks, waiting on every batch, run to the end for any number of micro-batches. */
static void test_forward_only_schedules_walk_every_stage_once_and_run_to_the_end(void) {
    ust_pp_schedule kinds[] = {PP_AFAB, PP_1F1B, PP_ZB, PP_INTERLEAVED, PP_DUALPIPEV, PP_DUALPIPE};
    int ms[] = {1, 2, 3, 5}, cases = 0;
    for (int ki = 0; ki < N(kinds); ki++)
        for (int pi = 1; pi < N(PS); pi++)
            for (int mi = 0; mi < N(ms); mi++) {
                ust_pp_schedule kind = kinds[ki];
                int p = PS[pi], m = ms[mi];
                int v = kind == PP_INTERLEAVED || kind >= PP_DUALPIPEV ? 2 : 1;
                int stages = kind == PP_DUALPIPE ? p : p * v, per_mb[5] = {0}, slots[2];
                pps_schedule all[4];
                ust_err e = {{0}};
                for (int r = 0; r < p; r++)
                    CHECK(pps_build_forward(&all[r], kind, p, v, m, r, &e) == 0, "%s: %s",
                          pps_kind_name(kind), e.msg);
                for (int r = 0; r < p; r++) {
                    for (int i = 0, last = 0; i < all[r].n; i++) {
                        const pps_action *a = &all[r].a[i];
                        CHECK(a->op != PPS_B && a->op != PPS_W, "a backward in a forward list");
                        if (a->op == PPS_F) per_mb[a->mb]++;
                        CHECK(a->op != PPS_F || a->mb >= last, "micro-batches out of order");
                        if (a->op == PPS_F) last = a->mb;
                        const pps_action *b = NULL; /* the receive a send meets */
                        for (int j = 0; a->op == PPS_SEND_ACT && j < all[a->peer].n; j++)
                            if (all[a->peer].a[j].op == PPS_RECV_ACT &&
                                all[a->peer].a[j].peer == r &&
                                transfer_k(&all[a->peer], j) == transfer_k(&all[r], i))
                                b = &all[a->peer].a[j];
                        CHECK(a->op != PPS_SEND_ACT ||
                                  (b && b->mb == a->mb && b->stage == a->stage + 1),
                              "%s p=%d m=%d: rank %d's send %d meets no matching receive",
                              pps_kind_name(kind), p, m, r, i);
                    }
                    pps_slots(&all[r], NULL, slots);
                    for (int c = 0; c < v; c++)
                        CHECK(slots[c] <= 1, "chunk %d: %d sets", c, slots[c]);
                }
                for (int mb = 0; mb < m; mb++)
                    CHECK(per_mb[mb] == stages, "%s p=%d: mb %d ran %d of %d stages",
                          pps_kind_name(kind), p, mb, per_mb[mb], stages);
                CHECK(forward_runs_to_the_end(all, p) == 0, "%s p=%d m=%d deadlocks",
                      pps_kind_name(kind), p, m);
                pps_free_all(all, p);
                cases++;
            }
    CHECK(cases == 48, "%d cases", cases);
}

static void test_print_writes_one_line_per_action(void) {
    pps_schedule s;
    ust_err e = {{0}};
    CHECK(pps_build(&s, PP_ZB, 4, 1, 8, 1, 0, &e) == 0, "%s", e.msg);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    pps_print(f, &s);
    fclose(f);
    int lines = 0;
    for (size_t i = 0; i < len; i++) lines += buf[i] == '\n';
    int n = s.n;
    pps_free(&s);
    int ok = lines == n + 1 && strstr(buf, " W mb=0 chunk=0 stage=1\n") &&
             strstr(buf, "SEND_GRAD mb=0 stage=1 to=0\n");
    if (!ok) fputs(buf, stdout);
    free(buf);
    CHECK(ok, "%d lines for %d actions", lines, n);
}

int main(void) {
    RUN_TEST(test_every_schedule_in_the_grid_is_well_formed_and_runs_to_the_end);
    RUN_TEST(test_afab_holds_all_m_activations_on_every_rank);
    RUN_TEST(test_1f1b_holds_min_p_minus_rank_and_m_activations);
    RUN_TEST(test_zb_peak_activations_match_1f1b_peak);
    RUN_TEST(test_afab_and_1f1b_bubble_is_p_minus_1_over_m);
    RUN_TEST(test_interleaved_bubble_is_p_minus_1_over_v_m);
    RUN_TEST(test_interleaved_peak_activations);
    RUN_TEST(test_zb_bubble_is_a_third_of_1f1b);
    RUN_TEST(test_dualpipev_runs_the_v_to_the_end_with_2p_plus_1_sets);
    RUN_TEST(test_dualpipev_dataflow_bubble_against_the_published_ones);
    RUN_TEST(test_dualpipev_checker_catches_a_missing_copy_and_a_misordered_receive);
    RUN_TEST(test_dualpipe_runs_both_directions_mirrored_with_p_plus_1_sets);
    RUN_TEST(test_dualpipe_bubble_against_deepseeks);
    RUN_TEST(test_dualpipe_checker_and_arguments);
    RUN_TEST(test_a_dropped_backward_is_rejected);
    RUN_TEST(test_a_swapped_send_and_receive_is_rejected);
    RUN_TEST(test_transfers_out_of_order_between_ranks_are_rejected);
    RUN_TEST(test_a_deadlocking_post_order_is_reported_not_hung);
    RUN_TEST(test_invalid_inputs_give_an_error);
    RUN_TEST(test_the_builder_refuses_exactly_what_the_shape_rules_refuse);
    RUN_TEST(test_forward_only_schedules_walk_every_stage_once_and_run_to_the_end);
    RUN_TEST(test_print_writes_one_line_per_action);
    return TEST_SUMMARY();
}
