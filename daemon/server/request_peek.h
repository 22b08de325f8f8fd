/* What the main thread reads off a request's bytes before any request
 * thread decodes it: the client id and the body's kind, so that it can
 * queue the request in its lane (server.h: pe_lane) without unpacking it.
 *
 * Only the top level of proto/service.proto's Request is walked: varints
 * are read, length-delimited fields (a RunRequest's feeds) are skipped by
 * their length, so the cost does not grow with the request's size. As
 * protobuf-c's unpack does for a oneof, the last body field wins (and the
 * handle of the last Run body: unpack keeps that one whole). Keys are read
 * as protobuf-c reads them (at most 5 bytes). A message the walk cannot
 * read (truncated, a group or an unknown wire type, a key over 5 bytes,
 * field number 0, which protobuf-c skips when its key has more than one
 * byte; the same in a Run body's top level) is reported as such; the daemon answers it as malformed
 * and never decodes it.
 *
 * The routing and the decode must agree: a request thread compares what
 * unpack decoded with what the main thread routed on
 * (pe_request_peek_matches) and refuses a request where they differ, so
 * that no message is handled in another lane or as another client than
 * its fields say (request_decode.h).
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
  uint64_t request;           /* Request.request_id; 0 when absent */
} pe_request_peek;

/* false: the bytes are not a readable protobuf message (out is zeroed). */
bool pe_request_peek_read(const uint8_t *buf, size_t len, pe_request_peek *out);

/* Whether rq, as unpack decoded it, has the client id, request id, body
 * kind and run handle that pk read off its bytes. */
bool pe_request_peek_matches(const pe_request_peek *pk, const Pe__Request *rq);

/* The differential check for fuzzers: false only when both the peek and
 * protobuf-c's unpack (default allocator) read buf and they differ in
 * client id, request id, body kind or run handle. Where the peek refuses buf the
 * daemon never decodes it, and where unpack refuses it the daemon answers
 * a decode error, so those count as agreeing. The daemon refuses every
 * message for which this is false (pe_request_decode); a fuzzer finding
 * one has found a peek that differs from protobuf-c. */
bool pe_request_peek_agrees(const uint8_t *buf, size_t len);

#endif
