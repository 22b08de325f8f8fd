/* The layer calls of the program builder (see pe_builder.h): each checks its
 * arguments against the declared input shapes, declares every variable it
 * creates with dtype and shape, and emits ops per docs/ops.md. */
#include <stdio.h>
#include <string.h>

#include "builder_internal.h"

/* --- public: layers --------------------------------------------------------------------- */

/* Apply act to `x` as the last op of layer `layer`; output named out. */
static const char *act_into(pe_builder *b, const char *x, pe_b_act act, const char *out) {
  static const char *const names[] = {NULL, "relu", "tanh", "sigmoid", "softmax"};
  if (b->err) return NULL;
  if ((int)act <= PE_B_ACT_NONE || act > PE_B_ACT_SOFTMAX) {
    peb_fail(b, "activation: unknown kind %d", (int)act);
    return NULL;
  }
  b_var *xv = peb_var_find(&b->main, x);
  b_var *o = peb_tmp_var(b, out, xv->dtype, xv->ndim, xv->d);
  b_op *op = peb_op_add(b, &b->main, names[act]);
  peb_op_in(b, op, "X", x);
  peb_op_out(b, op, "Out", out);
  if (act == PE_B_ACT_SOFTMAX) peb_attr_int(b, op, "axis", -1);
  return b->err ? NULL : o->name;
}

/* Finish a layer whose pre-activation result is `pre` (named "<layer>.tmp_k"
 * when act is set, else already "<layer>.out"). */
static const char *finish_layer(pe_builder *b, const char *layer, const char *pre, pe_b_act act) {
  if (b->err) return NULL;
  if (act == PE_B_ACT_NONE) return peb_var_find(&b->main, pre)->name;
  char buf[B_NAME_LEN];
  return act_into(b, pre, act, peb_vname(buf, layer, "out"));
}

const char *pe_builder_fc(pe_builder *b, const char *x, int64_t size, const pe_b_fc_opts *o) {
  pe_b_fc_opts dflt = {0};
  if (!o) o = &dflt;
  if (!b) return NULL;
  b_var *xv = peb_need(b, "fc", x);
  char layer[B_NAME_LEN], buf[B_NAME_LEN], wn[B_NAME_LEN], bn[B_NAME_LEN], mm[B_NAME_LEN];
  if (!xv || !peb_layer_name(b, "fc", o->name, layer)) return NULL;
  int ncd = o->num_col_dims ? o->num_col_dims : 1;
  char sh[128];
  if (size <= 0) {
    peb_fail(b, "fc '%s': size %lld (must be positive)", layer, (long long)size);
    return NULL;
  }
  if (ncd < 1 || ncd >= xv->ndim) {
    peb_fail(b, "fc '%s': num_col_dims %d out of range for input '%s' %s", layer, ncd, x,
             peb_shape_str(xv, sh, sizeof sh));
    return NULL;
  }
  int64_t k = peb_prod(xv->d, ncd, xv->ndim);
  if (k <= 0) {
    peb_fail(b, "fc '%s': input '%s' %s has unknown feature dims after num_col_dims %d", layer, x,
             peb_shape_str(xv, sh, sizeof sh), ncd);
    return NULL;
  }
  int64_t od[B_MAX_DIMS];
  memcpy(od, xv->d, (size_t)ncd * sizeof *od);
  od[ncd] = size;
  bool last = o->no_bias && o->act == PE_B_ACT_NONE;
  peb_vname(wn, layer, "w");
  peb_vname(bn, layer, "b");
  peb_vname(mm, layer, last ? "out" : "tmp_0");
  if (!peb_param_add(b, wn, 2, (int64_t[]){k, size}, peb_init_or(o->w_init, PE_B_INIT_XAVIER),
                     (double)k, (double)size, true))
    return NULL;
  peb_tmp_var(b, mm, PE_B_F32, ncd + 1, od);
  b_op *op = peb_op_add(b, &b->main, "matmul");
  peb_op_in(b, op, "X", x);
  peb_op_in(b, op, "Y", wn);
  peb_op_out(b, op, "Out", mm);
  peb_attr_int(b, op, "x_num_col_dims", ncd);
  peb_attr_int(b, op, "y_num_col_dims", 1);
  const char *pre = mm;
  if (!o->no_bias) {
    if (!peb_param_add(b, bn, 1, (int64_t[]){size}, peb_init_or(o->b_init, PE_B_INIT_CONSTANT), 0,
                       0, true))
      return NULL;
    peb_vname(buf, layer, o->act == PE_B_ACT_NONE ? "out" : "tmp_1");
    peb_tmp_var(b, buf, PE_B_F32, ncd + 1, od);
    op = peb_op_add(b, &b->main, "elementwise_add");
    peb_op_in(b, op, "X", mm);
    peb_op_in(b, op, "Y", bn);
    peb_op_out(b, op, "Out", buf);
    peb_attr_int(b, op, "axis", ncd);
    pre = buf;
  }
  return finish_layer(b, layer, pre, o->act);
}

/* Output extent of a window op; -1 stays -1. */
static int64_t out_extent(int64_t in, int k, int pad, int stride, int dil) {
  if (in < 0) return -1;
  int64_t eff = (int64_t)dil * (k - 1) + 1;
  int64_t span = in + 2 * (int64_t)pad - eff;
  return span < 0 ? 0 : span / stride + 1;
}

const char *pe_builder_conv2d(pe_builder *b, const char *x, int64_t out_channels, int kh, int kw,
                              const pe_b_conv_opts *o) {
  pe_b_conv_opts dflt = {0};
  if (!o) o = &dflt;
  if (!b) return NULL;
  b_var *xv = peb_need(b, "conv2d", x);
  char layer[B_NAME_LEN], wn[B_NAME_LEN], bn[B_NAME_LEN], cv[B_NAME_LEN], buf[B_NAME_LEN];
  char sh[128];
  if (!xv || !peb_layer_name(b, "conv2d", o->name, layer)) return NULL;
  int g = o->groups ? o->groups : 1;
  int s[2], dl[2];
  for (int i = 0; i < 2; i++) {
    s[i] = o->stride[i] ? o->stride[i] : 1;
    dl[i] = o->dilation[i] ? o->dilation[i] : 1;
  }
  if (xv->ndim != 4 || xv->d[1] <= 0) {
    peb_fail(b, "conv2d '%s': input '%s' %s must be NCHW with known C", layer, x,
             peb_shape_str(xv, sh, sizeof sh));
    return NULL;
  }
  int64_t c = xv->d[1];
  if (out_channels <= 0 || kh <= 0 || kw <= 0 || g <= 0 || s[0] <= 0 || s[1] <= 0 || dl[0] <= 0 ||
      dl[1] <= 0 || o->pad[0] < 0 || o->pad[1] < 0) {
    peb_fail(b,
             "conv2d '%s': bad arguments (out_channels %lld, kernel %dx%d, groups %d, "
             "stride %d,%d, pad %d,%d, dilation %d,%d)",
             layer, (long long)out_channels, kh, kw, g, s[0], s[1], o->pad[0], o->pad[1], dl[0],
             dl[1]);
    return NULL;
  }
  if (c % g || out_channels % g) {
    peb_fail(b, "conv2d '%s': groups %d must divide in channels %lld and out channels %lld", layer,
             g, (long long)c, (long long)out_channels);
    return NULL;
  }
  int64_t od[4] = {xv->d[0], out_channels, out_extent(xv->d[2], kh, o->pad[0], s[0], dl[0]),
                   out_extent(xv->d[3], kw, o->pad[1], s[1], dl[1])};
  if (od[2] == 0 || od[3] == 0) {
    peb_fail(b, "conv2d '%s': kernel %dx%d does not fit input '%s' %s", layer, kh, kw, x,
             peb_shape_str(xv, sh, sizeof sh));
    return NULL;
  }
  double fan_in = (double)(c / g) * kh * kw, fan_out = (double)out_channels * kh * kw;
  peb_vname(wn, layer, "w");
  peb_vname(bn, layer, "b");
  peb_vname(cv, layer, o->no_bias && o->act == PE_B_ACT_NONE ? "out" : "tmp_0");
  if (!peb_param_add(b, wn, 4, (int64_t[]){out_channels, c / g, kh, kw},
                     peb_init_or(o->w_init, PE_B_INIT_KAIMING), fan_in, fan_out, true))
    return NULL;
  peb_tmp_var(b, cv, PE_B_F32, 4, od);
  b_op *op = peb_op_add(b, &b->main, "conv2d");
  peb_op_in(b, op, "Input", x);
  peb_op_in(b, op, "Filter", wn);
  peb_op_out(b, op, "Output", cv);
  peb_attr_ints(b, op, "strides", 2, (int64_t[]){s[0], s[1]});
  peb_attr_ints(b, op, "paddings", 2, (int64_t[]){o->pad[0], o->pad[1]});
  peb_attr_ints(b, op, "dilations", 2, (int64_t[]){dl[0], dl[1]});
  peb_attr_int(b, op, "groups", g);
  const char *pre = cv;
  if (!o->no_bias) {
    if (!peb_param_add(b, bn, 1, (int64_t[]){out_channels},
                       peb_init_or(o->b_init, PE_B_INIT_CONSTANT), 0, 0, true))
      return NULL;
    peb_vname(buf, layer, o->act == PE_B_ACT_NONE ? "out" : "tmp_1");
    peb_tmp_var(b, buf, PE_B_F32, 4, od);
    op = peb_op_add(b, &b->main, "elementwise_add");
    peb_op_in(b, op, "X", cv);
    peb_op_in(b, op, "Y", bn);
    peb_op_out(b, op, "Out", buf);
    peb_attr_int(b, op, "axis", 1);
    pre = buf;
  }
  return finish_layer(b, layer, pre, o->act);
}

const char *pe_builder_pool2d(pe_builder *b, const char *x, int kh, int kw,
                              const pe_b_pool_opts *o) {
  pe_b_pool_opts dflt = {0};
  if (!o) o = &dflt;
  if (!b) return NULL;
  b_var *xv = peb_need(b, "pool2d", x);
  char layer[B_NAME_LEN], buf[B_NAME_LEN], sh[128];
  if (!xv || !peb_layer_name(b, "pool2d", o->name, layer)) return NULL;
  if (xv->ndim != 4) {
    peb_fail(b, "pool2d '%s': input '%s' %s must be NCHW", layer, x,
             peb_shape_str(xv, sh, sizeof sh));
    return NULL;
  }
  if (o->global) { /* the kernel covers the whole map; ksize is still required */
    kh = kh > 0 ? kh : (xv->d[2] > 0 ? (int)xv->d[2] : 1);
    kw = kw > 0 ? kw : (xv->d[3] > 0 ? (int)xv->d[3] : 1);
  }
  int s[2] = {o->stride[0] ? o->stride[0] : kh, o->stride[1] ? o->stride[1] : kw};
  if (kh <= 0 || kw <= 0 || s[0] <= 0 || s[1] <= 0 || o->pad[0] < 0 || o->pad[1] < 0) {
    peb_fail(b, "pool2d '%s': bad arguments (kernel %dx%d, stride %d,%d, pad %d,%d)", layer, kh, kw,
             s[0], s[1], o->pad[0], o->pad[1]);
    return NULL;
  }
  int64_t od[4] = {xv->d[0], xv->d[1], 1, 1};
  if (!o->global) {
    od[2] = out_extent(xv->d[2], kh, o->pad[0], s[0], 1);
    od[3] = out_extent(xv->d[3], kw, o->pad[1], s[1], 1);
    if (od[2] == 0 || od[3] == 0) {
      peb_fail(b, "pool2d '%s': kernel %dx%d does not fit input '%s' %s", layer, kh, kw, x,
               peb_shape_str(xv, sh, sizeof sh));
      return NULL;
    }
  }
  b_var *out = peb_tmp_var(b, peb_vname(buf, layer, "out"), xv->dtype, 4, od);
  b_op *op = peb_op_add(b, &b->main, "pool2d");
  peb_op_in(b, op, "X", x);
  peb_op_out(b, op, "Out", buf);
  peb_attr_str(b, op, "pooling_type", o->avg ? "avg" : "max");
  peb_attr_ints(b, op, "ksize", 2, (int64_t[]){kh, kw});
  peb_attr_ints(b, op, "strides", 2, (int64_t[]){s[0], s[1]});
  peb_attr_ints(b, op, "paddings", 2, (int64_t[]){o->pad[0], o->pad[1]});
  peb_attr_bool(b, op, "global_pooling", o->global);
  peb_attr_bool(b, op, "exclusive", !o->inclusive);
  return b->err ? NULL : out->name;
}

const char *pe_builder_batch_norm(pe_builder *b, const char *x, const pe_b_bn_opts *o) {
  pe_b_bn_opts dflt = {0};
  if (!o) o = &dflt;
  if (!b) return NULL;
  b_var *xv = peb_need(b, "batch_norm", x);
  char layer[B_NAME_LEN], sh[128];
  char sc[B_NAME_LEN], bi[B_NAME_LEN], mn[B_NAME_LEN], vr[B_NAME_LEN], sm[B_NAME_LEN],
      sv[B_NAME_LEN], y[B_NAME_LEN];
  if (!xv || !peb_layer_name(b, "batch_norm", o->name, layer)) return NULL;
  if (xv->ndim < 2 || xv->d[1] <= 0) {
    peb_fail(b, "batch_norm '%s': input '%s' %s needs a known channel dim 1", layer, x,
             peb_shape_str(xv, sh, sizeof sh));
    return NULL;
  }
  float mom = o->momentum ? o->momentum : 0.9f, eps = o->epsilon ? o->epsilon : 1e-5f;
  if (!(mom >= 0 && mom <= 1) || !(eps > 0)) {
    peb_fail(b, "batch_norm '%s': momentum %g must be in [0,1], epsilon %g positive", layer, mom,
             eps);
    return NULL;
  }
  int64_t c[1] = {xv->d[1]};
  pe_b_init one = {PE_B_INIT_CONSTANT, 1, 0, 0}, zero = {PE_B_INIT_CONSTANT, 0, 0, 0};
  peb_param_add(b, peb_vname(sc, layer, "scale"), 1, c, one, 0, 0, true);
  peb_param_add(b, peb_vname(bi, layer, "bias"), 1, c, zero, 0, 0, true);
  peb_param_add(b, peb_vname(mn, layer, "mean"), 1, c, zero, 0, 0, false);
  peb_param_add(b, peb_vname(vr, layer, "variance"), 1, c, one, 0, 0, false);
  b_var *v1 = peb_tmp_var(b, peb_vname(sm, layer, "saved_mean"), PE_B_F32, 1, c);
  b_var *v2 = peb_tmp_var(b, peb_vname(sv, layer, "saved_variance"), PE_B_F32, 1, c);
  if (b->err) return NULL;
  v1->stop_gradient = v2->stop_gradient = true;
  peb_vname(y, layer, o->act == PE_B_ACT_NONE ? "out" : "tmp_0");
  peb_tmp_var(b, y, xv->dtype, xv->ndim, xv->d);
  b_op *op = peb_op_add(b, &b->main, "batch_norm");
  peb_op_in(b, op, "X", x);
  peb_op_in(b, op, "Scale", sc);
  peb_op_in(b, op, "Bias", bi);
  peb_op_in(b, op, "Mean", mn);
  peb_op_in(b, op, "Variance", vr);
  peb_op_out(b, op, "Y", y);
  peb_op_out(b, op, "MeanOut", mn);
  peb_op_out(b, op, "VarianceOut", vr);
  peb_op_out(b, op, "SavedMean", sm);
  peb_op_out(b, op, "SavedVariance", sv);
  peb_attr_float(b, op, "momentum", mom);
  peb_attr_float(b, op, "epsilon", eps);
  peb_attr_bool(b, op, "is_test", false);
  return finish_layer(b, layer, y, o->act);
}

const char *pe_builder_dropout(pe_builder *b, const char *x, float prob, int64_t seed,
                               const char *name) {
  if (!b) return NULL;
  b_var *xv = peb_need(b, "dropout", x);
  char layer[B_NAME_LEN], out[B_NAME_LEN], mask[B_NAME_LEN];
  if (!xv || !peb_layer_name(b, "dropout", name, layer)) return NULL;
  if (!(prob >= 0 && prob < 1)) {
    peb_fail(b, "dropout '%s': probability %g not in [0, 1)", layer, prob);
    return NULL;
  }
  b_var *ov = peb_tmp_var(b, peb_vname(out, layer, "out"), xv->dtype, xv->ndim, xv->d);
  b_var *mv = peb_tmp_var(b, peb_vname(mask, layer, "mask"), PE_B_U8, xv->ndim, xv->d);
  if (b->err) return NULL;
  mv->stop_gradient = true;
  b_op *op = peb_op_add(b, &b->main, "dropout");
  peb_op_in(b, op, "X", x);
  peb_op_out(b, op, "Out", out);
  peb_op_out(b, op, "Mask", mask);
  peb_attr_float(b, op, "dropout_prob", prob);
  peb_attr_bool(b, op, "is_test", false);
  peb_attr_int(b, op, "seed", seed);
  peb_attr_str(b, op, "dropout_implementation", "upscale_in_train");
  return b->err ? NULL : ov->name;
}

const char *pe_builder_act(pe_builder *b, const char *x, pe_b_act act) {
  static const char *const kinds[] = {"act", "relu", "tanh", "sigmoid", "softmax"};
  if (!b) return NULL;
  if ((int)act <= PE_B_ACT_NONE || act > PE_B_ACT_SOFTMAX) {
    peb_fail(b, "activation: unknown kind %d", (int)act);
    return NULL;
  }
  char layer[B_NAME_LEN], out[B_NAME_LEN];
  if (!peb_need(b, kinds[act], x) || !peb_layer_name(b, kinds[act], NULL, layer)) return NULL;
  return act_into(b, x, act, peb_vname(out, layer, "out"));
}

const char *pe_builder_relu(pe_builder *b, const char *x) {
  return pe_builder_act(b, x, PE_B_ACT_RELU);
}
const char *pe_builder_tanh(pe_builder *b, const char *x) {
  return pe_builder_act(b, x, PE_B_ACT_TANH);
}
const char *pe_builder_sigmoid(pe_builder *b, const char *x) {
  return pe_builder_act(b, x, PE_B_ACT_SIGMOID);
}
const char *pe_builder_softmax(pe_builder *b, const char *x) {
  return pe_builder_act(b, x, PE_B_ACT_SOFTMAX);
}

const char *pe_builder_add(pe_builder *b, const char *x, const char *y, pe_b_act act,
                           const char *name) {
  if (!b) return NULL;
  b_var *xv = peb_need(b, "add", x), *yv = xv ? peb_need(b, "add", y) : NULL;
  char layer[B_NAME_LEN], out[B_NAME_LEN], s1[128], s2[128];
  if (!yv || !peb_layer_name(b, "add", name, layer)) return NULL;
  bool same = xv->ndim == yv->ndim && xv->dtype == yv->dtype;
  for (int i = 0; same && i < xv->ndim; i++) same = xv->d[i] == yv->d[i];
  if (!same) {
    peb_fail(b, "add '%s': '%s' %s and '%s' %s differ (a residual sum needs one shape)", layer, x,
             peb_shape_str(xv, s1, sizeof s1), y, peb_shape_str(yv, s2, sizeof s2));
    return NULL;
  }
  peb_vname(out, layer, act == PE_B_ACT_NONE ? "out" : "tmp_0");
  peb_tmp_var(b, out, xv->dtype, xv->ndim, xv->d);
  b_op *op = peb_op_add(b, &b->main, "elementwise_add");
  peb_op_in(b, op, "X", x);
  peb_op_in(b, op, "Y", y);
  peb_op_out(b, op, "Out", out);
  peb_attr_int(b, op, "axis", -1);
  return finish_layer(b, layer, out, act);
}

const char *pe_builder_flatten(pe_builder *b, const char *x, int axis) {
  if (!b) return NULL;
  b_var *xv = peb_need(b, "flatten", x);
  char layer[B_NAME_LEN], out[B_NAME_LEN], sh[128];
  if (!xv || !peb_layer_name(b, "flatten", NULL, layer)) return NULL;
  if (axis < 0 || axis > xv->ndim) {
    peb_fail(b, "flatten '%s': axis %d out of range for '%s' %s", layer, axis, x,
             peb_shape_str(xv, sh, sizeof sh));
    return NULL;
  }
  int64_t od[2] = {peb_prod(xv->d, 0, axis), peb_prod(xv->d, axis, xv->ndim)};
  b_var *ov = peb_tmp_var(b, peb_vname(out, layer, "out"), xv->dtype, 2, od);
  b_op *op = peb_op_add(b, &b->main, "flatten");
  peb_op_in(b, op, "X", x);
  peb_op_out(b, op, "Out", out);
  peb_attr_int(b, op, "axis", axis);
  return b->err ? NULL : ov->name;
}

/* --- losses and metrics ----------------------------------------------------------------------- */

/* Check a label against scores [.., C]; returns soft (f32) or hard (i64). */
static bool label_kind(pe_builder *b, const char *layer, const b_var *xv, const b_var *lv,
                       bool *soft) {
  char s1[128], s2[128];
  if (xv->ndim < 2 || xv->dtype != PE_B_F32) {
    peb_fail(b, "%s: scores '%s' %s must be f32 with at least 2 dims", layer, xv->name,
             peb_shape_str(xv, s1, sizeof s1));
    return false;
  }
  *soft = lv->dtype == PE_B_F32;
  if (lv->dtype != PE_B_I64 && !*soft) {
    peb_fail(b, "%s: label '%s' must be i64 (hard) or f32 (soft)", layer, lv->name);
    return false;
  }
  bool ok = lv->ndim == xv->ndim;
  for (int i = 0; ok && i < xv->ndim - 1; i++)
    ok = lv->d[i] == xv->d[i] || lv->d[i] == -1 || xv->d[i] == -1;
  if (ok) ok = *soft ? lv->d[xv->ndim - 1] == xv->d[xv->ndim - 1] : lv->d[lv->ndim - 1] == 1;
  if (!ok)
    peb_fail(b, "%s: label '%s' %s does not fit scores '%s' %s", layer, lv->name,
             peb_shape_str(lv, s1, sizeof s1), xv->name, peb_shape_str(xv, s2, sizeof s2));
  return ok;
}

const char *pe_builder_softmax_with_cross_entropy(pe_builder *b, const char *logits,
                                                  const char *label, const char **softmax_out) {
  if (!b) return NULL;
  const char *kind = "softmax_with_cross_entropy";
  b_var *xv = peb_need(b, kind, logits), *lv = peb_need(b, kind, label);
  char layer[B_NAME_LEN], sm[B_NAME_LEN], loss[B_NAME_LEN];
  bool soft;
  if (!xv || !lv || !peb_layer_name(b, kind, NULL, layer) || !label_kind(b, layer, xv, lv, &soft))
    return NULL;
  int64_t ld[B_MAX_DIMS];
  memcpy(ld, xv->d, (size_t)xv->ndim * sizeof *ld);
  ld[xv->ndim - 1] = 1;
  b_var *smv = peb_tmp_var(b, peb_vname(sm, layer, "softmax"), PE_B_F32, xv->ndim, xv->d);
  b_var *lossv = peb_tmp_var(b, peb_vname(loss, layer, "out"), PE_B_F32, xv->ndim, ld);
  b_op *op = peb_op_add(b, &b->main, kind);
  peb_op_in(b, op, "Logits", logits);
  peb_op_in(b, op, "Label", label);
  peb_op_out(b, op, "Softmax", sm);
  peb_op_out(b, op, "Loss", loss);
  peb_attr_bool(b, op, "soft_label", soft);
  peb_attr_int(b, op, "axis", -1);
  if (b->err) return NULL;
  if (softmax_out) *softmax_out = smv->name;
  return lossv->name;
}

const char *pe_builder_cross_entropy(pe_builder *b, const char *x, const char *label) {
  if (!b) return NULL;
  b_var *xv = peb_need(b, "cross_entropy", x), *lv = peb_need(b, "cross_entropy", label);
  char layer[B_NAME_LEN], out[B_NAME_LEN];
  bool soft;
  if (!xv || !lv || !peb_layer_name(b, "cross_entropy", NULL, layer) ||
      !label_kind(b, layer, xv, lv, &soft))
    return NULL;
  int64_t yd[B_MAX_DIMS];
  memcpy(yd, xv->d, (size_t)xv->ndim * sizeof *yd);
  yd[xv->ndim - 1] = 1;
  b_var *yv = peb_tmp_var(b, peb_vname(out, layer, "out"), PE_B_F32, xv->ndim, yd);
  b_op *op = peb_op_add(b, &b->main, "cross_entropy");
  peb_op_in(b, op, "X", x);
  peb_op_in(b, op, "Label", label);
  peb_op_out(b, op, "Y", out);
  peb_attr_bool(b, op, "soft_label", soft);
  return b->err ? NULL : yv->name;
}

const char *pe_builder_mean(pe_builder *b, const char *x) {
  if (!b) return NULL;
  b_var *xv = peb_need(b, "mean", x);
  char layer[B_NAME_LEN], out[B_NAME_LEN];
  if (!xv || !peb_layer_name(b, "mean", NULL, layer)) return NULL;
  b_var *ov = peb_tmp_var(b, peb_vname(out, layer, "out"), xv->dtype, 1, (int64_t[]){1});
  b_op *op = peb_op_add(b, &b->main, "mean");
  peb_op_in(b, op, "X", x);
  peb_op_out(b, op, "Out", out);
  return b->err ? NULL : ov->name;
}

const char *pe_builder_accuracy(pe_builder *b, const char *x, const char *label, int k) {
  if (!b) return NULL;
  b_var *xv = peb_need(b, "accuracy", x), *lv = peb_need(b, "accuracy", label);
  char layer[B_NAME_LEN], acc[B_NAME_LEN], cor[B_NAME_LEN], tot[B_NAME_LEN];
  bool soft;
  if (!xv || !lv || !peb_layer_name(b, "accuracy", NULL, layer) ||
      !label_kind(b, layer, xv, lv, &soft))
    return NULL;
  if (soft || xv->ndim != 2) {
    peb_fail(b, "accuracy '%s': needs scores [N,C] and an i64 [N,1] label", layer);
    return NULL;
  }
  if (k < 1 || (xv->d[1] > 0 && k > xv->d[1])) {
    peb_fail(b, "accuracy '%s': k %d out of range for %lld classes", layer, k, (long long)xv->d[1]);
    return NULL;
  }
  const int64_t one[1] = {1};
  b_var *av = peb_tmp_var(b, peb_vname(acc, layer, "out"), PE_B_F32, 1, one);
  b_var *cv = peb_tmp_var(b, peb_vname(cor, layer, "correct"), PE_B_I64, 1, one);
  b_var *tv = peb_tmp_var(b, peb_vname(tot, layer, "total"), PE_B_I64, 1, one);
  if (b->err) return NULL;
  av->stop_gradient = cv->stop_gradient = tv->stop_gradient = true;
  b_op *op = peb_op_add(b, &b->main, "accuracy");
  peb_op_in(b, op, "X", x);
  peb_op_in(b, op, "Label", label);
  peb_op_out(b, op, "Accuracy", acc);
  peb_op_out(b, op, "Correct", cor);
  peb_op_out(b, op, "Total", tot);
  peb_attr_int(b, op, "k", k);
  return b->err ? NULL : av->name;
}
