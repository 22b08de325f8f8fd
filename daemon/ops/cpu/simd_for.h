/* PE_SIMD_FOR: an element-wise vector loop that a team of threads splits
 * once it is large enough, and that stays a plain vector loop below that.
 *
 *   PE_SIMD_FOR(i, n, par, nt, body...)
 *
 * runs `for (int64_t i = 0; i < n; i++) body` as `omp parallel for simd
 * num_threads(nt) schedule(static)` when `par` is true, else as `omp simd`
 * on the calling thread. `par` is the caller's size test, pe_par_split(n)
 * (par_min.h); n, par and nt are evaluated once.
 *
 * Why not `omp parallel for simd if (par)`: an `if` without a modifier on
 * a combined construct applies to its simd part too (OpenMP 5.0), so when
 * par is false GCC runs the loop one element at a time, besides entering
 * it through libgomp as a team of one. Measured (min of 3000 op calls, 2
 * threads): momentum [64,256] 3.9 us against 9.9 with the `if` form, sgd
 * 2.5 us against 5.8.
 * Only for element-wise bodies (element i reads inputs at i only), where
 * vector and scalar loops give the same bits. Not for reductions: a vector
 * sum adds in another order than a scalar serial loop (clip.c's sum of
 * squares uses pe_dot_f32's fixed partition instead). */
#ifndef PE_OPS_CPU_SIMD_FOR_H
#define PE_OPS_CPU_SIMD_FOR_H

#include <stdint.h>

/* clang-format would split the for statement after each _Pragma. */
/* clang-format off */
#define PE_SIMD_FOR(i, n, par, nt, ...)                                        \
  do {                                                                         \
    const int64_t pe_simd_n_ = (n);                                            \
    if (par) {                                                                 \
      const int pe_simd_nt_ = (nt);                                            \
      _Pragma("omp parallel for simd num_threads(pe_simd_nt_) schedule(static)") \
      for (int64_t i = 0; i < pe_simd_n_; i++) __VA_ARGS__                     \
    } else {                                                                   \
      _Pragma("omp simd")                                                      \
      for (int64_t i = 0; i < pe_simd_n_; i++) __VA_ARGS__                     \
    }                                                                          \
  } while (0)
/* clang-format on */

#endif
