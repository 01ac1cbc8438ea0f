/* export: a ustrain checkpoint -> the Hugging Face transformers layout.
 * export_hf reads a finished checkpoint step (its state.json holds the effective config, its
 * model.safetensors the whole fp32 tensors) and writes OUT/model.safetensors + OUT/config.json as
 * LlamaForCausalLM (llama) or GPT2LMHeadModel (gpt2) expect them, fp32, with the padded vocabulary
 * cut back to model.vocab_size rows. Everything is checked before OUT is touched, and the files
 * are written under temporary names and renamed, so a failure never leaves a partial file. */
#ifndef UST_EXPORT_H
#define UST_EXPORT_H

#include "error.h"

/* Returns 0; UST_EXIT_USAGE when the input is not an exportable checkpoint (not a checkpoint,
 * an unsupported model, a tensor missing or of the wrong shape); UST_EXIT_RUNTIME when writing
 * OUT fails. e gets the message. `ckpt` is a step directory or a checkpoint directory (its newest
 * finished step is taken). */
int export_hf(const char *ckpt, const char *out_dir, ust_err *e);

#endif
