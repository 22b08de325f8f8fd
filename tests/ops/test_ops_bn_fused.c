/* batch_norm with fuse_activation "relu" (what the fuse_conv_act pass makes
 * of batch_norm -> relu, ops/cpu/batch_norm.c): the forward, in training
 * and in test mode, equals batch_norm then relu (Y, the statistics and the
 * running statistics); batch_norm_grad with Y equals relu_grad then
 * batch_norm_grad for every output (each checked against references
 * elsewhere), the gradients also numerically; infer refuses an unknown
 * activation and a fused gradient without Y, naming them. */
#include <check.h>
#include <math.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "ops_dnnl_helpers.h"

/* Small with a spatial size (25) no vector width divides; the ResNet's
 * first blocks (64x16x28x28); its last (7x7, 64 channels); [N, C]. */
static const struct {
  int nd;
  int64_t d[4];
} cases[] = {
    {4, {4, 3, 5, 5}},
    {4, {64, 16, 28, 28}},
    {4, {8, 64, 7, 7}},
    {2, {19, 6}},
};
#define N_CASES (sizeof cases / sizeof cases[0])

static pe_shape case_shape(size_t c) {
  return pe_shape_make(cases[c].nd, cases[c].d);
}

/* batch_norm(x) -> y; running statistics `mean` / `var` updated in place,
 * saved statistics into sm / sv. */
static pe_op_desc *bn(const char *y, const char *mean, const char *var, const char *sm,
                      const char *sv, bool test, bool relu) {
  pe_op_desc *op = ph_op("batch_norm", "X", "x", "Scale", "scale", "Bias", "bias", "Mean", mean,
                         "Variance", var, NULL, "Y", y, "MeanOut", mean, "VarianceOut", var,
                         "SavedMean", sm, "SavedVariance", sv, NULL);
  pe_op_set_bool(op, "is_test", test);
  if (relu) pe_op_set_string(op, "fuse_activation", "relu");
  return op;
}

/* x and the parameters; two copies of the running statistics (mean_u,
 * var_u for the unfused ops, mean_f, var_f for the fused op). The bias is
 * centred so that about half of the outputs are negative. */
static void set_inputs(pe_scope *s, pe_shape x, uint64_t seed) {
  int64_t ch = x.d[1];
  ph_set_uniform(s, "x", x, -2, 3, seed);
  ph_set_uniform(s, "scale", PE_SHAPE(ch), 0.5f, 1.5f, seed + 1);
  ph_set_uniform(s, "bias", PE_SHAPE(ch), -0.5f, 0.5f, seed + 2);
  const char *const m[] = {"mean_u", "mean_f"}, *const v[] = {"var_u", "var_f"};
  for (int k = 0; k < 2; k++) {
    ph_set_uniform(s, m[k], PE_SHAPE(ch), -0.5f, 0.5f, seed + 3);
    ph_set_uniform(s, v[k], PE_SHAPE(ch), 0.5f, 1.5f, seed + 4);
  }
}

/* The unfused forward into z (batch norm) and z3 (its relu), the fused one
 * into out; both from the same running statistics. */
static void run_forward(pe_scope *s, bool test) {
  dt_run_free(s, bn("z", "mean_u", "var_u", "sm_u", "sv_u", test, false));
  dt_run_free(s, ph_op("relu", "X", "z", NULL, "Out", "z3", NULL));
  ph_set_uniform(s, "out", ph_get(s, "z")->shape, 5, 6, 99); /* stale: must be overwritten */
  dt_run_free(s, bn("out", "mean_f", "var_f", "sm_f", "sv_f", test, true));
}

START_TEST(fused_forward_matches_unfused) {
  for (size_t c = 0; c < N_CASES; c++)
    for (int test = 0; test < 2; test++) {
      pe_scope *s = pe_scope_new(NULL);
      set_inputs(s, case_shape(c), 10 + 7 * c);
      run_forward(s, test);
      const char *what = test ? "is_test" : "training";
      dt_expect_same(s, "out", "z3", what);
      ck_assert_int_gt(dt_count_negative(s, "z", 0), 0); /* the relu matters */
      /* Statistics and running statistics as without the relu. */
      dt_expect_same(s, "sm_f", "sm_u", "SavedMean");
      dt_expect_same(s, "sv_f", "sv_u", "SavedVariance");
      dt_expect_same(s, "mean_f", "mean_u", "MeanOut");
      dt_expect_same(s, "var_f", "var_u", "VarianceOut");
      pe_scope_free(s);
    }
}
END_TEST

/* The unfused gradient: relu_grad then batch_norm_grad, into dx_u, ds_u,
 * db_u. */
static void run_unfused_grad(pe_scope *s, bool test) {
  dt_run_free(
      s, ph_op("relu_grad", "X", "z", "Out", "z3", "Out@GRAD", "dout", NULL, "X@GRAD", "dz", NULL));
  pe_op_desc *g = ph_op("batch_norm_grad", "X", "x", "Scale", "scale", "Bias", "bias", "SavedMean",
                        "sm_u", "SavedVariance", "sv_u", "Y@GRAD", "dz", NULL, "X@GRAD", "dx_u",
                        "Scale@GRAD", "ds_u", "Bias@GRAD", "db_u", NULL);
  pe_op_set_bool(g, "is_test", test);
  dt_run_free(s, g);
}

/* The fused gradient with the outputs asked for present, the others
 * absent; stale values in the outputs first. */
static void run_fused_grad(pe_scope *s, bool test, bool dx, bool ds, bool db) {
  pe_op_desc *g = ph_op("batch_norm_grad", "X", "x", "Scale", "scale", "Bias", "bias", "SavedMean",
                        "sm_f", "SavedVariance", "sv_f", "Y", "out", "Y@GRAD", "dout", NULL, NULL);
  if (dx) pe_op_output1(g, "X@GRAD", "dx");
  if (ds) pe_op_output1(g, "Scale@GRAD", "ds");
  if (db) pe_op_output1(g, "Bias@GRAD", "db");
  pe_op_set_bool(g, "is_test", test);
  pe_op_set_string(g, "fuse_activation", "relu");
  pe_shape xs = ph_get(s, "x")->shape, cs = PE_SHAPE(xs.d[1]);
  ph_set_uniform(s, "dx", xs, 5, 6, 90);
  ph_set_uniform(s, "ds", cs, 5, 6, 91);
  ph_set_uniform(s, "db", cs, 5, 6, 92);
  dt_run_free(s, g);
}

START_TEST(fused_grad_matches_unfused) {
  for (size_t c = 0; c < N_CASES; c++)
    for (int test = 0; test < 2; test++) {
      pe_scope *s = pe_scope_new(NULL);
      set_inputs(s, case_shape(c), 20 + 7 * c);
      run_forward(s, test);
      ph_set_uniform(s, "dout", case_shape(c), -1, 1, 40 + c);
      run_unfused_grad(s, test);
      run_fused_grad(s, test, true, true, true);
      dt_expect_same(s, "dx", "dx_u", test ? "X@GRAD, is_test" : "X@GRAD");
      dt_expect_same(s, "ds", "ds_u", test ? "Scale@GRAD, is_test" : "Scale@GRAD");
      dt_expect_same(s, "db", "db_u", test ? "Bias@GRAD, is_test" : "Bias@GRAD");
      /* Each output alone: the sums are masked whichever is asked for. */
      run_fused_grad(s, test, true, false, false);
      dt_expect_same(s, "dx", "dx_u", "X@GRAD alone");
      run_fused_grad(s, test, false, true, false);
      dt_expect_same(s, "ds", "ds_u", "Scale@GRAD alone");
      run_fused_grad(s, test, false, false, true);
      dt_expect_same(s, "db", "db_u", "Bias@GRAD alone");
      pe_scope_free(s);
    }
}
END_TEST

/* Numeric gradients of the fused op at inputs whose batch-norm outputs are
 * all at least 0.02 away from relu's kink (checked), so central
 * differences see none. */
START_TEST(fused_grad_numeric) {
  const char *outs[] = {"y"}, *wrt[] = {"x", "scale", "bias"};
  for (int test = 0; test < 2; test++) {
    pe_scope *s = pe_scope_new(NULL);
    set_inputs(s, PE_SHAPE(3, 2, 2, 3), 101);
    dt_run_free(s, bn("z", "mean_u", "var_u", "sm_u", "sv_u", test, false));
    ck_assert_int_gt(dt_count_negative(s, "z", 0.02f), 0);
    pe_op_desc *op = bn("y", "mean_f", "var_f", "sm_f", "sv_f", test, true);
    dt_grad_ok(s, op, outs, 1, wrt, 3, 0);
    pe_op_desc_free(op);
    pe_scope_free(s);
  }
}
END_TEST

/* With the fused relu the maker passes Y (the mask) and the attribute. */
START_TEST(fused_grad_maker_passes_y) {
  dt_expect_fused_grad_maker(bn("y", "m", "v", "sm", "sv", false, true), "batch_norm_grad", 7, "Y",
                             "y");
}
END_TEST

START_TEST(fused_infer_errors) {
  dt_var ok[] = {{"x", PE_F32, PE_SHAPE(-1, 16, 8, 8)},
                 {"scale", PE_F32, PE_SHAPE(16)},
                 {"bias", PE_F32, PE_SHAPE(16)},
                 {"m", PE_F32, PE_SHAPE(16)},
                 {"v", PE_F32, PE_SHAPE(16)}};
  pe_op_desc *op = bn("y", "m", "v", "sm", "sv", false, true);
  pe_meta m;
  PE_CK_OK(dt_infer(op, ok, 5, &m));
  expect_shape(&m.shape, PE_SHAPE(-1, 16, 8, 8));
  pe_op_set_string(op, "fuse_activation", "gelu");
  dt_expect_infer_error(op, ok, 5, PE_EATTR, "batch_norm", "fuse_activation 'gelu'", NULL);
  pe_op_desc_free(op);
  /* The fused relu's gradient needs the forward Y (its mask), of X's shape. */
  pe_op_desc *g = ph_op("batch_norm_grad", "X", "x", "Scale", "scale", "Bias", "bias", "SavedMean",
                        "m", "SavedVariance", "v", "Y@GRAD", "dy", NULL, "X@GRAD", "dx", NULL);
  pe_op_set_string(g, "fuse_activation", "relu");
  dt_var gv[] = {ok[0],
                 ok[1],
                 ok[2],
                 ok[3],
                 ok[4],
                 {"dy", PE_F32, PE_SHAPE(-1, 16, 8, 8)},
                 {"y", PE_F32, PE_SHAPE(-1, 16, 4, 4)}};
  dt_expect_infer_error(g, gv, 6, PE_EARITY, "batch_norm_grad", "needs input Y", NULL);
  pe_op_input1(g, "Y", "y");
  dt_expect_infer_error(g, gv, 7, PE_ESHAPE, "batch_norm_grad", "Y 'y'", "[-1,16,4,4]", "'x'",
                        "[-1,16,8,8]", NULL);
  pe_op_desc_free(g);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ops_bn_fused");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, fused_forward_matches_unfused);
  tcase_add_test(tc, fused_grad_matches_unfused);
  tcase_add_test(tc, fused_grad_numeric);
  tcase_add_test(tc, fused_grad_maker_passes_y);
  tcase_add_test(tc, fused_infer_errors);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
