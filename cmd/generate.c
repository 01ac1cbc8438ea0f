/* ustrain generate CKPT (--prompt TEXT | --prompt-file F) [options]: text from a trained
 * checkpoint (core/generate), and ustrain bench generate CONFIG: decode speed against the
 * memory-bandwidth bound. Options are parsed strictly (cmd.h) before anything is loaded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "config.h"
#include "error.h"
#include "fs.h"
#include "generate.h"

static const char *GENERATE_USAGE =
    "usage: ustrain generate CKPT (--prompt TEXT | --prompt-file FILE) [--max-new-tokens N]\n"
    "                        [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
    "                        [--device cpu|cuda] [--tokenizer PATH|bytes] [--dump-logits FILE]\n"
    "                        [--allow-nonfinite]\n"
    "  CKPT  a checkpoint step directory, or a checkpoint directory (its newest finished step)\n"
    "  --max-new-tokens N  at most N new tokens (default 128; also stops at end of text and at\n"
    "                      the model's max_seq_len)\n"
    "  --temperature T     0 is greedy (argmax); default 1.0\n"
    "  --top-k K           sample among the K most likely tokens (default 50; 0: all)\n"
    "  --top-p P           nucleus: the smallest set holding P of the probability (default 1.0)\n"
    "  --seed S            the same seed gives the same text (default 0)\n"
    "  --tokenizer         tokenizer.json, or bytes (id = byte); default: the checkpoint's record\n"
    "  --dump-logits FILE  each new token's logits over the real vocabulary, fp32 rows\n"
    "  --allow-nonfinite   load a Hugging Face model holding NaN or Inf weights (refused)\n"
    "  The text goes to stdout as it is generated; counts, prefill time and tokens/s to stderr.\n";

static const char *BENCH_GENERATE_USAGE =
    "usage: ustrain bench generate CONFIG [--prompt-tokens N] [--new-tokens N] [--set ...]\n"
    "  decode tokens/s of CONFIG's model with random weights (greedy, N new tokens after a\n"
    "  prompt of N tokens; defaults 16 and 32) against the memory-bandwidth bound: weight bytes\n"
    "  read per token over memcpy's bandwidth, measured in the same run.\n";

typedef struct {
    const char *ckpt, *prompt, *prompt_file;
    gen_options o;
} gen_args;

/* The value after option argv[*i]; NULL (and a usage error printed) when there is none. */
static const char *value(int argc, char **argv, int *i, const char *usage) {
    if (*i + 1 >= argc) {
        cmd_usage_error("ustrain", usage, "%s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

/* One option at argv[*i]: 0 taken, 2 bad (message printed), 1 not a numeric option. */
static int numeric_opt(gen_args *a, const char *opt, const char *v) {
    cmd_who w = {"ustrain", "(run `ustrain generate --help` for usage)"};
    long long n;
    double d;
    gen_sampling *s = &a->o.sampling;
    if (!strcmp(opt, "--max-new-tokens")) {
        if (cmd_int_opt(&w, opt, v, 1, 1 << 24, &n)) return 2;
        a->o.max_new = (int)n;
    } else if (!strcmp(opt, "--top-k")) {
        if (cmd_int_opt(&w, opt, v, 0, 1 << 24, &n)) return 2;
        s->top_k = (int)n;
    } else if (!strcmp(opt, "--seed")) {
        if (cmd_int_opt(&w, opt, v, 0, INT64_MAX, &n)) return 2;
        s->seed = (uint64_t)n;
    } else if (!strcmp(opt, "--temperature")) {
        if (cmd_num_opt(&w, opt, v, 0, 100, 0, &d)) return 2;
        s->temperature = d;
    } else if (!strcmp(opt, "--top-p")) {
        if (cmd_num_opt(&w, opt, v, 0, 1, CMD_LO_OPEN, &d)) return 2;
        s->top_p = d;
    } else {
        return 1;
    }
    return 0;
}

static int parse(gen_args *a, int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i], *v;
        if (o[0] != '-' || !o[1]) {
            if (a->ckpt)
                return cmd_usage_error("ustrain", GENERATE_USAGE, "unexpected argument %s", o);
            a->ckpt = o;
            continue;
        }
        if (!strcmp(o, "--allow-nonfinite")) { /* a flag: no value */
            a->o.allow_nonfinite = 1;
            continue;
        }
        if (!(v = value(argc, argv, &i, GENERATE_USAGE))) return UST_EXIT_USAGE;
        int rc = numeric_opt(a, o, v);
        if (rc == 2) return UST_EXIT_USAGE;
        if (rc == 0) continue;
        if (!strcmp(o, "--prompt"))
            a->prompt = v;
        else if (!strcmp(o, "--prompt-file"))
            a->prompt_file = v;
        else if (!strcmp(o, "--tokenizer"))
            a->o.tokenizer = v;
        else if (!strcmp(o, "--dump-logits"))
            a->o.dump_logits = v;
        else if (!strcmp(o, "--device") && (!strcmp(v, "cpu") || !strcmp(v, "cuda")))
            a->o.device = !strcmp(v, "cuda") ? DEV_CUDA : DEV_CPU;
        else if (!strcmp(o, "--device"))
            return cmd_usage_error("ustrain", GENERATE_USAGE, "--device %s: expected cpu or cuda",
                                   v);
        else
            return cmd_usage_error("ustrain", GENERATE_USAGE, "unknown option %s for generate", o);
    }
    if (!a->ckpt) return cmd_usage_error("ustrain", GENERATE_USAGE, "missing CKPT");
    if (!a->prompt == !a->prompt_file)
        return cmd_usage_error("ustrain", GENERATE_USAGE,
                               "give exactly one of --prompt and --prompt-file");
    return 0;
}

/* The prompt file's bytes (malloc'd; at most 64 MiB, far beyond any max_seq_len of text), or
 * NULL with the message printed. */
static char *read_prompt_file(const char *path, size_t *n) {
    ust_err e;
    char *buf = fs_read_file(path, 64u << 20, n, &e);
    if (!buf) fprintf(stderr, "ustrain: error: --prompt-file %s\n", e.msg);
    return buf;
}

int cmd_generate(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) return cmd_print_usage(GENERATE_USAGE);
    gen_args a = {.o = {.max_new = 128,
                        .sampling = {.temperature = 1.0, .top_k = 50, .top_p = 1.0},
                        .device = DEV_CPU,
                        .out = stdout}};
    int rc = parse(&a, argc, argv);
    if (rc) return rc;
    char *file = NULL;
    if (a.prompt_file && !(file = read_prompt_file(a.prompt_file, &a.o.prompt_len)))
        return UST_EXIT_USAGE;
    a.o.prompt = file ? file : a.prompt;
    if (!file) a.o.prompt_len = strlen(a.prompt);
    ust_err e;
    rc = gen_run(a.ckpt, &a.o, &e);
    if (rc) fprintf(stderr, "ustrain: error: %s\n", e.msg);
    free(file);
    return rc;
}

int cmd_bench_generate(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) return cmd_print_usage(BENCH_GENERATE_USAGE);
    cmd_who w = {"ustrain", BENCH_GENERATE_USAGE};
    const char *path = NULL;
    long long prompt = 16, fresh = 32;
    ust_config c;
    ust_err e;
    cfg_defaults(&c);
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i], *v;
        if (o[0] != '-') {
            if (path)
                return cmd_usage_error("ustrain", BENCH_GENERATE_USAGE, "unexpected argument %s",
                                       o);
            if (cfg_load_file(&c, path = o, &e)) goto bad;
            continue;
        }
        if (!(v = value(argc, argv, &i, BENCH_GENERATE_USAGE))) return UST_EXIT_USAGE;
        if (!strcmp(o, "--prompt-tokens")) {
            if (cmd_int_opt(&w, o, v, 1, 1 << 20, &prompt)) return UST_EXIT_USAGE;
        } else if (!strcmp(o, "--new-tokens")) {
            if (cmd_int_opt(&w, o, v, 1, 1 << 20, &fresh)) return UST_EXIT_USAGE;
        } else if (!strcmp(o, "--set")) {
            if (!path)
                return cmd_usage_error("ustrain", BENCH_GENERATE_USAGE, "--set before CONFIG");
            if (cmd_set_arg(&w, argc, argv, i)) return UST_EXIT_USAGE;
            if (cfg_set(&c, v, &e)) goto bad;
        } else {
            return cmd_usage_error("ustrain", BENCH_GENERATE_USAGE,
                                   "unknown option %s for bench generate", o);
        }
    }
    if (!path)
        return cmd_usage_error("ustrain", BENCH_GENERATE_USAGE, "missing CONFIG (a YAML file)");
    if (cfg_validate(&c, 0, &e)) goto bad;
    int rc = gen_bench(&c, (int)prompt, (int)fresh, &e);
    if (rc) fprintf(stderr, "ustrain: error: %s\n", e.msg);
    return rc;
bad:
    fprintf(stderr, "ustrain: error: %s\n", e.msg);
    return UST_EXIT_USAGE;
}
