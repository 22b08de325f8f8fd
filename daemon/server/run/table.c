/* The runs in flight (run/table.h). */
#include "server/run/table.h"

#include <stdio.h>
#include <stdlib.h>

void pe_run_table_init(pe_run_table *t) {
  pthread_mutex_init(&t->mu, NULL);
  t->head = t->tail = NULL;
  t->n = 0;
}

void pe_run_table_destroy(pe_run_table *t) {
  pthread_mutex_destroy(&t->mu);
}

void pe_run_table_add(pe_run_table *t, pe_run_entry *e) {
  pthread_mutex_lock(&t->mu);
  e->next = NULL;
  e->prev = t->tail;
  if (t->tail)
    t->tail->next = e;
  else
    t->head = e;
  t->tail = e;
  t->n++;
  pthread_mutex_unlock(&t->mu);
}

void pe_run_table_remove(pe_run_table *t, pe_run_entry *e) {
  pthread_mutex_lock(&t->mu);
  if (e->prev)
    e->prev->next = e->next;
  else
    t->head = e->next;
  if (e->next)
    e->next->prev = e->prev;
  else
    t->tail = e->prev;
  t->n--;
  pthread_mutex_unlock(&t->mu);
}

int pe_run_table_count(pe_run_table *t) {
  pthread_mutex_lock(&t->mu);
  int n = t->n;
  pthread_mutex_unlock(&t->mu);
  return n;
}

pe_status *pe_run_table_snapshot(pe_run_table *t, double now, pe_run_info **out, int *n) {
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&t->mu);
  int n_runs = t->n, k = 0;
  pe_run_info *v = n_runs ? calloc((size_t)n_runs, sizeof *v) : NULL;
  /* The names are copied under the lock: an entry's model lives while it
   * is linked. */
  for (pe_run_entry *e = t->head; e && v; e = e->next) {
    pe_run_info *x = &v[k++];
    *x = (pe_run_info){.client = e->client,
                       .handle = e->handle,
                       .done = atomic_load(&e->done),
                       .total = e->total,
                       .age_s = now - e->start};
    snprintf(x->model, sizeof x->model, "%s", e->model);
  }
  pthread_mutex_unlock(&t->mu);
  if (n_runs && !v) return pe_error(PE_ENOMEM, "status: out of memory for %d runs", n_runs);
  *out = v;
  *n = n_runs;
  return NULL;
}
