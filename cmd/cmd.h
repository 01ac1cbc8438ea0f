/* cmd: sub-commands implemented outside cmd/ustrain.c, each taking the arguments after its name
 * and returning the process exit code (0 ok, 1 runtime failure, 2 bad usage). */
#ifndef UST_CMD_H
#define UST_CMD_H

#include <stdbool.h>

/* Bad usage: "<who>: error: <message>", then hint (the usage text, or where to find it), on
 * stderr; returns exit code 2. */
int cmd_usage_error(const char *who, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* --help or -h anywhere among a sub-command's arguments: it prints its usage (cmd_print_usage,
 * on stdout) and exits 0, whatever else is there. */
bool cmd_wants_help(int argc, char **argv);
int cmd_print_usage(const char *usage);

/* Who reports a bad option value, and the hint printed after it (as cmd_usage_error). */
typedef struct {
    const char *who, *hint;
} cmd_who;

enum { CMD_LO_OPEN = 1, CMD_HI_OPEN = 2 };

/* Strict option values: all of s, within the range, or a usage error "OPT S: expected ..."
 * naming the range (returns 2; 0 on success). Integers: decimal digits with an optional sign,
 * in [lo, hi]. Numbers: decimal (no hex, nan, inf), between lo and hi, each end closed unless
 * `open` says CMD_LO_OPEN / CMD_HI_OPEN (+-INFINITY: no bound). Sizes: a number with an
 * optional B, K/M/G/T or KiB..TiB (powers of 1024) or KB..TB (powers of 1000) suffix, whose
 * bytes lie in [lo, hi]. */
int cmd_int_opt(const cmd_who *w, const char *opt, const char *s, long long lo, long long hi,
                long long *out);
int cmd_num_opt(const cmd_who *w, const char *opt, const char *s, double lo, double hi, int open,
                double *out);
int cmd_size_opt(const cmd_who *w, const char *opt, const char *s, double lo, double hi,
                 double *out);

/* --set's value argv[i] must be one key.path=value word: "--set train.steps 5" is a usage error
 * suggesting "--set train.steps=5" (the next word joined on). 0 when argv[i] has an '='. */
int cmd_set_arg(const cmd_who *w, int argc, char **argv, int i);

/* ustrain bench comm [--min-bytes B] [--max-bytes B]: verify and time every collective. */
int cmd_bench_comm(int argc, char **argv);

/* ustrain bench attention: attention with and without document masking on a long sequence. */
int cmd_bench_attention(int argc, char **argv);

/* ustrain export CKPT --to hf OUT: a checkpoint in the Hugging Face transformers layout. */
int cmd_export(int argc, char **argv);

/* ustrain generate CKPT (--prompt TEXT | --prompt-file F) ...: text from a trained checkpoint;
 * ustrain bench generate CONFIG: decode tokens/s against the memory-bandwidth bound. */
int cmd_generate(int argc, char **argv);
int cmd_bench_generate(int argc, char **argv);
/* ustrain eval CKPT_OR_HF_DIR --data GLOB ...: mean loss and perplexity (core/train's validation).
 */
int cmd_eval(int argc, char **argv);

/* ustrain flight DIR: the flight recorder's diagnosis from the files of a run. */
int cmd_flight(int argc, char **argv);

/* ustrain data prep --out DIR [--tokenizer tokenizer.json] ... FILE...: text -> llm.c shards. */
int cmd_data_prep(int argc, char **argv);

/* ustrain plan CONFIG --world N ...: layouts ranked by estimated step time (core/planner). */
int cmd_plan(int argc, char **argv);

#endif
