/* layer_norm (Paddle's) and its gradient, on oneDNN layer normalization.
 *
 * X is viewed as [left, right] with left = prod(dims[:begin_norm_axis]):
 * each row is normalized over its `right` elements, then scaled by Scale
 * [right] and shifted by Bias [right] (both optional). Mean and Variance
 * [left] are the rows' statistics (the variance, not its inverse root), as
 * Paddle writes them; the gradient reads them instead of recomputing.
 * oneDNN's primitive normalizes over the last dim of a 2-D plain desc,
 * which is the same memory. No gradient flows through Mean and Variance
 * (Paddle's rule): their @GRAD inputs are accepted and ignored. */
#include "ops/cpu/dnnl_util.h"
#include "ops/op_tables.h"

enum { LN_X, LN_SCALE, LN_BIAS };
enum { LN_Y, LN_MEAN, LN_VAR };
enum { LNG_X, LNG_SCALE, LNG_BIAS, LNG_Y, LNG_MEAN, LNG_VAR, LNG_DY, LNG_DMEAN, LNG_DVAR };
enum { LNG_DX, LNG_DSCALE, LNG_DBIAS };

/* Checks X, begin_norm_axis, Scale and Bias; *left / *right (-1: unknown). */
static pe_status *ln_check(pe_infer_ctx *c, int64_t *left, int64_t *right) {
  PE_TRY(pe_dnnl_infer_f32(c));
  pe_meta *x = pe_in_meta(c, LN_X, 0);
  if (!x) return pe_infer_error(c, PE_EARITY, "needs input X");
  int64_t axis = pe_attr_i(c->def, c->desc, "begin_norm_axis");
  char sb[PE_SHAPE_STRLEN], sb2[PE_SHAPE_STRLEN];
  if (axis < 1 || axis >= x->shape.ndim)
    return pe_infer_error(c, PE_EATTR, "begin_norm_axis %lld is outside [1, %d) for X '%s' %s",
                          (long long)axis, x->shape.ndim, pe_in_name(c, LN_X, 0),
                          pe_shape_str(&x->shape, sb, sizeof sb));
  float eps = pe_attr_f(c->def, c->desc, "epsilon");
  if (!(eps >= 0.0f && eps < 1.0f))
    return pe_infer_error(c, PE_EATTR, "epsilon %g is outside [0, 1)", (double)eps);
  *left = pe_shape_prod(&x->shape, 0, (int)axis);
  *right = pe_shape_prod(&x->shape, (int)axis, x->shape.ndim);
  const int slots[] = {LN_SCALE, LN_BIAS};
  for (int i = 0; i < 2; i++) {
    pe_meta *p = pe_in_meta(c, slots[i], 0);
    if (!p) continue;
    if (p->shape.ndim != 1 || (*right >= 0 && p->shape.d[0] >= 0 && p->shape.d[0] != *right))
      return pe_infer_error(
          c, PE_ESHAPE, "input %s '%s' %s must be [%lld], the size of X '%s' %s from dim %lld",
          c->def->inputs[slots[i]].name, pe_in_name(c, slots[i], 0),
          pe_shape_str(&p->shape, sb, sizeof sb), (long long)*right, pe_in_name(c, LN_X, 0),
          pe_shape_str(&x->shape, sb2, sizeof sb2), (long long)axis);
  }
  return NULL;
}

static pe_status *ln_infer(pe_infer_ctx *c) {
  int64_t left, right;
  PE_TRY(ln_check(c, &left, &right));
  pe_infer_set(c, LN_Y, PE_F32, &pe_in_meta(c, LN_X, 0)->shape);
  pe_shape st = PE_SHAPE(left);
  pe_infer_set(c, LN_MEAN, PE_F32, &st);
  pe_infer_set(c, LN_VAR, PE_F32, &st);
  return NULL;
}

static pe_status *ln_grad_infer(pe_infer_ctx *c) {
  int64_t left, right;
  PE_TRY(ln_check(c, &left, &right));
  return pe_infer_grad_like_inputs(c);
}

static unsigned ln_flags(bool scale, bool bias) {
  return (scale ? dnnl_use_scale : 0u) | (bias ? dnnl_use_shift : 0u);
}

static pe_status *ln_fwd_pd(pe_kernel_ctx *c, const int64_t v[2], unsigned flags,
                            dnnl_primitive_desc_t *pd) {
  dnnl_memory_desc_t data, stat;
  dnnl_layer_normalization_desc_t d;
  dnnl_status_t s = pe_dnnl_md_plain(&data, 2, v);
  if (s == dnnl_success) s = pe_dnnl_md_plain(&stat, 1, v);
  if (s == dnnl_success)
    s = dnnl_layer_normalization_forward_desc_init(&d, dnnl_forward_training, &data, &stat,
                                                   pe_attr_f(c->def, c->desc, "epsilon"), flags);
  PE_TRY(pe_dnnl_check(s, c, "layer normalization forward desc"));
  return pe_dnnl_pd(c, &d, NULL, "layer normalization forward primitive desc", pd);
}

static pe_status *ln_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, LN_X, 0), *scale = pe_kin(c, LN_SCALE, 0), *bias = pe_kin(c, LN_BIAS, 0);
  pe_tensor *y = pe_kout(c, LN_Y, 0), *mean = pe_kout(c, LN_MEAN, 0), *var = pe_kout(c, LN_VAR, 0);
  int64_t axis = pe_attr_i(c->def, c->desc, "begin_norm_axis");
  int64_t v[2] = {pe_shape_prod(&x->shape, 0, (int)axis),
                  pe_shape_prod(&x->shape, (int)axis, x->shape.ndim)};
  if (v[0] == 0 || v[1] == 0) return NULL;
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(pe_dnnl_cache_lookup(c, v, 2, &e, &fresh));
  if (fresh) {
    dnnl_primitive_desc_t pd;
    pe_status *st = ln_fwd_pd(c, v, ln_flags(scale, bias), &pd);
    if (!st) {
      int args[6] = {DNNL_ARG_SRC, DNNL_ARG_DST, DNNL_ARG_MEAN, DNNL_ARG_VARIANCE};
      int n = 4;
      if (scale) args[n++] = DNNL_ARG_SCALE;
      if (bias) args[n++] = DNNL_ARG_SHIFT;
      pe_dnnl_prim *p;
      st = pe_dnnl_entry_add(c, e, pd, args, n, "layer normalization forward", &p);
      dnnl_primitive_desc_destroy(pd);
    }
    PE_TRY(pe_dnnl_cache_built(c, e, st));
  }
  void *h[6] = {x->data, y->data, mean->data, var->data};
  int n = 4;
  if (scale) h[n++] = scale->data;
  if (bias) h[n++] = bias->data;
  return pe_dnnl_run(c, &e->prims[0], h, "layer_norm");
}

/* The backward primitive; a pruned X@GRAD, Scale@GRAD or Bias@GRAD goes to
 * an entry buffer (bufs[0], [1], [2] in that order, when needed). */
static pe_status *ln_grad_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const int64_t v[2], bool scale,
                                bool bias) {
  unsigned flags = ln_flags(scale, bias);
  dnnl_primitive_desc_t hint, pd;
  PE_TRY(ln_fwd_pd(c, v, flags, &hint));
  dnnl_memory_desc_t data, stat;
  dnnl_layer_normalization_desc_t d;
  dnnl_status_t s = pe_dnnl_md_plain(&data, 2, v);
  if (s == dnnl_success) s = pe_dnnl_md_plain(&stat, 1, v);
  if (s == dnnl_success)
    s = dnnl_layer_normalization_backward_desc_init(&d, flags ? dnnl_backward : dnnl_backward_data,
                                                    &data, &data, &stat,
                                                    pe_attr_f(c->def, c->desc, "epsilon"), flags);
  pe_status *st = pe_dnnl_check(s, c, "layer normalization backward desc");
  if (!st) st = pe_dnnl_pd(c, &d, hint, "layer normalization backward primitive desc", &pd);
  dnnl_primitive_desc_destroy(hint);
  if (st) return st;
  int args[9] = {DNNL_ARG_SRC, DNNL_ARG_MEAN, DNNL_ARG_VARIANCE, DNNL_ARG_DIFF_DST,
                 DNNL_ARG_DIFF_SRC};
  int n = 5;
  /* oneDNN's backward takes the shift too (unread: the gradient does not
   * depend on it). */
  if (scale) args[n++] = DNNL_ARG_SCALE;
  if (scale) args[n++] = DNNL_ARG_DIFF_SCALE;
  if (bias) args[n++] = DNNL_ARG_SHIFT;
  if (bias) args[n++] = DNNL_ARG_DIFF_SHIFT;
  pe_dnnl_prim *p;
  st = pe_dnnl_entry_add(c, e, pd, args, n, "layer normalization backward", &p);
  dnnl_primitive_desc_destroy(pd);
  void *buf;
  if (!st) st = pe_dnnl_entry_buffer(c, e, (size_t)(v[0] * v[1]) * sizeof(float), &buf);
  if (!st) st = pe_dnnl_entry_buffer(c, e, (size_t)v[1] * sizeof(float), &buf);
  if (!st) st = pe_dnnl_entry_buffer(c, e, (size_t)v[1] * sizeof(float), &buf);
  return st;
}

static void *data_or(pe_tensor *t, void *buf) {
  return t ? t->data : buf;
}

static pe_status *ln_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, LNG_X, 0), *scale = pe_kin(c, LNG_SCALE, 0);
  pe_tensor *bias = pe_kin(c, LNG_BIAS, 0), *dy = pe_kin(c, LNG_DY, 0);
  pe_tensor *mean = pe_kin(c, LNG_MEAN, 0), *var = pe_kin(c, LNG_VAR, 0);
  pe_tensor *dx = pe_kout(c, LNG_DX, 0), *dscale = pe_kout(c, LNG_DSCALE, 0);
  pe_tensor *dbias = pe_kout(c, LNG_DBIAS, 0);
  if (!dy) {
    pe_dnnl_zero_outputs(c);
    return NULL;
  }
  int64_t axis = pe_attr_i(c->def, c->desc, "begin_norm_axis");
  int64_t v[2] = {pe_shape_prod(&x->shape, 0, (int)axis),
                  pe_shape_prod(&x->shape, (int)axis, x->shape.ndim)};
  char sb[PE_SHAPE_STRLEN];
  if (pe_tensor_numel(mean) != v[0] || pe_tensor_numel(var) != v[0] ||
      pe_tensor_numel(dy) != v[0] * v[1])
    return pe_kernel_error(c, PE_ESHAPE,
                           "inputs Mean, Variance (%lld, %lld elements) and Y@GRAD (%lld) do not "
                           "match X %s at begin_norm_axis %lld",
                           (long long)pe_tensor_numel(mean), (long long)pe_tensor_numel(var),
                           (long long)pe_tensor_numel(dy), pe_shape_str(&x->shape, sb, sizeof sb),
                           (long long)axis);
  if (v[0] == 0 || v[1] == 0) {
    pe_dnnl_zero_outputs(c);
    return NULL;
  }
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(pe_dnnl_cache_lookup(c, v, 2, &e, &fresh));
  if (fresh) PE_TRY(pe_dnnl_cache_built(c, e, ln_grad_build(c, e, v, scale, bias)));
  void *h[9] = {x->data, mean->data, var->data, dy->data, data_or(dx, e->bufs[0])};
  int n = 5;
  if (scale) h[n++] = scale->data;
  if (scale) h[n++] = data_or(dscale, e->bufs[1]);
  if (bias) h[n++] = bias->data;
  if (bias) h[n++] = data_or(dbias, e->bufs[2]);
  return pe_dnnl_run(c, &e->prims[0], h, "layer_norm_grad");
}

/* --- rows ---------------------------------------------------------------------- */

static const pe_slot_def ln_in[] = {{"X", 1, 1}, {"Scale", 0, 1}, {"Bias", 0, 1}, {NULL}};
static const pe_slot_def ln_out[] = {{"Y", 1, 1}, {"Mean", 1, 1}, {"Variance", 1, 1}, {NULL}};
static const pe_slot_def ln_grad_in[] = {{"X", 1, 1},
                                         {"Scale", 0, 1},
                                         {"Bias", 0, 1},
                                         {"Y", 0, 1},
                                         {"Mean", 1, 1},
                                         {"Variance", 1, 1},
                                         {"Y" PE_GRAD_SUFFIX, 0, 1},
                                         {"Mean" PE_GRAD_SUFFIX, 0, 1},
                                         {"Variance" PE_GRAD_SUFFIX, 0, 1},
                                         {NULL}};
static const pe_slot_def ln_grad_out[] = {{"X" PE_GRAD_SUFFIX, 0, 1},
                                          {"Scale" PE_GRAD_SUFFIX, 0, 1},
                                          {"Bias" PE_GRAD_SUFFIX, 0, 1},
                                          {NULL}};
static const pe_attr_def ln_attrs[] = {
    {"epsilon", PE_ATTR_FLOAT, false, 1e-5}, {"begin_norm_axis", PE_ATTR_INT, false, 1}, {NULL}};

const pe_op_def pe_ops_layer_norm[] = {
    {.type = "layer_norm",
     .inputs = ln_in,
     .outputs = ln_out,
     .attrs = ln_attrs,
     .infer = ln_infer,
     .kernel_cpu = ln_kernel,
     .state_free = pe_dnnl_cache_free,
     .grad = pe_grad_default},
    {.type = "layer_norm_grad",
     .inputs = ln_grad_in,
     .outputs = ln_grad_out,
     .attrs = ln_attrs,
     .infer = ln_grad_infer,
     .kernel_cpu = ln_grad_kernel,
     .state_free = pe_dnnl_cache_free},
    {NULL},
};
