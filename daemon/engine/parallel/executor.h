/* The parallel executor: runs a compiled pe_graph (data_parallel
 * + ssa [+ fuse_allreduce] + memory_plan) on N places, out of order, on the
 * runtime's shared pool. This header is the contract the daemon, pe-bench
 * and the tests code against; it only grows.
 *
 * Three objects:
 *
 *   pe_runtime  what one process (the daemon) owns once: the worker pool,
 *               the dependency engine on it, and the devices, opened on
 *               first use and shared by every model. Intra-op threads:
 *               a sim place gets cores / places OpenMP threads, a cpu
 *               place cores / max(places, pool workers), bound on the
 *               thread that runs the place's kernels (pool worker for
 *               cpu, stream thread for sim), so pool and oneDNN together
 *               never oversubscribe the cores.
 *
 *   pe_model    a parameter namespace: for every place, a scope holding the
 *               persistable variables (parameters, optimizer state, the
 *               learning rate), plus one engine variable per persistable
 *               name (one per name and place: replicas are independent
 *               storage, so places do not serialise on each other) and one
 *               for the model's PRNG state. A training graph
 *               and an evaluation graph bound to the same model share its
 *               parameters. Runs of graphs of one model are ordered on the
 *               parameters through the engine; runs of different models
 *               overlap on the pool.
 *
 *   pe_par_exec one compiled graph bound to a model: per-node kernel state,
 *               per-place tensors for temporaries (capacity kept across
 *               runs), the static in-degrees, the run counters. A run
 *               re-arms the counters (no allocation, no hash lookup on the
 *               hot path in steady state). Runs of one executor are
 *               serialised by the executor (callers may call run from
 *               several threads; they queue).
 *
 * Feeds and fetches are host tensors (the executor copies feeds onto the
 * places, splitting along dim 0 as pe_split_count does: a place may get 0
 * samples, and it then contributes nothing and its gradients count as zero).
 * Fetch of a variable:
 *   - per-sample (dim 0 is the batch): the places' parts concatenated in
 *     place order (the whole batch, as the sequential executor gives it);
 *   - persistable: the model's value: place 0's (all places hold the same
 *     after a run), or the one place this model's graphs update it on
 *     (pe_par_exec_new: Reduce's optimizer state);
 *   - a parameter's gradient: the gradient of the whole batch, under every
 *     strategy: a copy of an all-reduced place's (AllReduce) or of the
 *     owner's (Reduce), or the places' gradients summed at fetch time in
 *     the all-reduce's order (Sharded, whose update never writes the sum
 *     back), so all three give the same bits; a sparse gradient and its
 *     rows: the merged ones (parallel/sparse_merge.c) of an all-reduced
 *     place or of the owner;
 *   - any other (a scalar loss, an accuracy): the mean over the places
 *     weighted by each place's share of the batch, n_p / N (places with
 *     n_p == 0 skipped), which equals the sequential value for mean-style
 *     reductions. Integer ones (counts, e.g. the number of correct
 *     predictions) are summed over the places instead, which equals the
 *     sequential count.
 * A fetch name must be kept fetchable at compile time (pe_pass_opts.keep,
 * or the loss), else the run fails with PE_EUNKNOWN_VAR naming it.
 *
 * Errors (MXNet's rule): a failing kernel stores its error on
 * the variables it writes; dependent nodes are skipped, the run completes,
 * and pe_par_exec_run returns the first error, naming the op index, type,
 * place, variable and shapes. A failed run leaves parameters of the failed
 * step unchanged only where the optimizer was not reached; the engine
 * variables' errors are cleared before the next run, so a model survives a
 * bad request.
 *
 * Threads: pe_runtime_* and pe_model_* may be called from any thread that
 * is not a worker of the runtime's pool (they may wait).
 *
 * Implementation notes (parallel/compile.c, parallel/executor.c, parallel/collective_nodes.c,
 * parallel/feed.c):
 *  - nodes that read or write persistables, and random ops (they mutate the
 *    model's PRNG variable), are dependency-engine ops pushed in node order
 *    at the start of a run with extra_deps = in-degree; other nodes count
 *    down plain atomic counters. Engine variables never carry errors: a
 *    failure is the run's error and marks the node's dependants skipped.
 *  - memory_plan's shared buffers are one block per buffer and place (sized
 *    for the run's rows, capacity kept); fused gradients are views into
 *    their bucket. A fetch of an lvar in a shared buffer fails
 *    (PE_EUNKNOWN_VAR, "not kept fetchable").
 *  - cpu collectives are chunk tasks on the pool (no rendezvous on a
 *    worker); sim all-reduces are one pe_coll_part per place on the comm
 *    streams (queued under one runtime-wide lock, so every comm stream sees
 *    collectives in the same order); sim reduce and broadcast run as one
 *    task on the root's comm stream, which every consumer waits for.
 *  - on sim, a node that writes a persistable (or draws random numbers)
 *    keeps its engine variables until its stream work completed; readers
 *    release them once launched, and a later writer first makes its stream
 *    wait for the place's compute and comm streams. */
#ifndef PE_ENGINE_PAR_EXECUTOR_H
#define PE_ENGINE_PAR_EXECUTOR_H

#include <stdbool.h>
#include <stdint.h>

#include "compiler/graph.h"
#include "core/model_mark.h" /* pe_run_origin, pe_model_mark */
#include "core/scope.h"
#include "core/tensor.h"
#include "engine/dep_engine.h"
#include "engine/device.h"
#include "engine/seq_executor.h" /* pe_feed */
#include "engine/step_graph_key.h"
#include "engine/threadpool.h"
#include "engine/timeline.h"

/* --- runtime --------------------------------------------------------------- */
typedef struct pe_runtime_opts {
  int threads; /* pool workers; <= 0: the number of online cores */
  int cores;   /* cores to share between places' intra-op teams; <= 0: online cores */
  int spin_us; /* pool idle polling (0: pool default) */
  /* 0 (default): pool workers and sim stream threads flush denormals to
   * zero (FTZ+DAZ, core/fpenv.h says why); non-zero: IEEE denormals. */
  int keep_denormals;
  /* Test hook: sim places opened by this runtime treat their memory as
   * device memory (pe_device_opts.device_memory), so models on them take
   * the copy paths cuda places take. */
  int sim_device_memory;
} pe_runtime_opts;

typedef struct pe_runtime pe_runtime;

pe_status *pe_runtime_new(const pe_runtime_opts *opts, pe_runtime **out);
/* The pool size for a process whose models run on n_places places of kind
 * (for pe_runtime_opts.threads when the user asked for none): one worker per
 * cpu place (at most the cores), so that each cpu place's kernels get an
 * OpenMP team of cores / places; the online cores otherwise (sim and cuda
 * kernels do not run on the pool). */
int pe_runtime_default_workers(pe_place_kind kind, int n_places);
/* Grow the pool (it never shrinks) so that a model on n_places places of
 * kind runs them at once: one worker per cpu place, up to the online cores
 * (the daemon's pool starts with its default places' workers; a model may
 * ask for more). NULL when the pool serves them; else why not (the model
 * still works, its places taking turns on the workers there are). Any
 * thread. */
pe_status *pe_runtime_serve_places(pe_runtime *rt, pe_place_kind kind, int n_places);
/* Waits for every pushed op, closes the devices, frees the pool. Every model
 * and executor must have been freed. NULL: no-op. */
void pe_runtime_free(pe_runtime *rt);
pe_pool *pe_runtime_pool(pe_runtime *rt);
pe_engine *pe_runtime_engine(pe_runtime *rt);
/* The device of `place`, opened on first use and kept until
 * pe_runtime_free, with an intra-op budget (>= 1) of cores / n_places_hint,
 * on cpu places cores / max(n_places_hint, pool workers) (parallel/runtime.c
 * says why). */
pe_status *pe_runtime_device(pe_runtime *rt, pe_place place, int n_places_hint, pe_device **out);

/* --- model: parameters across places -------------------------------------- */
typedef struct pe_model pe_model;

/* Whether models (and so executors) can live on n_places places of `kind`:
 * NULL when they can, else the reason (caller frees): the kind must be built
 * in, 1 <= n_places <= PE_MAX_PLACES. Checked before any device is opened.
 * On places whose memory the host does not reach (cuda) the executor goes
 * through copies (engine/place_io.h), and collectives across several cuda
 * places are NCCL's (AllReduce strategy only; pe_par_exec_new refuses the
 * others there). */
pe_status *pe_model_check_places(pe_place_kind kind, int n_places);

/* n_places places of `kind` (cpu:0.., sim:0.., cuda:0; pe_model_check_places'
 * error otherwise). seed: the model's PRNG seed (0: 1); a seeded run gives the
 * same numbers whatever the thread count. */
pe_status *pe_model_new(pe_runtime *rt, pe_place_kind kind, int n_places, uint64_t seed,
                        pe_model **out);
/* Waits for the model's pending work; frees parameters. Executors bound to
 * it must have been freed. NULL: no-op. */
void pe_model_free(pe_model *m);
/* The model trains in a job across nodes: the training graphs (compiled
 * with pe_pass_opts.cross_nodes) sum their gradients over c's nodes as
 * well (engine/node_comm.h); NULL detaches. The caller owns c, keeps it
 * alive while it is attached, and sets it while no run of the model's
 * graphs is in flight. On cpu places c sums the gradients and the step's
 * rows; on places with a device communicator across nodes (cuda), c sums
 * the rows and the one set by pe_model_set_node_dcomm the gradients (a
 * run on such places without it refuses). */
struct pe_node_comm;
void pe_model_set_node_comm(pe_model *m, const struct pe_node_comm *c);
void pe_model_set_node_dcomm(pe_model *m, const struct pe_node_comm *c);
/* The model's devices: place p is [p] (pe_model_places of them). */
pe_device *const *pe_model_devices(const pe_model *m);
int pe_model_places(const pe_model *m);
/* Whether the model holds persistable `name` (on place 0). */
bool pe_model_has(pe_model *m, const char *name);
/* Names of the persistables, sorted; *names is malloc'd, the strings belong
 * to the model (valid until it is freed). */
pe_status *pe_model_names(pe_model *m, const char ***names, int *n);
/* Copy persistable `name` (the model's value: place 0's, or its home's,
 * pe_par_exec_new) into the host tensor out, after
 * every run pushed before the call that writes it (engine ordering). */
pe_status *pe_model_get(pe_model *m, const char *name, pe_tensor *out);
/* Copy persistable `name` of place `place` (0..n_places-1) into host tensor
 * out, ordered like pe_model_get. PE_EINVAL naming the place when out of
 * range. */
pe_status *pe_model_get_place(pe_model *m, const char *name, int place, pe_tensor *out);
/* Set `name` on every place (created when absent: dtype/shape from value;
 * when present, dtype and shape must match, else PE_EDTYPE / PE_ESHAPE
 * naming the variable and both shapes). Ordered after the runs pushed
 * before it, before the runs pushed after it. */
pe_status *pe_model_set(pe_model *m, const char *name, const pe_tensor *value);
#define PE_MODEL_ORIGINS 4096

/* Several persistables at once, as one engine op: a consistent snapshot.
 * Runs push all of their engine ops under the model's push lock, and so does
 * this call, so every value read comes from the same point between two
 * runs: after every run pushed before the call, before every run pushed
 * after it (one pe_model_get per name could read one variable before a
 * concurrent run's update and the next after it). The model's values (as
 * pe_model_get).
 * has_value NULL: a name without a value is PE_EUSE_BEFORE_DEF naming it;
 * else has_value[i] says whether out[i] got one (out[i] left empty if not).
 * mark (may be NULL): the snapshot's pe_model_changes(), run origins and
 * generator offset, read after the random ops of the runs before it
 * (release it with pe_model_mark_release; n == 0: no generator offset).
 * On error every out[i] is released. */
pe_status *pe_model_get_many(pe_model *m, const char *const *names, int n, pe_tensor *out,
                             bool *has_value, pe_model_mark *mark);
/* Set several persistables on every place as one engine op (all or none
 * are checked first: any dtype/shape mismatch sets nothing), ordered like
 * pe_model_get_many: no run sees some of the new values and not the
 * others. Names must be distinct. restore (may be NULL; its version is
 * ignored): the values come from a snapshot with these run origins (a
 * checkpoint), which replace the model's record at the same point; with
 * has_rng, the generator's offset becomes its rng_offset there too, so the
 * runs after the restore draw the random numbers (dropout masks) the runs
 * after the snapshot drew. */
pe_status *pe_model_set_many(pe_model *m, const char *const *names, const pe_tensor *values, int n,
                             const pe_model_mark *restore);
/* The model's record of client's runs: false when it has none (never ran
 * here, or evicted: the newest PE_MODEL_ORIGINS clients are kept). */
bool pe_model_origin(pe_model *m, uint64_t client, pe_run_origin *out);
/* Monotonic count of the changes pushed to the model so far: runs of
 * graphs that update persistables (pe_graph_node_updates_persistable: not
 * an eval with batch norm), and sets. Equal counts: no change in
 * between (autosave skips rewriting an unchanged checkpoint by it). */
uint64_t pe_model_changes(pe_model *m);
/* Bytes of persistable storage per place (for status reports): an engine
 * read of every persistable, so it waits for runs pushed before it. */
int64_t pe_model_bytes(pe_model *m);

/* --- executor ----------------------------------------------------------------- */
typedef struct pe_par_exec pe_par_exec;

/* Bind graph g (compiled: g->ssa; g->n_places and g->place_kind must equal
 * the model's) to model m. Takes ownership of g (freed with the executor,
 * also on failure). Persistables the graph reads and the model lacks are
 * created empty; running a graph that reads an uninitialised parameter
 * fails with PE_EUSE_BEFORE_DEF naming it (run the startup graph first).
 * Persistables g updates on one place only (the Reduce strategy's optimizer
 * state, updated by the parameter's owner) get that place as their home:
 * the model's value (pe_model_get*, snapshots, checkpoints, fetches) is
 * then read there, not from a replica that keeps its startup value. A
 * graph that updates a name on another place than an earlier graph of the
 * model claimed is refused (PE_EINVAL naming the variable and both
 * places): the two would keep diverging values. Claims are never
 * released. */
pe_status *pe_par_exec_new(pe_model *m, pe_graph *g, pe_par_exec **out);
void pe_par_exec_free(pe_par_exec *e);
const pe_graph *pe_par_exec_graph(const pe_par_exec *e);

typedef struct pe_run_opts {
  pe_sync_strategy sync; /* cross-stream rule (default PE_SYNC_WAIT_EVENT) */
  /* Recorded by the model when the run writes persistables (at the push of
   * its ops, so consistent with snapshots). */
  pe_run_origin origin;
  int priority;          /* engine priority of the run's parameter ops */
  pe_timeline *timeline; /* when set, every node's span is recorded into it */
  /* Test hook: when > 0, every node sleeps a pseudo-random 0..delay_us
   * microseconds before it runs (hazard tests); seeded by delay_seed. */
  int delay_us;
  uint64_t delay_seed;
  /* Test hook: when set, called on the thread that executes a node, with
   * done false just before it executes and done true once its host-side
   * work returned (a cpu collective that fans out: after its last chunk),
   * before its successors or the engine ops waiting for its variables can
   * start. Nodes that are skipped are not reported. Lets a test hold a node
   * or check the order of nodes without reading clocks. */
  void (*node_hook)(void *hook_arg, int node, bool done);
  void *hook_arg;
  /* Per node of the graph (pe_par_exec_graph): true skips it, as a place
   * with no rows skips its batch work: its outputs keep the values they
   * have and its successors run. NULL: none. Init uses it to run a startup
   * for the persistables a model lacks without touching the others. */
  const bool *skip;
  /* Debug: every op's outputs (and the feeds) are checked for NaN/Inf and
   * the first op that writes one fails the run (engine/op_finite.h). Host
   * places only: a graph with a cuda place refuses it. */
  bool check_nan_inf;
} pe_run_opts;

/* Steps on cuda places as CUDA graphs (engine/step_graph_key.h,
 * parallel/cuda_graph_step.c): whether and how mode turns them on for e
 * (pe_cuda_graph_decide; off for cpu and sim places whatever the mode).
 * Drops e's captured steps. Not while a run of e is in flight. */
pe_status *pe_par_exec_set_cuda_graph(pe_par_exec *e, pe_cuda_graph_mode mode);
/* Whether e's steps replay captured graphs (at least one replay so far);
 * *reason (may be NULL; static or e's text, valid until e's next run or
 * set): why not, or why the last key fell back, "" when none; *stats (may
 * be NULL): the cache's counts. */
bool pe_par_exec_cuda_graph(pe_par_exec *e, const char **reason, pe_step_graph_stats *stats);

/* Per-run measurements. */
typedef struct pe_run_stats {
  double wall_ms; /* from the call to the end of the last node */
  int64_t batch;  /* samples in the run (dim 0 of the feeds) */
  int n_nodes;    /* nodes executed (skipped ones not counted); on sim: launched */
} pe_run_stats;

/* Run the graph once. Every is_feed variable of the program must be in
 * feeds (else PE_EMISSING_FEED naming it), all feeds with the same dim 0,
 * dtypes and shapes compatible with the declarations (PE_EDTYPE /
 * PE_ESHAPE naming variable and shapes). fetched[i] (caller-owned host
 * tensors, resized as needed) receives fetch[i] as described above. opts
 * and stats may be NULL. Blocks the calling thread (not a pool worker)
 * until the run completed; on asynchronous places (sim, cuda) until every
 * node is launched, the feeds are copied and the fetched values are on the
 * host: the rest of the device work (with nothing fetched: all of it) runs
 * after the call returned. The next run of e waits for it before it starts
 * and returns its failure, if any, as its own error; pe_par_exec_sync
 * waits for it alone. Model reads (pe_model_get) see the newest values
 * whatever is still in flight. */
pe_status *pe_par_exec_run(pe_par_exec *e, const pe_feed *feeds, int n_feeds,
                           const char *const *fetch, int n_fetch, pe_tensor *fetched,
                           const pe_run_opts *opts, pe_run_stats *stats);

/* Wait for the device work the last run of e left in flight (see
 * pe_par_exec_run); its first error (NULL: none, or nothing in flight).
 * Not from a pool worker. */
pe_status *pe_par_exec_sync(pe_par_exec *e);

/* Give back the memory of e's temporaries (activations, their gradients,
 * the parameters' gradients outside buckets, fetch staging) between runs;
 * the next run allocates it again. A no-op while a run is in progress
 * (no wait for it); device work the last run left in flight is waited for
 * first (its failure is the next run's error, as without the release).
 * Not from a pool worker. Memory of a
 * batch twice the current one or more is given back by the runs
 * themselves (parallel/temps.c). */
void pe_par_exec_release(pe_par_exec *e);

/* Feeds already split onto the places (pe_prefetch splits the
 * next batch on its own thread while the current step runs). parts[p] holds
 * place p's rows (dim 0 may be 0), in memory of place p's device (host
 * memory for cpu and sim: a pe_prefetch_batch's parts qualify). */
typedef struct pe_feed_split {
  const char *name;
  const pe_tensor *const *parts; /* [n_places] */
} pe_feed_split;

/* pe_par_exec_run with pre-split feeds: the executor binds the parts as its
 * feed tensors (no copy), so they must stay unchanged until the call
 * returns. Every feed must give every place the same rows (else PE_ESHAPE
 * naming both feeds, the place and the shapes); the batch is the sum of the
 * places' rows, and the update equals pe_par_exec_run on the concatenated
 * batch. Same checks, fetch rules and errors otherwise. */
pe_status *pe_par_exec_run_split(pe_par_exec *e, const pe_feed_split *feeds, int n_feeds,
                                 const char *const *fetch, int n_fetch, pe_tensor *fetched,
                                 const pe_run_opts *opts, pe_run_stats *stats);

/* Several steps in one call (PaddlePaddle's ExecutionStrategy
 * num_iteration_per_run): src->next gives each step's split feeds and
 * src->done receives each step's fetches, until next says PE_STEP_END.
 *
 * Why: between two pe_par_exec_run calls every place waits while the last
 * node's worker wakes the caller's thread, which takes the fetches, gets
 * the next batch and re-arms the graph (on cpu:2, ~50 us of an ~850 us MLP
 * step). Here, on host places (cpu), the pool worker that completes a
 * step's last node ends that step, calls done and next and starts the
 * following step itself; the caller's thread sleeps until the chain stops.
 * On device places (sim, cuda) the caller's thread ends each step (it
 * waits for the devices) and starts the next: the same results, without
 * the saving.
 *
 * Each step is exactly a pe_par_exec_run_split of its feeds: same checks,
 * errors, fetch rules and numbers. next and done are called in order (done
 * of step k before next of step k+1), never two at once, on the caller's
 * thread or a pool worker. */
typedef enum pe_step_next {
  PE_STEP_READY,      /* *feeds holds the step's feeds */
  PE_STEP_END,        /* no more steps */
  PE_STEP_WOULD_BLOCK /* only with may_block false: ask again from the caller's thread */
} pe_step_next;

typedef struct pe_step_source {
  /* Step `step`'s feeds: *feeds (n_feeds entries, parts as for
   * pe_par_exec_run_split) must stay valid and unchanged until done(step)
   * returned. may_block is false on a pool worker: there, answer
   * PE_STEP_WOULD_BLOCK rather than wait (the wait could be for work queued
   * behind this very worker); the caller's thread then asks again with
   * may_block true. An error ends the call. */
  pe_status *(*next)(void *ctx, int64_t step, bool may_block, const pe_feed_split **feeds,
                     pe_step_next *what);
  /* Step `step` ended: fetched[0..n_fetch) hold its fetches (the call's
   * array). An error ends the call. */
  pe_status *(*done)(void *ctx, int64_t step, const pe_tensor *fetched, int n_fetch);
  void *ctx;
} pe_step_source;

/* Run steps until src->next says PE_STEP_END, a step fails (its error,
 * wrapped with the step index) or a callback fails (its error). *steps (may
 * be NULL) counts the steps whose done was called. fetched: n_fetch
 * caller-owned tensors, reused by every step. Blocks the calling thread
 * (not a pool worker). */
pe_status *pe_par_exec_run_steps(pe_par_exec *e, const pe_step_source *src, int n_feeds,
                                 const char *const *fetch, int n_fetch, pe_tensor *fetched,
                                 const pe_run_opts *opts, int64_t *steps);

#endif
