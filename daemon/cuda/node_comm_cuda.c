/* NCCL across nodes behind the engine's node communicator backend
 * (engine/node_comm.h), for cuda places: the id is nccl_nodes.h's wire
 * record, the communicator joins place 0's GPU of every node. */
#include <stdlib.h>

#include "cuda/nccl_nodes.h"

static pe_status *make_id(int nodes, void *id) {
  int gpu0 = 0; /* the plan of rank 0; only its number of nodes travels */
  pe_nccl_nodes_plan p;
  PE_TRY(pe_nccl_nodes_plan_make(0, nodes, &gpu0, 1, &p));
  uint8_t raw[PE_NCCL_ID_BYTES];
  PE_TRY(pe_nccl_nodes_new_id(raw));
  pe_nccl_nodes_id_encode(&p, raw, id);
  return NULL;
}

static pe_status *open_comm(pe_device *const *devs, int n_places, int rank, int nodes,
                            const void *id, size_t id_len, int timeout_ms, pe_node_comm *table) {
  if (n_places < 1 || n_places > PE_MAX_PLACES)
    return pe_error(PE_EINVAL, "nccl across nodes: %d places (1..%d)", n_places, PE_MAX_PLACES);
  int gpus[PE_MAX_PLACES];
  for (int p = 0; p < n_places; p++) {
    if (devs[p]->place.kind != PE_PLACE_CUDA)
      return pe_error(PE_EINVAL, "nccl across nodes: place %d is not a cuda place", p);
    gpus[p] = devs[p]->place.id;
  }
  pe_nccl_nodes_plan plan;
  PE_TRY(pe_nccl_nodes_plan_make(rank, nodes, gpus, n_places, &plan));
  uint8_t raw[PE_NCCL_ID_BYTES];
  PE_TRY(pe_nccl_nodes_id_decode(&plan, id, id_len, raw));
  pe_nccl_nodes *c;
  return pe_nccl_nodes_new(devs[plan.lead_place], &plan, raw, timeout_ms, table, &c);
}

static void close_comm(pe_node_comm *table) {
  pe_nccl_nodes_free(table->ctx);
}

const pe_node_comm_backend pe_cuda_node_comm_backend = {
    .id_bytes = PE_NCCL_NODES_ID_WIRE,
    .make_id = make_id,
    .open = open_comm,
    .close = close_comm,
};
