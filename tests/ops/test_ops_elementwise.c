/* Elementwise ops: elementwise_add/sub/mul (broadcasting both ways and the
 * Paddle axis rule), scale, sum, their gradients and compile-time inference.
 *
 * Forward values are small examples written out by hand; large shapes that
 * take the threaded and strided paths are compared with a naive reference
 * computed here, and with the kernels run on 1 and 2 threads (they must agree
 * bit for bit).
 *
 * Gradient tolerance: ph_grad_check uses f32 central differences with eps
 * 1e-3 on inputs in [-1, 1]. The forward values are f32 (relative rounding
 * ~6e-8) and the weighted loss sums at most a few hundred of them, so the
 * difference of two losses carries ~1e-7 absolute noise; divided by 2*eps that
 * is ~1e-4 relative to gradients of order 1. These ops are at most quadratic,
 * so truncation error is ~0. max_err <= 1e-2 leaves a wide margin while still
 * catching any wrong reduction (those are off by whole multiples). */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "ops/device_ctx.h"
#include "test_assert.h"

#define GRAD_EPS 1e-3
#define GRAD_TOL 1e-2

static void grad_ok(pe_scope *s, const pe_op_desc *op, const char *const *outs, int n_outs,
                    const char *const *wrt, int n_wrt) {
  expect_grad(s, op, outs, n_outs, wrt, n_wrt, GRAD_EPS, 64, GRAD_TOL);
}

static pe_op_desc *binop(const char *type, int axis) {
  pe_op_desc *op = ph_op(type, "X", "x", "Y", "y", NULL, "Out", "out", NULL);
  if (axis != -1) PE_CK_OK(pe_op_set_int(op, "axis", axis));
  return op;
}

/* --- forward values ---------------------------------------------------------------- */

START_TEST(add_same_shape) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(2, 3), (float[]){1, 2, 3, 4, 5, 6});
  ph_set_f32(s, "y", PE_SHAPE(2, 3), (float[]){10, 20, 30, 40, 50, 60});
  pe_op_desc *op = binop("elementwise_add", -1);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(2, 3), (float[]){11, 22, 33, 44, 55, 66}, 0);
  pe_op_desc_free(op);
  op = binop("elementwise_mul", -1);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(2, 3), (float[]){10, 40, 90, 160, 250, 360}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(add_row_vector) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(2, 3), (float[]){1, 2, 3, 4, 5, 6});
  ph_set_f32(s, "y", PE_SHAPE(3), (float[]){10, 20, 30});
  pe_op_desc *op = binop("elementwise_add", -1);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(2, 3), (float[]){11, 22, 33, 14, 25, 36}, 0);
  /* [N,M] + [1,M]: the same values. */
  ph_set_f32(s, "y", PE_SHAPE(1, 3), (float[]){10, 20, 30});
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(2, 3), (float[]){11, 22, 33, 14, 25, 36}, 0);
  pe_op_desc_free(op);
  /* Column vector on the right: [N,M] - [N,1]. */
  ph_set_f32(s, "y", PE_SHAPE(2, 1), (float[]){1, 2});
  op = binop("elementwise_sub", -1);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(2, 3), (float[]){0, 1, 2, 2, 3, 4}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(mul_outer_both_sides) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(2, 1), (float[]){2, 3});
  ph_set_f32(s, "y", PE_SHAPE(1, 3), (float[]){1, 10, 100});
  pe_op_desc *op = binop("elementwise_mul", -1);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(2, 3), (float[]){2, 20, 200, 3, 30, 300}, 0);
  pe_op_desc_free(op);
  /* X is the broadcast side: [3] - [2,3] keeps the operand order. */
  ph_set_f32(s, "x", PE_SHAPE(3), (float[]){1, 2, 3});
  ph_set_f32(s, "y", PE_SHAPE(2, 3), (float[]){1, 1, 1, 5, 5, 5});
  op = binop("elementwise_sub", -1);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(2, 3), (float[]){0, 1, 2, -4, -3, -2}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(add_channel_axis1) {
  pe_scope *s = pe_scope_new(NULL);
  float x[16];
  for (int i = 0; i < 16; i++) x[i] = (float)i;
  ph_set_f32(s, "x", PE_SHAPE(2, 2, 2, 2), x); /* NCHW */
  ph_set_f32(s, "y", PE_SHAPE(2), (float[]){100, 200});
  pe_op_desc *op = binop("elementwise_add", 1);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(
      s, "out", PE_SHAPE(2, 2, 2, 2),
      (float[]){100, 101, 102, 103, 204, 205, 206, 207, 108, 109, 110, 111, 212, 213, 214, 215}, 0);
  /* Y [C,1,1] with axis 1 means the same. */
  ph_set_f32(s, "y", PE_SHAPE(2, 1, 1), (float[]){100, 200});
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(
      s, "out", PE_SHAPE(2, 2, 2, 2),
      (float[]){100, 101, 102, 103, 204, 205, 206, 207, 108, 109, 110, 111, 212, 213, 214, 215}, 0);
  pe_op_desc_free(op);
  /* axis 0 on [N,C]: one value per row. */
  ph_set_f32(s, "x", PE_SHAPE(2, 3), (float[]){1, 2, 3, 4, 5, 6});
  ph_set_f32(s, "y", PE_SHAPE(2), (float[]){10, -1});
  op = binop("elementwise_mul", 0);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(2, 3), (float[]){10, 20, 30, -4, -5, -6}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(scalar_operand) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(2, 2), (float[]){1, 2, 3, 4});
  ph_set_f32(s, "y", PE_SHAPE(1), (float[]){0.5f});
  pe_op_desc *op = binop("elementwise_sub", -1);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(2, 2), (float[]){0.5f, 1.5f, 2.5f, 3.5f}, 0);
  pe_op_desc_free(op);
  /* Scalar on the left. */
  ph_set_f32(s, "x", PE_SHAPE(1), (float[]){10});
  ph_set_f32(s, "y", PE_SHAPE(2, 2), (float[]){1, 2, 3, 4});
  op = binop("elementwise_sub", -1);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(2, 2), (float[]){9, 8, 7, 6}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(strided_general) {
  /* [2,3,2] * [2,1,2]: Y varies in dims 0 and 2, the strided path. */
  pe_scope *s = pe_scope_new(NULL);
  float x[12];
  for (int i = 0; i < 12; i++) x[i] = (float)(i + 1);
  ph_set_f32(s, "x", PE_SHAPE(2, 3, 2), x);
  ph_set_f32(s, "y", PE_SHAPE(2, 1, 2), (float[]){1, -1, 10, 0});
  pe_op_desc *op = binop("elementwise_mul", -1);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(2, 3, 2), (float[]){1, -2, 3, -4, 5, -6, 70, 0, 90, 0, 110, 0}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(scale_both_modes) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(3), (float[]){1, 2, -3});
  pe_op_desc *op = ph_op("scale", "X", "x", NULL, "Out", "out", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL)); /* defaults: identity */
  expect_f32(s, "out", PE_SHAPE(3), (float[]){1, 2, -3}, 0);
  PE_CK_OK(pe_op_set_float(op, "scale", 2));
  PE_CK_OK(pe_op_set_float(op, "bias", 1));
  PE_CK_OK(ph_run_op(s, op, NULL)); /* 2x + 1 */
  expect_f32(s, "out", PE_SHAPE(3), (float[]){3, 5, -5}, 0);
  PE_CK_OK(pe_op_set_bool(op, "bias_after_scale", false));
  PE_CK_OK(ph_run_op(s, op, NULL)); /* 2(x + 1) */
  expect_f32(s, "out", PE_SHAPE(3), (float[]){4, 6, -4}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(sum_of_three) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "a", PE_SHAPE(2, 2), (float[]){1, 2, 3, 4});
  ph_set_f32(s, "b", PE_SHAPE(2, 2), (float[]){10, 20, 30, 40});
  ph_set_f32(s, "c", PE_SHAPE(2, 2), (float[]){100, 200, 300, 400});
  pe_op_desc *op = pe_op_desc_new("sum");
  PE_CK_OK(pe_op_set_input(op, "X", 3, (const char *[]){"a", "b", "c"}));
  PE_CK_OK(pe_op_output1(op, "Out", "out"));
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "out", PE_SHAPE(2, 2), (float[]){111, 222, 333, 444}, 0);
  /* In place, as gradient accumulation does: Out is the second input. */
  PE_CK_OK(pe_op_output1(op, "Out", "b"));
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "b", PE_SHAPE(2, 2), (float[]){111, 222, 333, 444}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* --- large shapes: threaded paths vs a naive reference ---------------------------------- */

/* Index of output element o in an operand aligned to `out` (dims equal or 1). */
static int64_t ref_index(const pe_shape *out, const pe_shape *a, int64_t o) {
  int64_t idx = 0, stride = 1;
  for (int d = out->ndim - 1; d >= 0; d--) {
    int64_t q = o % out->d[d];
    o /= out->d[d];
    if (a->d[d] != 1) idx += q * stride;
    stride *= a->d[d];
  }
  return idx;
}

/* Run op on a device with `threads` threads directly (single-arg slots). */
static void run_threads(pe_scope *s, const pe_op_desc *op, int threads, pe_tensor *out) {
  const pe_op_def *def = pe_op_lookup(op->type);
  pe_device_ctx dev;
  PE_CK_OK(pe_device_ctx_init(&dev, pe_cpu_place(), threads));
  pe_tensor *tin[4] = {0}, *tout[4] = {out};
  pe_tensor_list in[4] = {{0}}, outl[4] = {{1, &tout[0]}};
  for (int i = 0; i < op->n_in; i++) {
    int di = pe_op_input_index(def, op->in[i].name);
    tin[di] = ph_get(s, op->in[i].args[0]);
    in[di] = (pe_tensor_list){1, &tin[di]};
  }
  void *state = NULL;
  pe_kernel_ctx kc = {def, op, 0, in, outl, &state, NULL, &dev};
  PE_CK_OK(def->kernel_cpu(&kc));
  pe_device_ctx_destroy(&dev);
}

static void check_large(const char *type, pe_shape xs, pe_shape ys, pe_shape os, int axis) {
  pe_scope *s = pe_scope_new(NULL);
  pe_tensor *x = ph_set_uniform(s, "x", xs, -1, 1, 11), *y = ph_set_uniform(s, "y", ys, -1, 1, 12);
  pe_op_desc *op = binop(type, axis);
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *out = ph_get(s, "out");
  ck_assert(pe_shape_equal(&out->shape, &os));
  /* Operands aligned to the output rank (numpy: right-aligned; axis: at axis). */
  pe_shape xa = os, ya = os;
  for (int d = 0; d < os.ndim; d++) {
    int ix = d - (os.ndim - xs.ndim);
    int iy = axis < 0 ? d - (os.ndim - ys.ndim) : d - axis;
    xa.d[d] = ix >= 0 ? xs.d[ix] : 1;
    ya.d[d] = iy >= 0 && iy < ys.ndim ? ys.d[iy] : 1;
  }
  for (int64_t o = 0; o < pe_tensor_numel(out); o++) {
    float a = pe_f32(x)[ref_index(&os, &xa, o)], b = pe_f32(y)[ref_index(&os, &ya, o)];
    float want = !strcmp(type, "elementwise_add")   ? a + b
                 : !strcmp(type, "elementwise_sub") ? a - b
                                                    : a * b;
    ck_assert_msg(pe_f32(out)[o] == want, "%s out[%lld] = %g, want %g", type, (long long)o,
                  pe_f32(out)[o], want);
  }
  pe_tensor one, two;
  pe_tensor_init(&one);
  pe_tensor_init(&two);
  PE_CK_OK(pe_tensor_resize(&one, PE_F32, &os, "one"));
  PE_CK_OK(pe_tensor_resize(&two, PE_F32, &os, "two"));
  run_threads(s, op, 1, &one);
  run_threads(s, op, 2, &two);
  ck_assert(memcmp(one.data, two.data, pe_tensor_bytes(&one)) == 0);
  pe_tensor_release(&one);
  pe_tensor_release(&two);
  pe_op_desc_free(op);
  pe_scope_free(s);
}

START_TEST(large_paths_match_reference) {
  check_large("elementwise_add", PE_SHAPE(64, 600), PE_SHAPE(64, 600), PE_SHAPE(64, 600), -1);
  check_large("elementwise_add", PE_SHAPE(64, 600), PE_SHAPE(600), PE_SHAPE(64, 600), -1);
  check_large("elementwise_sub", PE_SHAPE(600), PE_SHAPE(64, 600), PE_SHAPE(64, 600), -1);
  check_large("elementwise_add", PE_SHAPE(8, 16, 20, 20), PE_SHAPE(16), PE_SHAPE(8, 16, 20, 20), 1);
  check_large("elementwise_mul", PE_SHAPE(8, 16, 20, 20), PE_SHAPE(1), PE_SHAPE(8, 16, 20, 20), -1);
  check_large("elementwise_mul", PE_SHAPE(300, 1), PE_SHAPE(1, 200), PE_SHAPE(300, 200), -1);
  check_large("elementwise_sub", PE_SHAPE(8, 16, 20, 20), PE_SHAPE(8, 1, 20, 1),
              PE_SHAPE(8, 16, 20, 20), -1);
}
END_TEST

/* Reductions of large gradients: column sums and per-channel sums. */
START_TEST(large_grad_reductions) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(8, 16, 24, 24), -1, 1, 1);
  ph_set_f32(s, "y", PE_SHAPE(16), NULL);
  pe_tensor *g = ph_set_uniform(s, "g", PE_SHAPE(8, 16, 24, 24), -1, 1, 2);
  pe_op_desc *op = ph_op("elementwise_add_grad", "X", "x", "Y", "y", "Out@GRAD", "g", NULL,
                         "X@GRAD", "dx", "Y@GRAD", "dy", NULL);
  PE_CK_OK(pe_op_set_int(op, "axis", 1));
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *dy = ph_get(s, "dy");
  for (int c = 0; c < 16; c++) {
    double want = 0;
    for (int n = 0; n < 8; n++)
      for (int k = 0; k < 576; k++) want += pe_f32(g)[(n * 16 + c) * 576 + k];
    ck_assert_msg(fabs(pe_f32(dy)[c] - want) <= 1e-4, "dy[%d] = %g, want %g", c, pe_f32(dy)[c],
                  want);
  }
  ck_assert(memcmp(ph_get(s, "dx")->data, g->data, pe_tensor_bytes(g)) == 0);
  pe_op_desc_free(op);
  /* [N,M] + [M]: column sums, and sub negates them. */
  ph_set_uniform(s, "x", PE_SHAPE(300, 700), -1, 1, 3);
  ph_set_f32(s, "y", PE_SHAPE(700), NULL);
  g = ph_set_uniform(s, "g", PE_SHAPE(300, 700), -1, 1, 4);
  op = ph_op("elementwise_sub_grad", "X", "x", "Y", "y", "Out@GRAD", "g", NULL, "Y@GRAD", "dy",
             NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  dy = ph_get(s, "dy");
  for (int j = 0; j < 700; j++) {
    double want = 0;
    for (int i = 0; i < 300; i++) want -= pe_f32(g)[i * 700 + j];
    ck_assert_msg(fabs(pe_f32(dy)[j] - want) <= 1e-4, "dy[%d] = %g, want %g", j, pe_f32(dy)[j],
                  want);
  }
  pe_op_desc_free(op);
  /* mul: dY = column sums of g .* x (fused), dX = g .* y broadcast. */
  pe_tensor *x = ph_get(s, "x"), *y = ph_set_uniform(s, "y", PE_SHAPE(700), -1, 1, 5);
  op = ph_op("elementwise_mul_grad", "X", "x", "Y", "y", "Out@GRAD", "g", NULL, "X@GRAD", "dx",
             "Y@GRAD", "dy", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  dy = ph_get(s, "dy");
  pe_tensor *dx = ph_get(s, "dx");
  for (int j = 0; j < 700; j++) {
    double want = 0;
    for (int i = 0; i < 300; i++) want += (double)pe_f32(g)[i * 700 + j] * pe_f32(x)[i * 700 + j];
    ck_assert_msg(fabs(pe_f32(dy)[j] - want) <= 1e-4, "dy[%d] = %g, want %g", j, pe_f32(dy)[j],
                  want);
  }
  for (int i = 0; i < 300 * 700; i += 997)
    ck_assert(pe_f32(dx)[i] == pe_f32(g)[i] * pe_f32(y)[i % 700]);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* --- gradients ------------------------------------------------------------------------- */

static void grad_case(const char *type, pe_shape xs, pe_shape ys, int axis) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", xs, -1, 1, 21);
  ph_set_uniform(s, "y", ys, -1, 1, 22);
  pe_op_desc *op = binop(type, axis);
  grad_ok(s, op, (const char *[]){"out"}, 1, (const char *[]){"x", "y"}, 2);
  pe_op_desc_free(op);
  pe_scope_free(s);
}

START_TEST(grads_broadcast) {
  const char *types[] = {"elementwise_add", "elementwise_sub", "elementwise_mul"};
  for (int t = 0; t < 3; t++) {
    grad_case(types[t], PE_SHAPE(3, 4), PE_SHAPE(3, 4), -1);
    grad_case(types[t], PE_SHAPE(3, 4), PE_SHAPE(4), -1);
    grad_case(types[t], PE_SHAPE(3, 4), PE_SHAPE(1, 4), -1);
    grad_case(types[t], PE_SHAPE(3, 1), PE_SHAPE(1, 4), -1);
    grad_case(types[t], PE_SHAPE(4), PE_SHAPE(3, 4), -1);
    grad_case(types[t], PE_SHAPE(2, 3, 2, 2), PE_SHAPE(3), 1);
    grad_case(types[t], PE_SHAPE(3, 4), PE_SHAPE(1), -1);
    grad_case(types[t], PE_SHAPE(1), PE_SHAPE(3, 4), -1);
    grad_case(types[t], PE_SHAPE(2, 3, 4), PE_SHAPE(2, 1, 4), -1); /* strided reduce */
  }
}
END_TEST

START_TEST(grads_scale_and_sum) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(3, 5), -1, 1, 31);
  pe_op_desc *op = ph_op("scale", "X", "x", NULL, "Out", "out", NULL);
  PE_CK_OK(pe_op_set_float(op, "scale", -2.5f));
  PE_CK_OK(pe_op_set_float(op, "bias", 0.7f));
  grad_ok(s, op, (const char *[]){"out"}, 1, (const char *[]){"x"}, 1);
  PE_CK_OK(pe_op_set_bool(op, "bias_after_scale", false));
  grad_ok(s, op, (const char *[]){"out"}, 1, (const char *[]){"x"}, 1);
  pe_op_desc_free(op);

  ph_set_uniform(s, "a", PE_SHAPE(2, 3), -1, 1, 32);
  ph_set_uniform(s, "b", PE_SHAPE(2, 3), -1, 1, 33);
  ph_set_uniform(s, "c", PE_SHAPE(2, 3), -1, 1, 34);
  op = pe_op_desc_new("sum");
  PE_CK_OK(pe_op_set_input(op, "X", 3, (const char *[]){"a", "b", "c"}));
  PE_CK_OK(pe_op_output1(op, "Out", "out"));
  grad_ok(s, op, (const char *[]){"out"}, 1, (const char *[]){"a", "b", "c"}, 3);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* Pruned Out@GRAD reads as zeros; a pruned X@GRAD is simply not written. */
START_TEST(grad_absent_slots) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(2, 2), (float[]){1, 2, 3, 4});
  ph_set_f32(s, "y", PE_SHAPE(2), (float[]){5, 6});
  ph_set_f32(s, "dy", PE_SHAPE(2), (float[]){9, 9});
  pe_op_desc *op = ph_op("elementwise_mul_grad", "X", "x", "Y", "y", NULL, "Y@GRAD", "dy", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "dy", PE_SHAPE(2), (float[]){0, 0}, 0);
  pe_op_desc_free(op);
  ph_set_f32(s, "g", PE_SHAPE(2, 2), (float[]){1, 1, 1, 2});
  op = ph_op("elementwise_mul_grad", "X", "x", "Y", "y", "Out@GRAD", "g", NULL, "Y@GRAD", "dy",
             NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "dy", PE_SHAPE(2), (float[]){1 + 3, 2 + 8}, 0); /* sum over rows of g*x */
  ck_assert_ptr_null(ph_get(s, "x@GRAD"));
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* --- compile-time inference -------------------------------------------------------------- */

START_TEST(infer_with_batch_dim) {
  pe_scope *s = pe_scope_new(NULL);
  pe_meta m[2];
  ph_set_meta(s, "x", PE_F32, PE_SHAPE(-1, 10));
  ph_set_meta(s, "y", PE_F32, PE_SHAPE(10));
  pe_op_desc *op = binop("elementwise_add", -1);
  PE_CK_OK(ph_infer_op(s, op, m, 2));
  expect_shape(&m[0].shape, PE_SHAPE(-1, 10));
  ck_assert_int_eq(m[0].dtype, PE_F32);
  ph_set_meta(s, "x", PE_F32, PE_SHAPE(-1, 1));
  ph_set_meta(s, "y", PE_F32, PE_SHAPE(1, 5));
  PE_CK_OK(ph_infer_op(s, op, m, 2));
  expect_shape(&m[0].shape, PE_SHAPE(-1, 5));
  ph_set_meta(s, "y", PE_F32, PE_SHAPE(-1, 5));
  PE_CK_OK(ph_infer_op(s, op, m, 2));
  expect_shape(&m[0].shape, PE_SHAPE(-1, 5));
  pe_op_desc_free(op);

  ph_set_meta(s, "x", PE_F32, PE_SHAPE(-1, 3, 8, 8));
  ph_set_meta(s, "y", PE_F32, PE_SHAPE(3));
  op = binop("elementwise_add", 1);
  PE_CK_OK(ph_infer_op(s, op, m, 2));
  expect_shape(&m[0].shape, PE_SHAPE(-1, 3, 8, 8));
  pe_op_desc_free(op);

  /* Grad rows infer X@GRAD / Y@GRAD like X / Y. */
  op = ph_op("elementwise_add_grad", "X", "x", "Y", "y", "Out@GRAD", "g", NULL, "X@GRAD", "dx",
             "Y@GRAD", "dy", NULL);
  PE_CK_OK(pe_op_set_int(op, "axis", 1));
  ph_set_meta(s, "g", PE_F32, PE_SHAPE(-1, 3, 8, 8));
  PE_CK_OK(ph_infer_op(s, op, m, 2));
  expect_shape(&m[0].shape, PE_SHAPE(-1, 3, 8, 8));
  expect_shape(&m[1].shape, PE_SHAPE(3));
  pe_op_desc_free(op);

  ph_set_meta(s, "a", PE_F32, PE_SHAPE(-1, 4));
  ph_set_meta(s, "b", PE_F32, PE_SHAPE(8, 4));
  op = pe_op_desc_new("sum");
  PE_CK_OK(pe_op_set_input(op, "X", 2, (const char *[]){"a", "b"}));
  PE_CK_OK(pe_op_output1(op, "Out", "out"));
  PE_CK_OK(ph_infer_op(s, op, m, 2));
  expect_shape(&m[0].shape, PE_SHAPE(8, 4));
  pe_op_desc_free(op);

  ph_set_meta(s, "x", PE_F32, PE_SHAPE(-1, 7));
  op = ph_op("scale", "X", "x", NULL, "Out", "out", NULL);
  PE_CK_OK(ph_infer_op(s, op, m, 2));
  expect_shape(&m[0].shape, PE_SHAPE(-1, 7));
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(infer_errors_name_vars_and_shapes) {
  pe_scope *s = pe_scope_new(NULL);
  pe_meta m[2];
  ph_set_meta(s, "h", PE_F32, PE_SHAPE(-1, 10));
  ph_set_meta(s, "b", PE_F32, PE_SHAPE(20));
  pe_op_desc *op = ph_op("elementwise_add", "X", "h", "Y", "b", NULL, "Out", "o", NULL);
  expect_error(ph_infer_op(s, op, m, 2), PE_ESHAPE,
               "op #0 (elementwise_add): cannot broadcast Y 'b' [20] to X 'h' [-1,10]");
  /* Paddle rule: Y must fit inside X at axis. */
  ph_set_meta(s, "h", PE_F32, PE_SHAPE(-1, 3, 4));
  ph_set_meta(s, "b", PE_F32, PE_SHAPE(4));
  PE_CK_OK(pe_op_set_int(op, "axis", 1));
  expect_error(ph_infer_op(s, op, m, 2), PE_ESHAPE, "cannot broadcast Y 'b' [4] to X 'h' [-1,3,4]");
  PE_CK_OK(pe_op_set_int(op, "axis", 3));
  expect_error(ph_infer_op(s, op, m, 2), PE_ESHAPE, "axis 3");
  PE_CK_OK(pe_op_set_int(op, "axis", INT64_MAX)); /* axis + Y's rank must not overflow */
  expect_error(ph_infer_op(s, op, m, 2), PE_ESHAPE,
               "(axis 9223372036854775807: Y does not fit inside X at this axis)");
  ph_set_meta(s, "b", PE_I64, PE_SHAPE(4));
  expect_error(ph_infer_op(s, op, m, 2), PE_EDTYPE, "'b'");
  pe_op_desc_free(op);

  ph_set_meta(s, "p", PE_F32, PE_SHAPE(3, 4));
  ph_set_meta(s, "q", PE_F32, PE_SHAPE(3, 5));
  op = pe_op_desc_new("sum");
  PE_CK_OK(pe_op_set_input(op, "X", 2, (const char *[]){"p", "q"}));
  PE_CK_OK(pe_op_output1(op, "Out", "o"));
  expect_error(ph_infer_op(s, op, m, 2), PE_ESHAPE, "X #1 'q' [3,5] differs from X #0 'p' [3,4]");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *elementwise_suite(void) {
  Suite *s = suite_create("ops_elementwise");
  TCase *tc = tcase_create("elementwise");
  tcase_add_test(tc, add_same_shape);
  tcase_add_test(tc, add_row_vector);
  tcase_add_test(tc, mul_outer_both_sides);
  tcase_add_test(tc, add_channel_axis1);
  tcase_add_test(tc, scalar_operand);
  tcase_add_test(tc, strided_general);
  tcase_add_test(tc, scale_both_modes);
  tcase_add_test(tc, sum_of_three);
  tcase_add_test(tc, large_paths_match_reference);
  tcase_add_test(tc, large_grad_reductions);
  tcase_add_test(tc, grads_broadcast);
  tcase_add_test(tc, grads_scale_and_sum);
  tcase_add_test(tc, grad_absent_slots);
  tcase_add_test(tc, infer_with_batch_dim);
  tcase_add_test(tc, infer_errors_name_vars_and_shapes);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(elementwise_suite)
