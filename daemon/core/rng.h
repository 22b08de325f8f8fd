/* Counter-based random numbers (splitmix64 over seed and counter).
 * A generator is (seed, offset): an op reserves a range of counters and
 * derives every number from (seed, counter) alone, so results do not depend
 * on thread count or on how a kernel splits its loop. Ops on one generator
 * must be ordered (the parallel executor makes the generator an engine
 * variable); reserving is not thread-safe by itself. */
#ifndef PE_CORE_RNG_H
#define PE_CORE_RNG_H

#include <stdint.h>

typedef struct pe_rng {
  uint64_t seed;
  uint64_t offset;
} pe_rng;

static inline void pe_rng_init(pe_rng *r, uint64_t seed) {
  r->seed = seed;
  r->offset = 0;
}
/* Reserve n counters; returns the first. */
static inline uint64_t pe_rng_reserve(pe_rng *r, uint64_t n) {
  uint64_t base = r->offset;
  r->offset += n;
  return base;
}
static inline uint64_t pe_rng_bits(uint64_t seed, uint64_t counter) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + counter + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/* Uniform in [0, 1). */
static inline double pe_rng_uniform(uint64_t seed, uint64_t counter) {
  return (double)(pe_rng_bits(seed, counter) >> 11) * (1.0 / 9007199254740992.0);
}
/* Standard normal (Box-Muller over two counters 2c, 2c+1). */
double pe_rng_normal(uint64_t seed, uint64_t counter);

#endif
