/* model: the decoder-only transformer (gpt2 | llama) as a parameter table plus explicit
 * per-layer forward/backward on the ops.h interface, llm.c style.
 * Contract: model_create carves parameters, gradients and activations for one micro-batch
 * (B = train.micro_batch_size, T = train.seq_len) out of the arena; model_forward runs the whole
 * stack and, when dscale > 0, also leaves d(loss)/d(logits) * dscale ready for model_backward,
 * which ACCUMULATES parameter gradients (so gradient accumulation is just calling it again).
 * Parameters are stored unfused under canonical Hugging Face-style names (DESIGN.md section 7),
 * each tensor [out_features, in_features] row-major, in one flat buffer in table order. */
#ifndef UST_MODEL_H
#define UST_MODEL_H

#include <stdint.h>

#include "ckpt.h"
#include "config.h"
#include "mem.h"
#include "ops.h"

typedef struct {
    char name[CKPT_NAME_MAX];
    ckpt_tensor whole;  /* global name and shape */
    ckpt_slice slice;   /* what this rank holds (the whole tensor on one rank) */
    int64_t numel;      /* elements held here */
    int64_t offset;     /* element offset into the flat parameter / gradient buffers */
    int decay;          /* weight decay applies (matrices) */
    float init_std;     /* N(0, init_std); 0 means the constant init_value */
    float init_value;
} model_param;

typedef struct model model;

int model_create(model **out, const ust_config *cfg, const ust_ops *ops, ust_arena *arena,
                 ust_err *e);
void model_destroy(model *m);

int model_num_params(const model *m);
model_param *model_param_at(model *m, int i);
int model_find_param(const model *m, const char *name); /* index or -1 */
float *model_params(model *m); /* flat device buffer */
float *model_grads(model *m);
int64_t model_numel(const model *m);
/* Parameter count and training FLOPs per token (6 N_matmul + 12 L d T, PaLM's convention). */
double model_flops_per_token(const model *m);

/* Draws every parameter from the counter-based RNG keyed by (seed, name, element index). */
void model_init_params(model *m, uint64_t seed);
/* Loads an llm.c GPT-2 checkpoint (gpt2_124M.bin layout) into a gpt2 model of matching shape. */
int model_load_llmc(model *m, const char *path, ust_err *e);

void model_zero_grads(model *m);
/* inputs, targets: host arrays of B*T tokens (targets < 0 are ignored). Returns the sum of the
 * per-token losses; *ntok gets the number of counted targets. dscale > 0 prepares backward with
 * d(loss_sum)/d(logits) scaled by dscale (e.g. 1 / tokens in the global batch). */
double model_forward(model *m, const int32_t *inputs, const int32_t *targets, float dscale,
                     int64_t *ntok);
void model_backward(model *m);

#endif
