/* export: checkpoint -> Hugging Face transformers layout (the mapping is core/io/hf_map.c's table,
 * the tokenizer files core/tools/hf_tok.c's). The table is built from the config, every source is
 * checked against the checkpoint (and, for fp16, every value against fp16's range), the tokenizer
 * the checkpoint records is checked, and only then is anything written: each output under a
 * temporary name, all renamed at the end. */
#include "progress.h"
#include "export.h"

#include "ckpt.h"
#include "config.h"
#include "fs.h"
#include "hf_map.h"
#include "hf_tok.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* transformers' default max_shard_size, "5GB" (powers of 1000, as its parser counts) */
#define EXPORT_DEFAULT_SHARD 5000000000LL

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

/* Exported tensor i of l into buf (fp32), from the checked sources. */
static void make_tensor(const hf_table *l, int i, const st_file *f, const char *path, float *buf) {
    const hf_tensor *x = &l->t[i];
    const float *s[3] = {NULL, NULL, NULL};
    ust_err e;
    for (int j = 0; j < x->nsrc; j++) {
        s[j] = source(f, path, &x->src[j], &e);
        UST_ASSERT(s[j], "checked source went missing: %s", e.msg);
    }
    hf_make(l->c, x, s, buf);
}

/* ---------------------------------------------------------------------------------------------
 * Output precision */

uint16_t export_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7FFFu + ((u >> 16) & 1); /* round to nearest, ties to the even upper half */
    return (uint16_t)(u >> 16);
}

uint16_t export_f16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return sign | 0x7E00;  /* NaN */
    if (a >= 0x477FF000u) return sign | 0x7C00; /* 65520 and up round to infinity */
    if (a >= 0x38800000u) /* normal in fp16 (2^-14 and up): rebias the exponent, round at bit 13 */
        return sign | (uint16_t)((a + 0x0FFFu + ((a >> 13) & 1) - 0x38000000u) >> 13);
    float f;
    memcpy(&f, &a, 4);
    return sign | (uint16_t)lrintf(f * 0x1p24f); /* subnormal: units of 2^-24, exact product */
}

static int dtype_size(export_dtype d) { return d == EXPORT_F32 ? 4 : 2; }

static const char *dtype_name(export_dtype d) {
    return d == EXPORT_F32 ? "F32" : d == EXPORT_BF16 ? "BF16" : "F16";
}

static const char *torch_dtype(export_dtype d) {
    return d == EXPORT_F32 ? "float32" : d == EXPORT_BF16 ? "bfloat16" : "float16";
}

/* The n values of x as d's bytes: x itself for fp32, else converted into half. */
static const void *convert(const float *x, int64_t n, export_dtype d, uint16_t *half) {
    if (d == EXPORT_F32) return x;
    for (int64_t i = 0; i < n; i++)
        half[i] = d == EXPORT_BF16 ? export_bf16(x[i]) : export_f16(x[i]);
    return half;
}

/* fp16 holds finite values up to 65504: a larger one would become infinity, so it is refused
 * with the tensor named before anything is written. */
static int check_f16_range(const hf_table *l, const st_file *f, const char *path, float *buf,
                           ust_err *e) {
    for (int i = 0; i < l->n; i++) {
        int64_t n = numel(l->t[i].ndim, l->t[i].shape);
        make_tensor(l, i, f, path, buf);
        for (int64_t k = 0; k < n; k++)
            if (isfinite(buf[k]) && (export_f16(buf[k]) & 0x7FFF) == 0x7C00)
                return ust_errf(e,
                                "export --dtype fp16: tensor '%s' holds %g (element %lld), beyond "
                                "float16's range of +-65504; export as bf16 or fp32",
                                l->t[i].name, buf[k], (long long)k);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Shards: transformers' rule, in hf_map's tensor order (not transformers' state_dict order: a
 * layer's norms stand elsewhere, so boundaries can differ; loaders go by the index). Tensors in
 * order fill a shard until the next would take it past the limit; a tensor larger than the
 * limit gets a shard of its own. */

typedef struct {
    int first, n;  /* tensors [first, first + n) of the table */
    int64_t bytes; /* of their data */
} shard;

static int plan_shards(const hf_table *l, export_dtype d, int64_t max, shard *sh) {
    int ns = 0;
    for (int i = 0; i < l->n; i++) {
        int64_t b = numel(l->t[i].ndim, l->t[i].shape) * dtype_size(d);
        if (ns == 0 || b > max || sh[ns - 1].bytes + b > max) sh[ns++] = (shard){i, 0, 0};
        sh[ns - 1].n++;
        sh[ns - 1].bytes += b;
    }
    return ns;
}

static void shard_name(char *out, size_t n, int k, int ns) {
    if (ns == 1)
        snprintf(out, n, "model.safetensors");
    else
        snprintf(out, n, "model-%05d-of-%05d.safetensors", k + 1, ns);
}

/* ---------------------------------------------------------------------------------------------
 * Writing */

static char *st_header(const hf_table *l, const shard *sh, export_dtype d, size_t *len) {
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    int64_t off = 0;
    for (int i = sh->first; i < sh->first + sh->n; i++) {
        const hf_tensor *x = &l->t[i];
        cJSON *o = cJSON_AddObjectToObject(root, x->name);
        cJSON_AddStringToObject(o, "dtype", dtype_name(d));
        cJSON *shape = cJSON_AddArrayToObject(o, "shape"),
              *offs = cJSON_AddArrayToObject(o, "data_offsets");
        for (int k = 0; k < x->ndim; k++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)x->shape[k]));
        int64_t bytes = dtype_size(d) * numel(x->ndim, x->shape);
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

static int write_shard(const hf_table *l, const shard *sh, export_dtype d, const st_file *src,
                       const char *src_path, float *buf, uint16_t *half, const char *path,
                       progress *pr, ust_err *e) {
    size_t hlen = 0;
    char *hdr = st_header(l, sh, d, &hlen);
    ust_err inner;
    FILE *f = hdr ? fs_fopen_regular(path, "wb", &inner) : NULL;
    int rc = 0;
    if (!hdr)
        rc = ust_errf(e, "export: out of memory");
    else if (!f)
        rc = ust_errf(e, "export: %s", inner.msg);
    if (!rc) rc = write_all(f, hdr, hlen, path, e);
    for (int i = sh->first; i < sh->first + sh->n && !rc; i++) {
        int64_t n = numel(l->t[i].ndim, l->t[i].shape);
        make_tensor(l, i, src, src_path, buf);
        rc = write_all(f, convert(buf, n, d, half), (size_t)n * dtype_size(d), path, e);
        progress_add(pr, (double)n * dtype_size(d));
    }
    if (f) rc = close_synced(f, path, rc, e);
    free(hdr);
    return rc;
}

/* j as indented JSON (j is freed). */
static int write_json(cJSON *j, const char *path, ust_err *e) {
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

/* model.safetensors.index.json: every tensor's shard, and the data bytes of all of them. */
static cJSON *shard_index(const hf_table *l, const shard *sh, int ns) {
    cJSON *j = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(j, "metadata"),
          *map = cJSON_AddObjectToObject(j, "weight_map");
    int64_t total = 0;
    for (int k = 0; k < ns; k++) {
        char name[64];
        shard_name(name, sizeof name, k, ns);
        total += sh[k].bytes;
        for (int i = sh[k].first; i < sh[k].first + sh[k].n; i++)
            cJSON_AddStringToObject(map, l->t[i].name, name);
    }
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    return j;
}

/* config.json, with the end-of-text id as bos/eos when the checkpoint knows its tokenizer. */
static cJSON *model_config(const ust_config *c, const hftok_info *t, export_dtype d) {
    /* Without a recorded tokenizer only GPT-2's vocabulary has a known end-of-text id (50256);
     * otherwise null rather than the config classes' defaults, which may not even be inside a
     * small vocabulary. */
    int eot = t->present                                                   ? t->eot
              : c->model.arch == ARCH_GPT2 && c->model.vocab_size >= 50257 ? 50256
                                                                           : -1;
    cJSON *j = hf_config_json(c, eot, eot);
    cJSON_ReplaceItemInObjectCaseSensitive(j, "torch_dtype", cJSON_CreateString(torch_dtype(d)));
    return j;
}

/* ---------------------------------------------------------------------------------------------
 * The output files: written under temporary names, then published together. */

typedef struct {
    char tmp[PATH_MAX + 96], fin[PATH_MAX + 96];
} out_file;

typedef struct {
    const char *dir;
    out_file *f;
    int n;
} out_set;

static const char *out_add(out_set *o, const char *name) {
    out_file *f = &o->f[o->n++];
    snprintf(f->tmp, sizeof f->tmp, "%s/.%s.tmp.%d", o->dir, name, (int)getpid());
    snprintf(f->fin, sizeof f->fin, "%s/%s", o->dir, name);
    return f->tmp;
}

static int out_publish(const out_set *o, ust_err *e) {
    for (int i = 0; i < o->n; i++)
        if (rename(o->f[i].tmp, o->f[i].fin) != 0)
            return ust_errf(e, "export: cannot rename %s to %s: %s", o->f[i].tmp, o->f[i].fin,
                            strerror(errno));
    return 0;
}

static void out_discard(const out_set *o) {
    for (int i = 0; i < o->n; i++) unlink(o->f[i].tmp);
}

/* Weights an earlier export left in OUT that transformers would read beside (or instead of)
 * this one's: model.safetensors after a sharded export, the index and other shards after one
 * of another count. */
static void remove_stale_weights(const out_set *o) {
    char pat[PATH_MAX + 64];
    glob_t g;
    snprintf(pat, sizeof pat, "%s/model*.safetensors*", o->dir);
    if (glob(pat, 0, NULL, &g) != 0) return;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        const char *base = strrchr(g.gl_pathv[i], '/') + 1;
        int ours = 0;
        for (int k = 0; k < o->n; k++) ours |= strcmp(g.gl_pathv[i], o->f[k].fin) == 0;
        int weights = !strcmp(base, "model.safetensors") ||
                      !strcmp(base, "model.safetensors.index.json") ||
                      (!strncmp(base, "model-", 6) && strstr(base, "-of-") && strlen(base) > 12 &&
                       !strcmp(base + strlen(base) - 12, ".safetensors"));
        if (weights && !ours) unlink(g.gl_pathv[i]);
    }
    globfree(&g);
}

/* ---------------------------------------------------------------------------------------------
 * The checkpoint side */

/* The effective config (ckpt_load_config) and the tokenizer state.json records. */
static int load_state(ust_config *c, hftok_info *t, const char *step, bool no_tok, ust_err *e) {
    if (ckpt_load_config(step, "export", c, e)) return -1;
    ckpt_reader *r = ckpt_open(step, e);
    if (!r) return -1;
    cJSON *j = cJSON_Parse(ckpt_state_json(r));
    ckpt_close(r);
    int rc = hftok_from_state(t, j, step, c->model.vocab_size, no_tok, e);
    cJSON_Delete(j);
    return rc;
}

/* The checkpoint directory itself is not an output either (a step's files are never written
 * there, but HF files beside `latest` would be mistaken for one). */
static int refuse_checkpoint_root(const char *out, ust_err *e) {
    char p[PATH_MAX + 16], q[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/latest", out);
    snprintf(q, sizeof q, "%s/.lock", out);
    if (access(p, F_OK) == 0 || access(q, F_OK) == 0)
        return ust_errf(e,
                        "export: output %s is a ustrain checkpoint directory (it holds `latest` "
                        "or .lock): the Hugging Face files go into a directory of their own",
                        out);
    return 0;
}

/* Refuses an OUT that exists but is not a directory, or is part of a checkpoint, before
 * anything is written; makes it and takes its lock (flock on the directory, released however
 * the process ends), so two exports never mix their files in one OUT. */
static int prepare_out(const char *out, int *lock_fd, ust_err *e) {
    struct stat st;
    if (stat(out, &st) == 0 && !S_ISDIR(st.st_mode))
        return ust_errf(e, "export: output %s exists and is not a directory", out);
    if (ckpt_refuse_in_step(out, "export: output", e) || refuse_checkpoint_root(out, e) ||
        fs_mkdir_p(out, e))
        return -1;
    return fs_lock_dir(out, "export: output", lock_fd, e);
}

/* ---------------------------------------------------------------------------------------------
 * The export */

typedef struct {
    const export_opts *o;
    export_result *r;
    ust_config c;
    hftok_info tok;
    hf_table l;
    st_file *f;
    char src[PATH_MAX + 32];
    shard *sh;
    int ns;
    float *buf;     /* the largest tensor, fp32 */
    uint16_t *half; /* and as bf16 / fp16 */
    int out_lock;   /* OUT's flock, held to the end */
} job;

/* Everything that can be wrong with the input, found before OUT is touched. */
static int check_input(job *j, const char *ckpt, const char *out_dir, ust_err *e) {
    char *step = j->r->step;
    if (ckpt_resolve_step(ckpt, "export", step, sizeof j->r->step, e) ||
        load_state(&j->c, &j->tok, step, j->o->no_tokenizer, e) || hf_table_build(&j->l, &j->c, e))
        return -1;
    snprintf(j->src, sizeof j->src, "%s/model.safetensors", step);
    ust_err inner;
    if (!(j->f = st_open(j->src, &inner))) return ust_errf(e, "export: %s", inner.msg);
    ckpt_reader *r = ckpt_open(step, e);
    if (!r) return -1;
    int other = st_check_step(j->f, ckpt_state_json(r), step, "model.safetensors", &inner);
    ckpt_close(r);
    if (other) return ust_errf(e, "export: %s", inner.msg);
    if (check_sources(&j->l, j->f, j->src, e)) return -1;
    size_t maxn = 1;
    for (int i = 0; i < j->l.n; i++) {
        size_t n = (size_t)numel(j->l.t[i].ndim, j->l.t[i].shape);
        if (n > maxn) maxn = n;
    }
    j->buf = malloc(maxn * sizeof(float));
    j->half = j->o->dtype == EXPORT_F32 ? NULL : malloc(maxn * sizeof(uint16_t));
    j->sh = malloc((size_t)(j->l.n + 1) * sizeof *j->sh);
    if (!j->buf || !j->sh || (j->o->dtype != EXPORT_F32 && !j->half))
        return ust_errf(e, "export: out of memory");
    if (j->o->dtype == EXPORT_F16 && check_f16_range(&j->l, j->f, j->src, j->buf, e)) return -1;
    int64_t max = j->o->max_shard_bytes > 0 ? j->o->max_shard_bytes : EXPORT_DEFAULT_SHARD;
    j->ns = plan_shards(&j->l, j->o->dtype, max, j->sh);
    return prepare_out(out_dir, &j->out_lock, e);
}

static int write_outputs(job *j, out_set *os, export_result *r, ust_err *e) {
    int rc = 0;
    double all = 0;
    for (int k = 0; k < j->ns; k++) all += (double)j->sh[k].bytes;
    progress pr;
    progress_begin(&pr, "export: writing", all, true);
    for (int k = 0; k < j->ns && !rc; k++) {
        char name[64];
        shard_name(name, sizeof name, k, j->ns);
        rc = write_shard(&j->l, &j->sh[k], j->o->dtype, j->f, j->src, j->buf, j->half,
                         out_add(os, name), &pr, e);
        r->total_bytes += j->sh[k].bytes;
    }
    progress_end(&pr);
    if (!rc && j->ns > 1)
        rc = write_json(shard_index(&j->l, j->sh, j->ns),
                        out_add(os, "model.safetensors.index.json"), e);
    if (!rc)
        rc = write_json(model_config(&j->c, &j->tok, j->o->dtype), out_add(os, "config.json"), e);
    r->tokenizer = j->tok.present && !j->o->no_tokenizer;
    if (!rc && r->tokenizer) rc = hftok_write_tokenizer(&j->tok, out_add(os, "tokenizer.json"), e);
    if (!rc && r->tokenizer)
        rc = write_json(hftok_tokenizer_config(&j->tok, &j->c),
                        out_add(os, "tokenizer_config.json"), e);
    r->generation = j->tok.present;
    if (!rc && r->generation)
        rc = write_json(hftok_generation_config(&j->tok), out_add(os, "generation_config.json"), e);
    r->nshards = j->ns;
    return rc;
}

int export_hf(const char *ckpt, const char *out_dir, const export_opts *o, export_result *r,
              ust_err *e) {
    export_opts defaults = {0};
    export_result dummy;
    if (!r) r = &dummy;
    memset(r, 0, sizeof *r);
    job j = {.o = o ? o : &defaults, .r = r, .out_lock = -1};
    int rc = check_input(&j, ckpt, out_dir, e) ? UST_EXIT_USAGE : 0;
    out_set os = {out_dir, NULL, 0};
    if (!rc && !(os.f = calloc((size_t)j.ns + 6, sizeof *os.f))) {
        ust_errf(e, "export: out of memory");
        rc = UST_EXIT_RUNTIME;
    }
    /* everything is checked: from here a failure is the output's, and leaves only temporaries,
     * which are removed */
    if (!rc && (write_outputs(&j, &os, r, e) || out_publish(&os, e))) rc = UST_EXIT_RUNTIME;
    if (rc == UST_EXIT_RUNTIME) out_discard(&os);
    if (!rc) remove_stale_weights(&os);
    free(os.f);
    free(j.buf);
    free(j.half);
    free(j.sh);
    st_close(j.f);
    hf_table_free(&j.l);
    if (j.out_lock >= 0) close(j.out_lock);
    return rc;
}
