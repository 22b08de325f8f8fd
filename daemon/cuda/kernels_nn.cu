// Losses, reductions, metrics and batch norm (CUDA). Launchers in kernels.h.
//
// Row kernels use one warp per row (classes are the last dim) and sum in
// double like the CPU kernels, so results agree with the CPU reference to
// f32 rounding. Whole-tensor reductions (mean, accuracy, batch-norm
// statistics) use one block per output with a fixed tree, so they are
// deterministic run to run.
//
// Hard labels are not range-checked on the host (that would need a device
// sync per op): a label outside [0, C) makes that row's loss NaN and its
// gradient row zero, and accuracy counts it as wrong. The CPU kernels report
// such a label as an error instead.
#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "launch.cuh"
#include "ops/clip.h"

namespace {

// Block-wide double sum of v (blockDim.x == kThreads); result in all threads.
__device__ double block_sum(double v) {
  __shared__ double part[kThreads];
  __syncthreads();
  part[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  return part[0];
}


__global__ void swce_kernel(const float *x, const int64_t *hard, const float *soft, float *sm,
                            float *loss, int64_t rows, int64_t C) {
  int lane = threadIdx.x % kWarp;
  ROW_LOOP(r, rows) {
    const float *xr = x + r * C;
    float *sr = sm + r * C;
    float m = -INFINITY;
    for (int64_t j = lane; j < C; j += kWarp) m = fmaxf(m, xr[j]);
    m = warp_max(m);
    double sum = 0;
    for (int64_t j = lane; j < C; j += kWarp) {
      float e = expf(xr[j] - m);
      sr[j] = e;
      sum += e;
    }
    sum = warp_sum(sum);
    float inv = (float)(1.0 / sum);
    for (int64_t j = lane; j < C; j += kWarp) sr[j] *= inv;
    double log_sum = log(sum);
    if (!soft) {
      if (lane == 0) {
        int64_t l = hard[r];
        loss[r] = (l >= 0 && l < C) ? (float)(log_sum - (double)(xr[l] - m)) : NAN;
      }
      continue;
    }
    const float *lr = soft + r * C;
    double acc = 0;
    for (int64_t j = lane; j < C; j += kWarp) acc += lr[j] * (log_sum - (double)(xr[j] - m));
    acc = warp_sum(acc);
    if (lane == 0) loss[r] = (float)acc;
  }
}

__global__ void swce_grad_kernel(const float *sm, const int64_t *hard, const float *soft,
                                 const float *dloss, const float *dsm, float *dx, int64_t rows,
                                 int64_t C) {
  int lane = threadIdx.x % kWarp;
  ROW_LOOP(r, rows) {
    const float *sr = sm + r * C;
    float *gr = dx + r * C;
    float w = dloss ? dloss[r] : 0.0f;
    if (soft) {
      const float *lr = soft + r * C;
      double lsum = 0;
      for (int64_t j = lane; j < C; j += kWarp) lsum += lr[j];
      lsum = warp_sum(lsum);
      for (int64_t j = lane; j < C; j += kWarp) gr[j] = w * (sr[j] * (float)lsum - lr[j]);
    } else {
      int64_t l = hard[r];
      bool ok = l >= 0 && l < C;
      for (int64_t j = lane; j < C; j += kWarp)
        gr[j] = ok ? (j == l ? w * sr[j] - w : w * sr[j]) : 0.0f;
    }
    if (dsm) {
      const float *dr = dsm + r * C;
      double dot = 0;
      for (int64_t j = lane; j < C; j += kWarp) dot += (double)dr[j] * sr[j];
      dot = warp_sum(dot);
      for (int64_t j = lane; j < C; j += kWarp) gr[j] += sr[j] * (dr[j] - (float)dot);
    }
  }
}

constexpr float kMinProb = 1e-20f;  // = CE_MIN_PROB of the CPU kernel

__global__ void ce_kernel(const float *x, const int64_t *hard, const float *soft, float *y,
                          int64_t rows, int64_t C) {
  int lane = threadIdx.x % kWarp;
  ROW_LOOP(r, rows) {
    const float *xr = x + r * C;
    if (!soft) {
      if (lane == 0) {
        int64_t l = hard[r];
        y[r] = (l >= 0 && l < C) ? -logf(fmaxf(xr[l], kMinProb)) : NAN;
      }
      continue;
    }
    const float *lr = soft + r * C;
    double acc = 0;
    for (int64_t j = lane; j < C; j += kWarp) acc -= lr[j] * log(fmaxf(xr[j], kMinProb));
    acc = warp_sum(acc);
    if (lane == 0) y[r] = (float)acc;
  }
}

__global__ void ce_grad_kernel(const float *x, const int64_t *hard, const float *soft,
                               const float *dy, float *dx, int64_t rows, int64_t C) {
  int lane = threadIdx.x % kWarp;
  ROW_LOOP(r, rows) {
    const float *xr = x + r * C;
    float *gr = dx + r * C;
    float g = dy[r];
    int64_t l = soft ? -1 : hard[r];
    for (int64_t j = lane; j < C; j += kWarp) {
      float v = 0.0f;
      if (soft) {
        if (xr[j] > kMinProb) v = -g * soft[r * C + j] / xr[j];
      } else if (j == l && xr[j] > kMinProb) {
        v = -g / xr[j];
      }
      gr[j] = v;
    }
  }
}

__global__ void mean_kernel(const float *x, int64_t n, float *out) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += x[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = n ? (float)(acc / (double)n) : NAN;
}

// One block: the sum of x^2 in double with a fixed tree (deterministic).
__global__ void sumsq_kernel(const float *x, int64_t n, double *out) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += (double)x[i] * x[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = acc;
}

// The global norm from the k tensors' sums of squares, in their order.
__device__ inline double global_norm(const double *sq, int k) {
  double s = 0;
  for (int j = 0; j < k; j++) s += sq[j];
  return sqrt(s);
}

// out = x * the clipping coefficient (ops/clip.h) when it is below 1.
__global__ void clip_scale_kernel(const float *x, float *out, int64_t n, const double *sq, int k,
                                  double max_norm) {
  double coef = pe_clip_coef(global_norm(sq, k), max_norm);
  float cf = (float)coef;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)blockDim.x * gridDim.x)
    out[i] = coef < 1.0 ? x[i] * cf : x[i];
}

__global__ void clip_norm_kernel(const double *sq, int k, float *norm) {
  *norm = (float)global_norm(sq, k);
}

__global__ void mean_grad_kernel(const float *dout, float *dx, int64_t n) {
  float v = dout && n ? (float)(dout[0] / (double)n) : 0.0f;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)blockDim.x * gridDim.x)
    dx[i] = v;
}

// Metric order (ops/cpu/metric.c): larger first, NaN above every number and
// equal to other NaNs; ties by lower index.
template <typename T>
__device__ inline bool score_gt(T a, T b) {
  return a > b;
}
template <>
__device__ inline bool score_gt<float>(float a, float b) {
  return isnan(a) ? !isnan(b) : (!isnan(b) && a > b);
}
template <>
__device__ inline bool score_gt<double>(double a, double b) {
  return isnan(a) ? !isnan(b) : (!isnan(b) && a > b);
}

template <typename T>
__global__ void accuracy_kernel(const T *x, const int64_t *label, int64_t n, int64_t cls,
                                int64_t k, float *acc, int64_t *correct, int64_t *total) {
  double cnt = 0;
  for (int64_t r = threadIdx.x; r < n; r += blockDim.x) {
    int64_t l = label[r];
    if (l < 0 || l >= cls) continue;
    const T *row = x + r * cls;
    int64_t rank = 0;
    for (int64_t j = 0; j < cls && rank < k; j++)
      if (score_gt(row[j], row[l]) || (j < l && !score_gt(row[l], row[j]))) rank++;
    cnt += rank < k;
  }
  cnt = block_sum(cnt);
  if (threadIdx.x == 0) {
    int64_t c = (int64_t)cnt;
    if (acc) *acc = n ? (float)((double)c / (double)n) : 0.0f;
    if (correct) *correct = c;
    if (total) *total = n;
  }
}

// One thread per row; k passes of "best element not taken yet" (k is small).
template <typename T>
__global__ void top_k_kernel(const T *x, int64_t rows, int64_t len, int64_t k, T *out,
                             int64_t *idx) {
  for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows;
       r += (int64_t)blockDim.x * gridDim.x) {
    const T *row = x + r * len;
    int64_t *ir = idx + r * k;
    // Previous pick p: the next one ranks strictly after p (value, then index).
    int64_t prev = -1;
    for (int64_t q = 0; q < k; q++) {
      int64_t best = -1;
      for (int64_t j = 0; j < len; j++) {
        if (prev >= 0) {  // skip j ranking at or before prev
          bool after = score_gt(row[prev], row[j]) || (!score_gt(row[j], row[prev]) && j > prev);
          if (!after) continue;
        }
        if (best < 0 || score_gt(row[j], row[best])) best = j;
      }
      ir[q] = best;
      out[r * k + q] = row[best];
      prev = best;
    }
  }
}

// Batch norm over x [N, C, S]. The per-channel reductions run on a grid of
// C x P blocks: block (c, p) sums part p of channel c's N*S elements (a
// fixed split), then one thread per channel adds the P partial sums in
// order. One block per channel (the first version) left most of the GPU
// idle: 16 channels are 16 blocks on 132 SMs. Sums are in double like the
// CPU kernel's; the variance is E[x^2] - mean^2 in double, exact enough for
// f32 data unless mean^2 / var exceeds ~1e8. Deterministic run to run.
// Index type I: 32-bit where the tensor allows (64-bit division is slow).
constexpr int64_t kBnPartMin = 2048;  // elements per block at least
constexpr int64_t kBnBlocks = 1024;   // aim: about 8 blocks per SM

// Parts per channel for m = N*S elements per channel.
inline int64_t bn_parts(int64_t C, int64_t m) {
  int64_t p = (kBnBlocks + C - 1) / (C ? C : 1);
  int64_t most = (m + kBnPartMin - 1) / kBnPartMin;
  if (p > most) p = most;
  if (p > 65535) p = 65535;
  return p < 1 ? 1 : p;
}

// Part p of channel c: elements [lo, hi) of the channel's m, in the order
// (n, s); partial[(c * P + p) * 2 + k] gets the two sums.
template <typename I>
__device__ inline void bn_part_range(I m, I P, I p, I *lo, I *hi) {
  *lo = (I)((int64_t)m * p / P);
  *hi = (I)((int64_t)m * (p + 1) / P);
}

template <typename I>
__global__ void bn_stats_part_kernel(const float *x, I C, I S, I m, double *partial) {
  I p = blockIdx.y, P = gridDim.y, lo, hi;
  bn_part_range<I>(m, P, p, &lo, &hi);
  for (I c = blockIdx.x; c < C; c += gridDim.x) {
    double s = 0, q = 0;
    for (I j = lo + threadIdx.x; j < hi; j += blockDim.x) {
      double v = x[(j / S) * C * S + c * S + j % S];
      s += v;
      q += v * v;
    }
    s = block_sum(s);
    q = block_sum(q);
    if (threadIdx.x == 0) {
      partial[((int64_t)c * P + p) * 2] = s;
      partial[((int64_t)c * P + p) * 2 + 1] = q;
    }
  }
}

// Channel c's two sums over its P parts, in part order.
__device__ inline void bn_sum_parts(const double *partial, int64_t c, int64_t P, double *a,
                                    double *b) {
  double x = 0, y = 0;
  for (int64_t p = 0; p < P; p++) {
    x += partial[(c * P + p) * 2];
    y += partial[(c * P + p) * 2 + 1];
  }
  *a = x;
  *b = y;
}

__global__ void bn_stats_final_kernel(const double *partial, int64_t C, int64_t P, int64_t m,
                                      float *mean, float *var) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C;
       c += (int64_t)blockDim.x * gridDim.x) {
    double s, q;
    bn_sum_parts(partial, c, P, &s, &q);
    double d = (double)(m ? m : 1), mu = s / d, v = q / d - mu * mu;
    mean[c] = (float)mu;
    var[c] = (float)(v > 0 ? v : 0);
  }
}

template <typename I>
__global__ void bn_apply_kernel(const float *x, const float *scale, const float *bias,
                                const float *mean, const float *var, float eps, float *y, I total,
                                I C, I S) {
  for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < total; i += (I)blockDim.x * gridDim.x) {
    I c = (i / S) % C;
    float inv = 1.0f / sqrtf(var[c] + eps);
    y[i] = (x[i] - mean[c]) * inv * scale[c] + bias[c];
  }
}

// Running statistics (may alias mean/var: element-wise) and test-mode copies.
__global__ void bn_running_kernel(const float *mean, const float *var, const float *saved_mean,
                                  const float *saved_var, float momentum, float *mean_out,
                                  float *var_out, int64_t C) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C;
       c += (int64_t)blockDim.x * gridDim.x) {
    if (mean_out) mean_out[c] = momentum * mean[c] + (1.0f - momentum) * saved_mean[c];
    if (var_out) var_out[c] = momentum * var[c] + (1.0f - momentum) * saved_var[c];
  }
}

// Partial sums of dy and dy * (x - mean) per (channel, part).
template <typename I>
__global__ void bn_bwd_part_kernel(const float *x, const float *mean, const float *dy, I C, I S,
                                   I m, double *partial) {
  I p = blockIdx.y, P = gridDim.y, lo, hi;
  bn_part_range<I>(m, P, p, &lo, &hi);
  for (I c = blockIdx.x; c < C; c += gridDim.x) {
    float mu = mean[c];
    double sb = 0, ss = 0;
    for (I j = lo + threadIdx.x; j < hi; j += blockDim.x) {
      I o = (j / S) * C * S + c * S + j % S;
      sb += dy[o];
      ss += (double)dy[o] * (x[o] - mu);
    }
    sb = block_sum(sb);
    ss = block_sum(ss);
    if (threadIdx.x == 0) {
      partial[((int64_t)c * P + p) * 2] = sb;
      partial[((int64_t)c * P + p) * 2 + 1] = ss;
    }
  }
}

__global__ void bn_bwd_final_kernel(const double *partial, const float *var, float eps, int64_t C,
                                    int64_t P, float *dscale, float *dbias) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C;
       c += (int64_t)blockDim.x * gridDim.x) {
    double sb, ss;
    bn_sum_parts(partial, c, P, &sb, &ss);
    dbias[c] = (float)sb;
    dscale[c] = (float)(ss / sqrt((double)var[c] + eps));
  }
}

template <typename I>
__global__ void bn_bwd_dx_kernel(const float *x, const float *scale, const float *mean,
                                 const float *var, const float *dy, const float *dscale,
                                 const float *dbias, float eps, int is_test, I total, I C, I S,
                                 I m, float *dx) {
  for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < total; i += (I)blockDim.x * gridDim.x) {
    I c = (i / S) % C;
    float inv = 1.0f / sqrtf(var[c] + eps);
    if (is_test) {
      dx[i] = dy[i] * scale[c] * inv;
      continue;
    }
    float xhat = (x[i] - mean[c]) * inv;
    dx[i] = scale[c] * inv / (float)m * ((float)m * dy[i] - dbias[c] - xhat * dscale[c]);
  }
}

inline unsigned flat_blocks(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : (unsigned)b;
}
inline unsigned chan_blocks(int64_t C) {
  return C < 1 ? 1 : C > 65535 ? 65535 : (unsigned)C;
}
// 32-bit indices suffice: every index is below total, and an index plus a
// grid stride (< 2^28) stays below 2^31.
inline bool bn_small(int64_t total) { return total <= INT32_MAX / 2; }

}  // namespace

extern "C" {

cudaError_t pe_cu_swce(const float *x, const int64_t *hard, const float *soft, float *sm,
                       float *loss, int64_t rows, int64_t C, cudaStream_t s) {
  if (rows == 0 || C == 0) return cudaSuccess;
  swce_kernel<<<row_blocks(rows), kRowsPerBlock * kWarp, 0, s>>>(x, hard, soft, sm, loss, rows, C);
  return cudaGetLastError();
}

cudaError_t pe_cu_swce_grad(const float *sm, const int64_t *hard, const float *soft,
                            const float *dloss, const float *dsm, float *dx, int64_t rows,
                            int64_t C, cudaStream_t s) {
  if (rows == 0 || C == 0) return cudaSuccess;
  swce_grad_kernel<<<row_blocks(rows), kRowsPerBlock * kWarp, 0, s>>>(sm, hard, soft, dloss, dsm,
                                                                      dx, rows, C);
  return cudaGetLastError();
}

cudaError_t pe_cu_ce(const float *x, const int64_t *hard, const float *soft, float *y,
                     int64_t rows, int64_t C, cudaStream_t s) {
  if (rows == 0 || C == 0) return cudaSuccess;
  ce_kernel<<<row_blocks(rows), kRowsPerBlock * kWarp, 0, s>>>(x, hard, soft, y, rows, C);
  return cudaGetLastError();
}

cudaError_t pe_cu_ce_grad(const float *x, const int64_t *hard, const float *soft, const float *dy,
                          float *dx, int64_t rows, int64_t C, cudaStream_t s) {
  if (rows == 0 || C == 0) return cudaSuccess;
  ce_grad_kernel<<<row_blocks(rows), kRowsPerBlock * kWarp, 0, s>>>(x, hard, soft, dy, dx, rows, C);
  return cudaGetLastError();
}

cudaError_t pe_cu_mean(const float *x, int64_t n, float *out, cudaStream_t s) {
  mean_kernel<<<1, kThreads, 0, s>>>(x, n, out);
  return cudaGetLastError();
}

cudaError_t pe_cu_clip_by_global_norm(const float *const *x, float *const *out, const int64_t *n,
                                      int k, double max_norm, double *sq, float *norm,
                                      cudaStream_t s) {
  for (int j = 0; j < k; j++) sumsq_kernel<<<1, kThreads, 0, s>>>(x[j], n[j], sq + j);
  cudaError_t e = cudaGetLastError();
  for (int j = 0; j < k && e == cudaSuccess; j++) {
    if (n[j]) clip_scale_kernel<<<flat_blocks(n[j]), kThreads, 0, s>>>(x[j], out[j], n[j], sq, k,
                                                                        max_norm);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess && norm) {
    clip_norm_kernel<<<1, 1, 0, s>>>(sq, k, norm);
    e = cudaGetLastError();
  }
  return e;
}

cudaError_t pe_cu_mean_grad(const float *dout, float *dx, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  mean_grad_kernel<<<flat_blocks(n), kThreads, 0, s>>>(dout, dx, n);
  return cudaGetLastError();
}

cudaError_t pe_cu_accuracy(const void *x, int dtype, const int64_t *label, int64_t n, int64_t cls,
                           int64_t k, float *acc, int64_t *correct, int64_t *total,
                           cudaStream_t s) {
  switch (dtype) {
    case 0: accuracy_kernel<float><<<1, kThreads, 0, s>>>((const float *)x, label, n, cls, k, acc, correct, total); break;
    case 1: accuracy_kernel<double><<<1, kThreads, 0, s>>>((const double *)x, label, n, cls, k, acc, correct, total); break;
    case 2: accuracy_kernel<int32_t><<<1, kThreads, 0, s>>>((const int32_t *)x, label, n, cls, k, acc, correct, total); break;
    case 3: accuracy_kernel<int64_t><<<1, kThreads, 0, s>>>((const int64_t *)x, label, n, cls, k, acc, correct, total); break;
    default: accuracy_kernel<uint8_t><<<1, kThreads, 0, s>>>((const uint8_t *)x, label, n, cls, k, acc, correct, total); break;
  }
  return cudaGetLastError();
}

cudaError_t pe_cu_top_k(const void *x, int dtype, int64_t rows, int64_t len, int64_t k, void *out,
                        int64_t *idx, cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  unsigned b = flat_blocks(rows);
  switch (dtype) {
    case 0: top_k_kernel<float><<<b, kThreads, 0, s>>>((const float *)x, rows, len, k, (float *)out, idx); break;
    case 1: top_k_kernel<double><<<b, kThreads, 0, s>>>((const double *)x, rows, len, k, (double *)out, idx); break;
    case 2: top_k_kernel<int32_t><<<b, kThreads, 0, s>>>((const int32_t *)x, rows, len, k, (int32_t *)out, idx); break;
    case 3: top_k_kernel<int64_t><<<b, kThreads, 0, s>>>((const int64_t *)x, rows, len, k, (int64_t *)out, idx); break;
    default: top_k_kernel<uint8_t><<<b, kThreads, 0, s>>>((const uint8_t *)x, rows, len, k, (uint8_t *)out, idx); break;
  }
  return cudaGetLastError();
}

size_t pe_cu_bn_scratch_bytes(int64_t N, int64_t C, int64_t S) {
  return (size_t)(C * bn_parts(C, N * S) * 2) * sizeof(double);
}

// The statistics of x into mean/var (C x P parts, then the combine).
static cudaError_t bn_stats(const float *x, int64_t N, int64_t C, int64_t S, void *scratch,
                            float *mean, float *var, cudaStream_t s) {
  int64_t m = N * S, P = bn_parts(C, m);
  double *partial = (double *)scratch;
  dim3 grid(chan_blocks(C), (unsigned)P);
  if (bn_small(N * C * S))
    bn_stats_part_kernel<int32_t><<<grid, kThreads, 0, s>>>(x, (int32_t)C, (int32_t)S, (int32_t)m, partial);
  else
    bn_stats_part_kernel<int64_t><<<grid, kThreads, 0, s>>>(x, C, S, m, partial);
  bn_stats_final_kernel<<<flat_blocks(C), kThreads, 0, s>>>(partial, C, P, m, mean, var);
  return cudaGetLastError();
}

static void bn_apply(const float *x, const float *scale, const float *bias, const float *mean,
                     const float *var, float eps, float *y, int64_t total, int64_t C, int64_t S,
                     cudaStream_t s) {
  if (!total) return;
  if (bn_small(total))
    bn_apply_kernel<int32_t><<<flat_blocks(total), kThreads, 0, s>>>(x, scale, bias, mean, var, eps, y, (int32_t)total, (int32_t)C, (int32_t)S);
  else
    bn_apply_kernel<int64_t><<<flat_blocks(total), kThreads, 0, s>>>(x, scale, bias, mean, var, eps, y, total, C, S);
}

cudaError_t pe_cu_bn_fwd(const float *x, const float *scale, const float *bias, const float *mean,
                         const float *var, float *y, float *mean_out, float *var_out,
                         float *saved_mean, float *saved_var, int64_t N, int64_t C, int64_t S,
                         float momentum, float eps, int is_test, void *scratch, cudaStream_t s) {
  int64_t total = N * C * S;
  cudaError_t e;
  if (is_test) {
    // Copies of the running statistics (the CPU kernel's memmoves); a
    // pointer equal to its source is already right.
    const float *src[4] = {mean, var, mean, var};
    float *dst[4] = {saved_mean, saved_var, mean_out, var_out};
    for (int i = 0; i < 4; i++)
      if (dst[i] && dst[i] != src[i] &&
          (e = cudaMemcpyAsync(dst[i], src[i], C * sizeof(float), cudaMemcpyDeviceToDevice, s)))
        return e;
    bn_apply(x, scale, bias, mean, var, eps, y, total, C, S, s);
    return cudaGetLastError();
  }
  if ((e = bn_stats(x, N, C, S, scratch, saved_mean, saved_var, s))) return e;
  bn_apply(x, scale, bias, saved_mean, saved_var, eps, y, total, C, S, s);
  if (mean_out || var_out)
    bn_running_kernel<<<flat_blocks(C), kThreads, 0, s>>>(mean, var, saved_mean, saved_var, momentum, mean_out, var_out, C);
  return cudaGetLastError();
}

cudaError_t pe_cu_bn_bwd(const float *x, const float *scale, const float *saved_mean,
                         const float *saved_var, const float *dy, float *dx, float *dscale,
                         float *dbias, int64_t N, int64_t C, int64_t S, float eps, int is_test,
                         void *scratch, cudaStream_t s) {
  int64_t total = N * C * S, m = N * S, P = bn_parts(C, m);
  double *partial = (double *)scratch;
  dim3 grid(chan_blocks(C), (unsigned)P);
  bool small = bn_small(total);
  if (small)
    bn_bwd_part_kernel<int32_t><<<grid, kThreads, 0, s>>>(x, saved_mean, dy, (int32_t)C, (int32_t)S, (int32_t)m, partial);
  else
    bn_bwd_part_kernel<int64_t><<<grid, kThreads, 0, s>>>(x, saved_mean, dy, C, S, m, partial);
  bn_bwd_final_kernel<<<flat_blocks(C), kThreads, 0, s>>>(partial, saved_var, eps, C, P, dscale, dbias);
  if (dx && total) {
    if (small)
      bn_bwd_dx_kernel<int32_t><<<flat_blocks(total), kThreads, 0, s>>>(x, scale, saved_mean, saved_var, dy, dscale, dbias, eps, is_test, (int32_t)total, (int32_t)C, (int32_t)S, (int32_t)m, dx);
    else
      bn_bwd_dx_kernel<int64_t><<<flat_blocks(total), kThreads, 0, s>>>(x, scale, saved_mean, saved_var, dy, dscale, dbias, eps, is_test, total, C, S, m, dx);
  }
  return cudaGetLastError();
}

}  // extern "C"
