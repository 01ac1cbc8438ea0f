/* ustrain data prep: argument parsing for the prep pipeline (core/prep.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"
#include "error.h"
#include "prep.h"
#include "tokenizer.h"

static const char *PREP_USAGE =
    "usage: ustrain data prep --out DIR [--tokenizer tokenizer.json] [--jsonl-field NAME]\n"
    "                         [--eot ID|none] [--threads N] [--val-fraction F] [--shard-tokens N]\n"
    "                         [--chunk-bytes N] FILE...";

static int prep_error(const char *fmt, const char *a, const char *b) {
    return cmd_usage_error("ustrain", PREP_USAGE, fmt, a, b);
}

/* A whole number in [lo, hi], or -1 with *ok = 0. */
static long long parse_int(const char *s, long long lo, long long hi, int *ok) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    *ok = errno == 0 && end != s && *end == 0 && v >= lo && v <= hi;
    return v;
}

static int parse_option(prep_args *a, const char **tok_path, const char *opt, const char *val) {
    int ok = 1;
    if (strcmp(opt, "--out") == 0) {
        a->out_dir = val;
    } else if (strcmp(opt, "--tokenizer") == 0) {
        *tok_path = val;
    } else if (strcmp(opt, "--jsonl-field") == 0) {
        a->jsonl_field = val;
    } else if (strcmp(opt, "--eot") == 0) {
        a->eot =
            strcmp(val, "none") == 0 ? PREP_EOT_NONE : (int)parse_int(val, 0, INT32_MAX - 1, &ok);
        if (!ok) return prep_error("--eot %s: expected a token id >= 0 or 'none'%s", val, "");
    } else if (strcmp(opt, "--threads") == 0) {
        a->threads = (int)parse_int(val, 1, 256, &ok);
        if (!ok) return prep_error("--threads %s: expected 1..256%s", val, "");
    } else if (strcmp(opt, "--shard-tokens") == 0) {
        a->shard_tokens = parse_int(val, 1, INT32_MAX, &ok);
        if (!ok) return prep_error("--shard-tokens %s: expected 1..%s", val, "2147483647");
    } else if (strcmp(opt, "--chunk-bytes") == 0) {
        a->chunk_bytes = parse_int(val, 16, 1LL << 40, &ok);
        if (!ok) return prep_error("--chunk-bytes %s: expected at least 16%s", val, "");
    } else if (strcmp(opt, "--val-fraction") == 0) {
        char *end;
        a->val_fraction = strtod(val, &end);
        if (end == val || *end || a->val_fraction >= 1)
            return prep_error("--val-fraction %s: expected a number below 1 (0 = default 0.1, "
                              "negative = no val shards)%s",
                              val, "");
    } else {
        return prep_error("unknown option %s for data prep%s", opt, "");
    }
    return 0;
}

static void report(const prep_args *a, const prep_result *r, const tok_tokenizer *t) {
    char eot[32] = "none";
    if (r->eot >= 0) snprintf(eot, sizeof eot, "%d", r->eot);
    int64_t n = r->ntrain + r->nval;
    printf("data prep: %lld documents, %.1f MB -> %lld tokens in %.2f s (%.3fM tokens/s, %d "
           "threads)\n",
           (long long)r->ndocs, (double)r->nbytes / 1e6, (long long)n, r->seconds,
           r->seconds > 0 ? (double)n / r->seconds / 1e6 : 0.0, r->threads);
    printf("  tokenizer: %s; vocab %d (uint%d tokens), end of text %s\n",
           t ? tok_describe(t) : "bytes", r->vocab_size, 8 * r->width, eot);
    printf("  train: %lld tokens in %d shards (%s/train_*.bin); val: %lld tokens in %d shards "
           "(%s/val_*.bin)\n",
           (long long)r->ntrain, r->ntrain_shards, a->out_dir, (long long)r->nval, r->nval_shards,
           a->out_dir);
}

int cmd_data_prep(int argc, char **argv) {
    prep_args a = {.eot = PREP_EOT_DEFAULT, .progress = isatty(2)};
    const char *tok_path = NULL;
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    int rc = 0;
    for (int i = 0; rc == 0 && i < argc; i++) {
        if (argv[i][0] != '-')
            inputs[a.ninputs++] = argv[i];
        else if (i + 1 >= argc)
            rc = prep_error("%s needs a value%s", argv[i], "");
        else
            rc = parse_option(&a, &tok_path, argv[i], argv[i + 1]), i++;
    }
    a.inputs = inputs;
    if (rc == 0 && (!a.out_dir || !a.ninputs))
        rc = prep_error("%s%s", !a.out_dir ? "missing --out DIR" : "no input files", "");
    tok_tokenizer *t = NULL;
    ust_err e;
    if (rc == 0 && tok_path && tok_load(&t, tok_path, &e)) {
        fprintf(stderr, "ustrain: error: %s\n", e.msg);
        rc = UST_EXIT_USAGE;
    }
    a.tok = t;
    prep_result r;
    if (rc == 0 && prep_run(&a, &r, &e)) {
        fprintf(stderr, "ustrain: error: %s\n", e.msg);
        rc = UST_EXIT_USAGE;
    }
    if (rc == 0) report(&a, &r, t);
    tok_free(t);
    free(inputs);
    return rc;
}
