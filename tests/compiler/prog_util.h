/* Helpers for tests that build programs with the IR API (header-only, used
 * by tests/compiler and tests/engine). They abort the test on any failure of
 * the construction calls themselves. */
#ifndef PE_TESTS_PROG_UTIL_H
#define PE_TESTS_PROG_UTIL_H

#include <check.h>
#include <stdarg.h>
#include <string.h>

#include "ir/program.h"
#include "op_harness.h"
#include "test_assert.h"

/* PU_OK and pu_expect are PE_CK_OK and expect_errors of test_assert.h. */
#define PU_OK(expr) PE_CK_OK(expr)
#define pu_expect expect_errors

/* Declare a variable; ndim 0 (shape NULL) leaves it to inference. */
static inline pe_var_desc *pu_var(pe_block *b, const char *name, pe_dtype dt,
                                  const pe_shape *shape) {
  pe_var_desc *v;
  PU_OK(pe_block_add_var(b, name, dt, shape, &v));
  return v;
}
static inline pe_var_desc *pu_param(pe_block *b, const char *name, pe_shape shape) {
  pe_var_desc *v = pu_var(b, name, PE_F32, &shape);
  v->persistable = true;
  return v;
}
static inline pe_var_desc *pu_feed(pe_block *b, const char *name, pe_dtype dt, pe_shape shape) {
  pe_var_desc *v = pu_var(b, name, dt, &shape);
  v->is_feed = true;
  v->stop_gradient = true;
  return v;
}

/* pu_op(b, "relu", "X", "x", NULL, "Out", "y", NULL): inputs, NULL, outputs,
 * NULL; one argument per slot (set multi-argument slots afterwards). */
static inline pe_op_desc *pu_op(pe_block *b, const char *type, ...) {
  pe_op_desc *op;
  PU_OK(pe_block_append_op(b, type, &op));
  va_list ap;
  va_start(ap, type);
  PU_OK(ph_op_add_slots(op, ap));
  va_end(ap);
  return op;
}

/* Index of the first op of `type` in b at or after `from`; -1 if none. */
static inline int pu_find_op(const pe_block *b, const char *type, int from) {
  for (int i = from; i < b->n_ops; i++)
    if (strcmp(b->ops[i]->type, type) == 0) return i;
  return -1;
}

/* The first op of `type` in p's main block; NULL if none. */
static inline pe_op_desc *pu_main_op(const pe_program *p, const char *type) {
  const pe_block *b = pe_program_main(p);
  int i = pu_find_op(b, type, 0);
  return i < 0 ? NULL : b->ops[i];
}

/* Whether any op of b writes `name`. */
static inline int pu_writers(const pe_block *b, const char *name) {
  int n = 0;
  for (int i = 0; i < b->n_ops; i++)
    for (int s = 0; s < b->ops[i]->n_out; s++)
      for (int k = 0; k < b->ops[i]->out[s].n; k++) n += !strcmp(b->ops[i]->out[s].args[k], name);
  return n;
}

#endif
