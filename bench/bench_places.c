/* pe-bench train --places auto (bench_places.h). */
#include "bench_places.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "core/clock.h"
#include "json_out.h"
#include "ops/device_ctx.h"
#include "server/places_rounds.h"

#define TRIAL_STEPS 20

/* The held candidates' trainers and their last turn's step time. */
typedef struct held_trainers {
  pe_bench_stepper *sp[PE_PLACES_MAX_CANDIDATES];
  double step_ms[PE_PLACES_MAX_CANDIDATES];
} held_trainers;

/* One turn: steps in runs sized by the last step time, until slot_ms. */
static pe_status *turn(void *ctx, int cand, double slot_ms, int *steps, double *ms) {
  held_trainers *h = ctx;
  *steps = 0;
  *ms = 0;
  while (*steps == 0 || *ms < slot_ms) {
    double est = h->step_ms[cand] > 0 ? h->step_ms[cand] : slot_ms;
    long k = (long)ceil((slot_ms - *ms) / est);
    long done = 0;
    double seconds = 0;
    if (pe_bench_stepper_run(h->sp[cand], k < 1 ? 1 : k, &done, &seconds))
      return pe_error(PE_EINVAL, "a step failed (printed above)");
    if (done <= 0) return pe_error(PE_EINVAL, "no step ran");
    *steps += (int)done;
    *ms += seconds * 1e3;
    h->step_ms[cand] = seconds * 1e3 / (double)done;
  }
  return NULL;
}

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
  /* Every candidate held at once (the daemon's trial bounds them by its
   * memory limit; a benchmark holds what it is asked to compare). */
  held_trainers h = {0};
  char places[PE_PLACES_MAX_CANDIDATES][16];
  int idx[PE_PLACES_MAX_CANDIDATES], n = 0;
  for (int i = 0; i < bp->n_cand; i++) {
    pe_places_candidate *c = &bp->cand[i];
    train_cfg tc = *cfg;
    snprintf(places[i], sizeof places[i], "cpu:%d", c->n_places);
    tc.places = places[i];
    tc.strategy = c->auto_strategy ? "auto" : pe_strategy_name(c->strategy);
    tc.fuse = c->fused ? "on" : "off";
    if (c->auto_strategy) c->strategy = pe_strategy_auto(PE_PLACE_CPU, NULL);
    /* One copy of the data sets for all: the first open candidate's. */
    if (pe_bench_stepper_open(&tc, n ? h.sp[idx[0]] : NULL, &h.sp[i])) {
      snprintf(c->error, sizeof c->error, "a step failed (printed above)");
      continue;
    }
    idx[n++] = i;
  }
  pe_status *st = pe_places_rounds(bp->cand, idx, n, TRIAL_STEPS, turn, NULL, &h);
  /* The lender (the first held) last. */
  for (int i = bp->n_cand - 1; i >= 0; i--) pe_bench_stepper_close(h.sp[i]);
  if (st) return pe_bench_train_fail(st, "places auto");
  if (!cfg->json)
    for (int i = 0; i < bp->n_cand; i++) {
      const pe_places_candidate *c = &bp->cand[i];
      char name[64];
      pe_places_candidate_name(c, name, sizeof name);
      if (c->error[0])
        fprintf(stderr, "pe-bench train: places trial: %s: %s\n", name, c->error);
      else
        fprintf(stderr, "pe-bench train: places trial: %s: %.3f ms a step\n", name, c->step_ms);
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
