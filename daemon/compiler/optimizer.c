/* The optimizer pass: one update op per trainable parameter (pass.h).
 *
 * Trainable parameters are the main block's variables that are persistable,
 * not stop_gradient, and have a "<name>@GRAD" variable (declared by the
 * backward pass), in declaration order. Everything the updates read besides
 * the gradient is persistable state, declared in the main block (so that the
 * model scope holds it) and initialised by fill_constant ops appended to the
 * startup block, which is created when the program has none (a program's
 * own startup block must initialise every trainable parameter:
 * check_initialised):
 *   learning_rate            [1]          = opt.lr
 *   <p>@VELOCITY             shape of p   = 0        (momentum)
 *   <p>@MOMENT1, @MOMENT2    shape of p   = 0        (adam)
 *   <p>@BETA1POW, @BETA2POW  [1]          = beta1, beta2 (adam)
 * The update ops write the parameter and its state in place. The optimizer
 * kind is a table row: adding one is a row plus its state list.
 * opt.weight_decay > 0 sets every update op's L2 regularisation (the
 * attributes regularization_method "l2_decay" and regularization_coeff, as
 * Paddle's momentum op has them): the kernel adds coeff * Param to the
 * gradient, so the all-reduced gradient stays the loss's own and every
 * strategy (sharded slices included) decays each element once. "adamw" is
 * the adam op with regularization_method "decoupled_decay" (weight_decay 0
 * means PyTorch's default 0.01). Parameters marked no_weight_decay get
 * neither attribute.
 * opt.grad_clip_norm > 0 appends one clip_by_global_norm op over every
 * trainable parameter's gradient, writing <p>@GRAD@CLIP (temporaries) and
 * the norm @GRAD_GLOBAL_NORM@ (fetchable); the updates read the clipped
 * gradients. On several places it reads the all-reduced gradients, so
 * every replica clips alike (the data-parallel pass allows it under
 * AllReduce only).
 * A learning-rate schedule (opt.sched) adds the persistable step counter
 *   @LR_DECAY_COUNTER@       [1] int64    = 0
 * and one lr_schedule op before the updates, which writes learning_rate from
 * the counter and advances it (Paddle's @LR_DECAY_COUNTER@ and its decay ops,
 * fused into one op).
 * A parameter with a sparse gradient (<p>@GRAD@ROWS declared: an embedding
 * with is_sparse) gets GradRows on its update op, and adam's lazy_mode
 * (only the rows of the batch move); grad_clip_norm and weight decay,
 * which touch every row, are an error naming the parameter. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/pass.h"
#include "ops/lr_schedule.h"
#include "ops/registry.h"

#define LR_NAME PE_LR_NAME
#define CLIP_SUFFIX "@CLIP"

typedef struct opt_state {
  const char *suffix;   /* "@VELOCITY" */
  const char *in_slot;  /* "Velocity" */
  const char *out_slot; /* "VelocityOut" */
  bool scalar;          /* [1] instead of the parameter's shape */
  int init;             /* 0: zero, 1: beta1, 2: beta2 */
} opt_state;

typedef struct opt_kind {
  const char *type;  /* optimizer name (OptimizerDesc.type) */
  const char *op;    /* update op type */
  const char *decay; /* regularization_method of weight_decay */
  opt_state states[5];
} opt_kind;

// clang-format off
#define ADAM_STATES                                  \
  {{"@MOMENT1", "Moment1", "Moment1Out", false, 0},  \
   {"@MOMENT2", "Moment2", "Moment2Out", false, 0},  \
   {"@BETA1POW", "Beta1Pow", "Beta1PowOut", true, 1}, \
   {"@BETA2POW", "Beta2Pow", "Beta2PowOut", true, 2}, \
   {0}}
// clang-format on

static const opt_kind kinds[] = {
    {"sgd", "sgd", "l2_decay", {{0}}},
    {"momentum", "momentum", "l2_decay", {{"@VELOCITY", "Velocity", "VelocityOut", false, 0}, {0}}},
    {"adam", "adam", "l2_decay", ADAM_STATES},
    {"adamw", "adam", "decoupled_decay", ADAM_STATES},
};

static const opt_kind *find_kind(const char *type) {
  for (size_t i = 0; type && i < sizeof kinds / sizeof kinds[0]; i++)
    if (strcmp(kinds[i].type, type) == 0) return &kinds[i];
  return NULL;
}

bool pe_optimizer_type_known(const char *type) {
  return find_kind(type) != NULL;
}

/* Hyper-parameters with proto3's "0 means unset" resolved. */
typedef struct hyper {
  float lr, mu, beta1, beta2, eps, weight_decay;
  bool nesterov;
} hyper;

/* The names the ops of block b write (a map: a scan of the block per
 * parameter made a large program's register quadratic). */
static bool block_outputs(const pe_block *b, pe_strmap *out) {
  for (int i = 0; i < b->n_ops; i++)
    for (int s = 0; s < b->ops[i]->n_out; s++)
      for (int a = 0; a < b->ops[i]->out[s].n; a++)
        if (!pe_strmap_put(out, b->ops[i]->out[s].args[a], NULL)) return false;
  return true;
}

/* A program's own startup block initialises every trainable parameter:
 * one it leaves out would have no value at any run after Init (a program
 * without a startup block gets its values from SetParams or Load). */
static pe_status *check_initialised(const pe_program *p, const pe_var_desc *const *params, int n) {
  const pe_block *s = pe_program_startup(p);
  if (!s) return NULL;
  pe_strmap written;
  pe_strmap_init(&written);
  pe_status *st =
      block_outputs(s, &written) ? NULL : pe_error(PE_ENOMEM, "optimizer: out of memory");
  for (int i = 0; !st && i < n; i++)
    if (!pe_strmap_has(&written, params[i]->name)) {
      char sb[PE_SHAPE_STRLEN];
      st = pe_error(PE_EUSE_BEFORE_DEF,
                    "trainable parameter '%s' (%s %s) has no initialiser in the startup block "
                    "(block %d): add one (e.g. fill_constant or uniform_random), mark it "
                    "stop_gradient, or leave the startup block out and set every value with "
                    "SetParams or Load",
                    params[i]->name, pe_dtype_name(params[i]->dtype),
                    pe_shape_str(&params[i]->shape, sb, sizeof sb), s->idx);
    }
  pe_strmap_destroy(&written);
  return st;
}

static pe_status *startup_block(pe_program *p, pe_block **out) {
  pe_block *s = pe_program_startup(p);
  if (!s) {
    PE_TRY(pe_program_add_block(p, -1, &s));
    p->startup_block = s->idx;
  }
  *out = s;
  return NULL;
}

/* Declare persistable state `name` in the main block and initialise it to
 * `value` in the startup block. */
static pe_status *add_state(pe_block *main, pe_block *startup, const char *name, pe_dtype dt,
                            const pe_shape *shape, float value) {
  char sb[PE_SHAPE_STRLEN];
  if (shape->ndim == 0 || pe_shape_numel(shape) < 0)
    return pe_error(PE_ESHAPE,
                    "optimizer: state '%s' would have shape %s; parameters need a "
                    "static shape",
                    name, pe_shape_str(shape, sb, sizeof sb));
  pe_var_desc *v;
  PE_TRY(pe_block_add_var(main, name, dt, shape, &v));
  v->persistable = true;
  v->stop_gradient = true;
  pe_op_desc *f;
  PE_TRY(pe_block_append_op(startup, "fill_constant", &f));
  PE_TRY(pe_op_output1(f, "Out", name));
  PE_TRY(pe_op_set_ints(f, "shape", shape->ndim, shape->d));
  PE_TRY(pe_op_set_float(f, "value", value));
  PE_TRY(pe_op_set_int(f, "dtype", (int64_t)dt));
  return NULL;
}

/* The gradient an update of param reads: clipped or backward's. */
static void update_grad(const pe_var_desc *param, bool clipped, char grad[512]) {
  snprintf(grad, 512, "%s" PE_GRAD_SUFFIX "%s", param->name, clipped ? CLIP_SUFFIX : "");
}

/* One clip_by_global_norm over the n parameters' gradients. */
static pe_status *add_clip(pe_block *main, const pe_var_desc *const *params, int n,
                           float max_norm) {
  char **in = calloc((size_t)n, sizeof *in), **out = calloc((size_t)n, sizeof *out);
  pe_status *st = in && out ? NULL : pe_error(PE_ENOMEM, "optimizer: out of memory");
  for (int i = 0; !st && i < n; i++) {
    in[i] = malloc(512);
    out[i] = malloc(512);
    if (!in[i] || !out[i]) {
      st = pe_error(PE_ENOMEM, "optimizer: out of memory");
      break;
    }
    update_grad(params[i], false, in[i]);
    update_grad(params[i], true, out[i]);
    pe_var_desc *v;
    st = pe_block_add_var(main, out[i], params[i]->dtype, &params[i]->shape, &v);
    if (!st) v->stop_gradient = true;
  }
  pe_shape one = PE_SHAPE(1);
  pe_var_desc *nv;
  if (!st) st = pe_block_add_var(main, PE_GRAD_NORM_NAME, PE_F32, &one, &nv);
  if (!st) nv->stop_gradient = true;
  pe_op_desc *op;
  if (!st) st = pe_block_append_op(main, "clip_by_global_norm", &op);
  if (!st) st = pe_op_set_input(op, "X", n, (const char *const *)in);
  if (!st) st = pe_op_set_output(op, "Out", n, (const char *const *)out);
  if (!st) st = pe_op_output1(op, "GlobalNorm", PE_GRAD_NORM_NAME);
  if (!st) st = pe_op_set_float(op, "max_norm", max_norm);
  for (int i = 0; i < n && in && out; i++) free(in[i]), free(out[i]);
  free(in);
  free(out);
  return st;
}

/* The rows of param's gradient when it is sparse, else NULL. */
static const pe_var_desc *sparse_rows(const pe_block *main, const pe_var_desc *param) {
  char rows[512];
  snprintf(rows, sizeof rows, "%s" PE_GRAD_SUFFIX PE_ROWS_SUFFIX, param->name);
  return pe_block_find_var_local(main, rows);
}

/* What a sparse gradient cannot take: clipping by the global norm and
 * weight decay (both read or write every row). */
static pe_status *check_sparse(const pe_block *main, const pe_var_desc *param, const hyper *h,
                               bool clip) {
  const pe_var_desc *rows = sparse_rows(main, param);
  if (!rows) return NULL;
  if (clip)
    return pe_error(PE_EINVAL,
                    "grad_clip_norm needs dense gradients; parameter '%s' has a sparse gradient "
                    "(rows '%s', lookup_table_v2 is_sparse): set is_sparse false or "
                    "grad_clip_norm 0",
                    param->name, rows->name);
  if (h->weight_decay > 0.0f && !param->no_weight_decay)
    return pe_error(PE_EINVAL,
                    "weight_decay %g decays every row; parameter '%s' has a sparse gradient (rows "
                    "'%s', lookup_table_v2 is_sparse): set is_sparse false, weight_decay 0, or "
                    "mark '%s' no_weight_decay",
                    (double)h->weight_decay, param->name, rows->name, param->name);
  return NULL;
}

static pe_status *add_update(pe_block *main, pe_block *startup, const opt_kind *k, const hyper *h,
                             const pe_var_desc *param, bool clipped) {
  char grad[512], state[512];
  update_grad(param, clipped, grad);
  const pe_var_desc *rows = sparse_rows(main, param);
  pe_op_desc *op;
  PE_TRY(pe_block_append_op(main, k->op, &op));
  PE_TRY(pe_op_input1(op, "Param", param->name));
  PE_TRY(pe_op_input1(op, "Grad", grad));
  if (rows) PE_TRY(pe_op_input1(op, "GradRows", rows->name));
  PE_TRY(pe_op_input1(op, "LearningRate", LR_NAME));
  PE_TRY(pe_op_output1(op, "ParamOut", param->name));
  for (const opt_state *s = k->states; s->suffix; s++) {
    snprintf(state, sizeof state, "%s%s", param->name, s->suffix);
    pe_shape one = PE_SHAPE(1);
    float init = s->init == 1 ? h->beta1 : s->init == 2 ? h->beta2 : 0.0f;
    PE_TRY(add_state(main, startup, state, param->dtype, s->scalar ? &one : &param->shape, init));
    PE_TRY(pe_op_input1(op, s->in_slot, state));
    PE_TRY(pe_op_output1(op, s->out_slot, state));
  }
  if (strcmp(k->op, "momentum") == 0) {
    PE_TRY(pe_op_set_float(op, "mu", h->mu));
    PE_TRY(pe_op_set_bool(op, "use_nesterov", h->nesterov));
  } else if (strcmp(k->op, "adam") == 0) {
    PE_TRY(pe_op_set_float(op, "beta1", h->beta1));
    PE_TRY(pe_op_set_float(op, "beta2", h->beta2));
    PE_TRY(pe_op_set_float(op, "epsilon", h->eps));
    if (rows) PE_TRY(pe_op_set_bool(op, "lazy_mode", true));
  }
  if (h->weight_decay > 0.0f && !param->no_weight_decay) {
    PE_TRY(pe_op_set_string(op, "regularization_method", k->decay));
    PE_TRY(pe_op_set_float(op, "regularization_coeff", h->weight_decay));
  }
  return NULL;
}

/* The step counter and the lr_schedule op that writes learning_rate. */
static pe_status *add_schedule(pe_block *main, pe_block *startup, const pe_optimizer_desc *o) {
  pe_lr_params lp;
  PE_TRY(pe_lr_params_from_desc(&o->sched, o->lr, &lp));
  pe_shape one = PE_SHAPE(1);
  if (pe_block_find_var_local(main, PE_LR_COUNTER_NAME))
    return pe_error(PE_EINVAL, "optimizer: variable '%s' already exists", PE_LR_COUNTER_NAME);
  PE_TRY(add_state(main, startup, PE_LR_COUNTER_NAME, PE_I64, &one, 0.0f));
  pe_op_desc *op;
  PE_TRY(pe_block_append_op(main, "lr_schedule", &op));
  PE_TRY(pe_op_input1(op, "Step", PE_LR_COUNTER_NAME));
  PE_TRY(pe_op_output1(op, "StepOut", PE_LR_COUNTER_NAME));
  PE_TRY(pe_op_output1(op, "LearningRate", LR_NAME));
  PE_TRY(pe_op_set_string(op, "schedule", pe_lr_kind_name(lp.kind)));
  PE_TRY(pe_op_set_float(op, "base_lr", o->lr));
  PE_TRY(pe_op_set_long(op, "warmup_steps", lp.warmup));
  PE_TRY(pe_op_set_long(op, "decay_steps", lp.decay_steps));
  PE_TRY(pe_op_set_float(op, "gamma", (float)lp.gamma));
  PE_TRY(pe_op_set_float(op, "min_lr", (float)lp.min_lr));
  if (lp.n_milestones > 0) PE_TRY(pe_op_set_ints(op, "milestones", lp.n_milestones, lp.milestones));
  return NULL;
}

pe_status *pe_pass_optimizer(pe_ir *ir) {
  pe_program *p = ir->prog;
  if (!p->opt.type) return NULL;
  const opt_kind *k = find_kind(p->opt.type);
  if (!k)
    return pe_error(PE_EINVAL, "optimizer: unknown type '%s' (" PE_OPTIMIZER_TYPES ")",
                    p->opt.type);
  hyper h = {p->opt.lr,
             p->opt.momentum != 0.0f ? p->opt.momentum : 0.9f,
             p->opt.beta1 != 0.0f ? p->opt.beta1 : 0.9f,
             p->opt.beta2 != 0.0f ? p->opt.beta2 : 0.999f,
             p->opt.epsilon != 0.0f ? p->opt.epsilon : 1e-8f,
             p->opt.weight_decay != 0.0f || strcmp(k->decay, "decoupled_decay") != 0
                 ? p->opt.weight_decay
                 : PE_ADAMW_DEFAULT_DECAY,
             p->opt.nesterov};
  if (!(h.lr > 0.0f))
    return pe_error(PE_EINVAL, "optimizer %s: learning rate %g must be > 0", k->type, (double)h.lr);
  if (!(h.weight_decay >= 0.0f) || !isfinite(h.weight_decay))
    return pe_error(PE_EINVAL, "optimizer %s: weight_decay %g must be finite and >= 0", k->type,
                    (double)h.weight_decay);
  pe_block *main = pe_program_main(p);
  if (!main) return pe_error(PE_EINVAL, "optimizer: no main block");
  if (pe_block_find_var(p, main, LR_NAME))
    return pe_error(PE_EINVAL, "optimizer: variable '%s' already exists (optimizer ran twice?)",
                    LR_NAME);

  /* Collect first: the loop below declares new variables in main. */
  int n_vars = main->n_vars, n_params = 0;
  const pe_var_desc **params = calloc((size_t)n_vars + 1, sizeof(*params));
  if (!params) return pe_error(PE_ENOMEM, "optimizer: out of memory");
  char grad[512];
  for (int i = 0; i < n_vars; i++) {
    const pe_var_desc *v = main->vars[i];
    if (!v->persistable || v->stop_gradient) continue;
    snprintf(grad, sizeof grad, "%s" PE_GRAD_SUFFIX, v->name);
    if (pe_block_find_var_local(main, grad)) params[n_params++] = v;
  }
  pe_status *st = NULL;
  if (n_params == 0)
    st = pe_error(PE_EINVAL,
                  "optimizer %s: no trainable parameter has a gradient (run backward first; "
                  "parameters are persistable and not stop_gradient)",
                  k->type);
  if (!st) st = check_initialised(p, params, n_params);
  pe_block *startup = NULL;
  if (!st) st = startup_block(p, &startup);
  pe_shape one = PE_SHAPE(1);
  if (!st) st = add_state(main, startup, LR_NAME, PE_F32, &one, h.lr);
  if (!st && p->opt.sched.type) st = add_schedule(main, startup, &p->opt);
  bool clip = p->opt.grad_clip_norm > 0.0f;
  if (!st && (!(p->opt.grad_clip_norm >= 0.0f) || !isfinite(p->opt.grad_clip_norm)))
    st = pe_error(PE_EINVAL, "grad_clip_norm %g must be finite and >= 0",
                  (double)p->opt.grad_clip_norm);
  for (int i = 0; !st && i < n_params; i++) st = check_sparse(main, params[i], &h, clip);
  if (!st && clip) st = add_clip(main, params, n_params, p->opt.grad_clip_norm);
  for (int i = 0; !st && i < n_params; i++) st = add_update(main, startup, k, &h, params[i], clip);
  free(params);
  if (st) return pe_status_wrap(st, "optimizer %s", k->type);
  return NULL;
}
