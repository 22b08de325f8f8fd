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
 * validate, before fuse_add_act (pass_fuse_add_act.c: a bias add + relu
 * goes to its product first). The index of uses and the shared conditions
 * are pass_fuse.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/pass_fuse.h"
#include "core/log.h"
#include "ops/registry.h"

/* The op at j is elementwise_add(X = t, Y = [o] f32) with axis axes[0] or
 * axes[1]: its Y, else NULL. */
static const char *bias_of(const pe_fuse_ctx *f, int j, const char *t, int64_t o,
                           const int64_t axes[2]) {
  const pe_op_desc *add = f->b->ops[j];
  if (strcmp(add->type, "elementwise_add") != 0) return NULL;
  const char *x = pe_fuse_arg1(pe_op_find_input(add, "X")),
             *y = pe_fuse_arg1(pe_op_find_input(add, "Y"));
  const pe_op_def *def = pe_op_lookup(add->type);
  if (!def || !x || !y || strcmp(x, t) != 0 || strcmp(y, t) == 0 ||
      !pe_fuse_arg1(pe_op_find_output(add, "Out")))
    return NULL;
  int64_t axis = pe_attr_i(def, add, "axis");
  if (axis != axes[0] && axis != axes[1]) return NULL;
  const pe_var_desc *v = pe_block_find_var(f->p, f->b, y);
  if (!v || v->dtype != PE_F32 || v->shape.ndim != 1 || o < 0 || v->shape.d[0] != o) return NULL;
  return y;
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
static int bias_add_after(const pe_fuse_ctx *f, const fuse_producer *pr, const pe_op_def *def,
                          int i, const char *t1, const char **bias) {
  const pe_op_desc *op = f->b->ops[i];
  const char *wname = pe_fuse_arg1(pe_op_find_input(op, pr->w_slot));
  const pe_var_desc *w = wname ? pe_block_find_var(f->p, f->b, wname) : NULL;
  int64_t o, axes[2];
  if (pe_op_find_input(op, "Bias") || !w || !pr->bias_spec(def, op, w, &o, axes)) return -1;
  int j = pe_fuse_sole_reader(f, t1);
  *bias = j > i ? bias_of(f, j, t1, o, axes) : NULL;
  if (!*bias || pe_fuse_used_between(f, *bias, i, j, false)) return -1;
  return j;
}

/* Try the pattern at op i; counts[k] counts rewrites of producers[k]. */
static pe_status *fuse_at(pe_fuse_ctx *f, int i, int *counts) {
  pe_op_desc *op = f->b->ops[i];
  int pk = -1;
  for (int k = 0; k < N_PRODUCERS; k++)
    if (strcmp(op->type, producers[k].type) == 0) pk = k;
  const fuse_producer *pr = pk >= 0 ? &producers[pk] : NULL;
  const pe_op_def *def = pr ? pe_op_lookup(pr->type) : NULL;
  if (!def || pe_attr_s(def, op, "fuse_activation")[0]) return NULL;
  const char *t1 = pe_fuse_arg1(pe_op_find_output(op, pr->out_slot)), *bias = NULL, *t2 = t1;
  if (!t1) return NULL;
  int j = -1; /* the bias add */
  if (pr->bias_spec) {
    j = bias_add_after(f, pr, def, i, t1, &bias);
    if (j < 0) return NULL;
    t2 = pe_fuse_arg1(pe_op_find_output(f->b->ops[j], "Out"));
  }
  int k = pe_fuse_relu_after(f, j > i ? j : i, t2);
  if (!bias && k < 0) return NULL;
  const char *out = k >= 0 ? pe_fuse_arg1(pe_op_find_output(f->b->ops[k], "Out")) : t2;
  /* The names fused away: the producer's output, and the sum's with a relu. */
  char what[96];
  snprintf(what, sizeof what, "%s%s%s", op->type, bias ? "+bias add" : "", k >= 0 ? "+relu" : "");
  PE_TRY(pe_fuse_note(f, t1, op, out, what));
  if (t2 != t1 && k >= 0) PE_TRY(pe_fuse_note(f, t2, op, out, what));
  pe_fuse_absorb(f, i, (int[]){j > i ? j : -1, k}, 2);
  if (bias) PE_TRY(pe_op_input1(op, "Bias", bias));
  if (k >= 0) {
    PE_TRY(pe_op_output1(op, pr->out_slot, out));
    PE_TRY(pe_op_set_string(op, "fuse_activation", "relu"));
  } else {
    PE_TRY(pe_op_output1(op, pr->out_slot, t2));
  }
  PE_TRY(pe_fuse_recount(f, i));
  counts[pk]++;
  return NULL;
}

pe_status *pe_pass_fuse_conv_act(pe_ir *ir) {
  int counts[N_PRODUCERS] = {0};
  PE_TRY(pe_fuse_run(ir, "fuse_conv_act", fuse_at, counts));
  if (counts[0] || counts[1] || counts[2])
    PE_LOGD(
        "fuse_conv_act: %d conv2d and %d matmul with their bias (and relu), %d batch_norm "
        "with its relu fused",
        counts[0], counts[1], counts[2]);
  return NULL;
}
