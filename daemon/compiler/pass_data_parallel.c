/* The data_parallel pass: build the graph (and the startup graph) from a
 * validated program, replicated over opts->n_places places.
 *
 * Main graph, op by op in program order, one node per place:
 *  - the fill_constant of loss@GRAD (backward's seed) becomes a
 *    loss_grad_scale node: place p's share n_p/N of the batch, set at run
 *    time, so that summing gradients over places gives the gradient of the
 *    whole batch's mean loss (losses are means over their batch);
 *  - right after the last writer of a parameter gradient (on every place),
 *    one collective (also on one place when the model trains in a job
 *    across nodes, pe_pass_opts.cross_nodes: the executor sums over the
 *    nodes there): an all_reduce (AllReduce) or a reduce to the
 *    parameter's owner (Reduce), so communication overlaps the rest of
 *    backward;
 *  - optimizer ops run on every place (AllReduce) or only on the owner,
 *    followed by a broadcast of the updated parameter (Reduce);
 *  - Sharded: at the optimizer op, one sharded_update node per parameter
 *    (graph.h) replaces both the all_reduce and the per-place optimizers:
 *    it needs every place's finished gradient anyway, so placing it at the
 *    optimizer changes nothing for overlap (it starts as soon as the
 *    gradients exist, while backward goes on).
 *  - a sparse gradient (registry.h, PE_ROWS_SUFFIX: an embedding with
 *    is_sparse) gets a sparse_merge instead of the all_reduce or reduce:
 *    the places' rows and values gathered and merged (graph.h), on every
 *    place (AllReduce, and Sharded, which keeps such a parameter's update
 *    per place: its rows are no slice of the parameter) or on the owner
 *    (Reduce, whose update and broadcast stay as for a dense gradient).
 *    The values are each place's share of the batch mean's gradient (the
 *    loss_grad_scale seed), so the merged rows are what the dense sum
 *    holds in them; no dense gradient is formed.
 * Owners are assigned by size: parameters in decreasing byte size, each to
 * the place with the fewest bytes so far (ties: lowest place), which is
 * round-robin for equal sizes and balances optimizer work otherwise.
 * Feeds are per-place lvars: the executor splits the batch along dim 0.
 * Persistables are replicated per place. State a forward op derives from
 * the batch (batch norm's running statistics: each place sees only its own
 * rows) gets, after its last writer, a broadcast from place 0, as PyTorch
 * DDP's broadcast_buffers does: every place then holds place 0's, which is
 * what the model's value (get_params, checkpoints) is, so a model evaluates
 * the same live and after a restore. Ops in test mode
 * (is_test) leave such state alone and get none.
 *
 * Startup graph: every startup op on place 0 (one generator, so every
 * replica starts from the same values), then, right after the last writer of
 * each persistable it initialises, a broadcast from place 0 to the others.
 * Persistables no startup op writes (loaded from a checkpoint) are the
 * executor's to replicate.
 *
 * With one place no collective is emitted and loss_grad_scale is 1. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/graph.h"
#include "compiler/pass.h"
#include "ops/registry.h"

#define OOM() pe_error(PE_ENOMEM, "data_parallel: out of memory")

typedef struct dp_ctx {
  pe_graph *g;
  const pe_block *b;
  pe_strmap grad_index;  /* grad name -> param index + 1 */
  pe_strmap batch_state; /* batch-derived persistable -> its last writer's op index + 1 */
  int *last_writer;      /* [n_params] op index, -1 */
  bool *sharded;         /* [n_params] updated by a sharded_update node, or NULL */
  const char **rows;     /* [n_params] a sparse gradient's rows variable, else NULL */
} dp_ctx;

/* Node id for op i of the block: desc, def and empty slot tables. */
static pe_status *add_op_shell(pe_graph *g, int i, pe_node_kind kind, int p, int *out) {
  const pe_op_desc *op = g->prog->blocks[g->block]->ops[i];
  const pe_op_def *def = pe_op_lookup(op->type);
  if (!def) return pe_error(PE_EUNKNOWN_OP, "op #%d: unknown op type '%s'", i, op->type);
  int id = -1;
  PE_TRY(pe_graph_add_node(g, kind, p, &id));
  pe_graph_node *n = &g->nodes[id];
  n->desc = op;
  n->def = def;
  n->src_op = i;
  n->in_slot = calloc((size_t)def->n_inputs + 1, sizeof(int));
  n->out_slot = calloc((size_t)def->n_outputs + 1, sizeof(int));
  if (!n->in_slot || !n->out_slot) return OOM();
  *out = id;
  return NULL;
}

/* Append the op's args on place p to node id, slots in def order; the slot
 * offsets are recorded when `record` (one place's layout). */
static pe_status *add_op_args(pe_graph *g, int id, int p, bool record) {
  const pe_op_desc *op = g->nodes[id].desc;
  const pe_op_def *def = g->nodes[id].def;
  int in0 = g->nodes[id].n_in_lv, out0 = g->nodes[id].n_out_lv;
  for (int dir = 0; dir < 2; dir++) {
    const pe_slot_def *sd = dir ? def->outputs : def->inputs;
    int ns = dir ? def->n_outputs : def->n_inputs;
    for (int s = 0; s < ns; s++) {
      const pe_slot *slot =
          dir ? pe_op_find_output(op, sd[s].name) : pe_op_find_input(op, sd[s].name);
      for (int k = 0; slot && k < slot->n; k++) {
        int lv;
        PE_TRY(pe_graph_lvar_get(g, slot->args[k], p, &lv));
        PE_TRY(dir ? pe_graph_node_add_out(g, id, lv) : pe_graph_node_add_in(g, id, lv));
      }
      pe_graph_node *n = &g->nodes[id];
      if (!record) continue;
      if (dir)
        n->out_slot[s + 1] = n->n_out_lv - out0;
      else
        n->in_slot[s + 1] = n->n_in_lv - in0;
    }
  }
  return NULL;
}

/* One op node for op i of the block on place p. */
static pe_status *add_op_node(pe_graph *g, int i, int p, pe_node_kind kind, int *out) {
  int id = -1;
  PE_TRY(add_op_shell(g, i, kind, p, &id));
  const pe_op_desc *op = g->nodes[id].desc;
  PE_TRY(kind == PE_NODE_OP ? pe_graph_set_name(g, id, "%s#%d@p%d", op->type, i, p)
                            : pe_graph_set_name(g, id, "loss_grad_scale@p%d", p));
  PE_TRY(add_op_args(g, id, p, true));
  *out = id;
  return NULL;
}

/* The sharded strategy's node for optimizer op i (parameter `param`): the
 * op's args on every place, place-major (graph.h). */
static pe_status *add_sharded_update(pe_graph *g, int i, const char *param) {
  int id = -1;
  PE_TRY(add_op_shell(g, i, PE_NODE_SHARDED_UPDATE, -1, &id));
  g->nodes[id].root = 0;
  PE_TRY(pe_graph_set_name(g, id, "sharded_update(%s#%d %s)", g->nodes[id].desc->type, i, param));
  for (int p = 0; p < g->n_places; p++) PE_TRY(add_op_args(g, id, p, p == 0));
  g->nodes[id].width = g->nodes[id].in_slot[g->nodes[id].def->n_inputs];
  return NULL;
}

/* A sparse_merge of gradient `grad` with rows `rows` (graph.h): onto
 * every place (root -1) or onto root. */
static pe_status *add_sparse_merge(pe_graph *g, const char *grad, const char *rows, int root) {
  int id;
  PE_TRY(pe_graph_add_node(g, PE_NODE_SPARSE_MERGE, -1, &id));
  g->nodes[id].root = root;
  g->nodes[id].width = 2;
  if (root < 0)
    PE_TRY(pe_graph_set_name(g, id, "sparse_merge(%s)", grad));
  else
    PE_TRY(pe_graph_set_name(g, id, "sparse_merge(%s->p%d)", grad, root));
  for (int p = 0; p < g->n_places; p++) {
    int vl, rl;
    PE_TRY(pe_graph_lvar_get(g, grad, p, &vl));
    PE_TRY(pe_graph_lvar_get(g, rows, p, &rl));
    PE_TRY(pe_graph_node_add_in(g, id, vl));
    PE_TRY(pe_graph_node_add_in(g, id, rl));
    if (root >= 0 && p != root) continue;
    PE_TRY(pe_graph_node_add_out(g, id, vl));
    PE_TRY(pe_graph_node_add_out(g, id, rl));
  }
  return NULL;
}

/* A collective over all places of `name`. kinds: ALL_REDUCE (in/out on
 * every place), REDUCE (in on every place, out on root), BROADCAST (in on
 * root, out on every other place). */
static pe_status *add_collective(pe_graph *g, pe_node_kind kind, const char *name, int root) {
  int id;
  PE_TRY(pe_graph_add_node(g, kind, -1, &id));
  g->nodes[id].root = kind == PE_NODE_ALL_REDUCE ? -1 : root;
  g->nodes[id].width = 1;
  if (kind == PE_NODE_ALL_REDUCE)
    PE_TRY(pe_graph_set_name(g, id, "all_reduce(%s)", name));
  else if (kind == PE_NODE_REDUCE)
    PE_TRY(pe_graph_set_name(g, id, "reduce(%s->p%d)", name, root));
  else
    PE_TRY(pe_graph_set_name(g, id, "broadcast(%s from p%d)", name, root));
  for (int p = 0; p < g->n_places; p++) {
    int lv;
    PE_TRY(pe_graph_lvar_get(g, name, p, &lv));
    if (kind != PE_NODE_BROADCAST || p == root) PE_TRY(pe_graph_node_add_in(g, id, lv));
    if (kind == PE_NODE_ALL_REDUCE || (kind == PE_NODE_REDUCE && p == root) ||
        (kind == PE_NODE_BROADCAST && p != root))
      PE_TRY(pe_graph_node_add_out(g, id, lv));
  }
  return NULL;
}

static bool is_optimizer(const pe_op_desc *op) {
  const pe_op_def *def = pe_op_lookup(op->type);
  return def && (def->flags & PE_OP_OPTIMIZER);
}

/* Parameters: the Param of every optimizer op; without an optimizer, every
 * persistable, non-stop_gradient var whose @GRAD some op writes. */
static pe_status *find_params(dp_ctx *c) {
  pe_graph *g = c->g;
  const pe_block *b = c->b;
  int cap = b->n_vars + b->n_ops + 1;
  g->params = calloc((size_t)cap, sizeof(*g->params));
  g->grads = calloc((size_t)cap, sizeof(*g->grads));
  g->owner = calloc((size_t)cap, sizeof(*g->owner));
  c->last_writer = calloc((size_t)cap, sizeof(int));
  c->rows = calloc((size_t)cap, sizeof(*c->rows));
  if (!g->params || !g->grads || !g->owner || !c->last_writer || !c->rows) return OOM();
  /* An update reading a clipped gradient (clip_by_global_norm's Out k):
   * the gradient to sum over places is the clip's input X k. */
  pe_strmap clipped;
  pe_strmap_init(&clipped);
  for (int i = 0; i < b->n_ops; i++) {
    if (strcmp(b->ops[i]->type, "clip_by_global_norm")) continue;
    const pe_slot *x = pe_op_find_input(b->ops[i], "X"), *out = pe_op_find_output(b->ops[i], "Out");
    for (int k = 0; x && out && k < out->n && k < x->n; k++) {
      if (g->n_places > 1 && !strcmp(out->args[k], x->args[k])) {
        pe_strmap_destroy(&clipped);
        return pe_error(PE_EINVAL,
                        "data_parallel: op #%d clip_by_global_norm writes '%s' in place: on "
                        "several places it must write other variables (the all-reduce comes "
                        "between the gradient and the clip)",
                        i, x->args[k]);
      }
      if (!pe_strmap_put(&clipped, out->args[k], x->args[k])) {
        pe_strmap_destroy(&clipped);
        return OOM();
      }
    }
  }
  for (int i = 0; i < b->n_ops; i++) {
    if (!is_optimizer(b->ops[i])) continue;
    const char *pn = pe_op_input_arg(b->ops[i], "Param");
    const char *gn = pe_op_input_arg(b->ops[i], "Grad");
    const char *src = gn ? pe_strmap_get(&clipped, gn) : NULL;
    if (src) gn = src;
    if (!pn || !gn || pe_strmap_get(&c->grad_index, gn)) continue;
    g->params[g->n_params] = pn;
    g->grads[g->n_params++] = gn;
    if (!pe_strmap_put(&c->grad_index, gn, (void *)(intptr_t)g->n_params)) {
      pe_strmap_destroy(&clipped);
      return OOM();
    }
  }
  pe_strmap_destroy(&clipped);
  if (g->n_params == 0) {
    /* Gradient names written by some op, then the matching parameters. */
    pe_strmap written;
    pe_strmap_init(&written);
    for (int i = 0; i < b->n_ops; i++)
      for (int s = 0; s < b->ops[i]->n_out; s++)
        for (int k = 0; k < b->ops[i]->out[s].n; k++)
          if (!pe_strmap_put(&written, b->ops[i]->out[s].args[k], b->ops[i]->out[s].args[k])) {
            pe_strmap_destroy(&written);
            return OOM();
          }
    char gname[600];
    for (int v = 0; v < b->n_vars; v++) {
      const pe_var_desc *d = b->vars[v];
      if (!d->persistable || d->stop_gradient) continue;
      snprintf(gname, sizeof gname, "%s" PE_GRAD_SUFFIX, d->name);
      const char *gn = pe_strmap_get(&written, gname);
      if (!gn) continue;
      g->params[g->n_params] = d->name;
      g->grads[g->n_params++] = gn;
      if (!pe_strmap_put(&c->grad_index, gn, (void *)(intptr_t)g->n_params)) {
        pe_strmap_destroy(&written);
        return OOM();
      }
    }
    pe_strmap_destroy(&written);
  }
  /* Last writer of each gradient among the non-optimizer ops. */
  for (int j = 0; j < g->n_params; j++) c->last_writer[j] = -1;
  for (int i = 0; i < b->n_ops; i++) {
    if (is_optimizer(b->ops[i])) continue;
    for (int s = 0; s < b->ops[i]->n_out; s++)
      for (int k = 0; k < b->ops[i]->out[s].n; k++) {
        intptr_t j = (intptr_t)pe_strmap_get(&c->grad_index, b->ops[i]->out[s].args[k]);
        if (j) c->last_writer[j - 1] = i;
      }
  }
  for (int j = 0; j < g->n_params; j++)
    if (c->last_writer[j] >= 0)
      c->rows[j] = pe_op_sparse_rows(b->ops[c->last_writer[j]], g->grads[j]);
  return NULL;
}

/* Several places: every sparse gradient some op writes is a parameter's
 * (merged by a sparse_merge); another one would differ per place. */
static pe_status *check_sparse(const dp_ctx *c) {
  const pe_block *b = c->b;
  for (int i = 0; i < b->n_ops; i++)
    for (int s = 0; s < b->ops[i]->n_out; s++) {
      if (!pe_is_sparse_rows_name(b->ops[i]->out[s].name)) continue;
      for (int k = 0; k < b->ops[i]->out[s].n; k++) {
        const char *rows = b->ops[i]->out[s].args[k];
        bool merged = false;
        for (int j = 0; j < c->g->n_params && !merged; j++)
          merged = c->rows[j] && !strcmp(c->rows[j], rows);
        if (!merged)
          return pe_error(PE_EINVAL,
                          "data_parallel: op #%d %s writes a sparse gradient (rows '%s', "
                          "is_sparse) that is no parameter's gradient updated by an optimizer "
                          "op: %d %s places cannot merge it (set is_sparse false)",
                          i, b->ops[i]->type, rows, c->g->n_places,
                          pe_place_kind_name(c->g->place_kind));
      }
    }
  return NULL;
}

static int64_t param_bytes(const pe_graph *g, const char *name) {
  int lv = pe_graph_lvar_find(g, name, 0);
  int64_t by = lv >= 0 ? g->lvars[lv].bytes : -1;
  return by > 0 ? by : 0;
}

/* Reduce strategy owners: largest first, to the least loaded place. */
static pe_status *assign_owners(pe_graph *g) {
  int n = g->n_params;
  int *ord = malloc((size_t)(n ? n : 1) * sizeof(int));
  int64_t *sz = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
  int64_t load[PE_MAX_PLACES] = {0};
  if (!ord || !sz) {
    free(ord);
    free(sz);
    return OOM();
  }
  for (int j = 0; j < n; j++) {
    int lv;
    pe_status *st = pe_graph_lvar_get(g, g->params[j], 0, &lv);
    if (st) {
      free(ord);
      free(sz);
      return st;
    }
    sz[j] = param_bytes(g, g->params[j]);
    ord[j] = j;
  }
  /* Insertion sort, stable: n is the parameter count. */
  for (int a = 1; a < n; a++)
    for (int k = a; k > 0 && sz[ord[k]] > sz[ord[k - 1]]; k--) {
      int t = ord[k];
      ord[k] = ord[k - 1];
      ord[k - 1] = t;
    }
  for (int a = 0; a < n; a++) {
    int best = 0;
    for (int p = 1; p < g->n_places; p++)
      if (load[p] < load[best]) best = p;
    g->owner[ord[a]] = best;
    load[best] += sz[ord[a]] ? sz[ord[a]] : 1;
  }
  free(ord);
  free(sz);
  return NULL;
}

static int param_of_opt(dp_ctx *c, const pe_op_desc *op) {
  const char *gn = pe_op_input_arg(op, "Grad");
  intptr_t j = gn ? (intptr_t)pe_strmap_get(&c->grad_index, gn) : 0;
  return (int)j - 1;
}

/* Sharded strategy: a parameter is updated by a sharded_update node when
 * exactly one optimizer op uses its gradient and that op is element-wise;
 * others keep all_reduce + an optimizer per place. */
static pe_status *find_sharded(dp_ctx *c) {
  const pe_graph *g = c->g;
  int *uses = calloc((size_t)(g->n_params ? g->n_params : 1), sizeof(int));
  c->sharded = calloc((size_t)(g->n_params ? g->n_params : 1), sizeof(bool));
  if (!uses || !c->sharded) {
    free(uses);
    return OOM();
  }
  for (int i = 0; i < c->b->n_ops; i++) {
    if (!is_optimizer(c->b->ops[i])) continue;
    int pj = param_of_opt(c, c->b->ops[i]);
    if (pj < 0) continue;
    uses[pj]++;
    c->sharded[pj] = (pe_op_lookup(c->b->ops[i]->type)->flags & PE_OP_ELEMENTWISE) != 0;
  }
  for (int j = 0; j < g->n_params; j++)
    c->sharded[j] = c->sharded[j] && uses[j] == 1 && !c->rows[j];
  free(uses);
  return NULL;
}

static bool is_param(const pe_graph *g, const char *name) {
  for (int j = 0; j < g->n_params; j++)
    if (!strcmp(g->params[j], name)) return true;
  return false;
}

/* Persistables written by a non-optimizer op fed (transitively) by a feed
 * (c->batch_state: name -> last such writer + 1): they differ per place. */
static pe_status *find_batch_state(dp_ctx *c) {
  const pe_block *b = c->b;
  pe_strmap batch; /* names derived from the batch */
  pe_strmap_init(&batch);
  pe_status *st = NULL;
  for (int v = 0; !st && v < b->n_vars; v++)
    if (b->vars[v]->is_feed && !pe_strmap_put(&batch, b->vars[v]->name, (void *)1)) st = OOM();
  for (int i = 0; !st && i < b->n_ops; i++) {
    const pe_op_desc *op = b->ops[i];
    if (is_optimizer(op)) continue;
    bool dep = false;
    for (int s = 0; !dep && s < op->n_in; s++)
      for (int k = 0; !dep && k < op->in[s].n; k++) dep = pe_strmap_get(&batch, op->in[s].args[k]);
    if (!dep) continue;
    const pe_op_def *def = pe_op_lookup(op->type);
    for (int s = 0; !st && s < op->n_out; s++) {
      /* An output the op leaves as it was (batch_norm in test mode and its
       * running statistics) is no per-place state. */
      bool same = def && pe_op_output_unchanged(def, op, pe_op_output_index(def, op->out[s].name));
      for (int k = 0; !st && k < op->out[s].n; k++) {
        const char *name = op->out[s].args[k];
        if (!pe_strmap_put(&batch, name, (void *)1)) st = OOM();
        const pe_var_desc *d = pe_block_find_var(c->g->prog, b, name);
        if (st || same || !d || !d->persistable || is_param(c->g, name)) continue;
        if (!pe_strmap_put(&c->batch_state, name, (void *)(intptr_t)(i + 1))) st = OOM();
      }
    }
  }
  pe_strmap_destroy(&batch);
  return st;
}

/* After op i: a broadcast from place 0 of each batch-derived persistable op
 * i is the last writer of. */
static pe_status *add_state_broadcasts(dp_ctx *c, int i) {
  const pe_op_desc *op = c->b->ops[i];
  for (int s = 0; s < op->n_out; s++)
    for (int k = 0; k < op->out[s].n; k++) {
      const char *name = op->out[s].args[k];
      if ((intptr_t)pe_strmap_get(&c->batch_state, name) != i + 1) continue;
      PE_TRY(add_collective(c->g, PE_NODE_BROADCAST, name, 0));
      if (!pe_strmap_put(&c->batch_state, name, (void *)(intptr_t)-1)) return OOM(); /* once */
    }
  return NULL;
}

static pe_status *build_main(dp_ctx *c, const pe_pass_opts *o) {
  pe_graph *g = c->g;
  const pe_block *b = c->b;
  const char *loss = o->loss ? o->loss : g->prog->loss;
  const pe_var_desc *ld = loss ? pe_block_find_var(g->prog, b, loss) : NULL;
  g->loss = ld ? ld->name : NULL;
  int lg_op = -1;
  char lgname[600];
  if (g->loss) {
    snprintf(lgname, sizeof lgname, "%s" PE_GRAD_SUFFIX, g->loss);
    for (int i = 0; i < b->n_ops && lg_op < 0; i++) {
      const char *out = pe_op_output_arg(b->ops[i], "Out");
      if (strcmp(b->ops[i]->type, "fill_constant") == 0 && out && strcmp(out, lgname) == 0)
        lg_op = i;
    }
  }
  PE_TRY(find_params(c));
  bool multi = g->n_places > 1;
  bool grad_coll = multi || o->cross_nodes; /* gradients summed over places or nodes */
  bool reduce = g->strategy == PE_STRATEGY_REDUCE;
  if (reduce)
    PE_TRY(assign_owners(g));
  else
    for (int j = 0; j < g->n_params; j++) g->owner[j] = -1;
  if (multi && g->strategy == PE_STRATEGY_SHARDED) PE_TRY(find_sharded(c));
  if (multi) PE_TRY(find_batch_state(c));
  if (multi) PE_TRY(check_sparse(c));
  for (int i = 0; i < b->n_ops; i++) {
    const pe_op_desc *op = b->ops[i];
    bool opt = is_optimizer(op);
    int pj = opt ? param_of_opt(c, op) : -1;
    if (pj >= 0 && c->sharded && c->sharded[pj]) {
      PE_TRY(add_sharded_update(g, i, g->params[pj]));
      continue;
    }
    for (int p = 0; p < g->n_places; p++) {
      if (opt && reduce && pj >= 0 && g->owner[pj] != p) continue;
      int id;
      PE_TRY(add_op_node(g, i, p, i == lg_op ? PE_NODE_LOSS_GRAD_SCALE : PE_NODE_OP, &id));
    }
    if (multi && opt && reduce && pj >= 0)
      PE_TRY(add_collective(g, PE_NODE_BROADCAST, g->params[pj], g->owner[pj]));
    for (int j = 0; grad_coll && j < g->n_params; j++)
      if (multi && c->last_writer[j] == i && c->rows[j])
        PE_TRY(add_sparse_merge(g, g->grads[j], c->rows[j], reduce ? g->owner[j] : -1));
      else if (c->last_writer[j] == i && !(c->sharded && c->sharded[j]))
        PE_TRY(add_collective(g, reduce ? PE_NODE_REDUCE : PE_NODE_ALL_REDUCE, g->grads[j],
                              g->owner[j]));
    if (multi) PE_TRY(add_state_broadcasts(c, i));
  }
  /* Fetchable: the loss and the keep list, on every place. */
  for (int p = 0; p < g->n_places; p++) {
    int lv = g->loss ? pe_graph_lvar_find(g, g->loss, p) : -1;
    if (lv >= 0) g->lvars[lv].keep = true;
  }
  for (int k = 0; k < o->n_keep; k++) {
    if (!o->keep[k]) continue;
    bool found = false;
    for (int p = 0, lv; p < g->n_places; p++)
      if ((lv = pe_graph_lvar_find(g, o->keep[k], p)) >= 0) found = g->lvars[lv].keep = true;
    /* A name that is not there would not be fetchable either: a typo. */
    if (!found)
      return pe_error(PE_EUNKNOWN_VAR,
                      "keep: '%.64s' is not a variable of the program's graph (after its passes)",
                      o->keep[k]);
  }
  return NULL;
}

static pe_status *build_startup(pe_graph *g) {
  const pe_block *b = g->prog->blocks[g->block];
  g->startup = true;
  /* Last writer of each persistable output, so its broadcast starts as
   * soon as it is final. */
  pe_strmap last;
  pe_strmap_init(&last);
  pe_status *st = NULL;
  for (int i = 0; !st && i < b->n_ops; i++)
    for (int s = 0; !st && s < b->ops[i]->n_out; s++)
      for (int k = 0; !st && k < b->ops[i]->out[s].n; k++)
        if (!pe_strmap_put(&last, b->ops[i]->out[s].args[k], (void *)(intptr_t)(i + 1))) st = OOM();
  for (int i = 0; !st && i < b->n_ops; i++) {
    int id;
    st = add_op_node(g, i, 0, PE_NODE_OP, &id);
    for (int s = 0; !st && g->n_places > 1 && s < b->ops[i]->n_out; s++)
      for (int k = 0; !st && k < b->ops[i]->out[s].n; k++) {
        const char *name = b->ops[i]->out[s].args[k];
        if ((intptr_t)pe_strmap_get(&last, name) != i + 1) continue;
        int lv = pe_graph_lvar_find(g, name, 0);
        if (lv < 0 || !g->lvars[lv].persistable) continue;
        (void)pe_strmap_put(&last, name, (void *)(intptr_t)-1); /* once */
        st = add_collective(g, PE_NODE_BROADCAST, name, 0);
      }
  }
  pe_strmap_destroy(&last);
  return st;
}

static pe_status *new_graph(const pe_ir *ir, const pe_pass_opts *o, int block, pe_graph **out) {
  int n = o->n_places > 0 ? o->n_places : 1;
  PE_TRY(pe_graph_new(ir->prog, block, o->place_kind, n, out));
  pe_graph *g = *out;
  g->strategy = o->strategy;
  g->fuse = o->fuse;
  g->fuse_bucket_bytes =
      o->fuse_bucket_bytes > 0 ? o->fuse_bucket_bytes : PE_FUSE_BUCKET_BYTES_DEFAULT;
  return NULL;
}

pe_status *pe_pass_data_parallel(pe_ir *ir) {
  static const pe_pass_opts none = {0};
  const pe_pass_opts *o = ir->opts ? ir->opts : &none;
  if (o->strategy != PE_STRATEGY_ALLREDUCE && o->strategy != PE_STRATEGY_REDUCE &&
      o->strategy != PE_STRATEGY_SHARDED)
    return pe_error(PE_EINVAL, "data_parallel: unknown strategy %d", (int)o->strategy);
  if (o->cross_nodes && o->strategy != PE_STRATEGY_ALLREDUCE)
    return pe_error(PE_EINVAL,
                    "data_parallel: a job across nodes trains with strategy allreduce, not %s",
                    pe_strategy_name(o->strategy));
  if (o->strategy == PE_STRATEGY_SHARDED && o->place_kind == PE_PLACE_CUDA)
    return pe_error(PE_EINVAL,
                    "data_parallel: strategy sharded runs on cpu and sim places, not cuda "
                    "(use allreduce or reduce)");
  const pe_block *mb = pe_program_main(ir->prog);
  if (!mb) return pe_error(PE_EINVAL, "data_parallel: no main block");
  /* Clipping by the global norm reads every gradient, summed: each place
   * has them all only under AllReduce. */
  for (int i = 0; o->n_places > 1 && o->strategy != PE_STRATEGY_ALLREDUCE && i < mb->n_ops; i++)
    if (!strcmp(mb->ops[i]->type, "clip_by_global_norm"))
      return pe_error(PE_EINVAL,
                      "data_parallel: op #%d clip_by_global_norm (the optimizer's grad_clip_norm) "
                      "needs every summed gradient on every place: strategy %s cannot give it "
                      "(use allreduce; auto picks it)",
                      i, pe_strategy_name(o->strategy));
  /* The cuda kernels and collectives take dense gradients only; cpu and
   * sim places merge sparse ones (sparse_merge), within a node only. */
  for (int i = 0; (o->cross_nodes || o->place_kind == PE_PLACE_CUDA) && i < mb->n_ops; i++)
    for (int s = 0; s < mb->ops[i]->n_out; s++)
      if (pe_is_sparse_rows_name(mb->ops[i]->out[s].name) && mb->ops[i]->out[s].n)
        return pe_error(PE_EINVAL,
                        "data_parallel: op #%d %s writes a sparse gradient (rows '%s', is_sparse), "
                        "which runs on cpu and sim places, not on %d %s places%s: set "
                        "is_sparse false",
                        i, mb->ops[i]->type, mb->ops[i]->out[s].args[0],
                        o->n_places > 0 ? o->n_places : 1, pe_place_kind_name(o->place_kind),
                        o->cross_nodes ? " in a job across nodes" : "");
  pe_ir_destroy(ir); /* a rerun replaces the graphs */
  pe_graph *g = NULL, *s = NULL;
  PE_TRY(new_graph(ir, o, ir->prog->main_block, &g));
  dp_ctx c = {g, g->prog->blocks[g->block], {0}, {0}, NULL, NULL, NULL};
  pe_strmap_init(&c.grad_index);
  pe_strmap_init(&c.batch_state);
  pe_status *st = build_main(&c, o);
  free(c.last_writer);
  free(c.sharded);
  free(c.rows);
  pe_strmap_destroy(&c.grad_index);
  pe_strmap_destroy(&c.batch_state);
  if (!st && ir->prog->startup_block >= 0) {
    st = new_graph(ir, o, ir->prog->startup_block, &s);
    if (!st) st = build_startup(s);
    if (st) st = pe_status_wrap(st, "startup graph");
  }
  if (st) {
    pe_graph_free(g);
    pe_graph_free(s);
    return st;
  }
  ir->graph = g;
  ir->startup = s;
  return NULL;
}
