/* Program validation: one test per kind of invalid program, each checking
 * its own error code and that the message names the block, the op index and
 * type, the variable and the shapes; a valid program passes and has its
 * shapes filled in; the pass manager. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check_main.h"
#include "compiler/pass.h"
#include "compiler/validate.h"
#include "ops/registry.h"
#include "prog_util.h"

/* main block only: x feed [-1,4] f32. */
static pe_program *new_program(pe_block **main) {
  pe_program *p = pe_program_new();
  PU_OK(pe_program_add_block(p, -1, main));
  pu_feed(*main, "x", PE_F32, PE_SHAPE(-1, 4));
  return p;
}

START_TEST(valid_program_gets_shapes) {
  pe_block *m;
  pe_program *p = new_program(&m);
  pu_param(m, "w", PE_SHAPE(4, 3));
  pu_param(m, "b", PE_SHAPE(3));
  pe_var_desc *h = pu_var(m, "h", PE_F32, NULL);
  pe_var_desc *y = pu_var(m, "y", PE_F32, NULL);
  pe_var_desc *z = pu_var(m, "z", PE_F32, NULL);
  pe_var_desc *loss = pu_var(m, "loss", PE_F32, NULL);
  pu_op(m, "matmul", "X", "x", "Y", "w", NULL, "Out", "h", NULL);
  pe_op_desc *add = pu_op(m, "elementwise_add", "X", "h", "Y", "b", NULL, "Out", "y", NULL);
  PU_OK(pe_op_set_long(add, "axis", 1)); /* LONG accepted for an INT attribute */
  pu_op(m, "relu", "X", "y", NULL, "Out", "z", NULL);
  pu_op(m, "mean", "X", "z", NULL, "Out", "loss", NULL);
  p->loss = strdup("loss");
  PU_OK(pe_program_validate(p));
  pe_shape want = PE_SHAPE(-1, 3), one = PE_SHAPE(1);
  ck_assert(pe_shape_equal(&h->shape, &want));
  ck_assert(pe_shape_equal(&y->shape, &want));
  ck_assert(pe_shape_equal(&z->shape, &want));
  ck_assert(pe_shape_equal(&loss->shape, &one));
  ck_assert_int_eq(loss->dtype, PE_F32);
  /* Validating again is idempotent. */
  PU_OK(pe_program_validate(p));
  pe_program_free(p);
}
END_TEST

START_TEST(startup_fills_main_persistables) {
  pe_block *m, *s;
  pe_program *p = new_program(&m);
  PU_OK(pe_program_add_block(p, -1, &s));
  p->startup_block = s->idx;
  pe_var_desc *w = pu_var(m, "w", PE_F32, NULL); /* shape left to the startup op */
  w->persistable = true;
  pe_op_desc *init = pu_op(s, "uniform_random", NULL, "Out", "w", NULL);
  int64_t shape[] = {4, 2};
  PU_OK(pe_op_set_ints(init, "shape", 2, shape));
  pu_var(m, "h", PE_F32, NULL);
  pu_op(m, "matmul", "X", "x", "Y", "w", NULL, "Out", "h", NULL);
  PU_OK(pe_program_validate(p));
  pe_shape want = PE_SHAPE(4, 2);
  ck_assert(pe_shape_equal(&w->shape, &want));
  pe_program_free(p);
}
END_TEST

/* x [-1,4] -> matmul w [4,3] -> + b [3] -> mean: loss; sgd. With a
 * startup block (with_startup) that initialises w only. */
static pe_program *train_program(bool with_startup) {
  pe_block *m, *s;
  pe_program *p = new_program(&m);
  pu_param(m, "w", PE_SHAPE(4, 3));
  pu_param(m, "b", PE_SHAPE(3));
  pu_var(m, "h", PE_F32, NULL);
  pu_var(m, "y", PE_F32, NULL);
  pu_var(m, "loss", PE_F32, NULL);
  pu_op(m, "matmul", "X", "x", "Y", "w", NULL, "Out", "h", NULL);
  pu_op(m, "elementwise_add", "X", "h", "Y", "b", NULL, "Out", "y", NULL);
  pu_op(m, "mean", "X", "y", NULL, "Out", "loss", NULL);
  p->loss = strdup("loss");
  p->opt.type = strdup("sgd");
  p->opt.lr = 0.1f;
  if (with_startup) {
    PU_OK(pe_program_add_block(p, -1, &s));
    p->startup_block = s->idx;
    pe_op_desc *init = pu_op(s, "uniform_random", NULL, "Out", "w", NULL);
    int64_t shape[] = {4, 3};
    PU_OK(pe_op_set_ints(init, "shape", 2, shape));
  }
  return p;
}

/* A startup block must initialise every trainable parameter (one without
 * init ops would register and initialise, and then every run fail
 * "'fc_0.w' has no value"); a program without one is fine (its
 * values come from SetParams or Load). */
START_TEST(trainable_parameter_needs_an_initialiser) {
  pe_program *p = train_program(true);
  pu_expect(pe_program_compile(p, false), PE_EUSE_BEFORE_DEF,
            "trainable parameter 'b' (f32 [3]) has no initialiser in the startup block (block 1)",
            NULL);
  pe_program_free(p);
  p = train_program(true);
  pe_op_desc *init = pu_op(p->blocks[1], "fill_constant", NULL, "Out", "b", NULL);
  int64_t shape[] = {3};
  PU_OK(pe_op_set_ints(init, "shape", 1, shape));
  PU_OK(pe_op_set_float(init, "value", 0.0f));
  PU_OK(pe_program_compile(p, false));
  pe_program_free(p);
  p = train_program(false);
  PU_OK(pe_program_compile(p, false));
  pe_program_free(p);
}
END_TEST

START_TEST(unknown_op) {
  pe_block *m;
  pe_program *p = new_program(&m);
  pu_var(m, "y", PE_F32, NULL);
  pu_var(m, "z", PE_F32, NULL);
  pu_op(m, "relu", "X", "x", NULL, "Out", "y", NULL);
  pu_op(m, "reluu", "X", "y", NULL, "Out", "z", NULL);
  pu_expect(pe_program_validate(p), PE_EUNKNOWN_OP, "block 0", "op #1", "reluu", NULL);
  pe_program_free(p);
}
END_TEST

START_TEST(unknown_variable) {
  pe_block *m;
  pe_program *p = new_program(&m);
  pu_var(m, "y", PE_F32, NULL);
  pu_op(m, "relu", "X", "x", NULL, "Out", "y", NULL);
  pu_op(m, "relu", "X", "y", NULL, "Out", "nope", NULL);
  pu_expect(pe_program_validate(p), PE_EUNKNOWN_VAR, "block 0", "op #1 (relu)", "output Out",
            "'nope'", NULL);
  pe_program_free(p);
}
END_TEST

START_TEST(wrong_attr_type) {
  pe_block *m;
  pe_program *p = new_program(&m);
  pu_var(m, "y", PE_F32, NULL);
  pe_op_desc *op = pu_op(m, "scale", "X", "x", NULL, "Out", "y", NULL);
  PU_OK(pe_op_set_string(op, "scale", "2"));
  pu_expect(pe_program_validate(p), PE_EATTR, "block 0", "op #0 (scale)", "'scale'", "string",
            "expected float", NULL);
  pe_program_free(p);
}
END_TEST

START_TEST(missing_required_attr) {
  pe_block *m;
  pe_program *p = pe_program_new();
  PU_OK(pe_program_add_block(p, -1, &m));
  pu_feed(m, "img", PE_F32, PE_SHAPE(-1, 1, 8, 8));
  pu_var(m, "pooled", PE_F32, NULL);
  pu_var(m, "r", PE_F32, NULL);
  pu_op(m, "relu", "X", "img", NULL, "Out", "r", NULL);
  pu_op(m, "pool2d", "X", "r", NULL, "Out", "pooled", NULL);
  pu_expect(pe_program_validate(p), PE_EATTR, "block 0", "op #1 (pool2d)", "'ksize'", "missing",
            NULL);
  pe_program_free(p);
}
END_TEST

START_TEST(unknown_attr_rejected) {
  pe_block *m;
  pe_program *p = new_program(&m);
  pu_var(m, "y", PE_F32, NULL);
  pe_op_desc *op = pu_op(m, "relu", "X", "x", NULL, "Out", "y", NULL);
  PU_OK(pe_op_set_float(op, "alpha", 0.1f));
  pu_expect(pe_program_validate(p), PE_EATTR, "op #0 (relu)", "unknown attribute 'alpha'", NULL);
  pe_program_free(p);
}
END_TEST

START_TEST(wrong_slot_arity) {
  pe_block *m;
  pe_program *p = new_program(&m);
  pu_param(m, "w", PE_SHAPE(4, 3));
  pu_var(m, "h", PE_F32, NULL);
  pe_op_desc *op = pu_op(m, "matmul", "Y", "w", NULL, "Out", "h", NULL);
  const char *two[] = {"x", "x"};
  PU_OK(pe_op_set_input(op, "X", 2, two));
  pu_expect(pe_program_validate(p), PE_EARITY, "block 0", "op #0 (matmul)", "input slot X",
            "2 argument(s), expected 1", NULL);
  pe_program_free(p);

  /* Missing required slot. */
  p = new_program(&m);
  pu_var(m, "y", PE_F32, NULL);
  pu_op(m, "sum", NULL, "Out", "y", NULL);
  pu_expect(pe_program_validate(p), PE_EARITY, "op #0 (sum)", "input slot X", "0 argument(s)",
            "at least 1", NULL);
  pe_program_free(p);

  /* Unknown slot name. */
  p = new_program(&m);
  pu_var(m, "y", PE_F32, NULL);
  pu_op(m, "relu", "X", "x", "Bias", "x", NULL, "Out", "y", NULL);
  pu_expect(pe_program_validate(p), PE_EARITY, "op #0 (relu)", "unknown input slot 'Bias'", NULL);
  pe_program_free(p);
}
END_TEST

START_TEST(dtype_mismatch) {
  pe_block *m;
  pe_program *p = pe_program_new();
  PU_OK(pe_program_add_block(p, -1, &m));
  pu_feed(m, "x", PE_F32, PE_SHAPE(2, 3));
  pe_shape s = PE_SHAPE(2, 3);
  pu_var(m, "y", PE_F32, NULL);
  pu_var(m, "z", PE_I64, &s);
  pu_op(m, "relu", "X", "x", NULL, "Out", "y", NULL);
  pu_op(m, "tanh", "X", "y", NULL, "Out", "z", NULL);
  pu_expect(pe_program_validate(p), PE_EDTYPE, "block 0", "op #1 (tanh)", "'z'", "f32", "i64",
            "[2,3]", NULL);
  pe_program_free(p);
}
END_TEST

START_TEST(shape_mismatch_after_inference) {
  pe_block *m;
  pe_program *p = new_program(&m);
  pu_param(m, "w", PE_SHAPE(4, 3));
  pe_shape declared = PE_SHAPE(-1, 5);
  pu_var(m, "h", PE_F32, &declared);
  pu_op(m, "matmul", "X", "x", "Y", "w", NULL, "Out", "h", NULL);
  pu_expect(pe_program_validate(p), PE_ESHAPE, "block 0", "op #0 (matmul)", "'h'", "[-1,3]",
            "[-1,5]", NULL);
  pe_program_free(p);

  /* Inconsistent inputs: the row's infer reports it; validation adds the block. */
  p = new_program(&m);
  pu_param(m, "w", PE_SHAPE(5, 3));
  pu_var(m, "h", PE_F32, NULL);
  pu_op(m, "matmul", "X", "x", "Y", "w", NULL, "Out", "h", NULL);
  pu_expect(pe_program_validate(p), PE_ESHAPE, "block 0", "op #0 (matmul)", NULL);
  pe_program_free(p);
}
END_TEST

/* Inferred shapes have the bound of declared ones (2^40 elements, zero
 * dimensions left out): a created tensor's shape attribute and a product
 * of two large inputs are refused, naming the op, the output and the shape,
 * before a pass or kernel multiplies their dims. */
START_TEST(inferred_shape_over_the_bound) {
  const int64_t big = INT64_C(1) << 40;
  pe_block *m;
  pe_program *p = new_program(&m);
  pu_var(m, "c", PE_F32, NULL);
  pe_op_desc *op = pu_op(m, "fill_constant", NULL, "Out", "c", NULL);
  PU_OK(pe_op_set_ints(op, "shape", 3, (int64_t[]){0, big, big}));
  pu_expect(pe_program_validate(p), PE_ESHAPE, "block 0", "op #0 (fill_constant)",
            "output Out 'c'", "[0,1099511627776,1099511627776] has more than 1099511627776 elements",
            NULL);
  pe_program_free(p);

  p = new_program(&m);
  pu_param(m, "a", PE_SHAPE(big, 1));
  pu_param(m, "b", PE_SHAPE(1, big));
  pu_var(m, "ab", PE_F32, NULL);
  pu_op(m, "matmul", "X", "a", "Y", "b", NULL, "Out", "ab", NULL);
  pu_expect(pe_program_validate(p), PE_ESHAPE, "op #0 (matmul)", "output Out 'ab'",
            "[1099511627776,1099511627776] has more than", NULL);
  pe_program_free(p);
}
END_TEST

START_TEST(use_before_definition) {
  pe_block *m;
  pe_program *p = new_program(&m);
  pu_var(m, "t", PE_F32, NULL);
  pu_var(m, "y", PE_F32, NULL);
  pu_op(m, "relu", "X", "t", NULL, "Out", "y", NULL); /* reads t ... */
  pu_op(m, "tanh", "X", "x", NULL, "Out", "t", NULL); /* ... written only here */
  pu_expect(pe_program_validate(p), PE_EUSE_BEFORE_DEF, "block 0", "op #0 (relu)", "'t'",
            "op #1 (tanh)", NULL);
  pe_program_free(p);

  /* Never written at all. */
  p = new_program(&m);
  pe_shape s = PE_SHAPE(2, 2);
  pu_var(m, "ghost", PE_F32, &s);
  pu_var(m, "y", PE_F32, NULL);
  pu_op(m, "relu", "X", "ghost", NULL, "Out", "y", NULL);
  pu_expect(pe_program_validate(p), PE_EUSE_BEFORE_DEF, "op #0 (relu)", "'ghost'", "no op", NULL);
  pe_program_free(p);
}
END_TEST

START_TEST(cycle) {
  pe_block *m;
  pe_program *p = new_program(&m);
  pu_var(m, "a", PE_F32, NULL);
  pu_var(m, "b", PE_F32, NULL);
  pu_var(m, "c", PE_F32, NULL);
  pu_op(m, "relu", "X", "x", NULL, "Out", "c", NULL);
  pu_op(m, "elementwise_add", "X", "c", "Y", "b", NULL, "Out", "a", NULL); /* b before ... */
  pu_op(m, "tanh", "X", "a", NULL, "Out", "b", NULL);                      /* ... b = f(a) */
  pu_expect(pe_program_validate(p), PE_ECYCLE, "block 0", "op #1 (elementwise_add)", "'b'",
            "op #2 (tanh)", NULL);
  pe_program_free(p);

  /* An op reading what only it writes. */
  p = new_program(&m);
  pe_shape s = PE_SHAPE(2, 2);
  pu_var(m, "self", PE_F32, &s);
  pu_op(m, "relu", "X", "self", NULL, "Out", "self", NULL);
  pu_expect(pe_program_validate(p), PE_ECYCLE, "op #0 (relu)", "'self'", NULL);
  pe_program_free(p);
}
END_TEST

/* A cycle through every op of a 40,000-op chain (op 0 reads what the
 * last op writes) is found in time linear in the ops: the walk that tells
 * a cycle from a use before definition scanned every op for each one it
 * reached (about a minute here). The bound is CPU time, 10x what a
 * sanitizer build needs. */
START_TEST(long_cycle_found_linearly) {
  enum { N = 40000 };
  pe_block *m;
  pe_program *p = new_program(&m);
  char name[32], prev[32];
  for (int i = 0; i < N; i++) {
    snprintf(name, sizeof name, "t%d", i);
    pu_var(m, name, PE_F32, NULL);
  }
  for (int i = 0; i < N; i++) {
    snprintf(prev, sizeof prev, "t%d", (i + N - 1) % N);
    snprintf(name, sizeof name, "t%d", i);
    pu_op(m, "relu", "X", prev, NULL, "Out", name, NULL);
  }
  double t0 = (double)clock() / CLOCKS_PER_SEC;
  pu_expect(pe_program_validate(p), PE_ECYCLE, "op #0 (relu)", "'t39999'", "op #39999 (relu)",
            NULL);
  double took = (double)clock() / CLOCKS_PER_SEC - t0;
  ck_assert_msg(took < 10, "validating a %d-op cycle took %.1f s of CPU", N, took);
  pe_program_free(p);
}
END_TEST

START_TEST(persistable_written_later_is_not_a_cycle) {
  /* w is read by op 0 and updated by op 1 (as an optimizer does): fine. */
  pe_block *m;
  pe_program *p = new_program(&m);
  pu_param(m, "w", PE_SHAPE(4, 3));
  pu_var(m, "h", PE_F32, NULL);
  pu_op(m, "matmul", "X", "x", "Y", "w", NULL, "Out", "h", NULL);
  pe_op_desc *sc = pu_op(m, "scale", "X", "w", NULL, "Out", "w", NULL);
  PU_OK(pe_op_set_float(sc, "scale", 0.5f));
  PU_OK(pe_program_validate(p));
  pe_program_free(p);
}
END_TEST

START_TEST(undeclared_loss) {
  pe_block *m;
  pe_program *p = new_program(&m);
  p->loss = strdup("missing_loss");
  pu_expect(pe_program_validate(p), PE_EUNKNOWN_VAR, "'missing_loss'", NULL);
  pe_program_free(p);
}
END_TEST

START_TEST(pass_manager) {
  ck_assert_ptr_nonnull(pe_pass_lookup("backward"));
  ck_assert_ptr_null(pe_pass_lookup("nope"));
  pe_block *m;
  pe_program *p = new_program(&m);
  pu_var(m, "y", PE_F32, NULL);
  pu_var(m, "mask", PE_U8, NULL);
  pu_op(m, "dropout", "X", "x", NULL, "Out", "y", "Mask", "mask", NULL);
  pu_expect(pe_passes_run(&(pe_ir){.prog = p}, "validate,frobnicate"), PE_ENOTFOUND, "frobnicate",
            NULL);
  PU_OK(pe_passes_run(&(pe_ir){.prog = p}, "validate, inference"));
  const pe_attr *a = pe_op_find_attr(m->ops[0], "is_test");
  ck_assert_ptr_nonnull(a);
  ck_assert_int_eq(a->type, PE_ATTR_BOOL);
  ck_assert_int_eq(a->i, 1);
  /* A pass failure names the pass. */
  pu_expect(pe_pass_run(&(pe_ir){.prog = p}, "backward"), PE_EINVAL, "pass backward", "no loss",
            NULL);
  pe_program_free(p);
}
END_TEST

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* The daemon's test hook PE_TEST_PASS_DELAY_MS sleeps before each pass; it is
 * read at the first pass only (it was a getenv per pass in production). */
START_TEST(pass_delay_hook_is_read_once) {
  pe_block *m;
  pe_program *p = new_program(&m);
  setenv("PE_TEST_PASS_DELAY_MS", "200", 1);
  double t0 = now_s();
  PU_OK(pe_pass_run(&(pe_ir){.prog = p}, "validate"));
  double first = now_s() - t0;
  ck_assert_msg(first >= 0.19, "the hook did not sleep: first pass took %.3f s", first);
  setenv("PE_TEST_PASS_DELAY_MS", "5000", 1); /* too late: the 200 ms stays */
  t0 = now_s();
  PU_OK(pe_pass_run(&(pe_ir){.prog = p}, "validate"));
  double second = now_s() - t0;
  ck_assert_msg(second >= 0.19 && second < 4.0, "second pass took %.3f s (200 ms expected)",
                second);
  unsetenv("PE_TEST_PASS_DELAY_MS");
  pe_program_free(p);
}
END_TEST

static Suite *validate_suite(void) {
  Suite *s = suite_create("validate");
  TCase *tc = tcase_create("validate");
  tcase_add_test(tc, valid_program_gets_shapes);
  tcase_add_test(tc, startup_fills_main_persistables);
  tcase_add_test(tc, trainable_parameter_needs_an_initialiser);
  tcase_add_test(tc, unknown_op);
  tcase_add_test(tc, unknown_variable);
  tcase_add_test(tc, wrong_attr_type);
  tcase_add_test(tc, missing_required_attr);
  tcase_add_test(tc, unknown_attr_rejected);
  tcase_add_test(tc, wrong_slot_arity);
  tcase_add_test(tc, dtype_mismatch);
  tcase_add_test(tc, shape_mismatch_after_inference);
  tcase_add_test(tc, inferred_shape_over_the_bound);
  tcase_add_test(tc, use_before_definition);
  tcase_add_test(tc, cycle);
  tcase_add_test(tc, long_cycle_found_linearly);
  tcase_add_test(tc, persistable_written_later_is_not_a_cycle);
  tcase_add_test(tc, undeclared_loss);
  tcase_add_test(tc, pass_manager);
  tcase_add_test(tc, pass_delay_hook_is_read_once);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(validate_suite)
