// The masked row softmax and its gradient (launchers in kernels_softmax.h):
// one warp per row. Forward: the row's max over its unmasked columns, the
// sum of exp(x - max) in double, then each probability, reading x (plus the
// mask) again in each pass instead of keeping the row: rows of any length
// run with the same launch. Columns past the causal diagonal are never
// read; they get 0. Gradient: the row's dot product of dy and p in double,
// then dx. Each lane writes only the elements it read, so y may alias x and
// dx may alias dy. No atomics: deterministic run to run.
#include <math.h>
#include <stdint.h>

#include "kernels_softmax.h"
#include "launch.cuh"

namespace {

// The first mask element of score row r (the rows of the [.., q, k]
// scores in order): the row's index per dim, from the right, times the
// mask's strides.
__device__ inline int64_t mask_row(const pe_cu_smask &v, int64_t r, int64_t q) {
  int nd = v.nd;
  int64_t off = (r % q) * v.st[nd - 2], rest = r / q;
  for (int d = nd - 3; d >= 0; d--) {
    off += (rest % v.dims[d]) * v.st[d];
    rest /= v.dims[d];
  }
  return off;
}

__global__ void softmax_rows_kernel(const float *x, const float *mask, pe_cu_smask v, int causal,
                                    float *y, int64_t rows, int64_t q, int64_t k) {
  int lane = threadIdx.x % kWarp;
  int64_t mk = mask ? v.st[v.nd - 1] : 0;
  ROW_LOOP(r, rows) {
    const float *xr = x + r * k;
    const float *mr = mask ? mask + mask_row(v, r, q) : NULL;
    int64_t i = r % q, lim = causal && i + 1 < k ? i + 1 : k;
    float m = -INFINITY;
    for (int64_t j = lane; j < lim; j += kWarp) m = fmaxf(m, xr[j] + (mr ? mr[j * mk] : 0.0f));
    m = warp_max(m);
    double sum = 0;
    for (int64_t j = lane; j < lim; j += kWarp) sum += expf(xr[j] + (mr ? mr[j * mk] : 0.0f) - m);
    float inv = (float)(1.0 / warp_sum(sum));
    float *yr = y + r * k;
    for (int64_t j = lane; j < k; j += kWarp)
      yr[j] = j < lim ? expf(xr[j] + (mr ? mr[j * mk] : 0.0f) - m) * inv : 0.0f;
  }
}

__global__ void softmax_rows_grad_kernel(const float *p, const float *dy, float *dx, int64_t rows,
                                         int64_t k) {
  int lane = threadIdx.x % kWarp;
  ROW_LOOP(r, rows) {
    const float *pr = p + r * k, *gr = dy + r * k;
    double dot = 0;
    for (int64_t j = lane; j < k; j += kWarp) dot += (double)gr[j] * pr[j];
    float s = (float)warp_sum(dot);
    float *dr = dx + r * k;
    for (int64_t j = lane; j < k; j += kWarp) dr[j] = pr[j] * (gr[j] - s);
  }
}

}  // namespace

extern "C" {

cudaError_t pe_cu_softmax_rows(const float *x, const float *mask, const pe_cu_smask *view,
                               int causal, float *y, int64_t rows, int64_t q, int64_t k,
                               cudaStream_t s) {
  if (rows == 0 || k == 0) return cudaSuccess;
  if (q < 1 || (mask && (!view || view->nd < 2))) return cudaErrorInvalidValue;
  pe_cu_smask v = mask ? *view : pe_cu_smask{};
  softmax_rows_kernel<<<row_blocks(rows), kRowsPerBlock * kWarp, 0, s>>>(x, mask, v, causal, y,
                                                                         rows, q, k);
  return cudaGetLastError();
}

cudaError_t pe_cu_softmax_rows_grad(const float *p, const float *dy, float *dx, int64_t rows,
                                    int64_t k, cudaStream_t s) {
  if (rows == 0 || k == 0) return cudaSuccess;
  softmax_rows_grad_kernel<<<row_blocks(rows), kRowsPerBlock * kWarp, 0, s>>>(p, dy, dx, rows, k);
  return cudaGetLastError();
}

}  // extern "C"
