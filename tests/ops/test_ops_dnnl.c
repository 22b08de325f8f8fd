/* oneDNN ops, part 1: matmul, relu/tanh/sigmoid, softmax; their gradients;
 * inference (compile-time -1 dims, error messages); the per-op primitive
 * cache. conv2d, pool2d and batch_norm are in test_ops_dnnl_conv.c.
 * Tolerances: forward values within 1e-5 relative of hand computations
 * (f32 arithmetic on small inputs; oneDNN's vectorised exp/tanh are accurate
 * to a few ulp); gradients as in ops_dnnl_helpers.h (max_err <= 1e-2). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "ops_dnnl_helpers.h"

#define FWD_TOL 1e-5

/* --- matmul -------------------------------------------------------------------- */

START_TEST(matmul_2x3_times_3x2) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(2, 3), (float[]){1, 2, 3, 4, 5, 6});
  ph_set_f32(s, "y", PE_SHAPE(3, 2), (float[]){7, 8, 9, 10, 11, 12});
  pe_op_desc *op = ph_op("matmul", "X", "x", "Y", "y", NULL, "Out", "out", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *out = ph_get(s, "out");
  expect_shape(&out->shape, PE_SHAPE(2, 2));
  /* [1 2 3;4 5 6]·[7 8;9 10;11 12] = [58 64;139 154] */
  dt_expect_close(pe_f32(out), (float[]){58, 64, 139, 154}, 4, FWD_TOL, "out");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* X [2,2,3] with x_num_col_dims 2 is a [4,3] matrix; Y [3,1,2] with
 * y_num_col_dims 1 is [3,2]; Out dims = X[:2] + Y[1:] = [2,2,1,2]. */
START_TEST(matmul_num_col_dims_shapes_and_values) {
  pe_scope *s = pe_scope_new(NULL);
  float xv[12], yv[6], want[8];
  for (int i = 0; i < 12; i++) xv[i] = (float)(i % 5) - 1.5f;
  for (int i = 0; i < 6; i++) yv[i] = 0.5f * (float)i - 1.0f;
  for (int m = 0; m < 4; m++)
    for (int n = 0; n < 2; n++) {
      float acc = 0;
      for (int k = 0; k < 3; k++) acc += xv[m * 3 + k] * yv[k * 2 + n];
      want[m * 2 + n] = acc;
    }
  ph_set_f32(s, "x", PE_SHAPE(2, 2, 3), xv);
  ph_set_f32(s, "y", PE_SHAPE(3, 1, 2), yv);
  pe_op_desc *op = ph_op("matmul", "X", "x", "Y", "y", NULL, "Out", "out", NULL);
  pe_op_set_int(op, "x_num_col_dims", 2);
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *out = ph_get(s, "out");
  expect_shape(&out->shape, PE_SHAPE(2, 2, 1, 2));
  dt_expect_close(pe_f32(out), want, 8, FWD_TOL, "out");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(matmul_grad_numeric) {
  const char *outs[] = {"out"}, *wrt[] = {"x", "y"};
  /* 3-D X with x_num_col_dims 2. */
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(2, 3, 4), -1, 1, 11);
  ph_set_uniform(s, "y", PE_SHAPE(4, 5), -1, 1, 12);
  pe_op_desc *op = ph_op("matmul", "X", "x", "Y", "y", NULL, "Out", "out", NULL);
  pe_op_set_int(op, "x_num_col_dims", 2);
  dt_grad_ok(s, op, outs, 1, wrt, 2, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
  /* 3-D Y with y_num_col_dims 2: Y [2,3,4] is [6,4]. */
  s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(3, 6), -1, 1, 13);
  ph_set_uniform(s, "y", PE_SHAPE(2, 3, 4), -1, 1, 14);
  op = ph_op("matmul", "X", "x", "Y", "y", NULL, "Out", "out", NULL);
  pe_op_set_int(op, "y_num_col_dims", 2);
  dt_grad_ok(s, op, outs, 1, wrt, 2, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
  /* A plain 2-D case with a single row. */
  s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(1, 7), -2, 2, 15);
  ph_set_uniform(s, "y", PE_SHAPE(7, 3), -2, 2, 16);
  op = ph_op("matmul", "X", "x", "Y", "y", NULL, "Out", "out", NULL);
  dt_grad_ok(s, op, outs, 1, wrt, 2, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* dX = dOut·Yᵀ written out; a pruned Y@GRAD is skipped; a pruned
 * Out@GRAD gives zeros. */
START_TEST(matmul_grad_values_and_pruning) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(2, 3), (float[]){1, 2, 3, 4, 5, 6});
  ph_set_f32(s, "y", PE_SHAPE(3, 2), (float[]){7, 8, 9, 10, 11, 12});
  ph_set_f32(s, "dout", PE_SHAPE(2, 2), (float[]){1, 0, 0, 2});
  pe_op_desc *op =
      ph_op("matmul_grad", "X", "x", "Y", "y", "Out@GRAD", "dout", NULL, "X@GRAD", "dx", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  /* dOut·Yᵀ = [1 0;0 2]·[7 9 11;8 10 12] = [7 9 11;16 20 24] */
  dt_expect_close(pe_f32(ph_get(s, "dx")), (float[]){7, 9, 11, 16, 20, 24}, 6, FWD_TOL, "dx");
  pe_op_desc_free(op);
  op = ph_op("matmul_grad", "X", "x", "Y", "y", NULL, "Y@GRAD", "dy", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *dy = ph_get(s, "dy");
  expect_shape(&dy->shape, PE_SHAPE(3, 2));
  for (int i = 0; i < 6; i++) ck_assert_float_eq(pe_f32(dy)[i], 0.0f);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(matmul_infer_batch_and_errors) {
  pe_op_desc *op = ph_op("matmul", "X", "h", "Y", "fc.w", NULL, "Out", "o", NULL);
  dt_var ok[] = {{"h", PE_F32, PE_SHAPE(-1, 128)}, {"fc.w", PE_F32, PE_SHAPE(128, 10)}};
  pe_meta m;
  PE_CK_OK(dt_infer(op, ok, 2, &m));
  expect_shape(&m.shape, PE_SHAPE(-1, 10));
  ck_assert_int_eq(m.dtype, PE_F32);
  dt_var bad[] = {{"h", PE_F32, PE_SHAPE(-1, 128)}, {"fc.w", PE_F32, PE_SHAPE(256, 10)}};
  dt_expect_infer_error(op, bad, 2, PE_ESHAPE, "matmul", "'fc.w'", "[256,10]", "'h'", "[-1,128]",
                        "128 vs 256", NULL);
  dt_var i64[] = {{"h", PE_I64, PE_SHAPE(-1, 128)}, {"fc.w", PE_F32, PE_SHAPE(128, 10)}};
  dt_expect_infer_error(op, i64, 2, PE_EDTYPE, "'h'", "i64", "f32", NULL);
  pe_op_set_int(op, "x_num_col_dims", 2);
  dt_expect_infer_error(op, ok, 2, PE_EATTR, "x_num_col_dims", "'h'", NULL);
  pe_op_desc_free(op);
  /* The grad row validates the same way. */
  op = ph_op("matmul_grad", "X", "h", "Y", "fc.w", "Out@GRAD", "o@GRAD", NULL, "X@GRAD", "h@GRAD",
             NULL);
  dt_var g[] = {{"h", PE_F32, PE_SHAPE(-1, 128)},
                {"fc.w", PE_F32, PE_SHAPE(128, 10)},
                {"o@GRAD", PE_F32, PE_SHAPE(-1, 10)}};
  PE_CK_OK(dt_infer(op, g, 3, &m));
  expect_shape(&m.shape, PE_SHAPE(-1, 128));
  pe_op_desc_free(op);
}
END_TEST

/* --- activations ------------------------------------------------------------------- */

static void act_forward(const char *type, const float *x, int n, double (*ref)(double)) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(n), x);
  pe_op_desc *op = ph_op(type, "X", "x", NULL, "Out", "out", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  float want[16];
  for (int i = 0; i < n; i++) want[i] = (float)ref(x[i]);
  dt_expect_close(pe_f32(ph_get(s, "out")), want, n, FWD_TOL, type);
  pe_op_desc_free(op);
  pe_scope_free(s);
}

static double ref_relu(double x) {
  return x > 0 ? x : 0;
}
static double ref_sigmoid(double x) {
  return 1.0 / (1.0 + exp(-x));
}

START_TEST(activations_known_points) {
  const float pts[] = {-3, -1, -0.5f, 0, 0.25f, 0.5f, 1, 2, 4};
  act_forward("relu", pts, 9, ref_relu);
  act_forward("tanh", pts, 9, tanh);
  act_forward("sigmoid", pts, 9, ref_sigmoid);
  /* A few written out. */
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(2, 2), (float[]){-2, 0, 0.5f, 3});
  pe_op_desc *op = ph_op("relu", "X", "x", NULL, "Out", "out", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  dt_expect_close(pe_f32(ph_get(s, "out")), (float[]){0, 0, 0.5f, 3}, 4, 0, "relu");
  pe_op_desc_free(op);
  op = ph_op("sigmoid", "X", "x", NULL, "Out", "out", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  dt_expect_close(pe_f32(ph_get(s, "out")), (float[]){0.11920292f, 0.5f, 0.62245933f, 0.95257413f},
                  4, FWD_TOL, "sigmoid");
  pe_op_desc_free(op);
  op = ph_op("tanh", "X", "x", NULL, "Out", "out", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  dt_expect_close(pe_f32(ph_get(s, "out")), (float[]){-0.96402758f, 0, 0.46211716f, 0.99505475f}, 4,
                  FWD_TOL, "tanh");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* Values in ±[0.1, 2]: relu's kink at 0 is at least 100 steps away. */
static void set_away_from_zero(pe_scope *s, const char *name, pe_shape shape, uint64_t seed) {
  pe_tensor *t = ph_set_uniform(s, name, shape, -1, 1, seed);
  for (int64_t i = 0; i < pe_tensor_numel(t); i++) {
    float v = pe_f32(t)[i];
    pe_f32(t)[i] = (v < 0 ? -0.1f : 0.1f) + 1.9f * v;
  }
}

START_TEST(activation_grads_numeric) {
  const char *types[] = {"relu", "tanh", "sigmoid"};
  const pe_shape shapes[] = {PE_SHAPE(3, 4), PE_SHAPE(2, 3, 5), PE_SHAPE(7)};
  const char *outs[] = {"out"}, *wrt[] = {"x"};
  for (int t = 0; t < 3; t++)
    for (int k = 0; k < 3; k++) {
      pe_scope *s = pe_scope_new(NULL);
      set_away_from_zero(s, "x", shapes[k], 20 + (uint64_t)k);
      pe_op_desc *op = ph_op(types[t], "X", "x", NULL, "Out", "out", NULL);
      dt_grad_ok(s, op, outs, 1, wrt, 1, 0);
      pe_op_desc_free(op);
      pe_scope_free(s);
    }
}
END_TEST

/* relu's gradient is read from X, tanh's from Out: exact values. */
START_TEST(activation_grad_values) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(4), (float[]){-1, 2, -3, 4});
  ph_set_f32(s, "out", PE_SHAPE(4), (float[]){0.5f, -0.5f, 0, 0.9f});
  ph_set_f32(s, "dout", PE_SHAPE(4), (float[]){1, 2, 3, 4});
  pe_op_desc *op =
      ph_op("relu_grad", "X", "x", "Out", "out", "Out@GRAD", "dout", NULL, "X@GRAD", "dx", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  dt_expect_close(pe_f32(ph_get(s, "dx")), (float[]){0, 2, 0, 4}, 4, 0, "relu dx");
  pe_op_desc_free(op);
  op = ph_op("tanh_grad", "X", "x", "Out", "out", "Out@GRAD", "dout", NULL, "X@GRAD", "dx", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  /* dx = dout * (1 - out^2) */
  dt_expect_close(pe_f32(ph_get(s, "dx")), (float[]){0.75f, 1.5f, 3, 4 * 0.19f}, 4, FWD_TOL,
                  "tanh dx");
  pe_op_desc_free(op);
  op =
      ph_op("sigmoid_grad", "X", "x", "Out", "out", "Out@GRAD", "dout", NULL, "X@GRAD", "dx", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  /* dx = dout * out * (1 - out) */
  dt_expect_close(pe_f32(ph_get(s, "dx")), (float[]){0.25f, 2 * -0.75f, 0, 4 * 0.09f}, 4, FWD_TOL,
                  "sigmoid dx");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* --- softmax ------------------------------------------------------------------------ */

START_TEST(softmax_rows) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(3, 3), (float[]){1, 2, 3, 0, 0, 0, -1, 5, 100});
  pe_op_desc *op = ph_op("softmax", "X", "x", NULL, "Out", "out", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  double z = exp(1) + exp(2) + exp(3), z3 = exp(-101) + exp(-95) + 1;
  float want[9] = {(float)(exp(1) / z),
                   (float)(exp(2) / z),
                   (float)(exp(3) / z),
                   1 / 3.f,
                   1 / 3.f,
                   1 / 3.f,
                   (float)(exp(-101) / z3),
                   (float)(exp(-95) / z3),
                   (float)(1 / z3)};
  /* 0.09003057, 0.24472847, 0.66524096 */
  dt_expect_close(pe_f32(ph_get(s, "out")), want, 9, FWD_TOL, "softmax");
  ck_assert_float_eq_tol(pe_f32(ph_get(s, "out"))[0], 0.09003057f, 1e-6f);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* axis 1 of [2,3,2]: each (n, w) column over the 3 channels. */
START_TEST(softmax_middle_axis) {
  pe_scope *s = pe_scope_new(NULL);
  float xv[12], want[12];
  for (int i = 0; i < 12; i++) xv[i] = 0.3f * (float)((i * 7) % 12) - 1.5f;
  for (int n = 0; n < 2; n++)
    for (int w = 0; w < 2; w++) {
      double z = 0;
      for (int c = 0; c < 3; c++) z += exp(xv[n * 6 + c * 2 + w]);
      for (int c = 0; c < 3; c++) want[n * 6 + c * 2 + w] = (float)(exp(xv[n * 6 + c * 2 + w]) / z);
    }
  ph_set_f32(s, "x", PE_SHAPE(2, 3, 2), xv);
  pe_op_desc *op = ph_op("softmax", "X", "x", NULL, "Out", "out", NULL);
  pe_op_set_int(op, "axis", 1);
  PE_CK_OK(ph_run_op(s, op, NULL));
  dt_expect_close(pe_f32(ph_get(s, "out")), want, 12, FWD_TOL, "softmax axis 1");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(softmax_grad_numeric) {
  const char *outs[] = {"out"}, *wrt[] = {"x"};
  const pe_shape shapes[] = {PE_SHAPE(4, 5), PE_SHAPE(2, 3, 4), PE_SHAPE(2, 3, 4)};
  const int axes[] = {-1, 1, 0};
  for (int k = 0; k < 3; k++) {
    pe_scope *s = pe_scope_new(NULL);
    ph_set_uniform(s, "x", shapes[k], -2, 2, 30 + (uint64_t)k);
    pe_op_desc *op = ph_op("softmax", "X", "x", NULL, "Out", "out", NULL);
    pe_op_set_int(op, "axis", axes[k]);
    dt_grad_ok(s, op, outs, 1, wrt, 1, 0);
    pe_op_desc_free(op);
    pe_scope_free(s);
  }
}
END_TEST

START_TEST(activation_infer_errors) {
  pe_op_desc *op = ph_op("relu", "X", "h", NULL, "Out", "o", NULL);
  dt_var i32[] = {{"h", PE_I32, PE_SHAPE(-1, 4)}};
  dt_expect_infer_error(op, i32, 1, PE_EDTYPE, "relu", "'h'", "[-1,4]", "i32", NULL);
  dt_var ok[] = {{"h", PE_F32, PE_SHAPE(-1, 4)}};
  pe_meta m;
  PE_CK_OK(dt_infer(op, ok, 1, &m));
  expect_shape(&m.shape, PE_SHAPE(-1, 4));
  pe_op_desc_free(op);
  op = ph_op("softmax", "X", "h", NULL, "Out", "o", NULL);
  pe_op_set_int(op, "axis", 2);
  dt_expect_infer_error(op, ok, 1, PE_EATTR, "axis 2", "'h'", "[-1,4]", NULL);
  pe_op_desc_free(op);
}
END_TEST

/* --- primitive cache --------------------------------------------------------------- */

/* One op instance run through its state: a repeated shape reuses the
 * entry, a new batch builds a second one, more shapes than entries evict
 * the least recently used; results stay right with fresh data. */
START_TEST(primitive_cache_reused) {
  pe_device_ctx dev;
  PE_CK_OK(pe_device_ctx_init(&dev, pe_cpu_place(), 0));
  pe_device_ctx_bind(&dev);
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "y", PE_SHAPE(3, 2), (float[]){7, 8, 9, 10, 11, 12});
  pe_op_desc *op = ph_op("matmul", "X", "x", "Y", "y", NULL, "Out", "out", NULL);
  ph_op_inst *inst = ph_op_inst_new(op, &dev);
  ph_set_f32(s, "x", PE_SHAPE(2, 3), (float[]){1, 2, 3, 4, 5, 6});
  PE_CK_OK(ph_op_inst_run(inst, s, NULL));
  ph_set_f32(s, "x", PE_SHAPE(2, 3), (float[]){1, 0, 0, 0, 1, 0});
  PE_CK_OK(ph_op_inst_run(inst, s, NULL));
  dt_expect_close(pe_f32(ph_get(s, "out")), (float[]){7, 8, 9, 10}, 4, 0, "second run");
  pe_dnnl_cache_stats st = pe_dnnl_cache_stats_of(inst->state);
  ck_assert_uint_eq(st.builds, 1);
  ck_assert_uint_eq(st.hits, 1);
  ck_assert_int_eq(st.entries, 1);
  /* A final partial batch: a second entry; then back to the full batch. */
  ph_set_f32(s, "x", PE_SHAPE(1, 3), (float[]){0, 0, 1});
  PE_CK_OK(ph_op_inst_run(inst, s, NULL));
  dt_expect_close(pe_f32(ph_get(s, "out")), (float[]){11, 12}, 2, 0, "partial batch");
  ph_set_f32(s, "x", PE_SHAPE(2, 3), (float[]){1, 2, 3, 4, 5, 6});
  PE_CK_OK(ph_op_inst_run(inst, s, NULL));
  dt_expect_close(pe_f32(ph_get(s, "out")), (float[]){58, 64, 139, 154}, 4, FWD_TOL, "full batch");
  st = pe_dnnl_cache_stats_of(inst->state);
  ck_assert_uint_eq(st.builds, 2);
  ck_assert_uint_eq(st.hits, 2);
  ck_assert_int_eq(st.entries, 2);
  /* Batches 3..6: four more shapes; the cache keeps PE_DNNL_CACHE_ENTRIES. */
  for (int b = 3; b <= 6; b++) {
    ph_set_uniform(s, "x", PE_SHAPE(b, 3), -1, 1, (uint64_t)b);
    PE_CK_OK(ph_op_inst_run(inst, s, NULL));
  }
  st = pe_dnnl_cache_stats_of(inst->state);
  ck_assert_uint_eq(st.builds, 6);
  ck_assert_uint_eq(st.evictions, 2);
  ck_assert_int_eq(st.entries, PE_DNNL_CACHE_ENTRIES);
  ph_op_inst_free(inst);
  pe_op_desc_free(op);

  /* A two-primitive grad entry (matmul_grad) is reused too. */
  ph_set_f32(s, "x", PE_SHAPE(2, 3), (float[]){1, 2, 3, 4, 5, 6});
  ph_set_f32(s, "dout", PE_SHAPE(2, 2), (float[]){1, 0, 0, 2});
  op = ph_op("matmul_grad", "X", "x", "Y", "y", "Out@GRAD", "dout", NULL, "X@GRAD", "dx", "Y@GRAD",
             "dy", NULL);
  inst = ph_op_inst_new(op, &dev);
  for (int i = 0; i < 3; i++) PE_CK_OK(ph_op_inst_run(inst, s, NULL));
  /* Xᵀ·dOut = [1 4;2 5;3 6]·[1 0;0 2] = [1 8;2 10;3 12] */
  dt_expect_close(pe_f32(ph_get(s, "dy")), (float[]){1, 8, 2, 10, 3, 12}, 6, FWD_TOL, "dy");
  st = pe_dnnl_cache_stats_of(inst->state);
  ck_assert_uint_eq(st.builds, 1);
  ck_assert_uint_eq(st.hits, 2);
  ph_op_inst_free(inst);
  pe_op_desc_free(op);

  /* The stats of a never-used state are zeros. */
  st = pe_dnnl_cache_stats_of(NULL);
  ck_assert_uint_eq(st.builds, 0);
  pe_scope_free(s);
  pe_device_ctx_destroy(&dev);
}
END_TEST

/* Every row of these groups is registered with an infer, a CPU kernel and
 * the cache's state_free; forward rows have a grad maker. (batch_norm's
 * cpu kernel is the project's own, without a primitive cache:
 * ops/cpu/batch_norm.c says why.) */
START_TEST(rows_registered) {
  const char *types[] = {"matmul", "relu", "tanh", "sigmoid", "softmax", "conv2d", "pool2d"};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    const pe_op_def *d = pe_op_lookup(types[i]);
    ck_assert_msg(d != NULL, "%s not registered", types[i]);
    ck_assert(d->infer && d->kernel_cpu && d->grad && d->state_free == pe_dnnl_cache_free);
    char g[64];
    snprintf(g, sizeof g, "%s_grad", types[i]);
    const pe_op_def *gd = pe_op_lookup(g);
    ck_assert_msg(gd != NULL, "%s not registered", g);
    ck_assert(gd->infer && gd->kernel_cpu && !gd->grad && gd->state_free == pe_dnnl_cache_free);
  }
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ops_dnnl");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, matmul_2x3_times_3x2);
  tcase_add_test(tc, matmul_num_col_dims_shapes_and_values);
  tcase_add_test(tc, matmul_grad_numeric);
  tcase_add_test(tc, matmul_grad_values_and_pruning);
  tcase_add_test(tc, matmul_infer_batch_and_errors);
  tcase_add_test(tc, activations_known_points);
  tcase_add_test(tc, activation_grads_numeric);
  tcase_add_test(tc, activation_grad_values);
  tcase_add_test(tc, softmax_rows);
  tcase_add_test(tc, softmax_middle_axis);
  tcase_add_test(tc, softmax_grad_numeric);
  tcase_add_test(tc, activation_infer_errors);
  tcase_add_test(tc, primitive_cache_reused);
  tcase_add_test(tc, rows_registered);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
