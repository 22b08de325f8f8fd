/* The temporary memory of runs: what one step needs, as the program's
 * memory plan sizes it for the batch fed (pe_graph_run_bytes: activations,
 * their gradients, the parameters' gradients).
 *
 *  - [limits] memory_per_run: one run's step must fit, or the run is
 *    refused before it starts (PE_ENOMEM naming the batch, the bytes and
 *    the limit). Without it a small request with a large batch (or a
 *    shared-memory feed, which max_message does not bound) takes the
 *    daemon to gigabytes, and past the host's memory the OOM killer ends
 *    it and every user's models with it.
 *  - [limits] memory_runs_total: the runs in flight together
 *    (run/budget.h). A run over it on its own is refused like one over
 *    memory_per_run; one that fits alone waits for the runs ahead of it,
 *    at most its timeout (then PE_EDEADLINE naming the bytes wanted, in
 *    use and the limit), until it is cancelled or the daemon stops
 *    (run/cancel.h's errors).
 *  - [limits] memory_kept_per_program: what a program's executor keeps of
 *    its temporaries after a request, for the next one (steady state
 *    allocates nothing). A request whose plan needs more releases them at
 *    its end (pe_par_exec_release), so an idle model that once ran a huge
 *    batch does not pin its memory; a request of many steps or batches
 *    reuses them between its steps. What a program keeps is resident in
 *    the daemon's budget (run/budget.h) until then.
 *  - [limits] memory_total: a run must also fit beside the models'
 *    resident memory; one that cannot (even with no other run) is
 *    refused, naming the budget, the bytes resident and what is left.
 *
 * Threads: a request thread (reads the reloadable limits). */
#ifndef PE_SERVER_RUN_MEMORY_H
#define PE_SERVER_RUN_MEMORY_H

#include <stdbool.h>
#include <stdint.h>

#include "server/registry/registry.h"

typedef struct pe_run_memory {
  /* In. rows: the batch of one step (dim 0 of the feeds; with batches,
   * of one mini-batch). */
  int64_t rows;
  uint64_t client;
  uint32_t steps;      /* of the request (cancel messages) */
  uint32_t timeout_ms; /* the run's timeout; 0: none */
  /* Out, for pe_run_memory_end: the step's planned bytes, those reserved
   * from memory_runs_total; whether the run may start (begin returned
   * NULL). */
  int64_t need, reserved;
  bool began;
} pe_run_memory;

/* Check the limits and reserve the step's bytes (may wait); NULL when the
 * run may start. */
pe_status *pe_run_memory_begin(pe_server *s, const pe_srv_program *p, pe_run_memory *m);
/* After the run's last step (whether or not begin succeeded): give the
 * reservation back, and release the executor's temporaries past
 * memory_kept_per_program. */
void pe_run_memory_end(pe_server *s, pe_srv_program *p, pe_run_memory *m);

#endif
