/* CUDA kernels of the hand-written ops: creation, shape/copy, elementwise
 * with broadcasting, dropout, activations, optimizers, losses, mean,
 * metrics and batch norm. Each mirrors its CPU kernel in ops/cpu/ (same
 * slots, attributes and numbers) and enqueues the kernels of kernels_*.cu
 * on the stream of c->dev->cuda.
 *
 * Batch norm and the activations are own kernels rather than cuDNN's:
 * cuDNN's batch norm saves the inverse std and updates the running variance
 * unbiased, while the op contract saves the biased batch variance; and
 * cudnnActivationBackward needs both X and Out where the grad op carries
 * only one of them (relu: X; tanh, sigmoid: Out). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_graph.h"
#include "cuda/ops_cuda.h"
#include "ops/cpu/broadcast.h"
#include "ops/lr_schedule.h"
#include "ops/op_tables.h"

/* --- helpers ---------------------------------------------------------------- */

pe_status *pe_cu_need(pe_kernel_ctx *c, pe_cuda_ctx **out) {
  *out = pe_cu_ctx(c);
  if (!*out)
    return pe_kernel_error(c, PE_EINTERNAL, "CUDA kernel called without a cuda stream context");
  return NULL;
}

pe_status *pe_cu_check(pe_kernel_ctx *c, cudaError_t e, const char *what) {
  if (e == cudaSuccess) return NULL;
  cudaGetLastError(); /* a launch error is reported here, not again by the stream */
  return pe_kernel_error(c, PE_EBACKEND, "%s: CUDA error %d (%s): %s", what, (int)e,
                         cudaGetErrorName(e), cudaGetErrorString(e));
}

pe_status *pe_cu_zero(pe_kernel_ctx *c, pe_cuda_ctx *x, pe_tensor *t) {
  if (!t || !t->data || !pe_tensor_bytes(t)) return NULL;
  return pe_cu_check(c, cudaMemsetAsync(t->data, 0, pe_tensor_bytes(t), x->stream),
                     "cudaMemsetAsync");
}

pe_status *pe_cu_copy(pe_kernel_ctx *c, pe_cuda_ctx *x, pe_tensor *dst, const pe_tensor *src) {
  if (!dst) return NULL;
  if (pe_tensor_bytes(dst) != pe_tensor_bytes(src))
    return pe_kernel_error(c, PE_ESHAPE, "%lld %s elements in, %lld %s out",
                           (long long)pe_tensor_numel(src), pe_dtype_name(src->dtype),
                           (long long)pe_tensor_numel(dst), pe_dtype_name(dst->dtype));
  if (dst->data == src->data || !pe_tensor_bytes(src)) return NULL;
  return pe_cu_check(c,
                     cudaMemcpyAsync(dst->data, src->data, pe_tensor_bytes(src),
                                     cudaMemcpyDeviceToDevice, x->stream),
                     "cudaMemcpyAsync d2d");
}

pe_status *pe_cu_zero_outputs(pe_kernel_ctx *c, pe_cuda_ctx *x) {
  for (int o = 0; o < c->def->n_outputs; o++)
    for (int k = 0; k < c->out[o].n; k++) PE_TRY(pe_cu_zero(c, x, c->out[o].t[k]));
  return NULL;
}

pe_status *pe_cu_refuse_fused(pe_kernel_ctx *c, int bias_slot) {
  const char *act = pe_attr_s(c->def, c->desc, "fuse_activation");
  if (bias_slot >= 0 && (pe_kin(c, bias_slot, 0) || act[0]))
    return pe_kernel_error(c, PE_EINVAL,
                           "a Bias input or fuse_activation '%s' is not supported on cuda places "
                           "(add the bias and the activation as their own ops)",
                           act);
  if (act[0])
    return pe_kernel_error(c, PE_EINVAL,
                           "fuse_activation '%s' is not supported on cuda places (run the "
                           "activation as its own op)",
                           act);
  return NULL;
}

pe_status *pe_cu_refuse_grad_rows(pe_kernel_ctx *c) {
  int slot = pe_op_input_index(c->def, "GradRows");
  if (slot < 0 || !pe_kin(c, slot, 0)) return NULL;
  const pe_slot *sl = pe_op_find_input(c->desc, "GradRows");
  return pe_kernel_error(c, PE_EBACKEND,
                         "a sparse gradient (GradRows '%s') is applied on cpu places only; on cuda "
                         "places the embedding's gradient is dense (is_sparse false)",
                         sl && sl->n ? sl->args[0] : "");
}

void pe_cu_attr_pair(const pe_op_desc *op, const char *name, int64_t dflt, int64_t out[2]) {
  const int64_t *v;
  int n = pe_attr_ints(op, name, &v);
  out[0] = n == 2 ? v[0] : dflt;
  out[1] = n == 2 ? v[1] : dflt;
}

#define NEED(c, x) \
  pe_cuda_ctx *x;  \
  PE_TRY(pe_cu_need(c, &x))

static float *f32_or_null(pe_tensor *t) {
  return t ? pe_f32(t) : NULL;
}

/* --- creation ------------------------------------------------------------------ */

pe_status *pe_cuk_fill_constant(pe_kernel_ctx *c) {
  NEED(c, x);
  pe_tensor *out = pe_kout(c, 0, 0);
  if (!out) return NULL;
  if (out->dtype > PE_U8)
    return pe_kernel_error(c, PE_EDTYPE, "output dtype %s not supported",
                           pe_dtype_name(out->dtype));
  return pe_cu_check(c,
                     pe_cu_fill(out->data, (int)out->dtype, pe_attr_f(c->def, c->desc, "value"),
                                pe_tensor_numel(out), x->stream),
                     "fill_constant");
}

pe_status *pe_cuk_uniform_random(pe_kernel_ctx *c) {
  NEED(c, x);
  pe_tensor *out = pe_kout(c, 0, 0);
  if (!out) return NULL;
  pe_rng *r = NULL;
  uint64_t seed = 0;
  PE_TRY(pe_kernel_rng(c, &r, &seed));
  int64_t n = pe_tensor_numel(out);
  uint64_t base = pe_rng_reserve(r, (uint64_t)n);
  return pe_cu_check(c,
                     pe_cu_uniform(out->data, (int)out->dtype, n, seed, base,
                                   pe_cuda_graph_rng_delta(x->device, x->stream),
                                   pe_attr_f(c->def, c->desc, "min"),
                                   pe_attr_f(c->def, c->desc, "max"), x->stream),
                     "uniform_random");
}

pe_status *pe_cuk_gaussian_random(pe_kernel_ctx *c) {
  NEED(c, x);
  pe_tensor *out = pe_kout(c, 0, 0);
  if (!out) return NULL;
  pe_rng *r = NULL;
  uint64_t seed = 0;
  PE_TRY(pe_kernel_rng(c, &r, &seed));
  int64_t n = pe_tensor_numel(out);
  /* The same counter layout as the CPU kernel (ops/cpu/creation.c). */
  uint64_t pad = r->offset & 1;
  uint64_t base = (pe_rng_reserve(r, 2 * (uint64_t)n + pad) + pad) / 2;
  return pe_cu_check(c,
                     pe_cu_gaussian(out->data, (int)out->dtype, n, seed, base,
                                    pe_cuda_graph_rng_delta(x->device, x->stream),
                                    pe_attr_f(c->def, c->desc, "mean"),
                                    pe_attr_f(c->def, c->desc, "std"), x->stream),
                     "gaussian_random");
}

/* assign, reshape, flatten: a copy forward; X@GRAD = Out@GRAD (slot 2). */
static pe_status *copy_fwd(pe_kernel_ctx *c) {
  NEED(c, x);
  return pe_cu_copy(c, x, pe_kout(c, 0, 0), pe_kin(c, 0, 0));
}

static pe_status *copy_grad(pe_kernel_ctx *c) {
  NEED(c, x);
  pe_tensor *dx = pe_kout(c, 0, 0), *dout = pe_kin(c, 2, 0);
  if (!dx) return NULL;
  if (!dout) return pe_cu_zero(c, x, dx);
  return pe_cu_copy(c, x, dx, dout);
}

pe_status *pe_cuk_assign(pe_kernel_ctx *c) {
  return copy_fwd(c);
}
pe_status *pe_cuk_assign_grad(pe_kernel_ctx *c) {
  return copy_grad(c);
}
pe_status *pe_cuk_reshape(pe_kernel_ctx *c) {
  return copy_fwd(c);
}
pe_status *pe_cuk_reshape_grad(pe_kernel_ctx *c) {
  return copy_grad(c);
}
pe_status *pe_cuk_flatten(pe_kernel_ctx *c) {
  return copy_fwd(c);
}
pe_status *pe_cuk_flatten_grad(pe_kernel_ctx *c) {
  return copy_grad(c);
}

/* --- elementwise ------------------------------------------------------------------ */

enum { EW_X, EW_Y, EW_OUT_IN, EW_DOUT };

static pe_status *ew_shapes(pe_kernel_ctx *c, pe_shape *out, pe_shape *xa, pe_shape *ya) {
  pe_tensor *x = pe_kin(c, EW_X, 0), *y = pe_kin(c, EW_Y, 0);
  int64_t axis = pe_attr_i(c->def, c->desc, "axis");
  const char *why = pe_bcast_infer(&x->shape, &y->shape, axis, out, xa, ya);
  if (why) {
    char a[PE_SHAPE_STRLEN], b[PE_SHAPE_STRLEN];
    return pe_kernel_error(c, PE_ESHAPE, "X %s and Y %s do not broadcast (axis %lld): %s",
                           pe_shape_str(&x->shape, a, sizeof a),
                           pe_shape_str(&y->shape, b, sizeof b), (long long)axis, why);
  }
  return NULL;
}

static pe_status *ew_forward(pe_kernel_ctx *c, pe_binop op) {
  NEED(c, x);
  pe_shape out, xa, ya;
  PE_TRY(ew_shapes(c, &out, &xa, &ya));
  pe_bcast p;
  pe_bcast_plan(&p, &out, &xa, &ya);
  pe_cu_plan cp;
  memset(&cp, 0, sizeof cp);
  cp.nd = p.nd;
  cp.numel = p.numel;
  for (int d = 0; d < p.nd; d++) {
    cp.n[d] = p.n[d];
    cp.sa[d] = p.sa[d];
    cp.sb[d] = p.sb[d];
  }
  return pe_cu_check(c,
                     pe_cu_binary((int)op, &cp, pe_f32(pe_kin(c, EW_X, 0)),
                                  pe_f32(pe_kin(c, EW_Y, 0)), pe_f32(pe_kout(c, 0, 0)), x->stream),
                     c->def->type);
}

/* dt = scale * sum over t's broadcast dims of dout (.* u for mul). */
static pe_status *ew_grad_one(pe_kernel_ctx *c, pe_cuda_ctx *x, const pe_shape *out,
                              const pe_shape *ta, const pe_shape *ua, const float *dout,
                              const float *u, float scale, float *dt) {
  pe_cu_reduce r;
  memset(&r, 0, sizeof r);
  r.nd = out->ndim;
  for (int d = 0; d < out->ndim; d++) {
    r.out[d] = out->d[d];
    r.t[d] = ta->d[d];
    r.u[d] = u ? ua->d[d] : 1;
  }
  if (r.nd == 0) { /* scalars: one element */
    r.nd = 1;
    r.out[0] = r.t[0] = r.u[0] = 1;
  }
  /* The parts of a long sum go to the stream's workspace (this op uses it
   * for nothing else). */
  size_t ws_bytes = pe_cu_reduce_bcast_ws(&r);
  void *ws = NULL;
  if (ws_bytes) PE_TRY(pe_cuda_workspace(x, ws_bytes, &ws));
  return pe_cu_check(c, pe_cu_reduce_bcast(&r, dout, u, scale, dt, ws, ws_bytes, x->stream),
                     c->def->type);
}

static pe_status *ew_backward(pe_kernel_ctx *c, pe_binop op) {
  NEED(c, x);
  pe_tensor *tx = pe_kin(c, EW_X, 0), *ty = pe_kin(c, EW_Y, 0), *dout = pe_kin(c, EW_DOUT, 0);
  pe_tensor *dx = pe_kout(c, 0, 0), *dy = pe_kout(c, 1, 0);
  if (!dout) {
    PE_TRY(pe_cu_zero(c, x, dx));
    return pe_cu_zero(c, x, dy);
  }
  pe_shape out, xa, ya;
  PE_TRY(ew_shapes(c, &out, &xa, &ya));
  if (pe_tensor_numel(dout) != pe_shape_numel(&out)) {
    char a[PE_SHAPE_STRLEN], b[PE_SHAPE_STRLEN];
    return pe_kernel_error(c, PE_ESHAPE, "Out@GRAD %s does not match the output shape %s",
                           pe_shape_str(&dout->shape, a, sizeof a),
                           pe_shape_str(&out, b, sizeof b));
  }
  bool mul = op == PE_BIN_MUL;
  if (dx)
    PE_TRY(
        ew_grad_one(c, x, &out, &xa, &ya, pe_f32(dout), mul ? pe_f32(ty) : NULL, 1.0f, pe_f32(dx)));
  if (dy)
    PE_TRY(ew_grad_one(c, x, &out, &ya, &xa, pe_f32(dout), mul ? pe_f32(tx) : NULL,
                       op == PE_BIN_SUB ? -1.0f : 1.0f, pe_f32(dy)));
  return NULL;
}

pe_status *pe_cuk_elementwise_add(pe_kernel_ctx *c) {
  PE_TRY(pe_cu_refuse_fused(c, -1)); /* pass fuse_add_act: cpu and sim only */
  return ew_forward(c, PE_BIN_ADD);
}
pe_status *pe_cuk_elementwise_sub(pe_kernel_ctx *c) {
  return ew_forward(c, PE_BIN_SUB);
}
pe_status *pe_cuk_elementwise_mul(pe_kernel_ctx *c) {
  return ew_forward(c, PE_BIN_MUL);
}
pe_status *pe_cuk_elementwise_add_grad(pe_kernel_ctx *c) {
  PE_TRY(pe_cu_refuse_fused(c, -1));
  return ew_backward(c, PE_BIN_ADD);
}
pe_status *pe_cuk_elementwise_sub_grad(pe_kernel_ctx *c) {
  return ew_backward(c, PE_BIN_SUB);
}
pe_status *pe_cuk_elementwise_mul_grad(pe_kernel_ctx *c) {
  return ew_backward(c, PE_BIN_MUL);
}

pe_status *pe_cuk_scale(pe_kernel_ctx *c) {
  NEED(c, x);
  pe_tensor *in = pe_kin(c, 0, 0), *o = pe_kout(c, 0, 0);
  float s = pe_attr_f(c->def, c->desc, "scale"), b = pe_attr_f(c->def, c->desc, "bias");
  if (!pe_attr_b(c->def, c->desc, "bias_after_scale")) b *= s;
  return pe_cu_check(c, pe_cu_affine(pe_f32(in), pe_f32(o), pe_tensor_numel(in), s, b, x->stream),
                     "scale");
}

pe_status *pe_cuk_scale_grad(pe_kernel_ctx *c) {
  NEED(c, x);
  pe_tensor *dout = pe_kin(c, 2, 0), *dx = pe_kout(c, 0, 0);
  if (!dx) return NULL;
  if (!dout) return pe_cu_zero(c, x, dx);
  if (pe_tensor_numel(dout) != pe_tensor_numel(dx))
    return pe_kernel_error(c, PE_ESHAPE, "Out@GRAD has %lld elements, X has %lld",
                           (long long)pe_tensor_numel(dout), (long long)pe_tensor_numel(dx));
  return pe_cu_check(c,
                     pe_cu_affine(pe_f32(dout), pe_f32(dx), pe_tensor_numel(dx),
                                  pe_attr_f(c->def, c->desc, "scale"), 0.0f, x->stream),
                     "scale_grad");
}

/* Out may be one of the inputs (gradient accumulation): a launch reads all
 * of its (up to 64) inputs before writing an element, and later launches
 * add the running total in Out to the next inputs. An input that Out
 * aliases is summed in the first launch, before Out is overwritten (so more
 * than 64 inputs work in place too, as on the CPU). */
pe_status *pe_cuk_sum(pe_kernel_ctx *c) {
  NEED(c, x);
  int nx = c->in[0].n;
  pe_tensor *o = pe_kout(c, 0, 0);
  int64_t n = pe_tensor_numel(o);
  int alias = 0; /* the input taken first */
  for (int k = 0; k < nx; k++) {
    if (pe_tensor_numel(pe_kin(c, 0, k)) != n)
      return pe_kernel_error(c, PE_ESHAPE, "input X #%d has %lld elements, Out has %lld", k,
                             (long long)pe_tensor_numel(pe_kin(c, 0, k)), (long long)n);
    if (k >= 64 && n && pe_kin(c, 0, k)->data == o->data) alias = k;
  }
  const float *xs[64];
  int done = 0;
  while (done < nx) {
    int k = 0;
    if (done > 0) xs[k++] = pe_f32(o); /* the running total */
    for (; k < 64 && done < nx; done++) {
      /* Order: alias, then the others in order (alias == 0: the identity). */
      int i = done == 0 ? alias : done <= alias ? done - 1 : done;
      xs[k++] = pe_f32(pe_kin(c, 0, i));
    }
    PE_TRY(pe_cu_check(c, pe_cu_sum(xs, k, pe_f32(o), n, x->stream), "sum"));
  }
  return NULL;
}

pe_status *pe_cuk_sum_grad(pe_kernel_ctx *c) {
  NEED(c, x);
  pe_tensor *dout = pe_kin(c, 2, 0);
  for (int k = 0; k < c->out[0].n; k++) {
    pe_tensor *dx = pe_kout(c, 0, k);
    PE_TRY(dout ? pe_cu_copy(c, x, dx, dout) : pe_cu_zero(c, x, dx));
  }
  return NULL;
}

/* --- dropout --------------------------------------------------------------------------- */

typedef struct dropout_cfg {
  float p;
  bool is_test, upscale;
} dropout_cfg;

static pe_status *dropout_read(pe_kernel_ctx *c, dropout_cfg *cfg) {
  cfg->p = pe_attr_f(c->def, c->desc, "dropout_prob");
  cfg->is_test = pe_attr_b(c->def, c->desc, "is_test");
  const char *impl = pe_attr_s(c->def, c->desc, "dropout_implementation");
  cfg->upscale = strcmp(impl, "upscale_in_train") == 0;
  if (!(cfg->p >= 0.0f && cfg->p <= 1.0f))
    return pe_kernel_error(c, PE_EATTR, "attribute 'dropout_prob' = %g is outside [0, 1]", cfg->p);
  if (!cfg->upscale && strcmp(impl, "downgrade_in_infer") != 0)
    return pe_kernel_error(c, PE_EATTR,
                           "attribute 'dropout_implementation' = \"%s\"; use \"upscale_in_train\" "
                           "or \"downgrade_in_infer\"",
                           impl);
  return NULL;
}

static float dropout_scale(const dropout_cfg *cfg) {
  if (cfg->is_test) return cfg->upscale ? 1.0f : 1.0f - cfg->p;
  if (!cfg->upscale) return 1.0f;
  return cfg->p < 1.0f ? 1.0f / (1.0f - cfg->p) : 0.0f;
}

pe_status *pe_cuk_dropout(pe_kernel_ctx *c) {
  NEED(c, x);
  dropout_cfg cfg;
  PE_TRY(dropout_read(c, &cfg));
  pe_tensor *in = pe_kin(c, 0, 0), *out = pe_kout(c, 0, 0), *mask = pe_kout(c, 1, 0);
  int64_t n = pe_tensor_numel(in);
  float scale = dropout_scale(&cfg);
  if (cfg.is_test) {
    if (mask && n)
      PE_TRY(pe_cu_check(c, cudaMemsetAsync(mask->data, 1, (size_t)n, x->stream), "dropout mask"));
    if (out)
      PE_TRY(pe_cu_check(c, pe_cu_scale_u8(pe_f32(in), NULL, pe_f32(out), n, scale, x->stream),
                         "dropout"));
    return NULL;
  }
  pe_rng *r = NULL;
  uint64_t seed = 0;
  PE_TRY(pe_kernel_rng(c, &r, &seed));
  uint64_t base = pe_rng_reserve(r, (uint64_t)n);
  return pe_cu_check(
      c,
      pe_cu_dropout(pe_f32(in), f32_or_null(out), mask ? mask->data : NULL, n, seed, base,
                    pe_cuda_graph_rng_delta(x->device, x->stream), cfg.p, scale, x->stream),
      "dropout");
}

pe_status *pe_cuk_dropout_grad(pe_kernel_ctx *c) {
  NEED(c, x);
  dropout_cfg cfg;
  PE_TRY(dropout_read(c, &cfg));
  pe_tensor *dx = pe_kout(c, 0, 0), *mask = pe_kin(c, 0, 0), *dout = pe_kin(c, 1, 0);
  if (!dx) return NULL;
  if (!dout) return pe_cu_zero(c, x, dx);
  if (pe_tensor_numel(dout) != pe_tensor_numel(mask))
    return pe_kernel_error(c, PE_ESHAPE, "Out@GRAD has %lld elements, Mask %lld",
                           (long long)pe_tensor_numel(dout), (long long)pe_tensor_numel(mask));
  return pe_cu_check(c,
                     pe_cu_scale_u8(pe_f32(dout), mask->data, pe_f32(dx), pe_tensor_numel(dx),
                                    dropout_scale(&cfg), x->stream),
                     "dropout_grad");
}

/* --- activations -------------------------------------------------------------------------- */

static pe_status *act_fwd(pe_kernel_ctx *c, pe_cu_act a) {
  NEED(c, x);
  pe_tensor *in = pe_kin(c, 0, 0), *out = pe_kout(c, 0, 0);
  return pe_cu_check(c, pe_cu_act_fwd(a, pe_f32(in), pe_f32(out), pe_tensor_numel(in), x->stream),
                     c->def->type);
}

/* Grad inputs: X, Out, Out@GRAD; relu reads X, tanh/sigmoid read Out. */
static pe_status *act_bwd(pe_kernel_ctx *c, pe_cu_act a) {
  NEED(c, x);
  pe_tensor *dx = pe_kout(c, 0, 0), *dout = pe_kin(c, 2, 0);
  if (!dx) return NULL;
  if (!dout) return pe_cu_zero(c, x, dx);
  bool from_out = a != PE_CU_RELU;
  pe_tensor *src = pe_kin(c, from_out ? 1 : 0, 0);
  if (!src) return pe_kernel_error(c, PE_EARITY, "needs input %s", from_out ? "Out" : "X");
  int64_t n = pe_tensor_numel(dx);
  if (pe_tensor_numel(src) != n || pe_tensor_numel(dout) != n)
    return pe_kernel_error(c, PE_ESHAPE, "input sizes differ (%lld, %lld, %lld elements)",
                           (long long)pe_tensor_numel(src), (long long)pe_tensor_numel(dout),
                           (long long)n);
  return pe_cu_check(c,
                     pe_cu_act_bwd(a, from_out ? NULL : pe_f32(src), from_out ? pe_f32(src) : NULL,
                                   pe_f32(dout), pe_f32(dx), n, x->stream),
                     c->def->type);
}

pe_status *pe_cuk_relu(pe_kernel_ctx *c) {
  return act_fwd(c, PE_CU_RELU);
}
pe_status *pe_cuk_tanh(pe_kernel_ctx *c) {
  return act_fwd(c, PE_CU_TANH);
}
pe_status *pe_cuk_sigmoid(pe_kernel_ctx *c) {
  return act_fwd(c, PE_CU_SIGMOID);
}
pe_status *pe_cuk_relu_grad(pe_kernel_ctx *c) {
  return act_bwd(c, PE_CU_RELU);
}
pe_status *pe_cuk_tanh_grad(pe_kernel_ctx *c) {
  return act_bwd(c, PE_CU_TANH);
}
pe_status *pe_cuk_sigmoid_grad(pe_kernel_ctx *c) {
  return act_bwd(c, PE_CU_SIGMOID);
}

/* --- optimizers (the learning rate and the Adam powers stay on the device) ---------- */

pe_status *pe_cuk_lr_schedule(pe_kernel_ctx *c) {
  NEED(c, x);
  pe_lr_params p;
  PE_TRY(pe_lr_params_from_op(c->def, c->desc, &p));
  return pe_cu_check(
      c,
      pe_cu_lr_schedule((const int64_t *)pe_kin(c, 0, 0)->data, (int64_t *)pe_kout(c, 0, 0)->data,
                        pe_f32(pe_kout(c, 1, 0)), &p, x->stream),
      "lr_schedule");
}

pe_status *pe_cuk_sgd(pe_kernel_ctx *c) {
  PE_TRY(pe_cu_refuse_grad_rows(c));
  NEED(c, x);
  pe_tensor *p = pe_kin(c, 0, 0);
  return pe_cu_check(c,
                     pe_cu_sgd(pe_f32(p), pe_f32(pe_kin(c, 1, 0)), pe_f32(pe_kin(c, 2, 0)),
                               pe_optimizer_l2_coeff(c->def, c->desc), pe_f32(pe_kout(c, 0, 0)),
                               pe_tensor_numel(p), x->stream),
                     "sgd");
}

pe_status *pe_cuk_momentum(pe_kernel_ctx *c) {
  PE_TRY(pe_cu_refuse_grad_rows(c));
  NEED(c, x);
  pe_tensor *p = pe_kin(c, 0, 0);
  return pe_cu_check(
      c,
      pe_cu_momentum(pe_f32(p), pe_f32(pe_kin(c, 1, 0)), pe_f32(pe_kin(c, 2, 0)),
                     pe_f32(pe_kin(c, 3, 0)), pe_attr_f(c->def, c->desc, "mu"),
                     pe_attr_b(c->def, c->desc, "use_nesterov"),
                     pe_optimizer_l2_coeff(c->def, c->desc), pe_f32(pe_kout(c, 0, 0)),
                     pe_f32(pe_kout(c, 1, 0)), pe_tensor_numel(p), x->stream),
      "momentum");
}

pe_status *pe_cuk_adam(pe_kernel_ctx *c) {
  PE_TRY(pe_cu_refuse_grad_rows(c));
  NEED(c, x);
  pe_tensor *p = pe_kin(c, 0, 0);
  return pe_cu_check(
      c,
      pe_cu_adam(pe_f32(p), pe_f32(pe_kin(c, 1, 0)), pe_f32(pe_kin(c, 2, 0)),
                 pe_f32(pe_kin(c, 3, 0)), pe_f32(pe_kin(c, 4, 0)), pe_f32(pe_kin(c, 5, 0)),
                 pe_f32(pe_kin(c, 6, 0)), pe_attr_f(c->def, c->desc, "beta1"),
                 pe_attr_f(c->def, c->desc, "beta2"), pe_attr_f(c->def, c->desc, "epsilon"),
                 pe_optimizer_l2_coeff(c->def, c->desc),
                 pe_optimizer_decoupled_coeff(c->def, c->desc), pe_f32(pe_kout(c, 0, 0)),
                 pe_f32(pe_kout(c, 1, 0)), pe_f32(pe_kout(c, 2, 0)), pe_f32(pe_kout(c, 3, 0)),
                 pe_f32(pe_kout(c, 4, 0)), pe_tensor_numel(p), x->stream),
      "adam");
}

/* --- losses and mean ------------------------------------------------------------------------ */

static void rows_of(const pe_tensor *t, int64_t *rows, int64_t *C) {
  int64_t n = pe_tensor_numel(t);
  *C = t->shape.ndim ? t->shape.d[t->shape.ndim - 1] : 1;
  *rows = *C ? n / *C : 0;
}

pe_status *pe_cuk_softmax_with_cross_entropy(pe_kernel_ctx *c) {
  NEED(c, x);
  pe_tensor *in = pe_kin(c, 0, 0), *lab = pe_kin(c, 1, 0);
  bool soft = pe_attr_b(c->def, c->desc, "soft_label");
  int64_t rows, C;
  rows_of(in, &rows, &C);
  return pe_cu_check(
      c,
      pe_cu_swce(pe_f32(in), soft ? NULL : pe_i64(lab), soft ? pe_f32(lab) : NULL,
                 pe_f32(pe_kout(c, 0, 0)), pe_f32(pe_kout(c, 1, 0)), rows, C, x->stream),
      "softmax_with_cross_entropy");
}

/* Grad inputs: Logits, Label, Softmax, Loss, Softmax@GRAD, Loss@GRAD. */
pe_status *pe_cuk_softmax_with_cross_entropy_grad(pe_kernel_ctx *c) {
  NEED(c, x);
  pe_tensor *dx = pe_kout(c, 0, 0);
  if (!dx) return NULL;
  pe_tensor *lab = pe_kin(c, 1, 0), *sm = pe_kin(c, 2, 0);
  pe_tensor *dsm = pe_kin(c, 4, 0), *dloss = pe_kin(c, 5, 0);
  bool soft = pe_attr_b(c->def, c->desc, "soft_label");
  int64_t rows, C;
  rows_of(dx, &rows, &C);
  if (!sm || pe_tensor_numel(sm) != pe_tensor_numel(dx))
    return pe_kernel_error(c, PE_EINVAL, "needs the forward Softmax output with %lld elements",
                           (long long)pe_tensor_numel(dx));
  return pe_cu_check(
      c,
      pe_cu_swce_grad(pe_f32(sm), soft ? NULL : pe_i64(lab), soft ? pe_f32(lab) : NULL,
                      f32_or_null(dloss), f32_or_null(dsm), pe_f32(dx), rows, C, x->stream),
      "softmax_with_cross_entropy_grad");
}

pe_status *pe_cuk_cross_entropy(pe_kernel_ctx *c) {
  NEED(c, x);
  pe_tensor *in = pe_kin(c, 0, 0), *lab = pe_kin(c, 1, 0);
  bool soft = pe_attr_b(c->def, c->desc, "soft_label");
  int64_t rows, C;
  rows_of(in, &rows, &C);
  return pe_cu_check(c,
                     pe_cu_ce(pe_f32(in), soft ? NULL : pe_i64(lab), soft ? pe_f32(lab) : NULL,
                              pe_f32(pe_kout(c, 0, 0)), rows, C, x->stream),
                     "cross_entropy");
}

pe_status *pe_cuk_cross_entropy_grad(pe_kernel_ctx *c) {
  NEED(c, x);
  pe_tensor *dx = pe_kout(c, 0, 0);
  if (!dx) return NULL;
  pe_tensor *in = pe_kin(c, 0, 0), *lab = pe_kin(c, 1, 0), *dy = pe_kin(c, 3, 0);
  if (!dy) return pe_cu_zero(c, x, dx);
  bool soft = pe_attr_b(c->def, c->desc, "soft_label");
  int64_t rows, C;
  rows_of(in, &rows, &C);
  return pe_cu_check(c,
                     pe_cu_ce_grad(pe_f32(in), soft ? NULL : pe_i64(lab), soft ? pe_f32(lab) : NULL,
                                   pe_f32(dy), pe_f32(dx), rows, C, x->stream),
                     "cross_entropy_grad");
}

pe_status *pe_cuk_mean(pe_kernel_ctx *c) {
  NEED(c, x);
  pe_tensor *in = pe_kin(c, 0, 0);
  return pe_cu_check(
      c, pe_cu_mean(pe_f32(in), pe_tensor_numel(in), pe_f32(pe_kout(c, 0, 0)), x->stream), "mean");
}

/* X (k tensors) -> Out (k), GlobalNorm (optional); the sums of squares in
 * the stream's workspace. */
pe_status *pe_cuk_clip_by_global_norm(pe_kernel_ctx *c) {
  NEED(c, x);
  int k = c->in[0].n;
  void *ws;
  PE_TRY(pe_cuda_workspace(x, (size_t)k * sizeof(double), &ws));
  const float **xs = calloc((size_t)k, sizeof *xs);
  float **os = calloc((size_t)k, sizeof *os);
  int64_t *ns = calloc((size_t)k, sizeof *ns);
  pe_status *st = NULL;
  if (!xs || !os || !ns) st = pe_error(PE_ENOMEM, "clip_by_global_norm: out of memory");
  for (int j = 0; !st && j < k; j++) {
    xs[j] = pe_f32(pe_kin(c, 0, j));
    os[j] = pe_f32(pe_kout(c, 0, j));
    ns[j] = pe_tensor_numel(pe_kin(c, 0, j));
    if (pe_tensor_numel(pe_kout(c, 0, j)) != ns[j])
      st = pe_kernel_error(c, PE_ESHAPE, "Out #%d has %lld elements, X #%d has %lld", j,
                           (long long)pe_tensor_numel(pe_kout(c, 0, j)), j, (long long)ns[j]);
  }
  pe_tensor *gn = c->out[1].n ? pe_kout(c, 1, 0) : NULL;
  if (!st)
    st =
        pe_cu_check(c,
                    pe_cu_clip_by_global_norm(xs, os, ns, k, pe_attr_f(c->def, c->desc, "max_norm"),
                                              ws, gn ? pe_f32(gn) : NULL, x->stream),
                    "clip_by_global_norm");
  free(xs);
  free(os);
  free(ns);
  return st;
}

pe_status *pe_cuk_mean_grad(pe_kernel_ctx *c) {
  NEED(c, x);
  pe_tensor *dx = pe_kout(c, 0, 0), *dout = pe_kin(c, 2, 0);
  if (!dx) return NULL;
  return pe_cu_check(c,
                     pe_cu_mean_grad(f32_or_null(dout), pe_f32(dx), pe_tensor_numel(dx), x->stream),
                     "mean_grad");
}

/* --- metrics ------------------------------------------------------------------------------ */

pe_status *pe_cuk_accuracy(pe_kernel_ctx *c) {
  NEED(c, x);
  pe_tensor *in = pe_kin(c, 0, 0), *label = pe_kin(c, 1, 0);
  pe_tensor *acc = pe_kout(c, 0, 0), *cor = pe_kout(c, 1, 0), *tot = pe_kout(c, 2, 0);
  return pe_cu_check(
      c,
      pe_cu_accuracy(in->data, (int)in->dtype, pe_i64(label), in->shape.d[0], in->shape.d[1],
                     pe_attr_i(c->def, c->desc, "k"), f32_or_null(acc), cor ? pe_i64(cor) : NULL,
                     tot ? pe_i64(tot) : NULL, x->stream),
      "accuracy");
}

pe_status *pe_cuk_top_k(pe_kernel_ctx *c) {
  NEED(c, x);
  pe_tensor *in = pe_kin(c, 0, 0), *out = pe_kout(c, 0, 0), *ind = pe_kout(c, 1, 0);
  if (!out || !ind) return pe_kernel_error(c, PE_EARITY, "needs outputs Out and Indices");
  int64_t k = pe_attr_i(c->def, c->desc, "k");
  int64_t len = in->shape.d[in->shape.ndim - 1];
  if (k < 1 || k > len)
    return pe_kernel_error(c, PE_EATTR, "attribute 'k' = %lld, last dim %lld", (long long)k,
                           (long long)len);
  int64_t rows = len ? pe_tensor_numel(in) / len : 0;
  return pe_cu_check(
      c, pe_cu_top_k(in->data, (int)in->dtype, rows, len, k, out->data, pe_i64(ind), x->stream),
      "top_k");
}

/* --- batch norm ----------------------------------------------------------------------------- */

static void bn_dims(const pe_tensor *t, int64_t *N, int64_t *C, int64_t *S) {
  *N = t->shape.d[0];
  *C = t->shape.d[1];
  *S = pe_shape_prod(&t->shape, 2, t->shape.ndim);
}

/* The stream's workspace: the reductions' partial sums (scratch), then 2*C
 * floats (spare) standing in for optional outputs the kernels still need. */
static pe_status *bn_workspace(pe_cuda_ctx *x, int64_t N, int64_t C, int64_t S, void **scratch,
                               void **spare) {
  size_t part = pe_cu_bn_scratch_bytes(N, C, S);
  void *ws;
  PE_TRY(pe_cuda_workspace(x, part + 2 * (size_t)C * sizeof(float), &ws));
  *scratch = ws;
  *spare = (char *)ws + part;
  return NULL;
}

/* Inputs X, Scale, Bias, Mean, Variance; outputs Y, MeanOut, VarianceOut,
 * SavedMean, SavedVariance (all but Y optional: scratch stands in);
 * fuse_activation refused. */
pe_status *pe_cuk_batch_norm(pe_kernel_ctx *c) {
  NEED(c, x);
  PE_TRY(pe_cu_refuse_fused(c, -1));
  pe_tensor *in = pe_kin(c, 0, 0);
  int64_t N, C, S;
  bn_dims(in, &N, &C, &S);
  pe_tensor *sm = pe_kout(c, 3, 0), *sv = pe_kout(c, 4, 0);
  float *smp = f32_or_null(sm), *svp = f32_or_null(sv);
  void *scratch, *spare;
  PE_TRY(bn_workspace(x, N, C, S, &scratch, &spare));
  if (!smp) smp = spare;
  if (!svp) svp = (float *)spare + C;
  return pe_cu_check(
      c,
      pe_cu_bn_fwd(pe_f32(in), pe_f32(pe_kin(c, 1, 0)), pe_f32(pe_kin(c, 2, 0)),
                   pe_f32(pe_kin(c, 3, 0)), pe_f32(pe_kin(c, 4, 0)), pe_f32(pe_kout(c, 0, 0)),
                   f32_or_null(pe_kout(c, 1, 0)), f32_or_null(pe_kout(c, 2, 0)), smp, svp, N, C, S,
                   pe_attr_f(c->def, c->desc, "momentum"), pe_attr_f(c->def, c->desc, "epsilon"),
                   pe_attr_b(c->def, c->desc, "is_test"), scratch, x->stream),
      "batch_norm");
}

/* Inputs X, Scale, Bias, SavedMean, SavedVariance, Y (a fused relu's mask:
 * refused with it), Y@GRAD; outputs X@GRAD, Scale@GRAD, Bias@GRAD (absent
 * ones computed into scratch: dX needs them). Slot indices as
 * ops/cpu/batch_norm.c's rows. */
pe_status *pe_cuk_batch_norm_grad(pe_kernel_ctx *c) {
  NEED(c, x);
  PE_TRY(pe_cu_refuse_fused(c, -1));
  pe_tensor *dy = pe_kin(c, 6, 0);
  if (!dy) return pe_cu_zero_outputs(c, x);
  pe_tensor *in = pe_kin(c, 0, 0);
  int64_t N, C, S;
  bn_dims(in, &N, &C, &S);
  float *ds = f32_or_null(pe_kout(c, 1, 0)), *db = f32_or_null(pe_kout(c, 2, 0));
  void *scratch, *spare;
  PE_TRY(bn_workspace(x, N, C, S, &scratch, &spare));
  if (!ds) ds = spare;
  if (!db) db = (float *)spare + C;
  return pe_cu_check(
      c,
      pe_cu_bn_bwd(pe_f32(in), pe_f32(pe_kin(c, 1, 0)), pe_f32(pe_kin(c, 3, 0)),
                   pe_f32(pe_kin(c, 4, 0)), pe_f32(dy), f32_or_null(pe_kout(c, 0, 0)), ds, db, N, C,
                   S, pe_attr_f(c->def, c->desc, "epsilon"), pe_attr_b(c->def, c->desc, "is_test"),
                   scratch, x->stream),
      "batch_norm_grad");
}
