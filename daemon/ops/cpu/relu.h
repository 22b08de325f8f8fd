/* relu as PyTorch computes it: NaN stays NaN. oneDNN's relu
 * (max(x, 0), also as a convolution's or matmul's post-op) maps NaN to 0,
 * which would hide a corrupt input or a diverged layer behind a finite loss. So
 * relu, its gradient and the fused relu of conv2d, matmul and batch_norm
 * use these: relu(x) = x <= 0 ? 0 : x (negatives and -0 give +0, NaN and
 * +Inf pass), and the gradient from X or Out is y <= 0 ? 0 : dy (PyTorch's
 * threshold_backward: dy passes where y is positive or NaN). Both compile
 * to a compare and a blend. */
#ifndef PE_OPS_CPU_RELU_H
#define PE_OPS_CPU_RELU_H

#include <stdint.h>

#include "ops/registry.h"

static inline float pe_relu(float v) {
  return v <= 0.0f ? 0.0f : v;
}
static inline float pe_relu_grad(float y, float dy) {
  return y <= 0.0f ? 0.0f : dy;
}

/* out[i] = pe_relu(x[i]) (out may be x: in place), on the kernel's threads. */
void pe_relu_f32(pe_kernel_ctx *c, float *out, const float *x, int64_t n);
/* dx[i] = pe_relu_grad(y[i], dy[i]), on the kernel's threads. */
void pe_relu_grad_f32(pe_kernel_ctx *c, float *dx, const float *y, const float *dy, int64_t n);

#endif
