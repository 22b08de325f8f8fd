/* transpose2 (Paddle's): Out = X with its dims permuted by axis (Out dim i
 * is X dim axis[i]), any dtype. XShape (optional, Paddle's) is [0] + X's
 * dims and holds no data. The gradient permutes Out@GRAD back with the
 * inverse permutation. */
#include "ops/cpu/strided.h"
#include "ops/op_tables.h"

enum { TR_X };
enum { TR_OUT, TR_XSHAPE };
enum { TRG_X, TRG_OUT, TRG_XSHAPE, TRG_DOUT, TRG_DXSHAPE };
enum { TRG_DX };

/* axis as a permutation of X's dims, else an error naming it and X. */
static pe_status *tr_perm(pe_infer_ctx *c, int perm[PE_MAX_DIMS]) {
  pe_meta *x = pe_in_meta(c, TR_X, 0);
  if (!x) return pe_infer_error(c, PE_EARITY, "needs input X");
  const int64_t *v;
  int n = pe_attr_ints(c->desc, "axis", &v);
  char sb[PE_SHAPE_STRLEN];
  bool seen[PE_MAX_DIMS] = {false};
  bool ok = n == x->shape.ndim;
  for (int i = 0; ok && i < n; i++) {
    ok = v[i] >= 0 && v[i] < n && !seen[v[i]];
    if (ok) seen[v[i]] = true, perm[i] = (int)v[i];
  }
  if (!ok) {
    char as[PE_SHAPE_STRLEN];
    pe_shape a = pe_shape_make(n <= PE_MAX_DIMS ? n : PE_MAX_DIMS, v);
    return pe_infer_error(c, PE_EATTR, "axis %s is not a permutation of the %d dims of X '%s' %s",
                          pe_shape_str(&a, as, sizeof as), x->shape.ndim, pe_in_name(c, TR_X, 0),
                          pe_shape_str(&x->shape, sb, sizeof sb));
  }
  return NULL;
}

static pe_status *tr_infer(pe_infer_ctx *c) {
  int perm[PE_MAX_DIMS];
  PE_TRY(tr_perm(c, perm));
  pe_meta *x = pe_in_meta(c, TR_X, 0);
  pe_shape out = {.ndim = x->shape.ndim};
  for (int i = 0; i < out.ndim; i++) out.d[i] = x->shape.d[perm[i]];
  pe_infer_set(c, TR_OUT, x->dtype, &out);
  if (x->shape.ndim < PE_MAX_DIMS) {
    pe_shape xs = {.ndim = x->shape.ndim + 1};
    for (int i = 0; i < x->shape.ndim; i++) xs.d[i + 1] = x->shape.d[i];
    pe_infer_set(c, TR_XSHAPE, x->dtype, &xs);
  } else if (c->out[TR_XSHAPE].n) {
    return pe_infer_error(c, PE_ESHAPE, "output XShape needs rank %d, more than %d",
                          x->shape.ndim + 1, PE_MAX_DIMS);
  }
  return NULL;
}

static pe_status *tr_grad_infer(pe_infer_ctx *c) {
  int perm[PE_MAX_DIMS];
  PE_TRY(tr_perm(c, perm));
  return pe_infer_grad_like_inputs(c);
}

static void tr_perm_k(const pe_kernel_ctx *c, int n, int perm[PE_MAX_DIMS]) {
  const int64_t *v;
  pe_attr_ints(c->desc, "axis", &v);
  for (int i = 0; i < n; i++) perm[i] = (int)v[i];
}

static pe_status *tr_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, TR_X, 0), *out = pe_kout(c, TR_OUT, 0);
  int nd = x->shape.ndim, perm[PE_MAX_DIMS];
  tr_perm_k(c, nd, perm);
  int64_t xs[PE_MAX_DIMS], os[PE_MAX_DIMS], src[PE_MAX_DIMS];
  pe_dense_strides(x->shape.d, nd, xs);
  pe_dense_strides(out->shape.d, nd, os);
  for (int i = 0; i < nd; i++) src[i] = xs[perm[i]];
  pe_strided_copy(out->data, os, x->data, src, out->shape.d, nd, pe_dtype_size(x->dtype));
  return NULL;
}

/* dX[j] at X's index = dOut at the permuted index: walk dOut's dims and
 * write dX through the permuted strides. */
static pe_status *tr_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *dout = pe_kin(c, TRG_DOUT, 0), *dx = pe_kout(c, TRG_DX, 0);
  if (!dx) return NULL;
  if (!dout) {
    pe_tensor_zero(dx);
    return NULL;
  }
  int nd = dx->shape.ndim, perm[PE_MAX_DIMS];
  if (dout->shape.ndim != nd || pe_tensor_numel(dout) != pe_tensor_numel(dx))
    return pe_kernel_error(c, PE_ESHAPE, "input Out@GRAD does not match X");
  tr_perm_k(c, nd, perm);
  int64_t xs[PE_MAX_DIMS], os[PE_MAX_DIMS], dst[PE_MAX_DIMS];
  pe_dense_strides(dx->shape.d, nd, xs);
  pe_dense_strides(dout->shape.d, nd, os);
  for (int i = 0; i < nd; i++) dst[i] = xs[perm[i]];
  pe_strided_copy(dx->data, dst, dout->data, os, dout->shape.d, nd, pe_dtype_size(dx->dtype));
  return NULL;
}

/* --- rows ---------------------------------------------------------------------- */

static const pe_slot_def tr_in[] = {{"X", 1, 1}, {NULL}};
static const pe_slot_def tr_out[] = {{"Out", 1, 1}, {"XShape", 0, 1}, {NULL}};
static const pe_slot_def tr_grad_in[] = {{"X", 1, 1},
                                         {"Out", 0, 1},
                                         {"XShape", 0, 1},
                                         {"Out" PE_GRAD_SUFFIX, 0, 1},
                                         {"XShape" PE_GRAD_SUFFIX, 0, 1},
                                         {NULL}};
static const pe_slot_def tr_grad_out[] = {{"X" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
static const pe_attr_def tr_attrs[] = {{"axis", PE_ATTR_INTS, true}, {NULL}};

const pe_op_def pe_ops_transpose[] = {
    {.type = "transpose2",
     .inputs = tr_in,
     .outputs = tr_out,
     .attrs = tr_attrs,
     .infer = tr_infer,
     .kernel_cpu = tr_kernel,
     .grad = pe_grad_default},
    {.type = "transpose2_grad",
     .inputs = tr_grad_in,
     .outputs = tr_grad_out,
     .attrs = tr_attrs,
     .infer = tr_grad_infer,
     .kernel_cpu = tr_grad_kernel},
    {NULL},
};
