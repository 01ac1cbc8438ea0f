/* ckpt_common: the helpers every part of the checkpoint shares (paths, removal, whole writes,
 * step names, slices of the 2-D view, exact integers in JSON). */
#include "ckpt_internal.h"
#include "fs.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_SAFE_INT 9007199254740992.0 /* 2^53: every integer below is exact in a double */

ckpt_slice ckpt_whole(const ckpt_tensor *t) {
    int64_t rows = t->ndim == 2 ? t->shape[0] : 1;
    int64_t cols = t->ndim == 2 ? t->shape[1] : t->shape[0];
    return (ckpt_slice){
        .row0 = 0, .nrows = rows, .col0 = 0, .ncols = cols, .flat0 = 0, .flat1 = rows * cols};
}

/* ---------------------------------------------------------------------------------------------
 * Small file-system helpers */

int ckpt_pathf(char *out, size_t n, ust_err *e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(out, n, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= n) return ust_errf(e, "checkpoint: path too long: %.200s...", out);
    return 0;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path) != 0 && errno != ENOENT ? -1 : 0;
}

/* rm -rf path; 0 when path is gone (or never existed). */
int ckpt_rm_rf(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) return unlink(path);
    return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

int ckpt_fsync_dir(const char *dir, ust_err *e) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ust_errf(e, "checkpoint: cannot open %s: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    /* some file systems refuse fsync on a directory; that is not a write failure */
    if (rc != 0 && err != EINVAL && err != EROFS)
        return ust_errf(e, "checkpoint: cannot fsync %s: %s", dir, strerror(err));
    return 0;
}

/* Test-only fault switches (test/sh/crash_safety.sh), read from the environment:
 *   UST_FAULT_CKPT_WRITE_ERRNO=N  every data write fails with errno N (e.g. 28, ENOSPC), for
 *                                 machines where a full file system cannot be mounted
 *   UST_FAULT_CKPT_SLEEP_MS=N     each rank sleeps N ms after its first slice of a checkpoint,
 *                                 so a test can kill it while the files are half written */
int ckpt_fault_env(const char *name) {
    const char *s = getenv(name);
    return s ? atoi(s) : 0;
}

/*   UST_FAULT_CKPT_WRITE_RANK=R   limits UST_FAULT_CKPT_WRITE_ERRNO to global rank R */
static int write_fault(void) {
    const char *only = getenv("UST_FAULT_CKPT_WRITE_RANK");
    if (only && atoi(only) != (ust_error_rank() < 0 ? 0 : ust_error_rank())) return 0;
    return ckpt_fault_env("UST_FAULT_CKPT_WRITE_ERRNO");
}

int ckpt_pwrite_all(int fd, const void *buf, size_t n, int64_t off, const char *path, ust_err *e) {
    const char *p = buf;
    int fault = write_fault();
    while (n > 0) {
        ssize_t k = fault > 0 ? (errno = fault, -1) : pwrite(fd, p, n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return ust_errf(e, "checkpoint: cannot write %s: %s", path, strerror(errno));
        if (k == 0) return ust_errf(e, "checkpoint: cannot write %s: no progress", path);
        p += k, n -= (size_t)k, off += k;
    }
    return 0;
}

/* Writes a small file completely and fsyncs it (state.json, latest.tmp, failure markers). */
int ckpt_write_small_file(const char *path, const char *text, ust_err *e) {
    ust_err inner;
    int fd = fs_open_regular(path, O_WRONLY | O_CREAT | O_TRUNC, 0644, &inner);
    if (fd < 0) return ust_errf(e, "checkpoint: %s", inner.msg);
    int rc = ckpt_pwrite_all(fd, text, strlen(text), 0, path, e);
    if (rc == 0 && fsync(fd) != 0)
        rc = ust_errf(e, "checkpoint: cannot fsync %s: %s", path, strerror(errno));
    if (close(fd) != 0 && rc == 0)
        rc = ust_errf(e, "checkpoint: cannot write %s: %s", path, strerror(errno));
    return rc;
}

/* "step_<digits>" exactly -> the step number, else -1. */
int64_t ckpt_parse_step_name(const char *name) {
    if (strncmp(name, "step_", 5) != 0) return -1;
    const char *p = name + 5;
    if (!*p || strlen(p) > 18) return -1;
    int64_t v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

/* Slices are boxes of the 2-D view cut to a flat range; both sides check them the same way. */
int ckpt_check_slice(const ckpt_slice *s, int64_t rows, int64_t cols, const char *name,
                     ust_err *e) {
    if (s->row0 < 0 || s->nrows < 0 || s->col0 < 0 || s->ncols < 0 || s->row0 > rows ||
        s->nrows > rows - s->row0 || s->col0 > cols || s->ncols > cols - s->col0 || s->flat0 < 0 ||
        s->flat0 > s->flat1 || s->flat1 > s->nrows * s->ncols)
        return ust_errf(e,
                        "checkpoint: slice rows [%lld, +%lld) cols [%lld, +%lld) flat [%lld, %lld) "
                        "is outside tensor '%s' of %lld x %lld",
                        (long long)s->row0, (long long)s->nrows, (long long)s->col0,
                        (long long)s->ncols, (long long)s->flat0, (long long)s->flat1, name,
                        (long long)rows, (long long)cols);
    return 0;
}

/* Calls fn(file_element_index, slice_element_index, count) for each contiguous run of the
 * slice inside the tensor: one run per box row, or a single run when the box spans whole rows. */
int ckpt_for_each_run(const ckpt_slice *s, int64_t cols, ckpt_run_fn fn, void *ctx, ust_err *e) {
    if (s->flat1 == s->flat0) return 0;
    if (s->col0 == 0 && s->ncols == cols)
        return fn(ctx, s->row0 * cols + s->flat0, 0, s->flat1 - s->flat0, e);
    for (int64_t k = s->flat0; k < s->flat1;) {
        int64_t r = k / s->ncols, c = k % s->ncols;
        int64_t n = s->ncols - c;
        if (n > s->flat1 - k) n = s->flat1 - k;
        if (fn(ctx, (s->row0 + r) * cols + s->col0 + c, k - s->flat0, n, e) != 0) return -1;
        k += n;
    }
    return 0;
}

/* The step the directory's name says (step_<N>), or -1 for any other name. */
int64_t ckpt_dir_step(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t k = n;
    while (k > 0 && dir[k - 1] != '/') k--;
    char base[64];
    if (n - k >= sizeof base) return -1;
    memcpy(base, dir + k, n - k);
    base[n - k] = 0;
    return ckpt_parse_step_name(base);
}

/* A JSON number that is an exact non-negative integer below 2^53. */
bool ckpt_json_uint(const cJSON *j, int64_t *v) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d < MAX_SAFE_INT) || d != (double)(int64_t)d) return false;
    *v = (int64_t)d;
    return true;
}
