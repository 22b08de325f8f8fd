/* A trainer that does not get to close its shared-memory region leaves no
 * region behind in /dev/shm: pe-client train unlinks it on SIGINT and
 * SIGTERM; after a SIGKILL the next client that creates a region sweeps
 * it, and so does the daemon when the killed trainer's session ends. The
 * region is found by the name the daemon logs at RegisterShm. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "pe_client.h"

/* pe-client train on d for far longer than the test (output to
 * <dir>/trainer.log); returns its pid. */
static pid_t start_trainer(const dh_daemon *d) {
  char bin[512], log[400];
  snprintf(bin, sizeof bin, "%s/pe-client", getenv("PE_BUILD_DIR"));
  snprintf(log, sizeof log, "%s/trainer.log", d->dir);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    FILE *f = freopen(log, "a", stderr);
    (void)f;
    dup2(2, 1);
    execl(bin, bin, "--socket", d->addr, "train", "--model", "mlp", "--epochs", "1000", "--limit",
          "20000", "--feed", "shm", (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* The trainer's n-th region the daemon registered (its log says "shm NAME
 * registered: ..."; the trainer's names start "/pe-PID-"), waited for up
 * to 30 s; *name gets it. */
static void registered_region(const dh_daemon *d, pid_t trainer, int n, char *name, size_t len) {
  char own[32];
  snprintf(own, sizeof own, "shm /pe-%d-", (int)trainer);
  double t0 = dh_now();
  for (;;) {
    FILE *f = fopen(d->log, "r");
    ck_assert(f != NULL);
    char line[1024];
    int seen = 0;
    while (fgets(line, sizeof line, f)) {
      const char *q = strstr(line, own);
      if (!q || !strstr(q, " registered: ") || ++seen < n) continue;
      q += 4;
      size_t k = strcspn(q, " ");
      ck_assert_uint_lt(k, len);
      memcpy(name, q, k);
      name[k] = 0;
      fclose(f);
      return;
    }
    fclose(f);
    int st;
    ck_assert_msg(waitpid(trainer, &st, WNOHANG) == 0, "the trainer exited (status 0x%x), see %s",
                  st, d->dir);
    ck_assert_msg(dh_now() - t0 < 30, "no shm region registered within 30 s (%s)", d->log);
    dh_sleep_ms(20);
  }
}

static bool region_exists(const char *name) {
  char path[600];
  struct stat sb;
  snprintf(path, sizeof path, "/dev/shm%s", name);
  return stat(path, &sb) == 0;
}

/* Signal the trainer and wait for it; returns its wait status. */
static int stop_trainer(pid_t pid, int sig) {
  ck_assert_int_eq(kill(pid, sig), 0);
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  return st;
}

/* Ctrl-C and kill: the trainer unlinks its region and dies of the signal. */
START_TEST(test_interrupted_trainer_unlinks) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  const int sigs[] = {SIGINT, SIGTERM};
  for (int i = 0; i < 2; i++) {
    pid_t t = start_trainer(&d);
    /* Two regions: the batch buffers, then the training rows. */
    char name[2][256];
    for (int k = 0; k < 2; k++) {
      registered_region(&d, t, k + 1, name[k], sizeof name[k]);
      ck_assert_msg(region_exists(name[k]), "%s not in /dev/shm while training", name[k]);
    }
    int st = stop_trainer(t, sigs[i]);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == sigs[i], "status 0x%x after signal %d", st,
                  sigs[i]);
    for (int k = 0; k < 2; k++)
      ck_assert_msg(!region_exists(name[k]), "%s left in /dev/shm after signal %d", name[k],
                    sigs[i]);
  }
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* SIGKILL leaves the name; the next region this user creates sweeps it. */
START_TEST(test_killed_trainer_swept_by_next_client) {
  dh_daemon d = {0};
  dh_start(&d, NULL); /* ttl 600 s: the daemon keeps the session meanwhile */
  pid_t t = start_trainer(&d);
  char name[256];
  registered_region(&d, t, 1, name, sizeof name);
  stop_trainer(t, SIGKILL);
  ck_assert_msg(region_exists(name), "%s: gone without a sweep?", name);
  pe_client *c = pe_client_new();
  pe_client_opts o = {.address = d.addr, .timeout_ms = 30000};
  ck_assert_int_eq(pe_client_connect(c, &o), 0);
  pe_client_shm shm;
  ck_assert_msg(pe_client_shm_create(c, 4096, &shm) == 0, "%s", pe_client_error(c));
  ck_assert_msg(!region_exists(name), "%s left in /dev/shm after the next client's create", name);
  char own[64];
  snprintf(own, sizeof own, "%s", shm.name);
  ck_assert(region_exists(own)); /* its own, alive */
  pe_client_shm_close(c, &shm);
  ck_assert(!region_exists(own));
  pe_client_close(c);
  pe_client_free(c);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* SIGKILL, and no other client: the daemon unlinks the region when the
 * killed trainer's session expires (same user here). */
START_TEST(test_killed_trainer_unlinked_at_session_end) {
  dh_daemon d = {0};
  dh_start(&d, "[sessions]\nttl = 1\n");
  pid_t t = start_trainer(&d);
  char name[256];
  registered_region(&d, t, 1, name, sizeof name);
  stop_trainer(t, SIGKILL);
  double t0 = dh_now();
  while (region_exists(name) && dh_now() - t0 < 10) dh_sleep_ms(50);
  ck_assert_msg(!region_exists(name), "%s left in /dev/shm 10 s after the kill (ttl 1 s)", name);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("shm_cleanup");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_interrupted_trainer_unlinks);
  tcase_add_test(tc, test_killed_trainer_swept_by_next_client);
  tcase_add_test(tc, test_killed_trainer_unlinked_at_session_end);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
