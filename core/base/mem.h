/* mem: one arena per rank. Every buffer the run needs (parameters, gradients, optimizer state,
 * activations, communication, other) is carved from it during setup under a category, so the
 * memory report is the arena's own accounting. After mem_freeze() any allocation is an internal
 * error: nothing is allocated inside the step loop. */
#ifndef UST_MEM_H
#define UST_MEM_H

#include <stddef.h>

#include "ops.h"

typedef enum { MEM_PARAMS, MEM_GRADS, MEM_OPTIM, MEM_ACTS, MEM_COMM, MEM_OTHER, MEM_NCAT } mem_cat;

/* An owner: the bytes one kind of buffer takes, under its category (params, grads, optimizer,
 * comm, other by the category's name; the activations and scratch by what they hold, e.g.
 * "acts.layer.attn"), and how many buffers. The rows of an arena sum to its total. */
#define MEM_MAX_OWNERS 48
typedef struct {
    const char *name; /* a string that outlives the arena (a literal) */
    mem_cat cat;
    size_t bytes;
    int count;
} mem_owner;

struct ust_arena_s;
/* Called when an allocation would take the arena past its limit (mem_set_limit), before the
 * run exits: the memory map's report. */
typedef void (*mem_overflow_fn)(void *ctx, const struct ust_arena_s *a, mem_cat cat, size_t bytes);

typedef struct ust_arena_s {
    const ust_ops *ops;
    size_t bytes[MEM_NCAT];
    size_t total, peak;
    int frozen;
    void **blocks; /* every allocation, to free them (grows as needed) */
    int nblocks, cap;
    size_t limit; /* 0: none; else mem_alloc past it reports (overflow) and exits 2 */
    mem_overflow_fn overflow;
    void *overflow_ctx;
    mem_owner owners[MEM_MAX_OWNERS]; /* in order of first allocation */
    int nowners, last;
    const char *label[MEM_NCAT]; /* mem_label's: the owner of each category's allocations */
} ust_arena;

void mem_init(ust_arena *a, const ust_ops *ops);
/* An arena that only counts: mem_alloc adds the bytes to its categories exactly as a real one
 * would and returns NULL, with no backend behind it. The memory plan runs the allocators
 * against one, so the plan is the allocation's own arithmetic. */
void mem_init_counting(ust_arena *a);
int mem_counting(const ust_arena *a);
void *mem_alloc(ust_arena *a, mem_cat cat, size_t bytes); /* zeroed; fatal when frozen */
void mem_freeze(ust_arena *a);
/* run.memory_limit_mb, or the device's free memory: an allocation that would take the arena's
 * total past limit calls fn (the owner map) and exits 2 instead of allocating. */
void mem_set_limit(ust_arena *a, size_t limit, mem_overflow_fn fn, void *ctx);
void mem_release(ust_arena *a); /* frees everything */
/* Names the owner of the allocations of category cat that follow (NULL: the category's name);
 * returns the label cat had (NULL if none), to put back when the caller's buffers are done. */
const char *mem_label(ust_arena *a, mem_cat cat, const char *name);
const char *mem_cat_name(mem_cat c);
size_t mem_peak_rss_bytes(void); /* VmHWM of this process (CPU) */

#endif
