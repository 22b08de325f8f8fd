/* Training recipe overrides: change the optimizer, weight decay and
 * learning-rate schedule of a built ProgramDesc (a built-in model or a model
 * file) without editing the model, as a trainer's command-line flags do
 * (pe-client train --optimizer adamw --lr 0.001 --lr-schedule cosine ...).
 * What the recipe leaves unset keeps the program's value. The daemon checks
 * the result at Register like any program (ranges, schedule fields). */
#ifndef PE_RECIPE_H
#define PE_RECIPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pe_builder.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pe_train_recipe {
  /* sgd | momentum | adam | adamw; NULL: the program's. A new type starts
   * from its defaults (momentum 0.9; betas 0.9, 0.999; epsilon 1e-8); the
   * learning rate and weight decay are kept unless set below. */
  const char *optimizer;
  /* Negative: the program's value (PE_TRAIN_RECIPE_KEEP); anything else is
   * applied, 0 included: momentum 0 makes a momentum optimizer plain sgd,
   * weight_decay 0 makes adamw adam (the program's 0 means 0.9 and 0.01
   * there, OptimizerDesc). lr 0 is refused, as the daemon refuses it. */
  float lr;             /* > 0 */
  float momentum;       /* momentum's mu in [0, 1); sgd takes 0 only */
  float weight_decay;   /* >= 0 */
  float grad_clip_norm; /* >= 0 (0: no clipping); negative: the program's */
  bool no_decay_1d;     /* exempt every trainable 1-D parameter (biases, norms) */
  /* constant | step | multistep | exponential | cosine | linear: replaces
   * the program's schedule; NULL: the program's. Counted in optimizer
   * steps (pe_lr_schedule_opts in pe_builder.h; milestones are not taken
   * here). */
  const char *schedule;
  int64_t warmup_steps, decay_steps;
  float gamma, min_lr;
} pe_train_recipe;

/* A recipe that changes nothing (lr, momentum, weight_decay and
 * grad_clip_norm -1). */
#define PE_TRAIN_RECIPE_KEEP \
  { .lr = -1.0f, .momentum = -1.0f, .weight_decay = -1.0f, .grad_clip_norm = -1.0f }

/* Apply r to the ProgramDesc in (in, len): a new buffer in *out (malloc'd,
 * the caller frees) of *out_len bytes. A program with a loss but no
 * optimizer (it computes gradients only) gets r's optimizer, which then
 * needs r's lr. Returns 0, or -1 with a message in err: bytes that are not
 * a ProgramDesc, a program without a loss, or without an optimizer when r
 * names none (or no lr), an unknown optimizer or schedule kind, a value
 * out of range. */
int pe_train_recipe_apply(const pe_train_recipe *r, const uint8_t *in, size_t len, uint8_t **out,
                          size_t *out_len, char *err, size_t errlen);

/* The optimizer of the ProgramDesc in (in, len): "sgd", "momentum", "adam"
 * or "adamw" (static strings); "" when it has none (no TrainSpec, or a
 * loss without an optimizer: a run computes gradients and updates
 * nothing); NULL when the bytes are not a ProgramDesc. A trainer checks it
 * before training: without an optimizer the "training" changes nothing. */
const char *pe_program_optimizer(const uint8_t *in, size_t len);

/* The ProgramDesc in (in, len) with one more persistable: name, int64 [1],
 * no gradient, declared in the main and startup blocks and set to 0 by the
 * startup block (a trainer's bookkeeping that the model keeps: pe-client
 * train's epoch count). A program that declares it already is kept as it
 * is. A new buffer in *out (malloc'd) of *out_len bytes; returns 0, or -1
 * with a message in err (not a ProgramDesc, no startup block). */
int pe_program_add_counter(const uint8_t *in, size_t len, const char *name, uint8_t **out,
                           size_t *out_len, char *err, size_t errlen);

/* The same two changes made by the program builder before it serialises,
 * so that a trainer that builds its program packs it once (pe_model_opts in
 * pe_model_file.h does this for built-in models and model files). The
 * bytes of pe_builder_finish equal those of pe_train_recipe_apply and then
 * pe_program_add_counter on the program built without them. */

/* Apply r to the optimizer set so far (none: r's, which then needs r's
 * lr), with pe_train_recipe_apply's rules and checks; r->no_decay_1d as
 * pe_builder_no_weight_decay_1d. Needs the loss (pe_builder_append_backward);
 * a later optimizer setter replaces the optimizer again. Returns 0, or -1
 * (pe_builder_error says why). */
int pe_builder_apply_recipe(pe_builder *b, const pe_train_recipe *r);

/* Declare the counter `name` as pe_program_add_counter does: int64 [1],
 * persistable, no gradient, at the end of the main and startup blocks'
 * variables, and a fill_constant 0 after the startup ops. It takes those
 * places now: call it after the layers. A name declared already is kept.
 * Returns 0, or -1 (pe_builder_error). */
int pe_builder_add_counter(pe_builder *b, const char *name);

#ifdef __cplusplus
}
#endif

#endif
