/* attention_tc: flash attention on tensor cores, the default attention of bf16 runs for head
 * dims 16, 32, 64 and 128. Same contract as ops.h: causal visibility by global positions, GQA,
 * fully masked rows with out = 0 and lse = -inf, backward accumulating into dq, dk, dv.
 *
 * Every product is an mma.m16n8k16 with bf16 inputs and fp32 accumulation, the precision of the
 * bf16 GEMM path: q, k, v, dout, the probabilities P and dS are rounded to bf16 where they enter
 * a product; the softmax, lse, Di and all accumulators stay fp32. Nothing of size T x T exists.
 * - Forward: a block = 4 warps x 16 queries of one (b, h); 64-key tiles of K and V in two
 *   shared stages (bf16: the next tile's cp.async in flight during this tile's products; B
 *   fragments by ldmatrix, V's transposed by ldmatrix.trans); online softmax in base 2
 *   on the accumulator fragments, whose layout is also the A-operand layout of the next
 *   product, so P never leaves registers.
 * - dq: the same geometry with 32-key tiles; P and dS are recomputed from lse.
 * - dk/dv: a block = 4 warps x 16 keys of one (b, kv head), walking 32-query tiles of every
 *   query head of its group.
 * Each output element is written by one thread in a fixed order (no atomics): deterministic.
 * So the backward computes 7 tile products per (query, key) tile, not FlashAttention-2's 5: S
 * and dP are computed by both kernels (Di = rowsum(dout * out) is precomputed, as in FA2). FA2's
 * single pass adds dS K into dq with fp32 atomics; deterministic partial dq per key block instead
 * would move ~400 MB per layer (GPT-2 124M, B=8, T=1024: ~80 us at 4.8 TB/s) against ~18 us
 * for the two recomputed products (13 GFLOP at 70% of 989 TFLOP/s). Under run.deterministic: false
 * (ust_ops nondeterministic) k_tc_dkdv<DQ> runs FA2's one pass instead: 5 products, dq by atomics.
 * Tiles that causality hides entirely are skipped by the block, and by a warp for its rows. */
#include "cuda_internal.h"
#include "ptx.cuh"

#include <cuda_bf16.h>
#include <limits.h>
#include <math.h>

#define TC_THREADS 128 /* 4 warps */
#define TC_BQ 64       /* forward and dq: queries per block (16 per warp) */
#define TC_FK 64       /* forward: keys per tile */
#define TC_DQK 32      /* dq: keys per tile */
#define TC_BKV 64      /* dk/dv: keys per block (16 per warp) */
#define TC_KVQ 32      /* dk/dv: queries per tile */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

typedef uint32_t u32;

/* ---------------------------------------------------------------- fragments */

__device__ __forceinline__ float bf_lo(u32 x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf_hi(u32 x) { return __uint_as_float(x & 0xffff0000u); }

/* d(16x8) += a(16x16) b(16x8), bf16 in, fp32 accumulate, in the PTX mma.m16n8k16 fragment layout.
 * Lane 4g + t holds a = {A[g][2t,2t+1], A[g+8][2t,2t+1], A[g][2t+8,2t+9], A[g+8][2t+8,2t+9]},
 * b = {B[2t,2t+1][g], B[2t+8,2t+9][g]} and d = {D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]}. */
__device__ __forceinline__ void mma16816(float d[4], const u32 a[4], const u32 b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    /* The same product gathered from the fragments by shuffles: for the CPU emulator and GPUs
     * without bf16 mma. Row g of A lives in lanes 4g..4g+3, column n of B in lanes 4n..4n+3. */
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int tp = 0; tp < 4; tp++) {
        u32 ar[4], b0[2], b1[2];
        for (int r = 0; r < 4; r++) ar[r] = __shfl_sync(0xffffffffu, a[r], 4 * g + tp);
        for (int n = 0; n < 2; n++) {
            b0[n] = __shfl_sync(0xffffffffu, b[0], 4 * (2 * t + n) + tp);
            b1[n] = __shfl_sync(0xffffffffu, b[1], 4 * (2 * t + n) + tp);
        }
        for (int n = 0; n < 2;
             n++) { /* k = 2tp, 2tp+1 from a0/a1, b0; 2tp+8, 2tp+9 from a2/a3, b1 */
            d[n] += bf_lo(ar[0]) * bf_lo(b0[n]) + bf_hi(ar[0]) * bf_hi(b0[n]) +
                    bf_lo(ar[2]) * bf_lo(b1[n]) + bf_hi(ar[2]) * bf_hi(b1[n]);
            d[2 + n] += bf_lo(ar[1]) * bf_lo(b0[n]) + bf_hi(ar[1]) * bf_hi(b0[n]) +
                        bf_lo(ar[3]) * bf_lo(b1[n]) + bf_hi(ar[3]) * bf_hi(b1[n]);
        }
    }
#endif
}

/* The A fragment of k-step kk (columns 16kk..16kk+15) from the accumulators of n-tiles 2kk and
 * 2kk+1 of a 16-row result: the accumulator layout is the operand layout. */
__device__ __forceinline__ void acc_to_a(u32 a[4], const float c0[4], const float c1[4]) {
    a[0] = pack_bf16x2(c0[0], c0[1]);
    a[1] = pack_bf16x2(c0[2], c0[3]);
    a[2] = pack_bf16x2(c1[0], c1[1]);
    a[3] = pack_bf16x2(c1[2], c1[3]);
}

/* A shared-memory bf16 tile of `rows` rows, `stride` bf16 per row (16 bytes of padding past the
 * data, so the 8 rows x 4 words of a fragment load hit 32 distinct banks), read as words. */
__device__ __forceinline__ u32 word(const u32 *tile, int stride, int row, int col) {
    return tile[row * (stride / 2) + col / 2];
}

/* The B fragment of k-step kk for n-tile nt from a tile whose row n holds column n of B along k
 * (that is, B^T row-major): b = {T[8nt+g][16kk+2t..], T[8nt+g][16kk+8+2t..]}. */
__device__ __forceinline__ void load_b(u32 b[2], const u32 *tile, int stride, int nt, int kk) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    b[0] = word(tile, stride, 8 * nt + g, 16 * kk + 2 * t);
    b[1] = word(tile, stride, 8 * nt + g, 16 * kk + 8 + 2 * t);
}

/* The A fragment of k-step kk for rows r0..r0+15 of a row-major tile. */
__device__ __forceinline__ void load_a(u32 a[4], const u32 *tile, int stride, int r0, int kk) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    a[0] = word(tile, stride, r0 + g, 16 * kk + 2 * t);
    a[1] = word(tile, stride, r0 + g + 8, 16 * kk + 2 * t);
    a[2] = word(tile, stride, r0 + g, 16 * kk + 8 + 2 * t);
    a[3] = word(tile, stride, r0 + g + 8, 16 * kk + 8 + 2 * t);
}

/* The B fragment of k-step kk for n-tile nt from a row-major tile whose row k holds row k of B
 * (a tile fill_rows wrote: V for O += P V, K for dQ += dS K, dout and q for dV and dK):
 * b = {B[16kk+2t, 16kk+2t+1][8nt+g], B[16kk+8+2t, 16kk+9+2t][8nt+g]}, gathered from bf16 halves.
 * Before, these operands had a transposed copy in shared memory, read from global memory a
 * second time with 2-byte loads and stored with 4-way bank conflicts (consecutive threads wrote
 * words (n + 8) / 2 apart). Here the 4 rows a warp reads (16kk + 2t) sit t (D + 8) words apart,
 * 0, 8, 16 or 24 banks mod 32 for every D, plus g / 2: 16 distinct banks, lanes g and g ^ 1
 * sharing a word, so no conflict (ldmatrix.trans would take one instruction on sm_80+). */
__device__ __forceinline__ void load_bt(u32 b[2], const u32 *tile, int stride, int nt, int kk) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int sh = 16 * (g & 1), w = (8 * nt + g) >> 1, ws = stride / 2, r = 16 * kk + 2 * t;
    b[0] = ((tile[r * ws + w] >> sh) & 0xffffu) | ((tile[(r + 1) * ws + w] >> sh) << 16);
    b[1] = ((tile[(r + 8) * ws + w] >> sh) & 0xffffu) | ((tile[(r + 9) * ws + w] >> sh) << 16);
}

/* ldmatrix (ptx.cuh) forms of load_a, load_b and load_bt for the forward, one instruction for what
 * took 4 or 8 shared loads: lane l names row l % 8 of matrix l / 8, and the matrices are, in order,
 * the fragment registers: ldsm_a's (rows r0 / r0 + 8, columns 16kk / 16kk + 8: a[0..3]), ldsm_b2's
 * and ldsm_bt2's (b[0], b[1] of n-tile nt, then of nt + 1). The row stride (D + 8 bf16) puts the 8
 * rows of one matrix on 8 distinct 16-byte bank groups: no conflict. */
__device__ __forceinline__ void ldsm_a(u32 a[4], const u32 *tile, int stride, int r0, int kk) {
    const int l = threadIdx.x & 31;
    ptx_ldsm_x4(a,
                tile + (r0 + (l & 7) + 8 * ((l >> 3) & 1)) * (stride / 2) + 8 * kk + 4 * (l >> 4));
}
__device__ __forceinline__ void ldsm_b2(u32 b0[2], u32 b1[2], const u32 *tile, int stride, int nt,
                                        int kk) {
    const int l = threadIdx.x & 31;
    u32 r[4];
    ptx_ldsm_x4(r, tile + (8 * nt + 8 * (l >> 4) + (l & 7)) * (stride / 2) + 8 * kk +
                       4 * ((l >> 3) & 1));
    b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}
__device__ __forceinline__ void ldsm_bt2(u32 b0[2], u32 b1[2], const u32 *tile, int stride, int nt,
                                         int kk) {
    const int l = threadIdx.x & 31;
    u32 r[4];
    ptx_ldsm_x4_t(r, tile + (16 * kk + (l & 7) + 8 * ((l >> 3) & 1)) * (stride / 2) + 4 * nt +
                         4 * (l >> 4));
    b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}

/* The bf16 bits of an activation element: fp32 ones rounded (nearest even), bf16 ones as they
 * are stored (no conversion). */
__device__ __forceinline__ u32 bf16_bits(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
__device__ __forceinline__ u32 bf16_bits(bf16 x) { return __bfloat16_as_ushort(x); }

/* Two activation elements as one bf16x2 operand word, lo in the low half (memory order). */
template <typename T> __device__ __forceinline__ u32 pair_bits(const T *p, int64_t hi_off) {
    return bf16_bits(p[0]) | (bf16_bits(p[hi_off]) << 16);
}

/* The A fragment of k-step kk straight from two rows of q or dout in global memory (NULL:
 * zeros). */
template <typename T>
__device__ __forceinline__ void global_a(u32 a[4], const T *row0, const T *row1, int kk) {
    const int c = 16 * kk + 2 * ((threadIdx.x & 31) & 3);
    a[0] = row0 ? pair_bits(row0 + c, 1) : 0u;
    a[1] = row1 ? pair_bits(row1 + c, 1) : 0u;
    a[2] = row0 ? pair_bits(row0 + c + 8, 1) : 0u;
    a[3] = row1 ? pair_bits(row1 + c + 8, 1) : 0u;
}

/* Eight activation elements at p (16-byte aligned) as four bf16x2 words: one 16-byte load for
 * bf16, two for fp32 (rounded to bf16 as bf16_bits rounds). */
__device__ __forceinline__ uint4 load8_bits(const bf16 *p) { return *(const uint4 *)p; }
__device__ __forceinline__ uint4 load8_bits(const float *p) {
    const float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
    return make_uint4(pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w), pack_bf16x2(b.x, b.y),
                      pack_bf16x2(b.z, b.w));
}

/* Rows [r0, r0 + n) of x (row r at x + r * rs, D elements) into a shared tile (16-byte aligned)
 * as bf16, row-major (rows past `valid` become zeros); the whole block takes part. When x and
 * the row stride are 16-byte aligned (the dense activations always are) each thread moves 8
 * elements with 16-byte loads and stores; otherwise (a view at an odd offset) 2 with 2-byte
 * loads. The test is uniform over the block. Row stride D + 8 bf16 = D / 2 + 4 words: the 8
 * threads of a quarter warp storing one row of D = 64 or 128 hit distinct banks. */
template <int D, typename T>
__device__ __forceinline__ void fill_rows(u32 *tile, const T *x, int64_t rs, int r0, int n,
                                          int valid) {
    constexpr int S = D + 8;
    if ((((uintptr_t)x | (uintptr_t)(rs * (int64_t)sizeof(T))) & 15) == 0) {
        for (int idx = threadIdx.x; idx < n * (D / 8); idx += blockDim.x) {
            int r = idx / (D / 8), c = 8 * (idx % (D / 8));
            uint4 w = make_uint4(0u, 0u, 0u, 0u);
            if (r0 + r < valid) w = load8_bits(x + (int64_t)(r0 + r) * rs + c);
            *(uint4 *)&tile[r * (S / 2) + c / 2] = w;
        }
        return;
    }
    for (int idx = threadIdx.x; idx < n * (D / 2); idx += blockDim.x) {
        int r = idx / (D / 2), c = 2 * (idx % (D / 2));
        const T *p = x + (int64_t)(r0 + r) * rs + c;
        tile[r * (S / 2) + c / 2] = r0 + r < valid ? pair_bits(p, 1) : 0u;
    }
}

/* Rows [r0, r0 + n) of bf16 x (x and its row stride rs 16-byte aligned) into a shared tile laid
 * out as fill_rows lays it, by cp.async: 16 bytes per copy, rows past `valid` zero-filled. The
 * whole block issues; the caller commits the group and waits for it. */
template <int D>
__device__ __forceinline__ void fill_rows_async(u32 *tile, const bf16 *x, int64_t rs, int r0, int n,
                                                int valid) {
    for (int idx = threadIdx.x; idx < n * (D / 8); idx += blockDim.x) {
        const int r = idx / (D / 8), c = 8 * (idx % (D / 8));
        const bool in = r0 + r < valid;
        ptx_cp_async16(&tile[r * ((D + 8) / 2) + c / 2], in ? x + (int64_t)(r0 + r) * rs + c : x,
                       in ? 16 : 0);
    }
}

/* Register double buffering of an N-row tile: tile_load issues the next tile's 16-byte loads
 * (N D / 8 / TC_THREADS per thread; x and its row stride 16-byte aligned) before the current
 * tile's products, tile_store moves them to shared memory after them, so the loads' latency
 * overlaps the products (the forward stages its tiles by cp.async instead, fill_rows_async). The
 * block has TC_THREADS threads. */
template <int D, int N> struct tile_regs { uint4 r[N * D / 8 / TC_THREADS]; };
template <int D, int N, typename T>
__device__ __forceinline__ void tile_load(tile_regs<D, N> &f, const T *x, int64_t rs, int r0,
                                          int valid) {
    for (int i = 0; i < N * D / 8 / TC_THREADS; i++) {
        const int idx = threadIdx.x + i * TC_THREADS, r = idx / (D / 8), c = 8 * (idx % (D / 8));
        f.r[i] = r0 + r < valid ? load8_bits(x + (int64_t)(r0 + r) * rs + c)
                                : make_uint4(0u, 0u, 0u, 0u);
    }
}
template <int D, int N>
__device__ __forceinline__ void tile_store(u32 *tile, const tile_regs<D, N> &f) {
    for (int i = 0; i < N * D / 8 / TC_THREADS; i++) {
        const int idx = threadIdx.x + i * TC_THREADS, r = idx / (D / 8), c = 8 * (idx % (D / 8));
        *(uint4 *)&tile[r * ((D + 8) / 2) + c / 2] = f.r[i];
    }
}

/* x[i] += v on an activation (fp32 read-modify-write, rounded once when bf16). */
template <typename T> __device__ __forceinline__ void add_act(T *x, int64_t i, float v) {
    st_act(x, i, ld_act(x, i) + v);
}

__device__ __forceinline__ int warp_min_int(int v) {
    for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}
__device__ __forceinline__ int warp_max_int(int v) {
    for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

/* Smallest of n positions in shared memory (INT_MAX past the end), per warp, no barrier. */
__device__ __forceinline__ int tile_min(const int *pos, int n) {
    int v = INT_MAX;
    for (int j = threadIdx.x & 31; j < n; j += 32) v = min(v, pos[j]);
    return warp_min_int(v);
}
__device__ __forceinline__ int tile_max(const int *pos, int n) {
    int v = INT_MIN;
    for (int j = threadIdx.x & 31; j < n; j += 32) v = max(v, pos[j]);
    return warp_max_int(v);
}

/* Positions of keys [j0, j0 + n) into shared memory (INT_MAX past Tk), once the block is done
 * with the previous tile; returns the smallest. The whole block calls it (two barriers). */
__device__ __forceinline__ int key_tile_positions(int *kpos, const int32_t *k_pos, int j0, int n,
                                                  int Tk) {
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        kpos[j] = j0 + j < Tk ? posof(k_pos, j0 + j) : INT_MAX;
    __syncthreads();
    return tile_min(kpos, n);
}

/* The positions of a forward/dq block's 64 queries (INT_MIN past Tq) in shared memory, this
 * thread's two rows' and the largest of the block's and of this warp's, for causal skipping.
 * The whole block calls it (one barrier). */
struct query_rows {
    int qp0, qp1, qmax_block, qmax_warp;
    int qs0, qs1; /* where the two rows' documents begin (INT_MIN: no document mask) */
};
__device__ __forceinline__ query_rows query_block_positions(int *qpos, const int32_t *q_pos, int i0,
                                                            int Tq, const int32_t *q_start, int b) {
    for (int i = threadIdx.x; i < TC_BQ; i += blockDim.x)
        qpos[i] = i0 + i < Tq ? posof(q_pos, i0 + i) : INT_MIN;
    __syncthreads();
    const int row = 16 * (threadIdx.x >> 5) + ((threadIdx.x & 31) >> 2);
    query_rows r;
    r.qp0 = qpos[row], r.qp1 = qpos[row + 8];
    r.qmax_block = tile_max(qpos, TC_BQ), r.qmax_warp = warp_max_int(max(r.qp0, r.qp1));
    r.qs0 = doc_start(q_start, b, Tq, i0 + row), r.qs1 = doc_start(q_start, b, Tq, i0 + row + 8);
    return r;
}

/* Max over the 4 lanes of a fragment row group (the lanes sharing g). */
__device__ __forceinline__ float quad_max(float v) {
    v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return max_nan(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* ---------------------------------------------------------------- forward */

/* Whether x and its row stride of rs elements allow 16-byte accesses. */
template <typename T> __device__ __forceinline__ bool aligned16(const T *x, int64_t rs) {
    return (((uintptr_t)x | (uintptr_t)(rs * (int64_t)sizeof(T))) & 15) == 0;
}

/* The forward's shared K and V tiles: two stages of (K, V), 64 rows of D + 8 bf16 each, for bf16
 * activations (cp.async double buffering); one stage for fp32 ones (filled with fill_rows). */
static size_t fwd_smem(int D, size_t act_size) {
    return (size_t)(act_size == 2 ? 4 : 2) * TC_FK * (D + 8) * 2;
}

/* q(B,Tq,H,D), k,v(B,Tk,Hkv,D) -> out(B,Tq,H,D), lse(B,H,Tq). Grid: B x H x ceil(Tq/64) blocks,
 * last query tile first; scale2 = log2(e) / sqrt(D); fwd_smem(D, sizeof(T)) bytes of dynamic
 * shared memory. */
template <int D, typename T>
__global__ void __launch_bounds__(TC_THREADS)
    k_tc_fwd(act *out_, float *lse, const act *q_, const act *k_, const act *v_, int Tq, int Tk,
             int H, int Hkv, const int32_t *q_pos, const int32_t *k_pos, int causal,
             const int32_t *q_start, float scale2, int nqt) {
    T *out = (T *)out_;
    const T *q = (const T *)q_, *k = (const T *)k_, *v = (const T *)v_;
    constexpr int NK = D / 16, ND = D / 8, NT = TC_FK / 8, KS = D + 8, TW = TC_FK * KS / 2;
    extern __shared__ float sm[]; /* 16-byte aligned: stage s's K tile at 2 s TW words, V after */
    u32 *const st = (u32 *)sm;
    __shared__ int kpos[TC_FK], qpos[TC_BQ];
    const int qt = nqt - 1 - (int)(blockIdx.x % nqt); /* the longest causal tiles first */
    const int h = (int)(blockIdx.x / nqt % H), b = (int)(blockIdx.x / nqt / H);
    const int hk = h / (H / Hkv), w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3, i0 = qt * TC_BQ, r0 = i0 + 16 * w + g, r1 = r0 + 8;
    const int64_t qs = (int64_t)H * D, kvs = (int64_t)Hkv * D;
    const T *qb = q + ((int64_t)b * Tq * H + h) * D;
    const T *kb = k + ((int64_t)b * Tk * Hkv + hk) * D, *vb = v + (kb - k);
    /* cp.async moves bf16 as it is (fp32 is rounded on the way, by fill_rows) and needs 16-byte
     * aligned rows (a view at an odd offset takes fill_rows' 2-byte path, one stage) */
    const bool async = sizeof(T) == 2 && aligned16(kb, kvs) && aligned16(vb, kvs);
    const bf16 *kb16 = (const bf16 *)(const void *)kb, *vb16 = (const bf16 *)(const void *)vb;

    u32 qf[NK][4];
    if (sizeof(T) == 2 && aligned16(qb, qs)) { /* Q by cp.async into stage 1, free until then */
        fill_rows_async<D>(st + 2 * TW, (const bf16 *)(const void *)qb, qs, i0, TC_BQ, Tq);
        ptx_cp_async_commit();
        ptx_cp_async_wait<0>();
        __syncthreads();
        for (int kk = 0; kk < NK; kk++) ldsm_a(qf[kk], st + 2 * TW, KS, 16 * w, kk);
    } else {
        for (int kk = 0; kk < NK; kk++)
            global_a(qf[kk], r0 < Tq ? qb + r0 * qs : NULL, r1 < Tq ? qb + r1 * qs : NULL, kk);
    }
    const query_rows qr = query_block_positions(qpos, q_pos, i0, Tq, q_start, b);
    const int qp0 = qr.qp0, qp1 = qr.qp1, qmax_block = qr.qmax_block, qmax_warp = qr.qmax_warp;

    float o[ND][4], m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    for (int dt = 0; dt < ND; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;

    int cur = 0, staged = -1; /* the stage this tile is in; the tile whose copy went to the other */
    for (int j0 = 0; j0 < Tk; j0 += TC_FK) {
        const int kmin = key_tile_positions(kpos, k_pos, j0, TC_FK, Tk); /* barriers: stages free */
        if (causal && kmin > qmax_block) {
            if (staged == j0) { /* land the copy nobody will read: a stage takes one at a time */
                ptx_cp_async_wait<0>();
                staged = -1;
            }
            continue;
        }
        const u32 *ks = st + 2 * cur * TW, *vs = ks + TW;
        if (staged != j0 && async) {
            fill_rows_async<D>(st + 2 * cur * TW, kb16, kvs, j0, TC_FK, Tk);
            fill_rows_async<D>(st + (2 * cur + 1) * TW, vb16, kvs, j0, TC_FK, Tk);
            ptx_cp_async_commit();
        } else if (staged != j0) {
            fill_rows<D, T>(st + 2 * cur * TW, kb, kvs, j0, TC_FK, Tk);
            fill_rows<D, T>(st + (2 * cur + 1) * TW, vb, kvs, j0, TC_FK, Tk);
        }
        /* the next tile's copy into the other stage overlaps this tile's products, unless its first
         * key is past every query of a causal block (a guess for positions out of order: a tile
         * not staged is copied in its turn) */
        const int jn = j0 + TC_FK;
        if (async && jn < Tk && (!causal || posof(k_pos, jn) <= qmax_block)) {
            fill_rows_async<D>(st + 2 * (cur ^ 1) * TW, kb16, kvs, jn, TC_FK, Tk);
            fill_rows_async<D>(st + (2 * (cur ^ 1) + 1) * TW, vb16, kvs, jn, TC_FK, Tk);
            ptx_cp_async_commit();
            ptx_cp_async_wait<1>(); /* this tile's group has landed, the next one's may not */
            staged = jn, cur ^= 1;
        } else {
            ptx_cp_async_wait<0>();
            staged = -1;
        }
        __syncthreads();
        if (causal && kmin > qmax_warp) continue; /* this warp's queries see none of the tile */

        float s[NT][4]; /* S = Q K^T for 16 queries x 64 keys */
        for (int nt = 0; nt < NT; nt += 2) {
            for (int e = 0; e < 4; e++) s[nt][e] = s[nt + 1][e] = 0.0f;
            for (int kk = 0; kk < NK; kk++) {
                u32 b0[2], b1[2];
                ldsm_b2(b0, b1, ks, KS, nt, kk);
                mma16816(s[nt], qf[kk], b0);
                mma16816(s[nt + 1], qf[kk], b1);
            }
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
        for (int nt = 0; nt < NT; nt++)
            for (int e = 0; e < 4; e++) {
                int j = 8 * nt + 2 * t + (e & 1), qp = e < 2 ? qp0 : qp1;
                bool vis = j0 + j < Tk && (!causal || kpos[j] <= qp) &&
                           kpos[j] >= (e < 2 ? qr.qs0 : qr.qs1);
                s[nt][e] = vis ? s[nt][e] * scale2 : -INFINITY;
                if (e < 2)
                    mx0 = max_nan(mx0, s[nt][e]);
                else
                    mx1 = max_nan(mx1, s[nt][e]);
            }
        const float n0 = max_nan(m0, quad_max(mx0)), n1 = max_nan(m1, quad_max(mx1));
        const float base0 = n0 == -INFINITY ? 0.0f : n0, base1 = n1 == -INFINITY ? 0.0f : n1;
        const float al0 = exp2f(m0 - base0), al1 = exp2f(m1 - base1);
        m0 = n0, m1 = n1, l0 *= al0, l1 *= al1;
        for (int nt = 0; nt < NT; nt++) {
            s[nt][0] = exp2f(s[nt][0] - base0), s[nt][1] = exp2f(s[nt][1] - base0);
            s[nt][2] = exp2f(s[nt][2] - base1), s[nt][3] = exp2f(s[nt][3] - base1);
            l0 += s[nt][0] + s[nt][1], l1 += s[nt][2] + s[nt][3];
        }
        for (int dt = 0; dt < ND; dt++)
            o[dt][0] *= al0, o[dt][1] *= al0, o[dt][2] *= al1, o[dt][3] *= al1;
        for (int kk = 0; kk < TC_FK / 16; kk++) { /* O += P V */
            u32 pa[4];
            acc_to_a(pa, s[2 * kk], s[2 * kk + 1]);
            for (int dt = 0; dt < ND; dt += 2) {
                u32 b0[2], b1[2];
                ldsm_bt2(b0, b1, vs, KS, dt, kk);
                mma16816(o[dt], pa, b0);
                mma16816(o[dt + 1], pa, b1);
            }
        }
    }
    l0 = quad_sum(l0), l1 = quad_sum(l1);
    /* a NaN sum (a NaN score) stays NaN in the output and lse */
    const float inv0 = l0 != 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 != 0.0f ? 1.0f / l1 : 0.0f;
    T *ob = out + ((int64_t)b * Tq * H + h) * D;
    for (int dt = 0; dt < ND; dt++) {
        int c = 8 * dt + 2 * t;
        if (r0 < Tq)
            st_act(ob, r0 * qs + c, o[dt][0] * inv0), st_act(ob, r0 * qs + c + 1, o[dt][1] * inv0);
        if (r1 < Tq)
            st_act(ob, r1 * qs + c, o[dt][2] * inv1), st_act(ob, r1 * qs + c + 1, o[dt][3] * inv1);
    }
    float *lb = lse + ((int64_t)b * H + h) * Tq;
    if (t == 0 && r0 < Tq) lb[r0] = l0 != 0.0f ? (m0 + log2f(l0)) * LN2 : -INFINITY;
    if (t == 0 && r1 < Tq) lb[r1] = l1 != 0.0f ? (m1 + log2f(l1)) * LN2 : -INFINITY;
}

/* ---------------------------------------------------------------- backward: dq */

/* P and dS of one 16 x 8 accumulator tile in place: p = exp2(s scale2 - lse2) where visible,
 * ds = p (dp - Di). Row e < 2 uses the first row's values. */
__device__ __forceinline__ void probs_and_ds(float s[4], float dp[4], bool vis[4],
                                             const float l2[2], const float di[2], float scale2) {
    for (int e = 0; e < 4; e++) {
        int r = e >> 1;
        float p = vis[e] && l2[r] != -INFINITY ? exp2f(s[e] * scale2 - l2[r]) : 0.0f;
        s[e] = p;
        dp[e] = p * (dp[e] - di[r]);
    }
}

/* dq(B,Tq,H,D) += scale sum_j dS_ij k_j, from dout(B,Tq,H,D), lse and Di (B,H,Tq). Grid as the
 * forward's. At least one block per SM: without it ptxas capped D = 64 at 128 registers and
 * spilled 8 bytes (sm_90); it takes 133 now (test/sh/cuda_resources.sh). */
template <int D, typename T>
__global__ void __launch_bounds__(TC_THREADS, 1)
    k_tc_dq(act *dq_, const act *dout_, const float *lse, const float *Di, const act *q_,
            const act *k_, const act *v_, int Tq, int Tk, int H, int Hkv, const int32_t *q_pos,
            const int32_t *k_pos, int causal, const int32_t *q_start, float scale, int nqt) {
    T *dq = (T *)dq_;
    const T *dout = (const T *)dout_, *q = (const T *)q_, *k = (const T *)k_, *v = (const T *)v_;
    constexpr int NK = D / 16, ND = D / 8, NT = TC_DQK / 8, KS = D + 8;
    __shared__ uint4 ks4[TC_DQK * KS / 8], vs4[TC_DQK * KS / 8]; /* uint4: 16-byte aligned */
    u32 *ks = (u32 *)ks4; /* K tile, row per key: S = Q K^T and (read transposed) dQ += dS K */
    u32 *vs = (u32 *)vs4; /* V tile, row per key: dP = dO V^T */
    __shared__ int kpos[TC_DQK], qpos[TC_BQ];
    const int qt = nqt - 1 - (int)(blockIdx.x % nqt);
    const int h = (int)(blockIdx.x / nqt % H), b = (int)(blockIdx.x / nqt / H);
    const int hk = h / (H / Hkv), w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3, i0 = qt * TC_BQ, r0 = i0 + 16 * w + g, r1 = r0 + 8;
    const int64_t qs = (int64_t)H * D, kvs = (int64_t)Hkv * D;
    const float scale2 = scale * LOG2E;
    const T *qb = q + ((int64_t)b * Tq * H + h) * D, *ob = dout + (qb - q);
    const T *kb = k + ((int64_t)b * Tk * Hkv + hk) * D, *vb = v + (kb - k);
    const float *lb = lse + ((int64_t)b * H + h) * Tq, *db = Di + (lb - lse);

    u32 qf[NK][4], of[NK][4];
    for (int kk = 0; kk < NK; kk++) {
        global_a(qf[kk], r0 < Tq ? qb + r0 * qs : NULL, r1 < Tq ? qb + r1 * qs : NULL, kk);
        global_a(of[kk], r0 < Tq ? ob + r0 * qs : NULL, r1 < Tq ? ob + r1 * qs : NULL, kk);
    }
    const float l2[2] = {r0 < Tq ? lb[r0] * LOG2E : -INFINITY,
                         r1 < Tq ? lb[r1] * LOG2E : -INFINITY};
    const float di[2] = {r0 < Tq ? db[r0] : 0.0f, r1 < Tq ? db[r1] : 0.0f};
    const query_rows qr = query_block_positions(qpos, q_pos, i0, Tq, q_start, b);
    const int qp0 = qr.qp0, qp1 = qr.qp1, qmax_block = qr.qmax_block, qmax_warp = qr.qmax_warp;

    float acc[ND][4];
    for (int dt = 0; dt < ND; dt++) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.0f;
    for (int j0 = 0; j0 < Tk; j0 += TC_DQK) {
        const int kmin = key_tile_positions(kpos, k_pos, j0, TC_DQK, Tk);
        if (causal && kmin > qmax_block) continue;
        fill_rows<D, T>(ks, kb, kvs, j0, TC_DQK, Tk);
        fill_rows<D, T>(vs, vb, kvs, j0, TC_DQK, Tk);
        __syncthreads();
        if (causal && kmin > qmax_warp) continue;

        float s[NT][4], dp[NT][4];
        for (int nt = 0; nt < NT; nt++) {
            for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
            for (int kk = 0; kk < NK; kk++) {
                u32 bf[2];
                load_b(bf, ks, KS, nt, kk);
                mma16816(s[nt], qf[kk], bf);
                load_b(bf, vs, KS, nt, kk);
                mma16816(dp[nt], of[kk], bf);
            }
            bool vis[4];
            for (int e = 0; e < 4; e++) {
                int j = 8 * nt + 2 * t + (e & 1);
                vis[e] = j0 + j < Tk && (!causal || kpos[j] <= (e < 2 ? qp0 : qp1)) &&
                         kpos[j] >= (e < 2 ? qr.qs0 : qr.qs1);
            }
            probs_and_ds(s[nt], dp[nt], vis, l2, di, scale2);
        }
        for (int kk = 0; kk < TC_DQK / 16; kk++) { /* dQ += dS K */
            u32 da[4];
            acc_to_a(da, dp[2 * kk], dp[2 * kk + 1]);
            for (int dt = 0; dt < ND; dt++) {
                u32 bf[2];
                load_bt(bf, ks, KS, dt, kk);
                mma16816(acc[dt], da, bf);
            }
        }
    }
    T *qo = dq + ((int64_t)b * Tq * H + h) * D;
    for (int dt = 0; dt < ND; dt++) {
        int c = 8 * dt + 2 * t;
        if (r0 < Tq)
            add_act(qo, r0 * qs + c, scale * acc[dt][0]),
                add_act(qo, r0 * qs + c + 1, scale * acc[dt][1]);
        if (r1 < Tq)
            add_act(qo, r1 * qs + c, scale * acc[dt][2]),
                add_act(qo, r1 * qs + c + 1, scale * acc[dt][3]);
    }
}

/* ---------------------------------------------------------------- backward: one pass (opt-in) */

/* FlashAttention-2's backward, run when the backend allows non-deterministic kernels
 * (run.deterministic: false): the dk/dv kernel's blocks also add dQ += dS K of their key block
 * into an fp32 copy of dq with atomics, so S and dP are computed once (5 tile products, not 7);
 * the order of the atomic sums varies from run to run. dS passes through shared memory
 * transposed (row per query: the A operand of dS K), DSS bf16 per row (8 of padding). */
#define TC_DSS (TC_BKV + 8)

/* This warp's dS^T fragments (keys 16w.., TC_KVQ queries) into ds, row per query, as bf16. */
__device__ __forceinline__ void store_ds_t(u32 *ds, const float dp[TC_KVQ / 8][4]) {
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    unsigned short *h = (unsigned short *)ds;
    for (int nt = 0; nt < TC_KVQ / 8; nt++)
        for (int e = 0; e < 4; e++) {
            int i = 8 * nt + 2 * t + (e & 1), key = 16 * w + g + 8 * (e >> 1);
            h[i * TC_DSS + key] = (unsigned short)bf16_bits(dp[nt][e]);
        }
}

/* Rows i0.. of dq32 (TC_KVQ queries of one head, rs floats apart) += dS (ds) K (ks, the block's
 * TC_BKV keys): warp w takes queries 16 (w & 1).. and half of the head dim; fp32 atomics, as
 * every key block adds into the same rows. */
template <int D>
__device__ __forceinline__ void dq_tile_atomic(float *dq32, const u32 *ds, const u32 *ks, int i0,
                                               int Tq, int64_t rs) {
    constexpr int NH = D / 16; /* n-tiles per warp */
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = 16 * (w & 1), d0 = (w >> 1) * NH;
    float acc[NH][4];
    for (int j = 0; j < NH; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    for (int kk = 0; kk < TC_BKV / 16; kk++) {
        u32 a[4];
        load_a(a, ds, TC_DSS, r0, kk);
        for (int j = 0; j < NH; j++) {
            u32 bf[2];
            load_bt(bf, ks, D + 8, d0 + j, kk);
            mma16816(acc[j], a, bf);
        }
    }
    for (int j = 0; j < NH; j++)
        for (int e = 0; e < 4; e++) {
            int row = i0 + r0 + g + 8 * (e >> 1), col = 8 * (d0 + j) + 2 * t + (e & 1);
            if (row < Tq) atomicAdd(&dq32[row * rs + col], acc[j][e]);
        }
}

/* ---------------------------------------------------------------- backward: dk, dv */

/* dk(B,Tk,Hkv,D) += scale sum_i dS_ij q_i and dv += sum_i P_ij dout_i over the queries of every
 * head of the kv head's group (either may be NULL). Grid: B x Hkv x ceil(Tk/64) blocks, dynamic
 * shared memory dkdv_smem. DQ (the one pass): also dq32(B,Tq,H,D) += sum_j dS_ij k_j (unscaled)
 * by atomics, with bwd1_smem (the dS tile after the others). */
template <int D, typename T, bool DQ>
__global__ void __launch_bounds__(TC_THREADS)
    k_tc_dkdv(act *dk_, act *dv_, float *dq32, const act *dout_, const float *lse, const float *Di,
              const act *q_, const act *k_, const act *v_, int Tq, int Tk, int H, int Hkv,
              const int32_t *q_pos, const int32_t *k_pos, int causal, const int32_t *q_start,
              float scale, int nkt) {
    T *dk = (T *)dk_, *dv = (T *)dv_;
    const T *dout = (const T *)dout_, *q = (const T *)q_, *k = (const T *)k_, *v = (const T *)v_;
    constexpr int NK = D / 16, ND = D / 8, NT = TC_KVQ / 8, RS = D + 8;
    extern __shared__ float sm[];    /* 16-byte aligned; every tile a multiple of 16 bytes */
    u32 *ks = (u32 *)sm;             /* the block's K rows: A operand of S^T = K Q^T */
    u32 *vs = ks + TC_BKV * RS / 2;  /* its V rows: A operand of dP^T = V dO^T */
    u32 *qs_ = vs + TC_BKV * RS / 2; /* query tile rows: B of S^T, read transposed for dK */
    u32 *os = qs_ + TC_KVQ * RS / 2; /* dout tile rows: B of dP^T, read transposed for dV */
    u32 *ds = os + TC_KVQ * RS / 2;  /* DQ: dS, row per query (the A operand of dS K) */
    __shared__ int kpos[TC_BKV], qpos[TC_KVQ], qsp[TC_KVQ];
    __shared__ float l2s[TC_KVQ], dis[TC_KVQ];
    const int kt = (int)(blockIdx.x % nkt), hk = (int)(blockIdx.x / nkt % Hkv);
    const int b = (int)(blockIdx.x / nkt / Hkv), G = H / Hkv;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int j0 = kt * TC_BKV, c0 = j0 + 16 * w + g, c1 = c0 + 8; /* this thread's two keys */
    const int64_t qst = (int64_t)H * D, kvs = (int64_t)Hkv * D;
    const float scale2 = scale * LOG2E;
    const T *kb = k + ((int64_t)b * Tk * Hkv + hk) * D, *vb = v + (kb - k);

    for (int j = threadIdx.x; j < TC_BKV; j += blockDim.x)
        kpos[j] = j0 + j < Tk ? posof(k_pos, j0 + j) : INT_MAX;
    fill_rows<D, T>(ks, kb, kvs, j0, TC_BKV, Tk);
    fill_rows<D, T>(vs, vb, kvs, j0, TC_BKV, Tk);
    __syncthreads();
    const int kp0 = kpos[16 * w + g], kp1 = kpos[16 * w + g + 8];
    const int kmin_block = tile_min(kpos, TC_BKV), kmin_warp = warp_min_int(min(kp0, kp1));

    float adk[ND][4], adv[ND][4];
    for (int dt = 0; dt < ND; dt++)
        for (int e = 0; e < 4; e++) adk[dt][e] = adv[dt][e] = 0.0f;
    for (int hq = hk * G; hq < (hk + 1) * G; hq++) {
        const T *qb = q + ((int64_t)b * Tq * H + hq) * D, *ob = dout + (qb - q);
        const float *lb = lse + ((int64_t)b * H + hq) * Tq, *db = Di + (lb - lse);
        for (int i0 = 0; i0 < Tq; i0 += TC_KVQ) {
            __syncthreads();
            for (int i = threadIdx.x; i < TC_KVQ; i += blockDim.x) {
                bool in = i0 + i < Tq;
                qpos[i] = in ? posof(q_pos, i0 + i) : INT_MIN;
                qsp[i] = doc_start(q_start, b, Tq, i0 + i);
                l2s[i] = in ? lb[i0 + i] * LOG2E : -INFINITY;
                dis[i] = in ? db[i0 + i] : 0.0f;
            }
            __syncthreads();
            const int qmax = tile_max(qpos, TC_KVQ);
            if (causal && qmax < kmin_block) continue;
            fill_rows<D, T>(qs_, qb, qst, i0, TC_KVQ, Tq);
            fill_rows<D, T>(os, ob, qst, i0, TC_KVQ, Tq);
            __syncthreads();
            /* a warp whose keys no query of the tile sees skips its products; under DQ it keeps
             * dS = 0 and joins the dQ step */
            const bool idle = causal && qmax < kmin_warp;
            if (idle && !DQ) continue;

            float s[NT][4], dp[NT][4]; /* S^T and dP^T: 16 keys x 32 queries */
            for (int nt = 0; nt < NT; nt++)
                for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
            if (!idle) {
                for (int kk = 0; kk < NK; kk++) {
                    u32 ka[4], va[4];
                    load_a(ka, ks, RS, 16 * w, kk);
                    load_a(va, vs, RS, 16 * w, kk);
                    for (int nt = 0; nt < NT; nt++) {
                        u32 bf[2];
                        load_b(bf, qs_, RS, nt, kk);
                        mma16816(s[nt], ka, bf);
                        load_b(bf, os, RS, nt, kk);
                        mma16816(dp[nt], va, bf);
                    }
                }
                for (int nt = 0; nt < NT; nt++)
                    for (int e = 0; e < 4; e++) {
                        int i = 8 * nt + 2 * t + (e & 1);
                        bool vis = i0 + i < Tq && c0 + 8 * (e >> 1) < Tk &&
                                   (!causal || (e < 2 ? kp0 : kp1) <= qpos[i]) &&
                                   (e < 2 ? kp0 : kp1) >= qsp[i];
                        float p =
                            vis && l2s[i] != -INFINITY ? exp2f(s[nt][e] * scale2 - l2s[i]) : 0.0f;
                        s[nt][e] = p;
                        dp[nt][e] = p * (dp[nt][e] - dis[i]);
                    }
                for (int kk = 0; kk < TC_KVQ / 16; kk++) { /* dV += P^T dO, dK += dS^T Q */
                    u32 pa[4], da[4];
                    acc_to_a(pa, s[2 * kk], s[2 * kk + 1]);
                    acc_to_a(da, dp[2 * kk], dp[2 * kk + 1]);
                    for (int dt = 0; dt < ND; dt++) {
                        u32 bf[2];
                        load_bt(bf, os, RS, dt, kk);
                        mma16816(adv[dt], pa, bf);
                        load_bt(bf, qs_, RS, dt, kk);
                        mma16816(adk[dt], da, bf);
                    }
                }
            }
            if (!DQ) continue;
            store_ds_t(ds, dp);
            __syncthreads();
            dq_tile_atomic<D>(dq32 + ((int64_t)b * Tq * H + hq) * D, ds, ks, i0, Tq, qst);
        }
    }
    T *dkb = dk ? dk + ((int64_t)b * Tk * Hkv + hk) * D : NULL;
    T *dvb = dv ? dv + ((int64_t)b * Tk * Hkv + hk) * D : NULL;
    for (int dt = 0; dt < ND; dt++) {
        int c = 8 * dt + 2 * t;
        for (int e = 0; e < 4; e++) {
            int key = e < 2 ? c0 : c1, col = c + (e & 1);
            if (key >= Tk) continue;
            if (dkb) add_act(dkb, key * kvs + col, scale * adk[dt][e]);
            if (dvb) add_act(dvb, key * kvs + col, adv[dt][e]);
        }
    }
}

/* dq += scale dq32, elementwise over n. */
template <typename T>
__global__ void k_tc_dq_finish(act *dq_, const float *dq32, float scale, int64_t n) {
    T *dq = (T *)dq_;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        add_act(dq, i, scale * dq32[i]);
}

/* ---------------------------------------------------------------- launchers */

int cuda_attention_tc_supported(int D) { return D == 16 || D == 32 || D == 64 || D == 128; }

static size_t dkdv_smem(int D) { return (size_t)(2 * TC_BKV * (D + 8) + 2 * TC_KVQ * (D + 8)) * 2; }
static size_t bwd1_smem(int D) { return dkdv_smem(D) + (size_t)TC_KVQ * TC_DSS * 2; }

template <int D, typename T>
static void tc_fwd(const ust_ops *o, act *out, float *lse, const act *q, const act *k, const act *v,
                   int B, int Tq, int Tk, int H, int Hkv, const int32_t *q_pos,
                   const int32_t *k_pos, int causal, const int32_t *q_start) {
    int nqt = (Tq + TC_BQ - 1) / TC_BQ;
    int64_t blocks = (int64_t)B * H * nqt;
    UST_ASSERT(blocks < INT_MAX, "attention grid too large (%lld blocks)", (long long)blocks);
    float scale2 = LOG2E / sqrtf((float)D);
    size_t smem = fwd_smem(D, sizeof(T));
    cuda_smem_optin(o, k_tc_fwd<D, T>, smem);
    k_tc_fwd<D, T><<<(int)blocks, TC_THREADS, smem, STREAM(o)>>>(
        out, lse, q, k, v, Tq, Tk, H, Hkv, q_pos, k_pos, causal, q_start, scale2, nqt);
    CK_LAUNCH();
}

/* The one-pass backward (k_tc_dkdv<DQ>): dq accumulates in an fp32 scratch copy (SCR_S: the GEMM
 * attention's, unused on this path), zeroed, then added into dq scaled. */
template <int D, typename T>
static void tc_bwd1(const ust_ops *o, act *dq, act *dk, act *dv, const act *dout, const float *lse,
                    const float *Di, const act *q, const act *k, const act *v, int B, int Tq,
                    int Tk, int H, int Hkv, const int32_t *q_pos, const int32_t *k_pos, int causal,
                    const int32_t *q_start) {
    float scale = 1.0f / sqrtf((float)D);
    int64_t nq = (int64_t)B * Tq * H * D, nkt = (Tk + TC_BKV - 1) / TC_BKV, blocks = B * Hkv * nkt;
    UST_ASSERT(blocks < INT_MAX, "attention grid too large (%lld blocks)", (long long)blocks);
    float *dq32 = (float *)cuda_scratch(o, SCR_S, (size_t)nq * sizeof(float));
    CK(cudaMemsetAsync(dq32, 0, (size_t)nq * sizeof(float), STREAM(o)));
    size_t smem = bwd1_smem(D);
    cuda_smem_optin(o, k_tc_dkdv<D, T, true>, smem);
    k_tc_dkdv<D, T, true><<<(int)blocks, TC_THREADS, smem, STREAM(o)>>>(
        dk, dv, dq32, dout, lse, Di, q, k, v, Tq, Tk, H, Hkv, q_pos, k_pos, causal, q_start, scale,
        (int)nkt);
    CK_LAUNCH();
    k_tc_dq_finish<T><<<grid_for(nq, 256), 256, 0, STREAM(o)>>>(dq, dq32, scale, nq);
    CK_LAUNCH();
}

template <int D, typename T>
static void tc_bwd(const ust_ops *o, act *dq, act *dk, act *dv, const act *dout, const float *lse,
                   const float *Di, const act *q, const act *k, const act *v, int B, int Tq, int Tk,
                   int H, int Hkv, const int32_t *q_pos, const int32_t *k_pos, int causal,
                   const int32_t *q_start) {
    if (o->nondeterministic && dq) /* run.deterministic: false */
        return tc_bwd1<D, T>(o, dq, dk, dv, dout, lse, Di, q, k, v, B, Tq, Tk, H, Hkv, q_pos, k_pos,
                             causal, q_start);
    float scale = 1.0f / sqrtf((float)D);
    if (dq) {
        int nqt = (Tq + TC_BQ - 1) / TC_BQ;
        int64_t blocks = (int64_t)B * H * nqt;
        UST_ASSERT(blocks < INT_MAX, "attention grid too large (%lld blocks)", (long long)blocks);
        k_tc_dq<D, T><<<(int)blocks, TC_THREADS, 0, STREAM(o)>>>(
            dq, dout, lse, Di, q, k, v, Tq, Tk, H, Hkv, q_pos, k_pos, causal, q_start, scale, nqt);
        CK_LAUNCH();
    }
    if (dk || dv) {
        int nkt = (Tk + TC_BKV - 1) / TC_BKV;
        int64_t blocks = (int64_t)B * Hkv * nkt;
        UST_ASSERT(blocks < INT_MAX, "attention grid too large (%lld blocks)", (long long)blocks);
        size_t smem = dkdv_smem(D);
        cuda_smem_optin(o, k_tc_dkdv<D, T, false>, smem);
        k_tc_dkdv<D, T, false><<<(int)blocks, TC_THREADS, smem, STREAM(o)>>>(
            dk, dv, NULL, dout, lse, Di, q, k, v, Tq, Tk, H, Hkv, q_pos, k_pos, causal, q_start,
            scale, nkt);
        CK_LAUNCH();
    }
}

/* The kernels for head dim D and the backend's activation type. */
template <int D>
static void tc_fwd_d(const ust_ops *o, act *out, float *lse, const act *q, const act *k,
                     const act *v, int B, int Tq, int Tk, int H, int Hkv, const int32_t *q_pos,
                     const int32_t *k_pos, int causal, const int32_t *q_start) {
    if (o->act_size == 2)
        tc_fwd<D, bf16>(o, out, lse, q, k, v, B, Tq, Tk, H, Hkv, q_pos, k_pos, causal, q_start);
    else
        tc_fwd<D, float>(o, out, lse, q, k, v, B, Tq, Tk, H, Hkv, q_pos, k_pos, causal, q_start);
}

template <int D>
static void tc_bwd_d(const ust_ops *o, act *dq, act *dk, act *dv, const act *dout, const float *lse,
                     const float *Di, const act *q, const act *k, const act *v, int B, int Tq,
                     int Tk, int H, int Hkv, const int32_t *q_pos, const int32_t *k_pos, int causal,
                     const int32_t *q_start) {
    if (o->act_size == 2)
        tc_bwd<D, bf16>(o, dq, dk, dv, dout, lse, Di, q, k, v, B, Tq, Tk, H, Hkv, q_pos, k_pos,
                        causal, q_start);
    else
        tc_bwd<D, float>(o, dq, dk, dv, dout, lse, Di, q, k, v, B, Tq, Tk, H, Hkv, q_pos, k_pos,
                         causal, q_start);
}

void cuda_attention_tc_fwd(const ust_ops *o, act *out, float *lse, const act *q, const act *k,
                           const act *v, int B, int Tq, int Tk, int H, int Hkv, int D,
                           const int32_t *q_pos, const int32_t *k_pos, int causal,
                           const int32_t *q_start) {
#define TC_FWD(DD)                                                                                 \
    tc_fwd_d<DD>(o, out, lse, q, k, v, B, Tq, Tk, H, Hkv, q_pos, k_pos, causal, q_start)
    switch (D) {
    case 16:
        TC_FWD(16);
        break;
    case 32:
        TC_FWD(32);
        break;
    case 64:
        TC_FWD(64);
        break;
    case 128:
        TC_FWD(128);
        break;
    default:
        ust_fatal(UST_EXIT_RUNTIME, "tensor-core attention has no kernel for D=%d", D);
    }
#undef TC_FWD
}

void cuda_attention_tc_bwd(const ust_ops *o, act *dq, act *dk, act *dv, const act *dout,
                           const float *lse, const float *Di, const act *q, const act *k,
                           const act *v, int B, int Tq, int Tk, int H, int Hkv, int D,
                           const int32_t *q_pos, const int32_t *k_pos, int causal,
                           const int32_t *q_start) {
#define TC_BWD(DD)                                                                                 \
    tc_bwd_d<DD>(o, dq, dk, dv, dout, lse, Di, q, k, v, B, Tq, Tk, H, Hkv, q_pos, k_pos, causal,   \
                 q_start)
    switch (D) {
    case 16:
        TC_BWD(16);
        break;
    case 32:
        TC_BWD(32);
        break;
    case 64:
        TC_BWD(64);
        break;
    case 128:
        TC_BWD(128);
        break;
    default:
        ust_fatal(UST_EXIT_RUNTIME, "tensor-core attention has no kernel for D=%d", D);
    }
#undef TC_BWD
}
