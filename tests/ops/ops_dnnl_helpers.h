/* Helpers shared by the oneDNN op suites (test_ops_dnnl*.c): value checks,
 * gradient checks with a stated tolerance and compile-time inference over
 * declared metas (with -1 batch dims). The primitive cache is observed
 * through ph_op_inst (op_harness.h), which keeps the op's state across calls.
 * Header-only: each suite is its own executable. */
#ifndef PE_TESTS_OPS_DNNL_HELPERS_H
#define PE_TESTS_OPS_DNNL_HELPERS_H

#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_harness.h"
#include "ops/cpu/dnnl_util.h"
#include "test_assert.h"

#define DT_MAX_SLOTS 8

/* |got - want| <= tol * max(1, |want|) elementwise. With PE_TOL_REPORT set
 * in the environment, each check prints how much of its tolerance it used
 * (the largest |got - want| / (tol * max(1, |want|))): running a suite under
 * every ONEDNN_MAX_CPU_ISA with it shows the spread across oneDNN's
 * kernels that a tolerance must cover. */
static inline void dt_expect_close(const float *got, const float *want, int64_t n, double tol,
                                   const char *what) {
  double used = 0;
  for (int64_t i = 0; i < n; i++) {
    double lim = tol * fmax(1.0, fabs(want[i]));
    double d = fabs((double)got[i] - want[i]);
    if (!(d <= lim))
      ck_abort_msg("%s[%lld] = %.7g, expected %.7g (tol %g)", what, (long long)i, got[i], want[i],
                   lim);
    if (d / lim > used) used = d / lim;
  }
  if (getenv("PE_TOL_REPORT")) fprintf(stderr, "tolerance used: %s: %.3f of %g\n", what, used, tol);
}

/* Run op once (fresh state) and free it. */
static inline void dt_run_free(pe_scope *s, pe_op_desc *op) {
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_op_desc_free(op);
}

/* Variables got and want of s have the same shape and values within 1e-5
 * (dt_expect_close): a fused op against the unfused ops it replaces. */
static inline void dt_expect_same(pe_scope *s, const char *got, const char *want,
                                  const char *what) {
  pe_tensor *g = ph_get(s, got), *w = ph_get(s, want);
  ck_assert_ptr_nonnull(g);
  ck_assert_ptr_nonnull(w);
  ck_assert(pe_shape_equal(&g->shape, &w->shape));
  dt_expect_close(pe_f32(g), pe_f32(w), pe_tensor_numel(w), 1e-5, what);
}

/* Negative values of variable `name` (a fused relu's mask must matter);
 * with away > 0, also checks that every value is at least that far from
 * relu's kink (so central differences see none). */
static inline int64_t dt_count_negative(pe_scope *s, const char *name, float away) {
  const pe_tensor *t = ph_get(s, name);
  ck_assert_ptr_nonnull(t);
  int64_t neg = 0;
  for (int64_t i = 0; i < pe_tensor_numel(t); i++) {
    if (away > 0) ck_assert_float_gt(fabsf(pe_f32(t)[i]), away);
    neg += pe_f32(t)[i] < 0;
  }
  return neg;
}

/* A fused op's forward against the unfused chain already run into z2 (the
 * product plus bias) and z3 (its relu), each fused op writing "out":
 * with_relu's out must equal z3 (some of z2 negative, so the relu
 * matters), bias_only's z2. Frees both ops. */
static inline void dt_expect_fused_forward(pe_scope *s, pe_op_desc *with_relu,
                                           pe_op_desc *bias_only, const char *what) {
  char w[128];
  dt_run_free(s, with_relu);
  snprintf(w, sizeof w, "%s + bias + relu", what);
  dt_expect_same(s, "out", "z3", w);
  ck_assert_int_gt(dt_count_negative(s, "z2", 0), 0);
  dt_run_free(s, bias_only);
  snprintf(w, sizeof w, "%s + bias", what);
  dt_expect_same(s, "out", "z2", w);
}

/* Central-difference gradient check.
 * Tolerance: the harness's error is |a-n| / max(1,|a|,|n|). With f32
 * forward passes and step eps = 1e-3, each forward value carries ~1e-7
 * relative rounding; summed over the (<= a few hundred) outputs of these
 * small tensors the loss L carries ~1e-6 absolute error, so the difference
 * quotient (L+ - L-)/(2 eps) carries ~1e-3 at worst, and the truncation
 * error O(eps^2 f''') is ~1e-6 for inputs of magnitude <= 2. max_err <= 1e-2
 * therefore leaves a wide margin for rounding yet catches any real formula
 * error (those are O(1) relative). Inputs are chosen of moderate magnitude
 * and away from non-differentiable points (relu's 0, max-pool ties). */
#define DT_GRAD_EPS 1e-3
#define DT_GRAD_TOL 1e-2

static inline void dt_grad_ok(pe_scope *s, const pe_op_desc *op, const char *const *outs,
                              int n_outs, const char *const *wrt, int n_wrt, int max_elems) {
  expect_grad(s, op, outs, n_outs, wrt, n_wrt, DT_GRAD_EPS, max_elems, DT_GRAD_TOL);
}

/* Numeric gradients of a fused op (inputs x, w, b; output out) at the
 * values in s; frees op and s. */
static inline void dt_fused_grad_ok(pe_scope *s, pe_op_desc *op, int max_elems) {
  const char *outs[] = {"out"}, *wrt[] = {"x", "w", "b"};
  dt_grad_ok(s, op, outs, 1, wrt, 3, max_elems);
  pe_op_desc_free(op);
  pe_scope_free(s);
}

/* The gradient maker of op (a fused relu's forward; freed here) makes one
 * op of type grad_type with n_in input slots that reads the fused output
 * `out` through slot out_slot (its mask) and out@GRAD through
 * out_slot@GRAD, with fuse_activation relu. */
static inline void dt_expect_fused_grad_maker(pe_op_desc *op, const char *grad_type, int n_in,
                                              const char *out_slot, const char *out) {
  const pe_op_def *def = pe_op_lookup(op->type);
  pe_grad_ctx g;
  pe_grad_ctx_init(&g, def, op);
  PE_CK_OK(def->grad(&g));
  ck_assert_int_eq(g.n_ops, 1);
  const pe_op_desc *gop = g.ops[0];
  char slot[64], arg[64];
  snprintf(slot, sizeof slot, "%s@GRAD", out_slot);
  snprintf(arg, sizeof arg, "%s@GRAD", out);
  ck_assert_str_eq(gop->type, grad_type);
  ck_assert_int_eq(gop->n_in, n_in);
  ck_assert_str_eq(pe_op_input_arg(gop, out_slot), out);
  ck_assert_str_eq(pe_op_input_arg(gop, slot), arg);
  ck_assert_str_eq(pe_op_find_attr(gop, "fuse_activation")->s, "relu");
  pe_grad_ctx_destroy(&g);
  pe_op_desc_free(op);
}

/* --- compile-time inference over declared metas ------------------------------ */

typedef struct dt_var {
  const char *name;
  pe_dtype dt;
  pe_shape shape;
} dt_var;

/* Runs op's infer (runtime = false) with inputs taken from vars by name;
 * *out0 gets the first output's meta. */
static inline pe_status *dt_infer(const pe_op_desc *op, const dt_var *vars, int nvars,
                                  pe_meta *out0) {
  pe_scope *s = pe_scope_new(NULL);
  for (int v = 0; v < nvars; v++) ph_set_meta(s, vars[v].name, vars[v].dt, vars[v].shape);
  pe_meta m[DT_MAX_SLOTS];
  pe_status *st = ph_infer_op(s, op, m, DT_MAX_SLOTS);
  if (!st && out0) *out0 = m[0];
  pe_scope_free(s);
  return st;
}

/* Expect infer to fail with code, and its message to contain each of the
 * NULL-terminated needles. */
static inline void dt_expect_infer_error(const pe_op_desc *op, const dt_var *vars, int nvars,
                                         pe_code code, ...) {
  va_list ap;
  va_start(ap, code);
  expect_errors_v(dt_infer(op, vars, nvars, NULL), code, ap);
  va_end(ap);
}

#endif
