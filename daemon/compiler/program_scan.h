/* Counting a ProgramDesc on its wire bytes, before protobuf-c unpacks it:
 * the unpack allocates a structure per entry (an empty op: 2 bytes on the
 * wire, over 100 bytes unpacked), so the counts a decode limits are checked
 * while nothing is allocated yet. The walk goes down to each op's fields
 * and skips everything below (names, arguments, attribute values) by its
 * length: linear in the bytes, no allocation. Threads: any. */
#ifndef PE_COMPILER_PROGRAM_SCAN_H
#define PE_COMPILER_PROGRAM_SCAN_H

#include "ir/program.h"

/* NULL when buf's blocks, ops, variables and each op's input slots, output
 * slots and attributes are within lim's bounds. Else PE_EINVAL: "ProgramDesc:
 * N ops in its B block(s), over the limit KEY = M" (variables alike),
 * "ProgramDesc: block B: op #I: N attributes, over the limit of M per op"
 * (slots alike), or
 * "malformed ProgramDesc" when the walk cannot read the bytes
 * (core/pb_wire.h). */
pe_status *pe_program_scan(const uint8_t *buf, size_t len, const pe_decode_limits *lim);

#endif
