/* ops_cpu: the CPU backend of ops.h. fp32 only, synchronous: every op has finished when it
 * returns. Matmuls go to OpenBLAS sgemm; everything else is plain C parallelized with OpenMP
 * static schedules. Every output element is computed by exactly one thread in a fixed order
 * that does not depend on the thread count, so results are bit-identical run to run and
 * across thread counts (gradient reductions over rows are done by column chunks, not by
 * per-thread partial sums). "Device" memory is host memory. */
#include "ops.h"
#include "log.h"

#include "error.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    int threads;
} cpu_impl;

static int nthreads(const ust_ops *o) { return ((const cpu_impl *)o->impl)->threads; }

/* OpenBLAS always runs on one thread: its threaded GEMM hands work between its threads by
 * spinning on flags with sched_yield, and when another process holds a core the thread it waits
 * for is off the CPU for whole time slices (a tiny step took 900-1100 ms beside one busy process
 * per core instead of 60-90 ms idle, even with a passive OpenMP wait policy). The setting is
 * process-wide and a library user may change it, so it is checked before each call; the
 * parallelism is ours (sgemm's row or column blocks on OpenMP threads, which sleep). */
static void blas_threads(const ust_ops *o) {
    (void)o;
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

/* Reductions over a row dimension are done per chunk of this many columns, each chunk by one
 * thread accumulating rows in order (deterministic, race-free). */
#define COL_CHUNK 64

/* ---------------------------------------------------------------- memory */

static void *cpu_alloc(const ust_ops *o, size_t bytes) {
    (void)o;
    void *p = NULL;
    size_t n = bytes ? (bytes + 63) / 64 * 64 : 64;
    if (posix_memalign(&p, 64, n) != 0 || !p)
        ust_fatal(UST_EXIT_RUNTIME, "out of memory allocating %zu bytes", bytes);
    memset(p, 0, n);
    return p;
}

static void cpu_free(const ust_ops *o, void *p) {
    (void)o;
    free(p);
}

/* Host memory is all the CPU backend has: plain calloc (a failure is the caller's to report). */
static void *cpu_host_alloc(const ust_ops *o, size_t bytes) {
    (void)o;
    return calloc(1, bytes ? bytes : 1);
}

static void cpu_host_free(const ust_ops *o, void *p) {
    (void)o;
    free(p);
}

static void cpu_copy(const ust_ops *o, void *dst, const void *src, size_t bytes) {
    (void)o;
    if (bytes && dst != src) memcpy(dst, src, bytes);
}

static void cpu_copy2d(const ust_ops *o, void *dst, size_t dpitch, const void *src, size_t spitch,
                       size_t width, size_t rows) {
    (void)o;
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
}

static void cpu_zero(const ust_ops *o, void *p, size_t bytes) {
    (void)o;
    if (bytes) memset(p, 0, bytes);
}

static void cpu_sync(const ust_ops *o) { (void)o; }

/* ---------------------------------------------------------------- matmul */

/* sgemm's blocks: a product of at least GEMM_SPLIT_WORK multiply-adds is cut along its longer
 * output side into about GEMM_BLOCKS blocks of rows (or columns), at least GEMM_BLOCK_MIN long
 * and a multiple of GEMM_BLOCK_ALIGN. The threads take blocks dynamically, so one that is off
 * the CPU (a busy neighbour process) leaves its blocks to the others instead of holding them at
 * a barrier. The blocks depend on the shape only, never on the thread count (one thread walks
 * the same blocks): OpenBLAS's edge kernels round differently for a different cut, so this is
 * what keeps results bit-identical across thread counts (test_ops). Each block re-packs the
 * other operand, 1/(2 x block length) of its work. */
enum { GEMM_SPLIT_WORK = 1 << 18, GEMM_BLOCKS = 16, GEMM_BLOCK_MIN = 128, GEMM_BLOCK_ALIGN = 16 };

static int gemm_block_len(int dim) {
    int len = (dim + GEMM_BLOCKS - 1) / GEMM_BLOCKS;
    if (len < GEMM_BLOCK_MIN) len = GEMM_BLOCK_MIN;
    return (len + GEMM_BLOCK_ALIGN - 1) / GEMM_BLOCK_ALIGN * GEMM_BLOCK_ALIGN;
}

/* C[M,N] = alpha op(A) op(B) + beta C, row-major. A is stored (M,K), or (K,M) when tA. */
static void sgemm(const ust_ops *o, float *C, const float *A, const float *B, int M, int N, int K,
                  int tA, int tB, float alpha, float beta) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* empty sum: C = beta C (BLAS rejects lda = 0) */
        for (int64_t i = 0; i < (int64_t)M * N; i++) C[i] = beta == 0.0f ? 0.0f : beta * C[i];
        return;
    }
    blas_threads(o);
    const CBLAS_TRANSPOSE ta = tA ? CblasTrans : CblasNoTrans, tb = tB ? CblasTrans : CblasNoTrans;
    const int lda = tA ? M : K, ldb = tB ? K : N, by_rows = M >= N, dim = by_rows ? M : N;
    const int len = gemm_block_len(dim), blocks = (dim + len - 1) / len;
    if ((int64_t)M * N * K < GEMM_SPLIT_WORK || blocks < 2) {
        cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, N);
        return;
    }
    int threads = nthreads(o) < blocks ? nthreads(o) : blocks;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int b = 0; b < blocks; b++) {
        const int lo = b * len, n = dim - lo < len ? dim - lo : len;
        if (by_rows) /* rows lo.. of C and of op(A) */
            cblas_sgemm(CblasRowMajor, ta, tb, n, N, K, alpha, tA ? A + lo : A + (int64_t)lo * K,
                        lda, B, ldb, beta, C + (int64_t)lo * N, N);
        else /* columns lo.. of C and of op(B) */
            cblas_sgemm(CblasRowMajor, ta, tb, M, n, K, alpha, A, lda,
                        tB ? B + (int64_t)lo * K : B + lo, ldb, beta, C + lo, N);
    }
}

static void cpu_matmul(const ust_ops *o, float *C, const float *A, const float *B, int M, int N,
                       int K, int tA, int tB, float alpha, float beta) {
    sgemm(o, C, A, B, M, N, K, tA, tB, alpha, beta);
}

static void cpu_matmul_batched(const ust_ops *o, float *C, const float *A, const float *B, int M,
                               int N, int K, int tA, int tB, float alpha, float beta, int batch,
                               int64_t strideA, int64_t strideB, int64_t strideC) {
    for (int i = 0; i < batch; i++)
        sgemm(o, C + i * strideC, A + i * strideA, B + i * strideB, M, N, K, tA, tB, alpha, beta);
}

/* C[N,N] = alpha op(A) op(A)^T + beta C: only the upper triangle is computed, by blocks of rows
 * (the block lengths of sgemm, from the shape alone, so the bits do not depend on the thread
 * count): block [lo, lo+n) is ssyrk's n x n diagonal block and one sgemm right of it, taken
 * dynamically by the threads (the first blocks have the most columns). The lower triangle is
 * then copied from the upper, so C is exactly symmetric. */
static void cpu_syrk(const ust_ops *o, float *C, const float *A, int N, int K, int tA, float alpha,
                     float beta) {
    if (N <= 0) return;
    if (K <= 0) { /* empty sum: C = beta C (BLAS rejects lda = 0) */
        for (int64_t i = 0; i < (int64_t)N * N; i++) C[i] = beta == 0.0f ? 0.0f : beta * C[i];
        return;
    }
    blas_threads(o);
    const CBLAS_TRANSPOSE ta = tA ? CblasTrans : CblasNoTrans;
    const int lda = tA ? N : K, len = gemm_block_len(N), blocks = (N + len - 1) / len;
    int threads = nthreads(o) < blocks ? nthreads(o) : blocks;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int b = 0; b < blocks; b++) {
        const int lo = b * len, n = N - lo < len ? N - lo : len, hi = lo + n;
        /* rows lo..hi of op(A): columns of A when tA */
        const float *Ab = tA ? A + lo : A + (int64_t)lo * K,
                    *Ar = tA ? A + hi : A + (int64_t)hi * K;
        cblas_ssyrk(CblasRowMajor, CblasUpper, ta, n, K, alpha, Ab, lda, beta,
                    C + (int64_t)lo * N + lo, N);
        if (hi < N) /* C[lo:hi, hi:N] = op(A)[lo:hi] op(A)[hi:N]^T */
            cblas_sgemm(CblasRowMajor, ta, tA ? CblasNoTrans : CblasTrans, n, N - hi, K, alpha, Ab,
                        lda, Ar, lda, beta, C + (int64_t)lo * N + hi, N);
    }
    /* the mirror by 32 x 32 tiles: the column reads of a row-by-row copy miss the cache */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads(o))
    for (int ib = 0; ib < N; ib += 32)
        for (int jb = 0; jb <= ib; jb += 32)
            for (int i = ib; i < ib + 32 && i < N; i++)
                for (int j = jb; j < jb + 32 && j < i; j++)
                    C[(int64_t)i * N + j] = C[(int64_t)j * N + i];
}

/* ---------------------------------------------------------------- linear */

/* out(N,OC) = inp(N,C) @ w(OC,C)^T + bias(OC) */
static void cpu_linear_fwd(const ust_ops *o, act *out_, const act *inp_, const float *w,
                           const float *bias, int N, int C, int OC) {
    float *out = out_;
    const float *inp = inp_;
    if (N == 1 && C > 0) { /* one token (decoding): OpenBLAS's GEMM would pack all of w first,
                              reading it twice and writing it once; GEMV streams it once */
        blas_threads(o);
        const int len = gemm_block_len(OC), blocks = (OC + len - 1) / len;
#pragma omp parallel for schedule(dynamic, 1)                                                      \
    num_threads(nthreads(o) < blocks ? nthreads(o) : blocks)
        for (int b = 0; b < blocks; b++) { /* output rows b*len.., each one dot over all of C */
            const int lo = b * len, n = OC - lo < len ? OC - lo : len;
            cblas_sgemv(CblasRowMajor, CblasNoTrans, n, C, 1.0f, w + (int64_t)lo * C, C, inp, 1,
                        0.0f, out + lo, 1);
        }
    } else {
        sgemm(o, out, inp, w, N, OC, C, 0, 1, 1.0f, 0.0f);
    }
    if (!bias) return;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int n = 0; n < N; n++) {
        float *row = out + (int64_t)n * OC;
        for (int c = 0; c < OC; c++) row[c] += bias[c];
    }
}

/* out(W) = (or += when acc) the column sums of in(N,W), in fp64, each thread owning a chunk of
 * columns and walking the rows in order (deterministic for any thread count). */
static void column_sums(const ust_ops *o, float *out, const float *in, int N, int W, int acc) {
    int nchunks = (W + COL_CHUNK - 1) / COL_CHUNK;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int cb = 0; cb < nchunks; cb++) {
        int c0 = cb * COL_CHUNK, nc = W - c0 < COL_CHUNK ? W - c0 : COL_CHUNK;
        double sum[COL_CHUNK] = {0};
        for (int n = 0; n < N; n++) {
            const float *row = in + (int64_t)n * W + c0;
            for (int c = 0; c < nc; c++) sum[c] += row[c];
        }
        for (int c = 0; c < nc; c++) out[c0 + c] = (acc ? out[c0 + c] : 0.0f) + (float)sum[c];
    }
}

/* dinp(N,C) = dout(N,OC) @ w(OC,C) (+= when acc_dinp); dw(OC,C) += dout^T @ inp;
 * dbias(OC) += column sums of dout. */
static void cpu_linear_bwd(const ust_ops *o, act *dinp_, float *dw, float *dbias, const act *dout_,
                           const act *inp_, const float *w, int N, int C, int OC, int acc_dinp) {
    float *dinp = dinp_;
    const float *dout = dout_;
    const float *inp = inp_;
    if (dinp) sgemm(o, dinp, dout, w, N, C, OC, 0, 0, 1.0f, acc_dinp ? 1.0f : 0.0f);
    if (dw) sgemm(o, dw, dout, inp, OC, C, N, 1, 0, 1.0f, 1.0f);
    if (dbias) column_sums(o, dbias, dout, N, OC, 1);
}

/* ---------------------------------------------------------------- grouped linear */

/* off[g]: the first row of group g in the packed rows (off[G]: all of them). */
static void group_offsets(const int32_t *M, int G, int64_t *off) {
    off[0] = 0;
    for (int g = 0; g < G; g++) off[g + 1] = off[g] + M[g];
}

/* One pass over the groups: with at least as many non-empty groups as threads, the threads
 * share the groups (dynamic: the groups' sizes differ), each group one single-threaded BLAS call
 * and its bias rows; with fewer, the groups in turn, each on every thread. Each group's result
 * depends only on its own rows and weights (never on the other groups or the thread count's
 * split of the groups). */
static int grouped_parallel(const ust_ops *o, const int32_t *M, int G) {
    int n = nthreads(o), busy = 0;
    for (int g = 0; g < G; g++) busy += M[g] > 0;
    if (n <= 1 || busy < n) return 0;
    blas_threads(o);
    return 1;
}

static void gemm1(float *C, const float *A, const float *B, int M, int N, int K, int tA, int tB,
                  float beta) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        for (int64_t i = 0; i < (int64_t)M * N; i++) C[i] = beta == 0.0f ? 0.0f : beta * C[i];
        return;
    }
    cblas_sgemm(CblasRowMajor, tA ? CblasTrans : CblasNoTrans, tB ? CblasTrans : CblasNoTrans, M, N,
                K, 1.0f, A, tA ? M : K, B, tB ? K : N, beta, C, N);
}

static void cpu_grouped_linear_fwd(const ust_ops *o, act *out_, const act *inp_,
                                   const float *const *w, const float *const *b, const int32_t *M,
                                   int G, int C, int OC) {
    float *out = out_;
    const float *inp = inp_;
    int64_t off[G + 1];
    group_offsets(M, G, off);
    if (!grouped_parallel(o, M, G)) {
        for (int g = 0; g < G; g++)
            if (M[g] > 0)
                cpu_linear_fwd(o, out + off[g] * OC, inp + off[g] * C, w[g], b ? b[g] : NULL, M[g],
                               C, OC);
        return;
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads(o))
    for (int g = 0; g < G; g++) {
        if (M[g] <= 0) continue;
        float *y = out + off[g] * OC;
        gemm1(y, inp + off[g] * C, w[g], M[g], OC, C, 0, 1, 0.0f);
        if (b && b[g])
            for (int64_t n = 0; n < M[g]; n++)
                for (int c = 0; c < OC; c++) y[n * OC + c] += b[g][c];
    }
}

static void cpu_grouped_linear_bwd(const ust_ops *o, act *dinp_, float *const *dw, float *const *db,
                                   const act *dout_, const act *inp_, const float *const *w,
                                   const int32_t *M, int G, int C, int OC, int acc_dinp) {
    float *dinp = dinp_;
    const float *dout = dout_, *inp = inp_;
    int64_t off[G + 1];
    group_offsets(M, G, off);
    if (!grouped_parallel(o, M, G)) {
        for (int g = 0; g < G; g++)
            if (M[g] > 0)
                cpu_linear_bwd(o, dinp ? (act *)(dinp + off[g] * C) : NULL, dw[g],
                               db ? db[g] : NULL, dout + off[g] * OC, inp + off[g] * C, w[g], M[g],
                               C, OC, acc_dinp);
        return;
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads(o))
    for (int g = 0; g < G; g++) {
        if (M[g] <= 0) continue;
        const float *d = dout + off[g] * OC, *x = inp + off[g] * C;
        if (dinp) gemm1(dinp + off[g] * C, d, w[g], M[g], C, OC, 0, 0, acc_dinp ? 1.0f : 0.0f);
        gemm1(dw[g], d, x, OC, C, M[g], 1, 0, 1.0f);
        if (db && db[g]) { /* column sums in fp64, rows in order (as column_sums) */
            for (int c = 0; c < OC; c++) {
                double sum = 0.0;
                for (int64_t n = 0; n < M[g]; n++) sum += d[n * OC + c];
                db[g][c] += (float)sum;
            }
        }
    }
}

/* ---------------------------------------------------------------- embedding */

/* out(B,T,C) = wte[tok - v_start] (0 when tok is outside [v_start, v_end)) + wpe[pos[t]] */
static void cpu_embedding_fwd(const ust_ops *o, act *out_, const int32_t *tok, const int32_t *pos,
                              const float *wte, const float *wpe, int B, int T, int C, int v_start,
                              int v_end) {
    float *out = out_;
    int64_t rows = (int64_t)B * T;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int64_t r = 0; r < rows; r++) {
        float *o_row = out + r * C;
        int t = (int)(r % T), id = tok[r];
        if (wte && id >= v_start && id < v_end) {
            const float *e = wte + (int64_t)(id - v_start) * C;
            for (int c = 0; c < C; c++) o_row[c] = e[c];
        } else {
            for (int c = 0; c < C; c++) o_row[c] = 0.0f;
        }
        if (wpe) {
            const float *p = wpe + (int64_t)(pos ? pos[r] : t) * C;
            for (int c = 0; c < C; c++) o_row[c] += p[c];
        }
    }
}

/* dwte[tok - v_start] += dout, dwpe[pos[r]] += dout; tokens repeat, so each thread owns a chunk
 * of columns and walks every row in order. */
static void cpu_embedding_bwd(const ust_ops *o, float *dwte, float *dwpe, const act *dout_,
                              const int32_t *tok, const int32_t *pos, int B, int T, int C,
                              int v_start, int v_end) {
    const float *dout = dout_;
    int64_t rows = (int64_t)B * T;
    int nchunks = (C + COL_CHUNK - 1) / COL_CHUNK;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int cb = 0; cb < nchunks; cb++) {
        int c0 = cb * COL_CHUNK, nc = C - c0 < COL_CHUNK ? C - c0 : COL_CHUNK;
        for (int64_t r = 0; r < rows; r++) {
            const float *g = dout + r * C + c0;
            int t = (int)(r % T), id = tok[r];
            if (dwte && id >= v_start && id < v_end) {
                float *d = dwte + (int64_t)(id - v_start) * C + c0;
                for (int c = 0; c < nc; c++) d[c] += g[c];
            }
            if (dwpe) {
                float *d = dwpe + (int64_t)(pos ? pos[r] : t) * C + c0;
                for (int c = 0; c < nc; c++) d[c] += g[c];
            }
        }
    }
}

/* ---------------------------------------------------------------- norms */

/* out = (x - mean) * rstd * w + b over rows of C; mean, rstd (N) saved for backward. */
static void cpu_layernorm_fwd(const ust_ops *o, act *out_, float *mean, float *rstd,
                              const act *inp_, const float *w, const float *b, int N, int C,
                              float eps) {
    float *out = out_;
    const float *inp = inp_;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int n = 0; n < N; n++) {
        const float *x = inp + (int64_t)n * C;
        float *y = out + (int64_t)n * C;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int c = 0; c < C; c++) s += x[c];
        float m = (float)(s / C);
        double v = 0.0;
#pragma omp simd reduction(+ : v)
        for (int c = 0; c < C; c++) v += (double)(x[c] - m) * (x[c] - m);
        float r = (float)(1.0 / sqrt(v / C + eps));
        for (int c = 0; c < C; c++) y[c] = (x[c] - m) * r * w[c] + (b ? b[c] : 0.0f);
        if (mean) mean[n] = m;
        if (rstd) rstd[n] = r;
    }
}

/* With xn = (x - mean) rstd and g = w * dout (llm.c):
 * dinp = rstd (g - mean(g) - xn mean(g xn)); dw += dout xn; db += dout. */
static void cpu_layernorm_bwd(const ust_ops *o, act *dinp_, float *dw, float *db, const act *dout_,
                              const act *inp_, const float *w, const float *mean, const float *rstd,
                              int N, int C) {
    float *dinp = dinp_;
    const float *dout = dout_;
    const float *inp = inp_;
    if (dinp) {
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
        for (int n = 0; n < N; n++) {
            const float *x = inp + (int64_t)n * C, *dy = dout + (int64_t)n * C;
            float *dx = dinp + (int64_t)n * C;
            float m = mean[n], r = rstd[n];
            double sg = 0.0, sgx = 0.0;
#pragma omp simd reduction(+ : sg, sgx)
            for (int c = 0; c < C; c++) {
                float g = w[c] * dy[c];
                sg += g;
                sgx += (double)g * ((x[c] - m) * r);
            }
            float mg = (float)(sg / C), mgx = (float)(sgx / C);
            for (int c = 0; c < C; c++) {
                float xn = (x[c] - m) * r;
                dx[c] = (w[c] * dy[c] - mg - xn * mgx) * r;
            }
        }
    }
    if (!dw && !db) return;
    int nchunks = (C + COL_CHUNK - 1) / COL_CHUNK;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int cb = 0; cb < nchunks; cb++) {
        int c0 = cb * COL_CHUNK, nc = C - c0 < COL_CHUNK ? C - c0 : COL_CHUNK;
        double aw[COL_CHUNK] = {0}, ab[COL_CHUNK] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (int64_t)n * C + c0, *dy = dout + (int64_t)n * C + c0;
            float m = mean[n], r = rstd[n];
            for (int c = 0; c < nc; c++) {
                aw[c] += (double)dy[c] * ((x[c] - m) * r);
                ab[c] += dy[c];
            }
        }
        for (int c = 0; c < nc; c++) {
            if (dw) dw[c0 + c] += (float)aw[c];
            if (db) db[c0 + c] += (float)ab[c];
        }
    }
}

/* out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps). */
static void cpu_rmsnorm_fwd(const ust_ops *o, act *out_, float *rstd, const act *inp_,
                            const float *w, int N, int C, float eps) {
    float *out = out_;
    const float *inp = inp_;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int n = 0; n < N; n++) {
        const float *x = inp + (int64_t)n * C;
        float *y = out + (int64_t)n * C;
        double ss = 0.0;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        float r = (float)(1.0 / sqrt(ss / C + eps));
        for (int c = 0; c < C; c++) y[c] = x[c] * r * w[c];
        if (rstd) rstd[n] = r;
    }
}

/* d rstd / d x_k = -rstd^3 x_k / C, so with g = w * dout:
 * dinp = rstd (g - x rstd^2 mean(g x)); dw += dout x rstd. */
static void cpu_rmsnorm_bwd(const ust_ops *o, act *dinp_, float *dw, const act *dout_,
                            const act *inp_, const float *w, const float *rstd, int N, int C) {
    float *dinp = dinp_;
    const float *dout = dout_;
    const float *inp = inp_;
    if (dinp) {
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
        for (int n = 0; n < N; n++) {
            const float *x = inp + (int64_t)n * C, *dy = dout + (int64_t)n * C;
            float *dx = dinp + (int64_t)n * C;
            float r = rstd[n];
            double sgx = 0.0;
#pragma omp simd reduction(+ : sgx)
            for (int c = 0; c < C; c++) sgx += (double)(w[c] * dy[c]) * x[c];
            float k = (float)(sgx / C) * r * r;
            for (int c = 0; c < C; c++) dx[c] = (w[c] * dy[c] - x[c] * k) * r;
        }
    }
    if (!dw) return;
    int nchunks = (C + COL_CHUNK - 1) / COL_CHUNK;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int cb = 0; cb < nchunks; cb++) {
        int c0 = cb * COL_CHUNK, nc = C - c0 < COL_CHUNK ? C - c0 : COL_CHUNK;
        double aw[COL_CHUNK] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (int64_t)n * C + c0, *dy = dout + (int64_t)n * C + c0;
            float r = rstd[n];
            for (int c = 0; c < nc; c++) aw[c] += (double)dy[c] * (x[c] * r);
        }
        for (int c = 0; c < nc; c++) dw[c0 + c] += (float)aw[c];
    }
}

/* ---------------------------------------------------------------- activations */

/* exp for x <= 88 (Cephes expf: 2^n times a degree-6 polynomial, ~1 ulp), written so that a
 * loop over it vectorizes, each lane computing exactly what the scalar code does (so results do
 * not depend on where a thread's chunk starts); x < -87 (including -inf, a masked key) gives
 * exactly 0. */
static inline float exp_vec(float x) {
    int under = x < -87.0f;
    x = under ? -87.0f : (x > 88.0f ? 88.0f : x);
    /* round to nearest by adding 1.5 * 2^23 (floorf would not vectorize) */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    union {
        int32_t i;
        float f;
    } s = {.i = ((int32_t)n + 127) << 23};
    return under ? 0.0f : y * s.f;
}

/* tanh(u) = 1 - 2 / (e^(2u) + 1) through exp_vec: vectorizes where libm's tanhf (a call) does
 * not. Absolute error ~1e-7, which is what GELU needs: it uses 1 + t and 1 - t^2. */
static inline float tanh_vec(float u) { return 1.0f - 2.0f / (exp_vec(2.0f * u) + 1.0f); }

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

static void cpu_gelu_fwd(const ust_ops *o, act *out_, const act *inp_, int64_t n) {
    float *out = out_;
    const float *inp = inp_;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanh_vec(GELU_K * (x + 0.044715f * x * x * x)));
    }
}

static void cpu_linear_gelu_fwd(const ust_ops *o, act *up_, act *out_, const act *inp_,
                                const float *w, const float *bias, int N, int C, int OC) {
    float *up = up_;
    float *out = out_;
    const float *inp = inp_;
    cpu_linear_fwd(o, up, inp, w, bias, N, C, OC);
    cpu_gelu_fwd(o, out, up, (int64_t)N * OC);
}

/* d/dx of 0.5 x (1 + tanh(u)), u = k (x + a x^3): 0.5 (1 + tanh u) + 0.5 x sech^2(u) k (1 + 3a x^2)
 */
static void cpu_gelu_bwd(const ust_ops *o, act *dinp_, const act *inp_, const act *dout_,
                         int64_t n) {
    float *dinp = dinp_;
    const float *inp = inp_;
    const float *dout = dout_;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        float t = tanh_vec(GELU_K * (x + 0.044715f * x * x * x));
        float sech2 = 1.0f - t * t;
        float g = 0.5f * (1.0f + t) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = g * dout[i];
    }
}

/* The down-projection's backward into dup, then the GELU's backward in place (elementwise). */
static void cpu_linear_gelu_bwd(const ust_ops *o, act *dup, float *dw, float *dbias,
                                const act *dout, const act *inp, const act *up, const float *w,
                                int N, int OC, int C) {
    cpu_linear_bwd(o, dup, dw, dbias, dout, inp, w, N, OC, C, 0);
    cpu_gelu_bwd(o, dup, up, dup, (int64_t)N * OC);
}

static void cpu_swiglu_fwd(const ust_ops *o, act *out_, const act *gate_, const act *up_,
                           int64_t n) {
    float *out = out_;
    const float *gate = gate_;
    const float *up = up_;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* silu'(g) = sig(g) (1 + g (1 - sig(g))) */
static void cpu_swiglu_bwd(const ust_ops *o, act *dgate_, act *dup_, const act *dout_,
                           const act *gate_, const act *up_, int64_t n) {
    float *dgate = dgate_;
    float *dup = dup_;
    const float *dout = dout_;
    const float *gate = gate_;
    const float *up = up_;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], u = up[i], dy = dout[i];
        float sig = 1.0f / (1.0f + expf(-g));
        if (dgate) dgate[i] = dy * u * sig * (1.0f + g * (1.0f - sig));
        if (dup) dup[i] = dy * g * sig;
    }
}

/* GeGLU: out = gelu(g) u with gelu as cpu_gelu_fwd's tanh form (torch's gelu_pytorch_tanh) */
static void cpu_geglu_fwd(const ust_ops *o, act *out_, const act *gate_, const act *up_,
                          int64_t n) {
    float *out = out_;
    const float *gate = gate_;
    const float *up = up_;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int64_t i = 0; i < n; i++) {
        float x = gate[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x))) * up[i];
    }
}

/* d gate = dy u gelu'(g) (gelu' as cpu_gelu_bwd's), d up = dy gelu(g) */
static void cpu_geglu_bwd(const ust_ops *o, act *dgate_, act *dup_, const act *dout_,
                          const act *gate_, const act *up_, int64_t n) {
    float *dgate = dgate_;
    float *dup = dup_;
    const float *dout = dout_;
    const float *gate = gate_;
    const float *up = up_;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int64_t i = 0; i < n; i++) {
        float x = gate[i], dy = dout[i];
        float t = tanhf(GELU_K * (x + 0.044715f * x * x * x));
        float g = 0.5f * (1.0f + t) +
                  0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        if (dgate) dgate[i] = dy * up[i] * g;
        if (dup) dup[i] = dy * 0.5f * x * (1.0f + t);
    }
}

/* ---------------------------------------------------------------- RoPE */

#define ROPE_DMAX 1024

/* Rotates pairs (x_i, x_{i+D/2}) by angle pos * inv_freq(i) (sign = +1) or by its inverse
 * (sign = -1). Angles are computed in double once per token and reused over heads. */
static void rope_apply(const ust_ops *o, float *out, const float *inp, const int32_t *pos, int B,
                       int T, int H, int D, const ust_rope *rope, double sign) {
    UST_ASSERT(D % 2 == 0 && D <= ROPE_DMAX, "rope needs an even head dim <= %d, got D=%d",
               ROPE_DMAX, D);
    int R = rope->rot > 0 ? rope->rot : D, half = R / 2; /* model.partial_rotary_factor: R < D */
    int64_t rows = (int64_t)B * T;
    double inv_freq[ROPE_DMAX / 2], as = rope->attn > 0 ? rope->attn : 1.0; /* YaRN's scale */
    for (int i = 0; i < half; i++) inv_freq[i] = ust_rope_inv_freq(rope, i, R);
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int64_t r = 0; r < rows; r++) {
        float cs[ROPE_DMAX / 2], sn[ROPE_DMAX / 2];
        int t = (int)(r % T);
        double p = pos ? pos[r] : t;
        for (int i = 0; i < half; i++) {
            double a = p * inv_freq[i];
            cs[i] = (float)(as * cos(a));
            sn[i] = (float)(as * sign * sin(a));
        }
        for (int h = 0; h < H; h++) {
            const float *x = inp + (r * H + h) * D;
            float *y = out + (r * H + h) * D;
            for (int i = 0; i < half; i++) {
                float x1 = x[i], x2 = x[i + half];
                y[i] = x1 * cs[i] - x2 * sn[i];
                y[i + half] = x2 * cs[i] + x1 * sn[i];
            }
            for (int i = R; i < D && y != x; i++) y[i] = x[i];
        }
    }
}

static void cpu_rope_fwd(const ust_ops *o, act *out_, const act *inp_, const int32_t *pos, int B,
                         int T, int H, int D, const ust_rope *rope) {
    float *out = out_;
    const float *inp = inp_;
    rope_apply(o, out, inp, pos, B, T, H, D, rope, 1.0);
}

static void cpu_rope_bwd(const ust_ops *o, act *dinp_, const act *dout_, const int32_t *pos, int B,
                         int T, int H, int D, const ust_rope *rope) {
    float *dinp = dinp_;
    const float *dout = dout_;
    rope_apply(o, dinp, dout, pos, B, T, H, D, rope, -1.0);
}

/* ---------------------------------------------------------------- attention */

/* Work is cut into tiles whose boundaries do not depend on the thread count: ATT_QT queries of
 * one head (forward, dq) or ATT_KB keys of one kv head (dk/dv). A key block is transposed to
 * (D, ATT_KB) once per tile so that scores, exp and the softmax sums vectorize over keys. */
#define ATT_QT 64
#define ATT_KB 64

static inline float dotf(const float *a, const float *b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

/* Positions default to indices when not given. */
static inline int posof(const int32_t *p, int i) { return p ? p[i] : i; }

/* xt[d * ATT_KB + jj] = rows[jj * stride + d] for jj < nj, 0 for the padding jj >= nj. */
static void transpose_block(float *xt, const float *rows, int64_t stride, int nj, int D) {
    for (int d = 0; d < D; d++) {
        float *dst = xt + (int64_t)d * ATT_KB;
        for (int jj = 0; jj < nj; jj++) dst[jj] = rows[jj * stride + d];
        for (int jj = nj; jj < ATT_KB; jj++) dst[jj] = 0.0f;
    }
}

/* Accumulator chunks of this many floats stay in one vector register across a loop over keys. */
#define ATT_VW 16

/* s[jj] = scale * q . k_{j0+jj}, soft-capped to cap tanh(s / cap) when cap > 0, or -inf where
 * the key is padding or masked: after the query (qp, causal) or before its document's start (qs;
 * INT_MIN without documents). The cap comes before the mask: capping the mask's -inf would give
 * -cap, a visible key. Forward and backward both use this, so they see bitwise the same scores. */
static inline void block_scores(float *restrict s, const float *restrict q,
                                const float *restrict kt, int j0, int nj, int D, float scale,
                                float cap, int causal, const int32_t *k_pos, int qp, int qs) {
    for (int c0 = 0; c0 < ATT_KB; c0 += ATT_VW) {
        float a[ATT_VW] = {0};
        for (int d = 0; d < D; d++) {
            float qd = q[d];
            const float *kd = kt + (int64_t)d * ATT_KB + c0;
#pragma omp simd
            for (int x = 0; x < ATT_VW; x++) a[x] += qd * kd[x];
        }
        for (int x = 0; x < ATT_VW; x++) s[c0 + x] = a[x];
    }
    for (int jj = 0; jj < ATT_KB; jj++) {
        int kp = jj < nj ? posof(k_pos, j0 + jj) : 0; /* padding: no position to read */
        int vis = jj < nj && !(causal && kp > qp) && kp >= qs;
        float x = s[jj] * scale;
        s[jj] = !vis ? -INFINITY : cap > 0 ? cap * tanhf(x / cap) : x;
    }
}

/* d(capped score) / d(score) from the capped score s: 1 - tanh^2 = 1 - (s / cap)^2 (1 without a
 * cap; 0 for a masked key, whose probability is 0 anyway: this keeps 0 * inf out). */
static inline float cap_slope(float s, float cap) {
    float t = s / cap;
    return cap <= 0 ? 1.0f : s == -INFINITY ? 0.0f : 1.0f - t * t;
}

/* acc[d] += sum_{jj < nj} w[jj] * rows[jj * stride + d], a chunk of acc at a time in registers. */
static inline void block_axpy(float *restrict acc, const float *restrict w,
                              const float *restrict rows, int64_t stride, int nj, int D) {
    int d0 = 0;
    for (; d0 + ATT_VW <= D; d0 += ATT_VW) {
        float a[ATT_VW];
        for (int x = 0; x < ATT_VW; x++) a[x] = acc[d0 + x];
        for (int jj = 0; jj < nj; jj++) {
            float wj = w[jj];
            const float *r = rows + jj * stride + d0;
#pragma omp simd
            for (int x = 0; x < ATT_VW; x++) a[x] += wj * r[x];
        }
        for (int x = 0; x < ATT_VW; x++) acc[d0 + x] = a[x];
    }
    for (int jj = 0; d0 < D && jj < nj; jj++)
        for (int d = d0; d < D; d++) acc[d] += w[jj] * rows[jj * stride + d];
}

/* Smallest key position in [j0, j0 + nj): a query before it sees nothing of the block. */
static int block_min_pos(const int32_t *k_pos, int j0, int nj) {
    int mn = posof(k_pos, j0);
    for (int jj = 1; jj < nj; jj++) mn = posof(k_pos, j0 + jj) < mn ? posof(k_pos, j0 + jj) : mn;
    return mn;
}

/* Largest key position in [j0, j0 + nj): a query whose document starts after it sees nothing. */
static int block_max_pos(const int32_t *k_pos, int j0, int nj) {
    int mx = posof(k_pos, j0);
    for (int jj = 1; jj < nj; jj++) mx = posof(k_pos, j0 + jj) > mx ? posof(k_pos, j0 + jj) : mx;
    return mx;
}

/* Where query i of sequence b's document starts (INT_MIN: no document masking). */
static inline int doc_start(const int32_t *q_start, int b, int Tq, int i) {
    return q_start ? q_start[(int64_t)b * Tq + i] : INT_MIN;
}

/* One scratch area per thread, sized for the larger of the forward and backward tiles. */
static float *att_scratch(const ust_ops *o, int D, size_t *per_thread) {
    *per_thread = (size_t)4 * ATT_KB * D + (size_t)ATT_QT * D + 4 * ATT_KB + 4 * ATT_QT;
    size_t bytes = *per_thread * sizeof(float) * nthreads(o);
    float *p = malloc(bytes);
    if (!p) ust_fatal(UST_EXIT_RUNTIME, "out of memory allocating %zu bytes (attention)", bytes);
    return p;
}

/* What every attention tile reads: one call's shapes, strides, scale and masks. */
typedef struct {
    int B, Tq, Tk, H, G, D, nqt, nkb, causal;
    float scale, cap;         /* cap: model.attn_softcap (0: none) */
    int64_t kstride, qstride; /* floats between rows of k/v (Hkv * D) and of q/out (H * D) */
    const int32_t *q_pos, *k_pos, *q_start;
} att_geom;

static att_geom att_geom_make(int B, int Tq, int Tk, int H, int Hkv, int D, const int32_t *q_pos,
                              const int32_t *k_pos, int causal, const int32_t *q_start, float cap) {
    UST_ASSERT(Hkv > 0 && H % Hkv == 0 && D > 0, "H=%d must be a multiple of Hkv=%d (D=%d)", H, Hkv,
               D);
    att_geom g = {.B = B,
                  .Tq = Tq,
                  .Tk = Tk,
                  .H = H,
                  .G = H / Hkv,
                  .D = D,
                  .causal = causal,
                  .nqt = (Tq + ATT_QT - 1) / ATT_QT,
                  .nkb = (Tk + ATT_KB - 1) / ATT_KB,
                  .scale = 1.0f / sqrtf((float)D),
                  .cap = cap,
                  .kstride = (int64_t)Hkv * D,
                  .qstride = (int64_t)H * D,
                  .q_pos = q_pos,
                  .k_pos = k_pos,
                  .q_start = q_start};
    return g;
}

/* Query tile `task` = (b, h, tile): its first query i0, ni queries, and the latest position and
 * earliest document start among them (what decides whether a key block can be skipped). */
typedef struct {
    int b, h, i0, ni, qpmax, qsmin;
} att_qtile;

static att_qtile att_qtile_of(const att_geom *g, int64_t task) {
    att_qtile t = {.b = (int)(task / g->nqt / g->H), .h = (int)(task / g->nqt % g->H)};
    t.i0 = (int)(task % g->nqt) * ATT_QT;
    t.ni = g->Tq - t.i0 < ATT_QT ? g->Tq - t.i0 : ATT_QT;
    t.qpmax = posof(g->q_pos, t.i0), t.qsmin = doc_start(g->q_start, t.b, g->Tq, t.i0);
    for (int x = 0; x < t.ni; x++) {
        int qp = posof(g->q_pos, t.i0 + x), qs = doc_start(g->q_start, t.b, g->Tq, t.i0 + x);
        t.qpmax = qp > t.qpmax ? qp : t.qpmax;
        t.qsmin = qs < t.qsmin ? qs : t.qsmin;
    }
    return t;
}

/* The extent [kpmin, kpmax] of key block [j0, j0 + nj) as far as the masks care. */
static void att_block_extent(const att_geom *g, int j0, int nj, int *kpmin, int *kpmax) {
    *kpmin = g->causal ? block_min_pos(g->k_pos, j0, nj) : 0;
    *kpmax = g->q_start ? block_max_pos(g->k_pos, j0, nj) : INT_MAX;
}

/* dp(ATT_KB) = dout_i . v_j for the block's keys, v transposed to vt(D, ATT_KB). */
static inline void block_dp(float *restrict dp, const float *restrict doi, const float *restrict vt,
                            int D) {
    for (int jj = 0; jj < ATT_KB; jj++) dp[jj] = 0.0f;
    for (int d = 0; d < D; d++) {
        float g = doi[d];
        const float *vd = vt + (int64_t)d * ATT_KB;
#pragma omp simd
        for (int jj = 0; jj < ATT_KB; jj++) dp[jj] += g * vd[jj];
    }
}

/* One query row against one key block: the online-softmax update of its max *m, sum *l and
 * unnormalized output ai(D); vrows the block's value rows. */
static void att_fwd_row(const att_geom *g, float *ai, float *m, float *l, const float *qi,
                        const float *kt, const float *vrows, int j0, int nj, int qp, int qs) {
    float s[ATT_KB];
    block_scores(s, qi, kt, j0, nj, g->D, g->scale, g->cap, g->causal, g->k_pos, qp, qs);
    float bm = -INFINITY;
    int nan = 0;
#pragma omp simd reduction(max : bm) reduction(| : nan)
    for (int jj = 0; jj < ATT_KB; jj++) {
        bm = s[jj] > bm ? s[jj] : bm;
        nan |= s[jj] != s[jj];
    }
    if (nan) {         /* a NaN score (a non-finite weight): the row's output and lse become NaN, */
        *m = *l = NAN; /* where the max alone would drop it and could skip the block as hidden */
        return;
    }
    if (bm == -INFINITY) return; /* nothing visible in this block */
    if (bm > *m) {
        float c = exp_vec(*m - bm); /* 0 on the first visible block (acc = l = 0) */
        *l *= c;
        for (int d = 0; d < g->D; d++) ai[d] *= c;
        *m = bm;
    }
    float mt = *m, ls = 0.0f;
#pragma omp simd reduction(+ : ls)
    for (int jj = 0; jj < ATT_KB; jj++) {
        s[jj] = exp_vec(s[jj] - mt); /* now the unnormalized probability */
        ls += s[jj];
    }
    *l += ls;
    block_axpy(ai, s, vrows, g->kstride, nj, g->D);
}

/* The forward of one query tile; ws is this thread's scratch. */
static void att_fwd_tile(const att_geom *g, float *ws, float *out, float *lse, const float *q,
                         const float *k, const float *v, int64_t task) {
    const int D = g->D;
    att_qtile t = att_qtile_of(g, task);
    float *kt = ws, *acc = kt + (size_t)ATT_KB * D, *m = acc + (size_t)ATT_QT * D, *l = m + ATT_QT;
    const int64_t base = (int64_t)t.b * g->Tk * g->kstride + (int64_t)(t.h / g->G) * D;
    for (int x = 0; x < t.ni; x++) {
        m[x] = -INFINITY, l[x] = 0.0f;
        for (int d = 0; d < D; d++) acc[x * D + d] = 0.0f;
    }
    for (int j0 = 0; j0 < g->Tk; j0 += ATT_KB) {
        int nj = g->Tk - j0 < ATT_KB ? g->Tk - j0 : ATT_KB, kpmin, kpmax;
        att_block_extent(g, j0, nj, &kpmin, &kpmax);
        if (g->causal && kpmin > t.qpmax) continue; /* the whole tile is before this block */
        if (kpmax < t.qsmin) continue;              /* every query's document starts after it */
        transpose_block(kt, k + base + j0 * g->kstride, g->kstride, nj, D);
        for (int x = 0; x < t.ni; x++) {
            int qp = posof(g->q_pos, t.i0 + x), qs = doc_start(g->q_start, t.b, g->Tq, t.i0 + x);
            if ((g->causal && kpmin > qp) || kpmax < qs) continue;
            const float *qi = q + ((int64_t)t.b * g->Tq + t.i0 + x) * g->qstride + (int64_t)t.h * D;
            att_fwd_row(g, acc + x * D, &m[x], &l[x], qi, kt, v + base + j0 * g->kstride, j0, nj,
                        qp, qs);
        }
    }
    for (int x = 0; x < t.ni; x++) {
        float *oi = out + ((int64_t)t.b * g->Tq + t.i0 + x) * g->qstride + (int64_t)t.h * D;
        float *li = lse + ((int64_t)t.b * g->H + t.h) * g->Tq + t.i0 + x;
        if (l[x] == 0.0f) { /* the query sees no key (a NaN sum is carried to out and lse) */
            for (int d = 0; d < D; d++) oi[d] = 0.0f;
            *li = -INFINITY;
        } else {
            float inv = 1.0f / l[x];
            for (int d = 0; d < D; d++) oi[d] = acc[x * D + d] * inv;
            *li = m[x] + logf(l[x]);
        }
    }
}

/* For each (b, h, query i), an online softmax over key blocks: running max m, running sum l and
 * an unnormalized output accumulator, rescaled by exp(m_old - m_new) when the max grows.
 * out = acc / l, lse = m + log l. No Tq x Tk buffer exists. */
static void cpu_attention_fwd(const ust_ops *o, act *out, float *lse, const act *q, const act *k,
                              const act *v, int B, int Tq, int Tk, int H, int Hkv, int D,
                              const int32_t *q_pos, const int32_t *k_pos, int causal,
                              const int32_t *q_start, float softcap) {
    const att_geom g = att_geom_make(B, Tq, Tk, H, Hkv, D, q_pos, k_pos, causal, q_start, softcap);
    const int64_t tasks = (int64_t)B * H * g.nqt; /* (b, h, query tile) */
    size_t per;
    float *scratch = att_scratch(o, D, &per);
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int64_t task = 0; task < tasks; task++)
        att_fwd_tile(&g, scratch + per * omp_get_thread_num(), out, lse, q, k, v, task);
    free(scratch);
}

/* The largest visible score of query tile `task` (-INFINITY: none visible; a NaN score stays
 * NaN: every later comparison with it is false). kt: this thread's ATT_KB x D scratch. */
static float att_max_tile(const att_geom *g, float *kt, const float *q, const float *k,
                          int64_t task) {
    att_qtile t = att_qtile_of(g, task);
    const int64_t base = (int64_t)t.b * g->Tk * g->kstride + (int64_t)(t.h / g->G) * g->D;
    float best = -INFINITY, s[ATT_KB];
    for (int j0 = 0; j0 < g->Tk; j0 += ATT_KB) {
        int nj = g->Tk - j0 < ATT_KB ? g->Tk - j0 : ATT_KB, kpmin, kpmax;
        att_block_extent(g, j0, nj, &kpmin, &kpmax);
        if ((g->causal && kpmin > t.qpmax) || kpmax < t.qsmin) continue;
        transpose_block(kt, k + base + j0 * g->kstride, g->kstride, nj, g->D);
        for (int x = 0; x < t.ni; x++) {
            int qp = posof(g->q_pos, t.i0 + x), qs = doc_start(g->q_start, t.b, g->Tq, t.i0 + x);
            if ((g->causal && kpmin > qp) || kpmax < qs) continue;
            const float *qi =
                q + ((int64_t)t.b * g->Tq + t.i0 + x) * g->qstride + (int64_t)t.h * g->D;
            block_scores(s, qi, kt, j0, nj, g->D, g->scale, 0.0f, g->causal, g->k_pos, qp, qs);
            for (int jj = 0; jj < nj; jj++) best = s[jj] > best || s[jj] != s[jj] ? s[jj] : best;
        }
    }
    return best;
}

/* A second pass over the scores, not a side output of cpu_attention_fwd (ops.h says why). The raw
 * scores, before any model.attn_softcap: QK-clip bounds what q and k make. */
static void cpu_attention_logit_max(const ust_ops *o, float *mx, const act *q, const act *k, int B,
                                    int Tq, int Tk, int H, int Hkv, int D, const int32_t *q_pos,
                                    const int32_t *k_pos, int causal, const int32_t *q_start) {
    (void)o;
    const att_geom g = att_geom_make(B, Tq, Tk, H, Hkv, D, q_pos, k_pos, causal, q_start, 0.0f);
    const int64_t tasks = (int64_t)B * H * g.nqt;
    int nt = omp_get_max_threads(); /* the backend set the rank's threads (ops_cpu_create) */
    float *best = malloc((size_t)tasks * sizeof(float)),
          *kt = malloc((size_t)nt * ATT_KB * D * sizeof(float));
    if (!best || !kt) ust_fatal(UST_EXIT_RUNTIME, "out of memory (attention logit max)");
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t task = 0; task < tasks; task++)
        best[task] = att_max_tile(&g, kt + (size_t)omp_get_thread_num() * ATT_KB * D, q, k, task);
    for (int64_t task = 0; task < tasks; task++) {
        float *m = &mx[task / g.nqt % H], v = best[task];
        *m = v > *m || v != v ? v : *m;
    }
    free(best);
    free(kt);
}

/* The input of a backward tile: the forward's tensors and the output gradient. */
typedef struct {
    const float *dout, *out, *lse, *q, *k, *v;
} att_saved;

/* dq of one query tile: acc(ni, D) = sum_j ds_ij k_j over the visible key blocks. */
static void att_dq_tile(const att_geom *g, float *ws, float *dq, const att_saved *a, int64_t task) {
    const int D = g->D;
    att_qtile t = att_qtile_of(g, task);
    float *kt = ws, *vt = kt + (size_t)ATT_KB * D, *acc = vt + (size_t)ATT_KB * D;
    float *Dv = acc + (size_t)ATT_QT * D, s[ATT_KB], dp[ATT_KB];
    const int64_t base = (int64_t)t.b * g->Tk * g->kstride + (int64_t)(t.h / g->G) * D;
    const float *lrow = a->lse + ((int64_t)t.b * g->H + t.h) * g->Tq + t.i0;
    for (int x = 0; x < t.ni; x++) {
        int64_t off = ((int64_t)t.b * g->Tq + t.i0 + x) * g->qstride + (int64_t)t.h * D;
        Dv[x] = dotf(a->dout + off, a->out + off, D);
        for (int d = 0; d < D; d++) acc[x * D + d] = 0.0f;
    }
    for (int j0 = 0; j0 < g->Tk; j0 += ATT_KB) {
        int nj = g->Tk - j0 < ATT_KB ? g->Tk - j0 : ATT_KB, kpmin, kpmax;
        att_block_extent(g, j0, nj, &kpmin, &kpmax);
        if ((g->causal && kpmin > t.qpmax) || kpmax < t.qsmin) continue;
        transpose_block(kt, a->k + base + j0 * g->kstride, g->kstride, nj, D);
        transpose_block(vt, a->v + base + j0 * g->kstride, g->kstride, nj, D);
        for (int x = 0; x < t.ni; x++) {
            int qp = posof(g->q_pos, t.i0 + x), qs = doc_start(g->q_start, t.b, g->Tq, t.i0 + x);
            float L = lrow[x], Di = Dv[x];
            if (L == -INFINITY || (g->causal && kpmin > qp) || kpmax < qs) continue;
            int64_t off = ((int64_t)t.b * g->Tq + t.i0 + x) * g->qstride + (int64_t)t.h * D;
            block_scores(s, a->q + off, kt, j0, nj, D, g->scale, g->cap, g->causal, g->k_pos, qp,
                         qs);
            block_dp(dp, a->dout + off, vt, D);
#pragma omp simd
            for (int jj = 0; jj < ATT_KB;
                 jj++) /* s becomes ds (of the raw score: the cap's slope) */
                s[jj] = exp_vec(s[jj] - L) * (dp[jj] - Di) * cap_slope(s[jj], g->cap);
            block_axpy(acc + x * D, s, a->k + base + j0 * g->kstride, g->kstride, nj, D);
        }
    }
    for (int x = 0; x < t.ni; x++) {
        float *dqi = dq + ((int64_t)t.b * g->Tq + t.i0 + x) * g->qstride + (int64_t)t.h * D;
        for (int d = 0; d < D; d++) dqi[d] += acc[x * D + d] * g->scale;
    }
}

/* One query row's share of a key block's gradients: dvt += p dout_i, dkt += ds q_i, both (D,
 * ATT_KB). */
static void att_dkv_row(const att_geom *g, float *dkt, float *dvt, const float *kt, const float *vt,
                        const float *qi, const float *doi, float L, float Di, int j0, int nj,
                        int qp, int qs) {
    float s[ATT_KB], dp[ATT_KB], p[ATT_KB];
    block_scores(s, qi, kt, j0, nj, g->D, g->scale, g->cap, g->causal, g->k_pos, qp, qs);
    block_dp(dp, doi, vt, g->D);
#pragma omp simd
    for (int jj = 0; jj < ATT_KB; jj++) {
        p[jj] = exp_vec(s[jj] - L);
        s[jj] = p[jj] * (dp[jj] - Di) * cap_slope(s[jj], g->cap); /* ds of the raw score */
    }
    for (int d = 0; d < g->D; d++) {
        float gd = doi[d], qd = qi[d];
        float *dvd = dvt + (int64_t)d * ATT_KB, *dkd = dkt + (int64_t)d * ATT_KB;
#pragma omp simd
        for (int jj = 0; jj < ATT_KB; jj++) {
            dvd[jj] += p[jj] * gd;
            dkd[jj] += s[jj] * qd;
        }
    }
}

/* dk, dv of key block `task` = (b, kv head, block), walking the queries of every head in its
 * group. */
static void att_dkv_block(const att_geom *g, float *ws, float *dk, float *dv, const att_saved *a,
                          int64_t task) {
    const int D = g->D, Hkv = g->H / g->G;
    int jb = (int)(task % g->nkb), hk = (int)(task / g->nkb % Hkv), b = (int)(task / g->nkb / Hkv);
    int j0 = jb * ATT_KB, nj = g->Tk - j0 < ATT_KB ? g->Tk - j0 : ATT_KB, kpmin, kpmax;
    float *kt = ws, *vt = kt + (size_t)ATT_KB * D;
    float *dkt = vt + (size_t)ATT_KB * D, *dvt = dkt + (size_t)ATT_KB * D;
    const int64_t kv = ((int64_t)b * g->Tk + j0) * g->kstride + (int64_t)hk * D;
    att_block_extent(g, j0, nj, &kpmin, &kpmax);
    transpose_block(kt, a->k + kv, g->kstride, nj, D);
    transpose_block(vt, a->v + kv, g->kstride, nj, D);
    for (int64_t x = 0; x < (int64_t)ATT_KB * D; x++) dkt[x] = dvt[x] = 0.0f;
    for (int h = hk * g->G; h < (hk + 1) * g->G; h++) {
        for (int i = 0; i < g->Tq; i++) {
            int qp = posof(g->q_pos, i), qs = doc_start(g->q_start, b, g->Tq, i);
            float L = a->lse[((int64_t)b * g->H + h) * g->Tq + i];
            if (L == -INFINITY || (g->causal && kpmin > qp) || kpmax < qs) continue;
            int64_t off = ((int64_t)b * g->Tq + i) * g->qstride + (int64_t)h * D;
            float Di = dotf(a->dout + off, a->out + off, D);
            att_dkv_row(g, dkt, dvt, kt, vt, a->q + off, a->dout + off, L, Di, j0, nj, qp, qs);
        }
    }
    for (int jj = 0; jj < nj; jj++) {
        int64_t off = ((int64_t)b * g->Tk + j0 + jj) * g->kstride + (int64_t)hk * D;
        if (dk)
            for (int d = 0; d < D; d++) dk[off + d] += dkt[(int64_t)d * ATT_KB + jj] * g->scale;
        if (dv)
            for (int d = 0; d < D; d++) dv[off + d] += dvt[(int64_t)d * ATT_KB + jj];
    }
}

/* With p_ij = exp(s_ij - lse_i) (lse is final, after any merge, so p is the true probability
 * over all keys) and D_i = dout_i . out_i:
 *   dv_j += sum_i p_ij dout_i;  ds_ij = p_ij (dout_i . v_j - D_i) (times 1 - (s_ij / c)^2 under
 *   a soft-cap c, s_ij the capped score: the gradient of the raw score);
 *   dq_i += scale sum_j ds_ij k_j;  dk_j += scale sum_i ds_ij q_i.
 * Two passes, each writing its outputs from one thread only: dq over (b, h, query tile), then
 * dk/dv over (b, kv head, key block) walking the queries of every head in the group. The scores
 * are recomputed in the second pass; that costs flops but needs neither atomics nor per-thread
 * copies of dk/dv, and the result does not depend on the thread count. */
static void cpu_attention_bwd(const ust_ops *o, act *dq, act *dk, act *dv, const act *dout,
                              const act *out, const float *lse, const act *q, const act *k,
                              const act *v, int B, int Tq, int Tk, int H, int Hkv, int D,
                              const int32_t *q_pos, const int32_t *k_pos, int causal,
                              const int32_t *q_start, float softcap) {
    const att_geom g = att_geom_make(B, Tq, Tk, H, Hkv, D, q_pos, k_pos, causal, q_start, softcap);
    const att_saved a = {.dout = dout, .out = out, .lse = lse, .q = q, .k = k, .v = v};
    size_t per;
    float *scratch = att_scratch(o, D, &per);
    if (dq) {
        const int64_t tasks = (int64_t)B * H * g.nqt;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
        for (int64_t task = 0; task < tasks; task++)
            att_dq_tile(&g, scratch + per * omp_get_thread_num(), dq, &a, task);
    }
    if (dk || dv) {
        const int64_t tasks = (int64_t)B * Hkv * g.nkb;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
        for (int64_t task = 0; task < tasks; task++)
            att_dkv_block(&g, scratch + per * omp_get_thread_num(), dk, dv, &a, task);
    }
    free(scratch);
}

/* Two softmaxes over disjoint key sets combine as lse = logaddexp(lse1, lse2),
 * out = exp(lse1 - lse) out1 + exp(lse2 - lse) out2. A side with lse = -inf saw no key. */
static void cpu_attention_merge(const ust_ops *o, act *out_, float *lse, const act *out2_,
                                const float *lse2, int B, int T, int H, int D) {
    float *out = out_;
    const float *out2 = out2_;
    int64_t rows = (int64_t)B * H * T;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int64_t r = 0; r < rows; r++) { /* r indexes lse(B,H,T) */
        int t = (int)(r % T), h = (int)(r / T % H), b = (int)(r / ((int64_t)T * H));
        float l1 = lse[r], l2 = lse2[r];
        if (l2 == -INFINITY) continue;
        float *o1 = out + (((int64_t)b * T + t) * H + h) * D;
        const float *o2 = out2 + (((int64_t)b * T + t) * H + h) * D;
        if (l1 == -INFINITY) {
            for (int d = 0; d < D; d++) o1[d] = o2[d];
            lse[r] = l2;
            continue;
        }
        float mx = l1 > l2 ? l1 : l2, mn = l1 > l2 ? l2 : l1;
        float l = mx + log1pf(expf(mn - mx));
        float w1 = expf(l1 - l), w2 = expf(l2 - l);
        for (int d = 0; d < D; d++) o1[d] = w1 * o1[d] + w2 * o2[d];
        lse[r] = l;
    }
}

/* ---------------------------------------------------------------- cross-entropy */

/* loss = logsumexp(logits[:v_real]) - logits[target]; dlogits = (softmax - onehot) dscale on the
 * real columns, 0 on the padding. Everything read from a row is read before it is written, so
 * dlogits may alias logits. */
/* model.final_softcap: the logit the loss sees, c tanh(x / c) (x itself when c is 0). */
static inline float cap_logit(float x, float c) { return c > 0 ? c * tanhf(x / c) : x; }

/* The cross-entropy's gradient of capped logit xc, d xc / d x = 1 - (xc / c)^2, applied. */
static inline float cap_grad(float g, float xc, float c) {
    return c > 0 ? g * (1.0f - (xc / c) * (xc / c)) : g;
}

static void cpu_xent_fwd_bwd(const ust_ops *o, float *losses, act *dlogits_, const act *logits_,
                             const int32_t *targets, int N, int V, int v_real, float dscale,
                             float softcap) {
    float *dlogits = dlogits_;
    const float *logits = logits_;
    UST_ASSERT(v_real > 0 && v_real <= V, "v_real=%d must be in 1..V=%d", v_real, V);
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int n = 0; n < N; n++) {
        const float *x = logits + (int64_t)n * V;
        float *dx = dlogits ? dlogits + (int64_t)n * V : NULL;
        int tgt = targets[n];
        if (tgt < 0) {
            if (losses) losses[n] = 0.0f;
            if (dx)
                for (int c = 0; c < V; c++) dx[c] = 0.0f;
            continue;
        }
        UST_ASSERT(tgt < v_real, "target %d outside the real vocabulary (%d) in row %d", tgt,
                   v_real, n);
        const float cp = softcap;
        float mx = -INFINITY;
        for (int c = 0; c < v_real; c++) mx = fmaxf(mx, cap_logit(x[c], cp));
        double sum = 0.0;
        for (int c = 0; c < v_real; c++) sum += expf(cap_logit(x[c], cp) - mx);
        float lsum = (float)log(sum);
        if (losses) losses[n] = lsum + mx - cap_logit(x[tgt], cp);
        if (!dx) continue;
        float inv = (float)(1.0 / sum);
        for (int c = 0; c < v_real; c++) {
            float xc = cap_logit(x[c], cp), p = expf(xc - mx) * inv;
            dx[c] = cap_grad((p - (c == tgt ? 1.0f : 0.0f)) * dscale, xc, cp);
        }
        for (int c = v_real; c < V; c++) dx[c] = 0.0f;
    }
}

/* Real local columns of a vocabulary shard: [0, n) with n = clamp(v_real - v_start, 0, V). */
static int real_columns(int V, int v_start, int v_real) {
    int n = v_real - v_start;
    return n < 0 ? 0 : n > V ? V : n;
}

static void cpu_xent_vp_local(const ust_ops *o, float *lse, float *tlogit, const act *logits_,
                              const int32_t *targets, int N, int V, int v_start, int v_real,
                              float softcap) {
    const float *logits = logits_;
    int real = real_columns(V, v_start, v_real);
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int n = 0; n < N; n++) {
        const float *x = logits + (int64_t)n * V;
        float mx = -INFINITY;
        for (int c = 0; c < real; c++) mx = fmaxf(mx, cap_logit(x[c], softcap));
        double sum = 0.0;
        for (int c = 0; c < real; c++) sum += expf(cap_logit(x[c], softcap) - mx);
        lse[n] = real ? mx + (float)log(sum) : -INFINITY;
        int local = targets[n] - v_start;
        tlogit[n] =
            targets[n] >= 0 && local >= 0 && local < real ? cap_logit(x[local], softcap) : 0.0f;
    }
}

static void cpu_xent_vp_finish(const ust_ops *o, float *losses, act *dlogits_, const act *logits_,
                               const int32_t *targets, const float *lse, const float *tlogit, int N,
                               int V, int v_start, int v_real, float dscale, float softcap) {
    float *dlogits = dlogits_;
    const float *logits = logits_;
    int real = real_columns(V, v_start, v_real);
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int n = 0; n < N; n++) {
        int ignored = targets[n] < 0;
        if (losses) losses[n] = ignored ? 0.0f : lse[n] - tlogit[n];
        if (!dlogits) continue;
        const float *x = logits + (int64_t)n * V;
        float *dx = dlogits + (int64_t)n * V;
        int local = targets[n] - v_start;
        for (int c = 0; c < V; c++) {
            float xc = cap_logit(x[c], softcap);
            float p = c < real && !ignored ? expf(xc - lse[n]) : 0.0f;
            dx[c] =
                ignored ? 0.0f : cap_grad((p - (c == local ? 1.0f : 0.0f)) * dscale, xc, softcap);
        }
    }
}

/* ---------------------------------------------------------------- optimizer */

/* One AdamW element: the moments mi, vi (fp32, updated in place) and the parameter; the fp32
 * and bf16-state ops share it, so their arithmetic is one. */
static inline void adamw_elem(float *p, float g, float *mi, float *vi, float lr, float b1, float b2,
                              float eps, float wd, float bc1, float bc2) {
    *mi = b1 * *mi + (1.0f - b1) * g;
    *vi = b2 * *vi + (1.0f - b2) * g * g;
    float mhat = *mi / bc1, vhat = *vi / bc2;
    *p -= lr * (mhat / (sqrtf(vhat) + eps) + wd * *p);
}

static void cpu_adamw(const ust_ops *o, float *p, const float *grad, float *m, float *v, int64_t n,
                      float lr, float b1, float b2, float eps, float wd, float grad_scale,
                      int64_t t) {
    float bc1 = (float)(1.0 - pow((double)b1, (double)t));
    float bc2 = (float)(1.0 - pow((double)b2, (double)t));
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int64_t i = 0; i < n; i++)
        adamw_elem(p + i, grad[i] * grad_scale, m + i, v + i, lr, b1, b2, eps, wd, bc1, bc2);
}

static void cpu_adamw_many(const ust_ops *o, float *p, const float *grad, float *m, float *v,
                           const ops_segment *seg, int k, float lr, float b1, float b2, float eps,
                           float grad_scale, int64_t t) {
    for (int i = 0; i < k; i++)
        cpu_adamw(o, p + seg[i].p, grad + seg[i].g, m + seg[i].m, v + seg[i].m, seg[i].n, lr, b1,
                  b2, eps, seg[i].wd, grad_scale, t);
}

/* adamw's element on bf16 states: widened, the same fp32 arithmetic, rounded back. */
static void cpu_adamw16(const ust_ops *o, float *p, const float *grad, uint16_t *m, uint16_t *v,
                        int64_t n, float lr, float b1, float b2, float eps, float wd,
                        float grad_scale, float bc1, float bc2) {
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int64_t i = 0; i < n; i++) {
        float mi = ops_state_f32(m[i]), vi = ops_state_f32(v[i]);
        adamw_elem(p + i, grad[i] * grad_scale, &mi, &vi, lr, b1, b2, eps, wd, bc1, bc2);
        m[i] = ops_state_bf16(mi);
        v[i] = ops_state_bf16(vi);
    }
}

static void cpu_adamw16_many(const ust_ops *o, float *p, const float *grad, uint16_t *m,
                             uint16_t *v, const ops_segment *seg, int k, float lr, float b1,
                             float b2, float eps, float grad_scale, int64_t t) {
    float bc1 = (float)(1.0 - pow((double)b1, (double)t));
    float bc2 = (float)(1.0 - pow((double)b2, (double)t));
    for (int i = 0; i < k; i++)
        cpu_adamw16(o, p + seg[i].p, grad + seg[i].g, m + seg[i].m, v + seg[i].m, seg[i].n, lr, b1,
                    b2, eps, seg[i].wd, grad_scale, bc1, bc2);
}

static void cpu_momentum16(const ust_ops *o, float *g, uint16_t *m, int64_t n, float mu,
                           float grad_scale, int nesterov) {
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int64_t i = 0; i < n; i++) {
        float mi = ops_state_f32(m[i]) * mu;
        mi += grad_scale * g[i];
        m[i] = ops_state_bf16(mi);
        if (nesterov) {
            float gi = g[i] * grad_scale;
            g[i] = gi + mu * mi;
        } else {
            g[i] = mi;
        }
    }
}

/* ---------------------------------------------------------------- elementwise, reductions */

static void cpu_add(const ust_ops *o, act *out_, const act *a_, const act *b_, int64_t n) {
    float *out = out_;
    const float *a = a_;
    const float *b = b_;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void cpu_axpy(const ust_ops *o, float *y, float a, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void cpu_scale(const ust_ops *o, float *x, float s, int64_t n) {
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* the CPU's activations are fp32: scale's own loop */
static void cpu_scale_act(const ust_ops *o, act *x, float s, int64_t n) { cpu_scale(o, x, s, n); }

/* Fixed chunking (independent of the thread count), partials summed in order: deterministic. */
#define RED_CHUNKS 256

static double reduce(const ust_ops *o, const float *x, int64_t n, int square) {
    double part[RED_CHUNKS];
    int64_t per = (n + RED_CHUNKS - 1) / RED_CHUNKS;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int c = 0; c < RED_CHUNKS; c++) {
        int64_t i0 = c * per, i1 = i0 + per < n ? i0 + per : n;
        double s = 0.0;
        if (square) {
#pragma omp simd reduction(+ : s)
            for (int64_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
        } else {
#pragma omp simd reduction(+ : s)
            for (int64_t i = i0; i < i1; i++) s += x[i];
        }
        part[c] = s;
    }
    double total = 0.0;
    for (int c = 0; c < RED_CHUNKS; c++) total += part[c];
    return total;
}

static double cpu_sumsq(const ust_ops *o, const float *x, int64_t n) { return reduce(o, x, n, 1); }
static void cpu_sumsq_many(const ust_ops *o, const float *grad, const ops_segment *seg, int k,
                           double *out) {
    for (int i = 0; i < k; i++) out[i] = reduce(o, grad + seg[i].g, seg[i].n, 1);
}
static double cpu_sum(const ust_ops *o, const float *x, int64_t n) { return reduce(o, x, n, 0); }

/* ---------------------------------------------------------------- mixture of experts */

static int chosen(const int32_t *sel, int j, int e) {
    for (int m = 0; m < j; m++)
        if (sel[m] == e) return 1;
    return 0;
}

static const ops_moe_route route_default = {0, 1, 1, 1, 1.0f, 2};

/* One token's scores p(E) (+ bias) -> its k experts sel, descending, ties to the lower index:
 * with groups, only among the topk_group groups of highest top-q sums (q = group_top, 0: 2;
 * groups chosen the same way). */
static void route_select(const float *p, const float *bias, int E, int k, const ops_moe_route *r,
                         int32_t *sel) {
    int G = r->n_group > 1 ? r->n_group : 1, Eg = E / G, T = G > 1 ? r->topk_group : G;
    int q = r->group_top > 0 ? r->group_top : 2;
    uint64_t groups = G > 1 ? 0 : 1; /* bit g: group g may be chosen (one group: all) */
#define SC(e) (p[e] + (bias ? bias[e] : 0.0f))
    for (int t = 0; t < T && G > 1; t++) {
        int best = -1;
        float bs = 0.0f;
        for (int g = 0; g < G; g++) {
            if (groups >> g & 1) continue;
            float top[16]; /* the group's q highest, descending (insertion: ties keep order) */
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
        groups |= (uint64_t)1 << best;
    }
    for (int j = 0; j < k; j++) { /* k passes: strict > keeps the lower index on ties */
        int best = -1;
        for (int e = 0; e < E; e++)
            if ((groups >> (G > 1 ? e / Eg : 0) & 1) && !chosen(sel, j, e) &&
                (best < 0 || SC(e) > SC(best)))
                best = e;
        sel[j] = best;
    }
#undef SC
}

/* psum(E) += each token's probs (sigmoid: over the token's score sum), in token order in fp64 */
static void route_psum(float *psum, const float *probs, const float *rowsum, int N, int E) {
    double acc[E];
    for (int e = 0; e < E; e++) acc[e] = 0.0;
    for (int n = 0; n < N; n++)
        for (int e = 0; e < E; e++)
            acc[e] += (double)probs[(int64_t)n * E + e] / (rowsum ? rowsum[n] : 1.0f);
    for (int e = 0; e < E; e++) psum[e] = (float)acc[e];
}

static void cpu_moe_router_fwd(const ust_ops *o, float *probs, float *lse, int32_t *topk,
                               float *gate, float *psum, const act *logits_, const float *bias,
                               int N, int E, int k, const ops_moe_route *r) {
    const float *logits = logits_;
    if (!r) r = &route_default;
    UST_ASSERT(k >= 1 && k <= E, "top-%d of %d experts", k, E);
    UST_ASSERT(r->n_group <= 1 ||
                   (E % r->n_group == 0 && r->n_group <= 64 && r->topk_group <= r->n_group &&
                    k <= r->topk_group * E / r->n_group && r->group_top <= 16 &&
                    r->group_top <= E / r->n_group),
               "top-%d of %d experts in %d of %d groups (top-%d sums)", k, E, r->topk_group,
               r->n_group, r->group_top);
    float *rowsum = r->sigmoid && psum && !lse ? malloc((size_t)N * sizeof(float)) : lse;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int n = 0; n < N; n++) {
        const float *x = logits + (int64_t)n * E;
        float *p = probs + (int64_t)n * E;
        if (r->sigmoid) {
            double sum = 0.0;
            for (int e = 0; e < E; e++) p[e] = 1.0f / (1.0f + expf(-x[e])), sum += p[e];
            if (rowsum) rowsum[n] = (float)sum;
        } else {
            float mx = -INFINITY;
            for (int e = 0; e < E; e++) mx = x[e] > mx ? x[e] : mx;
            double sum = 0.0;
            for (int e = 0; e < E; e++) sum += expf(x[e] - mx);
            float inv = (float)(1.0 / sum);
            for (int e = 0; e < E; e++) p[e] = expf(x[e] - mx) * inv;
            if (lse) lse[n] = mx + (float)log(sum);
        }
        int32_t *sel = topk + (int64_t)n * k;
        float *g = gate + (int64_t)n * k, s = 0.0f;
        route_select(p, bias, E, k, r, sel);
        for (int j = 0; j < k; j++) s += p[sel[j]];
        for (int j = 0; j < k; j++) g[j] = (r->norm ? p[sel[j]] / s : p[sel[j]]) * r->scale;
    }
    if (psum && r->sigmoid)
        route_psum(psum, probs, rowsum, N, E);
    else if (psum)
        column_sums(o, psum, probs, N, E, 0);
    if (rowsum != lse) free(rowsum);
}

/* gate_j = c p_{i_j} / S with S = sum_m p_{i_m} (norm; else c p_{i_j}):
 * dp_{i_j} += (c dgate_j - sum_m dgate_m gate_m) / S (else c dgate_j). Softmax:
 * dlogit_e = p_e (dp_e - sum_f p_f dp_f); the z-loss adds zscale lse p_e. Sigmoid: the aux
 * factors reach q_e = p_e / sum_f p_f (lse holds the sum), dp_f += (aux_f - sum_e aux_e q_e) /
 * sum; dlogit_e = p_e (1 - p_e) dp_e. */
static void cpu_moe_router_bwd(const ust_ops *o, act *dlogits_, const float *dgate,
                               const float *probs, const float *lse, const int32_t *topk,
                               const float *gate, const float *aux_dp, float zscale, int N, int E,
                               int k, const ops_moe_route *r) {
    float *dlogits = dlogits_;
    if (!r) r = &route_default;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int n = 0; n < N; n++) {
        const float *p = probs + (int64_t)n * E;
        float *d = dlogits + (int64_t)n * E; /* holds dprobs first */
        float aq = 0.0f, inv = r->sigmoid && aux_dp ? 1.0f / lse[n] : 1.0f;
        for (int e = 0; e < E && r->sigmoid && aux_dp; e++) aq += aux_dp[e] * p[e] * inv;
        for (int e = 0; e < E; e++) d[e] = aux_dp ? (aux_dp[e] - aq) * inv : 0.0f;
        if (dgate) {
            const int32_t *sel = topk + (int64_t)n * k;
            const float *dg = dgate + (int64_t)n * k, *g = gate + (int64_t)n * k;
            float s = 0.0f, dot = 0.0f;
            for (int j = 0; j < k; j++) s += p[sel[j]], dot += dg[j] * g[j];
            for (int j = 0; j < k; j++)
                d[sel[j]] += r->norm ? (r->scale * dg[j] - dot) / s : r->scale * dg[j];
        }
        if (r->sigmoid) {
            for (int e = 0; e < E; e++) d[e] = p[e] * (1.0f - p[e]) * d[e];
            continue;
        }
        double pd = 0.0;
        for (int e = 0; e < E; e++) pd += (double)p[e] * d[e];
        float z = lse && zscale != 0.0f ? zscale * lse[n] : 0.0f;
        for (int e = 0; e < E; e++) d[e] = p[e] * (d[e] - (float)pd + z);
    }
}

static void cpu_moe_gather(const ust_ops *o, act *out_, const act *inp_, const int32_t *src,
                           const float *scale, int M, int C, int div) {
    float *out = out_;
    const float *inp = inp_;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int i = 0; i < M; i++) {
        const float *x = inp + (int64_t)(src[i] / div) * C;
        float *y = out + (int64_t)i * C, w = scale ? scale[src[i]] : 1.0f;
        for (int c = 0; c < C; c++) y[c] = w * x[c];
    }
}

static void cpu_moe_combine(const ust_ops *o, act *out_, const act *rows_, const int32_t *pos,
                            const float *gate, int N, int k, int C, int acc) {
    float *out = out_;
    const float *rows = rows_;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int n = 0; n < N; n++) {
        float *y = out + (int64_t)n * C;
        if (!acc)
            for (int c = 0; c < C; c++) y[c] = 0.0f;
        for (int j = 0; j < k; j++) {
            int64_t a = (int64_t)n * k + j;
            if (pos[a] < 0) continue;
            const float *r = rows + (int64_t)pos[a] * C;
            float w = gate ? gate[a] : 1.0f;
            for (int c = 0; c < C; c++) y[c] += w * r[c];
        }
    }
}

static void cpu_moe_gate_grad(const ust_ops *o, float *dgate, const act *dout_, const act *rows_,
                              const int32_t *pos, int N, int k, int C) {
    const float *dout = dout_;
    const float *rows = rows_;
    int64_t A = (int64_t)N * k;
#pragma omp parallel for schedule(static) num_threads(nthreads(o))
    for (int64_t a = 0; a < A; a++) {
        if (pos[a] < 0) {
            dgate[a] = 0.0f;
            continue;
        }
        const float *g = dout + (a / k) * C, *r = rows + (int64_t)pos[a] * C;
        double s = 0.0;
        for (int c = 0; c < C; c++) s += (double)g[c] * r[c];
        dgate[a] = (float)s;
    }
}

/* ---------------------------------------------------------------- lifetime */

/* Host memory is the device memory: both copies are plain copies. */
#define cpu_to_device cpu_copy
#define cpu_to_host cpu_copy

/* Synchronous: there is no stream to order after, and nothing outside the arena to report. */
static void *cpu_stream(const ust_ops *o) {
    (void)o;
    return NULL;
}
static void cpu_memory(const ust_ops *o, ops_mem *m) {
    (void)o;
    *m = (ops_mem){0};
}

static void cpu_destroy(ust_ops *o) {
    if (!o) return;
    free(o->impl);
    free(o);
}

/* Threads per rank when the config leaves it open: the cores shared by the ranks of this node;
 * an explicit OMP_NUM_THREADS caps it (the launcher sets it; more threads than free cores spin
 * in OpenMP barriers for nothing). */
static int default_threads(int local_ranks) {
    int lr = local_ranks > 0 ? local_ranks : 1;
    int threads = omp_get_num_procs() / lr;
    const char *env = getenv("OMP_NUM_THREADS");
    if (env && atoi(env) > 0 && atoi(env) < threads) threads = atoi(env);
    return threads < 1 ? 1 : threads;
}

/* A waiting thread spins this long before it sleeps: libgomp's default (300000 spins, about
 * 3 ms) hands the core to nobody while a busy neighbour process runs on the other one (a tiny
 * step took 1100 ms instead of 292); SPIN_FREE_CORES keeps the wake-up of back-to-back regions
 * fast and gives the core up within microseconds. */
enum { SPIN_FREE_CORES = 1000 };

long long ops_cpu_spin_count(int local_ranks) {
    int lr = local_ranks > 0 ? local_ranks : 1;
    /* more threads than cores on the node: a spinning thread only delays the one it waits for */
    if ((long long)default_threads(lr) * lr > omp_get_num_procs()) return 0;
    return SPIN_FREE_CORES;
}

ust_ops *ops_cpu_create(int threads, int local_ranks) {
    if (threads <= 0) threads = default_threads(local_ranks);
    ust_ops *o = calloc(1, sizeof *o);
    cpu_impl *impl = calloc(1, sizeof *impl);
    if (!o || !impl) ust_fatal(UST_EXIT_RUNTIME, "out of memory creating the CPU backend");
    impl->threads = threads;
    omp_set_num_threads(threads);
    openblas_set_num_threads(1); /* see blas_threads */

    o->name = "cpu";
    o->impl = impl;
    o->act_size = sizeof(float);
#define FILL(op) o->op = cpu_##op;
    UST_OPS_LIST(FILL)
#undef FILL
    return o;
}

double ops_measure_sgemm_flops(const ust_ops *o, int n, int reps) {
    if (n <= 0) n = 512;
    if (reps <= 0) reps = 1;
    size_t bytes = (size_t)n * n * sizeof(float);
    float *A = o->alloc(o, bytes), *B = o->alloc(o, bytes), *C = o->alloc(o, bytes);
    for (int64_t i = 0; i < (int64_t)n * n; i++) {
        A[i] = (float)((i * 7 % 13) - 6) * 0.01f;
        B[i] = (float)((i * 5 % 11) - 5) * 0.01f;
    }
    o->matmul(o, C, A, B, n, n, n, 0, 0, 1.0f, 0.0f); /* warm-up: threads, buffers, caches */
    /* the fastest repetition: a peak, not a mean that a moment of contention on a shared
     * machine drags down (which once reported an MFU above 100%) */
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = log_now_s();
        o->matmul(o, C, A, B, n, n, n, 0, 0, 1.0f, 0.0f);
        double dt = log_now_s() - t0;
        if (r == 0 || dt < best) best = dt;
    }
    o->free(o, A);
    o->free(o, B);
    o->free(o, C);
    return best > 0 ? 2.0 * n * (double)n * n / best : 0.0;
}

/* ---- RMSNorm over rows split by columns (model.qk_norm_whole under tp: proj_norm.c) ---- */

void ops_cpu_rows_sumsq(float *ss, const act *inp_, int N, int C) {
    const float *inp = inp_;
    for (int n = 0; n < N; n++) {
        const float *x = inp + (int64_t)n * C;
        double s = 0.0;
        for (int c = 0; c < C; c++) s += (double)x[c] * x[c];
        ss[n] = (float)s;
    }
}

void ops_cpu_rmsnorm_rows_fwd(act *out_, float *rstd, const act *inp_, const float *w,
                              const float *ss, int N, int C, int Cw, float eps) {
    float *out = out_;
    const float *inp = inp_;
    for (int n = 0; n < N; n++) {
        const float *x = inp + (int64_t)n * C;
        float *y = out + (int64_t)n * C;
        float r = (float)(1.0 / sqrt((double)ss[n] / Cw + eps));
        for (int c = 0; c < C; c++) y[c] = x[c] * r * w[c];
        rstd[n] = r;
    }
}

void ops_cpu_rows_wdot(float *dot, const act *dout_, const act *inp_, const float *w, int N,
                       int C) {
    const float *dout = dout_, *inp = inp_;
    for (int n = 0; n < N; n++) {
        const float *x = inp + (int64_t)n * C, *dy = dout + (int64_t)n * C;
        double s = 0.0;
        for (int c = 0; c < C; c++) s += (double)(w[c] * dy[c]) * x[c];
        dot[n] = (float)s;
    }
}

void ops_cpu_rmsnorm_rows_bwd(act *dinp_, float *dw, const act *dout_, const act *inp_,
                              const float *w, const float *rstd, const float *dot, int N, int C,
                              int Cw) {
    float *dinp = dinp_;
    const float *dout = dout_, *inp = inp_;
    /* the weight's gradient first: dinp may overwrite dout */
    for (int c = 0; dw && c < C; c++) {
        double a = 0.0;
        for (int n = 0; n < N; n++)
            a += (double)dout[(int64_t)n * C + c] * (inp[(int64_t)n * C + c] * rstd[n]);
        dw[c] += (float)a;
    }
    for (int n = 0; dinp && n < N; n++) {
        const float *x = inp + (int64_t)n * C, *dy = dout + (int64_t)n * C;
        float *dx = dinp + (int64_t)n * C, r = rstd[n];
        float k = (float)((double)dot[n] / Cw) * r * r;
        for (int c = 0; c < C; c++) dx[c] = (w[c] * dy[c] - x[c] * k) * r;
    }
}
