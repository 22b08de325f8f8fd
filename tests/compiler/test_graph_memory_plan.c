/* The memory_plan pass: buffer sharing reduces the bytes of the MLP, never
 * shares a buffer between two temporaries whose lifetimes can overlap in any
 * schedule the graph allows (checked against reachability computed here
 * from the vars, independently of the pass), never crosses places, and
 * leaves persistables, feeds, kept and bucketed variables alone. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "graph_util.h"
#include "pe_models.h"

#define MAX_ACC 4096

/* For every buffer shared by lvars A and B: every access of one strictly
 * precedes (is a graph ancestor of) every access of the other. */
static void check_plan(const pe_graph *g) {
  unsigned char *r = gu_reach(g);
  int n = g->n_nodes;
  int *aa = malloc(MAX_ACC * sizeof(int)), *ab = malloc(MAX_ACC * sizeof(int));
  ck_assert(aa && ab);
  int members = 0;
  for (int b = 0; b < g->n_buffers; b++) {
    const pe_graph_buffer *bf = &g->buffers[b];
    members += bf->n_lvars;
    for (int i = 0; i < bf->n_lvars; i++) {
      const pe_graph_lvar *l = &g->lvars[bf->lvars[i]];
      ck_assert_int_eq(l->buffer, b);
      ck_assert_int_eq(l->place, bf->place);
      if (bf->n_lvars > 1) {
        ck_assert(!l->persistable && !l->feed && !l->keep && l->bucket < 0);
        ck_assert_int_gt(g->vars[l->versions[l->n_versions - 1]].n_consumers, 0);
      }
    }
    ck_assert_int_eq(bf->shared, bf->n_lvars > 1);
    for (int i = 0; i < bf->n_lvars; i++)
      for (int j = i + 1; j < bf->n_lvars; j++) {
        int na = gu_accesses(g, bf->lvars[i], aa, MAX_ACC);
        int nb = gu_accesses(g, bf->lvars[j], ab, MAX_ACC);
        bool ab_first = true, ba_first = true;
        for (int x = 0; x < na; x++)
          for (int y = 0; y < nb; y++) {
            ab_first &= aa[x] != ab[y] && r[(size_t)aa[x] * n + ab[y]];
            ba_first &= aa[x] != ab[y] && r[(size_t)ab[y] * n + aa[x]];
          }
        ck_assert_msg(ab_first || ba_first, "%s and %s share buffer %d but may overlap",
                      g->lvars[bf->lvars[i]].name, g->lvars[bf->lvars[j]].name, b);
      }
  }
  ck_assert_int_eq(members, g->n_lvars);
  for (int v = 0; v < g->n_vars; v++)
    if (!g->vars[v].dummy) ck_assert_int_eq(g->vars[v].buffer, g->lvars[g->vars[v].lvar].buffer);
  free(aa);
  free(ab);
  free(r);
}

static int n_shared(const pe_graph *g) {
  int n = 0;
  for (int b = 0; b < g->n_buffers; b++) n += g->buffers[b].shared;
  return n;
}

/* Returns planned / unplanned bytes at the model's default batch. */
static double check_model(const char *model, int n_places, pe_graph_strategy strategy, bool fuse,
                          bool for_test) {
  pe_model_spec md;
  char err[256];
  ck_assert_msg(pe_model_spec_build(model, &md, err, sizeof err) == 0, "%s", err);
  pe_program *p;
  PU_OK(pe_program_decode(md.bytes, md.len, &p));
  pe_pass_opts o = {.n_places = n_places, .strategy = strategy, .fuse = fuse};
  pe_ir ir = gu_compile(p, &o,
                        for_test ? "validate,inference,data_parallel,ssa,memory_plan"
                                 : GU_TRAIN ",data_parallel,ssa,fuse_allreduce,memory_plan");
  const pe_graph *g = ir.graph;
  ck_assert(g->planned);
  int64_t planned, unplanned;
  pe_graph_memory_bytes(g, md.default_batch, &planned, &unplanned);
  ck_assert_msg(planned < unplanned, "%s on %d places: planned %lld, unplanned %lld", model,
                n_places, (long long)planned, (long long)unplanned);
  ck_assert_int_gt(n_shared(g), 0);
  check_plan(g);
  pe_ir_destroy(&ir);
  pe_program_free(p);
  pe_model_spec_release(&md);
  return (double)planned / (double)unplanned;
}

START_TEST(mlp_reduces_bytes) {
  check_model("mlp", 1, PE_STRATEGY_ALLREDUCE, false, false);
  check_model("mlp", 2, PE_STRATEGY_ALLREDUCE, true, false);
  check_model("mlp", 2, PE_STRATEGY_REDUCE, false, false);
  /* Forward only: activations die right after their reader. */
  double r = check_model("mlp", 2, PE_STRATEGY_ALLREDUCE, false, true);
  ck_assert_msg(r < 0.75, "eval graph planned/unplanned %.2f", r);
}
END_TEST

START_TEST(cnn_is_safe) {
  check_model("cnn", 2, PE_STRATEGY_ALLREDUCE, true, false);
  check_model("cnn", 2, PE_STRATEGY_REDUCE, false, false);
  check_model("cnn", 1, PE_STRATEGY_ALLREDUCE, false, true);
}
END_TEST

/* x -> a = relu(x), b = tanh(x) -> c = a + b -> d = relu(c) -> e = tanh(d)
 * -> l = mean(e). a and b are live together; d can take a's buffer (a's
 * last reader, the add, precedes relu(c)) and e b's. */
static pe_program *branches(void) {
  pe_program *p = pe_program_new();
  pe_block *m;
  PU_OK(pe_program_add_block(p, -1, &m));
  pu_feed(m, "x", PE_F32, PE_SHAPE(-1, 4));
  const char *names[] = {"a", "b", "c", "d", "e", "l"};
  for (int i = 0; i < 6; i++) pu_var(m, names[i], PE_F32, NULL);
  pu_op(m, "relu", "X", "x", NULL, "Out", "a", NULL);
  pu_op(m, "tanh", "X", "x", NULL, "Out", "b", NULL);
  pu_op(m, "elementwise_add", "X", "a", "Y", "b", NULL, "Out", "c", NULL);
  pu_op(m, "relu", "X", "c", NULL, "Out", "d", NULL);
  pu_op(m, "tanh", "X", "d", NULL, "Out", "e", NULL);
  pu_op(m, "mean", "X", "e", NULL, "Out", "l", NULL);
  return p;
}

static int buf(const pe_graph *g, const char *name) {
  return g->lvars[gu_lvar(g, name, 0)].buffer;
}

START_TEST(reuse_follows_dependencies) {
  pe_program *p = branches();
  pe_ir ir = gu_compile(p, NULL, "validate,data_parallel,ssa,memory_plan");
  const pe_graph *g = ir.graph;
  ck_assert_int_ne(buf(g, "a"), buf(g, "b"));
  ck_assert_int_ne(buf(g, "c"), buf(g, "a"));
  ck_assert_int_ne(buf(g, "c"), buf(g, "b"));
  ck_assert_int_eq(buf(g, "d"), buf(g, "a"));
  ck_assert_int_eq(buf(g, "e"), buf(g, "b"));
  ck_assert_int_ne(buf(g, "x"), buf(g, "a")); /* feeds are not planned */
  ck_assert(!g->buffers[buf(g, "l")].shared); /* nor graph outputs */
  check_plan(g);
  /* Per-place batch of 10 rows: 16 bytes per row for x..e, 4 for l. */
  int64_t planned, unplanned;
  pe_graph_memory_bytes(g, 10, &planned, &unplanned);
  ck_assert_int_eq(unplanned, 6 * 160 + 4);
  ck_assert_int_eq(planned, 4 * 160 + 4);
  ck_assert_int_eq(pe_graph_buffer_bytes(g, buf(g, "d"), 10), 160);
  /* The graph keeps its edges: planning adds none. */
  ck_assert_int_eq(g->nodes[3].in_degree, 1);
  pe_ir_destroy(&ir);

  /* Kept (fetchable) variables keep their own buffer. */
  const char *keep[] = {"d"};
  pe_pass_opts o = {.n_keep = 1, .keep = keep, .n_places = 2};
  ir = gu_compile(p, &o, "data_parallel,ssa,memory_plan");
  g = ir.graph;
  for (int q = 0; q < 2; q++) {
    const pe_graph_lvar *d = &g->lvars[gu_lvar(g, "d", q)];
    ck_assert(d->keep);
    ck_assert_int_eq(g->buffers[d->buffer].n_lvars, 1);
  }
  check_plan(g);
  pe_ir_destroy(&ir);
  pe_program_free(p);
}
END_TEST

START_TEST(plan_without_ssa_builds_it) {
  pe_program *p = branches();
  pe_ir ir = gu_compile(p, NULL, "validate,data_parallel,memory_plan");
  ck_assert(ir.graph->ssa && ir.graph->planned);
  check_plan(ir.graph);
  /* A second run is a no-op. */
  int nb = ir.graph->n_buffers;
  PU_OK(pe_pass_run(&ir, "memory_plan"));
  ck_assert_int_eq(ir.graph->n_buffers, nb);
  pe_ir_destroy(&ir);
  pe_program_free(p);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("graph_memory_plan");
  TCase *tc = tcase_create("memory_plan");
  tcase_add_test(tc, mlp_reduces_bytes);
  tcase_add_test(tc, cnn_is_safe);
  tcase_add_test(tc, reuse_follows_dependencies);
  tcase_add_test(tc, plan_without_ssa_builds_it);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
