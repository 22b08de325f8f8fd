/* Request handlers: one per request kind, chosen from a table by the
 * Request's body case. A handler fills the Reply's body; the dispatcher
 * fills client/request ids, the code and the message from the handler's
 * status (errors as values: a failed handler is an error reply, never a
 * crash, and leaves the daemon serving).
 *
 * Reply memory: everything a handler hangs off the Reply is allocated from
 * a pe_arena and freed in one go after the reply is packed. */
#ifndef PE_SERVER_DISPATCH_H
#define PE_SERVER_DISPATCH_H

#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"
#include "server/server.h"
#include "service.pb-c.h"

/* A handler's error when the reply cannot be built. */
#define PE_REPLY_OOM(what) pe_error(PE_ENOMEM, "%s: out of memory building the reply", what)

/* The request a handler serves: it fills rep's body, allocating from a. */
typedef struct pe_request_ctx {
  pe_server *s;
  const Pe__Request *rq;
  Pe__Reply *rep;
  pe_arena *a;
  double received; /* monotonic seconds, when read off the socket */
  pe_lane lane;    /* the lane whose thread handles it */
} pe_request_ctx;

/* Handle a decoded request; `received` is when it was read off the socket
 * (monotonic seconds, for queue time), lane the lane it was taken from. rep
 * must be PE__REPLY__INIT'd. */
void pe_dispatch(pe_server *s, const Pe__Request *rq, double received, pe_lane lane, Pe__Reply *rep,
                 pe_arena *a);

/* Name of a request kind, for logs ("run", "register", ...). */
const char *pe_request_kind_name(Pe__Request__BodyCase c);

/* The lane a request kind is queued in (lanes.h); unknown kinds: work. */
pe_lane pe_request_lane(Pe__Request__BodyCase c);

/* Fill StatusReply (status.c) for a Status of client `asker` taken from
 * `lane`; PE_LANES (asker 0): for a reader that is no request (the
 * metrics endpoint's thread), which no lane counts. */
pe_status *pe_status_fill(pe_server *s, pe_lane lane, uint64_t asker, Pe__StatusReply *out,
                          pe_arena *a);

#endif
