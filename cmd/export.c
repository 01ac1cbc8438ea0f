/* ustrain export CKPT --to hf OUT [--dtype D] [--max-shard-size S] [--no-tokenizer]: a checkpoint
 * in the Hugging Face transformers layout (weights, config.json and the tokenizer files),
 * loadable by transformers' from_pretrained and vLLM. */
#include <stdio.h>
#include <string.h>

#include "cmd.h"
#include "error.h"
#include "export.h"

static const char *EXPORT_USAGE =
    "usage: ustrain export CKPT --to hf OUT [--dtype fp32|bf16|fp16] [--max-shard-size SIZE]\n"
    "                      [--no-tokenizer]\n"
    "  CKPT  a checkpoint step directory (e.g. runs/tiny/ckpt/step_50), or a checkpoint\n"
    "        directory (its newest finished step is exported)\n"
    "  OUT   directory for model.safetensors + config.json (created when missing), and\n"
    "        tokenizer.json, tokenizer_config.json, generation_config.json when the checkpoint\n"
    "        records its training data's tokenizer (data prep's meta.json)\n"
    "  --dtype           weights as fp32 (default), bf16 (round to nearest even) or fp16 (a\n"
    "                    value beyond +-65504 is refused)\n"
    "  --max-shard-size  above it the weights are split into model-0000K-of-0000N.safetensors\n"
    "                    with model.safetensors.index.json (default 5GB; KB/MB/GB/TB: powers of\n"
    "                    1000, as transformers counts; KiB..TiB and K/M/G/T: powers of 1024)\n"
    "  --no-tokenizer    leave the tokenizer files out (a recorded tokenizer.json that is\n"
    "                    missing or changed is otherwise an error)\n";

static int export_usage(const char *what, const char *arg) {
    return cmd_usage_error("ustrain", EXPORT_USAGE, what, arg);
}

static int parse_dtype(const char *s, export_opts *o) {
    if (!strcmp(s, "fp32") || !strcmp(s, "float32"))
        o->dtype = EXPORT_F32;
    else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16"))
        o->dtype = EXPORT_BF16;
    else if (!strcmp(s, "fp16") || !strcmp(s, "float16"))
        o->dtype = EXPORT_F16;
    else
        return export_usage("--dtype %s: expected fp32, bf16 or fp16", s);
    return 0;
}

/* One option at argv[*i] (its value after it); 0, or the usage error's exit code. */
static int parse_option(int argc, char **argv, int *i, const char **to, export_opts *o) {
    const cmd_who who = {"ustrain", EXPORT_USAGE};
    const char *opt = argv[*i];
    if (!strcmp(opt, "--no-tokenizer")) {
        o->no_tokenizer = true;
        return 0;
    }
    int takes = !strcmp(opt, "--to") || !strcmp(opt, "--dtype") || !strcmp(opt, "--max-shard-size");
    if (!takes) return export_usage("unknown option %s for export", opt);
    if (*i + 1 >= argc) return export_usage("%s needs a value", opt);
    const char *v = argv[++*i];
    if (!strcmp(opt, "--to")) {
        *to = v;
        return 0;
    }
    if (!strcmp(opt, "--dtype")) return parse_dtype(v, o);
    double bytes;
    if (cmd_size_opt(&who, opt, v, 1, 1e15, &bytes)) return UST_EXIT_USAGE;
    o->max_shard_bytes = (int64_t)bytes;
    return 0;
}

int cmd_export(int argc, char **argv) {
    const char *ckpt = NULL, *out = NULL, *to = NULL;
    export_opts o = {.dtype = EXPORT_F32};
    if (cmd_wants_help(argc, argv)) return cmd_print_usage(EXPORT_USAGE);
    for (int i = 0; i < argc; i++) {
        int rc = 0;
        if (argv[i][0] == '-' && argv[i][1])
            rc = parse_option(argc, argv, &i, &to, &o);
        else if (!ckpt)
            ckpt = argv[i];
        else if (!out)
            out = argv[i];
        else
            rc = export_usage("unexpected argument %s", argv[i]);
        if (rc) return rc;
    }
    if (!to) return export_usage("%s", "missing --to FORMAT (supported: hf)");
    if (strcmp(to, "hf") != 0)
        return export_usage("unknown export format --to %s (supported: hf)", to);
    if (!ckpt || !out) return export_usage("%s", "missing CKPT or OUT");
    ust_err e;
    export_result r;
    int rc = export_hf(ckpt, out, &o, &r, &e);
    if (rc) {
        fprintf(stderr, "ustrain: error: %s\n", e.msg);
        return rc;
    }
    char weights[64] = "model.safetensors";
    if (r.nshards > 1) snprintf(weights, sizeof weights, "%d shards + index", r.nshards);
    printf("exported %s to %s (%s, %s, %.1f MB of weights; config.json%s%s; Hugging Face "
           "transformers layout)\n",
           r.step, out, weights,
           o.dtype == EXPORT_F32    ? "fp32"
           : o.dtype == EXPORT_BF16 ? "bf16"
                                    : "fp16",
           (double)r.total_bytes / 1e6,
           r.tokenizer ? ", tokenizer.json, tokenizer_config.json" : "",
           r.generation ? ", generation_config.json" : "");
    return 0;
}
