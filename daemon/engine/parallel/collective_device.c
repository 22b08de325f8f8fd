/* Collective nodes on places with device collectives (engine/device_comm.h;
 * cuda: NCCL) on every place's comm stream.
 *
 * The same synchronisation as the sim all-reduce (parallel/collective_nodes.c), with
 * the per-place parts replaced by one grouped call of the model's device
 * communicator from the launching thread: under the runtime's coll_mu,
 * every place's comm stream first waits for every predecessor of the node
 * (par_sync_dep, either strategy); a node that overwrites persistables also
 * waits for the place's compute stream (readers of the old value); then the
 * group is enqueued and an event is recorded on every comm stream
 * (x->ev[p]), which the node's consumers wait on. The host never touches the
 * data: par_coll_prepare only checks shapes and sizes outputs, and on such
 * places every producer's metadata is final when its successor is launched
 * (kernels are enqueued by the launching thread).
 *
 * Kinds: all_reduce (per gradient, `width` gradients in one group), the
 * fused all-reduce of a bucket, and broadcast (parameter initialisation).
 * Reduce and sharded updates are refused when the executor is made.
 *
 * Errors: an enqueue failure is the node's error; asynchronous errors are
 * found by par_dcomm_finish at the end of the run (pe_device_comm_wait,
 * which aborts the communicator on an error or after the time limit: later
 * runs of the model then fail with that reason instead of hanging). */
#include "engine/device_comm.h"
#include "engine/parallel/executor_internal.h"

/* Longest a run waits for its collectives after its last launch. */
#define DCOMM_FINISH_TIMEOUT_MS (120 * 1000)

/* Enqueue x's group; the caller holds coll_mu and has synced the comm
 * streams. */
static pe_status *enqueue(xnode *x) {
  pe_par_exec *e = x->e;
  const pe_graph_node *n = x->n;
  const pe_graph *g = e->g;
  int np = e->n_places, w = n->width > 0 ? n->width : 1;
  switch (n->kind) {
    case PE_NODE_ALL_REDUCE: {
      float *bufs[PE_MAX_PLACES * 8];
      size_t counts[8];
      /* Groups of at most 8 gradients (width is small: one per parameter of
       * an op), each group one call. */
      for (int k0 = 0; k0 < w; k0 += 8) {
        int nb = w - k0 < 8 ? w - k0 : 8;
        for (int j = 0; j < nb; j++) counts[j] = (size_t)x->counts[k0 + j];
        for (int p = 0; p < np; p++)
          for (int j = 0; j < nb; j++) bufs[p * nb + j] = pe_f32(x->cin[p * w + k0 + j]);
        PE_TRY(pe_device_comm_all_reduce(e->m->dcomm, bufs, counts, nb, PE_REDUCE_SUM));
      }
      return NULL;
    }
    case PE_NODE_FUSED_ALL_REDUCE: {
      float *bufs[PE_MAX_PLACES];
      for (int p = 0; p < np; p++) bufs[p] = e->bucket_mem[n->bucket * np + p];
      size_t count = (size_t)x->counts[0];
      return pe_device_comm_all_reduce(e->m->dcomm, bufs, &count, 1, PE_REDUCE_SUM);
    }
    case PE_NODE_BROADCAST:
      for (int k = 0; k < w; k++) {
        void *bufs[PE_MAX_PLACES] = {0};
        bufs[n->root] = x->cin[k]->data;
        for (int i = 0; i < np - 1; i++)
          bufs[g->lvars[n->out_lv[i * w + k]].place] = x->cout[i * w + k]->data;
        for (int p = 0; p < np; p++)
          if (!bufs[p])
            return pe_error(PE_EINTERNAL, "node %d %s: no buffer of '%s' on place %d", x->id,
                            n->name, g->lvars[n->in_lv[k]].name, p);
        PE_TRY(pe_device_comm_broadcast(e->m->dcomm, bufs, (size_t)x->counts[k], n->root));
      }
      return NULL;
    default:
      return pe_error(PE_EINTERNAL, "node %d %s: %s is not a device collective", x->id, n->name,
                      pe_node_kind_name(n->kind));
  }
}

pe_status *par_dcomm_record(xnode *x, pe_status *st) {
  for (int p = 0; p < x->e->n_places; p++) {
    pe_status *rs = pe_event_record(x->ev[p], x->ev_stream[p]);
    if (rs && !st)
      st = rs;
    else
      pe_status_free(rs);
  }
  return st;
}

pe_status *par_dcomm_launch(xnode *x) {
  pe_par_exec *e = x->e;
  int np = e->n_places;
  uint64_t t0 = e->tl ? pe_timeline_now_ns() : 0;
  /* A failed predecessor: nothing is enqueued (on no rank, so no peer waits
   * for a missing part); the events still move so consumers do not wait on
   * an earlier run's position. */
  bool skip = par_preds_sfailed(x);
  pe_status *st = skip ? NULL : par_coll_prepare(x);
  pthread_mutex_lock(&e->rt->coll_mu);
  for (int p = 0; p < np && !st && !skip; p++) {
    pe_stream *s = x->ev_stream[p];
    st = par_sync_preds(x, s, p);
    if (!st) st = par_wait_fences(x, s);
    if (!st && x->writes_persistable)
      st = pe_device_sync_dep(e->sync, pe_device_stream(e->dev[p], PE_STREAM_COMPUTE), NULL, s);
  }
  if (!st && !skip) st = enqueue(x);
  st = par_dcomm_record(x, st);
  pthread_mutex_unlock(&e->rt->coll_mu);
  /* A persistable writer (the startup broadcast) holds its engine variables
   * until its collective ran. Waited for with the backend's error poll and time
   * limit, not an event sync: a stuck collective would block this pool
   * worker, and the run with it, forever. */
  if (!st && !skip && x->engine && x->writes_persistable) st = par_model_dcomm_finish(e->m);
  if (st || skip) atomic_store_explicit(&x->sfail, true, memory_order_release);
  if (e->tl) par_record(x, e->g->places[0], x->ev_stream[0]->name, t0);
  return st;
}

pe_status *par_model_dcomm_finish(pe_model *m) {
  /* dcomm_mu, then coll_mu inside (an abort): par_dcomm_launch releases
   * coll_mu before it calls this, and nothing takes dcomm_mu under coll_mu. */
  pthread_mutex_lock(&m->dcomm_mu);
  pe_status *st = pe_device_comm_wait(m->dcomm, DCOMM_FINISH_TIMEOUT_MS, &m->rt->coll_mu);
  pthread_mutex_unlock(&m->dcomm_mu);
  return st ? pe_status_wrap(st, "collectives on %d %s places", m->n_places,
                             pe_place_kind_name(m->kind))
            : NULL;
}

pe_status *par_dcomm_finish(pe_par_exec *e) {
  pe_status *st = par_model_dcomm_finish(e->m);
  return st ? pe_status_wrap(st, "parallel executor") : NULL;
}
