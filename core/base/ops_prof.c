/* ops_prof: see ops_prof.h. One wrapper per ops.h member: time it (when enabled) and forward. */
#include "ops_prof.h"

#include "error.h"
#include "log.h"

#include <stdlib.h>
#include <string.h>

/* One counter per ops.h member (alloc, free, sync, stream, memory and destroy are forwarded
 * untimed, so theirs stay 0 and never show). */
enum {
#define X(name) P_##name,
    UST_OPS_LIST(X)
#undef X
        P_COUNT
};
static const char *const prof_names[P_COUNT] = {
#define X(name) #name,
    UST_OPS_LIST(X)
#undef X
};

typedef struct {
    const ust_ops *in;
    int on;
    int64_t calls[P_COUNT];
    double seconds[P_COUNT];
} prof;

/* Runs `call` on the inner backend `in`; when enabled, between two syncs, its time added to op id.
 */
#define TIMED(id, call)                                                                            \
    do {                                                                                           \
        prof *p_ = (prof *)o->impl;                                                                \
        const ust_ops *in = p_->in;                                                                \
        if (!p_->on) {                                                                             \
            call;                                                                                  \
            break;                                                                                 \
        }                                                                                          \
        in->sync(in);                                                                              \
        double t0_ = log_now_s();                                                                  \
        call;                                                                                      \
        in->sync(in);                                                                              \
        p_->seconds[id] += log_now_s() - t0_;                                                      \
        p_->calls[id]++;                                                                           \
    } while (0)

static const ust_ops *inner_of(const ust_ops *o) { return ((const prof *)o->impl)->in; }

static void *pf_alloc(const ust_ops *o, size_t bytes) {
    return inner_of(o)->alloc(inner_of(o), bytes);
}
static void pf_free(const ust_ops *o, void *p) { inner_of(o)->free(inner_of(o), p); }
static void *pf_host_alloc(const ust_ops *o, size_t bytes) {
    return inner_of(o)->host_alloc(inner_of(o), bytes);
}
static void pf_host_free(const ust_ops *o, void *p) { inner_of(o)->host_free(inner_of(o), p); }
static void pf_sync(const ust_ops *o) { inner_of(o)->sync(inner_of(o)); }
static void *pf_stream(const ust_ops *o) { return inner_of(o)->stream(inner_of(o)); }
static void pf_memory(const ust_ops *o, ops_mem *m) { inner_of(o)->memory(inner_of(o), m); }

static void pf_to_device(const ust_ops *o, void *dst, const void *host_src, size_t bytes) {
    TIMED(P_to_device, in->to_device(in, dst, host_src, bytes));
}
static void pf_to_host(const ust_ops *o, void *host_dst, const void *src, size_t bytes) {
    TIMED(P_to_host, in->to_host(in, host_dst, src, bytes));
}
static void pf_copy(const ust_ops *o, void *dst, const void *src, size_t bytes) {
    TIMED(P_copy, in->copy(in, dst, src, bytes));
}
static void pf_copy2d(const ust_ops *o, void *dst, size_t dpitch, const void *src, size_t spitch,
                      size_t width, size_t rows) {
    TIMED(P_copy2d, in->copy2d(in, dst, dpitch, src, spitch, width, rows));
}
static void pf_zero(const ust_ops *o, void *p, size_t bytes) {
    TIMED(P_zero, in->zero(in, p, bytes));
}
static void pf_matmul(const ust_ops *o, float *C, const float *A, const float *B, int M, int N,
                      int K, int tA, int tB, float alpha, float beta) {
    TIMED(P_matmul, in->matmul(in, C, A, B, M, N, K, tA, tB, alpha, beta));
}
static void pf_matmul_batched(const ust_ops *o, float *C, const float *A, const float *B, int M,
                              int N, int K, int tA, int tB, float alpha, float beta, int batch,
                              int64_t strideA, int64_t strideB, int64_t strideC) {
    TIMED(P_matmul_batched, in->matmul_batched(in, C, A, B, M, N, K, tA, tB, alpha, beta, batch,
                                               strideA, strideB, strideC));
}
static void pf_syrk(const ust_ops *o, float *C, const float *A, int N, int K, int tA, float alpha,
                    float beta) {
    TIMED(P_syrk, in->syrk(in, C, A, N, K, tA, alpha, beta));
}
static void pf_linear_fwd(const ust_ops *o, act *out, const act *inp, const float *w,
                          const float *bias, int N, int C, int OC) {
    TIMED(P_linear_fwd, in->linear_fwd(in, out, inp, w, bias, N, C, OC));
}
static void pf_linear_bwd(const ust_ops *o, act *dinp, float *dw, float *dbias, const act *dout,
                          const act *inp, const float *w, int N, int C, int OC, int acc_dinp) {
    TIMED(P_linear_bwd, in->linear_bwd(in, dinp, dw, dbias, dout, inp, w, N, C, OC, acc_dinp));
}
static void pf_embedding_fwd(const ust_ops *o, act *out, const int32_t *tok, const int32_t *pos,
                             const float *wte, const float *wpe, int B, int T, int C, int v_start,
                             int v_end) {
    TIMED(P_embedding_fwd, in->embedding_fwd(in, out, tok, pos, wte, wpe, B, T, C, v_start, v_end));
}
static void pf_embedding_bwd(const ust_ops *o, float *dwte, float *dwpe, const act *dout,
                             const int32_t *tok, const int32_t *pos, int B, int T, int C,
                             int v_start, int v_end) {
    TIMED(P_embedding_bwd,
          in->embedding_bwd(in, dwte, dwpe, dout, tok, pos, B, T, C, v_start, v_end));
}
static void pf_layernorm_fwd(const ust_ops *o, act *out, float *mean, float *rstd, const act *inp,
                             const float *w, const float *b, int N, int C, float eps) {
    TIMED(P_layernorm_fwd, in->layernorm_fwd(in, out, mean, rstd, inp, w, b, N, C, eps));
}
static void pf_layernorm_bwd(const ust_ops *o, act *dinp, float *dw, float *db, const act *dout,
                             const act *inp, const float *w, const float *mean, const float *rstd,
                             int N, int C) {
    TIMED(P_layernorm_bwd, in->layernorm_bwd(in, dinp, dw, db, dout, inp, w, mean, rstd, N, C));
}
static void pf_rmsnorm_fwd(const ust_ops *o, act *out, float *rstd, const act *inp, const float *w,
                           int N, int C, float eps) {
    TIMED(P_rmsnorm_fwd, in->rmsnorm_fwd(in, out, rstd, inp, w, N, C, eps));
}
static void pf_rmsnorm_bwd(const ust_ops *o, act *dinp, float *dw, const act *dout, const act *inp,
                           const float *w, const float *rstd, int N, int C) {
    TIMED(P_rmsnorm_bwd, in->rmsnorm_bwd(in, dinp, dw, dout, inp, w, rstd, N, C));
}
static void pf_gelu_fwd(const ust_ops *o, act *out, const act *inp, int64_t n) {
    TIMED(P_gelu_fwd, in->gelu_fwd(in, out, inp, n));
}
static void pf_gelu_bwd(const ust_ops *o, act *dinp, const act *inp, const act *dout, int64_t n) {
    TIMED(P_gelu_bwd, in->gelu_bwd(in, dinp, inp, dout, n));
}
static void pf_linear_gelu_fwd(const ust_ops *o, act *up, act *out, const act *inp, const float *w,
                               const float *bias, int N, int C, int OC) {
    TIMED(P_linear_gelu_fwd, in->linear_gelu_fwd(in, up, out, inp, w, bias, N, C, OC));
}
static void pf_linear_gelu_bwd(const ust_ops *o, act *dup, float *dw, float *dbias, const act *dout,
                               const act *inp, const act *up, const float *w, int N, int OC,
                               int C) {
    TIMED(P_linear_gelu_bwd, in->linear_gelu_bwd(in, dup, dw, dbias, dout, inp, up, w, N, OC, C));
}
static void pf_swiglu_fwd(const ust_ops *o, act *out, const act *gate, const act *up, int64_t n) {
    TIMED(P_swiglu_fwd, in->swiglu_fwd(in, out, gate, up, n));
}
static void pf_swiglu_bwd(const ust_ops *o, act *dgate, act *dup, const act *dout, const act *gate,
                          const act *up, int64_t n) {
    TIMED(P_swiglu_bwd, in->swiglu_bwd(in, dgate, dup, dout, gate, up, n));
}
static void pf_geglu_fwd(const ust_ops *o, act *out, const act *gate, const act *up, int64_t n) {
    TIMED(P_geglu_fwd, in->geglu_fwd(in, out, gate, up, n));
}
static void pf_geglu_bwd(const ust_ops *o, act *dgate, act *dup, const act *dout, const act *gate,
                         const act *up, int64_t n) {
    TIMED(P_geglu_bwd, in->geglu_bwd(in, dgate, dup, dout, gate, up, n));
}
static void pf_rope_fwd(const ust_ops *o, act *out, const act *inp, const int32_t *pos, int B,
                        int T, int H, int D, const ust_rope *rope) {
    TIMED(P_rope_fwd, in->rope_fwd(in, out, inp, pos, B, T, H, D, rope));
}
static void pf_rope_bwd(const ust_ops *o, act *dinp, const act *dout, const int32_t *pos, int B,
                        int T, int H, int D, const ust_rope *rope) {
    TIMED(P_rope_bwd, in->rope_bwd(in, dinp, dout, pos, B, T, H, D, rope));
}
static void pf_attention_fwd(const ust_ops *o, act *out, float *lse, const act *q, const act *k,
                             const act *v, int B, int Tq, int Tk, int H, int Hkv, int D,
                             const int32_t *q_pos, const int32_t *k_pos, int causal,
                             const int32_t *q_start, float softcap) {
    TIMED(P_attention_fwd, in->attention_fwd(in, out, lse, q, k, v, B, Tq, Tk, H, Hkv, D, q_pos,
                                             k_pos, causal, q_start, softcap));
}
static void pf_attention_bwd(const ust_ops *o, act *dq, act *dk, act *dv, const act *dout,
                             const act *out, const float *lse, const act *q, const act *k,
                             const act *v, int B, int Tq, int Tk, int H, int Hkv, int D,
                             const int32_t *q_pos, const int32_t *k_pos, int causal,
                             const int32_t *q_start, float softcap) {
    TIMED(P_attention_bwd, in->attention_bwd(in, dq, dk, dv, dout, out, lse, q, k, v, B, Tq, Tk, H,
                                             Hkv, D, q_pos, k_pos, causal, q_start, softcap));
}
static void pf_attention_merge(const ust_ops *o, act *out, float *lse, const act *out2,
                               const float *lse2, int B, int T, int H, int D) {
    TIMED(P_attention_merge, in->attention_merge(in, out, lse, out2, lse2, B, T, H, D));
}
static void pf_xent_fwd_bwd(const ust_ops *o, float *losses, act *dlogits, const act *logits,
                            const int32_t *targets, int N, int V, int v_real, float dscale,
                            float softcap) {
    TIMED(P_xent_fwd_bwd,
          in->xent_fwd_bwd(in, losses, dlogits, logits, targets, N, V, v_real, dscale, softcap));
}
static void pf_xent_vp_local(const ust_ops *o, float *lse, float *tlogit, const act *logits,
                             const int32_t *targets, int N, int V, int v_start, int v_real,
                             float softcap) {
    TIMED(P_xent_vp_local,
          in->xent_vp_local(in, lse, tlogit, logits, targets, N, V, v_start, v_real, softcap));
}
static void pf_xent_vp_finish(const ust_ops *o, float *losses, act *dlogits, const act *logits,
                              const int32_t *targets, const float *lse, const float *tlogit, int N,
                              int V, int v_start, int v_real, float dscale, float softcap) {
    TIMED(P_xent_vp_finish, in->xent_vp_finish(in, losses, dlogits, logits, targets, lse, tlogit, N,
                                               V, v_start, v_real, dscale, softcap));
}
static void pf_adamw(const ust_ops *o, float *p, const float *grad, float *m, float *v, int64_t n,
                     float lr, float b1, float b2, float eps, float wd, float grad_scale,
                     int64_t t) {
    TIMED(P_adamw, in->adamw(in, p, grad, m, v, n, lr, b1, b2, eps, wd, grad_scale, t));
}
static void pf_adamw_many(const ust_ops *o, float *p, const float *grad, float *m, float *v,
                          const ops_segment *seg, int k, float lr, float b1, float b2, float eps,
                          float grad_scale, int64_t t) {
    TIMED(P_adamw_many, in->adamw_many(in, p, grad, m, v, seg, k, lr, b1, b2, eps, grad_scale, t));
}
static void pf_sumsq_many(const ust_ops *o, const float *grad, const ops_segment *seg, int k,
                          double *out) {
    TIMED(P_sumsq_many, in->sumsq_many(in, grad, seg, k, out));
}
static void pf_adamw16_many(const ust_ops *o, float *p, const float *grad, uint16_t *m, uint16_t *v,
                            const ops_segment *seg, int k, float lr, float b1, float b2, float eps,
                            float grad_scale, int64_t t) {
    TIMED(P_adamw16_many,
          in->adamw16_many(in, p, grad, m, v, seg, k, lr, b1, b2, eps, grad_scale, t));
}
static void pf_momentum16(const ust_ops *o, float *g, uint16_t *m, int64_t n, float mu,
                          float grad_scale, int nesterov) {
    TIMED(P_momentum16, in->momentum16(in, g, m, n, mu, grad_scale, nesterov));
}
static void pf_add(const ust_ops *o, act *out, const act *a, const act *b, int64_t n) {
    TIMED(P_add, in->add(in, out, a, b, n));
}
static void pf_axpy(const ust_ops *o, float *y, float a, const float *x, int64_t n) {
    TIMED(P_axpy, in->axpy(in, y, a, x, n));
}
static void pf_scale(const ust_ops *o, float *x, float s, int64_t n) {
    TIMED(P_scale, in->scale(in, x, s, n));
}
static void pf_scale_act(const ust_ops *o, act *x, float s, int64_t n) {
    TIMED(P_scale_act, in->scale_act(in, x, s, n));
}
static double pf_sumsq(const ust_ops *o, const float *x, int64_t n) {
    double r;
    TIMED(P_sumsq, r = in->sumsq(in, x, n));
    return r;
}
static double pf_sum(const ust_ops *o, const float *x, int64_t n) {
    double r;
    TIMED(P_sum, r = in->sum(in, x, n));
    return r;
}
static void pf_moe_router_fwd(const ust_ops *o, float *probs, float *lse, int32_t *topk,
                              float *gate, float *psum, const act *logits, const float *bias, int N,
                              int E, int k, const ops_moe_route *r) {
    TIMED(P_moe_router_fwd,
          in->moe_router_fwd(in, probs, lse, topk, gate, psum, logits, bias, N, E, k, r));
}
static void pf_moe_router_bwd(const ust_ops *o, act *dlogits, const float *dgate,
                              const float *probs, const float *lse, const int32_t *topk,
                              const float *gate, const float *aux_dp, float zscale, int N, int E,
                              int k, const ops_moe_route *r) {
    TIMED(P_moe_router_bwd, in->moe_router_bwd(in, dlogits, dgate, probs, lse, topk, gate, aux_dp,
                                               zscale, N, E, k, r));
}
static void pf_moe_gather(const ust_ops *o, act *out, const act *inp, const int32_t *src,
                          const float *scale, int M, int C, int div) {
    TIMED(P_moe_gather, in->moe_gather(in, out, inp, src, scale, M, C, div));
}
static void pf_moe_combine(const ust_ops *o, act *out, const act *rows, const int32_t *pos,
                           const float *gate, int N, int k, int C, int acc) {
    TIMED(P_moe_combine, in->moe_combine(in, out, rows, pos, gate, N, k, C, acc));
}
static void pf_moe_gate_grad(const ust_ops *o, float *dgate, const act *dout, const act *rows,
                             const int32_t *pos, int N, int k, int C) {
    TIMED(P_moe_gate_grad, in->moe_gate_grad(in, dgate, dout, rows, pos, N, k, C));
}
static void pf_grouped_linear_fwd(const ust_ops *o, act *out, const act *inp, const float *const *w,
                                  const float *const *b, const int32_t *M, int G, int C, int OC) {
    TIMED(P_grouped_linear_fwd, in->grouped_linear_fwd(in, out, inp, w, b, M, G, C, OC));
}
static void pf_grouped_linear_bwd(const ust_ops *o, act *dinp, float *const *dw, float *const *db,
                                  const act *dout, const act *inp, const float *const *w,
                                  const int32_t *M, int G, int C, int OC, int acc_dinp) {
    TIMED(P_grouped_linear_bwd,
          in->grouped_linear_bwd(in, dinp, dw, db, dout, inp, w, M, G, C, OC, acc_dinp));
}
static void pf_attention_logit_max(const ust_ops *o, float *mx, const act *q, const act *k, int B,
                                   int Tq, int Tk, int H, int Hkv, int D, const int32_t *q_pos,
                                   const int32_t *k_pos, int causal, const int32_t *q_start) {
    TIMED(P_attention_logit_max, in->attention_logit_max(in, mx, q, k, B, Tq, Tk, H, Hkv, D, q_pos,
                                                         k_pos, causal, q_start));
}

static void pf_destroy(ust_ops *o) {
    free(o->impl);
    free(o);
}

ust_ops *ops_prof_create(const ust_ops *inner) {
    ust_ops *w = calloc(1, sizeof *w);
    prof *p = calloc(1, sizeof *p);
    if (!w || !p) ust_fatal(UST_EXIT_RUNTIME, "out of memory creating the op profiler");
    p->in = inner;
    w->name = "prof"; /* not the inner name: backend-specific calls must get the inner backend */
    w->impl = p;
    w->act_size = inner->act_size;
#define FILL(op) w->op = pf_##op;
    UST_OPS_LIST(FILL)
#undef FILL
    return w;
}

void ops_prof_enable(ust_ops *o, int on) { ((prof *)o->impl)->on = on != 0; }

static int by_time_desc(const void *a, const void *b) {
    double x = ((const ops_prof_entry *)a)->seconds, y = ((const ops_prof_entry *)b)->seconds;
    return x < y ? 1 : x > y ? -1 : 0;
}

int ops_prof_entries(const ust_ops *o, ops_prof_entry *out, int max) {
    const prof *p = (const prof *)o->impl;
    ops_prof_entry all[P_COUNT];
    int n = 0;
    for (int i = 0; i < P_COUNT; i++)
        if (p->calls[i] > 0) all[n++] = (ops_prof_entry){prof_names[i], p->calls[i], p->seconds[i]};
    qsort(all, (size_t)n, sizeof all[0], by_time_desc);
    if (n > max) n = max;
    memcpy(out, all, (size_t)n * sizeof all[0]);
    return n;
}

void ops_prof_print(const ust_ops *o, FILE *f, int steps) {
    ops_prof_entry e[P_COUNT];
    int n = ops_prof_entries(o, e, P_COUNT);
    double total = 0;
    for (int i = 0; i < n; i++) total += e[i].seconds;
    if (steps < 1) steps = 1;
    fprintf(f, "%-16s %9s %12s %7s\n", "op", "calls/step", "ms/step", "share");
    for (int i = 0; i < n; i++)
        fprintf(f, "%-16s %9.1f %12.3f %6.1f%%\n", e[i].op, (double)e[i].calls / steps,
                e[i].seconds / steps * 1e3, total > 0 ? 100.0 * e[i].seconds / total : 0.0);
    fprintf(f, "%-16s %9s %12.3f\n", "total", "", total / steps * 1e3);
}
