/* The fuse_allreduce pass: group per-gradient all_reduce nodes into buckets
 * of at most fuse_bucket_bytes, one fused_all_reduce per bucket, so that a
 * few large collectives replace many small latency-bound ones.
 *
 * Buckets follow the order in which gradients become final (the order of
 * the all_reduce nodes), so the first bucket can start while the rest of
 * backward runs. A bucket is closed when the next gradient would push it
 * past the limit, has another dtype, or would delay a member past a node
 * that reads or writes it (the fused node takes the place of the bucket's
 * last all_reduce, and every member must be reduced before its next use).
 * A single gradient larger than the limit gets a bucket of its own.
 * Gradients of unknown or batch-dependent size are left unfused.
 *
 * Storage: every member lives in the bucket buffer at a 64-byte aligned
 * offset (graph.h, pe_graph_bucket), so no copy is needed.
 *
 * Only the AllReduce strategy's all_reduce nodes are fused; reduce nodes
 * (Reduce strategy) stay per gradient. With opts->fuse off the pass does
 * nothing. The pass may run before or after ssa; after, it rebuilds SSA. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/graph.h"
#include "compiler/pass.h"

#define OOM() pe_error(PE_ENOMEM, "fuse_allreduce: out of memory")
#define ALIGN 64

static int64_t align_up(int64_t n) {
  return (n + ALIGN - 1) / ALIGN * ALIGN;
}

typedef struct member {
  int node;       /* its all_reduce node (old id) */
  int next_touch; /* first later node that reads or writes the gradient */
  int64_t bytes;
  pe_dtype dtype;
  int bucket;
} member;

/* First node after `at` touching any lvar of the all_reduce at `at`. */
static int next_touch(const pe_graph *g, int at, char *mark) {
  const pe_graph_node *a = &g->nodes[at];
  for (int k = 0; k < a->n_in_lv; k++) mark[a->in_lv[k]] = 1;
  int found = g->n_nodes;
  for (int i = at + 1; i < g->n_nodes && found == g->n_nodes; i++) {
    const pe_graph_node *n = &g->nodes[i];
    for (int k = 0; k < n->n_in_lv && found == g->n_nodes; k++)
      if (mark[n->in_lv[k]]) found = i;
    for (int k = 0; k < n->n_out_lv && found == g->n_nodes; k++)
      if (mark[n->out_lv[k]]) found = i;
  }
  for (int k = 0; k < a->n_in_lv; k++) mark[a->in_lv[k]] = 0;
  return found;
}

static pe_status *collect(pe_graph *g, member **out, int *n_out) {
  member *m = calloc((size_t)(g->n_nodes ? g->n_nodes : 1), sizeof(*m));
  char *mark = calloc((size_t)(g->n_lvars ? g->n_lvars : 1), 1);
  if (!m || !mark) {
    free(m);
    free(mark);
    return OOM();
  }
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const pe_graph_node *x = &g->nodes[i];
    if (x->kind != PE_NODE_ALL_REDUCE || x->n_in_lv != g->n_places) continue;
    const pe_graph_lvar *l = &g->lvars[x->in_lv[0]];
    if (l->bytes < 0 || l->per_sample || !l->desc) continue;
    m[n++] = (member){i, next_touch(g, i, mark), l->bytes, l->desc->dtype, -1};
  }
  free(mark);
  *out = m;
  *n_out = n;
  return NULL;
}

/* Greedy bucketing in production order; returns the bucket count. */
static int bucketize(member *m, int n, int64_t limit) {
  int nb = 0, first = 0;
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    int64_t sz = align_up(m[i].bytes);
    bool close = i > first && (total + sz > limit || m[i].dtype != m[first].dtype);
    for (int k = first; !close && k < i; k++)
      if (m[k].next_touch <= m[i].node) close = true;
    if (i == 0 || close) {
      nb++;
      first = i;
      total = 0;
    }
    m[i].bucket = nb - 1;
    total += sz;
  }
  return nb;
}

static pe_status *make_buckets(pe_graph *g, const member *m, int n, int nb) {
  g->buckets = calloc((size_t)nb, sizeof(*g->buckets));
  int *count = calloc((size_t)nb, sizeof(int)); /* final gradient count */
  if (!g->buckets || !count) {
    free(count);
    return OOM();
  }
  g->n_buckets = nb;
  for (int i = 0; i < n; i++) count[m[i].bucket]++;
  pe_status *st = NULL;
  for (int b = 0; !st && b < nb; b++) {
    pe_graph_bucket *bk = &g->buckets[b];
    bk->grads = calloc((size_t)count[b], sizeof(*bk->grads));
    bk->offsets = calloc((size_t)count[b], sizeof(*bk->offsets));
    bk->lvars = calloc((size_t)count[b] * (size_t)g->n_places, sizeof(int));
    bk->node = -1;
    if (!bk->grads || !bk->offsets || !bk->lvars) st = OOM();
  }
  for (int i = 0; !st && i < n; i++) {
    int b = m[i].bucket;
    pe_graph_bucket *bk = &g->buckets[b];
    const pe_graph_node *x = &g->nodes[m[i].node];
    int k = bk->n_grads++;
    bk->dtype = m[i].dtype;
    bk->grads[k] = g->lvars[x->in_lv[0]].name;
    bk->offsets[k] = bk->bytes;
    bk->bytes += align_up(m[i].bytes);
    for (int p = 0; p < g->n_places; p++) {
      int lv = x->in_lv[p];
      bk->lvars[p * count[b] + k] = lv;
      g->lvars[lv].bucket = b;
      g->lvars[lv].bucket_offset = bk->offsets[k];
    }
  }
  free(count);
  return st;
}

static pe_status *fused_node(pe_graph *g, int b, pe_graph_node *out) {
  pe_graph_bucket *bk = &g->buckets[b];
  memset(out, 0, sizeof(*out));
  out->kind = PE_NODE_FUSED_ALL_REDUCE;
  out->stream = PE_STREAM_COMM;
  out->place = out->root = out->src_op = -1;
  out->width = bk->n_grads;
  out->bucket = b;
  int nl = bk->n_grads * g->n_places;
  out->in_lv = malloc((size_t)nl * sizeof(int));
  out->out_lv = malloc((size_t)nl * sizeof(int));
  char name[96];
  snprintf(name, sizeof name, "fused_all_reduce#%d(%d grads, %lld B)", b, bk->n_grads,
           (long long)bk->bytes);
  out->name = strdup(name);
  if (!out->in_lv || !out->out_lv || !out->name) return OOM();
  memcpy(out->in_lv, bk->lvars, (size_t)nl * sizeof(int));
  memcpy(out->out_lv, bk->lvars, (size_t)nl * sizeof(int));
  out->n_in_lv = out->n_out_lv = nl;
  return NULL;
}

/* Replace the members' nodes: the fused node takes the last one's place. */
static pe_status *rewrite(pe_graph *g, const member *m, int n) {
  int *map = malloc((size_t)g->n_nodes * sizeof(int));
  int *bucket_of = malloc((size_t)g->n_nodes * sizeof(int));
  int *last = calloc((size_t)g->n_buckets, sizeof(int));
  pe_graph_node *nn = calloc((size_t)g->n_nodes, sizeof(*nn));
  pe_status *st = (!map || !bucket_of || !last || !nn) ? OOM() : NULL;
  for (int i = 0; !st && i < g->n_nodes; i++) bucket_of[i] = -1;
  for (int i = 0; !st && i < n; i++) {
    bucket_of[m[i].node] = m[i].bucket;
    last[m[i].bucket] = m[i].node;
  }
  int w = 0;
  for (int i = 0; !st && i < g->n_nodes; i++) {
    int b = bucket_of[i];
    if (b < 0) {
      nn[w] = g->nodes[i];
      map[i] = w++;
      continue;
    }
    if (last[b] != i) continue;
    st = fused_node(g, b, &nn[w]);
    g->buckets[b].node = w++;
  }
  /* Dropped members map to their bucket's fused node. */
  for (int i = 0; !st && i < g->n_nodes; i++)
    if (bucket_of[i] >= 0) map[i] = g->buckets[bucket_of[i]].node;
  if (st) {
    for (int i = 0; i < w; i++)
      if (nn[i].kind == PE_NODE_FUSED_ALL_REDUCE) {
        free(nn[i].in_lv);
        free(nn[i].out_lv);
        free(nn[i].name);
      }
  } else {
    for (int i = 0; i < g->n_nodes; i++)
      if (bucket_of[i] >= 0) { /* the member node itself is gone */
        pe_graph_node *x = &g->nodes[i];
        free(x->name);
        free(x->in_lv);
        free(x->out_lv);
        free(x->after);
        free(x->in_slot);
        free(x->out_slot);
      }
    for (int i = 0; i < w; i++)
      for (int k = 0; k < nn[i].n_after; k++) nn[i].after[k] = map[nn[i].after[k]];
    free(g->nodes);
    g->nodes = nn;
    g->cap_nodes = g->n_nodes;
    g->n_nodes = w;
    nn = NULL;
  }
  free(nn);
  free(map);
  free(bucket_of);
  free(last);
  return st;
}

pe_status *pe_pass_fuse_allreduce(pe_ir *ir) {
  if (!ir->graph) return pe_error(PE_EINVAL, "fuse_allreduce: no graph (run data_parallel first)");
  static const pe_pass_opts none = {0};
  const pe_pass_opts *o = ir->opts ? ir->opts : &none;
  pe_graph *g = ir->graph;
  if (!o->fuse || g->n_buckets > 0) return NULL; /* off, or already fused */
  int64_t limit = o->fuse_bucket_bytes > 0 ? o->fuse_bucket_bytes : g->fuse_bucket_bytes;
  if (limit <= 0) limit = PE_FUSE_BUCKET_BYTES_DEFAULT;
  g->fuse = true;
  g->fuse_bucket_bytes = limit;
  bool had_ssa = g->ssa;
  /* SSA tables hold node ids; drop them before renumbering. */
  pe_graph_clear_ssa(g);
  member *m = NULL;
  int n = 0;
  pe_status *st = collect(g, &m, &n);
  if (!st && n > 0) {
    int nb = bucketize(m, n, limit);
    st = make_buckets(g, m, n, nb);
    if (!st) st = rewrite(g, m, n);
  }
  free(m);
  if (!st && had_ssa) st = pe_graph_build_ssa(g);
  return st;
}
