/* Launchers of the data-movement kernels (kernels_shape.cu): the strided
 * copy under transpose2, slice, concat and split, tril_triu's triangle,
 * cast's conversion and position_ids' counting. Any dtype (by element size, or by pe_dtype code for
 * cast). They enqueue on `s` and return the launch's cudaError_t. */
#ifndef PE_CUDA_KERNELS_SHAPE_H
#define PE_CUDA_KERNELS_SHAPE_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda/shape_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The copy of p (simplified: pe_cu_strided_simplify) of numel elements of
 * esz bytes (1, 2, 4 or 8; else cudaErrorInvalidValue). */
cudaError_t pe_cu_strided_copy(const pe_cu_strided *p, int64_t numel, void *dst, const void *src,
                               size_t esz, cudaStream_t s);

/* dst = src with the elements outside the triangle of each [rows, cols]
 * matrix zeroed (tril_triu: lower keeps j - i <= diag, upper j - i >=
 * diag); mats matrices of esz-byte elements; dst may equal src. */
cudaError_t pe_cu_tril_triu(const void *src, void *dst, int64_t mats, int64_t rows, int64_t cols,
                            int64_t diag, int lower, size_t esz, cudaStream_t s);

/* dst (dtype `to`) = src (dtype `from`), pe_dtype codes 0 f32, 1 f64,
 * 2 i32, 3 i64, 4 u8. Floats to integers truncate toward zero and
 * saturate at the target's range, NaN gives 0 (the CPU kernel reports
 * those as errors instead: a check here would need a device sync). */
cudaError_t pe_cu_cast(const void *src, int from, void *dst, int to, int64_t n, cudaStream_t s);

/* position_ids: out[i] = start + i % t over n i64 elements (t, the last
 * dim, >= 1 when n > 0). */
cudaError_t pe_cu_position_ids(int64_t *out, int64_t n, int64_t t, int64_t start, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
