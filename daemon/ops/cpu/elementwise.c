/* Elementwise arithmetic: elementwise_add/sub/mul with broadcasting, scale,
 * sum, and their gradients (docs/ops.md, "arithmetic"). Hand-written f32
 * kernels; broadcasting and its reductions live in broadcast.c.
 *
 * Gradients of broadcast operands are sums of the output gradient over the
 * broadcast dims (for mul, of the output gradient times the other operand).
 * Grad kernels read the output shape from X and Y, so they also work when the
 * backward pass pruned Out@GRAD (then every gradient is zero).
 *
 * Fused relu (pass fuse_add_act, docs/ops.md): elementwise_add with
 * fuse_activation "relu" writes relu(X + Y), and its gradient, which then
 * also gets Out (the mask), writes Out@GRAD masked by Out (pe_relu_grad,
 * relu.h: NaN keeps dy, as relu keeps NaN) to X@GRAD and
 * Y@GRAD: each one pass over memory when X, Y and Out have the same size
 * (the pass fuses only those: a residual block's sum); with broadcasting,
 * the add then the relu in place, and the masked gradient into a temporary
 * that the broadcast reduction reads.
 *
 * Blocked activations (dnnl_act_layout.h): elementwise_add(_grad) and sum
 * take the attribute "layout_blocked"; pass_layout.c marks their
 * activations all blocked or all plain, and only same-shape operands, so
 * that these loops are the same in either layout. A broadcast on blocked
 * operands, or a mix of layouts, is refused naming the attribute. */
#include <stdlib.h>
#include <string.h>

#include "ops/cpu/broadcast.h"
#include "ops/cpu/dnnl_act_layout.h"
#include "ops/cpu/par_min.h"
#include "ops/cpu/relu.h"
#include "ops/op_tables.h"

/* Slot indices, in the order of the tables below. */
enum { EW_X, EW_Y, EW_OUT_IN, EW_DOUT }; /* grad inputs (forward: X, Y) */
enum { EW_OUT = 0 };                     /* forward output */
enum { EW_DX, EW_DY };                   /* grad outputs */
enum { SC_X, SC_OUT_IN, SC_DOUT };       /* scale(_grad) inputs */
enum { SUM_X, SUM_OUT_IN, SUM_DOUT };    /* sum(_grad) inputs */

/* Elements per tile when summing several inputs (tile lives on the stack). */
#define SUM_TILE 1024

/* --- elementwise_add / sub / mul ------------------------------------------------ */

/* Output shape and aligned operand shapes; formats the contract's error. */
static pe_status *ew_shapes(pe_infer_ctx *c, pe_shape *out, pe_shape *xa, pe_shape *ya) {
  pe_meta *x = pe_in_meta(c, EW_X, 0), *y = pe_in_meta(c, EW_Y, 0);
  if (!x || !y) return pe_infer_error(c, PE_EARITY, "needs inputs X and Y");
  PE_TRY(pe_infer_expect_dtype(c, EW_X, 0, PE_F32));
  PE_TRY(pe_infer_expect_dtype(c, EW_Y, 0, PE_F32));
  int64_t axis = pe_attr_i(c->def, c->desc, "axis");
  const char *why = pe_bcast_infer(&x->shape, &y->shape, axis, out, xa, ya);
  if (why) {
    char xs[PE_SHAPE_STRLEN], ys[PE_SHAPE_STRLEN];
    return pe_infer_error(c, PE_ESHAPE, "cannot broadcast Y '%s' %s to X '%s' %s (axis %lld: %s)",
                          pe_in_name(c, EW_Y, 0), pe_shape_str(&y->shape, ys, sizeof ys),
                          pe_in_name(c, EW_X, 0), pe_shape_str(&x->shape, xs, sizeof xs),
                          (long long)axis, why);
  }
  return NULL;
}

/* fuse_activation of elementwise_add(_grad): "" (none) or "relu"; the other
 * ops have no such attribute (""). */
static bool ew_relu(const pe_op_def *def, const pe_op_desc *op) {
  return strcmp(pe_attr_s(def, op, "fuse_activation"), "relu") == 0;
}

static pe_status *ew_check_act(pe_infer_ctx *c) {
  const char *act = pe_attr_s(c->def, c->desc, "fuse_activation");
  if (act[0] && strcmp(act, "relu") != 0)
    return pe_infer_error(c, PE_EATTR, "fuse_activation '%s' unknown (\"\" or \"relu\")", act);
  return NULL;
}

static pe_status *ew_infer(pe_infer_ctx *c) {
  pe_shape out, xa, ya;
  PE_TRY(ew_check_act(c));
  PE_TRY(ew_shapes(c, &out, &xa, &ya));
  pe_infer_set(c, EW_OUT, PE_F32, &out);
  return NULL;
}

/* A fused relu's gradient needs the forward Out, of the output's shape. */
static pe_status *ew_grad_infer(pe_infer_ctx *c) {
  pe_shape out, xa, ya;
  PE_TRY(ew_check_act(c));
  PE_TRY(ew_shapes(c, &out, &xa, &ya)); /* same checks as the forward op */
  if (ew_relu(c->def, c->desc)) {
    pe_meta *o = pe_in_meta(c, EW_OUT_IN, 0);
    if (!o) return pe_infer_error(c, PE_EARITY, "fuse_activation relu needs input Out (the mask)");
    if (!pe_shape_compatible(&o->shape, &out)) {
      char a[PE_SHAPE_STRLEN], b[PE_SHAPE_STRLEN];
      return pe_infer_error(c, PE_ESHAPE, "Out '%s' %s is not the output's shape %s",
                            pe_in_name(c, EW_OUT_IN, 0), pe_shape_str(&o->shape, a, sizeof a),
                            pe_shape_str(&out, b, sizeof b));
    }
  }
  return pe_infer_grad_like_inputs(c);
}

/* Runtime shapes from the bound tensors (infer already accepted them). */
static pe_status *ew_kernel_shapes(pe_kernel_ctx *c, pe_shape *out, pe_shape *xa, pe_shape *ya) {
  pe_tensor *x = pe_kin(c, EW_X, 0), *y = pe_kin(c, EW_Y, 0);
  int64_t axis = pe_attr_i(c->def, c->desc, "axis");
  const char *why = pe_bcast_infer(&x->shape, &y->shape, axis, out, xa, ya);
  if (why) return pe_kernel_error(c, PE_ESHAPE, "X and Y do not broadcast: %s", why);
  return NULL;
}

/* elementwise_add(_grad)'s activations share one layout; blocked ones must
 * all have the output's shape (no broadcast addressing in a blocked layout). */
static pe_status *ew_layout_check(pe_kernel_ctx *c, bool grad) {
  bool blocked;
  uint32_t in = 1u << EW_X | 1u << EW_Y | (grad ? 1u << EW_OUT_IN | 1u << EW_DOUT : 0);
  PE_TRY(pe_dnnl_act_tied(c, in, grad ? 1u << EW_DX | 1u << EW_DY : 1u << EW_OUT, &blocked));
  pe_tensor *x = pe_kin(c, EW_X, 0), *y = pe_kin(c, EW_Y, 0);
  if (!blocked || pe_shape_equal(&x->shape, &y->shape)) return NULL;
  char a[PE_SHAPE_STRLEN], b[PE_SHAPE_STRLEN];
  return pe_kernel_error(c, PE_EINVAL,
                         "attribute %s marks blocked operands that broadcast (X '%s' %s, Y '%s' "
                         "%s): blocked operands must have one shape",
                         PE_LAYOUT_ATTR, pe_op_input_arg(c->desc, "X"),
                         pe_shape_str(&x->shape, a, sizeof a), pe_op_input_arg(c->desc, "Y"),
                         pe_shape_str(&y->shape, b, sizeof b));
}

static pe_status *ew_forward(pe_kernel_ctx *c, pe_binop op) {
  pe_shape out, xa, ya;
  PE_TRY(ew_kernel_shapes(c, &out, &xa, &ya));
  pe_bcast p;
  pe_bcast_plan(&p, &out, &xa, &ya);
  pe_bcast_binary_f32(op, &p, pe_f32(pe_kin(c, EW_X, 0)), pe_f32(pe_kin(c, EW_Y, 0)),
                      pe_f32(pe_kout(c, EW_OUT, 0)), pe_kernel_threads(c));
  return NULL;
}

/* Elements per chunk of the fused relu's loops: the team splits chunks, a
 * chunk's loop vectorizes (each element read before it is written, so
 * outputs may alias inputs). */
#define RELU_CHUNK 8192

/* o = relu(a + b) (b NULL: relu(a)); o may alias a or b. */
static void add_relu_f32(const float *a, const float *b, float *o, int64_t n, int nt) {
  int64_t nch = (n + RELU_CHUNK - 1) / RELU_CHUNK;
#pragma omp parallel for if (pe_par_split(n)) num_threads(nt) schedule(static)
  for (int64_t c = 0; c < nch; c++) {
    int64_t lo = c * RELU_CHUNK, hi = n - lo < RELU_CHUNK ? n : lo + RELU_CHUNK;
    if (b) { /* two loops: b is never loaded when NULL */
#pragma omp simd
      for (int64_t i = lo; i < hi; i++) {
        o[i] = pe_relu(a[i] + b[i]); /* NaN stays NaN (relu.h) */
      }
    } else {
#pragma omp simd
      for (int64_t i = lo; i < hi; i++) o[i] = pe_relu(a[i]);
    }
  }
}

static pe_status *ew_add_kernel(pe_kernel_ctx *c) {
  PE_TRY(ew_layout_check(c, false));
  if (!ew_relu(c->def, c->desc)) return ew_forward(c, PE_BIN_ADD);
  pe_tensor *x = pe_kin(c, EW_X, 0), *y = pe_kin(c, EW_Y, 0), *o = pe_kout(c, EW_OUT, 0);
  int64_t n = pe_tensor_numel(o);
  if (pe_tensor_numel(x) == n && pe_tensor_numel(y) == n) {
    add_relu_f32(pe_f32(x), pe_f32(y), pe_f32(o), n, pe_kernel_threads(c));
    return NULL;
  }
  PE_TRY(ew_forward(c, PE_BIN_ADD));
  add_relu_f32(pe_f32(o), NULL, pe_f32(o), n, pe_kernel_threads(c));
  return NULL;
}
static pe_status *ew_sub_kernel(pe_kernel_ctx *c) {
  return ew_forward(c, PE_BIN_SUB);
}
static pe_status *ew_mul_kernel(pe_kernel_ctx *c) {
  return ew_forward(c, PE_BIN_MUL);
}

/* Gradient of one operand t (aligned shape ta) given the output gradient:
 * add/sub: sign * reduce(dout); mul: reduce(dout .* other), fused when the
 * other operand covers the output, else through an output-sized temporary. */
static pe_status *ew_grad_one(pe_kernel_ctx *c, pe_binop op, float sign, const pe_shape *out,
                              const pe_shape *ta, const pe_shape *ua, const float *dout,
                              const float *u, float *dt) {
  int nt = pe_kernel_threads(c);
  if (op != PE_BIN_MUL) return pe_bcast_reduce_f32(out, ta, dout, NULL, sign, dt, nt);
  int64_t n = pe_shape_numel(out), tn = pe_shape_numel(ta);
  if (pe_shape_numel(ua) == n) return pe_bcast_reduce_f32(out, ta, dout, u, 1.0f, dt, nt);
  pe_shape full = *out;
  pe_bcast p;
  pe_bcast_plan(&p, out, &full, ua);
  if (tn == n) { /* only the other operand broadcasts: no reduction */
    pe_bcast_binary_f32(PE_BIN_MUL, &p, dout, u, dt, nt);
    return NULL;
  }
  float *tmp = malloc((size_t)n * sizeof(float));
  if (!tmp)
    return pe_kernel_error(c, PE_ENOMEM, "out of memory for a %lld-element temporary",
                           (long long)n);
  pe_bcast_binary_f32(PE_BIN_MUL, &p, dout, u, tmp, nt);
  pe_status *st = pe_bcast_reduce_f32(out, ta, tmp, NULL, 1.0f, dt, nt);
  free(tmp);
  return st;
}

/* d1 (and d2 when given) = pe_relu_grad(out, dout); each may alias dout. dout
 * is loaded whatever the mask, so that the select vectorizes (a
 * conditional load made it a branch per element). */
static void relu_mask_f32(const float *out, const float *dout, float *d1, float *d2, int64_t n,
                          int nt) {
  int64_t nch = (n + RELU_CHUNK - 1) / RELU_CHUNK;
#pragma omp parallel for if (pe_par_split(n)) num_threads(nt) schedule(static)
  for (int64_t c = 0; c < nch; c++) {
    int64_t lo = c * RELU_CHUNK, hi = n - lo < RELU_CHUNK ? n : lo + RELU_CHUNK;
    if (d2) {
#pragma omp simd
      for (int64_t i = lo; i < hi; i++) {
        float g = dout[i];
        g = pe_relu_grad(out[i], g);
        d1[i] = g;
        d2[i] = g;
      }
    } else {
#pragma omp simd
      for (int64_t i = lo; i < hi; i++) {
        float g = dout[i];
        d1[i] = pe_relu_grad(out[i], g);
      }
    }
  }
}

/* g is Out@GRAD (already masked by a fused relu). */
static pe_status *ew_backward_from(pe_kernel_ctx *c, pe_binop op, const pe_shape *out,
                                   const pe_shape *xa, const pe_shape *ya, const float *g) {
  pe_tensor *x = pe_kin(c, EW_X, 0), *y = pe_kin(c, EW_Y, 0);
  pe_tensor *dx = pe_kout(c, EW_DX, 0), *dy = pe_kout(c, EW_DY, 0);
  if (dx) PE_TRY(ew_grad_one(c, op, 1.0f, out, xa, ya, g, pe_f32(y), pe_f32(dx)));
  if (dy)
    PE_TRY(
        ew_grad_one(c, op, op == PE_BIN_SUB ? -1.0f : 1.0f, out, ya, xa, g, pe_f32(x), pe_f32(dy)));
  return NULL;
}

static pe_status *ew_backward(pe_kernel_ctx *c, pe_binop op) {
  pe_tensor *dout = pe_kin(c, EW_DOUT, 0);
  pe_tensor *dx = pe_kout(c, EW_DX, 0), *dy = pe_kout(c, EW_DY, 0);
  if (!dout) { /* pruned output gradient: zeros */
    if (dx) pe_tensor_zero(dx);
    if (dy) pe_tensor_zero(dy);
    return NULL;
  }
  pe_shape out, xa, ya;
  PE_TRY(ew_kernel_shapes(c, &out, &xa, &ya));
  if (pe_tensor_numel(dout) != pe_shape_numel(&out)) {
    char a[PE_SHAPE_STRLEN], b[PE_SHAPE_STRLEN];
    return pe_kernel_error(c, PE_ESHAPE, "Out@GRAD %s does not match the output shape %s",
                           pe_shape_str(&dout->shape, a, sizeof a),
                           pe_shape_str(&out, b, sizeof b));
  }
  return ew_backward_from(c, op, &out, &xa, &ya, pe_f32(dout));
}

/* With a fused relu: the masked gradient straight into X@GRAD and Y@GRAD
 * when neither broadcasts, else through a temporary. */
static pe_status *ew_add_grad_kernel(pe_kernel_ctx *c) {
  PE_TRY(ew_layout_check(c, true));
  pe_tensor *dout = pe_kin(c, EW_DOUT, 0), *o = pe_kin(c, EW_OUT_IN, 0);
  if (!ew_relu(c->def, c->desc) || !dout) return ew_backward(c, PE_BIN_ADD);
  pe_shape out, xa, ya;
  PE_TRY(ew_kernel_shapes(c, &out, &xa, &ya));
  int64_t n = pe_shape_numel(&out);
  if (!o || pe_tensor_numel(o) != n || pe_tensor_numel(dout) != n) {
    char a[PE_SHAPE_STRLEN], b[PE_SHAPE_STRLEN], d[PE_SHAPE_STRLEN];
    return pe_kernel_error(c, PE_ESHAPE, "Out %s and Out@GRAD %s must have the output shape %s",
                           o ? pe_shape_str(&o->shape, a, sizeof a) : "(absent)",
                           pe_shape_str(&dout->shape, b, sizeof b),
                           pe_shape_str(&out, d, sizeof d));
  }
  pe_tensor *dx = pe_kout(c, EW_DX, 0), *dy = pe_kout(c, EW_DY, 0);
  int nt = pe_kernel_threads(c);
  if (pe_shape_numel(&xa) == n && pe_shape_numel(&ya) == n) {
    float *d1 = dx ? pe_f32(dx) : dy ? pe_f32(dy) : NULL;
    if (d1) relu_mask_f32(pe_f32(o), pe_f32(dout), d1, dx && dy ? pe_f32(dy) : NULL, n, nt);
    return NULL;
  }
  float *g = malloc((size_t)n * sizeof(float));
  if (!g)
    return pe_kernel_error(c, PE_ENOMEM, "out of memory for a %lld-element temporary",
                           (long long)n);
  relu_mask_f32(pe_f32(o), pe_f32(dout), g, NULL, n, nt);
  pe_status *st = ew_backward_from(c, PE_BIN_ADD, &out, &xa, &ya, g);
  free(g);
  return st;
}
static pe_status *ew_sub_grad_kernel(pe_kernel_ctx *c) {
  return ew_backward(c, PE_BIN_SUB);
}
static pe_status *ew_mul_grad_kernel(pe_kernel_ctx *c) {
  return ew_backward(c, PE_BIN_MUL);
}

/* --- scale ------------------------------------------------------------------------ */

static pe_status *scale_infer(pe_infer_ctx *c) {
  PE_TRY(pe_infer_expect_dtype(c, SC_X, 0, PE_F32));
  return pe_infer_same_as_first(c);
}

static pe_status *scale_grad_infer(pe_infer_ctx *c) {
  PE_TRY(pe_infer_expect_dtype(c, SC_X, 0, PE_F32));
  return pe_infer_grad_like_inputs(c);
}

/* o = a*x + b over n floats (both bias modes reduce to this). */
static void affine_f32(const float *x, float *o, int64_t n, float a, float b, int nt) {
#pragma omp parallel for if (pe_par_split(n)) num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; i++) o[i] = a * x[i] + b;
}

static pe_status *scale_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, SC_X, 0), *o = pe_kout(c, 0, 0);
  float s = pe_attr_f(c->def, c->desc, "scale"), b = pe_attr_f(c->def, c->desc, "bias");
  /* scale*(x+bias) = scale*x + scale*bias */
  if (!pe_attr_b(c->def, c->desc, "bias_after_scale")) b *= s;
  affine_f32(pe_f32(x), pe_f32(o), pe_tensor_numel(x), s, b, pe_kernel_threads(c));
  return NULL;
}

static pe_status *scale_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *dout = pe_kin(c, SC_DOUT, 0), *dx = pe_kout(c, 0, 0);
  if (!dx) return NULL;
  if (!dout) {
    pe_tensor_zero(dx);
    return NULL;
  }
  if (pe_tensor_numel(dout) != pe_tensor_numel(dx))
    return pe_kernel_error(c, PE_ESHAPE, "Out@GRAD has %lld elements, X has %lld",
                           (long long)pe_tensor_numel(dout), (long long)pe_tensor_numel(dx));
  affine_f32(pe_f32(dout), pe_f32(dx), pe_tensor_numel(dx), pe_attr_f(c->def, c->desc, "scale"),
             0.0f, pe_kernel_threads(c));
  return NULL;
}

/* --- sum ------------------------------------------------------------------------------ */

/* All X share X[0]'s dtype and shape (-1 dims match and are refined by known ones). */
static pe_status *sum_shape(pe_infer_ctx *c, pe_shape *out) {
  pe_meta *x0 = pe_in_meta(c, SUM_X, 0);
  if (!x0) return pe_infer_error(c, PE_EARITY, "needs at least one input X");
  PE_TRY(pe_infer_expect_dtype(c, SUM_X, 0, PE_F32));
  *out = x0->shape;
  for (int k = 1; k < c->in[SUM_X].n; k++) {
    pe_meta *xk = pe_in_meta(c, SUM_X, k);
    PE_TRY(pe_infer_expect_dtype(c, SUM_X, k, PE_F32));
    if (!pe_shape_compatible(out, &xk->shape)) {
      char a[PE_SHAPE_STRLEN], b[PE_SHAPE_STRLEN];
      return pe_infer_error(c, PE_ESHAPE, "input X #%d '%s' %s differs from X #0 '%s' %s", k,
                            pe_in_name(c, SUM_X, k), pe_shape_str(&xk->shape, a, sizeof a),
                            pe_in_name(c, SUM_X, 0), pe_shape_str(&x0->shape, b, sizeof b));
    }
    for (int d = 0; d < out->ndim; d++)
      if (out->d[d] < 0) out->d[d] = xk->shape.d[d];
  }
  return NULL;
}

static pe_status *sum_infer(pe_infer_ctx *c) {
  pe_shape out;
  PE_TRY(sum_shape(c, &out));
  pe_infer_set(c, 0, PE_F32, &out);
  return NULL;
}

static pe_status *sum_grad_infer(pe_infer_ctx *c) {
  pe_shape out;
  PE_TRY(sum_shape(c, &out));
  return pe_infer_grad_like_inputs(c);
}

/* Tiled so that Out may be one of the inputs (in-place gradient accumulation):
 * a tile reads every input before it writes. */
static pe_status *sum_kernel(pe_kernel_ctx *c) {
  bool blocked; /* same-size operands: the loop is the same in either layout */
  PE_TRY(pe_dnnl_act_tied(c, 1u << SUM_X, 1u << 0, &blocked));
  int nx = c->in[SUM_X].n;
  float *o = pe_f32(pe_kout(c, 0, 0));
  int64_t n = pe_tensor_numel(pe_kout(c, 0, 0));
  for (int k = 0; k < nx; k++)
    if (pe_tensor_numel(pe_kin(c, SUM_X, k)) != n)
      return pe_kernel_error(c, PE_ESHAPE, "input X #%d has %lld elements, Out has %lld", k,
                             (long long)pe_tensor_numel(pe_kin(c, SUM_X, k)), (long long)n);
  int64_t tiles = (n + SUM_TILE - 1) / SUM_TILE;
#pragma omp parallel for if (pe_par_split(n * nx)) num_threads(pe_kernel_threads(c)) \
    schedule(static)
  for (int64_t t = 0; t < tiles; t++) {
    float acc[SUM_TILE];
    int64_t lo = t * SUM_TILE, w = n - lo < SUM_TILE ? n - lo : SUM_TILE;
    memcpy(acc, pe_f32(pe_kin(c, SUM_X, 0)) + lo, (size_t)w * sizeof(float));
    for (int k = 1; k < nx; k++) {
      const float *xk = pe_f32(pe_kin(c, SUM_X, k)) + lo;
      for (int64_t i = 0; i < w; i++) acc[i] += xk[i];
    }
    memcpy(o + lo, acc, (size_t)w * sizeof(float));
  }
  return NULL;
}

/* Each X@GRAD = Out@GRAD (zeros when pruned). */
static pe_status *sum_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *dout = pe_kin(c, SUM_DOUT, 0);
  for (int k = 0; k < c->out[0].n; k++) {
    pe_tensor *dx = pe_kout(c, 0, k);
    if (!dout) {
      pe_tensor_zero(dx);
      continue;
    }
    if (pe_tensor_numel(dout) != pe_tensor_numel(dx))
      return pe_kernel_error(c, PE_ESHAPE, "Out@GRAD has %lld elements, X@GRAD #%d has %lld",
                             (long long)pe_tensor_numel(dout), k, (long long)pe_tensor_numel(dx));
    if (dx->data != dout->data) memcpy(dx->data, dout->data, pe_tensor_bytes(dx));
  }
  return NULL;
}

/* --- table ---------------------------------------------------------------------------- */

static const pe_slot_def xy_in[] = {{"X", 1, 1}, {"Y", 1, 1}, {NULL}};
static const pe_slot_def out_slot[] = {{"Out", 1, 1}, {NULL}};
static const pe_slot_def xy_grad_in[] = {
    {"X", 1, 1}, {"Y", 1, 1}, {"Out", 0, 1}, {"Out" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
static const pe_slot_def xy_grad_out[] = {
    {"X" PE_GRAD_SUFFIX, 0, 1}, {"Y" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
static const pe_attr_def ew_attrs[] = {{"axis", PE_ATTR_INT, false, -1}, {NULL}};
static const pe_attr_def ew_add_attrs[] = {{"axis", PE_ATTR_INT, false, -1},
                                           {"fuse_activation", PE_ATTR_STRING, false, 0, ""},
                                           {PE_LAYOUT_ATTR, PE_ATTR_INT, false, 0, NULL},
                                           {NULL}};

static const pe_slot_def x_in[] = {{"X", 1, 1}, {NULL}};
static const pe_slot_def x_grad_in[] = {
    {"X", 1, 1}, {"Out", 0, 1}, {"Out" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
static const pe_slot_def x_grad_out[] = {{"X" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
static const pe_attr_def scale_attrs[] = {{"scale", PE_ATTR_FLOAT, false, 1},
                                          {"bias", PE_ATTR_FLOAT, false, 0},
                                          {"bias_after_scale", PE_ATTR_BOOL, false, 1},
                                          {NULL}};

static const pe_slot_def sum_in[] = {{"X", 1, -1}, {NULL}};
static const pe_slot_def sum_grad_in[] = {
    {"X", 1, -1}, {"Out", 0, 1}, {"Out" PE_GRAD_SUFFIX, 0, 1}, {NULL}};
static const pe_slot_def sum_grad_out[] = {{"X" PE_GRAD_SUFFIX, 0, -1}, {NULL}};
static const pe_attr_def no_attrs[] = {{NULL}};
static const pe_attr_def sum_attrs[] = {{PE_LAYOUT_ATTR, PE_ATTR_INT, false, 0, NULL}, {NULL}};

const pe_op_def pe_ops_elementwise[] = {
    {.type = "elementwise_add",
     .inputs = xy_in,
     .outputs = out_slot,
     .attrs = ew_add_attrs,
     .infer = ew_infer,
     .kernel_cpu = ew_add_kernel,
     .grad = pe_grad_default},
    {.type = "elementwise_add_grad",
     .inputs = xy_grad_in,
     .outputs = xy_grad_out,
     .attrs = ew_add_attrs,
     .infer = ew_grad_infer,
     .kernel_cpu = ew_add_grad_kernel},
    {.type = "elementwise_sub",
     .inputs = xy_in,
     .outputs = out_slot,
     .attrs = ew_attrs,
     .infer = ew_infer,
     .kernel_cpu = ew_sub_kernel,
     .grad = pe_grad_default},
    {.type = "elementwise_sub_grad",
     .inputs = xy_grad_in,
     .outputs = xy_grad_out,
     .attrs = ew_attrs,
     .infer = ew_grad_infer,
     .kernel_cpu = ew_sub_grad_kernel},
    {.type = "elementwise_mul",
     .inputs = xy_in,
     .outputs = out_slot,
     .attrs = ew_attrs,
     .infer = ew_infer,
     .kernel_cpu = ew_mul_kernel,
     .grad = pe_grad_default},
    {.type = "elementwise_mul_grad",
     .inputs = xy_grad_in,
     .outputs = xy_grad_out,
     .attrs = ew_attrs,
     .infer = ew_grad_infer,
     .kernel_cpu = ew_mul_grad_kernel},
    {.type = "scale",
     .inputs = x_in,
     .outputs = out_slot,
     .attrs = scale_attrs,
     .infer = scale_infer,
     .kernel_cpu = scale_kernel,
     .grad = pe_grad_default},
    {.type = "scale_grad",
     .inputs = x_grad_in,
     .outputs = x_grad_out,
     .attrs = scale_attrs,
     .infer = scale_grad_infer,
     .kernel_cpu = scale_grad_kernel},
    {.type = "sum",
     .inputs = sum_in,
     .outputs = out_slot,
     .attrs = sum_attrs,
     .infer = sum_infer,
     .kernel_cpu = sum_kernel,
     .grad = pe_grad_default},
    {.type = "sum_grad",
     .inputs = sum_grad_in,
     .outputs = sum_grad_out,
     .attrs = no_attrs,
     .infer = sum_grad_infer,
     .kernel_cpu = sum_grad_kernel},
    {NULL},
};
