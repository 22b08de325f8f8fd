/* pe_program_add_counter (pe_recipe.h): a trainer's own int64 [1]
 * persistable, declared in the main and startup blocks of a built
 * ProgramDesc and initialised to 0 by a fill_constant in the startup block,
 * so that the model keeps it (checkpoints, the restart, export) and Init
 * gives a model without it a 0. Everything added is malloc'd: the unpacked
 * message frees it with the rest. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pe_builder.h"
#include "pe_recipe.h"
#include "program.pb-c.h"

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

/* Appends x to the malloc'd array *arr of *n pointers. */
static bool push(void ***arr, size_t *n, void *x) {
  void **a = realloc(*arr, (*n + 1) * sizeof *a);
  if (!a) return false;
  a[(*n)++] = x;
  *arr = a;
  return true;
}

static bool add_var(Pe__BlockDesc *b, const char *name) {
  for (size_t i = 0; i < b->n_vars; i++)
    if (!strcmp(b->vars[i]->name, name)) return true;
  Pe__VarDesc *v = malloc(sizeof *v);
  int64_t *shape = malloc(sizeof *shape);
  char *nm = strdup(name);
  if (!v || !shape || !nm) goto oom;
  pe__var_desc__init(v);
  v->name = nm;
  v->dtype = PE__DATA_TYPE__I64;
  *shape = 1;
  v->shape = shape;
  v->n_shape = 1;
  v->persistable = v->stop_gradient = true;
  if (push((void ***)&b->vars, &b->n_vars, v)) return true;
oom:
  free(v);
  free(shape);
  free(nm);
  return false;
}

static Pe__Attr *attr_new(const char *name, Pe__AttrType type) {
  Pe__Attr *a = malloc(sizeof *a);
  char *nm = strdup(name);
  if (!a || !nm) {
    free(a);
    free(nm);
    return NULL;
  }
  pe__attr__init(a);
  a->name = nm;
  a->type = type;
  return a;
}

/* fill_constant(shape [1], dtype i64, value 0) -> name, in block b. */
static bool add_fill(Pe__BlockDesc *b, const char *name) {
  Pe__OpDesc *op = malloc(sizeof *op);
  Pe__OpSlot *out = malloc(sizeof *out);
  if (!op || !out) {
    free(op);
    free(out);
    return false;
  }
  pe__op_desc__init(op);
  pe__op_slot__init(out);
  if (!push((void ***)&b->ops, &b->n_ops, op)) {
    free(op);
    free(out);
    return false;
  }
  /* From here op is b's: what fails below is freed with the message. */
  op->type = strdup("fill_constant");
  if (!op->type || !push((void ***)&op->outputs, &op->n_outputs, out)) {
    free(out);
    return false;
  }
  out->parameter = strdup("Out");
  char *arg = strdup(name);
  if (!out->parameter || !arg || !push((void ***)&out->arguments, &out->n_arguments, arg)) {
    free(arg);
    return false;
  }
  Pe__Attr *shape = attr_new("shape", PE__ATTR_TYPE__INTS);
  if (!shape || !push((void ***)&op->attrs, &op->n_attrs, shape)) return free(shape), false;
  if (!(shape->ints = malloc(sizeof *shape->ints))) return false;
  shape->ints[0] = 1;
  shape->n_ints = 1;
  Pe__Attr *dt = attr_new("dtype", PE__ATTR_TYPE__INT);
  if (!dt || !push((void ***)&op->attrs, &op->n_attrs, dt)) return free(dt), false;
  dt->i = PE_B_I64;
  Pe__Attr *val = attr_new("value", PE__ATTR_TYPE__FLOAT);
  if (!val || !push((void ***)&op->attrs, &op->n_attrs, val)) return free(val), false;
  return true;
}

int pe_program_add_counter(const uint8_t *in, size_t len, const char *name, uint8_t **out,
                           size_t *out_len, char *err, size_t errlen) {
  *out = NULL;
  *out_len = 0;
  Pe__ProgramDesc *pd = pe__program_desc__unpack(NULL, len, in);
  if (!pd) return fail(err, errlen, "not a ProgramDesc (%zu bytes)", len);
  int rc = 0;
  int mb = pd->main_block, sb = pd->startup_block;
  if (mb < 0 || (size_t)mb >= pd->n_blocks || sb < 0 || (size_t)sb >= pd->n_blocks || sb == mb) {
    rc = fail(err, errlen, "the program has no startup block to initialise '%s'", name);
  } else {
    bool had = false;
    for (size_t i = 0; i < pd->blocks[sb]->n_vars; i++)
      had |= !strcmp(pd->blocks[sb]->vars[i]->name, name);
    if (!add_var(pd->blocks[mb], name) || !add_var(pd->blocks[sb], name) ||
        (!had && !add_fill(pd->blocks[sb], name)))
      rc = fail(err, errlen, "out of memory adding '%s'", name);
  }
  if (!rc) {
    size_t n = pe__program_desc__get_packed_size(pd);
    if (!(*out = malloc(n ? n : 1)))
      rc = fail(err, errlen, "out of memory (%zu bytes)", n);
    else
      *out_len = pe__program_desc__pack(pd, *out);
  }
  pe__program_desc__free_unpacked(pd, NULL);
  return rc;
}
