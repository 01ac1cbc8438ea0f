/* dp_io.c: the sharded buffers' initialization, the llm.c import and the checkpoint transfer
 * (each rank writes its partition, reads what it holds; dp.h). */
#include "dp.h"
#include "dp_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim_muon.h"

/* ------------------------------------------------------------------ init, import, checkpoints */

/* Fills what this rank holds of parameter i from a host function of the flat range. */
typedef void (*fill_fn)(dp_state *d, int i, int64_t a, int64_t b, float *host, void *arg);

static void fill_params(dp_state *d, fill_fn fill, void *arg) {
    float *host = NULL;
    int64_t cap = 0;
    for (int i = 0; i < model_num_params(d->m); i++) {
        int64_t a, b, t0 = piece(d, i, !whole(d, BUF_PARAMS), &a, &b);
        if (b <= a) continue;
        if (b - a > cap) host = realloc(host, (cap = b - a) * sizeof(float));
        UST_ASSERT(host, "out of host memory");
        fill(d, i, a, b, host, arg);
        d->ops->to_device(d->ops, at(d, BUF_PARAMS, model_param_unit(d->m, i), t0 + a), host,
                          (b - a) * sizeof(float));
    }
    free(host);
}

static void fill_init(dp_state *d, int i, int64_t a, int64_t b, float *host, void *arg) {
    model_init_range(d->m, i, a, b, *(uint64_t *)arg, host);
}

void dp_init_params(dp_state *d, uint64_t seed) { fill_params(d, fill_init, &seed); }

/* This rank's piece of parameter i updated through host memory: per 0 adds v (the whole tensor's
 * delta), else scales element e by v[e / per]. */
static void param_on_host(dp_state *d, int i, const float *v, int64_t per) {
    int64_t a, b, t0 = piece(d, i, !whole(d, BUF_PARAMS), &a, &b);
    if (b <= a) return;
    float *host = malloc((size_t)(b - a) * sizeof(float));
    UST_ASSERT(host, "out of host memory");
    float *dev = at(d, BUF_PARAMS, model_param_unit(d->m, i), t0 + a);
    d->ops->to_host(d->ops, host, dev, (b - a) * sizeof(float));
    for (int64_t k = 0; k < b - a; k++)
        host[k] = per ? host[k] * v[(a + k) / per] : host[k] + v[a + k];
    d->ops->to_device(d->ops, dev, host, (b - a) * sizeof(float));
    free(host);
}

void dp_add_to_param(void *ctx, int i, const float *delta) { param_on_host(ctx, i, delta, 0); }

void dp_scale_param(void *ctx, int i, const float *f, int64_t per) {
    param_on_host(ctx, i, f, per);
}

void dp_param_whole(void *ctx, int i, float *host) {
    dp_state *d = ctx;
    int u = model_param_unit(d->m, i), part = !whole(d, BUF_PARAMS);
    int64_t a, b, t0 = piece(d, i, part, &a, &b), n = model_param_at(d->m, i)->numel;
    if (!part) {
        d->ops->to_host(d->ops, host, at(d, BUF_PARAMS, u, t0), n * sizeof(float));
        return;
    }
    UST_ASSERT(n <= d->buf.whole_cap, "parameter %d: %lld floats made whole, room for %lld", i,
               (long long)n, (long long)d->buf.whole_cap);
    /* every member's piece in place, zeros elsewhere: the sum is the tensor, exactly */
    float *w = d->buf.whole_one;
    d->ops->zero(d->ops, w, n * sizeof(float));
    if (b > a) d->ops->copy(d->ops, w + a, at(d, BUF_PARAMS, u, t0 + a), (b - a) * sizeof(float));
    if (d->lay.un[u] > 1) {
        comm_req r = comm_allreduce(d->lay.ucomm[u], w, w, (size_t)n, COMM_FP32, COMM_SUM);
        comm_wait(&r);
    }
    d->ops->to_host(d->ops, host, w, n * sizeof(float));
}

typedef struct {
    dp_state *d;
} llmc_ctx;

static void store_llmc(void *ctx, int i, const float *whole_tensor) {
    dp_state *d = ((llmc_ctx *)ctx)->d;
    int64_t a, b, t0 = piece(d, i, !whole(d, BUF_PARAMS), &a, &b);
    if (b > a)
        d->ops->to_device(d->ops, at(d, BUF_PARAMS, model_param_unit(d->m, i), t0 + a),
                          whole_tensor + a, (b - a) * sizeof(float));
}

int dp_load_llmc(dp_state *d, const char *path, ust_err *e) {
    llmc_ctx ctx = {d};
    return model_load_llmc(d->m, path, store_llmc, &ctx, e);
}

int dp_load_slices(dp_state *d, dp_read_fn read, void *ctx, ust_err *e) {
    float *host = NULL;
    int64_t cap = 0;
    int rc = 0;
    for (int i = 0; rc == 0 && i < model_num_params(d->m); i++) {
        const model_param *q = model_param_at(d->m, i);
        int64_t a, b, t0 = piece(d, i, !whole(d, BUF_PARAMS), &a, &b);
        if (b <= a) continue;
        if (b - a > cap) host = realloc(host, (cap = b - a) * sizeof(float));
        UST_ASSERT(host, "out of host memory");
        ckpt_slice s = q->slice;
        s.flat0 = q->slice.flat0 + a;
        s.flat1 = q->slice.flat0 + b;
        rc = read(ctx, &q->whole, &s, host, e);
        if (rc == 0)
            d->ops->to_device(d->ops, at(d, BUF_PARAMS, model_param_unit(d->m, i), t0 + a), host,
                              (b - a) * sizeof(float));
    }
    free(host);
    return rc;
}

/* Whether Muon steps the tensor t: its one state is "<name>.momentum_buffer" (torch's name), where
 * AdamW's are "<name>.exp_avg" and "<name>.exp_avg_sq". */
static int muon_tensor(const dp_state *d, const ckpt_tensor *t) {
    return optim_muon_takes(d->cfg, optim_matrix_kind(t->name, t->ndim, t->ndim == 2));
}

static ckpt_tensor tensor_of(const dp_state *d, const model_param *q, dp_buf b) {
    ckpt_tensor t = q->whole;
    if (b == BUF_M || b == BUF_V) {
        const char *suffix = b == BUF_V                  ? "exp_avg_sq"
                             : muon_tensor(d, &q->whole) ? "momentum_buffer"
                                                         : "exp_avg";
        snprintf(t.name, sizeof t.name, "%s.%s", q->name, suffix);
    }
    return t;
}

/* The whole model's tensors (other stages' too) in one of the two files, in checkpoint order;
 * *n gets their count (malloc'd). */
static ckpt_tensor *file_tensors(dp_state *d, int optimizer, int *n) {
    int np;
    const ckpt_tensor *all = model_all_tensors(d->m, &np);
    ckpt_tensor *ts = calloc(optimizer ? 2 * (size_t)np : (size_t)np, sizeof *ts);
    UST_ASSERT(ts, "out of host memory");
    *n = 0;
    for (int i = 0; i < np; i++) {
        model_param q = {.whole = all[i]};
        snprintf(q.name, sizeof q.name, "%s", all[i].name);
        if (!optimizer) {
            ts[(*n)++] = tensor_of(d, &q, BUF_PARAMS);
            continue;
        }
        ts[(*n)++] = tensor_of(d, &q, BUF_M);
        if (!muon_tensor(d, &all[i])) ts[(*n)++] = tensor_of(d, &q, BUF_V);
    }
    return ts;
}

/* Every rank declares the whole model's tensors: the file layout is the same everywhere, and
 * each rank fills in what it holds. */
static int list_file(dp_state *d, ckpt_writer *w, int optimizer, ust_err *e) {
    int n;
    ckpt_tensor *ts = file_tensors(d, optimizer, &n);
    int file =
        ckpt_add_file(w, optimizer ? "optimizer.safetensors" : "model.safetensors", ts, n, e);
    free(ts);
    return file;
}

/* Whether this rank writes parameter i's partition (transfer's rule when saving). */
static int writes(const dp_state *d, const model_param *q) {
    if (!q->tp_split && d->mp && comm_rank(d->mp) != 0) return 0; /* written once */
    return !q->replica;                                           /* the owner's stage writes it */
}

/* Writes (or reads) this rank's pieces of buffer b: its partition when saving (every element is
 * written by exactly one member), everything it holds when loading. */
static int transfer(dp_state *d, dp_buf b, int file, ckpt_writer *w, ckpt_reader *r, ust_err *e) {
    float *host = NULL;
    uint16_t *host16 = NULL;
    int64_t cap = 0;
    int rc = 0;
    for (int i = 0; rc == 0 && i < model_num_params(d->m); i++) {
        const model_param *q = model_param_at(d->m, i);
        int64_t a, bb, t0 = piece(d, i, w ? 1 : !whole(d, b), &a, &bb);
        if (bb <= a) continue;
        if (w && !writes(d, q)) continue;
        if (b == BUF_V && muon_tensor(d, &q->whole)) continue; /* Muon keeps one state */
        if (bb - a > cap) {
            host = realloc(host, (bb - a) * sizeof(float));
            if (d->buf.m16) host16 = realloc(host16, (bb - a) * sizeof(uint16_t));
            UST_ASSERT(host && (host16 || !d->buf.m16), "out of host memory");
            cap = bb - a;
        }
        int u = model_param_unit(d->m, i);
        /* bf16 states (the backend's memory): through host16, widened to the checkpoint's fp32
         * values (bf16 numbers) and rounded back, so either state dtype resumes the other */
        uint16_t *s16 = b == BUF_M ? d->buf.m16 : b == BUF_V ? d->buf.v16 : NULL;
        size_t n16 = (size_t)(bb - a) * sizeof(uint16_t);
        if (s16) s16 += state_off(d, u, t0 + a);
        float *dev = s16 ? NULL : at(d, b, u, t0 + a);
        ckpt_tensor t = tensor_of(d, q, b);
        ckpt_slice s = q->slice;
        s.flat0 = q->slice.flat0 + a;
        s.flat1 = q->slice.flat0 + bb;
        if (w) { /* checkpoint.async: straight into the stage */
            float *staged = NULL;
            rc = ckpt_stage_reserve(w, file, t.name, &s, &staged, e);
            if (rc == 0 && s16) {
                d->ops->to_host(d->ops, host16, s16, n16);
                state_unpack(staged ? staged : host, host16, bb - a);
            }
            if (rc == 0 && !s16)
                d->ops->to_host(d->ops, staged ? staged : host, dev, (bb - a) * sizeof(float));
            if (rc == 0 && !staged) rc = ckpt_write_slice(w, file, t.name, &s, host, e);
        } else {
            const char *fname = b == BUF_PARAMS ? "model.safetensors" : "optimizer.safetensors";
            rc = ckpt_read_slice(r, fname, &t, &s, host, e);
            if (rc == 0 && s16) {
                state_pack(host16, host, bb - a);
                d->ops->to_device(d->ops, s16, host16, n16);
            }
            if (rc == 0 && !s16) d->ops->to_device(d->ops, dev, host, (bb - a) * sizeof(float));
        }
    }
    free(host);
    free(host16);
    return rc;
}

int64_t dp_save_bytes(const dp_state *d) {
    int64_t n = 0;
    for (int i = 0; i < model_num_params(d->m); i++) {
        const model_param *q = model_param_at(d->m, i);
        for (int k = 0; k < (q->repeat > 1 ? q->repeat : 1); k++) { /* the memory plan's experts */
            int64_t a, b;
            piece_copy(d, i, k, 1, &a, &b);
            if (b > a && writes(d, q)) n += (b - a) * (muon_tensor(d, &q->whole) ? 2 : 3);
        }
    }
    return n * (int64_t)sizeof(float); /* the parameters, m and (AdamW's) v */
}

int dp_save(dp_state *d, ckpt_writer *w, ust_err *e) {
    /* both always: declaring a file is a step every rank takes together, failed or not */
    int fm = list_file(d, w, 0, e);
    int fo = list_file(d, w, 1, e);
    if (fm < 0 || fo < 0) return -1;
    return transfer(d, BUF_PARAMS, fm, w, NULL, e) || transfer(d, BUF_M, fo, w, NULL, e) ||
                   transfer(d, BUF_V, fo, w, NULL, e)
               ? -1
               : 0;
}

/* Both files hold only this model's tensors (a missing one fails its read). */
static int check_unused(dp_state *d, ckpt_reader *r, ust_err *e) {
    int rc = 0;
    for (int optimizer = 0; optimizer < 2 && rc == 0; optimizer++) {
        int n;
        ckpt_tensor *ts = file_tensors(d, optimizer, &n);
        rc = ckpt_check_unused(r, optimizer ? "optimizer.safetensors" : "model.safetensors", ts, n,
                               e);
        free(ts);
    }
    return rc;
}

int dp_load_weights(dp_state *d, ckpt_reader *r, ust_err *e) {
    int n;
    ckpt_tensor *ts = file_tensors(d, 0, &n);
    int rc = ckpt_check_unused(r, "model.safetensors", ts, n, e);
    free(ts);
    int64_t moments = d->stage >= 1 ? d->lay.shard_numel : d->lay.numel;
    size_t size = d->buf.m16 ? sizeof(uint16_t) : sizeof(float);
    d->ops->zero(d->ops, d->buf.m16 ? (void *)d->buf.m16 : d->buf.mom_m, (size_t)moments * size);
    d->ops->zero(d->ops, d->buf.v16 ? (void *)d->buf.v16 : d->buf.mom_v, (size_t)moments * size);
    return rc || transfer(d, BUF_PARAMS, 0, NULL, r, e) ? -1 : 0;
}

int dp_load(dp_state *d, ckpt_reader *r, ust_err *e) {
    return check_unused(d, r, e) || transfer(d, BUF_PARAMS, 0, NULL, r, e) ||
                   transfer(d, BUF_M, 0, NULL, r, e) || transfer(d, BUF_V, 0, NULL, r, e)
               ? -1
               : 0;
}
