/* Tensors: dtype + shape + a buffer from an allocator, on a place.
 * A tensor owns its buffer unless it is a view (data borrowed from elsewhere,
 * e.g. a feed in caller memory). Resizing within capacity never reallocates,
 * so a training loop with a fixed batch size allocates only on its first step.
 * A tensor is not thread-safe; the executor guarantees one writer at a time. */
#ifndef PE_CORE_TENSOR_H
#define PE_CORE_TENSOR_H

#include <stdbool.h>

#include "allocator.h"
#include "dtype.h"
#include "place.h"
#include "status.h"

typedef struct pe_tensor {
  pe_dtype dtype;
  pe_shape shape;
  void *data;
  size_t cap;          /* bytes usable at data */
  pe_allocator *alloc; /* NULL for a view or an empty tensor */
  pe_place place;
} pe_tensor;

/* Zero-initialised tensors are valid and empty. */
void pe_tensor_init(pe_tensor *t);
/* Release the buffer (if owned) and reset to empty. */
void pe_tensor_release(pe_tensor *t);
/* Give t the dtype and shape, (re)allocating from the host allocator when
 * capacity is short. Contents are unspecified after a reallocation. Shapes
 * with -1 are rejected. `what` names the variable for the error message. */
pe_status *pe_tensor_resize(pe_tensor *t, pe_dtype dt, const pe_shape *shape, const char *what);
pe_status *pe_tensor_resize_with(pe_tensor *t, pe_allocator *a, pe_dtype dt, const pe_shape *shape,
                                 const char *what);
/* Point t at caller memory (no copy, no ownership). */
void pe_tensor_view(pe_tensor *t, pe_dtype dt, const pe_shape *shape, void *data);
/* dst := src (resize + copy). */
pe_status *pe_tensor_copy(pe_tensor *dst, const pe_tensor *src, const char *what);
void pe_tensor_zero(pe_tensor *t);
static inline int64_t pe_tensor_numel(const pe_tensor *t) { return pe_shape_numel(&t->shape); }
static inline size_t pe_tensor_bytes(const pe_tensor *t) {
  return (size_t)pe_tensor_numel(t) * pe_dtype_size(t->dtype);
}
static inline float *pe_f32(const pe_tensor *t) { return (float *)t->data; }
static inline int64_t *pe_i64(const pe_tensor *t) { return (int64_t *)t->data; }

#endif
