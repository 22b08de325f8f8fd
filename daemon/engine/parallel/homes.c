/* Homes of persistables (pe_par_exec_new, par_entry.home): a variable a
 * graph updates on one place only (the Reduce strategy's optimizer state,
 * updated by the parameter's owner) is read from that place as the model's
 * value; the other replicas keep their startup values.
 *
 * Threads: both run on the thread binding the graph; claims take the
 * model's mu, and readers load home atomically. */
#include <stdlib.h>

#include "engine/parallel/executor_internal.h"

#define OOM() pe_error(PE_ENOMEM, "parallel executor: out of memory")

/* The persistables the graph writes on exactly one place (e->home_en,
 * e->home_place). A name replicated on every place is written on every
 * place (AllReduce's optimizers, Reduce's parameter broadcast) or on none. */
pe_status *par_find_homes(pe_par_exec *e) {
  const pe_graph *g = e->g;
  int nl = g->n_lvars;
  bool *written = calloc((size_t)(nl ? nl : 1), sizeof *written);
  bool *seen = calloc((size_t)(nl ? nl : 1), sizeof *seen);
  e->home_en = calloc((size_t)(nl ? nl : 1), sizeof *e->home_en);
  e->home_place = calloc((size_t)(nl ? nl : 1), sizeof *e->home_place);
  pe_status *st = written && seen && e->home_en && e->home_place ? NULL : OOM();
  for (int i = 0; !st && i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_out_lv; k++) written[g->nodes[i].out_lv[k]] = true;
  for (int i = 0; !st && i < nl; i++) {
    par_entry *en = e->lentry[i];
    if (!en || !written[i] || seen[i]) continue;
    uint64_t places = 0;
    for (int j = i; j < nl; j++)
      if (e->lentry[j] == en) {
        seen[j] = true;
        if (written[j]) places |= (uint64_t)1 << g->lvars[j].place;
      }
    if (places & (places - 1)) continue; /* more than one place */
    e->home_en[e->n_homes] = en;
    e->home_place[e->n_homes++] = g->lvars[i].place;
  }
  free(written);
  free(seen);
  return st;
}

pe_status *par_claim_homes(pe_par_exec *e) {
  pe_model *m = e->m;
  pe_status *st = NULL;
  pthread_mutex_lock(&m->mu);
  for (int i = 0; i < e->n_homes && !st; i++) {
    const par_entry *en = e->home_en[i];
    int home = atomic_load_explicit(&en->home, memory_order_relaxed);
    if (en->home_claimed && home != e->home_place[i])
      st = pe_error(PE_EINVAL,
                    "'%s' is updated on place %d only by this graph and on place %d only by "
                    "another graph of the model (different parameter owners under the reduce "
                    "strategy): the two would keep two diverging values",
                    en->name, e->home_place[i], home);
  }
  for (int i = 0; i < e->n_homes && !st; i++) {
    atomic_store_explicit(&e->home_en[i]->home, e->home_place[i], memory_order_relaxed);
    e->home_en[i]->home_claimed = true;
  }
  pthread_mutex_unlock(&m->mu);
  return st;
}
