/* The parallel executor (par_executor.h): compile-time binding of a graph to
 * a model, and the run loop.
 *
 * Scheduling. Nodes that touch persistables (or draw random numbers) are
 * engine ops: at the start of a run they are pushed in node order with
 * extra_deps = static in-degree + 1 (the +1 keeps an op from completing, and
 * calling dep_done on a successor not pushed yet, before every op of the run
 * is registered; it is dropped right after the pushes). Node order is a
 * topological order and the engine grants in push order, so every wait goes
 * from a later push to an earlier one: no cycle, also with runs of other
 * graphs of the model interleaving their pushes. Other nodes have one atomic
 * counter armed from the in-degree; the worker that brings it to zero runs
 * the node itself (one ready successor inline, the rest on its own queue).
 * On cpu places a run's first ops of place p are queued on pool worker
 * p mod workers (place_affinity), so each place's chain tends to stay on
 * one core from run to run (measured: ~4% more MLP samples/s on cpu:2).
 *
 * Errors. A node's failure is recorded as the run's error (first one wins)
 * and its successors are marked failed, so they are skipped and still
 * complete. Engine ops never return an error to the engine: the model's
 * variables carry no error, so the next run (or another graph) works.
 *
 * Async places (sim). A node is "done" for scheduling once its work is
 * launched: its stream waits on its predecessors' events first
 * (pe_device_sync_dep with the run's strategy), it records its own event
 * after the launch. The stream wrapper skips the kernel when a predecessor's
 * stream work failed (sfail). A node that writes a persistable first makes
 * its stream wait for the place's other streams (pending readers of the old
 * value, launched by runs of other graphs), then records the replica's write
 * fence (par_internal.h) after its launch and releases its engine variables
 * at once: readers of other graphs on another stream wait for the fence,
 * host readers sync it. On sim, where the op's fn runs later on the stream
 * thread, a write that allocates the replica (its first) and a random op
 * (its kernel reserves generator counters when it runs) sync their event
 * before the release; on cuda fn ran when launch returned.
 *
 * Run end on async places (par_async.c): the run waits only for what its
 * caller gets back and leaves the rest in flight (its tail), which the next
 * run waits for before it touches the executor's state (par_drain). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "engine/op_run.h"
#include "engine/par_exec_internal.h"
#include "engine/place_io.h"

#define OOM() pe_error(PE_ENOMEM, "parallel executor: out of memory")

void par_fail(pe_par_exec *e, pe_status *st) {
  if (!st) return;
  pe_status *expected = NULL;
  if (!atomic_compare_exchange_strong(&e->err, &expected, st)) pe_status_free(st);
}

/* --- compile ----------------------------------------------------------------- */

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
  e->writes_persistables |= x->writes_persistable;
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
    } else if (n->kind == PE_NODE_ALL_REDUCE || n->kind == PE_NODE_FUSED_ALL_REDUCE || e->m->nccl) {
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
  for (int i = 0; m->nccl && i < g->n_nodes; i++) {
    const pe_graph_node *n = &g->nodes[i];
    if (n->kind != PE_NODE_REDUCE && n->kind != PE_NODE_SHARDED_UPDATE) continue;
    pe_status *st = pe_error(PE_EINVAL,
                             "parallel executor: node %d %s (strategy %s) on %s:%d: cuda places "
                             "take the allreduce strategy only (NCCL all-reduce and broadcast)",
                             i, n->name, pe_strategy_name(g->strategy), pe_place_kind_name(m->kind),
                             m->n_places);
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
  pthread_mutex_destroy(&e->run_mu);
  pthread_mutex_destroy(&e->done_mu);
  pthread_cond_destroy(&e->done_cv);
  pe_graph_free(g);
  free(e);
}

const pe_graph *pe_par_exec_graph(const pe_par_exec *e) {
  return e->g;
}

/* --- running one node ------------------------------------------------------ */

static _Thread_local const pe_device_ctx *tls_bound;

void par_delay(xnode *x) {
  pe_par_exec *e = x->e;
  if (!e->opts || e->opts->delay_us <= 0) return;
  uint64_t r = pe_rng_bits(e->opts->delay_seed, e->delay_salt * 1000003u + (uint64_t)x->id);
  long us = (long)(r % (uint64_t)(e->opts->delay_us + 1));
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

void par_hook(xnode *x, bool done) {
  const pe_run_opts *o = x->e->opts;
  if (o && o->node_hook) o->node_hook(o->hook_arg, x->id, done);
}

void par_record(xnode *x, pe_place place, const char *lane, uint64_t t0) {
  pe_timeline *tl = x->e->tl;
  if (!tl) return;
  pe_timeline_record(pe_timeline_thread_lane(tl, lane), place, x->n->name, t0,
                     pe_timeline_now_ns());
}

static pe_status *op_failed(xnode *x, pe_status *st) {
  char pb[32];
  const pe_graph_node *n = x->n;
  const char *place = pe_place_str(x->e->g->places[n->place], pb, sizeof pb);
  /* pe_infer_error / pe_kernel_error already start with "op #i (type)". */
  if (strncmp(pe_status_msg(st), "op #", 4) == 0)
    return pe_status_wrap(st, "node %d %s on %s", x->id, n->name, place);
  return pe_status_wrap(st, "node %d %s on %s: op #%d (%s)", x->id, n->name, place, n->src_op,
                        n->desc ? n->desc->type : pe_node_kind_name(n->kind));
}

/* Run an op node's kernel on the calling thread (pool worker or stream
 * thread). Returns the error (wrapped). */
static pe_status *run_op(xnode *x) {
  pe_par_exec *e = x->e;
  pe_stream *s = x->stream;
  if (!pe_device_is_async(x->dev)) {
    /* cpu: bind the place's intra-op budget on this worker. */
    const pe_device_ctx *c = pe_stream_ctx(s);
    if (tls_bound != c) {
      pe_device_ctx_bind(c);
      tls_bound = c;
    }
  }
  uint64_t t0 = e->tl ? pe_timeline_now_ns() : 0;
  pe_status *st = pe_op_run(x->n->def, x->kernel, x->tl, x->ml, &x->ic, &x->kc,
                            pe_device_allocator(x->dev), e->opts->check_nan_inf);
  if (e->tl) {
    char lane[32];
    if (pe_device_is_async(x->dev))
      par_record(x, e->g->places[x->n->place], s->name, t0);
    else {
      snprintf(lane, sizeof lane, "worker %d", pe_pool_current_worker());
      par_record(x, e->g->places[x->n->place], lane, t0);
    }
  }
  return st ? op_failed(x, st) : NULL;
}

bool par_preds_sfailed(const xnode *x) {
  for (int k = 0; k < x->n_pred; k++)
    if (atomic_load_explicit(&x->e->x[x->pred[k]].sfail, memory_order_acquire)) return true;
  return false;
}

/* Stream wrapper of an op node on an async device. */
static pe_status *sim_op_fn(void *arg) {
  xnode *x = arg;
  if (par_preds_sfailed(x)) {
    atomic_store_explicit(&x->sfail, true, memory_order_release);
    return NULL;
  }
  pe_status *st = run_op(x);
  if (st) {
    par_fail(x->e, st);
    atomic_store_explicit(&x->sfail, true, memory_order_release);
  }
  return NULL;
}

pe_status *par_sync_preds(xnode *x, pe_stream *s, int p) {
  (void)p;
  pe_par_exec *e = x->e;
  bool in_coll = x->collective; /* launched under coll_mu */
  for (int k = 0; k < x->n_pred; k++) {
    xnode *y = &e->x[x->pred[k]];
    for (int j = 0; j < y->n_ev; j++)
      PE_TRY(par_sync_dep(e, in_coll, y->ev_stream[j], y->ev[j], s));
  }
  return NULL;
}

/* Launch an op node on its async stream. */
static pe_status *launch_op(xnode *x) {
  pe_par_exec *e = x->e;
  pe_stream *s = x->stream;
  PE_TRY(par_sync_preds(x, s, x->n->place));
  PE_TRY(par_wait_fences(x, s));
  /* Where fn runs at launch (cuda), its host-side effects are done when
   * launch returns: nothing to hold for. */
  bool at_launch = x->dev->ops->fn_at_launch;
  bool hold = !at_launch && x->random;
  if (x->writes_persistable) {
    hold |= !at_launch && par_allocates_persistable(x);
    for (int k = 0; k < 2; k++) {
      pe_stream *o = pe_device_stream(x->dev, k == 0 ? PE_STREAM_COMPUTE : PE_STREAM_COMM);
      if (o != s) PE_TRY(par_sync_dep(e, false, o, NULL, s));
    }
  }
  PE_TRY(pe_stream_launch(s, sim_op_fn, x));
  PE_TRY(pe_event_record(x->ev[0], s));
  for (int i = 0; i < x->n_wfence; i++) PE_TRY(par_fence_record(x->wfence[i], s));
  if (x->engine && hold) {
    /* sim: keep the engine variables until the kernel ran: a first write
     * sets the replica's storage, which host readers look at; a random
     * kernel reserves its generator range when it runs on the stream, so
     * the PRNG variable is held until then (draw order = push order). */
    pe_status_free(pe_event_sync(x->ev[0]));
  }
  return NULL;
}

/* Execute node x on the host. Returns false when x completes later (a cpu
 * collective's chunk tasks complete it). */
static bool node_exec(xnode *x, bool may_fan_out) {
  pe_par_exec *e = x->e;
  if (atomic_load_explicit(&x->failed, memory_order_acquire)) return true;
  if (!x->collective && x->batch_dep && e->has_feeds && e->n_rows[x->n->place] == 0) return true;
  if (e->opts->skip && e->opts->skip[x->id]) return true;
  par_delay(x);
  par_hook(x, false);
  atomic_fetch_add_explicit(&e->executed, 1, memory_order_relaxed);
  if (x->collective) {
    /* A fanned-out collective reports its end from its last chunk. */
    bool now = par_coll_run(x, may_fan_out);
    if (now) par_hook(x, true);
    return now;
  }
  pe_status *st = e->async ? launch_op(x) : run_op(x);
  par_hook(x, true);
  if (st) {
    if (e->async) st = op_failed(x, st);
    par_fail(e, st);
    atomic_store_explicit(&x->failed, true, memory_order_release);
  }
  return true;
}

/* The step's last node: the worker chains the next step (par_steps.c) or
 * the caller's thread takes over. */
static void finish_run_node(pe_par_exec *e) {
  if (atomic_fetch_sub_explicit(&e->remaining, 1, memory_order_acq_rel) != 1) return;
  if (e->chain_steps)
    pe_pool_submit(e->rt->pool, &e->steps_task);
  else
    par_hand_back(e);
}

static void task_fn(void *arg) {
  par_run_chain(arg);
}

/* Count successor y down; a plain one that became ready is returned as
 * *next when that is free, else submitted. */
static void succ_done(pe_par_exec *e, xnode *y, bool failed, bool may_inline, xnode **next) {
  if (failed) atomic_store_explicit(&y->failed, true, memory_order_release);
  if (y->engine) {
    pe_engine_op_dep_done(e->rt->eng, y->eop);
  } else if (atomic_fetch_sub_explicit(&y->pending, 1, memory_order_acq_rel) == 1) {
    if (may_inline && !*next)
      *next = y;
    else
      pe_pool_submit(e->rt->pool, &y->task);
  }
}

/* Successor order on cpu places: collectives (all-reduces, sharded
 * updates) are counted down first and place ops last, so that a place op
 * that became ready is the one run inline or sits at the front of this
 * worker's LIFO queue, and the collective waits behind it, where an idle
 * worker steals it. Why: a place's backward chain is sequential and on the
 * step's critical path, while a collective's chunks can run on any worker
 * later; run first, the MLP's fc_1 update (~35 us, cpu:2 sharded) sat
 * between matmul_grad#10 and #11 of the place that got there second, and
 * the other worker idled for it at the fc_0 update. On async places a
 * node's execution is only its launch, so the order stays the graph's. */
xnode *par_node_done(xnode *x, bool may_inline) {
  pe_par_exec *e = x->e;
  const pe_graph_node *n = x->n;
  bool failed = atomic_load_explicit(&x->failed, memory_order_acquire);
  xnode *next = NULL;
  bool split = !e->async; /* split: collectives are never inlined */
  for (int k = 0; k < n->n_succ; k++) {
    xnode *y = &e->x[n->succ[k]];
    if (!split || y->collective) succ_done(e, y, failed, may_inline && !split, &next);
  }
  for (int k = 0; split && k < n->n_succ; k++) {
    xnode *y = &e->x[n->succ[k]];
    if (!y->collective) succ_done(e, y, failed, may_inline, &next);
  }
  finish_run_node(e);
  return next;
}

void par_run_chain(xnode *x) {
  while (x) {
    if (!node_exec(x, true)) return;
    x = par_node_done(x, true);
  }
}

/* Engine op of a node: runs on a pool worker once its variables are granted
 * and its predecessors are done. A cpu collective that fans its chunks out
 * leaves the op pending; its last chunk calls par_engine_complete (the
 * engine variables are held until the data is final). */
static pe_status *engine_fn(void *arg) {
  xnode *x = arg;
  return node_exec(x, true) ? NULL : PE_ENGINE_PENDING;
}

void par_engine_complete(xnode *x) {
  pe_engine_op_complete(x->e->rt->eng, x->eop, NULL);
}

/* On the worker that completed the op, after its variables were released:
 * run one ready plain successor right here (no queue hop), queue the rest. */
static void engine_done(void *arg, const pe_status *st) {
  (void)st;
  xnode *x = arg;
  par_run_chain(par_node_done(x, true));
}

/* --- run ---------------------------------------------------------------------- */

void par_hand_back(pe_par_exec *e) {
  pthread_mutex_lock(&e->done_mu);
  e->back = true;
  pthread_cond_broadcast(&e->done_cv);
  pthread_mutex_unlock(&e->done_mu);
}

void par_wait_back(pe_par_exec *e) {
  pthread_mutex_lock(&e->done_mu);
  while (!e->back) pthread_cond_wait(&e->done_cv, &e->done_mu);
  e->back = false;
  pthread_mutex_unlock(&e->done_mu);
}

/* The previous run's tail first: its stream work reads the executor's
 * state (options, timeline, node flags, buffers). */
static pe_status *drain_before_run(pe_par_exec *e) {
  return pe_status_wrap(par_drain(e), "nothing of this run started");
}

pe_status *par_set_opts(pe_par_exec *e, const pe_run_opts *opts) {
  PE_TRY(drain_before_run(e));
  static const pe_run_opts defaults = {0};
  char pb[32];
  for (int p = 0; opts && opts->check_nan_inf && p < e->n_places; p++)
    if (!pe_device_host_memory(e->dev[p]))
      return pe_error(PE_EINVAL,
                      "check_nan_inf: place %s keeps its tensors in device memory; the per-op "
                      "NaN/Inf check runs on cpu and sim places only (run the program there)",
                      pe_place_str(e->g->places[p], pb, sizeof pb));
  e->opts_v = opts ? *opts : defaults;
  e->opts = &e->opts_v;
  e->sync = e->opts->sync;
  e->tl = e->opts->timeline;
  return NULL;
}

pe_status *par_step_begin(pe_par_exec *e, const pe_feed *feeds, const pe_feed_split *split,
                          int n_feeds) {
  uint64_t t_start = pe_timeline_now_ns();
  PE_TRY(drain_before_run(e)); /* a step of run_steps after a tail */
  e->delay_salt++;
  atomic_store(&e->err, NULL);
  atomic_store(&e->executed, 0);
  pe_graph *g = e->g;

  pe_status *st =
      split ? par_feeds_load_split(e, split, n_feeds) : par_feeds_load(e, feeds, n_feeds);
  if (st) {
    if (e->async) pe_status_free(par_sync_streams(e));
    return st;
  }
  if (e->has_feeds) par_zero_grads(e);

  /* Re-arm. */
  int64_t row0[PE_MAX_PLACES] = {0}; /* each place's first row of the batch */
  for (int p = 1; e->has_feeds && p < e->n_places; p++) row0[p] = row0[p - 1] + e->n_rows[p - 1];
  atomic_store(&e->remaining, g->n_nodes);
  for (int i = 0; i < g->n_nodes; i++) {
    xnode *x = &e->x[i];
    x->kc.batch_row0 = x->n->place >= 0 ? row0[x->n->place] : 0; /* collectives: no place */
    atomic_store_explicit(&x->pending, g->nodes[i].in_degree, memory_order_relaxed);
    atomic_store_explicit(&x->failed, false, memory_order_relaxed);
    atomic_store_explicit(&x->sfail, false, memory_order_relaxed);
    x->eop = NULL;
    x->task = (pe_task){task_fn, x, NULL};
    if (x->n->kind == PE_NODE_LOSS_GRAD_SCALE) {
      x->scale = e->batch > 0 ? (float)((double)e->n_rows[x->n->place] / (double)e->batch) : 1.0f;
      x->scale_attr->f = x->scale_base * x->scale;
    }
  }
  /* Push the engine nodes in node order, each held by one guard dependency,
   * then drop the guards; then start the non-engine roots. */
  pe_engine *eng = e->rt->eng;
  /* Under the model's push lock: a get_many/set_many lands before or after
   * all of this run's ops (par_internal.h). */
  par_model_push_begin(e->m, e->writes_persistables, &e->opts->origin);
  for (int i = 0; i < g->n_nodes; i++) {
    xnode *x = &e->x[i];
    if (!x->engine) continue;
    pe_engine_op_args a = {engine_fn,
                           x,
                           engine_done,
                           x->reads,
                           x->n_reads,
                           x->muts,
                           x->n_muts,
                           e->opts->priority,
                           g->nodes[i].in_degree + 1,
                           x->affinity};
    pe_status *pst = pe_engine_op_new(eng, &a, &x->eop);
    if (pst) {
      /* Cannot happen short of memory; treat the node as failed and done. */
      par_fail(e, pst);
      atomic_store(&x->failed, true);
      x->engine = false; /* its predecessors count it down as a plain node */
      atomic_store(&x->pending, g->nodes[i].in_degree + 1);
      x->task = (pe_task){task_fn, x, NULL};
      if (atomic_fetch_sub(&x->pending, 1) == 1) pe_pool_submit(e->rt->pool, &x->task);
    }
  }
  par_model_push_end(e->m);
  /* Roots first (every place's first ops start together, not one place
   * after the other's whole guard loop), then the other engine guards. */
  for (int i = 0; i < g->n_nodes; i++)
    if (e->x[i].engine && g->nodes[i].in_degree == 0) pe_engine_op_start(eng, e->x[i].eop);
  pe_task *first = NULL, *last = NULL;
  int n_roots = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    xnode *x = &e->x[i];
    if (x->engine) {
      if (g->nodes[i].in_degree > 0) pe_engine_op_start(eng, x->eop);
    } else if (g->nodes[i].in_degree == 0 && x->eop == NULL && !atomic_load(&x->failed)) {
      if (x->affinity > 0) {
        pe_pool_submit_to_front(e->rt->pool, x->affinity - 1, &x->task);
        continue;
      }
      x->task.next = NULL; /* no home worker: one batch, one wake-up check */
      if (last)
        last->next = &x->task;
      else
        first = &x->task;
      last = &x->task;
      n_roots++;
    }
  }
  if (n_roots) pe_pool_submit_batch(e->rt->pool, first, last, n_roots);
  /* The caller's part of the run (feeds, re-arming, engine pushes) on its
   * own lane: it delays the places' first ops. */
  if (e->tl) {
    char lane[32] = "caller";
    if (pe_pool_is_worker(e->rt->pool))
      snprintf(lane, sizeof lane, "worker %d", pe_pool_current_worker());
    pe_timeline_record(pe_timeline_thread_lane(e->tl, lane), e->g->places[0], "run start", t_start,
                       pe_timeline_now_ns());
  }
  if (g->n_nodes == 0) { /* nothing will count down to 0 */
    atomic_store(&e->remaining, 1);
    finish_run_node(e);
  }
  return NULL;
}

pe_status *par_step_end(pe_par_exec *e, const char *const *fetch, int n_fetch, pe_tensor *fetched) {
  if (e->async) par_end_async(e, fetch, n_fetch);
  /* Restore engine flags changed by a failed push. */
  const pe_graph *g = e->g;
  for (int i = 0; i < g->n_nodes; i++) e->x[i].engine = e->x[i].n_reads + e->x[i].n_muts > 0;
  pe_status *st = atomic_exchange(&e->err, NULL);
  if (!st && n_fetch) st = par_fetch(e, fetch, n_fetch, fetched);
  e->tail_quiet = st != NULL;
  return st;
}

/* One run; the feeds come whole (feeds) or split onto the places (split). */
static pe_status *run(pe_par_exec *e, const pe_feed *feeds, const pe_feed_split *split, int n_feeds,
                      const char *const *fetch, int n_fetch, pe_tensor *fetched,
                      const pe_run_opts *opts, pe_run_stats *stats) {
  if (n_feeds < 0 || n_fetch < 0 || (n_feeds && !feeds && !split) ||
      (n_fetch && (!fetch || !fetched)))
    return pe_error(PE_EINVAL, "parallel executor: bad feed/fetch arguments");
  if (pe_pool_is_worker(e->rt->pool))
    return pe_error(PE_EINVAL, "parallel executor: run called from a pool worker");
  uint64_t t_start = pe_timeline_now_ns();
  pthread_mutex_lock(&e->run_mu);
  pe_status *st = par_set_opts(e, opts);
  if (!st) st = par_step_begin(e, feeds, split, n_feeds);
  if (!st) {
    par_wait_back(e);
    st = par_step_end(e, fetch, n_fetch, fetched);
  }
  if (stats) {
    stats->wall_ms = (double)(pe_timeline_now_ns() - t_start) / 1e6;
    stats->batch = e->batch;
    stats->n_nodes = atomic_load(&e->executed);
  }
  pthread_mutex_unlock(&e->run_mu);
  return st;
}

pe_status *pe_par_exec_run(pe_par_exec *e, const pe_feed *feeds, int n_feeds,
                           const char *const *fetch, int n_fetch, pe_tensor *fetched,
                           const pe_run_opts *opts, pe_run_stats *stats) {
  return run(e, feeds, NULL, n_feeds, fetch, n_fetch, fetched, opts, stats);
}

pe_status *pe_par_exec_run_split(pe_par_exec *e, const pe_feed_split *feeds, int n_feeds,
                                 const char *const *fetch, int n_fetch, pe_tensor *fetched,
                                 const pe_run_opts *opts, pe_run_stats *stats) {
  return run(e, NULL, feeds, n_feeds, fetch, n_fetch, fetched, opts, stats);
}
