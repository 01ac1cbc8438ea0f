/* export: a ustrain checkpoint -> the Hugging Face transformers layout.
 * export_hf reads a finished checkpoint step (its state.json holds the effective config and the
 * training data's tokenizer, its model.safetensors the whole fp32 tensors) and writes into OUT
 * what LlamaForCausalLM, MixtralForCausalLM or GPT2LMHeadModel load: model.safetensors (or
 * model-0000K-of-0000N.safetensors + model.safetensors.index.json above max_shard_bytes) in
 * fp32, bf16 or fp16, with the padded vocabulary cut back to model.vocab_size rows; config.json;
 * and, when state.json names a tokenizer, tokenizer.json (copied after checking its SHA-256, or
 * synthesized for byte tokens), tokenizer_config.json and generation_config.json. Everything is
 * checked before OUT is touched, and every file is written under a temporary name and renamed
 * once all are complete, so a failure leaves OUT as it was. */
#ifndef UST_EXPORT_H
#define UST_EXPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "error.h"

typedef enum { EXPORT_F32, EXPORT_BF16, EXPORT_F16 } export_dtype;

typedef struct {
    export_dtype dtype;      /* bf16: round to nearest even; fp16: values beyond +-65504 refused */
    int64_t max_shard_bytes; /* 0: 5 GB (5e9), transformers' default; a larger tensor is alone */
    bool no_tokenizer;       /* leave the tokenizer files out (ids still go into config.json) */
} export_opts;

typedef struct {
    int nshards;         /* 1: model.safetensors */
    int64_t total_bytes; /* of the tensors' data (the index's metadata.total_size) */
    bool tokenizer;      /* tokenizer.json and tokenizer_config.json were written */
    bool generation;     /* generation_config.json was written */
    char step[4096];     /* the step directory exported (CKPT, or its newest that verifies) */
} export_result;

/* Returns 0; UST_EXIT_USAGE when the input is not an exportable checkpoint (not a checkpoint,
 * an unsupported model, a tensor missing or of the wrong shape, a value fp16 cannot hold, a
 * recorded tokenizer missing or changed); UST_EXIT_RUNTIME when writing OUT fails. e gets the
 * message. `ckpt` is a step directory or a checkpoint directory (its newest finished step);
 * either is verified against its manifest first (ckpt_resolve_step). OUT must not be or lie in
 * a checkpoint; it is locked while it is written, so a second export into it is refused. */
int export_hf(const char *ckpt, const char *out_dir, const export_opts *o, export_result *r,
              ust_err *e);

/* fp32 -> bf16 / fp16 bits, rounding to nearest even (fp16: beyond its range -> infinity). */
uint16_t export_bf16(float x);
uint16_t export_f16(float x);

#endif
