/* The OpenMP wait policy pe-executord and pe-bench run with
 * (core/omp_policy.h): OMP_WAIT_POLICY=passive when the user set neither it
 * nor GOMP_SPINCOUNT (libgomp's spinning made training 1.6-165x slower on
 * shared cores), the user's setting when given. libgomp reads the variable
 * before main, so the daemon re-executes itself with it: what libgomp read
 * is the process's initial environment, /proc/PID/environ. ctest sets
 * OMP_WAIT_POLICY=passive for every test; these tests unset it. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "daemon_harness.h"

/* The value of `var` in pid's initial environment (buf), or NULL. */
static const char *proc_env(pid_t pid, const char *var, char *buf, size_t n) {
  char path[64], data[1 << 16];
  snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
  FILE *f = fopen(path, "r");
  ck_assert_msg(f != NULL, "%s", path);
  size_t len = fread(data, 1, sizeof data - 1, f);
  fclose(f);
  data[len] = 0;
  size_t vl = strlen(var);
  for (size_t i = 0; i < len; i += strlen(data + i) + 1)
    if (!strncmp(data + i, var, vl) && data[i + vl] == '=') {
      snprintf(buf, n, "%s", data + i + vl + 1);
      return buf;
    }
  return NULL;
}

static bool log_has(const dh_daemon *d, const char *needle) {
  FILE *f = fopen(d->log, "r");
  ck_assert(f != NULL);
  static char text[1 << 16];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  return strstr(text, needle) != NULL;
}

/* Start a daemon with OMP_WAIT_POLICY / GOMP_SPINCOUNT as given (NULL:
 * unset); returns its OMP_WAIT_POLICY (NULL: unset) into buf. */
static const char *daemon_policy(dh_daemon *d, const char *policy, const char *spin, char *buf,
                                 size_t n) {
  if (policy)
    setenv("OMP_WAIT_POLICY", policy, 1);
  else
    unsetenv("OMP_WAIT_POLICY");
  if (spin)
    setenv("GOMP_SPINCOUNT", spin, 1);
  else
    unsetenv("GOMP_SPINCOUNT");
  dh_start(d, NULL);
  return proc_env(d->pid, "OMP_WAIT_POLICY", buf, n);
}

START_TEST(daemon_passive_when_unset) {
  dh_daemon d = {0};
  char v[64];
  const char *pol = daemon_policy(&d, NULL, NULL, v, sizeof v);
  ck_assert_msg(pol && !strcmp(pol, "passive"), "OMP_WAIT_POLICY %s", pol ? pol : "unset");
  ck_assert_msg(log_has(&d, "OpenMP wait policy passive (pe-executord's default"), "log %s", d.log);
  dh_cleanup(&d);
}
END_TEST

START_TEST(daemon_keeps_the_users_policy) {
  dh_daemon d = {0};
  char v[64];
  const char *pol = daemon_policy(&d, "active", NULL, v, sizeof v);
  ck_assert_msg(pol && !strcmp(pol, "active"), "OMP_WAIT_POLICY %s", pol ? pol : "unset");
  ck_assert(log_has(&d, "OpenMP wait policy from the environment: OMP_WAIT_POLICY=active"));
  dh_cleanup(&d);
}
END_TEST

/* GOMP_SPINCOUNT alone is a choice too: no policy added. */
START_TEST(daemon_keeps_the_users_spin_count) {
  dh_daemon d = {0};
  char v[64];
  const char *pol = daemon_policy(&d, NULL, "1000", v, sizeof v);
  ck_assert_msg(!pol, "OMP_WAIT_POLICY %s added to GOMP_SPINCOUNT=1000", pol);
  ck_assert(log_has(&d, "OMP_WAIT_POLICY=(unset) GOMP_SPINCOUNT=1000"));
  dh_cleanup(&d);
}
END_TEST

/* pe-bench's JSON line says the policy it ran with. */
static void bench_policy(const char *env, const char *want) {
  const char *bd = getenv("PE_BUILD_DIR");
  ck_assert(bd);
  char cmd[1024], line[1 << 14] = "";
  snprintf(cmd, sizeof cmd,
           "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT %s '%s/pe-bench' train --model mlp "
           "--steps 1 --json 2>/dev/null",
           env, bd);
  FILE *p = popen(cmd, "r");
  ck_assert(p);
  for (char buf[sizeof line]; fgets(buf, sizeof buf, p);)
    if (buf[0] == '{') snprintf(line, sizeof line, "%s", buf);
  ck_assert_int_eq(pclose(p), 0);
  ck_assert_msg(strstr(line, want), "%s: want %s in %s", env, want, line);
}

START_TEST(bench_reports_its_policy) {
  bench_policy("", "\"omp_wait_policy\":\"passive\"");
  bench_policy("OMP_WAIT_POLICY=active", "\"omp_wait_policy\":\"active\"");
  bench_policy("GOMP_SPINCOUNT=1000", "\"omp_wait_policy\":null");
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("omp_policy");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, daemon_passive_when_unset);
  tcase_add_test(tc, daemon_keeps_the_users_policy);
  tcase_add_test(tc, daemon_keeps_the_users_spin_count);
  tcase_add_test(tc, bench_reports_its_policy);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
