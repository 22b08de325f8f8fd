/* pe_builder_apply_recipe and pe_builder_add_counter (pe_recipe.h): a
 * training recipe and a trainer's counter applied by the builder, so that a
 * trainer packs its program once. The results equal pe_train_recipe_apply
 * and pe_program_add_counter on the packed program: the optimizer fields go
 * through the same pec_recipe_apply_opt, and the counter takes the same
 * places (the end of both blocks' variables, the last startup op). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builder_internal.h"
#include "pe_recipe.h"
#include "recipe_internal.h"

int pe_builder_apply_recipe(pe_builder *b, const pe_train_recipe *r) {
  if (!b || b->err) return -1;
  char err[256];
  const char *type;
  if (!r) {
    peb_fail(b, "apply_recipe: the recipe is NULL");
    return -1;
  }
  if (pec_recipe_kind(r, &type, err, sizeof err)) goto fail;
  if (!b->loss) {
    snprintf(err, sizeof err,
             "the program has no loss (pe_builder_append_backward): nothing to train");
    goto fail;
  }
  Pe__OptimizerDesc od = PE__OPTIMIZER_DESC__INIT;
  if (b->opt_type) od.type = b->opt_type;
  od.learning_rate = b->lr;
  od.momentum = b->mu;
  od.nesterov = b->nesterov;
  od.beta1 = b->beta1;
  od.beta2 = b->beta2;
  od.epsilon = b->eps;
  od.weight_decay = b->weight_decay;
  od.grad_clip_norm = b->clip_norm;
  Pe__LrSchedule ls;
  if (pec_recipe_apply_opt(r, type, &od, &ls, err, sizeof err)) goto fail;
  if (od.type != b->opt_type) { /* a static kind name: the builder keeps a copy */
    char *t = strdup(od.type);
    if (!t) {
      peb_fail(b, "apply_recipe: out of memory");
      return -1;
    }
    free(b->opt_type);
    b->opt_type = t;
  }
  b->lr = od.learning_rate;
  b->mu = od.momentum;
  b->nesterov = od.nesterov;
  b->beta1 = od.beta1;
  b->beta2 = od.beta2;
  b->eps = od.epsilon;
  b->weight_decay = od.weight_decay;
  b->clip_norm = od.grad_clip_norm;
  if (od.lr_schedule == &ls)
    b->sched = (b_sched){.type = ls.type,
                         .warmup = ls.warmup_steps,
                         .decay = ls.decay_steps,
                         .gamma = ls.gamma,
                         .min_lr = ls.min_lr};
  if (r->no_decay_1d) b->no_decay_1d = true;
  return 0;
fail:
  peb_fail(b, "apply_recipe: %s", err);
  return -1;
}

/* name, int64 [1], persistable without a gradient, in blk unless it is
 * there; whether it was. */
static bool declare(pe_builder *b, b_block *blk, const char *name, bool *had) {
  *had = peb_var_find(blk, name) != NULL;
  if (*had) return true;
  b_var *v = peb_block_var(b, blk, name, PE_B_I64, 1, (const int64_t[]){1});
  if (!v) return false;
  v->persistable = v->stop_gradient = true;
  return true;
}

int pe_builder_add_counter(pe_builder *b, const char *name) {
  if (!b || b->err) return -1;
  if (!name || !*name) {
    peb_fail(b, "add_counter: the name is %s", name ? "empty" : "NULL");
    return -1;
  }
  bool in_main, in_startup;
  if (!declare(b, &b->main, name, &in_main) || !declare(b, &b->startup, name, &in_startup))
    return -1;
  if (in_startup) return 0; /* the startup block sets it already */
  b_op *op = peb_op_add(b, &b->startup, "fill_constant");
  peb_op_out(b, op, "Out", name);
  peb_attr_ints(b, op, "shape", 1, (const int64_t[]){1});
  peb_attr_int(b, op, "dtype", PE_B_I64);
  peb_attr_float(b, op, "value", 0.0f);
  return b->err ? -1 : 0;
}
