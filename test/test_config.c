/* test_config: the YAML config loader, --set, cross-field validation and the dump round trip.
 * Error tests check the exact file:line:col (1-based, from libyaml marks) and the message. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "test.h"

/* Messages pass through an opaque pointer so that -Wformat-truncation does not size them. */
__attribute__((noinline)) static const char *txt(const char *s) { return s; }

/* docs/design.md section 1, verbatim: it must load to exactly the defaults. */
static const char *DESIGN_YAML =
    "run:        {name: tiny, seed: 1234, device: cpu, out_dir: runs/tiny}\n"
    "model:      {arch: llama, n_layer: 4, d_model: 128, n_head: 4, n_kv_head: 2, d_ff: 384,\n"
    "             vocab_size: 512, max_seq_len: 256, rope_theta: 10000, tie_embeddings: false,\n"
    "             init_from: null,   # e.g. an llm.c gpt2_124M.bin\n"
    "             moe: {num_experts: 0, top_k: 2, d_ff_expert: 128, every: 1, shared_expert: "
    "false,\n"
    "                   aux_loss_coef: 0.01, z_loss_coef: 0.0, capacity_factor: 0}}\n"
    "parallel:   {dp: 1, tp: 1, pp: 1, cp: 1, ep: 1, sp: false, vpp: 1, pp_schedule: 1f1b,\n"
    "             cp_layout: zigzag, cp_comm: ring, cp_a2a: 0, dp_bucket_mb: 25}\n"
    "train:      {steps: 50, seq_len: 128, micro_batch_size: 4, global_batch_size: 8,\n"
    "             precision: fp32, recompute: none, grad_clip: 1.0, on_nan: stop}\n"
    "optimizer:  {name: adamw, zero_stage: 0, lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 5,\n"
    "             schedule: cosine, beta1: 0.9, beta2: 0.95, eps: 1.0e-8, weight_decay: 0.1}\n"
    "data:       {format: llmc, train: \"data/tiny/train_*.bin\", val: \"data/tiny/val_*.bin\",\n"
    "             shuffle: false, val_every: 25, val_steps: 4}\n"
    "checkpoint: {dir: runs/tiny/ckpt, every: 25, keep_last: 2, resume: auto}\n"
    "logging:    {every: 1, metrics_file: runs/tiny/metrics.jsonl}\n"
    "dist:       {timeout_s: 300}\n";

/* Every key set to a value other than its default (checked by the round-trip test). */
static const char *ALL_CHANGED_YAML = "run:\n"
                                      "  name: \"my run: \\\"quoted\\\" \\\\ back\"\n"
                                      "  seed: 18446744073709551615\n"
                                      "  device: cuda\n"
                                      "  out_dir: 'runs/it''s here'\n"
                                      "  memory_limit_mb: 512\n"
                                      "  deterministic: false\n"
                                      "model:\n"
                                      "  arch: gpt2\n"
                                      "  n_layer: 12\n"
                                      "  d_model: 768\n"
                                      "  n_head: 12\n"
                                      "  n_kv_head: 12\n"
                                      "  d_ff: 3072\n"
                                      "  vocab_size: 50257\n"
                                      "  vocab_pad: 64\n"
                                      "  max_seq_len: 1024\n"
                                      "  rope_theta: 500000.5\n"
                                      "  norm_eps: 1.0e-6\n"
                                      "  tie_embeddings: true\n"
                                      "  qkv_bias: true\n"
                                      "  qk_norm: true\n"
                                      "  qk_norm_whole: true\n"
                                      "  post_norm: true\n"
                                      "  partial_rotary_factor: 0.5\n"
                                      "  sliding_window: [512]\n"
                                      "  head_dim: 64\n"
                                      "  hidden_act: gelu_tanh\n"
                                      "  norm_offset: true\n"
                                      "  sandwich_norm: true\n"
                                      "  embed_scale: true\n"
                                      "  query_pre_attn_scalar: 128\n"
                                      "  rope_local_theta: 10000\n"
                                      "  attn_softcap: 50\n"
                                      "  final_softcap: 30\n"
                                      "  allow_nonfinite: true\n"
                                      "  init_from: gpt2_124M.bin\n"
                                      "  mtp:\n"
                                      "    depth: 2\n"
                                      "    loss_weight: 0.5\n"
                                      "  moe:\n"
                                      "    num_experts: 8\n"
                                      "    top_k: 4\n"
                                      "    d_ff_expert: 256\n"
                                      "    every: 2\n"
                                      "    shared_expert: true\n"
                                      "    aux_loss_coef: 0.001\n"
                                      "    z_loss_coef: 1e-3\n"
                                      "    capacity_factor: 1.25\n"
                                      "    bias_update_rate: 0.5\n"
                                      "    grouped_gemm: false\n"
                                      "    seq_aux_loss_coef: 0.25\n"
                                      "    first_dense: 1\n"
                                      "    layers: [0, 1]\n"
                                      "    score: sigmoid\n"
                                      "    norm_topk: false\n"
                                      "    n_group: 2\n"
                                      "    topk_group: 2\n"
                                      "    routed_scale: 2.5\n"
                                      "    shared_d_ff: 64\n"
                                      "    max_nodes_per_token: 2\n"
                                      "  rope_scaling:\n"
                                      "    type: llama3\n"
                                      "    factor: 32\n"
                                      "    low_freq_factor: 2\n"
                                      "    high_freq_factor: 8\n"
                                      "    original_max_position_embeddings: 4096\n"
                                      "    beta_fast: 16\n"
                                      "    beta_slow: 2\n"
                                      "    attention_factor: 1.5\n"
                                      "    truncate: false\n"
                                      "  mla:\n"
                                      "    enabled: true\n"
                                      "    q_lora_rank: 96\n"
                                      "    kv_lora_rank: 64\n"
                                      "    qk_nope_head_dim: 24\n"
                                      "    qk_rope_head_dim: 8\n"
                                      "    v_head_dim: 16\n"
                                      "    rope_interleave: false\n"
                                      "    mscale_all_dim: 0.5\n"
                                      "    cp_latent: false\n"
                                      "parallel:\n"
                                      "  dp: 4\n"
                                      "  tp: 2\n"
                                      "  pp: 2\n"
                                      "  cp: 2\n"
                                      "  ep: 2\n"
                                      "  sp: true\n"
                                      "  vpp: 2\n"
                                      "  pp_schedule: interleaved\n"
                                      "  pp_breadth_first: true\n"
                                      "  tp_across_nodes: true\n"
                                      "  pp_layers: [4, 2, 3, 3]\n"
                                      "  cp_layout: contiguous\n"
                                      "  cp_comm: allgather\n"
                                      "  cp_a2a: 2\n"
                                      "  dp_bucket_mb: 0.1\n"
                                      "  zero3_vocab_chunk_rows: 64\n"
                                      "train:\n"
                                      "  steps: 123456789012\n"
                                      "  seq_len: 1024\n"
                                      "  micro_batch_size: 2\n"
                                      "  global_batch_size: 64\n"
                                      "  precision: bf16\n"
                                      "  recompute: selective\n"
                                      "  grad_clip: -1\n"
                                      "  on_nan: skip\n"
                                      "  on_spike: rewind\n"
                                      "  spike_zscore: 4.5\n"
                                      "  spike_window: 64\n"
                                      "  max_rewinds: 5\n"
                                      "  threads: 3\n"
                                      "  exit_after_min: 237.5\n"
                                      "  stop_at_step: 1000\n"
                                      "  batch_ramp: {start: 16, increment: 8, tokens: 99999, sqrt_lr: true}\n"
                                      "  seq_len_warmup: {start: 256, tokens: 123456}\n"
                                      "optimizer:\n"
                                      "  name: adamw\n"
                                      "  zero_stage: 3\n"
                                      "  lr: 6e-4\n"
                                      "  min_lr: 0.3333333333333333\n"
                                      "  warmup_steps: 700\n"
                                      "  schedule: wsd\n"
                                      "  decay_frac: 0.1\n"
                                      "  beta1: 0.8\n"
                                      "  beta2: 0.999\n"
                                      "  eps: 1e-10\n"
                                      "  weight_decay: 0\n"
                                      "  momentum: 0.9\n"
                                      "  nesterov: false\n"
                                      "  ns_steps: 7\n"
                                      "  muon_scale: original\n"
                                      "  adamw_lr: 1e-3\n"
                                      "  muon_routers: true\n"
                                      "  reset_state: true\n"
                                      "  state_dtype: bf16\n"
                                      "  qk_clip_threshold: 2.5\n"
                                      "  embed_lr: 1e-3\n"
                                      "  norm_lr: 2e-3\n"
                                      "  embed: {schedule: constant, warmup_steps: 3, min_lr: 1e-5, weight_decay: 0}\n"
                                      "  norm: {schedule: linear, warmup_steps: 0, min_lr: 2e-5, weight_decay: 0.01}\n"
                                      "data:\n"
                                      "  format: megatron\n"
                                      "  train: /data/a b/train_*.bin\n"
                                      "  val: ~\n"
                                      "  shuffle: true\n"
                                      "  val_every: 0\n"
                                      "  val_steps: 9\n"
                                      "  val_samples: 12\n"
                                      "  val_tokens: 4096\n"
                                      "  allow_reweight: true\n"
                                      "  doc_mask: true\n"
                                      "  reset_positions: true\n"
                                      "  eot_id: 50256\n"
                                      "  packing: first_fit\n"
                                      "  pack_buffer: 64\n"
                                      "  overlong: drop\n"
                                      "checkpoint:\n"
                                      "  dir: /ckpt\n"
                                      "  every: 1000\n"
                                      "  keep_last: 0\n"
                                      "  resume: none\n"
                                      "  async: true\n"
                                      "logging:\n"
                                      "  every: 10\n"
                                      "  metrics_file: m.jsonl\n"
                                      "  tensorboard_dir: tb\n"
                                      "  peak_flops: 989e12\n"
                                      "  strict: true\n"
                                      "  flight_entries: 64\n"
                                      "  straggler_ratio: 1.5\n"
                                      "  trace: {steps: [2, 3], dir: tr}\n"
                                      "  stats_every: 5\n"
                                      "  stats_spike: 4\n"
                                      "eval:\n"
                                      "  tasks: [{name: hs, path: /t/hs.jsonl, every: 50}]\n"
                                      "  tokenizer: tok.json\n"
                                      "dist:\n"
                                      "  timeout_s: 30.5\n";

static bool starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* Loads yaml over the defaults under the name "t.yaml"; returns cfg_load_string's result. */
static int load(ust_config *c, const char *yaml, ust_err *e) {
    cfg_defaults(c);
    e->msg[0] = 0;
    return cfg_load_string(c, yaml, "t.yaml", e);
}

/* The load must fail, the message must start with `where` and contain `sub`. */
#define CHECK_LOAD_FAILS(yaml, where, sub)                                                         \
    do {                                                                                           \
        ust_config c_;                                                                             \
        ust_err e_;                                                                                \
        CHECK(load(&c_, yaml, &e_) == -1, "accepted: %s", txt(yaml));                              \
        CHECK(starts_with(e_.msg, where), "want prefix '%s', got: %s", txt(where), txt(e_.msg));   \
        CHECK(strstr(e_.msg, sub), "want '%s' in: %s", txt(sub), txt(e_.msg));                     \
    } while (0)

#define CHECK_SET_FAILS(assignment, sub)                                                           \
    do {                                                                                           \
        ust_config c_, d_;                                                                         \
        ust_err e_ = {{0}};                                                                        \
        cfg_defaults(&c_);                                                                         \
        d_ = c_;                                                                                   \
        CHECK(cfg_set(&c_, assignment, &e_) == -1, "accepted --set %s", assignment);               \
        CHECK(starts_with(e_.msg, "--set " assignment ": "), "want --set prefix, got: %s",         \
              txt(e_.msg));                                                                        \
        CHECK(strstr(e_.msg, sub), "want '%s' in: %s", txt(sub), txt(e_.msg));                     \
        CHECK(memcmp(&c_, &d_, sizeof c_) == 0, "failed --set changed the config");                \
    } while (0)

/* ---------------------------------------------------------------- defaults and parsing */

/* The same values; which keys were given (cfg_was_set) is not a value. */
static bool same_values(const ust_config *a, const ust_config *b) {
    ust_config x = *a, y = *b;
    memset(x.set_bits, 0, sizeof x.set_bits);
    memset(y.set_bits, 0, sizeof y.set_bits);
    return memcmp(&x, &y, sizeof x) == 0;
}

static void test_defaults_are_design_section_1(void) {
    ust_config c;
    cfg_defaults(&c);
    CHECK(!strcmp(c.run.name, "tiny") && c.run.seed == 1234 && c.run.device == DEV_CPU &&
              !strcmp(c.run.out_dir, "runs/tiny"),
          "run section");
    CHECK(c.model.arch == ARCH_LLAMA && c.model.n_layer == 4 && c.model.d_model == 128 &&
              c.model.n_head == 4 && c.model.n_kv_head == 2 && c.model.d_ff == 384 &&
              c.model.vocab_size == 512 && c.model.vocab_pad == 128 && c.model.max_seq_len == 256 &&
              c.model.rope_theta == 10000 && c.model.norm_eps == 1e-5 && !c.model.tie_embeddings &&
              !c.model.init_from[0],
          "model section");
    CHECK(c.model.moe.num_experts == 0 && c.model.moe.top_k == 2 &&
              c.model.moe.d_ff_expert == 128 && c.model.moe.every == 1 &&
              !c.model.moe.shared_expert && c.model.moe.aux_loss_coef == 0.01 &&
              c.model.moe.z_loss_coef == 0 && c.model.moe.capacity_factor == 0,
          "moe section");
    CHECK(c.parallel.dp == 1 && c.parallel.tp == 1 && c.parallel.pp == 1 && c.parallel.cp == 1 &&
              c.parallel.ep == 1 && !c.parallel.sp && c.parallel.vpp == 1 &&
              c.parallel.pp_schedule == PP_1F1B && c.parallel.cp_layout == CP_ZIGZAG &&
              c.parallel.cp_comm == CP_RING && c.parallel.cp_a2a == 0 &&
              c.parallel.dp_bucket_mb == 25,
          "parallel section");
    CHECK(c.train.steps == 50 && c.train.seq_len == 128 && c.train.micro_batch_size == 4 &&
              c.train.global_batch_size == 8 && c.train.precision == PREC_FP32 &&
              c.train.recompute == RECOMPUTE_NONE && c.train.grad_clip == 1.0 &&
              c.train.on_nan == ONNAN_STOP && c.train.threads == 0,
          "train section");
    CHECK(!strcmp(c.optimizer.name, "adamw") && c.optimizer.zero_stage == 0 &&
              c.optimizer.lr == 3e-3 && c.optimizer.min_lr == 3e-4 &&
              c.optimizer.warmup_steps == 5 && c.optimizer.schedule == SCHED_COSINE &&
              c.optimizer.decay_frac == 0.2 && c.optimizer.beta1 == 0.9 &&
              c.optimizer.beta2 == 0.95 && c.optimizer.eps == 1e-8 &&
              c.optimizer.weight_decay == 0.1,
          "optimizer section");
    CHECK(c.data.format == DATA_LLMC && !strcmp(c.data.train, "data/tiny/train_*.bin") &&
              !strcmp(c.data.val, "data/tiny/val_*.bin") && !c.data.shuffle &&
              c.data.val_every == 25 && c.data.val_steps == 4,
          "data section");
    CHECK(!strcmp(c.checkpoint.dir, "runs/tiny/ckpt") && c.checkpoint.every == 25 &&
              c.checkpoint.keep_last == 2 && !strcmp(c.checkpoint.resume, "auto"),
          "checkpoint section");
    CHECK(c.logging.every == 1 && !strcmp(c.logging.metrics_file, "runs/tiny/metrics.jsonl") &&
              c.logging.peak_flops == 0 && c.dist.timeout_s == 300 && !c.source[0],
          "logging/dist");
    ust_err e;
    CHECK(cfg_validate(&c, 1, &e) == 0, "defaults must validate: %s", txt(e.msg));
}

static void test_design_yaml_loads_to_the_defaults(void) {
    ust_config c, d;
    ust_err e;
    CHECK(load(&c, DESIGN_YAML, &e) == 0, "%s", txt(e.msg));
    CHECK(!strcmp(c.source, "t.yaml"), "source is '%s'", c.source);
    cfg_defaults(&d);
    strcpy(d.source, "t.yaml");
    CHECK(same_values(&c, &d), "docs/design.md's YAML differs from cfg_defaults");
}

/* An empty file is more likely a truncated copy or a wrong path than a wish for all defaults:
 * it is refused; {} asks for the defaults explicitly. */
static void test_empty_configs_are_refused_and_braces_give_defaults(void) {
    const char *docs[] = {"", "# nothing\n", "---\n", "~\n", "  \n\n# only comments\n\n", "null\n"};
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++)
        CHECK_LOAD_FAILS(docs[i], "t.yaml: config file is empty", "or {} for all defaults");
    ust_config c, d;
    ust_err e;
    CHECK(load(&c, "{}\n", &e) == 0, "{}: %s", txt(e.msg));
    cfg_defaults(&d);
    strcpy(d.source, "t.yaml");
    CHECK(memcmp(&c, &d, sizeof c) == 0, "{} changed a value");
}

static void test_block_style_sets_every_kind_of_value(void) {
    ust_config c;
    ust_err e;
    const char *yaml = "model:\n"
                       "  arch: gpt2\n"
                       "  n_layer: 12\n"
                       "  rope_theta: 5e5\n"
                       "  tie_embeddings: True\n"
                       "  init_from: ckpt/gpt2_124M.bin\n"
                       "  moe:\n"
                       "    num_experts: 8\n"
                       "    capacity_factor: 1.25\n"
                       "run:\n"
                       "  seed: 18446744073709551615\n"
                       "  name: 'quoted name'\n"
                       "train:\n"
                       "  steps: 10000000000   # int64\n"
                       "  precision: bf16\n"
                       "  grad_clip: -1\n"
                       "data:\n"
                       "  val: null\n"
                       "  train: \"x/*.bin\"\n"
                       "model_unused_section_follows: ~\n";
    /* the last line is an unknown section: first prove everything before it parses */
    const char *cut = strstr(yaml, "model_unused");
    char head[1024];
    snprintf(head, sizeof head, "%.*s", (int)(cut - yaml), yaml);
    CHECK(load(&c, head, &e) == 0, "%s", txt(e.msg));
    CHECK(c.model.arch == ARCH_GPT2 && c.model.n_layer == 12 && c.model.rope_theta == 5e5 &&
              c.model.tie_embeddings && !strcmp(c.model.init_from, "ckpt/gpt2_124M.bin"),
          "model values");
    CHECK(c.model.moe.num_experts == 8 && c.model.moe.capacity_factor == 1.25, "moe values");
    CHECK(c.model.d_model == 128, "untouched keys keep their defaults");
    CHECK(c.run.seed == UINT64_MAX && !strcmp(c.run.name, "quoted name"), "run values");
    CHECK(c.train.steps == 10000000000LL && c.train.precision == PREC_BF16 &&
              c.train.grad_clip == -1,
          "train values");
    CHECK(c.data.val[0] == 0 && !strcmp(c.data.train, "x/*.bin"), "data values");
    CHECK(load(&c, yaml, &e) == -1, "the unknown section was accepted");
}

static void test_flow_style_equals_block_style(void) {
    ust_config a, b;
    ust_err e;
    CHECK(load(&a,
               "run: {name: x, seed: 1}\nmodel: {n_layer: 8, moe: {top_k: 1}}\n"
               "parallel: {pp_schedule: interleaved, vpp: 2}\n",
               &e) == 0,
          "%s", txt(e.msg));
    CHECK(load(&b,
               "run:\n  name: x\n  seed: 1\nmodel:\n  n_layer: 8\n  moe:\n    top_k: 1\n"
               "parallel:\n  pp_schedule: interleaved\n  vpp: 2\n",
               &e) == 0,
          "%s", txt(e.msg));
    CHECK(a.model.n_layer == 8 && a.model.moe.top_k == 1 && a.run.seed == 1 &&
              a.parallel.pp_schedule == PP_INTERLEAVED,
          "flow values not applied");
    CHECK(memcmp(&a, &b, sizeof a) == 0, "flow and block style differ");
    /* One line of flow style for the whole document. */
    CHECK(load(&a, "{train: {steps: 7}, data: {val: ~}}", &e) == 0, "%s", txt(e.msg));
    CHECK(a.train.steps == 7 && a.data.val[0] == 0, "whole-document flow style");
}

static void test_null_empties_nullable_strings_only(void) {
    ust_config c;
    ust_err e;
    CHECK(load(&c, "model: {init_from: x.bin}\ndata:\n  val:\n", &e) == 0, "%s", txt(e.msg));
    CHECK(!strcmp(c.model.init_from, "x.bin") && c.data.val[0] == 0, "empty value is null");
    CHECK(load(&c, "model: {init_from: ~}\n", &e) == 0 && c.model.init_from[0] == 0, "~");
    CHECK(load(&c, "data: {val: \"\"}\n", &e) == 0 && c.data.val[0] == 0, "quoted empty");
    CHECK(load(&c, "data: {val: \"null\"}\n", &e) == 0 && !strcmp(c.data.val, "null"),
          "a quoted \"null\" is the string null");
    CHECK_LOAD_FAILS("data:\n  train: null\n", "t.yaml:2:10: ", "data.train: needs a value");
    CHECK_LOAD_FAILS("train:\n  steps: ~\n", "t.yaml:2:10: ", "train.steps: needs a value");
    CHECK_LOAD_FAILS("model: {arch: null}\n", "t.yaml:1:15: ", "model.arch: unknown value 'null'");
}

static void test_a_failed_load_leaves_the_config_unchanged(void) {
    ust_config c, d;
    ust_err e;
    cfg_defaults(&c);
    d = c;
    CHECK(cfg_load_string(&c, "train: {steps: 99}\nmodel: {n_layer: x}\n", "t.yaml", &e) == -1,
          "accepted a bad n_layer");
    CHECK(memcmp(&c, &d, sizeof c) == 0, "train.steps was applied although the load failed");
}

static void test_load_file_reads_and_names_the_file(void) {
    char path[] = "/tmp/ust_test_config_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    FILE *f = fdopen(fd, "w");
    fputs("train:\n  steps: 77\n  seq_len: abc\n", f);
    fclose(f);
    ust_config c;
    ust_err e;
    cfg_defaults(&c);
    int rc = cfg_load_file(&c, path, &e);
    char want[128];
    snprintf(want, sizeof want, "%s:3:12: train.seq_len: expected an integer, got 'abc'", path);
    bool ok = rc == -1 && !strcmp(e.msg, want);
    f = fopen(path, "w");
    fputs("train:\n  steps: 77\n", f);
    fclose(f);
    int rc2 = cfg_load_file(&c, path, &e);
    unlink(path);
    CHECK(ok, "want '%s', got rc %d: %s", txt(want), rc, txt(e.msg));
    CHECK(rc2 == 0 && c.train.steps == 77 && !strcmp(c.source, path), "%s", txt(e.msg));
    CHECK(cfg_load_file(&c, "/nonexistent/x.yaml", &e) == -1 &&
              starts_with(e.msg, "config /nonexistent/x.yaml: cannot open: No such file"),
          "missing file: %s", txt(e.msg));
    /* a FIFO nobody writes reads as empty (no wait for a writer); a directory is refused */
    char fifo[300];
    snprintf(fifo, sizeof fifo, "%s.fifo", path);
    CHECK(mkfifo(fifo, 0600) == 0, "mkfifo");
    rc = cfg_load_file(&c, fifo, &e);
    unlink(fifo);
    CHECK(rc == -1 && strstr(e.msg, "config file is empty"), "FIFO config: %s", txt(e.msg));
    CHECK(cfg_load_file(&c, "/tmp", &e) == -1 && strstr(e.msg, "not a regular file or pipe"),
          "directory config: %s", txt(e.msg));
}

/* ---------------------------------------------------------------- load errors */

static void test_yaml_syntax_errors_have_file_line_col(void) {
    CHECK_LOAD_FAILS("train:\n  steps: 5\n   seq_len: 4\n", "t.yaml:3:11: ",
                     "YAML syntax error: mapping values are not allowed in this context");
    CHECK_LOAD_FAILS("run: {name: x, seed: 1\nmodel: {}\n",
                     "t.yaml:2:6: ", "YAML syntax error: did not find expected ',' or '}'");
    CHECK_LOAD_FAILS("train:\n\tsteps: 5\n",
                     "t.yaml:2:1: ", "found character that cannot start any token");
    CHECK_LOAD_FAILS("run: {name: \"abc}\n", "t.yaml:2:1: ", "found unexpected end of stream");
    CHECK_LOAD_FAILS("run: {name: x}\n---\ntrain: {steps: 1}\n",
                     "t.yaml:3:1: ", "expected one YAML document, found a second");
    CHECK_LOAD_FAILS("run:\n  name: \"a\xff\"\n", "t.yaml:2:11: ", "YAML syntax error: invalid");
}

static void test_unknown_keys_suggest_the_nearest_valid_key(void) {
    CHECK_LOAD_FAILS("train:\n  steps: 5\n  micro_batch: 4\n", "t.yaml:3:3: ",
                     "unknown key 'train.micro_batch' (did you mean 'micro_batch_size'?)");
    CHECK_LOAD_FAILS("trian:\n  steps: 5\n",
                     "t.yaml:1:1: ", "unknown section 'trian' (did you mean 'train'?)");
    CHECK_LOAD_FAILS("model: {moe: {topk: 2}}\n",
                     "t.yaml:1:15: ", "unknown key 'model.moe.topk' (did you mean 'top_k'?)");
    CHECK_LOAD_FAILS("parallel: {pp_shedule: zb}\n", "t.yaml:1:12: ",
                     "unknown key 'parallel.pp_shedule' (did you mean 'pp_schedule'?)");
    CHECK_LOAD_FAILS("model:\n  mo: {top_k: 1}\n",
                     "t.yaml:2:3: ", "unknown key 'model.mo' (did you mean 'moe'?)");
    /* Nothing close: list what is valid instead of guessing. */
    CHECK_LOAD_FAILS("dist:\n  xyzzy_frobnicate: 1\n", "t.yaml:2:3: ",
                     "unknown key 'dist.xyzzy_frobnicate' (valid keys in 'dist': timeout_s)");
    CHECK_LOAD_FAILS("zzzzzzzzzzzz: 1\n", "t.yaml:1:1: ",
                     "unknown section 'zzzzzzzzzzzz' (valid sections: run, model, parallel, train, "
                     "optimizer, data, checkpoint, logging, dist, eval)");
    CHECK_LOAD_FAILS("train.steps: 5\n", "t.yaml:1:1: ", "contains '.'");
}

static void test_duplicate_keys_are_errors(void) {
    CHECK_LOAD_FAILS("train:\n  steps: 5\n  seq_len: 64\n  steps: 6\n", "t.yaml:4:3: ",
                     "duplicate key 'train.steps' (first given at line 2, column 3)");
    CHECK_LOAD_FAILS("train: {steps: 5}\nrun: {}\ntrain: {seq_len: 64}\n",
                     "t.yaml:3:1: ", "duplicate key 'train' (first given at line 1, column 1)");
    CHECK_LOAD_FAILS("model: {moe: {top_k: 1, top_k: 2}}\n",
                     "t.yaml:1:25: ", "duplicate key 'model.moe.top_k'");
}

static void test_wrong_types_are_errors(void) {
    CHECK_LOAD_FAILS("train:\n  steps: 1.5\n",
                     "t.yaml:2:10: ", "train.steps: expected an integer, got '1.5'");
    CHECK_LOAD_FAILS("run: {name: tiny, seed: abc}\n",
                     "t.yaml:1:25: ", "run.seed: expected a non-negative integer, got 'abc'");
    CHECK_LOAD_FAILS("train: {steps: \"50\"}\n", "t.yaml:1:16: ",
                     "train.steps: expected an integer, got the quoted string \"50\"");
    CHECK_LOAD_FAILS("optimizer: {lr: fast}\n",
                     "t.yaml:1:17: ", "optimizer.lr: expected a number, got 'fast'");
    CHECK_LOAD_FAILS("optimizer: {lr: .nan}\n", "t.yaml:1:17: ", "expected a number, got '.nan'");
    CHECK_LOAD_FAILS("optimizer: {lr: inf}\n", "t.yaml:1:17: ", "expected a number, got 'inf'");
    CHECK_LOAD_FAILS("data: {shuffle: yes}\n",
                     "t.yaml:1:17: ", "data.shuffle: expected true or false, got 'yes'");
    CHECK_LOAD_FAILS("train:\n  steps:\n    a: 1\n",
                     "t.yaml:3:5: ", "train.steps: expected a single value, got a mapping");
    CHECK_LOAD_FAILS("data: {train: [a, b]}\n",
                     "t.yaml:1:16: ", "data.train[0]: expected a mapping {path: GLOB, weight: W}");
    CHECK_LOAD_FAILS("model: 5\n", "t.yaml:1:8: ",
                     "'model' is a section and needs a mapping of keys, got a single value");
    CHECK_LOAD_FAILS("model: {moe: [1]}\n", "t.yaml:1:14: ",
                     "'model.moe' is a section and needs a mapping of keys, got a list");
    CHECK_LOAD_FAILS("- run\n- model\n", "t.yaml:1:1: ",
                     "the top level must be a mapping of sections (run:, model:, ...), got a list");
    CHECK_LOAD_FAILS("hello\n", "t.yaml:1:1: ", "the top level must be a mapping");
    CHECK_LOAD_FAILS("? [a, b]\n: 1\n", "t.yaml:1:3: ", "keys must be names, got a list");
}

static void test_out_of_range_values_are_errors(void) {
    CHECK_LOAD_FAILS("model: {n_layer: -1}\n",
                     "t.yaml:1:18: ", "model.n_layer: -1 is out of range (must be in 1..4096)");
    CHECK_LOAD_FAILS("checkpoint: {every: -1}\n",
                     "t.yaml:1:21: ", "checkpoint.every: -1 is out of range (must be >= 0)");
    CHECK_LOAD_FAILS("model: {d_model: 0}\n", "t.yaml:1:18: ", "model.d_model: 0 is out of range");
    CHECK_LOAD_FAILS("optimizer: {lr: 0}\n",
                     "t.yaml:1:17: ", "optimizer.lr: 0 is out of range (must be > 0)");
    CHECK_LOAD_FAILS("optimizer: {beta2: 1.0}\n",
                     "t.yaml:1:20: ", "optimizer.beta2: 1.0 is out of range (must be in [0, 1))");
    CHECK_LOAD_FAILS("optimizer: {beta1: -0.1}\n", "t.yaml:1:20: ", "optimizer.beta1: -0.1 is out");
    CHECK_LOAD_FAILS("optimizer: {zero_stage: 4}\n",
                     "t.yaml:1:25: ", "optimizer.zero_stage: 4 is out of range (must be in 0..3)");
    CHECK_LOAD_FAILS("train: {steps: -1}\n", "t.yaml:1:16: ", "train.steps: -1 is out of range");
    CHECK_LOAD_FAILS("train: {seq_len: 99999999999}\n", "t.yaml:1:18: ",
                     "train.seq_len: 99999999999 is out of range (must be in 1..16777216)");
    CHECK_LOAD_FAILS("data: {val_every: 99999999999}\n", "t.yaml:1:19: ",
                     "data.val_every: 99999999999 is out of range (must fit in a 32-bit integer)");
    CHECK_LOAD_FAILS("train: {steps: 99999999999999999999}\n",
                     "t.yaml:1:16: ", "(must fit in a 64-bit integer)");
    CHECK_LOAD_FAILS(
        "run: {seed: 99999999999999999999}\n", "t.yaml:1:13: ",
        "run.seed: 99999999999999999999 is out of range (must fit in a 64-bit integer)");
    CHECK_LOAD_FAILS("run: {seed: -3}\n", "t.yaml:1:13: ", "expected a non-negative integer");
    CHECK_LOAD_FAILS("parallel: {tp: 0}\n", "t.yaml:1:16: ", "parallel.tp: 0 is out of range");
    CHECK_LOAD_FAILS("dist: {timeout_s: 0}\n", "t.yaml:1:19: ", "dist.timeout_s: 0 is out");
    CHECK_LOAD_FAILS("dist: {timeout_s: 1e-300}\n",
                     "t.yaml:1:19: ", "dist.timeout_s: 1e-300 is out");
    CHECK_LOAD_FAILS(
        "run: {name: "
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa}\n",
        "t.yaml:1:13: ", "run.name: value is too long (132 bytes, at most 127)");
}

static void test_bad_enum_values_list_the_allowed_ones(void) {
    CHECK_LOAD_FAILS("train: {precision: fp16}\n", "t.yaml:1:20: ",
                     "train.precision: unknown value 'fp16' (allowed: fp32, bf16)");
    CHECK_LOAD_FAILS("model:\n  arch: gpt3\n", "t.yaml:2:9: ",
                     "model.arch: unknown value 'gpt3' (allowed: gpt2, llama, auto)");
    CHECK_LOAD_FAILS("parallel: {pp_schedule: gpipe}\n", "t.yaml:1:25: ",
                     "(allowed: afab, 1f1b, interleaved, zb, dualpipev, dualpipe)");
    CHECK_LOAD_FAILS("optimizer: {name: sgd}\n",
                     "t.yaml:1:19: ", "optimizer.name: unknown value 'sgd' (allowed: adamw, muon)");
    CHECK_LOAD_FAILS("data: {format: bin}\n",
                     "t.yaml:1:16: ", "(allowed: llmc, nanogpt, megatron)");
    CHECK_LOAD_FAILS("run: {device: gpu}\n", "t.yaml:1:15: ", "(allowed: cpu, cuda)");
    CHECK_LOAD_FAILS("optimizer: {schedule: step}\n",
                     "t.yaml:1:23: ", "(allowed: cosine, linear, constant, wsd)");
}

/* ---------------------------------------------------------------- --set */

static void test_set_applies_values_parsed_as_yaml_scalars(void) {
    ust_config c;
    ust_err e = {{0}};
    cfg_defaults(&c);
    CHECK(cfg_set(&c, "model.n_layer=8", &e) == 0 && c.model.n_layer == 8, "%s", txt(e.msg));
    CHECK(cfg_set(&c, "model.moe.top_k=1", &e) == 0 && c.model.moe.top_k == 1, "%s", txt(e.msg));
    CHECK(cfg_set(&c, "optimizer.lr=1e-4", &e) == 0 && c.optimizer.lr == 1e-4, "%s", txt(e.msg));
    CHECK(cfg_set(&c, "run.name=\"my run\"", &e) == 0 && !strcmp(c.run.name, "my run"), "%s",
          txt(e.msg));
    CHECK(cfg_set(&c, "data.train=a=b/*.bin", &e) == 0 && !strcmp(c.data.train, "a=b/*.bin"),
          "the first '=' splits: %s", txt(e.msg));
    CHECK(cfg_set(&c, "parallel.sp=true", &e) == 0 && c.parallel.sp, "%s", txt(e.msg));
    CHECK(cfg_set(&c, "train.precision=bf16", &e) == 0 && c.train.precision == PREC_BF16, "%s",
          txt(e.msg));
    CHECK(cfg_set(&c, "data.val=null", &e) == 0 && c.data.val[0] == 0, "%s", txt(e.msg));
    CHECK(cfg_set(&c, "model.init_from=x.bin", &e) == 0 &&
              cfg_set(&c, "model.init_from=", &e) == 0 && c.model.init_from[0] == 0,
          "empty value is null: %s", txt(e.msg));
    CHECK(c.model.d_model == 128, "other keys untouched");
}

static void test_set_errors_name_the_argument(void) {
    CHECK_SET_FAILS("model.n_layer=abc", "model.n_layer: expected an integer, got 'abc'");
    CHECK_SET_FAILS("model.n_layer=0", "model.n_layer: 0 is out of range (must be in 1..4096)");
    CHECK_SET_FAILS("train.micro_batch=4",
                    "unknown key 'train.micro_batch' (did you mean 'micro_batch_size'?)");
    CHECK_SET_FAILS("modle.n_layer=4", "unknown section 'modle' (did you mean 'model'?)");
    CHECK_SET_FAILS("model.moe.topk=1", "unknown key 'model.moe.topk' (did you mean 'top_k'?)");
    CHECK_SET_FAILS("model.moe=1", "'model.moe' is a section");
    CHECK_SET_FAILS("model.n_layer.x=1", "'model.n_layer' is a key, not a section");
    CHECK_SET_FAILS("train.steps", "expected key.path=value");
    CHECK_SET_FAILS("=5", "expected key.path=value");
    CHECK_SET_FAILS("train.precision=fp8", "unknown value 'fp8' (allowed: fp32, bf16)");
    CHECK_SET_FAILS("train.steps={a: 1}", "train.steps: expected a single value, got a mapping");
    CHECK_SET_FAILS("run.name=\"abc", "YAML syntax error");
    CHECK_SET_FAILS("data.train=", "data.train: needs a value");
    CHECK_SET_FAILS("train.steps=\"5\"", "the quoted string");
}

/* ---------------------------------------------------------------- validate */

typedef struct {
    const char *sets[6]; /* --set assignments over the defaults */
    int world;
    const char *want; /* exact substring of the message */
} validate_case;

static const validate_case BAD_LAYOUTS[] = {
    {{"model.d_model=130", "model.n_head=4"},
     1,
     "model.d_model (130) must be divisible by model.n_head (4)"},
    {{"model.n_kv_head=3", "model.n_head=4"},
     1,
     "model.n_head (4) must be divisible by model.n_kv_head (3)"},
    {{"model.d_model=120", "model.n_head=8", "model.n_kv_head=8"},
     1,
     "llama's RoPE needs an even head dim, but model.d_model / model.n_head = 120 / 8 = 15"},
    {{"parallel.tp=8", "parallel.dp=1"},
     8,
     "model.n_head (4) must be divisible by parallel.tp (8)"},
    {{"parallel.tp=4"}, 4, "model.n_kv_head (2) must be divisible by parallel.tp (4)"},
    {{"model.n_head=6", "model.n_kv_head=3", "model.d_model=192", "parallel.tp=3",
      "model.vocab_pad=64"},
     3,
     "padded vocab (512: model.vocab_size 512 rounded up to a multiple of model.vocab_pad 64) "
     "must be divisible by parallel.tp (3)"},
    {{"parallel.pp=3"},
     3,
     "model.n_layer (4) must be divisible by parallel.pp * parallel.vpp (3 "
     "* 1 = 3)"},
    {{"parallel.pp=2", "parallel.vpp=4", "parallel.pp_schedule=interleaved"},
     2,
     "model.n_layer (4) must be divisible by parallel.pp * parallel.vpp (2 * 4 = 8)"},
    {{"parallel.pp=2", "parallel.vpp=2"},
     2,
     "parallel.vpp (2) > 1 needs parallel.pp_schedule: interleaved (got 1f1b)"},
    {{"parallel.cp=3", "parallel.dp=1"},
     3,
     "train.seq_len (128) must be divisible by 2 * parallel.cp (2 * 3 = 6)"},
    {{"train.seq_len=512"}, 1, "train.seq_len (512) must be <= model.max_seq_len (256)"},
    {{"model.moe.num_experts=6", "parallel.ep=4", "parallel.dp=4", "train.global_batch_size=16"},
     4,
     "model.moe.num_experts (6) must be divisible by parallel.ep (4)"},
    {{"model.moe.num_experts=4", "parallel.ep=2"},
     1,
     "parallel.dp (1) must be divisible by parallel.ep (2)"},
    {{"parallel.ep=2", "parallel.dp=2"},
     2,
     "parallel.ep (2) needs experts, but model.moe.num_experts is 0"},
    {{"model.moe.num_experts=2", "model.moe.top_k=3"},
     1,
     "model.moe.top_k (3) must be <= model.moe.num_experts (2)"},
    {{"train.global_batch_size=10", "parallel.dp=2"},
     2,
     "train.global_batch_size (10) must be divisible by train.micro_batch_size * parallel.dp (4 "
     "* 2 = 8)"},
    {{"parallel.dp=2", "parallel.tp=2"},
     6,
     "world size (6) must equal parallel.dp * tp * pp * cp (2 * 2 * 1 * 1 = 4)"},
    {{"optimizer.min_lr=0.1"}, 1, "optimizer.min_lr (0.1) must be <= optimizer.lr (0.003)"},
    {{"data.train=\"\""}, 1, "data.train is empty"},
};

static void test_validate_rejects_layouts_that_do_not_divide(void) {
    for (size_t i = 0; i < sizeof BAD_LAYOUTS / sizeof BAD_LAYOUTS[0]; i++) {
        const validate_case *t = &BAD_LAYOUTS[i];
        ust_config c;
        ust_err e = {{0}};
        cfg_defaults(&c);
        for (int j = 0; j < 6 && t->sets[j]; j++)
            CHECK(cfg_set(&c, t->sets[j], &e) == 0, "case %zu: %s", i, txt(e.msg));
        CHECK(cfg_validate(&c, t->world, &e) == -1, "case %zu accepted (want: %s)", i,
              txt(t->want));
        CHECK(strstr(e.msg, t->want), "case %zu: want '%s', got: %s", i, txt(t->want), txt(e.msg));
    }
}

static void test_validate_accepts_a_5d_layout_and_skips_world_when_unknown(void) {
    ust_config c;
    ust_err e = {{0}};
    const char *sets[] = {"model.n_layer=8",
                          "model.n_head=8",
                          "model.n_kv_head=4",
                          "model.moe.num_experts=4",
                          "parallel.dp=2",
                          "parallel.tp=2",
                          "parallel.pp=2",
                          "parallel.cp=2",
                          "parallel.ep=2",
                          "parallel.vpp=2",
                          "parallel.pp_schedule=interleaved",
                          "train.global_batch_size=16"};
    cfg_defaults(&c);
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
        CHECK(cfg_set(&c, sets[i], &e) == 0, "%s", txt(e.msg));
    CHECK(cfg_validate(&c, 16, &e) == 0, "%s", txt(e.msg));
    CHECK(cfg_validate(&c, 0, &e) == 0, "world 0 must skip the check: %s", txt(e.msg));
    CHECK(cfg_validate(&c, 8, &e) == -1 && strstr(e.msg, "(2 * 2 * 2 * 2 = 16)"), "%s", txt(e.msg));
    CHECK(cfg_grad_accum(&c) == 2, "grad accum %d", cfg_grad_accum(&c));
}

static void test_validate_rechecks_ranges_of_values_set_in_code(void) {
    ust_config c;
    ust_err e = {{0}};
    cfg_defaults(&c);
    strcpy(c.source, "cfg.yaml");
    c.model.d_ff = 0;
    CHECK(cfg_validate(&c, 1, &e) == -1, "d_ff 0 accepted");
    CHECK(!strcmp(e.msg, "cfg.yaml: model.d_ff: 0 is out of range (must be in 1..4194304)"), "%s",
          txt(e.msg));
    cfg_defaults(&c);
    c.optimizer.beta1 = 1.0;
    CHECK(cfg_validate(&c, 1, &e) == -1 && strstr(e.msg, "optimizer.beta1: 1 is out of range"),
          "%s", txt(e.msg));
    cfg_defaults(&c);
    c.train.precision = (ust_precision)7;
    CHECK(cfg_validate(&c, 1, &e) == -1 && strstr(e.msg, "train.precision"), "%s", txt(e.msg));
}

/* model.mla: a DeepSeek-V3-shaped layer validates; each inconsistent or unsupported setting is
 * refused naming its key and what is allowed. */
static void test_mla_validation_names_the_key_and_what_is_allowed(void) {
    static const char *const base[] = {"model.n_head=4",
                                       "model.n_kv_head=4",
                                       "model.mla.enabled=true",
                                       "model.mla.q_lora_rank=24",
                                       "model.mla.kv_lora_rank=16",
                                       "model.mla.qk_nope_head_dim=8",
                                       "model.mla.qk_rope_head_dim=4",
                                       "model.mla.v_head_dim=8"};
    static const struct {
        const char *set, *want, *set2;
    } bad[] = {
        {"model.mla.kv_lora_rank=0", "model.mla.kv_lora_rank is 0", NULL},
        {"model.mla.qk_rope_head_dim=5", "model.mla.qk_rope_head_dim (5) must be even", NULL},
        {"model.mla.v_head_dim=13", "model.mla.v_head_dim (13) must be <= qk_nope_head_dim", NULL},
        {"model.n_kv_head=2", "set model.n_kv_head (2) = model.n_head (4)", NULL},
        {"model.qk_norm=true", "model.mla takes neither model.qk_norm nor model.qkv_bias", NULL},
        {"model.qkv_bias=true", "model.mla takes neither model.qk_norm nor model.qkv_bias", NULL},
        {"model.arch=gpt2", "model.mla.enabled: true applies to llama", NULL},
        {"model.mla.mscale_all_dim=1", "it needs model.rope_scaling (type yarn), or 0", NULL},
        {"model.mla.qk_nope_head_dim=65536", "at most 2^24 each", "model.n_head=1024"},
        {"model.mla.kv_lora_rank=1048577", "model.mla.kv_lora_rank: 1048577 is out of range", NULL},
    };
    for (size_t i = 0; i <= sizeof bad / sizeof bad[0]; i++) {
        ust_config c;
        ust_err e = {{0}};
        cfg_defaults(&c);
        for (size_t j = 0; j < sizeof base / sizeof base[0]; j++)
            CHECK(cfg_set(&c, base[j], &e) == 0, "%s", txt(e.msg));
        if (i == sizeof bad / sizeof bad[0]) { /* the base itself */
            CHECK(cfg_validate(&c, 1, &e) == 0, "%s", txt(e.msg));
            CHECK(cfg_head_dim(&c) == 12, "MLA's head dim is nope + rope: %d", cfg_head_dim(&c));
            continue;
        }
        int rc = cfg_set(&c, bad[i].set, &e);
        if (rc == 0 && bad[i].set2) /* with d_model divisible by the heads */
            rc = cfg_set(&c, bad[i].set2, &e) || cfg_set(&c, "model.n_kv_head=1024", &e) ||
                 cfg_set(&c, "model.d_model=1024", &e);
        if (rc == 0) rc = cfg_validate(&c, 1, &e);
        CHECK(rc == -1 && strstr(e.msg, bad[i].want), "%s: want '%s', got: %s", bad[i].set,
              bad[i].want, rc ? txt(e.msg) : "accepted");
    }
}

/* ---------------------------------------------------------------- limits (hardening) */

/* Real model shapes must stay valid under the size limits. */
static void test_size_limits_admit_llama_405b_and_deepseek_v3(void) {
    static const struct {
        const char *name, *yaml;
    } models[] = {
        {"llama-405B",
         "model: {n_layer: 126, d_model: 16384, n_head: 128, n_kv_head: 8, d_ff: 53248,\n"
         "        vocab_size: 128256, max_seq_len: 131072}\n"
         "parallel: {tp: 8, pp: 14}\n"
         "train: {seq_len: 8192, micro_batch_size: 1, global_batch_size: 2048}\n"},
        {"DeepSeek-V3",
         "model: {n_layer: 61, d_model: 7168, n_head: 128, n_kv_head: 128, d_ff: 18432,\n"
         "        vocab_size: 129280, max_seq_len: 163840,\n"
         "        moe: {num_experts: 256, top_k: 8, d_ff_expert: 2048, shared_expert: true}}\n"
         "parallel: {dp: 64, ep: 64, pp: 1}\n"
         "train: {seq_len: 4096, micro_batch_size: 1, global_batch_size: 1024}\n"},
    };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        ust_config c;
        ust_err e = {{0}};
        CHECK(load(&c, models[i].yaml, &e) == 0 && cfg_validate(&c, 0, &e) == 0, "%s: %s",
              models[i].name, txt(e.msg));
    }
}

/* Each size key has a range that keeps its products in 64 bits (n_layer = 2^31 - 1 crashed the
 * parameter table; vocab_pad = 2^31 - 1 overflowed the padded vocabulary). */
static void test_every_size_key_has_an_upper_limit(void) {
    static const struct {
        const char *set, *why;
    } cases[] = {
        {"model.n_layer=2147483647",
         "model.n_layer: 2147483647 is out of range (must be in 1..4096)"},
        {"model.vocab_pad=2147483647",
         "model.vocab_pad: 2147483647 is out of range (must be in 1..65536)"},
        {"model.vocab_size=2147483647", "(must be in 1..16777216)"},
        {"model.d_model=2097152", "(must be in 1..1048576)"},
        {"model.d_ff=2147483647", "(must be in 1..4194304)"},
        {"model.n_head=2147483647", "(must be in 1..65536)"},
        {"model.max_seq_len=2147483647", "(must be in 1..16777216)"},
        {"model.moe.num_experts=100000", "(must be in 0..4096)"},
        {"model.moe.d_ff_expert=2147483647", "(must be in 1..4194304)"},
        {"train.seq_len=2147483647", "(must be in 1..16777216)"},
        {"train.micro_batch_size=2147483647", "(must be in 1..16777216)"},
        {"train.global_batch_size=2147483647", "(must be in 1..1073741824)"},
        {"parallel.dp=2147483647", "(must be in 1..16777216)"},
        {"parallel.pp=100000", "(must be in 1..4096)"},
        {"train.threads=100000", "train.threads: 100000 is out of range (must be in 0..1024)"},
        {"parallel.dp_bucket_mb=1e300", "(must be in (0, 1.04858e+06])"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ust_config c;
        ust_err e = {{0}};
        cfg_defaults(&c);
        CHECK(cfg_set(&c, cases[i].set, &e) == -1, "accepted --set %s", cases[i].set);
        CHECK(strstr(e.msg, cases[i].why), "--set %s: want '%s' in: %s", cases[i].set, cases[i].why,
              txt(e.msg));
    }
}

/* Products of several keys are checked in 64 bits, naming the keys. */
static void test_derived_sizes_are_checked_naming_the_keys(void) {
    static const struct {
        const char *yaml, *why;
    } cases[] = {
        {"model: {max_seq_len: 16777216}\n"
         "train: {seq_len: 16777216, micro_batch_size: 2, global_batch_size: 2}\n",
         "train.micro_batch_size x train.seq_len = 2 x 16777216 = 33554432 tokens per "
         "micro-batch; at most 16777216"},
        {"model: {n_layer: 4096, d_model: 1048576, n_head: 4}\n",
         "the model would have about 1.8e+16 parameters (model.n_layer 4096, d_model 1048576"},
        {"model: {n_layer: 64, d_model: 8192, n_head: 64, n_kv_head: 8, d_ff: 32768,\n"
         "        max_seq_len: 16777216}\n"
         "parallel: {pp: 64}\n"
         "train: {seq_len: 16777216, micro_batch_size: 1, global_batch_size: 1048576}\n",
         "activations would take about 3.54e+21 bytes (16777216 tokens per micro-batch = "
         "train.micro_batch_size x seq_len, x 1048576 micro-batches in flight, through "
         "model.n_layer 64 layers"},
        {"model: {n_head: 8, n_kv_head: 8}\nparallel: {dp: 4096, cp: 8192}\n",
         "parallel.dp x tp x pp x cp = 4096 x 1 x 1 x 8192 = 33554432 ranks; at most 16777216"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ust_config c;
        ust_err e = {{0}};
        CHECK(load(&c, cases[i].yaml, &e) == 0, "case %zu: %s", i, txt(e.msg));
        CHECK(cfg_validate(&c, 0, &e) == -1, "case %zu accepted", i);
        CHECK(strstr(e.msg, cases[i].why), "case %zu: want '%s' in: %s", i, cases[i].why,
              txt(e.msg));
    }
}

/* train.threads: 100000 hung inside OpenBLAS; at most 4 per online CPU. */
static void test_threads_are_limited_by_the_online_cpus(void) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN), limit = 4 * cpus < 1024 ? 4 * cpus : 1024;
    ust_config c;
    ust_err e = {{0}};
    cfg_defaults(&c);
    c.train.threads = (int)limit;
    CHECK(cfg_validate(&c, 0, &e) == 0, "%ld threads: %s", limit, txt(e.msg));
    if (limit == 1024) return; /* the fixed maximum is the table's range (previous test) */
    c.train.threads = (int)limit + 1;
    CHECK(cfg_validate(&c, 0, &e) == -1, "%ld threads accepted", limit + 1);
    char want[128];
    snprintf(want, sizeof want, "train.threads (%ld) must be at most %ld (4 x the %ld online CPUs",
             limit + 1, limit, cpus);
    CHECK(strstr(e.msg, want), "want '%s' in: %s", want, txt(e.msg));
}

/* parallel.pp_layers: [4294967297, 1] was read as [1, 1] (atoi). */
static void test_list_items_are_range_checked_where_they_stand(void) {
    CHECK_LOAD_FAILS("parallel: {pp: 2, pp_layers: [4294967297, 1]}\n", "t.yaml:1:31: ",
                     "parallel.pp_layers: item 4294967297 is out of range (must be in 1..4096)");
    CHECK_LOAD_FAILS("parallel:\n  pp: 2\n  pp_layers:\n    - 3\n    - 99999999999999999999\n",
                     "t.yaml:5:7: ", "item 99999999999999999999 is out of range");
    CHECK_LOAD_FAILS("parallel: {pp: 2, pp_layers: [3, x]}\n", "t.yaml:1:34: ",
                     "parallel.pp_layers: expected a list of integers in 1..4096, got 'x'");
    CHECK_LOAD_FAILS("parallel: {pp: 2, pp_layers: [3, [1]]}\n", "t.yaml:1:34: ", "got a list");
    CHECK_SET_FAILS("parallel.pp_layers=4294967297,1",
                    "parallel.pp_layers: item 4294967297 is out of range (must be in 1..4096)");
    CHECK_SET_FAILS("parallel.pp_layers=[3, 0]", "item 0 is out of range");
}

/* A YAML text whose n-deep nesting is made of open + close around the innermost value. */
static char *nested(const char *head, const char *open, const char *inner, const char *close,
                    int n) {
    size_t len = strlen(head) + n * (strlen(open) + strlen(close)) + strlen(inner) + 2;
    char *s = malloc(len), *p = s;
    p += sprintf(p, "%s", head);
    for (int i = 0; i < n; i++) p += sprintf(p, "%s", open);
    p += sprintf(p, "%s", inner);
    for (int i = 0; i < n; i++) p += sprintf(p, "%s", close);
    sprintf(p, "\n");
    return s;
}

/* 100,000 levels of "[" took libyaml 24 s (and "{a: " 50 s) to reject; the depth limit (64)
 * stops at the 65th level with its position. */
static void test_deep_nesting_is_refused_at_the_65th_level(void) {
    const char *why = "lists and mappings nested deeper than 64 levels (the limit";
    char *flow_seq = nested("train: ", "[", "1", "]", 100000);
    char *flow_map = nested("train: ", "{a: ", "1", "}", 100000);
    char *block_seq = nested("", "- ", "1", "", 100000);
    /* 70 levels of indented block mappings: k0:\n  k1:\n    k2: ... */
    char block_map[70 * 80] = "", *p = block_map;
    for (int i = 0; i < 70; i++) p += sprintf(p, "%*sk%d:\n", i, "", i);
    sprintf(p, "%*sx: 1\n", 70, "");
    /* level 1 is train's mapping, so the 65th opens at the 64th "[" */
    CHECK_LOAD_FAILS(flow_seq, "t.yaml:1:71: ", why);
    CHECK_LOAD_FAILS(flow_map, "t.yaml:1:260: ", why);
    CHECK_LOAD_FAILS(block_seq, "t.yaml:1:129: ", why);
    CHECK_LOAD_FAILS(block_map, "t.yaml:65:65: ", why);
    /* the same limit for --set values */
    ust_config c;
    ust_err e = {{0}};
    cfg_defaults(&c);
    char *set = nested("parallel.pp_layers=", "[", "1", "]", 1000);
    CHECK(cfg_set(&c, set, &e) == -1 && strstr(e.msg, why), "%.80s", txt(e.msg));
    free(flow_seq), free(flow_map), free(block_seq), free(set);
    /* 64 levels are fine as far as nesting goes (the key is what is wrong) */
    char *ok = nested("", "- ", "1", "", 64);
    CHECK_LOAD_FAILS(ok, "t.yaml:1:1: ", "the top level must be a mapping");
    free(ok);
}

/* A config over 16 MiB is refused with the position where the limit falls. */
static void test_configs_over_16_mib_are_refused(void) {
    size_t n = (16u << 20) + 100;
    char *big = malloc(n + 1);
    for (size_t i = 0; i < n; i++) big[i] = i % 64 == 63 ? '\n' : '#';
    big[n] = 0;
    /* byte 16 MiB is the first of line 262145 */
    CHECK_LOAD_FAILS(big, "t.yaml:262145:1: ", "config is larger than 16 MiB (the limit)");
    char path[] = "/tmp/ustrain-big-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0 && write(fd, big, n) == (ssize_t)n && close(fd) == 0, "cannot write %s", path);
    free(big);
    ust_config c;
    ust_err e = {{0}};
    cfg_defaults(&c);
    int rc = cfg_load_file(&c, path, &e);
    unlink(path);
    CHECK(rc == -1 && strstr(e.msg, ":262145:1: config is larger than 16 MiB"), "%s", txt(e.msg));
}

/* ---------------------------------------------------------------- derived values, dump */

static void test_derived_values(void) {
    ust_config c;
    cfg_defaults(&c);
    CHECK(cfg_vocab_padded(&c) == 512, "512 padded to 128: %d", cfg_vocab_padded(&c));
    c.model.vocab_size = 50257;
    CHECK(cfg_vocab_padded(&c) == 50304, "50257 padded to 128: %d", cfg_vocab_padded(&c));
    c.model.vocab_pad = 1;
    CHECK(cfg_vocab_padded(&c) == 50257, "pad 1 keeps the vocab");
    CHECK(cfg_grad_accum(&c) == 2, "8 / (4 * 1) = %d", cfg_grad_accum(&c));
    c.parallel.dp = 2;
    CHECK(cfg_grad_accum(&c) == 1, "8 / (4 * 2) = %d", cfg_grad_accum(&c));
    CHECK(cfg_head_dim(&c) == 32, "128 / 4 = %d", cfg_head_dim(&c));
    CHECK(!cfg_tied(&c), "llama without tie_embeddings is untied");
    c.model.tie_embeddings = true;
    CHECK(cfg_tied(&c), "llama with tie_embeddings is tied");
    c.model.arch = ARCH_GPT2;
    c.model.tie_embeddings = false;
    CHECK(cfg_tied(&c), "gpt2 is always tied");
}

/* cfg_dump of c, loaded back over the defaults, must give c again, byte for byte. */
static int dump_roundtrip(const ust_config *c, ust_config *back, char *text, size_t n, ust_err *e) {
    FILE *f = fmemopen(text, n, "w");
    if (!f) return ust_errf(e, "fmemopen failed");
    cfg_dump(c, f);
    fclose(f);
    cfg_defaults(back);
    if (cfg_load_string(back, text, c->source, e)) return -1;
    return 0;
}

static void test_dump_round_trips_to_an_identical_struct(void) {
    static char text[65536];
    ust_config c, back, d;
    ust_err e;
    CHECK(load(&c, ALL_CHANGED_YAML, &e) == 0, "%s", txt(e.msg));
    CHECK(!strcmp(c.run.name, "my run: \"quoted\" \\ back") &&
              !strcmp(c.run.out_dir, "runs/it's here"),
          "string escapes: '%s' '%s'", txt(c.run.name), txt(c.run.out_dir));
    /* The fixture really changes every key: compare the dump of the defaults line by line. */
    cfg_defaults(&d);
    static char dtext[65536];
    CHECK(dump_roundtrip(&d, &back, dtext, sizeof dtext, &e) == 0, "defaults: %s", txt(e.msg));
    CHECK(same_values(&d, &back), "defaults do not round-trip:\n%s", txt(dtext));
    CHECK(dump_roundtrip(&c, &back, text, sizeof text, &e) == 0, "%s\n%s", txt(e.msg), txt(text));
    CHECK(memcmp(&c, &back, sizeof c) == 0, "dump does not round-trip:\n%s", txt(text));
    int keys = 0, changed = 0;
    for (char *a = text, *b = dtext; *a && *b; keys++) {
        char *ea = strchr(a, '\n'), *eb = strchr(b, '\n');
        if (!ea || !eb) break;
        bool section = ea[-1] == ':';
        changed += !section && (ea - a != eb - b || memcmp(a, b, (size_t)(ea - a)));
        keys -= section;
        a = ea + 1, b = eb + 1;
    }
    CHECK(strstr(text, "\n  moe:\n    num_experts: 8\n"), "nested section layout:\n%s", txt(text));
    CHECK(strstr(text, "  init_from: \"gpt2_124M.bin\"\n") && strstr(dtext, "  init_from: null\n"),
          "strings are quoted, empty nullable strings are null");
    /* every line but the header comment is a key or a section */
    CHECK(changed == keys - 1, "%d of %d key lines differ from the defaults' dump", changed,
          keys - 1);
}

/* data.train as a blend: entries checked where they stand, kept as canonical text that dumps and
 * loads back to itself, read back by cfg_data_sets; --set takes the same list. */
static void test_blend_lists_load_check_and_round_trip(void) {
    ust_config c, back;
    ust_err e;
    CHECK(load(&c,
               "data:\n  train:\n    - {path: \"web/*.bin\", weight: 0.7}\n"
               "    - path: code/*.bin\n      weight: 3e-1\n      format: megatron\n",
               &e) == 0,
          "%s", txt(e.msg));
    cfg_dataset d[CFG_MAX_BLEND];
    int n = cfg_data_sets(&c, 0, d);
    CHECK(n == 2 && !strcmp(d[0].path, "web/*.bin") && d[0].weight == 0.7 && d[0].format == -1 &&
              !strcmp(d[1].path, "code/*.bin") && d[1].weight == 0.3 &&
              d[1].format == DATA_MEGATRON,
          "datasets: %d, %s %g %d, %s %g %d", n, d[0].path, d[0].weight, d[0].format, d[1].path,
          d[1].weight, d[1].format);
    CHECK(cfg_data_is_blend(&c, 0) && !cfg_data_is_blend(&c, 1), "blend flags");
    static char text[65536];
    CHECK(dump_roundtrip(&c, &back, text, sizeof text, &e) == 0, "%s", txt(e.msg));
    CHECK(same_values(&c, &back), "blend does not round-trip:\n%s", txt(text));
    n = cfg_data_sets(&c, 1, d); /* the default val: one glob of weight 1 */
    CHECK(n == 1 && d[0].weight == 1 && !strcmp(d[0].path, "data/tiny/val_*.bin"), "lone glob");
    CHECK(cfg_set(&c, "data.val=[{path: v/*.bin, weight: 2}]", &e) == 0, "%s", txt(e.msg));
    CHECK(cfg_data_sets(&c, 1, d) == 1 && d[0].weight == 2 && !strcmp(d[0].path, "v/*.bin"),
          "--set blend");
    CHECK_LOAD_FAILS("data:\n  train:\n    - {path: a, weight: -1}\n",
                     "t.yaml:3:25: ", "data.train[0].weight: expected a positive number, got '-1'");
    CHECK_LOAD_FAILS("data:\n  train:\n    - {path: a, weight: 1}\n    - {path: b, weight: 0}\n",
                     "t.yaml:4:25: ", "data.train[1].weight: expected a positive number, got '0'");
    CHECK_LOAD_FAILS("data: {train: [{weight: 1}]}\n",
                     "t.yaml:1:16: ", "data.train[0]: needs a path");
    CHECK_LOAD_FAILS("data: {train: [{path: a}]}\n",
                     "t.yaml:1:16: ", "data.train[0]: needs a weight");
    CHECK_LOAD_FAILS("data: {train: [{path: a, weight: 1, wieght: 2}]}\n", "t.yaml:1:37: ",
                     "data.train[0]: unknown key 'wieght' (allowed: path, weight, format)");
    CHECK_LOAD_FAILS("data: {train: [{path: a, weight: 1, format: hdf5}]}\n",
                     "t.yaml:1:45: ", "data.train[0].format: unknown value 'hdf5'");
    CHECK_LOAD_FAILS("data: {train: []}\n",
                     "t.yaml:1:15: ", "data.train: an empty list names no datasets");
    CHECK_LOAD_FAILS("data: {train: \"[{path: x\"}\n", "t.yaml:1:15: ",
                     "data.train: a list of datasets is written as a YAML list, not a string");
}

/* parallel.dp: auto is kept as 0, dumps as auto, and resolves against a world. */
static void test_dp_auto_resolves_against_the_world(void) {
    ust_config c, back;
    ust_err e;
    CHECK(load(&c,
               "parallel: {dp: auto, tp: 2}\ntrain: {micro_batch_size: 1, global_batch_size: 8}\n",
               &e) == 0 &&
              c.parallel.dp == 0,
          "%s", txt(e.msg));
    static char text[65536];
    CHECK(dump_roundtrip(&c, &back, text, sizeof text, &e) == 0 && back.parallel.dp == 0 &&
              strstr(text, "  dp: auto\n"),
          "dump: %s", txt(text));
    CHECK(cfg_validate(&c, 0, &e) == -1 && strstr(e.msg, "parallel.dp: auto needs the world size"),
          "%s", txt(e.msg));
    CHECK(cfg_resolve_auto(&c, 8, &e) == 0 && c.parallel.dp == 4 && cfg_validate(&c, 8, &e) == 0,
          "world 8, tp 2: dp %d, %s", c.parallel.dp, txt(e.msg));
    c.parallel.dp = 0;
    CHECK(cfg_resolve_auto(&c, 7, &e) == -1 && strstr(e.msg, "not a multiple of tp x pp x cp = 2"),
          "%s", txt(e.msg));
    CHECK(cfg_resolve_auto(&c, 6, &e) == -1 && strstr(e.msg, "gives dp = 3 on 6 ranks"), "%s",
          txt(e.msg));
}

/* Imported values (a Hugging Face config.json) may fill the keys the user left alone, and must
 * agree with the ones given: the config knows which were given, by the YAML or --set. */
static void test_was_set_marks_the_keys_the_yaml_and_set_give(void) {
    ust_config c;
    ust_err e;
    CHECK(load(&c, "model: {n_layer: 4, moe: {top_k: 2}}\nparallel: {pp_layers: [2, 2]}\n", &e) ==
              0,
          "%s", txt(e.msg));
    /* n_layer: 4 is the default value, yet given */
    CHECK(cfg_was_set(&c, "model.n_layer") && cfg_was_set(&c, "model.moe.top_k") &&
              cfg_was_set(&c, "parallel.pp_layers"),
          "keys in the YAML are marked");
    CHECK(!cfg_was_set(&c, "model.d_model") && !cfg_was_set(&c, "model.arch"),
          "keys left at their defaults are not");
    CHECK(cfg_set(&c, "model.d_model=64", &e) == 0 && cfg_set(&c, "model.init_from=", &e) == 0,
          "%s", txt(e.msg));
    CHECK(cfg_was_set(&c, "model.d_model") && cfg_was_set(&c, "model.init_from"),
          "--set marks, also an empty value");
    ust_config d = c;
    CHECK(cfg_set(&c, "model.n_head=zero", &e) == -1 && !cfg_was_set(&c, "model.n_head") &&
              memcmp(&c, &d, sizeof c) == 0,
          "a failed --set marks nothing");
    cfg_defaults(&c);
    CHECK(!cfg_was_set(&c, "model.n_layer"), "cfg_defaults clears the marks");
}

static void test_validate_refuses_arch_auto_that_nothing_resolved(void) {
    ust_config c;
    ust_err e;
    CHECK(load(&c, "model: {arch: auto}\n", &e) == 0 && c.model.arch == ARCH_AUTO, "%s",
          txt(e.msg));
    CHECK(cfg_validate(&c, 1, &e) == -1 &&
              strstr(e.msg, "model.arch: auto takes the architecture from a Hugging Face model "
                            "directory in model.init_from") &&
              strstr(e.msg, "but model.init_from is null"),
          "got: %s", txt(e.msg));
}

/* dualpipe and dualpipev hold two stages per rank: parallel.vpp left out is 2 under them (from
 * the YAML or a later --set, and back to 1 when --set picks another schedule); an explicit vpp
 * other than 2 stays an error naming the value. */
static void test_dualpipe_implies_vpp_2_unless_vpp_is_given(void) {
    const char *sched[] = {"dualpipe", "dualpipev"};
    for (int i = 0; i < 2; i++) {
        ust_config c;
        ust_err e;
        char yaml[256], set[64];
        snprintf(yaml, sizeof yaml,
                 "model: {n_layer: 4}\nparallel: {pp: 2, pp_schedule: %s}\n"
                 "train: {micro_batch_size: 1, global_batch_size: 8}\n",
                 sched[i]);
        CHECK(load(&c, yaml, &e) == 0 && c.parallel.vpp == 2 && cfg_vpp_implied(&c) &&
                  cfg_validate(&c, 2, &e) == 0,
              "%s: vpp %d, %s", sched[i], c.parallel.vpp, txt(e.msg));
        CHECK(cfg_set(&c, "parallel.pp_schedule=1f1b", &e) == 0 && c.parallel.vpp == 1 &&
                  !cfg_vpp_implied(&c) && cfg_validate(&c, 2, &e) == 0,
              "%s -> 1f1b: vpp %d, %s", sched[i], c.parallel.vpp, txt(e.msg));
        snprintf(set, sizeof set, "parallel.pp_schedule=%s", sched[i]);
        CHECK(cfg_set(&c, set, &e) == 0 && c.parallel.vpp == 2, "--set %s: vpp %d", set,
              c.parallel.vpp);
        CHECK(cfg_set(&c, "parallel.vpp=1", &e) == 0 && !cfg_vpp_implied(&c) &&
                  cfg_validate(&c, 2, &e) == -1 && strstr(e.msg, "needs parallel.vpp: 2 (got 1)"),
              "%s with an explicit vpp 1: %s", sched[i], txt(e.msg));
    }
}

int main(void) {
    RUN_TEST(test_defaults_are_design_section_1);
    RUN_TEST(test_design_yaml_loads_to_the_defaults);
    RUN_TEST(test_empty_configs_are_refused_and_braces_give_defaults);
    RUN_TEST(test_block_style_sets_every_kind_of_value);
    RUN_TEST(test_flow_style_equals_block_style);
    RUN_TEST(test_null_empties_nullable_strings_only);
    RUN_TEST(test_a_failed_load_leaves_the_config_unchanged);
    RUN_TEST(test_load_file_reads_and_names_the_file);
    RUN_TEST(test_yaml_syntax_errors_have_file_line_col);
    RUN_TEST(test_unknown_keys_suggest_the_nearest_valid_key);
    RUN_TEST(test_duplicate_keys_are_errors);
    RUN_TEST(test_wrong_types_are_errors);
    RUN_TEST(test_out_of_range_values_are_errors);
    RUN_TEST(test_bad_enum_values_list_the_allowed_ones);
    RUN_TEST(test_set_applies_values_parsed_as_yaml_scalars);
    RUN_TEST(test_set_errors_name_the_argument);
    RUN_TEST(test_validate_rejects_layouts_that_do_not_divide);
    RUN_TEST(test_validate_accepts_a_5d_layout_and_skips_world_when_unknown);
    RUN_TEST(test_validate_rechecks_ranges_of_values_set_in_code);
    RUN_TEST(test_size_limits_admit_llama_405b_and_deepseek_v3);
    RUN_TEST(test_every_size_key_has_an_upper_limit);
    RUN_TEST(test_derived_sizes_are_checked_naming_the_keys);
    RUN_TEST(test_threads_are_limited_by_the_online_cpus);
    RUN_TEST(test_list_items_are_range_checked_where_they_stand);
    RUN_TEST(test_deep_nesting_is_refused_at_the_65th_level);
    RUN_TEST(test_configs_over_16_mib_are_refused);
    RUN_TEST(test_derived_values);
    RUN_TEST(test_dump_round_trips_to_an_identical_struct);
    RUN_TEST(test_blend_lists_load_check_and_round_trip);
    RUN_TEST(test_dp_auto_resolves_against_the_world);
    RUN_TEST(test_was_set_marks_the_keys_the_yaml_and_set_give);
    RUN_TEST(test_validate_refuses_arch_auto_that_nothing_resolved);
    RUN_TEST(test_dualpipe_implies_vpp_2_unless_vpp_is_given);
    RUN_TEST(test_mla_validation_names_the_key_and_what_is_allowed);
    return TEST_SUMMARY();
}
