/* places = auto's candidates, its choice (server/places_choice.h) and its
 * remembered choices (server/places_recall.h): the fastest measured
 * candidate wins, the earlier of equal times, none measured is -1; a
 * written choice reads back, and one that is corrupt, of another machine or
 * batch is ignored. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "server/places_recall.h"
#include "test_assert.h"

START_TEST(test_candidates_split_the_cores) {
  pe_places_candidate c[PE_PLACES_MAX_CANDIDATES];
  ck_assert_int_eq(pe_places_candidates(1, true, PE_STRATEGY_SHARDED, false, c), 1);
  ck_assert_int_eq(c[0].n_places, 1);
  ck_assert(c[0].auto_strategy);
  /* 2 cores: cpu:1, then cpu:2 with each strategy (allreduce fused too). */
  int n = pe_places_candidates(2, true, PE_STRATEGY_ALLREDUCE, false, c);
  ck_assert_int_eq(n, 5);
  ck_assert_int_eq(c[1].n_places, 2);
  ck_assert_int_eq(c[1].strategy, PE_STRATEGY_SHARDED);
  ck_assert_int_eq(c[3].strategy, PE_STRATEGY_ALLREDUCE);
  ck_assert(c[3].fused);
  ck_assert_int_eq(c[4].strategy, PE_STRATEGY_REDUCE);
  /* 8 cores, the strategy named: cpu:1, 2, 4, 8 with that one only. */
  n = pe_places_candidates(8, false, PE_STRATEGY_REDUCE, false, c);
  ck_assert_int_eq(n, 4);
  ck_assert_int_eq(c[1].n_places, 2);
  ck_assert_int_eq(c[2].n_places, 4);
  ck_assert_int_eq(c[3].n_places, 8);
  for (int i = 1; i < n; i++) ck_assert_int_eq(c[i].strategy, PE_STRATEGY_REDUCE);
  /* 6 cores: the powers of two below, then all of them. */
  n = pe_places_candidates(6, false, PE_STRATEGY_SHARDED, false, c);
  ck_assert_int_eq(n, 4);
  ck_assert_int_eq(c[3].n_places, 6);
}
END_TEST

START_TEST(test_choose_fastest_earliest_of_ties) {
  pe_places_candidate c[4] = {0};
  ck_assert_int_eq(pe_places_choose(c, 4), -1); /* none measured */
  c[0].step_ms = 3.0;
  c[1].step_ms = 2.0;
  c[2].step_ms = 2.0; /* tie: the earlier (index 1) */
  c[3].step_ms = 0;   /* not measured: never chosen */
  ck_assert_int_eq(pe_places_choose(c, 4), 1);
  c[3].step_ms = 1.5;
  ck_assert_int_eq(pe_places_choose(c, 4), 3);
  c[1].step_ms = c[2].step_ms = c[3].step_ms = 3.0; /* all equal: the first */
  ck_assert_int_eq(pe_places_choose(c, 4), 0);
}
END_TEST

/* The trial's passes: the steps split between two passes (one for a
 * single step), a candidate keeps the smaller of its pass times. */
START_TEST(test_trial_passes_split_the_steps) {
  ck_assert_int_eq(pe_places_trial_passes(1), 1);
  ck_assert_int_eq(pe_places_pass_steps(1, 0), 1);
  ck_assert_int_eq(pe_places_pass_steps(1, 1), 0);
  ck_assert_int_eq(pe_places_trial_passes(20), 2);
  ck_assert_int_eq(pe_places_pass_steps(20, 0), 10);
  ck_assert_int_eq(pe_places_pass_steps(20, 1), 10);
  ck_assert_int_eq(pe_places_pass_steps(21, 0), 11);
  ck_assert_int_eq(pe_places_pass_steps(21, 1), 10);
  ck_assert_int_eq(pe_places_pass_steps(21, 2), 0);
  /* A pass goes on past its steps until PE_PLACES_PASS_MIN_MS is timed. */
  ck_assert(pe_places_pass_more(0, 10, 0, 1000));
  ck_assert(pe_places_pass_more(9, 10, 2 * PE_PLACES_PASS_MIN_MS, 1000));
  ck_assert(pe_places_pass_more(10, 10, PE_PLACES_PASS_MIN_MS / 2, 1000));
  ck_assert(!pe_places_pass_more(10, 10, PE_PLACES_PASS_MIN_MS, 1000));
  ck_assert(!pe_places_pass_more(1000, 10, 1, 1000)); /* at most max_steps */
  pe_places_candidate c = {0};
  pe_places_record(&c, 0); /* no measurement */
  ck_assert(c.step_ms <= 0);
  pe_places_record(&c, 3.0);
  pe_places_record(&c, 4.0);
  ck_assert(c.step_ms == 3.0);
  pe_places_record(&c, 2.5);
  pe_places_record(&c, -1);
  ck_assert(c.step_ms == 2.5);
}
END_TEST

/* A burst of load from another process doubles every step inside it. The
 * candidates, timed in the trial's passes on a simulated clock, each step
 * at its true time (times two inside the burst), with a burst that begins
 * with the victim's first window and lasts all of it. */
static void sim_trial(const double *true_ms, int n, int steps, int passes, int victim,
                      pe_places_candidate *c) {
  double clock = 0, burst_from = -1, burst_to = -1;
  for (int i = 0; i < n; i++) c[i] = (pe_places_candidate){.n_places = i + 1};
  for (int pass = 0; pass < passes; pass++)
    for (int i = 0; i < n; i++) {
      int k = passes == 1 ? steps : pe_places_pass_steps(steps, pass);
      if (i == victim && pass == 0) {
        burst_from = clock;
        burst_to = clock + 2 * k * true_ms[i];
      }
      double sum = 0;
      for (int s = 0; s < k; s++) {
        double ms = true_ms[i] * (clock >= burst_from && clock < burst_to ? 2 : 1);
        clock += ms;
        sum += ms;
      }
      pe_places_record(&c[i], sum / k);
    }
}

/* The truly fastest candidate wins with the trial's passes although a
 * burst covered all of its first window; timed in one pass it loses (the
 * reason for the passes). */
START_TEST(test_trial_passes_outlast_a_burst) {
  const double true_ms[3] = {2.0, 1.5, 1.7}; /* cpu:2 (index 1) is the fastest */
  pe_places_candidate c[3];
  sim_trial(true_ms, 3, 20, 1, 1, c);
  ck_assert_int_ne(pe_places_choose(c, 3), 1); /* one pass: the burst decides */
  sim_trial(true_ms, 3, 20, pe_places_trial_passes(20), 1, c);
  ck_assert_int_eq(pe_places_choose(c, 3), 1);
  ck_assert(c[1].step_ms == 1.5);
}
END_TEST

static void write_text(const char *dir, const char *file, const char *text) {
  char path[512];
  snprintf(path, sizeof path, "%s/places/%s", dir, file);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

START_TEST(test_remember_and_recall) {
  char dir[] = "/tmp/pe-places-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char machine[256];
  pe_places_machine(machine, sizeof machine);
  pe_places_trial t = {.batch = 32};
  t.n_cand = pe_places_candidates(2, true, PE_STRATEGY_ALLREDUCE, false, t.cand);
  for (int i = 0; i < t.n_cand; i++) t.cand[i].step_ms = 5.0 - i * 0.5;
  t.chosen = pe_places_choose(t.cand, t.n_cand);
  ck_assert_int_eq(t.chosen, t.n_cand - 1);
  ck_assert(!pe_places_remember(dir, "a.choice", machine, &t));

  pe_places_trial got;
  ck_assert(pe_places_recall(dir, "a.choice", machine, 32, &got));
  ck_assert(got.remembered);
  ck_assert_int_eq(got.chosen, t.chosen);
  ck_assert_int_eq(got.n_cand, t.n_cand);
  ck_assert_int_eq(got.cand[got.chosen].n_places, 2);
  ck_assert_int_eq(got.cand[got.chosen].strategy, PE_STRATEGY_REDUCE);
  ck_assert(got.cand[0].auto_strategy);

  /* Another batch or machine: not this choice. Missing: false. */
  ck_assert(!pe_places_recall(dir, "a.choice", machine, 64, &got));
  ck_assert(!pe_places_recall(dir, "a.choice", "another cpu|2 cores|avx2", 32, &got));
  ck_assert(!pe_places_recall(dir, "none.choice", machine, 32, &got));

  /* Corrupt: truncated, garbage, a chosen index out of range, places out of
   * range. Each is ignored. */
  char text[1024];
  snprintf(text, sizeof text, "pe-places-choice 1\nmachine %s\nbatch 32\nchosen 1\n", machine);
  write_text(dir, "b.choice", text); /* no candidates */
  ck_assert(!pe_places_recall(dir, "b.choice", machine, 32, &got));
  write_text(dir, "b.choice", "\x01\x02garbage");
  ck_assert(!pe_places_recall(dir, "b.choice", machine, 32, &got));
  snprintf(text, sizeof text,
           "pe-places-choice 1\nmachine %s\nbatch 32\nchosen 0\ncandidate 9999 0 0 0 1.0\n",
           machine);
  write_text(dir, "b.choice", text);
  ck_assert(!pe_places_recall(dir, "b.choice", machine, 32, &got));
  snprintf(text, sizeof text,
           "pe-places-choice 1\nmachine %s\nbatch 32\nchosen 0\ncandidate 1 0 0 1 1.0 x\n",
           machine);
  write_text(dir, "b.choice", text);
  ck_assert(!pe_places_recall(dir, "b.choice", machine, 32, &got));
  snprintf(text, sizeof text,
           "pe-places-choice 1\nmachine %s\nbatch 32\nchosen 0\ncandidate 1 0 0 1 1.0\n", machine);
  write_text(dir, "b.choice", text); /* the same, well-formed: read */
  ck_assert(pe_places_recall(dir, "b.choice", machine, 32, &got));
  ck_assert_int_eq(got.cand[0].n_places, 1);

  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("places_choice");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_candidates_split_the_cores);
  tcase_add_test(tc, test_choose_fastest_earliest_of_ties);
  tcase_add_test(tc, test_trial_passes_split_the_steps);
  tcase_add_test(tc, test_trial_passes_outlast_a_burst);
  tcase_add_test(tc, test_remember_and_recall);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
