/* Check assertions shared by the test suites. Header-only: each suite is its
 * own executable and uses what it needs.
 *
 *   PE_CK_OK(expr)                  expr (a pe_status *) is NULL; else fail
 *                                   naming expr, the message and the code.
 *   expect_error(st, code, needle)  st failed with `code` and its message
 *                                   contains needle; frees st.
 *   expect_errors(st, code, ...)    the same for each string of a NULL-
 *                                   terminated list (expect_errors_v: va_list).
 *   expect_shape(got, want)         shapes equal (both printed on failure).
 *   expect_f32(s, name, shape, want, tol)
 *                                   f32 variable `name` of scope s has `shape`
 *                                   and |v[i] - want[i]| <= tol everywhere.
 *   expect_grad(s, op, outs, n_outs, wrt, n_wrt, eps, max_elems, tol)
 *                                   ph_grad_check succeeds, checks some
 *                                   elements and max_err <= tol; returns the
 *                                   report for further checks. */
#ifndef PE_TESTS_TEST_ASSERT_H
#define PE_TESTS_TEST_ASSERT_H

#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "core/scope.h"
#include "core/status.h"
#include "op_harness.h"

#define PE_CK_OK(expr)                                                               \
  do {                                                                               \
    pe_status *pe_ck_st_ = (expr);                                                   \
    ck_assert_msg(pe_ck_st_ == NULL, "%s: %s (%s)", #expr, pe_status_msg(pe_ck_st_), \
                  pe_code_name(pe_status_code(pe_ck_st_)));                          \
  } while (0)

static inline void expect_errors_v(pe_status *st, pe_code code, va_list ap) {
  ck_assert_msg(st != NULL, "expected error %s, got success", pe_code_name(code));
  ck_assert_msg(pe_status_code(st) == code, "expected %s, got %s: %s", pe_code_name(code),
                pe_code_name(pe_status_code(st)), pe_status_msg(st));
  const char *needle;
  while ((needle = va_arg(ap, const char *)))
    ck_assert_msg(strstr(pe_status_msg(st), needle), "'%s' not in: %s", needle, pe_status_msg(st));
  pe_status_free(st);
}

static inline void expect_errors(pe_status *st, pe_code code, ...) {
  va_list ap;
  va_start(ap, code);
  expect_errors_v(st, code, ap);
  va_end(ap);
}

static inline void expect_error(pe_status *st, pe_code code, const char *needle) {
  expect_errors(st, code, needle, (const char *)NULL);
}

static inline void expect_shape(const pe_shape *got, pe_shape want) {
  char a[PE_SHAPE_STRLEN], b[PE_SHAPE_STRLEN];
  ck_assert_msg(pe_shape_equal(got, &want), "shape %s, want %s", pe_shape_str(got, a, sizeof a),
                pe_shape_str(&want, b, sizeof b));
}

static inline void expect_f32(pe_scope *s, const char *name, pe_shape shape, const float *want,
                              double tol) {
  pe_var *v = pe_scope_find(s, name);
  ck_assert_msg(v != NULL, "no variable %s", name);
  pe_tensor *t = &v->t;
  char a[PE_SHAPE_STRLEN], b[PE_SHAPE_STRLEN];
  ck_assert_msg(pe_shape_equal(&t->shape, &shape), "%s: shape %s, want %s", name,
                pe_shape_str(&t->shape, a, sizeof a), pe_shape_str(&shape, b, sizeof b));
  for (int64_t i = 0; i < pe_tensor_numel(t); i++)
    ck_assert_msg(fabs(pe_f32(t)[i] - want[i]) <= tol, "%s[%lld] = %.9g, want %.9g", name,
                  (long long)i, pe_f32(t)[i], want[i]);
}

static inline ph_grad_report expect_grad(pe_scope *s, const pe_op_desc *op, const char *const *outs,
                                         int n_outs, const char *const *wrt, int n_wrt, double eps,
                                         int max_elems, double tol) {
  ph_grad_report r;
  PE_CK_OK(ph_grad_check(s, op, outs, n_outs, wrt, n_wrt, eps, max_elems, &r));
  ck_assert_int_gt(r.checked, 0);
  ck_assert_msg(r.max_err <= tol, "%s: d/d%s[%lld] analytic %g numeric %g (err %g > %g)", op->type,
                r.worst ? r.worst : "?", (long long)r.worst_index, r.analytic, r.numeric, r.max_err,
                tol);
  return r;
}

#endif
