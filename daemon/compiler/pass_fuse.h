/* What the op-fusion passes share (pass_fuse.c): an index of each name's
 * uses in the main block, the questions a fusion asks of it (is this a
 * temporary written once and read once; does an op between two others use
 * a name; which relu follows), the note a fused-away intermediate keeps
 * for a fetch's error, and the driver that runs a pass's fuse_at over the
 * block and drops the ops it absorbed. Internal to daemon/compiler.
 *
 * The passes (pass_fuse_conv_act.c, pass_fuse_add_act.c) run only when
 * opts->fuse_conv_act is set (RegisterOptions.no_op_fusion clears it), not
 * on cuda places (their kernels take no fused forms), and only on programs
 * with a main and a startup block (no sub-block could read an
 * intermediate). An intermediate is fusable when it is an f32 temporary:
 * not persistable, not a feed, not the loss, not kept fetchable
 * (opts->keep), written by exactly one op and read by exactly one. */
#ifndef PE_COMPILER_PASS_FUSE_H
#define PE_COMPILER_PASS_FUSE_H

#include "compiler/pass.h"
#include "core/strmap.h"

/* One fusion pass over the main block. A fusion at op i rewrites op i and
 * marks the ops it absorbed dead (they are dropped at the end, so op
 * indexes stay put); the index is updated through pe_fuse_absorb. */
typedef struct pe_fuse_ctx {
  const pe_program *p;
  pe_block *b;
  const pe_pass_opts *o;
  const char *pass; /* the pass's name, for messages */
  pe_strmap uses;   /* name -> its uses (pass_fuse.c) */
  pe_strmap keep;   /* the loss and the options' keep names (value unused) */
  bool *dead;       /* [b->n_ops] absorbed by a fusion */
} pe_fuse_ctx;

/* Try a fusion at live op i (every op after i is as built or dead);
 * counts is the pass's own tally. */
typedef pe_status *(*pe_fuse_at_fn)(pe_fuse_ctx *f, int i, int *counts);

/* Runs at over the main block of ir->prog when fusion applies (see above;
 * else does nothing and returns NULL). */
pe_status *pe_fuse_run(pe_ir *ir, const char *pass, pe_fuse_at_fn at, int *counts);

/* The only arg of slot s, or NULL (absent, or several). */
const char *pe_fuse_arg1(const pe_slot *s);
/* The index of the only op reading `name` when it is a fusable temporary
 * (above); else -1. */
int pe_fuse_sole_reader(const pe_fuse_ctx *f, const char *name);
/* Whether a live op strictly between from and to writes `name` (or, with
 * reads, reads or writes it); from is the op being fused. */
bool pe_fuse_used_between(const pe_fuse_ctx *f, const char *name, int from, int to, bool reads);
/* The relu that is the only reader (after op i) of temporary t, with no op
 * between i and it using its output: its index, else -1. */
int pe_fuse_relu_after(const pe_fuse_ctx *f, int i, const char *t);
/* Notes on intermediate `name` that op now computes through it, writing
 * out: "<op type> writing '<out>' (<what>)"; a fetch of it says so. */
pe_status *pe_fuse_note(pe_fuse_ctx *f, const char *name, const pe_op_desc *op, const char *out,
                        const char *what);
/* Before op i is rewritten: uncount it and the n ops it absorbs (indexes
 * after i, or -1 to skip), marking those dead. */
void pe_fuse_absorb(pe_fuse_ctx *f, int i, const int *absorbed, int n);
/* After op i was rewritten: count it again. */
pe_status *pe_fuse_recount(pe_fuse_ctx *f, int i);

#endif
