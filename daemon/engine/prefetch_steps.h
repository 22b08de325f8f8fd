/* pe_par_exec_run_steps over a prefetcher's batches: the step source that
 * pe-bench's training loop and the daemon's multi-batch runs share.
 *
 * Input i of the prefetcher is the feed called names[i]; step k runs on
 * the prefetcher's k-th batch, split onto the places as the prefetcher
 * split it (pe_par_exec_run_split). A step's batch is released as soon as
 * the step ended, before done is called, so the prefetcher may refill its
 * slot while done runs.
 *
 * Threads: as pe_par_exec_run_steps (next and done on the caller's thread
 * or a pool worker, one at a time, in step order); the record is the
 * caller's and must outlive the call. */
#ifndef PE_ENGINE_PREFETCH_STEPS_H
#define PE_ENGINE_PREFETCH_STEPS_H

#include "engine/parallel/executor.h"
#include "engine/prefetch.h"

#define PE_PREFETCH_STEPS_MAX_INPUTS 8

typedef struct pe_prefetch_steps {
  /* Set by the caller: */
  pe_prefetch *pf;
  int n_places;             /* the executor's */
  int n_inputs;             /* <= PE_PREFETCH_STEPS_MAX_INPUTS */
  const char *const *names; /* [n_inputs] feed names */
  int64_t max;              /* stop after this many steps; 0: at the prefetcher's end */
  /* Step `step` ended on a batch of `samples` examples; fetched as in
   * pe_step_source.done. May be NULL. An error ends the call. */
  pe_status *(*done)(void *ctx, int64_t step, int64_t samples, const pe_tensor *fetched,
                     int n_fetch);
  void *ctx;
  /* Out: the prefetcher said its end (not max, not an error). */
  bool end;
  /* Internal. */
  pe_prefetch_batch *b;
  const pe_tensor *parts[PE_PREFETCH_STEPS_MAX_INPUTS][PE_MAX_PLACES];
  pe_feed_split feeds[PE_PREFETCH_STEPS_MAX_INPUTS];
} pe_prefetch_steps;

/* pe_par_exec_run_steps with s as the source; *steps (may be NULL) as
 * there. A batch that was handed out but not run (a failed start) is given
 * back before returning. */
pe_status *pe_prefetch_run_steps(pe_par_exec *e, pe_prefetch_steps *s, const char *const *fetch,
                                 int n_fetch, pe_tensor *fetched, const pe_run_opts *opts,
                                 int64_t *steps);

#endif
