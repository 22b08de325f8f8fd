/* places = auto's trial: time the candidates (server/places_trial.h). */
#include "server/places_trial.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/allocator.h"
#include "core/arena.h"
#include "core/clock.h"
#include "core/log.h"
#include "server/host_memory.h"
#include "server/places_rounds.h"
#include "server/registry/internal.h"

#define PE_TRIAL_MAX_STEPS 1000

static Pe__Strategy strategy_pb(pe_graph_strategy s) {
  return s == PE_STRATEGY_REDUCE    ? PE__STRATEGY__REDUCE
         : s == PE_STRATEGY_SHARDED ? PE__STRATEGY__SHARDED
                                    : PE__STRATEGY__ALLREDUCE;
}

void pe_places_trial_options(const pe_places_trial *t, const Pe__RegisterOptions *base,
                             Pe__RegisterOptions *o) {
  if (base)
    *o = *base;
  else
    pe__register_options__init(o);
  const pe_places_candidate *c = &t->cand[t->chosen];
  o->strategy = c->auto_strategy ? PE__STRATEGY__AUTO : strategy_pb(c->strategy);
  o->fuse_allreduce = c->fused;
}

/* Synthetic values for feed v with dim 0 = batch: floats spread over
 * [-1, 1) (a fixed sequence), integers 0 (a valid class, token or index). */
static pe_status *synth_feed(const pe_var_info *v, int64_t batch, pe_tensor *t) {
  pe_shape sh = v->shape;
  for (int d = 0; d < sh.ndim; d++) {
    if (sh.d[d] >= 0) continue;
    if (d > 0)
      return pe_error(PE_EINVAL, "feed '%s' has a batch-dependent dim %d: no synthetic batch",
                      v->name, d);
    sh.d[d] = batch;
  }
  PE_TRY(pe_tensor_resize(t, v->dtype, &sh, v->name));
  memset(t->data, 0, pe_tensor_bytes(t));
  if (v->dtype == PE_F32) {
    float *x = pe_f32(t);
    uint32_t r = 12345;
    for (int64_t i = 0; i < pe_tensor_numel(t); i++) {
      r = r * 1664525u + 1013904223u;
      x[i] = (float)(r >> 8) / (float)(1u << 23) - 1.0f;
    }
  }
  return NULL;
}

/* What one held candidate owns. */
typedef struct trial_run {
  pe_srv_program *p;
  pe_runtime *rt;
  pe_model *m;
  pe_par_exec *e, *startup;
  pe_tensor *feeds;
  pe_feed *fv;
} trial_run;

static void trial_run_free(trial_run *r) {
  pe_par_exec_free(r->e);
  pe_par_exec_free(r->startup);
  pe_model_free(r->m);
  pe_runtime_free(r->rt);
  if (r->feeds)
    for (int i = 0; i < r->p->n_feeds; i++) pe_tensor_release(&r->feeds[i]);
  free(r->feeds);
  free(r->fv);
  if (r->p) pe_reg_program_destroy(r->p);
  *r = (trial_run){0};
}

/* Compile rq for c, build its runtime and model, run the startup and one
 * step (the warm-up: first allocations, kernel creation) into *r. */
static pe_status *build_candidate(pe_server *s, const Pe__RegisterRequest *rq, const pe_limits *lim,
                                  int64_t batch, pe_places_candidate *c, trial_run *r) {
  Pe__RegisterOptions o;
  pe_places_trial one = {.n_cand = 1, .chosen = 0};
  one.cand[0] = *c;
  pe_places_trial_options(&one, rq->options, &o);
  o.for_test = false;
  Pe__RegisterRequest r2 = *rq;
  r2.options = &o;
  pe_graph *g = NULL, *sg = NULL;
  if (!(r->p = calloc(1, sizeof *r->p))) return pe_error(PE_ENOMEM, "places trial: out of memory");
  pe_status *st = pe_reg_compile(s, &r2, lim, PE_PLACE_CPU, c->n_places, &g, &sg, r->p);
  if (!st) c->strategy = r->p->strategy; /* as compiled: AUTO resolved */
  pe_runtime_opts ro = {.threads = pe_runtime_default_workers(PE_PLACE_CPU, c->n_places),
                        .keep_denormals = !s->cfg.flush_denormals};
  if (!st) st = pe_runtime_new(&ro, &r->rt);
  if (!st) st = pe_model_new(r->rt, PE_PLACE_CPU, c->n_places, 1, &r->m);
  if (!st) {
    st = pe_par_exec_new(r->m, g, &r->e);
    g = NULL; /* the executor's, also on failure */
  }
  if (!st && sg) {
    st = pe_par_exec_new(r->m, sg, &r->startup);
    sg = NULL;
  }
  if (!st && r->startup) st = pe_par_exec_run(r->startup, NULL, 0, NULL, 0, NULL, NULL, NULL);
  int nf = r->p->n_feeds;
  if (!st && nf > 0 &&
      (!(r->feeds = calloc((size_t)nf, sizeof *r->feeds)) ||
       !(r->fv = calloc((size_t)nf, sizeof *r->fv))))
    st = pe_error(PE_ENOMEM, "places trial: out of memory");
  for (int i = 0; i < nf && !st; i++) {
    pe_tensor_init(&r->feeds[i]);
    st = synth_feed(&r->p->feeds[i], batch, &r->feeds[i]);
    r->fv[i] = (pe_feed){r->p->feeds[i].name, &r->feeds[i]};
  }
  if (!st) st = pe_par_exec_run(r->e, r->fv, nf, NULL, 0, NULL, NULL, NULL);
  pe_graph_free(g);
  pe_graph_free(sg);
  return st;
}

/* The trial's state for the rounds' callbacks. */
typedef struct trial_ctx {
  trial_run *runs; /* per candidate; built while held */
  double t0, budget_s;
} trial_ctx;

static pe_status *turn(void *ctx, int cand, double slot_ms, int *steps, double *ms) {
  trial_run *r = &((trial_ctx *)ctx)->runs[cand];
  *steps = 0;
  *ms = 0;
  while (*steps == 0 || (*ms < slot_ms && *steps < PE_TRIAL_MAX_STEPS)) {
    double t0 = pe_now_s();
    PE_TRY(pe_par_exec_run(r->e, r->fv, r->p->n_feeds, NULL, 0, NULL, NULL, NULL));
    *ms += (pe_now_s() - t0) * 1e3;
    ++*steps;
  }
  return NULL;
}

static bool past_budget(void *ctx) {
  trial_ctx *x = ctx;
  return x->budget_s > 0 && pe_now_s() - x->t0 > x->budget_s;
}

static int64_t in_use(void) {
  return (int64_t)pe_allocator_stats(pe_host_allocator()).bytes_in_use;
}

/* The bytes the trial may hold in candidates at once: [limits]
 * memory_per_run, or half the host's memory where that is unlimited. */
static int64_t held_cap(const pe_limits *lim) {
  return lim->memory_per_run > 0 ? lim->memory_per_run : pe_host_memory_bytes() / 2;
}

pe_status *pe_places_trial_run(pe_server *s, const Pe__RegisterRequest *rq, const pe_limits *lim,
                               int64_t batch, int steps, double budget_s, pe_places_trial *t) {
  if (steps < 1) steps = 1;
  if (steps > PE_TRIAL_MAX_STEPS) steps = PE_TRIAL_MAX_STEPS;
  t->batch = batch;
  t->remembered = false;
  for (int i = 0; i < t->n_cand; i++) t->cand[i].step_ms = 0;
  trial_ctx x = {.t0 = pe_now_s(), .budget_s = budget_s};
  int idx[PE_PLACES_MAX_CANDIDATES];
  if (!(x.runs = calloc((size_t)(t->n_cand ? t->n_cand : 1), sizeof *x.runs)))
    return pe_error(PE_ENOMEM, "places trial: out of memory");
  int64_t cap = held_cap(lim);
  pe_status *st = NULL;
  /* Groups: as many candidates as fit in `cap` (by the host allocator's
   * bytes in use that the held ones cost on average: parameters, their
   * gradients and optimizer state, temporaries), built, then timed in
   * rounds together; normally one group holds them all. */
  for (int next = 0; next < t->n_cand && !st;) {
    int n = 0;
    int64_t base = in_use();
    for (; next < t->n_cand; next++) {
      pe_places_candidate *c = &t->cand[next];
      char name[64];
      pe_places_candidate_name(c, name, sizeof name);
      if (next > 0 && past_budget(&x)) {
        snprintf(c->error, sizeof c->error,
                 "not tried: the trial's %.0f s ([runtime] places_trial_time) had passed",
                 budget_s);
        continue;
      }
      int64_t grown = in_use() - base;
      if (n > 0 && cap > 0 && grown / n * (n + 1) > cap) break; /* the next group's */
      pe_status *bs = build_candidate(s, rq, lim, batch, c, &x.runs[next]);
      if (bs) {
        snprintf(c->error, sizeof c->error, "%s", pe_status_msg(bs));
        PE_LOGI("places trial: %s: %s", name, pe_status_msg(bs));
        pe_status_free(bs);
        trial_run_free(&x.runs[next]);
        continue;
      }
      idx[n++] = next;
    }
    st = pe_places_rounds(t->cand, idx, n, steps, turn, past_budget, &x);
    for (int k = 0; k < n; k++) {
      pe_places_candidate *c = &t->cand[idx[k]];
      char name[64];
      pe_places_candidate_name(c, name, sizeof name);
      if (c->error[0])
        PE_LOGI("places trial: %s: %s", name, c->error);
      else
        PE_LOGI("places trial: %s: %.3f ms a step of %lld samples (%d held at once)", name,
                c->step_ms, (long long)batch, n);
      trial_run_free(&x.runs[idx[k]]);
    }
  }
  free(x.runs);
  if (st) return st;
  t->trial_s = pe_now_s() - x.t0;
  t->chosen = pe_places_choose(t->cand, t->n_cand);
  if (t->chosen < 0)
    return pe_error(PE_EINVAL, "places trial: no candidate ran (%s: %s)",
                    t->n_cand ? "cpu:1" : "none", t->n_cand ? t->cand[0].error : "");
  return NULL;
}

Pe__PlacesTrial *pe_places_trial_pb(const pe_places_trial *t, pe_arena *a) {
  Pe__PlacesTrial *x = pe_arena_alloc(a, sizeof *x);
  if (!x) return NULL;
  pe__places_trial__init(x);
  char buf[32];
  const pe_places_candidate *ch = &t->cand[t->chosen];
  snprintf(buf, sizeof buf, "cpu:%d", ch->n_places);
  x->places = pe_arena_strdup(a, buf);
  x->strategy = strategy_pb(ch->strategy);
  x->fused = ch->fused;
  x->remembered = t->remembered;
  x->batch = t->batch;
  x->trial_s = t->trial_s;
  x->candidates = pe_arena_alloc(a, sizeof *x->candidates * (size_t)(t->n_cand ? t->n_cand : 1));
  if (!x->places || !x->candidates) return NULL;
  for (int i = 0; i < t->n_cand; i++) {
    const pe_places_candidate *c = &t->cand[i];
    Pe__PlacesCandidate *y = pe_arena_alloc(a, sizeof *y);
    if (!y) return NULL;
    pe__places_candidate__init(y);
    snprintf(buf, sizeof buf, "cpu:%d", c->n_places);
    y->places = pe_arena_strdup(a, buf);
    y->strategy = strategy_pb(c->strategy);
    y->fused = c->fused;
    y->step_ms = c->step_ms > 0 ? c->step_ms : 0;
    y->error = pe_arena_strdup(a, c->error);
    if (!y->places || !y->error) return NULL;
    x->candidates[x->n_candidates++] = y;
  }
  return x;
}
