/* Views of the registry for Status and the autosave: a snapshot of its
 * models, the names of the persistent ones. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/registry/internal.h"

void pe_registry_snapshot(pe_registry *r, bool with_bytes, pe_model_snapshot **models,
                          int *n_models, int *n_programs, int *n_clients) {
  pthread_mutex_lock(&r->mu);
  *models = calloc(r->n_models ? (size_t)r->n_models : 1, sizeof **models);
  *n_models = *models ? r->n_models : 0;
  for (int i = 0; i < *n_models; i++) {
    pe_srv_model *m = r->models[i];
    pe_model_snapshot *x = &(*models)[i];
    snprintf(x->name, sizeof x->name, "%s", m->name);
    x->programs = m->n_programs;
    /* The claims' count, as memory_per_client's, not the values: reading
     * them is an engine op, which waits for the model's step in flight
     * (seconds when other runs keep the pool's worker busy) while holding
     * the registry lock, so every request would wait with the Status. */
    x->param_bytes = with_bytes ? pe_reg_model_bytes_locked(m, NULL, 0) : 0;
    x->persistent = m->persistent;
    x->kind = m->kind;
    x->n_places = m->n_places;
    pthread_mutex_lock(&m->ckpt_mu);
    x->ckpt = m->ckpt;
    pthread_mutex_unlock(&m->ckpt_mu);
    snprintf(x->restart_name, sizeof x->restart_name, "%s", m->restart_name);
    x->changes = pe_model_changes(m->m);
    x->has_trial = m->trial != NULL;
    if (m->trial) x->trial = *m->trial;
  }
  int live = 0;
  for (int i = 0; i < r->n_progs; i++) live += !r->progs[i]->dead;
  *n_programs = live;
  *n_clients = r->n_sessions;
  pthread_mutex_unlock(&r->mu);
}

void pe_registry_persistent_models(pe_registry *r, char ***names, int *n) {
  pthread_mutex_lock(&r->mu);
  *names = calloc(r->n_models ? (size_t)r->n_models : 1, sizeof **names);
  *n = 0;
  for (int i = 0; *names && i < r->n_models; i++)
    if (r->models[i]->persistent) {
      char *s = strdup(r->models[i]->name);
      if (s) (*names)[(*n)++] = s;
    }
  pthread_mutex_unlock(&r->mu);
}
