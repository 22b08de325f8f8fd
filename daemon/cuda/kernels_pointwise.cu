// gelu (erf and tanh forms), abs and square with their gradients
// (launchers in kernels_norm.h). In f32 with the device's erff/tanhf/expf,
// which differ from oneDNN's polynomial approximations by a few ulp.
#include <math.h>
#include <stdint.h>

#include "launch.cuh"
#include "kernels_norm.h"

namespace {

constexpr float kSqrtHalf = 0.70710678118654752f;   // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143268f; // 1 / sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kGeluC = 0.044715f;

__device__ inline float fwd(int f, float x) {
  switch (f) {
    case PE_CU_GELU_ERF: return 0.5f * x * (1.0f + erff(x * kSqrtHalf));
    case PE_CU_GELU_TANH: {
      float u = kSqrt2OverPi * (x + kGeluC * x * x * x);
      return 0.5f * x * (1.0f + tanhf(u));
    }
    case PE_CU_ABS: return fabsf(x);
    default: return x * x;
  }
}

__device__ inline float deriv(int f, float x) {
  switch (f) {
    case PE_CU_GELU_ERF:
      return 0.5f * (1.0f + erff(x * kSqrtHalf)) + x * kInvSqrt2Pi * expf(-0.5f * x * x);
    case PE_CU_GELU_TANH: {
      float u = kSqrt2OverPi * (x + kGeluC * x * x * x), t = tanhf(u);
      return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluC * x * x);
    }
    case PE_CU_ABS: return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : 0.0f;
    default: return 2.0f * x;
  }
}

__global__ void pw_fwd_kernel(int f, const float *x, float *y, int64_t n) {
  GRID_LOOP(i, n) y[i] = fwd(f, x[i]);
}

__global__ void pw_bwd_kernel(int f, const float *x, const float *dy, float *dx, int64_t n) {
  GRID_LOOP(i, n) dx[i] = deriv(f, x[i]) * dy[i];
}

}  // namespace

extern "C" {

cudaError_t pe_cu_pointwise_fwd(pe_cu_pointwise f, const float *x, float *y, int64_t n,
                                cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  pw_fwd_kernel<<<blocks_for(n), kThreads, 0, s>>>((int)f, x, y, n);
  return cudaGetLastError();
}

cudaError_t pe_cu_pointwise_bwd(pe_cu_pointwise f, const float *x, const float *dy, float *dx,
                                int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  pw_bwd_kernel<<<blocks_for(n), kThreads, 0, s>>>((int)f, x, dy, dx, n);
  return cudaGetLastError();
}

}  // extern "C"
