#include "ckpt_manifest.h"
#include "ckpt.h"
#include "fs.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define LOG_MAGIC 0x43524355u /* "UCRC" */
#define MANIFEST_MAX (16 << 20)

/* ---------------------------------------------------------------------------------------------
 * The per-rank log of written ranges */

void ckman_add(ckman_log *l, int file, int tensor, int64_t off, const void *data, int64_t len) {
    const unsigned char *p = data;
    while (len > 0 && !l->failed) {
        int64_t room = CKMAN_BLOCK - off % CKMAN_BLOCK, n = len < room ? len : room;
        uint32_t c = (uint32_t)crc32_z(0, p, (z_size_t)n);
        ckman_piece *last = l->n ? &l->p[l->n - 1] : NULL;
        /* it continues the last piece, and off is no block start: the same block */
        if (last && last->file == file && last->tensor == tensor && last->off + last->len == off &&
            off % CKMAN_BLOCK) {
            last->crc = (uint32_t)crc32_combine(last->crc, c, (z_off_t)n);
            last->len += n;
        } else {
            if (l->n == l->cap) {
                int64_t cap = l->cap ? 2 * l->cap : 256;
                ckman_piece *np = realloc(l->p, (size_t)cap * sizeof *np);
                if (!np) {
                    l->failed = 1;
                    return;
                }
                l->p = np, l->cap = cap;
            }
            l->p[l->n++] =
                (ckman_piece){.file = file, .tensor = tensor, .crc = c, .off = off, .len = n};
        }
        p += n, off += n, len -= n;
    }
}

void ckman_free(ckman_log *l) {
    free(l->p);
    memset(l, 0, sizeof *l);
}

static int write_all(int fd, const void *buf, size_t n, const char *path, ust_err *e) {
    const char *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return ust_errf(e, "checkpoint: cannot write %s: %s", path, strerror(errno));
        p += k, n -= (size_t)k;
    }
    return 0;
}

static int log_path(char *out, size_t n, const char *tmpdir, int rank, ust_err *e) {
    if (snprintf(out, n, "%s/.crc.%d", tmpdir, rank) >= (int)n)
        return ust_errf(e, "checkpoint: path %s/.crc.%d is too long", tmpdir, rank);
    return 0;
}

int ckman_save_log(const ckman_log *l, const char *tmpdir, int rank, ust_err *e) {
    char p[PATH_MAX];
    if (l->failed) return ust_errf(e, "checkpoint: out of memory for the checksums");
    if (log_path(p, sizeof p, tmpdir, rank, e)) return -1;
    ust_err inner;
    int fd = fs_open_regular(p, O_WRONLY | O_CREAT | O_TRUNC, 0644, &inner);
    if (fd < 0) return ust_errf(e, "checkpoint: %s", inner.msg);
    uint32_t head[2] = {LOG_MAGIC, 0};
    int64_t n = l->n;
    int rc = write_all(fd, head, sizeof head, p, e);
    if (!rc) rc = write_all(fd, &n, sizeof n, p, e);
    if (!rc && n) rc = write_all(fd, l->p, (size_t)n * sizeof *l->p, p, e);
    if (close(fd) != 0 && !rc)
        rc = ust_errf(e, "checkpoint: cannot write %s: %s", p, strerror(errno));
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Rank 0: the manifest */

/* Appends rank's log (checked: its pieces must name declared files and lie inside them). */
static int read_log(ckman_log *all, const char *tmpdir, int rank, const ckman_files *f,
                    ust_err *e) {
    char p[PATH_MAX];
    if (log_path(p, sizeof p, tmpdir, rank, e)) return -1;
    size_t len = 0;
    ust_err inner;
    char *b = fs_read_file(p, (size_t)1 << 34, &len, &inner);
    if (!b) return ust_errf(e, "checkpoint: rank %d's checksums: %s", rank, inner.msg);
    uint32_t head[2];
    int64_t n = -1;
    if (len >= 16) memcpy(head, b, 8), memcpy(&n, b + 8, 8);
    int rc = 0;
    if (len < 16 || head[0] != LOG_MAGIC || n < 0 ||
        (size_t)n != (len - 16) / sizeof(ckman_piece) || (len - 16) % sizeof(ckman_piece))
        rc = ust_errf(e, "checkpoint: %s is not a checksum log", p);
    for (int64_t i = 0; !rc && i < n; i++) {
        ckman_piece q;
        memcpy(&q, b + 16 + i * (int64_t)sizeof q, sizeof q);
        if (q.file < 0 || q.file >= f->n || q.off < 0 || q.len <= 0 ||
            q.off > f->size[q.file] - q.len || q.tensor < -1 || q.tensor >= f->ntensors[q.file])
            rc = ust_errf(e, "checkpoint: %s: a range outside the files", p);
        if (!rc && all->n == all->cap) {
            int64_t cap = all->cap ? 2 * all->cap : 1024;
            ckman_piece *np = realloc(all->p, (size_t)cap * sizeof *np);
            if (!np)
                rc = ust_errf(e, "checkpoint: out of memory for the checksums");
            else
                all->p = np, all->cap = cap;
        }
        if (!rc) all->p[all->n++] = q;
    }
    free(b);
    unlink(p);
    return rc;
}

static int cmp_piece(const void *a, const void *b) {
    const ckman_piece *x = a, *y = b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* The block CRCs of file k from the sorted pieces [*i, ...) of it (every byte covered once),
 * and into *tensors the CRC of its header and of each tensor, in file order. */
static cJSON *file_crcs(const ckman_log *all, int64_t *i, int k, const ckman_files *f,
                        cJSON **tensors, ust_err *e) {
    cJSON *arr = cJSON_CreateArray();
    int64_t pos = 0, block = -1;
    uint32_t crc = 0, *tc = calloc((size_t)f->ntensors[k] + 1, sizeof *tc);
    char *seen = calloc((size_t)f->ntensors[k] + 1, 1);
    *tensors = cJSON_CreateArray();
    for (; *i < all->n && all->p[*i].file == k; (*i)++) {
        const ckman_piece *q = &all->p[*i];
        int t = q->tensor + 1;
        if (tc && seen) {
            tc[t] = seen[t] ? (uint32_t)crc32_combine(tc[t], q->crc, (z_off_t)q->len) : q->crc;
            seen[t] = 1;
        }
        if (q->off != pos) {
            ust_errf(e, "checkpoint %s: bytes [%lld, %lld) were %s", f->name[k], (long long)pos,
                     (long long)q->off, q->off > pos ? "written by no rank" : "written twice");
            cJSON_Delete(arr), cJSON_Delete(*tensors);
            free(tc), free(seen);
            *tensors = NULL;
            return NULL;
        }
        if (q->off / CKMAN_BLOCK != block) {
            if (block >= 0) cJSON_AddItemToArray(arr, cJSON_CreateNumber(crc));
            block = q->off / CKMAN_BLOCK, crc = q->crc;
        } else {
            crc = (uint32_t)crc32_combine(crc, q->crc, (z_off_t)q->len);
        }
        pos += q->len;
    }
    if (block >= 0) cJSON_AddItemToArray(arr, cJSON_CreateNumber(crc));
    for (int t = 0; tc && seen && t <= f->ntensors[k]; t++)
        cJSON_AddItemToArray(*tensors, cJSON_CreateNumber(tc[t]));
    free(tc), free(seen);
    if (pos != f->size[k]) {
        ust_errf(e, "checkpoint %s: bytes [%lld, %lld) were written by no rank", f->name[k],
                 (long long)pos, (long long)f->size[k]);
        cJSON_Delete(arr), cJSON_Delete(*tensors);
        *tensors = NULL;
        return NULL;
    }
    return arr;
}

static cJSON *file_entry(const char *name, int64_t size, cJSON *crcs, cJSON *tensors) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddNumberToObject(o, "size", (double)size);
    cJSON_AddItemToObject(o, "crc32", crcs);
    if (tensors) cJSON_AddItemToObject(o, "tensor_crc32", tensors); /* header, then each tensor */
    return o;
}

/* state.json, read back: its block CRCs (it is small, usually one block). */
static cJSON *small_file_entry(const char *dir, const char *name, ust_err *e) {
    char p[PATH_MAX];
    size_t len = 0;
    ust_err inner;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    char *b = fs_read_file(p, (size_t)1 << 30, &len, &inner);
    if (!b) {
        ust_errf(e, "checkpoint: %s", inner.msg);
        return NULL;
    }
    cJSON *arr = cJSON_CreateArray();
    for (size_t off = 0; off < len; off += (size_t)CKMAN_BLOCK) {
        size_t n = len - off < (size_t)CKMAN_BLOCK ? len - off : (size_t)CKMAN_BLOCK;
        cJSON_AddItemToArray(arr,
                             cJSON_CreateNumber((uint32_t)crc32_z(0, (unsigned char *)b + off, n)));
    }
    free(b);
    return file_entry(name, (int64_t)len, arr, NULL);
}

static int write_synced(const char *path, const char *text, ust_err *e) {
    ust_err inner;
    int fd = fs_open_regular(path, O_WRONLY | O_CREAT | O_TRUNC, 0644, &inner);
    if (fd < 0) return ust_errf(e, "checkpoint: %s", inner.msg);
    int rc = write_all(fd, text, strlen(text), path, e);
    if (!rc && fsync(fd) != 0)
        rc = ust_errf(e, "checkpoint: cannot fsync %s: %s", path, strerror(errno));
    if (close(fd) != 0 && !rc)
        rc = ust_errf(e, "checkpoint: cannot write %s: %s", path, strerror(errno));
    return rc;
}

/* The ranks whose logs are in tmpdir (.crc.<r>), as a count: they must be 0..n-1. */
static int count_logs(const char *tmpdir, ust_err *e) {
    DIR *d = opendir(tmpdir);
    if (!d) return ust_errf(e, "checkpoint: cannot read %s: %s", tmpdir, strerror(errno));
    int n = 0, max = -1;
    struct dirent *de;
    while ((de = readdir(d))) {
        char *end;
        if (strncmp(de->d_name, ".crc.", 5) || !de->d_name[5]) continue;
        long r = strtol(de->d_name + 5, &end, 10);
        if (*end || r < 0 || r > INT_MAX - 1) continue;
        n++;
        if (r > max) max = (int)r;
    }
    closedir(d);
    if (n != max + 1 || n == 0)
        return ust_errf(e, "checkpoint: %s holds the checksums of %d ranks, not of ranks 0..%d",
                        tmpdir, n, max);
    return n;
}

int ckman_write(const char *tmpdir, const ckman_files *f, const char *job, int64_t step,
                const char *state_json, ust_err *e) {
    ckman_log all = {0};
    int world = count_logs(tmpdir, e), rc = world < 0 ? -1 : 0;
    for (int r = 0; r < world; r++)
        if (read_log(&all, tmpdir, r, f, rc ? &(ust_err){0} : e)) rc = -1;
    if (rc) {
        ckman_free(&all);
        return -1;
    }
    qsort(all.p, (size_t)all.n, sizeof *all.p, cmp_piece);
    cJSON *root = cJSON_CreateObject(), *files = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "format", CKMAN_FORMAT);
    cJSON_AddNumberToObject(root, "step", (double)step);
    cJSON_AddStringToObject(root, "job", job ? job : "");
    cJSON_AddNumberToObject(root, "world", world);
    cJSON *st = state_json ? cJSON_Parse(state_json) : NULL,
          *layout = cJSON_DetachItemFromObjectCaseSensitive(st, "layout");
    cJSON_Delete(st);
    cJSON_AddItemToObject(root, "layout", layout ? layout : cJSON_CreateNull());
    cJSON_AddNumberToObject(root, "block_bytes", (double)CKMAN_BLOCK);
    cJSON_AddItemToObject(root, "files", files);
    int64_t i = 0;
    for (int k = 0; !rc && k < f->n; k++) {
        cJSON *tensors = NULL, *crcs = file_crcs(&all, &i, k, f, &tensors, e);
        if (!crcs) {
            cJSON_Delete(tensors);
            rc = -1;
        } else {
            cJSON_AddItemToArray(files, file_entry(f->name[k], f->size[k], crcs, tensors));
        }
    }
    cJSON *state = rc ? NULL : small_file_entry(tmpdir, "state.json", e);
    if (!rc && !state) rc = -1;
    if (state) cJSON_AddItemToArray(files, state);
    char *text = rc ? NULL : cJSON_Print(root);
    if (!rc && !text) rc = ust_errf(e, "checkpoint: out of memory for the manifest");
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", tmpdir, CKMAN_FILE);
    if (!rc) rc = write_synced(p, text, e);
    free(text);
    cJSON_Delete(root);
    ckman_free(&all);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Reading and verifying */

static cJSON *load(const char *step_dir, ust_err *e) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s/%s", step_dir, CKMAN_FILE) >= (int)sizeof p) {
        ust_errf(e, "checkpoint %s: path too long", step_dir);
        return NULL;
    }
    ust_err inner;
    char *text = fs_read_file(p, MANIFEST_MAX, NULL, &inner);
    if (!text) {
        ust_errf(e, "checkpoint %s: %s", step_dir, inner.msg);
        return NULL;
    }
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) ust_errf(e, "checkpoint %s: %s is not JSON", step_dir, CKMAN_FILE);
    return j;
}

static bool listed(const cJSON *files, const char *name) {
    const cJSON *o;
    cJSON_ArrayForEach(o, files) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return true;
    }
    return false;
}

/* Every file of the step is covered: model.safetensors always, and whatever else the directory
 * holds (the optimizer state, ...) but the manifest itself and dot-files, which nothing reads. A
 * manifest that leaves a file out would let a reader use it unverified. */
static int unlisted_files(const cJSON *files, const char *step_dir, ust_err *e) {
    if (!listed(files, "model.safetensors"))
        return ust_errf(e, "checkpoint %s: %s does not cover model.safetensors", step_dir,
                        CKMAN_FILE);
    DIR *d = opendir(step_dir);
    if (!d) return ust_errf(e, "checkpoint %s: cannot read it: %s", step_dir, strerror(errno));
    int rc = 0;
    for (struct dirent *de; !rc && (de = readdir(d));)
        if (de->d_name[0] != '.' && strcmp(de->d_name, CKMAN_FILE) && !listed(files, de->d_name))
            rc = ust_errf(e,
                          "checkpoint %s: %s does not cover %.200s (every file of a step must be "
                          "listed, or it would be read unverified)",
                          step_dir, CKMAN_FILE, de->d_name);
    closedir(d);
    return rc;
}

/* The manifest's files, checked: names are one path component, sizes and CRC counts agree, and
 * every file of the step directory is among them. */
static int manifest_files(const cJSON *j, const char *step_dir, int64_t step, ust_err *e) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format"),
                *st = cJSON_GetObjectItemCaseSensitive(j, "step"),
                *bb = cJSON_GetObjectItemCaseSensitive(j, "block_bytes"),
                *files = cJSON_GetObjectItemCaseSensitive(j, "files");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, CKMAN_FORMAT))
        return ust_errf(e, "checkpoint %s: %s is not a %s manifest", step_dir, CKMAN_FILE,
                        CKMAN_FORMAT);
    if (!cJSON_IsNumber(st) || st->valuedouble != (double)step) {
        char *said = cJSON_PrintUnformatted(st);
        ust_errf(e, "checkpoint %s: %s is for another step (it says %.40s, the step is %lld)",
                 step_dir, CKMAN_FILE, said ? said : "nothing", (long long)step);
        free(said);
        return -1;
    }
    if (!cJSON_IsNumber(bb) || bb->valuedouble != (double)CKMAN_BLOCK)
        return ust_errf(e, "checkpoint %s: %s has block_bytes other than %lld", step_dir,
                        CKMAN_FILE, (long long)CKMAN_BLOCK);
    if (!cJSON_IsArray(files) || cJSON_GetArraySize(files) < 1 ||
        cJSON_GetArraySize(files) > CKMAN_MAX_FILES + 1)
        return ust_errf(e, "checkpoint %s: %s lists no files", step_dir, CKMAN_FILE);
    int has_state = 0;
    const cJSON *o;
    cJSON_ArrayForEach(o, files) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name"),
                    *size = cJSON_GetObjectItemCaseSensitive(o, "size"),
                    *crc = cJSON_GetObjectItemCaseSensitive(o, "crc32");
        if (!cJSON_IsString(name) || !name->valuestring[0] || strchr(name->valuestring, '/') ||
            name->valuestring[0] == '.' || !cJSON_IsNumber(size) || size->valuedouble < 0 ||
            size->valuedouble > 9007199254740992.0 ||
            size->valuedouble != (double)(int64_t)size->valuedouble || !cJSON_IsArray(crc))
            return ust_errf(e, "checkpoint %s: %s has a bad file entry", step_dir, CKMAN_FILE);
        int64_t blocks = ((int64_t)size->valuedouble + CKMAN_BLOCK - 1) / CKMAN_BLOCK;
        if (cJSON_GetArraySize(crc) != blocks)
            return ust_errf(e, "checkpoint %s: %s: %s has %d checksums for %lld blocks", step_dir,
                            CKMAN_FILE, name->valuestring, cJSON_GetArraySize(crc),
                            (long long)blocks);
        const cJSON *c;
        cJSON_ArrayForEach(
            c,
            crc) if (!cJSON_IsNumber(c) || c->valuedouble < 0 ||
                     c->valuedouble >
                         4294967295.0) return ust_errf(e,
                                                       "checkpoint %s: %s: a bad checksum for %s",
                                                       step_dir, CKMAN_FILE, name->valuestring);
        has_state |= !strcmp(name->valuestring, "state.json");
    }
    if (!has_state)
        return ust_errf(e, "checkpoint %s: %s does not cover state.json", step_dir, CKMAN_FILE);
    return unlisted_files(files, step_dir, e);
}

int ckman_valid(const char *step_dir, int64_t step, ust_err *e) {
    char p[PATH_MAX];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", step_dir, CKMAN_FILE);
    if (lstat(p, &sb) != 0) return errno == ENOENT ? 0 : ust_errf(e, "%s: %s", p, strerror(errno));
    cJSON *j = load(step_dir, e);
    int rc = j ? manifest_files(j, step_dir, step, e) : -1;
    cJSON_Delete(j);
    return rc ? -1 : 1;
}

typedef struct {
    const char *name;
    int64_t begin, end; /* absolute offsets in the file */
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static uint32_t crc_range(int fd, int64_t off, int64_t n, int *ok) {
    unsigned char buf[1 << 16];
    uint32_t c = 0;
    while (n > 0 && *ok) {
        ssize_t r =
            pread(fd, buf, (size_t)(n < (int64_t)sizeof buf ? n : (int64_t)sizeof buf), off);
        if (r <= 0)
            *ok = 0;
        else
            c = (uint32_t)crc32_z(c, buf, (z_size_t)r), off += r, n -= r;
    }
    return c;
}

/* What is damaged in the bytes [a, b) of safetensors file path, for the message: the header
 * and the tensors whose own CRC (tensor_crc32: header first, then the tensors in file order)
 * no longer matches, as " (tensor 'x')" or " (the header and tensors 'x', 'y' and 3 more)";
 * "" when the header cannot be read or the manifest has no tensor CRCs. */
static void damaged_in(const char *path, int fd, int64_t a, int64_t b, const cJSON *tcrc, char *out,
                       size_t cap) {
    out[0] = 0;
    uint64_t n = 0;
    char *h = NULL;
    if (pread(fd, &n, 8, 0) != 8 || n > 100000000 || !(h = malloc(n + 1)) ||
        pread(fd, h, n, 8) != (ssize_t)n) {
        free(h);
        return;
    }
    h[n] = 0;
    cJSON *j = cJSON_Parse(h), *o;
    int nt = 0, count = 0, header = 0, ok = 1;
    span *sp = calloc((size_t)cJSON_GetArraySize(j) + 1, sizeof *sp);
    cJSON_ArrayForEach(o, j) {
        const cJSON *offs = cJSON_GetObjectItemCaseSensitive(o, "data_offsets");
        if (!sp || !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2) continue;
        sp[nt++] =
            (span){o->string, 8 + (int64_t)n + (int64_t)cJSON_GetArrayItem(offs, 0)->valuedouble,
                   8 + (int64_t)n + (int64_t)cJSON_GetArrayItem(offs, 1)->valuedouble};
    }
    if (sp && cJSON_IsArray(tcrc) && cJSON_GetArraySize(tcrc) == nt + 1) {
        qsort(sp, (size_t)nt, sizeof *sp, cmp_span);
        char names[256] = "";
        size_t k = 0;
        if (a < 8 + (int64_t)n)
            header = crc_range(fd, 0, 8 + (int64_t)n, &ok) !=
                     (uint32_t)cJSON_GetArrayItem(tcrc, 0)->valuedouble;
        for (int t = 0; t < nt && ok; t++) {
            if (sp[t].begin >= b || sp[t].end <= a || sp[t].end < sp[t].begin) continue;
            if (crc_range(fd, sp[t].begin, sp[t].end - sp[t].begin, &ok) ==
                (uint32_t)cJSON_GetArrayItem(tcrc, t + 1)->valuedouble)
                continue;
            if (++count <= 3 && k < sizeof names)
                k += (size_t)snprintf(names + k, sizeof names - k, "%s'%s'", count > 1 ? ", " : "",
                                      sp[t].name);
        }
        char more[32] = "";
        if (count > 3) snprintf(more, sizeof more, " and %d more", count - 3);
        if (ok && (header || count))
            snprintf(out, cap, " (%s%s%s%s%s)", header ? "the header" : "",
                     header && count ? " and " : "",
                     count ? (count > 1 ? "tensors " : "tensor ") : "", names, more);
    }
    (void)path;
    free(sp);
    cJSON_Delete(j);
    free(h);
}

static int verify_file(const char *step_dir, const cJSON *o, int64_t *block, int rank, int world,
                       unsigned char *buf, ust_err *e) {
    const char *name = cJSON_GetObjectItemCaseSensitive(o, "name")->valuestring;
    int64_t size = (int64_t)cJSON_GetObjectItemCaseSensitive(o, "size")->valuedouble;
    const cJSON *crcs = cJSON_GetObjectItemCaseSensitive(o, "crc32");
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", step_dir, name);
    ust_err inner;
    int fd = fs_open_regular(p, O_RDONLY, 0, &inner);
    if (fd < 0) return ust_errf(e, "checkpoint %s: %s", step_dir, inner.msg);
    struct stat sb;
    int rc = 0;
    if (fstat(fd, &sb) != 0 || sb.st_size != size)
        rc = ust_errf(e, "checkpoint %s: %s is %lld bytes, the manifest says %lld", step_dir, name,
                      (long long)sb.st_size, (long long)size);
    int64_t nb = cJSON_GetArraySize(crcs);
    for (int64_t k = 0; !rc && k < nb; k++, (*block)++) {
        if (*block % world != rank) continue;
        int64_t off = k * CKMAN_BLOCK, n = size - off < CKMAN_BLOCK ? size - off : CKMAN_BLOCK;
        for (int64_t got = 0; !rc && got < n;) {
            ssize_t r = pread(fd, buf + got, (size_t)(n - got), (off_t)(off + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0)
                rc = ust_errf(e, "checkpoint %s: cannot read %s: %s", step_dir, name,
                              r < 0 ? strerror(errno) : "short file");
            got += r > 0 ? r : 0;
        }
        uint32_t want = (uint32_t)cJSON_GetArrayItem(crcs, (int)k)->valuedouble;
        if (!rc && (uint32_t)crc32_z(0, buf, (z_size_t)n) != want) {
            char what[512];
            damaged_in(p, fd, off, off + n, cJSON_GetObjectItemCaseSensitive(o, "tensor_crc32"),
                       what, sizeof what);
            rc = ust_errf(e,
                          "checkpoint %s: %s does not match its manifest: bytes [%lld, %lld)%s "
                          "have another checksum (damaged after it was written)",
                          step_dir, name, (long long)off, (long long)(off + n), what);
        }
    }
    /* the blocks of a file that failed to open or size still count for the numbering */
    if (rc) *block = -1;
    close(fd);
    return rc;
}

/* The step the manifest must be for: the directory's name's (step_N), as auto-resume checks it;
 * for another name, state.json's (which the manifest covers, so both are verified). */
static int64_t expected_step(const char *step_dir) {
    int64_t step = ckpt_dir_step(step_dir);
    if (step >= 0) return step;
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/state.json", step_dir);
    ust_err ignored;
    char *text = fs_read_file(p, MANIFEST_MAX, NULL, &ignored);
    cJSON *st = text ? cJSON_Parse(text) : NULL;
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(st, "step");
    step = cJSON_IsNumber(n) ? (int64_t)n->valuedouble : -1;
    cJSON_Delete(st);
    free(text);
    return step;
}

int ckman_verify(const char *step_dir, int rank, int world, ust_err *e) {
    cJSON *j = load(step_dir, e);
    int rc = j ? 0 : -1;
    if (!rc) rc = manifest_files(j, step_dir, expected_step(step_dir), e);
    unsigned char *buf = rc ? NULL : malloc((size_t)CKMAN_BLOCK);
    if (!rc && !buf) rc = ust_errf(e, "checkpoint: out of memory verifying %s", step_dir);
    int64_t block = 0;
    const cJSON *o;
    if (!rc) cJSON_ArrayForEach(o, cJSON_GetObjectItemCaseSensitive(j, "files")) {
            if (rc) break;
            rc = verify_file(step_dir, o, &block, rank, world, buf, e);
        }
    free(buf);
    cJSON_Delete(j);
    return rc;
}
