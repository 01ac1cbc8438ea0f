/* attention: flash-style attention forward/backward and the merge of partial results, on the GPU.
 * Same contract as ops.h (and the CPU backend): q(B,Tq,H,D), k,v(B,Tk,Hkv,D), out(B,Tq,H,D),
 * lse(B,H,Tq); causal visibility by global positions k_pos[j] <= q_pos[i], documents by
 * k_pos[j] >= q_start[b, i] (tiles are skipped for causality only); GQA; a query that
 * sees no key gets out = 0, lse = -inf; backward accumulates into dq, dk, dv.
 * Three implementations, chosen at the bottom of this file (UST_CUDA_ATTENTION, ATT_*): under
 * bf16 the tensor-core kernels of attention_tc.cu where they have the head dim; otherwise the
 * products as cuBLAS GEMMs over chunks of materialized scores (below the flash kernels);
 * UST_CUDA_ATTENTION=flash selects the tiled CUDA-core kernels that come first here.
 *
 * Flash tiling (correctness first, one straightforward scheme for every D <= 256):
 * - Key tiles of 32 keys live in shared memory (rows padded to D+1 floats so that lane j
 *   reading row j is free of bank conflicts). Lane j of a warp owns key j of the tile for the
 *   scores; lanes own dimensions d = lane + 32e for the outputs, and probabilities reach them by
 *   warp shuffles.
 * - Forward and dq: one block per (b, h, 16-query tile), 4 warps x 4 queries, online softmax
 *   (running max m, per-lane partial sums l, accumulators rescaled when m grows).
 * - dk/dv: one warp per (b, kv head, 32-key tile), walking every query of every head of its
 *   group; accumulators for its 32 keys in shared memory. Each output element is written by one
 *   thread in a fixed order: no atomics, deterministic, like the CPU backend's two passes.
 * A key tile whose smallest position is after every query of the tile is skipped (causal). */
#include "cuda_internal.h"

#include <limits.h>
#include <math.h>

#define KB 32         /* keys per tile = warp size */
#define QPW 4         /* queries per warp */
#define NW 4          /* warps per block (forward, dq) */
#define QT (QPW * NW) /* queries per block */
#define QTB 16        /* queries per shared-memory load in the dk/dv kernel */

/* ---------------------------------------------------------------- forward */

/* At least one block per SM: with the default ptxas spilled 8-28 bytes at DPL = 4 and 8 (sm_90,
 * test/sh/cuda_resources.sh); it takes 116-147 registers now. */
template <int DPL> /* dimensions per lane: ceil(D / 32) rounded up to 1, 2, 4, 8 */
__global__ void __launch_bounds__(NW * 32, 1)
    k_att_fwd(float *out, float *lse, const float *q, const float *k, const float *v, int Tq,
              int Tk, int H, int Hkv, int D, const int32_t *q_pos, const int32_t *k_pos, int causal,
              const int32_t *q_start, float scale, int nqt) {
    extern __shared__ float sm[];
    __shared__ int kpos_s[KB];
    const int DP = D + 1;
    float *Ks = sm, *Vs = Ks + KB * DP, *Qs = Vs + KB * DP;
    const int it = blockIdx.x % nqt, h = blockIdx.x / nqt % H, b = blockIdx.x / nqt / H;
    const int hk = h / (H / Hkv), lane = threadIdx.x & 31, w = threadIdx.x >> 5, i0 = it * QT;

    for (int x = threadIdx.x; x < QT * D; x += blockDim.x) {
        int t = x / D, d = x % D;
        Qs[x] = i0 + t < Tq ? q[(((int64_t)b * Tq + i0 + t) * H + h) * D + d] : 0.0f;
    }
    int qmax = INT_MIN, qp[QPW], qs[QPW];
    for (int t = 0; t < QT; t++)
        if (i0 + t < Tq) qmax = max(qmax, posof(q_pos, i0 + t));
    float acc[QPW][DPL], m[QPW], l[QPW];
#pragma unroll
    for (int qq = 0; qq < QPW; qq++) {
        int i = i0 + w * QPW + qq;
        qp[qq] = i < Tq ? posof(q_pos, i) : INT_MIN;
        qs[qq] = doc_start(q_start, b, Tq, i);
        m[qq] = -INFINITY;
        l[qq] = 0.0f;
#pragma unroll
        for (int e = 0; e < DPL; e++) acc[qq][e] = 0.0f;
    }

    for (int j0 = 0; j0 < Tk; j0 += KB) {
        __syncthreads(); /* the previous tile is no longer read */
        if (threadIdx.x < KB)
            kpos_s[threadIdx.x] = j0 + threadIdx.x < Tk ? posof(k_pos, j0 + threadIdx.x) : INT_MAX;
        __syncthreads();
        if (causal) {
            int kmin = INT_MAX;
            for (int jj = 0; jj < KB; jj++) kmin = min(kmin, kpos_s[jj]);
            if (kmin > qmax) continue; /* the same decision in every thread */
        }
        for (int x = threadIdx.x; x < KB * D; x += blockDim.x) {
            int jj = x / D, d = x % D, j = j0 + jj;
            float kv = 0.0f, vv = 0.0f;
            if (j < Tk) {
                int64_t off = (((int64_t)b * Tk + j) * Hkv + hk) * D + d;
                kv = k[off];
                vv = v[off];
            }
            Ks[jj * DP + d] = kv;
            Vs[jj * DP + d] = vv;
        }
        __syncthreads();

        const int kin = j0 + lane < Tk, kp = kpos_s[lane];
        float s[QPW];
#pragma unroll
        for (int qq = 0; qq < QPW; qq++) s[qq] = 0.0f;
        for (int d = 0; d < D; d++) {
            float kd = Ks[lane * DP + d];
#pragma unroll
            for (int qq = 0; qq < QPW; qq++) s[qq] += Qs[(w * QPW + qq) * D + d] * kd;
        }
#pragma unroll
        for (int qq = 0; qq < QPW; qq++) {
            if (i0 + w * QPW + qq >= Tq) continue; /* warp-uniform */
            int vis = kin && !(causal && kp > qp[qq]) && kp >= qs[qq];
            float sc = vis ? s[qq] * scale : -INFINITY;
            float bm = warp_max(sc);
            if (bm == -INFINITY) continue; /* nothing visible in this tile */
            if (bm > m[qq]) {
                float c = expf(m[qq] - bm); /* 0 on the first visible tile (acc = l = 0) */
                l[qq] *= c;
#pragma unroll
                for (int e = 0; e < DPL; e++) acc[qq][e] *= c;
                m[qq] = bm;
            }
            float p = expf(sc - m[qq]); /* 0 where masked */
            l[qq] += p;
            for (int jj = 0; jj < KB; jj++) {
                float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
                for (int e = 0; e < DPL; e++) {
                    int d = lane + 32 * e;
                    if (d < D) acc[qq][e] += pj * Vs[jj * DP + d];
                }
            }
        }
    }

#pragma unroll
    for (int qq = 0; qq < QPW; qq++) {
        int i = i0 + w * QPW + qq;
        if (i >= Tq) continue;
        float L = warp_sum(l[qq]);
        float *oi = out + (((int64_t)b * Tq + i) * H + h) * D;
        float inv = L != 0.0f ? 1.0f / L : 0.0f; /* a NaN sum stays NaN */
#pragma unroll
        for (int e = 0; e < DPL; e++) {
            int d = lane + 32 * e;
            if (d < D) oi[d] = acc[qq][e] * inv;
        }
        if (lane == 0) lse[((int64_t)b * H + h) * Tq + i] = L != 0.0f ? m[qq] + logf(L) : -INFINITY;
    }
}

/* ---------------------------------------------------------------- backward */

/* Di[b,h,i] = dout_i . out_i, one warp per (b, i, h) row. */
template <typename T>
__global__ void k_att_dot(float *Di, const act *dout, const act *out, int Tq, int H, int D,
                          int64_t rows) {
    int lane = threadIdx.x & 31;
    int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; r < rows; r += nwarps) {
        const T *a = (const T *)dout + r * D, *c = (const T *)out + r * D;
        float s = 0.0f;
        for (int d = lane; d < D; d += 32) s += ld_act(a, d) * ld_act(c, d);
        s = warp_sum(s);
        int h = (int)(r % H), i = (int)(r / H % Tq);
        int64_t b = r / H / Tq;
        if (lane == 0) Di[(b * H + h) * Tq + i] = s;
    }
}

/* dq_i += scale sum_j ds_ij k_j with p_ij = exp(s_ij - lse_i), ds_ij = p_ij (dout_i . v_j - Di).
 * Same geometry as the forward. */
template <int DPL>
__global__ void __launch_bounds__(NW * 32)
    k_att_dq(float *dq, const float *dout, const float *lse, const float *Di, const float *q,
             const float *k, const float *v, int Tq, int Tk, int H, int Hkv, int D,
             const int32_t *q_pos, const int32_t *k_pos, int causal, const int32_t *q_start,
             float scale, int nqt) {
    extern __shared__ float sm[];
    __shared__ int kpos_s[KB];
    const int DP = D + 1;
    float *Ks = sm, *Vs = Ks + KB * DP, *Qs = Vs + KB * DP, *Os = Qs + QT * D;
    const int it = blockIdx.x % nqt, h = blockIdx.x / nqt % H, b = blockIdx.x / nqt / H;
    const int hk = h / (H / Hkv), lane = threadIdx.x & 31, w = threadIdx.x >> 5, i0 = it * QT;

    for (int x = threadIdx.x; x < QT * D; x += blockDim.x) {
        int t = x / D, d = x % D;
        int64_t off = (((int64_t)b * Tq + i0 + t) * H + h) * D + d;
        Qs[x] = i0 + t < Tq ? q[off] : 0.0f;
        Os[x] = i0 + t < Tq ? dout[off] : 0.0f;
    }
    int qmax = INT_MIN, qp[QPW], qs[QPW];
    float L[QPW], Dv[QPW], acc[QPW][DPL];
    for (int t = 0; t < QT; t++)
        if (i0 + t < Tq) qmax = max(qmax, posof(q_pos, i0 + t));
#pragma unroll
    for (int qq = 0; qq < QPW; qq++) {
        int i = i0 + w * QPW + qq;
        qp[qq] = i < Tq ? posof(q_pos, i) : INT_MIN;
        qs[qq] = doc_start(q_start, b, Tq, i);
        L[qq] = i < Tq ? lse[((int64_t)b * H + h) * Tq + i] : -INFINITY;
        Dv[qq] = i < Tq ? Di[((int64_t)b * H + h) * Tq + i] : 0.0f;
#pragma unroll
        for (int e = 0; e < DPL; e++) acc[qq][e] = 0.0f;
    }

    for (int j0 = 0; j0 < Tk; j0 += KB) {
        __syncthreads();
        if (threadIdx.x < KB)
            kpos_s[threadIdx.x] = j0 + threadIdx.x < Tk ? posof(k_pos, j0 + threadIdx.x) : INT_MAX;
        __syncthreads();
        if (causal) {
            int kmin = INT_MAX;
            for (int jj = 0; jj < KB; jj++) kmin = min(kmin, kpos_s[jj]);
            if (kmin > qmax) continue;
        }
        for (int x = threadIdx.x; x < KB * D; x += blockDim.x) {
            int jj = x / D, d = x % D, j = j0 + jj;
            float kv = 0.0f, vv = 0.0f;
            if (j < Tk) {
                int64_t off = (((int64_t)b * Tk + j) * Hkv + hk) * D + d;
                kv = k[off];
                vv = v[off];
            }
            Ks[jj * DP + d] = kv;
            Vs[jj * DP + d] = vv;
        }
        __syncthreads();

        const int kin = j0 + lane < Tk, kp = kpos_s[lane];
        float s[QPW], dp[QPW];
#pragma unroll
        for (int qq = 0; qq < QPW; qq++) s[qq] = dp[qq] = 0.0f;
        for (int d = 0; d < D; d++) {
            float kd = Ks[lane * DP + d], vd = Vs[lane * DP + d];
#pragma unroll
            for (int qq = 0; qq < QPW; qq++) {
                s[qq] += Qs[(w * QPW + qq) * D + d] * kd;
                dp[qq] += Os[(w * QPW + qq) * D + d] * vd;
            }
        }
#pragma unroll
        for (int qq = 0; qq < QPW; qq++) {
            if (L[qq] == -INFINITY) continue; /* padding query, or one that sees no key */
            int vis = kin && !(causal && kp > qp[qq]) && kp >= qs[qq];
            float p = vis ? expf(s[qq] * scale - L[qq]) : 0.0f;
            float ds = p * (dp[qq] - Dv[qq]);
            for (int jj = 0; jj < KB; jj++) {
                float dsj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
                for (int e = 0; e < DPL; e++) {
                    int d = lane + 32 * e;
                    if (d < D) acc[qq][e] += dsj * Ks[jj * DP + d];
                }
            }
        }
    }

#pragma unroll
    for (int qq = 0; qq < QPW; qq++) {
        int i = i0 + w * QPW + qq;
        if (i >= Tq) continue;
        float *dqi = dq + (((int64_t)b * Tq + i) * H + h) * D;
#pragma unroll
        for (int e = 0; e < DPL; e++) {
            int d = lane + 32 * e;
            if (d < D) dqi[d] += acc[qq][e] * scale;
        }
    }
}

/* dv_j += sum_i p_ij dout_i, dk_j += scale sum_i ds_ij q_i: one warp per (b, kv head, 32 keys),
 * lane j owning key j; accumulators in shared memory rows padded to D+1. */
__global__ void __launch_bounds__(32)
    k_att_dkdv(float *dk, float *dv, const float *dout, const float *lse, const float *Di,
               const float *q, const float *k, const float *v, int Tq, int Tk, int H, int Hkv,
               int D, const int32_t *q_pos, const int32_t *k_pos, int causal,
               const int32_t *q_start, float scale, int nkb) {
    extern __shared__ float sm[];
    __shared__ float Ls[QTB], Ds[QTB];
    __shared__ int qps[QTB], qss[QTB];
    const int DP = D + 1;
    float *Ks = sm, *Vs = Ks + KB * DP, *dKs = Vs + KB * DP, *dVs = dKs + KB * DP;
    float *Qs = dVs + KB * DP, *Os = Qs + QTB * D;
    const int jb = blockIdx.x % nkb, hk = blockIdx.x / nkb % Hkv, b = blockIdx.x / nkb / Hkv;
    const int G = H / Hkv, lane = threadIdx.x, j0 = jb * KB, j = j0 + lane, kin = j < Tk;
    const int kp = kin ? posof(k_pos, j) : INT_MAX;

    for (int x = lane; x < KB * D; x += 32) {
        int jj = x / D, d = x % D;
        float kv = 0.0f, vv = 0.0f;
        if (j0 + jj < Tk) {
            int64_t off = (((int64_t)b * Tk + j0 + jj) * Hkv + hk) * D + d;
            kv = k[off];
            vv = v[off];
        }
        Ks[jj * DP + d] = kv;
        Vs[jj * DP + d] = vv;
        dKs[jj * DP + d] = 0.0f;
        dVs[jj * DP + d] = 0.0f;
    }
    int kmin = kp;
    for (int off = 16; off > 0; off >>= 1)
        kmin = min(kmin, __shfl_xor_sync(0xffffffffu, kmin, off));

    for (int h = hk * G; h < (hk + 1) * G; h++) {
        for (int i0 = 0; i0 < Tq; i0 += QTB) {
            int qpl = (lane < QTB && i0 + lane < Tq) ? posof(q_pos, i0 + lane) : INT_MIN;
            int qmax = qpl;
            for (int off = 16; off > 0; off >>= 1)
                qmax = max(qmax, __shfl_xor_sync(0xffffffffu, qmax, off));
            if (causal && qmax < kmin) continue; /* no query of this tile sees these keys */
            __syncwarp();
            for (int x = lane; x < QTB * D; x += 32) {
                int t = x / D, d = x % D;
                int64_t off = (((int64_t)b * Tq + i0 + t) * H + h) * D + d;
                Qs[x] = i0 + t < Tq ? q[off] : 0.0f;
                Os[x] = i0 + t < Tq ? dout[off] : 0.0f;
            }
            if (lane < QTB) {
                int i = i0 + lane;
                Ls[lane] = i < Tq ? lse[((int64_t)b * H + h) * Tq + i] : -INFINITY;
                Ds[lane] = i < Tq ? Di[((int64_t)b * H + h) * Tq + i] : 0.0f;
                qps[lane] = qpl;
                qss[lane] = doc_start(q_start, b, Tq, i);
            }
            __syncwarp();
            for (int t = 0; t < QTB; t++) {
                float Lt = Ls[t];
                int qp = qps[t];
                if (Lt == -INFINITY || (causal && qp < kmin)) continue; /* warp-uniform */
                const float *qt = Qs + t * D, *ot = Os + t * D;
                float s = 0.0f, dp = 0.0f;
                for (int d = 0; d < D; d++) {
                    s += qt[d] * Ks[lane * DP + d];
                    dp += ot[d] * Vs[lane * DP + d];
                }
                int vis = kin && !(causal && kp > qp) && kp >= qss[t];
                float p = vis ? expf(s * scale - Lt) : 0.0f;
                float ds = p * (dp - Ds[t]);
                for (int d = 0; d < D; d++) {
                    dVs[lane * DP + d] += p * ot[d];
                    dKs[lane * DP + d] += ds * qt[d];
                }
            }
        }
    }
    __syncwarp();
    for (int x = lane; x < KB * D; x += 32) {
        int jj = x / D, d = x % D;
        if (j0 + jj >= Tk) continue;
        int64_t off = (((int64_t)b * Tk + j0 + jj) * Hkv + hk) * D + d;
        if (dk) dk[off] += dKs[jj * DP + d] * scale;
        if (dv) dv[off] += dVs[jj * DP + d];
    }
}

/* ---------------------------------------------------------------- merge */

/* One warp per (b, h, t) row of lse: lse = logaddexp(l1, l2), out = w1 out + w2 out2. Every lane
 * reads lse before lane 0 rewrites it. */
template <typename S>
__global__ void k_att_merge(act *out, float *lse, const act *out2, const float *lse2, int T, int H,
                            int D, int64_t rows) {
    int lane = threadIdx.x & 31;
    int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; r < rows; r += nwarps) {
        int t = (int)(r % T), h = (int)(r / T % H);
        int64_t b = r / ((int64_t)T * H);
        float l1 = lse[r], l2 = lse2[r];
        __syncwarp();
        if (l2 == -INFINITY) continue; /* the other side saw no key: nothing changes */
        S *o1 = (S *)out + ((b * T + t) * H + h) * D;
        const S *o2 = (const S *)out2 + ((b * T + t) * H + h) * D;
        if (l1 == -INFINITY) {
            for (int d = lane; d < D; d += 32) o1[d] = o2[d];
            if (lane == 0) lse[r] = l2;
            continue;
        }
        float mx = fmaxf(l1, l2), mn = fminf(l1, l2);
        float l = mx + log1pf(expf(mn - mx));
        float w1 = expf(l1 - l), w2 = expf(l2 - l);
        for (int d = lane; d < D; d += 32) st_act(o1, d, w1 * ld_act(o1, d) + w2 * ld_act(o2, d));
        if (lane == 0) lse[r] = l;
    }
}

/* ---------------------------------------------------------------- launchers */

const float *cuda_attention_dot(const ust_ops *o, const act *dout, const act *out, int B, int Tq,
                                int H, int D) {
    int64_t rows = (int64_t)B * Tq * H;
    float *Di = (float *)cuda_scratch(o, SCR_C, (size_t)(rows > 0 ? rows : 1) * sizeof(float));
    if (rows > 0)
        ACT_LAUNCH(o, k_att_dot, grid_for(rows * 32, 256), 256, 0, Di, dout, out, Tq, H, D, rows);
    return Di;
}

/* The same for the fp32 paths, whose dout and out are fp32 whatever the activations' type. */
static const float *attention_dot_f32(const ust_ops *o, const float *dout, const float *out, int B,
                                      int Tq, int H, int D) {
    int64_t rows = (int64_t)B * Tq * H;
    float *Di = (float *)cuda_scratch(o, SCR_C, (size_t)(rows > 0 ? rows : 1) * sizeof(float));
    if (rows > 0) {
        k_att_dot<float>
            <<<grid_for(rows * 32, 256), 256, 0, STREAM(o)>>>(Di, dout, out, Tq, H, D, rows);
        CK_LAUNCH();
    }
    return Di;
}

static int dims_per_lane(int D) { return D <= 32 ? 1 : D <= 64 ? 2 : D <= 128 ? 4 : 8; }

static void check_shapes(int H, int Hkv, int D) {
    UST_ASSERT(Hkv > 0 && H % Hkv == 0 && D > 0 && D <= 256,
               "H=%d must be a multiple of Hkv=%d, and 0 < D=%d <= 256", H, Hkv, D);
}

static void flash_attention_fwd(const ust_ops *o, float *out, float *lse, const float *q,
                                const float *k, const float *v, int B, int Tq, int Tk, int H,
                                int Hkv, int D, const int32_t *q_pos, const int32_t *k_pos,
                                int causal, const int32_t *q_start) {
    check_shapes(H, Hkv, D);
    if (B <= 0 || Tq <= 0 || H <= 0) return;
    int nqt = (Tq + QT - 1) / QT;
    int64_t blocks = (int64_t)B * H * nqt;
    UST_ASSERT(blocks < INT_MAX, "attention grid too large (%lld blocks)", (long long)blocks);
    size_t smem = (size_t)(2 * KB * (D + 1) + QT * D) * sizeof(float);
    float scale = 1.0f / sqrtf((float)D);
    cudaStream_t s = STREAM(o);
#define FWD(DPL)                                                                                   \
    cuda_smem_optin(o, k_att_fwd<DPL>, smem);                                                      \
    k_att_fwd<DPL><<<(int)blocks, NW * 32, smem, s>>>(out, lse, q, k, v, Tq, Tk, H, Hkv, D, q_pos, \
                                                      k_pos, causal, q_start, scale, nqt);         \
    break;
    switch (dims_per_lane(D)) {
    case 1:
        FWD(1)
    case 2:
        FWD(2)
    case 4:
        FWD(4)
    default:
        FWD(8)
    }
#undef FWD
    CK_LAUNCH();
}

static void flash_attention_bwd(const ust_ops *o, float *dq, float *dk, float *dv,
                                const float *dout, const float *out, const float *lse,
                                const float *q, const float *k, const float *v, int B, int Tq,
                                int Tk, int H, int Hkv, int D, const int32_t *q_pos,
                                const int32_t *k_pos, int causal, const int32_t *q_start) {
    check_shapes(H, Hkv, D);
    if (B <= 0 || Tq <= 0 || Tk <= 0 || H <= 0 || (!dq && !dk && !dv)) return;
    cudaStream_t s = STREAM(o);
    float scale = 1.0f / sqrtf((float)D);
    const float *Di = attention_dot_f32(o, dout, out, B, Tq, H, D);
    if (dq) {
        int nqt = (Tq + QT - 1) / QT;
        int64_t blocks = (int64_t)B * H * nqt;
        UST_ASSERT(blocks < INT_MAX, "attention grid too large (%lld blocks)", (long long)blocks);
        size_t smem = (size_t)(2 * KB * (D + 1) + 2 * QT * D) * sizeof(float);
#define DQ(DPL)                                                                                    \
    cuda_smem_optin(o, k_att_dq<DPL>, smem);                                                       \
    k_att_dq<DPL><<<(int)blocks, NW * 32, smem, s>>>(                                              \
        dq, dout, lse, Di, q, k, v, Tq, Tk, H, Hkv, D, q_pos, k_pos, causal, q_start, scale, nqt); \
    break;
        switch (dims_per_lane(D)) {
        case 1:
            DQ(1)
        case 2:
            DQ(2)
        case 4:
            DQ(4)
        default:
            DQ(8)
        }
#undef DQ
        CK_LAUNCH();
    }
    if (dk || dv) {
        int nkb = (Tk + KB - 1) / KB;
        int64_t blocks = (int64_t)B * Hkv * nkb;
        UST_ASSERT(blocks < INT_MAX, "attention grid too large (%lld blocks)", (long long)blocks);
        size_t smem = (size_t)(4 * KB * (D + 1) + 2 * QTB * D) * sizeof(float);
        cuda_smem_optin(o, k_att_dkdv, smem);
        k_att_dkdv<<<(int)blocks, 32, smem, s>>>(dk, dv, dout, lse, Di, q, k, v, Tq, Tk, H, Hkv, D,
                                                 q_pos, k_pos, causal, q_start, scale, nkb);
        CK_LAUNCH();
    }
}

/* ---------------------------------------------------------------- attention through GEMMs */

/* The default path: for a chunk of queries of one batch element the scores are materialized,
 * S = scale Q K^T (heads x queries x keys, fp32), turned into probabilities in place by a row
 * kernel, and multiplied by V; backward recomputes S and P the same way and runs the five GEMMs
 * of the attention gradient, accumulating into dq, dk, dv with beta = 1. The GEMMs go to cuBLAS
 * (tensor cores with bf16 on), which is far faster than the CUDA-core flash kernels above; the
 * price is a scratch of chunk x Tk floats per head (chunks are sized to ATT_SCRATCH_BYTES) and the
 * masked half of a causal S computed anyway. Without GQA all heads of a chunk go in one batched
 * GEMM; with GQA each head is its own GEMM (and the heads of a group add into the same dk/dv in
 * order). Deterministic: no atomics. */
#define ATT_SCRATCH_BYTES ((int64_t)256 << 20)

/* Row r of a chunk is head h0 + r / n, query i0 + r % n. In place, s -> p: forward computes
 * lse = log sum_visible exp(s) and p = exp(s - max) / sum; backward takes the final lse and
 * p = exp(s - lse). Masked keys (and every key of a row that sees none) get p = 0. cap > 0
 * (model.attn_softcap): s is first soft-capped to cap tanh(s / cap), as the CPU backend's
 * block_scores (each thread caps the scores it alone reads after). */
template <int FWD>
__global__ void k_att_probs(float *S, float *lse, const int32_t *q_pos, const int32_t *k_pos,
                            int causal, const int32_t *q_start, int Tq, int Tk, int H, int b,
                            int h0, int i0, int n, float cap) {
    __shared__ float sh[32];
    int r = blockIdx.x, h = h0 + r / n, i = i0 + r % n;
    float *s = S + (int64_t)r * Tk;
    for (int j = threadIdx.x; cap > 0 && j < Tk; j += blockDim.x) s[j] = cap * tanhf(s[j] / cap);
    float *L = lse + ((int64_t)b * H + h) * Tq + i;
    int qp = posof(q_pos, i), qs = doc_start(q_start, b, Tq, i);
#define HIDDEN(j) ((causal && posof(k_pos, j) > qp) || posof(k_pos, j) < qs)
    if (FWD) {
        float mx = -INFINITY;
        for (int j = threadIdx.x; j < Tk; j += blockDim.x)
            if (!HIDDEN(j)) mx = max_nan(mx, s[j]);
        mx = block_max(mx, sh);
        if (mx == -INFINITY) { /* the query sees no key */
            for (int j = threadIdx.x; j < Tk; j += blockDim.x) s[j] = 0.0f;
            if (threadIdx.x == 0) *L = -INFINITY;
            return;
        }
        float sum = 0.0f;
        for (int j = threadIdx.x; j < Tk; j += blockDim.x)
            if (!HIDDEN(j)) sum += expf(s[j] - mx);
        sum = block_sum(sum, sh);
        float inv = 1.0f / sum;
        for (int j = threadIdx.x; j < Tk; j += blockDim.x)
            s[j] = HIDDEN(j) ? 0.0f : expf(s[j] - mx) * inv;
        if (threadIdx.x == 0) *L = mx + logf(sum);
    } else {
        float l = *L;
        for (int j = threadIdx.x; j < Tk; j += blockDim.x)
            s[j] = (l == -INFINITY || HIDDEN(j)) ? 0.0f : expf(s[j] - l);
    }
#undef HIDDEN
}

/* dS = P (dP - Di) in place over dP; row r as in k_att_probs. Under a soft-cap (cap > 0) dS is
 * the raw score's, times 1 - (s / cap)^2 of the capped score s = lse + log P (P > 0; where P is
 * 0 so is dS), which saves keeping the capped scores beside P. */
__global__ void k_att_ds(float *dP, const float *P, const float *Di, const float *lse, int Tq,
                         int Tk, int H, int b, int h0, int i0, int n, int64_t total, float cap) {
    for (int64_t x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; x < total;
         x += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = x / Tk, row = ((int64_t)b * H + h0 + (int)(r / n)) * Tq + i0 + (int)(r % n);
        float p = P[x], ds = p * (dP[x] - Di[row]);
        if (cap > 0 && p > 0) {
            float t = (lse[row] + logf(p)) / cap;
            ds *= 1.0f - t * t;
        }
        dP[x] = ds;
    }
}

/* Queries per chunk so that one (heads x chunk x Tk) buffer stays within ATT_SCRATCH_BYTES. */
static int att_chunk(const ust_ops *o, int Tq, int nb, int Tk) {
    int64_t per_row = (int64_t)nb * (Tk > 0 ? Tk : 1) * (int64_t)sizeof(float);
    int64_t qc =
        CUDA_IMPL(o)->attn_chunk > 0 ? CUDA_IMPL(o)->attn_chunk : ATT_SCRATCH_BYTES / per_row;
    return (int)(qc < 1 ? 1 : qc > Tq ? Tq : qc);
}

static void gemm_attention_fwd(const ust_ops *o, float *out, float *lse, const float *q,
                               const float *k, const float *v, int B, int Tq, int Tk, int H,
                               int Hkv, int D, const int32_t *q_pos, const int32_t *k_pos,
                               int causal, const int32_t *q_start, float cap) {
    const int G = H / Hkv, nb = G == 1 ? H : 1, qc = att_chunk(o, Tq, nb, Tk);
    const float scale = 1.0f / sqrtf((float)D);
    const int64_t qs = (int64_t)H * D, ks = (int64_t)Hkv * D;
    float *S = (float *)cuda_scratch(o, SCR_S, (size_t)nb * qc * (Tk > 0 ? Tk : 1) * sizeof(float));
    for (int b = 0; b < B; b++)
        for (int i0 = 0; i0 < Tq; i0 += qc) {
            int n = Tq - i0 < qc ? Tq - i0 : qc;
            for (int h0 = 0; h0 < H; h0 += nb) {
                int hk = h0 / G;
                const float *qb = q + ((int64_t)b * Tq + i0) * qs + (int64_t)h0 * D;
                const float *kb = k + (int64_t)b * Tk * ks + (int64_t)hk * D;
                const float *vb = v + (int64_t)b * Tk * ks + (int64_t)hk * D;
                float *ob = out + ((int64_t)b * Tq + i0) * qs + (int64_t)h0 * D;
                /* S(n,Tk) = scale Q(n,D) K(Tk,D)^T, per head */
                cuda_gemm(o, S, Tk, (int64_t)n * Tk, qb, qs, D, kb, ks, D, n, Tk, D, 0, 1, scale,
                          0.0f, nb);
                k_att_probs<1><<<nb * n, 128, 0, STREAM(o)>>>(S, lse, q_pos, k_pos, causal, q_start,
                                                              Tq, Tk, H, b, h0, i0, n, cap);
                CK_LAUNCH();
                /* O(n,D) = P(n,Tk) V(Tk,D) */
                cuda_gemm(o, ob, qs, D, S, Tk, (int64_t)n * Tk, vb, ks, D, n, D, Tk, 0, 0, 1.0f,
                          0.0f, nb);
            }
        }
}

static void gemm_attention_bwd(const ust_ops *o, float *dq, float *dk, float *dv, const float *dout,
                               const float *out, const float *lse, const float *q, const float *k,
                               const float *v, int B, int Tq, int Tk, int H, int Hkv, int D,
                               const int32_t *q_pos, const int32_t *k_pos, int causal,
                               const int32_t *q_start, float cap) {
    const int G = H / Hkv, nb = G == 1 ? H : 1, qc = att_chunk(o, Tq, nb, Tk);
    const float scale = 1.0f / sqrtf((float)D);
    const int64_t qs = (int64_t)H * D, ks = (int64_t)Hkv * D;
    const float *Di = attention_dot_f32(o, dout, out, B, Tq, H, D);
    size_t bytes = (size_t)nb * qc * Tk * sizeof(float);
    float *P = (float *)cuda_scratch(o, SCR_S, bytes), *dP = (float *)cuda_scratch(o, SCR_P, bytes);
    for (int b = 0; b < B; b++)
        for (int i0 = 0; i0 < Tq; i0 += qc) {
            int n = Tq - i0 < qc ? Tq - i0 : qc;
            int64_t sS = (int64_t)n * Tk;
            for (int h0 = 0; h0 < H; h0 += nb) {
                int hk = h0 / G;
                int64_t qoff = ((int64_t)b * Tq + i0) * qs + (int64_t)h0 * D;
                int64_t koff = (int64_t)b * Tk * ks + (int64_t)hk * D;
                /* P = exp(scale Q K^T - lse), masked */
                cuda_gemm(o, P, Tk, sS, q + qoff, qs, D, k + koff, ks, D, n, Tk, D, 0, 1, scale,
                          0.0f, nb);
                k_att_probs<0><<<nb * n, 128, 0, STREAM(o)>>>(
                    P, (float *)lse, q_pos, k_pos, causal, q_start, Tq, Tk, H, b, h0, i0, n, cap);
                CK_LAUNCH();
                /* dV(Tk,D) += P^T dO(n,D) */
                if (dv)
                    cuda_gemm(o, dv + koff, ks, D, P, Tk, sS, dout + qoff, qs, D, Tk, D, n, 1, 0,
                              1.0f, 1.0f, nb);
                if (!dq && !dk) continue;
                /* dP(n,Tk) = dO V^T, then dS = P (dP - Di) */
                cuda_gemm(o, dP, Tk, sS, dout + qoff, qs, D, v + koff, ks, D, n, Tk, D, 0, 1, 1.0f,
                          0.0f, nb);
                int64_t total = (int64_t)nb * sS;
                k_att_ds<<<grid_for(total, 256), 256, 0, STREAM(o)>>>(dP, P, Di, lse, Tq, Tk, H, b,
                                                                      h0, i0, n, total, cap);
                CK_LAUNCH();
                /* dQ(n,D) += scale dS K(Tk,D); dK(Tk,D) += scale dS^T Q(n,D) */
                if (dq)
                    cuda_gemm(o, dq + qoff, qs, D, dP, Tk, sS, k + koff, ks, D, n, D, Tk, 0, 0,
                              scale, 1.0f, nb);
                if (dk)
                    cuda_gemm(o, dk + koff, ks, D, dP, Tk, sS, q + qoff, qs, D, Tk, D, n, 1, 0,
                              scale, 1.0f, nb);
            }
        }
}

/* Which implementation runs: see ATT_* in cuda_internal.h. */
static int attention_mode(const ust_ops *o, int D) {
    const cuda_impl *im = CUDA_IMPL(o);
    int tc = cuda_attention_tc_supported(D);
    if (im->attn_mode == ATT_TC || (im->attn_mode == ATT_AUTO && o->act_size == 2))
        return tc ? ATT_TC : ATT_GEMM;
    return im->attn_mode == ATT_FLASH ? ATT_FLASH : ATT_GEMM;
}

/* The flash and GEMM paths on fp32 storage. */
static void attention_fwd_f32(const ust_ops *o, int mode, float *out, float *lse, const float *q,
                              const float *k, const float *v, int B, int Tq, int Tk, int H, int Hkv,
                              int D, const int32_t *q_pos, const int32_t *k_pos, int causal,
                              const int32_t *q_start, float cap) {
    if (mode == ATT_FLASH)
        flash_attention_fwd(o, out, lse, q, k, v, B, Tq, Tk, H, Hkv, D, q_pos, k_pos, causal,
                            q_start);
    else
        gemm_attention_fwd(o, out, lse, q, k, v, B, Tq, Tk, H, Hkv, D, q_pos, k_pos, causal,
                           q_start, cap);
}

static void attention_bwd_f32(const ust_ops *o, int mode, float *dq, float *dk, float *dv,
                              const float *dout, const float *out, const float *lse, const float *q,
                              const float *k, const float *v, int B, int Tq, int Tk, int H, int Hkv,
                              int D, const int32_t *q_pos, const int32_t *k_pos, int causal,
                              const int32_t *q_start, float cap) {
    if (mode == ATT_FLASH)
        flash_attention_bwd(o, dq, dk, dv, dout, out, lse, q, k, v, B, Tq, Tk, H, Hkv, D, q_pos,
                            k_pos, causal, q_start);
    else
        gemm_attention_bwd(o, dq, dk, dv, dout, out, lse, q, k, v, B, Tq, Tk, H, Hkv, D, q_pos,
                           k_pos, causal, q_start, cap);
}

/* ---------------------------------------------------------------- bf16 adapter */

/* The flash and GEMM paths compute on fp32 storage; under bf16 activations their inputs are
 * widened into fp32 scratch (slot W), the fp32 code runs there, and the outputs are rounded back.
 * dq/dk/dv are widened too, so the backward's += accumulates onto their values (one rounding per
 * call). The tensor-core kernels, the bf16 default, read and write bf16 directly. */

__global__ void k_widen(float *dst, const bf16 *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

/* n bf16 of src widened into dst; returns dst, or NULL when src is NULL (an unwanted output). */
static float *widen(const ust_ops *o, float *dst, const act *src, int64_t n) {
    if (!src) return NULL;
    if (n > 0) {
        k_widen<<<grid_for(n, 256), 256, 0, STREAM(o)>>>(dst, (const bf16 *)src, n);
        CK_LAUNCH();
    }
    return dst;
}

static void narrow(const ust_ops *o, act *dst, const float *src, int64_t n) {
    if (dst) cuda_round_bf16(o, (bf16 *)dst, src, n);
}

static void attention_fwd_widened(const ust_ops *o, int mode, act *out, float *lse, const act *q,
                                  const act *k, const act *v, int B, int Tq, int Tk, int H, int Hkv,
                                  int D, const int32_t *q_pos, const int32_t *k_pos, int causal,
                                  const int32_t *q_start, float cap) {
    int64_t nq = (int64_t)B * Tq * H * D, nk = (int64_t)B * Tk * Hkv * D;
    float *w = (float *)cuda_scratch(o, SCR_W, (size_t)(2 * nq + 2 * nk + 1) * sizeof(float));
    float *q32 = widen(o, w, q, nq), *k32 = widen(o, w + nq, k, nk);
    float *v32 = widen(o, w + nq + nk, v, nk), *o32 = w + nq + 2 * nk;
    attention_fwd_f32(o, mode, o32, lse, q32, k32, v32, B, Tq, Tk, H, Hkv, D, q_pos, k_pos, causal,
                      q_start, cap);
    narrow(o, out, o32, nq);
}

static void attention_bwd_widened(const ust_ops *o, int mode, act *dq, act *dk, act *dv,
                                  const act *dout, const act *out, const float *lse, const act *q,
                                  const act *k, const act *v, int B, int Tq, int Tk, int H, int Hkv,
                                  int D, const int32_t *q_pos, const int32_t *k_pos, int causal,
                                  const int32_t *q_start, float cap) {
    int64_t nq = (int64_t)B * Tq * H * D, nk = (int64_t)B * Tk * Hkv * D;
    float *w = (float *)cuda_scratch(o, SCR_W, (size_t)(4 * nq + 4 * nk + 1) * sizeof(float));
    float *dout32 = widen(o, w, dout, nq), *out32 = widen(o, w + nq, out, nq);
    float *q32 = widen(o, w + 2 * nq, q, nq), *dq32 = widen(o, w + 3 * nq, dq, nq);
    float *kv = w + 4 * nq;
    float *k32 = widen(o, kv, k, nk), *v32 = widen(o, kv + nk, v, nk);
    float *dk32 = widen(o, kv + 2 * nk, dk, nk), *dv32 = widen(o, kv + 3 * nk, dv, nk);
    attention_bwd_f32(o, mode, dq32, dk32, dv32, dout32, out32, lse, q32, k32, v32, B, Tq, Tk, H,
                      Hkv, D, q_pos, k_pos, causal, q_start, cap);
    narrow(o, dq, dq32, nq);
    narrow(o, dk, dk32, nk);
    narrow(o, dv, dv32, nk);
}

/* ---------------------------------------------------------------- dispatch */

void cuda_attention_fwd(const ust_ops *o, act *out, float *lse, const act *q, const act *k,
                        const act *v, int B, int Tq, int Tk, int H, int Hkv, int D,
                        const int32_t *q_pos, const int32_t *k_pos, int causal,
                        const int32_t *q_start, float softcap) {
    check_shapes(H, Hkv, D);
    if (B <= 0 || Tq <= 0 || H <= 0) return;
    /* model.attn_softcap: the GEMM path caps the scores it materializes (the flash and
     * tensor-core kernels have no cap) */
    int mode = softcap > 0 ? ATT_GEMM : attention_mode(o, D);
    if (mode == ATT_TC)
        cuda_attention_tc_fwd(o, out, lse, q, k, v, B, Tq, Tk, H, Hkv, D, q_pos, k_pos, causal,
                              q_start);
    else if (o->act_size == 2)
        attention_fwd_widened(o, mode, out, lse, q, k, v, B, Tq, Tk, H, Hkv, D, q_pos, k_pos,
                              causal, q_start, softcap);
    else
        attention_fwd_f32(o, mode, (float *)out, lse, (const float *)q, (const float *)k,
                          (const float *)v, B, Tq, Tk, H, Hkv, D, q_pos, k_pos, causal, q_start,
                          softcap);
}

void cuda_attention_bwd(const ust_ops *o, act *dq, act *dk, act *dv, const act *dout,
                        const act *out, const float *lse, const act *q, const act *k, const act *v,
                        int B, int Tq, int Tk, int H, int Hkv, int D, const int32_t *q_pos,
                        const int32_t *k_pos, int causal, const int32_t *q_start, float softcap) {
    check_shapes(H, Hkv, D);
    if (B <= 0 || Tq <= 0 || Tk <= 0 || H <= 0 || (!dq && !dk && !dv)) return;
    int mode = softcap > 0 ? ATT_GEMM : attention_mode(o, D); /* as cuda_attention_fwd */
    if (mode == ATT_TC) {
        const float *Di = cuda_attention_dot(o, dout, out, B, Tq, H, D);
        cuda_attention_tc_bwd(o, dq, dk, dv, dout, lse, Di, q, k, v, B, Tq, Tk, H, Hkv, D, q_pos,
                              k_pos, causal, q_start);
    } else if (o->act_size == 2) {
        attention_bwd_widened(o, mode, dq, dk, dv, dout, out, lse, q, k, v, B, Tq, Tk, H, Hkv, D,
                              q_pos, k_pos, causal, q_start, softcap);
    } else {
        attention_bwd_f32(o, mode, (float *)dq, (float *)dk, (float *)dv, (const float *)dout,
                          (const float *)out, lse, (const float *)q, (const float *)k,
                          (const float *)v, B, Tq, Tk, H, Hkv, D, q_pos, k_pos, causal, q_start,
                          softcap);
    }
}

void cuda_attention_merge(const ust_ops *o, act *out, float *lse, const act *out2,
                          const float *lse2, int B, int T, int H, int D) {
    int64_t rows = (int64_t)B * H * T;
    if (rows <= 0) return;
    ACT_LAUNCH(o, k_att_merge, grid_for(rows * 32, 256), 256, 0, out, lse, out2, lse2, T, H, D,
               rows);
}
