#include "tensor.h"

#include <string.h>

void pe_tensor_init(pe_tensor *t) { memset(t, 0, sizeof(*t)); }

void pe_tensor_release(pe_tensor *t) {
  if (t->alloc && t->data) pe_free(t->alloc, t->data, t->cap);
  pe_tensor_init(t);
}

pe_status *pe_tensor_resize_with(pe_tensor *t, pe_allocator *a, pe_dtype dt, const pe_shape *shape,
                                 const char *what) {
  char sb[PE_SHAPE_STRLEN];
  int64_t n = pe_shape_numel(shape);
  if (n < 0 || !pe_dtype_valid(dt))
    return pe_error(PE_ESHAPE, "tensor '%s': cannot allocate shape %s of %s", what ? what : "?",
                    pe_shape_str(shape, sb, sizeof sb), pe_dtype_name(dt));
  size_t bytes = (size_t)n * pe_dtype_size(dt);
  if (bytes > t->cap || (!t->alloc && t->data)) {
    /* Views are never written through on resize: detach and allocate. */
    if (t->alloc && t->data) pe_free(t->alloc, t->data, t->cap);
    else if (!t->alloc) t->data = NULL;
    t->data = NULL;
    t->cap = 0;
    size_t cap;
    void *p = pe_alloc(a, bytes, &cap);
    if (!p)
      return pe_error(PE_ENOMEM, "tensor '%s': out of memory allocating %zu bytes for %s %s",
                      what ? what : "?", bytes, pe_dtype_name(dt), pe_shape_str(shape, sb, sizeof sb));
    t->data = p;
    t->cap = cap;
    t->alloc = a;
  }
  /* Unchanged metadata is not written: a same-shape resize (every kernel's
   * output, every run) stays a read for threads that look at it. */
  if (t->dtype != dt) t->dtype = dt;
  if (!pe_shape_equal(&t->shape, shape)) t->shape = *shape;
  return NULL;
}

pe_status *pe_tensor_resize(pe_tensor *t, pe_dtype dt, const pe_shape *shape, const char *what) {
  return pe_tensor_resize_with(t, t->alloc ? t->alloc : pe_host_allocator(), dt, shape, what);
}

void pe_tensor_view(pe_tensor *t, pe_dtype dt, const pe_shape *shape, void *data) {
  pe_tensor_release(t);
  t->dtype = dt;
  t->shape = *shape;
  t->data = data;
  t->cap = (size_t)pe_shape_numel(shape) * pe_dtype_size(dt);
  t->alloc = NULL;
}

pe_status *pe_tensor_copy(pe_tensor *dst, const pe_tensor *src, const char *what) {
  if (dst == src) return NULL;
  PE_TRY(pe_tensor_resize(dst, src->dtype, &src->shape, what));
  if (pe_tensor_bytes(src)) memcpy(dst->data, src->data, pe_tensor_bytes(src));
  return NULL;
}

void pe_tensor_zero(pe_tensor *t) {
  if (t->data) memset(t->data, 0, pe_tensor_bytes(t));
}
