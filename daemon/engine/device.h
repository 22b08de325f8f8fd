/* Devices behind one interface.
 *
 * A device is one place (cpu:N, sim:N, cuda:N). Every kind fills one table
 * of function pointers (pe_device_ops); the executor only calls the inline
 * wrappers below, so a new kind (cuda) plugs in without the executor
 * changing. This header is the contract; it only grows (additive changes).
 *
 *   stream  an in-order queue of work on a device. Every device has one
 *           stream of each pe_stream_kind (compute, comm, copy h2d, copy d2h).
 *           pe_stream_launch(s, fn, arg) queues fn(arg).
 *             cpu : fn runs at once, synchronously, on the calling thread
 *                   (several pool threads may launch on the same cpu stream
 *                   at the same time; "in order" holds per calling thread).
 *             sim : fn is queued and runs later on the stream's own thread,
 *                   after everything launched on that stream before it.
 *   event   a position in a stream's queue. pe_event_record(e, s) marks
 *           "everything launched on s so far"; the event completes when
 *           that work has completed. pe_stream_wait_event(s2, e) makes s2
 *           (asynchronously: the host does not block) run nothing launched
 *           after the wait until e completed. A wait captures e's position
 *           at the time of the call: e may be re-recorded or put back in
 *           the pool right after. Events come from a per-device pool
 *           (pe_event_get / pe_event_put); an event never recorded counts
 *           as complete. On cpu every event is complete when recorded.
 *   memory  pe_device_alloc / pe_device_free go through the device's
 *           caching allocator (size classes, free lists; see
 *           core/allocator.h). cpu and sim memory is host memory, and for
 *           them pe_device_allocator() returns the pe_allocator to give to
 *           pe_tensor_resize_with. pe_stream_copy queues a copy on a stream
 *           (h2d / d2h / d2d); on cpu it is a memcpy on the calling thread.
 *           Free a block only after the work that uses it has completed
 *           (stream or event sync); the allocator is not stream-ordered.
 *
 * Errors and ordering (all kinds behave the same):
 *  - pe_stream_launch returns only a failure to queue the work (ENOMEM, a
 *    closed device). The error fn returns is never returned by launch,
 *    even on cpu where fn has already run: it is kept on the stream.
 *  - A stream keeps its FIRST error since the last pe_stream_sync (later
 *    ones are freed). pe_stream_sync waits for all work launched on the
 *    stream before the call, then returns that error and clears it.
 *    pe_event_sync waits for the event and returns a copy of the stream's
 *    kept error if that error came from work at or before the event's
 *    position; it does not clear it.
 *  - Work launched after a failure still runs. The device layer does not
 *    know which later work depends on the failed work; the executor does,
 *    and its kernel wrapper (running on the stream) skips an op whose
 *    inputs are marked failed (MXNet's rule).
 *    Likewise a wait on an event of a failed stream completes normally.
 *
 * The two synchronisation strategies (switchable at run time):
 *   PE_SYNC_WAIT_EVENT     the consumer stream waits on an event recorded
 *                          after the producer's work (cudaStreamWaitEvent);
 *                          the host never blocks.
 *   PE_SYNC_WAIT_PRODUCER  the host drains the producer's whole stream
 *                          before the consumer's work is launched
 *                          (DeviceContext::Wait()); easier to debug.
 * pe_device_sync_dep() applies either, so the executor writes it once.
 *
 * Threads. Every function may be called from any thread unless its comment
 * says otherwise. A sim stream's work runs on that stream's thread, which
 * has bound the stream's pe_device_ctx (OpenMP team size) before the first
 * fn; pe_stream_ctx(s) is the kernel context to use inside fn (one per sim
 * stream, used by its thread only). On cpu the calling thread runs fn, so
 * the caller binds the context (the executor's pool does it in on_start
 * with pe_device_ctx_bind(pe_stream_ctx(s))); the cpu context is one per
 * device, shared by the calling threads, its oneDNN engine and stream
 * created at open so that it is read-only afterwards. */
#ifndef PE_ENGINE_DEVICE_H
#define PE_ENGINE_DEVICE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/allocator.h"
#include "core/place.h"
#include "core/status.h"
#include "ops/device_ctx.h"

typedef struct pe_device pe_device;
typedef struct pe_stream pe_stream;
typedef struct pe_event pe_event;

typedef enum pe_copy_kind { PE_COPY_H2D = 0, PE_COPY_D2H = 1, PE_COPY_D2D = 2 } pe_copy_kind;

typedef enum pe_sync_strategy {
  PE_SYNC_WAIT_EVENT = 0,    /* event waits (default) */
  PE_SYNC_WAIT_PRODUCER = 1, /* Wait() on the producer */
} pe_sync_strategy;

/* Work queued on a stream. NULL: success; a failure is kept on the stream
 * (see "Errors" above). fn owns nothing of the stream. */
typedef pe_status *(*pe_stream_fn)(void *arg);

typedef struct pe_device_opts {
  /* Intra-op thread budget of this device's kernels (OpenMP team size of
   * the threads that run them); <= 0: all cores. The runtime passes
   * cores / places (cpu: cores / max(places, pool workers)). sim binds it
   * on its compute and comm stream threads (its copy threads use 1). */
  int threads;
  /* 0 (default): the threads the device creates to run kernels (sim
   * streams) flush denormals to zero (core/fpenv.h); non-zero: keep them. */
  int keep_denormals;
  /* sim only, a test hook: non-zero makes the device report that its memory
   * is not host memory (pe_device_host_memory false), so the executor
   * reaches it only through copies, as on cuda, and that path is exercised
   * without a GPU. The memory itself stays host memory. */
  int device_memory;
} pe_device_opts;

/* One row per device kind. Implementations: device_cpu.c, device_sim.c;
 * a backend outside the engine registers its row (pe_device_register_kind).
 * Entries marked (opt) may be NULL. */
typedef struct pe_device_ops {
  const char *name; /* "cpu", "sim", "cuda" */
  bool async;       /* launch returns before fn's device work ran (sim, cuda) */
  /* launch runs fn itself on the calling thread before it returns (cpu;
   * cuda: fn enqueues the kernels), so fn's host-side effects (output
   * metadata, allocations, generator reservations) are done when launch
   * returns. false (sim): fn runs later on the stream's thread. */
  bool fn_at_launch;
  /* The device's memory is host memory: once the stream work that writes a
   * block completed, the host may read and write it directly (cpu, sim).
   * false (cuda): only copies queued on the device's streams reach it. */
  bool host_memory;
  pe_status *(*open)(pe_place place, const pe_device_opts *opts, pe_device **out);
  /* Drains every stream, stops the stream threads and frees the device.
   * Every event must have been put back. */
  void (*close)(pe_device *d);
  pe_status *(*launch)(pe_stream *s, pe_stream_fn fn, void *arg);
  pe_status *(*copy)(pe_stream *s, void *dst, const void *src, size_t bytes, pe_copy_kind kind);
  /* Block the calling thread until the work launched on s before the call
   * completed. Leaves the kept error alone. */
  void (*drain)(pe_stream *s);
  /* Take (and clear) the kept error of s; NULL when none. */
  pe_status *(*take_error)(pe_stream *s);
  pe_status *(*event_record)(pe_event *e, pe_stream *s);
  pe_status *(*stream_wait_event)(pe_stream *s, const pe_event *e);
  bool (*event_query)(const pe_event *e);
  pe_status *(*event_sync)(const pe_event *e);
  /* (opt) per-event backend resources, called when the pool grows/frees. */
  pe_status *(*event_init)(pe_device *d, pe_event *e);
  void (*event_fini)(pe_device *d, pe_event *e);
  void *(*alloc)(pe_device *d, size_t bytes, size_t *cap);
  void (*free)(pe_device *d, void *p, size_t cap);
  /* (opt) collectives across several devices of this kind on their comm
   * streams (engine/device_comm.h); NULL: the host collectives serve the
   * kind (its memory is host memory). */
  const struct pe_device_comm_ops *comm;
  /* (opt) step capture and replay (engine/device_graph.h); NULL: the kind's
   * steps are never captured. */
  const struct pe_device_graph_ops *graph;
} pe_device_ops;

/* The common part of every stream. Read-only for users; a kind embeds it
 * first in its own stream struct. */
struct pe_stream {
  pe_device *dev;
  pe_stream_kind kind;
  pe_device_ctx *ctx; /* kernel context for fns on this stream (owned by the device) */
  char name[32];      /* "sim:0/compute": the timeline's lane name */
};

/* An event. `stream` and `ticket` are its position: complete when the
 * stream has completed `ticket` pieces of work. stream == NULL: complete.
 * Owned by whoever took it from the pool until pe_event_put. */
struct pe_event {
  pe_device *dev;
  pe_stream *stream;
  uint64_t ticket;
  void *impl;          /* backend handle (cuda event); unused on cpu/sim */
  pe_event *pool_next; /* device pool link; owned by the pool */
};

/* The common part of every device. Read-only for users except through the
 * functions below; a kind embeds it first in its own device struct. */
struct pe_device {
  const pe_device_ops *ops;
  pe_place place;
  int threads;         /* intra-op budget (>= 1) */
  bool host_memory;    /* ops->host_memory, unless opened with opts.device_memory */
  pe_allocator *alloc; /* caching allocator: host memory (cpu, sim), device memory (cuda) */
  pe_stream *streams[PE_STREAM_KINDS];
  /* Event pool (device.c): ev_mu guards ev_free and ev_out. */
  pthread_mutex_t ev_mu;
  pe_event *ev_free;
  int ev_out; /* events taken and not put back */
};

/* --- devices ------------------------------------------------------------ */
/* The row of a kind, NULL when no backend registered it (cuda without nvcc). */
const pe_device_ops *pe_device_kind_ops(pe_place_kind kind);
/* A backend's row for its kind (cpu and sim are built in). Called before
 * any thread opens a device (a backend does it at program load); a later
 * registration of the same kind replaces the row. */
void pe_device_register_kind(pe_place_kind kind, const pe_device_ops *ops);
/* Open the device of `place`. opts may be NULL (defaults). */
pe_status *pe_device_open(pe_place place, const pe_device_opts *opts, pe_device **out);
/* NULL is a no-op. No launch may race with or follow this call. */
void pe_device_close(pe_device *d);

static inline pe_stream *pe_device_stream(pe_device *d, pe_stream_kind k) {
  return d->streams[k];
}
static inline bool pe_device_is_async(const pe_device *d) {
  return d->ops->async;
}
/* Whether the host may read and write this device's memory directly (once
 * the stream work that writes a block completed); false: only copies on its
 * streams reach it (engine/place_io.h does them). */
static inline bool pe_device_host_memory(const pe_device *d) {
  return d->host_memory;
}
static inline pe_allocator *pe_device_allocator(pe_device *d) {
  return d->alloc;
}
static inline pe_device_ctx *pe_stream_ctx(pe_stream *s) {
  return s->ctx;
}

/* --- streams -------------------------------------------------------------- */
static inline pe_status *pe_stream_launch(pe_stream *s, pe_stream_fn fn, void *arg) {
  return s->dev->ops->launch(s, fn, arg);
}
/* Queue a copy of `bytes` from src to dst on s (any stream kind may copy;
 * the copy streams exist so that copies overlap compute). */
static inline pe_status *pe_stream_copy(pe_stream *s, void *dst, const void *src, size_t bytes,
                                        pe_copy_kind kind) {
  return s->dev->ops->copy(s, dst, src, bytes, kind);
}
/* Wait for everything launched on s before the call; return and clear the
 * stream's kept error. */
pe_status *pe_stream_sync(pe_stream *s);
/* Wait for everything launched on s before the call; keep the error. */
static inline void pe_stream_drain(pe_stream *s) {
  s->dev->ops->drain(s);
}
/* s runs nothing launched after this call until e has completed. */
static inline pe_status *pe_stream_wait_event(pe_stream *s, const pe_event *e) {
  return s->dev->ops->stream_wait_event(s, e);
}

/* --- events --------------------------------------------------------------- */
/* Take an event from d's pool (allocates when the pool is empty). */
pe_status *pe_event_get(pe_device *d, pe_event **out);
/* Give it back; NULL is a no-op. Waits already queued on it are not
 * affected. */
void pe_event_put(pe_event *e);
/* s must be a stream of e's device. */
static inline pe_status *pe_event_record(pe_event *e, pe_stream *s) {
  return e->dev->ops->event_record(e, s);
}
/* Non-blocking: has e completed? */
static inline bool pe_event_query(const pe_event *e) {
  return e->dev->ops->event_query(e);
}
/* Block until e completes; see "Errors" for what is returned (caller owns). */
static inline pe_status *pe_event_sync(const pe_event *e) {
  return e->dev->ops->event_sync(e);
}

/* --- memory ------------------------------------------------------------------ */
/* NULL on failure. *cap receives the usable size (pass it to free). */
static inline void *pe_device_alloc(pe_device *d, size_t bytes, size_t *cap) {
  return d->ops->alloc(d, bytes, cap);
}
static inline void pe_device_free(pe_device *d, void *p, size_t cap) {
  d->ops->free(d, p, cap);
}

/* --- the executor's one synchronisation rule ------------------------------- */
/* Make work launched on `consumer` after this call see everything launched
 * on `producer` up to `producer_event` (an event recorded right after the
 * producer's work; NULL: everything launched on producer so far).
 *   WAIT_EVENT:    pe_stream_wait_event(consumer, producer_event); without
 *                  an event, one is recorded on producer from the pool.
 *   WAIT_PRODUCER: the calling thread drains producer's stream.
 * Nothing is done when producer == consumer (in-order already), when
 * either is NULL, or when the producer is a synchronous device (cpu: its
 * work completed before launch returned). Returns only a failure of the
 * synchronisation itself; the producer's kept error is left on its stream
 * (the executor learns op failures from its own kernel wrappers). */
pe_status *pe_device_sync_dep(pe_sync_strategy strategy, pe_stream *producer,
                              const pe_event *producer_event, pe_stream *consumer);

/* "event" / "producer"; parse accepts the same names. */
const char *pe_sync_strategy_name(pe_sync_strategy s);
bool pe_sync_strategy_parse(const char *name, pe_sync_strategy *out);

/* The built-in kind rows, for device.c's table. */
extern const pe_device_ops pe_device_cpu_ops;
extern const pe_device_ops pe_device_sim_ops;

#endif
