/* A job across nodes (docs/multinode.md): the daemons of several machines
 * train one model data-parallel. Each node's trainer registers the same
 * program with its own daemon and a job spec (proto JobSpec); the daemon
 * forms the job with the others' daemons at register:
 *  - rendezvous: a Gloo communicator (daemon/net/gloo_comm.h); rank 0's
 *    daemon serves the store, the job's token admits the others;
 *  - signatures: every node publishes its program's hash, its places'
 *    kind and its persistables' names, dtypes and shapes; a node that
 *    differs from rank
 *    0 fails the formation on every node, the error naming the node and the
 *    variable;
 *  - values: when rank 0's model has values (a checkpoint it loaded or
 *    restored), every node takes them and rank 0's generator offset
 *    (broadcast), whatever its own checkpoint held; after an init, the
 *    values of rank 0's init.
 * The job then lends its communicator to the model (engine/node_comm.h):
 * the training graph sums its gradients over the nodes.
 *
 * On places whose backend has a communicator across nodes (cuda: NCCL
 * over the nodes' lead GPUs, engine/node_comm.h's pe_node_comm_backend),
 * rank 0's daemon makes the backend's id before the rendezvous, the store
 * hands it to every node (pe_gloo_shared), and every node opens the
 * backend's communicator after the signatures agreed (blocking up to the
 * timeout; the error names the rank and its GPU). The model's gradients
 * are summed over it (pe_srv_job_dcomm), the step's rows and the value
 * broadcasts over Gloo. A failure of either breaks both; the job closes
 * the backend's communicator when it is freed.
 *
 * A failed exchange breaks the job (the peers are told by the connections
 * closing); a register with the job spec forms it again.
 *
 * Threading: a job belongs to one model; formation, the value broadcasts
 * and the swap of a broken job run under the model's init_mu; the
 * exchanges of a run on the executor's cross-node thread (one at a time). */
#ifndef PE_SERVER_JOB_JOB_H
#define PE_SERVER_JOB_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "engine/node_comm.h"
#include "engine/parallel/executor.h"
#include "server/registry/model_shapes.h"
#include "service.pb-c.h"

typedef struct pe_srv_job pe_srv_job;

/* What a node publishes at rendezvous. */
typedef struct pe_srv_job_self {
  uint64_t program_hash;   /* the program's bytes (not its options: they name the rank) */
  bool has_values;         /* the model has a value for every persistable */
  const pe_var_info *vars; /* the program's persistables */
  int n_vars;
  const char *host; /* the address the links listen on; NULL or "": the hostname's */
  int timeout_ms;   /* rendezvous and each exchange; > 0 */
  /* The model's places have a backend communicator across nodes: opened on
   * devs[0..n_places) (place p is devs[p]); NULL: cpu places. */
  const pe_node_comm_backend *backend;
  pe_device *const *devs;
  int n_places;
  pe_place_kind kind; /* the model's places: every node of a job has one kind */
} pe_srv_job_self;

/* The spec checked (name, world >= 2, rank < world, rendezvous, token). */
pe_status *pe_srv_job_spec_check(const Pe__JobSpec *spec);

/* Forms the job: blocks until every node joined and the signatures
 * agree, or fails (naming the node and the variable that differ, or the
 * peer that did not come). */
pe_status *pe_srv_job_form(const Pe__JobSpec *spec, const pe_srv_job_self *self, pe_srv_job **out);

/* Whether j is the job spec names, on the same rank. */
bool pe_srv_job_is(const pe_srv_job *j, const Pe__JobSpec *spec);
/* Whether an exchange failed (the job must be formed again). */
bool pe_srv_job_broken(const pe_srv_job *j);
/* Whether rank 0 had values for every persistable at formation. */
bool pe_srv_job_root_has_values(const pe_srv_job *j);
const pe_node_comm *pe_srv_job_comm(pe_srv_job *j);
/* The backend's communicator (the gradients' on device places), or NULL
 * when the job has none (cpu places). */
const pe_node_comm *pe_srv_job_dcomm(pe_srv_job *j);

/* Every node takes rank 0's values of vars (the model's persistables, as
 * one snapshot) and its random generator's offset; a collective: every
 * node calls it with the same vars. */
pe_status *pe_srv_job_broadcast_values(pe_srv_job *j, pe_model *m, const pe_var_info *vars, int n);

void pe_srv_job_free(pe_srv_job *j);

#endif
