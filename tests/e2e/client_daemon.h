/* For the client end-to-end tests: start the real pe-executord
 * ($PE_BUILD_DIR/pe-executord) on a private ipc:// socket with its state in a
 * temporary directory, wait until it answers a ping, stop it with SIGTERM.
 *
 * Call these inside test bodies only (Check forks each test; nanomsg and
 * the daemon process belong to the test's process). A suite whose daemon
 * binary is not built exits 77 (skip) from cd_require_binary in main. */
#ifndef PE_TESTS_CLIENT_DAEMON_H
#define PE_TESTS_CLIENT_DAEMON_H

#include <check.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pe_client.h"

typedef struct cd_daemon {
  pid_t pid;
  char dir[64];   /* temporary directory: socket, state/, daemon.log */
  char addr[128]; /* ipc://DIR/d.sock */
  char state[96];
  char log[96];
  char conf[96]; /* --config FILE when set (cd_start_conf) */
} cd_daemon;

static inline const char *cd_build_dir(void) {
  const char *b = getenv("PE_BUILD_DIR");
  return b && *b ? b : ".";
}

static inline void cd_binary(char *buf, size_t len, const char *name) {
  snprintf(buf, len, "%s/%s", cd_build_dir(), name);
}

/* Exit 77 when a binary the suite needs is not built. */
static inline void cd_require_binary(const char *name) {
  char path[1024];
  cd_binary(path, sizeof path, name);
  if (access(path, X_OK) != 0) {
    fprintf(stderr, "skip: %s is not built\n", path);
    exit(77);
  }
}

/* A main() for a suite that needs pe-executord: skipped (77) when it is
 * not built, else PE_CHECK_MAIN's run. */
#define CD_CHECK_MAIN(suite_fn)                  \
  int main(void) {                               \
    cd_require_binary("pe-executord");           \
    SRunner *sr = srunner_create(suite_fn());    \
    srunner_run_all(sr, CK_NORMAL);              \
    int failed = srunner_ntests_failed(sr);      \
    srunner_free(sr);                            \
    return failed ? EXIT_FAILURE : EXIT_SUCCESS; \
  }

static inline void cd_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Print the daemon's log (on a failure, for the ctest output). */
static inline void cd_dump_log(const cd_daemon *d) {
  FILE *f = fopen(d->log, "r");
  if (!f) return;
  char line[512];
  fprintf(stderr, "--- %s ---\n", d->log);
  while (fgets(line, sizeof line, f)) fputs(line, stderr);
  fclose(f);
}

/* Copy the file src to dst (created with mode). */
static inline bool cd_copy_file(const char *src, const char *dst, mode_t mode) {
  int in = open(src, O_RDONLY), out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, mode);
  bool ok = in >= 0 && out >= 0;
  char buf[1 << 16];
  ssize_t n;
  while (ok && (n = read(in, buf, sizeof buf)) != 0) ok = n > 0 && write(out, buf, (size_t)n) == n;
  if (in >= 0) close(in);
  if (out >= 0 && close(out) != 0) ok = false;
  return ok;
}

/* Start the daemon and wait (up to 15 s) for a ping to answer; as user
 * uid/gid when uid is not (uid_t)-1 (the caller is root): its directory is
 * handed to that user and the daemon runs without supplementary groups. */
static inline void cd_spawn(cd_daemon *d, uid_t uid, gid_t gid) {
  char bin[1024];
  cd_binary(bin, sizeof bin, "pe-executord");
  d->pid = fork();
  ck_assert_int_ge(d->pid, 0);
  if (d->pid == 0) {
    /* A failed assertion ends the test process without cd_stop: the
     * daemon must not outlive it. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) dup2(fd, 2);
    /* The build tree may be out of the other user's reach (a checkout
     * under a 0700 directory): it runs a copy of the binary from its own
     * directory. */
    char copy[160];
    snprintf(copy, sizeof copy, "%s/pe-executord", d->dir);
    if (uid != (uid_t)-1) {
      if (!cd_copy_file(bin, copy, 0755) || chown(d->dir, uid, gid) != 0 ||
          setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0) {
        perror("pe-e2e: starting the daemon as another user");
        _exit(126);
      }
      snprintf(bin, sizeof bin, "%s", copy);
    }
    if (d->conf[0])
      execl(bin, bin, "--socket", d->addr, "--state-dir", d->state, "--config", d->conf,
            (char *)NULL);
    else
      execl(bin, bin, "--socket", d->addr, "--state-dir", d->state, (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 300; i++) {
    int st;
    if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
      cd_dump_log(d);
      ck_abort_msg("pe-executord exited during start-up (status 0x%x)", st);
    }
    pe_client *c = pe_client_new();
    pe_client_opts o = {.address = d->addr, .timeout_ms = 500};
    int ok = pe_client_connect(c, &o) == 0 && pe_client_ping(c) == 0;
    if (ok) pe_client_close(c); /* tests count the daemon's clients */
    pe_client_free(c);
    if (ok) return;
    cd_sleep_ms(50);
  }
  cd_dump_log(d);
  ck_abort_msg("pe-executord did not answer a ping on %s within 15 s", d->addr);
}

/* A fresh temporary directory and the paths in it. */
static inline void cd_prepare(cd_daemon *d) {
  memset(d, 0, sizeof *d);
  snprintf(d->dir, sizeof d->dir, "/tmp/pe-e2e-client-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(d->dir));
  snprintf(d->addr, sizeof d->addr, "ipc://%s/d.sock", d->dir);
  snprintf(d->state, sizeof d->state, "%s/state", d->dir);
  snprintf(d->log, sizeof d->log, "%s/daemon.log", d->dir);
}

static inline void cd_start_as(cd_daemon *d, uid_t uid, gid_t gid) {
  cd_prepare(d);
  cd_spawn(d, uid, gid);
}

static inline void cd_start(cd_daemon *d) {
  cd_start_as(d, (uid_t)-1, (gid_t)-1);
}

/* cd_start with a config file of conf_text. */
static inline void cd_start_conf(cd_daemon *d, const char *conf_text) {
  cd_prepare(d);
  snprintf(d->conf, sizeof d->conf, "%s/d.conf", d->dir);
  FILE *f = fopen(d->conf, "w");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_ge(fputs(conf_text, f), 0);
  ck_assert_int_eq(fclose(f), 0);
  cd_spawn(d, (uid_t)-1, (gid_t)-1);
}

/* Stop the daemon with sig (exit 0 expected after SIGTERM) and start it
 * again on the same socket and state directory (its log appends). */
static inline void cd_restart(cd_daemon *d, int sig) {
  kill(d->pid, sig);
  int st = 0;
  ck_assert_int_eq(waitpid(d->pid, &st, 0), d->pid);
  ck_assert_msg(sig != SIGTERM || (WIFEXITED(st) && WEXITSTATUS(st) == 0),
                "pe-executord: status 0x%x after SIGTERM", st);
  cd_spawn(d, (uid_t)-1, (gid_t)-1);
}

/* SIGTERM, wait (up to 20 s), expect exit 0; remove the directory. */
static inline void cd_stop(cd_daemon *d) {
  if (d->pid <= 0) return;
  kill(d->pid, SIGTERM);
  int st = 0;
  pid_t r = 0;
  for (int i = 0; i < 400 && (r = waitpid(d->pid, &st, WNOHANG)) == 0; i++) cd_sleep_ms(50);
  if (r == 0) {
    kill(d->pid, SIGKILL);
    waitpid(d->pid, &st, 0);
    cd_dump_log(d);
    ck_abort_msg("pe-executord did not exit within 20 s of SIGTERM");
  }
  d->pid = 0;
  if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) cd_dump_log(d);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "pe-executord: status 0x%x after SIGTERM",
                st);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->dir);
  ck_assert_int_eq(system(cmd), 0);
}

/* A connected client (60 s reply timeout). */
static inline pe_client *cd_connect(const cd_daemon *d) {
  pe_client *c = pe_client_new();
  ck_assert_ptr_nonnull(c);
  pe_client_opts o = {.address = d->addr, .timeout_ms = 60000};
  int rc = pe_client_connect(c, &o);
  ck_assert_msg(rc == 0, "connect: %s", pe_client_error(c));
  return c;
}

/* Assert a libpeclient call succeeded, printing its error otherwise. */
#define CD_OK(c, expr)                                                   \
  do {                                                                   \
    int cd_rc_ = (expr);                                                 \
    ck_assert_msg(cd_rc_ == 0, "%s: %s (%s)", #expr, pe_client_error(c), \
                  pe_client_code_name(cd_rc_));                          \
  } while (0)

#endif
