/* ops: the compute interface every backend implements (CPU here, CUDA in cuda/).
 * Tensors are device pointers, row-major; token-major activations are (B,T,...). Parameters,
 * their gradients, optimizer state and statistics (norms' mean/rstd, lse, losses, router
 * probabilities and gates) are fp32. Activations and their gradients, typed `act`, are in the
 * backend's activation type: fp32, or bf16 (CUDA under train.precision bf16), act_size bytes
 * each; index them only through act_at.
 * Ops are enqueued on the backend's stream; the CPU backend runs them synchronously.
 * Conventions: backward ops ACCUMULATE (+=) into parameter gradients (dw, db) and into
 * attention's dq/dk/dv (ring attention sums over blocks); they OVERWRITE other activation
 * gradients (dinp) unless a flag says otherwise. Any gradient output may be NULL (not wanted). */
#ifndef UST_OPS_H
#define UST_OPS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "config.h"
#include "error.h"

typedef struct ust_ops ust_ops;

#ifdef __CUDACC__
#define UST_HOST_DEVICE __host__ __device__
#else
#define UST_HOST_DEVICE
#endif

/* RoPE's frequencies: theta^(-2i/D) for pair i of a head of D, and, when factor > 0, Llama 3.1's
 * "llama3" rope_scaling on top (transformers' _compute_llama3_parameters): wavelengths longer
 * than original_max_pos / low_freq_factor are slowed by factor, shorter than original_max_pos /
 * high_freq_factor kept, and those between blended smoothly. Computed in double. */
typedef struct {
    double theta;
    double factor; /* 0: no scaling */
    double low_freq_factor, high_freq_factor, original_max_pos;
    /* YaRN (yarn > 0, transformers' _compute_yarn_parameters): pairs below the correction range
     * of beta_fast / beta_slow rotations over original_max_pos keep their frequency, pairs above
     * it are slowed by factor, a linear ramp between; the rotated q and k are scaled by attn
     * (0: 1), so attention logits by attn^2 */
    int yarn, truncate;
    double beta_fast, beta_slow, attn;
    /* model.partial_rotary_factor: the first rot features of a head rotate, as pairs (i,
     * i + rot/2) at theta^(-2i/rot), the others pass unchanged (0: all D; the CPU backend) */
    int rot;
    int linear; /* rope_scaling linear (Gemma 3's global layers): every frequency / factor */
} ust_rope;
/* The model's RoPE as the config gives it (model.rope_theta and a llama3 rope_scaling). Under
 * model.query_pre_attn_scalar s, attn also carries (D / s)^(1/4): q.k / sqrt(D) becomes
 * q.k / sqrt(s), as Gemma scales its attention logits. */
ust_rope ops_rope(const ust_config *c);
/* model.rope_local_theta: the windowed layers' RoPE, that base without rope_scaling. */
ust_rope ops_rope_local(const ust_config *c);

static inline UST_HOST_DEVICE double ust_rope_yarn(const ust_rope *r, int i, int D, double f) {
    const double pi = 3.14159265358979323846, lt = 2.0 * log(r->theta);
    double lo = D * log(r->original_max_pos / (r->beta_fast * 2.0 * pi)) / lt;
    double hi = D * log(r->original_max_pos / (r->beta_slow * 2.0 * pi)) / lt;
    if (r->truncate) lo = floor(lo), hi = ceil(hi);
    lo = lo > 0 ? lo : 0, hi = hi < D - 1 ? hi : D - 1;
    if (lo == hi) hi += 0.001;
    double ramp = (i - lo) / (hi - lo), keep = 1.0 - (ramp < 0 ? 0 : ramp > 1 ? 1 : ramp);
    return f / r->factor * (1.0 - keep) + f * keep;
}

static inline UST_HOST_DEVICE double ust_rope_inv_freq(const ust_rope *r, int i, int D) {
    double f = pow(r->theta, -2.0 * i / D);
    if (r->factor <= 0) return f;
    if (r->linear) return f / r->factor;
    if (r->yarn) return ust_rope_yarn(r, i, D, f);
    double wavelen = 2.0 * 3.14159265358979323846 / f;
    if (wavelen < r->original_max_pos / r->high_freq_factor) return f;
    if (wavelen > r->original_max_pos / r->low_freq_factor) return f / r->factor;
    double s = (r->original_max_pos / wavelen - r->low_freq_factor) /
               (r->high_freq_factor - r->low_freq_factor);
    return (1.0 - s) * f / r->factor + s * f;
}

/* Activation storage: opaque on purpose (with -Wpointer-arith no arithmetic compiles on it),
 * because its element size is the backend's act_size. */
typedef void act;

/* One tensor of a multi-tensor op: n floats at offset p of the parameters, g of the gradients
 * and m of both moments, with weight decay wd (sumsq_many reads g and n only). */
typedef struct {
    int64_t p, g, m, n;
    float wd;
} ops_segment;

/* The MoE router's options (moe_router_fwd): sigmoid scores (DeepSeek-V3) instead of softmax,
 * the k gates renormalized (norm), group-limited choice (n_group > 1: topk_group groups of
 * E/n_group consecutive experts, at most 64 groups, ranked by the sum of each group's group_top
 * highest scores + bias: 0 means 2, DeepSeek-V3's; node-limited routing sums top_k / nodes, at
 * most 16), the gates' factor (scale). */
typedef struct {
    int sigmoid, norm, n_group, topk_group;
    float scale;
    int group_top;
} ops_moe_route;

/* Device memory as a backend sees it (all 0 on the CPU): its own scratch and workspaces outside
 * the arena (bytes), the device allocations it has made so far (arena blocks and scratch growth:
 * none should happen once the first step has sized the scratch), and the device's used and total
 * memory as the driver reports them (all processes). */
typedef struct {
    size_t backend_bytes, device_used, device_total;
    int64_t allocations;
} ops_mem;

struct ust_ops {
    const char *name; /* "cpu" or "cuda" */
    void *impl;       /* backend-private state */
    int act_size;     /* bytes per activation element: 4 (fp32) or 2 (bf16) */
    /* run.deterministic false: ops may pick kernels whose fp32 atomics sum in a varying order
     * (results differ in the last bits run to run); 0: every op is bit-reproducible */
    int nondeterministic;

    /* ---- memory ---- */
    void *(*alloc)(const ust_ops *o, size_t bytes); /* zeroed, 64-byte aligned; fatal on OOM */
    void (*free)(const ust_ops *o, void *p);
    /* Host memory the device copies into fastest (page-locked on CUDA), zeroed; NULL when none
     * can be had (the caller may fall back to malloc). Freed with host_free. */
    void *(*host_alloc)(const ust_ops *o, size_t bytes);
    void (*host_free)(const ust_ops *o, void *p);
    void (*to_device)(const ust_ops *o, void *dst, const void *host_src, size_t bytes);
    void (*to_host)(const ust_ops *o, void *host_dst, const void *src, size_t bytes);
    void (*copy)(const ust_ops *o, void *dst, const void *src, size_t bytes);
    /* `rows` rows of `width` bytes each from src (rows `spitch` bytes apart) to dst (`dpitch`
     * apart), as cudaMemcpy2D: the head-slice gathers of Ulysses context parallelism. */
    void (*copy2d)(const ust_ops *o, void *dst, size_t dpitch, const void *src, size_t spitch,
                   size_t width, size_t rows);
    void (*zero)(const ust_ops *o, void *p, size_t bytes);
    void (*sync)(const ust_ops *o);
    /* The stream every op is enqueued on (a cudaStream_t; NULL on the CPU), for
     * comm_ctx_set_stream. */
    void *(*stream)(const ust_ops *o);
    void (*memory)(const ust_ops *o, ops_mem *m);

    /* ---- matmul ----
     * C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C, row-major; op(X) = X^T when tX. */
    void (*matmul)(const ust_ops *o, float *C, const float *A, const float *B, int M, int N, int K,
                   int tA, int tB, float alpha, float beta);
    /* The same for `batch` independent problems at the given element strides. */
    void (*matmul_batched)(const ust_ops *o, float *C, const float *A, const float *B, int M, int N,
                           int K, int tA, int tB, float alpha, float beta, int batch,
                           int64_t strideA, int64_t strideB, int64_t strideC);
    /* C[N,N] = alpha * op(A) op(A)^T + beta * C, op(A) = A stored (N,K), or A^T when tA (A stored
     * (K,N)): a Gram matrix (Muon's Newton-Schulz). C must be symmetric on entry when beta != 0;
     * it is written whole, both triangles. The CPU computes one triangle (ssyrk: half the
     * multiply-adds of matmul) and mirrors it; CUDA runs its matmul (bf16 products under bf16). */
    void (*syrk)(const ust_ops *o, float *C, const float *A, int N, int K, int tA, float alpha,
                 float beta);

    /* ---- linear: out(N,OC) = inp(N,C) @ w(OC,C)^T + bias(OC) (bias may be NULL) ----
     * backward: dinp(N,C) = dout @ w (or += when acc_dinp), dw(OC,C) += dout^T @ inp,
     * dbias(OC) += column sums of dout. */
    void (*linear_fwd)(const ust_ops *o, act *out, const act *inp, const float *w,
                       const float *bias, int N, int C, int OC);
    void (*linear_bwd)(const ust_ops *o, act *dinp, float *dw, float *dbias, const act *dout,
                       const act *inp, const float *w, int N, int C, int OC, int acc_dinp);

    /* ---- embedding: out(B,T,C) = wte[tok - v_start] + wpe[pos[t]] ----
     * wte holds vocabulary rows [v_start, v_end); tokens outside contribute 0 (vocab-parallel).
     * wpe and pos may be NULL (no learned positions; positions t). pos(B,T): each token's own,
     * so a sequence may restart them at each document.
     * backward accumulates into dwte/dwpe. */
    void (*embedding_fwd)(const ust_ops *o, act *out, const int32_t *tok, const int32_t *pos,
                          const float *wte, const float *wpe, int B, int T, int C, int v_start,
                          int v_end);
    void (*embedding_bwd)(const ust_ops *o, float *dwte, float *dwpe, const act *dout,
                          const int32_t *tok, const int32_t *pos, int B, int T, int C, int v_start,
                          int v_end);

    /* ---- norms over the last dim C of N rows; mean/rstd (N) saved for backward ---- */
    void (*layernorm_fwd)(const ust_ops *o, act *out, float *mean, float *rstd, const act *inp,
                          const float *w, const float *b, int N, int C, float eps);
    void (*layernorm_bwd)(const ust_ops *o, act *dinp, float *dw, float *db, const act *dout,
                          const act *inp, const float *w, const float *mean, const float *rstd,
                          int N, int C);
    void (*rmsnorm_fwd)(const ust_ops *o, act *out, float *rstd, const act *inp, const float *w,
                        int N, int C, float eps);
    void (*rmsnorm_bwd)(const ust_ops *o, act *dinp, float *dw, const act *dout, const act *inp,
                        const float *w, const float *rstd, int N, int C);

    /* ---- activations, elementwise over n ---- */
    /* GPT-2's tanh approximation: 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))) */
    void (*gelu_fwd)(const ust_ops *o, act *out, const act *inp, int64_t n);
    void (*gelu_bwd)(const ust_ops *o, act *dinp, const act *inp, const act *dout, int64_t n);
    /* up(N,OC) = linear_fwd(inp, w, bias), out = gelu_fwd(up): gpt2's MLP up-projection, which
     * the GPU fuses into the GEMM's epilogue under bf16 */
    void (*linear_gelu_fwd)(const ust_ops *o, act *up, act *out, const act *inp, const float *w,
                            const float *bias, int N, int C, int OC);
    /* Its backward through the down-projection that follows: dup(N,OC) = gelu_bwd(up, dout @ w)
     * (overwritten), dw(C,OC) += dout^T @ inp, dbias(C) += column sums of dout, for
     * dout(N,C), inp = gelu(up) (N,OC), w(C,OC); the GPU fuses the GELU's backward into the
     * GEMM's epilogue under bf16. */
    void (*linear_gelu_bwd)(const ust_ops *o, act *dup, float *dw, float *dbias, const act *dout,
                            const act *inp, const act *up, const float *w, int N, int OC, int C);
    /* out = silu(gate) * up */
    void (*swiglu_fwd)(const ust_ops *o, act *out, const act *gate, const act *up, int64_t n);
    void (*swiglu_bwd)(const ust_ops *o, act *dgate, act *dup, const act *dout, const act *gate,
                       const act *up, int64_t n);
    /* out = gelu(gate) * up, GELU's tanh form (GeGLU: model.hidden_act gelu_tanh, Gemma) */
    void (*geglu_fwd)(const ust_ops *o, act *out, const act *gate, const act *up, int64_t n);
    void (*geglu_bwd)(const ust_ops *o, act *dgate, act *dup, const act *dout, const act *gate,
                      const act *up, int64_t n);

    /* ---- RoPE on x(B,T,H,D), rotate-half convention (pairs i, i+D/2, as Hugging Face Llama),
     * angle pos[b, t] * ust_rope_inv_freq(rope, i, D) (pos(B,T); NULL: positions t). out may equal
     * inp. Backward applies the inverse rotation: dinp = R^T dout (dinp may equal dout). ---- */
    void (*rope_fwd)(const ust_ops *o, act *out, const act *inp, const int32_t *pos, int B, int T,
                     int H, int D, const ust_rope *rope);
    void (*rope_bwd)(const ust_ops *o, act *dinp, const act *dout, const int32_t *pos, int B, int T,
                     int H, int D, const ust_rope *rope);

    /* ---- attention, flash-style (online softmax, nothing of size T*T kept) ----
     * q(B,Tq,H,D), k,v(B,Tk,Hkv,D), out(B,Tq,H,D), lse(B,H,Tq) = log sum_j exp(s_ij);
     * s_ij = q_i.k_j / sqrt(D); query head h uses kv head h / (H/Hkv) (GQA).
     * When causal, key j is visible to query i iff k_pos[j] <= q_pos[i] (positions are global
     * token positions, so context-parallel blocks mask correctly). q_start(B,Tq), when not NULL,
     * masks documents: key j is visible to query i of sequence b only if also k_pos[j] >=
     * q_start[b, i], the position where i's document begins (documents are contiguous, so this is
     * "the same document"); a key block no query of a tile can see is skipped. A query that sees
     * no key gets out = 0 and lse = -INFINITY. Backward takes the final out/lse (after any merge)
     * and accumulates into dq, dk, dv. softcap c > 0 (model.attn_softcap, Gemma 2's
     * attn_logit_softcapping) soft-caps every score before the mask and softmax, s -> c tanh(s /
     * c), backward through tanh's derivative 1 - tanh^2; 0: none. */
    void (*attention_fwd)(const ust_ops *o, act *out, float *lse, const act *q, const act *k,
                          const act *v, int B, int Tq, int Tk, int H, int Hkv, int D,
                          const int32_t *q_pos, const int32_t *k_pos, int causal,
                          const int32_t *q_start, float softcap);
    void (*attention_bwd)(const ust_ops *o, act *dq, act *dk, act *dv, const act *dout,
                          const act *out, const float *lse, const act *q, const act *k,
                          const act *v, int B, int Tq, int Tk, int H, int Hkv, int D,
                          const int32_t *q_pos, const int32_t *k_pos, int causal,
                          const int32_t *q_start, float softcap);
    /* Merges a partial result (out2, lse2) over other keys into (out, lse), in place. */
    void (*attention_merge)(const ust_ops *o, act *out, float *lse, const act *out2,
                            const float *lse2, int B, int T, int H, int D);

    /* ---- softmax cross-entropy, fused with its backward ----
     * logits(N,V); columns >= v_real are padding (probability 0, gradient 0). losses(N) gets
     * -log p[target]; a target < 0 is ignored (loss 0, gradient 0). When dlogits != NULL it gets
     * (softmax - onehot) * dscale; dlogits may equal logits. softcap c > 0 (model.final_softcap,
     * Gemma 2's final_logit_softcapping): the loss is over the soft-capped logits c tanh(x / c)
     * and dlogits is with respect to the raw x (times 1 - tanh^2), so logits stay uncapped in
     * memory; 0: none. The vocabulary-parallel pair below caps the same way. */
    void (*xent_fwd_bwd)(const ust_ops *o, float *losses, act *dlogits, const act *logits,
                         const int32_t *targets, int N, int V, int v_real, float dscale,
                         float softcap);

    /* ---- vocab-parallel cross-entropy: logits(N,V) hold vocabulary columns [v_start,
     * v_start+V) of a vocabulary whose real size is v_real (global columns >= v_real are
     * padding). xent_vp_local writes each row's log-sum-exp over its real local columns (lse,
     * -INFINITY when it has none) and the target's logit when the target is a local column
     * (tlogit, else 0). After the caller combines them over the vocabulary shards (lse merged,
     * tlogit summed), xent_vp_finish writes losses = lse - tlogit and, when dlogits != NULL,
     * (softmax - onehot) * dscale for the local columns (dlogits may equal logits). Targets < 0
     * are ignored (loss 0, gradient 0). ---- */
    void (*xent_vp_local)(const ust_ops *o, float *lse, float *tlogit, const act *logits,
                          const int32_t *targets, int N, int V, int v_start, int v_real,
                          float softcap);
    void (*xent_vp_finish)(const ust_ops *o, float *losses, act *dlogits, const act *logits,
                           const int32_t *targets, const float *lse, const float *tlogit, int N,
                           int V, int v_start, int v_real, float dscale, float softcap);

    /* ---- optimizer: AdamW on fp32 master weights, step t >= 1 (bias correction).
     * g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
     * p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p). ---- */
    void (*adamw)(const ust_ops *o, float *p, const float *grad, float *m, float *v, int64_t n,
                  float lr, float b1, float b2, float eps, float wd, float grad_scale, int64_t t);
    /* Multi-tensor forms for the optimizer step and the gradient norm: k segments of the same
     * buffers, each exactly like one call of the single form (out[i]: segment i's sum of
     * squares). The GPU runs each in one launch, and sumsq_many waits once. */
    void (*adamw_many)(const ust_ops *o, float *p, const float *grad, float *m, float *v,
                       const ops_segment *seg, int k, float lr, float b1, float b2, float eps,
                       float grad_scale, int64_t t);
    void (*sumsq_many)(const ust_ops *o, const float *grad, const ops_segment *seg, int k,
                       double *out);
    /* bf16 optimizer states (optimizer.state_dtype: bf16; m, v bf16 bits, ops_state_bf16):
     * adamw_many with each element's states widened, updated by adamw's fp32 arithmetic and
     * stored rounded; momentum16 is Muon's momentum on n elements, the fp32 form's steps
     * (optim_muon.c: m = mu m; m += gs g; then g = gs g + mu m (nesterov) or g = m, both from
     * the fp32 m) with m stored rounded. One pass each: no fp32 copy of the states. */
    void (*adamw16_many)(const ust_ops *o, float *p, const float *grad, uint16_t *m, uint16_t *v,
                         const ops_segment *seg, int k, float lr, float b1, float b2, float eps,
                         float grad_scale, int64_t t);
    void (*momentum16)(const ust_ops *o, float *g, uint16_t *m, int64_t n, float mu,
                       float grad_scale, int nesterov);

    /* ---- elementwise and reductions ---- */
    void (*add)(const ust_ops *o, act *out, const act *a, const act *b, int64_t n);
    void (*axpy)(const ust_ops *o, float *y, float a, const float *x, int64_t n); /* y += a x */
    void (*scale)(const ust_ops *o, float *x, float s, int64_t n);
    /* x(n) *= s on activations, computed in fp32 and stored in their type (model.embed_scale) */
    void (*scale_act)(const ust_ops *o, act *x, float s, int64_t n);
    double (*sumsq)(const ust_ops *o, const float *x, int64_t n); /* sum x^2, fp64, to host */
    double (*sum)(const ust_ops *o, const float *x, int64_t n);   /* sum x, fp64, to host */

    void (*destroy)(ust_ops *o);

    /* ---- mixture of experts (core/model/moe.c, parallel/ep.c) ----
     * Routing: a token n picks k experts; assignment a = n*k + j is its j-th choice. Rows of the
     * expert buffers are assignments grouped by expert. Index arrays are device int32. */
    /* Per token over E experts (r: the routing options, ops_moe_route; NULL: softmax, norm,
     * no groups, scale 1): probs = softmax(logits) in fp32 and lse its log-sum-exp, or under
     * r->sigmoid probs = sigmoid(logits) and lse = the sum of the token's E scores (lse may be
     * NULL); topk(N,k) the k experts of highest probs + bias (bias(E): the aux-loss-free
     * balancing bias, selection only; NULL: 0) (descending; ties to the lower index), among the
     * experts of the topk_group groups (of n_group, consecutive experts) whose two highest
     * probs + bias sum highest; gate(N,k) their probs (without bias), renormalized to sum 1
     * under r->norm, times r->scale; psum(E) = column sums of probs (sigmoid: of each token's
     * probs over their sum, DeepSeek-V3's normalized affinities) (may be NULL). */
    void (*moe_router_fwd)(const ust_ops *o, float *probs, float *lse, int32_t *topk, float *gate,
                           float *psum, const act *logits, const float *bias, int N, int E, int k,
                           const ops_moe_route *r);
    /* dlogits(N,E) = the scores' backward (softmax, or sigmoid: s (1 - s)) of dprobs, where
     * dprobs = the gates' backward (renormalization and scale) of dgate(N,k) (NULL: 0) +
     * aux_dp[e] for every token (NULL: 0; sigmoid: through the normalized affinities), plus,
     * softmax only, zscale * lse[n] * probs (the gradient of zscale/2 * lse^2). Overwrites. */
    void (*moe_router_bwd)(const ust_ops *o, act *dlogits, const float *dgate, const float *probs,
                           const float *lse, const int32_t *topk, const float *gate,
                           const float *aux_dp, float zscale, int N, int E, int k,
                           const ops_moe_route *r);
    /* out(M,C): row i = inp[src[i] / div] * (scale ? scale[src[i]] : 1). Gathers token rows into
     * expert order (div = k, scale = gate for a gradient) or permutes rows (div = 1). */
    void (*moe_gather)(const ust_ops *o, act *out, const act *inp, const int32_t *src,
                       const float *scale, int M, int C, int div);
    /* out(N,C) (+= when acc) row n = sum_j w * rows[pos[n*k+j]] over j with pos >= 0 (dropped
     * assignments have pos < 0), w = gate[n*k+j] or 1 when gate is NULL. Per token in j order. */
    void (*moe_combine)(const ust_ops *o, act *out, const act *rows, const int32_t *pos,
                        const float *gate, int N, int k, int C, int acc);
    /* dgate(N,k): dgate[a] = dout[a/k] . rows[pos[a]] (0 when pos[a] < 0). Overwrites. */
    void (*moe_gate_grad)(const ust_ops *o, float *dgate, const act *dout, const act *rows,
                          const int32_t *pos, int N, int k, int C);
    /* Grouped linear (the local experts' projections): G problems on consecutive row blocks,
     * group g on rows [r_g, r_g + M[g]) of inp and out (r_g the sum of the earlier M; M host
     * int32, entries may be 0) with its own weights w[g] (OC,C) and bias b[g] (b NULL: none):
     * out_g(M_g,OC) = inp_g @ w[g]^T + b[g]. w and b are host arrays of G device pointers. One
     * grouped GEMM per call: the CPU runs one parallel pass over the groups (each one BLAS call),
     * CUDA one cublasGemmGroupedBatchedEx (fp32; bf16 runs the groups' GEMMs in turn). */
    void (*grouped_linear_fwd)(const ust_ops *o, act *out, const act *inp, const float *const *w,
                               const float *const *b, const int32_t *M, int G, int C, int OC);
    /* Its backward per group: dinp_g = dout_g @ w[g] (+= when acc_dinp; dinp NULL: skipped),
     * dw[g] += dout_g^T @ inp_g, db[g] += column sums of dout_g (db NULL: none). */
    void (*grouped_linear_bwd)(const ust_ops *o, act *dinp, float *const *dw, float *const *db,
                               const act *dout, const act *inp, const float *const *w,
                               const int32_t *M, int G, int C, int OC, int acc_dinp);

    /* ---- attention's largest logit (QK-clip, logging.stats_every's layer_max_logit) ----
     * The largest visible pre-softmax score s_ij of each query head over an attention_fwd call
     * with the same arguments, max-accumulated into mx(H) (device fp32; a NaN score makes its
     * head's NaN; -INFINITY stays where no key is visible). A second pass over the scores rather
     * than a side output of attention_fwd, so the forward keeps one signature and only the
     * steps that track the statistic pay for it. */
    void (*attention_logit_max)(const ust_ops *o, float *mx, const act *q, const act *k, int B,
                                int Tq, int Tk, int H, int Hkv, int D, const int32_t *q_pos,
                                const int32_t *k_pos, int causal, const int32_t *q_start);
};

/* Every function member of ust_ops, in struct order: each backend fills its vtable from this
 * list (`#define FILL(op) o->op = cpu_##op;`) and the profiler wraps every op through it, so an
 * op is added here, in the struct, and in each backend's functions, and a backend that lacks one
 * fails to compile. The struct stays written out because its comments are the ops' contract;
 * core/base/ops.c checks at compile time that the list names as many members as the struct has.
 * (clang-format is off for it: it would stair-step the list.) */
/* clang-format off */
#define UST_OPS_LIST(X)                                                                            \
    X(alloc) X(free) X(host_alloc) X(host_free) X(to_device) X(to_host) X(copy) X(copy2d) X(zero) X(sync) X(stream)           \
    X(memory)                                                                                      \
    X(matmul) X(matmul_batched) X(syrk) X(linear_fwd) X(linear_bwd) X(embedding_fwd) X(embedding_bwd)      \
    X(layernorm_fwd) X(layernorm_bwd) X(rmsnorm_fwd) X(rmsnorm_bwd) X(gelu_fwd) X(gelu_bwd)        \
    X(linear_gelu_fwd) X(linear_gelu_bwd) X(swiglu_fwd) X(swiglu_bwd) X(geglu_fwd) X(geglu_bwd) X(rope_fwd) X(rope_bwd) \
    X(attention_fwd) X(attention_bwd) X(attention_merge) X(xent_fwd_bwd) X(xent_vp_local)          \
    X(xent_vp_finish) X(adamw) X(adamw_many) X(sumsq_many) X(adamw16_many) X(momentum16) X(add) X(axpy) X(scale) X(scale_act) X(sumsq)        \
    X(sum) X(destroy) X(moe_router_fwd) X(moe_router_bwd) X(moe_gather) X(moe_combine)             \
    X(moe_gate_grad) X(grouped_linear_fwd) X(grouped_linear_bwd) X(attention_logit_max)
/* clang-format on */

/* A bf16 optimizer state from fp32, rounded to nearest even (NaN stays NaN, made quiet), and
 * back: the same bits on every backend (the CUDA kernels call these too). */
static inline UST_HOST_DEVICE uint16_t ops_state_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
static inline UST_HOST_DEVICE float ops_state_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Element i of activation tensor p (strchr-style: the result drops const). */
static inline act *act_at(const ust_ops *o, const act *p, int64_t i) {
    return (char *)p + i * o->act_size;
}
/* Bytes of n activation elements. */
static inline size_t act_bytes(const ust_ops *o, int64_t n) { return (size_t)n * o->act_size; }

/* CPU backend only (model.qk_norm_whole under tp, proj_norm.c; CUDA gathers whole rows): RMSNorm
 * of (N, C) column slices of rows Cw wide whose sums the caller adds up over the slices.
 * ops_cpu_rows_sumsq: ss(N) = each row's sum of squares. ops_cpu_rmsnorm_rows_fwd: out = x rstd w,
 * rstd = 1 / sqrt(ss / Cw + eps), w this slice's C weights. ops_cpu_rows_wdot: dot(N) = each
 * row's sum of w dout x. ops_cpu_rmsnorm_rows_bwd: dinp (NULL: none; may be dout) = rstd (w dout
 * - x rstd^2 dot / Cw), dw (NULL: none) += sum over rows of dout x rstd. */
void ops_cpu_rows_sumsq(float *ss, const act *inp, int N, int C);
void ops_cpu_rmsnorm_rows_fwd(act *out, float *rstd, const act *inp, const float *w,
                              const float *ss, int N, int C, int Cw, float eps);
void ops_cpu_rows_wdot(float *dot, const act *dout, const act *inp, const float *w, int N, int C);
void ops_cpu_rmsnorm_rows_bwd(act *dinp, float *dw, const act *dout, const act *inp, const float *w,
                              const float *rstd, const float *dot, int N, int C, int Cw);

/* The backend a run asks for: CPU (train.threads threads shared by local_world ranks of the
 * node, see ops_cpu_create), or for run.device cuda the CUDA backend on GPU local_rank %
 * (visible devices) with bf16 activations under train.precision bf16. NULL with a message in e
 * when the GPU backend is unavailable (no device or driver, or a build without CUDA). */
ust_ops *ops_create(const ust_config *cfg, int local_rank, int local_world, ust_err *e);

/* CPU backend: OpenBLAS + OpenMP with `threads` threads (<= 0: cores / local ranks, capped by
 * OMP_NUM_THREADS when that is set). */
ust_ops *ops_cpu_create(int threads, int local_ranks);
/* The OpenMP spin count (GOMP_SPINCOUNT, read by libgomp when it loads) for local_ranks ranks
 * of this node with the default thread count: 0 (sleep at once) when their threads outnumber
 * the cores, else a short spin. */
long long ops_cpu_spin_count(int local_ranks);

/* Measured single-precision GEMM rate of this backend (FLOP/s, the fastest of `reps` n^3
 * products after a warm-up), for MFU on CPU. */
double ops_measure_sgemm_flops(const ust_ops *o, int n, int reps);

#endif
