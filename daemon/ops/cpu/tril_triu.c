/* tril_triu (Paddle's): Out = X with the elements outside a triangle of its
 * last two dims set to zero, any dtype, rank >= 2. lower: keep column j of
 * row i where j - i <= diagonal (numpy's tril); else where j - i >=
 * diagonal (triu). A causal attention mask is triu(fill_constant(-1e9),
 * diagonal 1). The gradient is the same triangle of Out@GRAD. */
#include <string.h>

#include "ops/op_tables.h"

enum { TT_X };
enum { TT_OUT };
enum { TTG_X, TTG_OUT, TTG_DOUT };
enum { TTG_DX };

static pe_status *tt_check(pe_infer_ctx *c) {
  pe_meta *x = pe_in_meta(c, TT_X, 0);
  if (!x) return pe_infer_error(c, PE_EARITY, "needs input X");
  if (x->shape.ndim < 2) {
    char sb[PE_SHAPE_STRLEN];
    return pe_infer_error(c, PE_ESHAPE, "input X '%s' %s has rank %d; a triangle needs 2 or more",
                          pe_in_name(c, TT_X, 0), pe_shape_str(&x->shape, sb, sizeof sb),
                          x->shape.ndim);
  }
  return NULL;
}

static pe_status *tt_infer(pe_infer_ctx *c) {
  PE_TRY(tt_check(c));
  pe_meta *x = pe_in_meta(c, TT_X, 0);
  pe_infer_set(c, TT_OUT, x->dtype, &x->shape);
  return NULL;
}

static pe_status *tt_grad_infer(pe_infer_ctx *c) {
  PE_TRY(tt_check(c));
  return pe_infer_grad_like_inputs(c);
}

/* dst = the triangle of src (one shape); rows of the last two dims. Zero
 * bits are zero in every dtype, so a row is a copy and a memset. */
static void tt_apply(const pe_kernel_ctx *c, const pe_tensor *src, pe_tensor *dst) {
  int nd = src->shape.ndim;
  int64_t rows = src->shape.d[nd - 2], cols = src->shape.d[nd - 1];
  int64_t mats = rows > 0 && cols > 0 ? pe_tensor_numel(src) / (rows * cols) : 0;
  int64_t diag = pe_attr_i(c->def, c->desc, "diagonal");
  bool lower = pe_attr_b(c->def, c->desc, "lower");
  size_t es = pe_dtype_size(src->dtype);
  const char *s = src->data;
  char *d = dst->data;
  for (int64_t m = 0; m < mats; m++)
    for (int64_t i = 0; i < rows; i++) {
      /* the kept columns [lo, hi) of row i */
      int64_t lo = lower ? 0 : i + diag, hi = lower ? i + diag + 1 : cols;
      lo = lo < 0 ? 0 : lo > cols ? cols : lo;
      hi = hi < lo ? lo : hi > cols ? cols : hi;
      size_t row = (size_t)((m * rows + i) * cols) * es;
      memset(d + row, 0, (size_t)lo * es);
      memcpy(d + row + (size_t)lo * es, s + row + (size_t)lo * es, (size_t)(hi - lo) * es);
      memset(d + row + (size_t)hi * es, 0, (size_t)(cols - hi) * es);
    }
}

static pe_status *tt_kernel(pe_kernel_ctx *c) {
  tt_apply(c, pe_kin(c, TT_X, 0), pe_kout(c, TT_OUT, 0));
  return NULL;
}

static pe_status *tt_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *dx = pe_kout(c, TTG_DX, 0), *dout = pe_kin(c, TTG_DOUT, 0);
  if (!dx) return NULL;
  if (!dout) {
    pe_tensor_zero(dx);
    return NULL;
  }
  if (!pe_shape_equal(&dout->shape, &dx->shape) || dout->dtype != dx->dtype)
    return pe_kernel_error(c, PE_ESHAPE, "input Out@GRAD does not match X");
  tt_apply(c, dout, dx);
  return NULL;
}

static const pe_slot_def tt_in[] = {{"X", 1, 1, 0}, {NULL}};
static const pe_slot_def tt_out[] = {{"Out", 1, 1, 0}, {NULL}};
static const pe_slot_def tt_grad_in[] = {
    {"X", 1, 1, 0}, {"Out", 0, 1, 0}, {"Out" PE_GRAD_SUFFIX, 0, 1, 0}, {NULL}};
static const pe_slot_def tt_grad_out[] = {{"X" PE_GRAD_SUFFIX, 0, 1, 0}, {NULL}};
static const pe_attr_def tt_attrs[] = {
    {"diagonal", PE_ATTR_INT, false, 0, NULL}, {"lower", PE_ATTR_BOOL, false, 1, NULL}, {NULL}};

const pe_op_def pe_ops_tril_triu[] = {
    {.type = "tril_triu",
     .inputs = tt_in,
     .outputs = tt_out,
     .attrs = tt_attrs,
     .infer = tt_infer,
     .kernel_cpu = tt_kernel,
     .grad = pe_grad_default},
    {.type = "tril_triu_grad",
     .inputs = tt_grad_in,
     .outputs = tt_grad_out,
     .attrs = tt_attrs,
     .infer = tt_grad_infer,
     .kernel_cpu = tt_grad_kernel},
    {NULL},
};
