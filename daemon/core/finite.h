/* Non-finite values (NaN, +-Inf) in a host tensor: the check behind the
 * daemon's refusal to train on or save a diverged model (run/request.c,
 * checkpoint/save_load.c). Integer dtypes are always finite. */
#ifndef PE_CORE_FINITE_H
#define PE_CORE_FINITE_H

#include <stdint.h>

#include "core/tensor.h"

/* How many elements of host tensor t are NaN or infinite; *first (may be
 * NULL) gets the flat index of the first one (-1: none). One pass over the
 * data; an empty tensor has none. */
int64_t pe_tensor_nonfinite(const pe_tensor *t, int64_t *first);
/* The first non-finite element's value as printf would show it ("nan",
 * "inf", "-inf"), for messages; "finite" when there is none. */
const char *pe_tensor_nonfinite_str(const pe_tensor *t, int64_t index);

#endif
