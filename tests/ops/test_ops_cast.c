/* cast: f32 <-> i64 / i32 / u8 / f64 values (truncation toward zero), the
 * gradient of a float cast (Out@GRAD cast back), none through an integer,
 * values an integer cannot hold (NaN, out of range) refused naming the op,
 * X, the element and the value, attribute errors naming the op, X and the
 * dtypes. */
#include <check.h>
#include <math.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

static pe_op_desc *cast_op(int in, int out) {
  pe_op_desc *op = ph_op("cast", "X", "x", NULL, "Out", "out", NULL);
  if (in >= 0) PE_CK_OK(pe_op_set_int(op, "in_dtype", in));
  PE_CK_OK(pe_op_set_int(op, "out_dtype", out));
  return op;
}

START_TEST(values_convert) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(2, 3), (float[]){1.9f, -1.9f, 0, 255, 7.5f, -3});
  pe_op_desc *op = cast_op(PE_F32, PE_I64);
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *o = ph_get(s, "out");
  ck_assert_int_eq(o->dtype, PE_I64);
  expect_shape(&o->shape, PE_SHAPE(2, 3));
  const int64_t wi[] = {1, -1, 0, 255, 7, -3};
  for (int i = 0; i < 6; i++) ck_assert_int_eq(pe_i64(o)[i], wi[i]);
  pe_op_desc_free(op);
  op = cast_op(-1, PE_I32); /* in_dtype left out: X's */
  PE_CK_OK(ph_run_op(s, op, NULL));
  o = ph_get(s, "out");
  ck_assert_int_eq(o->dtype, PE_I32);
  for (int i = 0; i < 6; i++) ck_assert_int_eq(((int32_t *)o->data)[i], wi[i]);
  pe_op_desc_free(op);
  ph_set_i64(s, "x", PE_SHAPE(3), (int64_t[]){-5, 0, (INT64_C(1) << 40) + 1});
  op = cast_op(PE_I64, PE_F32);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(3), (float[]){-5, 0, 1099511627776.0f}, 0);
  pe_op_desc_free(op);
  op = cast_op(PE_I64, PE_F64);
  PE_CK_OK(ph_run_op(s, op, NULL));
  o = ph_get(s, "out");
  ck_assert(((double *)o->data)[2] == 1099511627777.0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(float_cast_has_a_gradient) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(3, 4), -1, 1, 3);
  pe_op_desc *op = cast_op(PE_F32, PE_F64);
  PE_CK_OK(ph_run_op(s, op, NULL));
  ck_assert_int_eq(ph_get(s, "out")->dtype, PE_F64);
  pe_op_desc_free(op);
  /* f32 -> f32 through the gradient maker: the identity's gradient */
  op = cast_op(PE_F32, PE_F32);
  const char *outs[] = {"out"}, *wrt[] = {"x"};
  ck_assert_int_eq(expect_grad(s, op, outs, 1, wrt, 1, 1e-3, 64, 1e-3).checked, 12);
  pe_op_desc_free(op);
  /* The grad op casts Out@GRAD (f64) back to X's f32. */
  ph_set_f32(s, "x", PE_SHAPE(2), (float[]){1, 2});
  ph_set_f32(s, "g32", PE_SHAPE(2), (float[]){0.25f, -3});
  pe_op_desc *to64 = ph_op("cast", "X", "g32", NULL, "Out", "dout", NULL);
  PE_CK_OK(pe_op_set_int(to64, "out_dtype", PE_F64));
  PE_CK_OK(ph_run_op(s, to64, NULL));
  pe_op_desc *grad = ph_op("cast_grad", "X", "x", "Out@GRAD", "dout", NULL, "X@GRAD", "dx", NULL);
  PE_CK_OK(pe_op_set_int(grad, "in_dtype", PE_F32));
  PE_CK_OK(pe_op_set_int(grad, "out_dtype", PE_F64));
  PE_CK_OK(ph_run_op(s, grad, NULL));
  expect_f32(s, "dx", PE_SHAPE(2), (float[]){0.25f, -3}, 0);
  pe_op_desc_free(grad);
  pe_op_desc_free(to64);
  /* No gradient through an integer. */
  ph_set_meta(s, "x", PE_F32, PE_SHAPE(-1, 2));
  ph_set_meta(s, "dout", PE_I64, PE_SHAPE(-1, 2));
  grad = ph_op("cast_grad", "X", "x", "Out@GRAD", "dout", NULL, "X@GRAD", "dx", NULL);
  PE_CK_OK(pe_op_set_int(grad, "out_dtype", PE_I64));
  pe_meta m[1];
  expect_errors(ph_infer_op(s, grad, m, 1), PE_ENOGRAD, "op #0 (cast_grad)",
                "no gradient through a cast from f32 to i64", NULL);
  pe_op_desc_free(grad);
  pe_scope_free(s);
}
END_TEST

START_TEST(unrepresentable_values_are_errors) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(3), (float[]){1, NAN, 2});
  pe_op_desc *op = cast_op(PE_F32, PE_I64);
  expect_errors(ph_run_op(s, op, NULL), PE_EINVAL, "op #0 (cast)", "input X element 1 = nan",
                "does not fit i64", NULL);
  pe_op_desc_free(op);
  ph_set_f32(s, "x", PE_SHAPE(2), (float[]){1, 3e9f});
  op = cast_op(PE_F32, PE_I32);
  expect_errors(ph_run_op(s, op, NULL), PE_EINVAL, "input X element 1 = 3e+09", "does not fit i32",
                NULL);
  pe_op_desc_free(op);
  ph_set_f32(s, "x", PE_SHAPE(1), (float[]){1e19f});
  op = cast_op(PE_F32, PE_I64);
  expect_errors(ph_run_op(s, op, NULL), PE_EINVAL, "does not fit i64", NULL);
  pe_op_desc_free(op);
  ph_set_i64(s, "x", PE_SHAPE(2), (int64_t[]){255, 256});
  op = cast_op(PE_I64, PE_U8);
  expect_errors(ph_run_op(s, op, NULL), PE_EINVAL, "input X element 1 = 256", "does not fit u8",
                NULL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(bad_attributes_are_errors) {
  pe_scope *s = pe_scope_new(NULL);
  pe_meta m[1];
  ph_set_meta(s, "x", PE_I64, PE_SHAPE(-1, 1));
  pe_op_desc *op = cast_op(PE_F32, PE_F32);
  expect_errors(ph_infer_op(s, op, m, 1), PE_EATTR, "op #0 (cast)",
                "in_dtype 0 (f32) is not the dtype i64 of X 'x'", NULL);
  pe_op_desc_free(op);
  op = cast_op(-1, 9);
  expect_errors(ph_infer_op(s, op, m, 1), PE_EATTR, "out_dtype 9 is not supported", NULL);
  pe_op_desc_free(op);
  op = cast_op(PE_I64, PE_F32);
  PE_CK_OK(ph_infer_op(s, op, m, 1));
  ck_assert_int_eq(m[0].dtype, PE_F32);
  expect_shape(&m[0].shape, PE_SHAPE(-1, 1));
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *cast_suite(void) {
  Suite *s = suite_create("ops_cast");
  TCase *tc = tcase_create("cast");
  tcase_add_test(tc, values_convert);
  tcase_add_test(tc, float_cast_has_a_gradient);
  tcase_add_test(tc, unrepresentable_values_are_errors);
  tcase_add_test(tc, bad_attributes_are_errors);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(cast_suite)
