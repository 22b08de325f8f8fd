// huber_loss and sigmoid_cross_entropy_with_logits with their gradients
// (launchers in kernels_loss.h): elementwise, the formulas of
// ops/cpu/pointwise_loss.c in f32. normalize's count is one block's
// reduction (a fixed tree: deterministic; integer counts are exact).
#include <math.h>
#include <stdint.h>

#include "launch.cuh"
#include "kernels_loss.h"

namespace {

__global__ void huber_kernel(const float *x, const float *y, float *out, float *res, int64_t n,
                             float delta) {
  GRID_LOOP(i, n) {
    float r = y[i] - x[i], a = fabsf(r);
    out[i] = a <= delta ? 0.5f * r * r : delta * (a - 0.5f * delta);
    if (res) res[i] = r;
  }
}

__global__ void huber_grad_kernel(const float *x, const float *y, const float *g, float *dx,
                                  float *dy, int64_t n, float delta) {
  GRID_LOOP(i, n) {
    float r = y[i] - x[i];
    float h = r > delta ? delta : r < -delta ? -delta : r;
    if (dx) dx[i] = -h * g[i];
    if (dy) dy[i] = h * g[i];
  }
}

// *k = 1 / max(count of z != ignore, 1e-6), by one block.
__global__ void sce_scale_kernel(const float *z, int64_t n, float ignore, float *k) {
  __shared__ long long part[kThreads];
  long long kept = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) kept += z[i] != ignore;
  part[threadIdx.x] = kept;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *k = 1.0f / fmaxf((float)part[0], 1e-6f);
}

__global__ void sce_kernel(const float *x, const float *z, float *out, int64_t n, float ignore,
                           const float *k) {
  float f = k ? *k : 1.0f;
  GRID_LOOP(i, n) {
    float v = fmaxf(x[i], 0.0f) - x[i] * z[i] + log1pf(expf(-fabsf(x[i])));
    out[i] = z[i] == ignore ? 0.0f : v * f;
  }
}

__global__ void sce_grad_kernel(const float *x, const float *z, const float *g, float *dx,
                                int64_t n, float ignore, const float *k) {
  float f = k ? *k : 1.0f;
  GRID_LOOP(i, n) {
    float sg = 1.0f / (1.0f + expf(-x[i]));
    dx[i] = z[i] == ignore ? 0.0f : (sg - z[i]) * g[i] * f;
  }
}

}  // namespace

#define LAUNCH(n) blocks_for(n), kThreads, 0, s

extern "C" {

cudaError_t pe_cu_huber(const float *x, const float *y, float *out, float *residual, int64_t n,
                        float delta, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  huber_kernel<<<LAUNCH(n)>>>(x, y, out, residual, n, delta);
  return cudaGetLastError();
}

cudaError_t pe_cu_huber_grad(const float *x, const float *y, const float *dout, float *dx,
                             float *dy, int64_t n, float delta, cudaStream_t s) {
  if (n == 0 || (!dx && !dy)) return cudaSuccess;
  huber_grad_kernel<<<LAUNCH(n)>>>(x, y, dout, dx, dy, n, delta);
  return cudaGetLastError();
}

cudaError_t pe_cu_sce(const float *x, const float *z, float *out, int64_t n, float ignore,
                      int normalize, float *k, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (normalize) sce_scale_kernel<<<1, kThreads, 0, s>>>(z, n, ignore, k);
  sce_kernel<<<LAUNCH(n)>>>(x, z, out, n, ignore, normalize ? k : NULL);
  return cudaGetLastError();
}

cudaError_t pe_cu_sce_grad(const float *x, const float *z, const float *dout, float *dx,
                           int64_t n, float ignore, int normalize, float *k, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (normalize) sce_scale_kernel<<<1, kThreads, 0, s>>>(z, n, ignore, k);
  sce_grad_kernel<<<LAUNCH(n)>>>(x, z, dout, dx, n, ignore, normalize ? k : NULL);
  return cudaGetLastError();
}

}  // extern "C"
