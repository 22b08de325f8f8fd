/* pe-bench train --places auto (bench_places.h). */
#include "bench_places.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "core/clock.h"
#include "json_out.h"
#include "ops/device_ctx.h"

#define TRIAL_STEPS 20

int pe_bench_places_auto(train_cfg *cfg, bench_places *bp) {
  const char *s = cfg->strategy ? cfg->strategy : "auto";
  bool choose = !strcmp(s, "auto");
  pe_graph_strategy fixed = !strcmp(s, "reduce")    ? PE_STRATEGY_REDUCE
                            : !strcmp(s, "sharded") ? PE_STRATEGY_SHARDED
                                                    : PE_STRATEGY_ALLREDUCE;
  bool fused = cfg->fuse && !strcmp(cfg->fuse, "on");
  bp->n_cand = pe_places_candidates(pe_cpu_cores(), choose, fixed, fused, bp->cand);
  bp->steps = TRIAL_STEPS;
  double t0 = pe_now_s();
  int passes = pe_places_trial_passes(TRIAL_STEPS);
  for (int pass = 0; pass < passes; pass++)
    for (int i = 0; i < bp->n_cand; i++) {
      pe_places_candidate *c = &bp->cand[i];
      if (c->error[0]) continue; /* failed in the first pass */
      train_cfg tc = *cfg;
      char places[16];
      snprintf(places, sizeof places, "cpu:%d", c->n_places);
      tc.places = places;
      tc.strategy = c->auto_strategy ? "auto" : pe_strategy_name(c->strategy);
      tc.fuse = c->fused ? "on" : "off";
      if (c->auto_strategy) c->strategy = pe_strategy_auto(PE_PLACE_CPU, NULL);
      double ms = 0;
      if (pe_bench_time_steps(&tc, pe_places_pass_steps(TRIAL_STEPS, pass), PE_PLACES_PASS_MIN_MS,
                              &ms)) {
        snprintf(c->error, sizeof c->error, "a step failed (printed above)");
        c->step_ms = 0;
        continue;
      }
      pe_places_record(c, ms);
      if (!cfg->json) {
        char name[64];
        fprintf(stderr, "pe-bench train: places trial: %s: %.3f ms a step (pass %d of %d)\n",
                pe_places_candidate_name(c, name, sizeof name), ms, pass + 1, passes);
      }
    }
  bp->trial_s = pe_now_s() - t0;
  bp->chosen = pe_places_choose(bp->cand, bp->n_cand);
  if (bp->chosen < 0) {
    pe_bench_error("FAILED", "places auto: no candidate ran");
    return 1;
  }
  const pe_places_candidate *c = &bp->cand[bp->chosen];
  snprintf(bp->places, sizeof bp->places, "cpu:%d", c->n_places);
  snprintf(bp->strategy, sizeof bp->strategy, "%s",
           c->auto_strategy ? "auto" : pe_strategy_name(c->strategy));
  cfg->places = bp->places;
  cfg->strategy = bp->strategy;
  cfg->fuse = c->fused ? "on" : "off";
  return 0;
}

void pe_bench_places_json(const bench_places *bp, long batch, FILE *f) {
  const pe_places_candidate *ch = &bp->cand[bp->chosen];
  fprintf(f,
          ",\"places_trial\":{\"places\":\"cpu:%d\",\"strategy\":\"%s\",\"fused\":%s,"
          "\"remembered\":false,\"batch\":%ld,\"trial_seconds\":%.3f,\"candidates\":[",
          ch->n_places, pe_strategy_name(ch->strategy), ch->fused ? "true" : "false", batch,
          bp->trial_s);
  for (int i = 0; i < bp->n_cand; i++) {
    const pe_places_candidate *c = &bp->cand[i];
    fprintf(f,
            "%s{\"places\":\"cpu:%d\",\"strategy\":\"%s\",\"fused\":%s,\"step_ms\":", i ? "," : "",
            c->n_places, pe_strategy_name(c->strategy), c->fused ? "true" : "false");
    cli_json_num(f, "%.4f", c->step_ms > 0 ? c->step_ms : (double)NAN);
    if (c->error[0]) {
      fprintf(f, ",\"error\":");
      cli_json_str(f, c->error);
    }
    fputc('}', f);
  }
  fputs("]}", f);
}
