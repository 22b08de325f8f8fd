/* RunOptions.check_nan_inf through the daemon: `pe-client run|train
 * --check-nan-inf` on a model whose huge learning rate blows the weights
 * up names the op where Inf first appears ("this op produced it"), its
 * place and the step, where the run without it only says the loss diverged;
 * libpeclient's pe_client_run_opts.check_nan_inf names a NaN feed as a
 * feed. Needs Fashion-MNIST for the pe-client runs (the project's
 * dependency). Skipped (77) when pe-executord or pe-client is not built. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_cli.h"
#include "pe_client.h"
#include "pe_models.h"

/* sgd at lr 1e6: the weights grow each step until a matmul overflows. */
static const char BIG_LR[] =
    "name big\nbatch 64\ninput image 784\nlabel label\n"
    "fc 32 act=relu\nfc 10\nloss softmax_with_cross_entropy\n"
    "accuracy top=1\noptimizer sgd lr=1e6\n";

static void expect_err(const cd_daemon *d, const char *const *parts) {
  const char *err = slurp(d->dir, "err");
  for (; *parts; parts++) ck_assert_msg(strstr(err, *parts), "'%s' not in: %s", *parts, err);
}

START_TEST(run_names_the_op_not_the_loss) {
  cd_daemon d;
  cd_start(&d);
  char model[256], args[640];
  write_model(&d, "big", BIG_LR, model, sizeof model);
  /* Without the check: the loss check stops the run, naming the loss. */
  snprintf(args, sizeof args, "run --model '%s' --model-name off --steps 10 --batch 64", model);
  ck_assert_int_eq(cli(&d, d.dir, args), 1);
  expect_err(&d, (const char *[]){"the loss", "training diverged", NULL});
  ck_assert_ptr_null(strstr(slurp(d.dir, "err"), "check_nan_inf"));
  /* With it: the op, its output and place (the daemon's places = auto puts
   * the model where its trial timed fastest: any cpu place), produced there,
   * the step. */
  snprintf(args, sizeof args,
           "run --model '%s' --model-name on --steps 10 --batch 64 --check-nan-inf", model);
  ck_assert_int_eq(cli(&d, d.dir, args), 1);
  expect_err(&d, (const char *[]){"): check_nan_inf: output ", " on cpu:", "holds inf at element",
                                  "this op produced it", "step ", "INVALID_ARGUMENT", NULL});
  ck_assert_ptr_null(strstr(slurp(d.dir, "err"), "training diverged"));
  ck_assert_ptr_null(strstr(slurp(d.dir, "err"), "(mean)")); /* not the loss's op */
  /* train takes it too. */
  snprintf(args, sizeof args,
           "train --model '%s' --model-name tr --limit 1024 --quiet --check-nan-inf", model);
  ck_assert_int_eq(cli(&d, d.dir, args), 1);
  expect_err(&d, (const char *[]){"): check_nan_inf: output ", "this op produced it", NULL});
  cd_stop(&d);
}
END_TEST

/* A NaN pixel: named as the feed it is, before any op runs. */
START_TEST(lib_names_a_nan_feed) {
  cd_daemon d;
  cd_start(&d);
  pe_client *c = cd_connect(&d);
  pe_model_spec m;
  char err[256];
  ck_assert_msg(pe_model_spec_build("mlp", &m, err, sizeof err) == 0, "%s", err);
  pe_client_register_args a = {
      .program = m.bytes, .program_len = m.len, .model = "feednan", .places = "cpu:2", .seed = 3};
  pe_client_program p;
  CD_OK(c, pe_client_register(c, &a, &p));
  CD_OK(c, pe_client_init(c, p.handle, false, NULL));
  enum { B = 8 };
  static float x[B * 784];
  int64_t y[B];
  for (int i = 0; i < B * 784; i++) x[i] = (float)(i % 7) / 7.0f;
  for (int i = 0; i < B; i++) y[i] = i % 10;
  x[5 * 784 + 3] = NAN;
  pe_client_tensor f[2];
  pe_client_tensor_set(&f[0], m.image, PE_B_F32, 2, (int64_t[]){B, 784}, x);
  pe_client_tensor_set(&f[1], m.label, PE_B_I64, 2, (int64_t[]){B, 1}, y);
  const char *fetch[] = {m.loss};
  pe_client_run_opts o = {.check_nan_inf = true};
  pe_client_run_result r;
  ck_assert_int_eq(pe_client_run(c, p.handle, f, 2, fetch, 1, &o, &r), PE_C_EINVAL);
  const char *msg = pe_client_error(c);
  char want[96];
  snprintf(want, sizeof want, "feed '%.64s'", m.image);
  ck_assert_msg(strstr(msg, "check_nan_inf") && strstr(msg, want) &&
                    strstr(msg, "nan at element 3923") && strstr(msg, "step 0"),
                "%s", msg);
  ck_assert_uint_eq(r.steps, 0); /* refused before the step ran */
  /* A clean batch passes the check. */
  x[5 * 784 + 3] = 0.5f;
  CD_OK(c, pe_client_run(c, p.handle, f, 2, fetch, 1, &o, &r));
  ck_assert(isfinite(((const float *)r.fetched[0].data)[0]));
  pe_client_free(c);
  pe_model_spec_release(&m);
  cd_stop(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("check_nan_inf_cli");
  TCase *tc = tcase_create("check_nan_inf_cli");
  tcase_add_test(tc, run_names_the_op_not_the_loss);
  tcase_add_test(tc, lib_names_a_nan_feed);
  suite_add_tcase(s, tc);
  return s;
}

CLI_CHECK_MAIN(suite)
