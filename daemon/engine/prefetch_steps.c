/* pe_prefetch_run_steps (prefetch_steps.h). */
#include "engine/prefetch_steps.h"

static pe_status *steps_next(void *ctx, int64_t step, bool may_block, const pe_feed_split **feeds,
                             pe_step_next *what) {
  pe_prefetch_steps *s = ctx;
  *what = PE_STEP_END;
  if (s->max && step >= s->max) return NULL;
  pe_prefetch_batch *b = NULL;
  if (may_block) {
    PE_TRY(pe_prefetch_next(s->pf, &b));
  } else {
    bool ready;
    PE_TRY(pe_prefetch_try_next(s->pf, &b, &ready));
    if (!ready) {
      *what = PE_STEP_WOULD_BLOCK;
      return NULL;
    }
  }
  if (!b) {
    s->end = true;
    return NULL;
  }
  s->b = b;
  if (b->n_places != s->n_places || b->n_inputs != s->n_inputs)
    return pe_error(PE_EINVAL, "step %lld: batch split onto %d places x %d inputs, want %d x %d",
                    (long long)step, b->n_places, b->n_inputs, s->n_places, s->n_inputs);
  for (int i = 0; i < s->n_inputs; i++)
    for (int p = 0; p < s->n_places; p++) s->parts[i][p] = pe_prefetch_part(b, p, i);
  *feeds = s->feeds;
  *what = PE_STEP_READY;
  return NULL;
}

static pe_status *steps_done(void *ctx, int64_t step, const pe_tensor *fetched, int n_fetch) {
  pe_prefetch_steps *s = ctx;
  int64_t samples = s->b->total;
  pe_prefetch_release(s->pf, s->b); /* the step ended: its parts are free */
  s->b = NULL;
  return s->done ? s->done(s->ctx, step, samples, fetched, n_fetch) : NULL;
}

pe_status *pe_prefetch_run_steps(pe_par_exec *e, pe_prefetch_steps *s, const char *const *fetch,
                                 int n_fetch, pe_tensor *fetched, const pe_run_opts *opts,
                                 int64_t *steps) {
  if (s->n_inputs < 1 || s->n_inputs > PE_PREFETCH_STEPS_MAX_INPUTS || s->n_places < 1 ||
      s->n_places > PE_MAX_PLACES)
    return pe_error(PE_EINVAL, "prefetched steps: %d inputs on %d places (at most %d on %d)",
                    s->n_inputs, s->n_places, PE_PREFETCH_STEPS_MAX_INPUTS, PE_MAX_PLACES);
  s->end = false;
  s->b = NULL;
  for (int i = 0; i < s->n_inputs; i++) s->feeds[i] = (pe_feed_split){s->names[i], s->parts[i]};
  pe_step_source src = {steps_next, steps_done, s};
  pe_status *st = pe_par_exec_run_steps(e, &src, s->n_inputs, fetch, n_fetch, fetched, opts, steps);
  pe_prefetch_release(s->pf, s->b); /* a step that failed to start */
  s->b = NULL;
  return st;
}
