/* matmul (Paddle "mul" semantics) and its gradient, on oneDNN matmul.
 *
 * X is viewed as an [M, K] matrix (dims split at x_num_col_dims), Y as
 * [K, N] (split at y_num_col_dims); Out = X·Y has dims X[:xnc] + Y[ync:].
 * Flattening is free: tensors are dense row-major, so only the memory
 * descriptors change. The gradient uses transposed (strided) descriptors
 * over the same buffers instead of materialising Xᵀ or Yᵀ:
 *   dX[M,K] = dOut[M,N] · Yᵀ,   dY[K,N] = Xᵀ · dOut[M,N]. */
#include <string.h>

#include "ops/cpu/dnnl_util.h"
#include "ops/op_tables.h"

enum { MM_X, MM_Y };
enum { MM_OUT };
enum { MMG_X, MMG_Y, MMG_OUT, MMG_DOUT };
enum { MMG_DX, MMG_DY };

/* The [M,K]·[K,N] view of X and Y; -1 for a product with an unknown dim. */
typedef struct mm_dims {
  int64_t m, k, ky, n;
} mm_dims;

static mm_dims mm_view(const pe_shape *x, const pe_shape *y, int xnc, int ync) {
  mm_dims d = {pe_shape_prod(x, 0, xnc), pe_shape_prod(x, xnc, x->ndim), pe_shape_prod(y, 0, ync),
               pe_shape_prod(y, ync, y->ndim)};
  return d;
}

/* Validate X, Y and the num_col_dims attrs; fills the view. */
static pe_status *mm_check(pe_infer_ctx *c, int sx, int sy, int *xnc, int *ync, mm_dims *d) {
  PE_TRY(pe_dnnl_infer_f32(c));
  pe_meta *x = pe_in_meta(c, sx, 0), *y = pe_in_meta(c, sy, 0);
  if (!x || !y) return pe_infer_error(c, PE_EARITY, "needs inputs X and Y");
  *xnc = (int)pe_attr_i(c->def, c->desc, "x_num_col_dims");
  *ync = (int)pe_attr_i(c->def, c->desc, "y_num_col_dims");
  char sb[PE_SHAPE_STRLEN], sb2[PE_SHAPE_STRLEN];
  if (*xnc < 1 || *xnc >= x->shape.ndim)
    return pe_infer_error(c, PE_EATTR, "x_num_col_dims %d out of range for X '%s' shape %s", *xnc,
                          pe_in_name(c, sx, 0), pe_shape_str(&x->shape, sb, sizeof sb));
  if (*ync < 1 || *ync >= y->shape.ndim)
    return pe_infer_error(c, PE_EATTR, "y_num_col_dims %d out of range for Y '%s' shape %s", *ync,
                          pe_in_name(c, sy, 0), pe_shape_str(&y->shape, sb, sizeof sb));
  *d = mm_view(&x->shape, &y->shape, *xnc, *ync);
  if (d->k >= 0 && d->ky >= 0 && d->k != d->ky)
    return pe_infer_error(
        c, PE_ESHAPE,
        "input Y '%s' shape %s does not match X '%s' shape %s (inner dims %lld vs %lld)",
        pe_in_name(c, sy, 0), pe_shape_str(&y->shape, sb, sizeof sb), pe_in_name(c, sx, 0),
        pe_shape_str(&x->shape, sb2, sizeof sb2), (long long)d->k, (long long)d->ky);
  if (x->shape.ndim - *xnc + (y->shape.ndim - *ync) > PE_MAX_DIMS)
    return pe_infer_error(c, PE_ESHAPE, "output of X %s and Y %s has too many dims",
                          pe_shape_str(&x->shape, sb, sizeof sb),
                          pe_shape_str(&y->shape, sb2, sizeof sb2));
  return NULL;
}

static pe_status *matmul_infer(pe_infer_ctx *c) {
  int xnc = 1, ync = 1;
  mm_dims d;
  PE_TRY(mm_check(c, MM_X, MM_Y, &xnc, &ync, &d));
  const pe_shape *x = &pe_in_meta(c, MM_X, 0)->shape, *y = &pe_in_meta(c, MM_Y, 0)->shape;
  pe_shape out = {0};
  for (int i = 0; i < xnc; i++) out.d[out.ndim++] = x->d[i];
  for (int i = ync; i < y->ndim; i++) out.d[out.ndim++] = y->d[i];
  pe_infer_set(c, MM_OUT, PE_F32, &out);
  return NULL;
}

static pe_status *matmul_grad_infer(pe_infer_ctx *c) {
  int xnc = 1, ync = 1;
  mm_dims d;
  PE_TRY(mm_check(c, MMG_X, MMG_Y, &xnc, &ync, &d));
  return pe_infer_grad_like_inputs(c);
}

/* One oneDNN matmul a[m,k]·b[k,n] -> c[m,n]; ta/tb: a/b buffers hold the
 * transposed matrix. Args order: SRC, WEIGHTS, DST. */
static pe_status *mm_build(pe_kernel_ctx *c, pe_dnnl_entry *e, int64_t m, int64_t k, int64_t n,
                           bool ta, bool tb) {
  dnnl_memory_desc_t a, b, o;
  dnnl_matmul_desc_t md;
  PE_TRY(pe_dnnl_check(pe_dnnl_md_matrix(&a, m, k, ta), c, "matmul src desc"));
  PE_TRY(pe_dnnl_check(pe_dnnl_md_matrix(&b, k, n, tb), c, "matmul weights desc"));
  PE_TRY(pe_dnnl_check(pe_dnnl_md_matrix(&o, m, n, false), c, "matmul dst desc"));
  PE_TRY(pe_dnnl_check(dnnl_matmul_desc_init(&md, &a, &b, NULL, &o), c, "matmul desc"));
  dnnl_primitive_desc_t pd;
  PE_TRY(pe_dnnl_pd(c, &md, NULL, "matmul primitive desc", &pd));
  static const int args[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
  pe_dnnl_prim *p;
  pe_status *st = pe_dnnl_entry_add(c, e, pd, args, 3, "matmul primitive", &p);
  dnnl_primitive_desc_destroy(pd);
  return st;
}

/* The matrix view *d of X and Y and its cache entry (keyed by M, K, N). */
static pe_status *mm_lookup(pe_kernel_ctx *c, const pe_tensor *x, const pe_tensor *y, mm_dims *d,
                            pe_dnnl_entry **e, bool *fresh) {
  int xnc = (int)pe_attr_i(c->def, c->desc, "x_num_col_dims");
  int ync = (int)pe_attr_i(c->def, c->desc, "y_num_col_dims");
  *d = mm_view(&x->shape, &y->shape, xnc, ync);
  int64_t key[3] = {d->m, d->k, d->n};
  return pe_dnnl_cache_lookup(c, key, 3, e, fresh);
}

static pe_status *matmul_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, MM_X, 0), *y = pe_kin(c, MM_Y, 0), *out = pe_kout(c, MM_OUT, 0);
  mm_dims d;
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(mm_lookup(c, x, y, &d, &e, &fresh));
  if (fresh) PE_TRY(pe_dnnl_cache_built(c, e, mm_build(c, e, d.m, d.k, d.n, false, false)));
  void *h[] = {x->data, y->data, out->data};
  return pe_dnnl_run(c, &e->prims[0], h, "matmul");
}

/* Entry layout: prims[0] computes dX (built even if dX is absent, so that
 * one entry serves both outputs), prims[1] computes dY. */
static pe_status *matmul_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, MMG_X, 0), *y = pe_kin(c, MMG_Y, 0), *dout = pe_kin(c, MMG_DOUT, 0);
  pe_tensor *dx = pe_kout(c, MMG_DX, 0), *dy = pe_kout(c, MMG_DY, 0);
  if (!dout) {
    pe_dnnl_zero_outputs(c);
    return NULL;
  }
  if (!dx && !dy) return NULL;
  mm_dims d;
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(mm_lookup(c, x, y, &d, &e, &fresh));
  if (fresh) {
    pe_status *st = mm_build(c, e, d.m, d.n, d.k, false, true); /* dOut[M,N]·Yᵀ[N,K] */
    if (!st) st = mm_build(c, e, d.k, d.m, d.n, true, false);   /* Xᵀ[K,M]·dOut[M,N] */
    PE_TRY(pe_dnnl_cache_built(c, e, st));
  }
  if (dx) {
    void *h[] = {dout->data, y->data, dx->data};
    PE_TRY(pe_dnnl_run(c, &e->prims[0], h, "matmul_grad dX"));
  }
  if (dy) {
    void *h[] = {x->data, dout->data, dy->data};
    PE_TRY(pe_dnnl_run(c, &e->prims[1], h, "matmul_grad dY"));
  }
  return NULL;
}

static const pe_attr_def mm_attr_defs[] = {
    {"x_num_col_dims", PE_ATTR_INT, false, 1, NULL},
    {"y_num_col_dims", PE_ATTR_INT, false, 1, NULL},
    {NULL},
};

static const pe_slot_def mm_in[] = {{"X", 1, 1, 0}, {"Y", 1, 1, 0}, {NULL}};
static const pe_slot_def mm_out[] = {{"Out", 1, 1, 0}, {NULL}};
static const pe_slot_def mm_grad_in[] = {
    {"X", 1, 1, 0}, {"Y", 1, 1, 0}, {"Out", 0, 1, 0}, {"Out@GRAD", 0, 1, 0}, {NULL}};
static const pe_slot_def mm_grad_out[] = {{"X@GRAD", 0, 1, 0}, {"Y@GRAD", 0, 1, 0}, {NULL}};

const pe_op_def pe_ops_matmul[] = {
    {.type = "matmul",
     .inputs = mm_in,
     .outputs = mm_out,
     .attrs = mm_attr_defs,
     .infer = matmul_infer,
     .kernel_cpu = matmul_kernel,
     .state_free = pe_dnnl_cache_free,
     .grad = pe_grad_default},
    {.type = "matmul_grad",
     .inputs = mm_grad_in,
     .outputs = mm_grad_out,
     .attrs = mm_attr_defs,
     .infer = matmul_grad_infer,
     .kernel_cpu = matmul_grad_kernel,
     .state_free = pe_dnnl_cache_free},
    {0},
};
