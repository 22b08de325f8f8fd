/* Element types and shapes. A shape dimension of -1 is the batch dimension,
 * unknown until run time; tensors at run time never hold -1. */
#ifndef PE_CORE_DTYPE_H
#define PE_CORE_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* Number of elements; -1 if any dimension is unknown (-1). */
int64_t pe_shape_numel(const pe_shape *s);
bool pe_shape_equal(const pe_shape *a, const pe_shape *b);
/* Equal except that -1 in either matches any size. */
bool pe_shape_compatible(const pe_shape *a, const pe_shape *b);
/* Product of d[from..to). */
int64_t pe_shape_prod(const pe_shape *s, int from, int to);
/* "[-1,784]" into buf; returns buf. */
const char *pe_shape_str(const pe_shape *s, char *buf, size_t len);
pe_shape pe_shape_make(int ndim, const int64_t *d);
#define PE_SHAPE(...)                                                         \
  pe_shape_make(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), (int64_t[]){__VA_ARGS__})

/* A shape string buffer large enough for any shape. */
#define PE_SHAPE_STRLEN 192

#endif
