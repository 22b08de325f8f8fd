/* Creation ops: fill_constant, uniform_random, gaussian_random, assign.
 *
 * The random ops draw from a counter-based generator (core/rng.h). With
 * seed == 0 they use the program generator ctx->rng; with seed != 0 the
 * attribute is the seed, and the counters still come from the program
 * generator (pe_kernel_rng in ops/registry.h). Either way the op reserves
 * one counter range for the whole tensor before touching any element, and
 * element i derives its value from (seed, base + i) alone, so the result
 * does not depend on how the loop is split across threads.
 *
 * gaussian_random: pe_rng_normal(seed, c) consumes the uniform counters 2c
 * and 2c+1. To keep a later op on the same generator from reusing those
 * counters, it reserves 2n uniform counters (plus one to align to an even
 * start) and element i uses normal counter base/2 + i. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops/cpu/par_min.h"
#include "ops/op_tables.h"

enum { ASSIGN_X = 0 };
enum { ASSIGN_OUT = 0 };
enum { ASSIGN_G_X = 0, ASSIGN_G_OUT, ASSIGN_G_DOUT };
enum { ASSIGN_G_DX = 0 };

/* --- shared: shape and dtype attributes ------------------------------------ */

/* The `shape` attribute as a concrete shape: 1..PE_MAX_DIMS dims, each >= 0
 * (-1, the batch marker, has no meaning for a created tensor). */
static pe_status *shape_from_attr(pe_infer_ctx *c, pe_shape *out) {
  const int64_t *v;
  int n = pe_attr_ints(c->desc, "shape", &v);
  if (n < 1 || n > PE_MAX_DIMS)
    return pe_infer_error(c, PE_EATTR, "attribute 'shape' must have 1..%d dims, has %d",
                          PE_MAX_DIMS, n);
  *out = pe_shape_make(n, v);
  for (int i = 0; i < n; i++)
    if (v[i] < 0) {
      char sb[PE_SHAPE_STRLEN];
      return pe_infer_error(c, PE_EATTR,
                            "attribute 'shape' %s contains %lld at dim %d; a created tensor "
                            "needs concrete dims (no -1)",
                            pe_shape_str(out, sb, sizeof sb), (long long)v[i], i);
    }
  return NULL;
}

/* The `dtype` attribute, restricted to the dtypes the op can produce. */
static pe_status *dtype_from_attr(pe_infer_ctx *c, bool allow_int, pe_dtype *out) {
  int64_t dt = pe_attr_i(c->def, c->desc, "dtype");
  bool ok =
      dt == PE_F32 || dt == PE_F64 || (allow_int && (dt == PE_I32 || dt == PE_I64 || dt == PE_U8));
  if (!ok)
    return pe_infer_error(c, PE_EATTR, "attribute 'dtype' = %lld (%s) is not supported; use %s",
                          (long long)dt,
                          pe_dtype_valid((int)dt) ? pe_dtype_name((pe_dtype)dt) : "?",
                          allow_int ? "0 f32, 1 f64, 2 i32, 3 i64 or 4 u8" : "0 f32 or 1 f64");
  *out = (pe_dtype)dt;
  return NULL;
}

/* --- fill_constant ------------------------------------------------------------ */

static pe_status *fill_constant_infer(pe_infer_ctx *c) {
  pe_shape shape;
  pe_dtype dt = PE_F32;
  PE_TRY(shape_from_attr(c, &shape));
  PE_TRY(dtype_from_attr(c, true, &dt));
  /* Integer outputs take the value truncated toward zero; it must fit, since
   * an out-of-range float -> int conversion is undefined. */
  double v = pe_attr_f(c->def, c->desc, "value");
  bool fits = true; /* NaN fails every comparison below */
  if (dt == PE_I32) fits = v > -2147483649.0 && v < 2147483648.0;
  if (dt == PE_I64) fits = v >= -0x1p63 && v < 0x1p63;
  if (dt == PE_U8) fits = v > -1.0 && v < 256.0;
  if (!fits)
    return pe_infer_error(c, PE_EATTR, "attribute 'value' = %g does not fit dtype %s", v,
                          pe_dtype_name(dt));
  pe_infer_set(c, 0, dt, &shape);
  return NULL;
}

static pe_status *fill_constant_kernel(pe_kernel_ctx *c) {
  pe_tensor *out = pe_kout(c, 0, 0);
  if (!out) return NULL;
  double v = pe_attr_f(c->def, c->desc, "value");
  int64_t n = pe_tensor_numel(out);
  switch (out->dtype) {
    case PE_F32:
      for (int64_t i = 0; i < n; i++) pe_f32(out)[i] = (float)v;
      break;
    case PE_F64:
      for (int64_t i = 0; i < n; i++) ((double *)out->data)[i] = v;
      break;
    case PE_I32:
      for (int64_t i = 0; i < n; i++) ((int32_t *)out->data)[i] = (int32_t)v;
      break;
    case PE_I64:
      for (int64_t i = 0; i < n; i++) pe_i64(out)[i] = (int64_t)v;
      break;
    case PE_U8: memset(out->data, (int)(uint8_t)v, (size_t)n); break;
    default:
      return pe_kernel_error(c, PE_EDTYPE, "output dtype %s not supported",
                             pe_dtype_name(out->dtype));
  }
  return NULL;
}

/* --- uniform_random ---------------------------------------------------------------- */

static pe_status *uniform_infer(pe_infer_ctx *c) {
  pe_shape shape;
  pe_dtype dt = PE_F32;
  PE_TRY(shape_from_attr(c, &shape));
  PE_TRY(dtype_from_attr(c, false, &dt));
  float lo = pe_attr_f(c->def, c->desc, "min"), hi = pe_attr_f(c->def, c->desc, "max");
  if (!(lo <= hi) || !isfinite(lo) || !isfinite(hi))
    return pe_infer_error(c, PE_EATTR, "attributes min = %g, max = %g: need finite min <= max", lo,
                          hi);
  pe_infer_set(c, 0, dt, &shape);
  return NULL;
}

static pe_status *uniform_kernel(pe_kernel_ctx *c) {
  pe_tensor *out = pe_kout(c, 0, 0);
  if (!out) return NULL;
  pe_rng *r = NULL;
  uint64_t seed = 0;
  PE_TRY(pe_kernel_rng(c, &r, &seed));
  int64_t n = pe_tensor_numel(out);
  uint64_t base = pe_rng_reserve(r, (uint64_t)n);
  double lo = pe_attr_f(c->def, c->desc, "min"), hi = pe_attr_f(c->def, c->desc, "max");
  int nt = pe_kernel_threads(c);
  if (out->dtype == PE_F64) {
    double *o = out->data;
#pragma omp parallel for num_threads(nt) if (pe_par_split(n)) schedule(static)
    for (int64_t i = 0; i < n; i++)
      o[i] = lo + (hi - lo) * pe_rng_uniform(seed, base + (uint64_t)i);
    return NULL;
  }
  /* f32: rounding lo + (hi-lo)*u to float can land on hi; keep [lo, hi). */
  float *o = pe_f32(out), fhi = (float)hi, below = lo < hi ? nextafterf(fhi, -INFINITY) : fhi;
#pragma omp parallel for num_threads(nt) if (pe_par_split(n)) schedule(static)
  for (int64_t i = 0; i < n; i++) {
    float v = (float)(lo + (hi - lo) * pe_rng_uniform(seed, base + (uint64_t)i));
    o[i] = v >= fhi ? below : v;
  }
  return NULL;
}

/* --- gaussian_random -------------------------------------------------------------------- */

static pe_status *gaussian_infer(pe_infer_ctx *c) {
  pe_shape shape;
  pe_dtype dt = PE_F32;
  PE_TRY(shape_from_attr(c, &shape));
  PE_TRY(dtype_from_attr(c, false, &dt));
  float mean = pe_attr_f(c->def, c->desc, "mean"), sd = pe_attr_f(c->def, c->desc, "std");
  if (!isfinite(mean) || !(sd >= 0) || !isfinite(sd))
    return pe_infer_error(c, PE_EATTR, "attributes mean = %g, std = %g: need finite std >= 0", mean,
                          sd);
  pe_infer_set(c, 0, dt, &shape);
  return NULL;
}

static pe_status *gaussian_kernel(pe_kernel_ctx *c) {
  pe_tensor *out = pe_kout(c, 0, 0);
  if (!out) return NULL;
  pe_rng *r = NULL;
  uint64_t seed = 0;
  PE_TRY(pe_kernel_rng(c, &r, &seed));
  int64_t n = pe_tensor_numel(out);
  uint64_t pad = r->offset & 1; /* align so uniform counters 2c, 2c+1 are ours */
  uint64_t base = (pe_rng_reserve(r, 2 * (uint64_t)n + pad) + pad) / 2;
  double mean = pe_attr_f(c->def, c->desc, "mean"), sd = pe_attr_f(c->def, c->desc, "std");
  int nt = pe_kernel_threads(c);
  if (out->dtype == PE_F64) {
    double *o = out->data;
#pragma omp parallel for num_threads(nt) if (pe_par_split(n)) schedule(static)
    for (int64_t i = 0; i < n; i++) o[i] = mean + sd * pe_rng_normal(seed, base + (uint64_t)i);
  } else {
    float *o = pe_f32(out);
#pragma omp parallel for num_threads(nt) if (pe_par_split(n)) schedule(static)
    for (int64_t i = 0; i < n; i++)
      o[i] = (float)(mean + sd * pe_rng_normal(seed, base + (uint64_t)i));
  }
  return NULL;
}

/* --- assign ------------------------------------------------------------------------------ */

static pe_status *assign_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, ASSIGN_X, 0), *out = pe_kout(c, ASSIGN_OUT, 0);
  if (!out || out == x || out->data == x->data) return NULL; /* in place: nothing to copy */
  size_t bytes = pe_tensor_bytes(x);
  if (bytes) memcpy(out->data, x->data, bytes);
  return NULL;
}

/* X@GRAD = Out@GRAD (zeros when the backward pass pruned Out@GRAD). */
static pe_status *assign_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *dx = pe_kout(c, ASSIGN_G_DX, 0), *dout = pe_kin(c, ASSIGN_G_DOUT, 0);
  if (!dx) return NULL;
  if (!dout) {
    pe_tensor_zero(dx);
    return NULL;
  }
  if (pe_tensor_numel(dout) != pe_tensor_numel(dx) || dout->dtype != dx->dtype)
    return pe_kernel_error(c, PE_ESHAPE, "Out@GRAD has %lld %s elements, X@GRAD %lld %s",
                           (long long)pe_tensor_numel(dout), pe_dtype_name(dout->dtype),
                           (long long)pe_tensor_numel(dx), pe_dtype_name(dx->dtype));
  if (dx->data != dout->data && pe_tensor_bytes(dx))
    memcpy(dx->data, dout->data, pe_tensor_bytes(dx));
  return NULL;
}

/* --- table ---------------------------------------------------------------------------------- */

static const pe_slot_def no_slots[] = {{NULL}};
static const pe_slot_def out_slots[] = {{"Out", 1, 1, 0}, {NULL}};

static const pe_attr_def fill_constant_attrs[] = {
    {"shape", PE_ATTR_INTS, true, 0, NULL},
    {"value", PE_ATTR_FLOAT, false, 0, NULL},
    {"dtype", PE_ATTR_INT, false, PE_F32, NULL},
    {NULL},
};
static const pe_attr_def uniform_attrs[] = {
    {"shape", PE_ATTR_INTS, true, 0, NULL},      {"min", PE_ATTR_FLOAT, false, -1, NULL},
    {"max", PE_ATTR_FLOAT, false, 1, NULL},      {"seed", PE_ATTR_INT, false, 0, NULL},
    {"dtype", PE_ATTR_INT, false, PE_F32, NULL}, {NULL},
};
static const pe_attr_def gaussian_attrs[] = {
    {"shape", PE_ATTR_INTS, true, 0, NULL},      {"mean", PE_ATTR_FLOAT, false, 0, NULL},
    {"std", PE_ATTR_FLOAT, false, 1, NULL},      {"seed", PE_ATTR_INT, false, 0, NULL},
    {"dtype", PE_ATTR_INT, false, PE_F32, NULL}, {NULL},
};

static const pe_slot_def assign_in[] = {{"X", 1, 1, 0}, {NULL}};
/* Default grad maker: X, Out, Out@GRAD -> X@GRAD; a pruned slot is absent. */
static const pe_slot_def assign_grad_in[] = {
    {"X", 1, 1, 0}, {"Out", 0, 1, 0}, {"Out" PE_GRAD_SUFFIX, 0, 1, 0}, {NULL}};
static const pe_slot_def assign_grad_out[] = {{"X" PE_GRAD_SUFFIX, 0, 1, 0}, {NULL}};
static const pe_attr_def no_attrs[] = {{NULL}};

const pe_op_def pe_ops_creation[] = {
    {.type = "fill_constant",
     .inputs = no_slots,
     .outputs = out_slots,
     .attrs = fill_constant_attrs,
     .flags = PE_OP_NO_GRAD,
     .infer = fill_constant_infer,
     .kernel_cpu = fill_constant_kernel},
    {.type = "uniform_random",
     .inputs = no_slots,
     .outputs = out_slots,
     .attrs = uniform_attrs,
     .flags = PE_OP_RANDOM | PE_OP_NO_GRAD,
     .infer = uniform_infer,
     .kernel_cpu = uniform_kernel},
    {.type = "gaussian_random",
     .inputs = no_slots,
     .outputs = out_slots,
     .attrs = gaussian_attrs,
     .flags = PE_OP_RANDOM | PE_OP_NO_GRAD,
     .infer = gaussian_infer,
     .kernel_cpu = gaussian_kernel},
    {.type = "assign",
     .inputs = assign_in,
     .outputs = out_slots,
     .attrs = no_attrs,
     .infer = pe_infer_same_as_first,
     .kernel_cpu = assign_kernel,
     .grad = pe_grad_default},
    {.type = "assign_grad",
     .inputs = assign_grad_in,
     .outputs = assign_grad_out,
     .attrs = no_attrs,
     .infer = pe_infer_grad_like_inputs,
     .kernel_cpu = assign_grad_kernel},
    {0},
};
