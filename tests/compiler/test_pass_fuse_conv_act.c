/* The fuse_conv_act pass (pass_fuse_conv_act.c): which conv2d -> bias add
 * -> relu chains it fuses, which it leaves alone (each condition that
 * keeps the rewrite invisible), and that the fused program trains through
 * the standard pipeline (conv2d_grad with Bias@GRAD, the bias updated);
 * the same for fully-connected layers (matmul -> bias add -> relu) and
 * for batch_norm -> relu (no bias add). */
#include <check.h>
#include <string.h>

#include "check_main.h"
#include "compiler/pass.h"
#include "prog_util.h"

/* x [-1,1,6,6] -> conv2d (w [4,1,3,3], pad 1) -> c1 -> + b [4] (axis 1) ->
 * c2 -> relu -> c3 -> mean -> loss; startup-free, sgd. */
static pe_program *new_program(pe_block **main) {
  pe_program *p = pe_program_new();
  ck_assert_ptr_nonnull(p);
  PU_OK(pe_program_add_block(p, -1, main));
  return p;
}

/* Temporaries declared with their shapes left to inference. */
static void temps(pe_block *b, const char *const *names) {
  for (; *names; names++) pu_var(b, *names, PE_F32, NULL);
}

static pe_program *conv_net(void) {
  pe_block *b;
  pe_program *p = new_program(&b);
  pu_feed(b, "x", PE_F32, PE_SHAPE(-1, 1, 6, 6));
  pu_param(b, "w", PE_SHAPE(4, 1, 3, 3));
  pu_param(b, "b", PE_SHAPE(4));
  temps(b, (const char *[]){"c1", "c2", "c3", "loss", "c1s", "c2s", NULL});
  pe_op_desc *conv = pu_op(b, "conv2d", "Input", "x", "Filter", "w", NULL, "Output", "c1", NULL);
  pe_op_set_ints(conv, "paddings", 2, (int64_t[]){1, 1});
  pe_op_desc *add = pu_op(b, "elementwise_add", "X", "c1", "Y", "b", NULL, "Out", "c2", NULL);
  pe_op_set_int(add, "axis", 1);
  pu_op(b, "relu", "X", "c2", NULL, "Out", "c3", NULL);
  pu_op(b, "mean", "X", "c3", NULL, "Out", "loss", NULL);
  return p;
}

/* Run validate + fuse_conv_act with these opts. */
static void fuse(pe_program *p, const pe_pass_opts *o) {
  pe_ir ir = {.prog = p, .opts = o};
  PU_OK(pe_passes_run(&ir, "validate,fuse_conv_act,validate"));
}

/* The `type` op (conv2d, matmul) took the bias b and writes `out` through
 * out_slot; the relu went into it too (or is still there), the add is gone. */
static void expect_op_fused(const pe_program *p, const char *type, const char *out_slot,
                            const char *out, bool relu) {
  const pe_op_desc *op = pu_main_op(p, type);
  ck_assert_ptr_nonnull(op);
  ck_assert_str_eq(pe_op_input_arg(op, "Bias"), "b");
  ck_assert_str_eq(pe_op_output_arg(op, out_slot), out);
  const pe_attr *a = pe_op_find_attr(op, "fuse_activation");
  if (relu) {
    ck_assert(a && !strcmp(a->s, "relu"));
    ck_assert_ptr_null(pu_main_op(p, "relu"));
  } else {
    ck_assert(!a || !a->s[0]);
    ck_assert_ptr_nonnull(pu_main_op(p, "relu"));
  }
  ck_assert_ptr_null(pu_main_op(p, "elementwise_add"));
}

/* The `type` op still writes `out` (its own output), no Bias, no activation. */
static void expect_op_unfused(const pe_program *p, const char *type, const char *out_slot,
                              const char *out) {
  const pe_op_desc *op = pu_main_op(p, type);
  ck_assert_ptr_null(pe_op_find_input(op, "Bias"));
  ck_assert_ptr_null(pe_op_find_attr(op, "fuse_activation"));
  ck_assert_str_eq(pe_op_output_arg(op, out_slot), out);
  ck_assert_ptr_nonnull(pu_main_op(p, "elementwise_add"));
  ck_assert_ptr_nonnull(pu_main_op(p, "relu"));
}

static void expect_fused(const pe_program *p, const char *out, bool relu) {
  expect_op_fused(p, "conv2d", "Output", out, relu);
}

static void expect_unfused(const pe_program *p) {
  expect_op_unfused(p, "conv2d", "Output", "c1");
}

/* The note the pass leaves on intermediate name (NULL: none), for a fetch's error. */
static void expect_note(const pe_program *p, const char *name, const char *note) {
  const pe_var_desc *v = pe_block_find_var_local(pe_program_main(p), name);
  ck_assert_ptr_nonnull(v);
  if (note)
    ck_assert_msg(v->fused_into && !strcmp(v->fused_into, note), "%s: '%s', expected '%s'", name,
                  v->fused_into ? v->fused_into : "(none)", note);
  else
    ck_assert_ptr_null(v->fused_into);
}

START_TEST(fuses_bias_and_relu) {
  pe_program *p = conv_net();
  pe_pass_opts o = {.fuse_conv_act = true};
  fuse(p, &o);
  expect_fused(p, "c3", true);
  ck_assert_int_eq(pe_program_main(p)->n_ops, 2); /* conv2d, mean */
  /* The intermediates fused away say into what; a clone keeps it. */
  expect_note(p, "c1", "conv2d writing 'c3' (conv2d+bias add+relu)");
  expect_note(p, "c2", "conv2d writing 'c3' (conv2d+bias add+relu)");
  expect_note(p, "c3", NULL);
  pe_program *c;
  PU_OK(pe_program_clone(p, &c));
  expect_note(c, "c1", "conv2d writing 'c3' (conv2d+bias add+relu)");
  pe_program_free(c);
  pe_program_free(p);
}
END_TEST

/* Compile p for training (sgd) with the pass on: the op of type `grad`
 * (there must be one), and no relu_grad left; sgd updates p1 and p2
 * (checked). */
static const pe_op_desc *compile_train(pe_program *p, const char *grad, const char *p1,
                                       const char *p2) {
  p->loss = strdup("loss");
  p->opt.type = strdup("sgd");
  p->opt.lr = 0.1f;
  pe_pass_opts o = {.fuse_conv_act = true};
  PU_OK(pe_program_compile_opts(p, false, &o));
  const pe_block *b = pe_program_main(p);
  int g = pu_find_op(b, grad, 0), updates = 0;
  ck_assert_int_ge(g, 0);
  ck_assert_int_eq(pu_find_op(b, "relu_grad", 0), -1);
  for (int i = 0; i < b->n_ops; i++)
    if (!strcmp(b->ops[i]->type, "sgd"))
      updates += !strcmp(pe_op_input_arg(b->ops[i], "Param"), p1) ||
                 !strcmp(pe_op_input_arg(b->ops[i], "Param"), p2);
  ck_assert_int_eq(updates, 2);
  return b->ops[g];
}

/* Compile p for training with the pass on: its one grad op `grad` reads
 * the Bias and the fused output `out` (through out_slot, the mask), writes
 * Bias@GRAD and the weight's gradient (w_grad slot), and sgd updates w and
 * b; no relu or bias-add gradient is left. Frees p. */
static void expect_trains(pe_program *p, const char *grad, const char *out_slot, const char *out,
                          const char *w_grad) {
  const pe_op_desc *g = compile_train(p, grad, "w", "b");
  ck_assert_str_eq(pe_op_input_arg(g, "Bias"), "b");
  ck_assert_str_eq(pe_op_input_arg(g, out_slot), out);
  ck_assert_str_eq(pe_op_output_arg(g, "Bias@GRAD"), "b@GRAD");
  ck_assert_str_eq(pe_op_output_arg(g, w_grad), "w@GRAD");
  ck_assert_int_eq(pu_find_op(pe_program_main(p), "elementwise_add_grad", 0), -1);
  pe_program_free(p);
}

START_TEST(fused_program_trains) {
  expect_trains(conv_net(), "conv2d_grad", "Output", "c3", "Filter@GRAD");
}
END_TEST

START_TEST(off_unless_asked_and_not_on_cuda) {
  pe_program *p = conv_net();
  fuse(p, NULL);
  expect_unfused(p);
  pe_pass_opts off = {0};
  fuse(p, &off);
  expect_unfused(p);
  pe_program_free(p);
  /* pe_graph_compile's route: the cuda conv2d kernel takes no Bias. */
  p = conv_net();
  pe_pass_opts cuda = {.fuse_conv_act = true, .place_kind = PE_PLACE_CUDA};
  PU_OK(pe_program_compile_opts(p, true, &cuda));
  expect_unfused(p);
  pe_program_free(p);
  p = conv_net();
  pe_pass_opts cpu = {.fuse_conv_act = true};
  PU_OK(pe_program_compile_opts(p, true, &cpu));
  expect_fused(p, "c3", true);
  pe_program_free(p);
}
END_TEST

START_TEST(kept_intermediates_stay) {
  /* c1 fetchable: nothing fused. */
  pe_program *p = conv_net();
  const char *k1[] = {"c1"};
  pe_pass_opts o = {.fuse_conv_act = true, .keep = k1, .n_keep = 1};
  fuse(p, &o);
  expect_unfused(p);
  pe_program_free(p);
  /* c2 fetchable: the bias is fused, the relu stays and reads c2. */
  p = conv_net();
  const char *k2[] = {"c2"};
  o.keep = k2;
  fuse(p, &o);
  expect_fused(p, "c2", false);
  ck_assert_str_eq(pe_op_input_arg(pu_main_op(p, "relu"), "X"), "c2");
  pe_program_free(p);
  /* c2 is the loss: the same. */
  p = conv_net();
  pe_pass_opts lo = {.fuse_conv_act = true, .loss = "c2"};
  fuse(p, &lo);
  expect_fused(p, "c2", false);
  pe_program_free(p);
}
END_TEST

START_TEST(other_readers_and_shapes_stay) {
  /* c1 read twice. */
  pe_program *p = conv_net();
  pu_op(pe_program_main(p), "scale", "X", "c1", NULL, "Out", "c1s", NULL);
  pe_pass_opts o = {.fuse_conv_act = true};
  fuse(p, &o);
  expect_unfused(p);
  pe_program_free(p);
  /* c2 read twice: bias only. */
  p = conv_net();
  pu_op(pe_program_main(p), "scale", "X", "c2", NULL, "Out", "c2s", NULL);
  fuse(p, &o);
  expect_fused(p, "c2", false);
  pe_program_free(p);
  /* axis -1 is numpy broadcasting: on an input 4 wide, b [4] (one per
   * filter, too) adds along the width, not per channel. */
  p = conv_net();
  pe_op_set_int(pu_main_op(p, "elementwise_add"), "axis", -1);
  pe_block_find_var_local(pe_program_main(p), "x")->shape = PE_SHAPE(-1, 1, 6, 4);
  fuse(p, &o);
  expect_unfused(p);
  pe_program_free(p);
  /* The conv's output added to itself: not a bias. */
  p = conv_net();
  pe_op_desc *add = pu_main_op(p, "elementwise_add");
  pe_op_input1(add, "Y", "c1");
  pe_op_set_int(add, "axis", -1);
  fuse(p, &o);
  expect_unfused(p);
  pe_program_free(p);
}
END_TEST

START_TEST(bias_written_between_stays) {
  /* b2 = scale(b) is computed after the conv and before the add: the conv
   * cannot read it where it runs. */
  pe_block *b;
  pe_program *p = new_program(&b);
  pu_feed(b, "x", PE_F32, PE_SHAPE(-1, 1, 6, 6));
  pu_param(b, "w", PE_SHAPE(4, 1, 3, 3));
  pu_param(b, "b", PE_SHAPE(4));
  temps(b, (const char *[]){"b2", "c1", "c2", "loss", NULL});
  pu_op(b, "conv2d", "Input", "x", "Filter", "w", NULL, "Output", "c1", NULL);
  pu_op(b, "scale", "X", "b", NULL, "Out", "b2", NULL);
  pe_op_desc *add = pu_op(b, "elementwise_add", "X", "c1", "Y", "b2", NULL, "Out", "c2", NULL);
  pe_op_set_int(add, "axis", 1);
  pu_op(b, "mean", "X", "c2", NULL, "Out", "loss", NULL);
  pe_pass_opts o = {.fuse_conv_act = true};
  fuse(p, &o);
  ck_assert_ptr_null(pe_op_find_input(pu_main_op(p, "conv2d"), "Bias"));
  ck_assert_ptr_nonnull(pu_main_op(p, "elementwise_add"));
  pe_program_free(p);
}
END_TEST

/* --- fully-connected layers ------------------------------------------------------ */

/* x [-1,3,8] -> matmul (w [8,4], x_num_col_dims xnc) -> m1 -> + b [4]
 * (axis `axis`) -> m2 [-> relu -> m3] -> mean -> loss: the builder's fc
 * (xnc 1: x [-1,8]; axis xnc as the builder writes it). */
static pe_program *fc_net_act(int xnc, int axis, bool relu) {
  pe_block *b;
  pe_program *p = new_program(&b);
  pu_feed(b, "x", PE_F32, xnc == 1 ? PE_SHAPE(-1, 8) : PE_SHAPE(-1, 3, 8));
  pu_param(b, "w", PE_SHAPE(8, 4));
  pu_param(b, "b", PE_SHAPE(4));
  temps(b, (const char *[]){"m1", "m2", "m3", "loss", "m1s", "m2s", "b2", NULL});
  pe_op_desc *mm = pu_op(b, "matmul", "X", "x", "Y", "w", NULL, "Out", "m1", NULL);
  pe_op_set_int(mm, "x_num_col_dims", xnc);
  pe_op_desc *add = pu_op(b, "elementwise_add", "X", "m1", "Y", "b", NULL, "Out", "m2", NULL);
  pe_op_set_int(add, "axis", axis);
  if (relu) pu_op(b, "relu", "X", "m2", NULL, "Out", "m3", NULL);
  pu_op(b, "mean", "X", relu ? "m3" : "m2", NULL, "Out", "loss", NULL);
  return p;
}

static pe_program *fc_net(int xnc, int axis) {
  return fc_net_act(xnc, axis, true);
}

/* out = scale(x) as op `at` of b. */
static void insert_scale(pe_block *b, int at, const char *x, const char *out) {
  pe_op_desc *sc;
  PU_OK(pe_block_insert_op(b, at, "scale", &sc));
  PU_OK(pe_op_input1(sc, "X", x));
  PU_OK(pe_op_output1(sc, "Out", out));
}

static void expect_mm_fused(const pe_program *p, const char *out, bool relu) {
  expect_op_fused(p, "matmul", "Out", out, relu);
}

static void expect_mm_unfused(const pe_program *p) {
  expect_op_unfused(p, "matmul", "Out", "m1");
}

START_TEST(fc_fuses_bias_and_relu) {
  pe_pass_opts o = {.fuse_conv_act = true};
  /* The builder's axis (x_num_col_dims) and numpy's -1, 2-D and 3-D X. */
  const int forms[][2] = {{1, 1}, {1, -1}, {2, 2}, {2, -1}};
  for (int i = 0; i < 4; i++) {
    pe_program *p = fc_net(forms[i][0], forms[i][1]);
    fuse(p, &o);
    expect_mm_fused(p, "m3", true);
    ck_assert_int_eq(pe_program_main(p)->n_ops, 2); /* matmul, mean */
    pe_program_free(p);
  }
  /* No relu after the add (the last fc layer): the bias alone. */
  pe_program *p = fc_net_act(1, 1, false);
  fuse(p, &o);
  ck_assert_int_eq(pe_program_main(p)->n_ops, 2); /* matmul, mean */
  expect_note(p, "m1", "matmul writing 'm2' (matmul+bias add)");
  expect_note(p, "m2", NULL);
  const pe_op_desc *mm = pu_main_op(p, "matmul");
  ck_assert_str_eq(pe_op_input_arg(mm, "Bias"), "b");
  ck_assert_str_eq(pe_op_output_arg(mm, "Out"), "m2");
  ck_assert_ptr_null(pe_op_find_attr(mm, "fuse_activation"));
  ck_assert_ptr_null(pu_main_op(p, "elementwise_add"));
  pe_program_free(p);
}
END_TEST

START_TEST(fc_fused_program_trains) {
  expect_trains(fc_net(2, 2), "matmul_grad", "Out", "m3", "Y@GRAD");
}
END_TEST

START_TEST(fc_stays_where_visible_or_other) {
  pe_pass_opts o = {.fuse_conv_act = true};
  /* m1 fetchable: nothing fused. */
  pe_program *p = fc_net(1, 1);
  const char *k1[] = {"m1"};
  pe_pass_opts ko = {.fuse_conv_act = true, .keep = k1, .n_keep = 1};
  fuse(p, &ko);
  expect_mm_unfused(p);
  pe_program_free(p);
  /* m2 fetchable: the bias is fused, the relu stays and reads m2. */
  p = fc_net(1, 1);
  const char *k2[] = {"m2"};
  ko.keep = k2;
  fuse(p, &ko);
  expect_mm_fused(p, "m2", false);
  ck_assert_str_eq(pe_op_input_arg(pu_main_op(p, "relu"), "X"), "m2");
  pe_program_free(p);
  /* m1 read a second time, before the add (and after it, below). */
  p = fc_net(1, 1);
  insert_scale(pe_program_main(p), 1, "m1", "m1s");
  fuse(p, &o);
  expect_mm_unfused(p);
  pe_program_free(p);
  p = fc_net(1, 1);
  pu_op(pe_program_main(p), "scale", "X", "m1", NULL, "Out", "m1s", NULL);
  fuse(p, &o);
  expect_mm_unfused(p);
  pe_program_free(p);
  /* m2 read a second time, before the relu: bias only. */
  p = fc_net(1, 1);
  insert_scale(pe_program_main(p), 2, "m2", "m2s");
  fuse(p, &o);
  expect_mm_fused(p, "m2", false);
  pe_program_free(p);
  /* axis 0 on a 3-D X: not the columns. */
  p = fc_net(2, 0);
  pe_block_find_var_local(pe_program_main(p), "x")->shape = PE_SHAPE(4, 4, 8);
  fuse(p, &o);
  expect_mm_unfused(p);
  pe_program_free(p);
  /* Y split at 2 (w [2,4,4] -> Out's last dims [4,4]): no [N] bias. */
  p = fc_net(1, -1);
  pe_block *b = pe_program_main(p);
  pe_block_find_var_local(b, "w")->shape = PE_SHAPE(2, 4, 4);
  pe_block_find_var_local(b, "x")->shape = PE_SHAPE(-1, 8);
  pe_op_set_int(pu_main_op(p, "matmul"), "y_num_col_dims", 2);
  fuse(p, &o);
  expect_mm_unfused(p);
  pe_program_free(p);
  /* b2 = scale(b) written between the matmul and the add. */
  p = fc_net(1, 1);
  b = pe_program_main(p);
  insert_scale(b, 1, "b", "b2");
  PU_OK(pe_op_input1(pu_main_op(p, "elementwise_add"), "Y", "b2"));
  fuse(p, &o);
  expect_mm_unfused(p);
  pe_program_free(p);
  /* cuda places: never (cuda's matmul kernel refuses a Bias). */
  p = fc_net(1, 1);
  pe_pass_opts cuda = {.fuse_conv_act = true, .place_kind = PE_PLACE_CUDA};
  PU_OK(pe_program_compile_opts(p, true, &cuda));
  expect_mm_unfused(p);
  pe_program_free(p);
  /* off unless asked. */
  p = fc_net(1, 1);
  fuse(p, NULL);
  expect_mm_unfused(p);
  pe_program_free(p);
}
END_TEST

/* --- batch norm --------------------------------------------------------------------- */

/* x [-1,1,6,6] -> conv2d (w [4,1,3,3], no bias) -> c1 -> batch_norm (scale,
 * shift [4], running stats mean / var in place) -> y -> relu -> r -> mean
 * -> loss: the resnet's conv2d + "batch_norm act=relu". The conv has no
 * bias add after it, so only the batch norm fuses. */
static pe_program *bn_net(void) {
  pe_block *b;
  pe_program *p = new_program(&b);
  pu_feed(b, "x", PE_F32, PE_SHAPE(-1, 1, 6, 6));
  pu_param(b, "w", PE_SHAPE(4, 1, 3, 3));
  const char *params[] = {"scale", "shift", "mean", "var"};
  for (int i = 0; i < 4; i++) pu_param(b, params[i], PE_SHAPE(4));
  pe_block_find_var_local(b, "mean")->stop_gradient = true;
  pe_block_find_var_local(b, "var")->stop_gradient = true;
  temps(b, (const char *[]){"c1", "y", "r", "loss", "sm", "sv", "ys", "r0", NULL});
  pe_op_desc *conv = pu_op(b, "conv2d", "Input", "x", "Filter", "w", NULL, "Output", "c1", NULL);
  pe_op_set_ints(conv, "paddings", 2, (int64_t[]){1, 1});
  pu_op(b, "batch_norm", "X", "c1", "Scale", "scale", "Bias", "shift", "Mean", "mean", "Variance",
        "var", NULL, "Y", "y", "MeanOut", "mean", "VarianceOut", "var", "SavedMean", "sm",
        "SavedVariance", "sv", NULL);
  pu_op(b, "relu", "X", "y", NULL, "Out", "r", NULL);
  pu_op(b, "mean", "X", "r", NULL, "Out", "loss", NULL);
  return p;
}

/* The batch norm writes `out`, relu fused (and the relu op gone) or not
 * (and the relu still reading y); the conv2d untouched either way. */
static void expect_bn(const pe_program *p, const char *out, bool relu) {
  const pe_op_desc *bn = pu_main_op(p, "batch_norm"), *conv = pu_main_op(p, "conv2d");
  ck_assert_str_eq(pe_op_output_arg(bn, "Y"), out);
  ck_assert_str_eq(pe_op_input_arg(bn, "Bias"), "shift");
  ck_assert_str_eq(pe_op_output_arg(bn, "MeanOut"), "mean");
  const pe_attr *a = pe_op_find_attr(bn, "fuse_activation");
  if (relu) {
    ck_assert(a && !strcmp(a->s, "relu"));
    ck_assert_ptr_null(pu_main_op(p, "relu"));
  } else {
    ck_assert(!a || !a->s[0]);
    ck_assert_str_eq(pe_op_input_arg(pu_main_op(p, "relu"), "X"), "y");
  }
  ck_assert_ptr_null(pe_op_find_input(conv, "Bias"));
  ck_assert_ptr_null(pe_op_find_attr(conv, "fuse_activation"));
  ck_assert_str_eq(pe_op_output_arg(conv, "Output"), "c1");
}

START_TEST(bn_fuses_relu) {
  pe_program *p = bn_net();
  pe_pass_opts o = {.fuse_conv_act = true};
  fuse(p, &o);
  expect_bn(p, "r", true);
  expect_note(p, "y", "batch_norm writing 'r' (batch_norm+relu)");
  ck_assert_int_eq(pe_program_main(p)->n_ops, 3); /* conv2d, batch_norm, mean */
  pe_program_free(p);
  /* An eval program (the inference pass sets is_test) fuses the same way. */
  p = bn_net();
  PU_OK(pe_program_compile_opts(p, true, &o));
  expect_bn(p, "r", true);
  ck_assert_int_eq(pe_op_find_attr(pu_main_op(p, "batch_norm"), "is_test")->i, 1);
  pe_program_free(p);
}
END_TEST

/* Trained: batch_norm_grad reads the fused output r as Y (its mask) and
 * the relu's gradient r@GRAD as Y@GRAD; no relu_grad; scale and shift
 * updated. */
START_TEST(bn_fused_program_trains) {
  pe_program *p = bn_net();
  const pe_op_desc *g = compile_train(p, "batch_norm_grad", "scale", "shift");
  ck_assert_str_eq(pe_op_input_arg(g, "Y"), "r");
  ck_assert_str_eq(pe_op_input_arg(g, "Y@GRAD"), "r@GRAD");
  ck_assert_str_eq(pe_op_find_attr(g, "fuse_activation")->s, "relu");
  ck_assert_str_eq(pe_op_output_arg(g, "Scale@GRAD"), "scale@GRAD");
  ck_assert_str_eq(pe_op_output_arg(g, "Bias@GRAD"), "shift@GRAD");
  pe_program_free(p);
}
END_TEST

/* p (bn_net, changed) compiled with o: its batch norm stays unfused. */
static void expect_bn_stays(pe_program *p, const pe_pass_opts *o) {
  fuse(p, o);
  expect_bn(p, "y", false);
  pe_program_free(p);
}

START_TEST(bn_stays_where_visible_or_other) {
  pe_pass_opts o = {.fuse_conv_act = true};
  /* y fetchable; y the loss. */
  const char *k1[] = {"y"};
  expect_bn_stays(bn_net(), &(pe_pass_opts){.fuse_conv_act = true, .keep = k1, .n_keep = 1});
  expect_bn_stays(bn_net(), &(pe_pass_opts){.fuse_conv_act = true, .loss = "y"});
  /* y read a second time, before the relu and after it. */
  pe_program *p = bn_net();
  insert_scale(pe_program_main(p), 2, "y", "ys");
  expect_bn_stays(p, &o);
  p = bn_net();
  pu_op(pe_program_main(p), "scale", "X", "y", NULL, "Out", "ys", NULL);
  expect_bn_stays(p, &o);
  /* r written between the batch norm and the relu (which overwrites it):
   * the batch norm cannot write r where it runs. */
  p = bn_net();
  insert_scale(pe_program_main(p), 2, "c1", "r");
  expect_bn_stays(p, &o);
  /* off unless asked. */
  expect_bn_stays(bn_net(), NULL);
  expect_bn_stays(bn_net(), &(pe_pass_opts){0});
  /* cuda places: never (cuda's batch_norm kernel takes no activation). */
  p = bn_net();
  PU_OK(pe_program_compile_opts(
      p, true, &(pe_pass_opts){.fuse_conv_act = true, .place_kind = PE_PLACE_CUDA}));
  expect_bn(p, "y", false);
  pe_program_free(p);
  /* The batch norm's output read by something other than a relu. */
  p = bn_net();
  pe_block *b = pe_program_main(p);
  pe_block_remove_op(b, pu_find_op(b, "relu", 0));
  PU_OK(pe_op_input1(pu_main_op(p, "mean"), "X", "y"));
  fuse(p, &o);
  ck_assert_str_eq(pe_op_output_arg(pu_main_op(p, "batch_norm"), "Y"), "y");
  ck_assert_ptr_null(pe_op_find_attr(pu_main_op(p, "batch_norm"), "fuse_activation"));
  pe_program_free(p);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("pass_fuse_conv_act");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, fuses_bias_and_relu);
  tcase_add_test(tc, fused_program_trains);
  tcase_add_test(tc, off_unless_asked_and_not_on_cuda);
  tcase_add_test(tc, kept_intermediates_stay);
  tcase_add_test(tc, other_readers_and_shapes_stay);
  tcase_add_test(tc, bias_written_between_stays);
  tcase_add_test(tc, fc_fuses_bias_and_relu);
  tcase_add_test(tc, fc_fused_program_trains);
  tcase_add_test(tc, fc_stays_where_visible_or_other);
  tcase_add_test(tc, bn_fuses_relu);
  tcase_add_test(tc, bn_fused_program_trains);
  tcase_add_test(tc, bn_stays_where_visible_or_other);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
