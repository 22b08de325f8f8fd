/* Launchers of the masked row softmax (kernels_softmax.cu) that
 * fused_softmax_mask, fused_softmax_mask_upper_triangle and
 * scaled_dot_product_attention share. f32; they enqueue on `s` and return
 * the launch's cudaError_t. */
#ifndef PE_CUDA_KERNELS_SOFTMAX_H
#define PE_CUDA_KERNELS_SOFTMAX_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How an additive mask reads against scores [..., Q, K] (ops/cpu/
 * softmax_rows.h's pe_smask_view): the scores' dims and the mask's
 * element strides per dim, 0 where the mask broadcasts. */
typedef struct pe_cu_smask {
  int nd;
  int64_t dims[PE_CU_MAX_DIMS];
  int64_t st[PE_CU_MAX_DIMS];
} pe_cu_smask;

/* y = softmax over each row of x [rows, k] (rows = the product of the
 * scores' leading dims, q = their dim -2) of x + mask (mask NULL: none;
 * else read through view) with, under causal, column j > row i of every
 * [q, k] matrix masked out (probability 0). y may equal x. A row with
 * every score -inf gives NaN, as on the CPU. */
cudaError_t pe_cu_softmax_rows(const float *x, const float *mask, const pe_cu_smask *view,
                               int causal, float *y, int64_t rows, int64_t q, int64_t k,
                               cudaStream_t s);
/* dx = p (dy - sum over the row of dy p), from the probabilities p; dx may
 * equal dy. */
cudaError_t pe_cu_softmax_rows_grad(const float *p, const float *dy, float *dx, int64_t rows,
                                    int64_t k, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
