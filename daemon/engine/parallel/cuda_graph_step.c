/* Captured steps of the parallel executor (engine/step_graph_key.h orders
 * them; the device kind's pe_device_graph_ops records and launches them).
 *
 * Where. Only places whose kind has a graph row (cuda), and only when the
 * executor's mode says so (pe_par_exec_set_cuda_graph): cpu and sim
 * executors never get a par_graph, so their steps take no path here.
 *
 * A step of a key (feeds' names, dtypes and per-place dims, fetch names):
 *   warm-up    the normal step (sizes temporaries, fills the allocator)
 *   capture    the feeds are bound and copied as usual, then every place's
 *              device starts recording, the nodes are launched as usual
 *              (recorded, not run), the recording ends and the graphs are
 *              launched once with generator delta 0
 *   replay     the feeds are bound and copied as usual, then one engine op
 *              holding every variable the step's nodes hold launches each
 *              place's graph with the generator's delta since the capture
 *              and advances the generator by the step's counters
 * After a launch every node event and every write fence of the step is
 * recorded again on its device's compute stream, behind the graph (whose
 * end joins all of that device's streams): the fetches, the next steps
 * and other graphs' readers wait for the graph's work through the events
 * they already use.
 *
 * Staleness. A captured graph holds device addresses. At each replay the
 * addresses of every tensor of the executor (parameters, optimizer state,
 * feeds, temporaries) are compared with the capture's; any difference (a
 * load or set_params that replaced a buffer, temporaries given back) drops
 * every graph (PE_STEP_INVALID_PARAMS) and the step warms up again. A new
 * program, new places or a new optimizer is a new executor, with its own
 * cache.
 *
 * Fallbacks. A run with host work between nodes (pe_step_graph_run_capturable)
 * takes the normal path and leaves the key as it is. A key whose ops cannot
 * be recorded, whose recording fails, or whose step fails while recorded is
 * refused with the reason (logged once per key) and runs the normal path;
 * a failed recording ran nothing, so the step is launched again normally
 * with the generator reset to where the recording started.
 *
 * While a device records, every launch on its compute and comm streams is
 * recorded, also one of another thread. The copy streams stay out of the
 * recording (cuda/cuda_graph.c): the input prefetcher's copies of the next
 * batch and a model read's copies run while a step records, as they do
 * while it runs.
 *
 * Threads: the par_graph is used under run_mu by the run's caller, and by
 * the replay's engine op while the caller waits for it (par_wait_back). */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "engine/device_graph.h"
#include "engine/op_run.h"
#include "engine/parallel/executor_internal.h"
#include "engine/step_graph_key.h"

#define OOM() pe_error(PE_ENOMEM, "captured steps: out of memory")

/* One key's graphs: one per place, and what a replay needs. */
typedef struct graph_set {
  const pe_device_graph_ops *ops;
  int n;
  void *g[PE_MAX_PLACES];
  uint64_t rng0;      /* the generator offset when the recording began */
  uint64_t rng_step;  /* counters one step draws */
  const void **addrs; /* [n_addrs] every lvar tensor's data at the capture */
  int n_addrs;
} graph_set;

static void set_free(void *p) {
  graph_set *s = p;
  if (!s) return;
  for (int i = 0; i < s->n; i++)
    if (s->g[i]) s->ops->free(s->g[i]);
  free(s->addrs);
  free(s);
}

struct par_graph {
  const pe_device_graph_ops *ops;
  pe_step_graphs *cache;
  /* This step: its key and action (under run_mu, begin to end). */
  pe_step_key key;
  bool have_key;
  pe_step_action action;
  graph_set *set;       /* REPLAY: the key's graphs; CAPTURE: being recorded */
  const char *skip_why; /* the last run-level reason a step was not captured */
  const char *const *fetch;
  int n_fetch;
  /* [n_feeds * n_places] the executor's copies of feeds bound as views of
   * the caller's parts (a split run): the graph reads these addresses. */
  pe_tensor *feed_own;
  /* The replay's engine op: the union of the nodes' variables. */
  pe_engine_var **reads, **muts;
  int n_reads, n_muts;
};

/* --- setup and reporting -------------------------------------------------- */

static void drop_step_key(par_graph *pg) {
  if (pg->have_key) pe_step_key_release(&pg->key);
  pg->have_key = false;
}

void par_graph_free(pe_par_exec *e) {
  par_graph *pg = e->graph;
  if (!pg) return;
  drop_step_key(pg);
  set_free(pg->action == PE_STEP_CAPTURE ? pg->set : NULL);
  pe_step_graphs_free(pg->cache);
  for (int i = 0; pg->feed_own && i < e->n_feeds * e->n_places; i++)
    pe_tensor_release(&pg->feed_own[i]);
  free(pg->feed_own);
  free(pg->reads);
  free(pg->muts);
  free(pg);
  e->graph = NULL;
}

static bool has_var(pe_engine_var *const *a, int n, const pe_engine_var *v) {
  for (int i = 0; i < n; i++)
    if (a[i] == v) return true;
  return false;
}

/* The replay op's variables: every variable a node mutates, and those the
 * nodes only read. */
static pe_status *collect_vars(pe_par_exec *e, par_graph *pg) {
  int cap = 0;
  for (int i = 0; i < e->g->n_nodes; i++) cap += e->x[i].n_reads + e->x[i].n_muts;
  pg->reads = calloc((size_t)(cap ? cap : 1), sizeof *pg->reads);
  pg->muts = calloc((size_t)(cap ? cap : 1), sizeof *pg->muts);
  if (!pg->reads || !pg->muts) return OOM();
  for (int i = 0; i < e->g->n_nodes; i++) {
    const xnode *x = &e->x[i];
    for (int k = 0; k < x->n_muts; k++)
      if (!has_var(pg->muts, pg->n_muts, x->muts[k])) pg->muts[pg->n_muts++] = x->muts[k];
  }
  for (int i = 0; i < e->g->n_nodes; i++) {
    const xnode *x = &e->x[i];
    for (int k = 0; k < x->n_reads; k++)
      if (!has_var(pg->muts, pg->n_muts, x->reads[k]) &&
          !has_var(pg->reads, pg->n_reads, x->reads[k]))
        pg->reads[pg->n_reads++] = x->reads[k];
  }
  return NULL;
}

pe_status *pe_par_exec_set_cuda_graph(pe_par_exec *e, pe_cuda_graph_mode mode) {
  pthread_mutex_lock(&e->run_mu);
  par_graph_free(e);
  const pe_device_graph_ops *ops = e->dev[0]->ops->graph;
  const char *why = NULL;
  pe_status *st = NULL;
  if (pe_cuda_graph_decide(mode, e->dev[0]->place.kind, e->n_places, ops != NULL, &why)) {
    par_graph *pg = calloc(1, sizeof *pg);
    st = pg ? pe_step_graphs_new(8, set_free, &pg->cache) : OOM();
    if (!st) st = collect_vars(e, pg);
    if (!st &&
        !(pg->feed_own = calloc((size_t)(e->n_feeds * e->n_places + 1), sizeof *pg->feed_own)))
      st = OOM();
    if (pg) pg->ops = ops;
    e->graph = pg;
    if (st) par_graph_free(e);
  }
  e->graph_mode = mode;
  e->graph_off_why = why;
  pthread_mutex_unlock(&e->run_mu);
  return st;
}

bool pe_par_exec_cuda_graph(pe_par_exec *e, const char **reason, pe_step_graph_stats *stats) {
  pthread_mutex_lock(&e->run_mu);
  bool on = e->graph != NULL;
  pe_step_graph_stats st = {0};
  st.last_reason = "";
  if (on) pe_step_graphs_stats(e->graph->cache, &st);
  const char *why = e->graph_off_why ? e->graph_off_why : "off by option";
  if (on) why = st.last_reason[0] ? st.last_reason : e->graph->skip_why ? e->graph->skip_why : "";
  /* Captured steps count as on only once one replays. */
  if (on && st.replays == 0 && !why[0]) why = "no step captured yet (a key warms up first)";
  if (reason) *reason = why;
  if (stats) *stats = st;
  pthread_mutex_unlock(&e->run_mu);
  return on && st.replays > 0;
}

void par_graph_set_fetch(pe_par_exec *e, const char *const *fetch, int n_fetch) {
  if (!e->graph) return;
  e->graph->fetch = fetch;
  e->graph->n_fetch = n_fetch;
}

/* --- the key and its checks ------------------------------------------------ */

static pe_stream *compute_of(pe_device *d) {
  return pe_device_stream(d, PE_STREAM_COMPUTE);
}

static pe_status *build_key(pe_par_exec *e, par_graph *pg) {
  pe_step_key_init(&pg->key, 0, e->dev[0]->place.kind, e->n_places);
  pg->have_key = true;
  for (int j = 0; j < e->n_feeds; j++)
    for (int p = 0; p < e->n_places; p++) {
      int lv = e->feeds[j].lv[p];
      if (lv < 0) continue;
      const pe_tensor *t = e->lt[lv];
      pe_step_key_feed(&pg->key, e->feeds[j].desc->name, (int)t->dtype, t->shape.d, t->shape.ndim);
    }
  pe_step_key_fetches(&pg->key, pg->fetch, pg->n_fetch);
  return pe_step_key_done(&pg->key);
}

/* Feeds bound as views of the caller's parts (whose addresses change from
 * step to step) are copied, on each place's compute stream, into the
 * executor's own buffers, which the feed tensors then view: the graph
 * reads fixed addresses. Before the recording or the replay's launch. */
static pe_status *own_feeds(pe_par_exec *e, par_graph *pg) {
  if (!e->feeds_viewed) return NULL;
  const pe_graph *g = e->g;
  for (int j = 0; j < e->n_feeds; j++)
    for (int p = 0; p < e->n_places; p++) {
      int lv = e->feeds[j].lv[p];
      if (lv < 0) continue;
      pe_tensor *view = e->lt[lv], *own = &pg->feed_own[j * e->n_places + p];
      PE_TRY(pe_tensor_fit(own, pe_device_allocator(e->dev[p]), view->dtype, &view->shape,
                           g->lvars[lv].name));
      size_t bytes = pe_tensor_bytes(view);
      if (bytes)
        PE_TRY(pe_stream_copy(compute_of(e->dev[p]), own->data, view->data, bytes, PE_COPY_D2D));
      pe_tensor_view(view, own->dtype, &own->shape, own->data);
    }
  return NULL;
}

static bool run_capturable(pe_par_exec *e, const char **why) {
  const pe_run_opts *o = e->opts;
  pe_step_graph_run r = {
      .timeline = e->tl != NULL,
      .test_hooks = o->node_hook || o->delay_us > 0 || o->skip,
      .check_nan_inf = o->check_nan_inf,
      .cross_nodes = e->ncomm != NULL,
      .producer_sync = e->sync != PE_SYNC_WAIT_EVENT,
  };
  return pe_step_graph_run_capturable(&r, why);
}

/* The first node whose op cannot be recorded: its reason in buf. */
static bool ops_capturable(pe_par_exec *e, char *buf, size_t len) {
  for (int i = 0; i < e->g->n_nodes; i++) {
    const pe_graph_node *n = e->x[i].n;
    if (!n->desc || !n->def) continue;
    const char *why = NULL;
    if (!e->graph->ops->op_capturable(n->desc->type, n->def->flags, &why)) {
      snprintf(buf, len, "node %d %s (%s): %s", i, n->name, n->desc->type, why);
      return false;
    }
  }
  return true;
}

static bool has_gaussian(const pe_par_exec *e) {
  for (int i = 0; i < e->g->n_nodes; i++) {
    const pe_graph_node *n = e->x[i].n;
    if (n->desc && !strcmp(n->desc->type, "gaussian_random")) return true;
  }
  return false;
}

/* Every lvar tensor's data address (NULL-padded), into a (n_lvars). */
static void snapshot_addrs(const pe_par_exec *e, const void **a) {
  for (int lv = 0; lv < e->g->n_lvars; lv++) a[lv] = e->lt[lv] ? e->lt[lv]->data : NULL;
}

static bool addrs_moved(const pe_par_exec *e, const graph_set *s) {
  const void *now[s->n_addrs ? s->n_addrs : 1];
  snapshot_addrs(e, now);
  return pe_step_graph_buffers_moved(s->addrs, now, s->n_addrs);
}

static void refuse(par_graph *pg, const char *why) {
  pe_log(PE_LOG_INFO, "captured steps: a step key falls back to the normal path: %s", why);
  pe_step_graphs_refuse(pg->cache, &pg->key, why);
}

/* --- after a launch ---------------------------------------------------------- */

/* Record the step's node events and write fences behind the graphs (see
 * the head comment). */
static pe_status *rerecord(pe_par_exec *e) {
  for (int i = 0; i < e->g->n_nodes; i++) {
    xnode *x = &e->x[i];
    for (int j = 0; j < x->n_ev; j++) PE_TRY(pe_event_record(x->ev[j], compute_of(x->ev[j]->dev)));
    for (int k = 0; k < x->n_wfence; k++)
      if (x->wfence[k]->ev)
        PE_TRY(par_fence_record(x->wfence[k], compute_of(x->wfence[k]->ev->dev)));
  }
  return NULL;
}

static pe_status *launch_set(pe_par_exec *e, graph_set *s, uint64_t delta) {
  for (int p = 0; p < s->n; p++) PE_TRY(s->ops->launch(s->g[p], delta));
  return rerecord(e);
}

/* --- replay ------------------------------------------------------------------ */

/* The replay's engine op, on a pool worker once every variable is granted. */
static pe_status *replay_fn(void *arg) {
  pe_par_exec *e = arg;
  graph_set *s = e->graph->set;
  pe_rng *r = &e->m->rng;
  pe_status *st = launch_set(e, s, r->offset - s->rng0);
  if (!st) r->offset += s->rng_step;
  par_fail(e, st);
  return NULL;
}

static void replay_done(void *arg, const pe_status *st) {
  (void)st;
  par_hand_back(arg);
}

static pe_status *replay(pe_par_exec *e, par_graph *pg) {
  pe_engine_op_args a = {replay_fn, e,          replay_done,       pg->reads, pg->n_reads,
                         pg->muts,  pg->n_muts, e->opts->priority, 1,         0};
  pe_engine_op *op = NULL;
  par_model_push_begin(e->m, e->writes_persistables, &e->opts->origin);
  pe_status *st = pe_engine_op_new(e->rt->eng, &a, &op);
  par_model_push_end(e->m);
  if (st) return st;
  atomic_store(&e->executed, e->g->n_nodes);
  pe_engine_op_start(e->rt->eng, op);
  return NULL;
}

/* --- the step --------------------------------------------------------------- */

pe_status *par_graph_step_begin(pe_par_exec *e, bool *launched) {
  *launched = false;
  par_graph *pg = e->graph;
  pg->action = PE_STEP_WARMUP;
  pg->set = NULL;
  drop_step_key(pg);
  const char *why = NULL;
  if (!run_capturable(e, &why)) {
    pg->skip_why = why;
    return NULL;
  }
  pg->skip_why = NULL;
  PE_TRY(build_key(e, pg));
  void *found = NULL;
  PE_TRY(pe_step_graphs_lookup(pg->cache, &pg->key, &pg->action, &found, &why));
  if (pg->action == PE_STEP_REPLAY || pg->action == PE_STEP_CAPTURE) PE_TRY(own_feeds(e, pg));
  if (pg->action == PE_STEP_REPLAY) {
    pg->set = found;
    if (addrs_moved(e, pg->set)) {
      pe_step_graphs_invalidate(pg->cache, PE_STEP_INVALID_PARAMS);
      pg->action = PE_STEP_WARMUP; /* the next step of the key captures anew */
      pg->set = NULL;
      PE_TRY(pe_step_graphs_lookup(pg->cache, &pg->key, &pg->action, &found, &why));
      return NULL;
    }
    PE_TRY(replay(e, pg));
    *launched = true;
    return NULL;
  }
  if (pg->action != PE_STEP_CAPTURE) return NULL;

  char buf[256];
  if (!ops_capturable(e, buf, sizeof buf)) {
    refuse(pg, buf);
    pg->action = PE_STEP_FALLBACK;
    return NULL;
  }
  graph_set *s = calloc(1, sizeof *s);
  if (s) s->addrs = calloc((size_t)(e->g->n_lvars ? e->g->n_lvars : 1), sizeof *s->addrs);
  if (!s || !s->addrs) {
    set_free(s);
    return OOM();
  }
  s->ops = pg->ops;
  s->n_addrs = e->g->n_lvars;
  s->rng0 = e->m->rng.offset;
  for (int p = 0; p < e->n_places; p++) {
    pe_status *st = pg->ops->begin(e->dev[p]);
    if (st) {
      /* End the recordings already begun; nothing was recorded yet. */
      for (int q = 0; q < p; q++) {
        void *g = NULL;
        pe_status_free(pg->ops->end(e->dev[q], &g));
        if (g) pg->ops->free(g);
      }
      refuse(pg, pe_status_msg(st));
      pe_status_free(st);
      set_free(s);
      pg->action = PE_STEP_FALLBACK;
      return NULL;
    }
    s->n = p + 1;
  }
  pg->set = s;
  return NULL;
}

/* Take the errors kept on the places' streams by launches the failed
 * recording refused (the normal launch that follows reports its own): the
 * first one, NULL when none, is returned to the caller, since it names
 * the launch that broke the recording, where the end of the recording
 * only says that something did. */
static pe_status *take_stream_errors(pe_par_exec *e) {
  pe_status *first = NULL;
  for (int p = 0; p < e->n_places; p++)
    for (int k = 0; k < PE_STREAM_KINDS; k++) {
      pe_stream *s = pe_device_stream(e->dev[p], k);
      pe_status *st = s->dev->ops->take_error(s);
      if (st && !first)
        first = st;
      else
        pe_status_free(st);
    }
  return first;
}

pe_status *par_graph_step_end(pe_par_exec *e) {
  par_graph *pg = e->graph;
  if (pg->action != PE_STEP_CAPTURE) return NULL;
  graph_set *s = pg->set;
  pg->set = NULL;
  pg->action = PE_STEP_FALLBACK;
  /* End every recording, whatever happened. */
  pe_status *first = NULL;
  for (int p = 0; p < s->n; p++) {
    void *g = NULL;
    pe_status *st = pg->ops->end(e->dev[p], &g);
    s->g[p] = g;
    if (st && !first)
      first = st;
    else
      pe_status_free(st);
  }
  pe_status *node_err = atomic_exchange(&e->err, NULL);
  if (first || node_err) {
    /* Nothing ran: refuse the key and run the step the normal way, from
     * the generator offset the recording started at. The reason is the
     * earliest failure known: a node's, a launch's kept on its stream,
     * then the recording's end. */
    pe_status *stream_err = take_stream_errors(e);
    const pe_status *why = node_err ? node_err : stream_err ? stream_err : first;
    char buf[512];
    snprintf(buf, sizeof buf, "the step could not be recorded: %s", pe_status_msg(why));
    refuse(pg, buf);
    pe_status_free(first);
    pe_status_free(node_err);
    pe_status_free(stream_err);
    /* The recording's engine ops have completed and this executor's runs
     * are serialised: the generator is not being drawn from by this graph. */
    e->m->rng.offset = s->rng0;
    set_free(s);
    /* Events and fences recorded during the recording are not usable
     * outside it: record them again (on idle work) before the launch. */
    PE_TRY(rerecord(e));
    PE_TRY(par_step_launch(e, pe_timeline_now_ns()));
    par_wait_back(e);
    return NULL;
  }
  s->rng_step = e->m->rng.offset - s->rng0;
  snapshot_addrs(e, s->addrs);
  /* The recorded step itself runs as the graph's first launch (delta 0). */
  pe_status *st = launch_set(e, s, 0);
  const char *why = NULL;
  if (!st && !pe_step_graph_rng_capturable(has_gaussian(e), s->rng_step, &why)) {
    refuse(pg, why);
    set_free(s);
  } else if (!st) {
    pe_step_graphs_store(pg->cache, &pg->key, s);
  } else {
    set_free(s);
  }
  return st;
}
