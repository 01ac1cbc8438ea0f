/* train_build.c: a rank's runtime, built in the one order the run and its memory plan share.
 * The run builds against its backend's arena with its groups; the plan (plan.c) against a
 * counting arena as rank 0 of every group, with shape-only contexts where the run's need a
 * communicator, so the plan's figures are this build's own allocations. */
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "params.h"
#include "train_internal.h"

/* The contexts of the dimensions that split a layer (tensor, context and expert parallelism),
 * each over the group it owns; the plan's carve what they would and talk to nobody. */
/* The memory map's owners of what follows: the activations' and communication's named by who
 * carves them (the model's activations name themselves: acts.c) */
static void build_owner(train_engine *g, const char *acts, const char *comm, const char *other) {
    mem_label(&g->arena, MEM_ACTS, acts);
    mem_label(&g->arena, MEM_COMM, comm);
    mem_label(&g->arena, MEM_OTHER, other);
}

static void build_contexts(train_engine *g, const ust_config *cfg, const ust_topology *topo) {
    const __typeof__(cfg->parallel) *l = &cfg->parallel;
    build_owner(g, "acts.tp.sp_scratch", "comm.tp", NULL);
    int B = cfg->train.micro_batch_size, T = cfg->train.seq_len, Tl = T / l->cp;
    int C = cfg->model.d_model, hd = cfg_head_dim(cfg);
    if (topo) {
        tp_init(&g->tp, g->ops, topo->comm[TOPO_TP], &g->arena, B * Tl, C, l->sp);
    } else {
        g->tp = tp_shape(g->ops, l->tp, B * Tl, C, l->sp);
        tp_alloc_scratch(&g->tp, &g->arena);
    }
    build_owner(g, "acts.cp.scratch", "comm.cp", NULL);
    int start, H = tp_part(&g->tp, cfg->model.n_head, &start); /* attention after the tp split */
    int Hkv = tp_part(&g->tp, cfg->model.n_kv_head, &start);
    if (topo) {
        cp_init(&g->cp, g->ops, topo->comm[TOPO_CP], topo->comm[TOPO_CPA], topo->comm[TOPO_CPR],
                &g->arena, T, B, H, Hkv, hd, cfg_cp_latent(cfg), l->cp_layout, l->cp_comm,
                cfg_cp_a2a(cfg));
    } else {
        g->cp = cp_shape(g->ops, l->cp, l->cp > 1 ? cfg_cp_a2a(cfg) : 1, T, B, Hkv, hd,
                         cfg_cp_latent(cfg), l->cp_comm);
        cp_alloc_buffers(&g->cp, &g->arena, H);
    }
    /* the MoE layers' dispatch context, sized for their tokens (the plan's is counted with the
     * model's MoE context: params_shape) */
    build_owner(g, "acts.moe.dispatch", "comm.ep", NULL);
    if (g->has_moe && topo) {
        int64_t send, recv;
        moe_dispatch_rows(cfg, (int64_t)B * Tl, l->ep, &send, &recv);
        ep_init(&g->ep, g->ops, l->ep > 1 ? topo->comm[TOPO_EP] : NULL, &g->arena,
                cfg->model.moe.num_experts, C, send, recv);
    }
    build_owner(g, NULL, NULL, NULL);
}

/* Where the model's tensors live on this rank: the ZeRO unit padding over the ranks that sum
 * dense gradients (the data-parallel replicas and the context-parallel parts of each
 * sequence), the contexts, and the pipeline stages this rank holds with their activation sets
 * (the run asks the pipeline's schedule, which its executor then runs; the plan is given them). */
static int build_storage(train_engine *g, const ust_config *cfg, const train_build_at *at,
                         model_storage *st, pps_schedule *sched, ust_err *e) {
    const __typeof__(cfg->parallel) *l = &cfg->parallel;
    *st = dp_model_storage(cfg, at->topo ? comm_size(at->topo->comm[TOPO_DPCP]) : l->dp * l->cp);
    st->tp = &g->tp;
    st->cp = &g->cp;
    if (g->has_moe && at->topo) st->ep = &g->ep;
    int slots[MODEL_MAX_CHUNKS] = {0};
    if (at->topo) {
        /* one stage's schedule is plain gradient accumulation (no transfers) */
        if (pp_plan(cfg, at->pp_rank, sched, slots, e)) return -1;
        st->zb = l->pp > 1 && pps_splits(sched); /* zb, dualpipev: W's keep their weight grads */
    } else {
        memcpy(slots, at->slots, sizeof slots);
        st->zb = at->zb;
    }
    pp_stages(cfg, at->pp_rank, slots, st); /* the pipeline decides the stages this rank holds */
    return 0;
}

int train_build_rank(train_engine *g, const ust_config *cfg, const train_build_at *at, ust_err *e) {
    const ust_topology *topo = at->topo;
    g->has_moe = cfg->model.moe.num_experts > 0;
    build_contexts(g, cfg, topo);
    model_storage st;
    pps_schedule sched = {0};
    if (build_storage(g, cfg, at, &st, &sched, e)) return -1;
    const __typeof__(cfg->parallel) *l = &cfg->parallel;
    dp_groups groups = {.dense_n = l->dp * l->cp, .expert_n = l->dp / l->ep * l->cp};
    if (topo) {
        groups = (dp_groups){.dense = topo->comm[TOPO_DPCP],
                             .expert = topo->comm[TOPO_EDPCP],
                             .ep = topo->comm[TOPO_EP],
                             .mp = topo->comm[TOPO_TP],
                             .pipe = l->pp > 1 ? topo->comm[TOPO_PP] : NULL,
                             .mirror = topo->comm[TOPO_MIRROR]};
    }
    build_owner(g, "acts.moe.dispatch", "comm.moe", NULL); /* the MoE context's */
    if (topo) {
        if (model_create_with(&g->m, cfg, g->ops, &g->arena, &st, e)) {
            pps_free(&sched);
            return -1;
        }
    } else {
        g->m = params_shape(cfg, g->ops, &st, at->whole, &g->arena);
    }
    build_owner(g, NULL, "comm.dp", "scratch.dp_stats");
    int bad = dp_create(&g->dp, cfg, g->ops, &g->arena, g->m, &groups, e);
    build_owner(g, NULL, "comm.pp", NULL);
    if (bad) {
        pps_free(&sched);
        return -1;
    }
    if (topo)
        g->pp = pp_create(cfg, g->ops, &g->arena, g->m, topo->comm[TOPO_PP], topo->comm[TOPO_EMB],
                          &sched);
    else
        pp_alloc_scalars(&g->arena, l->pp); /* the executor's own: every schedule is the run's */
    build_owner(g, NULL, "comm.train", NULL);
    g->flag = mem_alloc(&g->arena, MEM_COMM, sizeof(float)); /* train_any_rank's */
    /* QK-clip, or the stats' logits: this rank's table, then every rank's (device), and their
     * host copy that train_qk_end reduces (a run's, not the plan's: host memory) */
    if (cfg->optimizer.qk_clip_threshold > 0 || cfg->logging.stats_every > 0) {
        size_t bytes = (size_t)(1 + l->dp * l->tp * l->pp * l->cp) * cfg->model.n_layer *
                       cfg->model.n_head * sizeof(float);
        g->qk_buf = mem_alloc(&g->arena, MEM_COMM, bytes);
        g->qk_host = topo ? malloc(bytes) : NULL;
        UST_ASSERT(!topo || g->qk_host, "out of host memory (%zu bytes of logit tables)", bytes);
    }
    if (cfg->logging.stats_every > 0) /* the activation sums' world reduction */
        g->sums = mem_alloc(&g->arena, MEM_COMM, 8 * sizeof(float));
    build_owner(g, NULL, NULL, NULL);
    return 0;
}

/* The sum of v over group k through the one device float. */
double train_group_sum(trainer *t, int k, double v) {
    const ust_comm *g = t->rt->topo.comm[k];
    if (!g || comm_size(g) == 1) return v;
    float f = (float)v;
    t->eng.ops->to_device(t->eng.ops, t->eng.flag, &f, sizeof f);
    comm_req r = comm_allreduce((ust_comm *)g, t->eng.flag, t->eng.flag, 1, COMM_FP32, COMM_SUM);
    comm_wait(&r);
    t->eng.ops->to_host(t->eng.ops, &f, t->eng.flag, sizeof f);
    return f;
}

/* 1 when flag is set on any rank of the job. */
int train_any_rank(trainer *t, int flag) {
    if (t->rt->world == 1) return flag;
    return train_group_sum(t, TOPO_WORLD, flag) > 0;
}
