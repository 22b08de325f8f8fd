/* How many threads a oneDNN matrix product gets, and when two independent
 * products of one kernel run side by side instead.
 *
 *   pe_gemm_team(m, k, n, budget)       1 or budget
 *   pe_gemm_side_by_side(m, k, n, budget)
 *
 * Pure functions of the product's size (m*k*n multiply-adds) and the
 * place's thread budget (pe_kernel_threads), so tests check them alone and
 * a kernel keys its cached primitives by (sizes, budget).
 *
 * Why a product below PE_GEMM_TEAM_MIN_MACS runs on one thread: oneDNN 2.6
 * splits a brgemm matmul over blocks of its output, and for the MLP's
 * forward products up to [128,784]x[784,128] it gives all of them to one
 * thread: the second thread only adds the fork and join. Measured
 * (min of 400 interleaved calls, OMP_WAIT_POLICY=passive, 2-core Xeon
 * with AVX-512, load 8): 1 against 2 threads 5.3 / 9.6 us at 128x128x10,
 * 37.5 / 43.8 us at 128x128x128, 174.5 / 181.0 us at 128x784x128
 * (12.8M), 346 / 195 us at 128x784x256 (25.7M); at ONEDNN_MAX_CPU_ISA=AVX2
 * two threads were 2-5% slower up to 256x784x256 as well. The median
 * under load is worse for two threads at every size (a woken team member
 * waits for a busy core), so the threshold errs upward: 2^24.
 *
 * Why two products side by side: a gradient's dX and dY products are
 * independent; when each is single-threaded by the rule above and large
 * enough that one thread's share outweighs waking a second (about 5 us
 * with the passive policy), each runs whole on its own thread. Measured
 * as above, both products of a gradient, min / median us, one thread,
 * two-thread primitives one after the other, side by side: 128x256x128
 * 140.6/149.7, 116.5/171.3, 108.5/157.2 (AVX2: 230.7/237.4, 163.7/256.4,
 * 132.3/241.8); 128x64x64 (0.5M) 18.8/19.2, 31.7/34.5, 22.6/23.8: below
 * 2^20 one thread wins. A gradient's transposed products do split on two
 * threads (the second column), but less well than side by side. Each is
 * the same one-thread primitive as on a budget of 1, so the results are
 * the same bits as with one thread. */
#ifndef PE_OPS_CPU_GEMM_TEAM_H
#define PE_OPS_CPU_GEMM_TEAM_H

#include <stdbool.h>
#include <stdint.h>

#define PE_GEMM_TEAM_MIN_MACS (INT64_C(1) << 24)
#define PE_GEMM_SIDE_MIN_MACS (INT64_C(1) << 20)

/* m*k*n, saturated at INT64_MAX; 0 when a dim is not positive. */
static inline int64_t pe_gemm_macs(int64_t m, int64_t k, int64_t n) {
  if (m <= 0 || k <= 0 || n <= 0) return 0;
  if (m > INT64_MAX / k) return INT64_MAX;
  int64_t mk = m * k;
  return mk > INT64_MAX / n ? INT64_MAX : mk * n;
}

static inline int pe_gemm_team(int64_t m, int64_t k, int64_t n, int budget) {
  if (budget <= 1) return 1;
  return pe_gemm_macs(m, k, n) < PE_GEMM_TEAM_MIN_MACS ? 1 : budget;
}

/* Two independent products of this size (each on one thread) run at once. */
static inline bool pe_gemm_side_by_side(int64_t m, int64_t k, int64_t n, int budget) {
  return budget >= 2 && pe_gemm_team(m, k, n, budget) == 1 &&
         pe_gemm_macs(m, k, n) >= PE_GEMM_SIDE_MIN_MACS;
}

#endif
