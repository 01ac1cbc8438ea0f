/* dp.c: ZeRO-0..3. Coordinates: a unit of the model is split into n chunks of `chunk[u]` floats;
 * member r owns [r*chunk, (r+1)*chunk) of every unit ("its partition"). A buffer is either
 * WHOLE (the model's flat layout) or SHARD (the concatenation of this rank's partitions). */
#include "dp.h"
#include "dp_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "optim.h"
#include "optim_muon.h"

/* ------------------------------------------------------------------ set-up */

_Static_assert((int)DP_GROUP_REST == (int)OPTIM_GROUP_REST &&
                   (int)DP_GROUP_EMBED == (int)OPTIM_GROUP_EMBED &&
                   (int)DP_GROUP_NORM == (int)OPTIM_GROUP_NORM &&
                   (int)DP_GROUPS == (int)OPTIM_GROUPS,
               "dp's AdamW groups are optim's");

static int group_of(const model_param *q) {
    if (!strncmp(q->name, "model.embed_", 12) || !strncmp(q->name, "lm_head", 7))
        return DP_GROUP_EMBED;
    return q->decay ? DP_GROUP_REST : DP_GROUP_NORM;
}

/* aseg reordered (stably) into its groups: each group is one adamw_many call at its lr. */
static void group_segments(dp_state *d) {
    int n = d->buf.naseg, k = 0, *param = malloc((size_t)(n ? n : 1) * sizeof *param);
    ops_segment *sorted = malloc((size_t)(n ? n : 1) * sizeof *sorted);
    UST_ASSERT(param && sorted, "out of memory");
    for (int s = 0, a = 0; s < d->buf.nseg; s++) /* aseg's parameters, in aseg's order */
        if (!optim_muon_takes(d->cfg, model_param_at(d->m, d->buf.seg_param[s])->matrix))
            param[a++] = d->buf.seg_param[s];
    for (int g = 0; g < DP_GROUPS; g++) {
        d->buf.agroup[g] = 0;
        for (int s = 0; s < n; s++)
            if (group_of(model_param_at(d->m, param[s])) == g)
                sorted[k++] = d->buf.aseg[s], d->buf.agroup[g]++;
    }
    memcpy(d->buf.aseg, sorted, (size_t)n * sizeof *sorted);
    free(sorted);
    free(param);
}

/* A tensor's weight decay: its group's (optimizer.embed/norm.weight_decay, else weight_decay;
 * the norms and biases none unless optimizer.norm.weight_decay says). */
static float weight_decay(const ust_config *c, const model_param *q) {
    int g = group_of(q);
    return g == DP_GROUP_NORM || q->decay ? (float)optim_group_wd(c, g) : 0.0f;
}

/* The pieces of every parameter this rank holds (whole or its partition) as segments of the
 * parameter, gradient and moment buffers, non-replicas first (d->buf.seg, d->buf.nseg,
 * d->buf.nseg_norm). */
static void make_segments(dp_state *d) {
    const ust_config *c = d->cfg;
    int part = d->stage >= 1;
    for (int replicas = 0; replicas < 2; replicas++) {
        for (int i = 0; i < model_num_params(d->m); i++) {
            const model_param *q = model_param_at(d->m, i);
            int u = model_param_unit(d->m, i);
            int64_t a, b, t0 = piece(d, i, part, &a, &b);
            if (b <= a || !!q->replica != replicas) continue;
            d->buf.seg[d->buf.nseg] =
                (ops_segment){.p = at(d, BUF_PARAMS, u, t0 + a) - buf_base(d, BUF_PARAMS),
                              .g = at(d, BUF_GRADS, u, t0 + a) - buf_base(d, BUF_GRADS),
                              .m = state_off(d, u, t0 + a), /* BUF_V: the same layout */
                              .n = b - a,
                              .wd = weight_decay(c, q)};
            if (!optim_muon_takes(c, q->matrix))
                d->buf.aseg[d->buf.naseg++] = d->buf.seg[d->buf.nseg];
            d->buf.seg_param[d->buf.nseg++] = i;
        }
        if (!replicas) d->buf.nseg_norm = d->buf.nseg;
    }
    group_segments(d);
}

/* ZeRO-3's vocabulary chunk: parallel.zero3_vocab_chunk_rows, or as many of a rank's rows as
 * a dense layer holds floats (q, k, v, o and the MLP's matrices, in rows of d_model), evened
 * out over the chunks, so no chunk's working buffers exceed a layer's. */
static int vocab_chunk_rows(const ust_config *cfg) {
    const __typeof__(cfg->model) *md = &cfg->model;
    int tp = cfg->parallel.tp, Vl = cfg_vocab_padded(cfg) / tp, hd = cfg_head_dim(cfg);
    int64_t rows = cfg->parallel.zero3_vocab_chunk_rows;
    if (rows <= 0) {
        int64_t mats = md->arch == ARCH_LLAMA ? 3 : 2;
        rows =
            (2 * (int64_t)md->n_head * hd + 2 * (int64_t)md->n_kv_head * hd + mats * md->d_ff) / tp;
        rows = rows < 1 ? 1 : rows;
    }
    int64_t k = (Vl + rows - 1) / rows;
    if (k > MODEL_MAX_VOCAB_CHUNKS) k = MODEL_MAX_VOCAB_CHUNKS;
    return (int)((Vl + k - 1) / k);
}

model_storage dp_model_storage(const ust_config *cfg, int dp_size) {
    int stage = cfg->optimizer.zero_stage;
    model_storage st = {
        .unit_pad = 16 * (int64_t)dp_size, .alloc_params = stage < 3, .alloc_grads = stage < 2};
    if (stage == 3) st.vocab_chunk_rows = vocab_chunk_rows(cfg);
    return st;
}

static void make_buckets(dp_state *d) {
    /* stage 0: units in backward order (head first) grouped until a bucket reaches
     * dp_bucket_mb; a bucket is the contiguous unit range [lo, hi] and is posted at lo's end */
    double cap = d->cfg->parallel.dp_bucket_mb * 1024 * 1024 / sizeof(float);
    d->red.bucket_lo = malloc(d->lay.nunits * sizeof *d->red.bucket_lo);
    double fill = 0;
    for (int u = d->lay.nunits - 1; u >= 0; u--) {
        fill += (double)d->lay.ulen[u];
        /* a bucket is one all-reduce: it never spans units reduced over different groups */
        int close = fill >= cap || u == 0 || d->lay.ucomm[u - 1] != d->lay.ucomm[u];
        d->red.bucket_lo[u] = close ? 1 : 0;
        if (close) fill = 0;
    }
}

/* Each unit's shard over its group of un[u] ranks (chunk, soff) and their total; the largest
 * unit (the working buffers' size), but the first under ZeRO-2 (it has its own). */
static void shard_units(dp_state *d) {
    dp_layout *l = &d->lay;
    for (int u = 0; u < l->nunits; u++) {
        UST_ASSERT(l->ulen[u] % l->un[u] == 0, "unit %d length %lld not divisible by %d", u,
                   (long long)l->ulen[u], l->un[u]);
        l->chunk[u] = l->ulen[u] / l->un[u];
        l->soff[u] = l->shard_numel;
        l->shard_numel += l->chunk[u];
        if ((u > 0 || d->stage == 3) && l->ulen[u] > l->max_unit) l->max_unit = l->ulen[u];
    }
}

/* The layout's per-unit arrays, with each unit's range in the model's flat buffers (its groups
 * and shards are the caller's). */
static void layout_alloc(dp_layout *l, const model *m) {
    l->nunits = model_num_units(m);
    l->uoff = calloc(l->nunits, sizeof(int64_t));
    l->ulen = calloc(l->nunits, sizeof(int64_t));
    l->chunk = calloc(l->nunits, sizeof(int64_t));
    l->soff = calloc(l->nunits, sizeof(int64_t));
    l->ucomm = calloc(l->nunits, sizeof *l->ucomm);
    l->urank = calloc(l->nunits, sizeof *l->urank);
    l->un = calloc(l->nunits, sizeof *l->un);
    UST_ASSERT(l->uoff && l->ulen && l->chunk && l->soff && l->ucomm && l->urank && l->un,
               "out of host memory");
    for (int u = 0; u < l->nunits; u++) {
        model_unit_range(m, u, &l->uoff[u], &l->ulen[u]);
        l->has_experts |= model_unit_is_expert(m, u);
    }
    l->numel = model_numel(m);
}

static void layout_free(dp_layout *l) {
    free(l->uoff);
    free(l->ulen);
    free(l->chunk);
    free(l->soff);
    free(l->ucomm);
    free(l->urank);
    free(l->un);
}

/* ZeRO (Playbook): stage 1 shards the optimizer state, 2 the gradients too, 3 the weights
 * too; 2 and 3 add a working buffer for a unit's gradients (two with MoE layers, whose dense
 * and expert units are in backward together) and 3 two gathered units (one in use, the next
 * prefetched). Under 2 the first unit (embeddings, which a tied head writes at the other end of
 * the model) has a working buffer of its own; under 3 the model splits the vocabulary tables
 * into units no larger than a layer (dp_model_storage), so every unit shares the buffers. */
static void alloc_state(dp_state *d, ust_arena *a) {
    int64_t moments = d->stage >= 1 ? d->lay.shard_numel : d->lay.numel;
    if (d->cfg->optimizer.state_dtype == 1) {
        d->buf.m16 = mem_alloc(a, MEM_OPTIM, moments * sizeof(uint16_t));
        d->buf.v16 = mem_alloc(a, MEM_OPTIM, moments * sizeof(uint16_t));
    } else {
        d->buf.mom_m = mem_alloc(a, MEM_OPTIM, moments * sizeof(float));
        d->buf.mom_v = mem_alloc(a, MEM_OPTIM, moments * sizeof(float));
    }
    d->red.nwork = d->lay.has_experts ? 2 : 1;
    if (d->stage >= 2) {
        d->buf.g_shard = mem_alloc(a, MEM_GRADS, d->lay.shard_numel * sizeof(float));
        if (d->stage == 2)
            d->red.work_emb = mem_alloc(a, MEM_GRADS, d->lay.ulen[0] * sizeof(float));
        for (int k = 0; k < d->red.nwork; k++)
            d->red.work[k] = mem_alloc(a, MEM_GRADS, d->lay.max_unit * sizeof(float));
        for (int k = 0; k < 3; k++) d->red.rs[k].unit = -1;
    }
    if (d->stage >= 3) {
        d->buf.p_shard = mem_alloc(a, MEM_PARAMS, d->lay.shard_numel * sizeof(float));
        for (int s = 0; s < 2; s++) {
            d->red.gath[s] = mem_alloc(a, MEM_PARAMS, d->lay.max_unit * sizeof(float));
            d->red.gath_unit[s] = -1;
        }
        if (d->cfg->model.moe.bias_update_rate > 0) { /* the metrics' bias range (dp_io.c) */
            d->buf.whole_cap = d->cfg->model.moe.num_experts;
            d->buf.whole_one = mem_alloc(a, MEM_COMM, d->buf.whole_cap * sizeof(float));
        }
    }
    d->red.scalar = mem_alloc(a, MEM_COMM, 4 * sizeof(float));
    if (d->cfg->logging.stats_every > 0) /* dp_stats.c: the update's norm per layer */
        d->buf.snap =
            mem_alloc(a, MEM_OTHER,
                      (whole(d, BUF_PARAMS) ? d->lay.numel : d->lay.shard_numel) * sizeof(float));
    dp_muon_create(d, a);
}

/* A group's size and this rank's place in it; the memory plan's groups have no communicator:
 * n ranks, this one their member 0. */
static int group_size(const ust_comm *c, int n) { return c ? comm_size(c) : n; }
static int group_rank(const ust_comm *c) { return c ? comm_rank(c) : 0; }

static void on_unit(void *ctx, int u, model_phase ph);

int dp_create(dp_state **out, const ust_config *cfg, const ust_ops *ops, ust_arena *a, model *m,
              const dp_groups *gr, ust_err *e) {
    ust_comm *comm = gr->dense, *mp = gr->mp;
    dp_state *d = calloc(1, sizeof *d);
    if (!d) return ust_errf(e, "out of memory");
    d->cfg = cfg;
    d->ops = ops;
    d->m = m;
    d->comm = comm;
    d->mp = mp;
    d->n = group_size(comm, gr->dense_n);
    d->rank = group_rank(comm);
    d->stage = cfg->optimizer.zero_stage;
    layout_alloc(&d->lay, m);
    d->head = d->lay.nunits - 1;
    d->tied = model_tied_local(m); /* unit 0 also collects the head's gradient */
    d->pipe = gr->pipe;
    d->mirror = gr->mirror && comm_size(gr->mirror) > 1 ? gr->mirror : NULL;
    d->ep = gr->ep && comm_size(gr->ep) > 1 ? gr->ep : NULL;
    d->red.pinned = calloc(d->lay.nunits, sizeof *d->red.pinned);
    d->red.uwork = calloc(d->lay.nunits, sizeof *d->red.uwork);
    for (int u = 0; u < d->lay.nunits; u++) {
        int expert = model_unit_is_expert(m, u);
        d->lay.ucomm[u] = expert ? gr->expert : comm;
        d->lay.urank[u] = group_rank(d->lay.ucomm[u]);
        d->lay.un[u] = group_size(d->lay.ucomm[u], expert ? gr->expert_n : gr->dense_n);
    }
    shard_units(d);
    d->buf.p_whole = model_params(m);
    d->buf.g_whole = model_grads(m);
    alloc_state(d, a);
    d->red.pending = calloc(d->lay.nunits, sizeof *d->red.pending);
    int np = model_num_params(m);
    d->buf.seg = calloc(np ? np : 1, sizeof *d->buf.seg);
    d->buf.seg_param = calloc(np ? np : 1, sizeof *d->buf.seg_param);
    d->buf.seg_sumsq = calloc(np ? np : 1, sizeof *d->buf.seg_sumsq);
    d->buf.aseg = calloc(np ? np : 1, sizeof *d->buf.aseg);
    UST_ASSERT(d->buf.seg && d->buf.seg_param && d->buf.seg_sumsq && d->buf.aseg, "out of memory");
    if (!mem_counting(a)) make_segments(d); /* a counting arena's buffers do not exist */
    make_buckets(d);
    const char *fault = getenv("UST_FAULT_DP_DROP_GRADS_RANK");
    d->drop_grads = fault && atoi(fault) == d->rank && d->n > 1;
    /* test fault UST_FAULT_DP_SKIP_MIRROR=1: dualpipe's copies step on their own gradients */
    fault = getenv("UST_FAULT_DP_SKIP_MIRROR");
    if (fault && atoi(fault) == 1) d->mirror = NULL;
    model_hooks h = {d, on_unit};
    model_set_hooks(m, &h);
    *out = d;
    return 0;
}

void dp_destroy(dp_state *d) {
    if (!d) return;
    model_set_hooks(d->m, NULL);
    layout_free(&d->lay);
    free(d->red.pinned);
    free(d->red.uwork);
    free(d->red.pending);
    free(d->red.bucket_lo);
    free(d->buf.seg);
    free(d->buf.seg_param);
    free(d->buf.seg_sumsq);
    free(d->buf.aseg);
    dp_muon_destroy(d);
    free(d);
}

/* ------------------------------------------------------------------ stage 3: gathering */

static void gather_post(dp_state *d, int slot, int u) {
    d->red.gath_req[slot] =
        comm_allgather(d->lay.ucomm[u], at(d, BUF_PARAMS, u, d->lay.urank[u] * d->lay.chunk[u]),
                       d->red.gath[slot], d->lay.chunk[u], COMM_FP32);
    d->red.gath_unit[slot] = u;
}

/* Makes unit u's weights available and posts the gather of `next` ahead (-1: none). A unit
 * may be needed again later in the step (a tied head uses the table's chunks): it is gathered
 * again then. */
static void params_ready(dp_state *d, int u, int next) {
    int slot = d->red.gath_unit[0] == u ? 0 : d->red.gath_unit[1] == u ? 1 : -1;
    if (slot < 0) {
        /* never the slot of a unit in use (a MoE layer's dense and expert units are used
         * together), else not the one a prefetch already holds */
        int busy0 = d->red.gath_unit[0] >= 0 && d->red.pinned[d->red.gath_unit[0]];
        slot = busy0 ? 1 : d->red.gath_unit[0] == next ? 1 : 0;
        comm_wait(&d->red.gath_req[slot]);
        gather_post(d, slot, u);
    }
    comm_wait(&d->red.gath_req[slot]);
    model_set_unit_params(d->m, u, d->red.gath[slot]);
    int other = d->red.gath_unit[1 - slot];
    if (next >= 0 && next < d->lay.nunits && next != u && other != next &&
        !(other >= 0 && d->red.pinned[other])) {
        comm_wait(&d->red.gath_req[1 - slot]);
        gather_post(d, 1 - slot, next);
    }
}

static void invalidate_gathered(dp_state *d) {
    for (int s = 0; s < 2; s++) {
        comm_wait(&d->red.gath_req[s]);
        d->red.gath_unit[s] = -1;
    }
}

/* ------------------------------------------------------------------ gradient reduction */

/* Completes the reduce-scatter in flight from working buffer k and adds this rank's part into
 * the gradient shard, where micro-batches accumulate. */
static void finish_rs(dp_state *d, int k) {
    int u = d->red.rs[k].unit;
    if (u < 0) return;
    comm_wait(&d->red.rs[k].req);
    d->ops->axpy(d->ops, d->buf.g_shard + d->lay.soff[u], 1.0f,
                 d->red.rs[k].buf + d->lay.urank[u] * d->lay.chunk[u], d->lay.chunk[u]);
    d->red.rs[k].unit = -1;
}

/* Under ZeRO-2 unit 0 has a working buffer of its own (alloc_state). */
static int emb_apart(const dp_state *d, int u) { return u == 0 && d->stage == 2; }

static float *unit_grads(dp_state *d, int u) {
    if (d->stage < 2) return d->buf.g_whole + d->lay.uoff[u];
    return emb_apart(d, u) ? d->red.work_emb : d->red.work[d->red.uwork[u]];
}

static void grads_begin(dp_state *d, int u) {
    if (d->stage < 2) return;
    /* ZeRO-2: unit 0's buffer must already collect the tied lm_head's gradient during the
     * head's backward, so it is zeroed there; other units get the next working buffer */
    if (d->stage == 2 && (u == d->head || (u == 0 && !d->tied))) {
        finish_rs(d, 2);
        d->ops->zero(d->ops, d->red.work_emb, d->lay.ulen[0] * sizeof(float));
        model_set_unit_grads(d->m, 0, d->red.work_emb);
    }
    if (!emb_apart(d, u)) { /* the buffers take turns; a unit keeps its own until its END */
        int k = d->red.wslot;
        d->red.wslot = (d->red.wslot + 1) % d->red.nwork;
        finish_rs(d, k);
        d->red.uwork[u] = k;
        d->ops->zero(d->ops, d->red.work[k], d->lay.ulen[u] * sizeof(float));
        model_set_unit_grads(d->m, u, d->red.work[k]);
    }
}

static void grads_end(dp_state *d, int u) {
    float *g = unit_grads(d, u);
    if (d->drop_grads && (d->stage >= 2 || d->last_mb)) /* test fault: lose this rank's part */
        d->ops->zero(d->ops, g, d->lay.ulen[u] * sizeof(float));
    if (d->stage >= 2) {
        /* every micro-batch: reduce-scatter in place into this rank's part of the working
         * buffer; finish_rs adds it into the shard when the buffer is needed again */
        int k = emb_apart(d, u) ? 2 : d->red.uwork[u];
        d->red.rs[k].req =
            comm_reduce_scatter(d->lay.ucomm[u], g, g + d->lay.urank[u] * d->lay.chunk[u],
                                d->lay.chunk[u], COMM_FP32, COMM_SUM);
        d->red.rs[k].unit = u;
        d->red.rs[k].buf = g;
        return;
    }
    if (!d->last_mb) return;
    if (d->stage == 1) {
        float *mine = g + d->lay.urank[u] * d->lay.chunk[u];
        d->red.pending[d->red.npending++] =
            comm_reduce_scatter(d->lay.ucomm[u], g, mine, d->lay.chunk[u], COMM_FP32, COMM_SUM);
    } else if (d->red.bucket_lo[u]) {
        int hi = u; /* the bucket runs from u up to the unit before the previous bucket */
        while (hi + 1 < d->lay.nunits && !d->red.bucket_lo[hi + 1]) hi++;
        size_t count = (size_t)(d->lay.uoff[hi] + d->lay.ulen[hi] - d->lay.uoff[u]);
        d->red.pending[d->red.npending++] =
            comm_allreduce(d->lay.ucomm[u], g, g, count, COMM_FP32, COMM_SUM);
    }
}

static void on_unit(void *ctx, int u, model_phase ph) {
    dp_state *d = ctx;
    d->red.pinned[u] = ph == MODEL_FWD_BEGIN || ph == MODEL_BWD_BEGIN || ph == MODEL_BIN_BEGIN;
    switch (ph) {
    case MODEL_FWD_BEGIN:
        if (d->stage == 3) params_ready(d, u, u + 1);
        break;
    case MODEL_BWD_BEGIN:
        if (d->stage == 3) params_ready(d, u, u - 1);
        grads_begin(d, u);
        break;
    case MODEL_BWD_END:
        grads_end(d, u);
        break;
    case MODEL_BIN_BEGIN: /* zero-bubble B: weights needed, gradients untouched */
        if (d->stage == 3) params_ready(d, u, u - 1);
        break;
    case MODEL_FWD_END:
    case MODEL_BIN_END:
        break;
    }
}

/* ------------------------------------------------------------------ the step */

void dp_begin_step(dp_state *d) {
    if (d->stage < 2)
        d->ops->zero(d->ops, d->buf.g_whole, d->lay.numel * sizeof(float));
    else
        d->ops->zero(d->ops, d->buf.g_shard, d->lay.shard_numel * sizeof(float));
    d->red.npending = 0;
    const comm_counters *c = comm_get_counters(d->comm);
    d->bytes_at_step_start = 0;
    for (int k = 0; k < COMM_NKINDS; k++) d->bytes_at_step_start += c->bytes[k];
}

void dp_begin_microbatch(dp_state *d, int last) { d->last_mb = last; }

/* dualpipe: the mirror rank's copies saw the other direction's micro-batches; both ranks hold
 * the same units in the same layout and partitions, so the pieces the optimizer reads (the whole
 * buffer, ZeRO-1's partition of each unit, the ZeRO-2/3 shard) are summed as they lie. */
static void sum_with_mirror(dp_state *d) {
    int n = 0;
    if (d->stage == 1)
        for (int u = 0; u < d->lay.nunits; u++) {
            float *mine = d->buf.g_whole + d->lay.uoff[u] + d->lay.urank[u] * d->lay.chunk[u];
            d->red.pending[n++] =
                comm_allreduce(d->mirror, mine, mine, (size_t)d->lay.chunk[u], COMM_FP32, COMM_SUM);
        }
    else {
        float *g = d->stage == 0 ? d->buf.g_whole : d->buf.g_shard;
        size_t count = (size_t)(d->stage == 0 ? d->lay.numel : d->lay.shard_numel);
        d->red.pending[n++] = comm_allreduce(d->mirror, g, g, count, COMM_FP32, COMM_SUM);
    }
    comm_wait_all(d->red.pending, n);
}

void dp_finish_grads(dp_state *d) {
    comm_wait_all(d->red.pending, d->red.npending);
    d->red.npending = 0;
    if (d->stage >= 2)
        for (int k = 0; k < 3; k++) finish_rs(d, k);
    if (d->mirror) sum_with_mirror(d);
}

/* Sums n (<= 2) doubles over group c in one all-reduce (d->red.scalar holds four floats). */
static void sum_over(dp_state *d, ust_comm *c, double *x, int n) {
    comm_sum_doubles(c, d->ops, d->red.scalar, x, n);
}

void dp_sum_replicas(void *ctx, float *x, int64_t n) {
    dp_state *d = ctx;
    ust_comm *groups[2] = {d->comm, d->mirror};
    for (int g = 0; g < 2; g++)
        if (groups[g]) {
            comm_req r = comm_allreduce(groups[g], x, x, (size_t)n, COMM_FP32, COMM_SUM);
            comm_wait(&r);
        }
}

double dp_sum(dp_state *d, double x) {
    sum_over(d, d->comm, &x, 1);
    return x;
}

/* Sum of squares over the whole model: the pieces each dp member holds are disjoint; tensors
 * split over the tensor-parallel group are summed over it too, replicated ones counted once;
 * the pipeline stages hold disjoint layers (a tied embedding's copy is not counted). */
double dp_grad_norm(dp_state *d) {
    double split = 0, repl = 0, experts = 0;
    int part = d->stage >= 1;
    d->ops->sumsq_many(d->ops, buf_base(d, BUF_GRADS), d->buf.seg, d->buf.nseg_norm,
                       d->buf.seg_sumsq);
    for (int s = 0; s < d->buf.nseg_norm; s++) {
        int i = d->buf.seg_param[s], u = model_param_unit(d->m, i);
        double ss = d->buf.seg_sumsq[s];
        *(model_unit_is_expert(d->m, u)       ? &experts
          : model_param_at(d->m, i)->tp_split ? &split
                                              : &repl) += ss;
    }
    /* experts are replicated over tp: counted once, like the replicated dense tensors; whole
     * (ZeRO-0) they are held by every expert-dp replica, and the ep group holds the others */
    if (!part && d->ep) sum_over(d, d->ep, &experts, 1);
    double both[2] = {split, repl + experts};
    if (part) sum_over(d, d->comm, both, 2);
    sum_over(d, d->mp, both, 1);
    sum_over(d, d->pipe, both, 2);
    return sqrt(both[0] + both[1]);
}

void dp_optimizer_step(dp_state *d, double lr, double lr_mult, float grad_scale, int64_t step) {
    const ust_config *c = d->cfg;
    for (int g = 0, first = 0; g < DP_GROUPS; first += d->buf.agroup[g++]) {
        /* each group's rate: its peak and shape (optimizer.embed_lr, norm_lr, adamw_lr, embed,
         * norm), times the batch ramp's factor */
        float glr = (float)(optim_group_lr(c, g, step) * lr_mult);
        if (!d->buf.agroup[g]) continue;
        if (d->buf.m16) /* bf16 states: widened and rounded in the op (one pass) */
            d->ops->adamw16_many(d->ops, buf_base(d, BUF_PARAMS), buf_base(d, BUF_GRADS),
                                 d->buf.m16, d->buf.v16, d->buf.aseg + first, d->buf.agroup[g], glr,
                                 (float)c->optimizer.beta1, (float)c->optimizer.beta2,
                                 (float)c->optimizer.eps, grad_scale, step + 1);
        else
            d->ops->adamw_many(d->ops, buf_base(d, BUF_PARAMS), buf_base(d, BUF_GRADS),
                               buf_base(d, BUF_M), buf_base(d, BUF_V), d->buf.aseg + first,
                               d->buf.agroup[g], glr, (float)c->optimizer.beta1,
                               (float)c->optimizer.beta2, (float)c->optimizer.eps, grad_scale,
                               step + 1);
    }
    if (d->muon.n) dp_muon_step(d, lr, grad_scale);
    if (d->stage == 1 || d->stage == 2) { /* everyone needs the whole updated weights */
        for (int u = 0; u < d->lay.nunits; u++) {
            float *unit = d->buf.p_whole + d->lay.uoff[u];
            d->red.pending[u] =
                comm_allgather(d->lay.ucomm[u], unit + d->lay.urank[u] * d->lay.chunk[u], unit,
                               d->lay.chunk[u], COMM_FP32);
        }
        comm_wait_all(d->red.pending, d->lay.nunits);
    }
    if (d->stage == 3) invalidate_gathered(d);
}

float *dp_grad_piece(dp_state *d, int i, int64_t *n) {
    int64_t a, b, t0 = piece(d, i, d->stage >= 1, &a, &b);
    *n = b - a;
    return b > a ? at(d, BUF_GRADS, model_param_unit(d->m, i), t0 + a) : NULL;
}

uint64_t dp_bytes_sent(const dp_state *d) {
    const comm_counters *c = comm_get_counters(d->comm);
    uint64_t total = 0;
    for (int k = 0; k < COMM_NKINDS; k++) total += c->bytes[k];
    return total - d->bytes_at_step_start;
}
