/* lookup_table_v2: rows picked exactly (Ids of rank 1 and 2), padding_idx
 * rows read as zeros and get no gradient, repeated ids accumulate their
 * gradients, numeric gradients of W, out-of-range ids and bad inputs are
 * errors naming the op, the variable, the id and the vocabulary size.
 *
 * Gradient tolerance: the op copies rows, so central differences (eps
 * 1e-3) are exact up to the f32 rounding of the weighted loss; 1e-2 is a
 * wide margin. */
#include <check.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

static pe_op_desc *emb_op(int64_t padding_idx) {
  pe_op_desc *op = ph_op("lookup_table_v2", "W", "w", "Ids", "ids", NULL, "Out", "out", NULL);
  PE_CK_OK(pe_op_set_long(op, "padding_idx", padding_idx));
  return op;
}

/* W [5,3]: row r is (10r, 10r+1, 10r+2). */
static void set_w(pe_scope *s) {
  float w[15];
  for (int i = 0; i < 15; i++) w[i] = (float)(10 * (i / 3) + i % 3);
  ph_set_f32(s, "w", PE_SHAPE(5, 3), w);
}

START_TEST(rows_are_picked) {
  pe_scope *s = pe_scope_new(NULL);
  set_w(s);
  ph_set_i64(s, "ids", PE_SHAPE(2, 2), (int64_t[]){4, 0, 2, 4});
  pe_op_desc *op = emb_op(-1);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(2, 2, 3), (float[]){40, 41, 42, 0, 1, 2, 20, 21, 22, 40, 41, 42},
             0);
  ph_set_i64(s, "ids", PE_SHAPE(3), (int64_t[]){1, 3, 1});
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(3, 3), (float[]){10, 11, 12, 30, 31, 32, 10, 11, 12}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(padding_row_is_zero_and_gets_no_grad) {
  pe_scope *s = pe_scope_new(NULL);
  set_w(s);
  ph_set_i64(s, "ids", PE_SHAPE(4), (int64_t[]){2, 0, 2, 1});
  pe_op_desc *op = emb_op(2);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(4, 3), (float[]){0, 0, 0, 0, 1, 2, 0, 0, 0, 10, 11, 12}, 0);
  pe_op_desc_free(op);
  /* Out@GRAD all ones: row 0 and 1 get 1 each, row 2 (padding) none. */
  float ones[12];
  for (int i = 0; i < 12; i++) ones[i] = 1;
  ph_set_f32(s, "dout", PE_SHAPE(4, 3), ones);
  op = ph_op("lookup_table_v2_grad", "W", "w", "Ids", "ids", "Out@GRAD", "dout", NULL, "W@GRAD",
             "dw", NULL);
  PE_CK_OK(pe_op_set_long(op, "padding_idx", 2));
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "dw", PE_SHAPE(5, 3), (float[]){1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 0);
  /* Without padding the repeated id 2 gets both rows. */
  PE_CK_OK(pe_op_set_long(op, "padding_idx", -1));
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "dw", PE_SHAPE(5, 3), (float[]){1, 1, 1, 1, 1, 1, 2, 2, 2, 0, 0, 0, 0, 0, 0}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(grads_match_numeric) {
  for (int pad = -1; pad <= 3; pad += 4) {
    pe_scope *s = pe_scope_new(NULL);
    ph_set_uniform(s, "w", PE_SHAPE(6, 4), -1, 1, 41);
    ph_set_i64(s, "ids", PE_SHAPE(2, 3), (int64_t[]){3, 1, 3, 5, 0, 3});
    pe_op_desc *op = emb_op(pad);
    const char *outs[] = {"out"}, *wrt[] = {"w"};
    ph_grad_report r = expect_grad(s, op, outs, 1, wrt, 1, 1e-3, 64, 1e-2);
    ck_assert_int_eq(r.checked, 24);
    pe_op_desc_free(op);
    pe_scope_free(s);
  }
}
END_TEST

START_TEST(out_of_range_id_is_an_error) {
  pe_scope *s = pe_scope_new(NULL);
  set_w(s);
  pe_op_desc *op = emb_op(-1);
  ph_set_i64(s, "ids", PE_SHAPE(2, 2), (int64_t[]){1, 0, 2, 5});
  expect_errors(ph_run_op(s, op, NULL), PE_EINVAL, "op #0 (lookup_table_v2)",
                "input Ids 'ids' [2,2] holds id 5 at element 3 (batch row 1)",
                "outside the vocabulary [0, 5) of W", NULL);
  ph_set_i64(s, "ids", PE_SHAPE(1), (int64_t[]){-1});
  expect_errors(ph_run_op(s, op, NULL), PE_EINVAL, "holds id -1 at element 0", NULL);
  pe_op_desc_free(op);
  /* The gradient checks too (it never writes outside W@GRAD). */
  ph_set_f32(s, "dout", PE_SHAPE(1, 3), (float[]){1, 1, 1});
  op = ph_op("lookup_table_v2_grad", "W", "w", "Ids", "ids", "Out@GRAD", "dout", NULL, "W@GRAD",
             "dw", NULL);
  expect_errors(ph_run_op(s, op, NULL), PE_EINVAL, "op #0 (lookup_table_v2_grad)", "holds id -1",
                NULL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(infer_shapes_and_errors) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_meta(s, "w", PE_F32, PE_SHAPE(100, 16));
  ph_set_meta(s, "ids", PE_I64, PE_SHAPE(-1, 12));
  pe_meta m;
  pe_op_desc *op = emb_op(0);
  PE_CK_OK(ph_infer_op(s, op, &m, 1));
  expect_shape(&m.shape, PE_SHAPE(-1, 12, 16));
  pe_op_desc_free(op);
  op = emb_op(100);
  expect_errors(ph_infer_op(s, op, &m, 1), PE_EATTR, "op #0 (lookup_table_v2)",
                "padding_idx 100 is outside [0, 100), the rows of W 'w' [100,16]", NULL);
  pe_op_desc_free(op);
  op = emb_op(-1);
  ph_set_meta(s, "ids", PE_F32, PE_SHAPE(-1, 12));
  expect_errors(ph_infer_op(s, op, &m, 1), PE_EDTYPE, "input Ids 'ids' [-1,12] has dtype f32",
                NULL);
  ph_set_meta(s, "ids", PE_I64, PE_SHAPE(-1, 12));
  ph_set_meta(s, "w", PE_F32, PE_SHAPE(100));
  expect_errors(ph_infer_op(s, op, &m, 1), PE_ESHAPE, "input W 'w' [100] must be 2-D", NULL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *embedding_suite(void) {
  Suite *s = suite_create("ops_embedding");
  TCase *tc = tcase_create("embedding");
  tcase_add_test(tc, rows_are_picked);
  tcase_add_test(tc, padding_row_is_zero_and_gets_no_grad);
  tcase_add_test(tc, grads_match_numeric);
  tcase_add_test(tc, out_of_range_id_is_an_error);
  tcase_add_test(tc, infer_shapes_and_errors);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(embedding_suite)
