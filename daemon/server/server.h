/* pe-executord: the server object every request handler sees.
 *
 * Threads:
 *   main thread     the libev loop: receives from the nanomsg raw REP socket
 *                   (NN_RCVFD), queues requests, sends replies (NN_SNDFD when
 *                   the socket pushes back), signals, timers (session TTL,
 *                   watchdog, status), shutdown.
 *   request threads (plain pthreads, NOT pool workers: runs block) decode,
 *                   deduplicate, dispatch and encode; replies go back to
 *                   the main thread through ev_async. Three lanes
 *                   (lanes.h), each its own queue and threads: run,
 *                   work and control requests.
 *   compute pool    the runtime's workers; only the executor uses them.
 *   autosave        checkpoints persistent models every checkpoint_interval
 *                   (server/checkpoint/autosave.h); joined before the shutdown checkpoint.
 *
 * Ownership: pe_server owns the runtime, the registry, the shm table and the
 * dedup cache; pe_server_free releases them in that reverse order after the
 * request threads have been joined. */
#ifndef PE_SERVER_SERVER_H
#define PE_SERVER_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/place.h"
#include "core/status.h"
#include "engine/device.h"
#include "engine/parallel/executor.h"
#include "server/config.h"
#include "server/decode_budget.h"
#include "server/lanes.h"
#include "server/metrics/counters.h"
#include "server/reply_cache.h"
#include "server/run/budget.h"
#include "server/run/table.h"

#define PE_SERVER_VERSION "0.1.0"

typedef struct pe_registry pe_registry;
typedef struct pe_shm_table pe_shm_table;
typedef struct pe_loop pe_loop;

typedef struct pe_server {
  /* cfg: set up by the main thread before the request threads start; the
   * reloadable fields change only under cfg_mu (SIGHUP), and handlers read
   * them through pe_server_limits. */
  pe_srv_config cfg;
  char *config_path; /* NULL: embedded defaults only */
  /* The command line's keys, applied again after the file on SIGHUP. */
  pe_config_override *overrides;
  int n_overrides;
  pthread_mutex_t cfg_mu;
  /* One places trial at a time (registry/register.c): trials time the
   * cores, so two at once would time each other, and each holds its
   * candidates' memory. A register that waited reads the choice the trial
   * before it remembered where that was its program. */
  pthread_mutex_t trial_mu;
  int state_lock; /* flock on the state dir, held for the lifetime (state_lock.h) */

  pe_runtime *rt;
  pe_place_kind place_kind; /* the daemon's places ("auto" resolved) */
  int n_places;
  pe_sync_strategy sync;

  pe_registry *reg;
  pe_shm_table *shm;
  pe_reply_cache *dedup;

  double start_time; /* monotonic seconds */
  atomic_uint_fast64_t requests_total, requests_failed, runs_total;
  pe_metrics_counters metrics; /* what Status has no field for (metrics/counters.h) */
  pe_lane_counts lanes[PE_LANES];
  pe_run_table runs;          /* Run requests being handled (Status: runs, runs_in_flight) */
  pe_run_budget run_budget;   /* their temporaries ([limits] memory_runs_total) */
  pe_decode_pool decode_pool; /* decoded requests' bytes ([limits] memory_requests_total) */
  /* Set by SIGTERM/SIGINT: runs stop at their next step boundary
   * (run/cancel.h), so the shutdown checkpoint comes soon. */
  atomic_bool stopping;

  pe_loop *loop; /* event loop internals (loop.h) */
} pe_server;

/* Requests queued or being handled, in every lane. */
int pe_server_pending(pe_server *s);

/* Limits that may change on SIGHUP, read consistently. */
typedef struct pe_limits {
  int64_t max_message;
  int max_programs;
  int64_t memory_per_client;
  double session_ttl_s;
  uint32_t max_steps; /* [limits] max_steps_per_request */
  int max_program_ops, max_program_vars;
  int64_t memory_per_run;
  int64_t memory_runs_total, memory_kept_per_program;
  int64_t memory_total; /* the daemon's budget, models and runs (run/budget.h) */
  bool check_finite;    /* [runtime] check_finite: run/finite.h */
  /* Decode budgets (decode_budget.h), defaults resolved: per request (> 0)
   * and of all requests (0: unlimited; else at least the former). */
  int64_t memory_per_request, memory_requests_total;
} pe_limits;
pe_limits pe_server_limits(pe_server *s);

/* Build the server from a final config (takes ownership of cfg's strings):
 * the state dir's lock, runtime, registry, shm table, dedup cache. No
 * socket yet. config_path and the overrides (copied; their strings must
 * outlive the server) are what cfg was built from: SIGHUP builds it again. */
pe_status *pe_server_new(pe_srv_config *cfg, const char *config_path, const pe_config_override *ov,
                         int n_ov, pe_server **out);
/* Bind the socket, start the request threads, notify systemd READY=1 and
 * run the loop until SIGTERM/SIGINT; then drain, checkpoint persistent
 * models and return NULL (exit 0) or the first fatal error. */
pe_status *pe_server_run(pe_server *s);
void pe_server_free(pe_server *s);

/* "auto" -> every NVIDIA GPU (cuda:N) when the CUDA backend is built and
 * /dev/nvidia* exist, else cpu:1 (one place; its kernels use all cores).
 * pe_server_new then opens the places: when auto's GPUs cannot be opened (a
 * missing or broken driver) it warns with the reason and uses cpu:1; an
 * explicit spec that cannot be opened stops start-up with the reason. */
pe_status *pe_server_resolve_places(const char *spec, pe_place_kind *kind, int *n);

#endif
