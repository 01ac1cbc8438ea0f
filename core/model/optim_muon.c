#include "optim_muon.h"

#include <math.h>
#include <string.h>

int optim_matrix_kind(const char *name, int ndim, int decay) {
    if (ndim != 2 || !decay) return OPTIM_NOT_MATRIX;
    /* the vocabulary tables and positions are lookups, not linear maps of the hidden state:
     * Muon's orthogonalisation is for the latter (Jordan; Moonlight keeps AdamW for them) */
    if (strstr(name, "embed_tokens") || strstr(name, "embed_positions") || strstr(name, "lm_head"))
        return OPTIM_NOT_MATRIX;
    return strstr(name, ".router.") ? OPTIM_ROUTER : OPTIM_HIDDEN;
}

int optim_muon_takes(const ust_config *cfg, int kind) {
    if (strcmp(cfg->optimizer.name, "muon") != 0) return 0;
    return kind == OPTIM_HIDDEN || (kind == OPTIM_ROUTER && cfg->optimizer.muon_routers);
}

float optim_muon_scale(const ust_config *cfg, int64_t rows, int64_t cols) {
    if (cfg->optimizer.muon_scale == 1) {
        double r = (double)rows / (double)cols;
        return (float)sqrt(r > 1 ? r : 1);
    }
    return (float)(0.2 * sqrt((double)(rows > cols ? rows : cols)));
}

void optim_muon_momentum(const ust_ops *o, const ust_config *cfg, float *g, float *m, int64_t n,
                         float grad_scale) {
    float mu = (float)cfg->optimizer.momentum;
    o->scale(o, m, mu, n);
    o->axpy(o, m, grad_scale, g, n);
    if (cfg->optimizer.nesterov) {
        o->scale(o, g, grad_scale, n);
        o->axpy(o, g, mu, m, n);
    } else {
        o->copy(o, g, m, (size_t)n * sizeof(float));
    }
}

int64_t optim_ns_work(int64_t rows, int64_t cols) {
    int64_t k = rows < cols ? rows : cols;
    return 2 * k * k + rows * cols;
}

void optim_newton_schulz(const ust_ops *o, float *X, int rows, int cols, int steps, float *work) {
    int64_t n = (int64_t)rows * cols;
    int k = rows < cols ? rows : cols, wide = rows <= cols;
    float *A = work, *B = A + (int64_t)k * k, *Y = B + (int64_t)k * k;
    /* the iteration converges for singular values in (0, 1]: the Frobenius norm bounds them */
    o->scale(o, X, (float)(1.0 / (sqrt(o->sumsq(o, X, n)) + 1e-7)), n);
    float *cur = X, *next = Y;
    for (int s = 0; s < steps; s++) {
        /* A = X X^T (rows x rows), or X^T X (cols x cols) when tall: the same polynomial applied
         * from the right. A and A A are symmetric, so syrk computes one triangle of each: B
         * starts as A and takes c A A^T on top of b B, the polynomial's Gram part in one call. */
        o->syrk(o, A, cur, k, wide ? cols : rows, !wide, 1.0f, 0.0f);
        o->copy(o, B, A, (size_t)k * k * sizeof(float));
        o->syrk(o, B, A, k, k, 0, OPTIM_NS_C, OPTIM_NS_B); /* B = b A + c A A */
        o->copy(o, next, cur, (size_t)n * sizeof(float));
        if (wide) /* X' = a X + B X */
            o->matmul(o, next, B, cur, rows, cols, rows, 0, 0, 1.0f, OPTIM_NS_A);
        else /* X' = a X + X B */
            o->matmul(o, next, cur, B, rows, cols, cols, 0, 0, 1.0f, OPTIM_NS_A);
        float *t = cur;
        cur = next;
        next = t;
    }
    if (cur != X) o->copy(o, X, cur, (size_t)n * sizeof(float));
}

void optim_muon_apply(const ust_ops *o, float *p, const float *O, int64_t n, float lr, float wd,
                      float scale) {
    if (wd != 0) o->scale(o, p, 1.0f - lr * wd, n);
    o->axpy(o, p, -lr * scale, O, n);
}
