/* dp_internal: the data-parallel state, shared by the two files that implement dp.h: dp.c
 * (sharding, gathering, gradient reduction, the optimizer step) and dp_io.c (initialization,
 * import and checkpoints of the sharded buffers). Nothing else includes it. */
#ifndef UST_DP_INTERNAL_H
#define UST_DP_INTERNAL_H

#include "dp.h"
#include "error.h"

#include <string.h>

typedef enum { BUF_PARAMS, BUF_GRADS, BUF_M, BUF_V } dp_buf;

/* The ZeRO shard layout (dp.c shard_units): a unit is split into un[u] chunks of chunk[u]
 * floats; this rank owns [urank*chunk, (urank+1)*chunk). */
/* AdamW's parameter groups, each at its own peak lr on the schedule (optimizer.embed_lr,
 * norm_lr): the rest, the embeddings and head, the norms and biases (no weight decay). */
enum { DP_GROUP_REST, DP_GROUP_EMBED, DP_GROUP_NORM, DP_GROUPS };

typedef struct {
    int nunits, has_experts;
    ust_comm **ucomm;                    /* per unit: the group it is reduced and sharded over */
    int *urank, *un;                     /* per unit: this rank's index in it, and its size */
    int64_t *uoff, *ulen, *chunk, *soff; /* per unit: offset, length, chunk, offset in shard */
    int64_t numel, shard_numel, max_unit;
} dp_layout;

/* The buffers the optimizer steps (dp.c alloc_state, make_segments): each is whole or this
 * rank's shard (buf_base), by stage. */
typedef struct {
    float *p_whole, *g_whole, *p_shard, *g_shard, *mom_m, *mom_v;
    /* the multi-tensor ops' segments: every piece this rank holds, fixed at creation; the first
     * nseg_norm (replicas left out) make the gradient norm, all nseg the optimizer step */
    ops_segment *seg;
    int *seg_param; /* the parameter of each segment */
    double *seg_sumsq;
    int nseg, nseg_norm;
    ops_segment *aseg; /* the segments AdamW steps: all but Muon's matrices */
    int naseg;
    int agroup[DP_GROUPS]; /* aseg in groups of their lr (dp_group): how many of each, in order */
    /* optimizer.state_dtype: bf16: the states live in m16/v16 (mom_m, mom_v NULL), in the
     * backend's memory; the ops adamw16_many and momentum16 step them */
    uint16_t *m16, *v16;
    float *snap;      /* logging.stats_every: the parameters before a stats step's update */
    float *whole_one; /* ZeRO-3 with a routing bias: one small tensor made whole (dp_param_whole) */
    int64_t whole_cap; /* ... its floats */
} dp_buffers;

/* Muon (dp_muon.c): the matrices it steps and who orthogonalises each. */
typedef struct {
    int n;        /* matrices on this rank (its stage's, its tp slice, its experts) */
    int *param;   /* each one's parameter index */
    int *owner;   /* the member of its unit's group that orthogonalises it (ZeRO-1..3) */
    float *work;  /* Newton-Schulz's work for the largest whole matrix */
    float *whole; /* a tp-split matrix gathered over the tp group, then put in row-major order */
    float *gath;
    int tp; /* the tp group's size */
} dp_muon;

void dp_muon_create(dp_state *d, ust_arena *a);
void dp_muon_destroy(dp_state *d);
/* Steps every Muon matrix (after AdamW stepped the rest: it reuses their gradient buffers). */
void dp_muon_step(dp_state *d, double lr, float grad_scale);

/* The reductions and gathers in flight and the buffers they use (dp.c, the unit hooks). */
typedef struct {
    int *pinned; /* per unit: between its BEGIN and END hooks (in use) */
    /* stage 2-3: units' gradients, nwork working buffers in turn (one; two with MoE layers,
     * whose dense and expert units are in backward together; ZeRO-2's embeddings apart); a
     * buffer's reduction is finished (and added into the shard) before it is reused */
    float *work[2], *work_emb;
    int nwork;
    struct {
        comm_req req;
        int unit; /* -1: nothing in flight */
        float *buf;
    } rs[3];        /* in flight from work[0], work[1], work_emb */
    int wslot;      /* the working buffer the next unit gets */
    int *uwork;     /* per unit: the working buffer it was given at its BEGIN */
    float *gath[2]; /* stage 3: gathered units */
    int gath_unit[2];
    comm_req gath_req[2];
    comm_req *pending; /* stage 0-1: reductions posted this step */
    int npending;
    int *bucket_lo; /* stage 0: 1 where a unit closes a bucket (its lowest) */
    float *scalar;  /* four floats for the scalar all-reduces */
} dp_reducer;

struct dp_state {
    const ust_config *cfg;
    const ust_ops *ops;
    model *m;
    ust_comm *comm, *mp; /* the dp group; the group holding the other shards of this replica */
    ust_comm *pipe;      /* the pipeline group: the other stages of this replica (NULL: none) */
    ust_comm *mirror;    /* dp_groups.mirror (NULL: none) */
    ust_comm *ep;        /* the expert-parallel group: the other experts of a MoE layer */
    int n, rank, stage, head, tied, last_mb, drop_grads;
    dp_layout lay;
    dp_buffers buf;
    dp_reducer red;
    dp_muon muon;
    uint64_t bytes_at_step_start;
};

static inline int whole(const dp_state *d, dp_buf b) {
    switch (b) {
    case BUF_PARAMS:
        return d->stage < 3;
    case BUF_GRADS:
        return d->stage < 2;
    default:
        return d->stage < 1;
    }
}

/* The buffer b lives in: whole or this rank's shard. */
static inline float *buf_base(const dp_state *d, dp_buf b) {
    return b == BUF_PARAMS  ? (whole(d, b) ? d->buf.p_whole : d->buf.p_shard)
           : b == BUF_GRADS ? (whole(d, b) ? d->buf.g_whole : d->buf.g_shard)
           : b == BUF_M     ? d->buf.mom_m
                            : d->buf.mom_v;
}

/* Pointer to unit coordinate x of unit u in buffer b (x must be held by this rank). */
static inline float *at(const dp_state *d, dp_buf b, int u, int64_t x) {
    float *base = buf_base(d, b);
    if (whole(d, b)) return base + d->lay.uoff[u] + x;
    int64_t lo = d->lay.urank[u] * d->lay.chunk[u];
    UST_ASSERT(x >= lo && x <= lo + d->lay.chunk[u],
               "unit %d element %lld is not in this rank's "
               "partition [%lld, %lld)",
               u, (long long)x, (long long)lo, (long long)(lo + d->lay.chunk[u]));
    return base + d->lay.soff[u] + (x - lo);
}

/* Element offset of unit coordinate x of unit u in the optimizer states (whole or shard). */
static inline int64_t state_off(const dp_state *d, int u, int64_t x) {
    if (whole(d, BUF_M)) return d->lay.uoff[u] + x;
    return d->lay.soff[u] + (x - d->lay.urank[u] * d->lay.chunk[u]);
}

/* bf16 states (ops_state_bf16: round to nearest even) and back, host memory to host memory. */
static inline void state_pack(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t k = 0; k < n; k++) dst[k] = ops_state_bf16(src[k]);
}
static inline void state_unpack(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t k = 0; k < n; k++) dst[k] = ops_state_f32(src[k]);
}

/* piece() of copy k of a sizes-only table's repeated entry (model_param.repeat: the memory
 * plan's), k strides past the entry's own place. */
static inline int64_t piece_copy(const dp_state *d, int i, int k, int part, int64_t *a,
                                 int64_t *b) {
    const model_param *q = model_param_at(d->m, i);
    int u = model_param_unit(d->m, i);
    int64_t t0 = q->offset + k * q->stride - d->lay.uoff[u];
    *a = 0;
    *b = q->numel;
    if (part) {
        int64_t lo = d->lay.urank[u] * d->lay.chunk[u] - t0, hi = lo + d->lay.chunk[u];
        *a = lo > 0 ? lo : 0;
        *b = hi < q->numel ? hi : q->numel;
        if (*b < *a) *b = *a;
    }
    return t0;
}

/* The part [*a, *b) of parameter i (flat, within the tensor) that lies in this rank's partition
 * (part = 1) or the whole tensor (part = 0); returns the tensor's offset inside its unit. */
static inline int64_t piece(const dp_state *d, int i, int part, int64_t *a, int64_t *b) {
    return piece_copy(d, i, 0, part, a, b);
}

#endif
