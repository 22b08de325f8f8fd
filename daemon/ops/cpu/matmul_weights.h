/* How a fully-connected layer's large weights are read.
 *
 * Why: oneDNN's brgemm matmul (AVX-512), its first choice, reads plain
 * row-major [K, N] weights column block by column block; once the matrix
 * outgrows the L2 cache the strided reads make it 2-4x slower than on the
 * blocked layout it asks for with format any, and reordering into that
 * layout on every call (the weights change every step) costs more than it
 * saves. oneDNN's gemm-based matmul (gemm:jit, the same kernels as
 * dnnl_sgemm) packs panels of the plain weights itself, within the cache,
 * and beats both. For the CNN's fc, 64 x 3136 x 1024, two threads / one
 * thread: brgemm plain 9.4 / 19.1 ms, reorder + blocked 7.7 / 11.6 ms,
 * gemm:jit 6.1 / 9.2 ms; the weight gradient Xᵀ·dOut 4.3 / 7.2 ms on
 * brgemm, 4.0 / 6.2 ms on gemm:jit. Below the threshold brgemm on the
 * plain weights is as fast or faster (128 x 784 x 1024 forward: 1.9 / 2.0
 * ms brgemm, 1.7 / 2.2 ms gemm:jit). The product dOut·Wᵀ reads the
 * weights transposed, which brgemm reads at full speed (4.3 ms against
 * 6.5 ms on gemm:jit), and stays on brgemm. On AVX2 gemm:jit is oneDNN's
 * first choice anyway. docs/ops.md, "Fully-connected weights", has the
 * table. The rule is a pure function of the shape, so a setting gives
 * the same arithmetic on every run. */
#ifndef PE_OPS_CPU_MATMUL_WEIGHTS_H
#define PE_OPS_CPU_MATMUL_WEIGHTS_H

#include <stdbool.h>
#include <stdint.h>

/* Weights of at least this many elements (8 MiB of f32) are large. */
#define PE_MATMUL_LARGE_WEIGHTS_MIN ((int64_t)1 << 21)

/* oneDNN's name prefix of the implementation large weights go through. */
#define PE_MATMUL_LARGE_WEIGHTS_IMPL "gemm:"

/* True when the products that read a [K, N] weight matrix whole (the
 * forward X·W and the weight gradient Xᵀ·dOut) run on oneDNN's gemm-based
 * matmul instead of its first choice. */
static inline bool pe_matmul_weights_large(int64_t k, int64_t n) {
  return k > 0 && n > 0 && k >= PE_MATMUL_LARGE_WEIGHTS_MIN / n;
}

#endif
