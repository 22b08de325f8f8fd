/* A copy between two strided views of the same dims (any dtype): the data
 * movement of transpose2 (permuted source strides), slice (a window of the
 * source, or of the destination for its gradient), concat and split. */
#ifndef PE_OPS_CPU_STRIDED_H
#define PE_OPS_CPU_STRIDED_H

#include <stddef.h>
#include <stdint.h>

/* For every index i of dims[0..ndim): dst[i . dst_strides] = src[i .
 * src_strides] (strides in elements of esz bytes). ndim 0 copies one
 * element; a zero dim copies nothing. */
void pe_strided_copy(void *dst, const int64_t *dst_strides, const void *src,
                     const int64_t *src_strides, const int64_t *dims, int ndim, size_t esz);

/* Dense row-major strides of dims. */
void pe_dense_strides(const int64_t *dims, int ndim, int64_t *strides);

#endif
