/* Internals of the parallel executor shared by its files: parallel/compile.c
 * (binding the graph to the model), parallel/executor.c (scheduling, op nodes),
 * parallel/collective_nodes.c (collective nodes), parallel/feed.c (feeds and fetches). Not a
 * public interface.
 *
 * Run state lives in the per-node records (xnode) and the executor; one run
 * at a time per executor (run_mu), so a record has one run's state. */
#ifndef PE_ENGINE_PAR_EXEC_INTERNAL_H
#define PE_ENGINE_PAR_EXEC_INTERNAL_H

#include <stdatomic.h>

#include "engine/parallel/internal.h"
#include "ops/registry.h"

#define PAR_MAX_CHUNKS 16

typedef struct pe_par_exec pe_par_exec;
typedef struct xnode xnode;
typedef struct par_shard par_shard;
typedef struct par_sparse par_sparse;

/* One part of a sim all-reduce: runs on place p's comm stream. */
typedef struct par_simpart {
  xnode *x;
  int p;
  pe_coll_part part;
} par_simpart;

/* A cpu collective's chunk task. */
typedef struct par_chunk {
  pe_task task;
  xnode *x;
  int c;
} par_chunk;

/* A persistable replica that a step writes whatever its exchange across
 * nodes does (parallel/cross_keep.c), and its copy as of the step's start. */
typedef struct par_keep_var {
  par_entry *en;
  int place;
  bool has; /* the copy holds a value (the replica had one) */
  pe_tensor copy;
} par_keep_var;

/* The kept replicas of a graph trained in a job (var[n], ev[n]: their
 * engine variables); pending: engine ops in flight, under mu. */
typedef struct par_keep {
  int n;
  par_keep_var *var;
  pe_engine_var **ev;
  bool inited;
  int pending;
  pthread_mutex_t mu;
  pthread_cond_t cv;
} par_keep;

struct xnode {
  pe_par_exec *e;
  const pe_graph_node *n;
  int id;
  bool engine;    /* pushed through the dependency engine */
  bool batch_dep; /* forward/backward: skipped on a place with 0 samples */
  bool writes_persistable;
  bool random; /* draws from the graph's generator (mutates the PRNG var) */
  bool collective;
  int affinity; /* home pool worker + 1, 0: none (place_affinity) */

  /* OP and LOSS_GRAD_SCALE: bound once at compile (seq_executor's layout). */
  pe_kernel_fn kernel;
  void (*state_free)(void *);
  void *state;
  pe_tensor_list *tl;
  pe_meta_list *ml;
  pe_tensor **tensors; /* [n_in_data + n_out_data] */
  pe_meta *metas;
  pe_meta **mptrs;
  const char **names;
  pe_infer_ctx ic;
  pe_kernel_ctx kc;

  /* Collectives: the tensors of in[] / out[] (data vars), and per-run
   * pointers for the chunk loop. */
  pe_tensor **cin, **cout;
  par_chunk chunks[PAR_MAX_CHUNKS];
  par_simpart *parts; /* [n_places], sim all-reduce */
  int64_t *counts;    /* [width] elements (bytes for broadcast) this run */
  int n_chunks;
  atomic_int chunks_left;
  par_shard *shard;   /* SHARDED_UPDATE: see parallel/sharded.c */
  par_sparse *sparse; /* SPARSE_MERGE: see parallel/sparse_merge.c */

  /* Engine variables. */
  pe_engine_var **reads, **muts;
  int n_reads, n_muts;
  /* Async places: write fences of the persistable replicas the node reads
   * (waited for on its stream) and writes (recorded after its launch). */
  par_fence **rfence, **wfence;
  int n_rfence, n_wfence;

  int n_pred;
  int *pred; /* distinct producer nodes (from in[]) */

  /* Device side. Per-place nodes: dev/stream of their place, ev[0].
   * All-reduce collectives: ev[p] on place p's comm stream. Reduce and
   * broadcast on an async device: one fn on root's comm stream, ev[0]. */
  pe_device *dev;
  pe_stream *stream;
  int n_ev;
  pe_event **ev;
  pe_stream **ev_stream;

  /* Run state. */
  atomic_int pending; /* non-engine nodes: predecessors not yet done */
  atomic_bool failed; /* host: a predecessor failed or was skipped-failed */
  atomic_bool sfail;  /* stream: the stream work failed or was skipped */
  pe_engine_op *eop;  /* engine nodes: the kept op, pushed every run */
  pe_task task;
  float scale; /* LOSS_GRAD_SCALE: n_p / N */
  /* LOSS_GRAD_SCALE: the node's own copy of its fill_constant desc, whose
   * 'value' attribute (scale_attr) each run sets to scale_base * n_p / N, so
   * the place's own kernel writes the scaled seed on any device kind. */
  pe_op_desc *scale_desc;
  pe_attr *scale_attr;
  float scale_base;
  /* All-reduces of gradients: their rank among the graph's all-reduce
   * nodes (node order), the order every node of a job sums them across
   * nodes in (parallel/cross.c); -1 for other nodes. */
  int cross_seq;
  pe_task cross_task; /* completes the node once the job's sums are in */
};

typedef struct par_feedvar {
  const pe_var_desc *desc;
  int *lv; /* [n_places] lvar ids */
} par_feedvar;

struct pe_par_exec {
  pe_model *m;
  pe_runtime *rt;
  pe_graph *g;
  bool async;               /* the places' devices are asynchronous (sim) */
  bool writes_persistables; /* some node changes one: a run is a model change
                             * (pe_graph_node_updates_persistable) */
  int n_places;
  pe_device **dev; /* [n_places] */

  pe_tensor *own;     /* [n_lvars] storage of non-persistable lvars */
  pe_tensor **lt;     /* [n_lvars] the tensor of each lvar */
  par_entry **lentry; /* [n_lvars] model entry of a persistable lvar, else NULL */
  /* Persistables this graph updates on one place only, and that place
   * (par_claim_homes makes it their home). */
  par_entry **home_en;
  int *home_place;
  int n_homes;
  void **buf_mem; /* [n_buffers] blocks of shared (memory-planned) buffers */
  size_t *buf_cap;
  void **bucket_mem; /* [n_buckets * n_places] */
  size_t *bucket_cap;

  xnode *x; /* [n_nodes] */
  int n_feeds;
  par_feedvar *feeds;
  int *grad_lv, *param_lv; /* [n_params * n_places] lvar ids (-1: absent) */
  /* [n_params * n_places] a sparse gradient's rows lvar (-1: dense). */
  int *rows_lv;
  /* [n_params] where a fetch finds parameter j's whole-batch gradient: the
   * place holding the sum (all-reduce: 0; reduce: the owner), or -1: sum
   * the places' gradients (a sharded update consumed them). */
  int *grad_sum_place;
  /* Fetch lookups of the previous runs (a training loop fetches the same
   * names every step): fetch slot i -> name and its lvar per place. */
#define PAR_FETCH_CACHE 8
  char *fetch_name[PAR_FETCH_CACHE];
  int *fetch_lv[PAR_FETCH_CACHE]; /* [n_places] */
  /* [n_places] host copies of place tensors a fetch reads when the place's
   * memory is not host memory (parallel/feed.c); capacity kept across runs. */
  pe_tensor *stage;

  pthread_mutex_t run_mu; /* one run at a time */

  /* Per-run state. */
  int64_t batch;
  int64_t *n_rows; /* [n_places] */
  /* [n_places] the largest rows the temporaries were sized for since they
   * last shrank (parallel/temps.c); under run_mu. */
  int64_t *rows_sized;
  bool has_feeds;
  bool feeds_viewed; /* feed tensors are views of a split run's parts */
  /* The run's options: a copy (opts_v), because async places' stream threads
   * run nodes after pe_par_exec_run returned and its caller's struct is gone
   * (its pointers, e.g. skip and timeline, stay the caller's). Replaced only
   * after the previous run drained (par_set_opts). */
  const pe_run_opts *opts;
  pe_run_opts opts_v;
  pe_sync_strategy sync;
  pe_timeline *tl;
  uint64_t delay_salt;
  _Atomic(pe_status *) err;
  atomic_int remaining;
  atomic_int executed;
  /* The caller's thread sleeps on done_cv until `back` (under done_mu):
   * set when a step's last node is done, or, when pool workers chain the
   * steps of pe_par_exec_run_steps, when the chain stops. */
  pthread_mutex_t done_mu;
  pthread_cond_t done_cv;
  bool back;
  /* pe_par_exec_run_steps (parallel/steps.c); set by the caller while nothing
   * runs. chain_steps: the last node's worker queues steps_task, which ends
   * the step and starts the next, instead of handing back. */
  bool chain_steps;
  pe_task steps_task;
  struct par_steps *steps;
  pe_event **end_ev; /* [n_places * PE_STREAM_KINDS] */
  /* Async places: the last run returned before its stream work ran (end_ev
   * recorded, not waited for). The next run, pe_par_exec_sync and free wait
   * for it first (par_drain); its stream errors arrive in err meanwhile.
   * tail_quiet: the run returned an error, so the tail's errors (often
   * its consequences) are dropped: a run reports one error, its first.
   * Under run_mu. */
  bool tail, tail_quiet;
  bool ops_kept; /* the engine nodes' eop are built (par_step_begin) */
  /* The tail's failure when pe_par_exec_release waited for it: par_drain
   * returns it next (to the next run, sync or free). Under run_mu. */
  pe_status *tail_err;

  /* Sums across the nodes of a job (parallel/cross.c). ncomm: this run's
   * (the model's at step begin, NULL when the graph has no all-reduce).
   * cross[k]: the all-reduce node of cross_seq k once its sum over the
   * places is done (posted), cross_next: the next to sum across nodes;
   * cross_busy: a thread is summing; under cross_mu. */
  const struct pe_node_comm *ncomm;
  const struct pe_node_comm *ncomm_dev; /* the gradients' on device places, or NULL */
  int n_cross;
  xnode **cross;
  int cross_next;
  bool cross_busy;
  bool cross_failed;
  pthread_mutex_t cross_mu;
  /* The exchange thread of the host path: it sums the posted nodes in
   * order, so no pool worker blocks on the peers and the backward pass
   * runs on while the gradients travel. Started at the first step in a
   * job, joined at free; cross_cv (under cross_mu) wakes it. */
  pthread_t cross_thread;
  bool cross_thread_on, cross_quit;
  pthread_cond_t cross_cv;
  par_keep keep; /* parallel/cross_keep.c */

  /* Captured steps (parallel/cuda_graph_step.c): NULL unless the mode
   * turned them on for this executor's places. graph_off_why: why they
   * are off (static text), NULL when on. Under run_mu. */
  struct par_graph *graph;
  pe_cuda_graph_mode graph_mode;
  const char *graph_off_why;
};

/* One step of a run (parallel/executor.c). The caller holds run_mu and set the
 * options (par_set_opts). par_step_begin waits for the previous step's
 * stream work (par_drain), binds the feeds, re-arms the nodes and starts
 * the roots (on an error nothing started); from then on the last node's
 * worker either chains (chain_steps) or hands back (par_hand_back:
 * par_wait_back returns). par_step_end, once every node is done (on async
 * places: launched), takes the step's first error and fetches. On async
 * places it waits only for what the caller hands over: the feed copies
 * (they read the caller's memory), the fetched variables' producers, and
 * everything when the feeds are views of the caller's parts or a timeline
 * records; the rest is the step's tail (e->tail). begin and end may run on
 * a pool worker (host executors: no device waits there). */
/* Waits for the previous run's tail (its error, wrapped, if it failed:
 * then nothing is set), then sets the options. */
pe_status *par_set_opts(pe_par_exec *e, const pe_run_opts *opts);
/* Free the engine nodes' kept ops (none may be pushed and not done). */
void par_free_kept_ops(pe_par_exec *e);
pe_status *par_step_begin(pe_par_exec *e, const pe_feed *feeds, const pe_feed_split *split,
                          int n_feeds);
pe_status *par_step_end(pe_par_exec *e, const char *const *fetch, int n_fetch, pe_tensor *fetched);
/* par_step_begin's second half, once the feeds are bound: zero the
 * gradients of places without rows, re-arm the nodes, push the engine ops
 * and start the roots. t_start: when the step began (its timeline span). */
pe_status *par_step_launch(pe_par_exec *e, uint64_t t_start);
void par_hand_back(pe_par_exec *e);

/* parallel/cuda_graph_step.c (captured steps; e->graph set). The step's
 * fetch names (the key's last part), set before par_step_begin. */
typedef struct par_graph par_graph;
void par_graph_set_fetch(pe_par_exec *e, const char *const *fetch, int n_fetch);
/* After the feeds are bound: warm up (nothing to do), begin the recording
 * (capture: the launches that follow are recorded), or replay (*launched:
 * the step's work is queued; its end hands back). */
pe_status *par_graph_step_begin(pe_par_exec *e, bool *launched);
/* Once every node is launched: end a recording and launch it, or, when
 * the recording failed, refuse the key and run the step the normal way. */
pe_status *par_graph_step_end(pe_par_exec *e);
void par_graph_free(pe_par_exec *e);

/* parallel/async.c (async places). */
/* Wait for the previous step's tail; its stream errors, if any (wrapped). */
pe_status *par_drain(pe_par_exec *e);
/* par_step_end's device part: wait for what the caller gets back (the
 * feed copies, the fetched values; every stream when the feeds are views
 * or a timeline records), leave the rest as the tail. */
void par_end_async(pe_par_exec *e, const char *const *fetch, int n_fetch);
/* Record an event on every stream of every place and wait for them. */
pe_status *par_sync_streams(pe_par_exec *e);
/* x's read and write fences (x->rfence, x->wfence), at compile. */
pe_status *par_compile_fences(pe_par_exec *e, xnode *x);
/* x writes a persistable replica that has no storage yet: its kernel
 * allocates it (host-visible metadata changes). */
bool par_allocates_persistable(const xnode *x);
void par_wait_back(pe_par_exec *e);

/* Record a failure as the run's first error (or free it). */
void par_fail(pe_par_exec *e, pe_status *st);
/* parallel/executor.c: a node finished (ran, failed or was skipped): notify its
 * successors. Returns one ready non-engine successor for the caller to run
 * inline (or NULL); the others are submitted. */
xnode *par_node_done(xnode *x, bool may_inline);
/* Complete the engine op of an engine node whose fn left it pending (a
 * fanned-out collective): releases its variables, then par_node_done. */
void par_engine_complete(xnode *x);
/* Run a non-engine node and the chain of successors it makes ready. */
void par_run_chain(xnode *x);
/* Make `consumer` see `producer`'s work up to ev (NULL: all queued so far):
 * pe_device_sync_dep with the run's strategy, except that under
 * WAIT_PRODUCER a comm stream of a model with a device communicator is never
 * drained on the host, which would block forever on a stuck collective that
 * only the backend's error poll sees: outside coll_mu the wait is
 * par_model_dcomm_finish (every comm
 * stream of the model, with the poll and its time limit); under coll_mu
 * (in_coll: a collective's launch, where an abort could not take the lock)
 * the consumer waits for ev on the device. */
pe_status *par_sync_dep(pe_par_exec *e, bool in_coll, pe_stream *producer, const pe_event *ev,
                        pe_stream *consumer);
/* Make stream s see f's write (nothing when s queued it itself). */
pe_status *par_fence_wait(pe_par_exec *e, bool in_coll, const par_fence *f, pe_stream *s);
/* Make stream `s` (place p) see the stream work of every predecessor of x. */
pe_status *par_sync_preds(xnode *x, pe_stream *s, int p);
/* Make stream s see the newest writes of the persistables x reads. */
pe_status *par_wait_fences(xnode *x, pe_stream *s);
/* The pseudo-random delay hook. */
void par_delay(xnode *x);
/* The run's node_hook, if any (pe_run_opts). */
void par_hook(xnode *x, bool done);
/* Timeline lane of the calling thread. */
void par_record(xnode *x, pe_place place, const char *lane, uint64_t t0);

/* parallel/compile.c: bind an op node's kernel, tensors and contexts
 * (x->tl/ml/ic/kc; for a SHARDED_UPDATE node, those of place 0). ctx: the
 * kernel's device ctx. */
pe_status *par_compile_op_node(pe_par_exec *e, xnode *x, pe_device_ctx *ctx);

/* parallel/sharded.c: the SHARDED_UPDATE node's parts, called by the collective
 * code (parallel/collective_nodes.c) like any other collective's prepare/chunk. */
pe_status *par_shard_compile(pe_par_exec *e, xnode *x);
void par_shard_free(xnode *x);
/* Per run, before any chunk: checks every place's args against place 0's,
 * sizes outputs, snapshots the small inputs; *count = Param's elements. */
pe_status *par_shard_prepare(xnode *x, int64_t *count);
/* Slice [lo, hi) of the parameter: sum the gradients, run the optimizer,
 * copy the slice of every Param-shaped output to the other places. Chunk c
 * writes the small outputs into its own scratch. Any thread. */
pe_status *par_shard_chunk(xnode *x, int c, int64_t lo, int64_t hi);
/* After every chunk: chunk 0's small outputs to every place. */
void par_shard_finish(xnode *x);

/* parallel/sparse_merge.c: the SPARSE_MERGE node's parts, called by the
 * collective code like the sharded update's. */
pe_status *par_sparse_compile(pe_par_exec *e, xnode *x);
void par_sparse_free(xnode *x);
/* Per run: checks every place's values and rows (metadata); one chunk. */
pe_status *par_sparse_prepare(xnode *x);
/* The merge, and the outputs sized and written. */
pe_status *par_sparse_chunk(xnode *x);

/* parallel/executor.c: a predecessor's stream work failed or was skipped. */
bool par_preds_sfailed(const xnode *x);

/* parallel/collective_nodes.c */
/* Size check / output sizing for this run; sets counts and n_chunks. Runs
 * on the host (cpu, cuda) or on the stream thread (sim reduce/broadcast).
 * Touches metadata and allocations only, never the data. */
pe_status *par_coll_prepare(xnode *x);
/* dst[0, m) = b[0][i] + b[1][i] + ... in place order: the one summation
 * order of every cpu/sim all-reduce and sharded update, so their results
 * are bit-identical wherever they run. */
void par_sum_block(float *dst, const float *const *b, int np, int64_t m);
pe_status *par_coll_compile(pe_par_exec *e, xnode *x);
void par_coll_free(xnode *x);
/* Run a collective node on the host. Returns true when it completed
 * (the caller then calls par_node_done), false when chunk tasks were
 * submitted and the last of them completes the node. */
bool par_coll_run(xnode *x, bool may_fan_out);

/* parallel/cross.c: sums across the nodes of a job. */
/* At compile: the all-reduce nodes' cross_seq. */
pe_status *par_cross_compile(pe_par_exec *e);
void par_cross_free(pe_par_exec *e);
/* At step begin: this run's communicators (the model's); refused on
 * places that no path across nodes serves (pe_node_comm_path_of). */
pe_status *par_cross_begin(pe_par_exec *e);
/* x's sum over the places is done (or x failed or was skipped): true when
 * x completes now (no sum across nodes this run), false when it is held
 * and completed later. The step's all-reduce nodes complete together once
 * every one of them was summed across the nodes, so that no optimizer
 * update of the step runs unless all of the step's sums arrived (a peer
 * lost mid-step leaves every parameter as of the last completed step). */
bool par_cross_hold(xnode *x);

/* At step begin, with feeds, in a job: the step's rows summed over the
 * nodes (each node's shard may have its own size): every node calls it
 * once, before the step's sums. */
pe_status *par_cross_rows(pe_par_exec *e, double *rows);

/* parallel/cross_device.c: an all-reduce node summed across nodes on
 * device places (e->ncomm_dev). launch: the sum over the places (the
 * device collective, or nothing on one place) on the comm streams, then
 * par_cross_hold; spread: after place 0's buffers k0 .. k0+m of x were
 * summed across the nodes, copies them to the other places (within-node
 * broadcast from place 0) and records x's events on every comm stream. */
bool par_dcross_launch(xnode *x);
pe_status *par_dcross_spread(xnode *x, int k0, int m);

/* parallel/cross_keep.c: a failed exchange leaves the persistables as of
 * the last completed step. At compile (from par_cross_compile): the
 * replicas written by nodes that do not depend on a cross-node sum. */
pe_status *par_keep_compile(pe_par_exec *e);
/* Waits for the copies in flight. */
void par_keep_free(pe_par_exec *e);
/* At step begin, under the model's push lock before the step's ops: copy
 * the kept replicas (an engine read). */
pe_status *par_keep_begin(pe_par_exec *e);
/* At step end: when the exchange failed, write the copies back (an engine
 * write, not waited for). */
void par_keep_end(pe_par_exec *e);

/* parallel/collective_device.c: launch collective x with the backend's device
 * collectives on every place's comm stream (the model has a device
 * communicator: > 1 place of a kind such as cuda). */
pe_status *par_dcomm_launch(xnode *x);
/* Records x's event on every place's comm stream (caller holds coll_mu);
 * returns st, or the first record's error when st is NULL. */
pe_status *par_dcomm_record(xnode *x, pe_status *st);
/* Before a run's fetches or in par_drain, before the end events: wait for the comm
 * streams while polling the backend's asynchronous errors, with a time limit,
 * so a failed collective is the run's error instead of a hang. */
pe_status *par_dcomm_finish(pe_par_exec *e);

/* parallel/feed.c */
pe_status *par_feeds_compile(pe_par_exec *e);
pe_status *par_feeds_load(pe_par_exec *e, const pe_feed *feeds, int n_feeds);
/* pe_par_exec_run_split's feeds: the parts become the feed tensors (views). */
pe_status *par_feeds_load_split(pe_par_exec *e, const pe_feed_split *feeds, int n_feeds);
pe_status *par_fetch(pe_par_exec *e, const char *const *fetch, int n_fetch, pe_tensor *fetched);
/* Async places: make each place's d2h stream wait for the fetched
 * variables' values there (their last producers, or the write fence of a
 * persistable), then wait for those d2h streams on the host. */
pe_status *par_fetch_wait(pe_par_exec *e, const char *const *fetch, int n_fetch);
void par_zero_grads(pe_par_exec *e);
pe_status *par_buffers_bind(pe_par_exec *e);
/* parallel/temps.c: before a run's buffers are bound, give back the memory of
 * a batch twice this run's or more (rows_sized); a shared buffer whose
 * capacity is twice its need or more is allocated again to fit. */
void par_temps_fit(pe_par_exec *e);
bool par_buffer_oversized(size_t cap, int64_t need);

/* parallel/homes.c: find the persistables e's graph updates on one place only
 * (e->home_en, e->home_place), then make those places their homes in the
 * model, or refuse (PE_EINVAL naming the variable and both places) when
 * another graph claimed another place; claims are never released. */
pe_status *par_find_homes(pe_par_exec *e);
pe_status *par_claim_homes(pe_par_exec *e);

#endif
