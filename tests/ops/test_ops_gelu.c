/* gelu: values against the erf formula (approximate false, the default) and
 * the tanh formula (approximate true), numeric gradients of both, and a
 * pruned Out@GRAD.
 *
 * Tolerances: oneDNN's f32 gelu is within a few ulps of the double
 * formulas on [-4, 4]; 1e-5 absolute is a wide margin. Gradients: central
 * differences (eps 1e-3) in f32, 1e-2 relative. */
#include <check.h>
#include <math.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

static pe_op_desc *gelu_op(int approximate) {
  pe_op_desc *op = ph_op("gelu", "X", "x", NULL, "Out", "out", NULL);
  if (approximate >= 0) PE_CK_OK(pe_op_set_bool(op, "approximate", approximate));
  return op;
}

static double gelu_erf(double x) {
  return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
}
static double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

START_TEST(values_match_formulas) {
  for (int mode = -1; mode <= 1; mode++) {
    pe_scope *s = pe_scope_new(NULL);
    pe_tensor *x = ph_set_uniform(s, "x", PE_SHAPE(3, 40), -4, 4, 5);
    pe_op_desc *op = gelu_op(mode);
    PE_CK_OK(ph_run_op(s, op, NULL));
    float want[120];
    for (int i = 0; i < 120; i++)
      want[i] = (float)(mode == 1 ? gelu_tanh(pe_f32(x)[i]) : gelu_erf(pe_f32(x)[i]));
    expect_f32(s, "out", PE_SHAPE(3, 40), want, 1e-5);
    pe_op_desc_free(op);
    pe_scope_free(s);
  }
}
END_TEST

/* The two formulas differ by up to ~5e-4 near |x| = 2: each mode must pick
 * its own, not the other. */
START_TEST(modes_differ) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(1), (float[]){2.0f});
  pe_op_desc *op = gelu_op(1);
  PE_CK_OK(ph_run_op(s, op, NULL));
  float t = pe_f32(ph_get(s, "out"))[0];
  pe_op_desc_free(op);
  op = gelu_op(0);
  PE_CK_OK(ph_run_op(s, op, NULL));
  float e = pe_f32(ph_get(s, "out"))[0];
  pe_op_desc_free(op);
  ck_assert_msg(fabs(t - gelu_tanh(2.0)) < 1e-6 && fabs(e - gelu_erf(2.0)) < 1e-6,
                "tanh %.9g erf %.9g", t, e);
  ck_assert(fabs(t - e) > 1e-5);
  pe_scope_free(s);
}
END_TEST

START_TEST(grads_match_numeric) {
  for (int mode = 0; mode <= 1; mode++) {
    pe_scope *s = pe_scope_new(NULL);
    ph_set_uniform(s, "x", PE_SHAPE(4, 8), -3, 3, 7);
    pe_op_desc *op = gelu_op(mode);
    const char *outs[] = {"out"}, *wrt[] = {"x"};
    ph_grad_report r = expect_grad(s, op, outs, 1, wrt, 1, 1e-3, 64, 1e-2);
    ck_assert_int_eq(r.checked, 32);
    pe_op_desc_free(op);
    pe_scope_free(s);
  }
}
END_TEST

START_TEST(grad_without_dout_is_zero) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(3), (float[]){1, 2, 3});
  ph_set_f32(s, "dx", PE_SHAPE(3), (float[]){7, 7, 7});
  pe_op_desc *op = ph_op("gelu_grad", "X", "x", NULL, "X@GRAD", "dx", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "dx", PE_SHAPE(3), (float[3]){0}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(int_input_is_refused) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_i64(s, "x", PE_SHAPE(2), (int64_t[]){1, 2});
  pe_op_desc *op = gelu_op(0);
  expect_errors(ph_run_op(s, op, NULL), PE_EDTYPE, "op #0 (gelu)", "input X 'x' [2] has dtype i64",
                NULL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *gelu_suite(void) {
  Suite *s = suite_create("ops_gelu");
  TCase *tc = tcase_create("gelu");
  tcase_add_test(tc, values_match_formulas);
  tcase_add_test(tc, modes_differ);
  tcase_add_test(tc, grads_match_numeric);
  tcase_add_test(tc, grad_without_dout_is_zero);
  tcase_add_test(tc, int_input_is_refused);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(gelu_suite)
