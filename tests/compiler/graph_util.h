/* Helpers for the graph pass tests (header-only): small programs built with
 * the client builder or the IR API, compiling them into a pe_ir, and graph
 * queries computed independently of the passes (reachability from the vars'
 * producer/consumer lists, not from the nodes' successor lists). */
#ifndef PE_TESTS_GRAPH_UTIL_H
#define PE_TESTS_GRAPH_UTIL_H

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/graph.h"
#include "compiler/pass.h"
#include "ops/registry.h"
#include "builder_util.h"
#include "pe_builder.h"
#include "prog_util.h"

/* An MLP: x f32 [-1,in] -> fc(h, relu) for each hidden size -> fc(classes)
 * -> softmax_with_cross_entropy(label i64 [-1,1]) -> mean; trained with
 * `opt`: "sgd", "momentum" or "adam" ("none": gradients only, no
 * optimizer). Decoded, not compiled. */
static inline pe_program *gu_mlp(int64_t in, int n_hidden, const int64_t *hidden, int64_t classes,
                                 const char *opt) {
  pe_builder *b = pe_builder_new();
  ck_assert_ptr_nonnull(b);
  const char *x = pe_builder_data(b, "x", PE_B_F32, PE_B_SHAPE(-1, in));
  const char *label = pe_builder_data(b, "label", PE_B_I64, PE_B_SHAPE(-1, 1));
  for (int i = 0; i < n_hidden; i++) {
    pe_b_fc_opts o = {.act = PE_B_ACT_RELU};
    x = pe_builder_fc(b, x, hidden[i], &o);
  }
  const char *logits = pe_builder_fc(b, x, classes, NULL);
  const char *ce = pe_builder_softmax_with_cross_entropy(b, logits, label, NULL);
  const char *loss = pe_builder_mean(b, ce);
  pe_builder_append_backward(b, loss);
  if (!strcmp(opt, "adam"))
    pe_builder_adam(b, 0.01f, 0.9f, 0.999f, 1e-8f);
  else if (!strcmp(opt, "momentum"))
    pe_builder_momentum(b, 0.1f, 0.9f, false);
  else if (!strcmp(opt, "sgd"))
    pe_builder_sgd(b, 0.1f);
  return tb_finish(b);
}

/* The 2-hidden-layer MLP used by most tests: 6 parameters. */
static inline pe_program *gu_mlp_small(void) {
  static const int64_t hidden[] = {16, 8};
  return gu_mlp(12, 2, hidden, 4, "sgd");
}

#define GU_TRAIN "validate,backward,optimizer,validate"

/* Run `list` on p with opts o; the ir owns the graphs afterwards. */
static inline pe_ir gu_compile(pe_program *p, const pe_pass_opts *o, const char *list) {
  pe_ir ir = {.prog = p, .opts = o};
  PU_OK(pe_passes_run(&ir, list));
  return ir;
}

static inline int gu_count(const pe_graph *g, pe_node_kind k) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].kind == k;
  return n;
}

/* Op nodes of `type` (optionally on `place`, -2 for any). */
static inline int gu_count_op(const pe_graph *g, const char *type, int place) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const pe_graph_node *x = &g->nodes[i];
    n += x->kind == PE_NODE_OP && strcmp(x->desc->type, type) == 0 &&
         (place == -2 || x->place == place);
  }
  return n;
}

static inline int gu_lvar(const pe_graph *g, const char *name, int place) {
  int lv = pe_graph_lvar_find(g, name, place);
  ck_assert_msg(lv >= 0, "no lvar %s on place %d", name, place);
  return lv;
}

/* Last node before `before` (array order) that writes lvar lv. */
static inline int gu_last_writer(const pe_graph *g, int lv, int before) {
  int w = -1;
  for (int i = 0; i < before; i++)
    for (int k = 0; k < g->nodes[i].n_out_lv; k++)
      if (g->nodes[i].out_lv[k] == lv) w = i;
  return w;
}

/* Reachability matrix r[a * n + b]: a path a -> ... -> b of length >= 1,
 * from the vars' producer -> consumer edges. Caller frees. */
static inline unsigned char *gu_reach(const pe_graph *g) {
  int n = g->n_nodes;
  unsigned char *adj = calloc((size_t)n * (size_t)n + 1, 1);
  unsigned char *r = calloc((size_t)n * (size_t)n + 1, 1);
  int *stack = malloc((size_t)(n + 1) * sizeof(int));
  ck_assert(adj && r && stack);
  for (int v = 0; v < g->n_vars; v++) {
    const pe_graph_var *x = &g->vars[v];
    if (x->producer < 0) continue;
    for (int k = 0; k < x->n_consumers; k++)
      if (x->consumers[k] != x->producer) adj[(size_t)x->producer * n + x->consumers[k]] = 1;
  }
  for (int a = 0; a < n; a++) { /* DFS from a */
    int top = 0;
    stack[top++] = a;
    while (top) {
      int u = stack[--top];
      for (int b = 0; b < n; b++)
        if (adj[(size_t)u * n + b] && !r[(size_t)a * n + b]) {
          r[(size_t)a * n + b] = 1;
          stack[top++] = b;
        }
    }
  }
  free(adj);
  free(stack);
  return r;
}

/* Nodes touching lvar lv (writers and readers of all its versions). */
static inline int gu_accesses(const pe_graph *g, int lv, int *out, int cap) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const pe_graph_node *x = &g->nodes[i];
    bool t = false;
    for (int k = 0; k < x->n_in_lv; k++) t |= x->in_lv[k] == lv;
    for (int k = 0; k < x->n_out_lv; k++) t |= x->out_lv[k] == lv;
    if (t) {
      ck_assert_int_lt(n, cap);
      out[n++] = i;
    }
  }
  return n;
}

#endif
