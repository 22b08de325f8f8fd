/* places = auto's candidates, its choice (server/places_choice.h) and its
 * remembered choices (server/places_recall.h): the fastest measured
 * candidate wins, the earlier of equal times, none measured is -1; a
 * written choice reads back, and one that is corrupt, of another machine or
 * batch is ignored. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "server/places_recall.h"
#include "server/places_rounds.h"
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

/* A round's order is a permutation; over n rounds each candidate leads
 * once, and odd rounds run backwards. */
START_TEST(test_round_order_rotates) {
  int o[4];
  pe_places_round_order(3, 0, o);
  ck_assert(o[0] == 0 && o[1] == 1 && o[2] == 2);
  pe_places_round_order(3, 1, o);
  ck_assert(o[0] == 0 && o[1] == 2 && o[2] == 1); /* 1 2 0, reversed */
  pe_places_round_order(3, 2, o);
  ck_assert(o[0] == 2 && o[1] == 0 && o[2] == 1);
  for (int n = 1; n <= 4; n++) {
    int led[4] = {0};
    for (int r = 0; r < n; r++) {
      pe_places_round_order(n, r, o);
      int seen[4] = {0};
      for (int k = 0; k < n; k++) seen[o[k]]++;
      for (int k = 0; k < n; k++) ck_assert_int_eq(seen[k], 1);
      if (r % 2 == 0) led[o[0]]++;
    }
    for (int r = 0; r < n; r++) {
      pe_places_round_order(n, r, o);
      if (r % 2) led[o[n - 1]]++; /* reversed: the rotation's head is last */
    }
    for (int k = 0; k < n; k++) ck_assert_int_eq(led[k], 1);
  }
}
END_TEST

/* A simulated machine for the rounds: each candidate's true step time,
 * a clock that the steps advance, and bursts of load (other processes)
 * that make every step inside them `factor` times slower. */
typedef struct sim {
  const double *true_ms;
  double clock, burst_from, burst_to, factor;
  int turns[8], steps[8];
  int fail_cand, fail_at_turn; /* -1: none */
  double deadline_ms;          /* <= 0: none */
} sim;

static double sim_step(sim *m, int cand) {
  bool in = m->clock >= m->burst_from && m->clock < m->burst_to;
  double ms = m->true_ms[cand] * (in ? m->factor : 1);
  m->clock += ms;
  return ms;
}

static pe_status *sim_turn(void *ctx, int cand, double slot_ms, int *steps, double *ms) {
  sim *m = ctx;
  if (cand == m->fail_cand && m->turns[cand] == m->fail_at_turn)
    return pe_error(PE_EINVAL, "candidate %d: a step failed", cand);
  m->turns[cand]++;
  *steps = 0;
  *ms = 0;
  while (*steps == 0 || *ms < slot_ms) {
    *ms += sim_step(m, cand);
    ++*steps;
  }
  m->steps[cand] += *steps;
  return NULL;
}

static bool sim_deadline(void *ctx) {
  sim *m = ctx;
  return m->deadline_ms > 0 && m->clock > m->deadline_ms;
}

static void sim_rounds(sim *m, int n, int steps, pe_places_candidate *c) {
  int idx[8];
  for (int i = 0; i < n; i++) {
    c[i] = (pe_places_candidate){.n_places = i + 1};
    idx[i] = i;
  }
  ck_assert_ptr_null(pe_places_rounds(c, idx, n, steps, sim_turn, sim_deadline, m));
}

/* Quiet: every candidate is timed for its steps and PE_PLACES_TRIAL_MIN_MS
 * at least, and its step_ms is its true time. A failing turn ends that
 * candidate only; the deadline stops the rounds after the first. */
START_TEST(test_rounds_time_each_candidate) {
  const double true_ms[3] = {2.0, 1.5, 60.0};
  pe_places_candidate c[3];
  sim m = {.true_ms = true_ms, .burst_from = -1, .burst_to = -1, .fail_cand = -1};
  sim_rounds(&m, 3, 20, c);
  for (int i = 0; i < 3; i++) {
    ck_assert_msg(m.steps[i] >= 20, "candidate %d: %d steps", i, m.steps[i]);
    ck_assert(m.steps[i] * true_ms[i] >= PE_PLACES_TRIAL_MIN_MS);
    ck_assert_msg(fabs(c[i].step_ms - true_ms[i]) < 1e-9, "candidate %d: %g ms", i, c[i].step_ms);
    ck_assert_int_eq(m.turns[i], m.turns[0]); /* every round gives each a turn */
    ck_assert_str_eq(c[i].error, "");
  }
  ck_assert_int_eq(m.turns[2], 20); /* the slow one needs 20 one-step turns */
  ck_assert_int_eq(pe_places_choose(c, 3), 1);

  m = (sim){
      .true_ms = true_ms, .burst_from = -1, .burst_to = -1, .fail_cand = 1, .fail_at_turn = 3};
  sim_rounds(&m, 3, 20, c);
  ck_assert_str_eq(c[1].error, "candidate 1: a step failed");
  ck_assert(c[1].step_ms <= 0);
  ck_assert_int_eq(m.turns[1], 3);
  ck_assert(fabs(c[0].step_ms - 2.0) < 1e-9);
  ck_assert_int_eq(pe_places_choose(c, 3), 0);

  m = (sim){
      .true_ms = true_ms, .burst_from = -1, .burst_to = -1, .fail_cand = -1, .deadline_ms = 1};
  sim_rounds(&m, 3, 20, c);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(m.turns[i], 1);
  ck_assert(c[1].step_ms > 0);
}
END_TEST

/* Bursts of other processes' load, of any length, anywhere in the trial:
 * the truly fastest candidate still wins, though the three lie within 7 %
 * of each other and a burst doubles or triples every step inside it. */
START_TEST(test_rounds_outlast_bursts) {
  const double true_ms[3] = {1.6, 1.5, 1.55}; /* cpu:2 (index 1) is the fastest */
  pe_places_candidate c[3];
  sim quiet = {.true_ms = true_ms, .burst_from = -1, .burst_to = -1, .fail_cand = -1};
  sim_rounds(&quiet, 3, 20, c);
  double trial_ms = quiet.clock;
  const double lengths[] = {10, 60, 170, 400, 900, 3000};
  const double factors[] = {2, 3};
  int tried = 0;
  for (size_t f = 0; f < sizeof factors / sizeof *factors; f++)
    for (size_t l = 0; l < sizeof lengths / sizeof *lengths; l++)
      for (double from = 0; from < trial_ms; from += 7.3) {
        sim m = {.true_ms = true_ms,
                 .burst_from = from,
                 .burst_to = from + lengths[l],
                 .factor = factors[f],
                 .fail_cand = -1};
        sim_rounds(&m, 3, 20, c);
        ck_assert_msg(pe_places_choose(c, 3) == 1,
                      "a x%g burst of %g ms from %g ms chose %d (%.3f %.3f %.3f ms)", factors[f],
                      lengths[l], from, pe_places_choose(c, 3), c[0].step_ms, c[1].step_ms,
                      c[2].step_ms);
        tried++;
      }
  ck_assert(tried > 100);
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
  tcase_add_test(tc, test_round_order_rotates);
  tcase_add_test(tc, test_rounds_time_each_candidate);
  tcase_add_test(tc, test_rounds_outlast_bursts);
  tcase_add_test(tc, test_remember_and_recall);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
