/* scaled_dot_product_attention: softmax(scale Q Kᵀ + Mask, causal) V in
 * one op, heads-first as PyTorch's F.scaled_dot_product_attention:
 *
 *   Q [B, H, Tq, D], K [B, H, Tk, D], V [B, H, Tk, Dv],
 *   Mask (optional, additive, broadcasts to [B, H, Tq, Tk], no gradient)
 *   -> Out [B, H, Tq, Dv], Softmax [B, H, Tq, Tk] (the probabilities,
 *      kept for the gradient)
 *   attrs: causal (column j > row i masked out), scale (0: 1 / sqrt(D)).
 *
 * Forward: one batched oneDNN matmul writes scale Q Kᵀ into Softmax (the
 * scale is the matmul's output scale), the mask and the triangle are
 * added in place, oneDNN's softmax runs in place, a second matmul makes
 * Out. Against the composition (matmul_v2, scale, elementwise_add,
 * softmax, matmul_v2) that is two passes fewer over the [Tq, Tk] scores
 * each way, and no mask tensor for causal attention.
 * Gradient, with P = Softmax and dS in one entry buffer:
 *   dV = Pᵀ dO, dP = dO Vᵀ (+ Softmax@GRAD), dS = softmax_bwd(P, dP),
 *   dQ = scale dS K, dK = scale dSᵀ Q.
 * Transposed operands are strided descriptors over the same buffers. */
#include <math.h>
#include <string.h>

#include "ops/cpu/softmax_rows.h"
#include "ops/op_tables.h"

enum { AT_Q, AT_K, AT_V, AT_MASK };
enum { AT_OUT, AT_SOFTMAX };
enum { ATG_OUT = 4, ATG_SOFTMAX, ATG_DOUT, ATG_DSOFTMAX };
enum { ATG_DQ, ATG_DK, ATG_DV };

/* dims of Q, K, V and the batch of matrices (B * H) */
typedef struct at_dims {
  int64_t bh, tq, tk, d, dv;
} at_dims;

static bool at_dim_ok(int64_t a, int64_t b) {
  return a == b || a < 0 || b < 0;
}

static pe_status *at_check(pe_infer_ctx *c, pe_shape *scores) {
  PE_TRY(pe_dnnl_infer_f32(c));
  pe_meta *q = pe_in_meta(c, AT_Q, 0), *k = pe_in_meta(c, AT_K, 0), *v = pe_in_meta(c, AT_V, 0);
  if (!q || !k || !v) return pe_infer_error(c, PE_EARITY, "needs inputs Q, K and V");
  char sq[PE_SHAPE_STRLEN], sk[PE_SHAPE_STRLEN], sv[PE_SHAPE_STRLEN];
  pe_shape_str(&q->shape, sq, sizeof sq);
  pe_shape_str(&k->shape, sk, sizeof sk);
  pe_shape_str(&v->shape, sv, sizeof sv);
  const pe_shape *qs = &q->shape, *ks = &k->shape, *vs = &v->shape;
  if (qs->ndim != 4 || ks->ndim != 4 || vs->ndim != 4 || !at_dim_ok(qs->d[0], ks->d[0]) ||
      !at_dim_ok(qs->d[0], vs->d[0]) || !at_dim_ok(qs->d[1], ks->d[1]) ||
      !at_dim_ok(qs->d[1], vs->d[1]) || !at_dim_ok(qs->d[3], ks->d[3]) ||
      !at_dim_ok(ks->d[2], vs->d[2]))
    return pe_infer_error(c, PE_ESHAPE,
                          "Q '%s' %s, K '%s' %s, V '%s' %s must be [B, H, Tq, D], [B, H, Tk, D] "
                          "and [B, H, Tk, Dv]",
                          pe_in_name(c, AT_Q, 0), sq, pe_in_name(c, AT_K, 0), sk,
                          pe_in_name(c, AT_V, 0), sv);
  if (c->runtime && (ks->d[2] == 0 || ks->d[3] == 0))
    return pe_infer_error(c, PE_ESHAPE, "K '%s' %s has no keys or no dims; attention needs both",
                          pe_in_name(c, AT_K, 0), sk);
  *scores = (pe_shape){.ndim = 4, .d = {qs->d[0], qs->d[1], qs->d[2], ks->d[2]}};
  pe_meta *m = pe_in_meta(c, AT_MASK, 0);
  pe_smask_view mv;
  if (m && !pe_smask_plan(scores, &m->shape, &mv)) {
    char sm[PE_SHAPE_STRLEN], ss[PE_SHAPE_STRLEN];
    return pe_infer_error(c, PE_ESHAPE,
                          "input Mask '%s' shape %s does not broadcast to the scores %s",
                          pe_in_name(c, AT_MASK, 0), pe_shape_str(&m->shape, sm, sizeof sm),
                          pe_shape_str(scores, ss, sizeof ss));
  }
  float scale = pe_attr_f(c->def, c->desc, "scale");
  if (!(scale >= 0) || isinf(scale))
    return pe_infer_error(c, PE_EATTR, "scale %g must be finite and >= 0 (0: 1/sqrt(D))",
                          (double)scale);
  return NULL;
}

static pe_status *at_infer(pe_infer_ctx *c) {
  pe_shape s;
  PE_TRY(at_check(c, &s));
  const pe_shape *q = &pe_in_meta(c, AT_Q, 0)->shape, *v = &pe_in_meta(c, AT_V, 0)->shape;
  pe_shape o = {.ndim = 4, .d = {q->d[0], q->d[1], q->d[2], v->d[3]}};
  pe_infer_set(c, AT_OUT, PE_F32, &o);
  pe_infer_set(c, AT_SOFTMAX, PE_F32, &s);
  return NULL;
}

static pe_status *at_grad_infer(pe_infer_ctx *c) {
  pe_shape s;
  PE_TRY(at_check(c, &s));
  static const int scored[] = {ATG_SOFTMAX, ATG_DSOFTMAX};
  for (int i = 0; i < 2; i++) {
    int slot = scored[i];
    pe_meta *p = pe_in_meta(c, slot, 0);
    if (p && !pe_shape_compatible(&p->shape, &s)) {
      char sp[PE_SHAPE_STRLEN], ss[PE_SHAPE_STRLEN];
      return pe_infer_error(c, PE_ESHAPE, "input %s '%s' shape %s is not the scores' %s",
                            c->def->inputs[slot].name, pe_in_name(c, slot, 0),
                            pe_shape_str(&p->shape, sp, sizeof sp),
                            pe_shape_str(&s, ss, sizeof ss));
    }
  }
  return pe_infer_grad_like_inputs(c);
}

static at_dims at_dims_of(const pe_tensor *q, const pe_tensor *k, const pe_tensor *v) {
  return (at_dims){.bh = q->shape.d[0] * q->shape.d[1],
                   .tq = q->shape.d[2],
                   .tk = k->shape.d[2],
                   .d = q->shape.d[3],
                   .dv = v->shape.d[3]};
}

static float at_scale(const pe_kernel_ctx *c, const at_dims *a) {
  float s = pe_attr_f(c->def, c->desc, "scale");
  return s > 0 ? s : (float)(1.0 / sqrt((double)a->d));
}

/* [n, r, cols] matrices; t: each stored transposed ([n, cols, r] row-major). */
static dnnl_status_t at_md(dnnl_memory_desc_t *md, int64_t n, int64_t r, int64_t cols, bool t) {
  dnnl_dims_t d = {n, r, cols}, st = {r * cols, t ? 1 : cols, t ? r : 1};
  return dnnl_memory_desc_init_by_strides(md, 3, d, dnnl_f32, st);
}

/* dst[n, r, cols] = scale op(a)[n, r, in] · op(b)[n, in, cols]. */
static pe_status *at_matmul(pe_kernel_ctx *c, pe_dnnl_entry *e, int64_t n, int64_t r, int64_t in,
                            int64_t cols, bool ta, bool tb, float scale) {
  dnnl_memory_desc_t a, b, o;
  dnnl_matmul_desc_t md;
  PE_TRY(pe_dnnl_check(at_md(&a, n, r, in, ta), c, "attention src desc"));
  PE_TRY(pe_dnnl_check(at_md(&b, n, in, cols, tb), c, "attention weights desc"));
  PE_TRY(pe_dnnl_check(at_md(&o, n, r, cols, false), c, "attention dst desc"));
  PE_TRY(pe_dnnl_check(dnnl_matmul_desc_init(&md, &a, &b, NULL, &o), c, "attention matmul desc"));
  dnnl_primitive_desc_t pd;
  PE_TRY(pe_dnnl_pd_scaled(c, &md, scale, "attention matmul primitive desc", &pd));
  static const int args[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
  pe_dnnl_prim *p;
  pe_status *st = pe_dnnl_entry_add(c, e, pd, args, 3, "attention matmul", &p);
  dnnl_primitive_desc_destroy(pd);
  return st;
}

/* The entry for Q, K and V's shapes (attributes are fixed per op). */
static pe_status *at_lookup(pe_kernel_ctx *c, const pe_tensor *q, const pe_tensor *k,
                            const pe_tensor *v, pe_dnnl_entry **e, bool *fresh) {
  int64_t key[PE_DNNL_KEY_MAX];
  int nk = 0;
  pe_dnnl_key_shape(key, &nk, &q->shape);
  pe_dnnl_key_shape(key, &nk, &k->shape);
  pe_dnnl_key_shape(key, &nk, &v->shape);
  return pe_dnnl_cache_lookup(c, key, nk, e, fresh);
}

/* prims: [0] P = scale Q Kᵀ, [1] softmax in place, [2] Out = P V. */
static pe_status *at_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const at_dims *a) {
  PE_TRY(at_matmul(c, e, a->bh, a->tq, a->d, a->tk, false, true, at_scale(c, a)));
  PE_TRY(pe_softmax_rows_build(c, e, a->bh * a->tq, a->tk, false));
  return at_matmul(c, e, a->bh, a->tq, a->tk, a->dv, false, false, 1.0f);
}

/* Mask and triangle into the scores p (shape of the Softmax output). */
static void at_mask(pe_kernel_ctx *c, pe_tensor *p) {
  pe_tensor *m = pe_kin(c, AT_MASK, 0);
  bool causal = pe_attr_b(c->def, c->desc, "causal");
  pe_smask_view mv;
  pe_smask_plan(&p->shape, m ? &m->shape : &p->shape, &mv);
  pe_smask_apply(&mv, m ? pe_f32(m) : NULL, causal, pe_f32(p), pe_kernel_threads(c));
}

static pe_status *at_kernel(pe_kernel_ctx *c) {
  pe_tensor *q = pe_kin(c, AT_Q, 0), *k = pe_kin(c, AT_K, 0), *v = pe_kin(c, AT_V, 0);
  pe_tensor *out = pe_kout(c, AT_OUT, 0), *p = pe_kout(c, AT_SOFTMAX, 0);
  if (pe_tensor_numel(out) == 0 && pe_tensor_numel(p) == 0) return NULL;
  at_dims a = at_dims_of(q, k, v);
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(at_lookup(c, q, k, v, &e, &fresh));
  if (fresh) PE_TRY(pe_dnnl_cache_built(c, e, at_build(c, e, &a)));
  PE_TRY(pe_dnnl_run(c, &e->prims[0], (void *[]){q->data, k->data, p->data}, "attention Q Kᵀ"));
  at_mask(c, p);
  PE_TRY(pe_dnnl_run(c, &e->prims[1], (void *[]){p->data, p->data}, "attention softmax"));
  return pe_dnnl_run(c, &e->prims[2], (void *[]){p->data, v->data, out->data}, "attention P V");
}

/* prims: [0] dV = Pᵀ dO, [1] dP = dO Vᵀ, [2] softmax backward in place,
 * [3] dQ = scale dS K, [4] dK = scale dSᵀ Q; bufs[0] holds dP, then dS. */
static pe_status *at_grad_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const at_dims *a) {
  float s = at_scale(c, a);
  void *buf;
  PE_TRY(pe_dnnl_entry_buffer(c, e, (size_t)(a->bh * a->tq * a->tk) * sizeof(float), &buf));
  PE_TRY(at_matmul(c, e, a->bh, a->tk, a->tq, a->dv, true, false, 1.0f));
  PE_TRY(at_matmul(c, e, a->bh, a->tq, a->dv, a->tk, false, true, 1.0f));
  PE_TRY(pe_softmax_rows_build(c, e, a->bh * a->tq, a->tk, true));
  PE_TRY(at_matmul(c, e, a->bh, a->tq, a->tk, a->d, false, false, s));
  return at_matmul(c, e, a->bh, a->tk, a->tq, a->d, true, false, s);
}

static pe_status *at_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *q = pe_kin(c, AT_Q, 0), *k = pe_kin(c, AT_K, 0), *v = pe_kin(c, AT_V, 0);
  pe_tensor *p = pe_kin(c, ATG_SOFTMAX, 0), *dout = pe_kin(c, ATG_DOUT, 0);
  pe_tensor *dp_in = pe_kin(c, ATG_DSOFTMAX, 0);
  pe_tensor *dq = pe_kout(c, ATG_DQ, 0), *dk = pe_kout(c, ATG_DK, 0), *dv = pe_kout(c, ATG_DV, 0);
  if (!dq && !dk && !dv) return NULL;
  at_dims a = at_dims_of(q, k, v);
  int64_t np = a.bh * a.tq * a.tk;
  if ((!dout && !dp_in) || np == 0 || a.d == 0) {
    pe_dnnl_zero_outputs(c);
    return NULL;
  }
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(at_lookup(c, q, k, v, &e, &fresh));
  if (fresh) PE_TRY(pe_dnnl_cache_built(c, e, at_grad_build(c, e, &a)));
  float *ds = e->bufs[0];
  if (dout) {
    if (dv) PE_TRY(pe_dnnl_run(c, &e->prims[0], (void *[]){p->data, dout->data, dv->data}, "dV"));
    PE_TRY(pe_dnnl_run(c, &e->prims[1], (void *[]){dout->data, v->data, ds}, "attention dP"));
    if (dp_in) {
      const float *g = pe_f32(dp_in);
      for (int64_t i = 0; i < np; i++) ds[i] += g[i];
    }
  } else {
    if (dv) pe_tensor_zero(dv);
    memcpy(ds, dp_in->data, (size_t)np * sizeof(float));
  }
  PE_TRY(pe_dnnl_run(c, &e->prims[2], (void *[]){p->data, ds, ds}, "attention softmax backward"));
  if (dq) PE_TRY(pe_dnnl_run(c, &e->prims[3], (void *[]){ds, k->data, dq->data}, "attention dQ"));
  if (dk) PE_TRY(pe_dnnl_run(c, &e->prims[4], (void *[]){ds, q->data, dk->data}, "attention dK"));
  return NULL;
}

static const pe_slot_def at_in[] = {
    {"Q", 1, 1, 0}, {"K", 1, 1, 0}, {"V", 1, 1, 0}, {"Mask", 0, 1, PE_SLOT_NO_GRAD}, {NULL}};
static const pe_slot_def at_out[] = {{"Out", 1, 1, 0}, {"Softmax", 1, 1, 0}, {NULL}};
static const pe_slot_def at_grad_in[] = {{"Q", 1, 1, 0},
                                         {"K", 1, 1, 0},
                                         {"V", 1, 1, 0},
                                         {"Mask", 0, 1, 0},
                                         {"Out", 0, 1, 0},
                                         {"Softmax", 1, 1, 0},
                                         {"Out" PE_GRAD_SUFFIX, 0, 1, 0},
                                         {"Softmax" PE_GRAD_SUFFIX, 0, 1, 0},
                                         {NULL}};
static const pe_slot_def at_grad_out[] = {{"Q" PE_GRAD_SUFFIX, 0, 1, 0},
                                          {"K" PE_GRAD_SUFFIX, 0, 1, 0},
                                          {"V" PE_GRAD_SUFFIX, 0, 1, 0},
                                          {NULL}};
static const pe_attr_def at_attrs[] = {
    {"causal", PE_ATTR_BOOL, false, 0, NULL}, {"scale", PE_ATTR_FLOAT, false, 0, NULL}, {NULL}};

const pe_op_def pe_ops_attention[] = {
    {.type = "scaled_dot_product_attention",
     .inputs = at_in,
     .outputs = at_out,
     .attrs = at_attrs,
     .infer = at_infer,
     .kernel_cpu = at_kernel,
     .state_free = pe_dnnl_cache_free,
     .grad = pe_grad_default},
    {.type = "scaled_dot_product_attention_grad",
     .inputs = at_grad_in,
     .outputs = at_grad_out,
     .attrs = at_attrs,
     .infer = at_grad_infer,
     .kernel_cpu = at_grad_kernel,
     .state_free = pe_dnnl_cache_free},
    {NULL},
};
