/* Broadcasting kernels: see broadcast.h for the rules and the plan.
 *
 * Each kernel is written once with an operator placeholder; PE_OPS expands it
 * per operator so every inner loop is branch-free and vectorisable. */
#include "broadcast.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cpu/par_min.h"

/* Elements per parallel chunk of a flat loop. */
#define CHUNK 8192
/* Columns per tile of a column-sum reduction (double accumulators on the stack). */
#define COL_TILE 256
/* Fixed partition of a full sum, independent of the thread count. */
#define SUM_PARTS 64

#define PE_OPS(op, LOOP)               \
  do {                                 \
    switch (op) {                      \
      case PE_BIN_ADD: LOOP(+); break; \
      case PE_BIN_SUB: LOOP(-); break; \
      case PE_BIN_MUL: LOOP(*); break; \
    }                                  \
  } while (0)

static inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

/* --- shapes ------------------------------------------------------------------ */

/* Merge one dim pair under numpy rules; -1 (unknown batch) matches anything
 * that is not 1 and stays unknown against 1. */
static bool merge_dim(int64_t a, int64_t b, int64_t *o) {
  if (a == b || b == 1 || b == -1)
    *o = (a == 1 && b == -1) ? -1 : a;
  else if (a == 1 || a == -1)
    *o = b;
  else
    return false;
  return true;
}

const char *pe_bcast_infer(const pe_shape *x, const pe_shape *y, int64_t axis, pe_shape *out,
                           pe_shape *xa, pe_shape *ya) {
  if (axis < -1) return "axis must be -1 or >= 0";
  if (axis == -1) {
    int nd = x->ndim > y->ndim ? x->ndim : y->ndim;
    out->ndim = xa->ndim = ya->ndim = nd;
    for (int i = 0; i < nd; i++) {
      int ix = i - (nd - x->ndim), iy = i - (nd - y->ndim);
      int64_t a = ix >= 0 ? x->d[ix] : 1, b = iy >= 0 ? y->d[iy] : 1;
      if (!merge_dim(a, b, &out->d[i])) return "trailing dims differ and neither is 1";
      xa->d[i] = a;
      ya->d[i] = b;
    }
    return NULL;
  }
  /* Paddle rule: Y sits inside X from `axis`; trailing 1s of Y may hang over. */
  if (axis > x->ndim) return "Y does not fit inside X at this axis";
  int ny = y->ndim;
  while (ny > 0 && axis + ny > x->ndim && y->d[ny - 1] == 1) ny--;
  if (axis + ny > x->ndim) return "Y does not fit inside X at this axis";
  *out = *x;
  *xa = *x;
  ya->ndim = x->ndim;
  for (int i = 0; i < x->ndim; i++) ya->d[i] = 1;
  for (int i = 0; i < ny; i++) {
    int64_t a = x->d[axis + i], b = y->d[i];
    if (!(a == b || b == 1 || a == -1 || b == -1))
      return "dims differ at this axis and Y's is not 1";
    ya->d[axis + i] = b;
  }
  return NULL;
}

void pe_bcast_plan(pe_bcast *p, const pe_shape *out, const pe_shape *a, const pe_shape *b) {
  int flags[PE_MAX_DIMS]; /* bit 0: a broadcasts in this dim, bit 1: b does */
  int prev = -1;
  memset(p, 0, sizeof(*p));
  p->numel = 1;
  for (int i = 0; i < out->ndim; i++) {
    int64_t n = out->d[i];
    p->numel *= n;
    if (n == 1) continue; /* nothing to iterate */
    int f = (a->d[i] == 1 ? 1 : 0) | (!b || b->d[i] == 1 ? 2 : 0);
    if (p->nd > 0 && f == prev) {
      p->n[p->nd - 1] *= n;
    } else {
      p->n[p->nd] = n;
      flags[p->nd++] = f;
    }
    prev = f;
  }
  if (p->nd == 0) {
    p->nd = 1;
    p->n[0] = 1;
    flags[0] = 0;
  }
  int64_t ra = 1, rb = 1;
  for (int d = p->nd - 1; d >= 0; d--) {
    p->sa[d] = (flags[d] & 1) ? 0 : ra;
    p->sb[d] = (flags[d] & 2) ? 0 : rb;
    if (!(flags[d] & 1)) ra *= p->n[d];
    if (!(flags[d] & 2)) rb *= p->n[d];
  }
}

/* True when the operand with strides s covers the whole output. */
static bool plan_full(const pe_bcast *p, const int64_t *s) {
  for (int d = 0; d < p->nd; d++)
    if (s[d] == 0 && p->n[d] != 1) return false;
  return true;
}

/* When the operand varies along at most one collapsed dim, the output is
 * [pre, mid, post] with the operand indexed by the middle index. */
static bool plan_single_run(const pe_bcast *p, const int64_t *s, int64_t *pre, int64_t *mid,
                            int64_t *post) {
  int at = -1;
  for (int d = 0; d < p->nd; d++)
    if (s[d] != 0) {
      if (at >= 0) return false;
      at = d;
    }
  *pre = 1;
  *mid = 1;
  *post = 1;
  for (int d = 0; d < p->nd; d++) {
    if (d < at || at < 0)
      *pre *= p->n[d];
    else if (d == at)
      *mid = p->n[d];
    else
      *post *= p->n[d];
  }
  return true;
}

/* --- binary ------------------------------------------------------------------ */

static void bin_flat(pe_binop op, const float *a, const float *b, float *o, int64_t n, int nt) {
  int64_t nch = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for if (pe_par_split(n)) num_threads(nt) schedule(static)
  for (int64_t c = 0; c < nch; c++) {
    int64_t lo = c * CHUNK, hi = min64(n, lo + CHUNK);
#define L(OP) \
  for (int64_t i = lo; i < hi; i++) o[i] = a[i] OP b[i]
    PE_OPS(op, L);
#undef L
  }
}

/* o = f (op) s or s (op) f, where f is output-shaped and s is indexed by the
 * middle index of [pre, mid, post]: scalar, row vector, or per-channel. */
static void bin_small(pe_binop op, bool s_right, const float *f, const float *s, float *o,
                      int64_t pre, int64_t mid, int64_t post, int nt) {
  int64_t n = pre * mid * post;
  if (mid == 1) {
    const float v = s[0];
    int64_t nch = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for if (pe_par_split(n)) num_threads(nt) schedule(static)
    for (int64_t c = 0; c < nch; c++) {
      int64_t lo = c * CHUNK, hi = min64(n, lo + CHUNK);
#define LR(OP) \
  for (int64_t i = lo; i < hi; i++) o[i] = f[i] OP v
#define LL(OP) \
  for (int64_t i = lo; i < hi; i++) o[i] = v OP f[i]
      if (s_right)
        PE_OPS(op, LR);
      else
        PE_OPS(op, LL);
#undef LR
#undef LL
    }
  } else if (post == 1) {
#pragma omp parallel for if (pe_par_split(n)) num_threads(nt) schedule(static)
    for (int64_t i = 0; i < pre; i++) {
      const float *fr = f + i * mid;
      float *orow = o + i * mid;
#define LR(OP) \
  for (int64_t j = 0; j < mid; j++) orow[j] = fr[j] OP s[j]
#define LL(OP) \
  for (int64_t j = 0; j < mid; j++) orow[j] = s[j] OP fr[j]
      if (s_right)
        PE_OPS(op, LR);
      else
        PE_OPS(op, LL);
#undef LR
#undef LL
    }
  } else {
#pragma omp parallel for if (pe_par_split(n)) num_threads(nt) schedule(static)
    for (int64_t r = 0; r < pre * mid; r++) {
      const float v = s[r % mid], *fr = f + r * post;
      float *orow = o + r * post;
#define LR(OP) \
  for (int64_t k = 0; k < post; k++) orow[k] = fr[k] OP v
#define LL(OP) \
  for (int64_t k = 0; k < post; k++) orow[k] = v OP fr[k]
      if (s_right)
        PE_OPS(op, LR);
      else
        PE_OPS(op, LL);
#undef LR
#undef LL
    }
  }
}

/* Offsets of row r (all collapsed dims but the last) in a and b. */
static void row_offsets(const pe_bcast *p, int64_t r, int64_t *ia, int64_t *ib) {
  *ia = *ib = 0;
  for (int d = p->nd - 2; d >= 0; d--) {
    int64_t q = r % p->n[d];
    r /= p->n[d];
    *ia += q * p->sa[d];
    *ib += q * p->sb[d];
  }
}

static void bin_strided(pe_binop op, const pe_bcast *p, const float *a, const float *b, float *o,
                        int nt) {
  int64_t len = p->n[p->nd - 1], rows = p->numel / len;
  int64_t sa = p->sa[p->nd - 1], sb = p->sb[p->nd - 1]; /* innermost: 0 or 1 */
#pragma omp parallel for if (pe_par_split(p->numel)) num_threads(nt) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    int64_t ia, ib;
    row_offsets(p, r, &ia, &ib);
    const float *ar = a + ia, *br = b + ib;
    float *orow = o + r * len;
#define L11(OP) \
  for (int64_t k = 0; k < len; k++) orow[k] = ar[k] OP br[k]
#define L10(OP) \
  for (int64_t k = 0; k < len; k++) orow[k] = ar[k] OP br[0]
#define L01(OP) \
  for (int64_t k = 0; k < len; k++) orow[k] = ar[0] OP br[k]
#define L00(OP) \
  for (int64_t k = 0; k < len; k++) orow[k] = ar[0] OP br[0]
    if (sa && sb)
      PE_OPS(op, L11);
    else if (sa)
      PE_OPS(op, L10);
    else if (sb)
      PE_OPS(op, L01);
    else
      PE_OPS(op, L00);
#undef L11
#undef L10
#undef L01
#undef L00
  }
}

void pe_bcast_binary_f32(pe_binop op, const pe_bcast *p, const float *a, const float *b, float *out,
                         int nt) {
  if (p->numel == 0) return;
  bool fa = plan_full(p, p->sa), fb = plan_full(p, p->sb);
  int64_t pre, mid, post;
  if (fa && fb)
    bin_flat(op, a, b, out, p->numel, nt);
  else if (fa && plan_single_run(p, p->sb, &pre, &mid, &post))
    bin_small(op, true, a, b, out, pre, mid, post, nt);
  else if (fb && plan_single_run(p, p->sa, &pre, &mid, &post))
    bin_small(op, false, b, a, out, pre, mid, post, nt);
  else
    bin_strided(op, p, a, b, out, nt);
}

/* --- reductions ----------------------------------------------------------------- */

/* sum of x[i] (* m[i] when m is given) over [lo, hi), in double. */
static double sum_range(const float *x, const float *m, int64_t lo, int64_t hi) {
  double s = 0;
  if (m == x) {
    /* Squares (clip's norm): one load and conversion per element, not two:
     * about a quarter less time. The same products, so the same bits. */
#pragma omp simd reduction(+ : s)
    for (int64_t i = lo; i < hi; i++) s += (double)x[i] * x[i];
  } else if (m) {
#pragma omp simd reduction(+ : s)
    for (int64_t i = lo; i < hi; i++) s += (double)x[i] * m[i];
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t i = lo; i < hi; i++) s += x[i];
  }
  return s;
}

/* A fixed partition, so the rounding does not depend on nt. */
static double sum_all(const float *x, const float *m, int64_t n, int nt) {
  if (!pe_par_split(n)) return sum_range(x, m, 0, n);
  double part[SUM_PARTS];
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int c = 0; c < SUM_PARTS; c++)
    part[c] = sum_range(x, m, n * c / SUM_PARTS, n * (c + 1) / SUM_PARTS);
  double s = 0;
  for (int c = 0; c < SUM_PARTS; c++) s += part[c];
  return s;
}

double pe_sum_f32(const float *x, int64_t n, int nt) {
  return sum_all(x, NULL, n, nt);
}

double pe_dot_f32(const float *x, const float *y, int64_t n, int nt) {
  return sum_all(x, y, n, nt);
}

/* dst[j] = scale * sum over i, k of (src .* m)[i, j, k] for [pre, mid, post]. */
static void reduce_mid(const float *src, const float *m, float scale, float *dst, int64_t pre,
                       int64_t mid, int64_t post, int nt) {
  int64_t n = pre * mid * post;
  if (post == 1) {
    /* Column sums: rows stream through a tile of accumulators. */
    int64_t tiles = (mid + COL_TILE - 1) / COL_TILE;
#pragma omp parallel for if (pe_par_split(n)) num_threads(nt) schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
      double acc[COL_TILE];
      int64_t j0 = t * COL_TILE, w = min64(COL_TILE, mid - j0);
      for (int64_t j = 0; j < w; j++) acc[j] = 0;
      for (int64_t i = 0; i < pre; i++) {
        const float *r = src + i * mid + j0;
        if (m) {
          const float *mr = m + i * mid + j0;
          for (int64_t j = 0; j < w; j++) acc[j] += (double)r[j] * mr[j];
        } else {
          for (int64_t j = 0; j < w; j++) acc[j] += r[j];
        }
      }
      for (int64_t j = 0; j < w; j++) dst[j0 + j] = (float)(scale * acc[j]);
    }
    return;
  }
#pragma omp parallel for if (pe_par_split(n)) num_threads(nt) schedule(static)
  for (int64_t j = 0; j < mid; j++) {
    double acc = 0;
    for (int64_t i = 0; i < pre; i++) {
      int64_t off = (i * mid + j) * post;
      acc += sum_range(src + off, m ? m + off : NULL, 0, post);
    }
    dst[j] = (float)(scale * acc);
  }
}

/* Any other pattern: one sequential pass in output order into doubles. */
static pe_status *reduce_strided(const pe_bcast *p, const float *src, const float *m, float scale,
                                 float *dst, int64_t tn) {
  double *acc = calloc((size_t)tn, sizeof(double));
  if (!acc)
    return pe_error(PE_ENOMEM, "broadcast reduce: out of memory for %lld sums", (long long)tn);
  int64_t len = p->n[p->nd - 1], rows = p->numel / len, st = p->sa[p->nd - 1];
  for (int64_t r = 0; r < rows; r++) {
    int64_t it, unused;
    row_offsets(p, r, &it, &unused);
    const float *row = src + r * len, *mrow = m ? m + r * len : NULL;
    if (!st) {
      acc[it] += sum_range(row, mrow, 0, len);
    } else if (mrow) {
      for (int64_t k = 0; k < len; k++) acc[it + k] += (double)row[k] * mrow[k];
    } else {
      for (int64_t k = 0; k < len; k++) acc[it + k] += row[k];
    }
  }
  for (int64_t i = 0; i < tn; i++) dst[i] = (float)(scale * acc[i]);
  free(acc);
  return NULL;
}

pe_status *pe_bcast_reduce_f32(const pe_shape *out, const pe_shape *t, const float *src,
                               const float *m, float scale, float *dst, int nt) {
  pe_bcast p;
  pe_bcast_plan(&p, out, t, NULL);
  int64_t tn = pe_shape_numel(t);
  if (p.numel == 0) {
    if (tn > 0) memset(dst, 0, (size_t)tn * sizeof(float));
    return NULL;
  }
  if (tn == p.numel) {
    if (!m && scale == 1.0f) {
      if (dst != src) memcpy(dst, src, (size_t)tn * sizeof(float));
    } else if (!m) {
#pragma omp parallel for if (pe_par_split(tn)) num_threads(nt) schedule(static)
      for (int64_t i = 0; i < tn; i++) dst[i] = scale * src[i];
    } else {
#pragma omp parallel for if (pe_par_split(tn)) num_threads(nt) schedule(static)
      for (int64_t i = 0; i < tn; i++) dst[i] = scale * src[i] * m[i];
    }
    return NULL;
  }
  if (tn == 1) {
    dst[0] = (float)(scale * sum_all(src, m, p.numel, nt));
    return NULL;
  }
  int64_t pre, mid, post;
  if (plan_single_run(&p, p.sa, &pre, &mid, &post)) {
    reduce_mid(src, m, scale, dst, pre, mid, post, nt);
    return NULL;
  }
  return reduce_strided(&p, src, m, scale, dst, tn);
}
