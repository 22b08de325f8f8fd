/* pe-executord end to end: a resent run is never applied twice, also where
 * the reply cache cannot answer it: after a daemon restart from the
 * checkpoint that includes the run (the file carries the model's run
 * origins; SIGTERM's checkpoint or an autosave before a kill -9), after a
 * Load, and after its cached reply was evicted. nanomsg's REQ socket
 * replays an unanswered request when it reconnects to a restarted daemon,
 * which is the first case. */
#include "check_main.h"
#include "ckpt_watch.h"
#include "daemon_harness.h"
#include "server/checkpoint/file.h"
#include "test_assert.h"

#define CLIENT_A 0xa11ce
#define CLIENT_B 0xb0b

typedef struct world {
  dh_daemon d;
  int s;
  pe_model_spec mlp;
  char *w; /* a weight's name */
  uint64_t h;
  dh_batch b;
} world;

static void register_model(world *x, uint64_t client) {
  Pe__Reply *reg;
  x->h = dh_register(x->s, client, &x->mlp, "rm", 5, true, NULL, &reg);
  if (!x->w) x->w = dh_first_weight(reg);
  pe__reply__free_unpacked(reg, NULL);
  Pe__Reply *rep = dh_init(x->s, client, x->h);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
}

static void world_start(world *x, const char *conf) {
  memset(x, 0, sizeof *x);
  dh_start(&x->d, conf);
  x->s = dh_connect(&x->d, 30000);
  x->mlp = dh_mlp();
  register_model(x, CLIENT_A);
  dh_batch_make(&x->b, 16, 5);
}

static void world_stop(world *x) {
  nn_close(x->s);
  ck_assert_int_eq(dh_stop(&x->d, SIGTERM), 0);
  free(x->w);
  dh_batch_free(&x->b);
  pe_model_spec_release(&x->mlp);
  dh_cleanup(&x->d);
}

static uint8_t *weight(world *x, size_t *n) {
  return dh_get_param(x->s, CLIENT_B, "rm", x->w, n);
}

/* A packed run request of client A: `steps` steps, the loss fetched. */
static uint8_t *pack_run(world *x, uint32_t steps, size_t *len) {
  Pe__RunRequest run;
  char *fl[] = {x->mlp.loss};
  Pe__Request rq = dh_run_req(CLIENT_A, &run, x->h, x->b.feeds, 2, fl, 1, steps);
  *len = pe__request__get_packed_size(&rq);
  uint8_t *buf = malloc(*len);
  pe__request__pack(&rq, buf);
  return buf;
}

/* SIGTERM writes the shutdown checkpoint with the run in it; after the
 * restart the same request bytes (client A's id and request id, as
 * nanomsg would replay them) get ALREADY_APPLIED and change nothing; the
 * client's next request trains on. */
START_TEST(test_resend_after_restart) {
  world x;
  world_start(&x, NULL);
  size_t len, n;
  uint8_t *run = pack_run(&x, 3, &len);
  Pe__Reply *rep = dh_call_raw(x.s, run, len);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  uint8_t *w1 = weight(&x, &n);
  nn_close(x.s);
  ck_assert_int_eq(dh_stop(&x.d, SIGTERM), 0);

  dh_start(&x.d, NULL);
  x.s = dh_connect(&x.d, 30000);
  register_model(&x, CLIENT_B); /* restored from the shutdown checkpoint */
  uint8_t *w2 = weight(&x, &n);
  ck_assert_msg(memcmp(w1, w2, n) == 0, "%s not restored after the restart", x.w);
  rep = dh_call_raw(x.s, run, len);
  dh_err(rep, PE_EALREADY, "already reached model 'rm' (3 step(s)");
  ck_assert_msg(strstr(rep->message, "not applied again"), "%s", rep->message);
  pe__reply__free_unpacked(rep, NULL);
  uint8_t *w3 = weight(&x, &n);
  ck_assert_msg(memcmp(w1, w3, n) == 0, "the resend after the restart was applied to %s", x.w);
  /* The client's next request is new: it runs. */
  dh_run_loss(x.s, CLIENT_A, x.h, &x.b, x.mlp.loss, 1);
  uint8_t *w4 = weight(&x, &n);
  ck_assert_msg(memcmp(w1, w4, n) != 0, "the next request did not train %s", x.w);
  free(w1);
  free(w2);
  free(w3);
  free(w4);
  free(run);
  world_stop(&x);
}
END_TEST

/* kill -9 after an autosave that includes the run: the restart loads the
 * autosave, and the replayed request is refused. */
START_TEST(test_resend_after_sigkill) {
  world x;
  world_start(&x, "[state]\ncheckpoint_interval = 0.2\n");
  size_t len, n;
  uint8_t *run = pack_run(&x, 2, &len);
  uint64_t id = dh_next_id - 1;
  Pe__Reply *rep = dh_call_raw(x.s, run, len);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  uint8_t *w1 = weight(&x, &n);
  cw_wait_autosaved(&x.d, "rm", CLIENT_A, id);
  nn_close(x.s);
  ck_assert(WIFSIGNALED(dh_stop(&x.d, SIGKILL)));

  dh_start(&x.d, "[state]\ncheckpoint_interval = 0.2\n");
  x.s = dh_connect(&x.d, 30000);
  register_model(&x, CLIENT_B);
  rep = dh_call_raw(x.s, run, len);
  dh_err(rep, PE_EALREADY, "(2 step(s) of it are in its parameters)");
  pe__reply__free_unpacked(rep, NULL);
  uint8_t *w2 = weight(&x, &n);
  ck_assert_msg(memcmp(w1, w2, n) == 0, "%s: not the autosaved value, or the resend ran", x.w);
  free(w1);
  free(w2);
  free(run);
  world_stop(&x);
}
END_TEST

/* A checkpoint loaded by hand brings its origins in place of the model's:
 * a run the file includes is refused, a run made after the save (not in
 * the loaded values) runs again. A cache of one reply, so the resends get
 * past it. */
START_TEST(test_resend_after_load) {
  world x;
  world_start(&x, "[limits]\ndedup_entries = 1\n");
  size_t len_a, len_b, n;
  uint8_t *a = pack_run(&x, 1, &len_a);
  Pe__Reply *rep = dh_call_raw(x.s, a, len_a);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  Pe__Request rq = dh_req(CLIENT_B);
  Pe__CheckpointRequest cr = PE__CHECKPOINT_REQUEST__INIT;
  cr.model = (char *)"rm";
  cr.name = (char *)"after-a";
  rq.body_case = PE__REQUEST__BODY_SAVE;
  rq.save = &cr;
  dh_ok(rep = dh_call(x.s, &rq));
  pe__reply__free_unpacked(rep, NULL);
  uint8_t *b = pack_run(&x, 2, &len_b);
  dh_ok(rep = dh_call_raw(x.s, b, len_b));
  pe__reply__free_unpacked(rep, NULL);
  rq = dh_req(CLIENT_B);
  rq.body_case = PE__REQUEST__BODY_LOAD;
  rq.load = &cr;
  dh_ok(rep = dh_call(x.s, &rq));
  pe__reply__free_unpacked(rep, NULL);
  uint8_t *w0 = weight(&x, &n);
  rep = dh_call_raw(x.s, a, len_a);
  dh_err(rep, PE_EALREADY, "(1 step(s) of it are in its parameters)");
  pe__reply__free_unpacked(rep, NULL);
  uint8_t *w1 = weight(&x, &n);
  ck_assert_msg(memcmp(w0, w1, n) == 0, "the refused resend changed %s", x.w);
  dh_ok(rep = dh_call_raw(x.s, b, len_b)); /* not in the loaded values */
  pe__reply__free_unpacked(rep, NULL);
  uint8_t *w2 = weight(&x, &n);
  ck_assert_msg(memcmp(w0, w2, n) != 0, "b did not run after loading a checkpoint before it");
  free(w0);
  free(w1);
  free(w2);
  free(a);
  free(b);
  world_stop(&x);
}
END_TEST

/* With a reply cache of one entry, the run's reply is evicted by the next
 * request; the resend is still not applied again. */
START_TEST(test_resend_after_eviction) {
  world x;
  world_start(&x, "[limits]\ndedup_entries = 1\n");
  size_t len, n;
  uint8_t *run = pack_run(&x, 2, &len);
  Pe__Reply *rep = dh_call_raw(x.s, run, len);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  uint8_t *w1 = weight(&x, &n); /* evicts the run's reply */
  free(weight(&x, &n));
  rep = dh_call_raw(x.s, run, len);
  dh_err(rep, PE_EALREADY, "(2 step(s) of it are in its parameters)");
  pe__reply__free_unpacked(rep, NULL);
  uint8_t *w2 = weight(&x, &n);
  ck_assert_msg(memcmp(w1, w2, n) == 0, "the resend after eviction was applied to %s", x.w);
  /* Status shows the eviction (so the cache did not answer it). */
  Pe__Request rq = dh_req(CLIENT_B);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  Pe__Reply *st = dh_call(x.s, &rq);
  dh_ok(st);
  ck_assert_uint_ge(st->status->reply_cache_evictions, 1);
  ck_assert_uint_eq(st->status->runs_total, 2);
  pe__reply__free_unpacked(st, NULL);
  free(w1);
  free(w2);
  free(run);
  world_stop(&x);
}
END_TEST

static Suite *resend_suite(void) {
  Suite *s = suite_create("resend_restart");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_resend_after_restart);
  tcase_add_test(tc, test_resend_after_sigkill);
  tcase_add_test(tc, test_resend_after_load);
  tcase_add_test(tc, test_resend_after_eviction);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(resend_suite)
