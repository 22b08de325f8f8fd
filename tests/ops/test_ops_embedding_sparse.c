/* lookup_table_v2_grad with is_sparse and the update ops with GradRows:
 * the gradient holds the distinct ids ascending with their rows summed,
 * padding_idx has no row, the slots after the last are rows -1 and zeros;
 * sgd, momentum and adam on a sparse gradient give dense's numbers (adam
 * lazy_mode: only the rows), and bad rows or a sparse gradient with weight
 * decay are errors naming the variables. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

/* W [5,2]; ids {3, 1, 3, 2, 4, 1} with padding_idx 4; Out@GRAD row i is
 * (i+1, 10(i+1)). */
static void sparse_grad(pe_scope *s) {
  float w[10] = {0};
  ph_set_f32(s, "w", PE_SHAPE(5, 2), w);
  ph_set_i64(s, "ids", PE_SHAPE(2, 3), (int64_t[]){3, 1, 3, 2, 4, 1});
  float d[12];
  for (int i = 0; i < 6; i++) d[2 * i] = (float)(i + 1), d[2 * i + 1] = 10.0f * (float)(i + 1);
  ph_set_f32(s, "dout", PE_SHAPE(2, 3, 2), d);
  pe_op_desc *op = ph_op("lookup_table_v2_grad", "W", "w", "Ids", "ids", "Out@GRAD", "dout", NULL,
                         "W@GRAD", "g", "W@GRAD@ROWS", "rows", NULL);
  PE_CK_OK(pe_op_set_long(op, "padding_idx", 4));
  PE_CK_OK(pe_op_set_bool(op, "is_sparse", true));
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_op_desc_free(op);
}

START_TEST(sparse_grad_merges_sorted_rows) {
  pe_scope *s = pe_scope_new(NULL);
  sparse_grad(s);
  /* id 1: rows 2 and 6; id 2: row 4; id 3: rows 1 and 3; id 4: padding. */
  pe_tensor *rows = ph_get(s, "rows");
  expect_shape(&rows->shape, PE_SHAPE(6));
  int64_t want_rows[6] = {1, 2, 3, -1, -1, -1};
  for (int i = 0; i < 6; i++) ck_assert_int_eq(pe_i64(rows)[i], want_rows[i]);
  expect_f32(s, "g", PE_SHAPE(6, 2), (float[]){8, 80, 4, 40, 4, 40, 0, 0, 0, 0, 0, 0}, 0);
  pe_scope_free(s);
}
END_TEST

START_TEST(dense_grad_refuses_a_rows_output) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "w", PE_SHAPE(5, 2), (float[10]){0});
  ph_set_i64(s, "ids", PE_SHAPE(2), (int64_t[]){1, 2});
  ph_set_f32(s, "dout", PE_SHAPE(2, 2), (float[4]){0});
  pe_op_desc *op = ph_op("lookup_table_v2_grad", "W", "w", "Ids", "ids", "Out@GRAD", "dout", NULL,
                         "W@GRAD", "g", "W@GRAD@ROWS", "rows", NULL);
  expect_errors(ph_run_op(s, op, NULL), PE_EARITY, "lookup_table_v2_grad", "'rows'", "is_sparse",
                NULL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* The sparse gradient of sparse_grad() scattered into a dense [5,2]. */
static void dense_of_sparse(pe_scope *s) {
  ph_set_f32(s, "gd", PE_SHAPE(5, 2), (float[]){0, 0, 8, 80, 4, 40, 4, 40, 0, 0});
}

static void set_state(pe_scope *s, const char *suffix) {
  float p[10], v[10];
  for (int i = 0; i < 10; i++) p[i] = (float)i * 0.25f - 1.0f, v[i] = (float)(i % 3) * 0.5f;
  char n[32];
  snprintf(n, sizeof n, "p%s", suffix);
  ph_set_f32(s, n, PE_SHAPE(5, 2), p);
  snprintf(n, sizeof n, "v%s", suffix);
  ph_set_f32(s, n, PE_SHAPE(5, 2), v);
  snprintf(n, sizeof n, "m%s", suffix);
  ph_set_f32(s, n, PE_SHAPE(5, 2), v);
  snprintf(n, sizeof n, "b1%s", suffix);
  ph_set_f32(s, n, PE_SHAPE(1), (float[]){0.9f});
  snprintf(n, sizeof n, "b2%s", suffix);
  ph_set_f32(s, n, PE_SHAPE(1), (float[]){0.999f});
}

static pe_op_desc *update_op(const char *type, const char *sfx, bool sparse) {
  char p[8], g[8], v[8], m[8], b1[8], b2[8];
  snprintf(p, sizeof p, "p%s", sfx);
  snprintf(g, sizeof g, "%s", sparse ? "g" : "gd");
  snprintf(v, sizeof v, "v%s", sfx);
  snprintf(m, sizeof m, "m%s", sfx);
  snprintf(b1, sizeof b1, "b1%s", sfx);
  snprintf(b2, sizeof b2, "b2%s", sfx);
  pe_op_desc *op;
  if (!strcmp(type, "sgd"))
    op = ph_op("sgd", "Param", p, "Grad", g, "LearningRate", "lr", NULL, "ParamOut", p, NULL);
  else if (!strcmp(type, "momentum"))
    op = ph_op("momentum", "Param", p, "Grad", g, "Velocity", v, "LearningRate", "lr", NULL,
               "ParamOut", p, "VelocityOut", v, NULL);
  else
    op = ph_op("adam", "Param", p, "Grad", g, "LearningRate", "lr", "Moment1", v, "Moment2", m,
               "Beta1Pow", b1, "Beta2Pow", b2, NULL, "ParamOut", p, "Moment1Out", v, "Moment2Out",
               m, "Beta1PowOut", b1, "Beta2PowOut", b2, NULL);
  if (sparse) PE_CK_OK(pe_op_input1(op, "GradRows", "rows"));
  return op;
}

static void expect_same(pe_scope *s, const char *a, const char *b) {
  const float *x = pe_f32(ph_get(s, a)), *y = pe_f32(ph_get(s, b));
  for (int i = 0; i < 10; i++)
    ck_assert_msg(x[i] == y[i], "%s[%d] %g vs %s %g", a, i, x[i], b, y[i]);
}

START_TEST(updates_on_sparse_equal_dense) {
  const char *types[] = {"sgd", "momentum", "adam"};
  for (int t = 0; t < 3; t++) {
    pe_scope *s = pe_scope_new(NULL);
    sparse_grad(s);
    dense_of_sparse(s);
    ph_set_f32(s, "lr", PE_SHAPE(1), (float[]){0.1f});
    set_state(s, "s");
    set_state(s, "d");
    for (int step = 0; step < 2; step++) {
      pe_op_desc *os = update_op(types[t], "s", true), *od = update_op(types[t], "d", false);
      PE_CK_OK(ph_run_op(s, os, NULL));
      PE_CK_OK(ph_run_op(s, od, NULL));
      pe_op_desc_free(os);
      pe_op_desc_free(od);
    }
    expect_same(s, "ps", "pd");
    expect_same(s, "vs", "vd");
    expect_same(s, "ms", "md");
    pe_scope_free(s);
  }
}
END_TEST

START_TEST(adam_lazy_moves_only_the_rows) {
  pe_scope *s = pe_scope_new(NULL);
  sparse_grad(s);
  ph_set_f32(s, "lr", PE_SHAPE(1), (float[]){0.1f});
  set_state(s, "s");
  float p0[10], v0[10];
  memcpy(p0, pe_f32(ph_get(s, "ps")), sizeof p0);
  memcpy(v0, pe_f32(ph_get(s, "vs")), sizeof v0);
  pe_op_desc *op = update_op("adam", "s", true);
  PE_CK_OK(pe_op_set_bool(op, "lazy_mode", true));
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_op_desc_free(op);
  const float *p = pe_f32(ph_get(s, "ps")), *v = pe_f32(ph_get(s, "vs"));
  for (int i = 0; i < 10; i++) {
    bool touched = i / 2 >= 1 && i / 2 <= 3;
    ck_assert_msg((p[i] != p0[i]) == touched, "param element %d", i);
    if (!touched) ck_assert_msg(v[i] == v0[i], "moment1 element %d", i);
  }
  ck_assert(pe_f32(ph_get(s, "b1s"))[0] != 0.9f); /* the powers advance */
  pe_scope_free(s);
}
END_TEST

START_TEST(bad_rows_and_decay_are_errors) {
  pe_scope *s = pe_scope_new(NULL);
  sparse_grad(s);
  ph_set_f32(s, "lr", PE_SHAPE(1), (float[]){0.1f});
  set_state(s, "s");
  float p0[10];
  memcpy(p0, pe_f32(ph_get(s, "ps")), sizeof p0);
  const int64_t bad[][6] = {
      {2, 1, 3, -1, -1, -1}, {1, 1, 3, -1, -1, -1}, {1, 5, -1, -1, -1, -1}, {1, -1, 3, -1, -1, -1}};
  for (int b = 0; b < 4; b++) {
    ph_set_i64(s, "rows", PE_SHAPE(6), bad[b]);
    pe_op_desc *op = update_op("sgd", "s", true);
    expect_errors(ph_run_op(s, op, NULL), PE_EINVAL, "sgd", "GradRows 'rows'", "Param 'ps'",
                  "ascending", NULL);
    pe_op_desc_free(op);
    ck_assert(memcmp(p0, pe_f32(ph_get(s, "ps")), sizeof p0) == 0); /* nothing written */
  }
  ph_set_i64(s, "rows", PE_SHAPE(6), (int64_t[]){1, 2, 3, -1, -1, -1});
  pe_op_desc *op = update_op("momentum", "s", true);
  PE_CK_OK(pe_op_set_string(op, "regularization_method", "l2_decay"));
  PE_CK_OK(pe_op_set_float(op, "regularization_coeff", 0.1f));
  expect_errors(ph_run_op(s, op, NULL), PE_EATTR, "momentum", "l2_decay", "Grad 'g'", "sparse",
                NULL);
  pe_op_desc_free(op);
  /* Rows of the wrong length for Grad. */
  ph_set_i64(s, "rows", PE_SHAPE(3), (int64_t[]){1, 2, 3});
  op = update_op("sgd", "s", true);
  expect_errors(ph_run_op(s, op, NULL), PE_ESHAPE, "sgd", "Grad 'g'", "GradRows 'rows'", NULL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *emb_sparse_suite(void) {
  Suite *s = suite_create("ops.embedding_sparse");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, sparse_grad_merges_sorted_rows);
  tcase_add_test(tc, dense_grad_refuses_a_rows_output);
  tcase_add_test(tc, updates_on_sparse_equal_dense);
  tcase_add_test(tc, adam_lazy_moves_only_the_rows);
  tcase_add_test(tc, bad_rows_and_decay_are_errors);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(emb_sparse_suite)
