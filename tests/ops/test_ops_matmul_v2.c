/* matmul_v2: values against a double-precision reference for every
 * trans_x / trans_y pair, batched and broadcast batch dims and 1-D
 * operands (numpy's matmul rules); numeric gradients of X and Y in the
 * same cases (broadcast operands sum their gradient over the batch); a
 * pruned Out@GRAD; infer errors naming the op, the variables, their shapes
 * and the trans flags.
 *
 * Tolerances: oneDNN sums K <= 6 products of values in [-1, 1] in f32;
 * 1e-5 is wide. Gradients: central differences in f32 (eps 1e-2) of a
 * bilinear function are exact up to rounding; 1e-2 is wide. */
#include <check.h>
#include <stdlib.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

static pe_op_desc *mv_op(bool tx, bool ty) {
  pe_op_desc *op = ph_op("matmul_v2", "X", "x", "Y", "y", NULL, "Out", "out", NULL);
  PE_CK_OK(pe_op_set_bool(op, "trans_x", tx));
  PE_CK_OK(pe_op_set_bool(op, "trans_y", ty));
  return op;
}

/* Element (batch index b of rank nb, row i, col j) of a matrix operand of
 * shape s read as op(s) (t: transposed); a 1-D s is a row (row 1) or a
 * column (col 1) vector, per `col`. */
static double ref_at(const float *v, const pe_shape *s, int nb, const int64_t *b, int64_t i,
                     int64_t j, bool t, bool col) {
  if (s->ndim == 1) return v[col ? i : j];
  int sb = s->ndim - 2;
  int64_t off = 0;
  for (int d = 0; d < sb; d++) {
    int64_t bi = b[nb - sb + d];
    off = off * s->d[d] + (s->d[d] == 1 ? 0 : bi);
  }
  int64_t r = s->d[sb], c = s->d[sb + 1];
  off *= r * c;
  return t ? v[off + j * c + i] : v[off + i * c + j];
}

/* Out = op(X) · op(Y) by index arithmetic: out has shape os (batch dims
 * first), the product is [m, k] · [k, n]. */
static void ref_matmul(const float *x, pe_shape xs, const float *y, pe_shape ys, bool tx, bool ty,
                       const int64_t *ob, int nb, int64_t m, int64_t k, int64_t n, float *out) {
  int64_t nbat = 1;
  for (int d = 0; d < nb; d++) nbat *= ob[d];
  for (int64_t bb = 0; bb < nbat; bb++) {
    int64_t b[PE_MAX_DIMS], rest = bb;
    for (int d = nb - 1; d >= 0; d--) b[d] = rest % ob[d], rest /= ob[d];
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double acc = 0;
        for (int64_t q = 0; q < k; q++)
          acc += ref_at(x, &xs, nb, b, i, q, tx && xs.ndim > 1, false) *
                 ref_at(y, &ys, nb, b, q, j, ty && ys.ndim > 1, true);
        out[(bb * m + i) * n + j] = (float)acc;
      }
  }
}

typedef struct mv_case {
  pe_shape xs, ys, os;
  bool tx, ty;
  int nb;
  int64_t ob[4], m, k, n;
} mv_case;

static const mv_case cases[] = {
    {{2, {3, 4}}, {2, {4, 5}}, {2, {3, 5}}, false, false, 0, {0}, 3, 4, 5},
    {{2, {4, 3}}, {2, {4, 5}}, {2, {3, 5}}, true, false, 0, {0}, 3, 4, 5},
    {{2, {3, 4}}, {2, {5, 4}}, {2, {3, 5}}, false, true, 0, {0}, 3, 4, 5},
    {{2, {4, 3}}, {2, {5, 4}}, {2, {3, 5}}, true, true, 0, {0}, 3, 4, 5},
    {{3, {2, 3, 4}}, {3, {2, 4, 5}}, {3, {2, 3, 5}}, false, false, 1, {2}, 3, 4, 5},
    /* attention's scores: [B, H, T, D] · [B, H, T, D]ᵀ */
    {{4, {2, 2, 3, 4}}, {4, {2, 2, 3, 4}}, {4, {2, 2, 3, 3}}, false, true, 2, {2, 2}, 3, 4, 3},
    /* broadcast: X [2,1,3,4] with Y [3,4,5] -> [2,3,3,5] */
    {{4, {2, 1, 3, 4}}, {3, {3, 4, 5}}, {4, {2, 3, 3, 5}}, false, false, 2, {2, 3}, 3, 4, 5},
    {{3, {1, 4, 3}}, {3, {2, 5, 4}}, {3, {2, 3, 5}}, true, true, 1, {2}, 3, 4, 5},
    /* 1-D operands: the row / column dims are dropped */
    {{1, {4}}, {3, {2, 4, 5}}, {2, {2, 5}}, true, false, 1, {2}, 1, 4, 5},
    {{3, {2, 3, 4}}, {1, {4}}, {2, {2, 3}}, false, true, 1, {2}, 3, 4, 1},
    {{1, {4}}, {1, {4}}, {1, {1}}, false, false, 0, {0}, 1, 4, 1},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

START_TEST(values_match_reference) {
  const mv_case *t = &cases[_i];
  pe_scope *s = pe_scope_new(NULL);
  pe_tensor *x = ph_set_uniform(s, "x", t->xs, -1, 1, 21 + (uint64_t)_i);
  pe_tensor *y = ph_set_uniform(s, "y", t->ys, -1, 1, 41 + (uint64_t)_i);
  pe_op_desc *op = mv_op(t->tx, t->ty);
  PE_CK_OK(ph_run_op(s, op, NULL));
  int64_t n = pe_shape_numel(&t->os);
  float *want = malloc((size_t)n * sizeof(float));
  ref_matmul(pe_f32(x), t->xs, pe_f32(y), t->ys, t->tx, t->ty, t->ob, t->nb, t->m, t->k, t->n,
             want);
  expect_f32(s, "out", t->os, want, 1e-5);
  free(want);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(grads_match_numeric) {
  const mv_case *t = &cases[_i];
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", t->xs, -1, 1, 61 + (uint64_t)_i);
  ph_set_uniform(s, "y", t->ys, -1, 1, 81 + (uint64_t)_i);
  pe_op_desc *op = mv_op(t->tx, t->ty);
  const char *outs[] = {"out"}, *wrt[] = {"x", "y"};
  ph_grad_report r = expect_grad(s, op, outs, 1, wrt, 2, 1e-2, 64, 1e-2);
  int64_t nx = pe_shape_numel(&t->xs), ny = pe_shape_numel(&t->ys);
  ck_assert_int_eq(r.checked, (nx < 64 ? nx : 64) + (ny < 64 ? ny : 64));
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* The same op instance on two batch sizes (the primitive cache is keyed by
 * both shapes): the second product is right, not the first one's. */
START_TEST(shapes_change_between_runs) {
  pe_scope *s = pe_scope_new(NULL);
  pe_op_desc *op = mv_op(false, true);
  ph_op_inst *inst = ph_op_inst_new(op, NULL);
  for (int b = 1; b <= 3; b += 2) {
    pe_tensor *x = ph_set_uniform(s, "x", PE_SHAPE(b, 2, 3), -1, 1, 7);
    pe_tensor *y = ph_set_uniform(s, "y", PE_SHAPE(4, 3), -1, 1, 8);
    PE_CK_OK(ph_op_inst_run(inst, s, NULL));
    float want[24];
    ref_matmul(pe_f32(x), PE_SHAPE(b, 2, 3), pe_f32(y), PE_SHAPE(4, 3), false, true, (int64_t[]){b},
               1, 2, 3, 4, want);
    expect_f32(s, "out", PE_SHAPE(b, 2, 4), want, 1e-5);
  }
  ph_op_inst_free(inst);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(grad_without_dout_is_zero) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(1, 2), (float[]){1, 2});
  ph_set_f32(s, "y", PE_SHAPE(2, 1), (float[]){3, 4});
  ph_set_f32(s, "dx", PE_SHAPE(1, 2), (float[]){5, 5});
  pe_op_desc *op = ph_op("matmul_v2_grad", "X", "x", "Y", "y", NULL, "X@GRAD", "dx", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  expect_f32(s, "dx", PE_SHAPE(1, 2), (float[2]){0}, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(bad_shapes_are_errors) {
  pe_scope *s = pe_scope_new(NULL);
  pe_meta m[1];
  ph_set_meta(s, "x", PE_F32, PE_SHAPE(-1, 3, 4));
  ph_set_meta(s, "y", PE_F32, PE_SHAPE(5, 4));
  pe_op_desc *op = mv_op(false, false);
  expect_errors(ph_infer_op(s, op, m, 1), PE_ESHAPE, "op #0 (matmul_v2)",
                "X 'x' shape [-1,3,4] and Y 'y' shape [5,4] (trans_x false, trans_y false)",
                "contraction dims differ", NULL);
  pe_op_desc_free(op);
  op = mv_op(false, true); /* [-1,3,4] · [5,4]ᵀ */
  PE_CK_OK(ph_infer_op(s, op, m, 1));
  expect_shape(&m[0].shape, PE_SHAPE(-1, 3, 5));
  pe_op_desc_free(op);
  ph_set_meta(s, "y", PE_F32, PE_SHAPE(3, 4, 5));
  ph_set_meta(s, "x", PE_F32, PE_SHAPE(2, 3, 4));
  op = mv_op(false, false);
  expect_errors(ph_infer_op(s, op, m, 1), PE_ESHAPE, "X 'x' shape [2,3,4] and Y 'y' shape [3,4,5]",
                "batch dims do not broadcast", NULL);
  pe_op_desc_free(op);
  ph_set_meta(s, "y", PE_I64, PE_SHAPE(4, 5));
  op = mv_op(false, false);
  expect_errors(ph_infer_op(s, op, m, 1), PE_EDTYPE, "op #0 (matmul_v2)", "'y'", NULL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *matmul_v2_suite(void) {
  Suite *s = suite_create("ops_matmul_v2");
  TCase *tc = tcase_create("matmul_v2");
  tcase_add_loop_test(tc, values_match_reference, 0, N_CASES);
  tcase_add_loop_test(tc, grads_match_numeric, 0, N_CASES);
  tcase_add_test(tc, shapes_change_between_runs);
  tcase_add_test(tc, grad_without_dout_is_zero);
  tcase_add_test(tc, bad_shapes_are_errors);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(matmul_v2_suite)
