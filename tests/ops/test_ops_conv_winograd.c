/* pe's Winograd F(2x2, 5x5) and F(4x4, 3x3) (ops/cpu/conv_winograd.h): the kernel against
 * a convolution written out in loops (forward, data and weights gradients; both
 * channel blocks; odd sizes, uneven paddings, several chunks), the same
 * bits on one and two threads, the shapes it refuses; and conv2d /
 * conv2d_grad in the default algorithm against direct: within rounding,
 * and where oneDNN runs at AVX2 (ONEDNN_MAX_CPU_ISA=AVX2) not the same
 * bits, so the Winograd ran; elsewhere the same bits, so it did not. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "op_harness.h"
#include "ops/cpu/conv_algo.h"
#include "ops/cpu/conv_winograd.h"
#include "ops/cpu/dnnl_act_layout.h"
#include "test_assert.h"

static bool cpu_has_avx2(void) {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* The kernels' widths and the layouts' blocks they run on here: AVX2 on
 * both blocks, AVX-512 on 16 where the CPU has it. */
typedef struct variant {
  int lanes;
  int64_t block;
} variant;
static const variant variants[] = {{8, 8}, {8, 16}, {16, 16}};
#define NVARIANTS (int)(sizeof variants / sizeof *variants)

static bool variant_runs(const variant *v) {
  return v->lanes == 8 ? cpu_has_avx2() : __builtin_cpu_supports("avx512f");
}

static float *uniform(int64_t n, unsigned seed) {
  float *p = malloc((size_t)n * sizeof *p);
  srand(seed);
  for (int64_t i = 0; i < n; i++) p[i] = (float)rand() / RAND_MAX * 2 - 1;
  return p;
}

/* Plain NCHW <-> blocked with block b, C a multiple of b. */
static void relayout(const float *src, float *dst, int64_t n, int64_t c, int64_t hw, int64_t b,
                     bool to_blocked) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t k = 0; k < c; k++)
      for (int64_t q = 0; q < hw; q++) {
        int64_t p = (i * c + k) * hw + q, bl = ((i * (c / b) + k / b) * hw + q) * b + k % b;
        if (to_blocked)
          dst[bl] = src[p];
        else
          dst[p] = src[bl];
      }
}

typedef struct shape5 {
  int r; /* the filter's size, 3 or 5 */
  int64_t n, cin, h, w, cout, ph, pw;
} shape5;

/* y[n][o][i][j] = b[o] + Σ x[n][c][i + kh - ph][j + kw - pw] f[o][c][kh][kw]
 * (plain, double sums). */
static void ref_fwd(const shape5 *s, const float *x, const float *f, const float *b, float *y) {
  int64_t oh = s->h + 2 * s->ph - (s->r - 1), ow = s->w + 2 * s->pw - (s->r - 1);
  for (int64_t n = 0; n < s->n; n++)
    for (int64_t o = 0; o < s->cout; o++)
      for (int64_t i = 0; i < oh; i++)
        for (int64_t j = 0; j < ow; j++) {
          double acc = b ? b[o] : 0;
          for (int64_t c = 0; c < s->cin; c++)
            for (int kh = 0; kh < s->r; kh++)
              for (int kw = 0; kw < s->r; kw++) {
                int64_t r = i + kh - s->ph, q = j + kw - s->pw;
                if (r < 0 || r >= s->h || q < 0 || q >= s->w) continue;
                acc += (double)x[((n * s->cin + c) * s->h + r) * s->w + q] *
                       f[((o * s->cin + c) * s->r + kh) * s->r + kw];
              }
          y[((n * s->cout + o) * oh + i) * ow + j] = (float)acc;
        }
}

/* dx[n][c][r][q] = Σ dy[n][o][r - kh + ph][q - kw + pw] f[o][c][kh][kw]. */
static void ref_data_grad(const shape5 *s, const float *dy, const float *f, float *dx) {
  int64_t oh = s->h + 2 * s->ph - (s->r - 1), ow = s->w + 2 * s->pw - (s->r - 1);
  for (int64_t n = 0; n < s->n; n++)
    for (int64_t c = 0; c < s->cin; c++)
      for (int64_t r = 0; r < s->h; r++)
        for (int64_t q = 0; q < s->w; q++) {
          double acc = 0;
          for (int64_t o = 0; o < s->cout; o++)
            for (int kh = 0; kh < s->r; kh++)
              for (int kw = 0; kw < s->r; kw++) {
                int64_t i = r - kh + s->ph, j = q - kw + s->pw;
                if (i < 0 || i >= oh || j < 0 || j >= ow) continue;
                acc += (double)dy[((n * s->cout + o) * oh + i) * ow + j] *
                       f[((o * s->cin + c) * s->r + kh) * s->r + kw];
              }
          dx[((n * s->cin + c) * s->h + r) * s->w + q] = (float)acc;
        }
}

/* dw[o][c][kh][kw] = Σ dy[n][o][i][j] x[n][c][i + kh - ph][j + kw - pw];
 * mag: the same sum of the terms' magnitudes (the rounding's scale). */
static void ref_weights_grad(const shape5 *s, const float *x, const float *dy, float *dw,
                             double *mag) {
  int64_t oh = s->h + 2 * s->ph - (s->r - 1), ow = s->w + 2 * s->pw - (s->r - 1);
  for (int64_t o = 0; o < s->cout; o++)
    for (int64_t c = 0; c < s->cin; c++)
      for (int kh = 0; kh < s->r; kh++)
        for (int kw = 0; kw < s->r; kw++) {
          double acc = 0, abs = 0;
          for (int64_t n = 0; n < s->n; n++)
            for (int64_t i = 0; i < oh; i++)
              for (int64_t j = 0; j < ow; j++) {
                int64_t r = i + kh - s->ph, q = j + kw - s->pw;
                if (r < 0 || r >= s->h || q < 0 || q >= s->w) continue;
                double t = (double)dy[((n * s->cout + o) * oh + i) * ow + j] *
                           x[((n * s->cin + c) * s->h + r) * s->w + q];
                acc += t, abs += fabs(t);
              }
          int64_t at = ((o * s->cin + c) * s->r + kh) * s->r + kw;
          dw[at] = (float)acc, mag[at] = abs;
        }
}

/* got (plain) against want: within tol of the largest |want|. */
static void expect_close(const float *got, const float *want, int64_t n, double tol,
                         const char *what, const shape5 *s, const variant *va) {
  double big = 0;
  for (int64_t i = 0; i < n; i++) big = fmax(big, fabs(want[i]));
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(fabs(got[i] - want[i]) <= tol * big,
                  "%s %dx%d [%lld,%lld,%lld,%lld] -> %lld, pad %lld,%lld, %d lanes, block %lld: "
                  "[%lld] = %g, want %g (largest %g)",
                  what, s->r, s->r, (long long)s->n, (long long)s->cin, (long long)s->h,
                  (long long)s->w, (long long)s->cout, (long long)s->ph, (long long)s->pw,
                  va->lanes, (long long)va->block, (long long)i, got[i], want[i], big);
}

/* The kernel's forward (with bias) or data gradient of s, in variant va,
 * on `threads`, into a plain result; NULL where the plan refuses the
 * channels. */
static float *wino(const shape5 *s, bool data_grad, const float *in_plain, const float *f,
                   const float *bias, const variant *va, int threads) {
  int64_t b = va->block;
  int64_t oh = s->h + 2 * s->ph - (s->r - 1), ow = s->w + 2 * s->pw - (s->r - 1);
  int64_t in4[4] = {s->n, s->cin, s->h, s->w}, cout = s->cout, rows = oh, cols = ow;
  int64_t ph = s->ph, pw = s->pw;
  if (data_grad) {
    in4[1] = s->cout, in4[2] = oh, in4[3] = ow;
    cout = s->cin, rows = s->h, cols = s->w, ph = s->r - 1 - s->ph, pw = s->r - 1 - s->pw;
  }
  pe_act_plane in = {in4[1], in4[2] * in4[3], b}, out = {cout, rows * cols, b};
  pe_wino g;
  bool runs = cout % (2 * va->lanes) == 0 && in4[1] % va->lanes == 0;
  ck_assert_int_eq(pe_wino_plan(&g, va->lanes, s->r, in4, cout, rows, cols, ph, pw, in, out), runs);
  if (!runs) return NULL;
  int64_t nin = in4[0] * in4[1] * in4[2] * in4[3], nout = s->n * cout * rows * cols;
  float *xb = malloc((size_t)nin * sizeof(float)), *yb = malloc((size_t)nout * sizeof(float));
  float *y = malloc((size_t)nout * sizeof(float));
  float *u = malloc(pe_wino_filter_floats(&g) * sizeof(float));
  float *scratch = malloc(pe_wino_scratch_floats(&g, threads) * sizeof(float));
  relayout(in_plain, xb, in4[0], in4[1], in4[2] * in4[3], b, true);
  for (int64_t i = 0; i < nout; i++) yb[i] = NAN; /* every output is written */
  pe_wino_filter(&g, f, data_grad, u, threads);
  pe_wino_run(&g, xb, u, bias, yb, scratch, threads);
  relayout(yb, y, s->n, cout, rows * cols, b, false);
  free(xb), free(yb), free(u), free(scratch);
  return y;
}

/* The kernel's weights gradient of s (blocks b) on `threads`. */
static float *wino_wgrad(const shape5 *s, const float *x_plain, const float *dy_plain,
                         const variant *va, int threads) {
  int64_t b = va->block;
  int64_t oh = s->h + 2 * s->ph - (s->r - 1), ow = s->w + 2 * s->pw - (s->r - 1);
  int64_t in4[4] = {s->n, s->cin, s->h, s->w};
  pe_act_plane in = {s->cin, s->h * s->w, b}, out = {s->cout, oh * ow, b};
  pe_wino g;
  if (!pe_wino_plan(&g, va->lanes, s->r, in4, s->cout, oh, ow, s->ph, s->pw, in, out)) {
    ck_assert(s->cin % va->lanes || s->cout % (2 * va->lanes));
    return NULL;
  }
  int64_t nx = s->n * s->cin * s->h * s->w, ny = s->n * s->cout * oh * ow;
  float *xb = malloc((size_t)nx * sizeof(float)), *dyb = malloc((size_t)ny * sizeof(float));
  float *dw = malloc((size_t)(s->cout * s->cin * s->r * s->r) * sizeof(float));
  float *scratch = malloc(pe_wino_wgrad_scratch_floats(&g, threads) * sizeof(float));
  relayout(x_plain, xb, s->n, s->cin, s->h * s->w, b, true);
  relayout(dy_plain, dyb, s->n, s->cout, oh * ow, b, true);
  for (int64_t i = 0; i < s->cout * s->cin * s->r * s->r; i++)
    dw[i] = NAN; /* every one is written */
  pe_wino_weights_grad(&g, xb, dyb, dw, scratch, threads);
  free(xb), free(dyb), free(scratch);
  return dw;
}

static const shape5 shapes[] = {
    {5, 2, 8, 7, 7, 16, 2, 2},      /* odd output: partial tiles */
    {5, 3, 16, 9, 6, 32, 1, 3},     /* uneven paddings */
    {5, 1, 32, 14, 14, 64, 2, 2},   /* the CNN's second convolution, one image */
    {5, 2, 24, 5, 5, 16, 0, 0},     /* a 1x1 output */
    {5, 1, 8, 3, 4, 16, 4, 4},      /* padding 4: rows of zeros only */
    {5, 1, 128, 20, 20, 128, 2, 2}, /* several chunks per image */
    {3, 2, 8, 7, 7, 16, 1, 1},      /* 3x3: partial 4x4 tiles */
    {3, 3, 16, 9, 6, 32, 0, 2},     /* uneven paddings */
    {3, 1, 16, 28, 28, 16, 1, 1},   /* the resnet's first stage, one image */
    {3, 2, 64, 7, 7, 64, 1, 1},     /* its last stage */
    {3, 1, 8, 1, 1, 16, 1, 1},      /* a 1x1 image */
    {3, 1, 128, 20, 20, 128, 1, 1}, /* several chunks per image */
};

START_TEST(kernel_matches_loops) {
  if (!cpu_has_avx2()) return; /* the kernel needs AVX2 and FMA */
  for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
    const shape5 *s = &shapes[k];
    int64_t oh = s->h + 2 * s->ph - (s->r - 1), ow = s->w + 2 * s->pw - (s->r - 1);
    int64_t nx = s->n * s->cin * s->h * s->w, ny = s->n * s->cout * oh * ow;
    float *x = uniform(nx, 1 + k), *f = uniform(s->cout * s->cin * s->r * s->r, 2 + k);
    float *b = uniform(s->cout, 3 + k), *dy = uniform(ny, 4 + k);
    float *y = malloc((size_t)ny * sizeof *y), *dx = malloc((size_t)nx * sizeof *dx);
    ref_fwd(s, x, f, b, y);
    ref_data_grad(s, dy, f, dx);
    for (int vi = 0; vi < NVARIANTS; vi++) {
      const variant *va = &variants[vi];
      int64_t blk = va->block;
      if (!variant_runs(va) || s->cin % blk || s->cout % blk) continue;
      float *got = wino(s, false, x, f, b, va, 2); /* NULL where the channels do not fit */
      if (got) expect_close(got, y, ny, 2e-6 * s->cin, "forward", s, va);
      ck_assert(got || s->cin % va->lanes || s->cout % (2 * va->lanes));
      free(got);
      got = wino(s, true, dy, f, NULL, va, 2);
      if (got) expect_close(got, dx, nx, 2e-6 * s->cout, "data gradient", s, va);
      ck_assert(got || s->cout % va->lanes || s->cin % (2 * va->lanes));
      free(got);
    }
    free(x), free(f), free(b), free(dy), free(y), free(dx);
  }
}
END_TEST

/* The weights gradient: each filter element within 1e-5 of the sum of its
 * terms' magnitudes plus the largest element (Winograd's transforms mix the
 * elements, so a small one rounds on the scale of the large ones; seen up
 * to 4e-6 and 6e-7 of those). */
START_TEST(kernel_weights_grad_matches_loops) {
  if (!cpu_has_avx2()) return;
  for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
    const shape5 *s = &shapes[k];
    int64_t oh = s->h + 2 * s->ph - (s->r - 1), ow = s->w + 2 * s->pw - (s->r - 1),
            nw = s->cout * s->cin * s->r * s->r;
    float *x = uniform(s->n * s->cin * s->h * s->w, 21 + k);
    float *dy = uniform(s->n * s->cout * oh * ow, 22 + k);
    float *want = malloc((size_t)nw * sizeof *want);
    double *mag = malloc((size_t)nw * sizeof *mag);
    ref_weights_grad(s, x, dy, want, mag);
    double big = 0;
    for (int64_t i = 0; i < nw; i++) big = fmax(big, fabs(want[i]));
    for (int vi = 0; vi < NVARIANTS; vi++) {
      const variant *va = &variants[vi];
      int64_t blk = va->block;
      if (!variant_runs(va) || s->cin % blk || s->cout % blk) continue;
      float *got = wino_wgrad(s, x, dy, va, 2);
      if (!got) continue; /* the plan refused the channels (wino_wgrad checks why) */
      for (int64_t i = 0; i < nw; i++)
        ck_assert_msg(fabs(got[i] - want[i]) <= 1e-5 * (mag[i] + big),
                      "weights gradient, shape %zu, %d lanes, block %lld: [%lld] = %g, want %g "
                      "(terms' magnitude %g)",
                      k, va->lanes, (long long)blk, (long long)i, got[i], want[i], mag[i]);
      free(got);
    }
    free(x), free(dy), free(want), free(mag);
  }
}
END_TEST

/* Images (and chunks) are split among the threads, each computed alike. */
START_TEST(kernel_same_bits_on_one_and_two_threads) {
  if (!cpu_has_avx2()) return;
  for (int k = 5; k < 12; k += 6) { /* the 5x5 and 3x3 shapes of several chunks */
    const shape5 *s = &shapes[k];
    int64_t nx = s->n * s->cin * s->h * s->w;
    float *x = uniform(nx, 11), *f = uniform(s->cout * s->cin * s->r * s->r, 12);
    float *b = uniform(s->cout, 13);
    const variant *va = &variants[0];
    float *one = wino(s, false, x, f, b, va, 1), *two = wino(s, false, x, f, b, va, 2);
    int64_t ny = s->n * s->cout * (s->h + 2 * s->ph - (s->r - 1)) * (s->w + 2 * s->pw - (s->r - 1));
    ck_assert(memcmp(one, two, (size_t)ny * sizeof(float)) == 0);
    float *dy = uniform(ny, 14), *w1 = wino_wgrad(s, x, dy, va, 1),
          *w2 = wino_wgrad(s, x, dy, va, 2);
    ck_assert(memcmp(w1, w2, (size_t)(s->cout * s->cin * s->r * s->r) * sizeof(float)) == 0);
    free(x), free(f), free(b), free(one), free(two), free(dy), free(w1), free(w2);
  }
}
END_TEST

START_TEST(plan_refuses_what_it_cannot_run) {
  pe_act_plane b8 = {16, 49, 8}, plain = {16, 49, 1};
  pe_wino g;
  int64_t in[4] = {1, 16, 7, 7};
  ck_assert(pe_wino_plan(&g, 8, 5, in, 16, 7, 7, 2, 2, b8, b8));
  ck_assert(g.chunk > 0 && g.chunk % 6 == 0 && g.m == 2);
  ck_assert(pe_wino_plan(&g, 8, 3, in, 16, 7, 7, 1, 1, b8, b8) && g.m == 4);
  ck_assert(!pe_wino_plan(&g, 8, 5, in, 16, 7, 7, 2, 2, plain, b8)); /* plain input */
  ck_assert(!pe_wino_plan(&g, 8, 5, in, 16, 7, 7, 2, 2, b8, plain)); /* plain output */
  ck_assert(!pe_wino_plan(&g, 8, 5, in, 8, 7, 7, 2, 2, b8, b8));     /* Cout not a multiple of 16 */
  ck_assert(!pe_wino_plan(&g, 8, 5, in, 16, 8, 7, 2, 2, b8, b8));    /* not a 5x5 output size */
  ck_assert(!pe_wino_plan(&g, 8, 5, in, 16, 9, 9, 5, 5, b8, b8));    /* padding past 4 */
  ck_assert(!pe_wino_plan(&g, 8, 3, in, 16, 11, 11, 3, 3, b8, b8));  /* 3x3: padding past 2 */
  ck_assert(!pe_wino_plan(&g, 8, 4, in, 16, 6, 6, 1, 1, b8, b8));    /* neither 3 nor 5 */
  int64_t wide[4] = {1, 1024, 7, 7}; /* 36 x 1024 x 512 transformed floats: 72 MiB */
  ck_assert(!pe_wino_plan(&g, 8, 3, wide, 512, 7, 7, 1, 1, b8, b8));
  ck_assert(pe_wino_plan(&g, 8, 3, wide, 256, 7, 7, 1, 1, b8, b8)); /* 36 MiB */
  ck_assert(!pe_wino_plan(&g, 7, 5, in, 16, 7, 7, 2, 2, b8, b8));   /* no such width */
  int64_t in16[4] = {1, 16, 7, 7};
  pe_act_plane b16 = {16, 49, 16};
  if (__builtin_cpu_supports("avx512f")) {
    ck_assert(pe_wino_plan(&g, 16, 5, in16, 32, 7, 7, 2, 2, b16, b16));
    ck_assert(!pe_wino_plan(&g, 16, 5, in16, 16, 7, 7, 2, 2, b16, b16)); /* Cout not 32k */
    ck_assert(!pe_wino_plan(&g, 16, 5, in16, 32, 7, 7, 2, 2, b8, b16));  /* 8-channel blocks */
  }
  int64_t odd[4] = {1, 12, 7, 7};
  ck_assert(!pe_wino_plan(&g, 8, 5, odd, 16, 7, 7, 2, 2, b8, b8)); /* Cin not a multiple of 8 */
}
END_TEST

static pe_op_desc *conv_r(bool grad, int r) {
  pe_op_desc *op =
      grad ? ph_op("conv2d_grad", "Input", "x", "Filter", "w", "Bias", "b", "Output", "y",
                   "Output@GRAD", "dy", NULL, "Input@GRAD", "dx", "Filter@GRAD", "dw", "Bias@GRAD",
                   "db", NULL)
           : ph_op("conv2d", "Input", "x", "Filter", "w", "Bias", "b", NULL, "Output", "y", NULL);
  pe_op_set_ints(op, "paddings", 2, (int64_t[]){r / 2, r / 2});
  pe_op_set_string(op, "fuse_activation", "relu");
  /* every activation blocked: Input (bit 0); Output and Output@GRAD (3, 4)
   * or the forward's Output; Input@GRAD */
  pe_op_set_int(
      op, PE_LAYOUT_ATTR,
      grad ? 1 | 3 << 3 | (int64_t)1 << PE_LAYOUT_OUT_BIT : 1 | (int64_t)1 << PE_LAYOUT_OUT_BIT);
  return op;
}

/* The forward's Output of the last run_conv. */
static pe_tensor y_fwd_copy;

/* Runs conv2d and conv2d_grad (32 -> 32 channels: every pass fits both
 * vector widths) in mode; returns the scope, its "y" the
 * gradient's input (the forward's output is in y_fwd_copy). */
static pe_scope *run_conv(int mode, int r) {
  pe_conv_algo_set_mode(mode);
  pe_scope *s = pe_scope_new(NULL);
  pe_shape xs = PE_SHAPE(2, 32, 9, 9), ys = PE_SHAPE(2, 32, 9, 9);
  ph_set_uniform(s, "x", xs, -1, 1, 3);
  ph_set_uniform(s, "w", PE_SHAPE(32, 32, r, r), -0.2f, 0.2f, 4);
  ph_set_uniform(s, "b", PE_SHAPE(32), -0.1f, 0.1f, 5);
  ph_set_uniform(s, "dy", ys, -1, 1, 6);
  pe_op_desc *f = conv_r(false, r), *g = conv_r(true, r);
  PE_CK_OK(ph_run_op(s, f, NULL));
  /* The gradient's relu mask from the same Output in both modes (the
   * forward's rounding could move an output across 0). */
  pe_tensor *y = ph_get(s, "y");
  pe_tensor_init(&y_fwd_copy);
  PE_CK_OK(pe_tensor_copy(&y_fwd_copy, y, "y"));
  ph_set_uniform(s, "y", ys, -1, 1, 7);
  PE_CK_OK(ph_run_op(s, g, NULL));
  pe_op_desc_free(f);
  pe_op_desc_free(g);
  return s;
}

static bool same_bits(pe_scope *a, pe_scope *b, const char *name) {
  const pe_tensor *x = ph_get(a, name), *y = ph_get(b, name);
  return !memcmp(x->data, y->data, (size_t)pe_tensor_numel(x) * sizeof(float));
}

static void expect_near(pe_scope *a, pe_scope *b, const char *name, double tol) {
  const pe_tensor *x = ph_get(a, name), *y = ph_get(b, name);
  const float *p = pe_f32(x), *q = pe_f32(y);
  double big = 0;
  for (int64_t i = 0; i < pe_tensor_numel(x); i++) big = fmax(big, fabs(q[i]));
  for (int64_t i = 0; i < pe_tensor_numel(x); i++)
    ck_assert_msg(fabs(p[i] - q[i]) <= tol * big, "%s[%lld]: default %g, direct %g", name,
                  (long long)i, p[i], q[i]);
}

START_TEST(default_runs_winograd_where_onednn_is_avx2) {
  for (int r = 3; r <= 5; r += 2) {
    pe_scope *def = run_conv(PE_CONV_ALGO_DEFAULT, r);
    ph_set_f32(def, "y_fwd", y_fwd_copy.shape, pe_f32(&y_fwd_copy));
    pe_tensor_release(&y_fwd_copy);
    pe_scope *dir = run_conv(PE_CONV_DIRECT, r);
    ph_set_f32(dir, "y_fwd", y_fwd_copy.shape, pe_f32(&y_fwd_copy));
    pe_tensor_release(&y_fwd_copy);
    expect_near(def, dir, "y_fwd", 1e-5);
    expect_near(def, dir, "dx", 1e-5);
    expect_near(def, dir, "dw", 1e-5);
    expect_near(def, dir, "db", 1e-5);
    bool wino = pe_wino_takes(pe_wino_lanes(), r);
    ck_assert_msg(same_bits(def, dir, "y_fwd") != wino && same_bits(def, dir, "dx") != wino &&
                      same_bits(def, dir, "dw") != wino,
                  "%dx%d: pe's Winograd %s, yet the default's results are %s direct's", r, r,
                  wino ? "applies" : "does not apply", wino ? "the same bits as" : "not those of");
    pe_scope_free(def);
    pe_scope_free(dir);
  }
  pe_conv_algo_set_mode(PE_CONV_ALGO_DEFAULT);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ops_conv_winograd");
  TCase *tc = tcase_create("winograd");
  tcase_add_test(tc, kernel_matches_loops);
  tcase_add_test(tc, kernel_weights_grad_matches_loops);
  tcase_add_test(tc, kernel_same_bits_on_one_and_two_threads);
  tcase_add_test(tc, plan_refuses_what_it_cannot_run);
  tcase_add_test(tc, default_runs_winograd_where_onednn_is_avx2);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(suite)
