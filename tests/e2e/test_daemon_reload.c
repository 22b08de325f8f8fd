/* SIGHUP reload: the command line still wins over the file (as at start),
 * and only keys that need a restart and changed are warned about, each
 * with both values; a reloaded max_steps_per_request caps the next run. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "check_main.h"
#include "daemon_harness.h"

#define CLIENT 0x5151

/* The daemon's log so far (malloc'd). */
static char *read_log(const dh_daemon *d) {
  FILE *f = fopen(d->log, "r");
  ck_assert(f != NULL);
  char *buf = calloc(1, 1 << 20);
  size_t n = fread(buf, 1, (1 << 20) - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

/* Wait (5 s) until the log says `needle`; returns the log. */
static char *wait_log(const dh_daemon *d, const char *needle) {
  double t0 = dh_now();
  for (;;) {
    char *log = read_log(d);
    if (strstr(log, needle)) return log;
    ck_assert_msg(dh_now() - t0 < 5, "'%s' not logged within 5 s: %s", needle, log);
    free(log);
    dh_sleep_ms(20);
  }
}

static void write_conf(const dh_daemon *d, const char *text) {
  FILE *f = fopen(d->conf, "w");
  ck_assert(f != NULL);
  fputs(text, f);
  fclose(f);
}

/* pe-executord --log-level warn with log_level = info in the file: after a
 * reload still warn (no info lines), and the restart-only key that changed
 * in the file is named with its old and new value. */
START_TEST(test_reload_keeps_command_line) {
  dh_daemon d = {.args = {"--log-level", "warn", NULL}};
  dh_start(&d, "[server]\nlog_level = info\n");
  write_conf(&d, "[server]\nlog_level = info\n[runtime]\nworker_threads = 3\n");
  ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
  free(wait_log(&d, "worker_threads"));
  /* A request that logs at info. */
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  dh_setup_model(s, CLIENT, &mlp, "m", 1, false, NULL);
  char *log = read_log(&d);
  ck_assert_msg(!strstr(log, " info "), "info lines at --log-level warn after SIGHUP: %s", log);
  ck_assert_msg(strstr(log, "need a restart: [runtime] worker_threads 0 -> 3"), "log: %s", log);
  free(log);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* The harness gives --places cpu:1, --socket and --state-dir, which the
 * file does not set: a reload changes none of them and warns about
 * nothing. */
START_TEST(test_reload_unchanged_does_not_warn) {
  dh_daemon d = {0};
  dh_start(&d, "[sessions]\nttl = 600\n");
  write_conf(&d, "[sessions]\nttl = 60\n");
  ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
  char *log = wait_log(&d, "SIGHUP: reloaded");
  ck_assert_msg(strstr(log, "ttl 60 s"), "log: %s", log);
  ck_assert_msg(!strstr(log, "restart"), "a warning about a key that did not change: %s", log);
  free(log);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* A Run request of steps (or batches, when batched) on batch b: the reply. */
static Pe__Reply *run_steps(int s, uint64_t h, dh_batch *b, const char *loss, uint32_t n,
                            bool batched) {
  Pe__RunRequest run;
  char *f[] = {(char *)loss};
  Pe__Request rq = dh_run_req(CLIENT, &run, h, b->feeds, 2, f, 1, batched ? 0 : n);
  run.batches = batched ? n : 0;
  return dh_call(s, &rq);
}

/* A request of n steps (then n batches) is refused naming the cap `max`
 * and its key. */
static void over_cap(int s, uint64_t h, dh_batch *b, const char *loss, uint32_t n, uint32_t max) {
  char want[64];
  snprintf(want, sizeof want, "exceeds the cap of %u steps per request", max);
  for (int batched = 0; batched < 2; batched++) {
    Pe__Reply *rep = run_steps(s, h, b, loss, n, batched);
    dh_err(rep, PE_EINVAL, want);
    dh_err(rep, PE_EINVAL, "[limits] max_steps_per_request");
    dh_err(rep, PE_EINVAL, batched ? "batches" : "steps");
    pe__reply__free_unpacked(rep, NULL);
  }
}

/* A request of n steps, then one of n batches, runs n steps. */
static void under_cap(int s, uint64_t h, dh_batch *b, const char *loss, uint32_t n) {
  for (int batched = 0; batched < 2; batched++) {
    Pe__Reply *rep = run_steps(s, h, b, loss, n, batched);
    dh_ok(rep);
    ck_assert_uint_eq(rep->run->steps, n);
    pe__reply__free_unpacked(rep, NULL);
  }
}

/* [limits] max_steps_per_request caps RunRequest.steps and .batches, and a
 * reload changes it. */
START_TEST(test_max_steps_per_request) {
  dh_daemon d = {0};
  dh_start(&d, "[limits]\nmax_steps_per_request = 5\n");
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h = dh_setup_model(s, CLIENT, &mlp, "m", 1, false, NULL);
  dh_batch b;
  dh_batch_make(&b, 10, 1);
  over_cap(s, h, &b, mlp.loss, 10, 5);
  under_cap(s, h, &b, mlp.loss, 5);
  write_conf(&d, "[limits]\nmax_steps_per_request = 8\n");
  ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
  free(wait_log(&d, "max_steps_per_request 8"));
  over_cap(s, h, &b, mlp.loss, 10, 8);
  dh_batch_free(&b);
  dh_batch_make(&b, 8, 1);
  under_cap(s, h, &b, mlp.loss, 8);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* SIGUSR1, SIGUSR2 and SIGPIPE do not end the daemon (their default action
 * would, without its shutdown checkpoints and leaving its socket file):
 * it logs the first two, still answers, and SIGTERM then exits 0. */
START_TEST(test_unused_signals_are_ignored) {
  dh_daemon d = {0};
  dh_start(&d, "[sessions]\nttl = 600\n");
  ck_assert_int_eq(kill(d.pid, SIGUSR1), 0);
  free(wait_log(&d, "signal 10 (User defined signal 1) ignored"));
  ck_assert_int_eq(kill(d.pid, SIGUSR2), 0);
  ck_assert_int_eq(kill(d.pid, SIGPIPE), 0);
  free(wait_log(&d, "signal 12 (User defined signal 2) ignored"));
  ck_assert(dh_alive(&d));
  int s = dh_connect(&d, 5000);
  ck_assert(dh_ping(s));
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("daemon_reload");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_reload_keeps_command_line);
  tcase_add_test(tc, test_reload_unchanged_does_not_warn);
  tcase_add_test(tc, test_unused_signals_are_ignored);
  tcase_add_test(tc, test_max_steps_per_request);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
