/* prep: text -> tokens -> llm.c shards, the `ustrain data prep` pipeline.
 * Inputs are plain text (a file is one document) or JSON lines (a line is one document, its text
 * in a string field), each possibly gzip or zstd compressed, or "-" for standard input
 * (core/tools/prep_input.h: kinds are recognised by content, binary input refused). Each document
 * is followed by the end-of-text token. Threads tokenize a batch of documents (long ones cut where
 * tok_safe_cut allows) and the batch is written in input order, so the output is the same for any
 * thread count. The last val_fraction of the token stream goes to val shards (a whole shard when
 * there is enough data), the rest to train; tokens are uint16 when the vocabulary fits, else
 * uint32. Beside the shards, meta.json says how they were made (prep_write_meta), so that
 * training and export can name the tokenizer. */
#ifndef UST_PREP_H
#define UST_PREP_H

#include <stdbool.h>
#include <stdint.h>

#include "error.h"
#include "tokenizer.h"

enum { PREP_EOT_DEFAULT = -2, PREP_EOT_NONE = -1 };

typedef struct {
    const char **inputs;
    int ninputs;
    const char *out_dir;
    double val_fraction;      /* the last fraction of tokens for val shards; <= 0: none */
    int64_t shard_tokens;     /* tokens per shard, default 100M */
    const tok_tokenizer *tok; /* NULL: bytes */
    const char *tok_path;     /* the tokenizer.json tok was loaded from (for meta.json) */
    int eot;                  /* PREP_EOT_DEFAULT: the tokenizer's; PREP_EOT_NONE; or an id */
    const char *jsonl_field;  /* set: every input is JSON lines with this field; NULL: files
                                 ending in .jsonl or whose first line is a JSON object are,
                                 with field "text", the rest plain text */
    int threads;              /* <= 0: one per online CPU */
    int64_t chunk_bytes;      /* longer documents are cut for threading; default 1 MiB */
    bool progress;            /* progress bar on stderr */
    bool binary_ok;           /* tokenize input with NUL bytes too (else refused) */
    /* --chat / --train-on: JSON lines of conversations (core/tools/prep_chat.h) rendered by a
     * template (CHAT_NONE: "prompt" + "completion" as one text), shards with a target mask */
    int chat;     /* chat_kind; CHAT_AUTO resolved by prep_run */
    int train_on; /* chat_train_on */
    bool masked;  /* --chat or --train-on given */
    bool strict;  /* a malformed line stops prep (else it is counted, named and skipped) */
} prep_args;

typedef struct {
    int64_t ntrain, nval, ndocs, nbytes;
    int64_t skipped, targets; /* --chat/--train-on: lines skipped, target tokens written */
    int chat;                 /* the template used (chat_kind) */
    int ntrain_shards, nval_shards, vocab_size, width, eot, threads;
    double seconds;
} prep_result;

/* 0; UST_EXIT_USAGE when the input or the arguments are bad (or another process is writing
 * out_dir, which is locked while prep writes); UST_EXIT_RUNTIME when writing fails (a full disk).
 * The shards are written under temporary names and renamed once all are complete, so a failure
 * leaves out_dir's earlier shards as they were. */
int prep_run(const prep_args *a, prep_result *r, ust_err *e);

/* DIR/meta.json: {"tokenizer": the absolute path of tok_path, or "bytes" when tok_path is NULL
 * (ids 0..255 are the bytes), "tokenizer_sha256": its hex digest (absent for bytes), "eot_id": eot
 * (null when < 0), "vocab_size", "token_bytes": width, "format": "llmc", and with counts
 * "train_tokens", "val_tokens", "documents"}. Written under a temporary name and renamed, so a
 * reader sees the old file or the new one. */
int prep_write_meta(const char *dir, const char *tok_path, int eot, int vocab, int width,
                    const prep_result *counts, ust_err *e);

#endif
