/* All-reduce nodes summed across the nodes of a job on device places
 * (executor_internal.h's par_dcross_*; cuda: NCCL).
 *
 * Per node, in stream order:
 *  1. the sum over the node's places: the device collective on every
 *     place's comm stream (parallel/collective_device.c), or nothing on
 *     one place (its comm stream only waits for the node's predecessors);
 *  2. the sum across nodes of place 0's buffers, on place 0's comm stream
 *     (the job's device communicator, called by parallel/cross.c in the
 *     job's order; it returns once the sum is in place 0's memory);
 *  3. the spread: a within-node broadcast from place 0 on every comm
 *     stream, then x's events on them, which x's consumers wait on.
 * x's consumers are launched only after 3 (par_cross_hold holds x until
 * every sum of the step is in), so they never wait on an event of 1.
 *
 * Threading: launch runs on the thread that launches x; spread on the
 * thread summing across nodes (one at a time); both enqueue under the
 * runtime's coll_mu, so every comm stream queues the device collectives
 * in one order. */
#include "engine/device_comm.h"
#include "engine/parallel/executor_internal.h"

/* One place: no sum over the places; the comm stream waits for x's
 * predecessors so that the sum across nodes reads the final gradient.
 * Where kernels run after their launch (sim), the gradients' shapes are
 * known once they ran: this thread waits for the comm stream first. */
static pe_status *launch_one_place(xnode *x) {
  pe_par_exec *e = x->e;
  uint64_t t0 = e->tl ? pe_timeline_now_ns() : 0;
  bool skip = par_preds_sfailed(x);
  pe_stream *s = x->ev_stream[0];
  pe_status *st = NULL;
  pthread_mutex_lock(&e->rt->coll_mu);
  if (!skip) st = par_sync_preds(x, s, 0);
  if (!st && !skip) st = par_wait_fences(x, s);
  pe_status *rs = pe_event_record(x->ev[0], s);
  pthread_mutex_unlock(&e->rt->coll_mu);
  if (rs && !st)
    st = rs;
  else
    pe_status_free(rs);
  if (!st && !skip && !e->dev[0]->ops->fn_at_launch) st = pe_stream_sync(s);
  skip = skip || par_preds_sfailed(x);
  if (!st && !skip) st = par_coll_prepare(x);
  if (st || skip) atomic_store_explicit(&x->sfail, true, memory_order_release);
  if (e->tl) par_record(x, e->g->places[0], s->name, t0);
  return st;
}

bool par_dcross_launch(xnode *x) {
  pe_par_exec *e = x->e;
  pe_status *st = e->m->dcomm ? par_dcomm_launch(x) : launch_one_place(x);
  if (st) {
    par_fail(e, pe_status_wrap(st, "node %d %s", x->id, x->n->name));
    atomic_store(&x->failed, true);
  }
  return true;
}

pe_status *par_dcross_spread(xnode *x, int k0, int m) {
  pe_par_exec *e = x->e;
  const pe_graph_node *n = x->n;
  int np = e->n_places;
  int w = n->kind == PE_NODE_FUSED_ALL_REDUCE ? 1 : (n->width > 0 ? n->width : 1);
  pe_status *st = NULL;
  pthread_mutex_lock(&e->rt->coll_mu);
  for (int k = 0; k < m && np > 1 && !st; k++) {
    size_t count = (size_t)x->counts[k0 + k];
    if (!count) continue;
    void *bufs[PE_MAX_PLACES];
    for (int p = 0; p < np; p++)
      bufs[p] = n->kind == PE_NODE_FUSED_ALL_REDUCE ? (void *)e->bucket_mem[n->bucket * np + p]
                                                    : x->cin[p * w + k0 + k]->data;
    st = pe_device_comm_broadcast(e->m->dcomm, bufs, count * sizeof(float), 0);
  }
  st = par_dcomm_record(x, st);
  pthread_mutex_unlock(&e->rt->coll_mu);
  return st ? pe_status_wrap(st, "node %d %s: spreading the sum across nodes to the %d places",
                             x->id, n->name, np)
            : NULL;
}
