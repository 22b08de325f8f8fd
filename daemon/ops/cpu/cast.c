/* cast (Paddle's): Out = X converted to out_dtype (pe_dtype codes, as
 * every dtype attribute here: 0 f32, 1 f64, 2 i32, 3 i64, 4 u8). in_dtype,
 * when given, must be X's dtype. Floats become integers by truncation
 * toward zero; a value the target cannot hold (NaN, out of range) is an
 * error naming the op, X, the element and the value, never a wrapped
 * number. The gradient (float to float only: an integer carries none)
 * casts Out@GRAD back to X's dtype. */
#include <math.h>

#include "ops/op_tables.h"

enum { CA_X };
enum { CA_OUT };
enum { CAG_X, CAG_OUT, CAG_DOUT };
enum { CAG_DX };

static bool ca_supported(int64_t dt) {
  return dt == PE_F32 || dt == PE_F64 || dt == PE_I32 || dt == PE_I64 || dt == PE_U8;
}

static bool ca_float(pe_dtype dt) {
  return dt == PE_F32 || dt == PE_F64;
}

/* The attributes against X: out_dtype supported, in_dtype -1 or X's. */
static pe_status *ca_check(pe_infer_ctx *c, pe_dtype *out) {
  pe_meta *x = pe_in_meta(c, CA_X, 0);
  if (!x) return pe_infer_error(c, PE_EARITY, "needs input X");
  int64_t in = pe_attr_i(c->def, c->desc, "in_dtype");
  int64_t to = pe_attr_i(c->def, c->desc, "out_dtype");
  if (!ca_supported(to))
    return pe_infer_error(c, PE_EATTR,
                          "out_dtype %lld is not supported (0 f32, 1 f64, 2 i32, 3 i64, 4 u8)",
                          (long long)to);
  if (!ca_supported(x->dtype))
    return pe_infer_error(c, PE_EDTYPE, "input X '%s' has dtype %s, which cast does not read",
                          pe_in_name(c, CA_X, 0), pe_dtype_name(x->dtype));
  if (in != -1 && in != (int64_t)x->dtype)
    return pe_infer_error(c, PE_EATTR, "in_dtype %lld (%s) is not the dtype %s of X '%s'",
                          (long long)in,
                          pe_dtype_valid((int)in) ? pe_dtype_name((pe_dtype)in) : "?",
                          pe_dtype_name(x->dtype), pe_in_name(c, CA_X, 0));
  *out = (pe_dtype)to;
  return NULL;
}

static pe_status *ca_infer(pe_infer_ctx *c) {
  pe_dtype to = PE_F32;
  PE_TRY(ca_check(c, &to));
  pe_infer_set(c, CA_OUT, to, &pe_in_meta(c, CA_X, 0)->shape);
  return NULL;
}

static pe_status *ca_grad_infer(pe_infer_ctx *c) {
  pe_dtype to = PE_F32;
  PE_TRY(ca_check(c, &to));
  pe_dtype from = pe_in_meta(c, CAG_X, 0)->dtype;
  if (!ca_float(from) || !ca_float(to))
    return pe_infer_error(c, PE_ENOGRAD, "no gradient through a cast from %s to %s",
                          pe_dtype_name(from), pe_dtype_name(to));
  return pe_infer_grad_like_inputs(c);
}

/* Element i of t as a double (floats) or an int64 (integers). */
static double ca_load_f(const pe_tensor *t, int64_t i) {
  return t->dtype == PE_F32 ? (double)pe_f32(t)[i] : ((const double *)t->data)[i];
}

static int64_t ca_load_i(const pe_tensor *t, int64_t i) {
  switch (t->dtype) {
    case PE_I32: return ((const int32_t *)t->data)[i];
    case PE_I64: return pe_i64(t)[i];
    default: return ((const uint8_t *)t->data)[i];
  }
}

/* The range an integer dtype holds. */
static void ca_range(pe_dtype dt, int64_t *lo, int64_t *hi) {
  *lo = dt == PE_I32 ? INT32_MIN : dt == PE_U8 ? 0 : INT64_MIN;
  *hi = dt == PE_I32 ? INT32_MAX : dt == PE_U8 ? UINT8_MAX : INT64_MAX;
}

static void ca_store_i(pe_tensor *t, int64_t i, int64_t v) {
  switch (t->dtype) {
    case PE_I32: ((int32_t *)t->data)[i] = (int32_t)v; break;
    case PE_I64: pe_i64(t)[i] = v; break;
    default: ((uint8_t *)t->data)[i] = (uint8_t)v; break;
  }
}

static void ca_store_f(pe_tensor *t, int64_t i, double v) {
  if (t->dtype == PE_F32)
    pe_f32(t)[i] = (float)v;
  else
    ((double *)t->data)[i] = v;
}

/* dst = src converted element by element (shapes equal); `what` names the
 * source variable's slot for errors. */
static pe_status *ca_convert(pe_kernel_ctx *c, const pe_tensor *src, pe_tensor *dst,
                             const char *what) {
  int64_t n = pe_tensor_numel(src), lo = 0, hi = 0;
  bool from_f = ca_float(src->dtype), to_f = ca_float(dst->dtype);
  if (!to_f) ca_range(dst->dtype, &lo, &hi);
  for (int64_t i = 0; i < n; i++) {
    if (to_f) {
      ca_store_f(dst, i, from_f ? ca_load_f(src, i) : (double)ca_load_i(src, i));
      continue;
    }
    if (from_f) {
      double v = trunc(ca_load_f(src, i));
      /* (double)hi may round up to 2^63: compare below it strictly then */
      bool ok = v >= (double)lo && (hi == INT64_MAX ? v < 0x1p63 : v <= (double)hi);
      if (!ok)
        return pe_kernel_error(c, PE_EINVAL, "input %s element %lld = %g does not fit %s", what,
                               (long long)i, ca_load_f(src, i), pe_dtype_name(dst->dtype));
      ca_store_i(dst, i, (int64_t)v);
      continue;
    }
    int64_t v = ca_load_i(src, i);
    if (v < lo || v > hi)
      return pe_kernel_error(c, PE_EINVAL, "input %s element %lld = %lld does not fit %s", what,
                             (long long)i, (long long)v, pe_dtype_name(dst->dtype));
    ca_store_i(dst, i, v);
  }
  return NULL;
}

static pe_status *ca_kernel(pe_kernel_ctx *c) {
  return ca_convert(c, pe_kin(c, CA_X, 0), pe_kout(c, CA_OUT, 0), "X");
}

static pe_status *ca_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *dx = pe_kout(c, CAG_DX, 0), *dout = pe_kin(c, CAG_DOUT, 0);
  if (!dx) return NULL;
  if (!dout) {
    pe_tensor_zero(dx);
    return NULL;
  }
  if (pe_tensor_numel(dout) != pe_tensor_numel(dx))
    return pe_kernel_error(c, PE_ESHAPE, "input Out@GRAD does not match X");
  return ca_convert(c, dout, dx, "Out@GRAD");
}

static const pe_slot_def ca_in[] = {{"X", 1, 1, 0}, {NULL}};
static const pe_slot_def ca_out[] = {{"Out", 1, 1, 0}, {NULL}};
static const pe_slot_def ca_grad_in[] = {
    {"X", 1, 1, 0}, {"Out", 0, 1, 0}, {"Out" PE_GRAD_SUFFIX, 0, 1, 0}, {NULL}};
static const pe_slot_def ca_grad_out[] = {{"X" PE_GRAD_SUFFIX, 0, 1, 0}, {NULL}};
static const pe_attr_def ca_attrs[] = {
    {"in_dtype", PE_ATTR_INT, false, -1, NULL}, {"out_dtype", PE_ATTR_INT, true, 0, NULL}, {NULL}};

const pe_op_def pe_ops_cast[] = {
    {.type = "cast",
     .inputs = ca_in,
     .outputs = ca_out,
     .attrs = ca_attrs,
     .infer = ca_infer,
     .kernel_cpu = ca_kernel,
     .grad = pe_grad_default},
    {.type = "cast_grad",
     .inputs = ca_grad_in,
     .outputs = ca_grad_out,
     .attrs = ca_attrs,
     .infer = ca_grad_infer,
     .kernel_cpu = ca_grad_kernel},
    {NULL},
};
