/* CUDA kernels of the data-movement ops: transpose2, concat, split, slice,
 * tril_triu and cast, with their gradients, and position_ids. Same slots
 * and attributes as ops/cpu/ (transpose.c, concat.c, slice.c, tril_triu.c,
 * cast.c, position_ids.c); the views are described on the host
 * (shape_plan.h) and copied by kernels_shape.cu's strided copy. Any dtype. */
#include <string.h>

#include "cuda/kernels_shape.h"
#include "cuda/ops_cuda.h"

/* Enqueue the copy of p between dst and src (esz-byte elements). */
static pe_status *strided(pe_kernel_ctx *c, pe_cuda_ctx *x, pe_cu_strided *p, void *dst,
                          const void *src, size_t esz) {
  int64_t n = pe_cu_strided_simplify(p);
  return pe_cu_check(c, pe_cu_strided_copy(p, n, dst, src, esz, x->stream), c->def->type);
}

/* The copy of p the other way round (a gradient's scatter of the
 * forward's gather). */
static void reverse(pe_cu_strided *p) {
  int64_t tmp[PE_MAX_DIMS];
  memcpy(tmp, p->dst, sizeof tmp);
  memcpy(p->dst, p->src, sizeof tmp);
  memcpy(p->src, tmp, sizeof tmp);
}

/* A gradient that is `apply` of Out@GRAD into X@GRAD (inputs X, Out,
 * Out@GRAD; output X@GRAD): nothing for a pruned X@GRAD, zeros without an
 * Out@GRAD. */
typedef pe_status *(*apply_fn)(pe_kernel_ctx *c, pe_cuda_ctx *x, const pe_tensor *src,
                               pe_tensor *dst);
static pe_status *grad_through(pe_kernel_ctx *c, apply_fn apply) {
  PE_CU_NEED(c, x);
  pe_tensor *dx = pe_kout(c, 0, 0), *dout = pe_kin(c, 2, 0);
  if (!dx) return NULL;
  if (!dout) return pe_cu_zero(c, x, dx);
  return apply(c, x, dout, dx);
}

/* --- transpose2 ------------------------------------------------------------------ */

enum { TR_X };
enum { TR_OUT };
enum { TRG_DOUT = 3 };
enum { TRG_DX };

static void tr_perm(const pe_kernel_ctx *c, int n, int *perm) {
  const int64_t *v;
  pe_attr_ints(c->desc, "axis", &v);
  for (int i = 0; i < n; i++) perm[i] = (int)v[i];
}

pe_status *pe_cuk_transpose2(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *in = pe_kin(c, TR_X, 0), *out = pe_kout(c, TR_OUT, 0);
  int perm[PE_MAX_DIMS];
  tr_perm(c, in->shape.ndim, perm);
  pe_cu_strided p;
  pe_cu_plan_transpose(&in->shape, perm, &p);
  return strided(c, x, &p, out->data, in->data, pe_dtype_size(in->dtype));
}

/* dX = dOut permuted back: the forward's copy with the roles swapped. */
pe_status *pe_cuk_transpose2_grad(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *dout = pe_kin(c, TRG_DOUT, 0), *dx = pe_kout(c, TRG_DX, 0);
  if (!dx) return NULL;
  if (!dout) return pe_cu_zero(c, x, dx);
  int nd = dx->shape.ndim, perm[PE_MAX_DIMS];
  if (dout->shape.ndim != nd || pe_tensor_numel(dout) != pe_tensor_numel(dx))
    return pe_kernel_error(c, PE_ESHAPE, "input Out@GRAD does not match X");
  tr_perm(c, nd, perm);
  pe_cu_strided p;
  pe_cu_plan_transpose(&dx->shape, perm, &p);
  reverse(&p);
  return strided(c, x, &p, dx->data, dout->data, pe_dtype_size(dx->dtype));
}

/* --- concat and split -------------------------------------------------------------- */

static int kernel_axis(const pe_kernel_ctx *c, int ndim) {
  int64_t a = pe_attr_i(c->def, c->desc, "axis");
  return (int)(a < 0 ? a + ndim : a);
}

/* Between `whole` (the parts joined at axis) and the parts: gather (parts
 * -> whole) or scatter. Part k is an [outer, w_k] window of the whole's
 * [outer, row] view, w_k from widths[k] (the part itself, or for concat's
 * gradient its X, since a pruned X@GRAD part is NULL and skipped). */
static pe_status *cat_move(pe_kernel_ctx *c, pe_cuda_ctx *x, bool gather, pe_tensor *whole,
                           pe_tensor *const *parts, pe_tensor *const *widths, int n, int axis) {
  const pe_shape *s = &whole->shape;
  size_t esz = pe_dtype_size(whole->dtype);
  int64_t outer = pe_shape_prod(s, 0, axis), inner = pe_shape_prod(s, axis + 1, s->ndim);
  int64_t row = s->d[axis] * inner, at = 0;
  for (int k = 0; k < n && outer > 0; k++) {
    if (!widths[k]) return pe_kernel_error(c, PE_EARITY, "part %d is missing", k);
    int64_t w = pe_tensor_numel(widths[k]) / outer;
    pe_tensor *part = parts[k];
    if (w * outer != pe_tensor_numel(widths[k]) || at + w > row ||
        (part && pe_tensor_numel(part) != w * outer))
      return pe_kernel_error(
          c, PE_ESHAPE,
          "part %d (%lld elements) does not fit the joined tensor's rows of %lld "
          "at axis %d",
          k, (long long)pe_tensor_numel(widths[k]), (long long)row, axis);
    if (part) {
      char *base = (char *)whole->data + at * (int64_t)esz;
      pe_cu_strided p = {.nd = 2, .dims = {outer, w}};
      int64_t ws[2] = {row, 1}, ps[2] = {w, 1};
      memcpy(gather ? p.dst : p.src, ws, sizeof ws);
      memcpy(gather ? p.src : p.dst, ps, sizeof ps);
      PE_TRY(gather ? strided(c, x, &p, base, part->data, esz)
                    : strided(c, x, &p, part->data, base, esz));
    }
    at += w;
  }
  return NULL;
}

pe_status *pe_cuk_concat(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *out = pe_kout(c, 0, 0);
  return cat_move(c, x, true, out, c->in[0].t, c->in[0].t, c->in[0].n,
                  kernel_axis(c, out->shape.ndim));
}

/* Inputs X, Out, Out@GRAD; output X@GRAD (one per X, each may be pruned). */
pe_status *pe_cuk_concat_grad(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *dout = pe_kin(c, 2, 0);
  int n = c->out[0].n;
  if (n == 0) return NULL;
  if (!dout) return pe_cu_zero_outputs(c, x);
  if (n != c->in[0].n)
    return pe_kernel_error(c, PE_EARITY, "X@GRAD has %d args, X has %d", n, c->in[0].n);
  return cat_move(c, x, false, dout, c->out[0].t, c->in[0].t, n, kernel_axis(c, dout->shape.ndim));
}

pe_status *pe_cuk_split(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *in = pe_kin(c, 0, 0);
  return cat_move(c, x, false, in, c->out[0].t, c->out[0].t, c->out[0].n,
                  kernel_axis(c, in->shape.ndim));
}

/* Inputs X, Out, Out@GRAD (the parts; an absent one reads as zeros);
 * output X@GRAD. */
pe_status *pe_cuk_split_grad(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *dx = pe_kout(c, 0, 0);
  if (!dx) return NULL;
  int n = c->in[2].n;
  if (n == 0) return pe_cu_zero(c, x, dx);
  int64_t total = 0;
  bool any_absent = false;
  for (int k = 0; k < n; k++) {
    if (c->in[2].t[k])
      total += pe_tensor_numel(c->in[2].t[k]);
    else
      any_absent = true;
  }
  if (any_absent) return pe_kernel_error(c, PE_EARITY, "an input Out@GRAD part is missing");
  if (total != pe_tensor_numel(dx))
    return pe_kernel_error(c, PE_ESHAPE, "inputs Out@GRAD hold %lld elements, X has %lld",
                           (long long)total, (long long)pe_tensor_numel(dx));
  return cat_move(c, x, true, dx, c->in[2].t, c->in[2].t, n, kernel_axis(c, dx->shape.ndim));
}

/* --- slice ------------------------------------------------------------------------- */

enum { SL_IN };
enum { SL_OUT };
enum { SLG_IN, SLG_OUT, SLG_DOUT };
enum { SLG_DIN };

/* The window of Input x as a strided view: its dims, x's strides and the
 * offset of its first element. */
static int64_t sl_view(const pe_kernel_ctx *c, const pe_shape *x, pe_cu_strided *p) {
  const int64_t *axes, *starts, *ends;
  int n = pe_attr_ints(c->desc, "axes", &axes);
  pe_attr_ints(c->desc, "starts", &starts);
  pe_attr_ints(c->desc, "ends", &ends);
  int64_t start[PE_MAX_DIMS], xs[PE_MAX_DIMS];
  pe_cu_slice_window(x, axes, starts, ends, n, start, p->dims);
  p->nd = x->ndim;
  int64_t s = 1, off = 0;
  for (int i = x->ndim - 1; i >= 0; i--) {
    xs[i] = s;
    s *= x->d[i];
  }
  s = 1;
  for (int i = x->ndim - 1; i >= 0; i--) {
    off += start[i] * xs[i];
    p->src[i] = xs[i]; /* the window in x */
    p->dst[i] = s;     /* dense Out */
    s *= p->dims[i];
  }
  return off;
}

pe_status *pe_cuk_slice(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *in = pe_kin(c, SL_IN, 0), *out = pe_kout(c, SL_OUT, 0);
  pe_cu_strided p;
  int64_t off = sl_view(c, &in->shape, &p);
  size_t esz = pe_dtype_size(in->dtype);
  return strided(c, x, &p, out->data, (char *)in->data + off * (int64_t)esz, esz);
}

pe_status *pe_cuk_slice_grad(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *in = pe_kin(c, SLG_IN, 0), *dout = pe_kin(c, SLG_DOUT, 0);
  pe_tensor *dx = pe_kout(c, SLG_DIN, 0);
  if (!dx) return NULL;
  PE_TRY(pe_cu_zero(c, x, dx));
  if (!dout) return NULL;
  pe_cu_strided p;
  int64_t off = sl_view(c, &in->shape, &p), n = 1;
  for (int i = 0; i < p.nd; i++) n *= p.dims[i];
  if (pe_tensor_numel(dout) != n)
    return pe_kernel_error(c, PE_ESHAPE, "input Out@GRAD has %lld elements, the slice %lld",
                           (long long)pe_tensor_numel(dout), (long long)n);
  reverse(&p);
  size_t esz = pe_dtype_size(dx->dtype);
  return strided(c, x, &p, (char *)dx->data + off * (int64_t)esz, dout->data, esz);
}

/* --- tril_triu --------------------------------------------------------------------- */

static pe_status *tt_apply(pe_kernel_ctx *c, pe_cuda_ctx *x, const pe_tensor *src, pe_tensor *dst) {
  int nd = src->shape.ndim;
  if (!pe_shape_equal(&src->shape, &dst->shape) || src->dtype != dst->dtype)
    return pe_kernel_error(c, PE_ESHAPE, "input and output shapes or dtypes differ");
  if (nd < 2) return pe_kernel_error(c, PE_ESHAPE, "input has rank %d; a triangle needs 2", nd);
  int64_t rows = src->shape.d[nd - 2], cols = src->shape.d[nd - 1];
  int64_t mats = rows > 0 && cols > 0 ? pe_tensor_numel(src) / (rows * cols) : 0;
  return pe_cu_check(
      c,
      pe_cu_tril_triu(src->data, dst->data, mats, rows, cols,
                      pe_attr_i(c->def, c->desc, "diagonal"), pe_attr_b(c->def, c->desc, "lower"),
                      pe_dtype_size(src->dtype), x->stream),
      c->def->type);
}

pe_status *pe_cuk_tril_triu(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  return tt_apply(c, x, pe_kin(c, 0, 0), pe_kout(c, 0, 0));
}

pe_status *pe_cuk_tril_triu_grad(pe_kernel_ctx *c) {
  return grad_through(c, tt_apply);
}

/* --- cast -------------------------------------------------------------------------- */

static pe_status *ca_convert(pe_kernel_ctx *c, pe_cuda_ctx *x, const pe_tensor *src,
                             pe_tensor *dst) {
  if (pe_tensor_numel(src) != pe_tensor_numel(dst))
    return pe_kernel_error(c, PE_ESHAPE, "input has %lld elements, output %lld",
                           (long long)pe_tensor_numel(src), (long long)pe_tensor_numel(dst));
  if (src->dtype == dst->dtype) return pe_cu_copy(c, x, dst, src);
  if (src->dtype > PE_U8 || dst->dtype > PE_U8)
    return pe_kernel_error(c, PE_EDTYPE, "cast from %s to %s is not supported",
                           pe_dtype_name(src->dtype), pe_dtype_name(dst->dtype));
  return pe_cu_check(c,
                     pe_cu_cast(src->data, (int)src->dtype, dst->data, (int)dst->dtype,
                                pe_tensor_numel(src), x->stream),
                     c->def->type);
}

pe_status *pe_cuk_cast(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  return ca_convert(c, x, pe_kin(c, 0, 0), pe_kout(c, 0, 0));
}

/* Floats only: infer refuses a gradient through integers. */
pe_status *pe_cuk_cast_grad(pe_kernel_ctx *c) {
  return grad_through(c, ca_convert);
}

/* --- position_ids -------------------------------------------------------------------- */

/* Out [X.shape[0 .. axis]] i64: start + the index along its last dim (X is
 * read for its shape only, by infer). */
pe_status *pe_cuk_position_ids(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *out = pe_kout(c, 0, 0);
  int64_t n = pe_tensor_numel(out);
  if (n == 0) return NULL;
  if (out->dtype != PE_I64 || out->shape.ndim < 1)
    return pe_kernel_error(c, PE_EDTYPE, "output Out must be i64 of rank >= 1, got %s of rank %d",
                           pe_dtype_name(out->dtype), out->shape.ndim);
  return pe_cu_check(c,
                     pe_cu_position_ids(pe_i64(out), n, out->shape.d[out->shape.ndim - 1],
                                        pe_attr_i(c->def, c->desc, "start"), x->stream),
                     "position_ids");
}
