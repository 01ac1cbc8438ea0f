/* ops_cuda: the CUDA backend of ops.h, everything but attention (attention.cu).
 * One compute stream per backend; every op is enqueued on it and returns at once, except the
 * ones that hand a value to the host (to_host, sum, sumsq, sync). Activations are fp32, or bf16
 * with bf16 on (act_size 2; kernels are templates on the storage type). Matmuls go to cuBLAS
 * (fp32, no TF32) or, with bf16 on, to cuBLASLt on bf16 inputs (activations as stored, fp32
 * parameters as the bf16 copy AdamW writes, ops_cuda_w16.cu, or rounded into scratch) with fp32
 * accumulation.
 * Determinism: no atomics. Reductions over rows (bias, norm-weight and embedding gradients,
 * sum/sumsq) use fixed chunkings and fixed reduction trees, so a run repeats bit for bit on the
 * same GPU. Results differ from the CPU backend only by summation order (and expf/tanhf ulps). */
#ifndef UST_CUDA
#define UST_CUDA /* the real declarations of ops_cuda.h, not the stubs */
#endif
#include "cuda_internal.h"
#include "ops_cuda.h"

#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CKB(call)                                                                                  \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                          \
            ust_fatal(UST_EXIT_RUNTIME, "cuBLAS error at %s:%d: %s: status %d", __FILE__,          \
                      __LINE__, #call, (int)st_);                                                  \
    } while (0)

#define EW_THREADS 256 /* elementwise kernels */

/* An elementwise kernel over n items (nothing when n <= 0); ACT_: kernel<float or bf16> by the
 * activations' storage type. */
#define EW_LAUNCH(kernel, n, ...)                                                                  \
    do {                                                                                           \
        if ((n) > 0) {                                                                             \
            kernel<<<grid_for((n), EW_THREADS), EW_THREADS, 0, STREAM(o)>>>(__VA_ARGS__);          \
            CK_LAUNCH();                                                                           \
        }                                                                                          \
    } while (0)
#define ACT_EW_LAUNCH(kernel, n, ...)                                                              \
    do {                                                                                           \
        if ((n) > 0) ACT_LAUNCH(o, kernel, grid_for((n), EW_THREADS), EW_THREADS, 0, __VA_ARGS__); \
    } while (0)
#define RED_BLOCKS 256 /* sum/sumsq: fixed number of partials, summed in order on the host */

void *cuda_scratch(const ust_ops *o, int slot, size_t bytes) {
    cuda_impl *im = CUDA_IMPL(o);
    if (bytes > im->scratch_bytes[slot]) {
        if (im->scratch[slot]) {
            CK(cudaStreamSynchronize(im->stream)); /* work queued before may still read it */
            CK(cudaFree(im->scratch[slot]));
        }
        size_t want = bytes + bytes / 4;
        im->allocations++;
        cudaError_t err = cudaMalloc(&im->scratch[slot], want);
        if (err != cudaSuccess)
            ust_fatal(UST_EXIT_RUNTIME, "CUDA out of memory allocating %zu bytes of scratch: %s",
                      want, cudaGetErrorString(err));
        im->scratch_bytes[slot] = want;
    }
    return im->scratch[slot];
}

/* ---------------------------------------------------------------- memory */

static void *cu_alloc(const ust_ops *o, size_t bytes) {
    void *p = NULL;
    size_t n = bytes ? (bytes + 255) / 256 * 256 : 256; /* cudaMalloc aligns to 256 >= 64 */
    CUDA_IMPL(o)->allocations++;
    cudaError_t err = cudaMalloc(&p, n);
    if (err != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaGetLastError();
        cudaMemGetInfo(&fr, &tot);
        ust_fatal(
            UST_EXIT_RUNTIME,
            "CUDA out of memory allocating %zu bytes on device %d (%zu of %zu bytes free): %s",
            bytes, CUDA_IMPL(o)->device, fr, tot, cudaGetErrorString(err));
    }
    CK(cudaMemsetAsync(p, 0, n, STREAM(o)));
    return p;
}

static void cu_free(const ust_ops *o, void *p) {
    if (!p) return;
    CK(cudaStreamSynchronize(STREAM(o))); /* work queued before may still use p */
    CK(cudaFree(p));
    cuda_w16_drop(o); /* the bf16 weight copy may be of memory in p */
}

/* Page-locked host memory: device-to-host copies into it run at the link's full speed. */
static void *cu_host_alloc(const ust_ops *o, size_t bytes) {
    (void)o;
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: the caller falls back to pageable memory */
        return NULL;
    }
    memset(p, 0, bytes ? bytes : 1);
    return p;
}

static void cu_host_free(const ust_ops *o, void *p) {
    if (!p) return;
    CK(cudaStreamSynchronize(STREAM(o))); /* a copy queued into it may still run */
    CK(cudaFreeHost(p));
}

/* From pageable host memory the copy has read host_src when the call returns. */
static void cu_to_device(const ust_ops *o, void *dst, const void *host_src, size_t bytes) {
    if (bytes) CK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, STREAM(o)));
    cuda_w16_cut(o, dst, bytes);
}

static void cu_to_host(const ust_ops *o, void *host_dst, const void *src, size_t bytes) {
    if (bytes) CK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, STREAM(o)));
    CK(cudaStreamSynchronize(STREAM(o)));
}

static void cu_copy(const ust_ops *o, void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src)
        CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, STREAM(o)));
    cuda_w16_cut(o, dst, bytes);
}

static void cu_copy2d(const ust_ops *o, void *dst, size_t dpitch, const void *src, size_t spitch,
                      size_t width, size_t rows) {
    if (width && rows) {
        CK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice,
                             STREAM(o)));
        cuda_w16_cut(o, dst, dpitch * (rows - 1) + width);
    }
}

static void cu_zero(const ust_ops *o, void *p, size_t bytes) {
    if (bytes) CK(cudaMemsetAsync(p, 0, bytes, STREAM(o)));
    cuda_w16_cut(o, p, bytes);
}

static void cu_sync(const ust_ops *o) { CK(cudaStreamSynchronize(STREAM(o))); }

/* ---------------------------------------------------------------- elementwise kernels */

template <typename T> __global__ void k_add(act *out_, const act *a_, const act *b_, int64_t n) {
    T *out = (T *)out_;
    const T *a = (const T *)a_, *b = (const T *)b_;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        st_act(out, i, ld_act(a, i) + ld_act(b, i));
}

__global__ void k_axpy(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += a * x[i];
}

/* Four floats per load and four bf16 per store when both pointers allow it (arena buffers are
 * 64-byte aligned; GEMM inputs at offsets may not be), the rest one by one. */
__global__ void k_to_bf16(__nv_bfloat16 *dst, const float *src, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int64_t n4 = (uintptr_t)src % 16 == 0 && (uintptr_t)dst % 8 == 0 ? n / 4 : 0;
    for (int64_t i = first; i < n4; i += stride) {
        float4 v = ((const float4 *)src)[i];
        ((uint2 *)dst)[i] = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
    }
    for (int64_t i = 4 * n4 + first; i < n; i += stride) dst[i] = __float2bfloat16_rn(src[i]);
}

/* ---------------------------------------------------------------- matmul */

/* Row-major C = A B is column-major C^T = B^T A^T: cuBLAS gets (B, A) in that order with the
 * row-major leading dimensions, m = N, n = M. The CPU backend's lda/ldb are the same numbers. */

/* Largest power of two (<= 256) dividing the address and the batch stride, for cuBLASLt. */
static uint32_t align_of(const void *p, int64_t stride_bytes) {
    uint64_t a = (uint64_t)(uintptr_t)p | (uint64_t)(stride_bytes > 0 ? stride_bytes : 0) | 256;
    return (uint32_t)(a & (~a + 1));
}

static size_t type_bytes(cudaDataType t) { return t == CUDA_R_16BF ? 2 : 4; }

static bf16 *to_bf16(const ust_ops *o, int slot, const float *src, int64_t n);
static const bf16 *weight16(const ust_ops *o, int slot, const float *w, int64_t n);

/* cuBLASLt's descriptor, layouts and chosen algorithm per problem, built once: creating them and
 * asking the heuristic costs more host time than a small GEMM runs (a GPT-2 step makes ~150
 * GEMM calls of ~20 problems). A problem is everything the descriptor, layouts and algorithm
 * depend on, alignments included; the bias and GELU aux pointers change per call and are set on
 * the cached descriptor just before cublasLtMatmul, which reads it when called. Full: the
 * oldest entry is replaced. */
typedef struct {
    int32_t ct, M, N, K, tA, tB, batch, epi, bias;
    uint32_t alA, alB, alC;
    int64_t lda, ldb, ldc, sA, sB, sC;
} lt_key;

typedef struct {
    lt_key key;
    int ok; /* 1: the heuristic found an algorithm; 0: none (the caller falls back) */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t lb, la, lc; /* lb describes B (cuBLAS's "A") */
    cublasLtMatmulAlgo_t algo;
} lt_entry;

#define LT_CACHE 64
struct lt_cache {
    lt_entry e[LT_CACHE];
    int n, next;
};

static void lt_entry_free(lt_entry *e) {
    if (e->lc) cublasLtMatrixLayoutDestroy(e->lc);
    if (e->la) cublasLtMatrixLayoutDestroy(e->la);
    if (e->lb) cublasLtMatrixLayoutDestroy(e->lb);
    if (e->op) cublasLtMatmulDescDestroy(e->op);
    memset(e, 0, sizeof *e);
}

void cuda_lt_cache_free(cuda_impl *im) {
    if (!im->ltc) return;
    for (int i = 0; i < im->ltc->n; i++) lt_entry_free(&im->ltc->e[i]);
    free(im->ltc);
    im->ltc = NULL;
}

#define LT(call)                                                                                   \
    if ((call) != CUBLAS_STATUS_SUCCESS) return -1
/* e's descriptor (transposes, epilogue, bias type) and its three layouts from its key. */
static int lt_describe(lt_entry *e) {
    const lt_key *k = &e->key;
    cublasOperation_t opB = k->tB ? CUBLAS_OP_T : CUBLAS_OP_N,
                      opA = k->tA ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT(cublasLtMatmulDescCreate(&e->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &opB, sizeof opB));
    LT(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &opA, sizeof opA));
    if (k->epi != CUBLASLT_EPILOGUE_DEFAULT) {
        cublasLtEpilogue_t epi = (cublasLtEpilogue_t)k->epi;
        LT(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        if (k->bias) { /* of D's type: rounded to bf16 for a bf16 output */
            int32_t bt = k->ct;
            LT(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                              sizeof bt));
        }
    }
    LT(cublasLtMatrixLayoutCreate(&e->lb, CUDA_R_16BF, k->tB ? k->K : k->N, k->tB ? k->N : k->K,
                                  k->ldb));
    LT(cublasLtMatrixLayoutCreate(&e->la, CUDA_R_16BF, k->tA ? k->M : k->K, k->tA ? k->K : k->M,
                                  k->lda));
    LT(cublasLtMatrixLayoutCreate(&e->lc, (cudaDataType)k->ct, k->N, k->M, k->ldc));
    if (k->batch > 1) { /* the three layouts' batch count and stride */
        cublasLtMatrixLayout_t lay[3] = {e->lb, e->la, e->lc};
        int64_t stride[3] = {k->sB, k->sA, k->sC};
        int32_t bc = k->batch;
        for (int i = 0; i < 3; i++) {
            LT(cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc,
                                                sizeof bc));
            LT(cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &stride[i], sizeof stride[i]));
        }
    }
    return 0;
}

/* The heuristic's first algorithm for e under the workspace and the key's alignments: 0, or -1
 * when there is none. */
static int lt_choose(cuda_impl *im, lt_entry *e) {
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    uint64_t ws = im->lt_ws_bytes;
    int nres = 0, rc = -1;
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return -1;
    const cublasLtMatmulPreferenceAttributes_t al_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const uint32_t al[4] = {e->key.alB, e->key.alA, e->key.alC, e->key.alC};
    int ok = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof ws) == CUBLAS_STATUS_SUCCESS;
    for (int i = 0; i < 4 && ok; i++)
        ok = cublasLtMatmulPreferenceSetAttribute(pref, al_attr[i], &al[i], sizeof al[i]) ==
             CUBLAS_STATUS_SUCCESS;
    if (ok &&
        cublasLtMatmulAlgoGetHeuristic(im->lt, e->op, e->lb, e->la, e->lc, e->lc, pref, 1, &res,
                                       &nres) == CUBLAS_STATUS_SUCCESS &&
        nres >= 1) {
        e->algo = res.algo;
        rc = 0;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    return rc;
}

/* The cache's entry for key k, built on a miss. */
static lt_entry *lt_lookup(cuda_impl *im, const lt_key *k) {
    if (!im->ltc) {
        im->ltc = (lt_cache *)calloc(1, sizeof(lt_cache));
        UST_ASSERT(im->ltc, "out of memory for the cuBLASLt cache");
    }
    lt_cache *c = im->ltc;
    for (int i = 0; i < c->n; i++)
        if (memcmp(&c->e[i].key, k, sizeof *k) == 0) return &c->e[i];
    int slot = c->n < LT_CACHE ? c->n++ : c->next; /* full: the oldest is replaced */
    if (slot == c->next && c->n == LT_CACHE) c->next = (c->next + 1) % LT_CACHE;
    lt_entry *e = &c->e[slot];
    lt_entry_free(e);
    e->key = *k;
    e->ok = lt_describe(e) == 0 && lt_choose(im, e) == 0;
    return e;
}

/* bf16 inputs, C of type ct (fp32, or bf16 for activations: read widened when beta != 0, the
 * result rounded once), CUBLAS_COMPUTE_32F through cuBLASLt, with an optional epilogue: bias
 * (N fp32, one per column of the row-major C; rounded to bf16 in scratch slot C for a bf16 C:
 * cuBLASLt takes a bias of D's type only, outside IMMA and fp8 kernels) added, and with gelu_pre
 * the result stored there (ldc, type ct: the pre-activation) and gelu of it in C; with dgelu
 * instead (no bias) gelu_pre is read: C = the product times gelu'(gelu_pre), the GELU's backward.
 * Returns 0, or -1 when cuBLASLt has no algorithm for the problem (nothing ran: the caller takes
 * another path). */
static int lt_gemm(const ust_ops *o, void *C, cudaDataType ct, int64_t ldc, int64_t sC,
                   const bf16 *A, int64_t lda, int64_t sA, const bf16 *B, int64_t ldb, int64_t sB,
                   int M, int N, int K, int tA, int tB, float alpha, float beta, int batch,
                   const float *bias, void *gelu_pre, int dgelu) {
    cuda_impl *im = CUDA_IMPL(o);
    lt_key k;
    memset(&k, 0, sizeof k); /* the padding too: keys compare with memcmp */
    k.ct = ct, k.M = M, k.N = N, k.K = K, k.tA = tA, k.tB = tB, k.batch = batch;
    k.lda = lda, k.ldb = ldb, k.ldc = ldc, k.sA = sA, k.sB = sB, k.sC = sC, k.bias = bias != NULL;
    k.epi = !gelu_pre ? (bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT)
            : dgelu   ? CUBLASLT_EPILOGUE_DGELU
            : bias    ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                      : CUBLASLT_EPILOGUE_GELU_AUX;
    k.alB = align_of(B, sB * 2), k.alA = align_of(A, sA * 2);
    k.alC = align_of(C, sC * (int64_t)type_bytes(ct));
    lt_entry *e = lt_lookup(im, &k);
    if (!e->ok) return -1;
    if (bias) { /* cuBLASLt's D is C transposed: its rows are our columns */
        const void *bp = ct == CUDA_R_16BF ? (const void *)weight16(o, SCR_C, bias, N) : bias;
        LT(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp,
                                          sizeof bp));
    }
    if (gelu_pre) { /* the aux buffer has D's type (the attribute's default) */
        int64_t ld = ldc;
        LT(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                          &gelu_pre, sizeof gelu_pre));
        LT(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                          sizeof ld));
    }
    LT(cublasLtMatmul(im->lt, e->op, &alpha, B, e->lb, A, e->la, &beta, C, e->lc, C, e->lc,
                      &e->algo, im->lt_ws, im->lt_ws_bytes, im->stream));
    return 0;
}
#undef LT

/* C = beta C over an (M,N) block at leading dimension ldc: a GEMM with an empty sum (K = 0). */
template <typename T> __global__ void k_scale_rows(act *C_, int64_t ldc, int M, int N, float beta) {
    T *C = (T *)C_;
    int64_t n = (int64_t)M * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = i / N * ldc + i % N;
        st_act(C, c, beta == 0.0f ? 0.0f : ld_act(C, c) * beta);
    }
}

static void scale_rows(const ust_ops *o, void *C, cudaDataType ct, int64_t ldc, int M, int N,
                       float beta) {
    int64_t n = (int64_t)M * N;
    if (ct == CUDA_R_16BF)
        k_scale_rows<bf16>
            <<<grid_for(n, EW_THREADS), EW_THREADS, 0, STREAM(o)>>>(C, ldc, M, N, beta);
    else
        k_scale_rows<float>
            <<<grid_for(n, EW_THREADS), EW_THREADS, 0, STREAM(o)>>>(C, ldc, M, N, beta);
    CK_LAUNCH();
}

/* Elements spanned by `batch` (rows x cols) matrices at leading dimension ld and batch stride s. */
static int64_t span_of(int batch, int64_t s, int rows, int cols, int64_t ld) {
    return (int64_t)(batch - 1) * s + (int64_t)(rows - 1) * ld + cols;
}

void cuda_round_bf16(const ust_ops *o, bf16 *dst, const float *src, int64_t n) {
    if (n <= 0) return;
    k_to_bf16<<<grid_for(n, EW_THREADS), EW_THREADS, 0, STREAM(o)>>>(dst, src, n);
    CK_LAUNCH();
}

/* n floats of src rounded to bf16 into scratch slot `slot`. */
static bf16 *to_bf16(const ust_ops *o, int slot, const float *src, int64_t n) {
    bf16 *dst = (bf16 *)cuda_scratch(o, slot, (size_t)n * 2);
    cuda_round_bf16(o, dst, src, n);
    return dst;
}

/* n fp32 weights (or any GEMM input) at w as bf16: the copy AdamW wrote when it is still valid
 * (ops_cuda_w16.cu: once per step instead of before every use), else rounded into `slot`. */
static const bf16 *weight16(const ust_ops *o, int slot, const float *w, int64_t n) {
    const bf16 *c = cuda_w16_find(o, w, n);
    return c ? c : to_bf16(o, slot, w, n);
}

/* A cuBLASLt epilogue that finds no algorithm costs a separate pass: said once per process. */
static void lt_fallback_note(const char *what) {
    static int said;
    if (said++) return;
    fprintf(stderr,
            "ustrain: note: cuBLASLt has no algorithm for the fused %s here: the bias and GELU run "
            "as separate kernels (slower, same results)\n",
            what);
}

/* The GEMM of bf16 inputs with C of type ct: cuBLASLt, with the bias epilogue when asked, else
 * cublasGemmStridedBatchedEx (bf16 C included). Returns 1 when the bias was added. */
static int gemm16(const ust_ops *o, void *C, cudaDataType ct, int64_t ldc, int64_t sC,
                  const bf16 *a16, int64_t lda, int64_t sA, const bf16 *b16, int64_t ldb,
                  int64_t sB, int M, int N, int K, int tA, int tB, float alpha, float beta,
                  int batch, const float *bias) {
    cuda_impl *im = CUDA_IMPL(o);
    cublasOperation_t opA = tA ? CUBLAS_OP_T : CUBLAS_OP_N, opB = tB ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (lt_gemm(o, C, ct, ldc, sC, a16, lda, sA, b16, ldb, sB, M, N, K, tA, tB, alpha, beta, batch,
                bias, NULL, 0) == 0)
        return bias != NULL;
    if (bias && lt_gemm(o, C, ct, ldc, sC, a16, lda, sA, b16, ldb, sB, M, N, K, tA, tB, alpha, beta,
                        batch, NULL, NULL, 0) == 0) {
        lt_fallback_note("bias epilogue");
        return 0; /* cuBLASLt runs the GEMM, only not with this epilogue */
    }
    CKB(cublasGemmStridedBatchedEx(im->blas, opB, opA, N, M, K, &alpha, b16, CUDA_R_16BF, (int)ldb,
                                   sB, a16, CUDA_R_16BF, (int)lda, sA, &beta, C, ct, (int)ldc, sC,
                                   batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

void cuda_gemm(const ust_ops *o, float *C, int64_t ldc, int64_t sC, const float *A, int64_t lda,
               int64_t sA, const float *B, int64_t ldb, int64_t sB, int M, int N, int K, int tA,
               int tB, float alpha, float beta, int batch) {
    cuda_impl *im = CUDA_IMPL(o);
    if (M <= 0 || N <= 0 || batch <= 0) return;
    cublasOperation_t opA = tA ? CUBLAS_OP_T : CUBLAS_OP_N, opB = tB ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (K <= 0) { /* empty sum: C = beta C (BLAS rejects lda = 0) */
        for (int i = 0; i < batch; i++) scale_rows(o, C + i * sC, CUDA_R_32F, ldc, M, N, beta);
        return;
    }
    UST_ASSERT(lda < INT32_MAX && ldb < INT32_MAX && ldc < INT32_MAX,
               "leading dimension too large");
    cuda_w16_cut(o, C, (size_t)span_of(batch, sC, M, N, ldc) * sizeof(float));
    if (o->act_size != 2) { /* fp32 mode */
        if (batch == 1)
            CKB(cublasSgemm(im->blas, opB, opA, N, M, K, &alpha, B, (int)ldb, A, (int)lda, &beta, C,
                            (int)ldc));
        else
            CKB(cublasSgemmStridedBatched(im->blas, opB, opA, N, M, K, &alpha, B, (int)ldb, sB, A,
                                          (int)lda, sA, &beta, C, (int)ldc, sC, batch));
        return;
    }
    /* bf16: both inputs (everything their strided layouts span) rounded into scratch */
    const bf16 *a16 = weight16(o, SCR_A, A, span_of(batch, sA, tA ? K : M, tA ? M : K, lda));
    const bf16 *b16 = weight16(o, SCR_B, B, span_of(batch, sB, tB ? N : K, tB ? K : N, ldb));
    gemm16(o, C, CUDA_R_32F, ldc, sC, a16, lda, sA, b16, ldb, sB, M, N, K, tA, tB, alpha, beta,
           batch, NULL);
}

/* C[M,N] = alpha op(A) op(B) + beta C for `batch` dense row-major problems at element strides. */
static void gemm(const ust_ops *o, float *C, const float *A, const float *B, int M, int N, int K,
                 int tA, int tB, float alpha, float beta, int batch, int64_t sA, int64_t sB,
                 int64_t sC) {
    cuda_gemm(o, C, N, sC, A, tA ? M : K, sA, B, tB ? K : N, sB, M, N, K, tA, tB, alpha, beta,
              batch);
}

static void cu_matmul(const ust_ops *o, float *C, const float *A, const float *B, int M, int N,
                      int K, int tA, int tB, float alpha, float beta) {
    gemm(o, C, A, B, M, N, K, tA, tB, alpha, beta, 1, 0, 0, 0);
}

static void cu_matmul_batched(const ust_ops *o, float *C, const float *A, const float *B, int M,
                              int N, int K, int tA, int tB, float alpha, float beta, int batch,
                              int64_t strideA, int64_t strideB, int64_t strideC) {
    gemm(o, C, A, B, M, N, K, tA, tB, alpha, beta, batch, strideA, strideB, strideC);
}

/* The Gram matrix as a full matmul of A with itself: the bf16 products of Newton-Schulz under
 * bf16 stay those of cuda_gemm, and C comes out whole without a mirror kernel. */
static void cu_syrk(const ust_ops *o, float *C, const float *A, int N, int K, int tA, float alpha,
                    float beta) {
    gemm(o, C, A, A, N, N, K, tA, !tA, alpha, beta, 1, 0, 0, 0);
}

/* ---------------------------------------------------------------- column reductions */

/* Sums over the N rows of (N,C) quantities, deterministic: stage 1 gives each block 32 columns
 * and one chunk of rows (threads stride the rows, then a fixed tree over threadIdx.y), writing
 * double partials (R,2,C); stage 2 adds the R partials in order into the outputs (+=).
 * MODE_BIAS: dout. MODE_LN: dout * xn and dout. MODE_RMS: dout * x * rstd. */
enum { MODE_BIAS = 0, MODE_LN = 1, MODE_RMS = 2 };
#define CR_X 32
#define CR_Y 8

template <int MODE, typename T>
__global__ void k_colred_partial(double *part, const act *dout_, const act *inp_, const float *mean,
                                 const float *rstd, int N, int C, int rows_per) {
    const T *dout = (const T *)dout_, *inp = (const T *)inp_;
    __shared__ double s0[CR_Y][CR_X], s1[CR_Y][CR_X];
    int c = blockIdx.x * CR_X + threadIdx.x;
    int r0 = blockIdx.y * rows_per, r1 = min(N, r0 + rows_per);
    double a0 = 0.0, a1 = 0.0;
    if (c < C) {
        for (int n = r0 + threadIdx.y; n < r1; n += CR_Y) {
            int64_t off = (int64_t)n * C + c;
            float dy = ld_act(dout, off);
            if (MODE == MODE_BIAS) {
                a0 += dy;
            } else if (MODE == MODE_LN) {
                float xn = (ld_act(inp, off) - mean[n]) * rstd[n];
                a0 += (double)dy * xn;
                a1 += dy;
            } else {
                a0 += (double)dy * (ld_act(inp, off) * rstd[n]);
            }
        }
    }
    s0[threadIdx.y][threadIdx.x] = a0;
    s1[threadIdx.y][threadIdx.x] = a1;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        double t0 = 0.0, t1 = 0.0;
        for (int y = 0; y < CR_Y; y++) {
            t0 += s0[y][threadIdx.x];
            t1 += s1[y][threadIdx.x];
        }
        part[((int64_t)blockIdx.y * 2 + 0) * C + c] = t0;
        part[((int64_t)blockIdx.y * 2 + 1) * C + c] = t1;
    }
}

__global__ void k_colred_final(float *dst0, float *dst1, const double *part, int R, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double t0 = 0.0, t1 = 0.0;
    for (int r = 0; r < R; r++) {
        t0 += part[((int64_t)r * 2 + 0) * C + c];
        t1 += part[((int64_t)r * 2 + 1) * C + c];
    }
    if (dst0) dst0[c] += (float)t0;
    if (dst1) dst1[c] += (float)t1;
}

template <typename T>
static void colred_partial(const ust_ops *o, int mode, dim3 grid, dim3 block, double *part,
                           const act *dout, const act *inp, const float *mean, const float *rstd,
                           int N, int C, int rows_per) {
    cudaStream_t s = STREAM(o);
    if (mode == MODE_BIAS)
        k_colred_partial<MODE_BIAS, T>
            <<<grid, block, 0, s>>>(part, dout, inp, mean, rstd, N, C, rows_per);
    else if (mode == MODE_LN)
        k_colred_partial<MODE_LN, T>
            <<<grid, block, 0, s>>>(part, dout, inp, mean, rstd, N, C, rows_per);
    else
        k_colred_partial<MODE_RMS, T>
            <<<grid, block, 0, s>>>(part, dout, inp, mean, rstd, N, C, rows_per);
    CK_LAUNCH();
}

/* dst0 (+ dst1 for MODE_LN) += column sums (dout and inp are activations); R depends on N only,
 * so results do not depend on the device. */
static void colred(const ust_ops *o, int mode, float *dst0, float *dst1, const act *dout,
                   const act *inp, const float *mean, const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0 || (!dst0 && !dst1)) return;
    cudaStream_t s = STREAM(o);
    int rows_per = 128, R = (N + rows_per - 1) / rows_per;
    if (R > 256) {
        R = 256;
        rows_per = (N + R - 1) / R;
        R = (N + rows_per - 1) / rows_per;
    }
    double *part = (double *)cuda_scratch(o, SCR_C, (size_t)R * 2 * C * sizeof(double));
    dim3 grid((C + CR_X - 1) / CR_X, R), block(CR_X, CR_Y);
    if (o->act_size == 2)
        colred_partial<bf16>(o, mode, grid, block, part, dout, inp, mean, rstd, N, C, rows_per);
    else
        colred_partial<float>(o, mode, grid, block, part, dout, inp, mean, rstd, N, C, rows_per);
    k_colred_final<<<(C + 255) / 256, 256, 0, s>>>(dst0, dst1, part, R, C);
    CK_LAUNCH();
}

/* ---------------------------------------------------------------- linear */

template <typename T> __global__ void k_bias_add(act *out_, const float *bias, int64_t N, int OC) {
    T *out = (T *)out_;
    int64_t n = N * OC;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        st_act(out, i, ld_act(out, i) + bias[i % OC]);
}

/* C(M,N) (leading dimension ldc, type ct) = alpha op(A) op(B) + beta C (+ bias[j] when bias, then
 * beta must be 0), batch 1, for the linears under bf16: A and B are bf16 activations, or weights
 * rounded into scratch by the caller. */
static void gemm_act16(const ust_ops *o, void *C, cudaDataType ct, int64_t ldc, const bf16 *A,
                       int64_t lda, const bf16 *B, int64_t ldb, int M, int N, int K, int tA, int tB,
                       float beta, const float *bias) {
    if (M <= 0 || N <= 0) return;
    int added = 0;
    if (K <= 0)
        scale_rows(o, C, ct, ldc, M, N, beta);
    else
        added =
            gemm16(o, C, ct, ldc, 0, A, lda, 0, B, ldb, 0, M, N, K, tA, tB, 1.0f, beta, 1, bias);
    if (bias && !added) { /* only activations (bf16 C) get a bias */
        int64_t n = (int64_t)M * N;
        k_bias_add<bf16><<<grid_for(n, EW_THREADS), EW_THREADS, 0, STREAM(o)>>>(C, bias, M, N);
        CK_LAUNCH();
    }
}

/* out(N,OC) = inp(N,C) @ w(OC,C)^T + bias(OC): under bf16 inp goes to the GEMM as it is stored,
 * w is rounded, out is written as bf16 with the bias in the GEMM's epilogue. */
static void cu_linear_fwd(const ust_ops *o, act *out, const act *inp, const float *w,
                          const float *bias, int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (o->act_size == 2) {
        const bf16 *w16 = weight16(o, SCR_B, w, (int64_t)OC * C);
        gemm_act16(o, out, CUDA_R_16BF, OC, (const bf16 *)inp, C, w16, C, N, OC, C, 0, 1, 0.0f,
                   bias);
        return;
    }
    cuda_gemm(o, (float *)out, OC, 0, (const float *)inp, C, 0, w, C, 0, N, OC, C, 0, 1, 1.0f, 0.0f,
              1);
    if (!bias) return;
    int64_t n = (int64_t)N * OC;
    k_bias_add<float><<<grid_for(n, EW_THREADS), EW_THREADS, 0, STREAM(o)>>>(out, bias, N, OC);
    CK_LAUNCH();
}

/* dinp(N,C) = dout @ w (+= when acc_dinp); dw(OC,C) += dout^T @ inp; dbias += column sums. Under
 * bf16 dout and inp go to the GEMMs as stored, dinp is a bf16 D (beta 1 on a bf16 C when
 * accumulating) and dw stays an fp32 C/D. */
static void cu_linear_bwd(const ust_ops *o, act *dinp, float *dw, float *dbias, const act *dout,
                          const act *inp, const float *w, int N, int C, int OC, int acc_dinp) {
    float beta = acc_dinp ? 1.0f : 0.0f;
    if (o->act_size == 2) {
        const bf16 *d16 = (const bf16 *)dout;
        if (dinp && N > 0 && C > 0)
            gemm_act16(o, dinp, CUDA_R_16BF, C, d16, OC, weight16(o, SCR_B, w, (int64_t)OC * C), C,
                       N, C, OC, 0, 0, beta, NULL);
        if (dw)
            gemm_act16(o, dw, CUDA_R_32F, C, d16, OC, (const bf16 *)inp, C, OC, C, N, 1, 0, 1.0f,
                       NULL);
    } else {
        const float *d32 = (const float *)dout;
        if (dinp)
            cuda_gemm(o, (float *)dinp, C, 0, d32, OC, 0, w, C, 0, N, C, OC, 0, 0, 1.0f, beta, 1);
        if (dw)
            cuda_gemm(o, dw, C, 0, d32, OC, 0, (const float *)inp, C, 0, OC, C, N, 1, 0, 1.0f, 1.0f,
                      1);
    }
    if (dbias) colred(o, MODE_BIAS, dbias, NULL, dout, NULL, NULL, NULL, N, OC);
}

/* ---------------------------------------------------------------- embedding */

template <typename T>
__global__ void k_embedding_fwd(act *out_, const int32_t *tok, const int32_t *pos, const float *wte,
                                const float *wpe, int Tn, int C, int v_start, int v_end,
                                int64_t n) {
    T *out = (T *)out_;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / C;
        int c = (int)(i % C), t = (int)(r % Tn), id = tok[r];
        float x =
            (wte && id >= v_start && id < v_end) ? wte[(int64_t)(id - v_start) * C + c] : 0.0f;
        if (wpe) x += wpe[(int64_t)(pos ? pos[r] : t) * C + c];
        st_act(out, i, x);
    }
}

static void cu_embedding_fwd(const ust_ops *o, act *out, const int32_t *tok, const int32_t *pos,
                             const float *wte, const float *wpe, int B, int T, int C, int v_start,
                             int v_end) {
    int64_t n = (int64_t)B * T * C;
    ACT_EW_LAUNCH(k_embedding_fwd, n, out, tok, pos, wte, wpe, T, C, v_start, v_end, n);
}

/* Row index of source row r in the destination table, or -1 (skipped). */
__device__ __forceinline__ int emb_dst_row(int wpe_mode, const int32_t *tok, const int32_t *pos,
                                           int64_t r, int T, int v_start, int v_end) {
    if (wpe_mode) {
        int t = (int)(r % T);
        return pos ? pos[r] : t;
    }
    int id = tok[r];
    return (id >= v_start && id < v_end) ? id - v_start : -1;
}

/* The backward sorts the source rows by destination row, then one warp per run of equal
 * destinations adds the run's rows in row order: every destination row gets the same float
 * additions in the same order as the CPU backend's walk over all rows, with no atomics and
 * parallel over the distinct tokens (a one-warp-per-32-columns walk over all rows left 24 warps
 * busy for 8192 serial rows on GPT-2). Keys are dst << 32 | row, so equal destinations sort by
 * row; skipped rows and the padding up to a power of two get EMB_NONE and sort last. The sort
 * is bitonic: tiles of EMB_TILE keys in shared memory, with global passes for the strides the
 * tiles do not cover. */
#define EMB_TILE 2048
#define EMB_NONE UINT64_MAX

__global__ void k_emb_keys(uint64_t *keys, const int32_t *tok, const int32_t *pos, int wpe_mode,
                           int64_t rows, int64_t n, int Tn, int v_start, int v_end) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int d = i < rows ? emb_dst_row(wpe_mode, tok, pos, i, Tn, v_start, v_end) : -1;
        keys[i] = d >= 0 ? ((uint64_t)d << 32) | (uint64_t)i : EMB_NONE;
    }
}

/* keys[i] and keys[i + j] in the order of the bitonic sequence of size k holding i */
__device__ __forceinline__ void emb_cas(uint64_t *a, uint64_t *b, int64_t gi, int64_t k) {
    uint64_t x = *a, y = *b;
    if ((x > y) == ((gi & k) == 0)) *a = y, *b = x;
}

/* One global pass (stride j >= EMB_TILE) of the merge of size k: a thread per pair. */
__global__ void k_emb_sort_pass(uint64_t *keys, int64_t n, int64_t j, int64_t k) {
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < n / 2;
         t += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = 2 * t - (t & (j - 1));
        emb_cas(&keys[i], &keys[i + j], i, k);
    }
}

/* Each block: one tile of `tile` keys (blockDim.x = tile / 2) in shared memory, the merges of
 * sizes k0..k1 (powers of two) over it with strides below min(k, tile). k0 = 2, k1 = tile sorts
 * the tile; k0 = k1 = k > tile finishes the global merge of size k. */
__global__ void k_emb_sort_tile(uint64_t *keys, int tile, int64_t k0, int64_t k1) {
    __shared__ uint64_t sh[EMB_TILE];
    int64_t base = (int64_t)blockIdx.x * tile;
    for (int i = threadIdx.x; i < tile; i += blockDim.x) sh[i] = keys[base + i];
    __syncthreads();
    for (int64_t k = k0; k <= k1; k <<= 1) {
        for (int j = (int)(k < tile ? k : tile) / 2; j > 0; j >>= 1) {
            int t = threadIdx.x, i = 2 * t - (t & (j - 1));
            emb_cas(&sh[i], &sh[i + j], base + i, k);
            __syncthreads();
        }
    }
    for (int i = threadIdx.x; i < tile; i += blockDim.x) keys[base + i] = sh[i];
}

/* One warp per sorted position that begins a run: dst[row] += the run's source rows, in order. */
template <typename T>
__global__ void k_emb_reduce(float *dst, const act *dout_, const uint64_t *keys, int64_t n, int C) {
    const T *dout = (const T *)dout_;
    int lane = threadIdx.x & 31;
    for (int64_t p = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; p < n;
         p += ((int64_t)gridDim.x * blockDim.x) >> 5) {
        uint64_t key = keys[p];
        if (key == EMB_NONE || (p > 0 && (keys[p - 1] >> 32) == (key >> 32))) continue;
        int64_t d = (int64_t)(key >> 32) * C;
        for (int c = lane; c < C; c += 32) {
            float acc = dst[d + c];
            for (int64_t q = p; q < n && (keys[q] >> 32) == (key >> 32); q++)
                acc += ld_act(dout, (int64_t)(uint32_t)keys[q] * C + c);
            dst[d + c] = acc;
        }
    }
}

/* keys[0..n) (n a power of two >= 2) sorted ascending, on the backend's stream. */
static void emb_sort(const ust_ops *o, uint64_t *keys, int64_t n) {
    int tile = n < EMB_TILE ? (int)n : EMB_TILE, tiles = (int)(n / tile);
    k_emb_sort_tile<<<tiles, tile / 2, 0, STREAM(o)>>>(keys, tile, 2, tile);
    CK_LAUNCH();
    for (int64_t k = 2 * (int64_t)tile; k <= n; k <<= 1) {
        for (int64_t j = k / 2; j >= tile; j >>= 1) {
            k_emb_sort_pass<<<grid_for(n / 2, EW_THREADS), EW_THREADS, 0, STREAM(o)>>>(keys, n, j,
                                                                                       k);
            CK_LAUNCH();
        }
        k_emb_sort_tile<<<tiles, tile / 2, 0, STREAM(o)>>>(keys, tile, k, k);
        CK_LAUNCH();
    }
}

/* dst[row(r)] += dout[r] over the source rows (wpe_mode: rows by position, else by token). */
static void emb_bwd_table(const ust_ops *o, float *dst, const act *dout, const int32_t *tok,
                          const int32_t *pos, int wpe_mode, int64_t rows, int T, int C, int v_start,
                          int v_end) {
    int64_t n = 2;
    while (n < rows) n <<= 1;
    uint64_t *keys = (uint64_t *)cuda_scratch(o, SCR_C, (size_t)n * sizeof(uint64_t));
    EW_LAUNCH(k_emb_keys, n, keys, tok, pos, wpe_mode, rows, n, T, v_start, v_end);
    emb_sort(o, keys, n);
    ACT_LAUNCH(o, k_emb_reduce, grid_for(n * 32, EW_THREADS), EW_THREADS, 0, dst, dout, keys, n, C);
}

static void cu_embedding_bwd(const ust_ops *o, float *dwte, float *dwpe, const act *dout,
                             const int32_t *tok, const int32_t *pos, int B, int T, int C,
                             int v_start, int v_end) {
    int64_t rows = (int64_t)B * T;
    if (rows <= 0 || C <= 0) return;
    UST_ASSERT(rows < ((int64_t)1 << 31), "embedding backward over %lld rows", (long long)rows);
    if (dwte) emb_bwd_table(o, dwte, dout, tok, pos, 0, rows, T, C, v_start, v_end);
    if (dwpe) emb_bwd_table(o, dwpe, dout, tok, pos, 1, rows, T, C, v_start, v_end);
}

/* ---------------------------------------------------------------- norms */

static int row_threads(int C) { return C >= 2048 ? 512 : C >= 512 ? 256 : 128; }

/* The norms read a row once: a thread keeps its first ROW_REG elements in registers for the
 * later passes (rows up to ROW_REG x 512 threads = 4096) and reads the rest of a longer row
 * again per pass. It owns groups of VW consecutive elements, group g = threadIdx.x + k
 * blockDim.x, elements g VW .. g VW + VW - 1: VW = 16 / sizeof(T) (4 floats, 8 bf16) moves each
 * group in one 16-byte load or store when the rows allow (row_vec), 1 otherwise. An element
 * past the row adds +0.0f to the sums. */
#define ROW_REG 8

/* VW consecutive activations from c (a multiple of VW) into f: 16-byte loads when VW fills them
 * (4 floats, 8 bf16), else one by one; st_vec the other way, rounding once. */
template <int VW> __device__ __forceinline__ void ld_vec(const float *p, int64_t c, float *f) {
#pragma unroll
    for (int j = 0; j < VW; j += 4) {
        if (VW % 4) break;
        float4 q = *(const float4 *)(p + c + j);
        f[j] = q.x, f[j + 1] = q.y, f[j + 2] = q.z, f[j + 3] = q.w;
    }
#pragma unroll
    for (int j = 0; j < VW; j++)
        if (VW % 4) f[j] = p[c + j];
}
template <int VW> __device__ __forceinline__ void ld_vec(const bf16 *p, int64_t c, float *f) {
#pragma unroll
    for (int j = 0; j < VW; j += 8) {
        if (VW % 8) break;
        uint4 q = *(const uint4 *)(p + c + j);
        const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) /* lo half first: memory order */
            f[j + 2 * i] = __uint_as_float(u[i] << 16),
                      f[j + 2 * i + 1] = __uint_as_float(u[i] & 0xFFFF0000u);
    }
#pragma unroll
    for (int j = 0; j < VW; j++)
        if (VW % 8) f[j] = __bfloat162float(p[c + j]);
}
template <int VW> __device__ __forceinline__ void st_vec(float *p, int64_t c, const float *f) {
#pragma unroll
    for (int j = 0; j < VW; j += 4) {
        if (VW % 4) break;
        *(float4 *)(p + c + j) = make_float4(f[j], f[j + 1], f[j + 2], f[j + 3]);
    }
#pragma unroll
    for (int j = 0; j < VW; j++)
        if (VW % 4) p[c + j] = f[j];
}
template <int VW> __device__ __forceinline__ void st_vec(bf16 *p, int64_t c, const float *f) {
#pragma unroll
    for (int j = 0; j < VW; j += 8) {
        if (VW % 8) break;
        *(uint4 *)(p + c + j) =
            make_uint4(pack_bf16x2(f[j], f[j + 1]), pack_bf16x2(f[j + 2], f[j + 3]),
                       pack_bf16x2(f[j + 4], f[j + 5]), pack_bf16x2(f[j + 6], f[j + 7]));
    }
#pragma unroll
    for (int j = 0; j < VW; j++)
        if (VW % 8) p[c + j] = __float2bfloat16_rn(f[j]);
}

/* 16 / act_size when rows of C activations at every pointer given (NULL: none) start 16-byte
 * aligned, so a group of that many moves in one access; else 1. */
static int row_vec(const ust_ops *o, int64_t C, const void *a, const void *b, const void *c) {
    const int vw = 16 / o->act_size;
    const uintptr_t al = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c;
    return C % vw == 0 && al % 16 == 0 ? vw : 1;
}

/* Threads per row of C in groups of VW: row_threads, or for 16-byte groups enough warps that
 * the registers hold the row (up to 512). */
static int row_threads_vec(int64_t C, int vw) {
    if (vw == 1) return row_threads((int)C);
    int64_t t = (C / vw + ROW_REG / vw - 1) / (ROW_REG / vw);
    t = (t + 31) / 32 * 32;
    return t < 32 ? 32 : t > 512 ? 512 : (int)t;
}

/* kernel<T, VW> for the backend's activation type with VW = vw (from row_vec), on its stream. */
#define VEC_LAUNCH(o, kernel, vw, grid, threads, ...)                                              \
    do {                                                                                           \
        const int vw_ = (vw), th_ = (threads);                                                     \
        if ((o)->act_size == 2 && vw_ > 1)                                                         \
            kernel<bf16, 8><<<grid, th_, 0, STREAM(o)>>>(__VA_ARGS__);                             \
        else if ((o)->act_size == 2)                                                               \
            kernel<bf16, 1><<<grid, th_, 0, STREAM(o)>>>(__VA_ARGS__);                             \
        else if (vw_ > 1)                                                                          \
            kernel<float, 4><<<grid, th_, 0, STREAM(o)>>>(__VA_ARGS__);                            \
        else                                                                                       \
            kernel<float, 1><<<grid, th_, 0, STREAM(o)>>>(__VA_ARGS__);                            \
        CK_LAUNCH();                                                                               \
    } while (0)
/* A norm's kernel over N rows of C: one block per row, threads by the vector width. */
#define ROW_LAUNCH(o, kernel, vw, N, C, ...)                                                       \
    do {                                                                                           \
        const int rvw_ = (vw);                                                                     \
        VEC_LAUNCH(o, kernel, rvw_, N, row_threads_vec((C), rvw_), __VA_ARGS__);                   \
    } while (0)

/* The first element of this thread's k-th group. */
#define ROW_GROUP(k) ((threadIdx.x + (k) * (int)blockDim.x) * VW)

/* One block per row. */
template <typename T, int VW>
__global__ void k_layernorm_fwd(act *out_, float *mean, float *rstd, const act *inp_,
                                const float *w, const float *b, int C, float eps) {
    constexpr int R = ROW_REG / VW; /* groups kept in registers */
    __shared__ float sh[32];
    int64_t n = blockIdx.x;
    const T *x = (const T *)inp_ + n * C;
    T *y = (T *)out_ + n * C;
    const int cr = ROW_GROUP(R), step = blockDim.x * VW; /* first element not kept */
    float xr[ROW_REG], t[VW], s = 0.0f;
#pragma unroll
    for (int k = 0; k < R; k++) {
        const int c = ROW_GROUP(k);
        if (c < C) ld_vec<VW>(x, c, xr + k * VW);
#pragma unroll
        for (int j = 0; j < VW; j++) {
            if (c >= C) xr[k * VW + j] = 0.0f;
            s += xr[k * VW + j];
        }
    }
    for (int c = cr; c < C; c += step) {
        ld_vec<VW>(x, c, t);
        for (int j = 0; j < VW; j++) s += t[j];
    }
    float m = block_sum(s, sh) / C;
    float v = 0.0f;
#pragma unroll
    for (int k = 0; k < R; k++)
#pragma unroll
        for (int j = 0; j < VW; j++) {
            float d = xr[k * VW + j] - m;
            if (ROW_GROUP(k) < C) v += d * d;
        }
    for (int c = cr; c < C; c += step) {
        ld_vec<VW>(x, c, t);
        for (int j = 0; j < VW; j++) v += (t[j] - m) * (t[j] - m);
    }
    v = block_sum(v, sh);
    float r = rsqrtf(v / C + eps);
#pragma unroll
    for (int k = 0; k < R; k++) {
        const int c = ROW_GROUP(k);
        if (c >= C) continue;
#pragma unroll
        for (int j = 0; j < VW; j++)
            t[j] = (xr[k * VW + j] - m) * r * w[c + j] + (b ? b[c + j] : 0.0f);
        st_vec<VW>(y, c, t);
    }
    for (int c = cr; c < C; c += step) {
        ld_vec<VW>(x, c, t);
        for (int j = 0; j < VW; j++) t[j] = (t[j] - m) * r * w[c + j] + (b ? b[c + j] : 0.0f);
        st_vec<VW>(y, c, t);
    }
    if (threadIdx.x == 0) {
        if (mean) mean[n] = m;
        if (rstd) rstd[n] = r;
    }
}

/* dinp = rstd (g - mean(g) - xn mean(g xn)), g = w dout, xn = (x - mean) rstd */
template <typename T, int VW>
__global__ void k_layernorm_bwd_dx(act *dinp_, const act *dout_, const act *inp_, const float *w,
                                   const float *mean, const float *rstd, int C) {
    constexpr int R = ROW_REG / VW;
    __shared__ float sh[32];
    int64_t n = blockIdx.x;
    const T *x = (const T *)inp_ + n * C, *dy = (const T *)dout_ + n * C;
    T *dx = (T *)dinp_ + n * C;
    float m = mean[n], r = rstd[n], sg = 0.0f, sgx = 0.0f, gr[ROW_REG], xnr[ROW_REG];
    float t[VW], u[VW];
    const int cr = ROW_GROUP(R), step = blockDim.x * VW;
#pragma unroll
    for (int k = 0; k < R; k++) {
        const int c = ROW_GROUP(k);
        if (c < C) ld_vec<VW>(dy, c, gr + k * VW), ld_vec<VW>(x, c, xnr + k * VW);
#pragma unroll
        for (int j = 0; j < VW; j++) {
            const int i = k * VW + j;
            gr[i] = c < C ? w[c + j] * gr[i] : 0.0f;
            xnr[i] = c < C ? (xnr[i] - m) * r : 0.0f;
            sg += gr[i];
            sgx += gr[i] * xnr[i];
        }
    }
    for (int c = cr; c < C; c += step) {
        ld_vec<VW>(dy, c, t), ld_vec<VW>(x, c, u);
        for (int j = 0; j < VW; j++) {
            float g = w[c + j] * t[j];
            sg += g;
            sgx += g * ((u[j] - m) * r);
        }
    }
    sg = block_sum(sg, sh);
    sgx = block_sum(sgx, sh);
    float mg = sg / C, mgx = sgx / C;
#pragma unroll
    for (int k = 0; k < R; k++) {
        const int c = ROW_GROUP(k);
        if (c >= C) continue;
#pragma unroll
        for (int j = 0; j < VW; j++) t[j] = (gr[k * VW + j] - mg - xnr[k * VW + j] * mgx) * r;
        st_vec<VW>(dx, c, t);
    }
    for (int c = cr; c < C; c += step) {
        ld_vec<VW>(dy, c, t), ld_vec<VW>(x, c, u);
        for (int j = 0; j < VW; j++) t[j] = (w[c + j] * t[j] - mg - (u[j] - m) * r * mgx) * r;
        st_vec<VW>(dx, c, t);
    }
}

static void cu_layernorm_fwd(const ust_ops *o, act *out, float *mean, float *rstd, const act *inp,
                             const float *w, const float *b, int N, int C, float eps) {
    if (N <= 0) return;
    ROW_LAUNCH(o, k_layernorm_fwd, row_vec(o, C, out, inp, NULL), N, C, out, mean, rstd, inp, w, b,
               C, eps);
}

static void cu_layernorm_bwd(const ust_ops *o, act *dinp, float *dw, float *db, const act *dout,
                             const act *inp, const float *w, const float *mean, const float *rstd,
                             int N, int C) {
    if (N <= 0) return;
    if (dinp)
        ROW_LAUNCH(o, k_layernorm_bwd_dx, row_vec(o, C, dinp, dout, inp), N, C, dinp, dout, inp, w,
                   mean, rstd, C);
    colred(o, MODE_LN, dw, db, dout, inp, mean, rstd, N, C);
}

template <typename T, int VW>
__global__ void k_rmsnorm_fwd(act *out_, float *rstd, const act *inp_, const float *w, int C,
                              float eps) {
    constexpr int R = ROW_REG / VW;
    __shared__ float sh[32];
    int64_t n = blockIdx.x;
    const T *x = (const T *)inp_ + n * C;
    T *y = (T *)out_ + n * C;
    const int cr = ROW_GROUP(R), step = blockDim.x * VW;
    float xr[ROW_REG], t[VW], ss = 0.0f;
#pragma unroll
    for (int k = 0; k < R; k++) {
        const int c = ROW_GROUP(k);
        if (c < C) ld_vec<VW>(x, c, xr + k * VW);
#pragma unroll
        for (int j = 0; j < VW; j++) {
            if (c >= C) xr[k * VW + j] = 0.0f;
            ss += xr[k * VW + j] * xr[k * VW + j];
        }
    }
    for (int c = cr; c < C; c += step) {
        ld_vec<VW>(x, c, t);
        for (int j = 0; j < VW; j++) ss += t[j] * t[j];
    }
    ss = block_sum(ss, sh);
    float r = rsqrtf(ss / C + eps);
#pragma unroll
    for (int k = 0; k < R; k++) {
        const int c = ROW_GROUP(k);
        if (c >= C) continue;
#pragma unroll
        for (int j = 0; j < VW; j++) t[j] = xr[k * VW + j] * r * w[c + j];
        st_vec<VW>(y, c, t);
    }
    for (int c = cr; c < C; c += step) {
        ld_vec<VW>(x, c, t);
        for (int j = 0; j < VW; j++) t[j] = t[j] * r * w[c + j];
        st_vec<VW>(y, c, t);
    }
    if (threadIdx.x == 0 && rstd) rstd[n] = r;
}

/* dinp = rstd (g - x rstd^2 mean(g x)), g = w dout */
template <typename T, int VW>
__global__ void k_rmsnorm_bwd_dx(act *dinp_, const act *dout_, const act *inp_, const float *w,
                                 const float *rstd, int C) {
    constexpr int R = ROW_REG / VW;
    __shared__ float sh[32];
    int64_t n = blockIdx.x;
    const T *x = (const T *)inp_ + n * C, *dy = (const T *)dout_ + n * C;
    T *dx = (T *)dinp_ + n * C;
    float r = rstd[n], sgx = 0.0f, gr[ROW_REG], xr[ROW_REG], t[VW], u[VW];
    const int cr = ROW_GROUP(R), step = blockDim.x * VW;
#pragma unroll
    for (int k = 0; k < R; k++) {
        const int c = ROW_GROUP(k);
        if (c < C) ld_vec<VW>(dy, c, gr + k * VW), ld_vec<VW>(x, c, xr + k * VW);
#pragma unroll
        for (int j = 0; j < VW; j++) {
            const int i = k * VW + j;
            gr[i] = c < C ? w[c + j] * gr[i] : 0.0f;
            xr[i] = c < C ? xr[i] : 0.0f;
            sgx += gr[i] * xr[i];
        }
    }
    for (int c = cr; c < C; c += step) {
        ld_vec<VW>(dy, c, t), ld_vec<VW>(x, c, u);
        for (int j = 0; j < VW; j++) sgx += w[c + j] * t[j] * u[j];
    }
    sgx = block_sum(sgx, sh);
    float kk = sgx / C * r * r;
#pragma unroll
    for (int k = 0; k < R; k++) {
        const int c = ROW_GROUP(k);
        if (c >= C) continue;
#pragma unroll
        for (int j = 0; j < VW; j++) t[j] = (gr[k * VW + j] - xr[k * VW + j] * kk) * r;
        st_vec<VW>(dx, c, t);
    }
    for (int c = cr; c < C; c += step) {
        ld_vec<VW>(dy, c, t), ld_vec<VW>(x, c, u);
        for (int j = 0; j < VW; j++) t[j] = (w[c + j] * t[j] - u[j] * kk) * r;
        st_vec<VW>(dx, c, t);
    }
}

static void cu_rmsnorm_fwd(const ust_ops *o, act *out, float *rstd, const act *inp, const float *w,
                           int N, int C, float eps) {
    if (N <= 0) return;
    ROW_LAUNCH(o, k_rmsnorm_fwd, row_vec(o, C, out, inp, NULL), N, C, out, rstd, inp, w, C, eps);
}

static void cu_rmsnorm_bwd(const ust_ops *o, act *dinp, float *dw, const act *dout, const act *inp,
                           const float *w, const float *rstd, int N, int C) {
    if (N <= 0) return;
    if (dinp)
        ROW_LAUNCH(o, k_rmsnorm_bwd_dx, row_vec(o, C, dinp, dout, inp), N, C, dinp, dout, inp, w,
                   rstd, C);
    colred(o, MODE_RMS, dw, NULL, dout, inp, NULL, rstd, N, C);
}

/* ---------------------------------------------------------------- activations */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

template <typename T> __global__ void k_gelu_fwd(act *out_, const act *inp_, int64_t n) {
    T *out = (T *)out_;
    const T *inp = (const T *)inp_;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float x = ld_act(inp, i);
        st_act(out, i, 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x))));
    }
}

template <typename T>
__global__ void k_gelu_bwd(act *dinp_, const act *inp_, const act *dout_, int64_t n) {
    T *dinp = (T *)dinp_;
    const T *inp = (const T *)inp_, *dout = (const T *)dout_;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float x = ld_act(inp, i);
        float t = tanhf(GELU_K * (x + 0.044715f * x * x * x));
        float sech2 = 1.0f - t * t;
        float g = 0.5f * (1.0f + t) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        st_act(dinp, i, g * ld_act(dout, i));
    }
}

template <typename T>
__global__ void k_swiglu_fwd(act *out_, const act *gate_, const act *up_, int64_t n) {
    T *out = (T *)out_;
    const T *gate = (const T *)gate_, *up = (const T *)up_;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float g = ld_act(gate, i);
        st_act(out, i, g / (1.0f + expf(-g)) * ld_act(up, i));
    }
}

template <typename T>
__global__ void k_swiglu_bwd(act *dgate_, act *dup_, const act *dout_, const act *gate_,
                             const act *up_, int64_t n) {
    T *dgate = (T *)dgate_, *dup = (T *)dup_;
    const T *dout = (const T *)dout_, *gate = (const T *)gate_, *up = (const T *)up_;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float g = ld_act(gate, i), u = ld_act(up, i), dy = ld_act(dout, i);
        float sig = 1.0f / (1.0f + expf(-g));
        if (dgate) st_act(dgate, i, dy * u * sig * (1.0f + g * (1.0f - sig)));
        if (dup) st_act(dup, i, dy * g * sig);
    }
}

/* GeGLU (model.hidden_act gelu_tanh): out = gelu(g) u, its backward as k_gelu_bwd's */
template <typename T>
__global__ void k_geglu_fwd(act *out_, const act *gate_, const act *up_, int64_t n) {
    T *out = (T *)out_;
    const T *gate = (const T *)gate_, *up = (const T *)up_;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float x = ld_act(gate, i);
        float y = 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x)));
        st_act(out, i, y * ld_act(up, i));
    }
}

template <typename T>
__global__ void k_geglu_bwd(act *dgate_, act *dup_, const act *dout_, const act *gate_,
                            const act *up_, int64_t n) {
    T *dgate = (T *)dgate_, *dup = (T *)dup_;
    const T *dout = (const T *)dout_, *gate = (const T *)gate_, *up = (const T *)up_;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float x = ld_act(gate, i), u = ld_act(up, i), dy = ld_act(dout, i);
        float t = tanhf(GELU_K * (x + 0.044715f * x * x * x));
        float g = 0.5f * (1.0f + t) +
                  0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        if (dgate) st_act(dgate, i, dy * u * g);
        if (dup) st_act(dup, i, dy * 0.5f * x * (1.0f + t));
    }
}

static void cu_gelu_fwd(const ust_ops *o, act *out, const act *inp, int64_t n) {
    ACT_EW_LAUNCH(k_gelu_fwd, n, out, inp, n);
}
static void cu_gelu_bwd(const ust_ops *o, act *dinp, const act *inp, const act *dout, int64_t n) {
    ACT_EW_LAUNCH(k_gelu_bwd, n, dinp, inp, dout, n);
}
/* up(N,OC) = inp @ w^T + bias, act = gelu(up): under bf16 one cuBLASLt GEMM whose epilogue adds
 * the bias, keeps the pre-activation in up (bf16, as D) and writes gelu of the fp32 result to out
 * (its leading dimension must be a multiple of 8); otherwise linear_fwd then gelu_fwd. */
static void cu_linear_gelu_fwd(const ust_ops *o, act *up, act *out, const act *inp, const float *w,
                               const float *bias, int N, int C, int OC) {
    if (o->act_size == 2 && N > 0 && C > 0 && OC % 8 == 0) {
        const bf16 *w16 = weight16(o, SCR_B, w, (int64_t)OC * C);
        if (lt_gemm(o, out, CUDA_R_16BF, OC, 0, (const bf16 *)inp, C, 0, w16, C, 0, N, OC, C, 0, 1,
                    1.0f, 0.0f, 1, bias, up, 0) == 0)
            return;
        lt_fallback_note(bias ? "bias and GELU epilogue" : "GELU epilogue");
    }
    cu_linear_fwd(o, up, inp, w, bias, N, C, OC);
    cu_gelu_fwd(o, out, up, (int64_t)N * OC);
}

/* dup(N,OC) = gelu'(up) * (dout(N,C) @ w(C,OC)), dw += dout^T @ inp, dbias += column sums of
 * dout: under bf16 the input-gradient GEMM's DGELU epilogue applies the GELU's backward on the
 * fp32 product (up read as stored: the pre-activation linear_gelu_fwd kept), so the product
 * never reaches memory; otherwise linear_bwd then gelu_bwd in place. */
static void cu_linear_gelu_bwd(const ust_ops *o, act *dup, float *dw, float *dbias, const act *dout,
                               const act *inp, const act *up, const float *w, int N, int OC,
                               int C) {
    if (o->act_size == 2 && N > 0 && C > 0 && OC % 8 == 0) {
        const bf16 *w16 = weight16(o, SCR_B, w, (int64_t)C * OC);
        if (lt_gemm(o, dup, CUDA_R_16BF, OC, 0, (const bf16 *)dout, C, 0, w16, OC, 0, N, OC, C, 0,
                    0, 1.0f, 0.0f, 1, NULL, (void *)up, 1) == 0) {
            cu_linear_bwd(o, NULL, dw, dbias, dout, inp, w, N, OC, C, 0);
            return;
        }
        lt_fallback_note("GELU-gradient epilogue");
    }
    cu_linear_bwd(o, dup, dw, dbias, dout, inp, w, N, OC, C, 0);
    cu_gelu_bwd(o, dup, up, dup, (int64_t)N * OC);
}

static void cu_swiglu_fwd(const ust_ops *o, act *out, const act *gate, const act *up, int64_t n) {
    ACT_EW_LAUNCH(k_swiglu_fwd, n, out, gate, up, n);
}
static void cu_swiglu_bwd(const ust_ops *o, act *dgate, act *dup, const act *dout, const act *gate,
                          const act *up, int64_t n) {
    if (!dgate && !dup) return;
    ACT_EW_LAUNCH(k_swiglu_bwd, n, dgate, dup, dout, gate, up, n);
}
static void cu_geglu_fwd(const ust_ops *o, act *out, const act *gate, const act *up, int64_t n) {
    ACT_EW_LAUNCH(k_geglu_fwd, n, out, gate, up, n);
}
static void cu_geglu_bwd(const ust_ops *o, act *dgate, act *dup, const act *dout, const act *gate,
                         const act *up, int64_t n) {
    if (!dgate && !dup) return;
    ACT_EW_LAUNCH(k_geglu_bwd, n, dgate, dup, dout, gate, up, n);
}

/* ---------------------------------------------------------------- RoPE */

/* One thread per (token r, pair i): the angle pos * inv_freq(i) in double (as the CPU
 * backend), then the rotation of pair (i, i + D/2) of every head. sign = -1 is the inverse. */
template <typename T>
__global__ void k_rope(act *out_, const act *inp_, const int32_t *pos, int64_t rows, int Tn, int H,
                       int D, ust_rope rope, double sign) {
    T *out = (T *)out_;
    const T *inp = (const T *)inp_;
    int half = D / 2;
    int64_t n = rows * half;
    for (int64_t x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; x < n;
         x += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = x / half;
        int i = (int)(x % half), t = (int)(r % Tn);
        double p = pos ? pos[r] : t;
        double a = p * ust_rope_inv_freq(&rope, i, D);
        double as = rope.attn > 0 ? rope.attn : 1.0; /* YaRN's attention scale */
        float cs = (float)(as * cos(a)), sn = (float)(as * sign * sin(a));
        for (int h = 0; h < H; h++) {
            int64_t base = (r * H + h) * D;
            float x1 = ld_act(inp, base + i), x2 = ld_act(inp, base + i + half);
            st_act(out, base + i, x1 * cs - x2 * sn);
            st_act(out, base + i + half, x2 * cs + x1 * sn);
        }
    }
}

static void cu_rope_fwd(const ust_ops *o, act *out, const act *inp, const int32_t *pos, int B,
                        int T, int H, int D, const ust_rope *rope) {
    int64_t rows = (int64_t)B * T;
    ACT_EW_LAUNCH(k_rope, rows * (D / 2), out, inp, pos, rows, T, H, D, *rope, 1.0);
}

static void cu_rope_bwd(const ust_ops *o, act *dinp, const act *dout, const int32_t *pos, int B,
                        int T, int H, int D, const ust_rope *rope) {
    int64_t rows = (int64_t)B * T;
    ACT_EW_LAUNCH(k_rope, rows * (D / 2), dinp, dout, pos, rows, T, H, D, *rope, -1.0);
}

/* ---------------------------------------------------------------- cross-entropy */

/* model.final_softcap c (0: none): the logit the loss sees, c tanh(x / c), and a gradient of it
 * taken back to the raw logit (times 1 - (xc / c)^2), as the CPU backend's cap_logit/cap_grad. */
__device__ __forceinline__ float cap_logit(float x, float c) {
    return c > 0 ? c * tanhf(x / c) : x;
}
__device__ __forceinline__ float cap_grad(float g, float xc, float c) {
    return c > 0 ? g * (1.0f - (xc / c) * (xc / c)) : g;
}

/* One block per row. Everything read from a row is read before the barrier inside the last
 * block_sum, and each element is then rewritten by the thread that reads it, so dlogits may
 * alias logits. A target outside [0, v_real) other than the ignore marker gives a NaN loss. */
template <typename T, int VW>
__global__ void k_xent(float *losses, act *dlogits, const act *logits, const int32_t *targets,
                       int V, int v_real, float dscale, float cap) {
    __shared__ float sh[32];
    int64_t n = blockIdx.x;
    const T *x = (const T *)logits + n * V;
    T *dx = dlogits ? (T *)dlogits + n * V : NULL;
    const int c0 = threadIdx.x * VW, step = blockDim.x * VW; /* VW elements per access */
    float t[VW];
    int tgt = targets[n];
    if (tgt < 0) {
        if (losses && threadIdx.x == 0) losses[n] = 0.0f;
#pragma unroll
        for (int j = 0; j < VW; j++) t[j] = 0.0f;
        if (dx)
            for (int c = c0; c < V; c += step) st_vec<VW>(dx, c, t);
        return;
    }
    /* the max and the sum of exponentials in one pass over the row (online softmax: the sum is
     * rescaled when the running max grows), so the logits are read twice, not three times */
    float mt = -INFINITY, st = 0.0f;
    for (int c = c0; c < v_real; c += step) {
        ld_vec<VW>(x, c, t);
#pragma unroll
        for (int j = 0; j < VW; j++) {
            float xc = c + j < v_real ? cap_logit(t[j], cap) : -INFINITY; /* padding: nothing */
            if (xc > mt)
                st = st * expf(mt - xc) + 1.0f, mt = xc;
            else if (xc != -INFINITY) /* exp(-inf - mt) adds 0, but -inf - -inf would be NaN */
                st += expf(xc - mt);
        }
    }
    float mx = block_max(mt, sh);
    float xt = tgt < v_real ? cap_logit(ld_act(x, tgt), cap) : NAN;
    float s = block_sum(mt == -INFINITY ? st : st * expf(mt - mx), sh);
    if (losses && threadIdx.x == 0) losses[n] = logf(s) + mx - xt;
    if (!dx) return;
    float inv = 1.0f / s;
    for (int c = c0; c < V; c += step) {
        ld_vec<VW>(x, c, t);
#pragma unroll
        for (int j = 0; j < VW; j++) {
            float xc = cap_logit(t[j], cap);
            t[j] = c + j < v_real
                       ? cap_grad((expf(xc - mx) * inv - (c + j == tgt ? 1.0f : 0.0f)) * dscale, xc,
                                  cap)
                       : 0.0f;
        }
        st_vec<VW>(dx, c, t);
    }
}

static void cu_xent_fwd_bwd(const ust_ops *o, float *losses, act *dlogits, const act *logits,
                            const int32_t *targets, int N, int V, int v_real, float dscale,
                            float softcap) {
    UST_ASSERT(v_real > 0 && v_real <= V, "v_real=%d must be in 1..V=%d", v_real, V);
    if (N <= 0) return;
    VEC_LAUNCH(o, k_xent, row_vec(o, V, logits, dlogits, NULL), N, V >= 4096 ? 512 : 128, losses,
               dlogits, logits, targets, V, v_real, dscale, softcap);
}

/* Vocabulary-parallel cross-entropy: this shard holds global columns [v_start, v_start + V), the
 * first `real` of them real. Local pass: per row the log-sum-exp over the real local columns
 * (-inf when none) and the target's logit when the target is local (else 0). */
template <typename T>
__global__ void k_xent_vp_local(float *lse, float *tlogit, const act *logits,
                                const int32_t *targets, int V, int v_start, int real, float cap) {
    __shared__ float sh[32];
    int64_t n = blockIdx.x;
    const T *x = (const T *)logits + n * V;
    float mx = -INFINITY;
    for (int c = threadIdx.x; c < real; c += blockDim.x)
        mx = fmaxf(mx, cap_logit(ld_act(x, c), cap));
    mx = block_max(mx, sh);
    float s = 0.0f;
    for (int c = threadIdx.x; c < real; c += blockDim.x)
        s += expf(cap_logit(ld_act(x, c), cap) - mx);
    s = block_sum(s, sh);
    if (threadIdx.x == 0) {
        int t = targets[n], local = t - v_start;
        lse[n] = real > 0 ? mx + logf(s) : -INFINITY;
        tlogit[n] = t >= 0 && local >= 0 && local < real ? cap_logit(ld_act(x, local), cap) : 0.0f;
    }
}

/* After the shards' lse were merged and tlogits summed: losses = lse - tlogit, and dlogits =
 * (softmax - onehot) dscale on the local columns (0 on padding and ignored rows). Each element
 * is read and rewritten by one thread, so dlogits may alias logits. */
template <typename T, int VW>
__global__ void k_xent_vp_finish(float *losses, act *dlogits, const act *logits,
                                 const int32_t *targets, const float *lse, const float *tlogit,
                                 int V, int v_start, int real, float dscale, float cap) {
    int64_t n = blockIdx.x;
    int t = targets[n], ignored = t < 0, local = t - v_start;
    float L = lse[n], f[VW];
    if (losses && threadIdx.x == 0) losses[n] = ignored ? 0.0f : L - tlogit[n];
    if (!dlogits) return;
    const T *x = (const T *)logits + n * V;
    T *dx = (T *)dlogits + n * V;
    for (int c = threadIdx.x * VW; c < V; c += blockDim.x * VW) {
        ld_vec<VW>(x, c, f);
#pragma unroll
        for (int j = 0; j < VW; j++) {
            float xc = cap_logit(f[j], cap), p = c + j < real && !ignored ? expf(xc - L) : 0.0f;
            f[j] =
                ignored ? 0.0f : cap_grad((p - (c + j == local ? 1.0f : 0.0f)) * dscale, xc, cap);
        }
        st_vec<VW>(dx, c, f);
    }
}

static int vp_real_columns(int V, int v_start, int v_real) {
    int n = v_real - v_start;
    return n < 0 ? 0 : n > V ? V : n;
}

static void cu_xent_vp_local(const ust_ops *o, float *lse, float *tlogit, const act *logits,
                             const int32_t *targets, int N, int V, int v_start, int v_real,
                             float softcap) {
    if (N <= 0) return;
    ACT_LAUNCH(o, k_xent_vp_local, N, V >= 4096 ? 512 : 128, 0, lse, tlogit, logits, targets, V,
               v_start, vp_real_columns(V, v_start, v_real), softcap);
}

static void cu_xent_vp_finish(const ust_ops *o, float *losses, act *dlogits, const act *logits,
                              const int32_t *targets, const float *lse, const float *tlogit, int N,
                              int V, int v_start, int v_real, float dscale, float softcap) {
    if (N <= 0) return;
    VEC_LAUNCH(o, k_xent_vp_finish, dlogits ? row_vec(o, V, logits, dlogits, NULL) : 1, N,
               V >= 4096 ? 512 : 128, losses, dlogits, logits, targets, lse, tlogit, V, v_start,
               vp_real_columns(V, v_start, v_real), dscale, softcap);
}

/* ---------------------------------------------------------------- optimizer */

/* One element of AdamW (the CPU backend's formula, operation for operation). */
__device__ __forceinline__ void adamw_one(float *p, float grad, float *m, float *v, float lr,
                                          float b1, float b2, float eps, float wd, float grad_scale,
                                          float bc1, float bc2) {
    float g = grad * grad_scale;
    float mi = b1 * *m + (1.0f - b1) * g;
    float vi = b2 * *v + (1.0f - b2) * g * g;
    *m = mi;
    *v = vi;
    float mhat = mi / bc1, vhat = vi / bc2;
    *p -= lr * (mhat / (sqrtf(vhat) + eps) + wd * *p);
}

/* AdamW's states as stored: fp32, or bf16 bits (optimizer.state_dtype: bf16), widened and
 * rounded in registers by ops.h's ops_state_* (the CPU backend's bits); four at a time as one
 * 16-byte (fp32) or 8-byte (bf16) access. */
__device__ __forceinline__ float st_ld(const float *s, int64_t i) { return s[i]; }
__device__ __forceinline__ float st_ld(const uint16_t *s, int64_t i) { return ops_state_f32(s[i]); }
__device__ __forceinline__ void st_st(float *s, int64_t i, float x) { s[i] = x; }
__device__ __forceinline__ void st_st(uint16_t *s, int64_t i, float x) { s[i] = ops_state_bf16(x); }
__device__ __forceinline__ float4 st_ld4(const float *s, int64_t i) {
    return ((const float4 *)s)[i];
}
__device__ __forceinline__ float4 st_ld4(const uint16_t *s, int64_t i) {
    uint2 u = ((const uint2 *)s)[i];
    return make_float4(ops_state_f32((uint16_t)u.x), ops_state_f32((uint16_t)(u.x >> 16)),
                       ops_state_f32((uint16_t)u.y), ops_state_f32((uint16_t)(u.y >> 16)));
}
__device__ __forceinline__ void st_st4(float *s, int64_t i, float4 x) { ((float4 *)s)[i] = x; }
__device__ __forceinline__ uint32_t st_pair(float lo, float hi) {
    return (uint32_t)ops_state_bf16(lo) | (uint32_t)ops_state_bf16(hi) << 16;
}
__device__ __forceinline__ void st_st4(uint16_t *s, int64_t i, float4 x) {
    ((uint2 *)s)[i] = make_uint2(st_pair(x.x, x.y), st_pair(x.z, x.w));
}

/* Elements [first, n) of one AdamW update, stride apart: four at a time with 16-byte loads and
 * stores when all four arrays are aligned (AdamW reads 16 B and writes 12 B per parameter, 8
 * and 4 less with bf16 states, all of it memory-bound), the rest one by one; the same
 * arithmetic per element either way, so the results are the same bits. With p16 (bf16 on) the
 * updated parameters are also stored rounded there, the copy the linears' GEMMs read
 * (ops_cuda_w16.cu): 2 B more per parameter once per step instead of a rounding pass before
 * every use. */
template <typename S>
__device__ __forceinline__ void adamw_span(float *p, bf16 *p16, const float *grad, S *m, S *v,
                                           int64_t n, int64_t first, int64_t stride, float lr,
                                           float b1, float b2, float eps, float wd,
                                           float grad_scale, float bc1, float bc2) {
    const uintptr_t al = (uintptr_t)p | (uintptr_t)grad, sal = (uintptr_t)m | (uintptr_t)v;
    const int64_t n4 =
        al % 16 == 0 && sal % (4 * sizeof(S)) == 0 && (uintptr_t)p16 % 8 == 0 ? n / 4 : 0;
    for (int64_t i = first; i < n4; i += stride) {
        float4 p4 = ((float4 *)p)[i], m4 = st_ld4(m, i), v4 = st_ld4(v, i);
        const float4 g4 = ((const float4 *)grad)[i];
        adamw_one(&p4.x, g4.x, &m4.x, &v4.x, lr, b1, b2, eps, wd, grad_scale, bc1, bc2);
        adamw_one(&p4.y, g4.y, &m4.y, &v4.y, lr, b1, b2, eps, wd, grad_scale, bc1, bc2);
        adamw_one(&p4.z, g4.z, &m4.z, &v4.z, lr, b1, b2, eps, wd, grad_scale, bc1, bc2);
        adamw_one(&p4.w, g4.w, &m4.w, &v4.w, lr, b1, b2, eps, wd, grad_scale, bc1, bc2);
        ((float4 *)p)[i] = p4;
        st_st4(m, i, m4);
        st_st4(v, i, v4);
        if (p16) ((uint2 *)p16)[i] = make_uint2(pack_bf16x2(p4.x, p4.y), pack_bf16x2(p4.z, p4.w));
    }
    for (int64_t i = 4 * n4 + first; i < n; i += stride) {
        float mi = st_ld(m, i), vi = st_ld(v, i);
        adamw_one(p + i, grad[i], &mi, &vi, lr, b1, b2, eps, wd, grad_scale, bc1, bc2);
        st_st(m, i, mi);
        st_st(v, i, vi);
        if (p16) p16[i] = __float2bfloat16_rn(p[i]);
    }
}

__global__ void k_adamw(float *p, bf16 *p16, const float *grad, float *m, float *v, int64_t n,
                        float lr, float b1, float b2, float eps, float wd, float grad_scale,
                        float bc1, float bc2) {
    adamw_span(p, p16, grad, m, v, n, blockIdx.x * (int64_t)blockDim.x + threadIdx.x,
               (int64_t)gridDim.x * blockDim.x, lr, b1, b2, eps, wd, grad_scale, bc1, bc2);
}

static void cu_adamw(const ust_ops *o, float *p, const float *grad, float *m, float *v, int64_t n,
                     float lr, float b1, float b2, float eps, float wd, float grad_scale,
                     int64_t t) {
    float bc1 = (float)(1.0 - pow((double)b1, (double)t));
    float bc2 = (float)(1.0 - pow((double)b2, (double)t));
    bf16 *p16 = cuda_w16_target(o, p, n);
    /* a thread per four elements (grid-stride loops cover the rest) */
    EW_LAUNCH(k_adamw, (n + 3) / 4, p, p16, grad, m, v, n, lr, b1, b2, eps, wd, grad_scale, bc1,
              bc2);
    ops_segment all = {0, 0, 0, n, 0.0f};
    if (p16) cuda_w16_mark(o, &all, 1);
}

/* ---------------------------------------------------------------- multi-tensor */

#define SEG_CHUNK 65536 /* elements per block of the multi-tensor kernels */

typedef struct {
    int64_t p, g, m, n; /* the chunk's offsets in the buffers and its length */
    float wd;
    int seg; /* the segment it belongs to */
} seg_chunk;

/* The chunk list on the device and the host (same layout: the list, then one double per chunk
 * for partial sums). */
typedef struct {
    int n;
    seg_chunk *dev, *host;
    double *dev_part, *host_part;
} chunk_list;

/* Splits the segments into chunks of at most SEG_CHUNK elements (one block each) and uploads the
 * list (n = 0: nothing to do). */
static chunk_list upload_chunks(const ust_ops *o, const ops_segment *seg, int k) {
    cuda_impl *im = CUDA_IMPL(o);
    int64_t nc = 0;
    for (int i = 0; i < k; i++) nc += (seg[i].n + SEG_CHUNK - 1) / SEG_CHUNK;
    UST_ASSERT(nc < INT32_MAX, "%lld chunks in one multi-tensor op", (long long)nc);
    size_t list = ((size_t)nc * sizeof(seg_chunk) + 255) / 256 * 256;
    size_t host = list + (size_t)nc * sizeof(double);
    if (host > im->chunks_host_bytes) {
        free(im->chunks_host);
        im->chunks_host = malloc(host);
        if (!im->chunks_host) ust_fatal(UST_EXIT_RUNTIME, "out of memory (%zu bytes)", host);
        im->chunks_host_bytes = host;
    }
    seg_chunk *h = (seg_chunk *)im->chunks_host;
    int c = 0;
    for (int i = 0; i < k; i++)
        for (int64_t a = 0; a < seg[i].n; a += SEG_CHUNK, c++) {
            int64_t n = seg[i].n - a < SEG_CHUNK ? seg[i].n - a : SEG_CHUNK;
            h[c] = (seg_chunk){seg[i].p + a, seg[i].g + a, seg[i].m + a, n, seg[i].wd, i};
        }
    chunk_list cl = {(int)nc, NULL, h, NULL, (double *)((char *)h + list)};
    if (!nc) return cl;
    char *d = (char *)cuda_scratch(o, SCR_M, host);
    CK(cudaMemcpyAsync(d, h, (size_t)nc * sizeof(seg_chunk), cudaMemcpyHostToDevice, im->stream));
    cl.dev = (seg_chunk *)d;
    cl.dev_part = (double *)(d + list);
    return cl;
}

template <typename S>
__global__ void k_adamw_many(float *p, bf16 *p16, const float *grad, S *m, S *v,
                             const seg_chunk *ch, float lr, float b1, float b2, float eps,
                             float grad_scale, float bc1, float bc2) {
    seg_chunk c = ch[blockIdx.x];
    adamw_span(p + c.p, p16 ? p16 + c.p : NULL, grad + c.g, m + c.m, v + c.m, c.n, threadIdx.x,
               blockDim.x, lr, b1, b2, eps, c.wd, grad_scale, bc1, bc2);
}

/* adamw_many and adamw16_many: one launch, a block per chunk. */
template <typename S>
static void adamw_many_launch(const ust_ops *o, float *p, const float *grad, S *m, S *v,
                              const ops_segment *seg, int k, float lr, float b1, float b2,
                              float eps, float grad_scale, int64_t t) {
    chunk_list cl = upload_chunks(o, seg, k);
    if (!cl.n) return;
    float bc1 = (float)(1.0 - pow((double)b1, (double)t));
    float bc2 = (float)(1.0 - pow((double)b2, (double)t));
    int64_t end = 0;
    for (int i = 0; i < k; i++) end = seg[i].p + seg[i].n > end ? seg[i].p + seg[i].n : end;
    bf16 *p16 = cuda_w16_target(o, p, end);
    k_adamw_many<S><<<cl.n, 256, 0, STREAM(o)>>>(p, p16, grad, m, v, cl.dev, lr, b1, b2, eps,
                                                 grad_scale, bc1, bc2);
    CK_LAUNCH();
    if (p16) cuda_w16_mark(o, seg, k);
}

static void cu_adamw_many(const ust_ops *o, float *p, const float *grad, float *m, float *v,
                          const ops_segment *seg, int k, float lr, float b1, float b2, float eps,
                          float grad_scale, int64_t t) {
    adamw_many_launch(o, p, grad, m, v, seg, k, lr, b1, b2, eps, grad_scale, t);
}

static void cu_adamw16_many(const ust_ops *o, float *p, const float *grad, uint16_t *m, uint16_t *v,
                            const ops_segment *seg, int k, float lr, float b1, float b2, float eps,
                            float grad_scale, int64_t t) {
    adamw_many_launch(o, p, grad, m, v, seg, k, lr, b1, b2, eps, grad_scale, t);
}

/* Muon's momentum on one element: optim_muon.c's scale and axpy steps in the same order, the
 * scales' products never fused into the adds (as separate kernels they are stored first), so
 * these are the bits of the fp32 form's kernels with or without FMA contraction. */
__device__ __forceinline__ void momentum_one(float *g, float *m, float mu, float gs, int nesterov) {
    float mi = __fmul_rn(*m, mu);
    mi += gs * *g;
    *m = mi;
    if (nesterov) {
        float gi = __fmul_rn(*g, gs);
        *g = gi + mu * mi;
    } else {
        *g = mi;
    }
}

/* momentum16: four elements at a time (a 16-byte gradient and an 8-byte state access) when
 * aligned, the rest one by one, the same arithmetic either way. */
__global__ void k_momentum16(float *g, uint16_t *m, int64_t n, float mu, float gs, int nesterov) {
    const int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t n4 = (uintptr_t)g % 16 == 0 && (uintptr_t)m % 8 == 0 ? n / 4 : 0;
    for (int64_t i = first; i < n4; i += stride) {
        float4 g4 = ((float4 *)g)[i], m4 = st_ld4(m, i);
        momentum_one(&g4.x, &m4.x, mu, gs, nesterov);
        momentum_one(&g4.y, &m4.y, mu, gs, nesterov);
        momentum_one(&g4.z, &m4.z, mu, gs, nesterov);
        momentum_one(&g4.w, &m4.w, mu, gs, nesterov);
        ((float4 *)g)[i] = g4;
        st_st4(m, i, m4);
    }
    for (int64_t i = 4 * n4 + first; i < n; i += stride) {
        float mi = st_ld(m, i);
        momentum_one(g + i, &mi, mu, gs, nesterov);
        st_st(m, i, mi);
    }
}

static void cu_momentum16(const ust_ops *o, float *g, uint16_t *m, int64_t n, float mu,
                          float grad_scale, int nesterov) {
    EW_LAUNCH(k_momentum16, (n + 3) / 4, g, m, n, mu, grad_scale, nesterov);
    if (n > 0) cuda_w16_cut(o, g, (size_t)n * sizeof(float)); /* as axpy: g is any fp32 buffer */
}

/* Block c sums the squares of chunk c in double; the host adds the chunks of each segment in
 * order, so the result does not depend on the device. */
__global__ void k_sumsq_many(double *part, const float *grad, const seg_chunk *ch) {
    __shared__ double sh[32];
    seg_chunk c = ch[blockIdx.x];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
        double x = grad[c.g + i];
        s += x * x;
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

static void cu_sumsq_many(const ust_ops *o, const float *grad, const ops_segment *seg, int k,
                          double *out) {
    cuda_impl *im = CUDA_IMPL(o);
    for (int i = 0; i < k; i++) out[i] = 0.0;
    chunk_list cl = upload_chunks(o, seg, k);
    if (!cl.n) return;
    k_sumsq_many<<<cl.n, 256, 0, im->stream>>>(cl.dev_part, grad, cl.dev);
    CK_LAUNCH();
    CK(cudaMemcpyAsync(cl.host_part, cl.dev_part, (size_t)cl.n * sizeof(double),
                       cudaMemcpyDeviceToHost, im->stream));
    CK(cudaStreamSynchronize(im->stream));
    for (int c = 0; c < cl.n; c++) out[cl.host[c].seg] += cl.host_part[c];
}

/* ---------------------------------------------------------------- elementwise, reductions */

static void cu_add(const ust_ops *o, act *out, const act *a, const act *b, int64_t n) {
    ACT_EW_LAUNCH(k_add, n, out, a, b, n);
}
static void cu_axpy(const ust_ops *o, float *y, float a, const float *x, int64_t n) {
    EW_LAUNCH(k_axpy, n, y, a, x, n);
    if (n > 0) cuda_w16_cut(o, y, (size_t)n * sizeof(float));
}
__global__ void k_scale_keep(float *x, float s, int64_t n) { /* x *= s, NaN-propagating */
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= s;
}
static void cu_scale(const ust_ops *o, float *x, float s, int64_t n) {
    EW_LAUNCH(k_scale_keep, n, x, s, n);
    if (n > 0) cuda_w16_cut(o, x, (size_t)n * sizeof(float));
}
static void cu_scale_act(const ust_ops *o, act *x, float s, int64_t n) {
    cuda_scale_act(o, x, s, n); /* ops_cuda_act.cu; activations are never AdamW's weights */
}

/* Block b sums its fixed chunk [b per, (b+1) per) in double. */
template <int SQUARE>
__global__ void k_reduce(double *part, const float *x, int64_t n, int64_t per) {
    __shared__ double sh[32];
    int64_t i0 = blockIdx.x * per, i1 = min(n, i0 + per);
    double s = 0.0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        double v = x[i];
        s += SQUARE ? v * v : v;
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

static double reduce(const ust_ops *o, const float *x, int64_t n, int square) {
    cuda_impl *im = CUDA_IMPL(o);
    if (n <= 0) return 0.0;
    int64_t per = (n + RED_BLOCKS - 1) / RED_BLOCKS;
    if (square)
        k_reduce<1><<<RED_BLOCKS, 256, 0, im->stream>>>(im->dev_partials, x, n, per);
    else
        k_reduce<0><<<RED_BLOCKS, 256, 0, im->stream>>>(im->dev_partials, x, n, per);
    CK_LAUNCH();
    CK(cudaMemcpyAsync(im->host_partials, im->dev_partials, RED_BLOCKS * sizeof(double),
                       cudaMemcpyDeviceToHost, im->stream));
    CK(cudaStreamSynchronize(im->stream));
    double total = 0.0;
    for (int b = 0; b < RED_BLOCKS; b++) total += im->host_partials[b];
    return total;
}

static double cu_sumsq(const ust_ops *o, const float *x, int64_t n) { return reduce(o, x, n, 1); }
static double cu_sum(const ust_ops *o, const float *x, int64_t n) { return reduce(o, x, n, 0); }

/* ---------------------------------------------------------------- mixture of experts */

/* One token's k experts from its scores p(E) + bias, as the CPU's route_select: with groups,
 * only among the topk_group groups of highest top-q sums (q = group_top, 0: 2); k argmax passes
 * (strict >, so ties go to the lower index). */
__device__ void moe_route_select(const float *p, const float *bias, int E, int k, ops_moe_route r,
                                 int32_t *sel) {
    int G = r.n_group > 1 ? r.n_group : 1, Eg = E / G, T = G > 1 ? r.topk_group : G;
    int q = r.group_top > 0 ? r.group_top : 2;
    unsigned long long groups = G > 1 ? 0ull : 1ull;
#define SC(e) (p[e] + (bias ? bias[e] : 0.0f))
    for (int t = 0; t < T && G > 1; t++) {
        int best = -1;
        float bs = 0.0f;
        for (int g = 0; g < G; g++) {
            if (groups >> g & 1ull) continue;
            float top[16]; /* the group's q highest, descending */
            for (int i = 0; i < q; i++) top[i] = -INFINITY;
            for (int e = g * Eg; e < (g + 1) * Eg; e++) {
                float v = SC(e);
                int i = q - 1;
                if (!(v > top[i])) continue;
                for (; i > 0 && v > top[i - 1]; i--) top[i] = top[i - 1];
                top[i] = v;
            }
            float gs = top[0];
            for (int i = 1; i < q; i++) gs += top[i];
            if (best < 0 || gs > bs) best = g, bs = gs;
        }
        groups |= 1ull << best;
    }
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int used = !(groups >> (G > 1 ? e / Eg : 0) & 1ull);
            for (int m = 0; m < j; m++) used |= sel[m] == e;
            if (!used && (best < 0 || SC(e) > SC(best))) best = e;
        }
        sel[j] = best;
    }
#undef SC
}

/* One thread per token: softmax (or sigmoid) over E, the choice, the gates (ops.h). */
template <typename T>
__global__ void k_moe_router_fwd(float *probs, float *lse, int32_t *topk, float *gate,
                                 const act *logits, const float *bias, int N, int E, int k,
                                 ops_moe_route r) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const T *x = (const T *)logits + (int64_t)n * E;
    float *p = probs + (int64_t)n * E;
    if (r.sigmoid) {
        float sum = 0.0f;
        for (int e = 0; e < E; e++) p[e] = 1.0f / (1.0f + expf(-ld_act(x, e))), sum += p[e];
        if (lse) lse[n] = sum;
    } else {
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; e++) mx = fmaxf(mx, ld_act(x, e));
        for (int e = 0; e < E; e++) sum += expf(ld_act(x, e) - mx);
        float inv = 1.0f / sum;
        for (int e = 0; e < E; e++) p[e] = expf(ld_act(x, e) - mx) * inv;
        if (lse) lse[n] = mx + logf(sum);
    }
    int32_t *sel = topk + (int64_t)n * k;
    moe_route_select(p, bias, E, k, r, sel);
    float s = 0.0f;
    for (int j = 0; j < k; j++) s += p[sel[j]];
    for (int j = 0; j < k; j++)
        gate[(int64_t)n * k + j] = (r.norm ? p[sel[j]] / s : p[sel[j]]) * r.scale;
}

/* psum[e] = sum over rows of probs[:, e] (over rowsum[n] when given): one block per column, a
 * fixed tree in double. */
__global__ void k_moe_colsum(float *psum, const float *probs, const float *rowsum, int N, int E) {
    __shared__ double sh[32];
    int e = blockIdx.x;
    double s = 0.0;
    for (int n = threadIdx.x; n < N; n += blockDim.x)
        s += (double)probs[(int64_t)n * E + e] / (rowsum ? rowsum[n] : 1.0f);
    s = block_sum(s, sh);
    if (threadIdx.x == 0) psum[e] = (float)s;
}

static const ops_moe_route cu_route_default = {0, 1, 1, 1, 1.0f, 2};

static void cu_moe_router_fwd(const ust_ops *o, float *probs, float *lse, int32_t *topk,
                              float *gate, float *psum, const act *logits, const float *bias, int N,
                              int E, int k, const ops_moe_route *r) {
    ops_moe_route rr = r ? *r : cu_route_default;
    UST_ASSERT(!rr.sigmoid || !psum || lse, "sigmoid routing's psum needs the score sums (lse)");
    if (N > 0)
        ACT_LAUNCH(o, k_moe_router_fwd, (N + 127) / 128, 128, 0, probs, lse, topk, gate, logits,
                   bias, N, E, k, rr);
    if (psum) {
        k_moe_colsum<<<E, 256, 0, STREAM(o)>>>(psum, probs, rr.sigmoid ? lse : NULL, N, E);
        CK_LAUNCH();
    }
}

/* dprobs[e] of one token (see ops.h): aux_dp[e] (sigmoid: through q = p / sum, aq = sum_f
 * aux_f q_f, inv = 1 / sum) plus, when e was chosen as the token's j-th expert, the gates'
 * backward: (c dg[j] - dot) / s under norm, else c dg[j]. */
__device__ __forceinline__ float router_dprob(int e, const float *aux_dp, const int32_t *sel,
                                              const float *dg, int k, float dot, float s,
                                              const ops_moe_route &r, float aq, float inv) {
    float d = aux_dp ? (aux_dp[e] - aq) * inv : 0.0f;
    if (dg)
        for (int j = 0; j < k; j++)
            if (sel[j] == e) d += r.norm ? (r.scale * dg[j] - dot) / s : r.scale * dg[j];
    return d;
}

/* One thread per token. dprobs is recomputed per expert rather than kept in dlogits, which may
 * be bf16: only the final gradient is rounded. */
template <typename T>
__global__ void k_moe_router_bwd(act *dlogits, const float *dgate, const float *probs,
                                 const float *lse, const int32_t *topk, const float *gate,
                                 const float *aux_dp, float zscale, int N, int E, int k,
                                 ops_moe_route r) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float *p = probs + (int64_t)n * E;
    T *d = (T *)dlogits + (int64_t)n * E;
    const int32_t *sel = topk + (int64_t)n * k;
    const float *dg = dgate ? dgate + (int64_t)n * k : NULL, *g = gate + (int64_t)n * k;
    float s = 0.0f, dot = 0.0f, aq = 0.0f, inv = r.sigmoid && aux_dp ? 1.0f / lse[n] : 1.0f;
    for (int e = 0; e < E && r.sigmoid && aux_dp; e++) aq += aux_dp[e] * p[e] * inv;
    if (dg)
        for (int j = 0; j < k; j++) s += p[sel[j]], dot += dg[j] * g[j];
    if (r.sigmoid) {
        for (int e = 0; e < E; e++)
            st_act(d, e,
                   p[e] * (1.0f - p[e]) * router_dprob(e, aux_dp, sel, dg, k, dot, s, r, aq, inv));
        return;
    }
    float pd = 0.0f;
    for (int e = 0; e < E; e++)
        pd += p[e] * router_dprob(e, aux_dp, sel, dg, k, dot, s, r, aq, inv);
    float z = lse && zscale != 0.0f ? zscale * lse[n] : 0.0f;
    for (int e = 0; e < E; e++)
        st_act(d, e, p[e] * (router_dprob(e, aux_dp, sel, dg, k, dot, s, r, aq, inv) - pd + z));
}

static void cu_moe_router_bwd(const ust_ops *o, act *dlogits, const float *dgate,
                              const float *probs, const float *lse, const int32_t *topk,
                              const float *gate, const float *aux_dp, float zscale, int N, int E,
                              int k, const ops_moe_route *r) {
    if (N <= 0) return;
    ops_moe_route rr = r ? *r : cu_route_default;
    ACT_LAUNCH(o, k_moe_router_bwd, (N + 127) / 128, 128, 0, dlogits, dgate, probs, lse, topk, gate,
               aux_dp, zscale, N, E, k, rr);
}

template <typename T>
__global__ void k_moe_gather(act *out_, const act *inp_, const int32_t *src, const float *scale,
                             int M, int C, int div) {
    T *out = (T *)out_;
    const T *inp = (const T *)inp_;
    int64_t n = (int64_t)M * C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / C, c = i % C;
        int32_t a = src[r];
        st_act(out, i, (scale ? scale[a] : 1.0f) * ld_act(inp, (int64_t)(a / div) * C + c));
    }
}

static void cu_moe_gather(const ust_ops *o, act *out, const act *inp, const int32_t *src,
                          const float *scale, int M, int C, int div) {
    ACT_EW_LAUNCH(k_moe_gather, (int64_t)M * C, out, inp, src, scale, M, C, div);
}

/* One thread per output element, summing the token's k rows in j order (no atomics). */
template <typename T>
__global__ void k_moe_combine(act *out_, const act *rows_, const int32_t *pos, const float *gate,
                              int N, int k, int C, int acc) {
    T *out = (T *)out_;
    const T *rows = (const T *)rows_;
    int64_t n = (int64_t)N * C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / C, c = i % C;
        float y = acc ? ld_act(out, i) : 0.0f;
        for (int j = 0; j < k; j++) {
            int64_t a = t * k + j;
            if (pos[a] < 0) continue;
            y += (gate ? gate[a] : 1.0f) * ld_act(rows, (int64_t)pos[a] * C + c);
        }
        st_act(out, i, y);
    }
}

static void cu_moe_combine(const ust_ops *o, act *out, const act *rows, const int32_t *pos,
                           const float *gate, int N, int k, int C, int acc) {
    ACT_EW_LAUNCH(k_moe_combine, (int64_t)N * C, out, rows, pos, gate, N, k, C, acc);
}

/* One warp per assignment: a dot product of C, reduced by a fixed shuffle tree. */
template <typename T>
__global__ void k_moe_gate_grad(float *dgate, const act *dout, const act *rows, const int32_t *pos,
                                int64_t A, int k, int C) {
    int64_t a = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (a >= A) return; /* whole warps leave together: A is warp-uniform */
    int32_t r = pos[a];
    float s = 0.0f;
    if (r >= 0) {
        const T *g = (const T *)dout + (a / k) * C, *x = (const T *)rows + (int64_t)r * C;
        for (int c = lane; c < C; c += 32) s += ld_act(g, c) * ld_act(x, c);
    }
    s = warp_sum(s);
    if (lane == 0) dgate[a] = s;
}

static void cu_moe_gate_grad(const ust_ops *o, float *dgate, const act *dout, const act *rows,
                             const int32_t *pos, int N, int k, int C) {
    int64_t A = (int64_t)N * k;
    if (A <= 0) return;
    ACT_LAUNCH(o, k_moe_gate_grad, (int)((A + 7) / 8), 256, 0, dgate, dout, rows, pos, A, k, C);
}

/* ---------------------------------------------------------------- grouped linear (MoE experts) */

/* For each group g with rows: row-major C_g(M_g, N_g) = op(A_g) op(B_g) + beta C_g over K_g, as
 * one cublasGemmGroupedBatchedEx (fp32; one problem per group). The pointer arrays go to the
 * device through SCR_G (a pageable copy: the host arrays are free again on return, and the
 * stream orders the copy after the previous grouped GEMM that read the slot). */
static void gemm_grouped32(const ust_ops *o, int G, float *const *C, const float *const *A,
                           const float *const *B, const int *M, const int *N, const int *K, int tA,
                           int tB, float beta) {
    if (G <= 0) return;
    cuda_impl *im = CUDA_IMPL(o);
    cublasOperation_t ta[G], tb[G];
    int m[G], n[G], k[G], lda[G], ldb[G], ldc[G], size[G];
    float alpha[G], betas[G];
    const void *ptr[3 * (G)];
    int c = 0;
    for (int g = 0; g < G; g++) {
        if (M[g] <= 0 || N[g] <= 0) continue;
        if (K[g] <= 0) { /* empty sum */
            if (beta != 1.0f) scale_rows(o, C[g], CUDA_R_32F, N[g], M[g], N[g], beta);
            continue;
        }
        /* row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T */
        ta[c] = tB ? CUBLAS_OP_T : CUBLAS_OP_N, tb[c] = tA ? CUBLAS_OP_T : CUBLAS_OP_N;
        m[c] = N[g], n[c] = M[g], k[c] = K[g];
        lda[c] = tB ? K[g] : N[g], ldb[c] = tA ? M[g] : K[g], ldc[c] = N[g];
        alpha[c] = 1.0f, betas[c] = beta, size[c] = 1;
        ptr[c] = B[g], ptr[G + c] = A[g], ptr[2 * G + c] = C[g];
        c++;
    }
    if (c == 0) return;
    const void *packed[3 * c];
    for (int i = 0; i < c; i++)
        packed[i] = ptr[i], packed[c + i] = ptr[G + i], packed[2 * c + i] = ptr[2 * G + i];
    void **d = (void **)cuda_scratch(o, SCR_G, sizeof packed);
    CK(cudaMemcpyAsync(d, packed, sizeof packed, cudaMemcpyHostToDevice, im->stream));
    CKB(cublasGemmGroupedBatchedEx(im->blas, ta, tb, m, n, k, alpha, (const void *const *)d,
                                   CUDA_R_32F, lda, (const void *const *)(d + c), CUDA_R_32F, ldb,
                                   betas, d + 2 * c, CUDA_R_32F, ldc, c, size, CUBLAS_COMPUTE_32F));
}

/* out_g = inp_g @ w[g]^T + b[g] (ops.h): fp32 one grouped GEMM (then each group's bias); bf16 the
 * groups' linears in turn (cuBLAS has no grouped GEMM from bf16 inputs to an fp32 gradient). */
static void cu_grouped_linear_fwd(const ust_ops *o, act *out, const act *inp, const float *const *w,
                                  const float *const *b, const int32_t *M, int G, int C, int OC) {
    int64_t off = 0;
    if (G <= 0) return;
    if (o->act_size == 2) {
        for (int g = 0; g < G; off += M[g++])
            cu_linear_fwd(o, act_at(o, out, off * OC), act_at(o, inp, off * C), w[g],
                          b ? b[g] : NULL, M[g], C, OC);
        return;
    }
    float *Cp[G];
    const float *Ap[G];
    int Ns[G], Ks[G];
    for (int g = 0; g < G; off += M[g++]) {
        Cp[g] = (float *)out + off * OC, Ap[g] = (const float *)inp + off * C;
        Ns[g] = OC, Ks[g] = C;
    }
    gemm_grouped32(o, G, Cp, Ap, w, M, Ns, Ks, 0, 1, 0.0f);
    if (!b) return;
    off = 0;
    for (int g = 0; g < G; off += M[g++]) {
        int64_t n = (int64_t)M[g] * OC;
        if (!b[g] || n == 0) continue;
        act *rows = Cp[g]; /* (plain locals: the emulator's launch captures its arguments) */
        const float *bias = b[g];
        int64_t Mg = M[g];
        k_bias_add<float>
            <<<grid_for(n, EW_THREADS), EW_THREADS, 0, STREAM(o)>>>(rows, bias, Mg, OC);
        CK_LAUNCH();
    }
}

/* dinp_g = dout_g @ w[g] (one grouped GEMM), dw[g] += dout_g^T inp_g (another), db[g] += column
 * sums; bf16 as the forward. */
static void cu_grouped_linear_bwd(const ust_ops *o, act *dinp, float *const *dw, float *const *db,
                                  const act *dout, const act *inp, const float *const *w,
                                  const int32_t *M, int G, int C, int OC, int acc_dinp) {
    int64_t off = 0;
    if (G <= 0) return;
    if (o->act_size == 2) {
        for (int g = 0; g < G; off += M[g++])
            if (M[g] > 0)
                cu_linear_bwd(o, dinp ? act_at(o, dinp, off * C) : NULL, dw[g], db ? db[g] : NULL,
                              act_at(o, dout, off * OC), act_at(o, inp, off * C), w[g], M[g], C, OC,
                              acc_dinp);
        return;
    }
    float *Cp[G];
    const float *Ap[G], *Bp[G];
    int Ms[G], Ns[G], Ks[G];
    if (dinp) {
        for (int g = 0; g < G; off += M[g++]) {
            Cp[g] = (float *)dinp + off * C, Ap[g] = (const float *)dout + off * OC;
            Ns[g] = C, Ks[g] = OC;
        }
        gemm_grouped32(o, G, Cp, Ap, w, M, Ns, Ks, 0, 0, acc_dinp ? 1.0f : 0.0f);
    }
    off = 0;
    for (int g = 0; g < G; off += M[g++]) {
        Ap[g] = (const float *)dout + off * OC, Bp[g] = (const float *)inp + off * C;
        Ms[g] = M[g] > 0 ? OC : 0, Ns[g] = C, Ks[g] = M[g];
    }
    gemm_grouped32(o, G, dw, Ap, Bp, Ms, Ns, Ks, 1, 0, 1.0f);
    if (!db) return;
    off = 0;
    for (int g = 0; g < G; off += M[g++])
        if (db[g] && M[g] > 0)
            colred(o, MODE_BIAS, db[g], NULL, act_at(o, dout, off * OC), NULL, NULL, NULL, M[g],
                   OC);
}

/* ---------------------------------------------------------------- lifetime */

static void cu_destroy(ust_ops *o) {
    if (!o) return;
    cuda_impl *im = CUDA_IMPL(o);
    if (im) {
        cudaStreamSynchronize(im->stream);
        for (int i = 0; i < SCR_N; i++)
            if (im->scratch[i]) cudaFree(im->scratch[i]);
        if (im->lt_ws) cudaFree(im->lt_ws);
        if (im->dev_partials) cudaFree(im->dev_partials);
        if (im->host_partials) cudaFreeHost(im->host_partials);
        free(im->chunks_host);
        cuda_lt_cache_free(im);
        cuda_w16_free(im);
        if (im->lt) cublasLtDestroy(im->lt);
        if (im->blas) cublasDestroy(im->blas);
        if (im->stream) cudaStreamDestroy(im->stream);
        free(im);
    }
    free(o);
}

extern "C" void ops_cuda_set_bf16(ust_ops *o, int on) {
    UST_ASSERT(o && strcmp(o->name, "cuda") == 0, "ops_cuda_set_bf16 on a %s backend",
               o ? o->name : "NULL");
    o->act_size = on ? 2 : 4; /* bf16 activations: every act of ops.h is __nv_bfloat16 */
}

static void *cu_stream(const ust_ops *o) { return (void *)CUDA_IMPL(o)->stream; }

static void cu_memory(const ust_ops *o, ops_mem *m) {
    const cuda_impl *im = CUDA_IMPL(o);
    size_t own = im->lt_ws_bytes + RED_BLOCKS * sizeof(double), fr = 0, tot = 0;
    for (int i = 0; i < SCR_N; i++) own += im->scratch_bytes[i];
    own += cuda_w16_bytes(im);
    CK(cudaMemGetInfo(&fr, &tot));
    m->backend_bytes = own;
    m->device_used = tot - fr;
    m->device_total = tot;
    m->allocations = im->allocations;
}

extern "C" ust_ops *ops_cuda_create(int device, ust_err *e) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error so nothing later trips on it */
        ust_errf(e, "run.device = cuda: no CUDA device available (cudaGetDeviceCount: %s)",
                 cudaGetErrorString(err));
        return NULL;
    }
    if (count <= 0) {
        ust_errf(e, "run.device = cuda: no CUDA device available (cudaGetDeviceCount: 0 devices)");
        return NULL;
    }
    if (device < 0) {
        ust_errf(e, "run.device = cuda: device %d is not a device index", device);
        return NULL;
    }
    device %= count; /* the local rank, as the NCCL backend maps it */
    err = cudaSetDevice(device);
    if (err != cudaSuccess) {
        cudaGetLastError();
        ust_errf(e, "run.device = cuda: cudaSetDevice(%d): %s", device, cudaGetErrorString(err));
        return NULL;
    }
    ust_ops *o = (ust_ops *)calloc(1, sizeof *o);
    cuda_impl *im = (cuda_impl *)calloc(1, sizeof *im);
    if (!o || !im) ust_fatal(UST_EXIT_RUNTIME, "out of memory creating the CUDA backend");
    im->device = device;
    const char *att = getenv("UST_CUDA_ATTENTION"), *chunk = getenv("UST_CUDA_ATTENTION_CHUNK");
    static const char *const att_names[] = {"auto", "gemm", "flash", "tc"};
    im->attn_mode = att ? -1 : ATT_AUTO;
    for (int i = 0; att && i < 4; i++)
        if (strcmp(att, att_names[i]) == 0) im->attn_mode = i;
    if (im->attn_mode < 0) {
        ust_errf(e, "UST_CUDA_ATTENTION=%s: expected auto, gemm, flash or tc", att);
        free(o), free(im);
        return NULL;
    }
    im->attn_chunk = chunk ? atoi(chunk) : 0;
    CK(cudaDeviceGetAttribute(&im->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    CK(cudaDeviceGetAttribute(&im->num_sms, cudaDevAttrMultiProcessorCount, device));
    CK(cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking));
    CKB(cublasCreate(&im->blas));
    CKB(cublasSetStream(im->blas, im->stream));
    CKB(cublasSetMathMode(im->blas, CUBLAS_DEFAULT_MATH)); /* fp32 stays fp32: no TF32 */
    CKB(cublasLtCreate(&im->lt));
    im->lt_ws_bytes = (size_t)32 << 20;
    CK(cudaMalloc(&im->lt_ws, im->lt_ws_bytes));
    CK(cudaMalloc(&im->dev_partials, RED_BLOCKS * sizeof(double)));
    CK(cudaMallocHost(&im->host_partials, RED_BLOCKS * sizeof(double)));

    o->name = "cuda";
    o->impl = im;
    o->act_size = sizeof(float);
/* attention lives in attention.cu, under its file's prefix */
#define cu_attention_fwd cuda_attention_fwd
#define cu_attention_bwd cuda_attention_bwd
#define cu_attention_merge cuda_attention_merge
#define cu_attention_logit_max cuda_attention_logit_max
#define FILL(op) o->op = cu_##op;
    UST_OPS_LIST(FILL)
#undef FILL
    return o;
}
