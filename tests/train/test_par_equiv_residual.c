/* Parallel executor vs. the sequential reference on a residual network
 * written as a model file (save / from / add: conf/models/README.md): a
 * variable read by two branches gets its gradient summed from both, and two
 * branches join in a sum, so the graph is a DAG rather than the chain of
 * the MLP and CNN. The loss curve over 20 steps and the parameters after
 * every step in every setting of par_equiv.h's matrix, the parallel startup,
 * and a batch of 3 on 4 places.
 * Fully connected, not convolutional: par_equiv.h's teacher labels by the
 * first 64 inputs, which a small conv net does not learn in 20 steps, and
 * a conv net's thousands of relu units per sample make rounding flip a
 * few of them between the two runs (1e-5 apart after a few steps, found
 * while writing this; with tanh they agree to 1-2 ulp). No batch norm in
 * the matrix: each place normalises over its own rows, which legitimately
 * differs from the sequential run (conf/models/resnet has both; it trains
 * in e2e.test_client_cli). The "fused ops" rows take a residual network
 * with batch norm on one place (its statistics over the whole batch, as in
 * the sequential run): batch_norm -> relu fused into one batch_norm (and
 * the fc layers' bias into their matmuls) against the unfused sequential
 * program. See par_equiv.h for the data and the tolerances. */
#include "check_main.h"
#include "par_equiv.h"

static const char RESIDUAL[] =
    "name residual\n"
    "input image 784\n"
    "label label\n"
    "fc 128 act=relu\n" /* 400 KB: fused runs get more than one bucket */
    "save a\n"          /* identity shortcut */
    "fc 128 act=relu\n"
    "fc 128\n"
    "add a act=relu\n"
    "save c\n" /* projection shortcut */
    "fc 64 act=relu\n"
    "fc 64\n"
    "save m\n"
    "from c\n"
    "fc 64\n"
    "add m act=relu\n"
    "fc 10\n"
    "loss softmax_with_cross_entropy\n"
    "accuracy\n"
    "optimizer momentum lr=0.05 mu=0.9\n";

/* fc, batch_norm act=relu (fused) in the trunk and the block; the block's
 * second batch norm has no relu of its own (the add's stays unfused). */
static const char RESIDUAL_BN[] =
    "name residual_bn\n"
    "input image 784\n"
    "label label\n"
    "fc 128\n"
    "batch_norm act=relu\n"
    "save a\n"
    "fc 128\n"
    "batch_norm act=relu\n"
    "fc 128\n"
    "batch_norm\n"
    "add a act=relu\n"
    "fc 10\n"
    "loss softmax_with_cross_entropy\n"
    "accuracy\n"
    "optimizer momentum lr=0.05 mu=0.9\n";

/* One place, so that batch norm sees the whole batch: cpu and sim. */
static const eq_setting bn_fused_settings[] = {
    EQ_FUSED_OPS(PE_PLACE_CPU, 1, PE_SYNC_WAIT_EVENT, PE_STRATEGY_ALLREDUCE, "cpu:1, fused ops"),
    EQ_FUSED_OPS(PE_PLACE_SIM, 1, PE_SYNC_WAIT_PRODUCER, PE_STRATEGY_ALLREDUCE,
                 "sim:1 producer, fused ops"),
};

START_TEST(residual_bn_fused_ops_match_unfused_sequential) {
  /* The passes fuse both batch_norm -> relu pairs in this network and the
   * residual add with its relu (fuse_add_act), and the gradients read the
   * fused outputs as their masks: no relu_grad is left. */
  pe_model_spec spec;
  pe_program *p = eq_program(RESIDUAL_BN, &spec);
  pe_pass_opts o = {.fuse_conv_act = true};
  PE_CK_OK(pe_program_compile_opts(p, false, &o));
  const pe_block *b = p->blocks[p->main_block];
  int fwd = 0, grad = 0, relu_grads = 0, adds = 0, add_grads = 0;
  for (int i = 0; i < b->n_ops; i++) {
    const pe_op_desc *op = b->ops[i];
    const pe_attr *a = pe_op_find_attr(op, "fuse_activation");
    bool relu = a && !strcmp(a->s, "relu");
    fwd += relu && !strcmp(op->type, "batch_norm");
    grad += relu && !strcmp(op->type, "batch_norm_grad") && pe_op_find_input(op, "Y");
    relu_grads += !strcmp(op->type, "relu_grad");
    adds += relu && !strcmp(op->type, "elementwise_add");
    add_grads += relu && !strcmp(op->type, "elementwise_add_grad") && pe_op_find_input(op, "Out");
  }
  ck_assert_int_eq(fwd, 2);
  ck_assert_int_eq(grad, 2);
  ck_assert_int_eq(adds, 1);
  ck_assert_int_eq(add_grads, 1);
  ck_assert_int_eq(relu_grads, 0);
  pe_program_free(p);
  pe_model_spec_release(&spec);
  eq_run_setting(RESIDUAL_BN, &bn_fused_settings[_i]);
}
END_TEST

START_TEST(residual_matches_sequential) {
  eq_run_setting(RESIDUAL, &eq_settings[_i]);
}
END_TEST

START_TEST(residual_parallel_startup_matches_sequential) {
  eq_startup_check(RESIDUAL, &eq_settings[0]);
}
END_TEST

/* sim:4 AllReduce and Sharded: place 3 gets no sample. */
START_TEST(residual_batch_of_3_matches_one_place) {
  eq_uneven_check(RESIDUAL, &eq_settings[3]);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("par_equiv_residual");
  TCase *tc = tcase_create("equiv");
  tcase_add_loop_test(tc, residual_matches_sequential, 0, EQ_N_SETTINGS);
  tcase_add_test(tc, residual_parallel_startup_matches_sequential);
  tcase_add_test(tc, residual_batch_of_3_matches_one_place);
  tcase_add_loop_test(tc, residual_bn_fused_ops_match_unfused_sequential, 0,
                      (int)(sizeof bn_fused_settings / sizeof bn_fused_settings[0]));
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
