/* hf_import: Hugging Face model directories as starting weights (hf_import.h).
 *
 * Nothing here knows a tensor name: config.json becomes a ustrain model config (hf_config), hf_map
 * builds the table of the transformers tensors that config implies, and the files must hold exactly
 * those. Reading is the table backwards: ustrain tensor t is source j of one table row, and each
 * element of t's box is found in the row's file tensor by the row's transform (copy; vocabulary
 * rows past vocab_size read as zero; Conv1D's [in, out] transposed back; GPT-2's c_attn column j*HD
 * + r). Every file is mmap'd (ckpt's st_open validates its header and guards the mapping against
 * SIGBUS), so a rank touches only the pages of its own slices. Safetensors data is little-endian,
 * as is every host ustrain runs on. */
#include "hf_import.h"
#include "fs.h"
#include "hf_config.h"
#include "hf_map.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define HF_MAX_SHARDS 4096
#define HF_MAX_JSON (64 << 20) /* config.json or the index: far above any real one */

typedef struct {
    const char *name; /* ustrain tensor (a table row's source) */
    int row, src;
} hf_src_ref;

struct hf_model {
    char dir[PATH_MAX];
    char arch[64];  /* architectures[0] of config.json */
    ust_config cfg; /* defaults with config.json's model section */
    hf_table table;
    st_file **shards;
    int nshards;
    int *shard_of;    /* per table row */
    int *name_off;    /* per table row: 0, or the base prefix's length when the file lacks it */
    hf_src_ref *refs; /* every row's sources, sorted by name (hf_tensor.dup rows left out) */
    int nrefs;
    int *dups, ndups; /* the hf_tensor.dup rows */
    int64_t bytes_read, tensor_bytes;
    int allow_nonfinite; /* hf_allow_nonfinite */
    /* FP8 checkpoints (DeepSeek-V3's release): config.json's quantization_config, fp8 with
     * weight_block_size [b0, b1]; each F8_E4M3 weight W has W_scale_inv, one fp32 scale per
     * b0 x b1 block, in shard scale_shard[row] (-1: the row is not F8) */
    int fp8, block[2];
    int *scale_shard;
};

/* ------------------------------------------------------------------ files */

static int is_regular(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Any entry named config.json counts (a FIFO, a directory, a link to /dev/zero): hf_open then
 * says what it is, where taking the directory for a checkpoint would only find no state.json. */
int hf_is_model_dir(const char *path) {
    struct stat st;
    char p[PATH_MAX];
    if (!path || !path[0] || stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return 0;
    if (snprintf(p, sizeof p, "%s/config.json", path) >= (int)sizeof p) return 0;
    return lstat(p, &st) == 0;
}

/* The first key that appears twice in object j, or NULL: Python's json (and so transformers)
 * keeps the last value where cJSON finds the first, so a repeat is refused. */
static int cmp_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static const char *repeated_key(const cJSON *j) {
    int n = cJSON_GetArraySize(j), k = 0;
    const char **names = malloc((size_t)(n + 1) * sizeof *names);
    UST_ASSERT(names, "out of host memory");
    for (const cJSON *a = j->child; a; a = a->next)
        if (a->string) names[k++] = a->string;
    qsort(names, (size_t)k, sizeof *names, cmp_name); /* sorted: a repeat is a neighbour */
    const char *twice = NULL;
    for (int i = 1; i < k && !twice; i++)
        if (!strcmp(names[i - 1], names[i])) twice = names[i];
    free(names);
    return twice;
}

/* The JSON document at dir/name, or NULL with a message naming the file. */
static cJSON *read_json(const char *dir, const char *name, ust_err *e) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s/%s", dir, name) >= (int)sizeof p) {
        ust_errf(e, "%s/%s: path too long", dir, name);
        return NULL;
    }
    ust_err inner;
    FILE *f = fs_fopen_regular(p, "rb", &inner);
    if (!f) {
        ust_errf(e, "Hugging Face model %s", inner.msg);
        return NULL;
    }
    struct stat st;
    int64_t size = fstat(fileno(f), &st) == 0 ? (int64_t)st.st_size : -1;
    char *buf = size >= 0 && size <= HF_MAX_JSON ? malloc((size_t)size + 1) : NULL;
    size_t n = buf ? fread(buf, 1, (size_t)size + 1, f) : 0;
    int bad = !buf || ferror(f) || (int64_t)n != size; /* a file that grew while read too */
    fclose(f);
    if (!bad && hf_json_refuse_nul(buf, n, p, e)) {
        free(buf);
        return NULL;
    }
    cJSON *j = bad ? NULL : cJSON_ParseWithLength(buf, n);
    free(buf);
    if (bad)
        ust_errf(e, "%s: unreadable or larger than %d bytes", p, HF_MAX_JSON);
    else if (!cJSON_IsObject(j))
        ust_errf(e, "%s: not a JSON object", p);
    else if (repeated_key(j))
        ust_errf(e,
                 "%s: key '%s' appears twice (transformers reads the last, ustrain would read "
                 "the first)",
                 p, repeated_key(j));
    if (!bad && (!cJSON_IsObject(j) || repeated_key(j))) {
        cJSON_Delete(j);
        j = NULL;
    }
    return j;
}

/* quantization_config: absent, or DeepSeek-V3's {quant_method: fp8, fmt: e4m3,
 * weight_block_size: [b0, b1] (default [128, 128])}; activation_scheme is how inference would
 * quantize activations, nothing a dequantizing import uses. Anything else is refused by name. */
static int parse_quantization(hf_model *h, const cJSON *j, const char *path, ust_err *e) {
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(j, "quantization_config");
    if (!q || cJSON_IsNull(q)) return 0;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(q, "quant_method"),
                *f = cJSON_GetObjectItemCaseSensitive(q, "fmt"),
                *b = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
    if (!cJSON_IsObject(q) || !cJSON_IsString(m) || strcmp(m->valuestring, "fp8") ||
        (f && (!cJSON_IsString(f) || strcmp(f->valuestring, "e4m3"))))
        return ust_errf(e,
                        "%s: quantization_config: ustrain dequantizes DeepSeek-V3's block-scaled "
                        "FP8 (quant_method 'fp8', fmt 'e4m3') on import; this one says "
                        "quant_method %.40s, fmt %.40s",
                        path, cJSON_IsString(m) ? m->valuestring : "(none)",
                        cJSON_IsString(f) ? f->valuestring : "(none)");
    h->fp8 = 1;
    h->block[0] = h->block[1] = 128;
    for (int i = 0; b && i < 2; i++) {
        const cJSON *v =
            cJSON_IsArray(b) && cJSON_GetArraySize(b) == 2 ? cJSON_GetArrayItem(b, i) : NULL;
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 ||
            v->valuedouble > 1 << 20)
            return ust_errf(e,
                            "%s: quantization_config.weight_block_size is not two block sizes "
                            "[rows, cols] in 1..%d (DeepSeek-V3: [128, 128])",
                            path, 1 << 20);
        h->block[i] = (int)v->valuedouble;
    }
    return 0;
}

static int load_config(hf_model *h, ust_err *e) {
    cJSON *j = read_json(h->dir, "config.json", e);
    if (!j) return -1;
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/config.json", h->dir);
    int rc = hf_config_parse(j, path, &h->cfg, h->arch, sizeof h->arch, e);
    if (!rc) rc = parse_quantization(h, j, path, e);
    cJSON_Delete(j);
    return rc;
}

/* ------------------------------------------------------------------ the safetensors files */

static int add_shard(hf_model *h, const char *file, ust_err *e) {
    for (int i = 0; i < h->nshards; i++)
        if (!strcmp(strrchr(st_path(h->shards[i]), '/') + 1, file)) return i;
    if (h->nshards == HF_MAX_SHARDS)
        return ust_errf(e, "%s: more than %d shards", h->dir, HF_MAX_SHARDS), -1;
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s/%s", h->dir, file) >= (int)sizeof p)
        return ust_errf(e, "%s/%s: path too long", h->dir, file), -1;
    ust_err inner;
    st_file *f = st_open(p, &inner);
    if (!f) return ust_errf(e, "Hugging Face model %s: %s", h->dir, inner.msg), -1;
    h->shards[h->nshards] = f;
    return h->nshards++;
}

/* A shard named by the index: a plain file name inside the directory. */
static int check_shard_name(const hf_model *h, const char *tensor, const cJSON *v, ust_err *e) {
    if (!cJSON_IsString(v) || !v->valuestring[0] || strchr(v->valuestring, '/') ||
        !strcmp(v->valuestring, "..") || strlen(v->valuestring) > 255)
        return ust_errf(e,
                        "%s/model.safetensors.index.json: tensor '%.200s' names shard %.80s, which "
                        "is not a file name in the model directory",
                        h->dir, tensor, cJSON_IsString(v) ? v->valuestring : "(not a string)");
    return 0;
}

/* Opens every shard the index names (shard_of is then filled by open_files). */
static int open_index(hf_model *h, cJSON **map, ust_err *e) {
    cJSON *j = read_json(h->dir, "model.safetensors.index.json", e);
    if (!j) return -1;
    cJSON *wm = cJSON_DetachItemFromObjectCaseSensitive(j, "weight_map");
    cJSON_Delete(j);
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(wm);
        return ust_errf(e, "%s/model.safetensors.index.json: no 'weight_map' object", h->dir);
    }
    *map = wm;
    const cJSON *v;
    cJSON_ArrayForEach(v, wm) {
        if (check_shard_name(h, v->string, v, e)) return -1;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", h->dir, v->valuestring);
        if (!is_regular(p))
            return ust_errf(e,
                            "%s/model.safetensors.index.json names shard '%.200s' (for tensor "
                            "'%.200s'), but %s is missing or not a regular file",
                            h->dir, v->valuestring, v->string, p);
        if (add_shard(h, v->valuestring, e) < 0) return -1;
    }
    return 0;
}

/* transformers saves a CausalLM's tensors under its base model's prefix, but loads files saved
 * without it too (openai-community/gpt2's own model.safetensors has "h.0.attn.c_attn.weight"). */
static const char *base_prefix(const hf_model *h) {
    return h->cfg.model.arch == ARCH_GPT2 ? "transformer." : "model.";
}

static bool in_files(const hf_model *h, const char *name, const cJSON *map) {
    st_view w;
    return map ? cJSON_GetObjectItemCaseSensitive(map, name) != NULL
               : st_raw(h->shards[0], name, &w) == 0;
}

/* The name row x has in the files: its own, or without the base prefix when only that is there. */
static const char *name_in_files(const hf_model *h, const hf_tensor *x, const cJSON *map) {
    size_t k = strlen(base_prefix(h));
    if (!in_files(h, x->name, map) && !strncmp(x->name, base_prefix(h), k) &&
        in_files(h, x->name + k, map))
        return x->name + k;
    return x->name;
}

/* The scale tensor's name of F8 weight `name` (…weight -> …weight_scale_inv). */
static void scale_name(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s_scale_inv", name);
}

/* Row r's file tensor w (name in the files) is F8_E4M3: config.json declares the block scaling,
 * the tensor is a matrix, and its scale tensor is there (in the shard the index names), fp32, one
 * finite value per block: [ceil(rows / b0), ceil(cols / b1)]. */
static int find_scale(hf_model *h, int r, const char *name, const st_view *w, const cJSON *map,
                      ust_err *e) {
    char sn[CKPT_NAME_MAX + 16];
    scale_name(name, sn, sizeof sn);
    if (!h->fp8 || w->ndim != 2)
        return ust_errf(e,
                        "%s: tensor '%s' is F8_E4M3 but %s (ustrain dequantizes DeepSeek-V3's FP8 "
                        "matrices, one fp32 scale per block, quantization_config fp8)",
                        h->dir, name,
                        !h->fp8 ? "config.json has no quantization_config" : "not a matrix");
    const cJSON *v = map ? cJSON_GetObjectItemCaseSensitive(map, sn) : NULL;
    int s = map ? (v ? add_shard(h, v->valuestring, e) : -2) : 0;
    if (s == -1) return -1;
    st_view sv;
    if (s < 0 || st_raw(h->shards[s], sn, &sv))
        return ust_errf(e, "%s: tensor '%s' (the block scales of F8_E4M3 tensor '%s') is missing",
                        s < 0 ? h->dir : st_path(h->shards[s]), sn, name);
    const char *file = st_path(h->shards[s]);
    int64_t want[2] = {(w->shape[0] + h->block[0] - 1) / h->block[0],
                       (w->shape[1] + h->block[1] - 1) / h->block[1]};
    if (strcmp(sv.dtype, "F32") || sv.ndim != 2 || sv.shape[0] != want[0] ||
        sv.shape[1] != want[1]) {
        char have[128];
        ckpt_format_shape(have, sizeof have, sv.ndim, sv.shape);
        return ust_errf(e,
                        "%s: tensor '%s' is %s %s, but the scales of a [%lld, %lld] weight in "
                        "blocks of [%d, %d] (quantization_config.weight_block_size) are F32 "
                        "[%lld, %lld]",
                        file, sn, sv.dtype, have, (long long)w->shape[0], (long long)w->shape[1],
                        h->block[0], h->block[1], (long long)want[0], (long long)want[1]);
    }
    for (int64_t i = 0; i < want[0] * want[1]; i++) {
        float f;
        memcpy(&f, sv.data + 4 * i, 4);
        if (!isfinite(f))
            return ust_errf(e,
                            "%s: tensor '%s' holds a non-finite scale (%g, block %lld of %lld): "
                            "its weight '%s' would dequantize to NaN or Inf",
                            file, sn, f, (long long)i, (long long)(want[0] * want[1]), name);
    }
    h->scale_shard[r] = s;
    h->tensor_bytes += want[0] * want[1] * 4;
    return 0;
}

/* Table row r: in the shard the index names (or the single file), in a dtype ustrain reads,
 * with the shape config.json implies. */
static int find_row(hf_model *h, int r, const cJSON *map, ust_err *e) {
    const hf_tensor *x = &h->table.t[r];
    const char *name = name_in_files(h, x, map);
    h->name_off[r] = (int)(name - x->name);
    const cJSON *v = map ? cJSON_GetObjectItemCaseSensitive(map, name) : NULL;
    if (map && !v)
        return ust_errf(e,
                        "%s/model.safetensors.index.json: tensor '%s' (which %s needs) is missing",
                        h->dir, x->name, h->arch);
    int s = map ? add_shard(h, v->valuestring, e) : 0;
    if (s < 0) return -1;
    st_view w;
    const char *file = st_path(h->shards[s]);
    if (st_raw(h->shards[s], name, &w))
        return ust_errf(e, "%s: tensor '%s' (which %s needs) is missing", file, x->name, h->arch);
    h->scale_shard[r] = -1;
    if (!strcmp(w.dtype, "F8_E4M3")) {
        if (find_scale(h, r, name, &w, map, e)) return -1;
    } else if (strcmp(w.dtype, "F32") && strcmp(w.dtype, "BF16") && strcmp(w.dtype, "F16")) {
        return ust_errf(e,
                        "%s: tensor '%s' has dtype %s (ustrain imports F32, BF16, F16 and "
                        "block-scaled F8_E4M3)",
                        file, x->name, w.dtype);
    }
    bool same = w.ndim == x->ndim;
    for (int d = 0; same && d < x->ndim; d++) same = w.shape[d] == x->shape[d];
    if (!same) {
        char have[128], want[128];
        ckpt_format_shape(have, sizeof have, w.ndim, w.shape);
        ckpt_format_shape(want, sizeof want, x->ndim, x->shape);
        return ust_errf(e, "%s: tensor '%s' has shape %s but %s/config.json implies %s", file,
                        x->name, have, h->dir, want);
    }
    h->shard_of[r] = s;
    h->tensor_bytes += (w.ndim == 2 ? w.shape[0] * w.shape[1] : w.shape[0]) * w.esize;
    return 0;
}

/* Buffers some transformers versions saved beside the weights; they hold no parameters. */
static bool is_buffer(const char *name) {
    size_t n = strlen(name);
    static const char *const tails[] = {".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq"};
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        size_t k = strlen(tails[i]);
        if (n >= k && !strcmp(name + n - k, tails[i])) return true;
    }
    return false;
}

static int cmp_row_name(const void *a, const void *b, void *ctx) {
    const hf_table *t = ctx;
    return strcmp(t->t[*(const int *)a].name, t->t[*(const int *)b].name);
}

/* The table row named name, or -1. */
static int table_row(const hf_model *h, const int *order, const char *name) {
    int lo = 0, hi = h->table.n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(name, h->table.t[order[mid]].name);
        if (!c) return order[mid];
        if (c < 0) hi = mid - 1;
        if (c > 0) lo = mid + 1;
    }
    return -1;
}

static bool in_table(const hf_model *h, const int *order, const char *name) {
    char full[CKPT_NAME_MAX + 16];
    snprintf(full, sizeof full, "%s%.*s", base_prefix(h), CKPT_NAME_MAX, name);
    return table_row(h, order, name) >= 0 || table_row(h, order, full) >= 0;
}

/* A name the files may hold: a table row's, a saved buffer, or the block scales of an F8 row. */
static bool used(const hf_model *h, const int *order, const char *name) {
    size_t n = strlen(name), k = strlen("_scale_inv");
    if (in_table(h, order, name) || is_buffer(name)) return true;
    if (n <= k || n - k >= CKPT_NAME_MAX || strcmp(name + n - k, "_scale_inv")) return false;
    char base[CKPT_NAME_MAX], full[CKPT_NAME_MAX + 16];
    snprintf(base, sizeof base, "%.*s", (int)(n - k), name);
    snprintf(full, sizeof full, "%s%s", base_prefix(h), base);
    int r = table_row(h, order, base);
    if (r < 0) r = table_row(h, order, full);
    return r >= 0 && h->scale_shard[r] >= 0;
}

/* Every entry of the index names a tensor its shard holds and the table uses: an entry for a
 * tensor no shard has (model.layers.7.* of a 2-layer model) says the index and files disagree. */
static int check_index(const hf_model *h, const int *order, const cJSON *map, ust_err *e) {
    const cJSON *v;
    cJSON_ArrayForEach(v, map) {
        int s = 0;
        while (s < h->nshards && strcmp(strrchr(st_path(h->shards[s]), '/') + 1, v->valuestring))
            s++;
        st_view w;
        if (s == h->nshards || st_raw(h->shards[s], v->string, &w))
            return ust_errf(e,
                            "%s/model.safetensors.index.json: tensor '%.200s' is listed in shard "
                            "'%.200s', which does not hold it",
                            h->dir, v->string, v->valuestring);
        if (!used(h, order, v->string))
            return ust_errf(e,
                            "%s/model.safetensors.index.json: tensor '%.200s' is not part of a %s "
                            "with this config.json",
                            h->dir, v->string, h->arch);
    }
    return 0;
}

/* Every tensor of the files (and of the index, map: NULL for one file) is one the table uses: a
 * tensor the config does not account for (an lm_head beside tie_word_embeddings, a bias the
 * architecture lacks) means the config and the weights disagree. */
static int check_no_extra(hf_model *h, const cJSON *map, ust_err *e) {
    int n = h->table.n, *order = malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!order) return ust_errf(e, "%s: out of memory", h->dir);
    for (int i = 0; i < n; i++) order[i] = i;
    qsort_r(order, (size_t)n, sizeof(int), cmp_row_name, &h->table);
    int rc = 0;
    for (int s = 0; s < h->nshards && !rc; s++)
        for (int i = 0; i < st_count(h->shards[s]) && !rc; i++) {
            const char *name = st_name(h->shards[s], i);
            if (!used(h, order, name))
                rc = ust_errf(e,
                              "%s: tensor '%.200s' is not part of a %s with this config.json "
                              "(check tie_word_embeddings and the biases it implies)",
                              st_path(h->shards[s]), name, h->arch);
        }
    if (!rc && map) rc = check_index(h, order, map, e);
    free(order);
    return rc;
}

static int cmp_ref(const void *a, const void *b) {
    return strcmp(((const hf_src_ref *)a)->name, ((const hf_src_ref *)b)->name);
}

/* ustrain name -> (row, source), for hf_read_slice. */
static int index_sources(hf_model *h, ust_err *e) {
    h->refs = calloc((size_t)h->table.n * 3 + 1, sizeof *h->refs);
    h->dups = calloc((size_t)h->table.n + 1, sizeof *h->dups);
    if (!h->refs || !h->dups) return ust_errf(e, "%s: out of memory", h->dir);
    for (int r = 0; r < h->table.n; r++) {
        if (h->table.t[r].dup) {
            h->dups[h->ndups++] = r;
            continue;
        }
        for (int j = 0; j < h->table.t[r].nsrc; j++)
            h->refs[h->nrefs++] = (hf_src_ref){h->table.t[r].src[j].name, r, j};
    }
    qsort(h->refs, (size_t)h->nrefs, sizeof *h->refs, cmp_ref);
    return 0;
}

/* The single file, or every shard the index names (map: its weight_map, NULL for one file). */
static int open_shards(hf_model *h, cJSON **map, ust_err *e) {
    char p[PATH_MAX];
    h->shards = calloc(HF_MAX_SHARDS, sizeof *h->shards);
    if (!h->shards) return ust_errf(e, "%s: out of memory", h->dir);
    snprintf(p, sizeof p, "%s/model.safetensors", h->dir);
    if (is_regular(p)) return add_shard(h, "model.safetensors", e) < 0 ? -1 : 0;
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", h->dir);
    if (!is_regular(p))
        return ust_errf(e,
                        "%s: no model.safetensors or model.safetensors.index.json (ustrain reads "
                        "the safetensors format)",
                        h->dir);
    return open_index(h, map, e);
}

/* The files hold about the tensors config.json implies: checked before the table is made, so a
 * config.json with thousands of layers and experts costs nothing unless the files back it. A few
 * missing (up to as many again as the files hold) are left to find_row, which names them
 * (lm_head.weight of an untied model). */
static int check_count(const hf_model *h, ust_err *e) {
    int64_t have = 0, want = hf_table_count(&h->cfg);
    for (int i = 0; i < h->nshards; i++) have += st_count(h->shards[i]);
    if (want > 2 * have + 8)
        return ust_errf(e,
                        "%s/config.json implies %lld tensors (a %s of %d layers), but the "
                        "safetensors files hold %lld",
                        h->dir, (long long)want, h->arch, h->cfg.model.n_layer, (long long)have);
    return 0;
}

static int open_files(hf_model *h, ust_err *e) {
    cJSON *map = NULL;
    int rc = open_shards(h, &map, e);
    if (!rc) rc = check_count(h, e);
    if (!rc) rc = hf_table_build(&h->table, &h->cfg, e);
    if (!rc && (!(h->shard_of = calloc((size_t)h->table.n + 1, sizeof *h->shard_of)) ||
                !(h->name_off = calloc((size_t)h->table.n + 1, sizeof *h->name_off)) ||
                !(h->scale_shard = calloc((size_t)h->table.n + 1, sizeof *h->scale_shard))))
        rc = ust_errf(e, "%s: out of memory", h->dir);
    for (int r = 0; r < h->table.n && !rc; r++) rc = find_row(h, r, map, e);
    if (!rc) rc = check_no_extra(h, map, e);
    cJSON_Delete(map);
    if (!rc) rc = index_sources(h, e);
    return rc ? -1 : 0;
}

hf_model *hf_open(const char *dir, ust_err *e) {
    if (!hf_is_model_dir(dir)) {
        ust_errf(e, "model.init_from %s: not a Hugging Face model directory (no %s/config.json)",
                 dir, dir);
        return NULL;
    }
    hf_model *h = calloc(1, sizeof *h);
    if (!h) {
        ust_errf(e, "%s: out of memory", dir);
        return NULL;
    }
    int rc = snprintf(h->dir, sizeof h->dir, "%s", dir) >= (int)sizeof h->dir
                 ? ust_errf(e, "%s: path too long", dir)
                 : 0;
    if (!rc) rc = load_config(h, e);
    if (!rc) rc = open_files(h, e);
    if (rc) {
        hf_close(h);
        return NULL;
    }
    return h;
}

void hf_close(hf_model *h) {
    if (!h) return;
    for (int i = 0; i < h->nshards; i++) st_close(h->shards[i]);
    free(h->shards);
    free(h->shard_of);
    free(h->name_off);
    free(h->scale_shard);
    free(h->refs);
    free(h->dups);
    hf_table_free(&h->table);
    free(h);
}

int64_t hf_bytes_read(const hf_model *h) { return h->bytes_read; }
int64_t hf_tensor_bytes(const hf_model *h) { return h->tensor_bytes; }

int hf_apply_config(const hf_model *h, ust_config *c, ust_err *e) {
    return hf_config_apply(&h->cfg, h->dir, c, e);
}

int hf_resolve_config(ust_config *c, ust_err *e) {
    struct stat st; /* any directory is meant as one (hf_open says what it lacks) */
    if (!c->model.init_from[0] || stat(c->model.init_from, &st) != 0 || !S_ISDIR(st.st_mode))
        return 0;
    hf_model *h = hf_open(c->model.init_from, e);
    if (!h) return -1;
    int rc = hf_apply_config(h, c, e);
    hf_close(h);
    return rc;
}

/* ------------------------------------------------------------------ reading */

static float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* IEEE half -> float, exact (every half is a float), subnormals and NaN included. */
static float f16_to_f32(uint16_t x) {
    uint32_t sign = (uint32_t)(x >> 15) << 31, exp = (x >> 10) & 31, man = x & 1023u, u;
    if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (!man) {
        u = sign;
    } else { /* subnormal: man * 2^-24 */
        float f = ldexpf((float)man, -24);
        memcpy(&u, &f, sizeof u);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* n elements from p (of the view's dtype) into out as fp32. */
static void widen(const st_view *v, const unsigned char *p, int64_t n, float *out) {
    if (v->esize == 4) {
        memcpy(out, p, (size_t)n * 4);
        return;
    }
    int bf = !strcmp(v->dtype, "BF16");
    for (int64_t i = 0; i < n; i++) {
        uint16_t b;
        memcpy(&b, p + 2 * i, 2);
        out[i] = bf ? bf16_to_f32(b) : f16_to_f32(b);
    }
}

/* Where ustrain's element (r, col) of source j of row x lies in the file tensor (element index):
 * the inverse of hf_make for the transposing rows (copies are read as runs by read_run). */
static int64_t file_index(const hf_model *h, const hf_tensor *x, int j, int64_t r, int64_t col) {
    const ust_config *c = &h->cfg;
    if (x->op == HF_T) return col * x->shape[1] + r; /* the file is [cols, rows] of ours */
    if (x->op == HF_ROPE_Q || x->op == HF_ROPE_KV)
        return hf_rope_row(c, x->op, r) * x->shape[1] + col;
    UST_ASSERT(x->op == HF_QKV, "file_index of a copy (%s)", x->name);
    /* the first query head that reads key/value head r / D (hf_qkv_row's inverse) */
    int64_t D = cfg_head_dim(c), HD = c->model.n_head * D;
    int64_t G = c->model.n_head / c->model.n_kv_head;
    int64_t sr = x->ndim == 2 ? r : col;
    int64_t fr = j * HD + (j ? (sr / D) * G * D + sr % D : sr);
    return x->ndim == 2 ? col * x->shape[1] + fr : fr;
}

/* The requested tensor must be exactly the source the table expects (the vocabulary may be
 * padded to more rows than the file has). */
static int check_request(const hf_model *h, const hf_tensor *x, const ckpt_tensor *src,
                         const ckpt_tensor *t, ust_err *e) {
    bool ok = t->ndim == src->ndim && t->shape[t->ndim - 1] == src->shape[src->ndim - 1];
    if (ok && x->op == HF_ROWS) ok = t->shape[0] >= x->shape[0];
    if (ok && x->op != HF_ROWS) ok = t->shape[0] == src->shape[0];
    if (!ok) {
        char have[128], want[128];
        ckpt_format_shape(have, sizeof have, t->ndim, t->shape);
        ckpt_format_shape(want, sizeof want, src->ndim, src->shape);
        return ust_errf(e, "%s: the model's tensor '%s' is %s but %s/config.json implies %s",
                        h->dir, t->name, have, h->dir, want);
    }
    return 0;
}

typedef struct {
    hf_model *h;
    const hf_tensor *x;
    int src;
    int64_t cols; /* of the ustrain tensor */
    st_view v;
    float *out;
    st_view scale; /* F8_E4M3: the block scales (v.dtype), and e4m3's 256 values */
    float e4m3[256];
} read_ctx;

/* float8 e4m3fn: 4 exponent bits (bias 7), 3 mantissa bits, no infinities, S.1111.111 is NaN. */
static float e4m3_to_f32(unsigned b) {
    unsigned ex = (b >> 3) & 15, man = b & 7;
    float v = ex == 15 && man == 7 ? NAN
              : ex                 ? ldexpf((float)(8 + man), (int)ex - 10)
                                   : ldexpf((float)man, -9);
    return b & 128 ? -v : v;
}

/* n elements of the file tensor from element f on (row-major), as fp32: widened, or F8 times
 * the scale of each element's block. */
static void load(read_ctx *c, int64_t f, int64_t n, float *out) {
    const st_view *v = &c->v;
    if (strcmp(v->dtype, "F8_E4M3")) {
        widen(v, v->data + f * v->esize, n, out);
        return;
    }
    int64_t cols = v->shape[1], scols = c->scale.shape[1];
    for (int64_t i = 0; i < n; i++) {
        int64_t r = (f + i) / cols, col = (f + i) % cols;
        float s;
        memcpy(&s, c->scale.data + 4 * ((r / c->h->block[0]) * scols + col / c->h->block[1]), 4);
        out[i] = c->e4m3[v->data[f + i]] * s;
    }
}

/* n elements of ustrain's tensor from element elem on (row-major), into out + at: copies are
 * contiguous in the file too (one widen; the padded vocabulary rows past the file's read as
 * zeros), transposes go element by element. */
static int read_run(void *vc, int64_t elem, int64_t at, int64_t n, ust_err *e) {
    (void)e;
    read_ctx *c = vc;
    const st_view *v = &c->v;
    float *out = c->out + at;
    if (c->x->op == HF_COPY || c->x->op == HF_ROWS) {
        int64_t in_file = c->x->ndim == 2 ? c->x->shape[0] * c->x->shape[1] : c->x->shape[0];
        int64_t k = elem >= in_file ? 0 : in_file - elem < n ? in_file - elem : n;
        load(c, elem, k, out);
        memset(out + k, 0, (size_t)(n - k) * sizeof(float)); /* the padded vocabulary rows */
        c->h->bytes_read += k * v->esize;
        return 0;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t f = file_index(c->h, c->x, c->src, (elem + i) / c->cols, (elem + i) % c->cols);
        load(c, f, 1, out + i);
    }
    c->h->bytes_read += n * v->esize;
    return 0;
}

/* A NaN or Inf weight trains and evaluates to NaN (attention carries it to the loss), so the
 * import counts them in what it read and refuses the tensor, naming it and the file's name. */
static int refuse_nonfinite(const hf_model *h, const hf_tensor *x, const ckpt_tensor *t,
                            const ckpt_slice *s, const float *out, ust_err *e) {
    int64_t n = s->flat1 - s->flat0, bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(out[i])) bad++, first = first < 0 ? i : first;
    if (!bad) return 0;
    return ust_errf(e,
                    "%s: tensor %s (%s here) holds %lld non-finite value%s (NaN or Inf; the "
                    "first at element %lld of the %lld read): a model with them trains and "
                    "evaluates to NaN; refused (model.allow_nonfinite: true loads it anyway)",
                    h->dir, x->name, t->name, (long long)bad, bad == 1 ? "" : "s", (long long)first,
                    (long long)n);
}

/* Slice s of ustrain tensor t through table row `row` (its source j). */
static int read_row(hf_model *h, int row, int j, const ckpt_tensor *t, const ckpt_slice *s,
                    float *out, ust_err *e) {
    const hf_tensor *x = &h->table.t[row];
    if (check_request(h, x, &x->src[j], t, e)) return -1;
    int64_t rows = t->ndim == 2 ? t->shape[0] : 1, cols = t->ndim == 2 ? t->shape[1] : t->shape[0];
    if (ckpt_check_slice(s, rows, cols, t->name, e)) return -1;
    read_ctx c = {h, x, j, cols, {0}, out, {0}, {0}};
    const char *name = x->name + h->name_off[row];
    int rc = st_raw(h->shards[h->shard_of[row]], name, &c.v);
    UST_ASSERT(rc == 0, "tensor %s vanished from its shard", x->name);
    if (h->scale_shard[row] >= 0) { /* find_scale checked it */
        char sn[CKPT_NAME_MAX + 16];
        scale_name(name, sn, sizeof sn);
        rc = st_raw(h->shards[h->scale_shard[row]], sn, &c.scale);
        UST_ASSERT(rc == 0, "tensor %s vanished from its shard", sn);
        for (unsigned b = 0; b < 256; b++) c.e4m3[b] = e4m3_to_f32(b);
    }
    if (ckpt_for_each_run(s, cols, read_run, &c, e)) return -1;
    return h->allow_nonfinite ? 0 : refuse_nonfinite(h, x, t, s, out, e);
}

/* DeepSeek's MTP layers carry copies of the shared embedding and head (hf_tensor.dup); ustrain's
 * modules use the main model's, so each copy must hold the same values: every rank checks the
 * slice it read (the whole tensor is some rank's) and refuses a copy that differs. */
static int check_dups(hf_model *h, const ckpt_tensor *t, const ckpt_slice *s, const float *out,
                      ust_err *e) {
    int64_t n = s->flat1 - s->flat0;
    for (int d = 0; d < h->ndups; d++) {
        const hf_tensor *x = &h->table.t[h->dups[d]];
        if (strcmp(x->src[0].name, t->name)) continue;
        float *copy = malloc((size_t)(n ? n : 1) * sizeof(float));
        if (!copy) return ust_errf(e, "%s: out of memory", h->dir);
        int rc = read_row(h, h->dups[d], 0, t, s, copy, e);
        int64_t i = 0;
        while (!rc && i < n && !memcmp(&copy[i], &out[i], sizeof(float))) i++;
        if (!rc && i < n)
            rc = ust_errf(e,
                          "%s: tensor '%s' differs from '%s' (element %lld: %.9g, not %.9g): the "
                          "multi-token prediction modules share the main model's embedding and "
                          "head, so their copies must equal them",
                          h->dir, x->name, t->name, (long long)(s->flat0 + i), copy[i], out[i]);
        free(copy);
        if (rc) return -1;
    }
    return 0;
}

int hf_read_slice(hf_model *h, const ckpt_tensor *t, const ckpt_slice *s, float *out, ust_err *e) {
    hf_src_ref key = {t->name, 0, 0};
    const hf_src_ref *ref = bsearch(&key, h->refs, (size_t)h->nrefs, sizeof key, cmp_ref);
    if (!ref)
        return ust_errf(e, "%s: the model's tensor '%s' has no counterpart in this %s", h->dir,
                        t->name, h->arch);
    if (read_row(h, ref->row, ref->src, t, s, out, e)) return -1;
    return check_dups(h, t, s, out, e);
}

void hf_allow_nonfinite(hf_model *h, int allow) { h->allow_nonfinite = allow; }
