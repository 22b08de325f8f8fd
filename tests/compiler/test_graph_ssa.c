/* The ssa pass: versions per place, dummy vars for write-after-read and
 * write-after-write hazards and for output-less nodes, static in-degrees and
 * successor lists, and cycle detection. Small graphs are built directly
 * with the graph API; the trained MLP checks the invariants at scale. */
#include <check.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "graph_util.h"

typedef struct tg {
  pe_program *p;
  pe_graph *g;
} tg;

static tg tg_new(int n_places) {
  tg t = {pe_program_new(), NULL};
  pe_block *b;
  PU_OK(pe_program_add_block(t.p, -1, &b));
  PU_OK(pe_graph_new(t.p, 0, PE_PLACE_CPU, n_places, &t.g));
  return t;
}

static void tg_free(tg *t) {
  pe_graph_free(t->g);
  pe_program_free(t->p);
}

static int lv(tg *t, const char *name, int place) {
  int id;
  PU_OK(pe_graph_lvar_get(t->g, name, place, &id));
  return id;
}

/* A node on place 0 reading `in` and writing `out` (NULL-separated names:
 * node(t, "A", "x", NULL, "t", NULL)). */
static int node(tg *t, const char *name, ...) {
  int id;
  PU_OK(pe_graph_add_node(t->g, PE_NODE_OP, 0, &id));
  PU_OK(pe_graph_set_name(t->g, id, "%s", name));
  va_list ap;
  va_start(ap, name);
  for (int dir = 0; dir < 2; dir++) {
    const char *v;
    while ((v = va_arg(ap, const char *))) {
      int l = lv(t, v, 0);
      PU_OK(dir ? pe_graph_node_add_out(t->g, id, l) : pe_graph_node_add_in(t->g, id, l));
    }
  }
  va_end(ap);
  return id;
}

static bool has_succ(const pe_graph *g, int a, int b) {
  for (int k = 0; k < g->nodes[a].n_succ; k++)
    if (g->nodes[a].succ[k] == b) return true;
  return false;
}

/* Invariants: in-degree = distinct producers; successor lists mirror them;
 * data vars first, dummies after; array order is topological. */
static void check_links(const pe_graph *g) {
  int sum_in = 0, sum_succ = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const pe_graph_node *x = &g->nodes[i];
    int distinct = 0;
    for (int k = 0; k < x->n_in; k++) {
      int pr = g->vars[x->in[k]].producer;
      bool dup = pr < 0 || pr == i;
      for (int j = 0; j < k && !dup; j++) dup = g->vars[x->in[j]].producer == pr;
      if (!dup) {
        distinct++;
        ck_assert_msg(has_succ(g, pr, i), "%s -> %s missing from succ", g->nodes[pr].name, x->name);
      }
      ck_assert_int_eq(g->vars[x->in[k]].dummy, k >= x->n_in_data);
    }
    ck_assert_int_eq(x->in_degree, distinct);
    for (int k = 0; k < x->n_out; k++)
      ck_assert_int_eq(g->vars[x->out[k]].dummy, k >= x->n_out_data);
    ck_assert_int_ge(x->n_out, 1); /* every node produces something */
    for (int k = 0; k < x->n_succ; k++) {
      ck_assert_int_gt(x->succ[k], i); /* forward only, no after edges here */
      for (int j = 0; j < k; j++) ck_assert_int_ne(x->succ[j], x->succ[k]);
    }
    sum_in += x->in_degree;
    sum_succ += x->n_succ;
  }
  ck_assert_int_eq(sum_in, sum_succ);
}

/* The var node `n` reads for lvar l. */
static const pe_graph_var *in_var(const pe_graph *g, int n, int l) {
  for (int k = 0; k < g->nodes[n].n_in; k++) {
    const pe_graph_var *v = &g->vars[g->nodes[n].in[k]];
    if (v->lvar == l) return v;
  }
  ck_abort_msg("node %d does not read lvar %d", n, l);
  return NULL;
}

START_TEST(versions_and_war_dummy) {
  tg t = tg_new(1);
  int a = node(&t, "A", "x", NULL, "t", NULL);
  int b = node(&t, "B", "t", NULL, "u", NULL);
  int c = node(&t, "C", "t", NULL, "v", NULL);
  int d = node(&t, "D", "u", NULL, "t", NULL); /* overwrites t: waits for B and C */
  int e = node(&t, "E", "t", "v", NULL, "w", NULL);
  PU_OK(pe_graph_build_ssa(t.g));
  pe_graph *g = t.g;
  int lt = lv(&t, "t", 0), lx = lv(&t, "x", 0);
  ck_assert_int_eq(g->lvars[lt].n_versions, 2);
  ck_assert_int_eq(in_var(g, b, lt)->version, 1);
  ck_assert_int_eq(in_var(g, b, lt)->producer, a);
  ck_assert_int_eq(in_var(g, e, lt)->version, 2);
  ck_assert_int_eq(in_var(g, e, lt)->producer, d);
  ck_assert_int_eq(in_var(g, a, lx)->version, 0); /* defined at entry */
  ck_assert_int_eq(in_var(g, a, lx)->producer, -1);
  /* D: data input u (from B) plus a dummy from C; B needs none (it produces u). */
  ck_assert_int_eq(g->nodes[d].n_in_data, 1);
  ck_assert_int_eq(g->nodes[d].n_in, 2);
  const pe_graph_var *dv = &g->vars[g->nodes[d].in[1]];
  ck_assert(dv->dummy);
  ck_assert_int_eq(dv->producer, c);
  ck_assert_int_eq(dv->lvar, -1);
  ck_assert_int_eq(g->nodes[d].in_degree, 2);
  ck_assert(has_succ(g, c, d));
  ck_assert(has_succ(g, b, d));
  ck_assert_int_eq(g->nodes[e].in_degree, 2); /* D (t) and C (v) */
  check_links(g);
  tg_free(&t);
}
END_TEST

START_TEST(waw_and_outputless) {
  tg t = tg_new(1);
  int f = node(&t, "F", NULL, "u", NULL);
  int h = node(&t, "H", NULL, "u", NULL); /* nobody read F's u: waits for F */
  int k = node(&t, "K", "u", NULL, NULL); /* no output: gets a dummy one */
  PU_OK(pe_graph_build_ssa(t.g));
  pe_graph *g = t.g;
  ck_assert_int_eq(g->nodes[h].in_degree, 1);
  ck_assert(has_succ(g, f, h));
  ck_assert_int_eq(g->vars[g->nodes[h].in[0]].producer, f);
  ck_assert_int_eq(g->nodes[k].n_out_data, 0);
  ck_assert_int_eq(g->nodes[k].n_out, 1);
  ck_assert(g->vars[g->nodes[k].out[0]].dummy);
  ck_assert_int_eq(g->nodes[k].in_degree, 1);
  check_links(g);
  /* Idempotent: building again gives the same tables. */
  int nv = g->n_vars;
  PU_OK(pe_graph_build_ssa(g));
  ck_assert_int_eq(g->n_vars, nv);
  check_links(g);
  tg_free(&t);
}
END_TEST

START_TEST(cycle_detected) {
  tg t = tg_new(1);
  int a = node(&t, "A", "x", NULL, "t", NULL);
  int b = node(&t, "B", "t", NULL, "u", NULL);
  int c = node(&t, "C", "u", NULL, "v", NULL);
  PU_OK(pe_graph_build_ssa(t.g));
  ck_assert(t.g->ssa);
  /* A must also come after C: A -> B -> C -> A. */
  PU_OK(pe_graph_node_add_after(t.g, a, c));
  pu_expect(pe_graph_build_ssa(t.g), PE_ECYCLE, "cycle", NULL);
  ck_assert(!t.g->ssa);
  ck_assert_int_eq(t.g->n_vars, 0);
  (void)b;
  /* Through the pass manager too, naming the pass. */
  pe_ir ir = {.prog = t.p, .graph = t.g};
  pu_expect(pe_pass_run(&ir, "ssa"), PE_ECYCLE, "pass ssa", NULL);
  ir.graph = NULL;
  tg_free(&t);
}
END_TEST

START_TEST(after_edge_and_topo_order) {
  tg t = tg_new(2);
  int a = node(&t, "A", "x", NULL, "t", NULL);
  int b = node(&t, "B", "y", NULL, "u", NULL);
  PU_OK(pe_graph_node_add_after(t.g, b, a)); /* B after A: a control edge */
  PU_OK(pe_graph_build_ssa(t.g));
  ck_assert_int_eq(t.g->nodes[b].in_degree, 1);
  ck_assert(has_succ(t.g, a, b));
  int order[2];
  PU_OK(pe_graph_topo_order(t.g, order));
  ck_assert_int_eq(order[0], a);
  ck_assert_int_eq(order[1], b);
  pu_expect(pe_graph_node_add_after(t.g, a, a), PE_EINVAL, NULL);
  tg_free(&t);
}
END_TEST

/* Inserting and removing nodes keeps `after` edges pointing at the same
 * nodes and drops the edges of a removed node. */
START_TEST(edit_nodes) {
  tg t = tg_new(1);
  int a = node(&t, "A", "x", NULL, "t", NULL);
  int b = node(&t, "B", "y", NULL, "u", NULL);
  PU_OK(pe_graph_node_add_after(t.g, b, a));
  PU_OK(pe_graph_build_ssa(t.g));
  int x;
  PU_OK(pe_graph_insert_node(t.g, 0, PE_NODE_OP, 0, &x));
  ck_assert(!t.g->ssa); /* ids moved: SSA must be rebuilt */
  PU_OK(pe_graph_set_name(t.g, x, "X"));
  PU_OK(pe_graph_node_add_out(t.g, x, lv(&t, "x", 0)));
  ck_assert_int_eq(t.g->nodes[b + 1].after[0], a + 1);
  PU_OK(pe_graph_build_ssa(t.g));
  ck_assert(has_succ(t.g, x, a + 1));     /* A reads the x that X writes */
  ck_assert(has_succ(t.g, a + 1, b + 1)); /* the after edge survived */
  pe_graph_remove_node(t.g, a + 1);       /* B's edge to A goes with it */
  ck_assert_int_eq(t.g->n_nodes, 2);
  ck_assert_int_eq(t.g->nodes[1].n_after, 0);
  PU_OK(pe_graph_build_ssa(t.g));
  ck_assert_int_eq(t.g->nodes[1].in_degree, 0);
  check_links(t.g);
  pe_ir ir = {.prog = t.p};
  pu_expect(pe_pass_ssa(&ir), PE_EINVAL, "no graph", NULL);
  tg_free(&t);
}
END_TEST

/* The trained MLP on 2 places: versions count up by one, every lvar's
 * versions are on its place, no read sees a stale version. */
START_TEST(mlp_invariants) {
  pe_program *p = gu_mlp_small();
  pe_pass_opts o = {.n_places = 2};
  pe_ir ir = gu_compile(p, &o, GU_TRAIN ",data_parallel,ssa");
  const pe_graph *g = ir.graph;
  for (int l = 0; l < g->n_lvars; l++) {
    const pe_graph_lvar *x = &g->lvars[l];
    ck_assert_int_gt(x->n_versions, 0);
    for (int k = 0; k < x->n_versions; k++) {
      const pe_graph_var *v = &g->vars[x->versions[k]];
      ck_assert_int_eq(v->lvar, l);
      ck_assert_int_eq(v->place, x->place);
      if (k) ck_assert_int_eq(v->version, g->vars[x->versions[k - 1]].version + 1);
      /* Readers of version k come before the writer of k+1 in array order
       * and are ordered before it by the graph. */
      if (k + 1 < x->n_versions) {
        int w = g->vars[x->versions[k + 1]].producer;
        for (int c = 0; c < v->n_consumers; c++) ck_assert_int_le(v->consumers[c], w);
      }
    }
    /* A persistable starts at version 0 (entry); temporaries at 1. */
    ck_assert_int_eq(g->vars[x->versions[0]].version == 0, x->persistable || x->feed);
  }
  check_links(g);
  check_links(ir.startup);
  /* sgd overwrites W: it waits for W's readers (the forward matmul). */
  unsigned char *r = gu_reach(g);
  for (int i = 0; i < g->n_nodes; i++) {
    const pe_graph_node *x = &g->nodes[i];
    if (x->kind != PE_NODE_OP || strcmp(x->desc->type, "sgd") != 0) continue;
    ck_assert(x->writes_persistable && x->reads_persistable);
    const pe_graph_var *w0 = &g->vars[g->lvars[x->out_lv[0]].versions[0]];
    for (int c = 0; c < w0->n_consumers; c++)
      if (w0->consumers[c] != i) ck_assert(r[(size_t)w0->consumers[c] * g->n_nodes + i]);
  }
  free(r);
  pe_ir_destroy(&ir);
  pe_program_free(p);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("graph_ssa");
  TCase *tc = tcase_create("ssa");
  tcase_add_test(tc, versions_and_war_dummy);
  tcase_add_test(tc, waw_and_outputless);
  tcase_add_test(tc, cycle_detected);
  tcase_add_test(tc, after_edge_and_topo_order);
  tcase_add_test(tc, edit_nodes);
  tcase_add_test(tc, mlp_invariants);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
