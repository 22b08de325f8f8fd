/* places = auto's candidates and its choice among them (pure: no clock, no
 * device; server/places_trial.h times them).
 *
 * The candidates split the machine's cores between places: cpu:1 (one place,
 * every core in its kernels' team), then cpu:k for k = 2, 4, ... below the
 * cores, then cpu:cores (one core each). On more than one place each split
 * tries the gradient strategies (sharded, allreduce, allreduce with fused
 * buckets, reduce) when the register left the strategy to the daemon, else
 * only the one it named. The order is the tie rule: the fastest wins, and
 * of equal times the earlier (fewer places, then the order above).
 *
 * Passes. The trial times every candidate in two passes over all of them,
 * each with half the steps (and at least PE_PLACES_PASS_MIN_MS of them),
 * and keeps the smaller of a candidate's two times. Why: other processes' load comes in bursts of seconds; timed once,
 * one after another, a candidate that met a burst lost to one that did
 * not, and the choice changed from one register to the next on a shared
 * machine. A candidate's two windows lie a whole pass apart, so a burst has
 * to last that long, or two bursts meet it twice, to decide the choice. */
#ifndef PE_SERVER_PLACES_CHOICE_H
#define PE_SERVER_PLACES_CHOICE_H

#include <stdbool.h>

#include "compiler/graph.h"

#define PE_PLACES_MAX_CANDIDATES 32
/* The largest batch a trial times (RegisterOptions.batch_hint, config
 * places_trial_batch): its synthetic feeds are allocated whole. */
#define PE_PLACES_TRIAL_MAX_BATCH (1 << 20)

typedef struct pe_places_candidate {
  int n_places; /* cpu:n_places */
  pe_graph_strategy strategy;
  bool fused;         /* options.fuse_allreduce (AllReduce only) */
  bool auto_strategy; /* options.strategy AUTO (one place: nothing to choose) */
  double step_ms;     /* the smaller of its passes' step times; <= 0: not measured */
  char error[160];    /* why it was not measured ("" : it was, or not tried) */
} pe_places_candidate;

/* The candidates for `cores` cores into c (at most PE_PLACES_MAX_CANDIDATES);
 * returns how many. choose_strategy: try every strategy; else only
 * (strategy, fused) on several places. */
int pe_places_candidates(int cores, bool choose_strategy, pe_graph_strategy strategy, bool fused,
                         pe_places_candidate *c);
/* The index of the fastest measured candidate (the earliest of equal times);
 * -1 when none was measured. */
int pe_places_choose(const pe_places_candidate *c, int n);
/* The trial's passes over n candidates timing `steps` steps each in all:
 * PE_PLACES_TRIAL_PASSES, or 1 when steps < 2. */
#define PE_PLACES_TRIAL_PASSES 2
int pe_places_trial_passes(int steps);
/* Steps timed in pass `pass` (0-based): the first takes the odd one. */
int pe_places_pass_steps(int steps, int pass);
/* A pass times each candidate for at least this long, past its steps if
 * need be: ten steps of the MLP's 1.5 ms are 15 ms, which one scheduling
 * delay of another process on a shared machine decides. */
#define PE_PLACES_PASS_MIN_MS 250.0
/* True while a candidate's pass goes on: fewer than `steps` timed, or
 * less than PE_PLACES_PASS_MIN_MS of them, and fewer than max_steps. */
bool pe_places_pass_more(int done, int steps, double timed_ms, int max_steps);
/* Fold a pass's median into c->step_ms (the smaller one; ms <= 0 is no
 * measurement and changes nothing). */
void pe_places_record(pe_places_candidate *c, double ms);
/* "cpu:2 sharded", "cpu:2 allreduce fused", "cpu:1" into buf. */
const char *pe_places_candidate_name(const pe_places_candidate *c, char *buf, int cap);

#endif
