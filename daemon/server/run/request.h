/* The Run request (service.proto RunRequest): the program's feeds checked
 * against its declaration, then `steps` runs on the same feeds or one step
 * per mini-batch (`batches`, run/batches.h), each stop between two steps
 * checked (run/cancel.h), and the fetches of the last step (or every
 * step's, stacked) in the reply. A resend of a run that already reached the
 * model is refused (PE_EALREADY).
 *
 * Threads: a request thread; the program is acquired for the run, which
 * the server's run table lists (Status: runs, with the steps done). */
#ifndef PE_SERVER_RUN_REQUEST_H
#define PE_SERVER_RUN_REQUEST_H

#include "server/dispatch.h"

/* The handler of a Run request (pe_dispatch's table); fills rep's body. */
pe_status *pe_run_request(pe_request_ctx *c);

#endif
