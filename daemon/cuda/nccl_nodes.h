/* NCCL across the nodes of a job, for models on cuda places
 * (engine/node_comm.h's table, filled from daemon/cuda).
 *
 * Design: two levels. The executor sums each gradient over the node's own
 * places first (the node's NCCL communicator, nccl_comm.h, over NVLink or
 * PCIe), then hands place 0's buffer to the node communicator; here one
 * NCCL communicator joins the nodes' lead GPUs (each node's place 0), NCCL
 * rank = node rank, world = nodes. This keeps node_comm's contract (rank
 * and world are the job's nodes, the sum lands in place 0's buffer and the
 * executor copies it to the other places) and leaves the intra-node
 * communicator as it is; the traffic between nodes is one gradient per
 * node per step over the lead GPU's network path. A flat communicator over
 * every GPU of every node would let each GPU use its own NIC (rail-optimised
 * clusters), but would replace the intra-node sum and need every place's
 * thread in one cross-node collective; the executor does not work that way.
 *
 * The communicator's id (ncclUniqueId) is made by rank 0's daemon
 * (pe_nccl_nodes_new_id) and handed out through the job's rendezvous store
 * (pe_gloo_shared of daemon/net/gloo_comm.h; the job's key is server/job's,
 * the GPU suites' PE_NCCL_NODES_ID_KEY): only
 * ranks the job's token admitted read it, and an id of another length or
 * for another number of nodes is refused (pe_nccl_nodes_id_decode).
 *
 * Failures never hang or abort: initialisation and every all-reduce run
 * non-blocking and are polled (ncclCommGetAsyncError) up to the job's
 * timeout; an error, the timeout or fail() aborts the communicator
 * (ncclCommAbort), after which every call fails.
 *
 * Threading: all_reduce from one thread at a time (node_comm.h); fail from
 * any thread. */
#ifndef PE_CUDA_NCCL_NODES_H
#define PE_CUDA_NCCL_NODES_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "engine/device.h"
#include "engine/node_comm.h"

/* ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES; nccl_nodes.c checks it). */
#define PE_NCCL_ID_BYTES 128
/* The id as it travels: magic, the job's number of nodes, the id. */
#define PE_NCCL_NODES_ID_WIRE (8 + 4 + 4 + PE_NCCL_ID_BYTES)
/* Its key in the GPU suites' stores (the daemon's job has its own). */
#define PE_NCCL_NODES_ID_KEY "nccl-nodes-id"

/* Who joins the NCCL communicator across nodes, from this node's view. */
typedef struct pe_nccl_nodes_plan {
  int nodes;      /* the job's nodes: the communicator's world */
  int nccl_rank;  /* this node's rank in it: its node rank */
  int lead_place; /* the local place whose GPU joins: 0 */
  int lead_gpu;   /* that place's cuda device id */
  int local;      /* this node's cuda places (summed locally first) */
} pe_nccl_nodes_plan;

/* The plan of node node_rank of nodes, whose model lives on the cuda
 * devices gpus[0..local) (place p is cuda:gpus[p]). Refuses ranks out of
 * range, no places, and a GPU given twice. */
pe_status *pe_nccl_nodes_plan_make(int node_rank, int nodes, const int *gpus, int local,
                                   pe_nccl_nodes_plan *out);

/* The id for the wire (rank 0) and back (every other rank): decode
 * refuses another length, a wrong magic and another number of nodes,
 * naming what differs. */
void pe_nccl_nodes_id_encode(const pe_nccl_nodes_plan *p, const uint8_t id[PE_NCCL_ID_BYTES],
                             uint8_t wire[PE_NCCL_NODES_ID_WIRE]);
pe_status *pe_nccl_nodes_id_decode(const pe_nccl_nodes_plan *p, const uint8_t *wire, size_t len,
                                   uint8_t id[PE_NCCL_ID_BYTES]);

/* --- the communicator (needs a GPU) --- */

typedef struct pe_nccl_nodes pe_nccl_nodes;

/* Rank 0: a new ncclUniqueId. */
pe_status *pe_nccl_nodes_new_id(uint8_t id[PE_NCCL_ID_BYTES]);

/* Joins the communicator on lead (the plan's lead place's device; its comm
 * stream carries the collectives): blocks until every node joined, or
 * timeout_ms. *table is the node_comm table (ctx = *out). */
pe_status *pe_nccl_nodes_new(pe_device *lead, const pe_nccl_nodes_plan *p,
                             const uint8_t id[PE_NCCL_ID_BYTES], int timeout_ms,
                             pe_node_comm *table, pe_nccl_nodes **out);

/* Waits for nothing (an all-reduce in flight must have returned). */
void pe_nccl_nodes_free(pe_nccl_nodes *c);

/* The engine's backend for cuda places (node_comm_cuda.c; register.c
 * registers it): make_id and open over the functions above. */
extern const pe_node_comm_backend pe_cuda_node_comm_backend;

#endif
