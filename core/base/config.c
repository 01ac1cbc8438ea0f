/* config: YAML (libyaml document API) -> ust_config.
 * One table, cfg_keys, lists every key with its field, type, default and allowed range. Defaults,
 * loading, --set, the range part of cfg_validate and cfg_dump all walk that table, so adding a
 * key is one line there. Errors name the position (file:line:col, or the --set argument), the
 * full key path, the offending value and what is allowed. */
#include "config.h"
#include "fs.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

/* ---------------------------------------------------------------- the key table */

/* K_DATA: data.train / data.val, a string (a glob) or a list of datasets (cfg_load_blend) */
typedef enum { K_INT, K_I64, K_U64, K_DBL, K_BOOL, K_STR, K_ENUM, K_LIST, K_DATA } cfg_kind;

enum { LO_OPEN = 1, HI_OPEN = 2, NULLABLE = 4, AUTO = 8 }; /* AUTO: "auto" is stored as 0 */

typedef struct {
    const char *path; /* "model.moe.top_k" */
    cfg_kind kind;
    size_t off, size;
    const char *def; /* the default, written as in YAML */
    double lo, hi;   /* numbers: allowed range, closed unless LO_OPEN / HI_OPEN */
    int flags;
    const char *const *names; /* K_ENUM: value i is names[i]; K_STR: the allowed strings */
} cfg_key;

static const char *const DEVICES[] = {"cpu", "cuda", NULL};
static const char *const ARCHS[] = {"gpt2", "llama", "auto", NULL};
static const char *const ROPE_SCALINGS[] = {"none", "llama3", NULL};
static const char *const PP_SCHEDULES[] = {"afab",      "1f1b",     "interleaved", "zb",
                                           "dualpipev", "dualpipe", NULL};
static const char *const CP_LAYOUTS[] = {"zigzag", "contiguous", NULL};
static const char *const CP_COMMS[] = {"ring", "allgather", "a2a", "a2a+ring", NULL};
static const char *const PRECISIONS[] = {"fp32", "bf16", NULL};
static const char *const RECOMPUTES[] = {"none", "selective", "full", NULL};
static const char *const ON_NANS[] = {"stop", "skip", NULL};
static const char *const ON_SPIKES[] = {"none", "skip", "rewind", NULL};
static const char *const OPTIMIZERS[] = {"adamw", NULL};
static const char *const LR_SCHEDULES[] = {"cosine", "linear", "constant", "wsd", NULL};
static const char *const DATA_FORMATS[] = {"llmc", "nanogpt", "megatron", NULL};

/* Enum fields are stored through an int. */
_Static_assert(sizeof(ust_arch) == sizeof(int) && sizeof(ust_device) == sizeof(int) &&
                   sizeof(ust_precision) == sizeof(int) && sizeof(ust_recompute) == sizeof(int) &&
                   sizeof(ust_on_nan) == sizeof(int) && sizeof(ust_on_spike) == sizeof(int) &&
                   sizeof(ust_lr_schedule) == sizeof(int) &&
                   sizeof(ust_pp_schedule) == sizeof(int) && sizeof(ust_cp_layout) == sizeof(int) &&
                   sizeof(ust_cp_comm) == sizeof(int) && sizeof(ust_data_format) == sizeof(int),
               "config enums must be int-sized");

#define AT(f) offsetof(ust_config, f), sizeof(((ust_config *)0)->f)
#define INT(p, f, d, lo)                                                                           \
    { p, K_INT, AT(f), d, lo, INT_MAX, 0, NULL }
#define INTR(p, f, d, lo, hi)                                                                      \
    { p, K_INT, AT(f), d, lo, hi, 0, NULL }
#define I64(p, f, d, lo)                                                                           \
    { p, K_I64, AT(f), d, lo, INFINITY, 0, NULL }
#define U64(p, f, d)                                                                               \
    { p, K_U64, AT(f), d, 0, INFINITY, 0, NULL }
#define DBL(p, f, d, lo, hi, fl)                                                                   \
    { p, K_DBL, AT(f), d, lo, hi, fl, NULL }
#define BOOL(p, f, d)                                                                              \
    { p, K_BOOL, AT(f), d, 0, 1, 0, NULL }
#define STR(p, f, d, fl)                                                                           \
    { p, K_STR, AT(f), d, 0, 0, fl, NULL }
#define ONEOF(p, f, d, names)                                                                      \
    { p, K_STR, AT(f), d, 0, 0, 0, names }
#define DATASETS(p, f, d, fl)                                                                      \
    { p, K_DATA, AT(f), d, 0, 0, fl, NULL }
#define ENUM(p, f, d, names)                                                                       \
    { p, K_ENUM, AT(f), d, 0, 0, 0, names }
/* a list of integers in 1..hi ([4, 4, 2, 2], or "4,4,2,2" with --set), kept as "4,4,2,2" */
#define LIST(p, f, hi)                                                                             \
    { p, K_LIST, AT(f), "null", 1, hi, NULLABLE, NULL }

/* Keys of one section must be contiguous and a subsection must follow its parent's keys:
 * cfg_dump opens a section each time the prefix changes. */
static const cfg_key cfg_keys[] = {
    STR("run.name", run.name, "tiny", 0),
    U64("run.seed", run.seed, "1234"),
    ENUM("run.device", run.device, "cpu", DEVICES),
    STR("run.out_dir", run.out_dir, "runs/tiny", 0),

    ENUM("model.arch", model.arch, "llama", ARCHS),
    INTR("model.n_layer", model.n_layer, "4", 1, 4096),
    INTR("model.d_model", model.d_model, "128", 1, 1 << 20),
    INTR("model.n_head", model.n_head, "4", 1, 1 << 16),
    INTR("model.n_kv_head", model.n_kv_head, "2", 1, 1 << 16),
    INTR("model.d_ff", model.d_ff, "384", 1, 1 << 22),
    INTR("model.vocab_size", model.vocab_size, "512", 1, 1 << 24),
    INTR("model.vocab_pad", model.vocab_pad, "128", 1, 1 << 16),
    INTR("model.max_seq_len", model.max_seq_len, "256", 1, 1 << 24),
    DBL("model.rope_theta", model.rope_theta, "10000", 0, INFINITY, LO_OPEN),
    DBL("model.norm_eps", model.norm_eps, "1e-5", 0, INFINITY, LO_OPEN),
    BOOL("model.tie_embeddings", model.tie_embeddings, "false"),
    BOOL("model.qkv_bias", model.qkv_bias, "false"),
    STR("model.init_from", model.init_from, "null", NULLABLE),
    INTR("model.moe.num_experts", model.moe.num_experts, "0", 0, 4096),
    INTR("model.moe.top_k", model.moe.top_k, "2", 1, 4096),
    INTR("model.moe.d_ff_expert", model.moe.d_ff_expert, "128", 1, 1 << 22),
    INTR("model.moe.every", model.moe.every, "1", 1, 4096),
    BOOL("model.moe.shared_expert", model.moe.shared_expert, "false"),
    DBL("model.moe.aux_loss_coef", model.moe.aux_loss_coef, "0.01", 0, INFINITY, 0),
    DBL("model.moe.z_loss_coef", model.moe.z_loss_coef, "0", 0, INFINITY, 0),
    DBL("model.moe.capacity_factor", model.moe.capacity_factor, "0", 0, 4096, 0),
    DBL("model.moe.bias_update_rate", model.moe.bias_update_rate, "0", 0, 1e6, 0),
    BOOL("model.moe.grouped_gemm", model.moe.grouped_gemm, "true"),
    DBL("model.moe.seq_aux_loss_coef", model.moe.seq_aux_loss_coef, "0", 0, INFINITY, 0),
    ENUM("model.rope_scaling.type", model.rope_scaling.type, "none", ROPE_SCALINGS),
    DBL("model.rope_scaling.factor", model.rope_scaling.factor, "8", 1, 1e6, 0),
    DBL("model.rope_scaling.low_freq_factor", model.rope_scaling.low_freq_factor, "1", 0, 1e6,
        LO_OPEN),
    DBL("model.rope_scaling.high_freq_factor", model.rope_scaling.high_freq_factor, "4", 0, 1e6,
        LO_OPEN),
    INTR("model.rope_scaling.original_max_position_embeddings",
         model.rope_scaling.original_max_position_embeddings, "8192", 1, 1 << 24),

    {"parallel.dp", K_INT, AT(parallel.dp), "1", 1, CFG_MAX_WORLD, AUTO, NULL},
    INTR("parallel.tp", parallel.tp, "1", 1, CFG_MAX_WORLD),
    INTR("parallel.pp", parallel.pp, "1", 1, 4096),
    INTR("parallel.cp", parallel.cp, "1", 1, CFG_MAX_WORLD),
    INTR("parallel.ep", parallel.ep, "1", 1, 4096),
    BOOL("parallel.sp", parallel.sp, "false"),
    INT("parallel.vpp", parallel.vpp, "1", 1),
    ENUM("parallel.pp_schedule", parallel.pp_schedule, "1f1b", PP_SCHEDULES),
    BOOL("parallel.pp_breadth_first", parallel.pp_breadth_first, "false"),
    BOOL("parallel.tp_across_nodes", parallel.tp_across_nodes, "false"),
    LIST("parallel.pp_layers", parallel.pp_layers, 4096), /* each at most model.n_layer */
    ENUM("parallel.cp_layout", parallel.cp_layout, "zigzag", CP_LAYOUTS),
    ENUM("parallel.cp_comm", parallel.cp_comm, "ring", CP_COMMS),
    INTR("parallel.cp_a2a", parallel.cp_a2a, "0", 0, CFG_MAX_WORLD),
    DBL("parallel.dp_bucket_mb", parallel.dp_bucket_mb, "25", 0, 1 << 20, LO_OPEN),
    INTR("parallel.zero3_vocab_chunk_rows", parallel.zero3_vocab_chunk_rows, "0", 0, 1 << 30),

    I64("train.steps", train.steps, "50", 0),
    INTR("train.seq_len", train.seq_len, "128", 1, 1 << 24),
    INTR("train.micro_batch_size", train.micro_batch_size, "4", 1, 1 << 24),
    INTR("train.global_batch_size", train.global_batch_size, "8", 1, 1 << 30),
    ENUM("train.precision", train.precision, "fp32", PRECISIONS),
    ENUM("train.recompute", train.recompute, "none", RECOMPUTES),
    DBL("train.grad_clip", train.grad_clip, "1.0", -INFINITY, INFINITY, 0),
    ENUM("train.on_nan", train.on_nan, "stop", ON_NANS),
    ENUM("train.on_spike", train.on_spike, "none", ON_SPIKES),
    DBL("train.spike_zscore", train.spike_zscore, "6", 0, 1e6, LO_OPEN),
    INTR("train.spike_window", train.spike_window, "32", 2, 1 << 20),
    INTR("train.threads", train.threads, "0", 0, CFG_MAX_THREADS),
    DBL("train.exit_after_min", train.exit_after_min, "0", 0, 1e9, 0),
    I64("train.stop_at_step", train.stop_at_step, "0", 0),

    ONEOF("optimizer.name", optimizer.name, "adamw", OPTIMIZERS),
    INTR("optimizer.zero_stage", optimizer.zero_stage, "0", 0, 3),
    DBL("optimizer.lr", optimizer.lr, "3.0e-3", 0, INFINITY, LO_OPEN),
    DBL("optimizer.min_lr", optimizer.min_lr, "3.0e-4", 0, INFINITY, 0),
    INT("optimizer.warmup_steps", optimizer.warmup_steps, "5", 0),
    ENUM("optimizer.schedule", optimizer.schedule, "cosine", LR_SCHEDULES),
    DBL("optimizer.decay_frac", optimizer.decay_frac, "0.2", 0, 1, 0),
    DBL("optimizer.beta1", optimizer.beta1, "0.9", 0, 1, HI_OPEN),
    DBL("optimizer.beta2", optimizer.beta2, "0.95", 0, 1, HI_OPEN),
    DBL("optimizer.eps", optimizer.eps, "1.0e-8", 0, INFINITY, LO_OPEN),
    DBL("optimizer.weight_decay", optimizer.weight_decay, "0.1", 0, INFINITY, 0),

    ENUM("data.format", data.format, "llmc", DATA_FORMATS),
    DATASETS("data.train", data.train, "data/tiny/train_*.bin", 0),
    DATASETS("data.val", data.val, "data/tiny/val_*.bin", NULLABLE),
    BOOL("data.shuffle", data.shuffle, "false"),
    INT("data.val_every", data.val_every, "25", 0),
    INT("data.val_steps", data.val_steps, "4", 1),
    BOOL("data.allow_reweight", data.allow_reweight, "false"),
    BOOL("data.doc_mask", data.doc_mask, "false"),
    BOOL("data.reset_positions", data.reset_positions, "false"),
    INTR("data.eot_id", data.eot_id, "-1", -1, (1 << 24) - 1),

    STR("checkpoint.dir", checkpoint.dir, "runs/tiny/ckpt", 0),
    INT("checkpoint.every", checkpoint.every, "25", 0),
    INT("checkpoint.keep_last", checkpoint.keep_last, "2", 0),
    STR("checkpoint.resume", checkpoint.resume, "auto", 0),
    BOOL("checkpoint.async", checkpoint.async, "false"),

    INT("logging.every", logging.every, "1", 1),
    STR("logging.metrics_file", logging.metrics_file, "runs/tiny/metrics.jsonl", 0),
    STR("logging.tensorboard_dir", logging.tensorboard_dir, "null", NULLABLE),
    DBL("logging.peak_flops", logging.peak_flops, "0", 0, INFINITY, 0),

    DBL("dist.timeout_s", dist.timeout_s, "300", 1, 1e6, 0), /* below a second: every wait fails */
};

#define N_KEYS (sizeof cfg_keys / sizeof cfg_keys[0])
_Static_assert(N_KEYS <= 64 * sizeof(((ust_config *)0)->set_bits) / sizeof(uint64_t),
               "ust_config.set_bits needs a bit per key");

static void cfg_mark_set(ust_config *c, const cfg_key *k) {
    size_t i = (size_t)(k - cfg_keys);
    c->set_bits[i / 64] |= (uint64_t)1 << (i % 64);
}

bool cfg_was_set(const ust_config *c, const char *path) {
    const cfg_key *k = NULL;
    for (size_t i = 0; i < N_KEYS && !k; i++)
        if (strcmp(cfg_keys[i].path, path) == 0) k = &cfg_keys[i];
    UST_ASSERT(k, "cfg_was_set: no key %s", path);
    size_t i = (size_t)(k - cfg_keys);
    return (c->set_bits[i / 64] >> (i % 64)) & 1;
}

static const cfg_key *cfg_find_key(const char *path) {
    for (size_t i = 0; i < N_KEYS; i++)
        if (strcmp(cfg_keys[i].path, path) == 0) return &cfg_keys[i];
    return NULL;
}

/* A section is a path that is a proper prefix (up to a '.') of some key. */
static bool cfg_is_section(const char *path) {
    size_t n = strlen(path);
    for (size_t i = 0; i < N_KEYS; i++)
        if (strncmp(cfg_keys[i].path, path, n) == 0 && cfg_keys[i].path[n] == '.') return true;
    return false;
}

static const char *cfg_leaf_name(const char *path) {
    const char *dot = strrchr(path, '.');
    return dot ? dot + 1 : path;
}

/* ---------------------------------------------------------------- scalar values */

static bool cfg_is_null(const char *s, bool plain) {
    return plain && (!*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
                     !strcmp(s, "NULL"));
}

/* Integer keys without an explicit upper bound are bounded only by their C type. */
static bool cfg_has_hi(const cfg_key *k) {
    return k->kind == K_DBL ? k->hi != INFINITY : k->kind == K_INT && k->hi < INT_MAX;
}

/* What the allowed range is, phrased for the side that v violates. */
static void cfg_range_text(const cfg_key *k, double v, char *buf, size_t n) {
    if (cfg_has_hi(k) && k->kind != K_DBL)
        snprintf(buf, n, "must be in %.0f..%.0f", k->lo, k->hi);
    else if (cfg_has_hi(k))
        snprintf(buf, n, "must be in %s%g, %g%s", k->flags & LO_OPEN ? "(" : "[", k->lo, k->hi,
                 k->flags & HI_OPEN ? ")" : "]");
    else if (v <= k->lo || k->kind == K_DBL)
        snprintf(buf, n, "must be %s %g", k->flags & LO_OPEN ? ">" : ">=", k->lo);
    else
        snprintf(buf, n, "must fit in a %d-bit integer", k->kind == K_INT ? 32 : 64);
}

static bool cfg_in_range(const cfg_key *k, double v) {
    bool lo_ok = k->flags & LO_OPEN ? v > k->lo : v >= k->lo;
    bool hi_ok = k->flags & HI_OPEN ? v < k->hi : v <= k->hi;
    return lo_ok && hi_ok;
}

/* "out of range" message into why; returns -1. */
static int cfg_range_error(const cfg_key *k, const char *shown, double v, char *why, size_t n) {
    char range[96];
    cfg_range_text(k, v, range, sizeof range);
    snprintf(why, n, "%s is out of range (%s)", shown, range);
    return -1;
}

static void cfg_list_names(const char *const *names, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; names[i] && used < n; i++)
        used += snprintf(buf + used, n - used, "%s%s", i ? ", " : "", names[i]);
}

static int cfg_name_index(const char *const *names, const char *s) {
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], s)) return i;
    return -1;
}

static int cfg_quoted_error(const char *what, const char *s, char *why, size_t n) {
    snprintf(why, n, "expected %s, got the quoted string \"%s\" (remove the quotes)", what, s);
    return -1;
}

static int cfg_put_int(void *dst, const cfg_key *k, const char *s, bool plain, char *why,
                       size_t n) {
    const char *what = k->kind == K_U64 ? "a non-negative integer" : "an integer";
    if ((k->flags & AUTO) && plain && !strcmp(s, "auto")) { /* resolved by cfg_resolve_auto */
        int zero = 0;
        memcpy(dst, &zero, sizeof zero);
        return 0;
    }
    if (!plain) return cfg_quoted_error(what, s, why, n);
    size_t sign = (s[0] == '-' || s[0] == '+');
    if (!s[sign] || strspn(s + sign, "0123456789") != strlen(s + sign) ||
        (k->kind == K_U64 && s[0] == '-')) {
        snprintf(why, n, "expected %s, got '%s'", what, s);
        return -1;
    }
    errno = 0;
    if (k->kind == K_U64) {
        uint64_t v = strtoull(s, NULL, 10);
        if (errno) return cfg_range_error(k, s, INFINITY, why, n);
        memcpy(dst, &v, sizeof v);
        return 0;
    }
    long long v = strtoll(s, NULL, 10);
    if (errno || !cfg_in_range(k, (double)v)) return cfg_range_error(k, s, (double)v, why, n);
    if (k->kind == K_INT) {
        int iv = (int)v; /* the range of every K_INT key lies within int */
        memcpy(dst, &iv, sizeof iv);
    } else {
        int64_t lv = v;
        memcpy(dst, &lv, sizeof lv);
    }
    return 0;
}

static int cfg_put_double(void *dst, const cfg_key *k, const char *s, bool plain, char *why,
                          size_t n) {
    if (!plain) return cfg_quoted_error("a number", s, why, n);
    char *end;
    double v = strtod(s, &end);
    /* Only decimal notation: strtod would also take "nan", "inf" and hex floats. */
    if (!*s || *end || strspn(s, "0123456789+-.eE") != strlen(s) || !isfinite(v)) {
        snprintf(why, n, "expected a number, got '%s'", s);
        return -1;
    }
    if (!cfg_in_range(k, v)) return cfg_range_error(k, s, v, why, n);
    memcpy(dst, &v, sizeof v);
    return 0;
}

static int cfg_put_bool(void *dst, const char *s, bool plain, char *why, size_t n) {
    if (!plain) return cfg_quoted_error("true or false", s, why, n);
    bool v;
    if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE"))
        v = true;
    else if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE"))
        v = false;
    else {
        snprintf(why, n, "expected true or false, got '%s'", s);
        return -1;
    }
    memcpy(dst, &v, sizeof v);
    return 0;
}

static int cfg_put_string(void *dst, const cfg_key *k, const char *s, bool plain, char *why,
                          size_t n) {
    char allowed[256];
    if (cfg_is_null(s, plain)) {
        if (!(k->flags & NULLABLE)) {
            snprintf(why, n, "needs a value, got null");
            return -1;
        }
        s = "";
    }
    if (strlen(s) >= k->size) {
        snprintf(why, n, "value is too long (%zu bytes, at most %zu)", strlen(s), k->size - 1);
        return -1;
    }
    if (k->names && cfg_name_index(k->names, s) < 0) {
        cfg_list_names(k->names, allowed, sizeof allowed);
        snprintf(why, n, "unknown value '%s' (allowed: %s)", s, allowed);
        return -1;
    }
    memset(dst, 0, k->size); /* whole field, so two configs compare equal with memcmp */
    memcpy(dst, s, strlen(s));
    return 0;
}

static int cfg_put_enum(void *dst, const cfg_key *k, const char *s, bool plain, char *why,
                        size_t n) {
    int v = cfg_is_null(s, plain) ? -1 : cfg_name_index(k->names, s);
    if (v < 0) {
        char allowed[256];
        cfg_list_names(k->names, allowed, sizeof allowed);
        snprintf(why, n, "unknown value '%s' (allowed: %s)", cfg_is_null(s, plain) ? "null" : s,
                 allowed);
        return -1;
    }
    memcpy(dst, &v, sizeof v);
    return 0;
}

/* One list item (n chars at p) in k's range, else the reason in why. Parsed whole and in 64 bits:
 * atoi would read 4294967297 as 1. */
static int cfg_list_item(const cfg_key *k, const char *p, size_t n, char *why, size_t wn) {
    char item[32];
    if (n == 0 || n >= sizeof item || strspn(p, "0123456789") < n) return -1;
    snprintf(item, sizeof item, "%.*s", (int)n, p);
    errno = 0;
    long long v = strtoll(item, NULL, 10);
    if (errno || v < k->lo || v > k->hi)
        return snprintf(why, wn, "item %s is out of range (must be in %.0f..%.0f)", item, k->lo,
                        k->hi),
               -2;
    return 0;
}

/* "4, 4,2 ,2" or "[4,4,2,2]" -> "4,4,2,2"; every item an integer in k's range. */
static int cfg_put_list(void *dst, const cfg_key *k, const char *s, bool plain, char *why,
                        size_t n) {
    char out[256] = "";
    if (cfg_is_null(s, plain) || !*s) {
        memset(dst, 0, k->size);
        return 0;
    }
    const char *p = s + (*s == '[');
    size_t len = strlen(p) - (*s == '[' && p[strlen(p) - 1] == ']');
    for (size_t i = 0; i <= len;) {
        size_t j = i;
        while (j < len && p[j] != ',') j++;
        size_t a = i, b = j;
        while (a < b && p[a] == ' ') a++;
        while (b > a && p[b - 1] == ' ') b--;
        int rc = cfg_list_item(k, p + a, b - a, why, n);
        if (rc == -1) snprintf(why, n, "expected a list of positive integers, got '%s'", s);
        if (rc) return -1;
        if (strlen(out) + (b - a) + 2 > sizeof out || strlen(out) + (b - a) + 2 > k->size)
            return snprintf(why, n, "list is too long: '%s'", s), -1;
        if (*out) strcat(out, ",");
        strncat(out, p + a, b - a);
        i = j + 1;
    }
    memset(dst, 0, k->size);
    memcpy(dst, out, strlen(out));
    return 0;
}

/* A list of datasets is kept in data.train / data.val as canonical flow YAML starting so. */
#define BLEND_PREFIX "[{path: "

static bool cfg_is_blend_text(const char *s) {
    return strncmp(s, BLEND_PREFIX, strlen(BLEND_PREFIX)) == 0;
}

/* Parses the scalar s (plain: unquoted in the YAML) into k's field of c. On error writes the
 * reason, without position or key, into why. */
static int cfg_put(ust_config *c, const cfg_key *k, const char *s, bool plain, char *why,
                   size_t n) {
    void *dst = (char *)c + k->off;
    if (k->kind != K_STR && k->kind != K_DATA && k->kind != K_ENUM && k->kind != K_LIST &&
        cfg_is_null(s, plain)) {
        snprintf(why, n, "needs a value, got null");
        return -1;
    }
    switch (k->kind) {
    case K_INT:
    case K_I64:
    case K_U64:
        return cfg_put_int(dst, k, s, plain, why, n);
    case K_DBL:
        return cfg_put_double(dst, k, s, plain, why, n);
    case K_BOOL:
        return cfg_put_bool(dst, s, plain, why, n);
    case K_STR:
        return cfg_put_string(dst, k, s, plain, why, n);
    case K_DATA:
        if (cfg_is_blend_text(s)) /* that text is the form a list is kept in */
            return snprintf(why, n, "a list of datasets is written as a YAML list, not a string"),
                   -1;
        return cfg_put_string(dst, k, s, plain, why, n);
    case K_ENUM:
        return cfg_put_enum(dst, k, s, plain, why, n);
    case K_LIST:
        return cfg_put_list(dst, k, s, plain, why, n);
    }
    return -1;
}

/* ---------------------------------------------------------------- defaults */

void cfg_defaults(ust_config *c) {
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < N_KEYS; i++) {
        char why[256];
        int rc = cfg_put(c, &cfg_keys[i], cfg_keys[i].def, true, why, sizeof why);
        UST_ASSERT(rc == 0, "bad default for %s: %s", cfg_keys[i].path, why);
    }
}

/* ---------------------------------------------------------------- did-you-mean */

enum { NAME_MAX_LEN = 64, LEVEL_MAX = 64 };

typedef struct {
    char name[LEVEL_MAX][NAME_MAX_LEN];
    int n;
} cfg_names;

/* The names valid directly under prefix ("" = top level): keys and subsections, in table order. */
static void cfg_level_names(const char *prefix, cfg_names *out) {
    size_t pn = strlen(prefix);
    out->n = 0;
    for (size_t i = 0; i < N_KEYS; i++) {
        const char *p = cfg_keys[i].path;
        if (pn && (strncmp(p, prefix, pn) || p[pn] != '.')) continue;
        const char *s = pn ? p + pn + 1 : p;
        size_t len = strcspn(s, ".");
        int dup = 0;
        for (int j = 0; j < out->n; j++)
            dup |= strlen(out->name[j]) == len && !strncmp(out->name[j], s, len);
        if (dup || out->n == LEVEL_MAX || len >= NAME_MAX_LEN) continue;
        memcpy(out->name[out->n], s, len);
        out->name[out->n++][len] = 0;
    }
}

static int cfg_edit_distance(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    if (na >= NAME_MAX_LEN || nb >= NAME_MAX_LEN) return INT_MAX;
    int prev[NAME_MAX_LEN], cur[NAME_MAX_LEN];
    for (size_t j = 0; j <= nb; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof cur);
    }
    return prev[nb];
}

/* The nearest valid name, if near enough to be a plausible typo; NULL otherwise. */
static const char *cfg_suggest(const cfg_names *names, const char *name) {
    const char *best = NULL;
    int best_d = INT_MAX;
    for (int i = 0; i < names->n; i++) {
        int d = cfg_edit_distance(name, names->name[i]);
        if (d < best_d) best_d = d, best = names->name[i];
    }
    if (!best) return NULL;
    size_t longer = strlen(name) > strlen(best) ? strlen(name) : strlen(best);
    return best_d <= 2 || (size_t)best_d * 2 <= longer ? best : NULL;
}

/* "unknown key 'train.micro_batch' (did you mean 'micro_batch_size'?)" into buf. */
static void cfg_unknown_text(const char *prefix, const char *name, char *buf, size_t n) {
    cfg_names names;
    cfg_level_names(prefix, &names);
    const char *what = *prefix ? "key" : "section";
    char path[256];
    snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", name);
    const char *best = cfg_suggest(&names, name);
    if (best) {
        snprintf(buf, n, "unknown %s '%s' (did you mean '%s'?)", what, path, best);
        return;
    }
    char list[1024];
    size_t used = 0;
    list[0] = 0;
    for (int i = 0; i < names.n && used < sizeof list; i++)
        used += snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names.name[i]);
    if (*prefix)
        snprintf(buf, n, "unknown key '%s' (valid keys in '%s': %s)", path, prefix, list);
    else
        snprintf(buf, n, "unknown section '%s' (valid sections: %s)", path, list);
}

/* ---------------------------------------------------------------- walking the YAML document */

typedef struct {
    ust_config *c;
    yaml_document_t *doc;
    const char *where; /* file name, or "--set key=value" */
    bool is_set;       /* --set: a position inside the value means nothing, so none is shown */
    ust_err *e;
} cfg_ctx;

static int cfg_fail_at(const cfg_ctx *x, yaml_mark_t m, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int cfg_fail_at(const cfg_ctx *x, yaml_mark_t m, const char *fmt, ...) {
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (x->is_set) return ust_errf(x->e, "%s: %s", x->where, msg);
    return ust_errf(x->e, "%s:%zu:%zu: %s", x->where, m.line + 1, m.column + 1, msg);
}

/* libyaml's reader errors (bad UTF-8) carry only a byte offset. */
static yaml_mark_t cfg_mark_at(const char *text, size_t offset) {
    yaml_mark_t m = {offset, 0, 0};
    for (size_t i = 0; i < offset && text[i]; i++) {
        if (text[i] == '\n')
            m.line++, m.column = 0;
        else
            m.column++;
    }
    return m;
}

static int cfg_syntax_error(const cfg_ctx *x, const yaml_parser_t *p, const char *text) {
    yaml_mark_t m =
        p->error == YAML_READER_ERROR ? cfg_mark_at(text, p->problem_offset) : p->problem_mark;
    char ctx[256] = "";
    if (p->context)
        snprintf(ctx, sizeof ctx, " (%s at line %zu, column %zu)", p->context,
                 p->context_mark.line + 1, p->context_mark.column + 1);
    return cfg_fail_at(x, m, "YAML syntax error: %s%s", p->problem ? p->problem : "unreadable",
                       ctx);
}

/* libyaml's document loader scans all of the text before it returns, and its scanner checks every
 * open flow level at each token, so "[[[[..." 100,000 deep took 43 s to reject. A pass over the
 * events first stops at the first list or mapping deeper than CFG_MAX_DEPTH: the scanner looks
 * only a bounded way ahead of the event it hands out (a possible simple key goes stale after
 * 1024 characters), so this costs about as much as the first few kilobytes whatever follows. */
static int cfg_check_depth(const cfg_ctx *x, const char *text) {
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) return ust_errf(x->e, "%s: out of memory", x->where);
    yaml_parser_set_input_string(&p, (const unsigned char *)text, strlen(text));
    int depth = 0, rc = 0;
    for (bool end = false; !end && rc == 0;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            rc = cfg_syntax_error(x, &p, text);
            break;
        }
        if (ev.type == YAML_SEQUENCE_START_EVENT || ev.type == YAML_MAPPING_START_EVENT) {
            if (++depth > CFG_MAX_DEPTH)
                rc = cfg_fail_at(x, ev.start_mark,
                                 "lists and mappings nested deeper than %d levels (the limit; a "
                                 "config needs 3)",
                                 CFG_MAX_DEPTH);
        } else if (ev.type == YAML_SEQUENCE_END_EVENT || ev.type == YAML_MAPPING_END_EVENT) {
            depth--;
        }
        end = ev.type == YAML_STREAM_END_EVENT;
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&p);
    return rc;
}

/* Parses text as exactly one YAML document into d; the caller deletes d when this returns 0. */
static int cfg_load_document(const cfg_ctx *x, const char *text, yaml_document_t *d) {
    yaml_parser_t p;
    if (strlen(text) > CFG_MAX_BYTES)
        return cfg_fail_at(x, cfg_mark_at(text, CFG_MAX_BYTES),
                           "config is larger than %d MiB (the limit)", CFG_MAX_BYTES >> 20);
    if (cfg_check_depth(x, text)) return -1;
    if (!yaml_parser_initialize(&p)) return ust_errf(x->e, "%s: out of memory", x->where);
    yaml_parser_set_input_string(&p, (const unsigned char *)text, strlen(text));
    int rc = 0;
    if (!yaml_parser_load(&p, d)) { /* libyaml frees d on failure */
        rc = cfg_syntax_error(x, &p, text);
        yaml_parser_delete(&p);
        return rc;
    }
    yaml_document_t extra;
    if (!yaml_parser_load(&p, &extra)) {
        rc = cfg_syntax_error(x, &p, text);
    } else {
        yaml_node_t *r = yaml_document_get_root_node(&extra);
        if (r) rc = cfg_fail_at(x, r->start_mark, "expected one YAML document, found a second");
        yaml_document_delete(&extra);
    }
    yaml_parser_delete(&p);
    if (rc) yaml_document_delete(d);
    return rc;
}

static const char *cfg_node_kind(const yaml_node_t *n) {
    switch (n->type) {
    case YAML_MAPPING_NODE:
        return "a mapping";
    case YAML_SEQUENCE_NODE:
        return "a list";
    default:
        return "a single value";
    }
}

static bool cfg_node_is_null(const yaml_node_t *n) {
    return n->type == YAML_SCALAR_NODE &&
           cfg_is_null((const char *)n->data.scalar.value,
                       n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE);
}

/* A YAML list of scalars for a K_LIST key, as the "a,b,c" text cfg_put_list reads; each item is
 * checked where it stands, so its error has its own line:col. */
static int cfg_load_list(const cfg_ctx *x, const cfg_key *k, const yaml_node_t *v) {
    char text[512] = "", why[1024];
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
         it++) {
        yaml_node_t *item = yaml_document_get_node(x->doc, *it);
        const char *s = item->type == YAML_SCALAR_NODE ? (const char *)item->data.scalar.value : "";
        int rc = item->type != YAML_SCALAR_NODE || item->data.scalar.length > 32 ||
                         strlen(text) + item->data.scalar.length + 2 > sizeof text
                     ? -1
                     : cfg_list_item(k, s, item->data.scalar.length, why, sizeof why);
        if (rc == -2) return cfg_fail_at(x, item->start_mark, "%s: %s", k->path, why);
        if (rc)
            return cfg_fail_at(x, item->start_mark,
                               "%s: expected a list of integers in %.0f..%.0f, got %s%s%s", k->path,
                               k->lo, k->hi, item->type == YAML_SCALAR_NODE ? "'" : "",
                               item->type == YAML_SCALAR_NODE ? s : cfg_node_kind(item),
                               item->type == YAML_SCALAR_NODE ? "'" : "");
        if (*text) strcat(text, ",");
        strcat(text, s);
    }
    if (cfg_put(x->c, k, *text ? text : "null", true, why, sizeof why))
        return cfg_fail_at(x, v->start_mark, "%s: %s", k->path, why);
    cfg_mark_set(x->c, k);
    return 0;
}

/* ---------------------------------------------------------------- dataset blends
 * data.train: [{path: "web/train_NNN.bin glob", weight: 0.7}, {path: ..., weight: 0.3, format:
 * megatron}]. Each entry is checked where it stands; the list is kept as canonical flow YAML
 * (BLEND_PREFIX...), which cfg_dump writes as it is and loading turns back into the same text. */

static const char *cfg_scalar(const yaml_node_t *n) {
    return n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static int cfg_blend_field(const cfg_ctx *x, const cfg_key *k, int i, const char *name,
                           const yaml_node_t *v, cfg_dataset *d) {
    const char *s = cfg_scalar(v);
    if (!s)
        return cfg_fail_at(x, v->start_mark, "%s[%d].%s: expected a single value, got %s", k->path,
                           i, name, cfg_node_kind(v));
    if (!strcmp(name, "path")) {
        if (!*s || strlen(s) >= sizeof d->path || strcspn(s, "\"\\\n\r\t") != strlen(s))
            return cfg_fail_at(x, v->start_mark,
                               "%s[%d].path: expected a glob of at most %zu bytes without quotes, "
                               "backslashes or control characters, got '%.64s'",
                               k->path, i, sizeof d->path - 1, s);
        snprintf(d->path, sizeof d->path, "%s", s);
    } else if (!strcmp(name, "weight")) {
        char *end;
        errno = 0;
        d->weight = strtod(s, &end);
        if (end == s || *end || errno || !isfinite(d->weight) || d->weight <= 0)
            return cfg_fail_at(x, v->start_mark,
                               "%s[%d].weight: expected a positive number, got '%s'", k->path, i,
                               s);
    } else {
        d->format = cfg_name_index(DATA_FORMATS, s);
        if (d->format < 0) {
            char allowed[128];
            cfg_list_names(DATA_FORMATS, allowed, sizeof allowed);
            return cfg_fail_at(x, v->start_mark, "%s[%d].format: unknown value '%s' (allowed: %s)",
                               k->path, i, s, allowed);
        }
    }
    return 0;
}

/* Entry i of a blend list: a mapping with path and weight, and format optionally. */
static int cfg_blend_entry(const cfg_ctx *x, const cfg_key *k, int i, const yaml_node_t *m,
                           cfg_dataset *d) {
    *d = (cfg_dataset){.format = -1};
    if (m->type != YAML_MAPPING_NODE)
        return cfg_fail_at(x, m->start_mark,
                           "%s[%d]: expected a mapping {path: GLOB, weight: W}, got %s", k->path, i,
                           cfg_node_kind(m));
    int seen = 0; /* bits: path, weight, format */
    static const char *const FIELDS[] = {"path", "weight", "format", NULL};
    for (yaml_node_pair_t *pr = m->data.mapping.pairs.start; pr < m->data.mapping.pairs.top; pr++) {
        yaml_node_t *kn = yaml_document_get_node(x->doc, pr->key);
        const char *name = cfg_scalar(kn);
        int f = name ? cfg_name_index(FIELDS, name) : -1;
        if (f < 0)
            return cfg_fail_at(x, kn->start_mark,
                               "%s[%d]: unknown key '%s' (allowed: path, weight, format)", k->path,
                               i, name ? name : "(not a name)");
        if (seen & (1 << f))
            return cfg_fail_at(x, kn->start_mark, "%s[%d]: duplicate key '%s'", k->path, i, name);
        seen |= 1 << f;
        if (cfg_blend_field(x, k, i, name, yaml_document_get_node(x->doc, pr->value), d)) return -1;
    }
    if ((seen & 3) != 3)
        return cfg_fail_at(x, m->start_mark, "%s[%d]: needs %s", k->path, i,
                           seen & 1 ? "a weight" : "a path (a glob of shards)");
    return 0;
}

/* The canonical text of a blend: flow YAML, weights with every digit. */
static int cfg_blend_text(const cfg_dataset *d, int n, char *out, size_t cap) {
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        int w =
            snprintf(out + len, len < cap ? cap - len : 0, "%s{path: \"%s\", weight: %.17g%s%s}",
                     i ? ", " : "[", d[i].path, d[i].weight, d[i].format >= 0 ? ", format: " : "",
                     d[i].format >= 0 ? DATA_FORMATS[d[i].format] : "");
        len += (size_t)w;
    }
    int w = snprintf(out + len, len < cap ? cap - len : 0, "]");
    return len + (size_t)w < cap ? 0 : -1;
}

static int cfg_load_blend(const cfg_ctx *x, const cfg_key *k, const yaml_node_t *v) {
    cfg_dataset d[CFG_MAX_BLEND];
    int n = 0;
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
         it++, n++) {
        if (n == CFG_MAX_BLEND)
            return cfg_fail_at(x, v->start_mark, "%s: at most %d datasets in a blend", k->path,
                               CFG_MAX_BLEND);
        if (cfg_blend_entry(x, k, n, yaml_document_get_node(x->doc, *it), &d[n])) return -1;
    }
    if (n == 0)
        return cfg_fail_at(x, v->start_mark, "%s: an empty list names no datasets", k->path);
    char *dst = (char *)x->c + k->off;
    if (cfg_blend_text(d, n, dst, k->size))
        return cfg_fail_at(x, v->start_mark, "%s: the list is too long (at most %zu bytes)",
                           k->path, k->size - 1);
    return 0;
}

static int cfg_load_leaf(const cfg_ctx *x, const cfg_key *k, const yaml_node_t *v) {
    if (k->kind == K_LIST && v->type == YAML_SEQUENCE_NODE) return cfg_load_list(x, k, v);
    if (k->kind == K_DATA && v->type == YAML_SEQUENCE_NODE) return cfg_load_blend(x, k, v);
    if (v->type != YAML_SCALAR_NODE)
        return cfg_fail_at(x, v->start_mark, "%s: expected a single value, got %s", k->path,
                           cfg_node_kind(v));
    const char *s = (const char *)v->data.scalar.value;
    if (strlen(s) != v->data.scalar.length)
        return cfg_fail_at(x, v->start_mark, "%s: value contains a NUL character", k->path);
    char why[1024];
    if (cfg_put(x->c, k, s, v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE, why, sizeof why))
        return cfg_fail_at(x, v->start_mark, "%s: %s", k->path, why);
    cfg_mark_set(x->c, k);
    return 0;
}

/* A key of a mapping must be a plain name, without dots, and not repeat an earlier key. */
static int cfg_check_key(const cfg_ctx *x, const yaml_node_t *map, const yaml_node_pair_t *pair,
                         const char *prefix) {
    yaml_node_t *kn = yaml_document_get_node(x->doc, pair->key);
    const char *in = *prefix ? prefix : "the top level";
    if (kn->type != YAML_SCALAR_NODE)
        return cfg_fail_at(x, kn->start_mark, "keys must be names, got %s as a key in %s",
                           cfg_node_kind(kn), in);
    const char *name = (const char *)kn->data.scalar.value;
    if (strchr(name, '.'))
        return cfg_fail_at(x, kn->start_mark,
                           "key '%s' in %s contains '.'; nest it instead (a: {b: 1}, not a.b: 1)",
                           name, in);
    for (const yaml_node_pair_t *q = map->data.mapping.pairs.start; q < pair; q++) {
        yaml_node_t *qn = yaml_document_get_node(x->doc, q->key);
        if (qn->type == YAML_SCALAR_NODE && !strcmp((const char *)qn->data.scalar.value, name))
            return cfg_fail_at(x, kn->start_mark,
                               "duplicate key '%s%s%s' (first given at line %zu, column %zu)",
                               prefix, *prefix ? "." : "", name, qn->start_mark.line + 1,
                               qn->start_mark.column + 1);
    }
    return 0;
}

static int cfg_load_mapping(const cfg_ctx *x, const yaml_node_t *map, const char *prefix);

static int cfg_load_section(const cfg_ctx *x, const yaml_node_t *v, const char *path) {
    if (cfg_node_is_null(v)) return 0; /* "model:" with every key commented out */
    if (v->type != YAML_MAPPING_NODE)
        return cfg_fail_at(x, v->start_mark,
                           "'%s' is a section and needs a mapping of keys, got %s", path,
                           cfg_node_kind(v));
    return cfg_load_mapping(x, v, path);
}

static int cfg_load_mapping(const cfg_ctx *x, const yaml_node_t *map, const char *prefix) {
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top;
         pr++) {
        if (cfg_check_key(x, map, pr, prefix)) return -1;
        yaml_node_t *kn = yaml_document_get_node(x->doc, pr->key);
        yaml_node_t *vn = yaml_document_get_node(x->doc, pr->value);
        const char *name = (const char *)kn->data.scalar.value;
        char path[256];
        snprintf(path, sizeof path, "%s%s%.*s", prefix, *prefix ? "." : "", NAME_MAX_LEN, name);
        const cfg_key *k = strlen(name) < NAME_MAX_LEN ? cfg_find_key(path) : NULL;
        int rc;
        if (k)
            rc = cfg_load_leaf(x, k, vn);
        else if (strlen(name) < NAME_MAX_LEN && cfg_is_section(path))
            rc = cfg_load_section(x, vn, path);
        else {
            char msg[1400];
            cfg_unknown_text(prefix, name, msg, sizeof msg);
            rc = cfg_fail_at(x, kn->start_mark, "%s", msg);
        }
        if (rc) return rc;
    }
    return 0;
}

static int cfg_load_root(const cfg_ctx *x) {
    yaml_node_t *root = yaml_document_get_root_node(x->doc);
    /* an empty file is more likely a truncated copy or the wrong path than a wish for every
     * default; `{}` says the latter */
    if (!root || cfg_node_is_null(root))
        return ust_errf(x->e,
                        "%s: config file is empty (no sections: only whitespace, comments or a "
                        "null document); write the keys that differ from the defaults, or {} "
                        "for all defaults",
                        x->where);
    if (root->type != YAML_MAPPING_NODE)
        return cfg_fail_at(
            x, root->start_mark,
            "the top level must be a mapping of sections (run:, model:, ...), got %s",
            cfg_node_kind(root));
    return cfg_load_mapping(x, root, "");
}

/* ---------------------------------------------------------------- public: loading */

static void cfg_set_source(ust_config *c, const char *name) {
    memset(c->source, 0, sizeof c->source);
    snprintf(c->source, sizeof c->source, "%s", name);
}

int cfg_load_string(ust_config *c, const char *yaml, const char *name, ust_err *e) {
    ust_config tmp = *c; /* a failed load leaves c as it was */
    yaml_document_t doc;
    cfg_ctx x = {.c = &tmp, .doc = &doc, .where = name, .e = e};
    if (cfg_load_document(&x, yaml, &doc)) return -1;
    int rc = cfg_load_root(&x);
    yaml_document_delete(&doc);
    if (rc) return rc;
    cfg_set_source(&tmp, name);
    *c = tmp;
    return 0;
}

int cfg_load_file(ust_config *c, const char *path, ust_err *e) {
    ust_err inner;
    FILE *f = fs_fopen_stream(path, &inner);
    if (!f) return ust_errf(e, "config %s", inner.msg);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    /* at most one byte past the limit: cfg_load_document reports where the limit falls, and
     * /dev/zero or a mistaken multi-gigabyte path is not read to the end */
    for (size_t got; buf && n <= CFG_MAX_BYTES && (got = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (cap - n - 1 == 0) {
            char *grown = realloc(buf, cap * 2);
            if (!grown) free(buf);
            buf = grown, cap *= 2;
        }
    }
    int read_err = ferror(f);
    fclose(f);
    if (!buf) return ust_errf(e, "%s: out of memory reading config", path);
    if (read_err) {
        free(buf);
        return ust_errf(e, "%s: read error", path);
    }
    buf[n] = 0;
    int rc = strlen(buf) != n ? ust_errf(e, "%s: config contains a NUL byte", path)
                              : cfg_load_string(c, buf, path, e);
    free(buf);
    return rc;
}

/* "model.moe.top_k" -> its key, or an error naming the first component that is not valid there. */
static const cfg_key *cfg_resolve(const cfg_ctx *x, const char *path) {
    yaml_mark_t none = {0, 0, 0};
    char prefix[256], full[256];
    for (size_t start = 0;;) {
        size_t end = start + strcspn(path + start, ".");
        snprintf(prefix, sizeof prefix, "%.*s", start ? (int)start - 1 : 0, path);
        snprintf(full, sizeof full, "%.*s", (int)end, path);
        bool last = path[end] == 0;
        const cfg_key *k = cfg_find_key(full);
        if (k && last) return k;
        if (k) {
            cfg_fail_at(x, none, "'%s' is a key, not a section", full);
            return NULL;
        }
        if (!cfg_is_section(full)) {
            char msg[1400];
            cfg_unknown_text(prefix, full + start, msg, sizeof msg);
            cfg_fail_at(x, none, "%s", msg);
            return NULL;
        }
        if (last) {
            const cfg_key *first = cfg_keys;
            while (strncmp(first->path, full, end) || first->path[end] != '.') first++;
            cfg_fail_at(x, none, "'%s' is a section; --set needs one of its keys, e.g. %s=%s", full,
                        first->path, first->def);
            return NULL;
        }
        start = end + 1;
    }
}

int cfg_set(ust_config *c, const char *assignment, ust_err *e) {
    char where[UST_PATH_MAX + 64], path[256];
    snprintf(where, sizeof where, "--set %s", assignment);
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment || (size_t)(eq - assignment) >= sizeof path)
        return ust_errf(e, "%s: expected key.path=value, e.g. --set train.steps=100", where);
    snprintf(path, sizeof path, "%.*s", (int)(eq - assignment), assignment);

    ust_config tmp = *c;
    yaml_document_t doc;
    cfg_ctx x = {.c = &tmp, .doc = &doc, .where = where, .is_set = true, .e = e};
    const cfg_key *k = cfg_resolve(&x, path);
    if (!k || cfg_load_document(&x, eq + 1, &doc)) return -1;
    yaml_node_t *v = yaml_document_get_root_node(&doc);
    int rc;
    if (v) {
        rc = cfg_load_leaf(&x, k, v);
    } else { /* "key=" is an empty document: null */
        char why[1024];
        rc = cfg_put(&tmp, k, "", true, why, sizeof why);
        if (rc) ust_errf(e, "%s: %s: %s", where, k->path, why);
        if (!rc) cfg_mark_set(&tmp, k);
    }
    yaml_document_delete(&doc);
    if (rc == 0) *c = tmp;
    return rc;
}

/* ---------------------------------------------------------------- the datasets */

/* A blend's canonical text back into its datasets; -1 (reason in why) when it is not one. */
static int cfg_parse_sets(const char *text, cfg_dataset *out, char *why, size_t n) {
    ust_config scratch;
    yaml_document_t doc;
    ust_err e;
    cfg_ctx x = {.c = &scratch, .doc = &doc, .where = "data", .is_set = true, .e = &e};
    if (cfg_load_document(&x, text, &doc)) return snprintf(why, n, "%s", e.msg), -1;
    yaml_node_t *v = yaml_document_get_root_node(&doc);
    int count = 0, rc = v && v->type == YAML_SEQUENCE_NODE ? 0 : -1;
    const cfg_key k = {.path = "data"};
    for (yaml_node_item_t *it = rc ? NULL : v->data.sequence.items.start;
         it && it < v->data.sequence.items.top && rc == 0; it++, count++)
        rc = count < CFG_MAX_BLEND
                 ? cfg_blend_entry(&x, &k, count, yaml_document_get_node(&doc, *it), &out[count])
                 : -1;
    yaml_document_delete(&doc);
    if (rc) return snprintf(why, n, "not a list of datasets: %.200s", text), -1;
    return count;
}

int cfg_data_sets(const ust_config *c, int val, cfg_dataset *out) {
    const char *text = val ? c->data.val : c->data.train;
    if (!text[0]) return 0;
    if (!cfg_is_blend_text(text)) {
        out[0] = (cfg_dataset){.weight = 1, .format = -1};
        snprintf(out[0].path, sizeof out[0].path, "%s", text);
        return 1;
    }
    char why[512];
    int n = cfg_parse_sets(text, out, why, sizeof why);
    UST_ASSERT(n > 0, "data.%s: %s", val ? "val" : "train", why);
    return n;
}

int cfg_data_is_blend(const ust_config *c, int val) {
    return cfg_is_blend_text(val ? c->data.val : c->data.train);
}

/* ---------------------------------------------------------------- validation */

static double cfg_number(const ust_config *c, const cfg_key *k) {
    const char *p = (const char *)c + k->off;
    int i;
    int64_t l;
    uint64_t u;
    double d;
    switch (k->kind) {
    case K_INT:
        return memcpy(&i, p, sizeof i), i;
    case K_I64:
        return memcpy(&l, p, sizeof l), (double)l;
    case K_U64:
        return memcpy(&u, p, sizeof u), (double)u;
    case K_DBL:
        return memcpy(&d, p, sizeof d), d;
    default:
        return 0;
    }
}

/* The per-key checks of loading, applied to a struct that code may have changed directly. */
static int cfg_check_value(const ust_config *c, const cfg_key *k, char *why, size_t n) {
    const char *p = (const char *)c + k->off;
    char shown[64];
    if (k->kind == K_DATA) {
        if (!memchr(p, 0, k->size)) return snprintf(why, n, "string is not terminated"), -1;
        cfg_dataset d[CFG_MAX_BLEND];
        if (cfg_is_blend_text(p) && cfg_parse_sets(p, d, why, n) < 0) return -1;
        return 0;
    }
    if (k->kind == K_STR) {
        if (!memchr(p, 0, k->size)) return snprintf(why, n, "string is not terminated"), -1;
        if (k->names && cfg_name_index(k->names, p) < 0) {
            char allowed[256];
            cfg_list_names(k->names, allowed, sizeof allowed);
            return snprintf(why, n, "unknown value '%s' (allowed: %s)", p, allowed), -1;
        }
        return 0;
    }
    if (k->kind == K_ENUM) {
        int v, count = 0;
        memcpy(&v, p, sizeof v);
        while (k->names[count]) count++;
        if (v < 0 || v >= count) return snprintf(why, n, "invalid enum value %d", v), -1;
        return 0;
    }
    if (k->kind == K_LIST) {
        char copy[256];
        if (!memchr(p, 0, k->size)) return snprintf(why, n, "list is not terminated"), -1;
        return cfg_put_list(copy, k, p, true, why, n);
    }
    if (k->kind == K_BOOL || k->kind == K_U64) return 0;
    double v = cfg_number(c, k);
    if (v == 0 && (k->flags & AUTO)) return 0; /* "auto": cfg_validate_world needs the world */
    snprintf(shown, sizeof shown, "%.17g", v);
    if (!isfinite(v)) return snprintf(why, n, "%s is not a finite number", shown), -1;
    return cfg_in_range(k, v) ? 0 : cfg_range_error(k, shown, v, why, n);
}

static int cfg_vfail(const ust_config *c, ust_err *e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int cfg_vfail(const ust_config *c, ust_err *e, const char *fmt, ...) {
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ust_errf(e, "%s%s%s", c->source, c->source[0] ? ": " : "", msg);
}

#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) return cfg_vfail(c, e, __VA_ARGS__);                                          \
    } while (0)

static int cfg_validate_model(const ust_config *c, ust_err *e) {
    const __typeof__(c->model) *m = &c->model;
    REQUIRE(m->arch != ARCH_AUTO,
            "model.arch: auto takes the architecture from a Hugging Face model directory in "
            "model.init_from (a directory holding config.json), but model.init_from is %s%s%s",
            m->init_from[0] ? "'" : "", m->init_from[0] ? m->init_from : "null",
            m->init_from[0] ? "'" : "");
    REQUIRE(m->d_model % m->n_head == 0,
            "model.d_model (%d) must be divisible by model.n_head (%d)", m->d_model, m->n_head);
    REQUIRE(m->n_head % m->n_kv_head == 0,
            "model.n_head (%d) must be divisible by model.n_kv_head (%d)", m->n_head, m->n_kv_head);
    REQUIRE(m->arch != ARCH_LLAMA || cfg_head_dim(c) % 2 == 0,
            "llama's RoPE needs an even head dim, but model.d_model / model.n_head = %d / %d = %d",
            m->d_model, m->n_head, cfg_head_dim(c));
    REQUIRE(c->train.seq_len <= m->max_seq_len,
            "train.seq_len (%d) must be <= model.max_seq_len (%d)", c->train.seq_len,
            m->max_seq_len);
    REQUIRE(m->rope_scaling.type == ROPE_NONE || m->arch == ARCH_LLAMA,
            "model.rope_scaling applies to llama's RoPE; gpt2 has learned positions");
    REQUIRE(m->rope_scaling.type == ROPE_NONE ||
                m->rope_scaling.high_freq_factor > m->rope_scaling.low_freq_factor,
            "model.rope_scaling.high_freq_factor (%g) must be > low_freq_factor (%g)",
            m->rope_scaling.high_freq_factor, m->rope_scaling.low_freq_factor);
    const __typeof__(m->moe) *moe = &m->moe;
    REQUIRE(moe->num_experts == 0 || moe->top_k <= moe->num_experts,
            "model.moe.top_k (%d) must be <= model.moe.num_experts (%d)", moe->top_k,
            moe->num_experts);
    REQUIRE(moe->num_experts == 0 || moe->num_experts % c->parallel.ep == 0,
            "model.moe.num_experts (%d) must be divisible by parallel.ep (%d)", moe->num_experts,
            c->parallel.ep);
    REQUIRE(moe->num_experts > 0 || c->parallel.ep == 1,
            "parallel.ep (%d) needs experts, but model.moe.num_experts is 0", c->parallel.ep);
    return 0;
}

static int cfg_validate_parallel(const ust_config *c, ust_err *e) {
    const __typeof__(c->parallel) *p = &c->parallel;
    const __typeof__(c->model) *m = &c->model;
    REQUIRE(m->n_head % p->tp == 0, "model.n_head (%d) must be divisible by parallel.tp (%d)",
            m->n_head, p->tp);
    REQUIRE(m->n_kv_head % p->tp == 0, "model.n_kv_head (%d) must be divisible by parallel.tp (%d)",
            m->n_kv_head, p->tp);
    REQUIRE(cfg_vocab_padded(c) % p->tp == 0,
            "the padded vocab (%d: model.vocab_size %d rounded up to a multiple of model.vocab_pad "
            "%d) must be divisible by parallel.tp (%d)",
            cfg_vocab_padded(c), m->vocab_size, m->vocab_pad, p->tp);
    long long stages = cfg_pp_stages(c);
    if (p->pp_layers[0]) {
        int per[CFG_MAX_STAGES], n = cfg_pp_layers(c, per), sum = 0;
        for (int i = 0; i < n; i++) sum += per[i];
        REQUIRE(
            n == stages, "parallel.pp_layers has %d entries; it needs one per stage: %s = %lld", n,
            p->pp_schedule == PP_DUALPIPE ? "parallel.pp (dualpipe)" : "parallel.pp * parallel.vpp",
            stages);
        REQUIRE(sum == m->n_layer, "parallel.pp_layers adds up to %d layers; model.n_layer is %d",
                sum, m->n_layer);
    }
    REQUIRE(p->pp_layers[0] || p->pp_schedule != PP_DUALPIPE || m->n_layer % p->pp == 0,
            "model.n_layer (%d) must be divisible by parallel.pp (%d): dualpipe splits the model "
            "into pp stages (each rank holds two of them), or parallel.pp_layers must list each "
            "stage's layers",
            m->n_layer, p->pp);
    REQUIRE(p->pp_layers[0] || p->pp_schedule == PP_DUALPIPE || m->n_layer % stages == 0,
            "model.n_layer (%d) must be divisible by parallel.pp * parallel.vpp (%d * %d = %lld), "
            "or parallel.pp_layers must list each stage's layers",
            m->n_layer, p->pp, p->vpp, stages);
    REQUIRE(p->vpp == 1 || p->pp_schedule == PP_INTERLEAVED || p->pp_schedule == PP_DUALPIPEV ||
                p->pp_schedule == PP_DUALPIPE,
            "parallel.vpp (%d) > 1 needs parallel.pp_schedule: interleaved (got %s)", p->vpp,
            PP_SCHEDULES[p->pp_schedule]);
    /* dualpipev: rank r holds stages r and 2p-1-r, so the stages (and pp_layers' entries) are
     * pp * 2; vpp says so explicitly rather than changing meaning behind the user's back */
    REQUIRE(p->pp_schedule != PP_DUALPIPEV || p->pp > 1,
            "parallel.pp_schedule: dualpipev needs parallel.pp > 1 (got %d)", p->pp);
    REQUIRE(p->pp_schedule != PP_DUALPIPEV || p->vpp == 2,
            "parallel.pp_schedule: dualpipev needs parallel.vpp: 2 (got %d): each rank holds two "
            "stages of the V, r and 2*pp-1-r",
            p->vpp);
    /* dualpipe: rank r holds stage r for the micro-batches entering at rank 0 and stage pp-1-r
     * for those entering at rank pp-1: two chunks again, vpp 2, and the ranks pair up */
    REQUIRE(p->pp_schedule != PP_DUALPIPE || (p->pp >= 2 && p->pp % 2 == 0),
            "parallel.pp_schedule: dualpipe needs an even parallel.pp >= 2 (got %d): rank r and "
            "rank pp-1-r hold the same two stages, for the two directions",
            p->pp);
    REQUIRE(p->pp_schedule != PP_DUALPIPE || p->vpp == 2,
            "parallel.pp_schedule: dualpipe needs parallel.vpp: 2 (got %d): each rank holds two "
            "stages, r for one direction and pp-1-r for the other",
            p->vpp);
    REQUIRE(p->vpp == 1 || p->pp > 1,
            "parallel.vpp (%d) > 1 needs parallel.pp > 1: virtual stages interleave over pipeline "
            "ranks",
            p->vpp);
    REQUIRE(p->vpp <= 16, "parallel.vpp (%d) must be at most 16", p->vpp);
    REQUIRE(p->pp == 1 || p->pp_schedule != PP_ZB || m->moe.num_experts == 0,
            "parallel.pp_schedule: zb does not split a MoE layer's backward into B and W; use "
            "1f1b or interleaved with model.moe.num_experts = %d",
            m->moe.num_experts);
    long long moe_tokens =
        (long long)c->train.micro_batch_size * c->train.seq_len / (p->cp > 0 ? p->cp : 1);
    REQUIRE(m->moe.num_experts == 0 || moe_tokens % p->tp == 0,
            "the MoE layers split each micro-batch's tokens over parallel.tp: "
            "train.micro_batch_size * train.seq_len / parallel.cp (%lld) must be divisible by "
            "parallel.tp (%d)",
            moe_tokens, p->tp);
    long long per_dp = (long long)c->train.micro_batch_size * p->dp;
    long long mbs = per_dp > 0 ? c->train.global_batch_size / per_dp : 0;
    REQUIRE(p->pp == 1 || p->pp_schedule != PP_INTERLEAVED || mbs % p->pp == 0,
            "parallel.pp_schedule: interleaved needs the micro-batches per step (%lld = "
            "train.global_batch_size %d / (micro_batch_size %d x dp %d)) to be a multiple of "
            "parallel.pp (%d)",
            mbs, c->train.global_batch_size, c->train.micro_batch_size, p->dp, p->pp);
    REQUIRE(p->pp_schedule != PP_DUALPIPEV || mbs >= 2LL * p->pp,
            "parallel.pp_schedule: dualpipev needs at least 2 * parallel.pp (%d) micro-batches per "
            "step (got %lld = train.global_batch_size %d / (micro_batch_size %d x dp %d))",
            2 * p->pp, mbs, c->train.global_batch_size, c->train.micro_batch_size, p->dp);
    REQUIRE(p->pp_schedule != PP_DUALPIPE || (mbs >= 2LL * p->pp && mbs % 2 == 0),
            "parallel.pp_schedule: dualpipe needs an even number of at least 2 * parallel.pp (%d) "
            "micro-batches per step, half entering from each end (got %lld = "
            "train.global_batch_size %d / (micro_batch_size %d x dp %d))",
            2 * p->pp, mbs, c->train.global_batch_size, c->train.micro_batch_size, p->dp);
    /* rank 0 holds the embedding and the head; ZeRO-2/3 reduce unit 0's gradient (which the
     * tied head adds to) after each micro-batch's embedding backward, but dualpipev runs the
     * head's backward of later micro-batches in between */
    REQUIRE((p->pp_schedule != PP_DUALPIPEV && p->pp_schedule != PP_DUALPIPE) || !cfg_tied(c) ||
                c->optimizer.zero_stage <= 1,
            "parallel.pp_schedule: %s with tied embeddings needs optimizer.zero_stage <= 1 "
            "(got %d): rank 0 runs the head's backward of later micro-batches between a "
            "micro-batch's head and embedding backward",
            PP_SCHEDULES[p->pp_schedule], c->optimizer.zero_stage);
    REQUIRE(p->pp == 1 || p->pp_schedule != PP_ZB || c->train.recompute != RECOMPUTE_FULL,
            "parallel.pp_schedule: zb defers weight gradients, which full recomputation cannot "
            "keep; use train.recompute: none or selective%s",
            "");
    REQUIRE(p->cp == 1 || c->train.seq_len % (2LL * p->cp) == 0,
            "train.seq_len (%d) must be divisible by 2 * parallel.cp (2 * %d = %lld): each rank "
            "holds two chunks of the sequence",
            c->train.seq_len, p->cp, 2LL * p->cp);
    REQUIRE(p->cp_comm == CP_A2A_RING || p->cp_a2a == 0,
            "parallel.cp_a2a (%d) is the Ulysses degree of parallel.cp_comm: a2a+ring (got %s)",
            p->cp_a2a, CP_COMMS[p->cp_comm]);
    REQUIRE(p->cp_comm != CP_A2A_RING ||
                (p->cp_a2a > 1 && p->cp_a2a < p->cp && p->cp % p->cp_a2a == 0),
            "parallel.cp_comm: a2a+ring needs parallel.cp_a2a (%d) between 2 and parallel.cp / 2 "
            "and dividing parallel.cp (%d): Ulysses over cp_a2a ranks, the ring across cp / cp_a2a "
            "groups",
            p->cp_a2a, p->cp);
    if (p->cp > 1 && (p->cp_comm == CP_A2A || p->cp_comm == CP_A2A_RING)) {
        int a = cfg_cp_a2a(c), h = m->n_head / p->tp, kv = m->n_kv_head / p->tp;
        REQUIRE(h % a == 0,
                "parallel.cp_comm: %s splits the attention heads over %d ranks, but this rank's "
                "heads (model.n_head %d / parallel.tp %d = %d) are not divisible by %d",
                CP_COMMS[p->cp_comm], a, m->n_head, p->tp, h, a);
        REQUIRE(kv % a == 0 || a % kv == 0,
                "parallel.cp_comm: %s needs this rank's key/value heads (model.n_kv_head %d / "
                "parallel.tp %d = %d) to divide by %d or to divide %d (then each is replicated "
                "over %d / %d ranks)",
                CP_COMMS[p->cp_comm], m->n_kv_head, p->tp, kv, a, a, a, kv);
    }
    REQUIRE(p->dp % p->ep == 0,
            "parallel.dp (%d) must be divisible by parallel.ep (%d): expert-parallel groups are "
            "carved out of the data-parallel ranks",
            p->dp, p->ep);
    return 0;
}

static int cfg_validate_train(const ust_config *c, ust_err *e) {
    long long per_step = (long long)c->train.micro_batch_size * c->parallel.dp;
    REQUIRE(c->train.global_batch_size % per_step == 0,
            "train.global_batch_size (%d) must be divisible by train.micro_batch_size * "
            "parallel.dp (%d * %d = %lld)",
            c->train.global_batch_size, c->train.micro_batch_size, c->parallel.dp, per_step);
    REQUIRE(c->optimizer.min_lr <= c->optimizer.lr,
            "optimizer.min_lr (%g) must be <= optimizer.lr (%g)", c->optimizer.min_lr,
            c->optimizer.lr);
    REQUIRE(c->data.train[0], "data.train is empty: it must name the training shards (a glob)");
    REQUIRE(c->data.eot_id < c->model.vocab_size,
            "data.eot_id (%d) must be a token of the vocabulary, below model.vocab_size (%d)",
            c->data.eot_id, c->model.vocab_size);
    REQUIRE(c->checkpoint.dir[0], "checkpoint.dir is empty%s",
            c->checkpoint.async ? " (checkpoint.async writes checkpoints there)" : "");
    return 0;
}

/* Sizes derived from several keys, computed in double so the products cannot wrap: the memory
 * plan, the parameter table and the step loop compute them in 64 bits (token counts in 32), and
 * these bounds keep every such product exact. The estimates are generous upper bounds (no
 * parallel split, more saved rows per token than any layer keeps), so a layout the plan counts
 * exactly is never refused here for want of precision. */
static int cfg_validate_sizes(const ust_config *c, ust_err *e) {
    const __typeof__(c->model) *m = &c->model;
    const __typeof__(c->parallel) *p = &c->parallel;
    double tokens = (double)c->train.micro_batch_size * c->train.seq_len;
    REQUIRE(tokens <= CFG_MAX_TOKENS,
            "train.micro_batch_size x train.seq_len = %d x %d = %.0f tokens per micro-batch; at "
            "most %d",
            c->train.micro_batch_size, c->train.seq_len, tokens, CFG_MAX_TOKENS);
    double ranks = (double)p->dp * p->tp * p->pp * p->cp;
    REQUIRE(ranks <= CFG_MAX_WORLD,
            "parallel.dp x tp x pp x cp = %d x %d x %d x %d = %.0f ranks; at most %d", p->dp, p->tp,
            p->pp, p->cp, ranks, CFG_MAX_WORLD);
    double C = m->d_model, F = m->d_ff, V = cfg_vocab_padded(c), L = m->n_layer;
    double E = m->moe.num_experts, Fe = m->moe.d_ff_expert, k = m->moe.top_k;
    /* a layer: attention (at most 4 C x C, kv heads being at most the heads) and the MLP (3 C x
     * F); with experts, each of them and a shared one (3 C x Fe) and the router */
    double layer = 4 * C * C + 3 * C * F + (E > 0 ? (E + 1) * 3 * C * Fe + E * C : 0);
    double params = L * layer + 2 * V * C + (double)m->max_seq_len * C;
    REQUIRE(params <= (double)CFG_MAX_PARAMS,
            "the model would have about %.3g parameters (model.n_layer %d, d_model %d, d_ff %d, "
            "vocab_size %d, moe.num_experts %d x d_ff_expert %d); at most 2^42 = %.3g",
            params, m->n_layer, m->d_model, m->d_ff, m->vocab_size, m->moe.num_experts,
            m->moe.d_ff_expert, (double)CFG_MAX_PARAMS);
    /* fp32 bytes per token of one micro-batch: every layer's saved rows of width C, F and k x
     * (C + Fe), the logits; a pipeline holds up to every micro-batch of the step at once */
    double per_token =
        4 * (L * (32 * C + 16 * F + (E > 0 ? 16 * k * (C + Fe) + 4 * E : 0)) + 16 * V);
    double in_flight =
        p->pp > 1 ? (double)c->train.global_batch_size / c->train.micro_batch_size : 1;
    double acts = tokens * per_token * in_flight;
    REQUIRE(acts <= (double)CFG_MAX_ACT_BYTES,
            "activations would take about %.3g bytes (%.0f tokens per micro-batch = "
            "train.micro_batch_size x seq_len, x %.0f micro-batches in flight, through "
            "model.n_layer %d layers of d_model %d, d_ff %d, and vocab %.0f); at most 2^56 = "
            "%.3g",
            acts, tokens, in_flight, m->n_layer, m->d_model, m->d_ff, V, (double)CFG_MAX_ACT_BYTES);
    return 0;
}

/* More compute threads than cores only time-slice, and far more (train.threads: 100000) hang
 * inside OpenBLAS's thread setup: on the CPU backend (the only one that reads train.threads), at
 * most 4 per online CPU of this machine (hyperthreads and a busy machine aside, more never
 * helps); the table's range caps it at CFG_MAX_THREADS on any machine. */
static int cfg_validate_threads(const ust_config *c, ust_err *e) {
    if (c->run.device != DEV_CPU) return 0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long limit = cpus > 0 && 4 * cpus < CFG_MAX_THREADS ? 4 * cpus : CFG_MAX_THREADS;
    REQUIRE(c->train.threads <= limit,
            "train.threads (%d) must be at most %ld (4 x the %ld online CPUs, at most %d; 0 = one "
            "per core)",
            c->train.threads, limit, cpus, CFG_MAX_THREADS);
    return 0;
}

static int cfg_validate_world(const ust_config *c, int world, ust_err *e) {
    const __typeof__(c->parallel) *p = &c->parallel;
    long long product = (long long)p->dp * p->tp * p->pp * p->cp;
    REQUIRE(world <= 0 || world == product,
            "world size (%d) must equal parallel.dp * tp * pp * cp (%d * %d * %d * %d = %lld)",
            world, p->dp, p->tp, p->pp, p->cp, product);
    return 0;
}

#undef REQUIRE

int cfg_resolve_auto(ust_config *c, int world, ust_err *e) {
    if (c->parallel.dp != 0 || world <= 0) return 0;
    int64_t rest = (int64_t)c->parallel.tp * c->parallel.pp * c->parallel.cp;
    if (world % rest)
        return cfg_vfail(c, e,
                         "parallel.dp: auto: the world of %d ranks is not a multiple of tp x pp "
                         "x cp = %lld",
                         world, (long long)rest);
    int dp = (int)(world / rest), mb = c->train.micro_batch_size;
    int64_t G = c->train.global_batch_size;
    if (G % ((int64_t)mb * dp))
        return cfg_vfail(c, e,
                         "parallel.dp: auto gives dp = %d on %d ranks, which does not divide "
                         "the %lld micro-batches of %d in train.global_batch_size = %lld (the "
                         "global batch stays fixed across restarts: use a world where it does)",
                         dp, world, (long long)(G / mb), mb, (long long)G);
    c->parallel.dp = dp;
    return 0;
}

int cfg_validate(const ust_config *c, int world, ust_err *e) {
    if (c->parallel.dp == 0)
        return cfg_vfail(c, e,
                         "parallel.dp: auto needs the world size (the launcher's when training; "
                         "--world N for validate and plan)");
    for (size_t i = 0; i < N_KEYS; i++) {
        char why[1024];
        if (cfg_check_value(c, &cfg_keys[i], why, sizeof why))
            return cfg_vfail(c, e, "%s: %s", cfg_keys[i].path, why);
    }
    if (cfg_validate_model(c, e) || cfg_validate_sizes(c, e) || cfg_validate_parallel(c, e) ||
        cfg_validate_train(c, e) || cfg_validate_threads(c, e) || cfg_validate_world(c, world, e))
        return -1;
    return 0;
}

/* ---------------------------------------------------------------- dump */

/* Double-quoted YAML string; every byte libyaml would not take literally is escaped. */
static void cfg_dump_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            fprintf(f, "\\x%02x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

/* The shortest text that reads back to exactly v, so the dump round-trips; whole numbers keep a
 * ".0" (10000.0, not 1e+04) so they read as floats. */
static void cfg_dump_double(FILE *f, double v) {
    char buf[64];
    if (v == floor(v) && fabs(v) < 1e15) {
        fprintf(f, "%.1f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    fputs(buf, f);
}

static void cfg_dump_value(FILE *f, const ust_config *c, const cfg_key *k) {
    const char *p = (const char *)c + k->off;
    int i;
    int64_t l;
    uint64_t u;
    double d;
    bool b;
    switch (k->kind) {
    case K_INT:
        memcpy(&i, p, sizeof i);
        if (i == 0 && (k->flags & AUTO))
            fputs("auto", f);
        else
            fprintf(f, "%d", i);
        break;
    case K_I64:
        memcpy(&l, p, sizeof l), fprintf(f, "%" PRId64, l);
        break;
    case K_U64:
        memcpy(&u, p, sizeof u), fprintf(f, "%" PRIu64, u);
        break;
    case K_DBL:
        memcpy(&d, p, sizeof d), cfg_dump_double(f, d);
        break;
    case K_BOOL:
        memcpy(&b, p, sizeof b), fputs(b ? "true" : "false", f);
        break;
    case K_ENUM:
        memcpy(&i, p, sizeof i), fputs(k->names[i], f);
        break;
    case K_STR:
    case K_DATA:
        if (!p[0] && (k->flags & NULLABLE))
            fputs("null", f);
        else if (k->kind == K_DATA && cfg_is_blend_text(p))
            fputs(p, f); /* canonical flow YAML already */
        else
            cfg_dump_string(f, p);
        break;
    case K_LIST:
        if (!p[0]) {
            fputs("null", f);
            break;
        }
        fputc('[', f);
        for (const char *q = p; *q; q++) *q == ',' ? fputs(", ", f) : fputc(*q, f);
        fputc(']', f);
        break;
    }
}

/* Opens the sections of sec (n chars) that prev (pn chars) does not share: prev "model",
 * sec "model.moe" prints "  moe:". */
static void cfg_dump_sections(FILE *f, const char *prev, size_t pn, const char *sec, size_t n) {
    size_t same = 0; /* length of the shared leading components */
    for (size_t i = 0; i <= n && i <= pn; i++) {
        bool end = i == n || sec[i] == '.', pend = i == pn || prev[i] == '.';
        if (end && pend) {
            same = i;
            continue;
        }
        if (end || pend || sec[i] != prev[i]) break;
    }
    int depth = 0;
    for (size_t i = 0; i < same; i++) depth += sec[i] == '.';
    depth += same > 0;
    for (size_t s = same ? same + 1 : 0; s < n; depth++) {
        size_t len = strcspn(sec + s, ".");
        if (s + len > n) len = n - s;
        fprintf(f, "%*s%.*s:\n", 2 * depth, "", (int)len, sec + s);
        s += len + 1;
    }
}

void cfg_dump(const ust_config *c, FILE *f) {
    fprintf(f, "# ustrain effective config%s%s\n", c->source[0] ? " from " : "", c->source);
    const char *prev = "";
    size_t pn = 0;
    for (size_t i = 0; i < N_KEYS; i++) {
        const cfg_key *k = &cfg_keys[i];
        const char *leaf = cfg_leaf_name(k->path);
        size_t n = (size_t)(leaf - 1 - k->path);
        cfg_dump_sections(f, prev, pn, k->path, n);
        int depth = 0;
        for (const char *s = k->path; *s; s++) depth += *s == '.';
        fprintf(f, "%*s%s: ", 2 * depth, "", leaf);
        cfg_dump_value(f, c, k);
        fputc('\n', f);
        prev = k->path, pn = n;
    }
}

/* ---------------------------------------------------------------- derived values */

int cfg_vocab_padded(const ust_config *c) {
    int64_t v = c->model.vocab_size, pad = c->model.vocab_pad; /* in range: < 2^24 + 2^16 */
    return (int)(pad > 0 ? (v + pad - 1) / pad * pad : v);
}

int cfg_grad_accum(const ust_config *c) {
    long long per_step = (long long)c->train.micro_batch_size * c->parallel.dp;
    return per_step > 0 ? (int)(c->train.global_batch_size / per_step) : 0;
}

int cfg_cp_a2a(const ust_config *c) {
    switch (c->parallel.cp_comm) {
    case CP_A2A:
        return c->parallel.cp;
    case CP_A2A_RING:
        return c->parallel.cp_a2a;
    default:
        return 1;
    }
}

int cfg_head_dim(const ust_config *c) {
    return c->model.n_head > 0 ? c->model.d_model / c->model.n_head : 0;
}

bool cfg_tied(const ust_config *c) { return c->model.arch == ARCH_GPT2 || c->model.tie_embeddings; }

int cfg_act_size(const ust_config *c) {
    return c->run.device == DEV_CUDA && c->train.precision == PREC_BF16 ? 2 : 4;
}

int cfg_pp_layers(const ust_config *c, int *per) {
    int n = 0;
    for (const char *q = c->parallel.pp_layers; *q && n < CFG_MAX_STAGES; n++) {
        per[n] = atoi(q);
        q = strchr(q, ',');
        if (!q) {
            n++;
            break;
        }
        q++;
    }
    return n;
}

int cfg_pp_stages(const ust_config *c) {
    return c->parallel.pp_schedule == PP_DUALPIPE && c->parallel.pp > 1
               ? c->parallel.pp
               : c->parallel.pp * c->parallel.vpp;
}

void cfg_stage_layers(const ust_config *c, int stage, int *lo, int *hi) {
    int S = cfg_pp_stages(c), per[CFG_MAX_STAGES];
    if (!c->parallel.pp_layers[0]) {
        *lo = stage * (c->model.n_layer / S);
        *hi = *lo + c->model.n_layer / S;
        return;
    }
    cfg_pp_layers(c, per);
    *lo = 0;
    for (int i = 0; i < stage; i++) *lo += per[i];
    *hi = *lo + per[stage];
}
