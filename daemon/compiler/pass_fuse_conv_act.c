/* The fuse_conv_act pass: conv2d -> elementwise_add (per-channel bias) ->
 * relu becomes one conv2d with a Bias input and fuse_activation "relu"
 * (ops/cpu/conv.c), and conv2d -> bias add alone one conv2d with Bias; a
 * fully-connected layer, matmul -> elementwise_add (per-column bias) ->
 * relu, likewise becomes one matmul with Bias (and relu) (ops/cpu/matmul.c);
 * batch_norm -> relu (no bias add: batch norm has its own shift) becomes
 * one batch_norm with fuse_activation "relu" (ops/cpu/batch_norm.c). The
 * name stays: it is the daemon's op-fusion pass for all three.
 *
 * Why: the bias add and the relu each stream the whole activation through
 * memory once forward (read and write) and their gradients twice more
 * backward (elementwise_add_grad copies Out@GRAD and reduces it; relu_grad
 * masks it), while oneDNN applies the bias and a relu post-op to the
 * product's output block while it is in cache; backward the fused op
 * masks once and sums the bias gradient on the way (conv: in its weights
 * pass; matmul: in the masking pass); batch norm applies the relu in the
 * pass that writes Y and masks Y@GRAD as its two backward passes read it.
 * Seed 001's build strategies fuse element-wise ops into their producers
 * for the same reason.
 *
 * A program pass, run before backward: the fused op's gradient is
 * generated like any op's (conv2d_grad / matmul_grad with Bias@GRAD,
 * batch_norm_grad with Y, masking with the fused output). Conditions, each
 * making the rewrite invisible to the user:
 *   - the intermediate (the producer's output, and the sum's when relu is
 *     fused too) is an f32 temporary: not persistable, not a feed, not the
 *     loss, not kept fetchable (opts->keep), written by exactly one op and
 *     read by exactly one (the next op of the pattern, through X); no op
 *     between the producer and the relu reads or writes the relu's output
 *     (the producer now writes it where it runs);
 *   - the add's Y is f32 of shape [O] and the add's axis puts it on the
 *     output's channels: conv2d, O filters, axis 1; matmul with a 2-D Y
 *     split at y_num_col_dims 1, O its columns (Out's last dim), axis
 *     x_num_col_dims (the builder's fc) or -1 (numpy: trailing); no op
 *     between the product and the add writes that Y (the product reads it
 *     where the add did);
 *   - the producer has no fused Bias or activation yet; the program has
 *     only a main and a startup block (no sub-block could read an
 *     intermediate).
 * The intermediates' declarations stay (unused), each noting the op it was
 * fused into (pe_var_desc.fused_into: a fetch of it says so). The pass does nothing
 * unless opts->fuse_conv_act is set, nor on cuda places (cuda's conv2d,
 * matmul and batch_norm kernels take no Bias or activation);
 * pe_graph_compile and pe_program_compile_opts run it after the first
 * validate. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/pass.h"
#include "core/log.h"
#include "ops/registry.h"

/* The uses of one name in the block, so that each question the pass asks
 * costs the name's uses, not a scan of the block (which made a 48k-op
 * program's register take minutes). A fusion at op i rewrites op i, marks
 * the bias add and the relu dead (dropped at the end, so op indexes stay
 * put) and updates the counts. The op lists are never updated: they are
 * searched only after the op being fused, where each op is as built or
 * dead. */
typedef struct name_uses {
  int n_w, n_r;  /* live args writing / reading the name */
  int64_t sum_r; /* sum of the reading ops' indexes: the reader when n_r == 1 */
  int n_ops, cap_ops;
  int *ops; /* ops using it as built, increasing */
} name_uses;

typedef struct fuse_ctx {
  const pe_program *p;
  pe_block *b;
  const pe_pass_opts *o;
  pe_strmap uses; /* name -> name_uses */
  bool *dead;     /* [b->n_ops] removed by a fusion */
} fuse_ctx;

/* How many args of op name `name` among its inputs (or outputs). */
static int op_uses(const pe_op_desc *op, const char *name, bool writes) {
  int n = 0, ns = writes ? op->n_out : op->n_in;
  const pe_slot *sl = writes ? op->out : op->in;
  for (int s = 0; s < ns; s++)
    for (int a = 0; a < sl[s].n; a++) n += strcmp(sl[s].args[a], name) == 0;
  return n;
}

static name_uses *uses_get(fuse_ctx *f, const char *name) {
  name_uses *u = pe_strmap_get(&f->uses, name);
  if (u) return u;
  u = calloc(1, sizeof *u);
  if (u && !pe_strmap_put(&f->uses, name, u)) {
    free(u);
    u = NULL;
  }
  return u;
}

/* Count op i's args into the index (sign 1) or out of it (-1); build also
 * lists op i under each name. False on out of memory. */
static bool index_op(fuse_ctx *f, int i, int sign, bool build) {
  const pe_op_desc *op = f->b->ops[i];
  for (int dir = 0; dir < 2; dir++) {
    const pe_slot *sl = dir ? op->out : op->in;
    for (int s = 0; s < (dir ? op->n_out : op->n_in); s++)
      for (int a = 0; a < sl[s].n; a++) {
        name_uses *u = uses_get(f, sl[s].args[a]);
        if (!u) return false;
        if (dir) {
          u->n_w += sign;
        } else {
          u->n_r += sign;
          u->sum_r += sign * (int64_t)i;
        }
        if (!build || (u->n_ops && u->ops[u->n_ops - 1] == i)) continue;
        if (u->n_ops == u->cap_ops) {
          int nc = u->cap_ops ? 2 * u->cap_ops : 4;
          int *no = realloc(u->ops, (size_t)nc * sizeof *no);
          if (!no) return false;
          u->ops = no;
          u->cap_ops = nc;
        }
        u->ops[u->n_ops++] = i;
      }
  }
  return true;
}

static void index_free(fuse_ctx *f) {
  for (size_t i = 0; i < f->uses.cap; i++)
    if (f->uses.slots[i].key) {
      name_uses *u = f->uses.slots[i].value;
      free(u->ops);
      free(u);
    }
  pe_strmap_destroy(&f->uses);
  free(f->dead);
}

static bool kept(const fuse_ctx *f, const char *name) {
  const char *loss = f->o && f->o->loss ? f->o->loss : f->p->loss;
  if (loss && strcmp(loss, name) == 0) return true;
  for (int k = 0; f->o && k < f->o->n_keep; k++)
    if (f->o->keep[k] && strcmp(f->o->keep[k], name) == 0) return true;
  return false;
}

/* The index of the only op reading `name` when it is a temporary written
 * once and read once; else -1. */
static int sole_reader(const fuse_ctx *f, const char *name) {
  const pe_var_desc *v = pe_block_find_var_local(f->b, name);
  if (!v || v->dtype != PE_F32 || v->persistable || v->is_feed || kept(f, name)) return -1;
  const name_uses *u = pe_strmap_get(&f->uses, name);
  return u && u->n_w == 1 && u->n_r == 1 ? (int)u->sum_r : -1;
}

static const char *arg1(const pe_slot *s) {
  return s && s->n == 1 ? s->args[0] : NULL;
}

/* The op at j is elementwise_add(X = t, Y = [o] f32) with axis axes[0] or
 * axes[1]: its Y, else NULL. */
static const char *bias_of(const fuse_ctx *f, int j, const char *t, int64_t o,
                           const int64_t axes[2]) {
  const pe_op_desc *add = f->b->ops[j];
  if (strcmp(add->type, "elementwise_add") != 0) return NULL;
  const char *x = arg1(pe_op_find_input(add, "X")), *y = arg1(pe_op_find_input(add, "Y"));
  const pe_op_def *def = pe_op_lookup(add->type);
  if (!def || !x || !y || strcmp(x, t) != 0 || strcmp(y, t) == 0 ||
      !arg1(pe_op_find_output(add, "Out")))
    return NULL;
  int64_t axis = pe_attr_i(def, add, "axis");
  if (axis != axes[0] && axis != axes[1]) return NULL;
  const pe_var_desc *v = pe_block_find_var(f->p, f->b, y);
  if (!v || v->dtype != PE_F32 || v->shape.ndim != 1 || o < 0 || v->shape.d[0] != o) return NULL;
  return y;
}

/* Whether a live op strictly between from and to writes `name` (or, with
 * reads, reads or writes it); from is the op being fused, so every op
 * after it is as built or dead. */
static bool used_between(const fuse_ctx *f, const char *name, int from, int to, bool reads) {
  const name_uses *u = pe_strmap_get(&f->uses, name);
  if (!u) return false;
  int lo = 0, hi = u->n_ops; /* the first listed op after from */
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (u->ops[mid] <= from)
      lo = mid + 1;
    else
      hi = mid;
  }
  for (int k = lo; k < u->n_ops && u->ops[k] < to; k++) {
    const pe_op_desc *op = f->b->ops[u->ops[k]];
    if (!f->dead[u->ops[k]] && (op_uses(op, name, true) || (reads && op_uses(op, name, false))))
      return true;
  }
  return false;
}

/* The relu that is the only reader (after op i) of temporary t, with no op
 * between i and it using its output: its index, else -1. */
static int relu_after(const fuse_ctx *f, int i, const char *t) {
  int k = sole_reader(f, t);
  const pe_op_desc *relu = k > i ? f->b->ops[k] : NULL;
  if (!relu || strcmp(relu->type, "relu") != 0) return -1;
  const char *rx = arg1(pe_op_find_input(relu, "X")), *out = arg1(pe_op_find_output(relu, "Out"));
  if (!rx || strcmp(rx, t) != 0 || !out || used_between(f, out, i, k, true)) return -1;
  return k;
}

/* A fusable producer: its type, output and weight slots, and how its
 * bias add looks (the bias length from the weight's shape, the add's
 * accepted axes); bias_spec returns false when the op cannot take a Bias,
 * and is NULL for a producer fused with a relu alone (batch_norm). */
typedef struct fuse_producer {
  const char *type, *out_slot, *w_slot;
  bool (*bias_spec)(const pe_op_def *def, const pe_op_desc *op, const pe_var_desc *w, int64_t *o,
                    int64_t axes[2]);
} fuse_producer;

/* conv2d: one bias per filter (OIHW: O = dim 0), added per channel. */
static bool conv_bias(const pe_op_def *def, const pe_op_desc *op, const pe_var_desc *w, int64_t *o,
                      int64_t axes[2]) {
  (void)def, (void)op;
  if (w->shape.ndim != 4) return false;
  *o = w->shape.d[0];
  axes[0] = axes[1] = 1;
  return true;
}

/* matmul: one bias per column of a 2-D Y split at 1 (Out's last dim),
 * added at axis x_num_col_dims (= Out's rank - 1) or -1. */
static bool matmul_bias(const pe_op_def *def, const pe_op_desc *op, const pe_var_desc *w,
                        int64_t *o, int64_t axes[2]) {
  if (w->shape.ndim != 2 || pe_attr_i(def, op, "y_num_col_dims") != 1) return false;
  *o = w->shape.d[1];
  axes[0] = pe_attr_i(def, op, "x_num_col_dims");
  axes[1] = -1;
  return true;
}

static const fuse_producer producers[] = {
    {"conv2d", "Output", "Filter", conv_bias},
    {"matmul", "Out", "Y", matmul_bias},
    {"batch_norm", "Y", NULL, NULL},
};
#define N_PRODUCERS ((int)(sizeof producers / sizeof producers[0]))

/* The bias add after producer pr at op i (reading its output t1): its
 * index j and *bias, else -1. */
static int bias_add_after(const fuse_ctx *f, const fuse_producer *pr, const pe_op_def *def, int i,
                          const char *t1, const char **bias) {
  const pe_op_desc *op = f->b->ops[i];
  const char *wname = arg1(pe_op_find_input(op, pr->w_slot));
  const pe_var_desc *w = wname ? pe_block_find_var(f->p, f->b, wname) : NULL;
  int64_t o, axes[2];
  if (pe_op_find_input(op, "Bias") || !w || !pr->bias_spec(def, op, w, &o, axes)) return -1;
  int j = sole_reader(f, t1);
  *bias = j > i ? bias_of(f, j, t1, o, axes) : NULL;
  if (!*bias || used_between(f, *bias, i, j, false)) return -1;
  return j;
}

/* Note on intermediate `name` that op (its output out) now computes
 * through it: "matmul writing 'fc_0.tmp_2' (matmul+bias add+relu)". */
static pe_status *note_fused(fuse_ctx *f, const char *name, const pe_op_desc *op, const char *out,
                             bool bias, bool relu) {
  pe_var_desc *v = pe_block_find_var_local(f->b, name);
  if (!v) return NULL;
  char buf[256];
  snprintf(buf, sizeof buf, "%s writing '%.64s' (%s%s%s)", op->type, out, op->type,
           bias ? "+bias add" : "", relu ? "+relu" : "");
  free(v->fused_into);
  if (!(v->fused_into = strdup(buf))) return pe_error(PE_ENOMEM, "fuse_conv_act: out of memory");
  return NULL;
}

/* Try the pattern at op i; counts[k] counts rewrites of producers[k]. */
static pe_status *fuse_at(fuse_ctx *f, int i, int *counts) {
  pe_op_desc *op = f->b->ops[i];
  int pk = -1;
  for (int k = 0; k < N_PRODUCERS; k++)
    if (strcmp(op->type, producers[k].type) == 0) pk = k;
  const fuse_producer *pr = pk >= 0 ? &producers[pk] : NULL;
  const pe_op_def *def = pr ? pe_op_lookup(pr->type) : NULL;
  if (!def || pe_attr_s(def, op, "fuse_activation")[0]) return NULL;
  const char *t1 = arg1(pe_op_find_output(op, pr->out_slot)), *bias = NULL, *t2 = t1;
  if (!t1) return NULL;
  int j = -1; /* the bias add */
  if (pr->bias_spec) {
    j = bias_add_after(f, pr, def, i, t1, &bias);
    if (j < 0) return NULL;
    t2 = arg1(pe_op_find_output(f->b->ops[j], "Out"));
  }
  int k = relu_after(f, j > i ? j : i, t2);
  if (!bias && k < 0) return NULL;
  const char *out = k >= 0 ? arg1(pe_op_find_output(f->b->ops[k], "Out")) : t2;
  /* The names fused away: the producer's output, and the sum's with a relu. */
  PE_TRY(note_fused(f, t1, op, out, bias != NULL, k >= 0));
  if (t2 != t1 && k >= 0) PE_TRY(note_fused(f, t2, op, out, bias != NULL, k >= 0));
  /* Uncount op i as it was and the ops it absorbs, then count op i as
   * fused (uncounting finds every name indexed: it cannot fail). */
  index_op(f, i, -1, false);
  int absorbed[2] = {j > i ? j : -1, k};
  for (int a = 0; a < 2; a++)
    if (absorbed[a] >= 0) {
      index_op(f, absorbed[a], -1, false);
      f->dead[absorbed[a]] = true;
    }
  if (bias) PE_TRY(pe_op_input1(op, "Bias", bias));
  if (k >= 0) {
    PE_TRY(pe_op_output1(op, pr->out_slot, out));
    PE_TRY(pe_op_set_string(op, "fuse_activation", "relu"));
  } else {
    PE_TRY(pe_op_output1(op, pr->out_slot, t2));
  }
  if (!index_op(f, i, 1, false)) return pe_error(PE_ENOMEM, "fuse_conv_act: out of memory");
  counts[pk]++;
  return NULL;
}

/* Drop the dead ops, keeping the order. */
static void compact(fuse_ctx *f) {
  pe_block *b = f->b;
  int w = 0;
  for (int i = 0; i < b->n_ops; i++) {
    if (f->dead[i])
      pe_op_desc_free(b->ops[i]);
    else
      b->ops[w++] = b->ops[i];
  }
  b->n_ops = w;
}

pe_status *pe_pass_fuse_conv_act(pe_ir *ir) {
  const pe_pass_opts *o = ir->opts;
  if (!o || !o->fuse_conv_act || o->place_kind == PE_PLACE_CUDA) return NULL;
  pe_program *p = ir->prog;
  pe_block *b = pe_program_main(p);
  if (!b || p->n_blocks > 2) return NULL;
  fuse_ctx f = {p, b, ir->opts};
  pe_strmap_init(&f.uses);
  f.dead = calloc((size_t)b->n_ops + 1, sizeof *f.dead);
  pe_status *st = f.dead ? NULL : pe_error(PE_ENOMEM, "fuse_conv_act: out of memory");
  for (int i = 0; i < b->n_ops && !st; i++)
    if (!index_op(&f, i, 1, true)) st = pe_error(PE_ENOMEM, "fuse_conv_act: out of memory");
  int counts[N_PRODUCERS] = {0};
  /* fuse_at marks ops after i dead only. */
  for (int i = 0; i < b->n_ops && !st; i++)
    if (!f.dead[i]) st = fuse_at(&f, i, counts);
  if (f.dead) compact(&f);
  index_free(&f);
  if (st) return st;
  if (counts[0] || counts[1] || counts[2])
    PE_LOGD(
        "fuse_conv_act: %d conv2d and %d matmul with their bias (and relu), %d batch_norm "
        "with its relu fused",
        counts[0], counts[1], counts[2]);
  return NULL;
}
