/* Collectives across the devices of one kind, done by the kind's backend.
 *
 * The host collectives (engine/collective.h) read and write the ranks'
 * buffers on the host. A kind whose memory the host does not reach has its
 * own: its row of the device table points to a pe_device_comm_ops
 * (pe_device_ops.comm), which enqueues every rank's part on that rank's
 * comm stream (PE_STREAM_COMM). The executor orders those parts against
 * producers and consumers with events like any other stream work
 * (pe_device_sync_dep) and only calls the wrappers below.
 *
 * A communicator spans n opened devices of one kind, rank r = devs[r].
 * Calls are grouped: one call enqueues the part of every rank, from one
 * coordinating thread at a time (a backend may need that: one thread that
 * drives several devices must group their parts).
 *
 * Errors never hang or abort the process: an enqueue failure is a status;
 * device-side errors are seen by pe_device_comm_wait, which on an error or
 * after its time limit aborts the communicator, so that stuck work returns
 * and every later call fails with a status; make a new one.
 *
 * Buffers are memory of the rank's device; counts are elements; reductions
 * are in place. */
#ifndef PE_ENGINE_DEVICE_COMM_H
#define PE_ENGINE_DEVICE_COMM_H

#include <pthread.h>
#include <stddef.h>

#include "core/status.h"
#include "engine/collective.h" /* pe_reduce_op */
#include "engine/device.h"

typedef struct pe_device_comm pe_device_comm;

/* One table per kind that has device collectives. */
typedef struct pe_device_comm_ops {
  /* devs: n >= 1 opened devices of the kind, on distinct devices. */
  pe_status *(*comm_new)(pe_device *const *devs, int n, pe_device_comm **out);
  /* Waits for nothing: wait first. */
  void (*comm_free)(pe_device_comm *c);
  /* nbuf buffers per rank in one group: bufs[r * nbuf + j] has counts[j]
   * f32 elements; each is reduced in place over the ranks. */
  pe_status *(*all_reduce)(pe_device_comm *c, float *const *bufs, const size_t *counts, int nbuf,
                           pe_reduce_op op);
  /* bufs[r] := bufs[root] (bytes each) on every rank. */
  pe_status *(*broadcast)(pe_device_comm *c, void *const *bufs, size_t bytes, int root);
  /* Block until every rank's comm stream has finished what was enqueued on
   * it before the call, polling for the backend's asynchronous errors.
   * Callers serialise it per communicator. timeout_ms <= 0: no limit. On an
   * error or the timeout the communicator is aborted while holding
   * enqueue_mu, the lock under which other threads enqueue on c (NULL:
   * none does). Lock order: the caller's own lock, then enqueue_mu; never
   * call this holding enqueue_mu. */
  pe_status *(*wait)(pe_device_comm *c, int timeout_ms, pthread_mutex_t *enqueue_mu);
} pe_device_comm_ops;

/* The common part of every communicator; a backend embeds it first. */
struct pe_device_comm {
  const pe_device_comm_ops *ops;
};

/* A communicator over devs (all of one kind). *out = NULL and no error when
 * the kind has no device collectives (its memory is host memory: the host
 * collectives serve it). */
pe_status *pe_device_comm_new(pe_device *const *devs, int n, pe_device_comm **out);
/* NULL is a no-op. */
static inline void pe_device_comm_free(pe_device_comm *c) {
  if (c) c->ops->comm_free(c);
}
static inline pe_status *pe_device_comm_all_reduce(pe_device_comm *c, float *const *bufs,
                                                   const size_t *counts, int nbuf,
                                                   pe_reduce_op op) {
  return c->ops->all_reduce(c, bufs, counts, nbuf, op);
}
static inline pe_status *pe_device_comm_broadcast(pe_device_comm *c, void *const *bufs,
                                                  size_t bytes, int root) {
  return c->ops->broadcast(c, bufs, bytes, root);
}
static inline pe_status *pe_device_comm_wait(pe_device_comm *c, int timeout_ms,
                                             pthread_mutex_t *enqueue_mu) {
  return c->ops->wait(c, timeout_ms, enqueue_mu);
}

#endif
