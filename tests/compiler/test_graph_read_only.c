/* Which compiled graphs change no persistable (pe_graph_node_updates_persistable,
 * pe_op_output_unchanged): the test of a read-only program, whose runs may
 * take a work thread (server/lanes.h). An eval program with batch norm is
 * read-only: its test-mode batch_norm lists the running statistics among
 * its outputs but writes them onto themselves. The same op in training
 * mode, or in test mode copying them into other persistables, changes
 * them. */
#include <check.h>

#include "check_main.h"
#include "graph_util.h"

/* x [-1,8] -> fc 6 -> batch_norm (relu) -> dropout -> fc 3 ->
 * softmax_with_cross_entropy -> mean; no backward, no optimizer: what an
 * eval program of pe-client's builder holds. The batch norm's running
 * statistics are bn.mean / bn.variance. */
static pe_program *bn_eval_net(void) {
  pe_builder *b = pe_builder_new();
  ck_assert_ptr_nonnull(b);
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, 8));
  const char *label = pe_builder_data(b, "label", PE_B_I64, PE_B_SHAPE(-1, 1));
  x = pe_builder_fc(b, x, 6, NULL);
  pe_b_bn_opts bo = {.name = "bn", .act = PE_B_ACT_RELU};
  x = pe_builder_batch_norm(b, x, &bo);
  x = pe_builder_dropout(b, x, 0.5f, 0, NULL);
  const char *logits = pe_builder_fc(b, x, 3, NULL);
  pe_builder_mean(b, pe_builder_softmax_with_cross_entropy(b, logits, label, NULL));
  return tb_finish(b);
}

/* Compile p (for_test or not) on n_places; release with release(). */
static pe_ir compile(pe_program *p, bool for_test, int n_places, pe_pass_opts *o) {
  *o = (pe_pass_opts){.n_places = n_places};
  pe_ir ir = {.prog = p, .opts = o};
  PU_OK(pe_graph_compile(&ir, for_test));
  return ir;
}

static void release(pe_ir *ir) {
  pe_program *p = ir->prog;
  pe_ir_destroy(ir);
  pe_program_free(p);
}

/* Nodes that write a persistable (writes_persistable) and of those the
 * ones that change one. */
static void count_writers(const pe_graph *g, int *writes, int *updates) {
  *writes = *updates = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    *writes += g->nodes[i].writes_persistable;
    *updates += pe_graph_node_updates_persistable(g, i);
  }
}

/* Registered for_test, on 1 and 2 places: the batch_norm nodes still write
 * bn.mean / bn.variance (the executor orders them as writes) but change no
 * persistable; the test-mode dropout writes none. The read-only test is
 * not writes_persistable, which would take such a program for a training
 * run. */
START_TEST(eval_with_batch_norm_is_read_only) {
  for (int n = 1; n <= 2; n++) {
    pe_pass_opts o;
    pe_ir ir = compile(bn_eval_net(), true, n, &o);
    int writes, updates;
    count_writers(ir.graph, &writes, &updates);
    ck_assert_int_eq(gu_count_op(ir.graph, "batch_norm", -2), n);
    ck_assert_int_eq(writes, n);
    ck_assert_msg(updates == 0, "%d place(s): %d node(s) change a persistable", n, updates);
    ck_assert_int_eq(gu_count(ir.graph, PE_NODE_BROADCAST), 0);
    release(&ir);
  }
}
END_TEST

/* The same program compiled for training (no optimizer even): its
 * batch_norm moves the running statistics, a change; on 2 places the
 * broadcast of them after it is one too. */
START_TEST(training_batch_norm_is_not_read_only) {
  for (int n = 1; n <= 2; n++) {
    pe_pass_opts o;
    pe_ir ir = compile(bn_eval_net(), false, n, &o);
    const pe_graph *g = ir.graph;
    int updates = 0;
    for (int i = 0; i < g->n_nodes; i++)
      if (pe_graph_node_updates_persistable(g, i))
        updates++;
      else
        ck_assert_msg(
            g->nodes[i].kind != PE_NODE_OP || strcmp(g->nodes[i].desc->type, "batch_norm"),
            "%s changes no persistable in training mode", g->nodes[i].name);
    /* n batch norms, and on 2 places a broadcast of mean and of variance. */
    ck_assert_int_eq(updates, n == 1 ? 1 : 2 + 2);
    release(&ir);
  }
}
END_TEST

/* x -> batch_norm in test mode whose MeanOut / VarianceOut are `mo` / `vo`
 * (persistables) -> mean. */
static pe_program *bn_copy_net(const char *mo, const char *vo) {
  pe_program *p = pe_program_new();
  ck_assert_ptr_nonnull(p);
  pe_block *b;
  PU_OK(pe_program_add_block(p, -1, &b));
  pu_feed(b, "x", PE_F32, PE_SHAPE(-1, 4));
  const char *params[] = {"scale", "shift", "mean", "var", "mean2", "var2"};
  for (int i = 0; i < 6; i++) pu_param(b, params[i], PE_SHAPE(4))->stop_gradient = true;
  const char *temps[] = {"y", "sm", "sv", "loss"};
  for (int i = 0; i < 4; i++) pu_var(b, temps[i], PE_F32, NULL);
  pe_op_desc *bn = pu_op(b, "batch_norm", "X", "x", "Scale", "scale", "Bias", "shift", "Mean",
                         "mean", "Variance", "var", NULL, "Y", "y", "MeanOut", mo, "VarianceOut",
                         vo, "SavedMean", "sm", "SavedVariance", "sv", NULL);
  PU_OK(pe_op_set_bool(bn, "is_test", true));
  pu_op(b, "mean", "X", "y", NULL, "Out", "loss", NULL);
  return p;
}

/* The rule itself: only MeanOut / VarianceOut, only in test mode, only
 * when they are Mean / Variance. A test-mode batch norm that copies the
 * statistics into other persistables changes those. */
START_TEST(rule_is_test_mode_stats_onto_themselves) {
  const pe_op_def *d = pe_op_lookup("batch_norm");
  ck_assert_ptr_nonnull(d);
  int y = pe_op_output_index(d, "Y"), mo = pe_op_output_index(d, "MeanOut");
  int vo = pe_op_output_index(d, "VarianceOut"), sm = pe_op_output_index(d, "SavedMean");
  int sv = pe_op_output_index(d, "SavedVariance");
  pe_program *p = bn_copy_net("mean", "var");
  pe_op_desc *bn = pu_main_op(p, "batch_norm");
  ck_assert(pe_op_output_unchanged(d, bn, mo) && pe_op_output_unchanged(d, bn, vo));
  ck_assert(!pe_op_output_unchanged(d, bn, y) && !pe_op_output_unchanged(d, bn, sm) &&
            !pe_op_output_unchanged(d, bn, sv));
  PU_OK(pe_op_set_bool(bn, "is_test", false));
  ck_assert(!pe_op_output_unchanged(d, bn, mo) && !pe_op_output_unchanged(d, bn, vo));
  pe_program_free(p);
  /* No other op has a rule: relu's Out is never "unchanged". */
  const pe_op_def *relu = pe_op_lookup("relu");
  ck_assert_ptr_null(relu->output_copies);

  const char *outs[][2] = {{"mean", "var"}, {"mean2", "var"}, {"mean", "var2"}};
  for (int c = 0; c < 3; c++) {
    pe_pass_opts o;
    pe_ir ir = compile(bn_copy_net(outs[c][0], outs[c][1]), true, 1, &o);
    int writes, updates;
    count_writers(ir.graph, &writes, &updates);
    ck_assert_int_eq(writes, 1);
    ck_assert_msg(updates == (c > 0), "MeanOut %s, VarianceOut %s: %d change(s)", outs[c][0],
                  outs[c][1], updates);
    release(&ir);
  }
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("graph_read_only");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, eval_with_batch_norm_is_read_only);
  tcase_add_test(tc, training_batch_norm_is_not_read_only);
  tcase_add_test(tc, rule_is_test_mode_stats_onto_themselves);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
