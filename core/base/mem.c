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
    a->frozen = 0;
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
