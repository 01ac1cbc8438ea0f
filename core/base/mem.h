/* mem: one arena per rank. Every buffer the run needs (parameters, gradients, optimizer state,
 * activations, communication, other) is carved from it during setup under a category, so the
 * memory report is the arena's own accounting. After mem_freeze() any allocation is an internal
 * error: nothing is allocated inside the step loop. */
#ifndef UST_MEM_H
#define UST_MEM_H

#include <stddef.h>

#include "ops.h"

typedef enum { MEM_PARAMS, MEM_GRADS, MEM_OPTIM, MEM_ACTS, MEM_COMM, MEM_OTHER, MEM_NCAT } mem_cat;

typedef struct {
    const ust_ops *ops;
    size_t bytes[MEM_NCAT];
    size_t total, peak;
    int frozen;
    void **blocks; /* every allocation, to free them (grows as needed) */
    int nblocks, cap;
} ust_arena;

void mem_init(ust_arena *a, const ust_ops *ops);
/* An arena that only counts: mem_alloc adds the bytes to its categories exactly as a real one
 * would and returns NULL, with no backend behind it. The memory plan runs the allocators
 * against one, so the plan is the allocation's own arithmetic. */
void mem_init_counting(ust_arena *a);
int mem_counting(const ust_arena *a);
void *mem_alloc(ust_arena *a, mem_cat cat, size_t bytes); /* zeroed; fatal when frozen */
void mem_freeze(ust_arena *a);
void mem_release(ust_arena *a); /* frees everything */
const char *mem_cat_name(mem_cat c);
size_t mem_peak_rss_bytes(void); /* VmHWM of this process (CPU) */

#endif
