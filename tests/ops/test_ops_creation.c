/* Creation ops: fill_constant, uniform_random, gaussian_random, assign.
 *
 * Statistical checks use fixed seeds, so they are deterministic; the
 * tolerances are still chosen as about 6 standard errors of the estimate so
 * that they would hold for any seed (n = 1e5 samples). */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

static pe_op_desc *random_op(const char *type, int64_t n, int64_t seed, int dtype) {
  pe_op_desc *op = ph_op(type, NULL, "Out", "out", NULL);
  int64_t shape[] = {n};
  PE_CK_OK(pe_op_set_ints(op, "shape", 1, shape));
  PE_CK_OK(pe_op_set_int(op, "seed", seed));
  PE_CK_OK(pe_op_set_int(op, "dtype", dtype));
  return op;
}

/* --- fill_constant ----------------------------------------------------------- */

START_TEST(fill_constant_values_and_dtypes) {
  pe_scope *s = pe_scope_new(NULL);
  struct {
    int dtype;
    float value;
  } cases[] = {{PE_F32, 2.5f}, {PE_F64, -1.25f}, {PE_I32, -7.0f}, {PE_I64, 1e10f}, {PE_U8, 200.0f}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    pe_op_desc *op = ph_op("fill_constant", NULL, "Out", "out", NULL);
    int64_t shape[] = {2, 3};
    PE_CK_OK(pe_op_set_ints(op, "shape", 2, shape));
    PE_CK_OK(pe_op_set_float(op, "value", cases[c].value));
    PE_CK_OK(pe_op_set_int(op, "dtype", cases[c].dtype));
    PE_CK_OK(ph_run_op(s, op, NULL));
    pe_tensor *t = ph_get(s, "out");
    pe_shape want = PE_SHAPE(2, 3);
    ck_assert_int_eq(t->dtype, cases[c].dtype);
    ck_assert(pe_shape_equal(&t->shape, &want));
    for (int i = 0; i < 6; i++) switch (t->dtype) {
        case PE_F32: ck_assert(pe_f32(t)[i] == 2.5f); break;
        case PE_F64: ck_assert(((double *)t->data)[i] == -1.25); break;
        case PE_I32: ck_assert_int_eq(((int32_t *)t->data)[i], -7); break;
        case PE_I64: ck_assert_int_eq(pe_i64(t)[i], 10000000000LL); break;
        case PE_U8: ck_assert_uint_eq(((uint8_t *)t->data)[i], 200); break;
        default: ck_abort();
      }
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

START_TEST(fill_constant_rejects_bad_attrs) {
  pe_scope *s = pe_scope_new(NULL);
  pe_op_desc *op = ph_op("fill_constant", NULL, "Out", "out", NULL);
  int64_t batch[] = {-1, 3};
  PE_CK_OK(pe_op_set_ints(op, "shape", 2, batch));
  pe_meta m[1];
  expect_error(ph_infer_op(s, op, m, 1), PE_EATTR, "attribute 'shape' [-1,3] contains -1");
  int64_t ok_shape[] = {4};
  PE_CK_OK(pe_op_set_ints(op, "shape", 1, ok_shape));
  PE_CK_OK(pe_op_set_int(op, "dtype", PE_I32));
  PE_CK_OK(pe_op_set_float(op, "value", 1e10f));
  expect_error(ph_infer_op(s, op, m, 1), PE_EATTR, "does not fit dtype i32");
  PE_CK_OK(pe_op_set_int(op, "dtype", PE_F16));
  expect_error(ph_infer_op(s, op, m, 1), PE_EATTR, "attribute 'dtype' = 5");
  pe_op_desc_free(op);

  /* The random ops share the shape rule. */
  op = random_op("gaussian_random", 4, 0, PE_F32);
  PE_CK_OK(pe_op_set_ints(op, "shape", 2, batch));
  expect_error(ph_infer_op(s, op, m, 1), PE_EATTR, "'shape'");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* --- uniform_random / gaussian_random statistics -------------------------------- */

START_TEST(uniform_bounds_and_mean) {
  /* U[-2, 6): mean 2, sd 8/sqrt(12) = 2.31, standard error 0.0073 -> tol 0.05. */
  pe_scope *s = pe_scope_new(NULL);
  for (int dt = PE_F32; dt <= PE_F64; dt++) {
    pe_op_desc *op = random_op("uniform_random", 100000, 0, dt);
    PE_CK_OK(pe_op_set_float(op, "min", -2.0f));
    PE_CK_OK(pe_op_set_float(op, "max", 6.0f));
    pe_rng rng = {7, 0};
    PE_CK_OK(ph_run_op(s, op, &rng));
    pe_tensor *t = ph_get(s, "out");
    ck_assert_int_eq(t->dtype, dt);
    ck_assert_uint_eq(rng.offset, 100000); /* one counter per element */
    double sum = 0, lo = 1e9, hi = -1e9;
    for (int i = 0; i < 100000; i++) {
      double v = dt == PE_F32 ? pe_f32(t)[i] : ((double *)t->data)[i];
      ck_assert(v >= -2.0 && v < 6.0);
      sum += v;
      lo = fmin(lo, v);
      hi = fmax(hi, v);
    }
    ck_assert_double_eq_tol(sum / 100000, 2.0, 0.05);
    ck_assert(lo < -1.99 && hi > 5.99); /* the whole range is covered */
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

START_TEST(gaussian_mean_and_std) {
  /* N(3, 2^2), n = 1e5: standard error of the mean 2/316 = 0.0063 -> tol 0.04;
   * of the std 2/sqrt(2n) = 0.0045 -> tol 0.03. */
  pe_scope *s = pe_scope_new(NULL);
  for (int dt = PE_F32; dt <= PE_F64; dt++) {
    pe_op_desc *op = random_op("gaussian_random", 100000, 0, dt);
    PE_CK_OK(pe_op_set_float(op, "mean", 3.0f));
    PE_CK_OK(pe_op_set_float(op, "std", 2.0f));
    pe_rng rng = {11, 0};
    PE_CK_OK(ph_run_op(s, op, &rng));
    pe_tensor *t = ph_get(s, "out");
    ck_assert_int_eq(t->dtype, dt);
    double sum = 0, sq = 0;
    for (int i = 0; i < 100000; i++) {
      double v = dt == PE_F32 ? pe_f32(t)[i] : ((double *)t->data)[i];
      ck_assert(isfinite(v));
      sum += v;
      sq += v * v;
    }
    double mean = sum / 100000, sd = sqrt(sq / 100000 - mean * mean);
    ck_assert_double_eq_tol(mean, 3.0, 0.04);
    ck_assert_double_eq_tol(sd, 2.0, 0.03);
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
}
END_TEST

/* --- determinism ---------------------------------------------------------------- */

START_TEST(program_generator_draws_depend_on_offset) {
  pe_scope *s = pe_scope_new(NULL);
  pe_op_desc *op = random_op("uniform_random", 8, 0, PE_F32);
  float a[8], b[8];
  pe_rng rng = {99, 0};
  PE_CK_OK(ph_run_op(s, op, &rng));
  memcpy(a, ph_get(s, "out")->data, sizeof a);
  ck_assert_uint_eq(rng.offset, 8);
  PE_CK_OK(ph_run_op(s, op, &rng)); /* the generator moved on: new numbers */
  memcpy(b, ph_get(s, "out")->data, sizeof b);
  ck_assert(memcmp(a, b, sizeof a) != 0);
  /* Element i uses counter offset + i: starting at offset 3 shifts by 3. */
  rng = (pe_rng){99, 3};
  PE_CK_OK(ph_run_op(s, op, &rng));
  ck_assert(memcmp(a + 3, ph_get(s, "out")->data, 5 * sizeof(float)) == 0);
  rng = (pe_rng){99, 0};
  PE_CK_OK(ph_run_op(s, op, &rng));
  ck_assert(memcmp(a, ph_get(s, "out")->data, sizeof a) == 0);
  rng = (pe_rng){100, 0};
  PE_CK_OK(ph_run_op(s, op, &rng));
  ck_assert(memcmp(a, ph_get(s, "out")->data, sizeof a) != 0);
  pe_op_desc_free(op);

  /* gaussian_random uses two uniform counters per element, from an even start. */
  op = random_op("gaussian_random", 5, 0, PE_F32);
  rng = (pe_rng){99, 0};
  PE_CK_OK(ph_run_op(s, op, &rng));
  ck_assert_uint_eq(rng.offset, 10);
  rng = (pe_rng){99, 3};
  PE_CK_OK(ph_run_op(s, op, &rng));
  ck_assert_uint_eq(rng.offset, 14);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(seeded_op_draws_program_counters) {
  pe_device_ctx dev;
  PE_CK_OK(pe_device_ctx_init(&dev, pe_cpu_place(), 1));
  pe_scope *s = pe_scope_new(NULL);
  const char *types[] = {"uniform_random", "gaussian_random"};
  for (int ty = 0; ty < 2; ty++) {
    pe_op_desc *op = random_op(types[ty], 16, 42, PE_F32);
    pe_rng prog = {5, 0};
    float first[16], second[16];
    ph_op_inst *inst = ph_op_inst_new(op, &dev);
    PE_CK_OK(ph_op_inst_run(inst, s, &prog));
    memcpy(first, ph_get(s, "out")->data, sizeof first);
    ck_assert_ptr_null(inst->state);   /* no op-local generator: nothing to save */
    ck_assert_uint_gt(prog.offset, 0); /* the counters came from the program generator */
    PE_CK_OK(ph_op_inst_run(inst, s, &prog));
    memcpy(second, ph_get(s, "out")->data, sizeof second);
    ck_assert(memcmp(first, second, sizeof first) != 0); /* it advanced across runs */
    ph_op_inst_free(inst);

    /* The same generator position replays the same sequence. */
    inst = ph_op_inst_new(op, &dev);
    prog.offset = 0;
    PE_CK_OK(ph_op_inst_run(inst, s, &prog));
    ck_assert(memcmp(first, ph_get(s, "out")->data, sizeof first) == 0);
    PE_CK_OK(ph_op_inst_run(inst, s, &prog));
    ck_assert(memcmp(second, ph_get(s, "out")->data, sizeof second) == 0);
    ph_op_inst_free(inst);

    /* At the same position, the program's seed (0) and another op seed
     * give other numbers. */
    const int64_t other_seeds[] = {0, 43};
    for (int k = 0; k < 2; k++) {
      PE_CK_OK(pe_op_set_int(op, "seed", other_seeds[k]));
      inst = ph_op_inst_new(op, &dev);
      prog.offset = 0;
      PE_CK_OK(ph_op_inst_run(inst, s, &prog));
      ck_assert(memcmp(first, ph_get(s, "out")->data, sizeof first) != 0);
      ph_op_inst_free(inst);
    }
    pe_op_desc_free(op);
  }
  pe_scope_free(s);
  pe_device_ctx_destroy(&dev);
}
END_TEST

START_TEST(results_do_not_depend_on_thread_count) {
  /* 2e5 elements: above the size where the kernels go parallel. */
  pe_device_ctx one, two;
  PE_CK_OK(pe_device_ctx_init(&one, pe_cpu_place(), 1));
  PE_CK_OK(pe_device_ctx_init(&two, pe_cpu_place(), 2));
  const char *types[] = {"uniform_random", "gaussian_random"};
  for (int ty = 0; ty < 2; ty++) {
    pe_op_desc *op = random_op(types[ty], 200000, 0, PE_F32);
    pe_scope *sa = pe_scope_new(NULL), *sb = pe_scope_new(NULL);
    pe_rng ra = {3, 17}, rb = {3, 17};
    ph_op_inst *ia = ph_op_inst_new(op, &one), *ib = ph_op_inst_new(op, &two);
    PE_CK_OK(ph_op_inst_run(ia, sa, &ra));
    PE_CK_OK(ph_op_inst_run(ib, sb, &rb));
    pe_tensor *a = ph_get(sa, "out"), *b = ph_get(sb, "out");
    ck_assert(memcmp(a->data, b->data, pe_tensor_bytes(a)) == 0);
    ck_assert_uint_eq(ra.offset, rb.offset);
    ph_op_inst_free(ia);
    ph_op_inst_free(ib);
    pe_scope_free(sa);
    pe_scope_free(sb);
    pe_op_desc_free(op);
  }
  pe_device_ctx_destroy(&one);
  pe_device_ctx_destroy(&two);
}
END_TEST

/* --- assign ---------------------------------------------------------------------- */

START_TEST(assign_copies_and_differentiates) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(3, 4), -1, 1, 5);
  pe_op_desc *op = ph_op("assign", "X", "x", NULL, "Out", "y", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *x = ph_get(s, "x"), *y = ph_get(s, "y");
  ck_assert(pe_shape_equal(&x->shape, &y->shape));
  ck_assert(memcmp(x->data, y->data, pe_tensor_bytes(x)) == 0);

  /* Out is linear in X with slope 1: central differences with eps 1e-2 are
   * exact up to f32 rounding of the ~12-term weighted sum (~1e-5). */
  const char *outs[] = {"y"}, *wrt[] = {"x"};
  ph_grad_report rep;
  PE_CK_OK(ph_grad_check(s, op, outs, 1, wrt, 1, 1e-2, 0, &rep));
  ck_assert_int_eq(rep.checked, 12);
  ck_assert_msg(rep.max_err < 1e-3, "max_err %g at %s[%lld]: analytic %g numeric %g", rep.max_err,
                rep.worst, (long long)rep.worst_index, rep.analytic, rep.numeric);
  pe_op_desc_free(op);

  /* Any dtype is copied bytewise. */
  int64_t iv[] = {1, -2, 3};
  ph_set_i64(s, "i", PE_SHAPE(3), iv);
  op = ph_op("assign", "X", "i", NULL, "Out", "j", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  ck_assert_int_eq(ph_get(s, "j")->dtype, PE_I64);
  ck_assert(memcmp(pe_i64(ph_get(s, "j")), iv, sizeof iv) == 0);
  pe_op_desc_free(op);

  /* A pruned Out@GRAD reads as zeros. */
  op = ph_op("assign_grad", "X", "x", NULL, "X@GRAD", "dx", NULL);
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *dx = ph_get(s, "dx");
  ck_assert(pe_shape_equal(&dx->shape, &x->shape));
  for (int i = 0; i < 12; i++) ck_assert(pe_f32(dx)[i] == 0.0f);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *creation_suite(void) {
  Suite *s = suite_create("ops_creation");
  TCase *tc = tcase_create("creation");
  tcase_add_test(tc, fill_constant_values_and_dtypes);
  tcase_add_test(tc, fill_constant_rejects_bad_attrs);
  tcase_add_test(tc, uniform_bounds_and_mean);
  tcase_add_test(tc, gaussian_mean_and_std);
  tcase_add_test(tc, program_generator_draws_depend_on_offset);
  tcase_add_test(tc, seeded_op_draws_program_counters);
  tcase_add_test(tc, results_do_not_depend_on_thread_count);
  tcase_add_test(tc, assign_copies_and_differentiates);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(creation_suite)
