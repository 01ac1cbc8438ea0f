/* params: the model's parameter table (core/params.c), the part of model.h that names, shapes,
 * places and fills the tensors: every tensor under its canonical name with its tensor-parallel
 * split, the units a sharding layer gathers and reduces, the flat buffers' layout, the
 * counter-based initialization and the llm.c importer. The model's blocks (core/model.c) only
 * read the pointers it resolves. */
#ifndef UST_PARAMS_H
#define UST_PARAMS_H

#include "model.h"

/* Lists this rank's parameters in table order (units, offsets, tensor-parallel slices) and
 * every tensor of the whole model in checkpoint order. */
void params_build(model *m);

#endif
