/* proj_norm: model.qk_norm_whole (OLMo 2), RMSNorm over a token's whole q or k projection (all
 * heads' H*D features, one weight of H*D) instead of each head's D (core/model/proj_norm.c).
 * Under tensor parallelism each rank norms its heads' columns by the rows' sums of squares
 * summed over the tp group (CPU; CUDA gathers whole rows); the weight and its gradient are whole
 * and the same on every rank. heads: this rank's. */
#ifndef UST_PROJ_NORM_H
#define UST_PROJ_NORM_H

#include "model_block.h"

/* out, inp: (B*T, heads*D) this rank's columns; rstd: (B*T). */
void proj_norm_forward(model *m, act *out, float *rstd, const act *inp, const float *w, int heads);
/* d (B*T, heads*D): d out -> d inp in place; *gw += the weight gradient now, or under B a
 * WG_PROJNORM job reading d out saved in keep. */
void proj_norm_backward(model *m, const deferral *df, act *d, const act *inp, float *const *w,
                        float **gw, const float *rstd, int heads, act *keep);
/* The WG_PROJNORM job: dw += the weight gradient from the saved d out. */
void proj_norm_wgrad(model *m, float *dw, const act *dout, const act *inp, const float *w,
                     const float *rstd, int heads);

#endif
