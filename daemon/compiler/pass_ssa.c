/* The ssa pass: derive the versioned graph from the nodes' lvar lists.
 *
 * Nodes are visited in array order, which every pass keeps a valid
 * sequential order. Per lvar the pass tracks its current version:
 *  - a read before any write creates version 0 (the value at graph entry:
 *    feeds, persistables) with no producer;
 *  - a write creates the next version, produced by the writer.
 * Hazards become control dependencies through dummy vars. Every node has at
 * most one dummy output, its "control var", created on first need and shared
 * by all the nodes that must wait for it:
 *  - write-after-read: a writer of an lvar waits for every reader of the
 *    version it replaces (all versions share one buffer, so a reader must be
 *    done before the buffer is overwritten);
 *  - write-after-write: a writer whose previous version nobody read waits for
 *    the previous writer (readers already order it otherwise);
 *  - explicit `after` edges of a node;
 *  - a node with no output gets its control var anyway, so that every node
 *    produces something (and so has a version its successors wait on).
 * Then each node's static in-degree (distinct producer nodes over all its
 * inputs) and deduplicated successor list are computed, and Kahn's algorithm
 * rejects a cycle (only `after` edges can make one: data and hazard edges
 * always point forward in array order). */
#include <stdlib.h>
#include <string.h>

#include "compiler/graph.h"
#include "compiler/pass.h"

#define OOM() pe_error(PE_ENOMEM, "ssa: out of memory")

typedef struct ssa_ctx {
  pe_graph *g;
  int *cur;  /* [n_lvars] current version var, -1 */
  int *ctrl; /* [n_nodes] control var, -1 */
  int at;    /* node being visited */
} ssa_ctx;

static bool push_int(int **list, int *n, int v) {
  int *p = realloc(*list, (size_t)(*n + 1) * sizeof(int));
  if (!p) return false;
  p[(*n)++] = v;
  *list = p;
  return true;
}

static pe_status *new_var(pe_graph *g, int lvar, int place, int version, int producer, int *out) {
  if (g->n_vars == g->cap_vars) {
    int nc = g->cap_vars ? 2 * g->cap_vars : 64;
    pe_graph_var *v = realloc(g->vars, (size_t)nc * sizeof(*v));
    if (!v) return OOM();
    g->vars = v;
    g->cap_vars = nc;
  }
  int id = g->n_vars++;
  pe_graph_var *v = &g->vars[id];
  memset(v, 0, sizeof(*v));
  v->lvar = lvar;
  v->place = place;
  v->version = version;
  v->producer = producer;
  v->dummy = lvar < 0;
  v->buffer = -1;
  if (lvar >= 0) {
    pe_graph_lvar *l = &g->lvars[lvar];
    v->persistable = l->persistable;
    v->buffer = l->buffer;
    if (!push_int(&l->versions, &l->n_versions, id)) return OOM();
  }
  *out = id;
  return NULL;
}

/* Consumers are appended in node order, so a repeat is always the last. */
static pe_status *add_consumer(pe_graph *g, int var, int node) {
  pe_graph_var *v = &g->vars[var];
  if (v->n_consumers && v->consumers[v->n_consumers - 1] == node) return NULL;
  if (!push_int(&v->consumers, &v->n_consumers, node)) return OOM();
  return NULL;
}

static pe_status *ctrl_var(ssa_ctx *c, int node, int *out) {
  if (c->ctrl[node] < 0) {
    pe_graph *g = c->g;
    int place = g->nodes[node].place;
    PE_TRY(new_var(g, -1, place, 0, node, &c->ctrl[node]));
    /* A node not visited yet (an `after` edge pointing forward: a cycle in
     * the making) gets it appended after its data outputs by visit(). */
    pe_graph_node *n = &g->nodes[node];
    if (node < c->at && !push_int(&n->out, &n->n_out, c->ctrl[node])) return OOM();
  }
  *out = c->ctrl[node];
  return NULL;
}

/* Make `node` wait for `before` (skipped when an input already does). */
static pe_status *dummy_edge(ssa_ctx *c, int before, int node) {
  pe_graph *g = c->g;
  if (before == node) return NULL;
  pe_graph_node *n = &g->nodes[node];
  for (int k = 0; k < n->n_in; k++)
    if (g->vars[n->in[k]].producer == before) return NULL;
  int d;
  PE_TRY(ctrl_var(c, before, &d));
  n = &g->nodes[node];
  if (!push_int(&n->in, &n->n_in, d)) return OOM();
  return add_consumer(g, d, node);
}

static pe_status *visit(ssa_ctx *c, int id) {
  pe_graph *g = c->g;
  pe_graph_node *n = &g->nodes[id];
  for (int k = 0; k < n->n_in_lv; k++) {
    int l = n->in_lv[k];
    if (c->cur[l] < 0) PE_TRY(new_var(g, l, g->lvars[l].place, 0, -1, &c->cur[l]));
    n = &g->nodes[id];
    if (!push_int(&n->in, &n->n_in, c->cur[l])) return OOM();
    PE_TRY(add_consumer(g, c->cur[l], id));
  }
  n->n_in_data = n->n_in;
  for (int k = 0; k < n->n_after; k++) PE_TRY(dummy_edge(c, n->after[k], id));
  for (int k = 0; k < g->nodes[id].n_out_lv; k++) {
    int l = g->nodes[id].out_lv[k];
    int pv = c->cur[l], version = 1;
    if (pv >= 0) {
      /* Copy the consumer list out: dummy_edge may grow g->vars. */
      version = g->vars[pv].version + 1;
      int nc = g->vars[pv].n_consumers, producer = g->vars[pv].producer;
      bool read_by_self = false, read_by_other = false;
      for (int j = 0; j < nc; j++) {
        int r = g->vars[pv].consumers[j];
        if (r == id)
          read_by_self = true;
        else {
          read_by_other = true;
          PE_TRY(dummy_edge(c, r, id));
        }
      }
      if (producer >= 0 && producer != id && !read_by_self && !read_by_other)
        PE_TRY(dummy_edge(c, producer, id));
    }
    int v;
    PE_TRY(new_var(g, l, g->lvars[l].place, version, id, &v));
    n = &g->nodes[id];
    if (!push_int(&n->out, &n->n_out, v)) return OOM();
    c->cur[l] = v;
  }
  n = &g->nodes[id];
  n->n_out_data = n->n_out;
  if (c->ctrl[id] >= 0) { /* created early, see ctrl_var */
    if (!push_int(&n->out, &n->n_out, c->ctrl[id])) return OOM();
  } else if (n->n_out == 0) {
    c->at = id + 1; /* visited: ctrl_var appends directly */
    int d;
    PE_TRY(ctrl_var(c, id, &d));
  }
  return NULL;
}

/* Distinct producers and consumers per node, with a stamp array. */
static pe_status *link(pe_graph *g) {
  int *stamp = malloc((size_t)(g->n_nodes ? g->n_nodes : 1) * sizeof(int));
  if (!stamp) return OOM();
  for (int i = 0; i < g->n_nodes; i++) stamp[i] = -1;
  for (int i = 0; i < g->n_nodes; i++) {
    pe_graph_node *n = &g->nodes[i];
    n->in_degree = 0;
    for (int k = 0; k < n->n_in; k++) {
      int p = g->vars[n->in[k]].producer;
      if (p < 0 || p == i || stamp[p] == 2 * i) continue;
      stamp[p] = 2 * i;
      n->in_degree++;
    }
    for (int k = 0; k < n->n_out; k++) {
      const pe_graph_var *v = &g->vars[n->out[k]];
      for (int j = 0; j < v->n_consumers; j++) {
        int s = v->consumers[j];
        if (s == i || stamp[s] == 2 * i + 1) continue;
        stamp[s] = 2 * i + 1;
        if (!push_int(&n->succ, &n->n_succ, s)) {
          free(stamp);
          return OOM();
        }
      }
    }
  }
  free(stamp);
  return NULL;
}

pe_status *pe_graph_build_ssa(pe_graph *g) {
  pe_graph_clear_ssa(g);
  ssa_ctx c = {g, malloc((size_t)(g->n_lvars ? g->n_lvars : 1) * sizeof(int)),
               malloc((size_t)(g->n_nodes ? g->n_nodes : 1) * sizeof(int)), 0};
  pe_status *st = (!c.cur || !c.ctrl) ? OOM() : NULL;
  for (int i = 0; !st && i < g->n_lvars; i++) c.cur[i] = -1;
  for (int i = 0; !st && i < g->n_nodes; i++) c.ctrl[i] = -1;
  for (int i = 0; !st && i < g->n_nodes; i++) {
    c.at = i;
    st = visit(&c, i);
  }
  free(c.cur);
  free(c.ctrl);
  if (!st) st = link(g);
  if (!st) {
    g->ssa = true;
    st = pe_graph_topo_order(g, NULL);
  }
  if (st) pe_graph_clear_ssa(g);
  return st;
}

pe_status *pe_pass_ssa(pe_ir *ir) {
  if (!ir->graph) return pe_error(PE_EINVAL, "ssa: no graph (run data_parallel first)");
  PE_TRY(pe_graph_build_ssa(ir->graph));
  pe_status *st = ir->startup ? pe_graph_build_ssa(ir->startup) : NULL;
  return st ? pe_status_wrap(st, "startup graph") : NULL;
}
