/* Captured steps: what identifies one, when one may be captured, and when
 * the captured ones are stale. Device-independent bookkeeping; the capture
 * itself belongs to the backend (cuda/cuda_graph.h).
 *
 * A captured step (a CUDA graph) replays the exact kernels, with the exact
 * device addresses, of the step it was captured from. So it is only valid
 * for the same
 *   program   the compiled graph (its hash, computed by the caller),
 *   places    kind and count,
 *   shapes    every feed's name, dtype and dims (the batch shape),
 *   fetches   the fetch names, in order,
 * which form its key (pe_step_key), and only while the buffers it reads
 * and writes stay where they were: a load, a set_params or a new optimizer
 * may replace parameter buffers, and the program or the places may change
 * under a model. The cache (pe_step_graphs) keeps one entry per key and
 * drops every entry on pe_step_graphs_invalidate.
 *
 * A key's life: its first step runs the normal path (the warm-up: it sizes
 * temporaries, picks algorithms, fills the caching allocator so that no
 * allocation happens during the capture); the next step is captured; the
 * following ones replay. A capture that fails, or an op that cannot be
 * captured, makes the key fall back to the normal path with the reason,
 * until the next invalidation.
 *
 * Threads: a pe_step_graphs is not locked; its owner (one executor, whose
 * runs are serialised) calls it from one thread at a time. */
#ifndef PE_ENGINE_STEP_GRAPH_KEY_H
#define PE_ENGINE_STEP_GRAPH_KEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/place.h"
#include "core/status.h"

/* --- the option ------------------------------------------------------------- */
typedef enum pe_cuda_graph_mode {
  PE_CUDA_GRAPH_AUTO = 0, /* on for one cuda place (pe_cuda_graph_decide) */
  PE_CUDA_GRAPH_ON = 1,   /* on for cuda places */
  PE_CUDA_GRAPH_OFF = 2,
} pe_cuda_graph_mode;

/* "auto", "on", "off"; false for anything else. */
bool pe_cuda_graph_mode_parse(const char *s, pe_cuda_graph_mode *out);
const char *pe_cuda_graph_mode_name(pe_cuda_graph_mode m);

/* Whether steps on n_places `kind` places are captured under mode;
 * *reason (static text) says why not, or NULL when they are. backend: the
 * cuda backend is built in (pe_device_kind_ops(PE_PLACE_CUDA) != NULL).
 * auto captures on one cuda place, where captured steps were checked
 * against uncaptured ones on a GPU; with several, the NCCL collectives
 * inside the capture have not run on two GPUs, and only on captures. */
bool pe_cuda_graph_decide(pe_cuda_graph_mode mode, pe_place_kind kind, int n_places, bool backend,
                          const char **reason);

/* --- what a captured step can hold ------------------------------------------ */
/* What a run asks of the executor beyond its kernels: each of these is
 * host work between the kernels (per-node spans, hooks, checks, a
 * collective over nodes, waits on whole producer streams), which a replay
 * cannot repeat. */
typedef struct pe_step_graph_run {
  bool timeline;      /* per-node spans are recorded */
  bool test_hooks;    /* node_hook, delay_us or skip */
  bool check_nan_inf; /* per-op NaN/Inf checks on the host */
  bool cross_nodes;   /* gradients summed over nodes on the host */
  bool producer_sync; /* dependencies wait on producer streams, not events */
} pe_step_graph_run;

/* Whether a step of run r may be captured or replayed; false with *why
 * (static text) naming what prevents it. Such a step runs the normal path;
 * the key's state is kept (a later plain step of the key replays). */
bool pe_step_graph_run_capturable(const pe_step_graph_run *r, const char **why);

/* The random ops whose cuda kernels read the generator's step delta from
 * device memory (cuda/cuda_graph.h): a replay advances the delta, so its
 * numbers are those of an unreplayed step. */
bool pe_step_graph_rng_op_counted(const char *type);

/* Whether op `type` (op_flags: its registry flags, PE_OP_RANDOM among them)
 * may be inside a captured step; false with *why (static text) for a random
 * op whose kernel takes its counter offset as an argument only. */
bool pe_step_graph_op_capturable(const char *type, unsigned op_flags, const char **why);

/* A captured step draws `counters` generator counters; has_gaussian: it
 * holds a gaussian_random, whose counter layout depends on the offset's
 * parity (a pair per number), so every replay must start at the parity the
 * capture had: false with *why when counters is odd. */
bool pe_step_graph_rng_capturable(bool has_gaussian, uint64_t counters, const char **why);

/* Whether the buffers a captured step holds moved: any of n addresses
 * differs between the capture (then) and this step (now). A moved buffer
 * (a parameter replaced by a load or set_params, a temporary given back)
 * makes the captured graphs stale (PE_STEP_INVALID_PARAMS). */
bool pe_step_graph_buffers_moved(const void *const *then, const void *const *now, int n);

/* --- the key ------------------------------------------------------------------ */
/* A canonical byte string (compared whole, so two keys never alias) and
 * its hash. Owned by whoever built it; pe_step_key_release frees it. */
typedef struct pe_step_key {
  uint8_t *bytes;
  size_t len;
  uint64_t hash;
  FILE *w;  /* the stream that writes bytes until pe_step_key_done */
  bool oom; /* an append failed: pe_step_key_done reports it */
} pe_step_key;

/* Start a key for program hash `program` on n_places places of kind. */
void pe_step_key_init(pe_step_key *k, uint64_t program, pe_place_kind kind, int n_places);
/* One feed: name, dtype code, dims. Feeds in the order the step gives them. */
void pe_step_key_feed(pe_step_key *k, const char *name, int dtype, const int64_t *dims, int ndim);
/* The fetch names, in order (the set and its order: fetched[i] is fetch[i]). */
void pe_step_key_fetches(pe_step_key *k, const char *const *names, int n);
/* NULL, or PE_ENOMEM when an append failed (the key is then unusable). */
pe_status *pe_step_key_done(pe_step_key *k);
bool pe_step_key_equal(const pe_step_key *a, const pe_step_key *b);
void pe_step_key_release(pe_step_key *k);

/* --- the cache ------------------------------------------------------------------ */
typedef enum pe_step_action {
  PE_STEP_WARMUP,   /* run the normal path; the next step of the key captures */
  PE_STEP_CAPTURE,  /* capture this step (then pe_step_graphs_store or _refuse) */
  PE_STEP_REPLAY,   /* launch the stored graph */
  PE_STEP_FALLBACK, /* the key cannot be captured: normal path (reason) */
} pe_step_action;

typedef enum pe_step_invalidation {
  PE_STEP_INVALID_PROGRAM, /* the program was recompiled or replaced */
  PE_STEP_INVALID_PLACES,  /* the model moved to other places */
  PE_STEP_INVALID_PARAMS,  /* parameter buffers replaced: load, set_params, new optimizer */
} pe_step_invalidation;

/* Frees a backend graph (the cache owns the stored ones). */
typedef void (*pe_step_graph_free_fn)(void *graph);

typedef struct pe_step_graphs pe_step_graphs;

/* max_keys: entries kept (>= 1); past it the least recently used one is
 * dropped (a new batch shape each step must not grow memory without
 * bound). free_graph may be NULL (graphs not owned). */
pe_status *pe_step_graphs_new(int max_keys, pe_step_graph_free_fn free_graph, pe_step_graphs **out);
void pe_step_graphs_free(pe_step_graphs *c);

/* What to do with a step of key k. *graph: the stored graph (REPLAY),
 * else NULL; *reason (FALLBACK): why the key is not captured (owned by the
 * cache, valid until the next call). The cache copies k when it is new. */
pe_status *pe_step_graphs_lookup(pe_step_graphs *c, const pe_step_key *k, pe_step_action *action,
                                 void **graph, const char **reason);
/* The capture of k (asked by lookup) succeeded: later steps replay graph. */
void pe_step_graphs_store(pe_step_graphs *c, const pe_step_key *k, void *graph);
/* The capture of k failed or an op cannot be captured: k falls back, with
 * why (copied), until the next invalidation. */
void pe_step_graphs_refuse(pe_step_graphs *c, const pe_step_key *k, const char *why);
/* Drop every entry (their graphs freed): the next step of any key warms up
 * again. */
void pe_step_graphs_invalidate(pe_step_graphs *c, pe_step_invalidation why);

typedef struct pe_step_graph_stats {
  int64_t captures, replays, fallbacks, invalidations, evictions;
  int keys; /* entries held */
  /* The last refusal's reason ("" when none since the last invalidation). */
  const char *last_reason;
} pe_step_graph_stats;
void pe_step_graphs_stats(const pe_step_graphs *c, pe_step_graph_stats *out);

#endif
