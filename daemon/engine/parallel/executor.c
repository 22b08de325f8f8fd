/* The parallel executor's run loop (parallel/executor.h): a run's nodes on the
 * pool, the dependency engine and async streams. pe_par_exec_new, which
 * binds the graph to the model once before any run, is parallel/compile.c.
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
 * fence (parallel/internal.h) after its launch and releases its engine variables
 * at once: readers of other graphs on another stream wait for the fence,
 * host readers sync it. On sim, where the op's fn runs later on the stream
 * thread, a write that allocates the replica (its first) and a random op
 * (its kernel reserves generator counters when it runs) sync their event
 * before the release; on cuda fn ran when launch returned.
 *
 * Run end on async places (parallel/async.c): the run waits only for what its
 * caller gets back and leaves the rest in flight (its tail), which the next
 * run waits for before it touches the executor's state (par_drain). */
#include <string.h>
#include <time.h>

#include "engine/node_comm.h"
#include "engine/op_run.h"
#include "engine/parallel/executor_internal.h"

void par_fail(pe_par_exec *e, pe_status *st) {
  if (!st) return;
  pe_status *expected = NULL;
  if (!atomic_compare_exchange_strong(&e->err, &expected, st)) pe_status_free(st);
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
  /* A held all-reduce (parallel/cross.c) completes with its step's others. */
  if (atomic_load_explicit(&x->failed, memory_order_acquire)) return par_cross_hold(x);
  if (!x->collective && x->batch_dep && e->has_feeds && e->n_rows[x->n->place] == 0) return true;
  if (e->opts->skip && e->opts->skip[x->id]) return par_cross_hold(x);
  par_delay(x);
  par_hook(x, false);
  atomic_fetch_add_explicit(&e->executed, 1, memory_order_relaxed);
  if (x->collective) {
    /* A fanned-out collective reports its end from its last chunk. */
    bool now = par_coll_run(x, may_fan_out);
    if (now) par_hook(x, true);
    return now && par_cross_hold(x);
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

/* The step's last node: the worker chains the next step (parallel/steps.c) or
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
/* One of y's inputs is done: true when y (not an engine node: those the
 * engine schedules) is ready to run now. */
static bool succ_ready(pe_par_exec *e, xnode *y, bool failed) {
  if (failed) atomic_store_explicit(&y->failed, true, memory_order_release);
  if (y->engine) {
    pe_engine_op_dep_done(e->rt->eng, y->eop);
    return false;
  }
  return atomic_fetch_sub_explicit(&y->pending, 1, memory_order_acq_rel) == 1;
}

static void succ_done(pe_par_exec *e, xnode *y, bool failed, bool may_inline, xnode **next) {
  if (!succ_ready(e, y, failed)) return;
  if (may_inline && !*next)
    *next = y;
  else
    pe_pool_submit(e->rt->pool, &y->task);
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
  xnode *next = NULL, *comm = NULL;
  bool split = !e->async; /* split: collectives are never inlined */
  /* In a job on host places a collective runs first instead: it posts
   * its gradient to the exchange thread (parallel/cross.c), and the sooner
   * it is posted the more of the backward pass overlaps the exchange. */
  bool comm_first = split && e->ncomm;
  for (int k = 0; !comm_first && k < n->n_succ; k++) {
    xnode *y = &e->x[n->succ[k]];
    if (!split || y->collective) succ_done(e, y, failed, may_inline && !split, &next);
  }
  for (int k = 0; split && k < n->n_succ; k++) {
    xnode *y = &e->x[n->succ[k]];
    if (!y->collective) succ_done(e, y, failed, may_inline, &next);
  }
  for (int k = 0; comm_first && k < n->n_succ; k++) {
    xnode *y = &e->x[n->succ[k]];
    if (!y->collective || !succ_ready(e, y, failed)) continue;
    /* The place's next op goes to this worker's LIFO queue first, so the
     * collectives queued after it run before it, and it right after them. */
    if (next) pe_pool_submit(e->rt->pool, &next->task);
    next = NULL;
    if (may_inline && !comm)
      comm = y;
    else
      pe_pool_submit(e->rt->pool, &y->task);
  }
  if (comm) next = comm;
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

/* Once per executor, before its first step: the engine nodes' ops, kept
 * and pushed again every step (pe_engine_op_keep), and the plain nodes'
 * tasks. On failure nothing is kept. */
static pe_status *keep_ops(pe_par_exec *e) {
  if (e->ops_kept) return NULL;
  pe_engine *eng = e->rt->eng;
  for (int i = 0; i < e->g->n_nodes; i++) {
    xnode *x = &e->x[i];
    x->task = (pe_task){task_fn, x, NULL};
    if (!x->engine) continue;
    pe_engine_op_args a = {.fn = engine_fn,
                           .arg = x,
                           .on_done = engine_done,
                           .reads = x->reads,
                           .n_reads = x->n_reads,
                           .mutates = x->muts,
                           .n_mutates = x->n_muts,
                           .affinity = x->affinity};
    pe_status *st = pe_engine_op_keep(eng, &a, &x->eop);
    if (st) {
      par_free_kept_ops(e);
      return pe_status_wrap(st, "node %d %s", i, x->n->name);
    }
  }
  e->ops_kept = true;
  return NULL;
}

void par_free_kept_ops(pe_par_exec *e) {
  for (int i = 0; i < e->g->n_nodes; i++) {
    pe_engine_op_free_kept(e->x[i].eop);
    e->x[i].eop = NULL;
  }
  e->ops_kept = false;
}

pe_status *par_step_begin(pe_par_exec *e, const pe_feed *feeds, const pe_feed_split *split,
                          int n_feeds) {
  uint64_t t_start = pe_timeline_now_ns();
  PE_TRY(drain_before_run(e)); /* a step of run_steps after a tail */
  PE_TRY(keep_ops(e));
  e->delay_salt++;
  atomic_store(&e->err, NULL);
  atomic_store(&e->executed, 0);
  PE_TRY(par_cross_begin(e));

  pe_status *st =
      split ? par_feeds_load_split(e, split, n_feeds) : par_feeds_load(e, feeds, n_feeds);
  if (st) {
    if (e->async) pe_status_free(par_sync_streams(e));
    return st;
  }
  if (e->graph) {
    bool launched = false;
    st = par_graph_step_begin(e, &launched);
    if (st) pe_status_free(par_sync_streams(e));
    if (st || launched) return st;
  }
  return par_step_launch(e, t_start);
}

pe_status *par_step_launch(pe_par_exec *e, uint64_t t_start) {
  pe_graph *g = e->g;
  if (e->has_feeds) par_zero_grads(e);
  /* The loss gradient's scale: each place's rows over the global batch's
   * (over the nodes in a job, whose shards may differ by some rows), so
   * that the summed gradient is the mean over the global batch. */
  double rows = e->batch;
  if (e->ncomm && e->has_feeds) PE_TRY(par_cross_rows(e, &rows));

  /* Re-arm. */
  int64_t row0[PE_MAX_PLACES] = {0}; /* each place's first row of the batch */
  for (int p = 1; e->has_feeds && p < e->n_places; p++) row0[p] = row0[p - 1] + e->n_rows[p - 1];
  atomic_store(&e->remaining, g->n_nodes);
  for (int i = 0; i < g->n_nodes; i++) {
    xnode *x = &e->x[i];
    x->kc.batch_row0 = x->n->place >= 0 ? row0[x->n->place] : 0; /* collectives: no place */
    if (!x->engine) atomic_store_explicit(&x->pending, g->nodes[i].in_degree, memory_order_relaxed);
    atomic_store_explicit(&x->failed, false, memory_order_relaxed);
    atomic_store_explicit(&x->sfail, false, memory_order_relaxed);
    if (x->n->kind == PE_NODE_LOSS_GRAD_SCALE) {
      x->scale = rows > 0 ? (float)((double)e->n_rows[x->n->place] / rows) : 1.0f;
      x->scale_attr->f = x->scale_base * x->scale;
    }
  }
  /* Push the engine nodes' kept ops in node order, each held by one guard
   * dependency, then drop the guards; then start the non-engine roots. */
  pe_engine *eng = e->rt->eng;
  /* Under the model's push lock: a get_many/set_many lands before or after
   * all of this run's ops (parallel/internal.h). */
  par_model_push_begin(e->m, e->writes_persistables, &e->opts->origin);
  pe_status *kst = par_keep_begin(e);
  if (kst) par_fail(e, kst); /* the step still runs: its peers wait for it */
  for (int i = 0; i < g->n_nodes; i++)
    if (e->x[i].engine)
      pe_engine_op_push_kept(eng, e->x[i].eop, e->opts->priority, g->nodes[i].in_degree + 1);
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
    } else if (g->nodes[i].in_degree == 0) {
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
  if (e->graph) par_fail(e, par_graph_step_end(e));
  if (e->async) par_end_async(e, fetch, n_fetch);
  par_keep_end(e);
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
  par_graph_set_fetch(e, fetch, n_fetch);
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
