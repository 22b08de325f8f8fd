/* Asynchronous places (sim, cuda): the write fences of persistable
 * replicas and the tail a run leaves in flight (parallel/executor_internal.h).
 *
 * Fences (parallel/internal.h par_fence). An op node that updates a persistable
 * records the replica's fence right after its launch and releases its
 * engine variables at once; readers on another stream wait for it
 * (par_wait_fences), pe_model_get syncs it (parallel/model.c).
 *
 * Tail. par_end_async waits only for what the run hands back to its caller
 * (the h2d streams: sim's copies read the caller's feed memory when they
 * run; the fetched values, par_fetch_wait), records end_ev on every stream
 * without waiting and marks the tail. par_drain, called by the next run
 * before it touches the executor's state, by pe_par_exec_sync and by free,
 * waits for those events and reports a failure found there once.
 *
 * Threads: fences are read and written by holders of the replica's engine
 * variable; the tail fields under run_mu (the caller's thread). */
#include <stdlib.h>

#include "engine/parallel/executor_internal.h"

#define OOM() pe_error(PE_ENOMEM, "parallel executor: out of memory")

/* --- fences ----------------------------------------------------------------- */

pe_status *par_sync_dep(pe_par_exec *e, bool in_coll, pe_stream *producer, const pe_event *ev,
                        pe_stream *consumer) {
  if (e->sync == PE_SYNC_WAIT_PRODUCER && e->m->dcomm && producer && producer != consumer &&
      producer->kind == PE_STREAM_COMM) {
    if (!in_coll) return par_model_dcomm_finish(e->m);
    return pe_device_sync_dep(PE_SYNC_WAIT_EVENT, producer, ev, consumer);
  }
  return pe_device_sync_dep(e->sync, producer, ev, consumer);
}

pe_status *par_fence_wait(pe_par_exec *e, bool in_coll, const par_fence *f, pe_stream *s) {
  if (!f->s || f->s == s) return NULL; /* none, or in stream order already */
  return par_sync_dep(e, in_coll, f->s, f->ev, s);
}

pe_status *par_fence_sync(const par_fence *f) {
  return f->s ? pe_event_sync(f->ev) : NULL;
}

pe_status *par_fence_record(par_fence *f, pe_stream *s) {
  if (!f->ev) return NULL; /* host place: written when the kernel returned */
  PE_TRY(pe_event_record(f->ev, s));
  f->s = s;
  return NULL;
}

static void add_fence(par_fence **a, int *n, par_fence *f) {
  for (int i = 0; i < *n; i++)
    if (a[i] == f) return;
  a[(*n)++] = f;
}

pe_status *par_compile_fences(pe_par_exec *e, xnode *x) {
  const pe_graph_node *n = x->n;
  const pe_graph *g = e->g;
  x->rfence = calloc((size_t)(n->n_in_lv ? n->n_in_lv : 1), sizeof(*x->rfence));
  x->wfence = calloc((size_t)(n->n_out_lv ? n->n_out_lv : 1), sizeof(*x->wfence));
  if (!x->rfence || !x->wfence) return OOM();
  for (int i = 0; i < n->n_out_lv; i++) {
    int lv = n->out_lv[i];
    if (e->lentry[lv])
      add_fence(x->wfence, &x->n_wfence, &e->lentry[lv]->fence[g->lvars[lv].place]);
  }
  for (int i = 0; i < n->n_in_lv; i++) {
    int lv = n->in_lv[i];
    if (e->lentry[lv])
      add_fence(x->rfence, &x->n_rfence, &e->lentry[lv]->fence[g->lvars[lv].place]);
  }
  return NULL;
}

pe_status *par_wait_fences(xnode *x, pe_stream *s) {
  bool in_coll = x->collective; /* launched under coll_mu */
  for (int i = 0; i < x->n_rfence; i++) PE_TRY(par_fence_wait(x->e, in_coll, x->rfence[i], s));
  return NULL;
}

bool par_allocates_persistable(const xnode *x) {
  const pe_graph_node *n = x->n;
  for (int i = 0; i < n->n_out_lv; i++)
    if (x->e->lentry[n->out_lv[i]] && !x->e->lt[n->out_lv[i]]->data) return true;
  return false;
}

/* --- the run's tail ---------------------------------------------------------- */

/* Record (record) and/or wait for (wait) end_ev on the places' streams of
 * the kinds in mask (bit k: pe_stream_kind k). The first error. */
static pe_status *end_events(pe_par_exec *e, unsigned mask, bool record, bool wait) {
  pe_status *first = NULL;
  for (int p = 0; p < e->n_places; p++)
    for (int k = 0; k < PE_STREAM_KINDS; k++) {
      if (!(mask & (1u << k))) continue;
      pe_event *ev = e->end_ev[p * PE_STREAM_KINDS + k];
      pe_status *st = record ? pe_event_record(ev, pe_device_stream(e->dev[p], k)) : NULL;
      if (!st && wait) st = pe_event_sync(ev);
      if (st && !first)
        first = st;
      else
        pe_status_free(st);
    }
  return first;
}

#define ALL_STREAMS ((1u << PE_STREAM_KINDS) - 1)

pe_status *par_sync_streams(pe_par_exec *e) {
  return end_events(e, ALL_STREAMS, true, true);
}

pe_status *par_drain(pe_par_exec *e) {
  if (e->tail_err) { /* drained by pe_par_exec_release: reported now */
    pe_status *st = e->tail_err;
    e->tail_err = NULL;
    return st;
  }
  if (!e->tail) return NULL;
  e->tail = false;
  if (e->m->dcomm) par_fail(e, par_dcomm_finish(e)); /* collective errors, not hangs */
  par_fail(e, end_events(e, ALL_STREAMS, false, true));
  pe_status *st = atomic_exchange(&e->err, NULL);
  if (e->tail_quiet) {
    pe_status_free(st);
    return NULL;
  }
  return st ? pe_status_wrap(st,
                             "the previous run returned before its device work ran; that work "
                             "failed")
            : NULL;
}

pe_status *pe_par_exec_sync(pe_par_exec *e) {
  if (pe_pool_is_worker(e->rt->pool))
    return pe_error(PE_EINVAL, "parallel executor: sync called from a pool worker");
  pthread_mutex_lock(&e->run_mu);
  pe_status *st = par_drain(e);
  pthread_mutex_unlock(&e->run_mu);
  return st;
}

void par_end_async(pe_par_exec *e, const char *const *fetch, int n_fetch) {
  bool all = e->feeds_viewed || e->tl;
  /* Collective errors, not hangs: before waiting for any collective's output. */
  if (e->m->dcomm && (all || n_fetch)) par_fail(e, par_dcomm_finish(e));
  if (all) {
    par_fail(e, par_sync_streams(e));
    return;
  }
  if (e->has_feeds) par_fail(e, end_events(e, 1u << PE_STREAM_H2D, true, true));
  if (n_fetch) par_fail(e, par_fetch_wait(e, fetch, n_fetch));
  par_fail(e, end_events(e, ALL_STREAMS, true, false));
  e->tail = true;
}
