/* clip_by_global_norm: the global norm of several tensors and the scaling
 * against numbers worked out by hand, no scaling under the limit (bitwise),
 * in place, the parallel path against a double-precision reference, the
 * same norm bits on 1 and 2 threads, a NaN norm, and the attribute and
 * inference errors. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

/* clip_by_global_norm over xs[0..n) into outs, norm into "norm". */
static pe_op_desc *clip_op(const char *const *xs, const char *const *outs, int n, float max_norm) {
  pe_op_desc *op = pe_op_desc_new("clip_by_global_norm");
  ck_assert_ptr_nonnull(op);
  PE_CK_OK(pe_op_set_input(op, "X", n, xs));
  PE_CK_OK(pe_op_set_output(op, "Out", n, outs));
  PE_CK_OK(pe_op_output1(op, "GlobalNorm", "norm"));
  PE_CK_OK(pe_op_set_float(op, "max_norm", max_norm));
  return op;
}

static const char *const XS[] = {"a", "b"};
static const char *const OUTS[] = {"a@CLIP", "b@CLIP"};

/* a = [3, 0, 0, 0], b = [[0, 0], [0, 4]]: norm 5. */
static pe_scope *five(void) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "a", PE_SHAPE(4), (float[]){3, 0, 0, 0});
  ph_set_f32(s, "b", PE_SHAPE(2, 2), (float[]){0, 0, 0, 4});
  return s;
}

START_TEST(scales_to_the_limit) {
  /* max_norm 1: c = 1 / (5 + 1e-6) = 0.19999996; a -> [0.6, 0, 0, 0], b -> [.., 0.8]. */
  pe_scope *s = five();
  pe_op_desc *op = clip_op(XS, OUTS, 2, 1.0f);
  PE_CK_OK(ph_run_op(s, op, NULL));
  double c = 1.0 / (5.0 + 1e-6);
  const float *a = pe_f32(ph_get(s, "a@CLIP")), *b = pe_f32(ph_get(s, "b@CLIP"));
  ck_assert_float_eq(a[0], (float)3 * (float)c);
  ck_assert_float_eq(b[3], (float)4 * (float)c);
  ck_assert_float_eq_tol(a[0], 0.6f, 1e-6f);
  ck_assert_float_eq_tol(b[3], 0.8f, 1e-6f);
  ck_assert(a[1] == 0 && b[0] == 0);
  ck_assert_float_eq(pe_f32(ph_get(s, "norm"))[0], 5.0f);
  pe_shape bs = PE_SHAPE(2, 2);
  ck_assert(pe_shape_equal(&ph_get(s, "b@CLIP")->shape, &bs));
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(under_the_limit_is_unchanged) {
  pe_scope *s = five();
  pe_op_desc *op = clip_op(XS, OUTS, 2, 5.0f); /* 5 / (5 + 1e-6) < 1: still scaled */
  PE_CK_OK(ph_run_op(s, op, NULL));
  ck_assert(pe_f32(ph_get(s, "b@CLIP"))[3] < 4.0f);
  pe_op_desc_free(op);
  op = clip_op(XS, OUTS, 2, 5.001f); /* above the norm: a copy, bit for bit */
  PE_CK_OK(ph_run_op(s, op, NULL));
  ck_assert(!memcmp(ph_get(s, "a@CLIP")->data, ph_get(s, "a")->data, 4 * sizeof(float)));
  ck_assert(!memcmp(ph_get(s, "b@CLIP")->data, ph_get(s, "b")->data, 4 * sizeof(float)));
  ck_assert_float_eq(pe_f32(ph_get(s, "norm"))[0], 5.0f);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(in_place_and_large) {
  enum { N = 100000 };
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "a", PE_SHAPE(N), -1, 1, 5);
  ph_set_uniform(s, "b", PE_SHAPE(300, 7), -2, 2, 6);
  double sq = 0;
  float ref_a[64], ref_b[64];
  const float *a = pe_f32(ph_get(s, "a")), *b = pe_f32(ph_get(s, "b"));
  for (int i = 0; i < N; i++) sq += (double)a[i] * a[i];
  for (int i = 0; i < 2100; i++) sq += (double)b[i] * b[i];
  double c = 3.0 / (sqrt(sq) + 1e-6);
  ck_assert(c < 0.1);
  for (int i = 0; i < 64; i++) ref_a[i] = a[i] * (float)c, ref_b[i] = b[i] * (float)c;
  pe_op_desc *op = clip_op(XS, XS, 2, 3.0f); /* Out = X */
  PE_CK_OK(ph_run_op(s, op, NULL));
  a = pe_f32(ph_get(s, "a"));
  b = pe_f32(ph_get(s, "b"));
  for (int i = 0; i < 64; i++) {
    ck_assert_float_eq(a[i], ref_a[i]);
    ck_assert_float_eq(b[i], ref_b[i]);
  }
  ck_assert_float_eq_tol(pe_f32(ph_get(s, "norm"))[0], (float)sqrt(sq), 1e-6 * sqrt(sq));
  double after = 0; /* the clipped gradients' norm is the limit */
  for (int i = 0; i < N; i++) after += (double)a[i] * a[i];
  for (int i = 0; i < 2100; i++) after += (double)b[i] * b[i];
  ck_assert_double_eq_tol(sqrt(after), 3.0, 1e-5);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* The norm of x on a device with `threads` OpenMP threads. */
static float norm_on(pe_scope *s, int threads) {
  pe_device_ctx dev;
  PE_CK_OK(pe_device_ctx_init(&dev, pe_cpu_place(), threads));
  pe_op_desc *op = clip_op((const char *const[]){"x"}, (const char *const[]){"x@CLIP"}, 1, 1e9f);
  ph_op_inst *inst = ph_op_inst_new(op, &dev);
  PE_CK_OK(ph_op_inst_run(inst, s, NULL));
  float v = pe_f32(ph_get(s, "norm"))[0];
  ph_op_inst_free(inst);
  pe_op_desc_free(op);
  pe_device_ctx_destroy(&dev);
  return v;
}

START_TEST(norm_bits_do_not_depend_on_the_threads) {
  /* Above PE_PAR_MIN, built so that the order of the sum of squares shows
   * in the f32 norm. Units of 2^-54: x = 1 at the front (2^54), K = 89856
   * elements 2^-27 at the back (1 each: a quarter of an ulp of a double
   * near 1, lost when added to a running sum that holds the 1, kept when
   * summed apart), and between them elements b * 2^-26 (4 b^2 each) whose
   * squares bring the rest to M - 63/64 K, where M = (1 + 2^-24)^2 is the
   * square of the midpoint between the floats 1 and 1 + 2^-23. All but the
   * small ones are multiples of an ulp, so only where the small ones go
   * changes the sum: kept, it is M + K/64 and the norm 1 + 2^-23 (the
   * exact answer); absorbed in one of k < 64 partial sums, it is below M
   * and the norm 1. The old kernel's OpenMP reduction kept them on 2
   * threads (the 1 and the small ones in different halves) and lost a
   * part on 1 (the SIMD lane that held the 1). */
  enum { N = 200003, K = 89856 };
  pe_scope *s = pe_scope_new(NULL);
  float *x = pe_f32(ph_set_uniform(s, "x", PE_SHAPE(N), 0, 0, 0));
  x[0] = 1.0f;
  uint64_t rest = ((1ull << 31) + 64 - (uint64_t)K / 64 * 63) / 4; /* sum of b^2 */
  int i = 1;
  while (rest) {
    uint64_t b = (uint64_t)sqrt((double)rest);
    while (b * b > rest) b--;
    while ((b + 1) * (b + 1) <= rest) b++;
    x[i++] = ldexpf((float)b, -26);
    rest -= b * b;
  }
  ck_assert_int_lt(i, 64);
  for (int k = N - K; k < N; k++) x[k] = ldexpf(1.0f, -27);
  float one = norm_on(s, 1), two = norm_on(s, 2);
  ck_assert_msg(!memcmp(&one, &two, sizeof one), "norm %a on 1 thread, %a on 2", (double)one,
                (double)two);
  ck_assert_float_eq(one, nextafterf(1.0f, 2.0f));
  pe_scope_free(s);
}
END_TEST

START_TEST(nan_norm_leaves_the_gradients) {
  pe_scope *s = five();
  pe_f32(ph_get(s, "a"))[1] = NAN;
  pe_op_desc *op = clip_op(XS, OUTS, 2, 1.0f);
  PE_CK_OK(ph_run_op(s, op, NULL));
  ck_assert(isnan(pe_f32(ph_get(s, "norm"))[0]));
  ck_assert_float_eq(pe_f32(ph_get(s, "a@CLIP"))[0], 3.0f);
  ck_assert_float_eq(pe_f32(ph_get(s, "b@CLIP"))[3], 4.0f);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(errors) {
  pe_scope *s = five();
  pe_meta m[4];
  float bad[] = {0.0f, -1.0f, NAN, INFINITY};
  const char *why[] = {"max_norm = 0 must", "max_norm = -1 must", "max_norm = nan must",
                       "max_norm = inf must"};
  for (int i = 0; i < 4; i++) {
    pe_op_desc *op = clip_op(XS, OUTS, 2, bad[i]);
    expect_errors(ph_infer_op(s, op, m, 4), PE_EATTR, "clip_by_global_norm", why[i],
                  (const char *)NULL);
    pe_op_desc_free(op);
  }
  pe_op_desc *op = clip_op(XS, OUTS, 1, 1.0f); /* one output for ... */
  PE_CK_OK(pe_op_set_input(op, "X", 2, XS));   /* ... two inputs */
  expect_error(ph_infer_op(s, op, m, 4), PE_EARITY, "2 inputs X but 1 outputs Out");
  pe_op_desc_free(op);
  ph_set_i64(s, "b", PE_SHAPE(2), (int64_t[]){1, 2});
  op = clip_op(XS, OUTS, 2, 1.0f);
  expect_error(ph_infer_op(s, op, m, 4), PE_EDTYPE, "'b'");
  pe_op_desc_free(op);
  op = pe_op_desc_new("clip_by_global_norm"); /* max_norm is required */
  PE_CK_OK(pe_op_set_input(op, "X", 1, XS));
  PE_CK_OK(pe_op_set_output(op, "Out", 1, OUTS));
  expect_error(ph_infer_op(s, op, m, 4), PE_EATTR, "max_norm");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *clip_suite(void) {
  Suite *s = suite_create("ops_clip");
  TCase *tc = tcase_create("clip");
  tcase_add_test(tc, scales_to_the_limit);
  tcase_add_test(tc, under_the_limit_is_unchanged);
  tcase_add_test(tc, in_place_and_large);
  tcase_add_test(tc, norm_bits_do_not_depend_on_the_threads);
  tcase_add_test(tc, nan_norm_leaves_the_gradients);
  tcase_add_test(tc, errors);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(clip_suite)
