/* Regression losses of the program builder (see pe_builder.h): the mean
 * squared and absolute errors (elementwise_sub, square or abs, mean, as
 * Paddle composes them) and the smooth L1 loss (the smooth_l1_loss op,
 * whose rows sum, then mean and a scale to the mean over elements). */
#include <math.h>
#include <stdio.h>

#include "builder_internal.h"

/* x and label, f32 of one shape (-1 matches any dim), inputs of the loss
 * `kind`; its layer name into layer. NULL (and an error) otherwise. */
static b_var *loss_inputs(pe_builder *b, const char *kind, const char *x, const char *label,
                          char *layer) {
  b_var *xv = peb_need(b, kind, x), *lv = xv ? peb_need(b, kind, label) : NULL;
  char s1[128], s2[128];
  if (!lv || !peb_layer_name(b, kind, NULL, layer)) return NULL;
  bool same = xv->ndim == lv->ndim && xv->dtype == PE_B_F32 && lv->dtype == PE_B_F32;
  for (int i = 0; same && i < xv->ndim; i++)
    same = xv->d[i] == lv->d[i] || xv->d[i] == -1 || lv->d[i] == -1;
  if (!same) {
    peb_fail(b, "%s '%s': prediction '%s' %s and label '%s' %s must be f32 of one shape", kind,
             layer, x, peb_shape_str(xv, s1, sizeof s1), label, peb_shape_str(lv, s2, sizeof s2));
    return NULL;
  }
  return xv;
}

/* out [1] = mean(in), declared as "<layer>.out". */
static const char *mean_into(pe_builder *b, const char *in, const char *layer, const char *sfx) {
  char out[B_NAME_LEN];
  b_var *ov = peb_tmp_var(b, peb_vname(out, layer, sfx), PE_B_F32, 1, (int64_t[]){1});
  b_op *op = peb_op_add(b, &b->main, "mean");
  peb_op_in(b, op, "X", in);
  peb_op_out(b, op, "Out", out);
  return b->err ? NULL : ov->name;
}

/* mean(unary(x - label)): elementwise_sub, the op `unary`, mean. */
static const char *diff_loss(pe_builder *b, const char *kind, const char *unary, const char *x,
                             const char *label) {
  if (!b) return NULL;
  char layer[B_NAME_LEN], d[B_NAME_LEN], u[B_NAME_LEN];
  b_var *xv = loss_inputs(b, kind, x, label, layer);
  if (!xv) return NULL;
  peb_tmp_var(b, peb_vname(d, layer, "tmp_0"), PE_B_F32, xv->ndim, xv->d);
  peb_tmp_var(b, peb_vname(u, layer, "tmp_1"), PE_B_F32, xv->ndim, xv->d);
  b_op *op = peb_op_add(b, &b->main, "elementwise_sub");
  peb_op_in(b, op, "X", x);
  peb_op_in(b, op, "Y", label);
  peb_op_out(b, op, "Out", d);
  peb_attr_int(b, op, "axis", -1);
  op = peb_op_add(b, &b->main, unary);
  peb_op_in(b, op, "X", d);
  peb_op_out(b, op, "Out", u);
  return mean_into(b, u, layer, "out");
}

const char *pe_builder_l1_loss(pe_builder *b, const char *x, const char *label) {
  return diff_loss(b, "l1_loss", "abs", x, label);
}

const char *pe_builder_smooth_l1_loss(pe_builder *b, const char *x, const char *label, float beta) {
  if (!b) return NULL;
  char layer[B_NAME_LEN], rows[B_NAME_LEN], out[B_NAME_LEN], sh[128];
  b_var *xv = loss_inputs(b, "smooth_l1_loss", x, label, layer);
  if (!xv) return NULL;
  /* the op sums each row: the mean over elements is the mean of the row
   * sums over the row length */
  int64_t row = 1;
  for (int i = 1; i < xv->ndim; i++) row = xv->d[i] > 0 && row > 0 ? row * xv->d[i] : -1;
  if (xv->ndim < 1 || row <= 0 || !(beta > 0) || isinf(beta)) {
    peb_fail(b,
             "smooth_l1_loss '%s': prediction '%s' %s needs known dims after the first, and beta "
             "%g must be positive",
             layer, x, peb_shape_str(xv, sh, sizeof sh), (double)beta);
    return NULL;
  }
  peb_tmp_var(b, peb_vname(rows, layer, "rows"), PE_B_F32, 2, (int64_t[]){xv->d[0], 1});
  b_op *op = peb_op_add(b, &b->main, "smooth_l1_loss");
  peb_op_in(b, op, "X", x);
  peb_op_in(b, op, "Y", label);
  peb_op_out(b, op, "Out", rows);
  peb_attr_float(b, op, "sigma", (float)(1.0 / sqrt((double)beta)));
  if (row == 1) return mean_into(b, rows, layer, "out");
  const char *m = mean_into(b, rows, layer, "row_mean");
  if (!m) return NULL;
  b_var *ov = peb_tmp_var(b, peb_vname(out, layer, "out"), PE_B_F32, 1, (int64_t[]){1});
  op = peb_op_add(b, &b->main, "scale");
  peb_op_in(b, op, "X", m);
  peb_op_out(b, op, "Out", out);
  peb_attr_float(b, op, "scale", (float)(1.0 / (double)row));
  return b->err ? NULL : ov->name;
}

const char *pe_builder_mse_loss(pe_builder *b, const char *x, const char *label) {
  return diff_loss(b, "mse_loss", "square", x, label);
}
