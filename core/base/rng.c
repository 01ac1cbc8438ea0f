#include "rng.h"

#include <math.h>

uint64_t rng_hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* splitmix64's finalizer: a bijective mixer good enough to make counters look random. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t index) {
    uint64_t key = mix64(seed ^ mix64(stream + 0x9e3779b97f4a7c15ull));
    return mix64(key + index * 0x9e3779b97f4a7c15ull);
}

double rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return (double)(rng_u64(seed, stream, index) >> 11) * (1.0 / 9007199254740992.0);
}

float rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    /* two independent uniforms per element: counters 2i and 2i+1 */
    double u1 = rng_uniform(seed, stream, 2 * index);
    double u2 = rng_uniform(seed, stream, 2 * index + 1);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
