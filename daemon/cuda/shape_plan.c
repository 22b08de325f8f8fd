/* Host-side plans of the CUDA shape and batched-matmul kernels (see
 * shape_plan.h). */
#include "cuda/shape_plan.h"

#include <string.h>

#include "ops/slice_bounds.h"

int64_t pe_cu_strided_simplify(pe_cu_strided *p) {
  int64_t numel = 1;
  for (int i = 0; i < p->nd; i++) numel *= p->dims[i];
  if (numel == 0) {
    p->nd = 0;
    return 0;
  }
  int n = 0;
  for (int i = 0; i < p->nd; i++) {
    if (p->dims[i] == 1) continue;
    /* Merge dim i into the kept dim n-1 when both views step from one to
     * the other as one dim would. */
    if (n > 0 && p->dst[n - 1] == p->dst[i] * p->dims[i] &&
        p->src[n - 1] == p->src[i] * p->dims[i]) {
      p->dims[n - 1] *= p->dims[i];
      p->dst[n - 1] = p->dst[i];
      p->src[n - 1] = p->src[i];
      continue;
    }
    p->dims[n] = p->dims[i];
    p->dst[n] = p->dst[i];
    p->src[n] = p->src[i];
    n++;
  }
  p->nd = n;
  return numel;
}

static void dense_strides(const int64_t *dims, int nd, int64_t *st) {
  int64_t s = 1;
  for (int i = nd - 1; i >= 0; i--) {
    st[i] = s;
    s *= dims[i];
  }
}

void pe_cu_plan_transpose(const pe_shape *x, const int *perm, pe_cu_strided *p) {
  int64_t xs[PE_MAX_DIMS];
  dense_strides(x->d, x->ndim, xs);
  p->nd = x->ndim;
  for (int i = 0; i < x->ndim; i++) {
    p->dims[i] = x->d[perm[i]];
    p->src[i] = xs[perm[i]];
  }
  dense_strides(p->dims, p->nd, p->dst);
}

void pe_cu_slice_window(const pe_shape *x, const int64_t *axes, const int64_t *starts,
                        const int64_t *ends, int n, int64_t *start, int64_t *size) {
  for (int i = 0; i < x->ndim; i++) start[i] = 0, size[i] = x->d[i];
  for (int k = 0; k < n; k++) {
    int a = (int)(axes[k] < 0 ? axes[k] + x->ndim : axes[k]);
    pe_slice_bounds(x->d[a], starts[k], ends[k], &start[a], &size[a]);
  }
}

/* Matrix strides of an operand with batch dims b over ob: dense over its
 * own dims, 0 where it broadcasts. */
static void batch_strides(int nb, const int64_t *ob, const int64_t *b, int64_t *st) {
  int64_t s = 1;
  for (int i = nb - 1; i >= 0; i--) {
    st[i] = b[i] == 1 && ob[i] != 1 ? 0 : s;
    s *= b[i];
  }
}

void pe_cu_batch_plan(int nb, const int64_t *ob, const int64_t *ab, const int64_t *bb,
                      pe_cu_batch *p) {
  int64_t st[3][PE_MAX_DIMS];
  batch_strides(nb, ob, ab, st[0]);
  batch_strides(nb, ob, bb, st[1]);
  batch_strides(nb, ob, ob, st[2]);
  int n = 0;
  for (int i = 0; i < nb; i++) {
    if (ob[i] == 1) continue;
    bool merge = n > 0;
    for (int o = 0; merge && o < 3; o++) merge = st[o][i] * ob[i] == p->st[o][n - 1];
    if (merge) {
      p->n[n - 1] *= ob[i];
      for (int o = 0; o < 3; o++) p->st[o][n - 1] = st[o][i];
      continue;
    }
    p->n[n] = ob[i];
    for (int o = 0; o < 3; o++) p->st[o][n] = st[o][i];
    n++;
  }
  p->nd = n;
}
