/* pe_model_opts (pe_model_file.h): the builder applies a training recipe
 * and declares a trainer's counter before it packs, and the bytes equal
 * those of the packed route (pe_train_recipe_apply, pe_program_add_counter
 * on the plain model's bytes) for the built-in mlp and cnn and a model file
 * with a schedule, weight decay, clipping and no_decay_1d; the prepare hook
 * sees the model before the recipe and may change or stop it; the spec
 * carries the optimizer. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "compiler/validate.h"
#include "ir/program.h"
#include "pe_builder.h"
#include "pe_model_file.h"
#include "pe_models.h"
#include "pe_recipe.h"
#include "test_assert.h"

#define COUNTER "trainer.epochs_done"

/* A model file with most optimizer options; its schedule has milestones,
 * which a recipe without a schedule keeps. */
static const char *const FILE_TEXT =
    "name opts\nbatch 32\ninput image 784\nlabel label\n"
    "fc 64 act=relu\nfc 32 act=tanh no_bias\nfc 10\nloss softmax_with_cross_entropy\naccuracy\n"
    "optimizer adamw lr=0.002 beta1=0.8 weight_decay=0.02 no_decay_1d clip_norm=2.5\n"
    "schedule multistep milestones=100,200 gamma=0.5 warmup=10\n";
/* The same without an optimizer: a recipe adds one. */
static const char *const BARE_TEXT =
    "input image 784\nlabel label\nfc 10\nloss softmax_with_cross_entropy\naccuracy\n";

typedef struct files {
  char dir[64], full[96], bare[96];
} files;

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fputs(text, f) >= 0, 1);
  ck_assert_int_eq(fclose(f), 0);
}

static void files_make(files *f) {
  snprintf(f->dir, sizeof f->dir, "/tmp/pe_model_opts.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(f->dir));
  snprintf(f->full, sizeof f->full, "%s/opts", f->dir);
  snprintf(f->bare, sizeof f->bare, "%s/bare", f->dir);
  write_file(f->full, FILE_TEXT);
  write_file(f->bare, BARE_TEXT);
}

static void files_remove(files *f) {
  unlink(f->full);
  unlink(f->bare);
  rmdir(f->dir);
}

/* m's bytes replaced by out (malloc'd). */
static void replace(pe_model_spec *m, uint8_t *out, size_t len) {
  free(m->bytes);
  m->bytes = out;
  m->len = len;
}

static void add_counter(pe_model_spec *m) {
  uint8_t *out;
  size_t len;
  char err[256];
  ck_assert_msg(pe_program_add_counter(m->bytes, m->len, COUNTER, &out, &len, err, sizeof err) == 0,
                "%s", err);
  replace(m, out, len);
}

/* The packed route, as a trainer took it: the model, its counter when it
 * has an optimizer, the recipe, the counter again. */
static void old_route(const char *spec, const pe_train_recipe *r, pe_model_spec *m) {
  char err[512];
  ck_assert_msg(pe_model_resolve_in(spec, NULL, m, err, sizeof err) == 0, "%s", err);
  const char *opt = pe_program_optimizer(m->bytes, m->len);
  ck_assert_ptr_nonnull(opt);
  if (*opt) add_counter(m);
  if (r) {
    uint8_t *out;
    size_t len;
    ck_assert_msg(pe_train_recipe_apply(r, m->bytes, m->len, &out, &len, err, sizeof err) == 0,
                  "%s", err);
    replace(m, out, len);
  }
  if (*pe_program_optimizer(m->bytes, m->len)) add_counter(m);
}

static void new_route(const char *spec, const pe_train_recipe *r, pe_model_spec *m) {
  char err[512];
  pe_model_opts o = {.recipe = r, .counter = COUNTER};
  ck_assert_msg(pe_model_resolve_opts(spec, &o, m, err, sizeof err) == 0, "%s", err);
}

/* Both routes give one program, which the daemon accepts; the spec's
 * optimizer is the program's. */
static void expect_same(const char *spec, const pe_train_recipe *r, const char *what) {
  pe_model_spec a, b;
  old_route(spec, r, &a);
  new_route(spec, r, &b);
  size_t i = 0;
  while (i < a.len && i < b.len && a.bytes[i] == b.bytes[i]) i++;
  ck_assert_msg(a.len == b.len && i == a.len,
                "%s, %s: %zu bytes packed once, %zu repacked; first difference at %zu", spec, what,
                b.len, a.len, i);
  ck_assert_str_eq(b.optimizer, pe_program_optimizer(b.bytes, b.len));
  pe_program *p = NULL;
  PE_CK_OK(pe_program_decode(b.bytes, b.len, &p));
  PE_CK_OK(pe_program_validate(p));
  if (b.optimizer[0]) ck_assert_ptr_nonnull(pe_block_find_var_local(pe_program_main(p), COUNTER));
  pe_program_free(p);
  pe_model_spec_release(&a);
  pe_model_spec_release(&b);
}

/* Recipes that touch each rule: another kind, a schedule, a kept kind with
 * new values, explicit zeros (momentum 0: sgd; weight_decay 0: adam). */
static const struct {
  const char *what;
  pe_train_recipe r;
} recipes[] = {
    {"a recipe that keeps everything", PE_TRAIN_RECIPE_KEEP},
    {"adamw cosine",
     {.optimizer = "adamw",
      .lr = 1e-3f,
      .momentum = -1.0f,
      .weight_decay = 0.05f,
      .grad_clip_norm = 1.5f,
      .no_decay_1d = true,
      .schedule = "cosine",
      .warmup_steps = 938,
      .decay_steps = 8442,
      .min_lr = 1e-5f}},
    {"lr, no clipping, linear",
     {.lr = 0.25f,
      .momentum = -1.0f,
      .weight_decay = -1.0f,
      .grad_clip_norm = 0.0f,
      .schedule = "linear",
      .decay_steps = 100}},
    {"momentum 0",
     {.optimizer = "momentum",
      .lr = 0.5f,
      .momentum = 0.0f,
      .weight_decay = -1.0f,
      .grad_clip_norm = -1.0f}},
    {"adamw without decay",
     {.optimizer = "adamw",
      .lr = -1.0f,
      .momentum = -1.0f,
      .weight_decay = 0.0f,
      .grad_clip_norm = -1.0f,
      .schedule = "constant",
      .warmup_steps = 5}},
};

static void each_recipe(const char *spec) {
  expect_same(spec, NULL, "no recipe");
  for (size_t i = 0; i < sizeof recipes / sizeof recipes[0]; i++)
    expect_same(spec, &recipes[i].r, recipes[i].what);
}

START_TEST(the_builtin_models_pack_as_the_packed_route) {
  each_recipe("mlp");
  each_recipe("cnn");
}
END_TEST

START_TEST(a_model_file_packs_as_the_packed_route) {
  files f;
  files_make(&f);
  each_recipe(f.full);
  /* no optimizer: no counter without a recipe; a recipe adds both */
  expect_same(f.bare, NULL, "no optimizer");
  pe_train_recipe r = PE_TRAIN_RECIPE_KEEP;
  r.optimizer = "sgd";
  r.lr = 0.1f;
  r.weight_decay = 0.001f;
  expect_same(f.bare, &r, "sgd added");
  pe_model_spec m;
  char err[512];
  pe_model_opts o = {.counter = COUNTER};
  ck_assert_msg(pe_model_resolve_opts(f.bare, &o, &m, err, sizeof err) == 0, "%s", err);
  ck_assert_str_eq(m.optimizer, "");
  pe_program *p = NULL;
  PE_CK_OK(pe_program_decode(m.bytes, m.len, &p));
  ck_assert_ptr_null(pe_block_find_var_local(pe_program_main(p), COUNTER));
  pe_program_free(p);
  pe_model_spec_release(&m);
  files_remove(&f);
}
END_TEST

typedef struct seen {
  int calls;
  int default_batch;
  char optimizer[16];
  bool had_recipe;
  int refuse;
} seen;

/* Records what the hook is shown; sets the schedule's steps from the
 * model's default batch, as a trainer does. */
static int prepare(const pe_model_spec *m, pe_train_recipe *r, void *arg) {
  seen *s = arg;
  s->calls++;
  s->default_batch = m->default_batch;
  snprintf(s->optimizer, sizeof s->optimizer, "%s", m->optimizer);
  s->had_recipe = r != NULL;
  ck_assert_ptr_null(m->bytes);
  if (r) r->decay_steps = 60000 / m->default_batch;
  return s->refuse;
}

START_TEST(the_prepare_hook_sees_the_model_before_the_recipe) {
  pe_train_recipe r = PE_TRAIN_RECIPE_KEEP;
  r.optimizer = "adam";
  r.lr = 1e-3f;
  r.schedule = "cosine";
  seen s = {0};
  pe_model_opts o = {.recipe = &r, .counter = COUNTER, .prepare = prepare, .arg = &s};
  pe_model_spec m;
  char err[512];
  ck_assert_msg(pe_model_resolve_opts("cnn", &o, &m, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(s.calls, 1);
  ck_assert_int_eq(s.default_batch, 64);
  ck_assert_str_eq(s.optimizer, "momentum"); /* the model's own */
  ck_assert(s.had_recipe);
  ck_assert_str_eq(m.optimizer, "adam");
  ck_assert_int_eq(r.decay_steps, 0); /* the caller's recipe is not changed */
  pe_program *p = NULL;
  PE_CK_OK(pe_program_decode(m.bytes, m.len, &p));
  ck_assert_str_eq(p->opt.sched.type, "cosine");
  ck_assert_int_eq(p->opt.sched.decay_steps, 60000 / 64);
  pe_program_free(p);
  pe_model_spec_release(&m);
  /* without a recipe the hook gets none */
  o.recipe = NULL;
  s = (seen){0};
  ck_assert_msg(pe_model_resolve_opts("mlp", &o, &m, err, sizeof err) == 0, "%s", err);
  ck_assert(!s.had_recipe && s.default_batch == 128);
  ck_assert_str_eq(m.optimizer, "momentum");
  pe_model_spec_release(&m);
  /* a hook that refuses stops the resolve */
  s = (seen){.refuse = 1};
  ck_assert_int_eq(pe_model_resolve_opts("mlp", &o, &m, err, sizeof err), -1);
  ck_assert_ptr_null(m.bytes);
  ck_assert_msg(strstr(err, "mlp") && strstr(err, "prepare"), "%s", err);
}
END_TEST

START_TEST(a_bad_recipe_names_the_model_and_the_reason) {
  pe_train_recipe r = PE_TRAIN_RECIPE_KEEP;
  r.optimizer = "adam";
  r.momentum = 0.5f;
  pe_model_opts o = {.recipe = &r};
  pe_model_spec m;
  char err[512];
  ck_assert_int_eq(pe_model_resolve_opts("mlp", &o, &m, err, sizeof err), -1);
  ck_assert_ptr_null(m.bytes);
  ck_assert_msg(strstr(err, "mlp") &&
                    strstr(err, "momentum 0.5 applies to the momentum optimizer, not adam") &&
                    !strstr(err, "model file path"),
                "%s", err);
  files f;
  files_make(&f);
  r = (pe_train_recipe)PE_TRAIN_RECIPE_KEEP;
  r.optimizer = "sgd";
  ck_assert_int_eq(pe_model_resolve_opts(f.bare, &o, &m, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "bare") && strstr(err, "sgd needs a learning rate"), "%s", err);
  files_remove(&f);
}
END_TEST

/* x [-1,4] -> fc 3 -> the mean cross-entropy in *loss. */
static pe_builder *small_net(const char **loss) {
  pe_builder *b = pe_builder_new();
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 4));
  const char *y = pe_builder_data(b, "y", PE_B_I64, PE_B_SHAPE(-1, 1));
  const char *logits = pe_builder_fc(b, x, 3, NULL);
  *loss = pe_builder_mean(b, pe_builder_softmax_with_cross_entropy(b, logits, y, NULL));
  ck_assert_msg(*loss, "%s", pe_builder_error(b));
  return b;
}

/* The builder calls alone: a counter declared twice is declared once,
 * and a recipe needs the loss. */
START_TEST(the_builder_calls) {
  const char *loss;
  pe_builder *b = small_net(&loss);
  pe_train_recipe r = PE_TRAIN_RECIPE_KEEP;
  r.optimizer = "sgd";
  r.lr = 0.1f;
  ck_assert_int_eq(pe_builder_apply_recipe(b, &r), -1);
  ck_assert_msg(strstr(pe_builder_error(b), "no loss"), "%s", pe_builder_error(b));
  pe_builder_free(b);
  b = small_net(&loss);
  ck_assert_int_eq(pe_builder_append_backward(b, loss), 0);
  ck_assert_int_eq(pe_builder_apply_recipe(b, &r), 0);
  ck_assert_int_eq(pe_builder_add_counter(b, COUNTER), 0);
  ck_assert_int_eq(pe_builder_add_counter(b, COUNTER), 0);
  uint8_t *bytes;
  size_t len;
  ck_assert_msg(pe_builder_finish(b, &bytes, &len) == 0, "%s", pe_builder_error(b));
  pe_program *p = NULL;
  PE_CK_OK(pe_program_decode(bytes, len, &p));
  PE_CK_OK(pe_program_validate(p));
  ck_assert_str_eq(p->opt.type, "sgd");
  ck_assert(p->opt.lr == 0.1f);
  const pe_block *st = pe_program_startup(p);
  int fills = 0;
  for (int i = 0; i < st->n_ops; i++)
    for (int k = 0; k < st->ops[i]->n_out; k++)
      fills += !strcmp(st->ops[i]->out[k].args[0], COUNTER);
  ck_assert_int_eq(fills, 1);
  pe_program_free(p);
  free(bytes);
  ck_assert_int_eq(pe_builder_add_counter(b, ""), -1);
  pe_builder_free(b);
}
END_TEST

static Suite *model_opts_suite(void) {
  Suite *s = suite_create("model_opts");
  TCase *tc = tcase_create("model_opts");
  tcase_add_test(tc, the_builtin_models_pack_as_the_packed_route);
  tcase_add_test(tc, a_model_file_packs_as_the_packed_route);
  tcase_add_test(tc, the_prepare_hook_sees_the_model_before_the_recipe);
  tcase_add_test(tc, a_bad_recipe_names_the_model_and_the_reason);
  tcase_add_test(tc, the_builder_calls);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(model_opts_suite)
