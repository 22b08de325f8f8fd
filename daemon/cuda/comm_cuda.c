/* The device collectives of cuda places (engine/device_comm.h): the NCCL
 * communicator of nccl_comm.h behind the engine's table, which the cuda
 * row of the device table points to (device_cuda.c). */
#include <stdlib.h>

#include "cuda/cuda_ctx.h"
#include "cuda/nccl_comm.h"

typedef struct cuda_comm {
  pe_device_comm base;
  pe_nccl_comm *nccl;
} cuda_comm;

static pe_nccl_comm *nccl_of(pe_device_comm *c) {
  return ((cuda_comm *)c)->nccl;
}

static pe_status *comm_new(pe_device *const *devs, int n, pe_device_comm **out) {
  *out = NULL;
  cuda_comm *c = calloc(1, sizeof(*c));
  if (!c) return pe_error(PE_ENOMEM, "nccl: out of memory");
  pe_status *st = pe_nccl_comm_new(devs, n, &c->nccl);
  if (st) {
    free(c);
    return st;
  }
  c->base.ops = &pe_cuda_comm_ops;
  *out = &c->base;
  return NULL;
}

static void comm_free(pe_device_comm *c) {
  pe_nccl_comm_free(nccl_of(c));
  free(c);
}

static pe_status *comm_all_reduce(pe_device_comm *c, float *const *bufs, const size_t *counts,
                                  int nbuf, pe_reduce_op op) {
  return pe_nccl_allreduce_bucket(nccl_of(c), bufs, counts, nbuf, op);
}

static pe_status *comm_broadcast(pe_device_comm *c, void *const *bufs, size_t bytes, int root) {
  return pe_nccl_broadcast(nccl_of(c), bufs, bytes, root);
}

static pe_status *comm_wait(pe_device_comm *c, int timeout_ms, pthread_mutex_t *enqueue_mu) {
  return pe_nccl_wait(nccl_of(c), timeout_ms, enqueue_mu);
}

const pe_device_comm_ops pe_cuda_comm_ops = {
    .comm_new = comm_new,
    .comm_free = comm_free,
    .all_reduce = comm_all_reduce,
    .broadcast = comm_broadcast,
    .wait = comm_wait,
};
