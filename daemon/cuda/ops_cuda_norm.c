/* CUDA kernels of layer_norm and of the pointwise activations gelu, abs
 * and square, with their gradients. Same slots and attributes as
 * ops/cpu/layer_norm.c and activation.c: layer_norm's Mean and Variance
 * are the rows' statistics (the variance, not its inverse root), and its
 * gradient reads them; gelu's form follows its attribute approximate. */
#include <string.h>

#include "cuda/kernels_norm.h"
#include "cuda/ops_cuda.h"

/* --- layer_norm ------------------------------------------------------------------ */

enum { LN_X, LN_SCALE, LN_BIAS };
enum { LN_Y, LN_MEAN, LN_VAR };
enum { LNG_X, LNG_SCALE, LNG_BIAS, LNG_Y, LNG_MEAN, LNG_VAR, LNG_DY };
enum { LNG_DX, LNG_DSCALE, LNG_DBIAS };

static void ln_dims(const pe_kernel_ctx *c, const pe_tensor *x, int64_t *left, int64_t *right) {
  int axis = (int)pe_attr_i(c->def, c->desc, "begin_norm_axis");
  *left = pe_shape_prod(&x->shape, 0, axis);
  *right = pe_shape_prod(&x->shape, axis, x->shape.ndim);
}

pe_status *pe_cuk_layer_norm(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *in = pe_kin(c, LN_X, 0);
  int64_t left, right;
  ln_dims(c, in, &left, &right);
  return pe_cu_check(
      c,
      pe_cu_layer_norm(pe_f32(in), pe_cu_f32_or_null(pe_kin(c, LN_SCALE, 0)),
                       pe_cu_f32_or_null(pe_kin(c, LN_BIAS, 0)), pe_f32(pe_kout(c, LN_Y, 0)),
                       pe_f32(pe_kout(c, LN_MEAN, 0)), pe_f32(pe_kout(c, LN_VAR, 0)), left, right,
                       pe_attr_f(c->def, c->desc, "epsilon"), x->stream),
      "layer_norm");
}

pe_status *pe_cuk_layer_norm_grad(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *in = pe_kin(c, LNG_X, 0), *dy = pe_kin(c, LNG_DY, 0);
  pe_tensor *mean = pe_kin(c, LNG_MEAN, 0), *var = pe_kin(c, LNG_VAR, 0);
  pe_tensor *dx = pe_kout(c, LNG_DX, 0), *dscale = pe_kout(c, LNG_DSCALE, 0);
  pe_tensor *dbias = pe_kout(c, LNG_DBIAS, 0);
  if (!dy) return pe_cu_zero_outputs(c, x);
  int64_t left, right;
  ln_dims(c, in, &left, &right);
  if (pe_tensor_numel(mean) != left || pe_tensor_numel(var) != left ||
      pe_tensor_numel(dy) != left * right) {
    char sb[PE_SHAPE_STRLEN];
    return pe_kernel_error(c, PE_ESHAPE,
                           "inputs Mean, Variance (%lld, %lld elements) and Y@GRAD (%lld) do not "
                           "match X %s at begin_norm_axis %lld",
                           (long long)pe_tensor_numel(mean), (long long)pe_tensor_numel(var),
                           (long long)pe_tensor_numel(dy), pe_shape_str(&in->shape, sb, sizeof sb),
                           (long long)pe_attr_i(c->def, c->desc, "begin_norm_axis"));
  }
  if (left == 0 || right == 0) return pe_cu_zero_outputs(c, x);
  void *ws = NULL;
  if (dscale || dbias)
    PE_TRY(pe_cuda_workspace(x, pe_cu_layer_norm_grad_scratch(left, right), &ws));
  return pe_cu_check(
      c,
      pe_cu_layer_norm_grad(pe_f32(in), pe_cu_f32_or_null(pe_kin(c, LNG_SCALE, 0)), pe_f32(mean),
                            pe_f32(var), pe_f32(dy), pe_cu_f32_or_null(dx),
                            pe_cu_f32_or_null(dscale), pe_cu_f32_or_null(dbias), left, right,
                            pe_attr_f(c->def, c->desc, "epsilon"), ws, x->stream),
      "layer_norm_grad");
}

/* --- gelu, abs, square --------------------------------------------------------------- */

/* The function of c's op (the grad row's type names its forward). */
static pe_cu_pointwise pw_kind(const pe_kernel_ctx *c) {
  const char *t = c->def->type;
  if (strncmp(t, "gelu", 4) == 0)
    return pe_attr_b(c->def, c->desc, "approximate") ? PE_CU_GELU_TANH : PE_CU_GELU_ERF;
  return strncmp(t, "abs", 3) == 0 ? PE_CU_ABS : PE_CU_SQUARE;
}

pe_status *pe_cuk_pointwise(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *in = pe_kin(c, 0, 0), *out = pe_kout(c, 0, 0);
  return pe_cu_check(
      c, pe_cu_pointwise_fwd(pw_kind(c), pe_f32(in), pe_f32(out), pe_tensor_numel(in), x->stream),
      c->def->type);
}

/* Inputs X, Out (unread), Out@GRAD; output X@GRAD. */
pe_status *pe_cuk_pointwise_grad(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *dx = pe_kout(c, 0, 0), *in = pe_kin(c, 0, 0), *dout = pe_kin(c, 2, 0);
  if (!dx) return NULL;
  if (!dout) return pe_cu_zero(c, x, dx);
  if (!in) return pe_kernel_error(c, PE_EARITY, "needs input X");
  int64_t n = pe_tensor_numel(dx);
  if (pe_tensor_numel(in) != n || pe_tensor_numel(dout) != n)
    return pe_kernel_error(c, PE_ESHAPE, "input sizes differ (%lld, %lld, %lld elements)",
                           (long long)pe_tensor_numel(in), (long long)pe_tensor_numel(dout),
                           (long long)n);
  return pe_cu_check(
      c, pe_cu_pointwise_bwd(pw_kind(c), pe_f32(in), pe_f32(dout), pe_f32(dx), n, x->stream),
      c->def->type);
}
