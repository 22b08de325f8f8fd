/* pe_train_recipe_apply (pe_recipe.h): unpack the ProgramDesc, change its
 * TrainSpec.optimizer (pec_recipe_apply_opt, which the builder's route
 * shares) and the no_weight_decay of 1-D parameters in place, pack it
 * again. The unpacked message owns its strings, so the fields that
 * are pointed at the recipe's static strings or a stack message are put
 * back before it is freed. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pe_builder.h"
#include "pe_recipe.h"
#include "program.pb-c.h"
#include "recipe_internal.h"

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

static bool finite_nonneg(float x) {
  return isfinite(x) && x >= 0.0f;
}

/* The recipe's own checks (the daemon checks the rest at Register); `type`
 * is the optimizer the program will have. */
static int check(const pe_train_recipe *r, const char *type, char *err, size_t errlen) {
  /* NaN is "given" (not < 0) and fails the range checks */
  if (!(r->lr < 0) && !(isfinite(r->lr) && r->lr > 0))
    return fail(err, errlen, "lr %g must be finite and > 0 (negative: the program's)", r->lr);
  if (!(r->momentum < 0)) {
    if (!(r->momentum < 1)) return fail(err, errlen, "momentum %g must be in [0, 1)", r->momentum);
    if (strcmp(type, "momentum") && (r->momentum > 0 || strcmp(type, "sgd")))
      return fail(err, errlen, "momentum %g applies to the momentum optimizer, not %s", r->momentum,
                  type);
  }
  if (isnan(r->weight_decay) || isinf(r->weight_decay))
    return fail(err, errlen, "weight_decay %g must be finite", r->weight_decay);
  if (isnan(r->grad_clip_norm) || isinf(r->grad_clip_norm))
    return fail(err, errlen, "grad_clip_norm %g must be finite", r->grad_clip_norm);
  if (r->schedule && !pe_lr_schedule_kind(r->schedule))
    return fail(err, errlen, "lr schedule '%.64s' unknown (known: " PE_LR_SCHEDULE_KINDS ")",
                r->schedule);
  if (r->warmup_steps < 0 || r->decay_steps < 0)
    return fail(err, errlen, "warmup_steps %lld and decay_steps %lld must be >= 0",
                (long long)r->warmup_steps, (long long)r->decay_steps);
  if (!finite_nonneg(r->gamma) || !finite_nonneg(r->min_lr))
    return fail(err, errlen, "gamma %g and min_lr %g must be finite and >= 0", r->gamma, r->min_lr);
  if (!r->schedule && (r->warmup_steps || r->decay_steps || r->gamma || r->min_lr))
    return fail(err, errlen, "warmup, decay_steps, gamma and min_lr need a schedule kind");
  return 0;
}

/* Every trainable 1-D parameter of every block: no weight decay. */
static void exempt_1d(Pe__ProgramDesc *pd) {
  for (size_t b = 0; b < pd->n_blocks; b++)
    for (size_t i = 0; i < pd->blocks[b]->n_vars; i++) {
      Pe__VarDesc *v = pd->blocks[b]->vars[i];
      if (v->persistable && !v->stop_gradient && !v->is_feed && v->n_shape == 1)
        v->no_weight_decay = true;
    }
}

int pec_recipe_kind(const pe_train_recipe *r, const char **type, char *err, size_t errlen) {
  *type = r->optimizer ? pe_optimizer_kind(r->optimizer) : NULL;
  if (r->optimizer && !*type)
    return fail(err, errlen, "optimizer '%.64s' unknown (known: " PE_OPTIMIZER_KINDS ")",
                r->optimizer);
  return 0;
}

int pec_recipe_apply_opt(const pe_train_recipe *r, const char *type, Pe__OptimizerDesc *od,
                         Pe__LrSchedule *ls, char *err, size_t errlen) {
  /* A program without an optimizer (it only computes gradients) gets the
   * recipe's, which then needs its learning rate: there is none to keep. */
  if (!od->type[0]) {
    if (!type) return fail(err, errlen, "the program has no optimizer (TrainSpec.optimizer)");
    if (!(r->lr > 0))
      return fail(err, errlen, "the program has no optimizer: %s needs a learning rate (lr)", type);
    od->type = (char *)type;
  }
  if (check(r, type ? type : od->type, err, errlen)) return -1;
  if (type && strcmp(type, od->type)) { /* another kind: its own defaults */
    od->type = (char *)type;
    od->momentum = od->beta1 = od->beta2 = od->epsilon = 0.0f;
    od->nesterov = false;
  }
  if (r->lr > 0) od->learning_rate = r->lr;
  /* The program's 0 means the kind's default (0.9, 0.01): an explicit
   * 0 is the kind without that term, which is the same update. */
  if (r->momentum > 0) od->momentum = r->momentum;
  if (r->momentum == 0 && !strcmp(od->type, "momentum")) {
    od->type = (char *)"sgd";
    od->momentum = 0.0f;
    od->nesterov = false;
  }
  if (r->weight_decay >= 0) od->weight_decay = r->weight_decay;
  if (r->weight_decay == 0 && !strcmp(od->type, "adamw")) od->type = (char *)"adam";
  if (r->grad_clip_norm >= 0) od->grad_clip_norm = r->grad_clip_norm;
  if (r->schedule) {
    pe__lr_schedule__init(ls);
    ls->type = (char *)pe_lr_schedule_kind(r->schedule);
    ls->warmup_steps = r->warmup_steps;
    ls->decay_steps = r->decay_steps;
    ls->gamma = r->gamma;
    ls->min_lr = r->min_lr;
    od->lr_schedule = ls;
  }
  return 0;
}

int pe_train_recipe_apply(const pe_train_recipe *r, const uint8_t *in, size_t len, uint8_t **out,
                          size_t *out_len, char *err, size_t errlen) {
  *out = NULL;
  *out_len = 0;
  const char *type;
  if (pec_recipe_kind(r, &type, err, errlen)) return -1;
  Pe__ProgramDesc *pd = pe__program_desc__unpack(NULL, len, in);
  if (!pd) return fail(err, errlen, "not a ProgramDesc (%zu bytes)", len);
  if (!pd->train || !pd->train->loss[0]) {
    pe__program_desc__free_unpacked(pd, NULL);
    return fail(err, errlen, "the program has no loss (TrainSpec.loss): nothing to train");
  }
  Pe__OptimizerDesc added = PE__OPTIMIZER_DESC__INIT;
  Pe__OptimizerDesc *orig_od = pd->train->optimizer;
  Pe__OptimizerDesc *od = orig_od && orig_od->type[0] ? orig_od : &added;
  pd->train->optimizer = od;
  char *orig_type = od->type;
  Pe__LrSchedule *orig_sched = od->lr_schedule;
  Pe__LrSchedule ls;
  int rc = pec_recipe_apply_opt(r, type, od, &ls, err, errlen);
  if (!rc) {
    if (r->no_decay_1d) exempt_1d(pd);
    size_t n = pe__program_desc__get_packed_size(pd);
    *out = malloc(n ? n : 1);
    if (!*out)
      rc = fail(err, errlen, "out of memory (%zu bytes)", n);
    else
      *out_len = pe__program_desc__pack(pd, *out);
  }
  od->type = orig_type;
  od->lr_schedule = orig_sched;
  pd->train->optimizer = orig_od;
  pe__program_desc__free_unpacked(pd, NULL);
  return rc;
}

const char *pe_program_optimizer(const uint8_t *in, size_t len) {
  Pe__ProgramDesc *pd = pe__program_desc__unpack(NULL, len, in);
  if (!pd) return NULL;
  const Pe__OptimizerDesc *od = pd->train ? pd->train->optimizer : NULL;
  const char *kind = od ? pe_optimizer_kind(od->type) : NULL;
  pe__program_desc__free_unpacked(pd, NULL);
  return kind ? kind : "";
}
