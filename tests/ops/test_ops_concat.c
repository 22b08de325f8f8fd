/* concat and split: values along each axis (negative too), split by num
 * and by sections with an inferred -1, each one's numeric gradients, a
 * split gradient with no Out@GRAD, shape and attribute errors naming the
 * op, the variables and the shapes.
 *
 * Gradient tolerance: the ops move values, so central differences (eps
 * 1e-3) are exact up to f32 rounding; 1e-2 is wide. */
#include <check.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

static const char *const parts[] = {"a", "b", "c"};

static pe_op_desc *cat_op(int n, int axis) {
  pe_op_desc *op = ph_op("concat", NULL, "Out", "out", NULL);
  PE_CK_OK(pe_op_set_input(op, "X", n, parts));
  PE_CK_OK(pe_op_set_int(op, "axis", axis));
  return op;
}

static pe_op_desc *split_op(int n, int axis, int num, int nsec, const int64_t *sec) {
  pe_op_desc *op = ph_op("split", "X", "x", NULL, NULL);
  PE_CK_OK(pe_op_set_output(op, "Out", n, parts));
  PE_CK_OK(pe_op_set_int(op, "axis", axis));
  if (num) PE_CK_OK(pe_op_set_int(op, "num", num));
  if (nsec) PE_CK_OK(pe_op_set_ints(op, "sections", nsec, sec));
  return op;
}

START_TEST(concat_values) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "a", PE_SHAPE(2, 2), (float[]){1, 2, 3, 4});
  ph_set_f32(s, "b", PE_SHAPE(2, 1), (float[]){5, 6});
  pe_op_desc *op = cat_op(2, -1);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(2, 3), (float[]){1, 2, 5, 3, 4, 6}, 0);
  pe_op_desc_free(op);
  ph_set_f32(s, "b", PE_SHAPE(1, 2), (float[]){5, 6});
  ph_set_f32(s, "c", PE_SHAPE(3, 2), (float[]){7, 8, 9, 10, 11, 12});
  op = cat_op(3, 0);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(6, 2), (float[]){1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(split_values) {
  pe_scope *s = pe_scope_new(NULL);
  float x[12];
  for (int i = 0; i < 12; i++) x[i] = (float)i;
  ph_set_f32(s, "x", PE_SHAPE(2, 6), x);
  pe_op_desc *op = split_op(3, 1, 3, 0, NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "a", PE_SHAPE(2, 2), (float[]){0, 1, 6, 7}, 0);
  expect_f32(s, "c", PE_SHAPE(2, 2), (float[]){4, 5, 10, 11}, 0);
  pe_op_desc_free(op);
  op = split_op(3, -1, 0, 3, (int64_t[]){1, -1, 2});
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "a", PE_SHAPE(2, 1), (float[]){0, 6}, 0);
  expect_f32(s, "b", PE_SHAPE(2, 3), (float[]){1, 2, 3, 7, 8, 9}, 0);
  expect_f32(s, "c", PE_SHAPE(2, 2), (float[]){4, 5, 10, 11}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(grads_match_numeric) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "a", PE_SHAPE(2, 3, 2), -1, 1, 81);
  ph_set_uniform(s, "b", PE_SHAPE(2, 1, 2), -1, 1, 82);
  ph_set_uniform(s, "c", PE_SHAPE(2, 4, 2), -1, 1, 83);
  const char *outs[] = {"out"};
  pe_op_desc *op = cat_op(3, 1);
  ph_grad_report r = expect_grad(s, op, outs, 1, parts, 3, 1e-3, 64, 1e-2);
  ck_assert_int_eq(r.checked, 12 + 4 + 16);
  pe_op_desc_free(op);
  ph_set_uniform(s, "x", PE_SHAPE(3, 8), -1, 1, 84);
  const char *wrt[] = {"x"};
  op = split_op(3, 1, 0, 3, (int64_t[]){2, 5, 1});
  r = expect_grad(s, op, parts, 3, wrt, 1, 1e-3, 64, 1e-2);
  ck_assert_int_eq(r.checked, 24);
  pe_op_desc_free(op);
  /* Only the middle part in the loss: the others' gradient is zero. */
  op = split_op(3, 0, 3, 0, NULL);
  r = expect_grad(s, op, parts + 1, 1, wrt, 1, 1e-3, 64, 1e-2);
  pe_tensor *g = ph_get(s, "x@GRAD");
  ck_assert(pe_f32(g)[0] == 0 && pe_f32(g)[8] != 0 && pe_f32(g)[16] == 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(split_grad_without_douts_is_zero) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(2), (float[]){1, 2});
  ph_set_f32(s, "dx", PE_SHAPE(2), (float[]){5, 5});
  pe_op_desc *op = ph_op("split_grad", "X", "x", NULL, "X@GRAD", "dx", NULL);
  PE_CK_OK(pe_op_set_int(op, "num", 2));
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "dx", PE_SHAPE(2), (float[2]){0}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(infer_batch_and_errors) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_meta(s, "a", PE_F32, PE_SHAPE(-1, 3));
  ph_set_meta(s, "b", PE_F32, PE_SHAPE(-1, 5));
  pe_meta m[3];
  pe_op_desc *op = cat_op(2, 1);
  PE_CK_OK(ph_infer_op(s, op, m, 1));
  expect_shape(&m[0].shape, PE_SHAPE(-1, 8));
  pe_op_desc_free(op);
  op = cat_op(2, 0);
  ph_set_meta(s, "b", PE_F32, PE_SHAPE(4, 5));
  expect_errors(ph_infer_op(s, op, m, 1), PE_ESHAPE, "op #0 (concat)",
                "input X 'b' [4,5] f32 does not match X 'a' [-1,3] f32 outside axis 0", NULL);
  pe_op_desc_free(op);
  op = cat_op(2, 2);
  expect_errors(ph_infer_op(s, op, m, 1), PE_EATTR, "axis 2 is outside [-2, 2) for X 'a' [-1,3]",
                NULL);
  pe_op_desc_free(op);
  ph_set_meta(s, "x", PE_F32, PE_SHAPE(-1, 7));
  op = split_op(2, 1, 2, 0, NULL);
  expect_errors(ph_infer_op(s, op, m, 3), PE_ESHAPE, "op #0 (split)",
                "dim 1 of X 'x' [-1,7] (7) does not divide by num 2", NULL);
  pe_op_desc_free(op);
  op = split_op(2, 1, 0, 2, (int64_t[]){3, 3});
  expect_errors(ph_infer_op(s, op, m, 3), PE_ESHAPE,
                "sections sum to 6 but dim 1 of X 'x' [-1,7] is 7", NULL);
  pe_op_desc_free(op);
  op = split_op(3, 1, 2, 0, NULL);
  expect_errors(ph_infer_op(s, op, m, 3), PE_EARITY, "num 2 but 3 outputs Out", NULL);
  pe_op_desc_free(op);
  op = split_op(2, 0, 2, 0, NULL);
  PE_CK_OK(ph_infer_op(s, op, m, 3));
  expect_shape(&m[1].shape, PE_SHAPE(-1, 7));
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *concat_suite(void) {
  Suite *s = suite_create("ops_concat");
  TCase *tc = tcase_create("concat");
  tcase_add_test(tc, concat_values);
  tcase_add_test(tc, split_values);
  tcase_add_test(tc, grads_match_numeric);
  tcase_add_test(tc, split_grad_without_douts_is_zero);
  tcase_add_test(tc, infer_batch_and_errors);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(concat_suite)
