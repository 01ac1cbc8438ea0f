/* error: the one error path of ustrain.
 * Functions that can fail on user input fill a ust_err and return -1; the top level prints the
 * message with the rank and exits UST_EXIT_USAGE (2). Runtime failures (I/O, peers) call
 * ust_fatal(UST_EXIT_RUNTIME, ...). Internal invariants use UST_ASSERT, which prints file:line,
 * the rank and the values involved. The rank label is set once at bootstrap (ust_error_set_rank)
 * and only read afterwards. */
#ifndef UST_ERROR_H
#define UST_ERROR_H

#include <stdarg.h>

enum { UST_EXIT_OK = 0, UST_EXIT_RUNTIME = 1, UST_EXIT_USAGE = 2 };

typedef struct {
    char msg[2048];
} ust_err;

/* Formats into e->msg (e may be NULL) and returns -1, so callers can `return ust_errf(e, ...)`. */
int ust_errf(ust_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Labels every later error and log line with this rank (-1: single process, no label). */
void ust_error_set_rank(int rank);
int ust_error_rank(void);

/* Prints "ustrain[rank R]: error: <msg>" to stderr and exits with code. */
_Noreturn void ust_fatal(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* fn(arg) runs once in ust_fatal before the exit (the flight recorder's last file); NULL clears. */
void ust_on_fatal(void (*fn)(void *), void *arg);

_Noreturn void ust_assert_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define UST_ASSERT(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) ust_assert_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                      \
    } while (0)

#endif
