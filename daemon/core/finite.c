/* Non-finite values in host tensors (see finite.h). */
#include "core/finite.h"

#include <math.h>
#include <string.h>

/* Half floats: exponent bits all ones. */
static int f16_nonfinite(uint16_t h) {
  return (h & 0x7c00u) == 0x7c00u;
}

int64_t pe_tensor_nonfinite(const pe_tensor *t, int64_t *first) {
  int64_t n = pe_shape_numel(&t->shape), bad = 0, at = -1;
  if (n <= 0 || !t->data) n = 0;
  /* A branch-free count first (vectorises); the index only when needed. */
  if (t->dtype == PE_F32) {
    const float *x = t->data;
    for (int64_t i = 0; i < n; i++) bad += !isfinite(x[i]);
    for (int64_t i = 0; bad && at < 0 && i < n; i++)
      if (!isfinite(x[i])) at = i;
  } else if (t->dtype == PE_F64) {
    const double *x = t->data;
    for (int64_t i = 0; i < n; i++) bad += !isfinite(x[i]);
    for (int64_t i = 0; bad && at < 0 && i < n; i++)
      if (!isfinite(x[i])) at = i;
  } else if (t->dtype == PE_F16) {
    const uint16_t *x = t->data;
    for (int64_t i = 0; i < n; i++) bad += f16_nonfinite(x[i]);
    for (int64_t i = 0; bad && at < 0 && i < n; i++)
      if (f16_nonfinite(x[i])) at = i;
  }
  if (first) *first = at;
  return bad;
}

const char *pe_tensor_nonfinite_str(const pe_tensor *t, int64_t index) {
  if (index < 0 || index >= pe_shape_numel(&t->shape)) return "finite";
  double v;
  if (t->dtype == PE_F32)
    v = ((const float *)t->data)[index];
  else if (t->dtype == PE_F64)
    v = ((const double *)t->data)[index];
  else if (t->dtype == PE_F16) {
    uint16_t h = ((const uint16_t *)t->data)[index];
    if ((h & 0x7c00u) != 0x7c00u) return "finite";
    return (h & 0x3ffu) ? "nan" : (h & 0x8000u) ? "-inf" : "inf";
  } else
    return "finite";
  return isnan(v) ? "nan" : isinf(v) ? (v < 0 ? "-inf" : "inf") : "finite";
}
