/* clip_by_global_norm: gradient clipping by the global L2 norm of several
 * tensors together (PyTorch's clip_grad_norm_ with norm_type 2).
 *
 *   X (1..n f32) -> Out (as many, each X's shape), GlobalNorm ([1] f32,
 *   optional: the norm before clipping, for monitoring)
 *   n = sqrt(sum over all X of x^2) (in double), c = max_norm / (n + 1e-6);
 *   Out_k = X_k * c when c < 1, else X_k unchanged.
 *
 * The optimizer pass appends one after backward, over every parameter
 * gradient, and the updates read its outputs. Every element is read before
 * it is written, so Out may alias X. A NaN norm leaves the gradients as
 * they are (c is not < 1): the loss shows the divergence; an infinite one
 * scales them to 0. ops/clip.h has c for both kernels. The sum of squares
 * uses pe_dot_f32's fixed partition, so the norm is the same bits on any
 * thread count (tests/ops/test_ops_clip.c). */
#include "ops/clip.h"

#include <math.h>
#include <string.h>

#include "ops/cpu/broadcast.h"
#include "ops/cpu/par_min.h"
#include "ops/cpu/simd_for.h"
#include "ops/op_tables.h"

enum { CLIP_X = 0 };
enum { CLIP_OUT = 0, CLIP_NORM };

static pe_status *clip_infer(pe_infer_ctx *c) {
  float max_norm = pe_attr_f(c->def, c->desc, "max_norm");
  if (!(max_norm > 0) || !isfinite(max_norm))
    return pe_infer_error(c, PE_EATTR, "attribute max_norm = %g must be finite and > 0",
                          (double)max_norm);
  int n = c->in[CLIP_X].n;
  if (n < 1) return pe_infer_error(c, PE_EARITY, "needs at least one input X");
  if (c->out[CLIP_OUT].n != n)
    return pe_infer_error(c, PE_EARITY, "%d inputs X but %d outputs Out (one per input)", n,
                          c->out[CLIP_OUT].n);
  for (int k = 0; k < n; k++) {
    PE_TRY(pe_infer_expect_dtype(c, CLIP_X, k, PE_F32));
    *c->out[CLIP_OUT].m[k] = *pe_in_meta(c, CLIP_X, k);
  }
  pe_shape one = PE_SHAPE(1);
  pe_infer_set(c, CLIP_NORM, PE_F32, &one);
  return NULL;
}

static pe_status *clip_kernel(pe_kernel_ctx *c) {
  int n = c->in[CLIP_X].n, nt = pe_kernel_threads(c);
  double sq = 0;
  for (int k = 0; k < n; k++) {
    const pe_tensor *x = pe_kin(c, CLIP_X, k);
    if (pe_tensor_numel(pe_kout(c, CLIP_OUT, k)) != pe_tensor_numel(x))
      return pe_kernel_error(c, PE_ESHAPE, "Out #%d has %lld elements, X #%d has %lld", k,
                             (long long)pe_tensor_numel(pe_kout(c, CLIP_OUT, k)), k,
                             (long long)pe_tensor_numel(x));
    /* A fixed partition: the norm's bits do not depend on nt. */
    sq += pe_dot_f32(pe_f32(x), pe_f32(x), pe_tensor_numel(x), nt);
  }
  double norm = sqrt(sq), coef = pe_clip_coef(norm, pe_attr_f(c->def, c->desc, "max_norm"));
  float cf = (float)coef;
  for (int k = 0; k < n; k++) {
    const float *xv = pe_f32(pe_kin(c, CLIP_X, k));
    float *ov = pe_f32(pe_kout(c, CLIP_OUT, k));
    int64_t m = pe_tensor_numel(pe_kin(c, CLIP_X, k));
    if (coef < 1.0) {
      PE_SIMD_FOR(i, m, pe_par_split(m), nt, ov[i] = xv[i] * cf;);
    } else if (ov != xv) {
      memcpy(ov, xv, (size_t)m * sizeof(float));
    }
  }
  pe_tensor *gn = c->out[CLIP_NORM].n ? pe_kout(c, CLIP_NORM, 0) : NULL;
  if (gn) pe_f32(gn)[0] = (float)norm;
  return NULL;
}

static const pe_slot_def clip_in[] = {{"X", 1, -1, 0}, {NULL}};
static const pe_slot_def clip_out[] = {{"Out", 1, -1, 0}, {"GlobalNorm", 0, 1, 0}, {NULL}};
static const pe_attr_def clip_attrs[] = {{"max_norm", PE_ATTR_FLOAT, true, 0, NULL}, {NULL}};

const pe_op_def pe_ops_clip[] = {
    {.type = "clip_by_global_norm",
     .inputs = clip_in,
     .outputs = clip_out,
     .attrs = clip_attrs,
     .flags = PE_OP_NO_GRAD,
     .infer = clip_infer,
     .kernel_cpu = clip_kernel},
    {0},
};
