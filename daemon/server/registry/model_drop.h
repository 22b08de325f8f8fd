/* Dropping a model (DropModelRequest, pe_client_drop_model, pe-client
 * drop-model): the way to give a model name back, with another
 * architecture in mind or to discard what a persistent model holds.
 *
 * The model is freed and its restart checkpoint (the file a restart
 * restores and autosave and SIGTERM write, config shutdown_checkpoint) is
 * removed. Named checkpoints (Save) stay: they are the user's, and a Load
 * reads them into any model they fit. Refused, naming each program's handle
 * and client, while a live program of another client is bound to the model;
 * the caller's own programs of it are deregistered with it. A name with no
 * live model but a restart checkpoint (after a restart whose register was
 * refused: the file does not fit or cannot be read, checkpoint/save_load.h) has the
 * file removed. Neither: NOT_FOUND.
 *
 * Order: the model is marked dropping (no register binds to it, no acquire
 * finds it, autosave and SIGTERM skip it), its checkpoint writes are closed
 * and the file removed under the model's save_mu (a save in flight either
 * renamed its file before, and it is removed, or is refused after), and
 * only then does the name leave the registry, so a model created under it
 * again never sees the old file or loses its own.
 *
 * Threads: request threads. */
#ifndef PE_SERVER_MODEL_DROP_H
#define PE_SERVER_MODEL_DROP_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "server/server.h"

typedef struct pe_drop_result {
  bool freed;    /* a live model was dropped */
  int programs;  /* the caller's programs of it, deregistered */
  char *removed; /* malloc'd path of the restart checkpoint removed; NULL: none */
} pe_drop_result;

/* Drop model `name` for client (above). out->removed is set also when the
 * error comes after the removal; free it either way. */
pe_status *pe_model_drop(pe_server *s, uint64_t client, const char *name, pe_drop_result *out);

#endif
