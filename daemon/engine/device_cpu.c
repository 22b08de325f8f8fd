/* cpu places: kernels run synchronously on the thread that launches them
 * (a pool worker). Streams exist so the executor's code is the same for
 * every kind; they hold only the kept error. Events are complete as soon as
 * they are recorded.
 *
 * Error bookkeeping without a lock on the success path: launch touches the
 * stream's error slot (engine/stream_error.h) only when fn failed. An event
 * records how many errors had been numbered when it was recorded, so
 * pe_event_sync reports the kept error only if it came from work that ran
 * before the record (the same rule as on async kinds). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_impl.h"
#include "ops/cpu/dnnl_util.h"
#include "stream_error.h"

typedef struct cpu_stream {
  pe_stream base;
  pe_stream_error err; /* the kept error */
} cpu_stream;

typedef struct cpu_device {
  pe_device base;
  cpu_stream streams[PE_STREAM_KINDS];
  pe_device_ctx ctx; /* shared by the calling threads; each binds it itself */
} cpu_device;

static pe_status *cpu_open(pe_place place, const pe_device_opts *opts, pe_device **out) {
  cpu_device *d = calloc(1, sizeof(*d));
  if (!d) return pe_error(PE_ENOMEM, "cpu:%d: out of memory", place.id);
  pe_device_base_init(&d->base, &pe_device_cpu_ops, place, opts->threads);
  /* cpu memory is host memory: tensors of every cpu place share the
   * process-wide caching allocator, which outlives any device. */
  d->base.alloc = pe_host_allocator();
  pe_status *st = pe_device_ctx_init(&d->ctx, place, d->base.threads);
  /* Create the oneDNN engine and stream now: the context is shared by
   * every thread that launches here, and pe_dnnl_get creates them lazily
   * without a lock. After open the context is read-only. */
  dnnl_engine_t eng;
  dnnl_stream_t strm;
  if (!st) st = pe_dnnl_get(&d->ctx, &eng, &strm);
  if (st) {
    pe_device_ctx_destroy(&d->ctx);
    pe_device_base_fini(&d->base);
    free(d);
    return st;
  }
  for (int k = 0; k < PE_STREAM_KINDS; k++) {
    cpu_stream *s = &d->streams[k];
    s->base.dev = &d->base;
    s->base.kind = (pe_stream_kind)k;
    s->base.ctx = &d->ctx;
    snprintf(s->base.name, sizeof s->base.name, "cpu:%d/%s", place.id,
             pe_stream_kind_name((pe_stream_kind)k));
    pe_stream_error_init(&s->err);
    d->base.streams[k] = &s->base;
  }
  *out = &d->base;
  return NULL;
}

static void cpu_close(pe_device *base) {
  cpu_device *d = (cpu_device *)base;
  for (int k = 0; k < PE_STREAM_KINDS; k++) pe_stream_error_destroy(&d->streams[k].err);
  pe_device_ctx_destroy(&d->ctx);
  pe_device_base_fini(&d->base);
  free(d);
}

static pe_status *cpu_launch(pe_stream *base, pe_stream_fn fn, void *arg) {
  pe_status *st = fn(arg);
  if (st) pe_stream_error_keep(&((cpu_stream *)base)->err, st);
  return NULL;
}

static pe_status *cpu_copy(pe_stream *s, void *dst, const void *src, size_t bytes,
                           pe_copy_kind kind) {
  if (bytes && dst != src) memcpy(dst, src, bytes);
  return NULL;
}

static void cpu_drain(pe_stream *s) { /* launch returned after fn ran */
}

static pe_status *cpu_take_error(pe_stream *base) {
  return pe_stream_error_take(&((cpu_stream *)base)->err);
}

static pe_status *cpu_event_record(pe_event *e, pe_stream *base) {
  if (base->dev != e->dev)
    return pe_error(PE_EINVAL, "event of %s recorded on stream %s", e->dev->streams[0]->name,
                    base->name);
  e->stream = base;
  e->ticket = pe_stream_error_mark(&((cpu_stream *)base)->err);
  return NULL;
}

/* The cpu "stream" is the calling thread: waiting on an event of an
 * asynchronous device blocks it. */
static pe_status *cpu_stream_wait_event(pe_stream *s, const pe_event *e) {
  if (e->stream && e->dev->ops->async) pe_status_free(e->dev->ops->event_sync(e));
  return NULL;
}

static bool cpu_event_query(const pe_event *e) {
  return true;
}

static pe_status *cpu_event_sync(const pe_event *e) {
  if (!e->stream) return NULL;
  return pe_stream_error_at(&((cpu_stream *)e->stream)->err, e->ticket);
}

static void *cpu_alloc(pe_device *d, size_t bytes, size_t *cap) {
  return pe_alloc(d->alloc, bytes, cap);
}

static void cpu_free(pe_device *d, void *p, size_t cap) {
  pe_free(d->alloc, p, cap);
}

const pe_device_ops pe_device_cpu_ops = {
    .name = "cpu",
    .async = false,
    .fn_at_launch = true,
    .host_memory = true,
    .open = cpu_open,
    .close = cpu_close,
    .launch = cpu_launch,
    .copy = cpu_copy,
    .drain = cpu_drain,
    .take_error = cpu_take_error,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_query = cpu_event_query,
    .event_sync = cpu_event_sync,
    .alloc = cpu_alloc,
    .free = cpu_free,
};
