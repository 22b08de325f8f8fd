// lookup_table_v2's lookup and dense gradient (launchers in kernels_loss.h).
//
// The gradient adds every id's Out@GRAD row into its row of W@GRAD. Rather
// than atomics (whose order varies run to run), the (id, position) pairs
// are sorted by id with CUB's radix sort, which is stable, so each id's
// positions stay in batch order; one block per distinct id then sums its
// rows in that order, starting from zero: the CPU kernel's sum, bit for
// bit, and deterministic.
#include <cub/device/device_radix_sort.cuh>
#include <math.h>
#include <stdint.h>

#include "launch.cuh"
#include "kernels_loss.h"

namespace {

__global__ void lookup_kernel(const float *w, const int64_t *ids, float *out, int64_t total,
                              int64_t dim, int64_t vocab, int64_t pad) {
  GRID_LOOP(e, total) {
    int64_t id = ids[e / dim];
    out[e] = id == pad ? 0.0f : (id < 0 || id >= vocab) ? NAN : w[id * dim + e % dim];
  }
}

__global__ void iota_kernel(int64_t *p, int64_t n) {
  GRID_LOOP(i, n) p[i] = i;
}

// Sorted pairs (key: id, val: position); the block of sorted index s sums
// the run of id keys[s] when s starts it.
__global__ void segment_sum_kernel(const int64_t *keys, const int64_t *pos, const float *dout,
                                   float *dw, int64_t n, int64_t dim, int64_t vocab, int64_t pad) {
  for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {
    int64_t id = keys[s];
    if ((s > 0 && keys[s - 1] == id) || id == pad || id < 0 || id >= vocab) continue;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      float acc = 0.0f;
      for (int64_t e = s; e < n && keys[e] == id; e++) acc += dout[pos[e] * dim + j];
      dw[id * dim + j] = acc;
    }
  }
}

size_t align256(size_t b) {
  return (b + 255) & ~(size_t)255;
}

}  // namespace

extern "C" {

cudaError_t pe_cu_embedding(const float *w, const int64_t *ids, float *out, int64_t n,
                            int64_t dim, int64_t vocab, int64_t pad, cudaStream_t s) {
  int64_t total = n * dim;
  if (total == 0) return cudaSuccess;
  lookup_kernel<<<blocks_for(total), kThreads, 0, s>>>(w, ids, out, total, dim, vocab, pad);
  return cudaGetLastError();
}

// Layout: keys_out [n], pos_in [n], pos_out [n] (i64, 256-byte aligned
// each), then the sort's temporary storage.
size_t pe_cu_embedding_grad_scratch(int64_t n, cudaError_t *err) {
  size_t temp = 0;
  int items = (int)(n > 0 && n <= INT32_MAX ? n : 1);
  *err = cub::DeviceRadixSort::SortPairs(nullptr, temp, (const int64_t *)nullptr,
                                         (int64_t *)nullptr, (const int64_t *)nullptr,
                                         (int64_t *)nullptr, items);
  if (*err != cudaSuccess) return 0;
  return 3 * align256((size_t)items * sizeof(int64_t)) + align256(temp);
}

cudaError_t pe_cu_embedding_grad(const int64_t *ids, const float *dout, float *dw, int64_t n,
                                 int64_t dim, int64_t vocab, int64_t pad, void *scratch,
                                 size_t scratch_bytes, cudaStream_t s) {
  if (vocab * dim == 0) return cudaSuccess;
  cudaError_t e = cudaMemsetAsync(dw, 0, (size_t)(vocab * dim) * sizeof(float), s);
  if (e != cudaSuccess || n == 0 || dim == 0) return e;
  if (n > INT32_MAX) return cudaErrorInvalidValue;
  size_t arr = align256((size_t)n * sizeof(int64_t));
  if (scratch_bytes < 3 * arr) return cudaErrorInvalidValue;
  char *base = (char *)scratch;
  int64_t *keys = (int64_t *)base, *pos_in = (int64_t *)(base + arr);
  int64_t *pos = (int64_t *)(base + 2 * arr);
  void *temp = base + 3 * arr;
  size_t temp_bytes = scratch_bytes - 3 * arr;
  iota_kernel<<<blocks_for(n), kThreads, 0, s>>>(pos_in, n);
  e = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ids, keys, pos_in, pos, (int)n, 0,
                                      (int)sizeof(int64_t) * 8, s);
  if (e != cudaSuccess) return e;
  unsigned grid = n > 65535 * 8 ? 65535 * 8 : (unsigned)n;
  segment_sum_kernel<<<grid, 128, 0, s>>>(keys, pos, dout, dw, n, dim, vocab, pad);
  return cudaGetLastError();
}

}  // extern "C"
