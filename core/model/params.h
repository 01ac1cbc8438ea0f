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

/* The memory plan's model: model_create_with's steps for rank 0 of every group, on the
 * shape-only contexts st gives (tp_shape, cp_shape), against a counting arena: the chunks,
 * the parameter table (whole: model_all_tensors' list too), the MoE context (moe_ctx_bytes,
 * which counts ep_init's buffers as well), the buffers st asks for and the activation sets.
 * No backend: sizes gives act_size. params_shape_free releases it. */
model *params_shape(const ust_config *cfg, const ust_ops *sizes, const model_storage *st, int whole,
                    ust_arena *count);
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

#endif
