/* smooth_l1_loss (Paddle's op and attribute): X, Y of one shape [N, ...],
 * optional InsideWeight and OutsideWeight of that shape -> Diff (optional,
 * X's shape), Out [N, 1]:
 *
 *   d   = InsideWeight * (X - Y)                          (Diff)
 *   Out = sum over the dims after the first of OutsideWeight * f(d)
 *   f(d) = 0.5 (sigma d)^2  where |d| < 1 / sigma^2,  else |d| - 0.5 / sigma^2
 *
 * With beta = 1 / sigma^2, f is PyTorch's smooth_l1_loss with that beta
 * (quadratic below beta, linear above, continuous with its slope).
 * Gradient: dX = InsideWeight * (OutsideWeight * f'(d) * dOut[row] +
 * dDiff), dY = -dX, with f'(d) = sigma^2 d clamped to [-1, 1]. The weights
 * get none. The gradient recomputes d from X, Y and InsideWeight. The loss
 * is small next to the layers before it: one thread, element order. */
#include <math.h>

#include "ops/op_tables.h"

enum { SL_X, SL_Y, SL_IW, SL_OW };
enum { SL_DIFF, SL_OUT };
enum { SLG_DDIFF = 6, SLG_DOUT };
enum { SLG_DX, SLG_DY };

static pe_status *sl_check_like_x(pe_infer_ctx *c, int slot, const char *what) {
  pe_meta *x = pe_in_meta(c, SL_X, 0), *m = pe_in_meta(c, slot, 0);
  if (!m) return NULL;
  PE_TRY(pe_infer_expect_dtype(c, slot, 0, PE_F32));
  if (pe_shape_compatible(&x->shape, &m->shape)) return NULL;
  char sx[PE_SHAPE_STRLEN], sm[PE_SHAPE_STRLEN];
  return pe_infer_error(c, PE_ESHAPE, "input %s '%s' shape %s does not match X '%s' shape %s", what,
                        pe_in_name(c, slot, 0), pe_shape_str(&m->shape, sm, sizeof sm),
                        pe_in_name(c, SL_X, 0), pe_shape_str(&x->shape, sx, sizeof sx));
}

/* X f32 of rank >= 1; Y and the weights f32 of X's shape; sigma > 0. */
static pe_status *sl_check(pe_infer_ctx *c) {
  pe_meta *x = pe_in_meta(c, SL_X, 0), *y = pe_in_meta(c, SL_Y, 0);
  if (!x || !y) return pe_infer_error(c, PE_EARITY, "needs inputs X and Y");
  PE_TRY(pe_infer_expect_dtype(c, SL_X, 0, PE_F32));
  if (x->shape.ndim < 1)
    return pe_infer_error(c, PE_ESHAPE, "input X '%s' is a scalar; it needs a batch dim",
                          pe_in_name(c, SL_X, 0));
  PE_TRY(sl_check_like_x(c, SL_Y, "Y"));
  PE_TRY(sl_check_like_x(c, SL_IW, "InsideWeight"));
  PE_TRY(sl_check_like_x(c, SL_OW, "OutsideWeight"));
  float sigma = pe_attr_f(c->def, c->desc, "sigma");
  if (!(sigma > 0)) return pe_infer_error(c, PE_EATTR, "sigma %g must be positive", (double)sigma);
  return NULL;
}

static pe_status *sl_infer(pe_infer_ctx *c) {
  PE_TRY(sl_check(c));
  pe_meta *x = pe_in_meta(c, SL_X, 0);
  pe_shape out = {.ndim = 2, .d = {x->shape.d[0], 1}};
  pe_infer_set(c, SL_DIFF, PE_F32, &x->shape);
  pe_infer_set(c, SL_OUT, PE_F32, &out);
  return NULL;
}

static pe_status *sl_grad_infer(pe_infer_ctx *c) {
  PE_TRY(sl_check(c));
  return pe_infer_grad_like_inputs(c);
}

/* Element i's d = InsideWeight * (X - Y). */
static inline float sl_diff(const float *x, const float *y, const float *iw, int64_t i) {
  float d = x[i] - y[i];
  return iw ? iw[i] * d : d;
}

static const float *sl_opt(pe_kernel_ctx *c, int slot) {
  pe_tensor *t = pe_kin(c, slot, 0);
  return t ? pe_f32(t) : NULL;
}

static pe_status *sl_kernel(pe_kernel_ctx *c) {
  pe_tensor *xt = pe_kin(c, SL_X, 0), *out = pe_kout(c, SL_OUT, 0), *dt = pe_kout(c, SL_DIFF, 0);
  const float *x = pe_f32(xt), *y = pe_f32(pe_kin(c, SL_Y, 0));
  const float *iw = sl_opt(c, SL_IW), *ow = sl_opt(c, SL_OW);
  float sigma = pe_attr_f(c->def, c->desc, "sigma"), s2 = sigma * sigma, beta = 1.0f / s2;
  int64_t n = xt->shape.d[0], row = n > 0 ? pe_tensor_numel(xt) / n : 0;
  float *o = pe_f32(out), *dp = dt ? pe_f32(dt) : NULL;
  for (int64_t r = 0; r < n; r++) {
    float sum = 0;
    for (int64_t j = r * row; j < (r + 1) * row; j++) {
      float d = sl_diff(x, y, iw, j), a = fabsf(d);
      float f = a < beta ? 0.5f * s2 * d * d : a - 0.5f * beta;
      sum += ow ? ow[j] * f : f;
      if (dp) dp[j] = d;
    }
    o[r] = sum;
  }
  return NULL;
}

static pe_status *sl_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *dx = pe_kout(c, SLG_DX, 0), *dy = pe_kout(c, SLG_DY, 0);
  pe_tensor *xt = pe_kin(c, SL_X, 0), *dout = pe_kin(c, SLG_DOUT, 0);
  pe_tensor *ddiff = pe_kin(c, SLG_DDIFF, 0);
  if (!dx && !dy) return NULL;
  const float *x = pe_f32(xt), *y = pe_f32(pe_kin(c, SL_Y, 0));
  const float *iw = sl_opt(c, SL_IW), *ow = sl_opt(c, SL_OW);
  const float *g = dout ? pe_f32(dout) : NULL, *gd = ddiff ? pe_f32(ddiff) : NULL;
  float sigma = pe_attr_f(c->def, c->desc, "sigma"), s2 = sigma * sigma;
  int64_t n = xt->shape.d[0], row = n > 0 ? pe_tensor_numel(xt) / n : 0;
  float *dxp = dx ? pe_f32(dx) : NULL, *dyp = dy ? pe_f32(dy) : NULL;
  for (int64_t r = 0; r < n; r++)
    for (int64_t j = r * row; j < (r + 1) * row; j++) {
      float v = 0;
      if (g) {
        float h = s2 * sl_diff(x, y, iw, j);
        h = h > 1 ? 1 : h < -1 ? -1 : h;
        v = (ow ? ow[j] : 1.0f) * h * g[r];
      }
      if (gd) v += gd[j];
      if (iw) v *= iw[j];
      if (dxp) dxp[j] = v;
      if (dyp) dyp[j] = -v;
    }
  return NULL;
}

static const pe_slot_def sl_in[] = {{"X", 1, 1, 0},
                                    {"Y", 1, 1, 0},
                                    {"InsideWeight", 0, 1, PE_SLOT_NO_GRAD},
                                    {"OutsideWeight", 0, 1, PE_SLOT_NO_GRAD},
                                    {NULL}};
static const pe_slot_def sl_out[] = {{"Diff", 0, 1, 0}, {"Out", 1, 1, 0}, {NULL}};
static const pe_slot_def sl_grad_in[] = {{"X", 1, 1, 0},
                                         {"Y", 1, 1, 0},
                                         {"InsideWeight", 0, 1, 0},
                                         {"OutsideWeight", 0, 1, 0},
                                         {"Diff", 0, 1, 0},
                                         {"Out", 0, 1, 0},
                                         {"Diff" PE_GRAD_SUFFIX, 0, 1, 0},
                                         {"Out" PE_GRAD_SUFFIX, 0, 1, 0},
                                         {NULL}};
static const pe_slot_def sl_grad_out[] = {
    {"X" PE_GRAD_SUFFIX, 0, 1, 0}, {"Y" PE_GRAD_SUFFIX, 0, 1, 0}, {NULL}};
static const pe_attr_def sl_attrs[] = {{"sigma", PE_ATTR_FLOAT, false, 1.0, NULL}, {NULL}};

const pe_op_def pe_ops_smooth_l1_loss[] = {
    {.type = "smooth_l1_loss",
     .inputs = sl_in,
     .outputs = sl_out,
     .attrs = sl_attrs,
     .infer = sl_infer,
     .kernel_cpu = sl_kernel,
     .grad = pe_grad_default},
    {.type = "smooth_l1_loss_grad",
     .inputs = sl_grad_in,
     .outputs = sl_grad_out,
     .attrs = sl_attrs,
     .infer = sl_grad_infer,
     .kernel_cpu = sl_grad_kernel},
    {NULL},
};
