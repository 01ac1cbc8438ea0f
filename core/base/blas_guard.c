/* blas_guard: OpenBLAS's work buffers, mapped or a clear exit. OpenBLAS (0.3.21, as Debian ships
 * it) maps a 128 MiB work buffer per thread, the first while the library initializes, before
 * main, and retries a failed mmap forever: under a small address-space limit (ulimit -v) the
 * process hung before main, or inside a GEMM where no SIGTERM is ever looked at. This file
 * defines mmap for the whole program (an executable's symbol wins over libc's in every library's
 * lookups): each call is the plain system call, except that an ENOMEM for OpenBLAS itself ends the
 * process with exit 1, the size asked for and the limit, since OpenBLAS has no way to fail.
 * Sanitizer builds keep their own mmap interceptor and so leave this out. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer) || __has_feature(thread_sanitizer)
#define UST_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UST_SANITIZED 1
#endif
#ifndef UST_SANITIZED
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "error.h"

static int from_openblas(const void *caller) {
    Dl_info info;
    return dladdr(caller, &info) && info.dli_fname && strstr(info.dli_fname, "openblas");
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    void *p = (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
    if (p == MAP_FAILED && errno == ENOMEM && !(flags & MAP_HUGETLB) && from_openblas(__builtin_return_address(0))) {
        struct rlimit as;
        char limit[64] = "unlimited";
        if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
            snprintf(limit, sizeof limit, "%llu MiB", (unsigned long long)(as.rlim_cur >> 20));
        char rank[32] = "";
        if (ust_error_rank() >= 0) snprintf(rank, sizeof rank, "[rank %d]", ust_error_rank());
        /* _exit: this may be OpenBLAS's initializer or one of its threads, where running the
         * exit handlers (OpenBLAS's own among them) could wait for what never comes */
        fprintf(stderr,
                "ustrain%s: error: out of memory: OpenBLAS could not map its %zu-byte work "
                "buffer (the address-space limit, ulimit -v, is %s; each compute thread needs "
                "one)\n",
                rank, len, limit);
        fflush(stdout);
        _exit(UST_EXIT_RUNTIME);
    }
    return p;
}
#endif
