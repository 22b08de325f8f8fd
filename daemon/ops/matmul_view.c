/* matmul_v2's operand view (contract in matmul_view.h). */
#include "ops/matmul_view.h"

#include <string.h>

/* One broadcast batch dim (-1: unknown); false when a and b clash. */
static bool bcast_dim(int64_t a, int64_t b, int64_t *o) {
  if (a == b || b == 1)
    *o = a;
  else if (a == 1)
    *o = b;
  else if (a < 0 || b < 0)
    *o = a < 0 ? b : a; /* a known dim > 1 decides */
  else
    return false;
  return true;
}

const char *pe_mv_plan(const pe_shape *x, const pe_shape *y, bool tx, bool ty, pe_mv_view *v) {
  memset(v, 0, sizeof *v);
  if (x->ndim < 1 || y->ndim < 1) return "needs X and Y of rank 1 or more";
  v->xvec = x->ndim == 1;
  v->yvec = y->ndim == 1;
  v->tx = tx && !v->xvec;
  v->ty = ty && !v->yvec;
  v->xr = v->xvec ? 1 : x->d[x->ndim - 2];
  v->xc = x->d[x->ndim - 1];
  v->yr = y->d[v->yvec ? 0 : y->ndim - 2];
  v->yc = v->yvec ? 1 : y->d[y->ndim - 1];
  v->m = v->tx ? v->xc : v->xr;
  v->k = v->tx ? v->xr : v->xc;
  int64_t ky = v->ty ? v->yc : v->yr;
  v->n = v->ty ? v->yr : v->yc;
  if (v->k >= 0 && ky >= 0 && v->k != ky) return "contraction dims differ";
  int xn = v->xvec ? 0 : x->ndim - 2, yn = v->yvec ? 0 : y->ndim - 2;
  v->nb = xn > yn ? xn : yn;
  for (int i = 0; i < v->nb; i++) {
    int xi = i - (v->nb - xn), yi = i - (v->nb - yn);
    v->xb[i] = xi >= 0 ? x->d[xi] : 1;
    v->yb[i] = yi >= 0 ? y->d[yi] : 1;
    if (!bcast_dim(v->xb[i], v->yb[i], &v->ob[i])) return "batch dims do not broadcast";
  }
  return NULL;
}

pe_shape pe_mv_out_shape(const pe_mv_view *v) {
  pe_shape o = {.ndim = v->nb};
  memcpy(o.d, v->ob, sizeof(int64_t) * (size_t)v->nb);
  if (!v->xvec) o.d[o.ndim++] = v->m;
  if (!v->yvec) o.d[o.ndim++] = v->n;
  if (o.ndim == 0) o.d[o.ndim++] = 1; /* vector · vector: a scalar, [1] */
  return o;
}
