/* places = auto's candidates and its choice (server/places_choice.h). */
#include "server/places_choice.h"

#include <stdio.h>

static int add(pe_places_candidate *c, int n, int places, pe_graph_strategy s, bool fused,
               bool auto_strategy) {
  if (n >= PE_PLACES_MAX_CANDIDATES) return n;
  c[n] = (pe_places_candidate){
      .n_places = places, .strategy = s, .fused = fused, .auto_strategy = auto_strategy};
  return n + 1;
}

static int add_split(pe_places_candidate *c, int n, int places, bool choose_strategy,
                     pe_graph_strategy strategy, bool fused) {
  if (!choose_strategy) return add(c, n, places, strategy, fused, false);
  n = add(c, n, places, PE_STRATEGY_SHARDED, false, false);
  n = add(c, n, places, PE_STRATEGY_ALLREDUCE, false, false);
  n = add(c, n, places, PE_STRATEGY_ALLREDUCE, true, false);
  return add(c, n, places, PE_STRATEGY_REDUCE, false, false);
}

int pe_places_candidates(int cores, bool choose_strategy, pe_graph_strategy strategy, bool fused,
                         pe_places_candidate *c) {
  if (cores > PE_MAX_PLACES) cores = PE_MAX_PLACES;
  /* One place: the strategy shards nothing, so the register's own. */
  int n = add(c, 0, 1, strategy, fused, choose_strategy);
  for (int k = 2; k < cores; k *= 2) n = add_split(c, n, k, choose_strategy, strategy, fused);
  if (cores > 1) n = add_split(c, n, cores, choose_strategy, strategy, fused);
  return n;
}

int pe_places_choose(const pe_places_candidate *c, int n) {
  int best = -1;
  for (int i = 0; i < n; i++)
    if (c[i].step_ms > 0 && (best < 0 || c[i].step_ms < c[best].step_ms)) best = i;
  return best;
}

const char *pe_places_candidate_name(const pe_places_candidate *c, char *buf, int cap) {
  if (c->n_places < 2)
    snprintf(buf, (size_t)cap, "cpu:%d", c->n_places);
  else
    snprintf(buf, (size_t)cap, "cpu:%d %s%s", c->n_places, pe_strategy_name(c->strategy),
             c->fused ? " fused" : "");
  return buf;
}
