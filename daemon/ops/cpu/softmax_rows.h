/* The masked softmax over the last dim that fused_softmax_mask and
 * scaled_dot_product_attention share: scores S [..., Q, K] get an additive
 * mask that broadcasts to them (dims aligned from the right, each 1 or
 * equal) and, with causal, -inf at column j > row i of every [Q, K]
 * matrix; then oneDNN's softmax runs in place over K.
 *
 * A row whose every score is -inf (all of it masked) has no softmax; it
 * comes out as oneDNN's softmax makes it (NaN), as PyTorch's does. */
#ifndef PE_OPS_CPU_SOFTMAX_ROWS_H
#define PE_OPS_CPU_SOFTMAX_ROWS_H

#include <stdbool.h>

#include "ops/cpu/dnnl_util.h"

/* How a mask of shape m reads against scores of shape s (same rank after
 * aligning from the right): mask element strides per score dim, 0 where
 * the mask broadcasts. */
typedef struct pe_smask_view {
  int nd;
  int64_t dims[PE_MAX_DIMS]; /* the scores' */
  int64_t st[PE_MAX_DIMS];   /* the mask's, 0: broadcast */
} pe_smask_view;

/* The view of mask m against scores s (dims may be -1 at compile time: a
 * -1 matches anything); false when m has a higher rank or a dim that is
 * neither 1 nor s's. */
bool pe_smask_plan(const pe_shape *s, const pe_shape *m, pe_smask_view *v);

/* s (the scores, shape v->dims) += mask (NULL: none); with causal, -inf
 * where j > i. Rows split over nt threads when large (par_min.h). */
void pe_smask_apply(const pe_smask_view *v, const float *mask, bool causal, float *s, int nt);

/* Append to e a oneDNN softmax over dim 1 of [rows, k]: forward (args
 * SRC, DST; run it in place) or backward (DST, DIFF_DST, DIFF_SRC). */
pe_status *pe_softmax_rows_build(pe_kernel_ctx *c, pe_dnnl_entry *e, int64_t rows, int64_t k,
                                 bool backward);

#endif
