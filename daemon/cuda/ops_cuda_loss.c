/* CUDA kernels of huber_loss, sigmoid_cross_entropy_with_logits,
 * smooth_l1_loss and lookup_table_v2 (embedding), with their gradients.
 * Same slots and attributes as ops/cpu/pointwise_loss.c, smooth_l1_loss.c
 * and embedding.c.
 *
 * Embedding ids are not range-checked on the host (a device sync per op):
 * an id outside [0, vocab) gives a NaN row forward and no gradient. The
 * sparse gradient (is_sparse) has no CUDA kernel: it is refused, naming
 * the op. */
#include "cuda/kernels_loss.h"
#include "cuda/ops_cuda.h"

/* --- huber_loss ------------------------------------------------------------------ */

pe_status *pe_cuk_huber_loss(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *out = pe_kout(c, 0, 0);
  return pe_cu_check(c,
                     pe_cu_huber(pe_f32(pe_kin(c, 0, 0)), pe_f32(pe_kin(c, 1, 0)), pe_f32(out),
                                 pe_cu_f32_or_null(pe_kout(c, 1, 0)), pe_tensor_numel(out),
                                 pe_attr_f(c->def, c->desc, "delta"), x->stream),
                     "huber_loss");
}

/* Inputs X, Y, Out, Residual, Out@GRAD, Residual@GRAD; outputs X@GRAD, Y@GRAD. */
pe_status *pe_cuk_huber_loss_grad(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *dout = pe_kin(c, 4, 0);
  if (!dout) return pe_cu_zero_outputs(c, x);
  return pe_cu_check(
      c,
      pe_cu_huber_grad(pe_f32(pe_kin(c, 0, 0)), pe_f32(pe_kin(c, 1, 0)), pe_f32(dout),
                       pe_cu_f32_or_null(pe_kout(c, 0, 0)), pe_cu_f32_or_null(pe_kout(c, 1, 0)),
                       pe_tensor_numel(dout), pe_attr_f(c->def, c->desc, "delta"), x->stream),
      "huber_loss_grad");
}

/* --- sigmoid_cross_entropy_with_logits --------------------------------------------- */

/* normalize's factor lives in one float of the stream's workspace. */
static pe_status *sce_args(pe_kernel_ctx *c, pe_cuda_ctx *x, float *ignore, int *normalize,
                           float **k) {
  *ignore = (float)pe_attr_i(c->def, c->desc, "ignore_index");
  *normalize = pe_attr_b(c->def, c->desc, "normalize");
  void *ws = NULL;
  if (*normalize) PE_TRY(pe_cuda_workspace(x, sizeof(float), &ws));
  *k = ws;
  return NULL;
}

pe_status *pe_cuk_sigmoid_cross_entropy_with_logits(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *in = pe_kin(c, 0, 0);
  float ignore, *k;
  int normalize;
  PE_TRY(sce_args(c, x, &ignore, &normalize, &k));
  return pe_cu_check(c,
                     pe_cu_sce(pe_f32(in), pe_f32(pe_kin(c, 1, 0)), pe_f32(pe_kout(c, 0, 0)),
                               pe_tensor_numel(in), ignore, normalize, k, x->stream),
                     "sigmoid_cross_entropy_with_logits");
}

/* Inputs X, Label, Out, Out@GRAD; output X@GRAD. */
pe_status *pe_cuk_sigmoid_cross_entropy_with_logits_grad(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *dx = pe_kout(c, 0, 0), *dout = pe_kin(c, 3, 0);
  if (!dx) return NULL;
  if (!dout) return pe_cu_zero(c, x, dx);
  float ignore, *k;
  int normalize;
  PE_TRY(sce_args(c, x, &ignore, &normalize, &k));
  return pe_cu_check(
      c,
      pe_cu_sce_grad(pe_f32(pe_kin(c, 0, 0)), pe_f32(pe_kin(c, 1, 0)), pe_f32(dout), pe_f32(dx),
                     pe_tensor_numel(dx), ignore, normalize, k, x->stream),
      "sigmoid_cross_entropy_with_logits_grad");
}

/* --- smooth_l1_loss ---------------------------------------------------------------- */

enum { SL_X, SL_Y, SL_IW, SL_OW };
enum { SL_DIFF, SL_OUT };
enum { SLG_DDIFF = 6, SLG_DOUT };
enum { SLG_DX, SLG_DY };

/* X's rows: [n, row] (infer made X rank >= 1 and Y and the weights X's
 * shape). */
static void sl_rows(const pe_tensor *xt, int64_t *n, int64_t *row) {
  *n = xt->shape.d[0];
  *row = *n > 0 ? pe_tensor_numel(xt) / *n : 0;
}

pe_status *pe_cuk_smooth_l1_loss(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *xt = pe_kin(c, SL_X, 0);
  int64_t n, row;
  sl_rows(xt, &n, &row);
  return pe_cu_check(
      c,
      pe_cu_smooth_l1(
          pe_f32(xt), pe_f32(pe_kin(c, SL_Y, 0)), pe_cu_f32_or_null(pe_kin(c, SL_IW, 0)),
          pe_cu_f32_or_null(pe_kin(c, SL_OW, 0)), pe_cu_f32_or_null(pe_kout(c, SL_DIFF, 0)),
          pe_f32(pe_kout(c, SL_OUT, 0)), n, row, pe_attr_f(c->def, c->desc, "sigma"), x->stream),
      "smooth_l1_loss");
}

/* Inputs X, Y, InsideWeight, OutsideWeight, Diff, Out, Diff@GRAD,
 * Out@GRAD; outputs X@GRAD, Y@GRAD. */
pe_status *pe_cuk_smooth_l1_loss_grad(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *dx = pe_kout(c, SLG_DX, 0), *dy = pe_kout(c, SLG_DY, 0);
  if (!dx && !dy) return NULL;
  pe_tensor *xt = pe_kin(c, SL_X, 0), *dout = pe_kin(c, SLG_DOUT, 0);
  pe_tensor *ddiff = pe_kin(c, SLG_DDIFF, 0);
  int64_t n, row;
  sl_rows(xt, &n, &row);
  if (dout && pe_tensor_numel(dout) != n)
    return pe_kernel_error(c, PE_ESHAPE,
                           "input Out@GRAD has %lld elements, expected %lld (X's rows)",
                           (long long)pe_tensor_numel(dout), (long long)n);
  if (ddiff && pe_tensor_numel(ddiff) != n * row)
    return pe_kernel_error(c, PE_ESHAPE, "input Diff@GRAD has %lld elements, expected %lld (X's)",
                           (long long)pe_tensor_numel(ddiff), (long long)(n * row));
  return pe_cu_check(
      c,
      pe_cu_smooth_l1_grad(pe_f32(xt), pe_f32(pe_kin(c, SL_Y, 0)),
                           pe_cu_f32_or_null(pe_kin(c, SL_IW, 0)),
                           pe_cu_f32_or_null(pe_kin(c, SL_OW, 0)), pe_cu_f32_or_null(dout),
                           pe_cu_f32_or_null(ddiff), pe_cu_f32_or_null(dx), pe_cu_f32_or_null(dy),
                           n, row, pe_attr_f(c->def, c->desc, "sigma"), x->stream),
      "smooth_l1_loss_grad");
}

/* --- lookup_table_v2 ----------------------------------------------------------------- */

enum { EMB_W, EMB_IDS };
enum { EMBG_W, EMBG_IDS, EMBG_OUT, EMBG_DOUT };
enum { EMBG_DW, EMBG_DW_ROWS };

pe_status *pe_cuk_lookup_table_v2(pe_kernel_ctx *c) {
  PE_CU_NEED(c, x);
  pe_tensor *w = pe_kin(c, EMB_W, 0), *ids = pe_kin(c, EMB_IDS, 0);
  return pe_cu_check(c,
                     pe_cu_embedding(pe_f32(w), pe_i64(ids), pe_f32(pe_kout(c, 0, 0)),
                                     pe_tensor_numel(ids), w->shape.d[1], w->shape.d[0],
                                     pe_attr_i(c->def, c->desc, "padding_idx"), x->stream),
                     "lookup_table_v2");
}

pe_status *pe_cuk_lookup_table_v2_grad(pe_kernel_ctx *c) {
  if (pe_attr_b(c->def, c->desc, "is_sparse") || pe_kout(c, EMBG_DW_ROWS, 0))
    return pe_kernel_error(c, PE_EBACKEND,
                           "the sparse gradient (is_sparse) runs on cpu places only; on cuda "
                           "places set is_sparse false (a dense W@GRAD)");
  PE_CU_NEED(c, x);
  pe_tensor *w = pe_kin(c, EMBG_W, 0), *ids = pe_kin(c, EMBG_IDS, 0);
  pe_tensor *dout = pe_kin(c, EMBG_DOUT, 0), *dw = pe_kout(c, EMBG_DW, 0);
  if (!dw) return NULL;
  if (!dout) return pe_cu_zero(c, x, dw);
  int64_t vocab = w->shape.d[0], dim = w->shape.d[1], n = pe_tensor_numel(ids);
  if (pe_tensor_numel(dout) != n * dim)
    return pe_kernel_error(c, PE_ESHAPE, "input Out@GRAD has %lld elements, expected %lld",
                           (long long)pe_tensor_numel(dout), (long long)(n * dim));
  if (n > INT32_MAX)
    return pe_kernel_error(c, PE_ESHAPE, "input Ids holds %lld ids, more than the %d of a sort",
                           (long long)n, INT32_MAX);
  cudaError_t e = cudaSuccess;
  size_t bytes = pe_cu_embedding_grad_scratch(n, &e);
  PE_TRY(pe_cu_check(c, e, "lookup_table_v2_grad: sort size"));
  void *ws;
  PE_TRY(pe_cuda_workspace(x, bytes, &ws));
  return pe_cu_check(
      c,
      pe_cu_embedding_grad(pe_i64(ids), pe_f32(dout), pe_f32(dw), n, dim, vocab,
                           pe_attr_i(c->def, c->desc, "padding_idx"), ws, bytes, x->stream),
      "lookup_table_v2_grad");
}
