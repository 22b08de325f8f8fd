/* sgd, momentum, adam: two in-place steps against numbers worked out by
 * hand (adam's in double precision, see the comments), and the inference
 * errors. The kernels compute in f32; values are O(1), so each expected
 * number is checked to 1e-6 absolute (a few f32 ulps after ~5 roundings). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

#define TOL 1e-6

static void expect_values(pe_scope *s, const char *name, const double *want, int n) {
  pe_tensor *t = ph_get(s, name);
  ck_assert_int_eq(pe_tensor_numel(t), n);
  for (int i = 0; i < n; i++)
    ck_assert_msg(fabs(pe_f32(t)[i] - want[i]) <= TOL, "%s[%d] = %.9g, want %.9g", name, i,
                  pe_f32(t)[i], want[i]);
}

static void set_grad(pe_scope *s, const float *g, int n) {
  ph_set_f32(s, "w@GRAD", PE_SHAPE(n), g);
}

START_TEST(sgd_two_steps) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "w", PE_SHAPE(3), (float[]){1, -2, 3});
  ph_set_f32(s, "lr", PE_SHAPE(1), (float[]){0.1f});
  /* In place: ParamOut is the Param variable. */
  pe_op_desc *op = ph_op("sgd", "Param", "w", "Grad", "w@GRAD", "LearningRate", "lr", NULL,
                         "ParamOut", "w", NULL);
  set_grad(s, (float[]){0.5f, 0.5f, -1}, 3);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_values(s, "w", (double[]){0.95, -2.05, 3.1}, 3); /* w - 0.1 g */
  set_grad(s, (float[]){1, 0, 2}, 3);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_values(s, "w", (double[]){0.85, -2.05, 2.9}, 3);
  pe_op_desc_free(op);

  /* Into a separate variable, Param is left alone. */
  op = ph_op("sgd", "Param", "w", "Grad", "w@GRAD", "LearningRate", "lr", NULL, "ParamOut", "w2",
             NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_values(s, "w2", (double[]){0.75, -2.05, 2.7}, 3);
  expect_values(s, "w", (double[]){0.85, -2.05, 2.9}, 3);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static pe_op_desc *momentum_op(bool nesterov) {
  pe_op_desc *op = ph_op("momentum", "Param", "w", "Grad", "w@GRAD", "Velocity", "v",
                         "LearningRate", "lr", NULL, "ParamOut", "w", "VelocityOut", "v", NULL);
  PE_CK_OK(pe_op_set_float(op, "mu", 0.9f));
  PE_CK_OK(pe_op_set_bool(op, "use_nesterov", nesterov));
  return op;
}

START_TEST(momentum_two_steps) {
  /* mu 0.9, lr 0.1, w = [1, 2], v = 0, g1 = [1, -1], g2 = [0.5, 0.5].
   * step 1: v = [1, -1];            w = [0.9, 2.1]
   * step 2: v = 0.9 v + g2 = [1.4, -0.4];  w = [0.9 - 0.14, 2.1 + 0.04] */
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "w", PE_SHAPE(2), (float[]){1, 2});
  ph_set_f32(s, "v", PE_SHAPE(2), (float[]){0, 0});
  ph_set_f32(s, "lr", PE_SHAPE(1), (float[]){0.1f});
  pe_op_desc *op = momentum_op(false);
  set_grad(s, (float[]){1, -1}, 2);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_values(s, "v", (double[]){1, -1}, 2);
  expect_values(s, "w", (double[]){0.9, 2.1}, 2);
  set_grad(s, (float[]){0.5f, 0.5f}, 2);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_values(s, "v", (double[]){1.4, -0.4}, 2);
  expect_values(s, "w", (double[]){0.76, 2.14}, 2);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(momentum_nesterov_two_steps) {
  /* Same data; w -= lr (g + mu v) with the new v.
   * step 1: v = [1, -1];    w = [1 - 0.1*1.9, 2 + 0.1*1.9] = [0.81, 2.19]
   * step 2: v = [1.4, -0.4]; w = [0.81 - 0.1*(0.5+1.26), 2.19 - 0.1*(0.5-0.36)] */
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "w", PE_SHAPE(2), (float[]){1, 2});
  ph_set_f32(s, "v", PE_SHAPE(2), (float[]){0, 0});
  ph_set_f32(s, "lr", PE_SHAPE(1), (float[]){0.1f});
  pe_op_desc *op = momentum_op(true);
  set_grad(s, (float[]){1, -1}, 2);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_values(s, "v", (double[]){1, -1}, 2);
  expect_values(s, "w", (double[]){0.81, 2.19}, 2);
  set_grad(s, (float[]){0.5f, 0.5f}, 2);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_values(s, "v", (double[]){1.4, -0.4}, 2);
  expect_values(s, "w", (double[]){0.634, 2.176}, 2);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static pe_op_desc *adam_op(void) {
  pe_op_desc *op = ph_op("adam", "Param", "w", "Grad", "w@GRAD", "LearningRate", "lr", "Moment1",
                         "m1", "Moment2", "m2", "Beta1Pow", "b1p", "Beta2Pow", "b2p", NULL,
                         "ParamOut", "w", "Moment1Out", "m1", "Moment2Out", "m2", "Beta1PowOut",
                         "b1p", "Beta2PowOut", "b2p", NULL);
  return op; /* beta1 0.9, beta2 0.999, epsilon 1e-8 by default */
}

static void adam_init(pe_scope *s, int n) {
  float zeros[64] = {0};
  ph_set_f32(s, "m1", PE_SHAPE(n), zeros);
  ph_set_f32(s, "m2", PE_SHAPE(n), zeros);
  ph_set_f32(s, "lr", PE_SHAPE(1), (float[]){0.01f});
  ph_set_f32(s, "b1p", PE_SHAPE(1), (float[]){0.9f}); /* startup: the pows start at beta */
  ph_set_f32(s, "b2p", PE_SHAPE(1), (float[]){0.999f});
}

START_TEST(adam_two_steps) {
  /* lr 0.01, w = [1, -1], g1 = [0.1, -0.2], g2 = [0.3, 0.1].
   * step 1: m1 = 0.1 g1 = [0.01, -0.02]; m2 = 0.001 g1^2 = [1e-5, 4e-5]
   *         lr_t = 0.01 sqrt(1-0.999)/(1-0.9) = 0.0031622777
   *         w -= lr_t m1/(sqrt(m2)+1e-8) -> [0.99000003, -0.99000002]
   *         pows -> 0.81, 0.998001
   * step 2: m1 = [0.039, -0.008]; m2 = [9.999e-5, 4.996e-5]
   *         lr_t = 0.01 sqrt(1-0.998001)/(1-0.81) = 0.0023531673
   *         w -> [0.98082223, -0.98733665]; pows -> 0.729, 0.997002999 */
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "w", PE_SHAPE(2), (float[]){1, -1});
  adam_init(s, 2);
  pe_op_desc *op = adam_op();
  set_grad(s, (float[]){0.1f, -0.2f}, 2);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_values(s, "m1", (double[]){0.01, -0.02}, 2);
  expect_values(s, "m2", (double[]){1e-5, 4e-5}, 2);
  expect_values(s, "w", (double[]){0.9900000316226766, -0.9900000158113633}, 2);
  expect_values(s, "b1p", (double[]){0.81}, 1);
  expect_values(s, "b2p", (double[]){0.998001}, 1);
  set_grad(s, (float[]){0.3f, 0.1f}, 2);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_values(s, "m1", (double[]){0.039, -0.008}, 2);
  expect_values(s, "m2", (double[]){9.999e-5, 4.996e-5}, 2);
  expect_values(s, "w", (double[]){0.9808222296111345, -0.987336649182836}, 2);
  expect_values(s, "b1p", (double[]){0.729}, 1);
  expect_values(s, "b2p", (double[]){0.997002999}, 1);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(large_in_place_update_matches_reference) {
  /* 1e5 elements (the parallel path): in-place momentum against a double
   * reference per element; relative 1e-6 (f32 rounding of 3 operations). */
  enum { N = 100000 };
  pe_scope *s = pe_scope_new(NULL);
  pe_tensor *w = ph_set_uniform(s, "w", PE_SHAPE(N), -1, 1, 1);
  pe_tensor *v = ph_set_uniform(s, "v", PE_SHAPE(N), -1, 1, 2);
  pe_tensor *g = ph_set_uniform(s, "w@GRAD", PE_SHAPE(N), -1, 1, 3);
  ph_set_f32(s, "lr", PE_SHAPE(1), (float[]){0.05f});
  static double want_w[N], want_v[N];
  for (int i = 0; i < N; i++) {
    want_v[i] = 0.9f * pe_f32(v)[i] + (double)pe_f32(g)[i];
    want_w[i] = pe_f32(w)[i] - 0.05f * want_v[i];
  }
  pe_op_desc *op = momentum_op(false);
  PE_CK_OK(ph_run_op(s, op, NULL));
  for (int i = 0; i < N; i++) {
    ck_assert(fabs(pe_f32(v)[i] - want_v[i]) <= 1e-6 * fmax(1, fabs(want_v[i])));
    ck_assert(fabs(pe_f32(w)[i] - want_w[i]) <= 1e-6 * fmax(1, fabs(want_w[i])));
  }
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static void set_l2(pe_op_desc *op, const char *method, float coeff) {
  PE_CK_OK(pe_op_set_string(op, "regularization_method", method));
  PE_CK_OK(pe_op_set_float(op, "regularization_coeff", coeff));
}

START_TEST(momentum_l2_decay_two_steps) {
  /* mu 0.9, lr 0.1, coeff 0.1; the gradient used is g + 0.1 w.
   * step 1: g' = [1.1, -0.8]; v = g';  w = [0.89, 2.08]
   * step 2: g' = [0.5 + 0.089, 0.5 + 0.208]; v = 0.9 [1.1, -0.8] + g' = [1.579, -0.012]
   *         w = [0.89 - 0.1579, 2.08 + 0.0012] */
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "w", PE_SHAPE(2), (float[]){1, 2});
  ph_set_f32(s, "v", PE_SHAPE(2), (float[]){0, 0});
  ph_set_f32(s, "lr", PE_SHAPE(1), (float[]){0.1f});
  pe_op_desc *op = momentum_op(false);
  set_l2(op, "l2_decay", 0.1f);
  set_grad(s, (float[]){1, -1}, 2);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_values(s, "v", (double[]){1.1, -0.8}, 2);
  expect_values(s, "w", (double[]){0.89, 2.08}, 2);
  set_grad(s, (float[]){0.5f, 0.5f}, 2);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_values(s, "v", (double[]){1.579, -0.012}, 2);
  expect_values(s, "w", (double[]){0.7321, 2.0812}, 2);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(adamw_two_steps) {
  /* adam_two_steps with decoupled_decay 0.1 (AdamW): the moments are adam's
   * (the gradient is not touched) and w is scaled by 1 - lr c = 0.999 before
   * each of adam's steps, whose sizes do not depend on w:
   * step 1: w = 0.999 [1, -1] - [0.0099999684, -0.0099999842]
   *           = [0.98900003, -0.98900002]
   * step 2: w = 0.999 w - (adam's step 2: [0.0091778018, -0.0026633666])
   *           = [0.97883323, -0.98534765] */
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "w", PE_SHAPE(2), (float[]){1, -1});
  adam_init(s, 2);
  pe_op_desc *op = adam_op();
  set_l2(op, "decoupled_decay", 0.1f);
  set_grad(s, (float[]){0.1f, -0.2f}, 2);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_values(s, "m1", (double[]){0.01, -0.02}, 2);
  expect_values(s, "m2", (double[]){1e-5, 4e-5}, 2);
  expect_values(s, "w", (double[]){0.9890000318536434, -0.9890000160423307}, 2);
  set_grad(s, (float[]){0.3f, 0.1f}, 2);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_values(s, "w", (double[]){0.978833230052583, -0.9853476494646605}, 2);
  expect_values(s, "b1p", (double[]){0.729}, 1);
  expect_values(s, "b2p", (double[]){0.997002999}, 1);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* Each optimizer with l2_decay c on gradient g updates like the same
 * optimizer without it on g + c * w (two steps, 1e5 elements: the parallel
 * loop too); a coefficient without the method is no decay (Paddle's rule). */
static pe_op_desc *opt_op(int kind) {
  if (kind == 1) return momentum_op(true);
  if (kind == 2) return adam_op();
  return ph_op("sgd", "Param", "w", "Grad", "w@GRAD", "LearningRate", "lr", NULL, "ParamOut", "w",
               NULL);
}

static pe_scope *opt_scope(int n) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "w", PE_SHAPE(n), -1, 1, 1);
  ph_set_uniform(s, "v", PE_SHAPE(n), -1, 1, 2);
  ph_set_uniform(s, "m1", PE_SHAPE(n), -1, 1, 3);
  ph_set_uniform(s, "m2", PE_SHAPE(n), 0, 1, 4);
  ph_set_f32(s, "lr", PE_SHAPE(1), (float[]){0.05f});
  ph_set_f32(s, "b1p", PE_SHAPE(1), (float[]){0.9f});
  ph_set_f32(s, "b2p", PE_SHAPE(1), (float[]){0.999f});
  return s;
}

START_TEST(l2_decay_is_the_gradient_plus_coeff_times_param) {
  enum { N = 100000 };
  const float c = 0.03f;
  int kind = _i;
  pe_scope *dec = opt_scope(N), *ref = opt_scope(N), *off = opt_scope(N);
  pe_op_desc *op_dec = opt_op(kind), *op_ref = opt_op(kind), *op_off = opt_op(kind);
  set_l2(op_dec, "l2_decay", c);
  set_l2(op_off, "", c);
  for (int step = 0; step < 2; step++) {
    pe_tensor *g = ph_set_uniform(dec, "w@GRAD", PE_SHAPE(N), -1, 1, 10 + step);
    const float *w = pe_f32(ph_get(ref, "w"));
    float *g2 = pe_f32(ph_set_uniform(ref, "w@GRAD", PE_SHAPE(N), 0, 0, 0));
    for (int i = 0; i < N; i++) g2[i] = pe_f32(g)[i] + c * w[i];
    ph_set_uniform(off, "w@GRAD", PE_SHAPE(N), -1, 1, 10 + step);
    PE_CK_OK(ph_run_op(dec, op_dec, NULL));
    PE_CK_OK(ph_run_op(ref, op_ref, NULL));
    PE_CK_OK(ph_run_op(off, op_off, NULL));
  }
  const char *vars[] = {"w", "v", "m1", "m2"};
  for (int k = 0; k < 4; k++) {
    const float *a = pe_f32(ph_get(dec, vars[k])), *b = pe_f32(ph_get(ref, vars[k]));
    for (int i = 0; i < N; i++)
      ck_assert_msg(fabsf(a[i] - b[i]) <= 1e-6f * fmaxf(1, fabsf(b[i])),
                    "kind %d %s[%d]: %.9g vs %.9g", kind, vars[k], i, a[i], b[i]);
  }
  /* Without the method the coefficient is ignored: the undecayed update. */
  const float *w_off = pe_f32(ph_get(off, "w")), *w_dec = pe_f32(ph_get(dec, "w"));
  pe_scope *plain = opt_scope(N);
  pe_op_desc *op_plain = opt_op(kind);
  for (int step = 0; step < 2; step++) {
    ph_set_uniform(plain, "w@GRAD", PE_SHAPE(N), -1, 1, 10 + step);
    PE_CK_OK(ph_run_op(plain, op_plain, NULL));
  }
  const float *w_plain = pe_f32(ph_get(plain, "w"));
  int differ = 0;
  for (int i = 0; i < N; i++) {
    ck_assert_msg(w_off[i] == w_plain[i], "kind %d w[%d]: %.9g vs %.9g", kind, i, w_off[i],
                  w_plain[i]);
    differ += w_dec[i] != w_plain[i];
  }
  ck_assert_int_gt(differ, N / 2); /* the decay did change the update */
  pe_op_desc_free(op_dec);
  pe_op_desc_free(op_ref);
  pe_op_desc_free(op_off);
  pe_op_desc_free(op_plain);
  pe_scope_free(dec);
  pe_scope_free(ref);
  pe_scope_free(off);
  pe_scope_free(plain);
}
END_TEST

START_TEST(inference_errors) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "w", PE_SHAPE(3, 4), -1, 1, 1);
  ph_set_uniform(s, "w@GRAD", PE_SHAPE(4, 3), -1, 1, 2);
  ph_set_f32(s, "lr", PE_SHAPE(1), (float[]){0.1f});
  pe_meta m[5];
  pe_op_desc *op = ph_op("sgd", "Param", "w", "Grad", "w@GRAD", "LearningRate", "lr", NULL,
                         "ParamOut", "w", NULL);
  /* Same element count, different shape: no silent reshape. */
  expect_error(ph_infer_op(s, op, m, 5), PE_ESHAPE,
               "Grad 'w@GRAD' has shape [4,3] but Param 'w' has shape [3,4]");
  expect_error(ph_run_op(s, op, NULL), PE_ESHAPE, "[4,3]");
  ph_set_uniform(s, "w@GRAD", PE_SHAPE(3, 4), -1, 1, 2);
  PE_CK_OK(ph_infer_op(s, op, m, 5));
  ck_assert(m[0].dtype == PE_F32 && pe_shape_equal(&m[0].shape, &ph_get(s, "w")->shape));
  ph_set_f32(s, "lr", PE_SHAPE(2), (float[]){0.1f, 0.2f});
  expect_error(ph_infer_op(s, op, m, 5), PE_ESHAPE,
               "LearningRate 'lr' is f32 [2]; it must be [1] f32");
  ph_set_i64(s, "lr", PE_SHAPE(1), (int64_t[]){1});
  expect_error(ph_infer_op(s, op, m, 5), PE_EDTYPE, "i64 [1]");
  ph_set_f32(s, "lr", PE_SHAPE(1), (float[]){0.1f});
  pe_op_desc_free(op);

  /* momentum checks Velocity like Grad. */
  ph_set_uniform(s, "v", PE_SHAPE(12), -1, 1, 3);
  op = momentum_op(false);
  expect_error(ph_infer_op(s, op, m, 5), PE_ESHAPE,
               "Velocity 'v' has shape [12] but Param 'w' has shape [3,4]");
  pe_op_desc_free(op);

  /* adam: betas must be in [0, 1); a hand-set pow of 1 fails at run time. */
  ph_set_f32(s, "w", PE_SHAPE(2), (float[]){1, 2});
  set_grad(s, (float[]){1, 1}, 2);
  adam_init(s, 2);
  op = adam_op();
  PE_CK_OK(pe_op_set_float(op, "beta1", 1.0f));
  expect_error(ph_infer_op(s, op, m, 5), PE_EATTR, "beta1 = 1");
  PE_CK_OK(pe_op_set_float(op, "beta1", 0.9f));
  ph_set_f32(s, "b1p", PE_SHAPE(1), (float[]){1.0f});
  expect_errors(ph_run_op(s, op, NULL), PE_EINVAL, "Beta1Pow 'b1p' = 1", "Param 'w'",
                (const char *)NULL);
  ph_set_f32(s, "b1p", PE_SHAPE(1), (float[]){0.9f});
  /* Regularisation: a known method and a finite coefficient >= 0. */
  set_l2(op, "l1_decay", 0.1f);
  expect_errors(ph_infer_op(s, op, m, 5), PE_EATTR, "adam",
                "regularization_method = 'l1_decay' unknown", (const char *)NULL);
  set_l2(op, "l2_decay", -0.1f);
  expect_error(ph_infer_op(s, op, m, 5), PE_EATTR, "regularization_coeff = -0.1");
  set_l2(op, "l2_decay", NAN);
  expect_error(ph_run_op(s, op, NULL), PE_EATTR, "regularization_coeff = nan");
  set_l2(op, "decoupled_decay", -1.0f);
  expect_error(ph_infer_op(s, op, m, 5), PE_EATTR, "regularization_coeff = -1");
  set_l2(op, "decoupled", 0.1f);
  expect_error(ph_infer_op(s, op, m, 5), PE_EATTR,
               "regularization_method = 'decoupled' unknown (\"\", l2_decay or decoupled_decay)");
  set_l2(op, "decoupled_decay", 0.1f);
  PE_CK_OK(ph_infer_op(s, op, m, 5));
  pe_op_desc_free(op);
  /* decoupled decay is adam's only: sgd and momentum refuse it. */
  for (int kind = 0; kind < 2; kind++) {
    ph_set_f32(s, "v", PE_SHAPE(2), (float[]){0, 0});
    op = opt_op(kind);
    set_l2(op, "decoupled_decay", 0.1f);
    expect_errors(ph_infer_op(s, op, m, 5), PE_EATTR, kind ? "momentum" : "sgd",
                  "regularization_method = 'decoupled_decay' is adam's (adamw)",
                  (const char *)NULL);
    set_l2(op, "l1_decay", 0.1f);
    expect_error(ph_infer_op(s, op, m, 5), PE_EATTR, "'l1_decay' unknown (\"\", l2_decay)");
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

/* Adam's loop runs as vector code (optimizer.c is built without errno for
 * sqrtf, so the vectorizer can use sqrtps): it must give the same bits as
 * the scalar formula with the C library's sqrtf, element by element, for
 * every vector-tail length (n 1..67), around the parallel threshold and at
 * [784,256] (two threads), for adam, l2 decay and adamw. The data mixes
 * ordinary values with zeros, -0, denormals, huge gradients (g*g = inf) and a
 * negative Moment2 set by hand (sqrt of a negative: NaN, same NaN bits). */
static float adam_bits_value(int64_t i, int slot) {
  static const float special[] = {0.0f, -0.0f, 1e-40f, -3e-39f, 1e-20f, 3e19f, -3e19f, 1e-45f};
  uint64_t h = (uint64_t)(i * 4 + slot) * 0x9e3779b97f4a7c15ull;
  h ^= h >> 29;
  if (h % 7 == 0) return special[(h >> 8) % 8];
  return (float)((double)(h >> 11) / 9007199254740992.0) * 2.0f - 1.0f; /* [-1, 1) */
}

START_TEST(adam_vector_loop_matches_scalar_sqrtf_bits) {
  static const int64_t sizes[] = {1000, 32767, 32768, 32769, 784 * 256};
  const int n_small = 67, n_sizes = n_small + (int)(sizeof sizes / sizeof sizes[0]);
  const char *methods[] = {"", "l2_decay", "decoupled_decay"};
  for (int mth = 0; mth < 3; mth++) {
    for (int k = 0; k < n_sizes; k++) {
      int64_t n = k < n_small ? k + 1 : sizes[k - n_small];
      pe_scope *s = pe_scope_new(NULL);
      float *w = pe_f32(ph_set_uniform(s, "w", PE_SHAPE(n), 0, 0, 0));
      float *g = pe_f32(ph_set_uniform(s, "w@GRAD", PE_SHAPE(n), 0, 0, 0));
      float *m1 = pe_f32(ph_set_uniform(s, "m1", PE_SHAPE(n), 0, 0, 0));
      float *m2 = pe_f32(ph_set_uniform(s, "m2", PE_SHAPE(n), 0, 0, 0));
      float *rw = malloc((size_t)n * 3 * sizeof(float)), *r1 = rw + n, *r2 = rw + 2 * n;
      for (int64_t i = 0; i < n; i++) {
        w[i] = adam_bits_value(i, 0);
        g[i] = adam_bits_value(i, 1);
        m1[i] = adam_bits_value(i, 2);
        m2[i] = fabsf(adam_bits_value(i, 3));
        if (i % 97 == 5) m2[i] = -0.5f; /* set by hand: not reachable by training */
      }
      ph_set_f32(s, "lr", PE_SHAPE(1), (float[]){0.01f});
      ph_set_f32(s, "b1p", PE_SHAPE(1), (float[]){0.729f});
      ph_set_f32(s, "b2p", PE_SHAPE(1), (float[]){0.997003f});
      pe_op_desc *op = adam_op();
      const float c = 0.02f;
      if (mth) set_l2(op, methods[mth], c);
      /* The scalar reference, as optimizer.c computes it. */
      const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = mth == 1 ? c : 0.0f;
      double lr = 0.01f, b1pow = 0.729f, b2pow = 0.997003f;
      float lr_t = (float)(lr * sqrt(1.0 - b2pow) / (1.0 - b1pow));
      float keep = (float)(1.0 - lr * (mth == 2 ? c : 0.0f));
      for (int64_t i = 0; i < n; i++) {
        float pi = w[i], gi = wd != 0.0f ? g[i] + wd * pi : g[i];
        r1[i] = b1 * m1[i] + (1.0f - b1) * gi;
        r2[i] = b2 * m2[i] + (1.0f - b2) * gi * gi;
        rw[i] = pi * keep - lr_t * r1[i] / (sqrtf(r2[i]) + eps);
      }
      PE_CK_OK(ph_run_op(s, op, NULL));
      const char *vars[] = {"w", "m1", "m2"};
      const float *want[] = {rw, r1, r2};
      for (int v = 0; v < 3; v++) {
        const float *got = pe_f32(ph_get(s, vars[v]));
        for (int64_t i = 0; i < n; i++) {
          uint32_t a, b;
          memcpy(&a, &got[i], 4);
          memcpy(&b, &want[v][i], 4);
          ck_assert_msg(a == b, "'%s' n %lld: %s[%lld] = %a (0x%08x), scalar sqrtf %a (0x%08x)",
                        methods[mth], (long long)n, vars[v], (long long)i, got[i], a, want[v][i],
                        b);
        }
      }
      free(rw);
      pe_op_desc_free(op);
      pe_scope_free(s);
    }
  }
}
END_TEST

static Suite *optimizer_suite(void) {
  Suite *s = suite_create("ops_optimizer");
  TCase *tc = tcase_create("optimizer");
  tcase_add_test(tc, sgd_two_steps);
  tcase_add_test(tc, momentum_two_steps);
  tcase_add_test(tc, momentum_nesterov_two_steps);
  tcase_add_test(tc, adam_two_steps);
  tcase_add_test(tc, large_in_place_update_matches_reference);
  tcase_add_test(tc, momentum_l2_decay_two_steps);
  tcase_add_test(tc, adamw_two_steps);
  tcase_add_test(tc, adam_vector_loop_matches_scalar_sqrtf_bits);
  tcase_add_loop_test(tc, l2_decay_is_the_gradient_plus_coeff_times_param, 0, 3);
  tcase_add_test(tc, inference_errors);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(optimizer_suite)
