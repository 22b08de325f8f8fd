/* The per-op NaN/Inf check (engine/op_finite.h, pe_exec_opts /
 * pe_run_opts.check_nan_inf) on the sequential and the parallel executor:
 * an overflow in the middle of the program is blamed on the op that
 * produced it, not on the loss; a NaN parameter is named as the input it
 * propagated from; a NaN feed is named as a feed; a sharded optimizer
 * update (run on slices) is checked too; off, the run goes on. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../compiler/prog_util.h"
#include "check_main.h"
#include "compiler/validate.h"
#include "par_test_util.h"

/* h = x w (op #0), s = 1e30 h (op #1: overflows to Inf for |h| > 3.4e8),
 * loss = mean(s) (op #2). x feed [-1,2], w parameter [2,2]. */
static pe_program *overflow_program(void) {
  pe_program *p = pe_program_new();
  pe_block *m;
  PU_OK(pe_program_add_block(p, -1, &m));
  pu_feed(m, "x", PE_F32, PE_SHAPE(-1, 2));
  pu_param(m, "w", PE_SHAPE(2, 2));
  pu_var(m, "h", PE_F32, NULL);
  pu_var(m, "s", PE_F32, NULL);
  pu_var(m, "loss", PE_F32, NULL);
  pu_op(m, "matmul", "X", "x", "Y", "w", NULL, "Out", "h", NULL);
  PU_OK(pe_op_set_float(pu_op(m, "scale", "X", "h", NULL, "Out", "s", NULL), "scale", 1e30f));
  pu_op(m, "mean", "X", "s", NULL, "Out", "loss", NULL);
  PU_OK(pe_program_validate(p));
  return p;
}

static const float W_OK[4] = {1, 0, 0, 1};

/* x = [[small, small], [big, small]]: row 1 overflows in s at element 2. */
static float X_BIG[4] = {1e-3f, 2e-3f, 1e9f, 1e-3f};
static float X_SMALL[4] = {1e-3f, 2e-3f, 3e-3f, 1e-3f};

static void set_w(pe_scope *model, const float *w) {
  pe_var *v;
  PU_OK(pe_scope_var(model, "w", &v));
  pe_shape s = PE_SHAPE(2, 2);
  PU_OK(pe_tensor_resize(&v->t, PE_F32, &s, "w"));
  memcpy(v->t.data, w, 4 * sizeof(float));
}

static pe_status *seq_run(int check, const float *w, float *x, float *loss) {
  pe_program *p = overflow_program();
  pe_scope *model = pe_scope_new(NULL);
  set_w(model, w);
  pe_exec_opts o = {.threads = 1, .check_nan_inf = check};
  pe_seq_exec *e;
  PU_OK(pe_seq_exec_new(p, 0, model, &o, &e));
  pe_tensor xt;
  pe_tensor_init(&xt);
  pe_shape xs = PE_SHAPE(2, 2);
  pe_tensor_view(&xt, PE_F32, &xs, x);
  pe_feed f = {"x", &xt};
  const char *fetch = "loss";
  const pe_tensor *out = NULL;
  pe_status *st = pe_seq_exec_run(e, &f, 1, &fetch, 1, &out);
  if (!st && loss) *loss = pe_f32(out)[0];
  pe_seq_exec_free(e);
  pe_scope_free(model);
  pe_program_free(p);
  return st;
}

static void expect_in(const pe_status *st, const char *const *parts) {
  ck_assert_msg(st, "the run succeeded; expected a check_nan_inf error");
  for (; *parts; parts++)
    ck_assert_msg(strstr(pe_status_msg(st), *parts), "'%s' not in: %s", *parts, pe_status_msg(st));
}

START_TEST(seq_off_by_default_runs_on_to_an_inf_loss) {
  float loss = 0;
  PU_OK(seq_run(0, W_OK, X_BIG, &loss));
  ck_assert(!isfinite(loss));
}
END_TEST

START_TEST(seq_names_the_op_that_produced_inf_not_the_loss) {
  pe_status *st = seq_run(1, W_OK, X_BIG, NULL);
  expect_in(st, (const char *[]){"check_nan_inf", "op #1 (scale)", "output Out 's'",
                                 "inf at element 2", "1 of 4", "inputs already non-finite: none",
                                 "this op produced it", NULL});
  ck_assert_ptr_null(strstr(pe_status_msg(st), "mean"));
  ck_assert_ptr_null(strstr(pe_status_msg(st), "'loss'"));
  ck_assert_int_eq(pe_status_code(st), PE_EINVAL);
  pe_status_free(st);
  /* Finite values pass the check. */
  float loss = 0;
  PU_OK(seq_run(1, W_OK, X_SMALL, &loss));
  ck_assert(isfinite(loss));
}
END_TEST

START_TEST(seq_names_a_nan_parameter_as_the_input_it_came_from) {
  const float w_nan[4] = {1, NAN, 0, 1};
  pe_status *st = seq_run(1, w_nan, X_SMALL, NULL);
  expect_in(st, (const char *[]){"op #0 (matmul)", "output Out 'h'", "nan at element",
                                 "inputs already non-finite: Y 'w' (nan at element 1)",
                                 "propagated", NULL});
  pe_status_free(st);
}
END_TEST

START_TEST(seq_names_a_nan_feed_as_a_feed) {
  float x[4] = {1e-3f, 2e-3f, NAN, 1e-3f};
  pe_status *st = seq_run(1, W_OK, x, NULL);
  expect_in(st, (const char *[]){"check_nan_inf", "feed 'x'", "nan at element 2", NULL});
  ck_assert_ptr_null(strstr(pe_status_msg(st), "op #"));
  pe_status_free(st);
}
END_TEST

/* --- the parallel executor ---------------------------------------------------------- */

static pe_status *par_run(pe_place_kind kind, int n, bool check, const float *w, float *x,
                          float *loss) {
  pe_runtime *rt = rt_new(2);
  pe_program *p = overflow_program();
  const char *keep[] = {"loss"};
  pe_pass_opts o = {.place_kind = kind, .n_places = n, .n_keep = 1, .keep = keep};
  pe_ir ir = {p, NULL, NULL, &o};
  PE_CK_OK(pe_graph_compile(&ir, true));
  pe_model *m;
  PE_CK_OK(pe_model_new(rt, kind, n, 1, &m));
  pe_tensor wt, xt, out;
  pe_tensor_init(&wt);
  pe_tensor_init(&xt);
  pe_tensor_init(&out);
  pe_shape ws = PE_SHAPE(2, 2), xs = PE_SHAPE(2, 2);
  pe_tensor_view(&wt, PE_F32, &ws, (void *)w);
  PE_CK_OK(pe_model_set(m, "w", &wt));
  pe_par_exec *e;
  PE_CK_OK(pe_par_exec_new(m, ir.graph, &e));
  ir.graph = NULL;
  pe_ir_destroy(&ir);
  pe_tensor_view(&xt, PE_F32, &xs, x);
  pe_feed f = {"x", &xt};
  const char *fetch = "loss";
  pe_run_opts ro = {.check_nan_inf = check};
  pe_status *st = pe_par_exec_run(e, &f, 1, &fetch, 1, &out, &ro, NULL);
  if (!st && loss) *loss = pe_f32(&out)[0];
  /* The executor stays usable: a finite run after the failed one. */
  if (st) PE_CK_OK(pe_par_exec_run(e, &f, 1, &fetch, 0, &out, &(pe_run_opts){0}, NULL));
  pe_tensor_release(&out);
  pe_par_exec_free(e);
  pe_model_free(m);
  pe_program_free(p);
  pe_runtime_free(rt);
  return st;
}

static void par_produced(pe_place_kind kind, int n, const char *place) {
  float loss = 0;
  PE_CK_OK(par_run(kind, n, false, W_OK, X_BIG, &loss));
  ck_assert(!isfinite(loss));
  pe_status *st = par_run(kind, n, true, W_OK, X_BIG, NULL);
  /* With two places row 1 is place 1's row 0: element 0 of its s. */
  expect_in(st, (const char *[]){"check_nan_inf", "op #1 (scale)", "output Out 's", place,
                                 n == 1 ? "inf at element 2" : "inf at element 0",
                                 "this op produced it", NULL});
  ck_assert_ptr_null(strstr(pe_status_msg(st), "(mean)"));
  pe_status_free(st);
  PE_CK_OK(par_run(kind, n, true, W_OK, X_SMALL, &loss));
  ck_assert(isfinite(loss));
}

START_TEST(par_cpu_names_the_op_and_place) {
  par_produced(PE_PLACE_CPU, 2, "on cpu:1");
}
END_TEST

START_TEST(par_sim_names_the_op_and_place) {
  par_produced(PE_PLACE_SIM, 1, "on sim:0");
}
END_TEST

START_TEST(par_names_a_nan_feed_and_a_nan_parameter) {
  float x[4] = {1e-3f, INFINITY, 3e-3f, 1e-3f};
  pe_status *st = par_run(PE_PLACE_CPU, 2, true, W_OK, x, NULL);
  expect_in(st, (const char *[]){"check_nan_inf", "feed 'x'", "inf at element 1", NULL});
  pe_status_free(st);
  const float w_nan[4] = {1, NAN, 0, 1};
  st = par_run(PE_PLACE_CPU, 1, true, w_nan, X_SMALL, NULL);
  expect_in(st, (const char *[]){"op #0 (matmul)", "inputs already non-finite: Y 'w", "propagated",
                                 NULL});
  pe_status_free(st);
}
END_TEST

/* The sharded update (strategy sharded: the optimizer's kernel runs on
 * slices, not through pe_op_run) is checked too: sgd at lr 3e38 with a
 * gradient of 1e3 overflows the parameter, with every input finite. */
START_TEST(par_sharded_update_is_checked) {
  pe_builder *b = pe_builder_new();
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 4));
  const char *loss = pe_builder_mean(b, pe_builder_fc(b, x, 1, NULL));
  ck_assert_int_eq(pe_builder_append_backward(b, loss), 0);
  ck_assert_int_eq(pe_builder_sgd(b, 3e38f), 0);
  pe_program *p = tb_finish(b);
  pe_runtime *rt = rt_new(2);
  pe_pass_opts o = {.place_kind = PE_PLACE_CPU, .n_places = 2, .strategy = PE_STRATEGY_SHARDED};
  pe_ir ir = {p, NULL, NULL, &o};
  PE_CK_OK(pe_graph_compile(&ir, false));
  pe_model *m;
  PE_CK_OK(pe_model_new(rt, PE_PLACE_CPU, 2, 1, &m));
  pe_par_exec *step, *init;
  PE_CK_OK(pe_par_exec_new(m, ir.graph, &step));
  PE_CK_OK(pe_par_exec_new(m, ir.startup, &init));
  ir.graph = ir.startup = NULL;
  pe_ir_destroy(&ir);
  PE_CK_OK(pe_par_exec_run(init, NULL, 0, NULL, 0, NULL, NULL, NULL));
  float xv[4 * 4];
  for (int i = 0; i < 16; i++) xv[i] = 1e3f;
  pe_tensor xt;
  pe_tensor_init(&xt);
  pe_shape xs = PE_SHAPE(4, 4);
  pe_tensor_view(&xt, PE_F32, &xs, xv);
  pe_feed f = {"x", &xt};
  pe_run_opts ro = {.check_nan_inf = true};
  pe_status *st = pe_par_exec_run(step, &f, 1, NULL, 0, NULL, &ro, NULL);
  expect_in(st, (const char *[]){"(sharded update)", "(sgd): check_nan_inf: output ParamOut",
                                 "inf at element", "this op produced it", NULL});
  pe_status_free(st);
  pe_par_exec_free(step);
  pe_par_exec_free(init);
  pe_model_free(m);
  pe_program_free(p);
  pe_runtime_free(rt);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("check_nan_inf");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, seq_off_by_default_runs_on_to_an_inf_loss);
  tcase_add_test(tc, seq_names_the_op_that_produced_inf_not_the_loss);
  tcase_add_test(tc, seq_names_a_nan_parameter_as_the_input_it_came_from);
  tcase_add_test(tc, seq_names_a_nan_feed_as_a_feed);
  tcase_add_test(tc, par_cpu_names_the_op_and_place);
  tcase_add_test(tc, par_sim_names_the_op_and_place);
  tcase_add_test(tc, par_names_a_nan_feed_and_a_nan_parameter);
  tcase_add_test(tc, par_sharded_update_is_checked);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
