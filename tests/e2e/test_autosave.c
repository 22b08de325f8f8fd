/* pe-executord end to end, autosave (config checkpoint_interval): the last
 * autosave survives kill -9 and a restart loads it bit for bit; unchanged
 * and uninitialised models are not rewritten; 0 turns it off (SIGTERM still
 * checkpoints); SIGHUP changes the interval at once; bad values stop
 * start-up naming the key. */
#include <fcntl.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "server/checkpoint/file.h"
#include "test_assert.h"

#define CLIENT 0x3003
#define FAST "[state]\ncheckpoint_interval = 0.5\n"

/* The restart checkpoint of `model` ("shutdown": the default name). */
static void ckpt_path(const dh_daemon *d, const char *model, char *buf, size_t len) {
  snprintf(buf, len, "%s/models/%s/shutdown.ckpt", d->state, model);
}

/* What tells one write of a file from the next (each is a rename of a new
 * file: a new inode and mtime). */
typedef struct file_id {
  bool exists;
  ino_t ino;
  struct timespec mtim;
  off_t size;
} file_id;

static file_id file_stat(const char *path) {
  file_id f = {0};
  struct stat sb;
  if (stat(path, &sb) == 0) {
    f.exists = true;
    f.ino = sb.st_ino;
    f.mtim = sb.st_mtim;
    f.size = sb.st_size;
  }
  return f;
}

static bool file_same(file_id a, file_id b) {
  return a.exists == b.exists && a.ino == b.ino && a.mtim.tv_sec == b.mtim.tv_sec &&
         a.mtim.tv_nsec == b.mtim.tv_nsec && a.size == b.size;
}

/* Wait (at most max_s) until path exists and has not been rewritten for
 * quiet_ms; returns its identity then. */
static file_id wait_stable(const char *path, int quiet_ms, double max_s) {
  double t0 = dh_now(), since = t0;
  file_id last = file_stat(path);
  for (;;) {
    dh_sleep_ms(50);
    file_id now = file_stat(path);
    double t = dh_now();
    if (!file_same(now, last)) {
      last = now;
      since = t;
    } else if (now.exists && (t - since) * 1e3 >= quiet_ms) {
      return now;
    }
    ck_assert_msg(t - t0 < max_s, "%s %s after %.0f s", path,
                  last.exists ? "still rewritten" : "not written", max_s);
  }
}

/* Wait (at most max_s) until path's identity differs from `was`. */
static file_id wait_changed(const char *path, file_id was, double max_s) {
  double t0 = dh_now();
  for (;;) {
    file_id now = file_stat(path);
    if (now.exists && !file_same(now, was)) return now;
    ck_assert_msg(dh_now() - t0 < max_s, "%s not rewritten within %.0f s", path, max_s);
    dh_sleep_ms(50);
  }
}

/* Register `model` (persistent) and Init it; returns the handle. */
static uint64_t setup_model(int s, pe_model_spec *mlp, const char *model, uint64_t seed) {
  uint64_t h = dh_register(s, CLIENT, mlp, model, seed, true, NULL, NULL);
  Pe__Reply *rep = dh_init(s, CLIENT, h);
  dh_ok(rep);
  ck_assert(rep->init->initialized);
  pe__reply__free_unpacked(rep, NULL);
  return h;
}

/* Whether the daemon's log contains needle. */
static bool log_has(const dh_daemon *d, const char *needle) {
  FILE *f = fopen(d->log, "r");
  if (!f) return false;
  char line[1024];
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

static void train(int s, uint64_t h, pe_model_spec *mlp, unsigned seed, uint32_t steps) {
  dh_batch b;
  dh_batch_make(&b, 16, seed);
  dh_run_loss(s, CLIENT, h, &b, mlp->loss, steps);
  dh_batch_free(&b);
}

/* Start the daemon with conf, register and Init persistent model "pm" and
 * train it `steps` steps; *s: the socket, path: pm's restart checkpoint. */
static uint64_t start_trained(dh_daemon *d, const char *conf, int *s, pe_model_spec *mlp,
                              uint64_t seed, uint32_t steps, char *path, size_t len) {
  dh_start(d, conf);
  *s = dh_connect(d, 30000);
  *mlp = dh_mlp();
  uint64_t h = setup_model(*s, mlp, "pm", seed);
  train(*s, h, mlp, (unsigned)seed, steps);
  ckpt_path(d, "pm", path, len);
  return h;
}

/* Train, let an autosave catch up, kill -9, restart: the model registered
 * again starts from the autosave (the trained values, not a fresh Init). */
START_TEST(test_sigkill_restores_last_autosave) {
  dh_daemon d = {0};
  dh_start(&d, FAST);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h = setup_model(s, &mlp, "pm", 9);
  Pe__Reply *initial = dh_get_all(s, CLIENT, "pm");
  train(s, h, &mlp, 9, 3);
  char path[512];
  ckpt_path(&d, "pm", path, sizeof path);
  /* No requests from here on: the file settles at the trained values. */
  wait_stable(path, 1200, 10);
  Pe__Reply *before = dh_get_all(s, CLIENT, "pm");
  ck_assert_msg(dh_params_differ(initial, before), "training changed no parameter");
  ck_assert_msg(log_has(&d, "autosave: model 'pm' saved to"), "no autosave logged (log %s)", d.log);
  nn_close(s);
  int st = dh_stop(&d, SIGKILL);
  ck_assert(WIFSIGNALED(st));

  dh_start(&d, FAST);
  s = dh_connect(&d, 30000);
  h = dh_register(s, CLIENT, &mlp, "pm", 9, true, NULL, NULL); /* autoloads */
  Pe__Reply *after = dh_get_all(s, CLIENT, "pm");
  const char *diff = dh_params_differ(before, after);
  ck_assert_msg(!diff, "'%s' differs after kill -9 and restart", diff ? diff : "");
  ck_assert_msg(dh_params_differ(initial, after), "restarted from the initial values");
  Pe__Reply *rep = dh_init(s, CLIENT, h);
  dh_ok(rep);
  ck_assert_msg(!rep->init->initialized, "Init ran the startup after an autoload");
  pe__reply__free_unpacked(rep, NULL);
  pe__reply__free_unpacked(initial, NULL);
  pe__reply__free_unpacked(before, NULL);
  pe__reply__free_unpacked(after, NULL);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* Without requests the file is not rewritten (same inode and mtime over
 * several intervals); a model with nothing initialised gets no file. Both
 * are written once there is something new. */
START_TEST(test_unchanged_and_uninitialised_not_saved) {
  dh_daemon d = {0};
  dh_start(&d, FAST);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h = setup_model(s, &mlp, "pm", 5);
  uint64_t he = dh_register(s, CLIENT, &mlp, "empty", 6, true, NULL, NULL);
  train(s, h, &mlp, 5, 2);
  char path[512], epath[512];
  ckpt_path(&d, "pm", path, sizeof path);
  ckpt_path(&d, "empty", epath, sizeof epath);
  file_id saved = wait_stable(path, 800, 10);
  dh_sleep_ms(1600); /* over 3 intervals */
  file_id later = file_stat(path);
  ck_assert_msg(file_same(saved, later),
                "unchanged model rewritten: inode %llu mtime %lld.%09ld, then inode %llu mtime "
                "%lld.%09ld",
                (unsigned long long)saved.ino, (long long)saved.mtim.tv_sec, saved.mtim.tv_nsec,
                (unsigned long long)later.ino, (long long)later.mtim.tv_sec, later.mtim.tv_nsec);
  ck_assert_msg(access(epath, F_OK) != 0, "%s written for a model with no parameter values", epath);
  /* The thread is alive: a step is saved, and so is the model once Init
   * gave it values. */
  train(s, h, &mlp, 5, 1);
  wait_changed(path, saved, 5);
  Pe__Reply *rep = dh_init(s, CLIENT, he);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  wait_stable(epath, 200, 5);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* checkpoint_interval = 0: nothing is written while training, only the
 * shutdown checkpoint on SIGTERM. */
START_TEST(test_interval_zero_only_sigterm) {
  dh_daemon d = {0};
  int s;
  pe_model_spec mlp;
  char path[512];
  uint64_t h =
      start_trained(&d, "[state]\ncheckpoint_interval = 0\n", &s, &mlp, 7, 2, path, sizeof path);
  for (int i = 0; i < 4; i++) { /* 3 intervals' worth of the fast tests, while training */
    dh_sleep_ms(400);
    train(s, h, &mlp, 7, 1);
    ck_assert_msg(access(path, F_OK) != 0, "%s written with checkpoint_interval = 0", path);
  }
  nn_close(s);
  int st = dh_stop(&d, SIGTERM);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "SIGTERM: wait status %d", st);
  ck_assert_msg(access(path, F_OK) == 0, "no shutdown checkpoint %s after SIGTERM", path);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

/* Status of model `name` (its checkpoint fields copied; the reply freed). */
typedef struct ckpt_status {
  uint64_t saved, failed;
  char last[64], error[512];
  double age_s, interval_s;
  int64_t changes;
} ckpt_status;

static ckpt_status status_of(int s, const char *name) {
  Pe__Request rq = dh_req(CLIENT);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_ok(rep);
  ckpt_status c = {.interval_s = rep->status->checkpoint_interval_s};
  bool found = false;
  for (size_t i = 0; i < rep->status->n_models; i++) {
    const Pe__ModelStatus *m = rep->status->models[i];
    if (strcmp(m->name, name)) continue;
    found = true;
    c.saved = m->checkpoints_saved;
    c.failed = m->checkpoint_failures;
    snprintf(c.last, sizeof c.last, "%s", m->last_checkpoint);
    snprintf(c.error, sizeof c.error, "%s", m->last_checkpoint_error);
    c.age_s = m->last_checkpoint_age_s;
    c.changes = m->changes_since_checkpoint;
  }
  pe__reply__free_unpacked(rep, NULL);
  ck_assert_msg(found, "no model '%s' in the status", name);
  return c;
}

/* Status tells an operator what the checkpoints did: none yet (age -1),
 * then the autosave written with no change since; a restart checkpoint
 * that cannot be written (a directory in its place) counts failures with
 * the reason and the changes piling up since the last good one; once it
 * can be written again, it is, and the changes since go back to 0. */
START_TEST(test_status_reports_checkpoints) {
  dh_daemon d = {0};
  dh_start(&d, "[state]\ncheckpoint_interval = 300\n");
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h = setup_model(s, &mlp, "pm", 4);
  ckpt_status c = status_of(s, "pm");
  ck_assert_msg(c.saved == 0 && c.failed == 0 && c.age_s == -1 && c.changes == -1 &&
                    c.last[0] == 0 && c.error[0] == 0 && c.interval_s == 300,
                "before any checkpoint: saved %llu failed %llu age %g changes %lld '%s' '%s' %g",
                (unsigned long long)c.saved, (unsigned long long)c.failed, c.age_s,
                (long long)c.changes, c.last, c.error, c.interval_s);
  FILE *f = fopen(d.conf, "w");
  ck_assert(f != NULL);
  fputs(FAST, f);
  fclose(f);
  ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
  train(s, h, &mlp, 4, 2);
  char path[512];
  ckpt_path(&d, "pm", path, sizeof path);
  wait_stable(path, 800, 10);
  c = status_of(s, "pm");
  ck_assert_msg(c.saved >= 1 && c.failed == 0 && !strcmp(c.last, "shutdown") && c.changes == 0 &&
                    c.age_s >= 0 && c.age_s < 10 && c.interval_s == 0.5,
                "after an autosave: saved %llu failed %llu '%s' changes %lld age %g interval %g",
                (unsigned long long)c.saved, (unsigned long long)c.failed, c.last,
                (long long)c.changes, c.age_s, c.interval_s);
  uint64_t saved = c.saved;
  ck_assert_int_eq(unlink(path), 0);
  ck_assert_int_eq(mkdir(path, 0700), 0);
  train(s, h, &mlp, 4, 3);
  double t0 = dh_now();
  while ((c = status_of(s, "pm")).failed == 0) {
    ck_assert_msg(dh_now() - t0 < 10, "no failed autosave reported in 10 s");
    dh_sleep_ms(100);
  }
  ck_assert_msg(strstr(c.error, path) && strstr(c.error, "Is a directory") && c.saved == saved &&
                    c.changes >= 1,
                "after a failed autosave: '%s', saved %llu (was %llu), changes %lld", c.error,
                (unsigned long long)c.saved, (unsigned long long)saved, (long long)c.changes);
  ck_assert_int_eq(rmdir(path), 0);
  wait_stable(path, 800, 10);
  c = status_of(s, "pm");
  ck_assert_msg(c.saved > saved && c.changes == 0, "after the fix: saved %llu changes %lld",
                (unsigned long long)c.saved, (long long)c.changes);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* SIGHUP from 300 s to 0.5 s: the thread wakes and saves at once, not
 * after the old interval. */
START_TEST(test_sighup_changes_interval) {
  dh_daemon d = {0};
  int s;
  pe_model_spec mlp;
  char path[512];
  start_trained(&d, "[state]\ncheckpoint_interval = 300\n", &s, &mlp, 8, 2, path, sizeof path);
  dh_sleep_ms(300);
  ck_assert_msg(access(path, F_OK) != 0, "%s written before the interval", path);
  FILE *f = fopen(d.conf, "w");
  ck_assert(f != NULL);
  fputs(FAST, f);
  fclose(f);
  ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
  wait_stable(path, 200, 5);
  ck_assert(dh_alive(&d));
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* A bad value stops start-up (exit 2) with an error naming the key. */
START_TEST(test_bad_interval_refused) {
  const char *bad[] = {"-1", "abc", "inf", "1s"};
  dh_daemon d = {0};
  snprintf(d.dir, sizeof d.dir, "/tmp/pe-e2e-XXXXXX");
  ck_assert(mkdtemp(d.dir) != NULL);
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char conf[400], cmd[1400], out[4096] = "";
    snprintf(conf, sizeof conf, "%s/bad.conf", d.dir);
    FILE *f = fopen(conf, "w");
    ck_assert(f != NULL);
    fprintf(f, "[state]\ncheckpoint_interval = %s\n", bad[i]);
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "'%s/pe-executord' --config '%s' --places cpu:1 --socket 'ipc://%s/d.sock' "
             "--state-dir '%s/state' 2>&1",
             getenv("PE_BUILD_DIR"), conf, d.dir, d.dir);
    FILE *p = popen(cmd, "r");
    ck_assert(p != NULL);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 2, "value '%s': status 0x%x, output: %s",
                  bad[i], st, out);
    char want[128];
    snprintf(want, sizeof want, "[state] checkpoint_interval = '%s'", bad[i]);
    ck_assert_msg(strstr(out, want) && !strstr(out, "ready on"), "value '%s': output: %s", bad[i],
                  out);
  }
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("autosave");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_sigkill_restores_last_autosave);
  tcase_add_test(tc, test_unchanged_and_uninitialised_not_saved);
  tcase_add_test(tc, test_interval_zero_only_sigterm);
  tcase_add_test(tc, test_sighup_changes_interval);
  tcase_add_test(tc, test_status_reports_checkpoints);
  tcase_add_test(tc, test_bad_interval_refused);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
