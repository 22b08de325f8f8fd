/* Broadcasting for the hand-written elementwise kernels (f32).
 *
 * Shapes: pe_bcast_infer applies the op contract's two rules (numpy for
 * axis = -1, Paddle's "Y aligns with X at axis" for axis >= 0) and returns
 * the output shape plus X and Y padded with 1s to the output's rank. It
 * accepts -1 (unknown batch) dims, so the same rule serves compile time.
 *
 * Plans: pe_bcast_plan drops size-1 output dims and merges neighbouring dims
 * that broadcast the same way, so most real cases collapse to one of a few
 * contiguous patterns (same shape, scalar, row vector over [N,M], per-channel
 * over NCHW). Kernels dispatch on the collapsed plan and fall back to a
 * strided walk otherwise.
 *
 * Threading: loops are split across at most `nt` OpenMP threads once they are
 * large enough; each output element is produced by one thread in a fixed
 * order, so results never depend on the thread count. */
#ifndef PE_OPS_CPU_BROADCAST_H
#define PE_OPS_CPU_BROADCAST_H

#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"

typedef enum pe_binop { PE_BIN_ADD, PE_BIN_SUB, PE_BIN_MUL } pe_binop;

typedef struct pe_bcast {
  int nd;                  /* collapsed rank, >= 1 */
  int64_t n[PE_MAX_DIMS];  /* collapsed output dims */
  int64_t sa[PE_MAX_DIMS]; /* element strides of operand a; 0 = broadcast */
  int64_t sb[PE_MAX_DIMS]; /* same for operand b */
  int64_t numel;           /* output elements */
} pe_bcast;

/* Output shape of X (op) Y under `axis`; xa/ya receive X and Y aligned to the
 * output rank. Returns NULL on success, else a short reason (static string). */
const char *pe_bcast_infer(const pe_shape *x, const pe_shape *y, int64_t axis, pe_shape *out,
                           pe_shape *xa, pe_shape *ya);

/* Plan out = f(a, b) where a and b are aligned to out (each dim equal or 1).
 * Pass b = NULL for a one-operand plan (reductions): then sb is all zeros. */
void pe_bcast_plan(pe_bcast *p, const pe_shape *out, const pe_shape *a, const pe_shape *b);

/* out = a (op) b with broadcasting per plan (a -> sa, b -> sb). out may alias
 * a or b when that operand has the output's shape. */
void pe_bcast_binary_f32(pe_binop op, const pe_bcast *p, const float *a, const float *b, float *out,
                         int nt);

/* dst (shape t, aligned to out) = scale * sum of src (contiguous, shape out),
 * times m elementwise when m is given (also out-shaped), over the dims where
 * t broadcasts. Sums run in double. dst may alias src when t equals out. */
pe_status *pe_bcast_reduce_f32(const pe_shape *out, const pe_shape *t, const float *src,
                               const float *m, float scale, float *dst, int nt);

/* Sum of n floats in double, deterministic for any nt. */
double pe_sum_f32(const float *x, int64_t n, int nt);
/* Sum of x[i] * y[i] in double, the same way; x == y (clip's sum of
 * squares) reads each element once. */
double pe_dot_f32(const float *x, const float *y, int64_t n, int nt);

#endif
