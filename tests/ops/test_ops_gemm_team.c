/* The team of a matrix product (ops/cpu/gemm_team.h) and what matmul does
 * with it: the choice is a pure function of the sizes and the budget; the
 * products give the same bits on budgets 1 and 2 whichever path they take
 * (one thread, the place's team, or dX and dY side by side); and the
 * kernel gives the calling thread its OpenMP team back. */
#include <check.h>
#include <omp.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "ops/cpu/gemm_team.h"
#include "test_assert.h"

START_TEST(small_products_run_on_one_thread) {
  /* The MLP's products (batch 128): all but the first layer's are small. */
  ck_assert_int_eq(pe_gemm_team(128, 128, 10, 2), 1);
  ck_assert_int_eq(pe_gemm_team(128, 256, 128, 2), 1);
  ck_assert_int_eq(pe_gemm_team(128, 784, 128, 2), 1);
  ck_assert_int_eq(pe_gemm_team(128, 784, 256, 2), 2);
  ck_assert_int_eq(pe_gemm_team(784, 128, 256, 4), 4);
  /* The threshold itself goes to the team, one below it does not. */
  ck_assert_int_eq(pe_gemm_team(1, 1, PE_GEMM_TEAM_MIN_MACS, 2), 2);
  ck_assert_int_eq(pe_gemm_team(1, 1, PE_GEMM_TEAM_MIN_MACS - 1, 2), 1);
  /* A budget of one is one whatever the size. */
  ck_assert_int_eq(pe_gemm_team(4096, 4096, 4096, 1), 1);
  ck_assert_int_eq(pe_gemm_team(4096, 4096, 4096, 0), 1);
}
END_TEST

START_TEST(macs_saturate_and_empty_products_are_small) {
  ck_assert_int_eq(pe_gemm_macs(INT64_MAX / 2, 4, 1), INT64_MAX);
  ck_assert_int_eq(pe_gemm_macs(1 << 20, 1 << 20, 1 << 30), INT64_MAX);
  ck_assert_int_eq(pe_gemm_team(1 << 20, 1 << 20, 1 << 30, 2), 2);
  ck_assert_int_eq(pe_gemm_macs(0, 784, 256), 0);
  ck_assert_int_eq(pe_gemm_macs(-1, 784, 256), 0);
  ck_assert_int_eq(pe_gemm_team(0, 784, 256, 2), 1);
}
END_TEST

START_TEST(side_by_side_needs_two_threads_and_one_thread_products) {
  /* The MLP's second layer: [128,256]x[256,128]. */
  ck_assert(pe_gemm_side_by_side(128, 256, 128, 2));
  ck_assert(!pe_gemm_side_by_side(128, 256, 128, 1));
  /* Its last: too small for a second thread to pay. */
  ck_assert(!pe_gemm_side_by_side(128, 128, 10, 2));
  ck_assert(pe_gemm_side_by_side(1, 1, PE_GEMM_SIDE_MIN_MACS, 2));
  ck_assert(!pe_gemm_side_by_side(1, 1, PE_GEMM_SIDE_MIN_MACS - 1, 2));
  /* Large enough for the team: the team takes each product. */
  ck_assert(!pe_gemm_side_by_side(128, 784, 256, 2));
}
END_TEST

typedef struct mm_case {
  int64_t m, k, n;
  bool relu; /* fused bias and relu (the MLP's hidden layers) */
} mm_case;

/* One of each path on a budget of 2: one thread (5x7x6, 96x64x40), side by
 * side (128x256x128), the team (128x784x256); and one side by side with
 * the fused relu's mask. */
static const mm_case cases[] = {
    {5, 7, 6, false},       {96, 64, 40, false},   {128, 256, 128, false},
    {128, 784, 256, false}, {128, 256, 128, true},
};

/* matmul then matmul_grad of the case on a device of `threads`; the
 * outputs land in s (out, x@GRAD, w@GRAD, b@GRAD). */
static void run_on(pe_scope *s, const mm_case *k, int threads) {
  pe_device_ctx dev;
  PE_CK_OK(pe_device_ctx_init(&dev, pe_cpu_place(), threads));
  pe_device_ctx_bind(&dev);
  pe_op_desc *fwd = ph_op("matmul", "X", "x", "Y", "w", NULL, "Out", "out", NULL);
  pe_op_desc *grad = ph_op("matmul_grad", "X", "x", "Y", "w", "Out@GRAD", "g", NULL, "X@GRAD",
                           "x@GRAD", "Y@GRAD", "w@GRAD", NULL);
  if (k->relu) {
    pe_op_input1(fwd, "Bias", "b");
    pe_op_set_string(fwd, "fuse_activation", "relu");
    pe_op_input1(grad, "Bias", "b");
    pe_op_input1(grad, "Out", "out");
    pe_op_output1(grad, "Bias@GRAD", "b@GRAD");
    pe_op_set_string(grad, "fuse_activation", "relu");
  }
  ph_op_inst *f = ph_op_inst_new(fwd, &dev), *g = ph_op_inst_new(grad, &dev);
  /* Twice: the second run takes the cached primitives. */
  for (int r = 0; r < 2; r++) {
    PE_CK_OK(ph_op_inst_run(f, s, NULL));
    PE_CK_OK(ph_op_inst_run(g, s, NULL));
    ck_assert_msg(omp_get_max_threads() == threads,
                  "%lldx%lldx%lld on %d threads: the calling thread's team is %d after the kernels",
                  (long long)k->m, (long long)k->k, (long long)k->n, threads,
                  omp_get_max_threads());
  }
  ph_op_inst_free(f);
  ph_op_inst_free(g);
  pe_op_desc_free(fwd);
  pe_op_desc_free(grad);
  pe_device_ctx_destroy(&dev);
}

static void expect_same_bits(pe_scope *a, pe_scope *b, const char *name, const mm_case *k) {
  pe_tensor *x = ph_get(a, name), *y = ph_get(b, name);
  ck_assert_ptr_nonnull(x);
  ck_assert_ptr_nonnull(y);
  ck_assert(pe_shape_equal(&x->shape, &y->shape));
  ck_assert_msg(memcmp(x->data, y->data, (size_t)pe_tensor_numel(x) * sizeof(float)) == 0,
                "%s of %lldx%lldx%lld differs between budgets 1 and 2", name, (long long)k->m,
                (long long)k->k, (long long)k->n);
}

START_TEST(products_have_the_same_bits_on_one_and_two_threads) {
  const mm_case *k = &cases[_i];
  pe_scope *s[2];
  for (int t = 0; t < 2; t++) {
    s[t] = pe_scope_new(NULL);
    ph_set_uniform(s[t], "x", PE_SHAPE(k->m, k->k), -1, 1, 7);
    ph_set_uniform(s[t], "w", PE_SHAPE(k->k, k->n), -0.2f, 0.2f, 8);
    ph_set_uniform(s[t], "b", PE_SHAPE(k->n), -0.5f, 0.5f, 9);
    ph_set_uniform(s[t], "g", PE_SHAPE(k->m, k->n), -1, 1, 10);
    run_on(s[t], k, t + 1);
  }
  expect_same_bits(s[0], s[1], "out", k);
  expect_same_bits(s[0], s[1], "x@GRAD", k);
  expect_same_bits(s[0], s[1], "w@GRAD", k);
  if (k->relu) expect_same_bits(s[0], s[1], "b@GRAD", k);
  pe_scope_free(s[0]);
  pe_scope_free(s[1]);
}
END_TEST

static Suite *gemm_team_suite(void) {
  Suite *s = suite_create("ops_gemm_team");
  TCase *tc = tcase_create("gemm_team");
  tcase_add_test(tc, small_products_run_on_one_thread);
  tcase_add_test(tc, macs_saturate_and_empty_products_are_small);
  tcase_add_test(tc, side_by_side_needs_two_threads_and_one_thread_products);
  tcase_add_loop_test(tc, products_have_the_same_bits_on_one_and_two_threads, 0,
                      (int)(sizeof cases / sizeof cases[0]));
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(gemm_team_suite)
