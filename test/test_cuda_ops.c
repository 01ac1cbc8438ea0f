/* test_cuda_ops: the CUDA backend against the CPU backend (itself tested against double
 * references in test_ops.c), op by op on random inputs, then a tiny model trained 3 steps on
 * both. Without a GPU (or in a CUDA=0 build) it prints one "SKIP cuda ops: <why>" line and
 * passes. UST_TEST_CUDA_FAKE=cpu runs the whole file with a second CPU backend in the GPU's
 * place, which checks the harness itself on machines without a GPU. UST_TEST_ATT_FULL=B,T runs
 * only the tensor-core attention against the GEMM attention at that size (gpu-check.sh: 8,1024).
 *
 * Tolerances (|got - ref| <= atol + rtol |ref|): both backends compute in fp32 and differ only
 * in summation order and in libm ulps (expf, tanhf, rsqrtf), so sums of K terms of size O(1)
 * differ by ~K * 6e-8 relative; atol 1e-4 / rtol 1e-4 (matmul-like ops, K <= 128) and 2e-5
 * (elementwise ops) sit well above that and far below what a wrong index or a missing term
 * gives (O(0.01..1)). Attention and whole-model gradients chain exp and several reductions:
 * rtol 1e-3. The bf16 matmul bound is derived where it is used. */
#include "config.h"
#include "cuda/ops_cuda.h"
#include "error.h"
#include "mem.h"
#include "model.h"
#include "ops.h"
#include "optim_muon.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static ust_ops *CPU, *GPU;
static int fake; /* GPU is a second CPU backend */

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_state = 0x243F6A8885A308D3ull;

static float frand(void) { /* uniform [-1, 1), splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int irand(int n) { return (int)((frand() + 1.0f) * 0.5f * n) % n; }

/* Host buffers: the CPU backend's "device" memory is host memory, so these feed it directly. */
static float *hrand(int64_t n, float scale) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = frand() * scale;
    return x;
}

static float *gup(const float *h, int64_t n) {
    float *d = GPU->alloc(GPU, (size_t)(n > 0 ? n : 1) * sizeof(float));
    GPU->to_device(GPU, d, h, (size_t)n * sizeof(float));
    return d;
}

static int32_t *gupi(const int32_t *h, int64_t n) {
    int32_t *d = GPU->alloc(GPU, (size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    GPU->to_device(GPU, d, h, (size_t)n * sizeof(int32_t));
    return d;
}

static float *gdown(const float *d, int64_t n) {
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    GPU->to_host(GPU, h, d, (size_t)n * sizeof(float));
    return h;
}

static void gfree(void *p) { GPU->free(GPU, p); }

static char msg[512];

/* Infinities must match exactly (a fully masked attention row has lse = -inf). */
static int close_f(const char *what, const float *got, const float *ref, int64_t n, double atol,
                   double rtol) {
    for (int64_t i = 0; i < n; i++) {
        int ok = isinf(ref[i]) ? got[i] == ref[i]
                               : fabs((double)got[i] - ref[i]) <= atol + rtol * fabs(ref[i]);
        if (!ok) {
            snprintf(msg, sizeof msg, "%s[%lld]: gpu %.9g, cpu %.9g", what, (long long)i, got[i],
                     ref[i]);
            return 0;
        }
    }
    return 1;
}

/* Downloads d (n floats) and compares with the CPU's ref. */
static int gclose(const char *what, const float *d, const float *ref, int64_t n, double atol,
                  double rtol) {
    float *h = gdown(d, n);
    int ok = close_f(what, h, ref, n, atol, rtol);
    free(h);
    return ok;
}

#define CHECK_G(what, d, ref, n, atol, rtol) CHECK(gclose(what, d, ref, n, atol, rtol), "%s", msg)

/* ---- activations (ops.h's act): fp32, or bf16 in the bf16-activation mode of the tests ----
 * In that mode (acts16, the GPU under ops_cuda_set_bf16) every act input is rounded to bf16 on
 * the host first, so the CPU runs on exactly the values the GPU reads, and goes up as bf16; act
 * outputs come down widened. The GPU then differs from the CPU by its fp32 differences plus one
 * rounding of each stored output: at most BF16_U relative (2^-8, bf16's unit roundoff), which
 * gclose_act adds to the fp32 tolerance. After a comparison the CPU's copy takes the GPU's
 * values, so ops chained on it (in-place ops, backward after forward) see the same inputs. */
static int acts16;
#define BF16_U (1.0 / 256)

static void round_bf16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
        memcpy(&x[i], &u, 4);
    }
}

/* h (n activations) on the GPU; in the bf16 mode h is rounded in place first. */
static float *gup_act(float *h, int64_t n) {
    if (!acts16) return gup(h, n);
    round_bf16(h, n);
    uint16_t *b = malloc((size_t)(n > 0 ? n : 1) * 2);
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &h[i], 4);
        b[i] = (uint16_t)(u >> 16);
    }
    float *d = GPU->alloc(GPU, (size_t)(n > 0 ? n : 1) * 2);
    GPU->to_device(GPU, d, b, (size_t)n * 2);
    free(b);
    return d;
}

static float *gdown_act(const float *d, int64_t n) {
    if (!acts16) return gdown(d, n);
    uint16_t *b = malloc((size_t)(n > 0 ? n : 1) * 2);
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    GPU->to_host(GPU, b, d, (size_t)n * 2);
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)b[i] << 16;
        memcpy(&h[i], &u, 4);
    }
    free(b);
    return h;
}

static int gclose_act(const char *what, const float *d, float *ref, int64_t n, double atol,
                      double rtol) {
    float *h = gdown_act(d, n);
    int ok = close_f(what, h, ref, n, atol, acts16 ? rtol + 1.01 * BF16_U : rtol);
    if (acts16) memcpy(ref, h, (size_t)n * sizeof(float));
    free(h);
    return ok;
}

#define CHECK_A(what, d, ref, n, atol, rtol)                                                       \
    CHECK(gclose_act(what, d, ref, n, atol, rtol), "%s%s", acts16 ? "bf16 acts: " : "", msg)

/* Runs an op test in the bf16-activation mode (not with a fake GPU: that has no bf16). */
#define BF16_ACTS_TEST(name, test)                                                                 \
    static void name(void) {                                                                       \
        if (fake) return;                                                                          \
        acts16 = 1;                                                                                \
        ops_cuda_set_bf16(GPU, 1);                                                                 \
        test();                                                                                    \
        ops_cuda_set_bf16(GPU, 0);                                                                 \
        acts16 = 0;                                                                                \
    }

#define ATOL 1e-4
#define RTOL 1e-4
#define EW 2e-5

/* ---------------------------------------------------------------- memory */

static void test_cuda_alloc_is_zeroed_and_copies_roundtrip(void) {
    size_t bytes = 1003;
    unsigned char *p = GPU->alloc(GPU, bytes), *q = GPU->alloc(GPU, bytes);
    CHECK(((uintptr_t)p % 64) == 0 && ((uintptr_t)q % 64) == 0, "not 64-byte aligned");
    unsigned char host[1003], back[1003];
    GPU->to_host(GPU, back, p, bytes);
    for (size_t i = 0; i < bytes; i++) CHECK(back[i] == 0, "alloc not zeroed at %zu", i);
    for (size_t i = 0; i < bytes; i++) host[i] = (unsigned char)(i * 31 + 7);
    GPU->to_device(GPU, p, host, bytes);
    GPU->copy(GPU, q, p, bytes);
    GPU->sync(GPU);
    GPU->to_host(GPU, back, q, bytes);
    CHECK(memcmp(host, back, bytes) == 0, "to_device/copy/to_host roundtrip differs");
    GPU->zero(GPU, q + 10, 100);
    GPU->to_host(GPU, back, q, bytes);
    for (size_t i = 0; i < bytes; i++)
        CHECK(back[i] == (i >= 10 && i < 110 ? 0 : host[i]), "zero: byte %zu is %d", i, back[i]);
    gfree(p);
    gfree(q);
}

/* ---------------------------------------------------------------- matmul */

static void test_cuda_matmul_matches_cpu_all_transposes(void) {
    const int M = 37, N = 29, K = 53;
    for (int tA = 0; tA < 2; tA++)
        for (int tB = 0; tB < 2; tB++) {
            float *A = hrand(M * K, 1), *B = hrand(K * N, 1), *C = hrand(M * N, 1);
            float *dA = gup(A, M * K), *dB = gup(B, K * N), *dC = gup(C, M * N);
            CPU->matmul(CPU, C, A, B, M, N, K, tA, tB, 0.7f, 0.3f);
            GPU->matmul(GPU, dC, dA, dB, M, N, K, tA, tB, 0.7f, 0.3f);
            char what[64];
            snprintf(what, sizeof what, "C(tA=%d,tB=%d)", tA, tB);
            CHECK_G(what, dC, C, M * N, ATOL, RTOL);
            /* beta = 0 overwrites */
            CPU->matmul(CPU, C, A, B, M, N, K, tA, tB, 1.0f, 0.0f);
            GPU->matmul(GPU, dC, dA, dB, M, N, K, tA, tB, 1.0f, 0.0f);
            CHECK_G(what, dC, C, M * N, ATOL, RTOL);
            free(A), free(B), free(C);
            gfree(dA), gfree(dB), gfree(dC);
        }
    /* K = 0: C = beta C */
    float *C = hrand(6, 1), *dC = gup(C, 6), *A = hrand(1, 1), *dA = gup(A, 1);
    CPU->matmul(CPU, C, A, A, 2, 3, 0, 0, 0, 1.0f, 0.5f);
    GPU->matmul(GPU, dC, dA, dA, 2, 3, 0, 0, 0, 1.0f, 0.5f);
    CHECK_G("C(K=0)", dC, C, 6, 0, 0);
    free(C), free(A);
    gfree(dC), gfree(dA);
}

static void test_cuda_matmul_batched_matches_cpu_with_strides(void) {
    const int M = 21, N = 34, K = 17, batch = 3;
    for (int tA = 0; tA < 2; tA++)
        for (int tB = 0; tB < 2; tB++) {
            int64_t sA = M * K + 5, sB = K * N + 3, sC = M * N + 7;
            float *A = hrand(sA * batch, 1), *B = hrand(sB * batch, 1), *C = hrand(sC * batch, 1);
            float *dA = gup(A, sA * batch), *dB = gup(B, sB * batch), *dC = gup(C, sC * batch);
            CPU->matmul_batched(CPU, C, A, B, M, N, K, tA, tB, 1.3f, 1.0f, batch, sA, sB, sC);
            GPU->matmul_batched(GPU, dC, dA, dB, M, N, K, tA, tB, 1.3f, 1.0f, batch, sA, sB, sC);
            CHECK_G("batched C", dC, C, sC * batch, ATOL, RTOL);
            free(A), free(B), free(C);
            gfree(dA), gfree(dB), gfree(dC);
        }
}

/* bf16 rounds each input to 8 significant bits (relative error <= 2^-9 each, so <= 2^-8 + 2^-18
 * per product) and accumulates in fp32, so |C_bf16 - C_fp32| <= 2^-8 sum_k |a_k b_k| plus fp32
 * rounding; the bound below is 1.5x that. The error must also be clearly non-zero, which shows
 * the bf16 path ran (random fp32 inputs are not bf16-representable). */
/* The backend keeps cuBLASLt's descriptors per problem (ops_cuda.cu lt_lookup): one shape
 * with other batch strides (pad 128: the same alignments as the dense strides, so only the
 * strides tell them apart), batch counts and transposes, interleaved and repeated, must each get
 * their own layouts (a cache keyed on the shape alone reads the wrong elements: errors of O(1)
 * where bf16 rounding allows ~0.1). */
/* Muon's Newton-Schulz (core/model/optim_muon.c: 5 quintic steps through the backend's matmul)
 * on the GPU. In fp32 it is SGEMM: the CPU's result within summation order, which the iteration
 * amplifies (its slope reaches a = 3.4 near 0) to ~1e-6 relative; 1e-4 bounds it. Under bf16
 * the same calls take bf16 inputs with fp32 accumulation (the backend's bf16 matmul) and keep X
 * in fp32 between steps: each of the 15 products carries ~2^-9 relative input rounding, which
 * the quintic does not damp (it leaves singular values oscillating in [0.68, 1.13] rather than
 * converging, and multiplies the small ones by up to 3.4 a step), so the update moves by a few
 * percent: 1.8-3.3% (relative, Frobenius) on these shapes, measured on the emulator. NS_BF16_TOL
 * bounds it; a wrong product (a dropped term, a transposed operand) moves it by O(1). It must
 * also differ from fp32 by more than 1e-4: the products really are bf16. */
#define NS_BF16_TOL 5e-2
static void test_cuda_newton_schulz_fp32_and_bf16_against_cpu(void) {
    static const int shapes[][2] = {{64, 48}, {24, 80}, {40, 40}};
    double worst[2] = {0, 0}, least16 = 1.0;
    for (int s = 0; s < 3; s++) {
        const int r = shapes[s][0], c = shapes[s][1];
        const int64_t n = (int64_t)r * c, nw = optim_ns_work(r, c);
        float *X = hrand(n, 1), *ref = malloc((size_t)n * sizeof(float)), *work = hrand(nw, 1);
        memcpy(ref, X, (size_t)n * sizeof(float));
        optim_newton_schulz(CPU, ref, r, c, 5, work);
        for (int b16 = 0; b16 < 2 && !(b16 && fake); b16++) {
            if (b16) ops_cuda_set_bf16(GPU, 1);
            float *dX = gup(X, n), *dW = gup(work, nw);
            optim_newton_schulz(GPU, dX, r, c, 5, dW);
            float *got = gdown(dX, n);
            if (b16) ops_cuda_set_bf16(GPU, 0);
            double num = 0, den = 0;
            for (int64_t i = 0; i < n; i++) {
                double d = (double)got[i] - ref[i];
                num += d * d, den += (double)ref[i] * ref[i];
            }
            double rel = sqrt(num / den);
            worst[b16] = fmax(worst[b16], rel);
            if (b16) least16 = fmin(least16, rel);
            printf("  Newton-Schulz %dx%d %s: %.3g from the fp32 CPU's (relative, Frobenius)\n", r,
                   c, b16 ? "bf16" : "fp32", rel);
            free(got), gfree(dX), gfree(dW);
        }
        free(X), free(ref), free(work);
    }
    CHECK(worst[0] <= 1e-4, "fp32 Newton-Schulz %.3g from the CPU's (relative, Frobenius)",
          worst[0]);
    if (fake) return;
    CHECK(worst[1] <= NS_BF16_TOL, "bf16 Newton-Schulz %.3g from the fp32 CPU's, bound %.3g",
          worst[1], NS_BF16_TOL);
    CHECK(least16 > 1e-4, "bf16 Newton-Schulz only %.3g from fp32: its products are not bf16",
          least16);
}

static void test_cuda_bf16_gemm_cache_keeps_problems_apart(void) {
    if (fake) return;
    const int M = 8, N = 16, K = 24;
    static const struct {
        int batch, pad, tA;
    } pr[] = {{2, 0, 0}, {2, 128, 0}, {3, 0, 0}, {2, 0, 1}, {2, 5, 0}, {2, 128, 0}, {2, 0, 0}};
    ops_cuda_set_bf16(GPU, 1);
    for (int p = 0; p < (int)(sizeof pr / sizeof pr[0]); p++) {
        const int batch = pr[p].batch;
        const int64_t sA = M * K + pr[p].pad, sB = K * N + 2 * pr[p].pad, sC = M * N + pr[p].pad;
        float *A = hrand(sA * batch, 1), *B = hrand(sB * batch, 1), *C = hrand(sC * batch, 1);
        float *dA = gup(A, sA * batch), *dB = gup(B, sB * batch), *dC = gup(C, sC * batch);
        CPU->matmul_batched(CPU, C, A, B, M, N, K, pr[p].tA, 0, 1.0f, 0.0f, batch, sA, sB, sC);
        GPU->matmul_batched(GPU, dC, dA, dB, M, N, K, pr[p].tA, 0, 1.0f, 0.0f, batch, sA, sB, sC);
        char what[64];
        snprintf(what, sizeof what, "problem %d (batch %d, pad %d, tA %d)", p, batch, pr[p].pad,
                 pr[p].tA);
        int ok = gclose(what, dC, C, sC * batch, 0.15, 0);
        free(A), free(B), free(C), gfree(dA), gfree(dB), gfree(dC);
        if (!ok) ops_cuda_set_bf16(GPU, 0);
        CHECK(ok, "%s", msg);
    }
    ops_cuda_set_bf16(GPU, 0);
}

static void test_cuda_bf16_matmul_within_bf16_rounding_of_fp32(void) {
    if (fake) return;
    /* the second shape has odd sizes and inputs one float past an aligned address: the rounding
     * kernel's element-wise tail and misaligned path, besides its four-at-a-time one */
    static const struct {
        int M, N, K, batch, off;
    } shapes[] = {{64, 48, 96, 2, 0}, {13, 7, 11, 3, 1}};
    ops_cuda_set_bf16(GPU, 1);
    double worst_seen = 0.0;
    for (int sh = 0; sh < 2; sh++)
        for (int tA = 0; tA < 2; tA++)
            for (int tB = 0; tB < 2; tB++) {
                const int M = shapes[sh].M, N = shapes[sh].N, K = shapes[sh].K;
                const int batch = shapes[sh].batch, off = shapes[sh].off;
                int64_t sA = M * K, sB = K * N, sC = M * N;
                float *A = hrand(sA * batch + off, 1), *B = hrand(sB * batch + off, 1);
                float *C = hrand(sC * batch, 1);
                float *dA = gup(A, sA * batch + off), *dB = gup(B, sB * batch + off);
                float *dC = gup(C, sC * batch);
                GPU->matmul_batched(GPU, dC, dA + off, dB + off, M, N, K, tA, tB, 1.0f, 0.0f, batch,
                                    sA, sB, sC);
                float *g = gdown(dC, sC * batch);
                for (int bt = 0; bt < batch; bt++)
                    for (int i = 0; i < M; i++)
                        for (int j = 0; j < N; j++) {
                            double ref = 0.0, mag = 0.0;
                            for (int k = 0; k < K; k++) {
                                double a = A[off + bt * sA +
                                             (tA ? (int64_t)k * M + i : (int64_t)i * K + k)];
                                double b = B[off + bt * sB +
                                             (tB ? (int64_t)j * K + k : (int64_t)k * N + j)];
                                ref += a * b;
                                mag += fabs(a * b);
                            }
                            double got = g[bt * sC + (int64_t)i * N + j], err = fabs(got - ref);
                            if (err > worst_seen) worst_seen = err;
                            if (!(err <= 1.5 * mag / 256.0 + 1e-6)) {
                                ops_cuda_set_bf16(GPU, 0);
                                CHECK(0,
                                      "bf16 %dx%dx%d C[%d][%d][%d] (tA=%d tB=%d): %.6g vs %.6g, "
                                      "bound %.3g",
                                      M, N, K, bt, i, j, tA, tB, got, ref, 1.5 * mag / 256.0);
                            }
                        }
                free(g), free(A), free(B), free(C);
                gfree(dA), gfree(dB), gfree(dC);
            }
    ops_cuda_set_bf16(GPU, 0);
    CHECK(worst_seen > 1e-4, "largest bf16 error %.3g: the matmul did not round to bf16",
          worst_seen);
}

/* ---------------------------------------------------------------- linear */

static void test_cuda_linear_fwd_bwd_match_cpu(void) {
    const int N = 50, C = 24, OC = 40;
    float *x = hrand(N * C, 1), *w = hrand(OC * C, 1), *b = hrand(OC, 1), *y = hrand(N * OC, 1);
    float *dx_ = gup(x, N * C), *dw_ = gup(w, OC * C), *db_ = gup(b, OC), *dy_ = gup(y, N * OC);
    for (int bias = 0; bias < 2; bias++) {
        CPU->linear_fwd(CPU, y, x, w, bias ? b : NULL, N, C, OC);
        GPU->linear_fwd(GPU, dy_, dx_, dw_, bias ? db_ : NULL, N, C, OC);
        CHECK_G("linear out", dy_, y, N * OC, ATOL, RTOL);
    }
    float *dout = hrand(N * OC, 1), *gdout = gup(dout, N * OC);
    for (int acc = 0; acc < 2; acc++) {
        float *dinp = hrand(N * C, 1), *dw = hrand(OC * C, 1), *dbias = hrand(OC, 1);
        float *gdinp = gup(dinp, N * C), *gdw = gup(dw, OC * C), *gdb = gup(dbias, OC);
        CPU->linear_bwd(CPU, dinp, dw, dbias, dout, x, w, N, C, OC, acc);
        GPU->linear_bwd(GPU, gdinp, gdw, gdb, gdout, dx_, dw_, N, C, OC, acc);
        CHECK_G("linear dinp", gdinp, dinp, N * C, ATOL, RTOL);
        CHECK_G("linear dw (+=)", gdw, dw, OC * C, ATOL, RTOL);
        CHECK_G("linear dbias (+=)", gdb, dbias, OC, ATOL, RTOL);
        /* NULL outputs are skipped */
        CPU->linear_bwd(CPU, NULL, dw, NULL, dout, x, w, N, C, OC, acc);
        GPU->linear_bwd(GPU, NULL, gdw, NULL, gdout, dx_, dw_, N, C, OC, acc);
        CHECK_G("linear dw, NULL dinp/dbias", gdw, dw, OC * C, ATOL, RTOL);
        free(dinp), free(dw), free(dbias);
        gfree(gdinp), gfree(gdw), gfree(gdb);
    }
    /* a bias gradient over many rows (several row chunks of the column reduction) */
    const int N2 = 1000, OC2 = 70;
    float *d2 = hrand((int64_t)N2 * OC2, 1), *bb = hrand(OC2, 1);
    float *gd2 = gup(d2, (int64_t)N2 * OC2), *gbb = gup(bb, OC2);
    CPU->linear_bwd(CPU, NULL, NULL, bb, d2, NULL, NULL, N2, 1, OC2, 0);
    GPU->linear_bwd(GPU, NULL, NULL, gbb, gd2, NULL, NULL, N2, 1, OC2, 0);
    CHECK_G("dbias over 1000 rows", gbb, bb, OC2, ATOL, RTOL);
    free(x), free(w), free(b), free(y), free(dout), free(d2), free(bb);
    gfree(dx_), gfree(dw_), gfree(db_), gfree(dy_), gfree(gdout), gfree(gd2), gfree(gbb);
}

/* The grouped linear (the MoE experts' projections, one cublasGemmGroupedBatchedEx on the GPU)
 * against the CPU's: 5 groups of 3, 0, 7, 1, 4 rows with their own weights, with and without
 * biases, the backward overwriting and accumulating dinp, dw and db accumulating. */
static void test_cuda_grouped_linear_matches_cpu(void) {
    enum { G = 5, C = 24, OC = 20 };
    const int32_t M[G] = {3, 0, 7, 1, 4};
    const int R = 15;
    float *x = hrand(R * C, 1), *w = hrand(G * OC * C, 1), *b = hrand(G * OC, 1);
    float *y = hrand(R * OC, 1), *dout = hrand(R * OC, 1);
    float *gx = gup(x, R * C), *gw = gup(w, G * OC * C), *gb = gup(b, G * OC), *gy = gup(y, R * OC);
    float *gdout = gup(dout, R * OC);
    const float *cw[G], *cb[G], *dw_[G], *db_[G];
    for (int g = 0; g < G; g++) {
        cw[g] = w + g * OC * C, cb[g] = b + g * OC;
        dw_[g] = gw + g * OC * C, db_[g] = gb + g * OC;
    }
    for (int bias = 0; bias < 2; bias++) {
        CPU->grouped_linear_fwd(CPU, y, x, cw, bias ? cb : NULL, M, G, C, OC);
        GPU->grouped_linear_fwd(GPU, gy, gx, dw_, bias ? db_ : NULL, M, G, C, OC);
        CHECK_G("grouped linear out", gy, y, R * OC, ATOL, RTOL);
    }
    for (int acc = 0; acc < 2; acc++) {
        float *dinp = hrand(R * C, 1), *dw = hrand(G * OC * C, 1), *dbias = hrand(G * OC, 1);
        float *gdinp = gup(dinp, R * C), *gdw = gup(dw, G * OC * C), *gdb = gup(dbias, G * OC);
        float *cdw[G], *cdb[G], *gdwp[G], *gdbp[G];
        for (int g = 0; g < G; g++) {
            cdw[g] = dw + g * OC * C, cdb[g] = dbias + g * OC;
            gdwp[g] = gdw + g * OC * C, gdbp[g] = gdb + g * OC;
        }
        CPU->grouped_linear_bwd(CPU, dinp, cdw, cdb, dout, x, cw, M, G, C, OC, acc);
        GPU->grouped_linear_bwd(GPU, gdinp, gdwp, gdbp, gdout, gx, dw_, M, G, C, OC, acc);
        CHECK_G("grouped linear dinp", gdinp, dinp, R * C, ATOL, RTOL);
        CHECK_G("grouped linear dw (+=)", gdw, dw, G * OC * C, ATOL, RTOL);
        CHECK_G("grouped linear dbias (+=)", gdb, dbias, G * OC, ATOL, RTOL);
        CPU->grouped_linear_bwd(CPU, NULL, cdw, NULL, dout, x, cw, M, G, C, OC, acc);
        GPU->grouped_linear_bwd(GPU, NULL, gdwp, NULL, gdout, gx, dw_, M, G, C, OC, acc);
        CHECK_G("grouped linear dw, NULL dinp/dbias", gdw, dw, G * OC * C, ATOL, RTOL);
        free(dinp), free(dw), free(dbias);
        gfree(gdinp), gfree(gdw), gfree(gdb);
    }
    free(x), free(w), free(b), free(y), free(dout);
    gfree(gx), gfree(gw), gfree(gb), gfree(gy), gfree(gdout);
}

/* The bound of a bf16 GEMM result against the fp32 sum ref of terms whose magnitudes sum to
 * mag: the weights rounded to bf16 (2^-8 relative per term; 1.5x that, as bf16 inputs on both
 * sides of the old path needed) plus the result's own rounding to bf16 (2^-8 |ref|). */
static double bf16_gemm_bound(double mag, double ref) {
    return 1.5 * mag * BF16_U + fabs(ref) * BF16_U + 1e-6;
}

/* The largest error of got(N,OC) = x(N,C) @ w(OC,C)^T + b (b may be NULL, x already bf16)
 * against the fp32 ref, as a fraction of bf16_gemm_bound (<= 1 passes). */
static double bf16_linear_error(const float *got, const float *ref, const float *x, const float *w,
                                const float *b, int N, int C, int OC) {
    double worst = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < OC; j++) {
            double mag = b ? fabs(b[j]) : 0.0;
            for (int k = 0; k < C; k++) mag += fabs((double)x[i * C + k] * w[j * C + k]);
            double e =
                fabs(got[i * OC + j] - ref[i * OC + j]) / bf16_gemm_bound(mag, ref[i * OC + j]);
            worst = e > worst ? e : worst;
        }
    return worst;
}

/* bf16: gpt2's biased linears take bf16 activations in and write bf16 out, with the bias in the
 * cuBLASLt epilogue (rounded to bf16: cuBLASLt takes a bias of D's type), or, where cuBLASLt has
 * no algorithm, the fp32 bias in a separate kernel; either way
 * within bf16 rounding of the fp32 CPU result on the same bf16 inputs, and the bias really added
 * (the result moves by it). */
static void test_cuda_bf16_linear_bias_matches_cpu(void) {
    if (fake) return;
    const int N = 37, C = 64, OC = 48;
    float *x = hrand(N * C, 1), *w = hrand(OC * C, 1), *b = hrand(OC, 1), *y = hrand(N * OC, 1);
    ops_cuda_set_bf16(GPU, 1);
    acts16 = 1;
    float *dx_ = gup_act(x, N * C), *dw_ = gup(w, OC * C), *db_ = gup(b, OC);
    float *dy_ = gup_act(y, N * OC);
    CPU->linear_fwd(CPU, y, x, w, b, N, C, OC);
    GPU->linear_fwd(GPU, dy_, dx_, dw_, db_, N, C, OC);
    float *with = gdown_act(dy_, N * OC);
    GPU->linear_fwd(GPU, dy_, dx_, dw_, NULL, N, C, OC);
    float *without = gdown_act(dy_, N * OC);
    acts16 = 0;
    ops_cuda_set_bf16(GPU, 0);
    double worst = bf16_linear_error(with, y, x, w, b, N, C, OC), moved = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < OC; j++) {
            double d = fabs(with[i * OC + j] - without[i * OC + j] - b[j]);
            double lim =
                (fabs(with[i * OC + j]) + fabs(without[i * OC + j]) + fabs(b[j])) * BF16_U + 1e-4;
            moved = fmax(moved, d / lim);
        }
    CHECK(worst <= 1.0, "bf16 linear with bias: error %.3g of the bf16 bound", worst);
    /* both results and the bias are rounded to bf16 (2^-8 relative each), beyond that the GEMMs
     * may only reassociate (1e-4); a missing bias is off by ~0.5 */
    CHECK(moved <= 1.0, "the bias moved the output by %.3g of the bound less or more than itself",
          moved);
    free(x), free(w), free(b), free(y), free(with), free(without);
    gfree(dx_), gfree(dw_), gfree(db_), gfree(dy_);
}

/* bf16 backward of a linear on bf16 activations (dout and inp go to the GEMMs as stored):
 * dinp (a bf16 output, overwritten and +=) and dw (fp32, +=) within the bound bf16 rounding
 * allows against fp32 sums on the host over the same bf16 inputs; dbias (fp32 column sums of
 * the bf16 dout) as the CPU's. */
/* The largest error of a weight gradient got(K,M) = before + dout(N,K)^T @ x(N,M) (bf16 inputs
 * exact, fp32 accumulation and output) as a fraction of its bound (<= 1 passes). */
static double bf16_wgrad_error(const float *got, const float *before, const float *dout,
                               const float *x, int N, int K, int M) {
    double worst = 0;
    for (int k = 0; k < K; k++)
        for (int c = 0; c < M; c++) {
            double ref = before[k * M + c], mag = fabs(ref);
            for (int i = 0; i < N; i++) {
                ref += (double)dout[i * K + k] * x[i * M + c];
                mag += fabs((double)dout[i * K + k] * x[i * M + c]);
            }
            double e = fabs(got[k * M + c] - ref) / (1.5 * mag * BF16_U + 1e-6);
            worst = e > worst ? e : worst;
        }
    return worst;
}

static void test_cuda_bf16_linear_bwd_within_bf16_rounding(void) {
    if (fake) return;
    const int N = 33, C = 40, OC = 56;
    float *x = hrand(N * C, 1), *w = hrand(OC * C, 1), *dout = hrand(N * OC, 1);
    ops_cuda_set_bf16(GPU, 1);
    acts16 = 1;
    float *gx = gup_act(x, N * C), *gw = gup(w, OC * C), *gd = gup_act(dout, N * OC);
    double worst = 0;
    int db_ok = 1;
    for (int acc = 0; acc < 2; acc++) {
        float *dinp = hrand(N * C, 1), *dw = hrand(OC * C, 1), *db = hrand(OC, 1);
        float *gdinp = gup_act(dinp, N * C), *gdw = gup(dw, OC * C), *gdb = gup(db, OC);
        GPU->linear_bwd(GPU, gdinp, gdw, gdb, gd, gx, gw, N, C, OC, acc);
        float *hi = gdown_act(gdinp, N * C), *hw = gdown(gdw, OC * C);
        CPU->linear_bwd(CPU, NULL, NULL, db, dout, NULL, NULL, N, C, OC, 0);
        db_ok = gclose("dbias (+=)", gdb, db, OC, ATOL, RTOL);
        for (int i = 0; i < N; i++)
            for (int c = 0; c < C; c++) {
                double ref = acc ? dinp[i * C + c] : 0.0, mag = fabs(ref);
                for (int k = 0; k < OC; k++) {
                    ref += (double)dout[i * OC + k] * w[k * C + c];
                    mag += fabs((double)dout[i * OC + k] * w[k * C + c]);
                }
                double e = fabs(hi[i * C + c] - ref) / bf16_gemm_bound(mag, ref);
                worst = e > worst ? e : worst;
            }
        double ew = bf16_wgrad_error(hw, dw, dout, x, N, OC, C);
        worst = ew > worst ? ew : worst;
        free(dinp), free(dw), free(db), free(hi), free(hw);
        gfree(gdinp), gfree(gdw), gfree(gdb);
        if (worst > 1.0 || !db_ok) break;
    }
    acts16 = 0;
    ops_cuda_set_bf16(GPU, 0);
    CHECK(worst <= 1.0, "bf16 linear_bwd: error %.3g of the bf16 bound", worst);
    CHECK(db_ok, "%s", msg);
    free(x), free(w), free(dout);
    gfree(gx), gfree(gw), gfree(gd);
}

/* gpt2's MLP up-projection + gelu: in fp32 like linear_fwd then gelu_fwd on the CPU; under bf16
 * (the cuBLASLt GELU epilogue when OC is a multiple of 8, the separate kernels otherwise) the
 * pre-activation within bf16 rounding of the CPU's and the activation gelu of it. */
/* d gelu(u) / du, the tanh form, in double (the reference of the fused GELU backward) */
static double gelu_grad(double u) {
    double k = 0.7978845608028654, t = tanh(k * (u + 0.044715 * u * u * u));
    return 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * u * u);
}

/* gpt2's MLP backward through the down-projection and the GELU: fp32 against the CPU op; bf16
 * (OC a multiple of 8: the DGELU epilogue; 44: linear_bwd then gelu_bwd) within bf16 rounding of
 * gelu'(up) (dout @ w) on the same bf16 inputs, dw and dbias accumulated in fp32. */
static void test_cuda_linear_gelu_bwd_matches_cpu_fp32_and_bf16(void) {
    if (fake) return;
    const int N = 31, C = 40;
    for (int oc = 0; oc < 2; oc++) {
        int OC = oc ? 44 : 48;
        float *up = hrand(N * OC, 1), *act = hrand(N * OC, 1), *dout = hrand(N * C, 1);
        float *w = hrand(C * OC, 1), *dup = hrand(N * OC, 1), *dw = hrand(C * OC, 1);
        float *db = hrand(C, 1);
        CPU->gelu_fwd(CPU, act, up, (int64_t)N * OC);
        float *gu = gup(up, N * OC), *ga = gup(act, N * OC), *gd = gup(dout, N * C);
        float *gw = gup(w, C * OC), *gdup = gup(dup, N * OC), *gdw = gup(dw, C * OC);
        float *gdb = gup(db, C);
        CPU->linear_gelu_bwd(CPU, dup, dw, db, dout, act, up, w, N, OC, C);
        GPU->linear_gelu_bwd(GPU, gdup, gdw, gdb, gd, ga, gu, gw, N, OC, C);
        CHECK_G("linear_gelu_bwd dup (fp32)", gdup, dup, N * OC, ATOL, RTOL);
        CHECK_G("linear_gelu_bwd dw (fp32)", gdw, dw, C * OC, ATOL, RTOL);
        CHECK_G("linear_gelu_bwd dbias (fp32)", gdb, db, C, ATOL, RTOL);
        /* bf16: up, act and dout rounded on the host and uploaded as bf16; dup comes back bf16 */
        ops_cuda_set_bf16(GPU, 1);
        acts16 = 1;
        float *gu16 = gup_act(up, N * OC), *ga16 = gup_act(act, N * OC);
        float *gd16 = gup_act(dout, N * C), *gdup16 = gup_act(dup, N * OC);
        float *dw0 = gdown(gdw, C * OC);
        GPU->linear_gelu_bwd(GPU, gdup16, gdw, NULL, gd16, ga16, gu16, gw, N, OC, C);
        float *hdup = gdown_act(gdup16, N * OC), *hdw = gdown(gdw, C * OC);
        gfree(gu16), gfree(ga16), gfree(gd16), gfree(gdup16);
        acts16 = 0;
        ops_cuda_set_bf16(GPU, 0);
        double worst = 0;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < OC; j++) {
                double ref = 0, mag = 0, g = gelu_grad(up[i * OC + j]);
                for (int k = 0; k < C; k++) {
                    ref += (double)dout[i * C + k] * w[k * OC + j];
                    mag += fabs((double)dout[i * C + k] * w[k * OC + j]);
                }
                double e = fabs(hdup[i * OC + j] - g * ref) / (fabs(g) * bf16_gemm_bound(mag, ref));
                worst = e > worst ? e : worst;
            }
        double ew = bf16_wgrad_error(hdw, dw0, dout, act, N, C, OC);
        worst = ew > worst ? ew : worst;
        CHECK(worst <= 1.0, "bf16 OC=%d: error %.3g of the bf16 bound", OC, worst);
        free(up), free(act), free(dout), free(w), free(dup), free(dw), free(db), free(dw0);
        free(hdup), free(hdw);
        gfree(gu), gfree(ga), gfree(gd), gfree(gw), gfree(gdup), gfree(gdw), gfree(gdb);
    }
}

static void test_cuda_linear_gelu_matches_cpu_fp32_and_bf16(void) {
    if (fake) return;
    const int N = 29, C = 64;
    for (int oc = 0; oc < 2; oc++) {
        int OC = oc ? 44 : 48; /* 44: no epilogue (its leading dimension is not a multiple of 8) */
        float *x = hrand(N * C, 1), *w = hrand(OC * C, 1), *b = hrand(OC, 1);
        float *up = hrand(N * OC, 1), *act = hrand(N * OC, 1);
        float *gx = gup(x, N * C), *gw = gup(w, OC * C), *gb = gup(b, OC);
        float *gup_ = gup(up, N * OC), *gact = gup(act, N * OC);
        CPU->linear_gelu_fwd(CPU, up, act, x, w, b, N, C, OC);
        GPU->linear_gelu_fwd(GPU, gup_, gact, gx, gw, gb, N, C, OC);
        CHECK_G("linear_gelu up (fp32)", gup_, up, N * OC, ATOL, RTOL);
        CHECK_G("linear_gelu act (fp32)", gact, act, N * OC, ATOL, RTOL);
        /* bf16: x rounded on the host and uploaded as bf16, up and act come back as bf16 */
        ops_cuda_set_bf16(GPU, 1);
        acts16 = 1;
        float *gx16 = gup_act(x, N * C), *gup16 = gup_act(up, N * OC),
              *gact16 = gup_act(act, N * OC);
        CPU->linear_gelu_fwd(CPU, up, act, x, w, b, N, C, OC);
        GPU->linear_gelu_fwd(GPU, gup16, gact16, gx16, gw, gb, N, C, OC);
        float *u = gdown_act(gup16, N * OC), *a = gdown_act(gact16, N * OC);
        gfree(gx16), gfree(gup16), gfree(gact16);
        acts16 = 0;
        ops_cuda_set_bf16(GPU, 0);
        double worst = bf16_linear_error(u, up, x, w, b, N, C, OC), gworst = 0;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < OC; j++) {
                double z = u[i * OC + j];
                double g = 0.5 * z * (1.0 + tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)));
                /* act is gelu of the fp32 pre-activation, rounded; up is that rounded too, which
                 * moves gelu by up to |gelu'| |z| 2^-8 (|gelu'| < 1.2) */
                double ge = fabs(a[i * OC + j] - g) - (fabs(g) + 1.2 * fabs(z)) * BF16_U;
                gworst = ge > gworst ? ge : gworst;
            }
        CHECK(worst <= 1.0, "bf16 OC=%d: pre-activation error %.3g of the bf16 bound", OC, worst);
        /* 2e-3: cuBLASLt's GELU may approximate differently from the tanh form (they differ by
         * < 1e-3); a wrong epilogue (no gelu, or pre-activations not kept) is off by ~0.1-1 */
        CHECK(gworst <= 2e-3, "bf16 OC=%d: activation differs from gelu(pre-activation) by %.3g",
              OC, gworst);
        free(x), free(w), free(b), free(up), free(act), free(u), free(a);
        gfree(gx), gfree(gw), gfree(gb), gfree(gup_), gfree(gact);
    }
}

/* ---------------------------------------------------------------- embedding */

static void test_cuda_embedding_matches_cpu_vocab_slice_positions_repeats(void) {
    const int B = 3, T = 11, C = 40, V = 30, vs = 5, ve = 25, P = T + 3;
    int32_t tok[B * T], pos[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = irand(i % 4 == 0 ? 8 : V); /* many repeats */
    for (int r = 0; r < B * T; r++) pos[r] = (r * 7 + 3) % T;           /* per token, repeated */
    float *wte = hrand((ve - vs) * C, 1), *wpe = hrand(P * C, 1), *out = hrand(B * T * C, 1);
    float *gwte = gup(wte, (ve - vs) * C), *gwpe = gup(wpe, P * C);
    float *gout = gup_act(out, B * T * C);
    int32_t *gtok = gupi(tok, B * T), *gpos = gupi(pos, B * T);
    for (int with_pos = 0; with_pos < 2; with_pos++) {
        CPU->embedding_fwd(CPU, out, tok, with_pos ? pos : NULL, wte, with_pos ? wpe : NULL, B, T,
                           C, vs, ve);
        GPU->embedding_fwd(GPU, gout, gtok, with_pos ? gpos : NULL, gwte, with_pos ? gwpe : NULL, B,
                           T, C, vs, ve);
        CHECK_A("embedding out", gout, out, B * T * C, 0, 0);
    }
    float *dout = hrand(B * T * C, 1), *gdo = gup_act(dout, B * T * C);
    float *dwte = hrand((ve - vs) * C, 1), *dwpe = hrand(P * C, 1);
    float *gdwte = gup(dwte, (ve - vs) * C), *gdwpe = gup(dwpe, P * C);
    CPU->embedding_bwd(CPU, dwte, dwpe, dout, tok, pos, B, T, C, vs, ve);
    GPU->embedding_bwd(GPU, gdwte, gdwpe, gdo, gtok, gpos, B, T, C, vs, ve);
    /* both add the rows in row order: the same float operations */
    CHECK_G("dwte (+=)", gdwte, dwte, (ve - vs) * C, 0, 0);
    CHECK_G("dwpe (+=)", gdwpe, dwpe, P * C, 0, 0);
    CPU->embedding_bwd(CPU, dwte, NULL, dout, tok, NULL, B, T, C, vs, ve);
    GPU->embedding_bwd(GPU, gdwte, NULL, gdo, gtok, NULL, B, T, C, vs, ve);
    CHECK_G("dwte, no positions", gdwte, dwte, (ve - vs) * C, 0, 0);
    free(wte), free(wpe), free(out), free(dout), free(dwte), free(dwpe);
    gfree(gwte), gfree(gwpe), gfree(gout), gfree(gtok), gfree(gpos), gfree(gdo), gfree(gdwte);
    gfree(gdwpe);
}

/* The backward sorts the rows by destination (ops_cuda.cu emb_sort): 5000 rows span several
 * 2048-key tiles and the global merge passes between them; tokens repeat (one id 1000 times),
 * some fall outside the vocabulary slice, positions repeat. The sums must be the CPU's bits. */
static void test_cuda_embedding_bwd_sorts_many_rows_exactly(void) {
    const int B = 2, T = 2500, C = 5, V = 700, vs = 50, ve = 650, P = 300;
    const int64_t R = (int64_t)B * T;
    int32_t *tok = malloc(R * sizeof *tok), *pos = malloc(R * sizeof *pos);
    for (int64_t i = 0; i < R; i++) tok[i] = i % 5 == 0 ? 77 : irand(V);
    for (int64_t r = 0; r < R; r++) pos[r] = (int32_t)((r * 13 + 1) % P);
    float *dout = hrand(R * C, 1), *dwte = hrand((ve - vs) * C, 1), *dwpe = hrand(P * C, 1);
    float *gdo = gup_act(dout, R * C), *gdwte = gup(dwte, (ve - vs) * C), *gdwpe = gup(dwpe, P * C);
    int32_t *gtok = gupi(tok, R), *gpos = gupi(pos, R);
    CPU->embedding_bwd(CPU, dwte, dwpe, dout, tok, pos, B, T, C, vs, ve);
    GPU->embedding_bwd(GPU, gdwte, gdwpe, gdo, gtok, gpos, B, T, C, vs, ve);
    CHECK_G("dwte, 5000 rows", gdwte, dwte, (ve - vs) * C, 0, 0);
    CHECK_G("dwpe, 5000 rows", gdwpe, dwpe, P * C, 0, 0);
    free(tok), free(pos), free(dout), free(dwte), free(dwpe);
    gfree(gdo), gfree(gdwte), gfree(gdwpe), gfree(gtok), gfree(gpos);
}

/* ---------------------------------------------------------------- norms */

static void test_cuda_layernorm_and_rmsnorm_match_cpu(void) {
    /* C = 5000: past the 8 x 512 elements the norm kernels keep in registers (ROW_REG); rows of
     * a multiple of 16 bytes move in 16-byte accesses (ops_cuda.cu row_vec): C = 77 never, 100
     * in fp32 only, the others in both */
    const int sizes[][2] = {{33, 100}, {5, 1000}, {300, 64}, {3, 5000}, {4, 77}};
    for (int s = 0; s < 5; s++) {
        int N = sizes[s][0], C = sizes[s][1];
        int64_t n = (int64_t)N * C;
        float *x = hrand(n, 2), *w = hrand(C, 1), *b = hrand(C, 1), *dy = hrand(n, 1);
        for (int64_t i = 0; i < n; i++) x[i] += 3.0f; /* a mean far from 0 */
        float *out = hrand(n, 1), *mean = hrand(N, 1), *rstd = hrand(N, 1);
        float *gx = gup_act(x, n), *gw = gup(w, C), *gb = gup(b, C), *gdy = gup_act(dy, n);
        float *gout = gup_act(out, n), *gmean = gup(mean, N), *grstd = gup(rstd, N);
        CPU->layernorm_fwd(CPU, out, mean, rstd, x, w, b, N, C, 1e-5f);
        GPU->layernorm_fwd(GPU, gout, gmean, grstd, gx, gw, gb, N, C, 1e-5f);
        CHECK_A("layernorm out", gout, out, n, EW, 1e-4);
        CHECK_G("layernorm mean", gmean, mean, N, EW, 1e-5);
        CHECK_G("layernorm rstd", grstd, rstd, N, EW, 1e-4);
        float *dx = hrand(n, 1), *dw = hrand(C, 1), *db = hrand(C, 1);
        float *gdx = gup_act(dx, n), *gdw = gup(dw, C), *gdb = gup(db, C);
        CPU->layernorm_bwd(CPU, dx, dw, db, dy, x, w, mean, rstd, N, C);
        GPU->layernorm_bwd(GPU, gdx, gdw, gdb, gdy, gx, gw, gmean, grstd, N, C);
        CHECK_A("layernorm dinp", gdx, dx, n, ATOL, 1e-3);
        CHECK_G("layernorm dw (+=)", gdw, dw, C, ATOL, RTOL);
        CHECK_G("layernorm db (+=)", gdb, db, C, ATOL, RTOL);
        CPU->layernorm_bwd(CPU, NULL, dw, NULL, dy, x, w, mean, rstd, N, C);
        GPU->layernorm_bwd(GPU, NULL, gdw, NULL, gdy, gx, gw, gmean, grstd, N, C);
        CHECK_G("layernorm dw, NULL dinp/db", gdw, dw, C, ATOL, RTOL);

        CPU->rmsnorm_fwd(CPU, out, rstd, x, w, N, C, 1e-5f);
        GPU->rmsnorm_fwd(GPU, gout, grstd, gx, gw, N, C, 1e-5f);
        CHECK_A("rmsnorm out", gout, out, n, EW, 1e-4);
        CHECK_G("rmsnorm rstd", grstd, rstd, N, EW, 1e-4);
        CPU->rmsnorm_bwd(CPU, dx, dw, dy, x, w, rstd, N, C);
        GPU->rmsnorm_bwd(GPU, gdx, gdw, gdy, gx, gw, grstd, N, C);
        CHECK_A("rmsnorm dinp", gdx, dx, n, ATOL, 1e-3);
        CHECK_G("rmsnorm dw (+=)", gdw, dw, C, ATOL, RTOL);
        free(x), free(w), free(b), free(dy), free(out), free(mean), free(rstd), free(dx), free(dw);
        free(db);
        gfree(gx), gfree(gw), gfree(gb), gfree(gdy), gfree(gout), gfree(gmean), gfree(grstd);
        gfree(gdx), gfree(gdw), gfree(gdb);
    }
}

/* ---------------------------------------------------------------- activations */

static void test_cuda_gelu_swiglu_match_cpu(void) {
    const int64_t n = 3001;
    float *x = hrand(n, 4), *u = hrand(n, 2), *dy = hrand(n, 1), *out = hrand(n, 1);
    float *d1 = hrand(n, 1), *d2 = hrand(n, 1);
    float *gx = gup_act(x, n), *gu = gup_act(u, n), *gdy = gup_act(dy, n), *gout = gup_act(out, n);
    float *gd1 = gup_act(d1, n), *gd2 = gup_act(d2, n);
    CPU->gelu_fwd(CPU, out, x, n);
    GPU->gelu_fwd(GPU, gout, gx, n);
    CHECK_A("gelu", gout, out, n, EW, EW);
    CPU->gelu_bwd(CPU, d1, x, dy, n);
    GPU->gelu_bwd(GPU, gd1, gx, gdy, n);
    CHECK_A("gelu dinp", gd1, d1, n, EW, EW);
    CPU->swiglu_fwd(CPU, out, x, u, n);
    GPU->swiglu_fwd(GPU, gout, gx, gu, n);
    CHECK_A("swiglu", gout, out, n, EW, EW);
    CPU->swiglu_bwd(CPU, d1, d2, dy, x, u, n);
    GPU->swiglu_bwd(GPU, gd1, gd2, gdy, gx, gu, n);
    CHECK_A("swiglu dgate", gd1, d1, n, EW, EW);
    CHECK_A("swiglu dup", gd2, d2, n, EW, EW);
    CPU->swiglu_bwd(CPU, d1, NULL, dy, u, x, n);
    GPU->swiglu_bwd(GPU, gd1, NULL, gdy, gu, gx, n);
    CHECK_A("swiglu dgate, NULL dup", gd1, d1, n, EW, EW);
    CPU->geglu_fwd(CPU, out, x, u, n); /* model.hidden_act gelu_tanh */
    GPU->geglu_fwd(GPU, gout, gx, gu, n);
    CHECK_A("geglu", gout, out, n, EW, EW);
    CPU->geglu_bwd(CPU, d1, d2, dy, x, u, n);
    GPU->geglu_bwd(GPU, gd1, gd2, gdy, gx, gu, n);
    CHECK_A("geglu dgate", gd1, d1, n, EW, EW);
    CHECK_A("geglu dup", gd2, d2, n, EW, EW);
    free(x), free(u), free(dy), free(out), free(d1), free(d2);
    gfree(gx), gfree(gu), gfree(gdy), gfree(gout), gfree(gd1), gfree(gd2);
}

/* ---------------------------------------------------------------- RoPE */

static void test_cuda_rope_matches_cpu_in_place_and_inverse(void) {
    enum { B = 2, T = 5, H = 3, D = 16 };
    const int64_t n = (int64_t)B * T * H * D;
    int32_t pos[B * T] = {2, 5, 7, 11, 1000, 0, 1, 2, 0, 3}; /* (B, T) */
    float *x = hrand(n, 1), *out = hrand(n, 1);
    float *gx = gup_act(x, n), *gout = gup_act(out, n);
    int32_t *gpos = gupi(pos, B * T);
    CPU->rope_fwd(CPU, out, x, pos, B, T, H, D, &(ust_rope){.theta = 10000});
    GPU->rope_fwd(GPU, gout, gx, gpos, B, T, H, D, &(ust_rope){.theta = 10000});
    CHECK_A("rope", gout, out, n, EW, EW);
    CPU->rope_fwd(CPU, x, x, NULL, B, T, H, D,
                  &(ust_rope){.theta = 500000,
                              .factor = 8,
                              .low_freq_factor = 1,
                              .high_freq_factor = 4,
                              .original_max_pos = 64}); /* in place, default positions */
    GPU->rope_fwd(GPU, gx, gx, NULL, B, T, H, D,
                  &(ust_rope){.theta = 500000,
                              .factor = 8,
                              .low_freq_factor = 1,
                              .high_freq_factor = 4,
                              .original_max_pos = 64});
    CHECK_A("rope in place", gx, x, n, EW, EW);
    CPU->rope_bwd(CPU, out, out, pos, B, T, H, D, &(ust_rope){.theta = 10000});
    GPU->rope_bwd(GPU, gout, gout, gpos, B, T, H, D, &(ust_rope){.theta = 10000});
    CHECK_A("rope backward", gout, out, n, EW, EW);
    /* Gemma 3's global layers: linear scaling, and q/k scaled by (D / query_pre_attn_scalar)^1/4 */
    ust_rope lin = {.theta = 1e6, .factor = 2, .linear = 1, .attn = 0.8};
    CPU->rope_fwd(CPU, out, x, pos, B, T, H, D, &lin);
    GPU->rope_fwd(GPU, gout, gx, gpos, B, T, H, D, &lin);
    CHECK_A("rope linear, attention factor", gout, out, n, EW, EW);
    CPU->rope_bwd(CPU, out, out, pos, B, T, H, D, &lin);
    GPU->rope_bwd(GPU, gout, gout, gpos, B, T, H, D, &lin);
    CHECK_A("rope linear, attention factor, backward", gout, out, n, EW, EW);
    free(x), free(out);
    gfree(gx), gfree(gout), gfree(gpos);
}

/* ---------------------------------------------------------------- attention */

typedef struct {
    const char *name;
    int B, Tq, Tk, H, Hkv, D, causal;
    int q0, k0; /* positions q0 + i and k0 + j; q0 < 0: none given (indices) */
    int zigzag; /* positions of the second half of q and k jump by 2 T (a zig-zag CP block) */
    int late;   /* the first `late` keys get positions 1000 later (no query sees them) */
    int docs;   /* > 0: documents (ops.h q_start) begin every `docs` positions, shifted by 3b */
    int view;   /* q, k, v and dout one element into their buffers: not 16-byte aligned */
} att_case;

/* gup_act `off` elements into a device buffer of n + off (its start in *base, to free). */
static float *gup_act_at(float *h, int64_t n, int off, float **base) {
    if (acts16) round_bf16(h, n); /* as gup_act: the CPU reference sees what the GPU holds */
    float *x = calloc((size_t)(n + off), sizeof(float));
    memcpy(x + off, h, (size_t)n * sizeof(float));
    *base = gup_act(x, n + off);
    free(x);
    return (float *)((char *)*base + (size_t)off * (acts16 ? 2 : 4));
}

/* Tolerances of one attention implementation; bf16: inputs are rounded to bf16 first for both
 * backends, so what remains is the kernels' own rounding of P and dS (relative 2^-9 each). */
typedef struct {
    double out_a, out_r, lse_a, lse_r, grad_a, grad_r; /* absolute and relative */
    int bf16;
} att_tol;
static const att_tol att_fp32 = {ATOL, 1e-3, ATOL, RTOL, 2 * ATOL, 1e-3, 0};
static double att_worst_out; /* largest |gpu - cpu| of out over the cases run */
/* model.attn_softcap and model.final_softcap of the attention and cross-entropy cases run next
 * (0: none; test_cuda_softcap_attention_and_xent_match_cpu sets them) */
static float att_cap, xent_cap;

static double max_abs_diff(const float *d, const float *ref, int64_t n) {
    float *h = gdown_act(d, n);
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        if (!isinf(ref[i])) m = fmax(m, fabs((double)h[i] - ref[i]));
    free(h);
    return m;
}

static int attention_case(const att_case *c, const att_tol *tol) {
    const int B = c->B, Tq = c->Tq, Tk = c->Tk, H = c->H, Hkv = c->Hkv, D = c->D;
    const int64_t nq = (int64_t)B * Tq * H * D, nk = (int64_t)B * Tk * Hkv * D,
                  nl = (int64_t)B * H * Tq;
    int32_t *qp = malloc(Tq * sizeof(int32_t)), *kp = malloc(Tk * sizeof(int32_t));
    for (int i = 0; i < Tq; i++) qp[i] = c->q0 + i + (c->zigzag && i >= Tq / 2 ? 2 * Tq : 0);
    for (int j = 0; j < Tk; j++)
        kp[j] = c->k0 + j + (c->zigzag && j >= Tk / 2 ? 2 * Tk : 0) + (j < c->late ? 1000 : 0);
    const int32_t *cq = c->q0 >= 0 ? qp : NULL, *ck = c->q0 >= 0 ? kp : NULL;
    int32_t *qs = NULL, *gqs = NULL;
    if (c->docs > 0) {
        qs = malloc((size_t)B * Tq * sizeof(int32_t));
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tq; i++) {
                int p = (cq ? cq[i] : i) + 3 * b;
                qs[b * Tq + i] = p - p % c->docs - 3 * b;
            }
        gqs = gupi(qs, B * Tq);
    }
    int32_t *gqp = c->q0 >= 0 ? gupi(qp, Tq) : NULL, *gkp = c->q0 >= 0 ? gupi(kp, Tk) : NULL;
    float *q = hrand(nq, 1.5f), *k = hrand(nk, 1.5f), *v = hrand(nk, 1), *out = hrand(nq, 1);
    float *lse = hrand(nl, 1), *dout = hrand(nq, 1);
    float *dq = hrand(nq, 1), *dk = hrand(nk, 1), *dv = hrand(nk, 1);
    if (tol->bf16) round_bf16(q, nq), round_bf16(k, nk), round_bf16(v, nk), round_bf16(dout, nq);
    float *bq, *bk, *bv, *bdout; /* the buffers of the views */
    float *gq = gup_act_at(q, nq, c->view, &bq), *gk = gup_act_at(k, nk, c->view, &bk);
    float *gv = gup_act_at(v, nk, c->view, &bv), *gdout = gup_act_at(dout, nq, c->view, &bdout);
    float *gout = gup_act(out, nq), *glse = gup(lse, nl);
    float *gdq = gup_act(dq, nq), *gdk = gup_act(dk, nk), *gdv = gup_act(dv, nk);
    int ok = 0;
    char what[128];
    CPU->attention_fwd(CPU, out, lse, q, k, v, B, Tq, Tk, H, Hkv, D, cq, ck, c->causal, qs,
                       att_cap);
    GPU->attention_fwd(GPU, gout, glse, gq, gk, gv, B, Tq, Tk, H, Hkv, D, gqp, gkp, c->causal, gqs,
                       att_cap);
    snprintf(what, sizeof what, "%s: out", c->name);
    att_worst_out = fmax(att_worst_out, max_abs_diff(gout, out, nq));
    if (!gclose_act(what, gout, out, nq, tol->out_a, tol->out_r)) goto done;
    snprintf(what, sizeof what, "%s: lse", c->name);
    if (!gclose(what, glse, lse, nl, tol->lse_a, tol->lse_r)) goto done;
    /* the largest visible logit per head (QK-clip's statistic), max-accumulated into what is
     * there (head 0 starts above every score; 1e3 must stay): the same fp32 sums in the same
     * order as the CPU, so only a fused multiply-add's rounding may differ */
    float mx[64];
    for (int h = 0; h < H; h++) mx[h] = h == 0 && H > 1 ? 1e3f : -INFINITY;
    float *gmx = gup(mx, H);
    CPU->attention_logit_max(CPU, mx, q, k, B, Tq, Tk, H, Hkv, D, cq, ck, c->causal, qs);
    GPU->attention_logit_max(GPU, gmx, gq, gk, B, Tq, Tk, H, Hkv, D, gqp, gkp, c->causal, gqs);
    snprintf(what, sizeof what, "%s: logit max", c->name);
    int mx_ok = gclose(what, gmx, mx, H, 1e-5, 1e-5);
    gfree(gmx);
    if (!mx_ok) goto done;
    CPU->attention_bwd(CPU, dq, dk, dv, dout, out, lse, q, k, v, B, Tq, Tk, H, Hkv, D, cq, ck,
                       c->causal, qs, att_cap);
    GPU->attention_bwd(GPU, gdq, gdk, gdv, gdout, gout, glse, gq, gk, gv, B, Tq, Tk, H, Hkv, D, gqp,
                       gkp, c->causal, gqs, att_cap);
    snprintf(what, sizeof what, "%s: dq (+=)", c->name);
    if (!gclose_act(what, gdq, dq, nq, tol->grad_a, tol->grad_r)) goto done;
    snprintf(what, sizeof what, "%s: dk (+=)", c->name);
    if (!gclose_act(what, gdk, dk, nk, tol->grad_a, tol->grad_r)) goto done;
    snprintf(what, sizeof what, "%s: dv (+=)", c->name);
    if (!gclose_act(what, gdv, dv, nk, tol->grad_a, tol->grad_r)) goto done;
    /* only dk wanted */
    CPU->attention_bwd(CPU, NULL, dk, NULL, dout, out, lse, q, k, v, B, Tq, Tk, H, Hkv, D, cq, ck,
                       c->causal, qs, att_cap);
    GPU->attention_bwd(GPU, NULL, gdk, NULL, gdout, gout, glse, gq, gk, gv, B, Tq, Tk, H, Hkv, D,
                       gqp, gkp, c->causal, gqs, att_cap);
    snprintf(what, sizeof what, "%s: dk alone", c->name);
    if (!gclose_act(what, gdk, dk, nk, tol->grad_a, tol->grad_r)) goto done;
    ok = 1;
done:
    free(qp), free(kp), free(q), free(k), free(v), free(out), free(lse), free(dout), free(dq);
    free(dk), free(dv);
    if (gqp) gfree(gqp);
    if (gkp) gfree(gkp);
    if (gqs) gfree(gqs);
    free(qs);
    gfree(bq), gfree(bk), gfree(bv), gfree(gout), gfree(glse), gfree(bdout), gfree(gdq), gfree(gdk);
    gfree(gdv);
    return ok;
}

static const att_case att_cases[] = {
    {"causal gqa D16", 2, 37, 37, 4, 2, 16, 1, -1, 0, 0, 0, 0, 0},
    {"causal D64 later queries", 1, 20, 45, 2, 1, 64, 1, 30, 0, 0, 0, 0, 0},
    {"cp block, rows that see nothing", 2, 18, 40, 2, 2, 32, 1, 0, 9, 0, 0, 0, 0},
    {"non-causal D40 Tk70", 1, 19, 70, 3, 3, 40, 0, -1, 0, 0, 0, 0, 0},
    {"causal D128", 1, 33, 33, 2, 2, 128, 1, -1, 0, 0, 0, 0, 0},
    {"causal gqa4 D200", 1, 17, 40, 4, 1, 200, 1, 20, 0, 0, 0, 0, 0},
    {"causal D8 T1", 1, 1, 1, 1, 1, 8, 1, -1, 0, 0, 0, 0, 0},
    {"causal gqa D64 T130 (many tiles)", 1, 130, 130, 4, 2, 64, 1, -1, 0, 0, 0, 0, 0},
    {"zig-zag positions, keys reordered", 2, 48, 48, 2, 1, 32, 1, 0, 0, 1, 0, 0, 0},
    {"documents gqa D16 T70", 2, 70, 70, 4, 2, 16, 1, -1, 0, 0, 0, 11, 0},
    {"documents over zig-zag positions", 2, 48, 48, 2, 1, 32, 1, 0, 0, 1, 0, 20, 0},
};
#define N_ATT_CASES (sizeof att_cases / sizeof att_cases[0])

/* Shapes the tensor-core kernels tile unevenly: several 64-query and 64-key tiles with ragged
 * ends, a query block longer than the keys, GQA 4, and every head dim they have. */
static const att_case att_tc_cases[] = {
    {"tc causal D128 T150", 1, 150, 150, 2, 2, 128, 1, -1, 0, 0, 0, 0, 0},
    {"tc non-causal D64 Tq70 Tk100", 2, 70, 100, 2, 1, 64, 0, -1, 0, 0, 0, 0, 0},
    {"tc causal gqa4 D32 Tq100 Tk36", 1, 100, 36, 4, 1, 32, 1, 64, 0, 0, 0, 0, 0},
    {"tc causal D16 zig-zag T96", 1, 96, 96, 1, 1, 16, 1, 0, 0, 1, 0, 0, 0},
    /* the last query (position 64) sees keys 63 and 64 only, the first key of a 64-key tile:
     * skipping a tile whose first key equals a block's or warp's last query loses half of it */
    {"tc causal, last query on the first key of a tile", 1, 16, 100, 2, 1, 64, 1, 49, 0, 0, 63, 0,
     0},
    {"tc documents D64 T150", 2, 150, 150, 2, 1, 64, 1, -1, 0, 0, 0, 37, 0},
    /* the tiles' 2-byte-load fallback (fill_rows): views at an odd element offset */
    {"tc causal D32 T70, unaligned views", 1, 70, 70, 2, 1, 32, 1, -1, 0, 0, 0, 0, 1},
};

/* run.deterministic: false on the backends attention_cases_with makes (the tensor-core path's
 * one-pass backward with fp32 atomics into dq) */
static int att_nondet;

/* The GPU backend under test is swapped for another configuration of the same device, which
 * runs `cases` (or att_cases) with tolerances tol. */
static int attention_cases_with(const char *env, const char *value, const att_case *cases,
                                size_t ncases, const att_tol *tol) {
    ust_ops *saved = GPU, *alt = NULL;
    ust_err e;
    setenv(env, value, 1);
    alt = ops_cuda_create(0, &e);
    unsetenv(env);
    if (!alt) {
        snprintf(msg, sizeof msg, "ops_cuda_create with %s=%s: %s", env, value, e.msg);
        return 0;
    }
    if (acts16) ops_cuda_set_bf16(alt, 1);
    alt->nondeterministic = att_nondet;
    GPU = alt;
    int ok = 1;
    for (size_t i = 0; ok && i < ncases; i++) ok = attention_case(&cases[i], tol);
    GPU = saved;
    alt->destroy(alt);
    return ok;
}

/* A NaN in one query reaches every score of its rows (a NaN q_proj weight): each attention path
 * (flash, tensor-core, GEMM) gives that row a NaN output and lse and the other rows finite
 * outputs; a max that drops the NaN (fmaxf) and a "sum > 0" test turned it into 0 before. */
static int nan_query_case(const char *path) {
    ust_ops *saved = GPU;
    ust_err e;
    setenv("UST_CUDA_ATTENTION", path, 1);
    ust_ops *alt = ops_cuda_create(0, &e);
    unsetenv("UST_CUDA_ATTENTION");
    if (!alt) {
        snprintf(msg, sizeof msg, "ops_cuda_create for %s: %s", path, e.msg);
        return 0;
    }
    if (acts16) ops_cuda_set_bf16(alt, 1);
    GPU = alt;
    const int B = 1, T = 100, H = 2, D = 64, row = 70, h = 1;
    const int64_t nq = (int64_t)B * T * H * D, nk = (int64_t)B * T * D, nl = (int64_t)B * H * T;
    float *q = hrand(nq, 1.5f), *k = hrand(nk, 1.5f), *v = hrand(nk, 1);
    for (int d = 0; d < D; d++) q[((int64_t)row * H + h) * D + d] = NAN;
    float *gq = gup_act(q, nq), *gk = gup_act(k, nk), *gv = gup_act(v, nk);
    float *gout = GPU->alloc(GPU, (size_t)nq * sizeof(float)), *glse = GPU->alloc(GPU, nl * 4);
    GPU->attention_fwd(GPU, gout, glse, gq, gk, gv, B, T, T, H, 1, D, NULL, NULL, 1, NULL, 0.0f);
    float *out = gdown_act(gout, nq), *lse = gdown(glse, nl);
    int bad = 0;
    for (int i = 0; i < T; i++)
        for (int hh = 0; hh < H; hh++) {
            int nan_row = i == row && hh == h;
            const float *oi = out + ((int64_t)i * H + hh) * D;
            for (int d = 0; d < D; d++) bad += nan_row ? !isnan(oi[d]) : !isfinite(oi[d]);
            float l = lse[(int64_t)hh * T + i];
            bad += nan_row ? !isnan(l) : !isfinite(l);
        }
    if (bad) snprintf(msg, sizeof msg, "%s: %d outputs or lse wrong around the NaN row", path, bad);
    free(q), free(k), free(v), free(out), free(lse);
    gfree(gq), gfree(gk), gfree(gv), gfree(gout), gfree(glse);
    GPU = saved;
    alt->destroy(alt);
    return bad == 0;
}

static void test_cuda_attention_carries_a_nan_query_to_its_row(void) {
    if (fake) return;
    static const char *paths[] = {"flash", "tc", "gemm"};
    for (int i = 0; i < 3; i++) CHECK(nan_query_case(paths[i]), "%s", msg);
}

static void test_cuda_attention_flash_kernels_match_cpu(void) {
    if (fake) return;
    CHECK(attention_cases_with("UST_CUDA_ATTENTION", "flash", att_cases, N_ATT_CASES, &att_fp32),
          "flash: %s", msg);
}

static void test_cuda_attention_gemm_in_query_chunks_matches_cpu(void) {
    if (fake) return;
    CHECK(attention_cases_with("UST_CUDA_ATTENTION_CHUNK", "7", att_cases, N_ATT_CASES, &att_fp32),
          "chunks of 7 queries: %s", msg);
}

/* The tensor-core kernels (bf16 products) on every case, with bf16-rounded inputs so that the
 * bound covers only their rounding of P and dS: 2^-9 relative per term, summed over up to 150
 * keys with cancellation, stays under 1e-2; a wrong fragment layout or mask is off by O(1).
 * Head dims without a kernel (8, 40, 200) fall back to the GEMM path. The outputs must also
 * differ from fp32 by more than fp32 rounding: the bf16 kernels ran. */
static void test_cuda_attention_tensor_core_kernels_match_cpu(void) {
    if (fake) return;
    static const att_tol tc = {1e-2, 1e-2, 1e-3, 1e-3, 2e-2, 2e-2, 1};
    att_worst_out = 0;
    CHECK(attention_cases_with("UST_CUDA_ATTENTION", "tc", att_cases, N_ATT_CASES, &tc), "tc: %s",
          msg);
    CHECK(attention_cases_with("UST_CUDA_ATTENTION", "tc", att_tc_cases,
                               sizeof att_tc_cases / sizeof att_tc_cases[0], &tc),
          "tc: %s", msg);
    CHECK(att_worst_out > 1e-5, "tc: largest |out - cpu| %.3g: no bf16 rounding of P seen",
          att_worst_out);
    printf("  tensor-core attention: largest |out - cpu| %.3g (bound 1e-2 + 1e-2 |cpu|)\n",
           att_worst_out);
}

/* run.deterministic: false: the tensor-core one-pass backward (k_tc_bwd1, 5 products, dq by fp32
 * atomics) with the two-kernel backward's bound on its ragged-tile cases (causal, GQA 4, every
 * head dim, positions, documents, unaligned views) and on rows that see no key (lse -inf), fp32
 * storage; bf16 storage on two of them. */
static void test_cuda_attention_tc_one_pass_backward_matches_cpu(void) {
    if (fake) return;
    static const att_tol tc = {1e-2, 1e-2, 1e-3, 1e-3, 2e-2, 2e-2, 1};
    const size_t ntc = sizeof att_tc_cases / sizeof att_tc_cases[0];
    att_nondet = 1;
    int ok = attention_cases_with("UST_CUDA_ATTENTION", "tc", att_tc_cases, ntc, &tc) &&
             attention_cases_with("UST_CUDA_ATTENTION", "tc", &att_cases[2], 1, &tc);
    acts16 = 1;
    ok = ok && attention_cases_with("UST_CUDA_ATTENTION", "tc", &att_tc_cases[2], 2, &tc);
    att_nondet = acts16 = 0;
    CHECK(ok, "one-pass tc backward: %s", msg);
}

/* The one-pass backward against the two kernels on the same inputs (causal GQA, ragged tiles):
 * dk and dv the same bits (the same products in the same order), dq within the fp32 rounding of
 * sums in another order (the kernels round dS to bf16 alike). */
static void test_cuda_attention_tc_one_pass_backward_matches_two_kernels(void) {
    if (fake) return;
    const int B = 2, T = 100, H = 4, Hkv = 2, D = 64;
    const int64_t nq = (int64_t)B * T * H * D, nk = (int64_t)B * T * Hkv * D,
                  nl = (int64_t)B * H * T;
    ust_ops *be[2];
    ust_err e;
    setenv("UST_CUDA_ATTENTION", "tc", 1);
    be[0] = ops_cuda_create(0, &e), be[1] = ops_cuda_create(0, &e);
    unsetenv("UST_CUDA_ATTENTION");
    CHECK(be[0] && be[1], "ops_cuda_create: %s", e.msg);
    if (!be[0] || !be[1]) return;
    be[1]->nondeterministic = 1;
    float *x[7], *g[7], *dq[2], *dk[2], *dv[2];
    const int64_t n[7] = {nq, nk, nk, nq, nq, nk, nk}; /* q k v dout dq dk dv */
    for (int i = 0; i < 7; i++) x[i] = hrand(n[i], i < 2 ? 1.5f : 1.0f), g[i] = gup(x[i], n[i]);
    float *out = gup(x[3], nq), *lse = gup(x[3], nl);
    GPU->sync(GPU); /* the uploads went on GPU's stream, the ops below run on their own */
    be[0]->attention_fwd(be[0], out, lse, g[0], g[1], g[2], B, T, T, H, Hkv, D, NULL, NULL, 1, NULL,
                         0.0f);
    be[0]->sync(be[0]); /* each backend has its own stream */
    for (int r = 0; r < 2; r++) {
        float *gq = gup(x[4], nq), *gk = gup(x[5], nk), *gv = gup(x[6], nk);
        GPU->sync(GPU);
        be[r]->attention_bwd(be[r], gq, gk, gv, g[3], out, lse, g[0], g[1], g[2], B, T, T, H, Hkv,
                             D, NULL, NULL, 1, NULL, 0.0f);
        be[r]->sync(be[r]);
        dq[r] = gdown(gq, nq), dk[r] = gdown(gk, nk), dv[r] = gdown(gv, nk);
        gfree(gq), gfree(gk), gfree(gv);
    }
    CHECK(memcmp(dk[0], dk[1], (size_t)nk * 4) == 0 && memcmp(dv[0], dv[1], (size_t)nk * 4) == 0,
          "one-pass dk/dv differ from the two-kernel backward's bits");
    CHECK(close_f("one-pass dq vs two kernels", dq[1], dq[0], nq, 1e-5, 1e-5), "%s", msg);
    double moved = 0;
    for (int64_t i = 0; i < nq; i++) moved = fmax(moved, fabs((double)dq[1][i] - x[4][i]));
    CHECK(moved > 1e-3, "dq unchanged by the one-pass backward (largest change %.3g)", moved);
    for (int i = 0; i < 7; i++) free(x[i]), gfree(g[i]);
    for (int r = 0; r < 2; r++) free(dq[r]), free(dk[r]), free(dv[r]), be[r]->destroy(be[r]);
    gfree(out), gfree(lse);
}

/* ---- the full-size tensor-core check (UST_TEST_ATT_FULL=B,T; scripts/gpu-check.sh runs it) */

/* Causal attention forward and backward of (B, T, 12 heads, 64) bf16 inputs x[0..3] = q, k, v,
 * dout on a backend made with UST_CUDA_ATTENTION=mode; r[0..4] get out, lse, dq, dk, dv. */
static int att_full_run(const char *mode, int B, int T, float *const x[4], float *r[5]) {
    const int H = 12, D = 64;
    const int64_t n = (int64_t)B * T * H * D, nl = (int64_t)B * H * T;
    ust_ops *saved = GPU;
    ust_err e;
    setenv("UST_CUDA_ATTENTION", mode, 1);
    GPU = ops_cuda_create(0, &e);
    unsetenv("UST_CUDA_ATTENTION");
    if (!GPU) {
        GPU = saved;
        snprintf(msg, sizeof msg, "ops_cuda_create for %s: %s", mode, e.msg);
        return 0;
    }
    ops_cuda_set_bf16(GPU, 1);
    acts16 = 1;
    float *g[4], *out = GPU->alloc(GPU, (size_t)n * 2), *lse = GPU->alloc(GPU, (size_t)nl * 4);
    float *gr[3];
    for (int i = 0; i < 4; i++) g[i] = gup_act(x[i], n);
    for (int i = 0; i < 3; i++) gr[i] = GPU->alloc(GPU, (size_t)n * 2); /* zeroed: += target */
    GPU->attention_fwd(GPU, out, lse, g[0], g[1], g[2], B, T, T, H, H, D, NULL, NULL, 1, NULL,
                       0.0f);
    GPU->attention_bwd(GPU, gr[0], gr[1], gr[2], g[3], out, lse, g[0], g[1], g[2], B, T, T, H, H, D,
                       NULL, NULL, 1, NULL, 0.0f);
    r[0] = gdown_act(out, n), r[1] = gdown(lse, nl);
    for (int i = 0; i < 3; i++) r[2 + i] = gdown_act(gr[i], n), gfree(gr[i]);
    for (int i = 0; i < 4; i++) gfree(g[i]);
    gfree(out), gfree(lse);
    GPU->destroy(GPU);
    GPU = saved;
    return 1;
}

/* The tensor-core kernels against the GEMM attention at a training size (GPT-2 124M: 12 heads of
 * 64, B=8, T=1024 on a GPU), where the cases above stop at T=150: every tile, the causal skip
 * and the dk/dv pass over many query tiles run. Both round P and dS to bf16 as they enter a
 * product and differ in summation order and the online rescaling: over 1024 keys that stays
 * under the same 1e-2 (+1e-2 relative) bound as against the CPU; a wrong tile is off by O(1). */
static void test_cuda_attention_tensor_core_full_size_matches_gemm(void) {
    int B = 0, T = 0;
    CHECK(sscanf(getenv("UST_TEST_ATT_FULL"), "%d,%d", &B, &T) == 2 && B > 0 && T > 0,
          "UST_TEST_ATT_FULL=%s: expected B,T", getenv("UST_TEST_ATT_FULL"));
    const int64_t n = (int64_t)B * T * 12 * 64, nl = (int64_t)B * 12 * T;
    float *x[4] = {hrand(n, 1.5f), hrand(n, 1.5f), hrand(n, 1), hrand(n, 1)}, *a[5], *b[5];
    int ran = att_full_run("tc", B, T, x, a) ? 1 : 0;
    ran += ran && att_full_run("gemm", B, T, x, b);
    int ok = ran == 2;
    static const char *name[5] = {"out", "lse", "dq", "dk", "dv"};
    static const double tol[5] = {1e-2, 1e-3, 2e-2, 2e-2, 2e-2};
    char worst[256] = "";
    for (int j = 0; ok && j < 5; j++) {
        int64_t m = j == 1 ? nl : n, bad = -1;
        double w = 0;
        for (int64_t i = 0; i < m; i++) {
            double d = fabs((double)a[j][i] - b[j][i]);
            w = fmax(w, d);
            if (bad < 0 && !(d <= tol[j] + tol[j] * fabs(b[j][i]))) bad = i;
        }
        size_t len = strlen(worst);
        snprintf(worst + len, sizeof worst - len, " %s %.2g", name[j], w);
        if (bad < 0) continue;
        snprintf(msg, sizeof msg, "B=%d T=%d: %s[%lld] tc %.6g, gemm %.6g (bound %g)", B, T,
                 name[j], (long long)bad, a[j][bad], b[j][bad], tol[j]);
        ok = 0;
    }
    printf("  tensor-core vs GEMM attention, B=%d T=%d H=12 D=64 bf16, largest |diff|:%s\n", B, T,
           worst);
    for (int i = 0; i < 4; i++) free(x[i]);
    for (int j = 0; j < 5; j++) {
        if (ran >= 1) free(a[j]);
        if (ran >= 2) free(b[j]);
    }
    CHECK(ok, "%s", msg);
}

static void test_cuda_attention_matches_cpu_causal_gqa_masks_and_head_dims(void) {
    for (size_t i = 0; i < N_ATT_CASES; i++)
        CHECK(attention_case(&att_cases[i], &att_fp32), "%s", msg);
}

static void test_cuda_attention_merge_matches_cpu(void) {
    const int B = 2, T = 5, H = 3, D = 40;
    const int64_t n = (int64_t)B * T * H * D, nl = (int64_t)B * H * T;
    float *o1 = hrand(n, 1), *o2 = hrand(n, 1), *l1 = hrand(nl, 3), *l2 = hrand(nl, 3);
    l1[0] = -INFINITY, l2[1] = -INFINITY, l1[2] = l2[2] = -INFINITY;
    float *g1 = gup_act(o1, n), *g2 = gup_act(o2, n), *gl1 = gup(l1, nl), *gl2 = gup(l2, nl);
    CPU->attention_merge(CPU, o1, l1, o2, l2, B, T, H, D);
    GPU->attention_merge(GPU, g1, gl1, g2, gl2, B, T, H, D);
    CHECK_A("merged out", g1, o1, n, EW, EW);
    CHECK_G("merged lse", gl1, l1, nl, EW, EW);
    free(o1), free(o2), free(l1), free(l2);
    gfree(g1), gfree(g2), gfree(gl1), gfree(gl2);
}

/* ---------------------------------------------------------------- cross-entropy */

static void test_cuda_xent_matches_cpu_padding_ignored_targets_aliasing(void) {
    const int shapes[][3] = {{20, 70, 50}, {6, 5000, 4999}};
    for (int s = 0; s < 2; s++) {
        int N = shapes[s][0], V = shapes[s][1], vr = shapes[s][2];
        int64_t n = (int64_t)N * V;
        int32_t *tgt = malloc(N * sizeof(int32_t));
        for (int i = 0; i < N; i++) tgt[i] = i % 5 == 3 ? -1 : irand(vr);
        tgt[0] = vr - 1;
        float *x = hrand(n, 4), *loss = hrand(N, 1), *dx = hrand(n, 1);
        float *gx = gup_act(x, n), *gloss = gup(loss, N), *gdx = gup_act(dx, n);
        int32_t *gt = gupi(tgt, N);
        CPU->xent_fwd_bwd(CPU, loss, dx, x, tgt, N, V, vr, 0.5f, xent_cap);
        GPU->xent_fwd_bwd(GPU, gloss, gdx, gx, gt, N, V, vr, 0.5f, xent_cap);
        CHECK_G("xent losses", gloss, loss, N, EW, EW);
        CHECK_A("xent dlogits", gdx, dx, n, 1e-6, 1e-4);
        CPU->xent_fwd_bwd(CPU, loss, NULL, x, tgt, N, V, vr, 1.0f, xent_cap);
        GPU->xent_fwd_bwd(GPU, gloss, NULL, gx, gt, N, V, vr, 1.0f, xent_cap);
        CHECK_G("xent losses, no dlogits", gloss, loss, N, EW, EW);
        CPU->xent_fwd_bwd(CPU, loss, x, x, tgt, N, V, vr, 2.0f, xent_cap); /* in place */
        GPU->xent_fwd_bwd(GPU, gloss, gx, gx, gt, N, V, vr, 2.0f, xent_cap);
        CHECK_G("xent losses in place", gloss, loss, N, EW, EW);
        CHECK_A("xent dlogits in place", gx, x, n, 1e-6, 1e-4);
        free(tgt), free(x), free(loss), free(dx);
        gfree(gx), gfree(gloss), gfree(gdx), gfree(gt);
    }
}

/* The GPU finds each row's max and sum of exponentials in one pass (online softmax, ops_cuda.cu
 * k_xent): rows whose max keeps growing (every element rescales the sum), keeps falling, and
 * whose threads see -inf logits first (masked columns add 0, not NaN) match the CPU's two
 * passes. */
static void test_cuda_xent_online_softmax_rescales_and_skips_minus_inf(void) {
    const int N = 3, V = 300, vr = 290;
    const int64_t n = (int64_t)N * V;
    float *x = hrand(n, 1), *loss = hrand(N, 1), *dx = hrand(n, 1);
    int32_t tgt[3] = {280, 7, 150};
    for (int c = 0; c < V; c++) {
        x[c] = c < 260 ? -INFINITY : 0.01f * c; /* row 0: -inf before 260 */
        x[V + c] = 0.05f * c - 3.0f;            /* row 1: growing */
        x[2 * V + c] = 4.0f - 0.03f * c;        /* row 2: falling */
    }
    float *gx = gup_act(x, n), *gloss = gup(loss, N), *gdx = gup_act(dx, n);
    int32_t *gt = gupi(tgt, N);
    CPU->xent_fwd_bwd(CPU, loss, dx, x, tgt, N, V, vr, 1.0f, xent_cap);
    GPU->xent_fwd_bwd(GPU, gloss, gdx, gx, gt, N, V, vr, 1.0f, xent_cap);
    int finite = 1;
    for (int i = 0; i < N; i++) finite &= isfinite(loss[i]);
    CHECK(finite, "the CPU reference's losses are not finite");
    CHECK_G("online xent losses", gloss, loss, N, EW, EW);
    CHECK_A("online xent dlogits", gdx, dx, n, 1e-6, 1e-4);
    free(x), free(loss), free(dx), gfree(gx), gfree(gloss), gfree(gdx), gfree(gt);
}

/* Two vocabulary shards (the second holding the padding) run locally, combined on the host as
 * the caller would (lse merged, tlogit summed), then finished in place. */
static void test_cuda_xent_vocab_parallel_matches_cpu(void) {
    const int N = 12, Vs = 40, v_real = 70; /* shards [0, 40) and [40, 80): 10 padding columns */
    int32_t tgt[N];
    for (int i = 0; i < N; i++) tgt[i] = i % 4 == 1 ? -1 : irand(v_real);
    tgt[0] = 3, tgt[2] = 45;
    int32_t *gt = gupi(tgt, N);
    float *lse[2], *tl[2], *x[2], *gx[2], *glse[2], *gtl[2];
    for (int sh = 0; sh < 2; sh++) {
        x[sh] = hrand((int64_t)N * Vs, 4);
        gx[sh] = gup_act(x[sh], (int64_t)N * Vs);
        lse[sh] = hrand(N, 1), tl[sh] = hrand(N, 1);
        glse[sh] = gup(lse[sh], N), gtl[sh] = gup(tl[sh], N);
        CPU->xent_vp_local(CPU, lse[sh], tl[sh], x[sh], tgt, N, Vs, sh * Vs, v_real, xent_cap);
        GPU->xent_vp_local(GPU, glse[sh], gtl[sh], gx[sh], gt, N, Vs, sh * Vs, v_real, xent_cap);
        CHECK_G("vp lse", glse[sh], lse[sh], N, EW, EW);
        CHECK_G("vp tlogit", gtl[sh], tl[sh], N, 0, 0);
    }
    float L[N], T[N];
    for (int i = 0; i < N; i++) {
        float a = lse[0][i], b = lse[1][i], m = a > b ? a : b;
        L[i] = m + logf(expf(a - m) + expf(b - m));
        T[i] = tl[0][i] + tl[1][i];
    }
    float *gL = gup(L, N), *gT = gup(T, N);
    for (int sh = 0; sh < 2; sh++) {
        float *loss = hrand(N, 1), *gloss = gup(loss, N);
        CPU->xent_vp_finish(CPU, loss, x[sh], x[sh], tgt, L, T, N, Vs, sh * Vs, v_real, 0.5f,
                            xent_cap);
        GPU->xent_vp_finish(GPU, gloss, gx[sh], gx[sh], gt, gL, gT, N, Vs, sh * Vs, v_real, 0.5f,
                            xent_cap);
        CHECK_G("vp losses", gloss, loss, N, EW, EW);
        CHECK_A("vp dlogits in place", gx[sh], x[sh], (int64_t)N * Vs, 1e-6, 1e-4);
        free(loss);
        gfree(gloss);
    }
    for (int sh = 0; sh < 2; sh++) {
        free(x[sh]), free(lse[sh]), free(tl[sh]);
        gfree(gx[sh]), gfree(glse[sh]), gfree(gtl[sh]);
    }
    gfree(gt), gfree(gL), gfree(gT);
}

/* model.attn_softcap on the GEMM path (the one a cap selects, in every mode) and
 * model.final_softcap in both cross-entropies, against the CPU backend: the attention cases with
 * a cap of 1 (their scores reach ~10) and the cross-entropy tests with a cap of 2 (logits ~4). */
static void test_cuda_softcap_attention_and_xent_match_cpu(void) {
    int ok = 1;
    att_cap = 1.0f;
    for (size_t i = 0; ok && i < N_ATT_CASES; i++) ok = attention_case(&att_cases[i], &att_fp32);
    att_cap = 0.0f; /* before a failure returns: the later tests run uncapped */
    CHECK(ok, "capped: %s", msg);
    xent_cap = 2.0f; /* a failing CHECK in these returns from them, not from here */
    test_cuda_xent_matches_cpu_padding_ignored_targets_aliasing();
    test_cuda_xent_vocab_parallel_matches_cpu();
    xent_cap = 0.0f;
}

/* ---------------------------------------------------------------- optimizer, elementwise */

static void test_cuda_adamw_matches_cpu(void) {
    const int64_t n = 1234;
    float *p = hrand(n, 1), *g = hrand(n, 1), *m = hrand(n, 0.1f), *v = hrand(n, 0.1f);
    for (int64_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float *gp = gup(p, n), *gg = gup(g, n), *gm = gup(m, n), *gv = gup(v, n);
    for (int t = 1; t <= 3; t++) {
        CPU->adamw(CPU, p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
        GPU->adamw(GPU, gp, gg, gm, gv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
    }
    CHECK_G("adamw p", gp, p, n, 1e-6, 1e-5);
    CHECK_G("adamw m", gm, m, n, 1e-7, 1e-5);
    CHECK_G("adamw v", gv, v, n, 1e-7, 1e-5);
    free(p), free(g), free(m), free(v);
    gfree(gp), gfree(gg), gfree(gm), gfree(gv);
}

/* The multi-tensor forms against the CPU: segments spanning several 65536-element chunks, one
 * shorter than a chunk, one empty, each buffer laid out differently. */
/* AdamW updates four parameters at a time when its arrays are 16-byte aligned and one at a time
 * otherwise (ops_cuda.cu adamw_span): the same values one float further on (misaligned) must
 * give the same bits, in adamw and adamw_many, the tails past a multiple of four included. */
static void test_cuda_adamw_vector_and_scalar_paths_same_bits(void) {
    const int64_t n = 1003;
    const ops_segment seg[2] = {{0, 0, 0, 500, 0.1f}, {500, 500, 500, n - 500, 0.0f}};
    float *h[4] = {hrand(n, 1), hrand(n, 1), hrand(n, 0.1f), hrand(n, 0.1f)}, *r[2][4];
    for (int64_t i = 0; i < n; i++) h[3][i] = fabsf(h[3][i]); /* p, g, m, v */
    for (int off = 0; off < 2; off++) {
        float *d[4];
        for (int k = 0; k < 4; k++) {
            d[k] = GPU->alloc(GPU, (size_t)(n + 1) * sizeof(float));
            GPU->to_device(GPU, d[k] + off, h[k], (size_t)n * sizeof(float));
        }
        for (int t = 1; t <= 2; t++)
            GPU->adamw(GPU, d[0] + off, d[1] + off, d[2] + off, d[3] + off, n, 1e-3f, 0.9f, 0.95f,
                       1e-8f, 0.1f, 0.5f, t);
        GPU->adamw_many(GPU, d[0] + off, d[1] + off, d[2] + off, d[3] + off, seg, 2, 1e-3f, 0.9f,
                        0.95f, 1e-8f, 0.5f, 3);
        for (int k = 0; k < 4; k++) r[off][k] = gdown(d[k] + off, n), gfree(d[k]);
    }
    int same = 1;
    for (int k = 0; k < 4; k++) same &= memcmp(r[0][k], r[1][k], (size_t)n * sizeof(float)) == 0;
    int moved = memcmp(r[0][0], h[0], (size_t)n * sizeof(float)) != 0;
    for (int k = 0; k < 4; k++) free(h[k]), free(r[0][k]), free(r[1][k]);
    CHECK(moved, "adamw left the parameters as they were");
    CHECK(same, "aligned (vector) and misaligned (scalar) AdamW differ");
}

/* One kind of write into the parameters p (np floats) after AdamW made their bf16 copy valid;
 * src holds np other values. */
static void w16_write(int kind, float *p, const float *src, float *host, int64_t np) {
    switch (kind) {
    case 0:
        break; /* AdamW alone */
    case 1:
        GPU->to_device(GPU, p + 5, host, 100 * sizeof(float));
        break;
    case 2:
        GPU->copy(GPU, p + 100, src, 200 * sizeof(float));
        break;
    case 3:
        GPU->copy2d(GPU, p + 3, 64 * sizeof(float), src, 64 * sizeof(float), 8 * 4, 10);
        break;
    case 4:
        GPU->zero(GPU, p + 1000, 50 * sizeof(float));
        break;
    case 5:
        GPU->axpy(GPU, p + 7, 0.5f, src, 900);
        break;
    case 6:
        GPU->scale(GPU, p + np - 40, 2.0f, 32);
        break; /* the bias */
    case 7:
        GPU->matmul(GPU, p + 64, src, src + 512, 4, 16, 8, 0, 0, 1.0f, 0.0f);
        break;
    case 8: { /* adamw_many on part of it: that part's copy is rewritten, the rest kept */
        const ops_segment seg[2] = {{0, 0, 0, 700, 0.1f}, {np - 40, np - 40, np - 40, 32, 0.0f}};
        GPU->adamw_many(GPU, p, src, p + np, p + 2 * np, seg, 2, 1e-2f, 0.9f, 0.95f, 1e-8f, 1.0f,
                        3);
        break;
    }
    }
}

/* Under bf16 AdamW also writes a bf16 copy of the parameters it updates, which the linears'
 * GEMMs read instead of rounding their weights before each use (ops_cuda_w16.cu). A linear
 * whose weights and bias lie in the updated buffer must give the same bits as the same linear
 * on a fresh copy of them elsewhere (rounded at the call), after AdamW alone and after each
 * other kind of write into them: a copy left stale gives the old weights' product. Base
 * aligned (vector AdamW) and one float off (scalar). */
static void test_cuda_bf16_weight_copy_follows_every_write(void) {
    if (fake) return;
    const int N = 8, C = 64, OC = 32;
    const int64_t np = OC * C + OC + 8; /* weights, bias, a tail */
    float *hp = hrand(np, 1), *hs = hrand(np, 1), *x = hrand(N * C, 1), *y = hrand(N * OC, 1);
    ops_cuda_set_bf16(GPU, 1);
    acts16 = 1;
    float *dx = gup_act(x, N * C), *dy = gup_act(y, N * OC), *dy2 = gup_act(y, N * OC);
    float *src = gup(hs, np), *q = GPU->alloc(GPU, np * sizeof(float));
    int bad = -1;
    for (int off = 0; off < 2 && bad < 0; off++) {
        /* p, then AdamW's moments (zeroed) behind it; its gradient is src */
        float *buf = GPU->alloc(GPU, (3 * np + 1) * sizeof(float)), *p = buf + off;
        GPU->to_device(GPU, p, hp, np * sizeof(float));
        for (int kind = 0; kind < 9 && bad < 0; kind++) {
            GPU->adamw(GPU, p, src, p + np, p + 2 * np, np, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f,
                       kind + 1);
            w16_write(kind, p, src, hs + 7, np);
            GPU->copy(GPU, q, p, np * sizeof(float));
            GPU->linear_fwd(GPU, dy, dx, p, p + OC * C, N, C, OC);
            GPU->linear_fwd(GPU, dy2, dx, q, q + OC * C, N, C, OC);
            float *a = gdown_act(dy, N * OC), *b = gdown_act(dy2, N * OC);
            if (memcmp(a, b, N * OC * sizeof(float))) bad = kind + 10 * off;
            free(a), free(b);
        }
        gfree(buf);
    }
    acts16 = 0;
    ops_cuda_set_bf16(GPU, 0);
    static const char *const kinds[] = {"adamw", "to_device", "copy",   "copy2d",    "zero",
                                        "axpy",  "scale",     "matmul", "adamw_many"};
    CHECK(bad < 0, "a linear on AdamW's weights after %s (base %s) differs from one on a copy",
          bad < 0 ? "" : kinds[bad % 10], bad >= 10 ? "one float off" : "aligned");
    free(hp), free(hs), free(x), free(y);
    gfree(dx), gfree(dy), gfree(dy2), gfree(src), gfree(q);
}

static void test_cuda_adamw_many_and_sumsq_many_match_cpu(void) {
    enum { k = 4 };
    const int64_t np = 300000, ng = 250000, nm = 280000;
    const ops_segment seg[k] = {{0, 100, 200, 140000, 0.1f},
                                {150000, 140500, 140300, 100000, 0.0f},
                                {299000, 249000, 279000, 0, 0.1f},
                                {250001, 240400, 240401, 777, 0.05f}};
    float *p = hrand(np, 1), *g = hrand(ng, 1), *m = hrand(nm, 0.1f), *v = hrand(nm, 0.1f);
    for (int64_t i = 0; i < nm; i++) v[i] = fabsf(v[i]);
    float *gp = gup(p, np), *gg = gup(g, ng), *gm = gup(m, nm), *gv = gup(v, nm);
    for (int t = 1; t <= 2; t++) {
        CPU->adamw_many(CPU, p, g, m, v, seg, k, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.5f, t);
        GPU->adamw_many(GPU, gp, gg, gm, gv, seg, k, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.5f, t);
    }
    CHECK_G("adamw_many p", gp, p, np, 1e-6, 1e-5);
    CHECK_G("adamw_many m", gm, m, nm, 1e-7, 1e-5);
    CHECK_G("adamw_many v", gv, v, nm, 1e-7, 1e-5);
    double c[k], d[k];
    CPU->sumsq_many(CPU, g, seg, k, c);
    GPU->sumsq_many(GPU, gg, seg, k, d);
    for (int i = 0; i < k; i++)
        CHECK(fabs(c[i] - d[i]) <= 1e-12 * c[i], "sumsq_many segment %d: gpu %.17g cpu %.17g", i,
              d[i], c[i]);
    free(p), free(g), free(m), free(v);
    gfree(gp), gfree(gg), gfree(gm), gfree(gv);
}

static void test_cuda_elementwise_and_reductions_match_cpu(void) {
    const int64_t n = 100003;
    float *a = hrand(n, 1), *b = hrand(n, 1), *out = hrand(n, 1);
    float *ga = gup(a, n), *gb = gup(b, n), *gout = gup(out, n);
    CPU->add(CPU, out, a, b, n);
    GPU->add(GPU, gout, ga, gb, n);
    CHECK_G("add", gout, out, n, 0, 0);
    CPU->axpy(CPU, out, -0.3f, a, n);
    GPU->axpy(GPU, gout, -0.3f, ga, n);
    CHECK_G("axpy", gout, out, n, 1e-7, 1e-6);
    /* a GPU contracts axpy's y + a x into one FMA (nvcc --fmad=true; make emu-fma): the inputs of
     * the exact checks below are the CPU's, not axpy's result an ulp away */
    GPU->to_device(GPU, gout, out, (size_t)n * sizeof(float));
    CPU->scale(CPU, out, 1.7f, n);
    GPU->scale(GPU, gout, 1.7f, n);
    CHECK_G("scale", gout, out, n, 0, 0);
    /* double accumulation of the same floats in another order: ~1e-16 relative */
    double s1 = CPU->sum(CPU, out, n), s2 = GPU->sum(GPU, gout, n);
    CHECK_CLOSE(s2, s1, 1e-9, 1e-12, "sum");
    s1 = CPU->sumsq(CPU, out, n), s2 = GPU->sumsq(GPU, gout, n);
    CHECK_CLOSE(s2, s1, 1e-9, 1e-12, "sumsq");
    CHECK_CLOSE(GPU->sum(GPU, gout, 7), CPU->sum(CPU, out, 7), 1e-12, 1e-12, "sum of 7");
    free(a), free(b), free(out);
    gfree(ga), gfree(gb), gfree(gout);
}

/* add and scale_act on activations (the elementwise test above covers the fp32 ops axpy and
 * scale on it). */
static void test_cuda_add_matches_cpu(void) {
    const int64_t n = 10007;
    float *a = hrand(n, 1), *b = hrand(n, 1), *out = hrand(n, 1);
    float *ga = gup_act(a, n), *gb = gup_act(b, n), *gout = gup_act(out, n);
    CPU->add(CPU, out, a, b, n);
    GPU->add(GPU, gout, ga, gb, n);
    CHECK_A("add", gout, out, n, 0, 0);
    /* scale_act (model.embed_scale): one fp32 product, so bf16 differs by its one rounding */
    CPU->scale_act(CPU, out, 8.0f * sqrtf(1.5f), n);
    GPU->scale_act(GPU, gout, 8.0f * sqrtf(1.5f), n);
    CHECK_A("scale_act", gout, out, n, 0, 0);
    free(a), free(b), free(out);
    gfree(ga), gfree(gb), gfree(gout);
}

/* ---------------------------------------------------------------- mixture of experts */

/* The routing, permutation and combination ops of an MoE layer against the CPU: N tokens pick
 * k of E experts (probabilities, lse, top-k, gates, psum fp32), rows gathered into expert order
 * with and without gate scaling, combined back (overwrite and +=, one dropped assignment), the
 * gates' gradient, and the router's backward with the aux and z terms. fp32 reductions of C or E
 * terms of O(1): ATOL / RTOL. */
static void test_cuda_moe_ops_match_cpu(void) {
    enum { N = 23, E = 6, k = 2, C = 40 };
    const int64_t A = (int64_t)N * k;
    float *logits = hrand(N * E, 2), *probs = hrand(N * E, 1), *lse = hrand(N, 1);
    float *gate = hrand(A, 1), *psum = hrand(E, 1);
    int32_t topk[N * k], gtopk[N * k];
    float *glogits = gup_act(logits, N * E), *gprobs = gup(probs, N * E), *glse = gup(lse, N);
    float *ggate = gup(gate, A), *gpsum = gup(psum, E);
    int32_t *gtk = gupi(topk, A);
    float *bias = hrand(E, 0.3f), *gbias = gup(bias, E); /* the balancing bias moves choices */
    /* Mixtral's (NULL), Qwen3-MoE's without renormalization, node-limited (2 of 3 nodes ranked
     * by their best score: top_k / max_nodes_per_token = 1), DeepSeek-V3's (sigmoid, 2 of 3
     * groups by top-2 sums, scaled); the last one stays for the ops below */
    const ops_moe_route routes[4] = {
        {0, 1, 1, 1, 1.0f, 2}, {0, 0, 1, 1, 1.0f, 2}, {1, 1, 3, 2, 2.5f, 1}, {1, 1, 3, 2, 2.5f, 2}};
    for (int ri = -1; ri < 4; ri++) {
        const ops_moe_route *r = ri < 0 ? NULL : &routes[ri];
        CPU->moe_router_fwd(CPU, probs, lse, topk, gate, psum, logits, bias, N, E, k, r);
        GPU->moe_router_fwd(GPU, gprobs, glse, gtk, ggate, gpsum, glogits, gbias, N, E, k, r);
        CHECK_G("router probs", gprobs, probs, N * E, EW, EW);
        CHECK_G("router lse", glse, lse, N, EW, EW);
        CHECK_G("router gate", ggate, gate, A, EW, EW);
        CHECK_G("router psum", gpsum, psum, E, EW, EW);
        GPU->to_host(GPU, gtopk, gtk, sizeof gtopk);
        for (int a = 0; a < A; a++)
            CHECK(gtopk[a] == topk[a], "route %d topk[%d]: gpu %d cpu %d", ri, a, gtopk[a],
                  topk[a]);
    }
    free(bias), gfree(gbias);

    /* assignment a goes to row src-order position pos[a]; one dropped */
    int32_t src[N * k], pos[N * k];
    for (int a = 0; a < A; a++) src[a] = (int32_t)((a * 7) % A), pos[src[a]] = a;
    pos[5] = -1;
    int32_t *gsrc = gupi(src, A), *gpos = gupi(pos, A);
    float *x = hrand(N * C, 1), *rows = hrand(A * C, 1), *y = hrand(N * C, 1);
    float *gx = gup_act(x, N * C), *grows = gup_act(rows, A * C), *gy = gup_act(y, N * C);
    for (int scaled = 0; scaled < 2; scaled++) {
        CPU->moe_gather(CPU, rows, x, src, scaled ? gate : NULL, (int)A, C, k);
        GPU->moe_gather(GPU, grows, gx, gsrc, scaled ? ggate : NULL, (int)A, C, k);
        CHECK_A("gather", grows, rows, A * C, EW, EW);
    }
    for (int acc = 0; acc < 2; acc++) {
        CPU->moe_combine(CPU, y, rows, pos, gate, N, k, C, acc);
        GPU->moe_combine(GPU, gy, grows, gpos, ggate, N, k, C, acc);
        CHECK_A(acc ? "combine (+=)" : "combine", gy, y, N * C, EW, EW);
    }
    float *dg = hrand(A, 1), *gdg = gup(dg, A);
    CPU->moe_gate_grad(CPU, dg, y, rows, pos, N, k, C);
    GPU->moe_gate_grad(GPU, gdg, gy, grows, gpos, N, k, C);
    CHECK_G("gate grad", gdg, dg, A, ATOL, RTOL);

    float *aux = hrand(E, 0.1f), *gaux = gup(aux, E), *dl = hrand(N * E, 1);
    float *gdl = gup_act(dl, N * E);
    for (int full = 0; full < 4; full++) { /* 2, 3: under the last (sigmoid) route */
        const ops_moe_route *r = full >= 2 ? &routes[3] : NULL;
        int f = full & 1;
        CPU->moe_router_bwd(CPU, dl, f ? dg : NULL, probs, lse, topk, gate, f ? aux : NULL,
                            f && !r ? 0.01f : 0.0f, N, E, k, r);
        GPU->moe_router_bwd(GPU, gdl, f ? gdg : NULL, gprobs, glse, gtk, ggate, f ? gaux : NULL,
                            f && !r ? 0.01f : 0.0f, N, E, k, r);
        CHECK_A("router dlogits", gdl, dl, N * E, EW, 1e-4);
    }
    free(logits), free(probs), free(lse), free(gate), free(psum), free(x), free(rows), free(y);
    free(dg), free(aux), free(dl);
    gfree(glogits), gfree(gprobs), gfree(glse), gfree(ggate), gfree(gpsum), gfree(gtk);
    gfree(gsrc), gfree(gpos), gfree(gx), gfree(grows), gfree(gy), gfree(gdg), gfree(gaux);
    gfree(gdl);
}

/* ---------------------------------------------------------------- bf16 activations */

BF16_ACTS_TEST(test_cuda_bf16_acts_embedding_matches_cpu,
               test_cuda_embedding_matches_cpu_vocab_slice_positions_repeats)
BF16_ACTS_TEST(test_cuda_bf16_acts_layernorm_and_rmsnorm_match_cpu,
               test_cuda_layernorm_and_rmsnorm_match_cpu)
BF16_ACTS_TEST(test_cuda_bf16_acts_gelu_swiglu_match_cpu, test_cuda_gelu_swiglu_match_cpu)
BF16_ACTS_TEST(test_cuda_bf16_acts_rope_matches_cpu,
               test_cuda_rope_matches_cpu_in_place_and_inverse)
BF16_ACTS_TEST(test_cuda_bf16_acts_attention_merge_matches_cpu,
               test_cuda_attention_merge_matches_cpu)
BF16_ACTS_TEST(test_cuda_bf16_acts_xent_matches_cpu,
               test_cuda_xent_matches_cpu_padding_ignored_targets_aliasing)
BF16_ACTS_TEST(test_cuda_bf16_acts_xent_vocab_parallel_matches_cpu,
               test_cuda_xent_vocab_parallel_matches_cpu)
BF16_ACTS_TEST(test_cuda_bf16_acts_add_matches_cpu, test_cuda_add_matches_cpu)
BF16_ACTS_TEST(test_cuda_bf16_acts_moe_ops_match_cpu, test_cuda_moe_ops_match_cpu)

/* Attention on bf16 activations through every path: the default (tensor-core kernels reading and
 * writing bf16 where D has one, bf16 GEMMs on widened copies otherwise), and the flash kernels
 * and GEMMs forced (fp32 code on widened copies, outputs narrowed). The tensor-core bound (see
 * above) plus one rounding of each output. */
static void test_cuda_bf16_acts_attention_all_paths_match_cpu(void) {
    if (fake) return;
    static const att_tol tol = {1e-2, 1e-2, 1e-3, 1e-3, 2e-2, 2e-2, 1};
    static const char *const modes[] = {"auto", "flash", "gemm"};
    acts16 = 1;
    int ok = 1;
    for (int m = 0; ok && m < 3; m++) {
        ok = attention_cases_with("UST_CUDA_ATTENTION", modes[m], att_cases, N_ATT_CASES, &tol) &&
             attention_cases_with("UST_CUDA_ATTENTION", modes[m], att_tc_cases,
                                  sizeof att_tc_cases / sizeof att_tc_cases[0], &tol);
        if (!ok) {
            char why[sizeof msg];
            snprintf(why, sizeof why, "%s: %s", modes[m], msg);
            snprintf(msg, sizeof msg, "%s", why);
        }
    }
    acts16 = 0;
    CHECK(ok, "bf16 acts attention %s", msg);
}

/* ---------------------------------------------------------------- tiny model */

enum { MB = 2, MT = 16 };

/* The micro-batch record of in and tgt: positions 0..MT-1 of each sequence. */
static const ust_batch *tiny_batch(const int32_t *in, const int32_t *tgt) {
    static int32_t pos[MB * MT];
    static ust_batch b;
    for (int i = 0; i < MB * MT; i++) pos[i] = i % MT;
    b = (ust_batch){.tokens = in, .targets = tgt, .positions = pos};
    return &b;
}

static void tiny_config(ust_config *c, ust_arch arch) {
    cfg_defaults(c);
    c->model.arch = arch;
    c->model.n_layer = 2;
    c->model.d_model = 64;
    c->model.n_head = 4;
    c->model.n_kv_head = arch == ARCH_LLAMA ? 2 : 4;
    c->model.d_ff = arch == ARCH_LLAMA ? 96 : 256;
    c->model.vocab_size = 100;
    c->model.vocab_pad = 64;
    c->model.max_seq_len = MT;
    c->model.rope_theta = 10000;
    c->train.micro_batch_size = MB;
    c->train.seq_len = MT;
}

/* Three SGD steps (p -= 0.1 g, through the backends' axpy) of the same model on both backends:
 * per-step losses within 1e-5 relative, gradients within 1e-3 of their largest magnitude plus
 * 1e-3 relative (fp32 reassociation through 2 layers), final parameters within 1e-5 + 1e-4
 * relative. SGD, not AdamW: Adam's update is ~lr * sign(g) for any tiny g, so reassociation noise
 * in a near-zero gradient would flip it (AdamW itself is compared op by op above). */
static int model_3_steps_match(ust_arch arch, int experts) {
    ust_config c;
    tiny_config(&c, arch);
    if (experts) { /* every layer MoE: router, dispatch, experts, combine and their backward */
        c.model.moe.num_experts = experts;
        c.model.moe.top_k = 2;
        c.model.moe.d_ff_expert = 48;
        c.model.moe.every = 1;
        c.model.moe.shared_expert = true;
        c.model.moe.aux_loss_coef = 0.01;
        c.model.moe.z_loss_coef = 0.001;
    }
    ust_err e;
    ust_arena ac, ag;
    model *mc = NULL, *mg = NULL;
    mem_init(&ac, CPU);
    mem_init(&ag, GPU);
    if (model_create(&mc, &c, CPU, &ac, &e) || model_create(&mg, &c, GPU, &ag, &e)) {
        snprintf(msg, sizeof msg, "model_create: %s", e.msg);
        return 0;
    }
    model_init_params(mc, 7);
    model_init_params(mg, 7);
    int64_t n = model_numel(mc);
    int32_t in[MB * MT], tgt[MB * MT];
    int ok = 1;
    for (int step = 1; step <= 3 && ok; step++) {
        for (int i = 0; i < MB * MT; i++)
            in[i] = irand(c.model.vocab_size), tgt[i] = irand(c.model.vocab_size);
        tgt[5] = -1;
        int64_t nt1 = 0, nt2 = 0;
        model_zero_grads(mc);
        model_zero_grads(mg);
        double l1 = model_forward(mc, tiny_batch(in, tgt), 1.0f / (MB * MT), &nt1);
        double l2 = model_forward(mg, tiny_batch(in, tgt), 1.0f / (MB * MT), &nt2);
        if (!(fabs(l2 - l1) <= 1e-5 * fabs(l1)) || nt1 != nt2) {
            snprintf(msg, sizeof msg, "step %d: loss gpu %.9g, cpu %.9g", step, l2, l1);
            ok = 0;
            break;
        }
        model_backward(mc);
        model_backward(mg);
        const float *gc = model_grads(mc);
        float *gg = gdown(model_grads(mg), n), big = 0.0f;
        for (int64_t i = 0; i < n; i++) big = fabsf(gc[i]) > big ? fabsf(gc[i]) : big;
        char what[64];
        snprintf(what, sizeof what, "step %d gradient", step);
        ok = close_f(what, gg, gc, n, 1e-3 * big, 1e-3);
        free(gg);
        CPU->axpy(CPU, model_params(mc), -0.1f, model_grads(mc), n);
        GPU->axpy(GPU, model_params(mg), -0.1f, model_grads(mg), n);
    }
    if (ok)
        ok = gclose("parameters after 3 steps", model_params(mg), model_params(mc), n, 1e-5, 1e-4);
    model_destroy(mc);
    model_destroy(mg);
    mem_release(&ac);
    mem_release(&ag);
    return ok;
}

/* bf16 GEMM inputs (every linear layer and the attention GEMMs) against the fp32 CPU run of the
 * same tiny llama model: bf16 keeps 8 significant bits, so each GEMM is off by ~2^-9 relative
 * per input and the loss by far less than 1%; the gradient direction stays the same (cosine
 * > 0.999) while a wrong layout or a missing term would change both at O(1). */
static void test_cuda_tiny_model_bf16_close_to_fp32_cpu(void) {
    if (fake) return;
    ust_config c;
    tiny_config(&c, ARCH_LLAMA);
    ust_err e;
    ust_arena ac, ag;
    model *mc = NULL, *mg = NULL;
    mem_init(&ac, CPU);
    mem_init(&ag, GPU);
    ops_cuda_set_bf16(GPU, 1); /* before the model sizes its activations (act_size 2) */
    CHECK(model_create(&mc, &c, CPU, &ac, &e) == 0 && model_create(&mg, &c, GPU, &ag, &e) == 0,
          "model_create: %s", e.msg);
    model_init_params(mc, 11);
    model_init_params(mg, 11);
    int32_t in[MB * MT], tgt[MB * MT];
    for (int i = 0; i < MB * MT; i++)
        in[i] = irand(c.model.vocab_size), tgt[i] = irand(c.model.vocab_size);
    int64_t n = model_numel(mc), nt = 0;
    model_zero_grads(mc);
    model_zero_grads(mg);
    double l1 = model_forward(mc, tiny_batch(in, tgt), 1.0f / (MB * MT), &nt);
    double l2 = model_forward(mg, tiny_batch(in, tgt), 1.0f / (MB * MT), &nt);
    model_backward(mc);
    model_backward(mg);
    ops_cuda_set_bf16(GPU, 0);
    float *gg = gdown(model_grads(mg), n);
    const float *gc = model_grads(mc);
    double dot = 0, n1 = 0, n2 = 0;
    for (int64_t i = 0; i < n; i++)
        dot += (double)gg[i] * gc[i], n1 += (double)gc[i] * gc[i], n2 += (double)gg[i] * gg[i];
    free(gg);
    model_destroy(mc);
    model_destroy(mg);
    mem_release(&ac);
    mem_release(&ag);
    CHECK(fabs(l2 - l1) <= 0.01 * fabs(l1), "bf16 loss %.6g vs fp32 %.6g", l2, l1);
    double cosine = dot / sqrt(n1 * n2 + 1e-300);
    CHECK(cosine > 0.999, "gradient cosine bf16 vs fp32 %.6f", cosine);
}

static void test_cuda_tiny_gpt2_three_steps_match_cpu(void) {
    CHECK(model_3_steps_match(ARCH_GPT2, 0), "%s", msg);
}

static void test_cuda_tiny_llama_three_steps_match_cpu(void) {
    CHECK(model_3_steps_match(ARCH_LLAMA, 0), "%s", msg);
}

static void test_cuda_tiny_moe_three_steps_match_cpu(void) {
    CHECK(model_3_steps_match(ARCH_LLAMA, 4), "%s", msg);
}

/* ---------------------------------------------------------------- bf16 optimizer states */

static void frand_seed(uint64_t s) { rng_state = 0x243F6A8885A308D3ull + s; }

/* Round to nearest even, written here apart from ops.h's ops_state_bf16 (finite values). */
static uint16_t rne16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* n bf16 states of random values (|x| with abs) and the same widened to fp32. */
static uint16_t *state16_rand(int64_t n, float scale, int abs_, float **wide) {
    uint16_t *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(uint16_t));
    *wide = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        float x = frand() * scale;
        h[i] = rne16(abs_ ? fabsf(x) : x);
        (*wide)[i] = ops_state_f32(h[i]);
    }
    return h;
}

static void *bup(const ust_ops *o, const void *h, size_t bytes) {
    void *d = o->alloc(o, bytes ? bytes : 4);
    o->to_device(o, d, h, bytes);
    return d;
}

/* Device fp32 states s (n) against bf16 states s16: s16 must hold s rounded (rne16); s
 * then takes those rounded values, as the fp32 form's next step would see them. */
static int state16_is_rounded(const ust_ops *o, const char *what, float *s, const uint16_t *s16,
                              int64_t n) {
    float *f = malloc((size_t)n * sizeof(float));
    uint16_t *h = malloc((size_t)n * sizeof(uint16_t));
    o->to_host(o, f, s, (size_t)n * sizeof(float));
    o->to_host(o, h, s16, (size_t)n * sizeof(uint16_t));
    int ok = 1;
    for (int64_t i = 0; i < n && ok; i++) {
        ok = h[i] == rne16(f[i]);
        if (!ok)
            snprintf(msg, sizeof msg, "%s %s[%lld]: bf16 state %#06x, fp32 form %.9g (%#06x)",
                     o == CPU ? "cpu" : "gpu", what, (long long)i, h[i], f[i], rne16(f[i]));
        f[i] = ops_state_f32(rne16(f[i]));
    }
    o->to_device(o, s, f, (size_t)n * sizeof(float));
    free(f), free(h);
    return ok;
}

static int same_bits(const ust_ops *o, const char *what, const float *a, const float *b,
                     int64_t n) {
    float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    o->to_host(o, x, a, (size_t)n * sizeof(float));
    o->to_host(o, y, b, (size_t)n * sizeof(float));
    int ok = memcmp(x, y, (size_t)n * sizeof(float)) == 0;
    if (!ok)
        snprintf(msg, sizeof msg, "%s %s: bf16-state op differs", o == CPU ? "cpu" : "gpu", what);
    free(x), free(y);
    return ok;
}

/* adamw16_many (bf16 states) on backend o against adamw_many on the widened states, two steps:
 * the same parameters bit for bit and the states exactly the fp32 form's rounded to nearest even
 * (a truncating rounding, or a state not written back, fails), on the vector and scalar paths
 * (a misaligned segment, tails) and across 65536-element chunks. Returns the final parameters,
 * m and v (widened) on the host. */
static int adamw16_on(const ust_ops *o, float **out) {
    enum { k = 3 };
    const int64_t np = 90000, nm = 90000;
    const ops_segment seg[k] = {{0, 100, 200, 70000, 0.1f},
                                {70001, 70500, 70301, 777, 0.0f},
                                {80000, 75000, 71080, 0, 0.1f}};
    frand_seed(11);
    float *p = hrand(np, 1), *g = hrand(np, 1), *mw, *vw;
    uint16_t *m16 = state16_rand(nm, 0.1f, 0, &mw), *v16 = state16_rand(nm, 0.01f, 1, &vw);
    float *pa = bup(o, p, np * 4), *pb = bup(o, p, np * 4), *dg = bup(o, g, np * 4);
    float *dm = bup(o, mw, nm * 4), *dv = bup(o, vw, nm * 4);
    uint16_t *dm16 = bup(o, m16, nm * 2), *dv16 = bup(o, v16, nm * 2);
    int ok = 1;
    for (int t = 1; t <= 2 && ok; t++) {
        o->adamw16_many(o, pa, dg, dm16, dv16, seg, k, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.5f, t);
        o->adamw_many(o, pb, dg, dm, dv, seg, k, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.5f, t);
        ok = same_bits(o, "adamw16_many p", pa, pb, np) &&
             state16_is_rounded(o, "adamw16_many m", dm, dm16, nm) &&
             state16_is_rounded(o, "adamw16_many v", dv, dv16, nm);
    }
    out[0] = malloc(np * 4), out[1] = malloc(nm * 4), out[2] = malloc(nm * 4);
    o->to_host(o, out[0], pa, np * 4);
    o->to_host(o, out[1], dm, nm * 4);
    o->to_host(o, out[2], dv, nm * 4);
    void *dev[] = {pa, pb, dg, dm, dv, dm16, dv16};
    for (int i = 0; i < 7; i++) o->free(o, dev[i]);
    free(p), free(g), free(mw), free(vw), free(m16), free(v16);
    return ok;
}

/* momentum16 on backend o against optim_muon.c's fp32 steps (scale, axpy; then scale and axpy
 * or copy) on the widened momentum, Nesterov or not, aligned and one float off. */
static int momentum16_on(const ust_ops *o, int nesterov, int off, float **out) {
    const int64_t n = 1003;
    const float mu = 0.95f, gs = 0.5f;
    frand_seed(12 + nesterov);
    float *g = hrand(n, 1), *mw;
    uint16_t *m16 = state16_rand(n, 0.1f, 0, &mw);
    float *ga = (float *)o->alloc(o, (n + 1) * 4) + off, *gb = bup(o, g, n * 4);
    float *dm = bup(o, mw, n * 4);
    uint16_t *dm16 = (uint16_t *)o->alloc(o, (n + 1) * 2) + off;
    o->to_device(o, ga, g, n * 4);
    o->to_device(o, dm16, m16, n * 2);
    int ok = 1;
    for (int step = 0; step < 2 && ok; step++) {
        o->momentum16(o, ga, dm16, n, mu, gs, nesterov);
        o->scale(o, dm, mu, n);
        o->axpy(o, dm, gs, gb, n);
        if (nesterov) {
            o->scale(o, gb, gs, n);
            o->axpy(o, gb, mu, dm, n);
        } else {
            o->copy(o, gb, dm, n * 4);
        }
        ok = same_bits(o, "momentum16 g", ga, gb, n) &&
             state16_is_rounded(o, "momentum16 m", dm, dm16, n);
        o->to_device(o, gb, g, n * 4), o->to_device(o, ga, g, n * 4); /* a fresh gradient */
    }
    out[0] = malloc(n * 4);
    o->to_host(o, out[0], dm, n * 4);
    o->free(o, ga - off), o->free(o, gb), o->free(o, dm), o->free(o, dm16 - off);
    free(g), free(mw), free(m16);
    return ok;
}

/* The bf16-state ops: on each backend exactly its fp32 form's arithmetic with the states rounded
 * to nearest even (so the CPU's bits on a device that computes the fp32 form as the CPU does,
 * the emulator's); the GPU against the CPU within adamw's tolerance, the states to a bf16 unit. */
static void test_cuda_bf16_state_ops_match_fp32_forms_and_cpu(void) {
    float *c[3], *d[3];
    CHECK(adamw16_on(CPU, c), "%s", msg);
    CHECK(adamw16_on(GPU, d), "%s", msg);
    CHECK(close_f("adamw16_many p", d[0], c[0], 90000, 1e-6, 1e-5), "%s", msg);
    CHECK(close_f("adamw16_many m", d[1], c[1], 90000, 1e-7, 1.0 / 128), "%s", msg);
    CHECK(close_f("adamw16_many v", d[2], c[2], 90000, 1e-9, 1.0 / 128), "%s", msg);
    for (int i = 0; i < 3; i++) free(c[i]), free(d[i]);
    for (int nesterov = 0; nesterov < 2; nesterov++)
        for (int off = 0; off < 2; off++) {
            CHECK(momentum16_on(CPU, nesterov, off, c), "%s", msg);
            CHECK(momentum16_on(GPU, nesterov, off, d), "%s", msg);
            CHECK(close_f("momentum16 m", d[0], c[0], 1003, 1e-7, 1.0 / 128), "%s", msg);
            free(c[0]), free(d[0]);
        }
}

int main(void) {
    ust_err e;
    CPU = ops_cpu_create(1, 1);
    const char *f = getenv("UST_TEST_CUDA_FAKE");
    if (f && strcmp(f, "cpu") == 0) {
        fake = 1;
        GPU = ops_cpu_create(2, 1);
        printf("# UST_TEST_CUDA_FAKE=cpu: a 2-thread CPU backend stands in for the GPU\n");
    } else {
        GPU = ops_cuda_create(0, &e);
        if (!GPU) {
            int need = ops_cuda_gpu_required(); /* UST_REQUIRE_GPU: a GPU must be there */
            printf("%s cuda ops: %s\n", need ? "FAIL" : "SKIP", e.msg);
            CPU->destroy(CPU);
            return need ? 1 : TEST_SUMMARY();
        }
        int drv, rt;
        ops_cuda_versions(&drv, &rt);
        printf("# CUDA driver %d.%d, runtime %d.%d\n", drv / 1000, drv % 1000 / 10, rt / 1000,
               rt % 1000 / 10);
    }
    if (getenv("UST_TEST_ATT_FULL") && !fake) { /* that check alone (gpu-check.sh's own stage) */
        RUN_TEST(test_cuda_attention_tensor_core_full_size_matches_gemm);
        return TEST_SUMMARY();
    }
    RUN_TEST(test_cuda_alloc_is_zeroed_and_copies_roundtrip);
    RUN_TEST(test_cuda_matmul_matches_cpu_all_transposes);
    RUN_TEST(test_cuda_matmul_batched_matches_cpu_with_strides);
    RUN_TEST(test_cuda_bf16_matmul_within_bf16_rounding_of_fp32);
    RUN_TEST(test_cuda_bf16_gemm_cache_keeps_problems_apart);
    RUN_TEST(test_cuda_newton_schulz_fp32_and_bf16_against_cpu);
    RUN_TEST(test_cuda_linear_fwd_bwd_match_cpu);
    RUN_TEST(test_cuda_grouped_linear_matches_cpu);
    RUN_TEST(test_cuda_bf16_linear_bias_matches_cpu);
    RUN_TEST(test_cuda_linear_gelu_matches_cpu_fp32_and_bf16);
    RUN_TEST(test_cuda_linear_gelu_bwd_matches_cpu_fp32_and_bf16);
    RUN_TEST(test_cuda_bf16_linear_bwd_within_bf16_rounding);
    RUN_TEST(test_cuda_embedding_matches_cpu_vocab_slice_positions_repeats);
    RUN_TEST(test_cuda_embedding_bwd_sorts_many_rows_exactly);
    RUN_TEST(test_cuda_layernorm_and_rmsnorm_match_cpu);
    RUN_TEST(test_cuda_gelu_swiglu_match_cpu);
    RUN_TEST(test_cuda_rope_matches_cpu_in_place_and_inverse);
    RUN_TEST(test_cuda_attention_matches_cpu_causal_gqa_masks_and_head_dims);
    RUN_TEST(test_cuda_attention_flash_kernels_match_cpu);
    RUN_TEST(test_cuda_attention_carries_a_nan_query_to_its_row);
    RUN_TEST(test_cuda_attention_tensor_core_kernels_match_cpu);
    RUN_TEST(test_cuda_attention_tc_one_pass_backward_matches_cpu);
    RUN_TEST(test_cuda_attention_tc_one_pass_backward_matches_two_kernels);
    RUN_TEST(test_cuda_attention_gemm_in_query_chunks_matches_cpu);
    RUN_TEST(test_cuda_attention_merge_matches_cpu);
    RUN_TEST(test_cuda_xent_matches_cpu_padding_ignored_targets_aliasing);
    RUN_TEST(test_cuda_xent_online_softmax_rescales_and_skips_minus_inf);
    RUN_TEST(test_cuda_xent_vocab_parallel_matches_cpu);
    RUN_TEST(test_cuda_softcap_attention_and_xent_match_cpu);
    RUN_TEST(test_cuda_adamw_matches_cpu);
    RUN_TEST(test_cuda_adamw_many_and_sumsq_many_match_cpu);
    RUN_TEST(test_cuda_adamw_vector_and_scalar_paths_same_bits);
    RUN_TEST(test_cuda_bf16_weight_copy_follows_every_write);
    RUN_TEST(test_cuda_elementwise_and_reductions_match_cpu);
    RUN_TEST(test_cuda_add_matches_cpu);
    RUN_TEST(test_cuda_moe_ops_match_cpu);
    RUN_TEST(test_cuda_bf16_acts_embedding_matches_cpu);
    RUN_TEST(test_cuda_bf16_acts_layernorm_and_rmsnorm_match_cpu);
    RUN_TEST(test_cuda_bf16_acts_gelu_swiglu_match_cpu);
    RUN_TEST(test_cuda_bf16_acts_rope_matches_cpu);
    RUN_TEST(test_cuda_bf16_acts_attention_merge_matches_cpu);
    RUN_TEST(test_cuda_bf16_acts_attention_all_paths_match_cpu);
    RUN_TEST(test_cuda_bf16_acts_xent_matches_cpu);
    RUN_TEST(test_cuda_bf16_acts_xent_vocab_parallel_matches_cpu);
    RUN_TEST(test_cuda_bf16_acts_add_matches_cpu);
    RUN_TEST(test_cuda_bf16_acts_moe_ops_match_cpu);
    RUN_TEST(test_cuda_tiny_gpt2_three_steps_match_cpu);
    RUN_TEST(test_cuda_tiny_llama_three_steps_match_cpu);
    RUN_TEST(test_cuda_tiny_moe_three_steps_match_cpu);
    RUN_TEST(test_cuda_tiny_model_bf16_close_to_fp32_cpu);
    RUN_TEST(test_cuda_bf16_state_ops_match_fp32_forms_and_cpu);
    GPU->destroy(GPU);
    CPU->destroy(CPU);
    return TEST_SUMMARY();
}
