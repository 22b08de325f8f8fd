/* Per-thread floating-point control: flushing denormals to zero.
 *
 * Why. Training leaves values that decay geometrically toward zero: the
 * momentum velocity of a dead ReLU unit shrinks by mu = 0.9 per step and
 * enters the denormal range (< 1.2e-38 in f32) after some hundreds of steps.
 * x86 handles denormal operands and results in microcode, ~100x slower per
 * element. Measured on the MLP (pe-bench train --model mlp): the momentum
 * update of such a weight went from ~25 us to ~430 us per step late in the
 * first epoch; with flushing it stays at ~25 us and a whole epoch at batch
 * 64 on one core runs ~8% more samples/s. TensorFlow flushes on its CPU
 * threads by default; PyTorch offers torch.set_flush_denormal. Values that
 * small carry no information for training, so the executors flush by
 * default (pe_runtime_opts.keep_denormals, pe_exec_opts.keep_denormals).
 *
 * What. "Flush" sets both halves: results that would be denormal become
 * zero (x86 MXCSR FTZ, bit 15) and denormal inputs read as zero (x86 MXCSR
 * DAZ, bit 6). On aarch64 the FPCR FZ bit (24) does both. Elsewhere the
 * calls are no-ops that report "unsupported".
 *
 * Scope. The state is per thread (it is a register of the thread). On
 * Linux a new thread starts with the control state of the thread that
 * created it (clone copies the registers; tests/core/test_fpenv.c checks
 * it). So setting it on a pool worker before its first OpenMP parallel
 * region also covers the OpenMP team that libgomp creates from that worker,
 * which is where oneDNN runs. Threads created earlier (an OpenMP team that
 * already exists) keep the state they had. */
#ifndef PE_CORE_FPENV_H
#define PE_CORE_FPENV_H

#include <stdbool.h>

/* Whether this build can flush denormals on this architecture. */
bool pe_fpenv_supported(void);
/* Set (on) or clear (!on) flush-to-zero and denormals-are-zero on the
 * calling thread. Returns false, changing nothing, where unsupported. */
bool pe_fpenv_flush_denormals(bool on);
/* Whether the calling thread currently flushes denormals (FTZ and, where
 * the CPU has it, DAZ on x86). false where unsupported. */
bool pe_fpenv_denormals_flushed(void);

/* Scoped use: saved = pe_fpenv_save(); pe_fpenv_flush_denormals(true); ...
 * pe_fpenv_restore(saved). Only the denormal bits are saved and restored;
 * rounding mode and exception masks are left alone. */
typedef unsigned pe_fpenv_state;
pe_fpenv_state pe_fpenv_save(void);
void pe_fpenv_restore(pe_fpenv_state saved);

#endif
