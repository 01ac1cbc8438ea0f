/* ops_cuda_act: elementwise ops on activations added after ops_cuda.cu, kept apart so that file
 * stays the backend's core: scale_act (model.embed_scale, Gemma's embeddings times sqrt(d_model),
 * forward and backward), in fp32 and stored in the activations' type, as the CPU's fp32 loop. */
#include "cuda_internal.h"

template <typename T> __global__ void k_scale_act(act *x_, float s, int64_t n) {
    T *x = (T *)x_;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        st_act(x, i, ld_act(x, i) * s);
}

void cuda_scale_act(const ust_ops *o, act *x, float s, int64_t n) {
    if (n > 0) ACT_LAUNCH(o, k_scale_act, grid_for(n, 256), 256, 0, x, s, n);
}
