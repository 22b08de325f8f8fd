/* Program builder (see pe_builder.h). The program is kept in small local
 * structs while it grows and is converted to protobuf-c messages only in
 * pe_builder_finish; the messages borrow every string from the builder, so
 * finishing allocates nothing but the pointer arrays and the output. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builder_internal.h"

/* --- errors and memory ------------------------------------------------------ */

static char oom_msg[] = "builder: out of memory";

void peb_fail(pe_builder *b, const char *fmt, ...) {
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
  if (!p) peb_fail(b, "%s", oom_msg);
  return p;
}

static char *xstrdup(pe_builder *b, const char *s) {
  char *p = strdup(s);
  if (!p) peb_fail(b, "%s", oom_msg);
  return p;
}

/* Grow *arr (of pointers) to hold one more. */
static bool grow(pe_builder *b, void ***arr, int n, int *cap) {
  if (n < *cap) return true;
  int nc = *cap ? *cap * 2 : 16;
  void **p = realloc(*arr, (size_t)nc * sizeof *p);
  if (!p) {
    peb_fail(b, "%s", oom_msg);
    return false;
  }
  *arr = p;
  *cap = nc;
  return true;
}

static void slot_free(b_slot *s) {
  free(s->name);
  for (int k = 0; k < s->n; k++) free(s->args[k]);
  free(s->args);
}

static void op_free(b_op *op) {
  free(op->type);
  for (int i = 0; i < op->n_in; i++) slot_free(&op->in[i]);
  for (int i = 0; i < op->n_out; i++) slot_free(&op->out[i]);
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
  pe_strmap_destroy(&blk->var_index);
}

pe_builder *pe_builder_new(void) {
  return calloc(1, sizeof(pe_builder));
}

void pe_builder_free(pe_builder *b) {
  if (!b) return;
  block_free(&b->main);
  block_free(&b->startup);
  if (b->err != oom_msg) free(b->err);
  free(b->loss);
  free(b->opt_type);
  free(b);
}

const char *pe_builder_error(const pe_builder *b) {
  return b ? b->err : "builder is NULL";
}

/* --- variables ---------------------------------------------------------------- */

/* By the index: a scan of vars made building an n-layer program O(n^2). */
b_var *peb_var_find(const b_block *blk, const char *name) {
  return pe_strmap_get(&blk->var_index, name);
}

static b_var *var_add(pe_builder *b, b_block *blk, const char *name, int dt, int ndim,
                      const int64_t *d) {
  if (b->err) return NULL;
  if (peb_var_find(blk, name)) {
    peb_fail(b, "variable '%s' declared twice (layer name reused?)", name);
    return NULL;
  }
  if (ndim < 1 || ndim > B_MAX_DIMS) {
    peb_fail(b, "variable '%s': %d dims (1..%d allowed)", name, ndim, B_MAX_DIMS);
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
  if (!pe_strmap_put(&blk->var_index, name, v)) {
    peb_fail(b, "%s", oom_msg);
    free(v->name);
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
b_var *peb_need(pe_builder *b, const char *layer, const char *x) {
  if (b->err) return NULL;
  if (!x) {
    peb_fail(b, "%s: input is NULL", layer);
    return NULL;
  }
  b_var *v = peb_var_find(&b->main, x);
  if (!v) peb_fail(b, "%s: input '%s' is not a variable of the main block", layer, x);
  return v;
}

const char *peb_shape_str(const b_var *v, char *buf, size_t len) {
  size_t o = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < v->ndim && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? "," : "", (long long)v->d[i]);
  if (o < len) snprintf(buf + o, len - o, "]");
  return buf;
}

/* Product of d[from..to); -1 if any is unknown. */
int64_t peb_prod(const int64_t *d, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; i++) {
    if (d[i] < 0) return -1;
    p *= d[i];
  }
  return p;
}

/* --- ops ------------------------------------------------------------------------ */

b_op *peb_op_add(pe_builder *b, b_block *blk, const char *type) {
  if (b->err) return NULL;
  if (!grow(b, (void ***)&blk->ops, blk->n_ops, &blk->cap_ops)) return NULL;
  b_op *op = xcalloc(b, 1, sizeof *op);
  if (!op) return NULL;
  op->type = xstrdup(b, type);
  blk->ops[blk->n_ops++] = op;
  return op;
}

/* Slot `name` bound to args[0..na), appended to slots[*n]. The slot is
 * counted once allocated, so op_free releases what a later failure left. */
static void slot_set(pe_builder *b, b_slot *slots, int *n, const char *name, int na,
                     const char *const *args) {
  if (b->err) return;
  if (*n == B_MAX_SLOTS) {
    peb_fail(b, "builder: too many slots on one op");
    return;
  }
  b_slot *s = &slots[(*n)++];
  s->name = xstrdup(b, name);
  s->args = xcalloc(b, (size_t)na, sizeof *s->args);
  if (!s->args) return;
  for (int k = 0; k < na && !b->err; k++) s->args[s->n++] = xstrdup(b, args[k]);
}

void peb_op_in(pe_builder *b, b_op *op, const char *slot, const char *arg) {
  if (op) slot_set(b, op->in, &op->n_in, slot, 1, &arg);
}

void peb_op_out(pe_builder *b, b_op *op, const char *slot, const char *arg) {
  if (op) slot_set(b, op->out, &op->n_out, slot, 1, &arg);
}

void peb_op_in_n(pe_builder *b, b_op *op, const char *slot, int n, const char *const *args) {
  if (op) slot_set(b, op->in, &op->n_in, slot, n, args);
}

void peb_op_out_n(pe_builder *b, b_op *op, const char *slot, int n, const char *const *args) {
  if (op) slot_set(b, op->out, &op->n_out, slot, n, args);
}

static b_attr *attr_new(pe_builder *b, b_op *op, const char *name, Pe__AttrType t) {
  if (b->err || !op) return NULL;
  if (op->n_attr == B_MAX_ATTRS) {
    peb_fail(b, "builder: too many attributes on one op");
    return NULL;
  }
  b_attr *a = &op->attrs[op->n_attr++];
  a->name = xstrdup(b, name);
  a->type = t;
  return a;
}

void peb_attr_int(pe_builder *b, b_op *op, const char *name, int64_t v) {
  b_attr *a = attr_new(b, op, name, PE__ATTR_TYPE__INT);
  if (a) a->i = v;
}

void peb_attr_float(pe_builder *b, b_op *op, const char *name, float v) {
  b_attr *a = attr_new(b, op, name, PE__ATTR_TYPE__FLOAT);
  if (a) a->f = v;
}

void peb_attr_bool(pe_builder *b, b_op *op, const char *name, bool v) {
  b_attr *a = attr_new(b, op, name, PE__ATTR_TYPE__BOOL);
  if (a) a->i = v;
}

void peb_attr_str(pe_builder *b, b_op *op, const char *name, const char *v) {
  b_attr *a = attr_new(b, op, name, PE__ATTR_TYPE__STRING);
  if (a) a->s = xstrdup(b, v);
}

void peb_attr_ints(pe_builder *b, b_op *op, const char *name, int n, const int64_t *v) {
  b_attr *a = attr_new(b, op, name, PE__ATTR_TYPE__INTS);
  if (!a) return;
  a->ints = xcalloc(b, (size_t)n, sizeof *v);
  if (!a->ints) return;
  memcpy(a->ints, v, (size_t)n * sizeof *v);
  a->n = n;
}

/* --- naming ----------------------------------------------------------------------- */

/* Layer name into buf: the user's, or "<kind>_<k>". */
bool peb_layer_name(pe_builder *b, const char *kind, const char *user, char *buf) {
  if (b->err) return false;
  if (user) {
    if (!*user || strlen(user) > B_NAME_LEN - 32 || strchr(user, '@')) {
      peb_fail(b, "%s: bad layer name '%s' (empty, too long or containing '@')", kind, user);
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
      peb_fail(b, "builder: too many layer kinds");
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
const char *peb_vname(char *buf, const char *layer, const char *suffix) {
  /* layer names are at most B_NAME_LEN - 32 long (layer_name), so this fits */
  if (snprintf(buf, B_NAME_LEN, "%s.%s", layer, suffix) >= B_NAME_LEN) buf[0] = '\0';
  return buf;
}

/* A temporary of a main-block op: f32, not persistable. */
b_var *peb_tmp_var(pe_builder *b, const char *name, int dt, int ndim, const int64_t *d) {
  return var_add(b, &b->main, name, dt, ndim, d);
}

b_var *peb_block_var(pe_builder *b, b_block *blk, const char *name, int dt, int ndim,
                     const int64_t *d) {
  return var_add(b, blk, name, dt, ndim, d);
}

/* --- parameters and their initialisers ------------------------------------------------ */

static void init_op(pe_builder *b, const char *name, int ndim, const int64_t *d, pe_b_init init,
                    double fan_in, double fan_out) {
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
        peb_fail(b, "%s: uniform initialiser with min %g > max %g", name, init.a, init.b);
        return;
      }
      op = peb_op_add(b, &b->startup, "uniform_random");
      peb_attr_float(b, op, "min", init.a);
      peb_attr_float(b, op, "max", init.b);
      break;
    case PE_B_INIT_NORMAL:
      if (!(init.b >= 0)) {
        peb_fail(b, "%s: normal initialiser with std %g < 0", name, init.b);
        return;
      }
      op = peb_op_add(b, &b->startup, "gaussian_random");
      peb_attr_float(b, op, "mean", init.a);
      peb_attr_float(b, op, "std", init.b);
      break;
    case PE_B_INIT_CONSTANT:
      op = peb_op_add(b, &b->startup, "fill_constant");
      peb_attr_float(b, op, "value", init.a);
      break;
    default: peb_fail(b, "%s: unknown initialiser kind %d", name, (int)init.kind); return;
  }
  peb_op_out(b, op, "Out", name);
  peb_attr_ints(b, op, "shape", ndim, d);
  peb_attr_int(b, op, "dtype", PE_B_F32);
  if (init.kind != PE_B_INIT_CONSTANT) peb_attr_int(b, op, "seed", init.seed);
}

/* A persistable f32 parameter, declared in both blocks, initialised in the
 * startup block. `trainable` false sets stop_gradient (running statistics). */
bool peb_param_add(pe_builder *b, const char *name, int ndim, const int64_t *d, pe_b_init init,
                   double fan_in, double fan_out, bool trainable) {
  b_var *m = var_add(b, &b->main, name, PE_B_F32, ndim, d);
  b_var *s = var_add(b, &b->startup, name, PE_B_F32, ndim, d);
  if (!m || !s) return false;
  m->persistable = s->persistable = true;
  m->stop_gradient = s->stop_gradient = !trainable;
  init_op(b, name, ndim, d, init, fan_in, fan_out);
  return !b->err;
}

pe_b_init peb_init_or(pe_b_init i, pe_b_init_kind dflt) {
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
    peb_fail(b, "data: bad name '%s'", name ? name : "(null)");
    return NULL;
  }
  if ((int)dt < PE_B_F32 || dt > PE_B_U8) {
    peb_fail(b, "data '%s': bad dtype %d", name, (int)dt);
    return NULL;
  }
  for (int i = 0; i < ndim && dims; i++)
    if (dims[i] == 0 || dims[i] < -1) {
      peb_fail(b, "data '%s': dim %d is %lld (positive or -1 expected)", name, i,
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

/* --- training intent
 * ------------------------------------------------------------------------------ */

int pe_builder_append_backward(pe_builder *b, const char *loss) {
  if (!b || b->err) return -1;
  b_var *lv = peb_need(b, "append_backward", loss);
  if (!lv) return -1;
  if (lv->dtype != PE_B_F32 || peb_prod(lv->d, 0, lv->ndim) != 1) {
    char sh[128];
    peb_fail(b, "append_backward: loss '%s' %s must be an f32 scalar [1]", loss,
             peb_shape_str(lv, sh, sizeof sh));
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
    peb_fail(b, "%s: learning rate %g must be positive", type, lr);
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

int pe_builder_sgd(pe_builder *b, float lr) {
  return set_opt(b, "sgd", lr);
}

int pe_builder_momentum(pe_builder *b, float lr, float mu, bool nesterov) {
  if (b && !b->err && !(mu >= 0 && mu < 1)) {
    peb_fail(b, "momentum: mu %g not in [0, 1)", mu);
    return -1;
  }
  if (set_opt(b, "momentum", lr)) return -1;
  b->mu = mu;
  b->nesterov = nesterov;
  return 0;
}

/* adam and adamw: the same hyper-parameters. */
static int set_adam(pe_builder *b, const char *type, float lr, float beta1, float beta2,
                    float epsilon) {
  if (b && !b->err && !(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1 && epsilon > 0)) {
    peb_fail(b, "%s: beta1 %g, beta2 %g must be in [0, 1) and epsilon %g positive", type, beta1,
             beta2, epsilon);
    return -1;
  }
  if (set_opt(b, type, lr)) return -1;
  b->beta1 = beta1;
  b->beta2 = beta2;
  b->eps = epsilon;
  return 0;
}

int pe_builder_adam(pe_builder *b, float lr, float beta1, float beta2, float epsilon) {
  return set_adam(b, "adam", lr, beta1, beta2, epsilon);
}

int pe_builder_adamw(pe_builder *b, float lr, float beta1, float beta2, float epsilon) {
  return set_adam(b, "adamw", lr, beta1, beta2, epsilon);
}

int pe_builder_weight_decay(pe_builder *b, float coeff) {
  if (!b || b->err) return -1;
  if (!(coeff >= 0) || !isfinite(coeff)) {
    peb_fail(b, "weight_decay %g must be finite and >= 0", coeff);
    return -1;
  }
  b->weight_decay = coeff;
  return 0;
}

int pe_builder_grad_clip_norm(pe_builder *b, float max_norm) {
  if (!b || b->err) return -1;
  if (!(max_norm >= 0) || !isfinite(max_norm)) {
    peb_fail(b, "grad_clip_norm %g must be finite and >= 0", max_norm);
    return -1;
  }
  b->clip_norm = max_norm;
  return 0;
}

int pe_builder_no_weight_decay(pe_builder *b, const char *param) {
  if (!b || b->err) return -1;
  b_var *m = param ? peb_var_find(&b->main, param) : NULL;
  if (!m || !m->persistable || m->stop_gradient) {
    peb_fail(b, "no_weight_decay: '%.200s' is not a trainable parameter%s",
             param ? param : "(null)", m ? "" : " (no such variable)");
    return -1;
  }
  b_var *s = peb_var_find(&b->startup, param);
  m->no_weight_decay = true;
  if (s) s->no_weight_decay = true;
  return 0;
}

int pe_builder_no_weight_decay_1d(pe_builder *b) {
  if (!b || b->err) return -1;
  b->no_decay_1d = true;
  return 0;
}

/* name's static copy in kinds[0..n), else NULL. */
static const char *kind_of(const char *const *kinds, size_t n, const char *name) {
  for (size_t i = 0; name && i < n; i++)
    if (strcmp(name, kinds[i]) == 0) return kinds[i];
  return NULL;
}

const char *pe_optimizer_kind(const char *name) {
  static const char *const kinds[] = {"sgd", "momentum", "adam", "adamw"};
  return kind_of(kinds, sizeof kinds / sizeof kinds[0], name);
}

const char *pe_lr_schedule_kind(const char *name) {
  static const char *const kinds[] = {"constant",    "step",   "multistep",
                                      "exponential", "cosine", "linear"};
  return kind_of(kinds, sizeof kinds / sizeof kinds[0], name);
}

int pe_builder_lr_schedule(pe_builder *b, const pe_lr_schedule_opts *s) {
  if (!b || b->err) return -1;
  if (!s || !s->type) {
    peb_fail(b, "lr_schedule: %s NULL", s ? "type is" : "options are");
    return -1;
  }
  const char *k = pe_lr_schedule_kind(s->type);
  if (!k) {
    peb_fail(b, "lr_schedule: unknown type '%.64s' (known: " PE_LR_SCHEDULE_KINDS ")", s->type);
    return -1;
  }
  if (s->warmup_steps < 0 || s->decay_steps < 0) {
    bool w = s->warmup_steps < 0;
    peb_fail(b, "lr_schedule %s: %s %lld must be >= 0", k, w ? "warmup_steps" : "decay_steps",
             (long long)(w ? s->warmup_steps : s->decay_steps));
    return -1;
  }
  if (!(s->gamma >= 0) || !isfinite(s->gamma) || !(s->min_lr >= 0) || !isfinite(s->min_lr)) {
    bool g = !(s->gamma >= 0) || !isfinite(s->gamma);
    peb_fail(b, "lr_schedule %s: %s %g must be finite and >= 0", k, g ? "gamma" : "min_lr",
             g ? s->gamma : s->min_lr);
    return -1;
  }
  if (s->n_milestones < 0) {
    peb_fail(b, "lr_schedule %s: n_milestones %d must be >= 0", k, s->n_milestones);
    return -1;
  }
  if (s->n_milestones > PE_B_MAX_MILESTONES) {
    peb_fail(b, "lr_schedule %s: %d milestones (at most %d)", k, s->n_milestones,
             PE_B_MAX_MILESTONES);
    return -1;
  }
  if (s->n_milestones > 0 && !s->milestones) {
    peb_fail(b, "lr_schedule %s: n_milestones %d but milestones is NULL", k, s->n_milestones);
    return -1;
  }
  b_sched *d = &b->sched;
  d->type = k;
  d->warmup = s->warmup_steps;
  d->decay = s->decay_steps;
  d->gamma = s->gamma;
  d->min_lr = s->min_lr;
  d->n_ms = s->n_milestones;
  if (s->n_milestones > 0) memcpy(d->ms, s->milestones, (size_t)s->n_milestones * sizeof d->ms[0]);
  return 0;
}

/* --- serialisation
 * ----------------------------------------------------------------------------------- */

/* Protobuf views of one block. Pointer arrays are owned here; strings and
 * number arrays are borrowed from the builder. */
typedef struct pb_block {
  Pe__BlockDesc blk;
  Pe__VarDesc *vars;
  Pe__VarDesc **var_ptrs;
  Pe__OpDesc *ops;
  Pe__OpDesc **op_ptrs;
  Pe__OpSlot *slots; /* all slots of all ops */
  Pe__OpSlot **slot_ptrs;
  Pe__Attr *attrs;
  Pe__Attr **attr_ptrs;
} pb_block;

static void pb_block_free(pb_block *p) {
  free(p->vars), free(p->var_ptrs), free(p->ops), free(p->op_ptrs);
  free(p->slots), free(p->slot_ptrs), free(p->attrs), free(p->attr_ptrs);
}

/* VarDesc.no_weight_decay: marked by name, or a 1-D parameter under
 * pe_builder_no_weight_decay_1d. */
static bool var_no_decay(const pe_builder *b, const b_var *v) {
  return v->no_weight_decay ||
         (b->no_decay_1d && v->persistable && !v->stop_gradient && !v->is_feed && v->ndim == 1);
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
    d->no_weight_decay = var_no_decay(b, v);
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
      p->slots[si].n_arguments = (size_t)s->n;
      p->slots[si].arguments = s->args;
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
    peb_fail(b, "finish: bytes and len must not be NULL");
    return -1;
  }
  if (b->opt_type && !b->loss) {
    peb_fail(b, "finish: an optimizer (%s) is set but no loss (call pe_builder_append_backward)",
             b->opt_type);
    return -1;
  }
  if (b->weight_decay > 0 && !b->opt_type) {
    peb_fail(b, "finish: weight_decay %g is set but no optimizer", b->weight_decay);
    return -1;
  }
  if (b->clip_norm > 0 && !b->opt_type) {
    peb_fail(b, "finish: grad_clip_norm %g is set but no optimizer", b->clip_norm);
    return -1;
  }
  if (b->sched.type && !b->opt_type) {
    peb_fail(b, "finish: lr_schedule %s is set but no optimizer", b->sched.type);
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
  Pe__LrSchedule sched = PE__LR_SCHEDULE__INIT;
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
      opt.weight_decay = b->weight_decay;
      opt.grad_clip_norm = b->clip_norm;
      if (b->sched.type) {
        sched.type = (char *)b->sched.type;
        sched.warmup_steps = b->sched.warmup;
        sched.decay_steps = b->sched.decay;
        sched.gamma = b->sched.gamma;
        sched.min_lr = b->sched.min_lr;
        sched.n_milestones = (size_t)b->sched.n_ms;
        sched.milestones = b->sched.n_ms ? b->sched.ms : NULL;
        opt.lr_schedule = &sched;
      }
      train.optimizer = &opt;
    }
    prog.train = &train;
  }
  size_t n = pe__program_desc__get_packed_size(&prog);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) {
    peb_fail(b, "%s", oom_msg);
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
