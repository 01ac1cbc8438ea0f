/* config_schema: the key table (every key's field, type, default and range), key lookup,
 * cfg_defaults and cfg_dump. Defaults, loading, --set, the range part of cfg_validate and cfg_dump
 * all walk that table, so adding a key is one line here. */
#include "config_internal.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the key table */

static const char *const DEVICES[] = {"cpu", "cuda", NULL};
static const char *const ARCHS[] = {"gpt2", "llama", "auto", NULL};
static const char *const ROPE_SCALINGS[] = {"none", "llama3", "yarn", "linear", NULL};
static const char *const HIDDEN_ACTS[] = {"silu", "gelu_tanh", NULL};
const char *const cfg_pp_schedule_names[] = {"afab",      "1f1b",     "interleaved", "zb",
                                             "dualpipev", "dualpipe", NULL};
static const char *const CP_LAYOUTS[] = {"zigzag", "contiguous", NULL};
const char *const cfg_cp_comm_names[] = {"ring", "allgather", "a2a", "a2a+ring", NULL};
static const char *const PRECISIONS[] = {"fp32", "bf16", NULL};
static const char *const RECOMPUTES[] = {"none", "selective", "full", NULL};
static const char *const ON_NANS[] = {"stop", "skip", NULL};
static const char *const ON_SPIKES[] = {"none", "skip", "rewind", NULL};
static const char *const OPTIMIZERS[] = {"adamw", "muon", NULL};
static const char *const MUON_SCALES[] = {"moonlight", "original", NULL};
static const char *const STATE_DTYPES[] = {"fp32", "bf16", NULL};
static const char *const PACKINGS[] = {"concat", "first_fit", NULL};
static const char *const OVERLONGS[] = {"split", "drop", NULL};
static const char *const LR_SCHEDULES[] = {"cosine", "linear", "constant", "wsd", NULL};
/* a group's: LR_SCHEDULES' and "same" (CFG_SCHED_SAME), the optimizer's */
static const char *const GROUP_SCHEDULES[] = {"cosine", "linear", "constant", "wsd", "same", NULL};
const char *const cfg_data_format_names[] = {"llmc", "nanogpt", "megatron", NULL};
static const char *const MOE_SCORES[] = {"softmax", "sigmoid", NULL};

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
const cfg_key cfg_keys[] = {
    STR("run.name", run.name, "tiny", 0),
    U64("run.seed", run.seed, "1234"),
    ENUM("run.device", run.device, "cpu", DEVICES),
    STR("run.out_dir", run.out_dir, "runs/tiny", 0),
    DBL("run.memory_limit_mb", run.memory_limit_mb, "0", 0, INFINITY, 0),
    BOOL("run.deterministic", run.deterministic, "true"),

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
    BOOL("model.qk_norm", model.qk_norm, "false"),
    BOOL("model.qk_norm_whole", model.qk_norm_whole, "false"),
    BOOL("model.post_norm", model.post_norm, "false"),
    DBL("model.partial_rotary_factor", model.partial_rotary_factor, "1", 0, 1, LO_OPEN),
    LIST("model.sliding_window", model.sliding_window, 1 << 24),
    INTR("model.head_dim", model.head_dim, "0", 0, 1 << 16),
    ENUM("model.hidden_act", model.gemma.hidden_act, "silu", HIDDEN_ACTS),
    BOOL("model.norm_offset", model.gemma.norm_offset, "false"),
    BOOL("model.sandwich_norm", model.gemma.sandwich_norm, "false"),
    BOOL("model.embed_scale", model.gemma.embed_scale, "false"),
    DBL("model.query_pre_attn_scalar", model.gemma.query_pre_attn_scalar, "0", 0, 1e9, 0),
    DBL("model.rope_local_theta", model.gemma.rope_local_theta, "0", 0, INFINITY, 0),
    DBL("model.attn_softcap", model.gemma.attn_softcap, "0", 0, 1e9, 0),
    DBL("model.final_softcap", model.gemma.final_softcap, "0", 0, 1e9, 0),
    BOOL("model.allow_nonfinite", model.allow_nonfinite, "false"),
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
    INTR("model.moe.first_dense", model.moe.first_dense, "0", 0, 4096),
    {"model.moe.layers", K_LIST, AT(model.moe.layers), "null", 0, 1, NULLABLE, NULL}, /* 0/1 */
    ENUM("model.moe.score", model.moe.score, "softmax", MOE_SCORES),
    BOOL("model.moe.norm_topk", model.moe.norm_topk, "true"),
    INTR("model.moe.n_group", model.moe.n_group, "1", 1, 4096),
    INTR("model.moe.topk_group", model.moe.topk_group, "1", 1, 4096),
    DBL("model.moe.routed_scale", model.moe.routed_scale, "1", 0, 1e6, LO_OPEN),
    INTR("model.moe.shared_d_ff", model.moe.shared_d_ff, "0", 0, 1 << 22),
    INTR("model.moe.max_nodes_per_token", model.moe.max_nodes_per_token, "0", 0, 64),
    ENUM("model.rope_scaling.type", model.rope_scaling.type, "none", ROPE_SCALINGS),
    DBL("model.rope_scaling.factor", model.rope_scaling.factor, "8", 1, 1e6, 0),
    DBL("model.rope_scaling.low_freq_factor", model.rope_scaling.low_freq_factor, "1", 0, 1e6,
        LO_OPEN),
    DBL("model.rope_scaling.high_freq_factor", model.rope_scaling.high_freq_factor, "4", 0, 1e6,
        LO_OPEN),
    INTR("model.rope_scaling.original_max_position_embeddings",
         model.rope_scaling.original_max_position_embeddings, "8192", 1, 1 << 24),
    DBL("model.rope_scaling.beta_fast", model.rope_scaling.beta_fast, "32", 0, 1e6, LO_OPEN),
    DBL("model.rope_scaling.beta_slow", model.rope_scaling.beta_slow, "1", 0, 1e6, LO_OPEN),
    DBL("model.rope_scaling.attention_factor", model.rope_scaling.attention_factor, "0", 0, 1e6, 0),
    BOOL("model.rope_scaling.truncate", model.rope_scaling.truncate, "true"),
    INTR("model.mtp.depth", model.mtp.depth, "0", 0, 4),
    DBL("model.mtp.loss_weight", model.mtp.loss_weight, "0.3", 0, 1e6, LO_OPEN),
    BOOL("model.mla.enabled", model.mla.enabled, "false"),
    INTR("model.mla.q_lora_rank", model.mla.q_lora_rank, "0", 0, 1 << 20),
    INTR("model.mla.kv_lora_rank", model.mla.kv_lora_rank, "0", 0, 1 << 20),
    INTR("model.mla.qk_nope_head_dim", model.mla.qk_nope_head_dim, "32", 1, 1 << 16),
    INTR("model.mla.qk_rope_head_dim", model.mla.qk_rope_head_dim, "16", 2, 1 << 16),
    INTR("model.mla.v_head_dim", model.mla.v_head_dim, "32", 1, 1 << 16),
    BOOL("model.mla.rope_interleave", model.mla.rope_interleave, "true"),
    DBL("model.mla.mscale_all_dim", model.mla.mscale_all_dim, "0", 0, 1e6, 0),
    BOOL("model.mla.cp_latent", model.mla.cp_latent, "true"),

    {"parallel.dp", K_INT, AT(parallel.dp), "1", 1, CFG_MAX_WORLD, AUTO, NULL},
    INTR("parallel.tp", parallel.tp, "1", 1, CFG_MAX_WORLD),
    INTR("parallel.pp", parallel.pp, "1", 1, 4096),
    INTR("parallel.cp", parallel.cp, "1", 1, CFG_MAX_WORLD),
    INTR("parallel.ep", parallel.ep, "1", 1, 4096),
    BOOL("parallel.sp", parallel.sp, "false"),
    INT("parallel.vpp", parallel.vpp, "1", 1),
    ENUM("parallel.pp_schedule", parallel.pp_schedule, "1f1b", cfg_pp_schedule_names),
    BOOL("parallel.pp_breadth_first", parallel.pp_breadth_first, "false"),
    BOOL("parallel.tp_across_nodes", parallel.tp_across_nodes, "false"),
    LIST("parallel.pp_layers", parallel.pp_layers, 4096), /* each at most model.n_layer */
    ENUM("parallel.cp_layout", parallel.cp_layout, "zigzag", CP_LAYOUTS),
    ENUM("parallel.cp_comm", parallel.cp_comm, "ring", cfg_cp_comm_names),
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
    INTR("train.max_rewinds", train.max_rewinds, "3", 0, 1 << 20),
    INTR("train.threads", train.threads, "0", 0, CFG_MAX_THREADS),
    DBL("train.exit_after_min", train.exit_after_min, "0", 0, 1e9, 0),
    I64("train.stop_at_step", train.stop_at_step, "0", 0),
    INT("train.batch_ramp.start", train.batch_ramp.start, "0", 0),
    INT("train.batch_ramp.increment", train.batch_ramp.increment, "0", 0),
    I64("train.batch_ramp.tokens", train.batch_ramp.tokens, "0", 0),
    BOOL("train.batch_ramp.sqrt_lr", train.batch_ramp.sqrt_lr, "false"),
    I64("train.seq_len_warmup.start", train.seq_len_warmup.start, "0", 0),
    I64("train.seq_len_warmup.tokens", train.seq_len_warmup.tokens, "0", 0),

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
    DBL("optimizer.momentum", optimizer.momentum, "0.95", 0, 1, HI_OPEN),
    BOOL("optimizer.nesterov", optimizer.nesterov, "true"),
    INTR("optimizer.ns_steps", optimizer.ns_steps, "5", 1, 20),
    ENUM("optimizer.muon_scale", optimizer.muon_scale, "moonlight", MUON_SCALES),
    DBL("optimizer.adamw_lr", optimizer.adamw_lr, "0", 0, INFINITY, 0),
    BOOL("optimizer.muon_routers", optimizer.muon_routers, "false"),
    BOOL("optimizer.reset_state", optimizer.reset_state, "false"),
    ENUM("optimizer.state_dtype", optimizer.state_dtype, "fp32", STATE_DTYPES),
    DBL("optimizer.qk_clip_threshold", optimizer.qk_clip_threshold, "0", 0, INFINITY, 0),
    DBL("optimizer.embed_lr", optimizer.embed_lr, "0", 0, INFINITY, 0),
    DBL("optimizer.norm_lr", optimizer.norm_lr, "0", 0, INFINITY, 0),
    ENUM("optimizer.embed.schedule", optimizer.embed.schedule, "same", GROUP_SCHEDULES),
    INT("optimizer.embed.warmup_steps", optimizer.embed.warmup_steps, "-1", -1),
    DBL("optimizer.embed.min_lr", optimizer.embed.min_lr, "-1", -1, INFINITY, 0),
    DBL("optimizer.embed.weight_decay", optimizer.embed.weight_decay, "-1", -1, INFINITY, 0),
    ENUM("optimizer.norm.schedule", optimizer.norm.schedule, "same", GROUP_SCHEDULES),
    INT("optimizer.norm.warmup_steps", optimizer.norm.warmup_steps, "-1", -1),
    DBL("optimizer.norm.min_lr", optimizer.norm.min_lr, "-1", -1, INFINITY, 0),
    DBL("optimizer.norm.weight_decay", optimizer.norm.weight_decay, "0", -1, INFINITY, 0),

    ENUM("data.format", data.format, "llmc", cfg_data_format_names),
    DATASETS("data.train", data.train, "data/tiny/train_*.bin", 0),
    DATASETS("data.val", data.val, "data/tiny/val_*.bin", NULLABLE),
    BOOL("data.shuffle", data.shuffle, "false"),
    INT("data.val_every", data.val_every, "25", 0),
    INT("data.val_steps", data.val_steps, "4", 1),
    INTR("data.val_samples", data.val_samples, "0", 0, 1 << 24),
    {"data.val_tokens", K_I64, AT(data.val_tokens), "0", 0, 0x1p40, 0, NULL},
    BOOL("data.allow_reweight", data.allow_reweight, "false"),
    BOOL("data.doc_mask", data.doc_mask, "false"),
    BOOL("data.reset_positions", data.reset_positions, "false"),
    INTR("data.eot_id", data.eot_id, "-1", -1, (1 << 24) - 1),
    ENUM("data.packing", data.packing, "concat", PACKINGS),
    INT("data.pack_buffer", data.pack_buffer, "1000", 1),
    ENUM("data.overlong", data.overlong, "split", OVERLONGS),

    STR("checkpoint.dir", checkpoint.dir, "runs/tiny/ckpt", 0),
    INT("checkpoint.every", checkpoint.every, "25", 0),
    INT("checkpoint.keep_last", checkpoint.keep_last, "2", 0),
    STR("checkpoint.resume", checkpoint.resume, "auto", 0),
    BOOL("checkpoint.async", checkpoint.async, "false"),

    INT("logging.every", logging.every, "1", 1),
    STR("logging.metrics_file", logging.metrics_file, "runs/tiny/metrics.jsonl", 0),
    STR("logging.tensorboard_dir", logging.tensorboard_dir, "null", NULLABLE),
    DBL("logging.peak_flops", logging.peak_flops, "0", 0, INFINITY, 0),
    BOOL("logging.strict", logging.strict, "false"),
    INTR("logging.flight_entries", logging.flight_entries, "2048", 0, 1 << 20),
    DBL("logging.straggler_ratio", logging.straggler_ratio, "1.2", 1, INFINITY, 0),
    LIST("logging.trace.steps", logging.trace_steps, 1e9),
    STR("logging.trace.dir", logging.trace_dir, "null", NULLABLE),
    INTR("logging.stats_every", logging.stats_every, "0", 0, 1 << 30),
    DBL("logging.stats_spike", logging.stats_spike, "10", 1, INFINITY, 0),

    DBL("dist.timeout_s", dist.timeout_s, "300", 1, 1e6, 0), /* below a second: every wait fails */

    {"eval.tasks", K_TASKS, AT(eval.tasks), "null", 0, 0, NULLABLE, NULL},
    STR("eval.tokenizer", eval.tokenizer, "null", NULLABLE),
};

#define N_KEYS (sizeof cfg_keys / sizeof cfg_keys[0])
_Static_assert(N_KEYS <= 64 * sizeof(((ust_config *)0)->set_bits) / sizeof(uint64_t),
               "ust_config.set_bits needs a bit per key");

const size_t cfg_n_keys = N_KEYS;

void cfg_mark_set(ust_config *c, const cfg_key *k) {
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

const cfg_key *cfg_find_key(const char *path) {
    for (size_t i = 0; i < N_KEYS; i++)
        if (strcmp(cfg_keys[i].path, path) == 0) return &cfg_keys[i];
    return NULL;
}

/* A section is a path that is a proper prefix (up to a '.') of some key. */
bool cfg_is_section(const char *path) {
    size_t n = strlen(path);
    for (size_t i = 0; i < N_KEYS; i++)
        if (strncmp(cfg_keys[i].path, path, n) == 0 && cfg_keys[i].path[n] == '.') return true;
    return false;
}

static const char *cfg_leaf_name(const char *path) {
    const char *dot = strrchr(path, '.');
    return dot ? dot + 1 : path;
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
    case K_TASKS:
        fputs(p[0] ? p : "null", f); /* canonical flow YAML already */
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
