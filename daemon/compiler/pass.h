/* One pass interface for every transformation,
 * program passes and graph passes alike. A pass takes one compile unit, the
 * pe_ir: program passes (validate, backward, optimizer, inference) rewrite
 * ir->prog in place; data_parallel builds ir->graph (and ir->startup) from
 * the program; the other graph passes rewrite ir->graph. The pass manager
 * runs a named list of them, re-validates the program after each rewriting
 * program pass, so a broken pass is caught where it happens, and checks the
 * graph invariants (no cycle) after each graph pass that rebuilds SSA.
 *
 * Standard pipelines:
 *   train: validate, backward, optimizer, validate
 *   test:  validate, inference      (sets is_test on dropout / batch_norm)
 *   parallel train: validate, backward, optimizer, validate, data_parallel,
 *                   ssa, fuse_allreduce, memory_plan
 * With opts->fuse_conv_act on cpu or sim places, fuse_conv_act and
 * fuse_add_act run after the first validate (before backward), and
 * layout_blocked after the program passes.
 */
#ifndef PE_COMPILER_PASS_H
#define PE_COMPILER_PASS_H

#include <stdatomic.h>

#include "compiler/graph.h"
#include "ir/program.h"

/* Default fuse bucket: large enough to amortise a collective's latency,
 * small enough that the first bucket starts while backward still runs. */
#define PE_FUSE_BUCKET_BYTES_DEFAULT (4 * 1024 * 1024)

typedef struct pe_pass_opts {
  const char *loss; /* overrides the program's loss when set */
  /* Graph passes. Zero-initialised opts mean: one cpu place, AllReduce,
   * no fusion, no dump. */
  pe_place_kind place_kind;
  int n_places;               /* 0: 1 */
  pe_graph_strategy strategy; /* PE_STRATEGY_ALLREDUCE / _REDUCE / _SHARDED */
  bool fuse;                  /* fuse_allreduce: false keeps one per gradient */
  int64_t fuse_bucket_bytes;  /* 0: PE_FUSE_BUCKET_BYTES_DEFAULT */
  const char *dump_path;      /* "dump" pass target (NULL: stderr) */
  /* Variables that must stay fetchable (never share a buffer); the loss
   * always does. */
  int n_keep;
  const char *const *keep;
  /* Per-place batch rows for memory_plan's log line (0: 32). */
  int64_t batch_hint;
  /* Run the op-fusion passes fuse_conv_act (conv2d or matmul + bias add +
   * relu, batch_norm + relu, as one op) and fuse_add_act (elementwise_add
   * + relu) on cpu and sim places; off in zero-initialised opts. */
  bool fuse_conv_act;
  /* Read before each pass: once set (the daemon's stopping flag), the
   * compile stops there, PE_EIO "<cancel_why>: stopped before pass P". A
   * pass takes about 1 s per 100k ops. NULL: never. */
  const atomic_bool *cancel;
  const char *cancel_why;
  /* The model trains in a job across nodes (engine/node_comm.h): every
   * gradient gets its all_reduce node even on one place, where the
   * executor sums it over the nodes. AllReduce strategy only. */
  bool cross_nodes;
} pe_pass_opts;

/* The compile unit every pass takes. prog is borrowed (the caller owns it);
 * graph and startup, once built, are owned by the ir: pe_ir_destroy frees
 * them, or the caller takes them (and sets the fields to NULL). */
typedef struct pe_ir {
  pe_program *prog;
  pe_graph *graph;          /* main graph, replicated over places */
  pe_graph *startup;        /* startup graph: init on place 0 + broadcast; NULL if
                               the program has no startup block */
  const pe_pass_opts *opts; /* NULL: all defaults */
} pe_ir;

void pe_ir_destroy(pe_ir *ir); /* frees graph and startup, not prog */

typedef enum pe_pass_target {
  PE_PASS_PROGRAM = 0, /* acts on ir->prog */
  PE_PASS_GRAPH = 1,   /* acts on ir->graph (data_parallel: builds it) */
} pe_pass_target;

typedef struct pe_pass {
  const char *name;
  const char *doc;
  pe_status *(*run)(pe_ir *ir);
  bool rewrites; /* program passes: the manager re-validates afterwards */
  pe_pass_target target;
} pe_pass;

/* The whole pass table (n entries), for listing the passes. */
const pe_pass *pe_pass_table(int *n);

const pe_pass *pe_pass_lookup(const char *name);
pe_status *pe_pass_run(pe_ir *ir, const char *name);
/* Comma-separated list: "validate,backward,optimizer". */
pe_status *pe_passes_run(pe_ir *ir, const char *list);
/* Standard pipelines (see above) on a program. A program without a loss
 * compiles as "validate" only; for_test never runs backward. The manager
 * validates after every rewriting pass, so "validate,backward,optimizer" ends
 * validated. */
pe_status *pe_program_compile(pe_program *p, bool for_test);
/* The same with options (NULL: defaults): loss, keep, and fuse_conv_act,
 * which then runs the op-fusion passes after the first validate
 * (place_kind as for graphs). */
pe_status *pe_program_compile_opts(pe_program *p, bool for_test, const pe_pass_opts *opts);
/* The parallel pipeline on ir->prog with ir->opts (NULL: defaults):
 * pe_program_compile's train (or test) passes, then data_parallel, ssa,
 * fuse_allreduce (when opts->fuse), memory_plan, and dump when
 * opts->dump_path is set. The graphs are left in ir (pe_ir_destroy). */
pe_status *pe_graph_compile(pe_ir *ir, bool for_test);

/* --- program passes (each in its own file) -------------------------------- */
pe_status *pe_pass_validate(pe_ir *ir);
/* Backward: append grad ops for the loss of the main block (x@GRAD), sum
 * gradients of variables used more than once, prune what needs no gradient. */
pe_status *pe_pass_backward(pe_ir *ir);
/* Optimizer: for every trainable parameter (persistable, !stop_gradient,
 * with a gradient) append an update op; the learning rate is a persistable
 * variable "learning_rate" initialised in the startup block, as is optimizer
 * state (velocity, moments, beta powers). proto3 cannot tell an unset field
 * from 0, so momentum, beta1, beta2 and epsilon equal to 0 mean the defaults
 * 0.9, 0.9, 0.999, 1e-8. No optimizer type: the pass does nothing. */
pe_status *pe_pass_optimizer(pe_ir *ir);
pe_status *pe_pass_inference(pe_ir *ir);
/* fuse_conv_act: conv2d -> elementwise_add (bias, axis 1) [-> relu] into one
 * conv2d with Bias [and fuse_activation relu], and likewise matmul ->
 * elementwise_add (bias [N], axis x_num_col_dims or -1) [-> relu] into one
 * matmul, and batch_norm -> relu into one batch_norm with fuse_activation
 * relu, where the intermediates are temporaries nobody else reads or
 * fetches (pass_fuse_conv_act.c). */
pe_status *pe_pass_fuse_conv_act(pe_ir *ir);
/* fuse_add_act: elementwise_add (X and Y of the same shape) -> relu into one
 * elementwise_add with fuse_activation relu, where the sum is a temporary
 * nobody else reads or fetches (pass_fuse_add_act.c). */
pe_status *pe_pass_fuse_add_act(pe_ir *ir);
/* layout_blocked (pass_layout.c): mark the activations that stay in oneDNN's
 * blocked layout between conv2d, pool2d and their gradients (the ops'
 * "layout_blocked" attribute; ops/cpu/dnnl_act_layout.h). Runs after the
 * standard pipeline where the fusion passes run, when the process's
 * conv_layout mode is blocked. */
pe_status *pe_pass_layout_blocked(pe_ir *ir);

/* --- graph passes (daemon/compiler/pass_<name>.c) ------------------------- */
/* data_parallel: build ir->graph (main block replicated on every place,
 * loss_grad_scale per place, one all_reduce per parameter gradient after its
 * last writer, or reduce/optimizer-on-owner/broadcast under Reduce) and
 * ir->startup (startup ops on place 0, one broadcast per persistable). */
pe_status *pe_pass_data_parallel(pe_ir *ir);
/* ssa: versions, dummy vars, in-degrees, successors, cycle check, on
 * ir->graph and ir->startup. */
pe_status *pe_pass_ssa(pe_ir *ir);
/* fuse_allreduce: when opts->fuse, replace per-gradient all_reduce nodes by
 * fused_all_reduce buckets of at most fuse_bucket_bytes; rebuilds SSA. */
pe_status *pe_pass_fuse_allreduce(pe_ir *ir);
/* memory_plan: share buffers between temporaries whose lifetimes are
 * ordered by the graph; logs planned vs unplanned bytes. */
pe_status *pe_pass_memory_plan(pe_ir *ir);
/* dump: Graphviz of ir->graph to opts->dump_path (stderr if NULL). */
pe_status *pe_pass_dump(pe_ir *ir);

#endif
