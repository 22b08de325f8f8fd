/* The backends' node communicators by place kind (node_comm.h). */
#include "engine/node_comm.h"

/* Written by the backends' registrations before threads start. */
static const pe_node_comm_backend *backends[PE_PLACE_KINDS];

void pe_node_comm_register_backend(pe_place_kind kind, const pe_node_comm_backend *b) {
  if ((unsigned)kind < PE_PLACE_KINDS) backends[kind] = b;
}

const pe_node_comm_backend *pe_node_comm_backend_of(pe_place_kind kind) {
  return (unsigned)kind < PE_PLACE_KINDS ? backends[kind] : NULL;
}
