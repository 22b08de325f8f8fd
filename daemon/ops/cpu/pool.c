/* pool2d and pool2d_grad on oneDNN pooling (max, avg with or without the
 * padding counted). NCHW. global_pooling pools each whole plane (ksize =
 * [H, W], no padding, Out [N, C, 1, 1]).
 *
 * Output size: OH = (H + 2*ph - kh) / sh + 1 (floor); as for conv, oneDNN's
 * consistency check uses the same floor, so symmetric padding is valid.
 * Paddings must be smaller than the window so that no window lies wholly in
 * padding (an exclusive average over it would divide by zero).
 *
 * Max pooling keeps NaN as PyTorch's does (max_pool_nan below): a window
 * with a NaN gives NaN, and its gradient goes to the first NaN.
 *
 * Max-pool backward (Paddle's rule): each output's gradient goes to the
 * first element of its window, in row-major order, whose value equals the
 * output. pool2d_grad has X and Out, so a direct loop over the windows
 * computes it in one pass (max_pool_grad below). oneDNN's backward needs
 * the argmax workspace that only its forward-training primitive produces;
 * the op contract gives pool2d no workspace output, so that route would
 * recompute the forward pass first: measured in the CNN at 1 thread, the
 * loop takes 2.6 ms against 4.8 on the first pool ([64,32,28,28]) and 1.1
 * against 3.0 on the second ([64,64,14,14]). It is kept
 * for the rare max-pool grad without Out (a pruned forward output). 2x2
 * windows at stride 2 without padding (the CNN's) have their own loop
 * (max_pool_grad_plane_2x2): at [64,32,28,28], 1 thread, min of 600
 * calls, 290 us against 854 for the general one.
 * The forward op itself runs in inference mode (no workspace).
 *
 * Layouts (dnnl_act_layout.h): pool2d reads X as stored (plain or
 * blocked); oneDNN's pooling writes its output in X's layout, staged to
 * Out's where that differs. The max-pool gradient loops address each
 * argument's planes in its own layout; the oneDNN gradients (average, or
 * max without Out) take plain tensors only (pass_layout.c marks no
 * argument of theirs blocked). */
#include <stdlib.h>
#include <string.h>

#include "ops/cpu/dnnl_act_layout.h"
#include "ops/cpu/dnnl_util.h"
#include "ops/cpu/par_min.h"
#include "ops/op_tables.h"

enum { PL_X };
enum { PL_OUT };
enum { PLG_X, PLG_OUT, PLG_DOUT };
enum { PLG_DX };

typedef struct pool_params {
  bool max, global, exclusive;
  int64_t ksize[2], strides[2], paddings[2];
} pool_params;

/* Params for an input of spatial size h x w (global pooling depends on it). */
static void pool_params_k(const pe_kernel_ctx *c, int64_t h, int64_t w, pool_params *p) {
  p->max = strcmp(pe_attr_s(c->def, c->desc, "pooling_type"), "max") == 0;
  p->global = pe_attr_b(c->def, c->desc, "global_pooling");
  p->exclusive = pe_attr_b(c->def, c->desc, "exclusive");
  pe_dnnl_attr_pair_k(c->desc, "ksize", 1, p->ksize);
  pe_dnnl_attr_pair_k(c->desc, "strides", 1, p->strides);
  pe_dnnl_attr_pair_k(c->desc, "paddings", 0, p->paddings);
  if (p->global) {
    p->ksize[0] = h;
    p->ksize[1] = w;
    p->strides[0] = p->strides[1] = 1;
    p->paddings[0] = p->paddings[1] = 0;
  }
}

/* An output size that attributes too large for int64_t arithmetic give
 * (pool_check refuses it). */
#define POOL_OVERFLOW INT64_MIN

/* The output size along one axis: -1 when the input's is unknown, 0 when
 * the padded input is smaller than the window, POOL_OVERFLOW. */
static int64_t pool_out_dim(int64_t in, int64_t k, int64_t s, int64_t p) {
  if (in < 0) return -1;
  int64_t padded;
  if (__builtin_mul_overflow(p, 2, &padded) || __builtin_add_overflow(in, padded, &padded))
    return POOL_OVERFLOW;
  return padded < k ? 0 : (padded - k) / s + 1; /* 0: too small */
}

static pe_status *pool_check(pe_infer_ctx *c, pe_shape *out) {
  PE_TRY(pe_dnnl_infer_f32(c));
  pe_meta *x = pe_in_meta(c, PL_X, 0);
  if (!x) return pe_infer_error(c, PE_EARITY, "missing input X");
  char sb[PE_SHAPE_STRLEN];
  const char *xn = pe_in_name(c, PL_X, 0);
  if (x->shape.ndim != 4)
    return pe_infer_error(c, PE_ESHAPE, "input X '%s' shape %s must be 4-D NCHW", xn,
                          pe_shape_str(&x->shape, sb, sizeof sb));
  const char *type = pe_attr_s(c->def, c->desc, "pooling_type");
  if (strcmp(type, "max") != 0 && strcmp(type, "avg") != 0)
    return pe_infer_error(c, PE_EATTR, "pooling_type '%s' must be \"max\" or \"avg\"", type);
  const int64_t *xd = x->shape.d;
  if (pe_attr_b(c->def, c->desc, "global_pooling")) {
    *out = PE_SHAPE(xd[0], xd[1], 1, 1);
    return NULL;
  }
  const int64_t *kv;
  if (pe_attr_ints(c->desc, "ksize", &kv) != 2)
    return pe_infer_error(c, PE_EATTR, "attribute ksize must hold 2 values (KH, KW)");
  int64_t k[2] = {kv[0], kv[1]}, s[2], p[2];
  PE_TRY(pe_dnnl_attr_pair(c, "strides", 1, s));
  PE_TRY(pe_dnnl_attr_pair(c, "paddings", 0, p));
  for (int i = 0; i < 2; i++)
    if (k[i] < 1 || s[i] < 1 || p[i] < 0 || p[i] >= k[i])
      return pe_infer_error(c, PE_EATTR,
                            "ksize [%lld,%lld] and strides [%lld,%lld] must be >= 1 and "
                            "paddings [%lld,%lld] in [0, ksize)",
                            (long long)k[0], (long long)k[1], (long long)s[0], (long long)s[1],
                            (long long)p[0], (long long)p[1]);
  *out = PE_SHAPE(xd[0], xd[1], pool_out_dim(xd[2], k[0], s[0], p[0]),
                  pool_out_dim(xd[3], k[1], s[1], p[1]));
  if (out->d[2] == POOL_OVERFLOW || out->d[3] == POOL_OVERFLOW)
    return pe_infer_error(
        c, PE_EATTR, "paddings [%lld,%lld] are too large for X '%s' %s (the sizes overflow)",
        (long long)p[0], (long long)p[1], xn, pe_shape_str(&x->shape, sb, sizeof sb));
  if ((xd[2] >= 0 && out->d[2] < 1) || (xd[3] >= 0 && out->d[3] < 1))
    return pe_infer_error(c, PE_ESHAPE,
                          "input X '%s' shape %s is smaller than the window %lldx%lld", xn,
                          pe_shape_str(&x->shape, sb, sizeof sb), (long long)k[0], (long long)k[1]);
  return NULL;
}

static pe_status *pool_infer(pe_infer_ctx *c) {
  pe_shape out;
  PE_TRY(pool_check(c, &out));
  pe_infer_set(c, PL_OUT, PE_F32, &out);
  return NULL;
}

/* Out and Out@GRAD must have the shape the window gives X: both kernels
 * (the CPU's loops, cuDNN's backward) index them by it, so a gradient of
 * another shape would be read out of bounds. */
static pe_status *pool_grad_infer(pe_infer_ctx *c) {
  pe_shape out;
  PE_TRY(pool_check(c, &out)); /* PLG_X == PL_X */
  static const int slots[] = {PLG_OUT, PLG_DOUT};
  static const char *const slot_names[] = {"Out", "Out@GRAD"};
  for (int i = 0; i < 2; i++) {
    pe_meta *m = pe_in_meta(c, slots[i], 0);
    if (!m || pe_shape_compatible(&m->shape, &out)) continue;
    char sb[PE_SHAPE_STRLEN], ob[PE_SHAPE_STRLEN], xb[PE_SHAPE_STRLEN];
    return pe_infer_error(
        c, PE_ESHAPE, "input %s '%s' shape %s does not match the pooled shape %s of X '%s' %s",
        slot_names[i], pe_in_name(c, slots[i], 0), pe_shape_str(&m->shape, sb, sizeof sb),
        pe_shape_str(&out, ob, sizeof ob), pe_in_name(c, PLG_X, 0),
        pe_shape_str(&pe_in_meta(c, PLG_X, 0)->shape, xb, sizeof xb));
  }
  return pe_infer_grad_like_inputs(c);
}

typedef struct pool_descs {
  dnnl_memory_desc_t src, dst; /* src: X as stored; dst: plain */
  dnnl_memory_desc_t dst_any;  /* the forward's output: X's layout, oneDNN's choice */
  dnnl_dims_t strides, kernel, dilation, pad;
  dnnl_alg_kind_t alg;
} pool_descs;

static pe_status *pool_descs_make(pe_kernel_ctx *c, const pe_shape *x, pool_descs *d) {
  pool_params p;
  pool_params_k(c, x->d[2], x->d[3], &p);
  int64_t dst[4] = {x->d[0], x->d[1],
                    pool_out_dim(x->d[2], p.ksize[0], p.strides[0], p.paddings[0]),
                    pool_out_dim(x->d[3], p.ksize[1], p.strides[1], p.paddings[1])};
  dnnl_status_t s = pe_dnnl_act_md_in(&d->src, c, PL_X, x);
  if (s == dnnl_success) s = pe_dnnl_md_plain(&d->dst, 4, dst);
  if (s == dnnl_success) s = pe_dnnl_md_any(&d->dst_any, 4, dst);
  for (int i = 0; i < 2; i++) {
    d->strides[i] = p.strides[i];
    d->kernel[i] = p.ksize[i];
    d->dilation[i] = 0;
    d->pad[i] = p.paddings[i];
  }
  d->alg = p.max         ? dnnl_pooling_max
           : p.exclusive ? dnnl_pooling_avg_exclude_padding
                         : dnnl_pooling_avg_include_padding;
  return pe_dnnl_check(s, c, "pooling memory desc");
}

static pe_status *pool_fwd_pd(pe_kernel_ctx *c, pool_descs *d, dnnl_prop_kind_t prop,
                              const dnnl_memory_desc_t *dst, dnnl_primitive_desc_t *pd) {
  dnnl_pooling_v2_desc_t pdsc;
  PE_TRY(
      pe_dnnl_check(dnnl_pooling_v2_forward_desc_init(&pdsc, prop, d->alg, &d->src, dst, d->strides,
                                                      d->kernel, d->dilation, d->pad, d->pad),
                    c, "pooling forward desc"));
  return pe_dnnl_pd(c, &pdsc, NULL, "pooling forward primitive desc", pd);
}

/* prims[0] the pooling; stages[0] its output (to Out's layout). */
static pe_status *pool_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const pe_shape *x) {
  pool_descs d;
  dnnl_primitive_desc_t pd;
  PE_TRY(pool_descs_make(c, x, &d));
  PE_TRY(pool_fwd_pd(c, &d, dnnl_forward_inference, &d.dst_any, &pd));
  static const int args[] = {DNNL_ARG_SRC, DNNL_ARG_DST};
  pe_dnnl_prim *p;
  dnnl_memory_desc_t out;
  pe_shape os = PE_SHAPE(d.dst.dims[0], d.dst.dims[1], d.dst.dims[2], d.dst.dims[3]);
  pe_status *st = pe_dnnl_entry_add(c, e, pd, args, 2, "pooling forward", &p);
  if (!st) st = pe_dnnl_check(pe_dnnl_act_md_out(&out, c, PL_OUT, &os), c, "pooling memory desc");
  if (!st) st = pe_dnnl_stage_make(c, e, pd, DNNL_ARG_DST, &out, true, NULL, &e->stages[0]);
  dnnl_primitive_desc_destroy(pd);
  return st;
}

/* oneDNN's max pooling skips a NaN (a window of NaNs gives -FLT_MAX);
 * PyTorch's gives NaN, and so does ours (a NaN must reach the loss). One counting pass over X
 * (vectorized); only when it finds a NaN, each output whose window holds one becomes NaN. */
static void max_pool_nan(pe_kernel_ctx *c, const pe_tensor *x, pe_tensor *out) {
  int64_t n = pe_tensor_numel(x);
  const float *xf = pe_f32(x);
  /* x - x is 0, NaN for NaN (and Inf: then the scan finds nothing): one
   * vector subtract and add per element. */
  float any = 0;
  if (!pe_par_split(n)) {
#pragma omp simd reduction(+ : any)
    for (int64_t i = 0; i < n; i++) any += xf[i] - xf[i];
  } else {
#pragma omp parallel for simd num_threads(pe_kernel_threads(c)) reduction(+ : any)
    for (int64_t i = 0; i < n; i++) any += xf[i] - xf[i];
  }
  if (any == any) return;
  const int64_t *xd = x->shape.d;
  pool_params p;
  pool_params_k(c, xd[2], xd[3], &p);
  int64_t h = xd[2], w = xd[3], oh = out->shape.d[2], ow = out->shape.d[3];
  pe_act_plane px = pe_act_plane_of(&x->shape, pe_dnnl_act_blocked(c, false, PL_X));
  pe_act_plane po = pe_act_plane_of(&out->shape, pe_dnnl_act_blocked(c, true, PL_OUT));
  float *of = pe_f32(out);
  for (int64_t n = 0; n < xd[0]; n++)
    for (int64_t ch = 0; ch < xd[1]; ch++) {
      const float *xk = xf + pe_act_plane_base(&px, n, ch);
      float *ok = of + pe_act_plane_base(&po, n, ch);
      for (int64_t i = 0; i < oh; i++)
        for (int64_t j = 0; j < ow; j++) {
          int64_t r0 = i * p.strides[0] - p.paddings[0], c0 = j * p.strides[1] - p.paddings[1];
          int64_t r1 = r0 + p.ksize[0] < h ? r0 + p.ksize[0] : h;
          int64_t c1 = c0 + p.ksize[1] < w ? c0 + p.ksize[1] : w;
          for (int64_t r = r0 < 0 ? 0 : r0; r < r1; r++)
            for (int64_t q = c0 < 0 ? 0 : c0; q < c1; q++) {
              float v = xk[(r * w + q) * px.block];
              if (v != v) ok[(i * ow + j) * po.block] = v;
            }
        }
    }
}

static pe_status *pool_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, PL_X, 0), *out = pe_kout(c, PL_OUT, 0);
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(pe_dnnl_cache_lookup_shape(c, &x->shape, &e, &fresh));
  if (fresh) PE_TRY(pe_dnnl_cache_built(c, e, pool_build(c, e, &x->shape)));
  void *h[] = {x->data, pe_dnnl_stage_handle(e, &e->stages[0], out->data)};
  PE_TRY(pe_dnnl_run(c, &e->prims[0], h, "pool2d"));
  PE_TRY(pe_dnnl_stage_out(c, e, &e->stages[0], out->data));
  if (strcmp(pe_attr_s(c->def, c->desc, "pooling_type"), "max") == 0) max_pool_nan(c, x, out);
  return NULL;
}

/* max: prims[0] forward training (SRC, DST, WORKSPACE), prims[1] backward
 * (DIFF_DST, WORKSPACE, DIFF_SRC); bufs[0] scratch dst, bufs[1] workspace.
 * avg: prims[0] backward (DIFF_DST, DIFF_SRC). */
static pe_status *pool_grad_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const pe_shape *x) {
  pool_descs d;
  dnnl_primitive_desc_t hint, pd = NULL;
  PE_TRY(pool_descs_make(c, x, &d));
  PE_TRY(pool_fwd_pd(c, &d, dnnl_forward_training, &d.dst, &hint));
  bool max = d.alg == dnnl_pooling_max;
  pe_dnnl_prim *p;
  void *buf;
  pe_status *st = NULL;
  if (max) {
    static const int fargs[] = {DNNL_ARG_SRC, DNNL_ARG_DST, DNNL_ARG_WORKSPACE};
    const dnnl_memory_desc_t *ws = dnnl_primitive_desc_query_md(hint, dnnl_query_workspace_md, 0);
    st = pe_dnnl_entry_add(c, e, hint, fargs, 3, "pooling forward (workspace)", &p);
    if (!st) st = pe_dnnl_entry_buffer(c, e, dnnl_memory_desc_get_size(&d.dst), &buf);
    if (!st) st = pe_dnnl_entry_buffer(c, e, ws ? dnnl_memory_desc_get_size(ws) : 0, &buf);
  }
  dnnl_pooling_v2_desc_t bd;
  if (!st)
    st = pe_dnnl_check(dnnl_pooling_v2_backward_desc_init(&bd, d.alg, &d.src, &d.dst, d.strides,
                                                          d.kernel, d.dilation, d.pad, d.pad),
                       c, "pooling backward desc");
  if (!st) st = pe_dnnl_pd(c, &bd, hint, "pooling backward primitive desc", &pd);
  if (!st) {
    static const int margs[] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WORKSPACE, DNNL_ARG_DIFF_SRC};
    static const int aargs[] = {DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_SRC};
    st = max ? pe_dnnl_entry_add(c, e, pd, margs, 3, "pooling backward", &p)
             : pe_dnnl_entry_add(c, e, pd, aargs, 2, "pooling backward", &p);
  }
  if (pd) dnnl_primitive_desc_destroy(pd);
  dnnl_primitive_desc_destroy(hint);
  return st;
}

/* dx of one N*C plane by Paddle's rule (see the top of the file). The
 * plane (a few KB) is zeroed and then each window adds its gradient to
 * its first maximum: overlapping windows accumulate. The window is scanned
 * backwards with a select instead of a branch (which element holds the
 * maximum is data-dependent: a branch mispredicted on most windows made
 * the first version slower than oneDNN's recompute-and-backward). */
/* x is its window's maximum m; a NaN maximum (max_pool_nan) is its window's
 * first NaN's. */
static inline int is_max(float x, float m) {
  return x == m || (m != m && x != x);
}

/* The plane functions take each argument's element step (1 plain, the
 * channel block when blocked: dnnl_act_layout.h); inlined, the all-plain
 * call sites pass constant 1s and compile to the contiguous loops. */
typedef struct plane_steps {
  int64_t x, out, dout, dx;
} plane_steps;

static inline void max_pool_grad_plane(const pool_params *p, int64_t h, int64_t w, int64_t oh,
                                       int64_t ow, const float *x, const float *out,
                                       const float *dout, float *dx, plane_steps sp) {
  for (int64_t q = 0; q < h * w; q++) dx[q * sp.dx] = 0.0f;
  for (int64_t i = 0; i < oh; i++) {
    int64_t r0 = i * p->strides[0] - p->paddings[0], r1 = r0 + p->ksize[0];
    if (r0 < 0) r0 = 0;
    if (r1 > h) r1 = h;
    for (int64_t j = 0; j < ow; j++) {
      int64_t c0 = j * p->strides[1] - p->paddings[1], c1 = c0 + p->ksize[1];
      if (c0 < 0) c0 = 0;
      if (c1 > w) c1 = w;
      float m = out[(i * ow + j) * sp.out];
      int64_t first = -1;
      for (int64_t r = r1 - 1; r >= r0; r--)
        for (int64_t q = c1 - 1; q >= c0; q--)
          first = is_max(x[(r * w + q) * sp.x], m) ? r * w + q : first;
      if (first >= 0) dx[first * sp.dx] += dout[(i * ow + j) * sp.dout];
    }
  }
}

/* The same for 2x2 windows at stride 2 without padding (the CNN's pools):
 * the windows do not overlap, so each covered element is written once,
 * with its window's gradient or 0, and the four selects follow the
 * row-major order (no zeroing pass, no accumulation, no loop per window).
 * An odd last row or column, in no window, gets 0. */
static inline void max_pool_grad_plane_2x2(int64_t h, int64_t w, int64_t oh, int64_t ow,
                                           const float *x, const float *out, const float *dout,
                                           float *dx, plane_steps sp) {
  if (2 * oh != h || 2 * ow != w)
    for (int64_t q = 0; q < h * w; q++) dx[q * sp.dx] = 0.0f;
  int64_t sx = sp.x, sd = sp.dx;
  for (int64_t i = 0; i < oh; i++) {
    const float *x0 = x + 2 * i * w * sx, *x1 = x0 + w * sx, *o = out + i * ow * sp.out,
                *g = dout + i * ow * sp.dout;
    float *d0 = dx + 2 * i * w * sd, *d1 = d0 + w * sd;
    for (int64_t j = 0; j < ow; j++) {
      float m = o[j * sp.out], gj = g[j * sp.dout];
      /* All four compared, combined with & and | (no short circuit: which
       * element holds the maximum is data-dependent, a branch mispredicts). */
      int a = x0[2 * j * sx] == m, b = x0[(2 * j + 1) * sx] == m, cc = x1[2 * j * sx] == m,
          d = x1[(2 * j + 1) * sx] == m;
      b &= !a;
      cc &= !(a | b);
      d &= !(a | b | cc);
      d0[2 * j * sd] = a ? gj : 0.0f;
      d0[(2 * j + 1) * sd] = b ? gj : 0.0f;
      d1[2 * j * sd] = cc ? gj : 0.0f;
      d1[(2 * j + 1) * sd] = d ? gj : 0.0f;
    }
  }
}

#define POOL_MAX_BLOCK 16

/* The 2x2 rule on one channel block of blocked X and X@GRAD (nChw<B>c):
 * the B channels of a window position are adjacent, so the lanes are the
 * vector. Out and Out@GRAD may be stored either way: lane l reads
 * o[ob[l] + (i * ow + j) * os] (ob: each lane's plane base, os: the
 * step); `blocked`: both are blocked too (ob[l] = ob[0] + l, os = gs = B),
 * constant in each inlined call so that those loads are plain vector
 * loads. False, having written nothing, when a lane's Out holds a NaN (the
 * caller then takes the per-plane loops). */
static inline bool max_pool_grad_block_2x2(int64_t h, int64_t w, int64_t oh, int64_t ow, int64_t B,
                                           const float *x, const float *out, const int64_t *ob,
                                           int64_t os, const float *dout, const int64_t *gb,
                                           int64_t gs, float *dx, bool blocked) {
  float any = 0;
  if (blocked) {
    const float *o = out + ob[0];
#pragma omp simd reduction(+ : any)
    for (int64_t q = 0; q < oh * ow * B; q++) any += o[q] - o[q];
  } else {
    for (int64_t l = 0; l < B; l++)
#pragma omp simd reduction(+ : any)
      for (int64_t q = 0; q < oh * ow; q++) any += out[ob[l] + q * os] - out[ob[l] + q * os];
  }
  if (any != any) return false;
  if (2 * oh != h || 2 * ow != w) memset(dx, 0, (size_t)(h * w * B) * sizeof(float));
  for (int64_t i = 0; i < oh; i++)
    for (int64_t j = 0; j < ow; j++) {
      const float *x0 = x + (2 * i * w + 2 * j) * B, *x1 = x0 + w * B;
      float *d0 = dx + (2 * i * w + 2 * j) * B, *d1 = d0 + w * B;
      int64_t q = i * ow + j;
#pragma omp simd
      for (int64_t l = 0; l < B; l++) {
        float m = blocked ? out[ob[0] + q * B + l] : out[ob[l] + q * os];
        float g = blocked ? dout[gb[0] + q * B + l] : dout[gb[l] + q * gs];
        int a = x0[l] == m, b = x0[B + l] == m, cc = x1[l] == m, d = x1[B + l] == m;
        b &= !a;
        cc &= !(a | b);
        d &= !(a | b | cc);
        d0[l] = a ? g : 0.0f;
        d0[B + l] = b ? g : 0.0f;
        d1[l] = cc ? g : 0.0f;
        d1[B + l] = d ? g : 0.0f;
      }
    }
  return true;
}

static void max_pool_grad(pe_kernel_ctx *c, const pe_tensor *x, const pe_tensor *out,
                          const pe_tensor *dout, pe_tensor *dx) {
  const int64_t *xd = x->shape.d;
  pool_params p;
  pool_params_k(c, xd[2], xd[3], &p);
  int64_t planes = xd[0] * xd[1], h = xd[2], w = xd[3], oh = out->shape.d[2], ow = out->shape.d[3];
  const float *xf = pe_f32(x), *of = pe_f32(out), *gf = pe_f32(dout);
  float *df = pe_f32(dx);
  int nt = pe_kernel_threads(c);
  bool k2s2 = p.ksize[0] == 2 && p.ksize[1] == 2 && p.strides[0] == 2 && p.strides[1] == 2 &&
              p.paddings[0] == 0 && p.paddings[1] == 0 && oh == h / 2 && ow == w / 2;
  /* Each argument's planes in its own layout (pool2d_grad's slots). */
  pe_act_plane ax = pe_act_plane_of(&x->shape, pe_dnnl_act_blocked(c, false, PLG_X));
  pe_act_plane ao = pe_act_plane_of(&out->shape, pe_dnnl_act_blocked(c, false, PLG_OUT));
  pe_act_plane ag = pe_act_plane_of(&dout->shape, pe_dnnl_act_blocked(c, false, PLG_DOUT));
  pe_act_plane ad = pe_act_plane_of(&dx->shape, pe_dnnl_act_blocked(c, true, PLG_DX));
  plane_steps sp = {ax.block, ao.block, ag.block, ad.block};
  bool plain = sp.x == 1 && sp.out == 1 && sp.dout == 1 && sp.dx == 1;
  static const plane_steps ones = {1, 1, 1, 1};
  /* X and X@GRAD blocked alike: a channel block at a time, lanes as the
   * vector (max_pool_grad_block_2x2); planes whose Out has a NaN, and the
   * other cases, one plane at a time below. */
  int64_t B = ax.block;
  if (k2s2 && B > 1 && ad.block == B && B <= POOL_MAX_BLOCK) {
    int64_t groups = xd[0] * (xd[1] / B);
    /* Out and Out@GRAD stored otherwise than X (plain before a flatten): a
     * group's planes are first interleaved into a scratch block, so the
     * loop reads them as vectors; gathered lane by lane it ran scalar. */
    bool stage = !(ao.block == B && ag.block == B);
    size_t sn = stage ? (size_t)(oh * ow * B) : 0;
#pragma omp parallel if (pe_par_split(planes * h * w)) num_threads(nt)
    {
      float *so = stage ? malloc(2 * sn * sizeof(float)) : NULL, *sg = so ? so + sn : NULL;
#pragma omp for schedule(static)
      for (int64_t k = 0; k < groups; k++) {
        int64_t n = k / (xd[1] / B), c0 = (k % (xd[1] / B)) * B;
        int64_t ob[POOL_MAX_BLOCK], gb[POOL_MAX_BLOCK];
        for (int64_t l = 0; l < B; l++) {
          ob[l] = pe_act_plane_base(&ao, n, c0 + l);
          gb[l] = pe_act_plane_base(&ag, n, c0 + l);
        }
        const float *xk = xf + pe_act_plane_base(&ax, n, c0);
        float *dk = df + pe_act_plane_base(&ad, n, c0);
        bool done;
        if (!stage) {
          done = max_pool_grad_block_2x2(h, w, oh, ow, B, xk, of, ob, B, gf, gb, B, dk, true);
        } else if (so) {
          for (int64_t q = 0; q < oh * ow; q++)
            for (int64_t l = 0; l < B; l++) {
              so[q * B + l] = of[ob[l] + q * ao.block];
              sg[q * B + l] = gf[gb[l] + q * ag.block];
            }
          static const int64_t zero[1] = {0};
          done = max_pool_grad_block_2x2(h, w, oh, ow, B, xk, so, zero, B, sg, zero, B, dk, true);
        } else { /* no scratch: lanes gathered */
          done = max_pool_grad_block_2x2(h, w, oh, ow, B, xk, of, ob, ao.block, gf, gb, ag.block,
                                         dk, false);
        }
        if (done) continue;
        for (int64_t l = 0; l < B; l++)
          max_pool_grad_plane(&p, h, w, oh, ow, xk + l, of + ob[l], gf + gb[l], dk + l, sp);
      }
      free(so);
    }
    return;
  }
#pragma omp parallel for if (pe_par_split(planes * h * w)) num_threads(nt) schedule(static)
  for (int64_t k = 0; k < planes; k++) {
    int64_t n = k / xd[1], ch = k % xd[1];
    const float *xk = xf + pe_act_plane_base(&ax, n, ch), *ok = of + pe_act_plane_base(&ao, n, ch),
                *gk = gf + pe_act_plane_base(&ag, n, ch);
    float *dk = df + pe_act_plane_base(&ad, n, ch);
    /* A plane with a NaN window (max_pool_nan) takes the general loop, whose
     * is_max gives the gradient to the first NaN: a check of Out (x - x is
     * 0 unless NaN or Inf) keeps the 2x2 loop's compares as they were. */
    float any = 0;
    if (k2s2) {
#pragma omp simd reduction(+ : any)
      for (int64_t q = 0; q < oh * ow; q++) any += ok[q * sp.out] - ok[q * sp.out];
    }
    if (k2s2 && any == any) {
      if (plain)
        max_pool_grad_plane_2x2(h, w, oh, ow, xk, ok, gk, dk, ones);
      else
        max_pool_grad_plane_2x2(h, w, oh, ow, xk, ok, gk, dk, sp);
    } else {
      max_pool_grad_plane(&p, h, w, oh, ow, xk, ok, gk, dk, sp);
    }
  }
}

static pe_status *pool_grad_kernel(pe_kernel_ctx *c) {
  pe_tensor *x = pe_kin(c, PLG_X, 0), *dout = pe_kin(c, PLG_DOUT, 0), *dx = pe_kout(c, PLG_DX, 0);
  pe_tensor *out = pe_kin(c, PLG_OUT, 0);
  if (!dx) return NULL;
  if (!dout) {
    pe_tensor_zero(dx);
    return NULL;
  }
  if (out && strcmp(pe_attr_s(c->def, c->desc, "pooling_type"), "max") == 0) {
    max_pool_grad(c, x, out, dout, dx);
    return NULL;
  }
  if (pe_attr_i(c->def, c->desc, PE_LAYOUT_ATTR) != 0)
    return pe_kernel_error(c, PE_EINVAL,
                           "attribute %s: only max pooling with Out takes blocked arguments",
                           PE_LAYOUT_ATTR);
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(pe_dnnl_cache_lookup_shape(c, &x->shape, &e, &fresh));
  if (fresh) PE_TRY(pe_dnnl_cache_built(c, e, pool_grad_build(c, e, &x->shape)));
  if (e->nprims == 2) { /* max: recompute the workspace, then backward */
    void *hf[] = {x->data, e->bufs[0], e->bufs[1]};
    PE_TRY(pe_dnnl_run(c, &e->prims[0], hf, "pool2d_grad forward"));
    void *hb[] = {dout->data, e->bufs[1], dx->data};
    return pe_dnnl_run(c, &e->prims[1], hb, "pool2d_grad");
  }
  void *h[] = {dout->data, dx->data};
  return pe_dnnl_run(c, &e->prims[0], h, "pool2d_grad");
}

static const pe_attr_def pool_attrs[] = {
    {"pooling_type", PE_ATTR_STRING, false, 0, "max"},
    {"ksize", PE_ATTR_INTS, true, 0, NULL},
    {"strides", PE_ATTR_INTS, false, 0, NULL},  /* [1,1] */
    {"paddings", PE_ATTR_INTS, false, 0, NULL}, /* [0,0] */
    {"global_pooling", PE_ATTR_BOOL, false, 0, NULL},
    {"exclusive", PE_ATTR_BOOL, false, 1, NULL},
    {PE_LAYOUT_ATTR, PE_ATTR_INT, false, 0, NULL}, /* dnnl_act_layout.h */
    {NULL},
};
static const pe_slot_def pool_in[] = {{"X", 1, 1, 0}, {NULL}};
static const pe_slot_def pool_out[] = {{"Out", 1, 1, 0}, {NULL}};
static const pe_slot_def pool_grad_in[] = {
    {"X", 1, 1, 0}, {"Out", 0, 1, 0}, {"Out@GRAD", 0, 1, 0}, {NULL}};
static const pe_slot_def pool_grad_out[] = {{"X@GRAD", 0, 1, 0}, {NULL}};

const pe_op_def pe_ops_pool[] = {
    {.type = "pool2d",
     .inputs = pool_in,
     .outputs = pool_out,
     .attrs = pool_attrs,
     .infer = pool_infer,
     .kernel_cpu = pool_kernel,
     .state_free = pe_dnnl_cache_free,
     .grad = pe_grad_default},
    {.type = "pool2d_grad",
     .inputs = pool_grad_in,
     .outputs = pool_grad_out,
     .attrs = pool_attrs,
     .infer = pool_grad_infer,
     .kernel_cpu = pool_grad_kernel,
     .state_free = pe_dnnl_cache_free},
    {0},
};
