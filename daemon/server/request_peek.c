/* Reading a request's client id and body kind off its wire bytes (see
 * request_peek.h). */
#include "server/request_peek.h"

#include <string.h>

enum { WIRE_VARINT = 0, WIRE_I64 = 1, WIRE_LEN = 2, WIRE_I32 = 5 };
enum { FIELD_CLIENT_ID = 1, FIELD_RUN_HANDLE = 1 };

/* A varint at *p (< end); advances *p. false: truncated or over 10 bytes. */
static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  uint64_t x = 0;
  for (int shift = 0; shift < 70 && *p < end; shift += 7) {
    uint8_t b = *(*p)++;
    x |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = x;
      return true;
    }
  }
  return false;
}

/* Whether field number f is one of Request's body fields (its oneof, as
 * the generated descriptor says: a body added to the proto is one too). */
static bool is_body_field(uint64_t f) {
  if (f > UINT32_MAX) return false;
  const ProtobufCFieldDescriptor *fd =
      protobuf_c_message_descriptor_get_field(&pe__request__descriptor, (unsigned)f);
  return fd && (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF);
}

/* Past a field's value of wire type `wire` at *p (< end), the value of a
 * varint in *v; false: truncated or a wire type unpack refuses. */
static bool skip_value(const uint8_t **p, const uint8_t *end, uint64_t wire, uint64_t *v) {
  *v = 0;
  switch (wire) {
    case WIRE_VARINT: return read_varint(p, end, v);
    case WIRE_LEN:
      if (!read_varint(p, end, v) || *v > (uint64_t)(end - *p)) return false;
      *p += *v;
      return true;
    case WIRE_I64:
      if (end - *p < 8) return false;
      *p += 8;
      return true;
    case WIRE_I32:
      if (end - *p < 4) return false;
      *p += 4;
      return true;
    default: /* groups (3, 4) and 6, 7: unpack refuses them as well */ return false;
  }
}

/* The handle of a RunRequest's bytes, its top level walked as the
 * Request's; *h unchanged when it has none or is unreadable (its thread
 * then answers the decode error). */
static void peek_run_handle(const uint8_t *p, const uint8_t *end, uint64_t *h) {
  uint64_t got = *h;
  while (p < end) {
    uint64_t key, v;
    if (!read_varint(&p, end, &key) || !skip_value(&p, end, key & 7, &v)) return;
    if (key >> 3 == FIELD_RUN_HANDLE && (key & 7) == WIRE_VARINT) got = v;
  }
  *h = got;
}

bool pe_request_peek_read(const uint8_t *buf, size_t len, pe_request_peek *out) {
  memset(out, 0, sizeof *out);
  const uint8_t *p = buf, *end = buf + len;
  pe_request_peek got = {0};
  while (p < end) {
    uint64_t key, v;
    if (!read_varint(&p, end, &key)) return false;
    uint64_t field = key >> 3;
    if (!skip_value(&p, end, key & 7, &v)) return false;
    if (field == FIELD_CLIENT_ID && (key & 7) == WIRE_VARINT) got.client = v;
    if (field == PE__REQUEST__BODY_RUN && (key & 7) == WIRE_LEN) {
      got.run_handle = 0; /* unpack keeps the last run body whole */
      peek_run_handle(p - v, p, &got.run_handle);
    }
    if (field == 0) return false;
    if (is_body_field(field)) got.kind = (Pe__Request__BodyCase)field;
  }
  *out = got;
  return true;
}
