/* Shape ops: reshape (0 copies a dim, one -1 inferred, batch-aware at
 * compile time) and flatten, their gradients and error messages. Values must
 * come through unchanged, so forward checks are exact.
 *
 * Gradient tolerance: the ops are copies, so central differences (f32, eps
 * 1e-3) are exact up to rounding of the weighted loss, ~1e-4 relative after
 * dividing by 2*eps; max_err <= 1e-2 is a wide margin. */
#include <check.h>
#include <math.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

#define GRAD_EPS 1e-3
#define GRAD_TOL 1e-2

static pe_op_desc *reshape_op(int n, const int64_t *shape) {
  pe_op_desc *op = ph_op("reshape", "X", "x", NULL, "Out", "out", NULL);
  PE_CK_OK(pe_op_set_ints(op, "shape", n, shape));
  return op;
}

static pe_op_desc *flatten_op(int axis) {
  pe_op_desc *op = ph_op("flatten", "X", "x", NULL, "Out", "out", NULL);
  PE_CK_OK(pe_op_set_int(op, "axis", axis));
  return op;
}

/* Run op on x [2,3,4] = 0..23 and check the output shape and the data. */
static void check_runs_to(pe_op_desc *op, pe_shape want) {
  pe_scope *s = pe_scope_new(NULL);
  float x[24];
  for (int i = 0; i < 24; i++) x[i] = (float)i;
  ph_set_f32(s, "x", PE_SHAPE(2, 3, 4), x);
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *o = ph_get(s, "out");
  expect_shape(&o->shape, want);
  ck_assert_int_eq(o->dtype, PE_F32);
  ck_assert(memcmp(o->data, x, sizeof x) == 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}

/* Compile-time infer of op on x with shape xs; returns the output meta. */
static pe_meta infer_on(pe_op_desc *op, pe_shape xs) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_meta(s, "x", PE_F32, xs);
  pe_meta m;
  PE_CK_OK(ph_infer_op(s, op, &m, 1));
  pe_op_desc_free(op);
  pe_scope_free(s);
  return m;
}

static void infer_fails(pe_op_desc *op, pe_shape xs, pe_code code, const char *needle) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_meta(s, "x", PE_F32, xs);
  pe_meta m;
  expect_error(ph_infer_op(s, op, &m, 1), code, needle);
  pe_op_desc_free(op);
  pe_scope_free(s);
}

START_TEST(reshape_zero_and_minus_one) {
  check_runs_to(reshape_op(2, (int64_t[]){0, -1}), PE_SHAPE(2, 12));
  check_runs_to(reshape_op(2, (int64_t[]){-1, 6}), PE_SHAPE(4, 6));
  check_runs_to(reshape_op(3, (int64_t[]){4, 0, -1}), PE_SHAPE(4, 3, 2));
  check_runs_to(reshape_op(1, (int64_t[]){24}), PE_SHAPE(24));
  check_runs_to(reshape_op(4, (int64_t[]){1, 2, 3, 4}), PE_SHAPE(1, 2, 3, 4));
}
END_TEST

START_TEST(reshape_any_dtype) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_i64(s, "x", PE_SHAPE(2, 2), (int64_t[]){7, 8, 9, 10});
  pe_op_desc *op = reshape_op(1, (int64_t[]){-1});
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *o = ph_get(s, "out");
  ck_assert_int_eq(o->dtype, PE_I64);
  expect_shape(&o->shape, PE_SHAPE(4));
  ck_assert_int_eq(pe_i64(o)[3], 10);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(flatten_axes) {
  check_runs_to(flatten_op(1), PE_SHAPE(2, 12));
  check_runs_to(flatten_op(2), PE_SHAPE(6, 4));
  check_runs_to(flatten_op(0), PE_SHAPE(1, 24));
  check_runs_to(flatten_op(3), PE_SHAPE(24, 1));
  /* Default axis is 1. */
  check_runs_to(ph_op("flatten", "X", "x", NULL, "Out", "out", NULL), PE_SHAPE(2, 12));
}
END_TEST

START_TEST(infer_with_batch_dim) {
  pe_meta m = infer_on(reshape_op(2, (int64_t[]){0, -1}), PE_SHAPE(-1, 3, 4));
  expect_shape(&m.shape, PE_SHAPE(-1, 12));
  m = infer_on(reshape_op(2, (int64_t[]){-1, 12}), PE_SHAPE(-1, 3, 4));
  expect_shape(&m.shape, PE_SHAPE(-1, 12));
  m = infer_on(reshape_op(1, (int64_t[]){-1}), PE_SHAPE(-1, 784));
  expect_shape(&m.shape, PE_SHAPE(-1));
  m = infer_on(reshape_op(3, (int64_t[]){0, 2, -1}), PE_SHAPE(-1, 3, 4));
  expect_shape(&m.shape, PE_SHAPE(-1, 2, 6));
  /* The batch dim moves into an inferred dim: unknown until run time. */
  m = infer_on(reshape_op(2, (int64_t[]){6, -1}), PE_SHAPE(-1, 3, 4));
  expect_shape(&m.shape, PE_SHAPE(6, -1));
  m = infer_on(reshape_op(4, (int64_t[]){-1, 1, 28, 28}), PE_SHAPE(-1, 784));
  expect_shape(&m.shape, PE_SHAPE(-1, 1, 28, 28));
  m = infer_on(flatten_op(1), PE_SHAPE(-1, 3, 4));
  expect_shape(&m.shape, PE_SHAPE(-1, 12));
  m = infer_on(flatten_op(2), PE_SHAPE(-1, 3, 4));
  expect_shape(&m.shape, PE_SHAPE(-1, 4));
}
END_TEST

START_TEST(infer_errors_name_vars_and_shapes) {
  infer_fails(reshape_op(2, (int64_t[]){4, 2}), PE_SHAPE(2, 3), PE_ESHAPE,
              "op #0 (reshape): cannot reshape X 'x' [2,3] to [4,2]");
  infer_fails(reshape_op(3, (int64_t[]){0, 5, -1}), PE_SHAPE(-1, 3, 4), PE_ESHAPE,
              "cannot reshape X 'x' [-1,3,4] to [0,5,-1]");
  infer_fails(reshape_op(2, (int64_t[]){-1, -1}), PE_SHAPE(2, 3), PE_EATTR, "more than one -1");
  infer_fails(reshape_op(3, (int64_t[]){1, 1, 0}), PE_SHAPE(2, 3), PE_EATTR,
              "copies dim 2 (0) but X 'x' [2,3] has rank 2");
  infer_fails(reshape_op(2, (int64_t[]){-2, 3}), PE_SHAPE(2, 3), PE_EATTR, "negative dim -2");
  infer_fails(flatten_op(4), PE_SHAPE(-1, 3, 4), PE_EATTR,
              "axis 4 is outside [0, 3] for X 'x' [-1,3,4]");
  /* Target dims whose product overflows int64_t (a copied dim of X too). */
  const int64_t big = INT64_C(1) << 40;
  infer_fails(reshape_op(2, (int64_t[]){INT64_C(1) << 62, 4}), PE_SHAPE(2, 3), PE_ESHAPE,
              "cannot reshape X 'x' [2,3] to [4611686018427387904,4]: too many elements");
  infer_fails(reshape_op(3, (int64_t[]){0, big, big}), PE_SHAPE(big, 1), PE_ESHAPE,
              "cannot reshape X 'x' [1099511627776,1] to [0,1099511627776,1099511627776]: too "
              "many elements");
}
END_TEST

START_TEST(grads) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(2, 3, 4), -1, 1, 61);
  const char *outs[] = {"out"}, *wrt[] = {"x"};
  pe_op_desc *ops[] = {reshape_op(2, (int64_t[]){0, -1}), reshape_op(3, (int64_t[]){4, 3, 2}),
                       flatten_op(1), flatten_op(2)};
  for (int i = 0; i < 4; i++) {
    ph_grad_report r = expect_grad(s, ops[i], outs, 1, wrt, 1, GRAD_EPS, 64, GRAD_TOL);
    ck_assert_int_eq(r.checked, 24);
    expect_shape(&ph_get(s, "x@GRAD")->shape, PE_SHAPE(2, 3, 4));
    pe_op_desc_free(ops[i]);
  }
  pe_scope_free(s);
}
END_TEST

START_TEST(grad_copies_back_or_zeros) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(2, 2), (float[]){1, 2, 3, 4});
  ph_set_f32(s, "g", PE_SHAPE(4), (float[]){5, 6, 7, 8});
  pe_op_desc *op = ph_op("reshape_grad", "X", "x", "Out@GRAD", "g", NULL, "X@GRAD", "dx", NULL);
  PE_CK_OK(pe_op_set_ints(op, "shape", 1, (int64_t[]){-1}));
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *dx = ph_get(s, "dx");
  expect_shape(&dx->shape, PE_SHAPE(2, 2));
  ck_assert(pe_f32(dx)[0] == 5 && pe_f32(dx)[3] == 8);
  pe_op_desc_free(op);
  op = ph_op("flatten_grad", "X", "x", NULL, "X@GRAD", "dx", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  dx = ph_get(s, "dx");
  for (int i = 0; i < 4; i++) ck_assert(pe_f32(dx)[i] == 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *shape_suite(void) {
  Suite *s = suite_create("ops_shape");
  TCase *tc = tcase_create("shape");
  tcase_add_test(tc, reshape_zero_and_minus_one);
  tcase_add_test(tc, reshape_any_dtype);
  tcase_add_test(tc, flatten_axes);
  tcase_add_test(tc, infer_with_batch_dim);
  tcase_add_test(tc, infer_errors_name_vars_and_shapes);
  tcase_add_test(tc, grads);
  tcase_add_test(tc, grad_copies_back_or_zeros);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(shape_suite)
