/* slice: windows with positive, negative and out-of-range starts/ends (as
 * Python's slices), decrease_axis, an empty window, i64 data, numeric
 * gradients (zeros outside the window), attribute errors naming the op,
 * the variable and the shape.
 *
 * Gradient tolerance: the op moves values, so central differences (eps
 * 1e-3) are exact up to f32 rounding; 1e-2 is wide. */
#include <check.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

static pe_op_desc *sl_op(int n, const int64_t *axes, const int64_t *starts, const int64_t *ends) {
  pe_op_desc *op = ph_op("slice", "Input", "x", NULL, "Out", "out", NULL);
  PE_CK_OK(pe_op_set_ints(op, "axes", n, axes));
  PE_CK_OK(pe_op_set_ints(op, "starts", n, starts));
  PE_CK_OK(pe_op_set_ints(op, "ends", n, ends));
  return op;
}

/* x [3,4] = 0..11 */
static pe_scope *scope_3x4(void) {
  pe_scope *s = pe_scope_new(NULL);
  float x[12];
  for (int i = 0; i < 12; i++) x[i] = (float)i;
  ph_set_f32(s, "x", PE_SHAPE(3, 4), x);
  return s;
}

static void expect_slice(pe_op_desc *op, pe_shape shape, const float *want) {
  pe_scope *s = scope_3x4();
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", shape, want, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}

START_TEST(windows_as_python_slices) {
  /* x[1:3, 1:3] */
  expect_slice(sl_op(2, (int64_t[]){0, 1}, (int64_t[]){1, 1}, (int64_t[]){3, 3}), PE_SHAPE(2, 2),
               (float[]){5, 6, 9, 10});
  /* x[:, -2:] with a huge end */
  expect_slice(sl_op(1, (int64_t[]){1}, (int64_t[]){-2}, (int64_t[]){INT64_C(1) << 40}),
               PE_SHAPE(3, 2), (float[]){2, 3, 6, 7, 10, 11});
  /* x[-10:-1] along dim 0 (start clamped to 0), negative axis */
  expect_slice(sl_op(1, (int64_t[]){-2}, (int64_t[]){-10}, (int64_t[]){-1}), PE_SHAPE(2, 4),
               (float[]){0, 1, 2, 3, 4, 5, 6, 7});
  /* x[2:1] is empty */
  pe_scope *s = scope_3x4();
  pe_op_desc *op = sl_op(1, (int64_t[]){0}, (int64_t[]){2}, (int64_t[]){1});
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_shape(&ph_get(s, "out")->shape, PE_SHAPE(0, 4));
  pe_op_desc_free(op);
  /* x[1, 1:3] with decrease_axis [0] */
  op = sl_op(2, (int64_t[]){0, 1}, (int64_t[]){1, 1}, (int64_t[]){2, 3});
  PE_CK_OK(pe_op_set_ints(op, "decrease_axis", 1, (int64_t[]){0}));
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(2), (float[]){5, 6}, 0);
  pe_op_desc_free(op);
  /* i64 data */
  ph_set_i64(s, "x", PE_SHAPE(4), (int64_t[]){7, 8, 9, 10});
  op = sl_op(1, (int64_t[]){0}, (int64_t[]){1}, (int64_t[]){-1});
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *o = ph_get(s, "out");
  expect_shape(&o->shape, PE_SHAPE(2));
  ck_assert(pe_i64(o)[0] == 8 && pe_i64(o)[1] == 9);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(grads_match_numeric) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(3, 4, 5), -1, 1, 71);
  const char *outs[] = {"out"}, *wrt[] = {"x"};
  pe_op_desc *op = sl_op(2, (int64_t[]){0, 2}, (int64_t[]){1, -3}, (int64_t[]){3, 100});
  ph_grad_report r = expect_grad(s, op, outs, 1, wrt, 1, 1e-3, 100, 1e-2);
  ck_assert_int_eq(r.checked, 60);
  /* Outside the window the gradient is exactly 0. */
  pe_tensor *g = ph_get(s, "x@GRAD");
  ck_assert(pe_f32(g)[0] == 0 && pe_f32(g)[5 * 4 * 1 + 1] == 0);
  ck_assert(pe_f32(g)[5 * 4 * 1 + 2] != 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(infer_batch_and_errors) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_meta(s, "x", PE_F32, PE_SHAPE(-1, 10));
  pe_meta m;
  pe_op_desc *op = sl_op(1, (int64_t[]){1}, (int64_t[]){2}, (int64_t[]){-1});
  PE_CK_OK(ph_infer_op(s, op, &m, 1));
  expect_shape(&m.shape, PE_SHAPE(-1, 7));
  pe_op_desc_free(op);
  op = sl_op(1, (int64_t[]){2}, (int64_t[]){0}, (int64_t[]){1});
  expect_errors(ph_infer_op(s, op, &m, 1), PE_EATTR, "op #0 (slice)",
                "axes[0] = 2 is outside [-2, 2) for Input 'x' [-1,10]", NULL);
  pe_op_desc_free(op);
  op = sl_op(2, (int64_t[]){1, -1}, (int64_t[]){0, 0}, (int64_t[]){1, 1});
  expect_errors(ph_infer_op(s, op, &m, 1), PE_EATTR, "axes lists dim 1 twice for Input 'x'", NULL);
  pe_op_desc_free(op);
  op = sl_op(1, (int64_t[]){1}, (int64_t[]){0}, (int64_t[]){2});
  PE_CK_OK(pe_op_set_ints(op, "decrease_axis", 1, (int64_t[]){1}));
  expect_errors(ph_infer_op(s, op, &m, 1), PE_EATTR,
                "decrease_axis 1 is not a sliced dim of size 1 of Input 'x' [-1,10]", NULL);
  pe_op_desc_free(op);
  op = ph_op("slice", "Input", "x", NULL, "Out", "out", NULL);
  PE_CK_OK(pe_op_set_ints(op, "axes", 1, (int64_t[]){1}));
  PE_CK_OK(pe_op_set_ints(op, "starts", 2, (int64_t[]){0, 1}));
  PE_CK_OK(pe_op_set_ints(op, "ends", 1, (int64_t[]){1}));
  expect_errors(ph_infer_op(s, op, &m, 1), PE_EATTR,
                "axes, starts and ends need as many values (1, 2, 1)", NULL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *slice_suite(void) {
  Suite *s = suite_create("ops_slice");
  TCase *tc = tcase_create("slice");
  tcase_add_test(tc, windows_as_python_slices);
  tcase_add_test(tc, grads_match_numeric);
  tcase_add_test(tc, infer_batch_and_errors);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(slice_suite)
