/* Element types and shapes. A shape dimension of -1 is the batch dimension,
 * unknown until run time; tensors at run time never hold -1. */
#ifndef PE_CORE_DTYPE_H
#define PE_CORE_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef enum pe_dtype {
  PE_F32 = 0,
  PE_F64 = 1,
  PE_I32 = 2,
  PE_I64 = 3,
  PE_U8 = 4,
  PE_F16 = 5, /* storage only for now */
  PE_DTYPE_COUNT
} pe_dtype;

size_t pe_dtype_size(pe_dtype dt);
const char *pe_dtype_name(pe_dtype dt);
bool pe_dtype_valid(int dt);
bool pe_dtype_parse(const char *name, pe_dtype *out);

#define PE_MAX_DIMS 8

typedef struct pe_shape {
  int ndim;
  int64_t d[PE_MAX_DIMS];
} pe_shape;

/* The most elements a declared shape (program_pb.c) or a checkpoint's
 * tensor may have, zero dimensions left out: 2^40 (4 TiB of f32). */
#define PE_MAX_NUMEL (INT64_C(1) << 40)

/* Number of elements; -1 if any dimension is unknown (-1). */
int64_t pe_shape_numel(const pe_shape *s);
bool pe_shape_equal(const pe_shape *a, const pe_shape *b);
/* Equal except that -1 in either matches any size. */
bool pe_shape_compatible(const pe_shape *a, const pe_shape *b);
/* Product of d[from..to): -1 if a dimension there is unknown (-1), else 0
 * if one is 0, else -1 too if the product does not fit int64_t (a shape
 * that pe_shape_check accepts does not overflow, whatever the range). */
int64_t pe_shape_prod(const pe_shape *s, int from, int to);
/* NULL, or PE_ESHAPE naming `what` and the shape: a rank over
 * PE_MAX_DIMS, a dimension below -1, or non-zero known dimensions whose
 * product is over max_numel (a zero dimension does not make the others'
 * product small: pe_shape_prod of the range after it is that product). */
pe_status *pe_shape_check(const pe_shape *s, int64_t max_numel, const char *what);
/* "[-1,784]" into buf; returns buf. */
const char *pe_shape_str(const pe_shape *s, char *buf, size_t len);
pe_shape pe_shape_make(int ndim, const int64_t *d);
#define PE_SHAPE(...) \
  pe_shape_make(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), (int64_t[]){__VA_ARGS__})

/* A shape string buffer large enough for any shape. */
#define PE_SHAPE_STRLEN 192

#endif
