/* ckpt_safetensors: the safetensors reader. The header is untrusted: every length, offset and
 * type is checked before it is used, and a tensor can only be reached through an entry that
 * lies inside the file. */
#include "ckpt_internal.h"
#include "fs.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER 100000000 /* the safetensors reference limit */

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
        if (!ckpt_json_uint(x, &en->shape[d]))
            return ust_errf(e, "%s: tensor '%.200s' has a bad shape", path, nm);
        /* overflow-safe: numel * esize must stay within the data section */
        if (en->shape[d] != 0 && numel > data_len / en->shape[d])
            numel = data_len + 1;
        else
            numel *= en->shape[d];
        d++;
    }
    if (cJSON_GetArraySize(of) != 2 || !ckpt_json_uint(cJSON_GetArrayItem(of, 0), &en->begin) ||
        !ckpt_json_uint(cJSON_GetArrayItem(of, 1), &en->end) || en->begin > en->end)
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

const st_entry *st_find(const st_file *f, const char *name) {
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
