/* The fuse_conv_act pass: conv2d -> elementwise_add (per-channel bias) ->
 * relu becomes one conv2d with a Bias input and fuse_activation "relu"
 * (ops/cpu/conv.c), and conv2d -> bias add alone one conv2d with Bias.
 *
 * Why: the bias add and the relu each stream the whole activation through
 * memory once forward (read and write) and their gradients twice more
 * backward (elementwise_add_grad copies Out@GRAD and reduces it; relu_grad
 * masks it), while oneDNN applies the bias and a relu post-op to the
 * convolution's output block while it is in cache, and its weights pass
 * computes the bias gradient on the way. Seed 001's build strategies fuse
 * element-wise ops into their producers for the same reason.
 *
 * A program pass, run before backward: the fused conv2d's gradient is
 * generated like any op's (conv2d_grad with Bias@GRAD, masking with the
 * fused Output). Conditions, each making the rewrite invisible to the user:
 *   - the intermediate (the conv's output, and the sum's when relu is fused
 *     too) is an f32 temporary: not persistable, not a feed, not the loss,
 *     not kept fetchable (opts->keep), written by exactly one op and read by
 *     exactly one (the next op of the pattern, through X);
 *   - the add has axis 1 and a Y of shape [O] (O: the filter count), f32,
 *     that no op between the conv and the add writes (the conv reads it
 *     where the add did);
 *   - the conv has no Bias or activation yet; the program has only a main
 *     and a startup block (no sub-block could read an intermediate).
 * The intermediates' declarations stay (unused). The pass does nothing
 * unless opts->fuse_conv_act is set, nor on cuda places (cuda's conv2d
 * kernel takes no Bias); pe_graph_compile and pe_program_compile_opts run
 * it after the first validate. */
#include <string.h>

#include "compiler/pass.h"
#include "core/log.h"
#include "ops/registry.h"

typedef struct fuse_ctx {
  const pe_program *p;
  pe_block *b;
  const pe_pass_opts *o;
} fuse_ctx;

/* How many ops of the block read (or write) `name`, and the last one. */
static int count_uses(const pe_block *b, const char *name, bool writes, int *last) {
  int n = 0;
  for (int i = 0; i < b->n_ops; i++) {
    const pe_op_desc *op = b->ops[i];
    int ns = writes ? op->n_out : op->n_in;
    const pe_slot *sl = writes ? op->out : op->in;
    for (int s = 0; s < ns; s++)
      for (int a = 0; a < sl[s].n; a++)
        if (strcmp(sl[s].args[a], name) == 0) {
          n++;
          *last = i;
        }
  }
  return n;
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
  int w, r;
  if (count_uses(f->b, name, true, &w) != 1 || count_uses(f->b, name, false, &r) != 1) return -1;
  return r;
}

static const char *arg1(const pe_slot *s) {
  return s && s->n == 1 ? s->args[0] : NULL;
}

/* The op at j is elementwise_add(X = t, Y = [O] f32, axis 1): its Y, else NULL. */
static const char *bias_of(const fuse_ctx *f, int j, const char *t, int64_t o) {
  const pe_op_desc *add = f->b->ops[j];
  if (strcmp(add->type, "elementwise_add") != 0) return NULL;
  const char *x = arg1(pe_op_find_input(add, "X")), *y = arg1(pe_op_find_input(add, "Y"));
  const pe_op_def *def = pe_op_lookup(add->type);
  if (!def || !x || !y || strcmp(x, t) != 0 || strcmp(y, t) == 0 ||
      pe_attr_i(def, add, "axis") != 1 || !arg1(pe_op_find_output(add, "Out")))
    return NULL;
  const pe_var_desc *v = pe_block_find_var(f->p, f->b, y);
  if (!v || v->dtype != PE_F32 || v->shape.ndim != 1 || o < 0 || v->shape.d[0] != o) return NULL;
  return y;
}

static bool written_between(const pe_block *b, const char *name, int from, int to) {
  for (int i = from + 1; i < to; i++) {
    const pe_op_desc *op = b->ops[i];
    for (int s = 0; s < op->n_out; s++)
      for (int a = 0; a < op->out[s].n; a++)
        if (strcmp(op->out[s].args[a], name) == 0) return true;
  }
  return false;
}

/* Try the pattern at conv op i; *fused counts rewrites. */
static pe_status *fuse_at(fuse_ctx *f, int i, int *fused) {
  pe_op_desc *conv = f->b->ops[i];
  const pe_op_def *def = pe_op_lookup("conv2d");
  if (!def || strcmp(conv->type, "conv2d") != 0 || pe_op_find_input(conv, "Bias") ||
      pe_attr_s(def, conv, "fuse_activation")[0])
    return NULL;
  const char *t1 = arg1(pe_op_find_output(conv, "Output"));
  const char *wname = arg1(pe_op_find_input(conv, "Filter"));
  const pe_var_desc *w = wname ? pe_block_find_var(f->p, f->b, wname) : NULL;
  if (!t1 || !w || w->shape.ndim != 4) return NULL;
  int j = sole_reader(f, t1);
  const char *bias = j > i ? bias_of(f, j, t1, w->shape.d[0]) : NULL;
  if (!bias || written_between(f->b, bias, i, j)) return NULL;
  const char *t2 = arg1(pe_op_find_output(f->b->ops[j], "Out"));
  int k = sole_reader(f, t2);
  const pe_op_desc *relu = k > j ? f->b->ops[k] : NULL;
  const char *rx = relu ? arg1(pe_op_find_input(relu, "X")) : NULL;
  const char *t3 = relu ? arg1(pe_op_find_output(relu, "Out")) : NULL;
  bool with_relu = relu && strcmp(relu->type, "relu") == 0 && rx && !strcmp(rx, t2) && t3;
  const char *out = with_relu ? t3 : t2;
  PE_TRY(pe_op_input1(conv, "Bias", bias));
  PE_TRY(pe_op_output1(conv, "Output", out));
  if (with_relu) {
    PE_TRY(pe_op_set_string(conv, "fuse_activation", "relu"));
    pe_block_remove_op(f->b, k);
  }
  pe_block_remove_op(f->b, j);
  (*fused)++;
  return NULL;
}

pe_status *pe_pass_fuse_conv_act(pe_ir *ir) {
  const pe_pass_opts *o = ir->opts;
  if (!o || !o->fuse_conv_act || o->place_kind == PE_PLACE_CUDA) return NULL;
  pe_program *p = ir->prog;
  pe_block *b = pe_program_main(p);
  if (!b || p->n_blocks > 2) return NULL;
  fuse_ctx f = {p, b, ir->opts};
  int fused = 0;
  /* fuse_at removes ops after i only, so i stays valid. */
  for (int i = 0; i < b->n_ops; i++) PE_TRY(fuse_at(&f, i, &fused));
  if (fused) PE_LOGD("fuse_conv_act: %d conv2d with their bias (and relu) fused", fused);
  return NULL;
}
