/* Optimizer ops: sgd, momentum, adam (f32, dense or sparse gradients).
 *
 * They update in place: the optimizer pass binds ParamOut to the Param
 * variable (VelocityOut to Velocity, Moment1Out to Moment1, ...), so the
 * executor hands the kernel the same tensor in both slots. Every loop reads
 * all inputs of element i before writing element i, which is correct whether
 * or not the slots alias; [1] state (LearningRate, Beta*Pow) is read into
 * locals before any write.
 *
 * The loops are `omp simd`: in place, ParamOut aliases Param exactly, so the
 * compiler's overlap check would fail at run time and take the scalar loop
 * (4-5x slower); element-wise read-then-write makes vector lanes safe.
 * This file is built with -fno-math-errno (CMakeLists.txt): with errno, the
 * sqrtf in adam's loop is a possible library call and the loop stays
 * scalar (~3x slower); sqrt is correctly rounded, so the vector sqrtps gives
 * the same bits.
 *
 *   sgd       p -= lr * g
 *   momentum  v = mu*v + g;  p -= lr * v            (nesterov: p -= lr * (g + mu*v))
 *   adam      m1 = b1*m1 + (1-b1)*g;  m2 = b2*m2 + (1-b2)*g*g
 *             lr_t = lr * sqrt(1 - b2pow) / (1 - b1pow)
 *             p -= lr_t * m1 / (sqrt(m2) + eps)
 *             b1pow *= b1;  b2pow *= b2   (after the update: lr_t uses the old pows)
 * The Beta*Pow tensors start at beta (startup), so the first step uses
 * 1 - beta, the bias correction of step 1.
 *
 * L2 regularisation (Paddle's momentum attributes, on all three here):
 * regularization_method "l2_decay" with regularization_coeff c uses
 * g + c * p for the gradient g in the formulas above (PyTorch's
 * weight_decay of SGD and Adam); "" (the default) leaves g as it is.
 * Adam also takes "decoupled_decay" (AdamW, Loshchilov & Hutter; PyTorch's
 * AdamW): the gradient stays g and the parameter shrinks before the step,
 *   p = p * (1 - lr * c) - lr_t * m1 / (sqrt(m2) + eps)
 * with the step's (scheduled) lr, not lr_t.
 *
 * Sparse gradients (registry.h, PE_ROWS_SUFFIX): with the optional input
 * GradRows, Grad holds only the rows GradRows names (ascending, -1 for
 * empty slots after the last); every other row's gradient is zero. The
 * kernels run the dense formulas on spans of Param's rows (span functions):
 *   sgd       only the gradient's rows (p - lr * 0 is p)
 *   momentum  every row, as Paddle's sparse momentum: untouched rows still
 *             decay their velocity, so the result is dense momentum's
 *   adam      lazy_mode (Paddle's attribute): only the gradient's rows;
 *             untouched rows keep their moments and values, where dense adam
 *             would decay the moments and still move the parameter; rows
 *             touched at every step match dense adam. Without lazy_mode,
 *             every row, which is dense adam.
 * The Beta*Pow advance once per step either way. A sparse Grad takes no
 * weight decay (regularization_method ""), which would touch every row. */
#include <math.h>
#include <string.h>

#include "ops/cpu/par_min.h"
#include "ops/cpu/simd_for.h"
#include "ops/op_tables.h"

enum { SGD_PARAM = 0, SGD_GRAD, SGD_LR, SGD_ROWS };
enum { SGD_PARAM_OUT = 0 };
enum { MOM_PARAM = 0, MOM_GRAD, MOM_VELOCITY, MOM_LR, MOM_ROWS };
enum { MOM_PARAM_OUT = 0, MOM_VELOCITY_OUT };
enum { ADAM_PARAM = 0, ADAM_GRAD, ADAM_LR, ADAM_M1, ADAM_M2, ADAM_B1POW, ADAM_B2POW, ADAM_ROWS };
enum { ADAM_PARAM_OUT = 0, ADAM_M1_OUT, ADAM_M2_OUT, ADAM_B1POW_OUT, ADAM_B2POW_OUT };

/* --- inference checks ----------------------------------------------------------- */

static pe_status *expect_param(pe_infer_ctx *c, int slot, pe_meta **out) {
  pe_meta *p = pe_in_meta(c, slot, 0);
  if (!p) return pe_infer_error(c, PE_EARITY, "missing input %s", c->def->inputs[slot].name);
  PE_TRY(pe_infer_expect_dtype(c, slot, 0, PE_F32));
  *out = p;
  return NULL;
}

/* Input `slot` must have exactly Param's shape and dtype (no broadcasting). */
static pe_status *expect_like(pe_infer_ctx *c, int slot, int param_slot) {
  pe_meta *m = pe_in_meta(c, slot, 0), *p = pe_in_meta(c, param_slot, 0);
  const char *sn = c->def->inputs[slot].name, *pn = c->def->inputs[param_slot].name;
  if (!m) return pe_infer_error(c, PE_EARITY, "missing input %s", sn);
  char sa[PE_SHAPE_STRLEN], sb[PE_SHAPE_STRLEN];
  pe_shape_str(&m->shape, sa, sizeof sa);
  pe_shape_str(&p->shape, sb, sizeof sb);
  if (!pe_shape_equal(&m->shape, &p->shape))
    return pe_infer_error(c, PE_ESHAPE, "%s '%s' has shape %s but %s '%s' has shape %s", sn,
                          pe_in_name(c, slot, 0), sa, pn, pe_in_name(c, param_slot, 0), sb);
  if (m->dtype != p->dtype)
    return pe_infer_error(c, PE_EDTYPE, "%s '%s' %s has dtype %s but %s '%s' %s has dtype %s", sn,
                          pe_in_name(c, slot, 0), sa, pe_dtype_name(m->dtype), pn,
                          pe_in_name(c, param_slot, 0), sb, pe_dtype_name(p->dtype));
  return NULL;
}

/* Grad: Param's shape and dtype, or with GradRows (`rows_slot`) a sparse
 * gradient: i64 rows [n] and values [n, Param's other dims], and no weight
 * decay. */
static pe_status *expect_grad(pe_infer_ctx *c, int slot, int rows_slot, int param_slot) {
  pe_meta *r = pe_in_meta(c, rows_slot, 0);
  if (!r) return expect_like(c, slot, param_slot);
  pe_meta *g = pe_in_meta(c, slot, 0), *p = pe_in_meta(c, param_slot, 0);
  if (!g) return pe_infer_error(c, PE_EARITY, "missing input Grad");
  const char *gn = pe_in_name(c, slot, 0), *rn = pe_in_name(c, rows_slot, 0);
  char sg[PE_SHAPE_STRLEN], sr[PE_SHAPE_STRLEN], sp[PE_SHAPE_STRLEN];
  pe_shape_str(&g->shape, sg, sizeof sg);
  pe_shape_str(&r->shape, sr, sizeof sr);
  pe_shape_str(&p->shape, sp, sizeof sp);
  if (r->dtype != PE_I64 || r->shape.ndim != 1)
    return pe_infer_error(c, r->dtype != PE_I64 ? PE_EDTYPE : PE_ESHAPE,
                          "GradRows '%s' is %s %s; it must be 1-D i64 (a sparse gradient's rows)",
                          rn, pe_dtype_name(r->dtype), sr);
  bool ok = g->dtype == p->dtype && g->shape.ndim == p->shape.ndim && p->shape.ndim >= 1 &&
            (g->shape.d[0] < 0 || r->shape.d[0] < 0 || g->shape.d[0] == r->shape.d[0]);
  for (int d = 1; ok && d < p->shape.ndim; d++) ok = g->shape.d[d] == p->shape.d[d];
  if (!ok)
    return pe_infer_error(c, PE_ESHAPE,
                          "sparse Grad '%s' %s %s must hold one row of Param '%s' %s %s for each "
                          "of the %s rows in GradRows '%s'",
                          gn, pe_dtype_name(g->dtype), sg, pe_in_name(c, param_slot, 0),
                          pe_dtype_name(p->dtype), sp, sr, rn);
  const char *m = pe_attr_s(c->def, c->desc, "regularization_method");
  if (m[0])
    return pe_infer_error(c, PE_EATTR,
                          "regularization_method '%.32s' decays every row of Param '%s'; Grad '%s' "
                          "is sparse (GradRows '%s'): use a dense gradient (is_sparse false) or no "
                          "weight decay",
                          m, pe_in_name(c, param_slot, 0), gn, rn);
  return NULL;
}

/* Input `slot` must be a [1] f32 tensor (learning rate, beta powers). */
static pe_status *expect_scalar(pe_infer_ctx *c, int slot) {
  pe_meta *m = pe_in_meta(c, slot, 0);
  const char *sn = c->def->inputs[slot].name;
  if (!m) return pe_infer_error(c, PE_EARITY, "missing input %s", sn);
  if (m->dtype != PE_F32 || m->shape.ndim != 1 || m->shape.d[0] != 1) {
    char sa[PE_SHAPE_STRLEN];
    return pe_infer_error(c, m->dtype != PE_F32 ? PE_EDTYPE : PE_ESHAPE,
                          "%s '%s' is %s %s; it must be [1] f32", sn, pe_in_name(c, slot, 0),
                          pe_dtype_name(m->dtype), pe_shape_str(&m->shape, sa, sizeof sa));
  }
  return NULL;
}

/* Output `out_slot` gets the meta of input `in_slot`. */
static void out_like(pe_infer_ctx *c, int out_slot, int in_slot) {
  pe_meta *m = pe_in_meta(c, in_slot, 0);
  pe_infer_set(c, out_slot, m->dtype, &m->shape);
}

/* regularization_method and regularization_coeff: "", "l2_decay" or (adam
 * only: `decoupled`) "decoupled_decay", with a finite coefficient >= 0 (the
 * kernels assume it). */
static pe_status *check_regularization(pe_infer_ctx *c, bool decoupled) {
  const char *m = pe_attr_s(c->def, c->desc, "regularization_method");
  float coeff = pe_attr_f(c->def, c->desc, "regularization_coeff");
  if (!decoupled && strcmp(m, "decoupled_decay") == 0)
    return pe_infer_error(c, PE_EATTR,
                          "attribute regularization_method = 'decoupled_decay' is adam's (adamw); "
                          "%s takes \"\" or l2_decay",
                          c->def->type);
  if (m[0] && strcmp(m, "l2_decay") != 0 && strcmp(m, "decoupled_decay") != 0)
    return pe_infer_error(c, PE_EATTR,
                          "attribute regularization_method = '%.32s' unknown (\"\", l2_decay%s)", m,
                          decoupled ? " or decoupled_decay" : "");
  if (!(coeff >= 0.0f) || !isfinite(coeff))
    return pe_infer_error(
        c, PE_EATTR, "attribute regularization_coeff = %g must be finite and >= 0", (double)coeff);
  return NULL;
}

float pe_optimizer_l2_coeff(const pe_op_def *d, const pe_op_desc *op) {
  return strcmp(pe_attr_s(d, op, "regularization_method"), "l2_decay") == 0
             ? pe_attr_f(d, op, "regularization_coeff")
             : 0.0f;
}

float pe_optimizer_decoupled_coeff(const pe_op_def *d, const pe_op_desc *op) {
  return strcmp(pe_attr_s(d, op, "regularization_method"), "decoupled_decay") == 0
             ? pe_attr_f(d, op, "regularization_coeff")
             : 0.0f;
}

/* --- gradient spans --------------------------------------------------------------- */

/* A span function updates Param's elements [off, off + len) with the
 * gradient g (indexed from the span's start; NULL: zero). */
typedef void (*span_fn)(void *args, int64_t off, int64_t len, const float *g);

/* Runs fn over Param with Grad: one span for a dense Grad; with GradRows
 * (`rows_slot`), a span per gradient row and, unless lazy, one per run of
 * rows between them (g NULL). Rows out of [0, rows of Param), not
 * ascending, or -1 before a row are an error naming the op's variables. */
static pe_status *grad_spans(pe_kernel_ctx *c, int param_slot, int grad_slot, int rows_slot,
                             bool lazy, span_fn fn, void *args) {
  const pe_tensor *p = pe_kin(c, param_slot, 0), *g = pe_kin(c, grad_slot, 0);
  const pe_tensor *r = pe_kin(c, rows_slot, 0);
  int64_t numel = pe_tensor_numel(p);
  if (!r) {
    fn(args, 0, numel, pe_f32(g));
    return NULL;
  }
  int64_t height = p->shape.d[0], width = height > 0 ? numel / height : 0;
  int64_t n = pe_tensor_numel(r), next = 0, last = -1;
  const int64_t *rows = pe_i64(r);
  for (int64_t k = 0; k < n; k++) { /* checked before any write */
    bool bad = rows[k] < -1 || rows[k] >= height || (rows[k] >= 0 && rows[k] <= last) ||
               (rows[k] >= 0 && k > 0 && rows[k - 1] == -1);
    if (bad) {
      const char *rn = pe_op_input_arg(c->desc, "GradRows"),
                 *pn = pe_op_input_arg(c->desc, "Param");
      return pe_kernel_error(c, PE_EINVAL,
                             "GradRows '%s' [%lld] holds %lld at %lld: rows of Param '%s' (%lld "
                             "rows) must be ascending, distinct, with -1 only after the last",
                             rn ? rn : "?", (long long)n, (long long)rows[k], (long long)k,
                             pn ? pn : "?", (long long)height);
    }
    if (rows[k] >= 0) last = rows[k];
  }
  const float *vals = pe_f32(g);
  for (int64_t k = 0; k < n && rows[k] >= 0; k++) {
    if (!lazy && rows[k] > next) fn(args, next * width, (rows[k] - next) * width, NULL);
    fn(args, rows[k] * width, width, vals + k * width);
    next = rows[k] + 1;
  }
  if (!lazy && height > next) fn(args, next * width, (height - next) * width, NULL);
  return NULL;
}

/* --- sgd ----------------------------------------------------------------------- */

static pe_status *sgd_infer(pe_infer_ctx *c) {
  pe_meta *p;
  PE_TRY(expect_param(c, SGD_PARAM, &p));
  PE_TRY(expect_grad(c, SGD_GRAD, SGD_ROWS, SGD_PARAM));
  PE_TRY(expect_scalar(c, SGD_LR));
  PE_TRY(check_regularization(c, false));
  out_like(c, SGD_PARAM_OUT, SGD_PARAM);
  return NULL;
}

typedef struct sgd_args {
  const float *p;
  float *po;
  float lr, wd;
  int nt;
} sgd_args;

static void sgd_span(void *args, int64_t off, int64_t n, const float *g) {
  const sgd_args *a = args;
  const float *p = a->p + off;
  float *po = a->po + off;
  float lr = a->lr, wd = a->wd;
  if (g)
    PE_SIMD_FOR(i, n, pe_par_split(n), a->nt,
                po[i] = p[i] - lr * (wd != 0.0f ? g[i] + wd * p[i] : g[i]););
  else
    PE_SIMD_FOR(i, n, pe_par_split(n), a->nt, po[i] = p[i] - lr * (wd * p[i]););
}

static pe_status *sgd_kernel(pe_kernel_ctx *c) {
  sgd_args a = {pe_f32(pe_kin(c, SGD_PARAM, 0)), pe_f32(pe_kout(c, SGD_PARAM_OUT, 0)),
                pe_f32(pe_kin(c, SGD_LR, 0))[0], pe_optimizer_l2_coeff(c->def, c->desc),
                pe_kernel_threads(c)};
  /* In place, rows without a gradient stay as they are (p - lr * 0). */
  return grad_spans(c, SGD_PARAM, SGD_GRAD, SGD_ROWS, a.po == a.p, sgd_span, &a);
}

/* --- momentum ------------------------------------------------------------------- */

static pe_status *momentum_infer(pe_infer_ctx *c) {
  pe_meta *p;
  PE_TRY(expect_param(c, MOM_PARAM, &p));
  PE_TRY(expect_grad(c, MOM_GRAD, MOM_ROWS, MOM_PARAM));
  PE_TRY(expect_like(c, MOM_VELOCITY, MOM_PARAM));
  PE_TRY(expect_scalar(c, MOM_LR));
  PE_TRY(check_regularization(c, false));
  out_like(c, MOM_PARAM_OUT, MOM_PARAM);
  out_like(c, MOM_VELOCITY_OUT, MOM_VELOCITY);
  return NULL;
}

typedef struct momentum_args {
  const float *p, *v;
  float *po, *vo;
  float lr, mu, wd;
  bool nesterov;
  int nt;
} momentum_args;

/* G: the gradient of element i (g[i], or 0 where the span has none). */
#define MOMENTUM_BODY(G)                                                         \
  {                                                                              \
    float pi = p[i], gi = wd != 0.0f ? (G) + wd * pi : (G), vn = mu * v[i] + gi; \
    vo[i] = vn;                                                                  \
    po[i] = nesterov ? pi - lr * (gi + mu * vn) : pi - lr * vn;                  \
  }

static void momentum_span(void *args, int64_t off, int64_t n, const float *g) {
  const momentum_args *a = args;
  const float *p = a->p + off, *v = a->v + off;
  float *po = a->po + off, *vo = a->vo + off;
  float lr = a->lr, mu = a->mu, wd = a->wd;
  bool nesterov = a->nesterov;
  if (g)
    PE_SIMD_FOR(i, n, pe_par_split(n), a->nt, MOMENTUM_BODY(g[i]));
  else
    PE_SIMD_FOR(i, n, pe_par_split(n), a->nt, MOMENTUM_BODY(0.0f));
}

static pe_status *momentum_kernel(pe_kernel_ctx *c) {
  momentum_args a = {pe_f32(pe_kin(c, MOM_PARAM, 0)),
                     pe_f32(pe_kin(c, MOM_VELOCITY, 0)),
                     pe_f32(pe_kout(c, MOM_PARAM_OUT, 0)),
                     pe_f32(pe_kout(c, MOM_VELOCITY_OUT, 0)),
                     pe_f32(pe_kin(c, MOM_LR, 0))[0],
                     pe_attr_f(c->def, c->desc, "mu"),
                     pe_optimizer_l2_coeff(c->def, c->desc),
                     pe_attr_b(c->def, c->desc, "use_nesterov"),
                     pe_kernel_threads(c)};
  return grad_spans(c, MOM_PARAM, MOM_GRAD, MOM_ROWS, false, momentum_span, &a);
}

/* --- adam -------------------------------------------------------------------------- */

static pe_status *adam_infer(pe_infer_ctx *c) {
  float b1 = pe_attr_f(c->def, c->desc, "beta1"), b2 = pe_attr_f(c->def, c->desc, "beta2");
  float eps = pe_attr_f(c->def, c->desc, "epsilon");
  if (!(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1))
    return pe_infer_error(c, PE_EATTR, "attributes beta1 = %g, beta2 = %g must be in [0, 1)", b1,
                          b2);
  if (!(eps >= 0) || !isfinite(eps))
    return pe_infer_error(c, PE_EATTR, "attribute epsilon = %g must be finite and >= 0", eps);
  pe_meta *p;
  PE_TRY(expect_param(c, ADAM_PARAM, &p));
  PE_TRY(expect_grad(c, ADAM_GRAD, ADAM_ROWS, ADAM_PARAM));
  PE_TRY(expect_scalar(c, ADAM_LR));
  PE_TRY(expect_like(c, ADAM_M1, ADAM_PARAM));
  PE_TRY(expect_like(c, ADAM_M2, ADAM_PARAM));
  PE_TRY(expect_scalar(c, ADAM_B1POW));
  PE_TRY(expect_scalar(c, ADAM_B2POW));
  PE_TRY(check_regularization(c, true));
  out_like(c, ADAM_PARAM_OUT, ADAM_PARAM);
  out_like(c, ADAM_M1_OUT, ADAM_M1);
  out_like(c, ADAM_M2_OUT, ADAM_M2);
  out_like(c, ADAM_B1POW_OUT, ADAM_B1POW);
  out_like(c, ADAM_B2POW_OUT, ADAM_B2POW);
  return NULL;
}

typedef struct adam_args {
  const float *p, *m1, *m2;
  float *po, *m1o, *m2o;
  float b1, b2, eps, lr_t, wd, keep;
  bool lazy; /* a span without gradient is left alone (copied when not in place) */
  int nt;
} adam_args;

/* G: the gradient of element i (g[i], or 0 where the span has none). */
#define ADAM_BODY(G)                                        \
  {                                                         \
    float pi = p[i], gi = wd != 0.0f ? (G) + wd * pi : (G); \
    float a = b1 * m1[i] + (1.0f - b1) * gi;                \
    float b = b2 * m2[i] + (1.0f - b2) * gi * gi;           \
    m1o[i] = a;                                             \
    m2o[i] = b;                                             \
    po[i] = pi * keep - lr_t * a / (sqrtf(b) + eps);        \
  }

static void adam_span(void *args, int64_t off, int64_t n, const float *g) {
  const adam_args *x = args;
  const float *p = x->p + off, *m1 = x->m1 + off, *m2 = x->m2 + off;
  float *po = x->po + off, *m1o = x->m1o + off, *m2o = x->m2o + off;
  float b1 = x->b1, b2 = x->b2, eps = x->eps, lr_t = x->lr_t, wd = x->wd, keep = x->keep;
  if (g) {
    PE_SIMD_FOR(i, n, pe_par_split(n), x->nt, ADAM_BODY(g[i]));
  } else if (!x->lazy) {
    PE_SIMD_FOR(i, n, pe_par_split(n), x->nt, ADAM_BODY(0.0f));
  } else {
    if (po != p) memcpy(po, p, (size_t)n * sizeof(float));
    if (m1o != m1) memcpy(m1o, m1, (size_t)n * sizeof(float));
    if (m2o != m2) memcpy(m2o, m2, (size_t)n * sizeof(float));
  }
}

static pe_status *adam_kernel(pe_kernel_ctx *c) {
  double lr = pe_f32(pe_kin(c, ADAM_LR, 0))[0];
  double b1pow = pe_f32(pe_kin(c, ADAM_B1POW, 0))[0], b2pow = pe_f32(pe_kin(c, ADAM_B2POW, 0))[0];
  if (!(b1pow < 1.0) || !(b2pow < 1.0)) { /* a state tensor set by hand to >= 1 */
    const char *v1 = pe_op_input_arg(c->desc, "Beta1Pow"),
               *v2 = pe_op_input_arg(c->desc, "Beta2Pow");
    const char *w = pe_op_input_arg(c->desc, "Param");
    return pe_kernel_error(c, PE_EINVAL,
                           "Beta1Pow '%s' = %g, Beta2Pow '%s' = %g (shape [1]) of Param '%s': bias "
                           "correction needs both < 1",
                           v1 ? v1 : "?", b1pow, v2 ? v2 : "?", b2pow, w ? w : "?");
  }
  adam_args x = {
      .p = pe_f32(pe_kin(c, ADAM_PARAM, 0)),
      .m1 = pe_f32(pe_kin(c, ADAM_M1, 0)),
      .m2 = pe_f32(pe_kin(c, ADAM_M2, 0)),
      .po = pe_f32(pe_kout(c, ADAM_PARAM_OUT, 0)),
      .m1o = pe_f32(pe_kout(c, ADAM_M1_OUT, 0)),
      .m2o = pe_f32(pe_kout(c, ADAM_M2_OUT, 0)),
      .b1 = pe_attr_f(c->def, c->desc, "beta1"),
      .b2 = pe_attr_f(c->def, c->desc, "beta2"),
      .eps = pe_attr_f(c->def, c->desc, "epsilon"),
      .lr_t = (float)(lr * sqrt(1.0 - b2pow) / (1.0 - b1pow)),
      .wd = pe_optimizer_l2_coeff(c->def, c->desc),
      /* 1 without decoupled decay: p * 1 is p, so adam without it is unchanged. */
      .keep = (float)(1.0 - lr * pe_optimizer_decoupled_coeff(c->def, c->desc)),
      .lazy = pe_attr_b(c->def, c->desc, "lazy_mode"),
      .nt = pe_kernel_threads(c),
  };
  PE_TRY(grad_spans(c, ADAM_PARAM, ADAM_GRAD, ADAM_ROWS, x.lazy, adam_span, &x));
  pe_f32(pe_kout(c, ADAM_B1POW_OUT, 0))[0] = (float)(b1pow * x.b1);
  pe_f32(pe_kout(c, ADAM_B2POW_OUT, 0))[0] = (float)(b2pow * x.b2);
  return NULL;
}

/* --- table ---------------------------------------------------------------------------- */

/* GradRows: a sparse Grad's rows (the file's comment). */
static const pe_slot_def sgd_in[] = {{"Param", 1, 1, 0},
                                     {"Grad", 1, 1, 0},
                                     {"LearningRate", 1, 1, 0},
                                     {"GradRows", 0, 1, PE_SLOT_NO_GRAD},
                                     {NULL}};
static const pe_slot_def sgd_out[] = {{"ParamOut", 1, 1, 0}, {NULL}};
/* Every optimizer's weight decay (check_regularization). */
static const pe_attr_def sgd_attrs[] = {
    {"regularization_method", PE_ATTR_STRING, false, 0, ""},
    {"regularization_coeff", PE_ATTR_FLOAT, false, 0, NULL},
    {NULL},
};

static const pe_slot_def momentum_in[] = {{"Param", 1, 1, 0},
                                          {"Grad", 1, 1, 0},
                                          {"Velocity", 1, 1, 0},
                                          {"LearningRate", 1, 1, 0},
                                          {"GradRows", 0, 1, PE_SLOT_NO_GRAD},
                                          {NULL}};
static const pe_slot_def momentum_out[] = {{"ParamOut", 1, 1, 0}, {"VelocityOut", 1, 1, 0}, {NULL}};
static const pe_attr_def momentum_attrs[] = {
    {"mu", PE_ATTR_FLOAT, false, 0.9, NULL},
    {"use_nesterov", PE_ATTR_BOOL, false, 0, NULL},
    {"regularization_method", PE_ATTR_STRING, false, 0, ""},
    {"regularization_coeff", PE_ATTR_FLOAT, false, 0, NULL},
    {NULL},
};

static const pe_slot_def adam_in[] = {{"Param", 1, 1, 0},
                                      {"Grad", 1, 1, 0},
                                      {"LearningRate", 1, 1, 0},
                                      {"Moment1", 1, 1, 0},
                                      {"Moment2", 1, 1, 0},
                                      {"Beta1Pow", 1, 1, 0},
                                      {"Beta2Pow", 1, 1, 0},
                                      {"GradRows", 0, 1, PE_SLOT_NO_GRAD},
                                      {NULL}};
static const pe_slot_def adam_out[] = {{"ParamOut", 1, 1, 0},    {"Moment1Out", 1, 1, 0},
                                       {"Moment2Out", 1, 1, 0},  {"Beta1PowOut", 1, 1, 0},
                                       {"Beta2PowOut", 1, 1, 0}, {NULL}};
static const pe_attr_def adam_attrs[] = {
    {"beta1", PE_ATTR_FLOAT, false, 0.9, NULL},
    {"beta2", PE_ATTR_FLOAT, false, 0.999, NULL},
    {"epsilon", PE_ATTR_FLOAT, false, 1e-8, NULL},
    {"lazy_mode", PE_ATTR_BOOL, false, 0, NULL},
    {"regularization_method", PE_ATTR_STRING, false, 0, ""},
    {"regularization_coeff", PE_ATTR_FLOAT, false, 0, NULL},
    {NULL},
};

const pe_op_def pe_ops_optimizer[] = {
    {.type = "sgd",
     .inputs = sgd_in,
     .outputs = sgd_out,
     .attrs = sgd_attrs,
     .flags = PE_OP_OPTIMIZER | PE_OP_NO_GRAD | PE_OP_ELEMENTWISE,
     .infer = sgd_infer,
     .kernel_cpu = sgd_kernel},
    {.type = "momentum",
     .inputs = momentum_in,
     .outputs = momentum_out,
     .attrs = momentum_attrs,
     .flags = PE_OP_OPTIMIZER | PE_OP_NO_GRAD | PE_OP_ELEMENTWISE,
     .infer = momentum_infer,
     .kernel_cpu = momentum_kernel},
    {.type = "adam",
     .inputs = adam_in,
     .outputs = adam_out,
     .attrs = adam_attrs,
     .flags = PE_OP_OPTIMIZER | PE_OP_NO_GRAD | PE_OP_ELEMENTWISE,
     .infer = adam_infer,
     .kernel_cpu = adam_kernel},
    {0},
};
