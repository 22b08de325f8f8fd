/* Winograd F(2x2, 5x5) and F(4x4, 3x3) on AVX2 (contract in
 * conv_winograd.h).
 *
 * With the points 0, 1, -1, 2, -2 and infinity, an m x m output tile is
 *   Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A
 * for a 6x6 input tile d and an r x r filter g (m = 7 - r); Bᵀ is the same
 * for both, G and Aᵀ below. The work of
 * one image is cut into chunks of output tiles; a chunk's transformed input
 * V[ξ][tile][cin] and products M[tile][ξ][cout] stay in the thread's
 * scratch (sized for the L2 cache), so each image is read and written once.
 * Every vector holds 8 consecutive channels, which both blocked layouts
 * store contiguously. */
#include "ops/cpu/conv_winograd.h"

#include <immintrin.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <string.h>

enum { WA = 6, RMAX = 5, MMAX = 4, XI = WA * WA, LANES = 8, ROWS = 6, COLS = 16 };

/* Scratch floats per thread the chunk size aims at: V and M within 768 KiB. */
#define WINO_SCRATCH_TARGET (192 * 1024)

/* The transformed filters hold 36 / r² of the filters' size (4x for 3x3);
 * past 64 MiB of them oneDNN's direct kernels run instead. */
#define WINO_FILTER_FLOATS_MAX ((int64_t)16 << 20)

/* G (6 x r) of F(2x2, 5x5) and F(4x4, 3x3); Aᵀ (m x 6) of each. */
static const float wino_g5[WA][5] = {
    {1 / 4.f, 0, 0, 0, 0},
    {-1 / 6.f, -1 / 6.f, -1 / 6.f, -1 / 6.f, -1 / 6.f},
    {-1 / 6.f, 1 / 6.f, -1 / 6.f, 1 / 6.f, -1 / 6.f},
    {1 / 24.f, 1 / 12.f, 1 / 6.f, 1 / 3.f, 2 / 3.f},
    {1 / 24.f, -1 / 12.f, 1 / 6.f, -1 / 3.f, 2 / 3.f},
    {0, 0, 0, 0, 1},
};
static const float wino_g3[WA][3] = {
    {1 / 4.f, 0, 0},
    {-1 / 6.f, -1 / 6.f, -1 / 6.f},
    {-1 / 6.f, 1 / 6.f, -1 / 6.f},
    {1 / 24.f, 1 / 12.f, 1 / 6.f},
    {1 / 24.f, -1 / 12.f, 1 / 6.f},
    {0, 0, 1},
};
static const float wino_at2[2][WA] = {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 1}};
static const float wino_at4[4][WA] = {
    {1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}};

/* G[a][j] and Aᵀ[i][a] of g's variant. */
static float g_at(const pe_wino *g, int a, int j) {
  return g->r == 5 ? wino_g5[a][j] : wino_g3[a][j];
}
static float at_at(const pe_wino *g, int i, int a) {
  return g->m == 2 ? wino_at2[i][a] : wino_at4[i][a];
}

bool pe_wino_available(void) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return false;
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  return (isa & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2 &&
         (isa & dnnl_cpu_isa_avx512_core) != dnnl_cpu_isa_avx512_core &&
         (isa & dnnl_cpu_isa_avx512_mic) != dnnl_cpu_isa_avx512_mic;
}

static int64_t tiles_of(const pe_wino *g) {
  return ((g->oh + g->m - 1) / g->m) * ((g->ow + g->m - 1) / g->m);
}

static int64_t round6(int64_t v) {
  return (v + ROWS - 1) / ROWS * ROWS;
}

bool pe_wino_plan(pe_wino *g, int r, const int64_t in[4], int64_t cout, int64_t oh, int64_t ow,
                  int64_t pad_h, int64_t pad_w, pe_act_plane in_plane, pe_act_plane out_plane) {
  memset(g, 0, sizeof *g);
  if (r != 3 && r != 5) return false;
  if (in[1] <= 0 || in[1] % LANES || cout <= 0 || cout % COLS) return false;
  if (in[1] > WINO_FILTER_FLOATS_MAX / XI / cout) return false;
  if (pad_h < 0 || pad_h > r - 1 || pad_w < 0 || pad_w > r - 1) return false;
  if (oh != in[2] + 2 * pad_h - (r - 1) || ow != in[3] + 2 * pad_w - (r - 1) || oh < 1 || ow < 1)
    return false;
  if ((in_plane.block != 8 && in_plane.block != 16) ||
      (out_plane.block != 8 && out_plane.block != 16))
    return false;
  *g = (pe_wino){.r = r,
                 .m = WA + 1 - r,
                 .n = in[0],
                 .cin = in[1],
                 .h = in[2],
                 .w = in[3],
                 .cout = cout,
                 .oh = oh,
                 .ow = ow,
                 .pad_h = pad_h,
                 .pad_w = pad_w,
                 .in = in_plane,
                 .out = out_plane};
  int64_t t = tiles_of(g), per_tile = XI * (g->cin + g->cout);
  int64_t chunk = WINO_SCRATCH_TARGET / per_tile / ROWS * ROWS;
  if (chunk < ROWS) chunk = ROWS;
  if (chunk > round6(t)) chunk = round6(t);
  int64_t nchunks = (t + chunk - 1) / chunk;
  g->chunk = round6((t + nchunks - 1) / nchunks); /* the chunks alike */
  return true;
}

size_t pe_wino_filter_floats(const pe_wino *g) {
  return (size_t)(XI * g->cin * g->cout);
}

size_t pe_wino_scratch_floats(const pe_wino *g, int threads) {
  return (size_t)threads * (size_t)(XI * g->chunk * (g->cin + g->cout));
}

/* u[ξ][i][o0..o0+7] for input channel i and 8 output channels from o0:
 * G f Gᵀ. */
__attribute__((target("avx2,fma"))) static void filter_block(const pe_wino *g, const float *w,
                                                             bool data_grad, float *u, int64_t i,
                                                             int64_t o0) {
  const int r = g->r, rr = r * r;
  __m256 f[RMAX][RMAX], t[WA][RMAX];
  for (int j = 0; j < r; j++)
    for (int k = 0; k < r; k++) {
      float v[LANES];
      for (int l = 0; l < LANES; l++) {
        int64_t o = o0 + l;
        v[l] = data_grad ? w[(i * g->cout + o) * rr + (r - 1 - j) * r + (r - 1 - k)]
                         : w[(o * g->cin + i) * rr + j * r + k];
      }
      f[j][k] = _mm256_loadu_ps(v);
    }
  for (int a = 0; a < WA; a++)
    for (int k = 0; k < r; k++) {
      __m256 s = _mm256_setzero_ps();
      for (int j = 0; j < r; j++)
        if (g_at(g, a, j) != 0) s = _mm256_fmadd_ps(_mm256_set1_ps(g_at(g, a, j)), f[j][k], s);
      t[a][k] = s;
    }
  for (int a = 0; a < WA; a++)
    for (int b = 0; b < WA; b++) {
      __m256 s = _mm256_setzero_ps();
      for (int k = 0; k < r; k++)
        if (g_at(g, b, k) != 0) s = _mm256_fmadd_ps(t[a][k], _mm256_set1_ps(g_at(g, b, k)), s);
      _mm256_storeu_ps(u + ((a * WA + b) * g->cin + i) * g->cout + o0, s);
    }
}

void pe_wino_filter(const pe_wino *g, const float *w, bool data_grad, float *u, int threads) {
  int64_t oblocks = g->cout / LANES, items = g->cin * oblocks;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t it = 0; it < items; it++)
    filter_block(g, w, data_grad, u, it / oblocks, it % oblocks * LANES);
}

/* Bᵀ applied along one axis of a 6x6 tile: out[k] = Σ_j Bᵀ[k][j] in[j]. */
#define WINO_BT(d0, d1, d2, d3, d4, d5, o0, o1, o2, o3, o4, o5)                             \
  do {                                                                                      \
    __m256 f4_ = _mm256_set1_ps(4.f), f5_ = _mm256_set1_ps(5.f), f2_ = _mm256_set1_ps(2.f); \
    o0 = _mm256_add_ps(_mm256_fnmadd_ps(f5_, d2, _mm256_mul_ps(f4_, d0)), d4);              \
    __m256 a_ = _mm256_fnmadd_ps(f4_, d2, d4), b_ = _mm256_fnmadd_ps(f4_, d1, d3);          \
    o1 = _mm256_add_ps(a_, b_);                                                             \
    o2 = _mm256_sub_ps(a_, b_);                                                             \
    __m256 c_ = _mm256_sub_ps(d4, d2), e_ = _mm256_mul_ps(f2_, _mm256_sub_ps(d3, d1));      \
    o3 = _mm256_add_ps(c_, e_);                                                             \
    o4 = _mm256_sub_ps(c_, e_);                                                             \
    o5 = _mm256_add_ps(_mm256_fnmadd_ps(f5_, d3, _mm256_mul_ps(f4_, d1)), d5);              \
  } while (0)

/* Aᵀ applied along one axis: y0 = m0 + m1 + m2 + m3 + m4, y1 = m1 - m2 +
 * 2 (m3 - m4) + m5. */
#define WINO_AT(m0, m1, m2, m3, m4, m5, y0, y1)                            \
  do {                                                                     \
    __m256 p_ = _mm256_add_ps(m1, m2), q_ = _mm256_sub_ps(m1, m2);         \
    __m256 p2_ = _mm256_add_ps(m3, m4), q2_ = _mm256_sub_ps(m3, m4);       \
    y0 = _mm256_add_ps(_mm256_add_ps(m0, p_), p2_);                        \
    y1 = _mm256_add_ps(_mm256_fmadd_ps(_mm256_set1_ps(2.f), q2_, q_), m5); \
  } while (0)

/* Aᵀ of F(4x4, 3x3) along one axis: y0 = m0 + m1 + m2 + m3 + m4,
 * y1 = (m1 - m2) + 2 (m3 - m4), y2 = (m1 + m2) + 4 (m3 + m4),
 * y3 = (m1 - m2) + 8 (m3 - m4) + m5. */
#define WINO_AT4(m0, m1, m2, m3, m4, m5, y0, y1, y2, y3)                   \
  do {                                                                     \
    __m256 p_ = _mm256_add_ps(m1, m2), q_ = _mm256_sub_ps(m1, m2);         \
    __m256 p2_ = _mm256_add_ps(m3, m4), q2_ = _mm256_sub_ps(m3, m4);       \
    y0 = _mm256_add_ps(_mm256_add_ps(m0, p_), p2_);                        \
    y1 = _mm256_fmadd_ps(_mm256_set1_ps(2.f), q2_, q_);                    \
    y2 = _mm256_fmadd_ps(_mm256_set1_ps(4.f), p2_, p_);                    \
    y3 = _mm256_add_ps(_mm256_fmadd_ps(_mm256_set1_ps(8.f), q2_, q_), m5); \
  } while (0)

/* V[ξ][t][cin] for the chunk's tiles [t0, t0 + chunk) of image x (tiles
 * past the image's last are zero). */
__attribute__((target("avx2,fma"))) static void input_tiles(const pe_wino *g, const float *x,
                                                            int64_t n, int64_t t0, float *v) {
  int64_t tw_n = (g->ow + g->m - 1) / g->m, tiles = tiles_of(g), chunk = g->chunk, cin = g->cin;
  for (int64_t t = 0; t < chunk; t++) {
    int64_t tg = t0 + t;
    if (tg >= tiles) {
      for (int xi = 0; xi < XI; xi++) memset(v + (xi * chunk + t) * cin, 0, cin * sizeof(float));
      continue;
    }
    int64_t r0 = g->m * (tg / tw_n) - g->pad_h, c0 = g->m * (tg % tw_n) - g->pad_w;
    for (int64_t cb = 0; cb < cin; cb += LANES) {
      const float *xb = x + pe_act_plane_base(&g->in, n, cb);
      __m256 d[WA][WA], s[WA][WA];
      for (int a = 0; a < WA; a++)
        for (int b = 0; b < WA; b++) {
          int64_t r = r0 + a, c = c0 + b;
          d[a][b] = r >= 0 && r < g->h && c >= 0 && c < g->w
                        ? _mm256_loadu_ps(xb + (r * g->w + c) * g->in.block)
                        : _mm256_setzero_ps();
        }
      for (int b = 0; b < WA; b++)
        WINO_BT(d[0][b], d[1][b], d[2][b], d[3][b], d[4][b], d[5][b], s[0][b], s[1][b], s[2][b],
                s[3][b], s[4][b], s[5][b]);
      for (int a = 0; a < WA; a++) {
        __m256 o[WA];
        WINO_BT(s[a][0], s[a][1], s[a][2], s[a][3], s[a][4], s[a][5], o[0], o[1], o[2], o[3], o[4],
                o[5]);
        for (int b = 0; b < WA; b++)
          _mm256_storeu_ps(v + ((a * WA + b) * chunk + t) * cin + cb, o[b]);
      }
    }
  }
}

/* M[t][ξ][cout] = Σ_i V[ξ][t][i] U[ξ][i][cout]: 6 tiles by 16 channels per
 * register block, the sum over i in order. */
__attribute__((target("avx2,fma"))) static void products(const pe_wino *g, const float *v,
                                                         const float *u, float *m) {
  const int64_t cin = g->cin, cout = g->cout, chunk = g->chunk;
  for (int xi = 0; xi < XI; xi++) {
    const float *vx = v + xi * chunk * cin, *ux = u + xi * cin * cout;
    float *mx = m + xi * cout;
    for (int64_t t = 0; t < chunk; t += ROWS)
      for (int64_t o = 0; o < cout; o += COLS) {
        __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
               c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
        const float *vt = vx + t * cin, *uk = ux + o;
        for (int64_t k = 0; k < cin; k++, uk += cout) {
          __m256 u0 = _mm256_loadu_ps(uk), u1 = _mm256_loadu_ps(uk + LANES), b;
#define WINO_ROW(r, a0, a1)                  \
  b = _mm256_broadcast_ss(vt + r * cin + k); \
  a0 = _mm256_fmadd_ps(b, u0, a0);           \
  a1 = _mm256_fmadd_ps(b, u1, a1);
          WINO_ROW(0, c00, c01)
          WINO_ROW(1, c10, c11)
          WINO_ROW(2, c20, c21)
          WINO_ROW(3, c30, c31)
          WINO_ROW(4, c40, c41)
          WINO_ROW(5, c50, c51)
#undef WINO_ROW
        }
        float *mo = mx + t * XI * cout + o;
#define WINO_STORE(r, a0, a1)               \
  _mm256_storeu_ps(mo + r * XI * cout, a0); \
  _mm256_storeu_ps(mo + r * XI * cout + LANES, a1);
        WINO_STORE(0, c00, c01)
        WINO_STORE(1, c10, c11)
        WINO_STORE(2, c20, c21)
        WINO_STORE(3, c30, c31)
        WINO_STORE(4, c40, c41)
        WINO_STORE(5, c50, c51)
#undef WINO_STORE
      }
  }
}

/* The chunk's m x m output tiles from M (Aᵀ M A), plus the bias, into
 * image n of y. */
__attribute__((target("avx2,fma"))) static void output_tiles(const pe_wino *g, const float *m,
                                                             const float *bias, float *y, int64_t n,
                                                             int64_t t0) {
  const int mm = g->m;
  int64_t tw_n = (g->ow + mm - 1) / mm, tiles = tiles_of(g), cout = g->cout;
  for (int64_t t = 0; t < g->chunk && t0 + t < tiles; t++) {
    int64_t tg = t0 + t, r0 = mm * (tg / tw_n), c0 = mm * (tg % tw_n);
    for (int64_t ob = 0; ob < cout; ob += LANES) {
      __m256 x[WA][WA], s[MMAX][WA], o[MMAX];
      for (int xi = 0; xi < XI; xi++)
        x[xi / WA][xi % WA] = _mm256_loadu_ps(m + (t * XI + xi) * cout + ob);
      for (int b = 0; b < WA; b++) {
        if (mm == 2)
          WINO_AT(x[0][b], x[1][b], x[2][b], x[3][b], x[4][b], x[5][b], s[0][b], s[1][b]);
        else
          WINO_AT4(x[0][b], x[1][b], x[2][b], x[3][b], x[4][b], x[5][b], s[0][b], s[1][b], s[2][b],
                   s[3][b]);
      }
      __m256 bv = bias ? _mm256_loadu_ps(bias + ob) : _mm256_setzero_ps();
      float *yb = y + pe_act_plane_base(&g->out, n, ob);
      for (int a = 0; a < mm && r0 + a < g->oh; a++) {
        if (mm == 2)
          WINO_AT(s[a][0], s[a][1], s[a][2], s[a][3], s[a][4], s[a][5], o[0], o[1]);
        else
          WINO_AT4(s[a][0], s[a][1], s[a][2], s[a][3], s[a][4], s[a][5], o[0], o[1], o[2], o[3]);
        float *row = yb + ((r0 + a) * g->ow + c0) * g->out.block;
        for (int b = 0; b < mm && c0 + b < g->ow; b++)
          _mm256_storeu_ps(row + b * g->out.block, _mm256_add_ps(o[b], bv));
      }
    }
  }
}

void pe_wino_run(const pe_wino *g, const float *x, const float *u, const float *bias, float *y,
                 float *scratch, int threads) {
  int64_t chunks = (tiles_of(g) + g->chunk - 1) / g->chunk, items = g->n * chunks;
  size_t per_thread = pe_wino_scratch_floats(g, 1);
  if (items < threads) threads = (int)(items > 0 ? items : 1);
#pragma omp parallel num_threads(threads)
  {
    float *v = scratch + (size_t)omp_get_thread_num() * per_thread;
    float *m = v + XI * g->chunk * g->cin;
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; it++) {
      int64_t n = it / chunks, t0 = it % chunks * g->chunk;
      input_tiles(g, x, n, t0, v);
      products(g, v, u, m);
      output_tiles(g, m, bias, y, n, t0);
    }
  }
}

/* The weights gradient. With Ŷ = A dY Aᵀ (6x6) for an m x m tile dY of the
 * output gradient, dU[ξ][i][o] = Σ_tiles V[ξ][t][i] Ŷ[ξ][t][o] and
 * dW = Gᵀ dU G. The tiles' sum is split into a fixed number of partitions
 * of the images (a function of the shape, not of the team), each summed in
 * order into its own dU, then the partitions in order: the same bits on any
 * thread count. */

/* dU bytes the partitions may hold together. */
#define WINO_WGRAD_PARTS_BYTES ((size_t)8 << 20)
#define WINO_WGRAD_PARTS_MAX 8

static int64_t wgrad_parts(const pe_wino *g) {
  size_t du = pe_wino_filter_floats(g) * sizeof(float);
  int64_t parts = (int64_t)(WINO_WGRAD_PARTS_BYTES / du);
  if (parts > WINO_WGRAD_PARTS_MAX) parts = WINO_WGRAD_PARTS_MAX;
  if (parts > g->n) parts = g->n;
  return parts < 1 ? 1 : parts;
}

size_t pe_wino_wgrad_scratch_floats(const pe_wino *g, int threads) {
  return (size_t)wgrad_parts(g) * pe_wino_filter_floats(g) + pe_wino_scratch_floats(g, threads);
}

/* Ŷ[ξ][t][cout] for the chunk's tiles of image n of the output gradient dy
 * (stored as g->out): A applied along both axes of each m x m tile, the
 * rows and columns past the output zero. */
__attribute__((target("avx2,fma"))) static void grad_tiles(const pe_wino *g, const float *dy,
                                                           int64_t n, int64_t t0, float *yh) {
  const int mm = g->m;
  int64_t tw_n = (g->ow + mm - 1) / mm, tiles = tiles_of(g), chunk = g->chunk, cout = g->cout;
  for (int64_t t = 0; t < chunk; t++) {
    int64_t tg = t0 + t;
    if (tg >= tiles) {
      for (int xi = 0; xi < XI; xi++) memset(yh + (xi * chunk + t) * cout, 0, cout * sizeof(float));
      continue;
    }
    int64_t r0 = mm * (tg / tw_n), c0 = mm * (tg % tw_n);
    for (int64_t ob = 0; ob < cout; ob += LANES) {
      const float *yb = dy + pe_act_plane_base(&g->out, n, ob);
      __m256 d[MMAX][MMAX], s[WA][MMAX];
      for (int a = 0; a < mm; a++)
        for (int b = 0; b < mm; b++)
          d[a][b] = r0 + a < g->oh && c0 + b < g->ow
                        ? _mm256_loadu_ps(yb + ((r0 + a) * g->ow + c0 + b) * g->out.block)
                        : _mm256_setzero_ps();
      /* s[a][b] = Σ_i A[a][i] d[i][b], A = (Aᵀ)ᵀ. */
      for (int a = 0; a < WA; a++)
        for (int b = 0; b < mm; b++) {
          __m256 acc = _mm256_setzero_ps();
          for (int i = 0; i < mm; i++)
            if (at_at(g, i, a) != 0)
              acc = _mm256_fmadd_ps(_mm256_set1_ps(at_at(g, i, a)), d[i][b], acc);
          s[a][b] = acc;
        }
      for (int a = 0; a < WA; a++)
        for (int b = 0; b < WA; b++) {
          __m256 acc = _mm256_setzero_ps();
          for (int j = 0; j < mm; j++)
            if (at_at(g, j, b) != 0)
              acc = _mm256_fmadd_ps(s[a][j], _mm256_set1_ps(at_at(g, j, b)), acc);
          _mm256_storeu_ps(yh + ((a * WA + b) * chunk + t) * cout + ob, acc);
        }
    }
  }
}

/* du[ξ][i][o] += Σ_t V[ξ][t][i] Ŷ[ξ][t][o] over the chunk: 4 input by 16
 * output channels per register block, t in order. */
__attribute__((target("avx2,fma"))) static void weight_products(const pe_wino *g, const float *v,
                                                                const float *yh, float *du) {
  const int64_t cin = g->cin, cout = g->cout, chunk = g->chunk;
  for (int xi = 0; xi < XI; xi++) {
    const float *vx = v + xi * chunk * cin, *yx = yh + xi * chunk * cout;
    float *dx = du + xi * cin * cout;
    for (int64_t i = 0; i < cin; i += 4)
      for (int64_t o = 0; o < cout; o += COLS) {
        float *d = dx + i * cout + o;
        __m256 c00 = _mm256_loadu_ps(d), c01 = _mm256_loadu_ps(d + LANES);
        __m256 c10 = _mm256_loadu_ps(d + cout), c11 = _mm256_loadu_ps(d + cout + LANES);
        __m256 c20 = _mm256_loadu_ps(d + 2 * cout), c21 = _mm256_loadu_ps(d + 2 * cout + LANES);
        __m256 c30 = _mm256_loadu_ps(d + 3 * cout), c31 = _mm256_loadu_ps(d + 3 * cout + LANES);
        const float *vt = vx + i, *yt = yx + o;
        for (int64_t t = 0; t < chunk; t++, vt += cin, yt += cout) {
          __m256 y0 = _mm256_loadu_ps(yt), y1 = _mm256_loadu_ps(yt + LANES), b;
#define WINO_WROW(r, a0, a1)       \
  b = _mm256_broadcast_ss(vt + r); \
  a0 = _mm256_fmadd_ps(b, y0, a0); \
  a1 = _mm256_fmadd_ps(b, y1, a1);
          WINO_WROW(0, c00, c01)
          WINO_WROW(1, c10, c11)
          WINO_WROW(2, c20, c21)
          WINO_WROW(3, c30, c31)
#undef WINO_WROW
        }
        _mm256_storeu_ps(d, c00), _mm256_storeu_ps(d + LANES, c01);
        _mm256_storeu_ps(d + cout, c10), _mm256_storeu_ps(d + cout + LANES, c11);
        _mm256_storeu_ps(d + 2 * cout, c20), _mm256_storeu_ps(d + 2 * cout + LANES, c21);
        _mm256_storeu_ps(d + 3 * cout, c30), _mm256_storeu_ps(d + 3 * cout + LANES, c31);
      }
  }
}

/* dw[o][i] (OIHW, o from o0, 8 of them) = Gᵀ dU[·][i][o] G. */
__attribute__((target("avx2,fma"))) static void filter_grad_block(const pe_wino *g, const float *du,
                                                                  float *dw, int64_t i,
                                                                  int64_t o0) {
  const int r = g->r;
  __m256 u[WA][WA], t[RMAX][WA];
  for (int xi = 0; xi < XI; xi++)
    u[xi / WA][xi % WA] = _mm256_loadu_ps(du + (xi * g->cin + i) * g->cout + o0);
  for (int k = 0; k < r; k++)
    for (int b = 0; b < WA; b++) {
      __m256 s = _mm256_setzero_ps();
      for (int a = 0; a < WA; a++)
        if (g_at(g, a, k) != 0) s = _mm256_fmadd_ps(_mm256_set1_ps(g_at(g, a, k)), u[a][b], s);
      t[k][b] = s;
    }
  for (int k = 0; k < r; k++)
    for (int j = 0; j < r; j++) {
      __m256 s = _mm256_setzero_ps();
      for (int b = 0; b < WA; b++)
        if (g_at(g, b, j) != 0) s = _mm256_fmadd_ps(t[k][b], _mm256_set1_ps(g_at(g, b, j)), s);
      float lanes[LANES];
      _mm256_storeu_ps(lanes, s);
      for (int l = 0; l < LANES; l++) dw[((o0 + l) * g->cin + i) * r * r + k * r + j] = lanes[l];
    }
}

void pe_wino_weights_grad(const pe_wino *g, const float *x, const float *dy, float *dw,
                          float *scratch, int threads) {
  int64_t parts = wgrad_parts(g), chunks = (tiles_of(g) + g->chunk - 1) / g->chunk;
  size_t du_floats = pe_wino_filter_floats(g), per_thread = pe_wino_scratch_floats(g, 1);
  float *du = scratch, *work = scratch + (size_t)parts * du_floats;
  int team = threads < parts ? threads : (int)parts;
#pragma omp parallel num_threads(team)
  {
    float *v = work + (size_t)omp_get_thread_num() * per_thread;
    float *yh = v + XI * g->chunk * g->cin;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < parts; p++) {
      float *dup = du + (size_t)p * du_floats;
      memset(dup, 0, du_floats * sizeof(float));
      for (int64_t n = p * g->n / parts; n < (p + 1) * g->n / parts; n++)
        for (int64_t ch = 0; ch < chunks; ch++) {
          input_tiles(g, x, n, ch * g->chunk, v);
          grad_tiles(g, dy, n, ch * g->chunk, yh);
          weight_products(g, v, yh, dup);
        }
    }
  }
  /* The partitions' sum, in order, into the first. */
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t k = 0; k < du_floats; k++)
    for (int64_t p = 1; p < parts; p++) du[k] += du[(size_t)p * du_floats + k];
  int64_t oblocks = g->cout / LANES, items = g->cin * oblocks;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t it = 0; it < items; it++)
    filter_grad_block(g, du, dw, it / oblocks, it % oblocks * LANES);
}
