/* lr_schedule: the learning rate of this step from a step counter
 * (ops/lr_schedule.h has the formula).
 *
 *   Step [1] int64 in, StepOut [1] int64 = Step + 1, LearningRate [1] f32
 *
 * The optimizer pass appends one before the update ops, with StepOut bound to
 * the persistable counter it reads (in place, like an optimizer's state) and
 * LearningRate to the persistable learning_rate the updates read. So the
 * counter is model state: checkpointed, restored, replayed and settable with
 * the parameters, and every place of a data-parallel model computes the same
 * rate from its own replica of it (no collective). */
#include <string.h>

#include "ops/lr_schedule.h"
#include "ops/op_tables.h"

enum { SCH_STEP = 0 };
enum { SCH_STEP_OUT = 0, SCH_LR };

pe_status *pe_lr_params_from_op(const pe_op_def *d, const pe_op_desc *op, pe_lr_params *out) {
  memset(out, 0, sizeof *out);
  const char *kind = pe_attr_s(d, op, "schedule");
  if (!pe_lr_kind_parse(kind, &out->kind))
    return pe_error(PE_EATTR, "attribute schedule = '%.32s' unknown (%s)", kind, pe_lr_kind_list());
  out->base = pe_attr_f(d, op, "base_lr");
  out->gamma = pe_attr_f(d, op, "gamma");
  out->min_lr = pe_attr_f(d, op, "min_lr");
  out->warmup = pe_attr_i(d, op, "warmup_steps");
  out->decay_steps = pe_attr_i(d, op, "decay_steps");
  const int64_t *ms = NULL;
  int n = pe_attr_ints(op, "milestones", &ms);
  out->n_milestones = n;
  if (n > PE_LR_MAX_MILESTONES)
    return pe_error(PE_EATTR, "attribute milestones: %d values (at most %d)", n,
                    PE_LR_MAX_MILESTONES);
  if (n > 0) memcpy(out->milestones, ms, (size_t)n * sizeof(int64_t));
  pe_status *st = pe_lr_params_check(out);
  if (st) st->code = PE_EATTR;
  return st;
}

static pe_status *schedule_infer(pe_infer_ctx *c) {
  pe_lr_params p;
  pe_status *st = pe_lr_params_from_op(c->def, c->desc, &p);
  if (st) {
    pe_status *e = pe_infer_error(c, st->code, "%s", st->msg);
    pe_status_free(st);
    return e;
  }
  pe_meta *m = pe_in_meta(c, SCH_STEP, 0);
  if (!m) return pe_infer_error(c, PE_EARITY, "missing input Step");
  if (m->dtype != PE_I64 || m->shape.ndim != 1 || m->shape.d[0] != 1) {
    char sa[PE_SHAPE_STRLEN];
    return pe_infer_error(c, m->dtype != PE_I64 ? PE_EDTYPE : PE_ESHAPE,
                          "Step '%s' is %s %s; it must be [1] int64 (the step counter)",
                          pe_in_name(c, SCH_STEP, 0), pe_dtype_name(m->dtype),
                          pe_shape_str(&m->shape, sa, sizeof sa));
  }
  pe_infer_set(c, SCH_STEP_OUT, PE_I64, &m->shape);
  pe_infer_set(c, SCH_LR, PE_F32, &m->shape);
  return NULL;
}

static pe_status *schedule_kernel(pe_kernel_ctx *c) {
  pe_lr_params p;
  PE_TRY(pe_lr_params_from_op(c->def, c->desc, &p));
  int64_t s = ((const int64_t *)pe_kin(c, SCH_STEP, 0)->data)[0];
  if (s < 0) s = 0;
  ((float *)pe_kout(c, SCH_LR, 0)->data)[0] = (float)pe_lr_at(&p, s);
  ((int64_t *)pe_kout(c, SCH_STEP_OUT, 0)->data)[0] = s < INT64_MAX ? s + 1 : s;
  return NULL;
}

static const pe_slot_def schedule_in[] = {{"Step", 1, 1, PE_SLOT_NO_GRAD}, {NULL}};
static const pe_slot_def schedule_out[] = {{"StepOut", 1, 1, 0}, {"LearningRate", 1, 1, 0}, {NULL}};
static const pe_attr_def schedule_attrs[] = {
    {"schedule", PE_ATTR_STRING, true, 0, NULL},    {"base_lr", PE_ATTR_FLOAT, true, 0, NULL},
    {"warmup_steps", PE_ATTR_LONG, false, 0, NULL}, {"decay_steps", PE_ATTR_LONG, false, 0, NULL},
    {"gamma", PE_ATTR_FLOAT, false, 0, NULL},       {"min_lr", PE_ATTR_FLOAT, false, 0, NULL},
    {"milestones", PE_ATTR_INTS, false, 0, NULL},   {NULL},
};

const pe_op_def pe_ops_schedule[] = {
    {.type = "lr_schedule",
     .inputs = schedule_in,
     .outputs = schedule_out,
     .attrs = schedule_attrs,
     .flags = PE_OP_NO_GRAD,
     .infer = schedule_infer,
     .kernel_cpu = schedule_kernel},
    {0},
};
