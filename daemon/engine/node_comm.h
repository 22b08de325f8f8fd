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

#include <stddef.h>

#include "core/status.h"

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

#endif
