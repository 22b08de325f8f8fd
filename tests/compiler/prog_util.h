/* Helpers for tests that build programs with the IR API (header-only, used
 * by tests/compiler and tests/engine). They abort the test on any failure of
 * the construction calls themselves. */
#ifndef PE_TESTS_PROG_UTIL_H
#define PE_TESTS_PROG_UTIL_H

#include <check.h>
#include <stdarg.h>
#include <string.h>

#include "compiler/program.h"

#define PU_OK(expr)                                                        \
  do {                                                                     \
    pe_status *pu_st_ = (expr);                                            \
    ck_assert_msg(pu_st_ == NULL, "%s: %s", #expr, pe_status_msg(pu_st_)); \
  } while (0)

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
  for (int pass = 0; pass < 2; pass++) {
    const char *slot;
    while ((slot = va_arg(ap, const char *))) {
      const char *arg = va_arg(ap, const char *);
      PU_OK(pass ? pe_op_output1(op, slot, arg) : pe_op_input1(op, slot, arg));
    }
  }
  va_end(ap);
  return op;
}

/* The status has `code` and its message contains every string of the
 * NULL-terminated list. Frees st. */
static inline void pu_expect(pe_status *st, pe_code code, ...) {
  ck_assert_msg(st != NULL, "expected %s, got success", pe_code_name(code));
  ck_assert_msg(pe_status_code(st) == code, "expected %s, got %s: %s", pe_code_name(code),
                pe_code_name(pe_status_code(st)), pe_status_msg(st));
  va_list ap;
  va_start(ap, code);
  const char *want;
  while ((want = va_arg(ap, const char *)))
    ck_assert_msg(strstr(pe_status_msg(st), want), "message \"%s\" lacks \"%s\"", pe_status_msg(st),
                  want);
  va_end(ap);
  pe_status_free(st);
}

/* Index of the first op of `type` in b at or after `from`; -1 if none. */
static inline int pu_find_op(const pe_block *b, const char *type, int from) {
  for (int i = from; i < b->n_ops; i++)
    if (strcmp(b->ops[i]->type, type) == 0) return i;
  return -1;
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
