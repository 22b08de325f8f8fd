/* accuracy and top_k. All comparisons are exact: the ops only order and copy
 * values, and Accuracy is a ratio of small integers. */
#include <check.h>
#include <math.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

/* Rows chosen for the tie rule: rank = #{greater} + #{equal at a lower index}.
 *   row  scores             label  rank
 *   0    0.1  0.7  0.2      1      0
 *   1    0.5  0.5  0.0      1      1   (tie with index 0, which ranks first)
 *   2    0.5  0.5  0.0      0      0   (tie, but the label has the lower index)
 *   3    0.3  0.3  0.3      2      2   (three-way tie)
 *   4    0.9  0.05 0.05     2      2   (one greater + one equal at lower index)
 *   5    0.6  0.1  0.3      1      2
 *   6    0.6  0.1  0.3      2      1 */
static const float acc_x[] = {0.1f, 0.7f, 0.2f,  0.5f,  0.5f, 0.0f, 0.5f, 0.5f, 0.0f, 0.3f, 0.3f,
                              0.3f, 0.9f, 0.05f, 0.05f, 0.6f, 0.1f, 0.3f, 0.6f, 0.1f, 0.3f};
static const int64_t acc_label[] = {1, 1, 0, 2, 2, 1, 2};
static const int acc_rank[] = {0, 1, 0, 2, 2, 2, 1};

static void run_accuracy(pe_scope *s, int k, float *acc, int64_t *correct, int64_t *total) {
  pe_op_desc *op = ph_op("accuracy", "X", "x", "Label", "label", NULL, "Accuracy", "acc", "Correct",
                         "correct", "Total", "total", NULL);
  PE_CK_OK(pe_op_set_int(op, "k", k));
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *a = ph_get(s, "acc"), *c = ph_get(s, "correct"), *t = ph_get(s, "total");
  pe_shape one = PE_SHAPE(1);
  ck_assert(a->dtype == PE_F32 && pe_shape_equal(&a->shape, &one));
  ck_assert(c->dtype == PE_I64 && pe_shape_equal(&c->shape, &one));
  ck_assert(t->dtype == PE_I64 && pe_shape_equal(&t->shape, &one));
  *acc = pe_f32(a)[0];
  *correct = pe_i64(c)[0];
  *total = pe_i64(t)[0];
  pe_op_desc_free(op);
}

START_TEST(accuracy_top1_top2_with_ties) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(7, 3), acc_x);
  ph_set_i64(s, "label", PE_SHAPE(7, 1), acc_label);
  for (int k = 1; k <= 4; k++) {
    int64_t want = 0;
    for (int r = 0; r < 7; r++) want += acc_rank[r] < k;
    float acc;
    int64_t correct, total;
    run_accuracy(s, k, &acc, &correct, &total);
    ck_assert_int_eq(correct, want); /* k=1: 2, k=2: 4, k>=3: 7 */
    ck_assert_int_eq(total, 7);
    ck_assert_float_eq(acc, (float)((double)want / 7.0));
  }
  pe_scope_free(s);
}
END_TEST

START_TEST(accuracy_agrees_with_top_k_indices) {
  /* "In the top k" for accuracy is exactly "in top_k's Indices". */
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(7, 3), acc_x);
  for (int k = 1; k <= 3; k++) {
    pe_op_desc *op = ph_op("top_k", "X", "x", NULL, "Out", "v", "Indices", "i", NULL);
    PE_CK_OK(pe_op_set_int(op, "k", k));
    PE_CK_OK(ph_run_op(s, op, NULL));
    const int64_t *idx = pe_i64(ph_get(s, "i"));
    for (int r = 0; r < 7; r++) {
      bool in = false;
      for (int q = 0; q < k; q++) in |= idx[r * k + q] == acc_label[r];
      ck_assert_msg(in == (acc_rank[r] < k), "row %d k %d", r, k);
    }
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

START_TEST(accuracy_empty_batch_and_errors) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(0, 3), NULL);
  ph_set_i64(s, "label", PE_SHAPE(0, 1), NULL);
  float acc;
  int64_t correct, total;
  run_accuracy(s, 1, &acc, &correct, &total);
  ck_assert(acc == 0.0f);
  ck_assert_int_eq(correct, 0);
  ck_assert_int_eq(total, 0);

  /* A label outside [0, C) names the row and the value. */
  float xv[] = {1, 2, 3, 4, 5, 6};
  int64_t lv[] = {0, 3};
  ph_set_f32(s, "x", PE_SHAPE(2, 3), xv);
  ph_set_i64(s, "label", PE_SHAPE(2, 1), lv);
  pe_op_desc *op = ph_op("accuracy", "X", "x", "Label", "label", NULL, "Accuracy", "acc", NULL);
  expect_error(ph_run_op(s, op, NULL), PE_EINVAL, "row 1 is 3, outside [0, 3)");
  /* Shape and dtype checks. */
  ph_set_i64(s, "label", PE_SHAPE(3, 1), (int64_t[]){0, 0, 0});
  pe_meta m[3];
  expect_error(ph_infer_op(s, op, m, 3), PE_ESHAPE, "[3,1]");
  ph_set_f32(s, "label", PE_SHAPE(2, 1), xv);
  expect_error(ph_infer_op(s, op, m, 3), PE_EDTYPE, "expected i64");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(top_k_values_and_indices) {
  pe_scope *s = pe_scope_new(NULL);
  /* X [2,2,5]: top_k works along the last dim; ties go to the lower index. */
  float xv[] = {1, 3, 3, 2, 5, /**/ -1, -1, -1, 0, -1, /**/ 4, 4, 4, 4, 4, /**/ 0, 1, 2, 3, 4};
  ph_set_f32(s, "x", PE_SHAPE(2, 2, 5), xv);
  pe_op_desc *op = ph_op("top_k", "X", "x", NULL, "Out", "v", "Indices", "i", NULL);
  PE_CK_OK(pe_op_set_int(op, "k", 3));
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *v = ph_get(s, "v"), *i = ph_get(s, "i");
  pe_shape want = PE_SHAPE(2, 2, 3);
  ck_assert(v->dtype == PE_F32 && pe_shape_equal(&v->shape, &want));
  ck_assert(i->dtype == PE_I64 && pe_shape_equal(&i->shape, &want));
  float wv[] = {5, 3, 3, 0, -1, -1, 4, 4, 4, 4, 3, 2};
  int64_t wi[] = {4, 1, 2, 3, 0, 1, 0, 1, 2, 4, 3, 2};
  for (int q = 0; q < 12; q++) {
    ck_assert(pe_f32(v)[q] == wv[q]);
    ck_assert_int_eq(pe_i64(i)[q], wi[q]);
  }
  pe_op_desc_free(op);

  /* NaN ranks above every number; other dtypes keep their dtype. */
  ph_set_f32(s, "x", PE_SHAPE(1, 3), (float[]){1, NAN, 2});
  op = ph_op("top_k", "X", "x", NULL, "Out", "v", "Indices", "i", NULL);
  PE_CK_OK(pe_op_set_int(op, "k", 2));
  PE_CK_OK(ph_run_op(s, op, NULL));
  ck_assert(isnan(pe_f32(ph_get(s, "v"))[0]) && pe_f32(ph_get(s, "v"))[1] == 2.0f);
  ck_assert_int_eq(pe_i64(ph_get(s, "i"))[0], 1);
  ck_assert_int_eq(pe_i64(ph_get(s, "i"))[1], 2);
  ph_set_i64(s, "x", PE_SHAPE(4), (int64_t[]){7, 9, 9, -3});
  PE_CK_OK(ph_run_op(s, op, NULL));
  ck_assert_int_eq(ph_get(s, "v")->dtype, PE_I64);
  ck_assert_int_eq(pe_i64(ph_get(s, "v"))[0], 9);
  ck_assert_int_eq(pe_i64(ph_get(s, "v"))[1], 9);
  ck_assert_int_eq(pe_i64(ph_get(s, "i"))[0], 1);
  ck_assert_int_eq(pe_i64(ph_get(s, "i"))[1], 2);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(top_k_matches_reference_with_many_ties) {
  /* 40 rows of 37 scores drawn from {0..4} (many ties), every k, against a
   * reference selection: repeatedly take the first maximum not yet taken. */
  enum { R = 40, L = 37 };
  float xv[R * L];
  for (int q = 0; q < R * L; q++) xv[q] = (float)(int)(5 * pe_rng_uniform(17, (uint64_t)q));
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(R, L), xv);
  pe_op_desc *op = ph_op("top_k", "X", "x", NULL, "Out", "v", "Indices", "i", NULL);
  for (int k = 1; k <= L; k++) {
    PE_CK_OK(pe_op_set_int(op, "k", k));
    PE_CK_OK(ph_run_op(s, op, NULL));
    const float *v = pe_f32(ph_get(s, "v"));
    const int64_t *idx = pe_i64(ph_get(s, "i"));
    for (int r = 0; r < R; r++) {
      bool taken[L] = {false};
      for (int q = 0; q < k; q++) {
        int best = -1;
        for (int j = 0; j < L; j++)
          if (!taken[j] && (best < 0 || xv[r * L + j] > xv[r * L + best])) best = j;
        taken[best] = true;
        ck_assert_int_eq(idx[r * k + q], best);
        ck_assert(v[r * k + q] == xv[r * L + best]);
      }
    }
  }
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(top_k_rejects_bad_k) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(2, 5), 0, 1, 1);
  pe_op_desc *op = ph_op("top_k", "X", "x", NULL, "Out", "v", "Indices", "i", NULL);
  pe_meta m[2];
  PE_CK_OK(pe_op_set_int(op, "k", 6));
  expect_error(ph_infer_op(s, op, m, 2), PE_EATTR, "'k' = 6 exceeds the last dim of X 'x' [2,5]");
  expect_error(ph_run_op(s, op, NULL), PE_EATTR, "'k' = 6");
  PE_CK_OK(pe_op_set_int(op, "k", 0));
  expect_error(ph_infer_op(s, op, m, 2), PE_EATTR, "'k' = 0 must be >= 1");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *metric_suite(void) {
  Suite *s = suite_create("ops_metric");
  TCase *tc = tcase_create("metric");
  tcase_add_test(tc, accuracy_top1_top2_with_ties);
  tcase_add_test(tc, accuracy_agrees_with_top_k_indices);
  tcase_add_test(tc, accuracy_empty_batch_and_errors);
  tcase_add_test(tc, top_k_values_and_indices);
  tcase_add_test(tc, top_k_matches_reference_with_many_ties);
  tcase_add_test(tc, top_k_rejects_bad_k);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(metric_suite)
