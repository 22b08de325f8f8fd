/* concat and split (Paddle's), each the other's gradient, any dtype.
 *
 * Along `axis` (negative counts from the end) every tensor is viewed as
 * [outer, size_i * inner]: the whole one is the parts' rows side by side,
 * so both directions are one strided copy per part. split's sizes come from
 * num (equal parts) or sections (one -1 is inferred). An absent gradient
 * part reads as zeros. */
#include <string.h>

#include "ops/cpu/strided.h"
#include "ops/op_tables.h"

enum { CAT_X };
enum { CAT_OUT };
enum { CATG_X, CATG_OUT, CATG_DOUT };
enum { CATG_DX };
enum { SPL_X };
enum { SPL_OUT };
enum { SPLG_X, SPLG_OUT, SPLG_DOUT };
enum { SPLG_DX };

/* axis normalized to [0, ndim), else an error naming X. */
static pe_status *cat_axis(pe_infer_ctx *c, int slot, const pe_shape *x, int *axis) {
  int64_t a = pe_attr_i(c->def, c->desc, "axis");
  if (a < -x->ndim || a >= x->ndim) {
    char sb[PE_SHAPE_STRLEN];
    return pe_infer_error(c, PE_EATTR, "axis %lld is outside [%d, %d) for X '%s' %s", (long long)a,
                          -x->ndim, x->ndim, pe_in_name(c, slot, 0),
                          pe_shape_str(x, sb, sizeof sb));
  }
  *axis = (int)(a < 0 ? a + x->ndim : a);
  return NULL;
}

static pe_status *cat_shape(pe_infer_ctx *c, pe_shape *out) {
  if (c->in[CAT_X].n < 1) return pe_infer_error(c, PE_EARITY, "needs input X");
  const pe_meta *x0 = pe_in_meta(c, CAT_X, 0);
  int axis;
  PE_TRY(cat_axis(c, CAT_X, &x0->shape, &axis));
  *out = x0->shape;
  char sb[PE_SHAPE_STRLEN], sb2[PE_SHAPE_STRLEN];
  for (int k = 1; k < c->in[CAT_X].n; k++) {
    const pe_meta *x = pe_in_meta(c, CAT_X, k);
    bool ok = x->dtype == x0->dtype && x->shape.ndim == x0->shape.ndim;
    for (int i = 0; ok && i < x->shape.ndim; i++)
      ok = i == axis || x->shape.d[i] < 0 || out->d[i] < 0 || x->shape.d[i] == out->d[i];
    if (!ok)
      return pe_infer_error(
          c, PE_ESHAPE, "input X '%s' %s %s does not match X '%s' %s %s outside axis %d",
          pe_in_name(c, CAT_X, k), pe_shape_str(&x->shape, sb, sizeof sb), pe_dtype_name(x->dtype),
          pe_in_name(c, CAT_X, 0), pe_shape_str(&x0->shape, sb2, sizeof sb2),
          pe_dtype_name(x0->dtype), axis);
    for (int i = 0; i < x->shape.ndim; i++)
      if (i != axis && out->d[i] < 0) out->d[i] = x->shape.d[i];
    out->d[axis] = out->d[axis] < 0 || x->shape.d[axis] < 0 ? -1 : out->d[axis] + x->shape.d[axis];
  }
  return NULL;
}

static pe_status *cat_infer(pe_infer_ctx *c) {
  pe_shape out;
  PE_TRY(cat_shape(c, &out));
  pe_infer_set(c, CAT_OUT, pe_in_meta(c, CAT_X, 0)->dtype, &out);
  return NULL;
}

static pe_status *cat_grad_infer(pe_infer_ctx *c) {
  pe_shape out;
  PE_TRY(cat_shape(c, &out));
  return pe_infer_grad_like_inputs(c);
}

/* Move between `whole` (shape of the parts joined at axis) and the parts:
 * gather (parts -> whole) or scatter (whole -> parts). A NULL part is
 * zeros when gathering and skipped when scattering. */
static void cat_move(bool gather, pe_tensor *whole, pe_tensor *const *parts, int n, int axis) {
  const pe_shape *s = &whole->shape;
  size_t esz = pe_dtype_size(whole->dtype);
  int64_t outer = pe_shape_prod(s, 0, axis), inner = pe_shape_prod(s, axis + 1, s->ndim);
  int64_t row = s->d[axis] * inner, at = 0;
  for (int k = 0; k < n; k++) {
    pe_tensor *p = parts[k];
    int64_t w = pe_tensor_numel(p) / (outer ? outer : 1);
    if (outer == 0 || w == 0) continue;
    int64_t dims[2] = {outer, w}, ws[2] = {row, 1}, ps[2] = {w, 1};
    char *base = (char *)whole->data + at * (int64_t)esz;
    if (gather)
      pe_strided_copy(base, ws, p->data, ps, dims, 2, esz);
    else
      pe_strided_copy(p->data, ps, base, ws, dims, 2, esz);
    at += w;
  }
}

static int kernel_axis(const pe_kernel_ctx *c, int ndim) {
  int64_t a = pe_attr_i(c->def, c->desc, "axis");
  return (int)(a < 0 ? a + ndim : a);
}

static pe_status *cat_kernel(pe_kernel_ctx *c) {
  pe_tensor *out = pe_kout(c, CAT_OUT, 0);
  cat_move(true, out, c->in[CAT_X].t, c->in[CAT_X].n, kernel_axis(c, out->shape.ndim));
  return NULL;
}

static pe_status *cat_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *dout = pe_kin(c, CATG_DOUT, 0);
  int n = c->out[CATG_DX].n;
  if (n == 0) return NULL;
  if (!dout) {
    for (int k = 0; k < n; k++) pe_tensor_zero(c->out[CATG_DX].t[k]);
    return NULL;
  }
  if (n != c->in[CATG_X].n)
    return pe_kernel_error(c, PE_EARITY, "X@GRAD has %d args, X has %d", n, c->in[CATG_X].n);
  cat_move(false, dout, c->out[CATG_DX].t, n, kernel_axis(c, dout->shape.ndim));
  return NULL;
}

/* --- split ---------------------------------------------------------------------- */

/* The parts' sizes along axis (-1: unknown at compile time). */
static pe_status *split_sizes(pe_infer_ctx *c, int *axis, int64_t *sizes) {
  pe_meta *x = pe_in_meta(c, SPL_X, 0);
  if (!x) return pe_infer_error(c, PE_EARITY, "needs input X");
  PE_TRY(cat_axis(c, SPL_X, &x->shape, axis));
  int n = c->out[SPL_OUT].n;
  int64_t dim = x->shape.d[*axis], num = pe_attr_i(c->def, c->desc, "num");
  const int64_t *sec;
  int ns = pe_attr_ints(c->desc, "sections", &sec);
  char sb[PE_SHAPE_STRLEN];
  const char *xn = pe_in_name(c, SPL_X, 0);
  pe_shape_str(&x->shape, sb, sizeof sb);
  if (num > 0) {
    if (ns > 0)
      return pe_infer_error(c, PE_EATTR, "set num (%lld) or sections, not both", (long long)num);
    if (num != n)
      return pe_infer_error(c, PE_EARITY, "num %lld but %d outputs Out", (long long)num, n);
    if (dim >= 0 && dim % num != 0)
      return pe_infer_error(c, PE_ESHAPE, "dim %d of X '%s' %s (%lld) does not divide by num %lld",
                            *axis, xn, sb, (long long)dim, (long long)num);
    for (int k = 0; k < n; k++) sizes[k] = dim < 0 ? -1 : dim / num;
    return NULL;
  }
  if (ns != n)
    return pe_infer_error(c, PE_EATTR,
                          "sections has %d values but there are %d outputs Out (or "
                          "set num)",
                          ns, n);
  int infer_at = -1;
  int64_t known = 0;
  for (int k = 0; k < n; k++) {
    sizes[k] = sec[k];
    if (sec[k] == -1 && infer_at < 0) {
      infer_at = k;
    } else if (sec[k] < 0) {
      return pe_infer_error(c, PE_EATTR, "sections[%d] is %lld (sizes >= 0, one -1 inferred)", k,
                            (long long)sec[k]);
    } else {
      known += sec[k];
    }
  }
  if (dim < 0) return NULL;
  if ((infer_at < 0 && known != dim) || (infer_at >= 0 && known > dim))
    return pe_infer_error(c, PE_ESHAPE, "sections sum to %lld%s but dim %d of X '%s' %s is %lld",
                          (long long)known, infer_at >= 0 ? " (without the -1)" : "", *axis, xn, sb,
                          (long long)dim);
  if (infer_at >= 0) sizes[infer_at] = dim - known;
  return NULL;
}

static pe_status *split_infer(pe_infer_ctx *c) {
  int axis;
  int64_t sizes[64];
  if (c->out[SPL_OUT].n > 64) return pe_infer_error(c, PE_EARITY, "more than 64 outputs Out");
  PE_TRY(split_sizes(c, &axis, sizes));
  pe_meta *x = pe_in_meta(c, SPL_X, 0);
  for (int k = 0; k < c->out[SPL_OUT].n; k++) {
    pe_shape s = x->shape;
    s.d[axis] = sizes[k];
    c->out[SPL_OUT].m[k]->dtype = x->dtype;
    c->out[SPL_OUT].m[k]->shape = s;
  }
  return NULL;
}

static pe_status *split_grad_infer(pe_infer_ctx *c) {
  pe_meta *x = pe_in_meta(c, SPLG_X, 0);
  if (!x) return pe_infer_error(c, PE_EARITY, "needs input X");
  int axis;
  PE_TRY(cat_axis(c, SPLG_X, &x->shape, &axis));
  return pe_infer_grad_like_inputs(c);
}

static pe_status *split_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, SPL_X, 0);
  cat_move(false, x, c->out[SPL_OUT].t, c->out[SPL_OUT].n, kernel_axis(c, x->shape.ndim));
  return NULL;
}

/* X@GRAD = the Out@GRAD parts joined; the parts' sizes are Out's (an absent
 * Out@GRAD slot: zeros). */
static pe_status *split_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *dx = pe_kout(c, SPLG_DX, 0);
  if (!dx) return NULL;
  int n = c->in[SPLG_DOUT].n;
  if (n == 0) {
    pe_tensor_zero(dx);
    return NULL;
  }
  int64_t total = 0;
  for (int k = 0; k < n; k++) total += pe_tensor_numel(c->in[SPLG_DOUT].t[k]);
  if (total != pe_tensor_numel(dx))
    return pe_kernel_error(c, PE_ESHAPE, "inputs Out@GRAD hold %lld elements, X has %lld",
                           (long long)total, (long long)pe_tensor_numel(dx));
  cat_move(true, dx, c->in[SPLG_DOUT].t, n, kernel_axis(c, dx->shape.ndim));
  return NULL;
}

/* --- rows ---------------------------------------------------------------------- */

static const pe_slot_def cat_in[] = {{"X", 1, -1}, {NULL}};
static const pe_slot_def one_out[] = {{"Out", 1, 1}, {NULL}};
static const pe_slot_def cat_grad_in[] = {
    {"X", 1, -1}, {"Out", 0, 1}, {"Out" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
static const pe_slot_def cat_grad_out[] = {{"X" PE_GRAD_SUFFIX, 0, -1}, {NULL}};
static const pe_slot_def one_in[] = {{"X", 1, 1}, {NULL}};
static const pe_slot_def split_out[] = {{"Out", 1, -1}, {NULL}};
static const pe_slot_def split_grad_in[] = {
    {"X", 1, 1}, {"Out", 0, -1}, {"Out" PE_GRAD_SUFFIX, 0, -1}, {NULL}};
static const pe_slot_def split_grad_out[] = {{"X" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
static const pe_attr_def cat_attrs[] = {{"axis", PE_ATTR_INT, false, 0}, {NULL}};
static const pe_attr_def split_attrs[] = {{"axis", PE_ATTR_INT, false, 0},
                                          {"num", PE_ATTR_INT, false, 0},
                                          {"sections", PE_ATTR_INTS, false},
                                          {NULL}};

const pe_op_def pe_ops_concat[] = {
    {.type = "concat",
     .inputs = cat_in,
     .outputs = one_out,
     .attrs = cat_attrs,
     .infer = cat_infer,
     .kernel_cpu = cat_kernel,
     .grad = pe_grad_default},
    {.type = "concat_grad",
     .inputs = cat_grad_in,
     .outputs = cat_grad_out,
     .attrs = cat_attrs,
     .infer = cat_grad_infer,
     .kernel_cpu = cat_grad_kernel},
    {.type = "split",
     .inputs = one_in,
     .outputs = split_out,
     .attrs = split_attrs,
     .infer = split_infer,
     .kernel_cpu = split_kernel,
     .grad = pe_grad_default},
    {.type = "split_grad",
     .inputs = split_grad_in,
     .outputs = split_grad_out,
     .attrs = split_attrs,
     .infer = split_grad_infer,
     .kernel_cpu = split_grad_kernel},
    {NULL},
};
