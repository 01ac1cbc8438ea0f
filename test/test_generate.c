/* test_generate: the sampler (greedy ties, top-k, top-p, the draw's distribution and its seed)
 * and the streaming of UTF-8 split over tokens (core/tools/generate.h). The model side is
 * test/sh/generate.sh's: KV-cache logits against an independent numpy forward. */
#include "test.h"

#include "generate.h"
#include "infer.h"
#include "rng.h"

#include <math.h>

#define V 8

/* logits with softmax probabilities p (log p; p = 0 gives -inf) */
static void logits_of(const double *p, float *l) {
    for (int i = 0; i < V; i++) l[i] = p[i] > 0 ? (float)log(p[i]) : -INFINITY;
}

static void test_greedy_takes_the_first_of_equal_maxima(void) {
    float l[V] = {0, 3, 1, 3, -2, 3, 0, 0};
    gen_sampling s = {.temperature = 0};
    for (int step = 0; step < 5; step++)
        CHECK(gen_sample(&s, l, V, step, NULL) == 1, "step %d: picked %d", step,
              gen_sample(&s, l, V, step, NULL));
}

/* Over 20000 draws each token's frequency is its probability within 5 standard deviations
 * (sqrt(p(1-p)/n) <= 0.0035): a draw that ignored the probabilities, or walked them in another
 * order than it summed them, is off by far more. */
static void test_draws_follow_the_probabilities(void) {
    const double p[V] = {0.05, 0.3, 0.1, 0.0, 0.25, 0.2, 0.06, 0.04};
    float l[V];
    logits_of(p, l);
    gen_cand scratch[V];
    int count[V] = {0}, n = 20000;
    gen_sampling s = {.temperature = 1.0, .top_k = 0, .top_p = 1.0, .seed = 3};
    for (int i = 0; i < n; i++) count[gen_sample(&s, l, V, i, scratch)]++;
    for (int i = 0; i < V; i++) {
        double f = (double)count[i] / n, sd = sqrt(p[i] * (1 - p[i]) / n);
        CHECK(fabs(f - p[i]) <= 5 * sd + 1e-12, "token %d: frequency %.4f, probability %.4f", i, f,
              p[i]);
    }
}

/* top-k 3 draws only the 3 most probable, in their renormalized proportions. */
static void test_top_k_draws_among_the_k_best(void) {
    const double p[V] = {0.05, 0.3, 0.1, 0.01, 0.25, 0.2, 0.06, 0.03};
    float l[V];
    logits_of(p, l);
    gen_cand scratch[V];
    int count[V] = {0}, n = 20000;
    gen_sampling s = {.temperature = 1.0, .top_k = 3, .top_p = 1.0, .seed = 9};
    for (int i = 0; i < n; i++) count[gen_sample(&s, l, V, i, scratch)]++;
    CHECK(count[1] + count[4] + count[5] == n, "drew outside the top 3: %d of %d",
          n - count[1] - count[4] - count[5], n);
    double f1 = (double)count[1] / n, want = 0.3 / 0.75;
    CHECK(fabs(f1 - want) < 0.02, "token 1: frequency %.4f, renormalized probability %.4f", f1,
          want);
}

/* top-p keeps the smallest most-probable set whose mass reaches p: with 0.3, 0.25, 0.2, ...,
 * p = 0.5 keeps {1, 4} (0.55), p = 0.3 keeps {1} alone, p = 0.56 also 5. */
static void test_top_p_keeps_the_smallest_set_reaching_p(void) {
    const double p[V] = {0.05, 0.3, 0.1, 0.01, 0.25, 0.2, 0.06, 0.03};
    float l[V];
    logits_of(p, l);
    gen_cand scratch[V];
    struct {
        double top_p;
        int allowed[V];
    } c[] = {{0.5, {0, 1, 0, 0, 1, 0, 0, 0}},
             {0.3, {0, 1, 0, 0, 0, 0, 0, 0}},
             {0.56, {0, 1, 0, 0, 1, 1, 0, 0}}};
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
        int seen[V] = {0};
        gen_sampling s = {.temperature = 1.0, .top_k = 0, .top_p = c[k].top_p, .seed = 4};
        for (int i = 0; i < 4000; i++) seen[gen_sample(&s, l, V, i, scratch)] = 1;
        for (int i = 0; i < V; i++)
            CHECK(seen[i] == c[k].allowed[i], "top_p %.2f: token %d %s", c[k].top_p, i,
                  seen[i] ? "drawn but outside the nucleus" : "never drawn");
    }
}

/* A low temperature sharpens towards the argmax, a high one flattens. */
static void test_temperature_scales_the_logits(void) {
    const double p[V] = {0.05, 0.3, 0.1, 0.01, 0.25, 0.2, 0.06, 0.03};
    float l[V];
    logits_of(p, l);
    gen_cand scratch[V];
    int cold = 0, hot = 0, n = 4000;
    gen_sampling sc = {.temperature = 0.05, .top_p = 1.0, .seed = 1};
    gen_sampling sh = {.temperature = 100, .top_p = 1.0, .seed = 1};
    for (int i = 0; i < n; i++) {
        cold += gen_sample(&sc, l, V, i, scratch) == 1;
        hot += gen_sample(&sh, l, V, i, scratch) == 3;
    }
    CHECK(cold > 0.95 * n, "temperature 0.05: argmax in %d of %d", cold, n);
    CHECK(hot > 0.08 * n, "temperature 100: the least likely token in %d of %d (flat: 1/8)", hot,
          n);
}

/* The draw is a pure function of (seed, step): the same seed repeats, another one differs. */
static void test_seed_fixes_the_draws(void) {
    float l[V] = {1, 1, 1, 1, 1, 1, 1, 1};
    gen_cand scratch[V];
    gen_sampling a = {.temperature = 1.0, .top_p = 1.0, .seed = 11}, b = a;
    b.seed = 12;
    int same = 1, differ = 0;
    for (int i = 0; i < 64; i++) {
        int x = gen_sample(&a, l, V, i, scratch);
        same &= x == gen_sample(&a, l, V, i, scratch);
        differ |= x != gen_sample(&b, l, V, i, scratch);
    }
    CHECK(same, "the same seed and step drew two tokens");
    CHECK(differ, "seeds 11 and 12 drew the same 64 tokens");
}

/* Pending bytes are printed up to the last whole character: a lead byte whose continuation has
 * not arrived is held, anything else (ASCII, complete or invalid sequences) goes out. */
static void test_utf8_ready_holds_only_incomplete_characters(void) {
    struct {
        const char *s;
        size_t ready;
    } c[] = {
        {"ab", 2},
        {"a\xc3", 1},
        {"a\xc3\xa9", 3},
        {"\xe2\x82", 0},
        {"\xe2\x82\xac", 3},
        {"x\xf0\x9f\x98", 1},
        {"\xf0\x9f\x98\x80", 4},
        {"\xff", 1},
        {"\x80", 1},
        {"a\xc0", 2},
        {"", 0},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        size_t got = gen_utf8_ready((const unsigned char *)c[i].s, strlen(c[i].s));
        CHECK(got == c[i].ready, "case %zu: %zu bytes ready, expected %zu", i, got, c[i].ready);
    }
}

/* ---- the KV cache (core/infer) on random weights ---- */

static int read_random(void *ctx, const ckpt_tensor *t, float *host, ust_err *e) {
    (void)ctx, (void)e;
    int64_t n = t->ndim == 2 ? t->shape[0] * t->shape[1] : t->shape[0];
    for (int64_t i = 0; i < n; i++)
        host[i] = t->ndim == 2 ? 0.1f * rng_normal(5, rng_hash_str(t->name), (uint64_t)i) : 1.0f;
    return 0;
}

static const char *TINY_MOE =
    "model: {arch: llama, n_layer: 2, d_model: 32, n_head: 4, n_kv_head: 2, "
    "d_ff: 48, vocab_size: 70, max_seq_len: 32, moe: {num_experts: 4, "
    "top_k: 2, d_ff_expert: 24, every: 2}}\ntrain: {seq_len: 16}\n";

/* The last logits after 11 tokens: prefilled at once, in chunks of 4 (a chunk model), or one at
 * a time, all attend over the same cache: equal within fp32 reassociation of the matmuls (GEMM
 * vs GEMV rows), 1e-5 of the logits' scale. After infer_reset the cache is empty again: the same
 * tokens give the same bits. */
static void test_cache_gives_the_same_logits_whatever_the_chunks(void) {
    ust_config c;
    ust_err e;
    cfg_defaults(&c);
    CHECK(cfg_load_string(&c, TINY_MOE, "t.yaml", &e) == 0 && cfg_validate(&c, 0, &e) == 0, "%s",
          e.msg);
    ust_ops *o = ops_cpu_create(1, 1);
    infer_model *whole = NULL, *chunked = NULL;
    CHECK(infer_create(&whole, &c, o, 16, read_random, NULL, &e) == 0, "%s", e.msg);
    CHECK(infer_create(&chunked, &c, o, 4, read_random, NULL, &e) == 0, "%s", e.msg);
    int32_t tok[11] = {1, 5, 9, 33, 2, 69, 0, 7, 7, 40, 12};
    float a[70], b[70], d[70], again[70];
    infer_forward(whole, tok, 11, a);
    for (int i = 0; i < 11; i += 4) infer_forward(chunked, tok + i, i + 4 <= 11 ? 4 : 11 - i, b);
    infer_reset(whole);
    for (int i = 0; i < 11; i++) infer_forward(whole, tok + i, 1, d);
    CHECK(infer_len(whole) == 11 && infer_len(chunked) == 11, "cache lengths %d %d",
          infer_len(whole), infer_len(chunked));
    infer_reset(whole);
    infer_forward(whole, tok, 11, again);
    double scale = 0;
    for (int v = 0; v < 70; v++) scale = fmax(scale, fabs(a[v]));
    for (int v = 0; v < 70; v++) {
        CHECK(fabs(a[v] - b[v]) <= 1e-5 * scale, "logit %d: whole %g, chunks of 4 %g", v, a[v],
              b[v]);
        CHECK(fabs(a[v] - d[v]) <= 1e-5 * scale, "logit %d: whole %g, one by one %g", v, a[v],
              d[v]);
        CHECK(a[v] == again[v], "logit %d after reset: %g then %g", v, a[v], again[v]);
    }
    infer_destroy(whole);
    infer_destroy(chunked);
    o->destroy(o);
}

/* model.sliding_window: a windowed layer's cache is a ring of 2W - 1 rows (forwards run in pieces
 * of at most W tokens), the other layers' max_seq_len rows: [64, 4, 4] over 3 layers of 2 kv
 * heads of 8 holds (64 + 7 + 7) rows instead of 192. 28 tokens wrap the rings several times:
 * prefilled at once (pieces of 4, the last token reading through layer 2 the layer-1 output of
 * a piece's first query, the one a ring one row short would have robbed of its oldest key), in
 * chunks of 5 and one by one, the last logits agree within fp32 reassociation, and after
 * infer_reset the same bits come again. */
static void test_window_cache_is_a_ring_of_2w_minus_1_rows(void) {
    const char *y = "model: {arch: llama, n_layer: 3, d_model: 32, n_head: 4, n_kv_head: 2, "
                    "d_ff: 48, vocab_size: 70, max_seq_len: 64, sliding_window: [64, 4, 4]}\n"
                    "train: {seq_len: 16}\n";
    ust_config c;
    ust_err e;
    cfg_defaults(&c);
    CHECK(cfg_load_string(&c, y, "t.yaml", &e) == 0 && cfg_validate(&c, 0, &e) == 0, "%s", e.msg);
    ust_ops *o = ops_cpu_create(1, 1);
    infer_model *whole = NULL, *fives = NULL;
    CHECK(infer_create(&whole, &c, o, 32, read_random, NULL, &e) == 0, "%s", e.msg);
    CHECK(infer_create(&fives, &c, o, 5, read_random, NULL, &e) == 0, "%s", e.msg);
    int32_t tok[28];
    for (int i = 0; i < 28; i++) tok[i] = (i * 37 + 11) % 70;
    float a[70], b[70], d[70], again[70];
    infer_forward(whole, tok, 28, a);
    for (int i = 0; i < 28; i += 5) infer_forward(fives, tok + i, i + 5 <= 28 ? 5 : 28 - i, b);
    infer_reset(whole);
    for (int i = 0; i < 28; i++) infer_forward(whole, tok + i, 1, d);
    infer_reset(whole);
    infer_forward(whole, tok, 28, again);
    double scale = 0;
    for (int v = 0; v < 70; v++) scale = fmax(scale, fabs(a[v]));
    for (int v = 0; v < 70; v++) {
        CHECK(fabs(a[v] - b[v]) <= 1e-5 * scale, "logit %d: whole %g, chunks of 5 %g", v, a[v],
              b[v]);
        CHECK(fabs(a[v] - d[v]) <= 1e-5 * scale, "logit %d: whole %g, one by one %g", v, a[v],
              d[v]);
        CHECK(a[v] == again[v], "logit %d after reset: %g then %g", v, a[v], again[v]);
    }
    int64_t want = 2 * (64 + 7 + 7) * 16 * 4;
    CHECK(infer_cache_bytes(whole) == want, "%lld cache bytes, expected %lld",
          (long long)infer_cache_bytes(whole), (long long)want);
    infer_destroy(whole);
    infer_destroy(fives);
    o->destroy(o);
}

/* The bytes a decoding step reads, counted by hand for TINY_MOE: one embedding row, the real 70
 * rows of the head, every dense tensor, and of the MoE layer (layer 0; every: 2) the router and
 * 2 of the 4 experts. */
static void test_weight_bytes_per_token_count_only_what_a_step_reads(void) {
    ust_config c;
    ust_err e;
    cfg_defaults(&c);
    CHECK(cfg_load_string(&c, TINY_MOE, "t.yaml", &e) == 0 && cfg_validate(&c, 0, &e) == 0, "%s",
          e.msg);
    ust_ops *o = ops_cpu_create(1, 1);
    infer_model *m = NULL;
    CHECK(infer_create(&m, &c, o, 8, read_random, NULL, &e) == 0, "%s", e.msg);
    int64_t C = 32, KV = 16, F = 48, Fe = 24, attn = C + 2 * C * C + 2 * KV * C + C;
    int64_t dense = attn + 3 * F * C, moe = attn + 4 * C + 2 * 3 * Fe * C;
    int64_t want = 4 * (C + dense + moe + C + 70 * C);
    CHECK(infer_weight_bytes_per_token(m) == want, "%lld bytes, expected %lld",
          (long long)infer_weight_bytes_per_token(m), (long long)want);
    int64_t all = 128 * C + dense + (attn + 4 * C + 4 * 3 * Fe * C) + C + 128 * C;
    CHECK(infer_param_count(m) == all, "%lld parameters, expected %lld",
          (long long)infer_param_count(m), (long long)all);
    infer_destroy(m);
    o->destroy(o);
}

int main(void) {
    RUN_TEST(test_greedy_takes_the_first_of_equal_maxima);
    RUN_TEST(test_draws_follow_the_probabilities);
    RUN_TEST(test_top_k_draws_among_the_k_best);
    RUN_TEST(test_top_p_keeps_the_smallest_set_reaching_p);
    RUN_TEST(test_temperature_scales_the_logits);
    RUN_TEST(test_seed_fixes_the_draws);
    RUN_TEST(test_utf8_ready_holds_only_incomplete_characters);
    RUN_TEST(test_cache_gives_the_same_logits_whatever_the_chunks);
    RUN_TEST(test_weight_bytes_per_token_count_only_what_a_step_reads);
    RUN_TEST(test_window_cache_is_a_ring_of_2w_minus_1_rows);
    return TEST_SUMMARY();
}
