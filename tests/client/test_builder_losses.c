/* Program builder, regression losses: mse, l1 and smooth-l1 build the ops
 * docs/ops.md names, decode and validate, and run (sequential executor)
 * to the closed forms (mean over elements, smooth-l1 on both sides of
 * beta, rows of 6 elements); bad arguments are refused with messages
 * naming the layer, the variables, their shapes and beta.
 *
 * Tolerance: means of 24 f32 terms below 10: 1e-5 relative. */
#include <check.h>
#include <math.h>
#include <string.h>

#include "check_main.h"
#include "compiler/pass.h"
#include "compiler/validate.h"
#include "core/scope.h"
#include "engine/seq_executor.h"
#include "ir/program.h"
#include "pe_builder.h"
#include "test_assert.h"

START_TEST(losses_build_and_match_closed_forms) {
  pe_builder *b = pe_builder_new();
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 2, 3));
  const char *y = pe_builder_data(b, "y", PE_B_F32, PE_B_SHAPE(-1, 2, 3));
  const char *l[3] = {pe_builder_mse_loss(b, x, y), pe_builder_l1_loss(b, x, y),
                      pe_builder_smooth_l1_loss(b, x, y, 0.5f)};
  ck_assert_msg(l[2] != NULL, "%s", pe_builder_error(b));
  ck_assert_str_eq(l[1], "l1_loss_0.out");
  ck_assert_str_eq(l[2], "smooth_l1_loss_0.out");
  /* the names live as long as the builder */
  char names[3][64];
  const char *fetch[3];
  for (int k = 0; k < 3; k++) fetch[k] = strcpy(names[k], l[k]);
  uint8_t *bytes;
  size_t len;
  ck_assert_int_eq(pe_builder_finish(b, &bytes, &len), 0);
  pe_builder_free(b);
  pe_program *p = NULL;
  PE_CK_OK(pe_program_decode(bytes, len, &p));
  free(bytes);
  PE_CK_OK(pe_program_validate(p));
  pe_block *main = pe_program_main(p);
  const char *types[] = {"elementwise_sub", "square", "mean", "elementwise_sub", "abs", "mean",
                         "smooth_l1_loss",  "mean",   "scale"};
  ck_assert_int_eq(main->n_ops, 9);
  for (int i = 0; i < 9; i++) ck_assert_str_eq(main->ops[i]->type, types[i]);
  PE_CK_OK(pe_program_compile_opts(p, true, NULL));
  pe_scope *scope = pe_scope_new(NULL);
  pe_exec_opts eo = {.seed = 1, .threads = 1};
  pe_seq_exec *e = NULL;
  PE_CK_OK(pe_seq_exec_new(p, p->main_block, scope, &eo, &e));
  pe_scope *in = pe_scope_new(NULL);
  const float *xv = pe_f32(ph_set_uniform(in, "x", PE_SHAPE(4, 2, 3), -2, 2, 1));
  const float *yv = pe_f32(ph_set_uniform(in, "y", PE_SHAPE(4, 2, 3), -2, 2, 2));
  pe_feed feeds[2] = {{"x", ph_get(in, "x")}, {"y", ph_get(in, "y")}};
  const pe_tensor *out[3];
  PE_CK_OK(pe_seq_exec_run(e, feeds, 2, fetch, 3, out));
  double want[3] = {0, 0, 0};
  for (int i = 0; i < 24; i++) {
    double d = (double)xv[i] - yv[i], a = fabs(d);
    want[0] += d * d / 24;
    want[1] += a / 24;
    want[2] += (a < 0.5 ? 0.5 * d * d / 0.5 : a - 0.25) / 24;
  }
  for (int k = 0; k < 3; k++)
    ck_assert_msg(fabs(pe_f32(out[k])[0] - want[k]) <= 1e-5 * fmax(1, want[k]), "%s = %g, want %g",
                  fetch[k], pe_f32(out[k])[0], want[k]);
  pe_seq_exec_free(e);
  pe_scope_free(in);
  pe_scope_free(scope);
  pe_program_free(p);
}
END_TEST

START_TEST(bad_arguments_are_refused) {
  pe_builder *b = pe_builder_new();
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 3));
  const char *y = pe_builder_data(b, "y", PE_B_F32, PE_B_SHAPE(-1, 4));
  ck_assert_ptr_null(pe_builder_l1_loss(b, x, y));
  ck_assert_ptr_nonnull(strstr(pe_builder_error(b),
                               "l1_loss 'l1_loss_0': prediction 'x' [-1,3] "
                               "and label 'y' [-1,4] must be f32 of one shape"));
  pe_builder_free(b);
  b = pe_builder_new();
  x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 3));
  ck_assert_ptr_null(pe_builder_smooth_l1_loss(b, x, x, -1));
  ck_assert_ptr_nonnull(strstr(pe_builder_error(b), "beta -1 must be positive"));
  pe_builder_free(b);
  b = pe_builder_new();
  x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, -1));
  ck_assert_ptr_null(pe_builder_smooth_l1_loss(b, x, x, 1));
  ck_assert_ptr_nonnull(strstr(pe_builder_error(b), "prediction 'x' [-1,-1] needs known dims"));
  pe_builder_free(b);
}
END_TEST

static Suite *builder_losses_suite(void) {
  Suite *s = suite_create("builder_losses");
  TCase *tc = tcase_create("losses");
  tcase_add_test(tc, losses_build_and_match_closed_forms);
  tcase_add_test(tc, bad_arguments_are_refused);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(builder_losses_suite)
