/* The data_parallel pass (with ssa for the dependency checks): node counts
 * on 1, 2 and 4 places, one all_reduce per parameter gradient right after
 * its last writer, the Reduce strategy's reduce / optimizer-on-owner /
 * broadcast, the Sharded strategy's sharded_update nodes (one per
 * parameter, the optimizer's args on every place, ordered after every reader
 * of the old parameter), the startup graph's broadcasts, and the pass
 * manager's graph pipeline. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "graph_util.h"

/* Program index of the last non-optimizer op writing `name`. */
static int prog_last_writer(const pe_block *b, const char *name) {
  int w = -1;
  for (int i = 0; i < b->n_ops; i++) {
    const pe_op_def *def = pe_op_lookup(b->ops[i]->type);
    if (def->flags & PE_OP_OPTIMIZER) continue;
    for (int s = 0; s < b->ops[i]->n_out; s++)
      for (int k = 0; k < b->ops[i]->out[s].n; k++)
        if (strcmp(b->ops[i]->out[s].args[k], name) == 0) w = i;
  }
  return w;
}

/* The op node of `type` on place p whose input slot `slot` reads `arg`. */
static int find_op(const pe_graph *g, const char *type, int p, const char *slot, const char *arg) {
  for (int i = 0; i < g->n_nodes; i++) {
    const pe_graph_node *x = &g->nodes[i];
    if (x->kind != PE_NODE_OP || x->place != p || strcmp(x->desc->type, type) != 0) continue;
    const char *a = pe_op_input_arg(x->desc, slot);
    if (a && strcmp(a, arg) == 0) return i;
  }
  return -1;
}

static int find_collective(const pe_graph *g, pe_node_kind k, const char *name) {
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].kind == k && strcmp(g->lvars[g->nodes[i].in_lv[0]].name, name) == 0) return i;
  return -1;
}

static void check_allreduce(int n_places) {
  pe_program *p = gu_mlp_small();
  pe_pass_opts o = {.n_places = n_places};
  pe_ir ir = gu_compile(p, &o, GU_TRAIN ",data_parallel,ssa");
  const pe_graph *g = ir.graph;
  const pe_block *m = pe_program_main(p);
  int n_ops = m->n_ops, n = n_places;
  ck_assert_int_eq(g->n_places, n);
  ck_assert_int_eq(g->n_params, 6);
  ck_assert_int_eq(gu_count(g, PE_NODE_OP), (n_ops - 1) * n);
  ck_assert_int_eq(gu_count(g, PE_NODE_LOSS_GRAD_SCALE), n);
  ck_assert_int_eq(gu_count(g, PE_NODE_ALL_REDUCE), 6);
  ck_assert_int_eq(gu_count(g, PE_NODE_REDUCE) + gu_count(g, PE_NODE_BROADCAST), 0);
  ck_assert_int_eq(g->n_nodes, n_ops * n + 6);
  for (int q = 0; q < n; q++) {
    ck_assert_int_eq(gu_count_op(g, "sgd", q), 6);
    ck_assert(g->lvars[gu_lvar(g, "x", q)].feed);
    ck_assert(g->lvars[gu_lvar(g, g->params[0], q)].persistable);
    ck_assert(g->lvars[gu_lvar(g, g->loss, q)].keep);
  }
  for (int i = 0; i < g->n_nodes; i++) {
    const pe_graph_node *x = &g->nodes[i];
    if (x->kind == PE_NODE_LOSS_GRAD_SCALE) {
      ck_assert_str_eq(x->desc->type, "fill_constant");
      ck_assert_int_eq(x->n_out_data, 1);
      ck_assert_int_eq(x->in_degree, 0);
      ck_assert_int_eq(g->lvars[x->out_lv[0]].place, x->place);
      continue;
    }
    if (x->kind != PE_NODE_ALL_REDUCE) continue;
    ck_assert_int_eq(x->place, -1);
    ck_assert_int_eq(x->stream, PE_STREAM_COMM);
    ck_assert_int_eq(x->width, 1);
    ck_assert_int_eq(x->n_in_lv, n);
    ck_assert_int_eq(x->n_out_lv, n);
    const char *grad = g->lvars[x->in_lv[0]].name;
    int j = 0;
    while (j < g->n_params && strcmp(g->grads[j], grad) != 0) j++;
    ck_assert_msg(j < g->n_params, "%s is not a parameter gradient", grad);
    int pw = prog_last_writer(m, grad), last = -1;
    for (int q = 0; q < n; q++) {
      int lv = x->in_lv[q];
      ck_assert_int_eq(x->out_lv[q], lv);
      ck_assert_int_eq(g->lvars[lv].place, q);
      int w = gu_last_writer(g, lv, i);
      ck_assert_int_ge(w, 0);
      ck_assert_int_eq(g->nodes[w].place, q);
      ck_assert_int_eq(g->nodes[w].src_op, pw);
      ck_assert_int_eq(g->vars[x->in[q]].producer, w); /* ssa: waits on it */
      if (w > last) last = w;
      /* The optimizer reads the all-reduced version. */
      int opt = find_op(g, "sgd", q, "Grad", grad);
      ck_assert_int_ge(opt, 0);
      const pe_graph_node *ox = &g->nodes[opt];
      int gs = pe_op_input_index(ox->def, "Grad");
      ck_assert_int_eq(g->vars[ox->in[ox->in_slot[gs]]].producer, i);
    }
    /* Right after its producers: only collectives in between. */
    for (int k = last + 1; k < i; k++) ck_assert_int_eq(g->nodes[k].place, -1);
    ck_assert_int_eq(x->in_degree, n);
  }
  pe_ir_destroy(&ir);
  pe_program_free(p);
}

START_TEST(allreduce_2_places) {
  check_allreduce(2);
}
END_TEST

START_TEST(allreduce_4_places) {
  check_allreduce(4);
}
END_TEST

START_TEST(one_place_has_no_collectives) {
  pe_program *p = gu_mlp_small();
  pe_ir ir = gu_compile(p, NULL, GU_TRAIN ",data_parallel,ssa");
  const pe_graph *g = ir.graph;
  ck_assert_int_eq(g->n_places, 1);
  ck_assert_int_eq(g->n_nodes, pe_program_main(p)->n_ops);
  ck_assert_int_eq(gu_count(g, PE_NODE_LOSS_GRAD_SCALE), 1);
  for (int i = 0; i < g->n_nodes; i++) ck_assert_int_eq(g->nodes[i].place, 0);
  ck_assert_int_eq(gu_count(ir.startup, PE_NODE_BROADCAST), 0);
  pe_ir_destroy(&ir);
  pe_program_free(p);
}
END_TEST

static void check_reduce(int n_places) {
  pe_program *p = gu_mlp_small();
  pe_pass_opts o = {.n_places = n_places, .strategy = PE_STRATEGY_REDUCE};
  pe_ir ir = gu_compile(p, &o, GU_TRAIN ",data_parallel,ssa");
  const pe_graph *g = ir.graph;
  int n = n_places;
  ck_assert_int_eq(gu_count(g, PE_NODE_ALL_REDUCE), 0);
  ck_assert_int_eq(gu_count(g, PE_NODE_REDUCE), 6);
  ck_assert_int_eq(gu_count(g, PE_NODE_BROADCAST), 6);
  ck_assert_int_eq(gu_count_op(g, "sgd", -2), 6);
  unsigned char *r = gu_reach(g);
  bool used[PE_MAX_PLACES] = {false};
  int n_used = 0;
  for (int j = 0; j < g->n_params; j++) {
    int own = g->owner[j];
    ck_assert(own >= 0 && own < n);
    if (!used[own]) used[own] = true, n_used++;
    /* The optimizer only on the owner. */
    for (int q = 0; q < n; q++)
      ck_assert_int_eq(find_op(g, "sgd", q, "Param", g->params[j]) >= 0, q == own);
    int opt = find_op(g, "sgd", own, "Param", g->params[j]);
    int red = find_collective(g, PE_NODE_REDUCE, g->grads[j]);
    ck_assert_int_ge(red, 0);
    const pe_graph_node *rx = &g->nodes[red];
    ck_assert_int_eq(rx->root, own);
    ck_assert_int_eq(rx->n_in_lv, n);
    ck_assert_int_eq(rx->n_out_lv, 1);
    ck_assert_int_eq(g->lvars[rx->out_lv[0]].place, own);
    ck_assert_int_lt(red, opt);
    int bc = find_collective(g, PE_NODE_BROADCAST, g->params[j]);
    ck_assert_int_ge(bc, 0);
    const pe_graph_node *bx = &g->nodes[bc];
    ck_assert_int_eq(bx->root, own);
    ck_assert_int_eq(bx->n_in_lv, 1);
    ck_assert_int_eq(g->lvars[bx->in_lv[0]].place, own);
    ck_assert_int_eq(bx->n_out_lv, n - 1);
    ck_assert(bx->writes_persistable);
    ck_assert_int_eq(g->vars[bx->in[0]].producer, opt); /* the updated value */
    for (int k = 0, q = 0; q < n; q++) {
      if (q == own) continue;
      int lv = bx->out_lv[k++];
      ck_assert_int_eq(g->lvars[lv].place, q);
      /* Write-after-read: every reader of the old value on q precedes it. */
      const pe_graph_var *v0 = &g->vars[g->lvars[lv].versions[0]];
      ck_assert_int_eq(v0->version, 0);
      ck_assert_int_gt(v0->n_consumers, 0);
      for (int c = 0; c < v0->n_consumers; c++)
        ck_assert_msg(r[(size_t)v0->consumers[c] * g->n_nodes + bc], "%s does not precede %s",
                      g->nodes[v0->consumers[c]].name, bx->name);
    }
  }
  ck_assert_int_eq(n_used, n < 6 ? n : 6);
  free(r);
  pe_ir_destroy(&ir);
  pe_program_free(p);
}

START_TEST(reduce_2_places) {
  check_reduce(2);
}
END_TEST

START_TEST(reduce_4_places) {
  check_reduce(4);
}
END_TEST

/* The 12 -> 16 relu -> 8 relu -> 4 MLP trained with `opt` (gu_mlp). */
static pe_program *mlp_with(const char *opt) {
  return gu_mlp(12, 2, (const int64_t[]){16, 8}, 4, opt);
}

/* Sharded strategy on n places: one sharded_update node per parameter in
 * place of its all_reduce and the n optimizer op nodes; the node carries
 * the optimizer op's args of every place (place-major, graph.h), waits for
 * every place's gradient and for every reader of the old parameter and
 * state, and never writes a gradient back. */
static void check_sharded(const char *opt, int n) {
  pe_program *p = mlp_with(opt);
  pe_pass_opts o = {.n_places = n, .strategy = PE_STRATEGY_SHARDED};
  pe_ir ir = gu_compile(p, &o, GU_TRAIN ",data_parallel,ssa");
  const pe_graph *g = ir.graph;
  const pe_block *m = pe_program_main(p);
  ck_assert_int_eq(g->strategy, PE_STRATEGY_SHARDED);
  ck_assert_int_eq(g->n_params, 6);
  int n_opt = 0; /* optimizer ops of the program: one per parameter */
  for (int i = 0; i < m->n_ops; i++) n_opt += pu_find_op(m, opt, i) == i;
  ck_assert_int_eq(n_opt, 6);
  ck_assert_int_eq(gu_count(g, PE_NODE_SHARDED_UPDATE), 6);
  ck_assert_int_eq(gu_count(g, PE_NODE_ALL_REDUCE), 0);
  ck_assert_int_eq(gu_count(g, PE_NODE_FUSED_ALL_REDUCE) + gu_count(g, PE_NODE_REDUCE) +
                       gu_count(g, PE_NODE_BROADCAST),
                   0);
  ck_assert_int_eq(gu_count_op(g, opt, -2), 0);
  ck_assert_int_eq(gu_count(g, PE_NODE_LOSS_GRAD_SCALE), n);
  ck_assert_int_eq(g->n_nodes, (m->n_ops - 6) * n + 6);
  for (int j = 0; j < g->n_params; j++) ck_assert_int_eq(g->owner[j], -1);
  unsigned char *r = gu_reach(g);
  bool seen[6] = {false};
  for (int i = 0; i < g->n_nodes; i++) {
    const pe_graph_node *x = &g->nodes[i];
    if (x->kind != PE_NODE_SHARDED_UPDATE) continue;
    ck_assert_ptr_nonnull(x->desc);
    ck_assert_ptr_nonnull(x->def);
    ck_assert_str_eq(x->desc->type, opt);
    ck_assert_str_eq(x->def->type, opt);
    ck_assert(x->def->flags & PE_OP_ELEMENTWISE);
    ck_assert_ptr_eq(x->desc, g->prog->blocks[g->block]->ops[x->src_op]);
    ck_assert_int_eq(x->place, -1);
    ck_assert_int_eq(x->root, 0);
    ck_assert_int_eq(x->bucket, -1);
    int w_in = x->in_slot[x->def->n_inputs], w_out = x->out_slot[x->def->n_outputs];
    ck_assert_int_eq(w_in, !strcmp(opt, "adam") ? 7 : !strcmp(opt, "momentum") ? 4 : 3);
    ck_assert_int_eq(w_out, !strcmp(opt, "adam") ? 5 : !strcmp(opt, "momentum") ? 2 : 1);
    ck_assert_int_eq(x->width, w_in);
    ck_assert_int_eq(x->n_in_lv, w_in * n);
    ck_assert_int_eq(x->n_out_lv, w_out * n);
    ck_assert_int_eq(x->n_in_data, w_in * n);
    ck_assert_int_eq(x->n_out_data, w_out * n);
    ck_assert(x->reads_persistable);
    ck_assert(x->writes_persistable);
    const char *param = pe_op_input_arg(x->desc, "Param");
    const char *grad = pe_op_input_arg(x->desc, "Grad");
    int j = 0;
    while (j < g->n_params && strcmp(g->params[j], param) != 0) j++;
    ck_assert_msg(j < g->n_params, "%s is not a parameter", param);
    ck_assert_msg(!seen[j], "two sharded_update nodes for %s", param);
    seen[j] = true;
    ck_assert_str_eq(g->grads[j], grad);
    char want[256];
    snprintf(want, sizeof want, "sharded_update(%s#%d %s)", opt, x->src_op, param);
    ck_assert_str_eq(x->name, want);
    int pw = prog_last_writer(m, grad);
    for (int q = 0; q < n; q++) {
      /* Place q's inputs: the optimizer's args in def slot order, on q. */
      for (int s = 0; s < x->def->n_inputs; s++) {
        const pe_slot *sl = pe_op_find_input(x->desc, x->def->inputs[s].name);
        int cnt = x->in_slot[s + 1] - x->in_slot[s];
        ck_assert_int_eq(cnt, sl ? sl->n : 0);
        for (int k = 0; k < cnt; k++) {
          const pe_graph_lvar *lv = &g->lvars[x->in_lv[q * w_in + x->in_slot[s] + k]];
          ck_assert_str_eq(lv->name, sl->args[k]);
          ck_assert_int_eq(lv->place, q);
        }
      }
      for (int s = 0; s < x->def->n_outputs; s++) {
        const pe_slot *sl = pe_op_find_output(x->desc, x->def->outputs[s].name);
        int cnt = x->out_slot[s + 1] - x->out_slot[s];
        ck_assert_int_eq(cnt, sl ? sl->n : 0);
        for (int k = 0; k < cnt; k++) {
          const pe_graph_lvar *lv = &g->lvars[x->out_lv[q * w_out + x->out_slot[s] + k]];
          ck_assert_str_eq(lv->name, sl->args[k]);
          ck_assert_int_eq(lv->place, q);
          ck_assert(lv->persistable); /* in place: Param, state, beta pows */
          ck_assert_str_ne(lv->name, grad);
        }
      }
      /* Waits for place q's last writer of the gradient. */
      int gs = pe_op_input_index(x->def, "Grad");
      int glv = x->in_lv[q * w_in + x->in_slot[gs]];
      ck_assert_str_eq(g->lvars[glv].name, grad);
      int wr = gu_last_writer(g, glv, i);
      ck_assert_int_ge(wr, 0);
      ck_assert_int_eq(g->nodes[wr].place, q);
      ck_assert_int_eq(g->nodes[wr].src_op, pw);
      ck_assert_int_eq(g->vars[x->in[q * w_in + x->in_slot[gs]]].producer, wr);
      /* Write-after-read: every reader of the old parameter on q (the
       * forward and backward ops) precedes the update. */
      int plv = gu_lvar(g, param, q);
      const pe_graph_var *v0 = &g->vars[g->lvars[plv].versions[0]];
      ck_assert_int_eq(v0->version, 0);
      ck_assert_int_gt(v0->n_consumers, 1);
      for (int c = 0; c < v0->n_consumers; c++)
        ck_assert_msg(v0->consumers[c] == i || r[(size_t)v0->consumers[c] * g->n_nodes + i],
                      "%s does not precede %s", g->nodes[v0->consumers[c]].name, x->name);
    }
    /* Data inputs: produced only by the n gradients' last writers (Param
     * and state enter at version 0); the dummies (write-after-read) add the
     * remaining in-degree. */
    int prods[64], n_prod = 0;
    for (int k = 0; k < x->n_in; k++) {
      const pe_graph_var *v = &g->vars[x->in[k]];
      if (k < x->n_in_data && !v->dummy && g->lvars[v->lvar].persistable)
        ck_assert_int_eq(v->producer, -1);
      bool dup = v->producer < 0;
      for (int t = 0; t < n_prod && !dup; t++) dup = prods[t] == v->producer;
      if (!dup) {
        ck_assert_int_lt(n_prod, 64);
        prods[n_prod++] = v->producer;
      }
    }
    ck_assert_int_eq(x->in_degree, n_prod);
    ck_assert_int_ge(x->in_degree, n);
  }
  for (int j = 0; j < 6; j++) ck_assert_msg(seen[j], "no sharded_update for %s", g->params[j]);
  free(r);
  pe_ir_destroy(&ir);
  pe_program_free(p);
}

START_TEST(sharded_momentum) {
  check_sharded("momentum", 2);
  check_sharded("momentum", 3);
}
END_TEST

START_TEST(sharded_adam_sgd) {
  check_sharded("adam", 2);
  check_sharded("adam", 3);
  check_sharded("sgd", 4);
}
END_TEST

/* Parameters a sharded_update cannot take keep all_reduce + an optimizer
 * per place: without an optimizer (gradients only) all of them; a
 * parameter whose gradient feeds two optimizer ops only that one. */
START_TEST(sharded_fallback) {
  pe_program *p = mlp_with("none");
  pe_pass_opts o = {.n_places = 2, .strategy = PE_STRATEGY_SHARDED};
  pe_ir ir = gu_compile(p, &o, GU_TRAIN ",data_parallel,ssa");
  ck_assert_int_eq(ir.graph->n_params, 6);
  ck_assert_int_eq(gu_count(ir.graph, PE_NODE_SHARDED_UPDATE), 0);
  ck_assert_int_eq(gu_count(ir.graph, PE_NODE_ALL_REDUCE), 6);
  pe_ir_destroy(&ir);
  pe_program_free(p);

  p = mlp_with("sgd");
  pe_ir ir2 = gu_compile(p, &o, GU_TRAIN);
  pe_block *m = pe_program_main(p);
  int n_ops = m->n_ops;
  pu_op(m, "sgd", "Param", "fc_0.w", "Grad", "fc_0.w@GRAD", "LearningRate", "learning_rate", NULL,
        "ParamOut", "fc_0.w", NULL);
  PU_OK(pe_passes_run(&ir2, "data_parallel,ssa"));
  const pe_graph *g = ir2.graph;
  ck_assert_int_eq(g->n_params, 6);
  ck_assert_int_eq(gu_count(g, PE_NODE_SHARDED_UPDATE), 5);
  ck_assert_int_eq(gu_count(g, PE_NODE_ALL_REDUCE), 1);
  ck_assert_int_ge(find_collective(g, PE_NODE_ALL_REDUCE, "fc_0.w@GRAD"), 0);
  for (int q = 0; q < 2; q++) {
    ck_assert_int_eq(gu_count_op(g, "sgd", q), 2); /* both of fc_0.w's */
    ck_assert_int_ge(find_op(g, "sgd", q, "Param", "fc_0.w"), 0);
  }
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].kind == PE_NODE_SHARDED_UPDATE)
      ck_assert_str_ne(pe_op_input_arg(g->nodes[i].desc, "Param"), "fc_0.w");
  /* 5 sharded + 1 all_reduce + the ops per place (5 sgd ops fewer). */
  ck_assert_int_eq(g->n_nodes, (n_ops + 1 - 5) * 2 + 6);
  pe_ir_destroy(&ir2);
  pe_program_free(p);
}
END_TEST

START_TEST(sharded_one_place_and_errors) {
  /* One place: nothing to shard, the plain graph (optimizer ops on p0). */
  pe_program *p = mlp_with("momentum");
  pe_pass_opts o1 = {.n_places = 1, .strategy = PE_STRATEGY_SHARDED};
  pe_ir ir = gu_compile(p, &o1, GU_TRAIN ",data_parallel,ssa");
  ck_assert_int_eq(ir.graph->n_nodes, pe_program_main(p)->n_ops);
  ck_assert_int_eq(gu_count(ir.graph, PE_NODE_OP), pe_program_main(p)->n_ops - 1);
  ck_assert_int_eq(gu_count_op(ir.graph, "momentum", 0), 6);
  ck_assert_int_eq(gu_count(ir.graph, PE_NODE_SHARDED_UPDATE), 0);
  pe_ir_destroy(&ir);
  pe_program_free(p);

  /* cuda places: refused, naming the strategy and the place kind. */
  p = mlp_with("momentum");
  pe_pass_opts oc = {.n_places = 2, .strategy = PE_STRATEGY_SHARDED, .place_kind = PE_PLACE_CUDA};
  pe_ir irc = {.prog = p, .opts = &oc};
  pu_expect(pe_passes_run(&irc, GU_TRAIN ",data_parallel"), PE_EINVAL, "sharded", "cuda", NULL);
  ck_assert_ptr_null(irc.graph);
  pe_program_free(p);

  /* The whole pipeline: with fuse on there is no all_reduce to fuse, and
   * the memory plan keeps the gradients the node reads. */
  p = mlp_with("adam");
  pe_pass_opts o3 = {.n_places = 3, .strategy = PE_STRATEGY_SHARDED, .fuse = true};
  pe_ir ir3 = {.prog = p, .opts = &o3};
  PU_OK(pe_graph_compile(&ir3, false));
  ck_assert(ir3.graph->planned);
  ck_assert_int_eq(ir3.graph->n_buckets, 0);
  ck_assert_int_eq(gu_count(ir3.graph, PE_NODE_SHARDED_UPDATE), 6);
  ck_assert_int_eq(gu_count(ir3.graph, PE_NODE_FUSED_ALL_REDUCE), 0);
  ck_assert_str_eq(pe_strategy_name(ir3.graph->strategy), "sharded");
  /* The startup graph is the same as under AllReduce: init on p0, then
   * broadcast of every persistable (moments and beta pows included). */
  ck_assert_int_gt(gu_count(ir3.startup, PE_NODE_BROADCAST), 6 * 3);
  pe_ir_destroy(&ir3);
  pe_program_free(p);
}
END_TEST

static void check_startup(int n_places) {
  pe_program *p = gu_mlp(12, 1, (const int64_t[]){16}, 4, "momentum");
  pe_pass_opts o = {.n_places = n_places};
  pe_ir ir = gu_compile(p, &o, GU_TRAIN ",data_parallel,ssa");
  const pe_graph *s = ir.startup;
  ck_assert_ptr_nonnull(s);
  ck_assert(s->startup);
  const pe_block *sb = pe_program_startup(p);
  /* Distinct persistables the startup block writes: every one is
   * broadcast from place 0. */
  int n_pers = 0;
  for (int i = 0; i < sb->n_ops; i++) {
    const char *out = pe_op_output_arg(sb->ops[i], "Out");
    bool seen = false;
    for (int k = 0; k < i; k++) seen |= !strcmp(pe_op_output_arg(sb->ops[k], "Out"), out);
    n_pers += !seen;
  }
  ck_assert_int_gt(n_pers, 4); /* weights, biases, velocities, learning_rate */
  ck_assert_int_eq(gu_count(s, PE_NODE_OP), sb->n_ops);
  ck_assert_int_eq(gu_count(s, PE_NODE_BROADCAST), n_places > 1 ? n_pers : 0);
  for (int i = 0; i < s->n_nodes; i++) {
    const pe_graph_node *x = &s->nodes[i];
    if (x->kind == PE_NODE_OP) {
      ck_assert_int_eq(x->place, 0);
      continue;
    }
    ck_assert_int_eq(x->root, 0);
    ck_assert_int_eq(x->n_out_lv, n_places - 1);
    int src = s->vars[x->in[0]].producer;
    ck_assert_int_ge(src, 0);
    ck_assert_int_eq(src, gu_last_writer(s, x->in_lv[0], i));
    for (int q = 1; q < n_places; q++) ck_assert_int_eq(s->lvars[x->out_lv[q - 1]].place, q);
  }
  pe_ir_destroy(&ir);
  pe_program_free(p);
}

START_TEST(startup_broadcasts) {
  check_startup(1);
  check_startup(2);
  check_startup(4);
}
END_TEST

START_TEST(pipeline_and_errors) {
  pe_program *p = gu_mlp_small();
  pe_ir ir = {.prog = p};
  pu_expect(pe_passes_run(&ir, "validate,ssa"), PE_EINVAL, "pass ssa", "data_parallel first", NULL);
  pe_pass_opts o = {.n_places = 2, .fuse = true, .fuse_bucket_bytes = 1024};
  ir.opts = &o;
  PU_OK(pe_passes_run(&ir,
                      "validate,backward,optimizer,validate,data_parallel,ssa,"
                      "fuse_allreduce,memory_plan"));
  ck_assert(ir.graph->ssa);
  ck_assert(ir.graph->planned);
  ck_assert_int_gt(ir.graph->n_buckets, 0);
  /* Rerunning data_parallel replaces the graphs (nothing leaks). */
  PU_OK(pe_passes_run(&ir, "data_parallel,ssa"));
  ck_assert_int_eq(ir.graph->n_buckets, 0);
  pe_pass_opts bad = {.n_places = PE_MAX_PLACES + 1};
  ir.opts = &bad;
  pu_expect(pe_pass_run(&ir, "data_parallel"), PE_EINVAL, "places", NULL);
  pe_ir_destroy(&ir);
  pe_program_free(p);

  /* pe_graph_compile: program passes, then the graph passes. */
  p = gu_mlp_small();
  pe_pass_opts o4 = {.n_places = 4, .strategy = PE_STRATEGY_REDUCE};
  pe_ir ir2 = {.prog = p, .opts = &o4};
  PU_OK(pe_graph_compile(&ir2, false));
  ck_assert(ir2.graph->planned);
  ck_assert_int_eq(gu_count(ir2.graph, PE_NODE_REDUCE), 6);
  pe_ir_destroy(&ir2);
  pe_program_free(p);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("graph_data_parallel");
  TCase *tc = tcase_create("data_parallel");
  tcase_add_test(tc, allreduce_2_places);
  tcase_add_test(tc, allreduce_4_places);
  tcase_add_test(tc, one_place_has_no_collectives);
  tcase_add_test(tc, reduce_2_places);
  tcase_add_test(tc, reduce_4_places);
  tcase_add_test(tc, sharded_momentum);
  tcase_add_test(tc, sharded_adam_sgd);
  tcase_add_test(tc, sharded_one_place_and_errors);
  tcase_add_test(tc, sharded_fallback);
  tcase_add_test(tc, startup_broadcasts);
  tcase_add_test(tc, pipeline_and_errors);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
