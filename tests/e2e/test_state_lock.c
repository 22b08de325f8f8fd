/* One daemon per state directory: a second pe-executord on a state dir in
 * use exits 1 before it is ready, naming the directory and the holder's
 * pid; a crashed daemon's lock file does not block the next start. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "check_main.h"
#include "daemon_harness.h"

/* Run a second daemon on d's state dir (its own socket) for at most 10 s;
 * returns its wait status, *out its output. */
static int second_daemon(const dh_daemon *d, char *out, size_t len) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "timeout 10 '%s/pe-executord' --places cpu:1 --socket 'ipc://%s/second.sock' "
           "--state-dir '%s' 2>&1",
           getenv("PE_BUILD_DIR"), d->dir, d->state);
  FILE *f = popen(cmd, "r");
  ck_assert(f != NULL);
  size_t n = fread(out, 1, len - 1, f);
  out[n] = 0;
  return pclose(f);
}

START_TEST(test_second_daemon_refused) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  char out[4096], want[512];
  int st = second_daemon(&d, out, sizeof out);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status 0x%x, output: %s", st, out);
  snprintf(want, sizeof want, "state dir %s is in use by another pe-executord (pid %d)", d.state,
           (int)d.pid);
  ck_assert_msg(strstr(out, want) && !strstr(out, "ready on"), "want '%s' in: %s", want, out);
  /* The first one carries on. */
  ck_assert(dh_alive(&d));
  int s = dh_connect(&d, 5000);
  ck_assert(dh_ping(s));
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* SIGKILL leaves the lock file (with the dead pid) behind; the kernel
 * dropped the lock, so the restart on the same state dir starts. */
START_TEST(test_stale_lock_file_does_not_block) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  pid_t old = d.pid;
  dh_stop(&d, SIGKILL);
  char path[400], buf[32] = "";
  snprintf(path, sizeof path, "%s/pe-executord.lock", d.state);
  FILE *f = fopen(path, "r");
  ck_assert_msg(f != NULL, "no lock file %s", path);
  ck_assert(fgets(buf, sizeof buf, f) != NULL);
  fclose(f);
  ck_assert_int_eq(atoi(buf), (int)old);
  dh_start(&d, NULL);
  ck_assert(dh_alive(&d));
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("state_lock");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_second_daemon_refused);
  tcase_add_test(tc, test_stale_lock_file_does_not_block);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
