/* Internals shared by validate.c and validate_order.c. */
#ifndef PE_COMPILER_VALIDATE_INTERNAL_H
#define PE_COMPILER_VALIDATE_INTERNAL_H

#include "compiler/validate.h"
#include "core/strmap.h"

/* "block B: op #I (type): <fmt>" */
pe_status *pe_validate_op_error(const pe_block *b, int i, const pe_op_desc *op, pe_code code,
                                const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Definition tracking for one block walked in program order. */
typedef struct pe_def_tracker {
  pe_strmap written; /* names written by an op already walked (value unused) */
} pe_def_tracker;

pe_status *pe_def_tracker_init(pe_def_tracker *t);
void pe_def_tracker_destroy(pe_def_tracker *t);
/* Every input of op i must be defined (validate.h's definition rule); the
 * error is PE_EUSE_BEFORE_DEF or PE_ECYCLE. */
pe_status *pe_def_tracker_check(pe_def_tracker *t, const pe_program *p, const pe_block *b, int i);
/* Record op's outputs as defined. */
pe_status *pe_def_tracker_write(pe_def_tracker *t, const pe_op_desc *op);

#endif
