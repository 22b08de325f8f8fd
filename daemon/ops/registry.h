/* The op registry: one table row per op type (Redis-style behaviour as data).
 *
 * A row holds the op's slot and attribute schema, its shape/dtype inference,
 * its CPU kernel (plus per-op state for cached oneDNN primitives), and its
 * gradient maker. Grad ops ("<type>_grad") are rows too.
 *
 * Contract for kernels:
 *  - Slots are addressed by their index in the row's `inputs` / `outputs`
 *    arrays (each ops file defines an enum for its slots).
 *  - Before a kernel runs, the executor has run `infer` on the concrete input
 *    shapes and resized every output tensor to the inferred dtype/shape.
 *  - An optional slot that is absent (or a grad output the backward pass
 *    pruned) has n == 0; the kernel must skip it.
 *  - Attributes were validated against the schema at load time; read them with
 *    pe_attr_i / pe_attr_f / ... which fall back to the schema default.
 *  - Per-op state (*state, freed with state_free) belongs to one op instance
 *    in one executor; it caches primitives keyed by shape. A kernel is called
 *    by one thread at a time for a given op instance.
 *
 * Gradient convention (the default maker, pe_grad_default):
 *   grad op type  = "<type>_grad"
 *   grad inputs   = every forward input slot S (same args), every forward
 *                   output slot O (same args), and "O@GRAD" (args name@GRAD)
 *   grad outputs  = "S@GRAD" for every forward input slot S not marked
 *                   PE_SLOT_NO_GRAD (args name@GRAD)
 * The backward pass renames and prunes grad outputs afterwards. */
#ifndef PE_OPS_REGISTRY_H
#define PE_OPS_REGISTRY_H

#include <stdbool.h>

#include "core/place.h"
#include "core/rng.h"
#include "core/status.h"
#include "core/tensor.h"
#include "ir/program.h"

#define PE_GRAD_SUFFIX "@GRAD"
/* A sparse gradient (lookup_table_v2 with is_sparse) is two variables:
 * "x@GRAD" holds values [n, ...] of the rows that "x@GRAD@ROWS" [n] (i64)
 * names, ascending, -1 for an empty slot after the last row (padding_idx,
 * duplicates merged). The op writes the rows in an output slot
 * "S@GRAD@ROWS" beside "S@GRAD"; the update ops read them as GradRows. */
#define PE_ROWS_SUFFIX "@ROWS"

/* Slot flags */
#define PE_SLOT_NO_GRAD 0x1 /* no gradient flows to this input (labels, indices) */

typedef struct pe_slot_def {
  const char *name;
  int min, max; /* arity bounds; max -1 = unbounded; min 0 = optional */
  unsigned flags;
} pe_slot_def;

typedef struct pe_attr_def {
  const char *name;
  pe_attr_type type;
  bool required;
  double dflt;       /* default of INT/LONG/FLOAT/BOOL */
  const char *sdflt; /* default of STRING */
} pe_attr_def;

/* Op flags */
#define PE_OP_RANDOM 0x1    /* draws from the program's generator (ctx->rng) */
#define PE_OP_OPTIMIZER 0x2 /* updates a parameter in place */
#define PE_OP_NO_GRAD 0x4   /* never differentiated (metrics, creation ops) */
/* Optimizers only: element i of every output shaped like Param depends only
 * on element i of the inputs shaped like Param and on the small inputs
 * (learning rate, beta powers); small outputs depend only on small inputs.
 * So the kernel may run on any slice [lo, hi) of Param-shaped tensors with
 * the small ones whole (the sharded strategy, parallel/collective_nodes.c). */
#define PE_OP_ELEMENTWISE 0x8

/* Shape/dtype of one variable as inference sees it (-1 allowed at compile time). */
typedef struct pe_meta {
  pe_dtype dtype;
  pe_shape shape;
} pe_meta;

typedef struct pe_op_def pe_op_def;

typedef struct pe_meta_list {
  int n;
  const char *const *names; /* variable names, for messages */
  pe_meta **m;
} pe_meta_list;

/* Inference context: metas of the op's inputs, to be filled for its outputs.
 * At compile time shapes may hold -1; at run time they are concrete. */
typedef struct pe_infer_ctx {
  const pe_op_def *def;
  const pe_op_desc *desc;
  int op_index;      /* index in its block, for messages */
  bool runtime;      /* true when shapes are concrete */
  pe_meta_list *in;  /* [n slots of def->inputs] */
  pe_meta_list *out; /* [n slots of def->outputs]; m[k] are writable */
} pe_infer_ctx;

typedef struct pe_tensor_list {
  int n;
  pe_tensor **t;
} pe_tensor_list;

/* Per-place execution resources a kernel may use (oneDNN engine/stream,
 * intra-op thread budget). Owned by the executor; one per place. */
typedef struct pe_device_ctx pe_device_ctx;

typedef struct pe_kernel_ctx {
  const pe_op_def *def;
  const pe_op_desc *desc;
  int op_index;
  pe_tensor_list *in;  /* [def->n_inputs] */
  pe_tensor_list *out; /* [def->n_outputs] */
  void **state;        /* per-op-instance state slot, initially NULL */
  pe_rng *rng;         /* the program generator; ordered across ops */
  pe_device_ctx *dev;
  /* The row of the run's batch that this place's row 0 is (data parallel:
   * the rows of the places before it; 0 on one place), so that an error
   * naming a row names it in the batch the client fed. */
  int64_t batch_row0;
} pe_kernel_ctx;

/* Gradient maker context: append grad ops for `fwd` to `ops`. */
typedef struct pe_grad_ctx {
  const pe_op_def *def;
  const pe_op_desc *fwd;
  int n_ops, cap_ops;
  pe_op_desc **ops; /* grad ops made, owned by the ctx until taken */
} pe_grad_ctx;

struct pe_op_def {
  const char *type;
  const pe_slot_def *inputs; /* terminated by {NULL} */
  const pe_slot_def *outputs;
  const pe_attr_def *attrs;
  unsigned flags;
  pe_status *(*infer)(pe_infer_ctx *ctx);
  pe_status *(*kernel_cpu)(pe_kernel_ctx *ctx);
  void (*state_free)(void *state);
  /* NULL: the op has no gradient (backward errors if one is needed). */
  pe_status *(*grad)(pe_grad_ctx *ctx);
  /* NULL, or the input slot whose value the op, with op's attributes,
   * writes unchanged to output slot `out` (-1: none, or not unchanged):
   * batch_norm in test mode copies Mean to MeanOut and Variance to
   * VarianceOut. Read through pe_op_output_unchanged. */
  int (*output_copies)(const pe_op_def *d, const pe_op_desc *op, int out);
  /* filled by the registry at init */
  int n_inputs, n_outputs, n_attrs;
  /* CUDA kernel and its per-op state release, filled at init from the
   * table the cuda backend registered (pe_op_register_kernels); else NULL. */
  pe_status *(*kernel_cuda)(pe_kernel_ctx *ctx);
  void (*state_free_cuda)(void *state);
};

typedef pe_status *(*pe_kernel_fn)(pe_kernel_ctx *ctx);

/* One row of a device backend's kernel table (terminated by {NULL}). */
typedef struct pe_kernel_row {
  const char *type;
  pe_kernel_fn kernel;
  void (*state_free)(void *state);
} pe_kernel_row;

/* A device backend's kernel table for its kind (cuda), merged into the
 * rows when the registry is built. Called before the first lookup (a backend
 * does it when the program loads); the registry names no backend. */
void pe_op_register_kernels(pe_place_kind kind, const pe_kernel_row *rows);

/* The kernel of def for a place of `kind`: kernel_cpu for cpu and sim (sim
 * devices run on host memory), kernel_cuda for cuda. NULL when the op has
 * none there; executors report that as PE_EBACKEND naming op and place. */
pe_kernel_fn pe_op_kernel(const pe_op_def *d, pe_place_kind kind);
/* The matching per-op state release (may be NULL). */
void (*pe_op_state_free(const pe_op_def *d, pe_place_kind kind))(void *);

/* --- registry ------------------------------------------------------------ */
const pe_op_def *pe_op_lookup(const char *type); /* NULL if unknown */
int pe_op_count(void);
const pe_op_def *pe_op_at(int i);
int pe_op_input_index(const pe_op_def *d, const char *slot);  /* -1 if none */
int pe_op_output_index(const pe_op_def *d, const char *slot); /* -1 if none */
const pe_attr_def *pe_op_attr_def(const pe_op_def *d, const char *name);

/* Whether op leaves output slot `out` (an index into d->outputs) as it
 * was: its output_copies rule says it writes the value of an input slot
 * there, and that slot names the very same variables (batch_norm in test
 * mode with MeanOut = Mean, VarianceOut = Variance, as every program built
 * has them). Such an output is no update of a persistable: an eval program
 * with batch norm is read-only (pe_graph_node_updates_persistable). The
 * kernels may still store to it (the same value): the engine keeps
 * ordering it as a write. */
bool pe_op_output_unchanged(const pe_op_def *d, const pe_op_desc *op, int out);

/* Attributes with schema defaults (desc may lack optional ones). */
int64_t pe_attr_i(const pe_op_def *d, const pe_op_desc *op, const char *name);
float pe_attr_f(const pe_op_def *d, const pe_op_desc *op, const char *name);
bool pe_attr_b(const pe_op_def *d, const pe_op_desc *op, const char *name);
const char *pe_attr_s(const pe_op_def *d, const pe_op_desc *op, const char *name);
/* List attribute; returns element count, *v points into the desc (NULL if absent). */
int pe_attr_ints(const pe_op_desc *op, const char *name, const int64_t **v);
int pe_attr_floats(const pe_op_desc *op, const char *name, const float **v);

/* --- helpers for infer functions ----------------------------------------- */
/* Error naming op index, type, and message: "op #3 (matmul): ..." */
pe_status *pe_infer_error(const pe_infer_ctx *c, pe_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline pe_meta *pe_in_meta(pe_infer_ctx *c, int slot, int k) {
  return k < c->in[slot].n ? c->in[slot].m[k] : NULL;
}
static inline pe_meta *pe_out_meta(pe_infer_ctx *c, int slot, int k) {
  return k < c->out[slot].n ? c->out[slot].m[k] : NULL;
}
static inline const char *pe_in_name(pe_infer_ctx *c, int slot, int k) {
  return k < c->in[slot].n ? c->in[slot].names[k] : "";
}
/* Set every output in `slot` (if present) to dtype/shape. */
void pe_infer_set(pe_infer_ctx *c, int slot, pe_dtype dt, const pe_shape *shape);
/* Require input (slot,k) to have dtype dt; error names var and shapes. */
pe_status *pe_infer_expect_dtype(pe_infer_ctx *c, int slot, int k, pe_dtype dt);
/* Generic infer for "<type>_grad" rows: output "S@GRAD" k gets the meta of
 * input "S" k. */
pe_status *pe_infer_grad_like_inputs(pe_infer_ctx *c);
/* Generic infer: every output gets the meta of input slot 0, arg 0. */
pe_status *pe_infer_same_as_first(pe_infer_ctx *c);

/* --- helpers for kernels -------------------------------------------------- */
static inline pe_tensor *pe_kin(pe_kernel_ctx *c, int slot, int k) {
  return k < c->in[slot].n ? c->in[slot].t[k] : NULL;
}
static inline pe_tensor *pe_kout(pe_kernel_ctx *c, int slot, int k) {
  return k < c->out[slot].n ? c->out[slot].t[k] : NULL;
}
pe_status *pe_kernel_error(const pe_kernel_ctx *c, pe_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Intra-op thread budget of this place (>= 1). */
int pe_kernel_threads(const pe_kernel_ctx *c);
/* What a random kernel draws from: counters reserved from the program
 * generator c->rng (*gen), with the op's INT attribute "seed" as the seed
 * when it is non-zero, the generator's own seed otherwise (*seed). An op
 * seed gives the op its own stream without its own counter: the program's
 * whole random state stays the generator's offset, which a checkpoint
 * saves, so a restored model draws what an uninterrupted one would. */
pe_status *pe_kernel_rng(pe_kernel_ctx *c, pe_rng **gen, uint64_t *seed);

/* --- helpers for gradient makers ---------------------------------------- */
pe_status *pe_grad_default(pe_grad_ctx *g);
/* Append a new op of `type` to g; returns it for filling. */
pe_status *pe_grad_new_op(pe_grad_ctx *g, const char *type, pe_op_desc **out);
/* name -> name@GRAD into buf */
const char *pe_grad_name(const char *var, char *buf, size_t len);
/* The rows variable op writes for its gradient output `grad` (a sparse
 * gradient), or NULL when op writes `grad` dense or not at all. */
const char *pe_op_sparse_rows(const pe_op_desc *op, const char *grad);
/* True when `name` is a sparse gradient's rows variable ("...@GRAD@ROWS"). */
bool pe_is_sparse_rows_name(const char *name);
void pe_grad_ctx_init(pe_grad_ctx *g, const pe_op_def *def, const pe_op_desc *fwd);
void pe_grad_ctx_destroy(pe_grad_ctx *g); /* frees ops not taken */

#endif
