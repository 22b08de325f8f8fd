/* Sums of gradients across the nodes of a job (engine/node_comm.h).
 *
 * A gradient's all-reduce node first sums over the node's places (the cpu
 * chunk tasks of parallel/collective_nodes.c), then is posted here. The
 * nodes of a job must issue their all-reduces in one order, so the posted
 * nodes are summed across nodes in cross_seq order: the thread that posts
 * the next one in order sums it, and goes on with the following ones that
 * are already posted (no thread ever waits for another's post: a pool
 * worker only blocks inside the communicator, on the peers). The sum lands
 * in place 0's buffer and is copied to the other places.
 *
 * On host places (cpu) the sums across nodes run on the executor's own
 * exchange thread, not on the pool worker that posts: a worker blocked in
 * the communicator would leave a daemon of one worker nothing to run the
 * rest of the backward pass with while the gradients travel. The thread
 * sums the posted nodes in cross_seq order and sleeps in between.
 *
 * The step's all-reduce nodes complete together after the last one was
 * summed: their successors (the optimizer updates) run only when every sum
 * of the step arrived. The backward pass never waits for them (it reads no
 * summed gradient), so it overlaps the exchange. A failure (a lost peer,
 * the timeout, or this node's own part failing) fails every held node: the
 * step updates no parameter, and the peers are told (pe_node_comm.fail),
 * so none of them waits for this node.
 *
 * On places with a device communicator across nodes (cuda: NCCL over the
 * nodes' lead GPUs, pe_model_set_node_dcomm), the same order and holding
 * apply, on the posting thread (the sums are queued on a stream, not
 * waited for); the sum over the places runs on the comm streams
 * (parallel/cross_device.c), the sum across nodes on place 0's device
 * buffers on its comm stream, and the result is spread to the other places
 * by the within-node broadcast. The step's rows (par_cross_rows) are summed
 * over the host communicator (the job's Gloo) on every kind of place. */
#define _GNU_SOURCE /* pthread_setname_np */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/node_comm.h"
#include "engine/parallel/executor_internal.h"

pe_status *par_cross_compile(pe_par_exec *e) {
  const pe_graph *g = e->g;
  e->n_cross = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    pe_node_kind k = g->nodes[i].kind;
    bool ar = k == PE_NODE_ALL_REDUCE || k == PE_NODE_FUSED_ALL_REDUCE;
    e->x[i].cross_seq = ar && !g->startup ? e->n_cross++ : -1;
  }
  if (!e->n_cross) return par_keep_compile(e);
  e->cross = calloc((size_t)e->n_cross, sizeof(*e->cross));
  if (!e->cross) return pe_error(PE_ENOMEM, "parallel executor: out of memory");
  return par_keep_compile(e);
}

void par_cross_free(pe_par_exec *e) {
  if (e->cross_thread_on) {
    pthread_mutex_lock(&e->cross_mu);
    e->cross_quit = true;
    pthread_cond_signal(&e->cross_cv);
    pthread_mutex_unlock(&e->cross_mu);
    pthread_join(e->cross_thread, NULL);
    pthread_cond_destroy(&e->cross_cv);
  }
  par_keep_free(e);
  free(e->cross);
  pthread_mutex_destroy(&e->cross_mu);
}

static void *exchange_main(void *arg);

static pe_status *start_exchange(pe_par_exec *e) {
  pthread_cond_init(&e->cross_cv, NULL);
  e->cross_quit = false;
  int rc = pthread_create(&e->cross_thread, NULL, exchange_main, e);
  if (rc) {
    pthread_cond_destroy(&e->cross_cv);
    return pe_error(PE_ENOMEM, "job across nodes: no thread for the exchange: %s", strerror(rc));
  }
  pthread_setname_np(e->cross_thread, "pe-exchange");
  e->cross_thread_on = true;
  return NULL;
}

pe_status *par_cross_begin(pe_par_exec *e) {
  e->ncomm = e->n_cross ? e->m->ncomm : NULL;
  e->ncomm_dev = NULL;
  if (!e->ncomm) return NULL;
  pe_node_comm_path path;
  PE_TRY(pe_node_comm_path_of(e->m->kind, e->n_places, e->async, e->m->ncomm_dev != NULL, &path));
  /* The sum over several places runs on the device collectives (dcomm);
   * a kind without them (sim) sums across nodes on one place only. */
  if (path == PE_NODE_COMM_DEVICE && e->n_places > 1 && !e->m->dcomm)
    return pe_error(PE_EINVAL,
                    "job across nodes: the model lives on %s:%d without device collectives "
                    "between its places; such places join a job one per node",
                    pe_place_kind_name(e->m->kind), e->n_places);
  if (path == PE_NODE_COMM_DEVICE) e->ncomm_dev = e->m->ncomm_dev;
  /* The exchange thread may still be releasing the last step's nodes. */
  pthread_mutex_lock(&e->cross_mu);
  memset(e->cross, 0, (size_t)e->n_cross * sizeof(*e->cross));
  e->cross_next = 0;
  e->cross_busy = false;
  e->cross_failed = false;
  pthread_mutex_unlock(&e->cross_mu);
  if (!e->ncomm_dev && !e->cross_thread_on) PE_TRY(start_exchange(e));
  return NULL;
}

pe_status *par_cross_rows(pe_par_exec *e, double *rows) {
  const pe_node_comm *c = e->ncomm;
  float r = (float)e->batch; /* exact: a float holds every integer up to 2^24 */
  float *b = &r;
  size_t one = 1;
  pe_status *st = c->all_reduce(c->ctx, &b, &one, 1);
  if (st) return pe_status_wrap(st, "summing the step's rows across the job's %d nodes", c->world);
  *rows = (double)r;
  return NULL;
}

/* Sum x across the nodes (x's sum over the places is in every place's
 * buffers); a failure fails the step. On device places (ncomm_dev) the
 * buffers are place 0's device memory, the sum runs on place 0's comm
 * stream after the sum over the places (parallel/cross_device.c spreads
 * it). */
static void cross_sum(xnode *x) {
  pe_par_exec *e = x->e;
  const pe_graph_node *n = x->n;
  const pe_node_comm *c = e->ncomm_dev ? e->ncomm_dev : e->ncomm;
  if (e->cross_failed) return; /* the communicator is broken: nothing more */
  if (atomic_load_explicit(&x->failed, memory_order_acquire) ||
      (e->ncomm_dev && atomic_load_explicit(&x->sfail, memory_order_acquire))) {
    c->fail(c->ctx, "a step failed on this node before its gradients were summed");
    e->cross_failed = true;
    return;
  }
  int np = e->n_places;
  int w = n->kind == PE_NODE_FUSED_ALL_REDUCE ? 1 : (n->width > 0 ? n->width : 1);
  float *bufs[64];
  size_t counts[64];
  pe_status *st = NULL;
  uint64_t t0 = e->tl ? pe_timeline_now_ns() : 0;
  /* In groups of up to 64 buffers (a node's width is small). */
  for (int k0 = 0; k0 < w && !st; k0 += 64) {
    int m = w - k0 < 64 ? w - k0 : 64;
    for (int k = 0; k < m; k++) {
      if (n->kind == PE_NODE_FUSED_ALL_REDUCE) {
        bufs[k] = e->bucket_mem[n->bucket * np];
      } else {
        bufs[k] = pe_f32(x->cin[k0 + k]);
      }
      counts[k] = (size_t)x->counts[k0 + k];
    }
    st = c->all_reduce(c->ctx, bufs, counts, m);
    if (e->ncomm_dev) {
      if (!st) {
        st = par_dcross_spread(x, k0, m);
        if (st) c->fail(c->ctx, pe_status_msg(st)); /* the peers go on without this node */
      }
      continue;
    }
    for (int k = 0; k < m && !st; k++)
      for (int p = 1; p < np; p++) {
        float *dst = n->kind == PE_NODE_FUSED_ALL_REDUCE ? e->bucket_mem[n->bucket * np + p]
                                                         : pe_f32(x->cin[p * w + k0 + k]);
        if (counts[k]) memcpy(dst, bufs[k], counts[k] * sizeof(float));
      }
  }
  if (e->tl) {
    /* Named apart from the node's sum over the places (the same thread's
     * lane, the node's own name): tools read the exchange's time by it. */
    char name[48];
    snprintf(name, sizeof name, "across nodes %s", n->name);
    pe_timeline_record(pe_timeline_thread_lane(e->tl, "across nodes"), e->g->places[0], name, t0,
                       pe_timeline_now_ns());
  }
  if (st) {
    par_fail(e, pe_status_wrap(st, "node %d %s: summing the gradients across the job's %d nodes",
                               x->id, n->name, c->world));
    e->cross_failed = true;
  }
}

static void complete_task(void *arg) {
  xnode *x = arg;
  if (x->engine)
    par_engine_complete(x); /* releases its variables, then par_node_done */
  else
    par_run_chain(par_node_done(x, true));
}

/* Sum the posted nodes from cross_next on, in order (cross_mu held, and
 * dropped around each sum). */
static void sum_posted_locked(pe_par_exec *e) {
  while (e->cross_next < e->n_cross && e->cross[e->cross_next]) {
    xnode *y = e->cross[e->cross_next];
    pthread_mutex_unlock(&e->cross_mu);
    cross_sum(y);
    pthread_mutex_lock(&e->cross_mu);
    e->cross_next++;
  }
}

/* Every sum is in (or the step failed): the held nodes go to the pool to
 * complete, but `mine` (NULL: none), which its caller completes. Under
 * cross_mu: the next step's par_cross_begin resets the table after this. */
static void release_locked(pe_par_exec *e, const xnode *mine) {
  for (int k = 0; k < e->n_cross; k++) {
    xnode *y = e->cross[k];
    if (e->cross_failed) atomic_store_explicit(&y->failed, true, memory_order_release);
    if (y == mine) continue;
    y->cross_task = (pe_task){complete_task, y, NULL};
    pe_pool_submit(e->rt->pool, &y->cross_task);
  }
}

static void *exchange_main(void *arg) {
  pe_par_exec *e = arg;
  pthread_mutex_lock(&e->cross_mu);
  for (;;) {
    while (!e->cross_quit && !(e->cross_next < e->n_cross && e->cross[e->cross_next]))
      pthread_cond_wait(&e->cross_cv, &e->cross_mu);
    if (e->cross_quit) break;
    sum_posted_locked(e);
    if (e->cross_next == e->n_cross) release_locked(e, NULL);
  }
  pthread_mutex_unlock(&e->cross_mu);
  return NULL;
}

bool par_cross_hold(xnode *x) {
  pe_par_exec *e = x->e;
  if (x->cross_seq < 0 || !e->ncomm) return true;
  pthread_mutex_lock(&e->cross_mu);
  e->cross[x->cross_seq] = x;
  if (!e->ncomm_dev) {
    pthread_cond_signal(&e->cross_cv); /* the exchange thread sums it */
    pthread_mutex_unlock(&e->cross_mu);
    return false;
  }
  /* Device path: the thread that posts the next in order sums it. */
  if (e->cross_busy) {
    pthread_mutex_unlock(&e->cross_mu);
    return false;
  }
  e->cross_busy = true;
  sum_posted_locked(e);
  bool last = e->cross_next == e->n_cross;
  e->cross_busy = false;
  /* x, the one posted last, completes on this thread (its caller's path). */
  if (last) release_locked(e, x);
  pthread_mutex_unlock(&e->cross_mu);
  return last;
}
