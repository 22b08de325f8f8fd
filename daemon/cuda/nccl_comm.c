/* NCCL communicator and collectives; see nccl_comm.h. */
#define _POSIX_C_SOURCE 200809L
#include "nccl_comm.h"

#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda/cuda_ctx.h"

struct pe_nccl_comm {
  int n;
  bool aborted;
  ncclComm_t comms[PE_MAX_PLACES];
  cudaStream_t streams[PE_MAX_PLACES]; /* the ranks' comm streams (owned by the devices) */
  /* pe_nccl_wait's marks: where each comm stream stood when the wait began
   * (its callers serialise it: the model's nccl_mu). */
  cudaEvent_t mark[PE_MAX_PLACES];
  int gpu[PE_MAX_PLACES];
};

static void comm_release(pe_nccl_comm *c) {
  for (int r = 0; r < c->n; r++)
    if (c->mark[r]) {
      cudaSetDevice(c->gpu[r]);
      cudaEventDestroy(c->mark[r]);
    }
  free(c);
}

static pe_status *nccl_status(ncclResult_t r, const char *what) {
  if (r == ncclSuccess) return NULL;
  return pe_error(PE_EBACKEND, "%s: NCCL error %d (%s)", what, (int)r, ncclGetErrorString(r));
}

static ncclRedOp_t red_op(pe_reduce_op op) {
  return op == PE_REDUCE_MEAN ? ncclAvg : ncclSum;
}

pe_status *pe_nccl_comm_new(pe_device *const *devs, int n, pe_nccl_comm **out) {
  *out = NULL;
  if (n < 1 || n > PE_MAX_PLACES)
    return pe_error(PE_EINVAL, "nccl: %d ranks, need 1..%d", n, PE_MAX_PLACES);
  pe_nccl_comm *c = calloc(1, sizeof(*c));
  if (!c) return pe_error(PE_ENOMEM, "nccl: out of memory");
  c->n = n;
  for (int r = 0; r < n; r++) {
    cudaStream_t s = pe_cuda_stream_handle(pe_device_stream(devs[r], PE_STREAM_COMM));
    if (!s) {
      free(c);
      return pe_error(PE_EINVAL, "nccl: rank %d is not a cuda device (%s)", r,
                      devs[r]->streams[0]->name);
    }
    c->streams[r] = s;
    c->gpu[r] = devs[r]->place.id;
    for (int q = 0; q < r; q++)
      if (c->gpu[q] == c->gpu[r]) {
        int gpu = c->gpu[r];
        free(c);
        return pe_error(PE_EINVAL, "nccl: ranks %d and %d are both cuda:%d", q, r, gpu);
      }
  }
  pe_status *st = NULL;
  for (int r = 0; r < n && !st; r++) {
    st = pe_cuda_status(cudaSetDevice(c->gpu[r]), "nccl: cudaSetDevice");
    if (!st)
      st = pe_cuda_status(cudaEventCreateWithFlags(&c->mark[r], cudaEventDisableTiming),
                          "nccl: cudaEventCreate");
  }
  if (!st) st = nccl_status(ncclCommInitAll(c->comms, n, c->gpu), "ncclCommInitAll");
  if (st) {
    comm_release(c);
    return st;
  }
  *out = c;
  return NULL;
}

void pe_nccl_comm_free(pe_nccl_comm *c) {
  if (!c) return;
  for (int r = 0; r < c->n; r++) {
    if (!c->comms[r]) continue;
    if (c->aborted)
      ncclCommAbort(c->comms[r]);
    else
      ncclCommDestroy(c->comms[r]);
  }
  comm_release(c);
}

int pe_nccl_comm_size(const pe_nccl_comm *c) {
  return c->n;
}

static pe_status *usable(const pe_nccl_comm *c, const char *what) {
  if (c->aborted)
    return pe_error(PE_EBACKEND, "nccl %s: the communicator was aborted after an earlier error",
                    what);
  return NULL;
}

/* Group end: a failure inside the group fails the whole group. */
static pe_status *group_end(pe_status *st, const char *what) {
  pe_status *end = nccl_status(ncclGroupEnd(), what);
  if (st) {
    pe_status_free(end);
    return st;
  }
  return end;
}

pe_status *pe_nccl_allreduce(pe_nccl_comm *c, float *const *bufs, size_t count, pe_reduce_op op) {
  return pe_nccl_allreduce_bucket(c, bufs, &count, 1, op);
}

pe_status *pe_nccl_allreduce_bucket(pe_nccl_comm *c, float *const *bufs, const size_t *counts,
                                    int nbuf, pe_reduce_op op) {
  PE_TRY(usable(c, "all-reduce"));
  pe_status *st = nccl_status(ncclGroupStart(), "ncclGroupStart");
  if (st) return st;
  for (int r = 0; r < c->n && !st; r++)
    for (int j = 0; j < nbuf && !st; j++) {
      if (!counts[j]) continue;
      float *b = bufs[r * nbuf + j];
      st = nccl_status(
          ncclAllReduce(b, b, counts[j], ncclFloat, red_op(op), c->comms[r], c->streams[r]),
          "ncclAllReduce");
      if (st)
        st = pe_status_wrap(st, "rank %d (cuda:%d) buffer %d of %zu floats", r, c->gpu[r], j,
                            counts[j]);
    }
  return group_end(st, "ncclGroupEnd (all-reduce)");
}

pe_status *pe_nccl_broadcast(pe_nccl_comm *c, void *const *bufs, size_t bytes, int root) {
  PE_TRY(usable(c, "broadcast"));
  if (root < 0 || root >= c->n)
    return pe_error(PE_EINVAL, "nccl broadcast: root %d outside [0, %d)", root, c->n);
  if (!bytes) return NULL;
  pe_status *st = nccl_status(ncclGroupStart(), "ncclGroupStart");
  if (st) return st;
  for (int r = 0; r < c->n && !st; r++)
    st = nccl_status(
        ncclBroadcast(bufs[root], bufs[r], bytes, ncclChar, root, c->comms[r], c->streams[r]),
        "ncclBroadcast");
  return group_end(st, "ncclGroupEnd (broadcast)");
}

pe_status *pe_nccl_allreduce_part(pe_nccl_comm *c, int rank, float *buf, size_t count,
                                  pe_reduce_op op) {
  PE_TRY(usable(c, "all-reduce part"));
  if (rank < 0 || rank >= c->n)
    return pe_error(PE_EINVAL, "nccl all-reduce part: rank %d outside [0, %d)", rank, c->n);
  if (!count) return NULL;
  char what[64];
  snprintf(what, sizeof what, "ncclAllReduce rank %d (cuda:%d)", rank, c->gpu[rank]);
  PE_TRY(pe_cuda_status(cudaSetDevice(c->gpu[rank]), what));
  return nccl_status(
      ncclAllReduce(buf, buf, count, ncclFloat, red_op(op), c->comms[rank], c->streams[rank]),
      what);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Abort every rank so that kernels stuck waiting for peers return; the
 * communicator fails every later call. Under enqueue_mu: no enqueue of
 * another thread is inside an NCCL call on the comms, and `aborted` is
 * read by enqueuers (usable) under the same lock. */
static void abort_all(pe_nccl_comm *c, pthread_mutex_t *enqueue_mu) {
  if (enqueue_mu) pthread_mutex_lock(enqueue_mu);
  if (!c->aborted) {
    for (int q = 0; q < c->n; q++) ncclCommAbort(c->comms[q]);
    for (int q = 0; q < c->n; q++) c->comms[q] = NULL;
    c->aborted = true;
  }
  if (enqueue_mu) pthread_mutex_unlock(enqueue_mu);
}

pe_status *pe_nccl_wait(pe_nccl_comm *c, int timeout_ms, pthread_mutex_t *enqueue_mu) {
  PE_TRY(usable(c, "wait"));
  double start = now_ms();
  /* Wait for what is queued now, not for the streams to fall idle: other
   * executors of the model may keep enqueuing, which must not run this
   * wait into its time limit. */
  for (int r = 0; r < c->n; r++) {
    char what[64];
    snprintf(what, sizeof what, "nccl wait: mark on the comm stream of cuda:%d", c->gpu[r]);
    pe_status *st = pe_cuda_status(cudaSetDevice(c->gpu[r]), what);
    if (!st) st = pe_cuda_status(cudaEventRecord(c->mark[r], c->streams[r]), what);
    if (st) {
      abort_all(c, enqueue_mu);
      return st;
    }
  }
  bool done[PE_MAX_PLACES] = {false};
  int left = c->n;
  while (left > 0) {
    for (int r = 0; r < c->n; r++) {
      if (done[r]) continue;
      cudaSetDevice(c->gpu[r]);
      cudaError_t e = cudaEventQuery(c->mark[r]);
      if (e == cudaSuccess) {
        done[r] = true;
        left--;
        continue;
      }
      pe_status *st = NULL;
      if (e != cudaErrorNotReady) {
        char what[64];
        snprintf(what, sizeof what, "nccl wait: comm stream of cuda:%d", c->gpu[r]);
        st = pe_cuda_status(e, what);
      } else {
        ncclResult_t ae = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(c->comms[r], &ae);
        if (q != ncclSuccess)
          st = nccl_status(q, "ncclCommGetAsyncError");
        else if (ae != ncclSuccess && ae != ncclInProgress)
          st = pe_status_wrap(nccl_status(ae, "asynchronous NCCL error"), "rank %d (cuda:%d)", r,
                              c->gpu[r]);
      }
      if (!st && timeout_ms > 0 && now_ms() - start > timeout_ms)
        st = pe_error(PE_EBACKEND, "nccl wait: rank %d (cuda:%d) not done after %d ms", r,
                      c->gpu[r], timeout_ms);
      if (st) {
        abort_all(c, enqueue_mu);
        return st;
      }
    }
    if (left > 0) {
      struct timespec ts = {0, 50 * 1000}; /* 50 us between polls */
      nanosleep(&ts, NULL);
    }
  }
  /* A collective that failed can still let its stream complete (its
   * kernels give up): the communicators' error state is the last word. */
  for (int r = 0; r < c->n; r++) {
    ncclResult_t ae = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(c->comms[r], &ae);
    pe_status *st = NULL;
    if (q != ncclSuccess)
      st = nccl_status(q, "ncclCommGetAsyncError");
    else if (ae != ncclSuccess && ae != ncclInProgress)
      st = pe_status_wrap(nccl_status(ae, "asynchronous NCCL error"), "rank %d (cuda:%d)", r,
                          c->gpu[r]);
    if (st) {
      abort_all(c, enqueue_mu);
      return st;
    }
  }
  return NULL;
}
