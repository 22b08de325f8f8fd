/* Launchers of the pointwise losses and smooth-l1 (kernels_loss.cu) and of the embedding
 * lookup (kernels_embedding.cu). f32 values, i64 ids; they enqueue on `s`
 * and return the launch's cudaError_t. */
#ifndef PE_CUDA_KERNELS_LOSS_H
#define PE_CUDA_KERNELS_LOSS_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* huber_loss: r = y - x, out = r^2/2 (|r| <= delta) else delta (|r| -
 * delta/2); residual (may be NULL) = r. Gradient: h = r clamped to
 * [-delta, delta], dx = -h dout, dy = h dout (either may be NULL). */
cudaError_t pe_cu_huber(const float *x, const float *y, float *out, float *residual, int64_t n,
                        float delta, cudaStream_t s);
cudaError_t pe_cu_huber_grad(const float *x, const float *y, const float *dout, float *dx,
                             float *dy, int64_t n, float delta, cudaStream_t s);

/* sigmoid_cross_entropy_with_logits over n elements; 0 where z ==
 * ignore. normalize: times 1 / max(count of z != ignore, 1e-6), counted
 * into *k (one float of device scratch; unused otherwise). The gradient
 * (sigmoid(x) - z) dout with the same mask and factor. */
cudaError_t pe_cu_sce(const float *x, const float *z, float *out, int64_t n, float ignore,
                      int normalize, float *k, cudaStream_t s);
cudaError_t pe_cu_sce_grad(const float *x, const float *z, const float *dout, float *dx, int64_t n,
                           float ignore, int normalize, float *k, cudaStream_t s);

/* smooth_l1_loss over rows of x [n, row]: d = iw (x - y) (diff, may be
 * NULL, gets d), out[r] = the row's sum of ow f(d) with f(d) = 0.5
 * (sigma d)^2 where |d| < 1 / sigma^2, else |d| - 0.5 / sigma^2 (iw, ow
 * NULL: ones). Gradient: dx = iw (ow clamp(sigma^2 d, -1, 1) dout[r] +
 * ddiff), dy = -dx (dout, ddiff NULL: no term; dx, dy may be NULL). */
cudaError_t pe_cu_smooth_l1(const float *x, const float *y, const float *iw, const float *ow,
                            float *diff, float *out, int64_t n, int64_t row, float sigma,
                            cudaStream_t s);
cudaError_t pe_cu_smooth_l1_grad(const float *x, const float *y, const float *iw, const float *ow,
                                 const float *dout, const float *ddiff, float *dx, float *dy,
                                 int64_t n, int64_t row, float sigma, cudaStream_t s);

/* lookup_table_v2: out[i, :] = w[ids[i], :] for n ids, rows of dim; the
 * row pad (-1: none) reads as zeros; an id outside [0, vocab) gives a NaN
 * row (the CPU kernel's error would need a device sync here). */
cudaError_t pe_cu_embedding(const float *w, const int64_t *ids, float *out, int64_t n, int64_t dim,
                            int64_t vocab, int64_t pad, cudaStream_t s);
/* Scratch of the dense gradient for n ids: bytes, or 0 when the sort's
 * size query fails (then *err has the error). */
size_t pe_cu_embedding_grad_scratch(int64_t n, cudaError_t *err);
/* Dense gradient: dw [vocab, dim] = zeros plus each id's dout row, summed
 * in batch order (the CPU kernel's order: the same bits). pad and ids
 * outside [0, vocab) add nothing. n <= INT32_MAX (the sort's count). */
cudaError_t pe_cu_embedding_grad(const int64_t *ids, const float *dout, float *dw, int64_t n,
                                 int64_t dim, int64_t vocab, int64_t pad, void *scratch,
                                 size_t scratch_bytes, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
