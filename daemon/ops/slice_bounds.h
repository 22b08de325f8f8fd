/* slice's bounds on one dim, shared by its cpu and cuda kernels: Python's
 * rules (a negative start or end counts from the end, then both are
 * clamped to [0, dim]; an empty range has size 0). */
#ifndef PE_OPS_SLICE_BOUNDS_H
#define PE_OPS_SLICE_BOUNDS_H

#include <stdint.h>

void pe_slice_bounds(int64_t dim, int64_t s, int64_t e, int64_t *start, int64_t *size);

#endif
