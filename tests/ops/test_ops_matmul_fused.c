/* matmul with a Bias input and fuse_activation "relu" (what the
 * fuse_conv_act pass makes of a fully-connected layer, ops/cpu/matmul.c):
 * forward and every gradient equal the unfused ops they replace (matmul,
 * elementwise_add at axis x_num_col_dims, relu and their grad ops, each
 * checked against references elsewhere), the gradients also numerically,
 * and infer refuses a bad Bias or activation naming the variables and the
 * shapes. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "ops/cpu/matmul_weights.h"
#include "ops_dnnl_helpers.h"

typedef struct mm_case {
  int nx;       /* rank of X */
  int64_t x[3]; /* X dims */
  int xnc;      /* x_num_col_dims */
  int64_t k, n; /* Y [k, n] */
} mm_case;

/* Small odd shapes; the MLP's first layer (128x784x256); a 3-D input split
 * at 2; a wide layer (M*N above the kernels' parallel threshold, a partial
 * last block of columns). */
static const mm_case cases[] = {
    {2, {5, 7}, 1, 7, 6},
    {2, {128, 784}, 1, 784, 256},
    {3, {2, 3, 8}, 2, 8, 5},
    {2, {64, 96}, 1, 96, 1030},
};
#define N_CASES (sizeof cases / sizeof cases[0])

/* matmul(x, w [, b]) -> out, relu fused when asked. */
static pe_op_desc *fused_op(const mm_case *k, bool bias, bool relu) {
  pe_op_desc *op = ph_op("matmul", "X", "x", "Y", "w", NULL, "Out", "out", NULL);
  if (bias) pe_op_input1(op, "Bias", "b");
  if (relu) pe_op_set_string(op, "fuse_activation", "relu");
  pe_op_set_int(op, "x_num_col_dims", k->xnc);
  return op;
}

/* The builder's fc: bias added at axis x_num_col_dims. */
static pe_op_desc *bias_add(const char *type, const mm_case *k) {
  pe_op_desc *add = ph_op(type, NULL, NULL);
  pe_op_set_int(add, "axis", k->xnc);
  return add;
}

/* The unfused chain into z1 (matmul), z2 (+ bias), z3 (relu). */
static void run_unfused(pe_scope *s, const mm_case *k) {
  pe_op_desc *mm = ph_op("matmul", "X", "x", "Y", "w", NULL, "Out", "z1", NULL);
  pe_op_set_int(mm, "x_num_col_dims", k->xnc);
  dt_run_free(s, mm);
  pe_op_desc *add = bias_add("elementwise_add", k);
  pe_op_input1(add, "X", "z1");
  pe_op_input1(add, "Y", "b");
  pe_op_output1(add, "Out", "z2");
  dt_run_free(s, add);
  dt_run_free(s, ph_op("relu", "X", "z2", NULL, "Out", "z3", NULL));
}

static void set_inputs(pe_scope *s, const mm_case *k, uint64_t seed) {
  ph_set_uniform(s, "x", pe_shape_make(k->nx, k->x), -1, 1, seed);
  ph_set_uniform(s, "w", PE_SHAPE(k->k, k->n), -0.2f, 0.2f, seed + 1);
  ph_set_uniform(s, "b", PE_SHAPE(k->n), -1, 1, seed + 2);
}

START_TEST(fused_forward_matches_unfused) {
  for (size_t c = 0; c < N_CASES; c++) {
    pe_scope *s = pe_scope_new(NULL);
    set_inputs(s, &cases[c], 10 + 3 * c);
    run_unfused(s, &cases[c]);
    dt_expect_fused_forward(s, fused_op(&cases[c], true, true), fused_op(&cases[c], true, false),
                            "matmul");
    pe_scope_free(s);
  }
}
END_TEST

/* The unfused grad chain from dout: through relu_grad when relu, straight
 * into the bias add's gradient otherwise; into dx_u, dw_u, db_u. */
static void run_unfused_grad(pe_scope *s, const mm_case *k, bool relu) {
  if (relu)
    dt_run_free(s, ph_op("relu_grad", "X", "z2", "Out", "z3", "Out@GRAD", "dout", NULL, "X@GRAD",
                         "dz2", NULL));
  pe_op_desc *add = bias_add("elementwise_add_grad", k);
  pe_op_input1(add, "X", "z1");
  pe_op_input1(add, "Y", "b");
  pe_op_input1(add, "Out@GRAD", relu ? "dz2" : "dout");
  pe_op_output1(add, "X@GRAD", "dz1");
  pe_op_output1(add, "Y@GRAD", "db_u");
  dt_run_free(s, add);
  pe_op_desc *mm = ph_op("matmul_grad", "X", "x", "Y", "w", "Out@GRAD", "dz1", NULL, "X@GRAD",
                         "dx_u", "Y@GRAD", "dw_u", NULL);
  pe_op_set_int(mm, "x_num_col_dims", k->xnc);
  dt_run_free(s, mm);
}

/* Fused grad with the outputs asked for present, the others absent. */
static void run_fused_grad(pe_scope *s, const mm_case *k, bool relu, bool dx, bool dw, bool db) {
  pe_op_desc *op = ph_op("matmul_grad", "X", "x", "Y", "w", "Bias", "b", "Out", "out", "Out@GRAD",
                         "dout", NULL, NULL);
  if (dx) pe_op_output1(op, "X@GRAD", "dx");
  if (dw) pe_op_output1(op, "Y@GRAD", "dw");
  if (db) pe_op_output1(op, "Bias@GRAD", "db");
  if (relu) pe_op_set_string(op, "fuse_activation", "relu");
  pe_op_set_int(op, "x_num_col_dims", k->xnc);
  /* Stale values in the outputs: the kernel must overwrite them. */
  ph_set_uniform(s, "dx", pe_shape_make(k->nx, k->x), 5, 6, 90);
  ph_set_uniform(s, "dw", PE_SHAPE(k->k, k->n), 5, 6, 91);
  ph_set_uniform(s, "db", PE_SHAPE(k->n), 5, 6, 92);
  dt_run_free(s, op);
}

START_TEST(fused_grad_matches_unfused) {
  for (size_t c = 0; c < N_CASES; c++) {
    const mm_case *k = &cases[c];
    pe_scope *s = pe_scope_new(NULL);
    set_inputs(s, k, 20 + 3 * c);
    run_unfused(s, k);
    dt_run_free(s, fused_op(k, true, true));
    ph_set_uniform(s, "dout", ph_get(s, "z3")->shape, -1, 1, 30 + c);
    run_unfused_grad(s, k, true);
    run_fused_grad(s, k, true, true, true, true);
    dt_expect_same(s, "dx", "dx_u", "X@GRAD");
    dt_expect_same(s, "dw", "dw_u", "Y@GRAD");
    dt_expect_same(s, "db", "db_u", "Bias@GRAD");
    /* Each output alone: the mask is made whichever is asked for. */
    run_fused_grad(s, k, true, true, false, false);
    dt_expect_same(s, "dx", "dx_u", "X@GRAD alone");
    run_fused_grad(s, k, true, false, true, false);
    dt_expect_same(s, "dw", "dw_u", "Y@GRAD alone");
    run_fused_grad(s, k, true, false, false, true);
    dt_expect_same(s, "db", "db_u", "Bias@GRAD alone");
    /* The bias alone (no relu): Out@GRAD used as it is. */
    dt_run_free(s, fused_op(k, true, false));
    run_unfused_grad(s, k, false);
    run_fused_grad(s, k, false, true, true, true);
    dt_expect_same(s, "dx", "dx_u", "X@GRAD, bias only");
    dt_expect_same(s, "dw", "dw_u", "Y@GRAD, bias only");
    dt_expect_same(s, "db", "db_u", "Bias@GRAD, bias only");
    pe_scope_free(s);
  }
}
END_TEST

START_TEST(fused_grad_numeric) {
  /* Bias only: smooth everywhere. */
  mm_case k = {3, {2, 3, 4}, 2, 4, 5};
  pe_scope *s = pe_scope_new(NULL);
  set_inputs(s, &k, 40);
  dt_fused_grad_ok(s, fused_op(&k, true, false), 0);
  /* With relu, at inputs whose pre-activations are all at least 0.01 away
   * from relu's kink (checked here), so central differences see no kink. */
  mm_case k2 = {2, {4, 6}, 1, 6, 5};
  s = pe_scope_new(NULL);
  set_inputs(s, &k2, 51);
  run_unfused(s, &k2);
  ck_assert_int_gt(dt_count_negative(s, "z2", 0.01f), 0);
  dt_fused_grad_ok(s, fused_op(&k2, true, true), 0);
}
END_TEST

/* out = x·w + b by naive loops in double: the reference for the large
 * weights below. */
static void naive_fc(pe_scope *s, int64_t m, int64_t k, int64_t n, float *want) {
  const float *x = pe_f32(ph_get(s, "x")), *w = pe_f32(ph_get(s, "w")), *b = pe_f32(ph_get(s, "b"));
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double acc = b[j];
      for (int64_t t = 0; t < k; t++) acc += (double)x[i * k + t] * w[t * n + j];
      want[i * n + j] = (float)acc;
    }
}

/* dw = xᵀ·dout and dx = dout·wᵀ by naive loops in double. */
static void naive_fc_grad(pe_scope *s, int64_t m, int64_t k, int64_t n, float *dw, float *dx) {
  const float *x = pe_f32(ph_get(s, "x")), *w = pe_f32(ph_get(s, "w"));
  const float *g = pe_f32(ph_get(s, "dout"));
  for (int64_t t = 0; t < k; t++)
    for (int64_t j = 0; j < n; j++) {
      double acc = 0;
      for (int64_t i = 0; i < m; i++) acc += (double)x[i * k + t] * g[i * n + j];
      dw[t * n + j] = (float)acc;
    }
  for (int64_t i = 0; i < m; i++)
    for (int64_t t = 0; t < k; t++) {
      double acc = 0;
      for (int64_t j = 0; j < n; j++) acc += (double)g[i * n + j] * w[t * n + j];
      dx[i * k + t] = (float)acc;
    }
}

/* Expects primitive `prim` of the op state's only entry on oneDNN's
 * gemm-based matmul (gemm) or on brgemm, oneDNN's first choice with
 * AVX-512; with AVX2 its first choice is gemm-based for every product, so
 * only the gemm case is checked there. */
static void expect_impl(const ph_op_inst *inst, int prim, bool gemm, const char *what) {
  const char *impl = pe_dnnl_impl_name(pe_dnnl_cache_pd(inst->state, 0, prim));
  ck_assert_msg(impl[0], "%s: no primitive", what);
  bool is_gemm = strncmp(impl, PE_MATMUL_LARGE_WEIGHTS_IMPL,
                         strlen(PE_MATMUL_LARGE_WEIGHTS_IMPL)) == 0;
  if (gemm)
    ck_assert_msg(is_gemm, "%s runs on %s", what, impl);
  else if (dnnl_get_effective_cpu_isa() >= dnnl_cpu_isa_avx512_core)
    ck_assert_msg(strncmp(impl, "brg", 3) == 0, "%s runs on %s", what, impl);
}

/* Weights of PE_MATMUL_LARGE_WEIGHTS_MIN elements or more are read by
 * oneDNN's gemm-based matmul in the forward product and the weight
 * gradient (matmul_weights.h), the rest by its first choice. One op
 * instance (its cached primitive) runs twice with new weights in between:
 * the second output must follow them. The gradient's three outputs equal
 * naive loops. */
START_TEST(large_weights_on_the_gemm_implementation) {
  const int64_t m = 6, k = 2048, n = 1024;
  ck_assert(pe_matmul_weights_large(k, n));
  ck_assert(!pe_matmul_weights_large(784, 1024)); /* the MLP's first layer stays on brgemm */
  mm_case kc = {2, {m, k}, 1, k, n};
  pe_scope *s = pe_scope_new(NULL);
  pe_op_desc *op = fused_op(&kc, true, false);
  ph_op_inst *inst = ph_op_inst_new(op, NULL);
  float *want = malloc((size_t)(k * n) * sizeof *want), *want_dx = malloc((size_t)(m * k) * 4);
  ck_assert_ptr_nonnull(want);
  ck_assert_ptr_nonnull(want_dx);
  for (int round = 0; round < 2; round++) {
    set_inputs(s, &kc, 70 + 5 * (uint64_t)round);
    PE_CK_OK(ph_op_inst_run(inst, s, NULL));
    naive_fc(s, m, k, n, want);
    dt_expect_close(pe_f32(ph_get(s, "out")), want, m * n, 1e-5, "large weights");
  }
  pe_dnnl_cache_stats st = pe_dnnl_cache_stats_of(inst->state);
  ck_assert_int_eq(st.entries, 1);
  ck_assert_int_eq((int)st.builds, 1); /* the second call reused the primitive */
  ck_assert_int_eq(st.reorders, 0);    /* the weights are read in place */
  expect_impl(inst, 0, true, "the forward product of large weights");

  pe_op_desc *g = ph_op("matmul_grad", "X", "x", "Y", "w", "Bias", "b", "Out@GRAD", "dout", NULL,
                        "X@GRAD", "dx", "Y@GRAD", "dw", "Bias@GRAD", "db", NULL);
  ph_op_inst *ginst = ph_op_inst_new(g, NULL);
  ph_set_uniform(s, "dout", PE_SHAPE(m, n), -1, 1, 81);
  PE_CK_OK(ph_op_inst_run(ginst, s, NULL));
  naive_fc_grad(s, m, k, n, want, want_dx);
  dt_expect_close(pe_f32(ph_get(s, "dw")), want, k * n, 1e-5, "Y@GRAD of large weights");
  dt_expect_close(pe_f32(ph_get(s, "dx")), want_dx, m * k, 1e-5, "X@GRAD of large weights");
  expect_impl(ginst, 0, false, "dOut·Wᵀ"); /* brgemm reads the transposed weights at full speed */
  expect_impl(ginst, 1, true, "the weight gradient Xᵀ·dOut of large weights");

  /* Below the threshold the forward product is oneDNN's first choice. */
  mm_case small = {2, {m, 784}, 1, 784, 1024};
  pe_op_desc *op2 = fused_op(&small, true, false);
  ph_op_inst *inst2 = ph_op_inst_new(op2, NULL);
  set_inputs(s, &small, 77);
  PE_CK_OK(ph_op_inst_run(inst2, s, NULL));
  expect_impl(inst2, 0, false, "the forward product of [784,1024] weights");
  ph_op_inst_free(inst2);
  pe_op_desc_free(op2);
  free(want);
  free(want_dx);
  ph_op_inst_free(ginst);
  pe_op_desc_free(g);
  ph_op_inst_free(inst);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(fused_infer_errors) {
  mm_case k = {2, {-1, 16}, 1, 16, 8};
  pe_op_desc *op = fused_op(&k, true, true);
  dt_var ok[] = {
      {"x", PE_F32, PE_SHAPE(-1, 16)}, {"w", PE_F32, PE_SHAPE(16, 8)}, {"b", PE_F32, PE_SHAPE(8)}};
  pe_meta m;
  PE_CK_OK(dt_infer(op, ok, 3, &m));
  expect_shape(&m.shape, PE_SHAPE(-1, 8));
  dt_var wrong[] = {ok[0], ok[1], {"b", PE_F32, PE_SHAPE(7)}};
  dt_expect_infer_error(op, wrong, 3, PE_ESHAPE, "matmul", "Bias 'b'", "[7]", "[8]", "'w'",
                        "[16,8]", NULL);
  dt_var rank2[] = {ok[0], ok[1], {"b", PE_F32, PE_SHAPE(8, 1)}};
  dt_expect_infer_error(op, rank2, 3, PE_ESHAPE, "Bias 'b'", "[8,1]", NULL);
  /* Y split at 2: Out's last dim is not all of Y's columns. */
  dt_var y3[] = {{"x", PE_F32, PE_SHAPE(-1, 32)}, {"w", PE_F32, PE_SHAPE(4, 8, 8)}, ok[2]};
  pe_op_set_int(op, "y_num_col_dims", 2);
  dt_expect_infer_error(op, y3, 3, PE_ESHAPE, "Bias 'b'", "2-D Y", "'w'", "[4,8,8]",
                        "y_num_col_dims 2", NULL);
  pe_op_set_int(op, "y_num_col_dims", 1);
  pe_op_set_string(op, "fuse_activation", "gelu");
  dt_expect_infer_error(op, ok, 3, PE_EATTR, "matmul", "fuse_activation 'gelu'", NULL);
  pe_op_desc_free(op);
  /* The fused relu's gradient needs the forward Out (its mask). */
  pe_op_desc *g = ph_op("matmul_grad", "X", "x", "Y", "w", "Bias", "b", "Out@GRAD", "dout", NULL,
                        "X@GRAD", "dx", NULL);
  pe_op_set_string(g, "fuse_activation", "relu");
  dt_var gv[] = {ok[0], ok[1], ok[2], {"dout", PE_F32, PE_SHAPE(-1, 8)}};
  dt_expect_infer_error(g, gv, 4, PE_EARITY, "matmul_grad", "Out", NULL);
  pe_op_desc_free(g);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ops_matmul_fused");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, fused_forward_matches_unfused);
  tcase_add_test(tc, fused_grad_matches_unfused);
  tcase_add_test(tc, fused_grad_numeric);
  tcase_add_test(tc, fused_infer_errors);
  tcase_add_test(tc, large_weights_on_the_gemm_implementation);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
