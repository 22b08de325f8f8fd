/* relu loops that keep NaN (see relu.h). */
#include "ops/cpu/relu.h"

#include "ops/cpu/par_min.h"
#include "ops/cpu/simd_for.h"

/* Small tensors (one batch of a layer's output is often under PE_PAR_MIN)
 * take a plain vector loop on the calling thread (simd_for.h says why). */
void pe_relu_f32(pe_kernel_ctx *c, float *out, const float *x, int64_t n) {
  PE_SIMD_FOR(i, n, pe_par_split(n), pe_kernel_threads(c), out[i] = pe_relu(x[i]););
}

void pe_relu_grad_f32(pe_kernel_ctx *c, float *dx, const float *y, const float *dy, int64_t n) {
  PE_SIMD_FOR(i, n, pe_par_split(n), pe_kernel_threads(c), dx[i] = pe_relu_grad(y[i], dy[i]););
}
