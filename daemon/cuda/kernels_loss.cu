// huber_loss, sigmoid_cross_entropy_with_logits and smooth_l1_loss with
// their gradients (launchers in kernels_loss.h): the formulas of
// ops/cpu/pointwise_loss.c and smooth_l1_loss.c in f32, elementwise but
// for smooth-l1's row sums (a warp per row, in double). normalize's count
// is one block's reduction (a fixed tree: deterministic; integer counts
// are exact).
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

// d = iw (x - y) of element i.
__device__ inline float sl1_diff(const float *x, const float *y, const float *iw, int64_t i) {
  float d = x[i] - y[i];
  return iw ? iw[i] * d : d;
}

// One warp per row; the row's sum in double.
__global__ void sl1_kernel(const float *x, const float *y, const float *iw, const float *ow,
                           float *diff, float *out, int64_t n, int64_t row, float s2, float beta) {
  int lane = threadIdx.x % kWarp;
  ROW_LOOP(r, n) {
    double sum = 0;
    for (int64_t j = r * row + lane; j < (r + 1) * row; j += kWarp) {
      float d = sl1_diff(x, y, iw, j), a = fabsf(d);
      float f = a < beta ? 0.5f * s2 * d * d : a - 0.5f * beta;
      sum += ow ? ow[j] * f : f;
      if (diff) diff[j] = d;
    }
    sum = warp_sum(sum);
    if (lane == 0) out[r] = (float)sum;
  }
}

__global__ void sl1_grad_kernel(const float *x, const float *y, const float *iw, const float *ow,
                                const float *g, const float *gd, float *dx, float *dy,
                                int64_t total, int64_t row, float s2) {
  GRID_LOOP(i, total) {
    float v = 0;
    if (g) {
      float h = s2 * sl1_diff(x, y, iw, i);
      h = h > 1 ? 1 : h < -1 ? -1 : h;
      v = (ow ? ow[i] : 1.0f) * h * g[i / row];
    }
    if (gd) v += gd[i];
    if (iw) v *= iw[i];
    if (dx) dx[i] = v;
    if (dy) dy[i] = -v;
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

cudaError_t pe_cu_smooth_l1(const float *x, const float *y, const float *iw, const float *ow,
                            float *diff, float *out, int64_t n, int64_t row, float sigma,
                            cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  float s2 = sigma * sigma;
  sl1_kernel<<<row_blocks(n), kRowsPerBlock * kWarp, 0, s>>>(x, y, iw, ow, diff, out, n, row, s2,
                                                               1.0f / s2);
  return cudaGetLastError();
}

cudaError_t pe_cu_smooth_l1_grad(const float *x, const float *y, const float *iw, const float *ow,
                                 const float *dout, const float *ddiff, float *dx, float *dy,
                                 int64_t n, int64_t row, float sigma, cudaStream_t s) {
  int64_t total = n * row;
  if (total == 0 || (!dx && !dy)) return cudaSuccess;
  sl1_grad_kernel<<<LAUNCH(total)>>>(x, y, iw, ow, dout, ddiff, dx, dy, total, row, sigma * sigma);
  return cudaGetLastError();
}

}  // extern "C"
