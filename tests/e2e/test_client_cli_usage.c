/* pe-client's command line: which exit status a mistake gets (a socket
 * address that is not one: usage, 2; an output file that cannot be
 * written: failure, 1), "did you mean" for a mistyped command or option,
 * and deregister of a program that an earlier `pe-client register` of the
 * same user made, without --force. Skipped (77) when pe-executord or
 * pe-client is not built. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "client_cli.h"

/* A temporary directory, removed by rm_dir. */
static void make_dir(char *dir) {
  ck_assert_ptr_nonnull(mkdtemp(dir));
}
static void rm_dir(const char *dir) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}

/* An address nanomsg cannot parse is a bad argument (2), not an
 * unreachable daemon (3); a missing socket file stays 3. */
START_TEST(bad_socket_is_usage) {
  char dir[] = "/tmp/pe-client-usage-XXXXXX";
  make_dir(dir);
  const char *bad[] = {"--socket garbage ping", "--socket 'nosuch://x' status",
                       "--socket 'tcp://no-port' ping"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_msg(cli(NULL, dir, bad[i]) == 2, "%s: %s", bad[i], slurp(dir, "err"));
    ck_assert_msg(strstr(slurp(dir, "err"), "BAD_CLIENT_ARGUMENT"), "%s: %s", bad[i],
                  slurp(dir, "err"));
  }
  ck_assert_int_eq(cli(NULL, dir, "--socket garbage --json ping"), 2);
  ck_assert_msg(strstr(last_line(dir), "\"code\":\"USAGE\""), "%s", last_line(dir));
  char args[256];
  snprintf(args, sizeof args, "--socket 'ipc://%s/none.sock' ping", dir);
  ck_assert_int_eq(cli(NULL, dir, args), 3);
  rm_dir(dir);
}
END_TEST

/* export --out into a directory that does not exist: the command failed
 * (1), before it asks the daemon for anything; the message names the
 * path and why. */
START_TEST(export_to_missing_dir_fails) {
  char dir[] = "/tmp/pe-client-usage-XXXXXX";
  make_dir(dir);
  char args[256];
  snprintf(args, sizeof args, "--socket 'ipc://%s/none.sock' export --model m --out /nonexistent/x",
           dir);
  ck_assert_msg(cli(NULL, dir, args) == 1, "%s", slurp(dir, "err"));
  ck_assert_msg(strstr(slurp(dir, "err"), "--out /nonexistent/x: No such file or directory"), "%s",
                slurp(dir, "err"));
  rm_dir(dir);
}
END_TEST

/* A mistyped command or option names the closest one when it is close,
 * and nothing when none is. */
START_TEST(did_you_mean) {
  char dir[] = "/tmp/pe-client-usage-XXXXXX";
  make_dir(dir);
  struct {
    const char *args, *said;
  } cases[] = {
      {"trian --model mlp", "unknown command 'trian' (did you mean 'train'?)"},
      {"deregistr --handle 1", "unknown command 'deregistr' (did you mean 'deregister'?)"},
      {"train --model mlp --epoch 1", "unknown option '--epoch' (did you mean '--epochs'?)"},
      {"train --modle mlp", "unknown option '--modle' (did you mean '--model'?)"},
      {"ping --sokcet x", "unknown option '--sokcet' (did you mean '--socket'?)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ck_assert_int_eq(cli(NULL, dir, cases[i].args), 2);
    ck_assert_msg(strstr(slurp(dir, "err"), cases[i].said), "%s: %s", cases[i].args,
                  slurp(dir, "err"));
  }
  const char *far[] = {"frobnicate", "train --model mlp --xyzzy 1", "ping --q"};
  for (size_t i = 0; i < sizeof far / sizeof far[0]; i++) {
    ck_assert_int_eq(cli(NULL, dir, far[i]), 2);
    ck_assert_msg(
        strstr(slurp(dir, "err"), "unknown") && !strstr(slurp(dir, "err"), "did you mean"),
        "%s: %s", far[i], slurp(dir, "err"));
  }
  rm_dir(dir);
}
END_TEST

/* The handle in register's --json line. */
static void json_handle(const char *line, char *out, size_t n) {
  const char *p = strstr(line, "\"handle\":\"");
  ck_assert_msg(p, "%s", line);
  p += strlen("\"handle\":\"");
  snprintf(out, n, "%.18s", p);
}

/* The number of programs the daemon has. */
static double programs(const cd_daemon *d) {
  ck_assert_int_eq(cli(d, d->dir, "status --json"), 0);
  return json_num(last_line(d->dir), "programs");
}

/* register, then deregister --handle H from another invocation of the same
 * user: no --force (the register recorded its session in the user's
 * runtime directory). A program that invocation did not register (here:
 * registered under another runtime directory, as another user's would be)
 * still needs --force. */
START_TEST(deregister_own_register) {
  cd_daemon d;
  cd_start(&d);
  char rt[2][256];
  for (int i = 0; i < 2; i++) {
    snprintf(rt[i], sizeof rt[i], "%s/rt%d", d.dir, i);
    ck_assert_int_eq(mkdir(rt[i], 0700), 0);
  }
  ck_assert_int_eq(setenv("XDG_RUNTIME_DIR", rt[0], 1), 0);
  ck_assert_int_eq(cli(&d, d.dir, "register --model mlp --model-name own --init --json"), 0);
  char h[32], args[128];
  json_handle(last_line(d.dir), h, sizeof h);
  ck_assert_double_eq(programs(&d), 1);

  /* Another user's view: no record, so the daemon refuses. */
  ck_assert_int_eq(setenv("XDG_RUNTIME_DIR", rt[1], 1), 0);
  snprintf(args, sizeof args, "deregister --handle %s", h);
  ck_assert_int_eq(cli(&d, d.dir, args), 1);
  ck_assert_msg(
      strstr(slurp(d.dir, "err"), "PERMISSION_DENIED") && strstr(slurp(d.dir, "err"), "--force"),
      "%s", slurp(d.dir, "err"));
  ck_assert_double_eq(programs(&d), 1);

  /* The registering user: deregistered, no --force. */
  ck_assert_int_eq(setenv("XDG_RUNTIME_DIR", rt[0], 1), 0);
  ck_assert_msg(cli(&d, d.dir, args) == 0, "%s", slurp(d.dir, "err"));
  ck_assert_msg(strstr(slurp(d.dir, "out"), "deregistered"), "%s", slurp(d.dir, "out"));
  ck_assert_double_eq(programs(&d), 0);
  /* Gone: NOT_FOUND, a failure. */
  ck_assert_int_eq(cli(&d, d.dir, args), 1);
  ck_assert_msg(strstr(slurp(d.dir, "err"), "NOT_FOUND"), "%s", slurp(d.dir, "err"));
  unsetenv("XDG_RUNTIME_DIR");
  cd_stop(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("client_cli_usage");
  TCase *tc = tcase_create("client_cli_usage");
  tcase_add_test(tc, bad_socket_is_usage);
  tcase_add_test(tc, export_to_missing_dir_fails);
  tcase_add_test(tc, did_you_mean);
  tcase_add_test(tc, deregister_own_register);
  suite_add_tcase(s, tc);
  return s;
}

CLI_CHECK_MAIN(suite)
