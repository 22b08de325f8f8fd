/* pe-executord end to end: long runs do not starve other requests (review
 * 3 #3, and the run lane). With request_threads = 2 (so 2 run threads) and
 * two runs of a million steps holding both run threads:
 *  - Status, Ping, another client's Close and a Deregister are answered at
 *    once (PROMPT_S) by the control lane, and Status shows each lane's
 *    threads, busy threads and queue (a third client's run waits in the run
 *    queue);
 *  - another client's save, get_params and register are answered at once
 *    by the work lane; before the run lane, runs held the work threads and
 *    these timed out;
 *  - a client's request never starts before its own earlier ones have
 *    started, in whichever lane: its close, or its save, waits while its
 *    run is queued, though their lanes have threads free, then goes as
 *    soon as the run starts (here once another run is cancelled by a
 *    force-deregister, itself a control request); the close then cancels
 *    the run (it found its program).
 * And Status does not wait for a model's step in flight. */
#include "async_call.h"
#include "check_main.h"
#include "daemon_harness.h"

#define CLIENT_A 0x1a01 /* long run */
#define CLIENT_B 0x1a02 /* long run */
#define CLIENT_C 0x1a03 /* status, ping, close, deregister --force; save, get_params */
#define CLIENT_D 0x1a04 /* a run queued behind A's and B's, then its close or save */
#define STEPS 1000000u
/* What "answered at once" means here: milliseconds on an idle machine;
 * the bound leaves room for a loaded test host. The runs would take
 * minutes, and before the lanes nothing was answered until one ended. */
#define PROMPT_S 3.0
#define SETTLE_S 10.0 /* for a cancel, or a lane to reach a state */

/* The work requests' bound: a save writes a file, and a save or get_params
 * waits for an op on the compute pool, which the runs keep busy: 5 to 60 ms
 * on an idle machine. Before the run lane they waited for a run to end. */
#define WORK_PROMPT_S 10.0

/* Send rq on s (receive timeout `limit` s) and return the reply; fails the
 * test naming `what` when none came within limit. */
static Pe__Reply *call_within(int s, const Pe__Request *rq, const char *what, double limit) {
  size_t len = pe__request__get_packed_size(rq);
  uint8_t *buf = malloc(len ? len : 1);
  pe__request__pack(rq, buf);
  double t0 = dh_now();
  Pe__Reply *rep = dh_call_raw(s, buf, len);
  double took = dh_now() - t0;
  free(buf);
  ck_assert_msg(rep != NULL && took < limit + 0.2,
                "%s not answered within %.1f s while long runs hold the request threads", what,
                limit);
  dh_ok(rep);
  return rep;
}

/* call_within PROMPT_S (s's receive timeout). */
static Pe__Reply *prompt_call(int s, const Pe__Request *rq, const char *what) {
  return call_within(s, rq, what, PROMPT_S);
}

static Pe__Reply *status(int s) {
  Pe__Request rq = dh_req(CLIENT_C);
  rq.body_case = PE__REQUEST__BODY_STATUS;
  rq.status = 1;
  return prompt_call(s, &rq, "status");
}

/* The lane `name` of a Status reply. */
static const Pe__LaneStatus *lane(const Pe__StatusReply *st, const char *name) {
  for (size_t i = 0; i < st->n_lanes; i++)
    if (!strcmp(st->lanes[i]->name, name)) return st->lanes[i];
  ck_abort_msg("Status has no lane '%s'", name);
  return NULL;
}

/* Whether Status lists a run of program h (another client's: its id is
 * not shown, only its tag). */
static bool runs_for(const Pe__StatusReply *st, uint64_t h) {
  for (size_t i = 0; i < st->n_runs; i++)
    if (st->runs[i]->handle == h) return true;
  return false;
}

/* Poll Status (each answered promptly) until lane `name` has `busy` busy
 * threads and `queued` requests waiting, and program h (0: none) has a run
 * in flight, within SETTLE_S. */
static void wait_lane(int s, const char *name, int busy, int queued, uint64_t h) {
  double t0 = dh_now();
  for (;;) {
    Pe__Reply *rep = status(s);
    const Pe__LaneStatus *w = lane(rep->status, name);
    bool there = w->busy == busy && w->queued == queued && (!h || runs_for(rep->status, h));
    int b = w->busy, q = w->queued;
    pe__reply__free_unpacked(rep, NULL);
    if (there) return;
    ck_assert_msg(dh_now() - t0 < SETTLE_S, "%s lane: %d busy, %d queued; want %d, %d", name, b, q,
                  busy, queued);
    dh_sleep_ms(20);
  }
}

/* pe-client status (text and --json) shows the run lane's two threads
 * busy. */
static void cli_shows_lanes(const dh_daemon *d) {
  static const char *const want[] = {
      "request work lane: 2 thread(s), 0 busy, 0 queued; control lane: 2 thread(s), 0 busy, "
      "0 queued; run lane: 2 thread(s), 2 busy, 0 queued\n",
      "\"lanes\":[{\"name\":\"work\",\"threads\":2,\"busy\":0,\"queued\":0},{\"name\":"
      "\"control\",\"threads\":2,\"busy\":0,\"queued\":0},{\"name\":\"run\",\"threads\":2,"
      "\"busy\":2,\"queued\":0}]"};
  for (int json = 0; json < 2; json++) {
    char args[64];
    snprintf(args, sizeof args, "--timeout %d %sstatus", (int)(PROMPT_S * 1000),
             json ? "--json " : "");
    static char out[1 << 16];
    dh_cli(d, args, out, sizeof out);
    ck_assert_msg(strstr(out, want[json]), "'%s' not in: %s", want[json], out);
  }
}

static void start_run(dh_async *a, const dh_daemon *d, uint64_t client, uint64_t h, dh_batch *b,
                      const char *loss) {
  Pe__RunRequest run;
  char *f[] = {(char *)loss};
  Pe__Request rq = dh_run_req(client, &run, h, b->feeds, 2, f, 1, STEPS);
  dh_async_start(a, d, &rq);
}

static void close_req(Pe__Request *rq, uint64_t client) {
  *rq = dh_req(client);
  rq->body_case = PE__REQUEST__BODY_CLOSE;
  rq->close = 1;
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

/* A daemon with request_threads = 2 (2 run threads too), clients A, B and
 * D each with an mlp registered and initialised, C with one registered and
 * initialised ("lc"), and A's and B's runs of STEPS steps holding both run
 * threads. s answers within PROMPT_S. */
typedef struct lanes_fx {
  dh_daemon d;
  int s;
  pe_model_spec mlp;
  uint64_t ha, hb, hd;
  dh_batch b;
  dh_async ra, rb, rd;
} lanes_fx;

static void fx_start(lanes_fx *f) {
  memset(f, 0, sizeof *f);
  dh_start(&f->d, "[server]\nrequest_threads = 2\n");
  int s = dh_connect(&f->d, 30000);
  f->mlp = dh_mlp();
  f->ha = dh_setup_model(s, CLIENT_A, &f->mlp, "la", 3, false, NULL);
  f->hb = dh_setup_model(s, CLIENT_B, &f->mlp, "lb", 4, false, NULL);
  f->hd = dh_setup_model(s, CLIENT_D, &f->mlp, "ld", 5, false, NULL);
  dh_setup_model(s, CLIENT_C, &f->mlp, "lc", 6, false, NULL);
  nn_close(s);
  f->s = dh_connect(&f->d, (int)(PROMPT_S * 1000));
  dh_batch_make(&f->b, 16, 3);
  start_run(&f->ra, &f->d, CLIENT_A, f->ha, &f->b, f->mlp.loss);
  start_run(&f->rb, &f->d, CLIENT_B, f->hb, &f->b, f->mlp.loss);
  /* Both runs going (Status' runs, whichever lanes they are in). */
  double t0 = dh_now();
  for (;;) {
    Pe__Reply *rep = status(f->s);
    bool both = runs_for(rep->status, f->ha) && runs_for(rep->status, f->hb);
    pe__reply__free_unpacked(rep, NULL);
    if (both) break;
    ck_assert_msg(dh_now() - t0 < SETTLE_S, "the two runs not in flight within %.0f s", SETTLE_S);
    dh_sleep_ms(20);
  }
}

static void fx_end(lanes_fx *f) {
  wait_lane(f->s, "run", 0, 0, 0);
  wait_lane(f->s, "work", 0, 0, 0);
  nn_close(f->s);
  ck_assert_int_eq(dh_stop(&f->d, SIGTERM), 0);
  dh_batch_free(&f->b);
  pe_model_spec_release(&f->mlp);
  dh_cleanup(&f->d);
}

/* D's run waits in the run queue; rq of client D, sent after it (on *x),
 * waits in lane `name` though that lane has a thread free: it must not
 * start before D's run. */
static void queue_behind_run(lanes_fx *f, const Pe__Request *rq, const char *name, dh_async *x) {
  start_run(&f->rd, &f->d, CLIENT_D, f->hd, &f->b, f->mlp.loss);
  wait_lane(f->s, "run", 2, 1, 0);
  dh_async_start(x, &f->d, rq);
  wait_lane(f->s, name, 0, 1, 0);
  dh_sleep_ms(300);
  ck_assert_msg(!atomic_load(&x->done), "client D's %s overtook its queued run", name);
}

/* Cancel A's run: D's run takes its thread, and D's request on x, free to
 * start now, is answered (B's run still going); its reply. */
static Pe__Reply *start_behind_run(lanes_fx *f, dh_async *x, const char *what) {
  cancel_run(f->s, f->ha, &f->ra);
  ck_assert_msg(dh_async_wait(x, SETTLE_S),
                "client D's %s not answered once its run started (another run still going)", what);
  ck_assert_ptr_nonnull(x->rep);
  free(x->buf);
  ck_assert(!atomic_load(&f->rb.done));
  return x->rep;
}

START_TEST(control_requests_pass_long_runs) {
  lanes_fx f;
  fx_start(&f);
  int s = f.s;

  /* Both run threads run; the control lane answers. */
  ck_assert_msg(dh_ping(s), "ping not answered within %.1f s", PROMPT_S);
  Pe__Reply *rep = status(s);
  const Pe__StatusReply *st = rep->status;
  ck_assert_int_eq(st->runs_in_flight, 2);
  ck_assert_int_eq((int)st->n_lanes, 3);
  static const char *const names[] = {"work", "control", "run"};
  static const int busy[] = {0, 0 /* this Status not counted */, 2};
  for (int i = 0; i < 3; i++) {
    ck_assert_str_eq(st->lanes[i]->name, names[i]);
    ck_assert_int_eq(st->lanes[i]->threads, 2);
    ck_assert_int_eq(st->lanes[i]->busy, busy[i]);
    ck_assert_int_eq(st->lanes[i]->queued, 0);
  }
  ck_assert_int_eq(st->programs, 4);
  pe__reply__free_unpacked(rep, NULL);
  cli_shows_lanes(&f.d);

  /* A third client's run waits in the run queue; its close, sent after
   * it, waits (never ends the session before the run starts). */
  Pe__Request rq;
  dh_async cd;
  close_req(&rq, CLIENT_D);
  queue_behind_run(&f, &rq, "control", &cd);

  /* Another client's close: answered at once, its program given up. */
  close_req(&rq, CLIENT_C);
  pe__reply__free_unpacked(prompt_call(s, &rq, "close"), NULL);
  rep = status(s);
  ck_assert_int_eq(rep->status->programs, 3);
  pe__reply__free_unpacked(rep, NULL);
  ck_assert(!atomic_load(&cd.done));

  /* A's run cancelled: D's run starts, then D's close, which cancels it
   * (a close before the run would have left it no program to run). */
  rep = start_behind_run(&f, &cd, "close");
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  ck_assert_msg(dh_async_wait(&f.rd, SETTLE_S), "client D's run not cancelled by its close");
  ck_assert_ptr_nonnull(f.rd.rep);
  dh_err(f.rd.rep, PE_EIO, "was deregistered");
  pe__reply__free_unpacked(f.rd.rep, NULL);
  free(f.rd.buf);
  cancel_run(s, f.hb, &f.rb);
  fx_end(&f);
}
END_TEST

/* Client C's save, get_params and register of a new program: each answered
 * within WORK_PROMPT_S while the runs hold every run thread. */
static void work_requests_answered(const dh_daemon *d, const pe_model_spec *spec) {
  int s = dh_connect(d, (int)(WORK_PROMPT_S * 1000));
  Pe__CheckpointRequest cr;
  Pe__Request rq = dh_checkpoint_req(CLIENT_C, &cr, true, "lc", "while_others_train");
  pe__reply__free_unpacked(call_within(s, &rq, "another client's save", WORK_PROMPT_S), NULL);

  Pe__ParamsRequest pr;
  rq = dh_get_all_req(CLIENT_C, &pr, "lc");
  Pe__Reply *rep = call_within(s, &rq, "another client's get_params", WORK_PROMPT_S);
  ck_assert_int_eq(rep->body_case, PE__REPLY__BODY_PARAMS);
  ck_assert_int_gt((int)rep->params->n_values, 0);
  pe__reply__free_unpacked(rep, NULL);

  rq = dh_req(CLIENT_C);
  Pe__RegisterRequest reg = PE__REGISTER_REQUEST__INIT;
  Pe__RegisterOptions opts = PE__REGISTER_OPTIONS__INIT;
  opts.seed = 7;
  reg.program.data = spec->bytes;
  reg.program.len = spec->len;
  reg.model = (char *)"lc2";
  reg.options = &opts;
  rq.body_case = PE__REQUEST__BODY_REGISTER;
  rq.register_ = &reg;
  rep = call_within(s, &rq, "another client's register", WORK_PROMPT_S);
  ck_assert_int_eq(rep->body_case, PE__REPLY__BODY_REGISTER);
  pe__reply__free_unpacked(rep, NULL);
  nn_close(s);
}

START_TEST(work_requests_pass_long_runs) {
  lanes_fx f;
  fx_start(&f);
  work_requests_answered(&f.d, &f.mlp);

  /* D's save, sent after its run that waits in the run queue, waits for
   * the run to start; then it goes, while the run does its steps. */
  Pe__CheckpointRequest cr;
  Pe__Request rq = dh_checkpoint_req(CLIENT_D, &cr, true, "ld", "behind_its_run");
  dh_async sd;
  queue_behind_run(&f, &rq, "work", &sd);
  Pe__Reply *rep = start_behind_run(&f, &sd, "save");
  dh_ok(rep);
  pe__reply__free_unpacked(rep, NULL);
  ck_assert(!atomic_load(&f.rd.done));
  cancel_run(f.s, f.hd, &f.rd);
  cancel_run(f.s, f.hb, &f.rb);
  fx_end(&f);
}
END_TEST

/* A small model with batch norm: an eval program of it has the test-mode
 * batch_norm, which lists the running statistics among its outputs though
 * it leaves them as they are. */
static pe_model_spec bn_model(void) {
  return dh_model_text("bn",
                       "input image 784\n"
                       "label label\n"
                       "fc 32\n"
                       "batch_norm act=relu\n"
                       "fc 10\n"
                       "loss softmax_with_cross_entropy\n"
                       "accuracy top=1\n"
                       "optimizer sgd lr=0.01\n");
}

/* Client C's eval (a model registered for_test on its trained model: a
 * program that changes no persistable) of a few steps is answered within
 * WORK_PROMPT_S while A's and B's runs hold both run threads: a work
 * thread takes it, rather than the run queue behind D's run, where it
 * would wait minutes for a run thread. D's training run still waits for a run
 * thread (run_threads bounds those), passed by the eval. _i 0: the mlp
 * ("lc"); 1: a model with batch norm ("lcbn", registered and initialised
 * here), which is an eval only because the test-mode batch_norm's
 * running statistics count as unchanged (pe_op_output_unchanged). */
START_TEST(eval_runs_pass_long_runs) {
  lanes_fx f;
  fx_start(&f);
  pe_model_spec bn = bn_model(), *spec = _i ? &bn : &f.mlp;
  const char *model = _i ? "lcbn" : "lc";
  if (_i) {
    int s0 = dh_connect(&f.d, 30000); /* register and init: the work lane */
    dh_setup_model(s0, CLIENT_C, spec, model, 7, false, NULL);
    nn_close(s0);
  }
  dh_for_test = true;
  uint64_t he = dh_register(f.s, CLIENT_C, spec, model, 6, false, NULL, NULL);
  dh_for_test = false;
  start_run(&f.rd, &f.d, CLIENT_D, f.hd, &f.b, f.mlp.loss);
  wait_lane(f.s, "run", 2, 1, 0);

  int s = dh_connect(&f.d, (int)(WORK_PROMPT_S * 1000));
  Pe__RunRequest run;
  char *fetch[] = {spec->accuracy};
  Pe__Request rq = dh_run_req(CLIENT_C, &run, he, f.b.feeds, 2, fetch, 1, 5);
  double t0 = dh_now();
  Pe__Reply *rep = call_within(s, &rq, "another client's eval run", WORK_PROMPT_S);
  printf("eval (%s) of 5 steps beside two long runs: answered in %.1f ms\n", spec->name,
         (dh_now() - t0) * 1e3);
  ck_assert_int_eq(rep->body_case, PE__REPLY__BODY_RUN);
  ck_assert_uint_eq(rep->run->steps, 5);
  ck_assert_uint_eq(rep->run->n_fetched, 1);
  pe__reply__free_unpacked(rep, NULL);
  nn_close(s);

  /* The training run still waits for a run thread; it gets A's. */
  dh_sleep_ms(300);
  wait_lane(f.s, "run", 2, 1, 0);
  ck_assert_msg(!atomic_load(&f.rd.done), "client D's training run did not wait for a run thread");
  cancel_run(f.s, f.ha, &f.ra);
  wait_lane(f.s, "run", 2, 0, f.hd);
  cancel_run(f.s, f.hd, &f.rd);
  cancel_run(f.s, f.hb, &f.rb);
  pe_model_spec_release(&bn);
  fx_end(&f);
}
END_TEST

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
  dh_start(&d, "[server]\nrequest_threads = 2\nrun_threads = 3\n");
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
    ck_assert_int_eq(lane(st, "run")->threads, 3); /* run_threads, not request_threads */
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
  tcase_add_test(tc, control_requests_pass_long_runs);
  tcase_add_test(tc, work_requests_pass_long_runs);
  tcase_add_loop_test(tc, eval_runs_pass_long_runs, 0, 2);
  tcase_add_test(tc, status_does_not_wait_for_steps);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
