/* cuda_plugin: the one symbol of build/libustrain_cuda.so (the cuda/ kernels with cudart, cuBLAS
 * and cuBLASLt linked dynamically), which cuda/ops_cuda_load.c dlopens when a CUDA backend is made.
 * The binaries themselves link no CUDA library: the kernels' fatbins register when the plugin
 * loads, and the table below is all the CPU side calls. abi and ops_size must equal the
 * loader's (both built by the same make), else the plugin is refused. */
#ifndef UST_CUDA_PLUGIN_H
#define UST_CUDA_PLUGIN_H

#include <stddef.h>

#include "error.h"
#include "ops.h"

#define UST_CUDA_PLUGIN_ABI 1
#define UST_CUDA_PLUGIN_SYMBOL "ust_cuda_plugin_v1"

typedef struct {
    int abi;         /* UST_CUDA_PLUGIN_ABI */
    size_t ops_size; /* sizeof(ust_ops) the plugin was compiled with */
    ust_ops *(*create)(int device, ust_err *e);
    void (*set_bf16)(ust_ops *o, int on);
    /* cudaDriverGetVersion / cudaRuntimeGetVersion (major*1000 + minor*10; 0 when unknown) */
    void (*versions)(int *driver, int *runtime);
} ust_cuda_plugin;

#endif
