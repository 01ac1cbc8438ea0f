/* Expert parallelism (parallel/ep) through the MoE layer.
 * Run alone: the single-rank dispatch plan is the identity. Run under a launcher with
 * `--ep-check` (test/sh/ep_dispatch.sh does, for 2 and 4 ranks): every rank holds its own tokens
 * and runs the MoE layer twice, once with all experts local (ep = 1, the reference) and once with
 * the experts split over the world (ep = n); outputs, input gradients, router and shared-expert
 * gradients must match the rank's own reference, and each local expert's gradient the sum over
 * ranks of the references' (expert gradients are accumulations over every rank's tokens). Cases:
 * llama/gpt2, top-1/2, shared expert, random and very skewed routing (all tokens to one expert,
 * most experts get none), and capacity drops (decided before dispatch, so still equal). A last
 * case checks the stats hook: with the world as the stats group, the aux and z losses of
 * sharded tokens equal those of one rank holding every token. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "comm.h"
#include "ep.h"
#include "mem.h"
#include "moe.h"
#include "ops.h"
#include "rng.h"
#include "test.h"
#include "test_world.h"

static void test_single_rank_plan_is_identity(void) {
    ust_ops *o = ops_cpu_create(1, 1);
    ust_arena a;
    mem_init(&a, o);
    ust_ep ep;
    ep_init(&ep, o, NULL, &a, 4, 3, 10, 0);
    ep_plan p;
    ep_plan_init(&ep, &p, &a);
    int32_t send[4] = {3, 0, 5, 2};
    ep_plan_make(&ep, &p, send);
    float rows[30], out[30];
    for (int i = 0; i < 30; i++) rows[i] = (float)i;
    ep_dispatch(&ep, &p, out, rows);
    int first, n = ep_local_experts(&ep, &first), same = !memcmp(out, rows, sizeof rows);
    int64_t nrecv = p.nrecv;
    int32_t local2 = p.local[2];
    ep_plan_free(&p);
    ep_free(&ep);
    mem_release(&a);
    o->destroy(o);
    CHECK(n == 4 && first == 0 && nrecv == 10 && local2 == 5 && same,
          "experts %d from %d, %lld rows, local[2] %d, same %d", n, first, (long long)nrecv, local2,
          same);
}

/* ---------------------------------------------------------------- multi-rank check */

enum { E = 8, C = 8, FE = 6, NTOK = 16 };

typedef struct {
    float *p, *g;
    int64_t n;
    char name[128];
} tparam;

typedef struct plist {
    ust_arena *arena;
    tparam t[512];
    int n;
    const struct plist *share; /* when set: parameters point at these (same names), own grads */
} plist;

static void collect(void *ctx, const moe_param *q) {
    plist *l = ctx;
    tparam *t = &l->t[l->n++];
    t->n = q->rows * q->cols;
    t->p = NULL;
    snprintf(t->name, sizeof t->name, "%s", q->name);
    if (l->share)
        for (int i = 0; i < l->share->n; i++)
            if (!strcmp(l->share->t[i].name, q->name)) t->p = l->share->t[i].p;
    if (!t->p) t->p = mem_alloc(l->arena, MEM_PARAMS, t->n * sizeof(float));
    t->g = mem_alloc(l->arena, MEM_GRADS, t->n * sizeof(float));
    *q->p = t->p;
    *q->g = t->g;
}

static const tparam *find(const plist *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->t[i].name, name)) return &l->t[i];
    return NULL;
}

typedef struct {
    const char *name;
    ust_arch arch;
    int k, shared, skewed;
    double capacity;
} ep_case;

typedef struct {
    moe_ctx m;
    moe_acts a;
    moe_weights w, g;
    plist pl;
    float *y, *dx;
    moe_stats st;
} layer;

static void layer_make(layer *L, const ust_config *cfg, const ust_ops *o, ust_arena *arena, int N,
                       const moe_groups *groups, const plist *share) {
    memset(L, 0, sizeof *L);
    moe_init(&L->m, cfg, o, arena, N, groups);
    moe_weights_init(&L->w, &L->m);
    moe_weights_init(&L->g, &L->m);
    L->pl.arena = arena;
    L->pl.share = share;
    int n = ep_size(groups ? groups->ep : NULL), r = ep_rank(groups ? groups->ep : NULL);
    moe_enum_params(cfg, 0, n, r, &L->w, &L->g, collect, &L->pl);
    moe_acts_init(&L->m, &L->a, arena);
    L->y = mem_alloc(arena, MEM_ACTS, (size_t)N * C * 4);
    L->dx = mem_alloc(arena, MEM_ACTS, (size_t)N * C * 4);
}

static void layer_run(layer *L, const float *x, const float *dy) {
    moe_forward(&L->m, &L->a, &L->w, L->y, x, &L->st);
    moe_backward(&L->m, &L->a, &L->w, &L->g, L->dx, dy, x, 0.5f, 0);
}

static void layer_free(layer *L) {
    moe_acts_free(&L->a);
    moe_weights_free(&L->w);
    moe_weights_free(&L->g);
    moe_free(&L->m);
}

/* Same weights on every rank (seed independent of the rank). Skewed: router row 0 pulls every
 * token (x[:,0] >= 3) to expert 0 with a logit margin >= 6, row 1 to expert 1 as second choice;
 * the other experts get nothing. */
static void fill_weights(plist *pl, const ep_case *c) {
    for (int i = 0; i < pl->n; i++) {
        tparam *t = &pl->t[i];
        int router = strstr(t->name, "router") != NULL;
        float s = router ? (c->skewed ? 0.1f : 1.0f) : strstr(t->name, "bias") ? 0.3f : 0.5f;
        for (int64_t j = 0; j < t->n; j++) t->p[j] = s * rng_normal(5, i, j);
        if (router && c->skewed) t->p[0 * C + 0] = 4.0f, t->p[1 * C + 0] = 2.0f;
    }
}

static void fill_tokens(float *x, float *dy, int rank, int N, int skewed) {
    for (int j = 0; j < N * C; j++) {
        x[j] = rng_normal(100 + rank, 1, j);
        dy[j] = rng_normal(100 + rank, 2, j);
        if (skewed && j % C == 0) x[j] = 3.0f + fabsf(x[j]);
    }
}

static double maxdiff(const float *a, const float *b, int64_t n) {
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]) / (1.0 + fabs(b[i]));
        w = d > w || d != d ? d : w;
    }
    return w;
}

/* Worst relative difference between the ep run and the references; expert gradients against
 * the references summed over the ranks. */
static double compare(layer *ep, layer *ref, ust_comm *world, int N, int64_t *rows_moved) {
    double worst =
        fmax(maxdiff(ep->y, ref->y, (int64_t)N * C), maxdiff(ep->dx, ref->dx, (int64_t)N * C));
    worst = fmax(worst, fabs(ep->st.aux_loss - ref->st.aux_loss));
    for (int i = 0; i < ref->pl.n; i++) { /* every rank the same list, same order */
        tparam *t = &ref->pl.t[i];
        int expert = strstr(t->name, ".experts.") != NULL;
        if (expert) {
            comm_req r = comm_allreduce(world, t->g, t->g, t->n, COMM_FP32, COMM_SUM);
            comm_wait(&r);
        }
        const tparam *mine = find(&ep->pl, t->name);
        if (mine)
            worst = fmax(worst, maxdiff(mine->g, t->g, t->n));
        else if (!expert)
            worst = INFINITY; /* router and shared expert are on every rank */
    }
    *rows_moved = ep->m.ep->rows_sent;
    return worst;
}

/* fp32 on both paths; the tokens' rows go through the same ops, only the expert GEMMs see them
 * in other groupings and expert gradients sum over ranks in another order: 1e-5 relative is
 * ~100x float rounding of these O(10)-term sums and far below a misrouted row (O(1)). */
#define TOL 1e-5

/* The cases' model: 2 layers of width C, E experts of width FE, top-k of them. */
static void moe_cfg(ust_config *cfg, ust_arch arch, int k) {
    cfg_defaults(cfg);
    cfg->model.arch = arch;
    cfg->model.n_layer = 2;
    cfg->model.d_model = C;
    cfg->model.moe.num_experts = E;
    cfg->model.moe.top_k = k;
    cfg->model.moe.d_ff_expert = FE;
}

static int run_case(const ep_case *c, ust_comm *world, const ust_ops *o, int rank, int n) {
    ust_config cfg;
    moe_cfg(&cfg, c->arch, c->k);
    cfg.model.moe.shared_expert = c->shared;
    cfg.model.moe.aux_loss_coef = 0.2;
    cfg.model.moe.z_loss_coef = 0.1;
    cfg.model.moe.capacity_factor = c->capacity;
    ust_arena arena;
    mem_init(&arena, o);
    layer ref, ep;
    /* the expert-parallel context over the world, as the trainer makes it */
    ust_ep ctx;
    int64_t send, recv;
    moe_dispatch_rows(&cfg, NTOK, comm_size(world), &send, &recv);
    ep_init(&ctx, o, world, &arena, E, C, send, recv);
    moe_groups g = {.ep = &ctx};
    layer_make(&ref, &cfg, o, &arena, NTOK, NULL, NULL);
    fill_weights(&ref.pl, c);
    layer_make(&ep, &cfg, o, &arena, NTOK, &g, &ref.pl);
    float *x = mem_alloc(&arena, MEM_ACTS, NTOK * C * 4),
          *dy = mem_alloc(&arena, MEM_ACTS, NTOK * C * 4);
    fill_tokens(x, dy, rank, NTOK, c->skewed);
    layer_run(&ref, x, dy);
    layer_run(&ep, x, dy);
    int64_t moved, nrecv = ep.a.plan.nrecv;
    double worst = compare(&ep, &ref, world, NTOK, &moved);
    /* the worst over ranks, and how many ranks received no rows at all */
    float v[2] = {(float)worst, nrecv == 0 ? 1.0f : 0.0f}, all[8] = {0};
    comm_req r = comm_allgather(world, v, all, 2, COMM_FP32);
    comm_wait(&r);
    float w = 0, idle = 0;
    for (int i = 0; i < n; i++)
        w = fmaxf(w, all[2 * i]) + (all[2 * i] != all[2 * i]), idle += all[2 * i + 1];
    /* skewed: all tokens to experts 0 (and 1), both on rank 0, so every other rank holds none */
    int idle_ok = !c->skewed || idle == n - 1;
    int bad = !(w <= TOL) || !idle_ok || (!c->skewed && moved == 0);
    if (rank == 0)
        printf("%s ep%d_%s_matches_ep1: worst rel diff %.3g, ranks without rows %g\n",
               bad ? "FAIL" : "PASS", n, c->name, w, idle);
    layer_free(&ref);
    layer_free(&ep);
    ep_free(&ctx);
    mem_release(&arena);
    return bad;
}

/* Stats hook: n ranks with NTOK tokens each, one sequence split over the world as the cp group
 * (the stats group), against one layer over all n*NTOK tokens: aux and z losses, loads,
 * outputs of this rank's rows, and the router gradient summed over ranks. */
static int run_stats_case(ust_comm *world, const ust_ops *o, int rank, int n) {
    ust_config cfg;
    moe_cfg(&cfg, ARCH_LLAMA, 2);
    cfg.model.moe.aux_loss_coef = 0.2;
    cfg.model.moe.z_loss_coef = 0.1;
    ust_arena arena;
    mem_init(&arena, o);
    ep_case c = {"stats", ARCH_LLAMA, 2, 0, 0, 0};
    layer full, shard;
    ust_cp cp; /* one head of width 1: only its group and positions are used */
    cp_init(&cp, o, world, NULL, NULL, &arena, n * NTOK, 1, 1, 1, 1, 0, CP_CONTIGUOUS, CP_RING, 1);
    moe_groups g = {.cp = &cp};
    layer_make(&full, &cfg, o, &arena, n * NTOK, NULL, NULL);
    fill_weights(&full.pl, &c);
    layer_make(&shard, &cfg, o, &arena, NTOK, &g, &full.pl);
    float *x = mem_alloc(&arena, MEM_ACTS, (size_t)n * NTOK * C * 4);
    float *dy = mem_alloc(&arena, MEM_ACTS, (size_t)n * NTOK * C * 4);
    for (int s = 0; s < n; s++)
        fill_tokens(x + (int64_t)s * NTOK * C, dy + (int64_t)s * NTOK * C, s, NTOK, 0);
    layer_run(&full, x, dy);
    const float *xs = x + (int64_t)rank * NTOK * C, *dys = dy + (int64_t)rank * NTOK * C;
    layer_run(&shard, xs, dys);
    double worst =
        fabs(full.st.aux_loss - shard.st.aux_loss) + fabs(full.st.z_loss - shard.st.z_loss);
    worst += fabs(full.st.load_max - shard.st.load_max) + (full.st.tokens != shard.st.tokens);
    worst = fmax(worst, maxdiff(shard.y, full.y + (int64_t)rank * NTOK * C, NTOK * C));
    worst = fmax(worst, maxdiff(shard.dx, full.dx + (int64_t)rank * NTOK * C, NTOK * C));
    comm_req r = comm_allreduce(world, shard.g.router, shard.g.router, E * C, COMM_FP32, COMM_SUM);
    comm_wait(&r);
    worst = fmax(worst, maxdiff(shard.g.router, full.g.router, E * C));
    float v = (float)worst, all[8] = {0};
    r = comm_allgather(world, &v, all, 1, COMM_FP32);
    comm_wait(&r);
    float w = 0;
    for (int i = 0; i < n; i++) w = fmaxf(w, all[i]) + (all[i] != all[i]);
    int bad = !(w <= TOL);
    if (rank == 0)
        printf("%s stats%d_aux_and_z_loss_over_the_stats_group_match_one_rank_with_all_tokens: "
               "worst %.3g (aux %.6f)\n",
               bad ? "FAIL" : "PASS", n, w, full.st.aux_loss);
    layer_free(&full);
    layer_free(&shard);
    cp_free(&cp);
    mem_release(&arena);
    return bad;
}

/* Node-limited routing over faked nodes: the world's ranks as 2 nodes (ranks [0, n/2) node 0),
 * model.moe.n_group 2 so expert group g (experts [4g, 4g+4)) lives on node g. With
 * max_nodes_per_token 1 every token's top-2 experts are on one node, where plain top-2 reaches
 * both; and the bytes the dispatch and combine sent across nodes (ep.bytes_internode, forward and
 * backward) equal a count from every rank's routing: 2 x (this rank's copies for experts on the
 * other node + the copies its experts held for tokens from there) x C fp32. */
static int run_nodes_case(ust_comm *world, const ust_ops *o, int rank, int n, int M) {
    ust_config cfg;
    moe_cfg(&cfg, ARCH_LLAMA, 2);
    cfg.model.moe.score = MOE_SIGMOID;
    cfg.model.moe.n_group = M ? 2 : 1;
    cfg.model.moe.max_nodes_per_token = M;
    ust_arena arena;
    mem_init(&arena, o);
    ust_ep ctx;
    int64_t send, recv;
    moe_dispatch_rows(&cfg, NTOK, n, &send, &recv);
    ep_init(&ctx, o, world, &arena, E, C, send, recv);
    int node[8], El = E / n;
    for (int i = 0; i < n; i++) node[i] = i >= n / 2;
    ep_set_nodes(&ctx, node);
    moe_groups g = {.ep = &ctx};
    layer L;
    layer_make(&L, &cfg, o, &arena, NTOK, &g, NULL);
    ep_case c = {"nodes", ARCH_LLAMA, 2, 0, 0, 0};
    fill_weights(&L.pl, &c);
    float *x = mem_alloc(&arena, MEM_ACTS, NTOK * C * 4),
          *dy = mem_alloc(&arena, MEM_ACTS, NTOK * C * 4);
    fill_tokens(x, dy, rank, NTOK, 0);
    layer_run(&L, x, dy);
    /* every rank's choices (global experts, exact as floats) */
    float mine[NTOK * 2], all[8 * NTOK * 2];
    for (int i = 0; i < NTOK * 2; i++) mine[i] = (float)L.a.topk[i];
    comm_req r = comm_allgather(world, mine, all, NTOK * 2, COMM_FP32);
    comm_wait(&r);
    int most = 0; /* the most nodes one token's experts are on, over every rank's tokens */
    int64_t copies = 0;
    for (int s = 0; s < n; s++)
        for (int t = 0; t < NTOK; t++) {
            int on[2] = {0, 0};
            for (int j = 0; j < 2; j++) {
                int holder = (int)all[(s * NTOK + t) * 2 + j] / El;
                on[node[holder]] = 1;
                /* sent by this rank (its token) or sent back by it (its expert's output) */
                if (node[holder] != node[s] && (s == rank || holder == rank)) copies++;
            }
            most = on[0] + on[1] > most ? on[0] + on[1] : most;
        }
    uint64_t want = 2 * (uint64_t)copies * C * sizeof(float), got = ctx.bytes_internode;
    float v[2] = {got == want ? 0.0f : 1.0f, (float)got}, res[16] = {0};
    r = comm_allgather(world, v, res, 2, COMM_FP32);
    comm_wait(&r);
    float wrong = 0, total = 0;
    for (int i = 0; i < n; i++) wrong += res[2 * i], total += res[2 * i + 1];
    int bad = wrong > 0 || total == 0 || most != (M ? M : 2);
    if (rank == 0)
        printf("%s ep%d_internode_bytes_equal_the_routing_count_%s: %g ranks off (rank 0: %llu "
               "bytes, by hand %llu), a token's experts on at most %d node(s)\n",
               bad ? "FAIL" : "PASS", n, M ? "max_nodes_per_token_1" : "plain_top2", wrong,
               (unsigned long long)got, (unsigned long long)want, most);
    layer_free(&L);
    ep_free(&ctx);
    mem_release(&arena);
    return bad;
}

static int ep_check(void) {
    test_world tw;
    if (test_world_join(&tw, "ep")) return 1;
    ust_comm *world = tw.comm;
    int n = comm_size(world), rank = comm_rank(world);
    ust_ops *o = ops_cpu_create(1, 1);
    static const ep_case cases[] = {
        {"llama_top2_random", ARCH_LLAMA, 2, 0, 0, 0},
        {"gpt2_top1_shared_random", ARCH_GPT2, 1, 1, 0, 0},
        {"llama_top1_skewed_all_tokens_to_one_expert", ARCH_LLAMA, 1, 0, 1, 0},
        {"gpt2_top2_shared_skewed", ARCH_GPT2, 2, 1, 1, 0},
        {"llama_top2_capacity_drops_before_dispatch", ARCH_LLAMA, 2, 1, 0, 0.5},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        bad |= run_case(&cases[i], world, o, rank, n);
    bad |= run_stats_case(world, o, rank, n);
    bad |= run_nodes_case(world, o, rank, n, 1) | run_nodes_case(world, o, rank, n, 0);
    o->destroy(o);
    test_world_leave(&tw);
    return bad;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--ep-check")) return ep_check();
    RUN_TEST(test_single_rank_plan_is_identity);
    return TEST_SUMMARY();
}
