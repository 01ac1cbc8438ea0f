/* ptx: the sm_80 data-movement instructions of the tensor-core kernels, one wrapper each, with
 * the PTX ISA's semantics on every build: inline PTX under nvcc for sm_80+; the emulator's own
 * implementation (emu_cuda.h: ldmatrix at a warp sync point, cp.async deferred to the wait_group
 * that retires it, checked by strict mode); plain loads and shuffles on older GPUs.
 * - ptx_ldsm_x4[_t](r, row): ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16. Every lane of
 *   the warp names one 16-byte aligned row: lane 8m + i row i of matrix m. Lane l gets in r[m]
 *   matrix m's (row l / 4, columns 2 (l % 4), +1); .trans: (rows 2 (l % 4), +1; column l / 4).
 * - ptx_cp_async16(dst, src, n): cp.async.cg.shared.global of 16 bytes, the first n (16 or 0)
 *   from src, the rest zeros; ptx_cp_async_commit() closes a group; ptx_cp_async_wait<N>() waits
 *   until at most the N newest committed groups are in flight. */
#ifndef UST_PTX_CUH
#define UST_PTX_CUH

#include <stdint.h>

#if defined(UST_EMU_CUDA_H) /* the emulator build: emu_cuda.h implements the semantics */

__device__ __forceinline__ void ptx_ldsm_x4(uint32_t r[4], const void *row) {
    emu_ldmatrix_x4(r, row, false);
}
__device__ __forceinline__ void ptx_ldsm_x4_t(uint32_t r[4], const void *row) {
    emu_ldmatrix_x4(r, row, true);
}
__device__ __forceinline__ void ptx_cp_async16(void *dst, const void *src, int n) {
    emu_cp_async16(dst, src, n);
}
__device__ __forceinline__ void ptx_cp_async_commit() { emu_cp_async_commit(); }
template <int N> __device__ __forceinline__ void ptx_cp_async_wait() { emu_cp_async_wait(N); }

#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

__device__ __forceinline__ void ptx_ldsm_x4(uint32_t r[4], const void *row) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ptx_ldsm_x4_t(uint32_t r[4], const void *row) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ptx_cp_async16(void *dst, const void *src, int n) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
}
__device__ __forceinline__ void ptx_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/* "memory": shared-memory reads of the landed data stay after the wait */
template <int N> __device__ __forceinline__ void ptx_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#else /* GPUs before sm_80 (and nvcc's host pass): the same results from plain instructions */

__device__ __forceinline__ void ptx_ldsm_gather(uint32_t r[4], const void *row, bool trans) {
    const int l = threadIdx.x & 31;
    for (int m = 0; m < 4; m++) {
        const char *p0 = (const char *)__shfl_sync(0xffffffffu, (uintptr_t)row,
                                                   trans ? 8 * m + 2 * (l & 3) : 8 * m + l / 4);
        const char *p1 =
            (const char *)__shfl_sync(0xffffffffu, (uintptr_t)row, 8 * m + 2 * (l & 3) + 1);
        r[m] = trans ? (uint32_t) * (const uint16_t *)(p0 + 2 * (l / 4)) |
                           (uint32_t) * (const uint16_t *)(p1 + 2 * (l / 4)) << 16
                     : *(const uint32_t *)(p0 + 4 * (l & 3));
    }
}
__device__ __forceinline__ void ptx_ldsm_x4(uint32_t r[4], const void *row) {
    ptx_ldsm_gather(r, row, false);
}
__device__ __forceinline__ void ptx_ldsm_x4_t(uint32_t r[4], const void *row) {
    ptx_ldsm_gather(r, row, true);
}
__device__ __forceinline__ void ptx_cp_async16(void *dst, const void *src, int n) {
    *(uint4 *)dst = n ? *(const uint4 *)src : make_uint4(0u, 0u, 0u, 0u);
}
__device__ __forceinline__ void ptx_cp_async_commit() {}
template <int N> __device__ __forceinline__ void ptx_cp_async_wait() {}

#endif
#endif
