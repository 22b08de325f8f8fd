/* CUDA kernels on the vendor libraries: matmul on cuBLAS, softmax, conv2d
 * and pool2d on cuDNN (legacy descriptor API, still in cuDNN 9).
 *
 * Row-major vs column-major: cuBLAS is column-major, and a row-major [r, c]
 * matrix is the column-major [c, r] matrix, i.e. its transpose. So the
 * row-major product C = op(A)·op(B) is computed as the column-major
 * Cᵀ = op(B)ᵀ·op(A)ᵀ: swap the operands, keep the op flags, and every
 * leading dimension is the row-major column count.
 *
 * Exactness: cuBLAS runs with CUBLAS_DEFAULT_MATH (no TF32) and convolutions
 * with CUDNN_FMA_MATH, so results compare with the oneDNN f32 reference.
 *
 * State: softmax, conv2d and pool2d keep their descriptors and chosen
 * algorithms in the op state, rebuilt when the input shapes change
 * (freed by pe_cu_dnn_state_free). */
#include <stdlib.h>
#include <string.h>

#include "cuda/ops_cuda.h"

#define NEED(c, x) \
  pe_cuda_ctx *x;  \
  PE_TRY(pe_cu_need(c, &x))

static pe_status *dnn_check(pe_kernel_ctx *c, cudnnStatus_t s, const char *what) {
  if (s == CUDNN_STATUS_SUCCESS) return NULL;
  (void)cudaGetLastError(); /* reported here (as pe_cu_check), not kept on the stream */
  return pe_kernel_error(c, PE_EBACKEND, "%s: cuDNN error %d (%s)", what, (int)s,
                         cudnnGetErrorString(s));
}

static pe_status *blas_check(pe_kernel_ctx *c, cublasStatus_t s, const char *what) {
  if (s == CUBLAS_STATUS_SUCCESS) return NULL;
  (void)cudaGetLastError(); /* reported here (as pe_cu_check), not kept on the stream */
  return pe_kernel_error(c, PE_EBACKEND, "%s: cuBLAS error %d (%s)", what, (int)s,
                         cublasGetStatusString(s));
}

static pe_status *need_handles(pe_kernel_ctx *c, pe_cuda_ctx *x) {
  if (!x->cublas || !x->cudnn)
    return pe_kernel_error(c, PE_EINTERNAL,
                           "cuBLAS/cuDNN kernels run on the compute stream only (cuda:%d)",
                           x->device);
  return NULL;
}

/* --- matmul ------------------------------------------------------------------- */

/* Row-major C[m,n] = op(A)·op(B) (k the inner dim; lda/ldb/ldc row-major
 * column counts of the stored matrices), beta 0. */
static pe_status *gemm_rm(pe_kernel_ctx *c, pe_cuda_ctx *x, bool ta, bool tb, int64_t m, int64_t n,
                          int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb,
                          float *out, int64_t ldc, const char *what) {
  const float one = 1.0f, zero = 0.0f;
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX)
    return pe_kernel_error(c, PE_ESHAPE, "%s: [%lld x %lld x %lld] exceeds cuBLAS's int dims", what,
                           (long long)m, (long long)k, (long long)n);
  return blas_check(
      c,
      cublasSgemm(x->cublas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n,
                  (int)m, (int)k, &one, b, (int)ldb, a, (int)lda, &zero, out, (int)ldc),
      what);
}

static void mm_dims(pe_kernel_ctx *c, const pe_tensor *tx, const pe_tensor *ty, int64_t *m,
                    int64_t *k, int64_t *n) {
  int xnc = (int)pe_attr_i(c->def, c->desc, "x_num_col_dims");
  int ync = (int)pe_attr_i(c->def, c->desc, "y_num_col_dims");
  *m = pe_shape_prod(&tx->shape, 0, xnc);
  *k = pe_shape_prod(&tx->shape, xnc, tx->shape.ndim);
  *n = pe_shape_prod(&ty->shape, ync, ty->shape.ndim);
}

/* Inputs X, Y, Bias (refused); output Out. */
pe_status *pe_cuk_matmul(pe_kernel_ctx *c) {
  NEED(c, x);
  PE_TRY(need_handles(c, x));
  PE_TRY(pe_cu_refuse_fused(c, 2));
  pe_tensor *tx = pe_kin(c, 0, 0), *ty = pe_kin(c, 1, 0), *out = pe_kout(c, 0, 0);
  int64_t m, k, n;
  mm_dims(c, tx, ty, &m, &k, &n);
  if (m == 0 || n == 0) return NULL;
  if (k == 0) return pe_cu_zero(c, x, out);
  return gemm_rm(c, x, false, false, m, n, k, pe_f32(tx), k, pe_f32(ty), n, pe_f32(out), n,
                 "matmul");
}

/* dX[M,K] = dOut[M,N]·Yᵀ,  dY[K,N] = Xᵀ·dOut. Inputs X, Y, Bias (refused),
 * Out, Out@GRAD; outputs X@GRAD, Y@GRAD (Bias@GRAD: refused with Bias).
 * Slot indices as ops/cpu/matmul.c's rows. */
pe_status *pe_cuk_matmul_grad(pe_kernel_ctx *c) {
  NEED(c, x);
  PE_TRY(need_handles(c, x));
  PE_TRY(pe_cu_refuse_fused(c, 2));
  pe_tensor *tx = pe_kin(c, 0, 0), *ty = pe_kin(c, 1, 0), *dout = pe_kin(c, 4, 0);
  pe_tensor *dx = pe_kout(c, 0, 0), *dy = pe_kout(c, 1, 0);
  if (!dout) return pe_cu_zero_outputs(c, x);
  int64_t m, k, n;
  mm_dims(c, tx, ty, &m, &k, &n);
  if (n == 0 || m == 0) return pe_cu_zero_outputs(c, x);
  if (dx && k)
    PE_TRY(gemm_rm(c, x, false, true, m, k, n, pe_f32(dout), n, pe_f32(ty), n, pe_f32(dx), k,
                   "matmul_grad dX"));
  if (dy && k)
    PE_TRY(gemm_rm(c, x, true, false, k, n, m, pe_f32(tx), k, pe_f32(dout), n, pe_f32(dy), n,
                   "matmul_grad dY"));
  return NULL;
}

/* --- cuDNN state ------------------------------------------------------------------- */

#define KEY_MAX 24

typedef struct dnn_state {
  int nkey;
  int64_t key[KEY_MAX];
  cudnnTensorDescriptor_t xd, yd;
  cudnnFilterDescriptor_t wd;
  cudnnConvolutionDescriptor_t cd;
  cudnnPoolingDescriptor_t pd;
  cudnnConvolutionFwdAlgo_t fwd;
  cudnnConvolutionBwdDataAlgo_t bwd_data;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter;
  size_t ws_fwd, ws_data, ws_filter;
} dnn_state;

void pe_cu_dnn_state_free(void *state) {
  dnn_state *s = state;
  if (!s) return;
  if (s->xd) cudnnDestroyTensorDescriptor(s->xd);
  if (s->yd) cudnnDestroyTensorDescriptor(s->yd);
  if (s->wd) cudnnDestroyFilterDescriptor(s->wd);
  if (s->cd) cudnnDestroyConvolutionDescriptor(s->cd);
  if (s->pd) cudnnDestroyPoolingDescriptor(s->pd);
  free(s);
}

/* The op's state for `key`: *fresh when it must be (re)built. */
static pe_status *dnn_lookup(pe_kernel_ctx *c, const int64_t *key, int nkey, dnn_state **out,
                             bool *fresh) {
  dnn_state *s = *c->state;
  if (s && s->nkey == nkey && !memcmp(s->key, key, (size_t)nkey * sizeof *key)) {
    *out = s;
    *fresh = false;
    return NULL;
  }
  if (!s) {
    if (!(s = calloc(1, sizeof(*s))))
      return pe_kernel_error(c, PE_ENOMEM, "out of memory for cuDNN state");
    *c->state = s;
    cudnnStatus_t st = cudnnCreateTensorDescriptor(&s->xd);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnCreateTensorDescriptor(&s->yd);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnCreateFilterDescriptor(&s->wd);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnCreateConvolutionDescriptor(&s->cd);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnCreatePoolingDescriptor(&s->pd);
    PE_TRY(dnn_check(c, st, "creating cuDNN descriptors"));
  }
  s->nkey = 0; /* invalid until built */
  *out = s;
  *fresh = true;
  return NULL;
}

static void dnn_built(dnn_state *s, const int64_t *key, int nkey) {
  memcpy(s->key, key, (size_t)nkey * sizeof *key);
  s->nkey = nkey;
}

static pe_status *dims_fit_int(pe_kernel_ctx *c, const pe_shape *sh, const char *what) {
  for (int d = 0; d < sh->ndim; d++)
    if (sh->d[d] > INT32_MAX) {
      char sb[PE_SHAPE_STRLEN];
      return pe_kernel_error(c, PE_ESHAPE, "%s %s: dims exceed cuDNN's int range", what,
                             pe_shape_str(sh, sb, sizeof sb));
    }
  return NULL;
}

static pe_status *set4d(pe_kernel_ctx *c, cudnnTensorDescriptor_t d, int64_t n, int64_t ch,
                        int64_t h, int64_t w) {
  return dnn_check(c,
                   cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)n,
                                              (int)ch, (int)h, (int)w),
                   "cudnnSetTensor4dDescriptor");
}

/* --- softmax: [outer, C, inner] as NCHW [outer, C, inner, 1], channel mode --- */

static pe_status *softmax_desc(pe_kernel_ctx *c, const pe_shape *sh, dnn_state **out) {
  int64_t axis = pe_attr_i(c->def, c->desc, "axis");
  if (axis < 0) axis += sh->ndim;
  int64_t v[3] = {pe_shape_prod(sh, 0, (int)axis), sh->d[axis],
                  pe_shape_prod(sh, (int)axis + 1, sh->ndim)};
  if (v[0] > INT32_MAX || v[1] > INT32_MAX || v[2] > INT32_MAX)
    return pe_kernel_error(c, PE_ESHAPE, "softmax view exceeds cuDNN's int dims");
  bool fresh;
  PE_TRY(dnn_lookup(c, v, 3, out, &fresh));
  if (fresh) {
    PE_TRY(set4d(c, (*out)->xd, v[0], v[1], v[2], 1));
    dnn_built(*out, v, 3);
  }
  return NULL;
}

pe_status *pe_cuk_softmax(pe_kernel_ctx *c) {
  NEED(c, x);
  PE_TRY(need_handles(c, x));
  pe_tensor *in = pe_kin(c, 0, 0), *out = pe_kout(c, 0, 0);
  if (pe_tensor_numel(in) == 0) return NULL;
  dnn_state *s;
  PE_TRY(softmax_desc(c, &in->shape, &s));
  const float one = 1.0f, zero = 0.0f;
  return dnn_check(c,
                   cudnnSoftmaxForward(x->cudnn, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL,
                                       &one, s->xd, in->data, &zero, s->xd, out->data),
                   "softmax");
}

/* Inputs X, Out, Out@GRAD. */
pe_status *pe_cuk_softmax_grad(pe_kernel_ctx *c) {
  NEED(c, x);
  PE_TRY(need_handles(c, x));
  pe_tensor *out = pe_kin(c, 1, 0), *dout = pe_kin(c, 2, 0), *dx = pe_kout(c, 0, 0);
  if (!dx) return NULL;
  if (!dout) return pe_cu_zero(c, x, dx);
  if (!out) return pe_kernel_error(c, PE_EARITY, "needs input Out");
  if (pe_tensor_numel(dx) == 0) return NULL;
  dnn_state *s;
  PE_TRY(softmax_desc(c, &dx->shape, &s));
  const float one = 1.0f, zero = 0.0f;
  return dnn_check(
      c,
      cudnnSoftmaxBackward(x->cudnn, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL, &one,
                           s->xd, out->data, s->xd, dout->data, &zero, s->xd, dx->data),
      "softmax_grad");
}

/* --- conv2d ----------------------------------------------------------------------- */

/* Algorithm choice. cuDNN's heuristics rank candidates of every math type:
 * a candidate tagged with a tensor-op math type is a TF32 variant on f32
 * data, which the descriptor (CUDNN_FMA_MATH) does not run, and the
 * workspace a heuristic reports may be that variant's. Some backward
 * algorithms sum with atomics, so two runs of one seed trained apart (on
 * an H200 the CNN's test accuracy after 3 epochs was 0.9017 in one run and
 * 0.9005 in the next) while the CPU's runs, and a resumed run, repeat
 * exactly. So the choice is the first ranked candidate that succeeded, is
 * deterministic, is not a tensor-op variant, and whose workspace cuDNN
 * reports for the descriptor as it is (the size the call will use); then
 * the same without determinism, then without the math type, if none
 * qualifies.
 *
 * One exception ranks first where cuDNN offers it: the backward filter's
 * non-fused Winograd, deterministic, for the 3x3 and 5x5 stride-1 filters
 * it takes. The heuristics' first deterministic pick there is a direct
 * kernel that took 188 us a call on an H200 at the resnet's 3x3 layers
 * (64 x 16-64 channels x 28x28 and 14x14), 40% of its step, where the CNN's
 * 5x5 layer ran the Winograd one in 19 us (bench/gpu/kernel_times.c). */
typedef struct algo_cand {
  int algo;
  cudnnStatus_t status;
  cudnnMathType_t math;
  cudnnDeterminism_t det;
} algo_cand;

typedef cudnnStatus_t (*ws_query)(cudnnHandle_t h, const dnn_state *s, int algo, size_t *bytes);

static cudnnStatus_t ws_fwd(cudnnHandle_t h, const dnn_state *s, int algo, size_t *bytes) {
  return cudnnGetConvolutionForwardWorkspaceSize(h, s->xd, s->wd, s->cd, s->yd,
                                                 (cudnnConvolutionFwdAlgo_t)algo, bytes);
}
static cudnnStatus_t ws_data(cudnnHandle_t h, const dnn_state *s, int algo, size_t *bytes) {
  return cudnnGetConvolutionBackwardDataWorkspaceSize(h, s->wd, s->yd, s->cd, s->xd,
                                                      (cudnnConvolutionBwdDataAlgo_t)algo, bytes);
}
static cudnnStatus_t ws_filter(cudnnHandle_t h, const dnn_state *s, int algo, size_t *bytes) {
  return cudnnGetConvolutionBackwardFilterWorkspaceSize(
      h, s->xd, s->yd, s->cd, s->wd, (cudnnConvolutionBwdFilterAlgo_t)algo, bytes);
}

static bool pick_algo(cudnnHandle_t h, const dnn_state *s, const algo_cand *c, int n, ws_query q,
                      int preferred, int *algo, size_t *ws) {
  for (int i = 0; preferred >= 0 && i < n; i++) {
    size_t bytes = 0;
    if (c[i].algo != preferred || c[i].status != CUDNN_STATUS_SUCCESS ||
        c[i].det != CUDNN_DETERMINISTIC || c[i].math == CUDNN_TENSOR_OP_MATH ||
        c[i].math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ||
        q(h, s, c[i].algo, &bytes) != CUDNN_STATUS_SUCCESS)
      continue;
    *algo = c[i].algo;
    *ws = bytes;
    return true;
  }
  for (int pass = 0; pass < 3; pass++)
    for (int i = 0; i < n; i++) {
      if (c[i].status != CUDNN_STATUS_SUCCESS) continue;
      bool tensor_op =
          c[i].math == CUDNN_TENSOR_OP_MATH || c[i].math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
      if (pass < 2 && tensor_op) continue;
      if (pass == 0 && c[i].det != CUDNN_DETERMINISTIC) continue;
      size_t bytes = 0;
      if (q(h, s, c[i].algo, &bytes) != CUDNN_STATUS_SUCCESS) continue;
      *algo = c[i].algo;
      *ws = bytes;
      return true;
    }
  return false;
}

/* Descriptors and algorithms for input x [N,C,H,W], filter w [O,C/g,KH,KW]. */
static pe_status *conv_state(pe_kernel_ctx *c, pe_cuda_ctx *x, const pe_tensor *in,
                             const pe_tensor *w, bool grad, dnn_state **out) {
  int64_t st[2], pd[2], dl[2];
  pe_cu_attr_pair(c->desc, "strides", 1, st);
  pe_cu_attr_pair(c->desc, "paddings", 0, pd);
  pe_cu_attr_pair(c->desc, "dilations", 1, dl);
  int64_t g = pe_attr_i(c->def, c->desc, "groups");
  PE_TRY(dims_fit_int(c, &in->shape, "conv2d Input"));
  const int64_t *xd = in->shape.d, *wd = w->shape.d;
  int64_t key[16] = {xd[0], xd[1], xd[2], xd[3], wd[0], wd[1], wd[2], wd[3],
                     st[0], st[1], pd[0], pd[1], dl[0], dl[1], g,     grad};
  bool fresh;
  PE_TRY(dnn_lookup(c, key, 16, out, &fresh));
  if (!fresh) return NULL;
  dnn_state *s = *out;
  PE_TRY(set4d(c, s->xd, xd[0], xd[1], xd[2], xd[3]));
  PE_TRY(dnn_check(c,
                   cudnnSetFilter4dDescriptor(s->wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                              (int)wd[0], (int)wd[1], (int)wd[2], (int)wd[3]),
                   "cudnnSetFilter4dDescriptor"));
  PE_TRY(dnn_check(c,
                   cudnnSetConvolution2dDescriptor(s->cd, (int)pd[0], (int)pd[1], (int)st[0],
                                                   (int)st[1], (int)dl[0], (int)dl[1],
                                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                   "cudnnSetConvolution2dDescriptor"));
  PE_TRY(
      dnn_check(c, cudnnSetConvolutionGroupCount(s->cd, (int)g), "cudnnSetConvolutionGroupCount"));
  PE_TRY(dnn_check(c, cudnnSetConvolutionMathType(s->cd, CUDNN_FMA_MATH),
                   "cudnnSetConvolutionMathType"));
  int on, oc, oh, ow;
  PE_TRY(dnn_check(c,
                   cudnnGetConvolution2dForwardOutputDim(s->cd, s->xd, s->wd, &on, &oc, &oh, &ow),
                   "cudnnGetConvolution2dForwardOutputDim"));
  PE_TRY(set4d(c, s->yd, on, oc, oh, ow));
  int got = 0;
  if (!grad) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    PE_TRY(dnn_check(
        c,
        cudnnGetConvolutionForwardAlgorithm_v7(x->cudnn, s->xd, s->wd, s->cd, s->yd,
                                               CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf),
        "cudnnGetConvolutionForwardAlgorithm_v7"));
    algo_cand cand[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    for (int i = 0; i < got; i++)
      cand[i] = (algo_cand){perf[i].algo, perf[i].status, perf[i].mathType, perf[i].determinism};
    int a;
    if (!pick_algo(x->cudnn, s, cand, got, ws_fwd, -1, &a, &s->ws_fwd))
      return pe_kernel_error(c, PE_EBACKEND, "cuDNN has no forward algorithm here");
    s->fwd = (cudnnConvolutionFwdAlgo_t)a;
  } else {
    cudnnConvolutionBwdDataAlgoPerf_t pdata[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    PE_TRY(dnn_check(c,
                     cudnnGetConvolutionBackwardDataAlgorithm_v7(
                         x->cudnn, s->wd, s->yd, s->cd, s->xd,
                         CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, pdata),
                     "cudnnGetConvolutionBackwardDataAlgorithm_v7"));
    algo_cand cand[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT + CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    for (int i = 0; i < got; i++)
      cand[i] =
          (algo_cand){pdata[i].algo, pdata[i].status, pdata[i].mathType, pdata[i].determinism};
    int a;
    if (!pick_algo(x->cudnn, s, cand, got, ws_data, -1, &a, &s->ws_data))
      return pe_kernel_error(c, PE_EBACKEND, "cuDNN has no backward-data algorithm");
    s->bwd_data = (cudnnConvolutionBwdDataAlgo_t)a;
    cudnnConvolutionBwdFilterAlgoPerf_t pf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    PE_TRY(dnn_check(c,
                     cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                         x->cudnn, s->xd, s->yd, s->cd, s->wd,
                         CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, pf),
                     "cudnnGetConvolutionBackwardFilterAlgorithm_v7"));
    for (int i = 0; i < got; i++)
      cand[i] = (algo_cand){pf[i].algo, pf[i].status, pf[i].mathType, pf[i].determinism};
    if (!pick_algo(x->cudnn, s, cand, got, ws_filter,
                   CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED, &a, &s->ws_filter))
      return pe_kernel_error(c, PE_EBACKEND, "cuDNN has no backward-filter algorithm");
    s->bwd_filter = (cudnnConvolutionBwdFilterAlgo_t)a;
  }
  dnn_built(s, key, 16);
  return NULL;
}

/* Inputs Input, Filter, Bias (refused); output Output. */
pe_status *pe_cuk_conv2d(pe_kernel_ctx *c) {
  NEED(c, x);
  PE_TRY(need_handles(c, x));
  PE_TRY(pe_cu_refuse_fused(c, 2));
  pe_tensor *in = pe_kin(c, 0, 0), *w = pe_kin(c, 1, 0), *out = pe_kout(c, 0, 0);
  if (pe_tensor_numel(out) == 0) return NULL;
  dnn_state *s;
  PE_TRY(conv_state(c, x, in, w, false, &s));
  void *ws = NULL;
  if (s->ws_fwd) PE_TRY(pe_cuda_workspace(x, s->ws_fwd, &ws));
  const float one = 1.0f, zero = 0.0f;
  return dnn_check(c,
                   cudnnConvolutionForward(x->cudnn, &one, s->xd, in->data, s->wd, w->data, s->cd,
                                           s->fwd, ws, s->ws_fwd, &zero, s->yd, out->data),
                   "conv2d");
}

/* Inputs Input, Filter, Bias (refused), Output, Output@GRAD; outputs
 * Input@GRAD, Filter@GRAD (Bias@GRAD: refused with Bias). Slot indices as
 * ops/cpu/conv.c's rows. */
pe_status *pe_cuk_conv2d_grad(pe_kernel_ctx *c) {
  NEED(c, x);
  PE_TRY(need_handles(c, x));
  PE_TRY(pe_cu_refuse_fused(c, 2));
  pe_tensor *in = pe_kin(c, 0, 0), *w = pe_kin(c, 1, 0), *dout = pe_kin(c, 4, 0);
  pe_tensor *din = pe_kout(c, 0, 0), *dw = pe_kout(c, 1, 0);
  if (!dout || pe_tensor_numel(dout) == 0) return pe_cu_zero_outputs(c, x);
  dnn_state *s;
  PE_TRY(conv_state(c, x, in, w, true, &s));
  size_t need = s->ws_data > s->ws_filter ? s->ws_data : s->ws_filter;
  void *ws = NULL;
  if (need) PE_TRY(pe_cuda_workspace(x, need, &ws));
  const float one = 1.0f, zero = 0.0f;
  if (din)
    PE_TRY(dnn_check(
        c,
        cudnnConvolutionBackwardData(x->cudnn, &one, s->wd, w->data, s->yd, dout->data, s->cd,
                                     s->bwd_data, ws, s->ws_data, &zero, s->xd, din->data),
        "conv2d_grad Input@GRAD"));
  if (dw)
    PE_TRY(dnn_check(
        c,
        cudnnConvolutionBackwardFilter(x->cudnn, &one, s->xd, in->data, s->yd, dout->data, s->cd,
                                       s->bwd_filter, ws, s->ws_filter, &zero, s->wd, dw->data),
        "conv2d_grad Filter@GRAD"));
  return NULL;
}

/* --- pool2d ------------------------------------------------------------------------ */

static pe_status *pool_state(pe_kernel_ctx *c, const pe_tensor *in, dnn_state **out) {
  PE_TRY(dims_fit_int(c, &in->shape, "pool2d X"));
  const int64_t *xd = in->shape.d;
  bool max = strcmp(pe_attr_s(c->def, c->desc, "pooling_type"), "max") == 0;
  bool global = pe_attr_b(c->def, c->desc, "global_pooling");
  bool excl = pe_attr_b(c->def, c->desc, "exclusive");
  int64_t k[2], st[2], pd[2];
  pe_cu_attr_pair(c->desc, "ksize", 1, k);
  pe_cu_attr_pair(c->desc, "strides", 1, st);
  pe_cu_attr_pair(c->desc, "paddings", 0, pd);
  if (global) { /* as ops/cpu/pool.c */
    k[0] = xd[2];
    k[1] = xd[3];
    st[0] = st[1] = 1;
    pd[0] = pd[1] = 0;
  }
  int64_t key[13] = {xd[0], xd[1], xd[2], xd[3], k[0], k[1],  st[0],
                     st[1], pd[0], pd[1], max,   excl, global};
  bool fresh;
  PE_TRY(dnn_lookup(c, key, 13, out, &fresh));
  if (!fresh) return NULL;
  dnn_state *s = *out;
  cudnnPoolingMode_t mode = max    ? CUDNN_POOLING_MAX
                            : excl ? CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING
                                   : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
  PE_TRY(
      dnn_check(c,
                /* NaN in a window gives NaN, as the CPU's max pool (ops/cpu/pool.c). */
                cudnnSetPooling2dDescriptor(s->pd, mode, CUDNN_PROPAGATE_NAN, (int)k[0], (int)k[1],
                                            (int)pd[0], (int)pd[1], (int)st[0], (int)st[1]),
                "cudnnSetPooling2dDescriptor"));
  PE_TRY(set4d(c, s->xd, xd[0], xd[1], xd[2], xd[3]));
  int on, oc, oh, ow;
  PE_TRY(dnn_check(c, cudnnGetPooling2dForwardOutputDim(s->pd, s->xd, &on, &oc, &oh, &ow),
                   "cudnnGetPooling2dForwardOutputDim"));
  PE_TRY(set4d(c, s->yd, on, oc, oh, ow));
  s->ws_fwd = (size_t)on * oc * oh * ow * sizeof(float); /* recomputed Out for the grad */
  dnn_built(s, key, 13);
  return NULL;
}

pe_status *pe_cuk_pool2d(pe_kernel_ctx *c) {
  NEED(c, x);
  PE_TRY(need_handles(c, x));
  pe_tensor *in = pe_kin(c, 0, 0), *out = pe_kout(c, 0, 0);
  if (pe_tensor_numel(out) == 0) return NULL;
  dnn_state *s;
  PE_TRY(pool_state(c, in, &s));
  const float one = 1.0f, zero = 0.0f;
  return dnn_check(
      c, cudnnPoolingForward(x->cudnn, s->pd, &one, s->xd, in->data, &zero, s->yd, out->data),
      "pool2d");
}

/* Inputs X, Out, Out@GRAD. cuDNN's backward needs Out; when the program
 * did not keep it, the forward is recomputed into scratch. */
pe_status *pe_cuk_pool2d_grad(pe_kernel_ctx *c) {
  NEED(c, x);
  PE_TRY(need_handles(c, x));
  pe_tensor *in = pe_kin(c, 0, 0), *out = pe_kin(c, 1, 0), *dout = pe_kin(c, 2, 0);
  pe_tensor *dx = pe_kout(c, 0, 0);
  if (!dx) return NULL;
  if (!dout) return pe_cu_zero(c, x, dx);
  if (pe_tensor_numel(dx) == 0) return NULL;
  dnn_state *s;
  PE_TRY(pool_state(c, in, &s));
  const float one = 1.0f, zero = 0.0f;
  const void *y = out ? out->data : NULL;
  if (!y) {
    void *ws;
    PE_TRY(pe_cuda_workspace(x, s->ws_fwd, &ws));
    PE_TRY(dnn_check(c,
                     cudnnPoolingForward(x->cudnn, s->pd, &one, s->xd, in->data, &zero, s->yd, ws),
                     "pool2d_grad forward"));
    y = ws;
  }
  return dnn_check(c,
                   cudnnPoolingBackward(x->cudnn, s->pd, &one, s->yd, y, s->yd, dout->data, s->xd,
                                        in->data, &zero, s->xd, dx->data),
                   "pool2d_grad");
}
