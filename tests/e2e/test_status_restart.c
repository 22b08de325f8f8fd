/* pe-executord end to end: status reports what a crash would lose as the
 * changes since the restart checkpoint (the file a restart restores,
 * written by autosave and SIGTERM), not since the newest checkpoint of any
 * name (after `save --checkpoint backup` a kill -9 still rolls back to the
 * older autosave, so "0 change(s) since" would be wrong; after a restart
 * that restored the model the count is still shown). A client's save under the restart checkpoint's
 * name is refused. */
#include "check_main.h"
#include "daemon_harness.h"
#include "test_assert.h"

#define CLIENT 0x57a7

typedef struct restart_status {
  char restart[64], last[64];
  double age_s;
  int64_t changes, named_changes;
  bool read;
} restart_status;

static restart_status status_of(int s, const char *name) {
  Pe__Request rq = dh_req(CLIENT);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_ok(rep);
  restart_status c = {0};
  bool found = false;
  for (size_t i = 0; i < rep->status->n_models; i++) {
    const Pe__ModelStatus *m = rep->status->models[i];
    if (strcmp(m->name, name)) continue;
    found = true;
    snprintf(c.restart, sizeof c.restart, "%s", m->restart_checkpoint);
    snprintf(c.last, sizeof c.last, "%s", m->last_checkpoint);
    c.age_s = m->restart_checkpoint_age_s;
    c.changes = m->changes_since_restart_checkpoint;
    c.named_changes = m->changes_since_checkpoint;
    c.read = m->restart_checkpoint_read;
  }
  pe__reply__free_unpacked(rep, NULL);
  ck_assert_msg(found, "no model '%s' in the status", name);
  return c;
}

static void saved(int s, const char *name) {
  Pe__Reply *rep = dh_checkpoint(s, CLIENT, true, "pm", name);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
}

START_TEST(test_status_counts_from_the_restart_checkpoint) {
  dh_daemon d = {0};
  dh_start(&d, "[state]\ncheckpoint_interval = 0.2\n");
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  dh_batch b;
  dh_batch_make(&b, 16, 3);
  uint64_t h = dh_setup_model(s, CLIENT, &mlp, "pm", 3, true, NULL);
  dh_run_loss(s, CLIENT, h, &b, mlp.loss, 1);
  /* Autosave writes the restart checkpoint: nothing to lose. */
  restart_status c;
  double t0 = dh_now();
  do {
    dh_sleep_ms(50);
    c = status_of(s, "pm");
  } while (c.changes != 0 && dh_now() - t0 < 10);
  ck_assert_msg(c.changes == 0 && c.age_s >= 0 && !c.read && !strcmp(c.restart, "shutdown"),
                "after an autosave: '%s' age %g, %lld change(s), read %d", c.restart, c.age_s,
                (long long)c.changes, c.read);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);

  /* Autosave off: a named save does not reset what a crash loses. */
  dh_start(&d, "[state]\ncheckpoint_interval = 0\n");
  s = dh_connect(&d, 30000);
  h = dh_register(s, CLIENT, &mlp, "pm", 3, true, NULL, NULL);
  c = status_of(s, "pm");
  ck_assert_msg(c.changes == 0 && c.age_s >= 0 && c.read,
                "after the restore: age %g, %lld change(s), read %d", c.age_s, (long long)c.changes,
                c.read);
  dh_run_loss(s, CLIENT, h, &b, mlp.loss, 1);
  dh_run_loss(s, CLIENT, h, &b, mlp.loss, 1);
  c = status_of(s, "pm");
  ck_assert_msg(c.changes >= 2 && c.read, "2 runs after the restore: %lld change(s)",
                (long long)c.changes);
  int64_t lost = c.changes;
  saved(s, "backup");
  c = status_of(s, "pm");
  ck_assert_msg(c.named_changes == 0 && !strcmp(c.last, "backup") && c.changes == lost,
                "after a named save: '%s' %lld change(s) since it, %lld since the restart "
                "checkpoint (want %lld)",
                c.last, (long long)c.named_changes, (long long)c.changes, (long long)lost);
  /* A save under the restart checkpoint's name is refused (the daemon
   * overwrites that file, drop-model removes it): the count stays. */
  Pe__Reply *rep = dh_checkpoint(s, CLIENT, true, "pm", "shutdown");
  dh_err(rep, PE_EINVAL, "'shutdown' is the restart checkpoint's name");
  pe__reply__free_unpacked(rep, NULL);
  c = status_of(s, "pm");
  ck_assert_msg(c.changes == lost && c.read, "after a refused save of 'shutdown': %lld change(s)",
                (long long)c.changes);

  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("status_restart");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_status_counts_from_the_restart_checkpoint);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
