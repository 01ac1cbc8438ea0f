/* hf_map: ustrain's tensors <-> the Hugging Face transformers layout, in one table.
 * hf_table_build lists, for a model config, every tensor of the transformers checkpoint
 * (LlamaForCausalLM, Qwen2ForCausalLM (llama + q/k/v biases), MixtralForCausalLM,
 * GPT2LMHeadModel, DeepseekV3ForCausalLM and the others hf_map.c lists) with the ustrain
 * tensors it is made of and how (copy, cut the padded vocabulary, transpose, fuse q/k/v);
 * export reads the table one way (hf_make), import the other. hf_config_json writes the
 * matching config.json. */
#ifndef UST_HF_MAP_H
#define UST_HF_MAP_H

#include "ckpt.h"
#include "config.h"
#include "error.h"

#include <cjson/cJSON.h>
#include <stdint.h>

typedef enum {
    HF_COPY,    /* the same values */
    HF_ROWS,    /* the first shape[0] rows: the vocabulary without ustrain's padding rows */
    HF_T,       /* transposed: [out, in] -> Conv1D's [in, out] */
    HF_QKV,     /* q | k | v stacked along the output features, k and v repeated up to n_head heads;
                  transposed when 2-D (c_attn.weight), concatenated when 1-D (c_attn.bias) */
    HF_ROPE_Q,  /* model.mla with rope_interleave: rows permuted, each head's last R rows in */
    HF_ROPE_KV, /* DeepSeek's interleaved pair order (q_b_proj / q_proj; kv_a_proj_with_mqa) */
} hf_xform;

typedef struct {
    char name[CKPT_NAME_MAX]; /* the exported name */
    int ndim;
    int64_t shape[2];
    hf_xform op;
    int nsrc;
    ckpt_tensor src[3]; /* checkpoint names and the shapes the config implies */
    int dup; /* a copy of src[0] that another row also writes (DeepSeek's MTP layers' embed_tokens
                and shared_head.head): the import reads the other and checks this one equals it */
} hf_tensor;

typedef struct {
    const ust_config *c;
    hf_tensor *t;
    int n;
} hf_table;
/* HF_ROPE_*: the file's row of ustrain's row r (hf_map.c). */
int64_t hf_rope_row(const ust_config *c, hf_xform op, int64_t r);

/* The table of config c (l->t allocated; hf_table_free releases it). -1 with a message when the
 * model has no transformers counterpart. */
int hf_table_build(hf_table *l, const ust_config *c, ust_err *e);
void hf_table_free(hf_table *l);
/* How many tensors the table of c has (what a reader may check its files against first). */
int64_t hf_table_count(const ust_config *c);
/* Exported tensor x from its sources' whole fp32 data (src[j] for x->src[j]) into out. */
void hf_make(const ust_config *c, const hf_tensor *x, const float *src[3], float *out);
/* Row r of GPT-2's fused q | k | v as (which source, row in it). */
void hf_qkv_row(const ust_config *c, int64_t r, int *which, int64_t *row);
/* config.json for c; bos / eos < 0 write null. */
cJSON *hf_config_json(const ust_config *c, int bos, int eos);

#endif
