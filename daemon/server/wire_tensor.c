/* Tensors between the wire and the engine (wire_tensor.h). */
#include "server/wire_tensor.h"

#include <stdlib.h>

/* A host tensor owned by the arena (its buffer released with it). */
static void tensor_dtor(void *p) {
  pe_tensor_release(p);
  free(p);
}

pe_tensor *pe_arena_tensor(pe_arena *a) {
  pe_tensor *t = calloc(1, sizeof *t);
  return pe_arena_own(a, t, tensor_dtor) ? t : NULL;
}

static const char *shape_str(const pe_shape *s, char *buf) {
  return pe_shape_str(s, buf, PE_SHAPE_STRLEN);
}

/* A shm reference with rows (ShmRef.rows): [offset, +length) holds whole
 * rows of the tensor's row size and row i is rows[i] of them; the tensor is
 * no larger than that array. With a pin the whole array is pinned (the
 * caller copies each batch's rows through pe_shm_pin_read_rows); else the
 * rows are gathered into an owned copy. */
static pe_status *shm_rows_in(pe_server *s, uint64_t client, const char *op, const Pe__Tensor *x,
                              const pe_shape *shape, size_t esz, uint64_t want, pe_tensor *view,
                              pe_shm_pin *pin) {
  const char *name = x->name;
  const Pe__ShmRef *r = x->shm;
  char sb[PE_SHAPE_STRLEN];
  if (shape->ndim < 1 || (uint64_t)shape->d[0] != r->n_rows)
    return pe_error(PE_ESHAPE,
                    "%s: tensor '%.64s' %s %s: its shm reference has %zu row indices, "
                    "not one per index of dim 0",
                    op, name, pe_dtype_name((pe_dtype)x->dtype), shape_str(shape, sb), r->n_rows);
  uint64_t row = want / r->n_rows;
  if (row == 0)
    return pe_error(PE_ESHAPE, "%s: tensor '%.64s' %s %s: rows of 0 bytes cannot be indexed", op,
                    name, pe_dtype_name((pe_dtype)x->dtype), shape_str(shape, sb));
  if (r->length % row)
    return pe_error(PE_ESHAPE,
                    "%s: tensor '%.64s' %s %s: the shm array of %llu bytes is not whole rows of "
                    "%llu bytes",
                    op, name, pe_dtype_name((pe_dtype)x->dtype), shape_str(shape, sb),
                    (unsigned long long)r->length, (unsigned long long)row);
  if (r->offset % esz)
    return pe_error(PE_EINVAL, "%s: tensor '%.64s': shm offset %llu is not a multiple of %zu", op,
                    name, (unsigned long long)r->offset, esz);
  /* A gather costs no more than a plain reference to the same array would:
   * repeated indices cannot make it larger. */
  if (want > r->length)
    return pe_error(PE_ESHAPE,
                    "%s: tensor '%.64s' %s %s: %zu rows of %llu bytes are more than the %llu "
                    "bytes of the shm array they index",
                    op, name, pe_dtype_name((pe_dtype)x->dtype), shape_str(shape, sb), r->n_rows,
                    (unsigned long long)row, (unsigned long long)r->length);
  uint64_t have = r->length / row;
  for (size_t i = 0; i < r->n_rows; i++)
    if (r->rows[i] < 0 || (uint64_t)r->rows[i] >= have)
      return pe_error(PE_EINVAL,
                      "%s: tensor '%.64s': row index %zu is %lld, outside the shm array's %llu "
                      "rows",
                      op, name, i, (long long)r->rows[i], (unsigned long long)have);
  pe_shm_pin own;
  pe_shm_pin *p = pin ? pin : &own;
  PE_TRY(pe_status_wrap(pe_shm_pin_acquire(s->shm, client, r->region, r->offset, r->length, p),
                        "%s: tensor '%.64s'", op, name));
  if (pin) {
    pe_tensor_view(view, (pe_dtype)x->dtype, shape, NULL);
    return NULL;
  }
  pe_status *st = pe_tensor_resize(view, (pe_dtype)x->dtype, shape, name);
  if (!st) st = pe_shm_pin_read_rows(p, r->rows, (int64_t)r->n_rows, row, view->data);
  pe_shm_pin_release(p);
  return pe_status_wrap(st, "%s: tensor '%.64s'", op, name);
}

pe_status *pe_wire_tensor_in(pe_server *s, uint64_t client, const char *op, const Pe__Tensor *x,
                             pe_tensor *view, pe_shm_pin *pin) {
  const char *name = x->name ? x->name : "";
  if (!name[0]) return pe_error(PE_EINVAL, "%s: a tensor has an empty name", op);
  if (!pe_dtype_valid((int)x->dtype))
    return pe_error(PE_EDTYPE, "%s: tensor '%.64s': dtype %d unknown", op, name, (int)x->dtype);
  if (x->n_shape > PE_MAX_DIMS)
    return pe_error(PE_ESHAPE, "%s: tensor '%.64s': %zu dims, at most %d", op, name, x->n_shape,
                    PE_MAX_DIMS);
  pe_shape shape = {.ndim = (int)x->n_shape};
  uint64_t numel = 1;
  for (size_t i = 0; i < x->n_shape; i++) {
    int64_t d = x->shape[i];
    if (d < 0 || d > ((int64_t)1 << 40))
      return pe_error(PE_ESHAPE, "%s: tensor '%.64s': dim %zu is %lld (must be 0..2^40)", op, name,
                      i, (long long)d);
    shape.d[i] = d;
    if (d && numel > UINT64_MAX / (uint64_t)d)
      return pe_error(PE_ESHAPE, "%s: tensor '%.64s': element count overflows", op, name);
    numel *= (uint64_t)d;
  }
  size_t esz = pe_dtype_size((pe_dtype)x->dtype);
  if (numel > UINT64_MAX / esz)
    return pe_error(PE_ESHAPE, "%s: tensor '%.64s': byte count overflows", op, name);
  uint64_t want = numel * esz;
  char sb[PE_SHAPE_STRLEN];
  const void *data;
  if (x->shm) {
    if (x->data.len)
      return pe_error(PE_EINVAL, "%s: tensor '%.64s' has both inline data and a shm reference", op,
                      name);
    if (x->shm->n_rows) return shm_rows_in(s, client, op, x, &shape, esz, want, view, pin);
    if (x->shm->length != want)
      return pe_error(PE_ESHAPE,
                      "%s: tensor '%.64s' %s %s needs %llu bytes, shm reference has %llu", op, name,
                      pe_dtype_name((pe_dtype)x->dtype), shape_str(&shape, sb),
                      (unsigned long long)want, (unsigned long long)x->shm->length);
    if (x->shm->offset % esz)
      return pe_error(PE_EINVAL, "%s: tensor '%.64s': shm offset %llu is not a multiple of %zu", op,
                      name, (unsigned long long)x->shm->offset, esz);
    if (pin) {
      pe_tensor_view(view, (pe_dtype)x->dtype, &shape, NULL);
      return pe_status_wrap(
          pe_shm_pin_acquire(s->shm, client, x->shm->region, x->shm->offset, want, pin),
          "%s: tensor '%.64s'", op, name);
    }
    /* A private copy: a run never reads pages the client could truncate. */
    PE_TRY(pe_tensor_resize(view, (pe_dtype)x->dtype, &shape, name));
    return pe_status_wrap(
        pe_shm_read(s->shm, client, x->shm->region, x->shm->offset, want, view->data),
        "%s: tensor '%.64s'", op, name);
  } else {
    if (x->data.len != want)
      return pe_error(PE_ESHAPE, "%s: tensor '%.64s' %s %s needs %llu bytes, got %zu", op, name,
                      pe_dtype_name((pe_dtype)x->dtype), shape_str(&shape, sb),
                      (unsigned long long)want, x->data.len);
    data = x->data.data;
  }
  /* The executor only reads feeds; the cast drops const for the view. */
  pe_tensor_view(view, (pe_dtype)x->dtype, &shape, (void *)data);
  return NULL;
}

Pe__Tensor *pe_wire_tensor_out(pe_arena *a, const char *name, const pe_tensor *t) {
  Pe__Tensor *x = pe_arena_alloc(a, sizeof *x);
  if (!x) return NULL;
  pe__tensor__init(x);
  x->name = pe_arena_strdup(a, name);
  x->dtype = (Pe__DataType)t->dtype;
  x->n_shape = (size_t)t->shape.ndim;
  x->shape = pe_arena_alloc(a, sizeof(int64_t) * (x->n_shape ? x->n_shape : 1));
  if (!x->name || !x->shape) return NULL;
  for (int i = 0; i < t->shape.ndim; i++) x->shape[i] = t->shape.d[i];
  x->data.len = pe_tensor_bytes(t);
  x->data.data = t->data;
  return x;
}

const char *pe_wire_tensor_name_at(const void *list, size_t i) {
  return ((Pe__Tensor *const *)list)[i]->name;
}
