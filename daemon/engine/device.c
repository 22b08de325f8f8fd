/* The kind-independent part of the device interface: the table of kinds,
 * the event pool, pe_stream_sync, device communicators and the executor's
 * synchronisation rule. */
#include "device.h"

#include <stdlib.h>
#include <string.h>

#include "device_comm.h"
#include "device_impl.h"

/* Kinds are rows. The engine builds in cpu and sim; any other kind's row
 * comes from its backend (pe_device_register_kind), so the engine names no
 * backend. Written before threads open devices, read-only afterwards. */
static const pe_device_ops *kind_table[PE_PLACE_KINDS] = {
    [PE_PLACE_CPU] = &pe_device_cpu_ops,
    [PE_PLACE_SIM] = &pe_device_sim_ops,
};

const pe_device_ops *pe_device_kind_ops(pe_place_kind kind) {
  if ((unsigned)kind >= sizeof kind_table / sizeof kind_table[0]) return NULL;
  return kind_table[kind];
}

void pe_device_register_kind(pe_place_kind kind, const pe_device_ops *ops) {
  if ((unsigned)kind < sizeof kind_table / sizeof kind_table[0]) kind_table[kind] = ops;
}

pe_status *pe_device_comm_new(pe_device *const *devs, int n, pe_device_comm **out) {
  *out = NULL;
  if (n < 1 || !devs[0]->ops->comm) return NULL;
  return devs[0]->ops->comm->comm_new(devs, n, out);
}

pe_status *pe_device_open(pe_place place, const pe_device_opts *opts, pe_device **out) {
  *out = NULL;
  const pe_device_ops *ops = pe_device_kind_ops(place.kind);
  char pb[32];
  if (!ops)
    return pe_error(PE_EINVAL, "device %s: kind '%s' is not built in",
                    pe_place_str(place, pb, sizeof pb), pe_place_kind_name(place.kind));
  if (place.id < 0 || place.id >= PE_MAX_PLACES)
    return pe_error(PE_EINVAL, "device %s: id out of range [0, %d)",
                    pe_place_str(place, pb, sizeof pb), PE_MAX_PLACES);
  pe_device_opts dflt = {0};
  return ops->open(place, opts ? opts : &dflt, out);
}

void pe_device_close(pe_device *d) {
  if (d) d->ops->close(d);
}

pe_status *pe_stream_sync(pe_stream *s) {
  s->dev->ops->drain(s);
  return s->dev->ops->take_error(s);
}

/* --- event pool ------------------------------------------------------------
 * A LIFO free list under the device's ev_mu. Events are small and taken
 * per op at most, so one mutex is enough; the executor can keep its events
 * across runs and not touch the pool in steady state. */

pe_status *pe_event_get(pe_device *d, pe_event **out) {
  pthread_mutex_lock(&d->ev_mu);
  pe_event *e = d->ev_free;
  if (e) d->ev_free = e->pool_next;
  d->ev_out++;
  pthread_mutex_unlock(&d->ev_mu);
  if (!e) {
    e = calloc(1, sizeof(*e));
    pe_status *st = NULL;
    if (!e)
      st = pe_error(PE_ENOMEM, "device: out of memory allocating an event");
    else if (d->ops->event_init && (st = d->ops->event_init(d, e))) {
      free(e);
      e = NULL;
    }
    if (st) {
      pthread_mutex_lock(&d->ev_mu);
      d->ev_out--;
      pthread_mutex_unlock(&d->ev_mu);
      *out = NULL;
      return st;
    }
    e->dev = d;
  }
  /* Never recorded: complete. */
  e->stream = NULL;
  e->ticket = 0;
  e->pool_next = NULL;
  *out = e;
  return NULL;
}

void pe_event_put(pe_event *e) {
  if (!e) return;
  pe_device *d = e->dev;
  pthread_mutex_lock(&d->ev_mu);
  e->pool_next = d->ev_free;
  d->ev_free = e;
  d->ev_out--;
  pthread_mutex_unlock(&d->ev_mu);
}

void pe_device_base_init(pe_device *d, const pe_device_ops *ops, pe_place place, int threads) {
  d->ops = ops;
  d->place = place;
  d->threads = threads > 0 ? threads : pe_cpu_cores();
  d->host_memory = ops->host_memory;
  pthread_mutex_init(&d->ev_mu, NULL);
  d->ev_free = NULL;
  d->ev_out = 0;
}

void pe_device_base_fini(pe_device *d) {
  pe_event *e = d->ev_free;
  while (e) {
    pe_event *n = e->pool_next;
    if (d->ops->event_fini) d->ops->event_fini(d, e);
    free(e);
    e = n;
  }
  d->ev_free = NULL;
  pthread_mutex_destroy(&d->ev_mu);
}

/* --- synchronisation rule --------------------------------------------------- */

pe_status *pe_device_sync_dep(pe_sync_strategy strategy, pe_stream *producer,
                              const pe_event *producer_event, pe_stream *consumer) {
  if (!producer || !consumer || producer == consumer) return NULL;
  if (!producer->dev->ops->async) return NULL; /* completed before launch returned */
  if (strategy == PE_SYNC_WAIT_PRODUCER) {
    pe_stream_drain(producer);
    return NULL;
  }
  if (producer_event) return pe_stream_wait_event(consumer, producer_event);
  /* No event given: mark "everything so far" with a pooled one. The wait
   * captures its position, so it goes back to the pool at once. */
  pe_event *e;
  PE_TRY(pe_event_get(producer->dev, &e));
  pe_status *st = pe_event_record(e, producer);
  if (!st) st = pe_stream_wait_event(consumer, e);
  pe_event_put(e);
  return st;
}

const char *pe_sync_strategy_name(pe_sync_strategy s) {
  return s == PE_SYNC_WAIT_PRODUCER ? "producer" : "event";
}

bool pe_sync_strategy_parse(const char *name, pe_sync_strategy *out) {
  if (!name) return false;
  if (!strcmp(name, "event"))
    *out = PE_SYNC_WAIT_EVENT;
  else if (!strcmp(name, "producer"))
    *out = PE_SYNC_WAIT_PRODUCER;
  else
    return false;
  return true;
}
