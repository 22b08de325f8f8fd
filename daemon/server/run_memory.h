/* [limits] memory_per_run: the temporary memory one step of a run needs,
 * as the program's memory plan sizes it for the batch fed
 * (pe_graph_run_bytes: activations, their gradients, the parameters'
 * gradients), must fit the limit, or the run is refused before it starts
 * (PE_ENOMEM naming the batch, the bytes and the limit). Before, a small
 * request with a large batch (or a shared-memory feed, which max_message
 * does not bound) took the daemon to gigabytes, and past the host's memory
 * the OOM killer would have ended it and every user's models with it.
 *
 * Threads: a request thread (reads the reloadable limit). */
#ifndef PE_SERVER_RUN_MEMORY_H
#define PE_SERVER_RUN_MEMORY_H

#include <stdint.h>

#include "server/programs.h"

/* rows: the batch of one step (dim 0 of the feeds; with batches, of one
 * mini-batch). NULL when the step fits. */
pe_status *pe_run_memory_check(pe_server *s, const pe_srv_program *p, int64_t rows);

#endif
