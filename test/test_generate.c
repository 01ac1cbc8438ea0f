/* test_generate: the sampler (greedy ties, top-k, top-p, the draw's distribution and its seed)
 * and the streaming of UTF-8 split over tokens (core/generate.h). The model side is
 * test/sh/generate.sh's: KV-cache logits against an independent numpy forward. */
#include "test.h"

#include "generate.h"

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

int main(void) {
    RUN_TEST(test_greedy_takes_the_first_of_equal_maxima);
    RUN_TEST(test_draws_follow_the_probabilities);
    RUN_TEST(test_top_k_draws_among_the_k_best);
    RUN_TEST(test_top_p_keeps_the_smallest_set_reaching_p);
    RUN_TEST(test_temperature_scales_the_logits);
    RUN_TEST(test_seed_fixes_the_draws);
    RUN_TEST(test_utf8_ready_holds_only_incomplete_characters);
    return TEST_SUMMARY();
}
