/* data_blend: weighted blends of datasets (data.h). The assignment is Megatron's greedy
 * error-minimizing index computed step by step from the position instead of built for the whole
 * run up front, so it costs O(samples x datasets) per step and no memory. */
#include "data.h"

#include "rng.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct data_blend {
    int n;
    cfg_dataset sets[CFG_MAX_BLEND];
    double w[CFG_MAX_BLEND]; /* normalized to sum 1 */
    ust_dataset *d[CFG_MAX_BLEND];
};

/* w[i] = weight i / the sum, computed without overflow: the weights are divided by the largest
 * first (so [1e308, 1e308, 1e307] sums to 2.1, not inf), which keeps the smallest positive double
 * positive too. -1 naming the weights when they give no finite positive proportions. */
static int normalize(const cfg_dataset *sets, int n, double *w, ust_err *e) {
    double max = 0, sum = 0;
    for (int i = 0; i < n; i++)
        if (sets[i].weight > max) max = sets[i].weight;
    for (int i = 0; i < n; i++) sum += w[i] = sets[i].weight / max;
    int ok = isfinite(max) && max > 0 && isfinite(sum) && sum > 0;
    for (int i = 0; i < n && ok; i++) ok = isfinite(w[i] /= sum) && w[i] > 0;
    if (ok) return 0;
    char list[CFG_MAX_BLEND * 26] = "";
    for (int i = 0, len = 0; i < n; i++)
        len += snprintf(list + len, sizeof list - (size_t)len, "%s%.17g", i ? ", " : "",
                        sets[i].weight);
    return ust_errf(e,
                    "data: the blend's weights [%s] give no finite positive proportions (each "
                    "must be a finite positive number)",
                    list);
}

int data_blend_open(data_blend **out, const cfg_dataset *sets, int n, ust_data_format fmt,
                    int vocab_size, int T, ust_err *e) {
    *out = NULL;
    UST_ASSERT(n >= 1 && n <= CFG_MAX_BLEND, "blend of %d datasets", n);
    data_blend *b = calloc(1, sizeof *b);
    UST_ASSERT(b, "out of memory");
    b->n = n;
    if (normalize(sets, n, b->w, e)) {
        free(b);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        b->sets[i] = sets[i];
        ust_err inner;
        ust_data_format f = sets[i].format >= 0 ? (ust_data_format)sets[i].format : fmt;
        if (data_open(&b->d[i], sets[i].path, f, vocab_size, &inner) ||
            data_check_seq_len(b->d[i], T, &inner)) {
            if (n > 1)
                ust_errf(e, "dataset %d of the blend (%s): %s", i, sets[i].path, inner.msg);
            else
                ust_errf(e, "%s", inner.msg);
            data_blend_close(b);
            return -1;
        }
    }
    *out = b;
    return 0;
}

void data_blend_close(data_blend *b) {
    if (!b) return;
    for (int i = 0; i < b->n; i++)
        if (b->d[i]) data_close(b->d[i]);
    free(b);
}

int data_blend_count(const data_blend *b) { return b->n; }
const cfg_dataset *data_blend_set(const data_blend *b, int d) { return &b->sets[d]; }

int64_t data_blend_epoch_samples(const data_blend *b, int d, int T) {
    return data_num_samples(b->d[d], T);
}

void data_blend_assign(const data_blend *b, data_blend_pos *pos, int64_t i, int64_t n, int *which,
                       int64_t *index) {
    int64_t since = 0;
    for (int d = 0; d < b->n; d++) since += pos->consumed[d] - pos->base_consumed[d];
    UST_ASSERT(since == i - pos->base_sample,
               "blend position: %lld samples given since sample %lld, but at sample %lld",
               (long long)since, (long long)pos->base_sample, (long long)i);
    for (int64_t k = 0; k < n; k++) {
        double j1 = (double)(i + k - pos->base_sample + 1);
        int best = 0;
        double best_err = 0;
        for (int d = 0; d < b->n; d++) {
            double err = b->w[d] * j1 - (double)(pos->consumed[d] - pos->base_consumed[d]);
            if (d == 0 || err > best_err) best = d, best_err = err;
        }
        which[k] = best;
        index[k] = pos->consumed[best]++;
    }
}

static uint64_t dataset_seed(int d, uint64_t seed) {
    return d == 0 ? seed : rng_u64(seed, 0x626c656e64ULL /* "blend" */, (uint64_t)d);
}

void data_blend_get(const data_blend *b, int d, int64_t index, int T, bool shuffle, uint64_t seed,
                    int32_t *out) {
    data_get_samples(b->d[d], index, 1, T, shuffle, dataset_seed(d, seed), out);
}

int data_blend_pack(data_blend *b, int T, int eot, int buffer, bool drop, data_pack_stats *st,
                    ust_err *e) {
    memset(st, 0, sizeof *st);
    for (int d = 0; d < b->n; d++) {
        data_pack_stats one;
        ust_err inner;
        if (data_pack(b->d[d], T, eot, buffer, drop, &one, &inner))
            return ust_errf(e, "%s: %s", b->sets[d].path, inner.msg);
        st->examples += one.examples, st->windows += one.windows, st->split += one.split;
        st->dropped += one.dropped, st->tokens += one.tokens, st->pad += one.pad;
    }
    return 0;
}

bool data_blend_has_mask(const data_blend *b) {
    bool any = false;
    for (int d = 0; d < b->n; d++) any |= data_has_mask(b->d[d]);
    return any;
}

void data_blend_get_mask(const data_blend *b, int d, int64_t index, int T, bool shuffle,
                         uint64_t seed, uint8_t *out) {
    data_get_masks(b->d[d], index, 1, T, shuffle, dataset_seed(d, seed), out);
}

/* ------------------------------------------------------------------ the position in checkpoints */

void data_blend_save(const data_blend *b, const data_blend_pos *pos, cJSON *state) {
    cJSON *j = cJSON_AddObjectToObject(state, "data");
    cJSON *sets = cJSON_AddArrayToObject(j, "datasets");
    for (int d = 0; d < b->n; d++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "path", b->sets[d].path);
        cJSON_AddNumberToObject(o, "weight", b->sets[d].weight);
        cJSON_AddNumberToObject(o, "consumed", (double)pos->consumed[d]);
        cJSON_AddNumberToObject(o, "base_consumed", (double)pos->base_consumed[d]);
        cJSON_AddItemToArray(sets, o);
    }
    cJSON_AddNumberToObject(j, "base_sample", (double)pos->base_sample);
}

/* A non-negative whole number of a checkpoint's JSON (exact up to 2^53). */
static int json_count(const cJSON *o, const char *key, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return -1;
    *out = (int64_t)v->valuedouble;
    return 0;
}

/* The checkpoint's datasets, as saved; -1 when the "data" object is malformed. */
static int saved_sets(const cJSON *data, cfg_dataset *sets, data_blend_pos *pos, int *n) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(data, "datasets");
    *n = cJSON_GetArraySize(arr);
    if (!cJSON_IsArray(arr) || *n < 1 || *n > CFG_MAX_BLEND ||
        json_count(data, "base_sample", &pos->base_sample))
        return -1;
    for (int d = 0; d < *n; d++) {
        const cJSON *o = cJSON_GetArrayItem(arr, d);
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "path");
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(o, "weight");
        if (!cJSON_IsString(p) || !cJSON_IsNumber(w) ||
            json_count(o, "consumed", &pos->consumed[d]) ||
            json_count(o, "base_consumed", &pos->base_consumed[d]) ||
            pos->base_consumed[d] > pos->consumed[d])
            return -1;
        snprintf(sets[d].path, sizeof sets[d].path, "%s", p->valuestring);
        sets[d].weight = w->valuedouble;
    }
    return 0;
}

/* How the blend differs from the checkpoint's ("" when it does not). */
static void describe_change(const data_blend *b, const cfg_dataset *old, int n, char *out,
                            size_t cap) {
    out[0] = 0;
    size_t len = 0;
    if (n != b->n) len += (size_t)snprintf(out, cap, "%d datasets, the checkpoint's %d", b->n, n);
    for (int d = 0; d < b->n && d < n && len < cap; d++) {
        if (strcmp(old[d].path, b->sets[d].path))
            len += (size_t)snprintf(out + len, cap - len, "%sdataset %d is %s, was %s",
                                    len ? "; " : "", d, b->sets[d].path, old[d].path);
        else if (old[d].weight != b->sets[d].weight)
            len += (size_t)snprintf(out + len, cap - len, "%sdataset %d (%s) weight %g, was %g",
                                    len ? "; " : "", d, b->sets[d].path, b->sets[d].weight,
                                    old[d].weight);
    }
}

int data_blend_restore(const data_blend *b, const cJSON *state, int64_t i, bool allow_reweight,
                       data_blend_pos *pos, char *note, size_t cap, ust_err *e) {
    memset(pos, 0, sizeof *pos);
    note[0] = 0;
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(state, "data");
    cfg_dataset old[CFG_MAX_BLEND];
    data_blend_pos was = {0};
    int n = 0;
    if (!data) { /* from before blends: one dataset gave every sample */
        n = 1;
        snprintf(old[0].path, sizeof old[0].path, "%s", b->sets[0].path);
        old[0].weight = b->n == 1 ? b->sets[0].weight : 1;
        was.consumed[0] = i;
        if (b->n > 1) snprintf(old[0].path, sizeof old[0].path, "(a lone dataset)");
    } else if (saved_sets(data, old, &was, &n)) {
        return ust_errf(e, "the checkpoint's \"data\" position is malformed");
    }
    char change[1024];
    describe_change(b, old, n, change, sizeof change);
    if (!change[0]) {
        int64_t since = 0;
        for (int d = 0; d < n; d++) since += was.consumed[d] - was.base_consumed[d];
        if (since != i - was.base_sample)
            return ust_errf(e,
                            "the checkpoint's data position (%lld samples since sample %lld) "
                            "does not match its sample index %lld",
                            (long long)since, (long long)was.base_sample, (long long)i);
        *pos = was;
        return 0;
    }
    if (!allow_reweight)
        return ust_errf(e,
                        "data.train is not the blend the checkpoint was trained with (%s): set "
                        "data.allow_reweight: true to go on with the new one from sample %lld",
                        change, (long long)i);
    for (int d = 0; d < b->n; d++) /* a dataset kept goes on where it was */
        for (int k = 0; k < n; k++)
            if (!strcmp(old[k].path, b->sets[d].path)) pos->consumed[d] = was.consumed[k];
    pos->base_sample = i;
    memcpy(pos->base_consumed, pos->consumed, sizeof pos->consumed);
    snprintf(note, cap,
             "data: the blend changed (%s); data.allow_reweight: the new weights start "
             "at sample %lld",
             change, (long long)i);
    return 0;
}

/* ------------------------------------------------------------------ meta.json against the run */

int data_check_meta(const ust_config *c, int *eot, ust_err *e) {
    int docs = c->data.doc_mask || c->data.reset_positions || c->data.packing;
    *eot = c->data.eot_id;
    for (int val = 0; val < 2; val++) {
        cfg_dataset sets[CFG_MAX_BLEND];
        int n = cfg_data_sets(c, val, sets);
        for (int d = 0; d < n; d++) {
            data_meta meta;
            int found = data_meta_read(sets[d].path, &meta, e);
            if (found < 0) return -1;
            if (!found) continue;
            if (meta.vocab_size > c->model.vocab_size)
                return ust_errf(e,
                                "%s: the shards' tokens come from a vocabulary of %d, above "
                                "model.vocab_size = %d",
                                meta.path, meta.vocab_size, c->model.vocab_size);
            if (meta.eot_id >= c->model.vocab_size) /* and the checkpoint would record it */
                return ust_errf(e,
                                "%s: end of text is %d, not a token of model.vocab_size = %d "
                                "(no token of the shards can end a document)",
                                meta.path, meta.eot_id, c->model.vocab_size);
            if (meta.vocab_size >= 0 && meta.eot_id >= meta.vocab_size) /* at odds with itself */
                return ust_errf(e,
                                "%s: eot_id %d is not a token of its own vocab_size %d (ids are "
                                "0..%d): not what data prep writes",
                                meta.path, meta.eot_id, meta.vocab_size, meta.vocab_size - 1);
            if (docs && meta.eot_id >= 0 && *eot >= 0 && meta.eot_id != *eot)
                return ust_errf(e, "%s: end of text is %d, but %s %d", meta.path, meta.eot_id,
                                c->data.eot_id >= 0 ? "data.eot_id is" : "another dataset's is",
                                *eot);
            if (*eot < 0) *eot = meta.eot_id;
        }
    }
    if (docs && *eot < 0)
        return ust_errf(e,
                        "data.%s needs the end-of-text id that ends each document: set "
                        "data.eot_id, or prepare the shards with `ustrain data prep` (its "
                        "meta.json has it)",
                        c->data.doc_mask          ? "doc_mask"
                        : c->data.reset_positions ? "reset_positions"
                                                  : "packing");
    return 0;
}
