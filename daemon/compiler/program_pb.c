/* ProgramDesc bytes <-> in-memory IR (ir/program.h).
 *
 * protobuf-c checks the wire format only: proto3 enums arrive as any int32,
 * repeated fields have any length, strings may be empty. Decode therefore
 * checks the structure itself before building the IR: enum values, dims,
 * variable names (non-empty, unique per block, bounded length), block indices
 * (idx == position, parents in range, no parent cycles), main/startup block
 * indices, attribute kinds and optimizer fields. Semantic checks (ops, slots,
 * shapes, order) are pe_program_validate's job.
 *
 * Error messages name the block, variable or op (by index and type) so a
 * client can find the offending entry in its own builder code. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/program.h"
#include "compiler/program_scan.h"
#include "core/names_unique.h"
#include "ops/lr_schedule.h"
#include "program.pb-c.h"

/* Limits on what one program may declare. The transport caps the message
 * size; these keep derived quantities (element counts, name buffers used by
 * the passes) from overflowing. */
#define PB_MAX_NAME 256                 /* bytes in a variable/op/slot/attr name */
#define PB_MAX_BLOCKS 4096

#define MALFORMED(len) \
  pe_error(PE_EINVAL, "malformed ProgramDesc (%zu bytes): not a valid protobuf message", (len))

/* --- structural checks ----------------------------------------------------- */

static pe_status *check_name(const char *what, int block, const char *name) {
  if (!name || !name[0]) return pe_error(PE_EINVAL, "block %d: %s with an empty name", block, what);
  if (strlen(name) >= PB_MAX_NAME)
    return pe_error(PE_EINVAL, "block %d: %s '%.64s...' has a name longer than %d bytes", block,
                    what, name, PB_MAX_NAME - 1);
  return NULL;
}

static pe_status *check_var(int bi, const Pe__VarDesc *v) {
  PE_TRY(check_name("variable", bi, v->name));
  if (!pe_dtype_valid((int)v->dtype))
    return pe_error(PE_EINVAL, "block %d: variable '%s': dtype %d out of range", bi, v->name,
                    (int)v->dtype);
  if (v->n_shape > PE_MAX_DIMS)
    return pe_error(PE_EINVAL, "block %d: variable '%s': %zu dims, at most %d allowed", bi, v->name,
                    v->n_shape, PE_MAX_DIMS);
  int64_t numel = 1;
  for (size_t d = 0; d < v->n_shape; d++) {
    int64_t x = v->shape[d];
    if (x < -1)
      return pe_error(PE_EINVAL, "block %d: variable '%s': dim %zu is %lld (must be >= -1)", bi,
                      v->name, d, (long long)x);
    if (x > 0) {
      if (x > PE_MAX_NUMEL || numel > PE_MAX_NUMEL / x)
        return pe_error(PE_EINVAL, "block %d: variable '%s': shape has more than 2^40 elements", bi,
                        v->name);
      numel *= x;
    }
  }
  if (v->no_weight_decay && !v->persistable)
    return pe_error(PE_EINVAL,
                    "block %d: variable '%s': no_weight_decay is for parameters, but '%s' is not "
                    "persistable",
                    bi, v->name, v->name);
  return NULL;
}

static const char *slot_name_at(const void *list, size_t i) {
  return ((Pe__OpSlot *const *)list)[i]->parameter;
}

static const char *attr_name_at(const void *list, size_t i) {
  return ((Pe__Attr *const *)list)[i]->name;
}

static pe_status *check_slots(int bi, int oi, const Pe__OpDesc *op, Pe__OpSlot *const *slots,
                              size_t n, const char *dir) {
  for (size_t s = 0; s < n; s++) {
    const Pe__OpSlot *sl = slots[s];
    if (!sl->parameter[0] || strlen(sl->parameter) >= PB_MAX_NAME)
      return pe_error(PE_EINVAL, "block %d: op #%d (%s): %s slot %zu has an empty or too long name",
                      bi, oi, op->type, dir, s);
    for (size_t a = 0; a < sl->n_arguments; a++)
      if (!sl->arguments[a][0] || strlen(sl->arguments[a]) >= PB_MAX_NAME)
        return pe_error(PE_EINVAL,
                        "block %d: op #%d (%s): %s slot %s argument %zu is empty or too long", bi,
                        oi, op->type, dir, sl->parameter, a);
  }
  char what[16];
  snprintf(what, sizeof what, "%s slot", dir);
  return pe_status_wrap(pe_names_unique(slots, n, slot_name_at, what), "block %d: op #%d (%s)", bi,
                        oi, op->type);
}

static pe_status *check_op(const Pe__ProgramDesc *pd, int bi, int oi, const Pe__OpDesc *op) {
  if (!op->type[0] || strlen(op->type) >= PB_MAX_NAME)
    return pe_error(PE_EINVAL, "block %d: op #%d has an empty or too long type", bi, oi);
  PE_TRY(check_slots(bi, oi, op, op->inputs, op->n_inputs, "input"));
  PE_TRY(check_slots(bi, oi, op, op->outputs, op->n_outputs, "output"));
  for (size_t a = 0; a < op->n_attrs; a++) {
    const Pe__Attr *at = op->attrs[a];
    if (!at->name[0] || strlen(at->name) >= PB_MAX_NAME)
      return pe_error(PE_EINVAL,
                      "block %d: op #%d (%s): attribute %zu has an empty or too long name", bi, oi,
                      op->type, a);
    if ((unsigned)at->type >= PE_ATTR_TYPE_COUNT)
      return pe_error(PE_EINVAL, "block %d: op #%d (%s): attribute '%s': type %d out of range", bi,
                      oi, op->type, at->name, (int)at->type);
    if (at->type == PE__ATTR_TYPE__BLOCK &&
        (at->block_idx < 0 || (size_t)at->block_idx >= pd->n_blocks))
      return pe_error(PE_EINVAL, "block %d: op #%d (%s): attribute '%s': block %d out of range", bi,
                      oi, op->type, at->name, (int)at->block_idx);
    if (at->n_ints > INT32_MAX || at->n_floats > INT32_MAX || at->n_strings > INT32_MAX ||
        at->n_bools > INT32_MAX)
      return pe_error(PE_EINVAL, "block %d: op #%d (%s): attribute '%s' is too long", bi, oi,
                      op->type, at->name);
  }
  return pe_status_wrap(pe_names_unique(op->attrs, op->n_attrs, attr_name_at, "attribute"),
                        "block %d: op #%d (%s)", bi, oi, op->type);
}

static pe_status *check_block(const Pe__ProgramDesc *pd, int bi) {
  const Pe__BlockDesc *b = pd->blocks[bi];
  if (b->idx != bi)
    return pe_error(PE_EINVAL, "block at position %d has idx %d (must equal its position)", bi,
                    (int)b->idx);
  if (b->parent_idx < -1 || b->parent_idx >= (int32_t)pd->n_blocks)
    return pe_error(PE_EINVAL, "block %d: parent %d out of range", bi, (int)b->parent_idx);
  /* Walk the parent chain: more steps than blocks means a cycle. */
  int cur = bi;
  for (size_t steps = 0; cur >= 0; steps++) {
    if (steps > pd->n_blocks)
      return pe_error(PE_EINVAL, "block %d: parent chain is cyclic (parent %d)", bi,
                      (int)b->parent_idx);
    cur = pd->blocks[cur]->parent_idx;
  }
  if (b->n_vars > INT32_MAX / 2 || b->n_ops > INT32_MAX / 2)
    return pe_error(PE_EINVAL, "block %d: too many variables or ops", bi);
  for (size_t v = 0; v < b->n_vars; v++) PE_TRY(check_var(bi, b->vars[v]));
  for (size_t o = 0; o < b->n_ops; o++) PE_TRY(check_op(pd, bi, (int)o, b->ops[o]));
  return NULL;
}

static bool finite_nonneg(float x) {
  return isfinite(x) && x >= 0.0f;
}

static pe_status *check_program(const Pe__ProgramDesc *pd) {
  if (pd->version > PE_PROGRAM_VERSION)
    return pe_error(PE_EINVAL,
                    "version %u: this daemon reads ProgramDesc versions up to %d (a newer "
                    "client's format; update the daemon)",
                    pd->version, PE_PROGRAM_VERSION);
  if (pd->n_blocks == 0) return pe_error(PE_EINVAL, "ProgramDesc has no blocks");
  if (pd->n_blocks > PB_MAX_BLOCKS)
    return pe_error(PE_EINVAL, "ProgramDesc has %zu blocks, at most %d allowed", pd->n_blocks,
                    PB_MAX_BLOCKS);
  for (size_t i = 0; i < pd->n_blocks; i++) PE_TRY(check_block(pd, (int)i));
  int n = (int)pd->n_blocks;
  if (pd->main_block < 0 || pd->main_block >= n)
    return pe_error(PE_EINVAL, "main_block %d out of range (%d blocks)", (int)pd->main_block, n);
  /* proto3 cannot tell an unset startup_block from 0, so the builder writes
   * -1 for "none"; a startup block equal to the main block is an error. */
  if (pd->startup_block != -1) {
    if (pd->startup_block < 0 || pd->startup_block >= n)
      return pe_error(PE_EINVAL, "startup_block %d out of range (%d blocks; -1 for none)",
                      (int)pd->startup_block, n);
    if (pd->startup_block == pd->main_block)
      return pe_error(PE_EINVAL, "startup_block %d is the main block (use -1 for none)",
                      (int)pd->startup_block);
    if (pd->blocks[pd->startup_block]->parent_idx != -1)
      return pe_error(PE_EINVAL, "startup_block %d is not a root block (parent %d)",
                      (int)pd->startup_block, (int)pd->blocks[pd->startup_block]->parent_idx);
  }
  const Pe__TrainSpec *ts = pd->train;
  if (ts && ts->loss[0] && strlen(ts->loss) >= PB_MAX_NAME)
    return pe_error(PE_EINVAL, "train.loss name is longer than %d bytes", PB_MAX_NAME - 1);
  return NULL;
}

/* --- optimizer ------------------------------------------------------------- */

pe_status *pe_optimizer_decode(const Pe__OptimizerDesc *od, pe_optimizer_desc *out) {
  if (!od->type[0]) return NULL; /* proto3: an empty message is no optimizer */
  if (!pe_optimizer_type_known(od->type))
    return pe_error(PE_EINVAL, "optimizer type '%.64s' unknown (" PE_OPTIMIZER_TYPES ")", od->type);
  if (!isfinite(od->learning_rate) || od->learning_rate <= 0.0f)
    return pe_error(PE_EINVAL, "optimizer %s: learning_rate %g must be finite and > 0", od->type,
                    (double)od->learning_rate);
  if (!finite_nonneg(od->momentum) || od->momentum >= 1.0f)
    return pe_error(PE_EINVAL, "optimizer %s: momentum %g must be in [0, 1)", od->type,
                    (double)od->momentum);
  if (!finite_nonneg(od->beta1) || od->beta1 >= 1.0f || !finite_nonneg(od->beta2) ||
      od->beta2 >= 1.0f)
    return pe_error(PE_EINVAL, "optimizer %s: beta1 %g / beta2 %g must be in [0, 1)", od->type,
                    (double)od->beta1, (double)od->beta2);
  if (!finite_nonneg(od->epsilon))
    return pe_error(PE_EINVAL, "optimizer %s: epsilon %g must be finite and >= 0", od->type,
                    (double)od->epsilon);
  if (!finite_nonneg(od->weight_decay))
    return pe_error(PE_EINVAL, "optimizer %s: weight_decay %g must be finite and >= 0", od->type,
                    (double)od->weight_decay);
  if (!finite_nonneg(od->grad_clip_norm))
    return pe_error(PE_EINVAL, "optimizer %s: grad_clip_norm %g must be finite and >= 0", od->type,
                    (double)od->grad_clip_norm);
  pe_optimizer_desc o = {0};
  const Pe__LrSchedule *ls = od->lr_schedule;
  if (ls && ls->type[0]) {
    if (ls->n_milestones > PE_LR_MAX_MILESTONES)
      return pe_error(PE_EINVAL, "optimizer %s: lr_schedule %.64s: %zu milestones (at most %d)",
                      od->type, ls->type, ls->n_milestones, PE_LR_MAX_MILESTONES);
    o.sched.type = (char *)ls->type; /* borrowed until the check passes */
    o.sched.warmup_steps = ls->warmup_steps;
    o.sched.decay_steps = ls->decay_steps;
    o.sched.gamma = ls->gamma;
    o.sched.min_lr = ls->min_lr;
    o.sched.n_milestones = (int)ls->n_milestones;
    for (size_t i = 0; i < ls->n_milestones; i++) o.sched.milestones[i] = ls->milestones[i];
    pe_lr_params lp;
    PE_TRY(pe_status_wrap(pe_lr_params_from_desc(&o.sched, od->learning_rate, &lp), "optimizer %s",
                          od->type));
  }
  o.type = strdup(od->type);
  o.sched.type = o.sched.type ? strdup(o.sched.type) : NULL;
  if (!o.type || (ls && ls->type[0] && !o.sched.type)) {
    free(o.type);
    free(o.sched.type);
    return pe_error(PE_ENOMEM, "decode: out of memory (optimizer)");
  }
  o.lr = od->learning_rate;
  o.momentum = od->momentum;
  o.nesterov = od->nesterov;
  o.beta1 = od->beta1;
  o.beta2 = od->beta2;
  o.epsilon = od->epsilon;
  o.weight_decay = od->weight_decay;
  o.grad_clip_norm = od->grad_clip_norm;
  free(out->type);
  free(out->sched.type);
  *out = o;
  return NULL;
}

/* --- decode: protobuf-c -> IR ----------------------------------------------- */

/* a as an IR attribute appended to op (check_op found its name unique
 * in op): the IR copies the wire's values. */
static pe_status *decode_attr(pe_op_desc *op, const Pe__Attr *a) {
  pe_attr x = {.name = a->name, .type = (pe_attr_type)a->type, .i = a->i, .f = a->f, .s = a->s};
  switch (x.type) {
    case PE_ATTR_BOOL: x.i = a->b != 0; break;
    case PE_ATTR_BLOCK: x.i = a->block_idx; break;
    case PE_ATTR_INTS:
      x.n = (int)a->n_ints;
      x.ints = a->ints;
      break;
    case PE_ATTR_FLOATS:
      x.n = (int)a->n_floats;
      x.floats = a->floats;
      break;
    case PE_ATTR_STRINGS:
      x.n = (int)a->n_strings;
      x.strings = a->strings;
      break;
    case PE_ATTR_BOOLS: {
      x.n = (int)a->n_bools;
      x.ints = malloc(a->n_bools ? a->n_bools * sizeof(int64_t) : 1);
      if (!x.ints) return pe_error(PE_ENOMEM, "decode: out of memory (attr '%s')", a->name);
      for (size_t i = 0; i < a->n_bools; i++) x.ints[i] = a->bools[i] != 0;
      pe_status *st = pe_op_append_attr(op, &x);
      free(x.ints);
      return st;
    }
    default: break;
  }
  return pe_op_append_attr(op, &x);
}

static pe_status *decode_op(pe_block *b, const Pe__OpDesc *od) {
  pe_op_desc *op;
  PE_TRY(pe_block_append_op(b, od->type, &op));
  for (size_t s = 0; s < od->n_inputs; s++)
    PE_TRY(pe_op_append_input(op, od->inputs[s]->parameter, (int)od->inputs[s]->n_arguments,
                              (const char *const *)od->inputs[s]->arguments));
  for (size_t s = 0; s < od->n_outputs; s++)
    PE_TRY(pe_op_append_output(op, od->outputs[s]->parameter, (int)od->outputs[s]->n_arguments,
                               (const char *const *)od->outputs[s]->arguments));
  for (size_t a = 0; a < od->n_attrs; a++) PE_TRY(decode_attr(op, od->attrs[a]));
  return NULL;
}

static pe_status *decode_block(pe_program *p, const Pe__BlockDesc *bd) {
  pe_block *b;
  PE_TRY(pe_program_add_block(p, bd->parent_idx, &b));
  for (size_t v = 0; v < bd->n_vars; v++) {
    const Pe__VarDesc *vd = bd->vars[v];
    pe_shape sh = pe_shape_make((int)vd->n_shape, vd->shape);
    pe_var_desc *var;
    pe_status *st = pe_block_add_var(b, vd->name, (pe_dtype)vd->dtype, &sh, &var);
    if (st) return st; /* "declared twice" names block and variable */
    var->persistable = vd->persistable;
    var->stop_gradient = vd->stop_gradient;
    var->is_feed = vd->is_feed;
    var->no_weight_decay = vd->no_weight_decay;
  }
  for (size_t o = 0; o < bd->n_ops; o++) PE_TRY(decode_op(b, bd->ops[o]));
  return NULL;
}

static pe_status *decode_into(pe_program *p, const Pe__ProgramDesc *pd) {
  PE_TRY(check_program(pd));
  p->version = pd->version;
  p->main_block = pd->main_block;
  p->startup_block = pd->startup_block;
  for (size_t i = 0; i < pd->n_blocks; i++) PE_TRY(decode_block(p, pd->blocks[i]));
  const Pe__TrainSpec *ts = pd->train;
  if (ts && ts->loss[0] && !(p->loss = strdup(ts->loss)))
    return pe_error(PE_ENOMEM, "decode: out of memory");
  if (ts && ts->optimizer) PE_TRY(pe_optimizer_decode(ts->optimizer, &p->opt));
  return NULL;
}

pe_status *pe_program_decode(const uint8_t *buf, size_t len, pe_program **out) {
  static const pe_decode_limits none = {0};
  return pe_program_decode_limited(buf, len, &none, out);
}

pe_status *pe_program_decode_limited(const uint8_t *buf, size_t len, const pe_decode_limits *lim,
                                     pe_program **out) {
  *out = NULL;
  if (!buf && len) return pe_error(PE_EINVAL, "malformed ProgramDesc: NULL buffer");
  PE_TRY(pe_program_scan(buf, len, lim));
  Pe__ProgramDesc *pd = pe__program_desc__unpack(lim->alloc, len, buf);
  if (!pd) return MALFORMED(len);
  pe_program *p = pe_program_new();
  pe_status *st = p ? decode_into(p, pd) : pe_error(PE_ENOMEM, "decode: out of memory");
  pe__program_desc__free_unpacked(pd, lim->alloc);
  if (st) {
    pe_program_free(p);
    return pe_status_wrap(st, "ProgramDesc");
  }
  *out = p;
  return NULL;
}

/* --- encode: IR -> protobuf-c ------------------------------------------------ */

/* The protobuf-c structs borrow the IR's strings and number arrays; only the
 * pointer arrays and the per-message structs are allocated here, in one
 * arena-like list so that cleanup is a loop. */
typedef struct enc {
  void **blocks; /* everything malloc'd */
  size_t n, cap;
  bool oom;
} enc;

static void *enc_alloc(enc *e, size_t size) {
  if (e->oom) return NULL;
  if (e->n == e->cap) {
    size_t nc = e->cap ? e->cap * 2 : 64;
    void **nb = realloc(e->blocks, nc * sizeof(*nb));
    if (!nb) {
      e->oom = true;
      return NULL;
    }
    e->blocks = nb;
    e->cap = nc;
  }
  void *m = calloc(1, size ? size : 1);
  if (!m) {
    e->oom = true;
    return NULL;
  }
  e->blocks[e->n++] = m;
  return m;
}

static void enc_free(enc *e) {
  for (size_t i = 0; i < e->n; i++) free(e->blocks[i]);
  free(e->blocks);
}

static Pe__OpSlot **enc_slots(enc *e, const pe_slot *s, int n) {
  Pe__OpSlot **arr = enc_alloc(e, (size_t)n * sizeof(*arr));
  for (int i = 0; arr && i < n; i++) {
    Pe__OpSlot *m = enc_alloc(e, sizeof(*m));
    if (!m) return NULL;
    pe__op_slot__init(m);
    m->parameter = s[i].name;
    m->n_arguments = (size_t)s[i].n;
    m->arguments = s[i].args;
    arr[i] = m;
  }
  return arr;
}

static Pe__Attr *enc_attr(enc *e, const pe_attr *a) {
  Pe__Attr *m = enc_alloc(e, sizeof(*m));
  if (!m) return NULL;
  pe__attr__init(m);
  m->name = a->name;
  m->type = (Pe__AttrType)a->type;
  switch (a->type) {
    case PE_ATTR_INT:
    case PE_ATTR_LONG: m->i = a->i; break;
    case PE_ATTR_BOOL: m->b = a->i != 0; break;
    case PE_ATTR_BLOCK: m->block_idx = (int32_t)a->i; break;
    case PE_ATTR_FLOAT: m->f = a->f; break;
    case PE_ATTR_STRING: m->s = a->s ? a->s : (char *)protobuf_c_empty_string; break;
    case PE_ATTR_INTS:
      m->n_ints = (size_t)a->n;
      m->ints = a->ints;
      break;
    case PE_ATTR_FLOATS:
      m->n_floats = (size_t)a->n;
      m->floats = a->floats;
      break;
    case PE_ATTR_STRINGS:
      m->n_strings = (size_t)a->n;
      m->strings = a->strings;
      break;
    case PE_ATTR_BOOLS: {
      protobuf_c_boolean *v = enc_alloc(e, (size_t)a->n * sizeof(*v));
      if (!v) return NULL;
      for (int i = 0; i < a->n; i++) v[i] = a->ints[i] != 0;
      m->n_bools = (size_t)a->n;
      m->bools = v;
      break;
    }
    default: break;
  }
  return m;
}

static Pe__OpDesc *enc_op(enc *e, const pe_op_desc *op) {
  Pe__OpDesc *m = enc_alloc(e, sizeof(*m));
  if (!m) return NULL;
  pe__op_desc__init(m);
  m->type = op->type;
  m->n_inputs = (size_t)op->n_in;
  m->inputs = enc_slots(e, op->in, op->n_in);
  m->n_outputs = (size_t)op->n_out;
  m->outputs = enc_slots(e, op->out, op->n_out);
  m->n_attrs = (size_t)op->n_attr;
  m->attrs = enc_alloc(e, (size_t)op->n_attr * sizeof(*m->attrs));
  for (int i = 0; m->attrs && i < op->n_attr; i++) m->attrs[i] = enc_attr(e, &op->attrs[i]);
  return m;
}

static Pe__BlockDesc *enc_block(enc *e, const pe_block *b, int position) {
  Pe__BlockDesc *m = enc_alloc(e, sizeof(*m));
  if (!m) return NULL;
  pe__block_desc__init(m);
  m->idx = position;
  m->parent_idx = b->parent;
  m->n_vars = (size_t)b->n_vars;
  m->vars = enc_alloc(e, (size_t)b->n_vars * sizeof(*m->vars));
  for (int i = 0; m->vars && i < b->n_vars; i++) {
    const pe_var_desc *v = b->vars[i];
    Pe__VarDesc *vm = enc_alloc(e, sizeof(*vm));
    if (!vm) return NULL;
    pe__var_desc__init(vm);
    vm->name = v->name;
    vm->dtype = (Pe__DataType)v->dtype;
    vm->n_shape = (size_t)v->shape.ndim;
    vm->shape = (int64_t *)v->shape.d;
    vm->persistable = v->persistable;
    vm->stop_gradient = v->stop_gradient;
    vm->is_feed = v->is_feed;
    vm->no_weight_decay = v->no_weight_decay;
    m->vars[i] = vm;
  }
  m->n_ops = (size_t)b->n_ops;
  m->ops = enc_alloc(e, (size_t)b->n_ops * sizeof(*m->ops));
  for (int i = 0; m->ops && i < b->n_ops; i++) m->ops[i] = enc_op(e, b->ops[i]);
  return m;
}

pe_status *pe_program_encode(const pe_program *p, uint8_t **buf, size_t *len) {
  *buf = NULL;
  *len = 0;
  enc e = {0};
  Pe__ProgramDesc pd = PE__PROGRAM_DESC__INIT;
  Pe__TrainSpec ts = PE__TRAIN_SPEC__INIT;
  Pe__OptimizerDesc od = PE__OPTIMIZER_DESC__INIT;
  Pe__LrSchedule ls = PE__LR_SCHEDULE__INIT;
  pd.version = p->version;
  pd.main_block = p->main_block;
  pd.startup_block = p->startup_block;
  pd.n_blocks = (size_t)p->n_blocks;
  pd.blocks = enc_alloc(&e, (size_t)p->n_blocks * sizeof(*pd.blocks));
  for (int i = 0; pd.blocks && i < p->n_blocks; i++) pd.blocks[i] = enc_block(&e, p->blocks[i], i);
  if (p->loss || p->opt.type) {
    ts.loss = p->loss ? p->loss : (char *)protobuf_c_empty_string;
    if (p->opt.type) {
      od.type = p->opt.type;
      od.learning_rate = p->opt.lr;
      od.momentum = p->opt.momentum;
      od.nesterov = p->opt.nesterov;
      od.beta1 = p->opt.beta1;
      od.beta2 = p->opt.beta2;
      od.epsilon = p->opt.epsilon;
      od.weight_decay = p->opt.weight_decay;
      od.grad_clip_norm = p->opt.grad_clip_norm;
      if (p->opt.sched.type) {
        ls.type = p->opt.sched.type;
        ls.warmup_steps = p->opt.sched.warmup_steps;
        ls.decay_steps = p->opt.sched.decay_steps;
        ls.gamma = p->opt.sched.gamma;
        ls.min_lr = p->opt.sched.min_lr;
        ls.n_milestones = (size_t)p->opt.sched.n_milestones;
        ls.milestones = (int64_t *)p->opt.sched.milestones;
        od.lr_schedule = &ls;
      }
      ts.optimizer = &od;
    }
    pd.train = &ts;
  }
  pe_status *st = NULL;
  if (e.oom) {
    st = pe_error(PE_ENOMEM, "encode: out of memory");
  } else {
    size_t n = pe__program_desc__get_packed_size(&pd);
    uint8_t *b = malloc(n ? n : 1);
    if (!b) {
      st = pe_error(PE_ENOMEM, "encode: out of memory (%zu bytes)", n);
    } else {
      *len = pe__program_desc__pack(&pd, b);
      *buf = b;
    }
  }
  enc_free(&e);
  return st;
}
