/* pe-client train and eval against the real daemon: ping; train on a subset
 * with --json (the last line parses and has sane figures; without
 * --persistent the model goes when the trainer ends, and a second run starts
 * afresh); eval reproduces the trained model's test accuracy; save, load,
 * status; trace writes a Chrome trace; a model file trains exactly like the
 * built-in name, and shared-memory feeds exactly like inline ones; the
 * recipe flags, grouped requests and a model without an optimizer. Needs
 * Fashion-MNIST (the project's dependency). Skipped (77) when pe-executord
 * or pe-client is not built. The programs' commands are in
 * test_client_cli_programs.c, exit statuses and failures in
 * test_client_cli_failures.c. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "client_cli.h"

START_TEST(train_eval_save_trace) {
  cd_daemon d;
  cd_start(&d);
  CLI_OK(&d, "--json ping");
  ck_assert_ptr_nonnull(strstr(last_line(d.dir), "\"ok\":true"));

  /* A trainer ends its session when done: without --persistent its model
   * goes with it (status), and the next run starts afresh, exactly alike. */
  CLI_OK(&d, "train --model mlp --epochs 1 --limit 1000 --json");
  char first[4096];
  snprintf(first, sizeof first, "%s", last_line(d.dir));
  CLI_OK(&d, "--json status");
  ck_assert_msg(
      strstr(last_line(d.dir), "\"models\":[]") && json_num(last_line(d.dir), "programs") == 0 &&
          json_num(last_line(d.dir), "clients") == 1, /* this status: ping and train ended theirs */
      "after a non-persistent train: %s", last_line(d.dir));

  CLI_OK(&d, "train --model mlp --epochs 1 --limit 1000 --persistent --json");
  char train[4096];
  snprintf(train, sizeof train, "%s", last_line(d.dir));
  ck_assert_ptr_nonnull(strstr(first, "\"initialized\":true"));
  /* The places the daemon put the model on (auto without a GPU: the cpu
   * places its trial timed fastest, said in places_trial), not "". */
  ck_assert_msg(strstr(first, "\"places\":\"cpu:") && strstr(first, "\"places_trial\":{"), "%s",
                first);
  ck_assert_ptr_nonnull(strstr(train, "\"fresh_parameters\":true,\"initialized\":true"));
  ck_assert_msg(json_num(train, "final_loss") == json_num(first, "final_loss") &&
                    json_num(train, "test_accuracy") == json_num(first, "test_accuracy"),
                "a second run did not start afresh: %s after %s", train, first);
  ck_assert_msg(train[0] == '{' && train[strlen(train) - 1] == '}', "not JSON: %s", train);
  double sps = json_num(train, "samples_per_sec"), acc = json_num(train, "test_accuracy"),
         loss = json_num(train, "final_loss");
  ck_assert_msg(sps > 0, "%s", train);
  ck_assert_msg(acc > 0.3 && acc <= 1.0, "test_accuracy %g: %s", acc, train);
  ck_assert_msg(loss > 0 && loss < 2.3, "final_loss %g: %s", loss, train);
  ck_assert_double_eq(json_num(train, "epochs"), 1);
  ck_assert_double_eq(json_num(train, "samples"), 1000);
  ck_assert_double_eq(json_num(train, "steps"), 8); /* ceil(1000 / 128) */
  ck_assert_double_eq(json_num(train, "test_examples"), 1000);
  /* Progress went to stderr, not stdout. */
  ck_assert_ptr_nonnull(strstr(slurp(d.dir, "err"), "epoch 1/1"));

  /* eval on the same (persistent) parameters: the same accuracy, nothing
   * re-initialised. */
  CLI_OK(&d, "eval --model mlp --limit 1000 --json");
  const char *ev = last_line(d.dir);
  ck_assert_msg(json_num(ev, "test_accuracy") == acc, "eval %s vs train %s", ev, train);
  ck_assert_ptr_nonnull(strstr(ev, "\"fresh_parameters\":false,\"initialized\":false"));
  ck_assert_msg(!strstr(slurp(d.dir, "err"), "warning"), "%s", slurp(d.dir, "err"));
  /* eval of a name without values (a typo): freshly initialised
   * parameters, said on stderr and in the JSON; exit 0 (it said nothing). */
  CLI_OK(&d, "eval --model mlp --model-name mpl --limit 1000 --json");
  ck_assert_msg(strstr(last_line(d.dir), "\"fresh_parameters\":true,\"initialized\":true"), "%s",
                last_line(d.dir));
  ck_assert_msg(strstr(slurp(d.dir, "err"), "warning: model 'mpl' had no parameters"), "%s",
                slurp(d.dir, "err"));

  CLI_OK(&d, "save --model mlp --checkpoint after-train --json");
  ck_assert_msg(json_num(last_line(d.dir), "bytes") > 784 * 256 * 4, "%s", last_line(d.dir));
  CLI_OK(&d, "load --model mlp --checkpoint after-train");

  /* trace: one traced step, written as JSON */
  char args[512];
  snprintf(args, sizeof args, "trace --model mlp --out '%s/trace.json' --json", d.dir);
  CLI_OK(&d, args);
  ck_assert_msg(json_num(last_line(d.dir), "trace_bytes") > 0, "%s", last_line(d.dir));
  const char *tr = slurp(d.dir, "trace.json");
  while (*tr == ' ' || *tr == '\n') tr++;
  ck_assert_msg(*tr == '{' || *tr == '[', "trace does not start as JSON: %.40s", tr);

  CLI_OK(&d, "--json status");
  const char *st = last_line(d.dir);
  ck_assert_ptr_nonnull(strstr(st, "\"name\":\"mlp\""));
  /* The save above is the model's only checkpoint; the load and the traced
   * step changed the model since. */
  ck_assert_msg(strstr(st,
                       "\"checkpoints_saved\":1,\"checkpoint_failures\":0,"
                       "\"last_checkpoint\":\"after-train\"") &&
                    json_num(st, "changes_since_checkpoint") >= 2 &&
                    json_num(st, "checkpoint_interval_s") == 300 && json_num(st, "rss_bytes") > 0 &&
                    json_num(st, "host_bytes_in_use") > 0 &&
                    strstr(st, "\"cuda_graph\":false,\"cuda_graph_reason\":\"no cuda place\""),
                "%s", st);
  CLI_OK(&d, "status");
  ck_assert_msg(strstr(slurp(d.dir, "out"), "cuda graphs: off, no cuda place") &&
                    strstr(slurp(d.dir, "out"), "checkpoint 'after-train' written") &&
                    strstr(slurp(d.dir, "out"), "autosave every 300 s") &&
                    strstr(slurp(d.dir, "out"), "bytes resident; host tensors "),
                "%s", slurp(d.dir, "out"));
  cd_stop(&d);
}
END_TEST

START_TEST(model_file_trains_like_the_name) {
  cd_daemon d;
  cd_start(&d);
  const char *src = getenv("PE_SOURCE_DIR");
  char args[1024];
  snprintf(args, sizeof args,
           "train --model '%s/conf/models/mlp' --model-name from-file --epochs 1 --limit 500 "
           "--feed socket --json",
           src ? src : ".");
  CLI_OK(&d, args);
  char file_run[4096];
  snprintf(file_run, sizeof file_run, "%s", last_line(d.dir));
  ck_assert_ptr_nonnull(strstr(file_run, "\"shm\":false"));
  /* The built-in name, its batches through shared memory: the default on
   * an ipc:// socket. */
  CLI_OK(&d, "train --model mlp --model-name from-name --epochs 1 --limit 500 --json");
  const char *name_run = last_line(d.dir);
  ck_assert_ptr_nonnull(strstr(name_run, "\"shm\":true"));
  /* Same program, seed and data, inline or shared-memory feeds: the same
   * numbers. */
  ck_assert_msg(json_num(file_run, "final_loss") == json_num(name_run, "final_loss"),
                "file %s\nname %s", file_run, name_run);
  ck_assert_msg(json_num(file_run, "test_accuracy") == json_num(name_run, "test_accuracy"),
                "file %s\nname %s", file_run, name_run);
  cd_stop(&d);
}
END_TEST

/* conf/models/resnet (residual blocks: save / from / add, batch norm,
 * strided convolutions, global average pooling) trains through the daemon
 * on two places: the loss falls from chance and the test accuracy is well
 * above it after 32 steps (batch norm's running statistics need a few dozen). */
START_TEST(resnet_file_trains) {
  cd_daemon d;
  cd_start(&d);
  const char *src = getenv("PE_SOURCE_DIR");
  char args[1024];
  snprintf(args, sizeof args,
           "train --model '%s/conf/models/resnet' --places cpu:2 --epochs 4 --limit 512 --json",
           src ? src : ".");
  CLI_OK(&d, args);
  const char *run = last_line(d.dir);
  ck_assert_msg(json_num(run, "steps") == 32 && json_num(run, "final_loss") < 2.0 &&
                    json_num(run, "test_accuracy") > 0.4,
                "%s", run);
  cd_stop(&d);
}
END_TEST

/* The recipe flags train exactly like a model file that says the same in
 * its optimizer and schedule lines, with the schedule stretched over the
 * run (3 epochs of 4 steps: warmup 4, then cosine over the last 8 steps,
 * t = 0..7, so decay_steps 7: the last step runs at --min-lr); --eval-every adds
 * per-epoch test accuracies without changing the training; a bad flag is
 * an error naming it, and the daemon goes on serving. */
START_TEST(recipe_flags_are_the_model_file) {
  cd_daemon d;
  cd_start(&d);
  char model[256], args[512];
  write_model(&d, "mlp-adamw",
              "name mlp\nbatch 128\ninput image 784\nlabel label\n"
              "fc 256 act=relu\nfc 128 act=relu\nfc 10\n"
              "loss softmax_with_cross_entropy\naccuracy top=1\n"
              "optimizer adamw lr=0.001 weight_decay=0.05 no_decay_1d\n"
              "schedule cosine warmup=4 decay_steps=7 min_lr=0.0001\n",
              model, sizeof model);
  snprintf(args, sizeof args,
           "train --model '%s' --model-name file --epochs 3 --limit 512 --json --quiet", model);
  CLI_OK(&d, args);
  char file_run[4096];
  snprintf(file_run, sizeof file_run, "%s", last_line(d.dir));
  CLI_OK(&d,
         "train --model mlp --model-name flags --epochs 3 --limit 512 --json --quiet "
         "--optimizer adamw --lr 0.001 --weight-decay 0.05 --no-decay-1d "
         "--lr-schedule cosine --warmup-epochs 1 --min-lr 0.0001");
  char flags_run[4096];
  snprintf(flags_run, sizeof flags_run, "%s", last_line(d.dir)); /* last_line's buffer is reused */
  ck_assert_double_eq(json_num(flags_run, "steps"), 12);
  const char *keys[] = {"final_loss", "final_train_accuracy", "test_accuracy",
                        "final_learning_rate"};
  for (int i = 0; i < 4; i++)
    ck_assert_msg(json_num(file_run, keys[i]) == json_num(flags_run, keys[i]),
                  "%s: file %s\nflags %s", keys[i], file_run, flags_run);
  /* The last step's rate is --min-lr: cosine at t = T (printed to 6 digits). */
  ck_assert_msg(fabs(json_num(flags_run, "final_learning_rate") - 1e-4) < 1e-9, "%s", flags_run);
  /* --eval-every 1: the test accuracy after each epoch, the last one the
   * final figure; evaluating between epochs changes nothing in training. */
  snprintf(args, sizeof args,
           "train --model '%s' --model-name evals --epochs 3 --limit 512 --json --quiet "
           "--eval-every 1",
           model);
  CLI_OK(&d, args);
  const char *evals = last_line(d.dir);
  ck_assert_double_eq(json_num(evals, "eval_every"), 1);
  const char *arr = strstr(evals, "\"test_accuracy_by_epoch\":[");
  ck_assert_msg(arr, "%s", evals);
  arr = strchr(arr, '[') + 1;
  double acc[3];
  for (int i = 0; i < 3; i++) {
    char *end;
    acc[i] = strtod(arr, &end);
    ck_assert_msg(end != arr && acc[i] > 0.1 && acc[i] <= 1, "entry %d: %s", i, evals);
    ck_assert_int_eq(*end, i < 2 ? ',' : ']');
    arr = end + 1;
  }
  ck_assert_msg(acc[2] == json_num(evals, "test_accuracy"), "%s", evals);
  ck_assert_msg(json_num(evals, "final_loss") == json_num(file_run, "final_loss") &&
                    json_num(evals, "test_accuracy") == json_num(file_run, "test_accuracy"),
                "with evaluations %s\nwithout %s", evals, file_run);
  /* A model that outlives its trainer, trained twice with the same flags:
   * the second run's schedule starts again at step 0 (the model's counter
   * says 12), so it ends at the same rate, not at min_lr. */
  const char *again =
      "train --model mlp --model-name again --persistent --epochs 3 --limit 512 "
      "--json --quiet --optimizer adamw --lr 0.001 --lr-schedule cosine "
      "--warmup-epochs 1 --min-lr 0.0001";
  double loss[2];
  for (int i = 0; i < 2; i++) {
    CLI_OK(&d, again);
    ck_assert_msg(json_num(last_line(d.dir), "final_learning_rate") ==
                      json_num(flags_run, "final_learning_rate"),
                  "run %d: %s", i, last_line(d.dir));
    loss[i] = json_num(last_line(d.dir), "final_loss");
  }
  ck_assert_msg(loss[1] < loss[0], "the second run (loss %g) did not go on from the first's (%g)",
                loss[1], loss[0]);
  /* --clip-norm: the program clips, so auto picks allreduce on two places;
   * it trains. On one place there is no strategy to speak of: "single"
   * (it said "sharded"). */
  CLI_OK(&d,
         "train --model mlp --model-name clipped --places cpu:2 --epochs 2 --limit 512 --json "
         "--quiet --clip-norm 0.5");
  const char *clipped = last_line(d.dir);
  ck_assert_msg(strstr(clipped, "\"strategy\":\"allreduce\""), "%s", clipped);
  ck_assert_msg(json_num(clipped, "test_accuracy") > 0.5, "%s", clipped);
  CLI_OK(&d, "train --model mlp --model-name one --places cpu:1 --limit 512 --json --quiet");
  ck_assert_msg(strstr(last_line(d.dir), "\"places\":\"cpu:1\",\"strategy\":\"single\""), "%s",
                last_line(d.dir));
  /* The momentum model, unchanged: not the same numbers. */
  CLI_OK(&d, "train --model mlp --model-name plain --epochs 3 --limit 512 --json --quiet");
  ck_assert(json_num(last_line(d.dir), "final_loss") != json_num(flags_run, "final_loss"));
  /* Bad flags are usage errors (exit 2), before anything is loaded. */
  ck_assert_int_eq(cli(&d, d.dir, "train --model mlp --limit 512 --optimizer rmsprop"), 2);
  ck_assert_ptr_nonnull(
      strstr(slurp(d.dir, "err"), "--optimizer 'rmsprop' unknown (known: sgd, momentum, "));
  ck_assert_int_eq(cli(&d, d.dir, "train --model mlp --limit 512 --lr-schedule poly"), 2);
  ck_assert_ptr_nonnull(strstr(slurp(d.dir, "err"), "--lr-schedule 'poly'"));
  ck_assert_int_eq(cli(&d, d.dir, "train --model mlp --limit 512 --min-lr 0.01"), 2);
  ck_assert_ptr_nonnull(strstr(slurp(d.dir, "err"), "--min-lr need --lr-schedule"));
  ck_assert_int_eq(
      cli(&d, d.dir, "train --model mlp --limit 512 --lr-schedule cosine --warmup-epochs 1"), 2);
  ck_assert_ptr_nonnull(strstr(slurp(d.dir, "err"), "leaves nothing of 1 epoch(s)"));
  ck_assert_int_eq(cli(&d, d.dir,
                       "train --model mlp --limit 512 --lr-schedule cosine --lr 0.01 "
                       "--min-lr 0.5"),
                   1);
  ck_assert_ptr_nonnull(strstr(slurp(d.dir, "err"), "min_lr"));
  CLI_OK(&d, "ping");
  cd_stop(&d);
}
END_TEST

/* Mini-batches grouped into requests (--steps-per-request, the daemon
 * runs each group back to back) train exactly like one request per
 * mini-batch: groups of 3 over 1000 examples (two full groups, then one
 * full batch and the short one of 104), and a --steps cap of 7 that cuts
 * the third group; on cpu:2 with the sharded update, through the socket
 * and through shared memory; and requests grown by time (the default over
 * shared memory) alike. */
START_TEST(grouped_requests_train_alike) {
  cd_daemon d;
  cd_start(&d);
  const char *runs[][2] = {
      {"--steps-per-request 1 --feed socket", "--steps-per-request 3 --feed socket"},
      {"--steps-per-request 1 --steps 7 --feed socket", "--steps-per-request 3 --steps 7 --shm"},
  };
  for (int i = 0; i < 2; i++) {
    char args[512], one[4096];
    for (int j = 0; j < 2; j++) {
      snprintf(args, sizeof args,
               "train --model mlp --model-name g%d%d --places cpu:2 --strategy sharded "
               "--epochs 2 --limit 1000 --json %s",
               i, j, runs[i][j]);
      CLI_OK(&d, args);
      const char *line = last_line(d.dir);
      ck_assert_ptr_nonnull(strstr(line, "\"strategy\":\"sharded\""));
      ck_assert_double_eq(json_num(line, "steps"), i ? 14 : 16);
      if (!j) {
        snprintf(one, sizeof one, "%s", line);
        continue;
      }
      ck_assert_double_eq(json_num(line, "steps_per_request"), 3);
      ck_assert_msg(json_num(line, "final_loss") == json_num(one, "final_loss") &&
                        json_num(line, "test_accuracy") == json_num(one, "test_accuracy"),
                    "grouped %s\nsingle %s", line, one);
    }
  }
  /* Without --steps-per-request, over shared memory, the requests grow
   * with the steps' speed (batches of 8 take well under a millisecond):
   * regrouped mid-epoch, across the epoch's end and a --steps cap, the
   * training is that of one request per mini-batch. */
  const char *caps[] = {"", "--steps 100"};
  const char *how[] = {"--steps-per-request 1 --feed socket", "--shm"};
  for (int i = 0; i < 2; i++) {
    char args[512], line[2][4096];
    for (int j = 0; j < 2; j++) {
      snprintf(args, sizeof args,
               "train --model mlp --model-name s%d%d --places cpu:2 --strategy sharded --batch 8 "
               "--lr 0.01 --epochs 2 --limit 2000 --json %s %s",
               i, j, how[j], caps[i]);
      CLI_OK(&d, args);
      snprintf(line[j], sizeof line[j], "%s", last_line(d.dir));
    }
    ck_assert_ptr_nonnull(strstr(line[1], "\"shm_rows\":true"));
    ck_assert_double_eq(json_num(line[1], "steps"), i ? 200 : 500);
    ck_assert_msg(json_num(line[1], "steps_per_request") > 16, "the requests did not grow: %s",
                  line[1]);
    ck_assert_msg(json_num(line[1], "final_loss") == json_num(line[0], "final_loss") &&
                      json_num(line[1], "test_accuracy") == json_num(line[0], "test_accuracy"),
                  "grown %s\nsingle %s", line[1], line[0]);
  }
  /* A strategy that does not exist: usage, exit 2. */
  ck_assert_int_eq(cli(&d, d.dir, "train --model mlp --strategy ring"), 2);
  ck_assert_ptr_nonnull(strstr(slurp(d.dir, "err"), "--strategy 'ring' unknown"));
  cd_stop(&d);
}
END_TEST

/* Over shared memory the training rows are held once, in their region:
 * the trainer's own copy (Fashion-MNIST's data set: 60,000 rows, 188 MB)
 * is released as it is copied in (both at once peaked at 408 MB; now
 * 234 MB). The bound: both splits, the batch buffers and the process
 * itself, well below a second copy of the training rows. */
START_TEST(training_rows_held_once) {
  cd_daemon d;
  cd_start(&d);
  CLI_OK(&d, "train --model mlp --model-name once --steps 2 --json --shm");
  const char *line = last_line(d.dir);
  ck_assert_msg(strstr(line, "\"shm_rows\":true"), "%s", line);
  struct rusage ru;
  ck_assert_int_eq(getrusage(RUSAGE_CHILDREN, &ru), 0); /* the largest waited-for child */
  long row = 784 * 4 + 8, train_kb = 60000 * row / 1024, test_kb = 10000 * row / 1024;
  /* Sanitizers' shadow and allocator add about 80 MB (317 MB seen with ASan). */
  long bound = train_kb + test_kb + train_kb * (getenv("PE_SANITIZED") ? 6 : 3) / 10 + 64 * 1024;
  ck_assert_msg(ru.ru_maxrss < bound, "pe-client peaked at %ld KB (bound %ld KB)", ru.ru_maxrss,
                bound);
  cd_stop(&d);
}
END_TEST

/* A model file without an 'optimizer' line has a loss and no updates: a
 * train of it is refused (it would change nothing, "training" with lr
 * nan), naming the file and the way out; --optimizer with --lr
 * gives it one and it trains; eval takes it as it is. */
START_TEST(no_optimizer_no_training) {
  cd_daemon d;
  cd_start(&d);
  char model[256], args[512];
  write_model(&d, "no-opt",
              "input image 784\nlabel label\nfc 10\nloss softmax_with_cross_entropy\naccuracy\n",
              model, sizeof model);
  snprintf(args, sizeof args, "train --model '%s' --limit 512 --json", model);
  ck_assert_int_eq(cli(&d, d.dir, args), 1);
  const char *err = slurp(d.dir, "err");
  ck_assert_msg(strstr(err, model) && strstr(err, "has no optimizer") &&
                    strstr(err, "'optimizer' line") && strstr(err, "--optimizer and --lr"),
                "%s", err);
  ck_assert_msg(
      strstr(last_line(d.dir), "\"ok\":false") && strstr(last_line(d.dir), "has no optimizer"),
      "%s", last_line(d.dir));
  snprintf(args, sizeof args, "train --model '%s' --limit 512 --optimizer sgd", model);
  ck_assert_int_eq(cli(&d, d.dir, args), 2);
  ck_assert_ptr_nonnull(strstr(slurp(d.dir, "err"), "--optimizer sgd needs --lr"));
  snprintf(args, sizeof args,
           "train --model '%s' --limit 512 --epochs 2 --optimizer sgd --lr 0.1 --json", model);
  CLI_OK(&d, args);
  ck_assert_msg(json_num(last_line(d.dir), "final_learning_rate") == 0.1 &&
                    json_num(last_line(d.dir), "test_accuracy") > 0.5,
                "%s", last_line(d.dir));
  ck_assert_msg(!strstr(slurp(d.dir, "err"), "nan"), "%s", slurp(d.dir, "err"));
  snprintf(args, sizeof args, "eval --model '%s' --limit 512", model);
  CLI_OK(&d, args);
  cd_stop(&d);
}
END_TEST

/* An explicit 0 in a recipe flag is applied, not taken for "not given":
 * --momentum 0 trains like plain sgd (not like the model's mu 0.9), and
 * --lr 0 is a usage error (the daemon refuses a learning rate of 0). */
START_TEST(explicit_zero_recipe_flags) {
  cd_daemon d;
  cd_start(&d);
  const char *base = "train --model mlp --epochs 1 --limit 384 --json --quiet";
  char args[256];
  double loss[3];
  const char *extra[] = {"", "--momentum 0", "--optimizer sgd"};
  for (int i = 0; i < 3; i++) {
    snprintf(args, sizeof args, "%s --model-name z%d %s", base, i, extra[i]);
    CLI_OK(&d, args);
    loss[i] = json_num(last_line(d.dir), "final_loss");
    ck_assert_msg(isfinite(loss[i]), "%s: %s", args, last_line(d.dir));
  }
  ck_assert_msg(loss[1] != loss[0], "--momentum 0 trained like mu 0.9 (loss %g)", loss[1]);
  ck_assert_msg(loss[1] == loss[2], "--momentum 0 %g, sgd %g", loss[1], loss[2]);
  snprintf(args, sizeof args, "%s --lr 0", base);
  ck_assert_int_eq(cli(&d, d.dir, args), 2);
  ck_assert_msg(strstr(slurp(d.dir, "err"), "--lr 0: the learning rate must be > 0"), "%s",
                slurp(d.dir, "err"));
  cd_stop(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("client_cli");
  TCase *tc = tcase_create("client_cli");
  tcase_add_test(tc, train_eval_save_trace);
  tcase_add_test(tc, model_file_trains_like_the_name);
  tcase_add_test(tc, grouped_requests_train_alike);
  tcase_add_test(tc, training_rows_held_once);
  tcase_add_test(tc, recipe_flags_are_the_model_file);
  tcase_add_test(tc, resnet_file_trains);
  tcase_add_test(tc, no_optimizer_no_training);
  tcase_add_test(tc, explicit_zero_recipe_flags);
  suite_add_tcase(s, tc);
  return s;
}

CLI_CHECK_MAIN(suite)
