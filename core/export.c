/* export: checkpoint -> Hugging Face transformers layout (the mapping is core/hf_map.c's table).
 * The table is built from the config, every source is checked against the checkpoint, and only
 * then is anything written. */
#include "export.h"

#include "ckpt.h"
#include "config.h"
#include "fs.h"
#include "hf_map.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------
 * Checking the sources and making the tensors */

static int64_t numel(int ndim, const int64_t *shape) {
    return ndim == 2 ? shape[0] * shape[1] : shape[0];
}

static void shape_str(char *out, size_t n, int ndim, const int64_t *shape) {
    if (ndim == 2)
        snprintf(out, n, "[%lld, %lld]", (long long)shape[0], (long long)shape[1]);
    else
        snprintf(out, n, "[%lld]", (long long)shape[0]);
}

/* The checkpoint's fp32 data of s, after checking that it has the shape the config implies. */
static const float *source(const st_file *f, const char *path, const ckpt_tensor *s, ust_err *e) {
    int ndim = 0;
    int64_t shape[4] = {0};
    const float *p = st_tensor(f, s->name, &ndim, shape);
    if (!p) {
        for (int i = 0; i < st_count(f); i++)
            if (!strcmp(st_name(f, i), s->name)) {
                ust_errf(e, "%s: tensor '%s' is not fp32 (F32) data", path, s->name);
                return NULL;
            }
        ust_errf(e, "%s: tensor '%s' is missing (the checkpoint's config says the model has it)",
                 path, s->name);
        return NULL;
    }
    if (ndim != s->ndim || shape[0] != s->shape[0] || (ndim == 2 && shape[1] != s->shape[1])) {
        char have[64], want[64];
        shape_str(have, sizeof have, ndim > 2 ? 2 : ndim, shape);
        shape_str(want, sizeof want, s->ndim, s->shape);
        ust_errf(e, "%s: tensor '%s' has shape %s but the checkpoint's config implies %s", path,
                 s->name, ndim > 2 ? "(more than 2 dims)" : have, want);
        return NULL;
    }
    return p;
}

static int check_sources(const hf_table *l, const st_file *f, const char *path, ust_err *e) {
    for (int i = 0; i < l->n; i++)
        for (int j = 0; j < l->t[i].nsrc; j++)
            if (!source(f, path, &l->t[i].src[j], e)) return -1;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Writing */

static char *st_header(const hf_table *l, size_t *len) {
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    int64_t off = 0;
    for (int i = 0; i < l->n; i++) {
        const hf_tensor *x = &l->t[i];
        cJSON *o = cJSON_AddObjectToObject(root, x->name);
        cJSON_AddStringToObject(o, "dtype", "F32");
        cJSON *shape = cJSON_AddArrayToObject(o, "shape"),
              *offs = cJSON_AddArrayToObject(o, "data_offsets");
        for (int d = 0; d < x->ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)x->shape[d]));
        int64_t bytes = 4 * numel(x->ndim, x->shape);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + bytes)));
        off += bytes;
    }
    char *js = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!js) return NULL;
    /* padded with spaces so the data starts 8-byte aligned, as the safetensors writer does */
    size_t n = strlen(js), padded = (n + 7) / 8 * 8;
    char *h = malloc(8 + padded);
    if (h) {
        uint64_t le = padded; /* x86-64 and aarch64 Linux are little-endian */
        memcpy(h, &le, 8);
        memcpy(h + 8, js, n);
        memset(h + 8 + n, ' ', padded - n);
        *len = 8 + padded;
    }
    free(js);
    return h;
}

static int write_all(FILE *f, const void *p, size_t n, const char *path, ust_err *e) {
    if (fwrite(p, 1, n, f) != n)
        return ust_errf(e, "export: cannot write %s: %s", path, strerror(errno));
    return 0;
}

/* Closes f after flushing and fsyncing it, so a rename publishes complete data. */
static int close_synced(FILE *f, const char *path, int rc, ust_err *e) {
    if (!rc && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        rc = ust_errf(e, "export: cannot write %s: %s", path, strerror(errno));
    if (fclose(f) != 0 && !rc)
        rc = ust_errf(e, "export: cannot write %s: %s", path, strerror(errno));
    return rc;
}

static int write_safetensors(const hf_table *l, const st_file *src, const char *src_path,
                             const char *path, ust_err *e) {
    size_t hlen = 0, maxn = 1;
    char *hdr = st_header(l, &hlen);
    for (int i = 0; i < l->n; i++) {
        size_t n = (size_t)numel(l->t[i].ndim, l->t[i].shape);
        if (n > maxn) maxn = n;
    }
    float *buf = malloc(maxn * sizeof(float));
    ust_err inner;
    FILE *f = hdr && buf ? fs_fopen_regular(path, "wb", &inner) : NULL;
    int rc = 0;
    if (!hdr || !buf)
        rc = ust_errf(e, "export: out of memory");
    else if (!f)
        rc = ust_errf(e, "export: %s", inner.msg);
    if (!rc) rc = write_all(f, hdr, hlen, path, e);
    for (int i = 0; i < l->n && !rc; i++) {
        const hf_tensor *x = &l->t[i];
        const float *s[3] = {NULL, NULL, NULL};
        for (int j = 0; j < x->nsrc && !rc; j++)
            if (!(s[j] = source(src, src_path, &x->src[j], e))) rc = -1;
        if (rc) break;
        hf_make(l->c, x, s, buf);
        rc = write_all(f, buf, (size_t)numel(x->ndim, x->shape) * sizeof(float), path, e);
    }
    if (f) rc = close_synced(f, path, rc, e);
    free(hdr);
    free(buf);
    return rc;
}

static int write_config(const ust_config *c, const char *path, ust_err *e) {
    /* The checkpoint does not know its tokenizer; only GPT-2's vocabulary has a known
     * end-of-text id (50256). Otherwise null, rather than the config classes' defaults, which may
     * not even be inside a small vocabulary. */
    int eot = c->model.arch == ARCH_GPT2 && c->model.vocab_size >= 50257 ? 50256 : -1;
    cJSON *j = hf_config_json(c, eot, eot);
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    if (!s) return ust_errf(e, "export: out of memory");
    ust_err inner;
    FILE *f = fs_fopen_regular(path, "wb", &inner);
    int rc = f ? write_all(f, s, strlen(s), path, e) : ust_errf(e, "export: %s", inner.msg);
    if (!rc) rc = write_all(f, "\n", 1, path, e);
    if (f) rc = close_synced(f, path, rc, e);
    free(s);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * The checkpoint side */

/* Refuses an OUT that exists but is not a directory before anything is written. */
static int prepare_out(const char *out, ust_err *e) {
    struct stat st;
    if (stat(out, &st) == 0 && !S_ISDIR(st.st_mode))
        return ust_errf(e, "export: output %s exists and is not a directory", out);
    return fs_mkdir_p(out, e);
}

int export_hf(const char *ckpt, const char *out_dir, ust_err *e) {
    char step[PATH_MAX], src[PATH_MAX + 32], tmp_st[PATH_MAX + 64], tmp_cfg[PATH_MAX + 64],
        fin_st[PATH_MAX + 64], fin_cfg[PATH_MAX + 64];
    ust_config c;
    if (ckpt_resolve_step(ckpt, "export", step, sizeof step, e) ||
        ckpt_load_config(step, "export", &c, e))
        return UST_EXIT_USAGE;
    hf_table l = {0};
    if (hf_table_build(&l, &c, e)) return UST_EXIT_USAGE;
    snprintf(src, sizeof src, "%s/model.safetensors", step);
    ust_err inner;
    st_file *f = st_open(src, &inner);
    int rc = 0;
    if (!f) rc = ust_errf(e, "export: %s", inner.msg);
    if (!rc) rc = check_sources(&l, f, src, e);
    if (!rc) rc = prepare_out(out_dir, e);
    if (rc) {
        st_close(f);
        hf_table_free(&l);
        return UST_EXIT_USAGE;
    }
    /* everything is checked: from here a failure is the output's, and leaves only temporaries,
     * which are removed */
    snprintf(tmp_st, sizeof tmp_st, "%s/.model.safetensors.tmp.%d", out_dir, (int)getpid());
    snprintf(tmp_cfg, sizeof tmp_cfg, "%s/.config.json.tmp.%d", out_dir, (int)getpid());
    snprintf(fin_st, sizeof fin_st, "%s/model.safetensors", out_dir);
    snprintf(fin_cfg, sizeof fin_cfg, "%s/config.json", out_dir);
    rc = write_safetensors(&l, f, src, tmp_st, e);
    if (!rc) rc = write_config(&c, tmp_cfg, e);
    if (!rc && (rename(tmp_st, fin_st) != 0 || rename(tmp_cfg, fin_cfg) != 0))
        rc = ust_errf(e, "export: cannot rename into %s: %s", out_dir, strerror(errno));
    if (rc) {
        unlink(tmp_st);
        unlink(tmp_cfg);
    }
    st_close(f);
    hf_table_free(&l);
    return rc ? UST_EXIT_RUNTIME : 0;
}
