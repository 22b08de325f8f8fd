/* The kernels of pe's Winograd convolution (conv_winograd.c), written
 * once for any vector width. Included by one source file per ISA, which
 * first defines:
 *   WINO_LANES     floats per vector (8: AVX2, 16: AVX-512)
 *   VEC            the vector type
 *   V_LOADU(p), V_STOREU(p, v), V_SET1(x), V_ZERO(), V_ADD(a, b),
 *   V_SUB(a, b), V_MUL(a, b), V_FMADD(a, b, c) (a b + c),
 *   V_FNMADD(a, b, c) (c - a b)
 *   WINO_TABLE     the name of the pe_wino_kernels it defines
 *   WINO_TARGET    the function attribute of that ISA (target("..."), which
 *                  GCC and clang both honour per function)
 * Every vector holds
 * WINO_LANES consecutive channels, which the blocked layouts of that width
 * and wider store contiguously. */
#include <string.h>

#include "ops/cpu/conv_winograd_impl.h"

/* u[ξ][i][o0..] for input channel i and WINO_LANES output channels from o0:
 * G f Gᵀ. */
WINO_TARGET static void filter_block(const pe_wino *g, const float *w, bool data_grad, float *u,
                                     int64_t i, int64_t o0) {
  const int r = g->r, rr = r * r;
  VEC f[RMAX][RMAX], t[WA][RMAX];
  for (int j = 0; j < r; j++)
    for (int k = 0; k < r; k++) {
      float v[WINO_LANES];
      for (int l = 0; l < WINO_LANES; l++) {
        int64_t o = o0 + l;
        v[l] = data_grad ? w[(i * g->cout + o) * rr + (r - 1 - j) * r + (r - 1 - k)]
                         : w[(o * g->cin + i) * rr + j * r + k];
      }
      f[j][k] = V_LOADU(v);
    }
  for (int a = 0; a < WA; a++)
    for (int k = 0; k < r; k++) {
      VEC s = V_ZERO();
      for (int j = 0; j < r; j++)
        if (g_at(g, a, j) != 0) s = V_FMADD(V_SET1(g_at(g, a, j)), f[j][k], s);
      t[a][k] = s;
    }
  for (int a = 0; a < WA; a++)
    for (int b = 0; b < WA; b++) {
      VEC s = V_ZERO();
      for (int k = 0; k < r; k++)
        if (g_at(g, b, k) != 0) s = V_FMADD(t[a][k], V_SET1(g_at(g, b, k)), s);
      V_STOREU(u + ((a * WA + b) * g->cin + i) * g->cout + o0, s);
    }
}

/* Bᵀ applied along one axis of a 6x6 tile: out[k] = Σ_j Bᵀ[k][j] in[j]. */
#define WINO_BT(d0, d1, d2, d3, d4, d5, o0, o1, o2, o3, o4, o5)  \
  do {                                                           \
    VEC f4_ = V_SET1(4.f), f5_ = V_SET1(5.f), f2_ = V_SET1(2.f); \
    o0 = V_ADD(V_FNMADD(f5_, d2, V_MUL(f4_, d0)), d4);           \
    VEC a_ = V_FNMADD(f4_, d2, d4), b_ = V_FNMADD(f4_, d1, d3);  \
    o1 = V_ADD(a_, b_);                                          \
    o2 = V_SUB(a_, b_);                                          \
    VEC c_ = V_SUB(d4, d2), e_ = V_MUL(f2_, V_SUB(d3, d1));      \
    o3 = V_ADD(c_, e_);                                          \
    o4 = V_SUB(c_, e_);                                          \
    o5 = V_ADD(V_FNMADD(f5_, d3, V_MUL(f4_, d1)), d5);           \
  } while (0)

/* Aᵀ applied along one axis: y0 = m0 + m1 + m2 + m3 + m4, y1 = m1 - m2 +
 * 2 (m3 - m4) + m5. */
#define WINO_AT(m0, m1, m2, m3, m4, m5, y0, y1)    \
  do {                                             \
    VEC p_ = V_ADD(m1, m2), q_ = V_SUB(m1, m2);    \
    VEC p2_ = V_ADD(m3, m4), q2_ = V_SUB(m3, m4);  \
    y0 = V_ADD(V_ADD(m0, p_), p2_);                \
    y1 = V_ADD(V_FMADD(V_SET1(2.f), q2_, q_), m5); \
  } while (0)

/* Aᵀ of F(4x4, 3x3) along one axis: y0 = m0 + m1 + m2 + m3 + m4,
 * y1 = (m1 - m2) + 2 (m3 - m4), y2 = (m1 + m2) + 4 (m3 + m4),
 * y3 = (m1 - m2) + 8 (m3 - m4) + m5. */
#define WINO_AT4(m0, m1, m2, m3, m4, m5, y0, y1, y2, y3) \
  do {                                                   \
    VEC p_ = V_ADD(m1, m2), q_ = V_SUB(m1, m2);          \
    VEC p2_ = V_ADD(m3, m4), q2_ = V_SUB(m3, m4);        \
    y0 = V_ADD(V_ADD(m0, p_), p2_);                      \
    y1 = V_FMADD(V_SET1(2.f), q2_, q_);                  \
    y2 = V_FMADD(V_SET1(4.f), p2_, p_);                  \
    y3 = V_ADD(V_FMADD(V_SET1(8.f), q2_, q_), m5);       \
  } while (0)

/* V[ξ][t][cin] for the chunk's tiles [t0, t0 + chunk) of image x (tiles
 * past the image's last are zero). */
WINO_TARGET static void input_tiles(const pe_wino *g, const float *x, int64_t n, int64_t t0,
                                    float *v) {
  int64_t tw_n = (g->ow + g->m - 1) / g->m, tiles = tiles_of(g), chunk = g->chunk, cin = g->cin;
  for (int64_t t = 0; t < chunk; t++) {
    int64_t tg = t0 + t;
    if (tg >= tiles) {
      for (int xi = 0; xi < XI; xi++) memset(v + (xi * chunk + t) * cin, 0, cin * sizeof(float));
      continue;
    }
    int64_t r0 = g->m * (tg / tw_n) - g->pad_h, c0 = g->m * (tg % tw_n) - g->pad_w;
    for (int64_t cb = 0; cb < cin; cb += WINO_LANES) {
      const float *xb = x + pe_act_plane_base(&g->in, n, cb);
      VEC d[WA][WA], s[WA][WA];
      for (int a = 0; a < WA; a++)
        for (int b = 0; b < WA; b++) {
          int64_t r = r0 + a, c = c0 + b;
          d[a][b] = r >= 0 && r < g->h && c >= 0 && c < g->w
                        ? V_LOADU(xb + (r * g->w + c) * g->in.block)
                        : V_ZERO();
        }
      for (int b = 0; b < WA; b++)
        WINO_BT(d[0][b], d[1][b], d[2][b], d[3][b], d[4][b], d[5][b], s[0][b], s[1][b], s[2][b],
                s[3][b], s[4][b], s[5][b]);
      for (int a = 0; a < WA; a++) {
        VEC o[WA];
        WINO_BT(s[a][0], s[a][1], s[a][2], s[a][3], s[a][4], s[a][5], o[0], o[1], o[2], o[3], o[4],
                o[5]);
        for (int b = 0; b < WA; b++) V_STOREU(v + ((a * WA + b) * chunk + t) * cin + cb, o[b]);
      }
    }
  }
}

/* M[t][ξ][cout] = Σ_i V[ξ][t][i] U[ξ][i][cout]: 6 tiles by two vectors of channels per
 * register block, the sum over i in order. */
WINO_TARGET static void products(const pe_wino *g, const float *v, const float *u, float *m) {
  const int64_t cin = g->cin, cout = g->cout, chunk = g->chunk;
  for (int xi = 0; xi < XI; xi++) {
    const float *vx = v + xi * chunk * cin, *ux = u + xi * cin * cout;
    float *mx = m + xi * cout;
    for (int64_t t = 0; t < chunk; t += ROWS)
      for (int64_t o = 0; o < cout; o += (2 * WINO_LANES)) {
        VEC c00 = V_ZERO(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
            c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
        const float *vt = vx + t * cin, *uk = ux + o;
        for (int64_t k = 0; k < cin; k++, uk += cout) {
          VEC u0 = V_LOADU(uk), u1 = V_LOADU(uk + WINO_LANES), b;
#define WINO_ROW(r, a0, a1)        \
  b = V_SET1(*(vt + r * cin + k)); \
  a0 = V_FMADD(b, u0, a0);         \
  a1 = V_FMADD(b, u1, a1);
          WINO_ROW(0, c00, c01)
          WINO_ROW(1, c10, c11)
          WINO_ROW(2, c20, c21)
          WINO_ROW(3, c30, c31)
          WINO_ROW(4, c40, c41)
          WINO_ROW(5, c50, c51)
#undef WINO_ROW
        }
        float *mo = mx + t * XI * cout + o;
#define WINO_STORE(r, a0, a1)       \
  V_STOREU(mo + r * XI * cout, a0); \
  V_STOREU(mo + r * XI * cout + WINO_LANES, a1);
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
WINO_TARGET static void output_tiles(const pe_wino *g, const float *m, const float *bias, float *y,
                                     int64_t n, int64_t t0) {
  const int mm = g->m;
  int64_t tw_n = (g->ow + mm - 1) / mm, tiles = tiles_of(g), cout = g->cout;
  for (int64_t t = 0; t < g->chunk && t0 + t < tiles; t++) {
    int64_t tg = t0 + t, r0 = mm * (tg / tw_n), c0 = mm * (tg % tw_n);
    for (int64_t ob = 0; ob < cout; ob += WINO_LANES) {
      VEC x[WA][WA], s[MMAX][WA], o[MMAX];
      for (int xi = 0; xi < XI; xi++) x[xi / WA][xi % WA] = V_LOADU(m + (t * XI + xi) * cout + ob);
      for (int b = 0; b < WA; b++) {
        if (mm == 2)
          WINO_AT(x[0][b], x[1][b], x[2][b], x[3][b], x[4][b], x[5][b], s[0][b], s[1][b]);
        else
          WINO_AT4(x[0][b], x[1][b], x[2][b], x[3][b], x[4][b], x[5][b], s[0][b], s[1][b], s[2][b],
                   s[3][b]);
      }
      VEC bv = bias ? V_LOADU(bias + ob) : V_ZERO();
      float *yb = y + pe_act_plane_base(&g->out, n, ob);
      for (int a = 0; a < mm && r0 + a < g->oh; a++) {
        if (mm == 2)
          WINO_AT(s[a][0], s[a][1], s[a][2], s[a][3], s[a][4], s[a][5], o[0], o[1]);
        else
          WINO_AT4(s[a][0], s[a][1], s[a][2], s[a][3], s[a][4], s[a][5], o[0], o[1], o[2], o[3]);
        float *row = yb + ((r0 + a) * g->ow + c0) * g->out.block;
        for (int b = 0; b < mm && c0 + b < g->ow; b++)
          V_STOREU(row + b * g->out.block, V_ADD(o[b], bv));
      }
    }
  }
}

/* Ŷ[ξ][t][cout] for the chunk's tiles of image n of the output gradient dy
 * (stored as g->out): A applied along both axes of each m x m tile, the
 * rows and columns past the output zero. */
WINO_TARGET static void grad_tiles(const pe_wino *g, const float *dy, int64_t n, int64_t t0,
                                   float *yh) {
  const int mm = g->m;
  int64_t tw_n = (g->ow + mm - 1) / mm, tiles = tiles_of(g), chunk = g->chunk, cout = g->cout;
  for (int64_t t = 0; t < chunk; t++) {
    int64_t tg = t0 + t;
    if (tg >= tiles) {
      for (int xi = 0; xi < XI; xi++) memset(yh + (xi * chunk + t) * cout, 0, cout * sizeof(float));
      continue;
    }
    int64_t r0 = mm * (tg / tw_n), c0 = mm * (tg % tw_n);
    for (int64_t ob = 0; ob < cout; ob += WINO_LANES) {
      const float *yb = dy + pe_act_plane_base(&g->out, n, ob);
      VEC d[MMAX][MMAX], s[WA][MMAX];
      for (int a = 0; a < mm; a++)
        for (int b = 0; b < mm; b++)
          d[a][b] = r0 + a < g->oh && c0 + b < g->ow
                        ? V_LOADU(yb + ((r0 + a) * g->ow + c0 + b) * g->out.block)
                        : V_ZERO();
      /* s[a][b] = Σ_i A[a][i] d[i][b], A = (Aᵀ)ᵀ. */
      for (int a = 0; a < WA; a++)
        for (int b = 0; b < mm; b++) {
          VEC acc = V_ZERO();
          for (int i = 0; i < mm; i++)
            if (at_at(g, i, a) != 0) acc = V_FMADD(V_SET1(at_at(g, i, a)), d[i][b], acc);
          s[a][b] = acc;
        }
      for (int a = 0; a < WA; a++)
        for (int b = 0; b < WA; b++) {
          VEC acc = V_ZERO();
          for (int j = 0; j < mm; j++)
            if (at_at(g, j, b) != 0) acc = V_FMADD(s[a][j], V_SET1(at_at(g, j, b)), acc);
          V_STOREU(yh + ((a * WA + b) * chunk + t) * cout + ob, acc);
        }
    }
  }
}

/* du[ξ][i][o] += Σ_t V[ξ][t][i] Ŷ[ξ][t][o] over the chunk: 4 input by two vectors of
 * output channels per register block, t in order. */
WINO_TARGET static void weight_products(const pe_wino *g, const float *v, const float *yh,
                                        float *du) {
  const int64_t cin = g->cin, cout = g->cout, chunk = g->chunk;
  for (int xi = 0; xi < XI; xi++) {
    const float *vx = v + xi * chunk * cin, *yx = yh + xi * chunk * cout;
    float *dx = du + xi * cin * cout;
    for (int64_t i = 0; i < cin; i += 4)
      for (int64_t o = 0; o < cout; o += (2 * WINO_LANES)) {
        float *d = dx + i * cout + o;
        VEC c00 = V_LOADU(d), c01 = V_LOADU(d + WINO_LANES);
        VEC c10 = V_LOADU(d + cout), c11 = V_LOADU(d + cout + WINO_LANES);
        VEC c20 = V_LOADU(d + 2 * cout), c21 = V_LOADU(d + 2 * cout + WINO_LANES);
        VEC c30 = V_LOADU(d + 3 * cout), c31 = V_LOADU(d + 3 * cout + WINO_LANES);
        const float *vt = vx + i, *yt = yx + o;
        for (int64_t t = 0; t < chunk; t++, vt += cin, yt += cout) {
          VEC y0 = V_LOADU(yt), y1 = V_LOADU(yt + WINO_LANES), b;
#define WINO_WROW(r, a0, a1) \
  b = V_SET1(*(vt + r));     \
  a0 = V_FMADD(b, y0, a0);   \
  a1 = V_FMADD(b, y1, a1);
          WINO_WROW(0, c00, c01)
          WINO_WROW(1, c10, c11)
          WINO_WROW(2, c20, c21)
          WINO_WROW(3, c30, c31)
#undef WINO_WROW
        }
        V_STOREU(d, c00), V_STOREU(d + WINO_LANES, c01);
        V_STOREU(d + cout, c10), V_STOREU(d + cout + WINO_LANES, c11);
        V_STOREU(d + 2 * cout, c20), V_STOREU(d + 2 * cout + WINO_LANES, c21);
        V_STOREU(d + 3 * cout, c30), V_STOREU(d + 3 * cout + WINO_LANES, c31);
      }
  }
}

/* dw[o][i] (OIHW, o from o0, WINO_LANES of them) = Gᵀ dU[·][i][o] G. */
WINO_TARGET static void filter_grad_block(const pe_wino *g, const float *du, float *dw, int64_t i,
                                          int64_t o0) {
  const int r = g->r;
  VEC u[WA][WA], t[RMAX][WA];
  for (int xi = 0; xi < XI; xi++)
    u[xi / WA][xi % WA] = V_LOADU(du + (xi * g->cin + i) * g->cout + o0);
  for (int k = 0; k < r; k++)
    for (int b = 0; b < WA; b++) {
      VEC s = V_ZERO();
      for (int a = 0; a < WA; a++)
        if (g_at(g, a, k) != 0) s = V_FMADD(V_SET1(g_at(g, a, k)), u[a][b], s);
      t[k][b] = s;
    }
  for (int k = 0; k < r; k++)
    for (int j = 0; j < r; j++) {
      VEC s = V_ZERO();
      for (int b = 0; b < WA; b++)
        if (g_at(g, b, j) != 0) s = V_FMADD(t[k][b], V_SET1(g_at(g, b, j)), s);
      float lanes[WINO_LANES];
      V_STOREU(lanes, s);
      for (int l = 0; l < WINO_LANES; l++)
        dw[((o0 + l) * g->cin + i) * r * r + k * r + j] = lanes[l];
    }
}

const pe_wino_kernels WINO_TABLE = {
    .lanes = WINO_LANES,
    .filter_block = filter_block,
    .input_tiles = input_tiles,
    .products = products,
    .output_tiles = output_tiles,
    .grad_tiles = grad_tiles,
    .weight_products = weight_products,
    .filter_grad_block = filter_grad_block,
};
