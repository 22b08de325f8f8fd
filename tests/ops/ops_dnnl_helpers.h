/* Helpers shared by the oneDNN op suites (test_ops_dnnl*.c): value checks,
 * gradient checks with a stated tolerance, compile-time inference over
 * declared metas (with -1 batch dims), and a runner that keeps the op's
 * state across calls (the harness makes fresh state every call) so that the
 * primitive cache can be observed. Header-only: each suite is its own
 * executable. */
#ifndef PE_TESTS_OPS_DNNL_HELPERS_H
#define PE_TESTS_OPS_DNNL_HELPERS_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "op_harness.h"
#include "ops/cpu/dnnl_util.h"
#include "ops/device_ctx.h"

#define DT_MAX_SLOTS 8

/* |got - want| <= tol * max(1, |want|) elementwise. */
static inline void dt_expect_close(const float *got, const float *want, int64_t n, double tol,
                                   const char *what) {
  for (int64_t i = 0; i < n; i++) {
    double lim = tol * fmax(1.0, fabs(want[i]));
    if (!(fabs((double)got[i] - want[i]) <= lim))
      ck_abort_msg("%s[%lld] = %.7g, expected %.7g (tol %g)", what, (long long)i, got[i], want[i],
                   lim);
  }
}

static inline bool dt_shape_is(const pe_shape *got, pe_shape want) {
  return pe_shape_equal(got, &want);
}

static inline void dt_run_ok(pe_scope *s, const pe_op_desc *op) {
  pe_status *st = ph_run_op(s, op, NULL);
  if (st) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", pe_status_msg(st));
    pe_status_free(st);
    ck_abort_msg("run %s: %s", op->type, msg);
  }
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
  ph_grad_report rep;
  pe_status *st = ph_grad_check(s, op, outs, n_outs, wrt, n_wrt, DT_GRAD_EPS, max_elems, &rep);
  if (st) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", pe_status_msg(st));
    pe_status_free(st);
    ck_abort_msg("grad check %s: %s", op->type, msg);
  }
  ck_assert_int_gt(rep.checked, 0);
  if (rep.max_err > DT_GRAD_TOL)
    ck_abort_msg("grad check %s: max_err %.3g at %s[%lld]: analytic %.6g numeric %.6g", op->type,
                 rep.max_err, rep.worst ? rep.worst : "?", (long long)rep.worst_index, rep.analytic,
                 rep.numeric);
}

/* --- compile-time inference over declared metas ------------------------------ */

typedef struct dt_var {
  const char *name;
  pe_dtype dt;
  pe_shape shape;
} dt_var;

/* Runs op's infer (runtime = false) with inputs taken from vars by name;
 * *out0 gets output slot 0's meta. */
static inline pe_status *dt_infer(const pe_op_desc *op, const dt_var *vars, int nvars,
                                  pe_meta *out0) {
  const pe_op_def *def = pe_op_lookup(op->type);
  ck_assert_ptr_nonnull(def);
  pe_meta_list in[DT_MAX_SLOTS] = {{0}}, out[DT_MAX_SLOTS] = {{0}};
  pe_meta vin[DT_MAX_SLOTS], vout[DT_MAX_SLOTS];
  pe_meta *pin[DT_MAX_SLOTS], *pout[DT_MAX_SLOTS];
  const char *nin[DT_MAX_SLOTS], *nout[DT_MAX_SLOTS];
  for (int i = 0; i < def->n_inputs; i++) {
    const char *arg = pe_op_input_arg(op, def->inputs[i].name);
    if (!arg) continue;
    int v = 0;
    while (v < nvars && strcmp(vars[v].name, arg) != 0) v++;
    ck_assert_int_lt(v, nvars);
    vin[i] = (pe_meta){vars[v].dt, vars[v].shape};
    pin[i] = &vin[i];
    nin[i] = arg;
    in[i] = (pe_meta_list){1, &nin[i], &pin[i]};
  }
  for (int o = 0; o < def->n_outputs; o++) {
    const char *arg = pe_op_output_arg(op, def->outputs[o].name);
    if (!arg) continue;
    memset(&vout[o], 0, sizeof vout[o]);
    pout[o] = &vout[o];
    nout[o] = arg;
    out[o] = (pe_meta_list){1, &nout[o], &pout[o]};
  }
  pe_infer_ctx ic = {def, op, 0, false, in, out};
  pe_status *st = def->infer(&ic);
  if (!st && out0) *out0 = vout[0];
  return st;
}

/* Expect infer to fail with code, and its message to contain each of the
 * NULL-terminated needles. */
static inline void dt_expect_infer_error(const pe_op_desc *op, const dt_var *vars, int nvars,
                                         pe_code code, ...) {
  pe_status *st = dt_infer(op, vars, nvars, NULL);
  ck_assert_ptr_nonnull(st);
  ck_assert_msg(pe_status_code(st) == code, "code %s, expected %s: %s",
                pe_code_name(pe_status_code(st)), pe_code_name(code), pe_status_msg(st));
  va_list ap;
  va_start(ap, code);
  const char *needle;
  while ((needle = va_arg(ap, const char *)))
    ck_assert_msg(strstr(pe_status_msg(st), needle), "'%s' not in: %s", needle, pe_status_msg(st));
  va_end(ap);
  pe_status_free(st);
}

/* --- stateful runner (one arg per slot) ---------------------------------------- */

/* Like ph_run_op but with caller-owned op state *state and device dev. */
static inline pe_status *dt_run_stateful(pe_scope *s, const pe_op_desc *op, void **state,
                                         pe_device_ctx *dev) {
  const pe_op_def *def = pe_op_lookup(op->type);
  ck_assert_ptr_nonnull(def);
  pe_tensor_list in[DT_MAX_SLOTS] = {{0}}, out[DT_MAX_SLOTS] = {{0}};
  pe_meta_list min[DT_MAX_SLOTS] = {{0}}, mout[DT_MAX_SLOTS] = {{0}};
  pe_tensor *tin[DT_MAX_SLOTS], *tout[DT_MAX_SLOTS];
  pe_meta vin[DT_MAX_SLOTS], vout[DT_MAX_SLOTS], *pin[DT_MAX_SLOTS], *pout[DT_MAX_SLOTS];
  const char *nin[DT_MAX_SLOTS], *nout[DT_MAX_SLOTS];
  for (int i = 0; i < def->n_inputs; i++) {
    const char *arg = pe_op_input_arg(op, def->inputs[i].name);
    if (!arg) continue;
    tin[i] = ph_get(s, arg);
    ck_assert_ptr_nonnull(tin[i]);
    vin[i] = (pe_meta){tin[i]->dtype, tin[i]->shape};
    pin[i] = &vin[i];
    nin[i] = arg;
    in[i] = (pe_tensor_list){1, &tin[i]};
    min[i] = (pe_meta_list){1, &nin[i], &pin[i]};
  }
  for (int o = 0; o < def->n_outputs; o++) {
    const char *arg = pe_op_output_arg(op, def->outputs[o].name);
    if (!arg) continue;
    pe_var *v;
    PE_TRY(pe_scope_var(s, arg, &v));
    tout[o] = &v->t;
    pout[o] = &vout[o];
    nout[o] = arg;
    out[o] = (pe_tensor_list){1, &tout[o]};
    mout[o] = (pe_meta_list){1, &nout[o], &pout[o]};
  }
  pe_infer_ctx ic = {def, op, 0, true, min, mout};
  PE_TRY(def->infer(&ic));
  for (int o = 0; o < def->n_outputs; o++)
    if (out[o].n) PE_TRY(pe_tensor_resize(tout[o], vout[o].dtype, &vout[o].shape, nout[o]));
  pe_rng rng = {1, 0};
  pe_kernel_ctx kc = {def, op, 0, in, out, state, &rng, dev};
  return def->kernel_cpu(&kc);
}

static inline void dt_run_stateful_ok(pe_scope *s, const pe_op_desc *op, void **state,
                                      pe_device_ctx *dev) {
  pe_status *st = dt_run_stateful(s, op, state, dev);
  if (st) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", pe_status_msg(st));
    pe_status_free(st);
    ck_abort_msg("run %s: %s", op->type, msg);
  }
}

#endif
