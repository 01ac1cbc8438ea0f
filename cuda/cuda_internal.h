/* cuda_internal: what the .cu files of the CUDA backend share (C++ only, never included by C):
 * the backend's private state, error checks, launch geometry and warp/block reductions. */
#ifndef UST_CUDA_INTERNAL_H
#define UST_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

/* error.h is C11: its _Noreturn is spelled [[noreturn]] in C++. */
#define _Noreturn [[noreturn]]
extern "C" {
#include "error.h"
#include "ops.h"
}
#undef _Noreturn

typedef struct lt_cache lt_cache; /* ops_cuda.cu: cuBLASLt descriptors per problem */
typedef struct cuda_w16 cuda_w16; /* ops_cuda_w16.cu: the bf16 copy of the weights */

typedef struct {
    int device;
    int smem_optin; /* max dynamic shared memory per block (bytes) */
    int num_sms;
    cudaStream_t stream; /* every op is enqueued here */
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *lt_ws; /* cuBLASLt workspace */
    size_t lt_ws_bytes;
    lt_cache *ltc;    /* built on first use, freed with the backend (cuda_lt_cache_free) */
    void *scratch[8]; /* grow-only device scratch, one slot per use (SCR_*) */
    size_t scratch_bytes[8];
    int attn_mode;         /* ATT_*: which attention implementation (UST_CUDA_ATTENTION) */
    int attn_chunk;        /* > 0: queries per chunk of the GEMM attention (else by memory) */
    double *dev_partials;  /* RED_BLOCKS partial sums of sum/sumsq */
    double *host_partials; /* pinned copy of them */
    int64_t allocations;   /* cudaMalloc calls of alloc and scratch growth (ops.h memory) */
    void *chunks_host;     /* multi-tensor ops: the chunk list and partial sums on the host */
    size_t chunks_host_bytes;
    cuda_w16 *w16; /* built by the first AdamW under bf16, freed with the backend */
} cuda_impl;

/* Attention implementations: tensor-core flash kernels under bf16 where the head dim has one
 * (auto), else GEMMs over materialized scores; each can be forced (tc falls back to GEMMs for
 * head dims it has no kernel for). */
enum { ATT_AUTO = 0, ATT_GEMM, ATT_FLASH, ATT_TC };

/* bf16 copies of GEMM inputs (A, B); column-reduction partials and attention's D_i (C);
 * attention scores/probabilities (S) and their gradients (P); the multi-tensor ops' chunk list
 * and partial sums (M); fp32 copies of bf16 activations for the attention paths that compute in
 * fp32 storage (W); the grouped GEMM's pointer arrays (G). */
enum {
    SCR_A = 0,
    SCR_B = 1,
    SCR_C = 2,
    SCR_S = 3,
    SCR_P = 4,
    SCR_M = 5,
    SCR_W = 6,
    SCR_G = 7,
    SCR_N = 8
};

#define CUDA_IMPL(o) ((cuda_impl *)(o)->impl)
#define STREAM(o) (CUDA_IMPL(o)->stream)

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess)                                                                   \
            ust_fatal(UST_EXIT_RUNTIME, "CUDA error at %s:%d: %s: %s", __FILE__, __LINE__, #call,  \
                      cudaGetErrorString(err_));                                                   \
    } while (0)

/* After a kernel launch: launch-configuration errors surface here, execution errors at the
 * next synchronizing call. */
#define CK_LAUNCH() CK(cudaGetLastError())

/* Frees the cuBLASLt descriptors ops_cuda.cu kept per problem (at the backend's end). */
void cuda_lt_cache_free(cuda_impl *im);

/* ---- ops_cuda_w16.cu: the bf16 copy of the weights that AdamW writes (bf16 on) ----
 * cuda_w16_target: where AdamW, updating elements [0, end) of parameter buffer p, writes their
 * bf16 copy (element i at [i]; NULL: none, fp32 mode); cuda_w16_mark: those segments of it are
 * now valid (after the kernel that writes them is queued). Any op that may write fp32 memory
 * calls cuda_w16_cut on what it writes (a free, cuda_w16_drop); cuda_w16_find gives the copy
 * of n weights at p when all of it is valid, else NULL (the caller rounds them itself). */
__nv_bfloat16 *cuda_w16_target(const ust_ops *o, const float *p, int64_t end);
void cuda_w16_mark(const ust_ops *o, const ops_segment *seg, int k);
void cuda_w16_cut(const ust_ops *o, const void *p, size_t bytes);
void cuda_w16_drop(const ust_ops *o);
const __nv_bfloat16 *cuda_w16_find(const ust_ops *o, const float *p, int64_t n);
size_t cuda_w16_bytes(const cuda_impl *im);
void cuda_w16_free(cuda_impl *im);

/* Grid for an elementwise kernel over n items with grid-stride loops. */
static inline int grid_for(int64_t n, int threads) {
    int64_t g = (n + threads - 1) / threads;
    if (g > 65535 * 8) g = 65535 * 8;
    return g < 1 ? 1 : (int)g;
}

/* Device scratch slot `slot` of at least `bytes`, grown (never shrunk) on demand. Growing
 * happens on the first steps only, after waiting for the work that may still use the old one. */
void *cuda_scratch(const ust_ops *o, int slot, size_t bytes);

/* Row-major C[M,N] (leading dimension ldc) = alpha op(A) op(B) + beta C for `batch` problems at
 * element strides sA, sB, sC; A is stored (M,K) with leading dimension lda, or (K,M) when tA; B
 * (K,N) with ldb, or (N,K) when tB. cuBLAS SGEMM, or bf16 inputs through cuBLASLt with bf16 on. */
void cuda_gemm(const ust_ops *o, float *C, int64_t ldc, int64_t sC, const float *A, int64_t lda,
               int64_t sA, const float *B, int64_t ldb, int64_t sB, int M, int N, int K, int tA,
               int tB, float alpha, float beta, int batch);

/* Activations (ops.h's act) are stored as float or __nv_bfloat16 (act_size 4 or 2); kernels
 * that touch them are templates on the storage type T, read into fp32, compute in fp32 and round
 * only when they store. */
typedef __nv_bfloat16 bf16;
__device__ __forceinline__ float ld_act(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld_act(const bf16 *p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st_act(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st_act(bf16 *p, int64_t i, float v) {
    p[i] = __float2bfloat16_rn(v);
}

/* dst = src rounded to bf16 (nearest even), n elements, on the backend's stream. */
void cuda_round_bf16(const ust_ops *o, bf16 *dst, const float *src, int64_t n);

/* kernel<float> or kernel<bf16> by the backend's act_size, on its stream (the kernel takes its
 * activation pointers as act * and casts them to T *). */
#define ACT_LAUNCH(o, kernel, grid, block, smem, ...)                                              \
    do {                                                                                           \
        if ((o)->act_size == 2)                                                                    \
            kernel<bf16><<<grid, block, smem, STREAM(o)>>>(__VA_ARGS__);                           \
        else                                                                                       \
            kernel<float><<<grid, block, smem, STREAM(o)>>>(__VA_ARGS__);                          \
        CK_LAUNCH();                                                                               \
    } while (0)

/* Attention's token positions: p[i], or i when none are given. */
__device__ __forceinline__ int posof(const int32_t *p, int i) { return p ? p[i] : i; }
/* Where query i of sequence b's document begins (ops.h q_start); INT_MIN: no document mask. */
__device__ __forceinline__ int doc_start(const int32_t *q_start, int b, int Tq, int i) {
    return q_start && i < Tq ? q_start[(int64_t)b * Tq + i] : INT_MIN;
}

/* Two floats rounded to bf16 (nearest even) in one word, lo in the low half: memory order. */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}

/* ---- reductions (fixed trees: the result does not depend on scheduling) ---- */

template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* max(a, b), NaN when either is: fmaxf drops a NaN (IEEE maxNum), and a softmax's max must carry
 * a NaN score (a non-finite weight) through to its output and lse rather than hide it. Equal to
 * fmaxf on numbers (a signed zero aside, which no softmax tells apart). */
__device__ __forceinline__ float max_nan(float a, float b) { return a > b || a != a ? a : b; }

__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
 * `sh` holds 32 values; the call begins and ends with a barrier so it can be reused. */
template <typename T> __device__ __forceinline__ T block_sum(T v, T *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    T r = lane < nw ? sh[lane] : (T)0;
    r = warp_sum(r);
    return r;
}

__device__ __forceinline__ float block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float r = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(r);
}

/* Dynamic shared memory above the default 48 KiB must be opted into per kernel. */
template <typename K> static void cuda_smem_optin(const ust_ops *o, K kernel, size_t bytes) {
    cuda_impl *im = CUDA_IMPL(o);
    UST_ASSERT(
        (int64_t)bytes <= im->smem_optin,
        "attention needs %zu bytes of shared memory per block, device allows %d (D too large)",
        bytes, im->smem_optin);
    if (bytes > 48 * 1024)
        CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

/* ops_cuda_act.cu: ops.h's scale_act on activations of the backend's type. */
void cuda_scale_act(const ust_ops *o, act *x, float s, int64_t n);

/* attention.cu: ops.h's attention on activations of the backend's type (act_size). */
void cuda_attention_fwd(const ust_ops *o, act *out, float *lse, const act *q, const act *k,
                        const act *v, int B, int Tq, int Tk, int H, int Hkv, int D,
                        const int32_t *q_pos, const int32_t *k_pos, int causal,
                        const int32_t *q_start, float softcap);
void cuda_attention_bwd(const ust_ops *o, act *dq, act *dk, act *dv, const act *dout,
                        const act *out, const float *lse, const act *q, const act *k, const act *v,
                        int B, int Tq, int Tk, int H, int Hkv, int D, const int32_t *q_pos,
                        const int32_t *k_pos, int causal, const int32_t *q_start, float softcap);
void cuda_attention_merge(const ust_ops *o, act *out, float *lse, const act *out2,
                          const float *lse2, int B, int T, int H, int D);
/* Di[b,h,i] = dout_i . out_i (fp32) for every row, in scratch slot C (the backward's
 * correction); dout and out are activations. */
const float *cuda_attention_dot(const ust_ops *o, const act *dout, const act *out, int B, int Tq,
                                int H, int D);

/* attention_max.cu: ops.h's attention_logit_max (any act_size). */
void cuda_attention_logit_max(const ust_ops *o, float *mx, const act *q, const act *k, int B,
                              int Tq, int Tk, int H, int Hkv, int D, const int32_t *q_pos,
                              const int32_t *k_pos, int causal, const int32_t *q_start);

/* attention_tc.cu: the tensor-core kernels (bf16 products, fp32 softmax and accumulators) for
 * the head dims cuda_attention_tc_supported accepts, reading and writing activations as stored;
 * the backward takes Di from above. */
int cuda_attention_tc_supported(int D);
void cuda_attention_tc_fwd(const ust_ops *o, act *out, float *lse, const act *q, const act *k,
                           const act *v, int B, int Tq, int Tk, int H, int Hkv, int D,
                           const int32_t *q_pos, const int32_t *k_pos, int causal,
                           const int32_t *q_start);
void cuda_attention_tc_bwd(const ust_ops *o, act *dq, act *dk, act *dv, const act *dout,
                           const float *lse, const float *Di, const act *q, const act *k,
                           const act *v, int B, int Tq, int Tk, int H, int Hkv, int D,
                           const int32_t *q_pos, const int32_t *k_pos, int causal,
                           const int32_t *q_start);

#endif
