/* The daemon-wide budget of the runs' temporaries (server/run/budget.h):
 * a reservation that fits goes ahead; one that does not waits, first come
 * first served (a small one that would fit does not pass a large one
 * waiting before it); a stop callback or the deadline ends a wait, and the
 * waiter leaves the queue; a lowered limit is read while waiting.
 * Resident bytes (models, kept temporaries) share the total with the runs:
 * a hold is refused when it does not fit beside both, and a run waits
 * until it fits beside them. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "check_main.h"
#include "core/clock.h"
#include "server/run/budget.h"
#include "test_assert.h"

#define WAIT_S 5.0   /* for what must happen (a loaded host) */
#define QUIET_MS 200 /* for what must not */

static _Atomic int64_t limit_now = 100;
static _Atomic int64_t total_now; /* 0: no total */
static atomic_bool stop_now;

static int64_t total_cb(void *arg) {
  (void)arg;
  return atomic_load(&total_now);
}

static int64_t limit_cb(void *arg) {
  (void)arg;
  return atomic_load(&limit_now);
}
static pe_status *stop_cb(void *arg) {
  (void)arg;
  return atomic_load(&stop_now) ? pe_error(PE_EIO, "stopped") : NULL;
}
static pe_status *expired_cb(void *arg, int64_t in_use, int64_t limit) {
  (void)arg;
  return pe_error(PE_EDEADLINE, "expired: %lld in use of %lld", (long long)in_use,
                  (long long)limit);
}

typedef struct waiter {
  pe_run_budget *b;
  int64_t bytes;
  double deadline;
  pe_status *st;
  atomic_bool done;
  atomic_int *order; /* the n-th to finish */
  int pos;
  pthread_t th;
} waiter;

static void *wait_main(void *arg) {
  waiter *w = arg;
  pe_budget_wait bw = {limit_cb, stop_cb, expired_cb, w->deadline, NULL, total_cb};
  w->st = pe_run_budget_acquire(w->b, w->bytes, &bw);
  w->pos = atomic_fetch_add(w->order, 1);
  atomic_store(&w->done, true);
  return NULL;
}

static void start(waiter *w, pe_run_budget *b, int64_t bytes, double deadline, atomic_int *order) {
  memset(w, 0, sizeof *w);
  w->b = b;
  w->bytes = bytes;
  w->deadline = deadline;
  w->order = order;
  ck_assert_int_eq(pthread_create(&w->th, NULL, wait_main, w), 0);
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static int waiting(pe_run_budget *b) {
  int n;
  pe_run_budget_get(b, NULL, &n);
  return n;
}

static void until_waiting(pe_run_budget *b, int n) {
  double t0 = pe_now_s();
  while (waiting(b) != n && pe_now_s() - t0 < WAIT_S) sleep_ms(5);
  ck_assert_int_eq(waiting(b), n);
}

static bool finished(waiter *w) {
  double t0 = pe_now_s();
  while (!atomic_load(&w->done) && pe_now_s() - t0 < WAIT_S) sleep_ms(5);
  if (atomic_load(&w->done)) pthread_join(w->th, NULL);
  return atomic_load(&w->done);
}

/* A budget of 100 (limit_now) with `first` bytes reserved at once. */
static void budget_start(pe_run_budget *b, int64_t first) {
  atomic_store(&limit_now, 100);
  atomic_store(&stop_now, false);
  pe_run_budget_init(b);
  pe_budget_wait now = {limit_cb, stop_cb, expired_cb, 0, NULL};
  PE_CK_OK(pe_run_budget_acquire(b, first, &now)); /* fits: at once */
}

START_TEST(first_come_first_served) {
  pe_run_budget b;
  budget_start(&b, 40);
  /* A limit of 75 from here: small fits beside the 40 but not beside big,
   * so who is granted first shows in what is done, not in which thread
   * the scheduler lets count first. */
  atomic_store(&limit_now, 75);
  atomic_int order = 0;
  waiter big, small;
  start(&big, &b, 50, 0, &order);
  until_waiting(&b, 1);
  start(&small, &b, 30, 0, &order); /* would fit, but big came first */
  until_waiting(&b, 2);
  sleep_ms(QUIET_MS);
  ck_assert(!atomic_load(&big.done) && !atomic_load(&small.done));
  int64_t reserved;
  pe_run_budget_get(&b, &reserved, NULL);
  ck_assert_int_eq(reserved, 40);
  pe_run_budget_release(&b, 40);
  ck_assert(finished(&big));
  ck_assert_ptr_null(big.st);
  sleep_ms(QUIET_MS);
  ck_assert_msg(!atomic_load(&small.done), "small was granted beside big: 80 of 75");
  pe_run_budget_get(&b, &reserved, NULL);
  ck_assert_int_eq(reserved, 50);
  pe_run_budget_release(&b, 50);
  ck_assert(finished(&small));
  ck_assert_ptr_null(small.st);
  ck_assert_int_eq(big.pos, 0);
  ck_assert_int_eq(small.pos, 1);
  pe_run_budget_get(&b, &reserved, NULL);
  ck_assert_int_eq(reserved, 30);
  pe_run_budget_release(&b, 30);
  ck_assert_int_eq(waiting(&b), 0);
  pe_run_budget_destroy(&b);
}
END_TEST

/* A deadline or a stop ends a wait; the waiter leaves the queue, so the
 * one behind it goes ahead when it fits. */
START_TEST(deadline_and_stop_end_a_wait) {
  pe_run_budget b;
  budget_start(&b, 80);
  atomic_int order = 0;
  waiter timed, after;
  double t0 = pe_now_s();
  start(&timed, &b, 50, t0 + 0.3, &order);
  /* Queued, or (a thread started late on a loaded host) already expired:
   * either way the 20 bytes below come after it. */
  double t1 = pe_now_s();
  while (waiting(&b) != 1 && !atomic_load(&timed.done) && pe_now_s() - t1 < WAIT_S) sleep_ms(1);
  ck_assert(waiting(&b) == 1 || atomic_load(&timed.done));
  start(&after, &b, 20, 0, &order); /* fits next to the 80, but waits behind */
  ck_assert(finished(&timed));
  ck_assert_msg(pe_now_s() - t0 >= 0.29, "expired after %.3f s", pe_now_s() - t0);
  expect_errors(timed.st, PE_EDEADLINE, "expired: 80 in use of 100", NULL);
  ck_assert(finished(&after)); /* the head left: it fits */
  ck_assert_ptr_null(after.st);
  waiter stopped;
  start(&stopped, &b, 50, 0, &order);
  until_waiting(&b, 1);
  atomic_store(&stop_now, true);
  ck_assert(finished(&stopped));
  expect_errors(stopped.st, PE_EIO, "stopped", NULL);
  ck_assert_int_eq(waiting(&b), 0);
  int64_t reserved;
  pe_run_budget_get(&b, &reserved, NULL);
  ck_assert_int_eq(reserved, 100);
  pe_run_budget_release(&b, 100);
  pe_run_budget_destroy(&b);
}
END_TEST

/* The limit is read again while waiting (SIGHUP): raised, the waiter fits. */
START_TEST(raised_limit_lets_a_waiter_in) {
  pe_run_budget b;
  budget_start(&b, 90);
  atomic_int order = 0;
  waiter w;
  start(&w, &b, 50, 0, &order);
  until_waiting(&b, 1);
  atomic_store(&limit_now, 200);
  ck_assert(finished(&w));
  ck_assert_ptr_null(w.st);
  pe_run_budget_release(&b, 140);
  pe_run_budget_destroy(&b);
}
END_TEST

/* A total of 100: 60 reserved by a run leave 40 for resident bytes; a run
 * waits while the resident bytes leave it no room, and goes when they are
 * given back. */
START_TEST(resident_and_runs_share_the_total) {
  pe_run_budget b;
  budget_start(&b, 60);
  atomic_store(&total_now, 100);
  int64_t model = 0, resident = -1, reserved = -1;
  ck_assert(!pe_run_budget_hold(&b, &model, 50, 100, &resident, &reserved));
  ck_assert_int_eq(model, 0);
  ck_assert_int_eq(resident, 0);
  ck_assert_int_eq(reserved, 60);
  ck_assert(pe_run_budget_hold(&b, &model, 40, 100, NULL, NULL));
  ck_assert(pe_run_budget_hold(&b, &model, 30, 100, NULL, NULL)); /* less: nothing changes */
  ck_assert_int_eq(model, 40);
  ck_assert_int_eq(pe_run_budget_resident(&b), 40);
  ck_assert(!pe_run_budget_hold(&b, &model, 41, 100, NULL, NULL)); /* 1 more: over */
  ck_assert(pe_run_budget_hold(&b, &model, 41, 0, NULL, NULL));    /* no total */
  pe_run_budget_set(&b, &model, 40);
  pe_run_budget_release(&b, 60);
  /* 70 is under the runs' limit (100) but not beside the 40 resident. */
  atomic_int order = 0;
  waiter w;
  start(&w, &b, 70, 0, &order);
  until_waiting(&b, 1);
  sleep_ms(QUIET_MS);
  ck_assert(!atomic_load(&w.done));
  pe_run_budget_set(&b, &model, 0);
  ck_assert(finished(&w));
  ck_assert_ptr_null(w.st);
  ck_assert_int_eq(pe_run_budget_resident(&b), 0);
  pe_run_budget_release(&b, 70);
  atomic_store(&total_now, 0);
  pe_run_budget_destroy(&b);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("run_budget");
  TCase *tc = tcase_create("server");
  tcase_add_test(tc, first_come_first_served);
  tcase_add_test(tc, deadline_and_stop_end_a_wait);
  tcase_add_test(tc, raised_limit_lets_a_waiter_in);
  tcase_add_test(tc, resident_and_runs_share_the_total);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
