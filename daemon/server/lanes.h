/* Request lanes: the queues between the main thread, which receives the
 * requests, and the request threads, which handle them.
 *
 * A run holds its request thread while it computes (on the pool), for as
 * long as its steps take: minutes for a trainer's batch of many steps. So
 * the kinds are split by how long they hold a thread, and each lane has a
 * queue and threads of its own (dispatch.c's table says which kind goes
 * where):
 *   run      Run: cfg.run_threads (0: as many as request_threads); these
 *            bound the runs in flight, more wait in the queue.
 *   work     register (compiles), init, get/set_params (wait on the engine
 *            for a model's pending steps), save and load (files):
 *            cfg.request_threads, never held by runs, so that a save or a
 *            new trainer's register is answered while others train.
 *   control  the kinds that run no program, wait on no model's steps and
 *            touch no file (ping, status, close, deregister, drop_model,
 *            register_shm, unregister_shm): PE_CONTROL_THREADS.
 *
 * Order: a request never starts before the earlier requests of its client
 * have started, in whichever lane they wait (a close would otherwise end
 * the session before the client's queued run starts, and the run would
 * find no program). It waits, passed by the other clients' requests behind
 * it, until those have started; then it is queued in its lane as any
 * other (lanes_order.h keeps the waiting ones, O(1) per request). Started:
 * a run once it holds its program and is listed in Status (so that a close
 * cancels it), any other request once dispatch has begun it
 * (pe_lanes_started). Requests that have started run concurrently, as
 * before (the reply cache orders the copies of one request: reply_cache.h).
 * Client 0 (anonymous) keeps no order.
 *
 * Read-only runs: a run of a program that changes no persistable (an eval
 * or inference program: no optimizer, no parameter or state update; the
 * compiled graph says so, pe_run_read_only; an eval with batch norm too,
 * whose test-mode op lists the running statistics among its outputs but
 * leaves them alone: pe_op_output_unchanged) is queued in the run lane as any run, but when every
 * run thread is busy a work thread may take it, so that an eval of a few
 * batches is not kept for minutes behind other clients' long training
 * runs. At most request_threads - 1 work threads at a time hold such runs
 * (one stays for the work lane's requests; with request_threads = 1 none
 * does), so run_threads still bounds the runs that update parameters. A
 * borrowed run keeps the order rule and waits for the run memory budget
 * ([limits] memory_runs_total) as any run. It waits for memory and for the
 * engine's ops only, never for a request thread (nor does a run on a run
 * thread wait for a work thread), so no threads wait in a cycle.
 *
 * Threads: pe_lanes_enqueue and pe_lanes_close on the main thread; the
 * request threads take jobs and call the handler; one mutex guards the
 * queues. The counts (Status) are atomics that any thread may read. */
#ifndef PE_SERVER_LANES_H
#define PE_SERVER_LANES_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "server/request_peek.h"

/* Status lists the lanes in this order: run is last so that the positions
 * of the two older ones hold for older readers. */
typedef enum pe_lane { PE_LANE_WORK = 0, PE_LANE_CONTROL, PE_LANE_RUN, PE_LANES } pe_lane;
#define PE_CONTROL_THREADS 2 /* one for a slow control request, one for status */

const char *pe_lane_name(pe_lane l); /* "work", "control", "run" */

/* A lane's counters, for Status (atomics: written under the lanes' lock
 * or by the lane's threads, read by any). */
typedef struct pe_lane_counts {
  atomic_int threads; /* started */
  atomic_int queued;  /* received, not yet picked by one of its threads */
  atomic_int busy;    /* being handled, until the reply leaves */
} pe_lane_counts;

/* One received request: its bytes and the raw REP routing header that its
 * reply must carry (both nanomsg chunks, freed by pe_job_free). Queued, it
 * belongs to the lanes; taken, to the thread that handles it. */
typedef struct pe_job {
  void *body;
  size_t len;
  void *ctrl;
  double received;
  uint64_t seq;    /* receive order (main thread): which copy of a resent request is newest */
  uint64_t client; /* Request.client_id as peeked (0: unknown) */
  /* What the main thread routed it on; the request thread decodes it only
   * as that (request_decode.h). routed false: the peek refused its bytes,
   * which are answered as malformed and never decoded. */
  bool routed;
  pe_request_peek peek;
  pe_lane lane;        /* the queue it waits in; taken: its thread's lane */
  bool answered;       /* off its lane's busy count (receive.c, job_answering: once) */
  bool read_only;      /* a run of a program that changes no persistable */
  struct pe_job *next; /* in a lane's queue or its client's waiting list */
} pe_job;

void pe_job_free(pe_job *j);

/* Handles a job taken from its lane, on that lane's thread (owns j). */
typedef void pe_job_handler(void *ctx, pe_job *j);

/* On the main thread, for each Run received: whether the program of
 * `handle` is registered and writes no persistable (see above). */
typedef bool pe_run_read_only(void *ctx, uint64_t handle);

typedef struct pe_lanes pe_lanes;

/* Start threads[l] request threads for each lane l, counted in counts[l]
 * (which must outlive the lanes); fn and read_only (NULL: no run is) get
 * ctx. On failure none is left running. */
pe_status *pe_lanes_start(const int threads[PE_LANES], pe_lane_counts *counts, pe_job_handler *fn,
                          pe_run_read_only *read_only, void *ctx, pe_lanes **out);

/* Main thread: queue j (its body, len and seq set) in the lane of its kind,
 * read off its bytes (request_peek.h; unreadable: control, whose thread
 * answers it as malformed without decoding it, out of any client's
 * order). false: out of memory for the order's
 * bookkeeping, j is not queued (the caller drops it). */
bool pe_lanes_enqueue(pe_lanes *ls, pe_job *j);

/* On a request thread: the request it handles has started (see above),
 * and its client's later requests may start; once per request, later
 * calls and calls on other threads do nothing. The thread calls it after
 * the handler if the handler did not. */
void pe_lanes_started(void);

/* No more requests: each thread ends once its lane is drained. */
void pe_lanes_close(pe_lanes *ls);
/* Request threads not yet ended. */
int pe_lanes_alive(pe_lanes *ls);
/* Close, join the threads, free the jobs left queued. NULL: nothing. */
void pe_lanes_free(pe_lanes *ls);

#endif
