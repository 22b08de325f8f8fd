/* Metrics: accuracy and top_k (no gradients).
 *
 * Both order scores the same way, so that "the label is in the top k" for
 * accuracy means exactly "top_k's Indices contain the label":
 *   - larger scores first; NaN counts as larger than every number and equal
 *     to other NaNs (so a NaN score is never silently skipped);
 *   - equal scores: the lower index first.
 * accuracy: rank(label) = #{j : x_j > x_label} + #{j < label : x_j == x_label};
 * the row is correct when rank < k. With k >= C every row is correct.
 *
 * Scores may be f32, f64, i32, i64 or u8; comparisons are exact in each. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops/op_tables.h"

enum { ACC_X = 0, ACC_LABEL };
enum { ACC_ACCURACY = 0, ACC_CORRECT, ACC_TOTAL };
enum { TOPK_X = 0 };
enum { TOPK_OUT = 0, TOPK_INDICES };

static bool score_dtype_ok(pe_dtype dt) {
  return dt == PE_F32 || dt == PE_F64 || dt == PE_I32 || dt == PE_I64 || dt == PE_U8;
}

/* Strict "a ranks before b by value" for elements i and j of buffer p. */
static bool score_gt(const void *p, pe_dtype dt, int64_t i, int64_t j) {
  switch (dt) {
    case PE_F32: {
      float a = ((const float *)p)[i], b = ((const float *)p)[j];
      return isnan(a) ? !isnan(b) : a > b;
    }
    case PE_F64: {
      double a = ((const double *)p)[i], b = ((const double *)p)[j];
      return isnan(a) ? !isnan(b) : a > b;
    }
    case PE_I32: return ((const int32_t *)p)[i] > ((const int32_t *)p)[j];
    case PE_I64: return ((const int64_t *)p)[i] > ((const int64_t *)p)[j];
    case PE_U8: return ((const uint8_t *)p)[i] > ((const uint8_t *)p)[j];
    default: return false;
  }
}

static pe_status *expect_scores(pe_infer_ctx *c, int slot, pe_meta *m) {
  if (score_dtype_ok(m->dtype)) return NULL;
  char sb[PE_SHAPE_STRLEN];
  return pe_infer_error(c, PE_EDTYPE, "input %s '%s' %s has dtype %s; scores must be numeric",
                        c->def->inputs[slot].name, pe_in_name(c, slot, 0),
                        pe_shape_str(&m->shape, sb, sizeof sb), pe_dtype_name(m->dtype));
}

static pe_status *k_from_attr(pe_infer_ctx *c, int64_t *k) {
  *k = pe_attr_i(c->def, c->desc, "k");
  if (*k < 1)
    return pe_infer_error(c, PE_EATTR, "attribute 'k' = %lld must be >= 1", (long long)*k);
  return NULL;
}

/* --- accuracy ----------------------------------------------------------------- */

static pe_status *accuracy_infer(pe_infer_ctx *c) {
  int64_t k;
  PE_TRY(k_from_attr(c, &k));
  pe_meta *x = pe_in_meta(c, ACC_X, 0), *label = pe_in_meta(c, ACC_LABEL, 0);
  if (!x || !label) return pe_infer_error(c, PE_EARITY, "needs inputs X and Label");
  PE_TRY(expect_scores(c, ACC_X, x));
  PE_TRY(pe_infer_expect_dtype(c, ACC_LABEL, 0, PE_I64));
  /* Shapes are formatted on the error paths only: infer runs every step. */
  char sx[PE_SHAPE_STRLEN], sl[PE_SHAPE_STRLEN];
  if (x->shape.ndim != 2)
    return pe_infer_error(c, PE_ESHAPE, "X '%s' %s must be [N,C]", pe_in_name(c, ACC_X, 0),
                          pe_shape_str(&x->shape, sx, sizeof sx));
  bool lshape = label->shape.ndim == 2 && label->shape.d[1] == 1;
  int64_t ln = label->shape.d[0], xn = x->shape.d[0];
  if (!lshape || (ln != xn && ln != -1 && xn != -1))
    return pe_infer_error(c, PE_ESHAPE, "Label '%s' %s must be [N,1] with N of X '%s' %s",
                          pe_in_name(c, ACC_LABEL, 0), pe_shape_str(&label->shape, sl, sizeof sl),
                          pe_in_name(c, ACC_X, 0), pe_shape_str(&x->shape, sx, sizeof sx));
  pe_shape one = PE_SHAPE(1);
  pe_infer_set(c, ACC_ACCURACY, PE_F32, &one);
  pe_infer_set(c, ACC_CORRECT, PE_I64, &one);
  pe_infer_set(c, ACC_TOTAL, PE_I64, &one);
  return NULL;
}

static pe_status *accuracy_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, ACC_X, 0), *label = pe_kin(c, ACC_LABEL, 0);
  int64_t k = pe_attr_i(c->def, c->desc, "k");
  int64_t n = x->shape.d[0], cls = x->shape.d[1];
  const int64_t *lab = pe_i64(label);
  size_t esz = pe_dtype_size(x->dtype);
  int64_t correct = 0;
  for (int64_t r = 0; r < n; r++) {
    int64_t l = lab[r];
    if (l < 0 || l >= cls)
      return pe_kernel_error(c, PE_EINVAL, "Label '%s' row %lld is %lld, outside [0, %lld)",
                             pe_op_input_arg(c->desc, "Label"), (long long)(c->batch_row0 + r),
                             (long long)l, (long long)cls);
    const char *row = (const char *)x->data + (size_t)(r * cls) * esz;
    int64_t rank = 0;
    for (int64_t j = 0; j < cls && rank < k; j++)
      if (score_gt(row, x->dtype, j, l) || (j < l && !score_gt(row, x->dtype, l, j))) rank++;
    correct += rank < k;
  }
  pe_tensor *acc = pe_kout(c, ACC_ACCURACY, 0), *cor = pe_kout(c, ACC_CORRECT, 0);
  pe_tensor *tot = pe_kout(c, ACC_TOTAL, 0);
  if (acc) pe_f32(acc)[0] = n ? (float)((double)correct / (double)n) : 0.0f;
  if (cor) pe_i64(cor)[0] = correct;
  if (tot) pe_i64(tot)[0] = n;
  return NULL;
}

/* --- top_k ------------------------------------------------------------------------ */

static pe_status *top_k_infer(pe_infer_ctx *c) {
  int64_t k;
  PE_TRY(k_from_attr(c, &k));
  pe_meta *x = pe_in_meta(c, TOPK_X, 0);
  if (!x) return pe_infer_error(c, PE_EARITY, "missing input X");
  PE_TRY(expect_scores(c, TOPK_X, x));
  char sx[PE_SHAPE_STRLEN];
  if (x->shape.ndim < 1)
    return pe_infer_error(c, PE_ESHAPE, "X '%s' has no dims", pe_in_name(c, TOPK_X, 0));
  int64_t last = x->shape.d[x->shape.ndim - 1];
  if (last >= 0 && k > last)
    return pe_infer_error(c, PE_EATTR, "attribute 'k' = %lld exceeds the last dim of X '%s' %s",
                          (long long)k, pe_in_name(c, TOPK_X, 0),
                          pe_shape_str(&x->shape, sx, sizeof sx));
  pe_shape s = x->shape;
  s.d[s.ndim - 1] = k;
  pe_infer_set(c, TOPK_OUT, x->dtype, &s);
  pe_infer_set(c, TOPK_INDICES, PE_I64, &s);
  return NULL;
}

/* Indices of the k first elements of row (length len) in score order, into
 * idx[0..k). Insertion into a sorted list of at most k: O(len * k) worst case,
 * O(len) when most elements lose to the current k-th (the usual case). Later
 * elements have higher indices, so an equal score never displaces an earlier
 * one: ties go to the lower index. */
static void top_k_row(const void *row, pe_dtype dt, int64_t len, int64_t k, int64_t *idx) {
  int64_t cnt = 0;
  for (int64_t j = 0; j < len; j++) {
    if (cnt == k && !score_gt(row, dt, j, idx[k - 1])) continue;
    int64_t pos = cnt < k ? cnt++ : k - 1;
    while (pos > 0 && score_gt(row, dt, j, idx[pos - 1])) {
      idx[pos] = idx[pos - 1];
      pos--;
    }
    idx[pos] = j;
  }
}

static pe_status *top_k_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, TOPK_X, 0), *out = pe_kout(c, TOPK_OUT, 0);
  pe_tensor *ind = pe_kout(c, TOPK_INDICES, 0);
  if (!out || !ind) return pe_kernel_error(c, PE_EARITY, "needs outputs Out and Indices");
  int64_t k = pe_attr_i(c->def, c->desc, "k");
  int64_t len = x->shape.d[x->shape.ndim - 1];
  if (k < 1 || k > len)
    return pe_kernel_error(c, PE_EATTR, "attribute 'k' = %lld, last dim %lld", (long long)k,
                           (long long)len);
  int64_t rows = len ? pe_tensor_numel(x) / len : 0;
  size_t esz = pe_dtype_size(x->dtype);
  int nt = pe_kernel_threads(c);
  /* Rows are independent; each writes its own slice of Out and Indices. */
#pragma omp parallel for num_threads(nt) if (rows * len >= 65536) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    int64_t *idx = pe_i64(ind) + r * k;
    const char *row = (const char *)x->data + (size_t)(r * len) * esz;
    top_k_row(row, x->dtype, len, k, idx);
    char *orow = (char *)out->data + (size_t)(r * k) * esz;
    for (int64_t q = 0; q < k; q++) memcpy(orow + (size_t)q * esz, row + (size_t)idx[q] * esz, esz);
  }
  return NULL;
}

/* --- table ---------------------------------------------------------------------------- */

static const pe_slot_def accuracy_in[] = {
    {"X", 1, 1, PE_SLOT_NO_GRAD}, {"Label", 1, 1, PE_SLOT_NO_GRAD}, {NULL}};
static const pe_slot_def accuracy_out[] = {
    {"Accuracy", 1, 1, 0}, {"Correct", 0, 1, 0}, {"Total", 0, 1, 0}, {NULL}};
static const pe_slot_def top_k_in[] = {{"X", 1, 1, PE_SLOT_NO_GRAD}, {NULL}};
static const pe_slot_def top_k_out[] = {{"Out", 1, 1, 0}, {"Indices", 1, 1, 0}, {NULL}};
static const pe_attr_def k_attrs[] = {{"k", PE_ATTR_INT, false, 1, NULL}, {NULL}};

const pe_op_def pe_ops_metric[] = {
    {.type = "accuracy",
     .inputs = accuracy_in,
     .outputs = accuracy_out,
     .attrs = k_attrs,
     .flags = PE_OP_NO_GRAD,
     .infer = accuracy_infer,
     .kernel_cpu = accuracy_kernel},
    {.type = "top_k",
     .inputs = top_k_in,
     .outputs = top_k_out,
     .attrs = k_attrs,
     .flags = PE_OP_NO_GRAD,
     .infer = top_k_infer,
     .kernel_cpu = top_k_kernel},
    {0},
};
