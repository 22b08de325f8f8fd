#include "rng.h"

#include <math.h>

double pe_rng_normal(uint64_t seed, uint64_t counter) {
  double u1 = pe_rng_uniform(seed, 2 * counter);
  double u2 = pe_rng_uniform(seed, 2 * counter + 1);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
