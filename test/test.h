/* test: a tiny harness. Each TEST is a function; RUN_TEST prints "PASS name" or "FAIL name: why"
 * (test/run.sh counts those lines over every test program and script). CHECK* record a failure
 * and return from the test. Tests run with one compute thread unless they say otherwise. */
#ifndef UST_TEST_H
#define UST_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_failed_flag, t_npass, t_nfail;
static char t_why[1024];

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            int n_ = snprintf(t_why, sizeof t_why, "%s:%d: ", __FILE__, __LINE__);                 \
            snprintf(t_why + n_, sizeof t_why - n_, __VA_ARGS__);                                  \
            t_failed_flag = 1;                                                                     \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* |a - b| <= atol + rtol * |b| */
#define CHECK_CLOSE(a, b, atol, rtol, what)                                                        \
    do {                                                                                           \
        double a_ = (a), b_ = (b);                                                                 \
        CHECK(fabs(a_ - b_) <= (atol) + (rtol)*fabs(b_) && a_ == a_,                               \
              "%s: got %.9g, expected %.9g (atol %g, rtol %g)", what, a_, b_, (double)(atol),      \
              (double)(rtol));                                                                     \
    } while (0)

/* UST_TEST_MATCH=substring: run only the tests whose name contains it (a quick rerun of one case
 * of a slow program, e.g. on the CUDA emulator) */
#define RUN_TEST(fn)                                                                               \
    do {                                                                                           \
        if (getenv("UST_TEST_MATCH") && !strstr(#fn, getenv("UST_TEST_MATCH"))) break;             \
        t_failed_flag = 0;                                                                         \
        t_why[0] = 0;                                                                              \
        fn();                                                                                      \
        if (t_failed_flag) {                                                                       \
            printf("FAIL %s: %s\n", #fn, t_why);                                                   \
            t_nfail++;                                                                             \
        } else {                                                                                   \
            printf("PASS %s\n", #fn);                                                              \
            t_npass++;                                                                             \
        }                                                                                          \
        fflush(stdout);                                                                            \
    } while (0)

#define TEST_SUMMARY() (printf("# %d passed, %d failed\n", t_npass, t_nfail), t_nfail ? 1 : 0)

#endif
