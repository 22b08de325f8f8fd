/* elementwise_add with fuse_activation "relu" (what the fuse_add_act pass
 * makes of a residual add -> relu, ops/cpu/elementwise.c): the forward
 * equals elementwise_add then relu, the gradient (with Out, the mask)
 * equals relu_grad then elementwise_add_grad for X@GRAD and Y@GRAD
 * together and each alone, on same-shape operands (the one-pass kernels)
 * and broadcast ones (the fallback); the gradients also numerically; infer
 * refuses an unknown activation and a fused gradient without Out, naming
 * them; the grad maker passes Out and the attribute. */
#include <check.h>
#include <math.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "ops_dnnl_helpers.h"

/* x's shape and y's (same, or broadcast along axis): small with a length no
 * vector width divides; the resnet's first block (64x16x28x28, above
 * PE_PAR_MIN: threaded); per-channel y (axis 1). */
static const struct {
  pe_shape x, y;
  int axis;
} cases[] = {
    {{4, {3, 5, 7, 3}}, {4, {3, 5, 7, 3}}, -1},
    {{4, {64, 16, 28, 28}}, {4, {64, 16, 28, 28}}, -1},
    {{2, {17, 9}}, {2, {17, 9}}, -1},
    {{4, {4, 3, 5, 5}}, {1, {3}}, 1},
};
#define N_CASES (sizeof cases / sizeof cases[0])

static pe_op_desc *add(const char *out, int axis, bool relu) {
  pe_op_desc *op = ph_op("elementwise_add", "X", "x", "Y", "y", NULL, "Out", out, NULL);
  pe_op_set_int(op, "axis", axis);
  if (relu) pe_op_set_string(op, "fuse_activation", "relu");
  return op;
}

/* x, y about half of whose sums are negative; the unfused z (sum) and z3
 * (its relu), the fused out (stale values first: must be overwritten). */
static void run_forward(pe_scope *s, size_t c, uint64_t seed) {
  ph_set_uniform(s, "x", cases[c].x, -2, 2, seed);
  ph_set_uniform(s, "y", cases[c].y, -1.5f, 1.5f, seed + 1);
  dt_run_free(s, add("z", cases[c].axis, false));
  dt_run_free(s, ph_op("relu", "X", "z", NULL, "Out", "z3", NULL));
  ph_set_uniform(s, "out", ph_get(s, "z")->shape, 5, 6, 99);
  dt_run_free(s, add("out", cases[c].axis, true));
}

START_TEST(fused_forward_matches_unfused) {
  for (size_t c = 0; c < N_CASES; c++) {
    pe_scope *s = pe_scope_new(NULL);
    run_forward(s, c, 10 + 3 * c);
    dt_expect_same(s, "out", "z3", "relu(X + Y)");
    ck_assert_int_gt(dt_count_negative(s, "z", 0), 0); /* the relu matters */
    pe_scope_free(s);
  }
}
END_TEST

/* Unfused: relu_grad then elementwise_add_grad into dx_u, dy_u. */
static void run_unfused_grad(pe_scope *s, int axis) {
  dt_run_free(
      s, ph_op("relu_grad", "X", "z", "Out", "z3", "Out@GRAD", "dout", NULL, "X@GRAD", "dz", NULL));
  pe_op_desc *g = ph_op("elementwise_add_grad", "X", "x", "Y", "y", "Out", "z", "Out@GRAD", "dz",
                        NULL, "X@GRAD", "dx_u", "Y@GRAD", "dy_u", NULL);
  pe_op_set_int(g, "axis", axis);
  dt_run_free(s, g);
}

/* Fused, with the outputs asked for present; stale values in them first. */
static void run_fused_grad(pe_scope *s, int axis, bool dx, bool dy) {
  pe_op_desc *g = ph_op("elementwise_add_grad", "X", "x", "Y", "y", "Out", "out", "Out@GRAD",
                        "dout", NULL, NULL);
  if (dx) pe_op_output1(g, "X@GRAD", "dx");
  if (dy) pe_op_output1(g, "Y@GRAD", "dy");
  pe_op_set_int(g, "axis", axis);
  pe_op_set_string(g, "fuse_activation", "relu");
  ph_set_uniform(s, "dx", ph_get(s, "x")->shape, 5, 6, 90);
  ph_set_uniform(s, "dy", ph_get(s, "y")->shape, 5, 6, 91);
  dt_run_free(s, g);
}

START_TEST(fused_grad_matches_unfused) {
  for (size_t c = 0; c < N_CASES; c++) {
    pe_scope *s = pe_scope_new(NULL);
    run_forward(s, c, 20 + 3 * c);
    ph_set_uniform(s, "dout", ph_get(s, "z")->shape, -1, 1, 40 + c);
    run_unfused_grad(s, cases[c].axis);
    run_fused_grad(s, cases[c].axis, true, true);
    dt_expect_same(s, "dx", "dx_u", "X@GRAD");
    dt_expect_same(s, "dy", "dy_u", "Y@GRAD");
    run_fused_grad(s, cases[c].axis, true, false);
    dt_expect_same(s, "dx", "dx_u", "X@GRAD alone");
    run_fused_grad(s, cases[c].axis, false, true);
    dt_expect_same(s, "dy", "dy_u", "Y@GRAD alone");
    pe_scope_free(s);
  }
}
END_TEST

/* A pruned Out@GRAD: both gradients zero, as unfused. */
START_TEST(fused_grad_without_out_grad_is_zero) {
  pe_scope *s = pe_scope_new(NULL);
  run_forward(s, 0, 7);
  pe_op_desc *g =
      ph_op("elementwise_add_grad", "X", "x", "Y", "y", "Out", "out", NULL, "X@GRAD", "dx", NULL);
  pe_op_set_string(g, "fuse_activation", "relu");
  ph_set_uniform(s, "dx", ph_get(s, "x")->shape, 5, 6, 90);
  dt_run_free(s, g);
  const pe_tensor *dx = ph_get(s, "dx");
  for (int64_t i = 0; i < pe_tensor_numel(dx); i++) ck_assert_float_eq(pe_f32(dx)[i], 0.0f);
  pe_scope_free(s);
}
END_TEST

/* Numeric gradients at inputs whose sums are all at least 0.05 away from
 * relu's kink (checked), so central differences see none: x (output-shaped
 * in every case) moves each sum nearer than 0.1 up by 0.2. */
START_TEST(fused_grad_numeric) {
  const char *outs[] = {"out"}, *wrt[] = {"x", "y"};
  for (size_t c = 0; c < N_CASES; c++) {
    if (c == 1) continue; /* too large for central differences */
    pe_scope *s = pe_scope_new(NULL);
    ph_set_uniform(s, "x", cases[c].x, -2, 2, 50 + c);
    ph_set_uniform(s, "y", cases[c].y, -1.5f, 1.5f, 60 + c);
    dt_run_free(s, add("z", cases[c].axis, false));
    float *x = pe_f32(ph_get(s, "x"));
    const float *z = pe_f32(ph_get(s, "z"));
    for (int64_t i = 0; i < pe_tensor_numel(ph_get(s, "z")); i++)
      if (fabsf(z[i]) < 0.1f) x[i] += 0.2f;
    dt_run_free(s, add("z", cases[c].axis, false));
    ck_assert_int_gt(dt_count_negative(s, "z", 0.05f), 0);
    pe_op_desc *op = add("out", cases[c].axis, true);
    dt_grad_ok(s, op, outs, 1, wrt, 2, 0);
    pe_op_desc_free(op);
    pe_scope_free(s);
  }
}
END_TEST

/* The default maker passes Out (the mask) and the attribute. */
/* X, Y, Out, Out@GRAD. */
START_TEST(fused_grad_maker_passes_out) {
  dt_expect_fused_grad_maker(add("o", -1, true), "elementwise_add_grad", 4, "Out", "o");
}
END_TEST

START_TEST(fused_infer_errors) {
  dt_var v[] = {{"x", PE_F32, PE_SHAPE(-1, 16, 8, 8)},
                {"y", PE_F32, PE_SHAPE(-1, 16, 8, 8)},
                {"dout", PE_F32, PE_SHAPE(-1, 16, 8, 8)},
                {"o", PE_F32, PE_SHAPE(-1, 16, 4, 4)}};
  pe_op_desc *op = add("out", -1, true);
  pe_meta m;
  PE_CK_OK(dt_infer(op, v, 2, &m));
  expect_shape(&m.shape, PE_SHAPE(-1, 16, 8, 8));
  pe_op_set_string(op, "fuse_activation", "gelu");
  dt_expect_infer_error(op, v, 2, PE_EATTR, "elementwise_add", "fuse_activation 'gelu'", NULL);
  pe_op_desc_free(op);
  /* The fused relu's gradient needs the forward Out (its mask), of the
   * output's shape. */
  pe_op_desc *g = ph_op("elementwise_add_grad", "X", "x", "Y", "y", "Out@GRAD", "dout", NULL,
                        "X@GRAD", "dx", NULL);
  pe_op_set_string(g, "fuse_activation", "relu");
  dt_expect_infer_error(g, v, 4, PE_EARITY, "elementwise_add_grad", "needs input Out", NULL);
  pe_op_input1(g, "Out", "o");
  dt_expect_infer_error(g, v, 4, PE_ESHAPE, "elementwise_add_grad", "Out 'o'", "[-1,16,4,4]",
                        "[-1,16,8,8]", NULL);
  pe_op_desc_free(g);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ops_add_fused");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, fused_forward_matches_unfused);
  tcase_add_test(tc, fused_grad_matches_unfused);
  tcase_add_test(tc, fused_grad_without_out_grad_is_zero);
  tcase_add_test(tc, fused_grad_numeric);
  tcase_add_test(tc, fused_grad_maker_passes_out);
  tcase_add_test(tc, fused_infer_errors);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
