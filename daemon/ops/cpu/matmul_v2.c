/* matmul_v2 (Paddle's): Out = op(X) · op(Y) over the last two dims, op
 * transposing when trans_x / trans_y is set; the leading (batch) dims
 * broadcast as numpy's matmul does (aligned from the right, size 1
 * stretches). A 1-D X is a row [1, K] whose dim is dropped from Out, a 1-D
 * Y a column [K, 1] likewise; their trans flag has no effect. Two 1-D
 * operands give a scalar, [1] as every scalar here.
 *
 * One oneDNN matmul of rank nb + 2 computes each product: transposition is
 * a strided memory descriptor over the same buffer, a broadcast batch dim
 * is a dim of size 1 (oneDNN broadcasts src and weights batch dims). The
 * gradient runs two such products on the broadcast batch shape:
 *   !tx: dX = dOut · op(Y)ᵀ       tx: dX = op(Y) · dOutᵀ
 *   !ty: dY = op(X)ᵀ · dOut       ty: dY = dOutᵀ · op(X)
 * and sums an operand's broadcast batch dims out of an entry buffer
 * (pe_bcast_reduce_f32). */
#include <string.h>

#include "ops/cpu/broadcast.h"
#include "ops/cpu/dnnl_util.h"
#include "ops/matmul_view.h"
#include "ops/op_tables.h"

enum { MV_X, MV_Y };
enum { MV_OUT };
enum { MVG_X, MVG_Y, MVG_OUT, MVG_DOUT };
enum { MVG_DX, MVG_DY };

static pe_status *mv_check(pe_infer_ctx *c, pe_mv_view *v) {
  PE_TRY(pe_dnnl_infer_f32(c));
  pe_meta *x = pe_in_meta(c, MV_X, 0), *y = pe_in_meta(c, MV_Y, 0);
  if (!x || !y) return pe_infer_error(c, PE_EARITY, "needs inputs X and Y");
  bool tx = pe_attr_b(c->def, c->desc, "trans_x"), ty = pe_attr_b(c->def, c->desc, "trans_y");
  const char *why = pe_mv_plan(&x->shape, &y->shape, tx, ty, v);
  if (!why) return NULL;
  char sx[PE_SHAPE_STRLEN], sy[PE_SHAPE_STRLEN];
  return pe_infer_error(
      c, PE_ESHAPE, "X '%s' shape %s and Y '%s' shape %s (trans_x %s, trans_y %s): %s",
      pe_in_name(c, MV_X, 0), pe_shape_str(&x->shape, sx, sizeof sx), pe_in_name(c, MV_Y, 0),
      pe_shape_str(&y->shape, sy, sizeof sy), tx ? "true" : "false", ty ? "true" : "false", why);
}

static pe_status *mv_infer(pe_infer_ctx *c) {
  pe_mv_view v;
  PE_TRY(mv_check(c, &v));
  pe_shape out = pe_mv_out_shape(&v);
  pe_infer_set(c, MV_OUT, PE_F32, &out);
  return NULL;
}

static pe_status *mv_grad_infer(pe_infer_ctx *c) {
  pe_mv_view v;
  PE_TRY(mv_check(c, &v));
  return pe_infer_grad_like_inputs(c);
}

/* An [r, c] matrix operand with batch dims b[nb] (size 1: broadcast);
 * t: each matrix is stored transposed ([c, r] row-major). */
static dnnl_status_t mv_md(dnnl_memory_desc_t *md, int nb, const int64_t *b, int64_t r, int64_t c,
                           bool t) {
  dnnl_dims_t d, st;
  for (int i = 0; i < nb; i++) d[i] = b[i];
  d[nb] = r;
  d[nb + 1] = c;
  st[nb] = t ? 1 : c;
  st[nb + 1] = t ? r : 1;
  int64_t s = r * c;
  for (int i = nb - 1; i >= 0; i--) {
    st[i] = s;
    s *= b[i];
  }
  return dnnl_memory_desc_init_by_strides(md, nb + 2, d, dnnl_f32, st);
}

/* One product a[r, in] · b[in, cols] -> o[r, cols] over batch dims (ab and
 * bb broadcast to ob); ta/tb: a/b stored transposed. Args: SRC, WEIGHTS, DST. */
static pe_status *mv_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const pe_mv_view *v,
                           const int64_t *ab, const int64_t *bb, int64_t r, int64_t in,
                           int64_t cols, bool ta, bool tb) {
  dnnl_memory_desc_t a, b, o;
  dnnl_matmul_desc_t md;
  PE_TRY(pe_dnnl_check(mv_md(&a, v->nb, ab, r, in, ta), c, "matmul_v2 src desc"));
  PE_TRY(pe_dnnl_check(mv_md(&b, v->nb, bb, in, cols, tb), c, "matmul_v2 weights desc"));
  PE_TRY(pe_dnnl_check(mv_md(&o, v->nb, v->ob, r, cols, false), c, "matmul_v2 dst desc"));
  PE_TRY(pe_dnnl_check(dnnl_matmul_desc_init(&md, &a, &b, NULL, &o), c, "matmul_v2 desc"));
  dnnl_primitive_desc_t pd;
  PE_TRY(pe_dnnl_pd(c, &md, NULL, "matmul_v2 primitive desc", &pd));
  static const int args[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
  pe_dnnl_prim *p;
  pe_status *st = pe_dnnl_entry_add(c, e, pd, args, 3, "matmul_v2 primitive", &p);
  dnnl_primitive_desc_destroy(pd);
  return st;
}

/* The view of the kernel's X and Y (infer checked them) and its cache
 * entry, keyed by both shapes (the trans attributes are fixed). */
static pe_status *mv_lookup(pe_kernel_ctx *c, const pe_tensor *x, const pe_tensor *y, pe_mv_view *v,
                            pe_dnnl_entry **e, bool *fresh) {
  pe_mv_plan(&x->shape, &y->shape, pe_attr_b(c->def, c->desc, "trans_x"),
             pe_attr_b(c->def, c->desc, "trans_y"), v);
  int64_t key[PE_DNNL_KEY_MAX];
  int nk = 0;
  pe_dnnl_key_shape(key, &nk, &x->shape);
  pe_dnnl_key_shape(key, &nk, &y->shape);
  return pe_dnnl_cache_lookup(c, key, nk, e, fresh);
}

static pe_status *mv_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, MV_X, 0), *y = pe_kin(c, MV_Y, 0), *out = pe_kout(c, MV_OUT, 0);
  if (pe_tensor_numel(out) == 0) return NULL;
  if (pe_tensor_numel(x) == 0 || pe_tensor_numel(y) == 0) { /* K is 0: an empty sum */
    pe_tensor_zero(out);
    return NULL;
  }
  pe_mv_view v;
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(mv_lookup(c, x, y, &v, &e, &fresh));
  if (fresh)
    PE_TRY(pe_dnnl_cache_built(c, e, mv_build(c, e, &v, v.xb, v.yb, v.m, v.k, v.n, v.tx, v.ty)));
  void *h[] = {x->data, y->data, out->data};
  return pe_dnnl_run(c, &e->prims[0], h, "matmul_v2");
}

/* Whether an operand with batch dims b covers the whole batch ob (its
 * gradient needs no reduction). */
static bool mv_full_batch(const pe_mv_view *v, const int64_t *b) {
  for (int i = 0; i < v->nb; i++)
    if (b[i] != v->ob[i]) return false;
  return true;
}

static int64_t mv_batch_numel(const pe_mv_view *v) {
  int64_t n = 1;
  for (int i = 0; i < v->nb; i++) n *= v->ob[i];
  return n;
}

/* Entry layout: prims[0] computes dX, prims[1] dY, each on the whole
 * batch; bufs[0] / bufs[1] hold them before the reduction of a broadcast
 * operand (a 64-byte placeholder when none is needed). */
static pe_status *mv_grad_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const pe_mv_view *v) {
  int64_t nbat = mv_batch_numel(v);
  void *buf;
  size_t xbytes = mv_full_batch(v, v->xb) ? 0 : (size_t)(nbat * v->xr * v->xc) * sizeof(float);
  size_t ybytes = mv_full_batch(v, v->yb) ? 0 : (size_t)(nbat * v->yr * v->yc) * sizeof(float);
  PE_TRY(pe_dnnl_entry_buffer(c, e, xbytes, &buf));
  PE_TRY(pe_dnnl_entry_buffer(c, e, ybytes, &buf));
  if (!v->tx) /* dX[m,k] = dOut[m,n] · op(Y)ᵀ[n,k] */
    PE_TRY(mv_build(c, e, v, v->ob, v->yb, v->m, v->n, v->k, false, !v->ty));
  else /* dX[k,m] = op(Y)[k,n] · dOutᵀ[n,m] */
    PE_TRY(mv_build(c, e, v, v->yb, v->ob, v->k, v->n, v->m, v->ty, true));
  if (!v->ty) /* dY[k,n] = op(X)ᵀ[k,m] · dOut[m,n] */
    return mv_build(c, e, v, v->xb, v->ob, v->k, v->m, v->n, !v->tx, false);
  /* dY[n,k] = dOutᵀ[n,m] · op(X)[m,k] */
  return mv_build(c, e, v, v->ob, v->xb, v->n, v->m, v->k, true, v->tx);
}

/* Run product p into the gradient d of an operand with batch dims b stored
 * as [r, cols] matrices: directly when b is the whole batch, else into buf
 * and summed over the broadcast dims. */
static pe_status *mv_grad_one(pe_kernel_ctx *c, const pe_mv_view *v, pe_dnnl_prim *p, void *a0,
                              void *a1, pe_tensor *d, const int64_t *b, int64_t r, int64_t cols,
                              void *buf, const char *what) {
  bool full = mv_full_batch(v, b);
  void *h[] = {a0, a1, full ? d->data : buf};
  PE_TRY(pe_dnnl_run(c, p, h, what));
  if (full) return NULL;
  pe_shape all = {.ndim = v->nb + 2}, t = {.ndim = v->nb + 2};
  for (int i = 0; i < v->nb; i++) all.d[i] = v->ob[i], t.d[i] = b[i];
  all.d[v->nb] = t.d[v->nb] = r;
  all.d[v->nb + 1] = t.d[v->nb + 1] = cols;
  return pe_bcast_reduce_f32(&all, &t, buf, NULL, 1.0f, pe_f32(d), pe_kernel_threads(c));
}

static pe_status *mv_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, MVG_X, 0), *y = pe_kin(c, MVG_Y, 0), *dout = pe_kin(c, MVG_DOUT, 0);
  pe_tensor *dx = pe_kout(c, MVG_DX, 0), *dy = pe_kout(c, MVG_DY, 0);
  if (!dx && !dy) return NULL;
  if (!dout || pe_tensor_numel(dout) == 0) { /* no gradient, or an empty Out */
    pe_dnnl_zero_outputs(c);
    return NULL;
  }
  pe_mv_view v;
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(mv_lookup(c, x, y, &v, &e, &fresh));
  pe_shape want = pe_mv_out_shape(&v);
  if (!pe_shape_equal(&want, &dout->shape))
    return pe_kernel_error(c, PE_ESHAPE, "input Out@GRAD does not have Out's shape");
  if (v.k == 0) { /* Out is an empty sum: nothing flows back */
    pe_dnnl_zero_outputs(c);
    return NULL;
  }
  if (fresh) PE_TRY(pe_dnnl_cache_built(c, e, mv_grad_build(c, e, &v)));
  if (dx) {
    void *a0 = v.tx ? y->data : dout->data, *a1 = v.tx ? dout->data : y->data;
    PE_TRY(mv_grad_one(c, &v, &e->prims[0], a0, a1, dx, v.xb, v.xr, v.xc, e->bufs[0],
                       "matmul_v2_grad dX"));
  }
  if (dy) {
    void *a0 = v.ty ? dout->data : x->data, *a1 = v.ty ? x->data : dout->data;
    PE_TRY(mv_grad_one(c, &v, &e->prims[1], a0, a1, dy, v.yb, v.yr, v.yc, e->bufs[1],
                       "matmul_v2_grad dY"));
  }
  return NULL;
}

static const pe_attr_def mv_attrs[] = {
    {"trans_x", PE_ATTR_BOOL, false, 0, NULL},
    {"trans_y", PE_ATTR_BOOL, false, 0, NULL},
    {NULL},
};

static const pe_slot_def mv_in[] = {{"X", 1, 1, 0}, {"Y", 1, 1, 0}, {NULL}};
static const pe_slot_def mv_out[] = {{"Out", 1, 1, 0}, {NULL}};
static const pe_slot_def mv_grad_in[] = {
    {"X", 1, 1, 0}, {"Y", 1, 1, 0}, {"Out", 0, 1, 0}, {"Out" PE_GRAD_SUFFIX, 0, 1, 0}, {NULL}};
static const pe_slot_def mv_grad_out[] = {
    {"X" PE_GRAD_SUFFIX, 0, 1, 0}, {"Y" PE_GRAD_SUFFIX, 0, 1, 0}, {NULL}};

const pe_op_def pe_ops_matmul_v2[] = {
    {.type = "matmul_v2",
     .inputs = mv_in,
     .outputs = mv_out,
     .attrs = mv_attrs,
     .infer = mv_infer,
     .kernel_cpu = mv_kernel,
     .state_free = pe_dnnl_cache_free,
     .grad = pe_grad_default},
    {.type = "matmul_v2_grad",
     .inputs = mv_grad_in,
     .outputs = mv_grad_out,
     .attrs = mv_attrs,
     .infer = mv_grad_infer,
     .kernel_cpu = mv_grad_kernel,
     .state_free = pe_dnnl_cache_free},
    {NULL},
};
