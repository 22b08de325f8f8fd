/* Program builder (see pe_builder.h). The program is kept in small local
 * structs while it grows and is converted to protobuf-c messages only in
 * pe_builder_finish; the messages borrow every string from the builder, so
 * finishing allocates nothing but the pointer arrays and the output. */
#include "pe_builder.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "program.pb-c.h"

#define B_MAX_DIMS 8
#define B_MAX_SLOTS 6
#define B_MAX_ATTRS 10
#define B_NAME_LEN 256

typedef struct b_attr {
  char *name;
  Pe__AttrType type;
  int64_t i; /* INT, LONG, BOOL */
  float f;
  char *s;
  int n;
  int64_t *ints;
} b_attr;

typedef struct b_slot {
  char *name;
  char *arg; /* the builder binds exactly one variable per slot */
} b_slot;

typedef struct b_op {
  char *type;
  int n_in, n_out, n_attr;
  b_slot in[B_MAX_SLOTS], out[B_MAX_SLOTS];
  b_attr attrs[B_MAX_ATTRS];
} b_op;

typedef struct b_var {
  char *name;
  int dtype;
  int ndim;
  int64_t d[B_MAX_DIMS];
  bool persistable, stop_gradient, is_feed;
} b_var;

typedef struct b_block {
  int n_vars, cap_vars;
  b_var **vars;
  int n_ops, cap_ops;
  b_op **ops;
} b_block;

typedef struct b_counter {
  const char *kind; /* static string */
  int n;
} b_counter;

struct pe_builder {
  b_block main, startup;
  char *err; /* first error, sticky */
  char *loss;
  char *opt_type; /* NULL: no optimizer */
  float lr, mu, beta1, beta2, eps;
  bool nesterov;
  b_counter counters[16];
  int n_counters;
};

/* --- errors and memory ------------------------------------------------------ */

static char oom_msg[] = "builder: out of memory";

static void fail(pe_builder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(pe_builder *b, const char *fmt, ...) {
  if (b->err) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  b->err = strdup(buf);
  if (!b->err) b->err = oom_msg;
}

static void *xcalloc(pe_builder *b, size_t n, size_t sz) {
  void *p = calloc(n ? n : 1, sz);
  if (!p) fail(b, "%s", oom_msg);
  return p;
}

static char *xstrdup(pe_builder *b, const char *s) {
  char *p = strdup(s);
  if (!p) fail(b, "%s", oom_msg);
  return p;
}

/* Grow *arr (of pointers) to hold one more. */
static bool grow(pe_builder *b, void ***arr, int n, int *cap) {
  if (n < *cap) return true;
  int nc = *cap ? *cap * 2 : 16;
  void **p = realloc(*arr, (size_t)nc * sizeof *p);
  if (!p) {
    fail(b, "%s", oom_msg);
    return false;
  }
  *arr = p;
  *cap = nc;
  return true;
}

static void op_free(b_op *op) {
  free(op->type);
  for (int i = 0; i < op->n_in; i++) free(op->in[i].name), free(op->in[i].arg);
  for (int i = 0; i < op->n_out; i++) free(op->out[i].name), free(op->out[i].arg);
  for (int i = 0; i < op->n_attr; i++) {
    free(op->attrs[i].name);
    free(op->attrs[i].s);
    free(op->attrs[i].ints);
  }
  free(op);
}

static void block_free(b_block *blk) {
  for (int i = 0; i < blk->n_vars; i++) free(blk->vars[i]->name), free(blk->vars[i]);
  for (int i = 0; i < blk->n_ops; i++) op_free(blk->ops[i]);
  free(blk->vars);
  free(blk->ops);
}

pe_builder *pe_builder_new(void) { return calloc(1, sizeof(pe_builder)); }

void pe_builder_free(pe_builder *b) {
  if (!b) return;
  block_free(&b->main);
  block_free(&b->startup);
  if (b->err != oom_msg) free(b->err);
  free(b->loss);
  free(b->opt_type);
  free(b);
}

const char *pe_builder_error(const pe_builder *b) { return b ? b->err : "builder is NULL"; }

/* --- variables ---------------------------------------------------------------- */

static b_var *var_find(const b_block *blk, const char *name) {
  for (int i = 0; i < blk->n_vars; i++)
    if (strcmp(blk->vars[i]->name, name) == 0) return blk->vars[i];
  return NULL;
}

static b_var *var_add(pe_builder *b, b_block *blk, const char *name, int dt, int ndim,
                      const int64_t *d) {
  if (b->err) return NULL;
  if (var_find(blk, name)) {
    fail(b, "variable '%s' declared twice (layer name reused?)", name);
    return NULL;
  }
  if (ndim < 1 || ndim > B_MAX_DIMS) {
    fail(b, "variable '%s': %d dims (1..%d allowed)", name, ndim, B_MAX_DIMS);
    return NULL;
  }
  if (!grow(b, (void ***)&blk->vars, blk->n_vars, &blk->cap_vars)) return NULL;
  b_var *v = xcalloc(b, 1, sizeof *v);
  if (!v) return NULL;
  v->name = xstrdup(b, name);
  if (!v->name) {
    free(v);
    return NULL;
  }
  v->dtype = dt;
  v->ndim = ndim;
  memcpy(v->d, d, (size_t)ndim * sizeof *d);
  blk->vars[blk->n_vars++] = v;
  return v;
}

/* An input of a layer: must be a main-block variable. */
static b_var *need(pe_builder *b, const char *layer, const char *x) {
  if (b->err) return NULL;
  if (!x) {
    fail(b, "%s: input is NULL", layer);
    return NULL;
  }
  b_var *v = var_find(&b->main, x);
  if (!v) fail(b, "%s: input '%s' is not a variable of the main block", layer, x);
  return v;
}

static const char *shape_str(const b_var *v, char *buf, size_t len) {
  size_t o = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < v->ndim && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? "," : "", (long long)v->d[i]);
  if (o < len) snprintf(buf + o, len - o, "]");
  return buf;
}

/* Product of d[from..to); -1 if any is unknown. */
static int64_t prod(const int64_t *d, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; i++) {
    if (d[i] < 0) return -1;
    p *= d[i];
  }
  return p;
}

/* --- ops ------------------------------------------------------------------------ */

static b_op *op_add(pe_builder *b, b_block *blk, const char *type) {
  if (b->err) return NULL;
  if (!grow(b, (void ***)&blk->ops, blk->n_ops, &blk->cap_ops)) return NULL;
  b_op *op = xcalloc(b, 1, sizeof *op);
  if (!op) return NULL;
  op->type = xstrdup(b, type);
  blk->ops[blk->n_ops++] = op;
  return op;
}

static void slot_set(pe_builder *b, b_slot *slots, int *n, const char *name, const char *arg) {
  if (b->err) return;
  if (*n == B_MAX_SLOTS) {
    fail(b, "builder: too many slots on one op");
    return;
  }
  slots[*n].name = xstrdup(b, name);
  slots[*n].arg = xstrdup(b, arg);
  (*n)++;
}

static void op_in(pe_builder *b, b_op *op, const char *slot, const char *arg) {
  if (op) slot_set(b, op->in, &op->n_in, slot, arg);
}

static void op_out(pe_builder *b, b_op *op, const char *slot, const char *arg) {
  if (op) slot_set(b, op->out, &op->n_out, slot, arg);
}

static b_attr *attr_new(pe_builder *b, b_op *op, const char *name, Pe__AttrType t) {
  if (b->err || !op) return NULL;
  if (op->n_attr == B_MAX_ATTRS) {
    fail(b, "builder: too many attributes on one op");
    return NULL;
  }
  b_attr *a = &op->attrs[op->n_attr++];
  a->name = xstrdup(b, name);
  a->type = t;
  return a;
}

static void attr_int(pe_builder *b, b_op *op, const char *name, int64_t v) {
  b_attr *a = attr_new(b, op, name, PE__ATTR_TYPE__INT);
  if (a) a->i = v;
}

static void attr_float(pe_builder *b, b_op *op, const char *name, float v) {
  b_attr *a = attr_new(b, op, name, PE__ATTR_TYPE__FLOAT);
  if (a) a->f = v;
}

static void attr_bool(pe_builder *b, b_op *op, const char *name, bool v) {
  b_attr *a = attr_new(b, op, name, PE__ATTR_TYPE__BOOL);
  if (a) a->i = v;
}

static void attr_str(pe_builder *b, b_op *op, const char *name, const char *v) {
  b_attr *a = attr_new(b, op, name, PE__ATTR_TYPE__STRING);
  if (a) a->s = xstrdup(b, v);
}

static void attr_ints(pe_builder *b, b_op *op, const char *name, int n, const int64_t *v) {
  b_attr *a = attr_new(b, op, name, PE__ATTR_TYPE__INTS);
  if (!a) return;
  a->ints = xcalloc(b, (size_t)n, sizeof *v);
  if (!a->ints) return;
  memcpy(a->ints, v, (size_t)n * sizeof *v);
  a->n = n;
}

/* --- naming ----------------------------------------------------------------------- */

/* Layer name into buf: the user's, or "<kind>_<k>". */
static bool layer_name(pe_builder *b, const char *kind, const char *user, char *buf) {
  if (b->err) return false;
  if (user) {
    if (!*user || strlen(user) > B_NAME_LEN - 32 || strchr(user, '@')) {
      fail(b, "%s: bad layer name '%s' (empty, too long or containing '@')", kind, user);
      return false;
    }
    snprintf(buf, B_NAME_LEN, "%s", user);
    return true;
  }
  b_counter *c = NULL;
  for (int i = 0; i < b->n_counters; i++)
    if (strcmp(b->counters[i].kind, kind) == 0) c = &b->counters[i];
  if (!c) {
    if (b->n_counters == (int)(sizeof b->counters / sizeof b->counters[0])) {
      fail(b, "builder: too many layer kinds");
      return false;
    }
    c = &b->counters[b->n_counters++];
    c->kind = kind;
    c->n = 0;
  }
  snprintf(buf, B_NAME_LEN, "%s_%d", kind, c->n++);
  return true;
}

/* "<layer>.<suffix>" into buf. */
static const char *vname(char *buf, const char *layer, const char *suffix) {
  /* layer names are at most B_NAME_LEN - 32 long (layer_name), so this fits */
  if (snprintf(buf, B_NAME_LEN, "%s.%s", layer, suffix) >= B_NAME_LEN) buf[0] = '\0';
  return buf;
}

/* A temporary of a main-block op: f32, not persistable. */
static b_var *tmp_var(pe_builder *b, const char *name, int dt, int ndim, const int64_t *d) {
  return var_add(b, &b->main, name, dt, ndim, d);
}

/* --- parameters and their initialisers ------------------------------------------------ */

static void init_op(pe_builder *b, const char *name, int ndim, const int64_t *d,
                    pe_b_init init, double fan_in, double fan_out) {
  b_op *op;
  double lim;
  switch (init.kind) {
    case PE_B_INIT_XAVIER:
    case PE_B_INIT_KAIMING:
      lim = init.kind == PE_B_INIT_XAVIER ? sqrt(6.0 / (fan_in + fan_out)) : sqrt(6.0 / fan_in);
      init.a = (float)-lim;
      init.b = (float)lim;
      /* fall through */
    case PE_B_INIT_UNIFORM:
      if (!(init.a <= init.b)) {
        fail(b, "%s: uniform initialiser with min %g > max %g", name, init.a, init.b);
        return;
      }
      op = op_add(b, &b->startup, "uniform_random");
      attr_float(b, op, "min", init.a);
      attr_float(b, op, "max", init.b);
      break;
    case PE_B_INIT_NORMAL:
      if (!(init.b >= 0)) {
        fail(b, "%s: normal initialiser with std %g < 0", name, init.b);
        return;
      }
      op = op_add(b, &b->startup, "gaussian_random");
      attr_float(b, op, "mean", init.a);
      attr_float(b, op, "std", init.b);
      break;
    case PE_B_INIT_CONSTANT:
      op = op_add(b, &b->startup, "fill_constant");
      attr_float(b, op, "value", init.a);
      break;
    default:
      fail(b, "%s: unknown initialiser kind %d", name, (int)init.kind);
      return;
  }
  op_out(b, op, "Out", name);
  attr_ints(b, op, "shape", ndim, d);
  attr_int(b, op, "dtype", PE_B_F32);
  if (init.kind != PE_B_INIT_CONSTANT) attr_int(b, op, "seed", init.seed);
}

/* A persistable f32 parameter, declared in both blocks, initialised in the
 * startup block. `trainable` false sets stop_gradient (running statistics). */
static bool param_add(pe_builder *b, const char *name, int ndim, const int64_t *d, pe_b_init init,
                      double fan_in, double fan_out, bool trainable) {
  b_var *m = var_add(b, &b->main, name, PE_B_F32, ndim, d);
  b_var *s = var_add(b, &b->startup, name, PE_B_F32, ndim, d);
  if (!m || !s) return false;
  m->persistable = s->persistable = true;
  m->stop_gradient = s->stop_gradient = !trainable;
  init_op(b, name, ndim, d, init, fan_in, fan_out);
  return !b->err;
}

static pe_b_init init_or(pe_b_init i, pe_b_init_kind dflt) {
  if (i.kind == PE_B_INIT_DEFAULT) {
    pe_b_init d = {dflt, 0, 0, i.seed};
    return d;
  }
  return i;
}

/* --- public: data ------------------------------------------------------------------------- */

const char *pe_builder_data(pe_builder *b, const char *name, pe_b_dtype dt, int ndim,
                            const int64_t *dims) {
  if (!b || b->err) return NULL;
  if (!name || !*name || strchr(name, '@')) {
    fail(b, "data: bad name '%s'", name ? name : "(null)");
    return NULL;
  }
  if ((int)dt < PE_B_F32 || dt > PE_B_U8) {
    fail(b, "data '%s': bad dtype %d", name, (int)dt);
    return NULL;
  }
  for (int i = 0; i < ndim && dims; i++)
    if (dims[i] == 0 || dims[i] < -1) {
      fail(b, "data '%s': dim %d is %lld (positive or -1 expected)", name, i,
           (long long)dims[i]);
      return NULL;
    }
  if (!dims) ndim = 0;
  b_var *v = var_add(b, &b->main, name, dt, ndim, dims);
  if (!v) return NULL;
  v->is_feed = true;
  v->stop_gradient = true;
  return v->name;
}

/* --- public: layers --------------------------------------------------------------------- */

/* Apply act to `x` as the last op of layer `layer`; output named out. */
static const char *act_into(pe_builder *b, const char *x, pe_b_act act, const char *out) {
  static const char *const names[] = {NULL, "relu", "tanh", "sigmoid", "softmax"};
  if (b->err) return NULL;
  if ((int)act <= PE_B_ACT_NONE || act > PE_B_ACT_SOFTMAX) {
    fail(b, "activation: unknown kind %d", (int)act);
    return NULL;
  }
  b_var *xv = var_find(&b->main, x);
  b_var *o = tmp_var(b, out, xv->dtype, xv->ndim, xv->d);
  b_op *op = op_add(b, &b->main, names[act]);
  op_in(b, op, "X", x);
  op_out(b, op, "Out", out);
  if (act == PE_B_ACT_SOFTMAX) attr_int(b, op, "axis", -1);
  return b->err ? NULL : o->name;
}

/* Finish a layer whose pre-activation result is `pre` (named "<layer>.tmp_k"
 * when act is set, else already "<layer>.out"). */
static const char *finish_layer(pe_builder *b, const char *layer, const char *pre, pe_b_act act) {
  if (b->err) return NULL;
  if (act == PE_B_ACT_NONE) return var_find(&b->main, pre)->name;
  char buf[B_NAME_LEN];
  return act_into(b, pre, act, vname(buf, layer, "out"));
}

const char *pe_builder_fc(pe_builder *b, const char *x, int64_t size, const pe_b_fc_opts *o) {
  pe_b_fc_opts dflt = {0};
  if (!o) o = &dflt;
  if (!b) return NULL;
  b_var *xv = need(b, "fc", x);
  char layer[B_NAME_LEN], buf[B_NAME_LEN], wn[B_NAME_LEN], bn[B_NAME_LEN], mm[B_NAME_LEN];
  if (!xv || !layer_name(b, "fc", o->name, layer)) return NULL;
  int ncd = o->num_col_dims ? o->num_col_dims : 1;
  char sh[128];
  if (size <= 0) {
    fail(b, "fc '%s': size %lld (must be positive)", layer, (long long)size);
    return NULL;
  }
  if (ncd < 1 || ncd >= xv->ndim) {
    fail(b, "fc '%s': num_col_dims %d out of range for input '%s' %s", layer, ncd, x,
         shape_str(xv, sh, sizeof sh));
    return NULL;
  }
  int64_t k = prod(xv->d, ncd, xv->ndim);
  if (k <= 0) {
    fail(b, "fc '%s': input '%s' %s has unknown feature dims after num_col_dims %d", layer, x,
         shape_str(xv, sh, sizeof sh), ncd);
    return NULL;
  }
  int64_t od[B_MAX_DIMS];
  memcpy(od, xv->d, (size_t)ncd * sizeof *od);
  od[ncd] = size;
  bool last = o->no_bias && o->act == PE_B_ACT_NONE;
  vname(wn, layer, "w");
  vname(bn, layer, "b");
  vname(mm, layer, last ? "out" : "tmp_0");
  if (!param_add(b, wn, 2, (int64_t[]){k, size}, init_or(o->w_init, PE_B_INIT_XAVIER), (double)k,
                 (double)size, true))
    return NULL;
  tmp_var(b, mm, PE_B_F32, ncd + 1, od);
  b_op *op = op_add(b, &b->main, "matmul");
  op_in(b, op, "X", x);
  op_in(b, op, "Y", wn);
  op_out(b, op, "Out", mm);
  attr_int(b, op, "x_num_col_dims", ncd);
  attr_int(b, op, "y_num_col_dims", 1);
  const char *pre = mm;
  if (!o->no_bias) {
    if (!param_add(b, bn, 1, (int64_t[]){size}, init_or(o->b_init, PE_B_INIT_CONSTANT), 0, 0,
                   true))
      return NULL;
    vname(buf, layer, o->act == PE_B_ACT_NONE ? "out" : "tmp_1");
    tmp_var(b, buf, PE_B_F32, ncd + 1, od);
    op = op_add(b, &b->main, "elementwise_add");
    op_in(b, op, "X", mm);
    op_in(b, op, "Y", bn);
    op_out(b, op, "Out", buf);
    attr_int(b, op, "axis", ncd);
    pre = buf;
  }
  return finish_layer(b, layer, pre, o->act);
}

/* Output extent of a window op; -1 stays -1. */
static int64_t out_extent(int64_t in, int k, int pad, int stride, int dil) {
  if (in < 0) return -1;
  int64_t eff = (int64_t)dil * (k - 1) + 1;
  int64_t span = in + 2 * (int64_t)pad - eff;
  return span < 0 ? 0 : span / stride + 1;
}

const char *pe_builder_conv2d(pe_builder *b, const char *x, int64_t out_channels, int kh, int kw,
                              const pe_b_conv_opts *o) {
  pe_b_conv_opts dflt = {0};
  if (!o) o = &dflt;
  if (!b) return NULL;
  b_var *xv = need(b, "conv2d", x);
  char layer[B_NAME_LEN], wn[B_NAME_LEN], bn[B_NAME_LEN], cv[B_NAME_LEN], buf[B_NAME_LEN];
  char sh[128];
  if (!xv || !layer_name(b, "conv2d", o->name, layer)) return NULL;
  int g = o->groups ? o->groups : 1;
  int s[2], dl[2];
  for (int i = 0; i < 2; i++) {
    s[i] = o->stride[i] ? o->stride[i] : 1;
    dl[i] = o->dilation[i] ? o->dilation[i] : 1;
  }
  if (xv->ndim != 4 || xv->d[1] <= 0) {
    fail(b, "conv2d '%s': input '%s' %s must be NCHW with known C", layer, x,
         shape_str(xv, sh, sizeof sh));
    return NULL;
  }
  int64_t c = xv->d[1];
  if (out_channels <= 0 || kh <= 0 || kw <= 0 || g <= 0 || s[0] <= 0 || s[1] <= 0 ||
      dl[0] <= 0 || dl[1] <= 0 || o->pad[0] < 0 || o->pad[1] < 0) {
    fail(b, "conv2d '%s': bad arguments (out_channels %lld, kernel %dx%d, groups %d, "
         "stride %d,%d, pad %d,%d, dilation %d,%d)", layer, (long long)out_channels, kh, kw,
         g, s[0], s[1], o->pad[0], o->pad[1], dl[0], dl[1]);
    return NULL;
  }
  if (c % g || out_channels % g) {
    fail(b, "conv2d '%s': groups %d must divide in channels %lld and out channels %lld",
         layer, g, (long long)c, (long long)out_channels);
    return NULL;
  }
  int64_t od[4] = {xv->d[0], out_channels, out_extent(xv->d[2], kh, o->pad[0], s[0], dl[0]),
                   out_extent(xv->d[3], kw, o->pad[1], s[1], dl[1])};
  if (od[2] == 0 || od[3] == 0) {
    fail(b, "conv2d '%s': kernel %dx%d does not fit input '%s' %s", layer, kh, kw, x,
         shape_str(xv, sh, sizeof sh));
    return NULL;
  }
  double fan_in = (double)(c / g) * kh * kw, fan_out = (double)out_channels * kh * kw;
  vname(wn, layer, "w");
  vname(bn, layer, "b");
  vname(cv, layer, o->no_bias && o->act == PE_B_ACT_NONE ? "out" : "tmp_0");
  if (!param_add(b, wn, 4, (int64_t[]){out_channels, c / g, kh, kw},
                 init_or(o->w_init, PE_B_INIT_KAIMING), fan_in, fan_out, true))
    return NULL;
  tmp_var(b, cv, PE_B_F32, 4, od);
  b_op *op = op_add(b, &b->main, "conv2d");
  op_in(b, op, "Input", x);
  op_in(b, op, "Filter", wn);
  op_out(b, op, "Output", cv);
  attr_ints(b, op, "strides", 2, (int64_t[]){s[0], s[1]});
  attr_ints(b, op, "paddings", 2, (int64_t[]){o->pad[0], o->pad[1]});
  attr_ints(b, op, "dilations", 2, (int64_t[]){dl[0], dl[1]});
  attr_int(b, op, "groups", g);
  const char *pre = cv;
  if (!o->no_bias) {
    if (!param_add(b, bn, 1, (int64_t[]){out_channels}, init_or(o->b_init, PE_B_INIT_CONSTANT),
                   0, 0, true))
      return NULL;
    vname(buf, layer, o->act == PE_B_ACT_NONE ? "out" : "tmp_1");
    tmp_var(b, buf, PE_B_F32, 4, od);
    op = op_add(b, &b->main, "elementwise_add");
    op_in(b, op, "X", cv);
    op_in(b, op, "Y", bn);
    op_out(b, op, "Out", buf);
    attr_int(b, op, "axis", 1);
    pre = buf;
  }
  return finish_layer(b, layer, pre, o->act);
}

const char *pe_builder_pool2d(pe_builder *b, const char *x, int kh, int kw,
                              const pe_b_pool_opts *o) {
  pe_b_pool_opts dflt = {0};
  if (!o) o = &dflt;
  if (!b) return NULL;
  b_var *xv = need(b, "pool2d", x);
  char layer[B_NAME_LEN], buf[B_NAME_LEN], sh[128];
  if (!xv || !layer_name(b, "pool2d", o->name, layer)) return NULL;
  if (xv->ndim != 4) {
    fail(b, "pool2d '%s': input '%s' %s must be NCHW", layer, x, shape_str(xv, sh, sizeof sh));
    return NULL;
  }
  if (o->global) { /* the kernel covers the whole map; ksize is still required */
    kh = kh > 0 ? kh : (xv->d[2] > 0 ? (int)xv->d[2] : 1);
    kw = kw > 0 ? kw : (xv->d[3] > 0 ? (int)xv->d[3] : 1);
  }
  int s[2] = {o->stride[0] ? o->stride[0] : kh, o->stride[1] ? o->stride[1] : kw};
  if (kh <= 0 || kw <= 0 || s[0] <= 0 || s[1] <= 0 || o->pad[0] < 0 || o->pad[1] < 0) {
    fail(b, "pool2d '%s': bad arguments (kernel %dx%d, stride %d,%d, pad %d,%d)", layer, kh, kw,
         s[0], s[1], o->pad[0], o->pad[1]);
    return NULL;
  }
  int64_t od[4] = {xv->d[0], xv->d[1], 1, 1};
  if (!o->global) {
    od[2] = out_extent(xv->d[2], kh, o->pad[0], s[0], 1);
    od[3] = out_extent(xv->d[3], kw, o->pad[1], s[1], 1);
    if (od[2] == 0 || od[3] == 0) {
      fail(b, "pool2d '%s': kernel %dx%d does not fit input '%s' %s", layer, kh, kw, x,
           shape_str(xv, sh, sizeof sh));
      return NULL;
    }
  }
  b_var *out = tmp_var(b, vname(buf, layer, "out"), xv->dtype, 4, od);
  b_op *op = op_add(b, &b->main, "pool2d");
  op_in(b, op, "X", x);
  op_out(b, op, "Out", buf);
  attr_str(b, op, "pooling_type", o->avg ? "avg" : "max");
  attr_ints(b, op, "ksize", 2, (int64_t[]){kh, kw});
  attr_ints(b, op, "strides", 2, (int64_t[]){s[0], s[1]});
  attr_ints(b, op, "paddings", 2, (int64_t[]){o->pad[0], o->pad[1]});
  attr_bool(b, op, "global_pooling", o->global);
  attr_bool(b, op, "exclusive", !o->inclusive);
  return b->err ? NULL : out->name;
}

const char *pe_builder_batch_norm(pe_builder *b, const char *x, const pe_b_bn_opts *o) {
  pe_b_bn_opts dflt = {0};
  if (!o) o = &dflt;
  if (!b) return NULL;
  b_var *xv = need(b, "batch_norm", x);
  char layer[B_NAME_LEN], sh[128];
  char sc[B_NAME_LEN], bi[B_NAME_LEN], mn[B_NAME_LEN], vr[B_NAME_LEN], sm[B_NAME_LEN],
      sv[B_NAME_LEN], y[B_NAME_LEN];
  if (!xv || !layer_name(b, "batch_norm", o->name, layer)) return NULL;
  if (xv->ndim < 2 || xv->d[1] <= 0) {
    fail(b, "batch_norm '%s': input '%s' %s needs a known channel dim 1", layer, x,
         shape_str(xv, sh, sizeof sh));
    return NULL;
  }
  float mom = o->momentum ? o->momentum : 0.9f, eps = o->epsilon ? o->epsilon : 1e-5f;
  if (!(mom >= 0 && mom <= 1) || !(eps > 0)) {
    fail(b, "batch_norm '%s': momentum %g must be in [0,1], epsilon %g positive", layer, mom,
         eps);
    return NULL;
  }
  int64_t c[1] = {xv->d[1]};
  pe_b_init one = {PE_B_INIT_CONSTANT, 1, 0, 0}, zero = {PE_B_INIT_CONSTANT, 0, 0, 0};
  param_add(b, vname(sc, layer, "scale"), 1, c, one, 0, 0, true);
  param_add(b, vname(bi, layer, "bias"), 1, c, zero, 0, 0, true);
  param_add(b, vname(mn, layer, "mean"), 1, c, zero, 0, 0, false);
  param_add(b, vname(vr, layer, "variance"), 1, c, one, 0, 0, false);
  b_var *v1 = tmp_var(b, vname(sm, layer, "saved_mean"), PE_B_F32, 1, c);
  b_var *v2 = tmp_var(b, vname(sv, layer, "saved_variance"), PE_B_F32, 1, c);
  if (b->err) return NULL;
  v1->stop_gradient = v2->stop_gradient = true;
  vname(y, layer, o->act == PE_B_ACT_NONE ? "out" : "tmp_0");
  tmp_var(b, y, xv->dtype, xv->ndim, xv->d);
  b_op *op = op_add(b, &b->main, "batch_norm");
  op_in(b, op, "X", x);
  op_in(b, op, "Scale", sc);
  op_in(b, op, "Bias", bi);
  op_in(b, op, "Mean", mn);
  op_in(b, op, "Variance", vr);
  op_out(b, op, "Y", y);
  op_out(b, op, "MeanOut", mn);
  op_out(b, op, "VarianceOut", vr);
  op_out(b, op, "SavedMean", sm);
  op_out(b, op, "SavedVariance", sv);
  attr_float(b, op, "momentum", mom);
  attr_float(b, op, "epsilon", eps);
  attr_bool(b, op, "is_test", false);
  return finish_layer(b, layer, y, o->act);
}

const char *pe_builder_dropout(pe_builder *b, const char *x, float prob, int64_t seed,
                               const char *name) {
  if (!b) return NULL;
  b_var *xv = need(b, "dropout", x);
  char layer[B_NAME_LEN], out[B_NAME_LEN], mask[B_NAME_LEN];
  if (!xv || !layer_name(b, "dropout", name, layer)) return NULL;
  if (!(prob >= 0 && prob < 1)) {
    fail(b, "dropout '%s': probability %g not in [0, 1)", layer, prob);
    return NULL;
  }
  b_var *ov = tmp_var(b, vname(out, layer, "out"), xv->dtype, xv->ndim, xv->d);
  b_var *mv = tmp_var(b, vname(mask, layer, "mask"), PE_B_U8, xv->ndim, xv->d);
  if (b->err) return NULL;
  mv->stop_gradient = true;
  b_op *op = op_add(b, &b->main, "dropout");
  op_in(b, op, "X", x);
  op_out(b, op, "Out", out);
  op_out(b, op, "Mask", mask);
  attr_float(b, op, "dropout_prob", prob);
  attr_bool(b, op, "is_test", false);
  attr_int(b, op, "seed", seed);
  attr_str(b, op, "dropout_implementation", "upscale_in_train");
  return b->err ? NULL : ov->name;
}

const char *pe_builder_act(pe_builder *b, const char *x, pe_b_act act) {
  static const char *const kinds[] = {"act", "relu", "tanh", "sigmoid", "softmax"};
  if (!b) return NULL;
  if ((int)act <= PE_B_ACT_NONE || act > PE_B_ACT_SOFTMAX) {
    fail(b, "activation: unknown kind %d", (int)act);
    return NULL;
  }
  char layer[B_NAME_LEN], out[B_NAME_LEN];
  if (!need(b, kinds[act], x) || !layer_name(b, kinds[act], NULL, layer)) return NULL;
  return act_into(b, x, act, vname(out, layer, "out"));
}

const char *pe_builder_relu(pe_builder *b, const char *x) { return pe_builder_act(b, x, PE_B_ACT_RELU); }
const char *pe_builder_tanh(pe_builder *b, const char *x) { return pe_builder_act(b, x, PE_B_ACT_TANH); }
const char *pe_builder_sigmoid(pe_builder *b, const char *x) {
  return pe_builder_act(b, x, PE_B_ACT_SIGMOID);
}
const char *pe_builder_softmax(pe_builder *b, const char *x) {
  return pe_builder_act(b, x, PE_B_ACT_SOFTMAX);
}

const char *pe_builder_flatten(pe_builder *b, const char *x, int axis) {
  if (!b) return NULL;
  b_var *xv = need(b, "flatten", x);
  char layer[B_NAME_LEN], out[B_NAME_LEN], sh[128];
  if (!xv || !layer_name(b, "flatten", NULL, layer)) return NULL;
  if (axis < 0 || axis > xv->ndim) {
    fail(b, "flatten '%s': axis %d out of range for '%s' %s", layer, axis, x,
         shape_str(xv, sh, sizeof sh));
    return NULL;
  }
  int64_t od[2] = {prod(xv->d, 0, axis), prod(xv->d, axis, xv->ndim)};
  b_var *ov = tmp_var(b, vname(out, layer, "out"), xv->dtype, 2, od);
  b_op *op = op_add(b, &b->main, "flatten");
  op_in(b, op, "X", x);
  op_out(b, op, "Out", out);
  attr_int(b, op, "axis", axis);
  return b->err ? NULL : ov->name;
}

/* --- losses and metrics ----------------------------------------------------------------------- */

/* Check a label against scores [.., C]; returns soft (f32) or hard (i64). */
static bool label_kind(pe_builder *b, const char *layer, const b_var *xv, const b_var *lv,
                       bool *soft) {
  char s1[128], s2[128];
  if (xv->ndim < 2 || xv->dtype != PE_B_F32) {
    fail(b, "%s: scores '%s' %s must be f32 with at least 2 dims", layer, xv->name,
         shape_str(xv, s1, sizeof s1));
    return false;
  }
  *soft = lv->dtype == PE_B_F32;
  if (lv->dtype != PE_B_I64 && !*soft) {
    fail(b, "%s: label '%s' must be i64 (hard) or f32 (soft)", layer, lv->name);
    return false;
  }
  bool ok = lv->ndim == xv->ndim;
  for (int i = 0; ok && i < xv->ndim - 1; i++)
    ok = lv->d[i] == xv->d[i] || lv->d[i] == -1 || xv->d[i] == -1;
  if (ok) ok = *soft ? lv->d[xv->ndim - 1] == xv->d[xv->ndim - 1] : lv->d[lv->ndim - 1] == 1;
  if (!ok)
    fail(b, "%s: label '%s' %s does not fit scores '%s' %s", layer, lv->name,
         shape_str(lv, s1, sizeof s1), xv->name, shape_str(xv, s2, sizeof s2));
  return ok;
}

const char *pe_builder_softmax_with_cross_entropy(pe_builder *b, const char *logits,
                                                  const char *label, const char **softmax_out) {
  if (!b) return NULL;
  const char *kind = "softmax_with_cross_entropy";
  b_var *xv = need(b, kind, logits), *lv = need(b, kind, label);
  char layer[B_NAME_LEN], sm[B_NAME_LEN], loss[B_NAME_LEN];
  bool soft;
  if (!xv || !lv || !layer_name(b, kind, NULL, layer) || !label_kind(b, layer, xv, lv, &soft))
    return NULL;
  int64_t ld[B_MAX_DIMS];
  memcpy(ld, xv->d, (size_t)xv->ndim * sizeof *ld);
  ld[xv->ndim - 1] = 1;
  b_var *smv = tmp_var(b, vname(sm, layer, "softmax"), PE_B_F32, xv->ndim, xv->d);
  b_var *lossv = tmp_var(b, vname(loss, layer, "out"), PE_B_F32, xv->ndim, ld);
  b_op *op = op_add(b, &b->main, kind);
  op_in(b, op, "Logits", logits);
  op_in(b, op, "Label", label);
  op_out(b, op, "Softmax", sm);
  op_out(b, op, "Loss", loss);
  attr_bool(b, op, "soft_label", soft);
  attr_int(b, op, "axis", -1);
  if (b->err) return NULL;
  if (softmax_out) *softmax_out = smv->name;
  return lossv->name;
}

const char *pe_builder_cross_entropy(pe_builder *b, const char *x, const char *label) {
  if (!b) return NULL;
  b_var *xv = need(b, "cross_entropy", x), *lv = need(b, "cross_entropy", label);
  char layer[B_NAME_LEN], out[B_NAME_LEN];
  bool soft;
  if (!xv || !lv || !layer_name(b, "cross_entropy", NULL, layer) ||
      !label_kind(b, layer, xv, lv, &soft))
    return NULL;
  int64_t yd[B_MAX_DIMS];
  memcpy(yd, xv->d, (size_t)xv->ndim * sizeof *yd);
  yd[xv->ndim - 1] = 1;
  b_var *yv = tmp_var(b, vname(out, layer, "out"), PE_B_F32, xv->ndim, yd);
  b_op *op = op_add(b, &b->main, "cross_entropy");
  op_in(b, op, "X", x);
  op_in(b, op, "Label", label);
  op_out(b, op, "Y", out);
  attr_bool(b, op, "soft_label", soft);
  return b->err ? NULL : yv->name;
}

const char *pe_builder_mean(pe_builder *b, const char *x) {
  if (!b) return NULL;
  b_var *xv = need(b, "mean", x);
  char layer[B_NAME_LEN], out[B_NAME_LEN];
  if (!xv || !layer_name(b, "mean", NULL, layer)) return NULL;
  b_var *ov = tmp_var(b, vname(out, layer, "out"), xv->dtype, 1, (int64_t[]){1});
  b_op *op = op_add(b, &b->main, "mean");
  op_in(b, op, "X", x);
  op_out(b, op, "Out", out);
  return b->err ? NULL : ov->name;
}

const char *pe_builder_accuracy(pe_builder *b, const char *x, const char *label, int k) {
  if (!b) return NULL;
  b_var *xv = need(b, "accuracy", x), *lv = need(b, "accuracy", label);
  char layer[B_NAME_LEN], acc[B_NAME_LEN], cor[B_NAME_LEN], tot[B_NAME_LEN];
  bool soft;
  if (!xv || !lv || !layer_name(b, "accuracy", NULL, layer) ||
      !label_kind(b, layer, xv, lv, &soft))
    return NULL;
  if (soft || xv->ndim != 2) {
    fail(b, "accuracy '%s': needs scores [N,C] and an i64 [N,1] label", layer);
    return NULL;
  }
  if (k < 1 || (xv->d[1] > 0 && k > xv->d[1])) {
    fail(b, "accuracy '%s': k %d out of range for %lld classes", layer, k,
         (long long)xv->d[1]);
    return NULL;
  }
  const int64_t one[1] = {1};
  b_var *av = tmp_var(b, vname(acc, layer, "out"), PE_B_F32, 1, one);
  b_var *cv = tmp_var(b, vname(cor, layer, "correct"), PE_B_I64, 1, one);
  b_var *tv = tmp_var(b, vname(tot, layer, "total"), PE_B_I64, 1, one);
  if (b->err) return NULL;
  av->stop_gradient = cv->stop_gradient = tv->stop_gradient = true;
  b_op *op = op_add(b, &b->main, "accuracy");
  op_in(b, op, "X", x);
  op_in(b, op, "Label", label);
  op_out(b, op, "Accuracy", acc);
  op_out(b, op, "Correct", cor);
  op_out(b, op, "Total", tot);
  attr_int(b, op, "k", k);
  return b->err ? NULL : av->name;
}

/* --- training intent ------------------------------------------------------------------------------ */

int pe_builder_append_backward(pe_builder *b, const char *loss) {
  if (!b || b->err) return -1;
  b_var *lv = need(b, "append_backward", loss);
  if (!lv) return -1;
  if (lv->dtype != PE_B_F32 || prod(lv->d, 0, lv->ndim) != 1) {
    char sh[128];
    fail(b, "append_backward: loss '%s' %s must be an f32 scalar [1]", loss,
         shape_str(lv, sh, sizeof sh));
    return -1;
  }
  char *s = xstrdup(b, loss);
  if (!s) return -1;
  free(b->loss);
  b->loss = s;
  return 0;
}

static int set_opt(pe_builder *b, const char *type, float lr) {
  if (!b || b->err) return -1;
  if (!(lr > 0) || !isfinite(lr)) {
    fail(b, "%s: learning rate %g must be positive", type, lr);
    return -1;
  }
  char *s = xstrdup(b, type);
  if (!s) return -1;
  free(b->opt_type);
  b->opt_type = s;
  b->lr = lr;
  b->mu = b->beta1 = b->beta2 = b->eps = 0;
  b->nesterov = false;
  return 0;
}

int pe_builder_sgd(pe_builder *b, float lr) { return set_opt(b, "sgd", lr); }

int pe_builder_momentum(pe_builder *b, float lr, float mu, bool nesterov) {
  if (b && !b->err && !(mu >= 0 && mu < 1)) {
    fail(b, "momentum: mu %g not in [0, 1)", mu);
    return -1;
  }
  if (set_opt(b, "momentum", lr)) return -1;
  b->mu = mu;
  b->nesterov = nesterov;
  return 0;
}

int pe_builder_adam(pe_builder *b, float lr, float beta1, float beta2, float epsilon) {
  if (b && !b->err && !(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1 && epsilon > 0)) {
    fail(b, "adam: beta1 %g, beta2 %g must be in [0, 1) and epsilon %g positive", beta1, beta2,
         epsilon);
    return -1;
  }
  if (set_opt(b, "adam", lr)) return -1;
  b->beta1 = beta1;
  b->beta2 = beta2;
  b->eps = epsilon;
  return 0;
}

/* --- serialisation ----------------------------------------------------------------------------------- */

/* Protobuf views of one block. Pointer arrays are owned here; strings and
 * number arrays are borrowed from the builder. */
typedef struct pb_block {
  Pe__BlockDesc blk;
  Pe__VarDesc *vars;
  Pe__VarDesc **var_ptrs;
  Pe__OpDesc *ops;
  Pe__OpDesc **op_ptrs;
  Pe__OpSlot *slots;     /* all slots of all ops */
  Pe__OpSlot **slot_ptrs;
  Pe__Attr *attrs;
  Pe__Attr **attr_ptrs;
} pb_block;

static void pb_block_free(pb_block *p) {
  free(p->vars), free(p->var_ptrs), free(p->ops), free(p->op_ptrs);
  free(p->slots), free(p->slot_ptrs), free(p->attrs), free(p->attr_ptrs);
}

static bool pb_block_make(pe_builder *b, const b_block *src, int idx, pb_block *p) {
  size_t ns = 0, na = 0;
  for (int i = 0; i < src->n_ops; i++) {
    ns += (size_t)(src->ops[i]->n_in + src->ops[i]->n_out);
    na += (size_t)src->ops[i]->n_attr;
  }
  p->vars = xcalloc(b, (size_t)src->n_vars, sizeof *p->vars);
  p->var_ptrs = xcalloc(b, (size_t)src->n_vars, sizeof *p->var_ptrs);
  p->ops = xcalloc(b, (size_t)src->n_ops, sizeof *p->ops);
  p->op_ptrs = xcalloc(b, (size_t)src->n_ops, sizeof *p->op_ptrs);
  p->slots = xcalloc(b, ns, sizeof *p->slots);
  p->slot_ptrs = xcalloc(b, ns, sizeof *p->slot_ptrs);
  p->attrs = xcalloc(b, na, sizeof *p->attrs);
  p->attr_ptrs = xcalloc(b, na, sizeof *p->attr_ptrs);
  if (b->err) return false;
  pe__block_desc__init(&p->blk);
  p->blk.idx = idx;
  p->blk.parent_idx = -1;
  for (int i = 0; i < src->n_vars; i++) {
    const b_var *v = src->vars[i];
    Pe__VarDesc *d = &p->vars[i];
    pe__var_desc__init(d);
    d->name = v->name;
    d->dtype = (Pe__DataType)v->dtype;
    d->n_shape = (size_t)v->ndim;
    d->shape = (int64_t *)v->d;
    d->persistable = v->persistable;
    d->stop_gradient = v->stop_gradient;
    d->is_feed = v->is_feed;
    p->var_ptrs[i] = d;
  }
  p->blk.n_vars = (size_t)src->n_vars;
  p->blk.vars = p->var_ptrs;
  size_t si = 0, ai = 0;
  for (int i = 0; i < src->n_ops; i++) {
    const b_op *o = src->ops[i];
    Pe__OpDesc *d = &p->ops[i];
    pe__op_desc__init(d);
    d->type = o->type;
    d->inputs = &p->slot_ptrs[si];
    d->n_inputs = (size_t)o->n_in;
    for (int k = 0; k < o->n_in + o->n_out; k++, si++) {
      const b_slot *s = k < o->n_in ? &o->in[k] : &o->out[k - o->n_in];
      if (k == o->n_in) {
        d->outputs = &p->slot_ptrs[si];
        d->n_outputs = (size_t)o->n_out;
      }
      pe__op_slot__init(&p->slots[si]);
      p->slots[si].parameter = s->name;
      p->slots[si].n_arguments = 1;
      p->slots[si].arguments = (char **)&s->arg;
      p->slot_ptrs[si] = &p->slots[si];
    }
    d->attrs = &p->attr_ptrs[ai];
    d->n_attrs = (size_t)o->n_attr;
    for (int k = 0; k < o->n_attr; k++, ai++) {
      const b_attr *a = &o->attrs[k];
      Pe__Attr *pa = &p->attrs[ai];
      pe__attr__init(pa);
      pa->name = a->name;
      pa->type = a->type;
      switch (a->type) {
        case PE__ATTR_TYPE__BOOL: pa->b = a->i != 0; break;
        case PE__ATTR_TYPE__FLOAT: pa->f = a->f; break;
        case PE__ATTR_TYPE__STRING: pa->s = a->s; break;
        case PE__ATTR_TYPE__INTS:
          pa->n_ints = (size_t)a->n;
          pa->ints = a->ints;
          break;
        default: pa->i = a->i; break;
      }
      p->attr_ptrs[ai] = pa;
    }
    p->op_ptrs[i] = d;
  }
  p->blk.n_ops = (size_t)src->n_ops;
  p->blk.ops = p->op_ptrs;
  return true;
}

int pe_builder_finish(pe_builder *b, uint8_t **bytes, size_t *len) {
  if (!b || b->err) return -1;
  if (!bytes || !len) {
    fail(b, "finish: bytes and len must not be NULL");
    return -1;
  }
  if (b->opt_type && !b->loss) {
    fail(b, "finish: an optimizer (%s) is set but no loss (call pe_builder_append_backward)",
         b->opt_type);
    return -1;
  }
  pb_block blocks[2] = {0};
  Pe__BlockDesc *bp[2] = {&blocks[0].blk, &blocks[1].blk};
  int rc = -1;
  if (!pb_block_make(b, &b->main, 0, &blocks[0]) || !pb_block_make(b, &b->startup, 1, &blocks[1]))
    goto out;
  Pe__ProgramDesc prog = PE__PROGRAM_DESC__INIT;
  Pe__TrainSpec train = PE__TRAIN_SPEC__INIT;
  Pe__OptimizerDesc opt = PE__OPTIMIZER_DESC__INIT;
  prog.version = 1;
  prog.n_blocks = 2;
  prog.blocks = bp;
  prog.main_block = 0;
  prog.startup_block = 1;
  if (b->loss) {
    train.loss = b->loss;
    if (b->opt_type) {
      opt.type = b->opt_type;
      opt.learning_rate = b->lr;
      opt.momentum = b->mu;
      opt.nesterov = b->nesterov;
      opt.beta1 = b->beta1;
      opt.beta2 = b->beta2;
      opt.epsilon = b->eps;
      train.optimizer = &opt;
    }
    prog.train = &train;
  }
  size_t n = pe__program_desc__get_packed_size(&prog);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) {
    fail(b, "%s", oom_msg);
    goto out;
  }
  *len = pe__program_desc__pack(&prog, buf);
  *bytes = buf;
  rc = 0;
out:
  pb_block_free(&blocks[0]);
  pb_block_free(&blocks[1]);
  return rc;
}
