/* pe-executord end to end, a client ending its session (Request.close,
 * pe_client_close): its programs, non-persistent models and shared-memory
 * regions go at once, not at the TTL; a persistent model and a model another
 * client still uses stay; the close is idempotent; a client with more
 * programs than one release round frees them all. */
#include <fcntl.h>
#include <math.h>
#include <sys/mman.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "test_assert.h"

#define CLIENT_A 0xA001
#define CLIENT_B 0xB002
#define CLIENT_STATUS 0x5005

typedef struct census {
  int programs, clients, models;
  bool eph, keep, shared;
} census;

static census take_census(int s) {
  Pe__Request rq = dh_req(CLIENT_STATUS);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_ok(rep);
  census c = {rep->status->programs, rep->status->clients, (int)rep->status->n_models};
  for (size_t i = 0; i < rep->status->n_models; i++) {
    const char *n = rep->status->models[i]->name;
    c.eph |= !strcmp(n, "eph");
    c.keep |= !strcmp(n, "keep");
    c.shared |= !strcmp(n, "shared");
  }
  pe__reply__free_unpacked(rep, NULL);
  return c;
}

static Pe__Request close_req(uint64_t client) {
  Pe__Request rq = dh_req(client);
  rq.body_case = PE__REQUEST__BODY_CLOSE;
  rq.close = 1;
  return rq;
}

static Pe__Request shm_req(uint64_t client, Pe__ShmRequest *sr, bool reg) {
  Pe__Request rq = dh_req(client);
  rq.body_case = reg ? PE__REQUEST__BODY_REGISTER_SHM : PE__REQUEST__BODY_UNREGISTER_SHM;
  if (reg)
    rq.register_shm = sr;
  else
    rq.unregister_shm = sr;
  return rq;
}

START_TEST(test_close_ends_session) {
  dh_daemon d = {0};
  dh_start(&d, "[sessions]\nttl = 600\n");
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h_eph = dh_setup_model(s, CLIENT_A, &mlp, "eph", 7, false, NULL);
  char *weight;
  dh_setup_model(s, CLIENT_A, &mlp, "keep", 7, true, &weight);
  Pe__Reply *rep;
  uint64_t h_shared = dh_setup_model(s, CLIENT_A, &mlp, "shared", 7, false, NULL);
  bool existed = false;
  ck_assert_uint_eq(dh_register(s, CLIENT_B, &mlp, "shared", 7, false, &existed, NULL), h_shared);
  ck_assert(existed);

  /* A region of A's. */
  char name[64];
  snprintf(name, sizeof name, "/pe-e2e-close-%d", (int)getpid());
  int fd = shm_open(name, O_CREAT | O_RDWR | O_EXCL, 0600);
  ck_assert_int_ge(fd, 0);
  Pe__ShmRequest sr = PE__SHM_REQUEST__INIT;
  uint8_t token[PE_SHM_TOKEN_LEN];
  dh_shm_seal(fd, 4096, token, &sr);
  close(fd);
  sr.name = name;
  sr.size = 4096;
  Pe__Request rq = shm_req(CLIENT_A, &sr, true);
  rep = dh_call(s, &rq);
  dh_ok(rep);
  uint64_t region = rep->shm->region;
  pe__reply__free_unpacked(rep, NULL);

  census before = take_census(s);
  ck_assert_int_eq(before.programs, 3);
  ck_assert(before.eph && before.keep && before.shared);

  /* A closes: its sole programs go, the one B co-owns stays. */
  rq = close_req(CLIENT_A);
  size_t len = pe__request__get_packed_size(&rq);
  uint8_t buf[64];
  ck_assert_uint_le(len, sizeof buf);
  pe__request__pack(&rq, buf);
  rep = dh_call_raw(s, buf, len);
  dh_ok(rep);
  ck_assert_int_eq(rep->body_case, PE__REPLY__BODY__NOT_SET);
  pe__reply__free_unpacked(rep, NULL);
  census after = take_census(s);
  ck_assert_msg(!after.eph, "the non-persistent model only A used is still there");
  ck_assert_msg(after.keep, "the persistent model went with its client");
  ck_assert_msg(after.shared, "the model B still uses went with A");
  ck_assert_int_eq(after.programs, 1);
  ck_assert_int_eq(after.clients, before.clients - 1);

  /* A resend of the same close is answered from the reply cache; a new
   * close does nothing more. */
  rep = dh_call_raw(s, buf, len);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  rq = close_req(CLIENT_A);
  rep = dh_call(s, &rq);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  census again = take_census(s);
  ck_assert_int_eq(again.programs, 1);
  ck_assert(again.keep && again.shared && !again.eph);

  /* A's program and region are gone. */
  dh_batch b;
  dh_batch_make(&b, 8, 3);
  Pe__RunRequest run;
  char *fl[] = {mlp.loss};
  rq = dh_run_req(CLIENT_A, &run, h_eph, b.feeds, 2, fl, 1, 1);
  rep = dh_call(s, &rq);
  dh_err(rep, PE_ENOTFOUND, "no such program");
  pe__reply__free_unpacked(rep, NULL);
  Pe__ShmRequest ur = PE__SHM_REQUEST__INIT;
  ur.region = region;
  rq = shm_req(CLIENT_A, &ur, false);
  rep = dh_call(s, &rq);
  ck_assert_int_eq(rep->code, PE_ENOTFOUND);
  pe__reply__free_unpacked(rep, NULL);

  /* B trains on as before; the persistent model's values are still there. */
  float loss = dh_run_loss(s, CLIENT_B, h_shared, &b, mlp.loss, 1);
  ck_assert(isfinite(loss) && loss > 0);
  size_t wlen;
  uint8_t *w = dh_get_param(s, CLIENT_B, "keep", weight, &wlen);
  ck_assert_uint_gt(wlen, 0);
  free(w);
  free(weight);

  /* The model name A used is free: registering it again starts afresh. */
  dh_setup_model(s, CLIENT_A, &mlp, "eph", 7, false, NULL);
  ck_assert(take_census(s).eph);

  shm_unlink(name);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

/* More programs than one release round (64): all of them go. */
START_TEST(test_close_frees_every_program) {
  enum { N = 70 };
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  for (int i = 0; i < N; i++) {
    char model[16];
    snprintf(model, sizeof model, "m%02d", i);
    dh_register(s, CLIENT_A, &mlp, model, 1, false, NULL, NULL);
  }
  ck_assert_int_eq(take_census(s).programs, N);
  Pe__Request rq = close_req(CLIENT_A);
  Pe__Reply *rep = dh_call(s, &rq);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  census after = take_census(s);
  ck_assert_int_eq(after.programs, 0);
  ck_assert_int_eq(after.models, 0);
  pe_model_spec_release(&mlp);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("daemon_close");
  TCase *tc = tcase_create("e2e");
  tcase_add_test(tc, test_close_ends_session);
  tcase_add_test(tc, test_close_frees_every_program);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
