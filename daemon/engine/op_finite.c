/* The per-op NaN/Inf debug check (see op_finite.h). */
#include "engine/op_finite.h"

#include <stdio.h>

#include "core/finite.h"

/* Whether t is one of the op's outputs (an in-place input). */
static bool is_output(const pe_kernel_ctx *kc, const pe_tensor *t) {
  for (int o = 0; o < kc->def->n_outputs; o++)
    for (int k = 0; k < kc->out[o].n; k++)
      if (kc->out[o].t[k] == t) return true;
  return false;
}

/* "X 'a' (nan at element 0), Y 'b' (...)" for the inputs that hold a
 * non-finite value, or "none"; returns how many there are. */
static int bad_inputs(const pe_kernel_ctx *kc, const pe_meta_list *ml, char *buf, size_t len) {
  size_t at = 0;
  int count = 0;
  buf[0] = 0;
  for (int i = 0; i < kc->def->n_inputs; i++)
    for (int k = 0; k < kc->in[i].n; k++) {
      const pe_tensor *t = kc->in[i].t[k];
      int64_t first;
      if (is_output(kc, t) || !pe_tensor_nonfinite(t, &first)) continue;
      count++;
      if (at + 1 >= len) continue; /* full: the count goes on */
      int n = snprintf(buf + at, len - at, "%s%s '%s' (%s at element %lld)", at ? ", " : "",
                       kc->def->inputs[i].name, ml[i].names[k], pe_tensor_nonfinite_str(t, first),
                       (long long)first);
      at = n < 0 ? len : at + (size_t)n > len - 1 ? len - 1 : at + (size_t)n; /* truncated */
    }
  if (!count) snprintf(buf, len, "none");
  return count;
}

pe_status *pe_op_check_finite(const pe_kernel_ctx *kc, const pe_meta_list *ml) {
  const pe_op_def *def = kc->def;
  char sb[PE_SHAPE_STRLEN], ins[512];
  for (int o = 0; o < def->n_outputs; o++)
    for (int k = 0; k < kc->out[o].n; k++) {
      const pe_tensor *t = kc->out[o].t[k];
      int64_t first, bad = pe_tensor_nonfinite(t, &first);
      if (!bad) continue;
      bool produced = !bad_inputs(kc, ml, ins, sizeof ins);
      return pe_error(PE_EINVAL,
                      "op #%d (%s): check_nan_inf: output %s '%s' (%s %s) holds %s at element "
                      "%lld (%lld of %lld elements non-finite); inputs already non-finite: %s "
                      "(%s)",
                      kc->op_index, def->type, def->outputs[o].name, ml[def->n_inputs + o].names[k],
                      pe_dtype_name(t->dtype), pe_shape_str(&t->shape, sb, sizeof sb),
                      pe_tensor_nonfinite_str(t, first), (long long)first, (long long)bad,
                      (long long)pe_tensor_numel(t), ins,
                      produced ? "this op produced it" : "propagated from them");
    }
  return NULL;
}

pe_status *pe_feed_check_finite(const char *name, const pe_tensor *t, const char *where) {
  char sb[PE_SHAPE_STRLEN];
  int64_t first, bad = pe_tensor_nonfinite(t, &first);
  if (!bad) return NULL;
  return pe_error(PE_EINVAL,
                  "check_nan_inf: feed '%s'%s (%s %s) holds %s at element %lld (%lld of %lld "
                  "elements non-finite); the client fed it",
                  name, where, pe_dtype_name(t->dtype), pe_shape_str(&t->shape, sb, sizeof sb),
                  pe_tensor_nonfinite_str(t, first), (long long)first, (long long)bad,
                  (long long)pe_tensor_numel(t));
}
