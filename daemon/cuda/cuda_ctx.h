/* What CUDA kernels of one place use: the cuda stream they enqueue on and
 * the library handles bound to it. One per cuda pe_stream, owned by the
 * cuda device (device_cuda.c); reached from a kernel through
 * pe_kernel_ctx.dev->cuda (ops/device_ctx.h).
 *
 * Threading: the stream and the handles are created at device open and are
 * read-only afterwards. Several host threads may launch on the same stream,
 * but the device runs one launched fn at a time per stream (cuda_launch's
 * lock): a cuDNN handle must not be used by two threads at once, and an
 * op's kernels reach the stream as one piece. cuBLAS/cuDNN handles are bound
 * to their stream once and never re-bound. The scratch workspace is used
 * only by kernels on the compute stream; an op's kernels are enqueued
 * together and the workspace is stream-ordered, so later ops may reuse it
 * at once. */
#ifndef PE_CUDA_CUDA_CTX_H
#define PE_CUDA_CUDA_CTX_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <pthread.h>
#include <stddef.h>

#include "core/status.h"
#include "engine/device.h"
#include "engine/device_comm.h"

/* A workspace block replaced by a larger one (freed at device close). */
typedef struct pe_cuda_retired {
  void *p;
  size_t bytes;
  struct pe_cuda_retired *next;
} pe_cuda_retired;

typedef struct pe_cuda_ctx {
  int device;            /* CUDA ordinal (= place id) */
  cudaStream_t stream;   /* owned by the device */
  cublasHandle_t cublas; /* compute stream only; NULL on the others */
  cudnnHandle_t cudnn;   /* compute stream only; NULL on the others */
  /* Stream-ordered scratch (cuDNN workspaces, batch-norm temporaries),
   * grown under ws_mu; a replaced block is retired, never reused while
   * the device is open. */
  pthread_mutex_t ws_mu;
  void *ws;
  size_t ws_bytes;
  pe_cuda_retired *retired;
  struct pe_device *dev; /* for the caching allocator */
} pe_cuda_ctx;

/* The cudaStream_t of a cuda pe_stream (NULL for another kind). */
cudaStream_t pe_cuda_stream_handle(pe_stream *s);
/* The kernel context of a cuda pe_stream. */
pe_cuda_ctx *pe_cuda_stream_ctx(pe_stream *s);

/* Scratch of at least `bytes` for kernels on ctx's stream. Stream-ordered:
 * kernels enqueued on that stream may use it one after another without
 * any sync; a kernel must not keep it across launches. */
pe_status *pe_cuda_workspace(pe_cuda_ctx *ctx, size_t bytes, void **out);

/* Errors as statuses, naming what was called. */
pe_status *pe_cuda_status(cudaError_t e, const char *what);
pe_status *pe_cublas_status(cublasStatus_t e, const char *what);
pe_status *pe_cudnn_status(cudnnStatus_t e, const char *what);

/* Pinned host staging (for feeds and fetches): a size-class cache over
 * cudaHostAlloc. NULL on failure. Thread-safe. */
void *pe_cuda_pinned_alloc(size_t bytes, size_t *cap);
void pe_cuda_pinned_free(void *p, size_t cap);

/* Number of GPUs the runtime sees; 0 with *why set when there is no
 * driver or no device (never aborts). why may be NULL. */
int pe_cuda_device_count(pe_status **why);

extern const pe_device_ops pe_device_cuda_ops;
/* The row's device collectives (NCCL; comm_cuda.c). */
extern const pe_device_comm_ops pe_cuda_comm_ops;

#endif
