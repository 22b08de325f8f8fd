/* matmul (Paddle "mul" semantics) and its gradient, on oneDNN matmul.
 *
 * X is viewed as an [M, K] matrix (dims split at x_num_col_dims), Y as
 * [K, N] (split at y_num_col_dims); Out = X·Y has dims X[:xnc] + Y[ync:].
 * Flattening is free: tensors are dense row-major, so only the memory
 * descriptors change. The gradient uses transposed (strided) descriptors
 * over the same buffers instead of materialising Xᵀ or Yᵀ:
 *   dX[M,K] = dOut[M,N] · Yᵀ,   dY[K,N] = Xᵀ · dOut[M,N].
 *
 * Fused fully-connected layers (pass fuse_conv_act, docs/ops.md): with a
 * Bias [N] input (Y 2-D, y_num_col_dims 1) the product adds it to every
 * row (oneDNN's bias argument, a [1,N] broadcast), and with
 * fuse_activation "relu" it applies relu over Out right after (pe_relu,
 * relu.h: NaN stays NaN, which oneDNN's relu post-op maps to 0; the
 * output is then in cache for the small layers, one extra pass for large
 * ones). The gradient masks Out@GRAD with pe_relu_grad(Out, .) (relu's
 * gradient from its output) into an entry buffer, runs both
 * products on it, and sums its columns for Bias@GRAD in the same pass.
 *
 * Large weights (matmul_weights.h): the products that read the weights
 * whole, X·Y and Xᵀ·dOut, run on oneDNN's gemm-based implementation,
 * which reads plain row-major weights at full speed.
 *
 * Threads (gemm_team.h): a product below PE_GEMM_TEAM_MIN_MACS is built
 * and run as a one-thread primitive, a larger one on the place's budget;
 * the gradient's dX and dY products, when both are one-thread and large
 * enough, run side by side, one per thread, each on its own stream. A
 * one-thread primitive is the one a budget of 1 builds, so the small
 * products give the same bits on any budget; a product large enough for
 * the team gives the same bits on one and two threads in oneDNN 2.6 for
 * the shapes tests/ops/test_ops_gemm_team.c compares, which oneDNN does
 * not promise in general. */
#include <omp.h>
#include <string.h>

#include "ops/cpu/dnnl_util.h"
#include "ops/cpu/gemm_team.h"
#include "ops/cpu/matmul_weights.h"
#include "ops/cpu/par_min.h"
#include "ops/cpu/relu.h"
#include "ops/op_tables.h"

/* Bias is input slot 2 in both rows, as in conv.c (the grad maker copies
 * the forward inputs first, then Out and Out@GRAD). */
enum { MM_X, MM_Y, MM_BIAS };
enum { MM_OUT };
enum { MMG_X, MMG_Y, MMG_BIAS, MMG_OUT, MMG_DOUT };
enum { MMG_DX, MMG_DY, MMG_DBIAS };

/* fuse_activation: "" (none) or "relu"; infer refuses anything else. */
static bool mm_relu(const pe_op_def *def, const pe_op_desc *op) {
  return strcmp(pe_attr_s(def, op, "fuse_activation"), "relu") == 0;
}

/* The [M,K]·[K,N] view of X and Y; -1 for a product with an unknown dim. */
typedef struct mm_dims {
  int64_t m, k, ky, n;
} mm_dims;

static mm_dims mm_view(const pe_shape *x, const pe_shape *y, int xnc, int ync) {
  mm_dims d = {pe_shape_prod(x, 0, xnc), pe_shape_prod(x, xnc, x->ndim), pe_shape_prod(y, 0, ync),
               pe_shape_prod(y, ync, y->ndim)};
  return d;
}

/* Validate X, Y and the num_col_dims attrs; fills the view. */
static pe_status *mm_check(pe_infer_ctx *c, int sx, int sy, int *xnc, int *ync, mm_dims *d) {
  PE_TRY(pe_dnnl_infer_f32(c));
  pe_meta *x = pe_in_meta(c, sx, 0), *y = pe_in_meta(c, sy, 0);
  if (!x || !y) return pe_infer_error(c, PE_EARITY, "needs inputs X and Y");
  *xnc = (int)pe_attr_i(c->def, c->desc, "x_num_col_dims");
  *ync = (int)pe_attr_i(c->def, c->desc, "y_num_col_dims");
  char sb[PE_SHAPE_STRLEN], sb2[PE_SHAPE_STRLEN];
  if (*xnc < 1 || *xnc >= x->shape.ndim)
    return pe_infer_error(c, PE_EATTR, "x_num_col_dims %d out of range for X '%s' shape %s", *xnc,
                          pe_in_name(c, sx, 0), pe_shape_str(&x->shape, sb, sizeof sb));
  if (*ync < 1 || *ync >= y->shape.ndim)
    return pe_infer_error(c, PE_EATTR, "y_num_col_dims %d out of range for Y '%s' shape %s", *ync,
                          pe_in_name(c, sy, 0), pe_shape_str(&y->shape, sb, sizeof sb));
  *d = mm_view(&x->shape, &y->shape, *xnc, *ync);
  if (d->k >= 0 && d->ky >= 0 && d->k != d->ky)
    return pe_infer_error(
        c, PE_ESHAPE,
        "input Y '%s' shape %s does not match X '%s' shape %s (inner dims %lld vs %lld)",
        pe_in_name(c, sy, 0), pe_shape_str(&y->shape, sb, sizeof sb), pe_in_name(c, sx, 0),
        pe_shape_str(&x->shape, sb2, sizeof sb2), (long long)d->k, (long long)d->ky);
  if (x->shape.ndim - *xnc + (y->shape.ndim - *ync) > PE_MAX_DIMS)
    return pe_infer_error(c, PE_ESHAPE, "output of X %s and Y %s has too many dims",
                          pe_shape_str(&x->shape, sb, sizeof sb),
                          pe_shape_str(&y->shape, sb2, sizeof sb2));
  const char *act = pe_attr_s(c->def, c->desc, "fuse_activation");
  if (act[0] && strcmp(act, "relu") != 0)
    return pe_infer_error(c, PE_EATTR, "fuse_activation '%s' unknown (\"\" or \"relu\")", act);
  return NULL;
}

/* The optional Bias: [N], one per column of a 2-D Y split at 1, so that
 * it is Out's last dim. */
static pe_status *mm_check_bias(pe_infer_ctx *c, int sy, int sb_slot, int ync) {
  pe_meta *b = pe_in_meta(c, sb_slot, 0);
  if (!b) return NULL;
  const pe_shape *y = &pe_in_meta(c, sy, 0)->shape;
  const char *bn = pe_in_name(c, sb_slot, 0), *yn = pe_in_name(c, sy, 0);
  char sb[PE_SHAPE_STRLEN], sb2[PE_SHAPE_STRLEN];
  if (y->ndim != 2 || ync != 1)
    return pe_infer_error(c, PE_ESHAPE,
                          "input Bias '%s' needs a 2-D Y with y_num_col_dims 1 (Y '%s' shape %s, "
                          "y_num_col_dims %d)",
                          bn, yn, pe_shape_str(y, sb, sizeof sb), ync);
  if (b->shape.ndim != 1 || (y->d[1] >= 0 && b->shape.d[0] >= 0 && b->shape.d[0] != y->d[1]))
    return pe_infer_error(c, PE_ESHAPE,
                          "input Bias '%s' shape %s must be [%lld], one per column of Y '%s' %s",
                          bn, pe_shape_str(&b->shape, sb, sizeof sb), (long long)y->d[1], yn,
                          pe_shape_str(y, sb2, sizeof sb2));
  return NULL;
}

static pe_status *matmul_infer(pe_infer_ctx *c) {
  int xnc = 1, ync = 1;
  mm_dims d;
  PE_TRY(mm_check(c, MM_X, MM_Y, &xnc, &ync, &d));
  PE_TRY(mm_check_bias(c, MM_Y, MM_BIAS, ync));
  const pe_shape *x = &pe_in_meta(c, MM_X, 0)->shape, *y = &pe_in_meta(c, MM_Y, 0)->shape;
  pe_shape out = {0};
  for (int i = 0; i < xnc; i++) out.d[out.ndim++] = x->d[i];
  for (int i = ync; i < y->ndim; i++) out.d[out.ndim++] = y->d[i];
  pe_infer_set(c, MM_OUT, PE_F32, &out);
  return NULL;
}

static pe_status *matmul_grad_infer(pe_infer_ctx *c) {
  int xnc = 1, ync = 1;
  mm_dims d;
  PE_TRY(mm_check(c, MMG_X, MMG_Y, &xnc, &ync, &d));
  PE_TRY(mm_check_bias(c, MMG_Y, MMG_BIAS, ync));
  if (mm_relu(c->def, c->desc) && !pe_in_meta(c, MMG_OUT, 0))
    return pe_infer_error(c, PE_EARITY, "fuse_activation relu needs input Out (the mask)");
  return pe_infer_grad_like_inputs(c);
}

/* One oneDNN matmul a[m,k]·b[k,n] -> c[m,n]; ta/tb: a/b buffers hold the
 * transposed matrix; bias: plus a [1,n] row broadcast over the rows (a
 * fused relu is applied after the primitive, matmul_kernel); gemm_impl:
 * on oneDNN's gemm-based implementation (matmul_weights.h). Args order:
 * SRC, WEIGHTS, DST (, BIAS). */
static pe_status *mm_build(pe_kernel_ctx *c, pe_dnnl_entry *e, int64_t m, int64_t k, int64_t n,
                           bool ta, bool tb, bool bias, bool gemm_impl) {
  dnnl_memory_desc_t a, b, o, bia;
  dnnl_matmul_desc_t md;
  PE_TRY(pe_dnnl_check(pe_dnnl_md_matrix(&a, m, k, ta), c, "matmul src desc"));
  PE_TRY(pe_dnnl_check(pe_dnnl_md_matrix(&b, k, n, tb), c, "matmul weights desc"));
  PE_TRY(pe_dnnl_check(pe_dnnl_md_matrix(&o, m, n, false), c, "matmul dst desc"));
  PE_TRY(pe_dnnl_check(pe_dnnl_md_matrix(&bia, 1, n, false), c, "matmul bias desc"));
  PE_TRY(pe_dnnl_check(dnnl_matmul_desc_init(&md, &a, &b, bias ? &bia : NULL, &o), c,
                       "matmul desc"));
  dnnl_primitive_desc_t pd;
  if (gemm_impl)
    PE_TRY(pe_dnnl_pd_impl(c, &md, PE_MATMUL_LARGE_WEIGHTS_IMPL, "matmul primitive desc", &pd));
  else
    PE_TRY(pe_dnnl_pd(c, &md, NULL, "matmul primitive desc", &pd));
  static const int args[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
  pe_dnnl_prim *p;
  pe_status *st = pe_dnnl_entry_add(c, e, pd, args, bias ? 4 : 3, "matmul primitive", &p);
  dnnl_primitive_desc_destroy(pd);
  return st;
}

/* The matrix view *d of X and Y and its cache entry, keyed by M, K, N and
 * the thread budget (a primitive splits its work for the team it is built
 * with). */
static pe_status *mm_lookup(pe_kernel_ctx *c, const pe_tensor *x, const pe_tensor *y, mm_dims *d,
                            pe_dnnl_entry **e, bool *fresh) {
  int xnc = (int)pe_attr_i(c->def, c->desc, "x_num_col_dims");
  int ync = (int)pe_attr_i(c->def, c->desc, "y_num_col_dims");
  *d = mm_view(&x->shape, &y->shape, xnc, ync);
  int64_t key[4] = {d->m, d->k, d->n, pe_kernel_threads(c)};
  return pe_dnnl_cache_lookup(c, key, 4, e, fresh);
}

/* Sets this thread's OpenMP team (omp_set_num_threads is per thread; oneDNN
 * reads it when a primitive is built and when it runs) to the product's
 * team; returns the team to give back to mm_team_leave. Every product of
 * one entry has the same m*k*n, so one team serves the entry. */
static int mm_team_enter(pe_kernel_ctx *c, const mm_dims *d) {
  int prev = omp_get_max_threads(), team = pe_gemm_team(d->m, d->k, d->n, pe_kernel_threads(c));
  if (team != prev) omp_set_num_threads(team);
  return prev;
}

static void mm_team_leave(int prev) {
  if (omp_get_max_threads() != prev) omp_set_num_threads(prev);
}

static pe_status *matmul_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, MM_X, 0), *y = pe_kin(c, MM_Y, 0), *out = pe_kout(c, MM_OUT, 0);
  pe_tensor *b = pe_kin(c, MM_BIAS, 0);
  mm_dims d;
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(mm_lookup(c, x, y, &d, &e, &fresh));
  int prev = mm_team_enter(c, &d);
  pe_status *st = NULL;
  if (fresh)
    st = pe_dnnl_cache_built(c, e,
                             mm_build(c, e, d.m, d.k, d.n, false, false, b != NULL,
                                      pe_matmul_weights_large(d.k, d.n)));
  void *h[] = {x->data, y->data, out->data, b ? b->data : NULL};
  if (!st) st = pe_dnnl_run(c, &e->prims[0], h, "matmul");
  mm_team_leave(prev);
  PE_TRY(st);
  /* relu after, not as oneDNN's post-op, which maps NaN to 0 (relu.h). */
  if (mm_relu(c->def, c->desc)) pe_relu_f32(c, out->data, out->data, d.m * d.n);
  return NULL;
}

/* Columns per block of mask_colsum (double accumulators on the stack). */
#define MM_COL_BLOCK 64

/* One pass over the [m, n] output gradient g: with out, dz = g where
 * out > 0, else 0 (relu's gradient from its output); with db, db[j] = the
 * sum of column j of dz (of g without out), in double. Blocks of columns
 * run in parallel and each column is summed in row order, so the result
 * does not depend on the thread count. The inner loops are branch-free
 * and vectorize over a block's row segment (restrict: dz never aliases g
 * or out). */
static void mask_colsum(pe_kernel_ctx *c, float *restrict dz, const float *restrict g,
                        const float *restrict out, float *restrict db, int64_t m, int64_t n) {
  int64_t blocks = (n + MM_COL_BLOCK - 1) / MM_COL_BLOCK;
#pragma omp parallel for if (pe_par_split(m * n)) num_threads(pe_kernel_threads(c)) schedule(static)
  for (int64_t t = 0; t < blocks; t++) {
    int64_t j0 = t * MM_COL_BLOCK, w = n - j0 < MM_COL_BLOCK ? n - j0 : MM_COL_BLOCK;
    double acc[MM_COL_BLOCK] = {0};
    for (int64_t i = 0; i < m; i++) {
      const float *restrict gr = g + i * n + j0;
      if (out) {
        const float *restrict o = out + i * n + j0;
        float *restrict z = dz + i * n + j0;
        /* Two loops over the row segment (in L1): GCC vectorizes the
         * select and the widening sum apart, not together. */
        for (int64_t j = 0; j < w; j++) {
          float gj = gr[j]; /* loaded unconditionally: the select vectorizes */
          z[j] = pe_relu_grad(o[j], gj);
        }
        for (int64_t j = 0; j < w; j++) acc[j] += z[j];
      } else {
        for (int64_t j = 0; j < w; j++) acc[j] += gr[j];
      }
    }
    if (db)
      for (int64_t j = 0; j < w; j++) db[j0 + j] = (float)acc[j];
  }
}

/* Entry layout: prims[0] computes dX (built even if dX is absent, so that
 * one entry serves every output), prims[1] computes dY; bufs[0] holds the
 * masked Out@GRAD of a fused relu. */
static pe_status *matmul_grad_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const mm_dims *d,
                                    bool relu) {
  void *buf;
  PE_TRY(pe_dnnl_entry_buffer(c, e, relu ? (size_t)(d->m * d->n) * sizeof(float) : 0, &buf));
  PE_TRY(mm_build(c, e, d->m, d->n, d->k, false, true, false, false)); /* dOut[M,N]·Yᵀ[N,K] */
  return mm_build(c, e, d->k, d->m, d->n, true, false, false,
                  pe_matmul_weights_large(d->k, d->n)); /* Xᵀ[K,M]·dOut[M,N] */
}

/* dX on this thread and its stream, dY on a second thread and the side
 * stream; both one-thread primitives (oneDNN runs a primitive inside a
 * parallel region on the calling thread). With one thread granted, the
 * sections run one after the other. */
static pe_status *mm_grad_side_by_side(pe_kernel_ctx *c, pe_dnnl_entry *e, void *const *hx,
                                       void *const *hy) {
  dnnl_engine_t eng;
  dnnl_stream_t strm, side;
  PE_TRY(pe_dnnl_get(c->dev, &eng, &strm));
  PE_TRY(pe_dnnl_side_stream(c->dev, &side));
  pe_status *st[2] = {NULL, NULL};
#pragma omp parallel sections num_threads(2)
  {
#pragma omp section
    st[0] = pe_dnnl_run_on(c, strm, &e->prims[0], hx, "matmul_grad dX");
#pragma omp section
    st[1] = pe_dnnl_run_on(c, side, &e->prims[1], hy, "matmul_grad dY");
  }
  if (st[0]) {
    pe_status_free(st[1]);
    return st[0];
  }
  return st[1];
}

static pe_status *matmul_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, MMG_X, 0), *y = pe_kin(c, MMG_Y, 0), *dout = pe_kin(c, MMG_DOUT, 0);
  pe_tensor *dx = pe_kout(c, MMG_DX, 0), *dy = pe_kout(c, MMG_DY, 0),
            *db = pe_kout(c, MMG_DBIAS, 0);
  if (!dout) {
    pe_dnnl_zero_outputs(c);
    return NULL;
  }
  if (!dx && !dy && !db) return NULL;
  mm_dims d;
  pe_dnnl_entry *e;
  bool fresh, relu = mm_relu(c->def, c->desc);
  PE_TRY(mm_lookup(c, x, y, &d, &e, &fresh));
  if (fresh) {
    int prev = mm_team_enter(c, &d);
    pe_status *st = pe_dnnl_cache_built(c, e, matmul_grad_build(c, e, &d, relu));
    mm_team_leave(prev);
    PE_TRY(st);
  }
  void *g = dout->data; /* the product's output gradient */
  const pe_tensor *out = relu ? pe_kin(c, MMG_OUT, 0) : NULL;
  if (relu && (!out || pe_tensor_numel(out) != pe_tensor_numel(dout)))
    return pe_kernel_error(c, PE_ESHAPE, "fused relu: Out must have Out@GRAD's shape");
  if (relu || db) {
    if (relu) g = e->bufs[0];
    mask_colsum(c, g, pe_f32(dout), out ? pe_f32(out) : NULL, db ? pe_f32(db) : NULL, d.m, d.n);
  }
  void *hx[] = {g, y->data, dx ? dx->data : NULL}, *hy[] = {x->data, g, dy ? dy->data : NULL};
  if (dx && dy && pe_gemm_side_by_side(d.m, d.k, d.n, pe_kernel_threads(c)))
    return mm_grad_side_by_side(c, e, hx, hy);
  int prev = mm_team_enter(c, &d);
  pe_status *st = dx ? pe_dnnl_run(c, &e->prims[0], hx, "matmul_grad dX") : NULL;
  if (!st && dy) st = pe_dnnl_run(c, &e->prims[1], hy, "matmul_grad dY");
  mm_team_leave(prev);
  return st;
}

static const pe_attr_def mm_attr_defs[] = {
    {"x_num_col_dims", PE_ATTR_INT, false, 1, NULL},
    {"y_num_col_dims", PE_ATTR_INT, false, 1, NULL},
    {"fuse_activation", PE_ATTR_STRING, false, 0, ""}, /* "" | "relu" */
    {NULL},
};

static const pe_slot_def mm_in[] = {{"X", 1, 1, 0}, {"Y", 1, 1, 0}, {"Bias", 0, 1, 0}, {NULL}};
static const pe_slot_def mm_out[] = {{"Out", 1, 1, 0}, {NULL}};
static const pe_slot_def mm_grad_in[] = {{"X", 1, 1, 0},   {"Y", 1, 1, 0},        {"Bias", 0, 1, 0},
                                         {"Out", 0, 1, 0}, {"Out@GRAD", 0, 1, 0}, {NULL}};
static const pe_slot_def mm_grad_out[] = {
    {"X@GRAD", 0, 1, 0}, {"Y@GRAD", 0, 1, 0}, {"Bias@GRAD", 0, 1, 0}, {NULL}};

const pe_op_def pe_ops_matmul[] = {
    {.type = "matmul",
     .inputs = mm_in,
     .outputs = mm_out,
     .attrs = mm_attr_defs,
     .infer = matmul_infer,
     .kernel_cpu = matmul_kernel,
     .state_free = pe_dnnl_cache_free,
     .grad = pe_grad_default},
    {.type = "matmul_grad",
     .inputs = mm_grad_in,
     .outputs = mm_grad_out,
     .attrs = mm_attr_defs,
     .infer = matmul_grad_infer,
     .kernel_cpu = matmul_grad_kernel,
     .state_free = pe_dnnl_cache_free},
    {0},
};
