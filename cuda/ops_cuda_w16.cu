/* ops_cuda_w16: the bf16 copy of the fp32 parameters that AdamW writes as it updates them (bf16
 * on), so the linears' GEMMs read their weights as bf16 without rounding them before each use.
 * Rounding per use cost a pass over every weight (4 B read, 2 B written) in the forward and
 * again in the backward, per micro-batch, and a launch each; AdamW, which reads and writes
 * every parameter anyway, adds 2 B per parameter once per step (as llm.c keeps bf16 weights).
 * One copy per backend: of the buffer AdamW last updated (its `p`), element i of the copy is
 * bf16(p[i]). Only the parts AdamW wrote and nothing wrote since are valid (runs of elements);
 * every backend op that may write fp32 memory cuts its range out (cuda_w16_cut), a free or a
 * new buffer drops them all. Writes the backend does not see are the caller's to keep out of
 * the valid runs: NCCL into the parameters (ZeRO's gathers write only other ranks' pieces,
 * which this rank's AdamW did not update). Lookups are host-side and cheap (a few runs). */
#include "cuda_internal.h"

#include <stdlib.h>
#include <string.h>

struct cuda_w16 {
    uintptr_t base; /* the parameter buffer AdamW updates (its p) */
    bf16 *copy;     /* copy[i] = bf16(base[i]) on the valid runs */
    int64_t cap;    /* elements the copy holds */
    int64_t *run;   /* valid runs [run[2j], run[2j+1]): sorted, disjoint, not touching */
    int nrun, maxrun;
};

static cuda_w16 *w16_of(const ust_ops *o) {
    cuda_impl *im = CUDA_IMPL(o);
    if (!im->w16) {
        im->w16 = (cuda_w16 *)calloc(1, sizeof(cuda_w16));
        UST_ASSERT(im->w16, "out of memory for the bf16 weight copy's state");
    }
    return im->w16;
}

void cuda_w16_free(cuda_impl *im) {
    if (!im->w16) return;
    if (im->w16->copy) cudaFree(im->w16->copy);
    free(im->w16->run);
    free(im->w16);
    im->w16 = NULL;
}

size_t cuda_w16_bytes(const cuda_impl *im) { return im->w16 ? (size_t)im->w16->cap * 2 : 0; }

bf16 *cuda_w16_target(const ust_ops *o, const float *p, int64_t end) {
    if (o->act_size != 2 || end <= 0) return NULL;
    cuda_impl *im = CUDA_IMPL(o);
    cuda_w16 *w = w16_of(o);
    if (w->base != (uintptr_t)p) w->base = (uintptr_t)p, w->nrun = 0;
    if (end > w->cap) { /* grows on the first steps only, like the scratch slots */
        if (w->copy) {
            CK(cudaStreamSynchronize(im->stream)); /* a GEMM queued before may still read it */
            CK(cudaFree(w->copy));
            w->copy = NULL;
        }
        int64_t want = end + end / 8;
        im->allocations++;
        cudaError_t err = cudaMalloc(&w->copy, (size_t)want * 2);
        if (err != cudaSuccess)
            ust_fatal(UST_EXIT_RUNTIME,
                      "CUDA out of memory allocating the bf16 copy of %lld weights: %s",
                      (long long)want, cudaGetErrorString(err));
        w->cap = want, w->nrun = 0; /* the old copy's contents are gone */
    }
    return w->copy;
}

static int cmp_run(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorts the runs by start and merges the overlapping or touching ones. */
static void w16_normalize(cuda_w16 *w) {
    qsort(w->run, (size_t)w->nrun, 2 * sizeof(int64_t), cmp_run);
    int k = 0;
    for (int j = 0; j < w->nrun; j++) {
        int64_t lo = w->run[2 * j], hi = w->run[2 * j + 1];
        if (k > 0 && lo <= w->run[2 * k - 1]) {
            if (hi > w->run[2 * k - 1]) w->run[2 * k - 1] = hi;
        } else {
            w->run[2 * k] = lo, w->run[2 * k + 1] = hi, k++;
        }
    }
    w->nrun = k;
}

void cuda_w16_mark(const ust_ops *o, const ops_segment *seg, int k) {
    cuda_w16 *w = w16_of(o);
    if (!w->copy) return;
    if (w->nrun + k > w->maxrun) {
        int want = (w->nrun + k) * 2;
        int64_t *r = (int64_t *)realloc(w->run, (size_t)want * 2 * sizeof(int64_t));
        UST_ASSERT(r, "out of memory for %d runs of the bf16 weight copy", want);
        w->run = r, w->maxrun = want;
    }
    for (int i = 0; i < k; i++)
        if (seg[i].n > 0) {
            UST_ASSERT(seg[i].p >= 0 && seg[i].p + seg[i].n <= w->cap,
                       "segment [%lld, %lld) outside the bf16 copy of %lld", (long long)seg[i].p,
                       (long long)(seg[i].p + seg[i].n), (long long)w->cap);
            w->run[2 * w->nrun] = seg[i].p, w->run[2 * w->nrun + 1] = seg[i].p + seg[i].n;
            w->nrun++;
        }
    w16_normalize(w);
}

void cuda_w16_cut(const ust_ops *o, const void *p, size_t bytes) {
    cuda_w16 *w = CUDA_IMPL(o)->w16;
    if (!w || !w->nrun || !bytes) return;
    uintptr_t a = (uintptr_t)p, end = a + bytes, top = w->base + (uintptr_t)w->cap * 4;
    if (end <= w->base || a >= top) return;
    /* the elements the bytes touch, a partly written one included */
    int64_t lo = a <= w->base ? 0 : (int64_t)((a - w->base) / 4);
    int64_t hi = end >= top ? w->cap : (int64_t)((end - w->base + 3) / 4);
    int ja = 0, jb = w->nrun; /* runs [ja, jb) touch [lo, hi) */
    while (ja < w->nrun && w->run[2 * ja + 1] <= lo) ja++;
    for (jb = ja; jb < w->nrun && w->run[2 * jb] < hi;) jb++;
    if (ja == jb) return;
    int64_t keep[4], m = 0; /* what is left of them: before the cut and after it */
    if (w->run[2 * ja] < lo) keep[m++] = w->run[2 * ja], keep[m++] = lo;
    if (w->run[2 * jb - 1] > hi) keep[m++] = hi, keep[m++] = w->run[2 * jb - 1];
    int left = (int)(m / 2), tail = w->nrun - jb;
    if (ja + left + tail > w->maxrun) { /* no room for a split: drop the whole run instead */
        w->nrun = 0;
        return;
    }
    memmove(&w->run[2 * (ja + left)], &w->run[2 * jb], (size_t)tail * 2 * sizeof(int64_t));
    memcpy(&w->run[2 * ja], keep, (size_t)m * sizeof(int64_t));
    w->nrun = ja + left + tail;
}

void cuda_w16_drop(const ust_ops *o) {
    cuda_w16 *w = CUDA_IMPL(o)->w16;
    if (w) w->nrun = 0;
}

const bf16 *cuda_w16_find(const ust_ops *o, const float *p, int64_t n) {
    const cuda_w16 *w = CUDA_IMPL(o)->w16;
    uintptr_t a = (uintptr_t)p;
    if (!w || !w->nrun || n <= 0 || a < w->base || (a - w->base) % 4) return NULL;
    int64_t lo = (int64_t)((a - w->base) / 4), hi = lo + n;
    int j0 = 0, j1 = w->nrun; /* the last run starting at or before lo */
    while (j1 - j0 > 1) {
        int mid = (j0 + j1) / 2;
        if (w->run[2 * mid] <= lo)
            j0 = mid;
        else
            j1 = mid;
    }
    if (w->run[2 * j0] <= lo && hi <= w->run[2 * j0 + 1]) return w->copy + lo;
    return NULL;
}
