/* For the end-to-end tests of the pe-client command (test_client_cli*.c):
 * run it against a daemon of client_daemon.h, in the foreground or the
 * background, and read what it printed (its last line, numbers of its JSON
 * line) and the daemon's log. */
#ifndef PE_TESTS_CLIENT_CLI_H
#define PE_TESTS_CLIENT_CLI_H

#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client_daemon.h"

/* Run pe-client ARGS against d (NULL: no --socket), stdout to d->dir/out,
 * stderr to d->dir/err; returns the exit status. */
static inline int cli(const cd_daemon *d, const char *dir, const char *args) {
  char bin[1024], cmd[4096];
  cd_binary(bin, sizeof bin, "pe-client");
  snprintf(cmd, sizeof cmd, "'%s' %s%s%s %s >'%s/out' 2>'%s/err'", bin, d ? "--socket '" : "",
           d ? d->addr : "", d ? "'" : "", args, dir, dir);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The whole of dir/name (static buffer). */
static inline const char *slurp(const char *dir, const char *name) {
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

/* The last non-empty line of dir/out. Not inlined: the tests copy it into
 * 4 KiB buffers, which gcc's -Wformat-truncation flags once it sees this
 * 16 KiB one (a JSON line is far shorter). */
__attribute__((noinline, unused)) static const char *last_line(const char *dir) {
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
static inline double json_num(const char *json, const char *key) {
  char pat[96];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(json, pat);
  if (!p) return NAN;
  char *end;
  double v = strtod(p + strlen(pat), &end);
  return end == p + strlen(pat) ? NAN : v;
}

/* Write a model file `name` in d's directory; its path into path. */
static inline void write_model(const cd_daemon *d, const char *name, const char *text, char *path,
                               size_t n) {
  snprintf(path, n, "%s/%s", d->dir, name);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_ge(fputs(text, f), 0);
  ck_assert_int_eq(fclose(f), 0);
}

/* pe-client ARGS in the background (as cli()); returns its pid. */
static inline pid_t cli_start(const cd_daemon *d, const char *dir, const char *args) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) _exit(cli(d, dir, args));
  return pid;
}

static inline int cli_wait(pid_t pid) {
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Wait (30 s at most) until the daemon's log has `times` lines with
 * needle. */
static inline void wait_log(const cd_daemon *d, const char *needle, int times) {
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

/* Monotonic seconds. */
static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Is a model of this name on d (status)? */
static inline bool has_model(const cd_daemon *d, const char *name) {
  pe_client *c = cd_connect(d);
  pe_client_status st;
  CD_OK(c, pe_client_get_status(c, &st));
  bool found = false;
  for (size_t i = 0; i < st.n_models; i++) found |= !strcmp(st.models[i].name, name);
  pe_client_close(c);
  pe_client_free(c);
  return found;
}

#define CLI_OK(d, args)                                                             \
  do {                                                                              \
    int cli_rc_ = cli(d, (d)->dir, args);                                           \
    if (cli_rc_) cd_dump_log(d);                                                    \
    ck_assert_msg(cli_rc_ == 0, "pe-client %s: exit %d\nstderr: %s", args, cli_rc_, \
                  slurp((d)->dir, "err"));                                          \
  } while (0)

/* A main() for a suite of pe-client runs: skipped (77) when pe-client or
 * pe-executord is not built. */
#define CLI_CHECK_MAIN(suite_fn)    \
  static Suite *cli_suite_(void) {  \
    cd_require_binary("pe-client"); \
    return suite_fn();              \
  }                                 \
  CD_CHECK_MAIN(cli_suite_)

#endif
