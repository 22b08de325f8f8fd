/* Captured steps on cuda places (cuda/cuda_graph.h). */
#include "cuda/cuda_graph.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_ctx.h"
#include "engine/device_graph.h"
#include "engine/step_graph_key.h"

/* Per ordinal: the capture running on that GPU (the allocator's guard),
 * and its generator delta. capturing[] is 0 or 1; begin claims it. */
#define MAX_ORDINALS 64
static atomic_int capturing[MAX_ORDINALS];
static uint64_t *_Atomic capture_delta[MAX_ORDINALS];

bool pe_cuda_graph_capturing(int ordinal) {
  return ordinal >= 0 && ordinal < MAX_ORDINALS && atomic_load(&capturing[ordinal]) > 0;
}

const uint64_t *pe_cuda_graph_rng_delta(int ordinal, cudaStream_t s) {
  if (ordinal < 0 || ordinal >= MAX_ORDINALS) return NULL;
  const uint64_t *delta = atomic_load(&capture_delta[ordinal]);
  /* Another model's launch on the same GPU is not part of the capture. */
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (!delta || cudaStreamIsCapturing(s, &cs) != cudaSuccess) return NULL;
  return cs == cudaStreamCaptureStatusActive ? delta : NULL;
}

bool pe_cuda_graph_op_capturable(const char *type, unsigned op_flags, const char **why) {
  return pe_step_graph_op_capturable(type, op_flags, why);
}

struct pe_cuda_graph {
  int device;
  cudaStream_t stream; /* compute: where replays run */
  cudaGraphExec_t exec;
  uint64_t *delta; /* the generator step delta its random kernels read (device) */
  /* Pinned staging for feeds and fetches, grown as needed. */
  void *pin;
  size_t pin_cap;
};

/* The step's other streams. Only comm is forked into the capture: the
 * step's collectives run there. The copy streams are left out, since
 * other threads use them while a step records (the input prefetcher's
 * copies on h2d, a model read on d2h): forked in, their copies would be
 * recorded instead of run and their waits would invalidate the capture. A
 * copy stream that the step itself pulls in (a wait on a captured event)
 * is joined back at the end with the others. */
static const pe_stream_kind others[] = {PE_STREAM_COMM, PE_STREAM_H2D, PE_STREAM_D2H};
#define N_OTHERS (sizeof others / sizeof *others)

static pe_status *cu(cudaError_t e, int ordinal, const char *what) {
  if (e == cudaSuccess) return NULL;
  return pe_status_wrap(pe_cuda_status(e, what), "cuda:%d: captured step", ordinal);
}

/* Make `dst` wait on an event recorded on `src`. The event is a plain
 * cudaEvent owned by this call: cudaStreamWaitEvent copies the position,
 * so it is destroyed at once. */
static pe_status *link(pe_device *d, cudaStream_t src, cudaStream_t dst, const char *what) {
  cudaEvent_t ev;
  pe_status *st =
      cu(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), d->place.id, "cudaEventCreate");
  if (st) return st;
  st = cu(cudaEventRecord(ev, src), d->place.id, what);
  if (!st) st = cu(cudaStreamWaitEvent(dst, ev, 0), d->place.id, what);
  cudaEventDestroy(ev);
  return st;
}

/* The fork: comm waits on compute, which makes it part of the capture. */
static pe_status *fork_streams(pe_device *d) {
  cudaStream_t compute = pe_cuda_stream_handle(pe_device_stream(d, PE_STREAM_COMPUTE));
  cudaStream_t comm = pe_cuda_stream_handle(pe_device_stream(d, PE_STREAM_COMM));
  return link(d, compute, comm, "fork: comm waits on compute");
}

/* The join: compute waits on every other stream that is part of the
 * capture (comm, and a copy stream the step pulled in). */
static pe_status *join_streams(pe_device *d) {
  cudaStream_t compute = pe_cuda_stream_handle(pe_device_stream(d, PE_STREAM_COMPUTE));
  pe_status *st = NULL;
  for (size_t i = 0; i < N_OTHERS && !st; i++) {
    cudaStream_t other = pe_cuda_stream_handle(pe_device_stream(d, others[i]));
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    st = cu(cudaStreamIsCapturing(other, &cs), d->place.id, "join: cudaStreamIsCapturing");
    if (!st && cs != cudaStreamCaptureStatusNone)
      st = link(d, other, compute, "join: compute waits on another stream");
  }
  return st;
}

/* Release ordinal's capture slot and its delta (a failed capture). */
static void release_slot(int ordinal) {
  uint64_t *delta = atomic_exchange(&capture_delta[ordinal], NULL);
  if (delta) cudaFree(delta);
  atomic_store(&capturing[ordinal], 0);
}

pe_status *pe_cuda_graph_begin(pe_device *d) {
  if (d->ops != &pe_device_cuda_ops)
    return pe_error(PE_EINVAL, "step capture: place %s:%d is not a cuda place",
                    pe_place_kind_name(d->place.kind), d->place.id);
  int o = d->place.id;
  if (o < 0 || o >= MAX_ORDINALS)
    return pe_error(PE_EINVAL, "step capture: cuda:%d is past the %d GPUs it tracks", o,
                    MAX_ORDINALS);
  int idle = 0;
  if (!atomic_compare_exchange_strong(&capturing[o], &idle, 1))
    return pe_error(PE_EEXHAUSTED, "step capture: another step captures on cuda:%d", o);
  /* The delta is allocated and zeroed before the capture starts (no
   * cudaMalloc inside one); the capture's own launch reads 0. The slot is
   * claimed, so the allocator's guard is bypassed by calling cudaMalloc
   * directly. */
  uint64_t *delta = NULL;
  pe_status *st = cu(cudaSetDevice(o), o, "cudaSetDevice");
  if (!st) st = cu(cudaMalloc((void **)&delta, sizeof *delta), o, "cudaMalloc (generator delta)");
  atomic_store(&capture_delta[o], delta);
  if (!st) st = cu(cudaMemset(delta, 0, sizeof *delta), o, "cudaMemset (generator delta)");
  if (st) {
    release_slot(o);
    return st;
  }
  cudaStream_t compute = pe_cuda_stream_handle(pe_device_stream(d, PE_STREAM_COMPUTE));
  st = cu(cudaStreamBeginCapture(compute, cudaStreamCaptureModeThreadLocal), o,
          "cudaStreamBeginCapture");
  if (!st) st = fork_streams(d);
  if (st) {
    cudaGraph_t g = NULL;
    cudaStreamEndCapture(compute, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    release_slot(o);
  }
  return st;
}

pe_status *pe_cuda_graph_end(pe_device *d, pe_cuda_graph **out) {
  *out = NULL;
  cudaStream_t compute = pe_cuda_stream_handle(pe_device_stream(d, PE_STREAM_COMPUTE));
  pe_status *st = join_streams(d);
  cudaGraph_t graph = NULL;
  /* Always end the capture, also after a failed join: the streams must
   * leave capture mode whatever happened. */
  cudaError_t e = cudaStreamEndCapture(compute, &graph);
  /* The delta goes to the graph, or is freed with the failed capture. */
  uint64_t *delta = atomic_exchange(&capture_delta[d->place.id], NULL);
  atomic_store(&capturing[d->place.id], 0);
  if (!st) st = cu(e, d->place.id, "cudaStreamEndCapture (an unsafe call or an unjoined stream)");
  pe_cuda_graph *g = NULL;
  if (!st && !(g = calloc(1, sizeof *g)))
    st = pe_error(PE_ENOMEM, "cuda:%d: step capture: out of memory", d->place.id);
  if (g) {
    g->delta = delta;
    delta = NULL;
  }
  if (delta) cudaFree(delta);
  if (!st) {
    g->device = d->place.id;
    g->stream = compute;
    st = cu(cudaGraphInstantiate(&g->exec, graph, 0), d->place.id, "cudaGraphInstantiate");
  }
  if (graph) cudaGraphDestroy(graph); /* the instantiated graph keeps what it needs */
  if (st) {
    cudaGetLastError(); /* a failed capture is not sticky */
    pe_cuda_graph_free(g);
    return st;
  }
  *out = g;
  return NULL;
}

/* Pinned staging of at least `bytes` (kept across replays). */
static pe_status *staging(pe_cuda_graph *g, size_t bytes) {
  if (g->pin_cap >= bytes) return NULL;
  pe_cuda_pinned_free(g->pin, g->pin_cap);
  g->pin = pe_cuda_pinned_alloc(bytes, &g->pin_cap);
  if (!g->pin) {
    g->pin_cap = 0;
    return pe_error(PE_ENOMEM, "cuda:%d: replay: out of pinned memory for %zu bytes of staging",
                    g->device, bytes);
  }
  return NULL;
}

static size_t total_bytes(const pe_cuda_graph_io *io, int n) {
  size_t b = 0;
  for (int i = 0; i < n; i++) b += (io[i].bytes + 255) & ~(size_t)255;
  return b;
}

pe_status *pe_cuda_graph_replay(pe_cuda_graph *g, const pe_cuda_graph_io *feeds, int n_feeds,
                                const pe_cuda_graph_io *fetches, int n_fetches, uint64_t rng_delta,
                                const int *finite_flag_dev, bool *finite) {
  int d = g->device;
  size_t in = total_bytes(feeds, n_feeds) + 256, outb = total_bytes(fetches, n_fetches) + 256;
  PE_TRY(staging(g, in > outb ? in : outb));
  PE_TRY(cu(cudaSetDevice(g->device), d, "cudaSetDevice"));
  /* Feeds: host -> pinned on this thread, then DMA on the compute stream,
   * ordered before the graph (stream order). */
  size_t at = 0;
  for (int i = 0; i < n_feeds; i++) {
    memcpy((char *)g->pin + at, feeds[i].host, feeds[i].bytes);
    PE_TRY(cu(cudaMemcpyAsync(feeds[i].device, (char *)g->pin + at, feeds[i].bytes,
                              cudaMemcpyHostToDevice, g->stream),
              d, "replay: feed copy"));
    at += (feeds[i].bytes + 255) & ~(size_t)255;
  }
  /* The staging is reused for the fetches below: the feeds' DMA must have
   * read it first, which stream order gives (the fetch DMAs come after). */
  PE_TRY(pe_cuda_graph_launch(g, rng_delta));
  at = 0;
  for (int i = 0; i < n_fetches; i++) {
    PE_TRY(cu(cudaMemcpyAsync((char *)g->pin + at, fetches[i].device, fetches[i].bytes,
                              cudaMemcpyDeviceToHost, g->stream),
              d, "replay: fetch copy"));
    at += (fetches[i].bytes + 255) & ~(size_t)255;
  }
  int *flag = (int *)((char *)g->pin + at);
  if (finite_flag_dev)
    PE_TRY(
        cu(cudaMemcpyAsync(flag, finite_flag_dev, sizeof *flag, cudaMemcpyDeviceToHost, g->stream),
           d, "replay: finite flag copy"));
  /* One sync: the step's faults, the fetches and the flag arrive together. */
  PE_TRY(cu(cudaStreamSynchronize(g->stream), d, "replayed step"));
  at = 0;
  for (int i = 0; i < n_fetches; i++) {
    memcpy(fetches[i].host, (char *)g->pin + at, fetches[i].bytes);
    at += (fetches[i].bytes + 255) & ~(size_t)255;
  }
  if (finite) *finite = !finite_flag_dev || *flag == 0;
  return NULL;
}

pe_status *pe_cuda_graph_launch(pe_cuda_graph *g, uint64_t rng_delta) {
  int d = g->device;
  PE_TRY(cu(cudaSetDevice(d), d, "cudaSetDevice"));
  /* A pageable source is staged before cudaMemcpyAsync returns, so the
   * argument may go out of scope and back-to-back launches do not share a
   * slot; the copy is ordered before the graph on the stream. */
  PE_TRY(
      cu(cudaMemcpyAsync(g->delta, &rng_delta, sizeof rng_delta, cudaMemcpyHostToDevice, g->stream),
         d, "replay: generator delta copy"));
  return cu(cudaGraphLaunch(g->exec, g->stream), d, "cudaGraphLaunch");
}

static pe_status *graph_begin(pe_device *d) {
  return pe_cuda_graph_begin(d);
}

static pe_status *graph_end(pe_device *d, void **out) {
  pe_cuda_graph *g = NULL;
  pe_status *st = pe_cuda_graph_end(d, &g);
  *out = g;
  return st;
}

static pe_status *graph_launch(void *g, uint64_t rng_delta) {
  return pe_cuda_graph_launch(g, rng_delta);
}

const pe_device_graph_ops pe_cuda_device_graph_ops = {
    .begin = graph_begin,
    .end = graph_end,
    .launch = graph_launch,
    .free = pe_cuda_graph_free,
    .op_capturable = pe_cuda_graph_op_capturable,
};

void pe_cuda_graph_free(void *p) {
  pe_cuda_graph *g = p;
  if (!g) return;
  cudaSetDevice(g->device);
  if (g->exec) cudaGraphExecDestroy(g->exec);
  if (g->delta) cudaFree(g->delta);
  pe_cuda_pinned_free(g->pin, g->pin_cap);
  free(g);
}
