/* ustrain data prep: argument parsing for the prep pipeline (core/tools/prep.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"
#include "error.h"
#include "prep.h"
#include "prep_chat.h"
#include "tokenizer.h"

static const char *PREP_USAGE =
    "usage: ustrain data prep --out DIR [--tokenizer tokenizer.json] [--jsonl-field NAME]\n"
    "                         [--eot ID|none] [--threads N] [--val-fraction F] [--shard-tokens N]\n"
    "                         [--chunk-bytes N] [--binary-ok]\n"
    "                         [--chat chatml|llama3|mistral|gemma3|auto]\n"
    "                         [--train-on all|assistant|completion] [--strict] FILE...|-\n"
    "  FILE: text (one document), JSON lines (one document per line, by the .jsonl name or a\n"
    "  first line that is a JSON object; field \"text\" or --jsonl-field), either gzip or zstd\n"
    "  compressed; - reads standard input (e.g. scripts/parquet-text.py data.parquet | ... -);\n"
    "  binary input is refused unless --binary-ok\n"
    "  --eot ID|none 0..2147483646 (default: the tokenizer's <|endoftext|>); --threads 1..256\n"
    "  (default: one per CPU); --val-fraction below 1 (default 0.1; 0 or negative: no val\n"
    "  shards); --shard-tokens 1..2147483647 (default 100M); --chunk-bytes 16..2^40 (1 MiB)\n"
    "  --chat: JSON lines of \"messages\" (or \"prompt\"/\"completion\") rendered by the template\n"
    "  (auto: the one tokenizer_config.json's chat_template is); shards with a target mask of\n"
    "  --train-on (default assistant; without --chat, prompt + completion with completion\n"
    "  targets); malformed lines are named and skipped, or stop prep with --strict\n";

static int prep_error(const char *fmt, const char *a, const char *b) {
    return cmd_usage_error("ustrain", PREP_USAGE, fmt, a, b);
}

static int parse_option(prep_args *a, const char **tok_path, const char *opt, const char *val) {
    const cmd_who who = {"ustrain", PREP_USAGE};
    long long v;
    if (strcmp(opt, "--out") == 0) {
        a->out_dir = val;
    } else if (strcmp(opt, "--tokenizer") == 0) {
        *tok_path = val;
    } else if (strcmp(opt, "--jsonl-field") == 0) {
        a->jsonl_field = val;
    } else if (strcmp(opt, "--eot") == 0) {
        if (strcmp(val, "none") == 0)
            a->eot = PREP_EOT_NONE;
        else if (cmd_int_opt(&who, opt, val, 0, INT32_MAX - 1, &v))
            return UST_EXIT_USAGE;
        else
            a->eot = (int)v;
    } else if (strcmp(opt, "--threads") == 0) {
        if (cmd_int_opt(&who, opt, val, 1, 256, &v)) return UST_EXIT_USAGE;
        a->threads = (int)v;
    } else if (strcmp(opt, "--shard-tokens") == 0) {
        if (cmd_int_opt(&who, opt, val, 1, INT32_MAX, &v)) return UST_EXIT_USAGE;
        a->shard_tokens = v;
    } else if (strcmp(opt, "--chunk-bytes") == 0) {
        if (cmd_int_opt(&who, opt, val, 16, 1LL << 40, &v)) return UST_EXIT_USAGE;
        a->chunk_bytes = v;
    } else if (strcmp(opt, "--chat") == 0) {
        chat_kind k;
        if (chat_kind_parse(val, &k))
            return prep_error("--chat %s: not a template (chatml, llama3, mistral, gemma3, auto)%s",
                              val, "");
        a->chat = (int)k, a->masked = true;
    } else if (strcmp(opt, "--train-on") == 0) {
        const char *names[] = {"all", "assistant", "completion"};
        int k = 0;
        while (k < 3 && strcmp(val, names[k]) != 0) k++;
        if (k == 3) return prep_error("--train-on %s: not all, assistant or completion%s", val, "");
        a->train_on = k, a->masked = true;
    } else if (strcmp(opt, "--val-fraction") == 0) {
        /* 0 (or negative) = no val shards */
        if (cmd_num_opt(&who, opt, val, -INFINITY, 1, CMD_HI_OPEN, &a->val_fraction))
            return UST_EXIT_USAGE;
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
           "thread%s)\n",
           (long long)r->ndocs, (double)r->nbytes / 1e6, (long long)n, r->seconds,
           r->seconds > 0 ? (double)n / r->seconds / 1e6 : 0.0, r->threads,
           r->threads == 1 ? "" : "s");
    printf("  tokenizer: %s; vocab %d (uint%d tokens), end of text %s\n",
           t ? tok_describe(t) : "bytes", r->vocab_size, 8 * r->width, eot);
    printf("  train: %lld tokens in %d shards (%s/train_*.bin); val: %lld tokens in %d shards "
           "(%s/val_*.bin)\n",
           (long long)r->ntrain, r->ntrain_shards, a->out_dir, (long long)r->nval, r->nval_shards,
           a->out_dir);
    if (a->masked)
        printf("  template: %s; %lld target tokens (%.1f%%); %lld malformed lines skipped\n",
               chat_kind_name((chat_kind)r->chat), (long long)r->targets,
               n ? 100.0 * (double)r->targets / (double)n : 0.0, (long long)r->skipped);
    printf("  meta: %s/meta.json (the tokenizer, for training to record and export to ship)\n",
           a->out_dir);
}

int cmd_data_prep(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) return cmd_print_usage(PREP_USAGE);
    prep_args a = {
        .eot = PREP_EOT_DEFAULT, .progress = isatty(2), .val_fraction = 0.1, .train_on = -1};
    const char *tok_path = NULL;
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    int rc = 0;
    for (int i = 0; rc == 0 && i < argc; i++) {
        if (argv[i][0] != '-' || strcmp(argv[i], "-") == 0) /* "-": standard input */
            inputs[a.ninputs++] = argv[i];
        else if (strcmp(argv[i], "--binary-ok") == 0)
            a.binary_ok = true;
        else if (strcmp(argv[i], "--strict") == 0)
            a.strict = true;
        else if (i + 1 >= argc)
            rc = prep_error("%s needs a value%s", argv[i], "");
        else
            rc = parse_option(&a, &tok_path, argv[i], argv[i + 1]), i++;
    }
    a.inputs = inputs;
    if (a.train_on < 0) a.train_on = a.chat != CHAT_NONE ? TRAIN_ON_ASSISTANT : TRAIN_ON_COMPLETION;
    if (rc == 0 && (!a.out_dir || !a.ninputs))
        rc = prep_error("%s%s", !a.out_dir ? "missing --out DIR" : "no input files", "");
    tok_tokenizer *t = NULL;
    ust_err e;
    if (rc == 0 && tok_path && tok_load(&t, tok_path, &e)) {
        fprintf(stderr, "ustrain: error: %s\n", e.msg);
        rc = UST_EXIT_USAGE;
    }
    a.tok = t;
    a.tok_path = tok_path;
    prep_result r;
    if (rc == 0 && (rc = prep_run(&a, &r, &e))) fprintf(stderr, "ustrain: error: %s\n", e.msg);
    if (rc == 0) report(&a, &r, t);
    tok_free(t);
    free(inputs);
    return rc;
}
