/* nccl_api: the CUDA runtime and NCCL functions the NCCL backend (and bench comm, test_comm)
 * call, resolved with dlsym into one table by nccl_api_load when the first NCCL context is made
 * (core/base/dynlib.h: where the libraries are looked for), so no binary links libnccl or
 * libcudart. Including this header after (or instead of) cuda_runtime_api.h and nccl.h turns
 * each listed name into its table entry, so call sites read as the NCCL documentation's; calling
 * one before nccl_api_load succeeded is an assertion failure. The emulator build fills the
 * table with its own functions. */
#ifndef UST_NCCL_API_H
#define UST_NCCL_API_H

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "error.h"

/* clang-format off */
#define NCCL_API_CUDART(X)                                                                         \
    X(cudaGetDeviceCount) X(cudaSetDevice) X(cudaGetErrorString) X(cudaStreamCreateWithFlags)      \
    X(cudaStreamDestroy) X(cudaStreamWaitEvent) X(cudaStreamSynchronize)                           \
    X(cudaEventCreateWithFlags) X(cudaEventDestroy) X(cudaEventRecord) X(cudaEventQuery)           \
    X(cudaEventSynchronize) X(cudaMalloc) X(cudaFree) X(cudaMemset) X(cudaMemcpy)                  \
    X(cudaDeviceSynchronize)
#define NCCL_API_NCCL(X)                                                                           \
    X(ncclGetUniqueId) X(ncclCommInitRankConfig) X(ncclCommAbort) X(ncclCommGetAsyncError)         \
    X(ncclGetErrorString) X(ncclAllReduce) X(ncclAllGather) X(ncclReduceScatter) X(ncclBroadcast)  \
    X(ncclGroupStart) X(ncclGroupEnd) X(ncclSend) X(ncclRecv) X(ncclCommFinalize)                  \
    X(ncclCommDestroy)
/* clang-format on */

#define NCCL_API_FIELD(name) __typeof__(name) *name;
typedef struct {
    NCCL_API_CUDART(NCCL_API_FIELD)
    NCCL_API_NCCL(NCCL_API_FIELD)
} nccl_api_table;
#undef NCCL_API_FIELD

/* Opens libcudart and libnccl.so.2 and resolves every name, once per process (thread-safe);
 * -1 with a message naming the missing library or symbol and the search path. */
int nccl_api_load(ust_err *e);
/* The table; asserts nccl_api_load succeeded. */
const nccl_api_table *nccl_api(void);

#ifndef NCCL_API_IMPL
#undef cudaMemcpy
#undef cudaMemset
#undef cudaEventRecord
#undef cudaStreamWaitEvent
#undef cudaStreamSynchronize
#undef cudaEventQuery
#define cudaGetDeviceCount (nccl_api()->cudaGetDeviceCount)
#define cudaSetDevice (nccl_api()->cudaSetDevice)
#define cudaGetErrorString (nccl_api()->cudaGetErrorString)
#define cudaStreamCreateWithFlags (nccl_api()->cudaStreamCreateWithFlags)
#define cudaStreamDestroy (nccl_api()->cudaStreamDestroy)
#define cudaStreamWaitEvent (nccl_api()->cudaStreamWaitEvent)
#define cudaStreamSynchronize (nccl_api()->cudaStreamSynchronize)
#define cudaEventCreateWithFlags (nccl_api()->cudaEventCreateWithFlags)
#define cudaEventDestroy (nccl_api()->cudaEventDestroy)
#define cudaEventRecord (nccl_api()->cudaEventRecord)
#define cudaEventQuery (nccl_api()->cudaEventQuery)
#define cudaEventSynchronize (nccl_api()->cudaEventSynchronize)
#define cudaMalloc (nccl_api()->cudaMalloc)
#define cudaFree (nccl_api()->cudaFree)
#define cudaMemset (nccl_api()->cudaMemset)
#define cudaMemcpy (nccl_api()->cudaMemcpy)
#define cudaDeviceSynchronize (nccl_api()->cudaDeviceSynchronize)
#define ncclGetUniqueId (nccl_api()->ncclGetUniqueId)
#define ncclCommInitRankConfig (nccl_api()->ncclCommInitRankConfig)
#define ncclCommAbort (nccl_api()->ncclCommAbort)
#define ncclCommGetAsyncError (nccl_api()->ncclCommGetAsyncError)
#define ncclGetErrorString (nccl_api()->ncclGetErrorString)
#define ncclAllReduce (nccl_api()->ncclAllReduce)
#define ncclAllGather (nccl_api()->ncclAllGather)
#define ncclReduceScatter (nccl_api()->ncclReduceScatter)
#define ncclBroadcast (nccl_api()->ncclBroadcast)
#define ncclGroupStart (nccl_api()->ncclGroupStart)
#define ncclGroupEnd (nccl_api()->ncclGroupEnd)
#define ncclSend (nccl_api()->ncclSend)
#define ncclRecv (nccl_api()->ncclRecv)
#define ncclCommFinalize (nccl_api()->ncclCommFinalize)
#define ncclCommDestroy (nccl_api()->ncclCommDestroy)
#endif

#endif
