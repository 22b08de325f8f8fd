/* Shared by the CUDA kernel glue (ops_cuda_*.c): the kernel functions each
 * file defines for kernel_table.c, and small helpers.
 *
 * Kernel contract on cuda places (same as ops/registry.h): outputs are
 * already sized by the executor on the device allocator, tensor data are
 * device pointers, attributes and slots as on the CPU. A kernel only
 * enqueues work on its stream's cudaStream_t (c->dev->cuda) and never
 * synchronises; errors it returns are launch/enqueue failures or bad
 * attributes (device faults surface at the stream's next sync). */
#ifndef PE_CUDA_OPS_CUDA_H
#define PE_CUDA_OPS_CUDA_H

#include "cuda/cuda_ctx.h"
#include "cuda/kernels.h"
#include "ops/device_ctx.h"
#include "ops/registry.h"

/* The kernel's CUDA context; NULL when the op is not run on a cuda stream. */
static inline pe_cuda_ctx *pe_cu_ctx(const pe_kernel_ctx *c) {
  return c->dev ? (pe_cuda_ctx *)c->dev->cuda : NULL;
}

/* *out = the context, or an error naming the op. */
pe_status *pe_cu_need(pe_kernel_ctx *c, pe_cuda_ctx **out);
/* A failed launch/enqueue as the op's error. */
pe_status *pe_cu_check(pe_kernel_ctx *c, cudaError_t e, const char *what);
/* Zero t on the stream (NULL or empty: nothing). */
pe_status *pe_cu_zero(pe_kernel_ctx *c, pe_cuda_ctx *x, pe_tensor *t);
/* dst := src bytes (sizes must match; same buffer: nothing). */
pe_status *pe_cu_copy(pe_kernel_ctx *c, pe_cuda_ctx *x, pe_tensor *dst, const pe_tensor *src);
/* Every output zero (a pruned output gradient). */
pe_status *pe_cu_zero_outputs(pe_kernel_ctx *c, pe_cuda_ctx *x);
/* The fused forms (pass fuse_conv_act, which runs for cpu and sim places
 * only) have no cuda kernel yet: an error when the op has a Bias input at
 * bias_slot (-1: it has none) or a fuse_activation. */
pe_status *pe_cu_refuse_fused(pe_kernel_ctx *c, int bias_slot);
/* pe_cuda_ctx *x: the kernel's context, else return the error naming the op. */
#define PE_CU_NEED(c, x) \
  pe_cuda_ctx *x;        \
  PE_TRY(pe_cu_need(c, &x))
/* t's f32 data, or NULL for an absent tensor. */
static inline float *pe_cu_f32_or_null(pe_tensor *t) {
  return t ? pe_f32(t) : NULL;
}
/* The optimizers take no sparse gradient on cuda places: an error naming
 * the GradRows input when the op has one. */
pe_status *pe_cu_refuse_grad_rows(pe_kernel_ctx *c);
/* An INTS attribute of two values (H, W), default dflt. */
void pe_cu_attr_pair(const pe_op_desc *op, const char *name, int64_t dflt, int64_t out[2]);

/* One cuBLAS strided-batched GEMM over `count` row-major matrices (strides
 * in elements): out[r, cols] = alpha op(A)[r, in] op(B)[in, cols], A
 * stored [r, in] (ta: [in, r]), B [in, cols] (tb: [cols, in]), out dense.
 * Compute stream only; dims and count within cuBLAS's int, else an error
 * naming `what` (ops_cuda_matmul.c). */
pe_status *pe_cu_gemm(pe_kernel_ctx *c, pe_cuda_ctx *x, bool ta, bool tb, int64_t r, int64_t in,
                      int64_t cols, float alpha, const float *a, int64_t sa, const float *b,
                      int64_t sb, float *out, int64_t so, int64_t count, const char *what);

/* The backend's kernel table (kernel_table.c; registered by register.c). */
extern const pe_kernel_row pe_cuda_kernel_table[];

/* The kernels (ops_cuda_basic.c, ops_cuda_dnn.c), one per row of kernel_table.c. */
pe_status *pe_cuk_fill_constant(pe_kernel_ctx *c);
pe_status *pe_cuk_uniform_random(pe_kernel_ctx *c);
pe_status *pe_cuk_gaussian_random(pe_kernel_ctx *c);
pe_status *pe_cuk_assign(pe_kernel_ctx *c);
pe_status *pe_cuk_assign_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_reshape(pe_kernel_ctx *c);
pe_status *pe_cuk_reshape_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_flatten(pe_kernel_ctx *c);
pe_status *pe_cuk_flatten_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_elementwise_add(pe_kernel_ctx *c);
pe_status *pe_cuk_elementwise_add_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_elementwise_sub(pe_kernel_ctx *c);
pe_status *pe_cuk_elementwise_sub_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_elementwise_mul(pe_kernel_ctx *c);
pe_status *pe_cuk_elementwise_mul_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_scale(pe_kernel_ctx *c);
pe_status *pe_cuk_scale_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_sum(pe_kernel_ctx *c);
pe_status *pe_cuk_sum_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_dropout(pe_kernel_ctx *c);
pe_status *pe_cuk_dropout_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_relu(pe_kernel_ctx *c);
pe_status *pe_cuk_relu_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_tanh(pe_kernel_ctx *c);
pe_status *pe_cuk_tanh_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_sigmoid(pe_kernel_ctx *c);
pe_status *pe_cuk_sigmoid_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_lr_schedule(pe_kernel_ctx *c);
pe_status *pe_cuk_sgd(pe_kernel_ctx *c);
pe_status *pe_cuk_momentum(pe_kernel_ctx *c);
pe_status *pe_cuk_adam(pe_kernel_ctx *c);
pe_status *pe_cuk_clip_by_global_norm(pe_kernel_ctx *c);
pe_status *pe_cuk_softmax_with_cross_entropy(pe_kernel_ctx *c);
pe_status *pe_cuk_softmax_with_cross_entropy_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_cross_entropy(pe_kernel_ctx *c);
pe_status *pe_cuk_cross_entropy_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_mean(pe_kernel_ctx *c);
pe_status *pe_cuk_mean_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_accuracy(pe_kernel_ctx *c);
pe_status *pe_cuk_top_k(pe_kernel_ctx *c);
pe_status *pe_cuk_batch_norm(pe_kernel_ctx *c);
pe_status *pe_cuk_batch_norm_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_matmul(pe_kernel_ctx *c);
pe_status *pe_cuk_matmul_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_softmax(pe_kernel_ctx *c);
pe_status *pe_cuk_softmax_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_conv2d(pe_kernel_ctx *c);
pe_status *pe_cuk_conv2d_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_pool2d(pe_kernel_ctx *c);
pe_status *pe_cuk_pool2d_grad(pe_kernel_ctx *c);
/* The transformer-era ops (ops_cuda_norm.c, ops_cuda_shape.c, ops_cuda_loss.c,
 * ops_cuda_matmul.c, ops_cuda_attention.c). */
pe_status *pe_cuk_layer_norm(pe_kernel_ctx *c);
pe_status *pe_cuk_layer_norm_grad(pe_kernel_ctx *c);
/* gelu, abs and square (the op's type picks the function). */
pe_status *pe_cuk_pointwise(pe_kernel_ctx *c);
pe_status *pe_cuk_pointwise_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_lookup_table_v2(pe_kernel_ctx *c);
pe_status *pe_cuk_lookup_table_v2_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_transpose2(pe_kernel_ctx *c);
pe_status *pe_cuk_transpose2_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_concat(pe_kernel_ctx *c);
pe_status *pe_cuk_concat_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_split(pe_kernel_ctx *c);
pe_status *pe_cuk_split_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_slice(pe_kernel_ctx *c);
pe_status *pe_cuk_slice_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_matmul_v2(pe_kernel_ctx *c);
pe_status *pe_cuk_matmul_v2_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_huber_loss(pe_kernel_ctx *c);
pe_status *pe_cuk_huber_loss_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_sigmoid_cross_entropy_with_logits(pe_kernel_ctx *c);
pe_status *pe_cuk_sigmoid_cross_entropy_with_logits_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_cast(pe_kernel_ctx *c);
pe_status *pe_cuk_cast_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_tril_triu(pe_kernel_ctx *c);
pe_status *pe_cuk_tril_triu_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_position_ids(pe_kernel_ctx *c);
pe_status *pe_cuk_smooth_l1_loss(pe_kernel_ctx *c);
pe_status *pe_cuk_smooth_l1_loss_grad(pe_kernel_ctx *c);
/* fused_softmax_mask and fused_softmax_mask_upper_triangle (the op's slots
 * pick the mask or the triangle; ops_cuda_attention.c). */
pe_status *pe_cuk_softmax_mask(pe_kernel_ctx *c);
pe_status *pe_cuk_softmax_mask_grad(pe_kernel_ctx *c);
pe_status *pe_cuk_scaled_dot_product_attention(pe_kernel_ctx *c);
pe_status *pe_cuk_scaled_dot_product_attention_grad(pe_kernel_ctx *c);

/* Per-op state of the cuDNN kernels (descriptors, chosen algorithms). */
void pe_cu_dnn_state_free(void *state);

#endif
