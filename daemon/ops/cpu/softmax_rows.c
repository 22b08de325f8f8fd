#include "ops/cpu/softmax_rows.h"

#include <math.h>

#include "ops/cpu/par_min.h"

bool pe_smask_plan(const pe_shape *s, const pe_shape *m, pe_smask_view *v) {
  if (m->ndim > s->ndim || s->ndim < 2) return false;
  v->nd = s->ndim;
  int64_t stride = 1;
  for (int i = s->ndim - 1; i >= 0; i--) {
    int mi = i - (s->ndim - m->ndim);
    int64_t md = mi >= 0 ? m->d[mi] : 1, sd = s->d[i];
    v->dims[i] = sd;
    if (md != 1 && md != sd && md >= 0 && sd >= 0) return false;
    v->st[i] = md == 1 ? 0 : stride;
    stride *= md;
  }
  return true;
}

/* Rows [r0, r1) of the [rows, k] scores. */
static void smask_rows(const pe_smask_view *v, const float *mask, bool causal, float *s, int64_t r0,
                       int64_t r1) {
  int nd = v->nd;
  int64_t q = v->dims[nd - 2], k = v->dims[nd - 1], mk = v->st[nd - 1];
  for (int64_t r = r0; r < r1; r++) {
    float *row = s + r * k;
    int64_t i = r % q;
    if (mask) {
      /* the mask row of score row r: its dims from the right */
      int64_t off = i * v->st[nd - 2], rest = r / q;
      for (int d = nd - 3; d >= 0; d--) {
        off += (rest % v->dims[d]) * v->st[d];
        rest /= v->dims[d];
      }
      const float *m = mask + off;
      if (mk)
        for (int64_t j = 0; j < k; j++) row[j] += m[j];
      else
        for (int64_t j = 0; j < k; j++) row[j] += m[0];
    }
    if (causal)
      for (int64_t j = i + 1; j < k; j++) row[j] = -INFINITY;
  }
}

void pe_smask_apply(const pe_smask_view *v, const float *mask, bool causal, float *s, int nt) {
  if (!mask && !causal) return;
  int64_t k = v->dims[v->nd - 1], rows = 1;
  for (int d = 0; d < v->nd - 1; d++) rows *= v->dims[d];
  if (rows == 0 || k == 0) return;
#pragma omp parallel for if (pe_par_split(rows * k)) num_threads(nt) schedule(static)
  for (int64_t r = 0; r < rows; r++) smask_rows(v, mask, causal, s, r, r + 1);
}

pe_status *pe_softmax_rows_build(pe_kernel_ctx *c, pe_dnnl_entry *e, int64_t rows, int64_t k,
                                 bool backward) {
  const int64_t v[2] = {rows, k};
  dnnl_memory_desc_t md;
  dnnl_softmax_desc_t fd, bd;
  PE_TRY(pe_dnnl_check(pe_dnnl_md_plain(&md, 2, v), c, "softmax desc"));
  PE_TRY(pe_dnnl_check(dnnl_softmax_forward_desc_init(&fd, dnnl_forward_training, &md, 1), c,
                       "softmax forward desc"));
  dnnl_primitive_desc_t fwd, pd;
  PE_TRY(pe_dnnl_pd(c, &fd, NULL, "softmax forward primitive desc", &fwd));
  pe_status *st = NULL;
  if (backward) {
    st = pe_dnnl_check(dnnl_softmax_backward_desc_init(&bd, &md, &md, 1), c,
                       "softmax backward desc");
    if (!st) st = pe_dnnl_pd(c, &bd, fwd, "softmax backward primitive desc", &pd);
    dnnl_primitive_desc_destroy(fwd);
    if (st) return st;
  } else {
    pd = fwd;
  }
  static const int fargs[] = {DNNL_ARG_SRC, DNNL_ARG_DST};
  static const int bargs[] = {DNNL_ARG_DST, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_SRC};
  pe_dnnl_prim *p;
  st = pe_dnnl_entry_add(c, e, pd, backward ? bargs : fargs, backward ? 3 : 2, "softmax", &p);
  dnnl_primitive_desc_destroy(pd);
  return st;
}
