/* pe_place_read / write / zero (place_io.h). */
#include "engine/place_io.h"

#include <string.h>

/* Zeroing device memory is a copy from this block, repeated: the device
 * interface has copies, not fills, and zeroing is rare (gradients of a place
 * without samples, fused buckets when compiled). */
#define ZERO_BLOCK 65536
static const unsigned char zero_block[ZERO_BLOCK];

static pe_status *failed(pe_device *d, pe_status *st, const char *what, const char *name,
                         const pe_tensor *t) {
  char pb[32], sb[PE_SHAPE_STRLEN];
  return pe_status_wrap(st, "%s '%s' (%s %s) on %s", what, name ? name : "?",
                        pe_dtype_name(t->dtype), pe_shape_str(&t->shape, sb, sizeof sb),
                        pe_place_str(d->place, pb, sizeof pb));
}

/* One copy queued on d's stream k, then that stream waited for. */
static pe_status *copy_and_wait(pe_device *d, pe_stream_kind k, void *dst, const void *src,
                                size_t bytes, pe_copy_kind ck) {
  pe_stream *s = pe_device_stream(d, k);
  pe_status *st = pe_stream_copy(s, dst, src, bytes, ck);
  return st ? st : pe_stream_sync(s);
}

pe_status *pe_place_read(pe_device *d, const pe_tensor *src, pe_tensor *dst, const char *name) {
  if (pe_device_host_memory(d)) return pe_tensor_copy(dst, src, name);
  PE_TRY(pe_tensor_resize(dst, src->dtype, &src->shape, name));
  size_t bytes = pe_tensor_bytes(src);
  if (!bytes) return NULL;
  pe_status *st = copy_and_wait(d, PE_STREAM_D2H, dst->data, src->data, bytes, PE_COPY_D2H);
  return st ? failed(d, st, "reading", name, src) : NULL;
}

pe_status *pe_place_write(pe_device *d, pe_tensor *dst, const pe_tensor *src, const char *name) {
  pe_allocator *a = pe_device_allocator(d);
  if (!dst->alloc && a) PE_TRY(pe_tensor_resize_with(dst, a, src->dtype, &src->shape, name));
  if (pe_device_host_memory(d)) return pe_tensor_copy(dst, src, name);
  PE_TRY(pe_tensor_resize(dst, src->dtype, &src->shape, name));
  size_t bytes = pe_tensor_bytes(src);
  if (!bytes) return NULL;
  pe_status *st = copy_and_wait(d, PE_STREAM_H2D, dst->data, src->data, bytes, PE_COPY_H2D);
  return st ? failed(d, st, "writing", name, src) : NULL;
}

pe_status *pe_place_zero(pe_device *d, void *p, size_t bytes, const char *name) {
  if (!bytes) return NULL;
  if (pe_device_host_memory(d)) {
    memset(p, 0, bytes);
    return NULL;
  }
  pe_stream *s = pe_device_stream(d, PE_STREAM_H2D);
  pe_status *st = NULL;
  for (size_t at = 0; at < bytes && !st; at += ZERO_BLOCK) {
    size_t n = bytes - at < ZERO_BLOCK ? bytes - at : ZERO_BLOCK;
    st = pe_stream_copy(s, (char *)p + at, zero_block, n, PE_COPY_H2D);
  }
  if (!st) st = pe_stream_sync(s);
  char pb[32];
  return st ? pe_status_wrap(st, "zeroing '%s' (%zu bytes) on %s", name ? name : "?", bytes,
                             pe_place_str(d->place, pb, sizeof pb))
            : NULL;
}
