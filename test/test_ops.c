/* test_ops: the CPU backend against the contract of ops.h.
 * Forwards are compared with naive double-precision references written here; backwards with
 * central finite differences of L = sum(out * R) for a fixed random R, where the forward runs in
 * fp32 through the op itself and L is accumulated in double.
 *
 * Finite-difference tolerances: with a step eps on an input of size O(1), the fp32 forward's
 * rounding leaves an absolute error of about sqrt(#outputs) * 1e-7 * |out| ~ 1e-6 in L, i.e.
 * ~1e-6 / (2 eps) in the quotient (5e-5 at eps = 1e-2), and the truncation error of the
 * central difference is eps^2 / 6 * |L'''| (~2e-5 * |L'''|; zero for ops that are linear in
 * the perturbed input). Observed worst errors are ~3e-5; gradients are O(1), so atol 5e-4 +
 * rtol 5e-3 is an order of magnitude above both while far below what a wrong term (an
 * O(0.01..1) change) would give. */
#include "error.h"
#include "ops.h"
#include "test.h"

#include <cblas.h>
#include <limits.h>
#include <stdint.h>

#define FD_ATOL 5e-4
#define FD_RTOL 5e-3

static ust_ops *O; /* the one-thread backend every test uses */

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static float frand(void) { /* uniform [-1, 1), splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *fbuf(int64_t n) { return O->alloc(O, (size_t)(n > 0 ? n : 1) * sizeof(float)); }

static float *randv(int64_t n, float scale) {
    float *x = fbuf(n);
    for (int64_t i = 0; i < n; i++) x[i] = frand() * scale;
    return x;
}

static float *dupv(const float *x, int64_t n) {
    float *y = fbuf(n);
    memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}

static void fr(void *p) { O->free(O, p); }

static double dot_r(const float *out, const float *R, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)out[i] * R[i];
    return s;
}

static char msg[512];

/* got[i] vs ref[i], |got - ref| <= atol + rtol |ref| for every i. */
static int close_d(const char *what, const float *got, const double *ref, int64_t n, double atol,
                   double rtol) {
    for (int64_t i = 0; i < n; i++) {
        if (!(fabs(got[i] - ref[i]) <= atol + rtol * fabs(ref[i]))) {
            snprintf(msg, sizeof msg, "%s[%lld]: got %.9g, expected %.9g", what, (long long)i,
                     got[i], ref[i]);
            return 0;
        }
    }
    return 1;
}

static int close_f(const char *what, const float *got, const float *ref, int64_t n, double atol,
                   double rtol) {
    for (int64_t i = 0; i < n; i++) {
        if (!(fabs(got[i] - ref[i]) <= atol + rtol * fabs(ref[i]))) {
            snprintf(msg, sizeof msg, "%s[%lld]: got %.9g, expected %.9g", what, (long long)i,
                     got[i], ref[i]);
            return 0;
        }
    }
    return 1;
}

/* grad = after - before, for ops that accumulate into a preset buffer. */
static float *diffv(const float *after, const float *before, int64_t n) {
    float *d = fbuf(n);
    for (int64_t i = 0; i < n; i++) d[i] = after[i] - before[i];
    return d;
}

/* Central differences of loss() with respect to each x[k], against grad[k]. The step actually
 * taken is (float)(x + eps) - (float)(x - eps), not 2 eps. */
static int fd_ok(const char *what, float *x, const float *grad, int64_t n, double (*loss)(void *),
                 void *ctx, float eps, double atol, double rtol) {
    double worst = 0.0;
    for (int64_t k = 0; k < n; k++) {
        float x0 = x[k];
        x[k] = x0 + eps;
        float xp = x[k];
        double lp = loss(ctx);
        x[k] = x0 - eps;
        float xm = x[k];
        double lm = loss(ctx);
        x[k] = x0;
        double fd = (lp - lm) / ((double)xp - xm), err = fabs(grad[k] - fd);
        if (err > worst) worst = err;
        if (!(err <= atol + rtol * fabs(fd))) {
            snprintf(msg, sizeof msg, "%s[%lld]: analytic %.7g, finite difference %.7g", what,
                     (long long)k, grad[k], fd);
            return 0;
        }
    }
    if (getenv("TEST_VERBOSE")) printf("  %s: max |analytic - fd| = %.3g\n", what, worst);
    return 1;
}

/* ---------------------------------------------------------------- memory */

static void test_alloc_is_zeroed_aligned_and_copies_roundtrip(void) {
    size_t bytes = 1000;
    unsigned char *p = O->alloc(O, bytes), *q = O->alloc(O, bytes);
    CHECK(((uintptr_t)p % 64) == 0 && ((uintptr_t)q % 64) == 0, "not 64-byte aligned");
    for (size_t i = 0; i < bytes; i++) CHECK(p[i] == 0, "alloc not zeroed at %zu", i);
    unsigned char host[1000], back[1000];
    for (size_t i = 0; i < bytes; i++) host[i] = (unsigned char)(i * 31 + 7);
    O->to_device(O, p, host, bytes);
    O->copy(O, q, p, bytes);
    O->sync(O);
    O->to_host(O, back, q, bytes);
    CHECK(memcmp(host, back, bytes) == 0, "to_device/copy/to_host roundtrip differs");
    O->zero(O, q, bytes);
    for (size_t i = 0; i < bytes; i++) CHECK(q[i] == 0, "zero left byte %zu", i);
    fr(p);
    fr(q);
}

/* ---------------------------------------------------------------- matmul */

/* C = alpha op(A) op(B) + beta C0 in double, A stored (M,K) or (K,M) when tA, etc. */
static void ref_matmul(double *C, const float *C0, const float *A, const float *B, int M, int N,
                       int K, int tA, int tB, double alpha, double beta) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int k = 0; k < K; k++)
                s +=
                    (double)(tA ? A[k * M + i] : A[i * K + k]) * (tB ? B[j * K + k] : B[k * N + j]);
            C[i * N + j] = alpha * s + beta * C0[i * N + j];
        }
}

/* fp32 sums of K <= 33 products of O(1) numbers: error <= K * 6e-8 * sum|a b| ~ 1e-5. */
static void test_matmul_all_transpose_combos_with_alpha_beta_match_reference(void) {
    int shapes[2][3] = {{5, 7, 3}, {17, 9, 33}};
    float betas[2] = {0.0f, 0.3f};
    for (int s = 0; s < 2; s++)
        for (int tA = 0; tA < 2; tA++)
            for (int tB = 0; tB < 2; tB++)
                for (int bi = 0; bi < 2; bi++) {
                    int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                    float *A = randv(M * K, 1), *B = randv(K * N, 1), *C = randv(M * N, 1);
                    float *C0 = dupv(C, M * N);
                    double *ref = malloc(sizeof(double) * M * N);
                    O->matmul(O, C, A, B, M, N, K, tA, tB, 0.7f, betas[bi]);
                    ref_matmul(ref, C0, A, B, M, N, K, tA, tB, 0.7, betas[bi]);
                    int ok = close_d("C", C, ref, M * N, 2e-5, 1e-5);
                    free(ref);
                    fr(A), fr(B), fr(C), fr(C0);
                    CHECK(ok, "M=%d N=%d K=%d tA=%d tB=%d beta=%g: %s", M, N, K, tA, tB, betas[bi],
                          msg);
                }
}

static void test_matmul_batched_matches_each_problem_at_its_strides(void) {
    int M = 4, N = 6, K = 5, batch = 3;
    int64_t sA = M * K + 3, sB = K * N + 1, sC = M * N + 7; /* gaps between problems */
    float *A = randv(sA * batch, 1), *B = randv(sB * batch, 1), *C = randv(sC * batch, 1);
    float *C0 = dupv(C, sC * batch);
    O->matmul_batched(O, C, A, B, M, N, K, 1, 0, 1.25f, 0.5f, batch, sA, sB, sC);
    double ref[4 * 6];
    for (int b = 0; b < batch; b++) {
        ref_matmul(ref, C0 + b * sC, A + b * sA, B + b * sB, M, N, K, 1, 0, 1.25, 0.5);
        CHECK(close_d("C", C + b * sC, ref, M * N, 2e-5, 1e-5), "batch %d: %s", b, msg);
        for (int64_t g = M * N; g < sC; g++)
            CHECK(C[b * sC + g] == C0[b * sC + g], "batch %d wrote into the stride gap", b);
    }
    fr(A), fr(B), fr(C), fr(C0);
}

/* ---------------------------------------------------------------- linear */

typedef struct {
    float *inp, *w, *bias, *out, *R;
    int N, C, OC;
} lin_ctx;

static double lin_loss(void *p) {
    lin_ctx *c = p;
    O->linear_fwd(O, c->out, c->inp, c->w, c->bias, c->N, c->C, c->OC);
    return dot_r(c->out, c->R, (int64_t)c->N * c->OC);
}

/* N = 1 too: the CPU backend computes one row (a decoding step) as a GEMV, not a GEMM. */
static void test_linear_forward_matches_reference_with_and_without_bias(void) {
    int N = 6, C = 5, OC = 7;
    float *inp = randv(N * C, 1), *w = randv(OC * C, 1), *bias = randv(OC, 1), *out = fbuf(N * OC);
    double ref[6 * 7];
    for (int with_bias = 0; with_bias < 4; with_bias++) {
        N = with_bias < 2 ? 6 : 1;
        O->linear_fwd(O, out, inp, w, with_bias % 2 ? bias : NULL, N, C, OC);
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) {
                double s = with_bias % 2 ? bias[o] : 0.0;
                for (int c = 0; c < C; c++) s += (double)inp[n * C + c] * w[o * C + c];
                ref[n * OC + o] = s;
            }
        CHECK(close_d("out", out, ref, N * OC, 1e-5, 1e-5), "N=%d bias=%d: %s", N, with_bias % 2,
              msg);
    }
    fr(inp), fr(w), fr(bias), fr(out);
}

/* Linear in each input, so the central difference has no truncation error. */
static void test_linear_backward_matches_finite_differences_and_accumulates(void) {
    int N = 6, C = 5, OC = 7;
    lin_ctx c = {
        randv(N * C, 1), randv(OC * C, 1), randv(OC, 1), fbuf(N * OC), randv(N * OC, 1), N, C, OC};
    float *dinp = randv(N * C, 1); /* garbage: must be overwritten */
    float *dw0 = randv(OC * C, 1), *db0 = randv(OC, 1);
    float *dw = dupv(dw0, OC * C), *db = dupv(db0, OC);
    O->linear_bwd(O, dinp, dw, db, c.R, c.inp, c.w, N, C, OC, 0);
    float *gw = diffv(dw, dw0, OC * C), *gb = diffv(db, db0, OC);
    CHECK(fd_ok("dinp", c.inp, dinp, N * C, lin_loss, &c, 1e-2f, FD_ATOL, FD_RTOL), "%s", msg);
    CHECK(fd_ok("dw", c.w, gw, OC * C, lin_loss, &c, 1e-2f, FD_ATOL, FD_RTOL), "%s", msg);
    CHECK(fd_ok("dbias", c.bias, gb, OC, lin_loss, &c, 1e-2f, FD_ATOL, FD_RTOL), "%s", msg);

    /* acc_dinp adds to what is there; NULL dw/dbias are skipped */
    float *pre = randv(N * C, 1), *dinp2 = dupv(pre, N * C);
    O->linear_bwd(O, dinp2, NULL, NULL, c.R, c.inp, c.w, N, C, OC, 1);
    float *g2 = diffv(dinp2, pre, N * C);
    CHECK(close_f("acc dinp", g2, dinp, N * C, 1e-6, 1e-5), "%s", msg);
    fr(c.inp), fr(c.w), fr(c.bias), fr(c.out), fr(c.R), fr(dinp), fr(dw0), fr(db0), fr(dw), fr(db);
    fr(gw), fr(gb), fr(pre), fr(dinp2), fr(g2);
}

/* ---------------------------------------------------------------- embedding */

enum { EB = 2, ET = 3, EC = 5, EVS = 3, EVE = 8, EP = 4 };
static const int32_t e_tok[EB * ET] = {3, 7, 1, 5, 3, 9}; /* 1 and 9 are outside [3, 8) */
static const int32_t e_pos[EB * ET] = {2, 0, 2, 1, 3, 0}; /* per token; repeated */

typedef struct {
    float *wte, *wpe, *out, *R;
} emb_ctx;

static double emb_loss(void *p) {
    emb_ctx *c = p;
    O->embedding_fwd(O, c->out, e_tok, e_pos, c->wte, c->wpe, EB, ET, EC, EVS, EVE);
    return dot_r(c->out, c->R, EB * ET * EC);
}

static void test_embedding_forward_takes_its_vocab_slice_and_adds_positions(void) {
    float *wte = randv((EVE - EVS) * EC, 1), *wpe = randv(EP * EC, 1), *out = fbuf(EB * ET * EC);
    double ref[EB * ET * EC];
    for (int with_pos = 0; with_pos < 2; with_pos++) {
        O->embedding_fwd(O, out, e_tok, with_pos ? e_pos : NULL, wte, with_pos ? wpe : NULL, EB, ET,
                         EC, EVS, EVE);
        for (int r = 0; r < EB * ET; r++)
            for (int c = 0; c < EC; c++) {
                int id = e_tok[r];
                double v = (id >= EVS && id < EVE) ? wte[(id - EVS) * EC + c] : 0.0;
                if (with_pos) v += wpe[e_pos[r] * EC + c];
                ref[r * EC + c] = v;
            }
        CHECK(close_d("out", out, ref, EB * ET * EC, 1e-6, 1e-6), "with_pos=%d: %s", with_pos, msg);
    }
    fr(wte), fr(wpe), fr(out);
}

static void test_embedding_backward_matches_finite_differences_and_accumulates(void) {
    emb_ctx c = {randv((EVE - EVS) * EC, 1), randv(EP * EC, 1), fbuf(EB * ET * EC),
                 randv(EB * ET * EC, 1)};
    float *dwte0 = randv((EVE - EVS) * EC, 1), *dwpe0 = randv(EP * EC, 1);
    float *dwte = dupv(dwte0, (EVE - EVS) * EC), *dwpe = dupv(dwpe0, EP * EC);
    O->embedding_bwd(O, dwte, dwpe, c.R, e_tok, e_pos, EB, ET, EC, EVS, EVE);
    float *gte = diffv(dwte, dwte0, (EVE - EVS) * EC), *gpe = diffv(dwpe, dwpe0, EP * EC);
    CHECK(fd_ok("dwte", c.wte, gte, (EVE - EVS) * EC, emb_loss, &c, 1e-2f, FD_ATOL, FD_RTOL), "%s",
          msg);
    CHECK(fd_ok("dwpe", c.wpe, gpe, EP * EC, emb_loss, &c, 1e-2f, FD_ATOL, FD_RTOL), "%s", msg);
    fr(c.wte), fr(c.wpe), fr(c.out), fr(c.R), fr(dwte0), fr(dwpe0), fr(dwte), fr(dwpe), fr(gte);
    fr(gpe);
}

/* ---------------------------------------------------------------- norms */

typedef struct {
    float *inp, *w, *b, *out, *mean, *rstd, *R;
    int N, C, rms;
} norm_ctx;

static double norm_loss(void *p) {
    norm_ctx *c = p;
    if (c->rms)
        O->rmsnorm_fwd(O, c->out, c->rstd, c->inp, c->w, c->N, c->C, 1e-5f);
    else
        O->layernorm_fwd(O, c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C, 1e-5f);
    return dot_r(c->out, c->R, (int64_t)c->N * c->C);
}

static norm_ctx norm_make(int N, int C, int rms) {
    norm_ctx c = {randv(N * C, 1), randv(C, 1),     randv(C, 1), fbuf(N * C), fbuf(N),
                  fbuf(N),         randv(N * C, 1), N,           C,           rms};
    for (int i = 0; i < N * C; i++) c.inp[i] += 0.3f; /* a nonzero mean for layernorm to remove */
    return c;
}

static void norm_free(norm_ctx *c) {
    fr(c->inp), fr(c->w), fr(c->b), fr(c->out), fr(c->mean), fr(c->rstd), fr(c->R);
}

/* Normalization of O(1) rows in fp32: ~1e-6 relative. */
static void test_layernorm_forward_matches_reference(void) {
    norm_ctx c = norm_make(5, 13, 0);
    norm_loss(&c);
    double ref[5 * 13], rmean[5], rrstd[5];
    for (int n = 0; n < c.N; n++) {
        double m = 0, v = 0;
        for (int k = 0; k < c.C; k++) m += c.inp[n * c.C + k];
        m /= c.C;
        for (int k = 0; k < c.C; k++) v += (c.inp[n * c.C + k] - m) * (c.inp[n * c.C + k] - m);
        double r = 1.0 / sqrt(v / c.C + 1e-5);
        for (int k = 0; k < c.C; k++)
            ref[n * c.C + k] = (c.inp[n * c.C + k] - m) * r * c.w[k] + c.b[k];
        rmean[n] = m, rrstd[n] = r;
    }
    CHECK(close_d("out", c.out, ref, 5 * 13, 1e-5, 1e-5), "%s", msg);
    CHECK(close_d("mean", c.mean, rmean, 5, 1e-6, 1e-6), "%s", msg);
    CHECK(close_d("rstd", c.rstd, rrstd, 5, 1e-6, 1e-5), "%s", msg);
    norm_free(&c);
}

static void test_layernorm_backward_matches_finite_differences(void) {
    norm_ctx c = norm_make(5, 13, 0);
    norm_loss(&c);
    float *dinp = randv(5 * 13, 1), *dw0 = randv(13, 1), *db0 = randv(13, 1);
    float *dw = dupv(dw0, 13), *db = dupv(db0, 13);
    O->layernorm_bwd(O, dinp, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, 5, 13);
    float *gw = diffv(dw, dw0, 13), *gb = diffv(db, db0, 13);
    CHECK(fd_ok("dinp", c.inp, dinp, 5 * 13, norm_loss, &c, 1e-2f, FD_ATOL, FD_RTOL), "%s", msg);
    CHECK(fd_ok("dw", c.w, gw, 13, norm_loss, &c, 1e-2f, FD_ATOL, FD_RTOL), "%s", msg);
    CHECK(fd_ok("db", c.b, gb, 13, norm_loss, &c, 1e-2f, FD_ATOL, FD_RTOL), "%s", msg);
    norm_free(&c);
    fr(dinp), fr(dw0), fr(db0), fr(dw), fr(db), fr(gw), fr(gb);
}

static void test_rmsnorm_forward_matches_reference(void) {
    norm_ctx c = norm_make(4, 11, 1);
    norm_loss(&c);
    double ref[4 * 11], rr[4];
    for (int n = 0; n < c.N; n++) {
        double ss = 0;
        for (int k = 0; k < c.C; k++) ss += (double)c.inp[n * c.C + k] * c.inp[n * c.C + k];
        double r = 1.0 / sqrt(ss / c.C + 1e-5);
        for (int k = 0; k < c.C; k++) ref[n * c.C + k] = c.inp[n * c.C + k] * r * c.w[k];
        rr[n] = r;
    }
    CHECK(close_d("out", c.out, ref, 4 * 11, 1e-5, 1e-5), "%s", msg);
    CHECK(close_d("rstd", c.rstd, rr, 4, 1e-6, 1e-5), "%s", msg);
    norm_free(&c);
}

static void test_rmsnorm_backward_matches_finite_differences(void) {
    norm_ctx c = norm_make(4, 11, 1);
    norm_loss(&c);
    float *dinp = randv(4 * 11, 1), *dw0 = randv(11, 1), *dw = dupv(dw0, 11);
    O->rmsnorm_bwd(O, dinp, dw, c.R, c.inp, c.w, c.rstd, 4, 11);
    float *gw = diffv(dw, dw0, 11);
    CHECK(fd_ok("dinp", c.inp, dinp, 4 * 11, norm_loss, &c, 1e-2f, FD_ATOL, FD_RTOL), "%s", msg);
    CHECK(fd_ok("dw", c.w, gw, 11, norm_loss, &c, 1e-2f, FD_ATOL, FD_RTOL), "%s", msg);
    norm_free(&c);
    fr(dinp), fr(dw0), fr(dw), fr(gw);
}

/* ---------------------------------------------------------------- activations */

enum { AN = 37 };

typedef struct {
    float *x, *y, *out, *R;
    int swiglu; /* 1: swiglu, 2: geglu (gelu's tanh form gating), 0: gelu */
} act_ctx;

static double act_loss(void *p) {
    act_ctx *c = p;
    if (c->swiglu == 2)
        O->geglu_fwd(O, c->out, c->x, c->y, AN);
    else if (c->swiglu)
        O->swiglu_fwd(O, c->out, c->x, c->y, AN);
    else
        O->gelu_fwd(O, c->out, c->x, AN);
    return dot_r(c->out, c->R, AN);
}

static act_ctx act_make(int swiglu) {
    act_ctx c = {randv(AN, 4), randv(AN, 2), fbuf(AN), randv(AN, 1), swiglu}; /* x in [-4, 4) */
    return c;
}

static void test_gelu_forward_matches_tanh_approximation(void) {
    act_ctx c = act_make(0);
    act_loss(&c);
    double ref[AN];
    for (int i = 0; i < AN; i++) {
        double x = c.x[i];
        ref[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    }
    CHECK(close_d("gelu", c.out, ref, AN, 1e-6, 1e-5), "%s", msg);
    fr(c.x), fr(c.y), fr(c.out), fr(c.R);
}

static void test_gelu_backward_matches_finite_differences(void) {
    act_ctx c = act_make(0);
    float *dinp = fbuf(AN);
    O->gelu_bwd(O, dinp, c.x, c.R, AN);
    CHECK(fd_ok("dinp", c.x, dinp, AN, act_loss, &c, 1e-2f, FD_ATOL, FD_RTOL), "%s", msg);
    fr(c.x), fr(c.y), fr(c.out), fr(c.R), fr(dinp);
}

/* gpt2's fused MLP backward is linear_bwd then gelu_bwd, bit for bit, accumulating dw and db. */
static void test_linear_gelu_backward_is_linear_then_gelu_backward(void) {
    const int N = 7, F = 12, C = 5;
    float *up = randv(N * F, 2.0f), *act = fbuf(N * F), *dout = randv(N * C, 1.0f);
    float *w = randv(C * F, 0.5f), *dw = randv(C * F, 1.0f), *db = randv(C, 1.0f);
    float *dw2 = dupv(dw, C * F), *db2 = dupv(db, C), *dup = fbuf(N * F), *dact = fbuf(N * F);
    float *dup2 = fbuf(N * F);
    O->gelu_fwd(O, act, up, N * F);
    O->linear_gelu_bwd(O, dup, dw, db, dout, act, up, w, N, F, C);
    O->linear_bwd(O, dact, dw2, db2, dout, act, w, N, F, C, 0);
    O->gelu_bwd(O, dup2, up, dact, N * F);
    CHECK(!memcmp(dup, dup2, N * F * sizeof(float)) && !memcmp(dw, dw2, C * F * sizeof(float)) &&
              !memcmp(db, db2, C * sizeof(float)),
          "fused and unfused backward differ");
    float nz = 0;
    for (int i = 0; i < N * F; i++) nz += dup[i] != 0.0f && dup[i] != dact[i];
    CHECK(nz > N * F / 2, "the GELU's backward was not applied (%g of %d elements moved)", nz,
          N * F);
    fr(up), fr(act), fr(dout), fr(w), fr(dw), fr(db), fr(dw2), fr(db2), fr(dup), fr(dact), fr(dup2);
}

static void test_swiglu_forward_matches_reference(void) {
    act_ctx c = act_make(1);
    act_loss(&c);
    double ref[AN];
    for (int i = 0; i < AN; i++) ref[i] = (double)c.x[i] / (1.0 + exp(-(double)c.x[i])) * c.y[i];
    CHECK(close_d("swiglu", c.out, ref, AN, 1e-6, 1e-5), "%s", msg);
    fr(c.x), fr(c.y), fr(c.out), fr(c.R);
}

static void test_swiglu_backward_matches_finite_differences(void) {
    act_ctx c = act_make(1);
    float *dgate = fbuf(AN), *dup = fbuf(AN), *dgate2 = fbuf(AN);
    O->swiglu_bwd(O, dgate, dup, c.R, c.x, c.y, AN);
    CHECK(fd_ok("dgate", c.x, dgate, AN, act_loss, &c, 1e-2f, FD_ATOL, FD_RTOL), "%s", msg);
    CHECK(fd_ok("dup", c.y, dup, AN, act_loss, &c, 1e-2f, FD_ATOL, FD_RTOL), "%s", msg);
    O->swiglu_bwd(O, dgate2, NULL, c.R, c.x, c.y, AN); /* dup not wanted */
    CHECK(memcmp(dgate, dgate2, AN * sizeof(float)) == 0, "dgate changed when dup is NULL");
    fr(c.x), fr(c.y), fr(c.out), fr(c.R), fr(dgate), fr(dup), fr(dgate2);
}

/* GeGLU (model.hidden_act gelu_tanh): torch's gelu(approximate="tanh") of the gate times up */
static void test_geglu_forward_matches_reference(void) {
    act_ctx c = act_make(2);
    act_loss(&c);
    double ref[AN];
    for (int i = 0; i < AN; i++) {
        double x = c.x[i];
        ref[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * c.y[i];
    }
    CHECK(close_d("geglu", c.out, ref, AN, 1e-6, 1e-5), "%s", msg);
    fr(c.x), fr(c.y), fr(c.out), fr(c.R);
}

static void test_geglu_backward_matches_finite_differences(void) {
    act_ctx c = act_make(2);
    float *dgate = fbuf(AN), *dup = fbuf(AN), *dgate2 = fbuf(AN);
    O->geglu_bwd(O, dgate, dup, c.R, c.x, c.y, AN);
    CHECK(fd_ok("dgate", c.x, dgate, AN, act_loss, &c, 1e-2f, FD_ATOL, FD_RTOL), "%s", msg);
    CHECK(fd_ok("dup", c.y, dup, AN, act_loss, &c, 1e-2f, FD_ATOL, FD_RTOL), "%s", msg);
    O->geglu_bwd(O, dgate2, NULL, c.R, c.x, c.y, AN); /* dup not wanted */
    CHECK(memcmp(dgate, dgate2, AN * sizeof(float)) == 0, "dgate changed when dup is NULL");
    fr(c.x), fr(c.y), fr(c.out), fr(c.R), fr(dgate), fr(dup), fr(dgate2);
}

/* ---------------------------------------------------------------- RoPE */

enum { RB = 2, RT = 5, RH = 3, RD = 8, RN = RB * RT * RH * RD };
static const int32_t r_pos[RB * RT] = {0, 5, 100, 7, 2000, 3, 0, 1, 2, 999}; /* (RB, RT) */
#define R_THETA 10000.0f
static const ust_rope R_ROPE = {.theta = R_THETA};

typedef struct {
    float *x, *out, *R;
} rope_ctx;

static double rope_loss(void *p) {
    rope_ctx *c = p;
    O->rope_fwd(O, c->out, c->x, r_pos, RB, RT, RH, RD, &R_ROPE);
    return dot_r(c->out, c->R, RN);
}

/* Angles up to 2000 rad: cos/sin in fp32 lose ~2000 * 6e-8 = 1.2e-4 absolute in the angle if
 * it were formed in float; the op forms it in double, so 1e-5 holds. */
static void test_rope_forward_rotates_half_pairs_by_position(void) {
    float *x = randv(RN, 1), *out = fbuf(RN);
    double ref[RN];
    O->rope_fwd(O, out, x, r_pos, RB, RT, RH, RD, &R_ROPE);
    for (int b = 0; b < RB; b++)
        for (int t = 0; t < RT; t++)
            for (int h = 0; h < RH; h++)
                for (int i = 0; i < RD / 2; i++) {
                    int base = ((b * RT + t) * RH + h) * RD;
                    double a = r_pos[b * RT + t] * pow(R_THETA, -2.0 * i / RD);
                    double x1 = x[base + i], x2 = x[base + i + RD / 2];
                    ref[base + i] = x1 * cos(a) - x2 * sin(a);
                    ref[base + i + RD / 2] = x2 * cos(a) + x1 * sin(a);
                }
    CHECK(close_d("rope", out, ref, RN, 1e-5, 1e-5), "%s", msg);
    fr(x), fr(out);
}

static void test_rope_backward_matches_finite_differences_and_inverts_forward(void) {
    rope_ctx c = {randv(RN, 1), fbuf(RN), randv(RN, 1)};
    float *dinp = fbuf(RN);
    O->rope_bwd(O, dinp, c.R, r_pos, RB, RT, RH, RD, &R_ROPE);
    CHECK(fd_ok("dinp", c.x, dinp, RN, rope_loss, &c, 1e-2f, FD_ATOL, FD_RTOL), "%s", msg);
    /* rotation is orthogonal, so bwd(fwd(x)) = x; both in place */
    float *y = dupv(c.x, RN);
    O->rope_fwd(O, y, y, r_pos, RB, RT, RH, RD, &R_ROPE);
    O->rope_bwd(O, y, y, r_pos, RB, RT, RH, RD, &R_ROPE);
    CHECK(close_f("bwd(fwd(x))", y, c.x, RN, 1e-6, 1e-6), "%s", msg);
    fr(c.x), fr(c.out), fr(c.R), fr(dinp), fr(y);
}

/* Llama 3.1's rope_scaling, written as transformers' _compute_llama3_parameters does it (the
 * three bands by torch.where on the wavelength), against ust_rope_inv_freq, for Llama 3.1 8B's
 * values (head dim 128, theta 500000, factor 8, low 1, high 4, original 8192): all three bands
 * occur, and the op rotates by the scaled angles. */
static void test_rope_llama3_scaling_matches_transformers_formula(void) {
    const ust_rope r = {.theta = 500000,
                        .factor = 8,
                        .low_freq_factor = 1,
                        .high_freq_factor = 4,
                        .original_max_pos = 8192};
    enum { D = 128 };
    int bands[3] = {0, 0, 0};
    for (int i = 0; i < D / 2; i++) {
        double inv = 1.0 / pow(500000.0, 2.0 * i / D), wavelen = 2 * M_PI / inv;
        double low_wavelen = 8192 / 1.0, high_wavelen = 8192 / 4.0;
        double scaled = wavelen > low_wavelen ? inv / 8 : inv;
        double smooth = (8192 / wavelen - 1) / (4 - 1);
        double smoothed = (1 - smooth) * scaled / 8 + smooth * scaled;
        int medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
        double want = medium ? smoothed : scaled;
        bands[wavelen < high_wavelen ? 0 : medium ? 1 : 2]++;
        double got = ust_rope_inv_freq(&r, i, D);
        CHECK(fabs(got - want) <= 1e-12 * want, "inv_freq[%d] = %.17g, transformers' %.17g", i, got,
              want);
    }
    CHECK(bands[0] && bands[1] && bands[2], "bands %d/%d/%d: not all three exercised", bands[0],
          bands[1], bands[2]);
    /* the op uses them: position 3000 of head dim 128, pair 40 (a medium-band frequency) */
    enum { N = D };
    float *x = randv(N, 1), *out = fbuf(N);
    const int32_t pos[1] = {3000};
    O->rope_fwd(O, out, x, pos, 1, 1, 1, D, &r);
    double a = 3000 * ust_rope_inv_freq(&r, 40, D), plain = 3000 * pow(500000.0, -80.0 / D);
    CHECK(fabs(out[40] - (x[40] * cos(a) - x[40 + D / 2] * sin(a))) < 1e-5, "pair 40 of rope");
    CHECK(fabs(cos(a) - cos(plain)) > 1e-2, "the test's pair is not affected by the scaling");
    fr(x), fr(out);
}

/* ---------------------------------------------------------------- attention */

typedef struct {
    int B, Tq, Tk, H, Hkv, D, causal;
    const int32_t *qp, *kp;
    float *q, *k, *v, *out, *lse, *R;
    const int32_t *qs; /* (B, Tq) document starts, or NULL */
    float cap;         /* model.attn_softcap (0: none) */
} att_ctx;

static att_ctx att_make(int B, int Tq, int Tk, int H, int Hkv, int D, int causal, const int32_t *qp,
                        const int32_t *kp, float qscale) {
    att_ctx c = {B, Tq, Tk, H, Hkv, D, causal, qp, kp, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0};
    c.q = randv((int64_t)B * Tq * H * D, qscale);
    c.k = randv((int64_t)B * Tk * Hkv * D, 1.5f);
    c.v = randv((int64_t)B * Tk * Hkv * D, 1);
    c.out = fbuf((int64_t)B * Tq * H * D);
    c.lse = fbuf((int64_t)B * H * Tq);
    c.R = randv((int64_t)B * Tq * H * D, 1);
    return c;
}

static void att_free(att_ctx *c) { fr(c->q), fr(c->k), fr(c->v), fr(c->out), fr(c->lse), fr(c->R); }

static int64_t nq(const att_ctx *c) { return (int64_t)c->B * c->Tq * c->H * c->D; }
static int64_t nk(const att_ctx *c) { return (int64_t)c->B * c->Tk * c->Hkv * c->D; }

static void att_fwd(const ust_ops *o, att_ctx *c) {
    o->attention_fwd(o, c->out, c->lse, c->q, c->k, c->v, c->B, c->Tq, c->Tk, c->H, c->Hkv, c->D,
                     c->qp, c->kp, c->causal, c->qs, c->cap);
}

static void att_bwd(const ust_ops *o, att_ctx *c, float *dq, float *dk, float *dv) {
    o->attention_bwd(o, dq, dk, dv, c->R, c->out, c->lse, c->q, c->k, c->v, c->B, c->Tq, c->Tk,
                     c->H, c->Hkv, c->D, c->qp, c->kp, c->causal, c->qs, c->cap);
}

static double att_loss(void *p) {
    att_ctx *c = p;
    att_fwd(O, c);
    return dot_r(c->out, c->R, nq(c));
}

/* Softmax attention in double over the visible keys, straight from the definition. */
static void ref_attention(double *out, double *lse, const att_ctx *c) {
    int G = c->H / c->Hkv;
    double scale = 1.0 / sqrt((double)c->D);
    double *s = malloc(sizeof(double) * c->Tk);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++)
            for (int i = 0; i < c->Tq; i++) {
                int qp = c->qp ? c->qp[i] : i;
                double mx = -INFINITY, sum = 0.0;
                const float *qi = c->q + (((int64_t)b * c->Tq + i) * c->H + h) * c->D;
                for (int j = 0; j < c->Tk; j++) {
                    int kp = c->kp ? c->kp[j] : j;
                    s[j] = -INFINITY;
                    if (c->causal && kp > qp) continue;
                    if (c->qs && kp < c->qs[b * c->Tq + i]) continue; /* another document */
                    const float *kj = c->k + (((int64_t)b * c->Tk + j) * c->Hkv + h / G) * c->D;
                    double d = 0;
                    for (int x = 0; x < c->D; x++) d += (double)qi[x] * kj[x];
                    s[j] = d * scale;
                    if (c->cap > 0) s[j] = c->cap * tanh(s[j] / c->cap); /* Gemma 2's soft-cap */
                    if (s[j] > mx) mx = s[j];
                }
                double *oi = out + (((int64_t)b * c->Tq + i) * c->H + h) * c->D;
                for (int x = 0; x < c->D; x++) oi[x] = 0.0;
                for (int j = 0; j < c->Tk; j++) {
                    if (s[j] == -INFINITY) continue;
                    double p = exp(s[j] - mx);
                    sum += p;
                    const float *vj = c->v + (((int64_t)b * c->Tk + j) * c->Hkv + h / G) * c->D;
                    for (int x = 0; x < c->D; x++) oi[x] += p * vj[x];
                }
                if (sum > 0)
                    for (int x = 0; x < c->D; x++) oi[x] /= sum;
                lse[((int64_t)b * c->H + h) * c->Tq + i] = sum > 0 ? mx + log(sum) : -INFINITY;
            }
    free(s);
}

/* Context-parallel-like positions: this rank's queries are two chunks of a zigzag split plus a
 * query (position 1) that precedes every key it holds, so it sees nothing. */
static const int32_t cp_qpos[5] = {4, 5, 14, 15, 1};
static const int32_t cp_kpos[7] = {2, 3, 4, 5, 12, 13, 14};

static int att_fwd_ok(att_ctx *c) {
    att_fwd(O, c);
    double *ro = malloc(sizeof(double) * nq(c)), *rl = malloc(sizeof(double) * c->B * c->H * c->Tq);
    ref_attention(ro, rl, c);
    int ok = close_d("out", c->out, ro, nq(c), 1e-5, 1e-4);
    for (int64_t i = 0; ok && i < (int64_t)c->B * c->H * c->Tq; i++) {
        if (rl[i] == -INFINITY) {
            if (c->lse[i] != -INFINITY) {
                snprintf(msg, sizeof msg, "lse[%lld] = %g for a query that sees no key",
                         (long long)i, c->lse[i]);
                ok = 0;
            }
        } else if (!(fabs(c->lse[i] - rl[i]) <= 1e-5 + 1e-5 * fabs(rl[i]))) {
            snprintf(msg, sizeof msg, "lse[%lld]: got %.9g, expected %.9g", (long long)i, c->lse[i],
                     rl[i]);
            ok = 0;
        }
    }
    free(ro), free(rl);
    return ok;
}

/* fp32 dot products of D <= 8 and a softmax: ~1e-6 relative; 1e-5 / 1e-4 leaves margin. */
static void test_attention_forward_matches_reference_causal_noncausal_gqa_cp(void) {
    att_ctx c1 = att_make(2, 5, 7, 4, 2, 6, 0, NULL, NULL, 1); /* GQA, Tq != Tk, D = 6 */
    CHECK(att_fwd_ok(&c1), "non-causal GQA: %s", msg);
    att_ctx c2 = att_make(1, 9, 9, 3, 3, 8, 1, NULL, NULL, 1); /* causal self-attention, MHA */
    CHECK(att_fwd_ok(&c2), "causal MHA: %s", msg);
    att_ctx c3 = att_make(2, 5, 7, 4, 2, 4, 1, cp_qpos, cp_kpos, 1); /* CP chunk, masked row */
    CHECK(att_fwd_ok(&c3), "causal CP GQA: %s", msg);
    for (int b = 0; b < 2; b++)
        for (int h = 0; h < 4; h++)
            CHECK(c3.lse[(b * 4 + h) * 5 + 4] == -INFINITY, "masked query lse not -inf");
    for (int b = 0; b < 2; b++)
        for (int h = 0; h < 4; h++)
            for (int d = 0; d < 4; d++)
                CHECK(c3.out[((b * 5 + 4) * 4 + h) * 4 + d] == 0.0f, "masked query out not 0");
    /* many key blocks with peaked scores, so the running max moves between blocks */
    att_ctx c4 = att_make(1, 3, 150, 2, 1, 5, 0, NULL, NULL, 3);
    CHECK(att_fwd_ok(&c4), "non-causal long: %s", msg);
    att_ctx c5 = att_make(1, 130, 130, 2, 1, 16, 1, NULL, NULL, 3);
    CHECK(att_fwd_ok(&c5), "causal long: %s", msg);
    /* later keys score ~100x higher: without rescaling by the new max, exp overflows */
    att_ctx c6 = att_make(1, 3, 150, 2, 1, 5, 0, NULL, NULL, 1);
    for (int64_t x = 64 * 5; x < nk(&c6); x++) c6.k[x] *= 100.0f;
    CHECK(att_fwd_ok(&c6), "growing max: %s", msg);
    att_free(&c1), att_free(&c2), att_free(&c3), att_free(&c4), att_free(&c5), att_free(&c6);
}

/* Runs the backward into preset random dq/dk/dv (it accumulates) and checks the increments
 * against finite differences; a query that sees no key must get no gradient. */
static int att_bwd_fd_ok(att_ctx *c) {
    att_fwd(O, c);
    float *dq0 = randv(nq(c), 1), *dk0 = randv(nk(c), 1), *dv0 = randv(nk(c), 1);
    float *dq = dupv(dq0, nq(c)), *dk = dupv(dk0, nk(c)), *dv = dupv(dv0, nk(c));
    att_bwd(O, c, dq, dk, dv);
    float *gq = diffv(dq, dq0, nq(c)), *gk = diffv(dk, dk0, nk(c)), *gv = diffv(dv, dv0, nk(c));
    int ok = fd_ok("dq", c->q, gq, nq(c), att_loss, c, 1e-2f, FD_ATOL, FD_RTOL) &&
             fd_ok("dk", c->k, gk, nk(c), att_loss, c, 1e-2f, FD_ATOL, FD_RTOL) &&
             fd_ok("dv", c->v, gv, nk(c), att_loss, c, 1e-2f, FD_ATOL, FD_RTOL);
    for (int64_t i = 0; ok && i < nq(c); i++) {
        int t = (int)(i / ((int64_t)c->H * c->D) % c->Tq);
        int b = (int)(i / ((int64_t)c->Tq * c->H * c->D));
        int qp = c->qp ? c->qp[t] : t, qs = c->qs ? c->qs[b * c->Tq + t] : INT_MIN, sees = 0;
        for (int j = 0; j < c->Tk; j++) {
            int kp = c->kp ? c->kp[j] : j;
            sees |= (!c->causal || kp <= qp) && kp >= qs;
        }
        if (!sees && dq[i] != dq0[i]) {
            snprintf(msg, sizeof msg, "dq[%lld] of a query that sees no key changed", (long long)i);
            ok = 0;
        }
    }
    fr(dq0), fr(dk0), fr(dv0), fr(dq), fr(dk), fr(dv), fr(gq), fr(gk), fr(gv);
    return ok;
}

static void test_attention_backward_matches_finite_differences_noncausal_gqa(void) {
    att_ctx c = att_make(2, 5, 7, 4, 2, 3, 0, NULL, NULL, 1);
    CHECK(att_bwd_fd_ok(&c), "%s", msg);
    att_free(&c);
}

static void test_attention_backward_matches_finite_differences_causal_cp_masked_row(void) {
    att_ctx c = att_make(2, 5, 7, 4, 2, 4, 1, cp_qpos, cp_kpos, 1);
    CHECK(att_bwd_fd_ok(&c), "%s", msg);
    att_free(&c);
}

static void test_attention_backward_matches_finite_differences_many_key_blocks(void) {
    att_ctx c = att_make(1, 6, 70, 2, 1, 3, 1, NULL, NULL, 1);
    int32_t qp[6] = {69, 3, 40, 64, 33, 0}, kp[70]; /* queries scattered over the keys */
    for (int j = 0; j < 70; j++) kp[j] = j;
    c.qp = qp, c.kp = kp;
    CHECK(att_bwd_fd_ok(&c), "%s", msg);
    att_free(&c);
}

/* Document masking: q_start keeps each query's attention inside its document. Against the
 * reference (two sequences with different documents, 150 tokens: several key blocks, blocks that
 * are skipped, GQA), against each document run alone as a sequence of its own, and backward
 * against finite differences; with the CP-like positions a document may begin where the keys
 * have a gap. */
static int32_t *doc_starts(int B, int T, const int *cuts, int ncuts) {
    int32_t *qs = malloc((size_t)B * T * sizeof(int32_t));
    for (int b = 0; b < B; b++)
        for (int t = 0, start = 0; t < T; t++) {
            for (int c = 0; c < ncuts; c++)
                if (cuts[c] == t + 1000 * b) start = t;
            qs[b * T + t] = start;
        }
    return qs;
}

static void test_attention_with_documents_matches_reference_and_each_document_alone(void) {
    const int cuts[] = {37, 70, 71, 140, 1100}; /* sequence 0: 4 documents; 1: 2 */
    int32_t *qs = doc_starts(2, 150, cuts, 5);
    att_ctx c = att_make(2, 150, 150, 4, 2, 8, 1, NULL, NULL, 2);
    c.qs = qs;
    CHECK(att_fwd_ok(&c), "documents: %s", msg);
    /* each document alone: its queries and keys only */
    int ok = 1;
    for (int b = 0; b < 2 && ok; b++)
        for (int d0 = 0; d0 < 150 && ok;) {
            int d1 = d0;
            while (d1 < 150 && qs[b * 150 + d1] == d0) d1++;
            att_ctx one = att_make(1, d1 - d0, d1 - d0, 4, 2, 8, 1, NULL, NULL, 1);
            for (int t = d0; t < d1; t++) {
                memcpy(one.q + (int64_t)(t - d0) * 4 * 8, c.q + ((int64_t)b * 150 + t) * 4 * 8,
                       4 * 8 * sizeof(float));
                memcpy(one.k + (int64_t)(t - d0) * 2 * 8, c.k + ((int64_t)b * 150 + t) * 2 * 8,
                       2 * 8 * sizeof(float));
                memcpy(one.v + (int64_t)(t - d0) * 2 * 8, c.v + ((int64_t)b * 150 + t) * 2 * 8,
                       2 * 8 * sizeof(float));
            }
            att_fwd(O, &one);
            for (int t = d0; t < d1 && ok; t++)
                for (int x = 0; x < 4 * 8 && ok; x++) {
                    float a = one.out[(int64_t)(t - d0) * 32 + x],
                          p = c.out[((int64_t)b * 150 + t) * 32 + x];
                    if (fabsf(a - p) > 1e-6f + 1e-5f * fabsf(a)) {
                        snprintf(msg, sizeof msg, "sequence %d token %d: packed %g, alone %g", b, t,
                                 p, a);
                        ok = 0;
                    }
                }
            att_free(&one);
            d0 = d1;
        }
    CHECK(ok, "%s", msg);
    att_free(&c);
    free(qs);
    const int small_cuts[] = {4, 7, 1003};
    int32_t *qs2 = doc_starts(2, 9, small_cuts, 3);
    att_ctx f = att_make(2, 9, 9, 2, 1, 4, 1, NULL, NULL, 1);
    f.qs = qs2;
    CHECK(att_bwd_fd_ok(&f), "documents backward: %s", msg);
    att_free(&f);
    /* CP-like: queries at 4, 5, 14, 15, 1 whose documents begin at 3, 5, 13, 13, 0 */
    int32_t qs3[2 * 5] = {3, 5, 13, 13, 0, 3, 5, 13, 13, 0};
    att_ctx g = att_make(2, 5, 7, 4, 2, 4, 1, cp_qpos, cp_kpos, 1);
    g.qs = qs3;
    CHECK(att_fwd_ok(&g), "documents over CP positions: %s", msg);
    CHECK(att_bwd_fd_ok(&g), "documents over CP positions, backward: %s", msg);
    att_free(&g);
    free(qs2);
}

/* Keys of `full` at indices idx[0..n) as a context of their own (same queries). */
static att_ctx att_subset(const att_ctx *full, const int *idx, int n, int32_t *kpos) {
    att_ctx s = *full;
    s.Tk = n;
    s.kp = kpos;
    int64_t row = (int64_t)full->Hkv * full->D;
    s.k = fbuf((int64_t)full->B * n * row);
    s.v = fbuf((int64_t)full->B * n * row);
    s.out = fbuf(nq(full));
    s.lse = fbuf((int64_t)full->B * full->H * full->Tq);
    for (int b = 0; b < full->B; b++)
        for (int j = 0; j < n; j++) {
            memcpy(s.k + ((int64_t)b * n + j) * row,
                   full->k + ((int64_t)b * full->Tk + idx[j]) * row, row * sizeof(float));
            memcpy(s.v + ((int64_t)b * n + j) * row,
                   full->v + ((int64_t)b * full->Tk + idx[j]) * row, row * sizeof(float));
            kpos[j] = full->kp[idx[j]];
        }
    return s;
}

static void att_subset_free(att_ctx *s) { fr(s->k), fr(s->v), fr(s->out), fr(s->lse); }

/* Split into keys {0..3} (positions 2..5) and {4..6} (12..14): queries at 4 and 5 see only the
 * first set, the query at 1 sees neither, so merge meets -inf on each side and on both. */
static const int split1[4] = {0, 1, 2, 3}, split2[3] = {4, 5, 6};

/* model.attn_softcap: scores c tanh(s / c) before the mask, forward against the reference and
 * backward against finite differences, with scores well past the cap (q scaled 4x: |s| ~ 10 vs
 * c = 2, where tanh bends) over several key blocks, documents and the CP-like masked row; a
 * cap applied after the mask (-inf -> -c) or a backward without tanh's slope fails these. */
static void test_attention_softcap_matches_reference_and_finite_differences(void) {
    att_ctx c1 = att_make(1, 70, 70, 2, 1, 8, 1, NULL, NULL, 4);
    c1.cap = 2.0f;
    CHECK(att_fwd_ok(&c1), "causal, capped: %s", msg);
    c1.cap = 0.0f; /* the cap changes the result (else the test would not see it) */
    float *capped = dupv(c1.out, nq(&c1));
    att_fwd(O, &c1);
    CHECK(!close_f("uncapped", c1.out, capped, nq(&c1), 1e-3, 1e-3), "the cap changes nothing");
    att_ctx c2 = att_make(2, 5, 7, 4, 2, 4, 1, cp_qpos, cp_kpos, 4);
    c2.cap = 1.5f;
    CHECK(att_fwd_ok(&c2), "CP masked row, capped: %s", msg);
    CHECK(att_bwd_fd_ok(&c2), "CP masked row, capped backward: %s", msg);
    const int cuts[] = {20, 41, 1030};
    int32_t *qs = doc_starts(2, 70, cuts, 3);
    att_ctx c3 = att_make(2, 70, 70, 2, 2, 3, 1, NULL, NULL, 4);
    c3.qs = qs, c3.cap = 2.0f;
    CHECK(att_fwd_ok(&c3), "documents, capped: %s", msg);
    CHECK(att_bwd_fd_ok(&c3), "documents, capped backward: %s", msg);
    free(qs), fr(capped);
    att_free(&c1), att_free(&c2), att_free(&c3);
}

/* A NaN in one query (a NaN q_proj weight reaches every score of its rows) makes that row's
 * output and lse NaN and leaves the other rows finite: the online softmax's max must not drop
 * the NaN and skip the block as if nothing were visible (which gave a finite output of 0). */
static void test_attention_carries_a_nan_query_to_its_row(void) {
    att_ctx c = att_make(1, 70, 70, 2, 1, 16, 1, NULL, NULL, 1.0f);
    int row = 40, h = 1; /* (b 0, query 40, head 1); 70 keys: two key blocks */
    for (int d = 0; d < c.D; d++) c.q[((int64_t)row * c.H + h) * c.D + d] = NAN;
    att_fwd(O, &c);
    int bad = 0, finite_elsewhere = 1;
    for (int i = 0; i < c.Tq; i++)
        for (int hh = 0; hh < c.H; hh++) {
            const float *oi = c.out + ((int64_t)i * c.H + hh) * c.D;
            float l = c.lse[(int64_t)hh * c.Tq + i];
            int nan_row = i == row && hh == h;
            for (int d = 0; d < c.D; d++)
                if (nan_row ? !isnan(oi[d]) : !isfinite(oi[d])) bad++;
            if (nan_row ? !isnan(l) : !isfinite(l)) finite_elsewhere = 0;
        }
    CHECK(bad == 0 && finite_elsewhere, "%d outputs wrong (NaN row %d head %d), lse ok %d", bad,
          row, h, finite_elsewhere);
    att_free(&c);
}

static void test_attention_merge_of_two_key_sets_equals_attention_over_all_keys(void) {
    att_ctx full = att_make(2, 5, 7, 4, 2, 4, 1, cp_qpos, cp_kpos, 1);
    att_fwd(O, &full);
    int32_t kp1[4], kp2[3];
    att_ctx s1 = att_subset(&full, split1, 4, kp1), s2 = att_subset(&full, split2, 3, kp2);
    for (int order = 0; order < 2; order++) {
        att_ctx *a = order ? &s2 : &s1, *b = order ? &s1 : &s2;
        att_fwd(O, a);
        att_fwd(O, b);
        O->attention_merge(O, a->out, a->lse, b->out, b->lse, full.B, full.Tq, full.H, full.D);
        /* the merged result rounds differently from one pass over all keys: ~1e-6 */
        CHECK(close_f("merged out", a->out, full.out, nq(&full), 1e-5, 1e-4), "order %d: %s", order,
              msg);
        for (int64_t i = 0; i < (int64_t)full.B * full.H * full.Tq; i++) {
            if (full.lse[i] == -INFINITY)
                CHECK(a->lse[i] == -INFINITY, "order %d: merged lse[%lld] = %g, expected -inf",
                      order, (long long)i, a->lse[i]);
            else
                CHECK_CLOSE(a->lse[i], full.lse[i], 1e-5, 1e-5, "merged lse");
        }
    }
    att_subset_free(&s1), att_subset_free(&s2), att_free(&full);
}

/* With the final (merged) out/lse, the backward is a sum over key sets: dq accumulates over the
 * two calls and dk/dv of each set are that set's rows of the full dk/dv. */
static void test_attention_backward_over_two_key_sets_with_merged_lse_equals_full_backward(void) {
    att_ctx full = att_make(2, 5, 7, 4, 2, 4, 1, cp_qpos, cp_kpos, 1);
    att_fwd(O, &full);
    float *dq = fbuf(nq(&full)), *dk = fbuf(nk(&full)), *dv = fbuf(nk(&full));
    att_bwd(O, &full, dq, dk, dv);

    int32_t kp1[4], kp2[3];
    att_ctx s1 = att_subset(&full, split1, 4, kp1), s2 = att_subset(&full, split2, 3, kp2);
    for (att_ctx *s = &s1; s; s = s == &s1 ? &s2 : NULL) { /* backward uses the final out/lse */
        memcpy(s->out, full.out, nq(&full) * sizeof(float));
        memcpy(s->lse, full.lse, sizeof(float) * full.B * full.H * full.Tq);
    }
    float *dq_s = fbuf(nq(&full)), *dk1 = fbuf(nk(&s1)), *dv1 = fbuf(nk(&s1));
    float *dk2 = fbuf(nk(&s2)), *dv2 = fbuf(nk(&s2));
    att_bwd(O, &s1, dq_s, dk1, dv1);
    att_bwd(O, &s2, dq_s, dk2, dv2);
    CHECK(close_f("dq", dq_s, dq, nq(&full), 1e-5, 1e-4), "%s", msg);
    int64_t row = (int64_t)full.Hkv * full.D;
    for (int b = 0; b < full.B; b++)
        for (int j = 0; j < 7; j++) {
            int in1 = j < 4, jj = in1 ? j : j - 4, n = in1 ? 4 : 3;
            const float *gk = (in1 ? dk1 : dk2) + ((int64_t)b * n + jj) * row;
            const float *gv = (in1 ? dv1 : dv2) + ((int64_t)b * n + jj) * row;
            CHECK(close_f("dk", gk, dk + ((int64_t)b * 7 + j) * row, row, 1e-6, 1e-5), "%s", msg);
            CHECK(close_f("dv", gv, dv + ((int64_t)b * 7 + j) * row, row, 1e-6, 1e-5), "%s", msg);
        }
    fr(dq), fr(dk), fr(dv), fr(dq_s), fr(dk1), fr(dv1), fr(dk2), fr(dv2);
    att_subset_free(&s1), att_subset_free(&s2), att_free(&full);
}

/* ---------------------------------------------------------------- cross-entropy */

enum { XN = 5, XV = 12, XVR = 9 };
static const int32_t x_tgt[XN] = {3, -1, 8, 0, -5};
#define X_DSCALE 0.37f

typedef struct {
    float *logits, *losses;
    float cap; /* model.final_softcap (0: none) */
} xent_ctx;

/* L = dscale * sum of losses, whose gradient is exactly what dlogits holds. */
static double xent_loss(void *p) {
    xent_ctx *c = p;
    O->xent_fwd_bwd(O, c->losses, NULL, c->logits, x_tgt, XN, XV, XVR, 1.0f, c->cap);
    double s = 0;
    for (int n = 0; n < XN; n++) s += c->losses[n];
    return s * X_DSCALE;
}

static float *xent_logits(void) {
    float *l = randv(XN * XV, 3);
    for (int n = 0; n < XN; n++)
        for (int v = XVR; v < XV; v++) l[n * XV + v] = 50.0f; /* padding would dominate if used */
    return l;
}

static void test_xent_forward_excludes_padding_and_ignores_negative_targets(void) {
    float *logits = xent_logits(), *losses = randv(XN, 1);
    O->xent_fwd_bwd(O, losses, NULL, logits, x_tgt, XN, XV, XVR, 1.0f, 0.0f);
    double ref[XN];
    for (int n = 0; n < XN; n++) {
        ref[n] = 0.0;
        if (x_tgt[n] < 0) continue;
        double s = 0;
        for (int v = 0; v < XVR; v++) s += exp((double)logits[n * XV + v]);
        ref[n] = log(s) - logits[n * XV + x_tgt[n]];
    }
    CHECK(close_d("loss", losses, ref, XN, 1e-5, 1e-5), "%s", msg);
    fr(logits), fr(losses);
}

/* Three vocabulary shards of 4 columns (the last holds one real column and three padding ones),
 * combined as tensor parallelism does it (log-sum-exp merged in shard order with
 * attention_merge at D = 1, target logits summed), give the whole-vocabulary loss and gradient. */
static void test_vocab_parallel_xent_matches_the_whole_vocabulary(void) {
    enum { S = 3, W = XV / S };
    float *logits = xent_logits(), *losses = fbuf(XN), *dl = fbuf(XN * XV);
    O->xent_fwd_bwd(O, losses, dl, logits, x_tgt, XN, XV, XVR, X_DSCALE, 0.0f);
    float *shard[S], *lse[S], *tl[S], *dummy = fbuf(XN), *dummy2 = fbuf(XN);
    for (int s = 0; s < S; s++) {
        shard[s] = fbuf(XN * W), lse[s] = fbuf(XN), tl[s] = fbuf(XN);
        for (int n = 0; n < XN; n++)
            memcpy(shard[s] + n * W, logits + n * XV + s * W, W * sizeof(float));
        O->xent_vp_local(O, lse[s], tl[s], shard[s], x_tgt, XN, W, s * W, XVR, 0.0f);
    }
    float *glse = dupv(lse[0], XN), *gtl = dupv(tl[0], XN);
    for (int s = 1; s < S; s++) {
        O->attention_merge(O, dummy, glse, dummy2, lse[s], 1, XN, 1, 1);
        O->add(O, gtl, gtl, tl[s], XN);
    }
    int ok = 1;
    for (int s = 0; s < S && ok; s++) {
        float *l = fbuf(XN), *d = fbuf(XN * W), *want = fbuf(XN * W);
        O->xent_vp_finish(O, l, d, shard[s], x_tgt, glse, gtl, XN, W, s * W, XVR, X_DSCALE, 0.0f);
        for (int n = 0; n < XN; n++) memcpy(want + n * W, dl + n * XV + s * W, W * sizeof(float));
        ok = close_f("shard loss", l, losses, XN, 1e-5, 1e-5) &&
             close_f("shard dlogits", d, want, XN * W, 1e-6, 1e-5);
        fr(l), fr(d), fr(want);
    }
    CHECK(ok, "%s", msg);
    for (int s = 0; s < S; s++) fr(shard[s]), fr(lse[s]), fr(tl[s]);
    fr(logits), fr(losses), fr(dl), fr(dummy), fr(dummy2), fr(glse), fr(gtl);
}

static void test_xent_backward_matches_finite_differences_and_may_alias_logits(void) {
    xent_ctx c = {xent_logits(), fbuf(XN), 0};
    float *dlogits = randv(XN * XV, 1), *losses = fbuf(XN);
    O->xent_fwd_bwd(O, losses, dlogits, c.logits, x_tgt, XN, XV, XVR, X_DSCALE, 0.0f);
    /* padding columns are not inputs of the loss, so finite differences give 0 there too */
    CHECK(fd_ok("dlogits", c.logits, dlogits, XN * XV, xent_loss, &c, 1e-2f, FD_ATOL, FD_RTOL),
          "%s", msg);
    for (int n = 0; n < XN; n++)
        for (int v = 0; v < XV; v++)
            if (x_tgt[n] < 0 || v >= XVR)
                CHECK(dlogits[n * XV + v] == 0.0f, "dlogits[%d,%d] = %g, expected 0", n, v,
                      dlogits[n * XV + v]);
    float *inplace = dupv(c.logits, XN * XV), *losses2 = fbuf(XN);
    O->xent_fwd_bwd(O, losses2, inplace, inplace, x_tgt, XN, XV, XVR, X_DSCALE, 0.0f);
    CHECK(memcmp(inplace, dlogits, sizeof(float) * XN * XV) == 0, "in-place dlogits differ");
    CHECK(memcmp(losses2, losses, sizeof(float) * XN) == 0, "in-place losses differ");
    fr(c.logits), fr(c.losses), fr(dlogits), fr(losses), fr(inplace), fr(losses2);
}

/* model.final_softcap: the loss over c tanh(x / c) (against double), dlogits of the raw x against
 * finite differences and in place, and the vocabulary-parallel pair capped the same way giving
 * the whole row's loss and gradient. Logits ~3 against c = 2: the cap bends them. */
static void test_xent_softcap_matches_reference_finite_differences_and_shards(void) {
    const float cap = 2.0f;
    xent_ctx c = {xent_logits(), fbuf(XN), cap};
    float *dl = randv(XN * XV, 1), *losses = fbuf(XN);
    O->xent_fwd_bwd(O, losses, dl, c.logits, x_tgt, XN, XV, XVR, X_DSCALE, cap);
    double ref[XN];
    for (int n = 0; n < XN; n++) {
        ref[n] = 0.0;
        if (x_tgt[n] < 0) continue;
        double sum = 0;
        for (int v = 0; v < XVR; v++) sum += exp(cap * tanh(c.logits[n * XV + v] / cap));
        ref[n] = log(sum) - cap * tanh(c.logits[n * XV + x_tgt[n]] / cap);
    }
    CHECK(close_d("capped loss", losses, ref, XN, 1e-5, 1e-5), "%s", msg);
    CHECK(fd_ok("capped dlogits", c.logits, dl, XN * XV, xent_loss, &c, 1e-2f, FD_ATOL, FD_RTOL),
          "%s", msg);
    float *inplace = dupv(c.logits, XN * XV), *l2 = fbuf(XN);
    O->xent_fwd_bwd(O, l2, inplace, inplace, x_tgt, XN, XV, XVR, X_DSCALE, cap);
    CHECK(memcmp(inplace, dl, sizeof(float) * XN * XV) == 0, "capped in-place dlogits differ");
    enum { S = 2, W = XV / S };
    float *lse[S], *tl[S], *d = fbuf(XN * W), *want = fbuf(XN * W), *du = fbuf(XN), *du2 = fbuf(XN);
    for (int s = 0; s < S; s++) {
        lse[s] = fbuf(XN), tl[s] = fbuf(XN);
        for (int n = 0; n < XN; n++) memcpy(d + n * W, c.logits + n * XV + s * W, W * 4);
        O->xent_vp_local(O, lse[s], tl[s], d, x_tgt, XN, W, s * W, XVR, cap);
    }
    O->attention_merge(O, du, lse[0], du2, lse[1], 1, XN, 1, 1);
    O->add(O, tl[0], tl[0], tl[1], XN);
    for (int s = 0; s < S; s++) {
        for (int n = 0; n < XN; n++) memcpy(d + n * W, c.logits + n * XV + s * W, W * 4);
        for (int n = 0; n < XN; n++) memcpy(want + n * W, dl + n * XV + s * W, W * 4);
        O->xent_vp_finish(O, l2, d, d, x_tgt, lse[0], tl[0], XN, W, s * W, XVR, X_DSCALE, cap);
        CHECK(close_f("shard loss", l2, losses, XN, 1e-5, 1e-5), "shard %d: %s", s, msg);
        CHECK(close_f("shard dlogits", d, want, XN * W, 1e-6, 1e-5), "shard %d: %s", s, msg);
    }
    for (int s = 0; s < S; s++) fr(lse[s]), fr(tl[s]);
    fr(c.logits), fr(c.losses), fr(dl), fr(losses), fr(inplace), fr(l2), fr(d), fr(want), fr(du),
        fr(du2);
}

/* ---------------------------------------------------------------- optimizer, elementwise */

static void test_adamw_two_steps_match_hand_computation(void) {
    enum { n = 5 };
    float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, gs = 0.5f;
    float wds[2] = {0.1f, 0.0f};
    for (int wi = 0; wi < 2; wi++) {
        float *p = randv(n, 1), *m = fbuf(n), *v = fbuf(n), *g1 = randv(n, 1), *g2 = randv(n, 1);
        double P[n], M[n] = {0}, Vv[n] = {0};
        for (int i = 0; i < n; i++) P[i] = p[i];
        for (int t = 1; t <= 2; t++) {
            const float *g = t == 1 ? g1 : g2;
            O->adamw(O, p, g, m, v, n, lr, b1, b2, eps, wds[wi], gs, t);
            for (int i = 0; i < n; i++) {
                double gg = (double)g[i] * gs;
                M[i] = b1 * M[i] + (1 - (double)b1) * gg;
                Vv[i] = b2 * Vv[i] + (1 - (double)b2) * gg * gg;
                double mh = M[i] / (1 - pow(b1, t)), vh = Vv[i] / (1 - pow(b2, t));
                P[i] -= lr * (mh / (sqrt(vh) + eps) + wds[wi] * P[i]);
            }
        }
        /* one fp32 update of size lr = 1e-2 errs by ~1e-8 */
        CHECK(close_d("p", p, P, n, 1e-6, 1e-6), "wd=%g: %s", wds[wi], msg);
        CHECK(close_d("m", m, M, n, 1e-6, 1e-5), "wd=%g: %s", wds[wi], msg);
        CHECK(close_d("v", v, Vv, n, 1e-7, 1e-5), "wd=%g: %s", wds[wi], msg);
        fr(p), fr(m), fr(v), fr(g1), fr(g2);
    }
}

/* bf16 states: ops_state_bf16 rounds to nearest even (ties to the even neighbour, up into
 * infinity past the largest bf16), keeps infinities and keeps NaN a (quiet) NaN; adamw16_many and
 * momentum16 are adamw_many and Muon's fp32 momentum steps (scale, axpy; scale and axpy or copy)
 * on the widened states with the results stored rounded, bit for bit: an independent rounding
 * (below) of the fp32 forms' states, the parameters and the updates unchanged. */
static uint16_t rne_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static float from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* s16 (n) must be s rounded; s then takes the rounded values for the next step. */
static int states_rounded(float *s, const uint16_t *s16, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (s16[i] != rne_bits(s[i])) {
            snprintf(msg, sizeof msg, "[%lld]: %#06x, fp32 form %.9g", (long long)i, s16[i], s[i]);
            return 0;
        }
        s[i] = ops_state_f32(s16[i]);
    }
    return 1;
}

static void test_bf16_state_ops_equal_fp32_forms_rounded(void) {
    static const uint32_t in[] = {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x7f7fffffu, 0xff800000u};
    static const uint16_t want[] = {0x3f80, 0x3f82, 0x3f81, 0x7f80, 0xff80};
    for (int i = 0; i < 5; i++)
        CHECK(ops_state_bf16(from_bits(in[i])) == want[i], "%#010x -> %#06x, want %#06x", in[i],
              ops_state_bf16(from_bits(in[i])), want[i]);
    uint16_t nan = ops_state_bf16(from_bits(0x7f800001u));
    CHECK(isnan(ops_state_f32(nan)) && (nan & 0x40), "NaN -> %#06x", nan);
    enum { np = 400, nm = 350, k = 3 };
    const ops_segment seg[k] = {
        {0, 10, 20, 100, 0.1f}, {150, 120, 130, 200, 0.0f}, {380, 290, 340, 7, 0.05f}};
    float *p = randv(np, 1), *g = randv(np, 1), *m = randv(nm, 0.1f), *v = randv(nm, 0.1f);
    uint16_t *m16 = O->alloc(O, nm * 2), *v16 = O->alloc(O, nm * 2);
    for (int i = 0; i < nm; i++) {
        m16[i] = rne_bits(m[i]), v16[i] = rne_bits(fabsf(v[i]));
        m[i] = ops_state_f32(m16[i]), v[i] = ops_state_f32(v16[i]);
    }
    float *p2 = dupv(p, np);
    for (int t = 1; t <= 2; t++) {
        O->adamw16_many(O, p, g, m16, v16, seg, k, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.5f, t);
        O->adamw_many(O, p2, g, m, v, seg, k, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.5f, t);
        CHECK(!memcmp(p, p2, sizeof(float) * np), "adamw16_many parameters differ");
        CHECK(states_rounded(m, m16, nm), "adamw16_many m%s", msg);
        CHECK(states_rounded(v, v16, nm), "adamw16_many v%s", msg);
    }
    for (int nesterov = 0; nesterov < 2; nesterov++) {
        float *g1 = dupv(g, np), *g2 = dupv(g, np);
        for (int step = 0; step < 2; step++) {
            O->momentum16(O, g1, m16, nm, 0.95f, 0.5f, nesterov);
            O->scale(O, m, 0.95f, nm);
            O->axpy(O, m, 0.5f, g2, nm);
            if (nesterov) {
                O->scale(O, g2, 0.5f, nm);
                O->axpy(O, g2, 0.95f, m, nm);
            } else {
                O->copy(O, g2, m, sizeof(float) * nm);
            }
            CHECK(!memcmp(g1, g2, sizeof(float) * nm), "momentum16 (nesterov %d) update differs",
                  nesterov);
            CHECK(states_rounded(m, m16, nm), "momentum16 m%s", msg);
        }
        fr(g1), fr(g2);
    }
    fr(p), fr(g), fr(m), fr(v), fr(p2), fr(m16), fr(v16);
}

static void test_sumsq_and_sum_match_double_reference(void) {
    int64_t sizes[4] = {0, 3, 1000, 100003};
    for (int s = 0; s < 4; s++) {
        int64_t n = sizes[s];
        float *x = randv(n, 2);
        double rs = 0, rq = 0;
        for (int64_t i = 0; i < n; i++) rs += x[i], rq += (double)x[i] * x[i];
        /* both sum exact fp32 values in double: agreement to ~1e-15 relative */
        CHECK_CLOSE(O->sum(O, x, n), rs, 1e-9, 1e-12, "sum");
        CHECK_CLOSE(O->sumsq(O, x, n), rq, 1e-9, 1e-12, "sumsq");
        fr(x);
    }
}

/* The multi-tensor forms equal one single-form call per segment, bit for bit: segments at
 * different offsets of each buffer (parameters, gradients and moments laid out differently, as
 * under ZeRO), with their own weight decay, an empty one included. */
static void test_adamw_many_and_sumsq_many_equal_per_segment_calls(void) {
    enum { np = 400, ng = 330, nm = 350, k = 4 };
    const ops_segment seg[k] = {{0, 10, 20, 100, 0.1f},
                                {150, 120, 130, 200, 0.0f},
                                {380, 290, 340, 0, 0.1f},
                                {360, 280, 330, 15, 0.05f}};
    float *p = randv(np, 1), *g = randv(ng, 1), *m = randv(nm, 0.1f), *v = randv(nm, 0.1f);
    for (int i = 0; i < nm; i++) v[i] = fabsf(v[i]);
    float *p2 = dupv(p, np), *m2 = dupv(m, nm), *v2 = dupv(v, nm);
    for (int t = 1; t <= 2; t++) {
        O->adamw_many(O, p, g, m, v, seg, k, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.5f, t);
        for (int i = 0; i < k; i++)
            O->adamw(O, p2 + seg[i].p, g + seg[i].g, m2 + seg[i].m, v2 + seg[i].m, seg[i].n, 1e-2f,
                     0.9f, 0.95f, 1e-8f, seg[i].wd, 0.5f, t);
    }
    CHECK(!memcmp(p, p2, sizeof(float) * np), "adamw_many parameters differ");
    CHECK(!memcmp(m, m2, sizeof(float) * nm) && !memcmp(v, v2, sizeof(float) * nm),
          "adamw_many moments differ");
    double out[k];
    O->sumsq_many(O, g, seg, k, out);
    for (int i = 0; i < k; i++)
        CHECK(out[i] == O->sumsq(O, g + seg[i].g, seg[i].n),
              "sumsq_many segment %d: %.17g vs %.17g", i, out[i],
              O->sumsq(O, g + seg[i].g, seg[i].n));
    CHECK(out[2] == 0.0 && out[0] > 0.0, "empty segment %g, first %g", out[2], out[0]);
    fr(p), fr(g), fr(m), fr(v), fr(p2), fr(m2), fr(v2);
}

static void test_add_axpy_scale_are_exact_elementwise(void) {
    enum { n = 17 };
    float *a = randv(n, 1), *b = randv(n, 1), *out = fbuf(n), *y = dupv(a, n);
    O->add(O, out, a, b, n);
    O->axpy(O, y, 0.25f, b, n);
    for (int i = 0; i < n; i++) {
        CHECK(out[i] == a[i] + b[i], "add[%d]", i);
        CHECK(y[i] == a[i] + 0.25f * b[i], "axpy[%d]", i);
    }
    O->scale(O, y, -3.0f, n);
    for (int i = 0; i < n; i++) CHECK(y[i] == (a[i] + 0.25f * b[i]) * -3.0f, "scale[%d]", i);
    fr(a), fr(b), fr(out), fr(y);
}

/* ---------------------------------------------------------------- threads */

static void test_two_threads_match_one_thread_bit_for_bit_attention_and_layernorm(void) {
    ust_ops *O2 = ops_cpu_create(2, 1);
    att_ctx c = att_make(2, 67, 67, 4, 2, 16, 1, NULL, NULL, 2);
    float *out1 = fbuf(nq(&c)), *lse1 = fbuf(2 * 4 * 67);
    float *dq[2], *dk[2], *dv[2];
    for (int r = 0; r < 2; r++) {
        const ust_ops *o = r ? O2 : O;
        dq[r] = fbuf(nq(&c)), dk[r] = fbuf(nk(&c)), dv[r] = fbuf(nk(&c));
        att_fwd(o, &c);
        if (r == 0) {
            memcpy(out1, c.out, nq(&c) * sizeof(float));
            memcpy(lse1, c.lse, 2 * 4 * 67 * sizeof(float));
        }
        att_bwd(o, &c, dq[r], dk[r], dv[r]);
    }
    CHECK(memcmp(out1, c.out, nq(&c) * sizeof(float)) == 0, "attention out differs");
    CHECK(memcmp(lse1, c.lse, 2 * 4 * 67 * sizeof(float)) == 0, "attention lse differs");
    CHECK(memcmp(dq[0], dq[1], nq(&c) * sizeof(float)) == 0, "attention dq differs");
    CHECK(memcmp(dk[0], dk[1], nk(&c) * sizeof(float)) == 0, "attention dk differs");
    CHECK(memcmp(dv[0], dv[1], nk(&c) * sizeof(float)) == 0, "attention dv differs");

    int N = 37, C = 200;
    float *x = randv(N * C, 1), *w = randv(C, 1), *b = randv(C, 1), *dy = randv(N * C, 1);
    float *y[2], *mean[2], *rstd[2], *dx[2], *dw[2], *db[2];
    for (int r = 0; r < 2; r++) {
        const ust_ops *o = r ? O2 : O;
        y[r] = fbuf(N * C), mean[r] = fbuf(N), rstd[r] = fbuf(N), dx[r] = fbuf(N * C);
        dw[r] = fbuf(C), db[r] = fbuf(C);
        o->layernorm_fwd(o, y[r], mean[r], rstd[r], x, w, b, N, C, 1e-5f);
        o->layernorm_bwd(o, dx[r], dw[r], db[r], dy, x, w, mean[r], rstd[r], N, C);
    }
    CHECK(memcmp(y[0], y[1], sizeof(float) * N * C) == 0, "layernorm out differs");
    CHECK(memcmp(rstd[0], rstd[1], sizeof(float) * N) == 0, "layernorm rstd differs");
    CHECK(memcmp(dx[0], dx[1], sizeof(float) * N * C) == 0, "layernorm dinp differs");
    CHECK(memcmp(dw[0], dw[1], sizeof(float) * C) == 0, "layernorm dw differs");
    CHECK(memcmp(db[0], db[1], sizeof(float) * C) == 0, "layernorm db differs");
    CHECK(O->sumsq(O, x, N * C) == O2->sumsq(O2, x, N * C), "sumsq differs");
    for (int r = 0; r < 2; r++) {
        fr(dq[r]), fr(dk[r]), fr(dv[r]), fr(y[r]), fr(mean[r]), fr(rstd[r]), fr(dx[r]);
        fr(dw[r]), fr(db[r]);
    }
    fr(out1), fr(lse1), fr(x), fr(w), fr(b), fr(dy);
    att_free(&c);
    O2->destroy(O2);
}

/* sgemm cuts large products into row or column blocks run on the threads (ops_cpu.c): every
 * shape, transpose and thread count gives the one-thread result bit for bit, and the result is
 * the product (checked in fp64 on a few elements). */
static void test_split_matmul_matches_one_thread_bit_for_bit(void) {
    static const int shapes[][3] = {{300, 257, 129}, {70, 1000, 65}, {1031, 96, 40}, {5, 3000, 64}};
    ust_ops *On[3] = {ops_cpu_create(2, 1), ops_cpu_create(3, 1), ops_cpu_create(16, 1)};
    for (int s = 0; s < 4; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *A = randv((int64_t)M * K, 1), *B = randv((int64_t)K * N, 1), *C0 = fbuf(M * N);
        float *C = fbuf((int64_t)M * N);
        for (int t = 0; t < 4; t++) {
            int tA = t & 1, tB = t >> 1;
            for (int64_t i = 0; i < (int64_t)M * N; i++) C0[i] = (float)(i % 7) - 3.0f;
            memcpy(C, C0, sizeof(float) * M * N);
            O->matmul(O, C0, A, B, M, N, K, tA, tB, 0.5f, 0.25f);
            for (int i = 0; i < M; i += M / 3 + 1) { /* C0 = 0.5 op(A) op(B) + 0.25 C */
                int j = (i * 7) % N;
                double ref = 0.25 * ((double)(((int64_t)i * N + j) % 7) - 3.0);
                for (int k = 0; k < K; k++)
                    ref += 0.5 * A[tA ? (int64_t)k * M + i : (int64_t)i * K + k] *
                           B[tB ? (int64_t)j * K + k : (int64_t)k * N + j];
                CHECK(fabs(C0[(int64_t)i * N + j] - ref) < 1e-4 * (1 + fabs(ref)),
                      "matmul %dx%dx%d t%d%d C[%d,%d] %g vs %g", M, N, K, tA, tB, i, j,
                      C0[(int64_t)i * N + j], ref);
            }
            for (int n = 0; n < 3; n++) {
                float *Cn = fbuf((int64_t)M * N);
                memcpy(Cn, C, sizeof(float) * M * N);
                On[n]->matmul(On[n], Cn, A, B, M, N, K, tA, tB, 0.5f, 0.25f);
                CHECK(memcmp(Cn, C0, sizeof(float) * M * N) == 0,
                      "matmul %dx%dx%d t%d%d differs on %d threads", M, N, K, tA, tB,
                      n == 2 ? 16 : n + 2);
                fr(Cn);
            }
        }
        fr(A), fr(B), fr(C0), fr(C);
    }
    /* OpenBLAS's own threads spin-wait for each other (docs/performance.md): it stays on one */
    CHECK(openblas_get_num_threads() == 1, "OpenBLAS runs %d threads", openblas_get_num_threads());
    for (int n = 0; n < 3; n++) On[n]->destroy(On[n]);
}

/* syrk computes C's upper triangle by blocks of rows and mirrors it (ops_cpu.c): on shapes of one
 * block and of several (a ragged last one), both transposes and a beta, every element equals the
 * fp64 Gram product to 1e-4 relative (fp32 sums of K <= 200 products of O(1) numbers), C is
 * exactly symmetric, and 2, 3 and 16 threads give one thread's bits. */
static void test_syrk_is_the_symmetric_gram_product_on_any_thread_count(void) {
    static const int shapes[][2] = {{7, 5}, {300, 129}, {531, 200}};
    ust_ops *On[3] = {ops_cpu_create(2, 1), ops_cpu_create(3, 1), ops_cpu_create(16, 1)};
    for (int s = 0; s < 3; s++)
        for (int t = 0; t < 4; t++) {
            const int N = shapes[s][0], K = shapes[s][1], tA = t & 1;
            const float beta = t >> 1 ? -0.75f : 0.0f;
            float *A = randv((int64_t)N * K, 1), *C0 = fbuf((int64_t)N * N),
                  *C = fbuf((int64_t)N * N);
            for (int i = 0; i < N; i++) /* a symmetric C to start from, as the contract asks */
                for (int j = 0; j < N; j++) C0[(int64_t)i * N + j] = (float)((i + j) % 5) - 2.0f;
            memcpy(C, C0, sizeof(float) * N * N);
            O->syrk(O, C, A, N, K, tA, 0.5f, beta);
            int bad = 0;
            for (int i = 0; i < N && !bad; i++)
                for (int j = 0; j < N && !bad; j++) {
                    double ref = beta * (double)C0[(int64_t)i * N + j];
                    for (int k = 0; k < K; k++)
                        ref += 0.5 * A[tA ? (int64_t)k * N + i : (int64_t)i * K + k] *
                               A[tA ? (int64_t)k * N + j : (int64_t)j * K + k];
                    float got = C[(int64_t)i * N + j];
                    bad = fabs(got - ref) > 1e-4 * (1 + fabs(ref)) || got != C[(int64_t)j * N + i];
                    CHECK(!bad, "syrk %dx%d tA=%d beta=%g C[%d,%d] %g (C[%d,%d] %g) vs %g", N, K,
                          tA, beta, i, j, got, j, i, C[(int64_t)j * N + i], ref);
                }
            for (int n = 0; n < 3; n++) {
                float *Cn = dupv(C0, N * N);
                On[n]->syrk(On[n], Cn, A, N, K, tA, 0.5f, beta);
                CHECK(memcmp(Cn, C, sizeof(float) * N * N) == 0, "syrk %dx%d tA=%d on %d threads",
                      N, K, tA, n == 2 ? 16 : n + 2);
                fr(Cn);
            }
            fr(A), fr(C0), fr(C);
        }
    for (int n = 0; n < 3; n++) On[n]->destroy(On[n]);
}

static void test_measured_sgemm_rate_is_positive(void) {
    double f = ops_measure_sgemm_flops(O, 64, 3);
    CHECK(f > 0 && isfinite(f), "measured %g FLOP/s", f);
}

int main(void) {
    O = ops_cpu_create(1, 1);
    RUN_TEST(test_alloc_is_zeroed_aligned_and_copies_roundtrip);
    RUN_TEST(test_matmul_all_transpose_combos_with_alpha_beta_match_reference);
    RUN_TEST(test_matmul_batched_matches_each_problem_at_its_strides);
    RUN_TEST(test_linear_forward_matches_reference_with_and_without_bias);
    RUN_TEST(test_linear_backward_matches_finite_differences_and_accumulates);
    RUN_TEST(test_embedding_forward_takes_its_vocab_slice_and_adds_positions);
    RUN_TEST(test_embedding_backward_matches_finite_differences_and_accumulates);
    RUN_TEST(test_layernorm_forward_matches_reference);
    RUN_TEST(test_layernorm_backward_matches_finite_differences);
    RUN_TEST(test_rmsnorm_forward_matches_reference);
    RUN_TEST(test_rmsnorm_backward_matches_finite_differences);
    RUN_TEST(test_gelu_forward_matches_tanh_approximation);
    RUN_TEST(test_gelu_backward_matches_finite_differences);
    RUN_TEST(test_linear_gelu_backward_is_linear_then_gelu_backward);
    RUN_TEST(test_swiglu_forward_matches_reference);
    RUN_TEST(test_swiglu_backward_matches_finite_differences);
    RUN_TEST(test_geglu_forward_matches_reference);
    RUN_TEST(test_geglu_backward_matches_finite_differences);
    RUN_TEST(test_rope_forward_rotates_half_pairs_by_position);
    RUN_TEST(test_rope_backward_matches_finite_differences_and_inverts_forward);
    RUN_TEST(test_rope_llama3_scaling_matches_transformers_formula);
    RUN_TEST(test_attention_forward_matches_reference_causal_noncausal_gqa_cp);
    RUN_TEST(test_attention_backward_matches_finite_differences_noncausal_gqa);
    RUN_TEST(test_attention_softcap_matches_reference_and_finite_differences);
    RUN_TEST(test_attention_backward_matches_finite_differences_causal_cp_masked_row);
    RUN_TEST(test_attention_backward_matches_finite_differences_many_key_blocks);
    RUN_TEST(test_attention_with_documents_matches_reference_and_each_document_alone);
    RUN_TEST(test_attention_carries_a_nan_query_to_its_row);
    RUN_TEST(test_attention_merge_of_two_key_sets_equals_attention_over_all_keys);
    RUN_TEST(test_attention_backward_over_two_key_sets_with_merged_lse_equals_full_backward);
    RUN_TEST(test_xent_forward_excludes_padding_and_ignores_negative_targets);
    RUN_TEST(test_xent_backward_matches_finite_differences_and_may_alias_logits);
    RUN_TEST(test_xent_softcap_matches_reference_finite_differences_and_shards);
    RUN_TEST(test_adamw_two_steps_match_hand_computation);
    RUN_TEST(test_sumsq_and_sum_match_double_reference);
    RUN_TEST(test_adamw_many_and_sumsq_many_equal_per_segment_calls);
    RUN_TEST(test_bf16_state_ops_equal_fp32_forms_rounded);
    RUN_TEST(test_add_axpy_scale_are_exact_elementwise);
    RUN_TEST(test_vocab_parallel_xent_matches_the_whole_vocabulary);
    RUN_TEST(test_two_threads_match_one_thread_bit_for_bit_attention_and_layernorm);
    RUN_TEST(test_split_matmul_matches_one_thread_bit_for_bit);
    RUN_TEST(test_syrk_is_the_symmetric_gram_product_on_any_thread_count);
    RUN_TEST(test_measured_sgemm_rate_is_positive);
    O->destroy(O);
    return TEST_SUMMARY();
}
