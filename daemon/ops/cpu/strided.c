/* pe_strided_copy: an odometer over all dims but the last, and a loop over
 * the last one (contiguous on both sides: one memcpy). */
#include "ops/cpu/strided.h"

#include <string.h>

#include "core/dtype.h"

void pe_dense_strides(const int64_t *dims, int ndim, int64_t *strides) {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    strides[i] = s;
    s *= dims[i];
  }
}

static void copy_row(char *d, int64_t ds, const char *s, int64_t ss, int64_t n, size_t esz) {
  if (ds == 1 && ss == 1) {
    memcpy(d, s, (size_t)n * esz);
    return;
  }
  if (esz == 4) {
    for (int64_t j = 0; j < n; j++) memcpy(d + j * ds * 4, s + j * ss * 4, 4);
  } else if (esz == 8) {
    for (int64_t j = 0; j < n; j++) memcpy(d + j * ds * 8, s + j * ss * 8, 8);
  } else {
    for (int64_t j = 0; j < n; j++)
      memcpy(d + j * ds * (int64_t)esz, s + j * ss * (int64_t)esz, esz);
  }
}

void pe_strided_copy(void *dst, const int64_t *dst_strides, const void *src,
                     const int64_t *src_strides, const int64_t *dims, int ndim, size_t esz) {
  for (int i = 0; i < ndim; i++)
    if (dims[i] == 0) return;
  if (ndim == 0) {
    memcpy(dst, src, esz);
    return;
  }
  int64_t idx[PE_MAX_DIMS] = {0};
  int last = ndim - 1;
  for (;;) {
    int64_t doff = 0, soff = 0;
    for (int i = 0; i < last; i++) {
      doff += idx[i] * dst_strides[i];
      soff += idx[i] * src_strides[i];
    }
    copy_row((char *)dst + doff * (int64_t)esz, dst_strides[last],
             (const char *)src + soff * (int64_t)esz, src_strides[last], dims[last], esz);
    int i = last - 1;
    while (i >= 0 && ++idx[i] == dims[i]) idx[i--] = 0;
    if (i < 0) return;
  }
}
