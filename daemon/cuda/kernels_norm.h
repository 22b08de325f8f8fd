/* Launchers of layer normalization and of the pointwise activations of
 * the transformer ops (kernels_norm.cu, kernels_pointwise.cu). f32; they
 * enqueue on `s` and return the launch's cudaError_t. */
#ifndef PE_CUDA_KERNELS_NORM_H
#define PE_CUDA_KERNELS_NORM_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* layer_norm over rows of x [left, right]: mean and var [left] (biased
 * variance, as the op saves it), y = (x - mean) / sqrt(var + eps) * scale
 * + bias (scale, bias [right] or NULL). */
cudaError_t pe_cu_layer_norm(const float *x, const float *scale, const float *bias, float *y,
                             float *mean, float *var, int64_t left, int64_t right, float eps,
                             cudaStream_t s);
/* Scratch of the backward's column sums (dscale, dbias): bytes of device
 * memory, 8-byte aligned. */
size_t pe_cu_layer_norm_grad_scratch(int64_t left, int64_t right);
/* The gradient from the saved mean and var: dx, dscale, dbias (each may be
 * NULL: not wanted); scale NULL reads as ones. */
cudaError_t pe_cu_layer_norm_grad(const float *x, const float *scale, const float *mean,
                                  const float *var, const float *dy, float *dx, float *dscale,
                                  float *dbias, int64_t left, int64_t right, float eps,
                                  void *scratch, cudaStream_t s);

typedef enum pe_cu_pointwise {
  PE_CU_GELU_ERF = 0,  /* x Phi(x) */
  PE_CU_GELU_TANH = 1, /* Paddle's approximate form */
  PE_CU_ABS = 2,       /* gradient sign(x), 0 at 0 */
  PE_CU_SQUARE = 3,
} pe_cu_pointwise;

/* y = f(x); dx = f'(x) dy (both read X). */
cudaError_t pe_cu_pointwise_fwd(pe_cu_pointwise f, const float *x, float *y, int64_t n,
                                cudaStream_t s);
cudaError_t pe_cu_pointwise_bwd(pe_cu_pointwise f, const float *x, const float *dy, float *dx,
                                int64_t n, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
