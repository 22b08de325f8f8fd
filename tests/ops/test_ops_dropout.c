/* dropout and dropout_grad. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

static pe_op_desc *dropout_op(float p, bool is_test, const char *impl) {
  pe_op_desc *op = ph_op("dropout", "X", "x", NULL, "Out", "out", "Mask", "mask", NULL);
  PE_CK_OK(pe_op_set_float(op, "dropout_prob", p));
  PE_CK_OK(pe_op_set_bool(op, "is_test", is_test));
  if (impl) PE_CK_OK(pe_op_set_string(op, "dropout_implementation", impl));
  return op;
}

START_TEST(train_mask_fraction_and_upscale) {
  /* p = 0.3, n = 1e5: keep fraction 0.7 with standard error
   * sqrt(0.21/1e5) = 0.0015 -> tol 0.01. Kept values are x / 0.7, computed by
   * the kernel as x * (1/(1-p)) in f32, so a 1e-6 relative tolerance. */
  enum { N = 100000 };
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(100, 1000), 0.5f, 1.5f, 3);
  pe_op_desc *op = dropout_op(0.3f, false, NULL);
  pe_rng rng = {21, 5};
  PE_CK_OK(ph_run_op(s, op, &rng));
  ck_assert_uint_eq(rng.offset, 5 + N); /* one counter per element */
  pe_tensor *x = ph_get(s, "x"), *out = ph_get(s, "out"), *mask = ph_get(s, "mask");
  ck_assert_int_eq(mask->dtype, PE_U8);
  ck_assert(pe_shape_equal(&mask->shape, &x->shape));
  ck_assert(pe_shape_equal(&out->shape, &x->shape));
  const uint8_t *m = mask->data;
  long kept = 0;
  for (int i = 0; i < N; i++) {
    ck_assert(m[i] <= 1);
    kept += m[i];
    float want = m[i] ? pe_f32(x)[i] / 0.7f : 0.0f;
    ck_assert_float_eq_tol(pe_f32(out)[i], want, 1e-6f * fabsf(want) + 1e-12f);
  }
  ck_assert_double_eq_tol((double)kept / N, 0.7, 0.01);

  /* The mask is a function of the generator offset. */
  uint8_t *first = malloc(N);
  memcpy(first, m, N);
  rng = (pe_rng){21, 5};
  PE_CK_OK(ph_run_op(s, op, &rng));
  ck_assert(memcmp(first, mask->data, N) == 0);
  PE_CK_OK(ph_run_op(s, op, &rng)); /* offset moved on */
  ck_assert(memcmp(first, mask->data, N) != 0);
  free(first);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(test_mode_and_downgrade) {
  float xv[] = {1, -2, 3, -4, 5, 6};
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(2, 3), xv);
  pe_rng rng = {8, 0};

  /* upscale_in_train, test: identity, mask of ones, no draws. */
  pe_op_desc *op = dropout_op(0.25f, true, NULL);
  PE_CK_OK(ph_run_op(s, op, &rng));
  for (int i = 0; i < 6; i++) {
    ck_assert(pe_f32(ph_get(s, "out"))[i] == xv[i]);
    ck_assert_uint_eq(((uint8_t *)ph_get(s, "mask")->data)[i], 1);
  }
  ck_assert_uint_eq(rng.offset, 0);
  pe_op_desc_free(op);

  /* downgrade_in_infer, test: x * (1 - p) (both f32 products: exact). */
  op = dropout_op(0.25f, true, "downgrade_in_infer");
  PE_CK_OK(ph_run_op(s, op, &rng));
  for (int i = 0; i < 6; i++) ck_assert(pe_f32(ph_get(s, "out"))[i] == xv[i] * 0.75f);
  ck_assert_uint_eq(rng.offset, 0);
  pe_op_desc_free(op);

  /* downgrade_in_infer, train: x * mask, no scaling. */
  ph_set_uniform(s, "x", PE_SHAPE(1000), -1, 1, 9);
  op = dropout_op(0.5f, false, "downgrade_in_infer");
  PE_CK_OK(ph_run_op(s, op, &rng));
  ck_assert_uint_eq(rng.offset, 1000);
  const uint8_t *m = ph_get(s, "mask")->data;
  int kept = 0;
  for (int i = 0; i < 1000; i++) {
    kept += m[i];
    ck_assert(pe_f32(ph_get(s, "out"))[i] == (m[i] ? pe_f32(ph_get(s, "x"))[i] : 0.0f));
  }
  ck_assert(kept > 0 && kept < 1000);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(p_zero_and_p_one) {
  float xv[] = {1, -2, INFINITY, 4};
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(4), xv);
  /* p = 0 keeps everything with scale 1. */
  pe_op_desc *op = dropout_op(0.0f, false, NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  for (int i = 0; i < 4; i++) {
    ck_assert(pe_f32(ph_get(s, "out"))[i] == xv[i]);
    ck_assert_uint_eq(((uint8_t *)ph_get(s, "mask")->data)[i], 1);
  }
  pe_op_desc_free(op);
  /* p = 1 drops everything: zeros (no 1/0, and not inf * 0 = NaN). */
  const char *impls[] = {"upscale_in_train", "downgrade_in_infer"};
  for (int k = 0; k < 2; k++) {
    op = dropout_op(1.0f, false, impls[k]);
    PE_CK_OK(ph_run_op(s, op, NULL));
    for (int i = 0; i < 4; i++) {
      ck_assert(pe_f32(ph_get(s, "out"))[i] == 0.0f);
      ck_assert_uint_eq(((uint8_t *)ph_get(s, "mask")->data)[i], 0);
    }
    pe_op_desc_free(op);
  }
  /* p = 1 at test time: upscale is identity, downgrade gives x * 0. */
  op = dropout_op(1.0f, true, NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  ck_assert(pe_f32(ph_get(s, "out"))[1] == -2.0f);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(gradient_matches_central_differences) {
  /* Given the mask (the harness replays the generator for every forward),
   * Out is linear in X, so central differences are exact up to f32 rounding
   * (~1e-5 with eps 1e-2 over 20 terms); tolerance 1e-3. */
  struct {
    float p;
    bool is_test;
    const char *impl;
  } cases[] = {{0.4f, false, "upscale_in_train"},
               {0.4f, false, "downgrade_in_infer"},
               {0.4f, true, "downgrade_in_infer"},
               {1.0f, false, "upscale_in_train"}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    pe_scope *s = pe_scope_new(NULL);
    ph_set_uniform(s, "x", PE_SHAPE(4, 5), -1, 1, 13);
    pe_op_desc *op = dropout_op(cases[c].p, cases[c].is_test, cases[c].impl);
    const char *outs[] = {"out"}, *wrt[] = {"x"};
    ph_grad_report rep;
    PE_CK_OK(ph_grad_check(s, op, outs, 1, wrt, 1, 1e-2, 0, &rep));
    ck_assert_int_eq(rep.checked, 20);
    ck_assert_msg(rep.max_err < 1e-3, "case %zu: max_err %g at %s[%lld]: analytic %g numeric %g", c,
                  rep.max_err, rep.worst, (long long)rep.worst_index, rep.analytic, rep.numeric);
    /* And directly: X@GRAD = Out@GRAD * Mask * scale. */
    float scale = cases[c].is_test ? 1.0f - cases[c].p : 1.0f;
    if (!cases[c].is_test && !strcmp(cases[c].impl, "upscale_in_train"))
      scale = cases[c].p < 1.0f ? 1.0f / (1.0f - cases[c].p) : 0.0f;
    const float *dx = pe_f32(ph_get(s, "x@GRAD")), *dy = pe_f32(ph_get(s, "out@GRAD"));
    const uint8_t *m = ph_get(s, "mask")->data;
    for (int i = 0; i < 20; i++) ck_assert(dx[i] == (m[i] ? dy[i] * scale : 0.0f));
    pe_op_desc_free(op);
    pe_scope_free(s);
  }
}
END_TEST

START_TEST(grad_without_out_grad_is_zero) {
  pe_scope *s = pe_scope_new(NULL);
  pe_var *v;
  PE_CK_OK(pe_scope_var(s, "mask", &v));
  pe_shape sh = PE_SHAPE(2, 2);
  PE_CK_OK(pe_tensor_resize(&v->t, PE_U8, &sh, "mask"));
  memset(v->t.data, 1, 4);
  pe_op_desc *op = ph_op("dropout_grad", "Mask", "mask", NULL, "X@GRAD", "dx", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *dx = ph_get(s, "dx");
  ck_assert(pe_shape_equal(&dx->shape, &sh));
  for (int i = 0; i < 4; i++) ck_assert(pe_f32(dx)[i] == 0.0f);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(bad_attributes) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(3), -1, 1, 1);
  pe_meta m[2];
  float bad[] = {1.5f, -0.1f, NAN};
  for (int i = 0; i < 3; i++) {
    pe_op_desc *op = dropout_op(bad[i], false, NULL);
    expect_error(ph_infer_op(s, op, m, 2), PE_EATTR, "'dropout_prob'");
    expect_error(ph_run_op(s, op, NULL), PE_EATTR, "outside [0, 1]");
    pe_op_desc_free(op);
  }
  pe_op_desc *op = dropout_op(0.5f, false, "sometimes");
  expect_error(ph_infer_op(s, op, m, 2), PE_EATTR, "\"sometimes\"");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(seeded_and_thread_independent) {
  /* 2e5 elements: above the size where the kernel goes parallel. Runs write
   * to s1 or s2 (the same x in both) so that two results can be compared. */
  pe_device_ctx one, two;
  PE_CK_OK(pe_device_ctx_init(&one, pe_cpu_place(), 1));
  PE_CK_OK(pe_device_ctx_init(&two, pe_cpu_place(), 2));
  pe_scope *s1 = pe_scope_new(NULL), *s2 = pe_scope_new(NULL);
  ph_set_uniform(s1, "x", PE_SHAPE(200000), -1, 1, 2);
  ph_set_uniform(s2, "x", PE_SHAPE(200000), -1, 1, 2);

  /* Program generator: same offset, 1 vs 2 threads, same bytes. */
  pe_op_desc *op = dropout_op(0.5f, false, NULL);
  pe_rng ra = {4, 9}, rb = {4, 9};
  ph_op_inst *a = ph_op_inst_new(op, &one), *b = ph_op_inst_new(op, &two);
  PE_CK_OK(ph_op_inst_run(a, s1, &ra));
  PE_CK_OK(ph_op_inst_run(b, s2, &rb));
  pe_tensor *o1 = ph_get(s1, "out"), *m1 = ph_get(s1, "mask");
  pe_tensor *o2 = ph_get(s2, "out"), *m2 = ph_get(s2, "mask");
  ck_assert(memcmp(m1->data, m2->data, 200000) == 0);
  ck_assert(memcmp(o1->data, o2->data, pe_tensor_bytes(o1)) == 0);
  ck_assert_ptr_null(a->state); /* seed 0 keeps no state */

  /* seed != 0: the op's own seed, counters from the program generator (no
   * op state): at the same offset the mask differs from seed 0's, the
   * generator advances by one counter per element, and the same offset
   * gives the same mask again. */
  PE_CK_OK(pe_op_set_int(op, "seed", 77));
  pe_rng prog = {4, 9};
  PE_CK_OK(ph_op_inst_run(a, s2, &prog));
  ck_assert_ptr_null(a->state);
  ck_assert_uint_eq(prog.offset, 9 + 200000);
  ck_assert(memcmp(m1->data, m2->data, 200000) != 0);
  prog.offset = 9;
  PE_CK_OK(ph_op_inst_run(b, s1, &prog));
  ck_assert(memcmp(m1->data, m2->data, 200000) == 0);
  PE_CK_OK(ph_op_inst_run(b, s1, &prog)); /* the next counters: another mask */
  ck_assert(memcmp(m1->data, m2->data, 200000) != 0);
  ph_op_inst_free(a);
  ph_op_inst_free(b);

  pe_op_desc_free(op);
  pe_scope_free(s1);
  pe_scope_free(s2);
  pe_device_ctx_destroy(&one);
  pe_device_ctx_destroy(&two);
}
END_TEST

static Suite *dropout_suite(void) {
  Suite *s = suite_create("ops_dropout");
  TCase *tc = tcase_create("dropout");
  tcase_add_test(tc, train_mask_fraction_and_upscale);
  tcase_add_test(tc, test_mode_and_downgrade);
  tcase_add_test(tc, p_zero_and_p_one);
  tcase_add_test(tc, gradient_matches_central_differences);
  tcase_add_test(tc, grad_without_out_grad_is_zero);
  tcase_add_test(tc, bad_attributes);
  tcase_add_test(tc, seeded_and_thread_independent);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(dropout_suite)
