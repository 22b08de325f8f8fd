/* NCCL collectives over the daemon's GPUs (one process, one rank per GPU).
 *
 * The communicator is made once over the opened cuda devices
 * (ncclCommInitAll); rank r is devs[r]. Every operation is enqueued on the
 * rank's comm stream (PE_STREAM_COMM of its device), so it overlaps the
 * compute stream; the executor orders it against producers and consumers
 * with events like any other stream work (pe_device_sync_dep).
 *
 * Two ways to call, for the two shapes of a collective step:
 *  - Grouped (one thread for all ranks): pe_nccl_allreduce,
 *    pe_nccl_allreduce_bucket, pe_nccl_broadcast enqueue every rank's part
 *    inside one ncclGroupStart/ncclGroupEnd. Use this from a single
 *    coordinating thread (NCCL needs the group when one thread drives
 *    several GPUs, else the first call can block forever).
 *  - Per rank (pe_nccl_allreduce_part): each place's own thread enqueues
 *    its part, like collective.h's pe_coll_part_run; all ranks must then
 *    enqueue their parts concurrently and in the same order.
 *
 * Errors never hang or abort the process: enqueue failures are statuses;
 * device-side and network errors are seen by pe_nccl_wait, which polls
 * ncclCommGetAsyncError while the comm streams run, and on an error or a
 * timeout aborts the communicator (ncclCommAbort) and returns a status.
 * An aborted communicator fails every later call; make a new one.
 *
 * Buffers are device memory of the rank's GPU; counts are elements. The
 * reduction is in place (send == recv). Threading: the grouped calls and
 * wait may be called from any one thread at a time; parts from one thread
 * per rank. */
#ifndef PE_CUDA_NCCL_COMM_H
#define PE_CUDA_NCCL_COMM_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"
#include "engine/collective.h" /* pe_reduce_op */
#include "engine/device.h"

typedef struct pe_nccl_comm pe_nccl_comm;

/* devs: n opened cuda devices on distinct GPUs (n >= 1). */
pe_status *pe_nccl_comm_new(pe_device *const *devs, int n, pe_nccl_comm **out);
/* Waits for nothing: call pe_nccl_wait first. NULL is a no-op. */
void pe_nccl_comm_free(pe_nccl_comm *c);
int pe_nccl_comm_size(const pe_nccl_comm *c);

/* In-place all-reduce of bufs[r] (count f32 on rank r) for every rank. */
pe_status *pe_nccl_allreduce(pe_nccl_comm *c, float *const *bufs, size_t count, pe_reduce_op op);
/* A bucket: nbuf gradients per rank in one group; bufs[r * nbuf + j] has
 * counts[j] elements. */
pe_status *pe_nccl_allreduce_bucket(pe_nccl_comm *c, float *const *bufs, const size_t *counts,
                                    int nbuf, pe_reduce_op op);
/* bufs[r] := bufs[root] (bytes each), e.g. parameters after init. */
pe_status *pe_nccl_broadcast(pe_nccl_comm *c, void *const *bufs, size_t bytes, int root);
/* One rank's part of an all-reduce, enqueued on that rank's comm stream. */
pe_status *pe_nccl_allreduce_part(pe_nccl_comm *c, int rank, float *buf, size_t count,
                                  pe_reduce_op op);

/* Block until every rank's comm stream has finished what was enqueued on
 * it before the call (an event marks each stream's position: work queued
 * during the wait is not waited for), polling for asynchronous NCCL
 * errors. Callers serialise it per communicator (the marks are shared).
 * timeout_ms <= 0: no timeout. On an
 * error or the timeout the communicator is aborted (stuck kernels return;
 * every later call fails) while holding enqueue_mu, the lock under which
 * other threads enqueue on c (NULL: none does), since an abort frees what
 * a concurrent enqueue uses. Lock order: the caller's own lock, then
 * enqueue_mu; never call this holding enqueue_mu. */
pe_status *pe_nccl_wait(pe_nccl_comm *c, int timeout_ms, pthread_mutex_t *enqueue_mu);

#endif
