/* The in-memory program IR: what a ProgramDesc decodes into and what the
 * compiler's program passes (backward, optimizer) rewrite. It mirrors
 * proto/program.proto but is easy to mutate: plain arrays with counts,
 * every string owned by the object that holds it.
 *
 * Ownership: a pe_program owns its blocks; a block owns its vars and ops;
 * an op owns its slots and attrs. pe_program_free releases everything.
 * Thread-safety: none; programs are built and rewritten on one thread and
 * are read-only once compiled into an executor. */
#ifndef PE_COMPILER_PROGRAM_H
#define PE_COMPILER_PROGRAM_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"
#include "core/strmap.h"

typedef enum pe_attr_type {
  PE_ATTR_INT = 0,
  PE_ATTR_FLOAT = 1,
  PE_ATTR_STRING = 2,
  PE_ATTR_BOOL = 3,
  PE_ATTR_INTS = 4,
  PE_ATTR_FLOATS = 5,
  PE_ATTR_STRINGS = 6,
  PE_ATTR_BOOLS = 7,
  PE_ATTR_BLOCK = 8,
  PE_ATTR_LONG = 9,
  PE_ATTR_TYPE_COUNT
} pe_attr_type;

const char *pe_attr_type_name(pe_attr_type t);

typedef struct pe_attr {
  char *name;
  pe_attr_type type;
  int64_t i; /* INT, LONG, BOOL (0/1), BLOCK (block index) */
  float f;
  char *s;
  int n;          /* element count of the list kinds */
  int64_t *ints;  /* INTS, BOOLS */
  float *floats;  /* FLOATS */
  char **strings; /* STRINGS */
} pe_attr;

typedef struct pe_slot {
  char *name; /* "X", "Out", "X@GRAD" */
  int n;
  char **args; /* variable names; "" never appears (absent = not listed) */
} pe_slot;

typedef struct pe_op_desc {
  char *type;
  int n_in, n_out, n_attr;
  pe_slot *in, *out;
  pe_attr *attrs;
} pe_op_desc;

typedef struct pe_var_desc {
  char *name;
  pe_dtype dtype;
  pe_shape shape;
  bool persistable;
  bool stop_gradient;
  bool is_feed;
  bool no_weight_decay; /* the optimizer's weight decay skips it (persistable only) */
  /* Set by the fuse_conv_act pass on an intermediate it fused away (the
   * declaration stays, unused): the op that now computes through it, for
   * the error of a fetch that names it ("matmul writing 'x' (matmul+bias
   * add+relu)"). Owned; NULL otherwise. */
  char *fused_into;
} pe_var_desc;

typedef struct pe_block {
  int idx, parent;
  int n_vars, cap_vars;
  pe_var_desc **vars;
  pe_strmap var_index; /* name -> pe_var_desc* (this block only) */
  int n_ops, cap_ops;
  pe_op_desc **ops;
} pe_block;

/* A learning-rate schedule as the program states it (proto LrSchedule;
 * ops/lr_schedule.h has the formula and the checks). */
#define PE_LR_MAX_MILESTONES 32
typedef struct pe_lr_schedule_desc {
  char *type; /* constant | step | multistep | exponential | cosine | linear; NULL: none */
  int64_t warmup_steps, decay_steps;
  float gamma, min_lr; /* 0: unset */
  int n_milestones;
  int64_t milestones[PE_LR_MAX_MILESTONES];
} pe_lr_schedule_desc;

typedef struct pe_optimizer_desc {
  char *type; /* sgd | momentum | adam | adamw; NULL: none */
  float lr, momentum, beta1, beta2, epsilon;
  float weight_decay;   /* L2 (adamw: decoupled) coefficient; 0: none (adamw: 0.01) */
  float grad_clip_norm; /* clip gradients to this global L2 norm; 0: none */
  bool nesterov;
  pe_lr_schedule_desc sched;
} pe_optimizer_desc;

/* OptimizerDesc.type values (the optimizer pass's table, compiler/optimizer.c). */
#define PE_OPTIMIZER_TYPES "sgd, momentum, adam, adamw"
#define PE_ADAMW_DEFAULT_DECAY 0.01f /* adamw's weight_decay when 0 (PyTorch's) */
/* The persistable learning rate the optimizer pass declares (opt.lr at startup). */
#define PE_LR_NAME "learning_rate"
/* The gradients' global norm before clipping (opt.grad_clip_norm), fetchable. */
#define PE_GRAD_NORM_NAME "@GRAD_GLOBAL_NORM@"
bool pe_optimizer_type_known(const char *type);

/* The newest ProgramDesc.version this daemon reads (0: unset, read as 1). A
 * newer format may mean things it would misread: refused at decode. */
#define PE_PROGRAM_VERSION 1

typedef struct pe_program {
  uint32_t version;
  int n_blocks;
  pe_block **blocks;
  int main_block;
  int startup_block; /* -1: none */
  char *loss;        /* NULL: no training */
  pe_optimizer_desc opt;
} pe_program;

/* --- construction ------------------------------------------------------ */
pe_program *pe_program_new(void);
void pe_program_free(pe_program *p);
pe_status *pe_program_clone(const pe_program *p, pe_program **out);
/* Append a block with the given parent (-1 for root). */
pe_status *pe_program_add_block(pe_program *p, int parent, pe_block **out);
pe_block *pe_program_main(const pe_program *p);
pe_block *pe_program_startup(const pe_program *p); /* NULL if none */

/* Add a variable; an existing name with the same name is an error. */
pe_status *pe_block_add_var(pe_block *b, const char *name, pe_dtype dt, const pe_shape *shape,
                            pe_var_desc **out);
/* Find in b, then its ancestors in p. */
pe_var_desc *pe_block_find_var(const pe_program *p, const pe_block *b, const char *name);
pe_var_desc *pe_block_find_var_local(const pe_block *b, const char *name);
/* The error of an executor's fetch of `name` when it is an intermediate of b
 * that op fusion removed (fused_into set): PE_EUNKNOWN_VAR naming the op that
 * absorbed it and how to keep it. NULL when name is not one. Both executors
 * use it, so their messages are the same. */
pe_status *pe_fetch_fused_error(const pe_program *p, const pe_block *b, const char *name);

/* Append an op of `type`, with no slots or attrs yet; the block owns it. */
pe_status *pe_block_append_op(pe_block *b, const char *type, pe_op_desc **out);
/* Insert at position `at` (0..n_ops). */
pe_status *pe_block_insert_op(pe_block *b, int at, const char *type, pe_op_desc **out);
void pe_block_remove_op(pe_block *b, int at);

pe_op_desc *pe_op_desc_new(const char *type);
void pe_op_desc_free(pe_op_desc *op);
pe_status *pe_op_desc_clone(const pe_op_desc *op, pe_op_desc **out);

/* Set slot `name` to the given args (replacing any previous list). */
pe_status *pe_op_set_input(pe_op_desc *op, const char *slot, int n, const char *const *args);
pe_status *pe_op_set_output(pe_op_desc *op, const char *slot, int n, const char *const *args);
/* Append slot `name`, which op does not have (the caller knows its names
 * differ: a decoded op, a copy): no search, so building an op of many
 * slots costs its size. */
pe_status *pe_op_append_input(pe_op_desc *op, const char *slot, int n, const char *const *args);
pe_status *pe_op_append_output(pe_op_desc *op, const char *slot, int n, const char *const *args);
/* One-argument shorthands. */
pe_status *pe_op_input1(pe_op_desc *op, const char *slot, const char *arg);
pe_status *pe_op_output1(pe_op_desc *op, const char *slot, const char *arg);
pe_slot *pe_op_find_input(const pe_op_desc *op, const char *slot);
pe_slot *pe_op_find_output(const pe_op_desc *op, const char *slot);
/* The single argument of a slot, or NULL if the slot is absent or empty. */
const char *pe_op_input_arg(const pe_op_desc *op, const char *slot);
const char *pe_op_output_arg(const pe_op_desc *op, const char *slot);

/* Attributes: setting replaces an attribute of the same name. */
pe_status *pe_op_set_int(pe_op_desc *op, const char *name, int64_t v);
pe_status *pe_op_set_long(pe_op_desc *op, const char *name, int64_t v);
pe_status *pe_op_set_float(pe_op_desc *op, const char *name, float v);
pe_status *pe_op_set_bool(pe_op_desc *op, const char *name, bool v);
pe_status *pe_op_set_string(pe_op_desc *op, const char *name, const char *v);
pe_status *pe_op_set_ints(pe_op_desc *op, const char *name, int n, const int64_t *v);
pe_status *pe_op_set_floats(pe_op_desc *op, const char *name, int n, const float *v);
pe_status *pe_op_set_bools(pe_op_desc *op, const char *name, int n, const bool *v);
pe_status *pe_op_set_strings(pe_op_desc *op, const char *name, int n, const char *const *v);
pe_status *pe_op_set_block(pe_op_desc *op, const char *name, int block_idx);
/* Deep-copy an attribute into op (replacing). */
pe_status *pe_op_set_attr(pe_op_desc *op, const pe_attr *a);
/* Deep-copy an attribute that op does not have (as pe_op_append_input). */
pe_status *pe_op_append_attr(pe_op_desc *op, const pe_attr *a);
pe_attr *pe_op_find_attr(const pe_op_desc *op, const char *name);

/* --- protobuf ------------------------------------------------------------ */
/* Decode and structurally check (enums, counts, dims, names); semantic
 * validation (ops, shapes, order) is pe_program_validate's job. Sizes are
 * capped by the caller (transport). */
pe_status *pe_program_decode(const uint8_t *buf, size_t len, pe_program **out);
/* Bounds on the ops and the variables of all blocks together (0: none), with
 * the names of the settings that hold them for the message; on each op's
 * input slots, output slots and attributes (0: none); and the allocator
 * protobuf-c's unpack uses (NULL: its default; a budget's, which fails the
 * unpack past its limit: server/decode_budget.h). */
struct ProtobufCAllocator;
typedef struct pe_decode_limits {
  int64_t max_ops, max_vars;
  const char *ops_key, *vars_key;
  int max_op_entries;
  struct ProtobufCAllocator *alloc;
} pe_decode_limits;
/* pe_program_decode that refuses (PE_EINVAL, naming the count, the bound
 * and its key) a program over lim's bounds before unpacking any of it
 * (program_scan.h): the unpack's memory and the passes' time grow with
 * the ops. An unpack that lim's allocator fails is "malformed" here; the
 * allocator's owner knows why. */
pe_status *pe_program_decode_limited(const uint8_t *buf, size_t len, const pe_decode_limits *lim,
                                     pe_program **out);
/* Check a protobuf OptimizerDesc (type, hyper-parameters, lr_schedule) and
 * replace *out with it (out owns its strings); an empty type leaves *out as
 * it is. Decode and Register's optimizer override both use it. */
struct Pe__OptimizerDesc;
pe_status *pe_optimizer_decode(const struct Pe__OptimizerDesc *od, pe_optimizer_desc *out);
/* Encode to freshly malloc'd bytes. */
pe_status *pe_program_encode(const pe_program *p, uint8_t **buf, size_t *len);

#endif
