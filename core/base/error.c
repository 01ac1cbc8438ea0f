#include "error.h"

#include <stdio.h>
#include <stdlib.h>

/* Written once at bootstrap, read by every error path afterwards. */
static int g_rank = -1;

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
