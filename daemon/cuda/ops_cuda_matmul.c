/* CUDA kernel of matmul_v2 (batched, trans_x / trans_y, broadcast batch
 * dims) and its gradient on cuBLAS's strided-batched GEMM. The view of X
 * and Y is the CPU kernel's (ops/matmul_view.h's pe_mv_plan, shared); the batch is merged into as
 * few dims as the operands' broadcasting allows (pe_cu_batch_plan): one GEMM call when nothing or a
 * whole operand broadcasts, else one call per index of the outer dims.
 *
 * Row-major as in ops_cuda_dnn.c: C = op(A) op(B) is the column-major
 * Cᵀ = op(B)ᵀ op(A)ᵀ, so the operands swap and the leading dimensions are
 * the stored matrices' row-major column counts. cuBLAS runs without TF32
 * (the handle's default math), so results compare with oneDNN's f32.
 *
 * Gradient (as the CPU's), on the broadcast batch:
 *   !tx: dX = dOut op(Y)ᵀ       tx: dX = op(Y) dOutᵀ
 *   !ty: dY = op(X)ᵀ dOut       ty: dY = dOutᵀ op(X)
 * An operand that broadcasts gets its product for the whole batch in the
 * stream's workspace, summed over its broadcast dims (pe_cu_reduce_bcast). */
#include <string.h>

#include "cuda/ops_cuda.h"
#include "cuda/shape_plan.h"
#include "ops/matmul_view.h"

enum { MV_X, MV_Y };
enum { MVG_X, MVG_Y, MVG_OUT, MVG_DOUT };
enum { MVG_DX, MVG_DY };

static pe_status *mv_view(pe_kernel_ctx *c, const pe_tensor *x, const pe_tensor *y, pe_mv_view *v) {
  bool tx = pe_attr_b(c->def, c->desc, "trans_x"), ty = pe_attr_b(c->def, c->desc, "trans_y");
  const char *why = pe_mv_plan(&x->shape, &y->shape, tx, ty, v);
  if (!why) return NULL;
  char sx[PE_SHAPE_STRLEN], sy[PE_SHAPE_STRLEN];
  return pe_kernel_error(c, PE_ESHAPE, "X %s and Y %s (trans_x %s, trans_y %s): %s",
                         pe_shape_str(&x->shape, sx, sizeof sx),
                         pe_shape_str(&y->shape, sy, sizeof sy), tx ? "true" : "false",
                         ty ? "true" : "false", why);
}

pe_status *pe_cu_gemm(pe_kernel_ctx *c, pe_cuda_ctx *x, bool ta, bool tb, int64_t r, int64_t in,
                      int64_t cols, float alpha, const float *a, int64_t sa, const float *b,
                      int64_t sb, float *out, int64_t so, int64_t count, const char *what) {
  if (!x->cublas)
    return pe_kernel_error(c, PE_EINTERNAL, "%s: cuBLAS runs on the compute stream only (cuda:%d)",
                           what, x->device);
  if (r > INT32_MAX || in > INT32_MAX || cols > INT32_MAX)
    return pe_kernel_error(c, PE_ESHAPE, "%s: [%lld x %lld x %lld] exceeds cuBLAS's int dims", what,
                           (long long)r, (long long)in, (long long)cols);
  if (count > INT32_MAX)
    return pe_kernel_error(c, PE_ESHAPE, "%s: a batch of %lld exceeds cuBLAS's int count", what,
                           (long long)count);
  const float zero = 0.0f;
  int lda = (int)(ta ? r : in), ldb = (int)(tb ? in : cols);
  cublasStatus_t s = cublasSgemmStridedBatched(
      x->cublas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)cols, (int)r,
      (int)in, &alpha, b, ldb, sb, a, lda, sa, &zero, out, (int)cols, so, (int)count);
  if (s == CUBLAS_STATUS_SUCCESS) return NULL;
  (void)cudaGetLastError(); /* reported here, not kept on the stream */
  return pe_kernel_error(c, PE_EBACKEND, "%s: cuBLAS error %d (%s)", what, (int)s,
                         cublasGetStatusString(s));
}

/* out[b] = op(A)[b'] op(B)[b''] over v's batch, A's batch dims ab and B's
 * bb (each ob or 1): A [r, in] (ta: stored [in, r]), B [in, cols] (tb:
 * stored [cols, in]), out dense [batch..., r, cols]. */
static pe_status *product(pe_kernel_ctx *c, pe_cuda_ctx *x, const pe_mv_view *v, const int64_t *ab,
                          const int64_t *bb, const float *a, const float *b, float *out, int64_t r,
                          int64_t in, int64_t cols, bool ta, bool tb, const char *what) {
  pe_cu_batch p;
  pe_cu_batch_plan(v->nb, v->ob, ab, bb, &p);
  int64_t ma = r * in, mb = in * cols, mc = r * cols;
  if (p.nd == 0) return pe_cu_gemm(c, x, ta, tb, r, in, cols, 1.0f, a, ma, b, mb, out, mc, 1, what);
  int last = p.nd - 1;
  int64_t idx[PE_MAX_DIMS] = {0};
  for (;;) {
    int64_t oa = 0, ob = 0, oc = 0;
    for (int d = 0; d < last; d++) {
      oa += idx[d] * p.st[0][d];
      ob += idx[d] * p.st[1][d];
      oc += idx[d] * p.st[2][d];
    }
    PE_TRY(pe_cu_gemm(c, x, ta, tb, r, in, cols, 1.0f, a + oa * ma, p.st[0][last] * ma, b + ob * mb,
                      p.st[1][last] * mb, out + oc * mc, p.st[2][last] * mc, p.n[last], what));
    int d = last - 1;
    while (d >= 0 && ++idx[d] == p.n[d]) idx[d--] = 0;
    if (d < 0) return NULL;
  }
}

pe_status *pe_cuk_matmul_v2(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  if (!x->cublas)
    return pe_kernel_error(c, PE_EINTERNAL, "cuBLAS runs on the compute stream only (cuda:%d)",
                           x->device);
  pe_tensor *tx = pe_kin(c, MV_X, 0), *ty = pe_kin(c, MV_Y, 0), *out = pe_kout(c, 0, 0);
  if (pe_tensor_numel(out) == 0) return NULL;
  pe_mv_view v;
  PE_TRY(mv_view(c, tx, ty, &v));
  if (v.k == 0) return pe_cu_zero(c, x, out); /* an empty sum */
  return product(c, x, &v, v.xb, v.yb, pe_f32(tx), pe_f32(ty), pe_f32(out), v.m, v.k, v.n, v.tx,
                 v.ty, "matmul_v2");
}

static bool full_batch(const pe_mv_view *v, const int64_t *b) {
  for (int i = 0; i < v->nb; i++)
    if (b[i] != v->ob[i]) return false;
  return true;
}

/* The gradient d of an operand with batch dims b, stored as [r, cols]
 * matrices: product (ab, bb, a, b2, ...) straight into d when b is the
 * whole batch, else into the workspace and summed over b's broadcast dims. */
static pe_status *grad_one(pe_kernel_ctx *c, pe_cuda_ctx *x, const pe_mv_view *v, pe_tensor *d,
                           const int64_t *b, int64_t r, int64_t cols, const int64_t *ab,
                           const int64_t *bb, const float *a0, const float *a1, int64_t pr,
                           int64_t pin, int64_t pcols, bool ta, bool tb, const char *what) {
  if (full_batch(v, b))
    return product(c, x, v, ab, bb, a0, a1, pe_f32(d), pr, pin, pcols, ta, tb, what);
  int64_t nbat = 1;
  for (int i = 0; i < v->nb; i++) nbat *= v->ob[i];
  void *ws;
  PE_TRY(pe_cuda_workspace(x, (size_t)(nbat * r * cols) * sizeof(float), &ws));
  PE_TRY(product(c, x, v, ab, bb, a0, a1, ws, pr, pin, pcols, ta, tb, what));
  pe_cu_reduce red = {.nd = v->nb + 2};
  for (int i = 0; i < v->nb; i++) red.out[i] = v->ob[i], red.t[i] = b[i], red.u[i] = 1;
  red.out[v->nb] = red.t[v->nb] = r;
  red.out[v->nb + 1] = red.t[v->nb + 1] = cols;
  red.u[v->nb] = red.u[v->nb + 1] = 1;
  return pe_cu_check(c, pe_cu_reduce_bcast(&red, ws, NULL, 1.0f, pe_f32(d), NULL, 0, x->stream),
                     what);
}

pe_status *pe_cuk_matmul_v2_grad(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  if (!x->cublas)
    return pe_kernel_error(c, PE_EINTERNAL, "cuBLAS runs on the compute stream only (cuda:%d)",
                           x->device);
  pe_tensor *tx = pe_kin(c, MVG_X, 0), *ty = pe_kin(c, MVG_Y, 0), *dout = pe_kin(c, MVG_DOUT, 0);
  pe_tensor *dx = pe_kout(c, MVG_DX, 0), *dy = pe_kout(c, MVG_DY, 0);
  if (!dx && !dy) return NULL;
  if (!dout || pe_tensor_numel(dout) == 0) return pe_cu_zero_outputs(c, x);
  pe_mv_view v;
  PE_TRY(mv_view(c, tx, ty, &v));
  pe_shape want = pe_mv_out_shape(&v);
  if (!pe_shape_equal(&want, &dout->shape))
    return pe_kernel_error(c, PE_ESHAPE, "input Out@GRAD does not have Out's shape");
  if (v.k == 0) return pe_cu_zero_outputs(c, x);
  const float *X = pe_f32(tx), *Y = pe_f32(ty), *G = pe_f32(dout);
  if (dx) {
    if (!v.tx) /* dX[m,k] = dOut[m,n] op(Y)ᵀ[n,k] */
      PE_TRY(grad_one(c, x, &v, dx, v.xb, v.xr, v.xc, v.ob, v.yb, G, Y, v.m, v.n, v.k, false, !v.ty,
                      "matmul_v2_grad dX"));
    else /* dX[k,m] = op(Y)[k,n] dOutᵀ[n,m] */
      PE_TRY(grad_one(c, x, &v, dx, v.xb, v.xr, v.xc, v.yb, v.ob, Y, G, v.k, v.n, v.m, v.ty, true,
                      "matmul_v2_grad dX"));
  }
  if (dy) {
    if (!v.ty) /* dY[k,n] = op(X)ᵀ[k,m] dOut[m,n] */
      PE_TRY(grad_one(c, x, &v, dy, v.yb, v.yr, v.yc, v.xb, v.ob, X, G, v.k, v.m, v.n, !v.tx, false,
                      "matmul_v2_grad dY"));
    else /* dY[n,k] = dOutᵀ[n,m] op(X)[m,k] */
      PE_TRY(grad_one(c, x, &v, dy, v.yb, v.yr, v.yc, v.ob, v.xb, G, X, v.n, v.m, v.k, true, v.tx,
                      "matmul_v2_grad dY"));
  }
  return NULL;
}
