/* pe-executord end to end: Status does not wait for a model's step in
 * flight (review 3 #3: with long runs in flight the daemon looked dead to
 * status). */
#include "async_call.h"
#include "check_main.h"
#include "daemon_harness.h"

#define CLIENT_A 0x1a01 /* long run */
#define CLIENT_C 0x1a03 /* status, ping, close, deregister --force */
#define STEPS 1000000u
/* What "answered at once" means here: milliseconds on an idle machine;
 * the bound leaves room for a loaded test host. The runs would take
 * minutes, and before the lanes nothing was answered until one ended. */
#define PROMPT_S 3.0
#define SETTLE_S 10.0 /* for a cancel, or a lane to reach a state */

/* Send rq on s (receive timeout PROMPT_S) and return the reply; fails the
 * test naming `what` when none came within PROMPT_S. */
static Pe__Reply *prompt_call(int s, const Pe__Request *rq, const char *what) {
  size_t len = pe__request__get_packed_size(rq);
  uint8_t *buf = malloc(len ? len : 1);
  pe__request__pack(rq, buf);
  double t0 = dh_now();
  Pe__Reply *rep = dh_call_raw(s, buf, len);
  double took = dh_now() - t0;
  free(buf);
  ck_assert_msg(rep != NULL && took < PROMPT_S + 0.2,
                "%s not answered within %.1f s while long runs hold the request threads", what,
                PROMPT_S);
  dh_ok(rep);
  return rep;
}

static Pe__Reply *status(int s) {
  Pe__Request rq = dh_req(CLIENT_C);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  return prompt_call(s, &rq, "status");
}

static void start_run(dh_async *a, const dh_daemon *d, uint64_t client, uint64_t h, dh_batch *b,
                      const char *loss) {
  Pe__RunRequest run;
  char *f[] = {(char *)loss};
  Pe__Request rq = dh_run_req(client, &run, h, b->feeds, 2, f, 1, STEPS);
  dh_async_start(a, d, &rq);
}

/* CLIENT_C force-deregisters h (answered promptly); the run of h (a) is
 * then answered within SETTLE_S, cancelled. */
static void cancel_run(int s, uint64_t h, dh_async *a) {
  Pe__Request rq = dh_req(CLIENT_C);
  Pe__DeregisterRequest dr = PE__DEREGISTER_REQUEST__INIT;
  dr.handle = h;
  dr.force = true;
  rq.body_case = PE__REQUEST__BODY_DEREGISTER;
  rq.deregister = &dr;
  pe__reply__free_unpacked(prompt_call(s, &rq, "deregister --force"), NULL);
  ck_assert_msg(dh_async_wait(a, SETTLE_S), "the run of 0x%016llx not cancelled within %.0f s",
                (unsigned long long)h, SETTLE_S);
  ck_assert_ptr_nonnull(a->rep);
  dh_err(a->rep, PE_EIO, "was deregistered");
  pe__reply__free_unpacked(a->rep, NULL);
  free(a->buf);
}

/* The mlp with a first layer of 1024: a step on 8192 rows is ~46 GFLOP,
 * a tenth of a second or more: long enough to see who waits for it. */
static pe_model_spec slow_mlp(void) {
  return dh_model_text("slow",
                       "input image 784\n"
                       "label label\n"
                       "fc 1024 act=relu\n"
                       "fc 128 act=relu\n"
                       "fc 10\n"
                       "loss softmax_with_cross_entropy\n"
                       "accuracy top=1\n"
                       "optimizer sgd lr=0.01\n");
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Status' parameter bytes were read from the values, an engine op that
 * waited for each model's step in flight (and, with the pool's worker kept
 * busy by other runs, for seconds), holding the registry lock, so every
 * request waited with it. They come from the models' declared shapes now.
 * With a run of steps of time T in flight, the median of 9 Status round
 * trips must be under T/8; before, each waited for the rest of a step
 * (uniform in [0, T]: the median is over T/8 but with odds of 0.2%). */
START_TEST(status_does_not_wait_for_steps) {
  dh_daemon d = {0};
  dh_start(&d, "[server]\nrequest_threads = 2\n");
  int s = dh_connect(&d, 30000);
  pe_model_spec slow = slow_mlp();
  uint64_t h = dh_setup_model(s, CLIENT_A, &slow, "slow", 3, false, NULL);
  nn_close(s);
  s = dh_connect(&d, (int)(SETTLE_S * 1000));
  dh_batch b;
  dh_batch_make(&b, 8192, 3);
  dh_async run;
  start_run(&run, &d, CLIENT_A, h, &b, slow.loss);
  /* The step time, from Status' age and steps done of the run. */
  double step_s = 0, t0 = dh_now();
  while (step_s == 0) {
    ck_assert_msg(dh_now() - t0 < 30, "the run did not do 2 steps in 30 s");
    Pe__Reply *rep = status(s);
    const Pe__StatusReply *st = rep->status;
    if (st->n_runs == 1 && st->runs[0]->steps_done >= 2)
      step_s = st->runs[0]->age_s / st->runs[0]->steps_done;
    pe__reply__free_unpacked(rep, NULL);
    dh_sleep_ms(20);
  }
  double took[9];
  for (int i = 0; i < 9; i++) {
    double t = dh_now();
    pe__reply__free_unpacked(status(s), NULL);
    took[i] = dh_now() - t;
    dh_sleep_ms(7 + 13 * i % 29); /* to land anywhere in a step */
  }
  qsort(took, 9, sizeof took[0], cmp_double);
  ck_assert_msg(took[4] < step_s / 8,
                "Status took %.0f ms (median of 9; %.0f to %.0f) with steps of %.0f ms in flight",
                took[4] * 1e3, took[0] * 1e3, took[8] * 1e3, step_s * 1e3);
  cancel_run(s, h, &run);
  nn_close(s);
  ck_assert_int_eq(dh_stop(&d, SIGTERM), 0);
  dh_batch_free(&b);
  pe_model_spec_release(&slow);
  dh_cleanup(&d);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("request_lanes");
  TCase *tc = tcase_create("e2e");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, status_does_not_wait_for_steps);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
