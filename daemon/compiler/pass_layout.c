/* The layout_blocked pass: which activations stay in oneDNN's blocked
 * layout (contract in ops/cpu/dnnl_act_layout.h).
 *
 * A variable is blocked when it is an f32 temporary of the main block (not
 * persistable, not a feed, not the loss, not kept fetchable) written by
 * exactly one op and read by at least one, and every one of those
 * accesses is an aware slot:
 *   conv2d       Input -> Output
 *   conv2d_grad  Input, Output, Output@GRAD -> Input@GRAD
 *   pool2d       X -> Out
 *   pool2d_grad  X, Out, Out@GRAD -> X@GRAD   (max pooling with Out only)
 * and, tied (every listed argument of the op blocked, or none):
 *   batch_norm            X -> Y
 *   batch_norm_grad       X, Y, Y@GRAD -> X@GRAD
 *   elementwise_add       X, Y -> Out             (X and Y of one shape)
 *   elementwise_add_grad  X, Y, Out, Out@GRAD -> X@GRAD, Y@GRAD  (same)
 *   sum                   X... -> Out             (gradient accumulation)
 *   relu                  X -> Out
 *   relu_grad             X, Out, Out@GRAD -> X@GRAD
 * A tied op's loops then run on all its activations alike whatever their
 * layout (batch_norm's per-channel statistics take a channel block's lanes
 * as the vector). A fused relu's gradient masks Output@GRAD with Output
 * elementwise, so conv2d_grad ties those two. Ties are resolved to a fixed
 * point: a variable one tied op leaves plain may leave another op's
 * arguments plain in turn.
 * Each aware op then gets its "layout_blocked" bits (0 where none), and
 * each blocked variable V is renamed V@BLOCKED in every op (declared like
 * V): what it holds is no longer V's plain value, so V itself is left
 * declared, unused, with a note that refuses its fetch in every executor
 * (as for a fused intermediate: keep it or register with no_op_fusion to
 * fetch it).
 *
 * It runs last in the program pipelines (after backward and optimizer, so
 * that it sees every reader), only where the op-fusion passes run (cpu and
 * sim places, opts->fuse_conv_act, a main and a startup block at most) and
 * when the process's conv_layout mode is blocked. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/pass.h"
#include "core/strmap.h"
#include "ops/cpu/dnnl_act_layout.h"
#include "ops/registry.h"

#define AWARE_IN 4
#define AWARE_OUT 2

typedef struct aware_op {
  const char *type;
  const char *in[AWARE_IN], *out[AWARE_OUT];
  bool tied; /* every listed argument shares one layout */
} aware_op;

static const aware_op aware_ops[] = {
    {"conv2d", {"Input"}, {"Output"}, false},
    {"conv2d_grad", {"Input", "Output", "Output@GRAD"}, {"Input@GRAD"}, false},
    {"pool2d", {"X"}, {"Out"}, false},
    {"pool2d_grad", {"X", "Out", "Out@GRAD"}, {"X@GRAD"}, false},
    {"batch_norm", {"X"}, {"Y"}, true},
    {"batch_norm_grad", {"X", "Y", "Y@GRAD"}, {"X@GRAD"}, true},
    {"elementwise_add", {"X", "Y"}, {"Out"}, true},
    {"elementwise_add_grad", {"X", "Y", "Out", "Out@GRAD"}, {"X@GRAD", "Y@GRAD"}, true},
    {"sum", {"X"}, {"Out"}, true},
    {"relu", {"X"}, {"Out"}, true},
    {"relu_grad", {"X", "Out", "Out@GRAD"}, {"X@GRAD"}, true},
};
#define N_AWARE (int)(sizeof aware_ops / sizeof aware_ops[0])

/* X and Y of an elementwise_add(_grad) in block b are declared with one
 * shape (no broadcast: a blocked operand has no broadcast addressing). */
static bool same_shape_xy(const pe_program *p, const pe_block *b, const pe_op_desc *op) {
  const pe_slot *xs = pe_op_find_input(op, "X"), *ys = pe_op_find_input(op, "Y");
  if (!xs || xs->n != 1 || !ys || ys->n != 1) return false;
  const pe_var_desc *x = pe_block_find_var(p, b, xs->args[0]);
  const pe_var_desc *y = pe_block_find_var(p, b, ys->args[0]);
  return x && y && pe_shape_equal(&x->shape, &y->shape);
}

/* The aware row of op in block b, or NULL: pool2d_grad's own loops cover
 * max pooling with Out only (pool.c); elementwise_add only without
 * broadcast. */
static const aware_op *aware_of(const pe_program *p, const pe_block *b, const pe_op_desc *op) {
  for (int k = 0; k < N_AWARE; k++) {
    if (strcmp(op->type, aware_ops[k].type) != 0) continue;
    if (strcmp(op->type, "pool2d_grad") == 0) {
      const pe_op_def *def = pe_op_lookup(op->type);
      const pe_slot *out = pe_op_find_input(op, "Out");
      if (!def || strcmp(pe_attr_s(def, op, "pooling_type"), "max") != 0 || !out || out->n != 1)
        return NULL;
    }
    if (strncmp(op->type, "elementwise_add", 15) == 0 && !same_shape_xy(p, b, op)) return NULL;
    return &aware_ops[k];
  }
  return NULL;
}

static bool listed(const char *const *names, int n, const char *slot) {
  for (int i = 0; i < n && names[i]; i++)
    if (strcmp(names[i], slot) == 0) return true;
  return false;
}

typedef struct var_use {
  int accesses, aware; /* writes + reads, and those through aware slots */
  int writes;
  bool blocked;
} var_use;

typedef struct layout_ctx {
  pe_strmap idx; /* name -> 1 + index in uses */
  var_use *uses;
  int n, cap;
} layout_ctx;

static var_use *use_of(layout_ctx *x, const char *name, bool add) {
  intptr_t i = (intptr_t)pe_strmap_get(&x->idx, name);
  if (i) return &x->uses[i - 1];
  if (!add) return NULL;
  if (x->n == x->cap) {
    int nc = x->cap ? 2 * x->cap : 64;
    var_use *nu = realloc(x->uses, (size_t)nc * sizeof *nu);
    if (!nu) return NULL;
    x->uses = nu;
    x->cap = nc;
  }
  if (!pe_strmap_put(&x->idx, name, (void *)(intptr_t)(x->n + 1))) return NULL;
  x->uses[x->n] = (var_use){0};
  return &x->uses[x->n++];
}

/* Count every arg of op; false on out of memory. */
static bool count_op(layout_ctx *x, const aware_op *a, const pe_op_desc *op) {
  for (int dir = 0; dir < 2; dir++) {
    const pe_slot *sl = dir ? op->out : op->in;
    for (int s = 0; s < (dir ? op->n_out : op->n_in); s++) {
      bool aware =
          a && (dir ? listed(a->out, AWARE_OUT, sl[s].name) : listed(a->in, AWARE_IN, sl[s].name));
      for (int k = 0; k < sl[s].n; k++) {
        var_use *u = use_of(x, sl[s].args[k], true);
        if (!u) return false;
        u->accesses++;
        u->aware += aware;
        u->writes += dir;
      }
    }
  }
  return true;
}

/* Every argument of slot s is blocked (a tied op's slot may hold several:
 * sum's X). */
static bool is_blocked(layout_ctx *x, const pe_slot *s) {
  if (!s || s->n < 1) return false;
  for (int k = 0; k < s->n; k++) {
    var_use *u = use_of(x, s->args[k], false);
    if (!u || !u->blocked) return false;
  }
  return true;
}

/* Count the listed arguments of op that are blocked and plain, or (unblock)
 * make them all plain. */
static void walk_group(layout_ctx *x, const pe_op_desc *op, const aware_op *a, int *blocked,
                       int *plain, bool unblock) {
  for (int dir = 0; dir < 2; dir++)
    for (int i = 0; i < (dir ? AWARE_OUT : AWARE_IN); i++) {
      const char *name = dir ? a->out[i] : a->in[i];
      const pe_slot *s = !name ? NULL
                         : dir ? pe_op_find_output(op, name)
                               : pe_op_find_input(op, name);
      for (int k = 0; s && k < s->n; k++) {
        var_use *u = use_of(x, s->args[k], false);
        if (unblock && u)
          u->blocked = false;
        else if (!unblock)
          *(u && u->blocked ? blocked : plain) += 1;
      }
    }
}

/* Unblock every listed argument of tied op `op` when one of them is plain;
 * true when it changed anything. */
static bool tie_group(layout_ctx *x, const pe_op_desc *op, const aware_op *a) {
  if (!a || !a->tied) return false;
  int blocked = 0, plain = 0;
  walk_group(x, op, a, &blocked, &plain, false);
  if (!blocked || !plain) return false;
  walk_group(x, op, a, NULL, NULL, true);
  return true;
}

/* Unblock the pair of a fused relu's gradient that is blocked on one side
 * only; true when it changed anything. */
static bool tie_relu_grad(layout_ctx *x, const pe_op_desc *op) {
  if (strcmp(op->type, "conv2d_grad") != 0) return false;
  const pe_op_def *def = pe_op_lookup(op->type);
  if (!def || strcmp(pe_attr_s(def, op, "fuse_activation"), "relu") != 0) return false;
  const pe_slot *o = pe_op_find_input(op, "Output"), *g = pe_op_find_input(op, "Output@GRAD");
  if (is_blocked(x, o) == is_blocked(x, g)) return false;
  const pe_slot *b = is_blocked(x, o) ? o : g;
  use_of(x, b->args[0], false)->blocked = false;
  return true;
}

/* The "layout_blocked" bits of an aware op. */
static int64_t op_bits(layout_ctx *x, const pe_op_desc *op, const aware_op *a) {
  const pe_op_def *def = pe_op_lookup(op->type);
  int64_t bits = 0;
  for (int i = 0; i < AWARE_IN && a->in[i]; i++)
    if (is_blocked(x, pe_op_find_input(op, a->in[i])))
      bits |= (int64_t)1 << pe_op_input_index(def, a->in[i]);
  for (int i = 0; i < AWARE_OUT && a->out[i]; i++)
    if (is_blocked(x, pe_op_find_output(op, a->out[i])))
      bits |= (int64_t)1 << (PE_LAYOUT_OUT_BIT + pe_op_output_index(def, a->out[i]));
  return bits;
}

/* The loss and the options' keep names, as a set (the list may be as long
 * as the program). False on out of memory. */
static bool index_kept(const pe_ir *ir, pe_strmap *kept) {
  const pe_pass_opts *o = ir->opts;
  const char *loss = o && o->loss ? o->loss : ir->prog->loss;
  if (loss && !pe_strmap_put(kept, loss, NULL)) return false;
  for (int k = 0; o && k < o->n_keep; k++)
    if (o->keep[k] && !pe_strmap_put(kept, o->keep[k], NULL)) return false;
  return true;
}

static pe_status *oom(void) {
  return pe_error(PE_ENOMEM, "layout_blocked: out of memory");
}

#define BLOCKED_SUFFIX "@BLOCKED"

/* name@BLOCKED, malloc'ed (NULL: out of memory). */
static char *blocked_name(const char *name) {
  size_t n = strlen(name) + sizeof BLOCKED_SUFFIX;
  char *nn = malloc(n);
  if (nn) snprintf(nn, n, "%s" BLOCKED_SUFFIX, name);
  return nn;
}

/* Declare name@BLOCKED like name, and note on name that op holds it. */
static pe_status *declare_blocked(pe_block *b, const pe_op_desc *op, const char *name) {
  pe_var_desc *d = pe_block_find_var_local(b, name), *nd;
  if (!d) return NULL; /* only local temporaries are candidates */
  char *bn = blocked_name(name), note[256];
  if (!bn) return oom();
  pe_status *st = pe_block_add_var(b, bn, d->dtype, &d->shape, &nd);
  if (!st) {
    nd->stop_gradient = d->stop_gradient;
    snprintf(note, sizeof note, "%s writing '%.64s' (oneDNN's blocked layout)", op->type, bn);
    free(d->fused_into);
    if (!(d->fused_into = strdup(note))) st = oom();
  }
  free(bn);
  return st;
}

/* Every arg of op that names a blocked variable names its @BLOCKED one. */
static pe_status *rename_blocked(layout_ctx *x, pe_op_desc *op) {
  for (int dir = 0; dir < 2; dir++) {
    pe_slot *sl = dir ? op->out : op->in;
    for (int s = 0; s < (dir ? op->n_out : op->n_in); s++)
      for (int k = 0; k < sl[s].n; k++) {
        var_use *u = use_of(x, sl[s].args[k], false);
        if (!u || !u->blocked) continue;
        char *nn = blocked_name(sl[s].args[k]);
        if (!nn) return oom();
        free(sl[s].args[k]);
        sl[s].args[k] = nn;
      }
  }
  return NULL;
}

pe_status *pe_pass_layout_blocked(pe_ir *ir) {
  const pe_pass_opts *o = ir->opts;
  if (!o || !o->fuse_conv_act || o->place_kind == PE_PLACE_CUDA ||
      pe_conv_layout_get_mode() != PE_CONV_LAYOUT_BLOCKED)
    return NULL;
  pe_program *p = ir->prog;
  pe_block *b = pe_program_main(p);
  if (!b || p->n_blocks > 2) return NULL;
  layout_ctx x = {0};
  pe_strmap kept;
  pe_strmap_init(&x.idx);
  pe_strmap_init(&kept);
  pe_status *st = index_kept(ir, &kept) ? NULL : oom();
  const aware_op **aw = calloc((size_t)b->n_ops + 1, sizeof *aw);
  if (!aw) st = oom();
  for (int i = 0; i < b->n_ops && !st; i++) {
    aw[i] = aware_of(p, b, b->ops[i]);
    if (!count_op(&x, aw[i], b->ops[i])) st = oom();
  }
  for (int v = 0; v < b->n_vars && !st; v++) {
    const pe_var_desc *d = b->vars[v];
    var_use *u = use_of(&x, d->name, false);
    bool temp = d->dtype == PE_F32 && !d->persistable && !d->is_feed;
    if (u && temp && !pe_strmap_has(&kept, d->name))
      u->blocked = u->writes == 1 && u->accesses > 1 && u->aware == u->accesses;
  }
  for (bool changed = true; changed && !st;) {
    changed = false;
    for (int i = 0; i < b->n_ops; i++)
      changed |= tie_relu_grad(&x, b->ops[i]) | tie_group(&x, b->ops[i], aw[i]);
  }
  for (int i = 0; i < b->n_ops && !st; i++)
    if (aw[i]) st = pe_op_set_int(b->ops[i], PE_LAYOUT_ATTR, op_bits(&x, b->ops[i], aw[i]));
  for (int i = 0; i < b->n_ops && !st; i++)
    for (int o = 0; aw[i] && o < AWARE_OUT && aw[i]->out[o] && !st; o++) {
      const pe_slot *out = pe_op_find_output(b->ops[i], aw[i]->out[o]);
      for (int k = 0; out && k < out->n && !st; k++) {
        var_use *u = use_of(&x, out->args[k], false);
        if (u && u->blocked) st = declare_blocked(b, b->ops[i], out->args[k]);
      }
    }
  for (int i = 0; i < b->n_ops && !st; i++) st = rename_blocked(&x, b->ops[i]);
  pe_strmap_destroy(&x.idx);
  pe_strmap_destroy(&kept);
  free(x.uses);
  free(aw);
  return st;
}
