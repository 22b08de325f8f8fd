/* Program builder: the models decode and validate in the daemon's IR, the
 * protobuf it emits has the documented shape (blocks, names, initialisers,
 * TrainSpec), errors are sticky and bad layer arguments are refused. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "compiler/pass.h"
#include "ir/program.h"
#include "compiler/validate.h"
#include "pe_builder.h"
#include "pe_models.h"
#include "program.pb-c.h"
#include "test_assert.h"

/* Decode + validate bytes; returns the program (caller frees). */
static pe_program *decode_valid(const uint8_t *bytes, size_t len) {
  pe_program *p = NULL;
  PE_CK_OK(pe_program_decode(bytes, len, &p));
  PE_CK_OK(pe_program_validate(p));
  return p;
}

static void check_model_decodes(const char *name, int n_params) {
  pe_model_spec m;
  char err[256];
  ck_assert_msg(pe_model_spec_build(name, &m, err, sizeof err) == 0, "%s", err);
  pe_program *p = decode_valid(m.bytes, m.len);
  ck_assert_int_eq(p->n_blocks, 2);
  ck_assert_int_eq(p->main_block, 0);
  ck_assert_int_eq(p->startup_block, 1);
  ck_assert_str_eq(p->loss, m.loss);
  ck_assert_str_eq(p->opt.type, "momentum");
  ck_assert_float_eq_tol(p->opt.momentum, 0.9f, 1e-7);
  pe_block *startup = pe_program_startup(p), *main = pe_program_main(p);
  ck_assert_int_eq(startup->parent, -1);
  ck_assert_int_eq(startup->n_ops, n_params); /* one initialiser per parameter */
  pe_var_desc *img = pe_block_find_var_local(main, m.image);
  ck_assert(img && img->is_feed && img->shape.d[0] == -1);
  pe_var_desc *acc = pe_block_find_var_local(main, m.accuracy);
  ck_assert(acc && acc->dtype == PE_F32 && acc->shape.ndim == 1 && acc->shape.d[0] == 1);
  pe_program_free(p);
  pe_model_spec_release(&m);
}

START_TEST(mlp_decodes_and_validates) {
  check_model_decodes("mlp", 6);
}
END_TEST

START_TEST(cnn_decodes_and_validates) {
  check_model_decodes("cnn", 8);
}
END_TEST

START_TEST(unknown_model) {
  pe_model_spec m;
  char err[128];
  ck_assert_int_eq(pe_model_spec_build("resnet", &m, err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "unknown model 'resnet'"));
}
END_TEST

/* --- the raw protobuf -------------------------------------------------------- */

static const Pe__VarDesc *pb_var(const Pe__BlockDesc *b, const char *name) {
  for (size_t i = 0; i < b->n_vars; i++)
    if (strcmp(b->vars[i]->name, name) == 0) return b->vars[i];
  return NULL;
}

static const Pe__OpDesc *pb_writer(const Pe__BlockDesc *b, const char *var) {
  for (size_t i = 0; i < b->n_ops; i++)
    for (size_t s = 0; s < b->ops[i]->n_outputs; s++)
      if (strcmp(b->ops[i]->outputs[s]->arguments[0], var) == 0) return b->ops[i];
  return NULL;
}

static const Pe__Attr *pb_attr(const Pe__OpDesc *op, const char *name) {
  for (size_t i = 0; i < op->n_attrs; i++)
    if (strcmp(op->attrs[i]->name, name) == 0) return op->attrs[i];
  return NULL;
}

static void check_shape(const Pe__VarDesc *v, int n, const int64_t *d) {
  ck_assert_ptr_nonnull(v);
  ck_assert_int_eq(v->n_shape, n);
  for (int i = 0; i < n; i++) ck_assert_int_eq(v->shape[i], d[i]);
}

START_TEST(mlp_protobuf_layout) {
  pe_model_spec m;
  char err[256];
  ck_assert_int_eq(pe_model_spec_build("mlp", &m, err, sizeof err), 0);
  Pe__ProgramDesc *pd = pe__program_desc__unpack(NULL, m.len, m.bytes);
  ck_assert_ptr_nonnull(pd);
  ck_assert_int_eq(pd->n_blocks, 2);
  const Pe__BlockDesc *mb = pd->blocks[0], *sb = pd->blocks[1];
  ck_assert_int_eq(mb->idx, 0);
  ck_assert_int_eq(mb->parent_idx, -1);
  ck_assert_int_eq(sb->idx, 1);
  ck_assert_int_eq(sb->parent_idx, -1);
  ck_assert_int_eq(pd->startup_block, 1);
  ck_assert_str_eq(pd->train->loss, "mean_0.out");
  ck_assert_str_eq(pd->train->optimizer->type, "momentum");
  ck_assert_float_eq_tol(pd->train->optimizer->learning_rate, 0.1f, 1e-7);
  /* weights: declared in both blocks, persistable, Xavier-uniform */
  const Pe__VarDesc *w = pb_var(mb, "fc_0.w");
  check_shape(w, 2, (int64_t[]){784, 256});
  ck_assert(w->persistable && !w->stop_gradient);
  ck_assert(pb_var(sb, "fc_0.w") && pb_var(sb, "fc_0.w")->persistable);
  const Pe__OpDesc *init = pb_writer(sb, "fc_0.w");
  ck_assert_str_eq(init->type, "uniform_random");
  float lim = sqrtf(6.0f / (784 + 256));
  ck_assert_float_eq_tol(pb_attr(init, "max")->f, lim, 1e-6);
  ck_assert_float_eq_tol(pb_attr(init, "min")->f, -lim, 1e-6);
  ck_assert_int_eq(pb_attr(init, "shape")->n_ints, 2);
  init = pb_writer(sb, "fc_2.b");
  ck_assert_str_eq(init->type, "fill_constant");
  ck_assert_float_eq(pb_attr(init, "value")->f, 0.0f);
  /* every intermediate is declared with dtype and a -1 batch */
  check_shape(pb_var(mb, "fc_0.tmp_0"), 2, (int64_t[]){-1, 256});
  check_shape(pb_var(mb, "fc_0.out"), 2, (int64_t[]){-1, 256});
  check_shape(pb_var(mb, "fc_2.out"), 2, (int64_t[]){-1, 10});
  check_shape(pb_var(mb, "softmax_with_cross_entropy_0.out"), 2, (int64_t[]){-1, 1});
  check_shape(pb_var(mb, "mean_0.out"), 1, (int64_t[]){1});
  ck_assert_int_eq(pb_var(mb, "accuracy_0.correct")->dtype, PE__DATA_TYPE__I64);
  for (size_t i = 0; i < mb->n_ops; i++)
    for (size_t s = 0; s < mb->ops[i]->n_outputs; s++)
      ck_assert_msg(pb_var(mb, mb->ops[i]->outputs[s]->arguments[0]) != NULL, "undeclared %s",
                    mb->ops[i]->outputs[s]->arguments[0]);
  /* the op sequence: fc = matmul + elementwise_add + relu */
  const char *types[] = {"matmul", "elementwise_add", "relu",
                         "matmul", "elementwise_add", "relu",
                         "matmul", "elementwise_add", "softmax_with_cross_entropy",
                         "mean",   "accuracy"};
  ck_assert_int_eq(mb->n_ops, sizeof types / sizeof types[0]);
  for (size_t i = 0; i < mb->n_ops; i++) ck_assert_str_eq(mb->ops[i]->type, types[i]);
  ck_assert_int_eq(pb_attr(mb->ops[0], "x_num_col_dims")->i, 1);
  ck_assert_int_eq(pb_attr(mb->ops[1], "axis")->i, 1);
  pe__program_desc__free_unpacked(pd, NULL);
  pe_model_spec_release(&m);
}
END_TEST

START_TEST(cnn_shapes_and_init) {
  pe_model_spec m;
  char err[256];
  ck_assert_int_eq(pe_model_spec_build("cnn", &m, err, sizeof err), 0);
  Pe__ProgramDesc *pd = pe__program_desc__unpack(NULL, m.len, m.bytes);
  const Pe__BlockDesc *mb = pd->blocks[0], *sb = pd->blocks[1];
  check_shape(pb_var(mb, "conv2d_0.w"), 4, (int64_t[]){32, 1, 5, 5});
  check_shape(pb_var(mb, "conv2d_0.out"), 4, (int64_t[]){-1, 32, 28, 28});
  check_shape(pb_var(mb, "pool2d_0.out"), 4, (int64_t[]){-1, 32, 14, 14});
  check_shape(pb_var(mb, "conv2d_1.w"), 4, (int64_t[]){64, 32, 5, 5});
  check_shape(pb_var(mb, "pool2d_1.out"), 4, (int64_t[]){-1, 64, 7, 7});
  check_shape(pb_var(mb, "fc_0.w"), 2, (int64_t[]){64 * 7 * 7, 1024});
  check_shape(pb_var(mb, "dropout_0.mask"), 2, (int64_t[]){-1, 1024});
  ck_assert_int_eq(pb_var(mb, "dropout_0.mask")->dtype, PE__DATA_TYPE__U8);
  /* Kaiming: limit sqrt(6 / fan_in), fan_in = C/groups*KH*KW */
  const Pe__OpDesc *init = pb_writer(sb, "conv2d_1.w");
  ck_assert_float_eq_tol(pb_attr(init, "max")->f, sqrtf(6.0f / (32 * 25)), 1e-6);
  const Pe__OpDesc *conv = pb_writer(mb, "conv2d_0.tmp_0");
  ck_assert_str_eq(conv->type, "conv2d");
  ck_assert_int_eq(pb_attr(conv, "paddings")->ints[0], 2);
  const Pe__OpDesc *add = pb_writer(mb, "conv2d_0.tmp_1");
  ck_assert_str_eq(add->type, "elementwise_add");
  ck_assert_int_eq(pb_attr(add, "axis")->i, 1);
  const Pe__OpDesc *pool = pb_writer(mb, "pool2d_0.out");
  ck_assert_str_eq(pb_attr(pool, "pooling_type")->s, "max");
  ck_assert_int_eq(pb_attr(pool, "strides")->ints[1], 2);
  const Pe__OpDesc *drop = pb_writer(mb, "dropout_0.out");
  ck_assert_float_eq_tol(pb_attr(drop, "dropout_prob")->f, 0.4f, 1e-7);
  ck_assert_str_eq(pb_attr(drop, "dropout_implementation")->s, "upscale_in_train");
  pe__program_desc__free_unpacked(pd, NULL);
  pe_model_spec_release(&m);
}
END_TEST

START_TEST(output_is_deterministic) {
  pe_model_spec a, b;
  char err[256];
  ck_assert_int_eq(pe_model_spec_build("cnn", &a, err, sizeof err), 0);
  ck_assert_int_eq(pe_model_spec_build("cnn", &b, err, sizeof err), 0);
  ck_assert_uint_eq(a.len, b.len);
  ck_assert_mem_eq(a.bytes, b.bytes, a.len);
  pe_model_spec_release(&a);
  pe_model_spec_release(&b);
}
END_TEST

/* Every other layer kind, initialiser and optimizer also validates. */
START_TEST(other_layers_validate) {
  pe_builder *b = pe_builder_new();
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 3, 8, 8));
  const char *y = pe_builder_data(b, "y", PE_B_I64, PE_B_SHAPE(-1, 1));
  pe_b_conv_opts co = {.name = "c",
                       .stride = {2, 2},
                       .pad = {1, 1},
                       .no_bias = true,
                       .w_init = {PE_B_INIT_NORMAL, 0, 0.1f, 7}};
  const char *h = pe_builder_conv2d(b, x, 4, 3, 3, &co);
  ck_assert_str_eq(h, "c.out");
  pe_b_bn_opts bo = {.act = PE_B_ACT_TANH};
  h = pe_builder_batch_norm(b, h, &bo);
  pe_b_pool_opts po = {.avg = true, .global = true};
  h = pe_builder_pool2d(b, h, 0, 0, &po);
  h = pe_builder_flatten(b, h, 1);
  h = pe_builder_sigmoid(b, h);
  pe_b_fc_opts fo = {.w_init = {PE_B_INIT_UNIFORM, -0.1f, 0.1f, 0},
                     .b_init = {PE_B_INIT_CONSTANT, 0.5f, 0, 0}};
  h = pe_builder_fc(b, h, 5, &fo);
  const char *prob = pe_builder_softmax(b, h);
  const char *loss = pe_builder_mean(b, pe_builder_cross_entropy(b, prob, y));
  ck_assert_ptr_nonnull(pe_builder_accuracy(b, prob, y, 2));
  ck_assert_int_eq(pe_builder_append_backward(b, loss), 0);
  ck_assert_int_eq(pe_builder_adam(b, 1e-3f, 0.9f, 0.999f, 1e-8f), 0);
  uint8_t *bytes;
  size_t len;
  ck_assert_msg(pe_builder_finish(b, &bytes, &len) == 0, "%s", pe_builder_error(b));
  ck_assert_ptr_null(pe_builder_error(b));
  pe_program *p = decode_valid(bytes, len);
  pe_block *mb = pe_program_main(p);
  pe_var_desc *mean = pe_block_find_var_local(mb, "batch_norm_0.mean");
  ck_assert(mean && mean->persistable && mean->stop_gradient);
  pe_var_desc *pool = pe_block_find_var_local(mb, "pool2d_0.out");
  ck_assert(pool->shape.ndim == 4 && pool->shape.d[2] == 1 && pool->shape.d[3] == 1);
  ck_assert_str_eq(p->opt.type, "adam");
  pe_program_free(p);
  free(bytes);
  pe_builder_free(b);
}
END_TEST

/* An inference-only program: no TrainSpec loss. */
START_TEST(inference_program) {
  pe_builder *b = pe_builder_new();
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 4));
  pe_b_fc_opts fo = {.act = PE_B_ACT_SOFTMAX, .no_bias = true};
  ck_assert_str_eq(pe_builder_fc(b, x, 3, &fo), "fc_0.out");
  uint8_t *bytes;
  size_t len;
  ck_assert_int_eq(pe_builder_finish(b, &bytes, &len), 0);
  pe_program *p = decode_valid(bytes, len);
  ck_assert_ptr_null(p->loss);
  pe_program_free(p);
  free(bytes);
  pe_builder_free(b);
}
END_TEST

/* A builder with a feed and `set`(v) but no optimizer: finish refuses it
 * with exactly `want`. */
static void expect_needs_optimizer(int (*set)(pe_builder *, float), float v, const char *want) {
  pe_builder *b = pe_builder_new();
  pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 4));
  ck_assert_int_eq(set(b, v), 0);
  uint8_t *bytes = NULL;
  size_t len;
  ck_assert_int_eq(pe_builder_finish(b, &bytes, &len), -1);
  ck_assert_ptr_null(bytes);
  ck_assert_str_eq(pe_builder_error(b), want);
  pe_builder_free(b);
}

/* Weight decay travels in the TrainSpec, set before or after the optimizer;
 * a bad coefficient, or one with no optimizer, is an error. */
START_TEST(weight_decay) {
  for (int order = 0; order < 2; order++) {
    pe_builder *b = pe_builder_new();
    const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 4));
    const char *y = pe_builder_data(b, "y", PE_B_I64, PE_B_SHAPE(-1, 1));
    const char *loss = pe_builder_mean(
        b, pe_builder_softmax_with_cross_entropy(b, pe_builder_fc(b, x, 3, NULL), y, NULL));
    ck_assert_int_eq(pe_builder_append_backward(b, loss), 0);
    if (order == 0) ck_assert_int_eq(pe_builder_weight_decay(b, 5e-4f), 0);
    ck_assert_int_eq(pe_builder_momentum(b, 0.1f, 0.9f, false), 0);
    if (order == 1) ck_assert_int_eq(pe_builder_weight_decay(b, 5e-4f), 0);
    uint8_t *bytes;
    size_t len;
    ck_assert_int_eq(pe_builder_finish(b, &bytes, &len), 0);
    pe_program *p = decode_valid(bytes, len);
    ck_assert(p->opt.weight_decay == 5e-4f);
    pe_program_free(p);
    free(bytes);
    pe_builder_free(b);
  }
  pe_builder *b = pe_builder_new();
  ck_assert_int_eq(pe_builder_weight_decay(b, -1.0f), -1);
  ck_assert_str_eq(pe_builder_error(b), "weight_decay -1 must be finite and >= 0");
  pe_builder_free(b);
  expect_needs_optimizer(pe_builder_weight_decay, 0.01f,
                         "finish: weight_decay 0.01 is set but no optimizer");
}
END_TEST

/* A trainable x[4] -> fc 3 -> softmax_with_cross_entropy program, loss marked. */
static pe_builder *trainable(void) {
  pe_builder *b = pe_builder_new();
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 4));
  const char *y = pe_builder_data(b, "y", PE_B_I64, PE_B_SHAPE(-1, 1));
  const char *loss = pe_builder_mean(
      b, pe_builder_softmax_with_cross_entropy(b, pe_builder_fc(b, x, 3, NULL), y, NULL));
  ck_assert_int_eq(pe_builder_append_backward(b, loss), 0);
  return b;
}

/* no_weight_decay of the main- and startup-block copies of `name`. */
static void expect_no_decay(const pe_program *p, const char *name, bool want) {
  for (int blk = 0; blk < 2; blk++) {
    const pe_var_desc *v = pe_block_find_var_local(p->blocks[blk], name);
    ck_assert_msg(v && v->no_weight_decay == want, "block %d: %s no_weight_decay %d, want %d", blk,
                  name, v ? v->no_weight_decay : -1, want);
  }
}

/* adamw travels as its own type with adam's hyper-parameters; a parameter
 * is exempted from weight decay by name, or every 1-D one (the biases, the
 * batch-norm scale and shift; not its running statistics) by
 * pe_builder_no_weight_decay_1d, whatever the order of the calls. */
START_TEST(adamw_and_no_weight_decay) {
  for (int order = 0; order < 2; order++) {
    pe_builder *b = pe_builder_new();
    const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 2, 4, 4));
    const char *y = pe_builder_data(b, "y", PE_B_I64, PE_B_SHAPE(-1, 1));
    if (order == 0) ck_assert_int_eq(pe_builder_no_weight_decay_1d(b), 0);
    pe_b_conv_opts co = {.pad = {1, 1}};
    const char *h = pe_builder_batch_norm(b, pe_builder_conv2d(b, x, 3, 3, 3, &co), NULL);
    const char *loss = pe_builder_mean(
        b, pe_builder_softmax_with_cross_entropy(b, pe_builder_fc(b, h, 3, NULL), y, NULL));
    ck_assert_int_eq(pe_builder_append_backward(b, loss), 0);
    if (order == 1) ck_assert_int_eq(pe_builder_grad_clip_norm(b, 2.0f), 0);
    ck_assert_int_eq(pe_builder_adamw(b, 1e-3f, 0.9f, 0.99f, 1e-6f), 0);
    ck_assert_int_eq(pe_builder_weight_decay(b, 0.05f), 0);
    if (order == 0) ck_assert_int_eq(pe_builder_grad_clip_norm(b, 2.0f), 0);
    if (order == 1) ck_assert_int_eq(pe_builder_no_weight_decay_1d(b), 0);
    ck_assert_int_eq(pe_builder_no_weight_decay(b, "fc_0.w"), 0);
    uint8_t *bytes;
    size_t len;
    ck_assert_int_eq(pe_builder_finish(b, &bytes, &len), 0);
    pe_program *p = decode_valid(bytes, len);
    ck_assert_str_eq(p->opt.type, "adamw");
    ck_assert(p->opt.lr == 1e-3f && p->opt.beta2 == 0.99f && p->opt.epsilon == 1e-6f);
    ck_assert(p->opt.weight_decay == 0.05f && p->opt.grad_clip_norm == 2.0f);
    expect_no_decay(p, "conv2d_0.w", false);
    expect_no_decay(p, "fc_0.w", true);
    const char *exempt[] = {"conv2d_0.b", "batch_norm_0.scale", "batch_norm_0.bias", "fc_0.b"};
    for (int i = 0; i < 4; i++) expect_no_decay(p, exempt[i], true);
    expect_no_decay(p, "batch_norm_0.mean", false); /* not trainable */
    ck_assert(!pe_block_find_var_local(pe_program_main(p), "x")->no_weight_decay);
    /* The daemon's passes: decoupled decay on conv2d_0.w alone. */
    PE_CK_OK(pe_program_compile(p, false));
    const pe_block *m = pe_program_main(p);
    int n_adam = 0, n_decayed = 0;
    for (int i = 0; i < m->n_ops; i++) {
      if (strcmp(m->ops[i]->type, "adam")) continue;
      n_adam++;
      const pe_attr *rm = pe_op_find_attr(m->ops[i], "regularization_method");
      const char *w = pe_op_input_arg(m->ops[i], "Param");
      ck_assert_msg(!rm == (strcmp(w, "conv2d_0.w") != 0), "%s: decay %s", w, rm ? rm->s : "none");
      n_decayed += rm && !strcmp(rm->s, "decoupled_decay");
    }
    ck_assert_int_eq(n_adam, 6);
    ck_assert_int_eq(n_decayed, 1);
    pe_program_free(p);
    free(bytes);
    pe_builder_free(b);
  }
  /* Only trainable parameters can be exempted. */
  const char *bad[] = {"x", "nope", "batch_norm_0.mean", NULL};
  const char *why[] = {"no_weight_decay: 'x' is not a trainable parameter",
                       "no_weight_decay: 'nope' is not a trainable parameter (no such variable)",
                       "no_weight_decay: 'batch_norm_0.mean' is not a trainable parameter",
                       "no_weight_decay: '(null)' is not a trainable parameter (no such variable)"};
  for (int i = 0; i < 4; i++) {
    pe_builder *b = pe_builder_new();
    const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 2, 4, 4));
    ck_assert_ptr_nonnull(pe_builder_batch_norm(b, x, NULL));
    ck_assert_int_eq(pe_builder_no_weight_decay(b, bad[i]), -1);
    ck_assert_str_eq(pe_builder_error(b), why[i]);
    pe_builder_free(b);
  }
  pe_builder *b = pe_builder_new();
  ck_assert_int_eq(pe_builder_grad_clip_norm(b, -1.0f), -1);
  ck_assert_str_eq(pe_builder_error(b), "grad_clip_norm -1 must be finite and >= 0");
  pe_builder_free(b);
  expect_needs_optimizer(pe_builder_grad_clip_norm, 1.0f,
                         "finish: grad_clip_norm 1 is set but no optimizer");
  b = pe_builder_new();
  ck_assert_int_eq(pe_builder_adamw(b, 1e-3f, 1.0f, 0.99f, 1e-6f), -1);
  ck_assert_str_eq(pe_builder_error(b),
                   "adamw: beta1 1, beta2 0.99 must be in [0, 1) and epsilon 1e-06 positive");
  pe_builder_free(b);
}
END_TEST

/* The schedule travels in OptimizerDesc.lr_schedule, field by field, set
 * before or after the optimizer; the options are copied. */
START_TEST(lr_schedule) {
  for (int kind = 0; kind < 2; kind++)
    for (int order = 0; order < 2; order++) {
      pe_builder *b = trainable();
      int64_t ms[3] = {100, 250, 400};
      pe_lr_schedule_opts so = {.type = "multistep",
                                .warmup_steps = 10,
                                .gamma = 0.5f,
                                .n_milestones = 3,
                                .milestones = ms};
      if (kind == 1)
        so = (pe_lr_schedule_opts){
            .type = "cosine", .warmup_steps = 500, .decay_steps = 9000, .min_lr = 1e-4f};
      char type[16];
      snprintf(type, sizeof type, "%s", so.type);
      so.type = type;
      if (order == 0) ck_assert_int_eq(pe_builder_lr_schedule(b, &so), 0);
      ck_assert_int_eq(pe_builder_adam(b, 0.01f, 0.9f, 0.999f, 1e-8f), 0);
      if (order == 1) ck_assert_int_eq(pe_builder_lr_schedule(b, &so), 0);
      /* the builder holds its own copies */
      memset(ms, 0, sizeof ms);
      memset(type, 0, sizeof type);
      uint8_t *bytes;
      size_t len;
      ck_assert_int_eq(pe_builder_finish(b, &bytes, &len), 0);
      Pe__ProgramDesc *pd = pe__program_desc__unpack(NULL, len, bytes);
      ck_assert_ptr_nonnull(pd);
      ck_assert_ptr_nonnull(pd->train);
      const Pe__OptimizerDesc *od = pd->train->optimizer;
      ck_assert_ptr_nonnull(od);
      ck_assert_str_eq(od->type, "adam");
      ck_assert(od->learning_rate == 0.01f);
      const Pe__LrSchedule *ls = od->lr_schedule;
      ck_assert_ptr_nonnull(ls);
      if (kind == 0) {
        ck_assert_str_eq(ls->type, "multistep");
        ck_assert_int_eq(ls->warmup_steps, 10);
        ck_assert_int_eq(ls->decay_steps, 0);
        ck_assert(ls->gamma == 0.5f);
        ck_assert(ls->min_lr == 0.0f);
        ck_assert_uint_eq(ls->n_milestones, 3);
        ck_assert_int_eq(ls->milestones[0], 100);
        ck_assert_int_eq(ls->milestones[1], 250);
        ck_assert_int_eq(ls->milestones[2], 400);
      } else {
        ck_assert_str_eq(ls->type, "cosine");
        ck_assert_int_eq(ls->warmup_steps, 500);
        ck_assert_int_eq(ls->decay_steps, 9000);
        ck_assert(ls->gamma == 0.0f);
        ck_assert(ls->min_lr == 1e-4f);
        ck_assert_uint_eq(ls->n_milestones, 0);
      }
      pe__program_desc__free_unpacked(pd, NULL);
      /* and the daemon's decoder and validation accept it */
      pe_program *p = decode_valid(bytes, len);
      ck_assert_str_eq(p->opt.sched.type, kind ? "cosine" : "multistep");
      pe_program_free(p);
      free(bytes);
      pe_builder_free(b);
    }
  /* no schedule: no lr_schedule message */
  pe_builder *b = trainable();
  ck_assert_int_eq(pe_builder_sgd(b, 0.1f), 0);
  uint8_t *bytes;
  size_t len;
  ck_assert_int_eq(pe_builder_finish(b, &bytes, &len), 0);
  Pe__ProgramDesc *pd = pe__program_desc__unpack(NULL, len, bytes);
  ck_assert_ptr_nonnull(pd);
  ck_assert_ptr_null(pd->train->optimizer->lr_schedule);
  pe__program_desc__free_unpacked(pd, NULL);
  free(bytes);
  pe_builder_free(b);
}
END_TEST

/* Client-side checks name the value; the first error sticks; a schedule
 * with no optimizer fails at finish. */
START_TEST(lr_schedule_errors) {
  int64_t ms[PE_B_MAX_MILESTONES + 1] = {0};
  static const struct {
    pe_lr_schedule_opts o;
    const char *want;
  } cases[] = {
      {{.type = "poly"},
       "lr_schedule: unknown type 'poly' (known: constant, step, multistep, exponential, cosine, "
       "linear)"},
      {{.type = NULL}, "lr_schedule: type is NULL"},
      {{.type = "cosine", .warmup_steps = -3, .decay_steps = 10},
       "lr_schedule cosine: warmup_steps -3 must be >= 0"},
      {{.type = "step", .decay_steps = -1}, "lr_schedule step: decay_steps -1 must be >= 0"},
      {{.type = "step", .decay_steps = 5, .gamma = -0.5f},
       "lr_schedule step: gamma -0.5 must be finite and >= 0"},
      {{.type = "exponential", .gamma = INFINITY},
       "lr_schedule exponential: gamma inf must be finite and >= 0"},
      {{.type = "linear", .decay_steps = 5, .min_lr = NAN},
       "lr_schedule linear: min_lr nan must be finite and >= 0"},
      {{.type = "cosine", .decay_steps = 5, .min_lr = -1e-3f},
       "lr_schedule cosine: min_lr -0.001 must be finite and >= 0"},
      {{.type = "multistep", .n_milestones = PE_B_MAX_MILESTONES + 1},
       "lr_schedule multistep: 33 milestones (at most 32)"},
      {{.type = "multistep", .n_milestones = -1},
       "lr_schedule multistep: n_milestones -1 must be >= 0"},
      {{.type = "multistep", .n_milestones = 2, .milestones = NULL},
       "lr_schedule multistep: n_milestones 2 but milestones is NULL"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    pe_builder *b = trainable();
    pe_lr_schedule_opts o = cases[i].o;
    if (o.n_milestones > 2) o.milestones = ms;
    ck_assert_int_eq(pe_builder_lr_schedule(b, &o), -1);
    ck_assert_msg(pe_builder_error(b) && strcmp(pe_builder_error(b), cases[i].want) == 0,
                  "case %zu: want '%s', got '%s'", i, cases[i].want,
                  pe_builder_error(b) ? pe_builder_error(b) : "(no error)");
    /* sticky: a later good call fails with the same message */
    ck_assert_int_eq(pe_builder_lr_schedule(b, &(pe_lr_schedule_opts){.type = "constant"}), -1);
    ck_assert_str_eq(pe_builder_error(b), cases[i].want);
    pe_builder_free(b);
  }
  pe_builder *b = pe_builder_new();
  ck_assert_int_eq(pe_builder_lr_schedule(b, NULL), -1);
  ck_assert_str_eq(pe_builder_error(b), "lr_schedule: options are NULL");
  pe_builder_free(b);
  /* Exactly 32 milestones pass the client; their order is the daemon's check. */
  b = trainable();
  ck_assert_int_eq(
      pe_builder_lr_schedule(
          b, &(pe_lr_schedule_opts){.type = "multistep", .n_milestones = 32, .milestones = ms}),
      0);
  pe_builder_free(b);
  /* a schedule but no optimizer */
  b = trainable();
  pe_lr_schedule_opts so = {.type = "step", .decay_steps = 100};
  ck_assert_int_eq(pe_builder_lr_schedule(b, &so), 0);
  uint8_t *bytes = NULL;
  size_t len;
  ck_assert_int_eq(pe_builder_finish(b, &bytes, &len), -1);
  ck_assert_ptr_null(bytes);
  ck_assert_str_eq(pe_builder_error(b), "finish: lr_schedule step is set but no optimizer");
  pe_builder_free(b);
}
END_TEST

/* --- errors ------------------------------------------------------------------------- */

START_TEST(first_error_sticks) {
  pe_builder *b = pe_builder_new();
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 4));
  ck_assert_ptr_null(pe_builder_error(b));
  ck_assert_ptr_null(pe_builder_fc(b, "nope", 3, NULL));
  const char *e = pe_builder_error(b);
  ck_assert_ptr_nonnull(e);
  ck_assert_ptr_nonnull(strstr(e, "'nope'"));
  char first[256];
  snprintf(first, sizeof first, "%s", e);
  /* later calls, even valid ones, are no-ops */
  ck_assert_ptr_null(pe_builder_fc(b, x, 3, NULL));
  ck_assert_ptr_null(pe_builder_relu(b, x));
  ck_assert_ptr_null(pe_builder_conv2d(b, x, 0, 0, 0, NULL));
  ck_assert_int_eq(pe_builder_sgd(b, -1), -1);
  ck_assert_int_eq(pe_builder_append_backward(b, x), -1);
  ck_assert_str_eq(pe_builder_error(b), first);
  uint8_t *bytes = NULL;
  size_t len = 0;
  ck_assert_int_eq(pe_builder_finish(b, &bytes, &len), -1);
  ck_assert_ptr_null(bytes);
  ck_assert_str_eq(pe_builder_error(b), first);
  pe_builder_free(b);
}
END_TEST

typedef const char *(*bad_fn)(pe_builder *b, const char *x4, const char *x2, const char *y);

static const char *bad_fc_size(pe_builder *b, const char *x4, const char *x2, const char *y) {
  return pe_builder_fc(b, x2, 0, NULL);
}
static const char *bad_fc_ncd(pe_builder *b, const char *x4, const char *x2, const char *y) {
  pe_b_fc_opts o = {.num_col_dims = 2};
  return pe_builder_fc(b, x2, 3, &o);
}
static const char *bad_conv_rank(pe_builder *b, const char *x4, const char *x2, const char *y) {
  return pe_builder_conv2d(b, x2, 4, 3, 3, NULL);
}
static const char *bad_conv_groups(pe_builder *b, const char *x4, const char *x2, const char *y) {
  pe_b_conv_opts o = {.groups = 2};
  return pe_builder_conv2d(b, x4, 4, 3, 3, &o);
}
static const char *bad_conv_fit(pe_builder *b, const char *x4, const char *x2, const char *y) {
  return pe_builder_conv2d(b, x4, 4, 9, 9, NULL);
}
static const char *bad_pool(pe_builder *b, const char *x4, const char *x2, const char *y) {
  return pe_builder_pool2d(b, x4, 0, 2, NULL);
}
static const char *bad_dropout(pe_builder *b, const char *x4, const char *x2, const char *y) {
  return pe_builder_dropout(b, x2, 1.0f, 0, NULL);
}
static const char *bad_label(pe_builder *b, const char *x4, const char *x2, const char *y) {
  return pe_builder_softmax_with_cross_entropy(b, x2, x4, NULL); /* f32 label of wrong shape */
}
static const char *bad_accuracy_k(pe_builder *b, const char *x4, const char *x2, const char *y) {
  return pe_builder_accuracy(b, x2, y, 9);
}
static const char *bad_name(pe_builder *b, const char *x4, const char *x2, const char *y) {
  pe_b_fc_opts o = {.name = "a@b"};
  return pe_builder_fc(b, x2, 3, &o);
}
static const char *dup_name(pe_builder *b, const char *x4, const char *x2, const char *y) {
  pe_b_fc_opts o = {.name = "same"};
  pe_builder_fc(b, x2, 3, &o);
  return pe_builder_fc(b, x2, 3, &o);
}
static const char *bad_data(pe_builder *b, const char *x4, const char *x2, const char *y) {
  return pe_builder_data(b, "z", PE_B_F32, PE_B_SHAPE(-1, 0));
}
static const char *bad_init(pe_builder *b, const char *x4, const char *x2, const char *y) {
  pe_b_fc_opts o = {.w_init = {PE_B_INIT_UNIFORM, 1, -1, 0}};
  return pe_builder_fc(b, x2, 3, &o);
}
static const char *bad_loss(pe_builder *b, const char *x4, const char *x2, const char *y) {
  return pe_builder_append_backward(b, x2) ? NULL : "ok";
}
static const char *opt_without_loss(pe_builder *b, const char *x4, const char *x2, const char *y) {
  uint8_t *bytes;
  size_t len;
  if (pe_builder_momentum(b, 0.1f, 0.9f, false)) return "setter failed";
  return pe_builder_finish(b, &bytes, &len) ? NULL : "ok";
}
static const char *bad_momentum(pe_builder *b, const char *x4, const char *x2, const char *y) {
  return pe_builder_momentum(b, 0.1f, 1.5f, false) ? NULL : "ok";
}

START_TEST(bad_layer_arguments) {
  static const struct {
    bad_fn fn;
    const char *want; /* substring of the error */
  } cases[] = {
      {bad_fc_size, "size 0"},
      {bad_fc_ncd, "num_col_dims 2"},
      {bad_conv_rank, "must be NCHW"},
      {bad_conv_groups, "groups 2"},
      {bad_conv_fit, "does not fit"},
      {bad_pool, "kernel 0x2"},
      {bad_dropout, "probability 1"},
      {bad_label, "does not fit scores"},
      {bad_accuracy_k, "k 9"},
      {bad_name, "bad layer name 'a@b'"},
      {dup_name, "'same.w' declared twice"},
      {bad_data, "dim 1 is 0"},
      {bad_init, "min 1 > max -1"},
      {bad_loss, "f32 scalar"},
      {opt_without_loss, "no loss"},
      {bad_momentum, "mu 1.5"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    pe_builder *b = pe_builder_new();
    const char *x4 = pe_builder_data(b, "x4", PE_B_F32, PE_B_SHAPE(-1, 3, 6, 6));
    const char *x2 = pe_builder_data(b, "x2", PE_B_F32, PE_B_SHAPE(-1, 8));
    const char *y = pe_builder_data(b, "y", PE_B_I64, PE_B_SHAPE(-1, 1));
    ck_assert_ptr_null(cases[i].fn(b, x4, x2, y));
    const char *e = pe_builder_error(b);
    ck_assert_msg(e && strstr(e, cases[i].want), "case %zu: want '%s', got '%s'", i, cases[i].want,
                  e ? e : "(no error)");
    pe_builder_free(b);
  }
}
END_TEST

static Suite *builder_suite(void) {
  Suite *s = suite_create("builder");
  TCase *tc = tcase_create("builder");
  tcase_add_test(tc, mlp_decodes_and_validates);
  tcase_add_test(tc, cnn_decodes_and_validates);
  tcase_add_test(tc, unknown_model);
  tcase_add_test(tc, mlp_protobuf_layout);
  tcase_add_test(tc, cnn_shapes_and_init);
  tcase_add_test(tc, output_is_deterministic);
  tcase_add_test(tc, other_layers_validate);
  tcase_add_test(tc, inference_program);
  tcase_add_test(tc, weight_decay);
  tcase_add_test(tc, adamw_and_no_weight_decay);
  tcase_add_test(tc, lr_schedule);
  tcase_add_test(tc, lr_schedule_errors);
  tcase_add_test(tc, first_error_sticks);
  tcase_add_test(tc, bad_layer_arguments);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(builder_suite)
