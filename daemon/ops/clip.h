/* The clipping coefficient of clip_by_global_norm (ops/cpu/clip.c), shared
 * by the cpu kernel and the cuda kernel (kernels_nn.cu), which computes it on
 * the device: max_norm / (norm + 1e-6), at most 1 (PyTorch's
 * clip_grad_norm_). A NaN norm gives NaN, which is not < 1: no scaling. */
#ifndef PE_OPS_CLIP_H
#define PE_OPS_CLIP_H

#ifdef __CUDACC__
#define PE_CLIP_HD __host__ __device__
#else
#define PE_CLIP_HD
#endif

PE_CLIP_HD static inline double pe_clip_coef(double norm, double max_norm) {
  double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

#endif
