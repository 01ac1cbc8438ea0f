/* topology: the 5D rank grid and every process group derived from it; the one place that
 * computes ranks. world = dp*tp*pp*cp, rank order fastest-varying first tp, cp, dp, pp:
 *     rank = tp_i + tp*(cp_i + cp*(dp_i + dp*pp_i))
 * ep splits dp; the groups of a rank are listed at topo_kind.
 * The pure part (coordinates, member lists, printing) needs no communicator; topo_connect
 * creates every group of this rank through comm, once, at start-up. */
#ifndef UST_TOPOLOGY_H
#define UST_TOPOLOGY_H

#include <stdio.h>

#include "comm.h"
#include "config.h"
#include "error.h"

/* ep divides dp: the dp coordinate splits as dp_i = edp_i*ep + ep_i, so an expert-parallel group
 * is ep consecutive dp coordinates (close ranks) and the expert-data-parallel replicas of an
 * expert shard are the dp coordinates with the same ep_i.
 * Groups of a rank (members in increasing global rank, which is the comm-local order):
 *   TP     same cp, dp, pp                       (tp members)
 *   CP     same tp, dp, pp                       (cp)
 *   DP     same tp, cp, pp                       (dp)
 *   PP     same tp, cp, dp                       (pp; stage order)
 *   DPCP   same tp, pp             dense-gradient reduction (dp*cp; local index dp_i*cp + cp_i)
 *   EP     same tp, cp, pp, edp_i  expert parallel (ep; local index ep_i)
 *   EDPCP  same tp, pp, ep_i       expert-gradient reduction (dp/ep*cp; index edp_i*cp + cp_i)
 *   EMB    same tp, cp, dp, pp_i in {0, pp-1}   tied embeddings (2 members; 1 when pp == 1)
 *   CPA    the CP group's Ulysses sub-group: same cp_i / cpa (cpa consecutive cp coordinates)
 *   CPR    the CP group's ring sub-group: same cp_i % cpa (cp / cpa members)
 *   MIRROR same tp, cp, dp, pp_i in {i, pp-1-i} when the grid is mirrored (dualpipe: the two
 *          ranks holding the same stages, whose gradients are summed); else the rank alone
 *   WORLD  every rank */
typedef enum {
    TOPO_TP,
    TOPO_CP,
    TOPO_DP,
    TOPO_PP,
    TOPO_DPCP,
    TOPO_EP,
    TOPO_EDPCP,
    TOPO_EMB,
    TOPO_WORLD,
    TOPO_CPA,
    TOPO_CPR,
    TOPO_MIRROR,
    TOPO_NKINDS
} topo_kind;

typedef struct {
    int dp, tp, pp, cp, ep;
    int cpa;    /* the Ulysses degree inside cp (hierarchical context parallelism; 1: none) */
    int mirror; /* pipeline ranks i and pp-1-i form MIRROR groups (pp_schedule: dualpipe) */
    int world;
} topo_grid;

typedef struct {
    int tp, cp, dp, pp; /* grid coordinates */
    int ep, edp;        /* dp = edp*ep_size + ep */
} topo_coord;

/* A rank's view: its grid, coordinates, and one communicator per group kind. */
typedef struct {
    topo_grid grid;
    int rank;
    topo_coord me;
    ust_comm *comm[TOPO_NKINDS];
} ust_topology;

/* Checks the sizes (each >= 1, ep divides dp, product == world when world > 0; world <= 0 takes
 * the product). Returns -1 with a message otherwise. */
int topo_grid_init(topo_grid *g, int dp, int tp, int pp, int cp, int ep, int world, ust_err *e);
/* From the config; cpa is parallel.cp_a2a under cp_comm a2a+ring, else 1; mirror under
 * pp_schedule dualpipe with pp > 1. */
int topo_grid_from_config(topo_grid *g, const ust_config *c, int world, ust_err *e);
/* Sets g->cpa (must divide g->cp; -1 with a message otherwise). */
int topo_grid_set_cpa(topo_grid *g, int cpa, ust_err *e);

topo_coord topo_coords(const topo_grid *g, int rank);
int topo_rank_of(const topo_grid *g, int tp, int cp, int dp, int pp);
const char *topo_kind_name(topo_kind k);
/* Writes the members of rank's group of kind k (increasing global rank) into ranks (room for
 * g->world) and returns how many; *index (may be NULL) gets rank's position among them. */
int topo_group(const topo_grid *g, topo_kind k, int rank, int *ranks, int *index);
/* Prints the grid: for every kind, each distinct group's global ranks. */
void topo_print(const topo_grid *g, FILE *f);

/* Node-aware placement. Ranks are numbered node after node (every launcher does), so with tp
 * fastest-varying a tp group stays inside a node when tp (and tp*cp for cp) divides the ranks per
 * node; dp and pp then run across nodes. The lowest member of the first group of kind k whose
 * members are on more than one node (nodes from the bootstrap), with two of those nodes in
 * *na, *nb; -1 when every such group is inside one node. */
int topo_group_across_nodes(const topo_grid *g, topo_kind k, const ust_boot *b, int *na, int *nb);
/* Warns on f for tp and cp groups that span nodes (their collectives run on every layer, so
 * across nodes they are latency-bound on the network), naming a group, its nodes and the ranks
 * per node. Returns how many kinds it warned about. */
int topo_warn_across_nodes(const topo_grid *g, const ust_boot *b, FILE *f);

/* model.moe.max_nodes_per_token takes the model.moe.n_group expert groups (consecutive experts)
 * for nodes: each token's experts then span at most that many nodes only when every group's
 * experts are held by ranks of one node, in every ep group. node_of: the node of every global
 * rank; per_node: the ranks per node (for the message). -1 with a message naming the keys, the
 * group and its two nodes when a group spans nodes; 0 otherwise (also without the option). */
int topo_check_expert_nodes(const topo_grid *g, const ust_config *c, const int *node_of,
                            int per_node, ust_err *e);
/* The ep ranks holding one expert group (ep / n_group, or 1 when an ep rank holds whole
 * groups); 0 when groups straddle ep ranks unevenly (neither divides the other). */
int topo_group_holders(const topo_grid *g, const ust_config *c);

/* Collective over the job: creates every group of `rank` (one comm_create_many call). */
int topo_connect(ust_topology *t, const topo_grid *g, comm_ctx *ctx, int rank, ust_err *e);
/* Frees the communicators; call it before comm_ctx_free (which frees any that are left). */
void topo_disconnect(ust_topology *t);

#endif
