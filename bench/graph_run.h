/* Static graph runner: the "static within a graph" half of scheduling
 * (the dependency engine is the "dynamic across graphs" half).
 *
 * A pe_dag is built once from an edge list: per node, its in-degree and
 * its successors (CSR arrays). A run re-arms one atomic counter per node by
 * copying the in-degrees (no allocation, no hash map per run), submits the
 * roots, and the worker that brings a successor's counter to zero runs
 * that successor itself next, queueing the other successors it made ready
 * to its own pool queue (where idle workers steal them).
 *
 * Errors: a node that fails marks its successors; a marked node is skipped
 * (fn is not called) and marks its own successors, so the run still
 * completes. The run returns the first failure.
 *
 * Threads: one run of a graph at a time (a second concurrent run returns
 * PE_EINVAL); use one graph per concurrent run. pe_dag_run blocks; from
 * a worker of the same pool it runs pool tasks while it waits. */
#ifndef PE_ENGINE_GRAPH_RUN_H
#define PE_ENGINE_GRAPH_RUN_H

#include "core/status.h"
#include "engine/threadpool.h"

typedef struct pe_dag pe_dag;

/* The work of node `node`; ctx is pe_dag_run's. Runs on a pool thread. */
typedef pe_status *(*pe_dag_fn)(void *ctx, int node);

/* Edge i goes from src[i] to dst[i] (dst runs after src). Fails with
 * PE_EINVAL on a bad index and PE_ECYCLE on a cycle. */
pe_status *pe_dag_new(int n_nodes, const int *src, const int *dst, int n_edges, pe_dag **out);
void pe_dag_free(pe_dag *g);
int pe_dag_nodes(const pe_dag *g);

/* Run every node once, each after all its predecessors; returns when all
 * are done, with the first failure (owned by the caller) or NULL. */
pe_status *pe_dag_run(pe_dag *g, pe_pool *pool, pe_dag_fn fn, void *ctx);

#endif
