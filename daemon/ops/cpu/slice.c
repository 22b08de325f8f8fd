/* slice (Paddle's): Out = Input[starts:ends] along each of `axes`, any
 * dtype. Negative starts/ends count from the end of the dim; both are then
 * clamped to [0, dim] as Python's slices are (an empty range gives a 0
 * dim). decrease_axis drops listed dims of size 1 from Out. The gradient
 * is zeros with Out@GRAD written into the window. */
#include <string.h>

#include "ops/cpu/strided.h"
#include "ops/op_tables.h"
#include "ops/slice_bounds.h"

enum { SL_IN };
enum { SL_OUT };
enum { SLG_IN, SLG_OUT, SLG_DOUT };
enum { SLG_DIN };

/* The window: per dim of Input its start and size (-1: unknown). */
typedef struct sl_window {
  int64_t start[PE_MAX_DIMS], size[PE_MAX_DIMS];
} sl_window;

/* Fills w from the attributes for an Input of shape x (no checks). */
static void sl_window_of(const pe_op_desc *op, const pe_shape *x, sl_window *w) {
  for (int i = 0; i < x->ndim; i++) w->start[i] = 0, w->size[i] = x->d[i];
  const int64_t *axes, *starts, *ends;
  int n = pe_attr_ints(op, "axes", &axes);
  pe_attr_ints(op, "starts", &starts);
  pe_attr_ints(op, "ends", &ends);
  for (int k = 0; k < n; k++) {
    int a = (int)(axes[k] < 0 ? axes[k] + x->ndim : axes[k]);
    if (x->d[a] < 0) {
      w->size[a] = -1;
      continue;
    }
    pe_slice_bounds(x->d[a], starts[k], ends[k], &w->start[a], &w->size[a]);
  }
}

static pe_status *sl_check(pe_infer_ctx *c, sl_window *w, pe_shape *out) {
  pe_meta *x = pe_in_meta(c, SL_IN, 0);
  if (!x) return pe_infer_error(c, PE_EARITY, "needs input Input");
  const int64_t *axes, *starts, *ends, *dec;
  int n = pe_attr_ints(c->desc, "axes", &axes);
  int ns = pe_attr_ints(c->desc, "starts", &starts), ne = pe_attr_ints(c->desc, "ends", &ends);
  int nd = pe_attr_ints(c->desc, "decrease_axis", &dec);
  char sb[PE_SHAPE_STRLEN];
  const char *xn = pe_in_name(c, SL_IN, 0);
  pe_shape_str(&x->shape, sb, sizeof sb);
  if (ns != n || ne != n)
    return pe_infer_error(c, PE_EATTR, "axes, starts and ends need as many values (%d, %d, %d)", n,
                          ns, ne);
  bool seen[PE_MAX_DIMS] = {false};
  for (int k = 0; k < n; k++) {
    if (axes[k] < -x->shape.ndim || axes[k] >= x->shape.ndim)
      return pe_infer_error(c, PE_EATTR, "axes[%d] = %lld is outside [%d, %d) for Input '%s' %s", k,
                            (long long)axes[k], -x->shape.ndim, x->shape.ndim, xn, sb);
    int a = (int)(axes[k] < 0 ? axes[k] + x->shape.ndim : axes[k]);
    if (seen[a])
      return pe_infer_error(c, PE_EATTR, "axes lists dim %d twice for Input '%s' %s", a, xn, sb);
    seen[a] = true;
  }
  sl_window_of(c->desc, &x->shape, w);
  *out = (pe_shape){0};
  bool drop[PE_MAX_DIMS] = {false};
  for (int k = 0; k < nd; k++) {
    int a = dec[k] >= -x->shape.ndim && dec[k] < x->shape.ndim
                ? (int)(dec[k] < 0 ? dec[k] + x->shape.ndim : dec[k])
                : -1;
    if (a < 0 || !seen[a] || (w->size[a] >= 0 && w->size[a] != 1))
      return pe_infer_error(c, PE_EATTR,
                            "decrease_axis %lld is not a sliced dim of size 1 of Input '%s' %s",
                            (long long)dec[k], xn, sb);
    drop[a] = true;
  }
  for (int i = 0; i < x->shape.ndim; i++)
    if (!drop[i]) out->d[out->ndim++] = w->size[i];
  if (out->ndim == 0) out->d[out->ndim++] = 1; /* Paddle keeps [1] for a scalar */
  return NULL;
}

static pe_status *sl_infer(pe_infer_ctx *c) {
  sl_window w;
  pe_shape out;
  PE_TRY(sl_check(c, &w, &out));
  pe_infer_set(c, SL_OUT, pe_in_meta(c, SL_IN, 0)->dtype, &out);
  return NULL;
}

static pe_status *sl_grad_infer(pe_infer_ctx *c) {
  sl_window w;
  pe_shape out;
  PE_TRY(sl_check(c, &w, &out));
  return pe_infer_grad_like_inputs(c);
}

/* The window's strides in Input and the offset of its first element. */
static int64_t sl_view(const pe_shape *x, const sl_window *w, int64_t *strides) {
  pe_dense_strides(x->d, x->ndim, strides);
  int64_t off = 0;
  for (int i = 0; i < x->ndim; i++) off += w->start[i] * strides[i];
  return off;
}

static pe_status *sl_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, SL_IN, 0), *out = pe_kout(c, SL_OUT, 0);
  sl_window w;
  sl_window_of(c->desc, &x->shape, &w);
  int64_t xs[PE_MAX_DIMS], os[PE_MAX_DIMS];
  int64_t off = sl_view(&x->shape, &w, xs);
  pe_dense_strides(w.size, x->shape.ndim, os);
  size_t esz = pe_dtype_size(x->dtype);
  pe_strided_copy(out->data, os, (char *)x->data + off * (int64_t)esz, xs, w.size, x->shape.ndim,
                  esz);
  return NULL;
}

static pe_status *sl_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, SLG_IN, 0), *dout = pe_kin(c, SLG_DOUT, 0);
  pe_tensor *dx = pe_kout(c, SLG_DIN, 0);
  if (!dx) return NULL;
  pe_tensor_zero(dx);
  if (!dout) return NULL;
  sl_window w;
  sl_window_of(c->desc, &x->shape, &w);
  int64_t xs[PE_MAX_DIMS], os[PE_MAX_DIMS];
  int64_t off = sl_view(&x->shape, &w, xs);
  int64_t n = 1;
  for (int i = 0; i < x->shape.ndim; i++) n *= w.size[i];
  if (pe_tensor_numel(dout) != n)
    return pe_kernel_error(c, PE_ESHAPE, "input Out@GRAD has %lld elements, the slice %lld",
                           (long long)pe_tensor_numel(dout), (long long)n);
  pe_dense_strides(w.size, x->shape.ndim, os);
  size_t esz = pe_dtype_size(dx->dtype);
  pe_strided_copy((char *)dx->data + off * (int64_t)esz, xs, dout->data, os, w.size, x->shape.ndim,
                  esz);
  return NULL;
}

/* --- rows ---------------------------------------------------------------------- */

static const pe_slot_def sl_in[] = {{"Input", 1, 1}, {NULL}};
static const pe_slot_def sl_out[] = {{"Out", 1, 1}, {NULL}};
static const pe_slot_def sl_grad_in[] = {
    {"Input", 1, 1}, {"Out", 0, 1}, {"Out" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
static const pe_slot_def sl_grad_out[] = {{"Input" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
/* infer_flags is Paddle's (tensor-valued starts/ends); read and ignored. */
static const pe_attr_def sl_attrs[] = {
    {"axes", PE_ATTR_INTS, true},         {"starts", PE_ATTR_INTS, true},
    {"ends", PE_ATTR_INTS, true},         {"decrease_axis", PE_ATTR_INTS, false},
    {"infer_flags", PE_ATTR_INTS, false}, {NULL}};

const pe_op_def pe_ops_slice[] = {
    {.type = "slice",
     .inputs = sl_in,
     .outputs = sl_out,
     .attrs = sl_attrs,
     .infer = sl_infer,
     .kernel_cpu = sl_kernel,
     .grad = pe_grad_default},
    {.type = "slice_grad",
     .inputs = sl_grad_in,
     .outputs = sl_grad_out,
     .attrs = sl_attrs,
     .infer = sl_grad_infer,
     .kernel_cpu = sl_grad_kernel},
    {NULL},
};
