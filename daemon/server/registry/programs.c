/* Programs of the registry: acquiring and releasing them for a request,
 * their owners, and deregistering. */
#include "core/clock.h"
#include "core/log.h"
#include "server/client_tag.h"
#include "server/registry/internal.h"

pe_status *pe_registry_acquire(pe_registry *r, uint64_t handle, pe_srv_program **out) {
  pthread_mutex_lock(&r->mu);
  int i = pe_reg_prog_index(r, handle);
  pe_srv_program *p = i >= 0 && !r->progs[i]->dead ? r->progs[i] : NULL;
  if (p) p->refs++;
  pthread_mutex_unlock(&r->mu);
  *out = p;
  if (!p)
    return pe_error(
        PE_ENOTFOUND,
        "handle 0x%016llx: no such program (never registered, deregistered or its session expired)",
        (unsigned long long)handle);
  return NULL;
}

bool pe_registry_read_only(pe_registry *r, uint64_t handle) {
  pthread_mutex_lock(&r->mu);
  int i = pe_reg_prog_index(r, handle);
  bool ro = i >= 0 && !r->progs[i]->dead && r->progs[i]->read_only;
  pthread_mutex_unlock(&r->mu);
  return ro;
}

void pe_registry_release(pe_registry *r, pe_srv_program *p) {
  if (!p) return;
  pe_srv_program *fp;
  pe_srv_model *fm;
  pthread_mutex_lock(&r->mu);
  p->refs--;
  pe_reg_prog_maybe_unlink(r, p, &fp, &fm);
  pthread_mutex_unlock(&r->mu);
  pe_reg_destroy_later(fp, fm);
}

/* Remove client from p's owners; marks p dead when none are left (lock held). */
void pe_reg_drop_owner_locked(pe_srv_program *p, uint64_t client) {
  for (int i = 0; i < p->n_owners; i++)
    if (p->owners[i] == client) {
      p->owners[i] = p->owners[--p->n_owners];
      break;
    }
  if (p->n_owners == 0) p->dead = true;
}

/* The error for a client that is not among p's owners (lock held): names
 * the program, its model, how many clients own it and what dropping it
 * would do to them. */
static pe_status *not_owner_locked(pe_registry *r, const pe_srv_program *p) {
  double now = pe_now_s(), idle = -1;
  for (int i = 0; i < r->n_sessions; i++)
    for (int k = 0; k < p->n_owners; k++)
      if (r->sessions[i].client == p->owners[k] &&
          (idle < 0 || now - r->sessions[i].last_seen < idle))
        idle = now - r->sessions[i].last_seen;
  bool last_user = !p->model->persistent && p->model->n_programs == 1;
  return pe_error(
      PE_EPERM,
      "program 0x%016llx (model '%s') belongs to %d other client(s) (last request %.0f s "
      "ago); only they can deregister it, and it goes when their sessions end. "
      "Dropping it would fail their runs%s; to drop it anyway: pe-client deregister "
      "--force --handle 0x%016llx",
      (unsigned long long)p->handle, p->model->name, p->n_owners, idle < 0 ? 0 : idle,
      last_user ? " and free the model's values (not persistent)" : "",
      (unsigned long long)p->handle);
}

pe_status *pe_registry_deregister(pe_registry *r, uint64_t client, uint64_t handle, bool force) {
  pe_srv_program *p;
  PE_TRY(pe_status_wrap(pe_registry_acquire(r, handle, &p), "deregister"));
  pe_status *st = NULL;
  pthread_mutex_lock(&r->mu);
  bool owner = false;
  for (int i = 0; i < p->n_owners; i++) owner |= p->owners[i] == client;
  if (owner) {
    pe_reg_drop_owner_locked(p, client);
  } else if (force) {
    PE_LOGW("client %s force-deregistered program 0x%016llx (model '%s') of %d other client(s)",
            pe_client_tag(client).s, (unsigned long long)handle, p->model->name, p->n_owners);
    p->dead = true;
  } else {
    st = not_owner_locked(r, p);
  }
  pthread_mutex_unlock(&r->mu);
  pe_registry_release(r, p);
  return st ? pe_status_wrap(st, "deregister") : NULL;
}
