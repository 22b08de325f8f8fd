/* position_ids: the position of each element along one axis of X, as
 * token ids for a position embedding table.
 *
 *   X (any dtype, read for its shape only) -> Out i64 X.shape[0 .. axis]
 *   Out[..., t] = start + t
 *
 * For token ids [B, T] and axis 1 (the default) Out is [B, T] holding
 * 0 .. T-1 in every row; for activations [B, T, D] it is [B, T] as well.
 * One op where Paddle's programs use fill_constant / range and a
 * broadcast, and it follows X's batch size at run time (a last partial
 * batch, the rows of a data-parallel place). No gradient. */
#include "ops/op_tables.h"

enum { PI_X };
enum { PI_OUT };

static pe_status *pi_infer(pe_infer_ctx *c) {
  pe_meta *x = pe_in_meta(c, PI_X, 0);
  if (!x) return pe_infer_error(c, PE_EARITY, "needs input X");
  int64_t axis = pe_attr_i(c->def, c->desc, "axis");
  if (axis < 0) axis += x->shape.ndim;
  if (axis < 0 || axis >= x->shape.ndim) {
    char sb[PE_SHAPE_STRLEN];
    return pe_infer_error(c, PE_EATTR, "axis %lld out of range for X '%s' shape %s",
                          (long long)pe_attr_i(c->def, c->desc, "axis"), pe_in_name(c, PI_X, 0),
                          pe_shape_str(&x->shape, sb, sizeof sb));
  }
  pe_shape out = {.ndim = (int)axis + 1};
  for (int i = 0; i <= axis; i++) out.d[i] = x->shape.d[i];
  pe_infer_set(c, PI_OUT, PE_I64, &out);
  return NULL;
}

static pe_status *pi_kernel(pe_kernel_ctx *c) {
  pe_tensor *out = pe_kout(c, PI_OUT, 0);
  int64_t t = out->shape.d[out->shape.ndim - 1], start = pe_attr_i(c->def, c->desc, "start");
  int64_t *o = pe_i64(out), n = pe_tensor_numel(out);
  for (int64_t i = 0; i < n; i++) o[i] = start + i % t;
  return NULL;
}

static const pe_slot_def pi_in[] = {{"X", 1, 1, PE_SLOT_NO_GRAD}, {NULL}};
static const pe_slot_def pi_out[] = {{"Out", 1, 1, 0}, {NULL}};
static const pe_attr_def pi_attrs[] = {
    {"axis", PE_ATTR_INT, false, 1, NULL}, {"start", PE_ATTR_LONG, false, 0, NULL}, {NULL}};

const pe_op_def pe_ops_position_ids[] = {
    {.type = "position_ids",
     .inputs = pi_in,
     .outputs = pi_out,
     .attrs = pi_attrs,
     .flags = PE_OP_NO_GRAD,
     .infer = pi_infer,
     .kernel_cpu = pi_kernel},
    {NULL},
};
