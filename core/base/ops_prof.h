/* ops_prof: a backend that forwards every op to another one and, while enabled, times each call,
 * for a breakdown of where a training step's time goes (bench_gpu profile, any backend).
 * Contract: results are exactly the inner backend's (same calls, same arguments, same order).
 * While enabled, every timed op is bracketed by the inner backend's sync, so per-op times are
 * wall-clock and exact for a GPU's asynchronous queue too, but the step runs slower than
 * unwrapped; disabled, it only adds an indirect call. alloc, free, sync and the stream and memory
 * queries are never timed.
 * Destroying the wrapper leaves the inner backend alone. */
#ifndef UST_OPS_PROF_H
#define UST_OPS_PROF_H

#include "ops.h"

#include <stdint.h>
#include <stdio.h>

typedef struct {
    const char *op; /* the ops.h member's name */
    int64_t calls;
    double seconds;
} ops_prof_entry;

ust_ops *ops_prof_create(const ust_ops *inner);
void ops_prof_enable(ust_ops *o, int on);
/* Every op called while enabled, most time first; returns how many (<= max) were written. */
int ops_prof_entries(const ust_ops *o, ops_prof_entry *out, int max);
/* A table of ops_prof_entries, per step (steps >= 1) and as shares of their total. */
void ops_prof_print(const ust_ops *o, FILE *f, int steps);

#endif
