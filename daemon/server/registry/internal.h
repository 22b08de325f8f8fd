/* The registry's tables and the helpers its parts share. Private to them:
 *   registry.c  the tables: create, free, look up, unlink
 *   register.c  registering a program (compile.c: its compile)
 *   programs.c  acquire, release, owners, deregister
 *   models.c    acquire, release, values, checkpoint records
 *   memory.c    memory_per_client and the daemon's memory budget
 *   drop.c      dropping a model, the registry's part
 *   snapshot.c  views for Status and the autosave
 *   sessions.c  client sessions
 *
 * Thread-safety: everything here is guarded by pe_registry.mu; the
 * "_locked" helpers expect it held, pe_reg_destroy_later must run without
 * it (freeing waits for the engine). */
#ifndef PE_SERVER_REGISTRY_INTERNAL_H
#define PE_SERVER_REGISTRY_INTERNAL_H

#include "server/registry/registry.h"

/* A client's session: open from its first request to its close, its
 * expiry (ttl_s idle: no request in flight, none for ttl_s), or the sweep
 * that finds its process gone (pid, start: Request.client_pid/_start). */
typedef struct session {
  uint64_t client;
  double last_seen; /* the last request's start or end */
  int in_flight;    /* its requests being handled: it is not idle meanwhile */
  long pid;         /* 0: unknown (an older client, or not on this machine) */
  uint64_t start;
} session;

struct pe_registry {
  pe_server *s;
  pthread_mutex_t mu;
  /* Small tables, scanned linearly: a daemon holds tens of programs and
   * models, and every scan is one request's worth of work at most. */
  pe_srv_program **progs;
  int n_progs, cap_progs;
  pe_srv_model **models;
  int n_models, cap_models;
  session *sessions;
  int n_sessions, cap_sessions;
};

/* Grow *arr (elements of elem bytes) to hold need; false: no memory. */
bool pe_reg_grow(void **arr, int *cap, int need, size_t elem);
/* Frees executors; must not hold the registry lock (waits for the engine). */
void pe_reg_program_destroy(pe_srv_program *p);
/* Lookups (lock held): the program's index (-1: none), the model (NULL: none). */
int pe_reg_prog_index(pe_registry *r, uint64_t handle);
pe_srv_model *pe_reg_model_find(pe_registry *r, const char *name);
/* A model without programs, users or persistence goes; returns it to free
 * outside the lock, or NULL. */
pe_srv_model *pe_reg_model_maybe_unlink(pe_registry *r, pe_srv_model *m);
/* Remove client from p's owners; marks p dead when none are left. */
void pe_reg_drop_owner_locked(pe_srv_program *p, uint64_t client);
/* Unlink a dead program without users; what to free (program, and maybe
 * its model) outside the lock. */
void pe_reg_prog_maybe_unlink(pe_registry *r, pe_srv_program *p, pe_srv_program **free_p,
                              pe_srv_model **free_m);
void pe_reg_destroy_later(pe_srv_program *p, pe_srv_model *m);

/* Memory (lock held where named so). Parameter bytes of m, with the
 * persistables of items (n; may be 0) it has not claimed yet. */
int64_t pe_reg_model_bytes_locked(pe_srv_model *m, const pe_var_info *items, int n);
/* memory_per_client (limit > 0): what client holds once p binds to model
 * m (NULL: a new model) stays within limit. */
pe_status *pe_reg_check_memory_locked(pe_registry *r, uint64_t client, const char *model,
                                      pe_srv_model *m, const pe_srv_program *p, int64_t limit);
/* Charge m's persistables, with those of items not claimed yet, to the
 * daemon's memory budget (total: [limits] memory_total); PE_ENOMEM when
 * they do not fit. */
pe_status *pe_reg_charge_model(pe_srv_model *m, const pe_var_info *items, int n, int64_t total);
/* m's charge back to what its claims describe (after a refusal). */
void pe_reg_charge_to_claims(pe_srv_model *m);
/* registry/compile.c: decode rq's program, apply its options, compile it
 * for (kind, n_places); fills *main_g, *startup_g and p's strategy, params
 * and feeds. Without the registry lock (it reads s->stopping only). */
pe_status *pe_reg_compile(pe_server *s, const Pe__RegisterRequest *rq, const pe_limits *lim,
                          pe_place_kind kind, int n_places, pe_graph **main_g, pe_graph **startup_g,
                          pe_srv_program *p);

#endif
