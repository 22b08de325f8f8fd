/* The FMA peak of a team of cores (contract in fma_peak.h). */
#include "fma_peak.h"

#include <dnnl.h>
#include <immintrin.h>
#include <omp.h>

#include "core/clock.h"

/* Independent chains per thread: an FMA's latency (4-5 cycles) times the
 * units issuing them (2), with room to spare. Written out (STEP12) so that
 * the chains stay in registers at any optimisation level. */
#define CHAINS 12
/* clang-format off */
#define STEP12(OP) \
  do { OP(a[0]); OP(a[1]); OP(a[2]); OP(a[3]); OP(a[4]); OP(a[5]); \
       OP(a[6]); OP(a[7]); OP(a[8]); OP(a[9]); OP(a[10]); OP(a[11]); } while (0)
/* clang-format on */

/* Each kernel runs `iters` rounds of CHAINS multiply-adds and returns a
 * value that depends on all of them, so nothing is optimised away. The
 * chains converge (x <- 0.999 x + 0.001): no overflow, no denormals. */
__attribute__((target("avx512f"))) static float run_avx512(long iters) {
  __m512 a[CHAINS], m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
  for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
#define FMA512(x) x = _mm512_fmadd_ps(x, m, c)
  for (long r = 0; r < iters; r++) STEP12(FMA512);
  for (int i = 1; i < CHAINS; i++) a[0] = _mm512_add_ps(a[0], a[i]);
  return _mm512_reduce_add_ps(a[0]);
}

__attribute__((target("avx2,fma"))) static float run_avx2(long iters) {
  __m256 a[CHAINS], m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
  for (int i = 0; i < CHAINS; i++) a[i] = _mm256_set1_ps((float)i);
#define FMA256(x) x = _mm256_fmadd_ps(x, m, c)
  for (long r = 0; r < iters; r++) STEP12(FMA256);
  for (int i = 1; i < CHAINS; i++) a[0] = _mm256_add_ps(a[0], a[i]);
  float o[8];
  _mm256_storeu_ps(o, a[0]);
  return o[0] + o[7];
}

static float run_sse(long iters) {
  __m128 a[CHAINS], m = _mm_set1_ps(0.999f), c = _mm_set1_ps(0.001f);
  for (int i = 0; i < CHAINS; i++) a[i] = _mm_set1_ps((float)i);
#define MULADD128(x) x = _mm_add_ps(_mm_mul_ps(x, m), c)
  for (long r = 0; r < iters; r++) STEP12(MULADD128);
  for (int i = 1; i < CHAINS; i++) a[0] = _mm_add_ps(a[0], a[i]);
  float o[4];
  _mm_storeu_ps(o, a[0]);
  return o[0] + o[3];
}

typedef float (*kernel_fn)(long);

/* The team's rate in GFLOPS for `iters` rounds per thread; the team
 * OpenMP gives (OMP_THREAD_LIMIT can make it smaller than asked) is the
 * one counted. */
static double team_rate(kernel_fn k, int lanes, int threads, long iters) {
  volatile float sink = 0;
  int team = 1;
  double t0 = pe_now_s();
#pragma omp parallel num_threads(threads)
  {
    float v = k(iters);
#pragma omp atomic
    sink += v;
#pragma omp master
    team = omp_get_num_threads();
  }
  double dt = pe_now_s() - t0;
  (void)sink;
  double flop = 2.0 * CHAINS * lanes * (double)iters * team;
  return dt > 0 ? flop / dt * 1e-9 : 0;
}

void pe_fma_peak_measure(int threads, int tries, double seconds, pe_fma_peak *out) {
  if (threads < 1) threads = 1;
  if (tries < 1) tries = 1;
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  kernel_fn k = run_sse;
  *out = (pe_fma_peak){.isa = "sse", .lanes = 4, .threads = threads};
  __builtin_cpu_init();
  if ((isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core) {
    k = run_avx512;
    out->isa = "avx512";
    out->lanes = 16;
  } else if ((isa & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2 && __builtin_cpu_supports("fma")) {
    k = run_avx2;
    out->isa = "avx2";
    out->lanes = 8;
  }
  /* Calibrate on a short run, then size the tries to `seconds`. */
  long iters = 1L << 16;
  double rate = team_rate(k, out->lanes, threads, iters);
  if (rate > 0 && seconds > 0) {
    double want = seconds * rate * 1e9 / (2.0 * CHAINS * out->lanes * threads);
    iters = want < (double)(1L << 16) ? 1L << 16 : want > 1e10 ? (long)1e10 : (long)want;
  }
  for (int t = 0; t < tries; t++) {
    double r = team_rate(k, out->lanes, threads, iters);
    if (r > out->gflops) out->gflops = r;
  }
}
