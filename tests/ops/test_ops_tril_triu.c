/* tril_triu: the kept triangle against index arithmetic for several
 * diagonals (both kinds, a batch of matrices, i64 too), numeric gradients,
 * a pruned Out@GRAD, the rank error naming the op, the variable and the
 * shape.
 *
 * Gradient tolerance: the op moves values, so central differences (eps
 * 1e-3) are exact up to f32 rounding of the weighted loss; 1e-2 is wide. */
#include <check.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

static pe_op_desc *tt_op(int64_t diagonal, bool lower) {
  pe_op_desc *op = ph_op("tril_triu", "X", "x", NULL, "Out", "out", NULL);
  PE_CK_OK(pe_op_set_int(op, "diagonal", diagonal));
  PE_CK_OK(pe_op_set_bool(op, "lower", lower));
  return op;
}

START_TEST(values_match_index_arithmetic) {
  pe_scope *s = pe_scope_new(NULL);
  float x[2 * 3 * 5];
  for (int i = 0; i < 30; i++) x[i] = (float)(i + 1);
  ph_set_f32(s, "x", PE_SHAPE(2, 3, 5), x);
  for (int64_t diag = -3; diag <= 5; diag++)
    for (int lower = 0; lower < 2; lower++) {
      pe_op_desc *op = tt_op(diag, lower);
      PE_CK_OK(ph_run_op(s, op, NULL));
      float want[30];
      for (int m = 0; m < 2; m++)
        for (int i = 0; i < 3; i++)
          for (int j = 0; j < 5; j++) {
            int k = (m * 3 + i) * 5 + j;
            bool keep = lower ? j - i <= diag : j - i >= diag;
            want[k] = keep ? x[k] : 0;
          }
      expect_f32(s, "out", PE_SHAPE(2, 3, 5), want, 0);
      pe_op_desc_free(op);
    }
  /* the causal mask: zeros on and below the diagonal */
  float big[9];
  for (int i = 0; i < 9; i++) big[i] = -1e9f;
  ph_set_f32(s, "x", PE_SHAPE(1, 1, 3, 3), big);
  pe_op_desc *op = tt_op(1, false);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(1, 1, 3, 3), ((float[]){0, -1e9f, -1e9f, 0, 0, -1e9f, 0, 0, 0}), 0);
  pe_op_desc_free(op);
  ph_set_i64(s, "x", PE_SHAPE(2, 2), (int64_t[]){1, 2, 3, 4});
  op = tt_op(0, true);
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *o = ph_get(s, "out");
  const int64_t wi[] = {1, 0, 3, 4};
  for (int i = 0; i < 4; i++) ck_assert_int_eq(pe_i64(o)[i], wi[i]);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(grads_match_numeric) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(2, 3, 4), -1, 1, 52);
  const char *outs[] = {"out"}, *wrt[] = {"x"};
  for (int lower = 0; lower < 2; lower++) {
    pe_op_desc *op = tt_op(lower ? 0 : 1, lower);
    ph_grad_report r = expect_grad(s, op, outs, 1, wrt, 1, 1e-3, 64, 1e-2);
    ck_assert_int_eq(r.checked, 24);
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

START_TEST(grad_without_dout_is_zero) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(2, 2), (float[]){1, 2, 3, 4});
  ph_set_f32(s, "dx", PE_SHAPE(2, 2), (float[]){5, 5, 5, 5});
  pe_op_desc *op = ph_op("tril_triu_grad", "X", "x", NULL, "X@GRAD", "dx", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "dx", PE_SHAPE(2, 2), (float[4]){0}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(rank_one_is_an_error) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_meta(s, "x", PE_F32, PE_SHAPE(-1));
  pe_meta m[1];
  pe_op_desc *op = tt_op(0, true);
  expect_errors(ph_infer_op(s, op, m, 1), PE_ESHAPE, "op #0 (tril_triu)",
                "input X 'x' [-1] has rank 1; a triangle needs 2 or more", NULL);
  pe_op_desc_free(op);
  ph_set_meta(s, "x", PE_F32, PE_SHAPE(-1, 1, 4, 4));
  op = tt_op(1, false);
  PE_CK_OK(ph_infer_op(s, op, m, 1));
  expect_shape(&m[0].shape, PE_SHAPE(-1, 1, 4, 4));
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *tril_triu_suite(void) {
  Suite *s = suite_create("ops_tril_triu");
  TCase *tc = tcase_create("tril_triu");
  tcase_add_test(tc, values_match_index_arithmetic);
  tcase_add_test(tc, grads_match_numeric);
  tcase_add_test(tc, grad_without_dout_is_zero);
  tcase_add_test(tc, rank_one_is_an_error);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(tril_triu_suite)
