/* config: the run's YAML (libyaml) -> a typed, validated ust_config.
 * cfg_defaults, then cfg_load_file (unknown/duplicate keys, wrong types and bad values are
 * errors with file:line:col and a did-you-mean; so are a text over CFG_MAX_BYTES and nesting
 * deeper than CFG_MAX_DEPTH; an empty file is refused), then cfg_set for each --set key.path=value,
 * then cfg_validate against the world size. Every error returns -1 with the message in ust_err;
 * callers exit 2 before any heavy work. cfg_dump writes the effective config as YAML. */
#ifndef UST_CONFIG_H
#define UST_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "error.h"

#define UST_PATH_MAX 512
#define CFG_DATA_MAX 8192  /* data.train / data.val: a glob or a blend of datasets */
#define CFG_MAX_BLEND 64   /* datasets in a blend */
#define CFG_TASKS_MAX 8192 /* eval.tasks as text */
#define CFG_MAX_TASKS 16   /* eval.tasks entries */
#define CFG_MAX_MTP 4      /* model.mtp.depth */

/* Limits that keep every derived size representable (64-bit byte counts, 32-bit token and row
 * counts) while leaving room for the largest real models (llama-405B: 126 layers, d_model
 * 16384, d_ff 53248, vocab 128256; DeepSeek-V3: 256 experts of d_ff 2048, 671B parameters).
 * Per-key ranges are in config_schema.c's table; these are the ones other modules need too. */
#define CFG_MAX_BYTES (16 << 20)      /* a config file */
#define CFG_MAX_DEPTH 64              /* lists and mappings inside each other */
#define CFG_MAX_WORLD (1 << 24)       /* ranks: dp * tp * pp * cp, and each of them */
#define CFG_MAX_THREADS 1024          /* train.threads; also at most 4 x online CPUs */
#define CFG_MAX_TOKENS (1 << 24)      /* train.micro_batch_size * seq_len */
#define CFG_MAX_PARAMS (1LL << 42)    /* about 4.4e12 */
#define CFG_MAX_ACT_BYTES (1LL << 56) /* activations of the micro-batches a rank holds */

/* ARCH_AUTO: the architecture of a Hugging Face model.init_from (hf_import resolves it before
 * cfg_validate, which refuses it unresolved) */
typedef enum { ARCH_GPT2, ARCH_LLAMA, ARCH_AUTO } ust_arch;
typedef enum { MOE_SOFTMAX, MOE_SIGMOID } ust_moe_score; /* model.moe.score */
typedef enum { ROPE_NONE, ROPE_LLAMA3, ROPE_YARN, ROPE_LINEAR } ust_rope_scaling;
/* model.hidden_act: the gated MLP's activation, SwiGLU or GeGLU (gelu with tanh, Gemma) */
typedef enum { HACT_SILU, HACT_GELU_TANH } ust_hidden_act;
typedef enum { DEV_CPU, DEV_CUDA } ust_device;
typedef enum { PREC_FP32, PREC_BF16 } ust_precision;
typedef enum { RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL } ust_recompute;
typedef enum { ONNAN_STOP, ONNAN_SKIP } ust_on_nan;
typedef enum { SPIKE_NONE, SPIKE_SKIP, SPIKE_REWIND } ust_on_spike;
typedef enum { SCHED_COSINE, SCHED_LINEAR, SCHED_CONSTANT, SCHED_WSD } ust_lr_schedule;
#define CFG_SCHED_SAME 4 /* a group's schedule: "same", the optimizer's */

/* optimizer.embed, optimizer.norm: a parameter group's own schedule shape and weight decay
 * (core/model/optim.c:optim_group_lr); -1 and "same" keep the optimizer's. */
typedef struct {
    int schedule;        /* ust_lr_schedule, or CFG_SCHED_SAME */
    int warmup_steps;    /* -1: optimizer.warmup_steps */
    double min_lr;       /* the group's floor; -1: optimizer.min_lr x the group's peak / lr */
    double weight_decay; /* -1: optimizer.weight_decay */
} cfg_lr_group;
typedef enum { PP_AFAB, PP_1F1B, PP_INTERLEAVED, PP_ZB, PP_DUALPIPEV, PP_DUALPIPE } ust_pp_schedule;
typedef enum { CP_ZIGZAG, CP_CONTIGUOUS } ust_cp_layout;
/* ring / allgather: key-value blocks travel (cp.h); a2a: DeepSpeed-Ulysses, an all-to-all from
 * sequence-split to head-split and back; a2a+ring: Ulysses over groups of parallel.cp_a2a ranks,
 * the ring across them (hierarchical). */
typedef enum { CP_RING, CP_ALLGATHER, CP_A2A, CP_A2A_RING } ust_cp_comm;
typedef enum { DATA_LLMC, DATA_NANOGPT, DATA_MEGATRON } ust_data_format;

typedef struct {
    struct {
        char name[128];
        uint64_t seed;
        ust_device device;
        char out_dir[UST_PATH_MAX];
        double memory_limit_mb; /* the arena's limit (0: none; cuda: the device's free memory) */
        bool deterministic; /* false: kernels with float atomics (run-to-run rounding) allowed */
    } run;
    struct {
        ust_arch arch;
        int n_layer, d_model, n_head, n_kv_head, d_ff;
        int vocab_size; /* real vocabulary */
        int vocab_pad;  /* padded to a multiple of this (default 128) */
        int max_seq_len;
        double rope_theta;
        double norm_eps;              /* RMSNorm/LayerNorm epsilon (default 1e-5) */
        bool tie_embeddings;          /* gpt2 always ties; llama may */
        bool qkv_bias;                /* llama with q/k/v biases (Qwen2); gpt2 always has them */
        bool qk_norm;                 /* llama: each head's q and k RMSNormed (Qwen3) */
        bool qk_norm_whole;           /* qk_norm over the whole q/k projection (OLMo 2) */
        bool post_norm;               /* llama: norms after attention and the MLP (OLMo 2) */
        double partial_rotary_factor; /* llama: RoPE on this share of each head's features */
        int head_dim;                 /* q/k/v head width (0: d_model / n_head; Gemma's differs) */
        struct { /* Gemma 3's block (docs/huggingface.md#gemma-3); the keys are model.<name> */
            ust_hidden_act hidden_act;    /* silu (SwiGLU) or gelu_tanh (GeGLU) */
            bool norm_offset;             /* every RMSNorm scales by (1 + weight) */
            bool sandwich_norm;           /* norms before and after attention and the MLP */
            bool embed_scale;             /* the embeddings times sqrt(d_model) */
            double query_pre_attn_scalar; /* attention logits scaled by 1/sqrt(this) (0: D) */
            double rope_local_theta;      /* RoPE base of the windowed layers (0: rope_theta) */
            double attn_softcap;          /* attention scores -> c tanh(s / c) (0: none; Gemma 2) */
            double final_softcap; /* the head's logits -> c tanh(x / c) (0: none; Gemma 2) */
        } gemma;
        char sliding_window[256];     /* "" (full), "W" (every layer) or one window per layer */
        bool allow_nonfinite;         /* import an HF model holding NaN/Inf weights (refused) */
        char init_from[UST_PATH_MAX]; /* "" = random init; an llm.c gpt2 .bin or an HF dir */
        struct {
            int num_experts, top_k, d_ff_expert, every;
            bool shared_expert;
            double aux_loss_coef, z_loss_coef, capacity_factor;
            /* aux-loss-free balancing (DeepSeek-V3): a per-expert routing bias for the top-k
             * choice only, moved each step by rate * sign(mean load - load) from the step's
             * global counts (0: off, no bias tensor) */
            double bias_update_rate;
            /* DeepSeek-V3's complementary sequence-wise balance loss: coef * mean over the
             * micro-batch's sequences of E * sum_e f_e P_e within the sequence (0: off) */
            double seq_aux_loss_coef;
            bool grouped_gemm; /* the local experts' projections as one grouped GEMM each
                                * (default); false: one linear per expert (for comparison) */
            /* which layers are MoE (cfg_layer_is_moe): the first first_dense are dense
             * (DeepSeek's first_k_dense_replace); layers "" (every-th) or one 0/1 per layer */
            int first_dense;
            char layers[256];
            /* routing (moe.h): scores softmax or sigmoid (DeepSeek-V3); the k gates
             * renormalized to sum 1 (norm_topk, Qwen3-MoE's norm_topk_prob) and times
             * routed_scale; group-limited choice: the experts in n_group groups, the k chosen
             * within the topk_group groups of highest top-2 score sums */
            ust_moe_score score;
            bool norm_topk;
            int n_group, topk_group;
            double routed_scale;
            int shared_d_ff; /* the shared expert's width (0: d_ff_expert) */
            /* DeepSeek-V3's node-limited routing: the n_group groups are the nodes EP places
             * them on; a token's experts come from at most this many, ranked by the sum of
             * their top_k / max_nodes_per_token best scores (0: off) */
            int max_nodes_per_token;
        } moe;
        struct { /* Llama 3.1's rope_scaling (ops.h ust_rope) */
            ust_rope_scaling type;
            double factor, low_freq_factor, high_freq_factor;
            int original_max_position_embeddings;
            double beta_fast, beta_slow, attention_factor; /* yarn (0: 0.1 ln(factor) + 1) */
            bool truncate;                                 /* yarn: integer correction range */
        } rope_scaling;
        struct { /* DeepSeek-V3's multi-head latent attention (model_mla.h; docs/deepseek.md) */
            bool enabled;
            int q_lora_rank;  /* 0: q = W_q x (no q compression) */
            int kv_lora_rank; /* the latent c_kv's width */
            int qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
            /* the Hugging Face files' order of the rope rows (DeepSeek's interleaved pairs,
             * permuted on import and back on export); training always rotates (i, i + R/2) */
            bool rope_interleave;
            bool cp_latent; /* cp ring/allgather pass the latent, not K/V (cfg_cp_latent) */
            /* YaRN's softmax scale on every q/k feature (transformers' yarn_apply_mscale):
             * logits x (0.1 mscale_all_dim ln(rope_scaling.factor) + 1)^2; 0: none */
            double mscale_all_dim;
        } mla;
        struct {       /* DeepSeek-V3's multi-token prediction (model_mtp.h; docs/deepseek.md) */
            int depth; /* D sequential modules after the main model; 0: none (at most
                          CFG_MAX_MTP) */
            double loss_weight; /* lambda: loss_weight / D x the sum of their cross-entropies */
        } mtp;
    } model;
    struct {
        int dp, tp, pp, cp, ep;
        bool sp;
        int vpp;
        ust_pp_schedule pp_schedule;
        bool pp_breadth_first; /* interleaved: all micro-batches through a chunk before the next */
        bool tp_across_nodes;  /* tp/cp groups may span nodes without a warning */
        char pp_layers[256];   /* "" or "4,4,3,1": layers of each stage (pp * vpp entries) */
        ust_cp_layout cp_layout;
        ust_cp_comm cp_comm;
        int cp_a2a;                 /* a2a+ring: the Ulysses degree inside (divides cp); 0: unset */
        int zero3_vocab_chunk_rows; /* ZeRO-3: rows of a vocabulary chunk (0: a layer's worth) */
        double dp_bucket_mb;
    } parallel;
    struct {
        int64_t steps;
        int seq_len, micro_batch_size, global_batch_size;
        ust_precision precision;
        ust_recompute recompute;
        double grad_clip; /* <= 0: no clipping */
        ust_on_nan on_nan;
        ust_on_spike on_spike; /* a loss or grad-norm spike: nothing, skip the update, rewind */
        double spike_zscore;   /* a spike: z-score above this over the last spike_window steps */
        int spike_window;
        int max_rewinds;       /* on_spike: rewind: more rewinds to one checkpoint stop the run */
        int threads;           /* compute threads per rank, 0 = cores / local ranks */
        double exit_after_min; /* > 0: checkpoint and exit 0 after this long (from start) */
        int64_t stop_at_step;  /* > 0: checkpoint and exit 0 after this step */
        struct {               /* Megatron's rampup-batch-size (cfg_batch_at); start 0: off */
            int start, increment; /* sequences: the first steps' global batch, and its steps */
            int64_t tokens;       /* the ramp's length in tokens consumed */
            bool sqrt_lr;         /* lr times sqrt(the step's batch / global_batch_size) */
        } batch_ramp;
        struct {            /* short sequences first (cfg_seq_len_at); start 0: off */
            int64_t start;  /* the first steps' sequence length: seq_len / 2^k */
            int64_t tokens; /* the warmup's length in tokens consumed */
        } seq_len_warmup;
    } train;
    struct {
        char name[16]; /* "adamw" or "muon" */
        int zero_stage;
        double lr, min_lr;
        int warmup_steps;
        ust_lr_schedule schedule;
        double decay_frac; /* wsd: fraction of steps in the final decay */
        double beta1, beta2, eps, weight_decay;
        /* muon: momentum, Nesterov, Newton-Schulz steps, scale rule (0 moonlight, 1 original),
         * the AdamW groups' lr (0: lr) and whether MoE routers take Muon */
        double momentum, adamw_lr;
        bool nesterov, muon_routers;
        bool reset_state; /* resume: the checkpoint's weights only (another optimizer's state) */
        int state_dtype;  /* 0: fp32 moments and momentum, 1: bf16 (fp32 master weights kept) */
        int ns_steps, muon_scale;
        double qk_clip_threshold; /* > 0: QK-clip (MuonClip) at this max attention logit; 0: off */
        double embed_lr, norm_lr; /* > 0: peak lr of the embeddings/head, the norms/biases */
        cfg_lr_group embed, norm; /* ... and their schedule shapes and weight decays */
    } optimizer;
    struct {
        ust_data_format format;
        /* a glob, or a blend: a list of {path, weight, format} kept as canonical flow YAML
         * (read it with cfg_data_sets); val may be "" */
        char train[CFG_DATA_MAX], val[CFG_DATA_MAX];
        bool allow_reweight;  /* a resumed blend may change its weights (from the resume on) */
        bool doc_mask;        /* attention stays inside documents (ended by eot_id) */
        bool reset_positions; /* positions restart at each document */
        int eot_id;           /* the end-of-text id; -1: the shards' meta.json */
        int packing;          /* 0 concat (windows cut from the stream), 1 first_fit */
        int pack_buffer;      /* first_fit: examples packed together */
        int overlong;         /* first_fit: an example over seq_len + 1: 0 split, 1 drop */
        bool shuffle;
        int val_every, val_steps;
        int val_samples;    /* > 0: validation is this many windows (cfg_val_micro_batches) */
        int64_t val_tokens; /* > 0: ... or this many tokens, whole windows */
    } data;
    struct {
        char dir[UST_PATH_MAX];
        int every, keep_last;
        char resume[UST_PATH_MAX]; /* "auto", "none", or a step directory */
        bool async; /* slices staged in host memory, written by a background thread */
    } checkpoint;
    struct {
        int every;
        char metrics_file[UST_PATH_MAX];
        char tensorboard_dir[UST_PATH_MAX]; /* "" = none */
        double peak_flops;                  /* 0 = measured sgemm (cpu) / table (gpu) */
        bool strict;                        /* a failed metrics/event write exits 1 */
        int flight_entries;                 /* flight recorder ring per rank (0: off) */
        double straggler_ratio;       /* a rank's compute over the median above it: a straggler */
        char trace_steps[32];         /* logging.trace.steps "first,last" ("" = off) */
        char trace_dir[UST_PATH_MAX]; /* "" = <run.out_dir>/trace */
        int stats_every;              /* per-layer stability figures every N steps (0: off) */
        double stats_spike;           /* a layer's figure over its mean before: a spike, named */
    } logging;
    struct {
        double timeout_s;
    } dist;
    struct {
        char tasks[CFG_TASKS_MAX];    /* multiple-choice tasks: canonical flow YAML ("": none) */
        char tokenizer[UST_PATH_MAX]; /* their tokenizer.json or "bytes" ("": the data's) */
    } eval;
    char source[UST_PATH_MAX]; /* the YAML file it came from */
    uint64_t set_bits[4];      /* keys given by the YAML or --set (cfg_was_set), by table index */
} ust_config;

/* One dataset of data.train or data.val: its glob, its weight (> 0; 1 for a lone glob) and its
 * format (-1: data.format). */
typedef struct {
    char path[UST_PATH_MAX];
    double weight;
    int format;
} cfg_dataset;
/* The datasets of data.train (val = 0) or data.val (val = 1) into out[CFG_MAX_BLEND]; returns
 * how many (0: data.val is null). A lone glob is one dataset of weight 1. */
int cfg_data_sets(const ust_config *c, int val, cfg_dataset *out);
/* 1 when data.train (or data.val) lists datasets, 0 for a lone glob. */
int cfg_data_is_blend(const ust_config *c, int val);

/* One task of eval.tasks: its name (a metrics key), its JSONL file of items and how often it is
 * scored (every `every` steps, and at the last). */
typedef struct {
    char name[64];
    char path[UST_PATH_MAX];
    int every;
} cfg_task;
/* eval.tasks into out[CFG_MAX_TASKS]; returns how many (0: none). */
int cfg_eval_tasks(const ust_config *c, cfg_task *out);

void cfg_defaults(ust_config *c);
int cfg_load_file(ust_config *c, const char *path, ust_err *e);
int cfg_load_string(ust_config *c, const char *yaml, const char *name, ust_err *e);
/* "section.key=value" (also "model.moe.top_k=2"); value parsed as YAML scalar. */
int cfg_set(ust_config *c, const char *assignment, ust_err *e);
/* Whether key path (e.g. "model.n_layer") was given by the YAML or a --set, rather than left at
 * its default: values imported from elsewhere (hf_apply_config) must agree with those. */
bool cfg_was_set(const ust_config *c, const char *path);
/* The one of names[0..n) nearest to name by edit distance when near enough to be a typo (at
 * most 2 edits, or half the longer name), else NULL: the rule of the "did you mean" hints. */
const char *cfg_nearest(const char *name, const char *const *names, int n);
/* 1 when parallel.vpp is 2 because pp_schedule is dualpipe or dualpipev and vpp was not given
 * (loading and --set imply it; an explicit vpp other than 2 stays an error). */
bool cfg_vpp_implied(const ust_config *c);
/* Ranges and divisibility (heads by tp, layers by pp*vpp, seq by 2*cp, experts by ep,
 * world == dp*tp*pp*cp, batch sizes). world <= 0 skips the world check. */
int cfg_validate(const ust_config *c, int world, ust_err *e);
/* parallel.dp: auto (kept as 0) -> world / (tp x pp x cp), which must divide the global batch
 * in micro-batches; nothing without a world (world <= 0: cfg_validate then refuses auto). */
int cfg_resolve_auto(ust_config *c, int world, ust_err *e);
void cfg_dump(const ust_config *c, FILE *f);

/* Derived values every module agrees on. */
int cfg_vocab_padded(const ust_config *c);
int cfg_grad_accum(const ust_config *c); /* global / (micro * dp) */
/* train.batch_ramp: the global batch of the step that starts after `tokens` tokens were consumed:
 * start + k increments, k = floor(tokens x increments-to-go / ramp tokens), up to
 * global_batch_size (global_batch_size without a ramp). A pure function of the data position,
 * so a resumed run and every layout take the same batches. */
int cfg_batch_at(const ust_config *c, int64_t tokens);
/* train.seq_len_warmup: the sequence length of the step that starts after `tokens` tokens were
 * consumed: the linear start + (seq_len - start) x tokens / warmup tokens rounded down to start
 * x 2^n (OLMo-core's split rule), seq_len from the warmup's end on and without one. Each window
 * of seq_len is then that many sequences of this length. */
int cfg_seq_len_at(const ust_config *c, int64_t tokens);
/* Validation's micro-batches: data.val_samples or val_tokens in whole micro-batches (the same
 * windows for every micro-batch size and layout), else data.val_steps. */
int cfg_val_micro_batches(const ust_config *c);
int cfg_head_dim(const ust_config *c);
/* The Ulysses (all-to-all) degree of the context-parallel group: cp under a2a, parallel.cp_a2a
 * under a2a+ring, 1 under ring and allgather. */
int cfg_cp_a2a(const ust_config *c);
/* The latent ring's width per token (kv_lora_rank + qk_rope_head_dim) when MLA layers' context
 * parallelism passes latents (model.mla.cp_latent, cp > 1, ring or allgather, a schedule without
 * zero-bubble's deferred weight gradients); 0: they pass per-head K/V. */
int cfg_cp_latent(const ust_config *c);
bool cfg_tied(const ust_config *c); /* gpt2, or llama with tie_embeddings */
/* model.sliding_window of layer l: query i sees keys j with i - W < j <= i; 0: full attention
 * (no window, or one of at least model.max_seq_len). */
int cfg_layer_window(const ust_config *c, int l);
/* Layer l (0-based) is a MoE layer: model.moe.num_experts > 0, l >= moe.first_dense, and
 * moe.layers[l] == 1 when the list is given, else l % moe.every == 0. model.mtp's blocks (layers
 * n_layer + k) are MoE in every model with MoE layers (DeepSeek-V3's MTP layer is). */
bool cfg_layer_is_moe(const ust_config *c, int l);
/* MoE layers carry the routing bias router.expert_bias (used for the top-k choice only): with
 * aux-loss-free balancing (moe.bias_update_rate > 0, which moves it) and with sigmoid scores,
 * whose DeepSeek-V3 checkpoints hold it (e_score_correction_bias; frozen at rate 0). */
bool cfg_moe_has_bias(const ust_config *c);
/* The distinct windows below max_seq_len, in the order layers first use them (at most
 * CFG_MAX_WINDOWS, cfg_validate): cfg_windows fills w and returns how many; cfg_window_slot is
 * layer l's window's index among them (-1: full attention). */
#define CFG_MAX_WINDOWS 4
int cfg_windows(const ust_config *c, int *w);
int cfg_window_slot(const ust_config *c, int l);
/* Bytes of one activation element (ops.h act_size): 2 (bf16) on cuda under train.precision
 * bf16, else 4. */
int cfg_act_size(const ust_config *c);

/* The pipeline's shape rules, the one copy that the config check and the schedule builder
 * (pp_schedule.c) share: the first rule a schedule breaks with p ranks, v chunks per rank and
 * m micro-batches per step (m < 0: not known yet, its rules skipped), CFG_PP_OK when none;
 * cfg_pp_rule_text says it in a phrase. */
typedef enum {
    CFG_PP_OK,
    CFG_PP_VPP_SCHEDULE,  /* vpp > 1 under a schedule of one chunk per rank */
    CFG_PP_DPV_PP,        /* dualpipev, pp < 2 */
    CFG_PP_DPV_VPP,       /* dualpipev, vpp != 2 */
    CFG_PP_DP_PP,         /* dualpipe, pp odd or < 2 */
    CFG_PP_DP_VPP,        /* dualpipe, vpp != 2 */
    CFG_PP_VPP_PP,        /* vpp > 1 with one pipeline rank */
    CFG_PP_DPV_MB,        /* dualpipev, m < 2p */
    CFG_PP_DP_MB,         /* dualpipe, m odd or < 2p */
    CFG_PP_INTERLEAVED_MB /* interleaved, m not a multiple of p */
} cfg_pp_rule;
cfg_pp_rule cfg_pp_shape(ust_pp_schedule kind, int p, int v, long long m);
const char *cfg_pp_rule_text(cfg_pp_rule r);

#define CFG_MAX_STAGES 1024
/* parallel.pp_layers as numbers; returns how many (0: an even split). */
int cfg_pp_layers(const ust_config *c, int *per);
/* Global stage s (of pp * vpp) holds layers [lo, hi): parallel.pp_layers, or an even split. */
/* The model's pipeline stages: pp * vpp, but pp under dualpipe (each stage is held twice, by
 * ranks s and pp-1-s, so the two chunks of a rank are two of the pp stages). */
int cfg_pp_stages(const ust_config *c);
void cfg_stage_layers(const ust_config *c, int stage, int *lo, int *hi);

#endif
