/* Input prefetch (contract in prefetch.h).
 *
 * Slots. Slot k % depth holds batch k. Its state moves
 *   FREE --(filled)--> READY --(next)--> TAKEN --(release)--> FREE.
 * All state, the sequence counters, `done`, `err` and `busy` are guarded by
 * mu. A slot is filled without the lock: while a slot is FREE only its
 * filler touches its tensors, while READY/TAKEN only the consumer does, and
 * each hand-over goes through mu. The consumer waits on ready_cv for its
 * next slot to be READY or for production to be done.
 *
 * Who fills. Without a pool, the prefetch thread: it waits on free_cv for
 * its next slot to be FREE, then produces, fills and splits it. With a
 * pool (two-phase batches) there is no thread: whoever frees a slot or
 * finishes a batch (release, the start, the batch's last fill task) calls
 * kick, which produces the next batch if its slot is FREE and none is in
 * flight (`busy`), and queues one fill task per place; the last of them
 * splits the batch, publishes it and kicks again. Why: a thread that
 * sleeps and wakes twice per batch takes a busy core from the pool at
 * every step end on a machine whose cores are all pool workers. */
#include "prefetch.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* A piece of one place's rows of a two-phase batch (opts.fill), as a pool
 * task (pieces: prefetch.h). Why pieces: fills run in a worker's idle time,
 * and a step boundary is such a time (the chaining worker releases the old
 * batch, which queues the fills, just before it starts the next step); a
 * worker that took a place's whole fill finished it before it saw its
 * place's first op at the front of its queue, and that place started late
 * (the MLP on cpu:2: ~37 us of a ~700 us step, every step). */
typedef struct fill_task {
  pe_task task;
  pe_prefetch *pf;
  pe_tensor *in;
  int64_t lo, hi;
  pe_status *st;
} fill_task;

typedef enum slot_state { SLOT_FREE, SLOT_READY, SLOT_TAKEN } slot_state;

typedef struct slot {
  slot_state state;
  pe_prefetch_batch batch;
  int64_t *counts;   /* n_places */
  pe_tensor *parts;  /* n_places * n_inputs */
  pe_tensor *inputs; /* host places only: this slot's own staging (parts view it) */
} slot;

struct pe_prefetch {
  pe_prefetch_opts o;
  pe_device **devices; /* copy of o.devices, or NULL */
  pe_tensor *inputs;   /* staging for device copies; prefetch thread only */
  /* Every place is a cpu place: the parts are views of rows of the slot's
   * own staging, so a split copies nothing (a copy there would only take a
   * core from the pool). Devices (sim, cuda) get real copies on h2d. */
  bool host_views;
  pe_event **events; /* per device, for the h2d copies; prefetch thread only */
  slot *slots;
  pthread_t thread; /* without a pool */
  bool started;
  pthread_mutex_t mu;
  pthread_cond_t ready_cv, free_cv;
  uint64_t produced; /* batches made READY (thread) */
  uint64_t consumed; /* batches handed out by next (consumer) */
  bool stop;         /* stop requested */
  bool done;         /* production finished: end of data or error */
  pe_status *err;    /* the production failure, returned by next */
  /* With a pool: a batch is being produced or filled (its index: filling;
   * its fill tasks: fills, fill_left counts those not done). */
  bool busy;
  uint64_t filling;
  fill_task *fills; /* [n_places * PE_PREFETCH_FILL_PIECES], n_fills in use */
  int n_fills;
  atomic_int fill_left;
};

/* Split the staged inputs `in` into slot s (prefetch thread, s is FREE). */
static pe_status *split(pe_prefetch *pf, slot *s, pe_tensor *in, uint64_t index) {
  int np = pf->o.n_places, ni = pf->o.n_inputs;
  char sa[PE_SHAPE_STRLEN], sb[PE_SHAPE_STRLEN];
  for (int i = 0; i < ni; i++) {
    if (in[i].shape.ndim < 1 || (!in[i].data && pe_tensor_numel(&in[i]) > 0))
      return pe_error(PE_ESHAPE,
                      "prefetch batch %llu: input %d has shape %s (no batch dim or no data)",
                      (unsigned long long)index, i, pe_shape_str(&in[i].shape, sa, sizeof sa));
    if (in[i].shape.d[0] != in[0].shape.d[0])
      return pe_error(
          PE_ESHAPE,
          "prefetch batch %llu: input %d shape %s vs input 0 shape %s: batch sizes differ",
          (unsigned long long)index, i, pe_shape_str(&in[i].shape, sa, sizeof sa),
          pe_shape_str(&in[0].shape, sb, sizeof sb));
  }
  int64_t total = in[0].shape.d[0];
  int64_t off = 0;
  for (int p = 0; p < np; p++) {
    int64_t cnt = pe_split_count(total, np, p);
    s->counts[p] = cnt;
    pe_device *dev = pf->devices ? pf->devices[p] : NULL;
    pe_allocator *a =
        dev && pe_device_allocator(dev) ? pe_device_allocator(dev) : pe_host_allocator();
    for (int i = 0; i < ni; i++) {
      pe_tensor *t = &s->parts[p * ni + i];
      pe_shape sh = in[i].shape;
      sh.d[0] = cnt;
      size_t row =
          (size_t)pe_shape_prod(&in[i].shape, 1, in[i].shape.ndim) * pe_dtype_size(in[i].dtype);
      char *src = (char *)in[i].data + (size_t)off * row;
      size_t bytes = (size_t)cnt * row;
      if (pf->host_views)
        pe_tensor_view(t, in[i].dtype, &sh, bytes ? src : NULL);
      else
        PE_TRY(pe_tensor_resize_with(t, a, in[i].dtype, &sh, "prefetch part"));
      t->place = dev ? dev->place : (pe_place){PE_PLACE_CPU, p};
      if (!bytes || pf->host_views) continue;
      if (dev)
        PE_TRY(
            pe_stream_copy(pe_device_stream(dev, PE_STREAM_H2D), t->data, src, bytes, PE_COPY_H2D));
      else
        memcpy(t->data, src, bytes);
    }
    off += cnt;
  }
  if (pf->devices) {
    /* Wait for this batch's copies (the staging buffer is reused next).
     * A copy failure stays on the h2d stream for its next sync. */
    for (int p = 0; p < np; p++) {
      PE_TRY(pe_event_record(pf->events[p], pe_device_stream(pf->devices[p], PE_STREAM_H2D)));
      pe_status_free(pe_event_sync(pf->events[p]));
    }
  }
  s->batch.index = index;
  s->batch.total = total;
  return NULL;
}

/* Make slot s's batch READY, or record the end / failure (under mu; the
 * caller broadcasts ready_cv). */
static void publish_locked(pe_prefetch *pf, slot *s, pe_status *st, bool end) {
  if (st || end) {
    pf->err = st;
    pf->done = true;
  } else {
    s->state = SLOT_READY;
    pf->produced++;
  }
  pf->busy = false;
}

static void publish(pe_prefetch *pf, slot *s, pe_status *st, bool end) {
  pthread_mutex_lock(&pf->mu);
  publish_locked(pf, s, st, end);
  pthread_cond_broadcast(&pf->ready_cv);
  pthread_mutex_unlock(&pf->mu);
}

static pe_tensor *staging(pe_prefetch *pf, slot *s) {
  return pf->host_views ? s->inputs : pf->inputs;
}

static pe_status *producer_failed(pe_status *st, uint64_t k) {
  return pe_status_wrap(st, "prefetch batch %llu: producer", (unsigned long long)k);
}

/* --- with a pool: no thread ---------------------------------------------------- */

/* Under mu: take the next batch if its slot is FREE and none is in flight.
 * Once busy is set only the batch's filler touches pf until it publishes;
 * stop waits for that. */
static bool claim_locked(pe_prefetch *pf) {
  slot *s = &pf->slots[pf->produced % (uint64_t)pf->o.depth];
  if (pf->busy || pf->done || pf->stop || s->state != SLOT_FREE) return false;
  pf->busy = true;
  pf->filling = pf->produced;
  return true;
}

static void fill_run(void *arg);

/* Produce the claimed batch and queue its rows: one task per place, on
 * worker p. */
static void produce_claimed(pe_prefetch *pf) {
  uint64_t k = pf->filling;
  slot *s = &pf->slots[k % (uint64_t)pf->o.depth];
  bool end = false;
  pe_tensor *in = staging(pf, s);
  pe_status *st = pf->o.produce(pf->o.ctx, in, pf->o.n_inputs, &end);
  if (st || end) {
    publish(pf, s, st ? producer_failed(st, k) : NULL, end);
    return;
  }
  int np = pf->o.n_places;
  int64_t total = in[0].shape.ndim >= 1 ? in[0].shape.d[0] : 0, off = 0;
  int64_t cnt[PE_MAX_PLACES];
  int pieces[PE_MAX_PLACES], n = 0;
  for (int p = 0; p < np; p++) {
    cnt[p] = pe_split_count(total, np, p);
    pieces[p] = pe_prefetch_fill_pieces(cnt[p]);
    n += pieces[p];
  }
  /* Every piece is counted before the first one can run. */
  atomic_store_explicit(&pf->fill_left, n, memory_order_relaxed);
  pf->n_fills = n;
  fill_task *f = pf->fills;
  for (int p = 0; p < np; p++) {
    fill_task *first = f;
    for (int i = 0; i < pieces[p]; i++, f++) {
      int64_t lo = off + cnt[p] * i / pieces[p], hi = off + cnt[p] * (i + 1) / pieces[p];
      *f = (fill_task){{fill_run, f, i + 1 < pieces[p] ? &f[1].task : NULL}, pf, in, lo, hi, NULL};
    }
    off += cnt[p];
    /* One chain per place: one wake-up check, not one per piece. */
    pe_pool_submit_to(pf->o.pool, p, &first->task, &f[-1].task, pieces[p]);
  }
}

/* Start the next batch if it can start. Any thread. */
static void kick(pe_prefetch *pf) {
  pthread_mutex_lock(&pf->mu);
  bool go = claim_locked(pf);
  pthread_mutex_unlock(&pf->mu);
  if (go) produce_claimed(pf);
}

/* The batch's last fill task: the first failing place's error, or split;
 * publish it and, in the same critical section, claim the next one. */
static void batch_filled(pe_prefetch *pf) {
  uint64_t k = pf->filling;
  slot *s = &pf->slots[k % (uint64_t)pf->o.depth];
  pe_status *st = NULL;
  for (int i = 0; i < pf->n_fills; i++) { /* place-major, in row order */
    if (!st)
      st = pf->fills[i].st;
    else
      pe_status_free(pf->fills[i].st);
  }
  if (st)
    st = producer_failed(st, k);
  else
    st = split(pf, s, staging(pf, s), k);
  pthread_mutex_lock(&pf->mu);
  publish_locked(pf, s, st, false);
  bool go = claim_locked(pf);
  pthread_cond_broadcast(&pf->ready_cv);
  pthread_mutex_unlock(&pf->mu);
  if (go) produce_claimed(pf);
}

static void fill_run(void *arg) {
  fill_task *f = arg;
  pe_prefetch *pf = f->pf;
  f->st = pf->o.fill(pf->o.ctx, f->in, pf->o.n_inputs, f->lo, f->hi);
  /* acq_rel: the last one sees every place's rows and status. */
  if (atomic_fetch_sub_explicit(&pf->fill_left, 1, memory_order_acq_rel) == 1) batch_filled(pf);
}

/* --- without a pool: the prefetch thread ---------------------------------------- */

static void *prefetch_main(void *arg) {
  pe_prefetch *pf = arg;
  int depth = pf->o.depth;
  for (uint64_t k = 0;; k++) {
    slot *s = &pf->slots[k % (uint64_t)depth];
    pthread_mutex_lock(&pf->mu);
    while (s->state != SLOT_FREE && !pf->stop) pthread_cond_wait(&pf->free_cv, &pf->mu);
    bool stop = pf->stop;
    pthread_mutex_unlock(&pf->mu);
    if (stop) break;

    bool end = false;
    pe_tensor *in = staging(pf, s);
    pe_status *st = pf->o.produce(pf->o.ctx, in, pf->o.n_inputs, &end);
    if (!st && !end && pf->o.fill) {
      int64_t total = in[0].shape.ndim >= 1 ? in[0].shape.d[0] : 0;
      st = pf->o.fill(pf->o.ctx, in, pf->o.n_inputs, 0, total);
    }
    if (st)
      st = producer_failed(st, k);
    else if (!end)
      st = split(pf, s, in, k);
    publish(pf, s, st, end);
    if (st || end) break;
  }
  pthread_mutex_lock(&pf->mu);
  pf->done = true;
  pthread_cond_broadcast(&pf->ready_cv);
  pthread_mutex_unlock(&pf->mu);
  return NULL;
}

static void pf_free(pe_prefetch *pf) {
  int np = pf->o.n_places, ni = pf->o.n_inputs;
  if (pf->slots)
    for (int k = 0; k < pf->o.depth; k++) {
      if (pf->slots[k].parts)
        for (int j = 0; j < np * ni; j++) pe_tensor_release(&pf->slots[k].parts[j]);
      free(pf->slots[k].parts);
      free(pf->slots[k].counts);
      if (pf->slots[k].inputs)
        for (int i = 0; i < ni; i++) pe_tensor_release(&pf->slots[k].inputs[i]);
      free(pf->slots[k].inputs);
    }
  if (pf->inputs)
    for (int i = 0; i < ni; i++) pe_tensor_release(&pf->inputs[i]);
  if (pf->events)
    for (int p = 0; p < np; p++) pe_event_put(pf->events[p]);
  free(pf->events);
  free(pf->fills);
  free(pf->slots);
  free(pf->inputs);
  free(pf->devices);
  pe_status_free(pf->err);
  pthread_cond_destroy(&pf->ready_cv);
  pthread_cond_destroy(&pf->free_cv);
  pthread_mutex_destroy(&pf->mu);
  free(pf);
}

pe_status *pe_prefetch_start(const pe_prefetch_opts *opts, pe_prefetch **out) {
  *out = NULL;
  if (opts->n_places < 1 || opts->n_places > PE_MAX_PLACES || opts->n_inputs < 1 ||
      opts->n_inputs > 64 || !opts->produce || (opts->pool && !opts->fill))
    return pe_error(PE_EINVAL,
                    "prefetch: need 1..%d places, 1..64 inputs, a producer, and a fill with a "
                    "pool (got %d, %d)",
                    PE_MAX_PLACES, opts->n_places, opts->n_inputs);
  pe_prefetch *pf = calloc(1, sizeof(*pf));
  if (!pf) return pe_error(PE_ENOMEM, "prefetch: out of memory");
  pf->o = *opts;
  if (pf->o.depth <= 0) pf->o.depth = 2;
  pthread_mutex_init(&pf->mu, NULL);
  pthread_cond_init(&pf->ready_cv, NULL);
  pthread_cond_init(&pf->free_cv, NULL);
  int np = pf->o.n_places, ni = pf->o.n_inputs, depth = pf->o.depth;
  pf->host_views = true;
  for (int p = 0; opts->devices && p < np; p++)
    pf->host_views &= opts->devices[p]->place.kind == PE_PLACE_CPU;
  bool ok = (pf->inputs = calloc((size_t)ni, sizeof(pe_tensor))) &&
            (pf->slots = calloc((size_t)depth, sizeof(slot))) &&
            (!opts->pool ||
             (pf->fills = calloc((size_t)np * PE_PREFETCH_FILL_PIECES, sizeof(fill_task))));
  for (int k = 0; ok && k < depth; k++) {
    slot *s = &pf->slots[k];
    ok = (s->counts = calloc((size_t)np, sizeof(int64_t))) &&
         (s->parts = calloc((size_t)np * (size_t)ni, sizeof(pe_tensor))) &&
         (!pf->host_views || (s->inputs = calloc((size_t)ni, sizeof(pe_tensor))));
    if (!ok) break;
    s->state = SLOT_FREE;
    s->batch =
        (pe_prefetch_batch){.n_places = np, .n_inputs = ni, .counts = s->counts, .parts = s->parts};
  }
  pe_status *st = ok ? NULL : pe_error(PE_ENOMEM, "prefetch: out of memory");
  if (!st && opts->devices && !pf->host_views) {
    pf->devices = calloc((size_t)np, sizeof(pe_device *));
    pf->events = calloc((size_t)np, sizeof(pe_event *));
    if (!pf->devices || !pf->events) st = pe_error(PE_ENOMEM, "prefetch: out of memory");
    for (int p = 0; !st && p < np; p++) {
      pf->devices[p] = opts->devices[p];
      st = pe_event_get(pf->devices[p], &pf->events[p]);
    }
    pf->o.devices = pf->devices;
  }
  if (!st && pf->o.pool) {
    kick(pf); /* every later batch: kicked by a release or the previous batch */
  } else if (!st) {
    int rc = pthread_create(&pf->thread, NULL, prefetch_main, pf);
    if (rc)
      st = pe_error(PE_EINTERNAL, "prefetch: cannot start the thread (error %d)", rc);
    else
      pf->started = true;
  }
  if (st) {
    pf_free(pf);
    return st;
  }
  *out = pf;
  return NULL;
}

static pe_status *take(pe_prefetch *pf, bool block, pe_prefetch_batch **out, bool *ready) {
  *out = NULL;
  *ready = true;
  pe_status *st = NULL;
  pthread_mutex_lock(&pf->mu);
  slot *s = &pf->slots[pf->consumed % (uint64_t)pf->o.depth];
  /* Batches are READY in order, so "consumed < produced" means s is ours. */
  while (block && pf->consumed == pf->produced && !pf->done)
    pthread_cond_wait(&pf->ready_cv, &pf->mu);
  if (pf->consumed < pf->produced) {
    s->state = SLOT_TAKEN;
    pf->consumed++;
    *out = &s->batch;
  } else if (!pf->done) {
    *ready = false;
  } else if (pf->err) {
    st = pe_error(pf->err->code, "%s", pf->err->msg);
  }
  pthread_mutex_unlock(&pf->mu);
  return st;
}

pe_status *pe_prefetch_next(pe_prefetch *pf, pe_prefetch_batch **out) {
  bool ready;
  return take(pf, true, out, &ready);
}

pe_status *pe_prefetch_try_next(pe_prefetch *pf, pe_prefetch_batch **out, bool *ready) {
  return take(pf, false, out, ready);
}

void pe_prefetch_release(pe_prefetch *pf, pe_prefetch_batch *b) {
  if (!b) return;
  slot *s = &pf->slots[b->index % (uint64_t)pf->o.depth];
  pthread_mutex_lock(&pf->mu);
  s->state = SLOT_FREE;
  if (!pf->o.pool) pthread_cond_signal(&pf->free_cv);
  pthread_mutex_unlock(&pf->mu);
  if (pf->o.pool) kick(pf);
}

void pe_prefetch_stop(pe_prefetch *pf) {
  if (!pf) return;
  pthread_mutex_lock(&pf->mu);
  pf->stop = true;
  pthread_cond_broadcast(&pf->free_cv);
  /* With a pool: a batch in flight has fill tasks that use pf. */
  while (pf->busy) pthread_cond_wait(&pf->ready_cv, &pf->mu);
  pthread_mutex_unlock(&pf->mu);
  if (pf->started) pthread_join(pf->thread, NULL);
  pf_free(pf);
}
