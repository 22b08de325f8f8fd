/* scaled_dot_product_attention and the masked softmax ops
 * (fused_softmax_mask, fused_softmax_mask_upper_triangle): values against
 * a double-precision reference (broadcast masks of rank 2 and 4, the
 * causal triangle, Tq != Tk, an explicit scale), the attention op against
 * its composition (matmul_v2, scale, elementwise_add, softmax, matmul_v2)
 * on the same inputs, numeric gradients of Q, K, V and of X (through Out
 * and through the Softmax output), a pruned Out@GRAD, infer errors naming
 * the op, the variables and their shapes.
 *
 * Tolerances: inputs in [-1, 1], D <= 8: scores below 8 in size; the f32
 * softmax and products carry relative errors of a few 1e-7, so 1e-5 on
 * values below 1 (probabilities, sums of at most 7 of them times |v| <= 1)
 * is wide; the causal triangle is exp(-inf) = 0 against oneDNN's flush of
 * exp below ln(FLT_MIN): 1e-30 at most. Against the composition the two
 * differ only in where the scale is applied (the matmul's output scale
 * against a scale op): 1e-5. Gradients: central differences (eps 1e-3) of
 * a smooth function: 1e-2, as the other op suites. */
#include <check.h>
#include <math.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

/* Mask element for score (b, h, i, j) of a mask shaped ms, aligned right. */
static double mask_at(const float *m, pe_shape ms, const int64_t idx[4]) {
  int64_t off = 0;
  for (int d = 0; d < ms.ndim; d++) {
    int64_t i = idx[4 - ms.ndim + d];
    off = off * ms.d[d] + (ms.d[d] == 1 ? 0 : i);
  }
  return m[off];
}

/* Reference attention: P [B,H,Tq,Tk] and Out [B,H,Tq,Dv]. */
static void ref_attention(const float *q, const float *k, const float *v, const float *m,
                          pe_shape ms, bool causal, double scale, int64_t bh_b, int64_t bh_h,
                          int64_t tq, int64_t tk, int64_t d, int64_t dv, float *p, float *out) {
  double s[64];
  for (int64_t b = 0; b < bh_b; b++)
    for (int64_t h = 0; h < bh_h; h++)
      for (int64_t i = 0; i < tq; i++) {
        int64_t bh = b * bh_h + h;
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < tk; j++) {
          double acc = 0;
          for (int64_t e = 0; e < d; e++)
            acc += (double)q[(bh * tq + i) * d + e] * k[(bh * tk + j) * d + e];
          s[j] = scale * acc + (m ? mask_at(m, ms, (int64_t[]){b, h, i, j}) : 0);
          if (causal && j > i) s[j] = -INFINITY;
          mx = fmax(mx, s[j]);
        }
        for (int64_t j = 0; j < tk; j++) sum += (s[j] = exp(s[j] - mx));
        for (int64_t j = 0; j < tk; j++) p[(bh * tq + i) * tk + j] = (float)(s[j] / sum);
        for (int64_t e = 0; e < dv; e++) {
          double acc = 0;
          for (int64_t j = 0; j < tk; j++) acc += s[j] / sum * v[(bh * tk + j) * dv + e];
          out[(bh * tq + i) * dv + e] = (float)acc;
        }
      }
}

static pe_op_desc *sdpa_op(bool mask, bool causal, float scale) {
  pe_op_desc *op = mask ? ph_op("scaled_dot_product_attention", "Q", "q", "K", "k", "V", "v",
                                "Mask", "m", NULL, "Out", "out", "Softmax", "p", NULL)
                        : ph_op("scaled_dot_product_attention", "Q", "q", "K", "k", "V", "v", NULL,
                                "Out", "out", "Softmax", "p", NULL);
  PE_CK_OK(pe_op_set_bool(op, "causal", causal));
  PE_CK_OK(pe_op_set_float(op, "scale", scale));
  return op;
}

/* One case: shapes, mask shape (ndim 0: none), causal, scale attr. */
static void check_sdpa(int64_t b, int64_t h, int64_t tq, int64_t tk, int64_t d, int64_t dv,
                       pe_shape ms, bool causal, float scale_attr) {
  pe_scope *s = pe_scope_new(NULL);
  pe_tensor *q = ph_set_uniform(s, "q", PE_SHAPE(b, h, tq, d), -1, 1, 1);
  pe_tensor *k = ph_set_uniform(s, "k", PE_SHAPE(b, h, tk, d), -1, 1, 2);
  pe_tensor *v = ph_set_uniform(s, "v", PE_SHAPE(b, h, tk, dv), -1, 1, 3);
  pe_tensor *m = ms.ndim ? ph_set_uniform(s, "m", ms, -2, 0, 4) : NULL;
  pe_op_desc *op = sdpa_op(m != NULL, causal, scale_attr);
  PE_CK_OK(ph_run_op(s, op, NULL));
  float p[2 * 3 * 7 * 7], out[2 * 3 * 7 * 8];
  double scale = scale_attr > 0 ? scale_attr : 1 / sqrt((double)d);
  ref_attention(pe_f32(q), pe_f32(k), pe_f32(v), m ? pe_f32(m) : NULL, ms, causal, scale, b, h, tq,
                tk, d, dv, p, out);
  expect_f32(s, "p", PE_SHAPE(b, h, tq, tk), p, 1e-5);
  expect_f32(s, "out", PE_SHAPE(b, h, tq, dv), out, 1e-5);
  const char *outs[] = {"out"}, *outs2[] = {"out", "p"}, *wrt[] = {"q", "k", "v"};
  int n = (int)(b * h * (tq * d + tk * d + tk * dv));
  ck_assert_int_eq(expect_grad(s, op, outs, 1, wrt, 3, 1e-3, 400, 1e-2).checked, n);
  ck_assert_int_eq(expect_grad(s, op, outs2, 2, wrt, 3, 1e-3, 400, 1e-2).checked, n);
  pe_op_desc_free(op);
  pe_scope_free(s);
}

START_TEST(sdpa_values_and_grads) {
  check_sdpa(2, 3, 5, 7, 4, 6, (pe_shape){0}, false, 0);
  check_sdpa(2, 3, 5, 7, 4, 6, PE_SHAPE(2, 1, 5, 7), false, 0.7f);
  check_sdpa(2, 3, 5, 7, 4, 6, PE_SHAPE(5, 7), false, 0);
  check_sdpa(1, 2, 6, 6, 8, 3, (pe_shape){0}, true, 0);
  check_sdpa(2, 1, 6, 6, 4, 4, PE_SHAPE(2, 1, 1, 6), true, 0);
}
END_TEST

/* The composition the builder made before the fused op existed. */
static void run_composition(pe_scope *s, float scale, bool mask) {
  pe_op_desc *op = ph_op("matmul_v2", "X", "q", "Y", "k", NULL, "Out", "c_s", NULL);
  PE_CK_OK(pe_op_set_bool(op, "trans_y", true));
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_op_desc_free(op);
  op = ph_op("scale", "X", "c_s", NULL, "Out", "c_sc", NULL);
  PE_CK_OK(pe_op_set_float(op, "scale", scale));
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_op_desc_free(op);
  const char *logits = "c_sc";
  if (mask) {
    op = ph_op("elementwise_add", "X", "c_sc", "Y", "m", NULL, "Out", "c_ms", NULL);
    PE_CK_OK(pe_op_set_int(op, "axis", -1));
    PE_CK_OK(ph_run_op(s, op, NULL));
    pe_op_desc_free(op);
    logits = "c_ms";
  }
  op = ph_op("softmax", "X", logits, NULL, "Out", "c_p", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_op_desc_free(op);
  op = ph_op("matmul_v2", "X", "c_p", "Y", "v", NULL, "Out", "c_out", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_op_desc_free(op);
}

START_TEST(sdpa_equals_composition) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "q", PE_SHAPE(2, 4, 16, 8), -1, 1, 11);
  ph_set_uniform(s, "k", PE_SHAPE(2, 4, 16, 8), -1, 1, 12);
  ph_set_uniform(s, "v", PE_SHAPE(2, 4, 16, 8), -1, 1, 13);
  /* a causal mask as pe_builder_causal_mask makes it */
  float mk[16 * 16];
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) mk[i * 16 + j] = j > i ? -1e9f : 0;
  ph_set_f32(s, "m", PE_SHAPE(1, 1, 16, 16), mk);
  for (int variant = 0; variant < 2; variant++) {
    /* the mask tensor, then the causal flag alone */
    pe_op_desc *op = sdpa_op(variant == 0, variant == 1, 0);
    PE_CK_OK(ph_run_op(s, op, NULL));
    pe_op_desc_free(op);
    run_composition(s, 1 / sqrtf(8), true);
    pe_tensor *a = ph_get(s, "out"), *c = ph_get(s, "c_out");
    pe_tensor *pa = ph_get(s, "p"), *pc = ph_get(s, "c_p");
    expect_shape(&a->shape, c->shape);
    for (int64_t i = 0; i < pe_tensor_numel(a); i++)
      ck_assert_msg(fabsf(pe_f32(a)[i] - pe_f32(c)[i]) <= 1e-5f, "out[%lld] %g vs %g", (long long)i,
                    pe_f32(a)[i], pe_f32(c)[i]);
    for (int64_t i = 0; i < pe_tensor_numel(pa); i++)
      ck_assert_msg(fabsf(pe_f32(pa)[i] - pe_f32(pc)[i]) <= 1e-5f, "p[%lld] %g vs %g", (long long)i,
                    pe_f32(pa)[i], pe_f32(pc)[i]);
  }
  pe_scope_free(s);
}
END_TEST

START_TEST(sdpa_grad_without_dout_is_zero) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "q", PE_SHAPE(1, 1, 2, 2), -1, 1, 1);
  ph_set_uniform(s, "k", PE_SHAPE(1, 1, 2, 2), -1, 1, 2);
  ph_set_uniform(s, "v", PE_SHAPE(1, 1, 2, 2), -1, 1, 3);
  ph_set_uniform(s, "p", PE_SHAPE(1, 1, 2, 2), 0, 1, 4);
  for (int i = 0; i < 3; i++)
    ph_set_f32(s, (const char *[]){"dq", "dk", "dv"}[i], PE_SHAPE(1, 1, 2, 2),
               (float[]){5, 5, 5, 5});
  pe_op_desc *op =
      ph_op("scaled_dot_product_attention_grad", "Q", "q", "K", "k", "V", "v", "Softmax", "p", NULL,
            "Q@GRAD", "dq", "K@GRAD", "dk", "V@GRAD", "dv", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "dq", PE_SHAPE(1, 1, 2, 2), (float[4]){0}, 0);
  expect_f32(s, "dk", PE_SHAPE(1, 1, 2, 2), (float[4]){0}, 0);
  expect_f32(s, "dv", PE_SHAPE(1, 1, 2, 2), (float[4]){0}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(sdpa_bad_inputs_are_errors) {
  pe_scope *s = pe_scope_new(NULL);
  pe_meta m[2];
  ph_set_meta(s, "q", PE_F32, PE_SHAPE(-1, 4, 16, 8));
  ph_set_meta(s, "k", PE_F32, PE_SHAPE(-1, 4, 16, 8));
  ph_set_meta(s, "v", PE_F32, PE_SHAPE(-1, 16, 32));
  pe_op_desc *op = sdpa_op(false, false, 0);
  expect_errors(ph_infer_op(s, op, m, 2), PE_ESHAPE, "op #0 (scaled_dot_product_attention)",
                "V 'v' [-1,16,32]", "Q 'q' [-1,4,16,8]", NULL);
  ph_set_meta(s, "v", PE_F32, PE_SHAPE(-1, 4, 16, 8));
  ph_set_meta(s, "k", PE_F32, PE_SHAPE(-1, 4, 16, 4));
  expect_errors(ph_infer_op(s, op, m, 2), PE_ESHAPE, "K 'k' [-1,4,16,4]", NULL);
  ph_set_meta(s, "k", PE_F32, PE_SHAPE(-1, 4, 16, 8));
  PE_CK_OK(ph_infer_op(s, op, m, 2));
  expect_shape(&m[1].shape, PE_SHAPE(-1, 4, 16, 16));
  pe_op_desc_free(op);
  ph_set_meta(s, "m", PE_F32, PE_SHAPE(4, 16, 15));
  op = sdpa_op(true, false, 0);
  expect_errors(ph_infer_op(s, op, m, 2), PE_ESHAPE,
                "input Mask 'm' shape [4,16,15] does not broadcast to the scores [-1,4,16,16]",
                NULL);
  ph_set_meta(s, "m", PE_I64, PE_SHAPE(16, 16));
  expect_errors(ph_infer_op(s, op, m, 2), PE_EDTYPE, "'m'", NULL);
  pe_op_desc_free(op);
  op = sdpa_op(false, false, -1);
  expect_errors(ph_infer_op(s, op, m, 2), PE_EATTR, "scale -1", NULL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* --- fused_softmax_mask, fused_softmax_mask_upper_triangle ---------------------- */

static void ref_softmax_rows(const float *x, const float *m, pe_shape ms, bool causal, int64_t b,
                             int64_t h, int64_t q, int64_t k, float *out) {
  for (int64_t bb = 0; bb < b; bb++)
    for (int64_t hh = 0; hh < h; hh++)
      for (int64_t i = 0; i < q; i++) {
        const float *row = x + ((bb * h + hh) * q + i) * k;
        double z[16], mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < k; j++) {
          z[j] = row[j] + (m ? mask_at(m, ms, (int64_t[]){bb, hh, i, j}) : 0);
          if (causal && j > i) z[j] = -INFINITY;
          mx = fmax(mx, z[j]);
        }
        for (int64_t j = 0; j < k; j++) sum += (z[j] = exp(z[j] - mx));
        for (int64_t j = 0; j < k; j++) out[((bb * h + hh) * q + i) * k + j] = (float)(z[j] / sum);
      }
}

START_TEST(softmax_mask_values_and_grads) {
  pe_scope *s = pe_scope_new(NULL);
  pe_tensor *x = ph_set_uniform(s, "x", PE_SHAPE(2, 3, 4, 5), -2, 2, 21);
  const char *outs[] = {"out"}, *wrt[] = {"x"};
  float want[120];
  const pe_shape masks[] = {PE_SHAPE(2, 1, 4, 5), PE_SHAPE(4, 5), PE_SHAPE(2, 3, 1, 1)};
  for (int c = 0; c < 3; c++) {
    pe_tensor *m = ph_set_uniform(s, "m", masks[c], -3, 0, 22 + (uint64_t)c);
    pe_op_desc *op = ph_op("fused_softmax_mask", "X", "x", "Mask", "m", NULL, "Out", "out", NULL);
    PE_CK_OK(ph_run_op(s, op, NULL));
    ref_softmax_rows(pe_f32(x), pe_f32(m), masks[c], false, 2, 3, 4, 5, want);
    expect_f32(s, "out", PE_SHAPE(2, 3, 4, 5), want, 1e-6);
    ck_assert_int_eq(expect_grad(s, op, outs, 1, wrt, 1, 1e-3, 120, 1e-2).checked, 120);
    pe_op_desc_free(op);
  }
  /* the triangle, Q < K and Q > K as well */
  const pe_shape xs[] = {PE_SHAPE(2, 3, 4, 5), PE_SHAPE(1, 2, 5, 3), PE_SHAPE(6, 6)};
  for (int c = 0; c < 3; c++) {
    x = ph_set_uniform(s, "x", xs[c], -2, 2, 30 + (uint64_t)c);
    pe_op_desc *op = ph_op("fused_softmax_mask_upper_triangle", "X", "x", NULL, "Out", "out", NULL);
    PE_CK_OK(ph_run_op(s, op, NULL));
    int nd = xs[c].ndim;
    int64_t q = xs[c].d[nd - 2], k = xs[c].d[nd - 1], bh = pe_shape_numel(&xs[c]) / (q * k);
    ref_softmax_rows(pe_f32(x), NULL, (pe_shape){0}, true, bh, 1, q, k, want);
    expect_f32(s, "out", xs[c], want, 1e-6);
    ck_assert_int_eq(expect_grad(s, op, outs, 1, wrt, 1, 1e-3, 120, 1e-2).checked,
                     (int)pe_shape_numel(&xs[c]));
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

START_TEST(softmax_mask_bad_inputs_are_errors) {
  pe_scope *s = pe_scope_new(NULL);
  pe_meta m[1];
  ph_set_meta(s, "x", PE_F32, PE_SHAPE(-1, 4, 8, 8));
  ph_set_meta(s, "m", PE_F32, PE_SHAPE(-1, 1, 8, 7));
  pe_op_desc *op = ph_op("fused_softmax_mask", "X", "x", "Mask", "m", NULL, "Out", "out", NULL);
  expect_errors(ph_infer_op(s, op, m, 1), PE_ESHAPE, "op #0 (fused_softmax_mask)",
                "input Mask 'm' shape [-1,1,8,7] does not broadcast to X 'x' shape [-1,4,8,8]",
                NULL);
  ph_set_meta(s, "m", PE_F32, PE_SHAPE(2, 2, 4, 8, 8));
  expect_errors(ph_infer_op(s, op, m, 1), PE_ESHAPE, "[2,2,4,8,8]", NULL);
  ph_set_meta(s, "m", PE_F32, PE_SHAPE(1, 1, 8, 8));
  PE_CK_OK(ph_infer_op(s, op, m, 1));
  expect_shape(&m[0].shape, PE_SHAPE(-1, 4, 8, 8));
  ph_set_meta(s, "x", PE_I64, PE_SHAPE(-1, 4, 8, 8));
  expect_errors(ph_infer_op(s, op, m, 1), PE_EDTYPE, "'x'", NULL);
  pe_op_desc_free(op);
  ph_set_meta(s, "x", PE_F32, PE_SHAPE(8));
  op = ph_op("fused_softmax_mask_upper_triangle", "X", "x", NULL, "Out", "out", NULL);
  expect_errors(ph_infer_op(s, op, m, 1), PE_ESHAPE, "op #0 (fused_softmax_mask_upper_triangle)",
                "X 'x' shape [8] has rank 1", NULL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *attention_suite(void) {
  Suite *s = suite_create("ops_attention");
  TCase *tc = tcase_create("attention");
  tcase_add_test(tc, sdpa_values_and_grads);
  tcase_add_test(tc, sdpa_equals_composition);
  tcase_add_test(tc, sdpa_grad_without_dout_is_zero);
  tcase_add_test(tc, sdpa_bad_inputs_are_errors);
  tcase_add_test(tc, softmax_mask_values_and_grads);
  tcase_add_test(tc, softmax_mask_bad_inputs_are_errors);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(attention_suite)
