/* The registry's tables (see registry/registry.h, registry/internal.h):
 * creating and freeing them, lookups, and unlinking and freeing their
 * programs and models. */
#include "server/registry/registry.h"

#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "server/heap_trim.h"
#include "server/job/job.h"
#include "server/registry/internal.h"

bool pe_reg_grow(void **arr, int *cap, int need, size_t elem) {
  if (need <= *cap) return true;
  int c = *cap ? *cap * 2 : 8;
  while (c < need) c *= 2;
  void *p = realloc(*arr, (size_t)c * elem);
  if (!p) return false;
  *arr = p;
  *cap = c;
  return true;
}

pe_status *pe_registry_new(pe_server *s, pe_registry **out) {
  pe_registry *r = calloc(1, sizeof *r);
  if (!r) return pe_error(PE_ENOMEM, "registry: out of memory");
  r->s = s;
  pthread_mutex_init(&r->mu, NULL);
  *out = r;
  return NULL;
}

static void var_infos_free(pe_var_info *v, int n) {
  if (!v) return;
  for (int i = 0; i < n; i++) free(v[i].name);
  free(v);
}

/* Frees executors; must not hold the registry lock (waits for the engine). */
void pe_reg_program_destroy(pe_srv_program *p) {
  size_t program_bytes = p->key_len; /* the program's bytes, its model's name, its options */
  if (p->model) pe_run_budget_set(&p->model->srv->run_budget, &p->kept_bytes, 0);
  pe_par_exec_free(p->exec);
  pe_par_exec_free(p->startup);
  var_infos_free(p->params, p->n_params);
  var_infos_free(p->feeds, p->n_feeds);
  free(p->key);
  free(p->owners);
  free(p);
  pe_heap_trim_after_program(program_bytes);
}

static void model_destroy(pe_srv_model *m) {
  pe_run_budget_set(&m->srv->run_budget, &m->charged_bytes, 0);
  pe_model_free(m->m);
  free(m->trial);
  pe_srv_job_free(m->job);
  pe_shape_claims_destroy(&m->shapes);
  pthread_mutex_destroy(&m->save_mu);
  pthread_mutex_destroy(&m->ckpt_mu);
  pthread_mutex_destroy(&m->init_mu);
  pe_strmap_destroy(&m->initialized);
  free(m);
}

void pe_registry_free(pe_registry *r) {
  if (!r) return;
  for (int i = 0; i < r->n_progs; i++) pe_reg_program_destroy(r->progs[i]);
  for (int i = 0; i < r->n_models; i++) model_destroy(r->models[i]);
  free(r->progs);
  free(r->models);
  free(r->sessions);
  pthread_mutex_destroy(&r->mu);
  free(r);
}

/* --- lookups (lock held) -------------------------------------------------- */
int pe_reg_prog_index(pe_registry *r, uint64_t handle) {
  for (int i = 0; i < r->n_progs; i++)
    if (r->progs[i]->handle == handle) return i;
  return -1;
}

pe_srv_model *pe_reg_model_find(pe_registry *r, const char *name) {
  for (int i = 0; i < r->n_models; i++)
    if (!strcmp(r->models[i]->name, name)) return r->models[i];
  return NULL;
}

/* A model without programs, users or persistence goes; returns it to free
 * outside the lock, or NULL. A dropped model has left the table already. */
pe_srv_model *pe_reg_model_maybe_unlink(pe_registry *r, pe_srv_model *m) {
  if (m->n_programs > 0 || m->refs > 0 || m->persistent) return NULL;
  if (m->unlinked) return m;
  for (int i = 0; i < r->n_models; i++)
    if (r->models[i] == m) {
      r->models[i] = r->models[--r->n_models];
      return m;
    }
  return NULL;
}

/* Unlink a dead program without users; returns what to free (program, and
 * maybe its model) outside the lock. */
void pe_reg_prog_maybe_unlink(pe_registry *r, pe_srv_program *p, pe_srv_program **free_p,
                              pe_srv_model **free_m) {
  *free_p = NULL;
  *free_m = NULL;
  if (!p->dead || p->refs > 0) return;
  int i = pe_reg_prog_index(r, p->handle);
  if (i >= 0 && r->progs[i] == p) r->progs[i] = r->progs[--r->n_progs];
  p->model->n_programs--;
  *free_p = p;
  *free_m = pe_reg_model_maybe_unlink(r, p->model);
}

void pe_reg_destroy_later(pe_srv_program *p, pe_srv_model *m) {
  if (p) {
    PE_LOGI("program 0x%016llx freed", (unsigned long long)p->handle);
    pe_reg_program_destroy(p);
  }
  if (m) {
    PE_LOGI("model '%s' freed (no programs left, not persistent)", m->name);
    model_destroy(m);
  }
}
