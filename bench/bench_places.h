/* pe-bench train --executor parallel --places auto: the daemon's places
 * trial in process (server/places_choice.h's candidates and choice), each
 * candidate a trainer of its own on the benchmark's own batches
 * (pe_bench_stepper), all held at once and timed in interleaved rounds
 * (server/places_rounds.h), then the run on the fastest. */
#ifndef PE_BENCH_PLACES_H
#define PE_BENCH_PLACES_H

#include <stdio.h>

#include "bench_train.h"
#include "server/places_choice.h"

typedef struct bench_places {
  pe_places_candidate cand[PE_PLACES_MAX_CANDIDATES];
  int n_cand, chosen;
  long steps;     /* timed per candidate */
  double trial_s; /* the trial's wall time */
  char places[16], strategy[16];
} bench_places;

/* Time the candidates for cfg (its strategy and fuse: "auto" or none tries
 * every strategy) and set cfg's places, strategy and fuse to the fastest.
 * Non-zero when none could run. */
int pe_bench_places_auto(train_cfg *cfg, bench_places *bp);
/* ,"places_trial":{...} onto f (the keys of pe-client train --json's). */
void pe_bench_places_json(const bench_places *bp, long batch, FILE *f);

#endif
