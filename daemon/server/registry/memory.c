/* The registry's memory accounting: a client's parameter bytes against
 * [limits] memory_per_client, and a model's persistables charged to the
 * daemon's memory budget ([limits] memory_total, run/budget.h). */
#include <stdio.h>

#include "server/client_tag.h"
#include "server/registry/internal.h"

/* Whether client owns a live program of m (lock held). */
static bool client_uses_locked(pe_registry *r, const pe_srv_model *m, uint64_t client) {
  for (int j = 0; j < r->n_progs; j++)
    if (r->progs[j]->model == m && !r->progs[j]->dead)
      for (int k = 0; k < r->progs[j]->n_owners; k++)
        if (r->progs[j]->owners[k] == client) return true;
  return false;
}

/* Parameter bytes of m, with the persistables of items (n; may be 0)
 * that it has not claimed yet: what its claims describe (registry/model_shapes.h),
 * so a registered program's persistables count before its Init. Every
 * value has its claim's shape, so values count too, without reading them
 * (an engine read would wait for the model's runs under the registry
 * lock); a claim with a -1 dim counts 0. */
int64_t pe_reg_model_bytes_locked(pe_srv_model *m, const pe_var_info *items, int n) {
  return pe_shape_claims_bytes(&m->shapes, items, n, NULL);
}

/* Bytes of the models in which client owns a program (lock held). */
static int64_t client_bytes_locked(pe_registry *r, uint64_t client) {
  int64_t total = 0;
  for (int i = 0; i < r->n_models; i++)
    if (client_uses_locked(r, r->models[i], client))
      total = pe_bytes_add(total, pe_reg_model_bytes_locked(r->models[i], NULL, 0));
  return total;
}

/* memory_per_client (limit > 0): what the client holds once program p
 * binds to model m (NULL: a new model, holding p's persistables) must
 * stay within the limit. p's persistables the model has (an eval program
 * of a trained model) and a model the client holds already are not counted
 * twice; a program that adds nothing is never refused (lock held). */
pe_status *pe_reg_check_memory_locked(pe_registry *r, uint64_t client, const char *model,
                                      pe_srv_model *m, const pe_srv_program *p, int64_t limit) {
  int64_t used = client_bytes_locked(r, client), prog = 0;
  for (int i = 0; i < p->n_params; i++) prog = pe_bytes_add(prog, pe_var_info_bytes(&p->params[i]));
  int64_t before =
      m && client_uses_locked(r, m, client) ? pe_reg_model_bytes_locked(m, NULL, 0) : 0;
  int64_t after = m ? pe_reg_model_bytes_locked(m, p->params, p->n_params) : prog;
  int64_t grows = after - before;
  if (grows <= 0 || grows <= limit - used) return NULL; /* limit - used: no overflow */
  return pe_error(PE_ENOMEM,
                  "register: model '%s': client %s holds %lld parameter bytes, and with this "
                  "program (persistables of %lld bytes) it would hold %lld, over the limit "
                  "memory_per_client = %lld",
                  model, pe_client_tag(client).s, (long long)used, (long long)prog,
                  (long long)pe_bytes_add(used, grows), (long long)limit);
}

int64_t pe_registry_client_bytes(pe_registry *r, uint64_t client) {
  pthread_mutex_lock(&r->mu);
  int64_t b = client_bytes_locked(r, client);
  pthread_mutex_unlock(&r->mu);
  return b;
}

/* --- the daemon's memory budget ------------------------------------------- */
/* The resident bytes of persistables of `claims` bytes: a copy on every
 * place (the optimizer state of Reduce and Sharded lives on one: a bound). */
static int64_t on_places(int64_t claims, int n_places) {
  return n_places > 0 && claims > INT64_MAX / n_places ? INT64_MAX : claims * n_places;
}

/* "1.8 MiB", "100.0 GiB": a byte count for a reader, next to the exact one. */
static const char *mib_gib(int64_t bytes, char *buf, size_t len) {
  if (bytes >= (int64_t)1 << 30)
    snprintf(buf, len, "%.1f GiB", bytes / 1073741824.0);
  else
    snprintf(buf, len, "%.1f MiB", bytes / 1048576.0);
  return buf;
}

/* Charge m's persistables, with those of items (n) not claimed yet, to the
 * daemon's memory budget ([limits] memory_total, run/budget.h) before any
 * of them is allocated. NULL when they fit (or nothing is new); else
 * PE_ENOMEM naming the model, the new bytes, the largest new variable with
 * its shape and bytes, the budget and what is left of it. */
pe_status *pe_reg_charge_model(pe_srv_model *m, const pe_var_info *items, int n, int64_t total) {
  int64_t added, resident, reserved;
  int64_t want = on_places(pe_shape_claims_bytes(&m->shapes, items, n, &added), m->n_places);
  if (pe_run_budget_hold(&m->srv->run_budget, &m->charged_bytes, want, total, &resident, &reserved))
    return NULL;
  int n_new = 0, big = pe_shape_claims_largest_new(&m->shapes, items, n, &n_new);
  char largest[128 + PE_SHAPE_STRLEN + 96] = "";
  if (big >= 0) {
    char shape[PE_SHAPE_STRLEN];
    pe_shape_str(&items[big].shape, shape, sizeof shape);
    snprintf(largest, sizeof largest, "; the largest, '%.128s', is %s %s: %lld bytes",
             items[big].name, pe_dtype_name(items[big].dtype), shape,
             (long long)pe_var_info_bytes(&items[big]));
  }
  int64_t left = total - resident - reserved;
  char a[32], t[32];
  return pe_error(PE_ENOMEM,
                  "model '%s': %d new persistable(s) of %lld bytes (%s; on %s:%d, %lld) do not "
                  "fit the daemon's memory budget [limits] memory_total = %lld bytes (%s): %lld "
                  "are left (%lld resident: models' persistables and kept temporaries; %lld "
                  "reserved by runs in flight)%s",
                  m->name, n_new, (long long)added, mib_gib(added, a, sizeof a),
                  pe_place_kind_name(m->kind), m->n_places,
                  (long long)on_places(added, m->n_places), (long long)total,
                  mib_gib(total, t, sizeof t), (long long)(left > 0 ? left : 0),
                  (long long)resident, (long long)reserved, largest);
}

/* After a refused register or value set: m's charge back to what its
 * claims describe, giving back what was charged for names it did not
 * claim. A charge of another request for names it has not claimed yet is
 * given back too: that request's own charge of a later name charges it
 * again. */
void pe_reg_charge_to_claims(pe_srv_model *m) {
  int64_t want = on_places(pe_shape_claims_bytes(&m->shapes, NULL, 0, NULL), m->n_places);
  pe_run_budget_set(&m->srv->run_budget, &m->charged_bytes, want);
}
