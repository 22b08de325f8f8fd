/* One pass interface for every program transformation (seed 003's
 * Converter). A pass rewrites the program in place; the pass manager runs a
 * named list of them and re-validates after each rewriting pass, so a
 * broken pass is caught where it happens.
 *
 * Standard pipelines:
 *   train: validate, backward, optimizer, validate
 *   test:  validate, inference      (sets is_test on dropout / batch_norm)
 */
#ifndef PE_COMPILER_PASS_H
#define PE_COMPILER_PASS_H

#include "compiler/program.h"

typedef struct pe_pass_opts {
  const char *loss; /* overrides the program's loss when set */
} pe_pass_opts;

typedef struct pe_pass {
  const char *name;
  const char *doc;
  pe_status *(*run)(pe_program *p, const pe_pass_opts *o);
  bool rewrites; /* the manager re-validates after a rewriting pass */
} pe_pass;

/* The whole pass table (n entries), for listing the passes. */
const pe_pass *pe_pass_table(int *n);

const pe_pass *pe_pass_lookup(const char *name);
pe_status *pe_pass_run(pe_program *p, const char *name, const pe_pass_opts *o);
/* Comma-separated list: "validate,backward,optimizer". */
pe_status *pe_passes_run(pe_program *p, const char *list, const pe_pass_opts *o);
/* Standard pipelines (see above). A program without a loss compiles as
 * "validate" only; for_test never runs backward. The manager validates after
 * every rewriting pass, so "validate,backward,optimizer" ends validated. */
pe_status *pe_program_compile(pe_program *p, bool for_test);

/* The passes (each in its own file). */
pe_status *pe_pass_validate(pe_program *p, const pe_pass_opts *o);
/* Backward: append grad ops for the loss of the main block (x@GRAD), sum
 * gradients of variables used more than once, prune what needs no gradient. */
pe_status *pe_pass_backward(pe_program *p, const pe_pass_opts *o);
/* Optimizer: for every trainable parameter (persistable, !stop_gradient,
 * with a gradient) append an update op; the learning rate is a persistable
 * variable "learning_rate" initialised in the startup block, as is optimizer
 * state (velocity, moments, beta powers). proto3 cannot tell an unset field
 * from 0, so momentum, beta1, beta2 and epsilon equal to 0 mean the defaults
 * 0.9, 0.9, 0.999, 1e-8. No optimizer type: the pass does nothing. */
pe_status *pe_pass_optimizer(pe_program *p, const pe_pass_opts *o);
pe_status *pe_pass_inference(pe_program *p, const pe_pass_opts *o);

#endif
