/* The fuse_add_act pass: elementwise_add(X, Y) -> relu, X and Y of the same
 * shape (a residual block's sum of its branch and its shortcut), becomes
 * one elementwise_add with fuse_activation "relu" (ops/cpu/elementwise.c).
 *
 * Why: unfused, the sum is written, read back by the relu and written
 * again, and backward relu_grad writes a masked copy of the gradient that
 * elementwise_add_grad then copies to both operands' gradients; fused, the
 * forward is one pass (read X and Y, write relu(X + Y)) and the gradient
 * one pass that masks Out@GRAD by Out > 0 into X@GRAD and Y@GRAD.
 *
 * A program pass, run before backward, after fuse_conv_act (which takes a
 * bias add + relu into its product first: its Y is [O], never of X's
 * shape). The fused op's gradient is elementwise_add_grad, generated like
 * any op's, with the fused Out (its mask) and the attribute. Conditions,
 * each making the rewrite invisible to the user (pass_fuse.h): the sum is
 * a fusable temporary read only by the relu; no op between the add and the
 * relu reads or writes the relu's output; X and Y are f32 with the same
 * declared shape; the add has no activation yet. The sum's declaration
 * stays, noting the op it was fused into (a fetch of it says so). Like
 * fuse_conv_act it runs only with opts->fuse_conv_act (the daemon's op
 * fusion, RegisterOptions.no_op_fusion turns both off), not on cuda places
 * (cuda's elementwise_add takes no activation). */
#include <stdbool.h>
#include <string.h>

#include "compiler/pass_fuse.h"
#include "core/log.h"
#include "ops/registry.h"

/* X and Y of op `add` are f32 with the same declared shape. */
static bool same_shape_operands(const pe_fuse_ctx *f, const pe_op_desc *add) {
  const char *x = pe_fuse_arg1(pe_op_find_input(add, "X"));
  const char *y = pe_fuse_arg1(pe_op_find_input(add, "Y"));
  const pe_var_desc *xv = x ? pe_block_find_var(f->p, f->b, x) : NULL;
  const pe_var_desc *yv = y ? pe_block_find_var(f->p, f->b, y) : NULL;
  return xv && yv && xv->dtype == PE_F32 && yv->dtype == PE_F32 && xv->shape.ndim > 0 &&
         pe_shape_equal(&xv->shape, &yv->shape);
}

static pe_status *fuse_at(pe_fuse_ctx *f, int i, int *count) {
  pe_op_desc *add = f->b->ops[i];
  if (strcmp(add->type, "elementwise_add") != 0) return NULL;
  const pe_op_def *def = pe_op_lookup(add->type);
  const char *t = pe_fuse_arg1(pe_op_find_output(add, "Out"));
  if (!def || !t || pe_attr_s(def, add, "fuse_activation")[0] || !same_shape_operands(f, add))
    return NULL;
  int k = pe_fuse_relu_after(f, i, t);
  if (k < 0) return NULL;
  const char *out = pe_fuse_arg1(pe_op_find_output(f->b->ops[k], "Out"));
  PE_TRY(pe_fuse_note(f, t, add, out, "elementwise_add+relu"));
  pe_fuse_absorb(f, i, &k, 1);
  PE_TRY(pe_op_output1(add, "Out", out));
  PE_TRY(pe_op_set_string(add, "fuse_activation", "relu"));
  PE_TRY(pe_fuse_recount(f, i));
  (*count)++;
  return NULL;
}

pe_status *pe_pass_fuse_add_act(pe_ir *ir) {
  int count = 0;
  PE_TRY(pe_fuse_run(ir, "fuse_add_act", fuse_at, &count));
  if (count) PE_LOGD("fuse_add_act: %d elementwise_add with its relu fused", count);
  return NULL;
}
