/* Static graph runner. Everything a run needs is allocated by pe_dag_new;
 * a run only copies the in-degrees into the counters.
 *
 * Counters. cnt[v] holds v's unmet predecessors; SKIP_BIT in the same word
 * marks that a predecessor failed or was skipped (set with fetch_or before
 * that predecessor's decrement, so whoever brings the count to zero sees
 * it). Decrements are acq_rel: the release publishes the predecessor's
 * work, and the thread that reaches zero acquires all predecessors'.
 *
 * Completion. Only sinks (nodes without successors) count down
 * `remaining`: every node is an ancestor of some sink, and a node's last
 * decrement of its successors precedes that successor's run, so when the
 * last sink is done every node has run. A task therefore must not touch
 * the graph after its final decrement unless that decrement made work
 * ready (which keeps the run open): the loop bounds and the pool are read
 * into locals first. acq_rel on `remaining` hands every node's effects to
 * the thread that reaches zero, which wakes the caller.
 *
 * The re-arm (memcpy into the counters) happens before the roots are
 * submitted; the submission publishes it to the workers. */
#define _GNU_SOURCE
#include "graph_run.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define SKIP_BIT (1 << 30) /* in-degrees are below 2^30 (edge counts are ints) */

typedef struct node_task {
  pe_task task; /* fn and arg fixed at build; next used while queued */
  pe_dag *g;
  int node;
} node_task;

struct pe_dag {
  int n;
  int *indeg;    /* static in-degree per node */
  int *succ_off; /* successors of v: succ[succ_off[v] .. succ_off[v+1]) */
  int *succ;
  int *roots; /* nodes of in-degree 0 */
  int n_roots;
  int n_sinks; /* nodes without successors */

  /* Per-run state, re-armed by each run. */
  atomic_int *cnt; /* unmet predecessors | SKIP_BIT */
  node_task *tasks;
  atomic_int remaining; /* sinks not yet done */
  atomic_bool running;
  _Atomic(pe_status *) err; /* first failure */
  pe_pool *pool;
  pe_dag_fn fn;
  void *ctx;

  /* Completion: the caller blocks on cv, or polls `flag` when it is a pool
   * worker (it runs tasks meanwhile). The finisher's last touch is the
   * unlock or the flag store. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done; /* mu */
  atomic_bool flag;
  bool polling;
};

/* --- build ------------------------------------------------------------------------- */

void pe_dag_free(pe_dag *g) {
  if (!g) return;
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
  free(g->indeg);
  free(g->succ_off);
  free(g->succ);
  free(g->roots);
  free((void *)g->cnt);
  free(g->tasks);
  free(g);
}

static void node_task_fn(void *arg);

pe_status *pe_dag_new(int n, const int *src, const int *dst, int n_edges, pe_dag **out) {
  *out = NULL;
  if (n < 0 || n_edges < 0 || (n_edges && (!src || !dst)))
    return pe_error(PE_EINVAL, "graph: %d nodes, %d edges", n, n_edges);
  for (int i = 0; i < n_edges; i++)
    if (src[i] < 0 || src[i] >= n || dst[i] < 0 || dst[i] >= n)
      return pe_error(PE_EINVAL, "graph: edge %d (%d -> %d) outside 0..%d", i, src[i], dst[i],
                      n - 1);
  pe_dag *g = calloc(1, sizeof *g);
  if (!g) return pe_error(PE_ENOMEM, "graph");
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  size_t nn = (size_t)n + 1;
  g->n = n;
  g->indeg = calloc(nn, sizeof(int));
  g->succ_off = calloc(nn + 1, sizeof(int));
  g->succ = malloc(sizeof(int) * ((size_t)n_edges + 1));
  g->roots = malloc(sizeof(int) * nn);
  g->cnt = malloc(sizeof(atomic_int) * nn);
  g->tasks = calloc(nn, sizeof(node_task));
  int *fill = calloc(nn, sizeof(int));
  if (!g->indeg || !g->succ_off || !g->succ || !g->roots || !g->cnt || !g->tasks || !fill) {
    free(fill);
    pe_dag_free(g);
    return pe_error(PE_ENOMEM, "graph: %d nodes, %d edges", n, n_edges);
  }
  for (int i = 0; i < n_edges; i++) {
    g->indeg[dst[i]]++;
    g->succ_off[src[i] + 1]++;
  }
  for (int v = 0; v < n; v++) g->succ_off[v + 1] += g->succ_off[v];
  for (int i = 0; i < n_edges; i++) g->succ[g->succ_off[src[i]] + fill[src[i]]++] = dst[i];
  for (int v = 0; v < n; v++) {
    if (g->indeg[v] == 0) g->roots[g->n_roots++] = v;
    if (g->succ_off[v + 1] == g->succ_off[v]) g->n_sinks++;
    g->tasks[v] = (node_task){.task = {.fn = node_task_fn, .arg = &g->tasks[v]}, .g = g, .node = v};
  }
  /* Kahn's algorithm with `fill` as the counter: every node reachable
   * from the roots in topological order, or there is a cycle. */
  int *order = g->roots, head = 0, tail = g->n_roots;
  int *queue = malloc(sizeof(int) * nn);
  if (!queue) {
    free(fill);
    pe_dag_free(g);
    return pe_error(PE_ENOMEM, "graph: %d nodes", n);
  }
  memcpy(queue, order, sizeof(int) * (size_t)g->n_roots);
  memcpy(fill, g->indeg, sizeof(int) * (size_t)n);
  while (head < tail) {
    int v = queue[head++];
    for (int j = g->succ_off[v]; j < g->succ_off[v + 1]; j++)
      if (--fill[g->succ[j]] == 0) queue[tail++] = g->succ[j];
  }
  free(queue);
  free(fill);
  if (tail != n) {
    pe_dag_free(g);
    return pe_error(PE_ECYCLE, "graph: %d of %d nodes are on or behind a cycle", n - tail, n);
  }
  atomic_init(&g->remaining, 0);
  atomic_init(&g->running, false);
  atomic_init(&g->err, NULL);
  atomic_init(&g->flag, false);
  *out = g;
  return NULL;
}

int pe_dag_nodes(const pe_dag *g) {
  return g->n;
}

/* --- run ------------------------------------------------------------------------------- */

static void finish(pe_dag *g) {
  if (g->polling) {
    atomic_store_explicit(&g->flag, true, memory_order_release);
  } else {
    pthread_mutex_lock(&g->mu);
    g->done = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
  }
}

static void node_task_fn(void *arg) {
  node_task *t = arg;
  pe_dag *g = t->g;
  pe_pool *pool = g->pool;
  int v = t->node;
  /* The submitter's queue hand-off orders this after the last decrement. */
  bool skip = atomic_load_explicit(&g->cnt[v], memory_order_relaxed) & SKIP_BIT;
  for (;;) {
    if (!skip) {
      pe_status *st = g->fn(g->ctx, v);
      if (st) {
        skip = true;
        pe_status *none = NULL;
        if (!atomic_compare_exchange_strong_explicit(&g->err, &none, st, memory_order_relaxed,
                                                     memory_order_relaxed))
          pe_status_free(st);
      }
    }
    /* Release successors: run the first that becomes ready here, queue
     * the others as one batch. */
    int next = -1, nb = 0, j0 = g->succ_off[v], j1 = g->succ_off[v + 1];
    bool next_skip = false;
    pe_task *first = NULL, *last = NULL;
    if (j0 == j1) {
      /* A sink: the last touch of the graph by this task. */
      if (atomic_fetch_sub_explicit(&g->remaining, 1, memory_order_acq_rel) == 1) finish(g);
      return;
    }
    for (int j = j0; j < j1; j++) {
      int s = g->succ[j];
      if (skip) atomic_fetch_or_explicit(&g->cnt[s], SKIP_BIT, memory_order_relaxed);
      int old = atomic_fetch_sub_explicit(&g->cnt[s], 1, memory_order_acq_rel);
      if ((old & ~SKIP_BIT) != 1) continue;
      if (next < 0) {
        next = s;
        next_skip = old & SKIP_BIT;
      } else {
        pe_task *ts = &g->tasks[s].task;
        if (last)
          last->next = ts;
        else
          first = ts;
        last = ts;
        nb++;
      }
    }
    if (nb) pe_pool_submit_batch(pool, first, last, nb);
    if (next < 0) return;
    v = next;
    skip = next_skip;
  }
}

pe_status *pe_dag_run(pe_dag *g, pe_pool *pool, pe_dag_fn fn, void *ctx) {
  if (g->n && !fn) return pe_error(PE_EINVAL, "graph: no node function");
  if (atomic_exchange_explicit(&g->running, true, memory_order_acquire))
    return pe_error(PE_EINVAL, "graph: already running");
  if (g->n == 0) {
    atomic_store_explicit(&g->running, false, memory_order_release);
    return NULL;
  }
  /* Re-arm. No worker touches this graph between runs, so plain copies
   * into the atomics are race-free; submitting publishes them. */
  memcpy((void *)g->cnt, g->indeg, sizeof(int) * (size_t)g->n);
  atomic_store_explicit(&g->remaining, g->n_sinks, memory_order_relaxed);
  atomic_store_explicit(&g->err, NULL, memory_order_relaxed);
  atomic_store_explicit(&g->flag, false, memory_order_relaxed);
  g->done = false;
  g->polling = pe_pool_is_worker(pool);
  g->pool = pool;
  g->fn = fn;
  g->ctx = ctx;
  for (int i = 0; i + 1 < g->n_roots; i++)
    g->tasks[g->roots[i]].task.next = &g->tasks[g->roots[i + 1]].task;
  pe_pool_submit_batch(pool, &g->tasks[g->roots[0]].task, &g->tasks[g->roots[g->n_roots - 1]].task,
                       g->n_roots);
  if (g->polling) {
    while (!atomic_load_explicit(&g->flag, memory_order_acquire))
      if (!pe_pool_run_one(pool)) sched_yield();
  } else {
    pthread_mutex_lock(&g->mu);
    while (!g->done) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
  }
  pe_status *st = atomic_load_explicit(&g->err, memory_order_relaxed);
  atomic_store_explicit(&g->running, false, memory_order_release);
  return st;
}
