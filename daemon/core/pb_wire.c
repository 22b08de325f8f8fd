/* One protobuf field off wire bytes (see pb_wire.h). */
#include "core/pb_wire.h"

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

bool pe_pb_next(const uint8_t **p, const uint8_t *end, pe_pb_field *f) {
  const uint8_t *start = *p;
  uint64_t key;
  if (!read_varint(p, end, &key) || *p - start > 5 || key >> 3 == 0) return false;
  *f = (pe_pb_field){.number = (uint32_t)(key >> 3), .wire = (int)(key & 7)};
  switch (f->wire) {
    case PE_PB_VARINT: return read_varint(p, end, &f->varint);
    case PE_PB_LEN:
      if (!read_varint(p, end, &f->varint) || f->varint > (uint64_t)(end - *p)) return false;
      f->data = *p;
      f->len = (size_t)f->varint;
      *p += f->len;
      return true;
    case PE_PB_I64:
      if (end - *p < 8) return false;
      *p += 8;
      return true;
    case PE_PB_I32:
      if (end - *p < 4) return false;
      *p += 4;
      return true;
    default: /* groups (3, 4) and 6, 7: protobuf-c refuses them as well */ return false;
  }
}
