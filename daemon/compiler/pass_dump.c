/* The dump pass and the Graphviz writer (graph.h: pe_graph_dump_dot).
 *
 * Layout: one cluster per place holding its nodes; collectives (place -1)
 * sit outside the clusters, between them. Fill colour by node kind, shape by
 * stream (compute: box, comm: ellipse, copy: diamond), a double border for
 * nodes that touch persistable state. Data edges are labelled with the
 * variable and its version; control (dummy) edges are dashed. Before ssa
 * there are no vars, so only the nodes are written. Node ids are "n<id>". */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "compiler/graph.h"
#include "compiler/pass.h"

static const char *kind_color(pe_node_kind k) {
  switch (k) {
    case PE_NODE_OP: return "lightblue";
    case PE_NODE_ALL_REDUCE: return "salmon";
    case PE_NODE_FUSED_ALL_REDUCE: return "orangered";
    case PE_NODE_REDUCE: return "plum";
    case PE_NODE_BROADCAST: return "palegreen";
    case PE_NODE_LOSS_GRAD_SCALE: return "gold";
    case PE_NODE_SHARDED_UPDATE: return "darkseagreen";
    case PE_NODE_SPARSE_MERGE: return "khaki";
    default: return "white";
  }
}

static const char *stream_shape(pe_stream_kind s) {
  switch (s) {
    case PE_STREAM_COMM: return "ellipse";
    case PE_STREAM_H2D:
    case PE_STREAM_D2H: return "diamond";
    default: return "box";
  }
}

/* A double-quoted dot string: escape quotes and backslashes. */
static void put_quoted(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    if (*s == '\n') {
      fputs("\\n", f);
      continue;
    }
    fputc(*s, f);
  }
  fputc('"', f);
}

static void put_node(FILE *f, const pe_graph *g, int i, const char *indent) {
  const pe_graph_node *n = &g->nodes[i];
  char label[640];
  snprintf(label, sizeof label, "%s\n%s", n->name ? n->name : pe_node_kind_name(n->kind),
           pe_stream_kind_name(n->stream));
  fprintf(f, "%sn%d [label=", indent, i);
  put_quoted(f, label);
  fprintf(f, ", shape=%s, fillcolor=%s%s];\n", stream_shape(n->stream), kind_color(n->kind),
          (n->reads_persistable || n->writes_persistable) ? ", peripheries=2" : "");
}

pe_status *pe_graph_dump_dot(const pe_graph *g, FILE *f) {
  if (!g || !f) return pe_error(PE_EINVAL, "dump: no graph or file");
  fprintf(f, "digraph pe_graph {\n  rankdir=TB;\n  node [style=filled, fontsize=10];\n");
  fprintf(f, "  label=");
  char title[160];
  snprintf(title, sizeof title, "%s graph: %d places, %s, %d nodes%s",
           g->startup ? "startup" : "main", g->n_places, pe_strategy_name(g->strategy), g->n_nodes,
           g->ssa ? "" : " (no ssa)");
  put_quoted(f, title);
  fprintf(f, ";\n");
  for (int p = 0; p < g->n_places; p++) {
    char pl[32];
    fprintf(f, "  subgraph cluster_p%d {\n    label=", p);
    put_quoted(f, pe_place_str(g->places[p], pl, sizeof pl));
    fprintf(f, ";\n");
    for (int i = 0; i < g->n_nodes; i++)
      if (g->nodes[i].place == p) put_node(f, g, i, "    ");
    fprintf(f, "  }\n");
  }
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].place < 0 || g->nodes[i].place >= g->n_places) put_node(f, g, i, "  ");
  for (int i = 0; g->ssa && i < g->n_nodes; i++) {
    const pe_graph_node *n = &g->nodes[i];
    for (int k = 0; k < n->n_out; k++) {
      const pe_graph_var *v = &g->vars[n->out[k]];
      for (int j = 0; j < v->n_consumers; j++) {
        fprintf(f, "  n%d -> n%d", i, v->consumers[j]);
        if (v->dummy) {
          fprintf(f, " [style=dashed, color=gray];\n");
          continue;
        }
        char label[600];
        snprintf(label, sizeof label, "%s#%d", g->lvars[v->lvar].name, v->version);
        fprintf(f, " [label=");
        put_quoted(f, label);
        fprintf(f, ", fontsize=8];\n");
      }
    }
  }
  fprintf(f, "}\n");
  if (ferror(f)) return pe_error(PE_EIO, "dump: write failed");
  return NULL;
}

pe_status *pe_pass_dump(pe_ir *ir) {
  if (!ir->graph) return pe_error(PE_EINVAL, "dump: no graph (run data_parallel first)");
  const char *path = ir->opts ? ir->opts->dump_path : NULL;
  if (!path) return pe_graph_dump_dot(ir->graph, stderr);
  FILE *f = fopen(path, "w");
  if (!f) return pe_error(PE_EIO, "dump: cannot open '%s': %s", path, strerror(errno));
  pe_status *st = pe_graph_dump_dot(ir->graph, f);
  if (fclose(f) != 0 && !st)
    st = pe_error(PE_EIO, "dump: cannot write '%s': %s", path, strerror(errno));
  return st;
}
