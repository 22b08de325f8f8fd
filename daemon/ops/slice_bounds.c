/* slice's bounds on one dim (contract in slice_bounds.h). */
#include "ops/slice_bounds.h"

void pe_slice_bounds(int64_t dim, int64_t s, int64_t e, int64_t *start, int64_t *size) {
  if (s < 0) s += dim;
  if (e < 0) e += dim;
  s = s < 0 ? 0 : (s > dim ? dim : s);
  e = e < 0 ? 0 : (e > dim ? dim : e);
  *start = s;
  *size = e > s ? e - s : 0;
}
