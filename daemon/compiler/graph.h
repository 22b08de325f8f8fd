/* The graph IR: a trained program compiled into an SSA graph replicated over
 * N places. This is what the parallel executor runs and what the
 * graph passes (data_parallel, ssa, fuse_allreduce, memory_plan) build and
 * rewrite. Stable interface: changes are additive only.
 *
 * Four tables, all plain arrays indexed by int ids (the only map, lvar_index,
 * serves compile-time lookups by name; nothing is built per run):
 *   nodes    one unit of scheduled work: a compute op on one place, or a
 *            collective spanning places (all_reduce, reduce, broadcast, ...).
 *   lvars    "logical" variables: one program variable on one place
 *            (name, place). Passes that change structure edit node lists of
 *            lvars; the ssa pass derives the versioned vars from them.
 *   vars     SSA variables: (lvar, version). Every write creates a version;
 *            dummy vars carry pure control dependencies.
 *   buffers  storage: every lvar is stored in one buffer; several
 *            non-overlapping temporaries may share one after memory_plan.
 *            Persistable lvars have a buffer of their own (never shared), so
 *            a buffer id also names the engine variable of a persistable.
 *
 * Node order: nodes[] is always a valid sequential order (program order with
 * collectives inserted after their producers); ssa versions in that order.
 *
 * Lifecycle: data_parallel creates the graph (graph->ssa == false: node
 * lists hold lvar ids in in_lv/out_lv, in/out are empty). The ssa pass fills
 * vars, in/out, in_degree and succ and sets graph->ssa. A pass that changes
 * nodes afterwards (fuse_allreduce) calls pe_graph_build_ssa again. The
 * executor requires graph->ssa.
 *
 * Ownership: the graph owns everything reachable from it, including a clone
 * of the program (prog) that op nodes' desc pointers point into, so a
 * compiled graph outlives the request that registered the program.
 * pe_graph_free releases all of it. Thread-safety: built on one thread;
 * read-only once compiled. The graph holds no run state: executors copy the
 * in-degrees into their own counters and own the tensors. */
#ifndef PE_COMPILER_GRAPH_H
#define PE_COMPILER_GRAPH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ir/program.h"
#include "core/dtype.h"
#include "core/place.h"
#include "core/status.h"
#include "core/strmap.h"

typedef struct pe_op_def pe_op_def;

/* How gradients are combined across places. */
typedef enum pe_graph_strategy {
  /* Every place all-reduces every gradient (sum) and runs the optimizer on
   * its own replica of the parameters. */
  PE_STRATEGY_ALLREDUCE = 0,
  /* Each parameter has one owner place (round-robin by size): gradients are
   * reduced to the owner, the optimizer runs only there, and the updated
   * parameter is broadcast to the other places. */
  PE_STRATEGY_REDUCE = 1,
  /* ZeRO-1 style, one sharded_update node per parameter: it sums the places'
   * gradients and runs the optimizer slice by slice (each slice once, the
   * slices spread over the pool), writing the new parameter and optimizer
   * state to every place. No place runs the whole optimizer, and the gradient
   * sum is never written back. Parameters whose optimizer is not
   * PE_OP_ELEMENTWISE fall back to AllReduce. cpu and sim places only. */
  PE_STRATEGY_SHARDED = 2,
} pe_graph_strategy;

typedef enum pe_node_kind {
  PE_NODE_OP = 0,           /* compute op on one place: desc + def */
  PE_NODE_ALL_REDUCE,       /* one gradient, sum, across all places */
  PE_NODE_FUSED_ALL_REDUCE, /* one bucket of gradients, one sum (see buckets) */
  PE_NODE_REDUCE,           /* sum to root (the owner place) */
  PE_NODE_BROADCAST,        /* root's var to every other place */
  PE_NODE_LOSS_GRAD_SCALE,  /* fill loss@GRAD on one place with n_p / N */
  PE_NODE_SHARDED_UPDATE,   /* sum of the places' gradients + optimizer, sliced */
  PE_NODE_SPARSE_MERGE,     /* one sparse gradient's rows, merged across places */
  PE_NODE_KIND_COUNT
} pe_node_kind;

const char *pe_node_kind_name(pe_node_kind k);
const char *pe_strategy_name(pe_graph_strategy s);
/* The default for places of kind `kind` and program p (may be NULL):
 * Sharded on cpu and sim places (bit-identical to AllReduce; the
 * memory-bound optimizer update runs once per slice, not once per place),
 * AllReduce on cuda (Sharded is not built there; NCCL all-reduce) and for
 * a program that clips gradients by their global norm (it needs them all on
 * every place). */
pe_graph_strategy pe_strategy_auto(pe_place_kind kind, const pe_program *p);

/* One unit of work.
 *
 * Var lists (in/out: SSA var ids; in_lv/out_lv: lvar ids, same layout minus
 * dummies):
 *  - PE_NODE_OP: data inputs grouped by the op def's input slots: the args of
 *    def slot s are in[in_slot[s] .. in_slot[s+1]) in desc order (an absent
 *    slot is an empty range); n_in_data = in_slot[def->n_inputs]. Outputs
 *    likewise with out_slot / n_out_data. Dummy vars follow the data vars
 *    (in[n_in_data .. n_in), out[n_out_data .. n_out)).
 *  - LOSS_GRAD_SCALE: no data inputs, out[0] = loss@GRAD on `place`; desc,
 *    def and slots are those of the fill_constant it replaces (dtype, shape),
 *    so it may run as that kernel with the value replaced. The executor fills it with
 *    n_p / N, where n_p is the rows of the batch given to place p and N the
 *    whole batch (mean losses then sum to the global mean's gradient).
 *  - collectives (place == -1): vars of several places, place-major; every
 *    var's place is in its own record, so no positional rule is needed to
 *    bind them. width = vars per place (1, or the bucket's gradient count).
 *      ALL_REDUCE / FUSED_ALL_REDUCE: in[p*width + k] -> out[p*width + k]
 *        (in-place sum: out is the next version of the same lvar);
 *      REDUCE: in[p*width + k] for every p -> out[k] on root;
 *      BROADCAST: in[k] on root -> out[i*width + k] on the i-th place
 *        other than root (places in increasing order).
 *      SPARSE_MERGE (width 2): in[p*2] = a sparse gradient's values and
 *        in[p*2 + 1] its rows (registry.h, PE_ROWS_SUFFIX) on place p; the
 *        places' rows merged (a row several places hold: its values summed
 *        in place order) into out[p*2], out[p*2 + 1] on every place (root
 *        -1, in place: the next versions) or into out[0], out[1] on root.
 *  - SHARDED_UPDATE (place == -1, root == 0): desc/def/src_op are the
 *    optimizer op's; in_slot/out_slot give one place's layout, and place p's
 *    inputs are in[p*w_in ..) with w_in = in_slot[def->n_inputs] (outputs
 *    likewise, w_out = out_slot[def->n_outputs]); width = w_in. It reads
 *    every place's Grad and writes every place's Param and state.
 *
 * Dependencies (filled by ssa): in_degree = number of distinct producer
 * nodes of all in[] (dummies included); succ = the distinct consumer nodes of
 * all out[] (dummies included), deduplicated, so every edge is counted once
 * on each side. An executor must honour every edge, dummy ones included,
 * with stream synchronisation (event wait) when the streams differ: the
 * memory plan relies on that ordering being transitive. */
typedef struct pe_graph_node {
  pe_node_kind kind;
  pe_stream_kind stream;
  int place;  /* place index, -1 for a collective spanning all places */
  int root;   /* REDUCE: owner place; BROADCAST: root place; SPARSE_MERGE: owner or -1 */
  int width;  /* collectives: vars per place; else 0 */
  int src_op; /* index of the op in its program block, -1 if none */
  char *name; /* dumps, messages: "matmul#3@p1", "all_reduce(fc_0.w@GRAD)" */

  const pe_op_desc *desc; /* OP, LOSS_GRAD_SCALE: points into graph->prog */
  const pe_op_def *def;   /* OP, LOSS_GRAD_SCALE: its registry row */

  int n_in, n_out; /* SSA var ids (after ssa) */
  int *in, *out;
  int n_in_data, n_out_data; /* data vars first, dummies after */
  int *in_slot, *out_slot;   /* OP: def->n_inputs+1 / def->n_outputs+1 offsets */

  int n_in_lv, n_out_lv; /* lvar ids, same layout as in/out without dummies */
  int *in_lv, *out_lv;

  /* Extra ordering: node ids that must complete before this one, beyond
   * the data dependencies (ssa turns each into a dummy var). */
  int n_after;
  int *after;

  int in_degree; /* static in-degree (distinct producer nodes) */
  int n_succ;
  int *succ; /* distinct successor node ids */

  bool reads_persistable;  /* reads a persistable lvar (an engine variable) */
  bool writes_persistable; /* writes one (optimizer, broadcast, startup init) */
  int bucket;              /* FUSED_ALL_REDUCE: bucket id; else -1 */
} pe_graph_node;

/* One program variable on one place. */
typedef struct pe_graph_lvar {
  const char *name; /* into graph->prog (undeclared names: graph strings) */
  int place;
  const pe_var_desc *desc; /* NULL only if the program lacks a declaration */
  bool persistable;
  bool feed;             /* per-place share of a feed (batch split along dim 0) */
  bool keep;             /* fetchable: loss or opts keep list; never shared */
  int buffer;            /* storage (identity until memory_plan) */
  int bucket;            /* parameter gradient stored in a fused bucket, else -1 */
  int64_t bucket_offset; /* byte offset in the bucket buffer */
  /* Size: total bytes when !per_sample; bytes per row of dim 0 (batch) when
   * per_sample (dim 0 is -1 and the rest are known); -1 when unknown until
   * run time (another -1 dim), such a var is never planned. */
  int64_t bytes;
  bool per_sample;
  int n_versions; /* after ssa */
  int *versions;  /* SSA var ids, version order */
} pe_graph_lvar;

/* One SSA variable. */
typedef struct pe_graph_var {
  int lvar;     /* -1 for a dummy */
  int place;    /* dummies: the producer's place (-1 for collectives) */
  int version;  /* 0 = value at graph entry (feeds, persistables) */
  int producer; /* node id, -1 when defined at entry */
  int n_consumers;
  int *consumers; /* node ids (a node reading it twice appears once) */
  bool dummy;
  bool persistable;
  int buffer; /* == lvars[lvar].buffer; -1 for a dummy */
} pe_graph_var;

/* Storage. Size for a per-place batch of b rows:
 *   max(fixed_bytes, sample_bytes * b)   (either part may be 0).
 * The executor allocates one block per buffer (for the batch of the run,
 * keeping capacity across runs) and gives each lvar stored in it a tensor
 * view with the lvar's own shape; an lvar with bucket >= 0 is stored in its
 * bucket instead and its (unshared) buffer entry is not allocated. Fetching
 * is safe for any lvar whose buffer is not shared (kept lvars and graph
 * outputs, whose final value nobody reads, never are); a shared one may
 * have been overwritten by a later occupant. */
typedef struct pe_graph_buffer {
  int place;
  pe_dtype dtype; /* of its first member (members may differ) */
  int64_t fixed_bytes;
  int64_t sample_bytes;
  bool persistable;
  bool shared; /* memory_plan gave it more than one lvar */
  int n_lvars;
  int *lvars; /* members, in lvar id order */
} pe_graph_buffer;

/* A fused all-reduce bucket (per place the same layout). Decision: the
 * gradients live inside the bucket buffer (no copy): lvar k of the bucket on
 * place p is a view at lvar->bucket_offset into bucket storage
 * (place p, `bytes` bytes), each offset aligned to 64 bytes. Parameter
 * gradients have static shapes, so the layout is fixed at compile time. An
 * executor that cannot make views may instead copy into the bucket before
 * the all-reduce and back after it, using the same offsets. */
typedef struct pe_graph_bucket {
  pe_dtype dtype; /* every gradient in a bucket has this dtype */
  int64_t bytes;  /* padded total */
  int n_grads;
  const char **grads; /* program var names (point into prog) */
  int64_t *offsets;   /* byte offset of each gradient */
  int node;           /* its FUSED_ALL_REDUCE node */
  int *lvars;         /* [n_places * n_grads], place-major */
} pe_graph_bucket;

typedef struct pe_graph {
  pe_program *prog; /* owned clone; desc/name pointers point into it */
  int block;        /* block of prog this graph runs (main or startup) */
  bool startup;     /* the startup graph: init on place 0, broadcast */

  pe_place_kind place_kind;
  int n_places;
  pe_place *places; /* [n_places]: place index -> device */
  pe_graph_strategy strategy;
  bool fuse;
  int64_t fuse_bucket_bytes;
  const char *loss; /* points into prog; NULL for the startup graph */

  int n_nodes, cap_nodes;
  pe_graph_node *nodes;
  int n_lvars, cap_lvars;
  pe_graph_lvar *lvars;
  int n_vars, cap_vars;
  pe_graph_var *vars;
  int n_buffers, cap_buffers;
  pe_graph_buffer *buffers;
  int n_buckets;
  pe_graph_bucket *buckets;

  /* Parameters (trainable, with a gradient) and their owner place under the
   * Reduce strategy (-1 under AllReduce). */
  int n_params;
  const char **params; /* names, point into prog */
  const char **grads;  /* their gradient names */
  int *owner;          /* [n_params] */

  bool ssa;     /* ssa pass done: vars, in/out, in_degree, succ valid */
  bool planned; /* memory_plan done */

  int n_strings; /* owned strings (names the program does not declare) */
  char **strings;

  /* Compile time only (never read by a run): "<place>:<name>" -> lvar id+1. */
  pe_strmap lvar_index;
} pe_graph;

/* --- construction (used by the passes) ----------------------------------- */
pe_status *pe_graph_new(const pe_program *p, int block, pe_place_kind kind, int n_places,
                        pe_graph **out);
void pe_graph_free(pe_graph *g);

/* The lvar of (name, place), created (with its own buffer) if absent. */
pe_status *pe_graph_lvar_get(pe_graph *g, const char *name, int place, int *out);
/* -1 if absent (compile-time index lookup). */
int pe_graph_lvar_find(const pe_graph *g, const char *name, int place);
/* A new buffer holding lvar (or empty when lvar < 0). */
pe_status *pe_graph_add_buffer(pe_graph *g, int lvar, int *out);
/* A string owned by the graph (NULL on out of memory). */
const char *pe_graph_strdup(pe_graph *g, const char *s);

/* Append a node (zeroed, root/bucket/src_op -1); returns its id. The pointer
 * is valid until the next append. */
pe_status *pe_graph_add_node(pe_graph *g, pe_node_kind kind, int place, int *out);
/* Insert at position `at` (node ids >= at shift by one; call before ssa, or
 * rebuild ssa afterwards). */
pe_status *pe_graph_insert_node(pe_graph *g, int at, pe_node_kind kind, int place, int *out);
void pe_graph_remove_node(pe_graph *g, int id);
pe_status *pe_graph_node_add_in(pe_graph *g, int node, int lvar);
pe_status *pe_graph_node_add_out(pe_graph *g, int node, int lvar);
pe_status *pe_graph_node_add_after(pe_graph *g, int node, int before);
pe_status *pe_graph_set_name(pe_graph *g, int node, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Whether node changes a persistable: writes_persistable, less the outputs
 * its op leaves as they were (pe_op_output_unchanged: batch_norm in test
 * mode "writes" its running statistics onto themselves). A main graph with
 * no such node is read-only (pe_srv_program.read_only). writes_persistable
 * itself stays: the executor orders those outputs as writes. */
bool pe_graph_node_updates_persistable(const pe_graph *g, int node);
/* Drop the SSA tables (vars, in/out, degrees, successors): ssa == false. */
void pe_graph_clear_ssa(pe_graph *g);

/* (Re)derive SSA vars, dummy vars, in-degrees and successors from the node
 * lvar lists and `after` edges; PE_ECYCLE naming a node on the cycle if the
 * dependencies are cyclic. Idempotent. */
pe_status *pe_graph_build_ssa(pe_graph *g);

/* Topological order check: every node's producers come earlier in some
 * order; fills order[n_nodes] if non-NULL. PE_ECYCLE on a cycle. */
pe_status *pe_graph_topo_order(const pe_graph *g, int *order);

/* Bytes of buffer b for a per-place batch of `batch` rows. */
int64_t pe_graph_buffer_bytes(const pe_graph *g, int b, int64_t batch);
/* Bytes of all non-persistable buffers for a per-place batch of `batch`
 * rows: planned (buffers as planned) and unplanned (one buffer per lvar);
 * buffers of unknown size count 0. Either pointer may be NULL. */
void pe_graph_memory_bytes(const pe_graph *g, int64_t batch, int64_t *planned, int64_t *unplanned);
/* Bytes of all non-persistable buffers, as planned, for a run of `batch`
 * rows split over the places as the executors split it (place p gets
 * batch / n_places rows, one more when p < batch % n_places): what one
 * step's temporaries take. Saturates at INT64_MAX. */
int64_t pe_graph_run_bytes(const pe_graph *g, int64_t batch);

/* Graphviz: one cluster per place, collectives outside; nodes colored by
 * kind, shaped by stream; dummy edges dashed. */
pe_status *pe_graph_dump_dot(const pe_graph *g, FILE *f);

#endif
