/* Host-side index arithmetic of the CUDA shape and batched-matmul kernels:
 * plain C without CUDA, so that tests/cuda/test_cuda_plan.c checks it on
 * any machine. The ops' own rules (slice's bounds, ops/slice_bounds.h;
 * matmul_v2's view and broadcast batch, ops/matmul_view.h) are shared with
 * the CPU kernels; these functions describe the same views as strides for
 * the device. */
#ifndef PE_CUDA_SHAPE_PLAN_H
#define PE_CUDA_SHAPE_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"

/* A copy between two strided views of the same dims (strides in
 * elements): dst[i . dst] = src[i . src] for every index i of dims. */
typedef struct pe_cu_strided {
  int nd;
  int64_t dims[PE_MAX_DIMS];
  int64_t dst[PE_MAX_DIMS];
  int64_t src[PE_MAX_DIMS];
} pe_cu_strided;

/* The same copy with dims of size 1 dropped and neighbouring dims merged
 * where both views are contiguous across them (a dense copy becomes one
 * dim); returns the number of elements (0: nothing to copy). */
int64_t pe_cu_strided_simplify(pe_cu_strided *p);

/* transpose2: Out (dense, dims x permuted by perm) from X (dense, dims x). */
void pe_cu_plan_transpose(const pe_shape *x, const int *perm, pe_cu_strided *p);

/* slice's window of Input x for the attributes axes/starts/ends (n of
 * each, checked by the op's infer): start and size per dim of x. */
void pe_cu_slice_window(const pe_shape *x, const int64_t *axes, const int64_t *starts,
                        const int64_t *ends, int n, int64_t *start, int64_t *size);

/* The batch of one batched product C[b] = A[b'] . B[b''] over batch dims
 * ob, where A's and B's batch dims (ab, bb) equal ob or are 1 (broadcast)
 * and C is dense over ob. st[0..2][d]: how many matrices A, B and C
 * advance per step of merged dim d (0: broadcast). Dims of size 1 are
 * dropped and neighbours merged while every operand steps through them
 * uniformly, so an unbroadcast batch, or one operand broadcast over all of
 * it, is one dim: one strided-batched GEMM. */
typedef struct pe_cu_batch {
  int nd;
  int64_t n[PE_MAX_DIMS];
  int64_t st[3][PE_MAX_DIMS];
} pe_cu_batch;
void pe_cu_batch_plan(int nb, const int64_t *ob, const int64_t *ab, const int64_t *bb,
                      pe_cu_batch *p);

#endif
