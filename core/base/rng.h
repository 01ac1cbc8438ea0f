/* rng: counter-based random numbers. Every value is a pure function of (seed, stream, index),
 * so a rank holding a shard of a tensor draws exactly that slice of the global tensor, and the
 * shuffle of the data is the same under every layout. No state to save or split. */
#ifndef UST_RNG_H
#define UST_RNG_H

#include <stdint.h>

uint64_t rng_hash_str(const char *s);                               /* FNV-1a 64 */
uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t index);   /* uniform 64 bits */
double rng_uniform(uint64_t seed, uint64_t stream, uint64_t index); /* [0, 1) */
float rng_normal(uint64_t seed, uint64_t stream, uint64_t index);   /* N(0, 1), Box-Muller */

#endif
