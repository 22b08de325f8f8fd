/* oneDNN's pool2d and its gradient: max and average pooling against
 * hand-computed numbers (written out), the max gradient's rule for ties,
 * shape inference. Gradients use the checker in ops_dnnl_helpers.h. */
#include <check.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "ops_dnnl_helpers.h"

#define FWD_TOL 1e-5

static const float k_1to16[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

static pe_op_desc *pool_op(const char *type, int64_t k, int64_t s, int64_t p, bool exclusive) {
  pe_op_desc *op = ph_op("pool2d", "X", "x", NULL, "Out", "out", NULL);
  pe_op_set_string(op, "pooling_type", type);
  pe_op_set_ints(op, "ksize", 2, (int64_t[]){k, k});
  pe_op_set_ints(op, "strides", 2, (int64_t[]){s, s});
  pe_op_set_ints(op, "paddings", 2, (int64_t[]){p, p});
  pe_op_set_bool(op, "exclusive", exclusive);
  return op;
}

static void pool_expect(pe_scope *s, pe_op_desc *op, pe_shape shape, const float *want,
                        const char *what) {
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *out = ph_get(s, "out");
  ck_assert_msg(pe_shape_equal(&out->shape, &shape), "%s: wrong shape", what);
  dt_expect_close(pe_f32(out), want, pe_shape_numel(&shape), FWD_TOL, what);
  pe_op_desc_free(op);
}

START_TEST(pool_written_out) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(1, 1, 4, 4), k_1to16);
  pool_expect(s, pool_op("max", 2, 2, 0, true), PE_SHAPE(1, 1, 2, 2), (float[]){6, 8, 14, 16},
              "max 2x2");
  pool_expect(s, pool_op("avg", 2, 2, 0, true), PE_SHAPE(1, 1, 2, 2),
              (float[]){3.5f, 5.5f, 11.5f, 13.5f}, "avg 2x2");
  /* 3x3 stride 2 pad 1: windows start at -1 and 1. */
  pool_expect(s, pool_op("max", 3, 2, 1, true), PE_SHAPE(1, 1, 2, 2), (float[]){6, 8, 14, 16},
              "max pad");
  /* Exclusive: (0,0) averages {1,2,5,6} = 3.5; (0,1) {2,3,4,6,7,8} = 5;
   * (1,0) {5,6,9,10,13,14} = 9.5; (1,1) the 3x3 from 6: 11. */
  pool_expect(s, pool_op("avg", 3, 2, 1, true), PE_SHAPE(1, 1, 2, 2), (float[]){3.5f, 5, 9.5f, 11},
              "avg exclusive");
  /* Inclusive: the same sums over 9. */
  pool_expect(s, pool_op("avg", 3, 2, 1, false), PE_SHAPE(1, 1, 2, 2),
              (float[]){14 / 9.f, 30 / 9.f, 57 / 9.f, 99 / 9.f}, "avg inclusive");
  /* Global: ksize ignored, whole plane. */
  pe_op_desc *op = pool_op("avg", 2, 2, 0, true);
  pe_op_set_bool(op, "global_pooling", true);
  pool_expect(s, op, PE_SHAPE(1, 1, 1, 1), (float[]){8.5f}, "global avg");
  op = pool_op("max", 2, 2, 0, true);
  pe_op_set_bool(op, "global_pooling", true);
  pool_expect(s, op, PE_SHAPE(1, 1, 1, 1), (float[]){16}, "global max");
  pe_scope_free(s);
}
END_TEST

/* Distinct values 0.05 apart (a permutation), so a ±1e-3 step never changes
 * a max window's argmax. */
static void set_distinct(pe_scope *s, const char *name, pe_shape shape) {
  pe_tensor *t = ph_set_f32(s, name, shape, NULL);
  int64_t n = pe_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) pe_f32(t)[i] = 0.05f * (float)((i * 37) % n) - 2.0f;
}

START_TEST(pool_grad_numeric) {
  const char *outs[] = {"out"}, *wrt[] = {"x"};
  struct {
    const char *type;
    int64_t k, s, p;
    bool exclusive, global;
  } cases[] = {
      {"max", 2, 2, 0, true, false},  {"max", 3, 2, 1, true, false}, {"avg", 3, 2, 1, true, false},
      {"avg", 3, 1, 1, false, false}, {"avg", 1, 1, 0, true, true},  {"max", 1, 1, 0, true, true},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    pe_scope *s = pe_scope_new(NULL);
    set_distinct(s, "x", PE_SHAPE(2, 3, 5, 5)); /* 150 values, 37 coprime to 150 */
    pe_op_desc *op = pool_op(cases[k].type, cases[k].k, cases[k].s, cases[k].p, cases[k].exclusive);
    pe_op_set_bool(op, "global_pooling", cases[k].global);
    dt_grad_ok(s, op, outs, 1, wrt, 1, 0);
    pe_op_desc_free(op);
    pe_scope_free(s);
  }
}
END_TEST

/* Max-pool backward routes each output gradient to its window's argmax. */
/* Max-pool gradient, written out: with Out (the direct loop, Paddle's
 * rule) and without it (oneDNN's backward on a recomputed workspace); and
 * a tie, which goes to the first element of the window in row-major order.
 * Stale values in dx must be overwritten. */
START_TEST(pool_max_grad_written_out) {
  static const float want[16] = {0, 1, 0, 0, 0, 0, 2, 0, 3, 0, 0, 0, 0, 0, 0, 4};
  for (int with_out = 1; with_out >= 0; with_out--) {
    pe_scope *s = pe_scope_new(NULL);
    ph_set_f32(s, "x", PE_SHAPE(1, 1, 4, 4),
               (float[]){1, 9, 2, 3, 4, 5, 8, 6, 7, 1, 2, 2, 0, 3, 1, 4});
    ph_set_f32(s, "out", PE_SHAPE(1, 1, 2, 2), (float[]){9, 8, 7, 4});
    ph_set_f32(s, "dout", PE_SHAPE(1, 1, 2, 2), (float[]){1, 2, 3, 4});
    ph_set_uniform(s, "dx", PE_SHAPE(1, 1, 4, 4), 5, 6, 1);
    pe_op_desc *op = ph_op("pool2d_grad", "X", "x", "Out@GRAD", "dout", NULL, "X@GRAD", "dx", NULL);
    if (with_out) pe_op_set_input(op, "Out", 1, (const char *[]){"out"});
    pe_op_set_ints(op, "ksize", 2, (int64_t[]){2, 2});
    pe_op_set_ints(op, "strides", 2, (int64_t[]){2, 2});
    PE_CK_OK(ph_run_op(s, op, NULL));
    dt_expect_close(pe_f32(ph_get(s, "dx")), want, 16, 0, with_out ? "max dx (Out)" : "max dx");
    pe_op_desc_free(op);
    pe_scope_free(s);
  }
  /* Ties, 3x3 windows at stride 2 with padding 1 (overlapping: accumulate). */
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(1, 1, 3, 3), (float[]){5, 5, 1, 5, 5, 1, 1, 1, 1});
  ph_set_f32(s, "out", PE_SHAPE(1, 1, 2, 2), (float[]){5, 5, 5, 5});
  ph_set_f32(s, "dout", PE_SHAPE(1, 1, 2, 2), (float[]){1, 2, 3, 4});
  pe_op_desc *op =
      ph_op("pool2d_grad", "X", "x", "Out", "out", "Out@GRAD", "dout", NULL, "X@GRAD", "dx", NULL);
  pe_op_set_ints(op, "ksize", 2, (int64_t[]){3, 3});
  pe_op_set_ints(op, "strides", 2, (int64_t[]){2, 2});
  pe_op_set_ints(op, "paddings", 2, (int64_t[]){1, 1});
  PE_CK_OK(ph_run_op(s, op, NULL));
  /* Windows (clipped to the plane): (0,0) rows 0-1 cols 0-1, first 5 at
   * [0][0]; (0,1) rows 0-1 cols 1-2: [0][1]; (1,0) rows 1-2 cols 0-1:
   * [1][0]; (1,1) rows 1-2 cols 1-2: [1][1]. */
  dt_expect_close(pe_f32(ph_get(s, "dx")), (float[]){1, 2, 0, 3, 4, 0, 0, 0, 0}, 9, 0,
                  "max dx ties");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* 2x2 windows at stride 2 (the CNN's pools: their own loop, pool.c) against
 * Paddle's rule written here, on values of three levels (ties in many
 * windows), even planes and odd ones (the last row and column in no
 * window: zero gradient), stale values in dx. */
START_TEST(pool_max_grad_2x2_ties_match_rule) {
  const int64_t dims[][4] = {{2, 3, 6, 8}, {2, 2, 5, 7}};
  for (int k = 0; k < 2; k++) {
    const int64_t *d = dims[k], h = d[2], w = d[3], oh = h / 2, ow = w / 2, planes = d[0] * d[1];
    pe_scope *s = pe_scope_new(NULL);
    pe_tensor *x = ph_set_uniform(s, "x", pe_shape_make(4, d), 0, 1, 3);
    for (int64_t i = 0; i < pe_tensor_numel(x); i++)
      pe_f32(x)[i] = (float)((((uint64_t)i * 2654435761u) >> 7) % 3);
    pe_shape os = PE_SHAPE(d[0], d[1], oh, ow);
    ph_set_uniform(s, "dout", os, 1, 2, 4);
    ph_set_uniform(s, "dx", pe_shape_make(4, d), 5, 6, 5);
    pe_op_desc *f = pool_op("max", 2, 2, 0, true);
    PE_CK_OK(ph_run_op(s, f, NULL));
    pe_op_desc_free(f);
    pe_op_desc *op = ph_op("pool2d_grad", "X", "x", "Out", "out", "Out@GRAD", "dout", NULL,
                           "X@GRAD", "dx", NULL);
    pe_op_set_ints(op, "ksize", 2, (int64_t[]){2, 2});
    pe_op_set_ints(op, "strides", 2, (int64_t[]){2, 2});
    PE_CK_OK(ph_run_op(s, op, NULL));
    pe_op_desc_free(op);
    float want[2 * 3 * 6 * 8] = {0};
    const float *xv = pe_f32(x), *ov = pe_f32(ph_get(s, "out")), *gv = pe_f32(ph_get(s, "dout"));
    int64_t ties = 0;
    for (int64_t p = 0; p < planes; p++)
      for (int64_t i = 0; i < oh; i++)
        for (int64_t j = 0; j < ow; j++) {
          float m = ov[(p * oh + i) * ow + j];
          int64_t first = -1, hits = 0;
          for (int64_t r = 2 * i; r < 2 * i + 2; r++)
            for (int64_t q = 2 * j; q < 2 * j + 2; q++)
              if (xv[(p * h + r) * w + q] == m) {
                if (first < 0) first = (p * h + r) * w + q;
                hits++;
              }
          ck_assert_int_ge(first, 0);
          want[first] = gv[(p * oh + i) * ow + j];
          ties += hits > 1;
        }
    ck_assert_int_gt(ties, 0);
    dt_expect_close(pe_f32(ph_get(s, "dx")), want, planes * h * w, 0,
                    k ? "2x2 dx, odd plane" : "2x2 dx");
    pe_scope_free(s);
  }
}
END_TEST

START_TEST(pool_infer) {
  pe_op_desc *op = pool_op("max", 2, 2, 0, true);
  dt_var ok[] = {{"x", PE_F32, PE_SHAPE(-1, 8, 28, 28)}};
  pe_meta m;
  PE_CK_OK(dt_infer(op, ok, 1, &m));
  expect_shape(&m.shape, PE_SHAPE(-1, 8, 14, 14));
  pe_op_set_string(op, "pooling_type", "median");
  dt_expect_infer_error(op, ok, 1, PE_EATTR, "median", NULL);
  pe_op_desc_free(op);
  op = pool_op("avg", 3, 1, 3, true); /* padding >= window */
  dt_expect_infer_error(op, ok, 1, PE_EATTR, "paddings", NULL);
  pe_op_desc_free(op);
  op = pool_op("avg", 5, 1, 0, true);
  dt_var small[] = {{"x", PE_F32, PE_SHAPE(2, 1, 3, 3)}};
  dt_expect_infer_error(op, small, 1, PE_ESHAPE, "'x'", "[2,1,3,3]", NULL);
  pe_op_set_bool(op, "global_pooling", true);
  PE_CK_OK(dt_infer(op, ok, 1, &m));
  expect_shape(&m.shape, PE_SHAPE(-1, 8, 1, 1));
  pe_op_desc_free(op);
  op = ph_op("pool2d", "X", "x", NULL, "Out", "out", NULL); /* ksize missing */
  dt_expect_infer_error(op, ok, 1, PE_EATTR, "ksize", NULL);
  pe_op_desc_free(op);
  /* A window and padding past int64_t arithmetic: 2 * padding overflows. */
  const int64_t huge = INT64_C(1) << 62;
  op = pool_op("max", INT64_MAX, 1, huge, true);
  dt_expect_infer_error(op, ok, 1, PE_EATTR, "pool2d",
                        "paddings [4611686018427387904,4611686018427387904] are too large for X "
                        "'x' [-1,8,28,28]",
                        NULL);
  pe_op_desc_free(op);
}
END_TEST

/* The gradient's Out and Out@GRAD must have the pooled shape of X: the
 * kernels read them by it (found by the CUDA kernel test, whose stale
 * Out@GRAD made cuDNN read past the buffer). */
START_TEST(pool_grad_infer_checks_out_shapes) {
  pe_op_desc *op =
      ph_op("pool2d_grad", "X", "x", "Out", "out", "Out@GRAD", "dout", NULL, "X@GRAD", "dx", NULL);
  const int64_t two[] = {2, 2};
  PE_CK_OK(pe_op_set_string(op, "pooling_type", "max"));
  PE_CK_OK(pe_op_set_ints(op, "ksize", 2, two));
  PE_CK_OK(pe_op_set_ints(op, "strides", 2, two));
  dt_var ok[] = {{"x", PE_F32, PE_SHAPE(-1, 3, 10, 9)},
                 {"out", PE_F32, PE_SHAPE(-1, 3, 5, 4)},
                 {"dout", PE_F32, PE_SHAPE(-1, 3, 5, 4)}};
  pe_meta m;
  PE_CK_OK(dt_infer(op, ok, 3, &m));
  expect_shape(&m.shape, PE_SHAPE(-1, 3, 10, 9));
  dt_var bad_dout[] = {ok[0], ok[1], {"dout", PE_F32, PE_SHAPE(2, 3, 10, 9)}};
  dt_expect_infer_error(op, bad_dout, 3, PE_ESHAPE, "pool2d_grad", "Out@GRAD 'dout'", "[2,3,10,9]",
                        "[-1,3,5,4]", "'x'", NULL);
  dt_var bad_out[] = {ok[0], {"out", PE_F32, PE_SHAPE(-1, 3, 4, 4)}, ok[2]};
  dt_expect_infer_error(op, bad_out, 3, PE_ESHAPE, "Out 'out'", "[-1,3,4,4]", NULL);
  pe_op_desc_free(op);
}
END_TEST

/* max pool2d_grad (3 primitives with the workspace) reuses its entries
 * across calls, with the same result. */
START_TEST(pool_grad_entries_reused) {
  pe_device_ctx dev;
  PE_CK_OK(pe_device_ctx_init(&dev, pe_cpu_place(), 0));
  pe_device_ctx_bind(&dev);
  pe_scope *s = pe_scope_new(NULL);
  set_distinct(s, "x", PE_SHAPE(2, 2, 6, 6));
  ph_set_uniform(s, "dout", PE_SHAPE(2, 2, 3, 3), -1, 1, 93);
  pe_op_desc *op = ph_op("pool2d_grad", "X", "x", "Out@GRAD", "dout", NULL, "X@GRAD", "dx", NULL);
  pe_op_set_ints(op, "ksize", 2, (int64_t[]){2, 2});
  pe_op_set_ints(op, "strides", 2, (int64_t[]){2, 2});
  ph_op_inst *inst = ph_op_inst_new(op, &dev);
  PE_CK_OK(ph_op_inst_run(inst, s, NULL));
  float first[144];
  memcpy(first, pe_f32(ph_get(s, "dx")), sizeof first);
  PE_CK_OK(ph_op_inst_run(inst, s, NULL));
  dt_expect_close(pe_f32(ph_get(s, "dx")), first, 144, 0, "same dx on reuse");
  pe_dnnl_cache_stats st = pe_dnnl_cache_stats_of(inst->state);
  ck_assert_uint_eq(st.builds, 1);
  ck_assert_uint_eq(st.hits, 1);
  ph_op_inst_free(inst);
  pe_op_desc_free(op);
  pe_scope_free(s);
  pe_device_ctx_destroy(&dev);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ops_dnnl_pool");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, pool_written_out);
  tcase_add_test(tc, pool_grad_numeric);
  tcase_add_test(tc, pool_max_grad_written_out);
  tcase_add_test(tc, pool_max_grad_2x2_ties_match_rule);
  tcase_add_test(tc, pool_infer);
  tcase_add_test(tc, pool_grad_infer_checks_out_shapes);
  tcase_add_test(tc, pool_grad_entries_reused);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
