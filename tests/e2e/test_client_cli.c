/* pe-client against the real daemon: ping; train on a subset with --json
 * (the last line parses and has sane figures; without --persistent the model
 * goes when the trainer ends, and a second run starts afresh); eval reproduces the trained
 * model's test accuracy; save, load, status; trace writes a Chrome trace; a
 * model file trains exactly like the built-in name, and shared-memory feeds
 * exactly like inline ones; exit statuses for a bad model file, bad usage,
 * a daemon error and an unreachable daemon; drop-model frees a model name
 * for a program of other shapes. Needs Fashion-MNIST (the
 * project's dependency). Skipped (77) when pe-executord or pe-client is not
 * built. */
#include <arpa/inet.h>
#include <check.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

#include "client_daemon.h"

/* Run pe-client ARGS against d (NULL: no --socket), stdout to d->dir/out,
 * stderr to d->dir/err; returns the exit status. */
static int cli(const cd_daemon *d, const char *dir, const char *args) {
  char bin[1024], cmd[4096];
  cd_binary(bin, sizeof bin, "pe-client");
  snprintf(cmd, sizeof cmd, "'%s' %s%s%s %s >'%s/out' 2>'%s/err'", bin, d ? "--socket '" : "",
           d ? d->addr : "", d ? "'" : "", args, dir, dir);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The whole of dir/name (static buffer). */
static const char *slurp(const char *dir, const char *name) {
  static char buf[1 << 16];
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "r");
  buf[0] = 0;
  if (!f) return buf;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

/* The last non-empty line of dir/out. */
static const char *last_line(const char *dir) {
  static char line[1 << 14];
  const char *all = slurp(dir, "out");
  size_t n = strlen(all);
  while (n && all[n - 1] == '\n') n--;
  size_t s = n;
  while (s && all[s - 1] != '\n') s--;
  snprintf(line, sizeof line, "%.*s", (int)(n - s), all + s);
  return line;
}

/* The number after "key": in a flat JSON object; NAN when absent. */
static double json_num(const char *json, const char *key) {
  char pat[96];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(json, pat);
  if (!p) return NAN;
  char *end;
  double v = strtod(p + strlen(pat), &end);
  return end == p + strlen(pat) ? NAN : v;
}

/* Write a model file `name` in d's directory; its path into path. */
static void write_model(const cd_daemon *d, const char *name, const char *text, char *path,
                        size_t n) {
  snprintf(path, n, "%s/%s", d->dir, name);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_ge(fputs(text, f), 0);
  ck_assert_int_eq(fclose(f), 0);
}

static bool has_model(const cd_daemon *d, const char *name);

#define CLI_OK(d, args)                                                             \
  do {                                                                              \
    int cli_rc_ = cli(d, (d)->dir, args);                                           \
    if (cli_rc_) cd_dump_log(d);                                                    \
    ck_assert_msg(cli_rc_ == 0, "pe-client %s: exit %d\nstderr: %s", args, cli_rc_, \
                  slurp((d)->dir, "err"));                                          \
  } while (0)

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
  /* The places the daemon put the model on (auto without a GPU: cpu:1), not "". */
  ck_assert_msg(strstr(first, "\"places\":\"cpu:1\""), "%s", first);
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
                    json_num(st, "host_bytes_in_use") > 0,
                "%s", st);
  CLI_OK(&d, "status");
  ck_assert_msg(strstr(slurp(d.dir, "out"), "checkpoint 'after-train' written") &&
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
 * and through shared memory. */
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
  /* A strategy that does not exist: usage, exit 2. */
  ck_assert_int_eq(cli(&d, d.dir, "train --model mlp --strategy ring"), 2);
  ck_assert_ptr_nonnull(strstr(slurp(d.dir, "err"), "--strategy 'ring' unknown"));
  cd_stop(&d);
}
END_TEST

/* pe-client ARGS in the background (as cli()); returns its pid. */
static pid_t cli_start(const cd_daemon *d, const char *dir, const char *args) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) _exit(cli(d, dir, args));
  return pid;
}

static int cli_wait(pid_t pid) {
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Wait (30 s at most) until the daemon's log has `times` lines with
 * needle. */
static void wait_log(const cd_daemon *d, const char *needle, int times) {
  for (int i = 0; i < 600; i++) {
    FILE *f = fopen(d->log, "r");
    char line[1024];
    int n = 0;
    while (f && fgets(line, sizeof line, f)) n += strstr(line, needle) != NULL;
    if (f) fclose(f);
    if (n >= times) return;
    cd_sleep_ms(50);
  }
  cd_dump_log(d);
  ck_abort_msg("no %d lines with '%s' in the daemon's log after 30 s", times, needle);
}

/* `systemctl restart pe-executord` in the middle of a `pe-client train`,
 * then a crash that loses the newest steps: the trainer goes on
 * (libpeclient registers its programs again), and the trained parameters
 * are those of a run without either, to the last digit.
 *   - SIGTERM checkpoints every answered run: nothing is rolled back.
 *   - kill -9, with the restart checkpoint put back to the one SIGTERM
 *     wrote (as if the daemon died long before its next autosave): the
 *     answered steps since are rolled back, and the trainer goes back to
 *     where the parameters stand and repeats them on the same batches.
 * The model is the MLP with a dropout and a cosine learning-rate schedule:
 * every step draws a mask and moves the schedule's counter, and the
 * checkpoints carry the generator, so the repeated steps draw the masks
 * the lost ones drew. */
START_TEST(train_survives_restart) {
  cd_daemon d;
  cd_start(&d);
  char model[256], args[512];
  write_model(&d, "mlp-dropout",
              "name mlp\nbatch 128\ninput image 784\nlabel label\n"
              "fc 256 act=relu\ndropout 0.2\nfc 128 act=relu\nfc 10\n"
              "loss softmax_with_cross_entropy\naccuracy top=1\noptimizer momentum lr=0.1 mu=0.9\n"
              "schedule cosine warmup=50 decay_steps=2000 min_lr=0.001\n",
              model, sizeof model);
  snprintf(args, sizeof args,
           "train --model '%s' --epochs 30 --limit 10000 --persistent --json --quiet", model);
  char ref_args[640];
  snprintf(ref_args, sizeof ref_args, "%s --model-name ref", args);
  CLI_OK(&d, ref_args);
  char ref[1 << 14];
  snprintf(ref, sizeof ref, "%s", last_line(d.dir));

  pid_t pid = cli_start(&d, d.dir, args);
  wait_log(&d, "register client=", 4); /* ref's two programs, then this one's */
  cd_sleep_ms(300);
  cd_restart(&d, SIGTERM);
  char ckpt[256], old[256];
  snprintf(ckpt, sizeof ckpt, "%s/models/mlp/shutdown.ckpt", d.state);
  snprintf(old, sizeof old, "%s/sigterm.ckpt", d.dir);
  ck_assert(cd_copy_file(ckpt, old, 0600));
  wait_log(&d, "register client=", 5); /* the trainer's recovery */
  cd_sleep_ms(400);
  kill(d.pid, SIGKILL);
  ck_assert_int_eq(waitpid(d.pid, NULL, 0), d.pid);
  ck_assert(rename(old, ckpt) == 0);
  cd_spawn(&d, (uid_t)-1, (gid_t)-1);

  int rc = cli_wait(pid);
  if (rc) cd_dump_log(&d);
  char err[1 << 14];
  snprintf(err, sizeof err, "%s", slurp(d.dir, "err")); /* slurp's buffer is reused */
  ck_assert_msg(rc == 0, "pe-client train across restarts: exit %d\nstderr: %s", rc, err);
  const char *got = last_line(d.dir);
  ck_assert_msg(json_num(got, "recoveries") >= 2,
                "fewer than two recoveries: the restarts missed the training (%s)", got);
  ck_assert_msg(strstr(err, "0 answered request(s), 0 step(s), were rolled back"),
                "SIGTERM rolled steps back: %s", err);
  ck_assert_msg(json_num(got, "steps_rolled_back") > 0, "the kill -9 rolled nothing back: %s", got);
  ck_assert_msg(strstr(err, "repeating from step"), "%s", err);
  ck_assert_double_eq(json_num(got, "steps_repeated"), json_num(got, "steps_rolled_back"));
  ck_assert_double_eq(json_num(got, "steps"), json_num(ref, "steps"));
  ck_assert_double_eq(json_num(got, "final_loss"), json_num(ref, "final_loss"));
  ck_assert_msg(json_num(got, "test_accuracy") == json_num(ref, "test_accuracy"),
                "test accuracy %g after the restarts, %g without", json_num(got, "test_accuracy"),
                json_num(ref, "test_accuracy"));
  ck_assert_msg(json_num(ref, "test_accuracy") > 0.75, "%s", ref);
  /* The learning-rate schedule's step counter is model state: restored and
   * replayed with the parameters, it ends where the reference's ends. After
   * 30 x 79 = 2370 steps, past warmup (50) and decay (2000): min_lr. */
  ck_assert_double_eq(json_num(got, "final_learning_rate"), json_num(ref, "final_learning_rate"));
  ck_assert_double_eq_tol(json_num(ref, "final_learning_rate"), 0.001, 1e-9);
  cd_stop(&d);
}
END_TEST

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

START_TEST(exit_statuses) {
  cd_daemon d;
  cd_start(&d);
  /* A bad model file: line-numbered error, exit 1. */
  char path[256], args[512];
  snprintf(path, sizeof path, "%s/bad-model", d.dir);
  FILE *f = fopen(path, "w");
  fputs("input image 784\nlabel label\nfc 10 act=reul\n", f);
  fclose(f);
  snprintf(args, sizeof args, "train --model '%s'", path);
  ck_assert_int_eq(cli(&d, d.dir, args), 1);
  ck_assert_msg(strstr(slurp(d.dir, "err"), "bad-model:3: fc: unknown act 'reul'"), "%s",
                slurp(d.dir, "err"));
  /* A batch larger than the data set: usage, exit 2 (it trained one short
   * batch per epoch, reported as "batch":512). */
  ck_assert_int_eq(cli(&d, d.dir, "train --model mlp --batch 512 --limit 300"), 2);
  ck_assert_msg(strstr(slurp(d.dir, "err"),
                       "--batch 512 is larger than the 300 training "
                       "examples (--limit)"),
                "%s", slurp(d.dir, "err"));
  /* An unknown option: usage, exit 2. */
  ck_assert_int_eq(cli(&d, d.dir, "train --model mlp --epoch 1"), 2);
  ck_assert_ptr_nonnull(strstr(slurp(d.dir, "err"), "unknown option '--epoch'"));
  /* A daemon error: exit 1 with the daemon's code name. */
  ck_assert_int_eq(cli(&d, d.dir, "load --model mlp --checkpoint ../x"), 1);
  ck_assert_msg(strstr(slurp(d.dir, "err"), "INVALID_ARGUMENT"), "%s", slurp(d.dir, "err"));
  /* No daemon at the socket: exit 3. */
  snprintf(args, sizeof args, "--socket 'ipc://%s/none.sock' ping", d.dir);
  ck_assert_int_eq(cli(NULL, d.dir, args), 3);
  ck_assert_ptr_nonnull(strstr(slurp(d.dir, "err"), "no daemon socket at"));
  /* Not an address: says what one looks like. */
  ck_assert_int_eq(cli(NULL, d.dir, "--socket garbage ping"), 3);
  ck_assert_msg(strstr(slurp(d.dir, "err"), "(expected ipc://PATH or tcp://HOST:PORT)"), "%s",
                slurp(d.dir, "err"));
  cd_stop(&d);
}
END_TEST

/* A model file without an 'optimizer' line has a loss and no updates: a
 * train of it is refused (it would change nothing: it used to "train"
 * with lr nan), naming the file and the way out; --optimizer with --lr
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

/* --json promises a JSON last line: a failure prints
 * {"cmd":...,"ok":false,"error":...,"code":...} with the exit status
 * unchanged (1 failed, 2 usage, 3 unreachable); success lines say
 * "ok":true. Errors name the command once ("pe-client run: fetch ...",
 * not "run: run: ..."). eval refuses train's options by name. */
START_TEST(failures_end_with_json) {
  cd_daemon d;
  cd_start(&d);
  char path[256], args[512];
  write_model(&d, "bad-model", "input image 784\nlabel label\nfc 10 act=reul\n", path, sizeof path);
  struct {
    const char *args;
    int rc;
    const char *cmd, *code, *error;
  } cases[] = {
      {"train --model '%s' --json", 1, "train", "FAILED", "bad-model:3: fc: unknown act 'reul'"},
      {"--json train --model mlp --epoch 1", 2, "train", "USAGE", "unknown option '--epoch'"},
      {"eval --model mlp --lr 0.1 --json", 2, "eval", "USAGE", "--lr is a training option"},
      {"eval --model mlp --epochs=2 --json", 2, "eval", "USAGE", "--epochs is a training option"},
      {"load --model mlp --checkpoint ../x --json", 1, "load", "INVALID_ARGUMENT", ""},
      {"run --model mlp --fetch nosuch --json", 1, "run", "UNKNOWN_VARIABLE",
       "fetch 'nosuch' is not a variable"},
      {"register --model mlp --places cpu:99 --json", 1, "register", "INVALID_ARGUMENT",
       "options.places"},
      {"--json frobnicate", 2, NULL, "USAGE", "unknown command 'frobnicate'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(args, sizeof args, cases[i].args, path);
    ck_assert_msg(cli(&d, d.dir, args) == cases[i].rc, "%s: %s", args, slurp(d.dir, "err"));
    char want[256];
    if (cases[i].cmd)
      snprintf(want, sizeof want, "{\"cmd\":\"%s\",\"ok\":false,\"error\":\"", cases[i].cmd);
    else
      snprintf(want, sizeof want, "{\"cmd\":null,\"ok\":false,\"error\":\"");
    const char *line = last_line(d.dir);
    ck_assert_msg(!strncmp(line, want, strlen(want)) && strstr(line, cases[i].error), "%s: %s",
                  args, line);
    snprintf(want, sizeof want, "\"code\":\"%s\"}", cases[i].code);
    ck_assert_msg(strstr(line, want), "%s: %s", args, line);
    /* The command's name once (libpeclient names the request too). */
    if (cases[i].cmd) {
      snprintf(want, sizeof want, "%s: %s:", cases[i].cmd, cases[i].cmd);
      ck_assert_msg(!strstr(slurp(d.dir, "err"), want), "%s", slurp(d.dir, "err"));
    }
  }
  /* No daemon: exit 3, and the line. */
  snprintf(args, sizeof args, "--socket 'ipc://%s/none.sock' --json ping", d.dir);
  ck_assert_int_eq(cli(NULL, d.dir, args), 3);
  ck_assert_msg(strstr(last_line(d.dir), "{\"cmd\":\"ping\",\"ok\":false,") &&
                    strstr(last_line(d.dir), "no daemon socket at"),
                "%s", last_line(d.dir));
  CLI_OK(&d, "--json ping");
  ck_assert_ptr_nonnull(strstr(last_line(d.dir), "{\"cmd\":\"ping\",\"ok\":true,"));
  CLI_OK(&d, "status --json");
  ck_assert_ptr_nonnull(strstr(last_line(d.dir), "{\"cmd\":\"status\",\"ok\":true,"));
  CLI_OK(&d, "register --model mlp --model-name fresh --init --json");
  ck_assert_msg(strstr(last_line(d.dir), "{\"cmd\":\"register\",\"ok\":true,\"model\":\"fresh\"") &&
                    strstr(last_line(d.dir), "\"initialized\":true}"),
                "%s", last_line(d.dir));
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
 * keep it (review 3 #11: "is not a variable of the graph"); --keep and
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

/* deregister: each pe-client command is a client of its own, so the program
 * an earlier `register` left is another client's: refused with the reason
 * (exit 1, PERMISSION_DENIED), and --force drops it. */
START_TEST(deregister_of_another_clients_program) {
  cd_daemon d;
  cd_start(&d);
  CLI_OK(&d, "register --model mlp --model-name owned --init --json");
  ck_assert_msg(strstr(last_line(d.dir), "\"places\":\"cpu:1\""), "%s", last_line(d.dir));
  const char *h = strstr(last_line(d.dir), "\"handle\":\"");
  ck_assert_msg(h, "%s", last_line(d.dir));
  char handle[32], args[128];
  snprintf(handle, sizeof handle, "%.*s", (int)strcspn(h + 10, "\""), h + 10);
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
 * them until the session TTL, on ipc:// too (review 3 #10: the daemon's
 * sweep of exited processes dropped them about a second after the
 * command): 3 s later (past the sweep) `save` of a `register --init`
 * model works, a `run`'s model is still there, and the handle register
 * printed is still registered (PERMISSION_DENIED, not NOT_FOUND; --force
 * drops it). --help says so. */
START_TEST(register_outlives_the_command) {
  cd_daemon d;
  cd_start(&d);
  CLI_OK(&d, "register --model mlp --model-name q --init --json");
  const char *h = strstr(last_line(d.dir), "\"handle\":\"");
  ck_assert_msg(h, "%s", last_line(d.dir));
  char handle[32], args[128];
  snprintf(handle, sizeof handle, "%.*s", (int)strcspn(h + 10, "\""), h + 10);
  CLI_OK(&d, "run --model mlp --model-name r --fetch loss");
  cd_sleep_ms(3000);
  CLI_OK(&d, "save --model q --checkpoint x");
  ck_assert_msg(has_model(&d, "r"), "the run's model r went with the command");
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

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A daemon whose max_message is below the client's: the replies tell the
 * client, so a socket-fed request over it fails at once naming both
 * limits and the ways out (nanomsg would drop it unanswered: a wait of the
 * whole --timeout), and train fits its requests under it. */
START_TEST(daemon_max_message_reaches_the_client) {
  cd_daemon d;
  cd_start_conf(&d, "[limits]\nmax_message = 64K\n");
  /* One 128-example MLP batch is ~400 KB. */
  double t0 = now_s();
  int rc = cli(&d, d.dir,
               "--timeout 30000 train --model mlp --model-name big --epochs 1 --limit 256 "
               "--quiet --feed socket");
  double took = now_s() - t0;
  const char *err = slurp(d.dir, "err");
  ck_assert_msg(rc == 1 && took < 10, "exit %d after %.1f s: %s", rc, took, err);
  ck_assert_msg(strstr(err,
                       "over the daemon's max_message of 65536 bytes (this client's is "
                       "67108864)") &&
                    strstr(err, "--feed shm") && strstr(err, "MESSAGE_TOO_LARGE"),
                "%s", err);
  /* 16 examples (~50 KB) fit: one per request, trained through the socket. */
  CLI_OK(&d,
         "--timeout 30000 train --model mlp --model-name small --epochs 1 --limit 256 --batch 16 "
         "--quiet --feed socket --json");
  ck_assert_msg(json_num(last_line(d.dir), "steps") == 16, "%s", last_line(d.dir));
  CLI_OK(&d, "ping");
  cd_stop(&d);
}
END_TEST

/* The daemon stops for good in the middle of a train: the trainer fails
 * after about one --timeout, not one per clean-up request (it waited for
 * the shm region's register again, the program's register again and the
 * close: three timeouts). */
START_TEST(daemon_gone_costs_one_timeout) {
  cd_daemon d;
  cd_start(&d);
  pid_t pid = cli_start(&d, d.dir,
                        "--timeout 4000 train --model mlp --model-name gone --epochs 50 --quiet");
  wait_log(&d, "kind=register_shm", 1); /* the feeds' region: training starts */
  cd_sleep_ms(1000);
  double t0 = now_s();
  kill(d.pid, SIGTERM); /* cd_stop below reaps it and checks its exit 0 */
  /* 3, daemon unreachable, whether the SIGTERM cancelled a run in flight
   * (NOT_FOUND, then the recovery got no reply) or came between requests. */
  ck_assert_int_eq(cli_wait(pid), 3);
  double waited = now_s() - t0;
  ck_assert_msg(waited < 7.5, "the trainer took %.1f s to give up (--timeout 4000): %s", waited,
                slurp(d.dir, "err"));
  ck_assert_msg(strstr(slurp(d.dir, "err"), "no reply from"), "%s", slurp(d.dir, "err"));
  cd_stop(&d);
}
END_TEST

/* The column where the help text of option `name` starts in text (-1: no
 * such line). */
static int help_column(const char *text, const char *name) {
  const char *p = strstr(text, name);
  if (!p) return -1;
  const char *line = p;
  while (line > text && line[-1] != '\n') line--;
  p += strlen(name);
  while (*p == ' ' || (*p >= 'A' && *p <= 'Z')) p++; /* blanks and N, X, VALUE */
  return (int)(p - line);
}

/* Help asked for goes to stdout with exit 0 (pe-client train --help | less
 * showed nothing: it went to stderr), in one column; a usage error keeps
 * it on stderr, exit 2. The command list does not show optional options
 * as required. */
START_TEST(help_goes_to_stdout) {
  char dir[] = "/tmp/pe-client-help-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  const char *cmds[] = {"train --help", "eval --help", "ping --help", "save -h", "--help"};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    ck_assert_int_eq(cli(NULL, dir, cmds[i]), 0);
    ck_assert_msg(strstr(slurp(dir, "out"), "usage: pe-client") ||
                      strstr(slurp(dir, "out"), "options of pe-client"),
                  "%s: stdout: %s", cmds[i], slurp(dir, "out"));
    ck_assert_msg(!*slurp(dir, "err"), "%s: stderr: %s", cmds[i], slurp(dir, "err"));
  }
  ck_assert_int_eq(cli(NULL, dir, "train --help"), 0);
  char text[1 << 14];
  snprintf(text, sizeof text, "%s", slurp(dir, "out"));
  int col = help_column(text, "--model ");
  ck_assert_int_gt(col, 0);
  const char *names[] = {"--steps-per-request ", "--warmup-epochs ", "--lr ", "--no-decay-1d "};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    ck_assert_msg(help_column(text, names[i]) == col, "%s: help at column %d, --model's at %d:\n%s",
                  names[i], help_column(text, names[i]), col, text);
  ck_assert_int_eq(cli(NULL, dir, "--help"), 0);
  ck_assert_msg(strstr(slurp(dir, "out"), "train      --model M [--epochs N] [--batch N]"), "%s",
                slurp(dir, "out"));
  ck_assert_int_eq(cli(NULL, dir, "train --bogus"), 2);
  ck_assert_msg(!*slurp(dir, "out"), "%s", slurp(dir, "out"));
  ck_assert_msg(strstr(slurp(dir, "err"), "unknown option '--bogus'") &&
                    strstr(slurp(dir, "err"), "options of pe-client train"),
                "%s", slurp(dir, "err"));
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* A free TCP port on 127.0.0.1 (the kernel's pick, released again). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof sa;
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
  close(fd);
  return ntohs(sa.sin_port);
}

/* Is a model of this name on d (status)? */
static bool has_model(const cd_daemon *d, const char *name) {
  pe_client *c = cd_connect(d);
  pe_client_status st;
  CD_OK(c, pe_client_get_status(c, &st));
  bool found = false;
  for (size_t i = 0; i < st.n_models; i++) found |= !strcmp(st.models[i].name, name);
  pe_client_close(c);
  pe_client_free(c);
  return found;
}

/* Ctrl-C or kill of a trainer over tcp:// (where the daemon cannot see the
 * process exit; the session TTL is 600 s): the trainer ends its session
 * before it dies of the signal, so its model is freed at once and the
 * next train of the name starts afresh. */
START_TEST(interrupted_train_ends_its_session) {
  cd_daemon d;
  cd_prepare(&d);
  snprintf(d.addr, sizeof d.addr, "tcp://127.0.0.1:%d", free_port());
  cd_spawn(&d, (uid_t)-1, (gid_t)-1);
  const int sigs[] = {SIGINT, SIGTERM};
  for (int i = 0; i < 2; i++) {
    char bin[1024], name[32], err[256];
    cd_binary(bin, sizeof bin, "pe-client");
    snprintf(name, sizeof name, "sig%d", sigs[i]);
    snprintf(err, sizeof err, "%s/err", d.dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      signal(SIGINT, SIG_DFL);
      if (!freopen(err, "w", stderr)) _exit(126);
      execl(bin, bin, "--socket", d.addr, "train", "--model", "mlp", "--model-name", name,
            "--epochs", "1000", "--limit", "20000", "--quiet", (char *)NULL);
      _exit(127);
    }
    wait_log(&d, "register client=", 2 * (i + 1)); /* its training and evaluation programs */
    cd_sleep_ms(500);
    ck_assert_msg(has_model(&d, name), "model %s is not there while it trains", name);
    double t0 = now_s();
    ck_assert_int_eq(kill(pid, sigs[i]), 0);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    double took = now_s() - t0;
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == sigs[i], "status 0x%x after signal %d: %s", st,
                  sigs[i], slurp(d.dir, "err"));
    ck_assert_msg(took < 3, "the trainer took %.1f s to die of signal %d", took, sigs[i]);
    if (has_model(&d, name)) cd_dump_log(&d);
    ck_assert_msg(!has_model(&d, name),
                  "model %s still there after signal %d: the session lives on", name, sigs[i]);
    ck_assert_msg(strstr(slurp(d.dir, "err"), "ending the session"), "%s", slurp(d.dir, "err"));
  }
  cd_stop(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("client_cli");
  TCase *tc = tcase_create("client_cli");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, train_eval_save_trace);
  tcase_add_test(tc, model_file_trains_like_the_name);
  tcase_add_test(tc, grouped_requests_train_alike);
  tcase_add_test(tc, recipe_flags_are_the_model_file);
  tcase_add_test(tc, exit_statuses);
  tcase_add_test(tc, drop_model_frees_the_name);
  tcase_add_test(tc, train_survives_restart);
  tcase_add_test(tc, resnet_file_trains);
  tcase_add_test(tc, no_optimizer_no_training);
  tcase_add_test(tc, failures_end_with_json);
  tcase_add_test(tc, run_fetches_and_trace_paths);
  tcase_add_test(tc, deregister_of_another_clients_program);
  tcase_add_test(tc, register_outlives_the_command);
  tcase_add_test(tc, fetch_of_fused_intermediate);
  tcase_add_test(tc, daemon_gone_costs_one_timeout);
  tcase_add_test(tc, explicit_zero_recipe_flags);
  tcase_add_test(tc, daemon_max_message_reaches_the_client);
  tcase_add_test(tc, interrupted_train_ends_its_session);
  tcase_add_test(tc, help_goes_to_stdout);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  cd_require_binary("pe-executord");
  cd_require_binary("pe-client");
  SRunner *sr = srunner_create(suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
