/* pe-client train's request marks (client/cli/train_log.c): going back to
 * a step gives the run's totals and the epoch's sums there, inside a
 * request too, forgets what is repeated, and refuses steps it cannot
 * place. */
#include <check.h>

#include "check_main.h"
#include "train_log.h"

enum { BATCH = 10 };

/* Requests of 4 steps (the last of an epoch: one short batch of 5 rows),
 * as train pushes them: each mark holds the totals before it. */
static void push_run(train_log *l, int requests) {
  long step = 0, samples = 0;
  epoch_sums e = {0};
  for (int i = 0; i < requests; i++) {
    bool short_one = i % 3 == 2;
    long nb = short_one ? 1 : 4, rows = short_one ? 5 : nb * BATCH;
    train_log_push(l, &(train_mark){step, samples, nb, rows, e});
    step += nb;
    samples += rows;
    e.steps += nb;
    e.samples += rows;
    e.loss += (double)rows * (i + 1);
    if (short_one) e = (epoch_sums){0}; /* the epoch ends */
  }
}

START_TEST(rewind_to_a_request_start_and_inside_one) {
  train_log l;
  ck_assert(train_log_init(&l, 16));
  push_run(&l, 6); /* steps 0-3, 4-7, 8 | 9-12, 13-16, 17 */
  train_mark at;
  long unfetched;
  ck_assert(train_log_rewind(&l, 15, BATCH, &at, &unfetched)); /* 2 into the 5th */
  ck_assert_int_eq(at.step, 15);
  ck_assert_int_eq(at.samples, 85 + 40 + 20);
  ck_assert_int_eq(at.e.steps, 4 + 2);
  ck_assert_int_eq(at.e.samples, 40); /* the 2 steps' losses are unknown */
  ck_assert_double_eq(at.e.loss, 40.0 * 4);
  ck_assert_int_eq(unfetched, 2);
  ck_assert_uint_eq(l.n, 5); /* the 6th is forgotten, the 5th holds steps 13-14 */

  ck_assert(train_log_rewind(&l, 9, BATCH, &at, &unfetched)); /* the 4th's start */
  ck_assert_int_eq(at.samples, 85);
  ck_assert_int_eq(at.e.steps, 0);
  ck_assert_int_eq(unfetched, 0);
  ck_assert_uint_eq(l.n, 3);
  ck_assert(!train_log_rewind(&l, 10, BATCH, &at, &unfetched)); /* forgotten */
  ck_assert(train_log_rewind(&l, 9, BATCH, &at, &unfetched));   /* the 3rd's end */
  ck_assert_int_eq(at.samples, 85);
  ck_assert_int_eq(at.e.steps, 9);
  ck_assert_int_eq(unfetched, 1);
  ck_assert_uint_eq(l.n, 3);
  train_log_free(&l);
}
END_TEST

/* Past the ring's oldest mark there is nothing to go back to. */
START_TEST(steps_older_than_the_ring_are_refused) {
  train_log l;
  ck_assert(train_log_init(&l, 4));
  push_run(&l, 6); /* marks of steps 8, 9, 13, 17 remain */
  train_mark at;
  long unfetched;
  ck_assert(!train_log_rewind(&l, 7, BATCH, &at, &unfetched));
  ck_assert(train_log_rewind(&l, 8, BATCH, &at, &unfetched));
  ck_assert_int_eq(at.samples, 80);
  ck_assert_uint_eq(l.n, 0);
  train_log_free(&l);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("train_log");
  TCase *tc = tcase_create("train_log");
  tcase_add_test(tc, rewind_to_a_request_start_and_inside_one);
  tcase_add_test(tc, steps_older_than_the_ring_are_refused);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
