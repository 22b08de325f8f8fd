/* Test harness for single ops: binds an op's slots to tensors of a scope,
 * runs runtime inference, sizes the outputs and calls the CPU kernel, the
 * way an executor does (ph_run_op with fresh per-op state every call,
 * ph_op_inst with state kept across calls). Also a central-difference
 * gradient checker that drives the op's gradient maker. */
#ifndef PE_TESTS_OP_HARNESS_H
#define PE_TESTS_OP_HARNESS_H

#include <stdarg.h>

#include "core/scope.h"
#include "ops/device_ctx.h"
#include "ops/registry.h"

/* Set scope var `name` to an f32 tensor of `shape` with values v (copied). */
pe_tensor *ph_set_f32(pe_scope *s, const char *name, pe_shape shape, const float *v);
pe_tensor *ph_set_i64(pe_scope *s, const char *name, pe_shape shape, const int64_t *v);
/* Fill with deterministic uniform values in [lo, hi). */
pe_tensor *ph_set_uniform(pe_scope *s, const char *name, pe_shape shape, float lo, float hi,
                          uint64_t seed);
pe_tensor *ph_get(pe_scope *s, const char *name); /* NULL if absent */
/* Set var `name` to dtype and shape only, no data (dims may be -1): an input
 * for compile-time inference (ph_infer_op). */
void ph_set_meta(pe_scope *s, const char *name, pe_dtype dt, pe_shape shape);

/* Run one op. Uses generator *rng (may be NULL: a fixed one). */
pe_status *ph_run_op(pe_scope *s, const pe_op_desc *op, pe_rng *rng);

/* Compile-time inference only: metas come from the scope tensors, but with
 * the dims of `batch_unknown` inputs' dim 0 replaced by -1 when set. */
pe_status *ph_infer_op(pe_scope *s, const pe_op_desc *op, pe_meta *out_metas, int max_out);

/* An op instance as an executor keeps one: `state` lives across runs and is
 * freed with the row's state_free by ph_op_inst_free. Slots are bound to the
 * scope's variables on every run (shapes may change between runs; the scope
 * may differ too). The desc is not copied: attributes set on it later are
 * seen by later runs. */
typedef struct ph_op_inst {
  const pe_op_desc *op;
  const pe_op_def *def; /* NULL for an unknown type (runs fail) */
  pe_device_ctx *dev;   /* NULL: the harness's device */
  void *state;
} ph_op_inst;

ph_op_inst *ph_op_inst_new(const pe_op_desc *op, pe_device_ctx *dev);
/* Run on s's variables with generator *rng (NULL: a fixed one). */
pe_status *ph_op_inst_run(ph_op_inst *inst, pe_scope *s, pe_rng *rng);
void ph_op_inst_free(ph_op_inst *inst);

typedef struct ph_grad_report {
  double max_err;    /* max over checked elements of |a-n| / max(1,|a|,|n|) */
  const char *worst; /* var with the max error */
  int64_t worst_index;
  double analytic, numeric; /* at the worst element */
  int checked;
} ph_grad_report;

/* Check d L / d wrt[j] where L = sum over outputs `outs` of sum(w .* out),
 * w fixed pseudo-random in [0.5, 1.5). Analytic gradients come from the op's
 * gradient maker and grad kernels; numeric ones from central differences with
 * step eps on at most max_elems elements per input (evenly spaced). Outputs
 * with a @GRAD input not in `outs` get zero gradients. Forward runs reuse one
 * generator state, so random ops are deterministic. */
pe_status *ph_grad_check(pe_scope *s, const pe_op_desc *fwd, const char *const *outs, int n_outs,
                         const char *const *wrt, int n_wrt, double eps, int max_elems,
                         ph_grad_report *rep);

/* Build an op desc quickly: ph_op("relu", "X", "x", NULL, "Out", "y", NULL).
 * Inputs first, NULL, outputs, NULL; one arg per slot; attrs set after. */
pe_op_desc *ph_op(const char *type, ...);
/* Add the slots of such a list (inputs, NULL, outputs, NULL) to op. */
pe_status *ph_op_add_slots(pe_op_desc *op, va_list ap);

#endif
