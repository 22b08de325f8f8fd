/* pe-executord end to end: a run of many steps (RunRequest.steps) stops
 * between two steps when the daemon is stopped (SIGTERM: it exits 0 within
 * seconds with the shutdown checkpoint written, holding the steps done,
 * and a resend of the run after the restart is ALREADY_APPLIED naming
 * them), when its program is force-deregistered by another client, or when
 * its client drops the model; the reply says "run cancelled after N of M
 * steps: <reason>", the daemon stays up and other clients' runs go on.
 * Before, such a run went on to its millionth step (minutes) and SIGTERM
 * waited for it. */
#include <pthread.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "test_assert.h"

#define CLIENT_A 0xca01
#define CLIENT_B 0xca02
#define CLIENT_C 0xca03
#define STEPS 1000000u

/* The long run, sent from its own thread and socket; the main thread
 * polls `done` (no Check assertion in this thread). */
typedef struct runner {
  const dh_daemon *d;
  uint8_t *buf; /* the packed request (kept for a resend) */
  size_t len;
  Pe__Reply *rep; /* NULL: no reply */
  atomic_bool done;
  pthread_t th;
} runner;

static void *runner_main(void *arg) {
  runner *r = arg;
  int s = nn_socket(AF_SP, NN_REQ);
  int t = 60000, unlimited = -1;
  nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVMAXSIZE, &unlimited, sizeof unlimited);
  nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &t, sizeof t);
  nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDTIMEO, &t, sizeof t);
  if (s >= 0 && nn_connect(s, r->d->addr) >= 0) {
    void *rbuf = NULL;
    int n = nn_send(s, r->buf, r->len, 0) < 0 ? -1 : nn_recv(s, &rbuf, NN_MSG, 0);
    if (n >= 0) {
      r->rep = pe__reply__unpack(NULL, (size_t)n, rbuf);
      nn_freemsg(rbuf);
    }
  }
  if (s >= 0) nn_close(s);
  atomic_store(&r->done, true);
  return NULL;
}

/* Start a run of STEPS steps of handle h for CLIENT_A on batch b. */
static void runner_start(runner *r, const dh_daemon *d, uint64_t h, dh_batch *b, const char *loss) {
  memset(r, 0, sizeof *r);
  r->d = d;
  Pe__RunRequest run;
  char *f[] = {(char *)loss};
  Pe__Request rq = dh_run_req(CLIENT_A, &run, h, b->feeds, 2, f, 1, STEPS);
  r->len = pe__request__get_packed_size(&rq);
  r->buf = malloc(r->len);
  pe__request__pack(&rq, r->buf);
  ck_assert_int_eq(pthread_create(&r->th, NULL, runner_main, r), 0);
}

/* Wait up to limit_s for the run's reply; the seconds waited. */
static double runner_wait(runner *r, double limit_s) {
  double t0 = dh_now();
  while (!atomic_load(&r->done) && dh_now() - t0 < limit_s) dh_sleep_ms(10);
  ck_assert_msg(atomic_load(&r->done), "no reply to the long run within %.0f s of its cancel",
                limit_s);
  pthread_join(r->th, NULL);
  ck_assert_msg(r->rep != NULL, "the long run got no reply");
  return dh_now() - t0;
}

/* The reply says the run was cancelled for `why`; returns the steps done. */
static unsigned cancelled_steps(const Pe__Reply *rep, int code, const char *why) {
  dh_err(rep, code, "run cancelled after ");
  ck_assert_msg(strstr(rep->message, why), "'%s' not in: %s", why, rep->message);
  unsigned n = 0, m = 0;
  const char *p = strstr(rep->message, "run cancelled after ");
  ck_assert_int_eq(sscanf(p, "run cancelled after %u of %u steps", &n, &m), 2);
  ck_assert_uint_eq(m, STEPS);
  ck_assert_msg(n >= 1 && n < STEPS, "steps done %u", n);
  return n;
}

static int runs_in_flight(int s) {
  Pe__Request rq = dh_req(CLIENT_C);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_ok(rep);
  int n = rep->status->runs_in_flight;
  pe__reply__free_unpacked(rep, NULL);
  return n;
}

/* Status counts the run in flight (within 5 s of its send); a few more
 * steps are then done. */
static void wait_running(int s) {
  double t0 = dh_now();
  while (runs_in_flight(s) != 1) {
    ck_assert_msg(dh_now() - t0 < 5, "status shows no run in flight");
    dh_sleep_ms(10);
  }
  dh_sleep_ms(200);
}

START_TEST(sigterm_cancels_and_checkpoints) {
  dh_daemon d = {0};
  dh_start(&d, NULL);
  int s = dh_connect(&d, 30000);
  pe_model_spec mlp = dh_mlp();
  uint64_t h = dh_setup_model(s, CLIENT_A, &mlp, "rc", 3, true, NULL);
  dh_batch b;
  dh_batch_make(&b, 16, 3);
  runner r;
  runner_start(&r, &d, h, &b, mlp.loss);
  wait_running(s);
  nn_close(s);
  double t0 = dh_now();
  int ws = dh_stop(&d, SIGTERM);
  double took = dh_now() - t0;
  ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "daemon wait status %d", ws);
  ck_assert_msg(took < 5, "SIGTERM took %.1f s with a long run in flight", took);
  runner_wait(&r, 5);
  unsigned n = cancelled_steps(r.rep, PE_ENOTFOUND, "the daemon is shutting down");
  pe__reply__free_unpacked(r.rep, NULL);
  char restart[512];
  snprintf(restart, sizeof restart, "%s/models/rc/shutdown.ckpt", d.state);
  ck_assert_msg(access(restart, F_OK) == 0, "%s not written", restart);

  /* The restart has the steps done: the register says so, and a resend of
   * the run is not applied again. */
  dh_start(&d, NULL);
  s = dh_connect(&d, 30000);
  Pe__Reply *reg;
  dh_register(s, CLIENT_A, &mlp, "rc", 3, true, NULL, &reg);
  ck_assert(reg->register_->has_values);
  ck_assert_uint_eq(reg->register_->applied_steps, n);
  pe__reply__free_unpacked(reg, NULL);
  Pe__Reply *rep = dh_call_raw(s, r.buf, r.len);
  ck_assert(rep != NULL);
  char want[64];
  snprintf(want, sizeof want, "(%u step(s) of it", n);
  dh_err(rep, PE_EALREADY, want);
  pe__reply__free_unpacked(rep, NULL);
  free(r.buf);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_batch_free(&b);
  pe_model_spec_release(&mlp);
  dh_cleanup(&d);
}
END_TEST

/* Another client's run on another model goes through. */
static void other_client_runs(int s, const pe_model_spec *mlp, dh_batch *b) {
  uint64_t h = dh_setup_model(s, CLIENT_C, mlp, "other", 5, false, NULL);
  float loss = dh_run_loss(s, CLIENT_C, h, b, mlp->loss, 3);
  ck_assert_msg(loss > 0 && loss < 100, "loss %g", loss);
}

/* A daemon running a long run of model "rc" (persistent or not) for
 * CLIENT_A; cancel_fx_end checks what any cancel by request must leave. */
typedef struct cancel_fx {
  dh_daemon d;
  int s;
  pe_model_spec mlp;
  dh_batch b;
  runner r;
  uint64_t h;
} cancel_fx;

static void cancel_fx_start(cancel_fx *f, bool persistent) {
  memset(f, 0, sizeof *f);
  dh_start(&f->d, NULL);
  f->s = dh_connect(&f->d, 30000);
  f->mlp = dh_mlp();
  f->h = dh_setup_model(f->s, CLIENT_A, &f->mlp, "rc", 3, persistent, NULL);
  dh_batch_make(&f->b, 16, 3);
  runner_start(&f->r, &f->d, f->h, &f->b, f->mlp.loss);
  wait_running(f->s);
}

/* Send rq (a cancelling request) and expect it answered OK, then the run's
 * reply within 5 s: IO_ERROR naming `why`; the daemon stays up, no run is
 * left in flight and another client's run goes through. */
static void cancel_fx_end(cancel_fx *f, Pe__Request *rq, const char *why) {
  Pe__Reply *rep = dh_call(f->s, rq);
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  runner_wait(&f->r, 5);
  cancelled_steps(f->r.rep, PE_EIO, why);
  pe__reply__free_unpacked(f->r.rep, NULL);
  free(f->r.buf);
  ck_assert(dh_alive(&f->d));
  ck_assert_int_eq(runs_in_flight(f->s), 0);
  other_client_runs(f->s, &f->mlp, &f->b);
  nn_close(f->s);
  ck_assert_int_eq(dh_stop(&f->d, SIGTERM), 0);
  dh_batch_free(&f->b);
  pe_model_spec_release(&f->mlp);
  dh_cleanup(&f->d);
}

START_TEST(force_deregister_cancels) {
  cancel_fx f;
  cancel_fx_start(&f, false);
  Pe__Request rq = dh_req(CLIENT_B);
  Pe__DeregisterRequest dr = PE__DEREGISTER_REQUEST__INIT;
  dr.handle = f.h;
  dr.force = true;
  rq.body_case = PE__REQUEST__BODY_DEREGISTER;
  rq.deregister = &dr;
  char why[64];
  snprintf(why, sizeof why, "program 0x%016llx was deregistered", (unsigned long long)f.h);
  cancel_fx_end(&f, &rq, why);
}
END_TEST

START_TEST(drop_model_cancels) {
  cancel_fx f;
  cancel_fx_start(&f, true);
  Pe__Request rq = dh_req(CLIENT_A);
  Pe__DropModelRequest dr = PE__DROP_MODEL_REQUEST__INIT;
  dr.model = (char *)"rc";
  rq.body_case = PE__REQUEST__BODY_DROP_MODEL;
  rq.drop_model = &dr;
  cancel_fx_end(&f, &rq, "model 'rc' is being dropped");
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("run_cancel");
  TCase *tc = tcase_create("e2e");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, sigterm_cancels_and_checkpoints);
  tcase_add_test(tc, force_deregister_cancels);
  tcase_add_test(tc, drop_model_cancels);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
