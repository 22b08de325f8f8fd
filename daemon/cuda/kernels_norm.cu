// layer_norm and its gradient (launchers in kernels_norm.h); cuDNN has no
// plain layer normalization.
//
// Row statistics: one warp per row, two passes (mean, then the sum of
// squared deviations) summed in double, so they agree with oneDNN's to f32
// rounding. The gradient's per-row sums the same way. dscale and dbias are
// column sums over all rows: a parts x columns grid sums fixed row ranges
// into scratch, then one thread per column adds the parts in order (no
// atomics: deterministic run to run).
#include <math.h>
#include <stdint.h>

#include "launch.cuh"
#include "kernels_norm.h"

namespace {

constexpr int64_t kMaxParts = 64;  // row ranges of the column sums

inline int64_t n_parts(int64_t left) {
  return left < kMaxParts ? (left < 1 ? 1 : left) : kMaxParts;
}

__global__ void ln_fwd_kernel(const float *x, const float *scale, const float *bias, float *y,
                              float *mean, float *var, int64_t rows, int64_t right, float eps) {
  int lane = threadIdx.x % kWarp;
  ROW_LOOP(r, rows) {
    const float *xr = x + r * right;
    float *yr = y + r * right;
    double sum = 0;
    for (int64_t j = lane; j < right; j += kWarp) sum += xr[j];
    double mu = warp_sum(sum) / (double)right;
    double sq = 0;
    for (int64_t j = lane; j < right; j += kWarp) {
      double d = (double)xr[j] - mu;
      sq += d * d;
    }
    double v = warp_sum(sq) / (double)right;
    float m = (float)mu, inv = 1.0f / sqrtf((float)v + eps);
    for (int64_t j = lane; j < right; j += kWarp) {
      float h = (xr[j] - m) * inv;
      yr[j] = h * (scale ? scale[j] : 1.0f) + (bias ? bias[j] : 0.0f);
    }
    if (lane == 0) {
      mean[r] = m;
      var[r] = (float)v;
    }
  }
}

// dx = inv (g - mean(g) - xhat mean(g xhat)), g = dy scale.
__global__ void ln_dx_kernel(const float *x, const float *scale, const float *mean,
                             const float *var, const float *dy, float *dx, int64_t rows,
                             int64_t right, float eps) {
  int lane = threadIdx.x % kWarp;
  ROW_LOOP(r, rows) {
    const float *xr = x + r * right, *dyr = dy + r * right;
    float m = mean[r], inv = 1.0f / sqrtf(var[r] + eps);
    double sg = 0, sgx = 0;
    for (int64_t j = lane; j < right; j += kWarp) {
      float g = dyr[j] * (scale ? scale[j] : 1.0f);
      sg += g;
      sgx += (double)g * ((xr[j] - m) * inv);
    }
    float mg = (float)(warp_sum(sg) / (double)right);
    float mgx = (float)(warp_sum(sgx) / (double)right);
    float *dxr = dx + r * right;
    for (int64_t j = lane; j < right; j += kWarp) {
      float g = dyr[j] * (scale ? scale[j] : 1.0f);
      dxr[j] = inv * (g - mg - (xr[j] - m) * inv * mgx);
    }
  }
}

// part[p][j]: the sums of dy xhat and dy over rows [p chunk, (p+1) chunk).
__global__ void ln_col_part_kernel(const float *x, const float *mean, const float *var,
                                   const float *dy, double *ps, double *pb, int64_t rows,
                                   int64_t right, int64_t chunk, float eps) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, p = blockIdx.y;
  if (j >= right) return;
  int64_t r0 = p * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
  double s = 0, b = 0;
  for (int64_t r = r0; r < r1; r++) {
    float g = dy[r * right + j];
    float h = (x[r * right + j] - mean[r]) * (1.0f / sqrtf(var[r] + eps));
    s += (double)g * h;
    b += g;
  }
  ps[p * right + j] = s;
  pb[p * right + j] = b;
}

__global__ void ln_col_sum_kernel(const double *ps, const double *pb, float *dscale, float *dbias,
                                  int64_t parts, int64_t right) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= right) return;
  double s = 0, b = 0;
  for (int64_t p = 0; p < parts; p++) {
    s += ps[p * right + j];
    b += pb[p * right + j];
  }
  if (dscale) dscale[j] = (float)s;
  if (dbias) dbias[j] = (float)b;
}

}  // namespace

extern "C" {

cudaError_t pe_cu_layer_norm(const float *x, const float *scale, const float *bias, float *y,
                             float *mean, float *var, int64_t left, int64_t right, float eps,
                             cudaStream_t s) {
  if (left == 0 || right == 0) return cudaSuccess;
  ln_fwd_kernel<<<row_blocks(left), kRowsPerBlock * kWarp, 0, s>>>(x, scale, bias, y, mean, var,
                                                                    left, right, eps);
  return cudaGetLastError();
}

size_t pe_cu_layer_norm_grad_scratch(int64_t left, int64_t right) {
  return 2 * (size_t)n_parts(left) * (size_t)(right > 0 ? right : 1) * sizeof(double);
}

cudaError_t pe_cu_layer_norm_grad(const float *x, const float *scale, const float *mean,
                                  const float *var, const float *dy, float *dx, float *dscale,
                                  float *dbias, int64_t left, int64_t right, float eps,
                                  void *scratch, cudaStream_t s) {
  if (left == 0 || right == 0) return cudaSuccess;
  if (dx)
    ln_dx_kernel<<<row_blocks(left), kRowsPerBlock * kWarp, 0, s>>>(x, scale, mean, var, dy, dx,
                                                                     left, right, eps);
  if (!dscale && !dbias) return cudaGetLastError();
  int64_t parts = n_parts(left), chunk = (left + parts - 1) / parts;
  int64_t cols = (right + kThreads - 1) / kThreads;
  if (cols > INT32_MAX) return cudaErrorInvalidConfiguration;
  double *ps = (double *)scratch, *pb = ps + parts * right;
  ln_col_part_kernel<<<dim3((unsigned)cols, (unsigned)parts), kThreads, 0, s>>>(
      x, mean, var, dy, ps, pb, left, right, chunk, eps);
  ln_col_sum_kernel<<<(unsigned)cols, kThreads, 0, s>>>(ps, pb, dscale, dbias, parts, right);
  return cudaGetLastError();
}

}  // extern "C"
