/* Activations kept in oneDNN's blocked layout between the ops that read
 * and write it (conv2d, pool2d and their gradients).
 *
 * Why. oneDNN's direct convolutions run on blocked data (nChw8c on AVX2
 * and SSE4.1, nChw16c on AVX-512); with plain NCHW tensors every conv
 * reorders its input into that layout and its output back, and so does
 * its gradient. Between two ops that both understand the blocked layout
 * those reorders cancel out.
 *
 * Who decides. The layout of a variable is decided once, when the program
 * compiles (compiler/pass_layout.c), never at run time: a variable is
 * blocked when its one writer and every reader are aware slots of these
 * ops (not a parameter, feed, loss or kept name). The pass records the
 * decision in each aware op's INT attribute "layout_blocked" (bit i: input
 * slot i, bit PE_LAYOUT_OUT_BIT + j: output slot j). Every other op, a
 * fetch, a checkpoint, the all-reduce and the evaluation path only ever
 * see variables the pass left plain, so none of them reorders anything;
 * fetching a blocked variable is refused (its declaration names the op,
 * as for fused intermediates; keep the name or register with
 * no_op_fusion). Parameters and their gradients stay plain.
 *
 * What "blocked" means for a tensor. The buffer has the tensor's plain
 * shape and size; its contents are in pe_dnnl_act_md's layout: nChw<B>c
 * with B = 16 where oneDNN's effective ISA is AVX-512 and 8 otherwise,
 * when the tensor is 4-D and B divides its channels, else plain. Writer and
 * readers apply the same rule to the same shape in the same process, so
 * they agree without storing a desc beside the tensor, and no padding is
 * ever needed.
 *
 * Threading: the mode is set once at start-up, before programs compile. */
#ifndef PE_OPS_CPU_DNNL_ACT_LAYOUT_H
#define PE_OPS_CPU_DNNL_ACT_LAYOUT_H

#include <oneapi/dnnl/dnnl.h>
#include <stdbool.h>
#include <stdint.h>

#include "ops/registry.h"

#define PE_LAYOUT_ATTR "layout_blocked"
#define PE_LAYOUT_OUT_BIT 16

typedef enum pe_conv_layout_mode {
  PE_CONV_LAYOUT_PLAIN,   /* every tensor plain; the convolutions stage */
  PE_CONV_LAYOUT_BLOCKED, /* the layout pass keeps activations blocked */
} pe_conv_layout_mode;

/* "plain" or "blocked"; false for anything else. */
bool pe_conv_layout_parse(const char *s, int *mode);
const char *pe_conv_layout_name(int mode);
/* Process-wide (PE_CONV_LAYOUT_BLOCKED until set). */
void pe_conv_layout_set_mode(int mode);
int pe_conv_layout_get_mode(void);

/* The channel block of this process's ISA (8 or 16). */
int64_t pe_dnnl_act_block(void);
/* Whether the kernel's input (or output) slot holds blocked data. */
bool pe_dnnl_act_blocked(const pe_kernel_ctx *c, bool output, int slot);
/* The desc of an f32 tensor of shape s: the blocked layout above when
 * `blocked` and it applies to s, else plain (abcd...). */
dnnl_status_t pe_dnnl_act_md(dnnl_memory_desc_t *md, const pe_shape *s, bool blocked);
/* The same for the kernel's input / output slot. */
dnnl_status_t pe_dnnl_act_md_in(dnnl_memory_desc_t *md, const pe_kernel_ctx *c, int slot,
                                const pe_shape *s);
dnnl_status_t pe_dnnl_act_md_out(dnnl_memory_desc_t *md, const pe_kernel_ctx *c, int slot,
                                 const pe_shape *s);

/* Ops whose activation slots all share one layout (batch_norm and its
 * gradient, elementwise_add and its gradient, sum: pass_layout.c ties
 * them, so that their elementwise loops need no per-operand addressing).
 * in_mask / out_mask: the op's activation slots (bit i: slot i); slots
 * without arguments are skipped. *blocked: whether they are blocked; an
 * error names the op and the attribute when the bits mark some of them
 * blocked and others plain. */
pe_status *pe_dnnl_act_tied(pe_kernel_ctx *c, uint32_t in_mask, uint32_t out_mask, bool *blocked);

/* Addressing one (n, c) plane of an N x C x H x W tensor in either layout:
 * element (h, w) of the plane is at base + (h * W + w) * step. */
typedef struct pe_act_plane {
  int64_t c, hw; /* channels, H * W */
  int64_t block; /* 1: plain; B: blocked */
} pe_act_plane;

/* The addressing of tensor shape s (4-D) stored blocked or not. */
pe_act_plane pe_act_plane_of(const pe_shape *s, bool blocked);
static inline int64_t pe_act_plane_base(const pe_act_plane *p, int64_t n, int64_t c) {
  if (p->block == 1) return (n * p->c + c) * p->hw;
  int64_t cb = c / p->block;
  return ((n * (p->c / p->block) + cb) * p->hw) * p->block + c % p->block;
}

#endif
