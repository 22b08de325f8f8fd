/* Launchers of the hand-written CUDA kernels (kernels_*.cu), called by the
 * C glue (ops_cuda_*.c). Every launcher enqueues on `s` and returns the
 * launch's cudaError_t (cudaSuccess, or the configuration/launch failure);
 * nothing here synchronises. Pointers are device memory unless noted.
 * f32 throughout, except fill/random/top_k which take a pe_dtype. */
#ifndef PE_CUDA_KERNELS_H
#define PE_CUDA_KERNELS_H

#include <cuda_runtime.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PE_CU_MAX_DIMS 8 /* = PE_MAX_DIMS */

/* A broadcast plan (the same as ops/cpu/broadcast.h's pe_bcast). */
typedef struct pe_cu_plan {
  int nd;
  int64_t n[PE_CU_MAX_DIMS];
  int64_t sa[PE_CU_MAX_DIMS];
  int64_t sb[PE_CU_MAX_DIMS];
  int64_t numel;
} pe_cu_plan;

/* Sum of `src` (shape out, contiguous) into dst (shape t: out with some
 * dims 1), optionally times u (aligned shape ua; a dim 1 broadcasts),
 * times scale. nd = rank of out. */
typedef struct pe_cu_reduce {
  int nd;
  int64_t out[PE_CU_MAX_DIMS];
  int64_t t[PE_CU_MAX_DIMS];
  int64_t u[PE_CU_MAX_DIMS];
} pe_cu_reduce;

typedef enum pe_cu_act { PE_CU_RELU = 0, PE_CU_TANH = 1, PE_CU_SIGMOID = 2 } pe_cu_act;

/* elementwise (kernels_elementwise.cu) */
cudaError_t pe_cu_binary(int op /* pe_binop */, const pe_cu_plan *p, const float *a, const float *b,
                         float *out, cudaStream_t s);
/* dst[t] = scale * sum over the broadcast dims of src (.* u). With few
 * targets and long sums (a convolution's bias gradient) the sum is split
 * into parts summed in a fixed order, which needs ws of
 * pe_cu_reduce_bcast_ws(r) bytes (0: none); without it (ws NULL) one
 * block sums each target. */
size_t pe_cu_reduce_bcast_ws(const pe_cu_reduce *r);
cudaError_t pe_cu_reduce_bcast(const pe_cu_reduce *r, const float *src, const float *u, float scale,
                               float *dst, double *ws, size_t ws_bytes, cudaStream_t s);
cudaError_t pe_cu_affine(const float *x, float *o, int64_t n, float a, float b, cudaStream_t s);
/* out = sum of xs[0..k) (k <= 64; out may be one of them). xs: host array. */
cudaError_t pe_cu_sum(const float *const *xs, int k, float *out, int64_t n, cudaStream_t s);
cudaError_t pe_cu_fill(void *p, int dtype, double v, int64_t n, cudaStream_t s);
/* Random kernels: counters from base (the host's reservation), plus *delta
 * when delta is not NULL (the generator's step delta of a captured step,
 * cuda/cuda_graph.h; gaussian_random adds *delta / 2, its counter pairs). */
cudaError_t pe_cu_uniform(void *p, int dtype, int64_t n, uint64_t seed, uint64_t base,
                          const uint64_t *delta, double lo, double hi, cudaStream_t s);
cudaError_t pe_cu_gaussian(void *p, int dtype, int64_t n, uint64_t seed, uint64_t base,
                           const uint64_t *delta, double mean, double sd, cudaStream_t s);
cudaError_t pe_cu_dropout(const float *x, float *out, uint8_t *mask, int64_t n, uint64_t seed,
                          uint64_t base, const uint64_t *delta, double p, float scale,
                          cudaStream_t s);
cudaError_t pe_cu_scale_u8(const float *x, const uint8_t *mask, float *out, int64_t n, float scale,
                           cudaStream_t s);
cudaError_t pe_cu_act_fwd(pe_cu_act a, const float *x, float *y, int64_t n, cudaStream_t s);
/* relu reads x, tanh/sigmoid read y (the other may be NULL). */
cudaError_t pe_cu_act_bwd(pe_cu_act a, const float *x, const float *y, const float *dy, float *dx,
                          int64_t n, cudaStream_t s);
/* lr_schedule: *lr = pe_lr_at(p, *step) and *step_out = *step + 1, by one
 * thread (step_out may alias step). */
struct pe_lr_params;
cudaError_t pe_cu_lr_schedule(const int64_t *step, int64_t *step_out, float *lr,
                              const struct pe_lr_params *p, cudaStream_t s);
/* wd: the L2 coefficient (pe_optimizer_l2_coeff; 0: none); adam's dwd: the
 * decoupled (AdamW) one (pe_optimizer_decoupled_coeff; 0: none). */
cudaError_t pe_cu_sgd(const float *p, const float *g, const float *lr, float wd, float *po,
                      int64_t n, cudaStream_t s);
cudaError_t pe_cu_momentum(const float *p, const float *g, const float *v, const float *lr,
                           float mu, int nesterov, float wd, float *po, float *vo, int64_t n,
                           cudaStream_t s);
cudaError_t pe_cu_adam(const float *p, const float *g, const float *lr, const float *m1,
                       const float *m2, const float *b1pow, const float *b2pow, float b1, float b2,
                       float eps, float wd, float dwd, float *po, float *m1o, float *m2o,
                       float *b1o, float *b2o, int64_t n, cudaStream_t s);

/* losses, reductions, metrics, batch norm (kernels_nn.cu) */
cudaError_t pe_cu_swce(const float *x, const int64_t *hard, const float *soft, float *sm,
                       float *loss, int64_t rows, int64_t C, cudaStream_t s);
cudaError_t pe_cu_swce_grad(const float *sm, const int64_t *hard, const float *soft,
                            const float *dloss, const float *dsm, float *dx, int64_t rows,
                            int64_t C, cudaStream_t s);
cudaError_t pe_cu_ce(const float *x, const int64_t *hard, const float *soft, float *y, int64_t rows,
                     int64_t C, cudaStream_t s);
cudaError_t pe_cu_ce_grad(const float *x, const int64_t *hard, const float *soft, const float *dy,
                          float *dx, int64_t rows, int64_t C, cudaStream_t s);
/* out[0] = mean of x (NaN when n == 0), summed in double. */
cudaError_t pe_cu_mean(const float *x, int64_t n, float *out, cudaStream_t s);
/* clip_by_global_norm over k tensors: sq (k doubles of device scratch) gets
 * each x[j]'s sum of squares (one block each, deterministic), then out[j] =
 * x[j] times pe_clip_coef (ops/clip.h) of the global norm, which norm (may
 * be NULL) gets; out[j] may alias x[j]. */
cudaError_t pe_cu_clip_by_global_norm(const float *const *x, float *const *out, const int64_t *n,
                                      int k, double max_norm, double *sq, float *norm,
                                      cudaStream_t s);
/* dx[i] = dout[0] / n (dout NULL: 0). */
cudaError_t pe_cu_mean_grad(const float *dout, float *dx, int64_t n, cudaStream_t s);
cudaError_t pe_cu_accuracy(const void *x, int dtype, const int64_t *label, int64_t n, int64_t cls,
                           int64_t k, float *acc, int64_t *correct, int64_t *total, cudaStream_t s);
cudaError_t pe_cu_top_k(const void *x, int dtype, int64_t rows, int64_t len, int64_t k, void *out,
                        int64_t *idx, cudaStream_t s);
/* x viewed as [N, C, S]. Training: saved_mean/saved_var (biased) from the
 * batch, y normalised with them, running stats updated with momentum
 * (mean_out/var_out may alias mean/var; either pair may be NULL). Test:
 * y with the running stats, saved_* receive copies of them. */
/* scratch: pe_cu_bn_scratch_bytes(N, C, S) bytes of device memory, 8-byte
 * aligned, for the partial sums of the per-channel reductions. */
size_t pe_cu_bn_scratch_bytes(int64_t N, int64_t C, int64_t S);
cudaError_t pe_cu_bn_fwd(const float *x, const float *scale, const float *bias, const float *mean,
                         const float *var, float *y, float *mean_out, float *var_out,
                         float *saved_mean, float *saved_var, int64_t N, int64_t C, int64_t S,
                         float momentum, float eps, int is_test, void *scratch, cudaStream_t s);
cudaError_t pe_cu_bn_bwd(const float *x, const float *scale, const float *saved_mean,
                         const float *saved_var, const float *dy, float *dx, float *dscale,
                         float *dbias, int64_t N, int64_t C, int64_t S, float eps, int is_test,
                         void *scratch, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
