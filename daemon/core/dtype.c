#include "dtype.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static const struct {
  const char *name;
  size_t size;
} dtype_table[PE_DTYPE_COUNT] = {
    [PE_F32] = {"f32", 4}, [PE_F64] = {"f64", 8}, [PE_I32] = {"i32", 4},
    [PE_I64] = {"i64", 8}, [PE_U8] = {"u8", 1},   [PE_F16] = {"f16", 2},
};

bool pe_dtype_valid(int dt) { return dt >= 0 && dt < PE_DTYPE_COUNT; }
size_t pe_dtype_size(pe_dtype dt) { return pe_dtype_valid(dt) ? dtype_table[dt].size : 0; }
const char *pe_dtype_name(pe_dtype dt) { return pe_dtype_valid(dt) ? dtype_table[dt].name : "?"; }

bool pe_dtype_parse(const char *name, pe_dtype *out) {
  for (int i = 0; i < PE_DTYPE_COUNT; i++)
    if (strcmp(name, dtype_table[i].name) == 0) {
      *out = (pe_dtype)i;
      return true;
    }
  return false;
}

int64_t pe_shape_numel(const pe_shape *s) { return pe_shape_prod(s, 0, s->ndim); }

int64_t pe_shape_prod(const pe_shape *s, int from, int to) {
  bool zero = false;
  for (int i = from; i < to; i++) {
    if (s->d[i] < 0) return -1;
    zero = zero || s->d[i] == 0;
  }
  if (zero) return 0; /* whatever the others' product: it may not fit */
  int64_t n = 1;
  for (int i = from; i < to; i++)
    if (__builtin_mul_overflow(n, s->d[i], &n)) return -1;
  return n;
}

pe_status *pe_shape_check(const pe_shape *s, int64_t max_numel, const char *what) {
  char sb[PE_SHAPE_STRLEN];
  if (s->ndim < 0 || s->ndim > PE_MAX_DIMS)
    return pe_error(PE_ESHAPE, "%s: rank %d, at most %d", what, s->ndim, PE_MAX_DIMS);
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++) {
    int64_t d = s->d[i];
    if (d < -1)
      return pe_error(PE_ESHAPE, "%s: shape %s: dim %d is %lld (must be >= -1)", what,
                      pe_shape_str(s, sb, sizeof sb), i, (long long)d);
    if (d > 0 && (d > max_numel || n > max_numel / d))
      return pe_error(PE_ESHAPE,
                      "%s: shape %s has more than %lld elements (zero dimensions left out)",
                      what, pe_shape_str(s, sb, sizeof sb), (long long)max_numel);
    if (d > 0) n *= d;
  }
  return NULL;
}

bool pe_shape_equal(const pe_shape *a, const pe_shape *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->d[i] != b->d[i]) return false;
  return true;
}

bool pe_shape_compatible(const pe_shape *a, const pe_shape *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->d[i] != b->d[i] && a->d[i] != -1 && b->d[i] != -1) return false;
  return true;
}

const char *pe_shape_str(const pe_shape *s, char *buf, size_t len) {
  size_t off = 0;
  off += (size_t)snprintf(buf + off, len - off, "[");
  for (int i = 0; i < s->ndim && off < len; i++)
    off += (size_t)snprintf(buf + off, len - off, i ? ",%lld" : "%lld", (long long)s->d[i]);
  if (off < len) snprintf(buf + off, len - off, "]");
  return buf;
}

pe_shape pe_shape_make(int ndim, const int64_t *d) {
  pe_shape s = {0};
  if (ndim > PE_MAX_DIMS) ndim = PE_MAX_DIMS;
  s.ndim = ndim;
  for (int i = 0; i < ndim; i++) s.d[i] = d[i];
  return s;
}
