// Launch shapes shared by the hand-written kernels (kernels_*.cu):
// flat grid-stride loops over int64 indices (tensors may pass 2^31
// elements; the grid is capped and the loop covers the rest), and row
// kernels with one warp per row.
#ifndef PE_CUDA_LAUNCH_CUH
#define PE_CUDA_LAUNCH_CUH

#include <stdint.h>

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;  // warps per block in row kernels

// Blocks of kThreads for n elements, at most 65535 * 8.
inline unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  return b > 65535 * 8 ? 65535 * 8 : (unsigned)b;
}

#define GRID_LOOP(i, n)                                                       \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); \
       i += (int64_t)blockDim.x * gridDim.x)

// Blocks of kRowsPerBlock warps for `rows` rows, at most 65535.
inline unsigned row_blocks(int64_t rows) {
  int64_t b = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  return b < 1 ? 1 : b > 65535 ? 65535 : (unsigned)b;
}

// Row r of this warp, in a loop over all rows (launched with row_blocks).
#define ROW_LOOP(r, rows)                                                                 \
  for (int64_t r = (int64_t)blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp; r < (rows); \
       r += (int64_t)gridDim.x * kRowsPerBlock)

__device__ inline double warp_sum(double v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

#endif
