/* emu_rt: the CUDA runtime and NCCL subset the code uses, emulated on the CPU for the emulator
 * build (make emu; see emu_cuda.h for the kernel side). C and C++ see the same declarations, so
 * the C code (comm_nccl.c, the tests) links against the emulator like against libcudart/libnccl.
 * What it checks beyond the kernels' logic:
 *   - device memory is a heap that host code cannot touch: it is mapped PROT_NONE except while
 *     an emulated kernel or cuBLAS call runs, so a host dereference of a device pointer faults
 *     with a message naming the address (EMU_GUARD=0 turns this off);
 *   - copies check their direction against where the pointers live, and NCCL calls check that
 *     their buffers are device memory;
 *   - streams are FIFOs: kernels, copies and GEMMs run on the calling thread once everything
 *     queued on their stream before them is done; NCCL operations, event records and waits are
 *     queued and run by the stream's own thread, so communication really overlaps with the
 *     caller and only the events order them. EMU_ASYNC=1 queues kernels, GEMMs and copies too,
 *     held until a sync, event or NCCL operation needs them (a late host read sees poison);
 *   - ordering by vector clocks: memory an NCCL operation reads or writes may be touched by
 *     work on another stream only after a cudaStreamWaitEvent on its event or a host sync;
 *   - NCCL communicators of different processes meet in shared memory (collectives summed in
 *     rank order, point-to-point through per-pair rings); a dead peer or ncclCommAbort ends a
 *     waiting operation with an error instead of a hang.
 * EMU_GPUS sets the device count (default 1; 0 emulates a machine without a GPU).
 * EMU_STATS=1 prints at exit, per NCCL operation kind, how many completions the host waited on
 * and how many of those had kernels or GEMMs issued between the operation and the wait: the
 * communication the code overlaps with computation (on a GPU it runs concurrently with them);
 * and how often the host waited for a stream (cudaStreamSynchronize, or an NCCL completion the
 * host polled or synced before any stream waited on it: each one idles the GPU). */
#ifndef UST_EMU_RT_H
#define UST_EMU_RT_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorInvalidValue = 1,
       cudaErrorNoDevice = 100, cudaErrorNotReady = 600 };
typedef struct EmuStream *cudaStream_t;
typedef struct EmuEvent *cudaEvent_t;
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
                      cudaMemcpyDeviceToDevice = 3 };
enum { cudaStreamNonBlocking = 1, cudaEventDisableTiming = 2 };
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin, cudaDevAttrMultiProcessorCount };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };

cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t s);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t ev);
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t ev);
cudaError_t cudaEventSynchronize(cudaEvent_t ev);

/* For the kernel side (emu_cuda.h): device memory opens to the calling thread for a kernel or
 * GEMM (nested calls count), and a stream's queued work is waited for before one runs. */
void emu_dev_open(void);
void emu_dev_close(void);
void emu_stream_drain(cudaStream_t s);
int emu_async_enabled(void); /* EMU_ASYNC=1: kernels, GEMMs and copies are queued, run late */
void emu_note_launch(void); /* a kernel or GEMM was issued (for EMU_STATS) */
/* Dies naming the kernel and argument when p is neither null nor device memory. */
void emu_check_kernel_pointer(const char *kernel, const char *host_fn, int arg, const void *p);
/* Dies when p is memory an NCCL operation on another stream writes, or (writable) reads, that
 * nothing orders before the next item of stream s: it needs a cudaStreamWaitEvent on the
 * operation's event or a host sync after it. */
void emu_check_in_flight(cudaStream_t s, const char *kernel, const char *host_fn, int arg,
                         const void *p, int writable);

/* ---- strict mode (EMU_STRICT=1; emu_strict.cpp): shared- and global-memory race detection
 * through the -fsanitize=thread calls the kernels are compiled with. emu_cuda.h reports the
 * launch, each block, barrier and warp release, and sets emu_strict_tid to the thread it runs
 * (-1 between threads and outside kernels: the checks are off). */
#ifdef __cplusplus
extern thread_local int emu_strict_tid; /* per thread: EMU_ASYNC runs kernels on stream threads */
#else
extern _Thread_local int emu_strict_tid;
#endif
int emu_strict_enabled(void);
void emu_strict_launch(const char *kernel, unsigned nblocks, char *dyn, size_t dyn_n,
                       size_t smem_limit); /* smem_limit: static + dynamic shared memory per block */
void emu_strict_block(unsigned linear, unsigned bx, unsigned by, unsigned bz);
void emu_strict_barrier(void);
void emu_strict_warp(int warp);
void emu_shared_reg(void *p, size_t n); /* a static __shared__ array, as a thread meets it */
/* a cp.async of n bytes to shared memory at p: issued (pending, checked as a write now; pc where)
 * or landed at its wait_group (not pending); any other access to pending bytes is reported */
void emu_strict_async(void *p, size_t n, int pending, const void *pc);
void emu_heap_bounds(char **base, size_t *cap); /* the device heap's address range */
/* the live bytes of the heap (strict mode's fence): [off, off + n) allocated (live) or freed */
void emu_strict_alloc(size_t cap, size_t off, size_t n, int live);
/* An atomic read-modify-write of n bytes at p (atomicAdd): blocks' atomics on one word do not
 * conflict with each other, a plain read or write of it by another block in the launch does. */
void emu_strict_atomic(void *p, size_t n, const void *pc);
void emu_heap_describe(size_t off, char *buf, size_t n); /* where a heap offset lies */

/* ---- NCCL */
typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2,
               ncclInternalError = 3, ncclInvalidArgument = 4, ncclInvalidUsage = 5,
               ncclRemoteError = 6, ncclInProgress = 7 } ncclResult_t;
typedef enum { ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4,
               ncclUint64 = 5, ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8,
               ncclBfloat16 = 9 } ncclDataType_t;
#define ncclFloat ncclFloat32
#define ncclDouble ncclFloat64
#define ncclInt ncclInt32
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct EmuNccl *ncclComm_t;
typedef struct { int blocking; } ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER {1}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *cfg);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err);
const char *ncclGetErrorString(ncclResult_t r);
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t s);
ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t s);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#ifdef __cplusplus
}
#include <functional>
/* Queues f on stream s (EMU_ASYNC: a kernel or GEMM, run by the stream's thread when needed). */
void emu_enqueue(cudaStream_t s, std::function<void()> f);
#endif
#endif
