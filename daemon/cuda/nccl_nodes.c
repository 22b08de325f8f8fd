/* The NCCL communicator across nodes (nccl_nodes.h). */
#define _POSIX_C_SOURCE 200809L
#include "cuda/nccl_nodes.h"

#include <nccl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_ctx.h"

_Static_assert(sizeof(ncclUniqueId) == PE_NCCL_ID_BYTES, "ncclUniqueId's size");

struct pe_nccl_nodes {
  int rank, nodes, gpu;
  int timeout_ms;
  cudaStream_t stream; /* the lead device's comm stream (owned by the device) */
  cudaEvent_t mark;    /* where the stream stood after an all-reduce's enqueue */
  pthread_mutex_t mu;  /* guards comm, busy, abort_asked, failure against fail() */
  ncclComm_t comm;     /* NULL once aborted */
  bool busy;           /* an all-reduce is between enqueue and its end */
  bool abort_asked;    /* fail() came during one: its poll aborts */
  char failure[256];   /* why it was aborted; "" while healthy */
};

static pe_status *nccl_status(ncclResult_t r, const char *what) {
  if (r == ncclSuccess) return NULL;
  return pe_error(PE_EBACKEND, "%s: NCCL error %d (%s)", what, (int)r, ncclGetErrorString(r));
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Aborts the communicator (kernels stuck waiting for a peer return) and
 * keeps why (NULL: failure holds it already); caller holds mu. */
static void abort_locked(pe_nccl_nodes *c, const char *why) {
  if (why && !c->failure[0]) snprintf(c->failure, sizeof c->failure, "%s", why);
  if (c->comm) ncclCommAbort(c->comm);
  c->comm = NULL;
}

/* The communicator's asynchronous state while the stream runs: NULL while
 * in progress or fine. */
static pe_status *poll_error(pe_nccl_nodes *c, double start, const char *what) {
  ncclResult_t ae = ncclSuccess;
  ncclResult_t q = ncclCommGetAsyncError(c->comm, &ae);
  if (q != ncclSuccess) return nccl_status(q, "ncclCommGetAsyncError");
  if (ae != ncclSuccess && ae != ncclInProgress)
    return pe_status_wrap(nccl_status(ae, "asynchronous NCCL error"), "node rank %d (cuda:%d) %s",
                          c->rank, c->gpu, what);
  pthread_mutex_lock(&c->mu);
  bool asked = c->abort_asked;
  pthread_mutex_unlock(&c->mu);
  if (asked)
    return pe_error(PE_EIO, "node rank %d: %s: this node gave up (%s)", c->rank, what, c->failure);
  if (c->timeout_ms > 0 && now_ms() - start > c->timeout_ms)
    return pe_error(PE_EIO,
                    "node rank %d (cuda:%d): %s not done after %d ms (a peer node stalls or "
                    "is gone)",
                    c->rank, c->gpu, what, c->timeout_ms);
  return NULL;
}

static void nap(void) {
  struct timespec ts = {0, 50 * 1000}; /* 50 us between polls */
  nanosleep(&ts, NULL);
}

/* A non-blocking call's result: in progress is fine (polled after). */
static pe_status *enqueued(ncclResult_t r, const char *what) {
  return r == ncclInProgress ? NULL : nccl_status(r, what);
}

static pe_status *fail_with(pe_nccl_nodes *c, pe_status *st) {
  pthread_mutex_lock(&c->mu);
  abort_locked(c, pe_status_msg(st));
  c->busy = false;
  pthread_mutex_unlock(&c->mu);
  return st;
}

static pe_status *nodes_all_reduce(void *ctx, float *const *bufs, const size_t *counts, int nbuf) {
  pe_nccl_nodes *c = ctx;
  pthread_mutex_lock(&c->mu);
  if (!c->comm) {
    pe_status *st =
        pe_error(PE_EIO, "nccl across nodes: node rank %d is broken (%s)", c->rank, c->failure);
    pthread_mutex_unlock(&c->mu);
    return st;
  }
  c->busy = true;
  pthread_mutex_unlock(&c->mu);
  char what[96];
  snprintf(what, sizeof what, "all-reduce of %d buffers across %d nodes", nbuf, c->nodes);
  pe_status *st = pe_cuda_status(cudaSetDevice(c->gpu), "nccl across nodes: cudaSetDevice");
  bool grouped = false;
  if (!st) st = nccl_status(ncclGroupStart(), "ncclGroupStart");
  grouped = !st;
  for (int j = 0; j < nbuf && !st; j++)
    if (counts[j])
      st = enqueued(
          ncclAllReduce(bufs[j], bufs[j], counts[j], ncclFloat, ncclSum, c->comm, c->stream),
          "ncclAllReduce");
  if (grouped) { /* ended even after a failed enqueue: a group left open poisons the thread */
    pe_status *end = enqueued(ncclGroupEnd(), "ncclGroupEnd");
    if (st)
      pe_status_free(end);
    else
      st = end;
  }
  double start = now_ms();
  /* Non-blocking: the group may still be enqueuing. */
  for (ncclResult_t ae = ncclInProgress; !st && ae == ncclInProgress;) {
    st = nccl_status(ncclCommGetAsyncError(c->comm, &ae), "ncclCommGetAsyncError");
    if (!st && ae == ncclInProgress)
      st = poll_error(c, start, what);
    else if (!st)
      st = nccl_status(ae, "ncclGroupEnd");
    if (!st && ae == ncclInProgress) nap();
  }
  if (!st) st = pe_cuda_status(cudaEventRecord(c->mark, c->stream), "nccl across nodes: mark");
  while (!st) {
    cudaError_t e = cudaEventQuery(c->mark);
    if (e == cudaSuccess) break;
    st = e != cudaErrorNotReady ? pe_cuda_status(e, "nccl across nodes: comm stream")
                                : poll_error(c, start, what);
    if (!st) nap();
  }
  /* A failed collective can let its stream complete: the error state is
   * the last word. */
  if (!st) {
    ncclResult_t ae = ncclSuccess;
    st = nccl_status(ncclCommGetAsyncError(c->comm, &ae), "ncclCommGetAsyncError");
    if (!st) st = nccl_status(ae, "asynchronous NCCL error");
  }
  if (st) return fail_with(c, pe_status_wrap(st, "nccl across nodes: %s", what));
  pthread_mutex_lock(&c->mu);
  c->busy = false;
  if (c->abort_asked) abort_locked(c, NULL);
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

/* Aborting tells the peers: their collectives fail instead of waiting. An
 * all-reduce in flight aborts at its next poll (its thread owns the
 * enqueue). */
static void nodes_fail(void *ctx, const char *why) {
  pe_nccl_nodes *c = ctx;
  pthread_mutex_lock(&c->mu);
  if (!c->failure[0]) snprintf(c->failure, sizeof c->failure, "%s", why);
  if (c->busy)
    c->abort_asked = true;
  else
    abort_locked(c, why);
  pthread_mutex_unlock(&c->mu);
}

pe_status *pe_nccl_nodes_new_id(uint8_t id[PE_NCCL_ID_BYTES]) {
  ncclUniqueId u;
  PE_TRY(nccl_status(ncclGetUniqueId(&u), "nccl across nodes: ncclGetUniqueId"));
  memcpy(id, u.internal, PE_NCCL_ID_BYTES);
  return NULL;
}

pe_status *pe_nccl_nodes_new(pe_device *lead, const pe_nccl_nodes_plan *p,
                             const uint8_t id[PE_NCCL_ID_BYTES], int timeout_ms,
                             pe_node_comm *table, pe_nccl_nodes **out) {
  *out = NULL;
  cudaStream_t s = pe_cuda_stream_handle(pe_device_stream(lead, PE_STREAM_COMM));
  if (!s)
    return pe_error(PE_EINVAL, "nccl across nodes: the lead place is not a cuda device (%s)",
                    lead->streams[0]->name);
  if (lead->place.id != p->lead_gpu)
    return pe_error(PE_EINVAL, "nccl across nodes: the lead device is cuda:%d, the plan's cuda:%d",
                    lead->place.id, p->lead_gpu);
  pe_nccl_nodes *c = calloc(1, sizeof *c);
  if (!c) return pe_error(PE_ENOMEM, "nccl across nodes: out of memory");
  c->rank = p->nccl_rank;
  c->nodes = p->nodes;
  c->gpu = p->lead_gpu;
  c->timeout_ms = timeout_ms;
  c->stream = s;
  pthread_mutex_init(&c->mu, NULL);
  pe_status *st = pe_cuda_status(cudaSetDevice(c->gpu), "nccl across nodes: cudaSetDevice");
  if (!st)
    st = pe_cuda_status(cudaEventCreateWithFlags(&c->mark, cudaEventDisableTiming),
                        "nccl across nodes: cudaEventCreate");
  ncclUniqueId u;
  memcpy(u.internal, id, PE_NCCL_ID_BYTES);
  /* Non-blocking: the init is polled, so a node that never comes fails
   * this one at the timeout instead of blocking it for ever. */
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  if (!st) {
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, c->nodes, u, c->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) st = nccl_status(r, "ncclCommInitRankConfig");
  }
  double start = now_ms();
  for (;;) {
    if (st || !c->comm) break;
    ncclResult_t ae = ncclSuccess;
    st = nccl_status(ncclCommGetAsyncError(c->comm, &ae), "ncclCommGetAsyncError");
    if (st || ae == ncclSuccess) break;
    if (ae != ncclInProgress) {
      st = nccl_status(ae, "ncclCommInitRankConfig");
      break;
    }
    if (timeout_ms > 0 && now_ms() - start > timeout_ms) {
      st = pe_error(PE_EIO, "not every node joined within %d ms", timeout_ms);
      break;
    }
    nap();
  }
  if (st) {
    if (c->comm) ncclCommAbort(c->comm);
    if (c->mark) cudaEventDestroy(c->mark);
    pthread_mutex_destroy(&c->mu);
    free(c);
    return pe_status_wrap(st, "nccl across nodes: node rank %d of %d joining on cuda:%d",
                          p->nccl_rank, p->nodes, p->lead_gpu);
  }
  *table = (pe_node_comm){c, c->rank, c->nodes, nodes_all_reduce, nodes_fail};
  *out = c;
  return NULL;
}

void pe_nccl_nodes_free(pe_nccl_nodes *c) {
  if (!c) return;
  cudaSetDevice(c->gpu);
  if (c->comm) {
    /* A non-blocking communicator finalizes in the background: poll it to
     * the end (at most the timeout: a peer gone meanwhile), then destroy;
     * abort when it does not finish. */
    ncclResult_t r = ncclCommFinalize(c->comm), ae = r;
    double start = now_ms();
    while (r == ncclSuccess || r == ncclInProgress) {
      r = ncclCommGetAsyncError(c->comm, &ae);
      if (r != ncclSuccess || ae != ncclInProgress) break;
      if (c->timeout_ms > 0 && now_ms() - start > c->timeout_ms) break;
      nap();
    }
    if (r == ncclSuccess && ae == ncclSuccess)
      ncclCommDestroy(c->comm);
    else
      ncclCommAbort(c->comm);
  }
  cudaEventDestroy(c->mark);
  pthread_mutex_destroy(&c->mu);
  free(c);
}
