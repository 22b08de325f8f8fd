/* The fuse_allreduce pass: buckets respect the byte limit (a gradient over
 * the limit alone excepted), cover every parameter gradient exactly once,
 * lay gradients out at aligned, disjoint offsets, replace the per-gradient
 * all_reduces by one fused node each placed after the last producer in the
 * bucket, and do nothing when fusion is off. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "graph_util.h"

static void check_buckets(const pe_graph *g, int64_t limit) {
  int n = g->n_places;
  int *covered = calloc((size_t)g->n_params, sizeof(int));
  ck_assert_ptr_nonnull(covered);
  ck_assert_int_eq(gu_count(g, PE_NODE_ALL_REDUCE), 0);
  ck_assert_int_eq(gu_count(g, PE_NODE_FUSED_ALL_REDUCE), g->n_buckets);
  for (int b = 0; b < g->n_buckets; b++) {
    const pe_graph_bucket *bk = &g->buckets[b];
    ck_assert_int_gt(bk->n_grads, 0);
    ck_assert_msg(bk->bytes <= limit || bk->n_grads == 1, "bucket %d: %lld bytes > %lld", b,
                  (long long)bk->bytes, (long long)limit);
    int64_t end = 0;
    for (int k = 0; k < bk->n_grads; k++) {
      ck_assert_int_eq(bk->offsets[k] % 64, 0);
      ck_assert_int_ge(bk->offsets[k], end); /* disjoint, in order */
      const pe_graph_lvar *l0 = &g->lvars[bk->lvars[k]];
      end = bk->offsets[k] + l0->bytes;
      ck_assert_int_le(end, bk->bytes);
      int j = 0;
      while (j < g->n_params && strcmp(g->grads[j], bk->grads[k]) != 0) j++;
      ck_assert_int_lt(j, g->n_params);
      covered[j]++;
      for (int q = 0; q < n; q++) {
        const pe_graph_lvar *l = &g->lvars[bk->lvars[q * bk->n_grads + k]];
        ck_assert_str_eq(l->name, bk->grads[k]);
        ck_assert_int_eq(l->place, q);
        ck_assert_int_eq(l->bucket, b);
        ck_assert_int_eq(l->bucket_offset, bk->offsets[k]);
      }
    }
    /* The fused node: place-major lists, after every member's producers. */
    const pe_graph_node *x = &g->nodes[bk->node];
    ck_assert_int_eq(x->kind, PE_NODE_FUSED_ALL_REDUCE);
    ck_assert_int_eq(x->bucket, b);
    ck_assert_int_eq(x->width, bk->n_grads);
    ck_assert_int_eq(x->n_in_data, n * bk->n_grads);
    for (int k = 0; k < x->n_in_data; k++) {
      ck_assert_int_eq(x->in_lv[k], bk->lvars[k]);
      ck_assert_int_eq(x->out_lv[k], bk->lvars[k]);
      int pr = g->vars[x->in[k]].producer;
      ck_assert_int_ge(pr, 0);
      ck_assert_int_lt(pr, bk->node);
      /* Every later reader of the gradient reads the reduced version. */
      const pe_graph_var *o = &g->vars[x->out[k]];
      ck_assert_int_eq(o->producer, bk->node);
      ck_assert_int_gt(o->n_consumers, 0);
    }
    /* Right after the last producer in the bucket: only collectives
     * between it and the fused node. */
    int last = -1;
    for (int k = 0; k < x->n_in_data; k++)
      if (g->vars[x->in[k]].producer > last) last = g->vars[x->in[k]].producer;
    for (int i = last + 1; i < bk->node; i++) ck_assert_int_eq(g->nodes[i].place, -1);
  }
  for (int j = 0; j < g->n_params; j++)
    ck_assert_msg(covered[j] == 1, "%s covered %d times", g->grads[j], covered[j]);
  free(covered);
}

static void run(int n_places, int64_t limit, const char *list, int expect_buckets) {
  static const int64_t hidden[] = {16, 8};
  pe_program *p = gu_mlp(12, 2, hidden, 4, "momentum");
  pe_pass_opts o = {.n_places = n_places, .fuse = true, .fuse_bucket_bytes = limit};
  pe_ir ir = gu_compile(p, &o, list);
  check_buckets(ir.graph, limit);
  if (expect_buckets > 0) ck_assert_int_eq(ir.graph->n_buckets, expect_buckets);
  pe_ir_destroy(&ir);
  pe_program_free(p);
}

/* Gradient bytes (f32): w0 12x16 = 768, b0 64, w1 16x8 = 512, b1 32,
 * w2 8x4 = 128, b2 16; padded to 64: 768 64 512 64 128 64 = 1600. */
START_TEST(bucket_limits) {
  const char *after_ssa = GU_TRAIN ",data_parallel,ssa,fuse_allreduce";
  run(2, 1 << 20, after_ssa, 1); /* everything in one bucket */
  run(4, 1 << 20, after_ssa, 1);
  run(2, 64, after_ssa, 6); /* one gradient per bucket; w0..w2 exceed 64 */
  run(2, 600, after_ssa, 0);
  run(4, 800, after_ssa, 0);
  /* Fusing before ssa works as well. */
  run(2, 600, GU_TRAIN ",data_parallel,fuse_allreduce,ssa", 0);
}
END_TEST

START_TEST(fuse_off_keeps_all_reduces) {
  pe_program *p = gu_mlp_small();
  pe_pass_opts o = {.n_places = 2, .fuse = false};
  pe_ir ir = gu_compile(p, &o, GU_TRAIN ",data_parallel,ssa,fuse_allreduce");
  ck_assert_int_eq(ir.graph->n_buckets, 0);
  ck_assert_int_eq(gu_count(ir.graph, PE_NODE_ALL_REDUCE), 6);
  ck_assert_int_eq(gu_count(ir.graph, PE_NODE_FUSED_ALL_REDUCE), 0);
  ck_assert(ir.graph->ssa);
  pe_ir_destroy(&ir);
  /* Reduce strategy: reduces stay per gradient even with fuse on. */
  pe_pass_opts r = {.n_places = 2, .fuse = true, .strategy = PE_STRATEGY_REDUCE};
  ir = gu_compile(p, &r, "data_parallel,ssa,fuse_allreduce");
  ck_assert_int_eq(ir.graph->n_buckets, 0);
  ck_assert_int_eq(gu_count(ir.graph, PE_NODE_REDUCE), 6);
  pe_ir_destroy(&ir);
  pe_program_free(p);
}
END_TEST

/* A bucket never delays a gradient past its next use: a node reading w0's
 * gradient before the optimizer (here: a scale of it) closes the bucket. */
START_TEST(bucket_closed_before_next_use) {
  pe_program *p = gu_mlp_small();
  pe_ir ir = {.prog = p};
  PU_OK(pe_passes_run(&ir, GU_TRAIN));
  pe_block *m = pe_program_main(p);
  /* Insert scale(fc_2.w@GRAD) right after the op that makes it final. */
  int at = -1;
  for (int i = 0; i < m->n_ops; i++) {
    const char *o = pe_op_output_arg(m->ops[i], "Y@GRAD");
    if (o && strcmp(o, "fc_2.w@GRAD") == 0) at = i;
  }
  ck_assert_int_ge(at, 0);
  pe_op_desc *sc;
  PU_OK(pe_block_insert_op(m, at + 1, "scale", &sc));
  PU_OK(pe_op_input1(sc, "X", "fc_2.w@GRAD"));
  PU_OK(pe_op_output1(sc, "Out", "probe"));
  pu_var(m, "probe", PE_F32, NULL);
  pe_pass_opts o = {.n_places = 2, .fuse = true, .fuse_bucket_bytes = 1 << 20};
  ir.opts = &o;
  PU_OK(pe_passes_run(&ir, "validate,data_parallel,ssa,fuse_allreduce"));
  const pe_graph *g = ir.graph;
  ck_assert_int_ge(g->n_buckets, 2);
  check_buckets(g, 1 << 20);
  /* The scale on each place reads the reduced gradient. */
  for (int i = 0; i < g->n_nodes; i++) {
    const pe_graph_node *x = &g->nodes[i];
    if (x->kind != PE_NODE_OP || strcmp(x->desc->type, "scale") != 0) continue;
    int pr = g->vars[x->in[0]].producer;
    ck_assert_int_eq(g->nodes[pr].kind, PE_NODE_FUSED_ALL_REDUCE);
  }
  pe_ir_destroy(&ir);
  pe_program_free(p);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("graph_fuse");
  TCase *tc = tcase_create("fuse_allreduce");
  tcase_add_test(tc, bucket_limits);
  tcase_add_test(tc, fuse_off_keeps_all_reduces);
  tcase_add_test(tc, bucket_closed_before_next_use);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
