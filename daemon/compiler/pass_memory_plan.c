/* The memory_plan pass: let temporaries whose lifetimes never overlap share
 * one buffer, per place.
 *
 * Candidates: lvars that are not persistable, not feeds, not kept for
 * fetching (loss, opts->keep), not outputs of the graph (final value never
 * read: metrics, so they stay fetchable without a keep list), not stored in
 * a fused bucket, not merged by a sparse_merge, of known size (fixed, or
 * per sample), and written before they are read (no version 0).
 *
 * Safety under out-of-order execution. The executor may run nodes in any
 * order consistent with the graph's edges (data and dummy), and it honours
 * every edge across streams, so "node a before node b" is guaranteed exactly
 * when a is an ancestor of b. A temporary's accesses (the writers and
 * readers of all its versions) all descend from its first writer F: readers
 * wait for their version's writer, and the ssa pass orders each later writer
 * after the readers (write-after-read) or the writer (write-after-write) of
 * the version it replaces. So lvar B may take over the buffer of lvar A when
 * every access of A is a strict ancestor of B's first writer: then every
 * access of A happens before every access of B, in every schedule. (Strict:
 * a node never finds one of its inputs aliased to its output.) The rule is
 * applied to a buffer's last occupant only; earlier occupants precede it by
 * the same rule, and precedence is transitive. No edge is added: reuse
 * follows the dependency chains the graph already has, so planning never
 * costs parallelism, and the graph passes before it keep their meaning.
 *
 * Greedy best fit: candidates in topological order of their first writer;
 * each takes, among the free buffers on its place with the same dtype and
 * the same kind of size (per-sample or fixed), one of the smallest size
 * class (ceil(log2(bytes))) at least its own, else a new buffer. A buffer's
 * class never grows, so a buffer is at most twice its largest occupant and
 * small temporaries cannot creep into ever larger buffers.
 *
 * Batch: shapes keep -1 in dim 0, so sizes are bytes per sample (rows of the
 * per-place batch) or fixed; pe_graph_buffer_bytes evaluates a buffer for a
 * batch size, and the pass logs planned vs unplanned bytes for
 * opts->batch_hint rows (32 by default).
 *
 * Reachability is a bitset per node (n^2/8 bytes); graphs above
 * PLAN_MAX_NODES nodes are left unplanned with a warning. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/graph.h"
#include "compiler/pass.h"
#include "core/log.h"

#define OOM() pe_error(PE_ENOMEM, "memory_plan: out of memory")
#define PLAN_MAX_NODES 16384

typedef struct plan {
  pe_graph *g;
  int words;     /* uint64 words per bitset */
  uint64_t *anc; /* [n_nodes * words]: strict ancestors */
  int *pos;      /* [n_nodes]: topological position */
} plan;

static bool is_anc(const plan *p, int a, int of) {
  return (p->anc[(size_t)of * p->words + (size_t)(a >> 6)] >> (a & 63)) & 1u;
}

static pe_status *ancestors(plan *p) {
  pe_graph *g = p->g;
  int n = g->n_nodes;
  p->words = (n + 63) / 64;
  p->anc = calloc((size_t)n * (size_t)p->words + 1, sizeof(uint64_t));
  int *order = malloc((size_t)(n ? n : 1) * sizeof(int));
  p->pos = malloc((size_t)(n ? n : 1) * sizeof(int));
  if (!p->anc || !order || !p->pos) {
    free(order);
    return OOM();
  }
  pe_status *st = pe_graph_topo_order(g, order);
  for (int i = 0; !st && i < n; i++) {
    int u = order[i];
    p->pos[u] = i;
    const uint64_t *au = &p->anc[(size_t)u * p->words];
    for (int k = 0; k < g->nodes[u].n_succ; k++) {
      int s = g->nodes[u].succ[k];
      uint64_t *as = &p->anc[(size_t)s * p->words];
      for (int w = 0; w < p->words; w++) as[w] |= au[w];
      as[u >> 6] |= (uint64_t)1 << (u & 63);
    }
  }
  free(order);
  return st;
}

/* A sparse_merge resizes its outputs to the merged row count, which the
 * batch does not bound per place: its gradients keep their own storage. */
static bool sparse_merged(const pe_graph *g, const pe_graph_lvar *l) {
  for (int v = 0; v < l->n_versions; v++) {
    const pe_graph_var *x = &g->vars[l->versions[v]];
    if (x->producer >= 0 && g->nodes[x->producer].kind == PE_NODE_SPARSE_MERGE) return true;
    for (int k = 0; k < x->n_consumers; k++)
      if (g->nodes[x->consumers[k]].kind == PE_NODE_SPARSE_MERGE) return true;
  }
  return false;
}

static bool candidate(const pe_graph *g, const pe_graph_lvar *l) {
  if (l->persistable || l->feed || l->keep || l->bucket >= 0 || !l->desc) return false;
  if (l->bytes <= 0 || l->n_versions == 0 || sparse_merged(g, l)) return false;
  /* A final value nobody reads is an output of the graph (accuracy, a
   * metric): fetchable, so never shared. */
  if (g->vars[l->versions[l->n_versions - 1]].n_consumers == 0) return false;
  return g->vars[l->versions[0]].producer >= 0;
}

static int first_writer(const pe_graph *g, const pe_graph_lvar *l) {
  return g->vars[l->versions[0]].producer;
}

/* Every access of lvar `a` is a strict ancestor of node f. */
static bool all_before(const plan *p, int a, int f) {
  const pe_graph *g = p->g;
  const pe_graph_lvar *l = &g->lvars[a];
  for (int v = 0; v < l->n_versions; v++) {
    const pe_graph_var *x = &g->vars[l->versions[v]];
    if (x->producer >= 0 && (x->producer == f || !is_anc(p, x->producer, f))) return false;
    for (int k = 0; k < x->n_consumers; k++)
      if (x->consumers[k] == f || !is_anc(p, x->consumers[k], f)) return false;
  }
  return true;
}

static int size_class(int64_t bytes) {
  int c = 0;
  while (c < 62 && ((int64_t)1 << c) < bytes) c++;
  return c;
}

typedef struct slot {
  int place, cls, last;
  pe_dtype dtype;
  bool per_sample;
} slot;

typedef struct cand_key {
  int pos, lvar;
} cand_key;

static int by_pos(const void *a, const void *b) {
  const cand_key *x = a, *y = b;
  if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
  return x->lvar < y->lvar ? -1 : x->lvar > y->lvar;
}

/* Assign plan slots (-1: not planned) to every lvar. */
static pe_status *assign(plan *p, int *slot_of, int *n_slots) {
  pe_graph *g = p->g;
  int n = 0;
  cand_key *cand = malloc((size_t)(g->n_lvars ? g->n_lvars : 1) * sizeof(*cand));
  slot *slots = malloc((size_t)(g->n_lvars ? g->n_lvars : 1) * sizeof(slot));
  if (!cand || !slots) {
    free(cand);
    free(slots);
    return OOM();
  }
  for (int i = 0; i < g->n_lvars; i++) {
    slot_of[i] = -1;
    if (candidate(g, &g->lvars[i]))
      cand[n++] = (cand_key){p->pos[first_writer(g, &g->lvars[i])], i};
  }
  qsort(cand, (size_t)n, sizeof(*cand), by_pos);
  int ns = 0;
  for (int c = 0; c < n; c++) {
    int lv = cand[c].lvar;
    const pe_graph_lvar *l = &g->lvars[lv];
    int f = first_writer(g, l), cls = size_class(l->bytes), pick = -1;
    for (int s = 0; s < ns; s++) {
      const slot *x = &slots[s];
      if (x->place != l->place || x->cls < cls || x->dtype != l->desc->dtype ||
          x->per_sample != l->per_sample || (pick >= 0 && x->cls >= slots[pick].cls))
        continue;
      if (all_before(p, x->last, f)) pick = s;
    }
    if (pick < 0) {
      pick = ns++;
      slots[pick] = (slot){l->place, cls, -1, l->desc->dtype, l->per_sample};
    }
    /* A buffer's class is its largest occupant's (a smaller one fits). */
    slots[pick].last = lv;
    slot_of[lv] = pick;
  }
  free(cand);
  free(slots);
  *n_slots = ns;
  return NULL;
}

/* Rebuild the buffer table: unplanned lvars keep a buffer each, planned
 * ones share their slot's buffer. */
static pe_status *rebuild_buffers(pe_graph *g, const int *slot_of, int n_slots) {
  for (int b = 0; b < g->n_buffers; b++) free(g->buffers[b].lvars);
  g->n_buffers = 0;
  int *slot_buf = malloc((size_t)(n_slots ? n_slots : 1) * sizeof(int));
  if (!slot_buf) return OOM();
  for (int s = 0; s < n_slots; s++) slot_buf[s] = -1;
  pe_status *st = NULL;
  for (int i = 0; !st && i < g->n_lvars; i++) {
    pe_graph_lvar *l = &g->lvars[i];
    int s = slot_of[i];
    if (s >= 0 && slot_buf[s] >= 0) {
      pe_graph_buffer *bf = &g->buffers[slot_buf[s]];
      int *nl = realloc(bf->lvars, (size_t)(bf->n_lvars + 1) * sizeof(int));
      if (!nl) {
        st = OOM();
        break;
      }
      bf->lvars = nl;
      bf->lvars[bf->n_lvars++] = i;
      bf->shared = true;
      int64_t *sz = l->per_sample ? &bf->sample_bytes : &bf->fixed_bytes;
      if (l->bytes > *sz) *sz = l->bytes;
      l->buffer = slot_buf[s];
      continue;
    }
    st = pe_graph_add_buffer(g, i, &l->buffer);
    if (!st && s >= 0) slot_buf[s] = l->buffer;
  }
  free(slot_buf);
  if (st) return st;
  /* Buffers list members in lvar order; the plan's occupation order is the
   * first writers' topological order, which the executor does not need. */
  for (int v = 0; v < g->n_vars; v++)
    if (!g->vars[v].dummy) g->vars[v].buffer = g->lvars[g->vars[v].lvar].buffer;
  return NULL;
}

pe_status *pe_pass_memory_plan(pe_ir *ir) {
  if (!ir->graph) return pe_error(PE_EINVAL, "memory_plan: no graph (run data_parallel first)");
  static const pe_pass_opts none = {0};
  const pe_pass_opts *o = ir->opts ? ir->opts : &none;
  pe_graph *g = ir->graph;
  if (g->planned) return NULL;
  if (!g->ssa) PE_TRY(pe_graph_build_ssa(g));
  if (g->n_nodes > PLAN_MAX_NODES) {
    PE_LOGW("memory_plan: %d nodes (over %d): buffers left unplanned", g->n_nodes, PLAN_MAX_NODES);
    return NULL;
  }
  plan p = {g, 0, NULL, NULL};
  int *slot_of = malloc((size_t)(g->n_lvars ? g->n_lvars : 1) * sizeof(int));
  int n_slots = 0;
  pe_status *st = slot_of ? ancestors(&p) : OOM();
  if (!st) st = assign(&p, slot_of, &n_slots);
  if (!st) st = rebuild_buffers(g, slot_of, n_slots);
  free(slot_of);
  free(p.anc);
  free(p.pos);
  if (st) return st;
  g->planned = true;
  int64_t batch = o->batch_hint > 0 ? o->batch_hint : 32, planned, unplanned;
  pe_graph_memory_bytes(g, batch, &planned, &unplanned);
  PE_LOGI(
      "memory_plan: %d lvars in %d buffers over %d places; temporaries at %lld rows per "
      "place: %lld bytes planned vs %lld unplanned",
      g->n_lvars, g->n_buffers, g->n_places, (long long)batch, (long long)planned,
      (long long)unplanned);
  return NULL;
}
