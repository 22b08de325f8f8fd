/* oneDNN's conv2d and its gradient: forward values against hand-computed
 * numbers (written out) and naive reference loops for the larger
 * configurations, every algorithm of the chooser, blocked layouts; tolerance
 * 1e-5 relative (f32 sums of <= 36 terms of magnitude <= 16). Gradients use
 * the checker in ops_dnnl_helpers.h (eps 1e-3, max_err <= 1e-2; see there). */
#include <check.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "ops/cpu/conv_algo.h"
#include "ops/cpu/conv_weights_pass.h"
#include "ops_dnnl_helpers.h"

#define FWD_TOL 1e-5

static const float k_1to16[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
/* Sobel-x: every interior output over 1..16 is sum(col j) - sum(col j+2) = -8. */
static const float k_sobel[9] = {1, 0, -1, 2, 0, -2, 1, 0, -1};

static pe_op_desc *conv_op(int64_t s, int64_t p, int64_t d, int64_t g) {
  pe_op_desc *op = ph_op("conv2d", "Input", "x", "Filter", "w", NULL, "Output", "out", NULL);
  pe_op_set_ints(op, "strides", 2, (int64_t[]){s, s});
  pe_op_set_ints(op, "paddings", 2, (int64_t[]){p, p});
  pe_op_set_ints(op, "dilations", 2, (int64_t[]){d, d});
  pe_op_set_int(op, "groups", g);
  return op;
}

/* Naive NCHW/OIHW convolution, the reference for the larger cases. */
static void conv_ref(const float *x, const int64_t *xs, const float *w, const int64_t *ws,
                     int64_t s, int64_t p, int64_t d, int64_t g, float *out, int64_t oh,
                     int64_t ow) {
  int64_t cpg = ws[1], opg = ws[0] / g;
  for (int64_t n = 0; n < xs[0]; n++)
    for (int64_t o = 0; o < ws[0]; o++)
      for (int64_t i = 0; i < oh; i++)
        for (int64_t j = 0; j < ow; j++) {
          double acc = 0;
          for (int64_t c = 0; c < cpg; c++)
            for (int64_t a = 0; a < ws[2]; a++)
              for (int64_t b = 0; b < ws[3]; b++) {
                int64_t r = i * s - p + a * d, q = j * s - p + b * d, ci = (o / opg) * cpg + c;
                if (r < 0 || r >= xs[2] || q < 0 || q >= xs[3]) continue;
                acc += (double)x[((n * xs[1] + ci) * xs[2] + r) * xs[3] + q] *
                       w[((o * cpg + c) * ws[2] + a) * ws[3] + b];
              }
          out[((n * ws[0] + o) * oh + i) * ow + j] = (float)acc;
        }
}

START_TEST(conv_sobel_written_out) {
  pe_scope *s = pe_scope_new(NULL);
  ph_set_f32(s, "x", PE_SHAPE(1, 1, 4, 4), k_1to16);
  ph_set_f32(s, "w", PE_SHAPE(1, 1, 3, 3), k_sobel);
  /* No padding: 2x2 of -8. */
  pe_op_desc *op = conv_op(1, 0, 1, 1);
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *out = ph_get(s, "out");
  expect_shape(&out->shape, PE_SHAPE(1, 1, 2, 2));
  dt_expect_close(pe_f32(out), (float[]){-8, -8, -8, -8}, 4, FWD_TOL, "pad 0");
  pe_op_desc_free(op);
  /* Padding 1, stride 2: outputs at (0,0) (0,2) (2,0) (2,2) of the padded
   * map. (0,0): rows 0,1 weights 2,1 of -x[r][1] = -2*2 - 6 = -10;
   * (0,2): -2*(2+1) = -6; (2,0): -(6 + 2*10 + 14) = -40; (2,2): -2*4 = -8. */
  op = conv_op(2, 1, 1, 1);
  PE_CK_OK(ph_run_op(s, op, NULL));
  out = ph_get(s, "out");
  expect_shape(&out->shape, PE_SHAPE(1, 1, 2, 2));
  dt_expect_close(pe_f32(out), (float[]){-10, -6, -40, -8}, 4, FWD_TOL, "pad 1 stride 2");
  pe_op_desc_free(op);
  /* Dilation 2, padding 2: taps at offsets -2, 0, +2. Output (1,1): rows
   * -1(pad),1,3 with weights 1,2,1; cols -1(pad) and 3: 2*(0 - 8) + (0 - 16)
   * = -32. Output (0,0): rows -2(pad),0,2 / cols -2(pad),0,2: 2*(0-3) +
   * (0-11) = -17. */
  op = conv_op(1, 2, 2, 1);
  PE_CK_OK(ph_run_op(s, op, NULL));
  out = ph_get(s, "out");
  expect_shape(&out->shape, PE_SHAPE(1, 1, 4, 4));
  ck_assert_float_eq_tol(pe_f32(out)[0], -17.0f, 1e-4f);
  ck_assert_float_eq_tol(pe_f32(out)[5], -32.0f, 1e-4f);
  float want[16];
  conv_ref(k_1to16, (int64_t[]){1, 1, 4, 4}, k_sobel, (int64_t[]){1, 1, 3, 3}, 1, 2, 2, 1, want, 4,
           4);
  dt_expect_close(pe_f32(out), want, 16, FWD_TOL, "dilation 2");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

/* groups 2: channel 0 sees only filter 0, channel 1 only filter 1. */
START_TEST(conv_groups_written_out) {
  pe_scope *s = pe_scope_new(NULL);
  float xv[32];
  for (int i = 0; i < 16; i++) {
    xv[i] = k_1to16[i];
    xv[16 + i] = 1;
  }
  float wv[18] = {0};
  memcpy(wv, k_sobel, sizeof k_sobel);
  for (int i = 9; i < 18; i++) wv[i] = 1; /* box filter on the ones: 9 */
  ph_set_f32(s, "x", PE_SHAPE(1, 2, 4, 4), xv);
  ph_set_f32(s, "w", PE_SHAPE(2, 1, 3, 3), wv);
  pe_op_desc *op = conv_op(1, 0, 1, 2);
  PE_CK_OK(ph_run_op(s, op, NULL));
  pe_tensor *out = ph_get(s, "out");
  expect_shape(&out->shape, PE_SHAPE(1, 2, 2, 2));
  dt_expect_close(pe_f32(out), (float[]){-8, -8, -8, -8, 9, 9, 9, 9}, 8, FWD_TOL, "groups 2");
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(conv_matches_reference) {
  struct {
    int64_t x[4], w[4], s, p, d, g;
  } cases[] = {
      {{2, 3, 7, 6}, {4, 3, 3, 3}, 2, 1, 1, 1},
      {{1, 4, 9, 9}, {6, 2, 3, 3}, 1, 2, 2, 2},
      {{2, 4, 8, 7}, {4, 1, 2, 3}, 3, 0, 1, 4},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    pe_scope *s = pe_scope_new(NULL);
    pe_tensor *x = ph_set_uniform(s, "x", pe_shape_make(4, cases[k].x), -1, 1, 40 + k);
    pe_tensor *w = ph_set_uniform(s, "w", pe_shape_make(4, cases[k].w), -1, 1, 50 + k);
    pe_op_desc *op = conv_op(cases[k].s, cases[k].p, cases[k].d, cases[k].g);
    PE_CK_OK(ph_run_op(s, op, NULL));
    pe_tensor *out = ph_get(s, "out");
    int64_t keff_h = cases[k].d * (cases[k].w[2] - 1) + 1,
            keff_w = cases[k].d * (cases[k].w[3] - 1) + 1;
    int64_t oh = (cases[k].x[2] + 2 * cases[k].p - keff_h) / cases[k].s + 1;
    int64_t ow = (cases[k].x[3] + 2 * cases[k].p - keff_w) / cases[k].s + 1;
    expect_shape(&out->shape, PE_SHAPE(cases[k].x[0], cases[k].w[0], oh, ow));
    float *want = malloc((size_t)pe_tensor_numel(out) * sizeof(float));
    conv_ref(pe_f32(x), cases[k].x, pe_f32(w), cases[k].w, cases[k].s, cases[k].p, cases[k].d,
             cases[k].g, want, oh, ow);
    dt_expect_close(pe_f32(out), want, pe_tensor_numel(out), FWD_TOL, "conv");
    free(want);
    pe_op_desc_free(op);
    pe_scope_free(s);
  }
}
END_TEST

/* Naive gradients of conv_ref (stride s, padding p, dilation 1, groups
 * 1): dx and dw (either may be NULL) from dout. */
static void conv_ref_grad(const float *x, const int64_t *xs, const float *w, const int64_t *ws,
                          int64_t s, int64_t p, const float *dout, int64_t oh, int64_t ow,
                          float *dx, float *dw) {
  int64_t nx = xs[0] * xs[1] * xs[2] * xs[3], nw = ws[0] * ws[1] * ws[2] * ws[3];
  double *gx = calloc((size_t)nx, sizeof(double)), *gw = calloc((size_t)nw, sizeof(double));
  for (int64_t n = 0; n < xs[0]; n++)
    for (int64_t o = 0; o < ws[0]; o++)
      for (int64_t i = 0; i < oh; i++)
        for (int64_t j = 0; j < ow; j++) {
          double g = dout[((n * ws[0] + o) * oh + i) * ow + j];
          for (int64_t c = 0; c < ws[1]; c++)
            for (int64_t a = 0; a < ws[2]; a++)
              for (int64_t b = 0; b < ws[3]; b++) {
                int64_t r = i * s - p + a, q = j * s - p + b;
                if (r < 0 || r >= xs[2] || q < 0 || q >= xs[3]) continue;
                int64_t xi = ((n * xs[1] + c) * xs[2] + r) * xs[3] + q;
                int64_t wi = ((o * ws[1] + c) * ws[2] + a) * ws[3] + b;
                gx[xi] += g * w[wi];
                gw[wi] += g * x[xi];
              }
        }
  for (int64_t i = 0; dx && i < nx; i++) dx[i] = (float)gx[i];
  for (int64_t i = 0; dw && i < nw; i++) dw[i] = (float)gw[i];
  free(gx);
  free(gw);
}

/* The CNN's two convolutions (channel counts oneDNN blocks by 8 or 16), the
 * shapes on which the primitives choose blocked layouts and the kernels
 * stage their arguments through reorders (dnnl_layout.c): forward, both
 * gradients (the weights pass reading Output@GRAD through the data pass's
 * stage) and the weights gradient alone (the first layer's case: its input
 * is a feed). Sums run over up to 800 terms of magnitude <= 1, so the
 * tolerance is 1e-4 relative. Where oneDNN's effective ISA has AVX2 the
 * layouts must really be blocked (reorders > 0): that is the path under
 * test; below it (ONEDNN_MAX_CPU_ISA=SSE41) oneDNN keeps them plain and the
 * values are checked alone. */
START_TEST(conv_blocked_layouts_match_reference) {
  pe_conv_algo_set_mode(PE_CONV_DIRECT); /* the staged path, whatever times best */
  struct {
    int64_t x[4], w[4];
  } cases[] = {{{2, 32, 14, 14}, {64, 32, 5, 5}}, {{2, 1, 28, 28}, {32, 1, 5, 5}}};
  pe_device_ctx dev;
  PE_CK_OK(pe_device_ctx_init(&dev, pe_cpu_place(), 0));
  pe_device_ctx_bind(&dev);
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const int64_t *xs = cases[k].x, *ws = cases[k].w;
    int64_t oh = xs[2], ow = xs[3]; /* 5x5, padding 2, stride 1 */
    pe_scope *s = pe_scope_new(NULL);
    pe_tensor *x = ph_set_uniform(s, "x", pe_shape_make(4, xs), -1, 1, 70 + k);
    pe_tensor *w = ph_set_uniform(s, "w", pe_shape_make(4, ws), -1, 1, 72 + k);
    pe_tensor *dout = ph_set_uniform(s, "dout", PE_SHAPE(xs[0], ws[0], oh, ow), -1, 1, 74 + k);
    int64_t ny = pe_tensor_numel(dout), nx = pe_tensor_numel(x), nw = pe_tensor_numel(w);
    float *want = malloc((size_t)ny * sizeof(float)), *want_dx = malloc((size_t)nx * sizeof(float)),
          *want_dw = malloc((size_t)nw * sizeof(float));
    conv_ref(pe_f32(x), xs, pe_f32(w), ws, 1, 2, 1, 1, want, oh, ow);
    conv_ref_grad(pe_f32(x), xs, pe_f32(w), ws, 1, 2, pe_f32(dout), oh, ow, want_dx, want_dw);

    pe_op_desc *op = conv_op(1, 2, 1, 1);
    ph_op_inst *inst = ph_op_inst_new(op, &dev);
    PE_CK_OK(ph_op_inst_run(inst, s, NULL));
    PE_CK_OK(ph_op_inst_run(inst, s, NULL)); /* the entry again: stages reused */
    dt_expect_close(pe_f32(ph_get(s, "out")), want, ny, 1e-4, "blocked conv forward");
    /* oneDNN's effective ISA, which ONEDNN_MAX_CPU_ISA lowers: the CPU's
     * flags alone would expect blocked layouts that an SSE4.1-capped run
     * never picks. Its ISA values are nested bit sets. */
    bool avx2 = (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2;
    if (avx2) ck_assert_int_gt(pe_dnnl_cache_stats_of(inst->state).reorders, 0);
    ph_op_inst_free(inst);
    pe_op_desc_free(op);

    for (int both = 1; both >= 0; both--) {
      op = ph_op("conv2d_grad", "Input", "x", "Filter", "w", "Output@GRAD", "dout", NULL,
                 "Filter@GRAD", "dw", NULL);
      if (both) pe_op_set_output(op, "Input@GRAD", 1, (const char *[]){"dx"});
      pe_op_set_ints(op, "paddings", 2, (int64_t[]){2, 2});
      inst = ph_op_inst_new(op, &dev);
      PE_CK_OK(ph_op_inst_run(inst, s, NULL));
      PE_CK_OK(ph_op_inst_run(inst, s, NULL));
      if (both) dt_expect_close(pe_f32(ph_get(s, "dx")), want_dx, nx, 1e-4, "blocked conv dx");
      dt_expect_close(pe_f32(ph_get(s, "dw")), want_dw, nw, 1e-4,
                      both ? "blocked conv dw (with dx)" : "blocked conv dw alone");
      if (avx2) ck_assert_int_gt(pe_dnnl_cache_stats_of(inst->state).reorders, 0);
      /* The weights pass (prims[1]) stores no more input channels than
       * there are: on AVX2 oneDNN's own choice would pad the first layer's
       * one channel to 8 (conv_weights_pass.h). */
      const_dnnl_primitive_desc_t bw = pe_dnnl_cache_pd(inst->state, 0, 1);
      ck_assert_ptr_nonnull(bw);
      ck_assert_msg(!pe_conv_weights_pass_pads(bw), "weights pass of %lld input channels on %s",
                    (long long)xs[1], pe_dnnl_impl_name(bw));
      ph_op_inst_free(inst);
      pe_op_desc_free(op);
      ph_set_uniform(s, "dw", pe_shape_make(4, ws), 5, 6, 76); /* stale values: must be rewritten */
      ph_set_uniform(s, "dx", pe_shape_make(4, xs), 5, 6, 77);
    }
    free(want);
    free(want_dx);
    free(want_dw);
    pe_scope_free(s);
  }
  pe_device_ctx_destroy(&dev);
}
END_TEST

/* The chooser: the smallest time wins, absent (negative, NaN) candidates
 * never do, ties go to the lower index; the memo keeps the first choice. */
START_TEST(conv_algo_chooser_rule) {
  ck_assert_int_eq(pe_conv_algo_choose((double[]){3, 1, 2, -1}, 4), 1);
  ck_assert_int_eq(pe_conv_algo_choose((double[]){2, 1, 1, 5}, 4), 1);
  ck_assert_int_eq(pe_conv_algo_choose((double[]){NAN, 4, -1, 3}, 4), 3);
  ck_assert_int_eq(pe_conv_algo_choose((double[]){-1, 0.5, -1, 0.5}, 4), 1);
  ck_assert_int_eq(pe_conv_algo_choose((double[]){-1, -1, NAN, -1}, 4), -1);
  ck_assert_int_eq(pe_conv_algo_choose((double[]){7}, 1), 0);
  /* A one-thread choice is its candidate + PE_CONV_CANDS. */
  double t8[PE_CONV_CHOICES] = {4, 3, -1, -1, 2.5, 3, -1, -1};
  int ch = pe_conv_algo_choose(t8, PE_CONV_CHOICES);
  ck_assert_int_eq(ch, PE_CONV_CANDS + PE_CONV_DIRECT);
  ck_assert(pe_conv_choice_single(ch) && pe_conv_choice_cand(ch) == PE_CONV_DIRECT);
  ck_assert(!pe_conv_choice_single(PE_CONV_AUTO));
  int64_t k1[] = {1, 2, 3}, k2[] = {1, 2, 4};
  ck_assert_int_eq(pe_conv_algo_lookup(k1, 3), -1);
  ck_assert_int_eq(pe_conv_algo_remember(k1, 3, PE_CONV_GEMM), PE_CONV_GEMM);
  ck_assert_int_eq(pe_conv_algo_remember(k1, 3, PE_CONV_AUTO), PE_CONV_GEMM); /* first kept */
  ck_assert_int_eq(pe_conv_algo_lookup(k1, 3), PE_CONV_GEMM);
  ck_assert_int_eq(pe_conv_algo_lookup(k2, 3), -1);
  ck_assert_int_eq(pe_conv_algo_lookup(k1, 2), -1);
  int mode;
  ck_assert(pe_conv_algo_parse("time", &mode) && mode == PE_CONV_ALGO_TIME);
  ck_assert(pe_conv_algo_parse("winograd", &mode) && mode == PE_CONV_WINOGRAD);
  ck_assert(!pe_conv_algo_parse("fft", &mode));
}
END_TEST

/* Each algorithm, forced on the whole team (loop index < PE_CONV_CANDS)
 * and on one thread (the next PE_CONV_CANDS), and the timed choice
 * (PE_CONV_ALGO_TIME, the last index), against the naive loops: forward, both gradients,
 * on a 3x3 shape Winograd takes (16 -> 32 channels, padding 1) and the
 * CNN's 5x5 one, whose Winograd falls back to direct. Sums of up to 800
 * terms of magnitude <= 1; Winograd's transforms add rounding (largest
 * measured, PE_TOL_REPORT, Xeon with AVX-512: 0.17 of 1e-4 on the 3x3
 * shape, where direct uses 0.04), so 1e-4 relative for all. The entry
 * records the algorithm that ran; where oneDNN's effective ISA has
 * AVX-512 the 3x3 shape must really run Winograd. */
START_TEST(conv_each_algorithm_matches_reference) {
  int mode = _i < PE_CONV_CHOICES ? _i : PE_CONV_ALGO_TIME;
  int cand = mode >= 0 ? pe_conv_choice_cand(mode) : -1;
  pe_conv_algo_set_mode(mode);
  struct {
    int64_t x[4], w[4], p;
  } cases[] = {{{2, 16, 12, 12}, {32, 16, 3, 3}, 1}, {{2, 32, 14, 14}, {64, 32, 5, 5}, 2}};
  pe_device_ctx dev;
  PE_CK_OK(pe_device_ctx_init(&dev, pe_cpu_place(), 0));
  pe_device_ctx_bind(&dev);
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const int64_t *xs = cases[k].x, *ws = cases[k].w, p = cases[k].p;
    int64_t oh = xs[2], ow = xs[3]; /* stride 1, padding (K-1)/2 */
    pe_scope *s = pe_scope_new(NULL);
    pe_tensor *x = ph_set_uniform(s, "x", pe_shape_make(4, xs), -1, 1, 80 + k);
    pe_tensor *w = ph_set_uniform(s, "w", pe_shape_make(4, ws), -1, 1, 82 + k);
    pe_tensor *dout = ph_set_uniform(s, "dout", PE_SHAPE(xs[0], ws[0], oh, ow), -1, 1, 84 + k);
    int64_t ny = pe_tensor_numel(dout), nx = pe_tensor_numel(x), nw = pe_tensor_numel(w);
    float *want = malloc((size_t)ny * sizeof(float)), *want_dx = malloc((size_t)nx * sizeof(float)),
          *want_dw = malloc((size_t)nw * sizeof(float));
    conv_ref(pe_f32(x), xs, pe_f32(w), ws, 1, p, 1, 1, want, oh, ow);
    conv_ref_grad(pe_f32(x), xs, pe_f32(w), ws, 1, p, pe_f32(dout), oh, ow, want_dx, want_dw);
    char what[96];
    char name[32];
    snprintf(name, sizeof name, "%s%s", mode >= 0 ? pe_conv_cand_name(cand) : "timed",
             mode >= 0 && pe_conv_choice_single(mode) ? " 1-thread" : "");

    pe_op_desc *op = conv_op(1, p, 1, 1);
    ph_op_inst *inst = ph_op_inst_new(op, &dev);
    PE_CK_OK(ph_op_inst_run(inst, s, NULL));
    pe_dnnl_reorder_count r0 = pe_dnnl_reorders_run();
    PE_CK_OK(ph_op_inst_run(inst, s, NULL)); /* the entry's run alone */
    pe_dnnl_reorder_count r1 = pe_dnnl_reorders_run();
    ck_assert_int_eq(omp_get_max_threads(), dev.threads); /* the place's team is back */
    /* The process counter counts exactly the stages' reorders: one per
     * staged argument (src, weights, dst), none on the plain tensors. */
    int staged = 0;
    for (int a = 0; a < 3; a++)
      staged += inst->state && ((const pe_dnnl_cache *)inst->state)->e[0].stages[a].reorder >= 0;
    ck_assert_uint_eq(r1.runs - r0.runs, (uint64_t)staged);
    ck_assert(staged == 0 ? r1.bytes == r0.bytes : r1.bytes > r0.bytes);
    snprintf(what, sizeof what, "%s conv forward, case %zu", name, k);
    dt_expect_close(pe_f32(ph_get(s, "out")), want, ny, 1e-4, what);
    const pe_dnnl_cache *cache = inst->state;
    ck_assert_int_eq(cache->n, 1);
    int ran = cache->e[0].choice;
    if (mode >= 0 && cand != PE_CONV_WINOGRAD) ck_assert_int_eq(ran, mode);
    if (cand == PE_CONV_WINOGRAD)
      ck_assert(ran == mode || ran == mode - PE_CONV_WINOGRAD + PE_CONV_DIRECT);
    if (cand == PE_CONV_WINOGRAD && ws[2] == 5)
      ck_assert_int_eq(ran, mode - PE_CONV_WINOGRAD + PE_CONV_DIRECT);
    bool avx512 =
        (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
    if (cand == PE_CONV_WINOGRAD && ws[2] == 3 && avx512) ck_assert_int_eq(ran, mode);
    ck_assert(ran >= 0 && ran < PE_CONV_CHOICES);
    if (cand == PE_CONV_GEMM) {
      ck_assert_int_eq(pe_dnnl_cache_stats_of(inst->state).reorders, 0);
      ck_assert_uint_eq(r1.runs, r0.runs);
    }
    ph_op_inst_free(inst);
    pe_op_desc_free(op);

    op = ph_op("conv2d_grad", "Input", "x", "Filter", "w", "Output@GRAD", "dout", NULL,
               "Input@GRAD", "dx", "Filter@GRAD", "dw", NULL);
    pe_op_set_ints(op, "paddings", 2, (int64_t[]){p, p});
    inst = ph_op_inst_new(op, &dev);
    PE_CK_OK(ph_op_inst_run(inst, s, NULL));
    PE_CK_OK(ph_op_inst_run(inst, s, NULL));
    ck_assert_int_eq(omp_get_max_threads(), dev.threads);
    snprintf(what, sizeof what, "%s conv dx, case %zu", name, k);
    dt_expect_close(pe_f32(ph_get(s, "dx")), want_dx, nx, 1e-4, what);
    snprintf(what, sizeof what, "%s conv dw, case %zu", name, k);
    dt_expect_close(pe_f32(ph_get(s, "dw")), want_dw, nw, 1e-4, what);
    cache = inst->state;
    ran = cache->e[0].choice;
    if (mode >= 0 && cand != PE_CONV_WINOGRAD) ck_assert_int_eq(ran, mode);
    ck_assert(ran >= 0 && ran < PE_CONV_CHOICES);
    ph_op_inst_free(inst);
    pe_op_desc_free(op);
    free(want);
    free(want_dx);
    free(want_dw);
    pe_scope_free(s);
  }
  pe_device_ctx_destroy(&dev);
  pe_conv_algo_set_mode(PE_CONV_ALGO_TIME);
}
END_TEST

START_TEST(conv_grad_numeric) {
  const char *outs[] = {"out"}, *wrt[] = {"x", "w"};
  /* stride 2, padding 1, dilation 2, groups 2 together. */
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(2, 4, 7, 7), -1, 1, 60);
  ph_set_uniform(s, "w", PE_SHAPE(4, 2, 3, 3), -1, 1, 61);
  pe_op_desc *op = conv_op(2, 1, 2, 2);
  dt_grad_ok(s, op, outs, 1, wrt, 2, 120);
  pe_op_desc_free(op);
  pe_scope_free(s);
  /* A plain one: stride 1, no padding, 3 -> 2 channels. */
  s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(1, 3, 5, 5), -1, 1, 62);
  ph_set_uniform(s, "w", PE_SHAPE(2, 3, 3, 3), -1, 1, 63);
  op = conv_op(1, 0, 1, 1);
  dt_grad_ok(s, op, outs, 1, wrt, 2, 0);
  pe_op_desc_free(op);
  pe_scope_free(s);
}
END_TEST

START_TEST(conv_infer) {
  pe_op_desc *op = conv_op(2, 1, 1, 1);
  dt_var ok[] = {{"x", PE_F32, PE_SHAPE(-1, 3, 32, 32)}, {"w", PE_F32, PE_SHAPE(8, 3, 3, 3)}};
  pe_meta m;
  PE_CK_OK(dt_infer(op, ok, 2, &m));
  expect_shape(&m.shape, PE_SHAPE(-1, 8, 16, 16));
  dt_var bad[] = {{"x", PE_F32, PE_SHAPE(-1, 3, 32, 32)}, {"w", PE_F32, PE_SHAPE(8, 4, 3, 3)}};
  dt_expect_infer_error(op, bad, 2, PE_ESHAPE, "conv2d", "'w'", "[8,4,3,3]", "'x'", "[-1,3,32,32]",
                        NULL);
  dt_var small[] = {{"x", PE_F32, PE_SHAPE(1, 3, 1, 1)}, {"w", PE_F32, PE_SHAPE(8, 3, 5, 5)}};
  dt_expect_infer_error(op, small, 2, PE_ESHAPE, "'x'", "[1,3,1,1]", NULL);
  dt_var rank[] = {{"x", PE_F32, PE_SHAPE(-1, 3, 32)}, {"w", PE_F32, PE_SHAPE(8, 3, 3, 3)}};
  dt_expect_infer_error(op, rank, 2, PE_ESHAPE, "'x'", "[-1,3,32]", NULL);
  dt_var f64[] = {{"x", PE_F64, PE_SHAPE(-1, 3, 32, 32)}, {"w", PE_F32, PE_SHAPE(8, 3, 3, 3)}};
  dt_expect_infer_error(op, f64, 2, PE_EDTYPE, "'x'", "f64", NULL);
  pe_op_set_int(op, "groups", 3); /* 8 filters not divisible by 3 */
  dt_expect_infer_error(op, ok, 2, PE_EATTR, "groups 3", NULL);
  pe_op_set_ints(op, "strides", 3, (int64_t[]){1, 1, 1});
  pe_op_set_int(op, "groups", 1);
  dt_expect_infer_error(op, ok, 2, PE_EATTR, "strides", NULL);
  pe_op_desc_free(op);
}
END_TEST

/* Attributes past int64_t arithmetic (a program's bytes may hold any) are
 * refused, naming them and the shapes, instead of overflowing the size
 * computation: 2 * padding, dilation * (kernel - 1), the filter's input
 * channels * groups. */
START_TEST(conv_infer_huge_attrs) {
  const int64_t huge = INT64_C(1) << 62;
  dt_var ok[] = {{"x", PE_F32, PE_SHAPE(-1, 3, 32, 32)}, {"w", PE_F32, PE_SHAPE(8, 3, 3, 3)}};
  pe_op_desc *op = conv_op(1, huge, 1, 1);
  dt_expect_infer_error(op, ok, 2, PE_EATTR, "conv2d",
                        "paddings [4611686018427387904,4611686018427387904]", "too large",
                        "Input 'x' [-1,3,32,32]", "Filter 'w' [8,3,3,3]", NULL);
  pe_op_desc_free(op);
  op = conv_op(1, 0, huge, 1);
  dt_expect_infer_error(op, ok, 2, PE_EATTR, "dilations [4611686018427387904,", "too large", NULL);
  pe_op_desc_free(op);
  /* Groups that divide a filter of no output channels, whose product with
   * the filter's input channels overflows. */
  dt_var none[] = {{"x", PE_F32, PE_SHAPE(-1, 3, 32, 32)}, {"w", PE_F32, PE_SHAPE(0, 32, 3, 3)}};
  op = conv_op(1, 0, 1, huge);
  dt_expect_infer_error(op, none, 2, PE_ESHAPE, "Filter 'w'", "input channels 3",
                        "groups 4611686018427387904", NULL);
  pe_op_desc_free(op);
}
END_TEST

/* conv2d_grad reuses its entries across calls. */
START_TEST(conv_grad_entries_reused) {
  pe_device_ctx dev;
  PE_CK_OK(pe_device_ctx_init(&dev, pe_cpu_place(), 0));
  pe_device_ctx_bind(&dev);
  pe_scope *s = pe_scope_new(NULL);
  ph_set_uniform(s, "x", PE_SHAPE(2, 2, 6, 6), -1, 1, 90);
  ph_set_uniform(s, "w", PE_SHAPE(4, 2, 3, 3), -1, 1, 91);
  ph_set_uniform(s, "dout", PE_SHAPE(2, 4, 3, 3), -1, 1, 92);
  pe_op_desc *op = ph_op("conv2d_grad", "Input", "x", "Filter", "w", "Output@GRAD", "dout", NULL,
                         "Input@GRAD", "dx", "Filter@GRAD", "dw", NULL);
  pe_op_set_ints(op, "strides", 2, (int64_t[]){2, 2});
  pe_op_set_ints(op, "paddings", 2, (int64_t[]){1, 1});
  ph_op_inst *inst = ph_op_inst_new(op, &dev);
  for (int i = 0; i < 3; i++) PE_CK_OK(ph_op_inst_run(inst, s, NULL));
  pe_dnnl_cache_stats st = pe_dnnl_cache_stats_of(inst->state);
  ck_assert_uint_eq(st.builds, 1);
  ck_assert_uint_eq(st.hits, 2);
  ph_op_inst_free(inst);
  pe_op_desc_free(op);

  pe_scope_free(s);
  pe_device_ctx_destroy(&dev);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ops_dnnl_conv");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, conv_sobel_written_out);
  tcase_add_test(tc, conv_groups_written_out);
  tcase_add_test(tc, conv_matches_reference);
  tcase_add_test(tc, conv_grad_numeric);
  tcase_add_test(tc, conv_blocked_layouts_match_reference);
  tcase_add_test(tc, conv_algo_chooser_rule);
  tcase_add_loop_test(tc, conv_each_algorithm_matches_reference, 0, PE_CONV_CHOICES + 1);
  tcase_add_test(tc, conv_infer);
  tcase_add_test(tc, conv_infer_huge_attrs);
  tcase_add_test(tc, conv_grad_entries_reused);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
