/* topology: coordinates <-> ranks and the member lists of every group (see topology.h). A group
 * is "every rank whose coordinates agree with mine on the fixed axes", enumerated by walking
 * the free axes in rank order. */
#include "topology.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int topo_grid_init(topo_grid *g, int dp, int tp, int pp, int cp, int ep, int world, ust_err *e) {
    memset(g, 0, sizeof *g);
    if (dp < 1 || tp < 1 || pp < 1 || cp < 1 || ep < 1)
        return ust_errf(e,
                        "topology: every parallel size must be >= 1 (dp=%d tp=%d pp=%d cp=%d "
                        "ep=%d)",
                        dp, tp, pp, cp, ep);
    if (dp % ep)
        return ust_errf(e,
                        "topology: parallel.ep=%d must divide parallel.dp=%d (experts are "
                        "sharded over ep ranks of the data-parallel group)",
                        ep, dp);
    long prod = (long)dp * tp * pp * cp;
    if (prod > 1 << 20) return ust_errf(e, "topology: dp*tp*pp*cp = %ld is too large", prod);
    if (world > 0 && prod != world)
        return ust_errf(e,
                        "topology: dp*tp*pp*cp = %d*%d*%d*%d = %ld, but the world has %d "
                        "ranks",
                        dp, tp, pp, cp, prod, world);
    *g =
        (topo_grid){.dp = dp, .tp = tp, .pp = pp, .cp = cp, .ep = ep, .cpa = 1, .world = (int)prod};
    return 0;
}

int topo_grid_set_cpa(topo_grid *g, int cpa, ust_err *e) {
    if (cpa < 1 || g->cp % cpa)
        return ust_errf(e, "topology: the Ulysses degree %d must divide parallel.cp=%d", cpa,
                        g->cp);
    g->cpa = cpa;
    return 0;
}

int topo_grid_from_config(topo_grid *g, const ust_config *c, int world, ust_err *e) {
    if (topo_grid_init(g, c->parallel.dp, c->parallel.tp, c->parallel.pp, c->parallel.cp,
                       c->parallel.ep, world, e))
        return -1;
    g->mirror = c->parallel.pp_schedule == PP_DUALPIPE && c->parallel.pp > 1;
    return topo_grid_set_cpa(g, c->parallel.cp_comm == CP_A2A_RING ? c->parallel.cp_a2a : 1, e);
}

topo_coord topo_coords(const topo_grid *g, int rank) {
    UST_ASSERT(rank >= 0 && rank < g->world, "rank %d of %d", rank, g->world);
    topo_coord c;
    c.tp = rank % g->tp;
    rank /= g->tp;
    c.cp = rank % g->cp;
    rank /= g->cp;
    c.dp = rank % g->dp;
    c.pp = rank / g->dp;
    c.ep = c.dp % g->ep;
    c.edp = c.dp / g->ep;
    return c;
}

int topo_rank_of(const topo_grid *g, int tp, int cp, int dp, int pp) {
    return tp + g->tp * (cp + g->cp * (dp + g->dp * pp));
}

const char *topo_kind_name(topo_kind k) {
    static const char *names[TOPO_NKINDS] = {"tp",    "cp",     "dp",      "pp",
                                             "dp_cp", "ep",     "edp_cp",  "embedding",
                                             "world", "cp_a2a", "cp_ring", "pp_mirror"};
    return (unsigned)k < TOPO_NKINDS ? names[k] : "?";
}

int topo_group(const topo_grid *g, topo_kind k, int rank, int *ranks, int *index) {
    topo_coord me = topo_coords(g, rank);
    int n = 0;
    /* Walk the whole grid in rank order and keep the ranks that share the fixed coordinates;
     * O(world) per group, done once at start-up. */
    for (int r = 0; r < g->world; r++) {
        topo_coord o = topo_coords(g, r);
        int same_tp = o.tp == me.tp, same_cp = o.cp == me.cp, same_dp = o.dp == me.dp,
            same_pp = o.pp == me.pp, keep = 0;
        switch (k) {
        case TOPO_TP:
            keep = same_cp && same_dp && same_pp;
            break;
        case TOPO_CP:
            keep = same_tp && same_dp && same_pp;
            break;
        case TOPO_DP:
            keep = same_tp && same_cp && same_pp;
            break;
        case TOPO_PP:
            keep = same_tp && same_cp && same_dp;
            break;
        case TOPO_DPCP:
            keep = same_tp && same_pp;
            break;
        case TOPO_EP:
            keep = same_tp && same_cp && same_pp && o.edp == me.edp;
            break;
        case TOPO_EDPCP:
            keep = same_tp && same_pp && o.ep == me.ep;
            break;
        case TOPO_EMB:
            keep = same_tp && same_cp && same_dp && (o.pp == 0 || o.pp == g->pp - 1);
            break;
        case TOPO_WORLD:
            keep = 1;
            break;
        case TOPO_CPA:
            keep = same_tp && same_dp && same_pp && o.cp / g->cpa == me.cp / g->cpa;
            break;
        case TOPO_CPR:
            keep = same_tp && same_dp && same_pp && o.cp % g->cpa == me.cp % g->cpa;
            break;
        case TOPO_MIRROR:
            keep = same_tp && same_cp && same_dp &&
                   (same_pp || (g->mirror && o.pp == g->pp - 1 - me.pp));
            break;
        default:
            UST_ASSERT(0, "group kind %d", (int)k);
        }
        if (!keep) continue;
        if (r == rank && index) *index = n;
        ranks[n++] = r;
    }
    /* pp == 1: the embedding "group" is the rank alone, which keeps callers uniform. */
    if (k == TOPO_EMB && g->pp > 1 && me.pp != 0 && me.pp != g->pp - 1) {
        /* A middle stage holds no embedding; it gets a group of itself. */
        ranks[0] = rank;
        n = 1;
        if (index) *index = 0;
    }
    return n;
}

void topo_print(const topo_grid *g, FILE *f) {
    fprintf(f,
            "topology: world %d = dp %d x tp %d x pp %d x cp %d (ep %d, expert-dp %d); rank "
            "order tp, cp, dp, pp\n",
            g->world, g->dp, g->tp, g->pp, g->cp, g->ep, g->dp / g->ep);
    int *ranks = malloc(sizeof(int) * (size_t)g->world);
    int *first = malloc(sizeof(int) * (size_t)g->world);
    UST_ASSERT(ranks && first, "out of memory");
    for (int k = 0; k < TOPO_NKINDS; k++) {
        /* A group is printed once, from its lowest member: the rank whose free coordinates
         * are all 0 (found without listing every rank's group, so large worlds print fast). */
        int ngroups = 0;
        for (int r = 0; r < g->world; r++) {
            topo_coord o = topo_coords(g, r);
            int lowest = 0;
            switch ((topo_kind)k) {
            case TOPO_TP:
                lowest = o.tp == 0;
                break;
            case TOPO_CP:
                lowest = o.cp == 0;
                break;
            case TOPO_DP:
                lowest = o.dp == 0;
                break;
            case TOPO_PP:
                lowest = o.pp == 0;
                break;
            case TOPO_DPCP:
                lowest = o.dp == 0 && o.cp == 0;
                break;
            case TOPO_EP:
                lowest = o.ep == 0;
                break;
            case TOPO_EDPCP:
                lowest = o.edp == 0 && o.cp == 0;
                break;
            case TOPO_EMB:
                lowest = o.pp == 0 || o.pp < g->pp - 1;
                break;
            case TOPO_CPA:
                lowest = o.cp % g->cpa == 0;
                break;
            case TOPO_CPR:
                lowest = o.cp < g->cpa;
                break;
            case TOPO_MIRROR:
                lowest = !g->mirror || o.pp <= g->pp - 1 - o.pp;
                break;
            default:
                lowest = r == 0;
                break;
            }
            if (lowest) first[ngroups++] = r;
        }
        fprintf(f, "  %-9s %d group%s of %d:", topo_kind_name((topo_kind)k), ngroups,
                ngroups == 1 ? "" : "s", topo_group(g, (topo_kind)k, 0, ranks, NULL));
        for (int i = 0; i < ngroups; i++) {
            int n = topo_group(g, (topo_kind)k, first[i], ranks, NULL);
            UST_ASSERT(ranks[0] == first[i], "%s group of rank %d starts at %d",
                       topo_kind_name((topo_kind)k), first[i], ranks[0]);
            fputs(" [", f);
            for (int j = 0; j < n; j++) fprintf(f, "%s%d", j ? " " : "", ranks[j]);
            fputs("]", f);
        }
        fputc('\n', f);
    }
    free(ranks);
    free(first);
}

int topo_group_across_nodes(const topo_grid *g, topo_kind k, const ust_boot *b, int *na, int *nb) {
    UST_ASSERT(k == TOPO_TP || k == TOPO_CP, "node check of group kind %d", (int)k);
    /* Compare every rank's node with its group's lowest member's (the member with coordinate 0
     * on the group's axis): O(world), no member lists. */
    for (int r = 0; r < g->world; r++) {
        topo_coord c = topo_coords(g, r);
        int low = k == TOPO_TP ? topo_rank_of(g, 0, c.cp, c.dp, c.pp)
                               : topo_rank_of(g, c.tp, 0, c.dp, c.pp);
        if (boot_node_of(b, r) != boot_node_of(b, low)) {
            *na = boot_node_of(b, low), *nb = boot_node_of(b, r);
            return low;
        }
    }
    return -1;
}

int topo_warn_across_nodes(const topo_grid *g, const ust_boot *b, FILE *f) {
    static const char *why[] = {
        "tensor parallelism all-reduces (or gathers and scatters) activations twice per layer in "
        "the forward and again in the backward",
        "context parallelism passes every attention layer's K/V blocks around its ring, forward "
        "and backward"};
    int warned = 0;
    for (int i = 0; i < 2; i++) {
        topo_kind k = i ? TOPO_CP : TOPO_TP;
        int na, nb, low = topo_group_across_nodes(g, k, b, &na, &nb);
        if (low < 0) continue;
        int *ranks = malloc(sizeof(int) * (size_t)g->world), n;
        UST_ASSERT(ranks, "out of memory");
        n = topo_group(g, k, low, ranks, NULL);
        char list[256];
        size_t used = 0;
        for (int j = 0; j < n && used + 16 < sizeof list; j++)
            used +=
                (size_t)snprintf(list + used, sizeof list - used, "%s%d", j ? ", " : "", ranks[j]);
        if (used + 16 >= sizeof list) snprintf(list + used, sizeof list - used, ", ...");
        fprintf(f,
                "ustrain: warning: the %s group of global ranks %s spans nodes %d and %d: %s, "
                "so across nodes every layer waits on the network; with %d ranks per node keep "
                "parallel.%s <= %d (tp is placed first, then cp), or set "
                "parallel.tp_across_nodes: true to silence this\n",
                topo_kind_name(k), list, na, nb, why[i], b->local_world,
                i ? "tp * parallel.cp" : "tp", b->local_world);
        free(ranks);
        warned++;
    }
    return warned;
}

int topo_group_holders(const topo_grid *g, const ust_config *c) {
    int G = c->model.moe.n_group;
    return g->ep % G == 0 ? g->ep / G : G % g->ep == 0 ? 1 : 0;
}

int topo_check_expert_nodes(const topo_grid *g, const ust_config *c, const int *node_of,
                            int per_node, ust_err *e) {
    const __typeof__(c->model.moe) *m = &c->model.moe;
    if (!m->max_nodes_per_token || !m->num_experts || !node_of) return 0;
    int El = m->num_experts / g->ep, Eg = m->num_experts / m->n_group;
    /* every rank against the holder of the first expert of each group it holds experts of */
    for (int r = 0; r < g->world; r++) {
        topo_coord o = topo_coords(g, r);
        for (int grp = o.ep * El / Eg; grp <= ((o.ep + 1) * El - 1) / Eg; grp++) {
            int h = topo_rank_of(g, o.tp, o.cp, o.edp * g->ep + grp * Eg / El, o.pp);
            if (node_of[h] == node_of[r]) continue;
            int k = topo_group_holders(g, c), span = g->tp * g->cp * (k ? k : 1);
            return ust_errf(
                e,
                "model.moe.max_nodes_per_token (%d) takes the model.moe.n_group (%d) expert "
                "groups for nodes, but group %d's experts (%d..%d) are on node %d (global rank "
                "%d) and node %d (global rank %d), so a token's experts may span more nodes. "
                "Ranks are numbered node after node: keep the ranks holding one group "
                "(parallel.tp x parallel.cp x parallel.ep / model.moe.n_group = %d x %d x %d = "
                "%d) dividing the %d ranks per node%s, or set model.moe.n_group to the nodes the "
                "ep group spans",
                m->max_nodes_per_token, m->n_group, grp, grp * Eg, grp * Eg + Eg - 1, node_of[h], h,
                node_of[r], r, g->tp, g->cp, k ? k : 1, span, per_node,
                k ? "" : " (parallel.ep and model.moe.n_group must divide one another)");
        }
    }
    return 0;
}

int topo_connect(ust_topology *t, const topo_grid *g, comm_ctx *ctx, int rank, ust_err *e) {
    memset(t, 0, sizeof *t);
    t->grid = *g;
    t->rank = rank;
    t->me = topo_coords(g, rank);
    int *ranks = malloc(sizeof(int) * (size_t)g->world * TOPO_NKINDS);
    UST_ASSERT(ranks, "out of memory");
    comm_group_spec spec[TOPO_NKINDS];
    for (int k = 0; k < TOPO_NKINDS; k++) {
        int *rk = ranks + (size_t)k * (size_t)g->world;
        spec[k] = (comm_group_spec){topo_kind_name((topo_kind)k), rk,
                                    topo_group(g, (topo_kind)k, rank, rk, NULL)};
    }
    int rc = comm_create_many(ctx, TOPO_NKINDS, spec, t->comm, e);
    free(ranks);
    return rc;
}

void topo_disconnect(ust_topology *t) {
    for (int k = 0; k < TOPO_NKINDS; k++) {
        comm_free(t->comm[k]);
        t->comm[k] = NULL;
    }
}
