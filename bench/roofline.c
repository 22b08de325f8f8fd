/* The GEMM/convolution roofline of a training step (contract in roofline.h). */
#include "roofline.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/pass.h"
#include "core/clock.h"
#include "ops/cpu/conv_algo.h"
#include "ops/cpu/conv_weights_pass.h"
#include "ops/cpu/dnnl_util.h"
#include "ops/cpu/matmul_weights.h"
#include "ops/device_ctx.h"
#include "ops/matmul_view.h"
#include "ops/registry.h"

/* --- collection --------------------------------------------------------------- */

typedef struct collect_ctx {
  const pe_program *p;
  const pe_block *b;
  const pe_op_desc *op;
  const pe_op_def *def;
  int op_index;
  int64_t batch;
  pe_roof_list *out;
} collect_ctx;

/* The shape of the op's first argument of input slot `slot`, the batch set:
 * an error names the op, the variable and the shape when a dim stays unknown. */
static pe_status *in_shape(const collect_ctx *c, const char *slot, pe_shape *s) {
  const char *name = pe_op_input_arg(c->op, slot);
  const pe_var_desc *v = name ? pe_block_find_var(c->p, c->b, name) : NULL;
  if (!v)
    return pe_error(PE_ENOTFOUND, "roofline: op #%d (%s): input %s%s%s has no variable",
                    c->op_index, c->op->type, slot, name ? " " : "", name ? name : "");
  *s = v->shape;
  if (s->ndim > 0 && s->d[0] < 0) s->d[0] = c->batch;
  for (int i = 0; i < s->ndim; i++)
    if (s->d[i] < 0) {
      char sb[PE_SHAPE_STRLEN];
      return pe_error(PE_ESHAPE,
                      "roofline: op #%d (%s): input %s '%s' shape %s has an unknown dim %d "
                      "besides the batch",
                      c->op_index, c->op->type, slot, name, pe_shape_str(&v->shape, sb, sizeof sb),
                      i);
    }
  return NULL;
}

static bool has_out(const collect_ctx *c, const char *slot) {
  return pe_op_output_arg(c->op, slot) != NULL;
}

static pe_status *add(const collect_ctx *c, const pe_roof_geom *g) {
  pe_roof_list *l = c->out;
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 32;
    pe_roof_item *it = realloc(l->items, (size_t)cap * sizeof *it);
    if (!it) return pe_error(PE_ENOMEM, "roofline: %d items", cap);
    l->items = it;
    l->cap = cap;
  }
  pe_roof_item *it = &l->items[l->n++];
  memset(it, 0, sizeof *it);
  it->g = *g;
  snprintf(it->op, sizeof it->op, "%s", c->op->type);
  it->op_index = c->op_index;
  return NULL;
}

static pe_status *add_gemm_w(const collect_ctx *c, int64_t batch, int64_t m, int64_t k, int64_t n,
                             bool ta, bool tb, bool gemm_impl) {
  /* All int64_t: no padding, the rest zeroed. */
  pe_roof_geom g = {.kind = PE_ROOF_GEMM,
                    .batch = batch,
                    .m = m,
                    .k = k,
                    .n = n,
                    .ta = ta,
                    .tb = tb,
                    .gemm_impl = gemm_impl};
  return add(c, &g);
}

static pe_status *add_gemm(const collect_ctx *c, int64_t batch, int64_t m, int64_t k, int64_t n,
                           bool ta, bool tb) {
  return add_gemm_w(c, batch, m, k, n, ta, tb, false);
}

/* matmul (Paddle's mul): X viewed [M,K] at x_num_col_dims, Y [K,N]. */
static pe_status *collect_mul(const collect_ctx *c, bool grad) {
  pe_shape x = {0}, y = {0};
  PE_TRY(in_shape(c, "X", &x));
  PE_TRY(in_shape(c, "Y", &y));
  int xnc = (int)pe_attr_i(c->def, c->op, "x_num_col_dims");
  int ync = (int)pe_attr_i(c->def, c->op, "y_num_col_dims");
  int64_t m = pe_shape_prod(&x, 0, xnc), k = pe_shape_prod(&x, xnc, x.ndim);
  int64_t n = pe_shape_prod(&y, ync, y.ndim);
  bool large = pe_matmul_weights_large(k, n);
  if (!grad) return add_gemm_w(c, 1, m, k, n, false, false, large);
  if (has_out(c, "X" PE_GRAD_SUFFIX)) PE_TRY(add_gemm(c, 1, m, n, k, false, true));
  if (has_out(c, "Y" PE_GRAD_SUFFIX)) PE_TRY(add_gemm_w(c, 1, k, m, n, true, false, large));
  return NULL;
}

/* matmul_v2: one oneDNN matmul over the broadcast batch per product
 * (matmul_v2.c). */
static pe_status *collect_mv(const collect_ctx *c, bool grad) {
  pe_shape x = {0}, y = {0};
  PE_TRY(in_shape(c, "X", &x));
  PE_TRY(in_shape(c, "Y", &y));
  pe_mv_view v;
  const char *why = pe_mv_plan(&x, &y, pe_attr_b(c->def, c->op, "trans_x"),
                               pe_attr_b(c->def, c->op, "trans_y"), &v);
  if (why)
    return pe_error(PE_ESHAPE, "roofline: op #%d (%s): X and Y: %s", c->op_index, c->op->type, why);
  int64_t nb = 1;
  for (int i = 0; i < v.nb; i++) nb *= v.ob[i];
  if (!grad) return add_gemm(c, nb, v.m, v.k, v.n, v.tx, v.ty);
  if (has_out(c, "X" PE_GRAD_SUFFIX))
    PE_TRY(v.tx ? add_gemm(c, nb, v.k, v.n, v.m, v.ty, true)
                : add_gemm(c, nb, v.m, v.n, v.k, false, !v.ty));
  if (has_out(c, "Y" PE_GRAD_SUFFIX))
    PE_TRY(v.ty ? add_gemm(c, nb, v.n, v.m, v.k, true, v.tx)
                : add_gemm(c, nb, v.k, v.m, v.n, !v.tx, false));
  return NULL;
}

/* scaled_dot_product_attention: Q [B,H,Tq,D], K [B,H,Tk,D], V [B,H,Tk,Dv]
 * (attention.c's products). */
static pe_status *collect_attention(const collect_ctx *c, bool grad) {
  pe_shape q = {0}, k = {0}, v = {0};
  PE_TRY(in_shape(c, "Q", &q));
  PE_TRY(in_shape(c, "K", &k));
  PE_TRY(in_shape(c, "V", &v));
  if (q.ndim != 4 || k.ndim != 4 || v.ndim != 4)
    return pe_error(PE_ESHAPE, "roofline: op #%d (%s): Q, K and V must be 4-D", c->op_index,
                    c->op->type);
  int64_t bh = q.d[0] * q.d[1], tq = q.d[2], tk = k.d[2], d = q.d[3], dv = v.d[3];
  if (!grad) {
    PE_TRY(add_gemm(c, bh, tq, d, tk, false, true));
    return add_gemm(c, bh, tq, tk, dv, false, false);
  }
  if (has_out(c, "V" PE_GRAD_SUFFIX)) PE_TRY(add_gemm(c, bh, tk, tq, dv, true, false));
  PE_TRY(add_gemm(c, bh, tq, dv, tk, false, true)); /* dP, which dQ and dK need */
  if (has_out(c, "Q" PE_GRAD_SUFFIX)) PE_TRY(add_gemm(c, bh, tq, tk, d, false, false));
  if (has_out(c, "K" PE_GRAD_SUFFIX)) PE_TRY(add_gemm(c, bh, tk, tq, d, true, false));
  return NULL;
}

static pe_status *collect_conv(const collect_ctx *c, bool grad) {
  pe_shape x = {0}, w = {0};
  PE_TRY(in_shape(c, "Input", &x));
  PE_TRY(in_shape(c, "Filter", &w));
  if (x.ndim != 4 || w.ndim != 4)
    return pe_error(PE_ESHAPE, "roofline: op #%d (%s): Input and Filter must be 4-D", c->op_index,
                    c->op->type);
  pe_roof_geom g;
  memset(&g, 0, sizeof g);
  memcpy(g.x, x.d, sizeof g.x);
  memcpy(g.w, w.d, sizeof g.w);
  pe_dnnl_attr_pair_k(c->op, "strides", 1, g.strides);
  pe_dnnl_attr_pair_k(c->op, "paddings", 0, g.pads);
  pe_dnnl_attr_pair_k(c->op, "dilations", 1, g.dilations);
  g.groups = pe_attr_i(c->def, c->op, "groups");
  if (!grad) {
    g.kind = PE_ROOF_CONV_FWD;
    g.bias = pe_op_input_arg(c->op, "Bias") != NULL;
    return add(c, &g);
  }
  if (has_out(c, "Input" PE_GRAD_SUFFIX)) {
    g.kind = PE_ROOF_CONV_BWD_DATA;
    PE_TRY(add(c, &g));
  }
  if (has_out(c, "Filter" PE_GRAD_SUFFIX)) {
    g.kind = PE_ROOF_CONV_BWD_WEI;
    g.bias = has_out(c, "Bias" PE_GRAD_SUFFIX);
    PE_TRY(add(c, &g));
  }
  return NULL;
}

typedef struct collect_row {
  const char *type;
  pe_status *(*fn)(const collect_ctx *c, bool grad);
} collect_row;

static const collect_row collect_rows[] = {
    {"matmul", collect_mul},
    {"matmul_v2", collect_mv},
    {"scaled_dot_product_attention", collect_attention},
    {"conv2d", collect_conv},
};

pe_status *pe_roof_collect(const pe_program *p, int64_t batch, pe_roof_list *out) {
  memset(out, 0, sizeof *out);
  if (batch < 1) return pe_error(PE_EINVAL, "roofline: batch %lld must be >= 1", (long long)batch);
  const pe_block *b = p->blocks[p->main_block];
  collect_ctx c = {.p = p, .b = b, .batch = batch, .out = out};
  for (int i = 0; i < b->n_ops; i++) {
    c.op = b->ops[i];
    c.op_index = i;
    size_t tl = strlen(c.op->type);
    bool grad = tl > 5 && !strcmp(c.op->type + tl - 5, "_grad");
    for (size_t r = 0; r < sizeof collect_rows / sizeof collect_rows[0]; r++) {
      const char *t = collect_rows[r].type;
      if (strlen(t) != (grad ? tl - 5 : tl) || strncmp(t, c.op->type, strlen(t))) continue;
      c.def = pe_op_lookup(c.op->type);
      pe_status *st =
          c.def ? collect_rows[r].fn(&c, grad)
                : pe_error(PE_ENOTFOUND, "roofline: op #%d (%s) is not registered", i, c.op->type);
      if (st) {
        pe_roof_list_free(out);
        return st;
      }
    }
  }
  return NULL;
}

void pe_roof_list_free(pe_roof_list *l) {
  free(l->items);
  memset(l, 0, sizeof *l);
}

/* Output size along one axis (conv.c's rule: floor division). */
static int64_t conv_out(const pe_roof_geom *g, int axis) {
  int64_t reach = g->dilations[axis] * (g->w[2 + axis] - 1) + 1;
  return (g->x[2 + axis] + 2 * g->pads[axis] - reach) / g->strides[axis] + 1;
}

double pe_roof_flop(const pe_roof_item *it) {
  const pe_roof_geom *g = &it->g;
  if (g->kind == PE_ROOF_GEMM) return 2.0 * (double)g->batch * g->m * g->k * g->n;
  /* Every direction multiplies each output point by a (C/g)·KH·KW window. */
  return 2.0 * (double)g->x[0] * g->w[0] * conv_out(g, 0) * conv_out(g, 1) * g->w[1] * g->w[2] *
         g->w[3];
}

const char *pe_roof_kind_name(int64_t kind) {
  static const char *const names[] = {"gemm", "conv_fwd", "conv_bwd_data", "conv_bwd_weights"};
  return kind >= 0 && kind < 4 ? names[kind] : "?";
}

/* --- primitives ------------------------------------------------------------------ */

/* [batch, r, cols] matrices, each stored transposed when t (as attention.c
 * and matmul_v2.c describe them); 2-D for one matrix (as matmul.c). */
static dnnl_status_t gemm_md(dnnl_memory_desc_t *md, int64_t batch, int64_t r, int64_t cols,
                             bool t) {
  if (batch == 1) return pe_dnnl_md_matrix(md, r, cols, t);
  dnnl_dims_t d = {batch, r, cols}, st = {r * cols, t ? 1 : cols, t ? r : 1};
  return dnnl_memory_desc_init_by_strides(md, 3, d, dnnl_f32, st);
}

static pe_status *gemm_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const pe_roof_geom *g) {
  dnnl_memory_desc_t a, b, o;
  dnnl_matmul_desc_t md;
  dnnl_status_t s = gemm_md(&a, g->batch, g->m, g->k, g->ta);
  if (s == dnnl_success) s = gemm_md(&b, g->batch, g->k, g->n, g->tb);
  if (s == dnnl_success) s = gemm_md(&o, g->batch, g->m, g->n, false);
  if (s == dnnl_success) s = dnnl_matmul_desc_init(&md, &a, &b, NULL, &o);
  PE_TRY(pe_dnnl_check(s, c, "roofline matmul desc"));
  dnnl_primitive_desc_t pd;
  if (g->gemm_impl)
    PE_TRY(pe_dnnl_pd_impl(c, &md, PE_MATMUL_LARGE_WEIGHTS_IMPL, "roofline matmul primitive desc",
                           &pd));
  else
    PE_TRY(pe_dnnl_pd(c, &md, NULL, "roofline matmul primitive desc", &pd));
  static const int args[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
  pe_dnnl_prim *p;
  pe_status *st = pe_dnnl_entry_add(c, e, pd, args, 3, "roofline matmul", &p);
  dnnl_primitive_desc_destroy(pd);
  return st;
}

static const dnnl_alg_kind_t cand_alg[PE_CONV_CANDS] = {
    [PE_CONV_DIRECT] = dnnl_convolution_direct,
    [PE_CONV_GEMM] = dnnl_convolution_direct,
    [PE_CONV_WINOGRAD] = dnnl_convolution_winograd,
    [PE_CONV_AUTO] = dnnl_convolution_auto,
};

/* The item's convolution pass with candidate cand: gemm on the plain
 * layouts, the others with format any (conv.c's descs). */
static pe_status *conv_build(pe_kernel_ctx *c, pe_dnnl_entry *e, const pe_roof_geom *g, int cand) {
  int64_t dst[4] = {g->x[0], g->w[0], conv_out(g, 0), conv_out(g, 1)};
  int64_t g5[5] = {g->groups, g->w[0] / g->groups, g->w[1], g->w[2], g->w[3]};
  const int64_t *wd = g->groups == 1 ? g->w : g5;
  int wn = g->groups == 1 ? 4 : 5;
  dnnl_status_t (*md)(dnnl_memory_desc_t *, int, const int64_t *) =
      cand == PE_CONV_GEMM ? pe_dnnl_md_plain : pe_dnnl_md_any;
  dnnl_memory_desc_t src, wei, dstd, bia;
  dnnl_dims_t strides, dil, pad;
  for (int i = 0; i < 2; i++) {
    strides[i] = g->strides[i];
    dil[i] = g->dilations[i] - 1;
    pad[i] = g->pads[i];
  }
  dnnl_status_t s = md(&src, 4, g->x);
  if (s == dnnl_success) s = md(&wei, wn, wd);
  if (s == dnnl_success) s = md(&dstd, 4, dst);
  if (s == dnnl_success) s = pe_dnnl_md_plain(&bia, 1, g->w);
  PE_TRY(pe_dnnl_check(s, c, "roofline convolution memory desc"));
  const dnnl_memory_desc_t *b = g->bias ? &bia : NULL;
  dnnl_alg_kind_t alg = cand_alg[cand];
  dnnl_convolution_desc_t fd, cd;
  dnnl_primitive_desc_t hint, pd = NULL;
  PE_TRY(pe_dnnl_check(dnnl_dilated_convolution_forward_desc_init(
                           &fd, dnnl_forward_training, alg, &src, &wei,
                           g->kind == PE_ROOF_CONV_FWD ? b : NULL, &dstd, strides, dil, pad, pad),
                       c, "roofline convolution forward desc"));
  PE_TRY(pe_dnnl_pd(c, &fd, NULL, "roofline convolution forward primitive desc", &hint));
  pe_status *st = NULL;
  const int *args;
  int nargs = 3;
  static const int fwd_args[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
  static const int bd_args[] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC};
  static const int bw_args[] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS,
                                DNNL_ARG_DIFF_BIAS};
  if (g->kind == PE_ROOF_CONV_FWD) {
    pd = hint;
    hint = NULL;
    args = fwd_args;
    nargs = g->bias ? 4 : 3;
  } else if (g->kind == PE_ROOF_CONV_BWD_DATA) {
    st = pe_dnnl_check(dnnl_dilated_convolution_backward_data_desc_init(&cd, alg, &src, &wei, &dstd,
                                                                        strides, dil, pad, pad),
                       c, "roofline convolution backward data desc");
    if (!st) st = pe_dnnl_pd(c, &cd, hint, "roofline convolution backward data", &pd);
    args = bd_args;
  } else {
    st = pe_conv_weights_pass_pd(c, alg, &src, &wei, b, &dstd, strides, dil, pad, hint,
                                 "roofline convolution backward weights", &pd);
    args = bw_args;
    nargs = g->bias ? 4 : 3;
  }
  pe_dnnl_prim *p;
  if (!st) st = pe_dnnl_entry_add(c, e, pd, args, nargs, "roofline convolution", &p);
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (hint) dnnl_primitive_desc_destroy(hint);
  return st;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Build one candidate, give each argument a buffer of the size of the
 * layout the primitive chose, run it warmup times, then time repeats runs:
 * the median into *ms. */
static pe_status *time_one(pe_kernel_ctx *c, const pe_roof_geom *g, int cand, int warmup,
                           int repeats, double *ms) {
  pe_dnnl_entry e;
  memset(&e, 0, sizeof e);
  pe_status *st = g->kind == PE_ROOF_GEMM ? gemm_build(c, &e, g) : conv_build(c, &e, g, cand);
  pe_dnnl_prim *p = &e.prims[0];
  void *h[PE_DNNL_MAX_ARGS] = {0};
  for (int a = 0; !st && a < p->nuser; a++) {
    const dnnl_memory_desc_t *md;
    st = pe_dnnl_check(dnnl_memory_get_memory_desc(p->args[a].memory, &md), c, "roofline arg");
    size_t bytes = st ? 0 : dnnl_memory_desc_get_size(md);
    if (!st) st = pe_dnnl_entry_buffer(c, &e, bytes, &h[a]);
    /* Small finite values: no denormals, no overflow over the runs. */
    for (size_t i = 0; !st && i < bytes / sizeof(float); i++) ((float *)h[a])[i] = 0.01f;
  }
  for (int r = 0; !st && r < warmup; r++) st = pe_dnnl_run(c, p, h, "roofline warm-up");
  double *t = st ? NULL : malloc((size_t)repeats * sizeof *t);
  if (!st && !t) st = pe_error(PE_ENOMEM, "roofline: %d times", repeats);
  for (int r = 0; !st && r < repeats; r++) {
    double t0 = pe_now_s();
    st = pe_dnnl_run(c, p, h, "roofline run");
    t[r] = (pe_now_s() - t0) * 1e3;
  }
  if (!st) {
    qsort(t, (size_t)repeats, sizeof *t, cmp_double);
    *ms = t[repeats / 2];
  }
  free(t);
  pe_dnnl_entry_clear(&e);
  return st;
}

/* One choice (conv_algo.h): its candidate, on one thread for a one-thread
 * choice (oneDNN sizes a primitive's team when it is created, so the
 * calling thread's team is 1 for the build and the runs; conv.c does the
 * same). */
static pe_status *time_choice(pe_kernel_ctx *c, const pe_roof_geom *g, int choice, int warmup,
                              int repeats, double *ms) {
  int team = omp_get_max_threads();
  bool single = pe_conv_choice_single(choice) && team > 1;
  if (single) omp_set_num_threads(1);
  pe_status *st = time_one(c, g, pe_conv_choice_cand(choice), warmup, repeats, ms);
  if (single) omp_set_num_threads(team);
  return st;
}

/* The item's time with the op's algorithm: the mode's choice (Winograd
 * without a primitive for the shape falls back to direct, as conv.c does),
 * or with time the fastest choice, the one-thread ones included where the
 * team has more threads. */
static pe_status *time_item(pe_kernel_ctx *c, const pe_roof_geom *g, int warmup, int repeats,
                            double *ms) {
  int mode = pe_conv_algo_get_mode();
  if (g->kind == PE_ROOF_GEMM) return time_one(c, g, 0, warmup, repeats, ms);
  /* The default's Winograd is pe's own, not oneDNN's: the roofline times
   * oneDNN's direct kernels there. */
  if (mode == PE_CONV_ALGO_DEFAULT) mode = PE_CONV_DIRECT;
  if (mode != PE_CONV_ALGO_TIME) {
    pe_status *st = time_choice(c, g, mode, warmup, repeats, ms);
    int direct = mode - pe_conv_choice_cand(mode) + PE_CONV_DIRECT; /* same team */
    if (!st || mode == direct) return st;
    pe_status_free(st);
    return time_choice(c, g, direct, warmup, repeats, ms);
  }
  /* One run of each choice picks the fastest, which is then timed in full. */
  int n = omp_get_max_threads() > 1 ? PE_CONV_CHOICES : PE_CONV_CANDS, best = PE_CONV_DIRECT;
  double best_ms = INFINITY;
  for (int choice = 0; choice < n; choice++) {
    double t;
    pe_status *st = time_choice(c, g, choice, 1, 1, &t);
    if (st && choice == PE_CONV_DIRECT) return st; /* every shape has a direct convolution */
    if (st) {
      pe_status_free(st);
    } else if (t < best_ms) {
      best_ms = t;
      best = choice;
    }
  }
  return time_choice(c, g, best, warmup, repeats, ms);
}

pe_status *pe_roof_time(pe_roof_list *l, int threads, int warmup, int repeats,
                        pe_roof_totals *out) {
  memset(out, 0, sizeof *out);
  if (threads < 1 || repeats < 1 || warmup < 0)
    return pe_error(PE_EINVAL, "roofline: threads %d and repeats %d must be >= 1, warmup %d >= 0",
                    threads, repeats, warmup);
  double t0 = pe_now_s();
  pe_device_ctx dev;
  PE_TRY(pe_device_ctx_init(&dev, (pe_place){PE_PLACE_CPU, 0}, threads));
  pe_device_ctx_bind(&dev);
  pe_status *st = NULL;
  for (int i = 0; i < l->n && !st; i++) {
    pe_roof_item *it = &l->items[i];
    int same = 0;
    while (same < i && memcmp(&l->items[same].g, &it->g, sizeof it->g)) same++;
    if (same < i) {
      it->ms = l->items[same].ms;
    } else {
      pe_op_desc desc = {.type = it->op};
      pe_kernel_ctx c = {
          .def = pe_op_lookup(it->op), .desc = &desc, .op_index = it->op_index, .dev = &dev};
      st = time_item(&c, &it->g, warmup, repeats, &it->ms);
      out->distinct++;
    }
    bool gemm = it->g.kind == PE_ROOF_GEMM;
    *(gemm ? &out->gemm_ms : &out->conv_ms) += it->ms;
    *(gemm ? &out->gemm_gflop : &out->conv_gflop) += pe_roof_flop(it) * 1e-9;
    (*(gemm ? &out->gemms : &out->convs))++;
  }
  pe_device_ctx_destroy(&dev);
  out->seconds = pe_now_s() - t0;
  return st;
}

static double gflops(double gflop, double ms) {
  return ms > 0 ? gflop / (ms * 1e-3) : 0;
}

void pe_roof_json(FILE *f, const pe_roof_totals *t, double step_ms, int threads, int64_t batch) {
  double ms = t->gemm_ms + t->conv_ms;
  fprintf(f, ",\"step_ms\":%.3f,\"roofline_gemm_conv_ms\":%.3f,\"roofline_fraction\":%.3f", step_ms,
          ms, step_ms > 0 ? ms / step_ms : 0);
  fprintf(f,
          ",\"roofline\":{\"threads\":%d,\"batch\":%lld,\"gemm_ms\":%.3f,\"conv_ms\":%.3f,"
          "\"gemms\":%d,\"convs\":%d,\"distinct\":%d,\"gemm_gflop\":%.4f,\"conv_gflop\":%.4f,"
          "\"gemm_gflops\":%.1f,\"conv_gflops\":%.1f,\"gflops\":%.1f,\"measure_seconds\":%.2f",
          threads, (long long)batch, t->gemm_ms, t->conv_ms, t->gemms, t->convs, t->distinct,
          t->gemm_gflop, t->conv_gflop, gflops(t->gemm_gflop, t->gemm_ms),
          gflops(t->conv_gflop, t->conv_ms), gflops(t->gemm_gflop + t->conv_gflop, ms), t->seconds);
  const pe_fma_peak *pk = &t->peak;
  if (pk->gflops > 0) {
    double flop = t->gemm_gflop + t->conv_gflop;
    fprintf(f, ",\"peak_isa\":\"%s\",\"peak_gflops\":%.1f,\"kernel_peak_fraction\":%.3f", pk->isa,
            pk->gflops, gflops(flop, ms) / pk->gflops);
    fprintf(f, ",\"step_peak_fraction\":%.3f", gflops(flop, step_ms) / pk->gflops);
  }
  fputc('}', f);
}

pe_status *pe_roof_collect_model(const uint8_t *bytes, size_t len, const char *keep, bool fuse_ops,
                                 int64_t batch, pe_roof_list *out) {
  memset(out, 0, sizeof *out);
  pe_program *p;
  PE_TRY(pe_program_decode(bytes, len, &p));
  const char *k[1] = {keep};
  pe_pass_opts po = {.n_keep = keep && *keep ? 1 : 0, .keep = k, .fuse_conv_act = fuse_ops};
  pe_status *st = pe_program_compile_opts(p, false, &po);
  if (!st) st = pe_roof_collect(p, batch, out);
  pe_program_free(p);
  return st;
}
