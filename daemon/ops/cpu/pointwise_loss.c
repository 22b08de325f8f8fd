/* Losses computed element by element over two inputs of one shape
 * (Paddle's ops and attributes), with their gradients:
 *
 *   huber_loss: X (prediction), Y (label) -> Out, Residual (opt).
 *     r = Y - X; Out = r^2 / 2 where |r| <= delta, else delta (|r| - delta/2).
 *     dX = -h'(r) dOut, dY = h'(r) dOut with h'(r) = r clamped to
 *     [-delta, delta]. The gradient recomputes r from X and Y.
 *   sigmoid_cross_entropy_with_logits: X (logits), Label (no grad) -> Out.
 *     Out = max(x, 0) - x z + log(1 + exp(-|x|)) (no overflow for any x);
 *     0 where z == ignore_index; with normalize, divided by the number of
 *     elements not ignored (at least 1e-6, Paddle's). dX = (sigmoid(x) - z)
 *     dOut, with the same mask and divisor.
 * Sums and the normaliser run in one thread in element order: the losses
 * are small next to the layers before them. */
#include <math.h>

#include "ops/op_tables.h"

enum { PL_X, PL_Y };
enum { PLG_X, PLG_Y };

/* X and the second input (Y or Label) are f32 of one shape; error names
 * the op, both variables and their shapes. */
static pe_status *pl_check(pe_infer_ctx *c, const char *second) {
  pe_meta *x = pe_in_meta(c, PL_X, 0), *y = pe_in_meta(c, PL_Y, 0);
  if (!x || !y) return pe_infer_error(c, PE_EARITY, "needs inputs X and %s", second);
  PE_TRY(pe_infer_expect_dtype(c, PL_X, 0, PE_F32));
  PE_TRY(pe_infer_expect_dtype(c, PL_Y, 0, PE_F32));
  if (!pe_shape_compatible(&x->shape, &y->shape)) {
    char sx[PE_SHAPE_STRLEN], sy[PE_SHAPE_STRLEN];
    return pe_infer_error(c, PE_ESHAPE, "input %s '%s' shape %s does not match X '%s' shape %s",
                          second, pe_in_name(c, PL_Y, 0), pe_shape_str(&y->shape, sy, sizeof sy),
                          pe_in_name(c, PL_X, 0), pe_shape_str(&x->shape, sx, sizeof sx));
  }
  return NULL;
}

/* --- huber_loss ------------------------------------------------------------------ */

enum { HB_OUT, HB_RESIDUAL };
enum { HBG_OUT = 2, HBG_RESIDUAL, HBG_DOUT };
enum { HBG_DX, HBG_DY };

static pe_status *huber_delta(pe_infer_ctx *c) {
  float delta = pe_attr_f(c->def, c->desc, "delta");
  if (!(delta > 0)) return pe_infer_error(c, PE_EATTR, "delta %g must be positive", (double)delta);
  return NULL;
}

static pe_status *huber_infer(pe_infer_ctx *c) {
  PE_TRY(pl_check(c, "Y"));
  PE_TRY(huber_delta(c));
  pe_meta *x = pe_in_meta(c, PL_X, 0);
  pe_infer_set(c, HB_OUT, PE_F32, &x->shape);
  pe_infer_set(c, HB_RESIDUAL, PE_F32, &x->shape);
  return NULL;
}

static pe_status *huber_grad_infer(pe_infer_ctx *c) {
  PE_TRY(pl_check(c, "Y"));
  PE_TRY(huber_delta(c));
  return pe_infer_grad_like_inputs(c);
}

static pe_status *huber_kernel(pe_kernel_ctx *c) {
  const float *x = pe_f32(pe_kin(c, PL_X, 0)), *y = pe_f32(pe_kin(c, PL_Y, 0));
  pe_tensor *out = pe_kout(c, HB_OUT, 0), *res = pe_kout(c, HB_RESIDUAL, 0);
  float delta = pe_attr_f(c->def, c->desc, "delta");
  float *o = pe_f32(out), *rp = res ? pe_f32(res) : NULL;
  for (int64_t i = 0, n = pe_tensor_numel(out); i < n; i++) {
    float r = y[i] - x[i], a = fabsf(r);
    o[i] = a <= delta ? 0.5f * r * r : delta * (a - 0.5f * delta);
    if (rp) rp[i] = r;
  }
  return NULL;
}

static pe_status *huber_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *dx = pe_kout(c, HBG_DX, 0), *dy = pe_kout(c, HBG_DY, 0);
  pe_tensor *dout = pe_kin(c, HBG_DOUT, 0);
  if (!dout) {
    if (dx) pe_tensor_zero(dx);
    if (dy) pe_tensor_zero(dy);
    return NULL;
  }
  const float *x = pe_f32(pe_kin(c, PLG_X, 0)), *y = pe_f32(pe_kin(c, PLG_Y, 0));
  const float *g = pe_f32(dout);
  float delta = pe_attr_f(c->def, c->desc, "delta");
  float *dxp = dx ? pe_f32(dx) : NULL, *dyp = dy ? pe_f32(dy) : NULL;
  for (int64_t i = 0, n = pe_tensor_numel(dout); i < n; i++) {
    float r = y[i] - x[i];
    float h = r > delta ? delta : r < -delta ? -delta : r;
    if (dxp) dxp[i] = -h * g[i];
    if (dyp) dyp[i] = h * g[i];
  }
  return NULL;
}

/* --- sigmoid_cross_entropy_with_logits ------------------------------------------- */

enum { SCE_OUT };
enum { SCEG_OUT = 2, SCEG_DOUT };
enum { SCEG_DX };

static pe_status *sce_infer(pe_infer_ctx *c) {
  PE_TRY(pl_check(c, "Label"));
  pe_infer_set(c, SCE_OUT, PE_F32, &pe_in_meta(c, PL_X, 0)->shape);
  return NULL;
}

static pe_status *sce_grad_infer(pe_infer_ctx *c) {
  PE_TRY(pl_check(c, "Label"));
  return pe_infer_grad_like_inputs(c);
}

/* 1, or with normalize 1 / the number of labels that are not
 * ignore_index (the count at least 1e-6, Paddle's). */
static float sce_scale(const pe_kernel_ctx *c, const float *z, int64_t n) {
  if (!pe_attr_b(c->def, c->desc, "normalize")) return 1.0f;
  float ignore = (float)pe_attr_i(c->def, c->desc, "ignore_index");
  int64_t kept = 0;
  for (int64_t i = 0; i < n; i++) kept += z[i] != ignore;
  return 1.0f / fmaxf((float)kept, 1e-6f);
}

static pe_status *sce_kernel(pe_kernel_ctx *c) {
  pe_tensor *xt = pe_kin(c, PL_X, 0), *out = pe_kout(c, SCE_OUT, 0);
  const float *x = pe_f32(xt), *z = pe_f32(pe_kin(c, PL_Y, 0));
  int64_t n = pe_tensor_numel(xt);
  float ignore = (float)pe_attr_i(c->def, c->desc, "ignore_index"), k = sce_scale(c, z, n);
  float *o = pe_f32(out);
  for (int64_t i = 0; i < n; i++) {
    float v = fmaxf(x[i], 0.0f) - x[i] * z[i] + log1pf(expf(-fabsf(x[i])));
    o[i] = z[i] == ignore ? 0.0f : v * k;
  }
  return NULL;
}

static pe_status *sce_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *dx = pe_kout(c, SCEG_DX, 0), *dout = pe_kin(c, SCEG_DOUT, 0);
  if (!dx) return NULL;
  if (!dout) {
    pe_tensor_zero(dx);
    return NULL;
  }
  const float *x = pe_f32(pe_kin(c, PLG_X, 0)), *z = pe_f32(pe_kin(c, PLG_Y, 0));
  const float *g = pe_f32(dout);
  int64_t n = pe_tensor_numel(dx);
  float ignore = (float)pe_attr_i(c->def, c->desc, "ignore_index"), k = sce_scale(c, z, n);
  float *d = pe_f32(dx);
  for (int64_t i = 0; i < n; i++) {
    float s = 1.0f / (1.0f + expf(-x[i]));
    d[i] = z[i] == ignore ? 0.0f : (s - z[i]) * g[i] * k;
  }
  return NULL;
}

/* --- rows ------------------------------------------------------------------------ */

static const pe_slot_def hb_in[] = {{"X", 1, 1, 0}, {"Y", 1, 1, 0}, {NULL}};
static const pe_slot_def hb_out[] = {{"Out", 1, 1, 0}, {"Residual", 0, 1, 0}, {NULL}};
static const pe_slot_def hb_grad_in[] = {{"X", 1, 1, 0},
                                         {"Y", 1, 1, 0},
                                         {"Out", 0, 1, 0},
                                         {"Residual", 0, 1, 0},
                                         {"Out" PE_GRAD_SUFFIX, 0, 1, 0},
                                         {"Residual" PE_GRAD_SUFFIX, 0, 1, 0},
                                         {NULL}};
static const pe_slot_def hb_grad_out[] = {
    {"X" PE_GRAD_SUFFIX, 0, 1, 0}, {"Y" PE_GRAD_SUFFIX, 0, 1, 0}, {NULL}};
static const pe_attr_def hb_attrs[] = {{"delta", PE_ATTR_FLOAT, false, 1.0, NULL}, {NULL}};

static const pe_slot_def sce_in[] = {{"X", 1, 1, 0}, {"Label", 1, 1, PE_SLOT_NO_GRAD}, {NULL}};
static const pe_slot_def sce_out[] = {{"Out", 1, 1, 0}, {NULL}};
static const pe_slot_def sce_grad_in[] = {
    {"X", 1, 1, 0}, {"Label", 1, 1, 0}, {"Out", 0, 1, 0}, {"Out" PE_GRAD_SUFFIX, 0, 1, 0}, {NULL}};
static const pe_slot_def sce_grad_out[] = {{"X" PE_GRAD_SUFFIX, 0, 1, 0}, {NULL}};
static const pe_attr_def sce_attrs[] = {{"normalize", PE_ATTR_BOOL, false, 0, NULL},
                                        {"ignore_index", PE_ATTR_INT, false, -100, NULL},
                                        {NULL}};

const pe_op_def pe_ops_pointwise_loss[] = {
    {.type = "huber_loss",
     .inputs = hb_in,
     .outputs = hb_out,
     .attrs = hb_attrs,
     .infer = huber_infer,
     .kernel_cpu = huber_kernel,
     .grad = pe_grad_default},
    {.type = "huber_loss_grad",
     .inputs = hb_grad_in,
     .outputs = hb_grad_out,
     .attrs = hb_attrs,
     .infer = huber_grad_infer,
     .kernel_cpu = huber_grad_kernel},
    {.type = "sigmoid_cross_entropy_with_logits",
     .inputs = sce_in,
     .outputs = sce_out,
     .attrs = sce_attrs,
     .infer = sce_infer,
     .kernel_cpu = sce_kernel,
     .grad = pe_grad_default},
    {.type = "sigmoid_cross_entropy_with_logits_grad",
     .inputs = sce_grad_in,
     .outputs = sce_grad_out,
     .attrs = sce_attrs,
     .infer = sce_grad_infer,
     .kernel_cpu = sce_grad_kernel},
    {NULL},
};
