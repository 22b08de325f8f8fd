/* The graph IR (graph.h): construction, editing and the size helpers. The
 * passes that fill it live in pass_<name>.c; SSA derivation in pass_ssa.c.
 *
 * Ownership: every array hanging off the graph is malloc'd and released by
 * pe_graph_free; names point into the graph's own program clone or into
 * g->strings. */
#include "compiler/graph.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/validate.h"
#include "ops/registry.h"

#define OOM() pe_error(PE_ENOMEM, "graph: out of memory")

static const char *const kind_names[PE_NODE_KIND_COUNT] = {
    "op", "all_reduce", "fused_all_reduce", "reduce", "broadcast", "loss_grad_scale",
    "sharded_update", "sparse_merge",
};

const char *pe_node_kind_name(pe_node_kind k) {
  return (unsigned)k < PE_NODE_KIND_COUNT ? kind_names[k] : "?";
}

const char *pe_strategy_name(pe_graph_strategy s) {
  return s == PE_STRATEGY_REDUCE    ? "reduce"
         : s == PE_STRATEGY_SHARDED ? "sharded"
                                    : "allreduce";
}

pe_graph_strategy pe_strategy_auto(pe_place_kind kind, const pe_program *p) {
  if (p && p->opt.grad_clip_norm > 0.0f) return PE_STRATEGY_ALLREDUCE;
  return kind == PE_PLACE_CUDA ? PE_STRATEGY_ALLREDUCE : PE_STRATEGY_SHARDED;
}

/* Grow *arr (elements of `size` bytes) so that it holds at least `need`. */
static bool grow(void **arr, int *cap, int need, size_t size) {
  if (need <= *cap) return true;
  int nc = *cap ? *cap : 8;
  while (nc < need) nc *= 2;
  void *p = realloc(*arr, (size_t)nc * size);
  if (!p) return false;
  memset((char *)p + (size_t)*cap * size, 0, (size_t)(nc - *cap) * size);
  *arr = p;
  *cap = nc;
  return true;
}

/* Append v to a malloc'd int list of length *n (no capacity: lists are
 * short and built once at compile time). */
static bool push_int(int **list, int *n, int v) {
  int *p = realloc(*list, (size_t)(*n + 1) * sizeof(int));
  if (!p) return false;
  p[(*n)++] = v;
  *list = p;
  return true;
}

pe_status *pe_graph_new(const pe_program *p, int block, pe_place_kind kind, int n_places,
                        pe_graph **out) {
  *out = NULL;
  if (n_places < 1 || n_places > PE_MAX_PLACES)
    return pe_error(PE_EINVAL, "graph: %d places (1..%d)", n_places, PE_MAX_PLACES);
  if (block < 0 || block >= p->n_blocks)
    return pe_error(PE_EINVAL, "graph: block %d out of range (0..%d)", block, p->n_blocks - 1);
  pe_graph *g = calloc(1, sizeof(*g));
  if (!g) return OOM();
  pe_strmap_init(&g->lvar_index);
  g->block = block;
  g->place_kind = kind;
  g->n_places = n_places;
  g->places = calloc((size_t)n_places, sizeof(*g->places));
  pe_status *st = g->places ? pe_program_clone(p, &g->prog) : OOM();
  if (st) {
    pe_graph_free(g);
    return st;
  }
  for (int i = 0; i < n_places; i++) g->places[i] = (pe_place){kind, i};
  *out = g;
  return NULL;
}

static void node_release(pe_graph_node *n) {
  free(n->name);
  free(n->in);
  free(n->out);
  free(n->in_slot);
  free(n->out_slot);
  free(n->in_lv);
  free(n->out_lv);
  free(n->after);
  free(n->succ);
}

void pe_graph_clear_ssa(pe_graph *g) {
  for (int i = 0; i < g->n_vars; i++) free(g->vars[i].consumers);
  g->n_vars = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    pe_graph_node *n = &g->nodes[i];
    free(n->in);
    free(n->out);
    free(n->succ);
    n->in = n->out = n->succ = NULL;
    n->n_in = n->n_out = n->n_succ = n->in_degree = n->n_in_data = n->n_out_data = 0;
  }
  for (int i = 0; i < g->n_lvars; i++) {
    free(g->lvars[i].versions);
    g->lvars[i].versions = NULL;
    g->lvars[i].n_versions = 0;
  }
  g->ssa = false;
}

static void bucket_release(pe_graph_bucket *b) {
  free(b->grads);
  free(b->offsets);
  free(b->lvars);
}

void pe_graph_free(pe_graph *g) {
  if (!g) return;
  pe_graph_clear_ssa(g);
  for (int i = 0; i < g->n_nodes; i++) node_release(&g->nodes[i]);
  free(g->nodes);
  free(g->lvars);
  free(g->vars);
  for (int i = 0; i < g->n_buffers; i++) free(g->buffers[i].lvars);
  free(g->buffers);
  for (int i = 0; i < g->n_buckets; i++) bucket_release(&g->buckets[i]);
  free(g->buckets);
  free(g->params);
  free(g->grads);
  free(g->owner);
  for (int i = 0; i < g->n_strings; i++) free(g->strings[i]);
  free(g->strings);
  free(g->places);
  pe_strmap_destroy(&g->lvar_index);
  pe_program_free(g->prog);
  free(g);
}

const char *pe_graph_strdup(pe_graph *g, const char *s) {
  char **ns = realloc(g->strings, (size_t)(g->n_strings + 1) * sizeof(*ns));
  if (!ns) return NULL;
  g->strings = ns;
  char *c = strdup(s);
  if (!c) return NULL;
  g->strings[g->n_strings++] = c;
  return c;
}

/* --- sizes ---------------------------------------------------------------- */

/* bytes / per_sample of a declared shape (see pe_graph_lvar). */
static void shape_bytes(const pe_var_desc *d, int64_t *bytes, bool *per_sample) {
  *bytes = -1;
  *per_sample = false;
  if (!d || d->shape.ndim == 0) return;
  int64_t n = (int64_t)pe_dtype_size(d->dtype);
  if (n <= 0) return;
  for (int i = 0; i < d->shape.ndim; i++) {
    int64_t e = d->shape.d[i];
    if (e < 0) {
      if (i != 0) return; /* only the batch dim may be unknown */
      *per_sample = true;
      continue;
    }
    n *= e;
  }
  *bytes = n;
}

int64_t pe_graph_buffer_bytes(const pe_graph *g, int b, int64_t batch) {
  const pe_graph_buffer *bf = &g->buffers[b];
  int64_t s = bf->sample_bytes * batch;
  return s > bf->fixed_bytes ? s : bf->fixed_bytes;
}

static int64_t lvar_bytes(const pe_graph_lvar *l, int64_t batch) {
  if (l->bytes < 0) return 0;
  return l->per_sample ? l->bytes * batch : l->bytes;
}

void pe_graph_memory_bytes(const pe_graph *g, int64_t batch, int64_t *planned, int64_t *unplanned) {
  int64_t pl = 0, un = 0;
  for (int i = 0; i < g->n_lvars; i++)
    if (!g->lvars[i].persistable) un += lvar_bytes(&g->lvars[i], batch);
  for (int b = 0; b < g->n_buffers; b++)
    if (!g->buffers[b].persistable && g->buffers[b].n_lvars > 0)
      pl += pe_graph_buffer_bytes(g, b, batch);
  if (planned) *planned = pl;
  if (unplanned) *unplanned = un;
}

int64_t pe_graph_run_bytes(const pe_graph *g, int64_t batch) {
  int n = g->n_places > 0 ? g->n_places : 1;
  int64_t total = 0;
  for (int b = 0; b < g->n_buffers; b++) {
    const pe_graph_buffer *bf = &g->buffers[b];
    if (bf->persistable || bf->n_lvars == 0) continue;
    int64_t rows = batch / n + (bf->place >= 0 && bf->place < batch % n ? 1 : 0);
    int64_t s = bf->sample_bytes;
    if (s > 0 && rows > INT64_MAX / s) return INT64_MAX;
    s *= rows;
    s = s > bf->fixed_bytes ? s : bf->fixed_bytes;
    if (s > INT64_MAX - total) return INT64_MAX;
    total += s;
  }
  return total;
}

/* --- lvars and buffers ------------------------------------------------------ */

static void index_key(char *buf, size_t len, const char *name, int place) {
  snprintf(buf, len, "%d:%s", place, name);
}

int pe_graph_lvar_find(const pe_graph *g, const char *name, int place) {
  char key[600];
  index_key(key, sizeof key, name, place);
  intptr_t v = (intptr_t)pe_strmap_get(&g->lvar_index, key);
  return v ? (int)v - 1 : -1;
}

pe_status *pe_graph_add_buffer(pe_graph *g, int lvar, int *out) {
  if (!grow((void **)&g->buffers, &g->cap_buffers, g->n_buffers + 1, sizeof(*g->buffers)))
    return OOM();
  int b = g->n_buffers++;
  pe_graph_buffer *bf = &g->buffers[b];
  memset(bf, 0, sizeof(*bf));
  if (lvar >= 0) {
    const pe_graph_lvar *l = &g->lvars[lvar];
    bf->place = l->place;
    bf->dtype = l->desc ? l->desc->dtype : PE_F32;
    bf->persistable = l->persistable;
    if (l->bytes >= 0) *(l->per_sample ? &bf->sample_bytes : &bf->fixed_bytes) = l->bytes;
    if (!push_int(&bf->lvars, &bf->n_lvars, lvar)) return OOM();
  }
  *out = b;
  return NULL;
}

pe_status *pe_graph_lvar_get(pe_graph *g, const char *name, int place, int *out) {
  int id = pe_graph_lvar_find(g, name, place);
  if (id >= 0) {
    *out = id;
    return NULL;
  }
  const pe_block *b = g->prog->blocks[g->block];
  const pe_var_desc *d = pe_program_resolve_var(g->prog, b, name, NULL);
  if (!grow((void **)&g->lvars, &g->cap_lvars, g->n_lvars + 1, sizeof(*g->lvars))) return OOM();
  id = g->n_lvars++;
  pe_graph_lvar *l = &g->lvars[id];
  memset(l, 0, sizeof(*l));
  l->name = d ? d->name : pe_graph_strdup(g, name);
  if (!l->name) return OOM();
  l->place = place;
  l->desc = d;
  l->persistable = d && d->persistable;
  l->feed = d && d->is_feed;
  l->bucket = -1;
  shape_bytes(d, &l->bytes, &l->per_sample);
  char key[600];
  index_key(key, sizeof key, name, place);
  if (!pe_strmap_put(&g->lvar_index, key, (void *)(intptr_t)(id + 1))) return OOM();
  PE_TRY(pe_graph_add_buffer(g, id, &l->buffer));
  *out = id;
  return NULL;
}

/* --- nodes -------------------------------------------------------------------- */

static void node_init(pe_graph_node *n, pe_node_kind kind, int place) {
  memset(n, 0, sizeof(*n));
  n->kind = kind;
  n->place = place;
  n->root = -1;
  n->src_op = -1;
  n->bucket = -1;
  n->stream =
      (kind == PE_NODE_OP || kind == PE_NODE_LOSS_GRAD_SCALE) ? PE_STREAM_COMPUTE : PE_STREAM_COMM;
}

pe_status *pe_graph_insert_node(pe_graph *g, int at, pe_node_kind kind, int place, int *out) {
  if (at < 0 || at > g->n_nodes)
    return pe_error(PE_EINVAL, "graph: insert at %d of %d nodes", at, g->n_nodes);
  if (!grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof(*g->nodes))) return OOM();
  memmove(&g->nodes[at + 1], &g->nodes[at], (size_t)(g->n_nodes - at) * sizeof(*g->nodes));
  g->n_nodes++;
  node_init(&g->nodes[at], kind, place);
  /* Node ids shifted: fix the references that are not derived by ssa (an
   * append shifts none: skip the scan, or building a graph is quadratic). */
  for (int i = 0; at < g->n_nodes - 1 && i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_after; k++)
      if (g->nodes[i].after[k] >= at) g->nodes[i].after[k]++;
  for (int b = 0; b < g->n_buckets; b++)
    if (g->buckets[b].node >= at) g->buckets[b].node++;
  if (g->ssa) pe_graph_clear_ssa(g);
  *out = at;
  return NULL;
}

pe_status *pe_graph_add_node(pe_graph *g, pe_node_kind kind, int place, int *out) {
  return pe_graph_insert_node(g, g->n_nodes, kind, place, out);
}

void pe_graph_remove_node(pe_graph *g, int id) {
  if (id < 0 || id >= g->n_nodes) return;
  node_release(&g->nodes[id]);
  memmove(&g->nodes[id], &g->nodes[id + 1], (size_t)(g->n_nodes - id - 1) * sizeof(*g->nodes));
  g->n_nodes--;
  for (int i = 0; i < g->n_nodes; i++) {
    pe_graph_node *n = &g->nodes[i];
    int w = 0;
    for (int k = 0; k < n->n_after; k++) {
      int a = n->after[k];
      if (a == id) continue; /* the edge goes with the node */
      n->after[w++] = a > id ? a - 1 : a;
    }
    n->n_after = w;
  }
  for (int b = 0; b < g->n_buckets; b++)
    if (g->buckets[b].node > id) g->buckets[b].node--;
  if (g->ssa) pe_graph_clear_ssa(g);
}

pe_status *pe_graph_node_add_in(pe_graph *g, int node, int lvar) {
  pe_graph_node *n = &g->nodes[node];
  if (!push_int(&n->in_lv, &n->n_in_lv, lvar)) return OOM();
  if (g->lvars[lvar].persistable) n->reads_persistable = true;
  return NULL;
}

pe_status *pe_graph_node_add_out(pe_graph *g, int node, int lvar) {
  pe_graph_node *n = &g->nodes[node];
  if (!push_int(&n->out_lv, &n->n_out_lv, lvar)) return OOM();
  if (g->lvars[lvar].persistable) n->writes_persistable = true;
  return NULL;
}

bool pe_graph_node_updates_persistable(const pe_graph *g, int node) {
  const pe_graph_node *n = &g->nodes[node];
  if (!n->writes_persistable) return false;
  /* Only a plain op node has one place's slots laid out by out_slot. */
  if (n->kind != PE_NODE_OP || !n->def || !n->desc || !n->out_slot) return true;
  for (int s = 0; s < n->def->n_outputs; s++) {
    if (pe_op_output_unchanged(n->def, n->desc, s)) continue;
    for (int k = n->out_slot[s]; k < n->out_slot[s + 1]; k++)
      if (g->lvars[n->out_lv[k]].persistable) return true;
  }
  return false;
}

pe_status *pe_graph_node_add_after(pe_graph *g, int node, int before) {
  if (node < 0 || node >= g->n_nodes || before < 0 || before >= g->n_nodes || node == before)
    return pe_error(PE_EINVAL, "graph: bad control edge %d -> %d (%d nodes)", before, node,
                    g->n_nodes);
  pe_graph_node *n = &g->nodes[node];
  for (int k = 0; k < n->n_after; k++)
    if (n->after[k] == before) return NULL;
  if (!push_int(&n->after, &n->n_after, before)) return OOM();
  return NULL;
}

pe_status *pe_graph_set_name(pe_graph *g, int node, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  char *s = strdup(buf);
  if (!s) return OOM();
  free(g->nodes[node].name);
  g->nodes[node].name = s;
  return NULL;
}

/* --- order -------------------------------------------------------------------- */

pe_status *pe_graph_topo_order(const pe_graph *g, int *order) {
  if (!g->ssa) return pe_error(PE_EINVAL, "graph: no dependencies yet (run ssa)");
  int n = g->n_nodes;
  int *deg = malloc((size_t)(n ? n : 1) * sizeof(int));
  int *queue = malloc((size_t)(n ? n : 1) * sizeof(int));
  if (!deg || !queue) {
    free(deg);
    free(queue);
    return OOM();
  }
  int head = 0, tail = 0;
  for (int i = 0; i < n; i++) {
    deg[i] = g->nodes[i].in_degree;
    if (deg[i] == 0) queue[tail++] = i;
  }
  while (head < tail) {
    const pe_graph_node *x = &g->nodes[queue[head++]];
    for (int k = 0; k < x->n_succ; k++)
      if (--deg[x->succ[k]] == 0) queue[tail++] = x->succ[k];
  }
  pe_status *st = NULL;
  if (tail < n) {
    /* Name one node left on (or behind) a cycle. */
    int bad = 0;
    for (int i = 0; i < n; i++)
      if (deg[i] > 0) {
        bad = i;
        break;
      }
    st = pe_error(PE_ECYCLE,
                  "graph: dependency cycle: %d of %d nodes never become ready, e.g. "
                  "node %d (%s)",
                  n - tail, n, bad, g->nodes[bad].name ? g->nodes[bad].name : "?");
  } else if (order) {
    memcpy(order, queue, (size_t)n * sizeof(int));
  }
  free(deg);
  free(queue);
  return st;
}
