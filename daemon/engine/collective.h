/* In-process collectives across the places of a group (the cpu and sim
 * stand-in for NCCL): all-reduce (sum, mean) and broadcast of f32 buffers
 * in host memory.
 *
 * Per-place API. A group (pe_comm) has n ranks, one per place. Each rank
 * calls its own part with its own buffer; the parts of one operation
 * rendezvous by op_id, so the executor launches one piece per place: on
 * sim, pe_coll_part_run on that place's comm stream; on cpu, a direct call
 * on the pool thread that runs the place's op.
 *
 * Algorithm (all-reduce): the buffer is cut into n chunks (cache-line
 * aligned; trailing ranks may get none when the buffer is small).
 *   1. every rank registers its buffer and waits for the others;
 *   2. reduce-scatter: rank p sums chunk p of all n buffers, in rank order
 *      (so every place gets bit-identical results), divides for MEAN, and
 *      writes it into chunk p of its own buffer;
 *   3. barrier; all-gather: rank p copies chunk q from rank q's buffer for
 *      every q != p;
 *   4. barrier, so no buffer is reused while a peer still reads it.
 * Each rank reads about the whole buffer once and writes it once, all ranks
 * at the same time: the work is spread over the places and bounded by
 * memory bandwidth. Broadcast: register, every non-root rank copies the
 * root's buffer into its own, barrier. A fused all-reduce is the same call
 * on a bigger buffer.
 *
 * Rendezvous. Parts meet in a slot keyed by op_id; the slot's barriers are
 * generation-counted (a waiter sleeps until the generation it saw changes,
 * so a fast rank starting the next barrier cannot confuse a slow one).
 * Several operations of one group may be in flight at once (different
 * op_ids, e.g. one per gradient, or run_seq << 32 | op index); an op_id may
 * be reused once every rank has returned from the previous use. All parts
 * of one operation must pass the same kind, count, reduction and root;
 * a mismatch fails every part with PE_EINVAL (none blocks forever).
 *
 * Blocking. A part blocks its thread until all n parts have arrived, so
 * the n parts of an operation must be able to run at the same time:
 *  - on one stream, parts must be queued in the same order on every rank
 *    (NCCL's rule): a rank's comm stream runs op A's part before op B's,
 *    so if another rank queued B before A, both wait forever;
 *  - on cpu, the calling threads (pool workers) must not be all taken by
 *    parts of different operations; the executor orders all-reduces or
 *    leaves enough workers.
 * Everything here is thread-safe. */
#ifndef PE_ENGINE_COLLECTIVE_H
#define PE_ENGINE_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef enum pe_reduce_op { PE_REDUCE_SUM = 0, PE_REDUCE_MEAN = 1 } pe_reduce_op;
typedef enum pe_coll_kind { PE_COLL_ALLREDUCE = 0, PE_COLL_BROADCAST = 1 } pe_coll_kind;

typedef struct pe_comm pe_comm;

/* A group of n ranks (1 <= n <= PE_MAX_PLACES). */
pe_status *pe_comm_new(int n, pe_comm **out);
/* No part may be in flight. NULL is a no-op. */
void pe_comm_free(pe_comm *c);
int pe_comm_size(const pe_comm *c);

/* Rank `rank`'s part of all-reduce op_id over buf[0..count). Returns when
 * buf holds the reduction (and every peer is done reading buf). */
pe_status *pe_allreduce_part(pe_comm *c, uint64_t op_id, int rank, float *buf, size_t count,
                             pe_reduce_op op);
/* Rank `rank`'s part of broadcast op_id: every buf becomes root's buf. */
pe_status *pe_broadcast_part(pe_comm *c, uint64_t op_id, int rank, int root, float *buf,
                             size_t count);

/* One part as data, to launch on a stream:
 *   pe_stream_launch(comm_stream_of_rank, pe_coll_part_run, &part)
 * The caller owns `part` and keeps it alive until the stream ran it. */
typedef struct pe_coll_part {
  pe_comm *comm;
  uint64_t op_id;
  int rank;
  pe_coll_kind kind;
  pe_reduce_op red; /* all-reduce */
  int root;         /* broadcast */
  float *buf;
  size_t count;
} pe_coll_part;

/* A pe_stream_fn: runs the part described by arg (a pe_coll_part *). */
pe_status *pe_coll_part_run(void *arg);

const char *pe_reduce_op_name(pe_reduce_op op);

#endif
