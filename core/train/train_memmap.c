/* train_memmap.c: the memory map on overflow. The arena gets a limit (run.memory_limit_mb, or on
 * a GPU the device's free memory at start-up); an allocation that would pass it prints, and
 * writes as JSON (run.out_dir/memory_map_rank_R.json), the arena by owner beside the memory
 * plan's figure for each (plan.c: the same allocators' arithmetic, so an owner allocated whole
 * equals its plan), and names the planner's next option for the largest owner. */
#include <math.h>
#include <stdio.h>

#include "fs.h"
#include "plan.h"
#include "train_internal.h"

/* The planner's next option for what fills the arena most: activations: more recompute; the
 * model's states: a higher ZeRO stage; else (or both exhausted) more pipeline stages. */
static void next_option(const ust_config *c, const mem_plan *p, char *out, size_t n) {
    double states = p->params + p->grads + p->optim;
    if (p->acts >= states && c->train.recompute != RECOMPUTE_FULL)
        snprintf(out, n, "train.recompute: %s (activations are the largest owner)",
                 c->train.recompute == RECOMPUTE_NONE ? "selective, or full" : "full");
    else if (c->optimizer.zero_stage < 3)
        snprintf(out, n,
                 "optimizer.zero_stage: %d (parameters, gradients and optimizer state are "
                 "the largest owners)",
                 c->optimizer.zero_stage + 1);
    else
        snprintf(out, n, "parallel.pp: %d (each stage holds fewer layers)", 2 * c->parallel.pp);
}

static void write_json(trainer *t, const ust_arena *a, mem_cat cat, size_t bytes,
                       const double *plan, const char *next, char *path, size_t n) {
    snprintf(path, n, "%s/memory_map_rank_%d.json", t->cfg->run.out_dir, t->rt->rank);
    ust_err e;
    FILE *f = fs_mkdir_p(t->cfg->run.out_dir, &e) ? NULL : fopen(path, "w");
    if (!f) {
        snprintf(path, n, "(not written: %s)", t->cfg->run.out_dir);
        return;
    }
    fprintf(f, "{\"rank\": %d, \"limit\": %zu, \"request\": {\"owner\": \"%s\", \"bytes\": %zu},\n",
            t->rt->rank, a->limit, mem_cat_name(cat), bytes);
    fprintf(f, " \"arena\": {");
    for (int c = 0; c < MEM_NCAT; c++)
        fprintf(f, "%s\"%s\": %zu", c ? ", " : "", mem_cat_name((mem_cat)c), a->bytes[c]);
    fprintf(f, "}, \"arena_total\": %zu,\n \"plan\": {", a->total);
    for (int c = 0; c < MEM_NCAT; c++)
        fprintf(f, "%s\"%s\": %.0f", c ? ", " : "", mem_cat_name((mem_cat)c), plan[c]);
    fprintf(f, "}, \"plan_total\": %.0f,\n \"next\": \"%s\"}\n", plan[MEM_NCAT], next);
    if (fclose(f)) snprintf(path, n, "(not written: %s)", t->cfg->run.out_dir);
}

static void on_overflow(void *ctx, const ust_arena *a, mem_cat cat, size_t bytes) {
    trainer *t = ctx;
    mem_plan p;
    plan_memory_rank(t->cfg, t->rt->topo.me.pp, &p);
    double plan[MEM_NCAT + 1] = {p.params, p.grads, p.optim, p.acts, p.comm, 0, p.total};
    plan[MEM_OTHER] = p.total - (p.params + p.grads + p.optim + p.acts + p.comm);
    char next[160], path[UST_PATH_MAX + 64];
    next_option(t->cfg, &p, next, sizeof next);
    write_json(t, a, cat, bytes, plan, next, path, sizeof path);
    const double MiB = 1024.0 * 1024;
    fprintf(stderr,
            "ustrain[rank %d]: error: memory: %.1f MiB more for %s would take the arena to %.1f "
            "MiB, past its limit of %.1f MiB (%s); the arena by owner, beside the plan:\n",
            t->rt->rank, bytes / MiB, mem_cat_name(cat), (a->total + bytes) / MiB, a->limit / MiB,
            t->cfg->run.memory_limit_mb > 0 ? "run.memory_limit_mb" : "the device's free memory");
    for (int c = 0; c < MEM_NCAT; c++)
        fprintf(stderr, "  %-12s %10.1f MiB   plan %10.1f MiB%s\n", mem_cat_name((mem_cat)c),
                a->bytes[c] / MiB, plan[c] / MiB,
                c == (int)cat ? "   <- this allocation's owner" : "");
    fprintf(stderr,
            "  %-12s %10.1f MiB   plan %10.1f MiB\nmemory map: %s\nnext: %s, or `ustrain "
            "plan` for a layout that fits\n",
            "total", a->total / MiB, plan[MEM_NCAT] / MiB, path, next);
}

void train_memmap_arm(trainer *t) {
    double limit = t->cfg->run.memory_limit_mb * 1024.0 * 1024;
    if (limit <= 0 && t->cfg->run.device == DEV_CUDA) {
        ops_mem m = {0};
        t->eng.backend->memory(t->eng.backend, &m);
        limit = m.device_total > m.device_used ? (double)(m.device_total - m.device_used) : 0;
    }
    if (limit > 0) mem_set_limit(&t->eng.arena, (size_t)limit, on_overflow, t);
}
