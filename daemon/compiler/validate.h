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

#include "compiler/program.h"

pe_status *pe_program_validate(pe_program *p);
pe_status *pe_block_validate(pe_program *p, pe_block *b);

#endif
