/* sim places: an accelerator emulated on host memory, so that CI (no GPU)
 * runs the asynchronous code path of the executor.
 *
 * Each sim device has one stream per pe_stream_kind; each stream is served
 * by its own thread. A stream is a FIFO of items (a kernel fn, a copy, or a
 * wait on another stream's position) under the stream mutex. The thread
 * pops the head, runs it without the lock, then counts it in `done`.
 *
 * Positions. Items are numbered 1, 2, ... in queue order. `enqueued` is the
 * number queued so far; `done` the number completed (items complete in
 * order, one thread). An event recorded on s holds ticket = s.enqueued at
 * record time and is complete when s.done >= ticket. So recording queues
 * nothing, and a wait captures (stream, ticket) by value: the event may be
 * re-recorded or returned to the pool right after pe_stream_wait_event.
 *
 * Which thread touches what:
 *  - head/tail/free_items/enqueued/sleeping/n_waiters/stop/err: under mu,
 *    by launchers, waiters and the stream thread.
 *  - done: written only by the stream thread, under mu (so waiters that
 *    check it under mu cannot miss the broadcast); read lock-free by
 *    pe_event_query with acquire (pairs with the thread's release store,
 *    so a caller that sees the event complete also sees the work's writes).
 * Wake-ups cannot be lost: a launcher pushes and tests `sleeping` under mu,
 * the thread sets `sleeping` and waits under mu; waiters test `done` and
 * register in n_waiters under mu, the thread updates `done` and broadcasts
 * under mu.
 *
 * Deadlock freedom of waits: a wait item only names a position that was
 * already queued when the wait was queued, so the wait-for relation follows
 * queueing time and has no cycle. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fpenv.h"
#include "device_impl.h"

typedef enum item_kind { ITEM_FN, ITEM_COPY, ITEM_WAIT, ITEM_WAIT_FOREIGN } item_kind;

typedef struct sim_stream sim_stream;

typedef struct sim_item {
  struct sim_item *next;
  item_kind kind;
  pe_stream_fn fn; /* ITEM_FN */
  void *arg;
  void *dst; /* ITEM_COPY */
  const void *src;
  size_t bytes;
  sim_stream *wait_stream; /* ITEM_WAIT: complete when wait_stream.done >= wait_ticket */
  uint64_t wait_ticket;
  pe_event foreign; /* ITEM_WAIT_FOREIGN: a copy of another async kind's event */
} sim_item;

struct sim_stream {
  pe_stream base;
  pthread_t thread;
  bool started;
  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* the stream thread sleeps here when idle */
  pthread_cond_t done_cv; /* drains, event syncs and waiting streams sleep here */
  sim_item *head, *tail;
  sim_item *free_items; /* recycled items (no malloc per launch in steady state) */
  uint64_t enqueued;
  _Atomic uint64_t done;
  bool sleeping;
  int n_waiters;
  bool stop;
  pe_status *err;      /* first error since the last take_error */
  uint64_t err_ticket; /* position of the item that produced it */
  pe_device_ctx ctx;   /* bound on the stream thread */
  bool keep_denormals; /* pe_device_opts.keep_denormals, applied at thread start */
};

typedef struct sim_device {
  pe_device base;
  sim_stream streams[PE_STREAM_KINDS];
} sim_device;

/* --- waiting on positions --------------------------------------------------- */

static void wait_position(sim_stream *s, uint64_t ticket) {
  if (atomic_load_explicit(&s->done, memory_order_acquire) >= ticket) return;
  pthread_mutex_lock(&s->mu);
  /* relaxed under mu: the stream thread writes done under mu too. */
  while (atomic_load_explicit(&s->done, memory_order_relaxed) < ticket) {
    s->n_waiters++;
    pthread_cond_wait(&s->done_cv, &s->mu);
    s->n_waiters--;
  }
  pthread_mutex_unlock(&s->mu);
}

/* --- the stream thread -------------------------------------------------------- */

static pe_status *run_item(sim_item *it) {
  switch (it->kind) {
    case ITEM_FN: return it->fn(it->arg);
    case ITEM_COPY:
      if (it->bytes && it->dst != it->src) memcpy(it->dst, it->src, it->bytes);
      return NULL;
    case ITEM_WAIT: wait_position(it->wait_stream, it->wait_ticket); return NULL;
    case ITEM_WAIT_FOREIGN:
      /* Another async kind: block on its event; its errors are its own. */
      pe_status_free(it->foreign.dev->ops->event_sync(&it->foreign));
      return NULL;
  }
  return NULL;
}

static void *stream_main(void *p) {
  sim_stream *s = p;
  /* Kernels run here: the same denormal policy as the pool workers
   * (core/fpenv.h). Before the first parallel region, so this stream's
   * OpenMP team inherits it. */
  pe_fpenv_flush_denormals(!s->keep_denormals);
  pe_device_ctx_bind(&s->ctx);
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->stop) {
      s->sleeping = true;
      pthread_cond_wait(&s->work_cv, &s->mu);
      s->sleeping = false;
    }
    sim_item *it = s->head;
    if (!it) break; /* stop requested and the queue is drained */
    s->head = it->next;
    if (!s->head) s->tail = NULL;
    pthread_mutex_unlock(&s->mu);

    pe_status *st = run_item(it);

    pthread_mutex_lock(&s->mu);
    uint64_t pos = atomic_load_explicit(&s->done, memory_order_relaxed) + 1;
    /* release: the item's effects happen-before any acquire load that sees
     * pos (pe_event_query on another thread). */
    atomic_store_explicit(&s->done, pos, memory_order_release);
    if (st) {
      if (!s->err) {
        s->err = st;
        s->err_ticket = pos;
      } else {
        pe_status_free(st);
      }
    }
    it->next = s->free_items;
    s->free_items = it;
    if (s->n_waiters) pthread_cond_broadcast(&s->done_cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* Queue a copy of *tmpl. Fails only when no item can be allocated. One
 * lock round trip in steady state (the item comes from the free list). */
static pe_status *push_item(sim_stream *s, const sim_item *tmpl) {
  pthread_mutex_lock(&s->mu);
  sim_item *it = s->free_items;
  if (it) {
    s->free_items = it->next;
  } else {
    pthread_mutex_unlock(&s->mu);
    if (!(it = malloc(sizeof(*it))))
      return pe_error(PE_ENOMEM, "%s: out of memory queueing work", s->base.name);
    pthread_mutex_lock(&s->mu);
  }
  *it = *tmpl;
  it->next = NULL;
  if (s->tail)
    s->tail->next = it;
  else
    s->head = it;
  s->tail = it;
  s->enqueued++;
  if (s->sleeping) pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* --- ops ------------------------------------------------------------------------ */

static pe_status *sim_launch(pe_stream *base, pe_stream_fn fn, void *arg) {
  return push_item((sim_stream *)base, &(sim_item){.kind = ITEM_FN, .fn = fn, .arg = arg});
}

static pe_status *sim_copy(pe_stream *base, void *dst, const void *src, size_t bytes,
                           pe_copy_kind kind) {
  return push_item((sim_stream *)base,
                   &(sim_item){.kind = ITEM_COPY, .dst = dst, .src = src, .bytes = bytes});
}

static uint64_t enqueued_now(sim_stream *s) {
  pthread_mutex_lock(&s->mu);
  uint64_t t = s->enqueued;
  pthread_mutex_unlock(&s->mu);
  return t;
}

static void sim_drain(pe_stream *base) {
  sim_stream *s = (sim_stream *)base;
  wait_position(s, enqueued_now(s));
}

static pe_status *sim_take_error(pe_stream *base) {
  sim_stream *s = (sim_stream *)base;
  pthread_mutex_lock(&s->mu);
  pe_status *st = s->err;
  s->err = NULL;
  pthread_mutex_unlock(&s->mu);
  return st;
}

static pe_status *sim_event_record(pe_event *e, pe_stream *base) {
  if (base->dev != e->dev)
    return pe_error(PE_EINVAL, "event of %s recorded on stream %s", e->dev->streams[0]->name,
                    base->name);
  e->ticket = enqueued_now((sim_stream *)base);
  e->stream = base;
  return NULL;
}

static bool sim_event_query(const pe_event *e) {
  if (!e->stream) return true;
  sim_stream *s = (sim_stream *)e->stream;
  /* acquire: see sim_stream's comment on `done`. */
  return atomic_load_explicit(&s->done, memory_order_acquire) >= e->ticket;
}

static pe_status *sim_event_sync(const pe_event *e) {
  if (!e->stream) return NULL;
  sim_stream *s = (sim_stream *)e->stream;
  wait_position(s, e->ticket);
  pe_status *st = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->err && s->err_ticket <= e->ticket) st = pe_error(s->err->code, "%s", s->err->msg);
  pthread_mutex_unlock(&s->mu);
  return st;
}

static pe_status *sim_stream_wait_event(pe_stream *base, const pe_event *e) {
  if (!e->stream || e->stream == base) return NULL; /* none, or in order already */
  if (e->dev->ops == &pe_device_sim_ops) {
    if (sim_event_query(e)) return NULL;
    return push_item((sim_stream *)base, &(sim_item){.kind = ITEM_WAIT,
                                                     .wait_stream = (sim_stream *)e->stream,
                                                     .wait_ticket = e->ticket});
  }
  if (!e->dev->ops->async) return NULL; /* completed when recorded */
  return push_item((sim_stream *)base, &(sim_item){.kind = ITEM_WAIT_FOREIGN, .foreign = *e});
}

static void *sim_alloc(pe_device *d, size_t bytes, size_t *cap) {
  return pe_alloc(d->alloc, bytes, cap);
}

static void sim_free(pe_device *d, void *p, size_t cap) {
  pe_free(d->alloc, p, cap);
}

/* --- open / close ---------------------------------------------------------------- */

static void stream_fini(sim_stream *s) {
  if (s->started) {
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL); /* the thread drains its queue first */
  }
  sim_item *it = s->free_items;
  while (it) {
    sim_item *n = it->next;
    free(it);
    it = n;
  }
  pe_status_free(s->err);
  pe_device_ctx_destroy(&s->ctx);
  pthread_cond_destroy(&s->work_cv);
  pthread_cond_destroy(&s->done_cv);
  pthread_mutex_destroy(&s->mu);
}

static void sim_close(pe_device *base) {
  sim_device *d = (sim_device *)base;
  for (int k = 0; k < PE_STREAM_KINDS; k++)
    if (d->base.streams[k]) stream_fini(&d->streams[k]);
  pe_allocator_free(d->base.alloc);
  pe_device_base_fini(&d->base);
  free(d);
}

static pe_status *sim_open(pe_place place, const pe_device_opts *opts, pe_device **out) {
  sim_device *d = calloc(1, sizeof(*d));
  if (!d) return pe_error(PE_ENOMEM, "sim:%d: out of memory", place.id);
  pe_device_base_init(&d->base, &pe_device_sim_ops, place, opts->threads);
  if (opts->device_memory) d->base.host_memory = false; /* the test hook (device.h) */
  /* Device memory is host memory behind the device's own caching
   * allocator; tensors from it must be released before close. */
  d->base.alloc = pe_allocator_new();
  pe_status *st = d->base.alloc ? NULL : pe_error(PE_ENOMEM, "sim:%d: out of memory", place.id);
  for (int k = 0; k < PE_STREAM_KINDS && !st; k++) {
    sim_stream *s = &d->streams[k];
    s->base.dev = &d->base;
    s->base.kind = (pe_stream_kind)k;
    s->base.ctx = &s->ctx;
    s->keep_denormals = opts->keep_denormals != 0;
    snprintf(s->base.name, sizeof s->base.name, "sim:%d/%s", place.id,
             pe_stream_kind_name((pe_stream_kind)k));
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    atomic_init(&s->done, 0);
    d->base.streams[k] = &s->base;
    /* Kernels and collectives get the device's budget; copies are
     * memory-bound single loops. */
    bool copy = k == PE_STREAM_H2D || k == PE_STREAM_D2H;
    st = pe_device_ctx_init(&s->ctx, place, copy ? 1 : d->base.threads);
    if (st) break;
    int rc = pthread_create(&s->thread, NULL, stream_main, s);
    if (rc) {
      st =
          pe_error(PE_EINTERNAL, "%s: cannot start the stream thread (error %d)", s->base.name, rc);
      break;
    }
    s->started = true;
    char tn[16];
    snprintf(tn, sizeof tn, "sim%d-%.8s", place.id, pe_stream_kind_name((pe_stream_kind)k));
    pthread_setname_np(s->thread, tn);
  }
  if (st) {
    sim_close(&d->base);
    return st;
  }
  *out = &d->base;
  return NULL;
}

const pe_device_ops pe_device_sim_ops = {
    .name = "sim",
    .async = true,
    .fn_at_launch = false,
    .host_memory = true,
    .open = sim_open,
    .close = sim_close,
    .launch = sim_launch,
    .copy = sim_copy,
    .drain = sim_drain,
    .take_error = sim_take_error,
    .event_record = sim_event_record,
    .stream_wait_event = sim_stream_wait_event,
    .event_query = sim_event_query,
    .event_sync = sim_event_sync,
    .alloc = sim_alloc,
    .free = sim_free,
};
