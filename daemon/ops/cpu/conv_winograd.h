/* Winograd F(2x2, 5x5) and F(4x4, 3x3): stride-1 5x5 and 3x3
 * convolutions in fewer multiplications than oneDNN's direct kernels.
 *
 * Why. oneDNN 2.6 has Winograd for 3x3 filters on AVX-512 only; elsewhere
 * it runs its direct kernels, r x r multiply-adds per output and channel
 * pair. F(m x m, r x r) (m = 7 - r) computes each m x m output tile from a
 * 6x6 input tile with 36 products per channel pair (2.8x fewer for 5x5, 4x
 * for 3x3), as 36 independent [tiles x Cin] x [Cin x Cout] products, plus
 * transforms of the input tiles, the filters and the output tiles. On the
 * CNN's second convolution (32 -> 64 channels, 14x14, batch 32) it takes
 * 0.65 of oneDNN's direct time forward at AVX2 and 0.70-0.78 at AVX-512.
 * It runs where oneDNN's effective ISA is AVX2 (3x3 and 5x5, 8 channels per
 * vector) or AVX-512 (5x5, 16 channels; oneDNN's own Winograd takes 3x3
 * there): pe_wino_lanes, pe_wino_takes (docs/ops.md, "pe's Winograd").
 *
 * Numerics. The transforms use the points 0, +-1, +-2 and infinity (those of
 * oneDNN's F(4x4, 3x3)); against the direct convolution the outputs differ
 * by a few units in the last place of the largest output. The order of every
 * sum is fixed by the shape, so results do not depend on the thread count.
 *
 * Gradient. The data gradient of a stride-1 r x r convolution with padding
 * p is the same convolution of Output@GRAD, padded r - 1 - p, with the filters
 * turned 180 degrees and their in and out channels swapped
 * (pe_wino_filter's `data_grad`). The weights gradient sums, per
 * transformed position, the products of the input's transformed tiles and
 * the output gradient's (A dY Aᵀ), and turns the sum back into r x r filters
 * (Gᵀ dU G): pe_wino_weights_grad.
 *
 * Layouts. Input and output are read and written where they are stored:
 * oneDNN's nChw8c or nChw16c (pe_act_plane), never plain. Channels: Cin a
 * multiple of the vector's, Cout of twice that.
 *
 * Threading: pe_wino_filter, pe_wino_run and pe_wino_weights_grad fork
 * an OpenMP team of the given size on the calling thread; each member owns
 * its slice of the scratch. */
#ifndef PE_OPS_CPU_CONV_WINOGRAD_H
#define PE_OPS_CPU_CONV_WINOGRAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/cpu/dnnl_act_layout.h"

/* One convolution: an r x r filter (3 or 5; output tiles of m = 7 - r),
 * input [n, cin, h, w] and output [n, cout, oh, ow], in the given layouts
 * (block 8 or 16), the input padded by pad_h rows above and pad_w columns
 * left (the rest of the padding follows from the sizes). */
struct pe_wino_kernels;
typedef struct pe_wino {
  const struct pe_wino_kernels *kern; /* the ISA's (conv_winograd_impl.h) */
  int r, m;
  int64_t n, cin, h, w;
  int64_t cout, oh, ow;
  int64_t pad_h, pad_w;
  pe_act_plane in, out;
  int64_t chunk; /* output tiles per scratch chunk (pe_wino_plan) */
} pe_wino;

/* The vector width pe's Winograd runs at in this process: 8 (AVX2 and FMA)
 * where oneDNN's effective ISA (ONEDNN_MAX_CPU_ISA included) is AVX2, 16
 * where it is AVX-512, with channels blocked by as many; 0 elsewhere (the
 * caller runs oneDNN's). */
int pe_wino_lanes(void);

/* Whether pe's Winograd takes r x r filters at this width: 3 and 5 on
 * AVX2; only 5 on AVX-512, where oneDNN has its own F(4x4, 3x3) (the
 * winograd candidate then runs oneDNN's). */
bool pe_wino_takes(int lanes, int r);

/* Fills *g for a convolution of an r x r filter (3 or 5) at stride 1,
 * dilation 1, one group, paddings of at most r - 1, on vectors of `lanes`
 * (8 or 16, which the CPU must run): Cin a multiple of lanes, Cout of twice
 * that, both layouts blocked by a multiple of lanes, transformed filters of
 * at most 64 MiB; false where any of that does not hold (the caller runs
 * oneDNN's). */
bool pe_wino_plan(pe_wino *g, int lanes, int r, const int64_t in[4], int64_t cout, int64_t oh,
                  int64_t ow, int64_t pad_h, int64_t pad_w, pe_act_plane in_plane,
                  pe_act_plane out_plane);

/* The transformed filters' size, and the scratch for a team of `threads`. */
size_t pe_wino_filter_floats(const pe_wino *g);
size_t pe_wino_scratch_floats(const pe_wino *g, int threads);

/* u <- the transformed filters of w (OIHW, [o, i, r, r]) for convolution g.
 * data_grad: w is the forward filter [g->cin, g->cout, r, r] of the
 * convolution whose data gradient g computes. */
void pe_wino_filter(const pe_wino *g, const float *w, bool data_grad, float *u, int threads);

/* y <- x convolved with the filters u (from pe_wino_filter), plus bias[o]
 * when bias is not NULL. scratch: pe_wino_scratch_floats(g, threads). */
void pe_wino_run(const pe_wino *g, const float *x, const float *u, const float *bias, float *y,
                 float *scratch, int threads);

/* The weights gradient of the forward convolution g: dw (OIHW, [cout, cin,
 * r, r]) <- the gradient of its filters, x its input and dy its output's
 * gradient (stored as g->in and g->out). No bias. scratch:
 * pe_wino_wgrad_scratch_floats(g, threads). */
size_t pe_wino_wgrad_scratch_floats(const pe_wino *g, int threads);
void pe_wino_weights_grad(const pe_wino *g, const float *x, const float *dy, float *dw,
                          float *scratch, int threads);

#endif
