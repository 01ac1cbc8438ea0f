/* topology: every group of several grids against an independent formula (built from the rank
 * formula axis by axis, not by filtering coordinates as topology.c does), the partition property
 * (every member of my group has the same group), hand-checked groups of the dp=4 ep=2 tp=2 cp=2
 * pp=2 grid, the printer, and invalid grids. */
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "topology.h"

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* rank = t + TP*(c + CP*(d + DP*p)) */
static int R(const topo_grid *g, int t, int c, int d, int p) {
    return t + g->tp * (c + g->cp * (d + g->dp * p));
}

/* Independent member list: loop over the free axes of each kind, then sort. */
static int expected_group(const topo_grid *g, topo_kind k, int r, int *out) {
    int t = r % g->tp, c = (r / g->tp) % g->cp, d = (r / (g->tp * g->cp)) % g->dp,
        p = r / (g->tp * g->cp * g->dp), n = 0;
    int e = d % g->ep, q = d / g->ep; /* dp = q*ep + e */
    switch (k) {
    case TOPO_TP:
        for (int i = 0; i < g->tp; i++) out[n++] = R(g, i, c, d, p);
        break;
    case TOPO_CP:
        for (int i = 0; i < g->cp; i++) out[n++] = R(g, t, i, d, p);
        break;
    case TOPO_DP:
        for (int i = 0; i < g->dp; i++) out[n++] = R(g, t, c, i, p);
        break;
    case TOPO_PP:
        for (int i = 0; i < g->pp; i++) out[n++] = R(g, t, c, d, i);
        break;
    case TOPO_DPCP:
        for (int i = 0; i < g->dp; i++)
            for (int j = 0; j < g->cp; j++) out[n++] = R(g, t, j, i, p);
        break;
    case TOPO_EP:
        for (int i = 0; i < g->ep; i++) out[n++] = R(g, t, c, q * g->ep + i, p);
        break;
    case TOPO_EDPCP:
        for (int i = 0; i < g->dp / g->ep; i++)
            for (int j = 0; j < g->cp; j++) out[n++] = R(g, t, j, i * g->ep + e, p);
        break;
    case TOPO_EMB:
        if (p == 0 || p == g->pp - 1) {
            out[n++] = R(g, t, c, d, 0);
            if (g->pp > 1) out[n++] = R(g, t, c, d, g->pp - 1);
        } else {
            out[n++] = r;
        }
        break;
    case TOPO_WORLD:
        for (int i = 0; i < g->world; i++) out[n++] = i;
        break;
    case TOPO_CPA: /* cpa consecutive cp coordinates */
        for (int i = 0; i < g->cpa; i++) out[n++] = R(g, t, c - c % g->cpa + i, d, p);
        break;
    case TOPO_CPR: /* every cpa-th */
        for (int i = c % g->cpa; i < g->cp; i += g->cpa) out[n++] = R(g, t, i, d, p);
        break;
    case TOPO_MIRROR: /* pipeline rank p and its mirror pp-1-p (once when they coincide) */
        out[n++] = r;
        if (g->mirror && g->pp - 1 - p != p) out[n++] = R(g, t, c, d, g->pp - 1 - p);
        break;
    default:
        break;
    }
    qsort(out, (size_t)n, sizeof(int), cmp_int);
    return n;
}

/* Returns 0 or fills why. */
static int check_grid(int dp, int tp, int pp, int cp, int ep, int cpa, int mirror, char *why,
                      size_t cap) {
    topo_grid g;
    ust_err e;
    if (topo_grid_init(&g, dp, tp, pp, cp, ep, dp * tp * pp * cp, &e) ||
        topo_grid_set_cpa(&g, cpa, &e))
        return snprintf(why, cap, "valid grid refused: %.400s", e.msg), -1;
    g.mirror = mirror;
    int W = g.world, *a = malloc(sizeof(int) * W), *b = malloc(sizeof(int) * W),
        *m = malloc(sizeof(int) * W);
    int rc = 0;
    for (int r = 0; r < W && !rc; r++) {
        topo_coord co = topo_coords(&g, r);
        if (topo_rank_of(&g, co.tp, co.cp, co.dp, co.pp) != r || co.dp != co.edp * ep + co.ep)
            rc = (snprintf(why, cap, "coords of rank %d do not round-trip", r), -1);
        for (int k = 0; k < TOPO_NKINDS && !rc; k++) {
            int idx = -1, n = topo_group(&g, (topo_kind)k, r, a, &idx);
            int ne = expected_group(&g, (topo_kind)k, r, b);
            if (n != ne || memcmp(a, b, sizeof(int) * (size_t)n)) {
                rc = (snprintf(why, cap,
                               "grid dp%d tp%d pp%d cp%d ep%d: rank %d group %s has %d "
                               "members (first %d), expected %d (first %d)",
                               dp, tp, pp, cp, ep, r, topo_kind_name((topo_kind)k), n, a[0], ne,
                               b[0]),
                      -1);
                break;
            }
            if (idx < 0 || a[idx] != r) {
                rc = (snprintf(why, cap, "rank %d: index %d in its %s group is wrong", r, idx,
                               topo_kind_name((topo_kind)k)),
                      -1);
                break;
            }
            /* Partition: every member sees the same list. */
            for (int j = 0; j < n && !rc; j++) {
                int n2 = topo_group(&g, (topo_kind)k, a[j], m, NULL);
                if (n2 != n || memcmp(m, a, sizeof(int) * (size_t)n))
                    rc = (snprintf(why, cap, "%s group of rank %d differs from that of member %d",
                                   topo_kind_name((topo_kind)k), r, a[j]),
                          -1);
            }
        }
    }
    free(a), free(b), free(m);
    return rc;
}

static void test_every_group_matches_independent_formula_on_several_grids(void) {
    static const int grids[][5] = {
        /* dp tp pp cp ep */
        {1, 1, 1, 1, 1}, {2, 1, 1, 1, 1}, {1, 2, 1, 1, 1}, {1, 1, 2, 1, 1}, {1, 1, 1, 2, 1},
        {2, 2, 2, 1, 1}, {4, 2, 2, 2, 2}, {4, 1, 3, 1, 4}, {6, 2, 1, 1, 3}, {2, 2, 2, 2, 2},
        {3, 1, 4, 2, 1}, {8, 1, 1, 1, 2}, {1, 2, 1, 4, 1}, {2, 1, 2, 6, 1}};
    char why[512];
    for (size_t i = 0; i < sizeof grids / sizeof grids[0]; i++) {
        const int *q = grids[i];
        CHECK(check_grid(q[0], q[1], q[2], q[3], q[4], 1, 0, why, sizeof why) == 0, "%s", why);
        /* dualpipe's mirror pairs (odd pp too: the middle rank is its own mirror) */
        if (q[2] > 1)
            CHECK(check_grid(q[0], q[1], q[2], q[3], q[4], 1, 1, why, sizeof why) == 0, "%s", why);
        /* hierarchical cp: the Ulysses and ring sub-groups */
        for (int cpa = 2; cpa < q[3]; cpa++)
            if (q[3] % cpa == 0)
                CHECK(check_grid(q[0], q[1], q[2], q[3], q[4], cpa, 0, why, sizeof why) == 0, "%s",
                      why);
    }
}

static int has(const int *a, int n, const int *want, int nw) {
    return n == nw && !memcmp(a, want, sizeof(int) * (size_t)n);
}

/* dp=4 ep=2 tp=2 cp=2 pp=2: rank = t + 2c + 4d + 16p, worked out by hand. */
static void test_groups_of_dp4_ep2_tp2_cp2_pp2_by_hand(void) {
    topo_grid g;
    ust_err e;
    CHECK(topo_grid_init(&g, 4, 2, 2, 2, 2, 32, &e) == 0, "%.900s", e.msg);
    int a[32], n;
    n = topo_group(&g, TOPO_TP, 5, a, NULL);
    CHECK(has(a, n, (int[]){4, 5}, 2), "tp of 5");
    n = topo_group(&g, TOPO_CP, 5, a, NULL);
    CHECK(has(a, n, (int[]){5, 7}, 2), "cp of 5");
    n = topo_group(&g, TOPO_DP, 5, a, NULL);
    CHECK(has(a, n, (int[]){1, 5, 9, 13}, 4), "dp of 5");
    n = topo_group(&g, TOPO_PP, 5, a, NULL);
    CHECK(has(a, n, (int[]){5, 21}, 2), "pp of 5");
    n = topo_group(&g, TOPO_DPCP, 5, a, NULL);
    CHECK(has(a, n, (int[]){1, 3, 5, 7, 9, 11, 13, 15}, 8), "dp_cp of 5");
    n = topo_group(&g, TOPO_EP, 0, a, NULL);
    CHECK(has(a, n, (int[]){0, 4}, 2), "ep of 0");
    n = topo_group(&g, TOPO_EP, 9, a, NULL); /* d=2 -> ep block {2,3} */
    CHECK(has(a, n, (int[]){9, 13}, 2), "ep of 9");
    n = topo_group(&g, TOPO_EDPCP, 0, a, NULL); /* e=0: d in {0,2}, c in {0,1} */
    CHECK(has(a, n, (int[]){0, 2, 8, 10}, 4), "edp_cp of 0");
    n = topo_group(&g, TOPO_EDPCP, 21, a, NULL); /* t1 c0 d1 p1: e=1 -> d in {1,3} */
    CHECK(has(a, n, (int[]){20, 21, 22, 23, 28, 29, 30, 31}, 8) == 0, "edp_cp must keep tp");
    CHECK(has(a, n, (int[]){21, 23, 29, 31}, 4), "edp_cp of 21");
    n = topo_group(&g, TOPO_EMB, 3, a, NULL);
    CHECK(has(a, n, (int[]){3, 19}, 2), "embedding of 3");
    n = topo_group(&g, TOPO_WORLD, 3, a, NULL);
    CHECK(n == 32 && a[31] == 31, "world");
}

static void test_middle_pipeline_stage_has_embedding_group_of_itself(void) {
    topo_grid g;
    ust_err e;
    CHECK(topo_grid_init(&g, 1, 1, 4, 1, 1, 4, &e) == 0, "%.900s", e.msg);
    int a[4], idx = -1;
    int n = topo_group(&g, TOPO_EMB, 2, a, &idx);
    CHECK(n == 1 && a[0] == 2 && idx == 0, "n=%d a0=%d idx=%d", n, a[0], idx);
    n = topo_group(&g, TOPO_EMB, 3, a, &idx);
    CHECK(n == 2 && a[0] == 0 && a[1] == 3 && idx == 1, "n=%d idx=%d", n, idx);
}

static void test_invalid_grids_are_refused_with_a_message(void) {
    topo_grid g;
    ust_err e;
    e.msg[0] = 0;
    CHECK(topo_grid_init(&g, 4, 2, 1, 1, 3, 0, &e) == -1 && strstr(e.msg, "ep=3"), "ep: %s", e.msg);
    CHECK(topo_grid_init(&g, 2, 2, 2, 1, 1, 6, &e) == -1 && strstr(e.msg, "world has 6"),
          "world: %s", e.msg);
    CHECK(topo_grid_init(&g, 0, 1, 1, 1, 1, 0, &e) == -1 && strstr(e.msg, ">= 1"), "zero: %s",
          e.msg);
    CHECK(topo_grid_init(&g, 2, 1, 1, 1, 1, 0, &e) == 0 && g.world == 2, "world<=0 takes product");
}

static void test_printer_lists_every_group(void) {
    topo_grid g;
    ust_err e;
    CHECK(topo_grid_init(&g, 2, 2, 2, 1, 2, 8, &e) == 0, "%.900s", e.msg);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    topo_print(&g, f);
    fclose(f);
    CHECK(strstr(buf, "tp        4 groups of 2: [0 1] [2 3] [4 5] [6 7]"), "tp line:\n%s", buf);
    CHECK(strstr(buf, "dp        4 groups of 2: [0 2] [1 3] [4 6] [5 7]"), "dp line:\n%s", buf);
    CHECK(strstr(buf, "pp        4 groups of 2: [0 4] [1 5] [2 6] [3 7]"), "pp line:\n%s", buf);
    CHECK(strstr(buf, "world     1 group of 8: [0 1 2 3 4 5 6 7]"), "world line:\n%s", buf);
    free(buf);
}

/* Every grid of the formula test: the printer lists each group exactly once (every rank
 * appears once per kind) and the line count is one per kind plus the header. */
static void test_printer_lists_each_rank_once_per_kind(void) {
    static const int grids[][5] = {
        {4, 2, 2, 2, 2}, {4, 1, 3, 1, 4}, {6, 2, 1, 1, 3}, {1, 1, 4, 1, 1}};
    for (size_t gi = 0; gi < 2 * sizeof grids / sizeof *grids; gi++) {
        const int *q = grids[gi / 2]; /* each grid plain and mirrored (dualpipe) */
        topo_grid g;
        ust_err e;
        CHECK(topo_grid_init(&g, q[0], q[1], q[2], q[3], q[4], 0, &e) == 0, "%.900s", e.msg);
        g.mirror = gi % 2;
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        topo_print(&g, f);
        fclose(f);
        int lines = 0;
        for (char *line = strchr(buf, '\n'); line && line[1]; line = strchr(line + 1, '\n')) {
            lines++;
            int seen[64] = {0}, r;
            char *p = strchr(line, ':');
            CHECK(p, "no ':' in %.80s", line + 1);
            while ((p = strpbrk(p, "0123456789")) && p < strchr(line + 1, '\n')) {
                r = (int)strtol(p, &p, 10);
                CHECK(r >= 0 && r < g.world && !seen[r], "rank %d twice or out of range: %.200s", r,
                      line + 1);
                seen[r] = 1;
            }
            for (r = 0; r < g.world; r++) CHECK(seen[r], "rank %d missing: %.200s", r, line + 1);
        }
        CHECK(lines == TOPO_NKINDS, "%d kind lines", lines);
        free(buf);
    }
}

/* Node-aware placement on 2 nodes of 4 ranks (node = rank / 4): tp=4 and tp=2 x cp=2 stay inside
 * a node (dp and pp go across), tp=8 and tp=2 x cp=4 do not, and the warning names the group and
 * both nodes; a node map that interleaves ranks (node = rank % 2) puts even tp=2 across nodes. */
static void test_tp_and_cp_groups_across_nodes_are_found_and_named(void) {
    int blocked[8], striped[8];
    for (int r = 0; r < 8; r++) blocked[r] = r / 4, striped[r] = r % 2;
    ust_boot b = {.rank = 0, .world = 8, .local_world = 4, .nnodes = 2, .node_of = blocked};
    topo_grid g;
    int na = -1, nb = -1;
    CHECK(topo_grid_init(&g, 2, 4, 1, 1, 1, 8, NULL) == 0, "dp2 tp4");
    CHECK(topo_group_across_nodes(&g, TOPO_TP, &b, &na, &nb) == -1, "tp=4 inside a node");
    CHECK(topo_grid_init(&g, 1, 2, 2, 2, 1, 8, NULL) == 0, "tp2 cp2 pp2");
    CHECK(topo_group_across_nodes(&g, TOPO_TP, &b, &na, &nb) == -1, "tp=2 inside a node");
    CHECK(topo_group_across_nodes(&g, TOPO_CP, &b, &na, &nb) == -1, "cp=2 over tp=2 inside");
    CHECK(topo_grid_init(&g, 1, 8, 1, 1, 1, 8, NULL) == 0, "tp8");
    CHECK(topo_group_across_nodes(&g, TOPO_TP, &b, &na, &nb) == 0 && na == 0 && nb == 1,
          "tp=8 across nodes 0 and 1: got %d %d", na, nb);
    CHECK(topo_grid_init(&g, 1, 2, 1, 4, 1, 8, NULL) == 0, "tp2 cp4");
    CHECK(topo_group_across_nodes(&g, TOPO_TP, &b, &na, &nb) == -1, "tp=2 of tp2 cp4 inside");
    CHECK(topo_group_across_nodes(&g, TOPO_CP, &b, &na, &nb) == 0, "cp=4 over tp=2 across");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(topo_warn_across_nodes(&g, &b, f) == 1, "one warning (cp)");
    fclose(f);
    CHECK(strstr(buf, "the cp group of global ranks 0, 2, 4, 6") && strstr(buf, "nodes 0 and 1") &&
              strstr(buf, "K/V") && strstr(buf, "parallel.tp_across_nodes"),
          "warning: %s", buf);
    free(buf);
    b.node_of = striped;
    CHECK(topo_grid_init(&g, 4, 2, 1, 1, 1, 8, NULL) == 0, "dp4 tp2");
    CHECK(topo_group_across_nodes(&g, TOPO_TP, &b, &na, &nb) == 0 && na == 0 && nb == 1,
          "tp=2 on interleaved nodes");
}

int main(void) {
    RUN_TEST(test_tp_and_cp_groups_across_nodes_are_found_and_named);
    RUN_TEST(test_printer_lists_each_rank_once_per_kind);
    RUN_TEST(test_every_group_matches_independent_formula_on_several_grids);
    RUN_TEST(test_groups_of_dp4_ep2_tp2_cp2_pp2_by_hand);
    RUN_TEST(test_middle_pipeline_stage_has_embedding_group_of_itself);
    RUN_TEST(test_invalid_grids_are_refused_with_a_message);
    RUN_TEST(test_printer_lists_every_group);
    return TEST_SUMMARY();
}
