/* smooth_l1_loss: values against the closed form on both sides of the
 * threshold 1 / sigma^2, with and without InsideWeight / OutsideWeight,
 * rows summed into Out [N, 1]; Diff; numeric gradients of X and Y (also
 * through Diff); a pruned Out@GRAD; infer errors naming the op, the
 * variables and their shapes.
 *
 * Tolerances: f32 closed forms of inputs in [-3, 3], rows of 4: 1e-5.
 * Gradients: central differences (eps 1e-3) with differences kept 0.05
 * away from the kink at |d| = 1 / sigma^2: 1e-2, as the pointwise losses. */
#include <check.h>
#include <math.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

static pe_op_desc *sl_op(float sigma, bool weights) {
  pe_op_desc *op = weights ? ph_op("smooth_l1_loss", "X", "x", "Y", "y", "InsideWeight", "iw",
                                   "OutsideWeight", "ow", NULL, "Diff", "diff", "Out", "out", NULL)
                           : ph_op("smooth_l1_loss", "X", "x", "Y", "y", NULL, "Diff", "diff",
                                   "Out", "out", NULL);
  PE_CK_OK(pe_op_set_float(op, "sigma", sigma));
  return op;
}

static double ref_f(double d, double sigma) {
  double beta = 1 / (sigma * sigma), a = fabs(d);
  return a < beta ? 0.5 * d * d / beta : a - 0.5 * beta;
}

START_TEST(values) {
  pe_scope *s = pe_scope_new(NULL);
  /* sigma 2: threshold 0.25; d = x - y */
  ph_set_f32(s, "x", PE_SHAPE(2, 2), (float[]){0.1f, 1, -2, 0});
  ph_set_f32(s, "y", PE_SHAPE(2, 2), (float[]){0, 0, 0, 0.2f});
  pe_op_desc *op = sl_op(2, false);
  PE_CK_OK(ph_run_op(s, op, NULL));
  /* 0.5 * 4 * 0.01 = 0.02; 1 - 0.125; 2 - 0.125; 0.5 * 4 * 0.04 = 0.08 */
  expect_f32(s, "out", PE_SHAPE(2, 1), (float[]){0.02f + 0.875f, 1.875f + 0.08f}, 1e-6);
  expect_f32(s, "diff", PE_SHAPE(2, 2), (float[]){0.1f, 1, -2, -0.2f}, 1e-7);
  pe_op_desc_free(op);
  /* weights, rows of [2, 2] (rank 3), sigma 1 */
  const float *x = pe_f32(ph_set_uniform(s, "x", PE_SHAPE(3, 2, 2), -3, 3, 1));
  const float *y = pe_f32(ph_set_uniform(s, "y", PE_SHAPE(3, 2, 2), -3, 3, 2));
  const float *iw = pe_f32(ph_set_uniform(s, "iw", PE_SHAPE(3, 2, 2), 0, 2, 3));
  const float *ow = pe_f32(ph_set_uniform(s, "ow", PE_SHAPE(3, 2, 2), 0, 2, 4));
  float want[3] = {0};
  for (int i = 0; i < 12; i++) want[i / 4] += (float)(ow[i] * ref_f(iw[i] * (x[i] - y[i]), 1));
  op = sl_op(1, true);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(3, 1), want, 1e-5);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* x uniform, y = x + r with |r| (times the inside weight) away from beta. */
static void set_inputs(pe_scope *s, int n, float beta, bool weights) {
  const float *x = pe_f32(ph_set_uniform(s, "x", PE_SHAPE(n / 4, 4), -3, 3, 5));
  pe_tensor *y = ph_set_uniform(s, "y", PE_SHAPE(n / 4, 4), -1, 1, 6);
  pe_tensor *iw = ph_set_uniform(s, "iw", PE_SHAPE(n / 4, 4), 0.5f, 1.5f, 7);
  ph_set_uniform(s, "ow", PE_SHAPE(n / 4, 4), 0.5f, 1.5f, 8);
  for (int i = 0; i < n; i++) {
    float w = weights ? pe_f32(iw)[i] : 1, r = pe_f32(y)[i];
    if (fabsf(fabsf(w * r) - beta) < 0.05f) r = r < 0 ? r - 0.2f : r + 0.2f;
    pe_f32(y)[i] = x[i] + r;
  }
}

START_TEST(grads) {
  pe_scope *s = pe_scope_new(NULL);
  const char *outs[] = {"out"}, *both[] = {"out", "diff"}, *wrt[] = {"x", "y"};
  for (int weights = 0; weights < 2; weights++) {
    set_inputs(s, 32, 0.25f, weights);
    pe_op_desc *op = sl_op(2, weights);
    ck_assert_int_eq(expect_grad(s, op, outs, 1, wrt, 2, 1e-3, 64, 1e-2).checked, 64);
    ck_assert_int_eq(expect_grad(s, op, both, 2, wrt, 2, 1e-3, 64, 1e-2).checked, 64);
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

START_TEST(grad_without_dout_is_zero) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(2, 1), (float[]){1, 2});
  ph_set_f32(s, "y", PE_SHAPE(2, 1), (float[]){3, 4});
  ph_set_f32(s, "dx", PE_SHAPE(2, 1), (float[]){5, 5});
  ph_set_f32(s, "dy", PE_SHAPE(2, 1), (float[]){5, 5});
  pe_op_desc *op =
      ph_op("smooth_l1_loss_grad", "X", "x", "Y", "y", NULL, "X@GRAD", "dx", "Y@GRAD", "dy", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "dx", PE_SHAPE(2, 1), (float[2]){0}, 0);
  expect_f32(s, "dy", PE_SHAPE(2, 1), (float[2]){0}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(bad_inputs_are_errors) {
  pe_scope *s = pe_scope_new(NULL);
  pe_meta m[2];
  ph_set_meta(s, "x", PE_F32, PE_SHAPE(-1, 3));
  ph_set_meta(s, "y", PE_F32, PE_SHAPE(-1, 2));
  pe_op_desc *op = sl_op(1, false);
  expect_errors(ph_infer_op(s, op, m, 2), PE_ESHAPE, "op #0 (smooth_l1_loss)",
                "input Y 'y' shape [-1,2] does not match X 'x' shape [-1,3]", NULL);
  ph_set_meta(s, "y", PE_F32, PE_SHAPE(-1, 3));
  PE_CK_OK(ph_infer_op(s, op, m, 2));
  expect_shape(&m[1].shape, PE_SHAPE(-1, 1));
  pe_op_desc_free(op);
  op = sl_op(0, false);
  expect_errors(ph_infer_op(s, op, m, 2), PE_EATTR, "sigma 0", NULL);
  pe_op_desc_free(op);
  ph_set_meta(s, "iw", PE_F32, PE_SHAPE(-1, 3));
  ph_set_meta(s, "ow", PE_I64, PE_SHAPE(-1, 3));
  op = sl_op(1, true);
  expect_errors(ph_infer_op(s, op, m, 2), PE_EDTYPE, "'ow'", NULL);
  ph_set_meta(s, "ow", PE_F32, PE_SHAPE(3));
  expect_errors(ph_infer_op(s, op, m, 2), PE_ESHAPE,
                "input OutsideWeight 'ow' shape [3] does not match X 'x' shape [-1,3]", NULL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *smooth_l1_suite(void) {
  Suite *s = suite_create("ops_smooth_l1_loss");
  TCase *tc = tcase_create("smooth_l1_loss");
  tcase_add_test(tc, values);
  tcase_add_test(tc, grads);
  tcase_add_test(tc, grad_without_dout_is_zero);
  tcase_add_test(tc, bad_inputs_are_errors);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(smooth_l1_suite)
