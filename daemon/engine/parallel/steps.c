/* pe_par_exec_run_steps (parallel/executor.h): several steps per call, chained
 * by the pool worker that completes each step's last node.
 *
 * Host executors (chain_steps). The caller's thread asks next(0) (it may
 * block) and begins step 0, then sleeps (par_wait_back). The last node of
 * step k queues e->steps_task on its worker (finish_run_node); the task
 * ends step k, calls done(k), asks next(k+1) without blocking and begins
 * step k+1. When next would block, the chain stops and hands back: the
 * caller's thread asks again, blocking, and begins. An error or
 * PE_STEP_END hands back with the result.
 *
 * Device executors (sim, device collectives): par_step_end waits for the devices'
 * streams (the step's feeds are views of the source's parts, read until
 * the step's last kernel), which is the caller's thread's job: the last
 * node hands back and the caller ends the step, calls done and next and
 * begins.
 *
 * Threads: the par_steps record is used by one thread at a time: the
 * caller until a begin, then the worker that chains the step, then the
 * caller after the hand-back (done_mu orders it). A chaining task touches
 * nothing once its begin succeeded: the new step's last node may queue
 * steps_task again before the task has returned. */
#include "engine/parallel/executor_internal.h"

typedef struct par_steps {
  const pe_step_source *src;
  int n_feeds;
  const char *const *fetch;
  int n_fetch;
  pe_tensor *fetched;
  int64_t step;      /* the step that runs, or the one to ask for */
  int64_t done;      /* steps whose done returned */
  pe_status *err;    /* why a chain stopped (owned) */
  pe_step_next what; /* and what next said */
} par_steps;

/* Ask for step s->step's feeds and begin it. */
static pe_status *next_and_begin(pe_par_exec *e, bool may_block, pe_step_next *what) {
  par_steps *s = e->steps;
  const pe_feed_split *feeds = NULL;
  *what = PE_STEP_END;
  pe_status *st = s->src->next(s->src->ctx, s->step, may_block, &feeds, what);
  if (st) return st;
  if (*what == PE_STEP_WOULD_BLOCK && may_block)
    return pe_error(PE_EINVAL, "run_steps: step %lld: next would block on the caller's thread",
                    (long long)s->step);
  if (*what != PE_STEP_READY) return NULL;
  if (s->n_feeds && !feeds)
    return pe_error(PE_EINVAL, "run_steps: step %lld: next gave no feeds", (long long)s->step);
  st = par_step_begin(e, NULL, feeds, s->n_feeds);
  return st ? pe_status_wrap(st, "step %lld", (long long)s->step) : NULL;
}

/* Step s->step's nodes are all done: end it and hand its fetches to done. */
static pe_status *end_and_done(pe_par_exec *e) {
  par_steps *s = e->steps;
  pe_status *st = par_step_end(e, s->fetch, s->n_fetch, s->fetched);
  if (st) return pe_status_wrap(st, "step %lld", (long long)s->step);
  st = s->src->done(s->src->ctx, s->step, s->fetched, s->n_fetch);
  if (st) return st;
  s->done++;
  s->step++;
  return NULL;
}

/* e->steps_task, on the worker that completed a step's last node. */
static void chain_task(void *arg) {
  pe_par_exec *e = arg;
  pe_step_next what = PE_STEP_END;
  pe_status *st = end_and_done(e);
  if (!st) st = next_and_begin(e, false, &what);
  if (!st && what == PE_STEP_READY) return; /* running: touch nothing more */
  e->steps->err = st;
  e->steps->what = what;
  par_hand_back(e);
}

static bool waits_for_devices(const pe_par_exec *e) {
  return e->async || e->m->dcomm;
}

pe_status *pe_par_exec_run_steps(pe_par_exec *e, const pe_step_source *src, int n_feeds,
                                 const char *const *fetch, int n_fetch, pe_tensor *fetched,
                                 const pe_run_opts *opts, int64_t *steps) {
  if (steps) *steps = 0;
  if (!src || !src->next || !src->done || n_feeds < 0 || n_fetch < 0 ||
      (n_fetch && (!fetch || !fetched)))
    return pe_error(PE_EINVAL, "parallel executor: bad run_steps arguments");
  if (pe_pool_is_worker(e->rt->pool))
    return pe_error(PE_EINVAL, "parallel executor: run_steps called from a pool worker");
  pthread_mutex_lock(&e->run_mu);
  pe_status *ost = par_set_opts(e, opts);
  if (ost) {
    pthread_mutex_unlock(&e->run_mu);
    return ost;
  }
  par_graph_set_fetch(e, fetch, n_fetch);
  par_steps s = {src, n_feeds, fetch, n_fetch, fetched, 0, 0, NULL, PE_STEP_END};
  e->steps = &s;
  e->steps_task = (pe_task){chain_task, e, NULL};
  e->chain_steps = !waits_for_devices(e);
  pe_step_next what;
  pe_status *st = next_and_begin(e, true, &what);
  while (!st && what == PE_STEP_READY) {
    par_wait_back(e);
    if (e->chain_steps) {
      st = s.err;
      what = s.what;
      s.err = NULL;
      if (!st && what == PE_STEP_WOULD_BLOCK) st = next_and_begin(e, true, &what);
    } else {
      st = end_and_done(e);
      if (!st) st = next_and_begin(e, true, &what);
    }
  }
  e->chain_steps = false;
  e->steps = NULL;
  if (steps) *steps = s.done;
  pthread_mutex_unlock(&e->run_mu);
  return st;
}
