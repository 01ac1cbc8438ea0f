/* strict_kernels: planted bugs for the emulator's strict mode (EMU_STRICT=1,
 * test/sh/emu_strict.sh). `strict_kernels KIND bug` runs a kernel with one bug of that kind,
 * `strict_kernels KIND ok` the same kernel without it; the correct run prints "ok", the buggy one
 * must be reported. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ptx.cuh"
#include <stdio.h>
#include <string.h>

/* a thread reads its neighbour's word before the barrier that orders the write */
__global__ void k_neighbour(float *out, int bug) {
    __shared__ float s[64];
    int t = threadIdx.x;
    s[t] = 0.0f;
    __syncthreads();
    s[t] = (float)t;
    if (!bug) __syncthreads();
    out[blockIdx.x * 64 + t] = s[(t + 1) % 64];
}

/* a thread overwrites a word its neighbour read in the same barrier interval */
__global__ void k_overwrite(float *out, int bug) {
    __shared__ float s[64];
    int t = threadIdx.x;
    s[t] = (float)t;
    __syncthreads();
    float v = s[(t + 1) % 64];
    if (!bug) __syncthreads();
    s[t] = 2.0f * v;
    __syncthreads();
    out[t] = s[t];
}

/* the second barrier of a loop over one tile is missing */
__global__ void k_loop(float *out, int bug) {
    __shared__ float s[64];
    int t = threadIdx.x;
    float acc = 0.0f;
    for (int i = 0; i < 2; i++) {
        s[t] = (float)(t + i);
        __syncthreads();
        acc += s[63 - t];
        if (!bug) __syncthreads();
    }
    out[t] = acc;
}

/* lanes of one warp exchange through shared memory without __syncwarp */
__global__ void k_warp(float *out, int bug) {
    __shared__ float s[32];
    int t = threadIdx.x;
    s[t] = 0.0f;
    __syncthreads();
    s[t] = (float)t;
    if (!bug) __syncwarp();
    out[t] = s[t ^ 1];
}

/* every block writes the same global word */
__global__ void k_blocks(float *out, int bug) {
    if (threadIdx.x == 0) out[bug ? 0 : blockIdx.x] = (float)blockIdx.x;
}

/* blocks read a word block 0 writes in the same launch */
__global__ void k_block_read(float *out, int bug) {
    if (threadIdx.x == 0) {
        if (blockIdx.x == 0)
            out[0] = 1.0f;
        else
            out[blockIdx.x] = bug ? out[0] : 1.0f;
    }
}

/* blocks accumulate into the same words: atomics commute, a plain += is a race */
__global__ void k_atomic(float *out, int bug) {
    const int t = threadIdx.x;
    if (bug)
        out[t] += 1.0f;
    else
        atomicAdd(&out[t], 1.0f);
}

/* blocks accumulate atomically while the last one also stores plainly into the same words */
__global__ void k_atomic_mixed(float *out, int bug) {
    const int t = threadIdx.x;
    if (bug && blockIdx.x == gridDim.x - 1)
        out[t] = 0.0f;
    else
        atomicAdd(&out[t], 1.0f);
}

/* half the tile is never written before it is read */
__global__ void k_uninit(float *out, int bug) {
    __shared__ float s[64];
    int t = threadIdx.x;
    if (!bug || t < 32) s[t] = 1.0f;
    __syncthreads();
    out[t] = s[63 - t];
}

/* dynamic shared memory, missing barrier */
__global__ void k_dynamic(float *out, int bug) {
    extern __shared__ float sm[];
    int t = threadIdx.x;
    sm[t] = 0.0f;
    __syncthreads();
    sm[t] = (float)t;
    if (!bug) __syncthreads();
    out[t] = sm[63 - t];
}

/* half the warp has returned when the other half shuffles with a full mask */
__global__ void k_shfl_exit(float *out, int bug) {
    int t = threadIdx.x;
    float v = (float)t;
    if (bug && t >= 16) return;
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    out[t] = v;
}

/* half the warp shuffles while the other half waits at __syncwarp */
__global__ void k_shfl_diverged(float *out, int bug) {
    int t = threadIdx.x;
    float v = (float)t;
    if (bug && t >= 16)
        __syncwarp();
    else
        v += __shfl_xor_sync(0xffffffffu, v, 1);
    out[t] = v;
}

/* 64 KiB of dynamic shared memory: each kernel needs its own opt-in */
__global__ void k_big_a(float *out, int bug) {
    extern __shared__ float sm[];
    sm[threadIdx.x] = 1.0f;
    out[threadIdx.x] = sm[threadIdx.x] + (float)bug;
}
__global__ void k_big_b(float *out, int bug) {
    extern __shared__ float sm[];
    sm[threadIdx.x] = 2.0f;
    out[threadIdx.x] = sm[threadIdx.x] + (float)bug;
}

/* 32 KiB static and up to 200 KiB dynamic: over sm_90's 227 KiB a block may have */
__global__ void k_total(float *out, int bug) {
    __shared__ float st[8192];
    extern __shared__ float sm[];
    st[threadIdx.x] = 1.0f;
    sm[threadIdx.x] = st[threadIdx.x];
    out[threadIdx.x] = sm[threadIdx.x] + (float)bug;
}

/* a read past the end of a 100-element buffer, into the allocator's slack */
__global__ void k_fence(float *dst, const float *src, int n) {
    int t = threadIdx.x;
    if (t < n) dst[t] = src[t];
}

/* cp.async in two groups (the second's rows past 16 zero-filled): after wait_group 1 the first
 * group has landed and the second may not have; the bug reads the second before wait_group 0 */
__global__ void k_cp_async(float *out, const float *src, int bug) {
    __shared__ uint4 s[2][32];
    const int t = threadIdx.x, j = (4 * t + 5) % 128; /* another thread's word */
    ptx_cp_async16(&s[0][t], src + 4 * t, 16);
    ptx_cp_async_commit();
    ptx_cp_async16(&s[1][t], src + 4 * (32 + t), t < 16 ? 16 : 0);
    ptx_cp_async_commit();
    ptx_cp_async_wait<1>();
    __syncthreads();
    const float a = ((const float *)s[0])[j];
    float b = bug ? ((const float *)s[1])[j] : 0.0f;
    ptx_cp_async_wait<0>();
    __syncthreads();
    b += ((const float *)s[1])[j];
    out[t] = a, out[32 + t] = b;
}

/* ldmatrix is a warp collective: the bug leaves lanes 16..31 out (they have returned) */
__global__ void k_ldsm_diverged(float *out, int bug) {
    __shared__ uint4 s[32];
    const int l = threadIdx.x;
    s[l] = make_uint4(l, l, l, l);
    __syncthreads();
    if (bug && l >= 16) return;
    uint32_t r[4];
    ptx_ldsm_x4(r, &s[l]);
    out[l] = (float)(r[0] + r[1] + r[2] + r[3]);
}

static int cp_async_run(int bug) {
    float h[256], o[64], *src, *out;
    for (int i = 0; i < 256; i++) h[i] = (float)(i + 1);
    cudaMalloc(&src, sizeof h);
    cudaMalloc(&out, sizeof o);
    cudaMemcpy(src, h, sizeof h, cudaMemcpyHostToDevice);
    k_cp_async<<<1, 32>>>(out, src, bug);
    cudaMemcpy(o, out, sizeof o, cudaMemcpyDeviceToHost);
    for (int t = 0; t < 32; t++) {
        const int j = (4 * t + 5) % 128;
        const float a = h[j], b = j < 64 ? h[128 + j] : 0.0f; /* rows 16..31: zeros */
        if (o[t] != a || o[32 + t] != b) {
            printf("thread %d: %g %g, want %g %g\n", t, o[t], o[32 + t], a, b);
            return 1;
        }
    }
    return 0;
}

/* float -> bf16 as the hardware rounds: NaNs become the canonical 0x7FFF (not Inf, not -0) */
static int bf16_rounding(void) {
    const uint32_t in[] = {0x7F800001u, 0x7FFFFFFFu, 0xFFC00000u, 0xFF800001u,
                           0x7F800000u, 0x3F808000u, 0x3F818000u, 0x7F7FFFFFu};
    const uint16_t want[] = {0x7FFF, 0x7FFF, 0x7FFF, 0x7FFF, 0x7F80, 0x3F80, 0x3F82, 0x7F80};
    int bad = 0;
    for (int i = 0; i < 8; i++) {
        float f;
        memcpy(&f, &in[i], 4);
        uint16_t got = __bfloat16_as_ushort(__float2bfloat16_rn(f));
        if (got != want[i]) {
            printf("0x%08x -> 0x%04x, want 0x%04x\n", in[i], got, want[i]);
            bad = 1;
        }
    }
    return bad;
}

#ifdef MMA_TEST
/* mma.m16n8k16 (bf16 in, fp32 accumulate) against the PTX ISA's fragment tables, written here
 * from the ISA document, not from attention_tc.cu's reading: with g = lane / 4 and t = lane % 4,
 * A element e (0..7, two per register, the lower in the low half) sits at row g + 8 ((e / 2) % 2),
 * column 2t + e % 2 + 8 (e / 4); B element e (0..3) at row 2t + e % 2 + 8 (e / 2), column g;
 * C and D element e (0..3) at row g + 8 (e / 2), column 2t + e % 2. */
#include "attention_tc.cu"
__device__ int mma_a_row(int g, int e) { return g + 8 * ((e >> 1) & 1); }
__device__ int mma_a_col(int t, int e) { return 2 * t + (e & 1) + 8 * (e >> 2); }
__device__ int mma_b_row(int t, int e) { return 2 * t + (e & 1) + 8 * (e >> 1); }
__device__ int mma_c_row(int g, int e) { return g + 8 * (e >> 1); }
__device__ int mma_c_col(int t, int e) { return 2 * t + (e & 1); }
__device__ u32 mma_bf(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }

/* A (16x16) and B (16x8) row-major, C (16x8) the accumulator in, D out */
__global__ void k_mma(float *D, const float *A, const float *B, const float *C) {
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    u32 a[4], b[2];
    float d[4];
    for (int r = 0; r < 4; r++)
        a[r] = mma_bf(A[mma_a_row(g, 2 * r) * 16 + mma_a_col(t, 2 * r)]) |
               mma_bf(A[mma_a_row(g, 2 * r + 1) * 16 + mma_a_col(t, 2 * r + 1)]) << 16;
    for (int r = 0; r < 2; r++)
        b[r] = mma_bf(B[mma_b_row(t, 2 * r) * 8 + g]) | mma_bf(B[mma_b_row(t, 2 * r + 1) * 8 + g])
                                                            << 16;
    for (int e = 0; e < 4; e++) d[e] = C[mma_c_row(g, e) * 8 + mma_c_col(t, e)];
    mma16816(d, a, b);
    for (int e = 0; e < 4; e++) D[mma_c_row(g, e) * 8 + mma_c_col(t, e)] = d[e];
}

/* ldmatrix.x4 against the PTX ISA's table for m8n8 .b16 fragments, written from the ISA: lane i
 * names row i % 8 of matrix i / 8; lane l receives in register m matrix m's elements at row l / 4,
 * columns 2 (l % 4) and 2 (l % 4) + 1 (the first in the low half); .trans swaps rows and columns:
 * rows 2 (l % 4) and 2 (l % 4) + 1, column l / 4. The four matrices sit at a padded stride of 24
 * bf16 (48 bytes) in reversed order, so a wrong row or matrix number reads another element. */
__device__ u32 ldsm_el(int m, int r, int c) { return (u32)(m * 64 + r * 8 + c); }
__global__ void k_ldsm(int *bad) {
    __shared__ uint4 tile4[4 * 8 * 3];
    uint16_t *tile = (uint16_t *)tile4;
    const int l = threadIdx.x;
    for (int i = l; i < 4 * 8 * 24; i += 32) {
        const int m = 3 - i / 192, r = i / 24 % 8, c = i % 24;
        tile[i] = c < 8 ? (uint16_t)ldsm_el(m, r, c) : (uint16_t)0xFFFF;
    }
    __syncthreads();
    const void *row = tile + (3 - l / 8) * 192 + (l % 8) * 24;
    u32 r[4], rt[4];
    ptx_ldsm_x4(r, row);
    ptx_ldsm_x4_t(rt, row);
    for (int m = 0; m < 4; m++) {
        const u32 want = ldsm_el(m, l / 4, 2 * (l % 4)) | ldsm_el(m, l / 4, 2 * (l % 4) + 1) << 16;
        const u32 want_t = ldsm_el(m, 2 * (l % 4), l / 4) | ldsm_el(m, 2 * (l % 4) + 1, l / 4)
                                                                << 16;
        if (r[m] != want || rt[m] != want_t) bad[l] = 1 + m;
    }
}

/* attention_tc.cu's ldmatrix fragment loads feeding mma16816: A (16x16) row-major for ldsm_a, B
 * (16x16, two n-tiles) stored transposed for ldsm_b2 (as the K tile) or row-major for ldsm_bt2
 * (as the V tile), shared rows of 24 bf16; D = A B exactly (small integers) */
__global__ void k_mma_ldsm(float *D, const float *A, const float *B, int trans) {
    __shared__ uint4 a4[16 * 3], b4[16 * 3];
    uint16_t *as = (uint16_t *)a4, *bs = (uint16_t *)b4;
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    for (int i = lane; i < 256; i += 32) {
        const int r = i / 16, c = i % 16;
        as[r * 24 + c] = (uint16_t)mma_bf(A[i]);
        bs[trans ? r * 24 + c : c * 24 + r] = (uint16_t)mma_bf(B[i]);
    }
    __syncthreads();
    u32 a[4], b0[2], b1[2];
    float d0[4] = {0, 0, 0, 0}, d1[4] = {0, 0, 0, 0};
    ldsm_a(a, (const u32 *)as, 24, 0, 0);
    if (trans)
        ldsm_bt2(b0, b1, (const u32 *)bs, 24, 0, 0);
    else
        ldsm_b2(b0, b1, (const u32 *)bs, 24, 0, 0);
    mma16816(d0, a, b0);
    mma16816(d1, a, b1);
    for (int e = 0; e < 4; e++) {
        D[mma_c_row(g, e) * 16 + mma_c_col(t, e)] = d0[e];
        D[mma_c_row(g, e) * 16 + 8 + mma_c_col(t, e)] = d1[e];
    }
}

static int mma_ldsm(int trans) {
    float A[256], B[256], D[256], *dA, *dB, *dD;
    for (int i = 0; i < 256; i++) A[i] = (float)((i * 7) % 9 - 4), B[i] = (float)((i * 5) % 7 - 3);
    cudaMalloc(&dA, sizeof A);
    cudaMalloc(&dB, sizeof B);
    cudaMalloc(&dD, sizeof D);
    cudaMemcpy(dA, A, sizeof A, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, B, sizeof B, cudaMemcpyHostToDevice);
    k_mma_ldsm<<<1, 32>>>(dD, dA, dB, trans);
    cudaMemcpy(D, dD, sizeof D, cudaMemcpyDeviceToHost);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) {
            float want = 0;
            for (int k = 0; k < 16; k++) want += A[r * 16 + k] * B[k * 16 + c];
            if (D[r * 16 + c] != want) {
                printf("%s: D[%d][%d] = %g, want %g\n", trans ? "ldsm_bt2" : "ldsm_b2", r, c,
                       D[r * 16 + c], want);
                return 1;
            }
        }
    return 0;
}

static int ldsm_table(void) {
    int h[32] = {0}, *d;
    cudaMalloc(&d, sizeof h);
    cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
    k_ldsm<<<1, 32>>>(d);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    for (int l = 0; l < 32; l++)
        if (h[l]) {
            printf("ldmatrix: lane %d register %d differs from the PTX table\n", l, h[l] - 1);
            return 1;
        }
    return 0;
}

/* small integers: every product and sum is exact in bf16 and fp32 */
static int mma_table(void) {
    float A[256], B[128], C[128], D[128], *dA, *dB, *dC, *dD;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) A[r * 16 + c] = (float)((r * 3 + c * 5) % 7 - 3);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 8; c++) B[r * 8 + c] = (float)((r * 2 + c * 3) % 5 - 2);
    for (int i = 0; i < 128; i++) C[i] = (float)(i % 11 - 5);
    cudaMalloc(&dA, sizeof A);
    cudaMalloc(&dB, sizeof B);
    cudaMalloc(&dC, sizeof C);
    cudaMalloc(&dD, sizeof D);
    cudaMemcpy(dA, A, sizeof A, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, B, sizeof B, cudaMemcpyHostToDevice);
    cudaMemcpy(dC, C, sizeof C, cudaMemcpyHostToDevice);
    k_mma<<<1, 32>>>(dD, dA, dB, dC);
    cudaMemcpy(D, dD, sizeof D, cudaMemcpyDeviceToHost);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 8; c++) {
            float want = C[r * 8 + c];
            for (int k = 0; k < 16; k++) want += A[r * 16 + k] * B[k * 8 + c];
            if (D[r * 8 + c] != want) {
                printf("D[%d][%d] = %g, want %g\n", r, c, D[r * 8 + c], want);
                return 1;
            }
        }
    return 0;
}
#endif

int main(int argc, char **argv) {
    const char *m = argc > 1 ? argv[1] : "";
#ifdef MMA_TEST
    if (!strcmp(m, "mma")) {
        if (mma_table() || ldsm_table() || mma_ldsm(0) || mma_ldsm(1)) return 1;
        printf("ok\n");
        return 0;
    }
#endif
    if (!strcmp(m, "bf16")) {
        if (bf16_rounding()) return 1;
        printf("ok\n");
        return 0;
    }
    int bug = argc > 2 && !strcmp(argv[2], "bug");
    float *d;
    cudaMalloc(&d, 64 * 4 * sizeof(float));
    if (!strcmp(m, "neighbour"))
        k_neighbour<<<2, 64>>>(d, bug);
    else if (!strcmp(m, "overwrite"))
        k_overwrite<<<1, 64>>>(d, bug);
    else if (!strcmp(m, "loop"))
        k_loop<<<1, 64>>>(d, bug);
    else if (!strcmp(m, "warp"))
        k_warp<<<1, 32>>>(d, bug);
    else if (!strcmp(m, "blocks"))
        k_blocks<<<4, 32>>>(d, bug);
    else if (!strcmp(m, "block_read"))
        k_block_read<<<4, 32>>>(d, bug);
    else if (!strcmp(m, "atomic") || !strcmp(m, "atomic_mixed")) {
        float h[32];
        cudaMemset(d, 0, 32 * sizeof(float));
        if (!strcmp(m, "atomic"))
            k_atomic<<<4, 32>>>(d, bug);
        else
            k_atomic_mixed<<<4, 32>>>(d, bug);
        cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
        for (int i = 0; i < 32; i++)
            if (!bug && h[i] != 4.0f) return printf("out[%d] = %g, want 4\n", i, h[i]), 1;
    } else if (!strcmp(m, "uninit"))
        k_uninit<<<1, 64>>>(d, bug);
    else if (!strcmp(m, "dynamic"))
        k_dynamic<<<1, 64, 64 * sizeof(float)>>>(d, bug);
    else if (!strcmp(m, "shfl_exit"))
        k_shfl_exit<<<1, 32>>>(d, bug);
    else if (!strcmp(m, "shfl_diverged"))
        k_shfl_diverged<<<1, 32>>>(d, bug);
    else if (!strcmp(m, "smem_optin")) {
        cudaFuncSetAttribute(k_big_a, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536);
        if (!bug) cudaFuncSetAttribute(k_big_b, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536);
        k_big_a<<<1, 32, 65536>>>(d, 0);
        k_big_b<<<1, 32, 65536>>>(d, 0);
    } else if (!strcmp(m, "smem_total")) {
        int dyn = (bug ? 200 : 190) * 1024;
        cudaFuncSetAttribute(k_total, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn);
        k_total<<<1, 32, dyn>>>(d, 0);
    } else if (!strcmp(m, "fence")) {
        float *a, *b;
        cudaMalloc(&a, 100 * sizeof(float));
        cudaMalloc(&b, 128 * sizeof(float));
        k_fence<<<1, 128>>>(b, a, bug ? 101 : 100);
    } else if (!strcmp(m, "ldsm_diverged")) {
        k_ldsm_diverged<<<1, 32>>>(d, bug);
    } else if (!strcmp(m, "cp_async")) {
        if (cp_async_run(bug)) return 1;
    } else
        return 2;
    cudaDeviceSynchronize();
    printf("ok\n");
    return 0;
}
