/* Stopping a run of many steps between two of its steps (RunRequest.steps
 * or .batches): never inside a step, so the model's parameters stay those
 * of a step boundary and the steps before stay applied (each pushed its
 * run origin: a resend is answered PE_EALREADY naming the steps done).
 *
 * A run stops when
 *   - the daemon is stopping (SIGTERM/SIGINT: pe_server.stopping), so the
 *     shutdown checkpoint is written soon, with the steps done;
 *   - its program was deregistered (by its last owner, --force, or its
 *     owners' sessions ending: close or TTL expiry);
 *   - its model is being dropped.
 * Otherwise such a run would go on to its last step (up to the config's
 * max_steps_per_request: minutes to hours) with nobody waiting for it and
 * SIGTERM waiting for it.
 *
 * A run longer than the session TTL does not expire its own client (and
 * so cancel itself): a session with a request in flight is never idle
 * (pe_registry_request_begin/end).
 *
 * Threads: a guard belongs to the request thread running the run (or the
 * pool worker that chains its steps, one at a time); the flags it reads
 * are atomics written under the registry lock or by the signal callback. */
#ifndef PE_SERVER_RUN_CANCEL_H
#define PE_SERVER_RUN_CANCEL_H

#include <stdint.h>

#include "server/registry/registry.h"

typedef struct pe_run_guard {
  pe_server *s;
  const pe_srv_program *p;
  uint64_t client;
} pe_run_guard;

/* NULL: the run goes on. Else the error that ends it after `done` of
 * `total` steps: "run cancelled after N of M steps: <reason>". */
pe_status *pe_run_guard_check(pe_run_guard *g, uint64_t done, uint64_t total);

#endif
