/* The host-side plans of the CUDA shape and batched-matmul kernels
 * (daemon/cuda/shape_plan.h), on the CPU: the strided views they describe
 * are applied here with a plain loop and compared with the expected
 * results, so a wrong stride or merge shows without a GPU.
 * Without PE_HAVE_CUDA (the plans are part of the backend) the suite is
 * skipped. */
#include <stdio.h>

#ifndef PE_HAVE_CUDA
int main(void) {
  printf("skip: built without the CUDA backend (PE_CUDA=OFF or nvcc not found)\n");
  return 77;
}
#else

#include <check.h>
#include <string.h>

#include "check_main.h"
#include "cuda/shape_plan.h"
#include "ops/matmul_view.h"

/* The device kernel's index arithmetic (kernels_shape.cu), on the host. */
static void apply(const pe_cu_strided *p, int64_t numel, int *dst, const int *src) {
  for (int64_t i = 0; i < numel; i++) {
    int64_t r = i, d = 0, s = 0;
    for (int k = p->nd - 1; k >= 0; k--) {
      int64_t q = r % p->dims[k];
      r /= p->dims[k];
      d += q * p->dst[k];
      s += q * p->src[k];
    }
    dst[d] = src[s];
  }
}

START_TEST(dense_copy_merges_to_one_dim) {
  pe_cu_strided p = {.nd = 3, .dims = {2, 3, 4}, .dst = {12, 4, 1}, .src = {12, 4, 1}};
  ck_assert_int_eq(pe_cu_strided_simplify(&p), 24);
  ck_assert_int_eq(p.nd, 1);
  ck_assert_int_eq(p.dims[0], 24);
  ck_assert_int_eq(p.src[0], 1);
  /* A zero dim: nothing to copy. */
  pe_cu_strided z = {.nd = 2, .dims = {3, 0}, .dst = {0, 1}, .src = {0, 1}};
  ck_assert_int_eq(pe_cu_strided_simplify(&z), 0);
}
END_TEST

/* transpose2 of [2, 3, 4] by (2, 0, 1), and by (0, 2, 1), against the
 * index formula; dims of size 1 are dropped. */
START_TEST(transpose_plan) {
  int x[24], out[24];
  for (int i = 0; i < 24; i++) x[i] = i;
  pe_shape s = PE_SHAPE(2, 3, 4);
  int perm[3] = {2, 0, 1};
  pe_cu_strided p;
  pe_cu_plan_transpose(&s, perm, &p);
  int64_t n = pe_cu_strided_simplify(&p);
  ck_assert_int_eq(n, 24);
  memset(out, -1, sizeof out);
  apply(&p, n, out, x);
  /* out[c][a][b] = x[a][b][c] */
  for (int a = 0; a < 2; a++)
    for (int b = 0; b < 3; b++)
      for (int c = 0; c < 4; c++) ck_assert_int_eq(out[c * 6 + a * 3 + b], x[a * 12 + b * 4 + c]);
  /* (2, 0, 1) moves dim 2 ahead of the merged (0, 1): two dims. */
  ck_assert_int_eq(p.nd, 2);
  int perm2[3] = {0, 2, 1};
  pe_cu_plan_transpose(&s, perm2, &p);
  n = pe_cu_strided_simplify(&p);
  apply(&p, n, out, x);
  for (int a = 0; a < 2; a++)
    for (int b = 0; b < 3; b++)
      for (int c = 0; c < 4; c++) ck_assert_int_eq(out[a * 12 + c * 3 + b], x[a * 12 + b * 4 + c]);
  pe_shape one = PE_SHAPE(1, 5, 1, 2);
  int perm3[4] = {2, 3, 0, 1};
  pe_cu_plan_transpose(&one, perm3, &p);
  pe_cu_strided_simplify(&p);
  ck_assert_int_eq(p.nd, 2); /* [2, 5] from [5, 2]: a real transpose */
}
END_TEST

/* Python's slice bounds: negatives from the end, clamped, empty ranges. */
START_TEST(slice_window) {
  pe_shape s = PE_SHAPE(4, 10, 6);
  int64_t start[3], size[3];
  const int64_t axes[] = {1, -1}, starts[] = {-3, 2}, ends[] = {100, -1};
  pe_cu_slice_window(&s, axes, starts, ends, 2, start, size);
  ck_assert_int_eq(start[0], 0);
  ck_assert_int_eq(size[0], 4);
  ck_assert_int_eq(start[1], 7);
  ck_assert_int_eq(size[1], 3);
  ck_assert_int_eq(start[2], 2);
  ck_assert_int_eq(size[2], 3);
  const int64_t ax2[] = {0}, st2[] = {3}, en2[] = {1};
  pe_cu_slice_window(&s, ax2, st2, en2, 1, start, size);
  ck_assert_int_eq(size[0], 0);
}
END_TEST

/* matmul_v2's view: transposes, vectors, broadcast batch dims. */
START_TEST(matmul_view) {
  pe_mv_view v;
  pe_shape x = PE_SHAPE(2, 1, 5, 3), y = PE_SHAPE(4, 5, 7);
  ck_assert_ptr_null(pe_mv_plan(&x, &y, true, false, &v));
  ck_assert_int_eq(v.m, 3);
  ck_assert_int_eq(v.k, 5);
  ck_assert_int_eq(v.n, 7);
  ck_assert_int_eq(v.nb, 2);
  ck_assert_int_eq(v.ob[0], 2);
  ck_assert_int_eq(v.ob[1], 4);
  ck_assert_int_eq(v.yb[0], 1);
  pe_shape o = pe_mv_out_shape(&v), want = PE_SHAPE(2, 4, 3, 7);
  ck_assert(pe_shape_equal(&o, &want));
  ck_assert_str_eq(pe_mv_plan(&x, &y, false, false, &v), "contraction dims differ");
  pe_shape a = PE_SHAPE(3, 5, 2), b = PE_SHAPE(2, 2, 4);
  ck_assert_str_eq(pe_mv_plan(&a, &b, false, false, &v), "batch dims do not broadcast");
  pe_shape u = PE_SHAPE(5), w = PE_SHAPE(5);
  ck_assert_ptr_null(pe_mv_plan(&u, &w, true, true, &v)); /* flags ignored on vectors */
  o = pe_mv_out_shape(&v);
  pe_shape scalar = PE_SHAPE(1);
  ck_assert(pe_shape_equal(&o, &scalar));
}
END_TEST

/* The batch plan: no broadcast and a whole broadcast operand are one dim
 * (one GEMM); a mixed broadcast keeps two; dims of 1 drop. Every (c, a, b)
 * matrix triple the plan visits is the one numpy's broadcasting pairs. */
static void check_pairs(int nb, const int64_t *ob, const int64_t *ab, const int64_t *bb,
                        const pe_cu_batch *p) {
  int64_t total = 1;
  for (int i = 0; i < nb; i++) total *= ob[i];
  for (int64_t c = 0; c < total; c++) {
    /* numpy: the batch index of c, each operand's own index (1: 0). */
    int64_t r = c, ia = 0, ib = 0, sa = 1, sb = 1;
    for (int i = nb - 1; i >= 0; i--) {
      int64_t q = r % ob[i];
      r /= ob[i];
      ia += (ab[i] == 1 ? 0 : q) * sa;
      ib += (bb[i] == 1 ? 0 : q) * sb;
      sa *= ab[i];
      sb *= bb[i];
    }
    /* the plan: c's index over the merged dims */
    int64_t rr = c, pa = 0, pb = 0, pc = 0;
    for (int d = p->nd - 1; d >= 0; d--) {
      int64_t q = rr % p->n[d];
      rr /= p->n[d];
      pa += q * p->st[0][d];
      pb += q * p->st[1][d];
      pc += q * p->st[2][d];
    }
    ck_assert_int_eq(pc, c);
    ck_assert_int_eq(pa, ia);
    ck_assert_int_eq(pb, ib);
  }
}

START_TEST(batch_plan) {
  pe_cu_batch p;
  const int64_t ob[] = {2, 3, 4}, full[] = {2, 3, 4}, ones[] = {1, 1, 1}, mixed[] = {2, 1, 4};
  pe_cu_batch_plan(3, ob, full, full, &p);
  ck_assert_int_eq(p.nd, 1);
  ck_assert_int_eq(p.n[0], 24);
  check_pairs(3, ob, full, full, &p);
  pe_cu_batch_plan(3, ob, full, ones, &p);
  ck_assert_int_eq(p.nd, 1);
  ck_assert_int_eq(p.st[1][0], 0);
  check_pairs(3, ob, full, ones, &p);
  pe_cu_batch_plan(3, ob, mixed, full, &p);
  ck_assert_int_eq(p.nd, 3);
  check_pairs(3, ob, mixed, full, &p);
  const int64_t ob2[] = {2, 1, 3}, a2[] = {1, 1, 3}, b2[] = {2, 1, 1};
  pe_cu_batch_plan(3, ob2, a2, b2, &p);
  ck_assert_int_eq(p.nd, 2);
  check_pairs(3, ob2, a2, b2, &p);
  pe_cu_batch_plan(0, NULL, NULL, NULL, &p);
  ck_assert_int_eq(p.nd, 0);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("cuda_plan");
  TCase *t = tcase_create("host");
  tcase_add_test(t, dense_copy_merges_to_one_dim);
  tcase_add_test(t, transpose_plan);
  tcase_add_test(t, slice_window);
  tcase_add_test(t, matmul_view);
  tcase_add_test(t, batch_plan);
  suite_add_tcase(s, t);
  return s;
}

PE_CHECK_MAIN(suite)

#endif
