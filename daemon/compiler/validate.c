/* Program validation (see validate.h for the contract).
 *
 * Two phases per block:
 *  1. structure, op by op: op known, every argument declared, slots known and
 *     within their arity, attributes known, present when required and of the
 *     schema's type;
 *  2. order and inference, op by op in program order: every input defined
 *     before it is read (else use-before-def or cycle, see validate_order.c),
 *     then the row's infer on compile-time metas (-1 = batch); inferred outputs
 *     are checked against declared shapes/dtypes or fill undeclared ones.
 * So a structural error anywhere in a block is reported before an order or
 * shape error, and the first error stops validation.
 *
 * Every message starts "block B: op #I (type): " and names the slot, the
 * variable and the shapes involved. */
#include "compiler/validate.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/validate_internal.h"
#include "ops/registry.h"

pe_var_desc *pe_program_resolve_var(const pe_program *p, const pe_block *b, const char *name,
                                    pe_var_scope_kind *where) {
  pe_var_desc *v = pe_block_find_var_local(b, name);
  pe_var_scope_kind w = PE_VAR_LOCAL;
  if (!v) {
    v = pe_block_find_var(p, b, name);
    w = PE_VAR_ANCESTOR;
  }
  if (!v && b->idx == p->startup_block) {
    pe_block *m = pe_program_main(p);
    if (m && m != b) {
      v = pe_block_find_var(p, m, name);
      w = PE_VAR_MAIN;
    }
  }
  if (where) *where = w;
  return v;
}

pe_status *pe_validate_op_error(const pe_block *b, int i, const pe_op_desc *op, pe_code code,
                                const char *fmt, ...) {
  char body[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  return pe_error(code, "block %d: op #%d (%s): %s", b->idx, i, op->type, body);
}
#define OPERR pe_validate_op_error

/* --- phase 1: structure --------------------------------------------------- */

static pe_status *check_declared(const pe_program *p, const pe_block *b, int i,
                                 const pe_op_desc *op) {
  for (int dir = 0; dir < 2; dir++) {
    const pe_slot *slots = dir ? op->out : op->in;
    int n = dir ? op->n_out : op->n_in;
    for (int s = 0; s < n; s++)
      for (int k = 0; k < slots[s].n; k++)
        if (!pe_program_resolve_var(p, b, slots[s].args[k], NULL))
          return OPERR(b, i, op, PE_EUNKNOWN_VAR, "%s %s '%s' is not declared in block %d%s",
                       dir ? "output" : "input", slots[s].name, slots[s].args[k], b->idx,
                       b->idx == p->startup_block ? " or the main block" : " or its parents");
  }
  return NULL;
}

/* "X, Y" into buf: the slots a row accepts, for messages. */
static const char *slot_list(const pe_slot_def *defs, int n, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && off < len; i++)
    off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? ", " : "", defs[i].name);
  if (n == 0) snprintf(buf, len, "none");
  return buf;
}

static pe_status *check_arity(const pe_block *b, int i, const pe_op_desc *op,
                              const pe_op_def *def) {
  char names[512];
  for (int dir = 0; dir < 2; dir++) {
    const pe_slot *slots = dir ? op->out : op->in;
    int n = dir ? op->n_out : op->n_in;
    const pe_slot_def *defs = dir ? def->outputs : def->inputs;
    int ndefs = dir ? def->n_outputs : def->n_inputs;
    const char *what = dir ? "output" : "input";
    for (int s = 0; s < n; s++) {
      int di = dir ? pe_op_output_index(def, slots[s].name) : pe_op_input_index(def, slots[s].name);
      if (di < 0)
        return OPERR(b, i, op, PE_EARITY, "unknown %s slot '%s' (%s slots: %s)", what,
                     slots[s].name, op->type, slot_list(defs, ndefs, names, sizeof names));
    }
    for (int d = 0; d < ndefs; d++) {
      pe_slot *s = dir ? pe_op_find_output(op, defs[d].name) : pe_op_find_input(op, defs[d].name);
      int got = s ? s->n : 0;
      if (got < defs[d].min || (defs[d].max >= 0 && got > defs[d].max)) {
        if (defs[d].max < 0)
          return OPERR(b, i, op, PE_EARITY, "%s slot %s has %d argument(s), expected at least %d",
                       what, defs[d].name, got, defs[d].min);
        if (defs[d].min == defs[d].max)
          return OPERR(b, i, op, PE_EARITY, "%s slot %s has %d argument(s), expected %d", what,
                       defs[d].name, got, defs[d].min);
        return OPERR(b, i, op, PE_EARITY, "%s slot %s has %d argument(s), expected %d to %d", what,
                     defs[d].name, got, defs[d].min, defs[d].max);
      }
    }
  }
  return NULL;
}

static bool attr_type_ok(pe_attr_type want, pe_attr_type got) {
  if (want == got) return true;
  bool want_int = want == PE_ATTR_INT || want == PE_ATTR_LONG;
  bool got_int = got == PE_ATTR_INT || got == PE_ATTR_LONG;
  return want_int && got_int;
}

/* The forward row of a "<type>_grad" op, whose attributes it may carry. */
static const pe_op_def *forward_row(const char *type) {
  size_t n = strlen(type), sl = strlen("_grad");
  if (n <= sl || strcmp(type + n - sl, "_grad") != 0 || n - sl >= 128) return NULL;
  char fwd[128];
  memcpy(fwd, type, n - sl);
  fwd[n - sl] = '\0';
  return pe_op_lookup(fwd);
}

static pe_status *check_attrs(const pe_program *p, const pe_block *b, int i, const pe_op_desc *op,
                              const pe_op_def *def) {
  const pe_op_def *fwd = forward_row(op->type);
  for (int a = 0; a < op->n_attr; a++) {
    const pe_attr *at = &op->attrs[a];
    const pe_attr_def *ad = pe_op_attr_def(def, at->name);
    if (!ad && fwd) ad = pe_op_attr_def(fwd, at->name);
    if (!ad)
      return OPERR(b, i, op, PE_EATTR, "unknown attribute '%s' (%s)", at->name,
                   pe_attr_type_name(at->type));
    if (!attr_type_ok(ad->type, at->type))
      return OPERR(b, i, op, PE_EATTR, "attribute '%s' is %s, expected %s", at->name,
                   pe_attr_type_name(at->type), pe_attr_type_name(ad->type));
    if (at->type == PE_ATTR_BLOCK && (at->i < 0 || at->i >= p->n_blocks))
      return OPERR(b, i, op, PE_EATTR, "attribute '%s': block %lld out of range", at->name,
                   (long long)at->i);
  }
  for (int d = 0; d < def->n_attrs; d++)
    if (def->attrs[d].required && !pe_op_find_attr(op, def->attrs[d].name))
      return OPERR(b, i, op, PE_EATTR, "required attribute '%s' (%s) is missing",
                   def->attrs[d].name, pe_attr_type_name(def->attrs[d].type));
  return NULL;
}

static pe_status *check_structure(const pe_program *p, const pe_block *b, int i,
                                  const pe_op_desc *op) {
  const pe_op_def *def = pe_op_lookup(op->type);
  if (!def) return OPERR(b, i, op, PE_EUNKNOWN_OP, "unknown op type '%s'", op->type);
  PE_TRY(check_declared(p, b, i, op));
  PE_TRY(check_arity(b, i, op, def));
  PE_TRY(check_attrs(p, b, i, op, def));
  return NULL;
}

/* --- phase 2: inference ------------------------------------------------------ */

/* Compile-time metas of one op, laid out per row slot as infer expects. */
typedef struct meta_bind {
  pe_meta_list *lists; /* [n_inputs + n_outputs] */
  pe_meta *metas;      /* [args] */
  pe_meta **ptrs;      /* [args] */
  const char **names;  /* [args] */
  pe_var_desc **vars;  /* [args] */
} meta_bind;

static void meta_bind_free(meta_bind *mb) {
  free(mb->lists);
  free(mb->metas);
  free(mb->ptrs);
  free(mb->names);
  free(mb->vars);
}

static pe_status *meta_bind_init(meta_bind *mb, const pe_program *p, const pe_block *b,
                                 const pe_op_desc *op, const pe_op_def *def) {
  memset(mb, 0, sizeof(*mb));
  size_t nargs = 0;
  for (int s = 0; s < op->n_in; s++) nargs += (size_t)op->in[s].n;
  for (int s = 0; s < op->n_out; s++) nargs += (size_t)op->out[s].n;
  size_t nl = (size_t)(def->n_inputs + def->n_outputs);
  mb->lists = calloc(nl ? nl : 1, sizeof(*mb->lists));
  mb->metas = calloc(nargs ? nargs : 1, sizeof(*mb->metas));
  mb->ptrs = calloc(nargs ? nargs : 1, sizeof(*mb->ptrs));
  mb->names = calloc(nargs ? nargs : 1, sizeof(*mb->names));
  mb->vars = calloc(nargs ? nargs : 1, sizeof(*mb->vars));
  if (!mb->lists || !mb->metas || !mb->ptrs || !mb->names || !mb->vars) {
    meta_bind_free(mb);
    return pe_error(PE_ENOMEM, "validate: out of memory");
  }
  size_t at = 0;
  for (int dir = 0; dir < 2; dir++) {
    const pe_slot *slots = dir ? op->out : op->in;
    int n = dir ? op->n_out : op->n_in;
    for (int s = 0; s < n; s++) {
      /* Structure was checked: the slot exists in the row. */
      int di = dir ? pe_op_output_index(def, slots[s].name) : pe_op_input_index(def, slots[s].name);
      pe_meta_list *l = &mb->lists[dir ? def->n_inputs + di : di];
      l->n = slots[s].n;
      l->names = &mb->names[at];
      l->m = &mb->ptrs[at];
      for (int k = 0; k < slots[s].n; k++, at++) {
        pe_var_desc *v = pe_program_resolve_var(p, b, slots[s].args[k], NULL);
        mb->vars[at] = v;
        mb->names[at] = slots[s].args[k];
        mb->metas[at] = (pe_meta){v->dtype, v->shape};
        mb->ptrs[at] = &mb->metas[at];
      }
    }
  }
  return NULL;
}

static pe_status *infer_op(const pe_program *p, const pe_block *b, int i, const pe_op_desc *op) {
  const pe_op_def *def = pe_op_lookup(op->type);
  meta_bind mb;
  PE_TRY(meta_bind_init(&mb, p, b, op, def));
  pe_status *st = NULL;
  char s1[PE_SHAPE_STRLEN], s2[PE_SHAPE_STRLEN];
  /* An input without a shape cannot be reasoned about; name it here rather
   * than leave each row's infer to trip over ndim == 0. */
  for (int s = 0; !st && s < def->n_inputs; s++)
    for (int k = 0; !st && k < mb.lists[s].n; k++)
      if (mb.lists[s].m[k]->shape.ndim == 0)
        st = OPERR(b, i, op, PE_ESHAPE,
                   "input %s '%s' has no shape: declare one, or write it with an earlier op",
                   def->inputs[s].name, mb.lists[s].names[k]);
  if (!st) {
    pe_infer_ctx ic = {def, op, i, false, mb.lists, mb.lists + def->n_inputs};
    st = def->infer ? def->infer(&ic) : NULL;
    if (st) st = pe_status_wrap(st, "block %d", b->idx);
  }
  for (int o = 0; !st && o < def->n_outputs; o++) {
    pe_meta_list *l = &mb.lists[def->n_inputs + o];
    for (int k = 0; !st && k < l->n; k++) {
      const pe_meta *m = l->m[k];
      pe_var_desc *v = mb.vars[(size_t)(l->m + k - mb.ptrs)];
      if (m->shape.ndim == 0) continue; /* the row left it alone */
      /* The bound of a declared shape (program_pb.c) holds for inferred ones
       * too (a created tensor's shape attribute, a matmul of two large
       * inputs), so that the passes and kernels multiply within int64_t. */
      pe_status *big = pe_shape_check(&m->shape, PE_MAX_NUMEL, "inferred");
      if (big) {
        st = OPERR(b, i, op, PE_ESHAPE, "output %s '%s': %s", def->outputs[o].name, l->names[k],
                   pe_status_msg(big));
        pe_status_free(big);
        break;
      }
      if (v->shape.ndim == 0) {
        v->dtype = m->dtype;
        v->shape = m->shape;
        continue;
      }
      if (v->dtype != m->dtype)
        st = OPERR(b, i, op, PE_EDTYPE, "output %s '%s': inferred %s %s, declared %s %s",
                   def->outputs[o].name, l->names[k], pe_dtype_name(m->dtype),
                   pe_shape_str(&m->shape, s1, sizeof s1), pe_dtype_name(v->dtype),
                   pe_shape_str(&v->shape, s2, sizeof s2));
      else if (!pe_shape_compatible(&v->shape, &m->shape))
        st = OPERR(b, i, op, PE_ESHAPE,
                   "output %s '%s': inferred shape %s is incompatible with declared %s",
                   def->outputs[o].name, l->names[k], pe_shape_str(&m->shape, s1, sizeof s1),
                   pe_shape_str(&v->shape, s2, sizeof s2));
    }
  }
  meta_bind_free(&mb);
  return st;
}

/* --- entry points --------------------------------------------------------------- */

pe_status *pe_block_validate(pe_program *p, pe_block *b) {
  for (int i = 0; i < b->n_ops; i++) PE_TRY(check_structure(p, b, i, b->ops[i]));
  pe_def_tracker dt;
  PE_TRY(pe_def_tracker_init(&dt));
  pe_status *st = NULL;
  for (int i = 0; !st && i < b->n_ops; i++) {
    st = pe_def_tracker_check(&dt, p, b, i);
    if (!st) st = infer_op(p, b, i, b->ops[i]);
    if (!st) st = pe_def_tracker_write(&dt, b->ops[i]);
  }
  pe_def_tracker_destroy(&dt);
  return st;
}

pe_status *pe_program_validate(pe_program *p) {
  pe_block *main = pe_program_main(p);
  if (!main)
    return pe_error(PE_EINVAL, "program: main block %d does not exist (%d blocks)", p->main_block,
                    p->n_blocks);
  if (p->startup_block != -1 && !pe_program_startup(p))
    return pe_error(PE_EINVAL, "program: startup block %d does not exist (%d blocks)",
                    p->startup_block, p->n_blocks);
  for (int bi = 0; bi < p->n_blocks; bi++)
    if (p->blocks[bi]->idx != bi)
      return pe_error(PE_EINTERNAL, "program: block at %d has idx %d", bi, p->blocks[bi]->idx);
  if (p->loss && !pe_block_find_var(p, main, p->loss))
    return pe_error(PE_EUNKNOWN_VAR, "program: loss '%s' is not declared in main block %d", p->loss,
                    main->idx);
  pe_block *startup = pe_program_startup(p);
  if (startup) PE_TRY(pe_block_validate(p, startup));
  for (int bi = 0; bi < p->n_blocks; bi++)
    if (p->blocks[bi] != startup) PE_TRY(pe_block_validate(p, p->blocks[bi]));
  return NULL;
}
