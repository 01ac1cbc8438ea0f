/* trace: one rank's timeline in the Chrome trace-event format (Perfetto, chrome://tracing): spans
 * on three threads (compute, comm, io) and asynchronous operations (a collective from issue to
 * completion), recorded only while on (logging.trace.steps); callers hold a NULL pointer when
 * tracing is off, so a run without it pays one pointer test per hook. Times are log_now_s plus
 * the clock offset to rank 0. Recording never fails the run: past its cap it stops and warns. */
#ifndef UST_TRACE_H
#define UST_TRACE_H

#include <stdint.h>
#include <stdio.h>

#include "error.h"

typedef struct ust_trace ust_trace;
enum { TRACE_COMPUTE = 0, TRACE_COMM = 1, TRACE_IO = 2 };
/* The files' tid of rank r's thread k: unique over the ranks, since Perfetto takes a tid for a
 * system-wide thread id (a tid reused by two processes, or equal to a pid, merges threads). */
#define TRACE_TID(r, k) (1000000 + 10 * (r) + (k))

ust_trace *trace_create(int rank, int64_t first, int64_t last);
void trace_free(ust_trace *t);
void trace_set_offset(ust_trace *t, double offset_s); /* rank 0's clock minus this rank's */
double trace_offset(const ust_trace *t);
/* Steps first..last (1-based) are traced: on for step `step` when it lies in them. */
void trace_step(ust_trace *t, int64_t step);
double trace_step_start(const ust_trace *t); /* log_now_s of the last trace_step */
int trace_on(const ust_trace *t);
int64_t trace_last(const ust_trace *t);
/* A span [t0, t1] (log_now_s) on thread tid; args: JSON object members ("\"mb\": 3") or "". */
void trace_span(ust_trace *t, int tid, const char *name, double t0, double t1, const char *args);
/* An asynchronous operation (category cat, unique id) issued at t0, completed at t1. */
void trace_async(ust_trace *t, const char *cat, const char *name, uint64_t id, double t0, double t1,
                 const char *args);
/* Writes this rank's events, one per line, to path. -1 with a message on failure. */
int trace_write(const ust_trace *t, const char *path, ust_err *e);
/* Rank 0: the world's files (rank_R.json in dir) into out, one process per rank, threads named;
 * meta: JSON object members added under "ustrain". -1 with a message on failure. */
int trace_merge(const char *dir, int world, const char *out, const char *meta, ust_err *e);

#endif
