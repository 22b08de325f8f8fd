/* cuda places: the device interface (engine/device.h) over the CUDA runtime.
 *
 * Streams. Per GPU four cudaStreams (non-blocking, so they never serialise
 * with the legacy default stream): compute, comm (NCCL), copy h2d (feeds),
 * copy d2h (fetches). pe_stream_launch runs fn on the calling host thread
 * with the GPU current; fn enqueues kernels on pe_cuda_stream_handle(s) and
 * returns, so launch is asynchronous in the device sense (ops->async).
 *
 * Errors. A status fn returns, a launch error left in the runtime
 * (cudaGetLastError after fn), or an asynchronous fault seen by a
 * synchronising call is kept on the stream as its first error, numbered
 * like on cpu (engine/stream_error.h) so that pe_event_sync reports only errors from work
 * at or before the event's position. A sticky CUDA context error (a kernel
 * fault) is reported by every later call; it is still a status, never an
 * abort.
 *
 * Events. Pooled by device.c; event_init creates a cudaEvent_t without
 * timing (the cheapest kind) and keeps it in e->impl. record =
 * cudaEventRecord; stream_wait_event = cudaStreamWaitEvent, which captures
 * the event's position at the call as device.h requires.
 *
 * Memory. Device memory comes from a per-device size-class cache over
 * cudaMalloc (cuda_alloc.h): no cudaMalloc in steady state. Copies between
 * device memory and pageable host memory go through pinned staging buffers
 * (a process-wide cache over cudaHostAlloc), so a copy is truly
 * asynchronous: h2d copies the source into a staging buffer on the calling
 * thread and enqueues the DMA; d2h enqueues the DMA into staging and a host
 * function that copies staging to the destination when the stream gets
 * there. Nothing waits on the whole device: a fetch is ordered on its copy
 * stream only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_alloc.h"
#include "cuda/cuda_ctx.h"
#include "cuda/cuda_graph.h"
#include "engine/device_graph.h"
#include "engine/device_impl.h"
#include "engine/stream_error.h"

typedef struct cuda_stream {
  pe_stream base;
  pe_device_ctx ctx;   /* ctx.cuda = &cctx */
  pe_cuda_ctx cctx;    /* stream + handles */
  pe_stream_error err; /* the kept error */
  /* Held while a launched fn enqueues its work: one fn at a time per
   * stream, as on sim (see cuda_launch). */
  pthread_mutex_t launch_mu;
} cuda_stream;

typedef struct cuda_device {
  pe_device base;
  cuda_stream streams[PE_STREAM_KINDS];
  pe_cuda_cache *mem; /* device memory */
} cuda_device;

/* --- errors --------------------------------------------------------------- */

pe_status *pe_cuda_status(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return NULL;
  return pe_error(PE_EBACKEND, "%s: CUDA error %d (%s): %s", what, (int)e, cudaGetErrorName(e),
                  cudaGetErrorString(e));
}

pe_status *pe_cublas_status(cublasStatus_t e, const char *what) {
  if (e == CUBLAS_STATUS_SUCCESS) return NULL;
  return pe_error(PE_EBACKEND, "%s: cuBLAS error %d (%s)", what, (int)e, cublasGetStatusString(e));
}

pe_status *pe_cudnn_status(cudnnStatus_t e, const char *what) {
  if (e == CUDNN_STATUS_SUCCESS) return NULL;
  return pe_error(PE_EBACKEND, "%s: cuDNN error %d (%s)", what, (int)e, cudnnGetErrorString(e));
}

int pe_cuda_device_count(pe_status **why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (why) *why = NULL;
  if (e != cudaSuccess) {
    cudaGetLastError(); /* clear it: the runtime may be used again later */
    if (why) *why = pe_cuda_status(e, "cudaGetDeviceCount (no usable NVIDIA driver or GPU)");
    return 0;
  }
  if (n == 0 && why) *why = pe_error(PE_EBACKEND, "cudaGetDeviceCount: the driver sees no GPU");
  return n;
}

static pe_status *set_device(const pe_device *d) {
  return pe_cuda_status(cudaSetDevice(d->place.id), d->streams[0]->name);
}

/* --- accessors ------------------------------------------------------------ */

cudaStream_t pe_cuda_stream_handle(pe_stream *s) {
  if (!s || s->dev->ops != &pe_device_cuda_ops) return NULL;
  return ((cuda_stream *)s)->cctx.stream;
}

pe_cuda_ctx *pe_cuda_stream_ctx(pe_stream *s) {
  if (!s || s->dev->ops != &pe_device_cuda_ops) return NULL;
  return &((cuda_stream *)s)->cctx;
}

/* --- memory ------------------------------------------------------------------ */

static void *dev_malloc(size_t bytes, void *arg) {
  cuda_device *d = arg;
  void *p = NULL;
  /* No cudaMalloc while the device captures a step (cuda_graph.h): the
   * allocation fails, and the capture with it. */
  if (pe_cuda_graph_capturing(d->base.place.id)) return NULL;
  if (cudaSetDevice(d->base.place.id) != cudaSuccess || cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError(); /* an OOM is not sticky: clear it for the retry */
    return NULL;
  }
  return p;
}

static void dev_free(void *p, void *arg) {
  cuda_device *d = arg;
  cudaSetDevice(d->base.place.id);
  cudaFree(p);
}

static void *cuda_alloc(pe_device *base, size_t bytes, size_t *cap) {
  return pe_cuda_cache_alloc(((cuda_device *)base)->mem, bytes, cap);
}

static void cuda_free(pe_device *base, void *p, size_t cap) {
  pe_cuda_cache_release(((cuda_device *)base)->mem, p, cap);
}

/* The cache as a pe_allocator (core/allocator.h), so that the executor's
 * pe_tensor_resize_with(pe_device_allocator(d)) puts tensors in device
 * memory. Tensors from it must be released before the device closes. */
static void *impl_alloc(void *self, size_t bytes, size_t *cap) {
  return pe_cuda_cache_alloc(self, bytes, cap);
}
static void impl_free(void *self, void *p, size_t cap) {
  pe_cuda_cache_release(self, p, cap);
}
static void impl_trim(void *self) {
  pe_cuda_cache_trim(self);
}
static pe_alloc_stats impl_stats(void *self) {
  return pe_cuda_cache_stats(self);
}
static const pe_allocator_impl cache_impl = {impl_alloc, impl_free, impl_trim, impl_stats, NULL};

static pe_cuda_cache *pinned;
static pthread_once_t pinned_once = PTHREAD_ONCE_INIT;

static void *pinned_malloc(size_t bytes, void *arg) {
  void *p = NULL;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();
    return NULL;
  }
  return p;
}

static void pinned_release(void *p, void *arg) {
  cudaFreeHost(p);
}

/* Process-wide: pinned memory is portable across GPUs and outlives devices. */
static void pinned_init(void) {
  pinned = pe_cuda_cache_new((pe_cuda_backend){pinned_malloc, pinned_release, NULL},
                             PE_CUDA_PINNED_CACHE_LIMIT);
}

void *pe_cuda_pinned_alloc(size_t bytes, size_t *cap) {
  pthread_once(&pinned_once, pinned_init);
  return pinned ? pe_cuda_cache_alloc(pinned, bytes, cap) : NULL;
}

void pe_cuda_pinned_free(void *p, size_t cap) {
  if (p && pinned) pe_cuda_cache_release(pinned, p, cap);
}

pe_status *pe_cuda_workspace(pe_cuda_ctx *ctx, size_t bytes, void **out) {
  pthread_mutex_lock(&ctx->ws_mu);
  pe_status *st = NULL;
  if (ctx->ws_bytes < bytes) {
    /* The old block is retired, not freed: kernels already enqueued, and
     * kernels another host thread is about to enqueue with the pointer it
     * got, may still use it. Blocks grow by size class (at least doubling),
     * so the retired ones cost less than the current one; all are freed at
     * close. */
    if (ctx->ws) {
      pe_cuda_retired *r = malloc(sizeof(*r));
      if (!r) {
        st = pe_error(PE_ENOMEM, "cuda:%d: out of memory growing the workspace", ctx->device);
      } else {
        *r = (pe_cuda_retired){ctx->ws, ctx->ws_bytes, ctx->retired};
        ctx->retired = r;
        ctx->ws = NULL;
        ctx->ws_bytes = 0;
      }
    }
    size_t cap = 0;
    void *p = st ? NULL : pe_device_alloc(ctx->dev, bytes, &cap);
    if (!st && !p)
      st = pe_error(PE_ENOMEM, "cuda:%d: out of device memory for a %zu-byte workspace",
                    ctx->device, bytes);
    if (p) {
      ctx->ws = p;
      ctx->ws_bytes = cap;
    }
  }
  *out = ctx->ws;
  pthread_mutex_unlock(&ctx->ws_mu);
  return st;
}

/* --- open / close ------------------------------------------------------------- */

static void close_streams(cuda_device *d) {
  for (int k = 0; k < PE_STREAM_KINDS; k++) {
    cuda_stream *s = &d->streams[k];
    if (s->cctx.stream) cudaStreamSynchronize(s->cctx.stream);
    if (s->cctx.ws) pe_device_free(&d->base, s->cctx.ws, s->cctx.ws_bytes);
    while (s->cctx.retired) {
      pe_cuda_retired *r = s->cctx.retired;
      s->cctx.retired = r->next;
      pe_device_free(&d->base, r->p, r->bytes);
      free(r);
    }
    if (s->cctx.cudnn) cudnnDestroy(s->cctx.cudnn);
    if (s->cctx.cublas) cublasDestroy(s->cctx.cublas);
    if (s->cctx.stream) cudaStreamDestroy(s->cctx.stream);
    pthread_mutex_destroy(&s->cctx.ws_mu);
    pthread_mutex_destroy(&s->launch_mu);
    pe_stream_error_destroy(&s->err);
    pe_device_ctx_destroy(&s->ctx);
    memset(&s->cctx, 0, sizeof s->cctx);
  }
}

static void cuda_close(pe_device *base) {
  cuda_device *d = (cuda_device *)base;
  cudaSetDevice(base->place.id);
  close_streams(d);
  pe_device_base_fini(&d->base);    /* destroys the pooled cudaEvents */
  pe_allocator_free(d->base.alloc); /* the wrapper only (no destroy hook) */
  pe_cuda_cache_free(d->mem);
  free(d);
}

static pe_status *open_stream(cuda_device *d, int k) {
  cuda_stream *s = &d->streams[k];
  pe_place place = d->base.place;
  s->base.dev = &d->base;
  s->base.kind = (pe_stream_kind)k;
  snprintf(s->base.name, sizeof s->base.name, "cuda:%d/%s", place.id,
           pe_stream_kind_name((pe_stream_kind)k));
  pe_stream_error_init(&s->err);
  pthread_mutex_init(&s->launch_mu, NULL);
  pthread_mutex_init(&s->cctx.ws_mu, NULL);
  PE_TRY(pe_device_ctx_init(&s->ctx, place, d->base.threads));
  s->ctx.cuda = &s->cctx;
  s->base.ctx = &s->ctx;
  s->cctx.device = place.id;
  s->cctx.dev = &d->base;
  d->base.streams[k] = &s->base;
  char what[96];
  snprintf(what, sizeof what, "%s: cudaStreamCreateWithFlags", s->base.name);
  PE_TRY(pe_cuda_status(cudaStreamCreateWithFlags(&s->cctx.stream, cudaStreamNonBlocking), what));
  if (k != PE_STREAM_COMPUTE) return NULL;
  /* Library handles on the compute stream, bound once (see cuda_ctx.h). */
  snprintf(what, sizeof what, "%s: cublasCreate", s->base.name);
  PE_TRY(pe_cublas_status(cublasCreate(&s->cctx.cublas), what));
  PE_TRY(pe_cublas_status(cublasSetStream(s->cctx.cublas, s->cctx.stream), what));
  /* Exact f32 GEMMs (no TF32) so results compare with the CPU reference. */
  PE_TRY(pe_cublas_status(cublasSetMathMode(s->cctx.cublas, CUBLAS_DEFAULT_MATH), what));
  snprintf(what, sizeof what, "%s: cudnnCreate", s->base.name);
  PE_TRY(pe_cudnn_status(cudnnCreate(&s->cctx.cudnn), what));
  PE_TRY(pe_cudnn_status(cudnnSetStream(s->cctx.cudnn, s->cctx.stream), what));
  return NULL;
}

static pe_status *cuda_open(pe_place place, const pe_device_opts *opts, pe_device **out) {
  *out = NULL;
  char pb[32];
  pe_place_str(place, pb, sizeof pb);
  pe_status *why = NULL;
  int n = pe_cuda_device_count(&why);
  if (n == 0) return pe_status_wrap(why, "device %s", pb);
  if (place.id >= n)
    return pe_error(PE_EBACKEND, "device %s: only %d GPU%s visible (cuda:0..cuda:%d)", pb, n,
                    n == 1 ? "" : "s", n - 1);
  char what[64];
  snprintf(what, sizeof what, "device %s: cudaSetDevice", pb);
  PE_TRY(pe_cuda_status(cudaSetDevice(place.id), what));
  cuda_device *d = calloc(1, sizeof(*d));
  if (!d) return pe_error(PE_ENOMEM, "device %s: out of memory", pb);
  /* The intra-op budget is the host side of kernels (launch overhead and
   * glue); one thread per GPU is the default when none is given. */
  pe_device_base_init(&d->base, &pe_device_cuda_ops, place, opts->threads > 0 ? opts->threads : 1);
  d->mem = pe_cuda_cache_new((pe_cuda_backend){dev_malloc, dev_free, d}, PE_CUDA_CACHE_LIMIT);
  /* Device memory behind the pe_allocator interface (see cache_impl). */
  d->base.alloc = d->mem ? pe_allocator_new_impl(&cache_impl, d->mem) : NULL;
  pe_status *st = d->base.alloc ? NULL : pe_error(PE_ENOMEM, "device %s: out of memory", pb);
  for (int k = 0; k < PE_STREAM_KINDS && !st; k++) st = open_stream(d, k);
  if (st) {
    cuda_close(&d->base);
    return st;
  }
  *out = &d->base;
  return NULL;
}

/* --- streams ---------------------------------------------------------------- */

/* The executor's pool threads launch on the same stream concurrently (cpu
 * semantics), but a fn's work must reach the stream as one piece, as on sim
 * where the stream's one thread runs fns one at a time: the compute
 * stream's cuDNN handle must not be used by two threads at once (cuDNN's
 * thread-safety rule), and an op's kernels that pass data through the
 * stream's workspace (batch norm without its optional outputs, pool2d_grad
 * without Out, cuDNN's own multi-kernel calls) must not interleave with
 * another op's kernels on that workspace. So fns on one stream are
 * serialised; they only enqueue, so the lock is held briefly. */
static pe_status *cuda_launch(pe_stream *base, pe_stream_fn fn, void *arg) {
  cuda_stream *s = (cuda_stream *)base;
  pe_status *st = set_device(base->dev);
  if (st) return st; /* not queued */
  pthread_mutex_lock(&s->launch_mu);
  /* The runtime's last error is per thread: drop what an earlier call of
   * this pool thread left (a failed event record, another place's launch),
   * so that only fn's own failure is kept on this stream. A kept error is
   * reported by every later sync of the stream. */
  (void)cudaGetLastError();
  st = fn(arg);
  /* A launch failure fn did not check (bad configuration, sticky fault). */
  cudaError_t e = cudaGetLastError();
  pthread_mutex_unlock(&s->launch_mu);
  if (!st && e != cudaSuccess) st = pe_cuda_status(e, base->name);
  if (st) pe_stream_error_keep(&s->err, st);
  return NULL;
}

static void cuda_drain(pe_stream *base) {
  cuda_stream *s = (cuda_stream *)base;
  cudaSetDevice(base->dev->place.id);
  cudaError_t e = cudaStreamSynchronize(s->cctx.stream);
  if (e != cudaSuccess) {
    char what[80];
    snprintf(what, sizeof what, "%s: cudaStreamSynchronize", base->name);
    pe_stream_error_keep(&s->err, pe_cuda_status(e, what));
  }
}

static pe_status *cuda_take_error(pe_stream *base) {
  return pe_stream_error_take(&((cuda_stream *)base)->err);
}

/* d2h through staging: the host function copies staging to the caller's
 * buffer once the DMA before it on the stream completed. It runs on a CUDA
 * runtime thread and must not call CUDA; the pinned cache is a plain mutex. */
typedef struct staged {
  void *dst;
  void *buf;
  size_t bytes, cap;
} staged;

static void CUDART_CB staged_d2h_done(void *arg) {
  staged *sg = arg;
  memcpy(sg->dst, sg->buf, sg->bytes);
  pe_cuda_pinned_free(sg->buf, sg->cap);
  free(sg);
}

static void CUDART_CB staged_h2d_done(void *arg) {
  staged *sg = arg;
  pe_cuda_pinned_free(sg->buf, sg->cap);
  free(sg);
}

static bool is_pageable(const void *p) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return a.type == cudaMemoryTypeUnregistered;
}

static pe_status *cuda_copy(pe_stream *base, void *dst, const void *src, size_t bytes,
                            pe_copy_kind kind) {
  cuda_stream *s = (cuda_stream *)base;
  if (!bytes || dst == src) return NULL;
  char what[96];
  snprintf(what, sizeof what, "%s: %s copy of %zu bytes", base->name,
           kind == PE_COPY_H2D   ? "h2d"
           : kind == PE_COPY_D2H ? "d2h"
                                 : "d2d",
           bytes);
  PE_TRY(set_device(base->dev));
  cudaStream_t cs = s->cctx.stream;
  const void *host = kind == PE_COPY_H2D ? src : kind == PE_COPY_D2H ? dst : NULL;
  if (!host || !is_pageable(host))
    return pe_cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cs), what);
  staged *sg = malloc(sizeof(*sg));
  if (sg) sg->buf = pe_cuda_pinned_alloc(bytes, &sg->cap);
  if (!sg || !sg->buf) {
    free(sg);
    /* No staging: a plain (host-synchronous) copy is still correct. */
    return pe_cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cs), what);
  }
  sg->dst = dst;
  sg->bytes = bytes;
  cudaError_t e;
  if (kind == PE_COPY_H2D) {
    memcpy(sg->buf, src, bytes);
    e = cudaMemcpyAsync(dst, sg->buf, bytes, cudaMemcpyHostToDevice, cs);
    if (e == cudaSuccess) e = cudaLaunchHostFunc(cs, staged_h2d_done, sg);
  } else {
    e = cudaMemcpyAsync(sg->buf, src, bytes, cudaMemcpyDeviceToHost, cs);
    if (e == cudaSuccess) e = cudaLaunchHostFunc(cs, staged_d2h_done, sg);
  }
  if (e != cudaSuccess) {
    /* Nothing queued will touch sg once the enqueue failed. */
    cudaStreamSynchronize(cs);
    pe_cuda_pinned_free(sg->buf, sg->cap);
    free(sg);
    return pe_cuda_status(e, what);
  }
  return NULL;
}

/* --- events ---------------------------------------------------------------------- */

static pe_status *cuda_event_init(pe_device *d, pe_event *e) {
  PE_TRY(set_device(d));
  cudaEvent_t ev;
  PE_TRY(pe_cuda_status(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming),
                        "cudaEventCreateWithFlags"));
  e->impl = ev;
  return NULL;
}

static void cuda_event_fini(pe_device *d, pe_event *e) {
  if (e->impl) cudaEventDestroy((cudaEvent_t)e->impl);
  e->impl = NULL;
}

static pe_status *cuda_event_record(pe_event *e, pe_stream *base) {
  if (base->dev != e->dev)
    return pe_error(PE_EINVAL, "event of %s recorded on stream %s", e->dev->streams[0]->name,
                    base->name);
  cuda_stream *s = (cuda_stream *)base;
  PE_TRY(set_device(base->dev));
  char what[80];
  snprintf(what, sizeof what, "%s: cudaEventRecord", base->name);
  PE_TRY(pe_cuda_status(cudaEventRecord((cudaEvent_t)e->impl, s->cctx.stream), what));
  e->stream = base;
  e->ticket = pe_stream_error_mark(&s->err);
  return NULL;
}

static pe_status *cuda_event_sync(const pe_event *e) {
  if (!e->stream) return NULL;
  cuda_stream *s = (cuda_stream *)e->stream;
  cudaSetDevice(e->dev->place.id);
  cudaError_t ce = cudaEventSynchronize((cudaEvent_t)e->impl);
  if (ce != cudaSuccess) {
    char what[80];
    snprintf(what, sizeof what, "%s: cudaEventSynchronize", e->stream->name);
    return pe_cuda_status(ce, what);
  }
  return pe_stream_error_at(&s->err, e->ticket);
}

static pe_status *cuda_stream_wait_event(pe_stream *base, const pe_event *e) {
  if (!e->stream) return NULL; /* never recorded: complete */
  if (e->dev->ops == &pe_device_cuda_ops) {
    cuda_stream *s = (cuda_stream *)base;
    PE_TRY(set_device(base->dev));
    char what[96];
    snprintf(what, sizeof what, "%s: cudaStreamWaitEvent on %s", base->name, e->stream->name);
    return pe_cuda_status(cudaStreamWaitEvent(s->cctx.stream, (cudaEvent_t)e->impl, 0), what);
  }
  /* Another kind: synchronous (cpu) events are complete when recorded; an
   * asynchronous one (sim) is waited for on the host. */
  if (e->dev->ops->async) pe_status_free(e->dev->ops->event_sync(e));
  return NULL;
}

static bool cuda_event_query(const pe_event *e) {
  if (!e->stream) return true;
  cudaError_t ce = cudaEventQuery((cudaEvent_t)e->impl);
  if (ce == cudaErrorNotReady) return false;
  if (ce != cudaSuccess) cudaGetLastError(); /* a failed event counts as done */
  return true;
}

const pe_device_ops pe_device_cuda_ops = {
    .name = "cuda",
    .async = true,
    .fn_at_launch = true,
    .host_memory = false,
    .open = cuda_open,
    .close = cuda_close,
    .launch = cuda_launch,
    .copy = cuda_copy,
    .drain = cuda_drain,
    .take_error = cuda_take_error,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_query = cuda_event_query,
    .event_sync = cuda_event_sync,
    .event_init = cuda_event_init,
    .event_fini = cuda_event_fini,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .comm = &pe_cuda_comm_ops,
    .graph = &pe_cuda_device_graph_ops,
};
