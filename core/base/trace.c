/* trace: see trace.h. Events are kept in a growing array while on (at most TRACE_MAX) and
 * written at the end of the traced steps, one JSON object per line, so that the merge of the
 * ranks' files is a copy of lines. */
#include "trace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

enum { TRACE_MAX = 1 << 21 }; /* events per rank (~400 MiB would be a mistake, not a trace) */

typedef struct {
    char name[48];
    char args[160];
    double t0, t1;
    uint64_t id;
    int tid;
    char cat[12]; /* "" for a span; the async category otherwise */
} trace_event;

struct ust_trace {
    int rank, on, full;
    int64_t first, last;
    double step_t0; /* log_now_s at the traced step's start */
    double offset;
    trace_event *ev;
    size_t n, cap;
};

ust_trace *trace_create(int rank, int64_t first, int64_t last) {
    ust_trace *t = calloc(1, sizeof *t);
    UST_ASSERT(t, "out of memory");
    t->rank = rank, t->first = first, t->last = last;
    t->cap = 4096;
    t->ev = malloc(t->cap * sizeof *t->ev);
    UST_ASSERT(t->ev, "out of memory");
    return t;
}

void trace_free(ust_trace *t) {
    if (!t) return;
    free(t->ev);
    free(t);
}

void trace_set_offset(ust_trace *t, double offset_s) { t->offset = offset_s; }
double trace_offset(const ust_trace *t) { return t->offset; }
void trace_step(ust_trace *t, int64_t step) {
    t->on = !t->full && step >= t->first && step <= t->last;
    t->step_t0 = log_now_s();
}
double trace_step_start(const ust_trace *t) { return t->step_t0; }
int trace_on(const ust_trace *t) { return t && t->on; }
int64_t trace_last(const ust_trace *t) { return t->last; }

static trace_event *add(ust_trace *t) {
    if (!t->on) return NULL;
    if (t->n == t->cap) {
        trace_event *g = t->cap * 2 <= TRACE_MAX ? realloc(t->ev, 2 * t->cap * sizeof *g) : NULL;
        if (!g) {
            fprintf(stderr,
                    "ustrain[rank %d]: warning: trace: %zu events, no room for more; tracing "
                    "stops here (fewer logging.trace.steps)\n",
                    t->rank, t->n);
            t->full = 1, t->on = 0;
            return NULL;
        }
        t->ev = g, t->cap *= 2;
    }
    return &t->ev[t->n++];
}

void trace_span(ust_trace *t, int tid, const char *name, double t0, double t1, const char *args) {
    trace_event *e = add(t);
    if (!e) return;
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->args, sizeof e->args, "%s", args ? args : "");
    e->t0 = t0, e->t1 = t1, e->tid = tid, e->id = 0, e->cat[0] = 0;
}

void trace_async(ust_trace *t, const char *cat, const char *name, uint64_t id, double t0, double t1,
                 const char *args) {
    trace_event *e = add(t);
    if (!e) return;
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->args, sizeof e->args, "%s", args ? args : "");
    snprintf(e->cat, sizeof e->cat, "%s", cat);
    e->t0 = t0, e->t1 = t1, e->tid = TRACE_COMM, e->id = id;
}

/* Microseconds on rank 0's clock. */
static double us(const ust_trace *t, double s) { return (s + t->offset) * 1e6; }

int trace_write(const ust_trace *t, const char *path, ust_err *e) {
    FILE *f = fopen(path, "w");
    if (!f) return ust_errf(e, "trace: cannot write %s: %s", path, strerror(errno));
    fprintf(f, "{\"traceEvents\": [\n");
    for (size_t i = 0; i < t->n; i++) {
        const trace_event *x = &t->ev[i];
        const char *sep = i ? ",\n" : "", *comma = x->args[0] ? ", " : "";
        if (!x->cat[0])
            fprintf(f,
                    "%s{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, "
                    "\"dur\": %.3f, \"args\": {%s}}",
                    sep, x->name, t->rank, TRACE_TID(t->rank, x->tid), us(t, x->t0),
                    (x->t1 - x->t0) * 1e6, x->args);
        else
            for (int k = 0; k < 2; k++)
                fprintf(f,
                        "%s{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"%c\", "
                        "\"id2\": {\"local\": \"0x%llx\"}, "
                        "\"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"args\": {%s%s\"at\": \"%s\"}}",
                        k ? ",\n" : sep, x->name, x->cat, k ? 'e' : 'b', (unsigned long long)x->id,
                        t->rank, TRACE_TID(t->rank, x->tid), us(t, k ? x->t1 : x->t0), x->args,
                        comma, k ? "complete" : "issue");
    }
    fprintf(f, "\n], \"ustrain\": {\"rank\": %d, \"clock_offset_s\": %.9f}}\n", t->rank, t->offset);
    int bad = ferror(f);
    if (fclose(f) || bad) return ust_errf(e, "trace: writing %s failed", path);
    return 0;
}

/* Copies the event lines of one rank's file (those that open with {"name"), comma-joined. */
static int copy_events(FILE *out, const char *path, int *first, ust_err *e) {
    FILE *f = fopen(path, "r");
    if (!f) return ust_errf(e, "trace: cannot read %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) {
        if (strncmp(line, "{\"name\"", 7)) continue;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == ',')) line[--n] = 0;
        fprintf(out, "%s%s", *first ? "" : ",\n", line);
        *first = 0;
    }
    free(line);
    fclose(f);
    return 0;
}

int trace_merge(const char *dir, int world, const char *out, const char *meta, ust_err *e) {
    FILE *f = fopen(out, "w");
    if (!f) return ust_errf(e, "trace: cannot write %s: %s", out, strerror(errno));
    static const char *threads[] = {"compute", "comm", "io"};
    fprintf(f, "{\"traceEvents\": [\n");
    int first = 1, rc = 0;
    for (int r = 0; r < world; r++) {
        fprintf(f,
                "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": "
                "\"rank %d\"}},\n{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, "
                "\"args\": {\"sort_index\": %d}}",
                first ? "" : ",\n", r, r, r, r);
        first = 0;
        for (int k = 0; k < 3; k++)
            fprintf(f,
                    ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                    "\"args\": {\"name\": \"%s\"}}",
                    r, TRACE_TID(r, k), threads[k]);
    }
    char path[4200];
    for (int r = 0; r < world && !rc; r++) {
        snprintf(path, sizeof path, "%s/rank_%d.json", dir, r);
        rc = copy_events(f, path, &first, e);
    }
    fprintf(f, "\n], \"displayTimeUnit\": \"ms\", \"ustrain\": {%s}}\n", meta ? meta : "");
    int bad = ferror(f);
    if (fclose(f) || bad) rc = rc ? rc : ust_errf(e, "trace: writing %s failed", out);
    return rc;
}
