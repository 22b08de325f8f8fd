/* Program validation, run when a program is loaded and again after each
 * rewriting pass. Checks, in this order, per block, op by op:
 *   unknown op (PE_EUNKNOWN_OP), unknown variable (PE_EUNKNOWN_VAR),
 *   slot arity and unknown slots (PE_EARITY), attributes missing or of the
 *   wrong type (PE_EATTR), use before definition (PE_EUSE_BEFORE_DEF),
 *   cycles (PE_ECYCLE), and dtype/shape mismatches after inference
 *   (PE_EDTYPE / PE_ESHAPE).
 * Every message names the block, the op index and type, the variable and
 * the shapes involved.
 *
 * Definition rule: a variable is defined at the start of a block if it is
 * persistable or a feed; otherwise by the first op that writes it. Reading a
 * variable before its first writer is a cycle if that writer depends
 * (transitively, through data) on the reading op, and a use before
 * definition otherwise.
 *
 * Inference writes the inferred dtype/shape of every op output into the var
 * descs of the block where none was declared (ndim == 0). */
#ifndef PE_COMPILER_VALIDATE_H
#define PE_COMPILER_VALIDATE_H

#include "ir/program.h"

/* Validates the startup block first (its inference fills in the shapes of
 * the persistables it initialises), then every other block in index order.
 * Attributes not in the op's schema are rejected (PE_EATTR), except that a
 * "<type>_grad" op may carry the attributes of "<type>" (the default gradient
 * maker copies them). INT and LONG are interchangeable. */
pe_status *pe_program_validate(pe_program *p);
pe_status *pe_block_validate(pe_program *p, pe_block *b);

/* Where a name resolves, as validation and the executors see it. */
typedef enum pe_var_scope_kind {
  PE_VAR_LOCAL,    /* declared in the block itself */
  PE_VAR_ANCESTOR, /* declared in a parent block (control-flow sub-blocks) */
  PE_VAR_MAIN,     /* startup block only: declared in the main block */
} pe_var_scope_kind;

/* Find `name` for block b: b, then its ancestors, then, when b is the startup
 * block, the main block (startup ops write the main block's persistables).
 * NULL if undeclared. `where` may be NULL. */
pe_var_desc *pe_program_resolve_var(const pe_program *p, const pe_block *b, const char *name,
                                    pe_var_scope_kind *where);

#endif
