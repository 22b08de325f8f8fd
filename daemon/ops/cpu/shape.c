/* Shape ops: reshape and flatten (docs/ops.md, "shape"). The data is copied
 * unchanged (any dtype); only the shape differs. Their gradients copy
 * Out@GRAD back into X's shape.
 *
 * Compile-time shapes may hold -1 (the batch dim). reshape keeps -1 wherever
 * the size depends on it and checks the element count whenever both sides are
 * known; at run time everything is concrete and checked exactly. */
#include <string.h>

#include "ops/op_tables.h"

enum { SH_X, SH_OUT_IN, SH_DOUT }; /* grad inputs (forward: X) */

/* --- reshape ------------------------------------------------------------------------ */

static pe_status *reshape_shape(pe_infer_ctx *c, pe_shape *out) {
  pe_meta *x = pe_in_meta(c, SH_X, 0);
  if (!x) return pe_infer_error(c, PE_EARITY, "needs input X");
  const int64_t *v;
  int n = pe_attr_ints(c->desc, "shape", &v);
  if (n < 1 || n > PE_MAX_DIMS)
    return pe_infer_error(c, PE_EATTR, "attribute shape needs 1..%d dims, has %d", PE_MAX_DIMS, n);
  char xs[PE_SHAPE_STRLEN], ts[PE_SHAPE_STRLEN];
  pe_shape target = pe_shape_make(n, v); /* as written, for messages */
  const char *xn = pe_in_name(c, SH_X, 0);
  int infer_at = -1, out_unknown = 0;
  int64_t out_known = 1;
  out->ndim = n;
  for (int i = 0; i < n; i++) {
    int64_t d = v[i];
    if (d == 0) {
      if (i >= x->shape.ndim)
        return pe_infer_error(c, PE_EATTR, "shape %s copies dim %d (0) but X '%s' %s has rank %d",
                              pe_shape_str(&target, ts, sizeof ts), i, xn,
                              pe_shape_str(&x->shape, xs, sizeof xs), x->shape.ndim);
      d = x->shape.d[i];
    } else if (d == -1) {
      if (infer_at >= 0)
        return pe_infer_error(c, PE_EATTR, "shape %s has more than one -1",
                              pe_shape_str(&target, ts, sizeof ts));
      infer_at = i;
    } else if (d < -1) {
      return pe_infer_error(c, PE_EATTR, "shape %s has a negative dim %lld",
                            pe_shape_str(&target, ts, sizeof ts), (long long)d);
    }
    out->d[i] = d;
    if (i == infer_at) continue;
    if (d < 0)
      out_unknown++; /* a copied -1 of X */
    else if (__builtin_mul_overflow(out_known, d, &out_known))
      return pe_infer_error(c, PE_ESHAPE, "cannot reshape X '%s' %s to %s: too many elements", xn,
                            pe_shape_str(&x->shape, xs, sizeof xs),
                            pe_shape_str(&target, ts, sizeof ts));
  }
  int x_unknown = 0;
  int64_t x_known = 1;
  for (int i = 0; i < x->shape.ndim; i++) {
    if (x->shape.d[i] < 0)
      x_unknown++;
    else
      x_known *= x->shape.d[i];
  }
  /* Copied -1 dims are the same unknowns on both sides and cancel out; an
   * uncopied one leaves the element count open until run time. */
  if (x_unknown > out_unknown) return NULL; /* out->d[infer_at] stays -1 */
  if (infer_at >= 0) {
    if (out_known == 0 || x_known % out_known != 0)
      return pe_infer_error(
          c, PE_ESHAPE, "cannot reshape X '%s' %s to %s: %lld elements do not divide by %lld", xn,
          pe_shape_str(&x->shape, xs, sizeof xs), pe_shape_str(&target, ts, sizeof ts),
          (long long)x_known, (long long)out_known);
    out->d[infer_at] = x_known / out_known;
  } else if (x_known != out_known) {
    return pe_infer_error(c, PE_ESHAPE, "cannot reshape X '%s' %s to %s: %lld elements vs %lld", xn,
                          pe_shape_str(&x->shape, xs, sizeof xs),
                          pe_shape_str(&target, ts, sizeof ts), (long long)x_known,
                          (long long)out_known);
  }
  return NULL;
}

static pe_status *reshape_infer(pe_infer_ctx *c) {
  pe_shape out;
  PE_TRY(reshape_shape(c, &out));
  pe_infer_set(c, 0, pe_in_meta(c, SH_X, 0)->dtype, &out);
  return NULL;
}

/* --- flatten ------------------------------------------------------------------------- */

static pe_status *flatten_shape(pe_infer_ctx *c, pe_shape *out) {
  pe_meta *x = pe_in_meta(c, SH_X, 0);
  if (!x) return pe_infer_error(c, PE_EARITY, "needs input X");
  int64_t axis = pe_attr_i(c->def, c->desc, "axis");
  if (axis < 0 || axis > x->shape.ndim) {
    char xs[PE_SHAPE_STRLEN];
    return pe_infer_error(c, PE_EATTR, "axis %lld is outside [0, %d] for X '%s' %s",
                          (long long)axis, x->shape.ndim, pe_in_name(c, SH_X, 0),
                          pe_shape_str(&x->shape, xs, sizeof xs));
  }
  /* pe_shape_prod is -1 when any dim in the range is unknown. */
  *out = PE_SHAPE(pe_shape_prod(&x->shape, 0, (int)axis),
                  pe_shape_prod(&x->shape, (int)axis, x->shape.ndim));
  return NULL;
}

static pe_status *flatten_infer(pe_infer_ctx *c) {
  pe_shape out;
  PE_TRY(flatten_shape(c, &out));
  pe_infer_set(c, 0, pe_in_meta(c, SH_X, 0)->dtype, &out);
  return NULL;
}

/* --- kernels (shared) ------------------------------------------------------------------ */

static pe_status *copy_bytes(pe_kernel_ctx *c, pe_tensor *dst, const pe_tensor *src) {
  if (pe_tensor_bytes(dst) != pe_tensor_bytes(src))
    return pe_kernel_error(c, PE_ESHAPE, "%lld elements in, %lld out",
                           (long long)pe_tensor_numel(src), (long long)pe_tensor_numel(dst));
  if (dst->data != src->data && pe_tensor_bytes(src))
    memcpy(dst->data, src->data, pe_tensor_bytes(src));
  return NULL;
}

static pe_status *copy_kernel(pe_kernel_ctx *c) {
  return copy_bytes(c, pe_kout(c, 0, 0), pe_kin(c, SH_X, 0));
}

/* X@GRAD = Out@GRAD in X's shape (zeros when Out@GRAD was pruned). */
static pe_status *copy_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *dx = pe_kout(c, 0, 0), *dout = pe_kin(c, SH_DOUT, 0);
  if (!dx) return NULL;
  if (!dout) {
    pe_tensor_zero(dx);
    return NULL;
  }
  return copy_bytes(c, dx, dout);
}

static pe_status *reshape_grad_infer(pe_infer_ctx *c) {
  pe_shape out;
  PE_TRY(reshape_shape(c, &out));
  return pe_infer_grad_like_inputs(c);
}

static pe_status *flatten_grad_infer(pe_infer_ctx *c) {
  pe_shape out;
  PE_TRY(flatten_shape(c, &out));
  return pe_infer_grad_like_inputs(c);
}

/* --- table ----------------------------------------------------------------------------- */

static const pe_slot_def x_in[] = {{"X", 1, 1}, {NULL}};
static const pe_slot_def out_slot[] = {{"Out", 1, 1}, {NULL}};
static const pe_slot_def grad_in[] = {
    {"X", 1, 1}, {"Out", 0, 1}, {"Out" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
static const pe_slot_def grad_out[] = {{"X" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
static const pe_attr_def reshape_attrs[] = {{"shape", PE_ATTR_INTS, true}, {NULL}};
static const pe_attr_def flatten_attrs[] = {{"axis", PE_ATTR_INT, false, 1}, {NULL}};

const pe_op_def pe_ops_shape[] = {
    {.type = "reshape",
     .inputs = x_in,
     .outputs = out_slot,
     .attrs = reshape_attrs,
     .infer = reshape_infer,
     .kernel_cpu = copy_kernel,
     .grad = pe_grad_default},
    {.type = "reshape_grad",
     .inputs = grad_in,
     .outputs = grad_out,
     .attrs = reshape_attrs,
     .infer = reshape_grad_infer,
     .kernel_cpu = copy_grad_kernel},
    {.type = "flatten",
     .inputs = x_in,
     .outputs = out_slot,
     .attrs = flatten_attrs,
     .infer = flatten_infer,
     .kernel_cpu = copy_kernel,
     .grad = pe_grad_default},
    {.type = "flatten_grad",
     .inputs = grad_in,
     .outputs = grad_out,
     .attrs = flatten_attrs,
     .infer = flatten_grad_infer,
     .kernel_cpu = copy_grad_kernel},
    {NULL},
};
