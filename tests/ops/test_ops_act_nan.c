/* NaN through the activations: relu keeps NaN as PyTorch's
 * does (oneDNN's relu, and its post-op in conv2d and matmul, give 0 and hide
 * a corrupt input behind a finite loss), in the plain op and in the fused
 * relu of matmul, conv2d, batch_norm and the residual add; max pooling;
 * relu's gradient passes dy where
 * the mask value is NaN (PyTorch's threshold_backward); tanh and sigmoid
 * give NaN for NaN. */
#include <check.h>
#include <math.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "ops_dnnl_helpers.h"

/* Element i of variable `name` is NaN. */
static void expect_nan_at(pe_scope *s, const char *name, int64_t i, const char *what) {
  const pe_tensor *t = ph_get(s, name);
  ck_assert_ptr_nonnull(t);
  ck_assert_msg(isnan(pe_f32(t)[i]), "%s: %s[%lld] = %g, want NaN", what, name, (long long)i,
                pe_f32(t)[i]);
}

START_TEST(relu_keeps_nan) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(6), (float[]){NAN, -1, 2, -INFINITY, INFINITY, -0.0f});
  dt_run_free(s, ph_op("relu", "X", "x", NULL, "Out", "out", NULL));
  const float *o = pe_f32(ph_get(s, "out"));
  ck_assert(isnan(o[0]));
  ck_assert(o[1] == 0 && o[2] == 2 && o[3] == 0 && isinf(o[4]) && o[4] > 0);
  ck_assert(o[5] == 0 && !signbit(o[5])); /* -0 gives +0 */
  /* Large enough for the parallel loop. */
  ph_set_uniform(s, "x", PE_SHAPE(100000), -1, 1, 7);
  pe_f32(ph_get(s, "x"))[77777] = NAN;
  dt_run_free(s, ph_op("relu", "X", "x", NULL, "Out", "out", NULL));
  expect_nan_at(s, "out", 77777, "relu, large");
  pe_scope_free(s);
}
END_TEST

START_TEST(relu_grad_passes_dy_at_nan) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(4), (float[]){NAN, -1, 2, 0});
  ph_set_f32(s, "out", PE_SHAPE(4), (float[]){NAN, 0, 2, 0});
  ph_set_f32(s, "dout", PE_SHAPE(4), (float[]){5, 6, 7, 8});
  dt_run_free(s, ph_op("relu_grad", "X", "x", "Out", "out", "Out@GRAD", "dout", NULL, "X@GRAD",
                       "dx", NULL));
  dt_expect_close(pe_f32(ph_get(s, "dx")), (float[]){5, 0, 7, 0}, 4, 0, "relu dx");
  pe_scope_free(s);
}
END_TEST

START_TEST(tanh_sigmoid_nan) {
  const char *types[] = {"tanh", "sigmoid"};
  for (int t = 0; t < 2; t++) {
    pe_scope *s = pe_scope_new(NULL);
    ph_set_uniform(s, "x", PE_SHAPE(64), -1, 1, 3);
    pe_f32(ph_get(s, "x"))[5] = NAN;
    dt_run_free(s, ph_op(types[t], "X", "x", NULL, "Out", "out", NULL));
    expect_nan_at(s, "out", 5, types[t]);
    pe_scope_free(s);
  }
}
END_TEST

/* fc: a NaN in row 1 of X makes row 1 of the fused relu(X·W + b) NaN. */
START_TEST(matmul_fused_relu_keeps_nan) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(4, 8), -1, 1, 1);
  ph_set_uniform(s, "w", PE_SHAPE(8, 6), -1, 1, 2);
  ph_set_uniform(s, "b", PE_SHAPE(6), -1, 1, 3);
  pe_f32(ph_get(s, "x"))[1 * 8 + 2] = NAN;
  pe_op_desc *op = ph_op("matmul", "X", "x", "Y", "w", "Bias", "b", NULL, "Out", "out", NULL);
  pe_op_set_string(op, "fuse_activation", "relu");
  pe_op_set_int(op, "x_num_col_dims", 1);
  dt_run_free(s, op);
  for (int j = 0; j < 6; j++) expect_nan_at(s, "out", 1 * 6 + j, "fused matmul");
  for (int j = 0; j < 6; j++) ck_assert(pe_f32(ph_get(s, "out"))[j] >= 0);
  /* Its gradient: dy passes where Out is NaN. dy is 1 in row 1, 0 elsewhere,
   * so db is 1 where it does (a mask to 0 made it 0). */
  float dy1[24] = {0};
  for (int j = 0; j < 6; j++) dy1[6 + j] = 1;
  ph_set_f32(s, "dout", PE_SHAPE(4, 6), dy1);
  pe_op_desc *g = ph_op("matmul_grad", "X", "x", "Y", "w", "Bias", "b", "Out", "out", "Out@GRAD",
                        "dout", NULL, "Bias@GRAD", "db", NULL);
  pe_op_set_string(g, "fuse_activation", "relu");
  pe_op_set_int(g, "x_num_col_dims", 1);
  dt_run_free(s, g);
  const float *db = pe_f32(ph_get(s, "db"));
  for (int j = 0; j < 6; j++)
    ck_assert_msg(db[j] == 1, "db[%d] = %g, want 1 (row 1's dy)", j, db[j]);
  pe_scope_free(s);
}
END_TEST

START_TEST(conv_fused_relu_keeps_nan) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(2, 3, 6, 6), -1, 1, 1);
  ph_set_uniform(s, "w", PE_SHAPE(4, 3, 3, 3), -1, 1, 2);
  ph_set_uniform(s, "b", PE_SHAPE(4), -1, 1, 3);
  pe_f32(ph_get(s, "x"))[1 * 108 + 0 * 36 + 2 * 6 + 2] = NAN; /* sample 1, channel 0, (2, 2) */
  pe_op_desc *op =
      ph_op("conv2d", "Input", "x", "Filter", "w", "Bias", "b", NULL, "Output", "out", NULL);
  pe_op_set_string(op, "fuse_activation", "relu");
  pe_op_set_ints(op, "strides", 2, (int64_t[]){1, 1});
  pe_op_set_ints(op, "paddings", 2, (int64_t[]){1, 1});
  pe_op_set_int(op, "groups", 1);
  dt_run_free(s, op);
  /* Every output channel at (2, 2) of sample 1 reads the NaN. */
  for (int o = 0; o < 4; o++) expect_nan_at(s, "out", 1 * 144 + o * 36 + 2 * 6 + 2, "fused conv");
  pe_scope_free(s);
}
END_TEST

START_TEST(batch_norm_fused_relu_keeps_nan) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(2, 3, 4, 4), -1, 1, 1);
  ph_set_uniform(s, "scale", PE_SHAPE(3), 0.5f, 1.5f, 2);
  ph_set_uniform(s, "bias", PE_SHAPE(3), -0.5f, 0.5f, 3);
  ph_set_uniform(s, "mean", PE_SHAPE(3), -0.5f, 0.5f, 4);
  ph_set_uniform(s, "var", PE_SHAPE(3), 0.5f, 1.5f, 5);
  pe_f32(ph_get(s, "x"))[1 * 48 + 1 * 16 + 5] = NAN;
  pe_op_desc *op = ph_op("batch_norm", "X", "x", "Scale", "scale", "Bias", "bias", "Mean", "mean",
                         "Variance", "var", NULL, "Y", "y", "MeanOut", "mean", "VarianceOut", "var",
                         "SavedMean", "sm", "SavedVariance", "sv", NULL);
  pe_op_set_bool(op, "is_test", true); /* the running statistics: one NaN element */
  pe_op_set_string(op, "fuse_activation", "relu");
  dt_run_free(s, op);
  expect_nan_at(s, "y", 1 * 48 + 1 * 16 + 5, "fused batch_norm");
  pe_scope_free(s);
}
END_TEST

/* Max pooling: a window with a NaN anywhere gives NaN (oneDNN's skipped it:
 * 2, or -FLT_MAX for a window of NaNs), other windows are unchanged, and
 * the window's gradient goes to its first NaN. */
static void max_pool_attrs(pe_op_desc *op) {
  pe_op_set_string(op, "pooling_type", "max");
  pe_op_set_ints(op, "ksize", 2, (int64_t[]){2, 2});
  pe_op_set_ints(op, "strides", 2, (int64_t[]){2, 2});
  pe_op_set_ints(op, "paddings", 2, (int64_t[]){0, 0});
}

START_TEST(max_pool_keeps_nan) {
  const int at[4] = {0, 1, 4, 5}; /* window (0, 0) of a 4x4 plane */
  for (int k = 0; k < 5; k++) {
    pe_scope *s = pe_scope_new(NULL);
    float v[16];
    for (int i = 0; i < 16; i++) v[i] = (float)(i % 5) - 2;
    for (int q = 0; q < 4; q++)
      if (q >= k) v[at[q]] = NAN; /* from position k on: k 0 the whole window */
    if (k == 4) v[at[3]] = NAN;   /* k 4: the last one only */
    ph_set_f32(s, "x", PE_SHAPE(1, 1, 4, 4), v);
    pe_op_desc *op = ph_op("pool2d", "X", "x", NULL, "Out", "out", NULL);
    max_pool_attrs(op);
    dt_run_free(s, op);
    const float *o = pe_f32(ph_get(s, "out"));
    ck_assert_msg(isnan(o[0]), "case %d: out[0] = %g", k, o[0]);
    for (int wi = 1; wi < 4; wi++) { /* the other windows: their maxima */
      int r0 = 2 * (wi / 2), c0 = 2 * (wi % 2);
      float m = v[r0 * 4 + c0];
      for (int q = 1; q < 4; q++) m = fmaxf(m, v[(r0 + q / 2) * 4 + c0 + q % 2]);
      ck_assert_msg(o[wi] == m, "case %d: out[%d] = %g, want %g", k, wi, o[wi], m);
    }
    ph_set_f32(s, "dout", PE_SHAPE(1, 1, 2, 2), (float[]){1, 1, 1, 1});
    op = ph_op("pool2d_grad", "X", "x", "Out", "out", "Out@GRAD", "dout", NULL, "X@GRAD", "dx",
               NULL);
    max_pool_attrs(op);
    dt_run_free(s, op);
    int first = k == 4 ? at[3] : at[k];
    ck_assert_msg(pe_f32(ph_get(s, "dx"))[first] == 1, "case %d: dx[%d] = %g, want 1", k, first,
                  pe_f32(ph_get(s, "dx"))[first]);
    pe_scope_free(s);
  }
}
END_TEST

/* The residual add + relu (fuse_add_act): same shapes and broadcast, NaN
 * kept; the gradient passes dy where Out is NaN. */
START_TEST(add_fused_relu_keeps_nan) {
  for (int bc = 0; bc < 2; bc++) {
    pe_scope *s = pe_scope_new(NULL);
    ph_set_uniform(s, "x", PE_SHAPE(2, 3, 4, 4), -1, 1, 1);
    if (bc)
      ph_set_uniform(s, "y", PE_SHAPE(3), -1, 1, 2);
    else
      ph_set_uniform(s, "y", PE_SHAPE(2, 3, 4, 4), -1, 1, 2);
    pe_f32(ph_get(s, "x"))[17] = NAN;
    pe_op_desc *op = ph_op("elementwise_add", "X", "x", "Y", "y", NULL, "Out", "out", NULL);
    pe_op_set_int(op, "axis", bc ? 1 : -1);
    pe_op_set_string(op, "fuse_activation", "relu");
    dt_run_free(s, op);
    expect_nan_at(s, "out", 17, bc ? "fused add, broadcast" : "fused add");
    ph_set_uniform(s, "dout", PE_SHAPE(2, 3, 4, 4), 1, 2, 3);
    pe_op_desc *g = ph_op("elementwise_add_grad", "X", "x", "Y", "y", "Out", "out", "Out@GRAD",
                          "dout", NULL, "X@GRAD", "dx", NULL);
    pe_op_set_int(g, "axis", bc ? 1 : -1);
    pe_op_set_string(g, "fuse_activation", "relu");
    dt_run_free(s, g);
    ck_assert_float_eq(pe_f32(ph_get(s, "dx"))[17], pe_f32(ph_get(s, "dout"))[17]);
    pe_scope_free(s);
  }
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ops_act_nan");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, relu_keeps_nan);
  tcase_add_test(tc, relu_grad_passes_dy_at_nan);
  tcase_add_test(tc, tanh_sigmoid_nan);
  tcase_add_test(tc, matmul_fused_relu_keeps_nan);
  tcase_add_test(tc, conv_fused_relu_keeps_nan);
  tcase_add_test(tc, batch_norm_fused_relu_keeps_nan);
  tcase_add_test(tc, max_pool_keeps_nan);
  tcase_add_test(tc, add_fused_relu_keeps_nan);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
