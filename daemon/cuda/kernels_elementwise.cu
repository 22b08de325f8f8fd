// Elementwise CUDA kernels: broadcasting binary ops and their reductions,
// affine/sum, fill and counter-based random numbers, dropout, activations,
// optimizers. Launchers are declared in kernels.h.
//
// Random numbers use core/rng.h's splitmix64 over (seed, counter), computed
// in double exactly as on the CPU, so a seeded uniform/gaussian/dropout on
// a GPU gives the CPU's numbers (gaussian up to the last bit of the
// device's log/cos, which may differ from glibc's by one ulp before
// rounding to f32).
#include <stdint.h>

#include "kernels.h"
#include "launch.cuh"
#include "ops/lr_schedule.h"

namespace {

__device__ inline uint64_t rng_bits(uint64_t seed, uint64_t counter) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + counter + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__device__ inline double rng_uniform(uint64_t seed, uint64_t c) {
  return (double)(rng_bits(seed, c) >> 11) * (1.0 / 9007199254740992.0);
}
__device__ inline double rng_normal(uint64_t seed, uint64_t c) {
  double u1 = rng_uniform(seed, 2 * c), u2 = rng_uniform(seed, 2 * c + 1);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// a + b * u rounded twice, as the CPU computes it: nvcc would contract it
// into one fma, whose single rounding can differ in the last bit and so
// break bit-equality of seeded init with the CPU.
__device__ inline double affine_rn(double a, double b, double u) {
  return __dadd_rn(a, __dmul_rn(b, u));
}

// Offsets of output element i in a and b under plan p (innermost dim last).
__device__ inline void plan_offsets(const pe_cu_plan &p, int64_t i, int64_t *oa, int64_t *ob) {
  int64_t a = 0, b = 0;
  for (int d = p.nd - 1; d >= 0; d--) {
    int64_t q = i % p.n[d];
    i /= p.n[d];
    a += q * p.sa[d];
    b += q * p.sb[d];
  }
  *oa = a;
  *ob = b;
}

template <int OP>
__global__ void binary_kernel(pe_cu_plan p, const float *a, const float *b, float *o) {
  GRID_LOOP(i, p.numel) {
    int64_t ia, ib;
    plan_offsets(p, i, &ia, &ib);
    float x = a[ia], y = b[ib];
    o[i] = OP == 0 ? x + y : OP == 1 ? x - y : x * y;
  }
}

// One dst element per block (threads split the reduced positions) when the
// reduction is long; one per thread when it is short.
__device__ inline int64_t reduce_src_offset(const pe_cu_reduce &r, int64_t ti, int64_t ri,
                                            int64_t *uoff) {
  // Walk dims innermost first: kept dims take digits of ti, reduced of ri.
  int64_t off = 0, stride = 1, us = 1, uo = 0;
  for (int d = r.nd - 1; d >= 0; d--) {
    int64_t q;
    if (r.t[d] == r.out[d]) {
      q = ti % r.out[d];
      ti /= r.out[d];
    } else {
      q = ri % r.out[d];
      ri /= r.out[d];
    }
    off += q * stride;
    stride *= r.out[d];
    if (r.u[d] != 1) uo += q * us;
    us *= r.u[d];
  }
  *uoff = uo;
  return off;
}

__global__ void reduce_thread_kernel(pe_cu_reduce r, int64_t tn, int64_t rn, const float *src,
                                     const float *u, float scale, float *dst) {
  GRID_LOOP(ti, tn) {
    double acc = 0;
    for (int64_t ri = 0; ri < rn; ri++) {
      int64_t uo, so = reduce_src_offset(r, ti, ri, &uo);
      acc += (double)src[so] * (u ? u[uo] : 1.0f);
    }
    dst[ti] = (float)(acc * scale);
  }
}

// part[0] = the block's accs summed as a tree (the same order every run);
// every thread of the block calls it.
__device__ inline void block_sum(double *part, double acc) {
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
}

__global__ void reduce_block_kernel(pe_cu_reduce r, int64_t tn, int64_t rn, const float *src,
                                    const float *u, float scale, float *dst) {
  __shared__ double part[kThreads];
  for (int64_t ti = blockIdx.x; ti < tn; ti += gridDim.x) {
    double acc = 0;
    for (int64_t ri = threadIdx.x; ri < rn; ri += blockDim.x) {
      int64_t uo, so = reduce_src_offset(r, ti, ri, &uo);
      acc += (double)src[so] * (u ? u[uo] : 1.0f);
    }
    block_sum(part, acc);
    if (threadIdx.x == 0) dst[ti] = (float)(part[0] * scale);
    __syncthreads();
  }
}

// The block kernel's sum split over P parts of the reduced range: block b
// sums part b % P of target b / P into partial[b]; reduce_parts_kernel
// adds each target's P parts in part order (deterministic, like batch
// norm's channel x part sums).
__global__ void reduce_part_kernel(pe_cu_reduce r, int64_t tn, int64_t rn, int64_t P, int64_t chunk,
                                   const float *src, const float *u, double *partial) {
  __shared__ double part[kThreads];
  for (int64_t b = blockIdx.x; b < tn * P; b += gridDim.x) {
    int64_t ti = b / P, r0 = (b % P) * chunk, r1 = r0 + chunk < rn ? r0 + chunk : rn;
    double acc = 0;
    for (int64_t ri = r0 + threadIdx.x; ri < r1; ri += blockDim.x) {
      int64_t uo, so = reduce_src_offset(r, ti, ri, &uo);
      acc += (double)src[so] * (u ? u[uo] : 1.0f);
    }
    block_sum(part, acc);
    if (threadIdx.x == 0) partial[b] = part[0];
    __syncthreads();
  }
}

__global__ void reduce_parts_kernel(const double *partial, int64_t tn, int64_t P, float scale,
                                    float *dst) {
  GRID_LOOP(ti, tn) {
    double acc = 0;
    for (int64_t p = 0; p < P; p++) acc += partial[ti * P + p];
    dst[ti] = (float)(acc * scale);
  }
}

__global__ void affine_kernel(const float *x, float *o, int64_t n, float a, float b) {
  GRID_LOOP(i, n) o[i] = a * x[i] + b;
}

struct sum_args {
  const float *x[64];
  int k;
};

__global__ void sum_kernel(sum_args s, float *o, int64_t n) {
  GRID_LOOP(i, n) {
    float acc = s.x[0][i];
    for (int j = 1; j < s.k; j++) acc += s.x[j][i];
    o[i] = acc;
  }
}

template <typename T>
__global__ void fill_kernel(T *p, T v, int64_t n) {
  GRID_LOOP(i, n) p[i] = v;
}

// A random kernel's first counter: the host's base, plus the generator's
// step delta read from device memory when the launch is part of a captured
// step (cuda/cuda_graph.h: each replay writes how far the generator moved
// since the capture). per: counters per delta unit (gaussian_random uses a
// pair per number). Without a delta the base is the host's, bit for bit.
__device__ inline uint64_t step_base(uint64_t base, const uint64_t *delta, uint64_t per) {
  return delta ? base + *delta / per : base;
}

__global__ void uniform_f32(float *o, int64_t n, uint64_t seed, uint64_t base0,
                            const uint64_t *delta, double lo, double hi, float fhi, float below) {
  uint64_t base = step_base(base0, delta, 1);
  GRID_LOOP(i, n) {
    float v = (float)affine_rn(lo, hi - lo, rng_uniform(seed, base + (uint64_t)i));
    o[i] = v >= fhi ? below : v;
  }
}
__global__ void uniform_f64(double *o, int64_t n, uint64_t seed, uint64_t base0,
                            const uint64_t *delta, double lo, double hi) {
  uint64_t base = step_base(base0, delta, 1);
  GRID_LOOP(i, n) o[i] = affine_rn(lo, hi - lo, rng_uniform(seed, base + (uint64_t)i));
}
template <typename T>
__global__ void gaussian_kernel(T *o, int64_t n, uint64_t seed, uint64_t base0,
                                const uint64_t *delta, double mean, double sd) {
  uint64_t base = step_base(base0, delta, 2);
  GRID_LOOP(i, n) o[i] = (T)affine_rn(mean, sd, rng_normal(seed, base + (uint64_t)i));
}

__global__ void dropout_kernel(const float *x, float *o, uint8_t *m, int64_t n, uint64_t seed,
                               uint64_t base0, const uint64_t *delta, double p, float scale) {
  uint64_t base = step_base(base0, delta, 1);
  GRID_LOOP(i, n) {
    bool keep = rng_uniform(seed, base + (uint64_t)i) >= p;
    if (m) m[i] = keep;
    if (o) o[i] = keep ? x[i] * scale : 0.0f;
  }
}

// out = x * scale where mask (NULL: everywhere); a masked-off element is 0.
__global__ void scale_u8_kernel(const float *x, const uint8_t *m, float *o, int64_t n,
                                float scale) {
  GRID_LOOP(i, n) o[i] = (!m || m[i]) ? x[i] * scale : 0.0f;
}

template <int A>
__global__ void act_fwd_kernel(const float *x, float *y, int64_t n) {
  GRID_LOOP(i, n) {
    float v = x[i];
    // relu as the CPU's (ops/cpu/relu.h): NaN and +Inf pass, -0 gives +0.
    y[i] = A == PE_CU_RELU ? (v <= 0.0f ? 0.0f : v)
           : A == PE_CU_TANH ? tanhf(v)
                             : 1.0f / (1.0f + expf(-v));
  }
}
template <int A>
__global__ void act_bwd_kernel(const float *x, const float *y, const float *dy, float *dx,
                               int64_t n) {
  GRID_LOOP(i, n) {
    float g = dy[i];
    if (A == PE_CU_RELU)
      dx[i] = x[i] <= 0.0f ? 0.0f : g;  // dy passes where x is NaN, as on the CPU
    else if (A == PE_CU_TANH)
      dx[i] = g * (1.0f - y[i] * y[i]);
    else
      dx[i] = g * y[i] * (1.0f - y[i]);
  }
}

// One thread: the cpu kernel's formula (ops/lr_schedule.h), in double.
__global__ void lr_schedule_kernel(const int64_t *step, int64_t *step_out, float *lr,
                                   pe_lr_params p) {
  int64_t st = *step < 0 ? 0 : *step;
  *lr = (float)pe_lr_at(&p, st);
  *step_out = st < INT64_MAX ? st + 1 : st;
}

// wd: the L2 coefficient (0: none); the gradient used is g + wd * p.
__global__ void sgd_kernel(const float *p, const float *g, const float *lr, float wd, float *po,
                           int64_t n) {
  float l = *lr;
  GRID_LOOP(i, n) po[i] = p[i] - l * (wd != 0.0f ? g[i] + wd * p[i] : g[i]);
}

__global__ void momentum_kernel(const float *p, const float *g, const float *v, const float *lr,
                                float mu, int nesterov, float wd, float *po, float *vo, int64_t n) {
  float l = *lr;
  GRID_LOOP(i, n) {
    float pi = p[i], gi = wd != 0.0f ? g[i] + wd * pi : g[i], vn = mu * v[i] + gi;
    vo[i] = vn;
    po[i] = nesterov ? pi - l * (gi + mu * vn) : pi - l * vn;
  }
}

// dwd: the decoupled (AdamW) coefficient; the parameter is scaled by
// 1 - lr * dwd before the step, as the cpu kernel does (1 when dwd is 0).
__global__ void adam_kernel(const float *p, const float *g, const float *lr, const float *m1,
                            const float *m2, const float *b1pow, const float *b2pow, float b1,
                            float b2, float eps, float wd, float dwd, float *po, float *m1o,
                            float *m2o, int64_t n) {
  double bp1 = *b1pow, bp2 = *b2pow;
  float keep = (float)(1.0 - (double)*lr * dwd);
  // The CPU rejects pows >= 1 with an error; here a NaN step makes it visible.
  float lr_t = (bp1 < 1.0 && bp2 < 1.0) ? (float)((double)*lr * sqrt(1.0 - bp2) / (1.0 - bp1))
                                        : __int_as_float(0x7fc00000);
  GRID_LOOP(i, n) {
    float pi = p[i], gi = wd != 0.0f ? g[i] + wd * pi : g[i];
    float a = b1 * m1[i] + (1.0f - b1) * gi;
    float b = b2 * m2[i] + (1.0f - b2) * gi * gi;
    m1o[i] = a;
    m2o[i] = b;
    po[i] = pi * keep - lr_t * a / (sqrtf(b) + eps);
  }
}

// Separate launch: the pows may be updated in place, and every block of
// adam_kernel reads them first.
__global__ void adam_pows_kernel(const float *b1pow, const float *b2pow, float b1, float b2,
                                 float *b1o, float *b2o) {
  double p1 = *b1pow, p2 = *b2pow;
  *b1o = (float)(p1 * b1);
  *b2o = (float)(p2 * b2);
}

}  // namespace

#define LAUNCH(n) blocks_for(n), kThreads, 0, s

extern "C" {

cudaError_t pe_cu_binary(int op, const pe_cu_plan *p, const float *a, const float *b, float *out,
                         cudaStream_t s) {
  if (p->numel == 0) return cudaSuccess;
  if (op == 0)
    binary_kernel<0><<<LAUNCH(p->numel)>>>(*p, a, b, out);
  else if (op == 1)
    binary_kernel<1><<<LAUNCH(p->numel)>>>(*p, a, b, out);
  else
    binary_kernel<2><<<LAUNCH(p->numel)>>>(*p, a, b, out);
  return cudaGetLastError();
}

// Targets and reduced elements per target of r.
static void reduce_sizes(const pe_cu_reduce *r, int64_t *tn, int64_t *rn) {
  int64_t t = 1, on = 1;
  for (int d = 0; d < r->nd; d++) {
    t *= r->t[d];
    on *= r->out[d];
  }
  *tn = t;
  *rn = t ? on / t : 0;
}

// Parts per target: enough blocks to fill the GPU (about 512) when there
// are few targets, each part at least kReduceChunk elements; 1: the block
// kernel alone. A pure function of the sizes, so the sums' order is fixed.
constexpr int64_t kReduceBlocks = 512, kReduceChunk = 2048;
static int64_t reduce_parts(int64_t tn, int64_t rn) {
  if (tn <= 0 || rn < 2 * kReduceChunk || tn >= kReduceBlocks) return 1;
  int64_t want = (kReduceBlocks + tn - 1) / tn, most = rn / kReduceChunk;
  return want < most ? want : most;
}

size_t pe_cu_reduce_bcast_ws(const pe_cu_reduce *r) {
  int64_t tn, rn;
  reduce_sizes(r, &tn, &rn);
  int64_t P = reduce_parts(tn, rn);
  return P > 1 ? (size_t)(tn * P) * sizeof(double) : 0;
}

cudaError_t pe_cu_reduce_bcast(const pe_cu_reduce *r, const float *src, const float *u, float scale,
                               float *dst, double *ws, size_t ws_bytes, cudaStream_t s) {
  int64_t tn, rn;
  reduce_sizes(r, &tn, &rn);
  if (tn == 0) return cudaSuccess;
  int64_t P = reduce_parts(tn, rn);
  if (P > 1 && ws && ws_bytes >= (size_t)(tn * P) * sizeof(double)) {
    int64_t chunk = (rn + P - 1) / P, blocks = tn * P;
    unsigned grid = blocks > 65535 ? 65535 : (unsigned)blocks;
    reduce_part_kernel<<<grid, kThreads, 0, s>>>(*r, tn, rn, P, chunk, src, u, ws);
    reduce_parts_kernel<<<LAUNCH(tn)>>>(ws, tn, P, scale, dst);
  } else if (rn < 64) {
    reduce_thread_kernel<<<LAUNCH(tn)>>>(*r, tn, rn, src, u, scale, dst);
  } else {
    unsigned grid = tn > 65535 ? 65535 : (unsigned)tn;
    reduce_block_kernel<<<grid, kThreads, 0, s>>>(*r, tn, rn, src, u, scale, dst);
  }
  return cudaGetLastError();
}

cudaError_t pe_cu_affine(const float *x, float *o, int64_t n, float a, float b, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  affine_kernel<<<LAUNCH(n)>>>(x, o, n, a, b);
  return cudaGetLastError();
}

cudaError_t pe_cu_sum(const float *const *xs, int k, float *out, int64_t n, cudaStream_t s) {
  if (n == 0 || k < 1) return cudaSuccess;
  sum_args a;
  a.k = k > 64 ? 64 : k;
  for (int j = 0; j < a.k; j++) a.x[j] = xs[j];
  sum_kernel<<<LAUNCH(n)>>>(a, out, n);
  return cudaGetLastError();
}

cudaError_t pe_cu_fill(void *p, int dtype, double v, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  switch (dtype) {
    case 0: fill_kernel<float><<<LAUNCH(n)>>>((float *)p, (float)v, n); break;
    case 1: fill_kernel<double><<<LAUNCH(n)>>>((double *)p, v, n); break;
    case 2: fill_kernel<int32_t><<<LAUNCH(n)>>>((int32_t *)p, (int32_t)v, n); break;
    case 3: fill_kernel<int64_t><<<LAUNCH(n)>>>((int64_t *)p, (int64_t)v, n); break;
    default: return cudaMemsetAsync(p, (int)(uint8_t)v, (size_t)n, s);
  }
  return cudaGetLastError();
}

cudaError_t pe_cu_uniform(void *p, int dtype, int64_t n, uint64_t seed, uint64_t base,
                          const uint64_t *delta, double lo, double hi, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (dtype == 1) {
    uniform_f64<<<LAUNCH(n)>>>((double *)p, n, seed, base, delta, lo, hi);
  } else {
    float fhi = (float)hi, below = lo < hi ? nextafterf(fhi, -INFINITY) : fhi;
    uniform_f32<<<LAUNCH(n)>>>((float *)p, n, seed, base, delta, lo, hi, fhi, below);
  }
  return cudaGetLastError();
}

cudaError_t pe_cu_gaussian(void *p, int dtype, int64_t n, uint64_t seed, uint64_t base,
                           const uint64_t *delta, double mean, double sd, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (dtype == 1)
    gaussian_kernel<double><<<LAUNCH(n)>>>((double *)p, n, seed, base, delta, mean, sd);
  else
    gaussian_kernel<float><<<LAUNCH(n)>>>((float *)p, n, seed, base, delta, mean, sd);
  return cudaGetLastError();
}

cudaError_t pe_cu_dropout(const float *x, float *out, uint8_t *mask, int64_t n, uint64_t seed,
                          uint64_t base, const uint64_t *delta, double p, float scale,
                          cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  dropout_kernel<<<LAUNCH(n)>>>(x, out, mask, n, seed, base, delta, p, scale);
  return cudaGetLastError();
}

cudaError_t pe_cu_scale_u8(const float *x, const uint8_t *mask, float *out, int64_t n, float scale,
                           cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  scale_u8_kernel<<<LAUNCH(n)>>>(x, mask, out, n, scale);
  return cudaGetLastError();
}

cudaError_t pe_cu_act_fwd(pe_cu_act a, const float *x, float *y, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (a == PE_CU_RELU)
    act_fwd_kernel<PE_CU_RELU><<<LAUNCH(n)>>>(x, y, n);
  else if (a == PE_CU_TANH)
    act_fwd_kernel<PE_CU_TANH><<<LAUNCH(n)>>>(x, y, n);
  else
    act_fwd_kernel<PE_CU_SIGMOID><<<LAUNCH(n)>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t pe_cu_act_bwd(pe_cu_act a, const float *x, const float *y, const float *dy, float *dx,
                          int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (a == PE_CU_RELU)
    act_bwd_kernel<PE_CU_RELU><<<LAUNCH(n)>>>(x, y, dy, dx, n);
  else if (a == PE_CU_TANH)
    act_bwd_kernel<PE_CU_TANH><<<LAUNCH(n)>>>(x, y, dy, dx, n);
  else
    act_bwd_kernel<PE_CU_SIGMOID><<<LAUNCH(n)>>>(x, y, dy, dx, n);
  return cudaGetLastError();
}

cudaError_t pe_cu_lr_schedule(const int64_t *step, int64_t *step_out, float *lr,
                              const pe_lr_params *p, cudaStream_t s) {
  lr_schedule_kernel<<<1, 1, 0, s>>>(step, step_out, lr, *p);
  return cudaGetLastError();
}

cudaError_t pe_cu_sgd(const float *p, const float *g, const float *lr, float wd, float *po,
                      int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  sgd_kernel<<<LAUNCH(n)>>>(p, g, lr, wd, po, n);
  return cudaGetLastError();
}

cudaError_t pe_cu_momentum(const float *p, const float *g, const float *v, const float *lr,
                           float mu, int nesterov, float wd, float *po, float *vo, int64_t n,
                           cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  momentum_kernel<<<LAUNCH(n)>>>(p, g, v, lr, mu, nesterov, wd, po, vo, n);
  return cudaGetLastError();
}

cudaError_t pe_cu_adam(const float *p, const float *g, const float *lr, const float *m1,
                       const float *m2, const float *b1pow, const float *b2pow, float b1, float b2,
                       float eps, float wd, float dwd, float *po, float *m1o, float *m2o,
                       float *b1o, float *b2o, int64_t n, cudaStream_t s) {
  if (n > 0)
    adam_kernel<<<LAUNCH(n)>>>(p, g, lr, m1, m2, b1pow, b2pow, b1, b2, eps, wd, dwd, po, m1o, m2o,
                               n);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  adam_pows_kernel<<<1, 1, 0, s>>>(b1pow, b2pow, b1, b2, b1o, b2o);
  return cudaGetLastError();
}

}  // extern "C"
