/* Losses: softmax_with_cross_entropy (hard and soft labels, large logits,
 * bad labels), cross_entropy, mean, their gradients and compile-time
 * inference. Expected values were worked out by hand (and double-checked in
 * double precision); they are compared with 1e-5 absolute tolerance, a few f32
 * ulps at these magnitudes.
 *
 * Gradient tolerance: f32 central differences with eps 1e-3. The forward
 * values are f32 (relative rounding ~6e-8), so the loss difference carries
 * ~1e-7 absolute noise, ~1e-4 after dividing by 2*eps; truncation error is
 * eps^2 * f''' / 6, below 1e-5 for logits in [-2, 2] and probabilities in
 * [0.2, 1). max_err <= 1e-2 (relative to max(1, |grad|)) has a wide margin
 * and still catches a wrong term (errors of order 1). */
#include <check.h>
#include <math.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

#define GRAD_EPS 1e-3
#define GRAD_TOL 1e-2
#define VAL_TOL 1e-5

static void grad_ok(pe_scope *s, const pe_op_desc *op, const char *const *outs, int n_outs,
                    const char *wrt) {
  expect_grad(s, op, outs, n_outs, &wrt, 1, GRAD_EPS, 64, GRAD_TOL);
}

static pe_op_desc *swce_op(bool soft) {
  pe_op_desc *op = ph_op("softmax_with_cross_entropy", "Logits", "logits", "Label", "label", NULL,
                         "Softmax", "sm", "Loss", "loss", NULL);
  if (soft) PE_CK_OK(pe_op_set_bool(op, "soft_label", true));
  return op;
}

/* softmax([1,2,3]) = e^{x-3} / (1 + e^-1 + e^-2) = [0.0900306, 0.2447285, 0.6652410];
 * log-sum-exp = 3 + log(1.5032147) = 3.4076060. */
static const float SM123[3] = {0.09003057f, 0.24472847f, 0.66524096f};
#define LSE123 3.40760596

/* --- forward values ------------------------------------------------------------------ */

START_TEST(swce_hard_labels) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "logits", PE_SHAPE(2, 3), (float[]){1, 2, 3, 1, 1, 1});
  ph_set_i64(s, "label", PE_SHAPE(2, 1), (int64_t[]){2, 0});
  pe_op_desc *op = swce_op(false);
  PE_CK_OK(ph_run_op(s, op, NULL));
  const float third = 1.0f / 3;
  expect_f32(s, "sm", PE_SHAPE(2, 3), (float[]){SM123[0], SM123[1], SM123[2], third, third, third},
             VAL_TOL);
  /* row 0: lse - x[2] = 0.4076060; row 1: log 3. */
  expect_f32(s, "loss", PE_SHAPE(2, 1), (float[]){(float)(LSE123 - 3), 1.09861229f}, VAL_TOL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(swce_large_logits_are_stable) {
  pe_scope *s = pe_scope_new(NULL);
  /* Row 0 is [1,2,3] shifted by 1000 (same softmax); row 1 spans 2000. */
  ph_set_f32(s, "logits", PE_SHAPE(3, 3),
             (float[]){1001, 1002, 1003, -1000, 0, 1000, -1000, 0, 1000});
  ph_set_i64(s, "label", PE_SHAPE(3, 1), (int64_t[]){2, 0, 2});
  pe_op_desc *op = swce_op(false);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "sm", PE_SHAPE(3, 3), (float[]){SM123[0], SM123[1], SM123[2], 0, 0, 1, 0, 0, 1},
             VAL_TOL);
  /* row 1: log(1 + e^-1000 + e^-2000) + 2000 = 2000; row 2: 0. */
  expect_f32(s, "loss", PE_SHAPE(3, 1), (float[]){(float)(LSE123 - 3), 2000, 0}, 1e-4);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(swce_soft_labels) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "logits", PE_SHAPE(1, 3), (float[]){1, 2, 3});
  ph_set_f32(s, "label", PE_SHAPE(1, 3), (float[]){0.2f, 0.3f, 0.5f});
  pe_op_desc *op = swce_op(true);
  PE_CK_OK(ph_run_op(s, op, NULL));
  /* sum_j l_j (lse - x_j) = 0.2*2.4076060 + 0.3*1.4076060 + 0.5*0.4076060 */
  expect_f32(s, "loss", PE_SHAPE(1, 1), (float[]){1.10760596f}, VAL_TOL);
  expect_f32(s, "sm", PE_SHAPE(1, 3), SM123, VAL_TOL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(swce_bad_label_is_an_error) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "logits", PE_SHAPE(3, 3), (float[]){1, 2, 3, 1, 2, 3, 1, 2, 3});
  ph_set_i64(s, "label", PE_SHAPE(3, 1), (int64_t[]){0, 2, 3});
  pe_op_desc *op = swce_op(false);
  expect_error(ph_run_op(s, op, NULL), PE_EINVAL,
               "Label 'label' row 2 has value 3, outside [0, 3)");
  ph_set_i64(s, "label", PE_SHAPE(3, 1), (int64_t[]){0, -1, 1});
  expect_error(ph_run_op(s, op, NULL), PE_EINVAL, "row 1 has value -1");
  pe_op_desc_free(op);
  /* cross_entropy checks the same way. */
  op = ph_op("cross_entropy", "X", "logits", "Label", "label", NULL, "Y", "y", NULL);
  expect_error(ph_run_op(s, op, NULL), PE_EINVAL, "row 1 has value -1");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(cross_entropy_values) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(3, 3), (float[]){0.2f, 0.3f, 0.5f, 0.1f, 0.8f, 0.1f, 0, 0.5f, 0.5f});
  ph_set_i64(s, "label", PE_SHAPE(3, 1), (int64_t[]){2, 1, 0});
  pe_op_desc *op = ph_op("cross_entropy", "X", "x", "Label", "label", NULL, "Y", "y", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  /* -log 0.5, -log 0.8, and a zero probability clamped to 1e-20: -log 1e-20. */
  expect_f32(s, "y", PE_SHAPE(3, 1), (float[]){0.69314718f, 0.22314355f, 46.0517019f}, 1e-4);
  ph_set_f32(s, "label", PE_SHAPE(3, 3), (float[]){0, 0.5f, 0.5f, 0, 1, 0, 0, 1, 0});
  PE_CK_OK(pe_op_set_bool(op, "soft_label", true));
  PE_CK_OK(ph_run_op(s, op, NULL));
  /* row 0: -(0.5 log 0.3 + 0.5 log 0.5) */
  expect_f32(s, "y", PE_SHAPE(3, 1), (float[]){0.94855999f, 0.22314355f, 0.69314718f}, VAL_TOL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(mean_values) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(2, 3), (float[]){1, 2, 3, 4, 5, 6});
  pe_op_desc *op = ph_op("mean", "X", "x", NULL, "Out", "m", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "m", PE_SHAPE(1), (float[]){3.5f}, 0);
  /* Large enough for the threaded sum: i % 10 averages to 4.5 exactly. */
  pe_tensor *x = ph_set_f32(s, "x", PE_SHAPE(100000), NULL);
  for (int i = 0; i < 100000; i++) pe_f32(x)[i] = (float)(i % 10);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "m", PE_SHAPE(1), (float[]){4.5f}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* --- gradients ------------------------------------------------------------------------- */

START_TEST(grads_swce) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "logits", PE_SHAPE(4, 5), -2, 2, 41);
  ph_set_i64(s, "label", PE_SHAPE(4, 1), (int64_t[]){0, 4, 2, 2});
  pe_op_desc *op = swce_op(false);
  grad_ok(s, op, (const char *[]){"loss"}, 1, "logits");
  /* Softmax used downstream too: its gradient adds the softmax backward. */
  grad_ok(s, op, (const char *[]){"loss", "sm"}, 2, "logits");
  grad_ok(s, op, (const char *[]){"sm"}, 1, "logits");
  pe_op_desc_free(op);
  /* Soft labels, rows not summing to 1 (the exact gradient form). */
  ph_set_uniform(s, "label", PE_SHAPE(4, 5), 0, 0.5f, 42);
  op = swce_op(true);
  grad_ok(s, op, (const char *[]){"loss"}, 1, "logits");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(grads_cross_entropy_and_mean) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(4, 3), 0.2f, 1, 51);
  ph_set_i64(s, "label", PE_SHAPE(4, 1), (int64_t[]){1, 0, 2, 1});
  pe_op_desc *op = ph_op("cross_entropy", "X", "x", "Label", "label", NULL, "Y", "y", NULL);
  grad_ok(s, op, (const char *[]){"y"}, 1, "x");
  ph_set_uniform(s, "label", PE_SHAPE(4, 3), 0, 1, 52);
  PE_CK_OK(pe_op_set_bool(op, "soft_label", true));
  grad_ok(s, op, (const char *[]){"y"}, 1, "x");
  pe_op_desc_free(op);

  ph_set_uniform(s, "x", PE_SHAPE(3, 7), -1, 1, 53);
  op = ph_op("mean", "X", "x", NULL, "Out", "m", NULL);
  grad_ok(s, op, (const char *[]){"m"}, 1, "x");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* Hand values of the swce gradient, and a pruned Loss@GRAD read as zeros. */
START_TEST(swce_grad_values_and_absent_inputs) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "logits", PE_SHAPE(1, 3), (float[]){1, 2, 3});
  ph_set_i64(s, "label", PE_SHAPE(1, 1), (int64_t[]){1});
  ph_set_f32(s, "sm", PE_SHAPE(1, 3), SM123);
  ph_set_f32(s, "dloss", PE_SHAPE(1, 1), (float[]){2});
  pe_op_desc *op = ph_op("softmax_with_cross_entropy_grad", "Logits", "logits", "Label", "label",
                         "Softmax", "sm", "Loss@GRAD", "dloss", NULL, "Logits@GRAD", "dl", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  /* 2 * (softmax - onehot(1)) */
  expect_f32(s, "dl", PE_SHAPE(1, 3), (float[]){2 * SM123[0], 2 * (SM123[1] - 1), 2 * SM123[2]},
             VAL_TOL);
  pe_op_desc_free(op);
  op = ph_op("softmax_with_cross_entropy_grad", "Logits", "logits", "Label", "label", "Softmax",
             "sm", NULL, "Logits@GRAD", "dl", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "dl", PE_SHAPE(1, 3), (float[]){0, 0, 0}, 0);
  pe_op_desc_free(op);
  /* mean_grad: dOut / n everywhere. */
  ph_set_f32(s, "x", PE_SHAPE(2, 2), (float[]){1, 2, 3, 4});
  ph_set_f32(s, "dm", PE_SHAPE(1), (float[]){2});
  op = ph_op("mean_grad", "X", "x", "Out@GRAD", "dm", NULL, "X@GRAD", "dx", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "dx", PE_SHAPE(2, 2), (float[]){0.5f, 0.5f, 0.5f, 0.5f}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* --- compile-time inference ------------------------------------------------------------ */

START_TEST(infer_with_batch_dim) {
  pe_scope *s = pe_scope_new(NULL);
  pe_meta m[2];
  ph_set_meta(s, "logits", PE_F32, PE_SHAPE(-1, 10));
  ph_set_meta(s, "label", PE_I64, PE_SHAPE(-1, 1));
  pe_op_desc *op = swce_op(false);
  PE_CK_OK(ph_infer_op(s, op, m, 2));
  expect_shape(&m[0].shape, PE_SHAPE(-1, 10));
  expect_shape(&m[1].shape, PE_SHAPE(-1, 1));
  ck_assert_int_eq(m[1].dtype, PE_F32);
  pe_op_desc_free(op);

  ph_set_meta(s, "label", PE_F32, PE_SHAPE(-1, 10));
  op = swce_op(true);
  PE_CK_OK(ph_infer_op(s, op, m, 2));
  expect_shape(&m[1].shape, PE_SHAPE(-1, 1));
  pe_op_desc_free(op);

  ph_set_meta(s, "label", PE_I64, PE_SHAPE(-1, 1));
  op = ph_op("cross_entropy", "X", "logits", "Label", "label", NULL, "Y", "y", NULL);
  PE_CK_OK(ph_infer_op(s, op, m, 2));
  expect_shape(&m[0].shape, PE_SHAPE(-1, 1));
  pe_op_desc_free(op);

  op = ph_op("mean", "X", "logits", NULL, "Out", "m", NULL);
  PE_CK_OK(ph_infer_op(s, op, m, 2));
  expect_shape(&m[0].shape, PE_SHAPE(1));
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(infer_errors_name_vars_and_shapes) {
  pe_scope *s = pe_scope_new(NULL);
  pe_meta m[2];
  ph_set_meta(s, "logits", PE_F32, PE_SHAPE(-1, 10));
  ph_set_meta(s, "label", PE_I64, PE_SHAPE(-1, 2));
  pe_op_desc *op = swce_op(false);
  expect_error(ph_infer_op(s, op, m, 2), PE_ESHAPE,
               "Label 'label' [-1,2] does not fit Logits 'logits' [-1,10]");
  ph_set_meta(s, "label", PE_F32, PE_SHAPE(-1, 1));
  expect_error(ph_infer_op(s, op, m, 2), PE_EDTYPE, "Label 'label' [-1,1] has dtype f32");
  ph_set_meta(s, "label", PE_I64, PE_SHAPE(-1, 1));
  PE_CK_OK(pe_op_set_int(op, "axis", 0));
  expect_error(ph_infer_op(s, op, m, 2), PE_EATTR, "only the last axis");
  pe_op_desc_free(op);

  ph_set_meta(s, "label", PE_F32, PE_SHAPE(-1, 9));
  op = swce_op(true);
  expect_error(ph_infer_op(s, op, m, 2), PE_ESHAPE, "Label 'label' [-1,9]");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *loss_suite(void) {
  Suite *s = suite_create("ops_loss");
  TCase *tc = tcase_create("loss");
  tcase_add_test(tc, swce_hard_labels);
  tcase_add_test(tc, swce_large_logits_are_stable);
  tcase_add_test(tc, swce_soft_labels);
  tcase_add_test(tc, swce_bad_label_is_an_error);
  tcase_add_test(tc, cross_entropy_values);
  tcase_add_test(tc, mean_values);
  tcase_add_test(tc, grads_swce);
  tcase_add_test(tc, grads_cross_entropy_and_mean);
  tcase_add_test(tc, swce_grad_values_and_absent_inputs);
  tcase_add_test(tc, infer_with_batch_dim);
  tcase_add_test(tc, infer_errors_name_vars_and_shapes);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(loss_suite)
