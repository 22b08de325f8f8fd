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
 * Timing: server/places_rounds.h (the candidates in interleaved rounds). */
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
  double step_ms;     /* its measured step time (server/places_rounds.h); <= 0: not measured */
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
/* "cpu:2 sharded", "cpu:2 allreduce fused", "cpu:1" into buf. */
const char *pe_places_candidate_name(const pe_places_candidate *c, char *buf, int cap);

#endif
