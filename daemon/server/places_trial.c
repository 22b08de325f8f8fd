/* places = auto's trial: time the candidates (server/places_trial.h). */
#include "server/places_trial.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena.h"
#include "core/clock.h"
#include "core/log.h"
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

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* What one candidate's measurement owns. */
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
}

/* Compile rq for c, build its runtime and model, run the startup and
 * time the steps; *median_ms: their median. */
static pe_status *time_candidate(pe_server *s, const Pe__RegisterRequest *rq, const pe_limits *lim,
                                 int64_t batch, int steps, pe_places_candidate *c,
                                 double *median_ms) {
  Pe__RegisterOptions o;
  pe_places_trial one = {.n_cand = 1, .chosen = 0};
  one.cand[0] = *c;
  pe_places_trial_options(&one, rq->options, &o);
  o.for_test = false;
  Pe__RegisterRequest r2 = *rq;
  r2.options = &o;
  trial_run r = {0};
  pe_graph *g = NULL, *sg = NULL;
  if (!(r.p = calloc(1, sizeof *r.p))) return pe_error(PE_ENOMEM, "places trial: out of memory");
  pe_status *st = pe_reg_compile(s, &r2, lim, PE_PLACE_CPU, c->n_places, &g, &sg, r.p);
  if (!st) c->strategy = r.p->strategy; /* as compiled: AUTO resolved */
  pe_runtime_opts ro = {.threads = pe_runtime_default_workers(PE_PLACE_CPU, c->n_places),
                        .keep_denormals = !s->cfg.flush_denormals};
  if (!st) st = pe_runtime_new(&ro, &r.rt);
  if (!st) st = pe_model_new(r.rt, PE_PLACE_CPU, c->n_places, 1, &r.m);
  if (!st) {
    st = pe_par_exec_new(r.m, g, &r.e);
    g = NULL; /* the executor's, also on failure */
  }
  if (!st && sg) {
    st = pe_par_exec_new(r.m, sg, &r.startup);
    sg = NULL;
  }
  if (!st && r.startup) st = pe_par_exec_run(r.startup, NULL, 0, NULL, 0, NULL, NULL, NULL);
  int nf = r.p->n_feeds;
  if (!st && nf > 0 &&
      (!(r.feeds = calloc((size_t)nf, sizeof *r.feeds)) ||
       !(r.fv = calloc((size_t)nf, sizeof *r.fv))))
    st = pe_error(PE_ENOMEM, "places trial: out of memory");
  for (int i = 0; i < nf && !st; i++) {
    pe_tensor_init(&r.feeds[i]);
    st = synth_feed(&r.p->feeds[i], batch, &r.feeds[i]);
    r.fv[i] = (pe_feed){r.p->feeds[i].name, &r.feeds[i]};
  }
  double ms[PE_TRIAL_MAX_STEPS], timed_ms = 0;
  int n = 0; /* timed steps */
  for (int i = 0; !st && pe_places_pass_more(n, steps, timed_ms, PE_TRIAL_MAX_STEPS); i++) {
    double t0 = pe_now_s();
    st = pe_par_exec_run(r.e, r.fv, nf, NULL, 0, NULL, NULL, NULL);
    if (i > 0) { /* step 0: the warm-up */
      ms[n] = (pe_now_s() - t0) * 1e3;
      timed_ms += ms[n++];
    }
  }
  steps = n;
  if (!st && steps > 0) {
    qsort(ms, (size_t)steps, sizeof *ms, cmp_double);
    *median_ms = steps % 2 ? ms[steps / 2] : (ms[steps / 2 - 1] + ms[steps / 2]) / 2;
    if (*median_ms <= 0) *median_ms = 1e-6; /* measured, below the clock's resolution */
  }
  pe_graph_free(g);
  pe_graph_free(sg);
  trial_run_free(&r);
  return st;
}

pe_status *pe_places_trial_run(pe_server *s, const Pe__RegisterRequest *rq, const pe_limits *lim,
                               int64_t batch, int steps, double budget_s, pe_places_trial *t) {
  if (steps < 1) steps = 1;
  if (steps > PE_TRIAL_MAX_STEPS) steps = PE_TRIAL_MAX_STEPS;
  t->batch = batch;
  t->remembered = false;
  for (int i = 0; i < t->n_cand; i++) t->cand[i].step_ms = 0;
  double t0 = pe_now_s();
  int passes = pe_places_trial_passes(steps);
  for (int pass = 0; pass < passes; pass++) {
    for (int i = 0; i < t->n_cand; i++) {
      pe_places_candidate *c = &t->cand[i];
      if (c->error[0]) continue; /* failed (or not tried) in the first pass */
      char name[64];
      pe_places_candidate_name(c, name, sizeof name);
      if ((pass > 0 || i > 0) && budget_s > 0 && pe_now_s() - t0 > budget_s) {
        if (c->step_ms <= 0)
          snprintf(c->error, sizeof c->error,
                   "not tried: the trial's %.0f s ([runtime] "
                   "places_trial_time) had passed",
                   budget_s);
        continue;
      }
      double ms = 0;
      pe_status *st =
          time_candidate(s, rq, lim, batch, pe_places_pass_steps(steps, pass), c, &ms);
      if (st) {
        snprintf(c->error, sizeof c->error, "%s", pe_status_msg(st));
        c->step_ms = 0;
        PE_LOGI("places trial: %s: %s", name, pe_status_msg(st));
        pe_status_free(st);
      } else {
        pe_places_record(c, ms);
        PE_LOGI("places trial: %s: %.3f ms a step of %lld samples (pass %d of %d)", name, ms,
                (long long)batch, pass + 1, passes);
      }
    }
  }
  t->trial_s = pe_now_s() - t0;
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
