/* Every CUDA kernel against the CPU reference, forward and gradient.
 *
 * For an op desc over a scope of host tensors, compare() uploads the
 * inputs to cuda:0, runs the CPU kernel (op harness) and the CUDA kernel on
 * the same inputs with generators in the same state, downloads the CUDA
 * outputs and compares them with the CPU's: integer outputs exactly, f32
 * within a relative tolerance. compare_grads() does the forward, then makes
 * the gradient ops with the op's own gradient maker, feeds random output
 * gradients and compares every gradient op the same way.
 *
 * Tolerances: kernels sum in a different order than oneDNN/the CPU loops
 * (f32 rounding ~1e-7 relative per add), so reductions over a few hundred
 * elements differ by ~1e-5; 1e-4 relative (denominator max(1, |ref|))
 * leaves a margin and still catches any wrong index or formula (those
 * are off by O(1)). Random ops must match exactly (same counters).
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

#include "cuda/cuda_ctx.h"
#include "cuda_compare.h"
#include "cuda_test_main.h"
#include "engine/device.h"
#include "op_harness.h"
#include "test_assert.h"

#define TOL 1e-4

/* --- creation and copies --------------------------------------------------------- */

START_TEST(creation_ops) {
  pe_scope *s = pe_scope_new(NULL);
  const int64_t shape[] = {37, 29};
  pe_op_desc *op = ph_op("fill_constant", NULL, "Out", "c", NULL);
  PE_CK_OK(pe_op_set_ints(op, "shape", 2, shape));
  PE_CK_OK(pe_op_set_float(op, "value", 2.5f));
  compare(s, op, 0);
  PE_CK_OK(pe_op_set_int(op, "dtype", PE_I64));
  PE_CK_OK(pe_op_set_float(op, "value", -7.0f));
  compare(s, op, 0);
  pe_op_desc_free(op);
  /* Seeded init must give the CPU's numbers (program generator and op seed). */
  op = ph_op("uniform_random", NULL, "Out", "u", NULL);
  PE_CK_OK(pe_op_set_ints(op, "shape", 2, shape));
  PE_CK_OK(pe_op_set_float(op, "min", -0.3f));
  PE_CK_OK(pe_op_set_float(op, "max", 0.7f));
  compare(s, op, 0);
  PE_CK_OK(pe_op_set_int(op, "seed", 99));
  compare(s, op, 0);
  pe_op_desc_free(op);
  op = ph_op("gaussian_random", NULL, "Out", "g", NULL);
  PE_CK_OK(pe_op_set_ints(op, "shape", 2, shape));
  PE_CK_OK(pe_op_set_float(op, "std", 0.02f));
  compare(s, op, 1e-6); /* device log/cos may differ from glibc in the last ulp */
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(copy_ops) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(4, 3, 5), -1, 1, 1);
  pe_op_desc *op = op1("assign", "x", "y");
  compare_grads(s, op, 0);
  pe_op_desc_free(op);
  op = op1("reshape", "x", "r");
  const int64_t shape[] = {12, 5};
  PE_CK_OK(pe_op_set_ints(op, "shape", 2, shape));
  compare_grads(s, op, 0);
  pe_op_desc_free(op);
  op = op1("flatten", "x", "f");
  PE_CK_OK(pe_op_set_int(op, "axis", 2));
  compare_grads(s, op, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* --- elementwise --------------------------------------------------------------------- */

static void binops(pe_scope *s, int axis) {
  const char *types[] = {"elementwise_add", "elementwise_sub", "elementwise_mul"};
  for (int t = 0; t < 3; t++) {
    pe_op_desc *op = ph_op(types[t], "X", "x", "Y", "y", NULL, "Out", "o", NULL);
    if (axis != -1) PE_CK_OK(pe_op_set_int(op, "axis", axis));
    compare_grads(s, op, TOL);
    pe_op_desc_free(op);
  }
}

START_TEST(elementwise_broadcasting) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(6, 7), -1, 1, 2);
  ph_set_uniform(s, "y", PE_SHAPE(6, 7), -1, 1, 3);
  binops(s, -1); /* same shape */
  ph_set_uniform(s, "y", PE_SHAPE(7), -1, 1, 4);
  binops(s, -1); /* row vector */
  ph_set_uniform(s, "x", PE_SHAPE(130, 1), -1, 1, 5);
  ph_set_uniform(s, "y", PE_SHAPE(1, 90), -1, 1, 6);
  binops(s, -1); /* both broadcast, long reductions */
  ph_set_uniform(s, "x", PE_SHAPE(2, 3, 4, 5), -1, 1, 7);
  ph_set_uniform(s, "y", PE_SHAPE(3), -1, 1, 8);
  binops(s, 1); /* Paddle axis: per channel */
  ph_set_uniform(s, "y", PE_SHAPE(1), -1, 1, 9);
  binops(s, -1); /* scalar */
  pe_scope_free(s);
}
END_TEST

START_TEST(scale_and_sum) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "a", PE_SHAPE(33, 17), -1, 1, 10);
  ph_set_uniform(s, "b", PE_SHAPE(33, 17), -1, 1, 11);
  ph_set_uniform(s, "c", PE_SHAPE(33, 17), -1, 1, 12);
  pe_op_desc *op = op1("scale", "a", "o");
  PE_CK_OK(pe_op_set_float(op, "scale", -1.5f));
  PE_CK_OK(pe_op_set_float(op, "bias", 0.25f));
  PE_CK_OK(pe_op_set_bool(op, "bias_after_scale", false));
  compare_grads(s, op, TOL);
  pe_op_desc_free(op);
  op = pe_op_desc_new("sum");
  const char *xs[] = {"a", "b", "c"};
  PE_CK_OK(pe_op_set_input(op, "X", 3, xs));
  PE_CK_OK(pe_op_output1(op, "Out", "total"));
  compare_grads(s, op, TOL);
  /* In place: Out is one of the inputs (gradient accumulation). */
  pe_op_desc_free(op);
  op = pe_op_desc_new("sum");
  PE_CK_OK(pe_op_set_input(op, "X", 3, xs));
  PE_CK_OK(pe_op_output1(op, "Out", "a"));
  compare(s, op, TOL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* --- activations, softmax, dropout --------------------------------------------------- */

START_TEST(activations_and_softmax) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(8, 5, 11), -3, 3, 13);
  const char *acts[] = {"relu", "tanh", "sigmoid", "softmax"};
  for (int a = 0; a < 4; a++) {
    pe_op_desc *op = op1(acts[a], "x", "y");
    compare_grads(s, op, TOL);
    if (a == 3) { /* softmax over a middle axis */
      PE_CK_OK(pe_op_set_int(op, "axis", 1));
      compare_grads(s, op, TOL);
    }
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

START_TEST(dropout_train_and_test) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(64, 33), -1, 1, 14);
  pe_op_desc *op = ph_op("dropout", "X", "x", NULL, "Out", "y", "Mask", "m", NULL);
  PE_CK_OK(pe_op_set_float(op, "dropout_prob", 0.3f));
  compare_grads(s, op, TOL); /* same mask as the CPU: same counters */
  PE_CK_OK(pe_op_set_string(op, "dropout_implementation", "downgrade_in_infer"));
  PE_CK_OK(pe_op_set_int(op, "seed", 5));
  compare_grads(s, op, TOL);
  PE_CK_OK(pe_op_set_bool(op, "is_test", true));
  compare_grads(s, op, TOL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* --- matmul, conv, pool, batch norm ---------------------------------------------- */

START_TEST(matmul_cublas) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(17, 23), -1, 1, 15);
  ph_set_uniform(s, "w", PE_SHAPE(23, 9), -1, 1, 16);
  pe_op_desc *op = ph_op("matmul", "X", "x", "Y", "w", NULL, "Out", "o", NULL);
  compare_grads(s, op, TOL);
  pe_op_desc_free(op);
  /* X [2,3,4] with x_num_col_dims 2 -> [6,4]; Y [4,5]. */
  ph_set_uniform(s, "x", PE_SHAPE(2, 3, 4), -1, 1, 17);
  ph_set_uniform(s, "w", PE_SHAPE(4, 5), -1, 1, 18);
  op = ph_op("matmul", "X", "x", "Y", "w", NULL, "Out", "o", NULL);
  PE_CK_OK(pe_op_set_int(op, "x_num_col_dims", 2));
  compare_grads(s, op, TOL);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static void conv_case(pe_scope *s, pe_shape x, pe_shape w, int64_t stride, int64_t pad, int64_t dil,
                      int64_t groups) {
  ph_set_uniform(s, "x", x, -1, 1, 19);
  ph_set_uniform(s, "w", w, -1, 1, 20);
  pe_op_desc *op = ph_op("conv2d", "Input", "x", "Filter", "w", NULL, "Output", "o", NULL);
  const int64_t st[] = {stride, stride}, pd[] = {pad, pad}, dl[] = {dil, dil};
  PE_CK_OK(pe_op_set_ints(op, "strides", 2, st));
  PE_CK_OK(pe_op_set_ints(op, "paddings", 2, pd));
  PE_CK_OK(pe_op_set_ints(op, "dilations", 2, dl));
  PE_CK_OK(pe_op_set_int(op, "groups", groups));
  compare_grads(s, op, 1e-3); /* sums of up to ~300 products */
  pe_op_desc_free(op);
}

START_TEST(conv2d_cudnn) {
  pe_scope *s = pe_scope_new(NULL);
  conv_case(s, PE_SHAPE(2, 3, 9, 9), PE_SHAPE(4, 3, 3, 3), 1, 1, 1, 1);
  conv_case(s, PE_SHAPE(2, 4, 11, 10), PE_SHAPE(6, 2, 3, 3), 2, 1, 1, 2);
  conv_case(s, PE_SHAPE(1, 2, 12, 12), PE_SHAPE(3, 2, 3, 3), 1, 2, 2, 1);
  pe_scope_free(s);
}
END_TEST

static void pool_case(pe_scope *s, const char *type, int64_t k, int64_t stride, int64_t pad,
                      bool exclusive, bool global) {
  pe_op_desc *op = op1("pool2d", "x", "o");
  const int64_t ks[] = {k, k}, st[] = {stride, stride}, pd[] = {pad, pad};
  PE_CK_OK(pe_op_set_string(op, "pooling_type", type));
  PE_CK_OK(pe_op_set_ints(op, "ksize", 2, ks));
  PE_CK_OK(pe_op_set_ints(op, "strides", 2, st));
  PE_CK_OK(pe_op_set_ints(op, "paddings", 2, pd));
  PE_CK_OK(pe_op_set_bool(op, "exclusive", exclusive));
  PE_CK_OK(pe_op_set_bool(op, "global_pooling", global));
  compare_grads(s, op, TOL);
  pe_op_desc_free(op);
}

/* NaN stays NaN through relu and max pooling, as on the CPU
 * (ops/cpu/relu.h); relu's gradient passes dy where x is NaN. */
START_TEST(nan_passes_relu_and_max_pool) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(2, 3, 6, 6), -1, 1, 31);
  float *xv = pe_f32(ph_get(s, "x"));
  xv[0] = NAN;
  xv[1] = -0.0f;
  xv[40] = INFINITY;
  xv[41] = -INFINITY;
  pe_op_desc *op = op1("relu", "x", "o");
  compare_grads(s, op, 0);
  ck_assert(isnan(pe_f32(ph_get(s, "o"))[0]));
  ck_assert_float_eq(pe_f32(ph_get(s, "x@GRAD"))[0], pe_f32(ph_get(s, "o@GRAD"))[0]);
  pe_op_desc_free(op);
  op = op1("pool2d", "x", "p");
  const int64_t two[] = {2, 2};
  PE_CK_OK(pe_op_set_string(op, "pooling_type", "max"));
  PE_CK_OK(pe_op_set_ints(op, "ksize", 2, two));
  PE_CK_OK(pe_op_set_ints(op, "strides", 2, two));
  compare(s, op, 0);
  ck_assert(isnan(pe_f32(ph_get(s, "p"))[0]));
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(pool2d_cudnn) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(2, 3, 10, 9), -1, 1, 21);
  pool_case(s, "max", 2, 2, 0, true, false);
  pool_case(s, "max", 3, 1, 1, true, false);
  pool_case(s, "avg", 3, 2, 1, true, false);
  pool_case(s, "avg", 3, 2, 1, false, false);
  pool_case(s, "avg", 1, 1, 0, true, true);
  pe_scope_free(s);
}
END_TEST

static void bn_case_in(pe_scope *s, pe_shape x, float lo, float hi, bool is_test) {
  int64_t C = x.d[1];
  ph_set_uniform(s, "x", x, lo, hi, 22);
  ph_set_uniform(s, "scale", PE_SHAPE(C), 0.5f, 1.5f, 23);
  ph_set_uniform(s, "bias", PE_SHAPE(C), -0.5f, 0.5f, 24);
  ph_set_uniform(s, "mean", PE_SHAPE(C), -0.1f, 0.1f, 25);
  ph_set_uniform(s, "var", PE_SHAPE(C), 0.5f, 1.5f, 26);
  pe_op_desc *op = ph_op("batch_norm", "X", "x", "Scale", "scale", "Bias", "bias", "Mean", "mean",
                         "Variance", "var", NULL, "Y", "y", "MeanOut", "mean", "VarianceOut", "var",
                         "SavedMean", "sm", "SavedVariance", "sv", NULL);
  PE_CK_OK(pe_op_set_bool(op, "is_test", is_test));
  compare_grads(s, op, 1e-3);
  pe_op_desc_free(op);
}

static void bn_case(pe_scope *s, pe_shape x, bool is_test) {
  bn_case_in(s, x, -2, 2, is_test);
}

/* The fused batch norm (pass fuse_conv_act, cpu and sim places only) is
 * refused, forward and gradient, naming the op and the activation; the
 * kernel looks at nothing else first. */
static void expect_fused_refused(const char *type) {
  pe_op_desc *op = ph_op(type, NULL, NULL);
  PE_CK_OK(pe_op_set_string(op, "fuse_activation", "relu"));
  const pe_op_def *def = pe_op_lookup(type);
  pe_tensor_list in[16], out[16];
  memset(in, 0, sizeof in);
  memset(out, 0, sizeof out);
  void *state = NULL;
  pe_kernel_ctx kc = {def, op,     0,    in,
                      out, &state, NULL, pe_stream_ctx(pe_device_stream(dev, PE_STREAM_COMPUTE))};
  expect_errors(def->kernel_cuda(&kc), PE_EINVAL, type, "fuse_activation 'relu'",
                "not supported on cuda places", NULL);
  pe_op_desc_free(op);
}

START_TEST(batch_norm_kernels) {
  pe_scope *s = pe_scope_new(NULL);
  bn_case(s, PE_SHAPE(4, 3, 6, 5), false);
  bn_case(s, PE_SHAPE(16, 7), false);
  bn_case(s, PE_SHAPE(4, 3, 6, 5), true);
  /* Channels of 50,176 and 12,800 elements: the statistics and gradient
   * sums in 25 and 7 parts per channel (uneven), combined in order. */
  bn_case(s, PE_SHAPE(64, 16, 28, 28), false);
  bn_case(s, PE_SHAPE(32, 8, 20, 20), false);
  /* An offset input (mean^2 / var ~ 3e4): the variance from E[x^2] - mean^2
   * in double still matches the CPU's. */
  bn_case_in(s, PE_SHAPE(32, 8, 20, 20), 99, 101, false);
  pe_scope_free(s);
  expect_fused_refused("batch_norm");
  expect_fused_refused("batch_norm_grad");
}
END_TEST

/* --- losses, mean, metrics ------------------------------------------------------------ */

START_TEST(losses_and_mean) {
  pe_scope *s = pe_scope_new(NULL);
  enum { R = 37, C = 45 };
  ph_set_uniform(s, "logits", PE_SHAPE(R, C), -4, 4, 27);
  int64_t lab[R];
  for (int i = 0; i < R; i++) lab[i] = (i * 7) % C;
  ph_set_i64(s, "label", PE_SHAPE(R, 1), lab);
  ph_set_uniform(s, "soft", PE_SHAPE(R, C), 0, 0.05f, 28);
  ph_set_uniform(s, "prob", PE_SHAPE(R, C), 0.01f, 1, 29);
  for (int soft = 0; soft < 2; soft++) {
    pe_op_desc *op = ph_op("softmax_with_cross_entropy", "Logits", "logits", "Label",
                           soft ? "soft" : "label", NULL, "Softmax", "sm", "Loss", "loss", NULL);
    PE_CK_OK(pe_op_set_bool(op, "soft_label", soft));
    compare_grads(s, op, TOL);
    pe_op_desc_free(op);
    op = ph_op("cross_entropy", "X", "prob", "Label", soft ? "soft" : "label", NULL, "Y", "ce",
               NULL);
    PE_CK_OK(pe_op_set_bool(op, "soft_label", soft));
    compare_grads(s, op, TOL);
    pe_op_desc_free(op);
  }
  ph_set_uniform(s, "big", PE_SHAPE(300, 301), -1, 1, 30);
  pe_op_desc *op = op1("mean", "big", "m");
  compare_grads(s, op, 1e-6);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(metrics) {
  pe_scope *s = pe_scope_new(NULL);
  enum { R = 300, C = 10 };
  ph_set_uniform(s, "x", PE_SHAPE(R, C), 0, 1, 31);
  /* Ties: some rows repeat a score, ranks must follow the lower index. */
  pe_tensor *x = ph_get(s, "x");
  for (int r = 0; r < R; r += 5) pe_f32(x)[r * C + 3] = pe_f32(x)[r * C + 7];
  int64_t lab[R];
  for (int i = 0; i < R; i++) lab[i] = (i * 3) % C;
  ph_set_i64(s, "label", PE_SHAPE(R, 1), lab);
  for (int64_t k = 1; k <= 3; k += 2) {
    pe_op_desc *op = ph_op("accuracy", "X", "x", "Label", "label", NULL, "Accuracy", "acc",
                           "Correct", "cor", "Total", "tot", NULL);
    PE_CK_OK(pe_op_set_int(op, "k", k));
    compare(s, op, 0);
    pe_op_desc_free(op);
    op = ph_op("top_k", "X", "x", NULL, "Out", "v", "Indices", "i", NULL);
    PE_CK_OK(pe_op_set_int(op, "k", k));
    compare(s, op, 0);
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

/* --- optimizers (in place, as the optimizer pass writes them) ------------------------- */

START_TEST(optimizers) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "p", PE_SHAPE(50, 21), -1, 1, 32);
  ph_set_uniform(s, "g", PE_SHAPE(50, 21), -1, 1, 33);
  ph_set_uniform(s, "v", PE_SHAPE(50, 21), -1, 1, 34);
  ph_set_uniform(s, "m1", PE_SHAPE(50, 21), -0.1f, 0.1f, 35);
  ph_set_uniform(s, "m2", PE_SHAPE(50, 21), 0, 0.1f, 36);
  ph_set_f32(s, "lr", PE_SHAPE(1), (float[]){0.05f});
  ph_set_f32(s, "b1p", PE_SHAPE(1), (float[]){0.9f * 0.9f});
  ph_set_f32(s, "b2p", PE_SHAPE(1), (float[]){0.999f * 0.999f});
  pe_op_desc *op =
      ph_op("sgd", "Param", "p", "Grad", "g", "LearningRate", "lr", NULL, "ParamOut", "p", NULL);
  compare(s, op, TOL);
  pe_op_desc_free(op);
  for (int nesterov = 0; nesterov < 2; nesterov++) {
    op = ph_op("momentum", "Param", "p", "Grad", "g", "Velocity", "v", "LearningRate", "lr", NULL,
               "ParamOut", "p", "VelocityOut", "v", NULL);
    PE_CK_OK(pe_op_set_bool(op, "use_nesterov", nesterov));
    compare(s, op, TOL);
    pe_op_desc_free(op);
  }
  op = ph_op("adam", "Param", "p", "Grad", "g", "LearningRate", "lr", "Moment1", "m1", "Moment2",
             "m2", "Beta1Pow", "b1p", "Beta2Pow", "b2p", NULL, "ParamOut", "p", "Moment1Out", "m1",
             "Moment2Out", "m2", "Beta1PowOut", "b1p", "Beta2PowOut", "b2p", NULL);
  compare(s, op, TOL);
  compare(s, op, TOL); /* a second step from the updated state */
  pe_op_desc_free(op);
  /* L2 weight decay (the optimizer pass's weight_decay) on each of the three,
   * and adam's decoupled decay (adamw). */
  const char *kinds[] = {"sgd", "momentum", "adam", "adamw"};
  for (int k = 0; k < 4; k++) {
    if (k == 0)
      op = ph_op("sgd", "Param", "p", "Grad", "g", "LearningRate", "lr", NULL, "ParamOut", "p",
                 NULL);
    else if (k == 1)
      op = ph_op("momentum", "Param", "p", "Grad", "g", "Velocity", "v", "LearningRate", "lr", NULL,
                 "ParamOut", "p", "VelocityOut", "v", NULL);
    else
      op =
          ph_op("adam", "Param", "p", "Grad", "g", "LearningRate", "lr", "Moment1", "m1", "Moment2",
                "m2", "Beta1Pow", "b1p", "Beta2Pow", "b2p", NULL, "ParamOut", "p", "Moment1Out",
                "m1", "Moment2Out", "m2", "Beta1PowOut", "b1p", "Beta2PowOut", "b2p", NULL);
    PE_CK_OK(
        pe_op_set_string(op, "regularization_method", k == 3 ? "decoupled_decay" : "l2_decay"));
    PE_CK_OK(pe_op_set_float(op, "regularization_coeff", 0.05f));
    ck_assert_msg(pe_op_find_attr(op, "regularization_coeff"), "%s", kinds[k]);
    compare(s, op, TOL);
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

/* clip_by_global_norm over three tensors (one of 200k elements): scaled
 * (max_norm below the norm), copied (above it), and in place. */
START_TEST(clip_by_global_norm_kernel) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "a", PE_SHAPE(1000, 37), -1, 1, 31);
  ph_set_uniform(s, "b", PE_SHAPE(5), -3, 3, 32);
  ph_set_uniform(s, "c", PE_SHAPE(200000), -0.5f, 0.5f, 33);
  const char *xs[] = {"a", "b", "c"}, *outs[] = {"a@CLIP", "b@CLIP", "c@CLIP"};
  float limits[] = {1.0f, 1e6f};
  for (int i = 0; i < 3; i++) {
    pe_op_desc *op = pe_op_desc_new("clip_by_global_norm");
    PE_CK_OK(pe_op_set_input(op, "X", 3, xs));
    PE_CK_OK(pe_op_set_output(op, "Out", 3, i < 2 ? outs : xs));
    PE_CK_OK(pe_op_output1(op, "GlobalNorm", "norm"));
    PE_CK_OK(pe_op_set_float(op, "max_norm", limits[i % 2]));
    compare(s, op, TOL);
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

/* lr_schedule: one thread computes the cpu kernel's formula (the same
 * header); every kind at counters around its corners, in place. */
START_TEST(lr_schedules) {
  pe_scope *s = pe_scope_new(NULL);
  const char *kinds[] = {"constant", "step", "multistep", "exponential", "cosine", "linear"};
  const int64_t counters[] = {-2, 0, 3, 7, 12, 100, 1000000};
  for (int k = 0; k < 6; k++)
    for (int c = 0; c < 7; c++) {
      pe_op_desc *op =
          ph_op("lr_schedule", "Step", "c", NULL, "StepOut", "c", "LearningRate", "lr", NULL);
      PE_CK_OK(pe_op_set_string(op, "schedule", kinds[k]));
      PE_CK_OK(pe_op_set_float(op, "base_lr", 0.3f));
      PE_CK_OK(pe_op_set_long(op, "warmup_steps", 2));
      PE_CK_OK(pe_op_set_long(op, "decay_steps", k == 3 ? 3 : 10));
      PE_CK_OK(pe_op_set_float(op, "gamma", 0.7f));
      if (k >= 4) PE_CK_OK(pe_op_set_float(op, "min_lr", 0.01f));
      if (k == 2) PE_CK_OK(pe_op_set_ints(op, "milestones", 2, (int64_t[]){4, 9}));
      ph_set_i64(s, "c", PE_SHAPE(1), &counters[c]);
      ph_set_f32(s, "lr", PE_SHAPE(1), (float[]){0});
      compare(s, op, TOL);
      pe_op_desc_free(op);
    }
  pe_scope_free(s);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("cuda_kernels");
  TCase *t = tcase_create("vs_cpu");
  tcase_add_checked_fixture(t, setup, teardown);
  tcase_add_test(t, creation_ops);
  tcase_add_test(t, copy_ops);
  tcase_add_test(t, elementwise_broadcasting);
  tcase_add_test(t, scale_and_sum);
  tcase_add_test(t, activations_and_softmax);
  tcase_add_test(t, dropout_train_and_test);
  tcase_add_test(t, matmul_cublas);
  tcase_add_test(t, conv2d_cudnn);
  tcase_add_test(t, pool2d_cudnn);
  tcase_add_test(t, nan_passes_relu_and_max_pool);
  tcase_add_test(t, batch_norm_kernels);
  tcase_add_test(t, losses_and_mean);
  tcase_add_test(t, clip_by_global_norm_kernel);
  tcase_add_test(t, metrics);
  tcase_add_test(t, optimizers);
  tcase_add_test(t, lr_schedules);
  suite_add_tcase(s, t);
  return s;
}

PE_CUDA_MAIN(suite, 1)

#endif
