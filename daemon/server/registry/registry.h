/* The registry: models (parameter namespaces), programs (compiled graphs
 * bound to a model, by content-hash handle) and client sessions.
 *
 *   model    one pe_model: places, seed, the names initialised so far, and
 *            whether it is persistent (survives its clients). A train and an
 *            eval program registered under one model name share it. A
 *            non-persistent model is freed with its last program.
 *   program  handle = 64-bit hash of (program bytes, model name, options):
 *            registering the same thing again returns the same handle (and
 *            adds the caller to its owners). Holds the main executor and the
 *            startup executor (Init), the feed and parameter declarations.
 *   session  client id -> last request time, requests in flight, process
 *            (registry/sessions.c). When a client has been idle longer than the TTL
 *            (no request in flight), or its local process has exited, it is
 *            removed from every program's owners; programs without owners
 *            are deregistered.
 *
 * Files: registry/internal.h lists them and holds the tables they share.
 *
 * Lifetime: handlers acquire a program (or model) for the duration of a
 * request; deregistering marks it dead and the last release frees it,
 * outside the registry lock (freeing waits for the engine).
 *
 * Thread-safety: every function locks the registry mutex; compiling and
 * binding happen outside it. */
#ifndef PE_SERVER_PROGRAMS_H
#define PE_SERVER_PROGRAMS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/strmap.h"
#include "engine/parallel/executor.h"
#include "engine/step_graph_key.h"
#include "server/checkpoint/file.h"
#include "server/places_trial.h"
#include "server/registry/model_shapes.h"
#include "server/server.h"
#include "service.pb-c.h"

/* What the model's checkpoint writes since the daemon started (the
 * model's ckpt_mu): written and failed counts, the newest written one
 * (name, pe_now_s() time, the pe_model_changes() count its values
 * correspond to) and the newest failure's message. Apart from those, the
 * restart checkpoint (the file a crash restarts from): when its values
 * became known (written by autosave or SIGTERM, or read: a
 * restore at register or a Load of it) and their change count, so status
 * can say what a crash would lose (a named save does not count). */
typedef struct pe_ckpt_record {
  uint64_t saved, failed;
  char last[PE_NAME_MAX + 1]; /* "": none */
  double last_time;
  uint64_t last_version;
  char last_error[320];
  bool restart_known, restart_read; /* read: restored or loaded, not written */
  double restart_time;
  uint64_t restart_version;
} pe_ckpt_record;

typedef struct pe_srv_model {
  char name[PE_NAME_MAX + 1];
  /* The restart checkpoint's name (config shutdown_checkpoint, a
   * restart-only key), copied at creation. */
  char restart_name[PE_NAME_MAX + 1];
  pe_model *m;
  pe_server *srv; /* its memory budget and limits */
  pe_place_kind kind;
  int n_places;
  /* Resident bytes charged to the daemon's memory budget (run/budget.h):
   * what the claims describe, on every place; written under the budget's
   * lock only. */
  int64_t charged_bytes;
  uint64_t seed;
  bool persistent;
  /* Registry lock: */
  int n_programs;
  /* The strategy of the model's first training program (on more than one
   * place), for the model's life: its optimizer state is laid out for it
   * (registry/register.c, claim_train_strategy_locked). */
  bool has_train_strategy;
  pe_graph_strategy train_strategy;
  /* How places = auto chose its places (server/places_trial.h; NULL: they
   * were named or the daemon's). Set before its first program is
   * published, never changed after; the model owns it. */
  pe_places_trial *trial;
  /* trial is kept beside the restart checkpoint (server/places_recall.h),
   * or came from there: written once a persistent program binds. */
  bool trial_kept;
  int refs; /* acquisitions by requests in progress */
  /* A drop (pe_registry_drop_model_begin) is under way: no register binds
   * to the model and no acquire finds it; unlinked: it has left the table
   * (its name is free) and goes with its last program or user. dropping is
   * atomic: a run reads it between its steps without the lock. */
  atomic_bool dropping;
  bool unlinked;
  /* Every persistable's dtype and shape (registry/model_shapes.h; own leaf lock). */
  pe_shape_claims shapes;
  /* Held around each checkpoint write's rename and around the drop's
   * removal of the restart checkpoint; after the drop, saves_closed refuses
   * every write, so a save in flight cannot bring the file back. */
  pthread_mutex_t save_mu;
  bool saves_closed;
  /* init_mu (recursive) orders Init / Load / SetParams bookkeeping of
   * `initialized` and restart_seen. */
  pthread_mutex_t init_mu;
  pe_strmap initialized; /* persistable names with a value (values unused) */
  /* A register dealt with the restart checkpoint (restored it or found
   * none), or a Load read it: the model's values come from it or there was
   * none, and it is never read again (checkpoint/save_load.h). */
  bool restart_seen;
  pthread_mutex_t ckpt_mu; /* guards ckpt (held for a copy, never across I/O) */
  pe_ckpt_record ckpt;
  /* The job across nodes the model trains in (server/job/job.h), or NULL;
   * under init_mu. */
  struct pe_srv_job *job;
} pe_srv_model;

/* Note a checkpoint write of m (pe_checkpoint_save): written as `name`
 * with values of change count `version`, or failed with st. */
void pe_srv_model_note_save(pe_srv_model *m, const char *name, uint64_t version,
                            const pe_status *st);
/* Note that m's values are its restart checkpoint's, read now (a restore
 * or a Load of it), at change count `version`. */
void pe_srv_model_note_restart_read(pe_srv_model *m, uint64_t version);

typedef struct pe_srv_program {
  uint64_t handle;
  pe_srv_model *model;
  pe_par_exec *exec;
  pe_par_exec *startup; /* NULL: the program has no startup block */
  pe_sync_strategy sync;
  pe_cuda_graph_mode cuda_graph; /* options.cuda_graph, else the daemon's */
  pe_graph_strategy strategy;    /* as compiled: options.strategy, AUTO resolved */
  bool for_test;
  bool in_job; /* compiled for a job across nodes (options.job): runs need the job */
  /* Its main graph changes no persistable (no optimizer, no state update;
   * a test-mode batch norm's running statistics, written onto themselves,
   * are no change: pe_graph_node_updates_persistable): a run of it may take
   * a work thread (lanes.h). */
  bool read_only;
  int n_params; /* persistables of the program (main + startup blocks) */
  pe_var_info *params;
  int n_feeds; /* is_feed variables of the main block */
  pe_var_info *feeds;
  /* Temporaries the executor keeps between runs, resident in the daemon's
   * budget (run/memory.c); written under the budget's lock only. */
  int64_t kept_bytes;
  uint8_t *key; /* hash material, to tell a collision from a match */
  size_t key_len;
  /* Registry lock: */
  uint64_t *owners;
  int n_owners, cap_owners;
  int refs;
  /* Written under the registry lock; atomic: a run reads it between its
   * steps without the lock (run/cancel.h). */
  atomic_bool dead;
} pe_srv_program;

pe_status *pe_registry_new(pe_server *s, pe_registry **out);
/* Frees everything (programs, then models); no request may be in progress. */
void pe_registry_free(pe_registry *r);

/* Register (see above). *out is acquired (release it). */
pe_status *pe_registry_register(pe_registry *r, uint64_t client, const Pe__RegisterRequest *rq,
                                pe_srv_program **out, bool *existed);
pe_status *pe_registry_acquire(pe_registry *r, uint64_t handle, pe_srv_program **out);
/* Whether handle is a live program that is read_only (false: not found). */
bool pe_registry_read_only(pe_registry *r, uint64_t handle);
void pe_registry_release(pe_registry *r, pe_srv_program *p);
/* Remove client from the program's owners; the program goes with its last
 * owner. A client that is not an owner is refused (PE_EPERM: handles are
 * content hashes anyone can compute, so holding one proves nothing, and
 * dropping another trainer's program fails its runs and may free its
 * model) unless force is set (an operator's `pe-client deregister
 * --force`), which drops the program for every owner. */
pe_status *pe_registry_deregister(pe_registry *r, uint64_t client, uint64_t handle, bool force);

pe_status *pe_registry_model_acquire(pe_registry *r, const char *name, pe_srv_model **out);
void pe_registry_model_release(pe_registry *r, pe_srv_model *m);

/* Whether the n values fit the model's persistables (the dtype and shape
 * claimed by a program's declaration or an earlier value: registry/model_shapes.h),
 * claiming the names not claimed yet: checked for every value before a
 * SetParams or Load sets any, so a bad request changes nothing. */
pe_status *pe_srv_model_claim_values(pe_srv_model *m, const char *const *names,
                                     const pe_tensor *values, int n);

/* Whether anything of the model has a value yet (Init, Load, SetParams or
 * a restore marked it); under init_mu, which a restore holds while it
 * loads. The set never shrinks, so the answer stays true once true. A
 * model without values must not be checkpointed under the restart name:
 * that would replace the file it is about to restore. */
bool pe_srv_model_has_values(pe_srv_model *m);

/* Mark names initialised (after Init, SetParams, Load). */
void pe_model_mark_initialized(pe_srv_model *m, const char *const *names, int n);

/* The live programs of m that clients other than `client` own (other
 * trainers of the model), as PE_EPERM "<op>: model 'm' is in use by
 * program 0x... of client ..., ...; <way_out>" (at most 4 named); NULL
 * when there are none. Drop refuses such a model; a forced Init too,
 * unless overridden (dispatch.c). */
pe_status *pe_registry_model_in_use(pe_registry *r, const pe_srv_model *m, uint64_t client,
                                    const char *op, const char *way_out);

/* Dropping a model (server/registry/model_drop.h), the registry's part. begin:
 * refused, naming the programs and their clients, while a live program of
 * another client is bound to the model; else the caller's own programs of
 * it are deregistered (*programs counts them), the model stops being
 * persistent, is marked dropping and acquired into *out. No model of that
 * name: *out = NULL, and absent(arg) runs under the registry lock, so no
 * register creates the model meanwhile. end: the model leaves the table
 * (its name is free again) and is released; it is freed once its last
 * program or user has gone. */
pe_status *pe_registry_drop_begin(pe_registry *r, uint64_t client, const char *name,
                                  pe_status *(*absent)(void *arg), void *arg, pe_srv_model **out,
                                  int *programs);
void pe_registry_drop_end(pe_registry *r, pe_srv_model *m);

/* Sessions. */
/* A request of client starts / ends (opens the session when there is none).
 * pid, start: the client's process (Request.client_pid, client_start; 0:
 * unknown), which the sweep checks. */
void pe_registry_request_begin(pe_registry *r, uint64_t client, long pid, uint64_t start,
                               double now);
void pe_registry_request_end(pe_registry *r, uint64_t client, long pid, uint64_t start, double now);
/* The periodic sweep: ends the sessions idle (no request in flight) for
 * more than ttl_s (0: never) and those whose client process has exited
 * (pid gone or started at another time), as a close would; fills up to max
 * ids; returns the number ended. */
int pe_registry_expire(pe_registry *r, double now, double ttl_s, uint64_t *ids, int max);
/* Drop a client's session and programs now; returns how many programs it
 * owned (each freed when no other client owns it either). */
int pe_registry_drop_client(pe_registry *r, uint64_t client);

/* Status snapshot (malloc'd arrays; caller frees with pe_registry_snapshot_free). */
typedef struct pe_model_snapshot {
  char name[PE_NAME_MAX + 1];
  int programs;
  int64_t param_bytes;
  bool persistent;
  pe_place_kind kind;
  int n_places;
  pe_ckpt_record ckpt;
  char restart_name[PE_NAME_MAX + 1];
  uint64_t changes; /* pe_model_changes() at the snapshot */
  bool has_trial;
  pe_places_trial trial; /* places = auto's choice, when has_trial */
} pe_model_snapshot;
/* with_bytes: fill param_bytes (the claims' bytes: registry/model_shapes.h; no value is read). */
void pe_registry_snapshot(pe_registry *r, bool with_bytes, pe_model_snapshot **models,
                          int *n_models, int *n_programs, int *n_clients);

/* Bytes of the models in which client owns a program. */
int64_t pe_registry_client_bytes(pe_registry *r, uint64_t client);

/* Names of persistent models (malloc'd array of malloc'd strings). */
void pe_registry_persistent_models(pe_registry *r, char ***names, int *n);

#endif
