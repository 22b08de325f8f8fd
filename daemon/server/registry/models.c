/* Models of the registry: acquiring and releasing them for a request, the
 * values they hold (claims and initialised names) and the record of their
 * checkpoints. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/log.h"
#include "server/registry/internal.h"

pe_status *pe_registry_model_acquire(pe_registry *r, const char *name, pe_srv_model **out) {
  PE_TRY(pe_name_check("model name", name));
  pthread_mutex_lock(&r->mu);
  pe_srv_model *m = pe_reg_model_find(r, name);
  bool dropping = m && m->dropping;
  if (dropping) m = NULL;
  if (m) m->refs++;
  pthread_mutex_unlock(&r->mu);
  *out = m;
  if (!m)
    return pe_error(
        PE_ENOTFOUND, "model '%s': %s", name,
        dropping ? "being dropped" : "no such model (register a program under it first)");
  return NULL;
}

void pe_registry_model_release(pe_registry *r, pe_srv_model *m) {
  if (!m) return;
  pthread_mutex_lock(&r->mu);
  m->refs--;
  pe_srv_model *fm = pe_reg_model_maybe_unlink(r, m);
  pthread_mutex_unlock(&r->mu);
  pe_reg_destroy_later(NULL, fm);
}

pe_status *pe_srv_model_claim_values(pe_srv_model *m, const char *const *names,
                                     const pe_tensor *values, int n) {
  pe_var_info *items = calloc(n ? (size_t)n : 1, sizeof *items);
  if (!items)
    return pe_error(PE_ENOMEM, "model '%s': out of memory checking %d values", m->name, n);
  for (int i = 0; i < n; i++)
    items[i] = (pe_var_info){(char *)names[i], values[i].dtype, values[i].shape};
  pe_status *st = pe_reg_charge_model(m, items, n, pe_server_limits(m->srv).memory_total);
  if (!st) {
    st = pe_shape_claims_check(&m->shapes, m->name, items, n, PE_FIT_VALUE, true);
    if (st) pe_reg_charge_to_claims(m);
  }
  free(items);
  return st;
}

bool pe_srv_model_has_values(pe_srv_model *m) {
  pthread_mutex_lock(&m->init_mu);
  bool any = m->initialized.len > 0;
  pthread_mutex_unlock(&m->init_mu);
  return any;
}

void pe_model_mark_initialized(pe_srv_model *m, const char *const *names, int n) {
  pthread_mutex_lock(&m->init_mu);
  for (int i = 0; i < n; i++)
    if (!pe_strmap_put(&m->initialized, names[i], (void *)1))
      PE_LOGW("model '%s': out of memory marking '%s' initialised", m->name, names[i]);
  pthread_mutex_unlock(&m->init_mu);
}

void pe_srv_model_note_save(pe_srv_model *m, const char *name, uint64_t version,
                            const pe_status *st) {
  pthread_mutex_lock(&m->ckpt_mu);
  pe_ckpt_record *c = &m->ckpt;
  if (st) {
    c->failed++;
    snprintf(c->last_error, sizeof c->last_error, "%s", pe_status_msg(st));
  } else {
    c->saved++;
    snprintf(c->last, sizeof c->last, "%s", name);
    c->last_time = pe_now_s();
    c->last_version = version;
    if (!strcmp(name, m->restart_name)) {
      c->restart_known = true;
      c->restart_read = false;
      c->restart_time = c->last_time;
      c->restart_version = version;
    }
  }
  pthread_mutex_unlock(&m->ckpt_mu);
}

void pe_srv_model_note_restart_read(pe_srv_model *m, uint64_t version) {
  pthread_mutex_lock(&m->ckpt_mu);
  pe_ckpt_record *c = &m->ckpt;
  c->restart_known = true;
  c->restart_read = true;
  c->restart_time = pe_now_s();
  c->restart_version = version;
  pthread_mutex_unlock(&m->ckpt_mu);
}
