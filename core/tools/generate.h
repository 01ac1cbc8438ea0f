/* generate: text generation from a trained model (ustrain generate). Loads a checkpoint step's
 * effective config and weights (core/model/infer: a weight source per format), picks the tokenizer
 * (--tokenizer, else the checkpoint's state.json "tokenizer" record), encodes the prompt, prefills
 * the KV cache, then decodes one token at a time, streaming the text as it comes (bytes of a
 * UTF-8 character split over tokens are held until it is complete) and, on stderr, the prompt and
 * new token counts, prefill time and decode tokens/s. Stops at the end-of-text id, after
 * max_new tokens, or when the cache holds max_seq_len positions (a note on stderr says so).
 * Sampling is HF transformers' order (gen_sample). Bad input (no checkpoint, no tokenizer, an
 * empty or too long prompt, prompt ids outside the model's vocabulary) is refused with exit 2
 * before the weights are read. */
#ifndef UST_GENERATE_H
#define UST_GENERATE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "error.h"

typedef struct {
    double temperature; /* 0: greedy (argmax, ties to the lower id) */
    int top_k;          /* 0: no limit */
    double top_p;       /* 1: no limit */
    uint64_t seed;
} gen_sampling;

typedef struct {
    const char *prompt; /* bytes (not necessarily NUL-terminated) */
    size_t prompt_len;
    int max_new;
    gen_sampling sampling;
    ust_device device;
    const char *tokenizer;   /* tokenizer.json path, "bytes", or NULL (the checkpoint's record) */
    const char *dump_logits; /* NULL, or a file for each new token's logits (V floats, fp32) */
    FILE *out;               /* the generated text (stdout) */
    int allow_nonfinite;     /* an HF model's NaN/Inf weights are loaded, not refused */
} gen_options;

/* Runs ustrain generate on ckpt (a step directory or a checkpoint directory). Returns 0, or
 * UST_EXIT_USAGE / UST_EXIT_RUNTIME with the message in e. */
int gen_run(const char *ckpt, const gen_options *opt, ust_err *e);

/* One candidate of the sampler: a token and its (scaled) logit. */
typedef struct {
    float logit;
    int32_t id;
} gen_cand;

/* The token drawn from logits (V floats) at generation step `step` (scratch: V candidates).
 * HF transformers' order: temperature, top-k, top-p, then a draw that is a pure function of
 * (seed, step), so a seed always gives the same text. */
int32_t gen_sample(const gen_sampling *s, const float *logits, int V, int64_t step,
                   gen_cand *scratch);

/* Of n pending output bytes, how many end on a whole UTF-8 character: all of them unless they end
 * inside a valid multi-byte sequence that more bytes may complete. */
size_t gen_utf8_ready(const unsigned char *s, size_t n);

/* ustrain bench generate: decode tokens/s of cfg's model with random weights (CPU or cuda per
 * cfg->run.device), prefill of prompt_tokens then new_tokens greedy steps, against the memory
 * bandwidth bound (weight bytes per token / memcpy bandwidth measured in the same run). */
int gen_bench(ust_config *cfg, int prompt_tokens, int new_tokens, ust_err *e);

#endif
