/* export: the fp32 -> bf16 / fp16 conversions of `ustrain export --dtype`, bit for bit, over a
 * sweep of every sign, exponent and rounding case (ties, subnormals, overflow, NaN), against
 * references that do not share their code: the compiler's _Float16 conversion (IEEE round to
 * nearest even) for fp16, and for bf16 the nearer of the two bf16 neighbours computed in double. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "export.h"
#include "test.h"

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The bit patterns to try: a stride through all 2^32 plus, for every exponent, the patterns
 * around the bf16 and fp16 rounding points (the exact halves, one below and one above). */
static int next_pattern(uint64_t *k, uint32_t *u) {
    enum { STRIDE = 65537 * 3 };
    static const uint32_t low[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF,
                                   0x0FFF, 0x1000, 0x1001, 0x2000, 0x3000, 0x1FFF};
    uint64_t n_sweep = (1ULL << 32) / STRIDE, n_edge = 2 * 256 * 128 * 12;
    if (*k < n_sweep) {
        *u = (uint32_t)(*k * STRIDE);
    } else if (*k < n_sweep + n_edge) {
        uint64_t i = *k - n_sweep;
        uint32_t sign = (uint32_t)(i & 1) << 31, exp = (uint32_t)((i >> 1) & 255) << 23,
                 hi = (uint32_t)((i >> 9) & 127) << 16, lo = low[(i >> 16) % 12];
        *u = sign | exp | hi | lo;
    } else {
        return 0;
    }
    (*k)++;
    return 1;
}

/* bf16 reference: of the two bf16 values around x (truncation and the next one up in
 * magnitude), the nearer, an even mantissa on a tie. */
static uint16_t bf16_reference(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t down = (uint16_t)(u >> 16), up = (uint16_t)(down + 1);
    double dx = x, dd = from_bits((uint32_t)down << 16), du = from_bits((uint32_t)up << 16);
    if ((down & 0x7F80) == 0x7F80) return down; /* infinity stays; NaN is checked apart */
    double a = fabs(dx - dd), b = isinf(du) ? fabs(dx - 0x1p128 * copysign(1, dx)) : fabs(du - dx);
    if (a < b) return down;
    if (b < a) return up;
    return (down & 1) ? up : down;
}

static void test_bf16_rounds_to_nearest_even_on_every_case(void) {
    uint64_t k = 0;
    uint32_t u;
    int64_t n = 0;
    while (next_pattern(&k, &u)) {
        float x = from_bits(u);
        uint16_t got = export_bf16(x);
        if (isnan(x)) {
            CHECK((got & 0x7F80) == 0x7F80 && (got & 0x7F), "NaN %08x -> %04x is not a NaN", u,
                  got);
            continue;
        }
        uint16_t want = bf16_reference(x);
        CHECK(got == want, "%08x (%.9g): bf16 %04x, nearest-even %04x", u, x, got, want);
        n++;
    }
    CHECK(n > 500000, "only %lld patterns tried", (long long)n);
}

static void test_f16_matches_ieee_conversion_on_every_case(void) {
    uint64_t k = 0;
    uint32_t u;
    while (next_pattern(&k, &u)) {
        float x = from_bits(u);
        uint16_t got = export_f16(x), want;
        _Float16 h = (_Float16)x;
        memcpy(&want, &h, 2);
        if (isnan(x)) {
            CHECK((got & 0x7C00) == 0x7C00 && (got & 0x3FF), "NaN %08x -> %04x is not a NaN", u,
                  got);
            continue;
        }
        CHECK(got == want, "%08x (%.9g): fp16 %04x, IEEE %04x", u, x, got, want);
    }
}

static void test_f16_boundaries(void) {
    CHECK(export_f16(65504.0f) == 0x7BFF, "65504 -> %04x", export_f16(65504.0f));
    CHECK(export_f16(65519.996f) == 0x7BFF, "65519.996 -> %04x", export_f16(65519.996f));
    CHECK(export_f16(65520.0f) == 0x7C00, "65520 (the tie above the largest) -> %04x",
          export_f16(65520.0f));
    CHECK(export_f16(0x1p-24f) == 0x0001, "2^-24 -> %04x", export_f16(0x1p-24f));
    CHECK(export_f16(0x1p-25f) == 0x0000, "2^-25 (tie to even 0) -> %04x", export_f16(0x1p-25f));
    CHECK(export_f16(-0.0f) == 0x8000, "-0 -> %04x", export_f16(-0.0f));
}

int main(void) {
    RUN_TEST(test_bf16_rounds_to_nearest_even_on_every_case);
    RUN_TEST(test_f16_matches_ieee_conversion_on_every_case);
    RUN_TEST(test_f16_boundaries);
    return TEST_SUMMARY();
}
