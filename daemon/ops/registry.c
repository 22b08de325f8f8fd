/* The op registry: builds the type -> row index once (pthread_once) from the
 * group tables, and offers the shared helpers that rows use. After init the
 * registry is read-only and safe from any thread. */
#include "registry.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/device_ctx.h"
#include "ops/op_tables.h"

static const pe_op_def *const group_tables[] = {
    pe_ops_creation,       pe_ops_elementwise,  pe_ops_loss,       pe_ops_shape,
    pe_ops_dropout,        pe_ops_metric,       pe_ops_optimizer,  pe_ops_matmul,
    pe_ops_activation,     pe_ops_conv,         pe_ops_pool,       pe_ops_batch_norm,
    pe_ops_schedule,       pe_ops_clip,         pe_ops_layer_norm, pe_ops_embedding,
    pe_ops_transpose,      pe_ops_concat,       pe_ops_slice,      pe_ops_matmul_v2,
    pe_ops_pointwise_loss, pe_ops_cast,         pe_ops_tril_triu,  pe_ops_smooth_l1_loss,
    pe_ops_position_ids,   pe_ops_softmax_mask, pe_ops_attention,
};

/* Backends' kernel tables by place kind (pe_op_register_kernels), merged
 * into the rows at init. Written before the first lookup. */
static const pe_kernel_row *backend_kernels[PE_PLACE_KINDS];

#define MAX_OPS 256
static pe_op_def rows[MAX_OPS]; /* copies with counts filled in */
static int n_rows;
static pe_strmap by_type;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static int count_slots(const pe_slot_def *s) {
  int n = 0;
  while (s && s[n].name) n++;
  return n;
}
static int count_attrs(const pe_attr_def *a) {
  int n = 0;
  while (a && a[n].name) n++;
  return n;
}

static void registry_init(void) {
  pe_strmap_init(&by_type);
  for (size_t g = 0; g < sizeof group_tables / sizeof group_tables[0]; g++) {
    for (const pe_op_def *d = group_tables[g]; d->type; d++) {
      if (n_rows == MAX_OPS || pe_strmap_has(&by_type, d->type)) {
        /* A programming error in the tables, not input: fail loudly at start. */
        fprintf(stderr, "pe: op registry: duplicate or too many ops at '%s'\n", d->type);
        abort();
      }
      rows[n_rows] = *d;
      rows[n_rows].n_inputs = count_slots(d->inputs);
      rows[n_rows].n_outputs = count_slots(d->outputs);
      rows[n_rows].n_attrs = count_attrs(d->attrs);
      n_rows++;
    }
  }
  for (int i = 0; i < n_rows; i++)
    if (!pe_strmap_put(&by_type, rows[i].type, &rows[i])) abort();
  for (const pe_kernel_row *k = backend_kernels[PE_PLACE_CUDA]; k && k->type; k++) {
    pe_op_def *d = pe_strmap_get(&by_type, k->type);
    if (!d) {
      fprintf(stderr, "pe: op registry: cuda kernel for unknown op '%s'\n", k->type);
      abort();
    }
    d->kernel_cuda = k->kernel;
    d->state_free_cuda = k->state_free;
  }
}

void pe_op_register_kernels(pe_place_kind kind, const pe_kernel_row *rows) {
  if ((unsigned)kind < PE_PLACE_KINDS) backend_kernels[kind] = rows;
}

pe_kernel_fn pe_op_kernel(const pe_op_def *d, pe_place_kind kind) {
  return kind == PE_PLACE_CUDA ? d->kernel_cuda : d->kernel_cpu;
}

void (*pe_op_state_free(const pe_op_def *d, pe_place_kind kind))(void *) {
  return kind == PE_PLACE_CUDA ? d->state_free_cuda : d->state_free;
}

const pe_op_def *pe_op_lookup(const char *type) {
  pthread_once(&once, registry_init);
  return type ? pe_strmap_get(&by_type, type) : NULL;
}

int pe_op_count(void) {
  pthread_once(&once, registry_init);
  return n_rows;
}

const pe_op_def *pe_op_at(int i) {
  pthread_once(&once, registry_init);
  return i >= 0 && i < n_rows ? &rows[i] : NULL;
}

int pe_op_input_index(const pe_op_def *d, const char *slot) {
  for (int i = 0; i < d->n_inputs; i++)
    if (strcmp(d->inputs[i].name, slot) == 0) return i;
  return -1;
}

int pe_op_output_index(const pe_op_def *d, const char *slot) {
  for (int i = 0; i < d->n_outputs; i++)
    if (strcmp(d->outputs[i].name, slot) == 0) return i;
  return -1;
}

const pe_attr_def *pe_op_attr_def(const pe_op_def *d, const char *name) {
  for (int i = 0; i < d->n_attrs; i++)
    if (strcmp(d->attrs[i].name, name) == 0) return &d->attrs[i];
  return NULL;
}

bool pe_op_output_unchanged(const pe_op_def *d, const pe_op_desc *op, int out) {
  if (!d->output_copies || out < 0 || out >= d->n_outputs) return false;
  int in = d->output_copies(d, op, out);
  if (in < 0 || in >= d->n_inputs) return false;
  const pe_slot *o = pe_op_find_output(op, d->outputs[out].name);
  const pe_slot *i = pe_op_find_input(op, d->inputs[in].name);
  if (!o || !i || o->n != i->n) return false;
  for (int k = 0; k < o->n; k++)
    if (strcmp(o->args[k], i->args[k]) != 0) return false;
  return true;
}

/* --- attributes with defaults ----------------------------------------------- */

int64_t pe_attr_i(const pe_op_def *d, const pe_op_desc *op, const char *name) {
  const pe_attr *a = pe_op_find_attr(op, name);
  if (a) return a->type == PE_ATTR_FLOAT ? (int64_t)a->f : a->i;
  const pe_attr_def *ad = pe_op_attr_def(d, name);
  return ad ? (int64_t)ad->dflt : 0;
}

float pe_attr_f(const pe_op_def *d, const pe_op_desc *op, const char *name) {
  const pe_attr *a = pe_op_find_attr(op, name);
  if (a) return a->type == PE_ATTR_FLOAT ? a->f : (float)a->i;
  const pe_attr_def *ad = pe_op_attr_def(d, name);
  return ad ? (float)ad->dflt : 0.0f;
}

bool pe_attr_b(const pe_op_def *d, const pe_op_desc *op, const char *name) {
  return pe_attr_i(d, op, name) != 0;
}

const char *pe_attr_s(const pe_op_def *d, const pe_op_desc *op, const char *name) {
  const pe_attr *a = pe_op_find_attr(op, name);
  if (a && a->type == PE_ATTR_STRING) return a->s ? a->s : "";
  const pe_attr_def *ad = pe_op_attr_def(d, name);
  return ad && ad->sdflt ? ad->sdflt : "";
}

int pe_attr_ints(const pe_op_desc *op, const char *name, const int64_t **v) {
  const pe_attr *a = pe_op_find_attr(op, name);
  if (!a || (a->type != PE_ATTR_INTS && a->type != PE_ATTR_BOOLS)) {
    *v = NULL;
    return 0;
  }
  *v = a->ints;
  return a->n;
}

int pe_attr_floats(const pe_op_desc *op, const char *name, const float **v) {
  const pe_attr *a = pe_op_find_attr(op, name);
  if (!a || a->type != PE_ATTR_FLOATS) {
    *v = NULL;
    return 0;
  }
  *v = a->floats;
  return a->n;
}

/* --- inference helpers ------------------------------------------------------- */

pe_status *pe_infer_error(const pe_infer_ctx *c, pe_code code, const char *fmt, ...) {
  char body[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  return pe_error(code, "op #%d (%s): %s", c->op_index, c->desc->type, body);
}

void pe_infer_set(pe_infer_ctx *c, int slot, pe_dtype dt, const pe_shape *shape) {
  for (int k = 0; k < c->out[slot].n; k++) {
    c->out[slot].m[k]->dtype = dt;
    c->out[slot].m[k]->shape = *shape;
  }
}

pe_status *pe_infer_expect_dtype(pe_infer_ctx *c, int slot, int k, pe_dtype dt) {
  pe_meta *m = pe_in_meta(c, slot, k);
  if (!m || m->dtype == dt) return NULL;
  char sb[PE_SHAPE_STRLEN];
  return pe_infer_error(c, PE_EDTYPE, "input %s '%s' %s has dtype %s, expected %s",
                        c->def->inputs[slot].name, pe_in_name(c, slot, k),
                        pe_shape_str(&m->shape, sb, sizeof sb), pe_dtype_name(m->dtype),
                        pe_dtype_name(dt));
}

pe_status *pe_infer_grad_like_inputs(pe_infer_ctx *c) {
  for (int o = 0; o < c->def->n_outputs; o++) {
    const char *oname = c->def->outputs[o].name;
    size_t len = strlen(oname), sl = strlen(PE_GRAD_SUFFIX);
    if (len <= sl || strcmp(oname + len - sl, PE_GRAD_SUFFIX) != 0)
      return pe_infer_error(c, PE_EINTERNAL, "output slot %s is not a gradient slot", oname);
    char fwd[128];
    snprintf(fwd, sizeof fwd, "%.*s", (int)(len - sl), oname);
    int i = pe_op_input_index(c->def, fwd);
    if (i < 0) return pe_infer_error(c, PE_EINTERNAL, "no input slot %s for %s", fwd, oname);
    for (int k = 0; k < c->out[o].n; k++) {
      pe_meta *src = pe_in_meta(c, i, k);
      if (!src)
        return pe_infer_error(c, PE_EARITY, "gradient %s has %d args but %s has %d", oname,
                              c->out[o].n, fwd, c->in[i].n);
      *c->out[o].m[k] = *src;
    }
  }
  return NULL;
}

pe_status *pe_infer_same_as_first(pe_infer_ctx *c) {
  pe_meta *m = pe_in_meta(c, 0, 0);
  if (!m) return pe_infer_error(c, PE_EARITY, "missing input %s", c->def->inputs[0].name);
  for (int o = 0; o < c->def->n_outputs; o++) pe_infer_set(c, o, m->dtype, &m->shape);
  return NULL;
}

/* --- kernel helpers ------------------------------------------------------------ */

pe_status *pe_kernel_error(const pe_kernel_ctx *c, pe_code code, const char *fmt, ...) {
  char body[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  return pe_error(code, "op #%d (%s): %s", c->op_index, c->desc->type, body);
}

int pe_kernel_threads(const pe_kernel_ctx *c) {
  return c->dev && c->dev->threads > 0 ? c->dev->threads : 1;
}

pe_status *pe_kernel_rng(pe_kernel_ctx *c, pe_rng **gen, uint64_t *seed) {
  if (!c->rng) return pe_kernel_error(c, PE_EINTERNAL, "no program generator");
  int64_t op_seed = pe_attr_i(c->def, c->desc, "seed");
  *gen = c->rng;
  *seed = op_seed ? (uint64_t)op_seed : c->rng->seed;
  return NULL;
}

/* --- gradient helpers ------------------------------------------------------------ */

const char *pe_grad_name(const char *var, char *buf, size_t len) {
  snprintf(buf, len, "%s" PE_GRAD_SUFFIX, var);
  return buf;
}

bool pe_is_sparse_rows_name(const char *name) {
  static const char tail[] = PE_GRAD_SUFFIX PE_ROWS_SUFFIX;
  size_t n = strlen(name), t = sizeof tail - 1;
  return n > t && strcmp(name + n - t, tail) == 0;
}

const char *pe_op_sparse_rows(const pe_op_desc *op, const char *grad) {
  size_t gl = strlen(grad), rl = sizeof(PE_ROWS_SUFFIX) - 1;
  for (int s = 0; s < op->n_out; s++) {
    if (!pe_is_sparse_rows_name(op->out[s].name)) continue;
    for (int k = 0; k < op->out[s].n; k++) {
      const char *a = op->out[s].args[k];
      if (strlen(a) == gl + rl && strncmp(a, grad, gl) == 0 && strcmp(a + gl, PE_ROWS_SUFFIX) == 0)
        return a;
    }
  }
  return NULL;
}

void pe_grad_ctx_init(pe_grad_ctx *g, const pe_op_def *def, const pe_op_desc *fwd) {
  memset(g, 0, sizeof(*g));
  g->def = def;
  g->fwd = fwd;
}

void pe_grad_ctx_destroy(pe_grad_ctx *g) {
  for (int i = 0; i < g->n_ops; i++) pe_op_desc_free(g->ops[i]);
  free(g->ops);
  memset(g, 0, sizeof(*g));
}

pe_status *pe_grad_new_op(pe_grad_ctx *g, const char *type, pe_op_desc **out) {
  if (g->n_ops == g->cap_ops) {
    int nc = g->cap_ops ? g->cap_ops * 2 : 4;
    pe_op_desc **no = realloc(g->ops, (size_t)nc * sizeof(*no));
    if (!no) return pe_error(PE_ENOMEM, "grad maker: out of memory");
    g->ops = no;
    g->cap_ops = nc;
  }
  pe_op_desc *op = pe_op_desc_new(type);
  if (!op) return pe_error(PE_ENOMEM, "grad maker: out of memory");
  g->ops[g->n_ops++] = op;
  *out = op;
  return NULL;
}

/* Set slot `slot` of op to the @GRAD names of args. */
static pe_status *set_grad_slot(pe_op_desc *op, bool output, const char *slot, const pe_slot *src) {
  char **names = calloc((size_t)(src->n ? src->n : 1), sizeof(char *));
  if (!names) return pe_error(PE_ENOMEM, "grad maker: out of memory");
  pe_status *st = NULL;
  for (int k = 0; k < src->n && !st; k++) {
    size_t l = strlen(src->args[k]) + sizeof(PE_GRAD_SUFFIX);
    if (!(names[k] = malloc(l)))
      st = pe_error(PE_ENOMEM, "grad maker: out of memory");
    else
      pe_grad_name(src->args[k], names[k], l);
  }
  if (!st)
    st = output ? pe_op_set_output(op, slot, src->n, (const char *const *)names)
                : pe_op_set_input(op, slot, src->n, (const char *const *)names);
  for (int k = 0; k < src->n; k++) free(names[k]);
  free(names);
  return st;
}

pe_status *pe_grad_default(pe_grad_ctx *g) {
  char type[128];
  snprintf(type, sizeof type, "%s_grad", g->fwd->type);
  pe_op_desc *op;
  PE_TRY(pe_grad_new_op(g, type, &op));
  const pe_op_desc *f = g->fwd;
  char slot[160];
  for (int i = 0; i < f->n_in; i++)
    PE_TRY(pe_op_set_input(op, f->in[i].name, f->in[i].n, (const char *const *)f->in[i].args));
  for (int i = 0; i < f->n_out; i++) {
    PE_TRY(pe_op_set_input(op, f->out[i].name, f->out[i].n, (const char *const *)f->out[i].args));
    snprintf(slot, sizeof slot, "%s" PE_GRAD_SUFFIX, f->out[i].name);
    PE_TRY(set_grad_slot(op, false, slot, &f->out[i]));
  }
  for (int i = 0; i < f->n_in; i++) {
    int di = pe_op_input_index(g->def, f->in[i].name);
    if (di >= 0 && (g->def->inputs[di].flags & PE_SLOT_NO_GRAD)) continue;
    snprintf(slot, sizeof slot, "%s" PE_GRAD_SUFFIX, f->in[i].name);
    PE_TRY(set_grad_slot(op, true, slot, &f->in[i]));
  }
  for (int i = 0; i < f->n_attr; i++) PE_TRY(pe_op_set_attr(op, &f->attrs[i]));
  return NULL;
}
