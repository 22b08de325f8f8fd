/* The sequence-model layers of the program builder (see pe_builder.h):
 * layer_norm, gelu, embedding, transpose and slice, and the joining,
 * splitting and product layers (concat, split, batched matmul) attention is
 * made of. Each checks its arguments against the declared input shapes,
 * declares every variable it creates with dtype and shape, and emits ops per
 * docs/ops.md. */
#include <stdio.h>
#include <string.h>

#include "builder_internal.h"

/* --- sequence models ------------------------------------------------------------------------- */

const char *pe_builder_layer_norm(pe_builder *b, const char *x, int begin_norm_axis, float epsilon,
                                  const char *name) {
  if (!b) return NULL;
  b_var *xv = peb_need(b, "layer_norm", x);
  char layer[B_NAME_LEN], sc[B_NAME_LEN], bi[B_NAME_LEN], mn[B_NAME_LEN], vr[B_NAME_LEN],
      y[B_NAME_LEN], sh[128];
  if (!xv || !peb_layer_name(b, "layer_norm", name, layer)) return NULL;
  int axis = begin_norm_axis ? begin_norm_axis : 1;
  float eps = epsilon ? epsilon : 1e-5f;
  int64_t right = axis >= 1 && axis < xv->ndim ? peb_prod(xv->d, axis, xv->ndim) : -1;
  if (right <= 0 || !(eps > 0)) {
    peb_fail(b,
             "layer_norm '%s': '%s' %s needs known dims from begin_norm_axis %d (in [1, rank)), "
             "epsilon %g positive",
             layer, x, peb_shape_str(xv, sh, sizeof sh), axis, eps);
    return NULL;
  }
  int64_t r[1] = {right}, l[1] = {peb_prod(xv->d, 0, axis)};
  pe_b_init one = {PE_B_INIT_CONSTANT, 1, 0, 0}, zero = {PE_B_INIT_CONSTANT, 0, 0, 0};
  peb_param_add(b, peb_vname(sc, layer, "scale"), 1, r, one, 0, 0, true);
  peb_param_add(b, peb_vname(bi, layer, "bias"), 1, r, zero, 0, 0, true);
  b_var *v1 = peb_tmp_var(b, peb_vname(mn, layer, "mean"), PE_B_F32, 1, l);
  b_var *v2 = peb_tmp_var(b, peb_vname(vr, layer, "variance"), PE_B_F32, 1, l);
  b_var *ov = peb_tmp_var(b, peb_vname(y, layer, "out"), xv->dtype, xv->ndim, xv->d);
  if (b->err) return NULL;
  v1->stop_gradient = v2->stop_gradient = true;
  b_op *op = peb_op_add(b, &b->main, "layer_norm");
  peb_op_in(b, op, "X", x);
  peb_op_in(b, op, "Scale", sc);
  peb_op_in(b, op, "Bias", bi);
  peb_op_out(b, op, "Y", y);
  peb_op_out(b, op, "Mean", mn);
  peb_op_out(b, op, "Variance", vr);
  peb_attr_int(b, op, "begin_norm_axis", axis);
  peb_attr_float(b, op, "epsilon", eps);
  return b->err ? NULL : ov->name;
}

/* An op X -> Out of x's dtype and the shape ndim/d, as layer "<kind>_<k>";
 * returns the op for its attributes (NULL after an error), *out its output. */
static b_op *simple_op(pe_builder *b, const char *kind, const char *type, const char *x, int ndim,
                       const int64_t *d, const char **out) {
  b_var *xv = peb_var_find(&b->main, x);
  char layer[B_NAME_LEN], o[B_NAME_LEN];
  if (!peb_layer_name(b, kind, NULL, layer)) return NULL;
  b_var *ov = peb_tmp_var(b, peb_vname(o, layer, "out"), xv->dtype, ndim, d);
  b_op *op = peb_op_add(b, &b->main, type);
  peb_op_in(b, op, "X", x);
  peb_op_out(b, op, "Out", o);
  *out = b->err ? NULL : ov->name;
  return b->err ? NULL : op;
}

const char *pe_builder_gelu(pe_builder *b, const char *x, bool approximate) {
  if (!b) return NULL;
  b_var *xv = peb_need(b, "gelu", x);
  const char *out = NULL;
  if (!xv) return NULL;
  b_op *op = simple_op(b, "gelu", "gelu", x, xv->ndim, xv->d, &out);
  peb_attr_bool(b, op, "approximate", approximate);
  return b->err ? NULL : out;
}

const char *pe_builder_embedding(pe_builder *b, const char *ids, int64_t vocab, int64_t dim,
                                 int64_t padding_idx, const char *name) {
  return pe_builder_embedding_ex(b, ids, vocab, dim, padding_idx,
                                 &(pe_b_embedding_opts){.name = name});
}

const char *pe_builder_embedding_ex(pe_builder *b, const char *ids, int64_t vocab, int64_t dim,
                                    int64_t padding_idx, const pe_b_embedding_opts *o) {
  pe_b_embedding_opts dflt = {0};
  if (!o) o = &dflt;
  const char *name = o->name;
  if (!b) return NULL;
  b_var *iv = peb_need(b, "embedding", ids);
  char layer[B_NAME_LEN], w[B_NAME_LEN], out[B_NAME_LEN], sh[128];
  if (!iv || !peb_layer_name(b, "embedding", name, layer)) return NULL;
  if (iv->dtype != PE_B_I64 || iv->ndim + 1 > B_MAX_DIMS || vocab <= 0 || dim <= 0 ||
      padding_idx < -1 || padding_idx >= vocab) {
    peb_fail(b,
             "embedding '%s': ids '%s' %s must be i64 of rank < %d, vocab %lld and dim %lld "
             "positive, padding_idx %lld in [-1, vocab)",
             layer, ids, peb_shape_str(iv, sh, sizeof sh), B_MAX_DIMS, (long long)vocab,
             (long long)dim, (long long)padding_idx);
    return NULL;
  }
  int64_t wd[2] = {vocab, dim}, od[B_MAX_DIMS];
  memcpy(od, iv->d, (size_t)iv->ndim * sizeof(int64_t));
  od[iv->ndim] = dim;
  peb_param_add(b, peb_vname(w, layer, "w"), 2, wd, peb_init_or((pe_b_init){0}, PE_B_INIT_XAVIER),
                (double)vocab, (double)dim, true);
  b_var *ov = peb_tmp_var(b, peb_vname(out, layer, "out"), PE_B_F32, iv->ndim + 1, od);
  b_op *op = peb_op_add(b, &b->main, "lookup_table_v2");
  peb_op_in(b, op, "W", w);
  peb_op_in(b, op, "Ids", ids);
  peb_op_out(b, op, "Out", out);
  peb_attr_int(b, op, "padding_idx", padding_idx);
  if (o->is_sparse) peb_attr_bool(b, op, "is_sparse", true);
  return b->err ? NULL : ov->name;
}

const char *pe_builder_transpose(pe_builder *b, const char *x, int n, const int64_t *perm) {
  if (!b) return NULL;
  b_var *xv = peb_need(b, "transpose", x);
  char sh[128];
  if (!xv) return NULL;
  bool seen[B_MAX_DIMS] = {false}, ok = perm && n == xv->ndim;
  for (int i = 0; ok && i < n; i++) {
    ok = perm[i] >= 0 && perm[i] < n && !seen[perm[i]];
    if (ok) seen[perm[i]] = true;
  }
  if (!ok) {
    peb_fail(b, "transpose: perm is not a permutation of the %d dims of '%s' %s", xv->ndim, x,
             peb_shape_str(xv, sh, sizeof sh));
    return NULL;
  }
  int64_t od[B_MAX_DIMS];
  for (int i = 0; i < n; i++) od[i] = xv->d[perm[i]];
  const char *out = NULL;
  b_op *op = simple_op(b, "transpose", "transpose2", x, n, od, &out);
  peb_attr_ints(b, op, "axis", n, perm);
  return b->err ? NULL : out;
}

const char *pe_builder_slice(pe_builder *b, const char *x, int n, const int64_t *axes,
                             const int64_t *starts, const int64_t *ends) {
  if (!b) return NULL;
  b_var *xv = peb_need(b, "slice", x);
  char layer[B_NAME_LEN], out[B_NAME_LEN], sh[128];
  if (!xv || !peb_layer_name(b, "slice", NULL, layer)) return NULL;
  int64_t od[B_MAX_DIMS];
  memcpy(od, xv->d, sizeof od);
  for (int k = 0; k < n; k++) {
    int a = axes[k] < 0 ? (int)axes[k] + xv->ndim : (int)axes[k];
    if (a < 0 || a >= xv->ndim) {
      peb_fail(b, "slice '%s': axis %lld out of range for '%s' %s", layer, (long long)axes[k], x,
               peb_shape_str(xv, sh, sizeof sh));
      return NULL;
    }
    int64_t d = xv->d[a];
    if (d < 0) continue; /* unknown until run time */
    int64_t s = starts[k] < 0 ? starts[k] + d : starts[k], e = ends[k] < 0 ? ends[k] + d : ends[k];
    s = s < 0 ? 0 : (s > d ? d : s);
    e = e < 0 ? 0 : (e > d ? d : e);
    od[a] = e > s ? e - s : 0;
  }
  b_var *ov = peb_tmp_var(b, peb_vname(out, layer, "out"), xv->dtype, xv->ndim, od);
  b_op *op = peb_op_add(b, &b->main, "slice");
  peb_op_in(b, op, "Input", x);
  peb_op_out(b, op, "Out", out);
  peb_attr_ints(b, op, "axes", n, axes);
  peb_attr_ints(b, op, "starts", n, starts);
  peb_attr_ints(b, op, "ends", n, ends);
  return b->err ? NULL : ov->name;
}

/* --- joining, splitting, products ------------------------------------------------------------ */

/* axis of an n-dim variable, negative counting from the end; -1 if out of range. */
static int norm_axis(int axis, int ndim) {
  int a = axis < 0 ? axis + ndim : axis;
  return a >= 0 && a < ndim ? a : -1;
}

const char *pe_builder_concat(pe_builder *b, int n, const char *const *xs, int axis) {
  if (!b) return NULL;
  char layer[B_NAME_LEN], out[B_NAME_LEN], s1[128], s2[128];
  if (!peb_layer_name(b, "concat", NULL, layer)) return NULL;
  if (n < 1 || !xs) {
    peb_fail(b, "concat '%s': needs at least one input (got %d)", layer, n);
    return NULL;
  }
  b_var *first = peb_need(b, "concat", xs[0]);
  if (!first) return NULL;
  int a = norm_axis(axis, first->ndim);
  if (a < 0) {
    peb_fail(b, "concat '%s': axis %d out of range for '%s' %s", layer, axis, xs[0],
             peb_shape_str(first, s1, sizeof s1));
    return NULL;
  }
  int64_t od[B_MAX_DIMS];
  memcpy(od, first->d, sizeof od);
  for (int i = 1; i < n; i++) {
    b_var *v = peb_need(b, "concat", xs[i]);
    if (!v) return NULL;
    bool ok = v->ndim == first->ndim && v->dtype == first->dtype;
    for (int d = 0; ok && d < v->ndim; d++)
      ok = d == a || v->d[d] == od[d] || v->d[d] == -1 || od[d] == -1;
    if (!ok) {
      peb_fail(b, "concat '%s': '%s' %s does not fit '%s' %s (equal dims and dtype but axis %d)",
               layer, xs[i], peb_shape_str(v, s1, sizeof s1), xs[0],
               peb_shape_str(first, s2, sizeof s2), a);
      return NULL;
    }
    od[a] = od[a] < 0 || v->d[a] < 0 ? -1 : od[a] + v->d[a];
  }
  b_var *ov = peb_tmp_var(b, peb_vname(out, layer, "out"), first->dtype, first->ndim, od);
  b_op *op = peb_op_add(b, &b->main, "concat");
  peb_op_in_n(b, op, "X", n, xs);
  peb_op_out(b, op, "Out", out);
  peb_attr_int(b, op, "axis", axis);
  return b->err ? NULL : ov->name;
}

int pe_builder_split(pe_builder *b, const char *x, int n, const int64_t *sections, int axis,
                     const char **outs) {
  if (!b) return -1;
  b_var *xv = peb_need(b, "split", x);
  char layer[B_NAME_LEN], sh[128];
  if (!xv || !peb_layer_name(b, "split", NULL, layer)) return -1;
  int a = norm_axis(axis, xv->ndim);
  if (a < 0 || n < 1 || n > B_MAX_SPLIT || !outs) {
    peb_fail(b, "split '%s': axis %d out of range for '%s' %s, or %d parts (1 to %d)", layer, axis,
             x, peb_shape_str(xv, sh, sizeof sh), n, B_MAX_SPLIT);
    return -1;
  }
  int64_t dim = xv->d[a], sizes[B_MAX_SPLIT], sum = 0;
  for (int i = 0; i < n; i++) {
    sizes[i] = sections ? sections[i] : (dim > 0 ? dim / n : -1);
    sum += sizes[i];
  }
  bool ok = sections ? dim < 0 || sum == dim : dim > 0 && dim % n == 0;
  for (int i = 0; ok && i < n; i++) ok = sizes[i] > 0;
  if (!ok) {
    peb_fail(b, "split '%s': '%s' %s dim %d (%lld) does not split into %d %s parts", layer, x,
             peb_shape_str(xv, sh, sizeof sh), a, (long long)dim, n,
             sections ? "positive given" : "equal known");
    return -1;
  }
  char names[B_MAX_SPLIT][B_NAME_LEN];
  const char *args[B_MAX_SPLIT];
  for (int i = 0; i < n; i++) {
    char sfx[16];
    snprintf(sfx, sizeof sfx, "out_%d", i);
    int64_t od[B_MAX_DIMS];
    memcpy(od, xv->d, sizeof od);
    od[a] = sizes[i];
    b_var *ov = peb_tmp_var(b, peb_vname(names[i], layer, sfx), xv->dtype, xv->ndim, od);
    args[i] = names[i];
    outs[i] = ov ? ov->name : NULL;
  }
  b_op *op = peb_op_add(b, &b->main, "split");
  peb_op_in(b, op, "X", x);
  peb_op_out_n(b, op, "Out", n, args);
  peb_attr_int(b, op, "axis", axis);
  if (sections)
    peb_attr_ints(b, op, "sections", n, sections);
  else
    peb_attr_int(b, op, "num", n);
  return b->err ? -1 : 0;
}

/* One broadcast batch dim of a product (-1 unknown); false on a clash. */
static bool bcast_dim(int64_t p, int64_t q, int64_t *o) {
  if (p == q || q == 1)
    *o = p;
  else if (p == 1)
    *o = q;
  else if (p < 0 || q < 0)
    *o = p < 0 ? q : p;
  else
    return false;
  return true;
}

const char *pe_builder_matmul(pe_builder *b, const char *x, const char *y, bool trans_x,
                              bool trans_y, const char *name) {
  if (!b) return NULL;
  b_var *xv = peb_need(b, "matmul", x), *yv = xv ? peb_need(b, "matmul", y) : NULL;
  char layer[B_NAME_LEN], out[B_NAME_LEN], s1[128], s2[128];
  if (!yv || !peb_layer_name(b, "matmul", name, layer)) return NULL;
  bool ok = xv->dtype == PE_B_F32 && yv->dtype == PE_B_F32 && xv->ndim >= 1 && yv->ndim >= 1;
  int64_t od[B_MAX_DIMS], m = 0, k = 0, ky = 0, n = 0;
  int nd = 0;
  if (ok) {
    bool tx = trans_x && xv->ndim > 1, ty = trans_y && yv->ndim > 1;
    int64_t xr = xv->ndim == 1 ? 1 : xv->d[xv->ndim - 2], xc = xv->d[xv->ndim - 1];
    int64_t yr = yv->d[yv->ndim == 1 ? 0 : yv->ndim - 2],
            yc = yv->ndim == 1 ? 1 : yv->d[yv->ndim - 1];
    m = tx ? xc : xr, k = tx ? xr : xc, ky = ty ? yc : yr, n = ty ? yr : yc;
    ok = k < 0 || ky < 0 || k == ky;
    int xb = xv->ndim > 2 ? xv->ndim - 2 : 0, yb = yv->ndim > 2 ? yv->ndim - 2 : 0;
    nd = xb > yb ? xb : yb;
    for (int i = 0; ok && i < nd; i++) {
      int xi = i - (nd - xb), yi = i - (nd - yb);
      ok = bcast_dim(xi >= 0 ? xv->d[xi] : 1, yi >= 0 ? yv->d[yi] : 1, &od[i]);
    }
    if (xv->ndim > 1) od[nd++] = m;
    if (yv->ndim > 1) od[nd++] = n;
    if (nd == 0) od[nd++] = 1;
  }
  if (!ok) {
    peb_fail(b,
             "matmul '%s': '%s' %s and '%s' %s (trans_x %d, trans_y %d) do not multiply (f32, "
             "contraction dims %lld and %lld, batch dims broadcast)",
             layer, x, peb_shape_str(xv, s1, sizeof s1), y, peb_shape_str(yv, s2, sizeof s2),
             trans_x, trans_y, (long long)k, (long long)ky);
    return NULL;
  }
  b_var *ov = peb_tmp_var(b, peb_vname(out, layer, "out"), PE_B_F32, nd, od);
  b_op *op = peb_op_add(b, &b->main, "matmul_v2");
  peb_op_in(b, op, "X", x);
  peb_op_in(b, op, "Y", y);
  peb_op_out(b, op, "Out", out);
  peb_attr_bool(b, op, "trans_x", trans_x);
  peb_attr_bool(b, op, "trans_y", trans_y);
  return b->err ? NULL : ov->name;
}
