/* Softmax over the last dim with an additive mask or a causal triangle
 * (Paddle's fused ops, any rank >= 2 here where Paddle's take 4-D):
 *
 *   fused_softmax_mask: X [..., Q, K], Mask (broadcasts to X, dims aligned
 *     from the right, each 1 or X's) -> Out = softmax(X + Mask)
 *   fused_softmax_mask_upper_triangle: X [..., Q, K] -> Out = softmax of X
 *     with column j > row i of every [Q, K] matrix masked out (-inf, so
 *     its probability is 0): causal attention without a mask tensor.
 *
 * One pass fewer over the scores than elementwise_add + softmax, and the
 * triangle needs no [Q, K] mask at all. The gradient is softmax's, from
 * Out: dX = Out * (dOut - sum(dOut * Out)); the mask gets none (a mask is
 * a constant, as in Paddle). Both run on oneDNN's softmax
 * (softmax_rows.h). */
#include <string.h>

#include "ops/cpu/softmax_rows.h"
#include "ops/op_tables.h"

enum { SM_X, SM_MASK };
enum { SM_OUT };
enum { SMG_OUT = 2, SMG_DOUT };
enum { SMG_DX };
/* the upper-triangle rows have no Mask slot */
enum { SMT_OUT = 1, SMT_DOUT };

static bool sm_causal(const pe_op_def *d) {
  return pe_op_input_index(d, "Mask") < 0;
}

static pe_status *sm_check(pe_infer_ctx *c) {
  PE_TRY(pe_dnnl_infer_f32(c));
  pe_meta *x = pe_in_meta(c, SM_X, 0);
  if (!x) return pe_infer_error(c, PE_EARITY, "needs input X");
  char sx[PE_SHAPE_STRLEN], sm[PE_SHAPE_STRLEN];
  if (x->shape.ndim < 2)
    return pe_infer_error(c, PE_ESHAPE, "input X '%s' shape %s has rank %d; it needs 2 or more",
                          pe_in_name(c, SM_X, 0), pe_shape_str(&x->shape, sx, sizeof sx),
                          x->shape.ndim);
  if (sm_causal(c->def)) return NULL;
  pe_meta *m = pe_in_meta(c, SM_MASK, 0);
  if (!m) return pe_infer_error(c, PE_EARITY, "needs input Mask");
  pe_smask_view v;
  if (!pe_smask_plan(&x->shape, &m->shape, &v))
    return pe_infer_error(c, PE_ESHAPE,
                          "input Mask '%s' shape %s does not broadcast to X '%s' shape %s",
                          pe_in_name(c, SM_MASK, 0), pe_shape_str(&m->shape, sm, sizeof sm),
                          pe_in_name(c, SM_X, 0), pe_shape_str(&x->shape, sx, sizeof sx));
  return NULL;
}

static pe_status *sm_infer(pe_infer_ctx *c) {
  PE_TRY(sm_check(c));
  pe_infer_set(c, SM_OUT, PE_F32, &pe_in_meta(c, SM_X, 0)->shape);
  return NULL;
}

static pe_status *sm_grad_infer(pe_infer_ctx *c) {
  PE_TRY(sm_check(c));
  return pe_infer_grad_like_inputs(c);
}

static pe_status *sm_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, SM_X, 0), *out = pe_kout(c, SM_OUT, 0);
  int64_t n = pe_tensor_numel(x), k = x->shape.d[x->shape.ndim - 1];
  if (n == 0) return NULL;
  bool causal = sm_causal(c->def);
  pe_tensor *m = causal ? NULL : pe_kin(c, SM_MASK, 0);
  pe_smask_view v;
  pe_smask_plan(&x->shape, m ? &m->shape : &x->shape, &v);
  memcpy(out->data, x->data, pe_tensor_bytes(x));
  pe_smask_apply(&v, m ? pe_f32(m) : NULL, causal, pe_f32(out), pe_kernel_threads(c));
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(pe_dnnl_cache_lookup_shape(c, &x->shape, &e, &fresh));
  if (fresh) PE_TRY(pe_dnnl_cache_built(c, e, pe_softmax_rows_build(c, e, n / k, k, false)));
  void *h[] = {out->data, out->data};
  return pe_dnnl_run(c, &e->prims[0], h, c->def->type);
}

static pe_status *sm_grad_kernel(pe_kernel_ctx *c) {
  bool causal = sm_causal(c->def);
  pe_tensor *out = pe_kin(c, causal ? SMT_OUT : SMG_OUT, 0);
  pe_tensor *dout = pe_kin(c, causal ? SMT_DOUT : SMG_DOUT, 0), *dx = pe_kout(c, SMG_DX, 0);
  if (!dx) return NULL;
  if (!dout) {
    pe_tensor_zero(dx);
    return NULL;
  }
  if (!out) return pe_kernel_error(c, PE_EARITY, "needs input Out");
  if (!pe_shape_equal(&out->shape, &dx->shape) || !pe_shape_equal(&dout->shape, &dx->shape))
    return pe_kernel_error(c, PE_ESHAPE, "inputs Out and Out@GRAD do not have X's shape");
  int64_t n = pe_tensor_numel(dx), k = dx->shape.d[dx->shape.ndim - 1];
  if (n == 0) return NULL;
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(pe_dnnl_cache_lookup_shape(c, &dx->shape, &e, &fresh));
  if (fresh) PE_TRY(pe_dnnl_cache_built(c, e, pe_softmax_rows_build(c, e, n / k, k, true)));
  void *h[] = {out->data, dout->data, dx->data};
  return pe_dnnl_run(c, &e->prims[0], h, c->def->type);
}

static const pe_slot_def sm_in[] = {{"X", 1, 1, 0}, {"Mask", 1, 1, PE_SLOT_NO_GRAD}, {NULL}};
static const pe_slot_def sm_out[] = {{"Out", 1, 1, 0}, {NULL}};
static const pe_slot_def sm_grad_in[] = {
    {"X", 1, 1, 0}, {"Mask", 1, 1, 0}, {"Out", 1, 1, 0}, {"Out" PE_GRAD_SUFFIX, 0, 1, 0}, {NULL}};
static const pe_slot_def smt_in[] = {{"X", 1, 1, 0}, {NULL}};
static const pe_slot_def smt_grad_in[] = {
    {"X", 1, 1, 0}, {"Out", 1, 1, 0}, {"Out" PE_GRAD_SUFFIX, 0, 1, 0}, {NULL}};
static const pe_slot_def sm_grad_out[] = {{"X" PE_GRAD_SUFFIX, 0, 1, 0}, {NULL}};
static const pe_attr_def sm_attrs[] = {{NULL}};

const pe_op_def pe_ops_softmax_mask[] = {
    {.type = "fused_softmax_mask",
     .inputs = sm_in,
     .outputs = sm_out,
     .attrs = sm_attrs,
     .infer = sm_infer,
     .kernel_cpu = sm_kernel,
     .state_free = pe_dnnl_cache_free,
     .grad = pe_grad_default},
    {.type = "fused_softmax_mask_grad",
     .inputs = sm_grad_in,
     .outputs = sm_grad_out,
     .attrs = sm_attrs,
     .infer = sm_grad_infer,
     .kernel_cpu = sm_grad_kernel,
     .state_free = pe_dnnl_cache_free},
    {.type = "fused_softmax_mask_upper_triangle",
     .inputs = smt_in,
     .outputs = sm_out,
     .attrs = sm_attrs,
     .infer = sm_infer,
     .kernel_cpu = sm_kernel,
     .state_free = pe_dnnl_cache_free,
     .grad = pe_grad_default},
    {.type = "fused_softmax_mask_upper_triangle_grad",
     .inputs = smt_grad_in,
     .outputs = sm_grad_out,
     .attrs = sm_attrs,
     .infer = sm_grad_infer,
     .kernel_cpu = sm_grad_kernel,
     .state_free = pe_dnnl_cache_free},
    {NULL},
};
