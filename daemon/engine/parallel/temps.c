/* The memory of an executor's temporaries: what it keeps between runs.
 *
 * The shared (memory-planned) buffers and the kernels' own outputs keep
 * their capacity across runs, so a steady batch size allocates nothing.
 * Capacity only grew: a model that once ran a huge batch kept that batch's
 * memory until it was deregistered. Now a run whose batch on a place is at
 * most half the one the memory was sized for gives the excess back (buffers
 * twice their need or more are reallocated to fit, the kernels' outputs
 * of per-sample size are released and sized again by their kernels); a
 * steady batch, or one that wavers by less than half, never reallocates.
 * pe_par_exec_release gives back all of it between runs.
 *
 * Threads: under run_mu (the run's caller, or release). */
#include "engine/parallel/executor_internal.h"

/* A temporary whose storage the executor allocates (not a parameter, not
 * a view into a bucket, a shared buffer or the caller's feed). */
static bool owned_temp(const pe_par_exec *e, int lv) {
  const pe_graph_lvar *l = &e->g->lvars[lv];
  return !l->persistable && l->bucket < 0 && e->own[lv].alloc;
}

/* Place p's batch shrank to at most half of what its memory was sized for:
 * release the kernels' per-sample outputs there (sized again by the
 * kernels, for this batch). */
static void shrink_place(pe_par_exec *e, int p) {
  const pe_graph *g = e->g;
  for (int lv = 0; lv < g->n_lvars; lv++) {
    const pe_graph_lvar *l = &g->lvars[lv];
    if (l->place == p && (l->per_sample || l->bytes < 0) && owned_temp(e, lv))
      pe_tensor_release(&e->own[lv]);
  }
}

void par_temps_fit(pe_par_exec *e) {
  for (int p = 0; p < e->n_places; p++) {
    int64_t rows = e->has_feeds ? e->n_rows[p] : 1;
    if (rows * 2 <= e->rows_sized[p]) {
      shrink_place(e, p);
      e->rows_sized[p] = rows;
    } else if (rows > e->rows_sized[p]) {
      e->rows_sized[p] = rows;
    }
  }
}

bool par_buffer_oversized(size_t cap, int64_t need) {
  return cap / 2 >= (size_t)need; /* a class half the size would do */
}

void pe_par_exec_release(pe_par_exec *e) {
  const pe_graph *g = e->g;
  /* A run in progress needs the memory (and its request releases it when
   * it ends): no wait for it here. */
  if (pthread_mutex_trylock(&e->run_mu)) return;
  /* Device work of the last run may still use the memory: wait for it;
   * its failure goes to the next run (or sync), as it would have. */
  if (e->tail) e->tail_err = par_drain(e);
  for (int b = 0; b < g->n_buffers; b++) {
    if (!e->buf_mem[b]) continue;
    const pe_graph_buffer *bf = &g->buffers[b];
    for (int k = 0; k < bf->n_lvars; k++) {
      pe_tensor *t = &e->own[bf->lvars[k]];
      if (!t->alloc && t->data == e->buf_mem[b]) { /* bound again at the next run */
        t->data = NULL;
        t->cap = 0;
      }
    }
    pe_device_free(e->dev[bf->place], e->buf_mem[b], e->buf_cap[b]);
    e->buf_mem[b] = NULL;
    e->buf_cap[b] = 0;
  }
  for (int lv = 0; lv < g->n_lvars; lv++)
    if (owned_temp(e, lv)) pe_tensor_release(&e->own[lv]);
  for (int p = 0; p < e->n_places; p++) {
    pe_tensor_release(&e->stage[p]);
    e->rows_sized[p] = 0;
  }
  pthread_mutex_unlock(&e->run_mu);
}
