/* layer_norm: values (Y, Mean, Variance) against a double-precision
 * reference at several begin_norm_axis, with and without Scale and Bias;
 * numeric gradients of X, Scale and Bias; a pruned Y@GRAD; infer errors
 * naming the op, the variable and the shape.
 *
 * Tolerances: oneDNN computes in f32 over rows of at most 60 elements;
 * 1e-4 absolute on values of magnitude <= ~4 is a wide margin. Gradients:
 * central differences in f32 (eps 1e-2 on inputs in [-1, 1]) are within
 * ~1e-3 relative; 2e-2 leaves room for the normalisation's 1/sigma. */
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

static pe_op_desc *ln_op(int axis, bool scale, bool bias) {
  pe_op_desc *op =
      ph_op("layer_norm", "X", "x", NULL, "Y", "y", "Mean", "mean", "Variance", "var", NULL);
  if (scale) PE_CK_OK(pe_op_input1(op, "Scale", "scale"));
  if (bias) PE_CK_OK(pe_op_input1(op, "Bias", "bias"));
  PE_CK_OK(pe_op_set_int(op, "begin_norm_axis", axis));
  PE_CK_OK(pe_op_set_float(op, "epsilon", 1e-5f));
  return op;
}

/* Reference over x viewed as [left, right]. */
static void ln_ref(const float *x, const float *scale, const float *bias, int64_t left,
                   int64_t right, float *y, float *mean, float *var) {
  for (int64_t r = 0; r < left; r++) {
    const float *row = x + r * right;
    double m = 0, v = 0;
    for (int64_t i = 0; i < right; i++) m += row[i];
    m /= (double)right;
    for (int64_t i = 0; i < right; i++) v += (row[i] - m) * (row[i] - m);
    v /= (double)right;
    mean[r] = (float)m;
    var[r] = (float)v;
    for (int64_t i = 0; i < right; i++) {
      double n = (row[i] - m) / sqrt(v + 1e-5);
      y[r * right + i] = (float)(n * (scale ? scale[i] : 1.0) + (bias ? bias[i] : 0.0));
    }
  }
}

static void check_values(pe_shape xs, int axis, bool with_scale, bool with_bias) {
  pe_scope *s = pe_scope_new(NULL);
  pe_tensor *x = ph_set_uniform(s, "x", xs, -2, 2, 11);
  int64_t left = pe_shape_prod(&xs, 0, axis), right = pe_shape_prod(&xs, axis, xs.ndim);
  pe_tensor *sc = ph_set_uniform(s, "scale", PE_SHAPE(right), 0.5f, 1.5f, 12);
  pe_tensor *bi = ph_set_uniform(s, "bias", PE_SHAPE(right), -1, 1, 13);
  pe_op_desc *op = ln_op(axis, with_scale, with_bias);
  PE_CK_OK(ph_run_op(s, op, NULL));
  float *y = malloc((size_t)(left * right) * sizeof(float));
  float *mean = malloc((size_t)left * sizeof(float)), *var = malloc((size_t)left * sizeof(float));
  ln_ref(pe_f32(x), with_scale ? pe_f32(sc) : NULL, with_bias ? pe_f32(bi) : NULL, left, right, y,
         mean, var);
  expect_f32(s, "y", xs, y, 1e-4);
  expect_f32(s, "mean", PE_SHAPE(left), mean, 1e-5);
  expect_f32(s, "var", PE_SHAPE(left), var, 1e-5);
  free(y);
  free(mean);
  free(var);
  pe_op_desc_free(op);
  pe_scope_free(s);
}

START_TEST(values_match_reference) {
  check_values(PE_SHAPE(4, 6), 1, true, true);
  check_values(PE_SHAPE(2, 3, 20), 2, true, true);
  check_values(PE_SHAPE(2, 3, 20), 1, true, true);
  check_values(PE_SHAPE(3, 5, 4), 2, false, false);
  check_values(PE_SHAPE(3, 5, 4), 2, true, false);
  check_values(PE_SHAPE(3, 5, 4), 2, false, true);
}
END_TEST

START_TEST(infer_with_batch_dim) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_meta(s, "x", PE_F32, PE_SHAPE(-1, 7, 16));
  ph_set_meta(s, "scale", PE_F32, PE_SHAPE(16));
  pe_op_desc *op = ln_op(2, true, false);
  pe_meta m[3];
  PE_CK_OK(ph_infer_op(s, op, m, 3));
  expect_shape(&m[0].shape, PE_SHAPE(-1, 7, 16));
  expect_shape(&m[1].shape, PE_SHAPE(-1));
  expect_shape(&m[2].shape, PE_SHAPE(-1));
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(grads_match_numeric) {
  const int axes[] = {1, 2};
  for (int a = 0; a < 2; a++)
    for (int sb = 0; sb < 2; sb++) {
      pe_scope *s = pe_scope_new(NULL);
      ph_set_uniform(s, "x", PE_SHAPE(2, 3, 5), -1, 1, 21);
      int64_t right = axes[a] == 1 ? 15 : 5;
      ph_set_uniform(s, "scale", PE_SHAPE(right), 0.5f, 1.5f, 22);
      ph_set_uniform(s, "bias", PE_SHAPE(right), -1, 1, 23);
      pe_op_desc *op = ln_op(axes[a], sb, sb);
      const char *outs[] = {"y"}, *wrt[] = {"x", "scale", "bias"};
      ph_grad_report r = expect_grad(s, op, outs, 1, wrt, sb ? 3 : 1, 1e-2, 64, 2e-2);
      ck_assert_int_eq(r.checked, sb ? 30 + 2 * (int)right : 30);
      pe_op_desc_free(op);
      pe_scope_free(s);
    }
}
END_TEST

START_TEST(grad_without_dy_is_zero) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(2, 4), -1, 1, 31);
  ph_set_f32(s, "scale", PE_SHAPE(4), (float[]){1, 1, 1, 1});
  ph_set_f32(s, "mean", PE_SHAPE(2), (float[]){0, 0});
  ph_set_f32(s, "var", PE_SHAPE(2), (float[]){1, 1});
  pe_tensor *dx = ph_set_f32(s, "dx", PE_SHAPE(2, 4), (float[]){9, 9, 9, 9, 9, 9, 9, 9});
  (void)dx;
  pe_op_desc *op = ph_op("layer_norm_grad", "X", "x", "Scale", "scale", "Mean", "mean", "Variance",
                         "var", NULL, "X@GRAD", "dx", "Scale@GRAD", "dscale", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "dx", PE_SHAPE(2, 4), (float[8]){0}, 0);
  expect_f32(s, "dscale", PE_SHAPE(4), (float[4]){0}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(infer_errors_name_op_var_shape) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_meta(s, "x", PE_F32, PE_SHAPE(-1, 8));
  ph_set_meta(s, "scale", PE_F32, PE_SHAPE(6));
  ph_set_meta(s, "bias", PE_F32, PE_SHAPE(8, 1));
  pe_meta m[3];
  pe_op_desc *op = ln_op(1, true, false);
  expect_errors(ph_infer_op(s, op, m, 3), PE_ESHAPE, "op #0 (layer_norm)",
                "input Scale 'scale' [6] must be [8]", "X 'x' [-1,8] from dim 1", NULL);
  pe_op_desc_free(op);
  op = ln_op(1, false, true);
  expect_errors(ph_infer_op(s, op, m, 3), PE_ESHAPE, "input Bias 'bias' [8,1] must be [8]", NULL);
  pe_op_desc_free(op);
  op = ln_op(2, false, false);
  expect_errors(ph_infer_op(s, op, m, 3), PE_EATTR, "op #0 (layer_norm)",
                "begin_norm_axis 2 is outside [1, 2) for X 'x' [-1,8]", NULL);
  pe_op_desc_free(op);
  ph_set_meta(s, "x", PE_I64, PE_SHAPE(2, 8));
  op = ln_op(1, false, false);
  expect_errors(ph_infer_op(s, op, m, 3), PE_EDTYPE, "input X 'x' [2,8] has dtype i64", NULL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *layer_norm_suite(void) {
  Suite *s = suite_create("ops_layer_norm");
  TCase *tc = tcase_create("layer_norm");
  tcase_add_test(tc, values_match_reference);
  tcase_add_test(tc, infer_with_batch_dim);
  tcase_add_test(tc, grads_match_numeric);
  tcase_add_test(tc, grad_without_dy_is_zero);
  tcase_add_test(tc, infer_errors_name_op_var_shape);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(layer_norm_suite)
