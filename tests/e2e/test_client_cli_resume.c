/* pe-client train continuing a model that has values: an
 * explicit --lr is applied to a trained model; switching the optimizer
 * reports the trained parameters as kept (not "fresh"); --start-epoch
 * continues the data order, so 1 + 1 epochs equal 2, and without it the
 * next train continues at the model's epoch count (across a restart too);
 * the added state's names; a diverged run's
 * --json line is JSON (null, not -nan), from pe-client and pe-bench; the
 * messages (drop-model's hint, get_params of a model without values, a
 * top-K accuracy's label); export, import and train --init-from. Skipped (77) without pe-executord
 * or pe-client. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_cli.h"

/* json is one strict JSON object: no NaN/inf spelling, and python3's json
 * (when there is one) parses it with NaN refused. */
static void assert_strict_json(const cd_daemon *d, const char *json) {
  ck_assert_msg(!strstr(json, "nan") && !strstr(json, "inf"), "not JSON: %s", json);
  char path[512], cmd[1024];
  snprintf(path, sizeof path, "%s/line.json", d->dir);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(json, f);
  fclose(f);
  if (system("command -v python3 >/dev/null 2>&1")) return;
  snprintf(cmd, sizeof cmd,
           "python3 -c 'import json,sys\n"
           "def bad(c): raise ValueError(c)\n"
           "json.loads(open(sys.argv[1]).read(), parse_constant=bad)' '%s'",
           path);
  ck_assert_msg(system(cmd) == 0, "python3's json refuses: %s", json);
}

/* An explicit --lr takes effect on a model that has values (Init sets the
 * program's learning_rate even when nothing else is missing); left out,
 * the model file's rate is the program's again. */
START_TEST(explicit_lr_on_trained_model) {
  cd_daemon d;
  cd_start(&d);
  const char *base =
      "train --model mlp --model-name lr2 --epochs 1 --limit 384 --persistent "
      "--json --quiet";
  char args[1024];
  CLI_OK(&d, base);
  ck_assert_double_eq_tol(json_num(last_line(d.dir), "final_learning_rate"), 0.1, 1e-7);
  snprintf(args, sizeof args, "%s --lr 0.001", base);
  CLI_OK(&d, args);
  ck_assert_msg(fabs(json_num(last_line(d.dir), "final_learning_rate") - 0.001) < 1e-9,
                "--lr 0.001 on a trained model: %s", last_line(d.dir));
  snprintf(args, sizeof args, "%s --lr 0.5 --momentum 0", base);
  CLI_OK(&d, args);
  ck_assert_msg(fabs(json_num(last_line(d.dir), "final_learning_rate") - 0.5) < 1e-7, "%s",
                last_line(d.dir));
  CLI_OK(&d, base);
  ck_assert_msg(fabs(json_num(last_line(d.dir), "final_learning_rate") - 0.1) < 1e-7, "%s",
                last_line(d.dir));
  /* A model file's schedule (its op computes the rate from its base): the
   * explicit rate is its base on a trained model too. */
  char model[512];
  write_model(&d, "sched",
              "name sched\nbatch 128\ninput image 784\nlabel label\nfc 64 act=relu\nfc 10\n"
              "loss softmax_with_cross_entropy\naccuracy top=1\noptimizer momentum lr=0.1 mu=0.9\n"
              "schedule step decay_steps=1000\n",
              model, sizeof model);
  snprintf(args, sizeof args,
           "train --model '%s' --epochs 1 --limit 384 --persistent --json --quiet", model);
  CLI_OK(&d, args);
  ck_assert_double_eq_tol(json_num(last_line(d.dir), "final_learning_rate"), 0.1, 1e-7);
  snprintf(args + strlen(args), sizeof args - strlen(args), " --lr 0.002");
  CLI_OK(&d, args);
  ck_assert_msg(fabs(json_num(last_line(d.dir), "final_learning_rate") - 0.002) < 1e-9, "%s",
                last_line(d.dir));
  cd_stop(&d);
}
END_TEST

/* Another optimizer on a trained model: Init adds the new optimizer's
 * state only; the parameters are the trained ones, and the output says so. */
START_TEST(optimizer_switch_keeps_parameters) {
  cd_daemon d;
  cd_start(&d);
  CLI_OK(&d, "train --model mlp --model-name sw --epochs 1 --limit 384 --persistent --json");
  ck_assert_msg(strstr(last_line(d.dir),
                       "\"fresh_parameters\":true,\"initialized\":true,\"added_state\":false"),
                "%s", last_line(d.dir));
  CLI_OK(&d,
         "train --model mlp --model-name sw --epochs 1 --limit 384 --persistent --json "
         "--optimizer adam --lr 0.001");
  ck_assert_msg(strstr(last_line(d.dir),
                       "\"fresh_parameters\":false,\"initialized\":false,\"added_state\":true"),
                "%s", last_line(d.dir));
  const char *err = slurp(d.dir, "err");
  /* The notice names the added state (Adam's 4 tensors per parameter),
   * the first few of them. */
  ck_assert_msg(strstr(err, "model 'sw' already has values") &&
                    strstr(err, "initialised 24 new variables: fc_0.w@MOMENT1, ") &&
                    strstr(err, ", ...\n") && !strstr(err, "trainer.epochs_done") &&
                    strstr(err, "pe-client drop-model --model sw starts it afresh"),
                "%s", err);
  cd_stop(&d);
}
END_TEST

/* 1 epoch, then 1 more with --start-epoch 2, trains exactly as 2 epochs in
 * one run: the second run sees epoch 2's shuffle, not epoch 1's again. */
START_TEST(start_epoch_continues_the_order) {
  cd_daemon d;
  cd_start(&d);
  const char *common = "--epochs 1 --limit 640 --json --quiet --persistent";
  char args[512], two[4096];
  snprintf(args, sizeof args,
           "train --model mlp --model-name ra --limit 640 --epochs 2 --json "
           "--quiet");
  CLI_OK(&d, args);
  snprintf(two, sizeof two, "%s", last_line(d.dir));
  snprintf(args, sizeof args, "train --model mlp --model-name rb %s", common);
  CLI_OK(&d, args);
  snprintf(args, sizeof args, "train --model mlp --model-name rb %s --start-epoch 2", common);
  CLI_OK(&d, args);
  const char *split = last_line(d.dir);
  ck_assert_msg(json_num(split, "start_epoch") == 2, "%s", split);
  ck_assert_msg(json_num(split, "final_loss") == json_num(two, "final_loss") &&
                    json_num(split, "test_accuracy") == json_num(two, "test_accuracy"),
                "1 + 1 epochs %s\n2 epochs %s", split, two);
  cd_stop(&d);
}
END_TEST

/* Without --start-epoch a train of a persistent model continues where the
 * last one ended: the model keeps its epoch count (trainer.epochs_done),
 * across a daemon restart too, so 1 + 1 epochs in two commands are one
 * 2-epoch run; --start-epoch overrides it; eval of the restored model
 * works with the count in it. */
START_TEST(next_train_continues_the_epochs) {
  cd_daemon d;
  cd_start(&d);
  const char *common = "--epochs 1 --limit 640 --json --persistent";
  char args[512], two[4096], first[4096];
  CLI_OK(&d, "train --model mlp --model-name ra --limit 640 --epochs 2 --json --quiet");
  snprintf(two, sizeof two, "%s", last_line(d.dir));
  snprintf(args, sizeof args, "train --model mlp --model-name rb %s", common);
  CLI_OK(&d, args);
  snprintf(first, sizeof first, "%s", last_line(d.dir));
  ck_assert_msg(json_num(first, "start_epoch") == 1, "%s", first);
  CLI_OK(&d, args);
  const char *split = last_line(d.dir);
  ck_assert_msg(json_num(split, "start_epoch") == 2 &&
                    json_num(split, "final_loss") == json_num(two, "final_loss") &&
                    json_num(split, "test_accuracy") == json_num(two, "test_accuracy"),
                "1 + 1 epochs %s\n2 epochs %s", split, two);
  ck_assert_msg(strstr(slurp(d.dir, "err"), "epoch 2/2:") &&
                    strstr(slurp(d.dir, "err"), "training continues from them at epoch 2"),
                "%s", slurp(d.dir, "err"));

  /* The same across a restart: the count is in the restart checkpoint. */
  snprintf(args, sizeof args, "train --model mlp --model-name rc %s --quiet", common);
  CLI_OK(&d, args);
  cd_restart(&d, SIGTERM);
  CLI_OK(&d, "eval --model mlp --model-name rc --limit 640 --json");
  ck_assert_msg(json_num(last_line(d.dir), "test_accuracy") == json_num(first, "test_accuracy"),
                "%s", last_line(d.dir));
  CLI_OK(&d, args);
  split = last_line(d.dir);
  ck_assert_msg(json_num(split, "start_epoch") == 2 &&
                    json_num(split, "final_loss") == json_num(two, "final_loss") &&
                    json_num(split, "test_accuracy") == json_num(two, "test_accuracy"),
                "1 + restart + 1 epochs %s\n2 epochs %s", split, two);

  /* --start-epoch overrides the count, and the count follows the run. */
  snprintf(args, sizeof args, "train --model mlp --model-name rc %s --quiet --start-epoch 7",
           common);
  CLI_OK(&d, args);
  ck_assert_msg(json_num(last_line(d.dir), "start_epoch") == 7, "%s", last_line(d.dir));
  snprintf(args, sizeof args, "train --model mlp --model-name rc %s --quiet", common);
  CLI_OK(&d, args);
  ck_assert_msg(json_num(last_line(d.dir), "start_epoch") == 8, "%s", last_line(d.dir));
  cd_stop(&d);
}
END_TEST

/* A diverged run: by default the daemon stops it at its first NaN loss
 * (run/finite.h) and train exits non-zero naming it; with check_finite =
 * false it trains on, and its --json line says null for the loss, and
 * parses. */
START_TEST(diverged_run_json_is_json) {
  cd_daemon d;
  cd_start(&d);
  const char *div =
      "--json train --model mlp --model-name nl --lr 100000 --lr-schedule constant "
      "--epochs 1 --limit 640 --eval-every 1 --quiet";
  ck_assert_int_ne(cli(&d, d.dir, div), 0);
  const char *err = slurp(d.dir, "err");
  ck_assert_msg(strstr(err, "the loss 'mean_0.out' is nan at step"), "%s", err);
  cd_stop(&d);
  cd_start_conf(&d, "[runtime]\ncheck_finite = false\n");
  CLI_OK(&d, div);
  const char *j = last_line(d.dir);
  ck_assert_msg(strstr(j, "\"final_loss\":null,\"final_loss_finite\":false"), "%s", j);
  assert_strict_json(&d, j);
  /* pe-bench: the same model file at that rate. */
  const char *src = getenv("PE_SOURCE_DIR");
  char model[512], bin[1024], cmd[2048], text[1024];
  snprintf(text, sizeof text,
           "name mlpdiv\nbatch 128\ninput image 784\nlabel label\nfc 64 act=relu\nfc 10\n"
           "loss softmax_with_cross_entropy\naccuracy top=1\n"
           "optimizer momentum lr=100000 mu=0.9\n");
  write_model(&d, "mlpdiv", text, model, sizeof model);
  cd_binary(bin, sizeof bin, "pe-bench");
  if (access(bin, X_OK) == 0 && src) {
    snprintf(cmd, sizeof cmd, "'%s' train --model '%s' --steps 20 --json > '%s/out' 2>'%s/err'",
             bin, model, d.dir, d.dir);
    ck_assert_msg(system(cmd) == 0, "%s", slurp(d.dir, "err"));
    j = last_line(d.dir);
    ck_assert_msg(strstr(j, "\"final_loss\":null,\"final_loss_finite\":false"), "%s", j);
    assert_strict_json(&d, j);
    /* More threads than cores: a warning. */
    snprintf(cmd, sizeof cmd,
             "'%s' train --model '%s' --steps 1 --threads %ld --json > '%s/out' 2>'%s/err'", bin,
             model, sysconf(_SC_NPROCESSORS_ONLN) + 1, d.dir, d.dir);
    ck_assert_msg(system(cmd) == 0, "%s", slurp(d.dir, "err"));
    ck_assert_msg(strstr(slurp(d.dir, "err"), "is more than the"), "%s", slurp(d.dir, "err"));
  }
  cd_stop(&d);
}
END_TEST

/* get_params of a registered model without values names the model and
 * what to do; a top-5 accuracy is labelled as one. */
START_TEST(messages) {
  cd_daemon d;
  cd_start(&d);
  CLI_OK(&d, "register --model mlp --model-name nv --persistent");
  pe_client *c = cd_connect(&d);
  const pe_client_tensor *v;
  size_t n;
  ck_assert_int_ne(pe_client_get_params(c, "nv", NULL, 0, &v, &n), 0);
  ck_assert_msg(strstr(pe_client_error(c), "model 'nv' has no values") &&
                    strstr(pe_client_error(c), "pe-client register --init"),
                "%s", pe_client_error(c));
  pe_client_free(c);

  char model[512];
  write_model(&d, "top5",
              "name top5\nbatch 128\ninput image 784\nlabel label\nfc 64 act=relu\nfc 10\n"
              "loss softmax_with_cross_entropy\naccuracy top=5\noptimizer momentum lr=0.1 mu=0.9\n",
              model, sizeof model);
  char args[1024];
  snprintf(args, sizeof args, "train --model '%s' --epochs 1 --limit 384", model);
  CLI_OK(&d, args);
  ck_assert_msg(strstr(slurp(d.dir, "out"), "test top-5 accuracy") &&
                    strstr(slurp(d.dir, "err"), "train top-5 accuracy"),
                "%s%s", slurp(d.dir, "out"), slurp(d.dir, "err"));
  cd_stop(&d);
}
END_TEST

/* export writes a model's values to a file of one's own; import sets them
 * into another model (evaluating alike), and train --init-from starts one
 * from it: the file has the optimizer state too, so it continues exactly
 * as the exported model does. */
START_TEST(export_import_init_from) {
  cd_daemon d;
  cd_start(&d);
  char args[1024], file[512], cont[4096];
  snprintf(file, sizeof file, "%s/src.params", d.dir);
  CLI_OK(&d,
         "train --model mlp --model-name src --epochs 1 --limit 640 --persistent --quiet "
         "--json");
  double acc = json_num(last_line(d.dir), "test_accuracy");
  snprintf(args, sizeof args, "export --model src --out '%s' --json", file);
  CLI_OK(&d, args);
  /* 6 params, 6 velocities, lr, trainer.epochs_done */
  ck_assert_msg(json_num(last_line(d.dir), "tensors") == 14 &&
                    json_num(last_line(d.dir), "bytes") > 784 * 256 * 4,
                "%s", last_line(d.dir));

  CLI_OK(&d, "register --model mlp --model-name dst --persistent --init");
  snprintf(args, sizeof args, "import --model dst --in '%s' --json", file);
  CLI_OK(&d, args);
  ck_assert_msg(json_num(last_line(d.dir), "tensors") == 14, "%s", last_line(d.dir));
  CLI_OK(&d, "eval --model mlp --model-name dst --limit 640 --json");
  ck_assert_msg(json_num(last_line(d.dir), "test_accuracy") == acc, "%s vs %g", last_line(d.dir),
                acc);

  CLI_OK(&d,
         "train --model mlp --model-name src --epochs 1 --limit 640 --persistent --quiet "
         "--json --start-epoch 2");
  snprintf(cont, sizeof cont, "%s", last_line(d.dir));
  snprintf(args, sizeof args,
           "train --model mlp --model-name warm --epochs 1 --limit 640 --json --start-epoch 2 "
           "--init-from '%s'",
           file);
  CLI_OK(&d, args);
  const char *warm = last_line(d.dir);
  ck_assert_msg(json_num(warm, "init_from_tensors") == 12 &&
                    strstr(warm, "\"fresh_parameters\":false") &&
                    json_num(warm, "final_loss") == json_num(cont, "final_loss") &&
                    json_num(warm, "test_accuracy") == json_num(cont, "test_accuracy"),
                "--init-from %s\ncontinued %s", warm, cont);
  ck_assert_msg(strstr(slurp(d.dir, "err"), "model 'warm' starts from"), "%s", slurp(d.dir, "err"));
  /* import takes the epoch count too (dst continues at src's epoch 2);
   * --init-from does not: another model's values start a run at epoch 1. */
  CLI_OK(&d, "train --model mlp --model-name dst --epochs 1 --limit 640 --persistent --json");
  ck_assert_msg(json_num(last_line(d.dir), "start_epoch") == 2, "%s", last_line(d.dir));
  snprintf(args, sizeof args,
           "train --model mlp --model-name warm1 --epochs 1 --limit 640 --json --init-from '%s'",
           file);
  CLI_OK(&d, args);
  ck_assert_msg(json_num(last_line(d.dir), "start_epoch") == 1, "%s", last_line(d.dir));

  snprintf(args, sizeof args, "import --model dst --in '%s/none.params'", d.dir);
  ck_assert_int_eq(cli(&d, d.dir, args), 1);
  ck_assert_msg(strstr(slurp(d.dir, "err"), "none.params"), "%s", slurp(d.dir, "err"));
  cd_stop(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("client_cli_resume");
  TCase *tc = tcase_create("client_cli_resume");
  tcase_add_test(tc, explicit_lr_on_trained_model);
  tcase_add_test(tc, optimizer_switch_keeps_parameters);
  tcase_add_test(tc, start_epoch_continues_the_order);
  tcase_add_test(tc, next_train_continues_the_epochs);
  tcase_add_test(tc, diverged_run_json_is_json);
  tcase_add_test(tc, messages);
  tcase_add_test(tc, export_import_init_from);
  suite_add_tcase(s, tc);
  return s;
}

CLI_CHECK_MAIN(suite)
