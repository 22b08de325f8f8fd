/* batch_norm and batch_norm_grad on cpu places. Channels are dim 1 of X
 * ([N, C] or [N, C, H, W]; any rank 2..5, dense).
 *
 * Written here rather than on oneDNN: the graph's tensors are plain NCHW,
 * for which oneDNN 2.6 has only its generic ncsp batch normalization (its
 * JIT versions take blocked or NHWC data, which would cost two reorders a
 * call); these loops are two passes over X forward and two backward, the
 * sums in double. PyTorch's CPU batch norm is its own kernel too.
 *
 * Training: Y with the batch's mean and biased variance, which go to
 * SavedMean / SavedVariance, and the running statistics move:
 *   MeanOut = momentum * Mean + (1 - momentum) * SavedMean (same for the
 * variance). MeanOut/VarianceOut are normally the Mean/Variance variables
 * (updated in place); distinct tensors work too.
 * is_test: Y uses the running statistics, which are left alone, and
 * SavedMean/SavedVariance receive copies of them, so that a gradient taken
 * in test mode (statistics constant) sees the statistics the forward used.
 *
 * The gradient op gets only X, Scale, Bias, SavedMean, SavedVariance and
 * Y@GRAD (custom maker): the running stats are not needed, nor Y unless a
 * relu is fused (below).
 *
 * Fused relu (pass fuse_conv_act, docs/ops.md): with fuse_activation
 * "relu" Y = relu(batch norm), written in the pass that writes Y anyway
 * (statistics unchanged), in training and in test mode. The gradient then
 * also gets Y and masks Y@GRAD by Y > 0 on the fly, in both of its passes
 * (the sums and X@GRAD): no masked copy is written. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops/cpu/dnnl_act_layout.h"
#include "ops/cpu/dnnl_util.h"
#include "ops/cpu/par_min.h"
#include "ops/cpu/relu.h"
#include "ops/op_tables.h"

enum { BN_X, BN_SCALE, BN_BIAS, BN_MEAN, BN_VAR };
enum { BN_Y, BN_MEAN_OUT, BN_VAR_OUT, BN_SAVED_MEAN, BN_SAVED_VAR };
/* Y (the fused relu's mask) before Y@GRAD, as matmul_grad and conv2d_grad
 * take their Out before Out@GRAD; cuda's glue reads the same slots. */
enum { BNG_X, BNG_SCALE, BNG_BIAS, BNG_SAVED_MEAN, BNG_SAVED_VAR, BNG_Y, BNG_DY };
enum { BNG_DX, BNG_DSCALE, BNG_DBIAS };

/* Checks X and the per-channel inputs in slots [first, last]; *cshape gets
 * the [C] shape of the statistics. */
static pe_status *bn_check(pe_infer_ctx *c, int first, int last, pe_shape *cshape) {
  PE_TRY(pe_dnnl_infer_f32(c));
  pe_meta *x = pe_in_meta(c, BN_X, 0);
  if (!x) return pe_infer_error(c, PE_EARITY, "missing input X");
  char sb[PE_SHAPE_STRLEN], sb2[PE_SHAPE_STRLEN];
  if (x->shape.ndim < 2 || x->shape.ndim > 5)
    return pe_infer_error(c, PE_ESHAPE,
                          "input X '%s' shape %s must have 2 to 5 dims (channels at 1)",
                          pe_in_name(c, BN_X, 0), pe_shape_str(&x->shape, sb, sizeof sb));
  int64_t ch = x->shape.d[1];
  for (int s = first; s <= last; s++) {
    pe_meta *m = pe_in_meta(c, s, 0);
    if (!m) return pe_infer_error(c, PE_EARITY, "missing input %s", c->def->inputs[s].name);
    if (m->shape.ndim != 1 || (ch >= 0 && m->shape.d[0] >= 0 && m->shape.d[0] != ch))
      return pe_infer_error(
          c, PE_ESHAPE, "input %s '%s' shape %s does not match X '%s' shape %s (channels %lld)",
          c->def->inputs[s].name, pe_in_name(c, s, 0), pe_shape_str(&m->shape, sb, sizeof sb),
          pe_in_name(c, BN_X, 0), pe_shape_str(&x->shape, sb2, sizeof sb2), (long long)ch);
    if (ch < 0) ch = m->shape.d[0];
  }
  *cshape = PE_SHAPE(ch);
  const char *act = pe_attr_s(c->def, c->desc, "fuse_activation");
  if (act[0] && strcmp(act, "relu") != 0)
    return pe_infer_error(c, PE_EATTR, "fuse_activation '%s' unknown (\"\" or \"relu\")", act);
  return NULL;
}

/* fuse_activation: "" (none) or "relu"; infer refuses anything else. */
static bool bn_relu(const pe_op_def *def, const pe_op_desc *op) {
  return strcmp(pe_attr_s(def, op, "fuse_activation"), "relu") == 0;
}

static pe_status *bn_infer(pe_infer_ctx *c) {
  pe_shape cs;
  PE_TRY(bn_check(c, BN_SCALE, BN_VAR, &cs));
  pe_infer_set(c, BN_Y, PE_F32, &pe_in_meta(c, BN_X, 0)->shape);
  for (int o = BN_MEAN_OUT; o <= BN_SAVED_VAR; o++) pe_infer_set(c, o, PE_F32, &cs);
  return NULL;
}

static pe_status *bn_grad_infer(pe_infer_ctx *c) {
  pe_shape cs;
  PE_TRY(bn_check(c, BNG_SCALE, BNG_SAVED_VAR, &cs));
  pe_meta *x = pe_in_meta(c, BNG_X, 0), *y = pe_in_meta(c, BNG_Y, 0);
  char sb[PE_SHAPE_STRLEN], sb2[PE_SHAPE_STRLEN];
  if (bn_relu(c->def, c->desc) && !y)
    return pe_infer_error(c, PE_EARITY, "fuse_activation relu needs input Y (the mask)");
  if (y && !pe_shape_compatible(&y->shape, &x->shape))
    return pe_infer_error(c, PE_ESHAPE, "input Y '%s' shape %s does not match X '%s' shape %s",
                          pe_in_name(c, BNG_Y, 0), pe_shape_str(&y->shape, sb, sizeof sb),
                          pe_in_name(c, BNG_X, 0), pe_shape_str(&x->shape, sb2, sizeof sb2));
  return pe_infer_grad_like_inputs(c);
}

/* X as [N, C, S] (S: the product of the dims after the channels; 1 for
 * [N, C]): channel c's values are N runs of S contiguous floats. */
typedef struct bn_dims {
  int64_t n, ch, sp;
} bn_dims;

static bn_dims bn_dims_of(const pe_tensor *x) {
  bn_dims d = {x->shape.d[0], x->shape.d[1], 1};
  for (int i = 2; i < x->shape.ndim; i++) d.sp *= x->shape.d[i];
  return d;
}

/* Floats per piece of bn_sums' masked loop (a stack buffer). */
#define BN_PIECE 256

/* Channel c's sum and sum of squares (or, with dy, sum of dy and of dy*x;
 * with y too, of the masked dy, pe_relu_grad(y, dy): a fused relu's gradient),
 * in double: M = N*S terms of either sign. */
static void bn_sums(const float *x, const float *dy, const float *y, bn_dims d, int64_t c,
                    double *s1, double *s2) {
  double a = 0, b = 0;
  for (int64_t i = 0; i < d.n; i++) {
    int64_t off = (i * d.ch + c) * d.sp;
    const float *xr = x + off;
    if (dy && y) {
      /* In pieces through a buffer in L1: GCC vectorizes the select and
       * the widening sums apart, not together (one loop ran 3x slower
       * than the unmasked one: branches on the mask). */
      const float *gr = dy + off, *yr = y + off;
      for (int64_t k0 = 0; k0 < d.sp; k0 += BN_PIECE) {
        int64_t w = d.sp - k0 < BN_PIECE ? d.sp - k0 : BN_PIECE;
        float g[BN_PIECE];
        for (int64_t k = 0; k < w; k++) {
          float v = gr[k0 + k]; /* loaded unconditionally: the select vectorizes */
          g[k] = pe_relu_grad(yr[k0 + k], v);
        }
        const float *xp = xr + k0;
#pragma omp simd reduction(+ : a, b)
        for (int64_t k = 0; k < w; k++) {
          a += g[k];
          b += (double)g[k] * xp[k];
        }
      }
    } else if (dy) {
      const float *gr = dy + off;
#pragma omp simd reduction(+ : a, b)
      for (int64_t k = 0; k < d.sp; k++) {
        a += gr[k];
        b += (double)gr[k] * xr[k];
      }
    } else {
#pragma omp simd reduction(+ : a, b)
      for (int64_t k = 0; k < d.sp; k++) {
        a += xr[k];
        b += (double)xr[k] * xr[k];
      }
    }
  }
  *s1 = a;
  *s2 = b;
}

/* y = x * mul + add over channel c; relu: pe_relu of that, in the same pass. */
static void bn_affine(const float *x, float *y, bn_dims d, int64_t c, float mul, float add,
                      bool relu) {
  for (int64_t i = 0; i < d.n; i++) {
    const float *xr = x + (i * d.ch + c) * d.sp;
    float *yr = y + (i * d.ch + c) * d.sp;
    if (relu) {
#pragma omp simd
      for (int64_t k = 0; k < d.sp; k++) {
        yr[k] = pe_relu(xr[k] * mul + add); /* NaN stays NaN (relu.h) */
      }
    } else {
#pragma omp simd
      for (int64_t k = 0; k < d.sp; k++) yr[k] = xr[k] * mul + add;
    }
  }
}

/* dx = dy * k + x * kx + k0 over channel c, dy masked by y > 0 when y is
 * given (a fused relu). */
static void bn_dx(const float *x, const float *dy, const float *y, float *dx, bn_dims d, int64_t c,
                  float k, float kx, float k0) {
  for (int64_t i = 0; i < d.n; i++) {
    int64_t off = (i * d.ch + c) * d.sp;
    const float *xr = x + off, *gr = dy + off;
    float *o = dx + off;
    if (y) {
      const float *yr = y + off;
#pragma omp simd
      for (int64_t q = 0; q < d.sp; q++) {
        float g = gr[q]; /* loaded unconditionally: the select vectorizes */
        o[q] = pe_relu_grad(yr[q], g) * k + xr[q] * kx + k0;
      }
    } else {
#pragma omp simd
      for (int64_t q = 0; q < d.sp; q++) o[q] = gr[q] * k + xr[q] * kx + k0;
    }
  }
}

/* Blocked X (dnnl_act_layout.h): a channel block's B channels are the B
 * lanes of each of its N * S vectors, so the loops below take a whole block
 * with the lanes as the vector; per channel the sums run over n then s in
 * order (doubles, as bn_sums), and the elementwise passes compute what the
 * plain ones do. blk: B; cb: the block. */
#define BN_MAX_BLOCK 16

static int64_t bn_block_off(bn_dims d, int64_t blk, int64_t i, int64_t cb) {
  return (i * (d.ch / blk) + cb) * d.sp * blk;
}

/* The loops of one block, inlined into a copy per block size (blk a
 * constant there: the lane loops vectorize whole); dy's mask (y) and the
 * relu are tested outside them. A block's data (N * S * B floats per
 * tensor) outgrows L2 where a plain channel's does not, so the second pass
 * (Y, X@GRAD) runs backwards: it starts on what the sums pass read last,
 * still in cache. */
static inline void bn_sums_block(const float *x, const float *dy, const float *y, bn_dims d,
                                 const int64_t blk, int64_t cb, double *s1, double *s2) {
  double a[BN_MAX_BLOCK] = {0}, b[BN_MAX_BLOCK] = {0};
  for (int64_t i = 0; i < d.n; i++) {
    int64_t off = bn_block_off(d, blk, i, cb);
    for (int64_t k = 0; k < d.sp; k++) {
      const float *xp = x + off + k * blk;
      if (dy && y) {
        /* The select, then the widening sums: in one loop GCC vectorized
         * neither (scalar, the sums through memory: 7 cycles a float, the
         * gradient twice as slow as the whole forward). Each lane's sums
         * keep their order, so the results are the same bits. */
        const float *gp = dy + off + k * blk, *yp = y + off + k * blk;
        float g[BN_MAX_BLOCK];
#pragma omp simd
        for (int64_t l = 0; l < blk; l++) g[l] = pe_relu_grad(yp[l], gp[l]);
#pragma omp simd
        for (int64_t l = 0; l < blk; l++) {
          a[l] += g[l];
          b[l] += (double)g[l] * xp[l];
        }
      } else if (dy) {
        const float *gp = dy + off + k * blk;
#pragma omp simd
        for (int64_t l = 0; l < blk; l++) {
          a[l] += gp[l];
          b[l] += (double)gp[l] * xp[l];
        }
      } else {
#pragma omp simd
        for (int64_t l = 0; l < blk; l++) {
          a[l] += xp[l];
          b[l] += (double)xp[l] * xp[l];
        }
      }
    }
  }
  for (int64_t l = 0; l < blk; l++) {
    s1[l] = a[l];
    s2[l] = b[l];
  }
}

static inline void bn_affine_block(const float *x, float *y, bn_dims d, const int64_t blk,
                                   int64_t cb, const float *mul, const float *add, bool relu) {
  for (int64_t i = d.n - 1; i >= 0; i--) {
    int64_t off = bn_block_off(d, blk, i, cb);
    for (int64_t k = d.sp - 1; k >= 0; k--) {
      const float *xp = x + off + k * blk;
      float *yp = y + off + k * blk;
      if (relu) {
#pragma omp simd
        for (int64_t l = 0; l < blk; l++) yp[l] = pe_relu(xp[l] * mul[l] + add[l]);
      } else {
#pragma omp simd
        for (int64_t l = 0; l < blk; l++) yp[l] = xp[l] * mul[l] + add[l];
      }
    }
  }
}

static inline void bn_dx_block(const float *x, const float *dy, const float *y, float *dx,
                               bn_dims d, const int64_t blk, int64_t cb, const float *k,
                               const float *kx, const float *k0) {
  for (int64_t i = d.n - 1; i >= 0; i--) {
    int64_t off = bn_block_off(d, blk, i, cb);
    for (int64_t q = d.sp - 1; q >= 0; q--) {
      const float *xp = x + off + q * blk, *gp = dy + off + q * blk;
      float *o = dx + off + q * blk;
      if (y) {
        const float *yp = y + off + q * blk;
#pragma omp simd
        for (int64_t l = 0; l < blk; l++)
          o[l] = pe_relu_grad(yp[l], gp[l]) * k[l] + xp[l] * kx[l] + k0[l];
      } else {
#pragma omp simd
        for (int64_t l = 0; l < blk; l++) o[l] = gp[l] * k[l] + xp[l] * kx[l] + k0[l];
      }
    }
  }
}

/* blk is 16 or 8 (pe_dnnl_act_block). */
static void bn_sums_blocked(const float *x, const float *dy, const float *y, bn_dims d, int64_t blk,
                            int64_t cb, double *s1, double *s2) {
  if (blk == 16)
    bn_sums_block(x, dy, y, d, 16, cb, s1, s2);
  else
    bn_sums_block(x, dy, y, d, 8, cb, s1, s2);
}

static void bn_affine_blocked(const float *x, float *y, bn_dims d, int64_t blk, int64_t cb,
                              const float *mul, const float *add, bool relu) {
  if (blk == 16)
    bn_affine_block(x, y, d, 16, cb, mul, add, relu);
  else
    bn_affine_block(x, y, d, 8, cb, mul, add, relu);
}

static void bn_dx_blocked(const float *x, const float *dy, const float *y, float *dx, bn_dims d,
                          int64_t blk, int64_t cb, const float *k, const float *kx,
                          const float *k0) {
  if (blk == 16)
    bn_dx_block(x, dy, y, dx, d, 16, cb, k, kx, k0);
  else
    bn_dx_block(x, dy, y, dx, d, 8, cb, k, kx, k0);
}

/* The layout of batch_norm's X and Y (or the gradient's X, Y, Y@GRAD and
 * X@GRAD), tied by pass_layout.c: *blk is B where they are blocked and the
 * layout applies to X's shape, else 1. */
static pe_status *bn_layout(pe_kernel_ctx *c, bool grad, int64_t *blk) {
  bool blocked;
  uint32_t in = grad ? 1u << BNG_X | 1u << BNG_Y | 1u << BNG_DY : 1u << BN_X;
  PE_TRY(pe_dnnl_act_tied(c, in, grad ? 1u << BNG_DX : 1u << BN_Y, &blocked));
  pe_act_plane p = pe_act_plane_of(&pe_kin(c, 0, 0)->shape, blocked);
  *blk = p.block;
  return NULL;
}

/* What the forward writes for channel ch from its sums s1, s2 (ignored in
 * test mode): the statistics, and Y's mul and add. */
typedef struct bn_fwd {
  const float *scale, *bias;
  float *rm, *rv, *sm, *sv, *mo, *vo;
  bool test;
  float eps, mom;
  double m;
} bn_fwd;

static void bn_fwd_channel(const bn_fwd *f, int64_t ch, double s1, double s2, float *mul,
                           float *add) {
  float bmean, bvar;
  if (f->test) {
    bmean = f->rm[ch];
    bvar = f->rv[ch];
  } else {
    double mu = s1 / f->m, v = s2 / f->m - mu * mu;
    bmean = (float)mu;
    bvar = (float)(v > 0 ? v : 0);
  }
  float inv = 1.0f / sqrtf(bvar + f->eps);
  *mul = f->scale[ch] * inv;
  *add = f->bias[ch] - bmean * *mul;
  /* Element-wise per channel: an output may be the very input it reads. */
  float old_m = f->rm[ch], old_v = f->rv[ch];
  if (f->sm) f->sm[ch] = bmean;
  if (f->sv) f->sv[ch] = bvar;
  if (f->mo) f->mo[ch] = f->test ? old_m : f->mom * old_m + (1.0f - f->mom) * bmean;
  if (f->vo) f->vo[ch] = f->test ? old_v : f->mom * old_v + (1.0f - f->mom) * bvar;
}

/* Training: the batch's mean and biased variance per channel (into bm, bv),
 * then Y; the running statistics blend in the batch's afterwards:
 * MeanOut = momentum * Mean + (1 - momentum) * batch mean (same for the
 * variance; element-wise, so MeanOut may be Mean). Test: Y from the running
 * statistics, which stay; SavedMean/SavedVariance get copies of them, so
 * that a gradient taken in test mode sees the statistics the forward used.
 * Channels (channel blocks when blocked) are spread over the place's team;
 * each is one pass for its sums and one for Y. */
static pe_status *bn_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, BN_X, 0), *y = pe_kout(c, BN_Y, 0);
  pe_tensor *mean_out = pe_kout(c, BN_MEAN_OUT, 0), *var_out = pe_kout(c, BN_VAR_OUT, 0);
  pe_tensor *saved_mean = pe_kout(c, BN_SAVED_MEAN, 0), *saved_var = pe_kout(c, BN_SAVED_VAR, 0);
  bool relu = bn_relu(c->def, c->desc);
  bn_fwd f = {.scale = pe_f32(pe_kin(c, BN_SCALE, 0)),
              .bias = pe_f32(pe_kin(c, BN_BIAS, 0)),
              .rm = pe_f32(pe_kin(c, BN_MEAN, 0)),
              .rv = pe_f32(pe_kin(c, BN_VAR, 0)),
              .sm = saved_mean ? pe_f32(saved_mean) : NULL,
              .sv = saved_var ? pe_f32(saved_var) : NULL,
              .mo = mean_out ? pe_f32(mean_out) : NULL,
              .vo = var_out ? pe_f32(var_out) : NULL,
              .test = pe_attr_b(c->def, c->desc, "is_test"),
              .eps = pe_attr_f(c->def, c->desc, "epsilon"),
              .mom = pe_attr_f(c->def, c->desc, "momentum")};
  bn_dims d = bn_dims_of(x);
  f.m = (double)(d.n * d.sp);
  if (!f.test && f.m == 0)
    return pe_kernel_error(c, PE_ESHAPE, "input X '%s' has no values to take statistics of",
                           pe_op_input_arg(c->desc, "X"));
  int64_t blk;
  PE_TRY(bn_layout(c, false, &blk));
  const float *xv = pe_f32(x);
  float *yv = pe_f32(y);
  int nt = pe_kernel_threads(c);
  int64_t units = d.ch / blk;
#pragma omp parallel for num_threads(nt) if (units > 1 && pe_par_split(d.n * d.ch * d.sp)) \
    schedule(static)
  for (int64_t u = 0; u < units; u++) {
    double s1[BN_MAX_BLOCK] = {0}, s2[BN_MAX_BLOCK] = {0};
    float mul[BN_MAX_BLOCK], add[BN_MAX_BLOCK];
    if (blk == 1) {
      if (!f.test) bn_sums(xv, NULL, NULL, d, u, &s1[0], &s2[0]);
      bn_fwd_channel(&f, u, s1[0], s2[0], &mul[0], &add[0]);
      bn_affine(xv, yv, d, u, mul[0], add[0], relu);
      continue;
    }
    if (!f.test) bn_sums_blocked(xv, NULL, NULL, d, blk, u, s1, s2);
    for (int64_t l = 0; l < blk; l++)
      bn_fwd_channel(&f, u * blk + l, s1[l], s2[l], &mul[l], &add[l]);
    bn_affine_blocked(xv, yv, d, blk, u, mul, add, relu);
  }
  return NULL;
}

/* Channel ch's gradients from its sums s_dy = sum(dy), s_dyx = sum(dy * x):
 * Bias@GRAD and Scale@GRAD, and X@GRAD's dy * k + x * kx + k0. */
typedef struct bn_bwd {
  const float *scale, *sm, *sv;
  float *dsv, *dbv;
  bool test;
  float eps;
  double m;
} bn_bwd;

static void bn_bwd_channel(const bn_bwd *b, int64_t ch, double s_dy, double s_dyx, float *k,
                           float *kx, float *k0) {
  float inv = 1.0f / sqrtf(b->sv[ch] + b->eps);
  double g_scale = (s_dyx - b->sm[ch] * s_dy) * inv; /* sum(dy * xhat) */
  if (b->dbv) b->dbv[ch] = (float)s_dy;
  if (b->dsv) b->dsv[ch] = (float)g_scale;
  /* dx = k * (dy - a - xhat * bb), as dy * k + x * kx + k0 */
  *k = b->scale[ch] * inv;
  float a = b->test || b->m == 0 ? 0.0f : (float)(s_dy / b->m);
  float bb = b->test || b->m == 0 ? 0.0f : (float)(g_scale / b->m);
  *kx = -*k * bb * inv;
  *k0 = -*k * a + *k * bb * inv * b->sm[ch];
}

/* With the forward's statistics (SavedMean, SavedVariance; M = N*S values
 * per channel, xhat = (x - mean) * inv_std):
 *   Bias@GRAD = sum(dy), Scale@GRAD = sum(dy * xhat),
 *   X@GRAD = scale * inv_std * (dy - Bias@GRAD / M - xhat * Scale@GRAD / M)
 * in training, where the statistics depend on X; in test mode they are
 * constants and X@GRAD = scale * inv_std * dy. With a fused relu, dy is
 * Y@GRAD masked by Y > 0 throughout (each pass masks as it reads). */
static pe_status *bn_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, BNG_X, 0), *dy = pe_kin(c, BNG_DY, 0);
  pe_tensor *dx = pe_kout(c, BNG_DX, 0), *dscale = pe_kout(c, BNG_DSCALE, 0);
  pe_tensor *dbias = pe_kout(c, BNG_DBIAS, 0);
  if (!dy) { /* zeros: the same in either layout */
    pe_dnnl_zero_outputs(c);
    return NULL;
  }
  if (!dx && !dscale && !dbias) return NULL;
  const pe_tensor *y = bn_relu(c->def, c->desc) ? pe_kin(c, BNG_Y, 0) : NULL;
  if (bn_relu(c->def, c->desc) && (!y || pe_tensor_numel(y) != pe_tensor_numel(dy)))
    return pe_kernel_error(c, PE_ESHAPE, "fused relu: Y must have Y@GRAD's shape");
  int64_t blk;
  PE_TRY(bn_layout(c, true, &blk));
  bn_dims d = bn_dims_of(x);
  bn_bwd b = {.scale = pe_f32(pe_kin(c, BNG_SCALE, 0)),
              .sm = pe_f32(pe_kin(c, BNG_SAVED_MEAN, 0)),
              .sv = pe_f32(pe_kin(c, BNG_SAVED_VAR, 0)),
              .dsv = dscale ? pe_f32(dscale) : NULL,
              .dbv = dbias ? pe_f32(dbias) : NULL,
              .test = pe_attr_b(c->def, c->desc, "is_test"),
              .eps = pe_attr_f(c->def, c->desc, "epsilon"),
              .m = (double)(d.n * d.sp)};
  const float *xv = pe_f32(x), *gv = pe_f32(dy), *yv = y ? pe_f32(y) : NULL;
  float *dxv = dx ? pe_f32(dx) : NULL;
  int nt = pe_kernel_threads(c);
  int64_t units = d.ch / blk;
#pragma omp parallel for num_threads(nt) if (units > 1 && pe_par_split(d.n * d.ch * d.sp)) \
    schedule(static)
  for (int64_t u = 0; u < units; u++) {
    double s_dy[BN_MAX_BLOCK], s_dyx[BN_MAX_BLOCK];
    float k[BN_MAX_BLOCK], kx[BN_MAX_BLOCK], k0[BN_MAX_BLOCK];
    if (blk == 1) {
      bn_sums(xv, gv, yv, d, u, &s_dy[0], &s_dyx[0]);
      bn_bwd_channel(&b, u, s_dy[0], s_dyx[0], &k[0], &kx[0], &k0[0]);
      if (dxv) bn_dx(xv, gv, yv, dxv, d, u, k[0], kx[0], k0[0]);
      continue;
    }
    bn_sums_blocked(xv, gv, yv, d, blk, u, s_dy, s_dyx);
    for (int64_t l = 0; l < blk; l++)
      bn_bwd_channel(&b, u * blk + l, s_dy[l], s_dyx[l], &k[l], &kx[l], &k0[l]);
    if (dxv) bn_dx_blocked(xv, gv, yv, dxv, d, blk, u, k, kx, k0);
  }
  return NULL;
}

/* Custom maker: X, Scale, Bias, SavedMean, SavedVariance, Y@GRAD ->
 * X@GRAD, Scale@GRAD, Bias@GRAD (attrs copied); Y too with a fused relu
 * (its mask; without one Y is not read, so it need not live until the
 * backward). */
static pe_status *bn_grad_maker(pe_grad_ctx *g) {
  const pe_op_desc *f = g->fwd;
  const pe_slot *sm = pe_op_find_output(f, "SavedMean"),
                *sv = pe_op_find_output(f, "SavedVariance");
  const pe_slot *y = pe_op_find_output(f, "Y");
  if (!sm || !sm->n || !sv || !sv->n || !y || !y->n)
    return pe_error(PE_ENOGRAD,
                    "batch_norm: the gradient needs outputs Y, SavedMean and SavedVariance");
  pe_op_desc *op;
  PE_TRY(pe_grad_new_op(g, "batch_norm_grad", &op));
  static const char *const params[] = {"X", "Scale", "Bias"};
  for (int i = 0; i < 3; i++) {
    const pe_slot *s = pe_op_find_input(f, params[i]);
    if (!s || !s->n) return pe_error(PE_ENOGRAD, "batch_norm: input %s missing", params[i]);
    char gslot[32];
    snprintf(gslot, sizeof gslot, "%s" PE_GRAD_SUFFIX, params[i]);
    PE_TRY(pe_op_set_input(op, params[i], s->n, (const char *const *)s->args));
    PE_TRY(pe_dnnl_grad_slot(op, true, gslot, s));
  }
  PE_TRY(pe_op_set_input(op, "SavedMean", sm->n, (const char *const *)sm->args));
  PE_TRY(pe_op_set_input(op, "SavedVariance", sv->n, (const char *const *)sv->args));
  if (bn_relu(g->def, f)) PE_TRY(pe_op_set_input(op, "Y", y->n, (const char *const *)y->args));
  PE_TRY(pe_dnnl_grad_slot(op, false, "Y" PE_GRAD_SUFFIX, y));
  for (int i = 0; i < f->n_attr; i++) PE_TRY(pe_op_set_attr(op, &f->attrs[i]));
  return NULL;
}

/* In test mode the running statistics are only copied to MeanOut and
 * VarianceOut (here and in cuda's pe_cu_bn_fwd, which skips the copy when
 * the pointers are equal): pe_op_output_unchanged. */
static int bn_output_copies(const pe_op_def *d, const pe_op_desc *op, int out) {
  if (!pe_attr_b(d, op, "is_test")) return -1;
  return out == BN_MEAN_OUT ? BN_MEAN : out == BN_VAR_OUT ? BN_VAR : -1;
}

static const pe_attr_def bn_attrs[] = {
    {"momentum", PE_ATTR_FLOAT, false, 0.9, NULL},
    {"epsilon", PE_ATTR_FLOAT, false, 1e-5, NULL},
    {"is_test", PE_ATTR_BOOL, false, 0, NULL},
    {"fuse_activation", PE_ATTR_STRING, false, 0, ""}, /* "" | "relu" */
    {PE_LAYOUT_ATTR, PE_ATTR_INT, false, 0, NULL},     /* dnnl_act_layout.h */
    {NULL},
};
static const pe_slot_def bn_in[] = {{"X", 1, 1, 0},
                                    {"Scale", 1, 1, 0},
                                    {"Bias", 1, 1, 0},
                                    {"Mean", 1, 1, PE_SLOT_NO_GRAD},
                                    {"Variance", 1, 1, PE_SLOT_NO_GRAD},
                                    {NULL}};
static const pe_slot_def bn_out[] = {
    {"Y", 1, 1, 0},         {"MeanOut", 0, 1, 0},       {"VarianceOut", 0, 1, 0},
    {"SavedMean", 0, 1, 0}, {"SavedVariance", 0, 1, 0}, {NULL}};
static const pe_slot_def bn_grad_in[] = {{"X", 1, 1, 0},
                                         {"Scale", 1, 1, 0},
                                         {"Bias", 1, 1, 0},
                                         {"SavedMean", 1, 1, 0},
                                         {"SavedVariance", 1, 1, 0},
                                         {"Y", 0, 1, 0},
                                         {"Y@GRAD", 0, 1, 0},
                                         {NULL}};
static const pe_slot_def bn_grad_out[] = {
    {"X@GRAD", 0, 1, 0}, {"Scale@GRAD", 0, 1, 0}, {"Bias@GRAD", 0, 1, 0}, {NULL}};

const pe_op_def pe_ops_batch_norm[] = {
    {.type = "batch_norm",
     .inputs = bn_in,
     .outputs = bn_out,
     .attrs = bn_attrs,
     .infer = bn_infer,
     .kernel_cpu = bn_kernel,
     .grad = bn_grad_maker,
     .output_copies = bn_output_copies},
    {.type = "batch_norm_grad",
     .inputs = bn_grad_in,
     .outputs = bn_grad_out,
     .attrs = bn_attrs,
     .infer = bn_grad_infer,
     .kernel_cpu = bn_grad_kernel},
    {0},
};
