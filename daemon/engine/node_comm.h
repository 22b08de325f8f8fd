/* Collectives across the nodes of a job (several daemons, one per machine,
 * training one model data-parallel).
 *
 * The engine names no network library: the daemon's job (server/job/)
 * fills this table with its communicator (daemon/net: Gloo over TCP) and
 * attaches it to the model (pe_model_set_node_comm). A training graph of
 * that model then sums every gradient over the nodes after summing it over
 * the node's places, in the gradient's all-reduce node (parallel/cross.c),
 * so the exchange overlaps the rest of the backward pass as within a node.
 *
 * Every node runs the same graph, so the nodes issue their all-reduces in
 * the same order: the node's all-reduce nodes by node id.
 *
 * Threading: all_reduce is called from one thread at a time per table (the
 * executor serialises them); fail may be called from any thread. */
#ifndef PE_ENGINE_NODE_COMM_H
#define PE_ENGINE_NODE_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "core/place.h"
#include "core/status.h"

typedef struct pe_device pe_device;

typedef struct pe_node_comm {
  void *ctx; /* the implementation's */
  int rank;  /* this node, 0 .. world-1 */
  int world; /* nodes in the job, >= 2 */
  /* Sums each bufs[i][0..counts[i]) over the nodes, in place, as one
   * collective; every node gets the same bits. An error names the peer
   * that failed where it is known; the communicator is broken after it. */
  pe_status *(*all_reduce)(void *ctx, float *const *bufs, const size_t *counts, int nbuf);
  /* This node gives up on the step (its own part failed): the peers must
   * not wait for it. Breaks the communicator; why is for the peers' and the
   * log's messages. */
  void (*fail)(void *ctx, const char *why);
} pe_node_comm;

/* A backend's node communicator for models on its places (daemon/cuda
 * registers NCCL's over the nodes' lead GPUs): the job calls make_id on
 * rank 0, hands the id to every node through its rendezvous store, then
 * every node calls open. A place kind without one trains in a job over
 * the job's own communicator (host buffers: cpu places).
 *
 * Written by the backend's registration before threads start, read-only
 * afterwards. */
typedef struct pe_node_comm_backend {
  size_t id_bytes; /* the id as it travels */
  /* Rank 0: a new id for a job of `nodes` nodes. */
  pe_status *(*make_id)(int nodes, void *id);
  /* Joins the communicator: devs are the model's n_places devices (place
   * p is devs[p]); blocks until every node joined or timeout_ms. On
   * success *table is the node_comm (close frees it). */
  pe_status *(*open)(pe_device *const *devs, int n_places, int rank, int nodes, const void *id,
                     size_t id_len, int timeout_ms, pe_node_comm *table);
  void (*close)(pe_node_comm *table);
} pe_node_comm_backend;

/* How a model's gradients cross the nodes of a job. */
typedef enum pe_node_comm_path {
  PE_NODE_COMM_HOST,   /* the job's communicator on the places' host buffers (cpu) */
  PE_NODE_COMM_DEVICE, /* the backend's on place 0's device buffers, after the sum
                        * over the node's places; then spread to the other places on
                        * their comm streams */
} pe_node_comm_path;

/* The path of a model on n_places places of kind (streams: the places run
 * kernels on streams; has_device_comm: the job opened the kind's backend
 * communicator). Refuses, naming the places, what no path serves: cpu
 * places on streams (sim) and a kind without a backend communicator. */
pe_status *pe_node_comm_path_of(pe_place_kind kind, int n_places, bool streams,
                                bool has_device_comm, pe_node_comm_path *out);

void pe_node_comm_register_backend(pe_place_kind kind, const pe_node_comm_backend *b);
/* NULL: the kind has none. */
const pe_node_comm_backend *pe_node_comm_backend_of(pe_place_kind kind);

#endif
