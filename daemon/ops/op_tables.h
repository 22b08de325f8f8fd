/* The groups of op rows. Each ops file defines one table terminated by a row
 * with type == NULL; registry.c concatenates them. Adding an op is adding a
 * row to a table (and, for a new group, one line here and one in registry.c). */
#ifndef PE_OPS_OP_TABLES_H
#define PE_OPS_OP_TABLES_H

#include "ops/registry.h"

extern const pe_op_def pe_ops_creation[];    /* fill_constant, uniform_random, gaussian_random, assign */
extern const pe_op_def pe_ops_elementwise[]; /* elementwise_add/sub/mul, scale, sum */
extern const pe_op_def pe_ops_loss[];        /* softmax_with_cross_entropy, cross_entropy, mean */
extern const pe_op_def pe_ops_shape[];       /* reshape, flatten */
extern const pe_op_def pe_ops_dropout[];     /* dropout */
extern const pe_op_def pe_ops_metric[];      /* accuracy, top_k */
extern const pe_op_def pe_ops_optimizer[];   /* sgd, momentum, adam */
extern const pe_op_def pe_ops_clip[];        /* clip_by_global_norm */
/* An optimizer op's L2 coefficient: regularization_coeff where
 * regularization_method is "l2_decay", else 0 (cpu and cuda kernels). */
float pe_optimizer_l2_coeff(const pe_op_def *d, const pe_op_desc *op);
/* The AdamW coefficient (regularization_method "decoupled_decay"), else 0. */
float pe_optimizer_decoupled_coeff(const pe_op_def *d, const pe_op_desc *op);
extern const pe_op_def pe_ops_matmul[];      /* matmul (oneDNN) */
extern const pe_op_def pe_ops_matmul_v2[];   /* matmul_v2 (oneDNN) */
extern const pe_op_def pe_ops_activation[];  /* relu, tanh, sigmoid, gelu, abs, square, softmax */
extern const pe_op_def pe_ops_layer_norm[];  /* layer_norm (oneDNN) */
extern const pe_op_def pe_ops_embedding[];   /* lookup_table_v2 */
extern const pe_op_def pe_ops_transpose[];   /* transpose2 */
extern const pe_op_def pe_ops_concat[];      /* concat, split */
extern const pe_op_def pe_ops_slice[];       /* slice */
/* huber_loss, sigmoid_cross_entropy_with_logits */
extern const pe_op_def pe_ops_pointwise_loss[];
extern const pe_op_def pe_ops_cast[];        /* cast */
extern const pe_op_def pe_ops_tril_triu[];   /* tril_triu */
extern const pe_op_def pe_ops_smooth_l1_loss[]; /* smooth_l1_loss */
extern const pe_op_def pe_ops_position_ids[];   /* position_ids */
/* fused_softmax_mask, fused_softmax_mask_upper_triangle (oneDNN softmax) */
extern const pe_op_def pe_ops_softmax_mask[];
/* scaled_dot_product_attention (oneDNN) */
extern const pe_op_def pe_ops_attention[];
extern const pe_op_def pe_ops_conv[];        /* conv2d (oneDNN) */
extern const pe_op_def pe_ops_pool[];        /* pool2d (oneDNN) */
extern const pe_op_def pe_ops_batch_norm[];  /* batch_norm (oneDNN) */
extern const pe_op_def pe_ops_schedule[];    /* lr_schedule */
/* The lr_schedule op's attributes as checked params (cpu and cuda kernels);
 * PE_EATTR naming the attribute when they are not a valid schedule. */
struct pe_lr_params;
pe_status *pe_lr_params_from_op(const pe_op_def *d, const pe_op_desc *op,
                                struct pe_lr_params *out);

#endif
