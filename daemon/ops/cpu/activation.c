/* relu (our loops: oneDNN's maps NaN to 0, relu.h), tanh, sigmoid, gelu,
 * abs, square (oneDNN eltwise) and softmax (oneDNN softmax), with their
 * gradients.
 *
 * Eltwise ops are shape-agnostic, so tensors are described as 1-D [numel]
 * (any rank works and the cache key is one number). Softmax is described as
 * 3-D [outer, C, inner] with the softmax over dim 1, which is the same
 * memory as the dense tensor with the reduction over `axis`.
 * Gradients: relu's, gelu's, abs's (sign(x), 0 at 0) and square's from X;
 * tanh's and sigmoid's from Out (the *_use_dst algorithms), softmax's from
 * Out. gelu is Paddle's: the exact
 * x * Phi(x) (erf) unless its attribute approximate is true (the tanh
 * formula).
 *
 * relu and relu_grad take the attribute "layout_blocked"
 * (dnnl_act_layout.h): pass_layout.c marks all their activations blocked or
 * none, and the loops are elementwise, so they run alike in either layout. */
#include <string.h>

#include "ops/cpu/dnnl_act_layout.h"
#include "ops/cpu/dnnl_util.h"
#include "ops/cpu/relu.h"
#include "ops/op_tables.h"

enum { ACT_X };
enum { ACT_OUT };
enum { ACTG_X, ACTG_OUT, ACTG_DOUT };
enum { ACTG_DX };

/* Per-type eltwise algorithms; the grad row finds its forward by name. */
typedef struct act_kind {
  const char *type;
  dnnl_alg_kind_t fwd, bwd; /* bwd: the algorithm of the backward (and hint) */
  bool bwd_from_out;        /* the backward reads Out, not X */
} act_kind;

static const act_kind act_kinds[] = {
    {"relu", dnnl_eltwise_relu, dnnl_eltwise_relu, false},
    {"tanh", dnnl_eltwise_tanh, dnnl_eltwise_tanh_use_dst_for_bwd, true},
    {"sigmoid", dnnl_eltwise_logistic, dnnl_eltwise_logistic_use_dst_for_bwd, true},
    {"gelu", dnnl_eltwise_gelu_erf, dnnl_eltwise_gelu_erf, false},
    {"abs", dnnl_eltwise_abs, dnnl_eltwise_abs, false},
    {"square", dnnl_eltwise_square, dnnl_eltwise_square, false},
};
static const act_kind gelu_tanh = {"gelu", dnnl_eltwise_gelu_tanh, dnnl_eltwise_gelu_tanh, false};

/* The kind of c's op (a grad row finds its forward by name); gelu's
 * depends on its attribute approximate, which the grad op copies. */
static const act_kind *act_find(const pe_kernel_ctx *c) {
  const char *type = c->def->type;
  size_t n = strlen(type);
  if (n > 5 && strcmp(type + n - 5, "_grad") == 0) n -= 5;
  for (size_t i = 0; i < sizeof act_kinds / sizeof act_kinds[0]; i++)
    if (strlen(act_kinds[i].type) == n && strncmp(act_kinds[i].type, type, n) == 0) {
      if (act_kinds[i].fwd == dnnl_eltwise_gelu_erf && pe_attr_b(c->def, c->desc, "approximate"))
        return &gelu_tanh;
      return &act_kinds[i];
    }
  return NULL;
}

/* A forward entry: prims[0] (SRC, DST) from pd, which is destroyed. */
static pe_status *fwd_build(pe_kernel_ctx *c, pe_dnnl_entry *e, dnnl_primitive_desc_t pd,
                            const char *what) {
  static const int args[] = {DNNL_ARG_SRC, DNNL_ARG_DST};
  pe_dnnl_prim *p;
  pe_status *st = pe_dnnl_entry_add(c, e, pd, args, 2, what, &p);
  dnnl_primitive_desc_destroy(pd);
  return st;
}

static pe_status *act_infer(pe_infer_ctx *c) {
  PE_TRY(pe_dnnl_infer_f32(c));
  return pe_infer_same_as_first(c);
}

static pe_status *act_grad_infer(pe_infer_ctx *c) {
  PE_TRY(pe_dnnl_infer_f32(c));
  return pe_infer_grad_like_inputs(c);
}

static pe_status *eltwise_fwd_desc(pe_kernel_ctx *c, dnnl_alg_kind_t alg, int64_t n,
                                   dnnl_primitive_desc_t *pd) {
  dnnl_memory_desc_t md;
  dnnl_eltwise_desc_t ed;
  PE_TRY(pe_dnnl_check(pe_dnnl_md_plain(&md, 1, &n), c, "eltwise desc"));
  PE_TRY(
      pe_dnnl_check(dnnl_eltwise_forward_desc_init(&ed, dnnl_forward_training, alg, &md, 0.f, 0.f),
                    c, "eltwise forward desc"));
  return pe_dnnl_pd(c, &ed, NULL, "eltwise forward primitive desc", pd);
}

static pe_status *act_kernel(pe_kernel_ctx *c) {
  const act_kind *k = act_find(c);
  pe_tensor *x = pe_kin(c, ACT_X, 0), *out = pe_kout(c, ACT_OUT, 0);
  int64_t n = pe_tensor_numel(x);
  if (n == 0) return NULL;
  if (k->fwd == dnnl_eltwise_relu) { /* ours: NaN stays NaN (relu.h) */
    bool blocked;
    PE_TRY(pe_dnnl_act_tied(c, 1u << ACT_X, 1u << ACT_OUT, &blocked));
    pe_relu_f32(c, out->data, x->data, n);
    return NULL;
  }
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(pe_dnnl_cache_lookup(c, &n, 1, &e, &fresh));
  if (fresh) {
    dnnl_primitive_desc_t pd;
    pe_status *st = eltwise_fwd_desc(c, k->fwd, n, &pd);
    if (!st) st = fwd_build(c, e, pd, "eltwise forward");
    PE_TRY(pe_dnnl_cache_built(c, e, st));
  }
  void *h[] = {x->data, out->data};
  return pe_dnnl_run(c, &e->prims[0], h, c->def->type);
}

static pe_status *act_grad_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const act_kind *k, int64_t n) {
  dnnl_primitive_desc_t hint, pd;
  PE_TRY(eltwise_fwd_desc(c, k->bwd, n, &hint));
  dnnl_memory_desc_t md;
  dnnl_eltwise_desc_t ed;
  dnnl_status_t s = pe_dnnl_md_plain(&md, 1, &n);
  if (s == dnnl_success) s = dnnl_eltwise_backward_desc_init(&ed, k->bwd, &md, &md, 0.f, 0.f);
  pe_status *st = pe_dnnl_check(s, c, "eltwise backward desc");
  if (!st) st = pe_dnnl_pd(c, &ed, hint, "eltwise backward primitive desc", &pd);
  dnnl_primitive_desc_destroy(hint);
  if (st) return st;
  const int args[] = {k->bwd_from_out ? DNNL_ARG_DST : DNNL_ARG_SRC, DNNL_ARG_DIFF_DST,
                      DNNL_ARG_DIFF_SRC};
  pe_dnnl_prim *p;
  st = pe_dnnl_entry_add(c, e, pd, args, 3, "eltwise backward", &p);
  dnnl_primitive_desc_destroy(pd);
  return st;
}

static pe_status *act_grad_kernel(pe_kernel_ctx *c) {
  const act_kind *k = act_find(c);
  pe_tensor *dx = pe_kout(c, ACTG_DX, 0), *dout = pe_kin(c, ACTG_DOUT, 0);
  if (!dx) return NULL;
  if (!dout) {
    pe_tensor_zero(dx);
    return NULL;
  }
  pe_tensor *src = pe_kin(c, k->bwd_from_out ? ACTG_OUT : ACTG_X, 0);
  if (!src) return pe_kernel_error(c, PE_EARITY, "needs input %s", k->bwd_from_out ? "Out" : "X");
  int64_t n = pe_tensor_numel(dx);
  if (pe_tensor_numel(src) != n || pe_tensor_numel(dout) != n)
    return pe_kernel_error(c, PE_ESHAPE, "input sizes differ (%lld, %lld, %lld elements)",
                           (long long)pe_tensor_numel(src), (long long)pe_tensor_numel(dout),
                           (long long)n);
  if (n == 0) return NULL;
  if (k->fwd == dnnl_eltwise_relu) {
    bool blocked;
    uint32_t in = 1u << ACTG_X | 1u << ACTG_OUT | 1u << ACTG_DOUT;
    PE_TRY(pe_dnnl_act_tied(c, in, 1u << ACTG_DX, &blocked));
    pe_relu_grad_f32(c, dx->data, src->data, dout->data, n);
    return NULL;
  }
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(pe_dnnl_cache_lookup(c, &n, 1, &e, &fresh));
  if (fresh) PE_TRY(pe_dnnl_cache_built(c, e, act_grad_build(c, e, k, n)));
  void *h[] = {src->data, dout->data, dx->data};
  return pe_dnnl_run(c, &e->prims[0], h, c->def->type);
}

/* --- softmax ------------------------------------------------------------------ */

static pe_status *softmax_infer(pe_infer_ctx *c) {
  PE_TRY(pe_dnnl_infer_f32(c));
  pe_meta *x = pe_in_meta(c, ACT_X, 0);
  if (!x) return pe_infer_error(c, PE_EARITY, "missing input X");
  int64_t axis = pe_attr_i(c->def, c->desc, "axis");
  if (axis < -x->shape.ndim || axis >= x->shape.ndim || x->shape.ndim == 0) {
    char sb[PE_SHAPE_STRLEN];
    return pe_infer_error(c, PE_EATTR, "axis %lld out of range for X '%s' shape %s",
                          (long long)axis, pe_in_name(c, ACT_X, 0),
                          pe_shape_str(&x->shape, sb, sizeof sb));
  }
  pe_infer_set(c, ACT_OUT, PE_F32, &x->shape);
  return NULL;
}

static pe_status *softmax_grad_infer(pe_infer_ctx *c) {
  PE_TRY(softmax_infer(c)); /* validates X and axis; ACT_OUT == ACTG_DX == 0 */
  return pe_infer_grad_like_inputs(c);
}

/* [outer, C, inner] view of s with the softmax over `axis`. */
static void softmax_view(const pe_kernel_ctx *c, const pe_shape *s, int64_t v[3]) {
  int64_t axis = pe_attr_i(c->def, c->desc, "axis");
  if (axis < 0) axis += s->ndim;
  v[0] = pe_shape_prod(s, 0, (int)axis);
  v[1] = s->d[axis];
  v[2] = pe_shape_prod(s, (int)axis + 1, s->ndim);
}

static pe_status *softmax_fwd_desc(pe_kernel_ctx *c, const int64_t v[3],
                                   dnnl_primitive_desc_t *pd) {
  dnnl_memory_desc_t md;
  dnnl_softmax_desc_t sd;
  PE_TRY(pe_dnnl_check(pe_dnnl_md_plain(&md, 3, v), c, "softmax desc"));
  PE_TRY(pe_dnnl_check(dnnl_softmax_forward_desc_init(&sd, dnnl_forward_training, &md, 1), c,
                       "softmax forward desc"));
  return pe_dnnl_pd(c, &sd, NULL, "softmax forward primitive desc", pd);
}

static pe_status *softmax_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, ACT_X, 0), *out = pe_kout(c, ACT_OUT, 0);
  if (pe_tensor_numel(x) == 0) return NULL;
  int64_t v[3];
  softmax_view(c, &x->shape, v);
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(pe_dnnl_cache_lookup(c, v, 3, &e, &fresh));
  if (fresh) {
    dnnl_primitive_desc_t pd;
    pe_status *st = softmax_fwd_desc(c, v, &pd);
    if (!st) st = fwd_build(c, e, pd, "softmax forward");
    PE_TRY(pe_dnnl_cache_built(c, e, st));
  }
  void *h[] = {x->data, out->data};
  return pe_dnnl_run(c, &e->prims[0], h, "softmax");
}

static pe_status *softmax_grad_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const int64_t v[3]) {
  dnnl_primitive_desc_t hint, pd;
  PE_TRY(softmax_fwd_desc(c, v, &hint));
  dnnl_memory_desc_t md;
  dnnl_softmax_desc_t sd;
  dnnl_status_t s = pe_dnnl_md_plain(&md, 3, v);
  if (s == dnnl_success) s = dnnl_softmax_backward_desc_init(&sd, &md, &md, 1);
  pe_status *st = pe_dnnl_check(s, c, "softmax backward desc");
  if (!st) st = pe_dnnl_pd(c, &sd, hint, "softmax backward primitive desc", &pd);
  dnnl_primitive_desc_destroy(hint);
  if (st) return st;
  static const int args[] = {DNNL_ARG_DST, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_SRC};
  pe_dnnl_prim *p;
  st = pe_dnnl_entry_add(c, e, pd, args, 3, "softmax backward", &p);
  dnnl_primitive_desc_destroy(pd);
  return st;
}

static pe_status *softmax_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *out = pe_kin(c, ACTG_OUT, 0), *dout = pe_kin(c, ACTG_DOUT, 0);
  pe_tensor *dx = pe_kout(c, ACTG_DX, 0);
  if (!dx) return NULL;
  if (!dout) {
    pe_tensor_zero(dx);
    return NULL;
  }
  if (!out) return pe_kernel_error(c, PE_EARITY, "needs input Out");
  if (pe_tensor_numel(dx) == 0) return NULL;
  int64_t v[3];
  softmax_view(c, &dx->shape, v);
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(pe_dnnl_cache_lookup(c, v, 3, &e, &fresh));
  if (fresh) PE_TRY(pe_dnnl_cache_built(c, e, softmax_grad_build(c, e, v)));
  void *h[] = {out->data, dout->data, dx->data};
  return pe_dnnl_run(c, &e->prims[0], h, "softmax_grad");
}

/* --- rows ------------------------------------------------------------------------ */

static const pe_slot_def act_in[] = {{"X", 1, 1, 0}, {NULL}};
static const pe_slot_def act_out[] = {{"Out", 1, 1, 0}, {NULL}};
/* X and Out are both optional: each gradient reads only one of them. */
static const pe_slot_def act_grad_in[] = {
    {"X", 0, 1, 0}, {"Out", 0, 1, 0}, {"Out@GRAD", 0, 1, 0}, {NULL}};
static const pe_slot_def act_grad_out[] = {{"X@GRAD", 0, 1, 0}, {NULL}};
static const pe_slot_def softmax_grad_in[] = {
    {"X", 1, 1, 0}, {"Out", 1, 1, 0}, {"Out@GRAD", 0, 1, 0}, {NULL}};
static const pe_attr_def no_attrs[] = {{NULL}};
static const pe_attr_def relu_attrs[] = {{PE_LAYOUT_ATTR, PE_ATTR_INT, false, 0, NULL}, {NULL}};
static const pe_attr_def gelu_attrs[] = {{"approximate", PE_ATTR_BOOL, false, 0, NULL}, {NULL}};
static const pe_attr_def softmax_attrs[] = {{"axis", PE_ATTR_INT, false, -1, NULL}, {NULL}};

#define ACT_ROWS(name) ACT_ROWS_ATTRS(name, no_attrs)
#define ACT_ROWS_ATTRS(name, attr_defs)                                                       \
  {.type = name,                                                                              \
   .inputs = act_in,                                                                          \
   .outputs = act_out,                                                                        \
   .attrs = attr_defs,                                                                        \
   .infer = act_infer,                                                                        \
   .kernel_cpu = act_kernel,                                                                  \
   .state_free = pe_dnnl_cache_free,                                                          \
   .grad = pe_grad_default},                                                                  \
  {                                                                                           \
    .type = name "_grad", .inputs = act_grad_in, .outputs = act_grad_out, .attrs = attr_defs, \
    .infer = act_grad_infer, .kernel_cpu = act_grad_kernel, .state_free = pe_dnnl_cache_free, \
  }

const pe_op_def pe_ops_activation[] = {
    ACT_ROWS_ATTRS("relu", relu_attrs),
    ACT_ROWS("tanh"),
    ACT_ROWS("sigmoid"),
    ACT_ROWS_ATTRS("gelu", gelu_attrs),
    ACT_ROWS("abs"),
    ACT_ROWS("square"),
    {.type = "softmax",
     .inputs = act_in,
     .outputs = act_out,
     .attrs = softmax_attrs,
     .infer = softmax_infer,
     .kernel_cpu = softmax_kernel,
     .state_free = pe_dnnl_cache_free,
     .grad = pe_grad_default},
    {.type = "softmax_grad",
     .inputs = softmax_grad_in,
     .outputs = act_grad_out,
     .attrs = softmax_attrs,
     .infer = softmax_grad_infer,
     .kernel_cpu = softmax_grad_kernel,
     .state_free = pe_dnnl_cache_free},
    {0},
};
