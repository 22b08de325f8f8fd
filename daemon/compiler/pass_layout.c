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
 * A fused relu's gradient masks Output@GRAD with Output elementwise, so the
 * two are blocked together or not at all (resolved to a fixed point).
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

typedef struct aware_op {
  const char *type;
  const char *in[3], *out[1];
} aware_op;

static const aware_op aware_ops[] = {
    {"conv2d", {"Input"}, {"Output"}},
    {"conv2d_grad", {"Input", "Output", "Output@GRAD"}, {"Input@GRAD"}},
    {"pool2d", {"X"}, {"Out"}},
    {"pool2d_grad", {"X", "Out", "Out@GRAD"}, {"X@GRAD"}},
};
#define N_AWARE (int)(sizeof aware_ops / sizeof aware_ops[0])

/* The aware row of op, or NULL: pool2d_grad's own loops cover max pooling
 * with Out only (pool.c). */
static const aware_op *aware_of(const pe_op_desc *op) {
  for (int k = 0; k < N_AWARE; k++) {
    if (strcmp(op->type, aware_ops[k].type) != 0) continue;
    if (strcmp(op->type, "pool2d_grad") == 0) {
      const pe_op_def *def = pe_op_lookup(op->type);
      const pe_slot *out = pe_op_find_input(op, "Out");
      if (!def || strcmp(pe_attr_s(def, op, "pooling_type"), "max") != 0 || !out || out->n != 1)
        return NULL;
    }
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
static bool count_op(layout_ctx *x, const pe_op_desc *op) {
  const aware_op *a = aware_of(op);
  for (int dir = 0; dir < 2; dir++) {
    const pe_slot *sl = dir ? op->out : op->in;
    for (int s = 0; s < (dir ? op->n_out : op->n_in); s++) {
      bool aware = a && (dir ? listed(a->out, 1, sl[s].name) : listed(a->in, 3, sl[s].name));
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

static bool is_blocked(layout_ctx *x, const pe_slot *s) {
  if (!s || s->n != 1) return false;
  var_use *u = use_of(x, s->args[0], false);
  return u && u->blocked;
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
  for (int i = 0; i < 3 && a->in[i]; i++)
    if (is_blocked(x, pe_op_find_input(op, a->in[i])))
      bits |= (int64_t)1 << pe_op_input_index(def, a->in[i]);
  if (is_blocked(x, pe_op_find_output(op, a->out[0])))
    bits |= (int64_t)1 << (PE_LAYOUT_OUT_BIT + pe_op_output_index(def, a->out[0]));
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
  for (int i = 0; i < b->n_ops && !st; i++)
    if (!count_op(&x, b->ops[i])) st = oom();
  for (int v = 0; v < b->n_vars && !st; v++) {
    const pe_var_desc *d = b->vars[v];
    var_use *u = use_of(&x, d->name, false);
    bool temp = d->dtype == PE_F32 && !d->persistable && !d->is_feed;
    if (u && temp && !pe_strmap_has(&kept, d->name))
      u->blocked = u->writes == 1 && u->accesses > 1 && u->aware == u->accesses;
  }
  for (bool changed = true; changed && !st;) {
    changed = false;
    for (int i = 0; i < b->n_ops; i++) changed |= tie_relu_grad(&x, b->ops[i]);
  }
  for (int i = 0; i < b->n_ops && !st; i++) {
    const aware_op *a = aware_of(b->ops[i]);
    if (a) st = pe_op_set_int(b->ops[i], PE_LAYOUT_ATTR, op_bits(&x, b->ops[i], a));
  }
  for (int i = 0; i < b->n_ops && !st; i++) {
    const aware_op *a = aware_of(b->ops[i]);
    const pe_slot *out = a ? pe_op_find_output(b->ops[i], a->out[0]) : NULL;
    if (is_blocked(&x, out)) st = declare_blocked(b, b->ops[i], out->args[0]);
  }
  for (int i = 0; i < b->n_ops && !st; i++) st = rename_blocked(&x, b->ops[i]);
  pe_strmap_destroy(&x.idx);
  pe_strmap_destroy(&kept);
  free(x.uses);
  return st;
}
