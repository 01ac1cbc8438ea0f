/* ckpt: safetensors checkpoints written in place by every rank, committed by one rename.
 *
 * Write protocol (every rank computes the same layout from the same tensor list; "sync" is a
 * barrier that tells every rank whether any failed, and rank 0 the first failed rank's reason):
 *   lock    rank 0, once per job: flock dir/.lock (a second job is refused, naming the holder)
 *   begin   rank 0: mkdir -p dir, fresh dir/.tmp_step_N.<job>                  | sync
 *   add     rank 0: create the file, write the header, ftruncate to size       | sync
 *           others: open it for writing
 *   write   every rank pwrites its slices at their offsets (errors are sticky: later writes
 *           are skipped, so a failed rank still reaches every sync)
 *   commit  rank 0 writes state.json; every rank fsyncs | sync | rank 0, when nobody failed:
 *           fsync, rename to step_N, update `latest` atomically, prune; else remove the
 *           temporary directory and report the failed rank's reason | sync
 * Until the rename nothing outside .tmp_step_N.<job> has changed, so a crash or an I/O error at
 * any point leaves the previous checkpoints exactly as they were. */
#include "ckpt.h"
#include "ckpt_manifest.h"
#include "fs.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ST_MAX_HEADER 100000000 /* the safetensors reference limit */
#define ST_MAX_DIMS 8
#define MAX_SAFE_INT 9007199254740992.0 /* 2^53: every integer below is exact in a double */
#define STATE_JSON "state.json"
#define ST_META_STEP "ustrain_step" /* the step a checkpoint file was written for */
#define STATE_MAX (64 << 20)
#define TMP_PREFIX ".tmp_step_"
#define LOCK_FILE ".lock"

ckpt_slice ckpt_whole(const ckpt_tensor *t) {
    int64_t rows = t->ndim == 2 ? t->shape[0] : 1;
    int64_t cols = t->ndim == 2 ? t->shape[1] : t->shape[0];
    return (ckpt_slice){
        .row0 = 0, .nrows = rows, .col0 = 0, .ncols = cols, .flat0 = 0, .flat1 = rows * cols};
}

/* ---------------------------------------------------------------------------------------------
 * Small file-system helpers */

static int pathf(char *out, size_t n, ust_err *e, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int pathf(char *out, size_t n, ust_err *e, const char *fmt, ...) {
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
static int rm_rf(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) return unlink(path);
    return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static int fsync_dir(const char *dir, ust_err *e) {
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
static int fault_env(const char *name) {
    const char *s = getenv(name);
    return s ? atoi(s) : 0;
}

/*   UST_FAULT_CKPT_WRITE_RANK=R   limits UST_FAULT_CKPT_WRITE_ERRNO to global rank R */
static int write_fault(void) {
    const char *only = getenv("UST_FAULT_CKPT_WRITE_RANK");
    if (only && atoi(only) != (ust_error_rank() < 0 ? 0 : ust_error_rank())) return 0;
    return fault_env("UST_FAULT_CKPT_WRITE_ERRNO");
}

static int pwrite_all(int fd, const void *buf, size_t n, int64_t off, const char *path,
                      ust_err *e) {
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
static int write_small_file(const char *path, const char *text, ust_err *e) {
    ust_err inner;
    int fd = fs_open_regular(path, O_WRONLY | O_CREAT | O_TRUNC, 0644, &inner);
    if (fd < 0) return ust_errf(e, "checkpoint: %s", inner.msg);
    int rc = pwrite_all(fd, text, strlen(text), 0, path, e);
    if (rc == 0 && fsync(fd) != 0)
        rc = ust_errf(e, "checkpoint: cannot fsync %s: %s", path, strerror(errno));
    if (close(fd) != 0 && rc == 0)
        rc = ust_errf(e, "checkpoint: cannot write %s: %s", path, strerror(errno));
    return rc;
}

/* "step_<digits>" exactly -> the step number, else -1. */
static int64_t parse_step_name(const char *name) {
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

/* ---------------------------------------------------------------------------------------------
 * Writer */

typedef struct {
    ckpt_tensor t;
    int64_t begin; /* absolute byte offset of the tensor's data in the file */
} wtensor;

typedef struct {
    char name[CKPT_NAME_MAX];
    char path[PATH_MAX];
    int fd;
    int n;
    int64_t size; /* header and data */
    wtensor *t;
} wfile;

/* checkpoint.async: a rank's slices are copied here at the save; the writer thread writes them */
typedef struct {
    int file, tensor;
    int64_t off, len, at; /* file offset and length; where the bytes are in the buffer */
} staged_run;

struct ckpt_stage {
    unsigned char *buf;
    bool owned; /* ckpt_stage_create's buffer (freed with the stage), not a wrapped one */
    int64_t cap, used;
    staged_run *runs;
    int64_t nruns, capruns;
};

struct ckpt_writer {
    char dir[PATH_MAX], tmp[PATH_MAX], final_dir[PATH_MAX];
    int64_t step;
    int rank;
    ckpt_sync_fn sync;
    void *sync_arg;
    wfile *files;
    int nfiles;
    bool failed; /* an earlier call failed on this rank: later writes are skipped, commit fails */
    ust_err first_error; /* the reason, which commit reports (rank 0 for every rank) */
    bool slept;          /* UST_FAULT_CKPT_SLEEP_MS was applied */
    char job[72];
    ckman_log log; /* the CRC of every range this rank wrote, for the manifest */
    /* checkpoint.async */
    ckpt_stage *stage; /* NULL: synchronous */
    pthread_t thread;
    bool thread_started;
    atomic_int thread_done;
    int thread_rc;
    ust_err thread_err;
    char *state_json; /* rank 0: what the thread writes as state.json */
    int keep_last;
};

/* Errors are sticky, like ferror: the first one is kept and later writes are skipped, so a
 * rank whose disk failed still takes part in every collective of the save and in the commit's
 * barriers, where its reason reaches rank 0 (instead of dying and leaving the others stuck). */
static int writer_fail(ckpt_writer *w, const ust_err *e) {
    if (!w->failed) w->first_error = *e;
    w->failed = true;
    return -1;
}

/* A barrier that also tells every rank whether any of them failed. */
static bool wsync(ckpt_writer *w, bool failed) {
    return w->sync ? w->sync(w->sync_arg, failed, NULL, 0) >= 0 : failed;
}

static void free_writer(ckpt_writer *w) {
    if (w->thread_started) pthread_join(w->thread, NULL);
    ckman_free(&w->log);
    free(w->state_json);
    for (int i = 0; i < w->nfiles; i++) {
        if (w->files[i].fd >= 0) close(w->files[i].fd);
        free(w->files[i].t);
    }
    free(w->files);
    free(w);
}

/* The temporary step directory's name: .tmp_step_<N>.<job>, the job tag kept to [A-Za-z0-9_-]
 * so it is always one path component. */
static int tmp_name(char *out, size_t n, const char *dir, int64_t step, const char *job,
                    ust_err *e) {
    char tag[72] = "";
    for (size_t i = 0, k = 0; job && job[i] && k + 2 < sizeof tag; i++) {
        char c = job[i];
        if (!k) tag[k++] = '.';
        tag[k++] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                           c == '-' || c == '_'
                       ? c
                       : '_';
        tag[k] = 0;
    }
    return pathf(out, n, e, "%s/" TMP_PREFIX "%lld%s", dir, (long long)step, tag);
}

ckpt_writer *ckpt_begin(const char *dir, int64_t step, int rank, const char *job, ckpt_sync_fn sync,
                        void *sync_arg, ust_err *e) {
    if (step < 0) {
        ust_errf(e, "checkpoint: negative step %lld", (long long)step);
        return NULL;
    }
    ckpt_writer *w = calloc(1, sizeof *w);
    if (!w) {
        ust_errf(e, "checkpoint: out of memory");
        return NULL;
    }
    w->step = step;
    w->rank = rank;
    w->sync = sync;
    w->sync_arg = sync_arg;
    snprintf(w->job, sizeof w->job, "%s", job ? job : "");
    int rc = pathf(w->dir, sizeof w->dir, e, "%s", dir);
    if (!rc) rc = tmp_name(w->tmp, sizeof w->tmp, dir, step, job, e);
    if (!rc) rc = pathf(w->final_dir, sizeof w->final_dir, e, "%s/step_%lld", dir, (long long)step);
    if (!rc && rank == 0) {
        rc = fs_mkdir_p(dir, e);
        if (!rc && rm_rf(w->tmp) != 0)
            rc = ust_errf(e, "checkpoint: cannot remove stale %s: %s", w->tmp, strerror(errno));
        if (!rc && mkdir(w->tmp, 0755) != 0)
            rc = ust_errf(e, "checkpoint: cannot create directory %s: %s", w->tmp, strerror(errno));
    }
    /* reached on every path, so a failure on rank 0 cannot hang the others */
    bool any = wsync(w, rc != 0);
    struct stat st;
    if (!rc && any) rc = ust_errf(e, "checkpoint: rank 0 could not create %s", w->tmp);
    if (!rc && rank != 0 && (stat(w->tmp, &st) != 0 || !S_ISDIR(st.st_mode)))
        rc = ust_errf(e, "checkpoint: rank 0 did not create %s", w->tmp);
    if (rc) {
        free(w);
        return NULL;
    }
    return w;
}

/* The safetensors header for a file's tensors, padded with spaces to a multiple of 8. */
static char *build_header(const wfile *f, int64_t step, int64_t *hlen, ust_err *e) {
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "__metadata__", meta);
    cJSON_AddStringToObject(meta, "format", "pt");
    char s[32]; /* the step the file belongs to (metadata values are strings): a reader checks */
    snprintf(s, sizeof s, "%lld", (long long)step);
    cJSON_AddStringToObject(meta, ST_META_STEP, s);
    int64_t off = 0;
    for (int i = 0; i < f->n; i++) {
        const ckpt_tensor *t = &f->t[i].t;
        cJSON *o = cJSON_CreateObject(), *shape = cJSON_CreateArray(), *offs = cJSON_CreateArray();
        cJSON_AddStringToObject(o, "dtype", "F32");
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
            numel *= t->shape[d];
        }
        cJSON_AddItemToObject(o, "shape", shape);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + 4 * numel)));
        cJSON_AddItemToObject(o, "data_offsets", offs);
        cJSON_AddItemToObject(root, t->name, o);
        off += 4 * numel;
    }
    char *js = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!js) {
        ust_errf(e, "checkpoint: out of memory building the header of %s", f->name);
        return NULL;
    }
    size_t n = strlen(js), padded = (n + 7) / 8 * 8;
    char *h = malloc(8 + padded);
    if (!h) {
        free(js);
        ust_errf(e, "checkpoint: out of memory");
        return NULL;
    }
    uint64_t le = padded; /* little-endian host */
    memcpy(h, &le, 8);
    memcpy(h + 8, js, n);
    memset(h + 8 + n, ' ', padded - n);
    free(js);
    *hlen = 8 + (int64_t)padded;
    return h;
}

static int check_tensor_list(const char *file, const ckpt_tensor *t, int n, ust_err *e) {
    if (!file[0] || strchr(file, '/') || !strcmp(file, STATE_JSON) || file[0] == '.' ||
        strlen(file) >= CKPT_NAME_MAX)
        return ust_errf(e, "checkpoint: bad file name '%s'", file);
    if (n < 0) return ust_errf(e, "checkpoint %s: negative tensor count %d", file, n);
    for (int i = 0; i < n; i++) {
        if (!t[i].name[0] || !memchr(t[i].name, 0, CKPT_NAME_MAX) ||
            !strcmp(t[i].name, "__metadata__"))
            return ust_errf(e, "checkpoint %s: tensor %d has a bad name", file, i);
        if (t[i].ndim < 1 || t[i].ndim > 2)
            return ust_errf(e, "checkpoint %s: tensor '%s' has %d dims (1 or 2 supported)", file,
                            t[i].name, t[i].ndim);
        for (int d = 0; d < t[i].ndim; d++)
            if (t[i].shape[d] < 0 || t[i].shape[d] > ((int64_t)1 << 40))
                return ust_errf(e, "checkpoint %s: tensor '%s' has a bad shape", file, t[i].name);
        for (int j = 0; j < i; j++)
            if (!strcmp(t[i].name, t[j].name))
                return ust_errf(e, "checkpoint %s: tensor '%s' declared twice", file, t[i].name);
    }
    return 0;
}

int ckpt_add_file(ckpt_writer *w, const char *file, const ckpt_tensor *tensors, int n, ust_err *e) {
    int rc = check_tensor_list(file, tensors, n, e);
    wfile *nf = rc ? NULL : realloc(w->files, sizeof(wfile) * (size_t)(w->nfiles + 1));
    if (!rc && !nf) rc = ust_errf(e, "checkpoint: out of memory");
    wfile *f = NULL;
    if (!rc) {
        w->files = nf;
        f = &w->files[w->nfiles];
        memset(f, 0, sizeof *f);
        f->fd = -1;
        snprintf(f->name, sizeof f->name, "%s", file);
        rc = pathf(f->path, sizeof f->path, e, "%s/%s", w->tmp, file);
        f->t = calloc((size_t)(n > 0 ? n : 1), sizeof(wtensor));
        if (!rc && !f->t) rc = ust_errf(e, "checkpoint: out of memory");
        if (!rc)
            w->nfiles++;
        else
            free(f->t);
    }
    int64_t hlen = 0, total = 0;
    char *hdr = NULL;
    if (!rc) {
        f->n = n;
        for (int i = 0; i < n; i++) f->t[i].t = tensors[i];
        hdr = build_header(f, w->step, &hlen, e);
        if (!hdr) rc = -1;
    }
    if (!rc) {
        total = hlen;
        for (int i = 0; i < n; i++) {
            const ckpt_tensor *t = &tensors[i];
            f->t[i].begin = total;
            total += 4 * t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
        }
    }
    if (!rc) f->size = total;
    if (!rc && w->rank == 0) {
        f->fd = open(f->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (f->fd < 0)
            rc = ust_errf(e, "checkpoint: cannot create %s: %s", f->path, strerror(errno));
        if (!rc) rc = pwrite_all(f->fd, hdr, (size_t)hlen, 0, f->path, e);
        if (!rc) ckman_add(&w->log, w->nfiles - 1, -1, 0, hdr, hlen);
        if (!rc && ftruncate(f->fd, (off_t)total) != 0)
            rc = ust_errf(e, "checkpoint: cannot size %s to %lld bytes: %s", f->path,
                          (long long)total, strerror(errno));
    }
    free(hdr);
    bool any = wsync(w, rc != 0 && w->rank == 0);
    if (!rc && w->rank != 0 && any)
        rc = ust_errf(e, "checkpoint: rank 0 could not create %s", f->path);
    if (!rc && w->rank != 0) {
        f->fd = open(f->path, O_WRONLY | O_CLOEXEC);
        if (f->fd < 0) rc = ust_errf(e, "checkpoint: cannot open %s: %s", f->path, strerror(errno));
    }
    return rc ? writer_fail(w, e) : w->nfiles - 1;
}

typedef struct {
    ckpt_writer *w;
    int file;
    const wtensor *t;
    const float *src;
} write_ctx;

/* checkpoint.async: keeps the run in the stage (which the caller sized for everything this rank
 * writes: a save that needs more is refused, never a reallocation behind the plan's back). */
static int stage_run(ckpt_stage *s, int file, int tensor, int64_t off, const void *src,
                     int64_t len, ust_err *e) {
    if (s->nruns == s->capruns) { /* room in the buffer: put_slice checked the whole slice */
        int64_t cap = s->capruns ? 2 * s->capruns : 1024;
        staged_run *nr = realloc(s->runs, (size_t)cap * sizeof *nr);
        if (!nr) return ust_errf(e, "checkpoint: out of memory staging the checkpoint");
        s->runs = nr, s->capruns = cap;
    }
    if (src) memcpy(s->buf + s->used, src, (size_t)len); /* NULL: the caller fills it (reserve) */
    staged_run *last = s->nruns ? &s->runs[s->nruns - 1] : NULL;
    if (last && last->file == file && last->tensor == tensor && last->off + last->len == off)
        last->len += len; /* one pwrite for both */
    else
        s->runs[s->nruns++] =
            (staged_run){.file = file, .tensor = tensor, .off = off, .len = len, .at = s->used};
    s->used += len;
    return 0;
}

static int write_run(void *vc, int64_t file_elem, int64_t slice_elem, int64_t n, ust_err *e) {
    write_ctx *c = vc;
    const wfile *f = &c->w->files[c->file];
    int64_t off = c->t->begin + 4 * file_elem;
    int tensor = (int)(c->t - f->t);
    if (c->w->stage)
        return stage_run(c->w->stage, c->file, tensor, off, c->src ? c->src + slice_elem : NULL,
                         4 * n, e);
    if (pwrite_all(f->fd, c->src + slice_elem, (size_t)n * 4, off, f->path, e)) return -1;
    ckman_add(&c->w->log, c->file, tensor, off, c->src + slice_elem, 4 * n);
    return 0;
}

/* UST_FAULT_CKPT_SLEEP_MS, once per checkpoint, after the rank's first slice is written */
static void fault_sleep(ckpt_writer *w) {
    int sleep_ms = w->slept ? 0 : fault_env("UST_FAULT_CKPT_SLEEP_MS");
    if (sleep_ms <= 0) return;
    w->slept = true;
    struct timespec ts = {sleep_ms / 1000, (long)(sleep_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Slice s of tensor `name` in file, checked; its runs go to write_run with src (NULL: staged
 * space the caller fills). */
static int put_slice(ckpt_writer *w, int file, const char *name, const ckpt_slice *s,
                     const float *src, ust_err *e) {
    if (w->failed) { /* sticky: the first error is what commit reports */
        *e = w->first_error;
        return -1;
    }
    if (file < 0 || file >= w->nfiles) {
        ust_errf(e, "checkpoint: no file with index %d", file);
        return writer_fail(w, e);
    }
    const wfile *f = &w->files[file];
    const wtensor *t = NULL;
    for (int i = 0; i < f->n && !t; i++)
        if (!strcmp(f->t[i].t.name, name)) t = &f->t[i];
    int rc = 0;
    if (!t) rc = ust_errf(e, "checkpoint %s: tensor '%s' was not declared", f->name, name);
    int64_t rows = 0, cols = 0;
    if (t) {
        rows = t->t.ndim == 2 ? t->t.shape[0] : 1;
        cols = t->t.ndim == 2 ? t->t.shape[1] : t->t.shape[0];
        rc = ckpt_check_slice(s, rows, cols, name, e);
    }
    if (!rc && w->stage && w->stage->used > w->stage->cap - 4 * (s->flat1 - s->flat0))
        rc = ust_errf(e, "checkpoint: the async staging buffer (%lld bytes) is too small",
                      (long long)w->stage->cap);
    if (!rc) {
        write_ctx c = {w, file, t, src};
        rc = ckpt_for_each_run(s, cols, write_run, &c, e);
    }
    if (rc) writer_fail(w, e);
    if (!w->stage) fault_sleep(w); /* async: the writer thread sleeps instead */
    return rc;
}

int ckpt_write_slice(ckpt_writer *w, int file, const char *name, const ckpt_slice *s,
                     const float *host_data, ust_err *e) {
    return put_slice(w, file, name, s, host_data, e);
}

int ckpt_stage_reserve(ckpt_writer *w, int file, const char *name, const ckpt_slice *s,
                       float **out, ust_err *e) {
    *out = NULL;
    if (!w->stage) return 0;
    unsigned char *at = w->stage->buf + w->stage->used; /* the runs follow in slice order */
    if (put_slice(w, file, name, s, NULL, e)) return -1;
    *out = (float *)at;
    return 0;
}

/* Keeps the newest keep_last checkpoints, counting the one just written; older step_N go.
 * Steps above the one just written are left alone: they are not older. */
static void prune(const ckpt_writer *w, int keep_last) {
    if (keep_last <= 0) return;
    DIR *d = opendir(w->dir);
    if (!d) return;
    int64_t *steps = NULL;
    int n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        int64_t s = parse_step_name(de->d_name);
        if (s < 0 || s >= w->step) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *ns = realloc(steps, sizeof(int64_t) * (size_t)cap);
            if (!ns) break;
            steps = ns;
        }
        steps[n++] = s;
    }
    closedir(d);
    /* descending: the first keep_last - 1 older ones stay */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && steps[j] > steps[j - 1]; j--) {
            int64_t tmp = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = tmp;
        }
    for (int i = keep_last - 1; i < n; i++) {
        char p[PATH_MAX];
        if (snprintf(p, sizeof p, "%s/step_%lld", w->dir, (long long)steps[i]) >= (int)sizeof p)
            continue;
        if (rm_rf(p) != 0)
            fprintf(stderr, "ustrain: warning: checkpoint: cannot remove old %s: %s\n", p,
                    strerror(errno));
    }
    free(steps);
}

/* Rank 0, after every rank's data is on disk: make step_N appear atomically, then `latest`. */
static int publish(ckpt_writer *w, int keep_last, ust_err *e) {
    if (fsync_dir(w->tmp, e)) return -1;
    struct stat st;
    char old[PATH_MAX];
    bool replacing = lstat(w->final_dir, &st) == 0;
    if (replacing) {
        /* step_N exists (a rerun of the same step): move it aside first, so there is never a
         * moment with two directories or a half-removed one under the final name */
        if (pathf(old, sizeof old, e, "%s/.old_step_%lld", w->dir, (long long)w->step)) return -1;
        if (rm_rf(old) != 0)
            return ust_errf(e, "checkpoint: cannot remove %s: %s", old, strerror(errno));
        if (rename(w->final_dir, old) != 0)
            return ust_errf(e, "checkpoint: cannot move %s aside: %s", w->final_dir,
                            strerror(errno));
    }
    if (rename(w->tmp, w->final_dir) != 0) {
        int err = errno;
        if (replacing) rename(old, w->final_dir);
        return ust_errf(e, "checkpoint: cannot rename %s to %s: %s", w->tmp, w->final_dir,
                        strerror(err));
    }
    if (replacing) rm_rf(old);
    if (fsync_dir(w->dir, e)) return -1;

    char latest[PATH_MAX], latest_tmp[PATH_MAX], text[64];
    if (pathf(latest, sizeof latest, e, "%s/latest", w->dir)) return -1;
    if (pathf(latest_tmp, sizeof latest_tmp, e, "%s/latest.tmp", w->dir)) return -1;
    snprintf(text, sizeof text, "step_%lld\n", (long long)w->step);
    if (write_small_file(latest_tmp, text, e)) return -1;
    if (rename(latest_tmp, latest) != 0)
        return ust_errf(e, "checkpoint: cannot rename %s to %s: %s", latest_tmp, latest,
                        strerror(errno));
    if (fsync_dir(w->dir, e)) return -1;
    prune(w, keep_last);
    return 0;
}

/* Every rank once its data is written: rank 0 writes state.json, each rank leaves the CRCs of
 * what it wrote (.crc.<rank>) and fsyncs and closes its files. */
static int finish_local(ckpt_writer *w, const char *state_json, ust_err *e) {
    int rc = 0;
    if (w->failed) {
        *e = w->first_error;
        rc = -1;
    }
    char p[PATH_MAX];
    if (!rc && w->rank == 0) {
        rc = pathf(p, sizeof p, e, "%s/%s", w->tmp, STATE_JSON);
        if (!rc) rc = write_small_file(p, state_json ? state_json : "{}\n", e);
    }
    if (!rc) rc = ckman_save_log(&w->log, w->tmp, w->rank, e);
    for (int i = 0; i < w->nfiles; i++) {
        wfile *f = &w->files[i];
        if (f->fd < 0) continue;
        if (!rc && fsync(f->fd) != 0)
            rc = ust_errf(e, "checkpoint: cannot fsync %s: %s", f->path, strerror(errno));
        if (close(f->fd) != 0 && !rc)
            rc = ust_errf(e, "checkpoint: cannot write %s: %s", f->path, strerror(errno));
        f->fd = -1;
    }
    return rc;
}

/* Rank 0: manifest.json from every rank's CRCs (which must tile the files exactly). */
static int write_manifest(const ckpt_writer *w, const char *state_json, ust_err *e) {
    ckman_files f = {.n = w->nfiles};
    if (w->nfiles > CKMAN_MAX_FILES)
        return ust_errf(e, "checkpoint: %d files, at most %d", w->nfiles, CKMAN_MAX_FILES);
    for (int i = 0; i < w->nfiles; i++) {
        f.name[i] = w->files[i].name;
        f.size[i] = w->files[i].size;
        f.ntensors[i] = w->files[i].n;
    }
    return ckman_write(w->tmp, &f, w->job, w->step, state_json, e);
}

/* Every rank together, after finish_local (rc: its result): the manifest and the publication,
 * or nothing published when any rank failed. Frees w. */
static int finish_global(ckpt_writer *w, int rc, const char *state_json, int keep_last,
                         ust_err *e) {
    /* every rank learns whether any failed, and rank 0 the first failed rank's reason: it must
     * never publish another rank's holes, and says why it did not */
    char why[sizeof e->msg];
    snprintf(why, sizeof why, "%s", rc ? e->msg : "");
    int failed_rank = w->sync ? w->sync(w->sync_arg, rc != 0, why, sizeof why) : (rc ? 0 : -1);
    bool any = failed_rank >= 0;
    if (w->rank == 0) {
        if (!rc && any)
            rc = ust_errf(e, "rank %d failed to write its part: %s", failed_rank,
                          why[0] ? why : "(see its own message)");
        if (!rc) rc = write_manifest(w, state_json, e);
        if (!rc) rc = publish(w, keep_last, e);
        if (rc) rm_rf(w->tmp);
    }
    bool published = !wsync(w, rc != 0 && w->rank == 0) && !any;
    if (!rc && w->rank != 0 && !published)
        rc = ust_errf(e, "checkpoint %s: rank 0 did not finish the commit (see its message)",
                      w->final_dir);
    free_writer(w);
    return rc;
}

int ckpt_commit(ckpt_writer *w, const char *state_json, int keep_last, ust_err *e) {
    if (w->stage) return ckpt_commit_async(w, state_json, keep_last, e) || ckpt_poll(w, 1, e);
    int rc = finish_local(w, state_json, e);
    return finish_global(w, rc, state_json, keep_last, e);
}

/* ---------------------------------------------------------------------------------------------
 * checkpoint.async */

ckpt_stage *ckpt_stage_create(int64_t bytes, ust_err *e) {
    if (bytes < 0 || bytes > ((int64_t)1 << 46)) {
        ust_errf(e, "checkpoint: async staging buffer of %lld bytes", (long long)bytes);
        return NULL;
    }
    void *buf = calloc(1, (size_t)(bytes > 0 ? bytes : 1));
    ckpt_stage *s = buf ? ckpt_stage_wrap(buf, bytes, e) : NULL;
    if (!buf)
        ust_errf(e, "checkpoint: no host memory for the async staging buffer (%lld bytes)",
                 (long long)bytes);
    if (s) s->owned = true;
    else free(buf);
    return s;
}

ckpt_stage *ckpt_stage_wrap(void *buf, int64_t bytes, ust_err *e) {
    ckpt_stage *s = calloc(1, sizeof *s);
    if (!s) {
        ust_errf(e, "checkpoint: out of memory");
        return NULL;
    }
    memset(buf, 0, (size_t)(bytes > 0 ? bytes : 1)); /* resident now, not at the first save */
    s->buf = buf;
    s->cap = bytes;
    return s;
}

void ckpt_stage_free(ckpt_stage *s) {
    if (!s) return;
    if (s->owned) free(s->buf);
    free(s->runs);
    free(s);
}

int64_t ckpt_stage_bytes(const ckpt_stage *s) { return s ? s->cap : 0; }

void ckpt_set_stage(ckpt_writer *w, ckpt_stage *s) {
    w->stage = s;
    if (s) s->used = 0, s->nruns = 0;
}

/* The background writer: the staged runs to their files (with their CRCs), then finish_local. */
static void *writer_thread(void *arg) {
    ckpt_writer *w = arg;
    const ckpt_stage *s = w->stage;
    ust_err e = w->first_error;
    int rc = w->failed ? -1 : 0;
    for (int64_t i = 0; !rc && i < s->nruns; i++) {
        const staged_run *r = &s->runs[i];
        const wfile *f = &w->files[r->file];
        rc = pwrite_all(f->fd, s->buf + r->at, (size_t)r->len, r->off, f->path, &e);
        if (!rc) ckman_add(&w->log, r->file, r->tensor, r->off, s->buf + r->at, r->len);
        if (!rc) fault_sleep(w);
    }
    if (rc) writer_fail(w, &e);
    rc = finish_local(w, w->state_json, &e);
    w->thread_err = e;
    w->thread_rc = rc;
    atomic_store(&w->thread_done, 1);
    return NULL;
}

int ckpt_commit_async(ckpt_writer *w, const char *state_json, int keep_last, ust_err *e) {
    (void)e;
    w->keep_last = keep_last;
    if (state_json && !(w->state_json = strdup(state_json))) {
        ust_err oom;
        ust_errf(&oom, "checkpoint: out of memory");
        writer_fail(w, &oom);
    }
    if (!w->stage) { /* nothing staged: the writes were made already */
        w->thread_rc = finish_local(w, w->state_json, &w->thread_err);
        atomic_store(&w->thread_done, 1);
        return 0;
    }
    if (pthread_create(&w->thread, NULL, writer_thread, w) == 0)
        w->thread_started = true;
    else
        writer_thread(w); /* no thread to be had: write now */
    return 0;
}

int ckpt_poll(ckpt_writer *w, int block, ust_err *e) {
    if (block && w->thread_started) {
        pthread_join(w->thread, NULL);
        w->thread_started = false;
    }
    int done = atomic_load(&w->thread_done);
    bool waiting = w->sync ? w->sync(w->sync_arg, !done, NULL, 0) >= 0 : !done;
    if (waiting) return 1;
    if (w->thread_started) {
        pthread_join(w->thread, NULL);
        w->thread_started = false;
    }
    if (w->thread_rc) *e = w->thread_err;
    return finish_global(w, w->thread_rc, w->state_json, w->keep_last, e) ? -1 : 0;
}

void ckpt_abort(ckpt_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->nfiles; i++)
        if (w->files[i].fd >= 0) {
            close(w->files[i].fd);
            w->files[i].fd = -1;
        }
    if (w->rank == 0) rm_rf(w->tmp); /* only the temporary directory: step_* stay as they are */
    free_writer(w);
}

/* `latest` must be a regular file when it exists: a directory, FIFO or device there would hang
 * the resume or fail only at the next save, after training. 1: present, 0: absent, -1: bad. */
static int check_latest(const char *dir, ust_err *e) {
    char p[PATH_MAX];
    struct stat st;
    if (pathf(p, sizeof p, e, "%s/latest", dir)) return -1;
    if (stat(p, &st) != 0) return errno == ENOENT ? 0 : ust_errf(e, "%s: %s", p, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return ust_errf(e,
                        "checkpoint %s: latest is %s, not the file naming the newest checkpoint "
                        "(remove it; the next save writes it)",
                        dir, fs_kind(st.st_mode));
    return 1;
}

static bool has_entry(const char *dir, const char *name) {
    char p[PATH_MAX + 32];
    return snprintf(p, sizeof p, "%s/%s", dir, name) < (int)sizeof p && access(p, F_OK) == 0;
}

/* The nearest existing directory of path (path itself when it exists), resolved into real;
 * *is_path: whether that is path. 0, or -1 when not even "." resolves. */
static int nearest_existing(const char *path, char *real, bool *is_path) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    *is_path = true;
    while (!realpath(p, real)) {
        char *slash = strrchr(p, '/');
        if (!slash)
            snprintf(p, sizeof p, ".");
        else if (slash == p)
            snprintf(p, sizeof p, "/");
        else
            *slash = 0;
        *is_path = false;
        if ((!strcmp(p, ".") || !strcmp(p, "/")) && !realpath(p, real)) return -1;
        if (!strcmp(p, ".") || !strcmp(p, "/")) break;
    }
    return 0;
}

int ckpt_refuse_in_step(const char *path, const char *what, ust_err *e) {
    char real[PATH_MAX];
    bool at_path;
    if (nearest_existing(path, real, &at_path)) return 0;
    for (;; at_path = false) {
        if (ckpt_dir_step(real) >= 0 &&
            (has_entry(real, "state.json") || has_entry(real, CKMAN_FILE)))
            return ust_errf(e,
                            "%s %s is %s ustrain checkpoint step %s: writing there would damage "
                            "the checkpoint (or be pruned with it); use a directory of its own",
                            what, path, at_path ? "the" : "inside the", real);
        char *slash = strrchr(real, '/');
        if (!slash || slash == real) return 0;
        *slash = 0;
    }
}

int ckpt_refuse_output(const char *file, const char *what, ust_err *e) {
    if (ckpt_refuse_in_step(file, what, e)) return -1;
    char dir[PATH_MAX];
    const char *slash = strrchr(file, '/'), *base = slash ? slash + 1 : file;
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - file) + (slash == file) : 1,
             slash ? file : ".");
    if ((!strcmp(base, "latest") || !strcmp(base, LOCK_FILE)) &&
        (has_entry(dir, "latest") || has_entry(dir, LOCK_FILE)))
        return ust_errf(e,
                        "%s %s is a ustrain checkpoint directory's %s: writing it would damage "
                        "the checkpoints; use a file of its own",
                        what, file, base);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The job's lock on the checkpoint directory. flock is released by the kernel when the holder
 * dies, however it dies, so a crashed job never blocks the next one; the file itself stays and
 * names the last holder. */

static void describe_holder(char *out, size_t n) {
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    time_t now = time(NULL);
    struct tm tm;
    char when[64] = "?";
    if (localtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S %z", &tm);
    snprintf(out, n, "host %s, pid %ld, started %s\n", host, (long)getpid(), when);
}

/* Temporary step directories of earlier jobs: nobody else can be writing them while we hold
 * the lock (.old_step_N is left alone: it may be the only copy of a step being replaced). */
static void remove_stale_tmp(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char p[PATH_MAX];
        if (strncmp(de->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) ||
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name) >= (int)sizeof p)
            continue;
        if (rm_rf(p) != 0)
            fprintf(stderr, "ustrain: warning: checkpoint: cannot remove stale %s: %s\n", p,
                    strerror(errno));
    }
    if (d) closedir(d);
}

int ckpt_lock_dir(const char *dir, ckpt_lock *l, ust_err *e) {
    l->fd = -1;
    char p[PATH_MAX];
    ust_err inner;
    if (ckpt_refuse_in_step(dir, "checkpoint.dir", e) || fs_mkdir_p(dir, e) ||
        pathf(p, sizeof p, e, "%s/" LOCK_FILE, dir))
        return -1;
    int fd = fs_open_regular(p, O_RDWR | O_CREAT, 0644, &inner);
    if (fd < 0) return ust_errf(e, "checkpoint.dir %s: cannot lock: %s", dir, inner.msg);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        char holder[512] = "";
        ssize_t k = err == EWOULDBLOCK ? pread(fd, holder, sizeof holder - 1, 0) : -1;
        holder[k > 0 ? k : 0] = 0;
        holder[strcspn(holder, "\n")] = 0;
        close(fd);
        if (err == EWOULDBLOCK)
            return ust_errf(e,
                            "checkpoint.dir %s is in use by another job (%s; lock file %s): two "
                            "jobs must not share a checkpoint directory",
                            dir, holder[0] ? holder : "holder not yet recorded", p);
        if (err != ENOLCK && err != EOPNOTSUPP && err != ENOSYS)
            return ust_errf(e, "checkpoint.dir %s: cannot lock %s: %s", dir, p, strerror(err));
        fprintf(stderr,
                "ustrain: warning: checkpoint.dir %s: the file system does not support locks "
                "(%s); nothing stops a second job from using the same directory\n",
                dir, strerror(err));
        fd = -1;
    }
    if (fd >= 0) {
        char text[512];
        describe_holder(text, sizeof text);
        if (ftruncate(fd, 0) != 0 || pwrite(fd, text, strlen(text), 0) < 0)
            fprintf(stderr, "ustrain: warning: cannot record the holder in %s: %s\n", p,
                    strerror(errno));
    }
    l->fd = fd;
    if (check_latest(dir, e) < 0) {
        ckpt_unlock_dir(l);
        return -1;
    }
    remove_stale_tmp(dir);
    return 0;
}

void ckpt_unlock_dir(ckpt_lock *l) {
    if (l->fd >= 0) close(l->fd); /* closing the last descriptor releases the flock */
    l->fd = -1;
}

/* ---------------------------------------------------------------------------------------------
 * Finding the newest checkpoint */

/* 1: dir/name is a finished step (its state.json is a regular file and its manifest valid); 0:
 * unfinished (no state.json, or no valid manifest: a directory older ustrains wrote, one left by
 * hand, a damaged one: skipped with a warning); -1: its state.json is something else (a FIFO, a
 * directory): refused, never silently skipped or waited for. */
static int is_finished(const char *dir, const char *name, ust_err *e) {
    char p[PATH_MAX], step_dir[PATH_MAX];
    struct stat st;
    if (snprintf(p, sizeof p, "%s/%s/%s", dir, name, STATE_JSON) >= (int)sizeof p) return 0;
    if (stat(p, &st) != 0) return 0;
    if (!S_ISREG(st.st_mode))
        return ust_errf(e, "checkpoint %s/%s: %s is %s, not a regular file", dir, name, STATE_JSON,
                        fs_kind(st.st_mode));
    snprintf(step_dir, sizeof step_dir, "%s/%s", dir, name);
    ust_err why;
    int valid = ckman_valid(step_dir, parse_step_name(name), &why);
    if (valid == 0)
        fprintf(stderr,
                "ustrain: warning: checkpoint %s has no %s (not sealed: written by an older "
                "ustrain, or not by ustrain); it is not resumed from\n",
                step_dir, CKMAN_FILE);
    if (valid < 0)
        fprintf(stderr, "ustrain: warning: %s; it is not resumed from\n", why.msg);
    return valid > 0;
}

/* The highest finished step_N below `below`, other than step `skip` (looked into already);
 * .tmp_step_N and .old_step_N never count. */
static int newest_below(const char *dir, int64_t below, int64_t skip, char *name, size_t n,
                        ust_err *e) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        return ust_errf(e, "checkpoint: cannot read directory %s: %s", dir, strerror(errno));
    }
    int64_t *steps = NULL;
    int ns = 0, cap = 0, rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d))) {
        int64_t s = parse_step_name(de->d_name);
        if (s < 0 || s >= below || s == skip) continue;
        if (ns == cap) {
            int64_t *nn = realloc(steps, sizeof(int64_t) * (size_t)(cap = cap ? 2 * cap : 16));
            if (!nn) rc = ust_errf(e, "checkpoint: out of memory");
            else steps = nn;
        }
        if (rc == 0) steps[ns++] = s;
    }
    closedir(d);
    int64_t best = -1;
    while (rc == 0 && ns > 0) { /* newest first: only those are looked into */
        int k = 0;
        for (int i = 1; i < ns; i++)
            if (steps[i] > steps[k]) k = i;
        char nm[64];
        snprintf(nm, sizeof nm, "step_%lld", (long long)steps[k]);
        int done = is_finished(dir, nm, e);
        if (done < 0) rc = -1;
        if (done > 0) {
            best = steps[k];
            break;
        }
        steps[k] = steps[--ns];
    }
    free(steps);
    if (rc) return -1;
    if (best < 0) return 0;
    snprintf(name, n, "step_%lld", (long long)best);
    return 1;
}

static int step_path(char *out, int out_size, const char *dir, const char *name, ust_err *e) {
    int k = snprintf(out, (size_t)out_size, "%s/%s", dir, name);
    if (k < 0 || k >= out_size)
        return ust_errf(e, "checkpoint: path %s/%s does not fit %d bytes", dir, name, out_size);
    return 1;
}

int ckpt_find_latest(const char *dir, char *out, int out_size, ust_err *e) {
    char p[PATH_MAX];
    int have = pathf(p, sizeof p, e, "%s/latest", dir) ? -1 : check_latest(dir, e);
    if (have < 0) return -1;
    char name[64] = "";
    int64_t named = -1;
    ust_err inner;
    FILE *f = have ? fs_fopen_regular(p, "rb", &inner) : NULL;
    if (have && !f) return ust_errf(e, "checkpoint: %s", inner.msg);
    if (f) {
        if (!fgets(name, sizeof name, f)) name[0] = 0;
        fclose(f);
        name[strcspn(name, "\r\n")] = 0;
        named = parse_step_name(name);
        int done = named < 0 ? 0 : is_finished(dir, name, e);
        if (done < 0) return -1;
        if (!done) name[0] = 0;
    }
    /* no usable `latest` (missing, or it names a step that is gone): the highest finished one */
    if (!name[0]) {
        int found = newest_below(dir, INT64_MAX, named, name, sizeof name, e);
        if (found <= 0) return found;
    }
    return step_path(out, out_size, dir, name, e);
}

int ckpt_find_latest_before(const char *dir, int64_t below, char *out, int out_size, ust_err *e) {
    char name[64];
    int found = newest_below(dir, below, -1, name, sizeof name, e);
    return found <= 0 ? found : step_path(out, out_size, dir, name, e);
}

int ckpt_verify(const char *step_dir, int rank, int world, ckpt_sync_fn sync, void *sync_arg,
                ust_err *e) {
    int rc = ckman_verify(step_dir, rank, world > 0 ? world : 1, e);
    if (!sync) return rc;
    char why[sizeof e->msg];
    snprintf(why, sizeof why, "%s", rc ? e->msg : "");
    int failed = sync(sync_arg, rc != 0, why, sizeof why);
    if (failed < 0) return 0;
    ust_errf(e, "%s", why[0] ? why : "checkpoint verification failed on another rank");
    return -1;
}

/* ---------------------------------------------------------------------------------------------
 * safetensors reader. The header is untrusted: every length, offset and type is checked before
 * it is used, and a tensor can only be reached through an entry that lies inside the file. */

typedef struct {
    char *name;
    char dtype[16];
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t begin, end; /* relative to the data start */
} st_entry;

struct st_file {
    char *path;
    void *map;
    size_t size;
    const unsigned char *data; /* start of the tensor data */
    int64_t data_len;
    int64_t meta_step; /* __metadata__'s ustrain_step, -1 when absent */
    int n;
    st_entry *e;  /* in header order */
    int *by_name; /* indices sorted by name, for lookup */
};

static int dtype_size(const char *dt) {
    static const struct {
        const char *name;
        int size;
    } t[] = {{"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
             {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U64", 8},     {"U32", 4},
             {"U16", 2}, {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(dt, t[i].name)) return t[i].size;
    return 0;
}

/* A JSON number that is an exact non-negative integer below 2^53. */
static bool json_uint(const cJSON *j, int64_t *v) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d < MAX_SAFE_INT) || d != (double)(int64_t)d) return false;
    *v = (int64_t)d;
    return true;
}

static int cmp_entry(const void *a, const void *b, void *file) {
    const st_file *f = file;
    return strcmp(f->e[*(const int *)a].name, f->e[*(const int *)b].name);
}

static int parse_entry(st_entry *en, const char *path, const cJSON *item, int64_t data_len,
                       ust_err *e) {
    const char *nm = item->string;
    if (!cJSON_IsObject(item))
        return ust_errf(e, "%s: safetensors entry '%.200s' is not an object", path, nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of))
        return ust_errf(e, "%s: tensor '%.200s' needs dtype, shape and data_offsets", path, nm);
    int esize = dtype_size(dt->valuestring);
    if (!esize)
        return ust_errf(e, "%s: tensor '%.200s' has unknown dtype '%.32s'", path, nm,
                        dt->valuestring);
    snprintf(en->dtype, sizeof en->dtype, "%s", dt->valuestring);
    int nd = cJSON_GetArraySize(sh);
    if (nd > ST_MAX_DIMS)
        return ust_errf(e, "%s: tensor '%.200s' has %d dims (at most %d)", path, nm, nd,
                        ST_MAX_DIMS);
    en->ndim = nd;
    int64_t numel = 1, d = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, sh) {
        if (!json_uint(x, &en->shape[d]))
            return ust_errf(e, "%s: tensor '%.200s' has a bad shape", path, nm);
        /* overflow-safe: numel * esize must stay within the data section */
        if (en->shape[d] != 0 && numel > data_len / en->shape[d])
            numel = data_len + 1;
        else
            numel *= en->shape[d];
        d++;
    }
    if (cJSON_GetArraySize(of) != 2 || !json_uint(cJSON_GetArrayItem(of, 0), &en->begin) ||
        !json_uint(cJSON_GetArrayItem(of, 1), &en->end) || en->begin > en->end)
        return ust_errf(e, "%s: tensor '%.200s' has bad data_offsets", path, nm);
    if (en->end > data_len)
        return ust_errf(e,
                        "%s: tensor '%.200s' data_offsets [%lld, %lld] run past the end of the "
                        "file (%lld data bytes)",
                        path, nm, (long long)en->begin, (long long)en->end, (long long)data_len);
    if (numel > data_len || en->end - en->begin != numel * esize)
        return ust_errf(e, "%s: tensor '%.200s' has %lld bytes but its shape needs %lld", path, nm,
                        (long long)(en->end - en->begin),
                        numel > data_len ? -1LL : (long long)(numel * esize));
    en->name = strdup(nm);
    if (!en->name) return ust_errf(e, "%s: out of memory", path);
    return 0;
}

static int cmp_offset(const void *a, const void *b, void *file) {
    const st_entry *x = &((const st_file *)file)->e[*(const int *)a];
    const st_entry *y = &((const st_file *)file)->e[*(const int *)b];
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* As the safetensors format requires: the tensors, in offset order, tile the data section from
 * its first byte to its last, without overlaps (aliased weights) or gaps (a shifted header). */
static int check_layout(st_file *f, ust_err *e) {
    int *order = malloc(sizeof(int) * (size_t)(f->n ? f->n : 1));
    if (!order) return ust_errf(e, "%s: out of memory", f->path);
    for (int i = 0; i < f->n; i++) order[i] = i;
    qsort_r(order, (size_t)f->n, sizeof(int), cmp_offset, f);
    int64_t at = 0;
    int rc = 0;
    for (int i = 0; i < f->n && !rc; i++) {
        const st_entry *en = &f->e[order[i]];
        if (en->begin < at)
            rc = ust_errf(e,
                          "%s: tensor '%.200s' data_offsets [%lld, %lld] overlap the tensor before "
                          "it (which ends at %lld)",
                          f->path, en->name, (long long)en->begin, (long long)en->end,
                          (long long)at);
        else if (en->begin > at)
            rc = ust_errf(e,
                          "%s: tensor '%.200s' starts at data byte %lld, leaving a gap after byte "
                          "%lld (tensors must cover the data section without gaps)",
                          f->path, en->name, (long long)en->begin, (long long)at);
        at = en->end;
    }
    if (!rc && at != f->data_len)
        rc = ust_errf(e,
                      "%s: the tensors cover %lld of the %lld data bytes (a wrong header length, "
                      "or bytes after the last tensor)",
                      f->path, (long long)at, (long long)f->data_len);
    free(order);
    return rc;
}

static int st_parse(st_file *f, ust_err *e) {
    const unsigned char *base = f->map;
    f->meta_step = -1;
    if (f->size < 8)
        return ust_errf(e, "%s: not a safetensors file (%zu bytes, no header length)", f->path,
                        f->size);
    uint64_t hlen;
    memcpy(&hlen, base, 8);
    if (hlen > ST_MAX_HEADER || hlen > f->size - 8)
        return ust_errf(e,
                        "%s: not a safetensors file (header length %llu; the file has %zu bytes)",
                        f->path, (unsigned long long)hlen, f->size);
    f->data = base + 8 + hlen;
    f->data_len = (int64_t)(f->size - 8 - hlen);
    const char *js = (const char *)base + 8, *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(js, (size_t)hlen, &end, 0);
    if (!root) return ust_errf(e, "%s: safetensors header is not valid JSON", f->path);
    int rc = 0;
    if (end)
        for (const char *q = end; q < js + hlen && !rc; q++)
            if (*q != ' ' && *q != '\n' && *q != '\t' && *q != '\r' && *q != 0)
                rc = ust_errf(e, "%s: safetensors header has trailing bytes", f->path);
    if (!rc && !cJSON_IsObject(root))
        rc = ust_errf(e, "%s: safetensors header is not a JSON object", f->path);
    /* cJSON's strings end at a NUL: a name or dtype holding "\u0000" would be read as its
     * prefix ("F32\u0000junk" as F32) */
    if (!rc && memmem(js, (size_t)hlen, "\\u0000", 6))
        rc = ust_errf(e, "%s: safetensors header holds a NUL character (\\u0000) in a string",
                      f->path);
    int n = 0;
    const cJSON *it;
    if (!rc) cJSON_ArrayForEach(it, root) n += !!strcmp(it->string, "__metadata__");
    if (!rc) {
        f->e = calloc((size_t)(n ? n : 1), sizeof(st_entry));
        f->by_name = calloc((size_t)(n ? n : 1), sizeof(int));
        if (!f->e || !f->by_name) rc = ust_errf(e, "%s: out of memory", f->path);
    }
    if (!rc) cJSON_ArrayForEach(it, root) {
            if (!strcmp(it->string, "__metadata__")) {
                if (!cJSON_IsObject(it))
                    rc = ust_errf(e, "%s: __metadata__ is not an object", f->path);
                const cJSON *s = cJSON_GetObjectItemCaseSensitive(it, ST_META_STEP);
                char *end = NULL;
                if (!rc && cJSON_IsString(s)) f->meta_step = strtoll(s->valuestring, &end, 10);
                if (!rc && cJSON_IsString(s) && (!s->valuestring[0] || *end || f->meta_step < 0))
                    rc = ust_errf(e, "%s: __metadata__ %s '%s' is not a step", f->path,
                                  ST_META_STEP, s->valuestring);
            } else {
                rc = parse_entry(&f->e[f->n], f->path, it, f->data_len, e);
                if (!rc) f->n++;
            }
            if (rc) break;
        }
    cJSON_Delete(root);
    if (rc) return -1;
    for (int i = 0; i < f->n; i++) f->by_name[i] = i;
    qsort_r(f->by_name, (size_t)f->n, sizeof(int), cmp_entry, f);
    for (int i = 1; i < f->n; i++)
        if (!strcmp(f->e[f->by_name[i]].name, f->e[f->by_name[i - 1]].name))
            return ust_errf(e, "%s: tensor '%.200s' appears twice", f->path,
                            f->e[f->by_name[i]].name);
    return check_layout(f, e);
}

st_file *st_open(const char *path, ust_err *e) {
    st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        ust_errf(e, "%s: out of memory", path);
        return NULL;
    }
    int fd = fs_open_regular(path, O_RDONLY, 0, e);
    struct stat st;
    int rc = fd < 0 ? -1 : 0;
    if (!rc && fstat(fd, &st) != 0)
        rc = ust_errf(e, "%s: cannot stat: %s", path, strerror(errno));
    else if (!rc && st.st_size < 8)
        rc = ust_errf(e, "%s: not a safetensors file (%lld bytes, no header length)", path,
                      (long long)st.st_size);
    if (!rc) {
        f->size = (size_t)st.st_size;
        f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            f->map = NULL;
            rc = ust_errf(e, "%s: cannot mmap: %s", path, strerror(errno));
        } else {
            fs_guard_mapping(f->map, f->size, path);
        }
    }
    if (fd >= 0) close(fd);
    if (!rc) rc = st_parse(f, e);
    if (rc) {
        st_close(f);
        return NULL;
    }
    return f;
}

void st_close(st_file *f) {
    if (!f) return;
    if (f->map) {
        fs_unguard_mapping(f->map);
        munmap(f->map, f->size);
    }
    for (int i = 0; i < f->n; i++) free(f->e[i].name);
    free(f->e);
    free(f->by_name);
    free(f->path);
    free(f);
}

int st_count(const st_file *f) { return f->n; }

const char *st_name(const st_file *f, int i) { return i >= 0 && i < f->n ? f->e[i].name : NULL; }

static const st_entry *st_find(const st_file *f, const char *name) {
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int c = strcmp(name, f->e[f->by_name[mid]].name);
        if (!c) return &f->e[f->by_name[mid]];
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

const float *st_tensor(const st_file *f, const char *name, int *ndim, int64_t shape[4]) {
    const st_entry *en = st_find(f, name);
    if (!en || strcmp(en->dtype, "F32") || en->ndim > 4) return NULL;
    const unsigned char *p = f->data + en->begin;
    if ((uintptr_t)p % _Alignof(float)) return NULL; /* foreign file with unaligned data */
    if (ndim) *ndim = en->ndim;
    if (shape)
        for (int d = 0; d < en->ndim; d++) shape[d] = en->shape[d];
    return (const float *)p;
}

int st_raw(const st_file *f, const char *name, st_view *v) {
    const st_entry *en = st_find(f, name);
    if (!en || en->ndim > 4) return -1;
    v->data = f->data + en->begin;
    v->dtype = en->dtype;
    v->esize = dtype_size(en->dtype);
    v->ndim = en->ndim;
    for (int d = 0; d < en->ndim; d++) v->shape[d] = en->shape[d];
    return 0;
}

const char *st_path(const st_file *f) { return f->path; }

/* ---------------------------------------------------------------------------------------------
 * Checkpoint reader */

#define READER_MAX_FILES 8

struct ckpt_reader {
    char dir[PATH_MAX];
    char *state;
    struct {
        char name[CKPT_NAME_MAX];
        st_file *f;
    } files[READER_MAX_FILES];
    int nfiles;
};

ckpt_reader *ckpt_open(const char *step_dir, ust_err *e) {
    ckpt_reader *r = calloc(1, sizeof *r);
    if (!r) {
        ust_errf(e, "checkpoint: out of memory");
        return NULL;
    }
    char p[PATH_MAX];
    struct stat st;
    int rc = pathf(r->dir, sizeof r->dir, e, "%s", step_dir);
    if (!rc) rc = pathf(p, sizeof p, e, "%s/%s", step_dir, STATE_JSON);
    if (!rc && stat(step_dir, &st) != 0)
        rc = ust_errf(e, "checkpoint %s: %s", step_dir, strerror(errno));
    else if (!rc && !S_ISDIR(st.st_mode))
        rc = ust_errf(e, "checkpoint %s: not a directory", step_dir);
    FILE *f = NULL;
    ust_err inner;
    if (!rc && !(f = fs_fopen_regular(p, "rb", &inner)))
        rc = ust_errf(e, "checkpoint %s: cannot read %s (not a finished checkpoint?): %s", step_dir,
                      STATE_JSON, inner.msg);
    struct stat fst;
    if (!rc && (fstat(fileno(f), &fst) != 0 || fst.st_size > STATE_MAX))
        rc = ust_errf(e, "checkpoint %s: %s is unreadable or larger than %d bytes", step_dir,
                      STATE_JSON, STATE_MAX);
    if (!rc && !(r->state = malloc((size_t)fst.st_size + 1)))
        rc = ust_errf(e, "checkpoint: out of memory");
    if (!rc) {
        size_t n = fread(r->state, 1, (size_t)fst.st_size, f);
        if (ferror(f) || n != (size_t)fst.st_size)
            rc = ust_errf(e, "checkpoint %s: cannot read %s", step_dir, STATE_JSON);
        else
            r->state[n] = 0;
    }
    if (f) fclose(f);
    if (rc) {
        ckpt_close(r);
        return NULL;
    }
    return r;
}

void ckpt_close(ckpt_reader *r) {
    if (!r) return;
    for (int i = 0; i < r->nfiles; i++) st_close(r->files[i].f);
    free(r->state);
    free(r);
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
    return parse_step_name(base);
}

int ckpt_parse_state(const char *json, const char *dir, ckpt_state *out, ust_err *e) {
    cJSON *j = cJSON_Parse(json ? json : "");
    const cJSON *since = cJSON_GetObjectItem(j, "batch_since");
    int64_t g = 0, s0 = 0, i0 = 0;
    /* integers within 2^53 (doubles hold them exactly) */
    int ok = j && json_uint(cJSON_GetObjectItem(j, "step"), &out->step) &&
             json_uint(cJSON_GetObjectItem(j, "sample_index"), &out->sample_index);
    int has_since = ok && since;
    if (has_since)
        ok = json_uint(cJSON_GetObjectItem(since, "global_batch_size"), &g) && g > 0 &&
             json_uint(cJSON_GetObjectItem(since, "step"), &s0) &&
             json_uint(cJSON_GetObjectItem(since, "sample_index"), &i0);
    cJSON *loss = cJSON_GetObjectItem(j, "loss");
    out->loss = cJSON_IsNumber(loss) ? loss->valuedouble : NAN;
    char *seen_step = j ? cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "step")) : NULL;
    char *seen_si = j ? cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "sample_index")) : NULL;
    cJSON_Delete(j);
    if (!ok)
        ust_errf(e,
                 "%s/state.json: missing or invalid step / sample_index (step %.40s, sample_index "
                 "%.40s; both must be integers in [0, 2^53))",
                 dir, seen_step ? seen_step : "absent", seen_si ? seen_si : "absent");
    free(seen_step);
    free(seen_si);
    if (!ok) return -1;
    int64_t named = ckpt_dir_step(dir);
    if (named >= 0 && named != out->step)
        return ust_errf(e, "%s/state.json: says step %lld, but the directory is step %lld", dir,
                        (long long)out->step, (long long)named);
    out->batch_since_step = s0;
    out->batch_since_sample = i0;
    out->batch_size = has_since ? g : 0;
    if (has_since &&
        (s0 > out->step || i0 > out->sample_index ||
         (out->sample_index - i0) / g != out->step - s0 || (out->sample_index - i0) % g != 0))
        return ust_errf(e,
                        "%s/state.json: sample_index %lld is not what step %lld implies (%lld + "
                        "(%lld - %lld) x global_batch_size %lld)",
                        dir, (long long)out->sample_index, (long long)out->step, (long long)i0,
                        (long long)out->step, (long long)s0, (long long)g);
    return 0;
}

const char *ckpt_state_json(const ckpt_reader *r) { return r->state; }

/* The files are mapped on first use: a reader that only wants the model never maps the
 * optimizer state. */
int st_check_step(const st_file *f, const char *state_json, const char *dir, const char *file,
                  ust_err *e) {
    cJSON *state = cJSON_Parse(state_json ? state_json : "");
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(state, "step");
    int64_t want = cJSON_IsNumber(step) ? (int64_t)step->valuedouble : -1;
    cJSON_Delete(state);
    if (f->meta_step < 0 || want < 0 || f->meta_step == want) return 0;
    return ust_errf(e,
                    "checkpoint %s: %s was written for step %lld, but state.json is step %lld "
                    "(files moved between step directories?)",
                    dir, file, (long long)f->meta_step, (long long)want);
}

static st_file *reader_file(ckpt_reader *r, const char *file, ust_err *e) {
    for (int i = 0; i < r->nfiles; i++)
        if (!strcmp(r->files[i].name, file)) return r->files[i].f;
    if (r->nfiles == READER_MAX_FILES || strlen(file) >= CKPT_NAME_MAX || strchr(file, '/')) {
        ust_errf(e, "checkpoint %s: cannot open file '%s'", r->dir, file);
        return NULL;
    }
    char p[PATH_MAX];
    if (pathf(p, sizeof p, e, "%s/%s", r->dir, file)) return NULL;
    ust_err inner;
    st_file *f = st_open(p, &inner);
    if (!f) {
        ust_errf(e, "checkpoint %s: %s", r->dir, inner.msg);
        return NULL;
    }
    if (st_check_step(f, r->state, r->dir, file, e)) {
        st_close(f);
        return NULL;
    }
    snprintf(r->files[r->nfiles].name, CKPT_NAME_MAX, "%s", file);
    r->files[r->nfiles++].f = f;
    return f;
}

void ckpt_format_shape(char *out, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(out, n, "[");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(out + k, n - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < n) snprintf(out + k, n - k, "]");
}

typedef struct {
    const unsigned char *src;
    float *dst;
} read_ctx;

static int read_run(void *vc, int64_t file_elem, int64_t slice_elem, int64_t n, ust_err *e) {
    (void)e;
    read_ctx *c = vc;
    memcpy(c->dst + slice_elem, c->src + 4 * file_elem, (size_t)n * 4); /* any alignment */
    return 0;
}

int ckpt_check_unused(ckpt_reader *r, const char *file, const ckpt_tensor *want, int n,
                      ust_err *e) {
    st_file *f = reader_file(r, file, e);
    if (!f) return -1;
    char *used = calloc((size_t)f->n + 1, 1);
    UST_ASSERT(used, "out of host memory");
    for (int i = 0; i < n; i++) {
        const st_entry *en = st_find(f, want[i].name);
        if (en) used[en - f->e] = 1;
    }
    int extra = 0;
    char names[512] = "";
    for (int i = 0; i < f->n; i++) {
        if (used[i]) continue;
        size_t k = strlen(names);
        if (extra++ < 3)
            snprintf(names + k, sizeof names - k, "%s'%s'", k ? ", " : "", f->e[i].name);
    }
    free(used);
    if (!extra) return 0;
    return ust_errf(e,
                    "checkpoint %s: %s holds %d tensor%s the configured model does not have "
                    "(%s%s): the model.* keys differ from those it was trained with (its "
                    "state.json has them); resume with them, or start over with "
                    "checkpoint.resume: none",
                    r->dir, file, extra, extra == 1 ? "" : "s", names, extra > 3 ? ", ..." : "");
}

int ckpt_read_slice(ckpt_reader *r, const char *file, const ckpt_tensor *expect,
                    const ckpt_slice *s, float *host_out, ust_err *e) {
    st_file *f = reader_file(r, file, e);
    if (!f) return -1;
    const st_entry *en = st_find(f, expect->name);
    if (!en)
        return ust_errf(e, "checkpoint %s: tensor '%s' missing from %s", r->dir, expect->name,
                        file);
    bool same = en->ndim == expect->ndim;
    for (int d = 0; same && d < en->ndim; d++) same = en->shape[d] == expect->shape[d];
    if (!same) {
        char have[256], want[256];
        ckpt_format_shape(have, sizeof have, en->ndim, en->shape);
        ckpt_format_shape(want, sizeof want, expect->ndim, expect->shape);
        return ust_errf(e, "checkpoint %s: tensor '%s' has shape %s but the model expects %s",
                        r->dir, expect->name, have, want);
    }
    if (strcmp(en->dtype, "F32"))
        return ust_errf(e, "checkpoint %s: tensor '%s' in %s has dtype %s, expected F32", r->dir,
                        expect->name, file, en->dtype);
    int64_t rows = expect->ndim == 2 ? expect->shape[0] : 1;
    int64_t cols = expect->ndim == 2 ? expect->shape[1] : expect->shape[0];
    if (ckpt_check_slice(s, rows, cols, expect->name, e)) return -1;
    read_ctx c = {f->data + en->begin, host_out};
    return ckpt_for_each_run(s, cols, read_run, &c, e);
}

/* ---------------------------------------------------------------------------------------------
 * What the tools (export, generate) read of a finished checkpoint */

int ckpt_resolve_step(const char *path, const char *who, char *out, int n, ust_err *e) {
    char p[PATH_MAX];
    struct stat st;
    if (stat(path, &st) != 0)
        return ust_errf(e, "%s: checkpoint %s: %s", who, path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return ust_errf(e,
                        "%s: %s is not a checkpoint directory (expected a step directory "
                        "holding state.json and model.safetensors)",
                        who, path);
    snprintf(p, sizeof p, "%s/state.json", path);
    if (access(p, F_OK) == 0) { /* a step named by the user: it verifies, or nothing is read */
        snprintf(out, (size_t)n, "%s", path);
        ust_err why;
        if (ckpt_verify(out, 0, 1, NULL, NULL, &why) == 0) return 0;
        return ust_errf(e, "%s: %s", who, why.msg);
    }
    int found = ckpt_find_latest(path, out, n, e);
    if (found < 0) return -1;
    if (!found)
        return ust_errf(e,
                        "%s: %s is not a checkpoint: no state.json there, and no finished "
                        "step_N inside it",
                        who, path);
    /* the newest that verifies, as a resume takes it */
    ust_err why;
    while (found == 1 && ckpt_verify(out, 0, 1, NULL, NULL, &why) != 0) {
        fprintf(stderr, "ustrain: warning: %s: %s; reading the previous complete checkpoint\n", who,
                why.msg);
        char bad[PATH_MAX];
        snprintf(bad, sizeof bad, "%s", out);
        found = ckpt_find_latest_before(path, ckpt_dir_step(bad), out, n, e);
        if (found < 0) return -1;
        if (!found)
            return ust_errf(e,
                            "%s: checkpoint %s failed verification and no earlier complete "
                            "checkpoint is in %s",
                            who, bad, path);
    }
    return 0;
}

int ckpt_load_config(const char *step, const char *who, ust_config *c, ust_err *e) {
    ckpt_reader *r = ckpt_open(step, e);
    if (!r) return -1;
    cJSON *j = cJSON_Parse(ckpt_state_json(r));
    ckpt_close(r);
    const cJSON *y = cJSON_GetObjectItemCaseSensitive(j, "config");
    char where[PATH_MAX + 32];
    snprintf(where, sizeof where, "%s/state.json (config)", step);
    int rc = 0;
    if (!cJSON_IsString(y))
        rc = ust_errf(e, "%s: %s/state.json is not a ustrain checkpoint state (no \"config\" text)",
                      who, step);
    cfg_defaults(c);
    if (!rc) rc = cfg_load_string(c, y->valuestring, where, e);
    if (!rc) rc = cfg_validate(c, 0, e);
    cJSON_Delete(j);
    return rc;
}
