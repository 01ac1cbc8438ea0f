/* generate.c: ustrain generate (generate.h): weight sources, tokenizer choice, the prefill +
 * decode loop with streaming output, sampling, and the decode benchmark. */
#include "generate.h"

#include "fs.h"
#include "hf_import.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"
#include "infer.h"
#include "ops.h"
#include "rng.h"
#include "tokenizer.h"

#define GEN_CHUNK 128 /* prompt tokens per prefill forward: each forward reads the weights once */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* ------------------------------------------------------------------ sampling */

/* a ranks before b: higher logit, ties to the lower id (so greedy is argmax's first) */
static int cand_before(const gen_cand *a, const gen_cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cand_cmp(const void *x, const void *y) {
    const gen_cand *a = x, *b = y;
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

/* Min-heap (by rank) of the k best candidates seen: the root is the worst kept. */
static void heap_down(gen_cand *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && cand_before(&h[w], &h[l])) w = l;
        if (r < n && cand_before(&h[w], &h[r])) w = r;
        if (w == i) return;
        gen_cand t = h[i];
        h[i] = h[w], h[w] = t, i = w;
    }
}

/* c[0..k) = the k best of c[0..V), sorted best first. O(V log k). */
static void keep_top_k(gen_cand *c, int V, int k) {
    for (int i = k / 2 - 1; i >= 0; i--) heap_down(c, k, i);
    for (int i = k; i < V; i++)
        if (cand_before(&c[i], &c[0])) {
            c[0] = c[i];
            heap_down(c, k, 0);
        }
    qsort(c, (size_t)k, sizeof *c, cand_cmp);
}

int32_t gen_sample(const gen_sampling *s, const float *logits, int V, int64_t step, gen_cand *c) {
    if (s->temperature <= 0) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    for (int i = 0; i < V; i++) c[i] = (gen_cand){(float)(logits[i] / s->temperature), i};
    int n = V, sorted = 0;
    if (s->top_k > 0 && s->top_k < V) {
        keep_top_k(c, V, s->top_k);
        n = s->top_k, sorted = 1;
    }
    if (s->top_p < 1 && !sorted) qsort(c, (size_t)n, sizeof *c, cand_cmp);
    double mx = -INFINITY, total = 0;
    for (int i = 0; i < n; i++) mx = c[i].logit > mx ? c[i].logit : mx;
    double *p = malloc((size_t)n * sizeof *p);
    UST_ASSERT(p, "out of host memory (%d candidates)", n);
    for (int i = 0; i < n; i++) total += p[i] = exp((double)c[i].logit - mx);
    if (s->top_p < 1) { /* the smallest best-first prefix holding top_p of the mass (>= 1 token) */
        double cum = 0;
        int keep = 0;
        while (keep < n && cum < s->top_p * total) cum += p[keep++];
        n = keep, total = cum;
    }
    double u = rng_uniform(s->seed, rng_hash_str("generate"), (uint64_t)step) * total, acc = 0;
    int32_t pick = c[n - 1].id; /* rounding may leave u just above the last sum */
    for (int i = 0; i < n; i++)
        if ((acc += p[i]) > u) {
            pick = c[i].id;
            break;
        }
    free(p);
    return pick;
}

/* ------------------------------------------------------------------ streaming */

size_t gen_utf8_ready(const unsigned char *s, size_t n) {
    /* the last lead byte within the last 4, and whether its sequence is still incomplete */
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned char c = s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* a continuation byte: look further back */
        int len = c >= 0xC2 && c <= 0xDF   ? 2
                  : c >= 0xE0 && c <= 0xEF ? 3
                  : c >= 0xF0 && c <= 0xF4 ? 4
                                           : 1;
        return (size_t)len > back ? n - back : n;
    }
    return n;
}

typedef struct {
    unsigned char buf[64];
    size_t n;
    FILE *out;
} text_stream;

/* Appends a token's bytes and prints what ends on a whole character. */
static void stream_put(text_stream *t, const char *s, size_t len) {
    for (size_t i = 0; i < len; i++) {
        if (t->n == sizeof t->buf) { /* never a pending character this long: flush as is */
            fwrite(t->buf, 1, t->n, t->out);
            t->n = 0;
        }
        t->buf[t->n++] = (unsigned char)s[i];
    }
    size_t ready = gen_utf8_ready(t->buf, t->n);
    fwrite(t->buf, 1, ready, t->out);
    memmove(t->buf, t->buf + ready, t->n - ready);
    t->n -= ready;
    fflush(t->out);
}

static void stream_end(text_stream *t) {
    fwrite(t->buf, 1, t->n, t->out);
    t->n = 0;
    fputc('\n', t->out);
    fflush(t->out);
}

/* ------------------------------------------------------------------ weight sources */

/* Where a model comes from: its config, the weight source infer_create reads, the tokenizer it
 * names ("" none) with its end-of-text id (-1: the tokenizer's), and how to close it. A format
 * is an open function filling one; a Hugging Face directory (core/hf_import) is one more. */
typedef struct {
    ust_config cfg;
    infer_read_fn read;
    void *ctx;
    void (*close)(void *ctx);
    char where[PATH_MAX]; /* for messages: the step directory */
    char tokenizer[PATH_MAX];
    int eot;
} gen_source;

/* A ustrain checkpoint step: model.safetensors, whole fp32 tensors under canonical names. */
static int read_ckpt(void *ctx, const ckpt_tensor *t, float *host, ust_err *e) {
    ckpt_slice s = ckpt_whole(t);
    return ckpt_read_slice(ctx, "model.safetensors", t, &s, host, e);
}

static void close_ckpt(void *ctx) { ckpt_close(ctx); }

/* state.json's "tokenizer" record ({"path": tokenizer.json or "bytes", "eot_id": N}), if any. */
static void tokenizer_record(gen_source *src, const char *state_json) {
    cJSON *j = cJSON_Parse(state_json);
    const cJSON *rec = cJSON_GetObjectItemCaseSensitive(j, "tokenizer");
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(rec, "path");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(rec, "eot_id");
    if (cJSON_IsString(rp)) snprintf(src->tokenizer, sizeof src->tokenizer, "%s", rp->valuestring);
    if (cJSON_IsNumber(re)) src->eot = (int)re->valuedouble;
    cJSON_Delete(j);
}

/* path: a step directory, or a checkpoint directory (its newest finished step). */
static int open_ckpt_source(const char *path, gen_source *src, ust_err *e) {
    if (ckpt_resolve_step(path, "generate", src->where, sizeof src->where, e) ||
        ckpt_load_config(src->where, "generate", &src->cfg, e))
        return -1;
    ckpt_reader *r = ckpt_open(src->where, e);
    if (!r) return -1;
    src->read = read_ckpt, src->ctx = r, src->close = close_ckpt;
    tokenizer_record(src, ckpt_state_json(r));
    return 0;
}

/* A Hugging Face model directory (config.json, no state.json): the importer's mapping read
 * whole tensor by whole tensor; its tokenizer.json when there is one. */
static int is_hf_dir(const char *path) {
    char q[PATH_MAX + 32];
    snprintf(q, sizeof q, "%s/state.json", path);
    return hf_is_model_dir(path) && access(q, F_OK) != 0;
}

static int read_hf(void *ctx, const ckpt_tensor *t, float *host, ust_err *e) {
    ckpt_slice s = ckpt_whole(t);
    return hf_read_slice(ctx, t, &s, host, e);
}

static void close_hf(void *ctx) { hf_close(ctx); }

static int open_hf_source(const char *path, gen_source *src, int allow_nonfinite, ust_err *e) {
    hf_model *h = hf_open(path, e);
    if (!h) return -1;
    hf_allow_nonfinite(h, allow_nonfinite);
    snprintf(src->where, sizeof src->where, "%s", path);
    cfg_defaults(&src->cfg);
    int rc = hf_apply_config(h, &src->cfg, e);
    ust_config *c = &src->cfg;
    if (c->train.seq_len > c->model.max_seq_len) c->train.seq_len = c->model.max_seq_len;
    if (!rc) rc = cfg_validate(c, 0, e);
    if (rc) {
        hf_close(h);
        return -1;
    }
    src->read = read_hf, src->ctx = h, src->close = close_hf;
    char tok[PATH_MAX + 32];
    snprintf(tok, sizeof tok, "%s/tokenizer.json", path);
    if (access(tok, R_OK) == 0) snprintf(src->tokenizer, sizeof src->tokenizer, "%s", tok);
    return 0;
}

static int open_source(const char *path, gen_source *src, int allow_nonfinite, ust_err *e) {
    src->eot = -1;
    return is_hf_dir(path) ? open_hf_source(path, src, allow_nonfinite, e)
                           : open_ckpt_source(path, src, e);
}

/* Random weights for the benchmark: N(0, 0.02) matrices, norms' weights 1, biases 0. */
static int read_random(void *ctx, const ckpt_tensor *t, float *host, ust_err *e) {
    (void)e;
    uint64_t seed = *(const uint64_t *)ctx, stream = rng_hash_str(t->name);
    int64_t n = t->ndim == 2 ? t->shape[0] * t->shape[1] : t->shape[0];
    size_t len = strlen(t->name);
    float value = len > 5 && !strcmp(t->name + len - 5, ".bias") ? 0.0f : 1.0f;
    for (int64_t i = 0; i < n; i++)
        host[i] = t->ndim == 2 ? 0.02f * rng_normal(seed, stream, (uint64_t)i) : value;
    return 0;
}

/* ------------------------------------------------------------------ the tokenizer */

/* --tokenizer, else the one the source names; *eot gets the end-of-text id (the source's record
 * unless --tokenizer overrides it, else the tokenizer's own). */
static int pick_tokenizer(const char *opt, const gen_source *src, tok_tokenizer **t, int *eot,
                          ust_err *e) {
    const char *path = opt ? opt : src->tokenizer[0] ? src->tokenizer : NULL;
    if (!path)
        return ust_errf(e,
                        "generate: %s does not record its tokenizer (state.json has no "
                        "\"tokenizer\"): pass --tokenizer tokenizer.json, or --tokenizer bytes "
                        "for byte-level data (ustrain data demo, data prep without --tokenizer)",
                        src->where);
    if (!strcmp(path, "bytes"))
        *t = tok_bytes();
    else if (tok_load(t, path, e))
        return -1;
    *eot = !opt && src->eot >= 0 ? src->eot : tok_eot(*t);
    return 0;
}

/* The prompt's ids, refused when empty, longer than max_seq_len or outside the vocabulary. */
static int encode_prompt(const tok_tokenizer *t, const gen_options *opt, const ust_config *c,
                         tok_ids *ids, ust_err *e) {
    if (opt->prompt_len == 0) return ust_errf(e, "generate: the prompt is empty");
    tok_work *w = tok_work_new(t);
    tok_encode(t, w, opt->prompt, opt->prompt_len, ids);
    tok_work_free(w);
    if (ids->n > c->model.max_seq_len)
        return ust_errf(e,
                        "generate: the prompt is %lld tokens, more than the model's "
                        "max_seq_len %d",
                        (long long)ids->n, c->model.max_seq_len);
    for (int64_t i = 0; i < ids->n; i++)
        if (ids->ids[i] < 0 || ids->ids[i] >= c->model.vocab_size)
            return ust_errf(e,
                            "generate: prompt token %lld is id %d, outside the model's vocabulary "
                            "of %d (is the tokenizer (%s) the one the model was trained with?)",
                            (long long)i, ids->ids[i], c->model.vocab_size, tok_describe(t));
    return 0;
}

/* ------------------------------------------------------------------ the loop */

typedef struct {
    double prefill_s, decode_s;
    int64_t prompt, generated;
    int hit_limit;
} gen_stats;

/* Prefill in chunks of GEN_CHUNK; logits get the last prompt token's. */
static void prefill(infer_model *m, const tok_ids *ids, float *logits) {
    for (int64_t i = 0; i < ids->n; i += GEN_CHUNK) {
        int n = ids->n - i < GEN_CHUNK ? (int)(ids->n - i) : GEN_CHUNK;
        infer_forward(m, ids->ids + i, n, logits);
    }
}

/* Samples, streams and feeds back up to max_new tokens after the prompt. */
static int decode(infer_model *m, const tok_tokenizer *t, int eot, const gen_options *opt, int V,
                  int S, float *logits, FILE *dump, gen_stats *st, ust_err *e) {
    gen_cand *scratch = malloc((size_t)V * sizeof *scratch);
    UST_ASSERT(scratch, "out of host memory");
    text_stream ts = {.out = opt->out};
    double t0 = now_s();
    int rc = 0;
    for (int i = 0; i < opt->max_new; i++) {
        if (dump && fwrite(logits, sizeof(float), (size_t)V, dump) != (size_t)V) {
            rc = ust_errf(e, "generate: cannot write %s", opt->dump_logits);
            break;
        }
        int bad = -1;
        for (int v = 0; v < V && bad < 0; v++)
            if (!isfinite(logits[v])) bad = v;
        if (bad >= 0) { /* no distribution to sample: stop, rather than print token 0 forever */
            rc = ust_errf(e,
                          "generate: the logits of token %d are not finite (logit %d is %g): the "
                          "model's weights hold NaN or infinity",
                          i, bad, logits[bad]);
            break;
        }
        int32_t id = gen_sample(&opt->sampling, logits, V, i, scratch);
        if (id == eot) break;
        const char *s;
        size_t len;
        if (tok_decode(t, id, &s, &len) == 0) stream_put(&ts, s, len);
        st->generated++;
        if (i + 1 == opt->max_new) break;
        if (infer_len(m) == S) { /* the cache is full: no position left for this token */
            st->hit_limit = 1;
            break;
        }
        infer_forward(m, &id, 1, logits);
    }
    st->decode_s = now_s() - t0;
    stream_end(&ts);
    free(scratch);
    return rc;
}

static void print_stats(const gen_stats *st, int S) {
    /* decode rate: the forwards after the first new token (that one came from the prefill) */
    int64_t steps = st->generated > 1 ? st->generated - 1 : 0;
    fprintf(stderr,
            "generate: %lld prompt tokens, %lld new tokens, prefill %.3f s (%.1f tokens/s), "
            "decode %.2f tokens/s\n",
            (long long)st->prompt, (long long)st->generated, st->prefill_s,
            st->prefill_s > 0 ? st->prompt / st->prefill_s : 0.0,
            st->decode_s > 0 ? steps / st->decode_s : 0.0);
    if (st->hit_limit)
        fprintf(stderr, "generate: stopped at the model's max_seq_len (%d positions)\n", S);
}

typedef struct {
    gen_source src;
    tok_tokenizer *tok;
    tok_ids ids;
    int eot;
    FILE *dump; /* --dump-logits, opened before anything else */
} gen_input;

/* Everything that can be wrong with the input, checked before any weight is read. */
static int check_input(const char *path, const gen_options *opt, gen_input *in, ust_err *e) {
    if (open_source(path, &in->src, opt->allow_nonfinite, e) ||
        pick_tokenizer(opt->tokenizer, &in->src, &in->tok, &in->eot, e))
        return -1;
    return encode_prompt(in->tok, opt, &in->src.cfg, &in->ids, e);
}

static void free_input(gen_input *in) {
    if (in->dump) fclose(in->dump);
    if (in->src.close) in->src.close(in->src.ctx);
    tok_free(in->tok);
    free(in->ids.ids);
}

static int generate(gen_input *in, const gen_options *opt, ust_err *e) {
    ust_config *c = &in->src.cfg;
    c->run.device = opt->device;
    c->train.precision = PREC_FP32; /* fp32 activations: the weights are fp32 anyway */
    ust_ops *ops = ops_create(c, 0, 1, e);
    if (!ops) return UST_EXIT_USAGE;
    infer_model *m = NULL;
    if (infer_create(&m, c, ops, GEN_CHUNK, in->src.read, in->src.ctx, e)) {
        ops->destroy(ops);
        return UST_EXIT_USAGE;
    }
    fprintf(stderr, "generate: cache %lld bytes per token (%s, %d layers)\n",
            (long long)infer_cache_bytes_per_token(m),
            c->model.mla.enabled ? "the latent: kv_lora_rank + qk_rope_head_dim per layer"
                                 : "K and V: 2 x n_kv_head x head_dim per layer",
            c->model.n_layer);
    FILE *dump = in->dump;
    int rc = 0, V = c->model.vocab_size;
    float *logits = malloc((size_t)V * sizeof(float));
    UST_ASSERT(logits, "out of host memory");
    gen_stats st = {.prompt = in->ids.n};
    if (!rc) {
        double t0 = now_s();
        prefill(m, &in->ids, logits);
        st.prefill_s = now_s() - t0;
        rc = decode(m, in->tok, in->eot, opt, V, c->model.max_seq_len, logits, dump, &st, e);
        print_stats(&st, c->model.max_seq_len);
    }
    in->dump = NULL;
    if (dump && fclose(dump) != 0 && !rc)
        rc = ust_errf(e, "generate: cannot write %s: %s", opt->dump_logits, strerror(errno));
    free(logits);
    infer_destroy(m);
    ops->destroy(ops);
    return rc ? UST_EXIT_RUNTIME : 0;
}

int gen_run(const char *ckpt, const gen_options *opt, ust_err *e) {
    gen_input in;
    memset(&in, 0, sizeof in);
    if (opt->dump_logits && ckpt_refuse_output(opt->dump_logits, "generate: --dump-logits", e))
        return UST_EXIT_USAGE;
    if (opt->dump_logits &&
        !(in.dump = fs_fopen_output(opt->dump_logits, "generate: --dump-logits", e)))
        return UST_EXIT_USAGE;
    int rc = check_input(ckpt, opt, &in, e) ? UST_EXIT_USAGE : generate(&in, opt, e);
    free_input(&in);
    return rc;
}

/* ------------------------------------------------------------------ benchmark */

/* Bytes per second memcpy moves (read + write counted, as STREAM's copy does) over a buffer
 * larger than the caches, split over as many threads as the CPU backend runs (OpenMP's count),
 * so the bound is for the same cores: the fastest of a few copies. */
static double memcpy_bandwidth(size_t bytes) {
    int nt = omp_get_max_threads();
    size_t part = bytes / (size_t)nt / 64 * 64;
    char *a = malloc(bytes), *b = malloc(bytes);
    UST_ASSERT(a && b, "out of host memory (%zu bytes)", bytes);
    memset(a, 1, bytes), memset(b, 2, bytes);
    double best = INFINITY;
    for (int r = 0; r < 5; r++) {
        char *dst = r % 2 ? a : b, *src = r % 2 ? b : a;
        double t0 = now_s();
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int i = 0; i < nt; i++) memcpy(dst + i * part, src + i * part, part);
        double dt = now_s() - t0;
        best = dt < best ? dt : best;
    }
    free(a), free(b);
    return 2.0 * (double)part * nt / best;
}

int gen_bench(ust_config *c, int prompt_tokens, int new_tokens, ust_err *e) {
    c->train.precision = PREC_FP32;
    if (prompt_tokens + new_tokens > c->model.max_seq_len)
        return ust_errf(e, "bench generate: %d prompt + %d new tokens exceed max_seq_len %d",
                        prompt_tokens, new_tokens, c->model.max_seq_len),
               UST_EXIT_USAGE;
    ust_ops *ops = ops_create(c, 0, 1, e);
    if (!ops) return UST_EXIT_USAGE;
    uint64_t seed = c->run.seed;
    infer_model *m = NULL;
    UST_ASSERT(!infer_create(&m, c, ops, GEN_CHUNK, read_random, &seed, e), "%s", e->msg);
    int V = c->model.vocab_size;
    float *logits = malloc((size_t)V * sizeof(float));
    tok_ids ids = {0};
    for (int i = 0; i < prompt_tokens; i++) tok_ids_push(&ids, (int32_t)(i * 7919 % V));
    double t0 = now_s();
    prefill(m, &ids, logits);
    double prefill_s = now_s() - t0;
    gen_sampling greedy = {0};
    t0 = now_s();
    for (int i = 0; i < new_tokens; i++) {
        int32_t id = gen_sample(&greedy, logits, V, i, NULL);
        infer_forward(m, &id, 1, logits);
    }
    double decode_s = now_s() - t0, tps = new_tokens / decode_s;
    double bytes = (double)infer_weight_bytes_per_token(m);
    double bw = memcpy_bandwidth((size_t)1 << 28), bound = bw / bytes;
    printf("bench generate: %s, %lld parameters, %s, prefill %d tokens %.3f s, decode %d tokens\n",
           c->source, (long long)infer_param_count(m), ops->name, prompt_tokens, prefill_s,
           new_tokens);
    printf("bench generate: decode %.2f tokens/s; weights read per token %.1f MB; memcpy "
           "bandwidth %.2f GB/s (read + write); bound %.2f tokens/s; ratio %.2f\n",
           tps, bytes / 1e6, bw / 1e9, bound, tps / bound);
    free(logits);
    free(ids.ids);
    infer_destroy(m);
    ops->destroy(ops);
    return 0;
}
