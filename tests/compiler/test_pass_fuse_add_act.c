/* The fuse_add_act pass (pass_fuse_add_act.c): a residual add -> relu
 * becomes one elementwise_add with fuse_activation relu, noting the sum it
 * fused away; each condition that keeps the rewrite invisible leaves it
 * alone (kept or loss sum, a second reader, broadcast operands, the relu's
 * output used between, op fusion off, cuda places); the fused program
 * trains through the standard pipeline (elementwise_add_grad reads the
 * fused output, no relu_grad); with both fusion passes, a conv's bias add
 * and relu still go to the conv (fuse_conv_act runs first). */
#include <check.h>
#include <string.h>

#include "check_main.h"
#include "compiler/pass.h"
#include "prog_util.h"

/* x [-1,4,6,6] -> conv2d (w [4,4,3,3], pad 1) -> c -> + x -> s -> relu ->
 * r -> mean -> loss: a residual block with an identity shortcut. */
static pe_program *res_net(void) {
  pe_program *p = pe_program_new();
  ck_assert_ptr_nonnull(p);
  pe_block *b;
  PU_OK(pe_program_add_block(p, -1, &b));
  pu_feed(b, "x", PE_F32, PE_SHAPE(-1, 4, 6, 6));
  pu_param(b, "w", PE_SHAPE(4, 4, 3, 3));
  const char *temps[] = {"c", "s", "r", "loss", "s2", "cb", NULL};
  for (const char *const *t = temps; *t; t++) pu_var(b, *t, PE_F32, NULL);
  pe_op_desc *conv = pu_op(b, "conv2d", "Input", "x", "Filter", "w", NULL, "Output", "c", NULL);
  pe_op_set_ints(conv, "paddings", 2, (int64_t[]){1, 1});
  pu_op(b, "elementwise_add", "X", "c", "Y", "x", NULL, "Out", "s", NULL);
  pu_op(b, "relu", "X", "s", NULL, "Out", "r", NULL);
  pu_op(b, "mean", "X", "r", NULL, "Out", "loss", NULL);
  return p;
}

static void fuse(pe_program *p, const pe_pass_opts *o) {
  pe_ir ir = {.prog = p, .opts = o};
  PU_OK(pe_passes_run(&ir, "validate,fuse_add_act,validate"));
}

static bool has_relu_attr(const pe_op_desc *op) {
  const pe_attr *a = pe_op_find_attr(op, "fuse_activation");
  return a && !strcmp(a->s, "relu");
}

/* The add writes r with the relu fused, and the relu is gone. */
static void expect_fused(const pe_program *p) {
  const pe_op_desc *add = pu_main_op(p, "elementwise_add");
  ck_assert_ptr_nonnull(add);
  ck_assert(has_relu_attr(add));
  ck_assert_str_eq(pe_op_output_arg(add, "Out"), "r");
  ck_assert_str_eq(pe_op_input_arg(add, "X"), "c");
  ck_assert_str_eq(pe_op_input_arg(add, "Y"), "x");
  ck_assert_ptr_null(pu_main_op(p, "relu"));
}

/* The add still writes s, no activation; the relu reads s. */
static void expect_unfused(const pe_program *p) {
  const pe_op_desc *add = pu_main_op(p, "elementwise_add");
  ck_assert_ptr_nonnull(add);
  ck_assert(!has_relu_attr(add));
  ck_assert_str_eq(pe_op_output_arg(add, "Out"), "s");
  ck_assert_str_eq(pe_op_input_arg(pu_main_op(p, "relu"), "X"), "s");
  ck_assert_ptr_null(pe_block_find_var_local(pe_program_main(p), "s")->fused_into);
}

static void expect_stays(pe_program *p, const pe_pass_opts *o) {
  fuse(p, o);
  expect_unfused(p);
  pe_program_free(p);
}

START_TEST(fuses_add_and_relu) {
  pe_program *p = res_net();
  fuse(p, &(pe_pass_opts){.fuse_conv_act = true});
  expect_fused(p);
  ck_assert_int_eq(pe_program_main(p)->n_ops, 3); /* conv2d, elementwise_add, mean */
  /* The sum fused away says into what (a fetch of it reports this). */
  const pe_var_desc *s = pe_block_find_var_local(pe_program_main(p), "s");
  ck_assert_ptr_nonnull(s->fused_into);
  ck_assert_str_eq(s->fused_into, "elementwise_add writing 'r' (elementwise_add+relu)");
  ck_assert_ptr_null(pe_block_find_var_local(pe_program_main(p), "r")->fused_into);
  pe_program_free(p);
}
END_TEST

/* Trained (sgd): elementwise_add_grad reads r as Out (its mask) and r@GRAD,
 * carries the relu, writes c@GRAD (to the conv's gradient) and x's
 * gradient is pruned (a feed); no relu_grad; w is updated. */
START_TEST(fused_program_trains) {
  pe_program *p = res_net();
  p->loss = strdup("loss");
  p->opt.type = strdup("sgd");
  p->opt.lr = 0.1f;
  PU_OK(pe_program_compile_opts(p, false, &(pe_pass_opts){.fuse_conv_act = true}));
  const pe_block *b = pe_program_main(p);
  int g = pu_find_op(b, "elementwise_add_grad", 0);
  ck_assert_int_ge(g, 0);
  ck_assert_int_eq(pu_find_op(b, "relu_grad", 0), -1);
  const pe_op_desc *gop = b->ops[g];
  ck_assert(has_relu_attr(gop));
  ck_assert_str_eq(pe_op_input_arg(gop, "Out"), "r");
  ck_assert_str_eq(pe_op_input_arg(gop, "Out@GRAD"), "r@GRAD");
  ck_assert_str_eq(pe_op_output_arg(gop, "X@GRAD"), "c@GRAD");
  int sgd = pu_find_op(b, "sgd", 0);
  ck_assert_int_ge(sgd, 0);
  ck_assert_str_eq(pe_op_input_arg(b->ops[sgd], "Param"), "w");
  pe_program_free(p);
}
END_TEST

START_TEST(off_unless_asked_and_not_on_cuda) {
  expect_stays(res_net(), NULL);
  expect_stays(res_net(), &(pe_pass_opts){0});
  /* pe_graph_compile's route: cuda's elementwise_add takes no activation. */
  pe_program *p = res_net();
  PU_OK(pe_program_compile_opts(
      p, true, &(pe_pass_opts){.fuse_conv_act = true, .place_kind = PE_PLACE_CUDA}));
  expect_unfused(p);
  pe_program_free(p);
  /* The same route on cpu fuses (eval programs too). */
  p = res_net();
  PU_OK(pe_program_compile_opts(p, true, &(pe_pass_opts){.fuse_conv_act = true}));
  expect_fused(p);
  pe_program_free(p);
}
END_TEST

START_TEST(visible_sums_stay) {
  const char *k[] = {"s"};
  expect_stays(res_net(), &(pe_pass_opts){.fuse_conv_act = true, .keep = k, .n_keep = 1});
  expect_stays(res_net(), &(pe_pass_opts){.fuse_conv_act = true, .loss = "s"});
  /* s read a second time, after the relu. */
  pe_program *p = res_net();
  pu_op(pe_program_main(p), "scale", "X", "s", NULL, "Out", "s2", NULL);
  expect_stays(p, &(pe_pass_opts){.fuse_conv_act = true});
}
END_TEST

START_TEST(other_shapes_and_orders_stay) {
  pe_pass_opts o = {.fuse_conv_act = true};
  /* Y broadcast (a per-channel [4], axis 1): not a residual sum. */
  pe_program *p = res_net();
  pe_block *b = pe_program_main(p);
  pu_param(b, "bias", PE_SHAPE(4));
  pe_op_desc *add = pu_main_op(p, "elementwise_add");
  PU_OK(pe_op_input1(add, "Y", "bias"));
  pe_op_set_int(add, "axis", 1);
  fuse(p, &o);
  ck_assert(!has_relu_attr(pu_main_op(p, "elementwise_add")));
  ck_assert_ptr_nonnull(pu_main_op(p, "relu"));
  pe_program_free(p);
  /* r written between the add and the relu (which overwrites it): the add
   * cannot write r where it runs. */
  p = res_net();
  pe_op_desc *sc;
  PU_OK(pe_block_insert_op(pe_program_main(p), 2, "scale", &sc));
  PU_OK(pe_op_input1(sc, "X", "c"));
  PU_OK(pe_op_output1(sc, "Out", "r"));
  expect_stays(p, &o);
  /* The sum read by something other than a relu. */
  p = res_net();
  b = pe_program_main(p);
  pe_block_remove_op(b, pu_find_op(b, "relu", 0));
  PU_OK(pe_op_input1(pu_main_op(p, "mean"), "X", "s"));
  fuse(p, &o);
  ck_assert(!has_relu_attr(pu_main_op(p, "elementwise_add")));
  ck_assert_str_eq(pe_op_output_arg(pu_main_op(p, "elementwise_add"), "Out"), "s");
  pe_program_free(p);
}
END_TEST

/* Both passes (the daemon's pipeline): x -> conv2d -> c -> + bias [4]
 * (axis 1) -> cb -> relu -> s2; s2 + x -> s -> relu -> r. The conv takes
 * its bias add and relu, the residual add its own relu. */
START_TEST(conv_bias_relu_goes_to_the_conv_first) {
  pe_program *p = res_net();
  pe_block *b = pe_program_main(p);
  pu_param(b, "bias", PE_SHAPE(4));
  pe_op_desc *badd;
  PU_OK(pe_block_insert_op(b, 1, "elementwise_add", &badd));
  PU_OK(pe_op_input1(badd, "X", "c"));
  PU_OK(pe_op_input1(badd, "Y", "bias"));
  PU_OK(pe_op_output1(badd, "Out", "cb"));
  pe_op_set_int(badd, "axis", 1);
  pe_op_desc *relu;
  PU_OK(pe_block_insert_op(b, 2, "relu", &relu));
  PU_OK(pe_op_input1(relu, "X", "cb"));
  PU_OK(pe_op_output1(relu, "Out", "s2"));
  PU_OK(pe_op_input1(b->ops[3], "X", "s2")); /* the residual add */
  PU_OK(pe_program_compile_opts(p, true, &(pe_pass_opts){.fuse_conv_act = true}));
  const pe_op_desc *conv = pu_main_op(p, "conv2d");
  ck_assert_str_eq(pe_op_input_arg(conv, "Bias"), "bias");
  ck_assert(has_relu_attr(conv));
  ck_assert_str_eq(pe_op_output_arg(conv, "Output"), "s2");
  const pe_op_desc *add = pu_main_op(p, "elementwise_add");
  ck_assert(has_relu_attr(add));
  ck_assert_str_eq(pe_op_input_arg(add, "X"), "s2");
  ck_assert_str_eq(pe_op_output_arg(add, "Out"), "r");
  ck_assert_int_eq(pe_program_main(p)->n_ops, 3);
  pe_program_free(p);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("pass_fuse_add_act");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, fuses_add_and_relu);
  tcase_add_test(tc, fused_program_trains);
  tcase_add_test(tc, off_unless_asked_and_not_on_cuda);
  tcase_add_test(tc, visible_sums_stay);
  tcase_add_test(tc, other_shapes_and_orders_stay);
  tcase_add_test(tc, conv_bias_relu_goes_to_the_conv_first);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
