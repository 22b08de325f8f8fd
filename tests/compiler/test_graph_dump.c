/* The Graphviz dump: the text parses as dot as this writer emits it
 * (statement per line, balanced braces outside quoted strings, terminated
 * quotes), declares every node exactly once, every edge joins declared
 * nodes, and every place has its cluster. The dump pass writes the file
 * named by opts.dump_path. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "graph_util.h"

/* Checks `text` and returns the number of edges. */
static int check_dot(const pe_graph *g, const char *text) {
  ck_assert_msg(strncmp(text, "digraph ", 8) == 0, "starts with: %.20s", text);
  int n = g->n_nodes, depth = 0, edges = 0;
  int *declared = calloc((size_t)n + 1, sizeof(int));
  ck_assert_ptr_nonnull(declared);
  const char *s = text;
  while (*s) {
    const char *e = strchr(s, '\n');
    ck_assert_msg(e != NULL, "unterminated last line");
    char line[2048];
    size_t len = (size_t)(e - s);
    ck_assert_uint_lt(len, sizeof line);
    memcpy(line, s, len);
    line[len] = '\0';
    s = e + 1;
    /* Braces outside strings; strings must end on their line. */
    bool in_str = false;
    for (const char *c = line; *c; c++) {
      if (in_str && *c == '\\' && c[1]) {
        c++;
        continue;
      }
      if (*c == '"') in_str = !in_str;
      if (!in_str && *c == '{') depth++;
      if (!in_str && *c == '}') depth--;
      ck_assert_int_ge(depth, 0);
    }
    ck_assert_msg(!in_str, "unterminated string: %s", line);
    const char *t = line + strspn(line, " ");
    int a, b, k = 0;
    if (sscanf(t, "n%d -> n%d%n", &a, &b, &k) == 2 && k > 0) {
      ck_assert(a >= 0 && a < n && b >= 0 && b < n);
      edges++;
    } else if (sscanf(t, "n%d [%n", &a, &k) == 1 && k > 0) {
      ck_assert(a >= 0 && a < n);
      declared[a]++;
      ck_assert_msg(strstr(t, "label=\"") != NULL, "node without label: %s", t);
      ck_assert_msg(line[len - 1] == ';', "statement not terminated: %s", line);
    }
  }
  ck_assert_int_eq(depth, 0);
  for (int i = 0; i < n; i++)
    ck_assert_msg(declared[i] == 1, "node %d declared %d times", i, declared[i]);
  for (int q = 0; q < g->n_places; q++) {
    char c[32];
    snprintf(c, sizeof c, "subgraph cluster_p%d {", q);
    ck_assert_msg(strstr(text, c) != NULL, "no cluster for place %d", q);
  }
  free(declared);
  return edges;
}

static char *dump_to_string(const pe_graph *g) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ck_assert_ptr_nonnull(f);
  PU_OK(pe_graph_dump_dot(g, f));
  fclose(f);
  return buf;
}

START_TEST(dot_contains_every_node) {
  pe_program *p = gu_mlp_small();
  pe_pass_opts o = {.n_places = 2, .fuse = true};
  pe_ir ir = gu_compile(p, &o, GU_TRAIN ",data_parallel,ssa,fuse_allreduce,memory_plan");
  const pe_graph *g = ir.graph;
  char *text = dump_to_string(g);
  int edges = check_dot(g, text);
  /* At least one edge per distinct producer -> consumer pair. */
  int pairs = 0;
  for (int i = 0; i < g->n_nodes; i++) pairs += g->nodes[i].n_succ;
  ck_assert_int_ge(edges, pairs);
  ck_assert_ptr_nonnull(strstr(text, "style=dashed")); /* write-after-read edges */
  ck_assert_ptr_nonnull(strstr(text, "fused_all_reduce"));
  ck_assert_ptr_nonnull(strstr(text, "loss_grad_scale@p1"));
  free(text);
  /* The startup graph too, and a graph before ssa (nodes only). */
  text = dump_to_string(ir.startup);
  check_dot(ir.startup, text);
  ck_assert_ptr_nonnull(strstr(text, "broadcast("));
  free(text);
  pe_ir_destroy(&ir);
  ir = gu_compile(p, &o, "data_parallel");
  text = dump_to_string(ir.graph);
  ck_assert_int_eq(check_dot(ir.graph, text), 0);
  free(text);
  pe_ir_destroy(&ir);
  pe_program_free(p);
}
END_TEST

START_TEST(dump_pass_writes_file) {
  char path[] = "/tmp/pe_graph_dump_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  pe_program *p = gu_mlp_small();
  pe_pass_opts o = {.n_places = 4, .strategy = PE_STRATEGY_REDUCE, .dump_path = path};
  pe_ir ir = {.prog = p, .opts = &o};
  PU_OK(pe_graph_compile(&ir, false)); /* dumps because dump_path is set */
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  char *text = calloc(1 << 20, 1);
  size_t n = fread(text, 1, (1 << 20) - 1, f);
  fclose(f);
  ck_assert_uint_gt(n, 0);
  check_dot(ir.graph, text);
  ck_assert_ptr_nonnull(strstr(text, "reduce("));
  free(text);
  unlink(path);
  o.dump_path = "/nonexistent-dir/x.dot";
  pu_expect(pe_pass_run(&ir, "dump"), PE_EIO, "pass dump", "/nonexistent-dir/x.dot", NULL);
  pe_ir_destroy(&ir);
  pe_program_free(p);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("graph_dump");
  TCase *tc = tcase_create("dump");
  tcase_add_test(tc, dot_contains_every_node);
  tcase_add_test(tc, dump_pass_writes_file);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
