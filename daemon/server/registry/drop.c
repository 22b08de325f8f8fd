/* The registry's part of dropping a model (pe_registry_drop_begin/_end;
 * the request is registry/model_drop.c), and the other clients' programs
 * that keep a model in use. */
#include <stdio.h>
#include <stdlib.h>

#include "server/client_tag.h"
#include "server/registry/internal.h"

/* The live programs of m that a client other than `client` owns, as an
 * error naming them (lock held); NULL when there are none. */
static pe_status *other_users_locked(pe_registry *r, const pe_srv_model *m, uint64_t client,
                                     const char *op, const char *way_out) {
  enum { SHOWN = 4 };
  char list[SHOWN * 64] = "";
  size_t o = 0;
  int n = 0;
  for (int i = 0; i < r->n_progs; i++) {
    const pe_srv_program *p = r->progs[i];
    if (p->model != m || p->dead) continue;
    for (int k = 0; k < p->n_owners; k++) {
      if (p->owners[k] == client) continue;
      if (n++ < SHOWN && o < sizeof list)
        o += (size_t)snprintf(list + o, sizeof list - o, "%sprogram 0x%016llx of client %s",
                              o ? ", " : "", (unsigned long long)p->handle,
                              pe_client_tag(p->owners[k]).s);
    }
  }
  if (!n) return NULL;
  char more[32] = "";
  if (n > SHOWN) snprintf(more, sizeof more, " and %d more", n - SHOWN);
  return pe_error(PE_EPERM, "%s: model '%s' is in use by %s%s; %s", op, m->name, list, more,
                  way_out);
}

pe_status *pe_registry_model_in_use(pe_registry *r, const pe_srv_model *m, uint64_t client,
                                    const char *op, const char *way_out) {
  pthread_mutex_lock(&r->mu);
  pe_status *st = other_users_locked(r, m, client, op, way_out);
  pthread_mutex_unlock(&r->mu);
  return st;
}

pe_status *pe_registry_drop_begin(pe_registry *r, uint64_t client, const char *name,
                                  pe_status *(*absent)(void *arg), void *arg, pe_srv_model **out,
                                  int *programs) {
  *out = NULL;
  *programs = 0;
  PE_TRY(pe_name_check("drop_model: model name", name));
  pthread_mutex_lock(&r->mu);
  pe_srv_model *m = pe_reg_model_find(r, name);
  pe_srv_program **fps = NULL;
  pe_status *st = NULL;
  if (!m)
    st = absent(arg);
  else if (m->dropping)
    st = pe_error(PE_EINVAL, "drop_model: model '%s' is being dropped already", name);
  else
    st = other_users_locked(r, m, client, "drop_model",
                            "its clients must deregister those programs or close their sessions "
                            "first (or an operator drops them: pe-client deregister --force "
                            "--handle H)");
  if (!st && m && !(fps = calloc(r->n_progs ? (size_t)r->n_progs : 1, sizeof *fps)))
    st = pe_error(PE_ENOMEM, "drop_model: out of memory");
  int n_free = 0;
  if (!st && m) {
    m->dropping = true;
    m->persistent = false;
    m->refs++; /* so no program's unlink below frees it */
    /* The caller's programs of m (the only live ones left) go, as with a
     * deregister; downwards: an unlink moves the last program into slot i. */
    for (int i = r->n_progs - 1; i >= 0; i--) {
      pe_srv_program *p = r->progs[i];
      if (p->model != m || p->dead) continue;
      ++*programs;
      pe_reg_drop_owner_locked(p, client);
      pe_srv_model *fm;
      pe_reg_prog_maybe_unlink(r, p, &fps[n_free], &fm);
      if (fps[n_free]) n_free++;
    }
    *out = m;
  }
  pthread_mutex_unlock(&r->mu);
  for (int i = 0; i < n_free; i++) pe_reg_destroy_later(fps[i], NULL);
  free(fps);
  return st;
}

void pe_registry_drop_end(pe_registry *r, pe_srv_model *m) {
  if (!m) return;
  pthread_mutex_lock(&r->mu);
  for (int i = 0; i < r->n_models; i++)
    if (r->models[i] == m) {
      r->models[i] = r->models[--r->n_models];
      break;
    }
  m->unlinked = true;
  m->refs--;
  pe_srv_model *fm = pe_reg_model_maybe_unlink(r, m);
  pthread_mutex_unlock(&r->mu);
  pe_reg_destroy_later(NULL, fm);
}
