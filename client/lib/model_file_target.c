/* The regression words of model files (format: conf/models/README.md):
 * `target NAME [D...]`, an f32 feed of the values to predict, and the
 * `loss` kinds that compare the current variable with it (mse, l1,
 * smooth_l1). A model with a target has no classes, so no accuracy: its
 * figure is the loss. The keyword table and the argument readers are
 * model_file.c. */
#include <stdio.h>
#include <string.h>

#include "builder_internal.h"
#include "model_file_internal.h"
#include "pe_builder.h"

/* target NAME [D1 D2 D3]: f32 [-1, D1, ...]; [-1, 1] without dims. */
int mf_h_target(mf *m) {
  if (m->label) return mf_fail(m, "target: a second label ('%s' is declared)", m->label);
  int nd = m->n_pos - 1;
  int64_t dims[4] = {-1, 1}, numel = 1;
  for (int i = 0; i < nd; i++) {
    long v = 0;
    if (mf_parse_long(m, "dim", m->pos[1 + i], 1, 1L << 20, &v)) return -1;
    dims[1 + i] = v;
    numel *= v; /* at most 2^60 */
  }
  if (numel > (INT64_C(1) << 30)) return mf_fail(m, "target: more than 2^30 values per example");
  const char *cur = m->x;
  const char *t = pe_builder_data(m->b, m->pos[0], PE_B_F32, nd ? nd + 1 : 2, dims);
  if (mf_built(m, t)) return -1;
  m->label = t;
  m->x = cur; /* the target is not a layer input */
  m->regression = true;
  return 0;
}

bool mf_is_regression_loss(const char *kind) {
  return !strcmp(kind, "mse") || !strcmp(kind, "l1") || !strcmp(kind, "smooth_l1");
}

/* Do the prediction and the target have one shape (-1, the batch, fits
 * any)? */
static bool same_shape(const b_var *p, const b_var *t) {
  if (p->ndim != t->ndim) return false;
  for (int i = 0; i < p->ndim; i++)
    if (p->d[i] != t->d[i] && p->d[i] != -1 && t->d[i] != -1) return false;
  return true;
}

/* loss mse|l1|smooth_l1 [beta=X]: the mean over the batch and the
 * target's values. A regression kind needs a target, a target needs a
 * regression kind. */
int mf_regression_loss(mf *m) {
  const char *kind = m->pos[0];
  if (!m->regression)
    return mf_fail(
        m,
        "loss %s: '%s' holds class labels (i64, a 'label' or 'targets' line); a regression "
        "loss compares the prediction with a 'target' line's f32 values",
        kind, m->label);
  if (!mf_is_regression_loss(kind))
    return mf_fail(m,
                   "loss %s: '%s' is a regression target (the 'target' line, f32); its losses are "
                   "mse, l1 and smooth_l1 (class labels: a 'label' line)",
                   kind, m->label);
  const b_var *p = peb_var_find(&m->b->main, m->x), *t = peb_var_find(&m->b->main, m->label);
  char ps[128], ts[128];
  if (!p || !t) return mf_fail(m, "loss %s: '%s' is not declared", kind, p ? m->label : m->x);
  if (!same_shape(p, t))
    return mf_fail(m,
                   "loss %s: the prediction '%s' %s and the target '%s' %s differ in shape (the "
                   "layer before the loss outputs the target's shape)",
                   kind, m->x, peb_shape_str(p, ps, sizeof ps), m->label,
                   peb_shape_str(t, ts, sizeof ts));
  float beta = 1;
  if (strcmp(kind, "smooth_l1") && mf_opt_str(m, "beta"))
    return mf_fail(m, "loss %s: beta applies to smooth_l1 only", kind);
  if (mf_opt_float_in(m, "beta", 0, 1e6f, OPEN_MIN, &beta)) return -1;
  const char *pred = m->x, *loss;
  if (!strcmp(kind, "mse"))
    loss = pe_builder_mse_loss(m->b, pred, m->label);
  else if (!strcmp(kind, "l1"))
    loss = pe_builder_l1_loss(m->b, pred, m->label);
  else
    loss = pe_builder_smooth_l1_loss(m->b, pred, m->label, beta);
  if (mf_built(m, loss)) return -1;
  m->loss = m->x;
  m->x = pred;
  return 0;
}
