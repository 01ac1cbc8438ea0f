/* bootstrap_common: what bootstrap.c and bootstrap_pmix.c both call, below both, so that
 * bootstrap.c may call the PMIx path and the PMIx path never calls back into it (see
 * bootstrap_impl.h). */
#include <stdint.h>
#include <stdio.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap_impl.h"

void boot_random_id(char *out, size_t cap, const char *prefix) {
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec ^
            (uint64_t)getpid() << 32;
    }
    snprintf(out, cap, "%s-%016llx", prefix, (unsigned long long)r);
}
