/* The NCCL-across-nodes plan and its id on the wire (nccl_nodes.h): no
 * CUDA call here, so the suites test it without a GPU. */
#include <string.h>

#include "cuda/nccl_nodes.h"

static const char magic[8] = {'P', 'E', 'N', 'C', 'C', 'L', '1', 0};

pe_status *pe_nccl_nodes_plan_make(int node_rank, int nodes, const int *gpus, int local,
                                   pe_nccl_nodes_plan *out) {
  if (nodes < 2 || nodes > 4096)
    return pe_error(PE_EINVAL, "nccl across nodes: %d nodes is outside 2..4096", nodes);
  if (node_rank < 0 || node_rank >= nodes)
    return pe_error(PE_EINVAL, "nccl across nodes: node rank %d is outside 0..%d", node_rank,
                    nodes - 1);
  if (local < 1 || local > PE_MAX_PLACES)
    return pe_error(PE_EINVAL, "nccl across nodes: %d cuda places on node rank %d (1..%d)", local,
                    node_rank, PE_MAX_PLACES);
  for (int p = 0; p < local; p++) {
    if (gpus[p] < 0)
      return pe_error(PE_EINVAL, "nccl across nodes: place %d is cuda:%d", p, gpus[p]);
    for (int q = 0; q < p; q++)
      if (gpus[q] == gpus[p])
        return pe_error(PE_EINVAL, "nccl across nodes: places %d and %d are both cuda:%d", q, p,
                        gpus[p]);
  }
  *out = (pe_nccl_nodes_plan){
      .nodes = nodes, .nccl_rank = node_rank, .lead_place = 0, .lead_gpu = gpus[0], .local = local};
  return NULL;
}

static void put_u32(uint8_t *b, uint32_t v) {
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *b) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)b[i] << (8 * i);
  return v;
}

void pe_nccl_nodes_id_encode(const pe_nccl_nodes_plan *p, const uint8_t id[PE_NCCL_ID_BYTES],
                             uint8_t wire[PE_NCCL_NODES_ID_WIRE]) {
  memcpy(wire, magic, sizeof magic);
  put_u32(wire + 8, (uint32_t)p->nodes);
  put_u32(wire + 12, 0);
  memcpy(wire + 16, id, PE_NCCL_ID_BYTES);
}

pe_status *pe_nccl_nodes_id_decode(const pe_nccl_nodes_plan *p, const uint8_t *wire, size_t len,
                                   uint8_t id[PE_NCCL_ID_BYTES]) {
  if (len != PE_NCCL_NODES_ID_WIRE)
    return pe_error(PE_EINVAL,
                    "nccl across nodes: rank 0's id is %zu bytes, node rank %d expects %d", len,
                    p->nccl_rank, PE_NCCL_NODES_ID_WIRE);
  if (memcmp(wire, magic, sizeof magic))
    return pe_error(PE_EINVAL,
                    "nccl across nodes: rank 0's id is not a pe NCCL id (another build of pe?)");
  uint32_t nodes = get_u32(wire + 8);
  if (nodes != (uint32_t)p->nodes)
    return pe_error(
        PE_EINVAL, "nccl across nodes: rank 0's id is for %u nodes, node rank %d is in a job of %d",
        nodes, p->nccl_rank, p->nodes);
  memcpy(id, wire + 16, PE_NCCL_ID_BYTES);
  return NULL;
}
