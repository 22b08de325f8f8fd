/* A step whose exchange across nodes fails leaves every persistable as of
 * the last completed step (parallel/cross.c holds the optimizer updates
 * back; this file covers the rest).
 *
 * The nodes that do not depend on a cross-node all-reduce run whether the
 * exchange succeeds or not: batch norm's running statistics, a learning
 * rate schedule's step counter, an optimizer's power accumulators that
 * read no gradient. The persistables they write (per place) are copied by
 * an engine read pushed just before the step's ops (so it sees them as
 * of the end of the previous step, and the step's writers wait for it),
 * and written back by an engine mutation pushed at the step's end when the
 * exchange failed (so every later reader, a get or a checkpoint, sees the
 * values written back).
 *
 * Neither op is waited for (the step's end may run on a pool worker):
 * engine order keeps the copy from being overwritten before the write
 * back read it, and par_keep_free waits for the ops still in flight.
 * Threading: the copies are touched by one engine op at a time; pending
 * counts the ops in flight (under mu). */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "engine/parallel/executor_internal.h"
#include "engine/place_io.h"

#define OOM() pe_error(PE_ENOMEM, "parallel executor: out of memory")

/* Whether node id depends on an all-reduce summed across nodes: after[id]. */
static pe_status *after_cross(const pe_par_exec *e, bool *after) {
  const pe_graph *g = e->g;
  int *stack = malloc(sizeof *stack * (size_t)(g->n_nodes ? g->n_nodes : 1));
  if (!stack) return OOM();
  int top = 0;
  for (int i = 0; i < g->n_nodes; i++)
    if (e->x[i].cross_seq >= 0) {
      after[i] = true;
      stack[top++] = i;
    }
  while (top) {
    const pe_graph_node *n = &g->nodes[stack[--top]];
    for (int o = 0; o < n->n_out; o++) {
      const pe_graph_var *v = &g->vars[n->out[o]];
      for (int c = 0; c < v->n_consumers; c++)
        if (!after[v->consumers[c]]) {
          after[v->consumers[c]] = true;
          stack[top++] = v->consumers[c];
        }
    }
  }
  free(stack);
  return NULL;
}

pe_status *par_keep_compile(pe_par_exec *e) {
  par_keep *k = &e->keep;
  pthread_mutex_init(&k->mu, NULL);
  pthread_cond_init(&k->cv, NULL);
  k->inited = true;
  if (!e->n_cross) return NULL;
  const pe_graph *g = e->g;
  bool *after = calloc((size_t)(g->n_nodes ? g->n_nodes : 1), sizeof *after);
  if (!after) return OOM();
  pe_status *st = after_cross(e, after);
  int cap = 0;
  for (int i = 0; i < g->n_nodes && !st; i++) {
    const pe_graph_node *n = &g->nodes[i];
    if (after[i] || !e->x[i].writes_persistable) continue;
    for (int o = 0; o < n->n_out_lv && !st; o++) {
      par_entry *en = e->lentry[n->out_lv[o]];
      if (!en) continue;
      pe_engine_var *ev = en->ev[g->lvars[n->out_lv[o]].place];
      bool dup = false;
      for (int j = 0; j < k->n && !dup; j++) dup = k->ev[j] == ev;
      if (dup) continue;
      if (k->n == cap) {
        cap = cap ? 2 * cap : 8;
        void *a = realloc(k->ev, sizeof *k->ev * (size_t)cap);
        void *b = a ? realloc(k->var, sizeof *k->var * (size_t)cap) : NULL;
        if (a) k->ev = a;
        if (b) k->var = b;
        if (!a || !b) {
          st = OOM();
          break;
        }
      }
      k->ev[k->n] = ev;
      k->var[k->n] = (par_keep_var){en, g->lvars[n->out_lv[o]].place, false, {0}};
      pe_tensor_init(&k->var[k->n].copy);
      k->n++;
    }
  }
  free(after);
  return st;
}

void par_keep_free(pe_par_exec *e) {
  par_keep *k = &e->keep;
  if (!k->inited) return;
  pthread_mutex_lock(&k->mu);
  while (k->pending) pthread_cond_wait(&k->cv, &k->mu);
  pthread_mutex_unlock(&k->mu);
  for (int i = 0; i < k->n; i++) pe_tensor_release(&k->var[i].copy);
  free(k->var);
  free(k->ev);
  pthread_cond_destroy(&k->cv);
  pthread_mutex_destroy(&k->mu);
}

static pe_status *copy_fn(void *arg) {
  pe_par_exec *e = arg;
  par_keep *k = &e->keep;
  pe_status *st = NULL;
  for (int i = 0; i < k->n; i++) {
    par_keep_var *v = &k->var[i];
    const pe_tensor *t = &v->en->v[v->place]->t;
    /* A replica without storage has no value to keep; after a failed copy
     * none is kept (an older step's copy must not come back). */
    v->has = !st && t->data != NULL;
    if (v->has) st = pe_place_read(e->dev[v->place], t, &v->copy, v->en->name);
    if (st) v->has = false;
  }
  /* A copy that failed (out of memory) leaves its variable and the rest
   * out of the write back; the step itself goes on. */
  if (st) par_fail(e, pe_status_wrap(st, "keeping the persistables of the step"));
  return NULL;
}

static pe_status *write_back_fn(void *arg) {
  pe_par_exec *e = arg;
  par_keep *k = &e->keep;
  for (int i = 0; i < k->n; i++) {
    par_keep_var *v = &k->var[i];
    if (!v->has) continue;
    pe_status *st = pe_place_write(e->dev[v->place], &v->en->v[v->place]->t, &v->copy, v->en->name);
    /* The step failed already; its error is the one reported. */
    if (st) PE_LOGW("job: %s", pe_status_msg(st));
    pe_status_free(st);
  }
  return NULL;
}

static void keep_done(void *arg, const pe_status *st) {
  (void)st;
  par_keep *k = &((pe_par_exec *)arg)->keep;
  pthread_mutex_lock(&k->mu);
  k->pending--;
  pthread_cond_broadcast(&k->cv);
  pthread_mutex_unlock(&k->mu);
}

/* Push fn over the kept variables (mutate: as a write). The caller holds
 * the model's push lock. */
static pe_status *keep_push(pe_par_exec *e, pe_engine_fn fn, bool mutate) {
  par_keep *k = &e->keep;
  pe_engine_op_args a = {.fn = fn,
                         .arg = e,
                         .on_done = keep_done,
                         .reads = mutate ? NULL : k->ev,
                         .n_reads = mutate ? 0 : k->n,
                         .mutates = mutate ? k->ev : NULL,
                         .n_mutates = mutate ? k->n : 0,
                         .priority = e->opts->priority};
  pthread_mutex_lock(&k->mu);
  k->pending++;
  pthread_mutex_unlock(&k->mu);
  pe_status *st = pe_engine_op_new(e->rt->eng, &a, NULL);
  if (st) keep_done(e, NULL);
  return st;
}

pe_status *par_keep_begin(pe_par_exec *e) {
  if (!e->ncomm || !e->keep.n) return NULL;
  return keep_push(e, copy_fn, false);
}

void par_keep_end(pe_par_exec *e) {
  if (!e->ncomm || !e->keep.n || !e->cross_failed) return;
  par_model_push_begin(e->m, false, &e->opts->origin);
  pe_status *st = keep_push(e, write_back_fn, true);
  par_model_push_end(e->m);
  if (st) {
    PE_LOGW("job: the failed step's persistables stay as it left them: %s", pe_status_msg(st));
    pe_status_free(st);
  }
}
