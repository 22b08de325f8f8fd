/* matmul_v2's view of its operands, shared by its cpu kernel (oneDNN
 * matmul) and its cuda kernel (strided-batched GEMMs), so both read X and Y
 * by the same rules: nb batch dims aligned to the right (absent ones 1,
 * numpy's broadcast), X stored as [xr, xc] matrices (op(X) is [m, k]), Y
 * as [yr, yc] (op(Y) is [k, n]). A 1-D X is a row [1, K], a 1-D Y a
 * column [K, 1]; their trans flag has no effect. Dims may be -1 at compile
 * time: a known dim > 1 decides a batch dim, an unknown one matches. */
#ifndef PE_OPS_MATMUL_VIEW_H
#define PE_OPS_MATMUL_VIEW_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"

typedef struct pe_mv_view {
  int nb;
  int64_t xb[PE_MAX_DIMS], yb[PE_MAX_DIMS], ob[PE_MAX_DIMS];
  int64_t m, k, n, xr, xc, yr, yc;
  bool tx, ty, xvec, yvec;
} pe_mv_view;

/* The view of x and y; NULL, or why they do not multiply (a static string
 * for the caller to complete with names and shapes). */
const char *pe_mv_plan(const pe_shape *x, const pe_shape *y, bool tx, bool ty, pe_mv_view *v);

/* Out's shape under v: the broadcast batch dims, then m unless X is a
 * vector, then n unless Y is one; vector · vector is [1]. */
pe_shape pe_mv_out_shape(const pe_mv_view *v);

#endif
