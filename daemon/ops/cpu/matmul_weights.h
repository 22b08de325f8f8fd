/* Where a fully-connected layer's weights sit for its forward product.
 *
 * Why: oneDNN's brgemm matmul (AVX-512) reads plain row-major [K, N]
 * weights column block by column block; when the matrix outgrows the L2
 * cache the strided reads make it 4-10x slower than on the blocked layout
 * the primitive asks for with format any (64x3136 · 3136x1024: 46 ms
 * plain, 1.8 ms reorder + 4.4-8.5 ms blocked, one thread). Below that size
 * the reorder costs more than it saves (128x784 · 784x1024: 2.3 ms plain,
 * 0.4 + 2.7 ms blocked). On AVX2 oneDNN's gemm asks for the plain layout,
 * so the choice changes nothing there. docs/ops.md, "Fully-connected
 * weights", has the measurements. The rule is a pure function of the shape,
 * so a setting gives the same arithmetic on every run. */
#ifndef PE_OPS_CPU_MATMUL_WEIGHTS_H
#define PE_OPS_CPU_MATMUL_WEIGHTS_H

#include <stdbool.h>
#include <stdint.h>

/* Weights of at least this many elements (8 MiB of f32) are staged in the
 * layout oneDNN chooses; smaller ones are read in place. */
#define PE_MATMUL_STAGED_WEIGHTS_MIN ((int64_t)1 << 21)

/* True when the forward product of a [K, N] weight matrix lets oneDNN
 * choose the weights' layout (and reorders them on every call: they change
 * every step). */
static inline bool pe_matmul_weights_staged(int64_t k, int64_t n) {
  return k > 0 && n > 0 && k >= PE_MATMUL_STAGED_WEIGHTS_MIN / n;
}

#endif
