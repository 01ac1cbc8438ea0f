/* ustrain: argument parsing and sub-commands; no training logic lives here.
 * Exit codes: 0 success, 1 runtime failure, 2 bad usage / config / input. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "config.h"
#include "data.h"
#include "error.h"
#include "log.h"
#include "mem.h"
#include "ops.h"
#include "plan.h"
#include "pp_schedule.h"
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
    "                                            byte-level BPE of a Hugging Face tokenizer.json)\n"
    "  bench train CONFIG [--steps N] [--profile] [--set ...]\n"
    "                                            time training steps: ms/step, tok/s, MFU;\n"
    "                                            --profile adds time per op (ops.h)\n"
    "  plan CONFIG --world N [--gpu-mem 80GiB] [--gpus-per-node 8] [--global-batch 512|4M]\n"
    "       [--write OUT.yaml] ...              layouts that fit, ranked by estimated step time\n"
    "                                            (ustrain plan --help: every option)\n"
    "  export CKPT --to hf OUT                   checkpoint -> Hugging Face model.safetensors +\n"
    "                                            config.json (LlamaForCausalLM / GPT2LMHeadModel)\n"
    "  --help, --version\n"
    "\n"
    "exit codes: 0 success, 1 runtime failure, 2 bad usage, config or input\n";

static int usage_error(const char *fmt, const char *arg) {
    return cmd_usage_error("ustrain", "(run `ustrain --help` for usage)", fmt, arg);
}

/* Loads CONFIG and applies every --set (and --steps into *steps_opt); `flag` (may be NULL) is
 * the one option without a value the command takes, left for the caller; any other is an error. */
static int load_config(ust_config *c, int argc, char **argv, int world, int *steps_opt,
                       const char *flag) {
    ust_err e;
    const char *path = NULL;
    cfg_defaults(c);
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--set") == 0 || strcmp(argv[i], "--world") == 0 ||
            strcmp(argv[i], "--steps") == 0) {
            if (i + 1 >= argc) return usage_error("%s needs a value", argv[i]);
            i++;
        } else if (flag && strcmp(argv[i], flag) == 0) {
            continue;
        } else if (argv[i][0] == '-') {
            return usage_error("unknown option %s", argv[i]);
        } else if (!path) {
            path = argv[i];
        } else {
            return usage_error("unexpected argument %s", argv[i]);
        }
    }
    if (!path) return usage_error("%s", "missing CONFIG (a YAML file)");
    if (cfg_load_file(c, path, &e)) goto bad;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--set") == 0 && cfg_set(c, argv[i + 1], &e)) goto bad;
        if (strcmp(argv[i], "--steps") == 0 && steps_opt) *steps_opt = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--set") == 0 || strcmp(argv[i], "--world") == 0 ||
            strcmp(argv[i], "--steps") == 0)
            i++;
    }
    if (cfg_validate(c, world, &e)) goto bad;
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
    int flags = c->parallel.pp_breadth_first ? PPS_BREADTH_FIRST : 0;
    if (pps_build_all(all, c->parallel.pp_schedule, p, v, m, flags, &e) ||
        pps_check_pairs(all, p, &e)) {
        free(all);
        fprintf(stderr, "ustrain: error: %s: %s\n", c->source, e.msg);
        return UST_EXIT_USAGE;
    }
    for (int r = 0; r < p; r++) pps_print(stdout, &all[r]);
    pps_costs cost = c->parallel.pp_schedule == PP_ZB ? (pps_costs){1, 1, 1} : (pps_costs){1, 2, 0};
    pps_sim sim;
    if (pps_simulate(all, p, cost, &sim, &e) == 0)
        printf("schedule %s: p=%d v=%d m=%d; simulated bubble %.4f (analytic (p-1)/(v*m) = %.4f; "
               "time units F=1, %s)\n",
               pps_kind_name(c->parallel.pp_schedule), p, v, m, sim.bubble,
               (double)(p - 1) / ((double)v * m),
               c->parallel.pp_schedule == PP_ZB ? "B=1, W=1" : "B=2");
    pps_free_all(all, p);
    free(all);
    return 0;
}

static int world_option(int argc, char **argv) {
    for (int i = 0; i + 1 < argc; i++)
        if (strcmp(argv[i], "--world") == 0) return atoi(argv[i + 1]);
    return 0;
}

static int cmd_train(int argc, char **argv) {
    ust_config c;
    ust_err e;
    int rc =
        load_config(&c, argc, argv, 0, NULL, NULL); /* the world size is known after bootstrap */
    if (rc) return rc;
    ust_runtime rt;
    train_install_stop_handlers(); /* a stop asked for while joining the job still counts */
    if (train_runtime_init(&rt, &c, &e)) {
        fprintf(stderr, "ustrain: error: %s\n", e.msg);
        return UST_EXIT_USAGE;
    }
    train_opts o = {.quiet = 0, .write_config = 1};
    rc = train_run(&c, &rt, &o, NULL);
    if (rc == 0) train_runtime_finalize(&rt); /* a failed rank leaves without waiting for peers */
    return rc;
}

static int cmd_validate(int argc, char **argv) {
    ust_config c;
    int world = world_option(argc, argv);
    if (world < 0) return usage_error("--world must be positive, got %s", "a negative value");
    int rc = load_config(&c, argc, argv, world, NULL, "--schedule");
    if (rc) return rc;
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
    if (world > 0) {
        topo_grid g;
        ust_err e;
        if (topo_grid_from_config(&g, &c, world, &e)) {
            fprintf(stderr, "ustrain: error: %s\n", e.msg);
            return UST_EXIT_USAGE;
        }
        topo_print(&g, stdout);
    }
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
        if (argc != 2) return usage_error("%s", "usage: ustrain data demo DIR");
        if (data_write_demo(argv[1], &e)) {
            fprintf(stderr, "ustrain: error: %s\n", e.msg);
            return UST_EXIT_RUNTIME;
        }
        printf("wrote the demo dataset to %s\n", argv[1]);
        return 0;
    }
    if (argc >= 1 && strcmp(argv[0], "prep") == 0) return cmd_data_prep(argc - 1, argv + 1);
    return usage_error("%s", "usage: ustrain data demo DIR | ustrain data prep ...");
}

/* Times training steps of CONFIG and reports them against the machine's own sgemm rate. */
static int cmd_bench_train(int argc, char **argv) {
    ust_config c;
    int steps = 10;
    int rc = load_config(&c, argc, argv, 1, &steps, "--profile");
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
    int profile = 0;
    for (int i = 0; i < argc; i++) profile |= strcmp(argv[i], "--profile") == 0;
    train_opts o = {.quiet = 1, .untimed_steps = 2, .profile = profile};
    train_result r;
    rc = train_run(&c, NULL, &o, &r);
    if (rc) return rc;
    mem_plan p;
    plan_memory(&c, &p);
    char b[4][32];
    printf("bench train: %s, %lld parameters, B=%d T=%d, %s, %s\n", c.source, (long long)p.n_params,
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
    return usage_error("%s", "usage: ustrain bench train CONFIG | ustrain bench comm");
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
    if (strcmp(argv[1], "train") == 0) return cmd_train(argc - 2, argv + 2);
    if (strcmp(argv[1], "validate") == 0) return cmd_validate(argc - 2, argv + 2);
    if (strcmp(argv[1], "data") == 0) return cmd_data(argc - 2, argv + 2);
    if (strcmp(argv[1], "bench") == 0) return cmd_bench(argc - 2, argv + 2);
    if (strcmp(argv[1], "export") == 0) return cmd_export(argc - 2, argv + 2);
    if (strcmp(argv[1], "plan") == 0) return cmd_plan(argc - 2, argv + 2);
    return usage_error("unknown command '%s'", argv[1]);
}
