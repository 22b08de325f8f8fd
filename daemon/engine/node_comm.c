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

pe_status *pe_node_comm_path_of(pe_place_kind kind, int n_places, bool streams,
                                bool has_device_comm, pe_node_comm_path *out) {
  if (kind == PE_PLACE_CPU && !streams) {
    *out = PE_NODE_COMM_HOST;
    return NULL;
  }
  if (kind != PE_PLACE_CPU && streams && has_device_comm) {
    *out = PE_NODE_COMM_DEVICE;
    return NULL;
  }
  const char *name = pe_place_kind_name(kind);
  if (kind != PE_PLACE_CPU && pe_node_comm_backend_of(kind))
    return pe_error(PE_EINVAL,
                    "job across nodes: the model lives on %s:%d and the job opened no %s "
                    "communicator across nodes (register with the job spec again)",
                    name, n_places, name);
  return pe_error(PE_EINVAL,
                  "job across nodes: the model lives on %s:%d; a job sums its gradients across "
                  "nodes from cpu places, or from places whose backend has a communicator across "
                  "nodes (cuda with NCCL); %s has none in this daemon",
                  name, n_places, name);
}
