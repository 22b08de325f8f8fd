/* In-memory program IR: construction, cloning, lookups. See ir/program.h. */
#include "ir/program.h"

#include <stdlib.h>
#include <string.h>

#define OOM(what) pe_error(PE_ENOMEM, "program: out of memory (%s)", what)

static const char *attr_type_names[PE_ATTR_TYPE_COUNT] = {
    "int", "float", "string", "bool", "ints", "floats", "strings", "bools", "block", "long"};

const char *pe_attr_type_name(pe_attr_type t) {
  return (unsigned)t < PE_ATTR_TYPE_COUNT ? attr_type_names[t] : "?";
}

pe_program *pe_program_new(void) {
  pe_program *p = calloc(1, sizeof(*p));
  if (p) p->startup_block = -1;
  return p;
}

static void attr_clear(pe_attr *a) {
  free(a->name);
  free(a->s);
  free(a->ints);
  free(a->floats);
  for (int i = 0; a->strings && i < a->n; i++) free(a->strings[i]);
  free(a->strings);
  memset(a, 0, sizeof(*a));
}

static void slot_clear(pe_slot *s) {
  free(s->name);
  for (int i = 0; i < s->n; i++) free(s->args[i]);
  free(s->args);
  memset(s, 0, sizeof(*s));
}

void pe_op_desc_free(pe_op_desc *op) {
  if (!op) return;
  free(op->type);
  for (int i = 0; i < op->n_in; i++) slot_clear(&op->in[i]);
  for (int i = 0; i < op->n_out; i++) slot_clear(&op->out[i]);
  for (int i = 0; i < op->n_attr; i++) attr_clear(&op->attrs[i]);
  free(op->in);
  free(op->out);
  free(op->attrs);
  free(op);
}

static void block_free(pe_block *b) {
  if (!b) return;
  for (int i = 0; i < b->n_vars; i++) {
    free(b->vars[i]->name);
    free(b->vars[i]->fused_into);
    free(b->vars[i]);
  }
  free(b->vars);
  pe_strmap_destroy(&b->var_index);
  for (int i = 0; i < b->n_ops; i++) pe_op_desc_free(b->ops[i]);
  free(b->ops);
  free(b);
}

void pe_program_free(pe_program *p) {
  if (!p) return;
  for (int i = 0; i < p->n_blocks; i++) block_free(p->blocks[i]);
  free(p->blocks);
  free(p->loss);
  free(p->opt.type);
  free(p->opt.sched.type);
  free(p);
}

pe_status *pe_program_add_block(pe_program *p, int parent, pe_block **out) {
  pe_block **nb = realloc(p->blocks, (size_t)(p->n_blocks + 1) * sizeof(*nb));
  if (!nb) return OOM("block");
  p->blocks = nb;
  pe_block *b = calloc(1, sizeof(*b));
  if (!b) return OOM("block");
  b->idx = p->n_blocks;
  b->parent = parent;
  pe_strmap_init(&b->var_index);
  p->blocks[p->n_blocks++] = b;
  if (out) *out = b;
  return NULL;
}

pe_block *pe_program_main(const pe_program *p) {
  return p->main_block >= 0 && p->main_block < p->n_blocks ? p->blocks[p->main_block] : NULL;
}

pe_block *pe_program_startup(const pe_program *p) {
  return p->startup_block >= 0 && p->startup_block < p->n_blocks ? p->blocks[p->startup_block]
                                                                 : NULL;
}

pe_var_desc *pe_block_find_var_local(const pe_block *b, const char *name) {
  return pe_strmap_get(&b->var_index, name);
}

pe_var_desc *pe_block_find_var(const pe_program *p, const pe_block *b, const char *name) {
  for (int guard = 0; b && guard <= p->n_blocks; guard++) {
    pe_var_desc *v = pe_block_find_var_local(b, name);
    if (v) return v;
    b = (b->parent >= 0 && b->parent < p->n_blocks) ? p->blocks[b->parent] : NULL;
  }
  return NULL;
}

pe_status *pe_fetch_fused_error(const pe_program *p, const pe_block *b, const char *name) {
  const pe_var_desc *d = name ? pe_block_find_var(p, b, name) : NULL;
  if (!d || !d->fused_into) return NULL;
  return pe_error(PE_EUNKNOWN_VAR,
                  "fetch '%s': it was fused into op %s by op fusion; register with "
                  "keep=['%s'] or no_op_fusion (pe-client --keep %s or --no-op-fusion) to "
                  "fetch it",
                  name, d->fused_into, name, name);
}

pe_status *pe_block_add_var(pe_block *b, const char *name, pe_dtype dt, const pe_shape *shape,
                            pe_var_desc **out) {
  if (pe_block_find_var_local(b, name))
    return pe_error(PE_EINVAL, "block %d: variable '%s' declared twice", b->idx, name);
  if (b->n_vars == b->cap_vars) {
    int nc = b->cap_vars ? b->cap_vars * 2 : 16;
    pe_var_desc **nv = realloc(b->vars, (size_t)nc * sizeof(*nv));
    if (!nv) return OOM("var");
    b->vars = nv;
    b->cap_vars = nc;
  }
  pe_var_desc *v = calloc(1, sizeof(*v));
  if (!v || !(v->name = strdup(name))) {
    free(v);
    return OOM("var");
  }
  v->dtype = dt;
  if (shape) v->shape = *shape;
  if (!pe_strmap_put(&b->var_index, name, v)) {
    free(v->name);
    free(v);
    return OOM("var");
  }
  b->vars[b->n_vars++] = v;
  if (out) *out = v;
  return NULL;
}

pe_op_desc *pe_op_desc_new(const char *type) {
  pe_op_desc *op = calloc(1, sizeof(*op));
  if (op && !(op->type = strdup(type))) {
    free(op);
    op = NULL;
  }
  return op;
}

pe_status *pe_block_insert_op(pe_block *b, int at, const char *type, pe_op_desc **out) {
  if (at < 0 || at > b->n_ops) return pe_error(PE_EINTERNAL, "insert op at %d of %d", at, b->n_ops);
  if (b->n_ops == b->cap_ops) {
    int nc = b->cap_ops ? b->cap_ops * 2 : 16;
    pe_op_desc **no = realloc(b->ops, (size_t)nc * sizeof(*no));
    if (!no) return OOM("op");
    b->ops = no;
    b->cap_ops = nc;
  }
  pe_op_desc *op = pe_op_desc_new(type);
  if (!op) return OOM("op");
  memmove(&b->ops[at + 1], &b->ops[at], (size_t)(b->n_ops - at) * sizeof(*b->ops));
  b->ops[at] = op;
  b->n_ops++;
  if (out) *out = op;
  return NULL;
}

pe_status *pe_block_append_op(pe_block *b, const char *type, pe_op_desc **out) {
  return pe_block_insert_op(b, b->n_ops, type, out);
}

void pe_block_remove_op(pe_block *b, int at) {
  if (at < 0 || at >= b->n_ops) return;
  pe_op_desc_free(b->ops[at]);
  memmove(&b->ops[at], &b->ops[at + 1], (size_t)(b->n_ops - at - 1) * sizeof(*b->ops));
  b->n_ops--;
}

/* --- slots ---------------------------------------------------------------- */

static pe_slot *find_slot(pe_slot *s, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(s[i].name, name) == 0) return &s[i];
  return NULL;
}

pe_slot *pe_op_find_input(const pe_op_desc *op, const char *slot) {
  return find_slot(op->in, op->n_in, slot);
}
pe_slot *pe_op_find_output(const pe_op_desc *op, const char *slot) {
  return find_slot(op->out, op->n_out, slot);
}

const char *pe_op_input_arg(const pe_op_desc *op, const char *slot) {
  pe_slot *s = pe_op_find_input(op, slot);
  return s && s->n ? s->args[0] : NULL;
}
const char *pe_op_output_arg(const pe_op_desc *op, const char *slot) {
  pe_slot *s = pe_op_find_output(op, slot);
  return s && s->n ? s->args[0] : NULL;
}

/* Room for entry n of *arr (elem bytes each). An op's slot and attribute
 * arrays hold n entries in a capacity of n rounded up to a power of two
 * (only this file allocates them, and they never shrink), so appending
 * moves each entry O(1) times: a realloc per entry copied the whole array
 * each time under some allocators. */
static bool room_for(void **arr, int n, size_t elem) {
  if (n & (n - 1)) return true; /* not a power of two: below the capacity */
  void *na = realloc(*arr, (n ? 2 * (size_t)n : 1) * elem);
  if (!na) return false;
  *arr = na;
  return true;
}

/* search: replace a slot of that name; else the caller knows there is
 * none, and the slot is appended without a scan (decode, clone). */
static pe_status *set_slot(pe_slot **slots, int *n, const char *name, int nargs,
                           const char *const *args, bool search) {
  pe_slot *s = search ? find_slot(*slots, *n, name) : NULL;
  if (!s) {
    if (!room_for((void **)slots, *n, sizeof **slots)) return OOM("slot");
    s = &(*slots)[*n];
    memset(s, 0, sizeof(*s));
    if (!(s->name = strdup(name))) return OOM("slot");
    (*n)++;
  } else {
    for (int i = 0; i < s->n; i++) free(s->args[i]);
    free(s->args);
    s->args = NULL;
    s->n = 0;
  }
  if (nargs > 0) {
    s->args = calloc((size_t)nargs, sizeof(char *));
    if (!s->args) return OOM("slot args");
    for (int i = 0; i < nargs; i++)
      if (!(s->args[i] = strdup(args[i]))) {
        s->n = i;
        return OOM("slot args");
      }
  }
  s->n = nargs;
  return NULL;
}

pe_status *pe_op_set_input(pe_op_desc *op, const char *slot, int n, const char *const *args) {
  return set_slot(&op->in, &op->n_in, slot, n, args, true);
}
pe_status *pe_op_set_output(pe_op_desc *op, const char *slot, int n, const char *const *args) {
  return set_slot(&op->out, &op->n_out, slot, n, args, true);
}
pe_status *pe_op_append_input(pe_op_desc *op, const char *slot, int n, const char *const *args) {
  return set_slot(&op->in, &op->n_in, slot, n, args, false);
}
pe_status *pe_op_append_output(pe_op_desc *op, const char *slot, int n, const char *const *args) {
  return set_slot(&op->out, &op->n_out, slot, n, args, false);
}
pe_status *pe_op_input1(pe_op_desc *op, const char *slot, const char *arg) {
  return pe_op_set_input(op, slot, 1, &arg);
}
pe_status *pe_op_output1(pe_op_desc *op, const char *slot, const char *arg) {
  return pe_op_set_output(op, slot, 1, &arg);
}

/* --- attributes ------------------------------------------------------------ */

pe_attr *pe_op_find_attr(const pe_op_desc *op, const char *name) {
  for (int i = 0; i < op->n_attr; i++)
    if (strcmp(op->attrs[i].name, name) == 0) return &op->attrs[i];
  return NULL;
}

/* Fresh (cleared) attribute named `name` of type t in op: the one of
 * that name when search, else a new one (the caller knows op lacks it). */
static pe_status *attr_slot_at(pe_op_desc *op, const char *name, pe_attr_type t, bool search,
                               pe_attr **out) {
  pe_attr *a = search ? pe_op_find_attr(op, name) : NULL;
  if (a) {
    attr_clear(a);
  } else {
    if (!room_for((void **)&op->attrs, op->n_attr, sizeof *op->attrs)) return OOM("attr");
    a = &op->attrs[op->n_attr++];
    memset(a, 0, sizeof(*a));
  }
  if (!(a->name = strdup(name))) return OOM("attr");
  a->type = t;
  *out = a;
  return NULL;
}

static pe_status *attr_slot(pe_op_desc *op, const char *name, pe_attr_type t, pe_attr **out) {
  return attr_slot_at(op, name, t, true, out);
}

pe_status *pe_op_set_int(pe_op_desc *op, const char *name, int64_t v) {
  pe_attr *a;
  PE_TRY(attr_slot(op, name, PE_ATTR_INT, &a));
  a->i = v;
  return NULL;
}
pe_status *pe_op_set_long(pe_op_desc *op, const char *name, int64_t v) {
  pe_attr *a;
  PE_TRY(attr_slot(op, name, PE_ATTR_LONG, &a));
  a->i = v;
  return NULL;
}
pe_status *pe_op_set_float(pe_op_desc *op, const char *name, float v) {
  pe_attr *a;
  PE_TRY(attr_slot(op, name, PE_ATTR_FLOAT, &a));
  a->f = v;
  return NULL;
}
pe_status *pe_op_set_bool(pe_op_desc *op, const char *name, bool v) {
  pe_attr *a;
  PE_TRY(attr_slot(op, name, PE_ATTR_BOOL, &a));
  a->i = v;
  return NULL;
}
pe_status *pe_op_set_block(pe_op_desc *op, const char *name, int block_idx) {
  pe_attr *a;
  PE_TRY(attr_slot(op, name, PE_ATTR_BLOCK, &a));
  a->i = block_idx;
  return NULL;
}
pe_status *pe_op_set_string(pe_op_desc *op, const char *name, const char *v) {
  pe_attr *a;
  PE_TRY(attr_slot(op, name, PE_ATTR_STRING, &a));
  if (!(a->s = strdup(v))) return OOM("attr");
  return NULL;
}
pe_status *pe_op_set_ints(pe_op_desc *op, const char *name, int n, const int64_t *v) {
  pe_attr *a;
  PE_TRY(attr_slot(op, name, PE_ATTR_INTS, &a));
  if (n && !(a->ints = malloc((size_t)n * sizeof(int64_t)))) return OOM("attr");
  if (n) memcpy(a->ints, v, (size_t)n * sizeof(int64_t));
  a->n = n;
  return NULL;
}
pe_status *pe_op_set_bools(pe_op_desc *op, const char *name, int n, const bool *v) {
  pe_attr *a;
  PE_TRY(attr_slot(op, name, PE_ATTR_BOOLS, &a));
  if (n && !(a->ints = malloc((size_t)n * sizeof(int64_t)))) return OOM("attr");
  for (int i = 0; i < n; i++) a->ints[i] = v[i];
  a->n = n;
  return NULL;
}
pe_status *pe_op_set_floats(pe_op_desc *op, const char *name, int n, const float *v) {
  pe_attr *a;
  PE_TRY(attr_slot(op, name, PE_ATTR_FLOATS, &a));
  if (n && !(a->floats = malloc((size_t)n * sizeof(float)))) return OOM("attr");
  if (n) memcpy(a->floats, v, (size_t)n * sizeof(float));
  a->n = n;
  return NULL;
}
pe_status *pe_op_set_strings(pe_op_desc *op, const char *name, int n, const char *const *v) {
  pe_attr *a;
  PE_TRY(attr_slot(op, name, PE_ATTR_STRINGS, &a));
  if (n && !(a->strings = calloc((size_t)n, sizeof(char *)))) return OOM("attr");
  for (int i = 0; i < n; i++) {
    if (!(a->strings[i] = strdup(v[i]))) return OOM("attr");
    a->n = i + 1;
  }
  return NULL;
}

/* src's value into a, a fresh attribute of src's name and type. */
static pe_status *attr_copy(pe_attr *a, const pe_attr *src) {
  int n = src->n;
  switch (src->type) {
    case PE_ATTR_INT:
    case PE_ATTR_LONG:
    case PE_ATTR_BLOCK: a->i = src->i; return NULL;
    case PE_ATTR_BOOL: a->i = src->i != 0; return NULL;
    case PE_ATTR_FLOAT: a->f = src->f; return NULL;
    case PE_ATTR_STRING: return (a->s = strdup(src->s ? src->s : "")) ? NULL : OOM("attr");
    case PE_ATTR_INTS:
    case PE_ATTR_BOOLS:
      if (n && !(a->ints = malloc((size_t)n * sizeof(int64_t)))) return OOM("attr");
      if (n) memcpy(a->ints, src->ints, (size_t)n * sizeof(int64_t));
      a->n = n;
      return NULL;
    case PE_ATTR_FLOATS:
      if (n && !(a->floats = malloc((size_t)n * sizeof(float)))) return OOM("attr");
      if (n) memcpy(a->floats, src->floats, (size_t)n * sizeof(float));
      a->n = n;
      return NULL;
    case PE_ATTR_STRINGS:
      if (n && !(a->strings = calloc((size_t)n, sizeof(char *)))) return OOM("attr");
      for (int i = 0; i < n; i++) {
        if (!(a->strings[i] = strdup(src->strings[i]))) return OOM("attr");
        a->n = i + 1;
      }
      return NULL;
    default: return pe_error(PE_EATTR, "attribute '%s': bad type %d", src->name, (int)src->type);
  }
}

static pe_status *put_attr(pe_op_desc *op, const pe_attr *src, bool search) {
  if ((unsigned)src->type >= PE_ATTR_TYPE_COUNT)
    return pe_error(PE_EATTR, "attribute '%s': bad type %d", src->name, (int)src->type);
  pe_attr *a = NULL;
  PE_TRY(attr_slot_at(op, src->name, src->type, search, &a));
  return attr_copy(a, src);
}

pe_status *pe_op_set_attr(pe_op_desc *op, const pe_attr *src) {
  return put_attr(op, src, true);
}

pe_status *pe_op_append_attr(pe_op_desc *op, const pe_attr *src) {
  return put_attr(op, src, false);
}

pe_status *pe_op_desc_clone(const pe_op_desc *op, pe_op_desc **out) {
  pe_op_desc *c = pe_op_desc_new(op->type);
  if (!c) return OOM("op");
  pe_status *st = NULL;
  /* op's names differ already: appended, the copy costs op's size. */
  for (int i = 0; !st && i < op->n_in; i++)
    st = pe_op_append_input(c, op->in[i].name, op->in[i].n, (const char *const *)op->in[i].args);
  for (int i = 0; !st && i < op->n_out; i++)
    st =
        pe_op_append_output(c, op->out[i].name, op->out[i].n, (const char *const *)op->out[i].args);
  for (int i = 0; !st && i < op->n_attr; i++) st = pe_op_append_attr(c, &op->attrs[i]);
  if (st) {
    pe_op_desc_free(c);
    return st;
  }
  *out = c;
  return NULL;
}

pe_status *pe_program_clone(const pe_program *p, pe_program **out) {
  pe_program *c = pe_program_new();
  if (!c) return OOM("program");
  pe_status *st = NULL;
  c->version = p->version;
  c->main_block = p->main_block;
  c->startup_block = p->startup_block;
  if (p->loss && !(c->loss = strdup(p->loss))) st = OOM("loss");
  c->opt = p->opt;
  c->opt.type = NULL;
  c->opt.sched.type = NULL;
  if (!st && p->opt.type && !(c->opt.type = strdup(p->opt.type))) st = OOM("optimizer");
  if (!st && p->opt.sched.type && !(c->opt.sched.type = strdup(p->opt.sched.type)))
    st = OOM("lr_schedule");
  for (int bi = 0; !st && bi < p->n_blocks; bi++) {
    const pe_block *b = p->blocks[bi];
    pe_block *nb;
    if ((st = pe_program_add_block(c, b->parent, &nb))) break;
    nb->idx = b->idx;
    for (int i = 0; !st && i < b->n_vars; i++) {
      pe_var_desc *v;
      st = pe_block_add_var(nb, b->vars[i]->name, b->vars[i]->dtype, &b->vars[i]->shape, &v);
      if (!st) {
        v->persistable = b->vars[i]->persistable;
        v->stop_gradient = b->vars[i]->stop_gradient;
        v->is_feed = b->vars[i]->is_feed;
        v->no_weight_decay = b->vars[i]->no_weight_decay;
        if (b->vars[i]->fused_into && !(v->fused_into = strdup(b->vars[i]->fused_into)))
          st = OOM("var");
      }
    }
    for (int i = 0; !st && i < b->n_ops; i++) {
      pe_op_desc *op;
      if ((st = pe_op_desc_clone(b->ops[i], &op))) break;
      pe_op_desc *placeholder;
      if ((st = pe_block_append_op(nb, "x", &placeholder))) {
        pe_op_desc_free(op);
        break;
      }
      pe_op_desc_free(placeholder);
      nb->ops[nb->n_ops - 1] = op;
    }
  }
  if (st) {
    pe_program_free(c);
    return st;
  }
  *out = c;
  return NULL;
}
