/* oneDNN's batch_norm and its gradient: training and test mode against
 * hand-computed numbers (written out), the running statistics, the
 * gradient maker, shape inference. Gradients use the checker in
 * ops_dnnl_helpers.h. */
#include <check.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "ops_dnnl_helpers.h"

#define FWD_TOL 1e-5

/* Mean/MeanOut and Variance/VarianceOut are the same variables, as the
 * program builder makes them. */
static pe_op_desc *bn_op(bool is_test) {
  pe_op_desc *op =
      ph_op("batch_norm", "X", "x", "Scale", "scale", "Bias", "bias", "Mean", "bn.mean", "Variance",
            "bn.var", NULL, "Y", "y", "MeanOut", "bn.mean", "VarianceOut", "bn.var", "SavedMean",
            "saved_mean", "SavedVariance", "saved_var", NULL);
  pe_op_set_bool(op, "is_test", is_test);
  return op;
}

/* X [2,2,1,2]: channel 0 holds {1,2,3,4} (mean 2.5, var 1.25), channel 1
 * {0,4,2,2} (mean 2, var 2). Scale [1,2], Bias [0,1]; running stats
 * [0,1] / [1,1], momentum 0.9. */
START_TEST(batch_norm_train_written_out) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(2, 2, 1, 2), (float[]){1, 2, 0, 4, 3, 4, 2, 2});
  ph_set_f32(s, "scale", PE_SHAPE(2), (float[]){1, 2});
  ph_set_f32(s, "bias", PE_SHAPE(2), (float[]){0, 1});
  ph_set_f32(s, "bn.mean", PE_SHAPE(2), (float[]){0, 1});
  ph_set_f32(s, "bn.var", PE_SHAPE(2), (float[]){1, 1});
  pe_op_desc *op = bn_op(false);
  PE_CK_OK(ph_run_op(s, op, NULL));
  double i0 = 1 / sqrt(1.25 + 1e-5), i1 = 1 / sqrt(2 + 1e-5);
  float want[8] = {(float)(-1.5 * i0),
                   (float)(-0.5 * i0),
                   (float)(2 * -2 * i1 + 1),
                   (float)(2 * 2 * i1 + 1),
                   (float)(0.5 * i0),
                   (float)(1.5 * i0),
                   1,
                   1};
  dt_expect_close(pe_f32(ph_get(s, "y")), want, 8, FWD_TOL, "y");
  dt_expect_close(pe_f32(ph_get(s, "saved_mean")), (float[]){2.5f, 2}, 2, FWD_TOL, "saved mean");
  dt_expect_close(pe_f32(ph_get(s, "saved_var")), (float[]){1.25f, 2}, 2, FWD_TOL, "saved var");
  /* new = 0.9*old + 0.1*batch */
  dt_expect_close(pe_f32(ph_get(s, "bn.mean")), (float[]){0.25f, 1.1f}, 2, FWD_TOL, "running mean");
  dt_expect_close(pe_f32(ph_get(s, "bn.var")), (float[]){1.025f, 1.1f}, 2, FWD_TOL, "running var");
  /* A second step moves the running stats again (in place). */
  PE_CK_OK(ph_run_op(s, op, NULL));
  dt_expect_close(pe_f32(ph_get(s, "bn.mean")), (float[]){0.475f, 1.19f}, 2, FWD_TOL,
                  "running mean 2");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(batch_norm_test_mode) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(3, 2), (float[]){1, 2, 3, 4, 5, 6});
  ph_set_f32(s, "scale", PE_SHAPE(2), (float[]){2, 0.5f});
  ph_set_f32(s, "bias", PE_SHAPE(2), (float[]){1, -1});
  ph_set_f32(s, "bn.mean", PE_SHAPE(2), (float[]){1, 2});
  ph_set_f32(s, "bn.var", PE_SHAPE(2), (float[]){4, 0.25f});
  pe_op_desc *op = bn_op(true);
  pe_op_set_float(op, "epsilon", 0);
  PE_CK_OK(ph_run_op(s, op, NULL));
  /* y = scale*(x-mean)/sqrt(var) + bias: c0 2*(x-1)/2+1 = x; c1 0.5*(x-2)/0.5-1 = x-3 */
  dt_expect_close(pe_f32(ph_get(s, "y")), (float[]){1, -1, 3, 1, 5, 3}, 6, FWD_TOL, "y");
  dt_expect_close(pe_f32(ph_get(s, "bn.mean")), (float[]){1, 2}, 2, 0, "running mean untouched");
  dt_expect_close(pe_f32(ph_get(s, "bn.var")), (float[]){4, 0.25f}, 2, 0, "running var untouched");
  dt_expect_close(pe_f32(ph_get(s, "saved_mean")), (float[]){1, 2}, 2, 0, "saved mean");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(batch_norm_grad_numeric) {
  const char *outs[] = {"y"}, *wrt[] = {"x", "scale", "bias"};
  const pe_shape shapes[] = {PE_SHAPE(4, 3, 2, 2), PE_SHAPE(6, 4), PE_SHAPE(2, 2, 3, 3)};
  for (int k = 0; k < 3; k++)
    for (int test = 0; test < 2; test++) {
      pe_scope *s = pe_scope_new(NULL);
      int64_t ch = shapes[k].d[1];
      ph_set_uniform(s, "x", shapes[k], -2, 2, 70 + (uint64_t)k);
      ph_set_uniform(s, "scale", PE_SHAPE(ch), 0.5f, 1.5f, 80);
      ph_set_uniform(s, "bias", PE_SHAPE(ch), -1, 1, 81);
      ph_set_uniform(s, "bn.mean", PE_SHAPE(ch), -0.5f, 0.5f, 82);
      ph_set_uniform(s, "bn.var", PE_SHAPE(ch), 0.5f, 1.5f, 83);
      pe_op_desc *op = bn_op(test);
      dt_grad_ok(s, op, outs, 1, wrt, 3, 0);
      pe_op_desc_free(op);
      pe_scope_free(s);
    }
}
END_TEST

/* The custom maker passes exactly the six inputs and no stats gradients. */
START_TEST(batch_norm_grad_maker) {
  pe_op_desc *op = bn_op(false);
  pe_op_set_float(op, "momentum", 0.8f);
  const pe_op_def *def = pe_op_lookup("batch_norm");
  pe_grad_ctx g;
  pe_grad_ctx_init(&g, def, op);
  pe_status *st = def->grad(&g);
  ck_assert_ptr_null(st);
  ck_assert_int_eq(g.n_ops, 1);
  pe_op_desc *gop = g.ops[0];
  ck_assert_str_eq(gop->type, "batch_norm_grad");
  ck_assert_int_eq(gop->n_in, 6);
  ck_assert_str_eq(pe_op_input_arg(gop, "X"), "x");
  ck_assert_str_eq(pe_op_input_arg(gop, "Scale"), "scale");
  ck_assert_str_eq(pe_op_input_arg(gop, "Bias"), "bias");
  ck_assert_str_eq(pe_op_input_arg(gop, "SavedMean"), "saved_mean");
  ck_assert_str_eq(pe_op_input_arg(gop, "SavedVariance"), "saved_var");
  ck_assert_str_eq(pe_op_input_arg(gop, "Y@GRAD"), "y@GRAD");
  ck_assert_ptr_null(pe_op_find_input(gop, "Mean"));
  ck_assert_int_eq(gop->n_out, 3);
  ck_assert_str_eq(pe_op_output_arg(gop, "X@GRAD"), "x@GRAD");
  ck_assert_str_eq(pe_op_output_arg(gop, "Scale@GRAD"), "scale@GRAD");
  ck_assert_str_eq(pe_op_output_arg(gop, "Bias@GRAD"), "bias@GRAD");
  ck_assert_float_eq(pe_op_find_attr(gop, "momentum")->f, 0.8f);
  ck_assert(def->inputs[3].flags & PE_SLOT_NO_GRAD);
  ck_assert(def->inputs[4].flags & PE_SLOT_NO_GRAD);
  pe_grad_ctx_destroy(&g);
  pe_op_desc_free(op);
}
END_TEST

START_TEST(batch_norm_infer) {
  pe_op_desc *op = bn_op(false);
  dt_var ok[] = {{"x", PE_F32, PE_SHAPE(-1, 16, 8, 8)},
                 {"scale", PE_F32, PE_SHAPE(16)},
                 {"bias", PE_F32, PE_SHAPE(16)},
                 {"bn.mean", PE_F32, PE_SHAPE(16)},
                 {"bn.var", PE_F32, PE_SHAPE(16)}};
  pe_meta m;
  PE_CK_OK(dt_infer(op, ok, 5, &m));
  expect_shape(&m.shape, PE_SHAPE(-1, 16, 8, 8));
  dt_var bad[] = {{"x", PE_F32, PE_SHAPE(-1, 16, 8, 8)},
                  {"scale", PE_F32, PE_SHAPE(8)},
                  {"bias", PE_F32, PE_SHAPE(16)},
                  {"bn.mean", PE_F32, PE_SHAPE(16)},
                  {"bn.var", PE_F32, PE_SHAPE(16)}};
  dt_expect_infer_error(op, bad, 5, PE_ESHAPE, "batch_norm", "Scale", "'scale'", "[8]", "'x'",
                        "[-1,16,8,8]", NULL);
  dt_var one[] = {{"x", PE_F32, PE_SHAPE(16)},
                  {"scale", PE_F32, PE_SHAPE(16)},
                  {"bias", PE_F32, PE_SHAPE(16)},
                  {"bn.mean", PE_F32, PE_SHAPE(16)},
                  {"bn.var", PE_F32, PE_SHAPE(16)}};
  dt_expect_infer_error(op, one, 5, PE_ESHAPE, "'x'", "[16]", NULL);
  pe_op_desc_free(op);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ops_dnnl_batch_norm");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, batch_norm_train_written_out);
  tcase_add_test(tc, batch_norm_test_mode);
  tcase_add_test(tc, batch_norm_grad_numeric);
  tcase_add_test(tc, batch_norm_grad_maker);
  tcase_add_test(tc, batch_norm_infer);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
