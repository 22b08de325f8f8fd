/* pe-executord end to end, DropModelRequest: refused while another live
 * client's program uses the model (naming the program and the client); the
 * caller's own programs go with it; the model is freed and its restart
 * checkpoint removed (named checkpoints stay), so the name starts afresh,
 * also with other shapes; a model not loaded after a restart (its register
 * refused: the checkpoint does not fit) has the file removed; no model and
 * no file: NOT_FOUND; autosave does not bring a dropped model's file back. */
#include "check_main.h"
#include "daemon_harness.h"
#include "test_assert.h"

#define CLIENT_A 0xd01a
#define CLIENT_B 0xd02b

static Pe__Reply *drop(int s, uint64_t client, const char *model) {
  Pe__Request rq = dh_req(client);
  Pe__DropModelRequest dr = PE__DROP_MODEL_REQUEST__INIT;
  dr.model = (char *)model;
  rq.body_case = PE__REQUEST__BODY_DROP_MODEL;
  rq.drop_model = &dr;
  return dh_call(s, &rq);
}

/* A drop that must succeed, with these results. */
static void drop_ok(int s, uint64_t client, const char *model, bool freed, const char *removed,
                    int programs) {
  Pe__Reply *rep = drop(s, client, model);
  dh_ok(rep);
  ck_assert_int_eq(rep->body_case, PE__REPLY__BODY_DROP_MODEL);
  ck_assert_int_eq(rep->drop_model->freed, freed);
  ck_assert_str_eq(rep->drop_model->removed, removed);
  ck_assert_int_eq(rep->drop_model->programs, programs);
  pe__reply__free_unpacked(rep, NULL);
}

/* Whether the daemon lists model `name`. */
static bool model_listed(int s, const char *name) {
  Pe__Request rq = dh_req(CLIENT_B);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_ok(rep);
  bool found = false;
  for (size_t i = 0; i < rep->status->n_models; i++)
    found |= !strcmp(rep->status->models[i]->name, name);
  pe__reply__free_unpacked(rep, NULL);
  return found;
}

static bool exists(const char *path) {
  return access(path, F_OK) == 0;
}

START_TEST(test_drop_live_model) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp(), wide = dh_mlp_wide();
  uint64_t h = dh_setup_model(s, CLIENT_A, &mlp, "pm", 3, true, NULL);
  dh_batch b;
  dh_batch_make(&b, 16, 3);
  dh_run_loss(s, CLIENT_A, h, &b, mlp.loss, 1);
  Pe__Reply *rep = dh_checkpoint(s, CLIENT_A, true, "pm", "named");
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  char restart[512], named[512];
  snprintf(restart, sizeof restart, "%s/models/pm/shutdown.ckpt", d.state);
  snprintf(named, sizeof named, "%s/models/pm/named.ckpt", d.state);
  ck_assert(exists(restart));

  dh_start(&d, NULL);
  s = dh_connect(&d, 30000);
  Pe__Reply *reg;
  h = dh_register(s, CLIENT_A, &mlp, "pm", 3, true, NULL, &reg);
  ck_assert(reg->register_->has_values);
  pe__reply__free_unpacked(reg, NULL);
  /* In use by another client's program: refused, naming it; nothing changes. */
  rep = drop(s, CLIENT_B, "pm");
  char handle[40], client[40];
  snprintf(handle, sizeof handle, "program 0x%016llx", (unsigned long long)h);
  /* A's id is a credential: B's message names A by its tag only. */
  snprintf(client, sizeof client, "%016llx", (unsigned long long)CLIENT_A);
  dh_err(rep, PE_EPERM, "drop_model: model 'pm' is in use by");
  dh_err(rep, PE_EPERM, handle);
  dh_err(rep, PE_EPERM, " of client c-");
  ck_assert_msg(!strstr(rep->message, client), "the message shows A's id: %s", rep->message);
  pe__reply__free_unpacked(rep, NULL);
  ck_assert(exists(restart));
  dh_run_loss(s, CLIENT_A, h, &b, mlp.loss, 1);
  /* By the client that uses it: its program goes with the model, and the
   * restart checkpoint with both; the named one stays. */
  drop_ok(s, CLIENT_A, "pm", true, restart, 1);
  ck_assert(!exists(restart));
  ck_assert(exists(named));
  ck_assert(!model_listed(s, "pm"));
  Pe__RunRequest run;
  char *fl[] = {mlp.loss};
  Pe__Request rq = dh_run_req(CLIENT_A, &run, h, b.feeds, 2, fl, 1, 1);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_ENOTFOUND, "no such program");
  pe__reply__free_unpacked(rep, NULL);

  /* The name starts afresh, with other shapes too. */
  uint64_t hw = dh_register(s, CLIENT_B, &wide, "pm", 3, true, NULL, &reg);
  ck_assert(!reg->register_->has_values);
  pe__reply__free_unpacked(reg, NULL);
  ck_assert(dh_init_ok(s, CLIENT_B, hw));
  dh_run_loss(s, CLIENT_B, hw, &b, wide.loss, 1);
  /* A non-persistent model without a restart checkpoint: freed, nothing removed. */
  dh_setup_model(s, CLIENT_A, &mlp, "eph", 3, false, NULL);
  drop_ok(s, CLIENT_A, "eph", true, "", 1);
  ck_assert(!model_listed(s, "eph"));
  /* Nothing of that name: NOT_FOUND; a bad name: INVALID_ARGUMENT. */
  rep = drop(s, CLIENT_A, "eph");
  dh_err(rep, PE_ENOTFOUND, "no model 'eph'");
  pe__reply__free_unpacked(rep, NULL);
  rep = drop(s, CLIENT_A, "../x");
  dh_err(rep, PE_EINVAL, "model name");
  pe__reply__free_unpacked(rep, NULL);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  ck_assert(exists(restart)); /* the wide model's, written at SIGTERM */

  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  pe_model_spec_release(&wide);
  dh_cleanup(&d);
}
END_TEST

/* The reviewer's path: after a restart the register of a program of other
 * shapes is refused (the restart checkpoint does not fit, and stays); the
 * drop removes the file of the model that is not loaded, and the register
 * then starts the name afresh. */
START_TEST(test_drop_unloaded_model) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp(), wide = dh_mlp_wide();
  dh_setup_model(s, CLIENT_A, &mlp, "pm", 3, true, NULL);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  char restart[600], dir[512];
  snprintf(dir, sizeof dir, "%s/models/pm", d.state);
  snprintf(restart, sizeof restart, "%s/shutdown.ckpt", dir);
  ck_assert(exists(restart));

  dh_start(&d, NULL);
  s = dh_connect(&d, 30000);
  Pe__Reply *rep = dh_register_call(s, CLIENT_B, &wide, "pm", 3, true);
  dh_err(rep, PE_ESHAPE, "drop-model --model pm");
  pe__reply__free_unpacked(rep, NULL);
  ck_assert(exists(restart));
  ck_assert(!model_listed(s, "pm"));
  drop_ok(s, CLIENT_B, "pm", false, restart, 0);
  ck_assert(!exists(restart));
  ck_assert_msg(!exists(dir), "%s left behind (empty)", dir);
  rep = drop(s, CLIENT_B, "pm");
  dh_err(rep, PE_ENOTFOUND, "no restart checkpoint");
  pe__reply__free_unpacked(rep, NULL);
  uint64_t hw = dh_register(s, CLIENT_B, &wide, "pm", 3, true, NULL, NULL);
  ck_assert(dh_init_ok(s, CLIENT_B, hw));

  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  pe_model_spec_release(&mlp);
  pe_model_spec_release(&wide);
  dh_cleanup(&d);
}
END_TEST

/* Autosave every 0.1 s while the model trains: once dropped, its restart
 * checkpoint stays gone (autosave skips it, and a save in flight cannot
 * put the file back after the removal). */
START_TEST(test_drop_under_autosave) {
  dh_daemon d = {0};
  dh_start(&d, "[state]\ncheckpoint_interval = 0.1\n");
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  dh_batch b;
  dh_batch_make(&b, 16, 3);
  char restart[512];
  snprintf(restart, sizeof restart, "%s/models/as/shutdown.ckpt", d.state);
  for (int round = 0; round < 3; round++) {
    uint64_t h = dh_setup_model(s, CLIENT_A, &mlp, "as", 3, true, NULL);
    double t0 = dh_now();
    while (!exists(restart) || dh_now() - t0 < 0.3) {
      dh_run_loss(s, CLIENT_A, h, &b, mlp.loss, 1);
      ck_assert_msg(dh_now() - t0 < 10, "no autosave within 10 s");
    }
    Pe__Reply *rep = drop(s, CLIENT_A, "as");
    dh_ok(rep);
    ck_assert(rep->drop_model->freed);
    pe__reply__free_unpacked(rep, NULL);
    ck_assert(!exists(restart));
    dh_sleep_ms(300); /* three intervals */
    ck_assert_msg(!exists(restart), "round %d: %s written after the drop", round, restart);
  }
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  ck_assert(!exists(restart));
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("drop_model");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_drop_live_model);
  tcase_add_test(tc, test_drop_unloaded_model);
  tcase_add_test(tc, test_drop_under_autosave);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
