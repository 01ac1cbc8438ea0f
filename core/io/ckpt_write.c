/* ckpt_write: a save's start, files and slices (the commit is ckpt_commit.c). Safetensors
 * checkpoints are written in place by every rank and committed by one rename.
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
#include "ckpt_internal.h"
#include "fs.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Errors are sticky, like ferror: the first one is kept and later writes are skipped, so a
 * rank whose disk failed still takes part in every collective of the save and in the commit's
 * barriers, where its reason reaches rank 0 (instead of dying and leaving the others stuck). */
int ckpt_writer_fail(ckpt_writer *w, const ust_err *e) {
    if (!w->failed) w->first_error = *e;
    w->failed = true;
    return -1;
}

/* A barrier that also tells every rank whether any of them failed. */
bool ckpt_writer_sync(ckpt_writer *w, bool failed) {
    return w->sync ? w->sync(w->sync_arg, failed, NULL, 0) >= 0 : failed;
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
    return ckpt_pathf(out, n, e, "%s/" TMP_PREFIX "%lld%s", dir, (long long)step, tag);
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
    int rc = ckpt_pathf(w->dir, sizeof w->dir, e, "%s", dir);
    if (!rc) rc = tmp_name(w->tmp, sizeof w->tmp, dir, step, job, e);
    if (!rc)
        rc = ckpt_pathf(w->final_dir, sizeof w->final_dir, e, "%s/step_%lld", dir, (long long)step);
    if (!rc && rank == 0) {
        rc = fs_mkdir_p(dir, e);
        if (!rc && ckpt_rm_rf(w->tmp) != 0)
            rc = ust_errf(e, "checkpoint: cannot remove stale %s: %s", w->tmp, strerror(errno));
        if (!rc && mkdir(w->tmp, 0755) != 0)
            rc = ust_errf(e, "checkpoint: cannot create directory %s: %s", w->tmp, strerror(errno));
    }
    /* reached on every path, so a failure on rank 0 cannot hang the others */
    bool any = ckpt_writer_sync(w, rc != 0);
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
        rc = ckpt_pathf(f->path, sizeof f->path, e, "%s/%s", w->tmp, file);
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
        if (!rc) rc = ckpt_pwrite_all(f->fd, hdr, (size_t)hlen, 0, f->path, e);
        if (!rc) ckman_add(&w->log, w->nfiles - 1, -1, 0, hdr, hlen);
        if (!rc && ftruncate(f->fd, (off_t)total) != 0)
            rc = ust_errf(e, "checkpoint: cannot size %s to %lld bytes: %s", f->path,
                          (long long)total, strerror(errno));
    }
    free(hdr);
    bool any = ckpt_writer_sync(w, rc != 0 && w->rank == 0);
    if (!rc && w->rank != 0 && any)
        rc = ust_errf(e, "checkpoint: rank 0 could not create %s", f->path);
    if (!rc && w->rank != 0) {
        f->fd = open(f->path, O_WRONLY | O_CLOEXEC);
        if (f->fd < 0) rc = ust_errf(e, "checkpoint: cannot open %s: %s", f->path, strerror(errno));
    }
    return rc ? ckpt_writer_fail(w, e) : w->nfiles - 1;
}

typedef struct {
    ckpt_writer *w;
    int file;
    const wtensor *t;
    const float *src;
} write_ctx;

/* checkpoint.async: keeps the run in the stage (which the caller sized for everything this rank
 * writes: a save that needs more is refused, never a reallocation behind the plan's back). */
static int stage_run(ckpt_stage *s, int file, int tensor, int64_t off, const void *src, int64_t len,
                     ust_err *e) {
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
    if (ckpt_pwrite_all(f->fd, c->src + slice_elem, (size_t)n * 4, off, f->path, e)) return -1;
    ckman_add(&c->w->log, c->file, tensor, off, c->src + slice_elem, 4 * n);
    progress_add(&c->w->prog, 4.0 * (double)n);
    return 0;
}

/* UST_FAULT_CKPT_SLEEP_MS, once per checkpoint, after the rank's first slice is written */
void ckpt_fault_sleep(ckpt_writer *w) {
    int sleep_ms = w->slept ? 0 : ckpt_fault_env("UST_FAULT_CKPT_SLEEP_MS");
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
    if (!w->prog.what && !w->stage) { /* the first slice: files are laid out, sizes known */
        double all = 0;
        for (int i = 0; i < w->nfiles; i++) all += (double)w->files[i].size;
        progress_begin(&w->prog, "checkpoint: writing", w->rank == 0 ? all : 0, true);
    }
    if (w->failed) { /* sticky: the first error is what commit reports */
        *e = w->first_error;
        return -1;
    }
    if (file < 0 || file >= w->nfiles) {
        ust_errf(e, "checkpoint: no file with index %d", file);
        return ckpt_writer_fail(w, e);
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
    if (rc) ckpt_writer_fail(w, e);
    if (!w->stage) ckpt_fault_sleep(w); /* async: the writer thread sleeps instead */
    return rc;
}

int ckpt_write_slice(ckpt_writer *w, int file, const char *name, const ckpt_slice *s,
                     const float *host_data, ust_err *e) {
    return put_slice(w, file, name, s, host_data, e);
}

int ckpt_stage_reserve(ckpt_writer *w, int file, const char *name, const ckpt_slice *s, float **out,
                       ust_err *e) {
    *out = NULL;
    if (!w->stage) return 0;
    unsigned char *at = w->stage->buf + w->stage->used; /* the runs follow in slice order */
    if (put_slice(w, file, name, s, NULL, e)) return -1;
    *out = (float *)at;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * checkpoint.async: the stage */

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
    if (s)
        s->owned = true;
    else
        free(buf);
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
