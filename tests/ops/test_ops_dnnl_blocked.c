/* conv2d, pool2d and their gradients on arguments stored in oneDNN's
 * blocked layout (ops/cpu/dnnl_act_layout.h: the "layout_blocked"
 * attribute), against the same ops on plain tensors: every combination of
 * blocked and plain arguments, converted here with loops written out. The
 * pools must agree bit for bit (max is exact), NaN windows and ties
 * included; the convolutions run the same primitive (direct) or a plain
 * one behind reorders (gemm) and agree to 1e-5. The tied ops (batch_norm,
 * elementwise_add, sum and their gradients) agree with the plain ones when
 * all their activations are blocked (batch norm's statistics to 1e-5, the
 * elementwise results bit for bit) and refuse every mix of layouts. The channel block is the
 * process's (16 on AVX-512, 8 below): run under ONEDNN_MAX_CPU_ISA=AVX2
 * and =SSE41 too. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "ops/cpu/conv_algo.h"
#include "ops/cpu/dnnl_act_layout.h"
#include "test_assert.h"

/* plain NCHW <-> nChw<B>c, C a multiple of B. */
static void relayout(const float *src, float *dst, pe_shape s, bool to_blocked) {
  int64_t B = pe_dnnl_act_block(), C = s.d[1], hw = s.d[2] * s.d[3];
  ck_assert_int_eq(C % B, 0);
  for (int64_t n = 0; n < s.d[0]; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t q = 0; q < hw; q++) {
        int64_t p = (n * C + c) * hw + q, b = ((n * (C / B) + c / B) * hw + q) * B + c % B;
        if (to_blocked)
          dst[b] = src[p];
        else
          dst[p] = src[b];
      }
}

/* Store `plain` as variable name of s, blocked when asked. */
static void put(pe_scope *s, const char *name, const pe_tensor *plain, bool blocked) {
  pe_tensor *t = ph_set_f32(s, name, plain->shape, pe_f32(plain));
  if (blocked) relayout(pe_f32(plain), pe_f32(t), plain->shape, true);
}

/* got (stored blocked or not) against the plain want: equal, NaN for NaN,
 * or within tol relative. */
static void expect_as(pe_scope *s, const char *name, bool blocked, const pe_tensor *want,
                      double tol, const char *what, int mask) {
  const pe_tensor *g = ph_get(s, name);
  ck_assert(g && pe_shape_equal(&g->shape, &want->shape));
  int64_t n = pe_tensor_numel(want);
  float *p = malloc((size_t)n * sizeof *p);
  if (blocked)
    relayout(pe_f32(g), p, g->shape, false);
  else
    memcpy(p, g->data, (size_t)n * sizeof *p);
  const float *w = pe_f32(want);
  int64_t bad = -1;
  for (int64_t i = 0; i < n && bad < 0; i++) {
    bool same = (isnan(p[i]) && isnan(w[i])) ||
                fabs((double)p[i] - w[i]) <= tol * fmax(1.0, fabs((double)w[i]));
    if (!same) bad = i;
  }
  if (bad >= 0)
    ck_abort_msg("%s, layouts %#x: %s[%lld] = %g, plain gives %g", what, mask, name, (long long)bad,
                 p[bad], w[bad]);
  free(p);
}

/* op on s is refused with a message naming the attribute and `also`; frees
 * op and s. */
static void expect_refused(pe_scope *s, pe_op_desc *op, const char *also) {
  pe_status *st = ph_run_op(s, op, NULL);
  const char *msg = st ? pe_status_msg(st) : "no error";
  ck_assert_msg(st && strstr(msg, PE_LAYOUT_ATTR) && strstr(msg, also), "%s: %s", op->type, msg);
  pe_status_free(st);
  pe_op_desc_free(op);
  pe_scope_free(s);
}

static void copy_to(pe_tensor *dst, pe_scope *s, const char *name) {
  pe_tensor_init(dst);
  PE_CK_OK(pe_tensor_copy(dst, ph_get(s, name), name));
}

static pe_op_desc *max_pool(bool grad) {
  pe_op_desc *op = grad ? ph_op("pool2d_grad", "X", "x", "Out", "out", "Out@GRAD", "dout", NULL,
                                "X@GRAD", "dx", NULL)
                        : ph_op("pool2d", "X", "x", NULL, "Out", "out", NULL);
  pe_op_set_ints(op, "ksize", 2, (int64_t[]){2, 2});
  pe_op_set_ints(op, "strides", 2, (int64_t[]){2, 2});
  return op;
}

/* Every layout of pool2d's (X, Out) and pool2d_grad's (X, Out, Out@GRAD,
 * X@GRAD), even and odd planes, ties in most windows and a NaN in one. */
START_TEST(pool_max_blocked_matches_plain) {
  int64_t C = 16;
  const int64_t dims[][4] = {{2, C, 6, 8}, {2, C, 5, 7}};
  for (int k = 0; k < 2; k++) {
    pe_shape xs = pe_shape_make(4, dims[k]), os = PE_SHAPE(2, C, dims[k][2] / 2, dims[k][3] / 2);
    pe_scope *ref = pe_scope_new(NULL);
    pe_tensor *x = ph_set_uniform(ref, "x", xs, 0, 1, 3);
    for (int64_t i = 0; i < pe_tensor_numel(x); i++)
      pe_f32(x)[i] = (float)((((uint64_t)i * 2654435761u) >> 7) % 3);
    pe_f32(x)[(1 * C + 3) * xs.d[2] * xs.d[3] + 5] = NAN;
    ph_set_uniform(ref, "dout", os, 1, 2, 4);
    pe_op_desc *f = max_pool(false), *g = max_pool(true);
    PE_CK_OK(ph_run_op(ref, f, NULL));
    PE_CK_OK(ph_run_op(ref, g, NULL));
    pe_tensor xp, outp, doutp, dxp;
    copy_to(&xp, ref, "x");
    copy_to(&outp, ref, "out");
    copy_to(&doutp, ref, "dout");
    copy_to(&dxp, ref, "dx");
    for (int m = 0; m < 4; m++) {
      pe_scope *s = pe_scope_new(NULL);
      put(s, "x", &xp, m & 1);
      ph_set_uniform(s, "out", os, 7, 8, 1);
      pe_op_set_int(f, PE_LAYOUT_ATTR, (m & 1) | (int64_t)(m >> 1) << PE_LAYOUT_OUT_BIT);
      PE_CK_OK(ph_run_op(s, f, NULL));
      expect_as(s, "out", m >> 1, &outp, 0, "pool2d", m);
      pe_scope_free(s);
    }
    for (int m = 0; m < 16; m++) {
      pe_scope *s = pe_scope_new(NULL);
      put(s, "x", &xp, m & 1);
      put(s, "out", &outp, m & 2);
      put(s, "dout", &doutp, m & 4);
      ph_set_uniform(s, "dx", xs, 7, 8, 1);
      pe_op_set_int(g, PE_LAYOUT_ATTR, (m & 7) | (int64_t)(m >> 3) << PE_LAYOUT_OUT_BIT);
      PE_CK_OK(ph_run_op(s, g, NULL));
      expect_as(s, "dx", m >> 3, &dxp, 0, "pool2d_grad", m);
      pe_scope_free(s);
    }
    pe_op_desc_free(f);
    pe_op_desc_free(g);
    pe_tensor_release(&xp);
    pe_tensor_release(&outp);
    pe_tensor_release(&doutp);
    pe_tensor_release(&dxp);
    pe_scope_free(ref);
  }
}
END_TEST

/* The oneDNN gradients (average pooling) take plain arguments only. */
START_TEST(pool_avg_grad_refuses_blocked) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(1, 16, 4, 4), 0, 1, 3);
  ph_set_uniform(s, "out", PE_SHAPE(1, 16, 2, 2), 0, 1, 3);
  ph_set_uniform(s, "dout", PE_SHAPE(1, 16, 2, 2), 0, 1, 3);
  pe_op_desc *g = max_pool(true);
  pe_op_set_string(g, "pooling_type", "avg");
  pe_op_set_int(g, PE_LAYOUT_ATTR, 1);
  expect_refused(s, g, "");
}
END_TEST

static pe_op_desc *conv(bool grad, bool dw) {
  pe_op_desc *op;
  if (!grad)
    op = ph_op("conv2d", "Input", "x", "Filter", "w", "Bias", "b", NULL, "Output", "y", NULL);
  else if (dw)
    op =
        ph_op("conv2d_grad", "Input", "x", "Filter", "w", "Bias", "b", "Output", "y", "Output@GRAD",
              "dy", NULL, "Input@GRAD", "dx", "Filter@GRAD", "dw", "Bias@GRAD", "db", NULL);
  else
    op = ph_op("conv2d_grad", "Input", "x", "Filter", "w", "Bias", "b", "Output", "y",
               "Output@GRAD", "dy", NULL, "Input@GRAD", "dx", "Bias@GRAD", "db", NULL);
  pe_op_set_ints(op, "paddings", 2, (int64_t[]){1, 1});
  pe_op_set_string(op, "fuse_activation", "relu");
  return op;
}

/* conv2d (bias, fused relu) and conv2d_grad (with and without the filter's
 * gradient: Bias@GRAD from oneDNN or the per-channel sum) in every layout of
 * Input, Output / Output@GRAD (tied by the relu mask) and Input@GRAD, with
 * the direct and the gemm algorithm. */
START_TEST(conv_blocked_matches_plain) {
  static const int algos[] = {PE_CONV_DIRECT, PE_CONV_GEMM};
  int64_t C = 16;
  pe_shape xs = PE_SHAPE(2, C, 7, 7), ws = PE_SHAPE(C, C, 3, 3), bs = PE_SHAPE(C);
  for (int a = 0; a < 2; a++) {
    pe_conv_algo_set_mode(algos[a]);
    for (int dw = 0; dw < 2; dw++) {
      pe_scope *ref = pe_scope_new(NULL);
      ph_set_uniform(ref, "x", xs, -1, 1, 3);
      ph_set_uniform(ref, "w", ws, -0.3f, 0.3f, 4);
      ph_set_uniform(ref, "b", bs, -0.1f, 0.1f, 5);
      ph_set_uniform(ref, "dy", xs, -1, 1, 6);
      pe_op_desc *f = conv(false, dw), *g = conv(true, dw);
      PE_CK_OK(ph_run_op(ref, f, NULL));
      PE_CK_OK(ph_run_op(ref, g, NULL));
      pe_tensor xp, yp, dyp, dxp;
      copy_to(&xp, ref, "x");
      copy_to(&yp, ref, "y");
      copy_to(&dyp, ref, "dy");
      copy_to(&dxp, ref, "dx");
      for (int m = 0; m < 8; m++) { /* bit 0 Input, 1 Output (+ Output@GRAD), 2 Input@GRAD */
        pe_scope *s = pe_scope_new(NULL);
        put(s, "x", &xp, m & 1);
        ph_set_f32(s, "w", ws, pe_f32(ph_get(ref, "w")));
        ph_set_f32(s, "b", bs, pe_f32(ph_get(ref, "b")));
        ph_set_uniform(s, "y", xs, 7, 8, 1);
        pe_op_set_int(f, PE_LAYOUT_ATTR, (m & 1) | (int64_t)((m >> 1) & 1) << PE_LAYOUT_OUT_BIT);
        PE_CK_OK(ph_run_op(s, f, NULL));
        expect_as(s, "y", m & 2, &yp, 1e-5, "conv2d", m);
        put(s, "y", &yp, m & 2);
        put(s, "dy", &dyp, m & 2);
        ph_set_uniform(s, "dx", xs, 7, 8, 1);
        pe_op_set_int(g, PE_LAYOUT_ATTR,
                      (m & 1) | (m & 2 ? 3 << 3 : 0) | (int64_t)(m >> 2) << PE_LAYOUT_OUT_BIT);
        PE_CK_OK(ph_run_op(s, g, NULL));
        expect_as(s, "dx", m & 4, &dxp, 1e-5, "conv2d_grad Input@GRAD", m);
        pe_tensor *db = ph_get(ref, "db");
        expect_as(s, "db", false, db, 1e-5, "conv2d_grad Bias@GRAD", m);
        if (dw) expect_as(s, "dw", false, ph_get(ref, "dw"), 1e-5, "conv2d_grad Filter@GRAD", m);
        pe_scope_free(s);
      }
      pe_op_desc_free(f);
      pe_op_desc_free(g);
      pe_tensor_release(&xp);
      pe_tensor_release(&yp);
      pe_tensor_release(&dyp);
      pe_tensor_release(&dxp);
      pe_scope_free(ref);
    }
  }
  pe_conv_algo_set_mode(PE_CONV_DIRECT);
}
END_TEST

/* The relu mask is elementwise: Output and Output@GRAD stored apart are
 * refused, naming the attribute. */
START_TEST(conv_grad_relu_mask_layouts_must_agree) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(1, 16, 4, 4), -1, 1, 3);
  ph_set_uniform(s, "w", PE_SHAPE(16, 16, 3, 3), -1, 1, 3);
  ph_set_uniform(s, "b", PE_SHAPE(16), -1, 1, 3);
  ph_set_uniform(s, "y", PE_SHAPE(1, 16, 4, 4), -1, 1, 3);
  ph_set_uniform(s, "dy", PE_SHAPE(1, 16, 4, 4), -1, 1, 3);
  pe_op_desc *g = conv(true, true);
  pe_op_set_int(g, PE_LAYOUT_ATTR, 1 << 3); /* Output only */
  expect_refused(s, g, "Output@GRAD");
}
END_TEST

/* An activation argument of a tied op: its name in the scopes and its bit
 * in the attribute. */
typedef struct act_arg {
  const char *name;
  bool out;
  int slot;
} act_arg;

/* The attribute bit of an activation argument. */
static int act_bit(const act_arg *a) {
  return a->slot + (a->out ? PE_LAYOUT_OUT_BIT : 0);
}

/* op on ref's inputs in every layout of its activation slots (acts[0..n):
 * arguments of one slot share its bit): all plain or all blocked agree with
 * ref's outputs (activations and the plain outputs `plain_outs`, to tol);
 * every mix is refused naming the attribute. `plain_ins`: the other inputs,
 * always plain. */
static void tied_matches_plain(const pe_op_desc *op, pe_scope *ref, const act_arg *acts, int n,
                               const char *const *plain_ins, const char *const *plain_outs,
                               double tol, const char *what) {
  int keys[8], nk = 0, key_of[8];
  for (int a = 0; a < n; a++) {
    int k = 0;
    while (k < nk && keys[k] != act_bit(&acts[a])) k++;
    if (k == nk) keys[nk++] = act_bit(&acts[a]);
    key_of[a] = k;
  }
  int full = (1 << nk) - 1;
  for (int m = 0; m <= full; m++) {
    pe_scope *s = pe_scope_new(NULL);
    int64_t bits = 0;
    for (int a = 0; a < n; a++) {
      bool b = m >> key_of[a] & 1;
      const pe_tensor *t = ph_get(ref, acts[a].name);
      if (acts[a].out)
        ph_set_uniform(s, acts[a].name, t->shape, 7, 8, 1);
      else
        put(s, acts[a].name, t, b);
      if (b) bits |= (int64_t)1 << act_bit(&acts[a]);
    }
    for (int k = 0; plain_ins && plain_ins[k]; k++) {
      const pe_tensor *t = ph_get(ref, plain_ins[k]);
      ph_set_f32(s, plain_ins[k], t->shape, pe_f32(t));
    }
    for (int k = 0; plain_outs[k]; k++)
      ph_set_uniform(s, plain_outs[k], ph_get(ref, plain_outs[k])->shape, 7, 8, 1);
    pe_op_desc *o;
    PE_CK_OK(pe_op_desc_clone(op, &o));
    pe_op_set_int(o, PE_LAYOUT_ATTR, bits);
    pe_status *st = ph_run_op(s, o, NULL);
    if (m == 0 || m == full) {
      PE_CK_OK(st);
      for (int a = 0; a < n; a++)
        if (acts[a].out)
          expect_as(s, acts[a].name, m != 0, ph_get(ref, acts[a].name), tol, what, m);
      for (int k = 0; plain_outs[k]; k++)
        expect_as(s, plain_outs[k], false, ph_get(ref, plain_outs[k]), tol, what, m);
    } else {
      ck_assert_msg(st && strstr(pe_status_msg(st), PE_LAYOUT_ATTR), "%s, layouts %#x: %s", what, m,
                    st ? pe_status_msg(st) : "no error");
      pe_status_free(st);
    }
    pe_op_desc_free(o);
    pe_scope_free(s);
  }
}

/* batch_norm in training and test mode and its gradient (training), with
 * and without a fused relu, channels a multiple of 16 (blocked on every ISA) and an odd plane. */
START_TEST(bn_blocked_matches_plain) {
  pe_shape xs = PE_SHAPE(2, 32, 5, 3), cs = PE_SHAPE(32);
  for (int relu = 0; relu < 2; relu++) {
    pe_scope *ref = pe_scope_new(NULL);
    ph_set_uniform(ref, "x", xs, -2, 3, 3);
    ph_set_uniform(ref, "scale", cs, 0.5f, 1.5f, 4);
    ph_set_uniform(ref, "bias", cs, -0.5f, 0.5f, 5);
    ph_set_uniform(ref, "mean", cs, -0.1f, 0.1f, 6);
    ph_set_uniform(ref, "var", cs, 0.9f, 1.1f, 7);
    ph_set_uniform(ref, "dy", xs, -1, 1, 8);
    pe_op_desc *f = ph_op("batch_norm", "X", "x", "Scale", "scale", "Bias", "bias", "Mean", "mean",
                          "Variance", "var", NULL, "Y", "y", "MeanOut", "mo", "VarianceOut", "vo",
                          "SavedMean", "sm", "SavedVariance", "sv", NULL);
    pe_op_desc *g =
        relu ? ph_op("batch_norm_grad", "X", "x", "Scale", "scale", "Bias", "bias", "SavedMean",
                     "sm", "SavedVariance", "sv", "Y", "y", "Y@GRAD", "dy", NULL, "X@GRAD", "dx",
                     "Scale@GRAD", "dscale", "Bias@GRAD", "dbias", NULL)
             : ph_op("batch_norm_grad", "X", "x", "Scale", "scale", "Bias", "bias", "SavedMean",
                     "sm", "SavedVariance", "sv", "Y@GRAD", "dy", NULL, "X@GRAD", "dx",
                     "Scale@GRAD", "dscale", "Bias@GRAD", "dbias", NULL);
    if (relu) {
      pe_op_set_string(f, "fuse_activation", "relu");
      pe_op_set_string(g, "fuse_activation", "relu");
    }
    PE_CK_OK(ph_run_op(ref, f, NULL));
    PE_CK_OK(ph_run_op(ref, g, NULL));
    static const char *const fwd_ins[] = {"scale", "bias", "mean", "var", NULL};
    static const char *const fwd_outs[] = {"mo", "vo", "sm", "sv", NULL};
    const act_arg fa[] = {{"x", false, 0}, {"y", true, 0}};
    tied_matches_plain(f, ref, fa, 2, fwd_ins, fwd_outs, 1e-5, "batch_norm");
    static const char *const grad_ins[] = {"scale", "bias", "sm", "sv", NULL};
    static const char *const grad_outs[] = {"dscale", "dbias", NULL};
    const act_arg ga[] = {{"x", false, 0}, {"dy", false, 6}, {"dx", true, 0}, {"y", false, 5}};
    tied_matches_plain(g, ref, ga, relu ? 4 : 3, grad_ins, grad_outs, 1e-5, "batch_norm_grad");
    /* test mode (the evaluation program): the running statistics (last: it
     * overwrites the reference outputs) */
    pe_op_desc *ft;
    PE_CK_OK(pe_op_desc_clone(f, &ft));
    pe_op_set_bool(ft, "is_test", true);
    PE_CK_OK(ph_run_op(ref, ft, NULL));
    tied_matches_plain(ft, ref, fa, 2, fwd_ins, fwd_outs, 1e-5, "batch_norm is_test");
    pe_op_desc_free(ft);
    pe_op_desc_free(f);
    pe_op_desc_free(g);
    pe_scope_free(ref);
  }
}
END_TEST

/* elementwise_add (the residual sum) and its gradient, with and without a
 * fused relu, and sum (gradient accumulation): elementwise, so bit for bit. */
START_TEST(add_sum_blocked_matches_plain) {
  pe_shape xs = PE_SHAPE(2, 32, 3, 5);
  for (int relu = 0; relu < 2; relu++) {
    pe_scope *ref = pe_scope_new(NULL);
    ph_set_uniform(ref, "x", xs, -1, 1, 3);
    ph_set_uniform(ref, "y", xs, -1, 1, 4);
    ph_set_uniform(ref, "dout", xs, -1, 1, 5);
    pe_op_desc *f = ph_op("elementwise_add", "X", "x", "Y", "y", NULL, "Out", "out", NULL);
    pe_op_desc *g = relu ? ph_op("elementwise_add_grad", "X", "x", "Y", "y", "Out", "out",
                                 "Out@GRAD", "dout", NULL, "X@GRAD", "dx", "Y@GRAD", "dy", NULL)
                         : ph_op("elementwise_add_grad", "X", "x", "Y", "y", "Out@GRAD", "dout",
                                 NULL, "X@GRAD", "dx", "Y@GRAD", "dy", NULL);
    if (relu) {
      pe_op_set_string(f, "fuse_activation", "relu");
      pe_op_set_string(g, "fuse_activation", "relu");
    }
    PE_CK_OK(ph_run_op(ref, f, NULL));
    PE_CK_OK(ph_run_op(ref, g, NULL));
    static const char *const none[] = {NULL};
    const act_arg fa[] = {{"x", false, 0}, {"y", false, 1}, {"out", true, 0}};
    tied_matches_plain(f, ref, fa, 3, NULL, none, 0, "elementwise_add");
    const act_arg ga[] = {{"x", false, 0}, {"y", false, 1}, {"dout", false, 3},
                          {"dx", true, 0}, {"dy", true, 1}, {"out", false, 2}};
    tied_matches_plain(g, ref, ga, relu ? 6 : 5, NULL, none, 0, "elementwise_add_grad");
    pe_op_desc_free(f);
    pe_op_desc_free(g);
    pe_scope_free(ref);
  }
  pe_scope *ref = pe_scope_new(NULL);
  ph_set_uniform(ref, "a", xs, -1, 1, 3);
  ph_set_uniform(ref, "b", xs, -1, 1, 4);
  pe_op_desc *sum = ph_op("sum", NULL, "Out", "out", NULL);
  PE_CK_OK(pe_op_set_input(sum, "X", 2, (const char *const[]){"a", "b"}));
  PE_CK_OK(ph_run_op(ref, sum, NULL));
  static const char *const none[] = {NULL};
  /* one bit for X's two arguments: they are blocked together */
  const act_arg sa[] = {{"a", false, 0}, {"b", false, 0}, {"out", true, 0}};
  tied_matches_plain(sum, ref, sa, 3, NULL, none, 0, "sum");
  pe_op_desc_free(sum);
  pe_scope_free(ref);
}
END_TEST

/* relu and relu_grad (not fused: between a pool and a conv, say): bit for
 * bit, NaN kept. */
START_TEST(relu_blocked_matches_plain) {
  pe_shape xs = PE_SHAPE(2, 32, 3, 5);
  pe_scope *ref = pe_scope_new(NULL);
  pe_tensor *x = ph_set_uniform(ref, "x", xs, -1, 1, 3);
  pe_f32(x)[17] = NAN;
  ph_set_uniform(ref, "dout", xs, -1, 1, 4);
  pe_op_desc *f = ph_op("relu", "X", "x", NULL, "Out", "out", NULL);
  pe_op_desc *g =
      ph_op("relu_grad", "X", "x", "Out", "out", "Out@GRAD", "dout", NULL, "X@GRAD", "dx", NULL);
  PE_CK_OK(ph_run_op(ref, f, NULL));
  PE_CK_OK(ph_run_op(ref, g, NULL));
  static const char *const none[] = {NULL};
  const act_arg fa[] = {{"x", false, 0}, {"out", true, 0}};
  tied_matches_plain(f, ref, fa, 2, NULL, none, 0, "relu");
  const act_arg ga[] = {{"x", false, 0}, {"out", false, 1}, {"dout", false, 2}, {"dx", true, 0}};
  tied_matches_plain(g, ref, ga, 4, NULL, none, 0, "relu_grad");
  pe_op_desc_free(f);
  pe_op_desc_free(g);
  pe_scope_free(ref);
}
END_TEST

/* A blocked operand has no broadcast addressing: refused, naming the
 * attribute. */
START_TEST(add_blocked_broadcast_refused) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(2, 16, 4, 4), -1, 1, 3);
  ph_set_uniform(s, "y", PE_SHAPE(16), -1, 1, 4);
  ph_set_uniform(s, "out", PE_SHAPE(2, 16, 4, 4), -1, 1, 5);
  pe_op_desc *f = ph_op("elementwise_add", "X", "x", "Y", "y", NULL, "Out", "out", NULL);
  pe_op_set_int(f, "axis", 1);
  pe_op_set_int(f, PE_LAYOUT_ATTR, 3 | (int64_t)1 << PE_LAYOUT_OUT_BIT);
  expect_refused(s, f, "broadcast");
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ops_dnnl_blocked");
  TCase *tc = tcase_create("blocked");
  tcase_add_test(tc, pool_max_blocked_matches_plain);
  tcase_add_test(tc, pool_avg_grad_refuses_blocked);
  tcase_add_test(tc, conv_blocked_matches_plain);
  tcase_add_test(tc, conv_grad_relu_mask_layouts_must_agree);
  tcase_add_test(tc, bn_blocked_matches_plain);
  tcase_add_test(tc, add_sum_blocked_matches_plain);
  tcase_add_test(tc, add_blocked_broadcast_refused);
  tcase_add_test(tc, relu_blocked_matches_plain);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
