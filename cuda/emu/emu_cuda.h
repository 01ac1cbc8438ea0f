/* emu_cuda: a CPU emulator of the CUDA subset the backend uses, for checking the kernels' logic on
 * machines without a GPU (make emu, test/sh/gpu_emulated.sh, scripts/gpu-check.sh --emulate).
 * Never part of the normal build. The runtime, streams, device memory and NCCL are in emu_rt.
 * Every GPU thread of a block is a coroutine on one OS thread (a register-only stack switch on
 * x86-64, ucontext elsewhere); __syncthreads, __syncwarp
 * and the shuffles are cooperative barriers, and EMU_ORDER=reverse|random changes the order in
 * which threads run between barriers, so results that depend on a missing barrier change.
 * __shared__ becomes static (blocks run one after another); device memory (emu_rt) starts filled
 * with garbage; cuBLAS and cuBLASLt are naive column-major reference GEMMs that check their
 * leading dimensions and layouts (EMU_LT_FAIL=1 makes cuBLASLt find no algorithm, exercising
 * the fallback). It checks indexing, masking, reductions and barrier placement; it cannot show
 * timing, occupancy, memory-model or hardware-specific behaviour. */
#ifndef UST_EMU_CUDA_H
#define UST_EMU_CUDA_H
#include <ucontext.h>
#include <functional>
#include <mutex>
#include <vector>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <cstdio>
#include <cstdint>
#include <climits>
#include <type_traits>
#include "emu_rt.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static /* cu2cpp.py registers each array with emu_shared_reg (strict mode) */
/* the emulator's own code skips strict mode's per-access calls (-fsanitize=thread, emu_strict) */
#define EMU_NOTSAN __attribute__((no_sanitize_thread))

struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

struct EmuThread {
    void *sp;       /* saved stack pointer (x86-64 switch) */
    ucontext_t ctx; /* elsewhere */
    int state; /* 0 run, 1 wait block, 2 wait warp, 3 done */
    int sync;      /* at a warp wait: 1 __syncwarp, 2 a shuffle, 3 ldmatrix (strict mode checks the lanes agree) */
    unsigned mask; /* and the lanes its mask names */
    dim3 tid;
    int lane, warp;
    char *stack;
};
enum { EMU_STACK = 256 * 1024 };
inline EmuThread *emu_cur;
inline dim3 emu_blockIdx, emu_blockDim, emu_gridDim;
inline ucontext_t emu_sched;
inline void *emu_sched_sp;
EMU_NOTSAN inline void emu_entry();
#if defined(__x86_64__)
/* emu_rt.cpp: saves the callee-saved registers on the current stack, stores the stack pointer in
 * *save_sp, switches to load_sp and restores what was saved there. No signal-mask syscalls. */
extern "C" void emu_switch(void **save_sp, void *load_sp);
EMU_NOTSAN inline void emu_to_sched();
EMU_NOTSAN inline void emu_to_thread(EmuThread &t) { emu_switch(&emu_sched_sp, t.sp); }
EMU_NOTSAN inline void emu_prepare(EmuThread &t) {
    void **top = (void **)(((uintptr_t)t.stack + EMU_STACK) & ~(uintptr_t)15);
    top[-1] = nullptr;           /* emu_entry's return address: it never returns */
    top[-2] = (void *)emu_entry; /* where emu_switch's ret goes */
    for (int i = 3; i <= 8; i++) top[-i] = nullptr; /* rbp rbx r12 r13 r14 r15 */
    t.sp = &top[-8];
}
#else
EMU_NOTSAN inline void emu_to_sched();
EMU_NOTSAN inline void emu_to_thread(EmuThread &t) { swapcontext(&emu_sched, &t.ctx); }
EMU_NOTSAN inline void emu_prepare(EmuThread &t) {
    getcontext(&t.ctx);
    t.ctx.uc_stack.ss_sp = t.stack;
    t.ctx.uc_stack.ss_size = EMU_STACK;
    t.ctx.uc_link = nullptr;
    makecontext(&t.ctx, emu_entry, 0);
}
#endif
inline uint64_t emu_slots[32][32];
inline char *emu_dyn_smem;
enum : size_t { EMU_SMEM_DEFAULT = 48 * 1024, EMU_SMEM_MAX = 227 * 1024 }; /* per block, sm_90 */
inline int emu_gemm_calls[4]; /* sgemm, gemmEx, cublasLt, grouped */
inline int emu_lt_heuristics;  /* cublasLtMatmulAlgoGetHeuristic calls (the backend caches them) */
inline int emu_lt_fail = getenv("EMU_LT_FAIL") != nullptr;
inline std::function<void()> *emu_fn;
inline EmuThread emu_threads[1024]; /* a plain array: the scheduler calls no instrumented code */
#define threadIdx (emu_cur->tid)
#define blockIdx emu_blockIdx
#define blockDim emu_blockDim
#define gridDim emu_gridDim
#if defined(__x86_64__)
EMU_NOTSAN inline void emu_to_sched() { emu_switch(&emu_cur->sp, emu_sched_sp); }
#else
EMU_NOTSAN inline void emu_to_sched() { swapcontext(&emu_cur->ctx, &emu_sched); }
#endif

EMU_NOTSAN inline void __syncthreads() {
    emu_cur->state = 1;
    emu_to_sched();
}
EMU_NOTSAN inline void emu_warp_wait(int sync, unsigned mask) {
    emu_cur->state = 2;
    emu_cur->sync = sync, emu_cur->mask = mask;
    emu_to_sched();
}
EMU_NOTSAN inline void __syncwarp(unsigned m = 0xffffffffu) { emu_warp_wait(1, m); }
template <class T> EMU_NOTSAN inline T emu_shfl(unsigned mask, T v, int src) {
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    emu_slots[emu_cur->warp][emu_cur->lane] = u;
    emu_warp_wait(2, mask);
    T r;
    uint64_t w = emu_slots[emu_cur->warp][src & 31];
    memcpy(&r, &w, sizeof r);
    emu_warp_wait(2, mask);
    return r;
}
template <class T> EMU_NOTSAN inline T __shfl_sync(unsigned m, T v, int src) { return emu_shfl(m, v, src); }
template <class T> EMU_NOTSAN inline T __shfl_xor_sync(unsigned m, T v, int off) {
    return emu_shfl(m, v, emu_cur->lane ^ off);
}
template <class T> static inline T min(T a, T b) { return a < b ? a : b; }
template <class T> static inline T max(T a, T b) { return a > b ? a : b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
/* a product never fused into an add (make emu-fma's -ffp-contract=fast included), as on a GPU */
inline float __fmul_rn(float a, float b) {
    volatile float r = a * b;
    return r;
}

inline void emu_run(dim3 g, dim3 b, size_t smem, std::function<void()> f);
/* The pointer arguments of the launch being issued on this thread (emu_check_args), checked
 * against unfinished NCCL operations once the kernel's stream is drained. */
struct EmuArg { const void *p; int writable, index; };
inline thread_local std::vector<EmuArg> emu_args;
inline thread_local const char *emu_args_kernel = "", *emu_args_fn = "";
inline thread_local const void *emu_args_fnptr; /* the kernel function launched */
inline void emu_check_args_in_flight(cudaStream_t s) {
    for (const EmuArg &a : emu_args)
        emu_check_in_flight(s, emu_args_kernel, emu_args_fn, a.index, a.p, a.writable);
    emu_args.clear();
}
/* Kernels and GEMMs run one at a time (the emulated block's state is global), on the calling
 * thread or, under EMU_ASYNC, on their stream's. */
inline std::mutex emu_exec_mu;
/* A kernel runs once its stream's earlier work is done, with device memory open to it: at the
 * call, or (EMU_ASYNC) when a sync, event or NCCL operation needs it. */
inline void emu_launch(dim3 g, dim3 b, size_t smem, cudaStream_t s, std::function<void()> f) {
    emu_note_launch();
    emu_check_args_in_flight(s);
    const char *k = emu_args_kernel, *fn = emu_args_fn;
    const void *fp = emu_args_fnptr;
    auto run = [=] {
        std::lock_guard<std::mutex> l(emu_exec_mu);
        emu_args_kernel = k, emu_args_fn = fn, emu_args_fnptr = fp;
        emu_dev_open();
        emu_run(g, b, smem, f);
        emu_dev_close();
    };
    if (emu_async_enabled()) return emu_enqueue(s, run);
    emu_stream_drain(s);
    run();
}
inline void emu_launch(dim3 g, dim3 b, size_t smem, std::function<void()> f) { emu_launch(g, b, smem, nullptr, f); }
inline void emu_launch(dim3 g, dim3 b, std::function<void()> f) { emu_launch(g, b, 0, nullptr, f); }

/* A kernel's pointer arguments must be device memory: host memory passed to a kernel is a bug
 * the GPU reports only as an illegal address, if at all. Other arguments pass unchecked. */
template <class T> inline void emu_check_arg(const char *, const char *, int, const T &) {}
template <class T> inline void emu_check_arg(const char *k, const char *f, int i, T *p) {
    emu_check_kernel_pointer(k, f, i, (const void *)p);
    if (p) emu_args.push_back({(const void *)p, !std::is_const<T>::value, i}); /* const: read only */
}
/* EMU_COUNT=NAME: launches of kernel NAME, printed with EMU_REPORT (how often the backend rounds
 * weights, for one) */
inline int emu_counted_launches;
template <class... A> inline int emu_check_args(const void *fnptr, const char *k, const char *host_fn, const A &...a) {
    static const char *counted = getenv("EMU_COUNT");
    if (counted && strcmp(counted, k) == 0) emu_counted_launches++;
    int i = 0;
    emu_args.clear();
    emu_args_kernel = k, emu_args_fn = host_fn, emu_args_fnptr = fnptr;
    (emu_check_arg(k, host_fn, i++, a), ...);
    return 0;
}

/* ldmatrix and cp.async (cuda/ptx.cuh), as the PTX ISA defines them. ldmatrix is a warp
 * collective like a shuffle: every lane publishes its row address at one warp sync point (strict
 * mode checks that all 32 lanes arrive), then reads its pieces of the others' rows. cp.async reads
 * its source at issue but writes shared memory only at the cp.async.wait_group that retires its
 * group (or the thread's exit), so a read before that wait sees the old bytes; strict mode marks
 * the destination in flight and reports any access to it (emu_strict_async). */
EMU_NOTSAN inline void emu_warp_rows(const void *row, const char *rows[32]) {
    if ((uintptr_t)row & 15) {
        fprintf(stderr, "emu: in kernel %s, thread %u: ldmatrix row address %p is not 16-byte aligned\n",
                emu_args_kernel, emu_cur->tid.x, row);
        abort();
    }
    emu_slots[emu_cur->warp][emu_cur->lane] = (uint64_t)(uintptr_t)row;
    emu_warp_wait(3, 0xffffffffu);
    for (int l = 0; l < 32; l++) rows[l] = (const char *)(uintptr_t)emu_slots[emu_cur->warp][l];
    emu_warp_wait(3, 0xffffffffu);
}
inline void emu_ldmatrix_x4(uint32_t r[4], const void *row, bool trans) {
    const char *rows[32];
    emu_warp_rows(row, rows);
    const int l = emu_cur->lane;
    for (int m = 0; m < 4; m++) {
        if (!trans) {
            r[m] = *(const uint32_t *)(rows[8 * m + l / 4] + 4 * (l % 4));
            continue;
        }
        const uint16_t lo = *(const uint16_t *)(rows[8 * m + 2 * (l % 4)] + 2 * (l / 4));
        const uint16_t hi = *(const uint16_t *)(rows[8 * m + 2 * (l % 4) + 1] + 2 * (l / 4));
        r[m] = (uint32_t)lo | (uint32_t)hi << 16;
    }
}
struct EmuAsyncCopy { char *dst; uint32_t data[4]; int group; };
inline std::vector<EmuAsyncCopy> emu_async_q[1024]; /* per thread of the block, in issue order */
inline int emu_async_groups[1024];                  /* groups each thread committed */
inline void emu_cp_async16(void *dst, const void *src, int n) {
    if (((uintptr_t)dst | (uintptr_t)src) & 15 || (n != 0 && n != 16)) {
        fprintf(stderr, "emu: in kernel %s, thread %u: cp.async of 16 bytes with dst %p, src %p (16-byte aligned), src-size %d (0 or 16)\n",
                emu_args_kernel, emu_cur->tid.x, dst, src, n);
        abort();
    }
    const int t = (int)(emu_cur - emu_threads);
    EmuAsyncCopy c = {(char *)dst, {0u, 0u, 0u, 0u}, emu_async_groups[t]};
    for (int i = 0; i < 4 && n; i++) c.data[i] = ((const uint32_t *)src)[i];
    emu_strict_async(dst, 16, 1, __builtin_return_address(0));
    emu_async_q[t].push_back(c);
}
inline void emu_cp_async_commit() { emu_async_groups[emu_cur - emu_threads]++; }
/* lands the copies of every group but the n newest committed (n < 0: all, uncommitted too) */
inline void emu_cp_async_wait(int n) {
    const int t = (int)(emu_cur - emu_threads), last = emu_async_groups[t] - (n < 0 ? -1 : n);
    std::vector<EmuAsyncCopy> &q = emu_async_q[t];
    size_t k = 0;
    for (size_t i = 0; i < q.size(); i++) {
        if (q[i].group >= last) {
            q[k++] = q[i];
            continue;
        }
        emu_strict_async(q[i].dst, 16, 0, nullptr);
        for (int w = 0; w < 4; w++) ((uint32_t *)q[i].dst)[w] = q[i].data[w];
    }
    q.resize(k);
}
/* runtime (emu_rt): the C++ conveniences the CUDA headers add */
template <class T> inline cudaError_t cudaMalloc(T **p, size_t n) { return cudaMalloc((void **)p, n); }
template <class T> inline cudaError_t cudaMallocHost(T **p, size_t n) { return cudaMallocHost((void **)p, n); }
/* the dynamic shared memory each kernel opted into (a kernel's own attribute, as on a GPU) */
inline std::vector<std::pair<const void *, size_t>> emu_smem_optins;
template <class K> cudaError_t cudaFuncSetAttribute(K k, cudaFuncAttribute, int v) {
    if (v < 0 || (size_t)v > EMU_SMEM_MAX) return cudaErrorInvalidValue; /* as the runtime refuses it */
    for (auto &o : emu_smem_optins)
        if (o.first == (const void *)k) { o.second = (size_t)v; return 0; }
    emu_smem_optins.push_back({(const void *)k, (size_t)v});
    return 0;
}
inline size_t emu_smem_optin(const void *k) {
    for (auto &o : emu_smem_optins)
        if (o.first == k) return o.second;
    return 0;
}

/* bf16 */
struct __nv_bfloat16 { uint16_t x; };
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return __nv_bfloat16{0x7FFF}; /* NaN: the canonical one, as cvt.rn.bf16.f32 */
    u += 0x7FFFu + ((u >> 16) & 1u);
    __nv_bfloat16 b;
    b.x = (uint16_t)(u >> 16);
    return b;
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.x; }
/* atomicAdd on a float: threads are coroutines, so the read-add-write is atomic as it stands; it
 * is not instrumented as a plain read and write: strict mode is told it is an atomic instead. */
EMU_NOTSAN __attribute__((noinline)) inline float atomicAdd(float *p, float v) {
    if (emu_strict_tid >= 0) emu_strict_atomic(p, sizeof *p, __builtin_return_address(0));
    float old = *p;
    *p = old + v;
    return old;
}
inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline float emu_bf2f(__nv_bfloat16 b) {
    uint32_t u = (uint32_t)b.x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline float __bfloat162float(__nv_bfloat16 b) { return emu_bf2f(b); }

/* cuBLAS */
struct EmuBlas { cudaStream_t stream; };
typedef EmuBlas *cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_SUPPORTED = 15 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0 } cublasMath_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
inline cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = new EmuBlas{nullptr}; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasDestroy(cublasHandle_t h) { delete h; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) { h->stream = s; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
inline void emu_gemm(int ta, int tb, int m, int n, int k, float alpha, const void *A, int abf, int lda,
              long long sA, const void *B, int bbf, int ldb, long long sB, float beta, void *C,
              int cbf, int ldc, long long sC, int batch);
/* A GEMM on stream s: like a kernel, after the stream's earlier work, with device memory open.
 * f captures by value what it needs: under EMU_ASYNC it runs after the call has returned. */
template <class F> inline void emu_gemm_on(cudaStream_t s, const void *A, const void *B, void *C, F f) {
    emu_note_launch();
    emu_check_in_flight(s, "GEMM", "cuBLAS", 0, A, 0);
    emu_check_in_flight(s, "GEMM", "cuBLAS", 1, B, 0);
    emu_check_in_flight(s, "GEMM", "cuBLAS", 2, C, 1);
    auto run = [f] {
        std::lock_guard<std::mutex> l(emu_exec_mu);
        emu_dev_open();
        f();
        emu_dev_close();
    };
    if (emu_async_enabled()) return emu_enqueue(s, run);
    emu_stream_drain(s);
    run();
}
inline cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                  int n, int k, const float *al, const float *A, int lda,
                                  const float *B, int ldb, const float *be, float *C, int ldc) {
    emu_gemm_calls[0]++;
    const float a = *al, b = *be; /* host scalars are read at the call */
    emu_gemm_on(h->stream, A, B, C, [=] { emu_gemm(ta, tb, m, n, k, a, A, 0, lda, 0, B, 0, ldb, 0, b, C, 0, ldc, 0, 1); });
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta,
                                                cublasOperation_t tb, int m, int n, int k,
                                                const float *al, const float *A, int lda,
                                                long long sA, const float *B, int ldb, long long sB,
                                                const float *be, float *C, int ldc, long long sC,
                                                int batch) {
    emu_gemm_calls[0]++;
    const float a = *al, b = *be;
    emu_gemm_on(h->stream, A, B, C, [=] { emu_gemm(ta, tb, m, n, k, a, A, 0, lda, sA, B, 0, ldb, sB, b, C, 0, ldc, sC, batch); });
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta,
                                                 cublasOperation_t tb, int m, int n, int k,
                                                 const void *al, const void *A, cudaDataType at,
                                                 int lda, long long sA, const void *B,
                                                 cudaDataType bt, int ldb, long long sB,
                                                 const void *be, void *C, cudaDataType ct, int ldc,
                                                 long long sC, int batch, cublasComputeType_t,
                                                 cublasGemmAlgo_t) {
    emu_gemm_calls[1]++;
    const float a = *(const float *)al, b = *(const float *)be;
    emu_gemm_on(h->stream, A, B, C, [=] {
        emu_gemm(ta, tb, m, n, k, a, A, at == CUDA_R_16BF, lda, sA, B,
                 bt == CUDA_R_16BF, ldb, sB, b, C, ct == CUDA_R_16BF, ldc, sC, batch);
    });
    return CUBLAS_STATUS_SUCCESS;
}

/* Grouped GEMM: group g's size[g] problems in turn (pointer arrays A, B, C live on the device;
 * alpha, beta and the shapes on the host, one per group). */
inline cublasStatus_t cublasGemmGroupedBatchedEx(
    cublasHandle_t h, const cublasOperation_t ta[], const cublasOperation_t tb[], const int m[],
    const int n[], const int k[], const void *al, const void *const A[], cudaDataType at,
    const int lda[], const void *const B[], cudaDataType bt, const int ldb[], const void *be,
    void *const C[], cudaDataType ct, const int ldc[], int groups, const int size[],
    cublasComputeType_t c) {
    if (c != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    emu_gemm_calls[3]++;
    /* the pointer arrays are what the call reads from device memory directly */
    /* the shapes, alpha and beta are host arrays, read at the call */
    struct Group { int ta, tb, m, n, k, lda, ldb, ldc, size; float al, be; };
    std::vector<Group> gs;
    for (int g = 0; g < groups; g++)
        gs.push_back({ta[g], tb[g], m[g], n[g], k[g], lda[g], ldb[g], ldc[g], size[g],
                      ((const float *)al)[g], ((const float *)be)[g]});
    emu_gemm_on(h->stream, (const void *)A, (const void *)B, (void *)C, [=] {
        int idx = 0;
        for (const Group &g : gs)
            for (int s = 0; s < g.size; s++, idx++)
                emu_gemm(g.ta, g.tb, g.m, g.n, g.k, g.al, A[idx], at == CUDA_R_16BF, g.lda, 0,
                         B[idx], bt == CUDA_R_16BF, g.ldb, 0, g.be, C[idx], ct == CUDA_R_16BF,
                         g.ldc, 0, 1);
    });
    return CUBLAS_STATUS_SUCCESS;
}

/* cuBLASLt */
typedef void *cublasLtHandle_t;
/* bias_type / aux_type -1: unset, which cuBLASLt reads as D's type */
struct EmuLtDesc { int ta, tb, epilogue; const void *bias; void *aux; int64_t aux_ld; int bias_type, aux_type; };
struct EmuLtLayout { int type; uint64_t rows, cols; int64_t ld; int batch; int64_t stride; };
typedef EmuLtDesc *cublasLtMatmulDesc_t;
typedef EmuLtLayout *cublasLtMatrixLayout_t;
typedef void *cublasLtMatmulPreference_t;
struct cublasLtMatmulAlgo_t { int dummy; };
struct cublasLtMatmulHeuristicResult_t { cublasLtMatmulAlgo_t algo; };
typedef enum { CUBLASLT_MATMUL_DESC_TRANSA, CUBLASLT_MATMUL_DESC_TRANSB, CUBLASLT_MATMUL_DESC_EPILOGUE,
               CUBLASLT_MATMUL_DESC_BIAS_POINTER, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
               CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
               CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE } cublasLtMatmulDescAttributes_t;
typedef enum { CUBLASLT_EPILOGUE_DEFAULT = 1, CUBLASLT_EPILOGUE_BIAS = 4, CUBLASLT_EPILOGUE_GELU = 32,
               CUBLASLT_EPILOGUE_GELU_AUX = 32 | 128, CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 32 | 128 | 4,
               CUBLASLT_EPILOGUE_DGELU = 64 | 128 } cublasLtEpilogue_t;
typedef enum { CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET } cublasLtMatrixLayoutAttribute_t;
typedef enum { CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
               CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
               CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES } cublasLtMatmulPreferenceAttributes_t;
inline cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { *h = (void *)1; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t c, cudaDataType s) {
    if (c != CUBLAS_COMPUTE_32F || s != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    *d = new EmuLtDesc{0, 0, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0, -1, -1};
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { delete d; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *v, size_t n) {
    if (a == CUBLASLT_MATMUL_DESC_BIAS_POINTER || a == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER) {
        if (n != sizeof(void *)) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (a == CUBLASLT_MATMUL_DESC_BIAS_POINTER) d->bias = *(const void *const *)v;
        else d->aux = *(void *const *)v;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (a == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD) {
        if (n != 8) return CUBLAS_STATUS_NOT_SUPPORTED;
        d->aux_ld = *(const int64_t *)v;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (n != 4) return CUBLAS_STATUS_NOT_SUPPORTED; /* the enums are 32-bit */
    int x = *(const int32_t *)v;
    if (a == CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE || a == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE) {
        if (x != CUDA_R_32F && x != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
        (a == CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE ? d->bias_type : d->aux_type) = x;
    } else if (a == CUBLASLT_MATMUL_DESC_EPILOGUE) {
        if (x != CUBLASLT_EPILOGUE_DEFAULT && x != CUBLASLT_EPILOGUE_BIAS && x != CUBLASLT_EPILOGUE_GELU_AUX &&
            x != CUBLASLT_EPILOGUE_GELU_AUX_BIAS && x != CUBLASLT_EPILOGUE_DGELU)
            return CUBLAS_STATUS_NOT_SUPPORTED;
        d->epilogue = x;
    } else if (a == CUBLASLT_MATMUL_DESC_TRANSA) d->ta = x; else d->tb = x;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType t, uint64_t r, uint64_t c, int64_t ld) {
    if (ld < (int64_t)r) return CUBLAS_STATUS_NOT_SUPPORTED;
    *l = new EmuLtLayout{t, r, c, ld, 1, 0};
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { delete l; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, const void *v, size_t n) {
    if (a == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT) { if (n != 4) return CUBLAS_STATUS_NOT_SUPPORTED; l->batch = *(const int32_t *)v; }
    else { if (n != 8) return CUBLAS_STATUS_NOT_SUPPORTED; l->stride = *(const int64_t *)v; }
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) { *p = (void *)1; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t) { return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t a, const void *v, size_t n) {
    if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES ? n != 8 : n != 4) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (a != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) { uint32_t al = *(const uint32_t *)v; if (al == 0 || (al & (al - 1))) return CUBLAS_STATUS_NOT_SUPPORTED; }
    return CUBLAS_STATUS_SUCCESS;
}
/* Only the combinations cuBLASLt's documentation lists for CUBLAS_COMPUTE_32F (cublasLtMatmul's
 * type table): A and B both bf16 with C = D bf16 or fp32, or all fp32; an epilogue's bias and aux
 * of D's type (other bias types exist only for IMMA and fp8 kernels). Anything else finds no
 * algorithm, as a real cuBLASLt may, and the caller's fallback runs. */
inline bool emu_lt_listed(const EmuLtDesc *d, const EmuLtLayout *a, const EmuLtLayout *b, const EmuLtLayout *c, const EmuLtLayout *dd) {
    if (a->type != b->type || c->type != dd->type) return false;
    if (a->type == CUDA_R_32F && dd->type != CUDA_R_32F) return false;
    if ((d->epilogue & CUBLASLT_EPILOGUE_BIAS) && d->bias_type >= 0 && d->bias_type != dd->type) return false;
    if ((d->epilogue & (CUBLASLT_EPILOGUE_GELU | CUBLASLT_EPILOGUE_DGELU)) && d->aux_type >= 0 && d->aux_type != dd->type) return false;
    return true;
}
inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd, cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t *, int *n) {
    emu_lt_heuristics++;
    *n = emu_lt_fail || !emu_lt_listed(d, a, b, c, dd) ? 0 : 1;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void *alpha, const void *A, cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb, const void *beta, const void *C, cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t);

EMU_NOTSAN inline void emu_entry() {
    (*emu_fn)();
    if (!emu_async_q[emu_cur - emu_threads].empty()) emu_cp_async_wait(-1); /* lands at exit */
    emu_cur->state = 3;
    emu_to_sched();
}

/* One scheduling round of a block's threads: each runnable thread runs to its next barrier,
 * in the order EMU_ORDER asks (forward, reverse, random). */
EMU_NOTSAN inline void emu_round(int nt) {
    static const char *ord = getenv("EMU_ORDER");
    static unsigned rs = 12345;
    int mode = ord ? (ord[0] == 'r' && ord[1] == 'e' ? 1 : 2) : 0;
    int order[1024];
    for (int t = 0; t < nt; t++) order[t] = mode == 1 ? nt - 1 - t : t;
    if (mode == 2)
        for (int t = nt - 1; t > 0; t--) {
            rs = rs * 1103515245u + 12345u;
            int j = (rs >> 8) % (t + 1);
            int x = order[t]; order[t] = order[j]; order[j] = x;
        }
    const bool strict = emu_strict_enabled();
    for (int oi = 0; oi < nt; oi++) {
        int t = order[oi];
        if (emu_threads[t].state == 0) {
            emu_cur = &emu_threads[t];
            if (strict) emu_strict_tid = t;
            emu_to_thread(*emu_cur);
            emu_strict_tid = -1;
        }
    }
}

/* Strict mode, as warp w's waiting lanes are released together: every lane a lane's mask names
 * exists, has not exited and waits at the same kind of warp barrier with the same mask (on a GPU
 * anything else is undefined: a hang or garbage). */
EMU_NOTSAN inline void emu_check_warp(int w, int nt) {
    static const char *kind[] = {"", "__syncwarp", "__shfl_*_sync", "ldmatrix"};
    for (int l = 0; l < 32 && w * 32 + l < nt; l++) {
        const EmuThread &a = emu_threads[w * 32 + l];
        if (a.state != 2) continue;
        const char *why = nullptr;
        int j = l;
        char buf[160];
        if (!(a.mask >> l & 1)) why = "leaves the lane itself out";
        for (j = 0; !why && j < 32; j++) {
            if (!(a.mask >> j & 1)) continue;
            const EmuThread &b = emu_threads[w * 32 + j];
            if (w * 32 + j >= nt) why = "names a lane the block does not have";
            else if (b.state == 3) why = "names a lane that exited";
            else if (b.sync != a.sync || b.mask != a.mask) {
                snprintf(buf, sizeof buf, "names a lane that sits at another sync point (%s, mask 0x%08x)",
                         kind[b.sync], b.mask);
                why = buf;
            }
            if (why) break;
        }
        if (!why) continue;
        fprintf(stderr, "emu strict: in kernel %s, block (%u,%u,%u), warp %d: lane %d's %s mask 0x%08x %s: lane %d\n",
                emu_args_kernel, emu_blockIdx.x, emu_blockIdx.y, emu_blockIdx.z, w, l, kind[a.sync], a.mask, why, j);
        fflush(stderr);
        std::_Exit(3);
    }
}

/* Releases the warps whose live threads all wait at a warp barrier, else the block when all its
 * live threads wait at __syncthreads; dies on a deadlock. Returns the live threads. */
EMU_NOTSAN inline int emu_release(int nt, dim3 bi) {
    int alive = 0, nblock = 0, released = 0;
    for (int t = 0; t < nt; t++) {
        int s = emu_threads[t].state;
        if (s != 3) alive++;
        if (s == 1) nblock++;
    }
    if (!alive) return 0;
    for (int w = 0; w * 32 < nt; w++) {
        int waiting = 0, other = 0;
        for (int t = w * 32; t < nt && t < w * 32 + 32; t++) {
            int s = emu_threads[t].state;
            if (s == 2) waiting++;
            else if (s != 3) other++;
        }
        if (waiting && !other) {
            if (emu_strict_enabled()) emu_check_warp(w, nt);
            for (int t = w * 32; t < nt && t < w * 32 + 32; t++)
                if (emu_threads[t].state == 2) emu_threads[t].state = 0;
            released++;
            emu_strict_warp(w);
        }
    }
    if (!released && nblock == alive) {
        for (int t = 0; t < nt; t++)
            if (emu_threads[t].state == 1) emu_threads[t].state = 0;
        released++;
        emu_strict_barrier();
    }
    if (!released) {
        fprintf(stderr, "emu: deadlock in block (%u,%u,%u): %d alive, %d at __syncthreads\n", bi.x, bi.y, bi.z, alive, nblock);
        abort();
    }
    return alive;
}

/* Runs the grid block after block. In strict mode the blocks run in a random order (EMU_SEED,
 * default 1): a result that depends on block order changes. */
EMU_NOTSAN inline void emu_run(dim3 g, dim3 b, size_t smem, std::function<void()> f) {
    int nt = b.x * b.y * b.z;
    if (nt > 1024 || nt <= 0) { fprintf(stderr, "emu: bad block %d\n", nt); abort(); }
    const size_t optin = emu_smem_optin(emu_args_fnptr);
    if (smem > (optin > EMU_SMEM_DEFAULT ? optin : (size_t)EMU_SMEM_DEFAULT)) {
        fprintf(stderr, "emu: kernel %s launched with %zu bytes of dynamic shared memory: over 48 KiB needs the kernel's own cudaFuncSetAttribute(MaxDynamicSharedMemorySize), which %s\n",
                emu_args_kernel, smem, optin ? "it set lower" : "it never set");
        abort();
    }
    if (g.x > 2147483647u || g.y > 65535 || g.z > 65535) { fprintf(stderr, "emu: bad grid\n"); abort(); }
    emu_fn = &f;
    emu_gridDim = g;
    emu_blockDim = b;
    std::vector<char> sm(smem + 16);
    for (int t = 0; t < nt; t++)
        if (!emu_threads[t].stack) emu_threads[t].stack = (char *)malloc(EMU_STACK);
    const unsigned nb = g.x * g.y * g.z;
    std::vector<unsigned> blocks(nb);
    for (unsigned i = 0; i < nb; i++) blocks[i] = i;
    const bool strict = emu_strict_enabled();
    if (strict) {
        static unsigned long long seed = getenv("EMU_SEED") ? strtoull(getenv("EMU_SEED"), nullptr, 10) : 1;
        for (unsigned i = nb; i > 1; i--) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            unsigned j = (unsigned)((seed >> 33) % i), x = blocks[i - 1];
            blocks[i - 1] = blocks[j], blocks[j] = x;
        }
        emu_strict_launch(emu_args_kernel, nb, sm.data(), smem, optin > EMU_SMEM_DEFAULT ? EMU_SMEM_MAX : EMU_SMEM_DEFAULT);
    }
    for (unsigned lin : blocks) {
        const unsigned bx = lin % g.x, by = lin / g.x % g.y, bz = lin / (g.x * g.y);
        emu_blockIdx = dim3(bx, by, bz);
        if (strict) emu_strict_block(lin, bx, by, bz);
        memset(sm.data(), 0xAB, sm.size());
        emu_dyn_smem = sm.data();
        for (int t = 0; t < nt; t++) {
            EmuThread &th = emu_threads[t];
            th.tid = dim3(t % b.x, t / b.x % b.y, t / (b.x * b.y));
            th.lane = t % 32, th.warp = t / 32, th.state = 0;
            emu_async_q[t].clear(), emu_async_groups[t] = 0;
            emu_prepare(th);
        }
        do emu_round(nt);
        while (emu_release(nt, emu_blockIdx) > 0);
    }
}

EMU_NOTSAN inline float emu_ld_el(const void *p, int bf, long long i) {
    return bf ? emu_bf2f(((const __nv_bfloat16 *)p)[i]) : ((const float *)p)[i];
}

EMU_NOTSAN inline void emu_st_el(void *p, int bf, long long i, float v) {
    if (bf) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else ((float *)p)[i] = v;
}

/* C (fp32, or bf16 when cbf: read widened, the result rounded once on store) = alpha A B + beta C,
 * with the sum of products accumulated at (at least) fp32 precision. */
EMU_NOTSAN inline void emu_gemm(int ta, int tb, int m, int n, int k, float alpha, const void *A, int abf, int lda,
              long long sA, const void *B, int bbf, int ldb, long long sB, float beta, void *C,
              int cbf, int ldc, long long sC, int batch) {
    if (lda < (ta ? k : m) || ldb < (tb ? n : k) || ldc < m) { fprintf(stderr, "emu gemm: bad ld\n"); abort(); }
    for (int bt = 0; bt < batch; bt++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double s = 0;
                for (int l = 0; l < k; l++) {
                    float a = emu_ld_el(A, abf, bt * sA + (ta ? l + (long long)i * lda : i + (long long)l * lda));
                    float bb = emu_ld_el(B, bbf, bt * sB + (tb ? j + (long long)l * ldb : l + (long long)j * ldb));
                    s += (double)a * bb;
                }
                long long c = bt * sC + i + (long long)j * ldc;
                float v = beta == 0.0f ? (float)(alpha * s) : (float)(alpha * s + beta * emu_ld_el(C, cbf, c));
                emu_st_el(C, cbf, c, v);
            }
}

inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void *alpha, const void *A, cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb, const void *beta, const void *C, cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ldd, const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t stream) {
    if (!emu_lt_listed(d, la, lb, lc, ldd)) return CUBLAS_STATUS_NOT_SUPPORTED;
    emu_gemm_calls[2]++;
    uint64_t m = d->ta ? la->cols : la->rows, ka = d->ta ? la->rows : la->cols;
    uint64_t kb = d->tb ? lb->cols : lb->rows, n = d->tb ? lb->rows : lb->cols;
    if (ka != kb || lc->rows != m || lc->cols != n || C != D || lc != ldd || la->batch != lb->batch || la->batch != lc->batch) {
        fprintf(stderr, "emu lt: inconsistent layouts m=%lu ka=%lu kb=%lu n=%lu C %lux%lu\n", m, ka, kb, n, lc->rows, lc->cols);
        abort();
    }
    int has_bias = d->epilogue & CUBLASLT_EPILOGUE_BIAS, has_gelu = d->epilogue & CUBLASLT_EPILOGUE_GELU;
    int has_dgelu = d->epilogue == CUBLASLT_EPILOGUE_DGELU;
    if ((has_bias && !d->bias) || ((has_bias || has_gelu || has_dgelu) && la->batch != 1)) { fprintf(stderr, "emu lt: bias epilogue without a bias or with batches\n"); abort(); }
    /* like cuBLASLt: the aux buffer's leading dimension is a multiple of 8, at least D's rows */
    if ((has_gelu || has_dgelu) && (!d->aux || d->aux_ld % 8 || d->aux_ld < (int64_t)m)) { fprintf(stderr, "emu lt: bad GELU aux buffer (ld %ld)\n", (long)d->aux_ld); abort(); }
    const int dbf = lc->type == CUDA_R_16BF;
    const int bias_bf = (d->bias_type < 0 ? lc->type : d->bias_type) == CUDA_R_16BF;
    const int aux_bf = (d->aux_type < 0 ? lc->type : d->aux_type) == CUDA_R_16BF;
    /* the descriptors, alpha and beta are read at the call (the GEMM may run after it returns) */
    const EmuLtDesc dv = *d;
    const EmuLtLayout lav = *la, lbv = *lb, lcv = *lc;
    const float alv = *(const float *)alpha, bev = *(const float *)beta;
    emu_gemm_on(stream, A, B, D, [=] {
        const EmuLtDesc *d = &dv;
        const EmuLtLayout *la = &lav, *lb = &lbv, *lc = &lcv;
        const float *alpha = &alv, *beta = &bev;
        if (!has_bias && !has_gelu && !has_dgelu) {
            emu_gemm(d->ta, d->tb, (int)m, (int)n, (int)ka, *(const float *)alpha, A, la->type == CUDA_R_16BF, (int)la->ld, la->stride, B, lb->type == CUDA_R_16BF, (int)lb->ld, lb->stride, *(const float *)beta, D, dbf, (int)lc->ld, lc->stride, la->batch);
            return;
        }
        /* epilogues (batch 1): the product in fp32, then bias and GELU (or the GELU's gradient at
         * the pre-activation in aux), D rounded once */
        std::vector<float> x((size_t)m * n);
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) x[i + j * m] = emu_ld_el(D, dbf, i + j * lc->ld);
        emu_gemm(d->ta, d->tb, (int)m, (int)n, (int)ka, *(const float *)alpha, A, la->type == CUDA_R_16BF, (int)la->ld, la->stride, B, lb->type == CUDA_R_16BF, (int)lb->ld, lb->stride, *(const float *)beta, x.data(), 0, (int)m, 0, 1);
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) {
                float v = x[i + j * m];
                if (has_bias) v += emu_ld_el(d->bias, bias_bf, i); /* one bias element per row of D */
                if (has_gelu) { /* the tanh approximation, pre-activation kept in aux */
                    emu_st_el(d->aux, aux_bf, i + j * d->aux_ld, v);
                    v = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
                }
                if (has_dgelu) {
                    float u = emu_ld_el(d->aux, aux_bf, i + j * d->aux_ld);
                    float t = tanhf(0.7978845608f * (u + 0.044715f * u * u * u));
                    v *= 0.5f * (1.0f + t) + 0.5f * u * (1.0f - t * t) * 0.7978845608f * (1.0f + 3.0f * 0.044715f * u * u);
                }
                emu_st_el(D, dbf, i + j * lc->ld, v);
            }
    });
    return CUBLAS_STATUS_SUCCESS;
}

struct EmuReport { /* EMU_REPORT=1: which GEMM paths ran (the cuBLASLt fallback check reads it) */
    ~EmuReport() {
        if (getenv("EMU_REPORT")) fprintf(stderr, "emu: sgemm calls %d, gemmEx calls %d, cublasLt calls %d, grouped calls %d, cublasLt heuristics %d\n", emu_gemm_calls[0],
                emu_gemm_calls[1], emu_gemm_calls[2], emu_gemm_calls[3], emu_lt_heuristics);
        if (getenv("EMU_REPORT") && getenv("EMU_COUNT"))
            fprintf(stderr, "emu: launches of %s: %d\n", getenv("EMU_COUNT"), emu_counted_launches);
    }
};
inline EmuReport emu_report;

#endif
