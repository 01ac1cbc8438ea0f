/* params: the model's parameter table (core/model/params.c), the part of model.h that names,
 * shapes, places and fills the tensors: every tensor under its canonical name with its
 * tensor-parallel split, the units a sharding layer gathers and reduces, the flat buffers' layout,
 * the counter-based initialization and the llm.c importer. The model's blocks
 * (core/model/model_block.c) only read the pointers it resolves. */
#ifndef UST_PARAMS_H
#define UST_PARAMS_H

#include "model.h"

/* Lists this rank's parameters in table order (units, offsets, tensor-parallel slices) and
 * every tensor of the whole model in checkpoint order. */
void params_build(model *m);

/* The rank the memory plan asks about: tensor-parallel rank 0 of a group of tp (sp: sequence
 * parallelism), context-parallel group cp, expert group ep, holding the pipeline's chunks
 * (pp_stages'; zb: zero-bubble's saved gradients too), units padded to unit_pad floats
 * (dp_model_storage's). */
typedef struct {
    int tp, sp, cp, ep, zb;
    const model_stage *chunks;
    int nchunks;
    int64_t unit_pad;
    int vocab_chunk_rows; /* model_storage's */
    int whole;            /* list the whole model's tensors too (model_all_tensors) */
} params_layout;
/* That rank's model as model_create_with shapes it (chunks and parameter table), without a
 * backend or a single buffer: sizes only gives act_size. The plan reads its units
 * (model_unit_range, model_unit_is_expert), model_all_tensors, and runs acts_alloc on it
 * against a counting arena. params_shape_free releases it (and acts_alloc's host arrays). */
model *params_shape(const ust_config *cfg, const ust_ops *sizes, const params_layout *ly);
/* The steps model_create_with and params_shape share: the dimensions from the config and this
 * rank's shares of them under tensor parallelism (m->tp set), the local token rows (m->cp
 * set), and this rank's chunks as the pipeline gave them (n = 0: the whole model). */
void params_dims(model *m, const ust_config *cfg);
void params_local_rows(model *m);
/* model_storage.vocab_chunk_rows (after params_chunks: the chunks decide tied_local): the
 * chunk count and the per-chunk pointer arrays (tied here: the head's are the table's). */
void params_vocab_chunks(model *m, int rows);
void params_vocab_chunks_free(model *m);
void params_chunks(model *m, const model_stage *stages, int n);
void params_shape_free(model *m);
/* What else that rank's construction carves beside the activation sets, into a counting
 * arena: the whole parameter and gradient buffers st asks for (model_create_with), cp_init's
 * buffers, moe_init's context (moe_ctx_bytes) and the tensor-parallel scratch tp_init carves
 * for the model's group. */
void params_count_buffers(model *m, const model_storage *st, ust_arena *count);

#endif
