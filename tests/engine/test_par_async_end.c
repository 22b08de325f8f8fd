/* Run end on asynchronous places (sim:2, the code path of cuda): a run
 * waits for its feed copies and its fetched values, not for the rest of its
 * device work, which the next run (or pe_par_exec_sync, or free) waits for.
 *
 * A gate (a function queued on one of place 0's or 1's streams that blocks
 * until the test opens it) holds back everything queued behind it, so each
 * test knows exactly what cannot have run yet when the run returned: the
 * returned run left that work in flight, and nothing it reported came from
 * behind the gate. */
#include <check.h>
#include <errno.h>
#include <time.h>

#include "check_main.h"
#include "par_test_util.h"

/* --- the gate ------------------------------------------------------------------ */

typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool open;
} gate;

static pe_status *gate_fn(void *arg) {
  gate *g = arg;
  pthread_mutex_lock(&g->mu);
  while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
  return NULL;
}

static void gate_close_on(gate *g, pe_model *m, int place, pe_stream_kind k) {
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->open = false;
  PE_CK_OK(pe_stream_launch(pe_device_stream(m->dev[place], k), gate_fn, g));
}

static void gate_open(gate *g) {
  pthread_mutex_lock(&g->mu);
  g->open = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static void *gate_open_later(void *arg) {
  struct timespec ts = {0, 200 * 1000 * 1000};
  nanosleep(&ts, NULL);
  gate_open(arg);
  return NULL;
}

/* --- a run on its own thread, waited for with a time limit --------------------- */

typedef struct runner {
  par *q;
  int step, n, bad_row;
  bool fetch;
  float loss;
  pe_status *st;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  pthread_t th;
} runner;

static void *runner_main(void *arg) {
  runner *r = arg;
  float x[MAXB * DIM];
  int64_t y[MAXB];
  make_batch(r->step, r->n, x, y);
  if (r->bad_row >= 0) y[r->bad_row] = 99;
  pe_tensor xt, yt, out;
  pe_tensor_init(&xt);
  pe_tensor_init(&yt);
  pe_tensor_init(&out);
  pe_shape xs = PE_SHAPE(r->n, DIM), ys = PE_SHAPE(r->n, 1);
  pe_tensor_view(&xt, PE_F32, &xs, x);
  pe_tensor_view(&yt, PE_I64, &ys, y);
  pe_feed feeds[2] = {{"x", &xt}, {"y", &yt}};
  r->st = pe_par_exec_run(r->q->step, feeds, 2, &LOSS, r->fetch ? 1 : 0, &out, NULL, NULL);
  if (!r->st && r->fetch) r->loss = pe_f32(&out)[0];
  pe_tensor_release(&out);
  pthread_mutex_lock(&r->mu);
  r->done = true;
  pthread_cond_signal(&r->cv);
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

/* Start step `step` (n rows; label of bad_row out of range when >= 0) and
 * wait at most 20 s for pe_par_exec_run to return. Returns whether it did:
 * false means it waited for work held behind a gate. */
static bool run_returns(runner *r, par *q, int step, int n, bool fetch, int bad_row) {
  *r = (runner){.q = q, .step = step, .n = n, .bad_row = bad_row, .fetch = fetch};
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  ck_assert_int_eq(pthread_create(&r->th, NULL, runner_main, r), 0);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 20;
  pthread_mutex_lock(&r->mu);
  int rc = 0;
  while (!r->done && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&r->cv, &r->mu, &until);
  bool done = r->done;
  pthread_mutex_unlock(&r->mu);
  return done;
}

static void runner_join(runner *r) {
  pthread_join(r->th, NULL);
  pthread_cond_destroy(&r->cv);
  pthread_mutex_destroy(&r->mu);
}

/* A copy of place p's replica of `name` (white box: no sync, no engine). */
static void replica(par *q, const char *name, int p, pe_tensor *out) {
  for (int i = 0; i < q->m->n_ent; i++)
    if (!strcmp(q->m->ent[i]->name, name)) {
      PE_CK_OK(pe_tensor_copy(out, &q->m->ent[i]->v[p]->t, name));
      return;
    }
  ck_abort_msg("no persistable '%s'", name);
}

static bool same_bytes(const pe_tensor *a, const pe_tensor *b) {
  return pe_tensor_bytes(a) == pe_tensor_bytes(b) &&
         memcmp(a->data, b->data, pe_tensor_bytes(a)) == 0;
}

/* A runtime, the sequential reference and a sim:2 model from the same
 * parameters. */
typedef struct fixture {
  pe_runtime *rt;
  seqref s;
  par q;
} fixture;

static void fixture_open(fixture *f) {
  f->rt = rt_new(2);
  seq_new(&f->s, 5);
  par_new(&f->q, f->rt, PE_PLACE_SIM, 2, PE_STRATEGY_ALLREDUCE, false, 5);
  copy_params(&f->s, &f->q);
}

static void fixture_close(fixture *f) {
  par_free(&f->q);
  seq_free(&f->s);
  pe_runtime_free(f->rt);
}

/* --- tests ---------------------------------------------------------------------- */

/* The loss is fetched while place 0's comm stream is held: the run returns
 * with the right loss before the gradient all-reduce and the updates ran
 * (the replicas are unchanged), and once the gate opens the update equals
 * the sequential one. */
START_TEST(fetch_returns_before_the_update) {
  fixture f;
  fixture_open(&f);
  seqref *s = &f.s;
  par *q = &f.q;
  pe_tensor w0, w1, after;
  pe_tensor_init(&w0);
  pe_tensor_init(&w1);
  pe_tensor_init(&after);
  replica(q, "fc_0.w", 1, &w0);
  gate g;
  gate_close_on(&g, q->m, 0, PE_STREAM_COMM);
  runner r;
  bool returned = run_returns(&r, q, 0, 10, true, -1);
  if (returned) replica(q, "fc_0.w", 1, &w1); /* before the gate opens */
  gate_open(&g);
  runner_join(&r);
  ck_assert_msg(returned, "a run fetching the loss waited for the all-reduce held on comm");
  PE_CK_OK(r.st);
  float ref = seq_step(s, 0, 10);
  ck_assert_msg(fabsf(r.loss - ref) <= RTOL * fabsf(ref), "loss %.9g, reference %.9g", r.loss, ref);
  ck_assert_msg(same_bytes(&w0, &w1), "place 1's fc_0.w changed before its all-reduce ran");
  /* pe_model_get waits for the newest write itself. */
  PE_CK_OK(pe_model_get_place(q->m, "fc_0.w", 1, &after));
  ck_assert_msg(!same_bytes(&w0, &after), "fc_0.w was not updated");
  ck_assert_double_le(param_diff(s, q), RTOL);
  assert_places_identical(q);
  /* The next runs go on as usual. */
  for (int step = 1; step < 3; step++) {
    float a = seq_step(s, step, 10), c = par_step(q, step, 10, NULL);
    ck_assert_msg(fabsf(a - c) <= RTOL * fabsf(a), "step %d: %.9g vs %.9g", step, a, c);
  }
  ck_assert_double_le(param_diff(s, q), RTOL);
  pe_tensor_release(&w0);
  pe_tensor_release(&w1);
  pe_tensor_release(&after);
  fixture_close(&f);
}
END_TEST

/* Nothing fetched, place 0's compute stream held: the run returns at once.
 * A model read started before the gate opens (it opens 200 ms later on
 * another thread) waits for the write fence and sees the updated value. */
START_TEST(no_fetch_returns_and_reads_wait_for_the_write) {
  fixture f;
  fixture_open(&f);
  seqref *s = &f.s;
  par *q = &f.q;
  pe_tensor w0, got;
  pe_tensor_init(&w0);
  pe_tensor_init(&got);
  replica(q, "fc_1.w", 0, &w0);
  gate g;
  gate_close_on(&g, q->m, 0, PE_STREAM_COMPUTE);
  runner r;
  bool returned = run_returns(&r, q, 0, 10, false, -1);
  pthread_t opener;
  ck_assert_int_eq(pthread_create(&opener, NULL, gate_open_later, &g), 0);
  PE_CK_OK(pe_model_get_place(q->m, "fc_1.w", 0, &got));
  pthread_join(opener, NULL);
  if (!returned) gate_open(&g);
  runner_join(&r);
  ck_assert_msg(returned, "a run without fetches waited for its device work");
  PE_CK_OK(r.st);
  seq_step(s, 0, 10);
  ck_assert_msg(!same_bytes(&w0, &got), "model get read fc_1.w before its update ran");
  ck_assert_double_le(param_diff(s, q), RTOL);
  PE_CK_OK(pe_par_exec_sync(q->step));
  PE_CK_OK(pe_par_exec_sync(q->step)); /* nothing in flight: at once */
  assert_places_identical(q);
  pe_tensor_release(&w0);
  pe_tensor_release(&got);
  fixture_close(&f);
}
END_TEST

/* A kernel fails behind the gate, after its run returned: the next call
 * reports it (naming the op and that the earlier run's work failed) and
 * starts nothing; the one after works. Once through the next run, once
 * through pe_par_exec_sync. */
static void tail_error(bool via_sync) {
  fixture f;
  fixture_open(&f);
  seqref *s = &f.s;
  par *q = &f.q;
  gate g;
  gate_close_on(&g, q->m, 1, PE_STREAM_COMPUTE);
  runner r;
  bool returned = run_returns(&r, q, 0, 8, false, 6); /* row 6: place 1 */
  gate_open(&g);
  runner_join(&r);
  ck_assert_msg(returned, "a run without fetches waited for its device work");
  PE_CK_OK(r.st); /* the failure had not happened yet */
  pe_status *st = NULL;
  if (via_sync) {
    st = pe_par_exec_sync(q->step);
  } else { /* the next run, a good batch with the loss fetched */
    ck_assert(run_returns(&r, q, 1, 8, true, -1));
    runner_join(&r);
    st = r.st;
  }
  ck_assert_msg(st != NULL, "the failure of the earlier run's device work was not reported");
  const char *msg = pe_status_msg(st);
  fprintf(stderr, "tail error (%s): %s\n", via_sync ? "sync" : "next run", msg);
  ck_assert_msg(strstr(msg, "previous run") && strstr(msg, "softmax_with_cross_entropy") &&
                    strstr(msg, "sim:1") && strstr(msg, "99"),
                "message does not name the earlier run, the op, the place and the label: %s", msg);
  pe_status_free(st);
  PE_CK_OK(pe_par_exec_sync(q->step)); /* reported once */
  /* Usable: from the same parameters, a few steps equal the reference. */
  copy_params(s, q);
  for (int step = 0; step < 3; step++) {
    float a = seq_step(s, step, 10), c = par_step(q, step, 10, NULL);
    ck_assert_msg(fabsf(a - c) <= RTOL * fabsf(a), "after the error, step %d: %.9g vs %.9g", step,
                  a, c);
  }
  ck_assert_double_le(param_diff(s, q), RTOL);
  fixture_close(&f);
}

START_TEST(tail_error_reported_by_the_next_run) {
  tail_error(false);
}
END_TEST

START_TEST(tail_error_reported_by_sync) {
  tail_error(true);
}
END_TEST

/* Freeing an executor whose last run is still in flight waits for it
 * (ASan: nothing the stream work touches is freed under it). */
START_TEST(free_waits_for_the_tail) {
  fixture f;
  fixture_open(&f);
  seqref *s = &f.s;
  par *q = &f.q;
  gate g;
  gate_close_on(&g, q->m, 1, PE_STREAM_COMM);
  runner r;
  bool returned = run_returns(&r, q, 0, 10, false, -1);
  pthread_t opener;
  ck_assert_int_eq(pthread_create(&opener, NULL, gate_open_later, &g), 0);
  runner_join(&r);
  ck_assert_msg(returned, "a run without fetches waited for its device work");
  PE_CK_OK(r.st);
  seq_step(s, 0, 10);
  pe_par_exec_free(q->step); /* while the gate is (most likely) still closed */
  q->step = NULL;
  pthread_join(opener, NULL);
  /* The update ran in full: place 1's replica equals the reference. */
  pe_var *ref = pe_scope_find(s->scope, "fc_0.w");
  ck_assert_ptr_nonnull(ref);
  pe_tensor got;
  pe_tensor_init(&got);
  replica(q, "fc_0.w", 1, &got);
  ck_assert_int_eq(pe_tensor_numel(&got), pe_tensor_numel(&ref->t));
  for (int64_t k = 0; k < pe_tensor_numel(&got); k++) {
    double a = pe_f32(&got)[k], b = pe_f32(&ref->t)[k];
    ck_assert_msg(fabs(a - b) <= RTOL * (fabs(b) > 1e-3 ? fabs(b) : 1e-3),
                  "fc_0.w[%lld]: %.9g vs %.9g", (long long)k, a, b);
  }
  pe_tensor_release(&got);
  fixture_close(&f);
}
END_TEST

static Suite *async_end_suite(void) {
  Suite *s = suite_create("par_async_end");
  TCase *tc = tcase_create("async_end");
  tcase_add_test(tc, fetch_returns_before_the_update);
  tcase_add_test(tc, no_fetch_returns_and_reads_wait_for_the_write);
  tcase_add_test(tc, tail_error_reported_by_the_next_run);
  tcase_add_test(tc, tail_error_reported_by_sync);
  tcase_add_test(tc, free_waits_for_the_tail);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(async_end_suite)
