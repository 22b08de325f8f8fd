/* [limits] memory_runs_total: the daemon-wide budget for the temporary
 * memory of the runs in flight. [limits] memory_per_run bounds one run's
 * step (run_memory.h); without a total, N clients each just under it took
 * N times it together, past the host's memory, and the OOM killer ended
 * the daemon and every user's models with it.
 *
 * A run reserves its step's planned bytes (pe_graph_run_bytes for its
 * batch) before its first step and gives them back after its last. A run
 * that fits alone but not next to the runs in flight waits, first come
 * first served (a large run is not starved by a stream of small ones),
 * until the memory is free, its timeout passes, it is cancelled or the
 * daemon stops: waiting, not refusing, because the memory is held for a
 * run's length only (seconds), so a refusal would make every client retry
 * in a loop for what the daemon can hand out in order.
 *
 * Threads: any request thread; one mutex and condition variable. Waiters
 * wake at least every 100 ms to look at their stop condition and at the
 * limit, which SIGHUP may change. */
#ifndef PE_SERVER_RUN_BUDGET_H
#define PE_SERVER_RUN_BUDGET_H

#include <pthread.h>
#include <stdint.h>

#include "core/status.h"

typedef struct pe_budget_waiter pe_budget_waiter;

typedef struct pe_run_budget {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int64_t reserved; /* bytes held by runs in flight */
  int n_waiting;
  pe_budget_waiter *head, *tail; /* waiting runs, first come first */
} pe_run_budget;

void pe_run_budget_init(pe_run_budget *b);
void pe_run_budget_destroy(pe_run_budget *b); /* nothing reserved or waiting */

/* How a wait ends other than with the memory. All are called without the
 * budget's lock held, at least every 100 ms. */
typedef struct pe_budget_wait {
  /* The limit now, in bytes (0: unlimited). */
  int64_t (*limit)(void *arg);
  /* Non-NULL: the wait ends with this error (a cancel, shutdown). */
  pe_status *(*stop)(void *arg);
  /* Non-NULL: the error when `deadline` (pe_now_s) passes (0: none);
   * given the bytes in use then. */
  pe_status *(*expired)(void *arg, int64_t in_use, int64_t limit);
  double deadline;
  void *arg;
} pe_budget_wait;

/* Reserve `bytes` once they fit next to the reservations of the runs in
 * flight and every earlier waiter has had its turn; NULL then. A request
 * larger than the limit on its own must be refused before (it would wait
 * forever). */
pe_status *pe_run_budget_acquire(pe_run_budget *b, int64_t bytes, const pe_budget_wait *w);
void pe_run_budget_release(pe_run_budget *b, int64_t bytes);
/* Bytes reserved now, runs waiting now (Status). */
void pe_run_budget_get(pe_run_budget *b, int64_t *reserved, int *waiting);

#endif
