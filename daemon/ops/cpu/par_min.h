/* When a CPU kernel splits a loop across its OpenMP team: one rule for all.
 *
 *   if (pe_par_split(n))  ...  n = the elements the loop touches
 *
 * A loop over more than PE_PAR_MIN elements runs on the kernel's team
 * (pe_kernel_threads), a shorter one on the calling thread: below it the
 * team's fork and join cost more than the second thread saves. Kernels used
 * to test `n > min` here and `n >= min` there (optimizer, clip, creation,
 * dropout, batch_norm), so a tensor of exactly 32768 elements ([256,128])
 * went to the team in one and not in the other.
 *
 * Where a loop is element-wise, or splits whole independent sums (per
 * channel, per row, a fixed partition), the split does not change results
 * on any thread count. Full sums (pe_sum_f32, pe_dot_f32 for clip's sum of
 * squares) add in a fixed partition above the threshold and serially at or
 * below it, so their bits may change where a tensor crosses PE_PAR_MIN, but
 * not with the threads.
 *
 * The value: on the 2-core development host under load (7 on 2 cores,
 * OMP_WAIT_POLICY=passive, as the daemon runs), a two-thread add or relu
 * loop cost about 2 us more than one thread from 4k up to 131k elements
 * and broke even near 262k; the fork/join wake-up dominated, and the second
 * core was rarely free. That says more about the load than about an idle
 * host, so the value stays as it was. tests/ops/test_ops_par_split.c checks
 * the rule on the kernels. */
#ifndef PE_OPS_CPU_PAR_MIN_H
#define PE_OPS_CPU_PAR_MIN_H

#include <stdbool.h>
#include <stdint.h>

#define PE_PAR_MIN 32768

static inline bool pe_par_split(int64_t n) {
  return n > PE_PAR_MIN;
}

#endif
