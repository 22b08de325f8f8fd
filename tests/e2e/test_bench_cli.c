/* pe-bench train on a model file (--model FILE, pe_model_resolve): the file
 * of the built-in mlp benchmarks exactly like the name (same program, seed
 * and data: the same loss and accuracy), and the JSON line has the keys;
 * an unknown name says a file path is taken too. Needs Fashion-MNIST (the
 * project's dependency). rtt against a daemon of its own. Skipped (77)
 * when pe-bench is not built. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_daemon.h"
#include "ops/device_ctx.h"

static char out_text[1 << 14]; /* the last bench()'s whole stdout */
static long peak_kb;           /* the last bench()'s peak resident memory (KB) */

/* Run pe-bench ARGS with stdout and stderr into out and err of a fresh
 * directory; *json: the last stdout line (static). Returns the exit status.
 * wait4's usage of the shell includes the pe-bench it waited for. */
static int bench(const char *args, const char **json, const char **err) {
  static char line[1 << 14], errbuf[1 << 14];
  char bin[1024], cmd[4096], dir[] = "/tmp/pe-bench-cli-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  cd_binary(bin, sizeof bin, "pe-bench");
  snprintf(cmd, sizeof cmd, "'%s' %s >'%s/out' 2>'%s/err'", bin, args, dir, dir);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  int st;
  struct rusage ru;
  ck_assert_int_eq(wait4(pid, &st, 0, &ru), pid);
  peak_kb = ru.ru_maxrss;
  char path[128];
  snprintf(path, sizeof path, "%s/out", dir);
  FILE *f = fopen(path, "r");
  line[0] = out_text[0] = 0;
  for (char buf[sizeof line]; f && fgets(buf, sizeof buf, f);) {
    if (buf[0] == '{') snprintf(line, sizeof line, "%s", buf);
    strncat(out_text, buf, sizeof out_text - strlen(out_text) - 1);
  }
  if (f) fclose(f);
  snprintf(path, sizeof path, "%s/err", dir);
  f = fopen(path, "r");
  size_t n = f ? fread(errbuf, 1, sizeof errbuf - 1, f) : 0;
  errbuf[n] = 0;
  if (f) fclose(f);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
  *json = line;
  *err = errbuf;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static double json_num(const char *json, const char *key) {
  char pat[96];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(json, pat);
  return p ? strtod(p + strlen(pat), NULL) : NAN;
}

/* rtt: a tiny program's runs through a running daemon, timed one by one:
 * one JSON line with the count asked for and positive, ordered times; a
 * bad count is a usage error (2) and a daemon that is not there a failure
 * (1) that says so. */
START_TEST(rtt_times_runs_through_the_daemon) {
  cd_daemon d;
  cd_start(&d);
  char args[256];
  const char *json, *err;
  snprintf(args, sizeof args, "rtt --socket %s --count 50 --json", d.addr);
  ck_assert_msg(bench(args, &json, &err) == 0, "%s", err);
  ck_assert_msg(strstr(json, "\"bench\":\"rtt\",\"ok\":true"), "%s", json);
  ck_assert_double_eq(json_num(json, "count"), 50);
  double med = json_num(json, "us_median"), p99 = json_num(json, "us_p99");
  ck_assert_msg(med > 0 && p99 >= med, "%s", json);
  snprintf(args, sizeof args, "rtt --socket %s --count 0", d.addr);
  ck_assert_int_eq(bench(args, &json, &err), 2);
  ck_assert_msg(strstr(err, "--count"), "%s", err);
  cd_stop(&d);
  snprintf(args, sizeof args, "rtt --socket %s --count 5 --json", d.addr);
  ck_assert_int_eq(bench(args, &json, &err), 1);
  ck_assert_msg(strstr(json, "\"ok\":false"), "%s", json);
}
END_TEST

START_TEST(model_file_benchmarks_like_the_name) {
  const char *src = getenv("PE_SOURCE_DIR"), *json, *err;
  char args[1024], by_name[1 << 14];
  const char *common = "--executor parallel --places cpu:2 --steps 20 --json";
  snprintf(args, sizeof args, "train --model mlp %s", common);
  ck_assert_msg(bench(args, &json, &err) == 0, "%s", err);
  snprintf(by_name, sizeof by_name, "%s", json);
  snprintf(args, sizeof args, "train --model '%s/conf/models/mlp' %s", src ? src : ".", common);
  ck_assert_msg(bench(args, &json, &err) == 0, "%s", err);
  const char *keys[] = {"samples_per_sec", "test_accuracy", "final_loss", "train_seconds"};
  for (int i = 0; i < 4; i++)
    ck_assert_msg(isfinite(json_num(json, keys[i])), "no %s: %s", keys[i], json);
  ck_assert_double_eq(json_num(json, "steps"), 20);
  ck_assert_msg(json_num(json, "final_loss") == json_num(by_name, "final_loss") &&
                    json_num(json, "test_accuracy") == json_num(by_name, "test_accuracy"),
                "file %s\nname %s", json, by_name);
}
END_TEST

START_TEST(unknown_model_names_both_kinds) {
  const char *json, *err;
  ck_assert_int_ne(bench("train --model resnet50 --json", &json, &err), 0);
  ck_assert_msg(strstr(err, "resnet50") &&
                    strstr(err, "(or give a model file path, or the name of a file in "),
                "%s", err);
  ck_assert_int_ne(bench("train --model /nonexistent/model --json", &json, &err), 0);
  ck_assert_msg(strstr(err, "/nonexistent/model: No such file"), "%s", err);
  /* --json: the failure is the JSON line too */
  ck_assert_msg(strstr(json,
                       "{\"bench\":\"train\",\"ok\":false,\"error\":\"/nonexistent/model: No "
                       "such file") &&
                    strstr(json, "\"code\":\"FAILED\"}"),
                "%s", json);
}
END_TEST

/* --json prints one JSON line whatever happens: usage errors (exit 2)
 * and failed runs (exit 1) end with {"bench":...,"ok":false,...}. An
 * output file that cannot be written fails before the training, naming
 * the path and the reason; a model file without an optimizer is refused
 * (its "training" would change nothing). */
START_TEST(failures_end_with_json) {
  const char *json, *err;
  ck_assert_int_eq(bench("train --model mlp --epochz 2 --json", &json, &err), 2);
  ck_assert_msg(strstr(json,
                       "{\"bench\":\"train\",\"ok\":false,\"error\":\"unknown option "
                       "'--epochz'\",\"code\":\"USAGE\"}"),
                "%s", json);
  ck_assert_int_eq(bench("engine --ops 0 --json", &json, &err), 2);
  ck_assert_msg(strstr(json, "{\"bench\":\"engine\",\"ok\":false,"), "%s", json);
  /* Numbers out of range say the range, as pe-client does (it was "bad
   * number '0'"). */
  ck_assert_msg(strstr(err, "option '--ops': '0' is not a number in [1, 50000000]"), "%s", err);
  /* A batch larger than the data set (it ran one short batch, reporting
   * "batch":60001). */
  ck_assert_int_eq(bench("train --model mlp --batch 60001 --json", &json, &err), 2);
  ck_assert_msg(strstr(json,
                       "\"error\":\"--batch 60001 is larger than the 60000 training "
                       "examples\",\"code\":\"USAGE\""),
                "%s", json);
  ck_assert_int_eq(bench("train --model mlp --batch 0", &json, &err), 2);
  ck_assert_msg(strstr(err, "option '--batch': '0' is not a number in [1, 65536]"), "%s", err);
  ck_assert_int_eq(bench("frobnicate --json", &json, &err), 2);
  ck_assert_msg(strstr(json, "\"ok\":false,\"error\":\"unknown command 'frobnicate'\""), "%s",
                json);
  /* No --json, to see that the run did not start (its banner). */
  ck_assert_int_eq(bench("train --model mlp --executor parallel --steps 2 --timeline "
                         "/nonexistent/dir/t.json",
                         &json, &err),
                   1);
  ck_assert_msg(strstr(err, "--timeline /nonexistent/dir/t.json: No such file or directory") &&
                    !strstr(err, "pe-bench train: model mlp"),
                "%s", err);
  ck_assert_int_eq(bench("train --model mlp --executor parallel --steps 2 --dump-graph "
                         "/nonexistent/g.dot --json",
                         &json, &err),
                   1);
  ck_assert_msg(strstr(json,
                       "\"ok\":false,\"error\":\"--dump-graph /nonexistent/g.dot: No such "
                       "file or directory\""),
                "%s", json);
  char path[] = "/tmp/pe-bench-noopt-XXXXXX", args[512];
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  const char *text =
      "input image 784\nlabel label\nfc 10\nloss softmax_with_cross_entropy\naccuracy\n";
  ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  snprintf(args, sizeof args, "train --model '%s' --steps 2 --json", path);
  ck_assert_int_eq(bench(args, &json, &err), 1);
  ck_assert_msg(strstr(err, path) && strstr(err, "has no optimizer") &&
                    strstr(json, "\"ok\":false") && strstr(json, "has no optimizer"),
                "%s\n%s", err, json);
  unlink(path);
  /* and success says so */
  ck_assert_int_eq(bench("train --model mlp --steps 2 --json", &json, &err), 0);
  const char *ok = "{\"bench\":\"train\",\"ok\":true,\"model\":\"mlp\",";
  ck_assert_msg(!strncmp(json, ok, strlen(ok)), "%s", json);
  /* The threads it ran on, not the option's 0 ("all cores"). */
  ck_assert_msg(json_num(json, "threads") == pe_cpu_cores(), "%d cores: %s", pe_cpu_cores(), json);
  ck_assert_int_eq(bench("train --model mlp --steps 2 --threads 1 --json", &json, &err), 0);
  ck_assert_msg(json_num(json, "threads") == 1, "%s", json);
  /* One place shares nothing: "single" (it said "sharded"). */
  ck_assert_int_eq(
      bench("train --model mlp --executor parallel --places cpu:1 --steps 2 --json", &json, &err),
      0);
  ck_assert_msg(strstr(json, "\"strategy\":\"single\""), "%s", json);
}
END_TEST

/* --places auto times the candidates (cpu:1 first) and runs on the fastest,
 * reporting the trial with pe-client train --json's keys; the sequential
 * executor refuses it, naming the places. */
START_TEST(places_auto_runs_the_fastest) {
  const char *json, *err;
  ck_assert_int_eq(
      bench("train --model mlp --executor parallel --places auto --steps 2 --json", &json, &err),
      0);
  const char *trial = strstr(json, "\"places_trial\":{\"places\":\"");
  ck_assert_msg(trial, "%s", json);
  char chosen[32];
  ck_assert_int_eq(sscanf(trial + strlen("\"places_trial\":{\"places\":\""), "%31[^\"]", chosen),
                   1);
  char want[64];
  snprintf(want, sizeof want, "\"places\":\"%s\"", chosen);
  const char *ran = strstr(json, want);
  ck_assert_msg(ran && ran < trial, "ran on other places than the trial chose: %s", json);
  ck_assert_msg(strstr(trial, "\"candidates\":[{\"places\":\"cpu:1\""), "%s", json);
  ck_assert_int_eq(bench("train --model mlp --places auto --steps 2 --json", &json, &err), 2);
  ck_assert_msg(strstr(err, "places 'auto' not supported"), "%s", err);
}
END_TEST

/* The candidates of --places auto are held at once but share one copy of
 * the data set (Fashion-MNIST, 220 MB loaded): a copy each would add 220 MB
 * per candidate beyond the first, where each adds 10 MB of its own (the
 * MLP's model, executor and buffers; 38 MB for five on two cores). The
 * bound is half a copy per further candidate, a whole one under a
 * sanitizer, whose quarantine keeps freed memory (160 MB more seen under
 * ASan). */
START_TEST(places_auto_holds_the_data_once) {
  const char *json, *err;
  ck_assert_int_eq(
      bench("train --model mlp --executor parallel --places cpu:2 --steps 2 --json", &json, &err),
      0);
  long one = peak_kb;
  ck_assert_int_eq(
      bench("train --model mlp --executor parallel --places auto --steps 2 --json", &json, &err),
      0);
  long trial = peak_kb;
  const char *c = strstr(json, "\"candidates\":[");
  ck_assert_msg(c, "%s", json);
  int n = 0;
  for (const char *q = c; (q = strstr(q, "{\"places\":\"cpu:")); q++) n++;
  ck_assert_msg(n >= 1, "%s", json);
  long per = (getenv("PE_SANITIZED") ? 220 : 110) * 1024L;
  ck_assert_msg(trial < one + (n - 1) * per + 64 * 1024,
                "%d candidates: the trial peaked at %ld KB, one run at %ld KB", n, trial, one);
}
END_TEST

/* Both executors' lines have the same thread keys with the same meaning
 * ("threads" is not intra-op threads on one and pool workers on the
 * other): on cpu:1 both run one op at a time on a team of all the cores,
 * and say so; and the keys pe-client train --json has for the same thing. */
START_TEST(thread_keys_mean_the_same_on_both_executors) {
  const char *json, *err;
  char seq[1 << 14];
  ck_assert_int_eq(bench("train --model mlp --steps 2 --json", &json, &err), 0);
  snprintf(seq, sizeof seq, "%s", json);
  ck_assert_int_eq(
      bench("train --model mlp --executor parallel --places cpu:1 --steps 2 --json", &json, &err),
      0);
  const char *lines[2] = {seq, json};
  for (int i = 0; i < 2; i++) {
    ck_assert_msg(json_num(lines[i], "intra_op_threads") == pe_cpu_cores() &&
                      json_num(lines[i], "pool_workers") == 1,
                  "%d cores: %s", pe_cpu_cores(), lines[i]);
    ck_assert_msg(
        strstr(lines[i], "\"strategy\":\"single\"") && json_num(lines[i], "test_examples") == 10000,
        "%s", lines[i]);
  }
  ck_assert_msg(json_num(seq, "final_loss") == json_num(json, "final_loss"), "%s\n%s", seq, json);
}
END_TEST

/* A model file whose input is not one 28x28 image per sample is refused
 * before any feed is cut (a larger one would read past the images). */
START_TEST(input_size_must_match_the_images) {
  const char *src = getenv("PE_SOURCE_DIR"), *json, *err;
  char path[] = "/tmp/pe-bench-in-XXXXXX", cmd[2048];
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  snprintf(cmd, sizeof cmd,
           "sed 's/^input image 784/input image 50000/' '%s/conf/models/mlp' >'%s'",
           src ? src : ".", path);
  ck_assert_int_eq(system(cmd), 0);
  char args[512];
  snprintf(args, sizeof args, "train --model '%s' --steps 2 --json", path);
  ck_assert_int_eq(bench(args, &json, &err), 1);
  ck_assert_msg(
      strstr(err, "'image' [-1,50000] holds 50000 values per sample") && strstr(err, "784 (28x28)"),
      "%s", err);
  unlink(path);
}
END_TEST

/* Help asked for goes to stdout, exit 0 (pe-bench train --help | less
 * showed nothing); after a usage error it stays on stderr, exit 2. */
START_TEST(help_goes_to_stdout) {
  const char *json, *err;
  const char *asked[][2] = {{"--help", "usage: pe-bench <command>"},
                            {"train --help", "usage: pe-bench train"},
                            {"engine --help", "usage: pe-bench engine"}};
  for (size_t i = 0; i < sizeof asked / sizeof asked[0]; i++) {
    ck_assert_int_eq(bench(asked[i][0], &json, &err), 0);
    ck_assert_msg(strstr(out_text, asked[i][1]), "%s: stdout: %s", asked[i][0], out_text);
    ck_assert_msg(!*err, "%s: stderr: %s", asked[i][0], err);
  }
  ck_assert_int_eq(bench("train --bogus", &json, &err), 2);
  ck_assert_msg(!*out_text && strstr(err, "usage: pe-bench train"), "%s", err);
}
END_TEST

/* pe-bench --version, like pe-executord's and pe-client's: "NAME VERSION"
 * on stdout, exit 0 (not "unknown command"). */
START_TEST(version_like_the_other_binaries) {
  const char *names[] = {"pe-bench", "pe-executord", "pe-client"};
  for (int i = 0; i < 3; i++) {
    char bin[1024], cmd[1100], out[256] = "";
    cd_binary(bin, sizeof bin, names[i]);
    snprintf(cmd, sizeof cmd, "'%s' --version 2>&1", bin);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    char want[64];
    snprintf(want, sizeof want, "%s 0.", names[i]);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0 && !strncmp(out, want, strlen(want)) &&
                      strchr(out, '\n') == out + n - 1,
                  "%s --version: status %d, output '%s'", names[i], st, out);
  }
}
END_TEST

/* With dropout, the sequential executor draws the masks the parallel one
 * draws: both continue the model's generator after the
 * startup's initialisers, so --compare-sequential compares one computation.
 * The sequential loss equals the parallel cpu:1 loss to the last digit, as
 * without dropout. */
START_TEST(dropout_same_on_both_executors) {
  const char *json, *err;
  char path[] = "/tmp/pe-bench-do-XXXXXX", args[1024], seq[1 << 14];
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  const char *text =
      "name mlpdo\nbatch 64\ninput image 784\nlabel label\nfc 128 act=relu\ndropout 0.3\n"
      "fc 10\nloss softmax_with_cross_entropy\naccuracy\noptimizer momentum lr=0.1 mu=0.9\n";
  ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  snprintf(args, sizeof args, "train --model '%s' --steps 8 --json", path);
  ck_assert_msg(bench(args, &json, &err) == 0, "%s", err);
  snprintf(seq, sizeof seq, "%s", json);
  snprintf(args, sizeof args,
           "train --model '%s' --steps 8 --executor parallel --places cpu:1 "
           "--compare-sequential --json",
           path);
  ck_assert_msg(bench(args, &json, &err) == 0, "%s", err);
  unlink(path);
  double ls = json_num(seq, "final_loss"), lp = json_num(json, "final_loss");
  ck_assert_msg(
      isfinite(ls) && ls == lp && json_num(seq, "test_accuracy") == json_num(json, "test_accuracy"),
      "sequential %s\nparallel %s", seq, json);
  /* the baseline inside the parallel line is the same run */
  const char *b = strstr(json, "\"baseline\":");
  ck_assert_msg(b && json_num(b, "final_loss") == lp, "%s", json);
}
END_TEST

/* --roofline (on by default): the step's GEMMs and convolutions timed alone
 * (bench/roofline.c) against the measured step; keys present, positive, the
 * fraction plausible (a kernel-only bound: at most the step, with room for
 * a loaded machine's noise), the parallel executor's on one place's share
 * of the batch; off leaves the keys out, and a bad value is a usage error. */
START_TEST(roofline_keys_against_the_step) {
  const char *json, *err;
  ck_assert_msg(bench("train --model cnn --steps 5 --threads 1 --json", &json, &err) == 0, "%s",
                err);
  const char *keys[] = {"step_ms", "roofline_gemm_conv_ms", "roofline_fraction", "gemm_ms",
                        "conv_ms", "gemm_gflops",           "conv_gflops"};
  for (int i = 0; i < 7; i++)
    ck_assert_msg(json_num(json, keys[i]) > 0, "%s not positive: %s", keys[i], json);
  ck_assert_msg(json_num(json, "roofline_fraction") <= 1.5, "%s", json);
  /* The FMA peak and the two fractions of it: the step's is the kernels'
   * times the roofline fraction (up to the printed digits). */
  const char *pk[] = {"peak_gflops", "kernel_peak_fraction", "step_peak_fraction"};
  for (int i = 0; i < 3; i++)
    ck_assert_msg(json_num(json, pk[i]) > 0, "%s not positive: %s", pk[i], json);
  ck_assert_msg(strstr(json, "\"peak_isa\":\""), "%s", json);
  double want = json_num(json, "kernel_peak_fraction") * json_num(json, "roofline_fraction");
  ck_assert_msg(fabs(json_num(json, "step_peak_fraction") - want) <= 0.01 * want + 0.002, "%s",
                json);
  ck_assert_double_eq(json_num(json, "convs"), 5);
  ck_assert_double_eq(json_num(json, "gemms"), 6);
  ck_assert_msg(bench("train --model mlp --executor parallel --places cpu:2 --batch 64 --steps 5 "
                      "--json",
                      &json, &err) == 0,
                "%s", err);
  const char *roof = strstr(json, "\"roofline\":{");
  ck_assert_msg(roof, "%s", json);
  ck_assert_double_eq(json_num(roof, "batch"), 32);
  ck_assert_double_eq(json_num(roof, "gemms"), 8);
  ck_assert_msg(bench("train --model mlp --steps 2 --roofline off --json", &json, &err) == 0, "%s",
                err);
  ck_assert_msg(!strstr(json, "roofline"), "%s", json);
  ck_assert_int_eq(bench("train --model mlp --roofline=maybe", &json, &err), 2);
  ck_assert_msg(strstr(err, "--roofline"), "%s", err);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("bench_cli");
  TCase *tc = tcase_create("bench_cli");
  tcase_add_test(tc, model_file_benchmarks_like_the_name);
  tcase_add_test(tc, unknown_model_names_both_kinds);
  tcase_add_test(tc, input_size_must_match_the_images);
  tcase_add_test(tc, failures_end_with_json);
  tcase_add_test(tc, thread_keys_mean_the_same_on_both_executors);
  tcase_add_test(tc, dropout_same_on_both_executors);
  tcase_add_test(tc, help_goes_to_stdout);
  tcase_add_test(tc, places_auto_runs_the_fastest);
  tcase_add_test(tc, places_auto_holds_the_data_once);
  tcase_add_test(tc, version_like_the_other_binaries);
  tcase_add_test(tc, rtt_times_runs_through_the_daemon);
  tcase_add_test(tc, roofline_keys_against_the_step);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  cd_require_binary("pe-bench");
  Suite *s = suite();
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? 1 : 0;
}
