/* cmd: sub-commands implemented outside cmd/ustrain.c, each taking the arguments after its name
 * and returning the process exit code (0 ok, 1 runtime failure, 2 bad usage). */
#ifndef UST_CMD_H
#define UST_CMD_H

/* Bad usage: "<who>: error: <message>", then hint (the usage text, or where to find it), on
 * stderr; returns exit code 2. */
int cmd_usage_error(const char *who, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ustrain bench comm [--min-bytes B] [--max-bytes B]: verify and time every collective. */
int cmd_bench_comm(int argc, char **argv);

/* ustrain export CKPT --to hf OUT: a checkpoint in the Hugging Face transformers layout. */
int cmd_export(int argc, char **argv);

/* ustrain data prep --out DIR [--tokenizer tokenizer.json] ... FILE...: text -> llm.c shards. */
int cmd_data_prep(int argc, char **argv);

/* ustrain plan CONFIG --world N ...: layouts ranked by estimated step time (core/planner). */
int cmd_plan(int argc, char **argv);

#endif
