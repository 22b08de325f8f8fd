/* conv2d with a Bias input and fuse_activation "relu" (what the
 * fuse_conv_act pass makes, ops/cpu/conv.c): forward and gradients equal
 * the unfused ops they replace (conv2d, elementwise_add axis 1, relu and
 * their grad ops, each checked against references elsewhere), the
 * gradients also numerically, and infer refuses a bad Bias or activation
 * naming the variable and the shape. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "ops_dnnl_helpers.h"

typedef struct conv_case {
  int64_t x[4], w[4], s, p, g;
} conv_case;

/* Small odd shapes, and the CNN's second convolution (blocked layouts on AVX2). */
static const conv_case cases[] = {
    {{2, 3, 7, 6}, {4, 3, 3, 3}, 2, 1, 1},
    {{2, 4, 8, 7}, {4, 2, 3, 3}, 1, 1, 2},
    {{2, 32, 14, 14}, {64, 32, 5, 5}, 1, 2, 1},
};
#define N_CASES (sizeof cases / sizeof cases[0])

static void set_conv_attrs(pe_op_desc *op, const conv_case *k) {
  pe_op_set_ints(op, "strides", 2, (int64_t[]){k->s, k->s});
  pe_op_set_ints(op, "paddings", 2, (int64_t[]){k->p, k->p});
  pe_op_set_int(op, "groups", k->g);
}

/* conv2d(x, w [, b]) -> out, relu fused when asked. */
static pe_op_desc *fused_op(const conv_case *k, bool bias, bool relu) {
  pe_op_desc *op = ph_op("conv2d", "Input", "x", "Filter", "w", NULL, "Output", "out", NULL);
  if (bias) pe_op_input1(op, "Bias", "b");
  if (relu) pe_op_set_string(op, "fuse_activation", "relu");
  set_conv_attrs(op, k);
  return op;
}

/* The unfused chain into z1 (conv), z2 (+ bias), z3 (relu). */
static void run_unfused(pe_scope *s, const conv_case *k) {
  pe_op_desc *conv = ph_op("conv2d", "Input", "x", "Filter", "w", NULL, "Output", "z1", NULL);
  set_conv_attrs(conv, k);
  dt_run_free(s, conv);
  pe_op_desc *add = ph_op("elementwise_add", "X", "z1", "Y", "b", NULL, "Out", "z2", NULL);
  pe_op_set_int(add, "axis", 1);
  dt_run_free(s, add);
  dt_run_free(s, ph_op("relu", "X", "z2", NULL, "Out", "z3", NULL));
}

static void set_inputs(pe_scope *s, const conv_case *k, uint64_t seed) {
  ph_set_uniform(s, "x", pe_shape_make(4, k->x), -1, 1, seed);
  ph_set_uniform(s, "w", pe_shape_make(4, k->w), -1, 1, seed + 1);
  ph_set_uniform(s, "b", PE_SHAPE(k->w[0]), -1, 1, seed + 2);
}

/* |fused - unfused| within the rounding bound of their sums. Each output is
 * a sum of K + 1 terms (K = C/groups * kh * kw products, and the bias) that
 * the two sides add in orders oneDNN picks per primitive and per ISA. Each
 * side is within gamma(K + 1) * sum|terms| of the exact sum (Higham,
 * Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 3.5), with
 * gamma(n) = n u / (1 - n u) and u = 2^-24, so the two differ by at most
 * twice that; relu is exact. sum|terms| of each output is the convolution
 * of |x| with |w| plus |b|, computed here by the unfused conv into "az". */
static void expect_within_sum_bound(pe_scope *s, const conv_case *k, const char *got,
                                    const char *want, const char *what) {
  const pe_tensor *g = ph_get(s, got), *w = ph_get(s, want), *az = ph_get(s, "az");
  const float *b = pe_f32(ph_get(s, "b"));
  ck_assert(pe_shape_equal(&g->shape, &w->shape) && pe_shape_equal(&g->shape, &az->shape));
  double n = (double)(k->x[1] / k->g * k->w[2] * k->w[3] + 1), u = 0x1p-24;
  double gamma2 = 2 * n * u / (1 - n * u);
  int64_t per_channel = g->shape.d[2] * g->shape.d[3], cout = g->shape.d[1];
  double used = 0;
  for (int64_t i = 0; i < pe_tensor_numel(g); i++) {
    double lim = gamma2 * (pe_f32(az)[i] + fabsf(b[i / per_channel % cout]));
    double d = fabs((double)pe_f32(g)[i] - pe_f32(w)[i]);
    if (!(d <= lim))
      ck_abort_msg("%s[%lld] = %.7g, unfused %.7g: differs by %.3g, bound %.3g", what, (long long)i,
                   pe_f32(g)[i], pe_f32(w)[i], d, lim);
    if (lim > 0 && d / lim > used) used = d / lim;
  }
  if (getenv("PE_TOL_REPORT"))
    fprintf(stderr, "tolerance used: %s: %.3f of the bound\n", what, used);
}

START_TEST(fused_forward_matches_unfused) {
  for (size_t c = 0; c < N_CASES; c++) {
    const conv_case *k = &cases[c];
    pe_scope *s = pe_scope_new(NULL);
    set_inputs(s, k, 10 + 3 * c);
    run_unfused(s, k);
    pe_tensor *x = ph_get(s, "x"), *w = ph_get(s, "w");
    pe_tensor *ax = ph_set_f32(s, "ax", x->shape, pe_f32(x));
    pe_tensor *aw = ph_set_f32(s, "aw", w->shape, pe_f32(w));
    for (int64_t i = 0; i < pe_tensor_numel(ax); i++) pe_f32(ax)[i] = fabsf(pe_f32(ax)[i]);
    for (int64_t i = 0; i < pe_tensor_numel(aw); i++) pe_f32(aw)[i] = fabsf(pe_f32(aw)[i]);
    pe_op_desc *abs_conv =
        ph_op("conv2d", "Input", "ax", "Filter", "aw", NULL, "Output", "az", NULL);
    set_conv_attrs(abs_conv, k);
    dt_run_free(s, abs_conv);

    dt_run_free(s, fused_op(k, true, true));
    expect_within_sum_bound(s, k, "out", "z3", "conv + bias + relu");
    ck_assert_int_gt(dt_count_negative(s, "z2", 0), 0); /* the relu matters */
    dt_run_free(s, fused_op(k, true, false));
    expect_within_sum_bound(s, k, "out", "z2", "conv + bias");
    pe_scope_free(s);
  }
}
END_TEST

/* The unfused grad chain from dz3 into dx_u, dw_u, db_u. */
static void run_unfused_grad(pe_scope *s, const conv_case *k) {
  dt_run_free(s, ph_op("relu_grad", "X", "z2", "Out", "z3", "Out@GRAD", "dout", NULL, "X@GRAD",
                       "dz2", NULL));
  pe_op_desc *add = ph_op("elementwise_add_grad", "X", "z1", "Y", "b", "Out@GRAD", "dz2", NULL,
                          "X@GRAD", "dz1", "Y@GRAD", "db_u", NULL);
  pe_op_set_int(add, "axis", 1);
  dt_run_free(s, add);
  pe_op_desc *conv = ph_op("conv2d_grad", "Input", "x", "Filter", "w", "Output@GRAD", "dz1", NULL,
                           "Input@GRAD", "dx_u", "Filter@GRAD", "dw_u", NULL);
  set_conv_attrs(conv, k);
  dt_run_free(s, conv);
}

/* Fused grad with the outputs named in `want` ("dx", "dw", "db" present or not). */
static void run_fused_grad(pe_scope *s, const conv_case *k, bool dx, bool dw, bool db) {
  pe_op_desc *op = ph_op("conv2d_grad", "Input", "x", "Filter", "w", "Bias", "b", "Output", "out",
                         "Output@GRAD", "dout", NULL, NULL);
  if (dx) pe_op_output1(op, "Input@GRAD", "dx");
  if (dw) pe_op_output1(op, "Filter@GRAD", "dw");
  if (db) pe_op_output1(op, "Bias@GRAD", "db");
  pe_op_set_string(op, "fuse_activation", "relu");
  set_conv_attrs(op, k);
  /* Stale values in the outputs: the kernel must overwrite them. */
  ph_set_uniform(s, "dx", pe_shape_make(4, k->x), 5, 6, 90);
  ph_set_uniform(s, "dw", pe_shape_make(4, k->w), 5, 6, 91);
  ph_set_uniform(s, "db", PE_SHAPE(k->w[0]), 5, 6, 92);
  dt_run_free(s, op);
}

START_TEST(fused_grad_matches_unfused) {
  for (size_t c = 0; c < N_CASES; c++) {
    const conv_case *k = &cases[c];
    pe_scope *s = pe_scope_new(NULL);
    set_inputs(s, k, 20 + 3 * c);
    run_unfused(s, k);
    dt_run_free(s, fused_op(k, true, true));
    ph_set_uniform(s, "dout", ph_get(s, "z3")->shape, -1, 1, 30 + c);
    run_unfused_grad(s, k);
    /* All three; the bias gradient from oneDNN's weights pass. */
    run_fused_grad(s, k, true, true, true);
    dt_expect_same(s, "dx", "dx_u", "Input@GRAD");
    dt_expect_same(s, "dw", "dw_u", "Filter@GRAD");
    dt_expect_same(s, "db", "db_u", "Bias@GRAD (weights pass)");
    /* No filter gradient: the bias gradient from the per-channel sum. */
    run_fused_grad(s, k, true, false, true);
    dt_expect_same(s, "dx", "dx_u", "Input@GRAD without Filter@GRAD");
    dt_expect_same(s, "db", "db_u", "Bias@GRAD (own sum)");
    /* No bias gradient: the weights pass writes it to scratch. */
    run_fused_grad(s, k, false, true, false);
    dt_expect_same(s, "dw", "dw_u", "Filter@GRAD without Bias@GRAD");
    pe_scope_free(s);
  }
}
END_TEST

START_TEST(fused_grad_numeric) {
  /* Bias only: smooth everywhere. */
  conv_case k = {{2, 4, 7, 7}, {4, 2, 3, 3}, 2, 1, 2};
  pe_scope *s = pe_scope_new(NULL);
  set_inputs(s, &k, 40);
  dt_fused_grad_ok(s, fused_op(&k, true, false), 100);
  /* With relu, at inputs whose pre-activations are all at least 0.01 away
   * from relu's kink (checked here), so central differences see no kink. */
  conv_case k2 = {{1, 3, 5, 5}, {4, 3, 3, 3}, 1, 0, 1};
  s = pe_scope_new(NULL);
  set_inputs(s, &k2, 50);
  run_unfused(s, &k2);
  ck_assert_int_gt(dt_count_negative(s, "z2", 0.01f), 0);
  dt_fused_grad_ok(s, fused_op(&k2, true, true), 0);
}
END_TEST

START_TEST(fused_infer_errors) {
  conv_case k = {{1, 3, 8, 8}, {8, 3, 3, 3}, 1, 1, 1};
  pe_op_desc *op = fused_op(&k, true, true);
  dt_var ok[] = {{"x", PE_F32, PE_SHAPE(-1, 3, 8, 8)},
                 {"w", PE_F32, PE_SHAPE(8, 3, 3, 3)},
                 {"b", PE_F32, PE_SHAPE(8)}};
  pe_meta m;
  PE_CK_OK(dt_infer(op, ok, 3, &m));
  expect_shape(&m.shape, PE_SHAPE(-1, 8, 8, 8));
  dt_var wrong[] = {ok[0], ok[1], {"b", PE_F32, PE_SHAPE(7)}};
  dt_expect_infer_error(op, wrong, 3, PE_ESHAPE, "conv2d", "Bias 'b'", "[7]", "[8]", "'w'", NULL);
  dt_var rank2[] = {ok[0], ok[1], {"b", PE_F32, PE_SHAPE(8, 1)}};
  dt_expect_infer_error(op, rank2, 3, PE_ESHAPE, "Bias 'b'", "[8,1]", NULL);
  pe_op_set_string(op, "fuse_activation", "gelu");
  dt_expect_infer_error(op, ok, 3, PE_EATTR, "fuse_activation 'gelu'", NULL);
  pe_op_desc_free(op);
  /* The fused relu's gradient needs the forward Output (its mask). */
  pe_op_desc *g = ph_op("conv2d_grad", "Input", "x", "Filter", "w", "Bias", "b", "Output@GRAD",
                        "dout", NULL, "Input@GRAD", "dx", NULL);
  pe_op_set_string(g, "fuse_activation", "relu");
  dt_var gv[] = {ok[0], ok[1], ok[2], {"dout", PE_F32, PE_SHAPE(-1, 8, 8, 8)}};
  dt_expect_infer_error(g, gv, 4, PE_EARITY, "Output", NULL);
  pe_op_desc_free(g);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ops_conv_fused");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, fused_forward_matches_unfused);
  tcase_add_test(tc, fused_grad_matches_unfused);
  tcase_add_test(tc, fused_grad_numeric);
  tcase_add_test(tc, fused_infer_errors);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
