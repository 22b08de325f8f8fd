/* conv2d and conv2d_grad on oneDNN convolution (forward, backward data,
 * backward weights). NCHW input, OIHW filter [O, C/groups, KH, KW].
 *
 * Output size (Paddle's rule, floor division):
 *   OH = (H + 2*ph - (dh*(KH-1) + 1)) / sh + 1
 * oneDNN checks dst == (src - ker_range + pad_l + pad_r) / stride + 1 with
 * the same floor, so symmetric padding (pad_r = pad_l) is always consistent.
 * Dilation differs by one: Paddle's 1 is oneDNN's 0.
 * Grouped filters are described as 5-D [g, O/g, C/g, KH, KW] (goihw), which
 * is the same memory as the 4-D OIHW tensor.
 *
 * Fused bias and relu (pass fuse_conv_act, docs/ops.md): with a Bias [O]
 * input the convolution adds it (oneDNN's bias argument), and with
 * fuse_activation "relu" it applies relu over Output right after
 * (pe_relu, relu.h: NaN stays NaN, which oneDNN's relu post-op maps to 0).
 * The gradient masks Output@GRAD with pe_relu_grad(Output, .) (relu's
 * gradient from its output) into an entry buffer,
 * then runs the two backward passes on it; Bias@GRAD comes from the
 * weights pass (oneDNN's diff_bias), or from a per-channel sum when the
 * filter needs no gradient.
 *
 * pe's Winograd (conv_winograd.h) replaces oneDNN's passes where it
 * applies and the algorithm is winograd (the default's choice there); the
 * entry then holds oneDNN's direct primitives, for the passes it does not
 * run, and the Winograd buffers. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/log.h"
#include "ops/cpu/conv_algo.h"
#include "ops/cpu/conv_weights_pass.h"
#include "ops/cpu/conv_winograd.h"
#include "ops/cpu/dnnl_act_layout.h"
#include "ops/cpu/dnnl_util.h"
#include "ops/cpu/par_min.h"
#include "ops/cpu/relu.h"
#include "ops/op_tables.h"

enum { CV_IN, CV_FILTER, CV_BIAS };
enum { CV_OUT };
enum { CVG_IN, CVG_FILTER, CVG_BIAS, CVG_OUT, CVG_DOUT };
enum { CVG_DIN, CVG_DFILTER, CVG_DBIAS };

/* fuse_activation: "" (none) or "relu"; infer refuses anything else. */
static bool conv_relu(const pe_op_def *def, const pe_op_desc *op) {
  return strcmp(pe_attr_s(def, op, "fuse_activation"), "relu") == 0;
}

typedef struct conv_params {
  int64_t strides[2], paddings[2], dilations[2], groups;
} conv_params;

/* An output size that attributes too large for int64_t arithmetic give
 * (conv_check refuses it). */
#define CONV_OVERFLOW INT64_MIN

/* The output size along one axis: -1 when the input's is unknown, 0 when
 * the padded input is smaller than the dilated kernel, CONV_OVERFLOW. */
static int64_t conv_out_dim(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  if (in < 0) return -1;
  int64_t padded, reach;
  if (__builtin_mul_overflow(p, 2, &padded) || __builtin_add_overflow(in, padded, &padded) ||
      __builtin_mul_overflow(d, k - 1, &reach) || __builtin_add_overflow(reach, 1, &reach))
    return CONV_OVERFLOW;
  int64_t span = padded - reach;      /* both >= 0 here: no overflow */
  return span < 0 ? 0 : span / s + 1; /* 0: too small (C division truncates toward 0) */
}

/* Shared by conv2d and conv2d_grad: checks dtypes, ranks, attrs, channels;
 * computes the output shape. */
static pe_status *conv_check(pe_infer_ctx *c, int sin, int sf, int sb_slot, pe_shape *out) {
  PE_TRY(pe_dnnl_infer_f32(c));
  pe_meta *x = pe_in_meta(c, sin, 0), *w = pe_in_meta(c, sf, 0);
  if (!x || !w) return pe_infer_error(c, PE_EARITY, "needs inputs Input and Filter");
  char sb[PE_SHAPE_STRLEN], sb2[PE_SHAPE_STRLEN];
  const char *xn = pe_in_name(c, sin, 0), *wn = pe_in_name(c, sf, 0);
  if (x->shape.ndim != 4)
    return pe_infer_error(c, PE_ESHAPE, "input Input '%s' shape %s must be 4-D NCHW", xn,
                          pe_shape_str(&x->shape, sb, sizeof sb));
  if (w->shape.ndim != 4)
    return pe_infer_error(c, PE_ESHAPE, "input Filter '%s' shape %s must be 4-D OIHW", wn,
                          pe_shape_str(&w->shape, sb, sizeof sb));
  conv_params p;
  PE_TRY(pe_dnnl_attr_pair(c, "strides", 1, p.strides));
  PE_TRY(pe_dnnl_attr_pair(c, "paddings", 0, p.paddings));
  PE_TRY(pe_dnnl_attr_pair(c, "dilations", 1, p.dilations));
  p.groups = pe_attr_i(c->def, c->desc, "groups");
  for (int i = 0; i < 2; i++)
    if (p.strides[i] < 1 || p.paddings[i] < 0 || p.dilations[i] < 1)
      return pe_infer_error(c, PE_EATTR,
                            "strides [%lld,%lld] must be >= 1, paddings [%lld,%lld] >= 0, "
                            "dilations [%lld,%lld] >= 1",
                            (long long)p.strides[0], (long long)p.strides[1],
                            (long long)p.paddings[0], (long long)p.paddings[1],
                            (long long)p.dilations[0], (long long)p.dilations[1]);
  const int64_t *xd = x->shape.d, *wd = w->shape.d;
  if (p.groups < 1 || (wd[0] >= 0 && wd[0] % p.groups != 0))
    return pe_infer_error(c, PE_EATTR,
                          "groups %lld must be >= 1 and divide the %lld filters of '%s'",
                          (long long)p.groups, (long long)wd[0], wn);
  int64_t channels; /* the filter's input channels times the groups */
  if (xd[1] >= 0 && wd[1] >= 0 &&
      (__builtin_mul_overflow(wd[1], p.groups, &channels) || xd[1] != channels))
    return pe_infer_error(c, PE_ESHAPE,
                          "input Filter '%s' shape %s does not match Input '%s' shape %s "
                          "(input channels %lld vs filter channels %lld x groups %lld)",
                          wn, pe_shape_str(&w->shape, sb, sizeof sb), xn,
                          pe_shape_str(&x->shape, sb2, sizeof sb2), (long long)xd[1],
                          (long long)wd[1], (long long)p.groups);
  *out = PE_SHAPE(xd[0], wd[0],
                  conv_out_dim(xd[2], wd[2], p.strides[0], p.paddings[0], p.dilations[0]),
                  conv_out_dim(xd[3], wd[3], p.strides[1], p.paddings[1], p.dilations[1]));
  if (out->d[2] == CONV_OVERFLOW || out->d[3] == CONV_OVERFLOW)
    return pe_infer_error(c, PE_EATTR,
                          "paddings [%lld,%lld] and dilations [%lld,%lld] are too large for "
                          "Input '%s' %s and Filter '%s' %s (the sizes overflow)",
                          (long long)p.paddings[0], (long long)p.paddings[1],
                          (long long)p.dilations[0], (long long)p.dilations[1], xn,
                          pe_shape_str(&x->shape, sb, sizeof sb), wn,
                          pe_shape_str(&w->shape, sb2, sizeof sb2));
  if ((xd[2] >= 0 && out->d[2] < 1) || (xd[3] >= 0 && out->d[3] < 1))
    return pe_infer_error(c, PE_ESHAPE,
                          "input Input '%s' shape %s is smaller than the dilated filter '%s' %s "
                          "(output would be %lldx%lld)",
                          xn, pe_shape_str(&x->shape, sb, sizeof sb), wn,
                          pe_shape_str(&w->shape, sb2, sizeof sb2), (long long)out->d[2],
                          (long long)out->d[3]);
  const char *act = pe_attr_s(c->def, c->desc, "fuse_activation");
  if (act[0] && strcmp(act, "relu") != 0)
    return pe_infer_error(c, PE_EATTR, "fuse_activation '%s' unknown (\"\" or \"relu\")", act);
  pe_meta *b = pe_in_meta(c, sb_slot, 0);
  if (b && (b->shape.ndim != 1 || (wd[0] >= 0 && b->shape.d[0] >= 0 && b->shape.d[0] != wd[0])))
    return pe_infer_error(
        c, PE_ESHAPE, "input Bias '%s' shape %s must be [%lld], one per filter of '%s'",
        pe_in_name(c, sb_slot, 0), pe_shape_str(&b->shape, sb, sizeof sb), (long long)wd[0], wn);
  return NULL;
}

static pe_status *conv_infer(pe_infer_ctx *c) {
  pe_shape out;
  PE_TRY(conv_check(c, CV_IN, CV_FILTER, CV_BIAS, &out));
  pe_infer_set(c, CV_OUT, PE_F32, &out);
  return NULL;
}

static pe_status *conv_grad_infer(pe_infer_ctx *c) {
  pe_shape out;
  PE_TRY(conv_check(c, CVG_IN, CVG_FILTER, CVG_BIAS, &out));
  if (conv_relu(c->def, c->desc) && !pe_in_meta(c, CVG_OUT, 0))
    return pe_infer_error(c, PE_EARITY, "fuse_activation relu needs input Output (the mask)");
  return pe_infer_grad_like_inputs(c);
}

/* Memory descs and oneDNN-style params of one (input, filter) pair: the
 * plain descs, the same dims with format any, from which the primitives
 * are created (they choose blocked layouts; see pe_dnnl_stage_make), and
 * the layouts the activation tensors are stored in (dnnl_act_layout.h):
 * a stage reorders only where the primitive's choice differs from those. */
typedef struct conv_descs {
  dnnl_memory_desc_t src, wei, dst, bia;        /* plain (bia: [O]) */
  dnnl_memory_desc_t src_any, wei_any, dst_any; /* what the primitives see */
  /* The tensors: Input, Output (forward) or Output@GRAD (gradient), and
   * Input@GRAD. */
  dnnl_memory_desc_t src_t, dst_t, dsrc_t;
  dnnl_dims_t strides, dilates, pad;
} conv_descs;

static pe_status *conv_descs_make(pe_kernel_ctx *c, const pe_shape *x, const pe_shape *w,
                                  conv_descs *d) {
  bool grad = strcmp(c->def->type, "conv2d_grad") == 0;
  conv_params p;
  pe_dnnl_attr_pair_k(c->desc, "strides", 1, p.strides);
  pe_dnnl_attr_pair_k(c->desc, "paddings", 0, p.paddings);
  pe_dnnl_attr_pair_k(c->desc, "dilations", 1, p.dilations);
  p.groups = pe_attr_i(c->def, c->desc, "groups");
  int64_t oh = conv_out_dim(x->d[2], w->d[2], p.strides[0], p.paddings[0], p.dilations[0]);
  int64_t ow = conv_out_dim(x->d[3], w->d[3], p.strides[1], p.paddings[1], p.dilations[1]);
  int64_t dst[4] = {x->d[0], w->d[0], oh, ow};
  int64_t g5[5] = {p.groups, w->d[0] / p.groups, w->d[1], w->d[2], w->d[3]};
  const int64_t *wd = p.groups == 1 ? w->d : g5;
  int wn = p.groups == 1 ? 4 : 5;
  dnnl_status_t s = pe_dnnl_md_plain(&d->src, 4, x->d);
  if (s == dnnl_success) s = pe_dnnl_md_plain(&d->dst, 4, dst);
  if (s == dnnl_success) s = pe_dnnl_md_plain(&d->wei, wn, wd);
  if (s == dnnl_success) s = pe_dnnl_md_plain(&d->bia, 1, w->d);
  if (s == dnnl_success) s = pe_dnnl_md_any(&d->src_any, 4, x->d);
  if (s == dnnl_success) s = pe_dnnl_md_any(&d->dst_any, 4, dst);
  if (s == dnnl_success) s = pe_dnnl_md_any(&d->wei_any, wn, wd);
  pe_shape ds = PE_SHAPE(dst[0], dst[1], dst[2], dst[3]);
  if (s == dnnl_success) s = pe_dnnl_act_md_in(&d->src_t, c, grad ? CVG_IN : CV_IN, x);
  if (s == dnnl_success)
    s = grad ? pe_dnnl_act_md_in(&d->dst_t, c, CVG_DOUT, &ds)
             : pe_dnnl_act_md_out(&d->dst_t, c, CV_OUT, &ds);
  if (s == dnnl_success)
    s = pe_dnnl_act_md(&d->dsrc_t, x, grad && pe_dnnl_act_blocked(c, true, CVG_DIN));
  for (int i = 0; i < 2; i++) {
    d->strides[i] = p.strides[i];
    d->dilates[i] = p.dilations[i] - 1;
    d->pad[i] = p.paddings[i];
  }
  return pe_dnnl_check(s, c, "convolution memory desc");
}

static const dnnl_alg_kind_t cand_alg[PE_CONV_CANDS] = {
    [PE_CONV_DIRECT] = dnnl_convolution_direct,
    [PE_CONV_GEMM] = dnnl_convolution_direct,
    [PE_CONV_WINOGRAD] = dnnl_convolution_winograd,
    [PE_CONV_AUTO] = dnnl_convolution_auto,
};

/* What a candidate's primitives see: the plain descs for gemm (oneDNN's
 * im2col + GEMM then runs on the tensors themselves, no stage), else format
 * any (the primitive chooses; see pe_dnnl_stage_make). */
static void cand_descs(const conv_descs *d, int cand, const dnnl_memory_desc_t **src,
                       const dnnl_memory_desc_t **wei, const dnnl_memory_desc_t **dst) {
  bool plain = cand == PE_CONV_GEMM;
  *src = plain ? &d->src : &d->src_any;
  *wei = plain ? &d->wei : &d->wei_any;
  *dst = plain ? &d->dst : &d->dst_any;
}

/* bias: the fused forward; the gradients' hint is the plain one (a fused
 * relu is applied after the primitive, conv_kernel). */
static pe_status *conv_fwd_pd(pe_kernel_ctx *c, conv_descs *d, bool bias, int cand,
                              dnnl_primitive_desc_t *pd) {
  dnnl_convolution_desc_t cd;
  const dnnl_memory_desc_t *src, *wei, *dst;
  cand_descs(d, cand, &src, &wei, &dst);
  PE_TRY(pe_dnnl_check(dnnl_dilated_convolution_forward_desc_init(
                           &cd, dnnl_forward_training, cand_alg[cand], src, wei,
                           bias ? &d->bia : NULL, dst, d->strides, d->dilates, d->pad, d->pad),
                       c, "convolution forward desc"));
  return pe_dnnl_pd(c, &cd, NULL, "convolution forward primitive desc", pd);
}

static pe_status *conv_key(pe_kernel_ctx *c, const pe_tensor *x, const pe_tensor *w,
                           pe_dnnl_entry **e, bool *fresh) {
  int64_t key[PE_DNNL_KEY_MAX];
  int nk = 0;
  pe_dnnl_key_shape(key, &nk, &x->shape);
  pe_dnnl_key_shape(key, &nk, &w->shape);
  return pe_dnnl_cache_lookup(c, key, nk, e, fresh);
}

/* Forward entry: prims[0] the convolution; stages[FS_*] its arguments. */
enum { FS_SRC, FS_WEI, FS_DST };

static pe_status *conv_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const pe_shape *x,
                             const pe_shape *w, bool bias, int cand) {
  conv_descs d;
  dnnl_primitive_desc_t pd;
  PE_TRY(conv_descs_make(c, x, w, &d));
  PE_TRY(conv_fwd_pd(c, &d, bias, cand, &pd));
  /* The bias stays plain ([O], format a): no stage. */
  static const int args[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
  pe_dnnl_prim *p;
  pe_status *st = pe_dnnl_entry_add(c, e, pd, args, bias ? 4 : 3, "convolution forward", &p);
  if (!st)
    st = pe_dnnl_stage_make(c, e, pd, DNNL_ARG_SRC, &d.src_t, false, NULL, &e->stages[FS_SRC]);
  if (!st)
    st = pe_dnnl_stage_make(c, e, pd, DNNL_ARG_WEIGHTS, &d.wei, false, NULL, &e->stages[FS_WEI]);
  if (!st)
    st = pe_dnnl_stage_make(c, e, pd, DNNL_ARG_DST, &d.dst_t, true, NULL, &e->stages[FS_DST]);
  dnnl_primitive_desc_destroy(pd);
  return st;
}

/* The tensors of one call, for the build, the runs and the timing of
 * either direction. */
typedef struct conv_call {
  bool grad;
  pe_tensor *x, *w, *b;
  pe_tensor *out;          /* forward: Output; grad: Output@GRAD */
  pe_tensor *dx, *dw, *db; /* grad: the outputs present */
  void *g;                 /* grad: the output gradient the passes read */
} conv_call;

/* The passes of a call pe's Winograd runs (conv_winograd.h), and their
 * plans: the forward or the gradient's data pass (Output@GRAD to
 * Input@GRAD, the padding r - 1 - p), and the gradient's weights pass. */
enum { WINO_DATA = 1, WINO_WEIGHTS = 2 };
typedef struct conv_wino {
  int passes;
  pe_wino data, weights;
} conv_wino;

static int conv_wino_plans(const pe_kernel_ctx *c, const conv_call *k, conv_wino *cw) {
  memset(cw, 0, sizeof *cw);
  int lanes = pe_wino_lanes();
  if (!lanes) return 0;
  conv_params p;
  pe_dnnl_attr_pair_k(c->desc, "strides", 1, p.strides);
  pe_dnnl_attr_pair_k(c->desc, "paddings", 0, p.paddings);
  pe_dnnl_attr_pair_k(c->desc, "dilations", 1, p.dilations);
  const pe_shape *x = &k->x->shape, *w = &k->w->shape, *o = &k->out->shape;
  int r = (int)w->d[2];
  if (pe_attr_i(c->def, c->desc, "groups") != 1 || w->d[3] != r || !pe_wino_takes(lanes, r))
    return 0;
  for (int i = 0; i < 2; i++)
    if (p.strides[i] != 1 || p.dilations[i] != 1) return 0;
  int64_t ph = p.paddings[0], pw = p.paddings[1];
  pe_act_plane xp = pe_act_plane_of(x, pe_dnnl_act_blocked(c, false, k->grad ? CVG_IN : CV_IN));
  pe_act_plane op = pe_act_plane_of(
      o, k->grad ? pe_dnnl_act_blocked(c, false, CVG_DOUT) : pe_dnnl_act_blocked(c, true, CV_OUT));
  if (!k->grad) {
    if (pe_wino_plan(&cw->data, lanes, r, x->d, w->d[0], o->d[2], o->d[3], ph, pw, xp, op))
      cw->passes = WINO_DATA;
    return cw->passes;
  }
  if (k->dx &&
      pe_wino_plan(&cw->data, lanes, r, o->d, x->d[1], x->d[2], x->d[3], r - 1 - ph, r - 1 - pw, op,
                   pe_act_plane_of(x, pe_dnnl_act_blocked(c, true, CVG_DIN))))
    cw->passes |= WINO_DATA;
  if (k->dw &&
      pe_wino_plan(&cw->weights, lanes, r, x->d, w->d[0], o->d[2], o->d[3], ph, pw, xp, op))
    cw->passes |= WINO_WEIGHTS;
  return cw->passes;
}

/* The Winograd buffers, the last three of the entry: the plans (made once:
 * an entry's shapes and layouts do not change), the transformed filters
 * (the data pass) and the team's scratch (both passes). */
enum { WB_PLANS = 3, WB_FILTERS = 2, WB_SCRATCH = 1 }; /* counted from the end */

static void *wino_buf(const pe_dnnl_entry *e, int which) {
  return e->bufs[e->nbufs - which];
}

static pe_status *conv_wino_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const conv_wino *cw) {
  int threads = omp_get_max_threads();
  size_t u = 0, scratch = 0, w = 0;
  if (cw->passes & WINO_DATA) {
    u = pe_wino_filter_floats(&cw->data);
    scratch = pe_wino_scratch_floats(&cw->data, threads);
  }
  if (cw->passes & WINO_WEIGHTS) w = pe_wino_wgrad_scratch_floats(&cw->weights, threads);
  void *plans;
  PE_TRY(pe_dnnl_entry_buffer(c, e, sizeof *cw, &plans));
  memcpy(plans, cw, sizeof *cw);
  void *buf;
  PE_TRY(pe_dnnl_entry_buffer(c, e, u * sizeof(float), &buf));
  PE_TRY(pe_dnnl_entry_buffer(c, e, (w > scratch ? w : scratch) * sizeof(float), &buf));
  e->wino_threads = threads;
  e->wino_passes = cw->passes;
  return NULL;
}

/* The team of a run: at most the one the scratch holds. */
static int conv_wino_team(const pe_dnnl_entry *e) {
  int threads = omp_get_max_threads();
  return threads < e->wino_threads ? threads : e->wino_threads;
}

/* The forward or the data pass on pe's Winograd: y <- x (Input, or the
 * output gradient) convolved with w, plus bias. */
static void conv_wino_data(const pe_dnnl_entry *e, const conv_call *k, const void *x,
                           const float *bias, void *y) {
  const conv_wino *cw = wino_buf(e, WB_PLANS);
  float *u = wino_buf(e, WB_FILTERS);
  int threads = conv_wino_team(e);
  pe_wino_filter(&cw->data, pe_f32(k->w), k->grad, u, threads);
  pe_wino_run(&cw->data, x, u, bias, y, wino_buf(e, WB_SCRATCH), threads);
}

/* The weights pass on pe's Winograd: Filter@GRAD from Input and the output
 * gradient g. */
static void conv_wino_weights(const pe_dnnl_entry *e, const conv_call *k) {
  const conv_wino *cw = wino_buf(e, WB_PLANS);
  pe_wino_weights_grad(&cw->weights, pe_f32(k->x), k->g, pe_f32(k->dw), wino_buf(e, WB_SCRATCH),
                       conv_wino_team(e));
}

/* The convolution alone (stages included), no relu. */
static pe_status *conv_fwd_run(pe_kernel_ctx *c, pe_dnnl_entry *e, const conv_call *k) {
  const pe_dnnl_stage *s = e->stages;
  void *x = k->x->data, *w = k->w->data, *out = k->out->data;
  if (e->wino_passes & WINO_DATA) {
    conv_wino_data(e, k, x, k->b ? pe_f32(k->b) : NULL, out);
    return NULL;
  }
  PE_TRY(pe_dnnl_stage_in(c, e, &s[FS_SRC], x));
  PE_TRY(pe_dnnl_stage_in(c, e, &s[FS_WEI], w)); /* every call: weights change */
  void *h[] = {pe_dnnl_stage_handle(e, &s[FS_SRC], x), pe_dnnl_stage_handle(e, &s[FS_WEI], w),
               pe_dnnl_stage_handle(e, &s[FS_DST], out), k->b ? k->b->data : NULL};
  PE_TRY(pe_dnnl_run(c, &e->prims[0], h, "conv2d"));
  return pe_dnnl_stage_out(c, e, &s[FS_DST], out);
}

static pe_status *conv_grad_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const pe_shape *x,
                                  const pe_shape *w, const pe_shape *out, bool bias, int cand);
static pe_status *conv_grad_run(pe_kernel_ctx *c, pe_dnnl_entry *e, const conv_call *k);

/* The OpenMP team of a choice on this thread: oneDNN sizes a primitive's
 * work split when it is created (omp_get_max_threads) and runs it with
 * that many threads, so a one-thread choice is built and run with the
 * calling thread's team set to 1 (omp_set_num_threads is per thread), and
 * the place's team restored after. Returns the team to restore. */
static int conv_team_enter(int choice) {
  int team = omp_get_max_threads();
  if (pe_conv_choice_single(choice) && team > 1) omp_set_num_threads(1);
  return team;
}

static void conv_team_leave(int team) {
  if (omp_get_max_threads() != team) omp_set_num_threads(team);
}

static pe_status *conv_call_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const conv_call *k,
                                  int choice) {
  int cand = pe_conv_choice_cand(choice), team = conv_team_enter(choice);
  conv_wino cw;
  bool wino = cand == PE_CONV_WINOGRAD && conv_wino_plans(c, k, &cw);
  if (wino) cand = PE_CONV_DIRECT; /* the primitives of the passes it does not run */
  pe_status *st = k->grad ? conv_grad_build(c, e, &k->x->shape, &k->w->shape, &k->out->shape,
                                            k->b != NULL, cand)
                          : conv_build(c, e, &k->x->shape, &k->w->shape, k->b != NULL, cand);
  if (!st && wino) st = conv_wino_build(c, e, &cw);
  conv_team_leave(team);
  e->choice = choice;
  return st;
}

static pe_status *conv_call_run(pe_kernel_ctx *c, pe_dnnl_entry *e, const conv_call *k) {
  int team = conv_team_enter(e->choice);
  pe_status *st = k->grad ? conv_grad_run(c, e, k) : conv_fwd_run(c, e, k);
  conv_team_leave(team);
  return st;
}

/* The configuration a choice holds for (conv_algo.h): direction, the
 * passes run, shapes, attributes, bias and the intra-op team. */
static void conv_algo_key(const pe_kernel_ctx *c, const conv_call *k, int64_t *key, int *nk) {
  int64_t p[2];
  pe_dnnl_key_val(key, nk, k->grad);
  pe_dnnl_key_val(key, nk, k->dx != NULL);
  pe_dnnl_key_val(key, nk, k->dw != NULL);
  pe_dnnl_key_val(key, nk, k->b != NULL);
  pe_dnnl_key_shape(key, nk, &k->x->shape);
  pe_dnnl_key_shape(key, nk, &k->w->shape);
  static const char *const pairs[] = {"strides", "paddings", "dilations"};
  for (int i = 0; i < 3; i++) {
    pe_dnnl_attr_pair_k(c->desc, pairs[i], i == 1 ? 0 : 1, p);
    pe_dnnl_key_val(key, nk, p[0]);
    pe_dnnl_key_val(key, nk, p[1]);
  }
  pe_dnnl_key_val(key, nk, pe_attr_i(c->def, c->desc, "groups"));
  pe_dnnl_key_val(key, nk, pe_kernel_threads(c));
  pe_dnnl_key_val(key, nk, pe_attr_i(c->def, c->desc, PE_LAYOUT_ATTR));
}

/* The oneDNN implementation a built candidate runs ("jit:avx2", ...). */
static const char *conv_impl(const pe_dnnl_entry *e, int prim) {
  const_dnnl_primitive_desc_t pd;
  const char *name = NULL;
  if (prim >= e->nprims || dnnl_primitive_get_primitive_desc(e->prims[prim].prim, &pd) ||
      dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name))
    return "";
  return name ? name : "";
}

/* True when a choice's primitives are the same implementations, on the
 * same layouts and team, as those of an earlier choice that was timed:
 * oneDNN's auto usually resolves to direct or Winograd. */
static bool conv_same_as_earlier(const pe_dnnl_entry *tmp, const double *t, int cand) {
  for (int i = cand < PE_CONV_CANDS ? 0 : PE_CONV_CANDS; i < cand; i++) {
    if (t[i] < 0) continue;
    bool same =
        tmp[i].nreorders == tmp[cand].nreorders && tmp[i].wino_passes == tmp[cand].wino_passes;
    for (int p = 0; p < 2 && same; p++)
      same = !strcmp(conv_impl(&tmp[i], p), conv_impl(&tmp[cand], p));
    if (same) return true;
  }
  return false;
}

/* Build cand into e; where cand has no primitive for this shape (Winograd
 * off AVX-512, ...), direct instead. */
static pe_status *conv_build_or_direct(pe_kernel_ctx *c, pe_dnnl_entry *e, const conv_call *k,
                                       int choice) {
  pe_dnnl_entry keep = *e; /* the key: a failed build clears the entry */
  pe_status *st = conv_call_build(c, e, k, choice);
  int direct = choice - pe_conv_choice_cand(choice) + PE_CONV_DIRECT; /* same team */
  if (!st || choice == direct) return st;
  pe_status_free(st);
  pe_dnnl_entry_clear(e);
  e->nkey = keep.nkey;
  memcpy(e->key, keep.key, sizeof e->key);
  e->last_use = keep.last_use;
  return conv_call_build(c, e, k, direct);
}

#define CONV_TIMED_ROUNDS 3

/* A time for the log: "-" for a choice that does not exist. */
static const char *conv_ms(double t, char *buf, size_t n) {
  if (t < 0) return "-";
  snprintf(buf, n, "%.3g", t * 1e3);
  return buf;
}

/* Build each candidate in an entry of its own, time it, keep the fastest
 * in e (the others are freed) and remember the choice process-wide. */
static pe_status *conv_choose_timed(pe_kernel_ctx *c, pe_dnnl_entry *e, const conv_call *k,
                                    const int64_t *key, int nk) {
  pe_dnnl_entry *tmp = calloc(PE_CONV_CHOICES, sizeof *tmp);
  if (!tmp) return pe_kernel_error(c, PE_ENOMEM, "out of memory timing the convolution algorithms");
  double t[PE_CONV_CHOICES];
  pe_status *st = NULL;
  /* One thread is a choice of its own only where the team has more. */
  int n = omp_get_max_threads() > 1 ? PE_CONV_CHOICES : PE_CONV_CANDS;
  for (int i = 0; i < PE_CONV_CHOICES; i++) t[i] = -1;
  /* Build each (an untimed run touches its buffers and code), then time
   * them in turns, CONV_TIMED_ROUNDS rounds, keeping each one's best: a
   * burst of load from other processes then slows one run of each, not
   * every run of one candidate. 0 marks a built choice not yet timed. */
  for (int i = 0; i < n && !st; i++) {
    pe_status *bs = conv_call_build(c, &tmp[i], k, i);
    if (bs && i == PE_CONV_DIRECT) st = bs; /* every shape has a direct convolution */
    if (bs || conv_same_as_earlier(tmp, t, i)) {
      if (bs && i != PE_CONV_DIRECT) pe_status_free(bs);
      pe_dnnl_entry_clear(&tmp[i]);
      continue;
    }
    t[i] = 0;
    st = conv_call_run(c, &tmp[i], k);
  }
  for (int r = 0; r < CONV_TIMED_ROUNDS && !st; r++)
    for (int i = 0; i < n && !st; i++) {
      if (t[i] < 0) continue;
      double t0 = pe_now_s();
      st = conv_call_run(c, &tmp[i], k);
      double dt = pe_now_s() - t0;
      if (r == 0 || dt < t[i]) t[i] = dt;
    }
  if (!st) {
    int best = pe_conv_algo_remember(key, nk, pe_conv_algo_choose(t, PE_CONV_CHOICES));
    char ms[PE_CONV_CHOICES][16];
    PE_LOGD(
        "%s: convolution %s%s (ms: direct %s, gemm %s, winograd %s, auto %s; "
        "1 thread %s, %s, %s, %s; %s)",
        c->def->type, pe_conv_cand_name(pe_conv_choice_cand(best)),
        pe_conv_choice_single(best) ? " on 1 thread" : "", conv_ms(t[0], ms[0], 16),
        conv_ms(t[1], ms[1], 16), conv_ms(t[2], ms[2], 16), conv_ms(t[3], ms[3], 16),
        conv_ms(t[4], ms[4], 16), conv_ms(t[5], ms[5], 16), conv_ms(t[6], ms[6], 16),
        conv_ms(t[7], ms[7], 16), t[best] >= 0 ? conv_impl(&tmp[best], 0) : "");
    if (t[best] < 0) {
      st = conv_build_or_direct(c, e, k, best); /* another instance's choice */
    } else {
      tmp[best].nkey = e->nkey;
      memcpy(tmp[best].key, e->key, sizeof e->key);
      tmp[best].last_use = e->last_use;
      *e = tmp[best];
      memset(&tmp[best], 0, sizeof tmp[best]);
    }
  }
  for (int i = 0; i < PE_CONV_CHOICES; i++) pe_dnnl_entry_clear(&tmp[i]);
  free(tmp);
  return st;
}

/* A fresh entry's primitives: the mode's candidate, the configuration's
 * remembered choice, or a timed choice (conv_algo.h). */
static pe_status *conv_prepare(pe_kernel_ctx *c, pe_dnnl_entry *e, const conv_call *k) {
  int64_t key[PE_DNNL_KEY_MAX];
  int nk = 0;
  conv_algo_key(c, k, key, &nk);
  int mode = pe_conv_algo_get_mode();
  conv_wino cw;
  if (mode == PE_CONV_ALGO_DEFAULT)
    mode = conv_wino_plans(c, k, &cw) ? PE_CONV_WINOGRAD : PE_CONV_DIRECT;
  int cand = mode >= 0 ? mode : pe_conv_algo_lookup(key, nk);
  if (cand >= 0) return conv_build_or_direct(c, e, k, cand);
  return conv_choose_timed(c, e, k, key, nk);
}

static pe_status *conv_kernel(pe_kernel_ctx *c) {
  conv_call k = {.x = pe_kin(c, CV_IN, 0),
                 .w = pe_kin(c, CV_FILTER, 0),
                 .b = pe_kin(c, CV_BIAS, 0),
                 .out = pe_kout(c, CV_OUT, 0)};
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(conv_key(c, k.x, k.w, &e, &fresh));
  if (fresh) PE_TRY(pe_dnnl_cache_built(c, e, conv_prepare(c, e, &k)));
  PE_TRY(conv_call_run(c, e, &k));
  if (conv_relu(c->def, c->desc)) pe_relu_f32(c, k.out->data, k.out->data, pe_tensor_numel(k.out));
  return NULL;
}

/* Grad entry: prims[0] backward data, prims[1] backward weights (both
 * hinted by the forward primitive desc, which is not kept); stages[GS_*]
 * their arguments. The weights pass reads Output@GRAD through the data
 * pass's stage when both chose the same layout. */
enum { GS_BD_DDST, GS_BD_WEI, GS_BD_DSRC, GS_BW_SRC, GS_BW_DDST, GS_BW_DWEI };
/* Entry buffers made first, so their indices are fixed: the masked
 * Output@GRAD (fused relu) and Bias@GRAD when the op has no output for it. */
enum { GB_DZ, GB_DBIAS };

static pe_status *conv_grad_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const pe_shape *x,
                                  const pe_shape *w, const pe_shape *out, bool bias, int cand) {
  conv_descs d;
  dnnl_primitive_desc_t hint, bd = NULL, bw = NULL;
  void *buf;
  bool relu = conv_relu(c->def, c->desc);
  PE_TRY(pe_dnnl_entry_buffer(c, e, relu ? (size_t)pe_shape_numel(out) * sizeof(float) : 0, &buf));
  PE_TRY(pe_dnnl_entry_buffer(c, e, bias ? (size_t)w->d[0] * sizeof(float) : 0, &buf));
  PE_TRY(conv_descs_make(c, x, w, &d));
  PE_TRY(conv_fwd_pd(c, &d, false, cand, &hint));
  const dnnl_memory_desc_t *src, *wei, *dst;
  cand_descs(&d, cand, &src, &wei, &dst);
  dnnl_convolution_desc_t cd;
  pe_dnnl_prim *p;
  pe_status *st =
      pe_dnnl_check(dnnl_dilated_convolution_backward_data_desc_init(
                        &cd, cand_alg[cand], src, wei, dst, d.strides, d.dilates, d.pad, d.pad),
                    c, "convolution backward data desc");
  if (!st) st = pe_dnnl_pd(c, &cd, hint, "convolution backward data primitive desc", &bd);
  if (!st) {
    static const int args[] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC};
    st = pe_dnnl_entry_add(c, e, bd, args, 3, "convolution backward data", &p);
  }
  if (!st)
    st = pe_conv_weights_pass_pd(c, cand_alg[cand], src, wei, bias ? &d.bia : NULL, dst, d.strides,
                                 d.dilates, d.pad, hint,
                                 "convolution backward weights primitive desc", &bw);
  if (!st) {
    static const int args[] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS,
                               DNNL_ARG_DIFF_BIAS};
    st = pe_dnnl_entry_add(c, e, bw, args, bias ? 4 : 3, "convolution backward weights", &p);
  }
  pe_dnnl_stage *s = e->stages;
  if (!st)
    st = pe_dnnl_stage_make(c, e, bd, DNNL_ARG_DIFF_DST, &d.dst_t, false, NULL, &s[GS_BD_DDST]);
  if (!st) st = pe_dnnl_stage_make(c, e, bd, DNNL_ARG_WEIGHTS, &d.wei, false, NULL, &s[GS_BD_WEI]);
  if (!st)
    st = pe_dnnl_stage_make(c, e, bd, DNNL_ARG_DIFF_SRC, &d.dsrc_t, true, NULL, &s[GS_BD_DSRC]);
  if (!st) st = pe_dnnl_stage_make(c, e, bw, DNNL_ARG_SRC, &d.src_t, false, NULL, &s[GS_BW_SRC]);
  if (!st)
    st = pe_dnnl_stage_make(c, e, bw, DNNL_ARG_DIFF_DST, &d.dst_t, false, &s[GS_BD_DDST],
                            &s[GS_BW_DDST]);
  if (!st)
    st = pe_dnnl_stage_make(c, e, bw, DNNL_ARG_DIFF_WEIGHTS, &d.wei, true, NULL, &s[GS_BW_DWEI]);
  if (bd) dnnl_primitive_desc_destroy(bd);
  if (bw) dnnl_primitive_desc_destroy(bw);
  dnnl_primitive_desc_destroy(hint);
  return st;
}

/* db[o] = sum over n, h, w of dz[n, o, h, w], in double; dz is stored as
 * Output@GRAD is (plain or blocked). */
static void bias_grad(pe_kernel_ctx *c, float *db, const float *dz, const pe_shape *s) {
  int64_t nb = s->d[0], o = s->d[1], hw = s->d[2] * s->d[3];
  pe_act_plane pl = pe_act_plane_of(s, pe_dnnl_act_blocked(c, false, CVG_DOUT));
#pragma omp parallel for if (pe_par_split(nb * o * hw)) num_threads(pe_kernel_threads(c))
  for (int64_t k = 0; k < o; k++) {
    double acc = 0;
    for (int64_t i = 0; i < nb; i++) {
      const float *p = dz + pe_act_plane_base(&pl, i, k);
      for (int64_t j = 0; j < hw; j++) acc += p[j * pl.block];
    }
    db[k] = (float)acc;
  }
}

/* The data and weights passes on k->g (Bias@GRAD, when the weights pass
 * runs, from oneDNN's diff_bias, or beside pe's Winograd from the
 * per-channel sum). */
static pe_status *conv_grad_run(pe_kernel_ctx *c, pe_dnnl_entry *e, const conv_call *k) {
  const pe_dnnl_stage *s = e->stages;
  void *g = k->g, *x = k->x->data, *w = k->w->data;
  if (k->dx && (e->wino_passes & WINO_DATA)) {
    conv_wino_data(e, k, g, NULL, k->dx->data);
  } else if (k->dx) {
    void *dx = k->dx->data;
    PE_TRY(pe_dnnl_stage_in(c, e, &s[GS_BD_DDST], g));
    PE_TRY(pe_dnnl_stage_in(c, e, &s[GS_BD_WEI], w));
    void *h[] = {pe_dnnl_stage_handle(e, &s[GS_BD_DDST], g),
                 pe_dnnl_stage_handle(e, &s[GS_BD_WEI], w),
                 pe_dnnl_stage_handle(e, &s[GS_BD_DSRC], dx)};
    PE_TRY(pe_dnnl_run(c, &e->prims[0], h, "conv2d_grad data"));
    PE_TRY(pe_dnnl_stage_out(c, e, &s[GS_BD_DSRC], dx));
  }
  if (k->dw && (e->wino_passes & WINO_WEIGHTS)) {
    conv_wino_weights(e, k);
    if (k->db) bias_grad(c, pe_f32(k->db), g, &k->out->shape);
  } else if (k->dw) {
    void *dw = k->dw->data;
    PE_TRY(pe_dnnl_stage_in(c, e, &s[GS_BW_SRC], x));
    if (!k->dx || e->wino_passes || !pe_dnnl_stage_same(&s[GS_BW_DDST], &s[GS_BD_DDST]))
      PE_TRY(pe_dnnl_stage_in(c, e, &s[GS_BW_DDST], g));
    void *h[] = {
        pe_dnnl_stage_handle(e, &s[GS_BW_SRC], x), pe_dnnl_stage_handle(e, &s[GS_BW_DDST], g),
        pe_dnnl_stage_handle(e, &s[GS_BW_DWEI], dw), k->db ? k->db->data : e->bufs[GB_DBIAS]};
    PE_TRY(pe_dnnl_run(c, &e->prims[1], h, "conv2d_grad weights"));
    PE_TRY(pe_dnnl_stage_out(c, e, &s[GS_BW_DWEI], dw));
  }
  return NULL;
}

static pe_status *conv_grad_kernel(pe_kernel_ctx *c) {
  conv_call k = {.grad = true,
                 .x = pe_kin(c, CVG_IN, 0),
                 .w = pe_kin(c, CVG_FILTER, 0),
                 .b = pe_kin(c, CVG_BIAS, 0),
                 .out = pe_kin(c, CVG_DOUT, 0),
                 .dx = pe_kout(c, CVG_DIN, 0),
                 .dw = pe_kout(c, CVG_DFILTER, 0),
                 .db = pe_kout(c, CVG_DBIAS, 0)};
  if (!k.out) {
    pe_dnnl_zero_outputs(c);
    return NULL;
  }
  if (!k.dx && !k.dw && !k.db) return NULL;
  k.g = k.out->data; /* the convolution's output gradient (timing reads it unmasked) */
  pe_dnnl_entry *e;
  bool fresh;
  PE_TRY(conv_key(c, k.x, k.w, &e, &fresh));
  if (fresh) PE_TRY(pe_dnnl_cache_built(c, e, conv_prepare(c, e, &k)));
  if (conv_relu(c->def, c->desc)) {
    const pe_tensor *out = pe_kin(c, CVG_OUT, 0);
    if (!out || pe_tensor_numel(out) != pe_tensor_numel(k.out))
      return pe_kernel_error(c, PE_ESHAPE, "fused relu: Output must have Output@GRAD's shape");
    /* The mask is elementwise: both must be stored alike (pass_layout.c
     * ties them). */
    if (pe_dnnl_act_blocked(c, false, CVG_OUT) != pe_dnnl_act_blocked(c, false, CVG_DOUT))
      return pe_kernel_error(c, PE_EINVAL,
                             "fused relu: Output and Output@GRAD must both be blocked or both "
                             "plain (attribute %s)",
                             PE_LAYOUT_ATTR);
    k.g = e->bufs[GB_DZ];
    pe_relu_grad_f32(c, k.g, out->data, k.out->data, pe_tensor_numel(k.out));
  }
  if (k.db && !k.dw) bias_grad(c, pe_f32(k.db), k.g, &k.out->shape);
  return conv_call_run(c, e, &k);
}

static const pe_attr_def conv_attrs[] = {
    {"strides", PE_ATTR_INTS, false, 0, NULL},         /* [1,1] */
    {"paddings", PE_ATTR_INTS, false, 0, NULL},        /* [0,0] */
    {"dilations", PE_ATTR_INTS, false, 0, NULL},       /* [1,1] */
    {"groups", PE_ATTR_INT, false, 1, NULL},           /* */
    {"fuse_activation", PE_ATTR_STRING, false, 0, ""}, /* "" | "relu" */
    {PE_LAYOUT_ATTR, PE_ATTR_INT, false, 0, NULL},     /* dnnl_act_layout.h */
    {NULL},
};
static const pe_slot_def conv_in[] = {
    {"Input", 1, 1, 0}, {"Filter", 1, 1, 0}, {"Bias", 0, 1, 0}, {NULL}};
static const pe_slot_def conv_out[] = {{"Output", 1, 1, 0}, {NULL}};
static const pe_slot_def conv_grad_in[] = {{"Input", 1, 1, 0},       {"Filter", 1, 1, 0},
                                           {"Bias", 0, 1, 0},        {"Output", 0, 1, 0},
                                           {"Output@GRAD", 0, 1, 0}, {NULL}};
static const pe_slot_def conv_grad_out[] = {
    {"Input@GRAD", 0, 1, 0}, {"Filter@GRAD", 0, 1, 0}, {"Bias@GRAD", 0, 1, 0}, {NULL}};

const pe_op_def pe_ops_conv[] = {
    {.type = "conv2d",
     .inputs = conv_in,
     .outputs = conv_out,
     .attrs = conv_attrs,
     .infer = conv_infer,
     .kernel_cpu = conv_kernel,
     .state_free = pe_dnnl_cache_free,
     .grad = pe_grad_default},
    {.type = "conv2d_grad",
     .inputs = conv_grad_in,
     .outputs = conv_grad_out,
     .attrs = conv_attrs,
     .infer = conv_grad_infer,
     .kernel_cpu = conv_grad_kernel,
     .state_free = pe_dnnl_cache_free},
    {0},
};
