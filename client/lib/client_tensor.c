/* Tensors on the client side: plain arrays <-> proto Tensor (feeds may
 * point into a shared-memory region instead: shm_region.c). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

size_t pe_client_dtype_size(pe_b_dtype dt) {
  switch (dt) {
    case PE_B_F32: return 4;
    case PE_B_F64: return 8;
    case PE_B_I32: return 4;
    case PE_B_I64: return 8;
    case PE_B_U8: return 1;
  }
  return 0;
}

const char *pe_client_dtype_name(pe_b_dtype dt) {
  switch (dt) {
    case PE_B_F32: return "f32";
    case PE_B_F64: return "f64";
    case PE_B_I32: return "i32";
    case PE_B_I64: return "i64";
    case PE_B_U8: return "u8";
  }
  return "unknown-dtype";
}

int64_t pe_client_tensor_numel(const pe_client_tensor *t) {
  if (!t || t->ndim < 0 || t->ndim > PE_CLIENT_MAX_DIMS) return -1;
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

void pe_client_tensor_set(pe_client_tensor *t, const char *name, pe_b_dtype dt, int ndim,
                          const int64_t *shape, const void *data) {
  if (!t) return;
  memset(t, 0, sizeof *t);
  t->name = name;
  t->dtype = dt;
  t->ndim = ndim; /* out of range: kept, and refused when sent (naming the tensor) */
  t->data = data;
  if (ndim < 0 || ndim > PE_CLIENT_MAX_DIMS) return;
  if (ndim > 0 && !shape) { /* likewise refused when sent */
    t->shape[0] = PEC_NO_SHAPE;
    return;
  }
  for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
  int64_t n = pe_client_tensor_numel(t);
  t->nbytes = n < 0 ? 0 : (size_t)n * pe_client_dtype_size(dt);
}

const pe_client_tensor *pe_client_find(const pe_client_tensor *ts, size_t n, const char *name) {
  if (!ts || !name) return NULL;
  for (size_t i = 0; i < n; i++)
    if (ts[i].name && strcmp(ts[i].name, name) == 0) return &ts[i];
  return NULL;
}

/* "[128,784]" */
static const char *shape_str(const int64_t *d, int n, char *buf, size_t len) {
  size_t k = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < n && k < len; i++)
    k += (size_t)snprintf(buf + k, len - k, "%s%" PRId64, i ? "," : "", d[i]);
  if (k < len) snprintf(buf + k, len - k, "]");
  return buf;
}

int pec_tensor_check(const char *what, const pe_client_tensor *t, bool need_data, char *err,
                     size_t errlen) {
  char s[160];
  const char *name = t->name ? t->name : "";
  if (!*name) return snprintf(err, errlen, "%s: a tensor without a name", what), -1;
  size_t es = pe_client_dtype_size(t->dtype);
  if (!es)
    return snprintf(err, errlen, "%s: tensor '%s': unknown dtype %d", what, name, t->dtype), -1;
  if (t->ndim < 0 || t->ndim > PE_CLIENT_MAX_DIMS)
    return snprintf(err, errlen, "%s: tensor '%s': %d dims (0..%d)", what, name, t->ndim,
                    PE_CLIENT_MAX_DIMS),
           -1;
  if (t->ndim > 0 && t->shape[0] == PEC_NO_SHAPE)
    return snprintf(err, errlen, "%s: tensor '%s': %d dims but no shape (NULL)", what, name,
                    t->ndim),
           -1;
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] < 0)
      return snprintf(err, errlen, "%s: tensor '%s' %s %s: negative dim %d", what, name,
                      pe_client_dtype_name(t->dtype), shape_str(t->shape, t->ndim, s, sizeof s), i),
             -1;
  size_t want = (size_t)pe_client_tensor_numel(t) * es;
  if (t->nbytes != want)
    return snprintf(err, errlen, "%s: tensor '%s' %s %s needs %zu bytes, got %zu", what, name,
                    pe_client_dtype_name(t->dtype), shape_str(t->shape, t->ndim, s, sizeof s), want,
                    t->nbytes),
           -1;
  if (need_data && want && !t->data)
    return snprintf(err, errlen, "%s: tensor '%s' %s: no data", what, name,
                    shape_str(t->shape, t->ndim, s, sizeof s)),
           -1;
  return 0;
}

/* A feed by row indices (shm_rows, in a region): one index per row of dim
 * 0, each inside the array, whose bytes a uint64_t holds. */
static int shm_rows_check(pe_client *c, const char *what, const pe_client_tensor *t, size_t want) {
  const char *name = t->name;
  if (t->ndim < 1 || t->shape[0] < 1 || !want)
    return pec_fail(c, PE_C_EARG, "%s: tensor '%s': row indices need rows of dim 0 (%d dims)", what,
                    name, t->ndim);
  uint64_t row = want / (size_t)t->shape[0];
  if (t->shm_array_rows < 1 || (uint64_t)t->shm_array_rows > UINT64_MAX / row)
    return pec_fail(c, PE_C_EARG, "%s: tensor '%s': shm_array_rows %" PRId64 " (1 or more)", what,
                    name, t->shm_array_rows);
  for (int64_t i = 0; i < t->shape[0]; i++)
    if (t->shm_rows[i] < 0 || t->shm_rows[i] >= t->shm_array_rows)
      return pec_fail(c, PE_C_EARG,
                      "%s: tensor '%s': row index %" PRId64 " is %" PRId64
                      ", outside the array's %" PRId64 " rows",
                      what, name, i, t->shm_rows[i], t->shm_array_rows);
  return 0;
}

int pec_tensor_to_pb(pe_client *c, const char *what, const pe_client_tensor *t, Pe__Tensor *pb,
                     int64_t *shape, Pe__ShmRef *shm) {
  char msg[512];
  if (t->shm_rows && !t->shm_region)
    return pec_fail(c, PE_C_EARG, "%s: tensor '%s' has row indices but no shm region", what,
                    t->name ? t->name : "");
  if (pec_tensor_check(what, t, !t->shm_region, msg, sizeof msg))
    return pec_fail(c, PE_C_EARG, "%s", msg);
  const char *name = t->name;
  size_t want = (size_t)pe_client_tensor_numel(t) * pe_client_dtype_size(t->dtype);
  pe__tensor__init(pb);
  pb->name = (char *)name;
  pb->dtype = (Pe__DataType)t->dtype;
  for (int i = 0; i < t->ndim; i++) shape[i] = t->shape[i];
  pb->n_shape = (size_t)t->ndim;
  pb->shape = shape;
  if (t->shm_rows && shm_rows_check(c, what, t, want)) return PE_C_EARG;
  if (t->shm_region) {
    pe__shm_ref__init(shm);
    shm->region = pec_region_now(c, t->shm_region);
    shm->offset = t->shm_offset;
    shm->length = want;
    if (t->shm_rows) {
      shm->n_rows = (size_t)t->shape[0];
      shm->rows = (int64_t *)t->shm_rows; /* packed straight from the caller's array */
      shm->length = (uint64_t)t->shm_array_rows * (want / (size_t)t->shape[0]);
    }
    pb->shm = shm;
  } else {
    pb->data.len = want;
    pb->data.data = (uint8_t *)t->data; /* packed straight from the caller's buffer */
  }
  return 0;
}

int pec_tensors_from_pb(pe_client *c, const char *what, Pe__Tensor *const *pbs, size_t n,
                        const pe_client_tensor **out) {
  pe_client_tensor *ts = pec_results_alloc(c, n * sizeof *ts);
  if (!ts) return pec_fail(c, PE_C_ENOMEM, "%s: %zu result tensors", what, n);
  char s[160];
  for (size_t i = 0; i < n; i++) {
    const Pe__Tensor *pb = pbs[i];
    pe_client_tensor *t = &ts[i];
    t->name = pb->name;
    t->dtype = (pe_b_dtype)pb->dtype;
    size_t es = pe_client_dtype_size(t->dtype);
    if (!es)
      return pec_fail(c, PE_C_EPROTO, "%s: reply tensor '%s' has unknown dtype %d", what, pb->name,
                      (int)pb->dtype);
    if (pb->n_shape > PE_CLIENT_MAX_DIMS)
      return pec_fail(c, PE_C_EPROTO, "%s: reply tensor '%s' has %zu dims (max %d)", what, pb->name,
                      pb->n_shape, PE_CLIENT_MAX_DIMS);
    t->ndim = (int)pb->n_shape;
    for (size_t d = 0; d < pb->n_shape; d++) t->shape[d] = pb->shape[d];
    size_t want = (size_t)pe_client_tensor_numel(t) * es;
    if (pb->data.len != want)
      return pec_fail(c, PE_C_EPROTO, "%s: reply tensor '%s' %s %s carries %zu bytes, expected %zu",
                      what, pb->name, pe_client_dtype_name(t->dtype),
                      shape_str(t->shape, t->ndim, s, sizeof s), pb->data.len, want);
    t->data = pb->data.data; /* owned by c->reply */
    t->nbytes = want;
  }
  *out = ts;
  return 0;
}
