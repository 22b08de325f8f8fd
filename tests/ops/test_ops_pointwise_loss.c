/* abs, square, huber_loss and sigmoid_cross_entropy_with_logits: values
 * against closed forms (huber on both sides of delta, the logistic loss at
 * logits of +-40 where a naive log(1 + exp(x)) overflows, ignore_index and
 * normalize), numeric gradients, a pruned Out@GRAD, infer errors naming
 * the op, the variables and their shapes. The regression losses of the
 * builder (mse: square of a difference, l1: abs of one) compose these.
 *
 * Tolerances: f32 closed forms of inputs in [-3, 3]: 1e-5 relative to 1.
 * Gradients: central differences (eps 1e-3) with inputs kept 0.05 away from
 * the kinks (abs at 0, huber at |r| = delta): 1e-2. */
#include <check.h>
#include <math.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

/* Inputs in [-3, 3] at least `away` from every point in kinks[]. */
static void set_away(pe_scope *s, const char *name, int n, uint64_t seed, const float *kinks,
                     int nk, float away) {
  pe_tensor *t = ph_set_uniform(s, name, PE_SHAPE(n), -3, 3, seed);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < nk; k++)
      if (fabsf(pe_f32(t)[i] - kinks[k]) < away) pe_f32(t)[i] = kinks[k] + 2 * away;
}

START_TEST(abs_square_values_and_grads) {
  pe_scope *s = pe_scope_new(NULL);
  set_away(s, "x", 40, 3, (float[]){0}, 1, 0.05f);
  const float *x = pe_f32(ph_get(s, "x"));
  float wa[40], ws[40];
  for (int i = 0; i < 40; i++) wa[i] = fabsf(x[i]), ws[i] = x[i] * x[i];
  const char *outs[] = {"out"}, *wrt[] = {"x"};
  pe_op_desc *op = ph_op("abs", "X", "x", NULL, "Out", "out", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(40), wa, 1e-6);
  ck_assert_int_eq(expect_grad(s, op, outs, 1, wrt, 1, 1e-3, 64, 1e-2).checked, 40);
  pe_op_desc_free(op);
  op = ph_op("square", "X", "x", NULL, "Out", "out", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(40), ws, 1e-5);
  ck_assert_int_eq(expect_grad(s, op, outs, 1, wrt, 1, 1e-3, 64, 1e-2).checked, 40);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static pe_op_desc *huber_op(float delta) {
  pe_op_desc *op =
      ph_op("huber_loss", "X", "x", "Y", "y", NULL, "Out", "out", "Residual", "res", NULL);
  PE_CK_OK(pe_op_set_float(op, "delta", delta));
  return op;
}

START_TEST(huber_values_and_grads) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(4, 1), (float[]){0, 1, 2, -1});
  ph_set_f32(s, "y", PE_SHAPE(4, 1), (float[]){0.5f, -2, 2, 2});
  pe_op_desc *op = huber_op(1.5f);
  PE_CK_OK(ph_run_op(s, op, NULL));
  /* r = 0.5 (quadratic), -3 and 3 (linear: 1.5 (3 - 0.75)), 0 */
  expect_f32(s, "out", PE_SHAPE(4, 1), (float[]){0.125f, 3.375f, 0, 3.375f}, 1e-6);
  expect_f32(s, "res", PE_SHAPE(4, 1), (float[]){0.5f, -3, 0, 3}, 0);
  pe_op_desc_free(op);
  /* gradients away from |y - x| = delta: y = x + r with |r| far from 1 */
  set_away(s, "x", 30, 5, NULL, 0, 0);
  set_away(s, "r", 30, 6, (float[]){-1, 1}, 2, 0.05f);
  pe_tensor *y = ph_set_f32(s, "y", PE_SHAPE(30), pe_f32(ph_get(s, "x")));
  for (int i = 0; i < 30; i++) pe_f32(y)[i] += pe_f32(ph_get(s, "r"))[i];
  op = huber_op(1.0f);
  const char *outs[] = {"out"}, *wrt[] = {"x", "y"};
  ck_assert_int_eq(expect_grad(s, op, outs, 1, wrt, 2, 1e-3, 64, 1e-2).checked, 60);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static pe_op_desc *sce_op(bool normalize, int ignore) {
  pe_op_desc *op =
      ph_op("sigmoid_cross_entropy_with_logits", "X", "x", "Label", "z", NULL, "Out", "out", NULL);
  PE_CK_OK(pe_op_set_bool(op, "normalize", normalize));
  PE_CK_OK(pe_op_set_int(op, "ignore_index", ignore));
  return op;
}

START_TEST(sigmoid_ce_values_and_grads) {
  pe_scope *s = pe_scope_new(NULL);
  const float x[] = {0, 2, -1, 40, -40, 0.5f}, z[] = {1, 0, 0.25f, 0, 1, -1};
  ph_set_f32(s, "x", PE_SHAPE(2, 3), x);
  ph_set_f32(s, "z", PE_SHAPE(2, 3), z);
  float want[6];
  for (int i = 0; i < 6; i++) {
    double p = 1 / (1 + exp(-(double)x[i]));
    want[i] = (float)(-(z[i] * log(p) + (1 - z[i]) * log1p(-p)));
  }
  /* at +-40 the naive form overflows: -log(1 - sigmoid(40)) and
   * -log(sigmoid(-40)) are 40 + log1p(exp(-40)), 40 in f32 */
  want[3] = want[4] = 40;
  want[5] = 0; /* label -1 is ignore_index */
  pe_op_desc *op = sce_op(false, -1);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(2, 3), want, 1e-5);
  pe_op_desc_free(op);
  op = sce_op(true, -1); /* 5 labels kept */
  PE_CK_OK(ph_run_op(s, op, NULL));
  for (int i = 0; i < 6; i++) want[i] /= 5;
  expect_f32(s, "out", PE_SHAPE(2, 3), want, 1e-5);
  pe_op_desc_free(op);
  ph_set_uniform(s, "x", PE_SHAPE(4, 5), -3, 3, 9);
  pe_tensor *zt = ph_set_uniform(s, "z", PE_SHAPE(4, 5), 0, 1, 10);
  pe_f32(zt)[7] = -100; /* Paddle's default ignore_index */
  const char *outs[] = {"out"}, *wrt[] = {"x"};
  for (int norm = 0; norm < 2; norm++) {
    op = sce_op(norm, -100);
    ck_assert_int_eq(expect_grad(s, op, outs, 1, wrt, 1, 1e-3, 64, 1e-2).checked, 20);
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

START_TEST(grads_without_dout_are_zero) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(2), (float[]){1, 2});
  ph_set_f32(s, "y", PE_SHAPE(2), (float[]){3, 4});
  ph_set_f32(s, "dx", PE_SHAPE(2), (float[]){5, 5});
  ph_set_f32(s, "dy", PE_SHAPE(2), (float[]){5, 5});
  pe_op_desc *op =
      ph_op("huber_loss_grad", "X", "x", "Y", "y", NULL, "X@GRAD", "dx", "Y@GRAD", "dy", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "dx", PE_SHAPE(2), (float[2]){0}, 0);
  expect_f32(s, "dy", PE_SHAPE(2), (float[2]){0}, 0);
  pe_op_desc_free(op);
  ph_set_f32(s, "dx", PE_SHAPE(2), (float[]){5, 5});
  op = ph_op("sigmoid_cross_entropy_with_logits_grad", "X", "x", "Label", "y", NULL, "X@GRAD", "dx",
             NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "dx", PE_SHAPE(2), (float[2]){0}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(bad_inputs_are_errors) {
  pe_scope *s = pe_scope_new(NULL);
  pe_meta m[2];
  ph_set_meta(s, "x", PE_F32, PE_SHAPE(-1, 1));
  ph_set_meta(s, "y", PE_F32, PE_SHAPE(-1, 2));
  pe_op_desc *op = huber_op(1);
  expect_errors(ph_infer_op(s, op, m, 2), PE_ESHAPE, "op #0 (huber_loss)",
                "input Y 'y' shape [-1,2] does not match X 'x' shape [-1,1]", NULL);
  pe_op_desc_free(op);
  ph_set_meta(s, "y", PE_F32, PE_SHAPE(-1, 1));
  op = huber_op(0);
  expect_errors(ph_infer_op(s, op, m, 2), PE_EATTR, "op #0 (huber_loss)", "delta 0", NULL);
  pe_op_desc_free(op);
  ph_set_meta(s, "z", PE_I64, PE_SHAPE(-1, 1));
  op = sce_op(false, -100);
  expect_errors(ph_infer_op(s, op, m, 2), PE_EDTYPE, "op #0 (sigmoid_cross_entropy_with_logits)",
                "'z'", NULL);
  pe_op_desc_free(op);
  ph_set_meta(s, "z", PE_F32, PE_SHAPE(3));
  op = sce_op(false, -100);
  expect_errors(ph_infer_op(s, op, m, 2), PE_ESHAPE,
                "input Label 'z' shape [3] does not match X 'x' shape [-1,1]", NULL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *pointwise_loss_suite(void) {
  Suite *s = suite_create("ops_pointwise_loss");
  TCase *tc = tcase_create("pointwise_loss");
  tcase_add_test(tc, abs_square_values_and_grads);
  tcase_add_test(tc, huber_values_and_grads);
  tcase_add_test(tc, sigmoid_ce_values_and_grads);
  tcase_add_test(tc, grads_without_dout_are_zero);
  tcase_add_test(tc, bad_inputs_are_errors);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(pointwise_loss_suite)
