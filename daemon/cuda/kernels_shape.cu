// Data-movement kernels (launchers in kernels_shape.h): strided copy,
// triangles, dtype conversion, position ids. One thread per element in a grid-stride
// loop; indices are int64 throughout (tensors may pass 2^31 elements).
#include <math.h>
#include <stdint.h>

#include "launch.cuh"
#include "kernels_shape.h"

namespace {

template <typename T>
__global__ void strided_kernel(pe_cu_strided p, int64_t numel, T *dst, const T *src) {
  GRID_LOOP(i, numel) {
    int64_t r = i, d = 0, s = 0;
    for (int k = p.nd - 1; k >= 0; k--) {
      int64_t q = r % p.dims[k];
      r /= p.dims[k];
      d += q * p.dst[k];
      s += q * p.src[k];
    }
    dst[d] = src[s];
  }
}

template <typename T>
__global__ void tril_triu_kernel(const T *src, T *dst, int64_t total, int64_t rows, int64_t cols,
                                 int64_t diag, int lower) {
  GRID_LOOP(e, total) {
    int64_t j = e % cols, i = (e / cols) % rows;
    bool keep = lower ? j - i <= diag : j - i >= diag;
    dst[e] = keep ? src[e] : T(0);
  }
}

template <typename T>
__device__ inline T cast_float(double v, double lo, double hi) {
  if (isnan(v)) return T(0);
  v = trunc(v);
  return v <= lo ? (T)lo : v >= hi ? (T)hi : (T)v;
}

// An element of dtype `from` as a double (floats) or an int64 (integers).
__device__ inline double load_f(const void *p, int from, int64_t i) {
  return from == 0 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}
__device__ inline int64_t load_i(const void *p, int from, int64_t i) {
  return from == 2 ? ((const int32_t *)p)[i] : from == 3 ? ((const int64_t *)p)[i]
                                                         : ((const uint8_t *)p)[i];
}

template <typename T>
__device__ inline T sat_i(int64_t v, int64_t lo, int64_t hi) {
  return (T)(v < lo ? lo : v > hi ? hi : v);
}

__global__ void cast_kernel(const void *src, int from, void *dst, int to, int64_t n) {
  bool ff = from <= 1;
  GRID_LOOP(i, n) {
    switch (to) {
      case 0:
        // Integers through double, as the CPU kernel converts them (an i64
        // past 2^53 may round differently when converted directly).
        ((float *)dst)[i] = ff ? (float)load_f(src, from, i) : (float)(double)load_i(src, from, i);
        break;
      case 1:
        ((double *)dst)[i] = ff ? load_f(src, from, i) : (double)load_i(src, from, i);
        break;
      case 2:
        ((int32_t *)dst)[i] = ff ? cast_float<int32_t>(load_f(src, from, i), INT32_MIN, INT32_MAX)
                                 : sat_i<int32_t>(load_i(src, from, i), INT32_MIN, INT32_MAX);
        break;
      case 3:
        // 2^63 is the first double past INT64_MAX: compare below it.
        if (ff) {
          double v = load_f(src, from, i);
          ((int64_t *)dst)[i] = isnan(v) ? 0
                                : trunc(v) >= 0x1p63 ? INT64_MAX
                                : trunc(v) <= -0x1p63 ? INT64_MIN
                                                      : (int64_t)trunc(v);
        } else {
          ((int64_t *)dst)[i] = load_i(src, from, i);
        }
        break;
      default:
        ((uint8_t *)dst)[i] = ff ? cast_float<uint8_t>(load_f(src, from, i), 0, 255)
                                 : sat_i<uint8_t>(load_i(src, from, i), 0, 255);
        break;
    }
  }
}

__global__ void position_ids_kernel(int64_t *out, int64_t n, int64_t t, int64_t start) {
  GRID_LOOP(i, n) out[i] = start + i % t;
}

}  // namespace

#define LAUNCH(n) blocks_for(n), kThreads, 0, s

extern "C" {

cudaError_t pe_cu_strided_copy(const pe_cu_strided *p, int64_t numel, void *dst, const void *src,
                               size_t esz, cudaStream_t s) {
  if (numel == 0) return cudaSuccess;
  switch (esz) {
    case 1: strided_kernel<<<LAUNCH(numel)>>>(*p, numel, (uint8_t *)dst, (const uint8_t *)src); break;
    case 2:
      strided_kernel<<<LAUNCH(numel)>>>(*p, numel, (uint16_t *)dst, (const uint16_t *)src);
      break;
    case 4:
      strided_kernel<<<LAUNCH(numel)>>>(*p, numel, (uint32_t *)dst, (const uint32_t *)src);
      break;
    case 8:
      strided_kernel<<<LAUNCH(numel)>>>(*p, numel, (uint64_t *)dst, (const uint64_t *)src);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t pe_cu_tril_triu(const void *src, void *dst, int64_t mats, int64_t rows, int64_t cols,
                            int64_t diag, int lower, size_t esz, cudaStream_t s) {
  int64_t total = mats * rows * cols;
  if (total == 0) return cudaSuccess;
  switch (esz) {
    case 1:
      tril_triu_kernel<<<LAUNCH(total)>>>((const uint8_t *)src, (uint8_t *)dst, total, rows, cols,
                                           diag, lower);
      break;
    case 2:
      tril_triu_kernel<<<LAUNCH(total)>>>((const uint16_t *)src, (uint16_t *)dst, total, rows,
                                           cols, diag, lower);
      break;
    case 4:
      tril_triu_kernel<<<LAUNCH(total)>>>((const uint32_t *)src, (uint32_t *)dst, total, rows,
                                           cols, diag, lower);
      break;
    case 8:
      tril_triu_kernel<<<LAUNCH(total)>>>((const uint64_t *)src, (uint64_t *)dst, total, rows,
                                           cols, diag, lower);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t pe_cu_cast(const void *src, int from, void *dst, int to, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (from < 0 || from > 4 || to < 0 || to > 4) return cudaErrorInvalidValue;
  cast_kernel<<<LAUNCH(n)>>>(src, from, dst, to, n);
  return cudaGetLastError();
}

cudaError_t pe_cu_position_ids(int64_t *out, int64_t n, int64_t t, int64_t start, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (t < 1) return cudaErrorInvalidValue;
  position_ids_kernel<<<blocks_for(n), kThreads, 0, s>>>(out, n, t, start);
  return cudaGetLastError();
}

}  // extern "C"
