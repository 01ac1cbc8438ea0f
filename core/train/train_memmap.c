/* train_memmap.c: the memory map on overflow. The arena gets a limit (run.memory_limit_mb, or on
 * a GPU the device's free memory at start-up); an allocation that would pass it prints, and
 * writes as JSON (run.out_dir/memory_map_rank_R.json), the arena by owner beside the memory
 * plan's figure for each (plan.c: the same allocators' arithmetic, so an owner allocated whole
 * equals its plan), and names the planner's next option for the largest owner. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fs.h"
#include "plan.h"
#include "train_internal.h"

/* The map's rows: every owner of the arena, then those only the plan has (the ones the failed
 * allocation never reached), each with its plan; the rows sum to the arena's total. */
typedef struct {
    const char *name;
    mem_cat cat;
    size_t bytes, plan;
    int count;
} map_row;

static int map_rows(const ust_arena *a, const ust_arena *plan, map_row *rows) {
    int n = 0;
    for (int i = 0; i < a->nowners; i++)
        rows[n++] = (map_row){a->owners[i].name, a->owners[i].cat, a->owners[i].bytes, 0,
                              a->owners[i].count};
    for (int j = 0; j < plan->nowners; j++) {
        const mem_owner *o = &plan->owners[j];
        int i = 0;
        while (i < n && (rows[i].cat != o->cat || strcmp(rows[i].name, o->name))) i++;
        if (i == n) rows[n++] = (map_row){o->name, o->cat, 0, 0, 0};
        rows[i].plan = o->bytes;
    }
    for (int i = 1; i < n; i++) /* by category, each in order of allocation */
        for (int j = i; j > 0 && rows[j - 1].cat > rows[j].cat; j--) {
            map_row r = rows[j];
            rows[j] = rows[j - 1], rows[j - 1] = r;
        }
    return n;
}

/* The planner's next option for what fills the arena most: activations (the largest row of them
 * named): more recompute; the model's states: a higher ZeRO stage; else (or both exhausted) more
 * pipeline stages. */
static void next_option(const ust_config *c, const mem_plan *p, const map_row *rows, int nrows,
                        char *out, size_t n) {
    double states = p->params + p->grads + p->optim;
    const map_row *big = NULL;
    for (int i = 0; i < nrows; i++)
        if (rows[i].cat == MEM_ACTS && (!big || rows[i].plan > big->plan)) big = &rows[i];
    if (p->acts >= states && c->train.recompute != RECOMPUTE_FULL && big)
        snprintf(out, n,
                 "train.recompute: %s (activations are the largest owner, %s the largest of "
                 "them)",
                 c->train.recompute == RECOMPUTE_NONE ? "selective, or full" : "full", big->name);
    else if (c->optimizer.zero_stage < 3)
        snprintf(out, n,
                 "optimizer.zero_stage: %d (parameters, gradients and optimizer state are "
                 "the largest owners)",
                 c->optimizer.zero_stage + 1);
    else
        snprintf(out, n, "parallel.pp: %d (each stage holds fewer layers)", 2 * c->parallel.pp);
}

static void write_json(trainer *t, const ust_arena *a, const char *owner, mem_cat cat, size_t bytes,
                       const map_row *rows, int n, double plan_total, const char *next, char *path,
                       size_t len) {
    snprintf(path, len, "%s/memory_map_rank_%d.json", t->cfg->run.out_dir, t->rt->rank);
    ust_err e;
    FILE *f = fs_mkdir_p(t->cfg->run.out_dir, &e) ? NULL : fopen(path, "w");
    if (!f) {
        snprintf(path, len, "(not written: %s)", t->cfg->run.out_dir);
        return;
    }
    fprintf(f,
            "{\"rank\": %d, \"limit\": %zu, \"request\": {\"owner\": \"%s\", \"category\": "
            "\"%s\", \"bytes\": %zu},\n \"categories\": {",
            t->rt->rank, a->limit, owner, mem_cat_name(cat), bytes);
    for (int c = 0; c < MEM_NCAT; c++)
        fprintf(f, "%s\"%s\": %zu", c ? ", " : "", mem_cat_name((mem_cat)c), a->bytes[c]);
    const char *keys[3] = {"arena", "plan", "count"};
    for (int k = 0; k < 3; k++) {
        fprintf(f, "},\n \"%s\": {", keys[k]);
        for (int i = 0; i < n; i++)
            fprintf(f, "%s\"%s\": %zu", i ? ", " : "", rows[i].name,
                    k == 0   ? rows[i].bytes
                    : k == 1 ? rows[i].plan
                             : (size_t)rows[i].count);
    }
    fprintf(f, "}, \"arena_total\": %zu, \"plan_total\": %.0f,\n \"next\": \"%s\"}\n", a->total,
            plan_total, next);
    if (fclose(f)) snprintf(path, len, "(not written: %s)", t->cfg->run.out_dir);
}

static void print_map(const trainer *t, const ust_arena *a, const char *owner, mem_cat cat,
                      size_t bytes, const map_row *rows, int n, double plan_total) {
    const double MiB = 1024.0 * 1024;
    fprintf(stderr,
            "ustrain[rank %d]: error: memory: %.2f MiB more for %s would take the arena to %.2f "
            "MiB, past its limit of %.2f MiB (%s); the arena by owner, beside the plan:\n",
            t->rt->rank, bytes / MiB, owner, (a->total + bytes) / MiB, a->limit / MiB,
            t->cfg->run.memory_limit_mb > 0 ? "run.memory_limit_mb" : "the device's free memory");
    fprintf(stderr, "  %-22s %7s %12s %16s\n", "owner", "buffers", "arena", "plan");
    for (int i = 0; i < n; i++)
        fprintf(stderr, "  %-22s %7d %8.2f MiB   plan %8.2f MiB%s\n", rows[i].name, rows[i].count,
                rows[i].bytes / MiB, rows[i].plan / MiB,
                rows[i].cat == cat && !strcmp(rows[i].name, owner) ? "   <- this allocation's owner"
                                                                   : "");
    fprintf(stderr, "  %-22s %7s %8.2f MiB   plan %8.2f MiB\n", "total", "", a->total / MiB,
            plan_total / MiB);
}

static void on_overflow(void *ctx, const ust_arena *a, mem_cat cat, size_t bytes) {
    trainer *t = ctx;
    mem_plan p;
    ust_arena count;
    plan_memory_owners(t->cfg, t->rt->topo.me.pp, &p, &count);
    map_row rows[2 * MEM_MAX_OWNERS];
    int n = map_rows(a, &count, rows);
    const char *owner = a->label[cat] ? a->label[cat] : mem_cat_name(cat);
    char next[200], path[UST_PATH_MAX + 64];
    next_option(t->cfg, &p, rows, n, next, sizeof next);
    write_json(t, a, owner, cat, bytes, rows, n, (double)count.total, next, path, sizeof path);
    print_map(t, a, owner, cat, bytes, rows, n, (double)count.total);
    fprintf(stderr, "memory map: %s\nnext: %s, or `ustrain plan` for a layout that fits\n", path,
            next);
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
