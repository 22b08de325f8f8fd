/* position_ids: [0, T) in every row of token ids [B, T] and of
 * activations [B, T, D], a start offset, a negative axis, the shape at
 * compile time (batch -1), an axis out of range naming the op, the
 * variable and its shape. */
#include <check.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

START_TEST(position_ids_values_and_errors) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_i64(s, "ids", PE_SHAPE(2, 3), (int64_t[]){9, 9, 9, 9, 9, 9});
  pe_op_desc *op = ph_op("position_ids", "X", "ids", NULL, "Out", "pos", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *p = ph_get(s, "pos");
  ck_assert_int_eq(p->dtype, PE_I64);
  expect_shape(&p->shape, PE_SHAPE(2, 3));
  for (int i = 0; i < 6; i++) ck_assert_int_eq(pe_i64(p)[i], i % 3);
  /* activations [B, T, D], start 5 */
  ph_set_uniform(s, "x", PE_SHAPE(2, 4, 3), 0, 1, 1);
  pe_op_desc_free(op);
  op = ph_op("position_ids", "X", "x", NULL, "Out", "pos", NULL);
  PE_CK_OK(pe_op_set_long(op, "start", 5));
  PE_CK_OK(ph_run_op(s, op, NULL));
  p = ph_get(s, "pos");
  expect_shape(&p->shape, PE_SHAPE(2, 4));
  for (int i = 0; i < 8; i++) ck_assert_int_eq(pe_i64(p)[i], 5 + i % 4);
  PE_CK_OK(pe_op_set_int(op, "axis", -1));
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_shape(&ph_get(s, "pos")->shape, PE_SHAPE(2, 4, 3));
  ck_assert_int_eq(pe_i64(ph_get(s, "pos"))[5], 5 + 2);
  PE_CK_OK(pe_op_set_int(op, "axis", 3));
  pe_meta m[1];
  ph_set_meta(s, "x", PE_F32, PE_SHAPE(-1, 4, 3));
  expect_errors(ph_infer_op(s, op, m, 1), PE_EATTR, "op #0 (position_ids)",
                "axis 3 out of range for X 'x' shape [-1,4,3]", NULL);
  PE_CK_OK(pe_op_set_int(op, "axis", 1));
  PE_CK_OK(ph_infer_op(s, op, m, 1));
  expect_shape(&m[0].shape, PE_SHAPE(-1, 4));
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *position_ids_suite(void) {
  Suite *s = suite_create("ops_position_ids");
  TCase *tc = tcase_create("position_ids");
  tcase_add_test(tc, position_ids_values_and_errors);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(position_ids_suite)
