/* pe-bench's FMA peak: the multiply-add rate a team of cores reaches at the
 * vector width oneDNN runs on this machine, measured.
 *
 * Why: the roofline (roofline.h) says how close a step is to its kernels'
 * own time in oneDNN; it cannot say how close those kernels are to the
 * hardware. A step whose kernels run at the FMA units' peak can only get
 * faster with fewer operations, and a target that asks for more than the
 * peak cannot be met by any implementation. Measured, not read from a
 * table: the clock under load, the vCPU's share of a core and
 * ONEDNN_MAX_CPU_ISA all move it.
 *
 * The ISA is oneDNN's effective one (dnnl_get_effective_cpu_isa, which
 * honours ONEDNN_MAX_CPU_ISA): AVX-512 (16 lanes, FMA), AVX2 with FMA
 * (8 lanes), else SSE (4 lanes, a multiply and an add, as kernels without
 * FMA run). Each thread runs independent chains of multiply-adds in
 * registers, enough of them to cover the units' latency; no memory is
 * touched.
 *
 * Threading: runs an OpenMP team of `threads` from the calling thread; call
 * it with no kernels running (as pe_roof_time). */
#ifndef PE_BENCH_FMA_PEAK_H
#define PE_BENCH_FMA_PEAK_H

typedef struct pe_fma_peak {
  const char *isa; /* "avx512", "avx2", "sse" (static) */
  int lanes;       /* floats per vector */
  int threads;
  double gflops; /* the team's best of the tries; a multiply-add counts 2 */
} pe_fma_peak;

/* Measure on `threads` (>= 1) threads: `tries` (>= 1) runs of about
 * `seconds` each, the fastest kept (the others lost time to other tenants:
 * runs shorter than a scheduler's time slice, a millisecond, let some of
 * them run whole on a loaded machine). */
void pe_fma_peak_measure(int threads, int tries, double seconds, pe_fma_peak *out);

#endif
