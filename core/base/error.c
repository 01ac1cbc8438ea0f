#include "error.h"

#include <stdio.h>
#include <stdlib.h>

/* Written once at bootstrap, read by every error path afterwards. */
static int g_rank = -1;
/* Set when the communicators are made, cleared when they go: what a fatal error still writes. */
static void (*g_fatal_fn)(void *);
static void *g_fatal_arg;

void ust_on_fatal(void (*fn)(void *), void *arg) {
    g_fatal_fn = fn;
    g_fatal_arg = arg;
}

void ust_error_set_rank(int rank) { g_rank = rank; }
int ust_error_rank(void) { return g_rank; }

int ust_errf(ust_err *e, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static void print_prefix(void) {
    if (g_rank >= 0)
        fprintf(stderr, "ustrain[rank %d]: ", g_rank);
    else
        fprintf(stderr, "ustrain: ");
}

_Noreturn void ust_fatal(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    print_prefix();
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    void (*fn)(void *) = g_fatal_fn;
    g_fatal_fn = NULL; /* once, even when it fails fatally itself */
    if (fn) fn(g_fatal_arg);
    fflush(stdout);
    fflush(stderr);
    exit(code);
}

_Noreturn void ust_assert_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    print_prefix();
    fprintf(stderr, "internal error at %s:%d: assertion `%s` failed: ", file, line, cond);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    abort();
}
