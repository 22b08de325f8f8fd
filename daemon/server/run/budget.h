/* The daemon's memory budget: [limits] memory_total for the models'
 * resident memory and the runs' temporaries together, and within it
 * [limits] memory_runs_total for the temporary memory of the runs in
 * flight. [limits] memory_per_run bounds one run's step (run/memory.h);
 * without a total, N clients each just under it took N times it together,
 * past the host's memory, and the OOM killer ended the daemon and every
 * user's models with it. Client ids are the clients' own choice, so a
 * per-client quota (memory_per_client) bounds nothing against many ids:
 * memory_total is the bound no set of clients can pass.
 *
 * Resident memory is held for good, until its owner goes: a model's
 * persistables (registry/memory.c charges what its shape claims describe, before
 * any of it is allocated) and a program's kept temporaries (run/memory.c).
 * A charge that does not fit beside what is held and reserved is refused
 * at once (pe_run_budget_hold): it would otherwise wait for memory that
 * may never be given back.
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
#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

typedef struct pe_budget_waiter pe_budget_waiter;

typedef struct pe_run_budget {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int64_t reserved; /* bytes held by runs in flight */
  int64_t resident; /* bytes held for good (models, kept temporaries) */
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
  /* memory_total now (NULL or 0: unlimited): a run also fits only beside
   * the resident bytes and the other runs. */
  int64_t (*total)(void *arg);
} pe_budget_wait;

/* Reserve `bytes` once they fit next to the reservations of the runs in
 * flight and every earlier waiter has had its turn; NULL then. A request
 * larger than the limit on its own must be refused before (it would wait
 * forever). */
pe_status *pe_run_budget_acquire(pe_run_budget *b, int64_t bytes, const pe_budget_wait *w);
void pe_run_budget_release(pe_run_budget *b, int64_t bytes);

/* Resident bytes. *held is what its owner holds now (written only here,
 * under the budget's lock). hold: grow *held to want when the growth fits
 * within total (<= 0: unlimited) beside the resident and reserved bytes,
 * and return true (also when want <= *held: nothing changes); else false,
 * with the bytes resident and reserved then in *resident and *reserved
 * (may be NULL), for the caller's message. set: *held becomes want,
 * whatever the total (memory that exists already, or a release). */
bool pe_run_budget_hold(pe_run_budget *b, int64_t *held, int64_t want, int64_t total,
                        int64_t *resident, int64_t *reserved);
void pe_run_budget_set(pe_run_budget *b, int64_t *held, int64_t want);
/* Resident bytes now (Status). */
int64_t pe_run_budget_resident(pe_run_budget *b);
/* Bytes reserved now, runs waiting now (Status). */
void pe_run_budget_get(pe_run_budget *b, int64_t *reserved, int *waiting);

#endif
