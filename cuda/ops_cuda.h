/* ops_cuda: the CUDA backend of ops.h (kernels in cuda/, GEMMs through cuBLAS/cuBLASLt).
 * Contract: ops_cuda_create binds one GPU, makes one compute stream and enqueues every op on
 * it; to_host, sum, sumsq(_many) and sync wait for it. Parameters, gradients and statistics
 * are fp32; activations are fp32, or bf16 with bf16 on (ops_cuda_set_bf16), when every GEMM
 * takes bf16 inputs and accumulates in fp32 (cuBLASLt, CUBLAS_COMPUTE_32F) and every other op
 * computes in fp32 and rounds only what it stores. The compute stream and the device memory
 * report are the ops.h members stream and memory. Above cuda/, only ops_create (core/base/ops.c)
 * and the tests call this. Nothing here touches CUDA until ops_cuda_create is called (which
 * dlopens the libraries and the backend plugin: cuda/ops_cuda_load.c), so a CUDA build runs CPU
 * configs on a machine without a GPU, driver or CUDA libraries; without CUDA: stubs (below). */
#ifndef UST_OPS_CUDA_H
#define UST_OPS_CUDA_H

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef UST_CUDA

/* The backend on GPU `device` % (visible devices) (pass the local rank: the NCCL backend picks
 * its GPU the same way), fp32 matmuls. NULL with a message in e when no device or driver is
 * available. Attention runs as cuBLAS GEMMs over chunks of materialized scores (default), or
 * with UST_CUDA_ATTENTION=flash as tiled flash-style kernels that keep nothing of size T x T;
 * UST_CUDA_ATTENTION_CHUNK=N fixes the queries per chunk of the GEMM path (both read here). */
ust_ops *ops_cuda_create(int device, ust_err *e);
/* bf16 when on != 0: act_size becomes 2 and every activation (ops.h's act) is stored as bf16
 * (fp32 math inside the ops, rounded when stored), GEMMs take bf16 inputs with fp32
 * accumulation (fp32 parameters rounded into scratch; matmul/matmul_batched keep fp32 C). Off:
 * act_size 4 and fp32 throughout. */
void ops_cuda_set_bf16(ust_ops *o, int on);
/* The CUDA driver's and runtime's versions (major*1000 + minor*10), 0 when unknown: no driver,
 * the libraries could not be loaded (cuda/ops_cuda_load.c), or the emulator. */
void ops_cuda_versions(int *driver, int *runtime);

#else

/* A build without CUDA (make CUDA=0, or no nvcc) gets inline stubs: create fails with a message,
 * so callers need no #ifdef. */
static inline ust_ops *ops_cuda_create(int device, ust_err *e) {
    (void)device;
    ust_errf(e, "run.device = cuda: this build has no CUDA backend (built with CUDA=0 or "
                "without nvcc); rebuild with nvcc available, or use run.device: cpu");
    return (ust_ops *)0;
}
static inline void ops_cuda_set_bf16(ust_ops *o, int on) {
    (void)o;
    (void)on;
}
static inline void ops_cuda_versions(int *driver, int *runtime) { *driver = *runtime = 0; }
#endif

/* UST_REQUIRE_GPU set (and not "0"): a GPU that CUDA cannot open (no device, a driver older than
 * the runtime, missing libraries) is a failure of the GPU tests and bench_gpu, not a SKIP
 * (scripts/gpu-check.sh sets it). */
static inline int ops_cuda_gpu_required(void) {
    const char *v = getenv("UST_REQUIRE_GPU");
    return v && v[0] && strcmp(v, "0") != 0;
}

#ifdef __cplusplus
}
#endif

#endif
