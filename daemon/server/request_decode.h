/* A request thread's decode of a received request: protobuf-c's unpack
 * within a decode budget (decode_budget.h), accepted only when it decodes
 * to the client, body kind and run handle the main thread routed it on
 * (request_peek.h). Anything else is refused before a handler, the reply
 * cache or the session table sees it. Threads: any. */
#ifndef PE_SERVER_REQUEST_DECODE_H
#define PE_SERVER_REQUEST_DECODE_H

#include "server/decode_budget.h"
#include "server/request_peek.h"

/* buf[0..len) decoded through b into *out (free it with
 * pe__request__free_unpacked(*out, &b->alloc)). routed: what the peek
 * read (NULL: the peek refused the bytes, which are then not decoded).
 * Errors: PE_EINVAL "malformed request: ..." (unreadable bytes, or fields
 * other than the routing's), or the budget's (decode_budget.h). */
pe_status *pe_request_decode(const uint8_t *buf, size_t len, const pe_request_peek *routed,
                             pe_decode_budget *b, Pe__Request **out);

#endif
