/* attention_max: ops.h's attention_logit_max on the GPU, the largest visible pre-softmax score
 * of each query head (QK-clip's statistic and logging.stats_every's layer_max_logit). A second
 * pass over the scores, as on the CPU: a block per (b, h, 64-query tile), one query per thread,
 * 16-key tiles of K in shared memory; each score is the CPU's sum over d in order, then times
 * 1/sqrt(D), masked by the same rules (causal positions, documents); a block's maximum goes to
 * scratch and one thread per head folds them into mx. Max is exact, so the result does not
 * depend on the order; a NaN score wins every comparison (max_nan), as on the CPU. */
#include "cuda_internal.h"

#include <limits.h>
#include <math.h>

#define LM_Q 64 /* queries per block: one per thread */
#define LM_K 16 /* keys per shared-memory tile */

template <typename T>
__global__ void __launch_bounds__(LM_Q)
    k_att_logit_max(float *part, const act *q_, const act *k_, int Tq, int Tk, int H, int Hkv,
                    int D, const int32_t *q_pos, const int32_t *k_pos, int causal,
                    const int32_t *q_start, float scale, int nqt) {
    extern __shared__ float sm[];
    float *Ks = sm; /* LM_K x D */
    __shared__ int kpos_s[LM_K];
    __shared__ float red[32];
    const T *q = (const T *)q_, *k = (const T *)k_;
    const int it = blockIdx.x % nqt, h = blockIdx.x / nqt % H, b = blockIdx.x / nqt / H;
    const int hk = h / (H / Hkv), i = it * LM_Q + threadIdx.x, in = i < Tq;
    const int qp = in ? posof(q_pos, i) : INT_MIN, qs = doc_start(q_start, b, Tq, i);
    int qmax = INT_MIN; /* the tile's latest query: key tiles after it are skipped (causal) */
    for (int t = it * LM_Q; t < Tq && t < (it + 1) * LM_Q; t++) qmax = max(qmax, posof(q_pos, t));
    const T *qi = q + (((int64_t)b * Tq + (in ? i : 0)) * H + h) * D;
    float best = -INFINITY;
    for (int j0 = 0; j0 < Tk; j0 += LM_K) {
        __syncthreads(); /* the previous tile is no longer read */
        if (threadIdx.x < LM_K)
            kpos_s[threadIdx.x] = j0 + threadIdx.x < Tk ? posof(k_pos, j0 + threadIdx.x) : INT_MAX;
        __syncthreads();
        if (causal) {
            int kmin = INT_MAX;
            for (int jj = 0; jj < LM_K; jj++) kmin = min(kmin, kpos_s[jj]);
            if (kmin > qmax) continue; /* the same decision in every thread */
        }
        for (int x = threadIdx.x; x < LM_K * D; x += blockDim.x) {
            int jj = x / D, d = x % D, j = j0 + jj;
            Ks[x] = j < Tk ? ld_act(k, (((int64_t)b * Tk + j) * Hkv + hk) * D + d) : 0.0f;
        }
        __syncthreads();
        float s[LM_K];
#pragma unroll
        for (int jj = 0; jj < LM_K; jj++) s[jj] = 0.0f;
        for (int d = 0; in && d < D; d++) {
            float qd = ld_act(qi, d);
#pragma unroll
            for (int jj = 0; jj < LM_K; jj++) s[jj] += qd * Ks[jj * D + d];
        }
#pragma unroll
        for (int jj = 0; jj < LM_K; jj++) {
            int kp = kpos_s[jj];
            if (in && j0 + jj < Tk && !(causal && kp > qp) && kp >= qs)
                best = max_nan(s[jj] * scale, best);
        }
    }
    best = block_max(best, red);
    if (threadIdx.x == 0) part[blockIdx.x] = best;
}

/* mx[h] = max(mx[h], every tile's maximum of head h), one thread per head. */
__global__ void k_att_logit_fold(float *mx, const float *part, int B, int H, int nqt) {
    int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= H) return;
    float m = mx[h];
    for (int b = 0; b < B; b++)
        for (int it = 0; it < nqt; it++) m = max_nan(part[((int64_t)b * H + h) * nqt + it], m);
    mx[h] = m;
}

void cuda_attention_logit_max(const ust_ops *o, float *mx, const act *q, const act *k, int B,
                              int Tq, int Tk, int H, int Hkv, int D, const int32_t *q_pos,
                              const int32_t *k_pos, int causal, const int32_t *q_start) {
    UST_ASSERT(H > 0 && Hkv > 0 && H % Hkv == 0 && D > 0 && D <= 256,
               "attention logit max: H %d, Hkv %d, D %d (H a multiple of Hkv, D <= 256)", H, Hkv,
               D);
    if (B <= 0 || Tq <= 0 || Tk <= 0) return;
    int nqt = (Tq + LM_Q - 1) / LM_Q;
    int64_t blocks = (int64_t)B * H * nqt;
    float *part = (float *)cuda_scratch(o, SCR_C, (size_t)blocks * sizeof(float));
    size_t smem = (size_t)LM_K * D * sizeof(float); /* 16 KiB at D 256 */
    ACT_LAUNCH(o, k_att_logit_max, (unsigned)blocks, LM_Q, smem, part, q, k, Tq, Tk, H, Hkv, D,
               q_pos, k_pos, causal, q_start, 1.0f / sqrtf((float)D), nqt);
    k_att_logit_fold<<<(H + 127) / 128, 128, 0, STREAM(o)>>>(mx, part, B, H, nqt);
    CK_LAUNCH();
}
