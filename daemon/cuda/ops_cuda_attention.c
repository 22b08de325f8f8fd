/* CUDA kernels of the masked softmax ops (fused_softmax_mask,
 * fused_softmax_mask_upper_triangle) and of scaled_dot_product_attention,
 * with their gradients. Same slots, attributes and outputs as
 * ops/cpu/softmax_mask.c and attention.c; the mask's broadcast is the CPU's
 * view (pe_smask_plan), read by kernels_softmax.cu's row kernel.
 *
 * Attention, with P = Softmax [B H, Tq, Tk] (row-major matrices, batched
 * over B H by cuBLAS's strided-batched GEMM, pe_cu_gemm):
 *   forward   P = scale Q Kᵀ (the scale is the GEMM's alpha), then the
 *             mask, the triangle and the softmax in one pass over P in
 *             place, then Out = P V;
 *   gradient  dV = Pᵀ dO, dS = dO Vᵀ (+ Softmax@GRAD) in the stream's
 *             workspace, dS = P (dS - rowsum(dS P)) in place, dQ = scale
 *             dS K, dK = scale dSᵀ Q.
 * The gradient reads the saved Softmax, never the mask. */
#include <math.h>
#include <string.h>

#include "cuda/kernels_softmax.h"
#include "cuda/ops_cuda.h"
#include "ops/cpu/softmax_rows.h"

/* The view of mask m against scores s, or an error naming both shapes. */
static pe_status *mask_view(pe_kernel_ctx *c, const pe_shape *s, const pe_tensor *m,
                            pe_cu_smask *v) {
  pe_smask_view sv;
  if (!pe_smask_plan(s, &m->shape, &sv)) {
    char sm[PE_SHAPE_STRLEN], ss[PE_SHAPE_STRLEN];
    return pe_kernel_error(c, PE_ESHAPE, "input Mask shape %s does not broadcast to the scores %s",
                           pe_shape_str(&m->shape, sm, sizeof sm), pe_shape_str(s, ss, sizeof ss));
  }
  v->nd = sv.nd;
  memcpy(v->dims, sv.dims, sizeof v->dims);
  memcpy(v->st, sv.st, sizeof v->st);
  return NULL;
}

/* --- fused_softmax_mask, fused_softmax_mask_upper_triangle ---------------------------- */

enum { SM_X, SM_MASK };
enum { SMG_OUT = 2, SMG_DOUT };
/* the upper-triangle rows have no Mask slot */
enum { SMT_OUT = 1, SMT_DOUT };

static bool sm_causal(const pe_op_def *d) {
  return pe_op_input_index(d, "Mask") < 0;
}

pe_status *pe_cuk_softmax_mask(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *in = pe_kin(c, SM_X, 0), *out = pe_kout(c, 0, 0);
  int64_t n = pe_tensor_numel(in);
  if (n == 0) return NULL;
  int nd = in->shape.ndim;
  if (nd < 2) return pe_kernel_error(c, PE_ESHAPE, "input X has rank %d; it needs 2 or more", nd);
  bool causal = sm_causal(c->def);
  pe_tensor *m = causal ? NULL : pe_kin(c, SM_MASK, 0);
  if (!causal && !m) return pe_kernel_error(c, PE_EARITY, "needs input Mask");
  pe_cu_smask v;
  if (m) PE_TRY(mask_view(c, &in->shape, m, &v));
  int64_t k = in->shape.d[nd - 1];
  return pe_cu_check(c,
                     pe_cu_softmax_rows(pe_f32(in), pe_cu_f32_or_null(m), &v, causal, pe_f32(out),
                                        n / k, in->shape.d[nd - 2], k, x->stream),
                     c->def->type);
}

/* dX = Out (dOut - rowsum(dOut Out)); the mask gets none. */
pe_status *pe_cuk_softmax_mask_grad(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  bool causal = sm_causal(c->def);
  pe_tensor *out = pe_kin(c, causal ? SMT_OUT : SMG_OUT, 0);
  pe_tensor *dout = pe_kin(c, causal ? SMT_DOUT : SMG_DOUT, 0), *dx = pe_kout(c, 0, 0);
  if (!dx) return NULL;
  if (!dout) return pe_cu_zero(c, x, dx);
  if (!out) return pe_kernel_error(c, PE_EARITY, "needs input Out");
  if (!pe_shape_equal(&out->shape, &dx->shape) || !pe_shape_equal(&dout->shape, &dx->shape))
    return pe_kernel_error(c, PE_ESHAPE, "inputs Out and Out@GRAD do not have X's shape");
  int64_t n = pe_tensor_numel(dx);
  if (n == 0) return NULL;
  int64_t k = dx->shape.d[dx->shape.ndim - 1];
  return pe_cu_check(
      c, pe_cu_softmax_rows_grad(pe_f32(out), pe_f32(dout), pe_f32(dx), n / k, k, x->stream),
      c->def->type);
}

/* --- scaled_dot_product_attention ------------------------------------------------------ */

enum { AT_Q, AT_K, AT_V, AT_MASK };
enum { AT_OUT, AT_SOFTMAX };
enum { ATG_SOFTMAX = 5, ATG_DOUT, ATG_DSOFTMAX };
enum { ATG_DQ, ATG_DK, ATG_DV };

/* Q [B, H, Tq, D], K [B, H, Tk, D], V [B, H, Tk, Dv] (checked by infer):
 * bh = B H matrices of each. */
typedef struct at_view {
  int64_t bh, tq, tk, d, dv;
  float scale;
} at_view;

static at_view at_view_of(const pe_kernel_ctx *c, const pe_tensor *q, const pe_tensor *k,
                          const pe_tensor *v) {
  at_view a;
  a.bh = q->shape.d[0] * q->shape.d[1];
  a.tq = q->shape.d[2];
  a.tk = k->shape.d[2];
  a.d = q->shape.d[3];
  a.dv = v->shape.d[3];
  float s = pe_attr_f(c->def, c->desc, "scale");
  a.scale = s > 0 ? s : (float)(1.0 / sqrt((double)(a.d > 0 ? a.d : 1)));
  return a;
}

static pe_status *at_expect(pe_kernel_ctx *c, const char *slot, const pe_tensor *t, int64_t n) {
  if (!t || pe_tensor_numel(t) == n) return NULL;
  return pe_kernel_error(c, PE_ESHAPE, "input %s has %lld elements, expected %lld", slot,
                         (long long)pe_tensor_numel(t), (long long)n);
}

pe_status *pe_cuk_scaled_dot_product_attention(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *q = pe_kin(c, AT_Q, 0), *k = pe_kin(c, AT_K, 0), *v = pe_kin(c, AT_V, 0);
  pe_tensor *m = pe_kin(c, AT_MASK, 0);
  pe_tensor *out = pe_kout(c, AT_OUT, 0), *p = pe_kout(c, AT_SOFTMAX, 0);
  if (pe_tensor_numel(out) == 0 && pe_tensor_numel(p) == 0) return NULL;
  at_view a = at_view_of(c, q, k, v);
  if (a.tk == 0 || a.d == 0)
    return pe_kernel_error(c, PE_ESHAPE, "K has %lld keys of %lld dims; attention needs both",
                           (long long)a.tk, (long long)a.d);
  pe_cu_smask mv;
  if (m) PE_TRY(mask_view(c, &p->shape, m, &mv));
  int64_t sp = a.tq * a.tk;
  float *P = pe_f32(p);
  PE_TRY(pe_cu_gemm(c, x, false, true, a.tq, a.d, a.tk, a.scale, pe_f32(q), a.tq * a.d, pe_f32(k),
                    a.tk * a.d, P, sp, a.bh, "attention Q Kᵀ"));
  PE_TRY(pe_cu_check(
      c,
      pe_cu_softmax_rows(P, pe_cu_f32_or_null(m), &mv, pe_attr_b(c->def, c->desc, "causal"), P,
                         a.bh * a.tq, a.tq, a.tk, x->stream),
      "attention softmax"));
  if (a.dv == 0) return NULL;
  return pe_cu_gemm(c, x, false, false, a.tq, a.tk, a.dv, 1.0f, P, sp, pe_f32(v), a.tk * a.dv,
                    pe_f32(out), a.tq * a.dv, a.bh, "attention P V");
}

pe_status *pe_cuk_scaled_dot_product_attention_grad(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *q = pe_kin(c, AT_Q, 0), *k = pe_kin(c, AT_K, 0), *v = pe_kin(c, AT_V, 0);
  pe_tensor *p = pe_kin(c, ATG_SOFTMAX, 0), *dout = pe_kin(c, ATG_DOUT, 0);
  pe_tensor *dp_in = pe_kin(c, ATG_DSOFTMAX, 0);
  pe_tensor *dq = pe_kout(c, ATG_DQ, 0), *dk = pe_kout(c, ATG_DK, 0), *dv = pe_kout(c, ATG_DV, 0);
  if (!dq && !dk && !dv) return NULL;
  at_view a = at_view_of(c, q, k, v);
  int64_t sp = a.tq * a.tk, np = a.bh * sp;
  if ((!dout && !dp_in) || np == 0 || a.d == 0) return pe_cu_zero_outputs(c, x);
  if (!p) return pe_kernel_error(c, PE_EARITY, "needs input Softmax");
  PE_TRY(at_expect(c, "Softmax", p, np));
  PE_TRY(at_expect(c, "Softmax@GRAD", dp_in, np));
  PE_TRY(at_expect(c, "Out@GRAD", dout, a.bh * a.tq * a.dv));
  const float *P = pe_f32(p);
  void *ws;
  PE_TRY(pe_cuda_workspace(x, (size_t)np * sizeof(float), &ws));
  float *ds = ws;
  if (dout) {
    const float *g = pe_f32(dout);
    if (dv && a.dv > 0)
      PE_TRY(pe_cu_gemm(c, x, true, false, a.tk, a.tq, a.dv, 1.0f, P, sp, g, a.tq * a.dv,
                        pe_f32(dv), a.tk * a.dv, a.bh, "attention dV"));
    if (a.dv > 0)
      PE_TRY(pe_cu_gemm(c, x, false, true, a.tq, a.dv, a.tk, 1.0f, g, a.tq * a.dv, pe_f32(v),
                        a.tk * a.dv, ds, sp, a.bh, "attention dP"));
    else
      PE_TRY(pe_cu_check(c, cudaMemsetAsync(ds, 0, (size_t)np * sizeof(float), x->stream),
                         "attention dP"));
    if (dp_in)
      PE_TRY(pe_cu_check(c, pe_cu_sum((const float *[]){ds, pe_f32(dp_in)}, 2, ds, np, x->stream),
                         "attention dP + Softmax@GRAD"));
  } else {
    PE_TRY(pe_cu_zero(c, x, dv));
    PE_TRY(pe_cu_check(c,
                       cudaMemcpyAsync(ds, dp_in->data, (size_t)np * sizeof(float),
                                       cudaMemcpyDeviceToDevice, x->stream),
                       "attention Softmax@GRAD"));
  }
  PE_TRY(pe_cu_check(c, pe_cu_softmax_rows_grad(P, ds, ds, a.bh * a.tq, a.tk, x->stream),
                     "attention softmax backward"));
  if (dq)
    PE_TRY(pe_cu_gemm(c, x, false, false, a.tq, a.tk, a.d, a.scale, ds, sp, pe_f32(k), a.tk * a.d,
                      pe_f32(dq), a.tq * a.d, a.bh, "attention dQ"));
  if (dk)
    PE_TRY(pe_cu_gemm(c, x, true, false, a.tk, a.tq, a.d, a.scale, ds, sp, pe_f32(q), a.tq * a.d,
                      pe_f32(dk), a.tk * a.d, a.bh, "attention dK"));
  return NULL;
}
