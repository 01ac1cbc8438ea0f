#include "plan.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "log.h"
#include "params.h"
#include "train_internal.h"

/* The plan of pipeline rank r (every rank without a pipeline): rank 0 of its tensor-, context-
 * and expert-parallel groups, built as the run builds it (train_build_rank, with the activation
 * sets pp_plan gives each chunk) against a counting arena, so every figure is the arena's own. */
static void plan_count(const ust_config *c, int r, int whole, const int *sets, int zb, mem_plan *p,
                       ust_arena *owners) {
    ust_ops sizes = {.act_size = cfg_act_size(c)}; /* no backend: element sizes only */
    train_engine g = {.ops = &sizes};
    mem_init_counting(&g.arena);
    train_build_at at = {.pp_rank = r, .slots = sets, .zb = zb, .whole = whole};
    ust_err e;
    UST_ASSERT(train_build_rank(&g, c, &at, &e) == 0, "%s", e.msg); /* the plan's never fails */
    p->ckpt_staging = c->checkpoint.async ? (double)dp_save_bytes(g.dp) : 0;
    p->n_params = whole ? model_all_numel(g.m) : 0;
    /* the token embedding's padding rows, and the head's when it is a tensor of its own */
    p->n_pad_params = whole ? (int64_t)(cfg_vocab_padded(c) - c->model.vocab_size) *
                                  c->model.d_model * (cfg_tied(c) ? 1 : 2)
                            : 0;
    dp_destroy(g.dp);
    params_shape_free(g.m);
    const ust_arena *count = &g.arena;
    p->params = (double)count->bytes[MEM_PARAMS];
    p->grads = (double)count->bytes[MEM_GRADS];
    p->optim = (double)count->bytes[MEM_OPTIM];
    p->acts = (double)count->bytes[MEM_ACTS];
    p->comm = (double)count->bytes[MEM_COMM];
    p->total = p->params + p->grads + p->optim + p->acts + p->comm;
    if (owners) *owners = g.arena;
}

void plan_memory_rank_sets(const ust_config *c, int r, int whole, const int *sets, int zb,
                           mem_plan *p) {
    plan_count(c, r, whole, sets, zb, p, NULL);
}

static void plan_rank(const ust_config *c, int r, int whole, mem_plan *p, ust_arena *owners) {
    int slots[MODEL_MAX_CHUNKS] = {0}, zb = 0;
    ust_err e;
    if (pp_activation_sets(c, r, slots, &zb, &e)) slots[0] = 1; /* validation reports it */
    plan_count(c, r, whole, slots, zb, p, owners);
}

void plan_memory(const ust_config *c, mem_plan *p) { plan_rank(c, 0, 1, p, NULL); }

void plan_memory_rank(const ust_config *c, int pp_rank, mem_plan *p) {
    plan_rank(c, pp_rank, 1, p, NULL);
}

void plan_memory_owners(const ust_config *c, int pp_rank, mem_plan *p, ust_arena *count) {
    plan_rank(c, pp_rank, 1, p, count);
}

void plan_activation_sets(const ust_config *c, int (*slots)[MODEL_MAX_CHUNKS], int *zb) {
    ust_err e;
    int pp = c->parallel.pp;
    if (pp_activation_sets_all(c, slots, zb, &e) == 0) return;
    for (int r = 0; r < pp; r++) { /* as plan_rank */
        memset(slots[r], 0, sizeof slots[r]);
        slots[r][0] = 1, zb[r] = 0;
    }
}

double plan_memory_peak_sets(const ust_config *c, const int (*slots)[MODEL_MAX_CHUNKS],
                             const int *zb) {
    double peak = 0;
    for (int r = 0; r < c->parallel.pp; r++) {
        mem_plan q;
        plan_memory_rank_sets(c, r, 0, slots[r], zb[r], &q);
        if (q.total > peak) peak = q.total;
    }
    return peak;
}

double plan_memory_peak(const ust_config *c) {
    int pp = c->parallel.pp, (*slots)[MODEL_MAX_CHUNKS] = calloc(pp, sizeof *slots);
    int *zb = calloc(pp, sizeof *zb);
    UST_ASSERT(slots && zb, "out of memory for %d pipeline ranks' plans", pp);
    plan_activation_sets(c, slots, zb);
    double peak = plan_memory_peak_sets(c, (const int(*)[MODEL_MAX_CHUNKS])slots, zb);
    free(slots), free(zb);
    return peak;
}

int plan_check_fits(const ust_config *c, ust_err *e) {
    char need[32], one[32], have[32];
    const __typeof__(c->parallel) *l = &c->parallel;
    if (c->run.device == DEV_CUDA) {
        double peak = plan_memory_peak(c);
        if (peak <= PLAN_MAX_DEVICE_BYTES) return 0;
        return ust_errf(e,
                        "%s: the memory plan needs %s (%.0f bytes) on the busiest rank; no GPU has "
                        "more than %s: shard the model (parallel.tp, pp, cp, ep; "
                        "optimizer.zero_stage) or shrink it, the batch or train.seq_len",
                        c->source, log_bytes(need, 32, peak), peak,
                        log_bytes(have, 32, PLAN_MAX_DEVICE_BYTES));
    }
    /* ranks differ only by pipeline stage: each stage's plan is held by dp * tp * cp ranks */
    double total = 0, peak = 0, per_stage = (double)l->dp * l->tp * l->cp;
    for (int r = 0; r < l->pp; r++) {
        mem_plan q;
        plan_rank(c, r, 0, &q, NULL);
        total += q.total * per_stage;
        if (q.total > peak) peak = q.total;
    }
    long long ranks = (long long)per_stage * l->pp;
    /* A job over several nodes (the launcher says how many ranks run here): this machine holds
     * only its own ranks, counted at the busiest stage's plan. */
    const char *lw = getenv("LOCAL_WORLD_SIZE");
    if (!lw || !*lw) lw = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    long long local = lw ? atoll(lw) : 0;
    if (local >= 1 && local < ranks && (double)local * peak < total) {
        total = (double)local * peak;
        ranks = local;
    }
    double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (ram <= 0 || total <= ram) return 0;
    return ust_errf(e,
                    "%s: the memory plan needs %s (%.0f bytes) for the %lld rank%s of this layout "
                    "on run.device cpu (up to %s each), but this machine has %s of physical "
                    "memory: shrink the model, the batch or train.seq_len, or shard it "
                    "(optimizer.zero_stage, train.recompute)",
                    c->source, log_bytes(need, 32, total), total, ranks, ranks == 1 ? "" : "s",
                    log_bytes(one, 32, peak), log_bytes(have, 32, ram));
}

void plan_print(const ust_config *c, const mem_plan *p, FILE *f) {
    char b[5][32];
    fprintf(f, "memory plan per rank (%s; ZeRO-%d over dp=%d; recompute %s):\n",
            cfg_act_size(c) == 2 ? "fp32, activations bf16" : "fp32", c->optimizer.zero_stage,
            c->parallel.dp,
            c->train.recompute == RECOMPUTE_FULL        ? "full"
            : c->train.recompute == RECOMPUTE_SELECTIVE ? "selective"
                                                        : "none");
    fprintf(f, "  parameters  %12s  (%lld in the model: %lld, and %lld of vocabulary padding)\n",
            log_bytes(b[0], 32, p->params), (long long)p->n_params,
            (long long)(p->n_params - p->n_pad_params), (long long)p->n_pad_params);
    fprintf(f, "  gradients   %12s\n", log_bytes(b[1], 32, p->grads));
    fprintf(f, "  optimizer   %12s  (AdamW m and v)\n", log_bytes(b[2], 32, p->optim));
    fprintf(f, "  activations %12s  (one micro-batch of %d x %d tokens)\n",
            log_bytes(b[3], 32, p->acts), c->train.micro_batch_size, c->train.seq_len);
    fprintf(f, "  total       %12s  (%.0f bytes)\n", log_bytes(b[4], 32, p->total), p->total);
    if (c->checkpoint.async)
        fprintf(f,
                "  + host: checkpoint staging %s (%.0f bytes; checkpoint.async: the slices this "
                "rank writes)\n",
                log_bytes(b[4], 32, p->ckpt_staging), p->ckpt_staging);
    if (c->parallel.pp > 1) {
        const char *held = c->parallel.pp_schedule == PP_DUALPIPEV ? "stages r and 2pp-1-r"
                           : c->parallel.pp_schedule == PP_DUALPIPE
                               ? "stages r and pp-1-r, each held twice"
                               : "stages r, r+pp, ...";
        fprintf(f, "by pipeline rank (%s; micro-batches in flight per %s):\n", held,
                c->parallel.pp_schedule == PP_AFAB ? "afab: all of them" : "the schedule");
        for (int r = 0; r < c->parallel.pp; r++) {
            mem_plan q;
            char s[3][32];
            plan_rank(c, r, 0, &q, NULL);
            fprintf(f, "  pp rank %-3d parameters %10s  activations %10s  total %10s\n", r,
                    log_bytes(s[0], 32, q.params), log_bytes(s[1], 32, q.acts),
                    log_bytes(s[2], 32, q.total));
        }
    }
    fprintf(f,
            "by ZeRO stage at dp=%d (per rank):\n  stage   parameters    gradients    optimizer"
            "        total\n",
            c->parallel.dp);
    for (int z = 0; z <= 3; z++) {
        ust_config other = *c;
        other.optimizer.zero_stage = z;
        mem_plan q;
        plan_memory(&other, &q);
        char s[4][32];
        fprintf(f, "  %5d %12s %12s %12s %12s%s\n", z, log_bytes(s[0], 32, q.params),
                log_bytes(s[1], 32, q.grads), log_bytes(s[2], 32, q.optim),
                log_bytes(s[3], 32, q.total), z == c->optimizer.zero_stage ? "  <- this run" : "");
    }
}
