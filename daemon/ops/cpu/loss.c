/* Losses: softmax_with_cross_entropy, cross_entropy, mean and their
 * gradients (docs/ops.md, "activations and losses"). Hand-written f32 kernels;
 * rows are independent, so they split across threads without changing any
 * result.
 *
 * Classes are the last dim: X [..., C] is processed as rows x C. Hard labels
 * are i64 [..., 1] and are checked against [0, C) before anything is written
 * (a bad label is an input error, never an out-of-bounds access); soft labels
 * are f32 [..., C]. */
#include <math.h>
#include <string.h>

#include "ops/cpu/broadcast.h"
#include "ops/cpu/par_min.h"
#include "ops/op_tables.h"

enum { SX_LOGITS, SX_LABEL, SX_SOFTMAX_IN, SX_LOSS_IN, SX_DSOFTMAX, SX_DLOSS }; /* grad inputs */
enum { SX_SOFTMAX, SX_LOSS };            /* forward outputs */
enum { CE_X, CE_LABEL, CE_Y_IN, CE_DY }; /* grad inputs */
enum { MEAN_X, MEAN_OUT_IN, MEAN_DOUT }; /* grad inputs */

/* cross_entropy clamps probabilities here before the log. */
#define CE_MIN_PROB 1e-20f

/* --- shapes ------------------------------------------------------------------------ */

/* X [..., C] with Label [..., 1] (i64) or [..., C] (f32, soft): loss shape
 * [..., 1]. -1 (batch) dims match anything. */
static pe_status *label_loss_shape(pe_infer_ctx *c, int xs, int ls, bool soft, pe_shape *loss) {
  pe_meta *x = pe_in_meta(c, xs, 0), *l = pe_in_meta(c, ls, 0);
  const char *xn = c->def->inputs[xs].name, *ln = c->def->inputs[ls].name;
  if (!x || !l) return pe_infer_error(c, PE_EARITY, "needs inputs %s and %s", xn, ln);
  PE_TRY(pe_infer_expect_dtype(c, xs, 0, PE_F32));
  PE_TRY(pe_infer_expect_dtype(c, ls, 0, soft ? PE_F32 : PE_I64));
  char a[PE_SHAPE_STRLEN], b[PE_SHAPE_STRLEN];
  if (x->shape.ndim < 1)
    return pe_infer_error(c, PE_ESHAPE, "%s '%s' %s needs a class dim", xn, pe_in_name(c, xs, 0),
                          pe_shape_str(&x->shape, a, sizeof a));
  pe_shape want = x->shape;
  if (!soft) want.d[want.ndim - 1] = 1;
  if (!pe_shape_compatible(&want, &l->shape))
    return pe_infer_error(c, PE_ESHAPE, "%s '%s' %s does not fit %s '%s' %s (expected %s)", ln,
                          pe_in_name(c, ls, 0), pe_shape_str(&l->shape, a, sizeof a), xn,
                          pe_in_name(c, xs, 0), pe_shape_str(&x->shape, b, sizeof b),
                          soft ? "the same shape, soft labels" : "[...,1] hard labels");
  *loss = x->shape;
  loss->d[loss->ndim - 1] = 1;
  for (int d = 0; d + 1 < loss->ndim; d++)
    if (loss->d[d] < 0) loss->d[d] = l->shape.d[d]; /* a known label dim refines -1 */
  return NULL;
}

static pe_status *check_last_axis(pe_infer_ctx *c) {
  pe_meta *x = pe_in_meta(c, SX_LOGITS, 0);
  int64_t axis = pe_attr_i(c->def, c->desc, "axis");
  int nd = x ? x->shape.ndim : 0;
  if (axis != -1 && axis != nd - 1)
    return pe_infer_error(c, PE_EATTR, "axis %lld: only the last axis (-1 or %d) is supported",
                          (long long)axis, nd - 1);
  return NULL;
}

static pe_status *swce_infer(pe_infer_ctx *c) {
  PE_TRY(check_last_axis(c));
  pe_shape loss;
  PE_TRY(label_loss_shape(c, SX_LOGITS, SX_LABEL, pe_attr_b(c->def, c->desc, "soft_label"), &loss));
  pe_infer_set(c, SX_SOFTMAX, PE_F32, &pe_in_meta(c, SX_LOGITS, 0)->shape);
  pe_infer_set(c, SX_LOSS, PE_F32, &loss);
  return NULL;
}

static pe_status *swce_grad_infer(pe_infer_ctx *c) {
  PE_TRY(check_last_axis(c));
  pe_shape loss;
  PE_TRY(label_loss_shape(c, SX_LOGITS, SX_LABEL, pe_attr_b(c->def, c->desc, "soft_label"), &loss));
  return pe_infer_grad_like_inputs(c);
}

static pe_status *ce_infer(pe_infer_ctx *c) {
  pe_shape loss;
  PE_TRY(label_loss_shape(c, CE_X, CE_LABEL, pe_attr_b(c->def, c->desc, "soft_label"), &loss));
  pe_infer_set(c, 0, PE_F32, &loss);
  return NULL;
}

static pe_status *ce_grad_infer(pe_infer_ctx *c) {
  pe_shape loss;
  PE_TRY(label_loss_shape(c, CE_X, CE_LABEL, pe_attr_b(c->def, c->desc, "soft_label"), &loss));
  return pe_infer_grad_like_inputs(c);
}

/* Every hard label in [0, C); the error names the variable, the row (in
 * the batch fed, not this place's shard of it) and the value. */
static pe_status *check_labels(pe_kernel_ctx *c, int ls, int64_t rows, int64_t classes) {
  const int64_t *lab = pe_i64(pe_kin(c, ls, 0));
  for (int64_t r = 0; r < rows; r++)
    if (lab[r] < 0 || lab[r] >= classes) {
      const char *name = pe_op_input_arg(c->desc, c->def->inputs[ls].name);
      return pe_kernel_error(c, PE_EINVAL, "%s '%s' row %lld has value %lld, outside [0, %lld)",
                             c->def->inputs[ls].name, name ? name : "?",
                             (long long)(c->batch_row0 + r), (long long)lab[r], (long long)classes);
    }
  return NULL;
}

/* --- softmax_with_cross_entropy --------------------------------------------------- */

/* One row: s = softmax(x) and the loss, via log-sum-exp around the row max so
 * that large logits never overflow. */
static float swce_row(const float *x, float *s, int64_t C, int64_t label, const float *soft) {
  float m = x[0];
#pragma omp simd reduction(max : m)
  for (int64_t j = 1; j < C; j++) m = x[j] > m ? x[j] : m;
  for (int64_t j = 0; j < C; j++) s[j] = expf(x[j] - m);
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < C; j++) sum += s[j];
  float inv = (float)(1.0 / sum);
  for (int64_t j = 0; j < C; j++) s[j] *= inv;
  double log_sum = log(sum); /* loss_j = log_sum - (x_j - m) */
  if (!soft) return (float)(log_sum - (double)(x[label] - m));
  double loss = 0;
  for (int64_t j = 0; j < C; j++) loss += soft[j] * (log_sum - (double)(x[j] - m));
  return (float)loss;
}

static pe_status *swce_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, SX_LOGITS, 0), *lab = pe_kin(c, SX_LABEL, 0);
  bool soft = pe_attr_b(c->def, c->desc, "soft_label");
  int64_t n = pe_tensor_numel(x), C = x->shape.d[x->shape.ndim - 1];
  if (n == 0 || C == 0) return NULL;
  int64_t rows = n / C;
  if (!soft) PE_TRY(check_labels(c, SX_LABEL, rows, C));
  const float *px = pe_f32(x);
  float *ps = pe_f32(pe_kout(c, SX_SOFTMAX, 0)), *pl = pe_f32(pe_kout(c, SX_LOSS, 0));
#pragma omp parallel for if (pe_par_split(n)) num_threads(pe_kernel_threads(c)) schedule(static)
  for (int64_t r = 0; r < rows; r++)
    pl[r] = swce_row(px + r * C, ps + r * C, C, soft ? 0 : pe_i64(lab)[r],
                     soft ? pe_f32(lab) + r * C : NULL);
  return NULL;
}

/* Logits@GRAD = (Softmax - label) * Loss@GRAD (soft: Softmax*sum(label) -
 * label, the exact form when a row of labels does not sum to 1), plus the
 * softmax backward of Softmax@GRAD when the Softmax output is used too. */
static pe_status *swce_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *dx = pe_kout(c, 0, 0);
  if (!dx) return NULL;
  pe_tensor *lab = pe_kin(c, SX_LABEL, 0), *sm = pe_kin(c, SX_SOFTMAX_IN, 0);
  pe_tensor *dloss = pe_kin(c, SX_DLOSS, 0), *dsm = pe_kin(c, SX_DSOFTMAX, 0);
  bool soft = pe_attr_b(c->def, c->desc, "soft_label");
  int64_t n = pe_tensor_numel(dx), C = dx->shape.d[dx->shape.ndim - 1];
  if (n == 0 || C == 0) return NULL;
  if (!sm || pe_tensor_numel(sm) != n)
    return pe_kernel_error(c, PE_EINVAL, "needs the forward Softmax output with %lld elements",
                           (long long)n);
  int64_t rows = n / C;
  const float *s = pe_f32(sm), *gl = dloss ? pe_f32(dloss) : NULL, *gs = dsm ? pe_f32(dsm) : NULL;
  float *g = pe_f32(dx);
#pragma omp parallel for if (pe_par_split(n)) num_threads(pe_kernel_threads(c)) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const float *sr = s + r * C;
    float *gr = g + r * C;
    float w = gl ? gl[r] : 0.0f;
    if (soft) {
      const float *lr = pe_f32(lab) + r * C;
      double lsum = 0;
      for (int64_t j = 0; j < C; j++) lsum += lr[j];
      for (int64_t j = 0; j < C; j++) gr[j] = w * (sr[j] * (float)lsum - lr[j]);
    } else {
      int64_t l = pe_i64(lab)[r];
      for (int64_t j = 0; j < C; j++) gr[j] = w * sr[j];
      if (l >= 0 && l < C) gr[l] -= w; /* range was checked in the forward run */
    }
    if (gs) {
      const float *dr = gs + r * C;
      double dot = 0;
      for (int64_t j = 0; j < C; j++) dot += (double)dr[j] * sr[j];
      for (int64_t j = 0; j < C; j++) gr[j] += sr[j] * (dr[j] - (float)dot);
    }
  }
  return NULL;
}

/* --- cross_entropy -------------------------------------------------------------------- */

static pe_status *ce_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, CE_X, 0), *lab = pe_kin(c, CE_LABEL, 0);
  bool soft = pe_attr_b(c->def, c->desc, "soft_label");
  int64_t n = pe_tensor_numel(x), C = x->shape.d[x->shape.ndim - 1];
  if (n == 0 || C == 0) return NULL;
  int64_t rows = n / C;
  if (!soft) PE_TRY(check_labels(c, CE_LABEL, rows, C));
  const float *px = pe_f32(x);
  float *y = pe_f32(pe_kout(c, 0, 0));
#pragma omp parallel for if (pe_par_split(n)) num_threads(pe_kernel_threads(c)) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = px + r * C;
    if (!soft) {
      y[r] = -logf(fmaxf(xr[pe_i64(lab)[r]], CE_MIN_PROB));
      continue;
    }
    const float *lr = pe_f32(lab) + r * C;
    double acc = 0;
    for (int64_t j = 0; j < C; j++) acc -= lr[j] * log(fmaxf(xr[j], CE_MIN_PROB));
    y[r] = (float)acc;
  }
  return NULL;
}

/* X@GRAD = -label / X * Y@GRAD where X is above the clamp, 0 where clamped. */
static pe_status *ce_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *dx = pe_kout(c, 0, 0);
  if (!dx) return NULL;
  pe_tensor *x = pe_kin(c, CE_X, 0), *lab = pe_kin(c, CE_LABEL, 0), *dy = pe_kin(c, CE_DY, 0);
  bool soft = pe_attr_b(c->def, c->desc, "soft_label");
  int64_t n = pe_tensor_numel(x), C = x->shape.d[x->shape.ndim - 1];
  pe_tensor_zero(dx);
  if (!dy || n == 0 || C == 0) return NULL;
  int64_t rows = n / C;
  if (!soft) PE_TRY(check_labels(c, CE_LABEL, rows, C));
  const float *px = pe_f32(x), *g = pe_f32(dy);
  float *gx = pe_f32(dx);
#pragma omp parallel for if (pe_par_split(n)) num_threads(pe_kernel_threads(c)) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = px + r * C;
    float *gr = gx + r * C;
    if (!soft) {
      int64_t l = pe_i64(lab)[r];
      if (xr[l] > CE_MIN_PROB) gr[l] = -g[r] / xr[l];
      continue;
    }
    const float *lr = pe_f32(lab) + r * C;
    for (int64_t j = 0; j < C; j++)
      if (xr[j] > CE_MIN_PROB) gr[j] = -g[r] * lr[j] / xr[j];
  }
  return NULL;
}

/* --- mean ------------------------------------------------------------------------------------ */

static pe_status *mean_infer(pe_infer_ctx *c) {
  if (!pe_in_meta(c, MEAN_X, 0)) return pe_infer_error(c, PE_EARITY, "needs input X");
  PE_TRY(pe_infer_expect_dtype(c, MEAN_X, 0, PE_F32));
  pe_shape one = PE_SHAPE(1);
  pe_infer_set(c, 0, PE_F32, &one);
  return NULL;
}

static pe_status *mean_grad_infer(pe_infer_ctx *c) {
  PE_TRY(pe_infer_expect_dtype(c, MEAN_X, 0, PE_F32));
  return pe_infer_grad_like_inputs(c);
}

static pe_status *mean_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, MEAN_X, 0);
  int64_t n = pe_tensor_numel(x);
  double s = pe_sum_f32(pe_f32(x), n, pe_kernel_threads(c));
  pe_f32(pe_kout(c, 0, 0))[0] = n ? (float)(s / (double)n) : NAN;
  return NULL;
}

static pe_status *mean_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *dx = pe_kout(c, 0, 0), *dout = pe_kin(c, MEAN_DOUT, 0);
  if (!dx) return NULL;
  int64_t n = pe_tensor_numel(dx);
  float v = dout && n ? (float)(pe_f32(dout)[0] / (double)n) : 0.0f;
  float *g = pe_f32(dx);
#pragma omp parallel for if (pe_par_split(n)) num_threads(pe_kernel_threads(c)) schedule(static)
  for (int64_t i = 0; i < n; i++) g[i] = v;
  return NULL;
}

/* --- table ------------------------------------------------------------------------------- */

static const pe_slot_def swce_in[] = {{"Logits", 1, 1}, {"Label", 1, 1, PE_SLOT_NO_GRAD}, {NULL}};
static const pe_slot_def swce_out[] = {{"Softmax", 1, 1}, {"Loss", 1, 1}, {NULL}};
static const pe_slot_def swce_grad_in[] = {{"Logits", 1, 1},
                                           {"Label", 1, 1},
                                           {"Softmax", 1, 1},
                                           {"Loss", 0, 1},
                                           {"Softmax" PE_GRAD_SUFFIX, 0, 1},
                                           {"Loss" PE_GRAD_SUFFIX, 0, 1},
                                           {NULL}};
static const pe_slot_def swce_grad_out[] = {{"Logits" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
static const pe_attr_def swce_attrs[] = {
    {"soft_label", PE_ATTR_BOOL, false, 0}, {"axis", PE_ATTR_INT, false, -1}, {NULL}};

static const pe_slot_def ce_in[] = {{"X", 1, 1}, {"Label", 1, 1, PE_SLOT_NO_GRAD}, {NULL}};
static const pe_slot_def ce_out[] = {{"Y", 1, 1}, {NULL}};
static const pe_slot_def ce_grad_in[] = {
    {"X", 1, 1}, {"Label", 1, 1}, {"Y", 0, 1}, {"Y" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
static const pe_slot_def x_grad_out[] = {{"X" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
static const pe_attr_def ce_attrs[] = {{"soft_label", PE_ATTR_BOOL, false, 0}, {NULL}};

static const pe_slot_def mean_in[] = {{"X", 1, 1}, {NULL}};
static const pe_slot_def mean_out[] = {{"Out", 1, 1}, {NULL}};
static const pe_slot_def mean_grad_in[] = {
    {"X", 1, 1}, {"Out", 0, 1}, {"Out" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
static const pe_attr_def no_attrs[] = {{NULL}};

const pe_op_def pe_ops_loss[] = {
    {.type = "softmax_with_cross_entropy",
     .inputs = swce_in,
     .outputs = swce_out,
     .attrs = swce_attrs,
     .infer = swce_infer,
     .kernel_cpu = swce_kernel,
     .grad = pe_grad_default},
    {.type = "softmax_with_cross_entropy_grad",
     .inputs = swce_grad_in,
     .outputs = swce_grad_out,
     .attrs = swce_attrs,
     .infer = swce_grad_infer,
     .kernel_cpu = swce_grad_kernel},
    {.type = "cross_entropy",
     .inputs = ce_in,
     .outputs = ce_out,
     .attrs = ce_attrs,
     .infer = ce_infer,
     .kernel_cpu = ce_kernel,
     .grad = pe_grad_default},
    {.type = "cross_entropy_grad",
     .inputs = ce_grad_in,
     .outputs = x_grad_out,
     .attrs = ce_attrs,
     .infer = ce_grad_infer,
     .kernel_cpu = ce_grad_kernel},
    {.type = "mean",
     .inputs = mean_in,
     .outputs = mean_out,
     .attrs = no_attrs,
     .infer = mean_infer,
     .kernel_cpu = mean_kernel,
     .grad = pe_grad_default},
    {.type = "mean_grad",
     .inputs = mean_grad_in,
     .outputs = x_grad_out,
     .attrs = no_attrs,
     .infer = mean_grad_infer,
     .kernel_cpu = mean_grad_kernel},
    {NULL},
};
