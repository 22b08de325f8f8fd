/* Walking protobuf wire bytes without decoding them: one field at a time,
 * a length-delimited value skipped by its length, so a walk costs the
 * fields of the level walked, not the bytes below it. The main thread
 * reads a request's routing this way (server/request_peek.h), and a
 * Register's ProgramDesc is counted this way before protobuf-c allocates
 * anything for it (compiler/program_scan.c).
 *
 * Keys are read as protobuf-c reads them: at most 5 bytes. What this walk
 * refuses (truncation, a varint over 10 bytes, a key over 5 bytes, groups
 * and unknown wire types, which protobuf-c refuses too, and field number
 * 0, which protobuf-c skips when its key has two bytes or more) callers
 * refuse as malformed, so a walk never reads other fields than the decode.
 * Threads: any; no state. */
#ifndef PE_CORE_PB_WIRE_H
#define PE_CORE_PB_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { PE_PB_VARINT = 0, PE_PB_I64 = 1, PE_PB_LEN = 2, PE_PB_I32 = 5 };

typedef struct pe_pb_field {
  uint32_t number;
  int wire;            /* PE_PB_* */
  uint64_t varint;     /* PE_PB_VARINT: the value; PE_PB_LEN: len */
  const uint8_t *data; /* PE_PB_LEN: the value's bytes */
  size_t len;
} pe_pb_field;

/* The field at *p (< end) into f, *p past it. false: unreadable (above). */
bool pe_pb_next(const uint8_t **p, const uint8_t *end, pe_pb_field *f);

#endif
