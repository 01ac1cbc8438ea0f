#include "mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

void mem_init(ust_arena *a, const ust_ops *ops) {
    memset(a, 0, sizeof *a);
    a->ops = ops;
}

void mem_init_counting(ust_arena *a) { mem_init(a, NULL); }

int mem_counting(const ust_arena *a) { return a->ops == NULL; }

/* The row of this allocation's owner: the label when it is for this category, else the
 * category's own. Labels take at most MEM_MAX_OWNERS - MEM_NCAT rows; past them a label's bytes
 * go to its category's own row, which always has room, so the rows still sum to the total. */
static mem_owner *owner_of(ust_arena *a, mem_cat cat) {
    const char *name = a->label[cat] ? a->label[cat] : mem_cat_name(cat);
    mem_owner *o = &a->owners[a->last];
    if (a->nowners && o->cat == cat && (o->name == name || !strcmp(o->name, name))) return o;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < a->nowners; i++)
            if (a->owners[i].cat == cat && !strcmp(a->owners[i].name, name))
                return &a->owners[a->last = i];
        if (name == mem_cat_name(cat) || a->nowners < MEM_MAX_OWNERS - MEM_NCAT) break;
        name = mem_cat_name(cat); /* the labels' rows are full */
    }
    a->last = a->nowners++;
    a->owners[a->last] = (mem_owner){.name = name, .cat = cat};
    return &a->owners[a->last];
}

void *mem_alloc(ust_arena *a, mem_cat cat, size_t bytes) {
    UST_ASSERT(!a->frozen, "allocation of %zu bytes after setup (category %s)", bytes,
               mem_cat_name(cat));
    if (bytes == 0) bytes = 64;
    if (a->limit && a->total + bytes > a->limit) {
        if (a->overflow) a->overflow(a->overflow_ctx, a, cat, bytes);
        ust_fatal(UST_EXIT_USAGE,
                  "memory: %zu bytes of %s would take the arena from %zu to %zu bytes, past its "
                  "limit of %zu",
                  bytes, mem_cat_name(cat), a->total, a->total + bytes, a->limit);
    }
    a->bytes[cat] += bytes;
    a->total += bytes;
    mem_owner *o = owner_of(a, cat);
    o->bytes += bytes, o->count++;
    if (a->total > a->peak) a->peak = a->total;
    if (mem_counting(a)) return NULL;
    if (a->nblocks == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 256;
        a->blocks = realloc(a->blocks, (size_t)a->cap * sizeof *a->blocks);
        UST_ASSERT(a->blocks, "out of host memory for %d arena blocks", a->cap);
    }
    void *p = a->ops->alloc(a->ops, bytes);
    a->blocks[a->nblocks++] = p;
    return p;
}

void mem_freeze(ust_arena *a) { a->frozen = 1; }

void mem_set_limit(ust_arena *a, size_t limit, mem_overflow_fn fn, void *ctx) {
    a->limit = limit, a->overflow = fn, a->overflow_ctx = ctx;
}

void mem_release(ust_arena *a) {
    for (int i = 0; i < a->nblocks; i++) a->ops->free(a->ops, a->blocks[i]);
    a->nblocks = 0;
    free(a->blocks);
    a->blocks = NULL;
    a->cap = 0;
    a->total = 0;
    memset(a->bytes, 0, sizeof a->bytes);
    a->nowners = a->last = 0;
    memset(a->label, 0, sizeof a->label);
    a->frozen = 0;
}

const char *mem_label(ust_arena *a, mem_cat cat, const char *name) {
    const char *prev = a->label[cat];
    a->label[cat] = name;
    return prev;
}

const char *mem_cat_name(mem_cat c) {
    static const char *names[MEM_NCAT] = {"params",      "grads", "optimizer",
                                          "activations", "comm",  "other"};
    return c < MEM_NCAT ? names[c] : "?";
}

size_t mem_peak_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}
