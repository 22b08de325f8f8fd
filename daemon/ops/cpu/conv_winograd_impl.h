/* What conv_winograd.c shares with its per-ISA kernels
 * (conv_winograd_kernels.h): the sizes, the transforms' coefficients and
 * the table of kernels. Internal to ops/cpu. */
#ifndef PE_OPS_CPU_CONV_WINOGRAD_IMPL_H
#define PE_OPS_CPU_CONV_WINOGRAD_IMPL_H

#include "ops/cpu/conv_winograd.h"

/* The input tile's side, the largest filter and output tile, the
 * transformed positions, the tiles per register block. */
enum { WA = 6, RMAX = 5, MMAX = 4, XI = WA * WA, ROWS = 6 };

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
static inline float g_at(const pe_wino *g, int a, int j) {
  return g->r == 5 ? wino_g5[a][j] : wino_g3[a][j];
}
static inline float at_at(const pe_wino *g, int i, int a) {
  return g->m == 2 ? wino_at2[i][a] : wino_at4[i][a];
}

static inline int64_t tiles_of(const pe_wino *g) {
  return ((g->oh + g->m - 1) / g->m) * ((g->ow + g->m - 1) / g->m);
}

/* One ISA's kernels (conv_winograd_kernels.h); each works on vectors of
 * `lanes` channels. */
typedef struct pe_wino_kernels {
  int lanes;
  void (*filter_block)(const pe_wino *g, const float *w, bool data_grad, float *u, int64_t i,
                       int64_t o0);
  void (*input_tiles)(const pe_wino *g, const float *x, int64_t n, int64_t t0, float *v);
  void (*products)(const pe_wino *g, const float *v, const float *u, float *m);
  void (*output_tiles)(const pe_wino *g, const float *m, const float *bias, float *y, int64_t n,
                       int64_t t0);
  void (*grad_tiles)(const pe_wino *g, const float *dy, int64_t n, int64_t t0, float *yh);
  void (*weight_products)(const pe_wino *g, const float *v, const float *yh, float *du);
  void (*filter_grad_block)(const pe_wino *g, const float *du, float *dw, int64_t i, int64_t o0);
} pe_wino_kernels;

extern const pe_wino_kernels pe_wino_kernels_avx2, pe_wino_kernels_avx512;

#endif
