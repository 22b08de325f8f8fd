/* Internals shared by parallel/runtime.c, parallel/model.c and the executor files
 * (parallel/executor.c, parallel/collective_nodes.c): the runtime and model structs. Not a
 * public interface. */
#ifndef PE_ENGINE_PAR_INTERNAL_H
#define PE_ENGINE_PAR_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/rng.h"
#include "core/strmap.h"
#include "engine/collective.h"
#include "engine/parallel/executor.h"

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

/* Write fence of one replica on an asynchronous place. An op node that
 * updates a persistable releases its engine variable once its kernel is
 * launched, not when it ran, so the replica's newest value may still be in
 * flight on the writer's stream: `s` is that stream and `ev` an event of the
 * replica's device recorded right after the write (s == NULL: no write
 * queued yet; ev == NULL on host places). Written by the writer while it
 * holds the replica's engine variable exclusively; read by holders of the
 * variable: stream readers on another stream wait for it
 * (par_fence_wait), host readers sync it (par_fence_sync). On sim (whose
 * kernels set output metadata when they run, on the stream thread) writes
 * that change a replica's storage (a first write allocates it) still
 * complete before they release the variable, and so do collective writers,
 * so metadata (dtype, shape, data pointer) the host reads never changes
 * under it; on cuda an op's fn set them before its launch returned. */
typedef struct par_fence {
  pe_event *ev;
  pe_stream *s;
} par_fence;

/* Wait on the host until f's write ran. */
pe_status *par_fence_sync(const par_fence *f);
/* Record f right after a write queued on s (a stream of f's device). */
pe_status *par_fence_record(par_fence *f, pe_stream *s);

/* One persistable name of a model: its variable and its engine variable on
 * every place. One engine variable per place (not per name): the replicas
 * are independent storage, so the optimizers (or batch-norm statistics) of
 * different places do not serialise on each other; a broadcast mutates the
 * replicas it writes. Created once, never removed before the model is
 * freed, so executors keep pointers to it (and to v[p]->t). */
typedef struct par_entry {
  const char *name; /* == v[0]->name */
  /* The place whose value is the model's (pe_model_get*, checkpoints): 0,
   * or the one place a bound graph updates the name on (Reduce: the
   * optimizer state of a parameter lives with its owner; the other
   * replicas keep their startup values). Set by par_claim_homes (parallel/homes.c)
   * (under the model's mu, with home_claimed), never unset; read without
   * the lock (fetches). */
  atomic_int home;
  bool home_claimed;
  pe_engine_var *ev[PE_MAX_PLACES];
  pe_var *v[PE_MAX_PLACES];
  par_fence fence[PE_MAX_PLACES];
} par_entry;

struct pe_model {
  pe_runtime *rt;
  pe_place_kind kind;
  int n_places;
  uint64_t seed;
  pe_device *dev[PE_MAX_PLACES];
  pe_scope *scope[PE_MAX_PLACES];
  pthread_mutex_t mu; /* guards index, entries (the table, not the values) */
  /* Held while a run pushes its engine ops, and while pe_model_get_many /
   * set_many (parallel/model_io.c) push theirs: no such op lands between two of
   * a run's, so it sees every persistable at the same step boundary.
   * Pushing never waits, so it is held for microseconds. changes counts
   * the pushed runs that write persistables and the sets (under push_mu;
   * read without it). */
  pthread_mutex_t push_mu;
  atomic_uint_fast64_t changes;
  /* Under push_mu: per client, its newest run (pe_run_origin), ordered by
   * last update (oldest first); at most PE_MODEL_ORIGINS. */
  pe_run_origin *origins;
  int n_origins, cap_origins;
  pe_strmap index; /* name -> par_entry* */
  par_entry **ent;
  int n_ent, cap_ent;
  /* The model's generator: every random op of every graph of the model
   * (startup included) draws its counters from it, in the order the prng
   * engine variable gives (each such op mutates it). Its offset is the
   * model's whole random state; snapshots and checkpoints carry it
   * (pe_model_mark). */
  pe_rng rng;
  pe_engine_var *prng;
  pe_comm *comm; /* sim collectives: one rank per place */
  /* More than one place of a kind with device collectives (cuda: NCCL): the
   * communicator over the places' devices (rank p = place p;
   * engine/device_comm.h), else NULL. dcomm_mu: one pe_device_comm_wait at
   * a time (runs of several executors end concurrently). */
  struct pe_device_comm *dcomm;
  pthread_mutex_t dcomm_mu;
  atomic_uint_fast64_t coll_seq; /* op ids of sim collectives */
  /* The job's communicator across nodes (engine/node_comm.h), or NULL: the
   * daemon's, set while no run of the model's graphs is in flight.
   * ncomm_dev: on places whose backend sums across nodes on the devices
   * (cuda: NCCL over the nodes' lead GPUs), the gradients' communicator
   * (device buffers), or NULL; ncomm then only sums host values (the
   * step's rows). Set like ncomm. */
  const struct pe_node_comm *ncomm;
  const struct pe_node_comm *ncomm_dev;
};

/* parallel/collective_device.c (m->dcomm set): wait for the places' comm
 * streams while polling the backend's asynchronous errors, with a time
 * limit (pe_device_comm_wait, which aborts the communicator on an error or
 * timeout). */
pe_status *par_model_dcomm_finish(pe_model *m);

/* Around a run's engine pushes (parallel/model_io.c): takes push_mu; a run that
 * writes persistables is a change, recorded with its origin o (client 0:
 * none). */
void par_model_push_begin(pe_model *m, bool writes, const pe_run_origin *o);
void par_model_push_end(pe_model *m);

/* The entry of `name`, created on every place (empty) when absent. */
pe_status *par_model_entry(pe_model *m, const char *name, par_entry **out);

#endif
