/* The parallel executor's construction (parallel/executor.h): pe_par_exec_new
 * binds a compiled graph to a model once, so that a run only re-arms
 * counters: each lvar gets its tensor (a model replica, a bucket view or
 * the executor's own), each node its engine variables, predecessors, batch
 * dependence, kernel and contexts, and on async places its events; then the
 * feeds, homes and end events. pe_par_exec_free undoes all of it.
 *
 * Split from parallel/executor.c, which keeps the run loop: binding happens
 * once per graph and touches no run state, running every step and owns
 * the scheduling. */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "engine/parallel/executor_internal.h"
#include "engine/place_io.h"

#define OOM() pe_error(PE_ENOMEM, "parallel executor: out of memory")

static pe_status *add_unique(pe_engine_var **a, int *n, pe_engine_var *v) {
  for (int i = 0; i < *n; i++)
    if (a[i] == v) return NULL;
  a[(*n)++] = v;
  return NULL;
}

static pe_status *compile_lvars(pe_par_exec *e) {
  pe_graph *g = e->g;
  int nl = g->n_lvars ? g->n_lvars : 1;
  e->own = calloc((size_t)nl, sizeof(*e->own));
  e->lt = calloc((size_t)nl, sizeof(*e->lt));
  e->lentry = calloc((size_t)nl, sizeof(*e->lentry));
  e->buf_mem = calloc((size_t)(g->n_buffers ? g->n_buffers : 1), sizeof(void *));
  e->buf_cap = calloc((size_t)(g->n_buffers ? g->n_buffers : 1), sizeof(size_t));
  if (!e->buf_mem || !e->buf_cap) return OOM();
  int nb = g->n_buckets * e->n_places;
  e->bucket_mem = calloc((size_t)(nb ? nb : 1), sizeof(void *));
  e->bucket_cap = calloc((size_t)(nb ? nb : 1), sizeof(size_t));
  if (!e->own || !e->lt || !e->lentry || !e->bucket_mem || !e->bucket_cap) return OOM();
  for (int b = 0; b < g->n_buckets; b++)
    for (int p = 0; p < e->n_places; p++) {
      size_t cap;
      void *mem = pe_device_alloc(e->dev[p], (size_t)g->buckets[b].bytes, &cap);
      if (!mem)
        return pe_error(PE_ENOMEM, "parallel executor: out of memory for bucket %d (%lld bytes)", b,
                        (long long)g->buckets[b].bytes);
      e->bucket_mem[b * e->n_places + p] = mem;
      e->bucket_cap[b * e->n_places + p] = cap;
      /* Padding is summed too. */
      PE_TRY(pe_place_zero(e->dev[p], mem, (size_t)g->buckets[b].bytes, "fused gradient bucket"));
    }
  char sb[PE_SHAPE_STRLEN];
  for (int i = 0; i < g->n_lvars; i++) {
    const pe_graph_lvar *lv = &g->lvars[i];
    if (lv->persistable) {
      PE_TRY(par_model_entry(e->m, lv->name, &e->lentry[i]));
      e->lt[i] = &e->lentry[i]->v[lv->place]->t;
      continue;
    }
    e->lt[i] = &e->own[i];
    if (lv->bucket >= 0) {
      /* A gradient stored in its bucket: a view with the static shape. */
      const pe_var_desc *d = lv->desc;
      if (!d || pe_shape_numel(&d->shape) < 0)
        return pe_error(PE_ESHAPE,
                        "parallel executor: bucket gradient '%s' has no static shape (%s)",
                        lv->name, d ? pe_shape_str(&d->shape, sb, sizeof sb) : "undeclared");
      char *base = e->bucket_mem[lv->bucket * e->n_places + lv->place];
      pe_tensor_view(&e->own[i], d->dtype, &d->shape, base + lv->bucket_offset);
    }
  }
  return NULL;
}

pe_status *par_compile_op_node(pe_par_exec *e, xnode *x, pe_device_ctx *ctx) {
  const pe_graph_node *n = x->n;
  const pe_op_def *def = n->def;
  if (!def || !n->desc)
    return pe_error(PE_EINTERNAL, "parallel executor: node %d (%s) has no op", x->id, n->name);
  x->kernel = pe_op_kernel(def, e->g->place_kind);
  x->state_free = pe_op_state_free(def, e->g->place_kind);
  if (!x->kernel)
    return pe_error(PE_EUNKNOWN_OP, "parallel executor: node %d (%s): op '%s' has no %s kernel",
                    x->id, n->name, def->type, pe_place_kind_name(e->g->place_kind));
  int nl = def->n_inputs + def->n_outputs;
  int na = n->n_in_data + n->n_out_data;
  x->tl = calloc((size_t)(nl ? nl : 1), sizeof(*x->tl));
  x->ml = calloc((size_t)(nl ? nl : 1), sizeof(*x->ml));
  x->tensors = calloc((size_t)(na ? na : 1), sizeof(*x->tensors));
  x->metas = calloc((size_t)(na ? na : 1), sizeof(*x->metas));
  x->mptrs = calloc((size_t)(na ? na : 1), sizeof(*x->mptrs));
  x->names = calloc((size_t)(na ? na : 1), sizeof(*x->names));
  if (!x->tl || !x->ml || !x->tensors || !x->metas || !x->mptrs || !x->names) return OOM();
  for (int a = 0; a < na; a++) {
    int lv = a < n->n_in_data ? n->in_lv[a] : n->out_lv[a - n->n_in_data];
    x->tensors[a] = e->lt[lv];
    x->names[a] = e->g->lvars[lv].name;
    x->mptrs[a] = &x->metas[a];
  }
  for (int s = 0; s < def->n_inputs; s++) {
    int lo = n->in_slot[s], hi = n->in_slot[s + 1];
    x->tl[s] = (pe_tensor_list){hi - lo, &x->tensors[lo]};
    x->ml[s] = (pe_meta_list){hi - lo, &x->names[lo], &x->mptrs[lo]};
  }
  for (int o = 0; o < def->n_outputs; o++) {
    int lo = n->n_in_data + n->out_slot[o], hi = n->n_in_data + n->out_slot[o + 1];
    x->tl[def->n_inputs + o] = (pe_tensor_list){hi - lo, &x->tensors[lo]};
    x->ml[def->n_inputs + o] = (pe_meta_list){hi - lo, &x->names[lo], &x->mptrs[lo]};
  }
  x->ic = (pe_infer_ctx){def, n->desc, n->src_op, true, x->ml, x->ml + def->n_inputs};
  x->kc = (pe_kernel_ctx){def,
                          n->desc,
                          n->src_op,
                          x->tl,
                          x->tl + def->n_inputs,
                          &x->state,
                          (def->flags & PE_OP_RANDOM) ? &e->m->rng : NULL,
                          ctx};
  return NULL;
}

/* Cache affinity on cpu places: place p's ops start on pool worker
 * p mod workers in every run (pe_engine_op_args.affinity's encoding), so
 * that a place's replicas and its part of the batch stay in one core's
 * cache; successors follow their predecessor's worker anyway. 0 (none)
 * for collectives, async devices, and graphs with fewer places than
 * workers (a daemon's pool shared by small models: homing them all on
 * the first workers would leave the others to steal). */
static int place_affinity(const pe_par_exec *e, const xnode *x) {
  int workers = pe_pool_threads(e->rt->pool);
  if (e->async || x->collective || e->n_places < workers) return 0;
  return x->n->place % workers + 1;
}

/* The loss-gradient seed of a place is its fill_constant with the value
 * scaled by the place's share of the batch: the kernel of the place's kind
 * writes it (no host access to place memory), reading the node's own copy
 * of the desc, whose 'value' each run sets before the node is launched. */
static pe_status *compile_scale(xnode *x) {
  const pe_graph_node *n = x->n;
  if (strcmp(n->def->type, "fill_constant"))
    return pe_error(PE_EINTERNAL, "node %d %s: loss-gradient seed is op '%s', not fill_constant",
                    x->id, n->name, n->def->type);
  x->scale_base = pe_attr_f(n->def, n->desc, "value");
  PE_TRY(pe_op_desc_clone(n->desc, &x->scale_desc));
  PE_TRY(pe_op_set_float(x->scale_desc, "value", x->scale_base));
  x->scale_attr = pe_op_find_attr(x->scale_desc, "value");
  x->ic.desc = x->kc.desc = x->scale_desc;
  return NULL;
}

static pe_status *compile_node(pe_par_exec *e, int id, bool *lv_batch) {
  pe_graph *g = e->g;
  xnode *x = &e->x[id];
  const pe_graph_node *n = &g->nodes[id];
  x->e = e;
  x->n = n;
  x->id = id;
  x->collective = n->place < 0;
  if (!x->collective) {
    if (n->place >= e->n_places)
      return pe_error(PE_EINTERNAL, "parallel executor: node %d (%s) on place %d of %d", id,
                      n->name, n->place, e->n_places);
    x->dev = e->dev[n->place];
    x->stream = pe_device_stream(x->dev, n->stream);
  }
  /* Engine variables: persistables read and written, the prng for random
   * ops. */
  int cap = n->n_in_lv + n->n_out_lv + 1;
  x->reads = calloc((size_t)cap, sizeof(*x->reads));
  x->muts = calloc((size_t)cap, sizeof(*x->muts));
  x->pred = calloc((size_t)(n->n_in ? n->n_in : 1), sizeof(*x->pred));
  if (!x->reads || !x->muts || !x->pred) return OOM();
  for (int i = 0; i < n->n_out_lv; i++)
    if (e->lentry[n->out_lv[i]]) {
      add_unique(x->muts, &x->n_muts, e->lentry[n->out_lv[i]]->ev[g->lvars[n->out_lv[i]].place]);
      x->writes_persistable = true;
    }
  for (int i = 0; i < n->n_in_lv; i++)
    if (e->lentry[n->in_lv[i]]) {
      pe_engine_var *v = e->lentry[n->in_lv[i]]->ev[g->lvars[n->in_lv[i]].place];
      bool mut = false;
      for (int k = 0; k < x->n_muts; k++) mut |= x->muts[k] == v;
      if (!mut) add_unique(x->reads, &x->n_reads, v);
    }
  if (e->async) PE_TRY(par_compile_fences(e, x));
  x->random = n->def && (n->def->flags & PE_OP_RANDOM);
  if (x->random) add_unique(x->muts, &x->n_muts, e->m->prng);
  x->engine = x->n_reads + x->n_muts > 0;
  /* A model change only where a node changes a persistable: a test-mode
   * batch norm stores its statistics onto themselves (still a mutation
   * above, so the runs stay ordered), and an eval with it is no change,
   * as one without it (autosave, Status, run origins). */
  e->writes_persistables |= x->writes_persistable && pe_graph_node_updates_persistable(g, id);
  x->affinity = place_affinity(e, x);
  /* Distinct producers (the in-degree's nodes). */
  for (int i = 0; i < n->n_in; i++) {
    int pr = g->vars[n->in[i]].producer;
    if (pr < 0) continue;
    bool dup = false;
    for (int k = 0; k < x->n_pred && !dup; k++) dup = x->pred[k] == pr;
    if (!dup) x->pred[x->n_pred++] = pr;
  }
  if (x->n_pred != n->in_degree)
    return pe_error(PE_EINTERNAL, "parallel executor: node %d (%s): in_degree %d but %d producers",
                    id, n->name, n->in_degree, x->n_pred);
  /* Batch dependence: an op fed (transitively) by a feed, except optimizers.
   * Collectives reset it: their outputs are combined across places (a clip
   * after an all-reduce runs on a place with no rows too). */
  if (n->kind == PE_NODE_LOSS_GRAD_SCALE) x->batch_dep = true;
  if (n->kind == PE_NODE_OP && !(n->def->flags & PE_OP_OPTIMIZER))
    for (int i = 0; i < n->n_in_lv && !x->batch_dep; i++) x->batch_dep = lv_batch[n->in_lv[i]];
  for (int i = 0; i < n->n_out_lv && (x->batch_dep || x->collective); i++)
    lv_batch[n->out_lv[i]] = x->batch_dep;
  if (n->kind == PE_NODE_OP || n->kind == PE_NODE_LOSS_GRAD_SCALE)
    PE_TRY(par_compile_op_node(e, x, pe_stream_ctx(x->stream)));
  if (n->kind == PE_NODE_LOSS_GRAD_SCALE)
    PE_TRY(compile_scale(x));
  else if (n->kind != PE_NODE_OP)
    PE_TRY(par_coll_compile(e, x));
  /* Events for async devices. */
  if (e->async) {
    if (!x->collective) {
      x->n_ev = 1;
    } else if (n->kind == PE_NODE_ALL_REDUCE || n->kind == PE_NODE_FUSED_ALL_REDUCE ||
               e->m->dcomm) {
      x->n_ev = e->n_places; /* a part on every place's comm stream */
    } else {
      x->n_ev = 1;
    }
    x->ev = calloc((size_t)x->n_ev, sizeof(*x->ev));
    x->ev_stream = calloc((size_t)x->n_ev, sizeof(*x->ev_stream));
    if (!x->ev || !x->ev_stream) return OOM();
    for (int k = 0; k < x->n_ev; k++) {
      pe_device *d = !x->collective ? x->dev
                     : x->n_ev > 1  ? e->dev[k]
                                    : e->dev[n->root >= 0 ? n->root : 0];
      PE_TRY(pe_event_get(d, &x->ev[k]));
      x->ev_stream[k] = !x->collective ? x->stream : pe_device_stream(d, PE_STREAM_COMM);
    }
  }
  return NULL;
}

pe_status *pe_par_exec_new(pe_model *m, pe_graph *g, pe_par_exec **out) {
  *out = NULL;
  if (!g) return pe_error(PE_EINVAL, "parallel executor: no graph");
  if (!g->ssa) {
    pe_graph_free(g);
    return pe_error(PE_EINVAL, "parallel executor: graph not compiled (ssa pass missing)");
  }
  if (g->n_places != m->n_places || g->place_kind != m->kind) {
    pe_status *st = pe_error(PE_EINVAL, "parallel executor: graph on %s:%d, model on %s:%d",
                             pe_place_kind_name(g->place_kind), g->n_places,
                             pe_place_kind_name(m->kind), m->n_places);
    pe_graph_free(g);
    return st;
  }
  for (int i = 0; m->dcomm && i < g->n_nodes; i++) {
    const pe_graph_node *n = &g->nodes[i];
    if (n->kind != PE_NODE_REDUCE && n->kind != PE_NODE_SHARDED_UPDATE &&
        n->kind != PE_NODE_SPARSE_MERGE)
      continue;
    pe_status *st = pe_error(PE_EINVAL,
                             "parallel executor: node %d %s (strategy %s) on %s:%d: %s places "
                             "take the allreduce strategy and dense gradients only (the "
                             "device's all-reduce and broadcast)",
                             i, n->name, pe_strategy_name(g->strategy), pe_place_kind_name(m->kind),
                             m->n_places, pe_place_kind_name(m->kind));
    pe_graph_free(g);
    return st;
  }
  pe_par_exec *e = calloc(1, sizeof(*e));
  if (!e) {
    pe_graph_free(g);
    return OOM();
  }
  e->m = m;
  e->rt = m->rt;
  e->g = g;
  e->n_places = g->n_places;
  e->dev = m->dev;
  e->async = pe_device_is_async(m->dev[0]);
  pthread_mutex_init(&e->run_mu, NULL);
  pthread_mutex_init(&e->done_mu, NULL);
  pthread_mutex_init(&e->cross_mu, NULL);
  pthread_cond_init(&e->done_cv, NULL);
  pe_status *st = NULL;
  e->n_rows = calloc((size_t)e->n_places, sizeof(*e->n_rows));
  e->rows_sized = calloc((size_t)e->n_places, sizeof(*e->rows_sized));
  e->stage = calloc((size_t)e->n_places, sizeof(*e->stage));
  e->x = calloc((size_t)(g->n_nodes ? g->n_nodes : 1), sizeof(*e->x));
  bool *lv_batch = calloc((size_t)(g->n_lvars ? g->n_lvars : 1), sizeof(bool));
  if (!e->n_rows || !e->rows_sized || !e->stage || !e->x || !lv_batch) st = OOM();
  if (!st) st = compile_lvars(e);
  for (int i = 0; !st && i < g->n_lvars; i++) lv_batch[i] = g->lvars[i].feed;
  for (int i = 0; !st && i < g->n_nodes; i++) st = compile_node(e, i, lv_batch);
  free(lv_batch);
  if (!st) st = par_cross_compile(e);
  if (!st && !g->startup && e->n_places > 1) st = par_find_homes(e);
  if (!st) st = par_feeds_compile(e);
  if (!st && e->async) {
    e->end_ev = calloc((size_t)e->n_places * PE_STREAM_KINDS, sizeof(*e->end_ev));
    if (!e->end_ev) st = OOM();
    for (int p = 0; !st && p < e->n_places; p++)
      for (int k = 0; !st && k < PE_STREAM_KINDS; k++)
        st = pe_event_get(e->dev[p], &e->end_ev[p * PE_STREAM_KINDS + k]);
  }
  if (!st) st = par_claim_homes(e); /* last: nothing fails after it */
  if (st) {
    pe_par_exec_free(e);
    return pe_status_wrap(st, "parallel executor");
  }
  *out = e;
  return NULL;
}

void pe_par_exec_free(pe_par_exec *e) {
  if (!e) return;
  pe_graph *g = e->g;
  /* The last run's tail may still be in flight: wait for it. Nobody is
   * left to report its failure to but the log. */
  pe_status *tail = par_drain(e);
  if (tail) {
    pe_log(PE_LOG_WARN, "parallel executor freed: %s", pe_status_msg(tail));
    pe_status_free(tail);
  }
  par_graph_free(e); /* its graphs before the devices they run on */
  if (e->x) par_free_kept_ops(e);
  for (int i = 0; e->x && i < g->n_nodes; i++) {
    xnode *x = &e->x[i];
    if (x->state && x->state_free) x->state_free(x->state);
    free(x->tl);
    free(x->ml);
    free(x->tensors);
    free(x->metas);
    free(x->mptrs);
    free(x->names);
    free(x->reads);
    free(x->muts);
    free(x->rfence);
    free(x->wfence);
    free(x->pred);
    for (int k = 0; x->ev && k < x->n_ev; k++) pe_event_put(x->ev[k]);
    free(x->ev);
    free(x->ev_stream);
    pe_op_desc_free(x->scale_desc);
    par_coll_free(x);
  }
  if (e->end_ev)
    for (int k = 0; k < e->n_places * PE_STREAM_KINDS; k++) pe_event_put(e->end_ev[k]);
  free(e->end_ev);
  free(e->x);
  for (int i = 0; e->own && i < g->n_lvars; i++) pe_tensor_release(&e->own[i]);
  for (int b = 0; e->buf_mem && b < g->n_buffers; b++)
    if (e->buf_mem[b]) pe_device_free(e->dev[g->buffers[b].place], e->buf_mem[b], e->buf_cap[b]);
  free(e->buf_mem);
  free(e->buf_cap);
  for (int b = 0; e->bucket_mem && b < g->n_buckets; b++)
    for (int p = 0; p < e->n_places; p++)
      if (e->bucket_mem[b * e->n_places + p])
        pe_device_free(e->dev[p], e->bucket_mem[b * e->n_places + p],
                       e->bucket_cap[b * e->n_places + p]);
  free(e->bucket_mem);
  free(e->bucket_cap);
  free(e->own);
  free(e->lt);
  free(e->lentry);
  free(e->home_en);
  free(e->home_place);
  for (int f = 0; e->feeds && f < e->n_feeds; f++) free(e->feeds[f].lv);
  free(e->feeds);
  free(e->grad_lv);
  free(e->rows_lv);
  free(e->grad_sum_place);
  free(e->param_lv);
  for (int i = 0; i < PAR_FETCH_CACHE; i++) {
    free(e->fetch_name[i]);
    free(e->fetch_lv[i]);
  }
  for (int p = 0; e->stage && p < e->n_places; p++) pe_tensor_release(&e->stage[p]);
  free(e->stage);
  free(e->n_rows);
  free(e->rows_sized);
  par_cross_free(e);
  pthread_mutex_destroy(&e->run_mu);
  pthread_mutex_destroy(&e->done_mu);
  pthread_cond_destroy(&e->done_cv);
  pe_graph_free(g);
  free(e);
}

const pe_graph *pe_par_exec_graph(const pe_par_exec *e) {
  return e->g;
}
