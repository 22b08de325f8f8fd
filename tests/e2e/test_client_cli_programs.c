/* pe-client's commands on programs and models against the real daemon:
 * run --fetch (and of an intermediate that op fusion removed), trace's
 * output path, register and deregister (a program outlives the command that
 * registered it; another user's needs --force), and drop-model freeing a
 * model name for a program of other shapes. Needs Fashion-MNIST (the
 * project's dependency). Skipped (77) when pe-executord or pe-client is not
 * built. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "client_cli.h"

/* A model name keeps its parameters' shapes: a model file of another width
 * under the name of a live persistent model is refused, naming both shapes
 * and the way out; drop-model frees the name, and the file trains. */
START_TEST(drop_model_frees_the_name) {
  cd_daemon d;
  cd_start(&d);
  char wide[256], args[512];
  write_model(&d, "wide",
              "name mlp\ninput image 784\nlabel label\nfc 512 act=relu\nfc 10\n"
              "loss softmax_with_cross_entropy\naccuracy\noptimizer sgd lr=0.1\n",
              wide, sizeof wide);
  CLI_OK(&d, "train --model mlp --epochs 1 --limit 300 --persistent");
  /* A save under the restart checkpoint's name is refused: the daemon
   * overwrites that file, and drop-model below would remove it. */
  ck_assert_int_eq(cli(&d, d.dir, "save --model mlp --checkpoint shutdown"), 1);
  ck_assert_msg(strstr(slurp(d.dir, "err"), "'shutdown' is the restart checkpoint's name") &&
                    strstr(slurp(d.dir, "err"), "INVALID_ARGUMENT"),
                "%s", slurp(d.dir, "err"));
  CLI_OK(&d, "save --model mlp --checkpoint mine");
  snprintf(args, sizeof args, "train --model '%s' --epochs 1 --limit 300", wide);
  ck_assert_int_eq(cli(&d, d.dir, args), 1);
  ck_assert_msg(strstr(slurp(d.dir, "err"),
                       "model 'mlp': 'fc_0.w' has shape [784,256], the "
                       "program declares [784,512]") &&
                    strstr(slurp(d.dir, "err"), "pe-client drop-model --model mlp"),
                "%s", slurp(d.dir, "err"));
  CLI_OK(&d, "--json drop-model --model mlp");
  ck_assert_msg(
      strstr(last_line(d.dir), "\"freed\":true") && strstr(last_line(d.dir), "\"removed\":\"\""),
      "%s", last_line(d.dir));
  CLI_OK(&d, args);
  ck_assert_int_eq(cli(&d, d.dir, "drop-model --model mlp"), 1); /* not persistent: gone */
  ck_assert_msg(strstr(slurp(d.dir, "err"), "NOT_FOUND"), "%s", slurp(d.dir, "err"));
  cd_stop(&d);
}
END_TEST

/* run --fetch: loss, accuracy and correct stand for the model's
 * variables; --json prints a tensor's dtype, shape and every value (a
 * one-element one as its number), text the first 8 and the count. trace
 * --out to a path that cannot be written fails before the step: the
 * model is not even registered. */
START_TEST(run_fetches_and_trace_paths) {
  cd_daemon d;
  cd_start(&d);
  CLI_OK(&d, "run --model mlp --fetch loss,accuracy,correct,fc_2.b --json");
  const char *line = last_line(d.dir);
  ck_assert_msg(strstr(line, "\"mean_0.out\":") && strstr(line, "\"accuracy_0.out\":") &&
                    strstr(line, "\"accuracy_0.correct\":"),
                "%s", line);
  const char *b = strstr(line, "\"fc_2.b\":{\"dtype\":\"f32\",\"shape\":[10],\"values\":[");
  ck_assert_msg(b, "%s", line);
  b = strchr(b, '[');
  b = strchr(b + 1, '[') + 1;
  for (int i = 0; i < 10; i++) {
    char *end;
    strtod(b, &end);
    ck_assert_msg(end != b && *end == (i < 9 ? ',' : ']'), "value %d: %s", i, line);
    b = end + 1;
  }
  CLI_OK(&d, "run --model mlp --fetch fc_0.w");
  ck_assert_msg(strstr(slurp(d.dir, "out"), "fc_0.w f32 [784,256]:") &&
                    strstr(slurp(d.dir, "out"), " ... (200704 values; --json prints them all)"),
                "%s", slurp(d.dir, "out"));
  char args[512];
  snprintf(args, sizeof args, "trace --model mlp --model-name traced --out '%s/no/such/t.json'",
           d.dir);
  ck_assert_int_eq(cli(&d, d.dir, args), 1);
  ck_assert_msg(strstr(slurp(d.dir, "err"), "/no/such/t.json: No such file or directory"), "%s",
                slurp(d.dir, "err"));
  CLI_OK(&d, "--json status");
  ck_assert_msg(!strstr(last_line(d.dir), "\"name\":\"traced\""), "%s", last_line(d.dir));
  cd_stop(&d);
}
END_TEST

/* A builder intermediate that op fusion removed (fc_0.tmp_0: the matmul's
 * output, fused with the bias add and relu): the fetch says so and how to
 * keep it (not just "is not a variable of the graph"); --keep and
 * --no-op-fusion on run and register then fetch it. */
START_TEST(fetch_of_fused_intermediate) {
  cd_daemon d;
  cd_start(&d);
  ck_assert_int_eq(cli(&d, d.dir, "run --model mlp --model-name fz --fetch fc_0.tmp_0"), 1);
  ck_assert_msg(strstr(slurp(d.dir, "err"),
                       "fetch 'fc_0.tmp_0': it was fused into op matmul writing 'fc_0.out' "
                       "(matmul+bias add+relu) by op fusion; register with keep=['fc_0.tmp_0'] or "
                       "no_op_fusion (pe-client --keep fc_0.tmp_0 or --no-op-fusion) to fetch it "
                       "(UNKNOWN_VARIABLE)"),
                "%s", slurp(d.dir, "err"));
  CLI_OK(
      &d,
      "run --model mlp --model-name fk --fetch fc_0.tmp_0,fc_0.tmp_1 --keep fc_0.tmp_0,fc_0.tmp_1");
  ck_assert_msg(strstr(slurp(d.dir, "out"), "fc_0.tmp_0 f32 [128,256]:") &&
                    strstr(slurp(d.dir, "out"), "fc_0.tmp_1 f32 [128,256]:"),
                "%s", slurp(d.dir, "out"));
  CLI_OK(&d, "run --model mlp --model-name fn --fetch fc_1.tmp_0 --no-op-fusion");
  ck_assert_msg(strstr(slurp(d.dir, "out"), "fc_1.tmp_0 f32 [128,128]:"), "%s",
                slurp(d.dir, "out"));
  /* register takes them too: the same program and options as the run's, so the same handle. */
  CLI_OK(&d, "--json register --model mlp --model-name fn --no-op-fusion");
  ck_assert_msg(strstr(last_line(d.dir), "\"existed\":true"), "%s", last_line(d.dir));
  CLI_OK(&d, "--json register --model mlp --model-name fk --keep fc_0.tmp_0,fc_0.tmp_1");
  ck_assert_msg(strstr(last_line(d.dir), "\"existed\":true"), "%s", last_line(d.dir));
  ck_assert_int_eq(cli(&d, d.dir, "run --model mlp --keep ,"), 2);
  ck_assert_msg(strstr(slurp(d.dir, "err"), "--keep: no names in ','"), "%s", slurp(d.dir, "err"));
  cd_stop(&d);
}
END_TEST

/* The runtime directory where pe-client keeps the sessions of the programs
 * a `register` left (XDG_RUNTIME_DIR/pe-client): a fresh one per name, so
 * that a command run under another name has no record of them, as another
 * user's would not. */
static void use_runtime_dir(const cd_daemon *d, const char *name) {
  char rt[512];
  snprintf(rt, sizeof rt, "%s/%s", d->dir, name);
  ck_assert(mkdir(rt, 0700) == 0 || errno == EEXIST);
  ck_assert_int_eq(setenv("XDG_RUNTIME_DIR", rt, 1), 0);
}

/* deregister of a program that another user's `register` left (no record
 * of its session here): refused with the reason (exit 1,
 * PERMISSION_DENIED), and --force drops it. */
START_TEST(deregister_of_another_clients_program) {
  cd_daemon d;
  cd_start(&d);
  use_runtime_dir(&d, "rt-owner");
  CLI_OK(&d, "register --model mlp --model-name owned --init --json");
  /* The daemon's places = auto: the places its trial chose. */
  ck_assert_msg(strstr(last_line(d.dir), "\"places\":\"cpu:"), "%s", last_line(d.dir));
  const char *h = strstr(last_line(d.dir), "\"handle\":\"");
  ck_assert_msg(h, "%s", last_line(d.dir));
  char handle[32], args[128];
  snprintf(handle, sizeof handle, "%.*s", (int)strcspn(h + 10, "\""), h + 10);
  use_runtime_dir(&d, "rt-other");
  snprintf(args, sizeof args, "deregister --handle %s", handle);
  ck_assert_int_eq(cli(&d, d.dir, args), 1);
  ck_assert_msg(strstr(slurp(d.dir, "err"), "PERMISSION_DENIED") &&
                    strstr(slurp(d.dir, "err"), "(model 'owned') belongs to 1 other client"),
                "%s", slurp(d.dir, "err"));
  /* The way out is a command that works, with the handle as printed. */
  char way_out[96];
  snprintf(way_out, sizeof way_out, "pe-client deregister --force --handle %s", handle);
  ck_assert_msg(strstr(slurp(d.dir, "err"), way_out), "%s", slurp(d.dir, "err"));
  CLI_OK(&d, "--json status");
  ck_assert_msg(strstr(last_line(d.dir), "\"name\":\"owned\""), "%s", last_line(d.dir));
  snprintf(args, sizeof args, "deregister --handle %s --force", handle);
  CLI_OK(&d, args);
  CLI_OK(&d, "--json status");
  ck_assert_msg(!strstr(last_line(d.dir), "\"name\":\"owned\""), "%s", last_line(d.dir));
  cd_stop(&d);
}
END_TEST

/* register, run and trace leave their programs for the commands after
 * them until the session TTL, on ipc:// too (the daemon's sweep of exited
 * processes must not drop them about a second after the command): 3 s later (past the sweep) `save`
 * of a `register --init` model works, a `run`'s model is still there, and the handle register
 * printed is still registered (PERMISSION_DENIED for another user, not
 * NOT_FOUND; --force drops it). --help says so. */
START_TEST(register_outlives_the_command) {
  cd_daemon d;
  cd_start(&d);
  use_runtime_dir(&d, "rt-owner");
  CLI_OK(&d, "register --model mlp --model-name q --init --json");
  const char *h = strstr(last_line(d.dir), "\"handle\":\"");
  ck_assert_msg(h, "%s", last_line(d.dir));
  char handle[32], args[128];
  snprintf(handle, sizeof handle, "%.*s", (int)strcspn(h + 10, "\""), h + 10);
  CLI_OK(&d, "run --model mlp --model-name r --fetch loss");
  cd_sleep_ms(3000);
  CLI_OK(&d, "save --model q --checkpoint x");
  ck_assert_msg(has_model(&d, "r"), "the run's model r went with the command");
  use_runtime_dir(&d, "rt-other"); /* the owner's own deregister needs no --force */
  snprintf(args, sizeof args, "deregister --handle %s", handle);
  ck_assert_int_eq(cli(&d, d.dir, args), 1);
  ck_assert_msg(strstr(slurp(d.dir, "err"), "PERMISSION_DENIED"), "%s", slurp(d.dir, "err"));
  snprintf(args, sizeof args, "deregister --force --handle %s", handle);
  CLI_OK(&d, args);
  ck_assert_msg(!has_model(&d, "q"), "model q still there after deregister --force");
  ck_assert_int_eq(cli(NULL, d.dir, "register --help"), 0);
  ck_assert_msg(strstr(slurp(d.dir, "out"), "stays registered after this command exits"), "%s",
                slurp(d.dir, "out"));
  cd_stop(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("client_cli_programs");
  TCase *tc = tcase_create("client_cli_programs");
  tcase_add_test(tc, drop_model_frees_the_name);
  tcase_add_test(tc, run_fetches_and_trace_paths);
  tcase_add_test(tc, deregister_of_another_clients_program);
  tcase_add_test(tc, register_outlives_the_command);
  tcase_add_test(tc, fetch_of_fused_intermediate);
  suite_add_tcase(s, tc);
  return s;
}

CLI_CHECK_MAIN(suite)
