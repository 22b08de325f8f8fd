/* batch_norm and batch_norm_grad on oneDNN batch normalization. Channels
 * are dim 1 of X ([N, C] or [N, C, H, W]; any rank 2..5, dense).
 *
 * Training: oneDNN computes Y with the batch statistics and writes the batch
 * mean and (biased) variance into SavedMean / SavedVariance. oneDNN keeps no
 * running statistics, so the kernel then updates them itself:
 *   MeanOut = momentum * Mean + (1 - momentum) * SavedMean (same for the
 * variance). MeanOut/VarianceOut are normally the Mean/Variance variables
 * (updated in place); the update is element-wise, so aliasing is safe, and
 * distinct tensors work too.
 * is_test: Y uses the running statistics (dnnl_use_global_stats); the
 * running stats are left alone and SavedMean/SavedVariance receive copies of
 * them, so that a gradient taken in test mode (which then also uses global
 * stats) sees the statistics the forward used.
 *
 * The gradient op gets only X, Scale, Bias, SavedMean, SavedVariance and
 * Y@GRAD (custom maker): Y and the running stats are not needed. */
#include <stdio.h>
#include <string.h>

#include "ops/cpu/dnnl_util.h"
#include "ops/op_tables.h"

enum { BN_X, BN_SCALE, BN_BIAS, BN_MEAN, BN_VAR };
enum { BN_Y, BN_MEAN_OUT, BN_VAR_OUT, BN_SAVED_MEAN, BN_SAVED_VAR };
enum { BNG_X, BNG_SCALE, BNG_BIAS, BNG_SAVED_MEAN, BNG_SAVED_VAR, BNG_DY };
enum { BNG_DX, BNG_DSCALE, BNG_DBIAS };

/* Checks X and the per-channel inputs in slots [first, last]; *cshape gets
 * the [C] shape of the statistics. */
static pe_status *bn_check(pe_infer_ctx *c, int first, int last, pe_shape *cshape) {
  PE_TRY(pe_dnnl_infer_f32(c));
  pe_meta *x = pe_in_meta(c, BN_X, 0);
  if (!x) return pe_infer_error(c, PE_EARITY, "missing input X");
  char sb[PE_SHAPE_STRLEN], sb2[PE_SHAPE_STRLEN];
  if (x->shape.ndim < 2 || x->shape.ndim > 5)
    return pe_infer_error(c, PE_ESHAPE,
                          "input X '%s' shape %s must have 2 to 5 dims (channels at 1)",
                          pe_in_name(c, BN_X, 0), pe_shape_str(&x->shape, sb, sizeof sb));
  int64_t ch = x->shape.d[1];
  for (int s = first; s <= last; s++) {
    pe_meta *m = pe_in_meta(c, s, 0);
    if (!m) return pe_infer_error(c, PE_EARITY, "missing input %s", c->def->inputs[s].name);
    if (m->shape.ndim != 1 || (ch >= 0 && m->shape.d[0] >= 0 && m->shape.d[0] != ch))
      return pe_infer_error(
          c, PE_ESHAPE, "input %s '%s' shape %s does not match X '%s' shape %s (channels %lld)",
          c->def->inputs[s].name, pe_in_name(c, s, 0), pe_shape_str(&m->shape, sb, sizeof sb),
          pe_in_name(c, BN_X, 0), pe_shape_str(&x->shape, sb2, sizeof sb2), (long long)ch);
    if (ch < 0) ch = m->shape.d[0];
  }
  *cshape = PE_SHAPE(ch);
  return NULL;
}

static pe_status *bn_infer(pe_infer_ctx *c) {
  pe_shape cs;
  PE_TRY(bn_check(c, BN_SCALE, BN_VAR, &cs));
  pe_infer_set(c, BN_Y, PE_F32, &pe_in_meta(c, BN_X, 0)->shape);
  for (int o = BN_MEAN_OUT; o <= BN_SAVED_VAR; o++) pe_infer_set(c, o, PE_F32, &cs);
  return NULL;
}

static pe_status *bn_grad_infer(pe_infer_ctx *c) {
  pe_shape cs;
  PE_TRY(bn_check(c, BNG_SCALE, BNG_SAVED_VAR, &cs));
  return pe_infer_grad_like_inputs(c);
}

static unsigned bn_flags(const pe_kernel_ctx *c) {
  unsigned f = dnnl_use_scale | dnnl_use_shift;
  return pe_attr_b(c->def, c->desc, "is_test") ? f | dnnl_use_global_stats : f;
}

static pe_status *bn_fwd_pd(pe_kernel_ctx *c, const pe_shape *x, dnnl_prop_kind_t prop,
                            unsigned flags, dnnl_primitive_desc_t *pd) {
  dnnl_memory_desc_t md;
  dnnl_batch_normalization_desc_t bd;
  float eps = pe_attr_f(c->def, c->desc, "epsilon");
  PE_TRY(pe_dnnl_check(pe_dnnl_md_of(&md, x), c, "batch norm desc"));
  PE_TRY(pe_dnnl_check(dnnl_batch_normalization_forward_desc_init(&bd, prop, &md, eps, flags), c,
                       "batch norm forward desc"));
  return pe_dnnl_pd(c, &bd, NULL, "batch norm forward primitive desc", pd);
}

/* prims[0]: training (SRC, SCALE, SHIFT, DST, MEAN, VARIANCE; stats are
 * outputs) or inference (same order; stats are inputs). bufs[0], bufs[1]:
 * stats scratch for absent SavedMean/SavedVariance in training. */
static pe_status *bn_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const pe_shape *x) {
  bool test = pe_attr_b(c->def, c->desc, "is_test");
  dnnl_primitive_desc_t pd;
  PE_TRY(bn_fwd_pd(c, x, test ? dnnl_forward_inference : dnnl_forward_training, bn_flags(c), &pd));
  static const int args[] = {DNNL_ARG_SRC, DNNL_ARG_SCALE, DNNL_ARG_SHIFT,
                             DNNL_ARG_DST, DNNL_ARG_MEAN,  DNNL_ARG_VARIANCE};
  pe_dnnl_prim *p;
  void *buf;
  pe_status *st = pe_dnnl_entry_add(c, e, pd, args, 6, "batch norm forward", &p);
  dnnl_primitive_desc_destroy(pd);
  for (int i = 0; i < 2 && !st; i++)
    st = pe_dnnl_entry_buffer(c, e, (size_t)x->d[1] * sizeof(float), &buf);
  return st;
}

/* dst[i] = a*src[i] + b*upd[i] for C channels (src and dst may alias). */
static void bn_blend(float *dst, const float *src, const float *upd, float a, float b, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = a * src[i] + b * upd[i];
}

static pe_status *bn_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, BN_X, 0), *y = pe_kout(c, BN_Y, 0);
  pe_tensor *mean = pe_kin(c, BN_MEAN, 0), *var = pe_kin(c, BN_VAR, 0);
  pe_tensor *mean_out = pe_kout(c, BN_MEAN_OUT, 0), *var_out = pe_kout(c, BN_VAR_OUT, 0);
  pe_tensor *saved_mean = pe_kout(c, BN_SAVED_MEAN, 0), *saved_var = pe_kout(c, BN_SAVED_VAR, 0);
  bool test = pe_attr_b(c->def, c->desc, "is_test");
  int64_t ch = x->shape.d[1];
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(pe_dnnl_cache_lookup_shape(c, &x->shape, &e, &fresh));
  if (fresh) PE_TRY(pe_dnnl_cache_built(c, e, bn_build(c, e, &x->shape)));
  size_t cbytes = (size_t)ch * sizeof(float);
  if (test) {
    void *h[] = {
        x->data,  pe_kin(c, BN_SCALE, 0)->data, pe_kin(c, BN_BIAS, 0)->data, y->data, mean->data,
        var->data};
    PE_TRY(pe_dnnl_run(c, &e->prims[0], h, "batch_norm (test)"));
    /* memmove: an output may be the very tensor it copies from. */
    if (saved_mean) memmove(saved_mean->data, mean->data, cbytes);
    if (saved_var) memmove(saved_var->data, var->data, cbytes);
    if (mean_out) memmove(mean_out->data, mean->data, cbytes);
    if (var_out) memmove(var_out->data, var->data, cbytes);
    return NULL;
  }
  float *bm = saved_mean ? pe_f32(saved_mean) : e->bufs[0];
  float *bv = saved_var ? pe_f32(saved_var) : e->bufs[1];
  void *h[] = {x->data, pe_kin(c, BN_SCALE, 0)->data, pe_kin(c, BN_BIAS, 0)->data, y->data, bm, bv};
  PE_TRY(pe_dnnl_run(c, &e->prims[0], h, "batch_norm"));
  float mom = pe_attr_f(c->def, c->desc, "momentum");
  if (mean_out) bn_blend(pe_f32(mean_out), pe_f32(mean), bm, mom, 1.0f - mom, ch);
  if (var_out) bn_blend(pe_f32(var_out), pe_f32(var), bv, mom, 1.0f - mom, ch);
  return NULL;
}

/* prims[0]: backward (SRC, MEAN, VARIANCE, DIFF_DST, SCALE, SHIFT,
 * DIFF_SRC, DIFF_SCALE, DIFF_SHIFT). bufs[0], bufs[1]: [C] scratch for absent
 * Scale@GRAD / Bias@GRAD; bufs[2]: X-sized scratch for an absent X@GRAD. */
static pe_status *bn_grad_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const pe_shape *x,
                                bool need_dx) {
  unsigned flags = bn_flags(c);
  dnnl_primitive_desc_t hint, pd = NULL;
  PE_TRY(bn_fwd_pd(c, x, dnnl_forward_training, flags, &hint));
  dnnl_memory_desc_t md;
  dnnl_batch_normalization_desc_t bd;
  float eps = pe_attr_f(c->def, c->desc, "epsilon");
  dnnl_status_t s = pe_dnnl_md_of(&md, x);
  if (s == dnnl_success)
    s = dnnl_batch_normalization_backward_desc_init(&bd, dnnl_backward, &md, &md, eps, flags);
  pe_status *st = pe_dnnl_check(s, c, "batch norm backward desc");
  if (!st) st = pe_dnnl_pd(c, &bd, hint, "batch norm backward primitive desc", &pd);
  dnnl_primitive_desc_destroy(hint);
  if (st) return st;
  /* oneDNN 2.6 counts SHIFT among the backward inputs when use_shift is
   * set (it does not affect the result), so Bias is bound too. */
  static const int args[] = {DNNL_ARG_SRC,      DNNL_ARG_MEAN,       DNNL_ARG_VARIANCE,
                             DNNL_ARG_DIFF_DST, DNNL_ARG_SCALE,      DNNL_ARG_SHIFT,
                             DNNL_ARG_DIFF_SRC, DNNL_ARG_DIFF_SCALE, DNNL_ARG_DIFF_SHIFT};
  pe_dnnl_prim *p;
  void *buf;
  st = pe_dnnl_entry_add(c, e, pd, args, 9, "batch norm backward", &p);
  dnnl_primitive_desc_destroy(pd);
  for (int i = 0; i < 2 && !st; i++)
    st = pe_dnnl_entry_buffer(c, e, (size_t)x->d[1] * sizeof(float), &buf);
  if (!st && need_dx)
    st = pe_dnnl_entry_buffer(c, e, (size_t)pe_shape_numel(x) * sizeof(float), &buf);
  return st;
}

static pe_status *bn_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, BNG_X, 0), *dy = pe_kin(c, BNG_DY, 0);
  pe_tensor *dx = pe_kout(c, BNG_DX, 0), *dscale = pe_kout(c, BNG_DSCALE, 0);
  pe_tensor *dbias = pe_kout(c, BNG_DBIAS, 0);
  if (!dy) {
    pe_dnnl_zero_outputs(c);
    return NULL;
  }
  if (!dx && !dscale && !dbias) return NULL;
  int64_t key[PE_DNNL_KEY_MAX];
  int nk = 0;
  pe_dnnl_key_shape(key, &nk, &x->shape);
  pe_dnnl_key_val(key, &nk, dx != NULL); /* the scratch set depends on it */
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(pe_dnnl_cache_lookup(c, key, nk, &e, &fresh));
  if (fresh) PE_TRY(pe_dnnl_cache_built(c, e, bn_grad_build(c, e, &x->shape, !dx)));
  void *h[] = {x->data,
               pe_kin(c, BNG_SAVED_MEAN, 0)->data,
               pe_kin(c, BNG_SAVED_VAR, 0)->data,
               dy->data,
               pe_kin(c, BNG_SCALE, 0)->data,
               pe_kin(c, BNG_BIAS, 0)->data,
               dx ? dx->data : e->bufs[2],
               dscale ? dscale->data : e->bufs[0],
               dbias ? dbias->data : e->bufs[1]};
  return pe_dnnl_run(c, &e->prims[0], h, "batch_norm_grad");
}

/* Custom maker: X, Scale, Bias, SavedMean, SavedVariance, Y@GRAD ->
 * X@GRAD, Scale@GRAD, Bias@GRAD (attrs copied). */
static pe_status *bn_grad_maker(pe_grad_ctx *g) {
  const pe_op_desc *f = g->fwd;
  const pe_slot *sm = pe_op_find_output(f, "SavedMean"),
                *sv = pe_op_find_output(f, "SavedVariance");
  const pe_slot *y = pe_op_find_output(f, "Y");
  if (!sm || !sm->n || !sv || !sv->n || !y || !y->n)
    return pe_error(PE_ENOGRAD,
                    "batch_norm: the gradient needs outputs Y, SavedMean and SavedVariance");
  pe_op_desc *op;
  PE_TRY(pe_grad_new_op(g, "batch_norm_grad", &op));
  static const char *const params[] = {"X", "Scale", "Bias"};
  for (int i = 0; i < 3; i++) {
    const pe_slot *s = pe_op_find_input(f, params[i]);
    if (!s || !s->n) return pe_error(PE_ENOGRAD, "batch_norm: input %s missing", params[i]);
    char gslot[32];
    snprintf(gslot, sizeof gslot, "%s" PE_GRAD_SUFFIX, params[i]);
    PE_TRY(pe_op_set_input(op, params[i], s->n, (const char *const *)s->args));
    PE_TRY(pe_dnnl_grad_slot(op, true, gslot, s));
  }
  PE_TRY(pe_op_set_input(op, "SavedMean", sm->n, (const char *const *)sm->args));
  PE_TRY(pe_op_set_input(op, "SavedVariance", sv->n, (const char *const *)sv->args));
  PE_TRY(pe_dnnl_grad_slot(op, false, "Y" PE_GRAD_SUFFIX, y));
  for (int i = 0; i < f->n_attr; i++) PE_TRY(pe_op_set_attr(op, &f->attrs[i]));
  return NULL;
}

static const pe_attr_def bn_attrs[] = {
    {"momentum", PE_ATTR_FLOAT, false, 0.9, NULL},
    {"epsilon", PE_ATTR_FLOAT, false, 1e-5, NULL},
    {"is_test", PE_ATTR_BOOL, false, 0, NULL},
    {NULL},
};
static const pe_slot_def bn_in[] = {{"X", 1, 1, 0},
                                    {"Scale", 1, 1, 0},
                                    {"Bias", 1, 1, 0},
                                    {"Mean", 1, 1, PE_SLOT_NO_GRAD},
                                    {"Variance", 1, 1, PE_SLOT_NO_GRAD},
                                    {NULL}};
static const pe_slot_def bn_out[] = {
    {"Y", 1, 1, 0},         {"MeanOut", 0, 1, 0},       {"VarianceOut", 0, 1, 0},
    {"SavedMean", 0, 1, 0}, {"SavedVariance", 0, 1, 0}, {NULL}};
static const pe_slot_def bn_grad_in[] = {{"X", 1, 1, 0},
                                         {"Scale", 1, 1, 0},
                                         {"Bias", 1, 1, 0},
                                         {"SavedMean", 1, 1, 0},
                                         {"SavedVariance", 1, 1, 0},
                                         {"Y@GRAD", 0, 1, 0},
                                         {NULL}};
static const pe_slot_def bn_grad_out[] = {
    {"X@GRAD", 0, 1, 0}, {"Scale@GRAD", 0, 1, 0}, {"Bias@GRAD", 0, 1, 0}, {NULL}};

const pe_op_def pe_ops_batch_norm[] = {
    {.type = "batch_norm",
     .inputs = bn_in,
     .outputs = bn_out,
     .attrs = bn_attrs,
     .infer = bn_infer,
     .kernel_cpu = bn_kernel,
     .state_free = pe_dnnl_cache_free,
     .grad = bn_grad_maker},
    {.type = "batch_norm_grad",
     .inputs = bn_grad_in,
     .outputs = bn_grad_out,
     .attrs = bn_attrs,
     .infer = bn_grad_infer,
     .kernel_cpu = bn_grad_kernel,
     .state_free = pe_dnnl_cache_free},
    {0},
};
