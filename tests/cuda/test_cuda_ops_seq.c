/* The CUDA kernels of the sequence-model ops (layer_norm, gelu, abs,
 * square, lookup_table_v2, transpose2, concat, split, slice, matmul_v2,
 * huber_loss, sigmoid_cross_entropy_with_logits, smooth_l1_loss, cast,
 * tril_triu, position_ids, fused_softmax_mask and its upper-triangle form,
 * scaled_dot_product_attention) against their CPU kernels, forward and
 * gradient, on the same inputs (cuda_compare.h: compare() runs one op on
 * both, compare_grads() the forward and then every gradient op with random
 * output gradients).
 *
 * Tolerances (relative, denominator max(1, |cpu|)), per kind of kernel:
 *   0     data movement (transpose, concat, split, slice, tril_triu,
 *         cast, the embedding lookup, position_ids) and the embedding's
 *         dense gradient, whose rows are summed in the CPU's order: the
 *         same bits;
 *   1e-6  abs, square and huber_loss: the same f32 operations in the same
 *         order, at most an ulp apart where nvcc contracts a multiply-add;
 *   1e-5  gelu and sigmoid cross-entropy: the device's erff / tanhf / expf
 *         / log1pf and oneDNN's or glibc's differ by a few ulp, and the
 *         gradients compose a few of them; smooth_l1_loss, whose Out sums
 *         a row of at most 40 non-negative terms in double where the CPU
 *         adds them in f32 (at most 39 roundings of 2^-24 each: 2.4e-6);
 *         the masked softmax, whose probabilities (at most 1) differ by
 *         the expf of each side and a sum of at most 16 terms in another
 *         order, and whose gradient's row dot product has as few;
 *   1e-4  layer_norm, matmul_v2 and attention: sums over up to a few
 *         hundred elements in another order than oneDNN's (about 1e-7
 *         relative per add), as test_cuda_kernels' reductions; attention
 *         chains its GEMMs and the softmax, each of the size above; a
 *         wrong index or formula is off by O(1).
 *
 * Skipped without a GPU. */
#include <stdio.h>

#ifndef PE_HAVE_CUDA
int main(void) {
  printf("skip: built without the CUDA backend\n");
  return 77;
}
#else

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/scope.h"
#include "cuda_compare.h"
#include "cuda_test_main.h"

#define EXACT 0.0
#define ULP 1e-6
#define LIBM 1e-5
#define SUMS 1e-4

/* Scope var `name` of dtype dt and shape, element i = v(i) converted. */
static void set_typed(pe_scope *s, const char *name, pe_dtype dt, pe_shape shape,
                      double (*v)(int64_t)) {
  pe_var *var;
  PE_CK_OK(pe_scope_var(s, name, &var));
  PE_CK_OK(pe_tensor_resize(&var->t, dt, &shape, name));
  for (int64_t i = 0, n = pe_tensor_numel(&var->t); i < n; i++) {
    double x = v(i);
    switch (dt) {
      case PE_F32: pe_f32(&var->t)[i] = (float)x; break;
      case PE_F64: ((double *)var->t.data)[i] = x; break;
      case PE_I32: ((int32_t *)var->t.data)[i] = (int32_t)x; break;
      case PE_I64: pe_i64(&var->t)[i] = (int64_t)x; break;
      default: ((uint8_t *)var->t.data)[i] = (uint8_t)x; break;
    }
  }
}

/* Values that every dtype holds exactly: integers in [0, 250). */
static double small_ints(int64_t i) {
  return (double)((i * 37) % 250);
}

/* Signed values with fractions, in [-120, 120). */
static double fractions(int64_t i) {
  return (double)((i * 53) % 240) - 120.0 + 0.25 * (double)(i % 4);
}

/* --- pointwise: gelu, abs, square ------------------------------------------------ */

START_TEST(gelu_both_forms) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(7, 33, 17), -6, 6, 101);
  for (int approximate = 0; approximate < 2; approximate++) {
    pe_op_desc *op = op1("gelu", "x", "y");
    PE_CK_OK(pe_op_set_bool(op, "approximate", approximate));
    compare_grads(s, op, LIBM);
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

START_TEST(abs_and_square) {
  pe_scope *s = pe_scope_new(NULL);
  pe_tensor *x = ph_set_uniform(s, "x", PE_SHAPE(19, 41), -3, 3, 102);
  /* abs's gradient is 0 at 0, as oneDNN's. */
  for (int i = 0; i < 19 * 41; i += 7) pe_f32(x)[i] = 0.0f;
  const char *types[] = {"abs", "square"};
  for (int t = 0; t < 2; t++) {
    pe_op_desc *op = op1(types[t], "x", "y");
    compare_grads(s, op, ULP);
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

/* --- layer_norm ------------------------------------------------------------------ */

START_TEST(layer_norm_rows) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(6, 10, 48), -2, 3, 103);
  ph_set_uniform(s, "scale", PE_SHAPE(48), 0.5f, 1.5f, 104);
  ph_set_uniform(s, "bias", PE_SHAPE(48), -1, 1, 105);
  /* Over the last dim (a transformer's), with Scale and Bias. */
  pe_op_desc *op = ph_op("layer_norm", "X", "x", "Scale", "scale", "Bias", "bias", NULL, "Y", "y",
                         "Mean", "mu", "Variance", "var", NULL);
  PE_CK_OK(pe_op_set_int(op, "begin_norm_axis", 2));
  compare_grads(s, op, SUMS);
  pe_op_desc_free(op);
  /* Over the last two dims (480 elements a row), without them, and more
   * rows than the column sums' parts (70 > 64). */
  ph_set_uniform(s, "x2", PE_SHAPE(70, 10, 48), -1, 1, 106);
  op = ph_op("layer_norm", "X", "x2", NULL, "Y", "y2", "Mean", "mu2", "Variance", "var2", NULL);
  PE_CK_OK(pe_op_set_int(op, "begin_norm_axis", 1));
  PE_CK_OK(pe_op_set_float(op, "epsilon", 1e-3f));
  compare_grads(s, op, SUMS);
  pe_op_desc_free(op);
  /* Scale only, many rows: dscale sums 300 rows. */
  ph_set_uniform(s, "x3", PE_SHAPE(300, 48), -1, 1, 107);
  op = ph_op("layer_norm", "X", "x3", "Scale", "scale", NULL, "Y", "y3", "Mean", "mu3", "Variance",
             "var3", NULL);
  compare_grads(s, op, SUMS);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* --- lookup_table_v2 ------------------------------------------------------------- */

START_TEST(embedding_dense) {
  pe_scope *s = pe_scope_new(NULL);
  enum { V = 50, D = 24, B = 9, T = 13 };
  ph_set_uniform(s, "w", PE_SHAPE(V, D), -1, 1, 108);
  int64_t ids[B * T];
  /* Repeated ids (their gradient rows add up), the padding row, id 0 and
   * the last id. */
  for (int i = 0; i < B * T; i++) ids[i] = (i * 7) % 11 == 3 ? 5 : (i * 13) % V;
  ids[0] = 0;
  ids[1] = V - 1;
  ph_set_i64(s, "ids", PE_SHAPE(B, T), ids);
  for (int pad = 0; pad < 2; pad++) {
    pe_op_desc *op = ph_op("lookup_table_v2", "W", "w", "Ids", "ids", NULL, "Out", "e", NULL);
    if (pad) PE_CK_OK(pe_op_set_long(op, "padding_idx", 5));
    compare_grads(s, op, EXACT);
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

/* --- transpose2, concat, split, slice ------------------------------------------------ */

START_TEST(transpose_any_perm) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(3, 7, 4, 5), -1, 1, 109);
  const int64_t perms[][4] = {{0, 2, 1, 3}, {3, 1, 0, 2}, {0, 1, 3, 2}, {0, 1, 2, 3}};
  for (int p = 0; p < 4; p++) {
    pe_op_desc *op = op1("transpose2", "x", "t");
    PE_CK_OK(pe_op_set_ints(op, "axis", 4, perms[p]));
    compare_grads(s, op, EXACT);
    pe_op_desc_free(op);
  }
  /* Any dtype: 8-byte and 1-byte elements. */
  set_typed(s, "xi", PE_I64, PE_SHAPE(6, 5, 4), small_ints);
  set_typed(s, "xu", PE_U8, PE_SHAPE(6, 5, 4), small_ints);
  const char *xs[] = {"xi", "xu"};
  for (int k = 0; k < 2; k++) {
    pe_op_desc *op = op1("transpose2", xs[k], "ti");
    PE_CK_OK(pe_op_set_ints(op, "axis", 3, (int64_t[]){2, 0, 1}));
    compare(s, op, EXACT);
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

/* split of "w" into three outputs. */
static pe_op_desc *split_op(const char *const *outs) {
  pe_op_desc *op = pe_op_desc_new("split");
  PE_CK_OK(pe_op_input1(op, "X", "w"));
  PE_CK_OK(pe_op_set_output(op, "Out", 3, outs));
  return op;
}

START_TEST(concat_and_split) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "a", PE_SHAPE(4, 3, 6), -1, 1, 110);
  ph_set_uniform(s, "b", PE_SHAPE(4, 5, 6), -1, 1, 111);
  ph_set_uniform(s, "c", PE_SHAPE(4, 1, 6), -1, 1, 112);
  const char *xs[] = {"a", "b", "c"};
  for (int axis = 1; axis >= -2; axis -= 3) { /* 1 and its negative form -2 */
    pe_op_desc *op = pe_op_desc_new("concat");
    PE_CK_OK(pe_op_set_input(op, "X", 3, xs));
    PE_CK_OK(pe_op_output1(op, "Out", "abc"));
    PE_CK_OK(pe_op_set_int(op, "axis", axis));
    compare_grads(s, op, EXACT);
    pe_op_desc_free(op);
  }
  /* split of [4, 9, 6] at axis 1: sections with an inferred -1, and num. */
  ph_set_uniform(s, "w", PE_SHAPE(4, 9, 6), -1, 1, 113);
  const char *outs[] = {"p0", "p1", "p2"};
  pe_op_desc *op = split_op(outs);
  PE_CK_OK(pe_op_set_int(op, "axis", 1));
  PE_CK_OK(pe_op_set_ints(op, "sections", 3, (int64_t[]){2, -1, 3}));
  compare_grads(s, op, EXACT);
  pe_op_desc_free(op);
  op = split_op((const char *[]){"q0", "q1", "q2"});
  PE_CK_OK(pe_op_set_int(op, "axis", -1));
  PE_CK_OK(pe_op_set_int(op, "num", 3));
  compare_grads(s, op, EXACT);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(slice_windows) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(5, 8, 6), -1, 1, 114);
  /* Negative bounds, an end past the dim, a dropped dim of size 1. */
  pe_op_desc *op = ph_op("slice", "Input", "x", NULL, "Out", "y", NULL);
  PE_CK_OK(pe_op_set_ints(op, "axes", 2, (int64_t[]){1, -1}));
  PE_CK_OK(pe_op_set_ints(op, "starts", 2, (int64_t[]){-5, 1}));
  PE_CK_OK(pe_op_set_ints(op, "ends", 2, (int64_t[]){100, -2}));
  compare_grads(s, op, EXACT);
  pe_op_desc_free(op);
  op = ph_op("slice", "Input", "x", NULL, "Out", "y1", NULL);
  PE_CK_OK(pe_op_set_ints(op, "axes", 1, (int64_t[]){0}));
  PE_CK_OK(pe_op_set_ints(op, "starts", 1, (int64_t[]){2}));
  PE_CK_OK(pe_op_set_ints(op, "ends", 1, (int64_t[]){3}));
  PE_CK_OK(pe_op_set_ints(op, "decrease_axis", 1, (int64_t[]){0}));
  compare_grads(s, op, EXACT);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* --- matmul_v2 ------------------------------------------------------------------- */

static void mv_case(pe_scope *s, pe_shape xs, pe_shape ys, bool tx, bool ty, uint64_t seed) {
  ph_set_uniform(s, "mx", xs, -1, 1, seed);
  ph_set_uniform(s, "my", ys, -1, 1, seed + 1);
  pe_op_desc *op = ph_op("matmul_v2", "X", "mx", "Y", "my", NULL, "Out", "mo", NULL);
  PE_CK_OK(pe_op_set_bool(op, "trans_x", tx));
  PE_CK_OK(pe_op_set_bool(op, "trans_y", ty));
  compare_grads(s, op, SUMS);
  pe_op_desc_free(op);
}

START_TEST(matmul_v2_batched) {
  pe_scope *s = pe_scope_new(NULL);
  /* Attention's products: [B, H, S, D] . [B, H, S, D]ᵀ, then . [B, H, S, D]. */
  mv_case(s, PE_SHAPE(2, 3, 9, 8), PE_SHAPE(2, 3, 9, 8), false, true, 120);
  mv_case(s, PE_SHAPE(2, 3, 9, 9), PE_SHAPE(2, 3, 9, 8), false, false, 122);
  /* Every transpose flag on a plain batch. */
  for (int f = 0; f < 4; f++)
    mv_case(s, f & 1 ? PE_SHAPE(4, 11, 7) : PE_SHAPE(4, 7, 11),
            f & 2 ? PE_SHAPE(4, 5, 11) : PE_SHAPE(4, 11, 5), f & 1, f & 2, 124 + 2 * (uint64_t)f);
  /* A weight shared by the batch (Y broadcast whole: one GEMM; its gradient
   * sums the batch), and X broadcast whole. */
  mv_case(s, PE_SHAPE(3, 6, 10), PE_SHAPE(10, 4), false, false, 140);
  mv_case(s, PE_SHAPE(10, 6), PE_SHAPE(3, 10, 4), true, false, 142);
  /* Mixed broadcast ([2, 1] with [1, 4]): a GEMM per outer index. */
  mv_case(s, PE_SHAPE(2, 1, 5, 3), PE_SHAPE(4, 3, 7), false, false, 144);
  mv_case(s, PE_SHAPE(2, 1, 3, 5), PE_SHAPE(1, 4, 7, 3), true, true, 146);
  /* Vectors: [K] . [B, K, N], [B, M, K] . [K], [K] . [K]. */
  mv_case(s, PE_SHAPE(6), PE_SHAPE(3, 6, 4), false, false, 148);
  mv_case(s, PE_SHAPE(3, 5, 6), PE_SHAPE(6), false, true, 150);
  mv_case(s, PE_SHAPE(6), PE_SHAPE(6), false, false, 152);
  pe_scope_free(s);
}
END_TEST

/* --- losses ---------------------------------------------------------------------- */

START_TEST(huber_loss_both_sides_of_delta) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(31, 7), -3, 3, 160);
  ph_set_uniform(s, "y", PE_SHAPE(31, 7), -3, 3, 161);
  const float deltas[] = {1.0f, 0.25f};
  for (int d = 0; d < 2; d++) {
    pe_op_desc *op =
        ph_op("huber_loss", "X", "x", "Y", "y", NULL, "Out", "h", "Residual", "r", NULL);
    PE_CK_OK(pe_op_set_float(op, "delta", deltas[d]));
    compare_grads(s, op, ULP);
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

START_TEST(sigmoid_cross_entropy) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(23, 9), -30, 30, 162); /* large |x|: the stable form */
  pe_tensor *z = ph_set_uniform(s, "z", PE_SHAPE(23, 9), 0, 1, 163);
  for (int i = 0; i < 23 * 9; i += 5) pe_f32(z)[i] = -100.0f; /* ignore_index */
  for (int normalize = 0; normalize < 2; normalize++) {
    pe_op_desc *op =
        ph_op("sigmoid_cross_entropy_with_logits", "X", "x", "Label", "z", NULL, "Out", "l", NULL);
    PE_CK_OK(pe_op_set_bool(op, "normalize", normalize));
    compare_grads(s, op, LIBM);
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

/* --- smooth_l1_loss -------------------------------------------------------------- */

START_TEST(smooth_l1_both_sides_of_beta) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(17, 5, 8), -3, 3, 164);
  ph_set_uniform(s, "y", PE_SHAPE(17, 5, 8), -3, 3, 165);
  /* Positive outside weights: Out's terms stay non-negative (the
   * tolerance's bound). */
  ph_set_uniform(s, "iw", PE_SHAPE(17, 5, 8), -2, 2, 166);
  ph_set_uniform(s, "ow", PE_SHAPE(17, 5, 8), 0.25f, 2, 167);
  /* sigma 1: beta 1; sigma 3: beta 1/9, most |d| on the linear side. */
  const float sigmas[] = {1.0f, 3.0f};
  for (int k = 0; k < 2; k++)
    for (int weighted = 0; weighted < 2; weighted++) {
      pe_op_desc *op = weighted ? ph_op("smooth_l1_loss", "X", "x", "Y", "y", "InsideWeight", "iw",
                                        "OutsideWeight", "ow", NULL, "Diff", "d", "Out", "l", NULL)
                                : ph_op("smooth_l1_loss", "X", "x", "Y", "y", NULL, "Diff", "d",
                                        "Out", "l", NULL);
      PE_CK_OK(pe_op_set_float(op, "sigma", sigmas[k]));
      compare_grads(s, op, LIBM);
      pe_op_desc_free(op);
    }
  /* Without Diff: Out@GRAD alone. */
  pe_op_desc *op = ph_op("smooth_l1_loss", "X", "x", "Y", "y", NULL, "Out", "l2", NULL);
  compare_grads(s, op, LIBM);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* --- position_ids ---------------------------------------------------------------- */

START_TEST(position_ids_along_an_axis) {
  pe_scope *s = pe_scope_new(NULL);
  set_typed(s, "tok", PE_I64, PE_SHAPE(5, 7), small_ints);
  ph_set_uniform(s, "act", PE_SHAPE(3, 4, 6), -1, 1, 168);
  const struct {
    const char *x;
    int axis;
    int64_t start;
  } cases[] = {{"tok", 1, 0}, {"tok", 0, 0}, {"act", 1, 3}, {"act", -1, -2}, {"act", 0, 100}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    pe_op_desc *op = op1("position_ids", cases[i].x, "pos");
    PE_CK_OK(pe_op_set_int(op, "axis", cases[i].axis));
    PE_CK_OK(pe_op_set_long(op, "start", cases[i].start));
    compare(s, op, EXACT);
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

/* --- fused_softmax_mask, fused_softmax_mask_upper_triangle ---------------------------- */

START_TEST(softmax_with_masks) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(2, 3, 9, 11), -4, 4, 170);
  /* Masks of every broadcast: per batch and query (heads broadcast), one
   * row for all, one key row per batch with -inf on padded keys (the
   * second batch's last three), a plain [Q, K] matrix, and the whole. */
  ph_set_uniform(s, "m_b1qk", PE_SHAPE(2, 1, 9, 11), -2, 2, 171);
  ph_set_uniform(s, "m_k", PE_SHAPE(11), -2, 2, 172);
  pe_tensor *pad = ph_set_uniform(s, "m_pad", PE_SHAPE(2, 1, 1, 11), -1, 1, 173);
  for (int j = 8; j < 11; j++) pe_f32(pad)[11 + j] = -INFINITY;
  ph_set_uniform(s, "m_qk", PE_SHAPE(9, 11), -2, 2, 174);
  ph_set_uniform(s, "m_all", PE_SHAPE(2, 3, 9, 11), -2, 2, 175);
  const char *masks[] = {"m_b1qk", "m_k", "m_pad", "m_qk", "m_all"};
  for (int m = 0; m < 5; m++) {
    pe_op_desc *op =
        ph_op("fused_softmax_mask", "X", "x", "Mask", masks[m], NULL, "Out", "p", NULL);
    compare_grads(s, op, LIBM);
    pe_op_desc_free(op);
  }
  /* The triangle: Tq < Tk, square, rank 2. */
  ph_set_uniform(s, "sq", PE_SHAPE(4, 13, 13), -4, 4, 176);
  ph_set_uniform(s, "r2", PE_SHAPE(16, 16), -4, 4, 177);
  const char *xs[] = {"x", "sq", "r2"}, *outs[] = {"t", "tsq", "tr2"};
  for (int k = 0; k < 3; k++) {
    pe_op_desc *op = op1("fused_softmax_mask_upper_triangle", xs[k], outs[k]);
    compare_grads(s, op, LIBM);
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

/* --- scaled_dot_product_attention ------------------------------------------------------ */

static pe_op_desc *attention_op(const char *mask, bool causal, float scale) {
  pe_op_desc *op = mask ? ph_op("scaled_dot_product_attention", "Q", "q", "K", "k", "V", "v",
                                "Mask", mask, NULL, "Out", "o", "Softmax", "sm", NULL)
                        : ph_op("scaled_dot_product_attention", "Q", "q", "K", "k", "V", "v", NULL,
                                "Out", "o", "Softmax", "sm", NULL);
  PE_CK_OK(pe_op_set_bool(op, "causal", causal));
  PE_CK_OK(pe_op_set_float(op, "scale", scale));
  return op;
}

/* The gradient op with one of Out@GRAD and Softmax@GRAD (compare_grads
 * gives it both). */
static void attention_grad_one_input(pe_scope *s, const char *grad_slot, const char *grad) {
  pe_op_desc *op = ph_op("scaled_dot_product_attention_grad", "Q", "q", "K", "k", "V", "v", "Out",
                         "o", "Softmax", "sm", grad_slot, grad, NULL, "Q@GRAD", "dq", "K@GRAD",
                         "dk", "V@GRAD", "dv", NULL);
  PE_CK_OK(pe_op_set_bool(op, "causal", true));
  compare(s, op, SUMS);
  pe_op_desc_free(op);
}

/* Q, K, V of attention [b, h, tq/tk, d/dv], uniform in [-r, r]. */
static void set_qkv(pe_scope *s, int64_t b, int64_t h, int64_t tq, int64_t tk, int64_t d,
                    int64_t dv, float r, uint64_t seed) {
  ph_set_uniform(s, "q", PE_SHAPE(b, h, tq, d), -r, r, seed);
  ph_set_uniform(s, "k", PE_SHAPE(b, h, tk, d), -r, r, seed + 1);
  ph_set_uniform(s, "v", PE_SHAPE(b, h, tk, dv), -r, r, seed + 2);
}

START_TEST(attention_masks_and_causal) {
  pe_scope *s = pe_scope_new(NULL);
  set_qkv(s, 2, 3, 9, 11, 8, 5, 1, 180);
  pe_tensor *pad = ph_set_uniform(s, "m_pad", PE_SHAPE(2, 1, 1, 11), -1, 1, 183);
  for (int j = 7; j < 11; j++) pe_f32(pad)[11 + j] = -INFINITY;
  ph_set_uniform(s, "m_qk", PE_SHAPE(9, 11), -2, 2, 184);
  const struct {
    const char *mask;
    bool causal;
    float scale;
  } cases[] = {{NULL, false, 0},   {NULL, true, 0},       {"m_pad", false, 0},
               {"m_pad", true, 0}, {"m_qk", false, 0.5f}, {"m_qk", true, 2.0f}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    pe_op_desc *op = attention_op(cases[i].mask, cases[i].causal, cases[i].scale);
    compare_grads(s, op, SUMS);
    pe_op_desc_free(op);
  }
  /* With the last case's Out and Softmax in the scope: the gradient from
   * Out@GRAD alone and from Softmax@GRAD alone. */
  ph_set_uniform(s, "g_o", PE_SHAPE(2, 3, 9, 5), -1, 1, 185);
  ph_set_uniform(s, "g_sm", PE_SHAPE(2, 3, 9, 11), -1, 1, 186);
  attention_grad_one_input(s, "Out@GRAD", "g_o");
  attention_grad_one_input(s, "Softmax@GRAD", "g_sm");
  pe_scope_free(s);
}
END_TEST

START_TEST(attention_square_causal) {
  pe_scope *s = pe_scope_new(NULL);
  /* A language model's shape: Tq = Tk, one batch, Dv = D. */
  set_qkv(s, 1, 4, 16, 16, 16, 16, 2, 190);
  pe_op_desc *op = attention_op(NULL, true, 0);
  compare_grads(s, op, SUMS);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* --- cast, tril_triu --------------------------------------------------------------- */

START_TEST(cast_between_dtypes) {
  pe_scope *s = pe_scope_new(NULL);
  const pe_dtype dts[] = {PE_F32, PE_F64, PE_I32, PE_I64, PE_U8};
  const char *names[] = {"f32", "f64", "i32", "i64", "u8"};
  /* Every pair on values every dtype holds; float sources with fractions
   * into every dtype that holds their range (truncation toward zero). */
  for (int a = 0; a < 5; a++) set_typed(s, names[a], dts[a], PE_SHAPE(13, 11), small_ints);
  set_typed(s, "frac32", PE_F32, PE_SHAPE(13, 11), fractions);
  set_typed(s, "frac64", PE_F64, PE_SHAPE(13, 11), fractions);
  for (int a = 0; a < 7; a++)
    for (int b = 0; b < 5; b++) {
      if (a >= 5 && dts[b] == PE_U8) continue; /* negative values: an error on the CPU */
      const char *src = a < 5 ? names[a] : a == 5 ? "frac32" : "frac64";
      pe_op_desc *op = op1("cast", src, "out");
      PE_CK_OK(pe_op_set_int(op, "out_dtype", dts[b]));
      compare(s, op, EXACT);
      pe_op_desc_free(op);
    }
  /* i64 past 2^53 to floats: through double, as the CPU converts (2^60 +
   * 2^36 + 1 rounds to 2^60 + 2^37 directly, to 2^60 through double). */
  const int64_t big[] = {((int64_t)1 << 60) + ((int64_t)1 << 36) + 1, -((int64_t)1 << 55) - 7,
                         ((int64_t)1 << 53) + 1, 123};
  ph_set_i64(s, "big", PE_SHAPE(4), big);
  for (int b = 0; b < 2; b++) {
    pe_op_desc *op = op1("cast", "big", "bigf");
    PE_CK_OK(pe_op_set_int(op, "out_dtype", dts[b]));
    compare(s, op, EXACT);
    pe_op_desc_free(op);
  }
  /* The gradient: an f64 Out@GRAD back to f32 X, and f32 back to f64. */
  set_typed(s, "g64", PE_F64, PE_SHAPE(13, 11), fractions);
  set_typed(s, "g32", PE_F32, PE_SHAPE(13, 11), fractions);
  for (int k = 0; k < 2; k++) {
    pe_op_desc *op = ph_op("cast_grad", "X", k ? "f64" : "f32", "Out@GRAD", k ? "g32" : "g64", NULL,
                           "X@GRAD", "gx", NULL);
    PE_CK_OK(pe_op_set_int(op, "out_dtype", k ? PE_F32 : PE_F64));
    compare(s, op, EXACT);
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

START_TEST(tril_triu_triangles) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(3, 7, 9), -1, 1, 170);
  set_typed(s, "xi", PE_I64, PE_SHAPE(2, 6, 5), small_ints);
  const int64_t diags[] = {-2, 0, 1, 12};
  for (int lower = 0; lower < 2; lower++)
    for (int d = 0; d < 4; d++) {
      pe_op_desc *op = op1("tril_triu", "x", "t");
      PE_CK_OK(pe_op_set_bool(op, "lower", lower));
      PE_CK_OK(pe_op_set_int(op, "diagonal", diags[d]));
      compare_grads(s, op, EXACT);
      pe_op_desc_free(op);
      op = op1("tril_triu", "xi", "ti");
      PE_CK_OK(pe_op_set_bool(op, "lower", lower));
      PE_CK_OK(pe_op_set_int(op, "diagonal", diags[d]));
      compare(s, op, EXACT);
      pe_op_desc_free(op);
    }
  pe_scope_free(s);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("cuda_ops_seq");
  TCase *t = tcase_create("vs_cpu");
  tcase_add_checked_fixture(t, setup, teardown);
  tcase_add_test(t, gelu_both_forms);
  tcase_add_test(t, abs_and_square);
  tcase_add_test(t, layer_norm_rows);
  tcase_add_test(t, embedding_dense);
  tcase_add_test(t, transpose_any_perm);
  tcase_add_test(t, concat_and_split);
  tcase_add_test(t, slice_windows);
  tcase_add_test(t, matmul_v2_batched);
  tcase_add_test(t, huber_loss_both_sides_of_delta);
  tcase_add_test(t, sigmoid_cross_entropy);
  tcase_add_test(t, smooth_l1_both_sides_of_beta);
  tcase_add_test(t, cast_between_dtypes);
  tcase_add_test(t, tril_triu_triangles);
  tcase_add_test(t, position_ids_along_an_axis);
  tcase_add_test(t, softmax_with_masks);
  tcase_add_test(t, attention_masks_and_causal);
  tcase_add_test(t, attention_square_causal);
  suite_add_tcase(s, t);
  return s;
}

PE_CUDA_MAIN(suite, 1)

#endif
