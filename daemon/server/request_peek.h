/* What the main thread reads off a request's bytes before any request
 * thread decodes it: the client id and the body's kind, so that it can
 * queue the request in its lane (server.h: pe_lane) without unpacking it.
 *
 * Only the top level of proto/service.proto's Request is walked: varints
 * are read, length-delimited fields (a RunRequest's feeds) are skipped by
 * their length, so the cost does not grow with the request's size. As
 * protobuf-c's unpack does for a oneof, the last body field wins (and the
 * handle of the last Run body: unpack keeps that one whole). A message
 * the walk cannot read (truncated, a group or an unknown wire type) is
 * reported as such; its request thread then answers the decode error.
 * Threads: any; no shared state. */
#ifndef PE_SERVER_REQUEST_PEEK_H
#define PE_SERVER_REQUEST_PEEK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "service.pb-c.h"

typedef struct pe_request_peek {
  uint64_t client;            /* Request.client_id; 0 when absent */
  Pe__Request__BodyCase kind; /* PE__REQUEST__BODY__NOT_SET when absent */
  uint64_t run_handle;        /* a Run's RunRequest.handle (its top level walked too); else 0 */
} pe_request_peek;

/* false: the bytes are not a readable protobuf message (out is zeroed). */
bool pe_request_peek_read(const uint8_t *buf, size_t len, pe_request_peek *out);

#endif
