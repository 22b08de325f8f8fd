/* lr_schedule: every kind stepped from a zero counter against rates worked
 * out by hand (the comments), the counter advancing in place, the counter's
 * edge values, and the attribute and inference errors. The rate is computed
 * in double and rounded once to f32, so each expected rate is checked to one
 * f32 ulp of O(1) values (1e-7 relative). */
#include <check.h>
#include <math.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "test_assert.h"

static pe_op_desc *sched_op(const char *kind, float base) {
  pe_op_desc *op =
      ph_op("lr_schedule", "Step", "c", NULL, "StepOut", "c", "LearningRate", "lr", NULL);
  PE_CK_OK(pe_op_set_string(op, "schedule", kind));
  PE_CK_OK(pe_op_set_float(op, "base_lr", base));
  return op;
}

/* Run op n times from counter 0; the rate of run i must be want[i] and the
 * counter i + 1 after it. */
static void expect_rates(pe_op_desc *op, const double *want, int n) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_i64(s, "c", PE_SHAPE(1), (int64_t[]){0});
  for (int i = 0; i < n; i++) {
    PE_CK_OK(ph_run_op(s, op, NULL));
    float lr = pe_f32(ph_get(s, "lr"))[0];
    ck_assert_msg(fabs(lr - want[i]) <= 1e-7 * fabs(want[i]) + 1e-12,
                  "%s step %d: lr %.9g, want %.9g",
                  pe_attr_s(pe_op_lookup("lr_schedule"), op, "schedule"), i, lr, want[i]);
    ck_assert_int_eq(((int64_t *)ph_get(s, "c")->data)[0], i + 1);
  }
  pe_scope_free(s);
  pe_op_desc_free(op);
}

START_TEST(constant_with_warmup) {
  /* base 0.1, warmup 4: 0.1 * (s + 1) / 4, then 0.1. */
  pe_op_desc *op = sched_op("constant", 0.1f);
  PE_CK_OK(pe_op_set_long(op, "warmup_steps", 4));
  expect_rates(op, (double[]){0.025f, 0.05f, 0.075f, 0.1f, 0.1f, 0.1f}, 6);
}
END_TEST

START_TEST(step_decay) {
  /* base 1, every 3 steps times 0.5. */
  pe_op_desc *op = sched_op("step", 1.0f);
  PE_CK_OK(pe_op_set_long(op, "decay_steps", 3));
  PE_CK_OK(pe_op_set_float(op, "gamma", 0.5f));
  expect_rates(op, (double[]){1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25}, 8);
}
END_TEST

START_TEST(multistep_decay) {
  /* base 2, milestones 2 and 5, gamma 0.1 (the default when unset). */
  pe_op_desc *op = sched_op("multistep", 2.0f);
  PE_CK_OK(pe_op_set_ints(op, "milestones", 2, (int64_t[]){2, 5}));
  expect_rates(op, (double[]){2, 2, 0.2f, 0.2f, 0.2f, 0.02f, 0.02f}, 7);
}
END_TEST

START_TEST(exponential_decay) {
  /* base 1, gamma 0.5 per 2 steps: 0.5^(s/2). */
  pe_op_desc *op = sched_op("exponential", 1.0f);
  PE_CK_OK(pe_op_set_long(op, "decay_steps", 2));
  PE_CK_OK(pe_op_set_float(op, "gamma", 0.5f));
  expect_rates(op, (double[]){1, 0.70710678f, 0.5, 0.35355339f, 0.25}, 5);
}
END_TEST

START_TEST(cosine_decay) {
  /* base 1, min 0, T 4: (1 + cos(pi s / 4)) / 2 = 1, (1 + r2/2)/2, 1/2,
   * (1 - r2/2)/2, 0; then it stays at min_lr. */
  pe_op_desc *op = sched_op("cosine", 1.0f);
  PE_CK_OK(pe_op_set_long(op, "decay_steps", 4));
  expect_rates(op, (double[]){1, 0.85355339f, 0.5, 0.14644661f, 0, 0, 0}, 7);
  /* min_lr 0.2 lifts the curve: 0.2 + 0.8 * the above. */
  op = sched_op("cosine", 1.0f);
  PE_CK_OK(pe_op_set_long(op, "decay_steps", 4));
  PE_CK_OK(pe_op_set_float(op, "min_lr", 0.2f));
  expect_rates(op, (double[]){1, 0.88284271f, 0.6f, 0.31715729f, 0.2f, 0.2f}, 6);
}
END_TEST

START_TEST(linear_decay) {
  /* base 1 to 0.2 over 4 steps. */
  pe_op_desc *op = sched_op("linear", 1.0f);
  PE_CK_OK(pe_op_set_long(op, "decay_steps", 4));
  PE_CK_OK(pe_op_set_float(op, "min_lr", 0.2f));
  expect_rates(op, (double[]){1, 0.8f, 0.6f, 0.4f, 0.2f, 0.2f}, 6);
}
END_TEST

START_TEST(warmup_then_cosine) {
  /* warmup 2 (0.5, 1), then cosine with T 2 counted from the warmup's end:
   * t = 0, 1, 2, ... -> 1, 0.5, 0, 0. */
  pe_op_desc *op = sched_op("cosine", 1.0f);
  PE_CK_OK(pe_op_set_long(op, "warmup_steps", 2));
  PE_CK_OK(pe_op_set_long(op, "decay_steps", 2));
  expect_rates(op, (double[]){0.5, 1, 1, 0.5, 0, 0}, 6);
}
END_TEST

START_TEST(counter_edges) {
  /* The counter is model state a client may set: a later value continues
   * the schedule there, a negative one counts as 0. */
  pe_scope *s = pe_scope_new(NULL);
  pe_op_desc *op = sched_op("step", 1.0f);
  PE_CK_OK(pe_op_set_long(op, "decay_steps", 10));
  PE_CK_OK(pe_op_set_float(op, "gamma", 0.5f));
  ph_set_i64(s, "c", PE_SHAPE(1), (int64_t[]){25});
  PE_CK_OK(ph_run_op(s, op, NULL));
  ck_assert_float_eq(pe_f32(ph_get(s, "lr"))[0], 0.25f);
  ck_assert_int_eq(((int64_t *)ph_get(s, "c")->data)[0], 26);
  ph_set_i64(s, "c", PE_SHAPE(1), (int64_t[]){-7});
  PE_CK_OK(ph_run_op(s, op, NULL));
  ck_assert_float_eq(pe_f32(ph_get(s, "lr"))[0], 1.0f);
  ck_assert_int_eq(((int64_t *)ph_get(s, "c")->data)[0], 1);
  /* Far past any decay the rate underflows to 0; the counter saturates. */
  ph_set_i64(s, "c", PE_SHAPE(1), (int64_t[]){INT64_MAX});
  PE_CK_OK(ph_run_op(s, op, NULL));
  ck_assert_float_eq(pe_f32(ph_get(s, "lr"))[0], 0.0f);
  ck_assert(((int64_t *)ph_get(s, "c")->data)[0] == INT64_MAX);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(inference) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_i64(s, "c", PE_SHAPE(1), (int64_t[]){0});
  pe_meta m[2];
  pe_op_desc *op = sched_op("constant", 0.1f);
  PE_CK_OK(ph_infer_op(s, op, m, 2));
  ck_assert(m[0].dtype == PE_I64 && m[0].shape.ndim == 1 && m[0].shape.d[0] == 1);
  ck_assert(m[1].dtype == PE_F32 && m[1].shape.ndim == 1 && m[1].shape.d[0] == 1);
  /* The counter must be [1] int64. */
  ph_set_f32(s, "c", PE_SHAPE(1), (float[]){0});
  expect_errors(ph_infer_op(s, op, m, 2), PE_EDTYPE, "lr_schedule",
                "Step 'c' is f32 [1]; it must be [1] int64", (const char *)NULL);
  ph_set_i64(s, "c", PE_SHAPE(2), (int64_t[]){0, 0});
  expect_error(ph_run_op(s, op, NULL), PE_ESHAPE, "Step 'c' is i64 [2]");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* The op with `kind` and one attribute set must fail inference with `needle`. */
static void expect_attr_error(const char *kind, float base, const char *attr, double v,
                              const char *needle) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_i64(s, "c", PE_SHAPE(1), (int64_t[]){0});
  pe_op_desc *op = sched_op(kind, base);
  if (attr && (!strcmp(attr, "decay_steps") || !strcmp(attr, "warmup_steps")))
    PE_CK_OK(pe_op_set_long(op, attr, (int64_t)v));
  else if (attr)
    PE_CK_OK(pe_op_set_float(op, attr, (float)v));
  if (!strcmp(kind, "cosine") && (!attr || strcmp(attr, "decay_steps")))
    PE_CK_OK(pe_op_set_long(op, "decay_steps", 10));
  pe_meta m[2];
  expect_errors(ph_infer_op(s, op, m, 2), PE_EATTR, "lr_schedule", needle, (const char *)NULL);
  expect_error(ph_run_op(s, op, NULL), PE_EATTR, needle);
  pe_op_desc_free(op);
  pe_scope_free(s);
}

START_TEST(attribute_errors) {
  expect_attr_error("warm", 0.1f, NULL, 0, "schedule = 'warm' unknown (constant, step");
  expect_attr_error("constant", 0, NULL, 0, "learning rate 0 must be finite and > 0");
  expect_attr_error("constant", 0.1f, "warmup_steps", -1, "warmup_steps -1 must be >= 0");
  expect_attr_error("step", 0.1f, NULL, 0, "step: decay_steps must be > 0");
  expect_attr_error("linear", 0.1f, NULL, 0, "linear: decay_steps must be > 0");
  expect_attr_error("cosine", 0.1f, "decay_steps", 0, "cosine: decay_steps must be > 0");
  expect_attr_error("cosine", 0.1f, "min_lr", 0.1, "min_lr 0.1 must be in [0, learning rate");
  expect_attr_error("cosine", 0.1f, "min_lr", -0.01, "min_lr -0.01");
  expect_attr_error("exponential", 0.1f, NULL, 0, "exponential: gamma 0 must be in (0, 1]");
  expect_attr_error("exponential", 0.1f, "gamma", 1.5, "gamma 1.5 must be in (0, 1]");
  expect_attr_error("multistep", 0.1f, NULL, 0, "multistep: no milestones");

  pe_scope *s = pe_scope_new(NULL);
  ph_set_i64(s, "c", PE_SHAPE(1), (int64_t[]){0});
  pe_meta m[2];
  pe_op_desc *op = sched_op("multistep", 0.1f);
  PE_CK_OK(pe_op_set_ints(op, "milestones", 3, (int64_t[]){5, 5, 9}));
  expect_error(ph_infer_op(s, op, m, 2), PE_EATTR, "milestone 1 (5) must be > 0 and greater");
  PE_CK_OK(pe_op_set_ints(op, "milestones", 1, (int64_t[]){0}));
  expect_error(ph_infer_op(s, op, m, 2), PE_EATTR, "milestone 0 (0)");
  int64_t many[PE_LR_MAX_MILESTONES + 1];
  for (int i = 0; i <= PE_LR_MAX_MILESTONES; i++) many[i] = i + 1;
  PE_CK_OK(pe_op_set_ints(op, "milestones", PE_LR_MAX_MILESTONES + 1, many));
  expect_error(ph_infer_op(s, op, m, 2), PE_EATTR, "milestones: 33 values (at most 32)");
  pe_op_desc_free(op);
  op = sched_op("step", 0.1f);
  PE_CK_OK(pe_op_set_long(op, "decay_steps", 5));
  PE_CK_OK(pe_op_set_ints(op, "milestones", 1, (int64_t[]){3}));
  expect_error(ph_infer_op(s, op, m, 2), PE_EATTR, "step: milestones are for multistep only");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

static Suite *schedule_suite(void) {
  Suite *s = suite_create("ops_schedule");
  TCase *tc = tcase_create("schedule");
  tcase_add_test(tc, constant_with_warmup);
  tcase_add_test(tc, step_decay);
  tcase_add_test(tc, multistep_decay);
  tcase_add_test(tc, exponential_decay);
  tcase_add_test(tc, cosine_decay);
  tcase_add_test(tc, linear_decay);
  tcase_add_test(tc, warmup_then_cosine);
  tcase_add_test(tc, counter_edges);
  tcase_add_test(tc, inference);
  tcase_add_test(tc, attribute_errors);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(schedule_suite)
