/* Internals shared by par_runtime.c, par_model.c and the executor files
 * (par_executor.c, par_collective.c): the runtime and model structs. Not a
 * public interface. */
#ifndef PE_ENGINE_PAR_INTERNAL_H
#define PE_ENGINE_PAR_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/strmap.h"
#include "engine/collective.h"
#include "engine/par_executor.h"

struct pe_runtime {
  int cores;
  bool keep_denormals;    /* pe_runtime_opts.keep_denormals; read-only after new */
  bool sim_device_memory; /* pe_runtime_opts.sim_device_memory; read-only after new */
  pe_pool *pool;
  pe_engine *eng;
  pe_device_ctx worker_ctx; /* default intra-op budget bound by pool workers */
  bool worker_ctx_init;
  pthread_mutex_t dev_mu; /* guards dev[][] (opened lazily) */
  pe_device *dev[PE_PLACE_KINDS][PE_MAX_PLACES];
  /* Held while every part of one collective is launched on the places' comm
   * streams: the devices (and so the comm streams) are shared by all models,
   * so parts of different collectives must be queued in one global order on
   * every comm stream, else their rendezvous deadlock. */
  pthread_mutex_t coll_mu;
};

/* One persistable name of a model: its variable and its engine variable on
 * every place. One engine variable per place (not per name): the replicas
 * are independent storage, so the optimizers (or batch-norm statistics) of
 * different places do not serialise on each other; a broadcast mutates the
 * replicas it writes. Created once, never removed before the model is
 * freed, so executors keep pointers to it (and to v[p]->t). */
typedef struct par_entry {
  const char *name; /* == v[0]->name */
  pe_engine_var *ev[PE_MAX_PLACES];
  pe_var *v[PE_MAX_PLACES];
} par_entry;

struct pe_model {
  pe_runtime *rt;
  pe_place_kind kind;
  int n_places;
  uint64_t seed;
  pe_device *dev[PE_MAX_PLACES];
  pe_scope *scope[PE_MAX_PLACES];
  pthread_mutex_t mu; /* guards index, entries (the table, not the values) */
  pe_strmap index;    /* name -> par_entry* */
  par_entry **ent;
  int n_ent, cap_ent;
  pe_engine_var *prng; /* ordering of every random op of the model's graphs */
  pe_comm *comm;       /* sim collectives: one rank per place */
  /* cuda with more than one place: the NCCL communicator over the places'
   * GPUs (rank p = place p; cuda/nccl_comm.h), else NULL. nccl_mu: one
   * pe_nccl_wait at a time (runs of several executors end concurrently). */
  struct pe_nccl_comm *nccl;
  pthread_mutex_t nccl_mu;
  atomic_uint_fast64_t coll_seq; /* op ids of sim collectives */
};

/* The entry of `name`, created on every place (empty) when absent. */
pe_status *par_model_entry(pe_model *m, const char *name, par_entry **out);

#endif
