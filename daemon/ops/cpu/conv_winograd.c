/* Winograd F(2x2, 5x5) and F(4x4, 3x3) (contract in conv_winograd.h): the
 * plan, the scratch and the loops over images and chunks; the kernels they
 * call are per ISA (conv_winograd_kernels.h).
 *
 * With the points 0, 1, -1, 2, -2 and infinity, an m x m output tile is
 *   Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A
 * for a 6x6 input tile d and an r x r filter g (m = 7 - r); Bᵀ is the same
 * for both, G and Aᵀ below. The work of
 * one image is cut into chunks of output tiles; a chunk's transformed input
 * V[ξ][tile][cin] and products M[tile][ξ][cout] stay in the thread's
 * scratch (sized for the L2 cache), so each image is read and written once. */
#include "ops/cpu/conv_winograd.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <string.h>

#include "ops/cpu/conv_winograd_impl.h"

/* Scratch floats per thread the chunk size aims at: V and M within 768 KiB. */
#define WINO_SCRATCH_TARGET (192 * 1024)

/* The transformed filters hold 36 / r² of the filters' size (4x for 3x3);
 * past 64 MiB of them oneDNN's direct kernels run instead. */
#define WINO_FILTER_FLOATS_MAX ((int64_t)16 << 20)

int pe_wino_lanes(void) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  if ((isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core)
    return __builtin_cpu_supports("avx512f") ? 16 : 0;
  if ((isa & dnnl_cpu_isa_avx512_mic) == dnnl_cpu_isa_avx512_mic) return 0;
  return (isa & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2 ? 8 : 0;
}

bool pe_wino_takes(int lanes, int r) {
  return (lanes == 8 && (r == 3 || r == 5)) || (lanes == 16 && r == 5);
}

/* The kernels of `lanes` this CPU runs; NULL for none. */
static const pe_wino_kernels *kernels_of(int lanes) {
  if (lanes == 8 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return &pe_wino_kernels_avx2;
  if (lanes == 16 && __builtin_cpu_supports("avx512f")) return &pe_wino_kernels_avx512;
  return NULL;
}

static int64_t round6(int64_t v) {
  return (v + ROWS - 1) / ROWS * ROWS;
}

bool pe_wino_plan(pe_wino *g, int lanes, int r, const int64_t in[4], int64_t cout, int64_t oh,
                  int64_t ow, int64_t pad_h, int64_t pad_w, pe_act_plane in_plane,
                  pe_act_plane out_plane) {
  memset(g, 0, sizeof *g);
  const pe_wino_kernels *kern = kernels_of(lanes);
  if (!kern || (r != 3 && r != 5)) return false;
  if (in[1] <= 0 || in[1] % lanes || cout <= 0 || cout % (2 * lanes)) return false;
  if (in[1] > WINO_FILTER_FLOATS_MAX / XI / cout) return false;
  if (pad_h < 0 || pad_h > r - 1 || pad_w < 0 || pad_w > r - 1) return false;
  if (oh != in[2] + 2 * pad_h - (r - 1) || ow != in[3] + 2 * pad_w - (r - 1) || oh < 1 || ow < 1)
    return false;
  /* A vector's channels are contiguous in blocks of its width and wider. */
  if (in_plane.block < lanes || in_plane.block % lanes || out_plane.block < lanes ||
      out_plane.block % lanes)
    return false;
  *g = (pe_wino){.kern = kern,
                 .r = r,
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

void pe_wino_filter(const pe_wino *g, const float *w, bool data_grad, float *u, int threads) {
  int lanes = g->kern->lanes;
  int64_t oblocks = g->cout / lanes, items = g->cin * oblocks;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t it = 0; it < items; it++)
    g->kern->filter_block(g, w, data_grad, u, it / oblocks, it % oblocks * lanes);
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
      g->kern->input_tiles(g, x, n, t0, v);
      g->kern->products(g, v, u, m);
      g->kern->output_tiles(g, m, bias, y, n, t0);
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
          g->kern->input_tiles(g, x, n, ch * g->chunk, v);
          g->kern->grad_tiles(g, dy, n, ch * g->chunk, yh);
          g->kern->weight_products(g, v, yh, dup);
        }
    }
  }
  /* The partitions' sum, in order, into the first. */
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t k = 0; k < du_floats; k++)
    for (int64_t p = 1; p < parts; p++) du[k] += du[(size_t)p * du_floats + k];
  int lanes = g->kern->lanes;
  int64_t oblocks = g->cout / lanes, items = g->cin * oblocks;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t it = 0; it < items; it++)
    g->kern->filter_grad_block(g, du, dw, it / oblocks, it % oblocks * lanes);
}
