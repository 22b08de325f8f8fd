/* Training recipe overrides (pe_recipe.h): the built-in cnn with another
 * optimizer, weight decay and schedule decodes in the daemon's IR with
 * exactly those values; what the recipe leaves unset keeps the program's;
 * no_decay_1d exempts the biases only; bad recipes and programs are
 * refused with the reason. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "ir/program.h"
#include "compiler/validate.h"
#include "pe_builder.h"
#include "pe_models.h"
#include "pe_recipe.h"
#include "test_assert.h"

/* The built-in model `name` with r applied, decoded and validated. */
static pe_program *apply(const char *name, const pe_train_recipe *r) {
  pe_model_spec m;
  char err[256];
  ck_assert_msg(pe_model_spec_build(name, &m, err, sizeof err) == 0, "%s", err);
  uint8_t *bytes;
  size_t len;
  ck_assert_msg(pe_train_recipe_apply(r, m.bytes, m.len, &bytes, &len, err, sizeof err) == 0, "%s",
                err);
  pe_program *p = NULL;
  PE_CK_OK(pe_program_decode(bytes, len, &p));
  PE_CK_OK(pe_program_validate(p));
  free(bytes);
  pe_model_spec_release(&m);
  return p;
}

static bool no_decay(const pe_program *p, const char *name) {
  const pe_var_desc *v = pe_block_find_var_local(pe_program_main(p), name);
  ck_assert_msg(v, "no variable %s", name);
  return v->no_weight_decay;
}

START_TEST(adamw_cosine_on_the_cnn) {
  pe_train_recipe r = PE_TRAIN_RECIPE_KEEP;
  r.optimizer = "adamw";
  r.lr = 1e-3f;
  r.weight_decay = 0.05f;
  r.no_decay_1d = true;
  r.schedule = "cosine";
  r.warmup_steps = 938;
  r.decay_steps = 8442;
  r.min_lr = 1e-5f;
  r.grad_clip_norm = 1.5f;
  pe_program *p = apply("cnn", &r);
  ck_assert_str_eq(p->opt.type, "adamw");
  ck_assert(p->opt.grad_clip_norm == 1.5f);
  ck_assert(p->opt.lr == 1e-3f && p->opt.weight_decay == 0.05f);
  /* momentum's mu is not carried over to another kind */
  ck_assert(p->opt.momentum == 0.0f && p->opt.beta1 == 0.0f && !p->opt.nesterov);
  ck_assert_str_eq(p->opt.sched.type, "cosine");
  ck_assert_int_eq(p->opt.sched.warmup_steps, 938);
  ck_assert_int_eq(p->opt.sched.decay_steps, 8442);
  ck_assert(p->opt.sched.min_lr == 1e-5f && p->opt.sched.gamma == 0.0f);
  const char *biases[] = {"conv2d_0.b", "conv2d_1.b", "fc_0.b", "fc_1.b"};
  const char *weights[] = {"conv2d_0.w", "conv2d_1.w", "fc_0.w", "fc_1.w"};
  for (int i = 0; i < 4; i++) {
    ck_assert_msg(no_decay(p, biases[i]), "%s", biases[i]);
    ck_assert_msg(!no_decay(p, weights[i]), "%s", weights[i]);
  }
  pe_program_free(p);
}
END_TEST

/* A recipe that sets nothing keeps the program; a partial one keeps the
 * rest (the cnn: momentum, lr 0.01, mu 0.9). */
START_TEST(unset_fields_keep_the_program) {
  pe_train_recipe keep = PE_TRAIN_RECIPE_KEEP;
  pe_program *p = apply("cnn", &keep);
  ck_assert_str_eq(p->opt.type, "momentum");
  ck_assert(p->opt.lr == 0.01f && p->opt.momentum == 0.9f && p->opt.weight_decay == 0.0f);
  ck_assert(p->opt.grad_clip_norm == 0.0f);
  ck_assert_ptr_null(p->opt.sched.type);
  ck_assert(!no_decay(p, "fc_0.b"));
  pe_program_free(p);
  pe_train_recipe r = PE_TRAIN_RECIPE_KEEP;
  r.optimizer = "momentum"; /* the same kind: its mu stays */
  r.weight_decay = 5e-4f;
  r.schedule = "linear";
  r.decay_steps = 100;
  p = apply("cnn", &r);
  ck_assert_str_eq(p->opt.type, "momentum");
  ck_assert(p->opt.lr == 0.01f && p->opt.momentum == 0.9f && p->opt.weight_decay == 5e-4f);
  ck_assert_str_eq(p->opt.sched.type, "linear");
  ck_assert_int_eq(p->opt.sched.decay_steps, 100);
  ck_assert(!no_decay(p, "fc_0.b"));
  pe_program_free(p);
  r = (pe_train_recipe)PE_TRAIN_RECIPE_KEEP;
  r.momentum = 0.5f;
  r.lr = 0.2f;
  p = apply("mlp", &r);
  ck_assert(p->opt.lr == 0.2f && p->opt.momentum == 0.5f);
  pe_program_free(p);
}
END_TEST

static void expect_refused(const pe_train_recipe *r, const uint8_t *bytes, size_t len,
                           const char *want) {
  uint8_t *out = (uint8_t *)"untouched";
  size_t n = 7;
  char err[256] = "";
  ck_assert_int_eq(pe_train_recipe_apply(r, bytes, len, &out, &n, err, sizeof err), -1);
  ck_assert_ptr_null(out);
  ck_assert_uint_eq(n, 0);
  ck_assert_str_eq(err, want);
}

START_TEST(bad_recipes_and_programs) {
  pe_model_spec m;
  char e[256];
  ck_assert_int_eq(pe_model_spec_build("mlp", &m, e, sizeof e), 0);
  pe_train_recipe r = PE_TRAIN_RECIPE_KEEP;
  r.optimizer = "rmsprop";
  expect_refused(&r, m.bytes, m.len,
                 "optimizer 'rmsprop' unknown (known: sgd, momentum, adam, adamw)");
  r = (pe_train_recipe)PE_TRAIN_RECIPE_KEEP;
  r.optimizer = "adam";
  r.momentum = 0.5f;
  expect_refused(&r, m.bytes, m.len, "momentum 0.5 applies to the momentum optimizer, not adam");
  r = (pe_train_recipe)PE_TRAIN_RECIPE_KEEP;
  r.momentum = 1.0f;
  expect_refused(&r, m.bytes, m.len, "momentum 1 must be in [0, 1)");
  r = (pe_train_recipe)PE_TRAIN_RECIPE_KEEP;
  r.lr = NAN;
  expect_refused(&r, m.bytes, m.len, "lr nan must be finite and > 0 (negative: the program's)");
  r.lr = 0.0f; /* the daemon refuses it: refused here, not dropped */
  expect_refused(&r, m.bytes, m.len, "lr 0 must be finite and > 0 (negative: the program's)");
  r = (pe_train_recipe)PE_TRAIN_RECIPE_KEEP;
  r.weight_decay = INFINITY;
  expect_refused(&r, m.bytes, m.len, "weight_decay inf must be finite");
  r = (pe_train_recipe)PE_TRAIN_RECIPE_KEEP;
  r.grad_clip_norm = NAN;
  expect_refused(&r, m.bytes, m.len, "grad_clip_norm nan must be finite");
  r = (pe_train_recipe)PE_TRAIN_RECIPE_KEEP;
  r.schedule = "poly";
  expect_refused(&r, m.bytes, m.len,
                 "lr schedule 'poly' unknown (known: constant, step, multistep, exponential, "
                 "cosine, linear)");
  r = (pe_train_recipe)PE_TRAIN_RECIPE_KEEP;
  r.warmup_steps = 10;
  expect_refused(&r, m.bytes, m.len, "warmup, decay_steps, gamma and min_lr need a schedule kind");
  r.schedule = "cosine";
  r.warmup_steps = -1;
  expect_refused(&r, m.bytes, m.len, "warmup_steps -1 and decay_steps 0 must be >= 0");
  r = (pe_train_recipe)PE_TRAIN_RECIPE_KEEP;
  expect_refused(&r, (const uint8_t *)"\xff\xff\xff", 3, "not a ProgramDesc (3 bytes)");
  pe_model_spec_release(&m);

  /* A program with no loss (inference only) has nothing to train. */
  pe_builder *b = pe_builder_new();
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 4));
  ck_assert_ptr_nonnull(pe_builder_fc(b, x, 3, NULL));
  uint8_t *bytes;
  size_t len;
  ck_assert_int_eq(pe_builder_finish(b, &bytes, &len), 0);
  ck_assert_str_eq(pe_program_optimizer(bytes, len), "");
  r.optimizer = "sgd";
  expect_refused(&r, bytes, len, "the program has no loss (TrainSpec.loss): nothing to train");
  free(bytes);
  pe_builder_free(b);
}
END_TEST

/* A loss without an optimizer (a model file without an 'optimizer' line)
 * trains nothing: pe_program_optimizer says so, and a recipe adds one
 * only with its learning rate. */
START_TEST(a_recipe_adds_the_missing_optimizer) {
  pe_builder *b = pe_builder_new();
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 4));
  const char *label = pe_builder_data(b, "label", PE_B_I64, PE_B_SHAPE(-1, 1));
  const char *logits = pe_builder_fc(b, x, 3, NULL);
  const char *loss =
      pe_builder_mean(b, pe_builder_softmax_with_cross_entropy(b, logits, label, NULL));
  ck_assert_int_eq(pe_builder_append_backward(b, loss), 0);
  uint8_t *bytes, *out;
  size_t len, n;
  ck_assert_msg(pe_builder_finish(b, &bytes, &len) == 0, "%s", pe_builder_error(b));
  ck_assert_str_eq(pe_program_optimizer(bytes, len), "");
  ck_assert_ptr_null(pe_program_optimizer((const uint8_t *)"\xff\xff\xff", 3));
  pe_train_recipe r = PE_TRAIN_RECIPE_KEEP;
  r.weight_decay = 0.1f;
  expect_refused(&r, bytes, len, "the program has no optimizer (TrainSpec.optimizer)");
  r.optimizer = "adam";
  expect_refused(&r, bytes, len, "the program has no optimizer: adam needs a learning rate (lr)");
  r.lr = 0.01f;
  char err[256];
  ck_assert_msg(pe_train_recipe_apply(&r, bytes, len, &out, &n, err, sizeof err) == 0, "%s", err);
  ck_assert_str_eq(pe_program_optimizer(out, n), "adam");
  pe_program *p = NULL;
  PE_CK_OK(pe_program_decode(out, n, &p));
  ck_assert_str_eq(p->opt.type, "adam");
  ck_assert(p->opt.lr == 0.01f && p->opt.weight_decay == 0.1f && p->opt.grad_clip_norm == 0.0f);
  pe_program_free(p);
  free(out);
  free(bytes);
  pe_builder_free(b);
  pe_model_spec m;
  ck_assert_int_eq(pe_model_spec_build("mlp", &m, err, sizeof err), 0);
  ck_assert_str_eq(pe_program_optimizer(m.bytes, m.len), "momentum");
  pe_model_spec_release(&m);
}
END_TEST

/* An explicit 0 is applied, not taken for "unset": where the program's 0
 * means the kind's default (momentum's mu 0.9, adamw's decay 0.01), the
 * recipe picks the kind without that term (sgd, adam: the same update). */
START_TEST(an_explicit_zero_is_applied) {
  pe_train_recipe r = PE_TRAIN_RECIPE_KEEP;
  r.momentum = 0.0f;
  pe_program *p = apply("mlp", &r);
  ck_assert_str_eq(p->opt.type, "sgd");
  ck_assert(p->opt.lr == 0.1f && p->opt.momentum == 0.0f && !p->opt.nesterov);
  pe_program_free(p);
  r.optimizer = "sgd"; /* sgd has no momentum: 0 says the same */
  p = apply("mlp", &r);
  ck_assert_str_eq(p->opt.type, "sgd");
  pe_program_free(p);
  r = (pe_train_recipe)PE_TRAIN_RECIPE_KEEP;
  r.optimizer = "adamw";
  r.lr = 1e-3f;
  r.weight_decay = 0.0f;
  p = apply("cnn", &r);
  ck_assert_str_eq(p->opt.type, "adam");
  ck_assert(p->opt.lr == 1e-3f && p->opt.weight_decay == 0.0f);
  pe_program_free(p);
  r.weight_decay = 0.05f;
  p = apply("cnn", &r);
  ck_assert_str_eq(p->opt.type, "adamw");
  ck_assert(p->opt.weight_decay == 0.05f);
  pe_program_free(p);
  r = (pe_train_recipe)PE_TRAIN_RECIPE_KEEP;
  r.grad_clip_norm = 0.0f;
  r.weight_decay = 0.0f;
  p = apply("cnn", &r);
  ck_assert_str_eq(p->opt.type, "momentum");
  ck_assert(p->opt.momentum == 0.9f && p->opt.weight_decay == 0.0f &&
            p->opt.grad_clip_norm == 0.0f);
  pe_program_free(p);
  pe_model_spec m;
  char e[256];
  ck_assert_int_eq(pe_model_spec_build("mlp", &m, e, sizeof e), 0);
  r = (pe_train_recipe)PE_TRAIN_RECIPE_KEEP;
  r.optimizer = "adam";
  r.momentum = 0.0f;
  expect_refused(&r, m.bytes, m.len, "momentum 0 applies to the momentum optimizer, not adam");
  pe_model_spec_release(&m);
}
END_TEST

static Suite *recipe_suite(void) {
  Suite *s = suite_create("recipe");
  TCase *tc = tcase_create("recipe");
  tcase_add_test(tc, adamw_cosine_on_the_cnn);
  tcase_add_test(tc, unset_fields_keep_the_program);
  tcase_add_test(tc, bad_recipes_and_programs);
  tcase_add_test(tc, a_recipe_adds_the_missing_optimizer);
  tcase_add_test(tc, an_explicit_zero_is_applied);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(recipe_suite)
