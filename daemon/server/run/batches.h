/* A run request that carries several mini-batches (service.proto
 * RunRequest.batches > 1): one training step per mini-batch, chained on the
 * runtime's pool by pe_par_exec_run_steps, the fetches of every step
 * stacked into the reply.
 *
 * Why: through the daemon each step otherwise costs a round trip (~130 us
 * on the 2-core machine) on its critical path, and the places wait between
 * steps while the request thread takes the fetches and re-arms the graph;
 * an MLP step on cpu:2 is ~800 us. Here the client sends k batches at once
 * (in shared memory: the places' rows of each mini-batch are copied
 * straight from the region, no private copy of the whole feed first) and
 * the daemon's pool splits batch j+1 onto the places while step j runs
 * (pe_prefetch, as pe-bench does), the worker ending step j starting step
 * j+1.
 *
 * Each step is exactly a pe_par_exec_run of its mini-batch: the same
 * parameters after k batches as after k single-batch requests. A failing
 * step stops the request with its error, naming the step; the steps before
 * it stay applied (as they would have with k requests); so do they when the
 * run is cancelled between two steps (run/cancel.h). */
#ifndef PE_SERVER_RUN_BATCHES_H
#define PE_SERVER_RUN_BATCHES_H

#include "server/registry/registry.h"
#include "server/shm.h"

typedef struct pe_run_batches {
  const pe_feed *feeds; /* every feed holds `batches` mini-batches along dim 0 */
  /* Per feed (may be NULL): a pinned shm range that holds the feed's bytes;
   * that feed's tensor then has dtype and shape only, and each mini-batch's
   * rows are copied from the region (SIGBUS-guarded) when needed. */
  const pe_shm_pin *const *pins;
  /* Per feed (may be NULL): the row indices of a pinned feed whose shm
   * reference has them (ShmRef.rows): its rows are rows[i] of the array
   * the pin holds. */
  const int64_t *const *rows;
  int n_feeds;
  uint32_t batches; /* > 1 */
  const char *const *fetch;
  int n_fetch;
  /* The fetch that is the loss a step checks (run/finite.h); -1: none. */
  int loss_index;
  const pe_run_opts *opts;
  double deadline;     /* pe_now_s() clock; 0: none */
  uint32_t timeout_ms; /* for the message */
  /* Checked after each step but the last (may be NULL): a cancelled run
   * stops there (run/cancel.h). */
  struct pe_run_guard *guard;
  /* Steps ended so far, for Status (may be NULL). */
  _Atomic uint32_t *progress;
} pe_run_batches;

/* Run rb's steps of program p on runtime rt. stacked: n_fetch zeroed
 * tensors; each becomes [steps done, fetch shape...] (host memory, the
 * caller releases them, also on error). *done counts the steps run, each
 * applied to the model (a run cancelled or timed out after step k: k + 1,
 * as its message says). */
pe_status *pe_srv_run_batches(pe_runtime *rt, pe_srv_program *p, const pe_run_batches *rb,
                              pe_tensor *stacked, uint32_t *done);

#endif
