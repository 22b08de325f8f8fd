/* Model files: conf/models/mlp and cnn parse into exactly the programs of
 * pe_models.h (byte for byte, same feed/fetch names), the result decodes and
 * validates in the daemon's IR, and bad input gets a line-numbered error;
 * branches and residual sums (save / from / add) and conf/models/resnet. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "compiler/validate.h"
#include "ir/program.h"
#include "pe_model_file.h"
#include "pe_models.h"
#include "program.pb-c.h"
#include "test_assert.h"

static void conf_path(char *buf, size_t len, const char *name) {
  const char *src = getenv("PE_SOURCE_DIR");
  snprintf(buf, len, "%s/conf/models/%s", src && *src ? src : ".", name);
}

static void check_file_equals_builtin(const char *name) {
  char path[1024], err[512];
  conf_path(path, sizeof path, name);
  pe_model_spec f, b;
  ck_assert_msg(pe_model_file_load(path, &f, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(pe_model_spec_build(name, &b, err, sizeof err) == 0, "%s", err);
  ck_assert_str_eq(f.name, b.name);
  ck_assert_str_eq(f.image, b.image);
  ck_assert_str_eq(f.label, b.label);
  ck_assert_str_eq(f.loss, b.loss);
  ck_assert_str_eq(f.accuracy, b.accuracy);
  ck_assert_str_eq(f.correct, b.correct);
  ck_assert_int_eq(f.default_batch, b.default_batch);
  ck_assert_int_eq(f.image_ndim, b.image_ndim);
  for (int i = 0; i < b.image_ndim; i++) ck_assert_int_eq(f.image_dims[i], b.image_dims[i]);
  /* The builder is deterministic: the same calls give the same bytes. */
  ck_assert_uint_eq(f.len, b.len);
  ck_assert_msg(memcmp(f.bytes, b.bytes, b.len) == 0, "%s: program bytes differ", name);
  pe_program *p = NULL;
  PE_CK_OK(pe_program_decode(f.bytes, f.len, &p));
  PE_CK_OK(pe_program_validate(p));
  ck_assert_str_eq(p->opt.type, "momentum");
  pe_program_free(p);
  pe_model_spec_release(&f);
  pe_model_spec_release(&b);
}

START_TEST(mlp_file_is_the_builtin_mlp) {
  check_file_equals_builtin("mlp");
}
END_TEST

START_TEST(cnn_file_is_the_builtin_cnn) {
  check_file_equals_builtin("cnn");
}
END_TEST

/* Parse text; expect failure with `want` in the message. */
static void expect_parse_error(const char *text, const char *want) {
  pe_model_spec m;
  char err[512] = "";
  int rc = pe_model_file_parse(text, strlen(text), "cnn", &m, err, sizeof err);
  ck_assert_msg(rc == -1, "parsed, expected error '%s'", want);
  ck_assert_msg(strstr(err, want), "'%s' not in: %s", want, err);
}

#define HEAD "input image 1 28 28\nlabel label\n"
#define TAIL "loss softmax_with_cross_entropy\naccuracy\noptimizer sgd lr=0.1\n"

START_TEST(errors_carry_the_line) {
  expect_parse_error(HEAD "conv2d 32 5\n\n# comment\nconv3d 3 3\n" TAIL,
                     "cnn:6: unknown layer 'conv3d' (known: ");
  expect_parse_error(HEAD "fc abc\n" TAIL, "cnn:3: fc: size 'abc' is not an integer");
  /* The model name: once, and the daemon's characters, with the line (the
   * second line won silently; a bad name came back from the daemon
   * without file:line). */
  expect_parse_error("name a\n" HEAD "name b\nfc 10\n" TAIL,
                     "cnn:4: name: a second name line (line 1 names it)");
  expect_parse_error("name caf\xc3\xa9\n" HEAD "fc 10\n" TAIL,
                     "cnn:1: name: 'caf\xc3\xa9' has characters outside [A-Za-z0-9._-]");
  expect_parse_error("name .hidden\n" HEAD "fc 10\n" TAIL,
                     "cnn:1: name: '.hidden' starts with '.'");
  expect_parse_error(HEAD "fc 10 actt=relu\n" TAIL, "cnn:3: fc: unknown option 'actt'");
  expect_parse_error(HEAD "fc 10 act=reul\n" TAIL, "cnn:3: fc: unknown act 'reul'");
  expect_parse_error(HEAD "conv2d 32\n" TAIL, "cnn:3: conv2d: 1 argument(s), expected 2");
  expect_parse_error(HEAD "pool2d min 2\n" TAIL, "cnn:3: pool2d: kind 'min' is not max or avg");
  expect_parse_error("fc 10\n", "cnn:1: fc: no 'input' line before it");
  expect_parse_error(HEAD "fc 10\noptimizer sgd lr=0.1 mu=0.5\n",
                     "cnn:4: optimizer: option 'mu' does not apply");
  expect_parse_error(HEAD "fc 10\noptimizer sgd lr=0.1 weight_decay=2\n",
                     "cnn:4: optimizer: weight_decay '2' is not a number in [0, 1]");
  expect_parse_error(HEAD "fc 10\naccuracy\noptimizer sgd lr=0.1\n", "cnn: no 'loss' line");
  expect_parse_error(HEAD "fc 10\n" TAIL "fc 3\n", "cnn:7: fc: a layer after the 'loss' line");
  expect_parse_error(HEAD "dropout 1.5\n" TAIL, "cnn:3: dropout: probability '1.5'");
  /* Dims each in range whose product is not (an fc said 'unknown feature
   * dims'). */
  expect_parse_error("input image 1073741824 1073741824 1073741824\nlabel label\nfc 10\n" TAIL,
                     "cnn:1: input: dims 1073741824 x 1073741824 x 1073741824 make more than "
                     "2^40 elements per example");
  /* A builder error (pooling larger than the input) keeps its line. */
  expect_parse_error(HEAD "pool2d max 64\n" TAIL, "cnn:3: pool2d: ");
}
END_TEST

START_TEST(a_small_model_of_other_layers) {
  const char *text =
      "name tiny\nbatch 8\ninput x 1 8 8\nlabel y\n"
      "conv2d 4 3x3 stride=1 pad=1\nbatch_norm act=relu\npool2d avg 2 stride=2\n"
      "flatten\nfc 16 act=tanh no_bias\nfc 3\n"
      "loss softmax_with_cross_entropy\naccuracy top=2\n"
      "optimizer adam lr=0.001 weight_decay=0.0005\n";
  pe_model_spec m;
  char err[512];
  ck_assert_msg(pe_model_file_parse(text, strlen(text), "tiny-src", &m, err, sizeof err) == 0, "%s",
                err);
  ck_assert_str_eq(m.name, "tiny");
  ck_assert_int_eq(m.default_batch, 8);
  ck_assert_str_eq(m.image, "x");
  ck_assert_str_eq(m.label, "y");
  ck_assert_int_eq(m.image_ndim, 4);
  ck_assert_int_eq(m.image_dims[3], 8);
  pe_program *p = NULL;
  PE_CK_OK(pe_program_decode(m.bytes, m.len, &p));
  PE_CK_OK(pe_program_validate(p));
  ck_assert_str_eq(p->opt.type, "adam");
  ck_assert(p->opt.weight_decay == 0.0005f);
  ck_assert_str_eq(p->loss, m.loss);
  pe_var_desc *w = pe_block_find_var_local(pe_program_main(p), "conv2d_0.w");
  ck_assert_ptr_nonnull(w);
  ck_assert_int_eq(w->shape.d[0], 4);
  ck_assert_int_eq(w->shape.d[2], 3);
  ck_assert_ptr_null(pe_block_find_var_local(pe_program_main(p), "fc_0.b")); /* no_bias */
  pe_program_free(p);
  pe_model_spec_release(&m);
}
END_TEST

/* Parse text (a small fc model); the packed ProgramDesc, unpacked. */
static Pe__ProgramDesc *parse_unpacked(const char *text) {
  pe_model_spec m;
  char err[512];
  ck_assert_msg(pe_model_file_parse(text, strlen(text), "sched", &m, err, sizeof err) == 0, "%s",
                err);
  /* the daemon accepts it */
  pe_program *p = NULL;
  PE_CK_OK(pe_program_decode(m.bytes, m.len, &p));
  PE_CK_OK(pe_program_validate(p));
  pe_program_free(p);
  Pe__ProgramDesc *pd = pe__program_desc__unpack(NULL, m.len, m.bytes);
  ck_assert_ptr_nonnull(pd);
  pe_model_spec_release(&m);
  ck_assert_ptr_nonnull(pd->train);
  ck_assert_ptr_nonnull(pd->train->optimizer);
  return pd;
}

#define FC_MODEL "input x 4\nlabel y\nfc 3\nloss softmax_with_cross_entropy\naccuracy\n"

START_TEST(schedule_line) {
  /* schedule before the optimizer line */
  Pe__ProgramDesc *pd =
      parse_unpacked(FC_MODEL
                     "schedule multistep warmup=20 gamma=0.25 milestones=100,250,4000000000\n"
                     "optimizer momentum lr=0.1 mu=0.9\n");
  const Pe__OptimizerDesc *od = pd->train->optimizer;
  ck_assert_str_eq(od->type, "momentum");
  ck_assert(od->learning_rate == 0.1f);
  const Pe__LrSchedule *ls = od->lr_schedule;
  ck_assert_ptr_nonnull(ls);
  ck_assert_str_eq(ls->type, "multistep");
  ck_assert_int_eq(ls->warmup_steps, 20);
  ck_assert_int_eq(ls->decay_steps, 0);
  ck_assert(ls->gamma == 0.25f);
  ck_assert(ls->min_lr == 0.0f);
  ck_assert_uint_eq(ls->n_milestones, 3);
  ck_assert_int_eq(ls->milestones[0], 100);
  ck_assert_int_eq(ls->milestones[1], 250);
  ck_assert_int_eq(ls->milestones[2], 4000000000LL);
  pe__program_desc__free_unpacked(pd, NULL);
  /* after it */
  pd = parse_unpacked(FC_MODEL
                      "optimizer adam lr=0.001\n"
                      "schedule cosine warmup=500 decay_steps=9000 min_lr=0.0001\n");
  ls = pd->train->optimizer->lr_schedule;
  ck_assert_ptr_nonnull(ls);
  ck_assert_str_eq(ls->type, "cosine");
  ck_assert_int_eq(ls->warmup_steps, 500);
  ck_assert_int_eq(ls->decay_steps, 9000);
  ck_assert(ls->gamma == 0.0f);
  ck_assert(ls->min_lr == 0.0001f);
  ck_assert_uint_eq(ls->n_milestones, 0);
  pe__program_desc__free_unpacked(pd, NULL);
  /* no schedule line: no schedule */
  pd = parse_unpacked(FC_MODEL "optimizer sgd lr=0.1\n");
  ck_assert_ptr_null(pd->train->optimizer->lr_schedule);
  pe__program_desc__free_unpacked(pd, NULL);
}
END_TEST

/* VarDesc.no_weight_decay of `name` in the main block of pd. */
static bool no_decay(const Pe__ProgramDesc *pd, const char *name) {
  const Pe__BlockDesc *m = pd->blocks[pd->main_block];
  for (size_t i = 0; i < m->n_vars; i++)
    if (!strcmp(m->vars[i]->name, name)) return m->vars[i]->no_weight_decay;
  ck_abort_msg("no variable %s", name);
  return false;
}

START_TEST(adamw_and_no_decay_1d) {
  Pe__ProgramDesc *pd = parse_unpacked(
      "input x 4\nlabel y\nfc 8 act=relu\nbatch_norm\nfc 3\nloss softmax_with_cross_entropy\n"
      "accuracy\noptimizer adamw lr=0.001 beta2=0.99 weight_decay=0.05 no_decay_1d clip_norm=5\n");
  const Pe__OptimizerDesc *od = pd->train->optimizer;
  ck_assert_str_eq(od->type, "adamw");
  ck_assert(od->grad_clip_norm == 5.0f);
  ck_assert(od->learning_rate == 0.001f && od->beta2 == 0.99f && od->weight_decay == 0.05f);
  ck_assert(!no_decay(pd, "fc_0.w") && !no_decay(pd, "fc_1.w"));
  ck_assert(no_decay(pd, "fc_0.b") && no_decay(pd, "fc_1.b"));
  ck_assert(no_decay(pd, "batch_norm_0.scale") && no_decay(pd, "batch_norm_0.bias"));
  ck_assert(!no_decay(pd, "batch_norm_0.mean") && !no_decay(pd, "batch_norm_0.variance"));
  pe__program_desc__free_unpacked(pd, NULL);
  /* adamw without weight_decay: 0, the daemon's default (0.01); no flag, no exemption */
  pd = parse_unpacked(FC_MODEL "optimizer adamw lr=0.001 no_decay_1d\n");
  ck_assert(pd->train->optimizer->weight_decay == 0.0f && no_decay(pd, "fc_0.b"));
  pe__program_desc__free_unpacked(pd, NULL);
  pd = parse_unpacked(FC_MODEL "optimizer sgd lr=0.1 weight_decay=0.001\n");
  ck_assert(!no_decay(pd, "fc_0.b") && pd->train->optimizer->grad_clip_norm == 0.0f);
  pe__program_desc__free_unpacked(pd, NULL);
  pd = parse_unpacked(FC_MODEL "optimizer momentum lr=0.1 weight_decay=0.001 no_decay_1d\n");
  ck_assert(no_decay(pd, "fc_0.b") && !no_decay(pd, "fc_0.w"));
  pe__program_desc__free_unpacked(pd, NULL);
}
END_TEST

/* Parse text; expect failure with exactly `want`. */
static void expect_parse_error_eq(const char *text, const char *want) {
  pe_model_spec m;
  char err[512] = "";
  int rc = pe_model_file_parse(text, strlen(text), "cnn", &m, err, sizeof err);
  ck_assert_msg(rc == -1, "parsed, expected error '%s'", want);
  ck_assert_str_eq(err, want);
}

START_TEST(optimizer_errors_carry_the_line) {
  expect_parse_error_eq(FC_MODEL "optimizer adagrad lr=0.1\n",
                        "cnn:6: optimizer: unknown kind 'adagrad' (known: sgd, momentum, adam, "
                        "adamw)");
  expect_parse_error_eq(FC_MODEL "optimizer adam lr=0.1 no_decay_1d\n",
                        "cnn:6: optimizer: no_decay_1d exempts parameters from weight decay, but "
                        "adam has none (weight_decay=X)");
  expect_parse_error(FC_MODEL "optimizer adamw lr=0.1 mu=0.9\n",
                     "cnn:6: optimizer: option 'mu' does not apply here (usage: optimizer "
                     "sgd|momentum|adam|adamw lr=X");
  expect_parse_error(FC_MODEL "optimizer sgd lr=0.1 clip_norm=-1\n",
                     "cnn:6: optimizer: clip_norm '-1' is not a number in [0, 1e+06]");
  /* The daemon's ranges, with the line (it refused them later, without
   * one, where the file's check had said lr may be 0). */
  expect_parse_error_eq(FC_MODEL "optimizer momentum lr=0 mu=0.9\n",
                        "cnn:6: optimizer: lr '0' is not a number in (0, 1e+06]");
  expect_parse_error_eq(FC_MODEL "optimizer momentum lr=0.1 mu=1\n",
                        "cnn:6: optimizer: mu '1' is not a number in [0, 1)");
  expect_parse_error_eq(FC_MODEL "optimizer adam lr=0.001 epsilon=0\n",
                        "cnn:6: optimizer: epsilon '0' is not a number in (0, 1]");
  expect_parse_error_eq(FC_MODEL "optimizer adamw lr=0.001 beta2=1\n",
                        "cnn:6: optimizer: beta2 '1' is not a number in [0, 1)");
  /* A flag given a value (it read as an unknown option). */
  expect_parse_error(FC_MODEL "optimizer adamw lr=0.1 no_decay_1d=1\n",
                     "cnn:6: optimizer: option 'no_decay_1d' takes no value (usage: ");
  expect_parse_error(FC_MODEL "optimizer momentum lr=0.1 mu=0.9 nesterov=1\n",
                     "cnn:6: optimizer: option 'nesterov' takes no value (usage: ");
}
END_TEST

START_TEST(schedule_errors_carry_the_line) {
  expect_parse_error_eq(FC_MODEL "optimizer sgd lr=0.1\nschedule poly decay_steps=10\n",
                        "cnn:7: schedule: unknown kind 'poly' (known: constant, step, multistep, "
                        "exponential, cosine, linear)");
  expect_parse_error_eq(FC_MODEL "schedule multistep milestones=10,x,30\n",
                        "cnn:6: schedule: milestones 'x' is not an integer in "
                        "[1, 4611686018427387904]");
  expect_parse_error_eq(FC_MODEL "schedule multistep milestones=10,,30\n",
                        "cnn:6: schedule: milestones '10,,30' is not a comma-separated list of "
                        "integers");
  expect_parse_error_eq(FC_MODEL "schedule multistep milestones=10,20,\n",
                        "cnn:6: schedule: milestones '10,20,' is not a comma-separated list of "
                        "integers");
  expect_parse_error_eq(FC_MODEL "schedule multistep milestones=-5\n",
                        "cnn:6: schedule: milestones '-5' is not an integer in "
                        "[1, 4611686018427387904]");
  char list[256] = "1", text[512], want[512];
  for (int i = 2; i <= 33; i++) snprintf(list + strlen(list), sizeof list - strlen(list), ",%d", i);
  snprintf(text, sizeof text, FC_MODEL "schedule multistep milestones=%s\n", list);
  snprintf(want, sizeof want, "cnn:6: schedule: milestones '%s' has more than 32 values", list);
  expect_parse_error_eq(text, want);
  expect_parse_error_eq(FC_MODEL "schedule step decay_steps=-1\n",
                        "cnn:6: schedule: decay_steps '-1' is not an integer in "
                        "[1, 4611686018427387904]");
  expect_parse_error_eq(FC_MODEL "schedule step decay_steps=10 gamma=2\n",
                        "cnn:6: schedule step: gamma '2' is not a number in (0, 1] (left out: "
                        "0.1)");
  expect_parse_error_eq(FC_MODEL "schedule step decay_steps=10 mu=0.9\n",
                        "cnn:6: schedule: unknown option 'mu' (usage: schedule "
                        "constant|step|multistep|exponential|cosine|linear [warmup=N] "
                        "[decay_steps=N] [gamma=X] [min_lr=X] [milestones=A,B,C])");
  expect_parse_error_eq(FC_MODEL
                        "schedule step decay_steps=10\noptimizer sgd lr=0.1\n"
                        "schedule cosine decay_steps=10\n",
                        "cnn:8: schedule: a second schedule line");
  expect_parse_error_eq(FC_MODEL "schedule cosine decay_steps=10\n",
                        "cnn:6: schedule: no 'optimizer' line (a schedule needs an optimizer)");
}
END_TEST

/* The schedule's values are checked in the file, with the line, in the
 * daemon's ranges (what parses registers): what each kind needs, gamma in
 * (0, 1] (an explicit 0 is not the default), decay_steps >= 1, min_lr
 * below the optimizer's lr (on either side of it), milestones increasing;
 * an option the kind does not use is refused. */
START_TEST(schedule_values_are_checked_in_the_file) {
#define OPT "optimizer sgd lr=0.1\n"
  expect_parse_error_eq(
      FC_MODEL OPT "schedule step decay_steps=10 gamma=0\n",
      "cnn:7: schedule step: gamma '0' is not a number in (0, 1] (left out: 0.1)");
  expect_parse_error_eq(FC_MODEL OPT "schedule exponential gamma=0.0\n",
                        "cnn:7: schedule exponential: gamma '0.0' is not a number in (0, 1]");
  expect_parse_error_eq(FC_MODEL OPT "schedule exponential decay_steps=10\n",
                        "cnn:7: schedule exponential: no gamma=... (the factor per decay_steps "
                        "steps)");
  expect_parse_error_eq(FC_MODEL OPT "schedule step\n",
                        "cnn:7: schedule step: no decay_steps=... (the steps between decays)");
  expect_parse_error_eq(FC_MODEL OPT "schedule cosine min_lr=0.01\n",
                        "cnn:7: schedule cosine: no decay_steps=... (the steps from lr to min_lr)");
  expect_parse_error_eq(FC_MODEL OPT "schedule multistep gamma=0.5\n",
                        "cnn:7: schedule multistep: no milestones=... (the steps to decay at)");
  expect_parse_error_eq(FC_MODEL OPT "schedule cosine decay_steps=0\n",
                        "cnn:7: schedule: decay_steps '0' is not an integer in "
                        "[1, 4611686018427387904]");
  expect_parse_error_eq(FC_MODEL OPT "schedule cosine decay_steps=10 gamma=0.5\n",
                        "cnn:7: schedule cosine: option 'gamma' does not apply (cosine takes: "
                        "warmup decay_steps min_lr)");
  expect_parse_error_eq(FC_MODEL OPT "schedule step decay_steps=10 min_lr=0.01\n",
                        "cnn:7: schedule step: option 'min_lr' does not apply (step takes: "
                        "warmup decay_steps gamma)");
  expect_parse_error_eq(FC_MODEL OPT "schedule constant decay_steps=10\n",
                        "cnn:7: schedule constant: option 'decay_steps' does not apply (constant "
                        "takes: warmup)");
  expect_parse_error_eq(FC_MODEL OPT "schedule multistep milestones=10,30,20\n",
                        "cnn:7: schedule multistep: milestones '10,30,20' do not increase (20 "
                        "after 30)");
  /* min_lr against the optimizer's lr, whichever line comes first */
  expect_parse_error_eq(FC_MODEL OPT "schedule cosine decay_steps=10 min_lr=0.1\n",
                        "cnn:7: schedule cosine: min_lr 0.1 must be below the optimizer's lr 0.1");
  expect_parse_error_eq(FC_MODEL "schedule linear decay_steps=10 min_lr=0.5\n" OPT,
                        "cnn:6: schedule linear: min_lr 0.5 must be below the optimizer's lr 0.1");
  /* each kind with what it takes parses (and the daemon accepts it) */
  const char *ok[] = {"constant warmup=5",           "step decay_steps=10",
                      "step decay_steps=10 gamma=1", "multistep milestones=5,10",
                      "exponential gamma=0.9",       "exponential decay_steps=3 gamma=0.5",
                      "cosine decay_steps=10",       "linear warmup=2 decay_steps=10 min_lr=0.001"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    char text[512];
    snprintf(text, sizeof text, FC_MODEL OPT "schedule %s\n", ok[i]);
    pe__program_desc__free_unpacked(parse_unpacked(text), NULL);
  }
#undef OPT
}
END_TEST

/* The op of main block type `type` that writes `out`; NULL if none. */
static const pe_op_desc *writer_of(const pe_program *p, const char *type, const char *out) {
  const pe_block *b = pe_program_main(p);
  for (int i = 0; i < b->n_ops; i++)
    if (!strcmp(b->ops[i]->type, type) && !strcmp(pe_op_output_arg(b->ops[i], "Out"), out))
      return b->ops[i];
  return NULL;
}

/* save / from / add: a residual sum reads the saved variable and the
 * current one; `from` feeds the saved variable to the next layer; a label
 * saved again names the newer variable. */
START_TEST(residual_statements) {
  const char *text =
      "input x 8\nlabel y\n"
      "fc 8 act=relu\nsave a\n"        /* fc_0.out */
      "fc 8\nadd a act=relu\n"         /* add_0: fc_1.out + fc_0.out */
      "save a\nfc 8\nsave m\nfrom a\n" /* a = add_0.out; fc_2 on it */
      "fc 8\nadd m name=join\n"        /* join: fc_3.out + fc_2.out */
      "fc 3\nloss softmax_with_cross_entropy\naccuracy\noptimizer sgd lr=0.1\n";
  pe_model_spec m;
  char err[512];
  ck_assert_msg(pe_model_file_parse(text, strlen(text), "res", &m, err, sizeof err) == 0, "%s",
                err);
  pe_program *p = NULL;
  PE_CK_OK(pe_program_decode(m.bytes, m.len, &p));
  PE_CK_OK(pe_program_validate(p));
  const pe_op_desc *a0 = writer_of(p, "elementwise_add", "add_0.tmp_0");
  ck_assert_ptr_nonnull(a0);
  ck_assert_str_eq(pe_op_input_arg(a0, "X"), "fc_1.out");
  ck_assert_str_eq(pe_op_input_arg(a0, "Y"), "fc_0.out");
  ck_assert_ptr_nonnull(writer_of(p, "relu", "add_0.out"));
  const pe_op_desc *f3 = writer_of(p, "matmul", "fc_3.tmp_0");
  ck_assert_ptr_nonnull(f3);
  ck_assert_str_eq(pe_op_input_arg(f3, "X"), "add_0.out"); /* from a: the second save */
  const pe_op_desc *j = writer_of(p, "elementwise_add", "join.out");
  ck_assert_ptr_nonnull(j);
  ck_assert_str_eq(pe_op_input_arg(j, "X"), "fc_3.out");
  ck_assert_str_eq(pe_op_input_arg(j, "Y"), "fc_2.out");
  const pe_op_desc *f4 = writer_of(p, "matmul", "fc_4.tmp_0");
  ck_assert_ptr_nonnull(f4);
  ck_assert_str_eq(pe_op_input_arg(f4, "X"), "join.out");
  pe_program_free(p);
  pe_model_spec_release(&m);
}
END_TEST

START_TEST(residual_errors_carry_the_line) {
  expect_parse_error("save a\n", "cnn:1: save: no 'input' line before it");
  expect_parse_error(HEAD "fc 8\nadd a\n" TAIL,
                     "cnn:4: add: no 'save a' line before it (saved: none)");
  expect_parse_error(HEAD "save x\nsave y\nfrom z\n" TAIL,
                     "cnn:5: from: no 'save z' line before it (saved: x, y)");
  expect_parse_error(HEAD "save a-b\n" TAIL,
                     "cnn:3: save: label 'a-b' must be 1 to 31 letters, digits or '_'");
  expect_parse_error(HEAD "conv2d 4 3 pad=1\nsave a\nconv2d 4 3 stride=2 pad=1\nadd a\n" TAIL,
                     "cnn:6: add: add 'add_0': 'conv2d_1.out' [-1,4,14,14] and 'conv2d_0.out' "
                     "[-1,4,28,28] differ");
  expect_parse_error(HEAD "save a\nadd a act=gelu\n" TAIL, "cnn:4: add: unknown act 'gelu'");
  expect_parse_error(HEAD "save a\nfrom a extra\n" TAIL, "cnn:4: from: 2 argument(s), expected 1");
}
END_TEST

/* conf/models/resnet: three residual blocks, two of them with a projection
 * shortcut; the daemon's IR accepts it. */
START_TEST(resnet_file) {
  char path[1024], err[512];
  conf_path(path, sizeof path, "resnet");
  pe_model_spec m;
  ck_assert_msg(pe_model_file_load(path, &m, err, sizeof err) == 0, "%s", err);
  ck_assert_str_eq(m.name, "resnet");
  pe_program *p = NULL;
  PE_CK_OK(pe_program_decode(m.bytes, m.len, &p));
  PE_CK_OK(pe_program_validate(p));
  const pe_block *b = pe_program_main(p);
  int adds = 0, convs = 0;
  for (int i = 0; i < b->n_ops; i++) {
    convs += !strcmp(b->ops[i]->type, "conv2d");
    adds += !strcmp(b->ops[i]->type, "elementwise_add") &&
            !strncmp(pe_op_output_arg(b->ops[i], "Out"), "add_", 4);
  }
  ck_assert_int_eq(adds, 3);
  ck_assert_int_eq(convs, 9);
  ck_assert_str_eq(p->opt.type, "momentum");
  pe_program_free(p);
  pe_model_spec_release(&m);
}
END_TEST

/* A UTF-8 byte order mark at the start is skipped (it read as an
 * invisible unknown layer). */
START_TEST(byte_order_mark_is_skipped) {
  static const char text[] = "\xef\xbb\xbfname bom\n" FC_MODEL "optimizer sgd lr=0.1\n";
  pe_model_spec m;
  char err[512] = "";
  ck_assert_msg(pe_model_file_parse(text, strlen(text), "bom", &m, err, sizeof err) == 0, "%s",
                err);
  ck_assert_str_eq(m.name, "bom");
  pe_model_spec_release(&m);
  /* Elsewhere it is no layer. */
  expect_parse_error(FC_MODEL "\xef\xbb\xbfoptimizer sgd lr=0.1\n", "cnn:6: unknown layer");
}
END_TEST

START_TEST(missing_file) {
  pe_model_spec m;
  char err[512];
  ck_assert_int_eq(pe_model_file_load("/nonexistent/model", &m, err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "/nonexistent/model: No such file"));
  /* A directory: said so (it was 'read error'). */
  ck_assert_int_eq(pe_model_resolve("/tmp/", &m, err, sizeof err), -1);
  ck_assert_str_eq(err, "/tmp/: is a directory, not a model file");
}
END_TEST

/* A bare name that is no built-in is looked up in the installed models
 * directory (`--model resnet` after cmake --install finds the installed
 * file); an unknown name's error names that directory. */
START_TEST(bare_name_in_models_dir) {
  char dir[] = "/tmp/pe-models-XXXXXX", src[1024], dst[1100], cmd[2400], err[1024];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  conf_path(src, sizeof src, "resnet");
  snprintf(dst, sizeof dst, "%s/resnet", dir);
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, dst);
  ck_assert_int_eq(system(cmd), 0);
  pe_model_spec m, f;
  ck_assert_msg(pe_model_resolve_in("resnet", dir, &m, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(pe_model_file_load(src, &f, err, sizeof err) == 0, "%s", err);
  ck_assert_uint_eq(m.len, f.len);
  ck_assert(memcmp(m.bytes, f.bytes, f.len) == 0);
  pe_model_spec_release(&m);
  pe_model_spec_release(&f);
  /* Built-ins come first; an unknown name names the directory. */
  ck_assert_msg(pe_model_resolve_in("mlp", dir, &m, err, sizeof err) == 0, "%s", err);
  pe_model_spec_release(&m);
  ck_assert_int_ne(pe_model_resolve_in("resnet50", dir, &m, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "unknown model 'resnet50'") && strstr(err, dir), "%s", err);
  ck_assert_int_ne(pe_model_resolve_in("resnet", NULL, &m, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "(or give a model file path)"), "%s", err);
  /* pe_model_resolve searches where cmake --install puts conf/models. */
  ck_assert_int_ne(pe_model_resolve("resnet50", &m, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "/share/pe-executord/models"), "%s", err);
  unlink(dst);
  rmdir(dir);
}
END_TEST

/* A small language model in the sequence words: token and target feeds
 * of T positions, embedding, learned positions, attention and transformer
 * blocks sharing one causal mask, per-position logits flattened into rows
 * for the loss and the accuracy. */
#define SEQ_HEAD "tokens t 8\ntargets y 8\n"
#define SEQ_TAIL "loss softmax_with_cross_entropy\naccuracy\noptimizer adamw lr=0.001\n"

static int count_ops(const Pe__BlockDesc *blk, const char *type) {
  int n = 0;
  for (size_t i = 0; i < blk->n_ops; i++) n += !strcmp(blk->ops[i]->type, type);
  return n;
}

START_TEST(sequence_words) {
  const char *text = SEQ_HEAD
      "embedding 20 16 padding_idx=0\npos_embedding\nattention 4 causal\nlayer_norm\n"
      "transformer_block 2 32 causal\ntransformer_block 2 32\ngelu approximate\n"
      "layer_norm epsilon=0.001\nfc 20 num_col_dims=2\n" SEQ_TAIL;
  Pe__ProgramDesc *pd = parse_unpacked(text);
  const Pe__BlockDesc *mb = pd->blocks[pd->main_block];
  ck_assert_int_eq(count_ops(mb, "lookup_table_v2"), 1);
  ck_assert_int_eq(count_ops(mb, "tril_triu"), 1); /* one mask for both causal lines */
  ck_assert_int_eq(count_ops(mb, "scaled_dot_product_attention"), 3); /* three attentions */
  ck_assert_int_eq(count_ops(mb, "elementwise_add") > 0, 1);
  ck_assert_int_eq(count_ops(mb, "layer_norm"), 2 + 2 * 2);
  /* the learned positions: a [T, D] parameter */
  bool found = false;
  for (size_t i = 0; i < mb->n_vars; i++)
    if (!strcmp(mb->vars[i]->name, "pos_embedding_0.w")) {
      found = mb->vars[i]->persistable;
      ck_assert_uint_eq(mb->vars[i]->n_shape, 2);
      ck_assert_int_eq(mb->vars[i]->shape[0], 8);
      ck_assert_int_eq(mb->vars[i]->shape[1], 16);
    }
  ck_assert(found);
  pe__program_desc__free_unpacked(pd, NULL);
  pe_model_spec m;
  char err[512];
  ck_assert_msg(pe_model_file_parse(text, strlen(text), "seq", &m, err, sizeof err) == 0, "%s",
                err);
  ck_assert_str_eq(m.image, "t");
  ck_assert_str_eq(m.label, "y");
  ck_assert_int_eq(m.image_dtype, PE_I64);
  ck_assert_int_eq(m.image_ndim, 2);
  ck_assert_int_eq(m.image_dims[1], 8);
  ck_assert_int_eq(m.label_len, 8);
  pe_model_spec_release(&m);
  /* an image model keeps f32 and [-1, 1] labels */
  ck_assert_msg(pe_model_file_parse(FC_MODEL, strlen(FC_MODEL), "fc", &m, err, sizeof err) == 0,
                "%s", err);
  ck_assert_int_eq(m.image_dtype, PE_F32);
  ck_assert_int_eq(m.label_len, 0);
  pe_model_spec_release(&m);
}
END_TEST

/* `sparse` on an embedding line: its lookup_table_v2 op carries is_sparse
 * true; without it the op has no is_sparse (dense). */
static int sparse_attr(const char *text) {
  Pe__ProgramDesc *pd = parse_unpacked(text);
  const Pe__BlockDesc *mb = pd->blocks[pd->main_block];
  int found = -1; /* -1: no lookup_table_v2; 0: no is_sparse; 1: false; 2: true */
  for (size_t i = 0; i < mb->n_ops; i++) {
    if (strcmp(mb->ops[i]->type, "lookup_table_v2")) continue;
    found = 0;
    for (size_t j = 0; j < mb->ops[i]->n_attrs; j++)
      if (!strcmp(mb->ops[i]->attrs[j]->name, "is_sparse")) {
        ck_assert_int_eq(mb->ops[i]->attrs[j]->type, PE__ATTR_TYPE__BOOL);
        found = mb->ops[i]->attrs[j]->b ? 2 : 1;
      }
  }
  pe__program_desc__free_unpacked(pd, NULL);
  return found;
}

START_TEST(embedding_sparse_word) {
  const char *body =
      "pos_embedding\nfc 20 num_col_dims=2\n"
      "loss softmax_with_cross_entropy\naccuracy\noptimizer adam lr=0.001\n";
  char text[512];
  snprintf(text, sizeof text, SEQ_HEAD "embedding 20 16 padding_idx=0 sparse name=emb\n%s", body);
  ck_assert_int_eq(sparse_attr(text), 2);
  snprintf(text, sizeof text, SEQ_HEAD "embedding 20 16 name=emb\n%s", body);
  ck_assert_int_eq(sparse_attr(text), 0);
  expect_parse_error_eq(SEQ_HEAD "embedding 20 16 sparse=1\n",
                        "cnn:3: embedding: option 'sparse' takes no value (usage: embedding VOCAB "
                        "DIM [padding_idx=N] [sparse] [name=S])");
}
END_TEST

START_TEST(sequence_errors_carry_the_line) {
  expect_parse_error_eq("tokens t 0\n",
                        "cnn:1: tokens: length '0' is not an integer in [1, 32768]");
  expect_parse_error_eq("tokens t 8\ntargets y 9\n",
                        "cnn:2: targets: length 9 differs from the tokens' 8");
  expect_parse_error_eq("targets y 9\ntokens t 8\n",
                        "cnn:2: tokens: length 8 differs from the targets' 9");
  expect_parse_error_eq("input x 4\ntokens t 8\n",
                        "cnn:2: tokens: a second input ('x' is declared)");
  expect_parse_error(SEQ_HEAD "embedding 20\n", "cnn:3: embedding: 1 argument(s), expected 2");
  expect_parse_error_eq(SEQ_HEAD "embedding 20 16 padding_idx=20\n",
                        "cnn:3: embedding: padding_idx '20' is not an integer in [0, 19]");
  expect_parse_error("input x 4\nlabel y\nembedding 20 16\n",
                     "cnn:3: embedding: embedding 'embedding_0': ids 'x' [-1,4] must be i64");
  expect_parse_error(SEQ_HEAD "pos_embedding\n",
                     "cnn:3: pos_embedding: pos_embedding 'pos_embedding_0': input 't' [-1,8] "
                     "must be f32 [B, T, D]");
  expect_parse_error_eq("input x 4\nlabel y\nattention 2 causal\n",
                        "cnn:3: attention: causal needs an input [B, T, D] with T known ('x' is "
                        "[-1,4])");
  expect_parse_error(SEQ_HEAD "embedding 20 16\nattention 3\n",
                     "cnn:4: attention: attention 'attention_0': input 'embedding_0.out' "
                     "[-1,8,16] must be f32 [B, T, D] with T and D known and D divisible by "
                     "num_heads 3");
  expect_parse_error(SEQ_HEAD "embedding 20 16\ntransformer_block 2 32 dropout=0.1\n",
                     "cnn:4: transformer_block: unknown option 'dropout'");
  expect_parse_error_eq(SEQ_HEAD "embedding 20 16\nflatten\nfc 20\n" SEQ_TAIL,
                        "cnn:6: loss: logits 'fc_0.out' [-1,20] must be [B, 8, C] for the "
                        "targets 'y' [-1,8]");
  expect_parse_error_eq(SEQ_HEAD "embedding 20 16\nfc 20 num_col_dims=2\naccuracy\n" SEQ_TAIL,
                        "cnn:5: accuracy: per-position targets are scored after the 'loss' line");
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("model_file");
  TCase *tc = tcase_create("model_file");
  tcase_add_test(tc, mlp_file_is_the_builtin_mlp);
  tcase_add_test(tc, cnn_file_is_the_builtin_cnn);
  tcase_add_test(tc, errors_carry_the_line);
  tcase_add_test(tc, a_small_model_of_other_layers);
  tcase_add_test(tc, schedule_line);
  tcase_add_test(tc, schedule_errors_carry_the_line);
  tcase_add_test(tc, schedule_values_are_checked_in_the_file);
  tcase_add_test(tc, adamw_and_no_decay_1d);
  tcase_add_test(tc, optimizer_errors_carry_the_line);
  tcase_add_test(tc, missing_file);
  tcase_add_test(tc, byte_order_mark_is_skipped);
  tcase_add_test(tc, residual_statements);
  tcase_add_test(tc, residual_errors_carry_the_line);
  tcase_add_test(tc, resnet_file);
  tcase_add_test(tc, bare_name_in_models_dir);
  tcase_add_test(tc, sequence_words);
  tcase_add_test(tc, embedding_sparse_word);
  tcase_add_test(tc, sequence_errors_carry_the_line);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
