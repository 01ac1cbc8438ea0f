/* ustrain: argument parsing and sub-commands; no training logic lives here.
 * Exit codes: 0 success, 1 runtime failure, 2 bad usage / config / input. */
#include <glob.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "cmd.h"
#include "config.h"
#include "data.h"
#include "error.h"
#include "eval_task.h"
#include "fs.h"
#include "hf_import.h"
#include "log.h"
#include "mem.h"
#include "ops.h"
#include "plan.h"
#include "pp.h"
#include "pp_schedule.h"
#include "prep.h"
#include "topology.h"
#include "train.h"

#define UST_VERSION "0.1.0"

static const char *USAGE =
    "usage: ustrain <command> [options]\n"
    "\n"
    "commands:\n"
    "  train CONFIG [--set key.path=value ...]   train (resumes from the newest checkpoint)\n"
    "  validate CONFIG [--world N] [--schedule] [--set ...]\n"
    "                                            check the config, print topology and memory plan\n"
    "                                            (--schedule: the pipeline schedule of every "
    "rank)\n"
    "  data demo DIR                             write the bundled demo dataset\n"
    "  data prep --out DIR [--tokenizer tokenizer.json] [--jsonl-field NAME] [--eot ID|none]\n"
    "            [--threads N] [--val-fraction F] [--shard-tokens N] FILE...\n"
    "                                            text / JSON lines -> llm.c shards (bytes, or the\n"
    "                                            BPE of a Hugging Face tokenizer.json)\n"
    "  bench train CONFIG [--steps N] [--profile] [--trace] [--set ...]\n"
    "                                            time training steps: ms/step, tok/s, MFU;\n"
    "                                            --profile adds time per op (ops.h), --trace a\n"
    "                                            timeline of them and its cost\n"
    "  bench comm [--min-bytes B] [--max-bytes B] [--iters N] [--backend shm|nccl]\n"
    "                                            check and time all-reduce, all-gather,\n"
    "                                            reduce-scatter and all-to-all\n"
    "  bench attention [--seq-len T] [--doc-len L] attention with and without document\n"
    "                                            masking (data.doc_mask) on a long sequence\n"
    "  plan CONFIG --world N [--gpu-mem 80GiB] [--gpus-per-node 8] [--global-batch 512|4M]\n"
    "       [--write OUT.yaml] ...              layouts that fit, ranked by estimated step time\n"
    "                                            (ustrain plan --help: every option)\n"
    "  generate CKPT (--prompt TEXT | --prompt-file F) [--max-new-tokens N] [--temperature T]\n"
    "           [--top-k K] [--top-p P] [--seed S] [--device cpu|cuda] [--tokenizer PATH|bytes]\n"
    "                                            text from a checkpoint (KV cache, streamed)\n"
    "  bench generate CONFIG [--new-tokens N]    decode tokens/s vs the memory-bandwidth bound\n"
    "  export CKPT --to hf OUT [--dtype fp32|bf16|fp16] [--max-shard-size 5GB] [--no-tokenizer]\n"
    "                                            checkpoint -> Hugging Face weights, config.json\n"
    "                                            and tokenizer files (Llama / Mixtral / GPT-2)\n"
    "  eval CKPT_OR_HF_DIR --data GLOB [--steps N] [--seq-len T] [--micro-batch-size B]\n"
    "       [--set ...]                         mean loss and perplexity over GLOB's tokens\n"
    "  flight DIR                                the flight recorder's diagnosis of a hang from\n"
    "                                            DIR/flight/rank_R.json (who waits on whom)\n"
    "  --help, --version\n"
    "\n"
    "exit codes: 0 success, 1 runtime failure, 2 bad usage, config or input\n";

static const char *TRAIN_USAGE =
    "usage: ustrain train CONFIG [--set key.path=value ...]\n"
    "  trains the model of CONFIG (a YAML file); resumes from the newest finished checkpoint in\n"
    "  checkpoint.dir (checkpoint.resume: auto). --set overrides one key, checked like the YAML.\n"
    "  Under a launcher (scripts/ustrun, srun, mpirun) every rank runs this same command.\n";

static const char *VALIDATE_USAGE =
    "usage: ustrain validate CONFIG [--world N] [--schedule] [--set key.path=value ...]\n"
    "  checks the config without training: the model, the layout, the topology of N ranks\n"
    "  (--world, 1..16777216; the layout's dp*tp*pp*cp must equal it) and the per-rank memory\n"
    "  plan, which must fit this machine's memory on run.device: cpu.\n"
    "  --schedule: also the pipeline schedule of every pipeline rank.\n";

static const char *BENCH_TRAIN_USAGE =
    "usage: ustrain bench train CONFIG [--steps N] [--profile] [--trace] [--set key.path=value "
    "...]\n"
    "  times N training steps (default 10, 1..1000000) after two untimed warm-up steps:\n"
    "  ms/step, tokens/s, MFU (on cpu against this machine's measured sgemm rate).\n"
    "  --profile: time per op (calls, ms, share). Writes no checkpoint.\n"
    "  --trace: then the same steps again, the timed ones traced (logging.trace, into\n"
    "  logging.trace.dir or run.out_dir/trace), and the tracing's cost against the first run.\n";

static const char *DATA_USAGE =
    "usage: ustrain data demo DIR\n"
    "       ustrain data prep --out DIR [options] FILE...   (ustrain data prep --help)\n";

static const char *DEMO_USAGE =
    "usage: ustrain data demo DIR\n"
    "  writes the bundled demo dataset (generated text, byte tokens; no download) to DIR:\n"
    "  DIR/train_*.bin and DIR/val_*.bin, the shards configs/tiny.yaml reads from data/tiny, and\n"
    "  DIR/meta.json (\"tokenizer\": \"bytes\": ids 0..255 are the bytes, 256 ends a text).\n";

static const char *BENCH_USAGE =
    "usage: ustrain bench train CONFIG [--steps N] [--profile] [--trace] [--set ...]\n"
    "       ustrain bench comm [--min-bytes B] [--max-bytes B] [--iters N] [--backend shm|nccl]\n"
    "       ustrain bench attention [--seq-len T] [--doc-len L] [--iters N] ...\n"
    "                          [--timeout S]\n"
    "       ustrain bench generate CONFIG [--prompt-tokens N] [--new-tokens N] [--set ...]\n"
    "  (ustrain bench train --help, ustrain bench comm --help, ustrain bench generate --help)\n";

static int usage_error(const char *fmt, const char *arg) {
    return cmd_usage_error("ustrain", "(run `ustrain --help` for usage)", fmt, arg);
}

/* What one config-reading sub-command accepts besides CONFIG and --set. */
typedef struct {
    const char *name;   /* "validate": its errors point at `ustrain validate --help` */
    int *world;         /* --world N taken (validate), else NULL */
    int *steps;         /* --steps N taken (bench train), else NULL */
    const char *flag;   /* the one option without a value the command takes, or NULL */
    const char *flag2;  /* ... and a second one (bench train: --trace), or NULL */
    int known_world;    /* the world size without --world (0: unknown) */
    bool world_is_hint; /* known_world resolves parallel.dp: auto only (train checks it later) */
    bool fits_machine;  /* refuse a plan this machine's memory cannot hold (plan_check_fits) */
} config_args;

/* Loads CONFIG and applies every --set; --world and --steps (where the command takes them) are
 * parsed strictly into *a->world / *a->steps; any other option is an error. */
static int load_config(ust_config *c, int argc, char **argv, const config_args *a) {
    ust_err e;
    const char *path = NULL;
    char hint[96];
    snprintf(hint, sizeof hint, "(run `ustrain %s --help` for usage)", a->name);
    cmd_who who = {"ustrain", hint};
    long long v;
    cfg_defaults(c);
    if (a->world) *a->world = 0;
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i];
        bool world = a->world && strcmp(o, "--world") == 0;
        bool steps = a->steps && strcmp(o, "--steps") == 0;
        if (strcmp(o, "--set") == 0 || world || steps) {
            if (i + 1 >= argc) return cmd_usage_error("ustrain", hint, "%s needs a value", o);
            i++;
            if (!world && !steps && cmd_set_arg(&who, argc, argv, i)) return UST_EXIT_USAGE;
            if (world && cmd_int_opt(&who, o, argv[i], 1, CFG_MAX_WORLD, &v)) return UST_EXIT_USAGE;
            if (world) *a->world = (int)v;
            if (steps && cmd_int_opt(&who, o, argv[i], 1, 1000000, &v)) return UST_EXIT_USAGE;
            if (steps) *a->steps = (int)v;
        } else if ((a->flag && strcmp(o, a->flag) == 0) || (a->flag2 && strcmp(o, a->flag2) == 0)) {
            continue;
        } else if (o[0] == '-') {
            return cmd_usage_error("ustrain", hint, "unknown option %s for %s", o, a->name);
        } else if (!path) {
            path = o;
        } else {
            return cmd_usage_error("ustrain", hint, "unexpected argument %s", o);
        }
    }
    if (!path) return cmd_usage_error("ustrain", hint, "missing CONFIG (a YAML file)");
    if (cfg_load_file(c, path, &e)) goto bad;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--set") == 0 && cfg_set(c, argv[i + 1], &e)) goto bad;
        if (strcmp(argv[i], "--set") == 0 || (a->world && strcmp(argv[i], "--world") == 0) ||
            (a->steps && strcmp(argv[i], "--steps") == 0))
            i++;
    }
    /* a Hugging Face model.init_from decides the model's shape (and model.arch: auto) */
    if (hf_resolve_config(c, &e)) goto bad;
    int world = a->world && *a->world ? *a->world : a->known_world;
    if (cfg_resolve_auto(c, world, &e) || cfg_validate(c, a->world_is_hint ? 0 : world, &e))
        goto bad;
    if (a->fits_machine && plan_check_fits(c, &e)) goto bad;
    return 0;
bad:
    fprintf(stderr, "ustrain: error: %s\n", e.msg);
    return UST_EXIT_USAGE;
}

/* Prints every pipeline rank's schedule (the actions pipeline parallelism will execute) and the
 * simulated bubble beside the analytic one. */
static int print_schedule(const ust_config *c) {
    int p = c->parallel.pp, v = c->parallel.vpp, m = cfg_grad_accum(c);
    ust_err e;
    if (p > PPS_MAX_P) {
        fprintf(stderr, "ustrain: error: parallel.pp = %d: schedules print up to %d ranks\n", p,
                PPS_MAX_P);
        return UST_EXIT_USAGE;
    }
    pps_schedule *all = calloc(p, sizeof *all);
    pps_schedule me;
    int slots[MODEL_MAX_CHUNKS];
    if (pp_plan(c, 0, &me, slots, &e)) { /* the flags the executor would run with */
        fprintf(stderr, "ustrain: error: %s: %s\n", c->source, e.msg);
        free(all);
        return UST_EXIT_USAGE;
    }
    int flags = me.flags;
    ust_pp_schedule kind = me.kind;
    pps_free(&me);
    if (pps_build_all(all, kind, p, v, m, flags, &e) || pps_check_pairs(all, p, &e)) {
        free(all);
        fprintf(stderr, "ustrain: error: %s: %s\n", c->source, e.msg);
        return UST_EXIT_USAGE;
    }
    for (int r = 0; r < p; r++) pps_print(stdout, &all[r]);
    int split = pps_splits(&all[0]);
    pps_costs cost = split ? (pps_costs){1, 1, 1} : (pps_costs){1, 2, 0};
    pps_sim sim;
    const char *formula;
    double analytic = pps_analytic_bubble(kind, p, v, m, cost, &formula);
    if (pps_simulate(all, p, cost, &sim, &e) != 0) { /* a deadlock: the schedule is wrong */
        fprintf(stderr, "ustrain: error: %s: %s\n", c->source, e.msg);
        pps_free_all(all, p);
        free(all);
        return UST_EXIT_USAGE;
    }
    double dataflow = -1;
    if (pps_dataflow(all, p, cost, &dataflow, &e) != 0) dataflow = -1;
    printf("peak activation sets per rank:");
    for (int r = 0; r < p; r++) printf(" %d", sim.peak_alive[r]);
    printf("\n");
    /* simulated: under the executor's comm rule (pp_schedule.h); dataflow: the compute orders
     * alone, transfers free and asynchronous (what the published bubbles assume) */
    printf("schedule %s: p=%d v=%d m=%d; simulated bubble %.4f (analytic %s = %.4f; "
           "time units F=1, %s); dataflow bubble %.4f\n",
           pps_kind_name(kind), p, v, m, sim.bubble, formula, analytic, split ? "B=1, W=1" : "B=2",
           dataflow);
    pps_free_all(all, p);
    free(all);
    return 0;
}

/* The world size the launcher announces before the bootstrap (torchrun-style WORLD_SIZE,
 * mpirun, srun), 1 without a launcher: what parallel.dp: auto is resolved against; the bootstrap
 * then checks the world it finds equals the layout. */
static int launcher_world(void) {
    const char *vars[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        char *end;
        long n = v ? strtol(v, &end, 10) : 0;
        if (v && *v && !*end && n >= 1 && n <= CFG_MAX_WORLD) return (int)n;
    }
    return 1;
}

static int cmd_train(int argc, char **argv) {
    ust_config c;
    ust_err e;
    if (cmd_wants_help(argc, argv)) return cmd_print_usage(TRAIN_USAGE);
    /* the world size is checked after bootstrap; parallel.dp: auto takes the launcher's */
    config_args a = {.name = "train", .fits_machine = true};
    a.known_world = launcher_world();
    a.world_is_hint = true;
    int rc = load_config(&c, argc, argv, &a);
    if (rc) return rc;
    ust_runtime rt;
    task_set *tasks;
    if (task_load_all(&c, &tasks, &e)) { /* eval.tasks: read and tokenized before any work */
        fprintf(stderr, "ustrain: error: %s\n", e.msg);
        return UST_EXIT_USAGE;
    }
    train_install_stop_handlers(); /* a stop asked for while joining the job still counts */
    if (train_runtime_init(&rt, &c, &e)) {
        fprintf(stderr, "ustrain: error: %s\n", e.msg);
        task_free_all(&c, tasks);
        return UST_EXIT_USAGE;
    }
    train_opts o = {.quiet = 0, .write_config = 1, .tasks = tasks};
    rc = train_run(&c, &rt, &o, NULL);
    if (rc == 0) train_runtime_finalize(&rt); /* a failed rank leaves without waiting for peers */
    task_free_all(&c, tasks);
    return rc;
}

/* 1 when every dataset's glob matches a file on this machine. */
static int data_present(const cfg_dataset *sets, int n) {
    for (int d = 0; d < n; d++) {
        glob_t g;
        int rc = glob(sets[d].path, 0, NULL, &g);
        globfree(&g);
        if (rc != 0) return 0;
    }
    return 1;
}

/* eval.tasks read and tokenized as train reads them (their files here: else named, unchecked). */
static int validate_tasks(const ust_config *c, ust_err *e) {
    cfg_task t[CFG_MAX_TASKS];
    int n = cfg_eval_tasks(c, t);
    for (int i = 0; i < n; i++)
        if (access(t[i].path, F_OK) != 0) {
            fprintf(stderr,
                    "ustrain: note: eval.tasks[%d] (%s): %s not found here, tasks not checked\n", i,
                    t[i].name, t[i].path);
            return 0;
        }
    task_set *sets;
    if (task_load_all(c, &sets, e)) return -1;
    for (int i = 0; i < n; i++)
        printf("eval.tasks[%d]: %s, %d items (%lld choices), every %d steps\n", i, t[i].name,
               sets[i].n, (long long)sets[i].nex, t[i].every);
    task_free_all(c, sets);
    return 0;
}

/* What train checks before it locks, reads or allocates anything, by the same functions: the
 * output paths and the backend (train_check_runnable), the shards' meta.json, and every dataset
 * of the blend opened as train opens it (shard headers, a window of seq_len + 1 tokens). A config
 * is often validated away from its data (a laptop, `ustrain plan`'s output): datasets matching no
 * file here are named on stderr and left to train, which refuses them. */
static int validate_preflight(const ust_config *c, ust_err *e) {
    int eot;
    if (train_check_runnable(c, e) || data_check_meta(c, &eot, e)) return -1;
    for (int val = 0; val < 2; val++) {
        cfg_dataset sets[CFG_MAX_BLEND];
        int n = cfg_data_sets(c, val, sets);
        if (n == 0 || (val && (c->data.val_every <= 0 || cfg_val_micro_batches(c) <= 0))) continue;
        if (!data_present(sets, n)) {
            fprintf(stderr,
                    "ustrain: note: data.%s: files not found here, not checked (train refuses "
                    "a glob that matches nothing)\n",
                    val ? "val" : "train");
            continue;
        }
        data_blend *b;
        if (data_blend_open(&b, sets, n, c->data.format, c->model.vocab_size, c->train.seq_len, e))
            return -1;
        data_blend_close(b);
    }
    return validate_tasks(c, e);
}

/* model.sliding_window: which layers attend through a window, and whether training sees it. */
/* model.gemma's options (Gemma 3's block), when any is set */
static void print_gemma(const ust_config *c) {
    const __typeof__(c->model.gemma) *g = &c->model.gemma;
    if (!g->sandwich_norm && !g->norm_offset && !g->embed_scale && g->hidden_act == HACT_SILU &&
        !g->query_pre_attn_scalar && !g->rope_local_theta)
        return;
    printf("block: %s MLP%s%s%s, head_dim %d", g->hidden_act == HACT_SILU ? "SwiGLU" : "GeGLU",
           g->norm_offset ? ", norms by (1 + w)" : "",
           g->sandwich_norm ? ", norms before and after attention and the MLP" : "",
           g->embed_scale ? ", embeddings x sqrt(d_model)" : "", cfg_head_dim(c));
    if (g->query_pre_attn_scalar > 0) printf(", logits / sqrt(%g)", g->query_pre_attn_scalar);
    if (g->rope_local_theta > 0) printf(", windowed layers' rope theta %g", g->rope_local_theta);
    printf("\n");
}

/* model.attn_softcap / final_softcap (Gemma 2's soft-capping), when either is set */
static void print_softcap(const ust_config *c) {
    const __typeof__(c->model.gemma) *g = &c->model.gemma;
    if (g->attn_softcap > 0)
        printf("attention scores soft-capped: %g tanh(s / %g)\n", g->attn_softcap, g->attn_softcap);
    if (g->final_softcap > 0)
        printf("final logits soft-capped: %g tanh(x / %g)\n", g->final_softcap, g->final_softcap);
}

static void print_windows(const ust_config *c) {
    int n = 0, w = 0;
    for (int l = 0; l < c->model.n_layer; l++)
        if (cfg_layer_window(c, l)) n++, w = cfg_layer_window(c, l);
    if (!c->model.sliding_window[0]) return;
    if (!n) {
        printf("attention: sliding window [%s] >= model.max_seq_len (%d): full attention\n",
               c->model.sliding_window, c->model.max_seq_len);
        return;
    }
    int sizes[CFG_MAX_WINDOWS];
    if (cfg_windows(c, sizes) > 1) { /* several sizes: the list as given */
        printf("attention: sliding windows [%s] (%d layers windowed of %d)\n",
               c->model.sliding_window, n, c->model.n_layer);
        return;
    }
    printf("attention: sliding window of %d keys on %d of %d layers%s\n", w, n, c->model.n_layer,
           w >= c->train.seq_len ? " (>= train.seq_len: full attention in training, the window "
                                   "only matters to generate)"
                                 : "");
}

/* The mixture of experts: its routing and which layers are MoE (a mixed model's dense layers
 * have model.d_ff). */
static void print_moe(const ust_config *c) {
    const __typeof__(c->model.moe) *m = &c->model.moe;
    if (m->num_experts <= 0) return;
    printf("moe: %d experts, top-%d of %s scores", m->num_experts, m->top_k,
           m->score == MOE_SIGMOID ? "sigmoid" : "softmax");
    if (m->n_group > 1) printf(" in %d of %d groups", m->topk_group, m->n_group);
    printf(", gates %s x %g; experts d_ff %d", m->norm_topk ? "renormalized" : "not renormalized",
           m->routed_scale, m->d_ff_expert);
    if (m->shared_expert)
        printf(", shared expert d_ff %d", m->shared_d_ff ? m->shared_d_ff : m->d_ff_expert);
    printf("; MoE layers");
    int dense = 0;
    for (int l = 0; l < c->model.n_layer; l++)
        if (cfg_layer_is_moe(c, l))
            printf(" %d", l);
        else
            dense++;
    printf(" of %d (%d dense, d_ff %d)\n", c->model.n_layer, dense, c->model.d_ff);
}

/* Where the run will write, its positions' RoPE and the datasets it reads. */
static void print_run_settings(const ust_config *c) {
    printf("outputs: checkpoints %s (every %d steps, resume %s), metrics %s, tensorboard %s\n",
           c->checkpoint.dir[0] ? c->checkpoint.dir : "none (checkpoint.dir is empty)",
           c->checkpoint.every, c->checkpoint.resume,
           c->logging.metrics_file[0] ? c->logging.metrics_file : "none",
           c->logging.tensorboard_dir[0] ? c->logging.tensorboard_dir : "none");
    if (c->model.arch == ARCH_GPT2)
        printf("positions: learned (gpt2), no RoPE\n");
    else if (c->model.rope_scaling.type == ROPE_LLAMA3)
        printf("rope: theta %g, llama3 scaling factor %g (low %g, high %g, original %d)\n",
               c->model.rope_theta, c->model.rope_scaling.factor,
               c->model.rope_scaling.low_freq_factor, c->model.rope_scaling.high_freq_factor,
               c->model.rope_scaling.original_max_position_embeddings);
    else if (c->model.rope_scaling.type == ROPE_YARN)
        printf("rope: theta %g, yarn scaling factor %g (original %d, beta_fast %g, beta_slow %g, "
               "attention factor %g)\n",
               c->model.rope_theta, c->model.rope_scaling.factor,
               c->model.rope_scaling.original_max_position_embeddings,
               c->model.rope_scaling.beta_fast, c->model.rope_scaling.beta_slow, ops_rope(c).attn);
    else if (c->model.rope_scaling.type == ROPE_LINEAR)
        printf("rope: theta %g, linear scaling factor %g\n", c->model.rope_theta,
               c->model.rope_scaling.factor);
    else
        printf("rope: theta %g, no scaling\n", c->model.rope_theta);
    print_windows(c);
    print_gemma(c);
    print_softcap(c);
    print_moe(c);
    for (int val = 0; val < 2; val++) {
        cfg_dataset sets[CFG_MAX_BLEND];
        int n = cfg_data_sets(c, val, sets);
        double sum = 0;
        for (int d = 0; d < n; d++) sum += sets[d].weight;
        printf("data.%s:%s", val ? "val" : "train", n ? "" : " none");
        for (int d = 0; d < n; d++) printf(" %s (weight %.4g)", sets[d].path, sets[d].weight / sum);
        printf("\n");
    }
    int vm = cfg_val_micro_batches(c), B = c->train.micro_batch_size;
    if (cfg_data_sets(c, 1, (cfg_dataset[CFG_MAX_BLEND]){0}) && c->data.val_every > 0)
        printf("validation: every %d steps, %lld windows of %d tokens = %d micro-batches (%s)\n",
               c->data.val_every, (long long)vm * B, c->train.seq_len, vm,
               c->data.val_samples > 0 ? "data.val_samples"
               : c->data.val_tokens > 0
                   ? "data.val_tokens"
                   : "data.val_steps; its windows change with the micro-batch");
}

/* Node-limited routing's placement (model.moe.max_nodes_per_token): checked against the ranks
 * per node the launcher gives (LOCAL_WORLD_SIZE, ranks numbered node after node) when the layout
 * spans several nodes; else the assumption is printed. Returns -1 with the message. */
static int validate_expert_nodes(const ust_config *c, int world, ust_err *e) {
    const __typeof__(c->model.moe) *m = &c->model.moe;
    topo_grid g;
    if (!m->max_nodes_per_token || !m->num_experts) return 0;
    if (topo_grid_from_config(&g, c, world, e)) return -1;
    const char *lw = getenv("LOCAL_WORLD_SIZE");
    int local = lw && *lw ? atoi(lw) : 0, k = topo_group_holders(&g, c);
    if (local < 1 || local >= g.world) {
        printf("moe: node-limited routing takes the %d expert groups (model.moe.n_group) for "
               "nodes: assumed each is held by the ranks of one node (ranks numbered node after "
               "node, tp x cp x ep / n_group = %d dividing the ranks per node); the ranks per "
               "node are not known here, so one node is assumed, where no dispatch crosses "
               "nodes (LOCAL_WORLD_SIZE=N checks a placement)\n",
               m->n_group, g.tp * g.cp * (k ? k : 1));
        return 0;
    }
    int *node_of = malloc(sizeof(int) * (size_t)g.world), rc;
    UST_ASSERT(node_of, "out of memory");
    for (int r = 0; r < g.world; r++) node_of[r] = r / local;
    rc = topo_check_expert_nodes(&g, c, node_of, local, e);
    free(node_of);
    if (!rc)
        printf("moe: node-limited routing: each of the %d expert groups is held by the ranks "
               "of one node (%d ranks per node, LOCAL_WORLD_SIZE): a token's experts span at "
               "most %d nodes\n",
               m->n_group, local, m->max_nodes_per_token);
    return rc;
}

static int cmd_validate(int argc, char **argv) {
    ust_config c;
    int world = 0;
    if (cmd_wants_help(argc, argv)) return cmd_print_usage(VALIDATE_USAGE);
    config_args a = {
        .name = "validate", .world = &world, .flag = "--schedule", .fits_machine = true};
    int rc = load_config(&c, argc, argv, &a);
    if (rc) return rc;
    ust_err e;
    if (validate_preflight(&c, &e) || validate_expert_nodes(&c, world, &e)) {
        fprintf(stderr, "ustrain: error: %s\n", e.msg);
        return UST_EXIT_USAGE;
    }
    printf("config %s: valid\n", c.source);
    printf("model: %s, %d layers, d_model %d, %d heads (%d kv), d_ff %d, vocab %d (padded %d)\n",
           c.model.arch == ARCH_GPT2 ? "gpt2" : "llama", c.model.n_layer, c.model.d_model,
           c.model.n_head, c.model.n_kv_head, c.model.d_ff, c.model.vocab_size,
           cfg_vocab_padded(&c));
    printf("layout: dp=%d tp=%d pp=%d cp=%d ep=%d (world %d); global batch %d = micro %d x "
           "grad accum %d x dp %d\n",
           c.parallel.dp, c.parallel.tp, c.parallel.pp, c.parallel.cp, c.parallel.ep,
           c.parallel.dp * c.parallel.tp * c.parallel.pp * c.parallel.cp, c.train.global_batch_size,
           c.train.micro_batch_size, cfg_grad_accum(&c), c.parallel.dp);
    if (cfg_vpp_implied(&c))
        printf("parallel.vpp: 2, implied by pp_schedule: %s (each pipeline rank holds two "
               "stages); an explicit vpp must be 2\n",
               c.parallel.pp_schedule == PP_DUALPIPE ? "dualpipe" : "dualpipev");
    if (world > 0) {
        topo_grid g;
        if (topo_grid_from_config(&g, &c, world, &e)) {
            fprintf(stderr, "ustrain: error: %s\n", e.msg);
            return UST_EXIT_USAGE;
        }
        topo_print(&g, stdout);
    }
    print_run_settings(&c);
    mem_plan p;
    plan_memory(&c, &p);
    plan_print(&c, &p, stdout);
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--schedule") == 0) return print_schedule(&c);
    return 0;
}

static int cmd_data(int argc, char **argv) {
    ust_err e;
    if (argc >= 1 && strcmp(argv[0], "demo") == 0) {
        if (cmd_wants_help(argc - 1, argv + 1)) return cmd_print_usage(DEMO_USAGE);
        if (argc != 2 || argv[1][0] == '-')
            return cmd_usage_error("ustrain", DEMO_USAGE, "%s",
                                   argc != 2 ? "data demo takes one DIR"
                                             : "data demo takes no options");
        /* the demo text is byte tokens with end of text 256, as data prep without a tokenizer
         * writes them: its meta.json says so */
        struct stat st;
        if (stat(argv[1], &st) == 0 && !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "ustrain: error: data demo: %s exists and is not a directory (%s)\n",
                    argv[1], fs_kind(st.st_mode));
            return UST_EXIT_USAGE;
        }
        if (ckpt_refuse_in_step(argv[1], "data demo:", &e)) {
            fprintf(stderr, "ustrain: error: %s\n", e.msg);
            return UST_EXIT_USAGE;
        }
        if (data_write_demo(argv[1], &e) || prep_write_meta(argv[1], NULL, 256, 257, 2, NULL, &e)) {
            fprintf(stderr, "ustrain: error: %s\n", e.msg);
            return UST_EXIT_RUNTIME;
        }
        printf("wrote the demo dataset to %s\n", argv[1]);
        return 0;
    }
    if (argc >= 1 && strcmp(argv[0], "prep") == 0) return cmd_data_prep(argc - 1, argv + 1);
    if (cmd_wants_help(argc, argv)) return cmd_print_usage(DATA_USAGE);
    static const char *const kinds[] = {"demo", "prep"};
    const char *near = argc >= 1 ? cfg_nearest(argv[0], kinds, 2) : NULL;
    if (near)
        return cmd_usage_error("ustrain", DATA_USAGE, "unknown data '%s' (did you mean 'data %s'?)",
                               argv[0], near);
    return cmd_usage_error("ustrain", DATA_USAGE, "%s", "data needs demo or prep");
}

/* --trace: the same steps again with the timed ones traced (logging.trace), the trace's path and
 * the tracing's cost against the untraced run just made (one run each: on a busy machine the
 * difference includes its noise). */
static int bench_traced(ust_config *c, const train_opts *o, const train_result *plain) {
    snprintf(c->logging.trace_steps, sizeof c->logging.trace_steps, "3,%lld",
             (long long)c->train.steps);
    train_opts q = *o;
    q.quiet = 0; /* the trace's own lines; the step lines go with it */
    train_result r;
    int rc = train_run(c, NULL, &q, &r);
    if (rc) return rc;
    printf("bench train --trace: %.1f ms/step traced, %.1f ms/step untraced: tracing costs "
           "%+.1f%% of the step\n",
           r.mean_step_ms, plain->mean_step_ms,
           100 * (r.mean_step_ms - plain->mean_step_ms) / plain->mean_step_ms);
    return 0;
}

/* Times training steps of CONFIG and reports them against the machine's own sgemm rate. */
static int cmd_bench_train(int argc, char **argv) {
    ust_config c;
    int steps = 10;
    if (cmd_wants_help(argc, argv)) return cmd_print_usage(BENCH_TRAIN_USAGE);
    config_args a = {.name = "bench train",
                     .steps = &steps,
                     .flag = "--profile",
                     .flag2 = "--trace",
                     .known_world = 1,
                     .fits_machine = true}; /* one process */
    int rc = load_config(&c, argc, argv, &a);
    if (rc) return rc;
    c.train.steps = steps + 2; /* two warm-up steps (first touch of every buffer), not timed */
    c.checkpoint.every = 0;
    c.checkpoint.dir[0] = 0; /* a benchmark neither locks, reads nor writes checkpoints */
    snprintf(c.checkpoint.resume, sizeof c.checkpoint.resume, "none");
    c.data.val_every = 0;
    /* on CPU the denominator is this machine's own sgemm rate, measured here; on GPU the
     * configured (or default) peak */
    double sgemm = 0;
    if (c.run.device == DEV_CPU) {
        ust_ops *ops = ops_cpu_create(c.train.threads, 1);
        sgemm = ops_measure_sgemm_flops(ops, 1024, 6);
        ops->destroy(ops);
        c.logging.peak_flops = sgemm;
    }
    int profile = 0, trace = 0;
    for (int i = 0; i < argc; i++) profile |= strcmp(argv[i], "--profile") == 0;
    for (int i = 0; i < argc; i++) trace |= strcmp(argv[i], "--trace") == 0;
    train_opts o = {.quiet = 1, .untimed_steps = 2, .profile = profile};
    train_result r;
    rc = train_run(&c, NULL, &o, &r);
    if (rc) return rc;
    if (trace) rc = bench_traced(&c, &o, &r);
    if (rc) return rc;
    mem_plan p;
    plan_memory(&c, &p);
    char b[4][32];
    printf("bench train: %s, %lld parameters (%lld with vocabulary padding), B=%d T=%d, %s, %s\n",
           c.source, (long long)(p.n_params - p.n_pad_params), (long long)p.n_params,
           c.train.micro_batch_size, c.train.seq_len, c.run.device == DEV_CUDA ? "cuda" : "cpu",
           c.train.precision == PREC_BF16 ? "bf16" : "fp32");
    if (sgemm > 0) printf("  sgemm peak (OpenBLAS, 1024^3): %.1f GFLOP/s\n", sgemm / 1e9);
    printf("  step: %.1f ms, %.0f tokens/s, %.3g GFLOP/token\n", r.mean_step_ms, r.tokens_per_s,
           r.flops_per_token / 1e9);
    if (sgemm > 0)
        printf("  MFU vs measured sgemm: %.1f%%  (target >= 60%%)\n", 100 * r.mfu);
    else
        printf("  MFU vs %.0f TFLOP/s: %.1f%%\n", r.peak_flops / 1e12, 100 * r.mfu);
    printf("  memory: peak RSS %s, arena %s, plan %s (RSS/plan %.2f)\n",
           log_bytes(b[0], 32, (double)r.peak_rss), log_bytes(b[1], 32, r.arena_bytes),
           log_bytes(b[2], 32, p.total), (double)r.peak_rss / p.total);
    return 0;
}

static int cmd_bench(int argc, char **argv) {
    if (argc >= 1 && strcmp(argv[0], "train") == 0) return cmd_bench_train(argc - 1, argv + 1);
    if (argc >= 1 && strcmp(argv[0], "comm") == 0) return cmd_bench_comm(argc - 1, argv + 1);
    if (argc >= 1 && strcmp(argv[0], "attention") == 0)
        return cmd_bench_attention(argc - 1, argv + 1);
    if (argc >= 1 && strcmp(argv[0], "generate") == 0)
        return cmd_bench_generate(argc - 1, argv + 1);
    if (cmd_wants_help(argc, argv)) return cmd_print_usage(BENCH_USAGE);
    static const char *const kinds[] = {"train", "comm", "attention", "generate"};
    const char *near = argc >= 1 ? cfg_nearest(argv[0], kinds, 4) : NULL;
    if (near)
        return cmd_usage_error("ustrain", BENCH_USAGE,
                               "unknown bench '%s' (did you mean 'bench %s'?)", argv[0], near);
    return cmd_usage_error("ustrain", BENCH_USAGE, "%s",
                           "bench needs train, comm, attention or generate");
}

/* The stack ustrain needs. Measured (train of configs/tiny.yaml; OMP_NUM_THREADS=2 with an async
 * checkpoint; a pp=2 run under scripts/ustrun): it dies with SIGSEGV below 160, 224 and 224 KiB of
 * `ulimit -s`, which glibc also gives every thread it starts (OpenMP's, the checkpoint writer) as
 * its default stack. Running the work on a thread of a chosen stack size would leave those
 * threads at the limit, and raising the soft limit here comes too late for glibc's thread
 * default (read at start-up); so a smaller limit is refused up front, with a 4x margin over the
 * measured 224 KiB for larger models and other code paths. */
enum { STACK_NEED_KIB = 1024 };

/* Exit 2 naming the limit, instead of a SIGSEGV deep in a step. */
static int check_stack_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_STACK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ||
        rl.rlim_cur >= (rlim_t)STACK_NEED_KIB * 1024)
        return 0;
    char hard[32];
    if (rl.rlim_max == RLIM_INFINITY)
        snprintf(hard, sizeof hard, "unlimited");
    else
        snprintf(hard, sizeof hard, "%llu KiB", (unsigned long long)rl.rlim_max / 1024);
    fprintf(stderr,
            "ustrain: error: the stack size limit (ulimit -s) is %llu KiB; ustrain needs at least "
            "%d KiB (every thread gets this limit as its stack). Raise it in the shell that "
            "starts ustrain, e.g. `ulimit -s 8192` (the hard limit here is %s)\n",
            (unsigned long long)rl.rlim_cur / 1024, STACK_NEED_KIB, hard);
    return UST_EXIT_USAGE;
}

/* libgomp reads its spin count (how long an idle OpenMP thread busy-waits before it sleeps)
 * from the environment when it is loaded, before main. For the commands that compute, a start
 * without OMP_WAIT_POLICY or GOMP_SPINCOUNT sets the one ops_cpu_spin_count picks for the
 * ranks of this node (LOCAL_WORLD_SIZE) and runs this binary again, once: UST_OMP_AUTO marks
 * the second start (set it to 0 to keep libgomp's default, e.g. under valgrind). argv and the
 * rest of the environment are unchanged; when the exec fails the run goes on as it is. */
static void reexec_with_spin_count(char **argv) {
    static const char *const computing[] = {"train", "bench", "eval", "generate"};
    int computes = 0;
    for (size_t i = 0; i < sizeof computing / sizeof computing[0]; i++)
        computes |= strcmp(argv[1], computing[i]) == 0;
    if (!computes || getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") ||
        getenv("UST_OMP_AUTO"))
        return;
    const char *lw = getenv("LOCAL_WORLD_SIZE");
    char spin[32];
    snprintf(spin, sizeof spin, "%lld", ops_cpu_spin_count(lw ? atoi(lw) : 1));
    if (setenv("GOMP_SPINCOUNT", spin, 1) != 0 || setenv("UST_OMP_AUTO", "1", 1) != 0) return;
    execv("/proc/self/exe", argv);
    unsetenv("GOMP_SPINCOUNT"); /* no exec: this process keeps libgomp's default */
    unsetenv("UST_OMP_AUTO");
}

int main(int argc, char **argv) {
    /* a file-size limit (ulimit -f) makes writes fail with EFBIG, reported like a full disk,
     * instead of killing the process in the middle of a checkpoint */
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        fputs(USAGE, argc < 2 ? stderr : stdout);
        return argc < 2 ? UST_EXIT_USAGE : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("ustrain %s\n", UST_VERSION);
        return 0;
    }
    if (check_stack_limit()) return UST_EXIT_USAGE;
    reexec_with_spin_count(argv);
    if (strcmp(argv[1], "train") == 0) return cmd_train(argc - 2, argv + 2);
    if (strcmp(argv[1], "validate") == 0) return cmd_validate(argc - 2, argv + 2);
    if (strcmp(argv[1], "data") == 0) return cmd_data(argc - 2, argv + 2);
    if (strcmp(argv[1], "bench") == 0) return cmd_bench(argc - 2, argv + 2);
    if (strcmp(argv[1], "export") == 0) return cmd_export(argc - 2, argv + 2);
    if (strcmp(argv[1], "generate") == 0) return cmd_generate(argc - 2, argv + 2);
    if (strcmp(argv[1], "eval") == 0) return cmd_eval(argc - 2, argv + 2);
    if (strcmp(argv[1], "plan") == 0) return cmd_plan(argc - 2, argv + 2);
    if (strcmp(argv[1], "flight") == 0) return cmd_flight(argc - 2, argv + 2);
    static const char *const commands[] = {"train",    "validate", "data", "bench", "export",
                                           "generate", "eval",     "plan", "flight"};
    const char *near = cfg_nearest(argv[1], commands, sizeof commands / sizeof commands[0]);
    if (near)
        return cmd_usage_error("ustrain", "(run `ustrain --help` for usage)",
                               "unknown command '%s' (did you mean '%s'?)", argv[1], near);
    return usage_error("unknown command '%s'", argv[1]);
}
