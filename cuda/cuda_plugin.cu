/* cuda_plugin: the entry table of build/libustrain_cuda.so (see cuda_plugin.h). */
#ifndef UST_CUDA
#define UST_CUDA /* the real declarations of ops_cuda.h, not the stubs */
#endif
#include <cuda_runtime_api.h>

#include "cuda_internal.h" /* error.h and ops.h as C++ sees them */
#include "cuda_plugin.h"
#include "ops_cuda.h"

static void plugin_versions(int *driver, int *runtime) {
    if (cudaDriverGetVersion(driver) != cudaSuccess) *driver = 0;
    if (cudaRuntimeGetVersion(runtime) != cudaSuccess) *runtime = 0;
}

extern "C" __attribute__((visibility("default"))) const ust_cuda_plugin ust_cuda_plugin_v1 = {
    UST_CUDA_PLUGIN_ABI, sizeof(ust_ops), ops_cuda_create, ops_cuda_set_bf16, plugin_versions};
