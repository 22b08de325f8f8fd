/* Reading a request's client id and body kind off its wire bytes (see
 * request_peek.h). */
#include "server/request_peek.h"

#include <string.h>

#include "core/pb_wire.h"

enum { FIELD_CLIENT_ID = 1, FIELD_REQUEST_ID = 2, FIELD_RUN_HANDLE = 1 };

/* Whether field number f is one of Request's body fields (its oneof, as
 * the generated descriptor says: a body added to the proto is one too). */
static bool is_body_field(uint32_t f) {
  const ProtobufCFieldDescriptor *fd =
      protobuf_c_message_descriptor_get_field(&pe__request__descriptor, f);
  return fd && (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF);
}

/* The handle of a RunRequest's bytes into *h (unchanged when it has
 * none), its top level walked as the Request's. false: unreadable, and so
 * is the request. */
static bool peek_run_handle(const uint8_t *p, const uint8_t *end, uint64_t *h) {
  pe_pb_field f;
  while (p < end) {
    if (!pe_pb_next(&p, end, &f)) return false;
    if (f.number == FIELD_RUN_HANDLE && f.wire == PE_PB_VARINT) *h = f.varint;
  }
  return true;
}

bool pe_request_peek_read(const uint8_t *buf, size_t len, pe_request_peek *out) {
  memset(out, 0, sizeof *out);
  const uint8_t *p = buf, *end = buf + len;
  pe_request_peek got = {0};
  pe_pb_field f;
  while (p < end) {
    if (!pe_pb_next(&p, end, &f)) return false;
    if (f.number == FIELD_CLIENT_ID && f.wire == PE_PB_VARINT) got.client = f.varint;
    if (f.number == FIELD_REQUEST_ID && f.wire == PE_PB_VARINT) got.request = f.varint;
    if (is_body_field(f.number)) {
      got.kind = (Pe__Request__BodyCase)f.number;
      got.run_handle = 0; /* unpack keeps the last body whole */
    }
    if (f.number == PE__REQUEST__BODY_RUN && f.wire == PE_PB_LEN &&
        !peek_run_handle(f.data, f.data + f.len, &got.run_handle))
      return false;
  }
  *out = got;
  return true;
}

bool pe_request_peek_matches(const pe_request_peek *pk, const Pe__Request *rq) {
  uint64_t handle = rq->body_case == PE__REQUEST__BODY_RUN && rq->run ? rq->run->handle : 0;
  return pk->client == rq->client_id && pk->request == rq->request_id &&
         pk->kind == rq->body_case && pk->run_handle == handle;
}

bool pe_request_peek_agrees(const uint8_t *buf, size_t len) {
  pe_request_peek pk;
  if (!pe_request_peek_read(buf, len, &pk)) return true; /* refused: never decoded */
  Pe__Request *rq = pe__request__unpack(NULL, len, buf);
  bool agree = !rq || pe_request_peek_matches(&pk, rq);
  if (rq) pe__request__free_unpacked(rq, NULL);
  return agree;
}
