/* transpose2: values against index arithmetic (rank 2 to 4, i64 too),
 * XShape's shape, numeric gradients, a pruned Out@GRAD, attribute errors
 * naming the op, the variable and the shape.
 *
 * Gradient tolerance: the op moves values, so central differences (eps
 * 1e-3) are exact up to f32 rounding of the weighted loss; 1e-2 is wide. */
#include <check.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

static pe_op_desc *tr_op(int n, const int64_t *axis) {
  pe_op_desc *op = ph_op("transpose2", "X", "x", NULL, "Out", "out", "XShape", "xshape", NULL);
  PE_CK_OK(pe_op_set_ints(op, "axis", n, axis));
  return op;
}

START_TEST(values_match_index_arithmetic) {
  pe_scope *s = pe_scope_new(NULL);
  float x[120];
  for (int i = 0; i < 120; i++) x[i] = (float)i;
  ph_set_f32(s, "x", PE_SHAPE(2, 3, 4, 5), x);
  pe_op_desc *op = tr_op(4, (int64_t[]){0, 2, 1, 3});
  PE_CK_OK(ph_run_op(s, op, NULL));
  float want[120];
  for (int a = 0; a < 2; a++)
    for (int b = 0; b < 4; b++)
      for (int c = 0; c < 3; c++)
        for (int d = 0; d < 5; d++)
          want[((a * 4 + b) * 3 + c) * 5 + d] = x[((a * 3 + c) * 4 + b) * 5 + d];
  expect_f32(s, "out", PE_SHAPE(2, 4, 3, 5), want, 0);
  expect_shape(&ph_get(s, "xshape")->shape, PE_SHAPE(0, 2, 3, 4, 5));
  pe_op_desc_free(op);
  op = tr_op(4, (int64_t[]){3, 2, 1, 0});
  PE_CK_OK(ph_run_op(s, op, NULL));
  for (int a = 0; a < 2; a++)
    for (int b = 0; b < 3; b++)
      for (int c = 0; c < 4; c++)
        for (int d = 0; d < 5; d++)
          want[((d * 4 + c) * 3 + b) * 2 + a] = x[((a * 3 + b) * 4 + c) * 5 + d];
  expect_f32(s, "out", PE_SHAPE(5, 4, 3, 2), want, 0);
  pe_op_desc_free(op);
  ph_set_i64(s, "x", PE_SHAPE(2, 3), (int64_t[]){1, 2, 3, 4, 5, 6});
  op = tr_op(2, (int64_t[]){1, 0});
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *o = ph_get(s, "out");
  expect_shape(&o->shape, PE_SHAPE(3, 2));
  const int64_t wi[] = {1, 4, 2, 5, 3, 6};
  for (int i = 0; i < 6; i++) ck_assert_int_eq(pe_i64(o)[i], wi[i]);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(grads_match_numeric) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(2, 3, 4), -1, 1, 51);
  const char *outs[] = {"out"}, *wrt[] = {"x"};
  const int64_t perms[3][3] = {{2, 0, 1}, {1, 2, 0}, {0, 2, 1}};
  for (int p = 0; p < 3; p++) {
    pe_op_desc *op = tr_op(3, perms[p]);
    ph_grad_report r = expect_grad(s, op, outs, 1, wrt, 1, 1e-3, 64, 1e-2);
    ck_assert_int_eq(r.checked, 24);
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

START_TEST(grad_without_dout_is_zero) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(2), (float[]){1, 2});
  ph_set_f32(s, "dx", PE_SHAPE(2), (float[]){5, 5});
  pe_op_desc *op = ph_op("transpose2_grad", "X", "x", NULL, "X@GRAD", "dx", NULL);
  PE_CK_OK(pe_op_set_ints(op, "axis", 1, (int64_t[]){0}));
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "dx", PE_SHAPE(2), (float[2]){0}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(bad_axis_is_an_error) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_meta(s, "x", PE_F32, PE_SHAPE(-1, 3, 4));
  pe_meta m[2];
  pe_op_desc *op = tr_op(3, (int64_t[]){0, 1, 1});
  expect_errors(ph_infer_op(s, op, m, 2), PE_EATTR, "op #0 (transpose2)",
                "axis [0,1,1] is not a permutation of the 3 dims of X 'x' [-1,3,4]", NULL);
  pe_op_desc_free(op);
  op = tr_op(2, (int64_t[]){1, 0});
  expect_errors(ph_infer_op(s, op, m, 2), PE_EATTR, "axis [1,0] is not a permutation", NULL);
  pe_op_desc_free(op);
  op = tr_op(3, (int64_t[]){2, 0, 1});
  PE_CK_OK(ph_infer_op(s, op, m, 2));
  expect_shape(&m[0].shape, PE_SHAPE(4, -1, 3));
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *transpose_suite(void) {
  Suite *s = suite_create("ops_transpose");
  TCase *tc = tcase_create("transpose");
  tcase_add_test(tc, values_match_index_arithmetic);
  tcase_add_test(tc, grads_match_numeric);
  tcase_add_test(tc, grad_without_dout_is_zero);
  tcase_add_test(tc, bad_axis_is_an_error);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(transpose_suite)
